/* Cortex-M4 kernels: the DSP extension's dual 16-bit MACs (SMLAD) for the quantized dtypes. A word
 * of four int8 values becomes two halfword pairs with SXTB16 (bytes 0 and 2, and rotated by 8,
 * bytes 1 and 3); SMLAD multiplies and accumulates both pairs. Integer sums are exact in any
 * order, so these match the scalar kernels bit for bit. The M4's FPU is scalar: the float dtypes
 * use the scalar kernels. */
#include "internal.h"

#if defined(__ARM_FEATURE_DSP) && !defined(__ARM_FEATURE_MVE) && !defined(COLIBRI_KERNELS_SCALAR)
#include <arm_acle.h>

static uint32_t load_word(const void *p) {
    uint32_t v;
    __builtin_memcpy(&v, p, 4); /* blocks are 16-byte aligned: one LDR */
    return v;
}

static uint32_t ror8(uint32_t v) { return v >> 8 | v << 24; }

/* acc + the four products of the int8 lanes of a and b */
__attribute__((noinline)) static int32_t mac4(int32_t acc, uint32_t a, uint32_t b) {
    acc = __smlad(__sxtb16(a), __sxtb16(b), acc);
    return __smlad(__sxtb16(ror8(a)), __sxtb16(ror8(b)), acc);
}

static int32_t isum_q8_0_dsp(const void *w_row, const int8_t *xq, uint32_t b) {
    const int8_t *w = (const int8_t *)w_row + (size_t)b * QBLOCK;
    xq += (size_t)b * QBLOCK;
    int32_t isum = 0;
    for (uint32_t i = 0; i < QBLOCK; i += 4) isum = mac4(isum, load_word(w + i), load_word(xq + i));
    return isum;
}

static int32_t isum_q4_0_dsp(const void *w_row, const int8_t *xq, uint32_t b) {
    const uint8_t *w = (const uint8_t *)w_row + (size_t)b * (QBLOCK / 2);
    xq += (size_t)b * QBLOCK;
    int32_t isum = 0;
    for (uint32_t j = 0; j < QBLOCK / 2; j += 4) {
        uint32_t q = load_word(w + j);
        /* nibble - 8 in each byte (SSUB8 works per byte: no borrow crosses into the next) */
        uint32_t lo = __ssub8(q & 0x0F0F0F0Fu, 0x08080808u), hi = __ssub8((q >> 4) & 0x0F0F0F0Fu, 0x08080808u);
        isum = mac4(isum, lo, load_word(xq + j));
        isum = mac4(isum, hi, load_word(xq + j + QBLOCK / 2));
    }
    return isum;
}

static float dot_q8_0_dsp(const void *w, const uint16_t *w_scale, const q8_vector *x, uint32_t blocks) {
    return dot_blocks(w, w_scale, x, blocks, isum_q8_0_dsp);
}
static float dot_q4_0_dsp(const void *w, const uint16_t *w_scale, const q8_vector *x, uint32_t blocks) {
    return dot_blocks(w, w_scale, x, blocks, isum_q4_0_dsp);
}

static void rows_q8_0_dsp(const int8_t *w, const uint16_t *w_scale, const q8_vector *x, uint32_t blocks, uint32_t rows,
                          float *out) {
    dot_rows(w, w_scale, x, blocks, rows, (size_t)blocks * QBLOCK, out, dot_q8_0_dsp);
}
static void rows_q4_0_dsp(const uint8_t *w, const uint16_t *w_scale, const q8_vector *x, uint32_t blocks, uint32_t rows,
                          float *out) {
    dot_rows(w, w_scale, x, blocks, rows, (size_t)blocks * (QBLOCK / 2), out, dot_q4_0_dsp);
}

#if WITH_BLOCK_DTYPES
/* ---- The block dtypes (docs/KERNELS.md "The block dtypes"), as kernels_block.c's rows compute them: per block its
 * integer sum, its 32 values built four to a word (element order) and multiplied with x's words by SXTB16 + SMLAD as
 * they are made (exact), and its factors a and c; then the float steps on the FPU in the scalar order. */
typedef struct {
    int32_t isum[8];
    float a[8], c[8];
} terms8;

