"""The model families the packer maps (colibri/checkpoint.py for Hugging Face checkpoints, colibri/gguf_input.py for
GGUF files), one file each: a file declares FAMILIES, its architectures' `Family` records, and this package gathers
every file's (adding a family is adding a file). A family that needs no new runtime mechanism is all data: its tensor names, config keys, fixed flags, the
config fields only it reads and the multipliers folded into weights (granite.py is one). DeepSeek's, gpt-oss's and
Gemma 4's mappings still have code of their own in checkpoint.py, switched on by their records' fields."""
from __future__ import annotations

import importlib
import pkgutil

from colibri.families.base import Family

FAMILIES: dict[str, Family] = {}
for _info in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):  # every file of this package but base.py
    if _info.name == "base":
        continue
    _module = importlib.import_module(f"{__name__}.{_info.name}")
    for _arch, _family in _module.FAMILIES.items():
        if _arch in FAMILIES:
            raise ValueError(f"{_module.__name__}: architecture {_arch} is declared twice")
        FAMILIES[_arch] = _family

__all__ = ["FAMILIES", "Family"]
