/* What the Helium kernels (kernels_mve.c) share: the loaders of 4 values as f32 in lane order, and the check of
 * FPSCR's flush flags. Kept apart so that kernels_mve.c reads in one sitting. */
#ifndef COLIBRI_MVE_H
#define COLIBRI_MVE_H

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

#endif
