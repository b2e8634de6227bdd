/* The kernels: the weight and quantized-vector views they read, each instruction set's table (kernel_set:
 * every entry the scalar one's bits, docs/KERNELS.md), the scalar reference functions, CRC-32, and the
 * compiler spellings the kernels share. */
#ifndef COLIBRI_KERNELS_H
#define COLIBRI_KERNELS_H

#include "colibri.h"
#include "format.h"
#include "mechanisms.h"

/* x86-64 under GCC, Clang or MSVC with its SIMD kernels (x86.h has their intrinsics): CPUID chooses the kernels
 * and the CRC at open. */
#if (defined(__x86_64__) || defined(_M_X64)) && !defined(COLIBRI_KERNELS_SCALAR)
#define COLIBRI_X86_SIMD 1
#endif

/* One weight matrix as the kernels see it (rows x cols, row-major). Q8_0 and Q4_0 store each row as
 * ceil(cols / QBLOCK) blocks, the last one zero-padded, with one f16 scale per block apart; the block dtypes
 * (Q4_1 ... Q6_K) store GGUF's blocks, scales inside (docs/FORMAT.md "Dtypes"). */
typedef struct {
    const void *data;        /* f32 / f16 / bf16 elements, int8 values, packed int4 pairs, or GGUF blocks */
    const uint16_t *scales;  /* f16 block scales (Q8_0, Q4_0), else NULL */
    uint32_t dtype, rows, cols, blocks; /* blocks per row (quantized) */
} weight;

/* A vector quantized to Q8_0, the input of the quantized dot products: per block of QBLOCK elements
 * the int8 values, their f32 scale, and the sum of the values (Q4_0 kernels may multiply unsigned
 * nibbles and subtract 8 * sum instead of sign-extending every nibble). */
typedef struct {
    const int8_t *q;
    const float *scale;
    const int32_t *sum;
} q8_vector;

/* Rows of a block dtype times x quantized to Q8_0 (kernel_set's rows_q4_1 ... rows_q6_k). */
typedef void (*rows_block_fn)(const uint8_t *w, const q8_vector *x, uint32_t blocks, uint32_t rows, float *out);
/* `rows` consecutive rows of a block dtype times four vectors x[0..3], out[t * out_stride + r] = row r . x[t]. */
typedef void (*rows4_block_fn)(const uint8_t *w, const q8_vector *x, uint32_t blocks, uint32_t rows, float *out,
                               size_t out_stride);

/* The dot-product kernels of one instruction set. Every entry gives the same bits as the scalar
 * one (docs/KERNELS.md: the fixed summation order). For the float dtypes w is one row and x is f32; the
 * quantized dtypes take `rows` consecutive rows of a matrix (row i's blocks right after row i - 1's, its
 * scales likewise) times x quantized to Q8_0 (xq, one f32 scale per block), out[i] = row i . x: a small
 * model's rows are two or three blocks long, and one call per row cost as much as the blocks. */
