"""What a user hands the commands, checked before any work is done (and before any board boots): option values
against their ranges (argparse types, so a bad one is an argument error naming the range), text that is not
UTF-8, output paths that cannot be written (checked before a run, so its results are not lost after it), an
output that is one of the files being packed, and a model file told by its bytes (GGUF's magic), not its name."""
from __future__ import annotations

import argparse
import math
import os
from pathlib import Path
from typing import Callable

GGUF_MAGIC = b"GGUF"


def is_gguf(path: Path) -> bool:
    """A GGUF file by its magic (SMOL.GGUF, an ollama blob without an extension), whatever its name."""
    try:
        with open(path, "rb") as f:
            return f.read(len(GGUF_MAGIC)) == GGUF_MAGIC
    except OSError:  # a directory, a file that cannot be read: not one (its reader says what it is)
        return False


def whole(low: int, high: int, note: str = "") -> Callable[[str], int]:
    """An argparse type: a whole number from `low` to `high`; `note` says what the ends mean."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = None
        if value is None or not low <= value <= high:
            raise argparse.ArgumentTypeError(f"{text!r}: give a whole number from {low:,} to {high:,}{note}")
        return value
    return parse


def number(low: float, high: float | None = None, note: str = "", low_open: bool = False) -> Callable[[str], float]:
    """An argparse type: a finite number from `low` to `high` (None: no bound above; above `low` with `low_open`)."""
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        if not math.isfinite(value) or not (low < value if low_open else low <= value) or \
                (high is not None and value > high):
            span = (f"above {low:g}" if low_open else f"of {low:g} or more") if high is None else \
                (f"above {low:g} and at most {high:g}" if low_open else f"from {low:g} to {high:g}")
            raise argparse.ArgumentTypeError(f"{text!r}: give a number {span}{note}")
        return value
    return parse


def not_utf8(text: str) -> str | None:
    """Why `text` (an argument or a line read, undecodable bytes kept as surrogates) is not UTF-8 text, or None."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raw = text[exc.start:exc.end].encode("utf-8", "surrogateescape")
        return f"it holds bytes that are not UTF-8 ({raw.hex(' ')} at character {exc.start}): give UTF-8 text"
    return None


def utf8_text(text: str) -> str:
    """An argparse type: text that a tokenizer can take (a shell hands undecodable bytes over as surrogates)."""
    problem = not_utf8(text)
    if problem:
        raise argparse.ArgumentTypeError(problem)
    return text


def output_problem(path: Path, option: str) -> str | None:
    """Why the file `path` (given with `option`) cannot be written, found before the work whose result goes there:
    a directory, a folder that does not exist or cannot be written; None when it can be."""
    if path.is_dir():
        return f"{option} {path} is a directory: give a file name in it, such as {path / 'out'}"
    folder = path.parent
    if not folder.is_dir():
        return f"{option} {path}: the folder {folder} does not exist"
    if not os.access(folder, os.W_OK | os.X_OK) or (path.exists() and not os.access(path, os.W_OK)):
        return f"{option} {path}: you may not write there"
    return None


def overwrites_source(sources: list[Path], output: Path) -> Path | None:
    """The source file the output would replace (the same path through any symlink, or the same file through a
    hard link), or None."""
    if not output.exists():
        return None
    for source in sources:
        try:
            if output.resolve() == source.resolve() or os.path.samefile(output, source):
                return source
        except OSError:
            continue
    return None
