"""The runtime's arithmetic in numpy, bit for bit: every operation the forward pass rounds, in the order
docs/KERNELS.md fixes and firmware/src/kernels.c (the scalar kernels) implements, vectorized across rows,
tokens and heads.

float32 numpy operations round as IEEE 754 does (to nearest, ties to even, subnormals kept), as every
board's FPU does with contraction off, so the same operations in the same order give the same bits. What
this module must get right is that order:

- a product is rounded, then added (no fused multiply-add);
- a float dot product adds element i to lane i % 16, then folds the 16 lanes in a fixed tree; a
  quantized one adds block b's term to lane b % 8, then the 8-lane tree;
- every other sum (RMSNorm's squares, softmax's exponentials, attention's weighted values, the experts'
  outputs) runs from +0 in index order; `np.add.accumulate` is such a sequential sum (numpy's `sum`,
  `mean` and `matmul` are not: they add pairwise or in BLAS's order);
- the exponential is the runtime's own polynomial (`expf`), not the C library's or numpy's.

Integer sums inside a quantization block are exact in any order, so they go through float32 BLAS (a block's
sum and every partial sum of it stays below 2^24: quantized_dot).

All of this needs the host's float32 arithmetic to keep subnormals, as numpy's does unless a library in the
process was built with -ffast-math (which sets flush-to-zero for the whole process): subnormals_kept() checks.
"""
from __future__ import annotations

import numpy as np

F32 = np.float32
ZERO, ONE = F32(0), F32(1)

# colibri_expf's constants, each as the C source rounds it to float
LOG2E = F32(1.44269502162933349609)
LN2_HI = F32(0.693145751953125)
LN2_LO = F32(1.42860682030941723212e-06)
EXP_MAX = F32(88.72283935546875)
EXP_MIN = F32(-103.972084045410156)
# 1.0f / 6 ... 1.0f / 5040: float divisions, rounded once
TAYLOR = [ONE / F32(k) for k in (6, 24, 120, 720, 5040)]


def subnormals_kept() -> bool:
    """Whether this process's float32 arithmetic keeps subnormal results (and inputs), as every board does."""
    tiny = np.array([1e-45], F32)  # the smallest subnormal
    return bool((tiny * ONE)[0] != 0 and (np.array([1e-38], F32) * F32(0.5))[0] != 0)


def f32(x) -> np.ndarray:
    return np.asarray(x, dtype=F32)


def _pow2(n: np.ndarray) -> np.ndarray:
    """2^n as float32 from its exponent bits, for integer n in [-126, 127]."""
    return ((n.astype(np.int64) + 127) << 23).astype(np.uint32).view(F32)


def expf(x) -> np.ndarray:
    """colibri_expf (kernels.c): x = n ln2 + r, e^r by a degree-7 Taylor polynomial in Horner form, scaled by
    2^n in at most two steps; NaN stays NaN, above 88.72... is +inf, below -103.97... is 0."""
    x = f32(x)
    with np.errstate(all="ignore"):
        fn = x * LOG2E
        n = np.trunc(fn + np.where(fn >= ZERO, F32(0.5), F32(-0.5)))
        n = np.where(np.isfinite(n), n, ZERO).astype(np.int32)  # (int) truncates toward zero
        nf = n.astype(F32)
        r = (x - nf * LN2_HI) - nf * LN2_LO
        p = TAYLOR[4]
        for c in (TAYLOR[3], TAYLOR[2], TAYLOR[1], TAYLOR[0], F32(0.5), ONE, ONE):
            p = c + r * p
        big = n > 127
        p = np.where(big, p * _pow2(np.full_like(n, 127)), p)
        n = np.where(big, n - 127, n)
        small = n < -126
        p = np.where(small, p * _pow2(np.full_like(n, -126)), p)
        n = np.where(small, n + 126, n)
        out = np.where(n < -126, ZERO, p * _pow2(np.clip(n, -126, 127)))
        out = np.where(x < EXP_MIN, ZERO, out)
        out = np.where(x > EXP_MAX, F32(np.inf), out)
        return np.where(np.isnan(x), x, out).astype(F32)


def sigmoid(x) -> np.ndarray:
    """1 / (1 + colibri_expf(-x)): the shared-expert gate and the sigmoid router."""
    return ONE / (ONE + expf(-f32(x)))


def silu_times(g: np.ndarray, u: np.ndarray) -> np.ndarray:
    """SwiGLU's element (swiglu_scalar): g / (1 + colibri_expf(-g)) * u."""
    return g / (ONE + expf(-g)) * u


def silu(x) -> np.ndarray:
    """silu_f (blocks/deltanet.c): x / (1 + colibri_expf(-x))."""
    x = f32(x)
    return x / (ONE + expf(-x))


