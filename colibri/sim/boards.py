"""Board descriptions: boards/<name>/board.toml, read as data."""
from __future__ import annotations

import tomllib
from dataclasses import dataclass
from pathlib import Path

from colibri.paths import ROOT

BOARDS_DIR = ROOT / "boards"
DEFAULT_BOARD = "x86_64_baremetal"


@dataclass(frozen=True)
class Board:
    name: str
    spec: dict

    def program(self, name: str = "firmware", mode: str = "release") -> Path:
        """A program `scons board=NAME` builds: firmware, or kernel_check (firmware.elf, or .exe on Windows)."""
        return ROOT / "build" / self.name / mode / (name + self.spec.get("program_suffix", ".elf"))

    def firmware(self, mode: str = "release") -> Path:
        return self.program("firmware", mode)


def fit_report(board: Board, image_bytes: int, arena_bytes: int) -> tuple[bool, list[str]]:
    """Whether an image and its arena fit the board's declared memory, as lines for the user."""
    mem = board.spec.get("memory")
    if not mem:
        return True, [f"{board.name}: no fixed memory limits (memory comes from the host)"]
    ok, lines = True, []
    for what, need, cap in (("image", image_bytes, mem["image_capacity"]), ("arena", arena_bytes, mem["arena_capacity"])):
        pct = 100.0 * need / cap
        bar = "#" * min(30, round(30 * need / cap)) + "." * max(0, 30 - round(30 * need / cap))
        lines.append(f"{board.name} {what:<5} [{bar}] {pct:5.1f}%  {need:,} of {cap:,} bytes")
        if need > cap:
            ok = False
            lines.append(f"  does not fit: {need - cap:,} bytes over")
    return ok, lines


def board_names() -> list[str]:
    return sorted(p.parent.name for p in BOARDS_DIR.glob("*/board.toml"))


def load_board(name: str) -> Board:
    path = BOARDS_DIR / name / "board.toml"
    if not BOARDS_DIR.is_dir():
        raise ValueError(f"no boards/ here ({ROOT}): run inside a Colibri checkout, or set COLIBRI_ROOT to one")
    if not path.exists():
        raise ValueError(f"unknown board {name!r}; boards: {', '.join(board_names())}")
    return Board(name, tomllib.loads(path.read_text()))
