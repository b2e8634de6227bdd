/* x86-64 Q8_0 and Q4_0 kernels of the AVX2 and AVX-512 sets (kernels_x86.c holds the sets): one body each,
 * compiled for each set's target with its integer core, so both give the scalar kernels' bits (docs/KERNELS.md:
 * integer sums inside a block are exact in any order; block terms in lane b % 8, the same final tree). */
#include "internal.h"
#include "x86.h"

#if defined(COLIBRI_X86_SIMD)
/* A Q8_0 block's products: |w| (unsigned) times x with w's sign. */
AVX2 ALWAYS_INLINE __m256i block_products(__m256i w, __m256i x, products_fn products) {
    return products(_mm256_sign_epi8(w, w), _mm256_sign_epi8(x, w));
}

/* acc[k] += (float)isum[k] * (w_scale[k] * x_scale[k]) for 8 blocks */
AVX2 static __m256 block_terms(__m256 acc, __m256i isum, const uint16_t *w_scale, const float *xq_scale) {
    __m256 d = _mm256_mul_ps(load8_f16(w_scale, 0), _mm256_loadu_ps(xq_scale));
    return _mm256_add_ps(acc, _mm256_mul_ps(_mm256_cvtepi32_ps(isum), d));
}

/* The blocks [b, blocks) after the last multiple of 8 into lanes b % 8, one at a time (dot and tile alike). */
AVX2 static float q8_0_tail(float acc[8], const int8_t *w, const uint16_t *w_scale, const q8_vector *x, uint32_t b,
                            uint32_t blocks) {
    for (; b < blocks; b++) {
        int32_t isum = block_total(block_products(_mm256_loadu_si256((const __m256i *)(const void *)(w + (size_t)b * QBLOCK)),
                                                  _mm256_loadu_si256((const __m256i *)(const void *)(x->q + (size_t)b * QBLOCK)),
                                                  products_avx2));
        acc[b % 8] += (float)isum * (f16_to_f32(w_scale[b]) * x->scale[b]);
    }
    return sum_lanes8(acc);
}

/* The kernels' bodies, shared by the AVX2 and AVX-512 sets (each passes its products). */
AVX2 ALWAYS_INLINE float dot_q8_0_x86(const void *w_row, const uint16_t *w_scale, const q8_vector *x, uint32_t blocks,
                                      products_fn products) {
    const int8_t *w = w_row;
    __m256 acc8 = _mm256_setzero_ps();
    uint32_t b = 0;
    for (; b + 8 <= blocks; b += 8) {
        prefetch(w + (size_t)b * QBLOCK, 8 * QBLOCK);
        __m256i p[8];
        UNROLLED for (uint32_t k = 0; k < 8; k++) {
            const size_t at = (size_t)(b + k) * QBLOCK;
            p[k] = block_products(_mm256_loadu_si256((const __m256i *)(const void *)(w + at)),
                                  _mm256_loadu_si256((const __m256i *)(const void *)(x->q + at)), products);
        }
        acc8 = block_terms(acc8, block_totals(p), w_scale + b, x->scale + b);
    }
    if (b == blocks) return sum8(acc8);
    float acc[8];
    _mm256_storeu_ps(acc, acc8);
    return q8_0_tail(acc, w, w_scale, x, b, blocks);
}

/* Two rows by two vectors of Q8_0: each weight block is loaded and made unsigned once for both vectors,
 * each x block once for both rows. Four blocks at a time are reduced as dot_q8_0_avx2's tree does (the
 * integer sums are exact in any order), so each of the four results is that kernel's bits. */
AVX2 static __m256i quad_totals(__m256i p0, __m256i p1, __m256i p2, __m256i p3) { /* block k's halves in lanes k, k+4 */
    return _mm256_hadd_epi32(_mm256_hadd_epi32(p0, p1), _mm256_hadd_epi32(p2, p3));
}
AVX2 static __m256i octet_totals(__m256i lo4, __m256i hi4) { /* 8 blocks' sums, block k in lane k */
    return _mm256_add_epi32(_mm256_permute2x128_si256(lo4, hi4, 0x20), _mm256_permute2x128_si256(lo4, hi4, 0x31));
}

