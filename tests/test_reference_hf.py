"""The numpy reference (run from the packed image) against transformers' Mixtral."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from transformers import MixtralForCausalLM

from conftest import CONFIGS
from host.image import read_image
from host.reference import Reference

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
