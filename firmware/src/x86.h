/* x86-64 SIMD for kernels_x86.c, kernels_x86_quantized.c and crc32.c, under GCC and Clang
 * (__x86_64__) or MSVC (_M_X64). GCC and Clang compile a function for an instruction set when a target attribute
 * asks (X86_TARGET); MSVC takes the intrinsics in any function. Either way CPUID decides at open what runs
 * (x86_cpuid, x86_xcr0). */
#ifndef COLIBRI_X86_H
#define COLIBRI_X86_H

#include "internal.h" /* COLIBRI_X86_SIMD (kernels.h) */

#if defined(COLIBRI_X86_SIMD)
#include <immintrin.h>

#if defined(__GNUC__) || defined(__clang__)
#include <cpuid.h>
#define X86_TARGET(isa) __attribute__((target(isa)))
/* regs = eax, ebx, ecx, edx of CPUID leaf, subleaf */
static inline void x86_cpuid(unsigned leaf, unsigned subleaf, unsigned regs[4]) {
    __cpuid_count(leaf, subleaf, regs[0], regs[1], regs[2], regs[3]);
}
/* the low half of XCR0: which register states the OS (or the boot code) saves and enables */
static inline unsigned x86_xcr0(void) {
    unsigned lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    (void)hi;
    return lo;
}
/* A read prefetch into every cache level. Not _mm_prefetch: GCC 12 drops it when it reaches a loop through
 * an always_inline function with a target attribute (the quantized kernels' shared bodies). */
#define x86_prefetch(p) __builtin_prefetch((p), 0, 3)
#else
#include <intrin.h>
#define X86_TARGET(isa)
static inline void x86_cpuid(unsigned leaf, unsigned subleaf, unsigned regs[4]) {
    int r[4];
    __cpuidex(r, (int)leaf, (int)subleaf);
    for (int i = 0; i < 4; i++) regs[i] = (unsigned)r[i];
}
static inline unsigned x86_xcr0(void) { return (unsigned)_xgetbv(0); }
#define x86_prefetch(p) _mm_prefetch((const char *)(p), _MM_HINT_T0)
#endif

/* The kernel sets' targets (kernels_x86.c, kernels_x86_quantized.c). */
#define AVX2 X86_TARGET("avx2,f16c")
#define AVX512 X86_TARGET("avx2,f16c,avx512f,avx512vl,avx512bw,avx512vnni")

/* Quantized weights stream through once per token: asking for them this far ahead keeps more
 * cache-line fills in flight than the hardware prefetcher does for one stream (docs/PERFORMANCE.md:
 * 4 KiB ahead lifts Q8_0 from 57% to 65-70% of the triad, Q4_0 from 43% to 52%; the float kernels
 * gained nothing). A hint only: it never faults, even past the end of the image, and changes no result. */
#define PREFETCH_AHEAD 4096
static inline void prefetch(const void *p, size_t bytes) {
    for (size_t off = 0; off < bytes; off += 64) x86_prefetch((const char *)p + PREFETCH_AHEAD + off);
}

/* 8 f16 weights as f32 (exact widening) */
AVX2 static inline __m256 load8_f16(const void *w, uint32_t i) {
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)((const uint16_t *)w + i)));
}

/* sum_lanes8 of a register without leaving registers: the same additions, the same operands in the same
 * order (so even a NaN's payload is the scalar tree's). */
AVX2 static inline float sum8(__m256 acc) {
    const __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps(acc, 1)); /* acc[i] + acc[i + 4] */
    const __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));                                  /* s4[i] + s4[i + 2] */
    return _mm_cvtss_f32(_mm_add_ss(s2, _mm_shuffle_ps(s2, s2, 1)));                         /* s2[0] + s2[1] */
}

/* The sum of the 8 int32 lanes of one block: for the blocks after the last multiple of 8. */
AVX2 static inline int32_t block_total(__m256i p) {
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(p), _mm256_extracti128_si256(p, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4E));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xB1));
    return _mm_cvtsi128_si32(s);
}

