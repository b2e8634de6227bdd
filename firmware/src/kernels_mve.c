/* Cortex-M55 kernels: Helium (MVE), 128-bit vectors. Each function computes exactly what its scalar
 * twin in kernels.c computes (docs/KERNELS.md): the 16 float lanes live in four 4-wide registers,
 * integer block sums come from VMLADAV (exact), products and sums are rounded separately. */
#include "internal.h"

#if defined(__ARM_FEATURE_MVE) && (__ARM_FEATURE_MVE & 2) && !defined(COLIBRI_KERNELS_SCALAR)
#include <arm_mve.h>

/* Loaders of 4 weights as f32 (exact widening), in lane order, and of one weight for the tail. */
static float32x4_t load4_f32(const void *w, uint32_t i) { return vld1q_f32((const float *)w + i); }

/* bf16 -> f32 is a 16-bit shift: a widening load puts 4 halfwords in 4 word lanes, in order. */
static float32x4_t load4_bf16(const void *w, uint32_t i) {
    return vreinterpretq_f32_u32(vshlq_n_u32(vldrhq_u32((const uint16_t *)w + i), 16));
}

/* f16 -> f32 exactly: normal and inf/NaN values by rebiasing the exponent in the integer domain,
 * subnormals as em * 2^-24 (exact in f32), as f16_to_f32() does. (VCVTB/VCVTT would take even or
 * odd halves and need de-interleaved lanes; this keeps the lane order.) */
static float32x4_t load4_f16(const void *w, uint32_t i) {
    uint32x4_t h = vldrhq_u32((const uint16_t *)w + i), em = vandq_u32(h, vdupq_n_u32(0x7FFFu));
    uint32x4_t sign = vshlq_n_u32(vandq_u32(h, vdupq_n_u32(0x8000u)), 16);
    uint32x4_t rebias = vdupq_m_n_u32(vdupq_n_u32(0x1C000u), 0x38000u, vcmpcsq_n_u32(em, 0x7C00u));
    uint32x4_t wide = vorrq_u32(sign, vshlq_n_u32(vaddq_u32(em, rebias), 13));
    float32x4_t tiny = vmulq_n_f32(vcvtq_f32_u32(em), 5.9604644775390625e-08f);
    uint32x4_t sub = vorrq_u32(vreinterpretq_u32_f32(tiny), sign);
    return vreinterpretq_f32_u32(vpselq_u32(sub, wide, vcmphiq_u32(vdupq_n_u32(0x400u), em)));
}

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

static float dot_f32_mve(const float *w, const float *x, uint32_t n) { return dot_lanes16(w, x, n, load4_f32, one_f32); }
static float dot_f16_mve(const uint16_t *w, const float *x, uint32_t n) { return dot_lanes16(w, x, n, load4_f16, one_f16); }
static float dot_bf16_mve(const uint16_t *w, const float *x, uint32_t n) { return dot_lanes16(w, x, n, load4_bf16, one_bf16); }

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

static float dot_q8_0_mve(const int8_t *w, const uint16_t *w_scale, const q8_vector *x, uint32_t blocks) {
    return dot_blocks(w, w_scale, x, blocks, isum_q8_0_mve);
}

static float dot_q4_0_mve(const uint8_t *w, const uint16_t *w_scale, const q8_vector *x, uint32_t blocks) {
    return dot_blocks(w, w_scale, x, blocks, isum_q4_0_mve);
}

const kernel_set kernels_mve = { .name = "mve", .dot_f32 = dot_f32_mve, .dot_f16 = dot_f16_mve, .dot_bf16 = dot_bf16_mve,
                                 .dot_q8_0 = dot_q8_0_mve, .dot_q4_0 = dot_q4_0_mve };
#endif
