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

/* The blocks [b, blocks) after the last multiple of 8 into lanes b % 8, one at a time (dot, tile and rows4 alike). */
AVX2 float q8_0_tail(float acc[8], const int8_t *w, const uint16_t *w_scale, const q8_vector *x, uint32_t b,
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

/* The quantized tiles: two adjacent rows (the second's blocks and scales right after the first's) times n_x vectors
 * (up to TILE_X_MAX), out[r * n_x + t] = row r . x[t], each that row's dot's bits. Each weight register is made
 * once for all the vectors and each x register once for both rows; each result's integer sums are exact (made in
 * any order) and its float steps the dot's. */
#define TILE_X_MAX 2u

/* The Q8_0 tile's integer core, in three steps: per (row, block) a form of the weights made once for every vector
 * (wprep), per (vector, block) one of x made once for both rows (xprep), and from them the block's 8 int32 lanes,
 * which sum to w . x (core). AVX2: |w| and maddubs(|w|, x with w's sign), as the dot. VNNI: x + 128 (unsigned: x
 * is never -128), -128 times the sums of four w, and VPDPBUSD of the two starting from the latter, so each lane is
 * (x + 128) w - 128 w = x w with one instruction a vector and block. */
typedef __m256i (*q8_prep_fn)(__m256i v);
typedef __m256i (*q8_core_fn)(__m256i w, __m256i w_prep, __m256i x_prep);
AVX2 static inline __m256i q8_wprep_avx2(__m256i w) { return _mm256_sign_epi8(w, w); }
AVX2 static inline __m256i q8_xprep_avx2(__m256i x) { return x; }
AVX2 static inline __m256i q8_core_avx2(__m256i w, __m256i w_abs, __m256i x) {
    return products_avx2(w_abs, _mm256_sign_epi8(x, w));
}
AVX512 static inline __m256i q8_wprep_vnni(__m256i w) {
    return _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_dpbusd_epi32(_mm256_setzero_si256(), _mm256_set1_epi8(-128), w));
}
AVX512 static inline __m256i q8_xprep_vnni(__m256i x) { return _mm256_xor_si256(x, _mm256_set1_epi8(-128)); }
AVX512 static inline __m256i q8_core_vnni(__m256i w, __m256i w_less, __m256i x_more) {
    return _mm256_dpbusd_epi32(w_less, x_more, w);
}

/* Eight blocks' sums, block k in lane k, from the hadds of blocks' lanes (0, 1), (2, 3), (4, 5), (6, 7):
 * block_totals' last steps. */
AVX2 static inline __m256i pair_hadds_total(__m256i h01, __m256i h23, __m256i h45, __m256i h67) {
    const __m256i lo4 = _mm256_hadd_epi32(h01, h23), hi4 = _mm256_hadd_epi32(h45, h67);
    return _mm256_add_epi32(_mm256_permute2x128_si256(lo4, hi4, 0x20), _mm256_permute2x128_si256(lo4, hi4, 0x31));
}

