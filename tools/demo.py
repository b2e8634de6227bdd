#!/usr/bin/env python3
"""The main demo: the shipped adder model answers addition problems on a board, checked twice.

Each answer is checked against the true sum, and the device's logits against the numpy
reference, bit for bit. Expects the board's firmware to be built (tools/demo.sh does that first).

Examples:
  python tools/demo.py                                 # x86_64 bare metal under QEMU
  python tools/demo.py --board hosted --problems 10
  python tools/demo.py --json
  python tools/demo.py --board cortex_m55 --firmware build/cortex_m55/release-freertos/firmware.elf  # FreeRTOS
"""
from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

from colibri.demo_task import ANSWER_LEN, answer_from_text, held_out_problems, problem_text  # noqa: E402
from colibri.image import read_image  # noqa: E402
from colibri.pack import pack  # noqa: E402
from colibri.protocol import Client, DeviceError, LinkError, Sampling  # noqa: E402
from colibri.reference import Reference  # noqa: E402
from colibri.text import Text  # noqa: E402
from colibri.sim.boards import DEFAULT_BOARD, board_names, load_board  # noqa: E402
from colibri.sim.launch import start_board  # noqa: E402

MODEL = ROOT / "models" / "demo-adder"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--board", default=DEFAULT_BOARD, choices=board_names())
    ap.add_argument("--problems", type=int, default=6, help="how many held-out problems to ask (default 6)")
    ap.add_argument("--seed", type=int, default=2026, help="which held-out problems")
    ap.add_argument("--json", action="store_true", help="one JSON object on the last line instead of the table")
    ap.add_argument("--firmware", type=Path, help="the board's firmware to run (default: its release build; a "
                    "FreeRTOS build is build/<board>/release-freertos/firmware.elf, docs/RTOS.md)")
    args = ap.parse_args(argv)

    board = load_board(args.board)
    firmware = args.firmware or board.firmware()
    if not firmware.exists():
        print(f"demo: {firmware} is missing; build it with `scons board={args.board}`", file=sys.stderr)
        return 2
    problems = random.Random(args.seed).sample(held_out_problems(1000), args.problems)
    with tempfile.TemporaryDirectory() as tmp:
        image = Path(tmp) / "demo-adder.img"
        packed = pack(MODEL, image, max_seq=16, expert_align=64, board=args.board)
        img = read_image(image.read_bytes())
        ref, text = Reference(img), Text(img.meta)  # the tokenizer the image carries, as flash.py --prompt uses it
        rows, worst, identical, total = [], 0.0, 0, 0
        try:
            with start_board(board, firmware, image) as device:
                client = Client(device.link)
                client.info()
                opened = client.open()
                for a, b in problems:
                    prompt = text.encode(problem_text(a, b))
                    gen = client.run(prompt, ANSWER_LEN, Sampling(), vocab=ref.d.vocab_size)
                    events, logits = gen.events, gen.logits
                    stats = client.stats()
                    tokens = [e.token for e in events]
                    expected = ref.forward(prompt + tokens)
                    err = float(np.max(np.abs(logits - expected)))
                    worst = max(worst, err)
                    identical += int(np.all(logits.view(np.uint32) == expected.view(np.uint32), axis=1).sum())
                    total += len(expected)
                    answer = answer_from_text(text.decode(tokens))
                    per_token = stats["cycles_total"] / stats["tokens_fed"]
                    rows.append({"problem": f"{a} + {b}", "answer": answer, "correct": answer == a + b,
                                 "reference_agrees": tokens == ref.greedy(prompt, ANSWER_LEN),
                                 "cycles_per_token": round(per_token),
                                 "tokens_per_s": stats["cycle_hz"] / per_token if stats["cycle_hz"] else None,
                                 "max_abs_error": err})
                client.quit()
        except (DeviceError, LinkError, FileNotFoundError) as exc:
            print(f"demo: {exc}", file=sys.stderr)
            return 2
    passed = all(r["correct"] and r["reference_agrees"] for r in rows) and identical == total
    if args.json:
        print(json.dumps({"board": args.board, "arena_bytes": opened.arena_bytes, "image_bytes": packed["image_bytes"],
                          "problems": rows, "max_abs_error": worst, "rows_identical": identical, "rows": total,
                          "passed": passed}))
        return 0 if passed else 1
    print(f"\nColibri demo on {args.board}: a {packed['params']:,}-parameter Mixtral-architecture MoE "
          f"(4 experts, top-2) adds 3-digit numbers it never saw in training\n")
    print(f"{'problem':>12}  {'device says':>11}  {'right?':>6}  {'tokens/s':>9}  {'cycles/token':>12}")
    for r in rows:
        speed = f"{r['tokens_per_s']:9,.0f}" if r["tokens_per_s"] else f"{'n/a':>9}"
        print(f"{r['problem']:>12}  {str(r['answer']):>11}  {'yes' if r['correct'] else 'NO':>6}  {speed}  "
              f"{r['cycles_per_token']:>12,}")
    batch = (f" + a prefill batch of {opened.prefill_batch} tokens, {opened.arena_bytes - packed['arena_bytes']:,}"
             if opened.prefill_batch else "")
    print(f"\nimage {packed['image_bytes']:,} bytes, arena {opened.arena_bytes:,} bytes (exact: the packer's plan, "
          f"{packed['arena_bytes']:,}{batch})")
    agree = sum(r["reference_agrees"] for r in rows)
    same = (f"bit-identical to the reference over {total} logits rows" if identical == total else
            f"{total - identical} of {total} logits rows differ from the reference (max |device - reference| = {worst:.3g})")
    print(f"verify: {same}; greedy answers agree {agree}/{len(rows)}: {'PASS' if passed else 'FAIL'}")
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
