/* The block dtypes (Q4_1, Q5_0, Q5_1, MXFP4, Q4_K, Q5_K, Q6_K): GGUF's blocks as they are, scales inside
 * (docs/FORMAT.md "Dtypes"), and their scalar kernels, the reference every kernel set's follow.
 *
 * Every dot product reads block b (QBLOCK elements) of a row as integers q[k] and two floats a and c, element
 * k's value being q[k] * a + c, and adds to lane b % 8 (docs/KERNELS.md):
 *     t = (float)isum * (a * x_d[b]);  t = t + (float)x_sum[b] * (c * x_d[b]) for a dtype with an offset
 * where isum is the exact integer sum of q[k] * x_q[k] over the block. a and c are exact: an f16 times an
 * integer of at most 8 bits fits a float's 24. */
#include "internal.h"

#if WITH_BLOCK_DTYPES

typedef struct {
    int16_t q[QBLOCK];
    float a, c; /* c: the offset, for the dtypes that have one (format.h's dtype_has_offset) */
} block_terms;

/* Block b of a row (its x block b) unpacked. */
typedef void (*unpack_fn)(const uint8_t *row, uint32_t b, block_terms *t);

/* GGUF's fields are little-endian and a block may start at any byte (MXFP4's 17): read them a byte at a time. */
static float f16_at(const uint8_t *p) { return f16_to_f32((uint16_t)(p[0] | p[1] << 8)); }

/* Q4_1: {f16 d, m; u8 qs[16]}, byte j holding elements j (low nibble) and j + 16; value q * d + m. */
static void unpack_q4_1(const uint8_t *row, uint32_t b, block_terms *t) {
    const uint8_t *blk = row + (size_t)b * DTYPE_BYTES_Q4_1, *qs = blk + 4;
    for (uint32_t j = 0; j < QBLOCK / 2; j++) {
        t->q[j] = (int16_t)(qs[j] & 0xFu);
        t->q[j + QBLOCK / 2] = (int16_t)(qs[j] >> 4);
    }
    t->a = f16_at(blk);
    t->c = f16_at(blk + 2);
}

/* The 5-bit values of a Q5_0/Q5_1 block, minus `bias`: element j's low 4 bits as Q4_1's, its bit 4 in bit j of qh
 * (a little-endian u32 at qh, qs right after it). */
static void five_bits(const uint8_t *qh_bytes, int32_t bias, block_terms *t) {
    const uint8_t *qs = qh_bytes + 4;
    const uint32_t qh = (uint32_t)qh_bytes[0] | (uint32_t)qh_bytes[1] << 8 | (uint32_t)qh_bytes[2] << 16 |
                        (uint32_t)qh_bytes[3] << 24;
    for (uint32_t j = 0; j < QBLOCK / 2; j++) {
        t->q[j] = (int16_t)((int32_t)((qs[j] & 0xFu) | ((qh >> j) & 1u) << 4) - bias);
        t->q[j + QBLOCK / 2] = (int16_t)((int32_t)((qs[j] >> 4) | ((qh >> (j + 16)) & 1u) << 4) - bias);
    }
}

/* Q5_0: {f16 d; u8 qh[4]; u8 qs[16]}; value (q - 16) * d. */
static void unpack_q5_0(const uint8_t *row, uint32_t b, block_terms *t) {
    const uint8_t *blk = row + (size_t)b * DTYPE_BYTES_Q5_0;
    five_bits(blk + 2, 16, t);
    t->a = f16_at(blk);
}

/* Q5_1: {f16 d, m; u8 qh[4]; u8 qs[16]}; value q * d + m. */
static void unpack_q5_1(const uint8_t *row, uint32_t b, block_terms *t) {
    const uint8_t *blk = row + (size_t)b * DTYPE_BYTES_Q5_1;
    five_bits(blk + 4, 0, t);
    t->a = f16_at(blk);
    t->c = f16_at(blk + 2);
}

/* MXFP4: {u8 e; u8 qs[16]}, E2M1 codes as twice their values (integers), times 2^(e - 128): llama.cpp's
 * kvalues_mxfp4 and GGML_E8M0_TO_FP32_HALF (e 0 and 1 give the subnormals 2^-128 and 2^-127). */
