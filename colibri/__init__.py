"""Colibri's host side: packing checkpoints into images, the numpy reference, running and verifying on boards."""
from __future__ import annotations

from pathlib import Path


def _version() -> str:
    """pyproject.toml's version in a checkout; the installed distribution's otherwise."""
    pyproject = Path(__file__).resolve().parent.parent / "pyproject.toml"
    if pyproject.is_file():
        import tomllib
        return tomllib.loads(pyproject.read_text())["project"]["version"]
    from importlib.metadata import version
    return version("colibri")


__version__ = _version()
