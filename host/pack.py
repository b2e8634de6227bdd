#!/usr/bin/env python3
"""Pack a Hugging Face checkpoint into a Colibri image.

Examples:
  python host/pack.py path/to/mixtral-checkpoint -o model.img --max-seq 256
  python host/pack.py models/demo -o demo.img --max-seq 64 --expert-align 4096
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from host.checkpoint import UnsupportedModel, load_checkpoint  # noqa: E402
from host.image import arena_bytes, build_image  # noqa: E402


def human(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{n} B"
        n /= 1024
    raise AssertionError


def pack(src: Path, out: Path, max_seq: int, expert_align: int) -> dict:
    ckpt = load_checkpoint(src, max_seq)
    blob = build_image(ckpt.dims, ckpt.tensors, expert_align=expert_align)
    out.write_bytes(blob)
    return {
        "image": str(out), "image_bytes": len(blob), "arena_bytes": arena_bytes(ckpt.dims),
        "params": ckpt.n_params, "active_params_per_token": ckpt.n_active_params,
        "tied_embeddings": ckpt.tied_embeddings, "dims": ckpt.dims,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("checkpoint", type=Path, help="Hugging Face checkpoint directory (config.json + *.safetensors)")
    ap.add_argument("-o", "--output", type=Path, required=True, help="image file to write")
    ap.add_argument("--max-seq", type=int, default=256,
                    help="longest sequence (prompt + generated) the image supports; sizes the KV cache (default 256)")
    ap.add_argument("--expert-align", type=int, default=64,
                    help="byte alignment of each expert block, e.g. 4096 for page-granular prefetch (default 64)")
    args = ap.parse_args(argv)
    if args.max_seq < 1:
        ap.error("--max-seq must be at least 1")
    try:
        r = pack(args.checkpoint, args.output, args.max_seq, args.expert_align)
    except (UnsupportedModel, FileNotFoundError, ValueError) as exc:
        print(f"pack: error: {exc}", file=sys.stderr)
        return 2
    d = r["dims"]
    print(f"packed {args.checkpoint} -> {r['image']}")
    print(f"  model       Mixtral-style MoE: {d.n_layers} layers, hidden {d.hidden_size}, {d.n_heads} heads "
          f"({d.n_kv_heads} kv, head_dim {d.head_dim}), {d.n_experts} experts top-{d.top_k}, vocab {d.vocab_size}")
    print(f"  parameters  {r['params']:,} total, {r['active_params_per_token']:,} active per token")
    print(f"  image       {r['image_bytes']:,} bytes ({human(r['image_bytes'])})")
    print(f"  arena       {r['arena_bytes']:,} bytes ({human(r['arena_bytes'])}) for max_seq {d.max_seq}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
