/* x86-64 kernels: AVX2 (with F16C), chosen at open by CPUID, so one binary also runs on a CPU
 * without AVX2 (it then uses the scalar set). Each function computes exactly what its scalar twin
 * in kernels.c computes (docs/KERNELS.md): float lanes i % 16 in two 8-wide registers, quantized
 * block terms in lane b % 8, products and sums rounded separately (no FMA), the same final tree. */
#include "internal.h"
#include "x86.h"

#if defined(COLIBRI_X86_SIMD)
#define AVX2 X86_TARGET("avx2,f16c")

/* Quantized weights stream through once per token: asking for them this far ahead keeps more
 * cache-line fills in flight than the hardware prefetcher does for one stream (docs/PERFORMANCE.md:
 * 4 KiB ahead lifts Q8_0 from 57% to 65-70% of the triad, Q4_0 from 43% to 52%; the float kernels
 * gained nothing). A hint only: it never faults, even past the end of the image, and changes no result. */
#define PREFETCH_AHEAD 4096
static inline void prefetch(const void *p, size_t bytes) {
    for (size_t off = 0; off < bytes; off += 64) x86_prefetch((const char *)p + PREFETCH_AHEAD + off);
}

/* Loaders of 8 weights as f32 (exact widening), and of one weight for the tail. */
AVX2 static __m256 load8_f32(const void *w, uint32_t i) { return _mm256_loadu_ps((const float *)w + i); }
AVX2 static __m256 load8_f16(const void *w, uint32_t i) {
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)((const uint16_t *)w + i)));
}
AVX2 static __m256 load8_bf16(const void *w, uint32_t i) {
    __m256i wide = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(const void *)((const uint16_t *)w + i)));
    return _mm256_castsi256_ps(_mm256_slli_epi32(wide, 16));
}
static float one_f32(const void *w, uint32_t i) { return ((const float *)w)[i]; }
static float one_f16(const void *w, uint32_t i) { return f16_to_f32(((const uint16_t *)w)[i]); }
static float one_bf16(const void *w, uint32_t i) { return bf16_to_f32(((const uint16_t *)w)[i]); }

/* sum_lanes8 of a register without leaving registers: the same additions, the same operands in the same
 * order (so even a NaN's payload is the scalar tree's). sum16: sum_lanes16 of lanes 0-7 in a, 8-15 in b. */
AVX2 static float sum8(__m256 acc) {
    const __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps(acc, 1)); /* acc[i] + acc[i + 4] */
    const __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));                                  /* s4[i] + s4[i + 2] */
    return _mm_cvtss_f32(_mm_add_ss(s2, _mm_shuffle_ps(s2, s2, 1)));                         /* s2[0] + s2[1] */
}
AVX2 static float sum16(__m256 a, __m256 b) { return sum8(_mm256_add_ps(a, b)); }

/* Elements [i, n) after the last whole 16 into lanes j % 16, then the tree: the scalar kernel's own steps. */
AVX2 ALWAYS_INLINE float lanes16_tail(float acc[16], const void *w, const float *x, uint32_t i, uint32_t n,
                                 float (*one)(const void *, uint32_t)) {
    for (; i < n; i++) acc[i % 16] += one(w, i) * x[i];
    return sum_lanes16(acc);
}

/* The 16-lane float dot: lanes 0-7 and 8-15 in two registers. Always inlined with constant loaders,
 * so each dtype gets its own loop with the loads in place. */
AVX2 ALWAYS_INLINE float dot_lanes16(const void *w, const float *x, uint32_t n,
                                                                     __m256 (*load8)(const void *, uint32_t),
                                                                     float (*one)(const void *, uint32_t)) {
    __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
    uint32_t i = 0;
    for (; i + 16 <= n; i += 16) {
        a0 = _mm256_add_ps(a0, _mm256_mul_ps(load8(w, i), _mm256_loadu_ps(x + i)));
        a1 = _mm256_add_ps(a1, _mm256_mul_ps(load8(w, i + 8), _mm256_loadu_ps(x + i + 8)));
    }
    if (i == n) return sum16(a0, a1);
    float acc[16];
    _mm256_storeu_ps(acc, a0);
    _mm256_storeu_ps(acc + 8, a1);
    return lanes16_tail(acc, w, x, i, n, one);
}

