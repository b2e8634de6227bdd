#!/usr/bin/env python3
"""Write the GGUF test fixtures in tests/fixtures/gguf/: one small Mixtral-architecture model in every
common storage type, each file written by llama.cpp's own quantizer (llama_model_quantize, from
llama-cpp-python built from its PyPI sdist: tools/bench.py's docstring says how). The tests read them
as users' files; they need neither llama.cpp nor this script.

  python tools/make_gguf_fixtures.py            # rewrites tests/fixtures/gguf/*.gguf

The model: random seeded weights made with transformers (hidden 256 so the K-quants' 256-element blocks
fit a row, 2 layers, 4 heads / 2 KV heads, 2 experts top-1, intermediate 256, vocab 64), written as
F32 GGUF by tests/gguf_writer.py (llama.cpp's names and layout, a placeholder vocabulary), then
quantized by llama.cpp into each type below. The F32 file is the quantizer's input and not kept.
"""
from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "tests" / "fixtures" / "gguf"
# llama.cpp file types (LLAMA_FTYPE_MOSTLY_*): the common quantizations that need no importance matrix
TYPES = ("Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q2_K", "Q3_K_M", "Q4_K_M", "Q5_K_M", "Q6_K", "IQ4_NL", "IQ4_XS")
CONFIG = dict(vocab_size=64, hidden_size=256, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, num_local_experts=2, num_experts_per_tok=1, max_position_embeddings=64,
              rms_norm_eps=1e-5, tie_word_embeddings=False)


def make_source(out: Path) -> Path:
    import torch
    from transformers import MixtralConfig, MixtralForCausalLM
    torch.manual_seed(11)
    MixtralForCausalLM(MixtralConfig(**CONFIG)).to(torch.float32).eval().save_pretrained(out)
    return out


def quantize(src: Path, dst: Path, ftype_name: str) -> None:
    import llama_cpp
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = getattr(llama_cpp, f"LLAMA_FTYPE_MOSTLY_{ftype_name}")
    if llama_cpp.llama_model_quantize(str(src).encode(), str(dst).encode(), params) != 0:
        raise RuntimeError(f"llama.cpp could not quantize to {ftype_name}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.parse_args(argv)
    try:
        import llama_cpp  # noqa: F401
    except ImportError:
        print("make_gguf_fixtures: llama-cpp-python is not installed; build it as tools/bench.py --help says",
              file=sys.stderr)
        return 2
    sys.path.insert(0, str(ROOT / "tests"))
    from gguf_writer import hf_to_gguf
    OUT.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        f32 = hf_to_gguf(make_source(Path(tmp) / "checkpoint"), Path(tmp) / "f32.gguf", placeholder_vocab=True)
        for name in TYPES:
            dst = OUT / f"mixtral-{name.lower()}.gguf"
            quantize(f32, dst, name)
            print(f"{dst.relative_to(ROOT)}: {dst.stat().st_size:,} bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