/* a[j]'s 128-bit lane L becomes dword j of the four inputs' lane L: a[j] lane (L, i) = input i's (L, j), i.e. dword
 * 4L + j of input i (the runs of rows by four vectors: kernels_x86_rows4.c, kernels_x86_block.c) */
AVX2 static inline void transpose4(__m256i a[4]) {
    const __m256i t0 = _mm256_unpacklo_epi32(a[0], a[1]), t1 = _mm256_unpackhi_epi32(a[0], a[1]);
    const __m256i t2 = _mm256_unpacklo_epi32(a[2], a[3]), t3 = _mm256_unpackhi_epi32(a[2], a[3]);
    a[0] = _mm256_unpacklo_epi64(t0, t2);
    a[1] = _mm256_unpackhi_epi64(t0, t2);
    a[2] = _mm256_unpacklo_epi64(t1, t3);
    a[3] = _mm256_unpackhi_epi64(t1, t3);
}
/* The integer core of the quantized kernels (kernels_x86_quantized.c, kernels_x86_block.c), one per instruction
 * set: 32 unsigned bytes u times 32 signed bytes s, each int32 lane the sum of four neighbouring products
 * (VPDPBUSD's arithmetic; AVX2 adds pairs in int16 first: exact, as every u here is <= 128 and every s >= -127,
 * the activation quantizer never giving -128, so a pair stays below maddubs' int16 saturation). products2 adds
 * two such: u0 s0 + u1 s1 (with u <= 15, a Q4_0 nibble, AVX2 adds them in int16 too). Integer sums are exact in
 * any order, so both sets' kernels give the same bits. */
typedef __m256i (*products_fn)(__m256i u, __m256i s);
typedef __m256i (*products2_fn)(__m256i u0, __m256i s0, __m256i u1, __m256i s1);
AVX2 static inline __m256i products_avx2(__m256i u, __m256i s) {
    return _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1));
}
AVX2 static inline __m256i products2_avx2(__m256i u0, __m256i s0, __m256i u1, __m256i s1) {
    return _mm256_madd_epi16(_mm256_add_epi16(_mm256_maddubs_epi16(u0, s0), _mm256_maddubs_epi16(u1, s1)),
                             _mm256_set1_epi16(1));
}
/* VPDPBUSD: four products and their sum in one instruction (the AVX-512 set). */
AVX512 static inline __m256i products_vnni(__m256i u, __m256i s) { return _mm256_dpbusd_epi32(_mm256_setzero_si256(), u, s); }
AVX512 static inline __m256i products2_vnni(__m256i u0, __m256i s0, __m256i u1, __m256i s1) {
    return _mm256_dpbusd_epi32(_mm256_dpbusd_epi32(_mm256_setzero_si256(), u0, s0), u1, s1);
}

/* The integer sums of 8 blocks (each 8 int32 lanes) as one vector, block k in lane k. */
AVX2 static inline __m256i block_totals(const __m256i p[8]) {
    __m256i h01 = _mm256_hadd_epi32(p[0], p[1]), h23 = _mm256_hadd_epi32(p[2], p[3]);
    __m256i h45 = _mm256_hadd_epi32(p[4], p[5]), h67 = _mm256_hadd_epi32(p[6], p[7]);
    __m256i lo4 = _mm256_hadd_epi32(h01, h23), hi4 = _mm256_hadd_epi32(h45, h67);
    return _mm256_add_epi32(_mm256_permute2x128_si256(lo4, hi4, 0x20), _mm256_permute2x128_si256(lo4, hi4, 0x31));
}

/* The quantized entries of the AVX2 and AVX-512 sets (kernels_x86_quantized.c), which the sets hold. */
#define QUANTIZED_DECLS(set)                                                                                         \
    void rows_q8_0_##set(const int8_t *w, const uint16_t *w_scale, const q8_vector *x, uint32_t blocks, uint32_t rows, \
                         float *out);                                                                                \
    void rows_q4_0_##set(const uint8_t *w, const uint16_t *w_scale, const q8_vector *x, uint32_t blocks, uint32_t rows, \
                         float *out);                                                                                \
    void tile_q8_0_##set(const int8_t *w, const uint16_t *w_scale, const q8_vector *x, uint32_t blocks, float out[4]); \
    void tile_q4_0_##set(const uint8_t *w, const uint16_t *w_scale, const q8_vector *x, uint32_t blocks, float out[4]);