typedef struct {
    const char *name;
    float (*dot_f32)(const float *w, const float *x, uint32_t n);
    float (*dot_f16)(const uint16_t *w, const float *x, uint32_t n);
    float (*dot_bf16)(const uint16_t *w, const float *x, uint32_t n);
    void (*rows_q8_0)(const int8_t *w, const uint16_t *w_scale, const q8_vector *x, uint32_t blocks, uint32_t rows,
                      float *out);
    void (*rows_q4_0)(const uint8_t *w, const uint16_t *w_scale, const q8_vector *x, uint32_t blocks, uint32_t rows,
                      float *out);
#if WITH_BLOCK_DTYPES
    /* The block dtypes (GGUF's blocks, scales inside): `rows` consecutive rows of `blocks` blocks of QBLOCK
     * elements (a K-quant row holds blocks / 8 of its 256-element blocks) times x, as the scalar ones. */
    rows_block_fn rows_q4_1, rows_q5_0, rows_q5_1, rows_mxfp4, rows_q4_k, rows_q5_k, rows_q6_k;
#endif
    /* x (n floats) quantized to Q8_0 as quantize_q8_0_scalar does, bit for bit */
    void (*quantize_q8_0)(int8_t *xq, float *scale, int32_t *sum, const float *x, uint32_t n);
    /* SwiGLU in place: g[i] = g[i] / (1 + colibri_expf(-g[i])) * u[i], as swiglu_scalar computes it */
    void (*swiglu)(float *g, const float *u, uint32_t n);
#if WITH_KERNEL_ACCUMULATE
    /* Attention's value sum over `rows` cached rows v_t = v + t * stride (f32, or f16 widened exactly):
     * out[i] = out[i] + p[t] * v_t[i] for t = 0, 1, ..., rows - 1 in turn, each product rounded, then added
     * (docs/KERNELS.md). Elements are independent, so a kernel may take many at once and keep them in
     * registers across the rows; each element's additions keep this order. */
    void (*accumulate_f32)(float *out, const float *p, const float *v, size_t stride, uint32_t rows, uint32_t n);
    void (*accumulate_f16)(float *out, const float *p, const uint16_t *v, size_t stride, uint32_t rows, uint32_t n);
#endif
#if WITH_KERNEL_SCORES
    /* Attention's scores of `heads` queries (q_h = q + h * q_stride) against `rows` cached key rows k_t = k + t *
     * k_stride (f32, or f16 widened exactly): out[h * out_stride + t] = q_h . k_t, each the bits of dot_f32/dot_f16
     * (w = k_t, x = q_h). The heads of a KV group share the rows, so a kernel may read each row once for all of them
     * and finish several dots' trees together (docs/KERNELS.md). */
    void (*scores_f32)(float *out, size_t out_stride, const float *k, size_t k_stride, uint32_t rows, const float *q,
                       size_t q_stride, uint32_t heads, uint32_t n);
    void (*scores_f16)(float *out, size_t out_stride, const uint16_t *k, size_t k_stride, uint32_t rows, const float *q,
                       size_t q_stride, uint32_t heads, uint32_t n);
    /* softmax (below) over a head's scores, its bits: the max, each colibri_expf(x - max) added to the sum in turn,
     * then the divisions; a kernel may compute the exponentials and the divisions many at once. */
    void (*softmax)(float *x, uint32_t n, const float *sink);
#endif
    /* Optional tiles for a prefill batch (NULL: the runtime makes four dots): two adjacent rows (the
     * second starts where the first ends, its scales likewise) times two vectors, out = { row0.x0,
     * row0.x1, row1.x0, row1.x1 }, each the same bits as the dot above. Each weight is loaded once for
     * both tokens and each x once for both rows: half the loads of four dots. */
    void (*tile_f32)(const float *w, const float *x0, const float *x1, uint32_t n, float out[4]);
    void (*tile_f16)(const uint16_t *w, const float *x0, const float *x1, uint32_t n, float out[4]);
    void (*tile_bf16)(const uint16_t *w, const float *x0, const float *x1, uint32_t n, float out[4]);
    /* The quantized dtypes' tiles: two adjacent rows times the vectors x[0], x[1], out = { row0.x0, row0.x1,
     * row1.x0, row1.x1 }, each the rows kernel's bits. */
    void (*tile_q8_0)(const int8_t *w, const uint16_t *w_scale, const q8_vector *x, uint32_t blocks, float out[4]);
    void (*tile_q4_0)(const uint8_t *w, const uint16_t *w_scale, const q8_vector *x, uint32_t blocks, float out[4]);
#if defined(COLIBRI_X86_SIMD) /* the only sets with them: the other builds' tables stay as small as they were */
    /* Optional: `rows` adjacent rows (an even count) times four vectors x[0..3], out[t * out_stride + r] = row r .
     * x[t], each the rows kernel's bits (the set arranges x once for all the rows: docs/KERNELS.md) */
    void (*rows4_q8_0)(const int8_t *w, const uint16_t *w_scale, const q8_vector *x, uint32_t blocks, uint32_t rows,
                       float *out, size_t out_stride);
    void (*rows4_q4_0)(const uint8_t *w, const uint16_t *w_scale, const q8_vector *x, uint32_t blocks, uint32_t rows,
                       float *out, size_t out_stride);
#if WITH_BLOCK_DTYPES
    /* Optional, the same for Q4_K, Q5_K and Q6_K (a run of K-quant rows by four vectors: the rows kernel's bits) */
    rows4_block_fn rows4_q4_k, rows4_q5_k, rows4_q6_k;
#endif
#endif
} kernel_set;