AVX2 ALWAYS_INLINE void tile_q8_0_x86(const int8_t *w, const uint16_t *w_scale, const q8_vector *x0, const q8_vector *x1,
                                      uint32_t blocks, float out[4], products_fn products) {
    const int8_t *w1 = w + (size_t)blocks * QBLOCK;
    const uint16_t *s1 = w_scale + blocks;
    __m256 a00 = _mm256_setzero_ps(), a01 = a00, a10 = a00, a11 = a00;
    uint32_t b = 0;
    for (; b + 8 <= blocks; b += 8) {
        prefetch(w + (size_t)b * QBLOCK, 8 * QBLOCK);
        prefetch(w1 + (size_t)b * QBLOCK, 8 * QBLOCK);
        __m256i q[2][4]; /* per half (blocks b..b+3, b+4..b+7): the four pairs' quad totals */
        UNROLLED for (uint32_t half = 0; half < 2; half++) {
            __m256i p[4][4]; /* [pair][block of the quad] */
            UNROLLED for (uint32_t k = 0; k < 4; k++) {
                const size_t at = (size_t)(b + 4 * half + k) * QBLOCK;
                const __m256i r0 = _mm256_loadu_si256((const __m256i *)(const void *)(w + at));
                const __m256i r1 = _mm256_loadu_si256((const __m256i *)(const void *)(w1 + at));
                const __m256i u = _mm256_loadu_si256((const __m256i *)(const void *)(x0->q + at));
                const __m256i v = _mm256_loadu_si256((const __m256i *)(const void *)(x1->q + at));
                const __m256i abs0 = _mm256_sign_epi8(r0, r0), abs1 = _mm256_sign_epi8(r1, r1);
                p[0][k] = products(abs0, _mm256_sign_epi8(u, r0));
                p[1][k] = products(abs0, _mm256_sign_epi8(v, r0));
                p[2][k] = products(abs1, _mm256_sign_epi8(u, r1));
                p[3][k] = products(abs1, _mm256_sign_epi8(v, r1));
            }
            UNROLLED for (uint32_t pair = 0; pair < 4; pair++) q[half][pair] = quad_totals(p[pair][0], p[pair][1], p[pair][2], p[pair][3]);
        }
        a00 = block_terms(a00, octet_totals(q[0][0], q[1][0]), w_scale + b, x0->scale + b);
        a01 = block_terms(a01, octet_totals(q[0][1], q[1][1]), w_scale + b, x1->scale + b);
        a10 = block_terms(a10, octet_totals(q[0][2], q[1][2]), s1 + b, x0->scale + b);
        a11 = block_terms(a11, octet_totals(q[0][3], q[1][3]), s1 + b, x1->scale + b);
    }
    const __m256 acc8[4] = { a00, a01, a10, a11 };
    const int8_t *rows[2] = { w, w1 };
    const uint16_t *scales[2] = { w_scale, s1 };
    const q8_vector *xs[2] = { x0, x1 };
    for (int pair = 0; pair < 4; pair++) {
        if (b == blocks) {
            out[pair] = sum8(acc8[pair]);
            continue;
        }
        float acc[8];
        _mm256_storeu_ps(acc, acc8[pair]);
        out[pair] = q8_0_tail(acc, rows[pair / 2], scales[pair / 2], xs[pair % 2], b, blocks);
    }
}

/* Q4_0, two blocks per 32-byte load: the low nibbles hold elements 0..15 of both blocks, the high
 * nibbles elements 16..31, so x is loaded in the same arrangement (two 16-byte halves) instead of
 * shuffling the weights. The nibbles are multiplied unsigned (0..15: maddubs cannot saturate, even
 * with both halves added in int16) and 8 * (the block's x sum) is subtracted afterwards. Lanes 0-3
 * of the result are block b's partial sums, lanes 4-7 block b+1's. */
AVX2 static __m256i pair_x_lo(const int8_t *x) {
    return _mm256_loadu2_m128i((const __m128i_u *)(const void *)(x + QBLOCK), (const __m128i_u *)(const void *)x);
}
AVX2 static __m256i pair_x_hi(const int8_t *x) {
    return _mm256_loadu2_m128i((const __m128i_u *)(const void *)(x + QBLOCK + 16), (const __m128i_u *)(const void *)(x + 16));
}
AVX2 ALWAYS_INLINE __m256i nibble_products(__m256i lo, __m256i hi, const int8_t *x, products2_fn products2) {
    return products2(lo, pair_x_lo(x), hi, pair_x_hi(x));
}

