/* Internal declarations shared by the runtime's translation units. Not part of the API. */
#ifndef COLIBRI_INTERNAL_H
#define COLIBRI_INTERNAL_H

#include "colibri.h"
#include "format.h" /* the image format: sizes, flags, field offsets, roles (docs/FORMAT.md) */

#include "mechanisms.h" /* what this build computes: everything, or the lean build's part */

/* x86-64 under GCC, Clang or MSVC with its SIMD kernels (x86.h has their intrinsics): CPUID chooses the kernels
 * and the CRC at open. */
#if (defined(__x86_64__) || defined(_M_X64)) && !defined(COLIBRI_KERNELS_SCALAR)
#define COLIBRI_X86_SIMD 1
#endif

typedef struct {
    uint32_t vocab, dim, ffn, n_layers, n_heads, n_kv_heads, head_dim, n_experts, top_k, max_seq;
    uint32_t dense_ffn, shared_ffn; /* dense MLP and shared expert intermediate sizes (0: none) */
    uint32_t flags;
    uint32_t kv_dtype;              /* KV_F32 or KV_F16 */
    float eps, clip_qkv;            /* clip_qkv 0: no clipping */
    uint32_t window;                /* sliding window W of the windowed layers (0: none), 1 <= W <= max_seq */
    uint8_t window_layers[IMG_WINDOW_LAYER_BYTES]; /* bit l % 8 of byte l / 8: layer l is windowed (a copy:
                                                    * the KV plan must not follow an image that changes) */
    /* Multi-head latent attention when kv_lora > 0 (DeepSeek): head_dim is a q/k head (nope + rope_dim), the
     * KV cache holds the normed latent and the rotated rope part per position, and values are the latent. */
    uint32_t q_lora, kv_lora, rope_dim, v_head_dim; /* q_lora 0: q = Wq x; rope_dim: the last dims of a head */
    float attn_scale;                               /* the softmax scale, as the host computed it */
    uint32_t n_group, topk_group, group_top;        /* group-limited routing (n_group 1: none) */
    float routed_scale;                             /* times the routed experts' weights */
    float swiglu_alpha, swiglu_limit;               /* limit > 0: the experts' clamped SwiGLU (gpt-oss) */
    /* Gemma 4: the global (not windowed) layers' head size and KV heads (else head_dim and n_kv_heads) */
    uint32_t global_head_dim, global_kv_heads;
    float embed_scale, logit_softcap;               /* 0: none */
    uint32_t ple_dim;                               /* Gemma 4's per-layer inputs: P per layer and token (0: none) */
    uint32_t first_shared;                          /* Gemma 4: layers from it on share an earlier layer's KV cache */
    uint32_t kv_shared_source[2];                   /* the cache a sharing layer reads, [windowed] (IMG_NO_INDEX: none) */
    uint32_t q_dim, kv_dim, ffn_max;                /* the widest of any layer; kv_dim: a K cache row */
    uint32_t att_dim, val_dim, o_dim;               /* per head: what attention dots and sums (the widest); Wo's input */
    uint32_t in_blocks;             /* blocks of QBLOCK in the longest matvec input (for the quantized x) */
    uint32_t n_tensors;             /* table entries: 3 + n_layers * (LAYER_FIXED + 3 * n_experts) + 2 */
    /* the two tiers: set by image_verify() from the header and the table */
    uint64_t resident_bytes;        /* [0, resident_bytes) is read in place */
    uint64_t expert_block_max;      /* the largest routed expert block (gate, up, down and scales) */
    uint32_t streamed_experts;      /* routed experts past resident_bytes */
    uint64_t expert_crc_offset;     /* the expert CRC table: u32 per (layer, expert), layer-major */
    uint64_t prefill_token_bytes;   /* batch_plan(d, 1) */
} model_dims;

/* Sliding-window attention: a windowed layer's token at position p sees positions p - W + 1 .. p, and its
 * KV cache is a ring of W rows (position p in row p % W); every other layer keeps max_seq rows. */
