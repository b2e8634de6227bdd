/* x86-64 rows of the block dtypes (Q4_1, Q5_0, Q5_1, MXFP4, Q4_K, Q5_K, Q6_K) for the AVX2 and AVX-512 sets
 * (kernels_x86.c holds the sets): kernels_block.c's fixed order (docs/KERNELS.md), block b's integer sum exact,
 * t = (float)isum * (a * x_d[b]), plus (float)x_sum[b] * (c * x_d[b]) for a dtype with an offset, into lane b % 8,
 * eight blocks at once. The integer sums come from unsigned bytes times x's signed ones (the set's integer core,
 * x86.h: maddubs/madd or VPDPBUSD), never saturating:
 *   Q4_1, Q4_K  nibbles 0..15;  Q5_1, Q5_K  5 bits 0..31: the values themselves;
 *   Q5_0        5 bits 0..31, minus 16 * x_sum afterwards (the values are q - 16);
 *   MXFP4       twice the E2M1 value plus 12 (0..24, a byte shuffle of the codes), minus 12 * x_sum;
 *   Q6_K        6 bits 0..63: the products of (q - 32) and x (AVX2: maddubs(q, x) - maddubs(32, x), pairs at
 *               most 2 x 32 x 127 in int16; AVX-512: two VPDPBUSD), each 16's sum then times its int8 scale in
 *               int32 (at most 16 x 32 x 127 x 128).
 * A maddubs pair is at most 2 x 63 x 127 = 16,002 (x never -128), below int16's 32,767; VPDPBUSD does not saturate.
 * Every block's sum is below 2^24 (docs/KERNELS.md), so its conversion to f32 is exact. */
#include "internal.h"
#include "x86.h"

#if defined(COLIBRI_X86_SIMD) && WITH_BLOCK_DTYPES
/* The float steps of 8 blocks from block b, lane k block b + k: kernels_block.c's, operand for operand. */
AVX2 ALWAYS_INLINE __m256 block_step(__m256 acc, __m256i isum, __m256 a, __m256 c, const q8_vector *x, uint32_t b,
                                     int offset) {
    const __m256 xd = _mm256_loadu_ps(x->scale + b);
    __m256 t = _mm256_mul_ps(_mm256_cvtepi32_ps(isum), _mm256_mul_ps(a, xd));
    if (offset) t = _mm256_add_ps(t, _mm256_mul_ps(_mm256_cvtepi32_ps(load32(x->sum + b)), _mm256_mul_ps(c, xd)));
    return _mm256_add_ps(acc, t);
}

/* ---- Q4_1, Q5_0, Q5_1, MXFP4: one block per 32 of x ---- */

/* 16 bytes of nibble pairs as 32 values: the low nibbles (elements 0-15) in bytes 0-15, the high ones after. */
AVX2 static inline __m256i nibbles16(const uint8_t *qs) {
    const __m256i b = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)(const void *)qs));
    return _mm256_and_si256(_mm256_srlv_epi64(b, _mm256_setr_epi64x(0, 0, 4, 4)), _mm256_set1_epi8(0x0F));
}
/* Bit k of qh as 16 in byte k: element k's bit 4 (Q5_0, Q5_1). */
AVX2 static inline __m256i bit4_of(uint32_t qh) {
    const __m256i spread = _mm256_shuffle_epi8(_mm256_set1_epi32((int)qh),
                                               _mm256_setr_epi64x(0, 0x0101010101010101, 0x0202020202020202, 0x0303030303030303));
    const __m256i bit = _mm256_set1_epi64x((long long)0x8040201008040201);
    return _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(spread, bit), bit), _mm256_set1_epi8(16));
}

/* A block's products with x: 8 int32 lanes summing to sum u[k] x[k], u the unsigned value (q + bias). */
typedef __m256i (*small_products_fn)(const uint8_t *blk, const int8_t *x, products_fn products);
AVX2 ALWAYS_INLINE __m256i q4_1_products(const uint8_t *blk, const int8_t *x, products_fn products) {
    return products(nibbles16(blk + 4), load32(x));
}
AVX2 ALWAYS_INLINE __m256i q5_0_products(const uint8_t *blk, const int8_t *x, products_fn products) {
    return products(_mm256_or_si256(nibbles16(blk + 6), bit4_of(le32(blk + 2))), load32(x));
}
AVX2 ALWAYS_INLINE __m256i q5_1_products(const uint8_t *blk, const int8_t *x, products_fn products) {
    return products(_mm256_or_si256(nibbles16(blk + 8), bit4_of(le32(blk + 4))), load32(x));
}
AVX2 ALWAYS_INLINE __m256i mxfp4_products(const uint8_t *blk, const int8_t *x, products_fn products) {
    /* kernels_block.c's MXFP4_VALUES + 12 */
    const __m256i values = _mm256_setr_epi8(12, 13, 14, 15, 16, 18, 20, 24, 12, 11, 10, 9, 8, 6, 4, 0, 12, 13, 14, 15, 16, 18,
                                            20, 24, 12, 11, 10, 9, 8, 6, 4, 0);
    return products(_mm256_shuffle_epi8(values, nibbles16(blk + 1)), load32(x));
}

