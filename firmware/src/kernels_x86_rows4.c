/* x86-64 runs of Q8_0 and Q4_0 rows by four vectors, the AVX-512 set's rows4_q8_0 and rows4_q4_0 (kernels_x86.c holds
 * the sets): a prefill batch's four tokens at a time, each result the rows kernel's bits (docs/KERNELS.md). */
#include "internal.h"
#include "x86.h"

#if defined(COLIBRI_X86_SIMD)
/* ---- Many rows by four vectors (the AVX-512 set): x transposed once a call ----
 * A dot's products make 8 int32 lanes per block, which the tiles above sum across lanes (hadd trees) for every
 * row and vector. Here each 8 blocks of x are stored once per call transposed: register g's lane p holds
 * elements 4g .. 4g + 3 of block ORDER[p], and each row's 8 blocks are transposed alike in registers (once for
 * the four vectors), so VPDPBUSD chained over g = 0..7 leaves block ORDER[p]'s integer sum in lane p, starting
 * from the offset the unsigned weights bring (-8 sum x for Q4_0's nibbles, -128 sum x for Q8_0's w + 128). The
 * float steps run in that lane order with the scales loaded in it. The blocks after the last 8 are one more group,
 * its missing blocks zeros whose lanes are left as they are (a masked add), so each present one still takes its
 * single step in lane b % 8 after the blocks before it; then the accumulators are put back in block order for the
 * tree: each result is the dot's bits. ORDER (0 2 4 6 1 3 5 7) is what 128-bit-lane transposes of blocks taken
 * two by two give. */
#define XT_GROUPS 12u /* 8-block groups a call transposes: 96 blocks (3,072 values), 15 KiB on the stack */
typedef struct {
    int8_t q[8][QBLOCK]; /* register g: lane p = block ORDER[p]'s elements 4g .. 4g + 3 */
    int32_t start[8];    /* lane p: the sum's start for block ORDER[p] */
    float d[8];          /* lane p: block ORDER[p]'s scale */
} xt_group;

/* 8 blocks of 32 bytes transposed: g[j] lane p = dword j of block ORDER[p]; only the first n blocks are read, the
 * others are zeros (masked loads never fault: what follows a matrix's last row may be past the image's end) */
AVX512 static inline void transpose_blocks8(const int8_t *v, uint32_t n, __m256i g[8]) {
    UNROLLED for (uint32_t i = 0; i < 4; i++) {
        const __m256i a = _mm256_maskz_loadu_epi32(2 * i < n ? 0xFF : 0, v + 2 * i * QBLOCK);
        const __m256i b = _mm256_maskz_loadu_epi32(2 * i + 1 < n ? 0xFF : 0, v + (2 * i + 1) * QBLOCK);
        g[i] = _mm256_permute2x128_si256(a, b, 0x20);
        g[4 + i] = _mm256_permute2x128_si256(a, b, 0x31);
    }
    transpose4(g);
    transpose4(g + 4);
}
AVX512 static inline __m256i xt_order(void) { return _mm256_setr_epi32(0, 2, 4, 6, 1, 3, 5, 7); }

/* The mask of the first n (at most 8) of 8 lanes. */
AVX512 static inline __mmask8 first_n(uint32_t n) { return (__mmask8)((1u << n) - 1u); }

/* x's groups for 4 vectors, the sums' start -bias * sum: each 8 blocks, then the blocks after the last 8 as a group
 * whose missing blocks are zeros (their lanes are never added: xt_rows) */
AVX512 static void transpose_x(xt_group *xt, const q8_vector *x, uint32_t blocks, int32_t bias) {
    const uint32_t groups = (blocks + 7) / 8;
    for (uint32_t t = 0; t < 4; t++)
        for (uint32_t k = 0; k < groups; k++) {
            xt_group *o = xt + t * groups + k;
            const uint32_t n = blocks - 8 * k < 8 ? blocks - 8 * k : 8;
            __m256i g[8];
            transpose_blocks8(x[t].q + (size_t)k * 8 * QBLOCK, n, g);
            UNROLLED for (uint32_t j = 0; j < 8; j++) _mm256_storeu_si256((__m256i *)(void *)o->q[j], g[j]);
            const __m256i sum = _mm256_permutevar8x32_epi32(_mm256_maskz_loadu_epi32(first_n(n), x[t].sum + 8 * k), xt_order());
            _mm256_storeu_si256((__m256i *)(void *)o->start, _mm256_mullo_epi32(sum, _mm256_set1_epi32(-bias)));
            _mm256_storeu_ps(o->d, _mm256_permutevar8x32_ps(_mm256_maskz_loadu_ps(first_n(n), x[t].scale + 8 * k), xt_order()));
        }
}

