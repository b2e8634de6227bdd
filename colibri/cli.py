"""The `colibri` command: one subcommand per tool, each the same program as its script in a checkout.

  colibri pack CHECKPOINT -o model.img [...]      host/pack.py: checkpoint or GGUF -> image
  colibri run model.img --board hosted [...]      host/flash.py: run an image on a board, verify it
  colibri footprint --board cortex_m4 [...]       tools/footprint.py: sizes, stack, purity of a build
  colibri report trace.json [...]                 tools/routing_report.py: where the experts' time goes

`colibri SUBCOMMAND --help` lists each one's options. Running on a board, building and the footprint
report work in a Colibri checkout (the working directory or one above it, or $COLIBRI_ROOT).
"""
from __future__ import annotations

import importlib
import sys

SUBCOMMANDS = {"pack": "colibri.pack", "run": "colibri.flash", "footprint": "colibri.footprint",
               "report": "colibri.routing_report"}


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help"):
        print(__doc__.strip())
        return 0 if args else 2
    name, rest = args[0], args[1:]
    if name not in SUBCOMMANDS:
        print(f"colibri: error: unknown subcommand {name!r}; choose from {', '.join(SUBCOMMANDS)} "
              "(colibri --help)", file=sys.stderr)
        return 2
    sys.argv[0] = f"colibri {name}"  # what each tool's --help and errors call it
    return importlib.import_module(SUBCOMMANDS[name]).main(rest)


if __name__ == "__main__":
    sys.exit(main())
