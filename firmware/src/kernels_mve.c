/* Cortex-M55 kernels: Helium (MVE), 128-bit vectors. Each function computes exactly what its scalar
 * twin in kernels.c computes (docs/KERNELS.md): the 16 float lanes live in four 4-wide registers,
 * integer block sums come from VMLADAV (exact), products and sums are rounded separately. */
#include "internal.h"

#if defined(__ARM_FEATURE_MVE) && (__ARM_FEATURE_MVE & 2) && !defined(COLIBRI_KERNELS_SCALAR)
#include "mve.h"

static float one_f32(const void *w, uint32_t i) { return ((const float *)w)[i]; }
static float one_f16(const void *w, uint32_t i) { return f16_to_f32(((const uint16_t *)w)[i]); }
static float one_bf16(const void *w, uint32_t i) { return bf16_to_f32(((const uint16_t *)w)[i]); }

/* The 16-lane float dot in four 4-lane registers; always inlined with constant loaders. */
ALWAYS_INLINE float dot_lanes16(const void *w, const float *x, uint32_t n, float32x4_t (*load4)(const void *, uint32_t),
                                float (*one)(const void *, uint32_t)) {
    float32x4_t a0 = vdupq_n_f32(0.0f), a1 = a0, a2 = a0, a3 = a0;
    uint32_t i = 0;
    for (; i + 16 <= n; i += 16) {
        a0 = vaddq_f32(a0, vmulq_f32(load4(w, i), vld1q_f32(x + i)));
        a1 = vaddq_f32(a1, vmulq_f32(load4(w, i + 4), vld1q_f32(x + i + 4)));
        a2 = vaddq_f32(a2, vmulq_f32(load4(w, i + 8), vld1q_f32(x + i + 8)));
        a3 = vaddq_f32(a3, vmulq_f32(load4(w, i + 12), vld1q_f32(x + i + 12)));
    }
    float acc[16];
    vst1q_f32(acc, a0);
    vst1q_f32(acc + 4, a1);
    vst1q_f32(acc + 8, a2);
    vst1q_f32(acc + 12, a3);
    for (; i < n; i++) acc[i % 16] += one(w, i) * x[i];
    return sum_lanes16(acc);
}

static float dot_f32_mve(const float *w, const float *x, uint32_t n) {
    flush_flags_clear();
    const float r = dot_lanes16(w, x, n, load4_f32, one_f32);
    return flushed(r) ? dot_f32_scalar(w, x, n) : r;
}
static float dot_f16_mve(const uint16_t *w, const float *x, uint32_t n) {
    flush_flags_clear();
    const float r = dot_lanes16(w, x, n, load4_f16, one_f16);
    return flushed(r) ? dot_f16_scalar(w, x, n) : r;
}
SCORES_BY_DOTS(static, mve, dot_f32_mve, dot_f16_mve) /* attention's scores: the scalar loop over this set's dots */
static float dot_bf16_mve(const uint16_t *w, const float *x, uint32_t n) {
    flush_flags_clear();
    const float r = dot_lanes16(w, x, n, load4_bf16, one_bf16);
    return flushed(r) ? dot_bf16_scalar(w, x, n) : r;
}

static int32_t isum_q8_0_mve(const void *w_row, const int8_t *xq, uint32_t b) {
    const int8_t *w = (const int8_t *)w_row + (size_t)b * QBLOCK;
    xq += (size_t)b * QBLOCK;
    return vmladavaq_s8(vmladavq_s8(vld1q_s8(w), vld1q_s8(xq)), vld1q_s8(w + 16), vld1q_s8(xq + 16));
}

