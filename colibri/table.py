"""The image's records as bytes: the header block with its CRC, a tensor table entry (TensorEntry) and the tensor
it names as stored (entry_encoded), tensor names, the routed experts' blocks (docs/FORMAT.md)."""
from __future__ import annotations

import struct
import zlib
from dataclasses import dataclass
from typing import Iterator

import ml_dtypes
import numpy as np

from colibri.format import (ENTRY_FORMAT, HEADER_BYTES, HEADER_FIELDS, HEADER_FORMAT, HEADER_OFFSETS, LAYER_FORMAT,
                            NO_INDEX, ROLE_GGUF, Role)
from colibri.quant import QBLOCK, DType, Encoded, blocks

HEADER_STRUCT = struct.Struct(HEADER_FORMAT)  # every header field but `reserved`; zeros up to HEADER_BYTES
HEADER_CRC_OFFSET = HEADER_OFFSETS["header_crc32"]
ENTRY_STRUCT = struct.Struct(ENTRY_FORMAT)
LAYER_STRUCT = struct.Struct(LAYER_FORMAT)  # a layer kind's record (docs/FORMAT.md "Layers")


@dataclass
class TensorEntry:
    role: Role
    layer: int
    expert: int
    dtype: DType
    shape: tuple[int, ...]
    offset: int
    nbytes: int
    group_size: int = 0
    scales_offset: int = 0
    scales_bytes: int = 0

    def pack(self) -> bytes:
        dims = list(self.shape) + [1] * (2 - len(self.shape))
        return ENTRY_STRUCT.pack(self.role, self.dtype, self.layer, self.expert, len(self.shape),
                                 dims[0], dims[1], self.group_size, 0, self.offset, self.nbytes,
                                 self.scales_offset, self.scales_bytes)


    @property
    def end(self) -> int:
        """Where this tensor's bytes end (its scales included)."""
        return self.scales_offset + self.scales_bytes if self.scales_bytes else self.offset + self.nbytes


def entry_encoded(e: TensorEntry, values: bytes | memoryview | np.ndarray, scales: bytes | memoryview | np.ndarray | None,
                  values_at: int = 0, scales_at: int = 0) -> Encoded:
    """The tensor of table entry `e` as stored, without copying: its values at `values_at` of one buffer and,
    Q8_0/Q4_0, its scales at `scales_at` of another (the image itself for both, or the bytes read of each)."""
    dtype = DType(e.dtype)
    if dtype.quantized and not dtype.scales_apart:  # GGUF's blocks, scales inside
        rows, cols = e.shape
        vals = np.frombuffer(values, np.uint8, e.nbytes, values_at)
        return Encoded(dtype, e.shape, vals.reshape(rows, -(-cols // dtype.block), dtype.block_bytes))
    if dtype.quantized:
        rows, cols = e.shape
        per_block = QBLOCK if dtype == DType.Q8_0 else QBLOCK // 2
        vals = np.frombuffer(values, np.int8 if dtype == DType.Q8_0 else np.uint8, e.nbytes, values_at)
        scale = np.frombuffer(scales, "<f2", e.scales_bytes // 2, scales_at)
        return Encoded(dtype, e.shape, vals.reshape(rows, blocks(cols), per_block), scale.reshape(rows, -1))
    np_dtype = {DType.F32: "<f4", DType.F16: "<f2", DType.BF16: ml_dtypes.bfloat16}[dtype]
    count = int(np.prod(e.shape))
    return Encoded(dtype, e.shape, np.frombuffer(values, np_dtype, count, values_at).reshape(e.shape))


def tensor_name(role: Role, layer: int = NO_INDEX, expert: int = NO_INDEX) -> str:
    """A tensor's name for humans and for `pack.py --keep` globs: llama.cpp's names (blk.3.attn_q,
    blk.3.ffn_gate_exps.5 for expert 5, token_embd, output)."""
    name = ROLE_GGUF[role]
    if layer != NO_INDEX:
        name = f"blk.{layer}.{name}"
    return f"{name}.{expert}" if expert != NO_INDEX else name


def expert_blocks(entries: list[TensorEntry]) -> Iterator[tuple[TensorEntry, TensorEntry]]:
    """(gate, down) of every routed expert: its block is [gate.offset, down.end)."""
    for i, e in enumerate(entries):
        if e.role == Role.EXPERT_GATE:
            yield e, entries[i + 2]


def header_block(header: dict) -> bytes:
    """The HEADER_BYTES header bytes of `header`, with its CRC (the CRC field is zero while summing)."""
    raw = bytearray(HEADER_BYTES)
    HEADER_STRUCT.pack_into(raw, 0, *(header[k] if k != "header_crc32" else 0 for k in HEADER_FIELDS))
    struct.pack_into("<I", raw, HEADER_CRC_OFFSET, crc32(raw))
    return bytes(raw)


def write_header(buf: bytearray | memoryview, header: dict) -> None:
    """Pack `header` into buf[0:HEADER_BYTES] with its CRC."""
    buf[:HEADER_BYTES] = header_block(header)


def crc32(data: bytes | memoryview) -> int:
    return zlib.crc32(data) & 0xFFFFFFFF