/* The factors a and c of 8 blocks `stride` bytes apart (lane k: the block at blk + k stride), and of one block. */
typedef void (*small_factors8_fn)(const uint8_t *blk, __m256 *a, __m256 *c);
/* Dword k of the result: the 4 bytes at p + k stride (k < 8); inserts (a gather ran slower on Zen 4). */
AVX2 static inline __m256i dwords8(const uint8_t *p, size_t stride) {
    __m128i lo = _mm_cvtsi32_si128((int)le32(p)), hi = _mm_cvtsi32_si128((int)le32(p + 4 * stride));
    lo = _mm_insert_epi32(lo, (int)le32(p + stride), 1);
    hi = _mm_insert_epi32(hi, (int)le32(p + 5 * stride), 1);
    lo = _mm_insert_epi32(lo, (int)le32(p + 2 * stride), 2);
    hi = _mm_insert_epi32(hi, (int)le32(p + 6 * stride), 2);
    lo = _mm_insert_epi32(lo, (int)le32(p + 3 * stride), 3);
    hi = _mm_insert_epi32(hi, (int)le32(p + 7 * stride), 3);
    return _mm256_set_m128i(hi, lo);
}
/* The f16 pair (d, m) at the start of each of 8 blocks, widened exactly. */
AVX2 ALWAYS_INLINE void f16_pairs8(const uint8_t *blk, size_t stride, __m256 *d, __m256 *m) {
    const __m256i dm = dwords8(blk, stride);
    /* per 128-bit half d0 m0 d1 m1 .. -> d0 d1 d2 d3 m0 m1 m2 m3, then the quarters to d0-7 m0-7 */
    const __m256i split = _mm256_shuffle_epi8(dm, _mm256_setr_epi8(0, 1, 4, 5, 8, 9, 12, 13, 2, 3, 6, 7, 10, 11, 14, 15, 0, 1,
                                                                   4, 5, 8, 9, 12, 13, 2, 3, 6, 7, 10, 11, 14, 15));
    const __m256i ordered = _mm256_permute4x64_epi64(split, 0xD8);
    *d = _mm256_cvtph_ps(_mm256_castsi256_si128(ordered));
    *m = _mm256_cvtph_ps(_mm256_extracti128_si256(ordered, 1));
}
AVX2 ALWAYS_INLINE void q4_1_factors8(const uint8_t *blk, __m256 *a, __m256 *c) { f16_pairs8(blk, 20, a, c); }
AVX2 ALWAYS_INLINE void q5_0_factors8(const uint8_t *blk, __m256 *a, __m256 *c) { f16_pairs8(blk, 22, a, c); }
AVX2 ALWAYS_INLINE void q5_1_factors8(const uint8_t *blk, __m256 *a, __m256 *c) { f16_pairs8(blk, 24, a, c); }
static inline void f16_pair1(const uint8_t *blk, float *a, float *c) {
    *a = f16_to_f32((uint16_t)le16(blk));
    *c = f16_to_f32((uint16_t)le16(blk + 2));
}
/* MXFP4's scale 2^(e - 128) (kernels_block.c's e8m0_half: e 0 and 1 give the subnormals 2^-128, 2^-127). */
AVX2 ALWAYS_INLINE void mxfp4_factors8(const uint8_t *blk, __m256 *a, __m256 *c) {
    const __m256i e = _mm256_and_si256(dwords8(blk, 17), _mm256_set1_epi32(0xFF));
    const __m256i normal = _mm256_slli_epi32(_mm256_sub_epi32(e, _mm256_set1_epi32(1)), 23);
    const __m256i subnormal = _mm256_sllv_epi32(_mm256_set1_epi32(0x00200000), e);
    *a = _mm256_castsi256_ps(_mm256_blendv_epi8(normal, subnormal, _mm256_cmpgt_epi32(_mm256_set1_epi32(2), e)));
    *c = _mm256_setzero_ps();
}
static inline void mxfp4_factors1(const uint8_t *blk, float *a, float *c) {
    *a = f32_from_bits(blk[0] < 2u ? 0x00200000u << blk[0] : (uint32_t)(blk[0] - 1u) << 23);
    *c = 0.0f;
}

