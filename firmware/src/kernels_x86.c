/* x86-64 kernels: AVX2 (with F16C) and AVX-512, chosen at open by CPUID, so one binary also runs on a CPU
 * without AVX2 (it then uses the scalar set): the float dots and tiles and the activation quantizer here, SwiGLU and
 * the softmax in kernels_x86_exp.c, the Q8_0/Q4_0 kernels in kernels_x86_quantized.c, the block dtypes' (Q4_1 ...
 * Q6_K) in kernels_x86_block.c.
 * Each function computes exactly what its scalar twin in kernels.c (or kernels_block.c) computes
 * (docs/KERNELS.md): float lanes i % 16 in two 8-wide registers, quantized block terms in lane b % 8, products
 * and sums rounded separately (no FMA), the same final tree. */
#include "internal.h"
#include "x86.h"

#if defined(COLIBRI_X86_SIMD)
/* Loaders of 8 weights as f32 (exact widening; f16's is x86.h's), and of one weight for the tail. */
AVX2 static __m256 load8_f32(const void *w, uint32_t i) { return _mm256_loadu_ps((const float *)w + i); }
AVX2 static __m256 load8_bf16(const void *w, uint32_t i) {
    __m256i wide = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(const void *)((const uint16_t *)w + i)));
    return _mm256_castsi256_ps(_mm256_slli_epi32(wide, 16));
}
static float one_f32(const void *w, uint32_t i) { return ((const float *)w)[i]; }
static float one_f16(const void *w, uint32_t i) { return f16_to_f32(((const uint16_t *)w)[i]); }
static float one_bf16(const void *w, uint32_t i) { return bf16_to_f32(((const uint16_t *)w)[i]); }

/* sum16: sum_lanes16 of lanes 0-7 in a, 8-15 in b (sum8: x86.h). */
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

/* (NOINLINE: scores_lanes calls them for its odd pairs; one copy of each loop, not one more per caller) */
AVX2 NOINLINE static float dot_f32_avx2(const float *w, const float *x, uint32_t n) { return dot_lanes16(w, x, n, load8_f32, one_f32); }
AVX2 static void tile_f32_avx2(const float *w, const float *x0, const float *x1, uint32_t n, float out[4]) {
    tile_lanes16(w, w + n, x0, x1, n, out, load8_f32, one_f32);
}
AVX2 static void tile_f16_avx2(const uint16_t *w, const float *x0, const float *x1, uint32_t n, float out[4]) {
    tile_lanes16(w, w + n, x0, x1, n, out, load8_f16, one_f16);
}
AVX2 static void tile_bf16_avx2(const uint16_t *w, const float *x0, const float *x1, uint32_t n, float out[4]) {
    tile_lanes16(w, w + n, x0, x1, n, out, load8_bf16, one_bf16);
}
AVX2 NOINLINE static float dot_f16_avx2(const uint16_t *w, const float *x, uint32_t n) { return dot_lanes16(w, x, n, load8_f16, one_f16); }
AVX2 static float dot_bf16_avx2(const uint16_t *w, const float *x, uint32_t n) { return dot_lanes16(w, x, n, load8_bf16, one_bf16); }

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

/* accumulate's elements [i, i + 8 * K) of out over every row, in K registers held across the rows: each
 * element's sum is the scalar kernel's (out, then + p[t] * v_t in turn, each product rounded, then added).
 * Eight registers (64 elements: a head of 64 whole) keep eight additions in flight, which the chain of one
 * element's additions needs to cover the adder's latency. esize: a stored element's bytes. */
/* Attention reads a head's few cache lines out of each KV cache row (all the KV heads' side by side): a stride the
 * hardware prefetchers lose at every 4 KiB page, so the loops over cached rows ask for the row KV_AHEAD rows on
 * themselves (a hint: it never faults, past the cache's end either, and changes no result). */
#define KV_AHEAD 16
AVX2 ALWAYS_INLINE void prefetch_span(const char *p, size_t bytes) {
    for (size_t off = 0; off < bytes; off += 64) x86_prefetch(p + off);
    x86_prefetch(p + bytes - 1); /* a span that does not start on a line ends on one more */
}

