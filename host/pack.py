#!/usr/bin/env python3
"""Pack a Hugging Face checkpoint (Mixtral, Qwen2-MoE, Qwen3-MoE, OLMoE, Llama, Qwen2, Qwen3) into a Colibri image.

Examples:
  python host/pack.py path/to/mixtral-checkpoint -o model.img --max-seq 256
  python host/pack.py models/demo-adder -o demo.img --max-seq 64 --board x86_64_baremetal
  python host/pack.py qwen2-moe-q8_0.gguf -o model.img --norm-topk-prob false
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from host.checkpoint import UnsupportedModel, load_checkpoint  # noqa: E402
from host.image import arena_bytes, build_image  # noqa: E402
from sim.boards import board_names, fit_report, load_board  # noqa: E402


def human(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{n} B"
        n /= 1024
    raise AssertionError


class DoesNotFit(ValueError):
    """The image or its arena is larger than the board's memory for it."""


def pack(src: Path, out: Path, max_seq: int | None, expert_align: int, board: str | None = None,
         norm_topk_prob: bool | None = None) -> dict:
    ckpt = load_checkpoint(src, max_seq, norm_topk_prob)
    blob = build_image(ckpt.dims, ckpt.tensors, expert_align=expert_align)
    fit_lines: list[str] = []
    if board:
        fits, fit_lines = fit_report(load_board(board), len(blob), arena_bytes(ckpt.dims))
        if not fits:
            raise DoesNotFit("\n".join(fit_lines) + "\n  a smaller --max-seq shrinks the arena (KV cache); "
                             "a smaller model shrinks the image")
    out.write_bytes(blob)
    return {
        "image": str(out), "image_bytes": len(blob), "arena_bytes": arena_bytes(ckpt.dims),
        "params": ckpt.n_params, "active_params_per_token": ckpt.n_active_params,
        "tied_embeddings": ckpt.tied_embeddings, "dims": ckpt.dims, "fit": fit_lines, "family": ckpt.family,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("checkpoint", type=Path,
                    help="Hugging Face checkpoint directory (config.json + *.safetensors), or a .gguf file")
    ap.add_argument("-o", "--output", type=Path, required=True, help="image file to write")
    ap.add_argument("--max-seq", type=int,
                    help="longest sequence (prompt + generated) the image supports; sizes the KV cache "
                         "(default: 256, or the model's max_position_embeddings if smaller)")
    ap.add_argument("--expert-align", type=int, default=64,
                    help="byte alignment of each expert block, e.g. 4096 for page-granular prefetch (default 64)")
    ap.add_argument("--board", choices=board_names(), help="check that image + arena fit this board's memory")
    ap.add_argument("--norm-topk-prob", choices=("true", "false"),
                    help="whether the top-k router weights are renormalized; needed for a Qwen-MoE/OLMoE GGUF "
                         "file that does not say")
    args = ap.parse_args(argv)
    if args.max_seq is not None and args.max_seq < 1:
        ap.error("--max-seq must be at least 1")
    try:
        norm = None if args.norm_topk_prob is None else args.norm_topk_prob == "true"
        r = pack(args.checkpoint, args.output, args.max_seq, args.expert_align, args.board, norm)
    except (UnsupportedModel, FileNotFoundError, ValueError) as exc:
        print(f"pack: error: {exc}", file=sys.stderr)
        return 2
    d = r["dims"]
    print(f"packed {args.checkpoint} -> {r['image']}")
    n_moe = sum(d.moe_layers)
    ffn = (f"{d.n_experts} experts top-{d.top_k} in {n_moe} of {d.n_layers} layers" if n_moe else "dense MLP")
    print(f"  model       {r['family']}: {d.n_layers} layers, hidden {d.hidden_size}, {d.n_heads} heads "
          f"({d.n_kv_heads} kv, head_dim {d.head_dim}), {ffn}, vocab {d.vocab_size}")
    print(f"  parameters  {r['params']:,} total, {r['active_params_per_token']:,} active per token")
    print(f"  image       {r['image_bytes']:,} bytes ({human(r['image_bytes'])})")
    print(f"  arena       {r['arena_bytes']:,} bytes ({human(r['arena_bytes'])}) for max_seq {d.max_seq}")
    for line in r["fit"]:
        print(f"  {line}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