static int32_t isum_q4_0_mve(const void *w_row, const int8_t *xq, uint32_t b) {
    uint8x16_t bytes = vld1q_u8((const uint8_t *)w_row + (size_t)b * (QBLOCK / 2));
    const int8x16_t eight = vdupq_n_s8(8);
    int8x16_t lo = vsubq_s8(vreinterpretq_s8_u8(vandq_u8(bytes, vdupq_n_u8(0x0F))), eight);
    int8x16_t hi = vsubq_s8(vreinterpretq_s8_u8(vshrq_n_u8(bytes, 4)), eight);
    xq += (size_t)b * QBLOCK;
    return vmladavaq_s8(vmladavq_s8(lo, vld1q_s8(xq)), hi, vld1q_s8(xq + 16));
}

static float dot_q8_0_mve(const void *w, const uint16_t *w_scale, const q8_vector *x, uint32_t blocks) {
    return dot_blocks(w, w_scale, x, blocks, isum_q8_0_mve);
}
static float dot_q4_0_mve(const void *w, const uint16_t *w_scale, const q8_vector *x, uint32_t blocks) {
    return dot_blocks(w, w_scale, x, blocks, isum_q4_0_mve);
}

static void rows_q8_0_mve(const int8_t *w, const uint16_t *w_scale, const q8_vector *x, uint32_t blocks, uint32_t rows,
                          float *out) {
    dot_rows(w, w_scale, x, blocks, rows, (size_t)blocks * QBLOCK, out, dot_q8_0_mve);
}
static void rows_q4_0_mve(const uint8_t *w, const uint16_t *w_scale, const q8_vector *x, uint32_t blocks, uint32_t rows,
                          float *out) {
    dot_rows(w, w_scale, x, blocks, rows, (size_t)blocks * (QBLOCK / 2), out, dot_q4_0_mve);
}

/* accumulate's elements [i, i + 16) of out over every row in four registers held across the rows, each element's
 * sum the scalar kernel's in its order. Stored only if no float operation met a subnormal (flushed) and no
 * lane is NaN (Helium's default NaN, where the FPU keeps an operand's payload); otherwise the scalar kernel
 * computes these elements from out as it was. Returns 0 then. */
ALWAYS_INLINE int accumulate_regs(float *out, const float *p, const void *v, size_t stride, uint32_t rows, uint32_t i,
                                  size_t esize, float32x4_t (*load4)(const void *, uint32_t)) {
    enum { K = 4 };
    float32x4_t acc[K];
    flush_flags_clear();
    UNROLLED for (int k = 0; k < K; k++) acc[k] = vld1q_f32(out + i + 4 * k);
    const char *row = v;
    for (uint32_t t = 0; t < rows; t++, row += stride * esize) {
        const float pt = p[t];
        UNROLLED for (int k = 0; k < K; k++) acc[k] = vaddq_f32(acc[k], vmulq_n_f32(load4(row, i + 4 * k), pt));
    }
    mve_pred16_t numbers = 0xFFFF;
    UNROLLED for (int k = 0; k < K; k++) numbers &= vcmpeqq_f32(acc[k], acc[k]);
    if (flushed((float)numbers) || numbers != 0xFFFF) return 0; /* numbers: made of every sum, so read after them */
    UNROLLED for (int k = 0; k < K; k++) vst1q_f32(out + i + 4 * k, acc[k]);
    return 1;
}

/* Elements [i, i + len) by the scalar kernel of the dtype of esize bytes. */
ALWAYS_INLINE void accumulate_scalar(float *out, const float *p, const void *v, size_t stride, uint32_t rows, uint32_t i,
                                     uint32_t len, size_t esize) {
    if (esize == sizeof(float)) accumulate_f32_scalar(out + i, p, (const float *)v + i, stride, rows, len);
    else accumulate_f16_scalar(out + i, p, (const uint16_t *)v + i, stride, rows, len);
}
/* Groups of 16 elements (a head's size is a multiple of 16 in every model here); the last n % 16, and any group
 * accumulate_regs declined, by the scalar kernel. */