AVX2 ALWAYS_INLINE void accumulate_regs(float *out, const float *p, const void *v, size_t stride, uint32_t rows, uint32_t i,
                                        int K, size_t esize, __m256 (*load8)(const void *, uint32_t)) {
    __m256 acc[8];
    UNROLLED for (int k = 0; k < K; k++) acc[k] = _mm256_loadu_ps(out + i + 8 * k);
    const char *row = v;
    for (uint32_t t = 0; t < rows; t++, row += stride * esize) {
        prefetch_span(row + KV_AHEAD * stride * esize + i * esize, 8 * (size_t)K * esize);
        const __m256 pt = _mm256_broadcast_ss(p + t);
        UNROLLED for (int k = 0; k < K; k++) acc[k] = _mm256_add_ps(acc[k], _mm256_mul_ps(pt, load8(row, i + 8 * k)));
    }
    UNROLLED for (int k = 0; k < K; k++) _mm256_storeu_ps(out + i + 8 * k, acc[k]);
}

/* Whole groups of 64 elements in registers, then of 8 (a head of 64 or 128 is all groups of 64); returns where the
 * last n % 8 start. */
AVX2 ALWAYS_INLINE uint32_t accumulate_lanes(float *out, const float *p, const void *v, size_t stride, uint32_t rows,
                                             uint32_t n, size_t esize, __m256 (*load8)(const void *, uint32_t)) {
    uint32_t i = 0;
    for (; i + 64 <= n; i += 64) accumulate_regs(out, p, v, stride, rows, i, 8, esize, load8);
    for (; i + 8 <= n; i += 8) accumulate_regs(out, p, v, stride, rows, i, 1, esize, load8);
    return i;
}
#if WITH_KERNEL_ACCUMULATE /* (the lean build sums with the scalar loop: mechanisms.h) */
AVX2 static void accumulate_f32_avx2(float *out, const float *p, const float *v, size_t stride, uint32_t rows, uint32_t n) {
    const uint32_t i = accumulate_lanes(out, p, v, stride, rows, n, sizeof *v, load8_f32);
    if (i < n) accumulate_f32_scalar(out + i, p, v + i, stride, rows, n - i);
}
AVX2 static void accumulate_f16_avx2(float *out, const float *p, const uint16_t *v, size_t stride, uint32_t rows, uint32_t n) {
    const uint32_t i = accumulate_lanes(out, p, v, stride, rows, n, sizeof *v, load8_f16);
    if (i < n) accumulate_f16_scalar(out + i, p, v + i, stride, rows, n - i);
}
#endif

/* The tree of four 16-lane dots at once, dot p's lanes 0-7 plus 8-15 already in s_p (the tree's first step): each
 * shuffle lines up the same pairs the scalar tree adds, so every addition is one of sum_lanes8's with its operands
 * in its order. Returns [dot0, dot1, dot2, dot3]. */
AVX2 ALWAYS_INLINE __m128 trees4(__m256 s0, __m256 s1, __m256 s2, __m256 s3) {
    /* t[j] = s[j] + s[j + 4]: [t0 | t1] and [t2 | t3] */
    const __m256 t01 = _mm256_add_ps(_mm256_permute2f128_ps(s0, s1, 0x20), _mm256_permute2f128_ps(s0, s1, 0x31));
    const __m256 t23 = _mm256_add_ps(_mm256_permute2f128_ps(s2, s3, 0x20), _mm256_permute2f128_ps(s2, s3, 0x31));
    /* u[j] = t[j] + t[j + 2]: [u0[0] u0[1] u2[0] u2[1] | u1[0] u1[1] u3[0] u3[1]] */
    const __m256 u = _mm256_add_ps(_mm256_shuffle_ps(t01, t23, 0x44), _mm256_shuffle_ps(t01, t23, 0xEE));
    /* dot = u[0] + u[1]: [d0 d2 d0 d2 | d1 d3 d1 d3] */
    const __m256 d = _mm256_add_ps(_mm256_shuffle_ps(u, u, 0x88), _mm256_shuffle_ps(u, u, 0xDD));
    return _mm_unpacklo_ps(_mm256_castps256_ps128(d), _mm256_extractf128_ps(d, 1));
}