/* The kernel set's rows for a block dtype (NULL for the others, and in the lean build). */
static inline rows_block_fn rows_block_for(const kernel_set *k, uint32_t dtype) {
#if !WITH_BLOCK_DTYPES
    (void)k, (void)dtype;
    return 0;
#else
    switch (dtype) {
    case DTYPE_Q4_1: return k->rows_q4_1;
    case DTYPE_Q5_0: return k->rows_q5_0;
    case DTYPE_Q5_1: return k->rows_q5_1;
    case DTYPE_MXFP4: return k->rows_mxfp4;
    case DTYPE_Q4_K: return k->rows_q4_k;
    case DTYPE_Q5_K: return k->rows_q5_k;
    case DTYPE_Q6_K: return k->rows_q6_k;
    default: return 0;
    }
#endif
}

/* ---- crc32.c ---- */
/* Whether this CPU has the carry-less multiplication crc32_update can fold with: CPUID on x86-64 (a trap to the
 * hypervisor in a VM), so asked once by whoever sums repeatedly, never per sum; no other build has the folding. */
#if defined(COLIBRI_X86_SIMD)
int crc32_cpu_clmul(void);
/* colibri_crc32, with crc32_cpu_clmul()'s answer given (nonzero only where it said so). */
uint32_t crc32_update(uint32_t crc, const void *data, size_t n, int clmul);
#else
static inline int crc32_cpu_clmul(void) { return 0; }
static inline uint32_t crc32_update(uint32_t crc, const void *data, size_t n, int clmul) {
    (void)clmul;
    return colibri_crc32(crc, data, n);
}
#endif

/* ---- kernels.c (scalar reference: deterministic, no FMA contraction) ---- */
float colibri_expf(float x);
uint16_t f32_to_f16(float f);  /* round to nearest even, as IEEE 754 */

/* The helpers every kernel unit calls (f16_to_f32, sum_lanes8): inline, but under -Os (the Cortex-M4's size-gated
 * build) one out-of-line copy in kernels.c, which defines KERNEL_HELPERS_HERE, instead of a static one in each unit
 * that calls them. */
#if !defined(__OPTIMIZE_SIZE__)
#define KERNEL_HELPER static inline
#elif defined(KERNEL_HELPERS_HERE)
#define KERNEL_HELPER
#endif
#ifndef KERNEL_HELPER
float f16_to_f32(uint16_t h);
float sum_lanes8(const float acc[8]);
#endif

/* f16 and bf16 widened to f32, exactly. */
static inline float f32_from_bits(uint32_t u) {
    union { uint32_t u; float f; } v = { u };
    return v.f;
}
#ifdef KERNEL_HELPER
KERNEL_HELPER float f16_to_f32(uint16_t h) {
#if defined(__ARM_FP16_FORMAT_IEEE) && defined(__ARM_FP) && (__ARM_FP & 2)
    /* the FPU's VCVTB.F32.F16 (Cortex-M4 and M55: -mfp16-format=ieee): exact, so the same bits as below */
    union { uint16_t u; __fp16 f; } half = { h };
    return (float)half.f;
#else
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, em = h & 0x7FFFu;
    if (em >= 0x7C00u) return f32_from_bits(sign | 0x7F800000u | (em & 0x3FFu) << 13); /* inf, NaN */
    if (em >= 0x0400u) return f32_from_bits(sign | (em + 0x1C000u) << 13);            /* normal: rebias 15 -> 127 */
    float v = (float)em * 5.9604644775390625e-08f;                                    /* subnormal: em * 2^-24, exact */
    return sign ? -v : v;
#endif
}
#endif
static inline float bf16_to_f32(uint16_t h) { return f32_from_bits((uint32_t)h << 16); }
/* Q8_0 of n floats into ceil(n / QBLOCK) blocks (the last zero-padded), with each block's value sum: the
 * activation side of the quantized dot products; the reference for every kernel set's quantize_q8_0. */