ALWAYS_INLINE void accumulate_groups(float *out, const float *p, const void *v, size_t stride, uint32_t rows, uint32_t n,
                                     size_t esize, float32x4_t (*load4)(const void *, uint32_t)) {
    uint32_t i = 0;
    for (; i + 16 <= n; i += 16)
        if (!accumulate_regs(out, p, v, stride, rows, i, esize, load4)) accumulate_scalar(out, p, v, stride, rows, i, 16, esize);
    if (i < n) accumulate_scalar(out, p, v, stride, rows, i, n - i, esize);
}
static void accumulate_f32_mve(float *out, const float *p, const float *v, size_t stride, uint32_t rows, uint32_t n) {
    accumulate_groups(out, p, v, stride, rows, n, sizeof *v, load4_f32);
}
static void accumulate_f16_mve(float *out, const float *p, const uint16_t *v, size_t stride, uint32_t rows, uint32_t n) {
    accumulate_groups(out, p, v, stride, rows, n, sizeof *v, load4_f16);
}

/* The largest |v[i]| of a block as the scalar one finds it: the unsigned maximum (VMAXV) of the bit patterns
 * with the sign cleared, so a NaN or an infinity wins; lanes past len are loaded as +0. */
static float amax_mve(const float *v, uint32_t len) {
    uint32_t amax = 0;
    for (uint32_t i = 0; i < len; i += 4)
        amax = vmaxvq_u32(amax, vandq_u32(vreinterpretq_u32_f32(vldrwq_z_f32(v + i, vctp32q(len - i))), vdupq_n_u32(0x7FFFFFFFu)));
    return f32_from_bits(amax);
}

/* quantize_one four lanes at a time: clamped by VMAXNM/VMINNM (which turn NaN into -127, so NaN lanes
 * are set to 0 after), rounded by the same 1.5 * 2^23 addition, narrowed by a byte store. Lanes past len
 * load +0, which quantizes to 0. */
static int32_t round_mve(int8_t *q, const float *v, uint32_t len, float inv) {
    int32_t total = 0;
    for (uint32_t i = 0; i < QBLOCK; i += 4) {
        const float32x4_t y = vmulq_n_f32(vldrwq_z_f32(v + i, vctp32q(len > i ? len - i : 0)), inv);
        float32x4_t c = vminnmq_f32(vmaxnmq_f32(y, vdupq_n_f32(-127.0f)), vdupq_n_f32(127.0f));
        c = vpselq_f32(c, vdupq_n_f32(0.0f), vcmpeqq_f32(y, y));
        const int32x4_t r = vcvtq_s32_f32(vsubq_n_f32(vaddq_n_f32(c, 12582912.0f), 12582912.0f));
        vstrbq_s32(q + i, r);
        total = vaddvaq_s32(total, r);
    }
    return total;
}

static void quantize_q8_0_mve(int8_t *xq, float *scale, int32_t *sum, const float *x, uint32_t n) {
    flush_flags_clear();
    quantize_blocks(xq, scale, sum, x, n, amax_mve, round_mve);
    if (flushed(0.0f)) quantize_q8_0_scalar(xq, scale, sum, x, n); /* the results are in memory: the read's clobber orders them */
}

/* colibri_expf of four lanes of x in [-87, 88], where its 2^n needs one step (n in [-126, 127]): the same
 * operations in the same order, each rounded on its own, n by truncation as the C cast. */
static float32x4_t expf4_mve(float32x4_t x) {
    const float32x4_t fn = vmulq_n_f32(x, 1.44269502162933349609f);
    const float32x4_t half = vpselq_f32(vdupq_n_f32(0.5f), vdupq_n_f32(-0.5f), vcmpgeq_n_f32(fn, 0.0f));
    const int32x4_t n = vcvtq_s32_f32(vaddq_f32(fn, half));
    const float32x4_t nf = vcvtq_f32_s32(n);
    const float32x4_t r = vsubq_f32(vsubq_f32(x, vmulq_n_f32(nf, 0.693145751953125f)),
                                    vmulq_n_f32(nf, 1.42860682030941723212e-06f));
    float32x4_t p = vmulq_n_f32(r, 1.0f / 5040);
    p = vmulq_f32(r, vaddq_n_f32(p, 1.0f / 720));
    p = vmulq_f32(r, vaddq_n_f32(p, 1.0f / 120));
    p = vmulq_f32(r, vaddq_n_f32(p, 1.0f / 24));
    p = vmulq_f32(r, vaddq_n_f32(p, 1.0f / 6));
    p = vmulq_f32(r, vaddq_n_f32(p, 0.5f));
    p = vmulq_f32(r, vaddq_n_f32(p, 1.0f));
    p = vaddq_n_f32(p, 1.0f);
    return vmulq_f32(p, vreinterpretq_f32_s32(vshlq_n_s32(vaddq_n_s32(n, 127), 23)));
}

