"""Checkpoint tensors read from their file only when their values are asked for, one at a time.

Packing streams (colibri/writer.py write_image encodes one tensor, writes it, lets it go), so what it
holds is bounded by a few times the largest tensor, never the model. A tensor's bytes are read with
pread at the offset its file's header gave, once per file: nothing is memory-mapped, because every page
of a mapping that a process has touched counts toward its resident memory until the mapping goes, so
reading a whole checkpoint through a map looks (to the kernel's accounting, to its OOM killer) like
holding all of it.
"""
from __future__ import annotations

import os
import weakref
from pathlib import Path
from typing import Callable

import numpy as np

from colibri.quant import DType, Encoded


class OpenFile:
    """A file opened once for reading at offsets; closed when the last tensor reading it goes."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self.fd = os.open(self.path, os.O_RDONLY)
        weakref.finalize(self, os.close, self.fd)
        self.size = os.fstat(self.fd).st_size

    def read(self, nbytes: int, offset: int) -> memoryview:
        """Exactly `nbytes` bytes at `offset` (one read returns at most about 2 GiB on Linux: loop)."""
        buf = memoryview(bytearray(nbytes))
        done = 0
        while done < nbytes:
            try:
                got = os.preadv(self.fd, [buf[done:]], offset + done)
            except OSError as exc:  # (a folder opens, then reads as EISDIR; a failing disk EIO): say which file
                raise OSError(exc.errno, exc.strerror, str(self.path)) from None
            if got == 0:
                raise ValueError(f"{self.path} ends at {offset + done} bytes, inside a tensor the header places there")
            done += got
        return buf


class LazyTensor:
    """A tensor whose shape is known and whose values are read or computed only when asked for: load() as
    stored (an array, or an Encoded tensor of a GGUF file), np.asarray(t) as float32."""

    # The image dtype --dtype stored packs it in (colibri.gguf_input.stored_as): the one its file stores it in (a GGUF
    # tensor of a quantized image dtype, loaded as Encoded, or of F16/BF16), Q8_0 for a GGUF type no image has, or
    # None (f32)
    kept: DType | None = None

    def __init__(self, shape: tuple[int, ...]):
        self.shape = tuple(int(n) for n in shape)

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        return int(np.prod(self.shape))

    def load(self) -> np.ndarray | Encoded:
        raise NotImplementedError

    def expert(self, index: int) -> np.ndarray | Encoded:
        """Sub-tensor `index` of the first axis (one expert of a stacked tensor), as stored."""
        return self.load()[index]

    def __array__(self, dtype=None, copy=None) -> np.ndarray:
        values = self.load()
        values = values.decode() if isinstance(values, Encoded) else np.asarray(values, dtype=np.float32)
        return values if dtype is None else values.astype(dtype)


Decode = Callable[[np.ndarray, tuple[int, ...]], "np.ndarray | Encoded"]


class FileTensor(LazyTensor):
    """`stored_shape` elements of `stored` dtype at byte `start` of an open file, in C order; `decode` turns
    the stored elements of (a sub-tensor of) it into its values of `shape` (default: as stored)."""

    def __init__(self, file: OpenFile, start: int, stored: np.dtype, stored_shape: tuple[int, ...],
                 shape: tuple[int, ...] | None = None, decode: Decode | None = None, kept: DType | None = None):
        super().__init__(stored_shape if shape is None else shape)
        self.kept = kept
        self.file, self.start, self.stored = file, start, np.dtype(stored)
        self.stored_shape = tuple(int(n) for n in stored_shape)
        self.decode = decode or (lambda raw, shape: raw)

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.stored_shape)) * self.stored.itemsize

    def load(self) -> np.ndarray | Encoded:
        raw = np.frombuffer(self.file.read(self.nbytes, self.start), self.stored).reshape(self.stored_shape)
        return self.decode(raw, self.shape)

    def expert(self, index: int) -> np.ndarray | Encoded:
        """Reads the bytes of sub-tensor `index` only."""
        if not 0 <= index < self.stored_shape[0]:
            raise IndexError(f"sub-tensor {index} of a tensor of {self.stored_shape[0]}")
        row = self.nbytes // self.stored_shape[0]
        raw = np.frombuffer(self.file.read(row, self.start + index * row), self.stored).reshape(self.stored_shape[1:])
        return self.decode(raw, self.shape[1:])


class Derived(LazyTensor):
    """A tensor computed from other tensors only when its values are asked for (a part of DeepSeek's kv_b_proj,
    one expert of fused experts, rows unpermuted): `compute()` gives its values, `compute_expert(i)` (when
    given) sub-tensor i of them without computing the others."""

    def __init__(self, shape: tuple[int, ...], compute: Callable[[], np.ndarray | Encoded],
                 compute_expert: Callable[[int], np.ndarray | Encoded] | None = None, kept: DType | None = None):
        super().__init__(shape)
        self.compute, self.compute_expert, self.kept = compute, compute_expert, kept

    def load(self) -> np.ndarray | Encoded:
        return self.compute()

    def expert(self, index: int) -> np.ndarray | Encoded:
        return self.compute_expert(index) if self.compute_expert else self.load()[index]


def expert_of(t: np.ndarray | Encoded | LazyTensor, index: int) -> np.ndarray | Encoded:
    """Sub-tensor `index` of a tensor stacked by expert, reading only its bytes from a file."""
    return t.expert(index) if isinstance(t, LazyTensor) else t[index]


def loaded(t: np.ndarray | Encoded | LazyTensor) -> np.ndarray | Encoded:
    """A tensor's values as stored: read now if they were not yet."""
    return t.load() if isinstance(t, LazyTensor) else t
