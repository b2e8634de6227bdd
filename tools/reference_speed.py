#!/usr/bin/env python3
"""What --verify costs: the numpy reference's time against the device's for the same tokens, and the whole
command's wall time with and without --verify.

For each image: runs the prompt (and N greedy tokens) on a board, then the reference's forward pass over the
same tokens (what --verify computes), and `colibri run` itself with and without --verify (--runs times each,
alternating; medians). Prints one JSON line per image: the device's prompt and decode rates (its own clock),
the reference's time and tokens/s, and the two wall times.

Examples:
  python tools/reference_speed.py smol-f16.img smol-q8_0.img --prompt "The capital of France is" --new 8
  python tools/reference_speed.py model.img --board x86_64_baremetal --prompt-tokens 1,5,9,3
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
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


def measure(image_path: Path, board: str, prompt_text: str | None, prompt_tokens: list[int] | None, new: int,
            runs: int) -> dict:
    image = read_image(image_path.read_bytes())
    prompt = prompt_tokens if prompt_tokens is not None else Text(image.meta).encode(prompt_text or "")
    result = flash.run_on_board(image_path, board, prompt, new, Sampling(), True)
    tokens = prompt + result.tokens
    started = time.perf_counter()
    Reference(image).forward(tokens)
    reference_s = time.perf_counter() - started
    command = [sys.executable, "-m", "colibri.flash", str(image_path), "--board", board, "--max-new-tokens", str(new),
               *(["--prompt-tokens", ",".join(map(str, prompt))] if prompt_tokens is not None else ["--prompt", prompt_text or ""])]
    walls: dict[str, list[float]] = {"run_s": [], "run_verify_s": []}
    for _ in range(runs):
        for key, extra in (("run_s", []), ("run_verify_s", ["--verify"])):
            started = time.perf_counter()
            subprocess.run(command + extra, cwd=ROOT, check=True, capture_output=True)
            walls[key].append(time.perf_counter() - started)
    return {"image": str(image_path), "board": board, "kernels": result.kernels, "tokens": len(tokens),
            "device": result.timing, "reference_s": round(reference_s, 3),
            "reference_tok_s": round(len(tokens) / reference_s, 1),
            **{key: round(statistics.median(v), 2) for key, v in walls.items()}}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("images", type=Path, nargs="+")
    ap.add_argument("--board", default="hosted", choices=board_names())
    ap.add_argument("--prompt", default="The capital of France is", help="text (the image's tokenizer encodes it)")
    ap.add_argument("--prompt-tokens", type=lambda s: [int(t) for t in s.split(",")], help="token ids instead")
    ap.add_argument("--new", type=int, default=8, help="greedy tokens after the prompt (default 8)")
    ap.add_argument("--runs", type=int, default=3, help="runs of the command with and without --verify (default 3)")
    args = ap.parse_args(argv)
    for path in args.images:
        try:
            print(json.dumps(measure(path, args.board, args.prompt, args.prompt_tokens, args.new, args.runs)), flush=True)
        except (ImageError, LinkError, NoTokenizer, ValueError, OSError, subprocess.CalledProcessError) as exc:
            print(f"reference_speed: {path}: {exc}", file=sys.stderr)
            return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