/* An f16 widened by the FPU's VCVTB.F32.F16 (exact, as f16_to_f32; a signalling NaN comes out quiet, which no
 * product of it can tell). */
static float f16_le(const uint8_t *p) {
    float f;
    __asm__("vmov %0, %1\n\tvcvtb.f32.f16 %0, %0" : "=t"(f) : "r"((uint32_t)(p[0] | p[1] << 8)));
    return f;
}

/* acc + the four products of the int8 lanes of a and b, as mac4 (SXTB16's rotation folded in), inline: each loop
 * multiplies its words as it makes them. */
ALWAYS_INLINE int32_t mac4_ror(int32_t acc, uint32_t a, uint32_t b) {
    uint32_t a13, b13;
    __asm__("sxtb16 %0, %1, ror #8" : "=r"(a13) : "r"(a));
    __asm__("sxtb16 %0, %1, ror #8" : "=r"(b13) : "r"(b));
    return __smlad(a13, b13, __smlad(__sxtb16(a), __sxtb16(b), acc));
}

/* Q4_K {f16 d, dmin; u8 scales[12]; u8 qs[128]}, Q5_K {f16 d, dmin; u8 scales[12]; u8 qh[32]; u8 qs[128]}: sub-block j the
 * low (j even) or high nibbles of qs[32 (j / 2) ..], Q5_K's bit 4 of element l in bit j of qh[l]; factors d sc and
 * -(dmin m) with the 6-bit scale and min of llama.cpp's get_scale_min_k4, four at a time: scm[j] the scales, scm[8 + j]
 * the mins. */
static const uint8_t *terms_k4(const uint8_t *w, const int8_t *xq, terms8 *t, uint32_t five) {
    const uint32_t w0 = load_word(w + 4), w1 = load_word(w + 8), w2 = load_word(w + 12);
    const uint32_t scm[4] = { w0 & 0x3F3F3F3Fu, (w2 & 0x0F0F0F0Fu) | (w0 >> 2 & 0x30303030u), w1 & 0x3F3F3F3Fu,
                              (w2 >> 4 & 0x0F0F0F0Fu) | (w1 >> 2 & 0x30303030u) };
    const uint8_t *sc = (const uint8_t *)scm, *qs = w + 16 + 32u * five;
    const float d = f16_le(w), dmin = f16_le(w + 2);
    for (uint32_t j = 0; j < 8; j += 2, qs += 32, xq += 2 * QBLOCK) { /* sub-blocks j and j + 1: the same bytes */
        int32_t lo = 0, hi = 0;
        for (uint32_t i = 0; i < 8; i++) {
            const uint32_t v = load_word(qs + 4 * i), h = five ? load_word(w + 16 + 4 * i) >> j : 0u;
            lo = mac4_ror(lo, (v & 0x0F0F0F0Fu) | (h & 0x01010101u) << 4, load_word(xq + 4 * i));
            hi = mac4_ror(hi, (v >> 4 & 0x0F0F0F0Fu) | (h & 0x02020202u) << 3, load_word(xq + QBLOCK + 4 * i));
        }
        t->isum[j] = lo;
        t->isum[j + 1] = hi;
    }
    for (uint32_t j = 0; j < 8; j++) {
        t->a[j] = d * (float)sc[j];
        t->c[j] = -(dmin * (float)sc[8 + j]);
    }
    return qs;
}

/* Q6_K {u8 ql[128]; u8 qh[64]; i8 scales[16]; f16 d}: sub-block j = 4 n + k's low 4 bits in ql[64 n + 32 (k & 1) ..]
 * (high nibbles for k >= 2), its top 2 in bits 2 k, 2 k + 1 of qh[32 n ..]; values 6 bits - 32 (SSUB8: per byte, no
 * borrow crosses), each 16's sum times its scale; the factor is d. */