/* Attention's scores (kernels.h) with n a multiple of 16, four dots at a time, each in dot_lanes16's lanes: four heads
 * of a KV group against one row (the row's registers serve all four), then each head left over against four rows at a
 * time (the query's registers serve all four). esize: a stored element's bytes (f32 or f16). Other n, and the rows
 * after the last four: the set's dot per pair. */
AVX2 ALWAYS_INLINE void scores_lanes(float *out, size_t out_stride, const void *k, size_t k_stride, size_t esize,
                                     uint32_t rows, const float *q, size_t q_stride, uint32_t heads, uint32_t n,
                                     __m256 (*load8)(const void *, uint32_t)) {
    const size_t row_bytes = k_stride * esize;
    uint32_t h = 0;
    if (n % 16 == 0)
        for (; h + 4 <= heads; h += 4) {
            const float *q0 = q + h * q_stride, *q1 = q0 + q_stride, *q2 = q1 + q_stride, *q3 = q2 + q_stride;
            float *o = out + h * out_stride;
            const char *row = k;
            for (uint32_t t = 0; t < rows; t++, row += row_bytes) {
                prefetch_span(row + KV_AHEAD * row_bytes, n * esize);
                __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, b0 = a0, b1 = a0, b2 = a0, b3 = a0;
                for (uint32_t i = 0; i < n; i += 16) {
                    const __m256 lo = load8(row, i), hi = load8(row, i + 8);
                    a0 = _mm256_add_ps(a0, _mm256_mul_ps(lo, _mm256_loadu_ps(q0 + i)));
                    b0 = _mm256_add_ps(b0, _mm256_mul_ps(hi, _mm256_loadu_ps(q0 + i + 8)));
                    a1 = _mm256_add_ps(a1, _mm256_mul_ps(lo, _mm256_loadu_ps(q1 + i)));
                    b1 = _mm256_add_ps(b1, _mm256_mul_ps(hi, _mm256_loadu_ps(q1 + i + 8)));
                    a2 = _mm256_add_ps(a2, _mm256_mul_ps(lo, _mm256_loadu_ps(q2 + i)));
                    b2 = _mm256_add_ps(b2, _mm256_mul_ps(hi, _mm256_loadu_ps(q2 + i + 8)));
                    a3 = _mm256_add_ps(a3, _mm256_mul_ps(lo, _mm256_loadu_ps(q3 + i)));
                    b3 = _mm256_add_ps(b3, _mm256_mul_ps(hi, _mm256_loadu_ps(q3 + i + 8)));
                }
                float d[4];
                _mm_storeu_ps(d, trees4(_mm256_add_ps(a0, b0), _mm256_add_ps(a1, b1), _mm256_add_ps(a2, b2),
                                        _mm256_add_ps(a3, b3)));
                UNROLLED for (int p = 0; p < 4; p++) o[p * out_stride + t] = d[p];
            }
        }
    for (; h < heads; h++) {
        const float *x = q + h * q_stride;
        float *o = out + h * out_stride;
        const char *row = k;
        uint32_t t = 0;
        for (; n % 16 == 0 && t + 4 <= rows; t += 4, row += 4 * row_bytes) {
            const char *r1 = row + row_bytes, *r2 = r1 + row_bytes, *r3 = r2 + row_bytes;
            UNROLLED for (int a = 0; a < 4; a++) prefetch_span(row + (KV_AHEAD + a) * row_bytes, n * esize);
            __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, b0 = a0, b1 = a0, b2 = a0, b3 = a0;
            for (uint32_t i = 0; i < n; i += 16) {
                const __m256 lo = _mm256_loadu_ps(x + i), hi = _mm256_loadu_ps(x + i + 8);
                a0 = _mm256_add_ps(a0, _mm256_mul_ps(load8(row, i), lo));
                b0 = _mm256_add_ps(b0, _mm256_mul_ps(load8(row, i + 8), hi));
                a1 = _mm256_add_ps(a1, _mm256_mul_ps(load8(r1, i), lo));
                b1 = _mm256_add_ps(b1, _mm256_mul_ps(load8(r1, i + 8), hi));
                a2 = _mm256_add_ps(a2, _mm256_mul_ps(load8(r2, i), lo));
                b2 = _mm256_add_ps(b2, _mm256_mul_ps(load8(r2, i + 8), hi));
                a3 = _mm256_add_ps(a3, _mm256_mul_ps(load8(r3, i), lo));
                b3 = _mm256_add_ps(b3, _mm256_mul_ps(load8(r3, i + 8), hi));
            }
            _mm_storeu_ps(o + t, trees4(_mm256_add_ps(a0, b0), _mm256_add_ps(a1, b1), _mm256_add_ps(a2, b2),
                                        _mm256_add_ps(a3, b3)));
        }
        for (; t < rows; t++, row += row_bytes)
            o[t] = esize == sizeof(float) ? dot_f32_avx2((const float *)(const void *)row, x, n)
                                          : dot_f16_avx2((const uint16_t *)(const void *)row, x, n);
    }
}
#if WITH_KERNEL_SCORES /* (the lean build makes a dot per row: mechanisms.h) */
AVX2 static void scores_f32_avx2(float *out, size_t out_stride, const float *k, size_t k_stride, uint32_t rows,
                                 const float *q, size_t q_stride, uint32_t heads, uint32_t n) {
    scores_lanes(out, out_stride, k, k_stride, sizeof *k, rows, q, q_stride, heads, n, load8_f32);
}
AVX2 static void scores_f16_avx2(float *out, size_t out_stride, const uint16_t *k, size_t k_stride, uint32_t rows,
                                 const float *q, size_t q_stride, uint32_t heads, uint32_t n) {
    scores_lanes(out, out_stride, k, k_stride, sizeof *k, rows, q, q_stride, heads, n, load8_f16);
}
#endif