/* A row's 8 blocks from block b as the unsigned bytes VPDPBUSD takes, in x's transposed order; only the first n
 * blocks are read, the others are zeros (their lanes are never added: xt_group_terms). */
typedef void (*xt_weights_fn)(const void *row, uint32_t b, uint32_t n, __m256i u[8]);
AVX512 ALWAYS_INLINE void xt_weights_q4_0(const void *row, uint32_t b, uint32_t n, __m256i u[8]) {
    const uint8_t *w = (const uint8_t *)row + (size_t)b * (QBLOCK / 2);
    const __m256i mask = _mm256_set1_epi8(0x0F);
    __m256i a[4]; /* blocks 2i (lane 0) and 2i + 1 (lane 1): transposed, dword j of blocks 0 2 4 6 | 1 3 5 7 */
    UNROLLED for (uint32_t i = 0; i < 4; i++)
        a[i] = _mm256_maskz_loadu_epi32((__mmask8)((2 * i < n ? 0x0F : 0) | (2 * i + 1 < n ? 0xF0 : 0)), w + 32 * i);
    transpose4(a);
    UNROLLED for (uint32_t j = 0; j < 4; j++) { /* low nibbles: elements 4j ..; high: 16 + 4j .. */
        u[j] = _mm256_and_si256(a[j], mask);
        u[4 + j] = _mm256_and_si256(_mm256_srli_epi16(a[j], 4), mask);
    }
}
AVX512 ALWAYS_INLINE void xt_weights_q8_0(const void *row, uint32_t b, uint32_t n, __m256i u[8]) {
    transpose_blocks8((const int8_t *)row + (size_t)b * QBLOCK, n, u);
    UNROLLED for (uint32_t j = 0; j < 8; j++) u[j] = _mm256_xor_si256(u[j], _mm256_set1_epi8(-128)); /* w + 128 */
}

/* Group k of two rows (its first n blocks) into their four vectors' accumulators, lane p += block ORDER[p]'s term:
 * every lane of a whole group, and of the last group only those of its n blocks, each block's one step in its
 * lane b % 8 after the blocks before it, as the dot adds it. Inlined twice: with n = 8 for the whole groups, where
 * the masks fold away, and for the last group (one body with run-time masks slowed the whole groups). */
AVX512 ALWAYS_INLINE void xt_group_terms(const uint8_t *const row[2], const uint16_t *const scale[2], const xt_group *xt,
                                         uint32_t stride, uint32_t k, uint32_t n, __m256 acc[2][4],
                                         xt_weights_fn weights) {
    const __mmask8 lanes = _mm256_cmpgt_epi32_mask(_mm256_set1_epi32((int32_t)n), xt_order());
    __m256i u[2][8];
    __m256 wd[2];
    UNROLLED for (uint32_t i = 0; i < 2; i++) {
        weights(row[i], 8 * k, n, u[i]);
        const __m128i h = n == 8 ? _mm_loadu_si128((const __m128i *)(const void *)(scale[i] + 8 * k))
                                 : _mm_maskz_loadu_epi16(first_n(n), scale[i] + 8 * k);
        wd[i] = _mm256_permutevar8x32_ps(_mm256_cvtph_ps(h), xt_order());
    }
    UNROLLED for (uint32_t t = 0; t < 4; t++) {
        const xt_group *g = xt + t * stride + k;
        const __m256 xd = _mm256_loadu_ps(g->d);
        UNROLLED for (uint32_t i = 0; i < 2; i++) {
            /* two chains (elements 0-15, 16-31), half the latency */
            __m256i lo = _mm256_loadu_si256((const __m256i *)(const void *)g->start), hi = _mm256_setzero_si256();
            UNROLLED for (uint32_t j = 0; j < 4; j++) {
                lo = _mm256_dpbusd_epi32(lo, u[i][j], _mm256_loadu_si256((const __m256i *)(const void *)g->q[j]));
                hi = _mm256_dpbusd_epi32(hi, u[i][4 + j], _mm256_loadu_si256((const __m256i *)(const void *)g->q[4 + j]));
            }
            const __m256 term = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_add_epi32(lo, hi)), _mm256_mul_ps(wd[i], xd));
            acc[i][t] = n == 8 ? _mm256_add_ps(acc[i][t], term) : _mm256_mask_add_ps(acc[i][t], lanes, acc[i][t], term);
        }
    }
}