# ln_f's series coefficients (blocks/deltanet.c): 1.0f / 3 ... 1.0f / 9
LN_SERIES = [ONE / F32(k) for k in (3, 5, 7, 9)]


def ln(x) -> np.ndarray:
    """ln_f (blocks/deltanet.c), for finite x >= 1: x = m 2^e, m in [sqrt(1/2), sqrt(2)), s = (m - 1) / (m + 1),
    ln m = 2s(1 + s^2(1/3 + s^2(1/5 + s^2(1/7 + s^2/9)))), plus e ln 2 in two parts."""
    x = f32(x)
    bits = x.view(np.uint32)
    e = (bits >> np.uint32(23)).astype(np.int32) - 127
    m = ((bits & np.uint32(0x007FFFFF)) | np.uint32(0x3F800000)).view(F32)
    high = m > F32(1.41421356)
    m = np.where(high, m * F32(0.5), m)
    e = np.where(high, e + 1, e)
    s = (m - ONE) / (m + ONE)
    s2 = s * s
    poly = LN_SERIES[3]
    for c in (LN_SERIES[2], LN_SERIES[1], LN_SERIES[0], ONE):
        poly = c + s2 * poly
    p = F32(2) * s * poly
    ef = e.astype(F32)
    return ef * LN2_HI + (ef * LN2_LO + p)


def softplus(x) -> np.ndarray:
    """softplus_f (blocks/deltanet.c): x above 20, else ln(1 + e) * (e / ((1 + e) - 1)) for e = colibri_expf(x),
    or e where 1 + e rounds to 1."""
    x = f32(x)
    e = expf(np.minimum(x, F32(20)))
    u = ONE + e
    with np.errstate(invalid="ignore", divide="ignore"):
        log1p = ln(np.maximum(u, ONE)) * (e / (u - ONE))
    return np.where(x > F32(20), x, np.where(u == ONE, e, log1p)).astype(F32)


def tanh(x) -> np.ndarray:
    """tanh_f: 1 - 2 / (colibri_expf(2x) + 1), which is 1 once the exponential overflows."""
    x = f32(x)
    with np.errstate(over="ignore"):
        return ONE - F32(2) / (expf(F32(2) * x) + ONE)


def gelu_tanh(x) -> np.ndarray:
    """gelu_tanh (kernels.h): 0.5 x (1 + tanh(0.7978845608028654 (x + 0.044715 x^3))), x^3 as (x x) x."""
    x = f32(x)
    inner = F32(0.7978845608028654) * (x + F32(0.044715) * ((x * x) * x))
    return (F32(0.5) * x) * (ONE + tanh(inner))


def seq_sum(v: np.ndarray, axis: int = -1) -> np.ndarray:
    """The sum of v along `axis` as a loop from +0 in index order computes it (0 + v0 + v1 + ...)."""
    v = f32(v)
    if v.shape[axis] == 0:
        return np.zeros(np.delete(v.shape, axis % v.ndim), F32)
    return ZERO + np.take(np.add.accumulate(v, axis=axis, dtype=F32), -1, axis=axis)


def rmsnorm(x: np.ndarray, w: np.ndarray | None, eps: float) -> np.ndarray:
    """rmsnorm (kernels.c) over the last axis: ss = sum of x^2 in order, scale = 1 / sqrt(ss / n + eps),
    out = (x scale) w, or x scale without weights (Gemma 4's v norm)."""
    x = f32(x)
    ss = seq_sum(x * x)
    scale = (ONE / np.sqrt(ss / F32(x.shape[-1]) + F32(eps)))[..., None]
    return x * scale if w is None else (x * scale) * f32(w)


def softmax(x: np.ndarray, sink: np.ndarray | None = None, mask: np.ndarray | None = None) -> np.ndarray:
    """softmax (kernels.c) over the last axis: the max (the sink's too), e_i = expf(x_i - max), their sum in
    order (the sink's exponential added last), e_i / sum. `mask` False: an entry outside the row (a position
    not seen), which is neither the max nor in the sum (its exponential would be 0 anyway), and gets 0."""
    x = f32(x)
    if mask is not None:
        x = np.where(mask, x, F32(-np.inf))
    top = np.max(x, axis=-1, keepdims=True)
    if sink is not None:
        top = np.maximum(top, sink[..., None])
    with np.errstate(invalid="ignore"):
        e = expf(x - top)
    if mask is not None:
        e = np.where(mask, e, ZERO)
    total = seq_sum(e)
    if sink is not None:
        total = total + expf(sink - top[..., 0])
    return e / total[..., None]


def lanes_tree(acc: np.ndarray, axis: int) -> np.ndarray:
    """sum_lanes16 / sum_lanes8 (kernels.h) over `axis` (16 or 8 lanes): fold the upper half onto the lower half
    until one lane is left."""
    while acc.shape[axis] > 1:
        half = acc.shape[axis] // 2
        acc = np.take(acc, range(half), axis=axis) + np.take(acc, range(half, 2 * half), axis=axis)
    return np.take(acc, 0, axis=axis)


