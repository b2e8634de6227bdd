/* Scalar reference kernels. Built with -ffp-contract=off and without fast-math, so every board
 * rounds the same way and the scalar path gives bit-identical results everywhere. */
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

/* Sequential sum, one accumulator: the reference summation order. */
float dot(const float *a, const float *b, uint32_t n) {
    float acc = 0.0f;
    for (uint32_t i = 0; i < n; i++) acc += a[i] * b[i];
    return acc;
}

/* out[rows] = w[rows][cols] . x[cols] */
void matvec(float *out, const float *w, const float *x, uint32_t rows, uint32_t cols) {
    for (uint32_t r = 0; r < rows; r++) out[r] = dot(w + (size_t)r * cols, x, cols);
}

void rmsnorm(float *out, const float *x, const float *w, uint32_t n, float eps) {
    float ss = 0.0f;
    for (uint32_t i = 0; i < n; i++) ss += x[i] * x[i];
    float scale = 1.0f / __builtin_sqrtf(ss / (float)n + eps);
    for (uint32_t i = 0; i < n; i++) out[i] = (x[i] * scale) * w[i];
}

void softmax(float *x, uint32_t n) {
    float max = x[0];
    for (uint32_t i = 1; i < n; i++)
        if (x[i] > max) max = x[i];
    float sum = 0.0f;
    for (uint32_t i = 0; i < n; i++) {
        x[i] = colibri_expf(x[i] - max);
        sum += x[i];
    }
    for (uint32_t i = 0; i < n; i++) x[i] /= sum;
}

/* Rotate-half RoPE on n_heads vectors of head_dim, with this position's cos/sin rows. */
void rope(float *v, uint32_t n_heads, uint32_t head_dim, const float *cos, const float *sin) {
    uint32_t half = head_dim / 2;
    for (uint32_t h = 0; h < n_heads; h++) {
        float *x = v + (size_t)h * head_dim;
        for (uint32_t i = 0; i < half; i++) {
            float a = x[i], b = x[i + half];
            x[i] = a * cos[i] - b * sin[i];
            x[i + half] = b * cos[i] + a * sin[i];
        }
    }
}