/* A row's dot reads x paired (pair_x below) when `paired`, else arranges it as it loads. */
AVX2 ALWAYS_INLINE __m256i pair_products_q4(const uint8_t *w, const int8_t *x, products2_fn products2, int paired) {
    const __m256i mask = _mm256_set1_epi8(0x0F);
    __m256i bytes = _mm256_loadu_si256((const __m256i *)(const void *)w);
    const __m256i lo = _mm256_and_si256(bytes, mask), hi = _mm256_and_si256(_mm256_srli_epi16(bytes, 4), mask);
    if (paired)
        return products2(lo, _mm256_loadu_si256((const __m256i *)(const void *)x), hi,
                         _mm256_loadu_si256((const __m256i *)(const void *)(x + QBLOCK)));
    return nibble_products(lo, hi, x, products2);
}

/* x's values (blocks of them) as a run of Q4_0 rows reads them: each pair of blocks of the whole groups of 8
 * as nibble_products arranges it (both blocks' first 16 values, then both blocks' last 16), the blocks after
 * as they are (the tail reads them one at a time). Made once per call on the stack, for up to PAIRED_X_BLOCKS
 * blocks (8 KiB): the two 128-bit inserts it saves on every pair of blocks of every row cost as much as the
 * products (in the 2nd-level cache Zen 4 ran a Q4_0 row 1.2x faster). Making it costs about one row's inserts,
 * so it pays from two rows; PAIRED_X_ROWS leaves a margin (not tuned) for the rows of a small model. */
#define PAIRED_X_BLOCKS 256u
#define PAIRED_X_ROWS 8u
AVX2 static void pair_x(int8_t *paired, const int8_t *x, uint32_t blocks) {
    const uint32_t whole = blocks / 8 * 8;
    uint32_t b = 0;
    for (; b < whole; b += 2) {
        _mm256_storeu_si256((__m256i *)(void *)(paired + (size_t)b * QBLOCK), pair_x_lo(x + (size_t)b * QBLOCK));
        _mm256_storeu_si256((__m256i *)(void *)(paired + (size_t)b * QBLOCK + QBLOCK), pair_x_hi(x + (size_t)b * QBLOCK));
    }
    for (; b < blocks; b++)
        _mm256_storeu_si256((__m256i *)(void *)(paired + (size_t)b * QBLOCK),
                            _mm256_loadu_si256((const __m256i *)(const void *)(x + (size_t)b * QBLOCK)));
}

/* The blocks [b, blocks) after the last multiple of 8, one at a time: nibbles in element order, minus 8. */
AVX2 static float q4_0_tail(float acc[8], const uint8_t *w, const uint16_t *w_scale, const q8_vector *x, uint32_t b,
                            uint32_t blocks) {
    for (; b < blocks; b++) {
        __m128i bytes = _mm_loadu_si128((const __m128i *)(const void *)(w + (size_t)b * (QBLOCK / 2)));
        __m128i mask = _mm_set1_epi8(0x0F);
        __m256i q = _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(bytes, 4), mask), _mm_and_si128(bytes, mask));
        __m256i xq = _mm256_loadu_si256((const __m256i *)(const void *)(x->q + (size_t)b * QBLOCK));
        int32_t isum = block_total(block_products(_mm256_sub_epi8(q, _mm256_set1_epi8(8)), xq, products_avx2));
        acc[b % 8] += (float)isum * (f16_to_f32(w_scale[b]) * x->scale[b]);
    }
    return sum_lanes8(acc);
}

