/* Scalar reference kernels. Built with -ffp-contract=off and without fast-math, so every board
 * rounds the same way and the scalar path gives bit-identical results everywhere. */
#define KERNEL_HELPERS_HERE /* the out-of-line copy of the kernel helpers under -Os (kernels.h) */
#include "internal.h"

static float from_bits(uint32_t u) {
    union { uint32_t u; float f; } v = { u };
    return v.f;
}

/* e^x without libm: x = n*ln2 + r with |r| <= ln2/2, e^r by a degree-7 Taylor polynomial,
 * then scaled by 2^n through the exponent bits. Within 2 ulp of the correctly rounded result
 * over the normal range (tests/test_kernels.py sweeps it against the C library). */
float colibri_expf(float x) {
    if (x != x) return x;
    if (x > 88.72283935546875f) return from_bits(0x7F800000u); /* +inf */
    if (x < -103.972084045410156f) return 0.0f;
    const float log2e = 1.44269502162933349609f;
    const float ln2_hi = 0.693145751953125f; /* 16 significant bits: n*ln2_hi is exact */
    const float ln2_lo = 1.42860682030941723212e-06f;
    float fn = x * log2e;
    int n = (int)(fn + (fn >= 0.0f ? 0.5f : -0.5f));
    float r = (x - (float)n * ln2_hi) - (float)n * ln2_lo;
    float p = 1.0f + r * (1.0f + r * (0.5f + r * (1.0f / 6 + r * (1.0f / 24 + r * (1.0f / 120 +
              r * (1.0f / 720 + r * (1.0f / 5040)))))));
    /* 2^n may be outside the normal exponent range; scale in two steps */
    if (n > 127) { p *= from_bits(0x7F000000u); n -= 127; }      /* 2^127 */
    if (n < -126) { p *= from_bits(0x00800000u); n += 126; }     /* 2^-126 */
    if (n < -126) return 0.0f;
    return p * from_bits((uint32_t)(n + 127) << 23);
}

static uint32_t to_bits(float f) {
    union { float f; uint32_t u; } v = { f };
    return v.u;
}

/* ---- number formats: exact conversions, no hardware f16 support assumed ---- */

uint16_t f32_to_f16(float f) {
    uint32_t x = to_bits(f), sign = (x >> 16) & 0x8000u;
    x &= 0x7FFFFFFFu;
    if (x >= 0x7F800000u) return (uint16_t)(sign | (x > 0x7F800000u ? 0x7E00u : 0x7C00u));
    if (x >= 0x477FF000u) return (uint16_t)(sign | 0x7C00u); /* >= 65520 rounds to infinity */
    uint32_t e = x >> 23, m = (x & 0x7FFFFFu) | 0x800000u, h, rem, half;
    if (e >= 113) {                  /* a normal f16: keep 10 of 23 mantissa bits */
        h = ((e - 112) << 10) | ((x >> 13) & 0x3FFu);
        rem = x & 0x1FFFu;
        half = 0x1000u;
    } else if (e >= 102) {           /* a subnormal f16: units of 2^-24 */
        uint32_t shift = 126 - e;
        h = m >> shift;
        rem = m & ((1u << shift) - 1);
        half = 1u << (shift - 1);
    } else {
        return (uint16_t)sign;       /* below 2^-25: rounds to zero */
    }
    if (rem > half || (rem == half && (h & 1u))) h++; /* ties to even; a carry lands in the exponent correctly */
    return (uint16_t)(sign | h);
}

/* ---- the fixed summation order (docs/KERNELS.md; the trees are in kernels.h) ---- */

/* Float dots: element i goes to lane i % 16 (a product rounded, then added: no FMA), then the tree. */
float dot_f32_scalar(const float *w, const float *x, uint32_t n) {
    float acc[16];
    zero_lanes8(acc);
    zero_lanes8(acc + 8);
    for (uint32_t i = 0; i < n; i++) acc[i % 16] += w[i] * x[i];
    return sum_lanes16(acc);
}

float dot_f16_scalar(const uint16_t *w, const float *x, uint32_t n) {
    float acc[16];
    zero_lanes8(acc);
    zero_lanes8(acc + 8);
    for (uint32_t i = 0; i < n; i++) acc[i % 16] += f16_to_f32(w[i]) * x[i];
    return sum_lanes16(acc);
}

float dot_bf16_scalar(const uint16_t *w, const float *x, uint32_t n) {
    float acc[16];
    zero_lanes8(acc);
    zero_lanes8(acc + 8);
    for (uint32_t i = 0; i < n; i++) acc[i % 16] += bf16_to_f32(w[i]) * x[i];
    return sum_lanes16(acc);
}