/* e^-g four lanes at a time by Helium, the division and the product by the FPU as swiglu_scalar does (Helium
 * has no vector division). Lanes outside expf4_mve's range (or NaN) take colibri_expf. Within it a flush
 * cannot change a bit: e^x there is at least e^-87, far above the subnormals, r is 0 or at least 2^-37
 * unless x itself is below 2^-126, and then (as for any tiny r) 1 + r * (...) rounds to 1 either way. */
static void swiglu_mve(float *g, const float *u, uint32_t n) {
    uint32_t i = 0;
    for (; i + 4 <= n; i += 4) {
        float e[4];
        const float32x4_t x = vnegq_f32(vld1q_f32(g + i));
        vst1q_f32(e, expf4_mve(x));
        if (vcmpgeq_m_n_f32(x, -87.0f, vcmpleq_n_f32(x, 88.0f)) != 0xFFFFu)
            for (uint32_t k = 0; k < 4; k++) e[k] = colibri_expf(-g[i + k]);
        for (uint32_t k = 0; k < 4; k++) g[i + k] = g[i + k] / (1.0f + e[k]) * u[i + k];
    }
    swiglu_scalar(g + i, u + i, n - i);
}

#if WITH_BLOCK_DTYPES
/* ---- The block dtypes (docs/KERNELS.md "The block dtypes"), as kernels_block.c's rows compute them. A dtype's part
 * fills 8 blocks' terms at a time: each block's integer sum by VMLADAV over its 32 values unpacked into two registers of
 * bytes (exact), and its factors a and c. The float steps are shared: blocks 8 s + j into lane j, t = (float)isum *
 * (a * x_d), t = t + (float)x_sum * (c * x_d), acc += t lane by lane in two 4-lane registers (the scalar kernel's
 * operations in its order), then the fixed tree. A call whose Helium float work met a subnormal (flushed: FPSCR's IDC,
 * UFC) or gave a NaN (the default NaN) returns the scalar rows' bits instead: rare (a factor is exact, never subnormal
 * but for MXFP4's 2^-128 and 2^-127). ---- */

/* GGUF's fields may sit at any byte (MXFP4's blocks are 17 bytes): unaligned LDRH/LDR, which the M55 allows. */
static uint32_t le32_at(const uint8_t *p) {
    uint32_t v;
    return __builtin_memcpy(&v, p, 4), v;
}
static float f16_le(const uint8_t *p) {
    uint16_t v;
    return __builtin_memcpy(&v, p, 2), f16_to_f32(v);
}

/* The exact sum of 32 products: values q0 (elements 0..15) and q1 (16..31), each below 128 in size, times x's. */
static int32_t isum16x2(uint8x16_t q0, uint8x16_t q1, const int8_t *xq) {
    return vmladavaq_s8(vmladavq_s8(vreinterpretq_s8_u8(q0), vld1q_s8(xq)), vreinterpretq_s8_u8(q1), vld1q_s8(xq + 16));
}

/* Up to 8 consecutive blocks' integer sums and factors (c only for the dtypes with an offset). */
typedef struct { int32_t isum[8]; float a[8], c[8]; } terms8;
/* A dtype's part: the n (<= 8) blocks at w times x's values xq (and sums xsum) into t; returns the address after them. */
typedef const uint8_t *(*fill8_fn)(const uint8_t *w, uint32_t n, const int8_t *xq, const int32_t *xsum, terms8 *t);

