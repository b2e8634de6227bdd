/* The image as the runtime reads it: the model's dimensions (model_dims, read from the header by the verifier),
 * the tensor table decoded at open (tensor_ref) and the verifier's entry points (image.c, table.c). */
#ifndef COLIBRI_IMAGE_H
#define COLIBRI_IMAGE_H

#include "colibri.h"
#include "format.h"     /* the image format: sizes, layer records, field offsets, roles (docs/FORMAT.md) */
#include "mechanisms.h" /* what this build computes */

/* A layer kind, as the verifier resolved its record (docs/FORMAT.md "Layers"): the header's value where the record
 * has 0, so every later read takes it from here, never from the image. */
typedef struct {
    uint8_t attention, ffn, router, activation, qk_norm, shared; /* LAYER_ATTN_*, LAYER_FFN_*, ... */
    uint32_t options;                /* LAYER_OPT_* bits */
    uint32_t head_dim, kv_heads;     /* the layer's q/k head size and KV heads */
    uint32_t window;                 /* W (0: none) */
    uint32_t kv_source;              /* the layer whose KV cache it reads (IMG_NO_INDEX: its own) */
    uint32_t dense_ffn;              /* its dense MLP's width (0: none) */
} layer_kind;

typedef struct {
    uint32_t vocab, dim, ffn, n_layers, n_heads, n_kv_heads, head_dim, n_experts, top_k, max_seq;
    uint32_t dense_ffn, shared_ffn; /* dense MLP and shared expert intermediate sizes (0: none) */
    uint32_t kv_dtype;              /* KV_F32 or KV_F16 */
    float eps, clip_qkv;            /* clip_qkv 0: no clipping */
    uint32_t window;                /* the W of the windowed layers (every one has the same; 0: none) */
    uint32_t global_head_dim;       /* the head size of the layers rotating with GLOBAL_ROPE's tables (0: none) */
    uint32_t shared_ring;           /* the windowed layer whose ring the windowed sharing layers read (IMG_NO_INDEX: none) */
    /* Multi-head latent attention when kv_lora > 0 (DeepSeek): head_dim is a q/k head (nope + rope_dim), the
     * KV cache holds the normed latent and the rotated rope part per position, and values are the latent. */
    uint32_t q_lora, kv_lora, rope_dim, v_head_dim; /* q_lora 0: q = Wq x; rope_dim: the last dims of a head */
    float attn_scale;                               /* the softmax scale, as the host computed it */
    uint32_t n_group, topk_group, group_top;        /* group-limited routing (n_group 1: none) */
    float routed_scale;                             /* times the routed experts' weights */
    float swiglu_alpha, swiglu_limit;               /* limit > 0: the experts' clamped SwiGLU (gpt-oss) */
    float embed_scale, logit_softcap;               /* 0: none */
    uint32_t ple_dim;                               /* Gemma 4's per-layer inputs: P per layer and token (0: none) */
    uint32_t conv_kernel;                           /* the SHORT_CONV and DELTA_NET layers' kernel size (0: none) */
    uint32_t dn_k_heads, dn_v_heads, dn_k_dim, dn_v_dim; /* the DELTA_NET layers' heads and head sizes (0: none) */
    uint32_t dn_conv;                               /* 2·Hk·dk + Hv·dv: the channels a DeltaNet convolves */
    uint32_t mix_dim;                               /* per token, the widest conv or DeltaNet projections (plan: mix) */
    uint32_t options_any;                           /* every layer's options together */
    float topk_norm_eps;                            /* NORM_TOPK divides by the top-k weights' sum plus it */
    uint32_t q_dim, kv_dim, ffn_max;                /* the widest of any layer; kv_dim: a K cache row */
    uint32_t att_dim, val_dim, o_dim;               /* per head: what attention dots and sums (the widest); Wo's input */
    uint32_t in_blocks;             /* blocks of QBLOCK in the longest matvec input (for the quantized x) */
    uint32_t n_tensors;             /* the dense index: 3 + n_layers * (LAYER_FIXED + 3 * n_experts) + 7 slots */
    uint32_t n_entries;             /* the table's entries: the tensors present */
    /* the two tiers: set by image_verify() from the header and the table */
    uint64_t resident_bytes;        /* [0, resident_bytes) is read in place */
    uint64_t expert_block_max;      /* the largest routed expert block (gate, up, down and scales) */
    uint32_t streamed_experts;      /* routed experts past resident_bytes */
    uint64_t expert_crc_offset;     /* the expert CRC table: u32 per (layer, expert), layer-major */
    uint64_t table_offset, data_offset; /* the tensor table; where tensor bytes start */
    uint64_t tensors_end;           /* where routed experts' bytes must end: the metadata section or image_bytes */
    uint64_t prefill_token_bytes;   /* batch_plan(d, 1) */
    /* the layers' kinds: layer l is kinds[kind_of[l]] (copies: the KV plan must not follow an image that changes);
     * last, so that the fields above keep short offsets */
    layer_kind kinds[IMG_MAX_LAYER_KINDS];
    uint8_t kind_of[IMG_MAX_LAYERS];
} model_dims;