QUANTIZED_DECLS(avx2)
QUANTIZED_DECLS(vnni)
/* kernels_x86_quantized.c's tails: the blocks [b, blocks) after the last multiple of 8 into lanes b % 8, then the tree */
float q8_0_tail(float acc[8], const int8_t *w, const uint16_t *w_scale, const q8_vector *x, uint32_t b, uint32_t blocks);
float q4_0_tail(float acc[8], const uint8_t *w, const uint16_t *w_scale, const q8_vector *x, uint32_t b, uint32_t blocks);
/* kernels_x86_exp.c (softmax: the sets' entry, with WITH_KERNEL_SCORES) */
void swiglu_avx2(float *g, const float *u, uint32_t n);
void softmax_avx2(float *x, uint32_t n, const float *sink);
/* kernels_x86_rows4.c */
void rows4_q8_0_vnni(const int8_t *w, const uint16_t *w_scale, const q8_vector *x, uint32_t blocks, uint32_t rows,
                     float *out, size_t out_stride);
void rows4_q4_0_vnni(const uint8_t *w, const uint16_t *w_scale, const q8_vector *x, uint32_t blocks, uint32_t rows,
                     float *out, size_t out_stride);

/* The block dtypes' rows of the AVX2 and AVX-512 sets (kernels_x86_block.c, kernels_x86_rows4_k.c), the helpers
 * both files use, and the sets' entries for them. */
#if WITH_BLOCK_DTYPES
/* GGUF's fields are little-endian at any byte (MXFP4's blocks are 17 bytes): le32 is image.h's, and this makes one
 * load too. */
static inline uint32_t le16(const uint8_t *p) { return (uint32_t)p[0] | (uint32_t)p[1] << 8; }
AVX2 static inline __m256i load32(const void *p) { return _mm256_loadu_si256((const __m256i *)p); }
/* Q4_K's and Q5_K's a = d sc and c = -(dmin m) of the 8 sub-blocks: scale_min_k4's 6-bit fields from the 12 bytes
 * s[0..11] at blk + 4, as four words of bytes (llama.cpp's kmask steps, in one register):
 *   sc 0-3 = s[0..3] & 63, sc 4-7 = s[8..11] & 15 | (s[0..3] >> 6) << 4,
 *   m 0-3 = s[4..7] & 63,  m 4-7 = s[8..11] >> 4 | (s[4..7] >> 6) << 4,
 * widened and multiplied in f32 (exact). */