/* Four lanes' float steps. */
ALWAYS_INLINE float32x4_t add_terms4(float32x4_t acc, const terms8 *t, uint32_t j, const float *xd, const int32_t *xsum,
                                     int offset) {
    const float32x4_t d = vld1q_f32(xd);
    float32x4_t s = vmulq_f32(vcvtq_f32_s32(vld1q_s32(t->isum + j)), vmulq_f32(vld1q_f32(t->a + j), d));
    if (offset) s = vaddq_f32(s, vmulq_f32(vcvtq_f32_s32(vld1q_s32(xsum)), vmulq_f32(vld1q_f32(t->c + j), d)));
    return vaddq_f32(acc, s);
}

/* Every block dtype's rows: `fill` the dtype's part, `offset` whether it has c (format.h's dtype_has_offset), `scalar`
 * its scalar rows. A row's last blocks, fewer than 8, add their terms to their lanes on the FPU after the others. */
__attribute__((noinline)) static void rows_terms8(const uint8_t *w, const q8_vector *x, uint32_t blocks, uint32_t rows,
                                                  float *out, fill8_fn fill, int offset, rows_block_fn scalar) {
    const q8_vector xv = *x;
    const uint8_t *const w0 = w;
    flush_flags_clear();
    for (uint32_t r = 0; r < rows; r++) {
        float32x4_t acc0 = vdupq_n_f32(0.0f), acc1 = acc0;
        terms8 t;
        uint32_t b = 0;
        for (; b + 8 <= blocks; b += 8) {
            w = fill(w, 8, xv.q + (size_t)b * QBLOCK, xv.sum + b, &t);
            acc0 = add_terms4(acc0, &t, 0, xv.scale + b, xv.sum + b, offset);
            acc1 = add_terms4(acc1, &t, 4, xv.scale + b + 4, xv.sum + b + 4, offset);
        }
        float acc[8];
        vst1q_f32(acc, acc0);
        vst1q_f32(acc + 4, acc1);
        if (b < blocks) {
            w = fill(w, blocks - b, xv.q + (size_t)b * QBLOCK, xv.sum + b, &t);
            for (uint32_t j = 0; b + j < blocks; j++) {
                float s = (float)t.isum[j] * (t.a[j] * xv.scale[b + j]);
                if (offset) s = s + (float)xv.sum[b + j] * (t.c[j] * xv.scale[b + j]);
                acc[j] += s;
            }
        }
        out[r] = sum_lanes8(acc);
    }
    int differ = flushed(0.0f); /* the results are in memory: the read's clobber orders them */
    for (uint32_t r = 0; r < rows; r++) differ |= out[r] != out[r];
    if (differ) scalar(w0, x, blocks, rows, out);
}

/* Q4_1 {f16 d, m; u8 qs[16]}, Q5_0 {f16 d; u8 qh[4]; u8 qs[16]}, Q5_1 {f16 d, m; u8 qh[4]; u8 qs[16]}: elements 0..15 in
 * the low nibbles of qs, 16..31 in the high ones; Q5's bit 4 of element i is bit i of qh, added in the lanes a predicate
 * made of qh selects (a bit per byte lane); Q5_0's 5 bits - 16: the sum of q x less 16 times x's block sum. */