static inline int layer_windowed(const model_dims *d, uint32_t layer) {
    return d->window && layer < 8u * IMG_WINDOW_LAYER_BYTES && ((d->window_layers[layer / 8u] >> (layer % 8u)) & 1u);
}
static inline uint32_t kv_rows(const model_dims *d, uint32_t layer) {
    return layer_windowed(d, layer) ? d->window : d->max_seq;
}
/* A layer's head size and KV heads: Gemma 4's global layers have their own. */
static inline uint32_t layer_head_dim(const model_dims *d, uint32_t layer) {
    return WITH_GEMMA4 && !layer_windowed(d, layer) ? d->global_head_dim : d->head_dim;
}
static inline uint32_t layer_kv_heads(const model_dims *d, uint32_t layer) {
    return WITH_GEMMA4 && !layer_windowed(d, layer) ? d->global_kv_heads : d->n_kv_heads;
}
/* Whether a layer shares an earlier layer's KV cache (Gemma 4's num_kv_shared_layers): it computes no k or v. */
static inline int layer_kv_shared(const model_dims *d, uint32_t layer) { return WITH_GEMMA4 && layer >= d->first_shared; }
/* The layer whose KV cache `layer` attends over: itself, or for a sharing layer the last layer before the sharing
 * ones of the same kind, windowed or not (read_dims finds both once; the verifier checks there is one). */
static inline uint32_t kv_source(const model_dims *d, uint32_t layer) {
    return layer_kv_shared(d, layer) ? d->kv_shared_source[layer_windowed(d, layer)] : layer;
}
/* One position's K (and V) cache row in a layer: MLA's latent and rope key, or its KV heads; none when it shares. */
static inline uint32_t layer_kv_dim(const model_dims *d, uint32_t layer) {
    if (layer_kv_shared(d, layer)) return 0;
    return WITH_MLA && d->kv_lora ? d->kv_dim : layer_kv_heads(d, layer) * layer_head_dim(d, layer);
}
/* A layer's dense MLP width: Gemma 4's KV-sharing layers may have it doubled. */
static inline uint32_t layer_dense_ffn(const model_dims *d, uint32_t layer) {
    return d->dense_ffn << (WITH_GEMMA4 && (d->flags & IMG_FLAG_DOUBLE_WIDE_MLP) && layer_kv_shared(d, layer));
}

/* ---- the work arena (mirrors arena_plan() in colibri/image.py) ---- */
#define ARENA_CTX_BYTES 1280u

/* One table entry as open() decoded and bounds-checked it: the forward pass reads these, never the
 * image's table, so an image that changes after open can change values but never where reads go.
 * Offsets, not pointers: the same 32 bytes on every board, and an expert's place inside a cache slot
 * is its offset minus its block's. */
typedef struct {
    uint64_t offset;         /* of the values, from the image start */
    uint64_t scales;         /* of the Q8_0/Q4_0 block scales (0: a float dtype) */
    uint32_t rows, cols;     /* rows 0: an empty slot; cols 1 for a vector */
    uint32_t dtype, reserved;
} tensor_ref;
#define TENSOR_REF_BYTES 32u

typedef struct {
    tensor_ref *tensors; /* every table entry, decoded at open */
    float *x, *xn, *q, *q_a, *k_new, *v_new, *q_att, *attn_out, *o_in, *ple, *att, *ffn_gate, *ffn_up, *ffn_out, *moe_out;
    float *router, *topk_weight; /* router: the experts' scores, then their choice scores */
    uint32_t *topk_index;
    uint64_t *topk_cycles; /* for the trace hook */
    float *logits, *probs;
    uint32_t *sample_index;
    /* Matvec inputs quantized to Q8_0 for Q8_0/Q4_0 weights: values, block scales, block sums.
     * xq holds the normed x (xn), quantized once for all the matvecs that read it (q, k, v; every
     * expert's gate and up; lm_head); hq any other input (the attention output, an expert's hidden). */
    int8_t *xq, *hq;
    float *xq_scale, *hq_scale;
    int32_t *xq_sum, *hq_sum;
    void *k_cache, *v_cache; /* f32 or f16 (the image's kv_dtype); MLA has no v_cache */
} arena_buffers;

