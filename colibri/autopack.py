"""`colibri run model.gguf` (or a checkpoint directory): the model packed first, into a cache keyed by the source
files and the pack options ($XDG_CACHE_HOME/colibri/images/, ~/.cache by default), so the next run of the same
model with the same options starts at once, as llama.cpp's users point at a model file and run it."""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Callable

from colibri import __version__
from colibri.format import MAGIC

SOURCE_SUFFIXES = (".json", ".safetensors", ".model", ".txt", ".jinja")  # what a checkpoint directory packs from


def is_image(path: Path) -> bool:
    """A Colibri image by its magic (not a checkpoint directory or a GGUF file)."""
    if not path.is_file():
        return False
    with open(path, "rb") as f:
        return f.read(len(MAGIC)) == MAGIC


def source_files(src: Path) -> list[Path]:
    return sorted(p for p in src.iterdir() if p.suffix in SOURCE_SUFFIXES) if src.is_dir() else [src]


def file_dtype(src: Path) -> str:
    """The --dtype that keeps a model as its files store it: for a GGUF file `stored` (each matrix in its own type;
    q8_0 for a type no image has, IQ4_XS, Q3_K, ...); a checkpoint's config dtype (f16, bf16; f32 otherwise)."""
    if not src.is_dir():
        from colibri.gguf_input import gguf_reader
        gguf_reader(src)  # a damaged file: GGUFError, in pack's words, before "packing ..." is said
        return "stored"
    config = json.loads((src / "config.json").read_text()) if (src / "config.json").is_file() else {}
    stored = config.get("dtype") or config.get("torch_dtype") or ""
    return {"float16": "f16", "bfloat16": "bf16"}.get(stored, "f32")


def cache_key(src: Path, options: dict) -> str:
    """What makes a packed image the same: the source files (path, size, time), the options, this version."""
    files = [(str(p.resolve()), p.stat().st_size, p.stat().st_mtime_ns) for p in source_files(src)]
    return hashlib.sha256(json.dumps([files, options, __version__], sort_keys=True).encode()).hexdigest()[:16]


def image_cache() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "colibri" / "images"


def packed_image(src: Path, dtype: str | None, max_seq: int | None, kv: str, board: str | None,
                 say: Callable[[str], None]) -> Path:
    """The image of `src` packed with these options: from the cache, or packed now (said in one line). Raises
    what colibri.pack.pack raises for a source it cannot pack."""
    from colibri.checkpoint import not_a_checkpoint
    from colibri.pack import pack
    from colibri.quant import DType
    if (problem := not_a_checkpoint(src)) is not None:  # said before "packing ..."
        raise problem
    options = {"dtype": dtype, "max_seq": max_seq, "kv": kv}  # dtype None: the files' own, found when packing
    out = image_cache() / f"{src.name}-{cache_key(src, options)}.img"
    if out.is_file():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    dtype = dtype or file_dtype(src)
    seq = f"max_seq {max_seq}" if max_seq else "the default max_seq"
    say(f"packing {src} ({dtype}, {seq}, {kv} KV cache) into {out}; `colibri pack` packs with every option")
    pack(src, out, max_seq, 64, board=board, dtype=None if dtype == "stored" else DType.parse(dtype), kv=kv,
         measure_quality=False)
    return out