/* The blocks [b, blocks) after the last 8 of a row of Q4_1, Q5_0, Q5_1 or MXFP4, one at a time into their lanes
 * (the scalar kernel's steps), then the tree: one copy for every dtype and both sets (the integer sums are exact
 * whichever core makes them). */
AVX2 static float small_tail(float acc[8], const uint8_t *row, const q8_vector *x, uint32_t b, uint32_t blocks,
                             uint32_t dtype) {
    for (; b < blocks; b++) {
        const int8_t *xq = x->q + (size_t)b * QBLOCK;
        const uint8_t *blk;
        __m256i p;
        int32_t bias = 0;
        float a, c = 0.0f;
        switch (dtype) {
        case DTYPE_Q4_1:
            blk = row + (size_t)b * DTYPE_BYTES_Q4_1;
            p = q4_1_products(blk, xq, products_avx2);
            f16_pair1(blk, &a, &c);
            break;
        case DTYPE_Q5_0:
            blk = row + (size_t)b * DTYPE_BYTES_Q5_0;
            p = q5_0_products(blk, xq, products_avx2);
            f16_pair1(blk, &a, &c);
            bias = 16;
            break;
        case DTYPE_Q5_1:
            blk = row + (size_t)b * DTYPE_BYTES_Q5_1;
            p = q5_1_products(blk, xq, products_avx2);
            f16_pair1(blk, &a, &c);
            break;
        default: /* MXFP4 */
            blk = row + (size_t)b * DTYPE_BYTES_MXFP4;
            p = mxfp4_products(blk, xq, products_avx2);
            mxfp4_factors1(blk, &a, &c);
            bias = 12;
        }
        const int32_t isum = block_total(p) - bias * x->sum[b];
        float t = (float)isum * (a * x->scale[b]);
        if (dtype_has_offset(dtype)) t = t + (float)x->sum[b] * (c * x->scale[b]);
        acc[b % 8] += t;
    }
    return sum_lanes8(acc);
}

/* One row of a dtype with one block per 32 of x: 8 blocks' sums at once, then small_tail. bias: the unsigned values'
 * excess, bias * x_sum taken off. */
AVX2 ALWAYS_INLINE float dot_small_x86(const uint8_t *row, const q8_vector *x, uint32_t blocks, uint32_t dtype, size_t stride,
                                       int32_t bias, int offset, small_products_fn block_products, small_factors8_fn factors8,
                                       products_fn products) {
    __m256 acc8 = _mm256_setzero_ps();
    uint32_t b = 0;
    for (; b + 8 <= blocks; b += 8) {
        const uint8_t *blk = row + (size_t)b * stride;
        prefetch(blk, 8 * stride);
        __m256i p[8];
        UNROLLED for (uint32_t k = 0; k < 8; k++)
            p[k] = block_products(blk + k * stride, x->q + (size_t)(b + k) * QBLOCK, products);
        __m256i isum = block_totals(p);
        if (bias) isum = _mm256_sub_epi32(isum, _mm256_mullo_epi32(load32(x->sum + b), _mm256_set1_epi32(bias)));
        __m256 a, c;
        factors8(blk, &a, &c);
        acc8 = block_step(acc8, isum, a, c, x, b, offset);
    }
    if (b == blocks) return sum8(acc8);
    float acc[8];
    _mm256_storeu_ps(acc, acc8);
    return small_tail(acc, row, x, b, blocks, dtype);
}

/* ---- Q4_K, Q5_K, Q6_K: one block per 8 of x (the row's blocks a multiple of 8: the verifier's rule) ---- */

/* A K-quant block's 8 integer sums (x block b + k in lane k) from its bytes and x's 256 values. */
typedef __m256i (*k_sums_fn)(const uint8_t *blk, const int8_t *x, products_fn products);
typedef void (*k_factors_fn)(const uint8_t *blk, __m256 *a, __m256 *c);