static const int8_t MXFP4_VALUES[16] = { 0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12 };
static float e8m0_half(uint8_t e) { return f32_from_bits(e < 2u ? 0x00200000u << e : (uint32_t)(e - 1u) << 23); }
static void unpack_mxfp4(const uint8_t *row, uint32_t b, block_terms *t) {
    const uint8_t *blk = row + (size_t)b * DTYPE_BYTES_MXFP4, *qs = blk + 1;
    for (uint32_t j = 0; j < QBLOCK / 2; j++) {
        t->q[j] = MXFP4_VALUES[qs[j] & 0xFu];
        t->q[j + QBLOCK / 2] = MXFP4_VALUES[qs[j] >> 4];
    }
    t->a = e8m0_half(blk[0]);
}

/* Sub-block j's 6-bit scale and min of a Q4_K/Q5_K block (llama.cpp's get_scale_min_k4). */
static void scale_min_k4(const uint8_t *scales, uint32_t j, block_terms *t, const uint8_t *blk) {
    uint32_t sc, m;
    if (j < 4) {
        sc = scales[j] & 63u;
        m = scales[j + 4] & 63u;
    } else {
        sc = (scales[j + 4] & 0xFu) | (uint32_t)(scales[j - 4] >> 6) << 4;
        m = (uint32_t)(scales[j + 4] >> 4) | (uint32_t)(scales[j] >> 6) << 4;
    }
    t->a = f16_at(blk) * (float)sc;
    t->c = -(f16_at(blk + 2) * (float)m);
}

/* Q4_K: {f16 d, dmin; u8 scales[12]; u8 qs[128]}; sub-block j (x block b's 32 elements) is the low (j even) or
 * high nibbles of qs[32 (j / 2) ...]; value q * (d sc) - dmin m. */
static void unpack_q4_k(const uint8_t *row, uint32_t b, block_terms *t) {
    const uint8_t *blk = row + (size_t)(b / 8u) * DTYPE_BYTES_Q4_K;
    const uint32_t j = b % 8u, shift = (j & 1u) * 4u;
    const uint8_t *qs = blk + 16 + 32u * (j / 2u);
    for (uint32_t l = 0; l < QBLOCK; l++) t->q[l] = (int16_t)((qs[l] >> shift) & 0xFu);
    scale_min_k4(blk + 4, j, t, blk);
}

/* Q5_K: {f16 d, dmin; u8 scales[12]; u8 qh[32]; u8 qs[128]}: Q4_K's nibbles, bit 4 of element l of sub-block j in
 * bit j of qh[l]. */
static void unpack_q5_k(const uint8_t *row, uint32_t b, block_terms *t) {
    const uint8_t *blk = row + (size_t)(b / 8u) * DTYPE_BYTES_Q5_K;
    const uint32_t j = b % 8u, shift = (j & 1u) * 4u;
    const uint8_t *qh = blk + 16, *qs = blk + 48 + 32u * (j / 2u);
    for (uint32_t l = 0; l < QBLOCK; l++) t->q[l] = (int16_t)(((qs[l] >> shift) & 0xFu) | ((qh[l] >> j) & 1u) << 4);
    scale_min_k4(blk + 4, j, t, blk);
}

/* Q6_K: {u8 ql[128]; u8 qh[64]; i8 scales[16]; f16 d}: element e = 128n + 32k + l has its low 4 bits in
 * ql[64n + 32(k & 1) + l] (low nibble for k < 2), its top 2 in bits 2k, 2k + 1 of qh[32n + l], and the scale of
 * its 16: q = (6 bits - 32) * scales[e / 16], an exact integer (|q| <= 4096); value q * d. */
static void unpack_q6_k(const uint8_t *row, uint32_t b, block_terms *t) {
    const uint8_t *blk = row + (size_t)(b / 8u) * DTYPE_BYTES_Q6_K;
    const uint32_t j = b % 8u, n = j / 4u, k = j % 4u;
    const uint8_t *ql = blk + 64u * n + 32u * (k & 1u), *qh = blk + 128 + 32u * n;
    const int8_t *scales = (const int8_t *)(blk + 192) + 2u * j;
    for (uint32_t l = 0; l < QBLOCK; l++) {
        const int32_t q = (int32_t)(((ql[l] >> (k < 2u ? 0u : 4u)) & 0xFu) | ((qh[l] >> (2u * k)) & 3u) << 4) - 32;
        t->q[l] = (int16_t)(q * scales[l / 16u]);
    }
    t->a = f16_at(blk + 208);
}

