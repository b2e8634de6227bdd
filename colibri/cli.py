"""The `colibri` command: one subcommand per tool, each the same program as its script in a checkout.

  colibri pack CHECKPOINT -o model.img [...]      host/pack.py: checkpoint or GGUF -> image
  colibri run model.img --board hosted [...]      host/flash.py: run an image on a board, verify it
  colibri build --board cortex_m4 [...]           the board's firmware (SCons); run builds it when needed
  colibri boards                                  every board: memory, kernels, cores, built or not
  colibri info model.img                          what an image holds, and which boards it fits
  colibri footprint --board cortex_m4 [...]       tools/footprint.py: sizes, stack, purity of a build
  colibri report trace.json [...]                 tools/routing_report.py: where the experts' time goes
  colibri farm export|verify|places [...]         board farms through labgrid (docs/FARM.md)
  colibri --version                               the package's version

`colibri SUBCOMMAND --help` lists each one's options. Building, running on a board and the footprint report
use the Colibri tree: the checkout this colibri package is imported from (or $COLIBRI_ROOT), or else the copy of
firmware/ and boards/ an installed wheel carries, built in ~/.cache/colibri/ (whatever the working directory).
"""
from __future__ import annotations

import sys

from colibri import __version__
from colibri.console import run_tool

SUBCOMMANDS = {"pack": "colibri.pack", "run": "colibri.flash", "build": "colibri.build", "boards": "colibri.boards_cli",
               "info": "colibri.info", "footprint": "colibri.footprint", "report": "colibri.routing_report",
               "farm": "colibri.farm.cli"}


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help"):
        print(__doc__.strip())
        return 0 if args else 2
    if args[0] == "--version":
        print(f"colibri {__version__}")
        return 0
    name, rest = args[0], args[1:]
    if name not in SUBCOMMANDS:
        print(f"colibri: error: unknown subcommand {name!r}; choose from {', '.join(SUBCOMMANDS)} "
              "(colibri --help)", file=sys.stderr)
        return 2
    prog = f"colibri {name}"
    sys.argv[0] = prog  # what each tool's --help and errors call it
    return run_tool(SUBCOMMANDS[name], rest, prog)


if __name__ == "__main__":
    sys.exit(main())
