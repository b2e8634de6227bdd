/* x86-64 runs of K-quant rows by four vectors, the AVX2 and AVX-512 sets' rows4_q4_k, rows4_q5_k and rows4_q6_k
 * (kernels_x86.c holds the sets): a prefill batch's four tokens at a time, each result the rows kernel's bits
 * (kernels_x86_block.c's rows_q4_k ... rows_q6_k; docs/KERNELS.md). */
#include "internal.h"
#include "x86.h"

#if defined(COLIBRI_X86_SIMD) && WITH_BLOCK_DTYPES
/* x transposed once a call, as kernels_x86_rows4.c does for Q8_0 and Q4_0, so that the integer core's chains leave
 * sums in lanes, no horizontal sums: each K-quant block's 8 sub-blocks are taken as two sets of four, P[0..3] and P[4..7], the order
 * in which the block's bytes give them after one 4 x 4 dword transpose (Q4_K, Q5_K: qs's 32-byte chunks i hold sub-blocks
 * 2i and 2i + 1 as low and high nibbles, so P = 0 2 4 6 1 3 5 7; Q6_K: ql's chunks i hold sub-blocks 4(i / 2) +
 * (i & 1) and that + 2, so P = 0 1 4 5 2 3 6 7). x's blocks are stored transposed alike: register j < 4 lane
 * (L, i) (128-bit lane L, dword i) holds elements 4(4L + j) .. + 3 of block P[i], register 4 + j those of block
 * P[4 + i]. The chain over j = 0..3 of each set leaves in lane (L, i) the sum of the 16 elements 16L .. 16L + 15
 * of its sub-block, so the two halves of each 128-bit lane added give sub-block P[p]'s integer sum in lane p, and
 * Q6_K's halves, each with its own int8 scale, are multiplied by it before (its "- 32" the chain's start: -32 times
 * the half's x sum, made once per call). The float steps then run lane by lane in P's order, and the accumulators
 * are put back in block order before the tree: each result is the rows kernel's bits. */
#define KT_GROUPS 12u /* 256-element blocks of x transposed at once: 3,072 values, 16.5 KiB on the stack */
typedef struct {
    int8_t q[8][QBLOCK]; /* as above: register j < 4 from blocks P[0..3], 4 + j from P[4..7] */
    union {
        int32_t s[2][8]; /* Q6_K: the two chains' starts, lane (L, i) -32 x the half's sum */
        float sum[8];    /* Q4_K, Q5_K: lane p block P[p]'s x sum, as the float the offset step converts it to (exact) */
    };
    float d[8];          /* lane p: block P[p]'s scale */
} kt_group;
static const int32_t KT_P[2][8] = { { 0, 2, 4, 6, 1, 3, 5, 7 }, { 0, 1, 4, 5, 2, 3, 6, 7 } }; /* Q4_K, Q6_K */
static const int32_t KT_BACK[2][8] = { { 0, 4, 1, 5, 2, 6, 3, 7 }, { 0, 1, 4, 5, 2, 3, 6, 7 } }; /* lane k from p: P[p] = k */

/* Two chain steps: acc plus, per int32 lane, the four neighbouring products of unsigned u0 and signed s0 and those of
 * u1 and s1 (the set's integer core, exact: u <= 63, s >= -127; AVX2 adds the two maddubs pairs in int16, at most
 * 4 x 63 x 127 = 32,004). */
typedef __m256i (*chain2_fn)(__m256i acc, __m256i u0, __m256i s0, __m256i u1, __m256i s1);
AVX2 static inline __m256i chain2_avx2(__m256i acc, __m256i u0, __m256i s0, __m256i u1, __m256i s1) {
    return _mm256_add_epi32(acc, products2_avx2(u0, s0, u1, s1));
}
AVX512 static inline __m256i chain2_vnni(__m256i acc, __m256i u0, __m256i s0, __m256i u1, __m256i s1) {
    return _mm256_dpbusd_epi32(_mm256_dpbusd_epi32(acc, u0, s0), u1, s1);
}