static inline const layer_kind *kind_of(const model_dims *d, uint32_t layer) { return &d->kinds[d->kind_of[layer]]; }
/* Sliding-window attention: a windowed layer's token at position p sees positions p - W + 1 .. p, and its
 * KV cache is a ring of W rows (position p in row p % W); every other layer keeps max_seq rows. */
static inline int layer_windowed(const model_dims *d, uint32_t layer) { return kind_of(d, layer)->window != 0; }
uint32_t kv_rows(const model_dims *d, uint32_t layer); /* table.c */
/* A layer's head size and KV heads: the header's, but in Gemma 4's layers with a geometry of their own. */
static inline uint32_t layer_head_dim(const model_dims *d, uint32_t layer) {
    return WITH_GEMMA4 ? kind_of(d, layer)->head_dim : d->head_dim;
}
static inline uint32_t layer_kv_heads(const model_dims *d, uint32_t layer) {
    return WITH_GEMMA4 ? kind_of(d, layer)->kv_heads : d->n_kv_heads;
}
/* Whether a layer shares an earlier layer's KV cache (Gemma 4's num_kv_shared_layers): it computes no k or v. */
static inline int layer_kv_shared(const model_dims *d, uint32_t layer) {
    return WITH_GEMMA4 && kind_of(d, layer)->kv_source != IMG_NO_INDEX;
}
/* The layer whose KV cache `layer` attends over: itself, or the one its record names. */
static inline uint32_t kv_source(const model_dims *d, uint32_t layer) {
    return layer_kv_shared(d, layer) ? kind_of(d, layer)->kv_source : layer;
}
/* Whether a layer is a short convolution (LFM2's) or a Gated DeltaNet (Qwen3.5's): it keeps no KV cache, but a state
 * (blocks/state.c). */
static inline int layer_conv(const model_dims *d, uint32_t layer) {
    return WITH_SHORT_CONV && kind_of(d, layer)->attention == LAYER_ATTN_SHORT_CONV;
}
static inline int layer_delta(const model_dims *d, uint32_t layer) {
    return WITH_DELTA_NET && kind_of(d, layer)->attention == LAYER_ATTN_DELTA_NET;
}
/* One position's K (and V) cache row in a layer: MLA's latent and rope key, or its KV heads; none when it shares or
 * convolves. */
static inline uint32_t layer_kv_dim(const model_dims *d, uint32_t layer) {
    if (layer_kv_shared(d, layer) || layer_conv(d, layer) || layer_delta(d, layer)) return 0;
    return WITH_MLA && d->kv_lora ? d->kv_dim : layer_kv_heads(d, layer) * layer_head_dim(d, layer);
}
static inline uint32_t layer_dense_ffn(const model_dims *d, uint32_t layer) { return kind_of(d, layer)->dense_ffn; }