void quantize_q8_0_scalar(int8_t *xq, float *scale, int32_t *sum, const float *x, uint32_t n);
void swiglu_scalar(float *g, const float *u, uint32_t n);
void accumulate_f32_scalar(float *out, const float *p, const float *v, size_t stride, uint32_t rows, uint32_t n);
void accumulate_f16_scalar(float *out, const float *p, const uint16_t *v, size_t stride, uint32_t rows, uint32_t n);
/* A kernel set's accumulate_f32/_f16 (kernels.h), or the scalar one in the lean build, whose sets have no other */
#if WITH_KERNEL_ACCUMULATE
#define KERNELS_ACCUMULATE(f32, f16) .accumulate_f32 = f32, .accumulate_f16 = f16,
#define ACCUMULATE_F32(k) (k)->accumulate_f32
#define ACCUMULATE_F16(k) (k)->accumulate_f16
#else
#define KERNELS_ACCUMULATE(f32, f16)
#define ACCUMULATE_F32(k) ((void)(k), accumulate_f32_scalar)
#define ACCUMULATE_F16(k) ((void)(k), accumulate_f16_scalar)
#endif
void scores_f32_scalar(float *out, size_t out_stride, const float *k, size_t k_stride, uint32_t rows, const float *q,
                       size_t q_stride, uint32_t heads, uint32_t n);
void scores_f16_scalar(float *out, size_t out_stride, const uint16_t *k, size_t k_stride, uint32_t rows, const float *q,
                       size_t q_stride, uint32_t heads, uint32_t n);
/* A kernel set's scores_f32/_f16 and softmax (kernels.h), and SCORES_BY_DOT(name, element type, dot): one made of a set's own dot,
 * each (head, row) pair one call, which an optimizing build inlines (the sets without a scores kernel of their own);
 * SCORES_BY_DOTS(storage, set, dot32, dot16) makes scores_f32_<set> and scores_f16_<set> so. The lean build has
 * none (attention.c makes a dot per row there). */
#if WITH_KERNEL_SCORES
#define KERNELS_SCORES(f32, f16, sm) .scores_f32 = f32, .scores_f16 = f16, .softmax = sm,
#define SCORES_BY_DOT(name, type, dot)                                                                                 \
    void name(float *out, size_t out_stride, const type *k, size_t k_stride, uint32_t rows, const float *q,           \
              size_t q_stride, uint32_t heads, uint32_t n) {                                                         \
        for (uint32_t h = 0; h < heads; h++, out += out_stride, q += q_stride)                                       \
            for (uint32_t t = 0; t < rows; t++) out[t] = dot(k + t * k_stride, q, n);                                 \
    }