/* x[0..3]'s `groups` 256-element blocks transposed (q6: Q6_K's P and starts, else Q4_K's and Q5_K's). */
AVX2 ALWAYS_INLINE void kt_transpose(kt_group *xt, const q8_vector *x, uint32_t groups, int q6, chain2_fn chain2) {
    const int32_t *P = KT_P[q6];
    const __m256i perm = _mm256_loadu_si256((const __m256i *)(const void *)P);
    for (uint32_t t = 0; t < 4; t++)
        for (uint32_t k = 0; k < groups; k++) {
            kt_group *o = xt + t * groups + k;
            const int8_t *v = x[t].q + (size_t)k * 8 * QBLOCK;
            __m256i a[8];
            UNROLLED for (uint32_t i = 0; i < 8; i++) a[i] = load32(v + (size_t)P[i] * QBLOCK);
            transpose4(a);
            transpose4(a + 4);
            UNROLLED for (uint32_t j = 0; j < 8; j++) _mm256_storeu_si256((__m256i *)(void *)o->q[j], a[j]);
            _mm256_storeu_ps(o->d, _mm256_permutevar8x32_ps(_mm256_loadu_ps(x[t].scale + 8 * k), perm));
            if (q6) {
                UNROLLED for (uint32_t h = 0; h < 2; h++) {
                    __m256i sum = _mm256_setzero_si256();
                    UNROLLED for (uint32_t j = 0; j < 4; j += 2)
                        sum = chain2(sum, _mm256_set1_epi8(1), a[4 * h + j], _mm256_set1_epi8(1), a[4 * h + j + 1]);
                    _mm256_storeu_si256((__m256i *)(void *)o->s[h], _mm256_mullo_epi32(sum, _mm256_set1_epi32(-32)));
                }
            } else {
                _mm256_storeu_ps(o->sum, _mm256_cvtepi32_ps(_mm256_permutevar8x32_epi32(load32(x[t].sum + 8 * k), perm)));
            }
        }
}

/* One Q4_K block's unsigned values in the transposed order (u[j]: from sub-blocks P[0..3], u[4 + j]: P[4..7]). */
AVX2 ALWAYS_INLINE void kt_weights_q4_k(const uint8_t *blk, __m256i u[8]) {
    const __m256i mask = _mm256_set1_epi8(0x0F);
    __m256i c[4];
    UNROLLED for (uint32_t i = 0; i < 4; i++) c[i] = load32(blk + 16 + 32 * i);
    transpose4(c);
    UNROLLED for (uint32_t j = 0; j < 4; j++) {
        u[j] = _mm256_and_si256(c[j], mask);
        u[4 + j] = _mm256_and_si256(_mm256_srli_epi16(c[j], 4), mask);
    }
}
/* One Q5_K block's: Q4_K's nibbles (at blk + 48), bit 4 of sub-block s's element l in bit s of qh[l]: lane (L, i) of
 * register j takes qh's dword 4L + j (a shuffle), shifted right by P's sub-block (2i, 2i + 1) and left by 4. */
AVX2 ALWAYS_INLINE void kt_weights_q5_k(const uint8_t *blk, __m256i u[8]) {
    const __m256i mask = _mm256_set1_epi8(0x0F), bit4 = _mm256_set1_epi8(0x10), qh = load32(blk + 16);
    const __m256i even = _mm256_setr_epi32(0, 2, 4, 6, 0, 2, 4, 6), odd = _mm256_setr_epi32(1, 3, 5, 7, 1, 3, 5, 7);
    __m256i c[4], h[4] = { _mm256_shuffle_epi32(qh, 0x00), _mm256_shuffle_epi32(qh, 0x55), _mm256_shuffle_epi32(qh, 0xAA),
                           _mm256_shuffle_epi32(qh, 0xFF) };
    UNROLLED for (uint32_t i = 0; i < 4; i++) c[i] = load32(blk + 48 + 32 * i);
    transpose4(c);
    UNROLLED for (uint32_t j = 0; j < 4; j++) {
        u[j] = _mm256_or_si256(_mm256_and_si256(c[j], mask),
                               _mm256_and_si256(_mm256_slli_epi32(_mm256_srlv_epi32(h[j], even), 4), bit4));
        u[4 + j] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(c[j], 4), mask),
                                   _mm256_and_si256(_mm256_slli_epi32(_mm256_srlv_epi32(h[j], odd), 4), bit4));
    }
}
/* One Q6_K block's 6-bit values (0..63) so, and the int8 scales of the chains' lanes: lane (L, i) of the first set
 * is the half L of sub-block P[i] (scale 2 P[i] + L), of the second P[4 + i]'s. A lane's top bits are qh's bits 2k,
 * 2k + 1 (k = the sub-block's 4n + k), moved to bits 4, 5 by a dword shift per lane (the bits it brings from the
 * neighbouring byte masked off). */
