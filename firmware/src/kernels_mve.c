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

/* Helium's float arithmetic flushes subnormal inputs and results to zero whatever FPSCR.FZ says (QEMU runs
 * it with the standard FPSCR value, as Neon; the FPU's scalar instructions follow FPSCR, where FZ is
 * clear), and it records every flush in FPSCR's cumulative flags: IDC for an input, UFC for a
 * result. A kernel clears both, computes, and if either is set has met a subnormal and may differ from
 * the scalar bits: it then returns the scalar kernel's. Subnormal weights and activations are rare, so
 * the price is two FPSCR accesses per call. */
#define FPSCR_UFC (1u << 3)
#define FPSCR_IDC (1u << 7)
static void flush_flags_clear(void) {
    uint32_t fpscr;
    __asm__ volatile("vmrs %0, fpscr" : "=r"(fpscr) : : "memory");
    fpscr &= ~(FPSCR_UFC | FPSCR_IDC);
    __asm__ volatile("vmsr fpscr, %0" : : "r"(fpscr) : "memory");
}
/* r: the kernel's result, an operand so that its computation cannot move after the read */
static int flushed(float r) {
    uint32_t fpscr;
    __asm__ volatile("vmrs %0, fpscr" : "=r"(fpscr) : "t"(r) : "memory");
    return (fpscr & (FPSCR_UFC | FPSCR_IDC)) != 0;
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

const kernel_set kernels_mve = { .name = "mve", .dot_f32 = dot_f32_mve, .dot_f16 = dot_f16_mve, .dot_bf16 = dot_bf16_mve,
                                 .rows_q8_0 = rows_q8_0_mve, .rows_q4_0 = rows_q4_0_mve,
                                 .quantize_q8_0 = quantize_q8_0_mve, .swiglu = swiglu_mve, KERNELS_BLOCK_DTYPES_SCALAR };
#endif