static const uint8_t *terms_q6_k(const uint8_t *w, const int8_t *xq, terms8 *t) {
    const float d = f16_le(w + 208);
    for (uint32_t j = 0; j < 8; j++) {
        const uint32_t half = j / 4u, k = j % 4u, down = k < 2u ? 0u : 4u;
        const uint8_t *ql = w + 64u * half + 32u * (k & 1u), *qh = w + 128 + 32u * half;
        int32_t isum = 0;
        for (uint32_t h = 0; h < 2; h++) {
            int32_t s = 0;
            for (uint32_t i = 0; i < 4; i++, ql += 4, qh += 4, xq += 4)
                s = mac4_ror(s, __ssub8((load_word(ql) >> down & 0x0F0F0F0Fu) | (load_word(qh) >> 2u * k & 0x03030303u) << 4,
                                        0x20202020u),
                             load_word(xq));
            isum += s * (int8_t)w[192 + 2 * j + h];
        }
        t->isum[j] = isum;
        t->a[j] = d;
    }
    return w + DTYPE_BYTES_Q6_K;
}

/* ---- Q4_1 {f16 d, m; u8 qs[16]}, Q5_0 {f16 d; u8 qh[4]; u8 qs[16]}, Q5_1 {f16 d, m; u8 qh[4]; u8 qs[16]} and MXFP4
 * {u8 e; u8 qs[16]}: a block's last 16 bytes are its qs, element j < 16 the low nibble of qs[j], j + 16 the high one, and
 * Q5's bit 4 of element i is bit i of qh. One core makes their words of four values and multiplies them as the K-quants'
 * do; the dtypes differ only in the unpacking, the factor a and the offset term. */

/* Bits 0..3 of h into bit 4 of bytes 0..3: the product holds h at bits 0, 7, 14 and 21 (no two overlap: no carry). */
static uint32_t bit4_bytes(uint32_t h) { return ((h & 0xFu) * 0x00204081u & 0x01010101u) << 4; }

/* Four MXFP4 nibbles (a byte each) to twice their E2M1 values as int8 (kernels_block.c's MXFP4_VALUES): the magnitude m
 * (bits 0..2) to 0, 1, 2, 3, 4, 6, 8, 12, which is m + max(m - 4, 0) + 2 max(m - 6, 0) (UQSUB8 saturates at 0; no byte
 * exceeds 12, so the adds carry nowhere), negated where bit 3 is set: (v ^ 0xFF) - 0xFF per byte (SSUB8). */
ALWAYS_INLINE uint32_t e2m1_twice(uint32_t n) {
    const uint32_t m = n & 0x07070707u, v = m + __uqsub8(m, 0x04040404u) + (__uqsub8(m, 0x06060606u) << 1);
    const uint32_t neg = __usub8(0u, n >> 3 & 0x01010101u); /* 0xFF in the bytes to negate */
    return __ssub8(v ^ neg, neg);
}

/* The exact sum of a block's 32 values (unsigned 4 or 5 bits, or MXFP4's) times x's, a word of qs at a time: its low
 * nibbles are elements i .. i + 3, its high ones i + 16 .. i + 19 (qh shifted along: its bits 0..3 and 16..19 theirs).
 * Not inlined: alone it keeps its values in registers. */
__attribute__((noinline)) static int32_t isum_nibbles(const uint8_t *qs, uint32_t qh, const int8_t *xq, uint32_t mxfp4) {
    int32_t isum = 0;
    for (uint32_t i = 0; i < QBLOCK / 2; i += 4, qh >>= 4) {
        const uint32_t q = load_word(qs + i);
        uint32_t lo = q & 0x0F0F0F0Fu, hi = q >> 4 & 0x0F0F0F0Fu;
        if (qh) lo |= bit4_bytes(qh), hi |= bit4_bytes(qh >> 16); /* none left (Q4_1, MXFP4): nothing to add */
        if (mxfp4) lo = e2m1_twice(lo), hi = e2m1_twice(hi);
        isum = mac4_ror(mac4_ror(isum, lo, load_word(xq + i)), hi, load_word(xq + QBLOCK / 2 + i));
    }
    return isum;
}

/* The terms of a row's next n <= 8 blocks; Q5_0's values are the 5 bits - 16: the sum less 16 times x's block sum
 * (exact). */