AVX2 ALWAYS_INLINE float dot_q4_0_x86(const void *w_row, const uint16_t *w_scale, const q8_vector *x, uint32_t blocks,
                                      products2_fn products2, int paired) {
    const uint8_t *w = w_row;
    __m256 acc8 = _mm256_setzero_ps();
    const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7); /* the hadd tree leaves blocks 0 2 4 6 1 3 5 7 */
    uint32_t b = 0;
    for (; b + 8 <= blocks; b += 8) {
        prefetch(w + (size_t)b * (QBLOCK / 2), 8 * (QBLOCK / 2));
        __m256i p[4];
        UNROLLED for (uint32_t k = 0; k < 4; k++)
            p[k] = pair_products_q4(w + (size_t)(b + 2 * k) * (QBLOCK / 2), x->q + (size_t)(b + 2 * k) * QBLOCK, products2,
                                    paired);
        __m256i h = _mm256_hadd_epi32(_mm256_hadd_epi32(p[0], p[1]), _mm256_hadd_epi32(p[2], p[3]));
        __m256i eight_sums = _mm256_slli_epi32(_mm256_loadu_si256((const __m256i *)(const void *)(x->sum + b)), 3);
        __m256i isum = _mm256_sub_epi32(_mm256_permutevar8x32_epi32(h, order), eight_sums);
        acc8 = block_terms(acc8, isum, w_scale + b, x->scale + b);
    }
    if (b == blocks) return sum8(acc8);
    float acc[8];
    _mm256_storeu_ps(acc, acc8);
    return q4_0_tail(acc, w, w_scale, x, b, blocks);
}

/* A run of Q4_0 rows, through `paired` (x paired first) when the run is long enough and x fits the buffer. */
AVX2 ALWAYS_INLINE void rows_q4_0_x86(const uint8_t *w, const uint16_t *w_scale, const q8_vector *x, uint32_t blocks,
                                      uint32_t rows, float *out, row_dot_fn dot, row_dot_fn paired) {
    const size_t row_bytes = (size_t)blocks * (QBLOCK / 2);
    if (rows < PAIRED_X_ROWS || blocks > PAIRED_X_BLOCKS) {
        dot_rows(w, w_scale, x, blocks, rows, row_bytes, out, dot);
        return;
    }
    int8_t values[PAIRED_X_BLOCKS * QBLOCK];
    pair_x(values, x->q, blocks);
    const q8_vector xp = { values, x->scale, x->sum };
    dot_rows(w, w_scale, &xp, blocks, rows, row_bytes, out, paired);
}

/* Two rows by two vectors of Q4_0: each 32-byte load of nibbles (two blocks) is split once for both
 * vectors, each x pair of blocks loaded once for both rows; reduced in dot_q4_0_avx2's tree, so each
 * result is that kernel's bits. */
AVX2 ALWAYS_INLINE void tile_q4_0_x86(const uint8_t *w, const uint16_t *w_scale, const q8_vector *x0, const q8_vector *x1,
                                      uint32_t blocks, float out[4], products2_fn products2) {
    const uint8_t *w1 = w + (size_t)blocks * (QBLOCK / 2);
    const uint16_t *s1 = w_scale + blocks;
    const __m256i mask = _mm256_set1_epi8(0x0F);
    const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7); /* the hadd tree leaves blocks 0 2 4 6 1 3 5 7 */
    __m256 acc[4] = { _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps() };
    const q8_vector *xs[2] = { x0, x1 };
    uint32_t b = 0;
    for (; b + 8 <= blocks; b += 8) {
        prefetch(w + (size_t)b * (QBLOCK / 2), 8 * (QBLOCK / 2));
        prefetch(w1 + (size_t)b * (QBLOCK / 2), 8 * (QBLOCK / 2));
        __m256i h[2][4]; /* [half][pair]: hadd of the pair's products of blocks b + 4 half .. + 3 */
        UNROLLED for (uint32_t half = 0; half < 2; half++) {
            __m256i p[4][2];
            UNROLLED for (uint32_t k = 0; k < 2; k++) {
                const uint32_t at = b + 4 * half + 2 * k; /* blocks at, at + 1 */
                const __m256i r0 = _mm256_loadu_si256((const __m256i *)(const void *)(w + (size_t)at * (QBLOCK / 2)));
                const __m256i r1 = _mm256_loadu_si256((const __m256i *)(const void *)(w1 + (size_t)at * (QBLOCK / 2)));
                const __m256i lo0 = _mm256_and_si256(r0, mask), hi0 = _mm256_and_si256(_mm256_srli_epi16(r0, 4), mask);
                const __m256i lo1 = _mm256_and_si256(r1, mask), hi1 = _mm256_and_si256(_mm256_srli_epi16(r1, 4), mask);
                p[0][k] = nibble_products(lo0, hi0, x0->q + (size_t)at * QBLOCK, products2);
                p[1][k] = nibble_products(lo0, hi0, x1->q + (size_t)at * QBLOCK, products2);
                p[2][k] = nibble_products(lo1, hi1, x0->q + (size_t)at * QBLOCK, products2);
                p[3][k] = nibble_products(lo1, hi1, x1->q + (size_t)at * QBLOCK, products2);
            }
            UNROLLED for (uint32_t pair = 0; pair < 4; pair++) h[half][pair] = _mm256_hadd_epi32(p[pair][0], p[pair][1]);
        }
        UNROLLED for (uint32_t pair = 0; pair < 4; pair++) {
            const q8_vector *x = xs[pair % 2];
            __m256i eight_sums = _mm256_slli_epi32(_mm256_loadu_si256((const __m256i *)(const void *)(x->sum + b)), 3);
            __m256i isum = _mm256_sub_epi32(_mm256_permutevar8x32_epi32(_mm256_hadd_epi32(h[0][pair], h[1][pair]), order),
                                            eight_sums);
            acc[pair] = block_terms(acc[pair], isum, (pair < 2 ? w_scale : s1) + b, x->scale + b);
        }
    }
    for (int pair = 0; pair < 4; pair++) {
        if (b == blocks) {
            out[pair] = sum8(acc[pair]);
            continue;
        }
        float lanes[8];
        _mm256_storeu_ps(lanes, acc[pair]);
        out[pair] = q4_0_tail(lanes, pair < 2 ? w : w1, pair < 2 ? w_scale : s1, xs[pair % 2], b, blocks);
    }
}

