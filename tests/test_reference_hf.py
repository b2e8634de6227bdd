"""The numpy reference (run from the packed image) against transformers' Mixtral."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from transformers import MixtralForCausalLM

from conftest import CONFIGS
from colibri.image import read_image
from colibri.reference import Reference

TOLERANCE = 1e-4  # max abs logit error, f32
PROMPT = [1, 5, 9, 3, 0, 2]


@pytest.mark.parametrize("name", [c.name for c in CONFIGS])
def test_reference_matches_transformers(name, checkpoints, images):
    # eager experts: the default grouped_mm path needs 16-byte strides, which odd test sizes lack
    model = MixtralForCausalLM.from_pretrained(checkpoints[name], experts_implementation="eager").eval()
    ref = Reference(read_image(images[name].read_bytes()))

    with torch.no_grad():
        hf = model(torch.tensor([PROMPT])).logits[0].numpy()
    ours = ref.forward(PROMPT)
    assert np.abs(hf).max() > 0.5, "logits too small for the tolerance to mean anything"
    assert np.max(np.abs(ours - hf)) <= TOLERANCE

    # greedy decoding for 16 steps, each side on its own outputs
    hf_seq = list(PROMPT)
    with torch.no_grad():
        for _ in range(16):
            hf_seq.append(int(model(torch.tensor([hf_seq])).logits[0, -1].argmax()))
    assert ref.greedy(PROMPT, 16) == hf_seq[len(PROMPT):]


def dequantized_checkpoint(src, image, dst):
    """The checkpoint at `src` with every weight replaced by the image's decoded value, so transformers
    computes with exactly the image's (f16, bf16, Q8_0 or Q4_0) weights."""
    import shutil

    from safetensors.numpy import load_file, save_file

    from colibri.checkpoint import FAMILIES, hf_name
    from colibri.image import Role
    shutil.copytree(src, dst)
    tensors = load_file(src / "model.safetensors")
    fam = FAMILIES["MixtralForCausalLM"]
    replaced = 0
    for e in image.entries:
        if e.shape and e.role not in (Role.ROPE_COS, Role.ROPE_SIN):
            name = hf_name(fam, e.role, e.layer, e.expert)
            if name in tensors:
                tensors[name] = np.ascontiguousarray(image.tensor(e.role, e.layer, e.expert), dtype=np.float32)
                replaced += 1
    save_file(tensors, dst / "model.safetensors")
    return replaced


# max |reference - transformers| / max |logit| with transformers on the image's own weights. f16 and
# bf16 weights widen exactly, so only summation order differs (as for f32). With Q8_0/Q4_0 the runtime
# (and the reference) also quantize each matmul's input to Q8_0 (d = amax/127): that error is
# measured here against transformers' f32 activations, at the positions where both route every layer
# to the same experts (a router near-tie may flip an expert, which changes that position's logits
# wholesale: that is counted, not bounded).
NARROW = [("f16", 1e-4), ("bf16", 1e-4), ("q8_0", 3e-2), ("q4_0", 3e-2)]


@pytest.mark.parametrize("dtype,bound", NARROW, ids=[n[0] for n in NARROW])
def test_narrow_dtypes_against_transformers_on_the_same_weights(dtype, bound, checkpoints, tmp_path):
    from colibri.pack import pack
    from colibri.quant import DType
    name = "base"
    pack(checkpoints[name], tmp_path / "n.img", 48, 64, dtype=DType.parse(dtype), measure_quality=False)
    image = read_image((tmp_path / "n.img").read_bytes())
    assert dequantized_checkpoint(checkpoints[name], image, tmp_path / "hf") > 20
    model = MixtralForCausalLM.from_pretrained(tmp_path / "hf", experts_implementation="eager").eval()
    with torch.no_grad():
        out = model(torch.tensor([PROMPT]), output_router_logits=True)
    hf = out.logits[0].numpy()
    ref = Reference(image)
    ours = ref.forward(PROMPT)
    top_k = image.dims.top_k
    same_route = np.ones(len(PROMPT), bool)
    for layer, (experts, _) in ref.routing(PROMPT).items():
        hf_experts = torch.topk(out.router_logits[layer].reshape(len(PROMPT), -1), top_k).indices.numpy()
        same_route &= np.array([set(a) == set(b) for a, b in zip(experts.tolist(), hf_experts.tolist())])
    rows = np.abs(ours - hf).max(axis=1) / np.abs(hf).max()
    print(f"{dtype}: max |reference - transformers| / max |logit| = {rows[same_route].max():.3g} "
          f"at the {same_route.sum()} of {len(PROMPT)} positions routed alike (all: {rows.max():.3g})")
    assert same_route.sum() >= len(PROMPT) - 1
    assert rows[same_route].max() <= bound
    if dtype in ("q8_0", "q4_0"):
        assert rows.max() > 1e-6  # the activation quantization really happened
