"""The block dtypes (Q4_1, Q5_0, Q5_1, MXFP4, Q4_K, Q5_K, Q6_K): GGUF's blocks as the image stores them, scales
inside (docs/FORMAT.md "Dtypes"), read the way firmware/src/kernels_block.c reads them.

`unpack` gives every block of QBLOCK elements of a row as integers q and two float32 factors a and c, element k's
value being q[k] * a + c: the terms the runtime's dot products use (docs/KERNELS.md), and `decode` the values
themselves, which equal `gguf.dequantize` of the same bytes (the products are exact: an f16 times an integer of at
most 8 bits fits a float32's 24, and a K-quant's integer times that still does).
"""
from __future__ import annotations

import numpy as np

from colibri.format import DTYPE_TRAITS, DTYPES, OFFSET_DTYPES, QBLOCK

F32 = np.float32
BLOCK_DTYPES = tuple(n for n in DTYPES if DTYPE_TRAITS[n][0] > 1 and DTYPE_TRAITS[n][2] == 0)
MXFP4_VALUES = np.array([0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12], np.int16)  # twice E2M1's values


def _f16(blk: np.ndarray, at: int) -> np.ndarray:
    """The little-endian f16 at byte `at` of each block, as float32 (exactly)."""
    return np.ascontiguousarray(blk[..., at:at + 2]).view("<f2")[..., 0].astype(F32)


def _nibbles(qs: np.ndarray) -> np.ndarray:
    """16 bytes -> 32 values: element j in byte j's low nibble, j + 16 in its high one."""
    return np.concatenate([qs & 0xF, qs >> 4], axis=-1).astype(np.int16)


def _fifth_bits(qh: np.ndarray) -> np.ndarray:
    """bit j of the little-endian u32 in 4 bytes, for j < 32."""
    word = np.ascontiguousarray(qh).view("<u4").astype(np.uint32)  # [..., 1]
    return ((word >> np.arange(32, dtype=np.uint32)) & 1).astype(np.int16)


def _scale_min_k4(scales: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The 8 sub-blocks' 6-bit scales and mins of Q4_K/Q5_K blocks (llama.cpp's get_scale_min_k4): [..., 8] each."""
    s = scales.astype(np.uint32)
    low_sc, low_m = s[..., 0:4] & 63, s[..., 4:8] & 63
    high_sc = (s[..., 8:12] & 0xF) | (s[..., 0:4] >> 6) << 4
    high_m = (s[..., 8:12] >> 4) | (s[..., 4:8] >> 6) << 4
    return np.concatenate([low_sc, high_sc], axis=-1), np.concatenate([low_m, high_m], axis=-1)


def _k_sub_blocks(qs: np.ndarray) -> np.ndarray:
    """Q4_K/Q5_K's 128 bytes of nibbles -> [..., 8, 32]: sub-block j is the low (j even) or high nibbles of
    bytes 32 (j / 2) ... 32 (j / 2) + 31."""
    pairs = qs.reshape(*qs.shape[:-1], 4, 1, 32)
    return ((pairs >> np.array([0, 4], np.uint8)[:, None]) & 0xF).reshape(*qs.shape[:-1], 8, 32).astype(np.int16)


def unpack(values: np.ndarray, dtype: str) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """Blocks uint8 [..., blocks, bytes] of a block dtype -> q int16 [..., n, 32], a float32 [..., n], c float32
    [..., n] or None, n being the row's blocks of QBLOCK (8 per K-quant block). c is there for the dtypes the schema
    gives an offset (OFFSET_DTYPES, format/schema.toml), None for the others."""
    q, a, c = _terms(np.asarray(values, np.uint8), dtype)
    if (c is not None) != (dtype in OFFSET_DTYPES):
        raise ValueError(f"{dtype}: format/schema.toml says its blocks carry {'an' if dtype in OFFSET_DTYPES else 'no'} "
                         f"offset, but its layout here has {'none' if c is None else 'one'}")
    return q, a, c


def _terms(blk: np.ndarray, dtype: str) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """unpack's terms of each dtype's layout: c where its blocks hold an offset (m, or a K-quant's dmin times m)."""
    lead = blk.shape[:-2]
    if dtype == "Q4_1":
        return _nibbles(blk[..., 4:20]), _f16(blk, 0), _f16(blk, 2)
    if dtype == "Q5_0":
        return (_nibbles(blk[..., 6:22]) | (_fifth_bits(blk[..., 2:6]) << 4)) - np.int16(16), _f16(blk, 0), None
    if dtype == "Q5_1":
        return _nibbles(blk[..., 8:24]) | (_fifth_bits(blk[..., 4:8]) << 4), _f16(blk, 0), _f16(blk, 2)
    if dtype == "MXFP4":
        e = blk[..., 0].astype(np.uint32)
        bits = np.where(e < 2, np.uint32(0x00200000) << e, (e - 1) << 23).astype(np.uint32)
        return MXFP4_VALUES[_nibbles(blk[..., 1:17])], bits.view(F32), None
    if dtype in ("Q4_K", "Q5_K"):
        q = _k_sub_blocks(blk[..., 16:144] if dtype == "Q4_K" else blk[..., 48:176])
        if dtype == "Q5_K":  # bit 4 of element l of sub-block j: bit j of qh[l]
            qh = blk[..., 16:48].astype(np.int16)
            q = q | ((qh[..., None, :] >> np.arange(8, dtype=np.int16)[:, None]) & 1) << 4
        sc, m = _scale_min_k4(blk[..., 4:16])
        a = _f16(blk, 0)[..., None] * sc.astype(F32)
        c = -(_f16(blk, 2)[..., None] * m.astype(F32))
        return q.reshape(*lead, -1, QBLOCK), a.reshape(*lead, -1), c.reshape(*lead, -1)
    if dtype == "Q6_K":  # element 128n + 32k + l: ql[64n + 32(k & 1) + l] (high nibble for k >= 2), qh[32n + l]
        ql = blk[..., 0:128].reshape(*blk.shape[:-1], 2, 2, 32)      # [n, k & 1, l]
        qh = blk[..., 128:192].reshape(*blk.shape[:-1], 2, 1, 32)    # [n, -, l]
        k = np.arange(4, dtype=np.uint8)
        low = (ql[..., :, k & 1, :] >> (4 * (k >= 2)).astype(np.uint8)[:, None]) & 0xF      # [n, k, l]
        high = (qh >> (2 * k).astype(np.uint8)[:, None]) & 3
        q = (low | high << 4).astype(np.int16) - np.int16(32)
        scales = np.ascontiguousarray(blk[..., 192:208]).view(np.int8).astype(np.int16)  # per 16 elements
        q = q.reshape(*blk.shape[:-1], 16, 16) * scales[..., None]
        d = np.repeat(_f16(blk, 208)[..., None], 8, axis=-1)
        return q.reshape(*lead, -1, QBLOCK), d.reshape(*lead, -1), None
    raise ValueError(f"{dtype} is not a block dtype")


def decode(values: np.ndarray, dtype: str, cols: int) -> np.ndarray:
    """The float32 values [..., cols] the runtime computes with (weight_row_block): q * a + c, or q * a."""
    q, a, c = unpack(values, dtype)
    full = q.astype(F32) * a[..., None]
    if c is not None:
        full = full + c[..., None]
    return full.reshape(*q.shape[:-2], -1)[..., :cols]