/* Two rows (w0, w1) times two vectors (x0, x1) in the same 16 lanes, so each of the four is dot_lanes16's
 * bits: every weight and x register serves two products. out = { w0.x0, w0.x1, w1.x0, w1.x1 }. */
AVX2 ALWAYS_INLINE void tile_lanes16(const void *w0, const void *w1, const float *x0,
                                                                    const float *x1, uint32_t n, float out[4],
                                                                    __m256 (*load8)(const void *, uint32_t),
                                                                    float (*one)(const void *, uint32_t)) {
    /* pair (w0x0, w0x1, w1x0, w1x1): lanes 0-7 in a*, 8-15 in b* (named: an array would live in memory) */
    __m256 a00 = _mm256_setzero_ps(), a01 = a00, a10 = a00, a11 = a00, b00 = a00, b01 = a00, b10 = a00, b11 = a00;
    uint32_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m256 r0 = load8(w0, i), r1 = load8(w1, i), u = _mm256_loadu_ps(x0 + i), v = _mm256_loadu_ps(x1 + i);
        a00 = _mm256_add_ps(a00, _mm256_mul_ps(r0, u));
        a01 = _mm256_add_ps(a01, _mm256_mul_ps(r0, v));
        a10 = _mm256_add_ps(a10, _mm256_mul_ps(r1, u));
        a11 = _mm256_add_ps(a11, _mm256_mul_ps(r1, v));
        r0 = load8(w0, i + 8);
        r1 = load8(w1, i + 8);
        u = _mm256_loadu_ps(x0 + i + 8);
        v = _mm256_loadu_ps(x1 + i + 8);
        b00 = _mm256_add_ps(b00, _mm256_mul_ps(r0, u));
        b01 = _mm256_add_ps(b01, _mm256_mul_ps(r0, v));
        b10 = _mm256_add_ps(b10, _mm256_mul_ps(r1, u));
        b11 = _mm256_add_ps(b11, _mm256_mul_ps(r1, v));
    }
    const __m256 acc[8] = { a00, b00, a01, b01, a10, b10, a11, b11 };
    const void *w[2] = { w0, w1 };
    const float *x[2] = { x0, x1 };
    for (int p = 0; p < 4; p++) {
        if (i == n) {
            out[p] = sum16(acc[2 * p], acc[2 * p + 1]);
            continue;
        }
        float lanes[16];
        _mm256_storeu_ps(lanes, acc[2 * p]);
        _mm256_storeu_ps(lanes + 8, acc[2 * p + 1]);
        out[p] = lanes16_tail(lanes, w[p / 2], x[p % 2], i, n, one);
    }
}

AVX2 static float dot_f32_avx2(const float *w, const float *x, uint32_t n) { return dot_lanes16(w, x, n, load8_f32, one_f32); }
AVX2 static void tile_f32_avx2(const float *w, const float *x0, const float *x1, uint32_t n, float out[4]) {
    tile_lanes16(w, w + n, x0, x1, n, out, load8_f32, one_f32);
}
AVX2 static void tile_f16_avx2(const uint16_t *w, const float *x0, const float *x1, uint32_t n, float out[4]) {
    tile_lanes16(w, w + n, x0, x1, n, out, load8_f16, one_f16);
}
AVX2 static void tile_bf16_avx2(const uint16_t *w, const float *x0, const float *x1, uint32_t n, float out[4]) {
    tile_lanes16(w, w + n, x0, x1, n, out, load8_bf16, one_bf16);
}
AVX2 static float dot_f16_avx2(const uint16_t *w, const float *x, uint32_t n) { return dot_lanes16(w, x, n, load8_f16, one_f16); }
AVX2 static float dot_bf16_avx2(const uint16_t *w, const float *x, uint32_t n) { return dot_lanes16(w, x, n, load8_bf16, one_bf16); }

/* The integer core of the quantized kernels, one per instruction set: 32 unsigned bytes u times 32 signed
 * bytes s, each int32 lane the sum of four neighbouring products (VPDPBUSD's arithmetic; AVX2 adds pairs in
 * int16 first: exact, as every u here is <= 128 and every s >= -127, the activation quantizer never giving
 * -128, so a pair stays below maddubs' int16 saturation). products2 adds two such: u0 s0 + u1 s1 (with
 * u <= 15, a Q4_0 nibble, AVX2 adds them in int16 too). Integer sums are exact in any order, so both
 * sets' kernels give the same bits. */
