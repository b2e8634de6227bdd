"""The model families the packer maps (colibri/checkpoint.py for Hugging Face checkpoints, colibri/gguf_input.py for
GGUF files), one file each: a file declares FAMILIES, its architectures' `Family` records, and this package gathers
every file's. What a record holds and what still takes code is in docs/RUNTIME.md ("Adding a family"); granite.py
is a family that is data only; deepseek.py, gpt_oss.py and gemma4.py keep the code their mechanisms need as the hooks
their records name (base.py)."""
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
# gguf_input.py maps each GGUF architecture to one family, or to two told apart by experts (llama: Llama, Mixtral),
# and each of those to the variants its files' keys tell apart (granitemoe: GraniteMoe, GraniteMoeShared)
_gguf = [(f.gguf_arch, f.moe, f.gguf_variant_key) for f in FAMILIES.values() if f.gguf_arch]
if len(set(_gguf)) != len(_gguf):
    raise ValueError(f"colibri/families: GGUF architectures {_gguf} name one twice, with or without experts")
if any(v and (a, m, "") not in _gguf for a, m, v in _gguf):
    raise ValueError("colibri/families: a family with a gguf_variant_key needs a family of the same GGUF architecture "
                     "and expert kind without one, the family it is a variant of")
if any(f.gguf_read_tensors and not f.gguf_read_config for f in FAMILIES.values()):
    raise ValueError("colibri/families: a gguf_read_tensors hook is called only beside a gguf_read_config one")

__all__ = ["FAMILIES", "Family"]
