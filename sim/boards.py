"""Board descriptions: boards/<name>/board.toml, read as data."""
from __future__ import annotations

import tomllib
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BOARDS_DIR = ROOT / "boards"
DEFAULT_BOARD = "hosted"


@dataclass(frozen=True)
class Board:
    name: str
    spec: dict

    @property
    def folder(self) -> Path:
        return BOARDS_DIR / self.name

    def firmware(self, mode: str = "release") -> Path:
        return ROOT / "build" / self.name / mode / "firmware.elf"


def board_names() -> list[str]:
    return sorted(p.parent.name for p in BOARDS_DIR.glob("*/board.toml"))


def load_board(name: str) -> Board:
    path = BOARDS_DIR / name / "board.toml"
    if not path.exists():
        raise ValueError(f"unknown board {name!r}; boards: {', '.join(board_names())}")
    return Board(name, tomllib.loads(path.read_text()))