/* Q4_K: sub-blocks 2j and 2j + 1 are the low and high nibbles of qs[32j ..]. */
AVX2 ALWAYS_INLINE __m256i q4_k_sums(const uint8_t *blk, const int8_t *x, products_fn products) {
    const __m256i mask = _mm256_set1_epi8(0x0F);
    __m256i p[8];
    UNROLLED for (uint32_t j = 0; j < 4; j++) {
        const __m256i bytes = load32(blk + 16 + 32 * j);
        p[2 * j] = products(_mm256_and_si256(bytes, mask), load32(x + 64 * j));
        p[2 * j + 1] = products(_mm256_and_si256(_mm256_srli_epi16(bytes, 4), mask), load32(x + 64 * j + 32));
    }
    return block_totals(p);
}
/* Q5_K: Q4_K's nibbles, bit 4 of sub-block s's element l in bit s of qh[l] (moved to bit 4 by a 16-bit shift:
 * the bits it brings from the neighbouring byte are masked off). */
AVX2 ALWAYS_INLINE __m256i q5_k_bit4(__m256i qh, uint32_t s) {
    const __m256i moved = s <= 4 ? _mm256_slli_epi16(qh, (int)(4 - s)) : _mm256_srli_epi16(qh, (int)(s - 4));
    return _mm256_and_si256(moved, _mm256_set1_epi8(0x10));
}
AVX2 ALWAYS_INLINE __m256i q5_k_sums(const uint8_t *blk, const int8_t *x, products_fn products) {
    const __m256i mask = _mm256_set1_epi8(0x0F), qh = load32(blk + 16);
    __m256i p[8];
    UNROLLED for (uint32_t j = 0; j < 4; j++) {
        const __m256i bytes = load32(blk + 48 + 32 * j);
        const __m256i lo = _mm256_or_si256(_mm256_and_si256(bytes, mask), q5_k_bit4(qh, 2 * j));
        const __m256i hi = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(bytes, 4), mask), q5_k_bit4(qh, 2 * j + 1));
        p[2 * j] = products(lo, load32(x + 64 * j));
        p[2 * j + 1] = products(hi, load32(x + 64 * j + 32));
    }
    return block_totals(p);
}
/* Q6_K's integer core: (u - 32) s for 32 unsigned u (0..63) and signed s, four neighbours summed per int32 lane.
 * AVX2 takes 32 s off each maddubs pair in int16 (a pair of (u - 32) s is at most 2 x 32 x 127). */
AVX2 static inline __m256i products_q6_avx2(__m256i u, __m256i s) {
    const __m256i pairs = _mm256_sub_epi16(_mm256_maddubs_epi16(u, s), _mm256_maddubs_epi16(_mm256_set1_epi8(32), s));
    return _mm256_madd_epi16(pairs, _mm256_set1_epi16(1));
}
AVX512 static inline __m256i products_q6_vnni(__m256i u, __m256i s) {
    return _mm256_sub_epi32(products_vnni(u, s), products_vnni(_mm256_set1_epi8(32), s));
}

/* Q6_K: element 128n + 32k + l's low 4 bits in ql[64n + 32(k & 1) + l] (the high nibble for k >= 2), its top 2
 * in bits 2k, 2k + 1 of qh[32n + l]; the scales of its 16s int8. Sub-block j = 4n + k's products of (q - 32) and x
 * (products: products_q6_<set>), lanes 0-3 its first 16 elements and 4-7 its last; the tree's first two levels
 * leave the 16s' sums, which are multiplied by their scales in int32 before the last. */
AVX2 ALWAYS_INLINE __m256i q6_k_sums(const uint8_t *blk, const int8_t *x, products_fn products) {
    const __m256i mask = _mm256_set1_epi8(0x0F), top = _mm256_set1_epi8(0x30);
    __m256i p[8];
    UNROLLED for (uint32_t n = 0; n < 2; n++) {
        const __m256i l0 = load32(blk + 64 * n), l1 = load32(blk + 64 * n + 32), h = load32(blk + 128 + 32 * n);
        const __m256i q[4] = {
            _mm256_or_si256(_mm256_and_si256(l0, mask), _mm256_and_si256(_mm256_slli_epi16(h, 4), top)),
            _mm256_or_si256(_mm256_and_si256(l1, mask), _mm256_and_si256(_mm256_slli_epi16(h, 2), top)),
            _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), mask), _mm256_and_si256(h, top)),
            _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), mask), _mm256_and_si256(_mm256_srli_epi16(h, 2), top)),
        };
        UNROLLED for (uint32_t k = 0; k < 4; k++) {
            const __m256i xv = load32(x + 32 * (4 * n + k));
            p[4 * n + k] = products(q[k], xv);
        }
    }
    /* [first 16s of sub-blocks 0-3 | their last 16s], the same for 4-7 */
    __m256i lo4 = _mm256_hadd_epi32(_mm256_hadd_epi32(p[0], p[1]), _mm256_hadd_epi32(p[2], p[3]));
    __m256i hi4 = _mm256_hadd_epi32(_mm256_hadd_epi32(p[4], p[5]), _mm256_hadd_epi32(p[6], p[7]));
    const __m128i sc = _mm_shuffle_epi8(_mm_loadu_si128((const __m128i *)(const void *)(blk + 192)),
                                        _mm_setr_epi8(0, 2, 4, 6, 1, 3, 5, 7, 8, 10, 12, 14, 9, 11, 13, 15));
    lo4 = _mm256_mullo_epi32(lo4, _mm256_cvtepi8_epi32(sc));
    hi4 = _mm256_mullo_epi32(hi4, _mm256_cvtepi8_epi32(_mm_srli_si128(sc, 8)));
    return _mm256_add_epi32(_mm256_permute2x128_si256(lo4, hi4, 0x20), _mm256_permute2x128_si256(lo4, hi4, 0x31));
}