#define SCORES_BY_DOTS(storage, set, dot32, dot16)                                                                     \
    storage SCORES_BY_DOT(scores_f32_##set, float, dot32) storage SCORES_BY_DOT(scores_f16_##set, uint16_t, dot16)
#else
#define KERNELS_SCORES(f32, f16, sm)
#define SCORES_BY_DOTS(storage, set, dot32, dot16)
#endif
/* Row `row` of w as floats (the embedding lookup). */
void weight_row(float *out, const weight *w, uint32_t row);
/* ---- kernels_block.c: the block dtypes' scalar kernels, which every kernel set has until it has its own ---- */
void rows_q4_1_scalar(const uint8_t *w, const q8_vector *x, uint32_t blocks, uint32_t rows, float *out);
void rows_q5_0_scalar(const uint8_t *w, const q8_vector *x, uint32_t blocks, uint32_t rows, float *out);
void rows_q5_1_scalar(const uint8_t *w, const q8_vector *x, uint32_t blocks, uint32_t rows, float *out);
void rows_mxfp4_scalar(const uint8_t *w, const q8_vector *x, uint32_t blocks, uint32_t rows, float *out);
void rows_q4_k_scalar(const uint8_t *w, const q8_vector *x, uint32_t blocks, uint32_t rows, float *out);
void rows_q5_k_scalar(const uint8_t *w, const q8_vector *x, uint32_t blocks, uint32_t rows, float *out);
void rows_q6_k_scalar(const uint8_t *w, const q8_vector *x, uint32_t blocks, uint32_t rows, float *out);
#if WITH_BLOCK_DTYPES
#define KERNELS_BLOCK_DTYPES_SCALAR                                                                                    \
    .rows_q4_1 = rows_q4_1_scalar, .rows_q5_0 = rows_q5_0_scalar, .rows_q5_1 = rows_q5_1_scalar,                         \
    .rows_mxfp4 = rows_mxfp4_scalar,                                                                                   \
    .rows_q4_k = rows_q4_k_scalar, .rows_q5_k = rows_q5_k_scalar, .rows_q6_k = rows_q6_k_scalar
#else
#define KERNELS_BLOCK_DTYPES_SCALAR /* the lean build: none (its verifier refuses them) */
#endif
/* Row `row` of a block-dtype matrix as floats (weight_row's part for them). */
void weight_row_block(float *out, const weight *w, uint32_t row);
extern const kernel_set kernels_scalar;
extern const kernel_set kernels_mve, kernels_dsp, kernels_rvv; /* kernels_<isa>.c, in builds for that ISA */
const kernel_set *kernels_x86_select(void);                     /* kernels_x86.c: AVX2 if CPUID says so */
/* The fastest kernel set this build and this CPU support (CPUID on x86-64; fixed at build time elsewhere). */
const kernel_set *kernels_select(void);
float dot_f32_scalar(const float *w, const float *x, uint32_t n);
float dot_f16_scalar(const uint16_t *w, const float *x, uint32_t n);
float dot_bf16_scalar(const uint16_t *w, const float *x, uint32_t n);
/* GCC's and Clang's spellings, and MSVC's beside them (docs/BOARDS.md, "With MSVC"). The square root is
 * the instruction (sqrtss, vsqrt.f32, fsqrt.s): correctly rounded everywhere, no libm. */
#if defined(__GNUC__) || defined(__clang__)
#define ALWAYS_INLINE static inline __attribute__((always_inline))
#define NOINLINE __attribute__((noinline))
#define SQRTF(x) __builtin_sqrtf(x)
#if defined(__OPTIMIZE_SIZE__)
#define UNROLLED /* -Os (the Cortex-M4): the loop is smaller */
#else
#define UNROLLED _Pragma("GCC unroll 16") /* a short loop written once, unrolled even where GCC would not */
#endif
#else
#include <xmmintrin.h>
#define ALWAYS_INLINE static __forceinline
#define NOINLINE __declspec(noinline)
#define SQRTF(x) _mm_cvtss_f32(_mm_sqrt_ss(_mm_set_ss(x)))
#define UNROLLED
#endif

/* Accumulators start at +0. A loop, not `= { 0 }`: that becomes a memset call, which on bare metal is a
 * byte loop (the runtime is built with -fno-tree-loop-distribute-patterns, so this stays stores). */
static inline void zero_lanes8(float *acc) {
    UNROLLED for (int i = 0; i < 8; i++) acc[i] = 0.0f;
}

/* The fixed reduction trees every kernel ends with (docs/KERNELS.md): acc[i] + acc[i+4], then
 * + [i+2], then + [i+1] over 8 lanes; 16 lanes first fold acc[i] + acc[i+8]. Inline: every row ends here. */
#ifdef KERNEL_HELPER
KERNEL_HELPER float sum_lanes8(const float acc[8]) {
    float s4[4], s2[2];
    UNROLLED for (int i = 0; i < 4; i++) s4[i] = acc[i] + acc[i + 4];
    UNROLLED for (int i = 0; i < 2; i++) s2[i] = s4[i] + s4[i + 2];
    return s2[0] + s2[1];
}
#endif
static inline float sum_lanes16(const float acc[16]) {
    float s[8];
    for (int i = 0; i < 8; i++) s[i] = acc[i] + acc[i + 8];
    return sum_lanes8(s);
}

/* The exact integer dot product of block b of a Q8_0/Q4_0 row with block b of x's values. */
typedef int32_t (*block_isum_fn)(const void *w_row, const int8_t *xq, uint32_t b);

/* The float side of every quantized dot (docs/KERNELS.md): block b's integer sum times
 * (w_scale * x_scale) into lane b % 8, then the tree. An ISA supplies only `isum`, inlined here. */
ALWAYS_INLINE float dot_blocks(const void *w, const uint16_t *w_scale, const q8_vector *x, uint32_t blocks,
                               block_isum_fn isum) {
    float acc[8];
    zero_lanes8(acc);
    for (uint32_t b = 0; b < blocks; b++) acc[b % 8] += (float)isum(w, x->q, b) * (f16_to_f32(w_scale[b]) * x->scale[b]);
    return sum_lanes8(acc);
}

/* One row's quantized dot, as each kernel set computes it (dot_blocks with its isum, or its own). */
typedef float (*row_dot_fn)(const void *w, const uint16_t *w_scale, const q8_vector *x, uint32_t blocks);

/* A kernel set's rows_q8_0 / rows_q4_0: `rows` rows of row_bytes each through `dot`, inlined, so a short
 * row pays no call. x is copied first: out may alias anything a pointer to int8 reaches, and a copy keeps
 * x's pointers in registers across the stores. */
ALWAYS_INLINE void dot_rows(const void *w, const uint16_t *w_scale, const q8_vector *x, uint32_t blocks, uint32_t rows,
                            size_t row_bytes, float *out, row_dot_fn dot) {
    const q8_vector xv = *x;
    const uint8_t *row = w;
    for (float *end = out + rows; out < end; out++, row += row_bytes, w_scale += blocks) *out = dot(row, w_scale, &xv, blocks);
}
/* Q8_0 quantization of one block of len <= QBLOCK values, in two steps an ISA supplies: the largest |v|,
 * non-finite when any v is (the maximum of the magnitudes' bit patterns, as integers: that orders finite
 * magnitudes as floats do and puts infinity, then NaN, above them), then q[i] = v[i] * inv rounded to
 * nearest even and clamped to +-127 (NaN to 0), zero past len, returning the sum of the QBLOCK values. */
typedef float (*block_amax_fn)(const float *v, uint32_t len);
typedef int32_t (*block_round_fn)(int8_t *q, const float *v, uint32_t len, float inv);

/* A kernel set's quantize_q8_0: per block d = amax / 127 (the block's scale) and inv = 1 / d (0 for an
 * all-zero block), then the rounding. A block holding a NaN gets the scale NaN, one holding an infinity (and no
 * NaN) the scale infinity, and either values 0 (v * inv is NaN or v * 0): its integer sum is 0, and 0 times a
 * non-finite scale is NaN, so every dot product that reads the block is NaN, as an f32 matrix's would be
 * non-finite, and the router's and the logits' checks see it (quantized to 0 with a finite scale instead, it
 * would vanish and the logits come out finite). */
ALWAYS_INLINE void quantize_blocks(int8_t *xq, float *scale, int32_t *sum, const float *x, uint32_t n, block_amax_fn amax,
                                   block_round_fn round) {
    for (uint32_t b = 0; b * QBLOCK < n; b++) {
        const uint32_t len = n - b * QBLOCK < QBLOCK ? n - b * QBLOCK : QBLOCK;
        const float d = amax(x + b * QBLOCK, len) / 127.0f, inv = d != 0.0f ? 1.0f / d : 0.0f;
        scale[b] = d;
        sum[b] = round(xq + b * QBLOCK, x + b * QBLOCK, len, inv);
    }
}
/* out = x / rms(x) * w; w NULL: no weights (Gemma 4's v norm) */
void rmsnorm(float *out, const float *x, const float *w, uint32_t n, float eps);
/* tanh from colibri_expf: 1 - 2 / (e^2x + 1), which is 1 once e^2x overflows (Gemma 4's GeGLU and logit cap).
 * Inline: only the builds that use it carry it. */
static inline float tanh_f(float x) { return 1.0f - 2.0f / (colibri_expf(2.0f * x) + 1.0f); }
/* gelu's tanh approximation, transformers' gelu_pytorch_tanh: x/2 (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) */
static inline float gelu_tanh(float x) {
    return 0.5f * x * (1.0f + tanh_f(0.7978845608028654f * (x + 0.044715f * (x * x * x))));
}
/* softmax over x[0, n); with a sink (gpt-oss: the head's learned logit) one more logit in the denominator only,
 * so the n probabilities may sum to less than 1. */
void softmax(float *x, uint32_t n, const float *sink);

#endif
