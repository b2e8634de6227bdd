"""transformers as the oracle: the source checkpoint's own logits, for `flash.py --against`.

`flash.py --verify` compares the device with the numpy reference built from the same image, so it
catches runtime and board bugs but not a packing mistake (a wrong tensor mapping would be in both).
This runs transformers on the original weights instead: a Hugging Face checkpoint directory as it
is, or a GGUF file's tensors (dequantized, names and layout undone by colibri/gguf_input.py) loaded
into the transformers class of its architecture.
"""
from __future__ import annotations

import json
import tempfile
from pathlib import Path

import numpy as np

from colibri.inputs import is_gguf


class OracleUnavailable(RuntimeError):
    """transformers (or torch) is not installed, so there is nothing to compare with."""


def _gguf_as_checkpoint(src: Path, out: Path) -> Path:
    """A GGUF file written out as a Hugging Face checkpoint directory (f32 safetensors + config.json)."""
    import transformers
    from safetensors.numpy import save_file

    from colibri.checkpoint import FAMILIES
    from colibri.families.deepseek import kv_b_join
    from colibri.families.qwen35 import as_transformers
    from colibri import block_dtypes
    from colibri.gguf_input import read_gguf
    from colibri.lazy import loaded
    from colibri.quant import mxfp4_blocks_from_hf
    cfg, tensors, _ = read_gguf(src)
    for name in [n for n in tensors if n.endswith("_blocks")]:  # gpt-oss's MXFP4 experts, dequantized as transformers
        base = name[:-len("_blocks")]                             # holds them: [E, in, out]
        blocks, scales = loaded(tensors.pop(name)), loaded(tensors.pop(base + "_scales"))
        tensors[base] = np.swapaxes(block_dtypes.decode(mxfp4_blocks_from_hf(blocks, scales), "MXFP4",
                                                        32 * blocks.shape[-2]), -1, -2)
    tensors = {name: np.asarray(t, dtype=np.float32) for name, t in tensors.items()}  # read now: transformers loads it all
    fam = FAMILIES[cfg["architectures"][0]]
    for layer in range(cfg["num_hidden_layers"]) if fam.fused_experts else ():  # Granite: its experts fused again
        m = f"model.layers.{layer}.{fam.moe_prefix}."
        if f"{m}experts.0.{fam.expert_names[0]}.weight" not in tensors:  # a dense layer
            continue
        gate, up, down = ([tensors.pop(f"{m}experts.{e}.{which}.weight") for e in range(cfg[fam.n_experts_key])]
                          for which in fam.expert_names)
        tensors[m + fam.fused_experts[0]] = np.stack([np.concatenate([g, u]) for g, u in zip(gate, up)])
        tensors[m + fam.fused_experts[1]] = np.stack(down)
    for name in [n for n in tensors if n.endswith("self_attn.k_b_proj.weight")]:  # deepseek2: kv_b_proj as HF has it
        v_name = name.replace("k_b_proj", "v_b_proj")
        tensors[name.replace("k_b_proj", "kv_b_proj")] = kv_b_join(tensors.pop(name), tensors.pop(v_name),
                                                                   cfg["num_attention_heads"])
    tensors = as_transformers(tensors)  # Qwen3.5's norms and decay, as its file stores them
    for name in [n for n in tensors if n.endswith(("conv.conv.weight", "conv1d.weight")) and tensors[n].ndim == 2]:
        tensors[name] = tensors[name][:, None, :]  # LFM2's and Qwen3.5's convolutions, [channels, 1, K] as transformers
    arch = getattr(transformers, cfg["architectures"][0])
    cfg = dict(cfg, model_type=arch.config_class.model_type)
    (out / "config.json").write_text(json.dumps(cfg))
    save_file({name: np.ascontiguousarray(t, dtype=np.float32) for name, t in tensors.items()},
              str(out / "model.safetensors"))
    return out


def checkpoint_logits(src: Path, tokens: list[int]) -> np.ndarray:
    """transformers' logits [len(tokens), vocab] for `tokens` on the checkpoint at `src` (a directory
    or a .gguf file), in float32."""
    try:
        import torch
        import transformers
    except ImportError as exc:
        raise OracleUnavailable(f"--against needs transformers and torch ({exc}); install them with "
                                "`pip install torch==2.13.0 transformers`") from None
    transformers.utils.logging.disable_progress_bar()
    with tempfile.TemporaryDirectory() as tmp:
        path = _gguf_as_checkpoint(src, Path(tmp)) if src.is_file() and is_gguf(src) else src
        try:
            model = transformers.AutoModelForCausalLM.from_pretrained(path, experts_implementation="eager",
                                                                      dtype=torch.float32).eval()
            with torch.no_grad():
                return model(torch.tensor([tokens])).logits[0].float().numpy()
        except Exception as exc:  # noqa: BLE001  transformers' own failure on this checkpoint: there is no oracle
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
            raise OracleUnavailable(f"transformers {transformers.__version__} cannot run this checkpoint "
                                    f"({type(exc).__name__}: {first}), so there is nothing to compare with; "
                                    "--verify compares with the numpy reference") from None
