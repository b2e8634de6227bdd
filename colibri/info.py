#!/usr/bin/env python3
"""What an image holds: its format, the model's geometry and layers, its dtypes and sizes, the arena it needs,
its text support, and which boards it fits (with how many expert cache slots at most, where it streams).

Examples:
  colibri info model.img
  colibri info model.img --json
"""
from __future__ import annotations

import json
import sys
from collections import Counter
from pathlib import Path

from colibri import format as fmt
from colibri.console import Parser
from colibri.image import Image, ImageError, arena_bytes, expert_cache_bytes, open_image
from colibri.sim.boards import board_names, load_board, memory_region, memory_shortfalls


def enum_names(prefix: str) -> dict[int, str]:
    """A layer record field's values by name, from the format's constants (LAYER_ATTN_DELTA_NET -> delta_net)."""
    return {v: k[len(prefix):].lower() for k, v in vars(fmt).items() if k.startswith(prefix) and isinstance(v, int)}


def layer_summary(img: Image) -> list[str]:
    """Each distinct layer make-up, with how many layers have it: attention, FFN and router kinds, and a window."""
    attention, ffn, router = enum_names("LAYER_ATTN_"), enum_names("LAYER_FFN_"), enum_names("LAYER_ROUTER_")
    kinds: Counter[str] = Counter()
    for layer in img.dims.layers:
        parts = [f"{attention[layer.attention]} attention"] if layer.attention in attention else []
        parts.append(f"{ffn[layer.ffn]} ffn" + (f" ({router[layer.router]} router)" if layer.moe else ""))
        if layer.window:
            parts.append(f"window {layer.window}")
        kinds[", ".join(parts)] += 1
    return [f"{n} x {what}" for what, n in kinds.items()]


def max_cache_slots(img: Image, arena_room: int) -> int:
    """The most expert cache slots an arena of `arena_room` bytes holds beside the image's plan."""
    d, streamed = img.dims, len(img.streamed_experts())
    need = arena_bytes(d)
    slots = 0
    while slots < streamed and need + expert_cache_bytes(img.expert_block_bytes, slots + 1,
                                                         d.n_layers * d.n_experts) <= arena_room:
        slots += 1
    return slots


def board_fits(img: Image, image_bytes: int) -> dict[str, str]:
    """Per board: fits, fits with a cache of at most N slots, or why not."""
    out = {}
    arena = arena_bytes(img.dims)
    for name in board_names():
        board = load_board(name)
        short = memory_shortfalls(board, image_bytes, arena)
        region = memory_region(board.spec, "arena")
        if short:
            out[name] = "; ".join(f"{what} {need:,} bytes > {r.bytes:,} ({r.name})" for what, r, need in short)
        elif region is None:
            out[name] = "fits (memory from the host)"
        elif img.streamed_experts():
            out[name] = f"fits, with --expert-cache up to {max_cache_slots(img, region.bytes)} slots"
        else:
            out[name] = "fits"
    return out


def describe(path: Path) -> dict:
    img = open_image(path, check_crcs=False)
    d, h = img.dims, img.header
    size = path.stat().st_size
    meta = img.meta or {}
    return {"image": str(path), "format_version": h["version"], "image_bytes": size,
            "resident_bytes": img.resident_bytes, "expert_part_bytes": size - img.resident_bytes
            if img.streamed_experts() else 0,
            "layers": d.n_layers, "hidden": d.hidden_size, "heads": d.n_heads, "kv_heads": d.n_kv_heads,
            "head_dim": d.head_dim, "vocab": d.vocab_size, "experts": d.n_experts, "top_k": d.top_k,
            "max_seq": d.max_seq, "kv_cache": "f16" if d.kv_dtype else "f32", "arena_bytes": arena_bytes(d),
            "layer_kinds": layer_summary(img), "bytes_by_dtype": img.bytes_by_dtype(),
            "streamed_experts": len(img.streamed_experts()), "expert_block_bytes": img.expert_block_bytes,
            "tokenizer": bool(meta.get("tokenizer")),
            "chat_template": bool(meta.get("chat_template")), "boards": board_fits(img, size)}


def main(argv: list[str] | None = None) -> int:
    ap = Parser(__doc__)
    ap.add_argument("image", type=Path, help="an image made by colibri pack")
    ap.add_argument("--json", action="store_true", help="one JSON object instead of the text")
    args = ap.parse_args(argv)
    if args.image.is_dir():
        return ap.fail(f"{args.image} is a directory, not an image: give an image made by colibri pack (colibri pack "
                       "makes one of a checkpoint directory or a GGUF file)")
    try:
        info = describe(args.image)
    except FileNotFoundError:
        return ap.fail(f"{args.image} not found")
    except OSError as exc:
        return ap.fail(f"cannot read {args.image}: {exc.strerror}")
    except ImageError as exc:
        return ap.fail(f"{args.image} is not a valid image ({exc}); make one with colibri pack")
    if args.json:
        print(json.dumps(info))
        return 0
    i = info
    experts = f"{i['experts']} experts, top-{i['top_k']}" if i["experts"] else "dense"
    print(f"{i['image']}: Colibri image, format v{i['format_version']}, {i['image_bytes']:,} bytes")
    print(f"  model     {i['layers']} layers, hidden {i['hidden']}, {i['heads']} heads ({i['kv_heads']} kv, head_dim "
          f"{i['head_dim']}), {experts}, vocab {i['vocab']:,}")
    for kind in i["layer_kinds"]:
        print(f"  layers    {kind}")
    print("  dtypes    " + ", ".join(f"{k} {v:,} bytes" for k, v in sorted(i["bytes_by_dtype"].items())))
    if i["streamed_experts"]:
        print(f"  tiers     resident {i['resident_bytes']:,} bytes, expert part {i['expert_part_bytes']:,} bytes "
              f"({i['streamed_experts']} routed experts over the layers, each block up to "
              f"{i['expert_block_bytes']:,} bytes: one cache slot)")
    print(f"  arena     {i['arena_bytes']:,} bytes for max_seq {i['max_seq']} ({i['kv_cache']} KV cache)")
    text = ("tokenizer and chat template (--prompt, --chat)" if i["chat_template"] else
            "tokenizer (--prompt)" if i["tokenizer"] else "no tokenizer (--prompt-tokens)")
    print(f"  text      {text}")
    for board, fit in i["boards"].items():
        print(f"  {board:<17} {fit}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
