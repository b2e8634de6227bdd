#!/usr/bin/env python3
"""Footprint and purity of built firmware: section sizes per object, and proof that the runtime
neither defines nor references a forbidden symbol (malloc family, pthread_*, stdio, FILE I/O).

Examples:
  python tools/footprint.py build/hosted/release/firmware/*.o          # runtime objects
  python tools/footprint.py --board hosted                              # the same, found by board
  python tools/footprint.py --board hosted --json
Exit status 1 if any forbidden symbol is found.
"""
from __future__ import annotations

import argparse
import json
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

from elftools.elf.elffile import ELFFile
from elftools.elf.sections import SymbolTableSection

ROOT = Path(__file__).resolve().parent.parent

FORBIDDEN = re.compile(
    r"^(malloc|calloc|realloc|free|aligned_alloc|posix_memalign|memalign|valloc|pvalloc|reallocarray"
    r"|operator new.*|_Znw.*|_Zna.*|_Zdl.*|_Zda.*"
    r"|pthread_\w+|thrd_\w+|mtx_\w+|cnd_\w+"
    r"|printf|fprintf|sprintf|snprintf|vprintf|vfprintf|vsprintf|vsnprintf|puts|fputs|putchar|fputc|putc"
    r"|scanf|fscanf|sscanf|fopen|fclose|fread|fwrite|fseek|ftell|fflush|fgets|getchar|perror"
    r"|stdin|stdout|stderr|_IO_\w+|__printf_chk|__fprintf_chk|__sprintf_chk|__snprintf_chk|__vfprintf_chk)$"
)
SECTIONS = (".text", ".rodata", ".data", ".bss")


@dataclass
class ObjectReport:
    path: str
    sizes: dict[str, int] = field(default_factory=dict)
    forbidden: list[str] = field(default_factory=list)


def inspect(path: Path) -> ObjectReport:
    rep = ObjectReport(str(path))
    with open(path, "rb") as f:
        elf = ELFFile(f)
        for sec in elf.iter_sections():
            base = next((s for s in SECTIONS if sec.name == s or sec.name.startswith(s + ".")), None)
            if base and sec["sh_flags"] & 0x2:  # SHF_ALLOC
                rep.sizes[base] = rep.sizes.get(base, 0) + sec["sh_size"]
            if isinstance(sec, SymbolTableSection):
                for sym in sec.iter_symbols():
                    name = sym.name.split("@")[0]
                    if name and FORBIDDEN.match(name) and name not in rep.forbidden:
                        rep.forbidden.append(name)
    return rep


def runtime_objects(board: str, mode: str) -> list[Path]:
    objs = sorted((ROOT / "build" / board / mode / "firmware").glob("*.o"))
    if not objs:
        raise FileNotFoundError(f"no runtime objects under build/{board}/{mode}: run `scons board={board} mode={mode}`")
    return objs


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("objects", nargs="*", type=Path, help="ELF objects or executables to inspect")
    ap.add_argument("--board", help="inspect the runtime objects of build/<board>/<mode>")
    ap.add_argument("--mode", default="release")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    paths = list(args.objects)
    try:
        if args.board:
            paths += runtime_objects(args.board, args.mode)
    except FileNotFoundError as exc:
        print(f"footprint: error: {exc}", file=sys.stderr)
        return 2
    if not paths:
        ap.error("give object files or --board")
    reports = [inspect(p) for p in paths]
    bad = [r for r in reports if r.forbidden]
    if args.json:
        print(json.dumps([r.__dict__ for r in reports]))
    else:
        print(f"{'object':<44}" + "".join(f"{s:>9}" for s in SECTIONS))
        totals = {s: 0 for s in SECTIONS}
        for r in reports:
            print(f"{Path(r.path).name:<44}" + "".join(f"{r.sizes.get(s, 0):>9}" for s in SECTIONS))
            for s in SECTIONS:
                totals[s] += r.sizes.get(s, 0)
        print(f"{'total':<44}" + "".join(f"{totals[s]:>9}" for s in SECTIONS))
        for r in bad:
            print(f"FORBIDDEN in {r.path}: {', '.join(r.forbidden)}", file=sys.stderr)
        if not bad:
            print("purity: no allocation, thread or stdio symbol defined or referenced")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