typedef __m256i (*products_fn)(__m256i u, __m256i s);
typedef __m256i (*products2_fn)(__m256i u0, __m256i s0, __m256i u1, __m256i s1);
AVX2 static __m256i products_avx2(__m256i u, __m256i s) {
    return _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1));
}
AVX2 static __m256i products2_avx2(__m256i u0, __m256i s0, __m256i u1, __m256i s1) {
    return _mm256_madd_epi16(_mm256_add_epi16(_mm256_maddubs_epi16(u0, s0), _mm256_maddubs_epi16(u1, s1)),
                             _mm256_set1_epi16(1));
}

/* A Q8_0 block's products: |w| (unsigned) times x with w's sign. */
AVX2 ALWAYS_INLINE __m256i block_products(__m256i w, __m256i x, products_fn products) {
    return products(_mm256_sign_epi8(w, w), _mm256_sign_epi8(x, w));
}

/* The sum of the 8 int32 lanes of one block: for the blocks after the last multiple of 8. */
AVX2 static int32_t block_total(__m256i p) {
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(p), _mm256_extracti128_si256(p, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4E));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xB1));
    return _mm_cvtsi128_si32(s);
}

/* The integer sums of 8 blocks (each 8 int32 lanes) as one vector, block k in lane k. */
AVX2 static __m256i block_totals(const __m256i p[8]) {
    __m256i h01 = _mm256_hadd_epi32(p[0], p[1]), h23 = _mm256_hadd_epi32(p[2], p[3]);
    __m256i h45 = _mm256_hadd_epi32(p[4], p[5]), h67 = _mm256_hadd_epi32(p[6], p[7]);
    __m256i lo4 = _mm256_hadd_epi32(h01, h23), hi4 = _mm256_hadd_epi32(h45, h67);
    return _mm256_add_epi32(_mm256_permute2x128_si256(lo4, hi4, 0x20), _mm256_permute2x128_si256(lo4, hi4, 0x31));
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
#define QUANTIZED_ENTRIES(set, TARGET, products, products2)                                                       \
    TARGET static float dot_q8_0_##set(const void *w, const uint16_t *w_scale, const q8_vector *x, uint32_t blocks) { \
        return dot_q8_0_x86(w, w_scale, x, blocks, products);                                                    \
    }                                                                                                             \
    TARGET static float dot_q4_0_##set(const void *w, const uint16_t *w_scale, const q8_vector *x, uint32_t blocks) { \
        return dot_q4_0_x86(w, w_scale, x, blocks, products2, 0);                                                \
    }                                                                                                             \
    TARGET static float dot_q4_0_##set##_paired(const void *w, const uint16_t *w_scale, const q8_vector *x,       \
                                                uint32_t blocks) {                                                \
        return dot_q4_0_x86(w, w_scale, x, blocks, products2, 1);                                                \
    }                                                                                                             \
    TARGET static void rows_q8_0_##set(const int8_t *w, const uint16_t *w_scale, const q8_vector *x, uint32_t blocks, \
                                       uint32_t rows, float *out) {                                               \
        dot_rows(w, w_scale, x, blocks, rows, (size_t)blocks * QBLOCK, out, dot_q8_0_##set);                      \
    }                                                                                                             \
    TARGET static void rows_q4_0_##set(const uint8_t *w, const uint16_t *w_scale, const q8_vector *x, uint32_t blocks, \
                                       uint32_t rows, float *out) {                                               \
        rows_q4_0_x86(w, w_scale, x, blocks, rows, out, dot_q4_0_##set, dot_q4_0_##set##_paired);                 \
    }                                                                                                             \
    TARGET static void tile_q8_0_##set(const int8_t *w, const uint16_t *w_scale, const q8_vector *x0,             \
                                       const q8_vector *x1, uint32_t blocks, float out[4]) {                      \
        tile_q8_0_x86(w, w_scale, x0, x1, blocks, out, products);                                                 \
    }                                                                                                             \
    TARGET static void tile_q4_0_##set(const uint8_t *w, const uint16_t *w_scale, const q8_vector *x0,            \
                                       const q8_vector *x1, uint32_t blocks, float out[4]) {                      \
        tile_q4_0_x86(w, w_scale, x0, x1, blocks, out, products2);                                                \
    }

