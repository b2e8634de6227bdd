"""The `colibri` command: one subcommand per tool, each the same program as its script in a checkout.

  colibri pack CHECKPOINT -o model.img [...]      host/pack.py: checkpoint or GGUF -> image
  colibri run model.img --board hosted [...]      host/flash.py: run an image on a board, verify it
  colibri footprint --board cortex_m4 [...]       tools/footprint.py: sizes, stack, purity of a build
  colibri report trace.json [...]                 tools/routing_report.py: where the experts' time goes
  colibri --version                               the package's version

`colibri SUBCOMMAND --help` lists each one's options. Running on a board, building and the footprint
report work in a Colibri checkout (the working directory or one above it, or $COLIBRI_ROOT).
"""
from __future__ import annotations

import sys
from importlib.metadata import PackageNotFoundError, version

from colibri.console import run_tool

SUBCOMMANDS = {"pack": "colibri.pack", "run": "colibri.flash", "footprint": "colibri.footprint",
               "report": "colibri.routing_report"}


def package_version() -> str:
    try:
        return version("colibri")
    except PackageNotFoundError:  # run from a checkout that was never installed: pyproject.toml says it
        import tomllib
        from colibri.paths import ROOT
        return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help"):
        print(__doc__.strip())
        return 0 if args else 2
    if args[0] == "--version":
        print(f"colibri {package_version()}")
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