ALWAYS_INLINE const uint8_t *fill_q4_1_q5(const uint8_t *w, uint32_t n, const int8_t *xq, const int32_t *xsum, terms8 *t,
                                          uint32_t dtype, uint32_t bytes) {
    const uint8x16_t nib = vdupq_n_u8(15);
    for (uint32_t j = 0; j < n; j++, w += bytes, xq += QBLOCK) {
        const uint32_t qh = dtype == DTYPE_Q4_1 ? 0u : le32_at(w + bytes - 20u); /* qh[4] before qs[16] */
        const uint8x16_t qs = vld1q_u8(w + bytes - 16u), lo = vandq_u8(qs, nib), hi = vshrq_n_u8(qs, 4);
        t->isum[j] = isum16x2(vaddq_m_n_u8(lo, lo, 16, (mve_pred16_t)qh), vaddq_m_n_u8(hi, hi, 16, (mve_pred16_t)(qh >> 16)), xq);
        t->a[j] = f16_le(w);
        if (dtype == DTYPE_Q5_0) t->isum[j] -= 16 * xsum[j];
        if (dtype_has_offset(dtype)) t->c[j] = f16_le(w + 2);
    }
    return w;
}
#define FILL_Q4_1_Q5(name, NAME)                                                                                       \
    static const uint8_t *fill_##name(const uint8_t *w, uint32_t n, const int8_t *xq, const int32_t *xsum, terms8 *t) { \
        return fill_q4_1_q5(w, n, xq, xsum, t, DTYPE_##NAME, DTYPE_BYTES_##NAME);                                       \
    }
FILL_Q4_1_Q5(q4_1, Q4_1)
FILL_Q4_1_Q5(q5_0, Q5_0)
FILL_Q4_1_Q5(q5_1, Q5_1)

/* MXFP4 {u8 e; u8 qs[16]}: the nibbles' values (twice E2M1's) by a byte gather from the table, times 2^(e - 128). */
static const int8_t MXFP4_TWICE[16] = { 0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12 };
static const uint8_t *fill_mxfp4(const uint8_t *w, uint32_t n, const int8_t *xq, const int32_t *xsum, terms8 *t) {
    (void)xsum;
    const uint8x16_t nib = vdupq_n_u8(15);
    for (uint32_t j = 0; j < n; j++, w += DTYPE_BYTES_MXFP4, xq += QBLOCK) {
        const uint8x16_t qs = vld1q_u8(w + 1);
        const int8x16_t q0 = vldrbq_gather_offset_s8(MXFP4_TWICE, vandq_u8(qs, nib));
        const int8x16_t q1 = vldrbq_gather_offset_s8(MXFP4_TWICE, vshrq_n_u8(qs, 4));
        const uint32_t e = w[0];
        t->isum[j] = vmladavaq_s8(vmladavq_s8(q0, vld1q_s8(xq)), q1, vld1q_s8(xq + 16));
        t->a[j] = f32_from_bits(e < 2u ? 0x00200000u << e : (e - 1u) << 23);
    }
    return w;
}

/* Q4_K {f16 d, dmin; u8 scales[12]; u8 qs[128]} and Q5_K {f16 d, dmin; u8 scales[12]; u8 qh[32]; u8 qs[128]}: sub-block
 * j (x block 8 s + j) holds the low (j even) or high (j odd) nibbles of qs[32 (j / 2) ..], and for Q5_K bit 4 of its
 * element l in bit j of qh[l]; its factors d sc and -(dmin m) (exact, four at a time) with the 6-bit scale and min of
 * llama.cpp's get_scale_min_k4, also four at a time: scm[j] the scales, scm[8 + j] the mins. */
