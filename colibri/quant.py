"""Weight dtypes of the image (f32, f16, bf16, and GGUF's Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, MXFP4, Q4_K, Q5_K, Q6_K):
encoding, exact decoding, and the activation quantization the runtime applies before a quantized dot product.

The quantized dtypes are GGUF's schemes, so a GGUF tensor of one of them carries over unchanged. Q8_0 and Q4_0 are
stored as their values (int8, or packed int4 pairs as GGUF lays them out in a block) followed by their f16 scales;
the others ("block dtypes", colibri/block_dtypes.py) as GGUF's blocks, scales inside. A row whose length is not a
multiple of its block is zero-padded to whole blocks (the dtypes with blocks of 32; a K-quant row is whole blocks,
docs/FORMAT.md). Quantizing uses the `gguf` package's quantizers (llama.cpp's reference ones, ported) and, for the
K-quants, which it lacks, colibri/kquant.py's port of llama.cpp's.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Callable

import gguf
import ml_dtypes
import numpy as np

from colibri import block_dtypes
from colibri.format import DTYPE_TRAITS, DTYPES, QBLOCK  # noqa: F401  (format/schema.toml's)


class DType(enum.IntEnum):
    """The image's weight dtypes, valued as format/schema.toml lists them."""
    F32 = DTYPES.index("F32")
    F16 = DTYPES.index("F16")
    BF16 = DTYPES.index("BF16")
    Q8_0 = DTYPES.index("Q8_0")
    Q4_0 = DTYPES.index("Q4_0")
    Q4_1 = DTYPES.index("Q4_1")
    Q5_0 = DTYPES.index("Q5_0")
    Q5_1 = DTYPES.index("Q5_1")
    MXFP4 = DTYPES.index("MXFP4")
    Q4_K = DTYPES.index("Q4_K")
    Q5_K = DTYPES.index("Q5_K")
    Q6_K = DTYPES.index("Q6_K")

    @property
    def block(self) -> int:
        """Elements of a row stored together: 32 or 256 for a quantized dtype, 1 for a float one."""
        return DTYPE_TRAITS[self.name][0]

    @property
    def block_bytes(self) -> int:
        """Bytes of a block (its f16 scale apart not counted: scales_apart)."""
        return DTYPE_TRAITS[self.name][1]

    @property
    def quantized(self) -> bool:
        return self.block > 1

    @property
    def scales_apart(self) -> bool:
        """Q8_0, Q4_0: each block's f16 scale stored apart, after the values; the block dtypes hold theirs."""
        return DTYPE_TRAITS[self.name][2] > 0

    @property
    def bytes_per_value(self) -> float:
        """What makes one dtype wider than another: a block's bytes, with its scale, per element."""
        return (self.block_bytes + DTYPE_TRAITS[self.name][2]) / self.block

    @classmethod
    def parse(cls, name: str) -> "DType":
        try:
            return cls[name.upper()]
        except KeyError:
            raise ValueError(f"unknown dtype {name!r}; choose from {', '.join(d.name.lower() for d in cls)}") from None


GGUF_TYPE = {d: gguf.GGMLQuantizationType[d.name] for d in DType if d.quantized}
# llama.cpp's fallback types (llama-quant.cpp tensor_type_fallback) for a row that is not whole K-quant blocks; where
# that row is not whole blocks of 32 either, llama.cpp takes F16 (GGUF has no partial block) and the image pads the
# last block with zeros instead (docs/FORMAT.md "Row tails")
K_FALLBACK = {DType.Q4_K: DType.Q5_0, DType.Q5_K: DType.Q5_1, DType.Q6_K: DType.Q8_0}


def fitted(dtype: DType, cols: int) -> DType:
    """`dtype` for a matrix of `cols` columns: a K-quant's needs whole 256-element blocks, else llama.cpp's fallback."""
    return K_FALLBACK[dtype] if dtype in K_FALLBACK and cols % dtype.block else dtype