def lanes_layout(w: np.ndarray) -> np.ndarray:
    """Float rows w [rows, cols] (f32, f16 or bf16, widened exactly) as float_dot reads them: float32
    [ceil(cols / 16), 16, rows] (element 16c + j of every row in lane j of chunk c, rows last so each step of the
    sum is one long vector operation), zero-padded (a zero weight times a zero input adds +0 to a lane, which
    leaves it as it was)."""
    rows, cols = w.shape
    chunks = -(-cols // 16)
    padded = np.zeros((rows, chunks * 16), F32)
    padded[:, :cols] = w
    return np.ascontiguousarray(padded.reshape(rows, chunks, 16).transpose(1, 2, 0))


def float_dot(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """x [n, cols] times float rows w [rows, cols] as dot_f32_scalar computes each row: product w[i] x[i]
    rounded, added to lane i % 16 (from +0, in order), then the 16-lane tree. [n, rows]."""
    lanes = lanes_layout(w)
    chunks, _, rows = lanes.shape
    n = x.shape[0]
    xp = np.zeros((n, chunks * 16), F32)
    xp[:, :x.shape[1]] = x
    xl = xp.reshape(n, chunks, 16, 1)
    acc = np.zeros((n, 16, rows), F32)
    prod = np.empty_like(acc)
    with np.errstate(all="ignore"):
        for c in range(chunks):
            np.multiply(lanes[None, c], xl[:, c], out=prod)
            np.add(acc, prod, out=acc)
        return lanes_tree(acc, axis=1)


def quantize_q8_0(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """quantize_q8_0_scalar of each row of x [n, cols]: per block of 32 (the last zero-padded) d = amax / 127,
    inv = 1 / d (0 when d is 0), q = v inv clamped to +-127 (NaN to 0) and rounded to nearest even. amax is the
    largest magnitude's bit pattern, so a NaN or an infinity makes d non-finite (and then v inv is NaN or
    infinite: q 0 or +-127, and the block's dot NaN). Returns (int8 [n, blocks, 32], float32 [n, blocks])."""
    n, cols = x.shape
    nb = -(-cols // 32)
    padded = np.zeros((n, nb * 32), F32)
    padded[:, :cols] = x
    xb = padded.reshape(n, nb, 32)
    amax = (xb.view(np.uint32) & np.uint32(0x7FFFFFFF)).max(axis=-1).view(F32)
    with np.errstate(all="ignore"):
        d = amax / F32(127)
        inv = np.where(d != ZERO, ONE / d, ZERO).astype(F32)
        q = xb * inv[..., None]
    q = np.where(np.isnan(q), ZERO, np.clip(q, F32(-127), F32(127)))
    return np.rint(q).astype(np.int8), d.astype(F32)


def quantized_dot(xq: np.ndarray, xd: np.ndarray, w_int: np.ndarray, w_a: np.ndarray,
                  w_c: np.ndarray | None = None) -> np.ndarray:
    """Quantized inputs (quantize_q8_0 of x [n, cols]: xq, xd) times quantized rows read as the dot products read
    them (Encoded.block_terms: integers w_int [rows, blocks, 32], float32 factors w_a and, for a dtype with an
    offset, w_c [rows, blocks]), as dot_blocks and dot_unpacked compute each row: block b's term
    (float)isum * (a xd), plus (float)xsum * (c xd) where there is an offset, added to lane b % 8 (from +0, in
    order), then the 8-lane tree. [n, rows].
    The integer sums go through float32 BLAS exactly: a product is at most 4096 x 127 (Q6_K's value times its
    sub-block scale), a block's sum of 32 at most 16,646,144, below 2^24, so every partial sum in any order (fused or
    not) is an integer float32 holds."""
    rows, nb, _ = w_int.shape
    n = xq.shape[0]
    x_f, w_f, w_a = xq.astype(F32), w_int.astype(F32), w_a.astype(F32)
    x_sum = xq.astype(np.int32).sum(axis=-1).astype(F32) if w_c is not None else None  # exact: |sum| <= 4064
    lanes = np.zeros((8, n, rows), F32)
    term, scale = np.empty((n, rows), F32), np.empty((n, rows), F32)
    with np.errstate(all="ignore"):
        for b in range(nb):  # lane b % 8 gets block b, in order
            np.matmul(x_f[:, b], w_f[:, b].T, out=term)      # block b's integer sums, exact
            np.multiply(w_a[None, :, b], xd[:, b, None], out=scale)
            term *= scale
            if w_c is not None:
                term += x_sum[:, b, None] * (w_c[None, :, b] * xd[:, b, None])
            lanes[b % 8] += term
        return lanes_tree(lanes, axis=0)
