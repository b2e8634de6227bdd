/* The memory plan: one arena, laid out once at open, nothing allocated afterwards.
 * The host computes the same plan (colibri/plan.py: arena_plan) and stores its total in the image;
 * image_verify() rejects an image whose plan disagrees. */
#include "internal.h"

typedef struct {
    uint64_t offset;
    int overflow;
    uint8_t *base;
} planner;

/* Reserve `count` elements of `size` bytes, 64-byte aligned; returns their address (or NULL when only sizing). */
static void *reserve_bytes(planner *p, uint64_t count, uint32_t size) {
    void *at = p->base ? p->base + p->offset : 0;
    /* count < 2^50 here (products of two dims <= 2^24 times n_layers), so count*size cannot wrap */
    uint64_t bytes = (count * size + IMG_ALIGN - 1) & ~(uint64_t)(IMG_ALIGN - 1);
    if (bytes > UINT64_MAX - p->offset) p->overflow = 1;
    else p->offset += bytes;
    return at;
}

static void *reserve(planner *p, uint64_t count) { return reserve_bytes(p, count, 4); }

colibri_status arena_plan(const model_dims *d, uint8_t *base, arena_buffers *out, uint64_t *total) {
    planner p = { ARENA_CTX_BYTES, 0, base };
    arena_buffers a;
    uint64_t rows = 0, kv_cache = 0; /* every layer's positions (a windowed layer's ring holds W) of its row width */
    for (uint32_t layer = 0; layer < d->n_layers; layer++) {
        rows += kv_rows(d, layer);
        kv_cache += (uint64_t)kv_rows(d, layer) * layer_kv_dim(d, layer);
    }
    if (rows > IMG_MAX_DIM) return COLIBRI_E_IMAGE_DIMS; /* layers x positions: keeps kv_cache below 2^48 */
    a.tensors = reserve_bytes(&p, d->n_tensors, TENSOR_REF_BYTES);
    a.x = reserve(&p, d->dim);
    a.xn = reserve(&p, d->dim);
    const int mla = WITH_MLA && d->kv_lora != 0;
    a.q = reserve(&p, d->q_dim);
    a.q_a = mla ? reserve(&p, d->q_lora) : 0; /* MLA's buffers: none for standard attention */
    a.k_new = reserve(&p, d->kv_dim);
    a.v_new = mla ? 0 : reserve(&p, d->kv_dim);
    a.q_att = mla ? reserve(&p, (uint64_t)d->n_heads * d->att_dim) : 0;
    a.attn_out = reserve(&p, (uint64_t)d->n_heads * d->val_dim);
    a.o_in = mla ? reserve(&p, d->o_dim) : 0;
    a.ple = WITH_PER_LAYER_INPUTS && d->ple_dim ? reserve(&p, ((uint64_t)d->n_layers + 1) * d->ple_dim) : 0; /* lean: none */
    a.att = reserve(&p, (uint64_t)d->n_heads * d->max_seq);
    a.ffn_gate = reserve(&p, d->ffn_max);
    a.ffn_up = reserve(&p, d->ffn_max);
    a.ffn_out = reserve(&p, d->dim);
    a.moe_out = reserve(&p, d->dim);
    a.router = reserve(&p, 2ull * d->n_experts + d->n_group); /* scores, choice scores, group scores */
    a.topk_weight = reserve(&p, d->top_k);
    a.topk_index = reserve(&p, d->top_k);
    a.topk_cycles = reserve(&p, 2ull * d->top_k); /* u64s; every buffer starts 64-byte aligned */
    a.logits = reserve(&p, d->vocab);
    a.probs = reserve(&p, d->vocab);
    a.sample_index = reserve(&p, d->vocab);
    a.xq = reserve_bytes(&p, (uint64_t)d->in_blocks * QBLOCK, 1);
    a.xq_scale = reserve(&p, d->in_blocks);
    a.xq_sum = reserve(&p, d->in_blocks);
    a.hq = reserve_bytes(&p, (uint64_t)d->in_blocks * QBLOCK, 1);
    a.hq_scale = reserve(&p, d->in_blocks);
    a.hq_sum = reserve(&p, d->in_blocks);
    a.k_cache = reserve_bytes(&p, kv_cache, d->kv_dtype == KV_F16 ? 2 : 4);
    a.v_cache = mla ? 0 : reserve_bytes(&p, kv_cache, d->kv_dtype == KV_F16 ? 2 : 4);
    if (p.overflow || p.offset > (uint64_t)SIZE_MAX) return COLIBRI_E_IMAGE_DIMS;
    if (out) *out = a;
    *total = p.offset;
    return COLIBRI_OK;
}