/* Total arena bytes for `d` in *total; if base != NULL also point `out` into base. Returns
 * COLIBRI_E_IMAGE_DIMS if the plan overflows size_t. */
colibri_status arena_plan(const model_dims *d, uint8_t *base, arena_buffers *out, uint64_t *total);

/* The activations of the n tokens one forward pass computes together (model.c): the plan's buffers for
 * one token, or the prefill batch region for up to colibri_options.prefill_batch. Token t's vector starts
 * at t times the vector's length (dim, q_dim, kv_dim, ffn_max, top_k, in_blocks blocks). */
typedef struct {
    uint32_t n;
    float *x, *xn, *q, *q_a, *k, *v, *q_att, *attn_out, *o_in, *ple, *moe_out, *gate, *up, *ffn_out;
    /* ple: Gemma 4's per-layer inputs, n_layers * ple_dim a token, then ple_dim a token of scratch */
    float *gx;                 /* the xn rows of one expert's tokens, gathered */
    float *expert_out;         /* a batch's routed expert outputs per (token, rank); NULL for one token */
    /* a batch's (token, rank) pairs, as token * top_k + rank, linked by expert: each expert's first pair
     * (n_experts), and each pair's next one that chose the same expert (n * top_k); NULL for one token */
    uint32_t *first_pair, *next_pair;
    float *scalar;             /* one float per token (the shared expert's gate) */
    uint32_t *topk_index;
    float *topk_weight;
    int8_t *xq, *hq;           /* xn quantized to Q8_0 (once per norm), and any other input */
    float *xq_scale, *hq_scale;
    int32_t *xq_sum, *hq_sum;
} token_buffers;

/* The window rings' rows a prefill pass overwrites, saved before it (model.c, "a prefill batch and the window
 * rings"), in the prefill batch region after the token buffers: per cache-owning windowed layer, in layer order,
 * `rows` K rows then as many V rows (MLA: K only), in the cache's dtype. shared: those of the windowed layer
 * Gemma 4's sharing layers read (NULL: none). rows = min(batch, window), 0 without a window (and in the lean
 * build, which feeds a windowed model one token a pass). Not in token_buffers: a copy of those is made per pass. */
typedef struct {
    uint8_t *saved, *shared;
    uint32_t rows;
} ring_saves;

/* The prefill batch region's layout for `tokens` tokens: its bytes, and if base != NULL `out` pointed
 * into it. Every buffer starts 64-byte aligned, so batch_plan(d, n) <= n * batch_plan(d, 1), the bytes
 * colibri_prefill_bytes() asks for. */
uint64_t batch_plan(const model_dims *d, uint32_t tokens, uint8_t *base, token_buffers *out, ring_saves *rings);

/* ---- the expert cache (experts.c; docs/STREAMING.md) ---- */
enum slot_state { SLOT_EMPTY = 0, SLOT_READY, SLOT_PENDING };
/* One cache slot's bookkeeping; the slot's bytes are slot_data + index * slot_bytes. */
typedef struct {
    uint32_t layer, expert, state, prefetched; /* prefetched: fetched on a guess, not yet used */
    uint64_t last_use;                         /* the layer step that last used it (LRU) */
    uint64_t pad;
} expert_slot;
#define EXPERT_SLOT_META_BYTES 32u

typedef struct {
    expert_slot *slots;
    uint32_t *crcs;      /* the image's expert CRC table (per (layer, expert), layer-major), as open copied it */
    uint8_t *slot_data;
    uint64_t slot_bytes;
    uint32_t n_slots;
    uint64_t step; /* one per MoE layer evaluation: the LRU clock */
} expert_cache;

/* One weight matrix as the kernels see it (rows x cols, row-major). Quantized dtypes store each row
 * as ceil(cols / QBLOCK) blocks, the last one zero-padded, with one f16 scale per block. */
