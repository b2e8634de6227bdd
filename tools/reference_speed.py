#!/usr/bin/env python3
"""What --verify costs: the numpy reference's time against the device's for the same tokens.

For each image: runs the prompt (and N greedy tokens) on a board, then the reference on the same tokens twice
(the first call lays the weights out for its kernels; the second is what another forward pass costs), and prints
one JSON line per image with the device's prompt and decode rates (its own clock) and the reference's.

Examples:
  python tools/reference_speed.py smol-f16.img smol-q8_0.img --prompt "The capital of France is" --new 8
  python tools/reference_speed.py model.img --board x86_64_baremetal --prompt-tokens 1,5,9,3
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from colibri import flash  # noqa: E402
from colibri.image import ImageError, read_image  # noqa: E402
from colibri.protocol import LinkError, Sampling  # noqa: E402
from colibri.reference import Reference  # noqa: E402
from colibri.sim.boards import board_names  # noqa: E402
from colibri.text import NoTokenizer, Text  # noqa: E402


def measure(image_path: Path, board: str, prompt_text: str | None, prompt_tokens: list[int] | None, new: int) -> dict:
    image = read_image(image_path.read_bytes())
    prompt = prompt_tokens if prompt_tokens is not None else Text(image.meta).encode(prompt_text or "")
    result = flash.run_on_board(image_path, board, prompt, new, Sampling(), True)
    tokens = prompt + result.tokens
    started = time.perf_counter()
    reference = Reference(image)
    reference.forward(tokens)
    first = time.perf_counter() - started
    started = time.perf_counter()
    reference.forward(tokens)
    again = time.perf_counter() - started
    return {"image": str(image_path), "board": board, "kernels": result.kernels, "tokens": len(tokens),
            "device": result.timing, "reference_first_s": round(first, 3), "reference_s": round(again, 3),
            "reference_tok_s": round(len(tokens) / again, 1)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("images", type=Path, nargs="+")
    ap.add_argument("--board", default="hosted", choices=board_names())
    ap.add_argument("--prompt", default="The capital of France is", help="text (the image's tokenizer encodes it)")
    ap.add_argument("--prompt-tokens", type=lambda s: [int(t) for t in s.split(",")], help="token ids instead")
    ap.add_argument("--new", type=int, default=8, help="greedy tokens after the prompt (default 8)")
    args = ap.parse_args(argv)
    for path in args.images:
        try:
            print(json.dumps(measure(path, args.board, args.prompt, args.prompt_tokens, args.new)), flush=True)
        except (ImageError, LinkError, NoTokenizer, ValueError, OSError) as exc:
            print(f"reference_speed: {path}: {exc}", file=sys.stderr)
            return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