/* One table entry as open() decoded and bounds-checked it: the forward pass reads these, never the
 * image's table, so an image that changes after open can change values but never where reads go.
 * Offsets, not pointers: the same 32 bytes on every board, and an expert's place inside a cache slot
 * is its offset minus its block's. */
typedef struct {
    uint64_t offset;         /* of the values, from the image start */
    uint64_t scales;         /* of the Q8_0/Q4_0 block scales (0: none apart) */
    uint32_t rows, cols;     /* rows 0: absent (the table does not list it); cols 1 for a vector */
    uint32_t dtype, reserved;
} tensor_ref;
#define TENSOR_REF_BYTES 32u

/* Each dtype's storage (format.h's IMG_DTYPES, from format/schema.toml): a row's elements in blocks of `block`, each
 * block `bytes` long, and `scale_bytes` of f16 scale per block in the tensor's scales (0: none apart, the block holds
 * its own or the dtype is a float one). */
typedef struct { uint16_t block; uint8_t bytes, scale_bytes; } dtype_traits;
extern const dtype_traits DTYPE_TRAITS[DTYPE_COUNT];

/* Checked arithmetic: return 0 on overflow. */
static inline int add_ok(uint64_t a, uint64_t b, uint64_t *r) { *r = a + b; return *r >= a; }
static inline int mul_ok(uint64_t a, uint64_t b, uint64_t *r) {
    if (a != 0 && b > UINT64_MAX / a) return 0;
    *r = a * b;
    return 1;
}
static inline int align_ok(uint64_t a, uint64_t *r) {
    if (!add_ok(a, IMG_ALIGN - 1, r)) return 0;
    *r &= ~(uint64_t)(IMG_ALIGN - 1);
    return 1;
}

/* ---- image.c ---- */
/* A little-endian u32 of the image, at any alignment: inline where the verifier reads the header (a compiler turns it
 * into one load where the target allows), and rd32 out of line, the one entry the table's reads go through. */
static inline uint32_t le32(const uint8_t *p) {
#if (defined(__GNUC__) || defined(__clang__)) && defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    uint32_t v;
    __builtin_memcpy(&v, p, 4);
    return v;
#else
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
#endif
}
/* Little-endian fields of the image, at any alignment. */
uint16_t rd16(const uint8_t *p);
uint32_t rd32(const uint8_t *p);
uint64_t rd64(const uint8_t *p);
/* Verification; fills dims (and info) on success. Mode 0: the whole image must be addressable and is checked, expert
 * blocks included. IMG_VERIFY_RESIDENT: only [0, resident_bytes) must be; expert-part blocks are checked when fetched
 * (experts.c). */
#define IMG_VERIFY_RESIDENT 1u
#define IMG_VERIFY_NO_CRC 2u /* every check but the CRCs over tensor and metadata bytes (colibri_image_inspect) */
colibri_status image_verify(const uint8_t *img, size_t size, unsigned mode, model_dims *d, colibri_image_info *info);

/* ---- table.c ---- */
/* The verifier's table walk, for a model of dims d (image_verify's): each entry the table lists against the tensor of
 * the dense index's slot it is in (role, shape, dtype, bytes, bounds, the SwiGLU blocks' contiguity, each routed
 * expert's block in one tier and, when addressable and not IMG_VERIFY_NO_CRC, its CRC). Sets d->expert_block_max and
 * d->streamed_experts. With refs, refs[d->n_tensors] gets each slot's place (rows 0: absent; garbage on failure):
 * open() walks a second time to fill the arena's dense index, the only reads of the table after verification. */
colibri_status table_walk(const uint8_t *img, model_dims *d, unsigned mode, tensor_ref *refs);
uint32_t layer_tensor_index(const model_dims *d, uint32_t layer, uint32_t role);
uint32_t expert_tensor_index(const model_dims *d, uint32_t layer, uint32_t expert, uint32_t role);
uint32_t global_tensor_index(const model_dims *d, uint32_t role);

#endif