/* A kernel set's quantized entries, the bodies above compiled for its target with its integer core:
 * dot_q8_0_<set>, dot_q4_0_<set> and dot_q4_0_<set>_paired (one row), rows_q8_0_<set>, rows_q4_0_<set>,
 * tile_q8_0_<set> and tile_q4_0_<set>. One definition for the AVX2 and the AVX-512 sets, which differ only
 * in those two. */
#define QUANTIZED_ENTRIES(set, TARGET, products, products2)                                                           \
    TARGET static float dot_q8_0_##set(const void *w, const uint16_t *w_scale, const q8_vector *x, uint32_t blocks) { \
        return dot_q8_0_x86(w, w_scale, x, blocks, products);                                                         \
    }                                                                                                                 \
    TARGET static float dot_q4_0_##set(const void *w, const uint16_t *w_scale, const q8_vector *x, uint32_t blocks) { \
        return dot_q4_0_x86(w, w_scale, x, blocks, products2, 0);                                                     \
    }                                                                                                                 \
    TARGET static float dot_q4_0_##set##_paired(const void *w, const uint16_t *w_scale, const q8_vector *x,           \
                                                uint32_t blocks) {                                                    \
        return dot_q4_0_x86(w, w_scale, x, blocks, products2, 1);                                                     \
    }                                                                                                                 \
    TARGET void rows_q8_0_##set(const int8_t *w, const uint16_t *w_scale, const q8_vector *x, uint32_t blocks,        \
                                       uint32_t rows, float *out) {                                                   \
        dot_rows(w, w_scale, x, blocks, rows, (size_t)blocks * QBLOCK, out, dot_q8_0_##set);                          \
    }                                                                                                                 \
    TARGET void rows_q4_0_##set(const uint8_t *w, const uint16_t *w_scale, const q8_vector *x, uint32_t blocks,       \
                                       uint32_t rows, float *out) {                                                   \
        rows_q4_0_x86(w, w_scale, x, blocks, rows, out, dot_q4_0_##set, dot_q4_0_##set##_paired);                     \
    }                                                                                                                 \
    TARGET void tile_q8_0_##set(const int8_t *w, const uint16_t *w_scale, const q8_vector *x0,                        \
                                       const q8_vector *x1, uint32_t blocks, float out[4]) {                          \
        tile_q8_0_x86(w, w_scale, x0, x1, blocks, out, products);                                                     \
    }                                                                                                                 \
    TARGET void tile_q4_0_##set(const uint8_t *w, const uint16_t *w_scale, const q8_vector *x0,                       \
                                       const q8_vector *x1, uint32_t blocks, float out[4]) {                          \
        tile_q4_0_x86(w, w_scale, x0, x1, blocks, out, products2);                                                    \
    }

QUANTIZED_ENTRIES(avx2, AVX2, products_avx2, products2_avx2)

QUANTIZED_ENTRIES(vnni, AVX512, products_vnni, products2_vnni)

#endif