/* Lanes i..i+7 of a block of len values; lanes past len load +0 (masked: nothing past them is read). */
AVX2 static __m256 block_lanes8(const float *v, uint32_t i, uint32_t len) {
    const __m256i lane = _mm256_add_epi32(_mm256_set1_epi32((int)i), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
    return _mm256_maskload_ps(v + i, _mm256_cmpgt_epi32(_mm256_set1_epi32((int)len), lane));
}

/* The largest |v| of a block as the scalar one finds it: the unsigned maximum of the bit patterns with the
 * sign cleared, so a NaN or an infinity wins. The maximum is exact in any order. */
AVX2 static float amax_avx2(const float *v, uint32_t len) {
    const __m256i magnitude = _mm256_set1_epi32(0x7FFFFFFF);
    __m256i m = _mm256_setzero_si256();
    for (uint32_t i = 0; i < len; i += 8)
        m = _mm256_max_epu32(_mm256_and_si256(_mm256_castps_si256(block_lanes8(v, i, len)), magnitude), m);
    __m128i h = _mm_max_epu32(_mm256_castsi256_si128(m), _mm256_extracti128_si256(m, 1));
    h = _mm_max_epu32(h, _mm_shuffle_epi32(h, 0x4E)); /* lanes 2, 3, 0, 1 */
    h = _mm_max_epu32(h, _mm_shuffle_epi32(h, 0xB1)); /* lanes 1, 0, 3, 2 */
    return _mm_cvtss_f32(_mm_castsi128_ps(h));
}

/* quantize_one eight lanes at a time: MAXPS(q, -127) turns a NaN into -127, so NaN lanes are zeroed after;
 * the same 1.5 * 2^23 rounding; the 32 results packed to bytes in order. */
AVX2 static int32_t round_avx2(int8_t *q, const float *v, uint32_t len, float inv) {
    __m256i r[4];
    UNROLLED for (uint32_t k = 0; k < 4; k++) {
        const __m256 y = _mm256_mul_ps(block_lanes8(v, 8 * k, len), _mm256_set1_ps(inv));
        __m256 c = _mm256_min_ps(_mm256_max_ps(y, _mm256_set1_ps(-127.0f)), _mm256_set1_ps(127.0f));
        c = _mm256_andnot_ps(_mm256_cmp_ps(y, y, _CMP_UNORD_Q), c);
        c = _mm256_sub_ps(_mm256_add_ps(c, _mm256_set1_ps(12582912.0f)), _mm256_set1_ps(12582912.0f));
        r[k] = _mm256_cvttps_epi32(c);
    }
    /* packs work within 128-bit halves: the bytes come out as dwords r0[0:4] r1[0:4] r2[0:4] r3[0:4] r0[4:8] ... */
    const __m256i bytes = _mm256_packs_epi16(_mm256_packs_epi32(r[0], r[1]), _mm256_packs_epi32(r[2], r[3]));
    _mm256_storeu_si256((__m256i *)(void *)q, _mm256_permutevar8x32_epi32(bytes, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
    return block_total(_mm256_add_epi32(_mm256_add_epi32(r[0], r[1]), _mm256_add_epi32(r[2], r[3])));
}

AVX2 static void quantize_q8_0_avx2(int8_t *xq, float *scale, int32_t *sum, const float *x, uint32_t n) {
    quantize_blocks(xq, scale, sum, x, n, amax_avx2, round_avx2);
}

/* colibri_expf of eight lanes of x in [-87, 88] (where its 2^n needs one step): its operations in its order,
 * each rounded on its own, n by truncation as the C cast. (x86 keeps subnormals in vectors and scalars alike.) */
AVX2 static __m256 expf8(__m256 x) {
    const __m256 fn = _mm256_mul_ps(x, _mm256_set1_ps(1.44269502162933349609f));
    const __m256 half = _mm256_blendv_ps(_mm256_set1_ps(-0.5f), _mm256_set1_ps(0.5f),
                                         _mm256_cmp_ps(fn, _mm256_setzero_ps(), _CMP_GE_OQ));
    const __m256i n = _mm256_cvttps_epi32(_mm256_add_ps(fn, half));
    const __m256 nf = _mm256_cvtepi32_ps(n);
    const __m256 r = _mm256_sub_ps(_mm256_sub_ps(x, _mm256_mul_ps(nf, _mm256_set1_ps(0.693145751953125f))),
                                   _mm256_mul_ps(nf, _mm256_set1_ps(1.42860682030941723212e-06f)));
    __m256 q = _mm256_mul_ps(r, _mm256_set1_ps(1.0f / 5040));
    q = _mm256_mul_ps(r, _mm256_add_ps(q, _mm256_set1_ps(1.0f / 720)));
    q = _mm256_mul_ps(r, _mm256_add_ps(q, _mm256_set1_ps(1.0f / 120)));
    q = _mm256_mul_ps(r, _mm256_add_ps(q, _mm256_set1_ps(1.0f / 24)));
    q = _mm256_mul_ps(r, _mm256_add_ps(q, _mm256_set1_ps(1.0f / 6)));
    q = _mm256_mul_ps(r, _mm256_add_ps(q, _mm256_set1_ps(0.5f)));
    q = _mm256_mul_ps(r, _mm256_add_ps(q, _mm256_set1_ps(1.0f)));
    q = _mm256_add_ps(q, _mm256_set1_ps(1.0f));
    return _mm256_mul_ps(q, _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n, _mm256_set1_epi32(127)), 23)));
}