AVX2 ALWAYS_INLINE void k4_factors(const uint8_t *blk, __m256 *a, __m256 *c) {
    const __m128i s = _mm_loadu_si128((const __m128i *)(const void *)(blk + 4)); /* s[0..11] and 4 bytes of qh/qs */
    const __m128i low = _mm_shuffle_epi8(s, _mm_setr_epi8(0, 1, 2, 3, 8, 9, 10, 11, 4, 5, 6, 7, 8, 9, 10, 11));
    const __m128i high = _mm_shuffle_epi8(s, _mm_setr_epi8(-1, -1, -1, -1, 0, 1, 2, 3, -1, -1, -1, -1, 4, 5, 6, 7));
    const __m128i lows = _mm_and_si128(_mm_srlv_epi32(low, _mm_setr_epi32(0, 0, 0, 4)),
                                       _mm_setr_epi32(0x3F3F3F3F, 0x0F0F0F0F, 0x3F3F3F3F, 0x0F0F0F0F));
    const __m128i sm = _mm_or_si128(lows, _mm_and_si128(_mm_srli_epi16(high, 2), _mm_set1_epi8(0x30)));
    const __m128 dm = _mm_cvtph_ps(_mm_cvtsi32_si128((int)le32(blk))); /* d, dmin */
    *a = _mm256_mul_ps(_mm256_broadcastss_ps(dm), _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(sm)));
    const __m256 m = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(sm, 8)));
    *c = _mm256_xor_ps(_mm256_mul_ps(_mm256_broadcastss_ps(_mm_movehdup_ps(dm)), m), _mm256_set1_ps(-0.0f));
}
/* Q6_K's a = d (the f16 after its scales), no c. */
AVX2 ALWAYS_INLINE void q6_k_factors(const uint8_t *blk, __m256 *a, __m256 *c) {
    *a = _mm256_set1_ps(f16_to_f32((uint16_t)le16(blk + 208)));
    *c = _mm256_setzero_ps();
}
#define BLOCK_DECLS(set)                                                                                             \
    void rows_q4_1_##set(const uint8_t *w, const q8_vector *x, uint32_t blocks, uint32_t rows, float *out);         \
    void rows_q5_0_##set(const uint8_t *w, const q8_vector *x, uint32_t blocks, uint32_t rows, float *out);         \
    void rows_q5_1_##set(const uint8_t *w, const q8_vector *x, uint32_t blocks, uint32_t rows, float *out);         \
    void rows_mxfp4_##set(const uint8_t *w, const q8_vector *x, uint32_t blocks, uint32_t rows, float *out);        \
    void rows_q4_k_##set(const uint8_t *w, const q8_vector *x, uint32_t blocks, uint32_t rows, float *out);         \
    void rows_q5_k_##set(const uint8_t *w, const q8_vector *x, uint32_t blocks, uint32_t rows, float *out);         \
    void rows_q6_k_##set(const uint8_t *w, const q8_vector *x, uint32_t blocks, uint32_t rows, float *out);
BLOCK_DECLS(avx2)
BLOCK_DECLS(vnni)
#define BLOCK_ROWS4_DECLS(set)                                                                                       \
    void rows4_q4_k_##set(const uint8_t *w, const q8_vector *x, uint32_t blocks, uint32_t rows, float *out,         \
                          size_t out_stride);                                                                        \
    void rows4_q5_k_##set(const uint8_t *w, const q8_vector *x, uint32_t blocks, uint32_t rows, float *out,         \
                          size_t out_stride);                                                                        \
    void rows4_q6_k_##set(const uint8_t *w, const q8_vector *x, uint32_t blocks, uint32_t rows, float *out,         \
                          size_t out_stride);
BLOCK_ROWS4_DECLS(avx2)
BLOCK_ROWS4_DECLS(vnni)
#define BLOCK_ROWS(set)                                                                                              \
    .rows_q4_1 = rows_q4_1_##set, .rows_q5_0 = rows_q5_0_##set, .rows_q5_1 = rows_q5_1_##set,                       \
    .rows_mxfp4 = rows_mxfp4_##set, .rows_q4_k = rows_q4_k_##set, .rows_q5_k = rows_q5_k_##set,                     \
    .rows_q6_k = rows_q6_k_##set
#define BLOCK_ROWS4(set)                                                                                             \
    .rows4_q4_k = rows4_q4_k_##set, .rows4_q5_k = rows4_q5_k_##set, .rows4_q6_k = rows4_q6_k_##set,
#else
#define BLOCK_ROWS(set) /* the lean build: none */
#define BLOCK_ROWS4(set)
#endif

/* CPUID feature bits (Intel SDM vol. 2A, CPUID): leaf 1 ecx, leaf 7 ebx and ecx */
#define X86_1_ECX_PCLMUL (1u << 1)
#define X86_1_ECX_OSXSAVE (1u << 27)
#define X86_1_ECX_AVX (1u << 28)
#define X86_1_ECX_F16C (1u << 29)
#define X86_7_EBX_AVX2 (1u << 5)
#define X86_7_EBX_AVX512F (1u << 16)
#define X86_7_EBX_AVX512BW (1u << 30)
#define X86_7_EBX_AVX512VL (1u << 31)
#define X86_7_ECX_AVX512VNNI (1u << 11)
#endif

#endif