/* One row of a K-quant dtype (`bytes` per block of 256). */
AVX2 ALWAYS_INLINE float dot_k_x86(const uint8_t *row, const q8_vector *x, uint32_t blocks, size_t bytes, int offset,
                                   k_sums_fn sums, k_factors_fn factors, products_fn products) {
    __m256 acc8 = _mm256_setzero_ps();
    for (uint32_t b = 0; b + 8 <= blocks; b += 8) {
        const uint8_t *blk = row + (size_t)(b / 8) * bytes;
        prefetch(blk, bytes);
        const __m256i isum = sums(blk, x->q + (size_t)b * QBLOCK, products);
        __m256 a, c;
        factors(blk, &a, &c);
        acc8 = block_step(acc8, isum, a, c, x, b, offset);
    }
    return sum8(acc8);
}

/* A kernel set's block rows: each dtype's row dot inlined in the row loop, with the set's integer core (x is
 * copied first, as dot_rows does: out may alias what an int8 pointer reaches); the block's bytes and the offset flag
 * are format.h's constants (format/schema.toml). */
#define SMALL_ROWS(name, NAME, set, TARGET, products, bias)                                                          \
    TARGET void rows_##name##_##set(const uint8_t *w, const q8_vector *x, uint32_t blocks, uint32_t rows, float *out) { \
        const q8_vector xv = *x;                                                                                     \
        const size_t row_bytes = (size_t)blocks * DTYPE_BYTES_##NAME;                                                \
        for (uint32_t r = 0; r < rows; r++)                                                                          \
            out[r] = dot_small_x86(w + r * row_bytes, &xv, blocks, DTYPE_##NAME, DTYPE_BYTES_##NAME, bias,            \
                                   (int)dtype_has_offset(DTYPE_##NAME), name##_products, name##_factors8, products); \
    }
#define K_ROWS(name, NAME, set, TARGET, products, factors)                                                           \
    TARGET void rows_##name##_##set(const uint8_t *w, const q8_vector *x, uint32_t blocks, uint32_t rows, float *out) { \
        const q8_vector xv = *x;                                                                                     \
        const size_t row_bytes = (size_t)blocks / 8 * DTYPE_BYTES_##NAME;                                            \
        for (uint32_t r = 0; r < rows; r++)                                                                          \
            out[r] = dot_k_x86(w + r * row_bytes, &xv, blocks, DTYPE_BYTES_##NAME, (int)dtype_has_offset(DTYPE_##NAME), \
                               name##_sums, factors, products);                                                      \
    }
#define BLOCK_ENTRIES(set, TARGET, products, products_q6)                                                            \
    SMALL_ROWS(q4_1, Q4_1, set, TARGET, products, 0)                                                                 \
    SMALL_ROWS(q5_0, Q5_0, set, TARGET, products, 16)                                                                \
    SMALL_ROWS(q5_1, Q5_1, set, TARGET, products, 0)                                                                 \
    SMALL_ROWS(mxfp4, MXFP4, set, TARGET, products, 12)                                                              \
    K_ROWS(q4_k, Q4_K, set, TARGET, products, k4_factors)                                                            \
    K_ROWS(q5_k, Q5_K, set, TARGET, products, k4_factors)                                                            \
    K_ROWS(q6_k, Q6_K, set, TARGET, products_q6, q6_k_factors)

BLOCK_ENTRIES(avx2, AVX2, products_avx2, products_q6_avx2)
BLOCK_ENTRIES(vnni, AVX512, products_vnni, products_q6_vnni)
#endif
