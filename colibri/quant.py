"""Weight dtypes of the image (f32, f16, bf16, Q8_0, Q4_0): encoding, exact decoding, and the
activation quantization the runtime applies before a quantized dot product.

Q8_0 and Q4_0 are GGUF's schemes: blocks of 32 values along a row with one f16 scale each;
quantizing uses the `gguf` package (llama.cpp's reference quantizers), so a GGUF tensor of that
type and a tensor quantized here agree. The image stores a quantized tensor as its values (int8,
or packed int4 pairs as GGUF lays them out in a block) followed by its f16 scales; a row whose
length is not a multiple of 32 is zero-padded to whole blocks (docs/FORMAT.md).
"""
from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Callable

import gguf
import ml_dtypes
import numpy as np

from colibri.format import DTYPE_TRAITS, DTYPES, QBLOCK  # noqa: F401  (format/schema.toml's)


class DType(enum.IntEnum):
    """The image's weight dtypes, valued as format/schema.toml lists them."""
    F32 = DTYPES.index("F32")
    F16 = DTYPES.index("F16")
    BF16 = DTYPES.index("BF16")
    Q8_0 = DTYPES.index("Q8_0")
    Q4_0 = DTYPES.index("Q4_0")

    @property
    def block(self) -> int:
        """Elements of a row stored together: QBLOCK for a quantized dtype, 1 for a float one."""
        return DTYPE_TRAITS[self.name][0]

    @property
    def block_bytes(self) -> int:
        return DTYPE_TRAITS[self.name][1]

    @property
    def quantized(self) -> bool:
        """Whether each block carries an f16 scale."""
        return DTYPE_TRAITS[self.name][2] > 0

    @classmethod
    def parse(cls, name: str) -> "DType":
        try:
            return cls[name.upper()]
        except KeyError:
            raise ValueError(f"unknown dtype {name!r}; choose from {', '.join(d.name.lower() for d in cls)}") from None


GGUF_TYPE = {DType.Q8_0: gguf.GGMLQuantizationType.Q8_0, DType.Q4_0: gguf.GGMLQuantizationType.Q4_0}
VALUE_BYTES = {d: d.block_bytes for d in DType if d.quantized}  # per block


def blocks(cols: int) -> int:
    return -(-cols // QBLOCK)


@dataclass(frozen=True)
class Encoded:
    """A matrix (or vector) in an image dtype: `values` as stored, `scales` [rows, blocks] f16 when quantized."""
    dtype: DType
    shape: tuple[int, ...]
    values: np.ndarray  # f32 / f16 / bf16 elements, int8 [rows, blocks, 32], or uint8 [rows, blocks, 16]
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
        """Quantized values as int8 [rows, blocks, 32] (Q4_0 unpacked: low nibbles first, minus 8)."""
        if self.dtype == DType.Q8_0:
            return self.values.view(np.int8)
        lo, hi = self.values & 0xF, self.values >> 4
        return np.concatenate([lo, hi], axis=-1).view(np.int8) - np.int8(8)

    def decode(self) -> np.ndarray:
        """The exact float32 values the runtime computes with."""
        if not self.dtype.quantized:
            return self.values.astype(np.float32)
        cols = self.shape[-1]
        full = self.int_values().astype(np.float32) * self.scales.astype(np.float32)[..., None]
        return full.reshape(*self.shape[:-1], -1)[..., :cols]

    def map_rows(self, fn) -> "Encoded":
        """Apply a row permutation/reshaping `fn` (acting on axis 0) to values and scales alike."""
        scales = None if self.scales is None else fn(self.scales)
        return Encoded(self.dtype, self.shape, fn(self.values), scales)


def matrix_rows(t: np.ndarray | Encoded, rows: slice) -> np.ndarray | Encoded:
    """Rows of a matrix: of an Encoded one (a GGUF file's Q8_0/Q4_0) as stored, whole blocks; else as f32."""
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
    return rows * nb * t.dtype.block_bytes, rows * nb if t.dtype.quantized else 0


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
    rows, cols = arr.shape
    nb = blocks(cols)
    padded = np.zeros((rows, nb * QBLOCK), np.float32)
    padded[:, :cols] = arr
    raw = gguf.quants.quantize(padded, GGUF_TYPE[dtype])  # [rows, nb * (2 + value bytes)]
    return from_gguf_blocks(raw, dtype, (rows, cols))


def convert(t: np.ndarray | Encoded, dtype: DType) -> Encoded:
    """`t` in `dtype`: a tensor already stored in it is kept bit for bit (a GGUF Q8_0/Q4_0 tensor carries over
    unchanged); anything else is decoded to float32 and encoded."""
    if isinstance(t, Encoded):
        if t.dtype == dtype:
            return t
        t = t.decode()
    return encode(t, dtype)


# OCP MXFP4's E2M1 values by 4-bit code (sign bit 3)
FP4_VALUES = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0], np.float32)


def mxfp4_dequantize(blocks: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """MXFP4 as gpt-oss's checkpoints store it: blocks [..., G, 16] of packed E2M1 codes (element 2j in the low
    nibble of byte j, 2j + 1 in the high one), scales [..., G] E8M0 (2^(s - 127)): values [..., G * 32], exact."""
    blocks, scales = np.asarray(blocks, np.uint8), np.asarray(scales, np.uint8)
    values = np.empty((*blocks.shape[:-1], 32), np.float32)
    values[..., 0::2], values[..., 1::2] = FP4_VALUES[blocks & 0xF], FP4_VALUES[blocks >> 4]
    values = np.ldexp(values, scales.astype(np.int32)[..., None] - 127)
    return values.reshape(*blocks.shape[:-2], -1)


def from_gguf_blocks(raw: np.ndarray, dtype: DType, shape: tuple[int, ...]) -> Encoded:
    """Split GGUF blocks (f16 scale, then the values) of a tensor of `shape` (rows last) into the
    image's values and scales, unchanged."""
    lead, nb = tuple(shape[:-1]), blocks(shape[-1])
    per_block = 2 + VALUE_BYTES[dtype]
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
    """x [n, cols] times a Q8_0/Q4_0 matrix [rows, cols]^T with x quantized as the runtime does: per block
    the exact integer dot product times (w_scale * x_scale) in float32, summed over blocks in float64."""
    xq, xd = quantize_activation(x)
    wq = w.int_values().astype(np.float64)  # small integers: float64 BLAS products are exact
    wd = w.scales.astype(np.float32)
    out = np.zeros((x.shape[0], w.shape[0]), np.float64)
    for b in range(wq.shape[1]):
        isum = xq[:, b, :].astype(np.float64) @ wq[:, b, :].T                 # [n, rows], exact
        scale = (wd[None, :, b] * xd[:, b, None]).astype(np.float32)          # rounded as on the device
        out += (isum.astype(np.float32) * scale).astype(np.float32)
    return out.astype(np.float32)