AVX2 ALWAYS_INLINE void kt_weights_q6_k(const uint8_t *blk, __m256i u[8], __m256i sc[2]) {
    const __m256i mask = _mm256_set1_epi8(0x0F), top = _mm256_set1_epi8(0x30);
    __m256i l[4], h[4];
    UNROLLED for (uint32_t i = 0; i < 4; i++) {
        l[i] = load32(blk + 32 * i);
        h[i] = load32(blk + 128 + 32 * (i / 2));
    }
    transpose4(l);
    transpose4(h);
    const __m256i up = _mm256_setr_epi32(4, 2, 4, 2, 4, 2, 4, 2), down = _mm256_setr_epi32(0, 2, 0, 2, 0, 2, 0, 2);
    UNROLLED for (uint32_t j = 0; j < 4; j++) {
        u[j] = _mm256_or_si256(_mm256_and_si256(l[j], mask), _mm256_and_si256(_mm256_sllv_epi32(h[j], up), top));
        u[4 + j] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l[j], 4), mask),
                                   _mm256_and_si256(_mm256_srlv_epi32(h[j], down), top));
    }
    const __m128i s = _mm_shuffle_epi8(_mm_loadu_si128((const __m128i *)(const void *)(blk + 192)),
                                       _mm_setr_epi8(0, 2, 8, 10, 1, 3, 9, 11, 4, 6, 12, 14, 5, 7, 13, 15));
    sc[0] = _mm256_cvtepi8_epi32(s);
    sc[1] = _mm256_cvtepi8_epi32(_mm_srli_si128(s, 8));
}

/* Rows [0, rows) of a K-quant matrix (`bytes` per block) times x[0..3] into out[t * out_stride + r], each read once.
 * x longer than the KT_GROUPS blocks a transpose holds is taken in segments of them, KT_ROWS rows at a time: each
 * row's accumulators kept on the stack between segments, so every lane adds its blocks in the same order. */
