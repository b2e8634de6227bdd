"""GGUF's K-quants Q4_K, Q5_K and Q6_K, made from f32 rows: llama.cpp's reference quantizers
(quantize_row_q*_K_ref, no importance matrix), ported; bit-identical, tested against llama.cpp's own output
(tests/test_kquant.py, on tests/fixtures/kquant/llama-cpp-kquants.npz, written by tools/make_kquant_fixture.py).

The C is ggml/src/ggml-quants.c in llama.cpp (quantize_row_q4_K_ref, quantize_row_q5_K_ref,
quantize_row_q6_K_ref and their helpers make_qkx2_quants, make_qx_quants, nearest_int); the block layouts are
ggml/src/ggml-common.h's block_q4_K (144 bytes), block_q5_K (176) and block_q6_K (210), each holding one
super-block of 256 consecutive values of a row.

How the port stays bit-identical:
- Every operation is float32, in the C's order: `a*b*c` is `(a*b)*c`, an int operand is converted to float
  first, and a C loop `s += t[i]` is a Python loop over i adding float32 arrays (`_seqsum`), never numpy's
  pairwise `sum`. No multiply-add is fused: llama.cpp's x86-64 build has none in these functions (ggml-base
  gets none of the CPU backend's -march flags: baseline x86-64, no FMA). A build for a CPU whose baseline has
  FMA (aarch64) by GCC, whose C default is -ffp-contract=fast, may fuse some and differ from both in rare bits.
- nearest_int is llama.cpp's magic-number trick, reproduced on the float's bits (`_nearest_int`): round half
  to even of the float32, and the same wrapped garbage when the argument is out of its range.
- GGML_FP32_TO_FP16 rounds to nearest even, as numpy's float16 conversion does; f16 to f32 is exact.
- Where the C stores an int in a uint8_t or int8_t, the port keeps its low 8 bits.

Vectorized: a C function that runs on one sub-block of n values runs here on all the sub-blocks of many
super-blocks at once, as arrays shaped [n, M]: row i holds element i of each of the M sub-blocks, so the C loop
`for (int i = 0; i < n; ++i)` is a loop over rows, and per-sub-block scalars are arrays of shape [M]. A branch
taken by some sub-blocks only becomes np.where. Inputs must be finite (a NaN or inf raises ValueError).
"""
from __future__ import annotations

from typing import Callable

import numpy as np

from colibri.format import DTYPE_TRAITS

QK_K = 256  # values per super-block
BLOCK_BYTES = {name.lower(): DTYPE_TRAITS[name][1] for name in ("Q4_K", "Q5_K", "Q6_K")}  # format/schema.toml's
GROUP_MAX_EPS = np.float32(1e-15)  # ggml-quants.c: a group whose largest |x| is below this is all zero
CHUNK = 512  # super-blocks quantized together: enough to amortize numpy's per-call cost, small enough for cache

F32 = np.float32
_MAGIC = F32(12582912.0)  # 1.5 * 2**23


def _nearest_int(f: np.ndarray) -> np.ndarray:
    """nearest_int(float fval): `val = fval + 12582912.f; return (bits(val) & 0x007fffff) - 0x00400000`, as int32.

    For |fval| <= 4194303 this is fval rounded half to even; beyond, the same bits as the C (which asserts)."""
    bits = (np.asarray(f, dtype=F32) + _MAGIC).view(np.int32)
    return (bits & 0x007FFFFF) - 0x00400000


def _nearest_f(f: np.ndarray, lo: int, hi: int) -> np.ndarray:
    """MAX(lo, MIN(hi, nearest_int(f))) as the float the C converts it to when it multiplies with it.

    Overwrites f (a float32 temporary) and returns it: `(bits(f + magic) & 0x007fffff) - 0x00400000` computed as
    the float with those low 23 bits and the exponent of 2**23, minus 1.5 * 2**23: integers below 2**24, exact."""
    f += _MAGIC
    bits = f.view(np.int32)
    bits &= 0x007FFFFF
    bits |= 0x4B000000  # 2**23 + the low 23 bits
    f -= _MAGIC
    return np.clip(f, lo, hi, out=f)


def _seqsum(terms: np.ndarray) -> np.ndarray:
    """`float s = 0; for (i = 0; i < n; ++i) s += terms[i];` over axis 0, in float32 and in that order."""
    s = F32(0) + terms[0]
    for t in terms[1:]:
        s = s + t
    return s