static const uint8_t *terms_nibbles(const uint8_t *w, uint32_t n, const int8_t *xq, const int32_t *xsum, terms8 *t,
                                    uint32_t dtype) {
    const uint32_t bytes = DTYPE_TRAITS[dtype].bytes, mxfp4 = dtype == DTYPE_MXFP4;
    for (uint32_t j = 0; j < n; j++, w += bytes, xq += QBLOCK) {
        const uint8_t *qs = w + bytes - 16u;
        t->isum[j] = isum_nibbles(qs, dtype == DTYPE_Q5_0 || dtype == DTYPE_Q5_1 ? load_word(qs - 4) : 0u, xq, mxfp4) -
                     (dtype == DTYPE_Q5_0 ? 16 * xsum[j] : 0);
        const uint32_t e = w[0]; /* MXFP4's factor 2^(e - 128), kernels_block.c's e8m0_half */
        t->a[j] = mxfp4 ? f32_from_bits(e < 2u ? 0x00200000u << e : (e - 1u) << 23) : f16_le(w);
        t->c[j] = f16_le(w + 2); /* read by the dtypes with an offset only */
    }
    return w;
}

/* A block dtype's rows, 8 blocks' terms at a time (a K-quant's 256-element block; a K-quant row is whole ones, the
 * verifier's rule), then the float steps in the scalar order, block b + j into lane j. */
static void rows_block_dsp(const uint8_t *w, const q8_vector *x, uint32_t blocks, uint32_t rows, float *out,
                           uint32_t dtype) {
    const uint32_t offset = dtype_has_offset(dtype);
    const q8_vector xv = *x;
    for (float *end = out + rows; out < end; out++) {
        float acc[8];
        zero_lanes8(acc);
        for (uint32_t b = 0; b < blocks; b += 8) {
            terms8 t;
            const uint32_t n = blocks - b < 8u ? blocks - b : 8u;
            const int8_t *xq = xv.q + (size_t)b * QBLOCK;
            w = dtype == DTYPE_Q6_K   ? terms_q6_k(w, xq, &t)
                : dtype >= DTYPE_Q4_K ? terms_k4(w, xq, &t, dtype == DTYPE_Q5_K)
                                      : terms_nibbles(w, n, xq, xv.sum + b, &t, dtype);
            for (uint32_t j = 0; j < n; j++) {
                float term = (float)t.isum[j] * (t.a[j] * xv.scale[b + j]);
                if (offset) term = term + (float)xv.sum[b + j] * (t.c[j] * xv.scale[b + j]);
                acc[j] += term;
            }
        }
        *out = sum_lanes8(acc);
    }
}
#define BLOCK_ROWS(name, NAME)                                                                                         \
    static void rows_##name##_dsp(const uint8_t *w, const q8_vector *x, uint32_t blocks, uint32_t rows, float *out) { \
        rows_block_dsp(w, x, blocks, rows, out, DTYPE_##NAME);                                                         \
    }
BLOCK_ROWS(q4_1, Q4_1)
BLOCK_ROWS(q5_0, Q5_0)
BLOCK_ROWS(q5_1, Q5_1)
BLOCK_ROWS(mxfp4, MXFP4)
BLOCK_ROWS(q4_k, Q4_K)
BLOCK_ROWS(q5_k, Q5_K)
BLOCK_ROWS(q6_k, Q6_K)

#define KERNELS_BLOCK_DTYPES_DSP                                                                                       \
    .rows_q4_1 = rows_q4_1_dsp, .rows_q5_0 = rows_q5_0_dsp, .rows_q5_1 = rows_q5_1_dsp, .rows_mxfp4 = rows_mxfp4_dsp,   \
    .rows_q4_k = rows_q4_k_dsp, .rows_q5_k = rows_q5_k_dsp, .rows_q6_k = rows_q6_k_dsp
#else
#define KERNELS_BLOCK_DTYPES_DSP /* the lean build: none */
#endif

const kernel_set kernels_dsp = { .name = "dsp", .dot_f32 = dot_f32_scalar, .dot_f16 = dot_f16_scalar,
                                 .dot_bf16 = dot_bf16_scalar, .rows_q8_0 = rows_q8_0_dsp, .rows_q4_0 = rows_q4_0_dsp,
                                 .quantize_q8_0 = quantize_q8_0_scalar, .swiglu = swiglu_scalar,
                                 KERNELS_ACCUMULATE(accumulate_f32_scalar, accumulate_f16_scalar)
                                 KERNELS_SCORES(scores_f32_scalar, scores_f16_scalar, softmax) KERNELS_BLOCK_DTYPES_DSP };
#endif