uint64_t batch_plan(const model_dims *d, uint32_t tokens, uint8_t *base, token_buffers *out, ring_saves *rings) {
    planner p = { 0, 0, base };
    token_buffers unused, *b = out ? out : &unused; /* no out: only the bytes are wanted */
    const uint64_t n = tokens;
    b->n = tokens;
    b->x = reserve(&p, n * d->dim);
    b->xn = reserve(&p, n * d->dim);
    const int mla = WITH_MLA && d->kv_lora != 0;
    b->q = reserve(&p, n * d->q_dim);
    b->q_a = mla ? reserve(&p, n * d->q_lora) : 0; /* MLA's buffers: none for standard attention */
    b->k = reserve(&p, n * d->kv_dim);
    b->v = mla ? 0 : reserve(&p, n * d->kv_dim);
    b->q_att = mla ? reserve(&p, n * d->n_heads * d->att_dim) : 0;
    b->attn_out = reserve(&p, n * d->n_heads * d->val_dim);
    b->o_in = mla ? reserve(&p, n * d->o_dim) : 0;
    b->ple = WITH_PER_LAYER_INPUTS && d->ple_dim ? reserve(&p, n * ((uint64_t)d->n_layers + 1) * d->ple_dim) : 0;
    b->moe_out = reserve(&p, n * d->dim);
    b->gate = reserve(&p, n * d->ffn_max);
    b->up = reserve(&p, n * d->ffn_max);
    b->ffn_out = reserve(&p, n * d->dim);
    b->gx = reserve(&p, n * d->dim);
    b->expert_out = reserve(&p, n * d->top_k * d->dim);
    b->scalar = reserve(&p, n);
    b->topk_index = reserve(&p, n * d->top_k);
    b->topk_weight = reserve(&p, n * d->top_k);
    b->first_pair = reserve(&p, d->n_experts); /* once a batch, not per token */
    b->next_pair = reserve(&p, n * d->top_k);
    b->xq = reserve_bytes(&p, n * d->in_blocks * QBLOCK, 1);
    b->xq_scale = reserve(&p, n * d->in_blocks);
    b->xq_sum = reserve(&p, n * d->in_blocks);
    b->hq = reserve_bytes(&p, n * d->in_blocks * QBLOCK, 1);
    b->hq_scale = reserve(&p, n * d->in_blocks);
    b->hq_sum = reserve(&p, n * d->in_blocks);
    /* the window rings' saved rows: every cache-owning windowed layer's, and where the shared one's start (none
     * in the lean build, which feeds a windowed model one token a pass: colibri_open's batch_limit) */
    if (WITH_WINDOW_RINGS && d->window) {
        ring_saves r = { 0, 0, tokens < d->window ? tokens : d->window };
        /* one position's rows over those layers; where the shared ring's start (the one windowed KV-sharing layers
         * read: shared_ring) */
        uint64_t row = 0, shared_at = 0;
        for (uint32_t l = 0; l < d->n_layers; l++) {
            if (!layer_windowed(d, l) || layer_kv_shared(d, l)) continue;
            if (l == d->shared_ring) shared_at = row;
            row += layer_kv_dim(d, l);
        }
        const uint64_t per_row = (uint64_t)(mla ? 1 : 2) * r.rows * (d->kv_dtype == KV_F16 ? 2 : 4);
        r.saved = reserve_bytes(&p, row * per_row, 1);
        r.shared = base && d->shared_ring != IMG_NO_INDEX ? r.saved + shared_at * per_row : 0;
        if (rings) *rings = r;
    }
    return p.offset;
}
