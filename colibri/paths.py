"""Where the Colibri tree is: the boards/ descriptions, the firmware sources, SConstruct and build/ that the
board tools work with.

In order: $COLIBRI_ROOT; the checkout this package sits in (`pip install -e .`, or run from a checkout: the
package's own folder's parent has SConstruct and boards/); and for a package installed from a wheel, the tree the
wheel carries (colibri/tree/: SConstruct, firmware/, boards/) copied into the user's cache
($XDG_CACHE_HOME/colibri/<version>/, ~/.cache by default), where its builds are written. The working directory
plays no part: an installed package run inside some other checkout (an older one, or any folder with boards/ and
SConstruct) must not mix that tree's firmware with its own host code. Packing needs none of this; building,
running on a board and the footprint report do."""
from __future__ import annotations

import os
import shutil
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent
PACKAGED_TREE = PACKAGE / "tree"  # present in an installed wheel only (setup.py puts it there)
TREE_STAMP = ".colibri-tree"


def is_checkout(path: Path) -> bool:
    return (path / "boards").is_dir() and (path / "SConstruct").is_file()


def tree_signature(tree: Path) -> str:
    """What identifies a packaged tree's contents cheaply: its files' count, total size and newest time."""
    files = [p.stat() for p in tree.rglob("*") if p.is_file()]
    return f"{len(files)} {sum(s.st_size for s in files)} {max((s.st_mtime_ns for s in files), default=0)}"


def user_tree(packaged: Path = PACKAGED_TREE) -> Path:
    """The packaged tree's copy in the user's cache, refreshed when the installed package's tree changed (a new
    version installed over it); builds already made there are kept while their sources are the same."""
    from colibri import __version__
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    tree = cache / "colibri" / __version__
    signature = tree_signature(packaged)
    stamp = tree / TREE_STAMP
    if not stamp.exists() or stamp.read_text() != signature:
        tree.mkdir(parents=True, exist_ok=True)
        for item in packaged.iterdir():
            target = tree / item.name
            if item.is_dir():
                shutil.rmtree(target, ignore_errors=True)
                shutil.copytree(item, target)
            else:
                shutil.copy2(item, target)
        stamp.write_text(signature)
    return tree


def find_root() -> Path:
    if os.environ.get("COLIBRI_ROOT"):
        return Path(os.environ["COLIBRI_ROOT"]).resolve()
    if is_checkout(PACKAGE.parent):
        return PACKAGE.parent
    if is_checkout(PACKAGED_TREE):
        return user_tree()
    return PACKAGE.parent  # neither: no boards/ (said when a board is asked for)


ROOT = find_root()


def runtime_sources(root: Path = ROOT) -> list[Path]:
    """The runtime's translation units, firmware/src/*.c, as SConstruct compiles them (model.c includes the blocks,
    firmware/src/blocks/*.c)."""
    return sorted((root / "firmware" / "src").glob("*.c"))