ALWAYS_INLINE const uint8_t *fill_k4(const uint8_t *w, const int8_t *xq, terms8 *t, int five) {
    const uint32_t w0 = le32_at(w + 4), w1 = le32_at(w + 8), w2 = le32_at(w + 12);
    const uint32_t scm[4] = { w0 & 0x3F3F3F3Fu, (w2 & 0x0F0F0F0Fu) | (w0 >> 2 & 0x30303030u), w1 & 0x3F3F3F3Fu,
                              (w2 >> 4 & 0x0F0F0F0Fu) | (w1 >> 2 & 0x30303030u) };
    const uint8_t *sc = (const uint8_t *)scm;
    const float d = f16_le(w), dmin = f16_le(w + 2);
    vst1q_f32(t->a, vmulq_n_f32(vcvtq_f32_u32(vldrbq_u32(sc)), d));
    vst1q_f32(t->a + 4, vmulq_n_f32(vcvtq_f32_u32(vldrbq_u32(sc + 4)), d));
    vst1q_f32(t->c, vnegq_f32(vmulq_n_f32(vcvtq_f32_u32(vldrbq_u32(sc + 8)), dmin)));
    vst1q_f32(t->c + 4, vnegq_f32(vmulq_n_f32(vcvtq_f32_u32(vldrbq_u32(sc + 12)), dmin)));
    const uint8x16_t nib = vdupq_n_u8(15), bit4 = vdupq_n_u8(16);
    uint8x16_t h0 = vdupq_n_u8(0), h1 = h0;
    if (five) h0 = vld1q_u8(w + 16), h1 = vld1q_u8(w + 32);
    const uint8_t *qs = w + (five ? 48 : 16);
    for (uint32_t j = 0; j < 8; j += 2, qs += 32, xq += 2 * QBLOCK) {
        const uint8x16_t q0 = vld1q_u8(qs), q1 = vld1q_u8(qs + 16);
        uint8x16_t l0 = vandq_u8(q0, nib), l1 = vandq_u8(q1, nib), u0 = vshrq_n_u8(q0, 4), u1 = vshrq_n_u8(q1, 4);
        if (five) { /* bits j and j + 1 of qh, then the next two */
            l0 = vorrq_u8(l0, vandq_u8(vshlq_n_u8(h0, 4), bit4));
            l1 = vorrq_u8(l1, vandq_u8(vshlq_n_u8(h1, 4), bit4));
            u0 = vorrq_u8(u0, vandq_u8(vshlq_n_u8(h0, 3), bit4));
            u1 = vorrq_u8(u1, vandq_u8(vshlq_n_u8(h1, 3), bit4));
            h0 = vshrq_n_u8(h0, 2), h1 = vshrq_n_u8(h1, 2);
        }
        t->isum[j] = isum16x2(l0, l1, xq);
        t->isum[j + 1] = isum16x2(u0, u1, xq + QBLOCK);
    }
    return qs;
}
static const uint8_t *fill_q4_k(const uint8_t *w, uint32_t n, const int8_t *xq, const int32_t *xsum, terms8 *t) {
    return (void)n, (void)xsum, fill_k4(w, xq, t, 0);
}
static const uint8_t *fill_q5_k(const uint8_t *w, uint32_t n, const int8_t *xq, const int32_t *xsum, terms8 *t) {
    return (void)n, (void)xsum, fill_k4(w, xq, t, 1);
}

/* Q6_K: {u8 ql[128]; u8 qh[64]; i8 scales[16]; f16 d}: sub-block j = 4 n + k has the low 4 bits of its values in
 * ql[64 n + 32 (k & 1) ..] (the high nibbles for k >= 2) and their top 2 in bits 2 k, 2 k + 1 of qh[32 n ..]; each 16
 * values' sum of (6 bits - 32) x times the 16's scale (|isum| <= 32 x 4096 x 127, below 2^24); the factor is d. */