static const kernel_set kernels_avx2 = { .name = "avx2", .dot_f32 = dot_f32_avx2, .dot_f16 = dot_f16_avx2,
                                         .dot_bf16 = dot_bf16_avx2, .rows_q8_0 = rows_q8_0_avx2, .rows_q4_0 = rows_q4_0_avx2,
                                         .quantize_q8_0 = quantize_q8_0_avx2, .swiglu = swiglu_avx2,
                                         KERNELS_ACCUMULATE(accumulate_f32_avx2, accumulate_f16_avx2)
                                         KERNELS_SCORES(scores_f32_avx2, scores_f16_avx2, softmax_avx2)
                                         .tile_f32 = tile_f32_avx2, .tile_f16 = tile_f16_avx2, .tile_bf16 = tile_bf16_avx2,
                                         .tile_q8_0 = tile_q8_0_avx2, .tile_q4_0 = tile_q4_0_avx2, BLOCK_ROWS4(avx2) BLOCK_ROWS(avx2) };

/* AVX-512 (F, VL, BW, VNNI): the AVX2 set with what gains from it. The f32 prefill tile holds its 16 lanes
 * in one register (two for AVX2): the same additions in the same lanes, half the instructions, 1.35x the
 * multiply-adds per cycle on Zen 4 in the 2nd-level cache (docs/PERFORMANCE.md). */
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

static const kernel_set kernels_avx512 = { .name = "avx512", .dot_f32 = dot_f32_avx2, .dot_f16 = dot_f16_avx2,
                                           .dot_bf16 = dot_bf16_avx2, .rows_q8_0 = rows_q8_0_vnni,
                                           .rows_q4_0 = rows_q4_0_vnni, .quantize_q8_0 = quantize_q8_0_avx2,
                                           .swiglu = swiglu_avx2, KERNELS_ACCUMULATE(accumulate_f32_avx2, accumulate_f16_avx2)
                                           KERNELS_SCORES(scores_f32_avx2, scores_f16_avx2, softmax_avx2)
                                           .tile_f32 = tile_f32_512, .tile_f16 = tile_f16_avx2,
                                           .tile_bf16 = tile_bf16_avx2, .tile_q8_0 = tile_q8_0_vnni,
                                           .tile_q4_0 = tile_q4_0_vnni, .rows4_q8_0 = rows4_q8_0_vnni,
                                           .rows4_q4_0 = rows4_q4_0_vnni, BLOCK_ROWS4(vnni) BLOCK_ROWS(vnni) };

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
