/* The arena's plan: every buffer the forward pass uses, sized from the image's dimensions (arena.c), the prefill
 * batch region, and the expert cache's bookkeeping (experts.c; docs/STREAMING.md). */
#ifndef COLIBRI_PLAN_H
#define COLIBRI_PLAN_H

#include "image.h"

/* ---- the work arena (mirrors arena_plan() in colibri/plan.py) ---- */

/* The buffers of each lifetime in order, X(buffer, element bytes, count, condition): C over model_dims d (and the
 * local kv_cache, and a pass's n tokens) that arena.c's plans expand; a model buffer is a field of arena_buffers,
 * a pass buffer one of token_buffers */
/* schema:plan (written by python -m colibri.schema from format/schema.toml) */
#define PLAN_MODEL_BUFFERS(X) X(tensors, TENSOR_REF_BYTES, (uint64_t)d->n_tensors, 1) X(x, 4u, (uint64_t)d->dim, 1) \
    X(xn, 4u, (uint64_t)d->dim, 1) X(q, 4u, (uint64_t)d->q_dim, 1) \
    X(q_a, 4u, (uint64_t)d->q_lora, WITH_MLA && d->kv_lora != 0) X(k_new, 4u, (uint64_t)d->kv_dim, 1) \
    X(v_new, 4u, (uint64_t)d->kv_dim, !(WITH_MLA && d->kv_lora != 0)) \
    X(q_att, 4u, (uint64_t)d->n_heads * d->att_dim, WITH_MLA && d->kv_lora != 0) \
    X(attn_out, 4u, (uint64_t)d->n_heads * d->val_dim, 1) \
    X(o_in, 4u, (uint64_t)d->o_dim, WITH_MLA && d->kv_lora != 0) \
    X(ple, 4u, (uint64_t)(d->n_layers + 1u) * d->ple_dim, WITH_PER_LAYER_INPUTS && d->ple_dim != 0) \
    X(att, 4u, (uint64_t)d->n_heads * d->max_seq, 1) X(ffn_gate, 4u, (uint64_t)d->ffn_max, 1) \
    X(ffn_up, 4u, (uint64_t)d->ffn_max, 1) X(ffn_out, 4u, (uint64_t)d->dim, 1) X(moe_out, 4u, (uint64_t)d->dim, 1) \
    X(router, 4u, (uint64_t)2u * d->n_experts + (uint64_t)d->n_group, 1) X(topk_weight, 4u, (uint64_t)d->top_k, 1) \
    X(topk_index, 4u, (uint64_t)d->top_k, 1) X(topk_cycles, 8u, (uint64_t)d->top_k, 1) \
    X(logits, 4u, (uint64_t)d->vocab, 1) X(probs, 4u, (uint64_t)d->vocab, 1) \
    X(sample_index, 4u, (uint64_t)d->vocab, 1) X(xq, 1u, (uint64_t)d->in_blocks * QBLOCK, 1) \
    X(xq_scale, 4u, (uint64_t)d->in_blocks, 1) X(xq_sum, 4u, (uint64_t)d->in_blocks, 1) \
    X(hq, 1u, (uint64_t)d->in_blocks * QBLOCK, 1) X(hq_scale, 4u, (uint64_t)d->in_blocks, 1) \
    X(hq_sum, 4u, (uint64_t)d->in_blocks, 1) \
    X(mix, 4u, (uint64_t)d->mix_dim, (WITH_SHORT_CONV || WITH_DELTA_NET) && d->conv_kernel != 0) \
    X(q_gate, 4u, (uint64_t)d->q_dim, WITH_DELTA_NET && (d->options_any & LAYER_OPT_ATTN_GATE) != 0) \
    X(state, 4u, (uint64_t)state, (WITH_SHORT_CONV || WITH_DELTA_NET) && d->conv_kernel != 0) \
    X(state_saved, 4u, (uint64_t)state, (WITH_SHORT_CONV || WITH_DELTA_NET) && d->conv_kernel != 0) \
    X(k_cache, 1u, (uint64_t)(d->kv_dtype == KV_F16 ? 2u : 4u) * kv_cache, 1) \
    X(v_cache, 1u, (uint64_t)(d->kv_dtype == KV_F16 ? 2u : 4u) * kv_cache, !(WITH_MLA && d->kv_lora != 0))
#define PLAN_PASS_BUFFERS(X) X(x, 4u, (uint64_t)n * d->dim, 1) X(xn, 4u, (uint64_t)n * d->dim, 1) \
    X(q, 4u, (uint64_t)n * d->q_dim, 1) X(q_a, 4u, (uint64_t)n * d->q_lora, WITH_MLA && d->kv_lora != 0) \
    X(k, 4u, (uint64_t)n * d->kv_dim, 1) X(v, 4u, (uint64_t)n * d->kv_dim, !(WITH_MLA && d->kv_lora != 0)) \
    X(q_att, 4u, (uint64_t)n * d->n_heads * d->att_dim, WITH_MLA && d->kv_lora != 0) \
    X(attn_out, 4u, (uint64_t)n * d->n_heads * d->val_dim, 1) \
    X(o_in, 4u, (uint64_t)n * d->o_dim, WITH_MLA && d->kv_lora != 0) \
    X(ple, 4u, (uint64_t)n * (d->n_layers + 1u) * d->ple_dim, WITH_PER_LAYER_INPUTS && d->ple_dim != 0) \
    X(mix, 4u, (uint64_t)n * d->mix_dim, (WITH_SHORT_CONV || WITH_DELTA_NET) && d->conv_kernel != 0) \
    X(q_gate, 4u, (uint64_t)n * d->q_dim, WITH_DELTA_NET && (d->options_any & LAYER_OPT_ATTN_GATE) != 0) \
    X(moe_out, 4u, (uint64_t)n * d->dim, 1) X(gate, 4u, (uint64_t)n * d->ffn_max, 1) \
    X(up, 4u, (uint64_t)n * d->ffn_max, 1) X(ffn_out, 4u, (uint64_t)n * d->dim, 1) \
    X(gx, 4u, (uint64_t)n * d->dim, 1) X(expert_out, 4u, (uint64_t)n * d->top_k * d->dim, 1) \
    X(scalar, 4u, (uint64_t)n, 1) X(topk_index, 4u, (uint64_t)n * d->top_k, 1) \
    X(topk_weight, 4u, (uint64_t)n * d->top_k, 1) X(first_pair, 4u, (uint64_t)d->n_experts, 1) \
    X(next_pair, 4u, (uint64_t)n * d->top_k, 1) X(xq, 1u, (uint64_t)n * d->in_blocks * QBLOCK, 1) \
    X(xq_scale, 4u, (uint64_t)n * d->in_blocks, 1) X(xq_sum, 4u, (uint64_t)n * d->in_blocks, 1) \
    X(hq, 1u, (uint64_t)n * d->in_blocks * QBLOCK, 1) X(hq_scale, 4u, (uint64_t)n * d->in_blocks, 1) \
    X(hq_sum, 4u, (uint64_t)n * d->in_blocks, 1)
/* /schema:plan */


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