typedef struct {
    const void *data;        /* f32 / f16 / bf16 elements, int8 values, or packed int4 pairs */
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
    /* x (n floats) quantized to Q8_0 as quantize_q8_0_scalar does, bit for bit */
    void (*quantize_q8_0)(int8_t *xq, float *scale, int32_t *sum, const float *x, uint32_t n);
    /* SwiGLU in place: g[i] = g[i] / (1 + colibri_expf(-g[i])) * u[i], as swiglu_scalar computes it */
    void (*swiglu)(float *g, const float *u, uint32_t n);
    /* Optional tiles for a prefill batch (NULL: the runtime makes four dots): two adjacent rows (the
     * second starts where the first ends, its scales likewise) times two vectors, out = { row0.x0,
     * row0.x1, row1.x0, row1.x1 }, each the same bits as the dot above. Each weight is loaded once for
     * both tokens and each x once for both rows: half the loads of four dots. */
    void (*tile_f32)(const float *w, const float *x0, const float *x1, uint32_t n, float out[4]);
    void (*tile_f16)(const uint16_t *w, const float *x0, const float *x1, uint32_t n, float out[4]);
    void (*tile_bf16)(const uint16_t *w, const float *x0, const float *x1, uint32_t n, float out[4]);
    void (*tile_q8_0)(const int8_t *w, const uint16_t *w_scale, const q8_vector *x0, const q8_vector *x1,
                      uint32_t blocks, float out[4]);
    void (*tile_q4_0)(const uint8_t *w, const uint16_t *w_scale, const q8_vector *x0, const q8_vector *x1,
                      uint32_t blocks, float out[4]);
} kernel_set;

struct colibri_ctx {
    const kernel_set *kernels;
    const uint8_t *image;
    colibri_image_info info;
    model_dims d;
    arena_buffers a;
    colibri_options opts;
    uint32_t pos;        /* tokens in the KV cache */
    int have_logits;
    int xn_quantized;    /* a.xq holds a.xn quantized (reset whenever xn is written) */
    int crc_clmul;       /* crc32_cpu_clmul(), asked at open: every fetched expert block is summed */
    expert_cache cache;  /* n_slots 0: experts read in place */
    token_buffers batch; /* the prefill batch region (n 0: none) */
    ring_saves rings;    /* in it, the window rings' saved rows */
    colibri_stats stats;
};

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

/* ---- image.c ---- */
uint32_t rd32(const uint8_t *p);
uint64_t rd64(const uint8_t *p);
/* Verification; fills dims and the table pointer on success. Mode 0: the whole image must be
 * addressable and is checked, expert blocks included. IMG_VERIFY_RESIDENT: only [0, resident_bytes)
 * must be; expert-part blocks are checked when fetched (experts.c). */
#define IMG_VERIFY_RESIDENT 1u
#define IMG_VERIFY_NO_CRC 2u /* every check but the CRCs over tensor and metadata bytes (colibri_image_inspect) */
colibri_status image_verify(const uint8_t *img, size_t size, unsigned mode, model_dims *d, const uint8_t **table,
                            colibri_image_info *info);
uint32_t layer_tensor_index(const model_dims *d, uint32_t layer, uint32_t role);
uint32_t expert_tensor_index(const model_dims *d, uint32_t layer, uint32_t expert, uint32_t role);
uint32_t global_tensor_index(const model_dims *d, uint32_t role);
/* Whether a table slot holds a tensor: its entry has dimensions (the verifier checked it matches the flags). */
int tensor_present(const uint8_t *table, uint32_t index);
/* Decode every entry of a verified table into refs (open() does this once). */
void tensors_resolve(const uint8_t *table, uint32_t n_tensors, tensor_ref *refs);

/* ---- kernels.c (scalar reference: deterministic, no FMA contraction) ---- */
float colibri_expf(float x);
uint16_t f32_to_f16(float f);  /* round to nearest even, as IEEE 754 */

