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
static int32_t mac4(int32_t acc, uint32_t a, uint32_t b) {
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

const kernel_set kernels_dsp = { .name = "dsp", .dot_f32 = dot_f32_scalar, .dot_f16 = dot_f16_scalar,
                                 .dot_bf16 = dot_bf16_scalar, .rows_q8_0 = rows_q8_0_dsp, .rows_q4_0 = rows_q4_0_dsp,
                                 .quantize_q8_0 = quantize_q8_0_scalar, .swiglu = swiglu_scalar, KERNELS_BLOCK_DTYPES_SCALAR };
#endif