#define KT_ROWS 16u
AVX2 ALWAYS_INLINE void kt_rows(const uint8_t *w, const q8_vector *x, uint32_t blocks, uint32_t rows, float *out,
                                size_t out_stride, size_t bytes, int q6, int q5, chain2_fn chain2) {
    const uint32_t groups = blocks / 8;
    const size_t row_bytes = (size_t)groups * bytes;
    kt_group xt[4 * KT_GROUPS];
    __m256 kept[KT_ROWS][4];
    const uint32_t run = groups <= KT_GROUPS ? rows : KT_ROWS; /* rows a transposed segment serves */
    for (uint32_t r = 0; r < rows && !groups; r++) /* no blocks (never in an image): the empty tree's +0 */
        for (uint32_t t = 0; t < 4; t++) out[t * out_stride + r] = 0.0f;
    for (uint32_t r0 = 0; r0 < rows; r0 += run) {
        const uint32_t r1 = rows - r0 < run ? rows : r0 + run;
        for (uint32_t s0 = 0; s0 < groups; s0 += KT_GROUPS) {
            const uint32_t s1 = groups - s0 < KT_GROUPS ? groups : s0 + KT_GROUPS, n = s1 - s0;
            q8_vector xs[4];
            for (uint32_t t = 0; t < 4; t++)
                xs[t] = (q8_vector){ x[t].q + (size_t)s0 * 8 * QBLOCK, x[t].scale + (size_t)s0 * 8, x[t].sum + (size_t)s0 * 8 };
            kt_transpose(xt, xs, n, q6, chain2);
            for (uint32_t r = r0; r < r1; r++) {
                const uint8_t *row = w + (size_t)r * row_bytes + (size_t)s0 * bytes;
                __m256 acc[4];
                if (s0)
                    UNROLLED for (uint32_t t = 0; t < 4; t++) acc[t] = kept[r - r0][t];
                else
                    UNROLLED for (uint32_t t = 0; t < 4; t++) acc[t] = _mm256_setzero_ps();
                for (uint32_t k = 0; k < n; k++) {
                    const uint8_t *blk = row + (size_t)k * bytes;
                    prefetch(blk, bytes);
                    __m256i u[8], sc[2];
                    __m256 a, c = _mm256_setzero_ps();
                    if (q6) {
                        kt_weights_q6_k(blk, u, sc);
                        q6_k_factors(blk, &a, &c);
                    } else {
                        if (q5) kt_weights_q5_k(blk, u);
                        else kt_weights_q4_k(blk, u);
                        k4_factors(blk, &a, &c);
                        const __m256i perm = _mm256_loadu_si256((const __m256i *)(const void *)KT_P[q6]);
                        a = _mm256_permutevar8x32_ps(a, perm);
                        c = _mm256_permutevar8x32_ps(c, perm);
                    }
                    UNROLLED for (uint32_t t = 0; t < 4; t++) {
                        const kt_group *g = xt + t * n + k;
                        __m256i lo = q6 ? load32(g->s[0]) : _mm256_setzero_si256();
                        __m256i hi = q6 ? load32(g->s[1]) : _mm256_setzero_si256();
                        UNROLLED for (uint32_t j = 0; j < 4; j += 2) {
                            lo = chain2(lo, u[j], load32(g->q[j]), u[j + 1], load32(g->q[j + 1]));
                            hi = chain2(hi, u[4 + j], load32(g->q[4 + j]), u[5 + j], load32(g->q[5 + j]));
                        }
                        if (q6) {
                            lo = _mm256_mullo_epi32(lo, sc[0]);
                            hi = _mm256_mullo_epi32(hi, sc[1]);
                        }
                        const __m256i isum = _mm256_add_epi32(_mm256_permute2x128_si256(lo, hi, 0x20),
                                                              _mm256_permute2x128_si256(lo, hi, 0x31));
                        /* block_step's operations, operand for operand, with x's scale and sum in lane order */
                        const __m256 xd = _mm256_loadu_ps(g->d);
                        __m256 tt = _mm256_mul_ps(_mm256_cvtepi32_ps(isum), _mm256_mul_ps(a, xd));
                        if (!q6) tt = _mm256_add_ps(tt, _mm256_mul_ps(_mm256_loadu_ps(g->sum), _mm256_mul_ps(c, xd)));
                        acc[t] = _mm256_add_ps(acc[t], tt);
                    }
                }
                if (s1 < groups)
                    UNROLLED for (uint32_t t = 0; t < 4; t++) kept[r - r0][t] = acc[t];
                else
                    UNROLLED for (uint32_t t = 0; t < 4; t++)
                        out[t * out_stride + r] = sum8(_mm256_permutevar8x32_ps(acc[t], load32(KT_BACK[q6])));
            }
        }
    }
}
#define K_ROWS4(name, set, TARGET, q6, q5, bytes)                                                                    \
    TARGET void rows4_##name##_##set(const uint8_t *w, const q8_vector *x, uint32_t blocks, uint32_t rows, float *out, \
                                     size_t out_stride) {                                                            \
        kt_rows(w, x, blocks, rows, out, out_stride, bytes, q6, q5, chain2_##set);                                  \
    }
K_ROWS4(q4_k, avx2, AVX2, 0, 0, DTYPE_BYTES_Q4_K)
K_ROWS4(q5_k, avx2, AVX2, 0, 1, DTYPE_BYTES_Q5_K)
K_ROWS4(q6_k, avx2, AVX2, 1, 0, DTYPE_BYTES_Q6_K)
K_ROWS4(q4_k, vnni, AVX512, 0, 0, DTYPE_BYTES_Q4_K)
K_ROWS4(q5_k, vnni, AVX512, 0, 1, DTYPE_BYTES_Q5_K)
K_ROWS4(q6_k, vnni, AVX512, 1, 0, DTYPE_BYTES_Q6_K)
#endif