/* swiglu_scalar eight lanes at a time; a group with a gate outside expf8's range (or a NaN) goes to the
 * scalar function. */
AVX2 static void swiglu_avx2(float *g, const float *u, uint32_t n) {
    uint32_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256 gate = _mm256_loadu_ps(g + i), x = _mm256_xor_ps(gate, _mm256_set1_ps(-0.0f)); /* -g */
        const __m256 in_range = _mm256_and_ps(_mm256_cmp_ps(x, _mm256_set1_ps(-87.0f), _CMP_GE_OQ),
                                              _mm256_cmp_ps(x, _mm256_set1_ps(88.0f), _CMP_LE_OQ));
        if (_mm256_movemask_ps(in_range) != 0xFF) {
            swiglu_scalar(g + i, u + i, 8);
            continue;
        }
        const __m256 d = _mm256_add_ps(_mm256_set1_ps(1.0f), expf8(x));
        _mm256_storeu_ps(g + i, _mm256_mul_ps(_mm256_div_ps(gate, d), _mm256_loadu_ps(u + i)));
    }
    swiglu_scalar(g + i, u + i, n - i);
}

QUANTIZED_ENTRIES(avx2, AVX2, products_avx2, products2_avx2)

static const kernel_set kernels_avx2 = { .name = "avx2", .dot_f32 = dot_f32_avx2, .dot_f16 = dot_f16_avx2,
                                         .dot_bf16 = dot_bf16_avx2, .rows_q8_0 = rows_q8_0_avx2, .rows_q4_0 = rows_q4_0_avx2,
                                         .quantize_q8_0 = quantize_q8_0_avx2, .swiglu = swiglu_avx2,
                                         .tile_f32 = tile_f32_avx2, .tile_f16 = tile_f16_avx2, .tile_bf16 = tile_bf16_avx2,
                                         .tile_q8_0 = tile_q8_0_avx2, .tile_q4_0 = tile_q4_0_avx2 };

/* AVX-512 (F, VL, BW, VNNI): the AVX2 set with what gains from it. The f32 prefill tile holds its 16 lanes
 * in one register (two for AVX2): the same additions in the same lanes, half the instructions, 1.35x the
 * multiply-adds per cycle on Zen 4 in the 2nd-level cache (docs/PERFORMANCE.md). */
#define AVX512 X86_TARGET("avx2,f16c,avx512f,avx512vl,avx512bw,avx512vnni")

/* sum16 of the register's lanes 0-7 and 8-15 */
AVX512 static float sum16_512(__m512 v) {
    return sum16(_mm512_castps512_ps256(v), _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)));
}

