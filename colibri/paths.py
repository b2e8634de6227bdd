"""Where the Colibri checkout is: the boards/ descriptions, the firmware sources and build/ that the
board tools work with. The Python package runs from the checkout it sits in, or installed (`pip install
.`) from anywhere: then the checkout is $COLIBRI_ROOT, or the working directory or one above it.
Packing needs none of this; running on a board, building and the footprint report do."""
from __future__ import annotations

import os
from pathlib import Path


def is_checkout(path: Path) -> bool:
    return (path / "boards").is_dir() and (path / "SConstruct").is_file()


def find_root() -> Path:
    if os.environ.get("COLIBRI_ROOT"):
        return Path(os.environ["COLIBRI_ROOT"]).resolve()
    beside = Path(__file__).resolve().parent.parent
    if is_checkout(beside):
        return beside
    here = Path.cwd().resolve()
    return next((p for p in (here, *here.parents) if is_checkout(p)), here)


ROOT = find_root()


def runtime_sources(root: Path = ROOT) -> list[Path]:
    """The runtime's translation units, firmware/src/*.c, as SConstruct compiles them (model.c includes the blocks,
    firmware/src/blocks/*.c)."""
    return sorted((root / "firmware" / "src").glob("*.c"))