/* The exact integer dot product of one block: Q8_0 weights, or Q4_0 (GGUF's layout: byte j of a block
 * holds element j in its low nibble and element j + 16 in its high nibble, each stored as value + 8). */
static int32_t isum_q8_0(const void *w_row, const int8_t *xq, uint32_t b) {
    const int8_t *w = (const int8_t *)w_row + (size_t)b * QBLOCK;
    xq += (size_t)b * QBLOCK;
    int32_t isum = 0;
    for (uint32_t i = 0; i < QBLOCK; i++) isum += (int32_t)w[i] * xq[i];
    return isum;
}

static int32_t isum_q4_0(const void *w_row, const int8_t *xq, uint32_t b) {
    const uint8_t *w = (const uint8_t *)w_row + (size_t)b * (QBLOCK / 2);
    xq += (size_t)b * QBLOCK;
    int32_t isum = 0;
    for (uint32_t j = 0; j < QBLOCK / 2; j++)
        isum += ((int32_t)(w[j] & 0xF) - 8) * xq[j] + ((int32_t)(w[j] >> 4) - 8) * xq[j + QBLOCK / 2];
    return isum;
}

static float dot_q8_0(const void *w, const uint16_t *w_scale, const q8_vector *x, uint32_t blocks) {
    return dot_blocks(w, w_scale, x, blocks, isum_q8_0);
}
static float dot_q4_0(const void *w, const uint16_t *w_scale, const q8_vector *x, uint32_t blocks) {
    return dot_blocks(w, w_scale, x, blocks, isum_q4_0);
}

static void rows_q8_0_scalar(const int8_t *w, const uint16_t *w_scale, const q8_vector *x, uint32_t blocks, uint32_t rows,
                             float *out) {
    dot_rows(w, w_scale, x, blocks, rows, (size_t)blocks * QBLOCK, out, dot_q8_0);
}
static void rows_q4_0_scalar(const uint8_t *w, const uint16_t *w_scale, const q8_vector *x, uint32_t blocks, uint32_t rows,
                             float *out) {
    dot_rows(w, w_scale, x, blocks, rows, (size_t)blocks * (QBLOCK / 2), out, dot_q4_0);
}

/* Attention's scores as their definition reads, a dot per (head, row): the reference for every set's own */
SCORES_BY_DOTS(, scalar, dot_f32_scalar, dot_f16_scalar)

const kernel_set kernels_scalar = { .name = "scalar", .dot_f32 = dot_f32_scalar, .dot_f16 = dot_f16_scalar,
                                    .dot_bf16 = dot_bf16_scalar, .rows_q8_0 = rows_q8_0_scalar, .rows_q4_0 = rows_q4_0_scalar,
                                    .quantize_q8_0 = quantize_q8_0_scalar, .swiglu = swiglu_scalar,
                                    KERNELS_ACCUMULATE(accumulate_f32_scalar, accumulate_f16_scalar)
                                    KERNELS_SCORES(scores_f32_scalar, scores_f16_scalar, softmax)
                                    KERNELS_BLOCK_DTYPES_SCALAR };

/* v * inv as an int8: rounded to nearest, ties to even (adding 1.5 * 2^23 leaves no fraction bits).
 * Finite inputs give |v * inv| <= 127; a non-finite x (an inf or NaN that reached a matvec) must
 * still not be undefined behaviour, so the product is clamped to [-127, 127] and NaN becomes 0. */
static int8_t quantize_one(float v, float inv) {
    float q = v * inv;
    if (!(q >= -127.0f)) q = q != q ? 0.0f : -127.0f;
    if (q > 127.0f) q = 127.0f;
    return (int8_t)((q + 12582912.0f) - 12582912.0f);
}

static float block_amax(const float *v, uint32_t len) {
    uint32_t amax = 0;
    for (uint32_t i = 0; i < len; i++) {
        const uint32_t a = to_bits(v[i]) & 0x7FFFFFFFu;
        if (a > amax) amax = a;
    }
    return from_bits(amax);
}

static int32_t block_round(int8_t *q, const float *v, uint32_t len, float inv) {
    int32_t total = 0;
    for (uint32_t i = 0; i < QBLOCK; i++) {
        q[i] = i < len ? quantize_one(v[i], inv) : 0;
        total += q[i];
    }
    return total;
}

void quantize_q8_0_scalar(int8_t *xq, float *scale, int32_t *sum, const float *x, uint32_t n) {
    quantize_blocks(xq, scale, sum, x, n, block_amax, block_round);
}

