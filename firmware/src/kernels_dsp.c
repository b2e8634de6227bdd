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
/* ---- The K-quants (docs/KERNELS.md "The block dtypes"), as kernels_block.c's rows compute them: per 256-element block
 * the 8 sub-blocks' integer sums, their 32 values built four to a word (element order) and multiplied with x's words
 * by SXTB16 + SMLAD as they are made (exact), and their factors a and c; then the float steps on the FPU in the scalar
 * order (sub-block j into lane j). Q4_1, Q5_0, Q5_1 and MXFP4 keep the scalar rows: the M4 build is size-gated. */
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

/* A K-quant's rows (dtype Q4_K, Q5_K or Q6_K); a row is whole 256-element blocks (the verifier's rule). */
static void rows_k_dsp(const uint8_t *w, const q8_vector *x, uint32_t blocks, uint32_t rows, float *out, uint32_t dtype) {
    const uint32_t offset = dtype_has_offset(dtype);
    const q8_vector xv = *x;
    for (float *end = out + rows; out < end; out++) {
        float acc[8];
        zero_lanes8(acc);
        for (uint32_t b = 0; b < blocks; b += 8) {
            terms8 t;
            const int8_t *xq = xv.q + (size_t)b * QBLOCK;
            w = dtype == DTYPE_Q6_K ? terms_q6_k(w, xq, &t) : terms_k4(w, xq, &t, dtype == DTYPE_Q5_K);
            for (uint32_t j = 0; j < 8; j++) {
                float term = (float)t.isum[j] * (t.a[j] * xv.scale[b + j]);
                if (offset) term = term + (float)xv.sum[b + j] * (t.c[j] * xv.scale[b + j]);
                acc[j] += term;
            }
        }
        *out = sum_lanes8(acc);
    }
}
static void rows_q4_k_dsp(const uint8_t *w, const q8_vector *x, uint32_t blocks, uint32_t rows, float *out) {
    rows_k_dsp(w, x, blocks, rows, out, DTYPE_Q4_K);
}
static void rows_q5_k_dsp(const uint8_t *w, const q8_vector *x, uint32_t blocks, uint32_t rows, float *out) {
    rows_k_dsp(w, x, blocks, rows, out, DTYPE_Q5_K);
}
static void rows_q6_k_dsp(const uint8_t *w, const q8_vector *x, uint32_t blocks, uint32_t rows, float *out) {
    rows_k_dsp(w, x, blocks, rows, out, DTYPE_Q6_K);
}
#define KERNELS_BLOCK_DTYPES_DSP                                                                                       \
    .rows_q4_1 = rows_q4_1_scalar, .rows_q5_0 = rows_q5_0_scalar, .rows_q5_1 = rows_q5_1_scalar,                         \
    .rows_mxfp4 = rows_mxfp4_scalar, .rows_q4_k = rows_q4_k_dsp, .rows_q5_k = rows_q5_k_dsp, .rows_q6_k = rows_q6_k_dsp
#else
#define KERNELS_BLOCK_DTYPES_DSP /* the lean build: none */
#endif

const kernel_set kernels_dsp = { .name = "dsp", .dot_f32 = dot_f32_scalar, .dot_f16 = dot_f16_scalar,
                                 .dot_bf16 = dot_bf16_scalar, .rows_q8_0 = rows_q8_0_dsp, .rows_q4_0 = rows_q4_0_dsp,
                                 .quantize_q8_0 = quantize_q8_0_scalar, .swiglu = swiglu_scalar,
                                 KERNELS_ACCUMULATE(accumulate_f32_scalar, accumulate_f16_scalar)
                                 KERNELS_SCORES(scores_f32_scalar, scores_f16_scalar, softmax) KERNELS_BLOCK_DTYPES_DSP };
#endif