def _fp16(x: np.ndarray) -> np.ndarray:
    """GGML_FP32_TO_FP16 (round to nearest even), as the f16's bits: uint16."""
    return np.asarray(x, dtype=F32).astype(np.float16).view(np.uint16)


def _fp32(h: np.ndarray) -> np.ndarray:
    """GGML_FP16_TO_FP32 of an f16's bits (exact)."""
    return h.view(np.float16).astype(F32)


def _le16(h: np.ndarray) -> np.ndarray:
    """uint16 [...] -> its little-endian bytes, uint8 [..., 2] (a ggml_half field)."""
    return np.stack([h & 0xFF, h >> 8], axis=-1).astype(np.uint8)


# ---------------------------------------------------------------------------------------------------------------
# The helpers of ggml-quants.c, on [n, M] sub-blocks


def make_qkx2_quants(x: np.ndarray, weights: np.ndarray, nmax: int, rmin: float, rdelta: float,
                     nstep: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """make_qkx2_quants(n, nmax, x, weights, L, &the_min, Laux, rmin, rdelta, nstep, use_mad=false).

    x, weights: float32 [n, M]. Returns (scale [M], the_min [M], L float32 [n, M] in 0..nmax): the sub-blocks are
    x ~ scale * L - the_min, the scale and min found by trying nstep + 1 inverse scales around nmax / (max - min)
    and fitting the weighted least squares for each."""
    n = x.shape[0]
    # where the C's min or max is a 0, the first zero's sign wins, maybe not min()'s; harmless: a -0 and a +0 min
    # or max give the same bytes (x - min, max - min, nearest_int of +-0 and the max_min test agree)
    min_ = x.min(axis=0)
    max_ = x.max(axis=0)
    sum_w = weights[0]
    sum_x = sum_w * x[0]
    for i in range(1, n):
        sum_w = sum_w + weights[i]
        sum_x = sum_x + weights[i] * x[i]
    min_ = np.where(min_ > 0, F32(0), min_)
    flat = max_ == min_  # the C returns here: L = 0, the_min = -min, scale 0
    flat_min = -min_

    iscale = F32(nmax) / (max_ - min_)
    scale = F32(1) / iscale
    L = _nearest_f(iscale * (x - min_), 0, nmax)
    diff = scale * L + min_ - x
    best_error = _seqsum(weights * (diff * diff))

    # the loop's arrays, written in place: Laux; w*l, w*l*l and w*l*x stacked so that one _seqsum adds all three;
    # the weighted squared errors
    laux = np.empty_like(x)
    terms = np.empty((n, 3) + x.shape[1:], F32)
    wl, wll, wlx = terms[:, 0], terms[:, 1], terms[:, 2]
    err = np.empty_like(x)
    for is_ in range(nstep + 1):
        # min is the best fit's so far (this_min once one was better): the C's `max - min` and `x[i] - min` use it
        iscale = (F32(rmin) + F32(rdelta) * F32(is_) + F32(nmax)) / (max_ - min_)
        np.subtract(x, min_, out=laux)
        laux *= iscale
        _nearest_f(laux, 0, nmax)
        np.multiply(weights, laux, out=wl)
        np.multiply(wl, laux, out=wll)
        np.multiply(wl, x, out=wlx)
        sum_l, sum_l2, sum_xl = _seqsum(terms)
        D = sum_w * sum_l2 - sum_l * sum_l
        this_scale = (sum_w * sum_xl - sum_x * sum_l) / D
        this_min = (sum_l2 * sum_x - sum_l * sum_xl) / D
        positive = this_min > 0
        this_min = np.where(positive, F32(0), this_min)
        this_scale = np.where(positive, sum_xl / sum_l2, this_scale)
        np.multiply(this_scale, laux, out=err)  # diff = this_scale * Laux[i] + this_min - x[i]; w * diff * diff
        err += this_min
        err -= x
        err *= err
        err *= weights
        cur_error = _seqsum(err)
        better = (D > 0) & (cur_error < best_error)
        np.copyto(L, laux, where=better)
        best_error = np.where(better, cur_error, best_error)
        scale = np.where(better, this_scale, scale)
        min_ = np.where(better, this_min, min_)

    L = np.where(flat, F32(0), L)
    scale = np.where(flat, F32(0), scale)
    return scale, np.where(flat, flat_min, -min_), L


def make_qx_quants(x: np.ndarray, nmax: int) -> tuple[np.ndarray, np.ndarray]:
    """make_qx_quants(n, nmax, x, L, rmse_type=1, qw=NULL): symmetric, weights x*x.

    x: float32 [n, M]. Returns (scale [M], L float32 [n, M] in 0..2*nmax-1, stored as l + nmax): x ~ scale * (L -
    nmax), the scale the best of nineteen inverse scales around -nmax / max (max: the value of largest |x|)."""
    # max: the value of largest |x|, the first one where +v and -v tie (`if (ax > amax) { amax = ax; max = x[i]; }`)
    hi, lo = x.max(axis=0), x.min(axis=0)
    max_ = np.where(hi > -lo, hi, lo)
    tie = np.flatnonzero((hi == -lo) & (hi > 0))
    if tie.size:
        first_hi = np.argmax(x[:, tie] == hi[tie], axis=0)
        first_lo = np.argmax(x[:, tie] == lo[tie], axis=0)
        max_[tie] = np.where(first_hi < first_lo, hi[tie], lo[tie])
    amax = np.abs(max_)
    zero = amax < GROUP_MAX_EPS  # the C returns here: L = 0, scale 0

    w = x * x
    wx = w * x  # the C's `w*x[i]*l` is `(w*x[i])*l`

    def fit(iscale: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        lf = _nearest_f(iscale * x, -nmax, nmax - 1)
        return lf, _seqsum(wx * lf), _seqsum((w * lf) * lf)

    iscale = F32(-nmax) / max_
    lf, sumlx, suml2 = fit(iscale)
    L = lf + F32(nmax)
    scale = np.where(suml2 != 0, sumlx / suml2, F32(0))
    best = scale * sumlx
    for is_ in range(-9, 10):
        if is_ == 0:
            continue
        iscale = -(F32(nmax) + F32(0.1) * F32(is_)) / max_
        lf, sumlx, suml2 = fit(iscale)
        better = (suml2 > 0) & (sumlx * sumlx > best * suml2)
        L = np.where(better, lf + F32(nmax), L)
        scale = np.where(better, sumlx / suml2, scale)
        best = np.where(better, scale * sumlx, best)

    L = np.where(zero, F32(0), L)
    scale = np.where(zero, F32(0), scale)
    return scale, L


# ---------------------------------------------------------------------------------------------------------------
# quantize_row_q4_K_ref and quantize_row_q5_K_ref: 8 sub-blocks of 32, 6-bit scales and mins


def _subblocks(x: np.ndarray, n: int) -> np.ndarray:
    """Super-blocks [B, 256] -> sub-blocks of n as [n, B * 256 / n] (sub-block j of super-block b: column b*256/n+j)."""
    return np.ascontiguousarray(x.reshape(-1, n).T)


def _k_scales_mins(x: np.ndarray, nmax: int, rmin: float, nstep: int) -> tuple[np.ndarray, np.ndarray, np.ndarray,
                                                                             np.ndarray]:
    """The part Q4_K and Q5_K share. x: float32 [B, 256]. Returns (d, dmin: f16 bits [B], scales: the 12 packed
    bytes [B, 12], L: uint8 [B, 256] in 0..nmax)."""
    B = x.shape[0]
    xs = _subblocks(x, 32)  # [32, B*8]
    sum_x2 = _seqsum(xs * xs)
    av_x = np.sqrt(sum_x2 / F32(32))
    weights = av_x + np.abs(xs)
    scales, mins, L = make_qkx2_quants(xs, weights, nmax, rmin, F32(0.1), nstep)
    scales, mins = scales.reshape(B, 8), mins.reshape(B, 8)

    # `if (scale > max_scale) max_scale = scale`, from 0
    max_scale = scales.max(axis=1)
    max_scale = np.where(max_scale > 0, max_scale, F32(0))
    max_min = mins.max(axis=1)
    max_min = np.where(max_min > 0, max_min, F32(0))
    inv_scale = np.where(max_scale > 0, F32(63) / max_scale, F32(0))[:, None]
    inv_min = np.where(max_min > 0, F32(63) / max_min, F32(0))[:, None]
    ls = np.minimum(_nearest_int(inv_scale * scales) & 0xFF, 63).astype(np.uint8)  # uint8_t ls = ...; MIN(63, ls)
    lm = np.minimum(_nearest_int(inv_min * mins) & 0xFF, 63).astype(np.uint8)
    # 12 bytes: sub-blocks 0-3's scales and mins in the low 6 bits of bytes 0-7; 4-7's low 4 bits in bytes 8-11,
    # their high 2 bits in the top of bytes 0-7 (get_scale_min_k4 reads them back)
    packed = np.concatenate([ls[:, :4] | (ls[:, 4:] >> 4) << 6,
                             lm[:, :4] | (lm[:, 4:] >> 4) << 6,
                             (ls[:, 4:] & 0xF) | (lm[:, 4:] & 0xF) << 4], axis=1).astype(np.uint8)
    d = _fp16(max_scale / F32(63))
    dmin = _fp16(max_min / F32(63))

    # the final quants, from the rounded scales; a sub-block whose scale rounds to 0 keeps make_qkx2_quants' L
    sc_d = (_fp32(d)[:, None] * ls.astype(F32)).reshape(-1)  # [B*8], get_scale_min_k4 gives back ls, lm
    sc_m = (_fp32(dmin)[:, None] * lm.astype(F32)).reshape(-1)
    with np.errstate(divide="ignore", invalid="ignore"):
        l_final = _nearest_f((xs + sc_m) / sc_d, 0, nmax)
    L = np.where(sc_d != 0, l_final, L)
    L = L.astype(np.uint8).T.reshape(B, QK_K)
    return d, dmin, packed, L


def _q4_k(x: np.ndarray) -> np.ndarray:
    """quantize_row_q4_K_ref on super-blocks x [B, 256] -> block_q4_K [B, 144]: d, dmin, scales[12], qs[128]."""
    d, dmin, scales, L = _k_scales_mins(x, 15, -1.0, 20)
    L4 = L.reshape(-1, 4, 2, 32)  # 64 values -> 32 bytes: the first 32 in the low nibbles, the next 32 high
    qs = (L4[:, :, 0] | L4[:, :, 1] << 4).reshape(-1, 128)
    return np.concatenate([_le16(d), _le16(dmin), scales, qs], axis=1)


def _q5_k(x: np.ndarray) -> np.ndarray:
    """quantize_row_q5_K_ref on super-blocks x [B, 256] -> block_q5_K [B, 176]: d, dmin, scales[12], qh[32],
    qs[128]."""
    d, dmin, scales, L = _k_scales_mins(x, 31, -0.5, 15)
    L4 = L.reshape(-1, 4, 2, 32)
    qs = ((L4[:, :, 0] & 0xF) | (L4[:, :, 1] & 0xF) << 4).reshape(-1, 128)
    # bit 4 of value 64*k + 32*h + j goes to bit 2*k + h of qh[j]
    hi = (L4 >> 4).astype(np.uint8)
    qh = np.zeros((L.shape[0], 32), np.uint8)
    for k in range(4):
        for h in range(2):
            qh |= hi[:, k, h] << (2 * k + h)
    return np.concatenate([_le16(d), _le16(dmin), scales, qh, qs], axis=1)


# ---------------------------------------------------------------------------------------------------------------
# quantize_row_q6_K_ref: 16 sub-blocks of 16, symmetric, int8 scales


def _q6_k(x: np.ndarray) -> np.ndarray:
    """quantize_row_q6_K_ref on super-blocks x [B, 256] -> block_q6_K [B, 210]: ql[128], qh[64], scales[16], d."""
    B = x.shape[0]
    xs = _subblocks(x, 16)  # [16, B*16]
    scales, L = make_qx_quants(xs, 32)
    scales = scales.reshape(B, 16)

    # the scale of largest |scale|, the first of equal ones (`if (abs_scale > max_abs_scale)`, from 0)
    rows = np.arange(B)
    abs_scales = np.abs(scales)
    i_max = np.argmax(abs_scales, axis=1)
    max_abs_scale = abs_scales[rows, i_max]
    max_scale = scales[rows, i_max]
    zero = max_abs_scale < GROUP_MAX_EPS  # the whole block is written as zeros

    with np.errstate(divide="ignore", invalid="ignore"):
        iscale = (F32(-128) / max_scale)[:, None]
        d = _fp16(F32(1) / iscale[:, 0])
        sc = np.minimum(127, _nearest_int(iscale * scales)).astype(np.uint8).view(np.int8)  # int8_t scales[16]
        sc_d = (_fp32(d)[:, None] * sc.astype(F32)).reshape(-1)  # [B*16]
        l_final = _nearest_f(xs / sc_d, -32, 31) + F32(32)
    L = np.where(sc_d != 0, l_final, L)  # a sub-block whose scale rounds to 0 keeps make_qx_quants' L
    L = L.astype(np.uint8).T.reshape(B, 2, 4, 32)  # 128 values at a time, in four runs of 32

    # ql: low nibbles, runs 0 and 2 (then 1 and 3) sharing bytes; qh: the 2 high bits of runs 0-3 in one byte
    ql = np.stack([(L[:, :, 0] & 0xF) | (L[:, :, 2] & 0xF) << 4,
                   (L[:, :, 1] & 0xF) | (L[:, :, 3] & 0xF) << 4], axis=2).reshape(B, 128)
    qh = (L[:, :, 0] >> 4 | (L[:, :, 1] >> 4) << 2 | (L[:, :, 2] >> 4) << 4 | (L[:, :, 3] >> 4) << 6).reshape(B, 64)
    out = np.concatenate([ql, qh, sc.view(np.uint8), _le16(d)], axis=1).astype(np.uint8)
    out[zero] = 0
    return out


# ---------------------------------------------------------------------------------------------------------------
# The entry points


def _quantize(rows: np.ndarray, kernel: Callable[[np.ndarray], np.ndarray], block_bytes: int,
              name: str) -> np.ndarray:
    x = np.asarray(rows)
    if x.ndim != 2:
        raise ValueError(f"{name}: expected a 2-D [rows, cols] matrix, got shape {x.shape}")
    n_rows, cols = x.shape
    if cols % QK_K:
        raise ValueError(f"{name}: the row length {cols} is not a multiple of {QK_K} (the K-quants' super-block)")
    x = np.ascontiguousarray(x, dtype=F32)
    if not np.isfinite(x).all():
        bad = int(np.argwhere(~np.isfinite(x))[0, 0])
        raise ValueError(f"{name}: row {bad} holds a NaN or an infinity; K-quants need finite values")
    blocks = x.reshape(-1, QK_K)
    out = np.empty((blocks.shape[0], block_bytes), np.uint8)
    with np.errstate(over="ignore", divide="ignore", invalid="ignore", under="ignore"):
        for start in range(0, blocks.shape[0], CHUNK):
            out[start:start + CHUNK] = kernel(blocks[start:start + CHUNK])
    # the blocks' f16 scales (d, and dmin for Q4_K/Q5_K: the first two, Q6_K's d the last two bytes): where values
    # are so large that the search overflows (Q6_K from about 1e15) a scale comes out NaN, and llama.cpp's own order
    # writes an infinite or zero one instead: that block is not llama.cpp's, so it is refused (an infinite scale, as
    # llama.cpp writes for values past f16's range, is its bytes and is kept)
    scales = np.ascontiguousarray(out[:, block_bytes - 2:] if name == "Q6_K" else out[:, :4]).view("<f2")
    if np.isnan(scales).any():
        bad = int(np.argwhere(np.isnan(scales))[0, 0]) // (cols // QK_K)
        raise ValueError(f"{name}: row {bad}'s values are too large for {name} (a block's scale overflows)")
    return out.reshape(n_rows, cols // QK_K, block_bytes)


def quantize_q4_k(rows: np.ndarray) -> np.ndarray:
    """f32 [rows, cols] (cols a multiple of 256) -> uint8 [rows, cols // 256, 144]: GGUF Q4_K blocks, the bytes
    llama.cpp's quantize_row_q4_K_ref writes. Raises ValueError on another shape or a non-finite value."""
    return _quantize(rows, _q4_k, BLOCK_BYTES["q4_k"], "Q4_K")


def quantize_q5_k(rows: np.ndarray) -> np.ndarray:
    """f32 [rows, cols] (cols a multiple of 256) -> uint8 [rows, cols // 256, 176]: GGUF Q5_K blocks, the bytes
    llama.cpp's quantize_row_q5_K_ref writes. Raises ValueError on another shape or a non-finite value."""
    return _quantize(rows, _q5_k, BLOCK_BYTES["q5_k"], "Q5_K")


def quantize_q6_k(rows: np.ndarray) -> np.ndarray:
    """f32 [rows, cols] (cols a multiple of 256) -> uint8 [rows, cols // 256, 210]: GGUF Q6_K blocks, the bytes
    llama.cpp's quantize_row_q6_K_ref writes. Raises ValueError on another shape or a non-finite value."""
    return _quantize(rows, _q6_k, BLOCK_BYTES["q6_k"], "Q6_K")


QUANTIZERS: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "q4_k": quantize_q4_k, "q5_k": quantize_q5_k, "q6_k": quantize_q6_k}