/* f16 and bf16 widened to f32, exactly; inline because every quantized block converts its scale. */
static inline float f32_from_bits(uint32_t u) {
    union { uint32_t u; float f; } v = { u };
    return v.f;
}
static inline float f16_to_f32(uint16_t h) {
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
static inline float bf16_to_f32(uint16_t h) { return f32_from_bits((uint32_t)h << 16); }
/* Q8_0 of n floats into ceil(n / QBLOCK) blocks (the last zero-padded), with each block's value sum: the
 * activation side of the quantized dot products; the reference for every kernel set's quantize_q8_0. */
void quantize_q8_0_scalar(int8_t *xq, float *scale, int32_t *sum, const float *x, uint32_t n);
void swiglu_scalar(float *g, const float *u, uint32_t n);
/* Row `row` of w as floats (the embedding lookup). */
void weight_row(float *out, const weight *w, uint32_t row);
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
#define SQRTF(x) __builtin_sqrtf(x)
#if defined(__OPTIMIZE_SIZE__)
#define UNROLLED /* -Os (the Cortex-M4): the loop is smaller */
#else
#define UNROLLED _Pragma("GCC unroll 16") /* a short loop written once, unrolled even where GCC would not */
#endif
#else
#include <xmmintrin.h>
#define ALWAYS_INLINE static __forceinline
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
static inline float sum_lanes8(const float acc[8]) {
    float s4[4], s2[2];
    UNROLLED for (int i = 0; i < 4; i++) s4[i] = acc[i] + acc[i + 4];
    UNROLLED for (int i = 0; i < 2; i++) s2[i] = s4[i] + s4[i + 2];
    return s2[0] + s2[1];
}
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

/* Where routed expert (layer, expert)'s block starts in the image, and its bytes (gate to end of down). */
void expert_block(const colibri_ctx *c, uint32_t layer, uint32_t expert, uint64_t *offset, uint64_t *bytes);

/* ---- experts.c ---- */
/* Start making layer's routed top-k (a.topk_index) readable: slot[k] is expert k's cache slot,
 * fetched on a miss, or NO_SLOT (0xFFFFFFFF) when it is pinned in the resident part. */
colibri_status experts_load(colibri_ctx *c, uint32_t layer, uint32_t *slot);
/* Expert k ready to read: waits for its fetch and checks its CRC. *block holds the bytes of its
 * block, which starts at image offset *block_offset. */
colibri_status expert_ready(colibri_ctx *c, uint32_t slot, uint32_t layer, uint32_t expert, const uint8_t **block,
                            uint64_t *block_offset);
/* A prefetch guess: start fetching (layer, expert) into a slot this step does not use, if any. */
void experts_fetch_ahead(colibri_ctx *c, uint32_t layer, uint32_t expert);
/* Wait for every fetch in flight (no transfer may outlive a feed). The first failure of a block the
 * router chose; a guess that fails (its fetch or its CRC) is only dropped. */
colibri_status experts_settle(colibri_ctx *c);

/* The board's cycle counter, 0 without one (colibri.c: one copy, not one per file at -Os) */
uint64_t ctx_now(const colibri_ctx *c);

/* ---- model.c ---- */
/* n tokens through the model at the next positions, together (n > 1 needs the prefill batch region);
 * with want_logits also the final norm and lm_head of the last one (a prefill needs no other).
 * COLIBRI_E_NONFINITE (and the position not advanced: none of the n is fed, and the window rings' rows the
 * pass wrote are put back; colibri_feed replays the pass one token at a time to feed the ones before the culprit) when a NaN or infinity
 * reaches a place where comparisons would silently absorb it: the router's probabilities (a NaN never
 * wins a '>' and expert 0 would be taken) or the logits (the sampler's argmax). */
colibri_status model_forward(colibri_ctx *c, const uint32_t *tokens, uint32_t n, int want_logits);

/* ---- sampler.c ---- */
uint32_t sample_token(colibri_sampler *s, const float *logits, float *probs, uint32_t *index, uint32_t n);

#endif
