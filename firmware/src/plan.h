/* The arena's plan: every buffer the forward pass uses, sized from the image's dimensions (arena.c), the prefill
 * batch region, and the expert cache's bookkeeping (experts.c; docs/STREAMING.md). */
#ifndef COLIBRI_PLAN_H
#define COLIBRI_PLAN_H

#include "image.h"

/* ---- the work arena (mirrors arena_plan() in colibri/plan.py) ---- */

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
    float *mix;                /* a short convolution's or a DeltaNet's projections (blocks/conv.c, deltanet.c) */
    float *q_gate;             /* the attention gate's projection (ATTN_GATE) */
    float *state, *state_saved; /* the layers' state (blocks/state.c), and its copy from before the pass */
    void *k_cache, *v_cache; /* f32 or f16 (the image's kv_dtype); MLA has no v_cache */
} arena_buffers;

/* Total arena bytes for `d` in *total; if base != NULL also point `out` into base. Returns
 * COLIBRI_E_IMAGE_DIMS if the plan overflows size_t. */
colibri_status arena_plan(const model_dims *d, uint8_t *base, arena_buffers *out, uint64_t *total);

/* The activations of the n tokens one forward pass computes together (model.c and its blocks): the plan's buffers for
 * one token, or the prefill batch region for up to colibri_options.prefill_batch. Token t's vector starts
 * at t times the vector's length (dim, q_dim, kv_dim, ffn_max, top_k, in_blocks blocks). */
typedef struct {
    uint32_t n;
    float *x, *xn, *q, *q_a, *k, *v, *q_att, *attn_out, *o_in, *ple, *moe_out, *gate, *up, *ffn_out;
    /* ple: Gemma 4's per-layer inputs, n_layers * ple_dim a token, then ple_dim a token of scratch */
    float *gx;                 /* the xn rows of one expert's tokens, gathered */
    float *mix;                /* a short convolution's or a DeltaNet's projections (mix_dim a token) */
    float *q_gate;             /* the attention gate's projection (q_dim a token) */
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

/* The window rings' rows a prefill pass overwrites, saved before it (blocks/rings.c, "a prefill batch and the window
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

#endif