/* One sub-block of Q6_K: its nibbles lo0, lo1 (elements 0..15, 16..31), its top 2 bits hi0, hi1 (at bits 4, 5). */
ALWAYS_INLINE int32_t isum_q6(uint8x16_t lo0, uint8x16_t lo1, uint8x16_t hi0, uint8x16_t hi1, const int8_t *scales,
                              const int8_t *xq) {
    return scales[0] * vmladavq_s8(vsubq_n_s8(vreinterpretq_s8_u8(vorrq_u8(lo0, hi0)), 32), vld1q_s8(xq)) +
           scales[1] * vmladavq_s8(vsubq_n_s8(vreinterpretq_s8_u8(vorrq_u8(lo1, hi1)), 32), vld1q_s8(xq + 16));
}
static const uint8_t *fill_q6_k(const uint8_t *w, uint32_t n, const int8_t *xq, const int32_t *xsum, terms8 *t) {
    (void)n, (void)xsum;
    const uint8x16_t nib = vdupq_n_u8(15), top = vdupq_n_u8(0x30);
    for (uint32_t half = 0; half < 2; half++) { /* sub-blocks 4 half + k: ql[64 half ..], qh[32 half ..] */
        const uint8_t *ql = w + 64u * half, *qh = w + 128 + 32u * half;
        const int8_t *scales = (const int8_t *)(w + 192) + 8u * half, *x = xq + 4u * QBLOCK * half;
        int32_t *isum = t->isum + 4u * half;
        const uint8x16_t h0 = vld1q_u8(qh), h1 = vld1q_u8(qh + 16);
        uint8x16_t q0 = vld1q_u8(ql), q1 = vld1q_u8(ql + 16);
        isum[0] = isum_q6(vandq_u8(q0, nib), vandq_u8(q1, nib), vandq_u8(vshlq_n_u8(h0, 4), top),
                          vandq_u8(vshlq_n_u8(h1, 4), top), scales, x);
        isum[2] = isum_q6(vshrq_n_u8(q0, 4), vshrq_n_u8(q1, 4), vandq_u8(h0, top), vandq_u8(h1, top), scales + 4,
                          x + 2 * QBLOCK);
        q0 = vld1q_u8(ql + 32), q1 = vld1q_u8(ql + 48);
        isum[1] = isum_q6(vandq_u8(q0, nib), vandq_u8(q1, nib), vandq_u8(vshlq_n_u8(h0, 2), top),
                          vandq_u8(vshlq_n_u8(h1, 2), top), scales + 2, x + QBLOCK);
        isum[3] = isum_q6(vshrq_n_u8(q0, 4), vshrq_n_u8(q1, 4), vandq_u8(vshrq_n_u8(h0, 2), top),
                          vandq_u8(vshrq_n_u8(h1, 2), top), scales + 6, x + 3 * QBLOCK);
    }
    const float32x4_t d = vdupq_n_f32(f16_le(w + 208));
    vst1q_f32(t->a, d), vst1q_f32(t->a + 4, d);
    return w + DTYPE_BYTES_Q6_K;
}

#define ROWS_MVE(name, NAME)                                                                                           \
    static void rows_##name##_mve(const uint8_t *w, const q8_vector *x, uint32_t blocks, uint32_t rows, float *out) { \
        rows_terms8(w, x, blocks, rows, out, fill_##name, (int)dtype_has_offset(DTYPE_##NAME), rows_##name##_scalar);  \
    }
ROWS_MVE(q4_1, Q4_1)
ROWS_MVE(q5_0, Q5_0)
ROWS_MVE(q5_1, Q5_1)
ROWS_MVE(mxfp4, MXFP4)
ROWS_MVE(q4_k, Q4_K)
ROWS_MVE(q5_k, Q5_K)
ROWS_MVE(q6_k, Q6_K)
#define KERNELS_BLOCK_DTYPES_MVE                                                                                       \
    .rows_q4_1 = rows_q4_1_mve, .rows_q5_0 = rows_q5_0_mve, .rows_q5_1 = rows_q5_1_mve, .rows_mxfp4 = rows_mxfp4_mve,    \
    .rows_q4_k = rows_q4_k_mve, .rows_q5_k = rows_q5_k_mve, .rows_q6_k = rows_q6_k_mve
#else
#define KERNELS_BLOCK_DTYPES_MVE /* the lean build: none */
#endif

const kernel_set kernels_mve = { .name = "mve", .dot_f32 = dot_f32_mve, .dot_f16 = dot_f16_mve, .dot_bf16 = dot_bf16_mve,
                                 .rows_q8_0 = rows_q8_0_mve, .rows_q4_0 = rows_q4_0_mve,
                                 .quantize_q8_0 = quantize_q8_0_mve, .swiglu = swiglu_mve, KERNELS_SCORES(scores_f32_mve, scores_f16_mve, softmax)
                                 KERNELS_ACCUMULATE(accumulate_f32_mve, accumulate_f16_mve) KERNELS_BLOCK_DTYPES_MVE };
#endif