AVX2 ALWAYS_INLINE void tile_q8_0_x86(const int8_t *w, const uint16_t *w_scale, const q8_vector *xs, uint32_t n_x,
                                      uint32_t blocks, float *out, q8_prep_fn wprep, q8_prep_fn xprep, q8_core_fn core) {
    const int8_t *rows[2] = { w, w + (size_t)blocks * QBLOCK };
    const uint16_t *scales[2] = { w_scale, w_scale + blocks };
    __m256 acc[2][TILE_X_MAX];
    UNROLLED for (uint32_t r = 0; r < 2; r++) UNROLLED for (uint32_t t = 0; t < n_x; t++) acc[r][t] = _mm256_setzero_ps();
    uint32_t b = 0;
    for (; b + 8 <= blocks; b += 8) {
        prefetch(rows[0] + (size_t)b * QBLOCK, 8 * QBLOCK);
        prefetch(rows[1] + (size_t)b * QBLOCK, 8 * QBLOCK);
        __m256i h[2][TILE_X_MAX][4]; /* [row][vector][k]: hadd of blocks b + 2k, b + 2k + 1's lanes */
        UNROLLED for (uint32_t k = 0; k < 4; k++) {
            const size_t at = (size_t)(b + 2 * k) * QBLOCK;
            __m256i x0[TILE_X_MAX], x1[TILE_X_MAX];
            UNROLLED for (uint32_t t = 0; t < n_x; t++) {
                x0[t] = xprep(_mm256_loadu_si256((const __m256i *)(const void *)(xs[t].q + at)));
                x1[t] = xprep(_mm256_loadu_si256((const __m256i *)(const void *)(xs[t].q + at + QBLOCK)));
            }
            UNROLLED for (uint32_t r = 0; r < 2; r++) {
                const __m256i w0 = _mm256_loadu_si256((const __m256i *)(const void *)(rows[r] + at));
                const __m256i w1 = _mm256_loadu_si256((const __m256i *)(const void *)(rows[r] + at + QBLOCK));
                const __m256i p0 = wprep(w0), p1 = wprep(w1);
                UNROLLED for (uint32_t t = 0; t < n_x; t++)
                    h[r][t][k] = _mm256_hadd_epi32(core(w0, p0, x0[t]), core(w1, p1, x1[t]));
            }
        }
        UNROLLED for (uint32_t r = 0; r < 2; r++) UNROLLED for (uint32_t t = 0; t < n_x; t++)
            acc[r][t] = block_terms(acc[r][t], pair_hadds_total(h[r][t][0], h[r][t][1], h[r][t][2], h[r][t][3]),
                                    scales[r] + b, xs[t].scale + b);
    }
    UNROLLED for (uint32_t r = 0; r < 2; r++)
        UNROLLED for (uint32_t t = 0; t < n_x; t++) {
            if (b == blocks) {
                out[r * n_x + t] = sum8(acc[r][t]);
                continue;
            }
            float lanes[8];
            _mm256_storeu_ps(lanes, acc[r][t]);
            out[r * n_x + t] = q8_0_tail(lanes, rows[r], scales[r], &xs[t], b, blocks);
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
AVX2 float q4_0_tail(float acc[8], const uint8_t *w, const uint16_t *w_scale, const q8_vector *x, uint32_t b,
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

/* The Q4_0 tile: each 32-byte load of nibbles (two blocks) is split once for every vector, each x pair of blocks
 * arranged once for both rows, and reduced in dot_q4_0_x86's tree. */
AVX2 ALWAYS_INLINE void tile_q4_0_x86(const uint8_t *w, const uint16_t *w_scale, const q8_vector *xs, uint32_t n_x,
                                      uint32_t blocks, float *out, products2_fn products2) {
    const uint8_t *rows[2] = { w, w + (size_t)blocks * (QBLOCK / 2) };
    const uint16_t *scales[2] = { w_scale, w_scale + blocks };
    const __m256i mask = _mm256_set1_epi8(0x0F);
    const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7); /* the hadd tree leaves blocks 0 2 4 6 1 3 5 7 */
    __m256 acc[2][TILE_X_MAX];
    UNROLLED for (uint32_t r = 0; r < 2; r++) UNROLLED for (uint32_t t = 0; t < n_x; t++) acc[r][t] = _mm256_setzero_ps();
    uint32_t b = 0;
    for (; b + 8 <= blocks; b += 8) {
        prefetch(rows[0] + (size_t)b * (QBLOCK / 2), 8 * (QBLOCK / 2));
        prefetch(rows[1] + (size_t)b * (QBLOCK / 2), 8 * (QBLOCK / 2));
        __m256i h[2][TILE_X_MAX][2]; /* [row][vector][half]: hadd of the products of blocks b + 4 half .. + 3 */
        UNROLLED for (uint32_t half = 0; half < 2; half++) {
            __m256i p[2][TILE_X_MAX][2];
            UNROLLED for (uint32_t k = 0; k < 2; k++) {
                const uint32_t at = b + 4 * half + 2 * k; /* blocks at, at + 1 */
                __m256i x_lo[TILE_X_MAX], x_hi[TILE_X_MAX];
                UNROLLED for (uint32_t t = 0; t < n_x; t++) {
                    x_lo[t] = pair_x_lo(xs[t].q + (size_t)at * QBLOCK);
                    x_hi[t] = pair_x_hi(xs[t].q + (size_t)at * QBLOCK);
                }
                UNROLLED for (uint32_t r = 0; r < 2; r++) {
                    const __m256i bytes = _mm256_loadu_si256((const __m256i *)(const void *)(rows[r] + (size_t)at * (QBLOCK / 2)));
                    const __m256i lo = _mm256_and_si256(bytes, mask), hi = _mm256_and_si256(_mm256_srli_epi16(bytes, 4), mask);
                    UNROLLED for (uint32_t t = 0; t < n_x; t++) p[r][t][k] = products2(lo, x_lo[t], hi, x_hi[t]);
                }
            }
            UNROLLED for (uint32_t r = 0; r < 2; r++) UNROLLED for (uint32_t t = 0; t < n_x; t++)
                h[r][t][half] = _mm256_hadd_epi32(p[r][t][0], p[r][t][1]);
        }
        UNROLLED for (uint32_t t = 0; t < n_x; t++) {
            const __m256i eight_sums = _mm256_slli_epi32(_mm256_loadu_si256((const __m256i *)(const void *)(xs[t].sum + b)), 3);
            UNROLLED for (uint32_t r = 0; r < 2; r++) {
                const __m256i isum = _mm256_sub_epi32(
                    _mm256_permutevar8x32_epi32(_mm256_hadd_epi32(h[r][t][0], h[r][t][1]), order), eight_sums);
                acc[r][t] = block_terms(acc[r][t], isum, scales[r] + b, xs[t].scale + b);
            }
        }
    }
    UNROLLED for (uint32_t r = 0; r < 2; r++)
        UNROLLED for (uint32_t t = 0; t < n_x; t++) {
            if (b == blocks) {
                out[r * n_x + t] = sum8(acc[r][t]);
                continue;
            }
            float lanes[8];
            _mm256_storeu_ps(lanes, acc[r][t]);
            out[r * n_x + t] = q4_0_tail(lanes, rows[r], scales[r], &xs[t], b, blocks);
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
    TARGET void tile_q8_0_##set(const int8_t *w, const uint16_t *w_scale, const q8_vector *x, uint32_t blocks,       \
                                float out[4]) {                                                                       \
        tile_q8_0_x86(w, w_scale, x, 2, blocks, out, q8_wprep_##set, q8_xprep_##set, q8_core_##set);                  \
    }                                                                                                                 \
    TARGET void tile_q4_0_##set(const uint8_t *w, const uint16_t *w_scale, const q8_vector *x, uint32_t blocks,      \
                                float out[4]) {                                                                       \
        tile_q4_0_x86(w, w_scale, x, 2, blocks, out, products2);                                                      \
    }

QUANTIZED_ENTRIES(avx2, AVX2, products_avx2, products2_avx2)

QUANTIZED_ENTRIES(vnni, AVX512, products_vnni, products2_vnni)

#endif