void swiglu_scalar(float *g, const float *u, uint32_t n) {
    for (uint32_t i = 0; i < n; i++) g[i] = g[i] / (1.0f + colibri_expf(-g[i])) * u[i];
}

/* Row by row, as the kernel's definition reads (kernels.h); the sets' own versions take many elements at once. */
void accumulate_f32_scalar(float *out, const float *p, const float *v, size_t stride, uint32_t rows, uint32_t n) {
    for (uint32_t i = 0; i < n; i++) {
        float sum = out[i];
        for (uint32_t t = 0; t < rows; t++) sum += p[t] * v[t * stride + i];
        out[i] = sum;
    }
}

void accumulate_f16_scalar(float *out, const float *p, const uint16_t *v, size_t stride, uint32_t rows, uint32_t n) {
    for (uint32_t i = 0; i < n; i++) {
        float sum = out[i];
        for (uint32_t t = 0; t < rows; t++) sum += p[t] * f16_to_f32(v[t * stride + i]);
        out[i] = sum;
    }
}

void weight_row(float *out, const weight *w, uint32_t row) {
    if (WITH_BLOCK_DTYPES && !DTYPE_TRAITS[w->dtype].scale_bytes && DTYPE_TRAITS[w->dtype].block > 1u) {
        weight_row_block(out, w, row);
        return;
    }
    const uint32_t n = w->cols;
    switch (w->dtype) {
    case DTYPE_F32: {
        const float *p = (const float *)w->data + (size_t)row * n;
        for (uint32_t i = 0; i < n; i++) out[i] = p[i];
        break;
    }
    case DTYPE_F16: case DTYPE_BF16: {
        const uint16_t *p = (const uint16_t *)w->data + (size_t)row * n;
        for (uint32_t i = 0; i < n; i++) out[i] = w->dtype == DTYPE_F16 ? f16_to_f32(p[i]) : bf16_to_f32(p[i]);
        break;
    }
    case DTYPE_Q8_0: {
        const int8_t *p = (const int8_t *)w->data + (size_t)row * w->blocks * QBLOCK;
        const uint16_t *s = w->scales + (size_t)row * w->blocks;
        for (uint32_t i = 0; i < n; i++) out[i] = (float)p[i] * f16_to_f32(s[i / QBLOCK]);
        break;
    }
    default: { /* DTYPE_Q4_0 */
        const uint8_t *p = (const uint8_t *)w->data + (size_t)row * w->blocks * (QBLOCK / 2);
        const uint16_t *s = w->scales + (size_t)row * w->blocks;
        for (uint32_t i = 0; i < n; i++) {
            uint32_t b = i / QBLOCK, j = i % QBLOCK;
            uint8_t byte = p[b * (QBLOCK / 2) + j % (QBLOCK / 2)];
            int32_t q = (int32_t)(j < QBLOCK / 2 ? byte & 0xF : byte >> 4) - 8;
            out[i] = (float)q * f16_to_f32(s[b]);
        }
        break;
    }
    }
}

const kernel_set *kernels_select(void) {
#if defined(COLIBRI_KERNELS_SCALAR)
    return &kernels_scalar;
#elif defined(COLIBRI_X86_SIMD)
    return kernels_x86_select();
#elif defined(__ARM_FEATURE_MVE)
    return &kernels_mve;
#elif defined(__ARM_FEATURE_DSP)
    return &kernels_dsp;
#elif defined(__riscv_vector)
    return &kernels_rvv;
#else
    return &kernels_scalar;
#endif
}

void rmsnorm(float *out, const float *x, const float *w, uint32_t n, float eps) {
    float ss = 0.0f;
    for (uint32_t i = 0; i < n; i++) ss += x[i] * x[i];
    float scale = 1.0f / SQRTF(ss / (float)n + eps);
    for (uint32_t i = 0; i < n; i++) out[i] = WITH_GEMMA4 && !w ? x[i] * scale : (x[i] * scale) * w[i];
}

void softmax(float *x, uint32_t n, const float *sink) {
    if (!WITH_SINKS) sink = 0;
    float max = x[0];
    for (uint32_t i = 1; i < n; i++)
        if (x[i] > max) max = x[i];
    if (sink && *sink > max) max = *sink;
    float sum = 0.0f;
    for (uint32_t i = 0; i < n; i++) {
        x[i] = colibri_expf(x[i] - max);
        sum += x[i];
    }
    if (sink) sum += colibri_expf(*sink - max); /* after the positions, as transformers concatenates it */
    for (uint32_t i = 0; i < n; i++) x[i] /= sum;
}
