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

/* `count` floats (or other 4-byte elements): the plan's most common buffer, a call with an argument less. */
static void *reserve(planner *p, uint64_t count) { return reserve_bytes(p, count, 4); }
#define RESERVE_IN(p, elem, count) ((elem) == 4u ? reserve(p, count) : reserve_bytes(p, count, elem))


colibri_status arena_plan(const model_dims *d, uint8_t *base, arena_buffers *out, uint64_t *total) {
    planner p = { ARENA_CTX_BYTES, 0, base };
    arena_buffers a;
    uint64_t rows = 0, kv_cache = 0; /* every layer's positions (a windowed layer's ring holds W) of its row width */
    uint64_t state = 0;              /* and every convolving or DeltaNet layer's state (blocks/state.c) */
    for (uint32_t layer = 0; layer < d->n_layers; layer++) {
        const uint32_t layer_rows = kv_rows(d, layer);
        rows += layer_rows;
        kv_cache += (uint64_t)layer_rows * layer_kv_dim(d, layer);
        if (layer_conv(d, layer)) state += (uint64_t)(d->conv_kernel - 1) * d->dim;
        if (layer_delta(d, layer))
            state += (uint64_t)(d->conv_kernel - 1) * d->dn_conv + (uint64_t)d->dn_v_heads * d->dn_k_dim * d->dn_v_dim;
    }
    if (rows > IMG_MAX_DIM) return COLIBRI_E_IMAGE_DIMS; /* layers x positions: keeps kv_cache below 2^48 */
#define RESERVE(buffer, elem, count, when) a.buffer = (when) ? RESERVE_IN(&p, elem, count) : 0;
    PLAN_MODEL_BUFFERS(RESERVE)
#undef RESERVE
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
#define RESERVE(buffer, elem, count, when) b->buffer = (when) ? RESERVE_IN(&p, elem, count) : 0;
    PLAN_PASS_BUFFERS(RESERVE)
#undef RESERVE
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
        const uint64_t per_row = (uint64_t)(WITH_MLA && d->kv_lora ? 1 : 2) * r.rows * (d->kv_dtype == KV_F16 ? 2 : 4);
        r.saved = reserve_bytes(&p, row * per_row, 1);
        r.shared = base && d->shared_ring != IMG_NO_INDEX ? r.saved + shared_at * per_row : 0;
        if (rings) *rings = r;
    }
    return p.offset;
}
