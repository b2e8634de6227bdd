#!/usr/bin/env python3
"""List the boards: each one's image and arena regions, kernels, cores, clock, and whether its firmware is built.

Examples:
  colibri boards
  colibri boards --json
"""
from __future__ import annotations

import json
import sys

from colibri.build import output_dir, staleness
from colibri.console import Parser
from colibri.paths import ROOT
from colibri.sim.boards import Board, board_names, load_board, memory_region


def human(n: int) -> str:
    return f"{n / (1 << 20):,.1f} MiB" if n >= 1 << 20 else f"{n / 1024:,.0f} KiB"


def board_facts(board: Board) -> dict:
    """What a user picks a board by, from its board.toml, and the state of its release build."""
    spec = board.spec
    regions = {which: memory_region(spec, which) for which in ("image", "arena")}
    why = staleness(board, output_dir(board.name))
    return {"board": board.name, "description": spec.get("description", ""),
            **{f"{which}_bytes": r.bytes if r else None for which, r in regions.items()},
            **{f"{which}_region": r.name if r else None for which, r in regions.items()},
            "kernels": spec.get("kernels", []), "threads": "threads_arg" in spec, "clock": spec.get("clock", ""),
            "built": why is None, "build_state": why or "built"}


def main(argv: list[str] | None = None) -> int:
    ap = Parser(__doc__)
    ap.add_argument("--json", action="store_true", help="one JSON list instead of the table")
    args = ap.parse_args(argv)
    names = board_names()
    if not names:
        return ap.fail(f"no boards/ in {ROOT}: run the colibri of a checkout (pip install -e .), set "
                       "COLIBRI_ROOT to one, or install the package from a wheel (which carries them)")
    facts = [board_facts(load_board(name)) for name in names]
    if args.json:
        print(json.dumps(facts))
        return 0
    print(f"{'board':<18} {'image region':<22} {'arena region':<22} {'kernels':<22} {'cores':<12} firmware")
    for f in facts:
        image, arena = ((f"{human(f[w + '_bytes'])} ({f[w + '_region']})" if f[w + "_bytes"] else "the host's")
                        for w in ("image", "arena"))
        cores = "--threads N" if f["threads"] else "1"
        built = "built" if f["built"] else f"{f['build_state']}: colibri build --board {f['board']}"
        print(f"{f['board']:<18} {image:<22} {arena:<22} {', '.join(f['kernels']):<22} {cores:<12} {built}")
    print(f"\nboards from {ROOT / 'boards'}; each one's clock and memory map: boards/<name>/board.toml")
    return 0


if __name__ == "__main__":
    sys.exit(main())