def blocks(cols: int) -> int:
    return -(-cols // QBLOCK)


@dataclass(frozen=True)
class Encoded:
    """A matrix (or vector) in an image dtype: `values` as stored, `scales` [rows, blocks] f16 for Q8_0/Q4_0."""
    dtype: DType
    shape: tuple[int, ...]
    # f32 / f16 / bf16 elements, int8 [rows, blocks, 32] (Q8_0), uint8 [rows, blocks, 16] (Q4_0), or a block
    # dtype's GGUF blocks uint8 [rows, blocks, block_bytes]
    values: np.ndarray
    scales: np.ndarray | None = None

    @property
    def size(self) -> int:
        return int(np.prod(self.shape))

    @property
    def ndim(self) -> int:
        return len(self.shape)

    def __getitem__(self, i: int) -> "Encoded":
        """Sub-tensor i along the first axis (one expert of a stacked [experts, rows, cols] tensor)."""
        return Encoded(self.dtype, self.shape[1:], self.values[i], None if self.scales is None else self.scales[i])

    def rows(self, index: slice | np.ndarray) -> "Encoded":
        """Rows `index` of a matrix (a slice or an array of row numbers), without copying a slice."""
        values = self.values[index]
        return Encoded(self.dtype, (values.shape[0], *self.shape[1:]), values,
                       None if self.scales is None else self.scales[index])

    def int_values(self) -> np.ndarray:
        """Q8_0/Q4_0 values as int8 [rows, blocks, 32] (Q4_0 unpacked: low nibbles first, minus 8)."""
        if self.dtype == DType.Q8_0:
            return self.values.view(np.int8)
        lo, hi = self.values & 0xF, self.values >> 4
        return np.concatenate([lo, hi], axis=-1).view(np.int8) - np.int8(8)

    def block_terms(self) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
        """A quantized matrix as the dot products read it (docs/KERNELS.md): per block of 32 integers q [rows,
        blocks, 32] and float32 factors a and c [rows, blocks] (c None: 0), element k's value q[k] a + c."""
        if self.dtype.scales_apart:
            return self.int_values(), self.scales.astype(np.float32), None
        return block_dtypes.unpack(self.values, self.dtype.name)

    def decode(self) -> np.ndarray:
        """The exact float32 values the runtime computes with."""
        if not self.dtype.quantized:
            return self.values.astype(np.float32)
        cols = self.shape[-1]
        if not self.dtype.scales_apart:
            return block_dtypes.decode(self.values, self.dtype.name, cols)
        full = self.int_values().astype(np.float32) * self.scales.astype(np.float32)[..., None]
        return full.reshape(*self.shape[:-1], -1)[..., :cols]

    def map_rows(self, fn) -> "Encoded":
        """Apply a row permutation/reshaping `fn` (acting on axis 0) to values and scales alike."""
        scales = None if self.scales is None else fn(self.scales)
        return Encoded(self.dtype, self.shape, fn(self.values), scales)


def matrix_rows(t: np.ndarray | Encoded, rows: slice) -> np.ndarray | Encoded:
    """Rows of a matrix: of an Encoded one (a GGUF file's quantized tensor) as stored, whole blocks; else as f32."""
    return t.rows(rows) if isinstance(t, Encoded) else np.asarray(t, np.float32)[rows]


@dataclass(frozen=True)
class Deferred:
    """A tensor to be encoded in `dtype` only when its bytes are written (colibri/writer.py write_image):
    `load()` gives its values then (an array, anything np.asarray turns into one, or an Encoded tensor, kept
    bit for bit when already in `dtype`), so packing holds one tensor at a time, never the model."""
    dtype: DType
    shape: tuple[int, ...]
    load: Callable[[], object]

    @property
    def size(self) -> int:
        return int(np.prod(self.shape))

    def encoded(self) -> Encoded:
        return convert(self.load(), self.dtype)


def stored_bytes(t: Encoded | Deferred) -> tuple[int, int]:
    """(value bytes, f16 scales) of a tensor as the image stores it, without encoding a Deferred one."""
    if isinstance(t, Encoded):
        return t.values.nbytes, 0 if t.scales is None else t.scales.size
    rows, cols = int(np.prod(t.shape[:-1])), t.shape[-1]
    nb = -(-cols // t.dtype.block)
    return rows * nb * t.dtype.block_bytes, rows * nb if t.dtype.scales_apart else 0


def encode(arr: np.ndarray, dtype: DType) -> Encoded:
    """A float array in `dtype` (round to nearest even for f16/bf16; GGUF's quantizers for Q8_0/Q4_0)."""
    arr = np.asarray(arr, dtype=np.float32)
    if dtype == DType.F32:  # contiguous as an image holds it (a product's summation order follows the layout)
        return Encoded(dtype, arr.shape, np.ascontiguousarray(arr))
    if dtype == DType.F16:
        return Encoded(dtype, arr.shape, arr.astype(np.float16))
    if dtype == DType.BF16:
        return Encoded(dtype, arr.shape, arr.astype(ml_dtypes.bfloat16))
    if arr.ndim != 2:
        raise ValueError(f"only matrices can be quantized, not shape {arr.shape}")
    if not np.isfinite(arr).all():  # (its blocks' scales would be NaN: the runtime would stop at them)
        raise ValueError(f"row {int(np.argwhere(~np.isfinite(arr))[0, 0])} holds a NaN or an infinity, which no "
                         f"{dtype.name} block holds; keep this tensor f32 (--keep NAME) or fix the checkpoint")
    rows, cols = arr.shape
    dtype = fitted(dtype, cols)  # (a row that is not whole 256-element blocks: llama.cpp's fallback type)
    if dtype in K_FALLBACK:
        from colibri import kquant  # (numpy's work, only when asked for)
        return Encoded(dtype, (rows, cols), kquant.QUANTIZERS[dtype.name.lower()](arr).reshape(rows, -1, dtype.block_bytes))
    nb = blocks(cols)
    padded = np.zeros((rows, nb * QBLOCK), np.float32)
    padded[:, :cols] = arr
    with np.errstate(all="ignore"):  # (values past f16's range: its scale is infinite, as llama.cpp's would be)
        raw = gguf.quants.quantize(padded, GGUF_TYPE[dtype])  # [rows, nb * block bytes]
    return from_gguf_blocks(raw, dtype, (rows, cols))


def convert(t: np.ndarray | Encoded, dtype: DType) -> Encoded:
    """`t` in `dtype`: a tensor already stored in it is kept bit for bit (a GGUF Q8_0/Q4_0 tensor carries over
    unchanged); anything else is decoded to float32 and encoded."""
    if isinstance(t, Encoded):
        if t.dtype == dtype:
            return t
        t = t.decode()
    return encode(t, dtype)


def mxfp4_blocks_from_hf(blocks: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """gpt-oss's MXFP4 (blocks [..., G, 16]: element 2j in the low nibble of byte j, 2j + 1 in the high one; scales
    [..., G] E8M0) as GGUF's MXFP4 blocks [..., G, 17] ({e; qs[16]}: element j in the low nibble of byte j, j + 16
    in the high one), the image's: the same codes and exponents, so the same values exactly."""
    blocks, scales = np.asarray(blocks, np.uint8), np.asarray(scales, np.uint8)
    codes = np.empty((*blocks.shape[:-1], 32), np.uint8)
    codes[..., 0::2], codes[..., 1::2] = blocks & 0xF, blocks >> 4
    out = np.empty((*blocks.shape[:-1], 17), np.uint8)
    out[..., 0], out[..., 1:] = scales, codes[..., :16] | codes[..., 16:] << 4
    return out


def mxfp4_blocks_to_hf(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """GGUF's MXFP4 blocks [..., G, 17] as gpt-oss's (blocks [..., G, 16], scales [..., G]): mxfp4_blocks_from_hf
    undone."""
    values = np.asarray(values, np.uint8)
    codes = np.concatenate([values[..., 1:] & 0xF, values[..., 1:] >> 4], axis=-1)
    return codes[..., 0::2] | codes[..., 1::2] << 4, values[..., 0].copy()


def from_gguf_blocks(raw: np.ndarray, dtype: DType, shape: tuple[int, ...]) -> Encoded:
    """GGUF blocks of a tensor of `shape` (rows last) as the image stores them, unchanged: Q8_0/Q4_0's split into
    values and scales (the f16 scale first in each block), a block dtype's as they are."""
    lead, nb = tuple(shape[:-1]), -(-shape[-1] // dtype.block)
    if not dtype.scales_apart:
        return Encoded(dtype, shape, np.ascontiguousarray(raw, dtype=np.uint8).reshape(*lead, nb, dtype.block_bytes))
    per_block = 2 + dtype.block_bytes
    blk = np.ascontiguousarray(raw, dtype=np.uint8).reshape(*lead, nb, per_block)
    scales = blk[..., :2].copy().view("<f2").reshape(*lead, nb)
    values = blk[..., 2:].copy()
    if dtype == DType.Q8_0:
        values = values.view(np.int8)
    return Encoded(dtype, shape, values, scales)


def quantize_activation(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Q8_0 of each row of x [n, cols], as the runtime's quantize_q8_0 computes it in float32:
    d = amax / 127, q = round_half_even(x * (1 / d)); a NaN or an infinity in a block makes d NaN or infinite
    and q 0 there, as on the device (np.max propagates both, as the device's amax does).
    Returns (int8 [n, blocks, 32], f32 [n, blocks])."""
    n, cols = x.shape
    nb = blocks(cols)
    padded = np.zeros((n, nb * QBLOCK), np.float32)
    padded[:, :cols] = x
    xb = padded.reshape(n, nb, QBLOCK)
    d = (np.max(np.abs(xb), axis=-1) / np.float32(127)).astype(np.float32)
    with np.errstate(divide="ignore"):
        inv = np.where(d != 0, np.float32(1) / d, np.float32(0)).astype(np.float32)
    with np.errstate(invalid="ignore"):
        scaled = np.nan_to_num(xb * inv[..., None], nan=0.0, posinf=127.0, neginf=-127.0)
    q = np.rint(np.clip(scaled, -127, 127)).astype(np.int8)  # as quantize_one() in kernels.c
    return q, d


def quantized_matmul(x: np.ndarray, w: Encoded) -> np.ndarray:
    """x [n, cols] times a quantized matrix [rows, cols]^T with x quantized as the runtime does: per block the exact
    integer dot product times (a * x_scale) in float32, plus the offset's term for a dtype with one, summed over
    blocks in float64."""
    xq, xd = quantize_activation(x)
    q, a, c = w.block_terms()
    wq = q.astype(np.float64)  # small integers: float64 BLAS products are exact
    x_sum = xq.astype(np.float64).sum(axis=-1)
    out = np.zeros((x.shape[0], w.shape[0]), np.float64)
    for b in range(wq.shape[1]):
        isum = xq[:, b, :].astype(np.float64) @ wq[:, b, :].T                 # [n, rows], exact
        scale = (a[None, :, b] * xd[:, b, None]).astype(np.float32)           # rounded as on the device
        term = (isum.astype(np.float32) * scale).astype(np.float32)
        if c is not None:
            term = term + (x_sum[:, b, None].astype(np.float32) * (c[None, :, b] * xd[:, b, None])).astype(np.float32)
        out += term
    return out.astype(np.float32)