/* tile_f32_avx2 with lanes 0-15 in one register: out = { w0.x0, w0.x1, w1.x0, w1.x1 }, each dot_f32's bits.
 * (The f16 and bf16 tiles stay AVX2: converting 16 halves at once ran slower on Zen 4 than two 8s.) */
AVX512 static void tile_f32_512(const float *w0, const float *x0, const float *x1, uint32_t n, float out[4]) {
    const float *w1 = w0 + n;
    __m512 a00 = _mm512_setzero_ps(), a01 = a00, a10 = a00, a11 = a00;
    uint32_t i = 0;
    for (; i + 16 <= n; i += 16) {
        const __m512 r0 = _mm512_loadu_ps(w0 + i), r1 = _mm512_loadu_ps(w1 + i);
        const __m512 u = _mm512_loadu_ps(x0 + i), v = _mm512_loadu_ps(x1 + i);
        a00 = _mm512_add_ps(a00, _mm512_mul_ps(r0, u));
        a01 = _mm512_add_ps(a01, _mm512_mul_ps(r0, v));
        a10 = _mm512_add_ps(a10, _mm512_mul_ps(r1, u));
        a11 = _mm512_add_ps(a11, _mm512_mul_ps(r1, v));
    }
    const __m512 acc[4] = { a00, a01, a10, a11 };
    const float *w[2] = { w0, w1 }, *x[2] = { x0, x1 };
    for (int p = 0; p < 4; p++) {
        if (i == n) {
            out[p] = sum16_512(acc[p]);
            continue;
        }
        float lanes[16];
        _mm512_storeu_ps(lanes, acc[p]);
        out[p] = lanes16_tail(lanes, w[p / 2], x[p % 2], i, n, one_f32);
    }
}

/* VPDPBUSD: four products and their sum in one instruction, for the quantized kernels. */
AVX512 static __m256i products_vnni(__m256i u, __m256i s) { return _mm256_dpbusd_epi32(_mm256_setzero_si256(), u, s); }
AVX512 static __m256i products2_vnni(__m256i u0, __m256i s0, __m256i u1, __m256i s1) {
    return _mm256_dpbusd_epi32(_mm256_dpbusd_epi32(_mm256_setzero_si256(), u0, s0), u1, s1);
}
QUANTIZED_ENTRIES(vnni, AVX512, products_vnni, products2_vnni)

static const kernel_set kernels_avx512 = { .name = "avx512", .dot_f32 = dot_f32_avx2, .dot_f16 = dot_f16_avx2,
                                           .dot_bf16 = dot_bf16_avx2, .rows_q8_0 = rows_q8_0_vnni,
                                           .rows_q4_0 = rows_q4_0_vnni, .quantize_q8_0 = quantize_q8_0_avx2,
                                           .swiglu = swiglu_avx2, .tile_f32 = tile_f32_512, .tile_f16 = tile_f16_avx2,
                                           .tile_bf16 = tile_bf16_avx2, .tile_q8_0 = tile_q8_0_vnni,
                                           .tile_q4_0 = tile_q4_0_vnni };

/* The best set this CPU runs: AVX2 needs AVX2 and F16C in the CPU and YMM state enabled by the OS (or the
 * bare-metal boot code: XCR0 bits 1, 2); AVX-512 its four extensions and ZMM and mask state too (bits 5-7). */
const kernel_set *kernels_x86_select(void) {
    unsigned r[4];
    x86_cpuid(1, 0, r);
    const unsigned need = X86_1_ECX_OSXSAVE | X86_1_ECX_AVX | X86_1_ECX_F16C;
    if ((r[2] & need) != need || (x86_xcr0() & 6u) != 6u) return &kernels_scalar;
    x86_cpuid(0, 0, r);
    if (r[0] < 7) return &kernels_scalar;
    x86_cpuid(7, 0, r);
    if (!(r[1] & X86_7_EBX_AVX2)) return &kernels_scalar;
    const unsigned need512 = X86_7_EBX_AVX512F | X86_7_EBX_AVX512BW | X86_7_EBX_AVX512VL;
    if ((r[1] & need512) == need512 && (r[2] & X86_7_ECX_AVX512VNNI) && (x86_xcr0() & 0xE6u) == 0xE6u) return &kernels_avx512;
    return &kernels_avx2;
}
#endif