/* Rows [0, rows) (an even count) of w times x[0..3], out[t * out_stride + r]; x's groups already in xt (stride of
 * them a vector), the blocks after the last 8 the last one. */
AVX512 ALWAYS_INLINE void xt_rows(const uint8_t *w, const uint16_t *w_scale, const xt_group *xt, uint32_t blocks,
                                  uint32_t rows, float *out, size_t out_stride, size_t block_bytes, xt_weights_fn weights) {
    const size_t row_bytes = blocks * block_bytes;
    const uint32_t groups = blocks / 8, left = blocks % 8, stride = groups + (left != 0);
    const __m256i back = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7); /* lane k from lane p with ORDER[p] = k */
    for (uint32_t r = 0; r < rows; r += 2) {
        const uint8_t *const row[2] = { w + r * row_bytes, w + (r + 1) * row_bytes };
        const uint16_t *const scale[2] = { w_scale + (size_t)r * blocks, w_scale + (size_t)(r + 1) * blocks };
        __m256 acc[2][4];
        UNROLLED for (uint32_t i = 0; i < 2; i++) UNROLLED for (uint32_t t = 0; t < 4; t++) acc[i][t] = _mm256_setzero_ps();
        for (uint32_t k = 0; k < groups; k++) {
            prefetch(row[0] + (size_t)k * 8 * block_bytes, 8 * block_bytes);
            prefetch(row[1] + (size_t)k * 8 * block_bytes, 8 * block_bytes);
            xt_group_terms(row, scale, xt, stride, k, 8, acc, weights);
        }
        if (left) xt_group_terms(row, scale, xt, stride, groups, left, acc, weights);
        UNROLLED for (uint32_t i = 0; i < 2; i++)
            UNROLLED for (uint32_t t = 0; t < 4; t++) out[t * out_stride + r + i] = sum8(_mm256_permutevar8x32_ps(acc[i][t], back));
    }
}

/* Rows [0, rows) (even) of w times x[0..3] into out[t * out_stride + r]: transposed as above when x's blocks fit
 * the stack's groups, else through the 2 x 2 tile. */
#define XT_ROWS(name, TYPE, bytes_per_block, bias)                                                                   \
    AVX512 void rows4_##name##_vnni(const TYPE *w, const uint16_t *w_scale, const q8_vector *x, uint32_t blocks,      \
                                    uint32_t rows, float *out, size_t out_stride) {                                   \
        const size_t row_bytes = (size_t)blocks * (bytes_per_block);                                                  \
        if (blocks < 8 || blocks > 8 * XT_GROUPS) {                                                                   \
            for (uint32_t r = 0; r < rows; r += 2) {                                                                  \
                for (uint32_t t = 0; t < 4; t += 2) {                                                                 \
                    float o[4];                                                                                       \
                    tile_##name##_vnni(w + r * row_bytes / sizeof(TYPE), w_scale + (size_t)r * blocks, x + t, blocks, o); \
                    out[t * out_stride + r] = o[0];                                                                   \
                    out[(t + 1) * out_stride + r] = o[1];                                                             \
                    out[t * out_stride + r + 1] = o[2];                                                               \
                    out[(t + 1) * out_stride + r + 1] = o[3];                                                         \
                }                                                                                                     \
            }                                                                                                         \
            return;                                                                                                   \
        }                                                                                                             \
        xt_group xt[4 * XT_GROUPS];                                                                                   \
        transpose_x(xt, x, blocks, bias);                                                                             \
        xt_rows((const uint8_t *)w, w_scale, xt, blocks, rows, out, out_stride, bytes_per_block, xt_weights_##name);  \
    }
XT_ROWS(q4_0, uint8_t, QBLOCK / 2, 8)
XT_ROWS(q8_0, int8_t, QBLOCK, 128)
#endif