/* Each dtype's rows inline their unpacking, but under -Os (the size-gated Cortex-M4) one copy serves them all. */
#if defined(__OPTIMIZE_SIZE__)
#define BLOCK_KERNEL static
#else
#define BLOCK_KERNEL ALWAYS_INLINE
#endif

/* One row's dot product, in the fixed order above. */
BLOCK_KERNEL float dot_unpacked(const uint8_t *row, const q8_vector *x, uint32_t blocks, unpack_fn unpack,
                                 int offset) {
    float acc[8];
    zero_lanes8(acc);
    for (uint32_t b = 0; b < blocks; b++) {
        block_terms t;
        unpack(row, b, &t);
        const int8_t *xq = x->q + (size_t)b * QBLOCK;
        int32_t isum = 0;
        for (uint32_t k = 0; k < QBLOCK; k++) isum += (int32_t)t.q[k] * xq[k];
        float term = (float)isum * (t.a * x->scale[b]);
        if (offset) term = term + (float)x->sum[b] * (t.c * x->scale[b]);
        acc[b % 8] += term;
    }
    return sum_lanes8(acc);
}

/* The bytes of a row of `blocks` x blocks in `dtype`. */
static size_t block_row_bytes(uint32_t dtype, uint32_t blocks) {
    const dtype_traits *t = &DTYPE_TRAITS[dtype];
    return (size_t)blocks * QBLOCK / t->block * t->bytes;
}

BLOCK_KERNEL void rows_unpacked(const uint8_t *w, const q8_vector *x, uint32_t blocks, uint32_t rows, float *out,
                                 uint32_t dtype, unpack_fn unpack, int offset) {
    const q8_vector xv = *x;
    const size_t row_bytes = block_row_bytes(dtype, blocks);
    for (uint32_t r = 0; r < rows; r++) out[r] = dot_unpacked(w + r * row_bytes, &xv, blocks, unpack, offset);
}

/* Each dtype's rows, its offset flag a constant at the call (format.h's, from format/schema.toml). */
#define SCALAR_ROWS(name, NAME)                                                                                        \
    void rows_##name##_scalar(const uint8_t *w, const q8_vector *x, uint32_t blocks, uint32_t rows, float *out) {    \
        rows_unpacked(w, x, blocks, rows, out, DTYPE_##NAME, unpack_##name, (int)dtype_has_offset(DTYPE_##NAME));     \
    }
SCALAR_ROWS(q4_1, Q4_1)
SCALAR_ROWS(q5_0, Q5_0)
SCALAR_ROWS(q5_1, Q5_1)
SCALAR_ROWS(mxfp4, MXFP4)
SCALAR_ROWS(q4_k, Q4_K)
SCALAR_ROWS(q5_k, Q5_K)
SCALAR_ROWS(q6_k, Q6_K)

void weight_row_block(float *out, const weight *w, uint32_t row) {
    static const unpack_fn UNPACK[DTYPE_COUNT] = { [DTYPE_Q4_1] = unpack_q4_1, [DTYPE_Q5_0] = unpack_q5_0,
                                                   [DTYPE_Q5_1] = unpack_q5_1, [DTYPE_MXFP4] = unpack_mxfp4, [DTYPE_Q4_K] = unpack_q4_k,
                                                   [DTYPE_Q5_K] = unpack_q5_k, [DTYPE_Q6_K] = unpack_q6_k };
    const int offset = (int)dtype_has_offset(w->dtype);
    const uint8_t *p = (const uint8_t *)w->data + (size_t)row * block_row_bytes(w->dtype, w->blocks);
    for (uint32_t b = 0; b < w->blocks; b++) {
        block_terms t;
        UNPACK[w->dtype](p, b, &t);
        for (uint32_t k = 0; k < QBLOCK && b * QBLOCK + k < w->cols; k++)
            out[b * QBLOCK + k] = offset ? (float)t.q[k] * t.a + t.c : (float)t.q[k] * t.a;
    }
}
#endif
