/* The public API: argument checks, state, stats. The math is in model.c and its blocks. */
#include "internal.h"

uint64_t ctx_now(const colibri_ctx *c) { return c->opts.cycles ? c->opts.cycles(c->opts.user) : 0; }

_Static_assert(sizeof(struct colibri_ctx) <= ARENA_CTX_BYTES, "context must fit its arena reservation");

/* The arena bytes this image and these options need: the plan, plus the expert cache (a prefill batch is
 * optional: it takes the room left, batch_fit). */
static colibri_status arena_need(const colibri_image_info *info, const colibri_options *opts, uint64_t *need) {
    *need = info->arena_bytes;
    if (opts->parallel_parts > 1 && !opts->parallel_for) return COLIBRI_E_NULL;
    if (opts->parallel_parts > COLIBRI_MAX_PARTS || opts->prefill_batch > COLIBRI_MAX_BATCH || opts->experts > info->top_k)
        return COLIBRI_E_BAD_ARG;
    if (!opts->expert_cache) return COLIBRI_OK; /* a prefill batch takes what room is left (batch_fit) */
    if (!opts->fetch) return COLIBRI_E_NULL;
    if (opts->expert_cache > info->streamed_experts) return COLIBRI_E_BAD_ARG;
    const uint32_t slots = opts->expert_cache < info->expert_cache_min ? info->expert_cache_min : opts->expert_cache;
    uint64_t cache = colibri_expert_cache_bytes(info, slots);
    if (!cache || cache > UINT64_MAX - *need) return COLIBRI_E_BAD_ARG;
    *need += cache;
    return opts->expert_cache < info->expert_cache_min ? COLIBRI_E_CACHE_TOO_SMALL : COLIBRI_OK;
}

/* The largest prefill batch, up to the one asked for, whose region fits in `room` arena bytes after the
 * plan; 0 when not even two tokens fit (one token a pass needs no region). A loop, not a division: 64-bit
 * division pulls libgcc into 32-bit boards, and it runs once, at open. */
static uint32_t batch_fit(const colibri_image_info *info, uint32_t asked, uint64_t room) {
    uint32_t batch = asked;
    while (batch > 1 && colibri_prefill_bytes(info, batch) > room) batch--;
    return batch > 1 ? batch : 0;
}

/* The longest pass a batch may take: a Gemma 4 layer sharing a windowed ring exchanges the pass's rows in it
 * with the rows they overwrote (blocks/attention.c), so a pass there holds at most the window's W rows. The lean build
 * leaves that saving of the rings out, and feeds a windowed model one token a pass. */
static uint32_t batch_limit(const model_dims *d, uint32_t asked) {
    if (!WITH_WINDOW_RINGS && d->window) return 0;
    if (WITH_GEMMA4 && d->shared_ring != IMG_NO_INDEX) return asked < d->window ? asked : d->window;
    return asked;
}

colibri_status colibri_open(const void *image, size_t image_size, void *arena, size_t arena_size,
                            const colibri_options *opts, colibri_ctx **ctx, uint64_t *arena_needed) {
    if (!image || !arena || !ctx) return COLIBRI_E_NULL;
    const colibri_options none = { .size = sizeof none }; /* no options: every field 0 */
    const colibri_options *o = opts ? opts : &none;
    if (o->size != sizeof none) return COLIBRI_E_API_MISMATCH; /* before reading any other field */
    const uint32_t slots = o->expert_cache;
    model_dims d;
    colibri_image_info info;
    const unsigned mode = slots ? IMG_VERIFY_RESIDENT : 0;
    colibri_status st = image_verify(image, image_size, mode, &d, &info);
    if (st) return st;
    uint64_t need;
    st = arena_need(&info, o, &need);
    if (arena_needed) *arena_needed = need;
    if (st) return st;
    if ((uintptr_t)arena % COLIBRI_ARENA_ALIGN) return COLIBRI_E_ARENA_ALIGN;
    if (arena_size < need) return COLIBRI_E_ARENA_TOO_SMALL;
    const uint32_t batch = !slots ? batch_fit(&info, batch_limit(&d, o->prefill_batch), arena_size - need) : 0;
    need += colibri_prefill_bytes(&info, batch);
    const uintptr_t a0 = (uintptr_t)arena, i0 = (uintptr_t)image; /* sizes fit the address space: both are mapped */
    if (a0 < i0 + image_size && i0 < a0 + (uintptr_t)need) return COLIBRI_E_ARENA_OVERLAP;

    colibri_ctx *c = arena;
    arena_buffers a;
    uint64_t total;
    arena_plan(&d, arena, &a, &total); /* cannot fail: image_verify() ran the same plan */
    *c = (colibri_ctx){ .kernels = kernels_select(), .image = image, .info = info, .d = d, .a = a, .crc_clmul = crc32_cpu_clmul() };
    /* the table walked again into the arena's dense index (the first walk had nowhere to put it): against the dims
     * the plan was made for, so an image changed since is refused rather than half-read. The last read of the table. */
    st = table_walk(image, &d, mode | IMG_VERIFY_NO_CRC, a.tensors); /* d: a copy, c->d keeps the first walk's */
    if (st) return st;
    if (d.expert_block_max != c->d.expert_block_max || d.streamed_experts != c->d.streamed_experts)
        return COLIBRI_E_IMAGE_TABLE;
    c->opts = *o; /* o outside the arena (colibri.h): read after the plan's writes */
    if (o->experts) c->d.top_k = o->experts; /* after the plan, which keeps the image's top_k: every buffer holds K */
    if (batch) batch_plan(&d, batch, (uint8_t *)arena + total, &c->batch, &c->rings); /* after the plan: no cache with a batch */
    if (slots) { /* the cache follows the plan: slot bookkeeping, the expert CRC table, then the slots */
        expert_cache *x = &c->cache;
        x->n_slots = slots;
        x->slots = (expert_slot *)(void *)((uint8_t *)arena + total);
        /* the CRC table read once, as the tensor table is: the image may change later, what a fetch is checked
         * against not. A u32 per layer and expert (the image holds them, so the count fits a size_t), 64-byte
         * aligned in the image and read as words, as its floats are (the runtime's hosts are little-endian). */
        const uint32_t *crc_table = (const uint32_t *)(const void *)(c->image + (size_t)c->d.expert_crc_offset);
        uint32_t *at = x->crcs = (uint32_t *)(void *)(x->slots + slots);
        for (size_t i = 0; i < (size_t)c->d.n_layers * c->d.n_experts; i++) *at++ = crc_table[i];
        x->slot_data = (uint8_t *)(((uintptr_t)at + IMG_ALIGN - 1) & ~(uintptr_t)(IMG_ALIGN - 1)); /* the arena is aligned */
        x->slot_bytes = (c->d.expert_block_max + IMG_ALIGN - 1) & ~(uint64_t)(IMG_ALIGN - 1);
        for (uint32_t i = 0; i < slots; i++) x->slots[i] = (expert_slot){ .state = SLOT_EMPTY };
    }
    c->stats.prefill_batch = batch;
    c->stats.arena_bytes = need;
    *ctx = c;
    return COLIBRI_OK;
}

uint64_t colibri_prefill_bytes(const colibri_image_info *info, uint32_t tokens) {
    if (!info || tokens <= 1) return 0;
    if (tokens > COLIBRI_MAX_BATCH) return UINT64_MAX; /* open refuses it */
    return tokens * info->prefill_token_bytes;
}

colibri_status colibri_reset(colibri_ctx *c) {
    if (!c) return COLIBRI_E_NULL;
    experts_settle(c); /* cached blocks stay: they are the image's, not the sequence's */
    c->pos = 0;
    c->have_logits = 0;
    c->stats = (colibri_stats){ .prefill_batch = c->stats.prefill_batch, .arena_bytes = c->stats.arena_bytes };
    return COLIBRI_OK;
}

colibri_status colibri_set_trace(colibri_ctx *c, void (*trace)(void *user, const colibri_layer_trace *t)) {
    if (!c) return COLIBRI_E_NULL;
    c->opts.trace = trace;
    return COLIBRI_OK;
}

colibri_status colibri_feed(colibri_ctx *c, const uint32_t *tokens, size_t n) {
    if (!c || !tokens) return COLIBRI_E_NULL;
    if (n == 0) return COLIBRI_E_BAD_ARG;
    if (n > c->d.max_seq - c->pos) return COLIBRI_E_SEQ_FULL;
    for (size_t i = 0; i < n; i++)
        if (tokens[i] >= c->d.vocab) return COLIBRI_E_TOKEN_RANGE;
    uint64_t t0 = ctx_now(c);
    colibri_status st = COLIBRI_OK;
    const size_t per_pass = c->batch.n > 1 ? c->batch.n : 1;
    for (size_t i = 0, m; i < n && st == COLIBRI_OK; i += m) {
        m = n - i < per_pass ? n - i : per_pass;
        st = model_forward(c, tokens + i, (uint32_t)m, i + m == n);
        /* A pass that met a NaN fed none of its tokens: again one at a time, so the ones before the
         * culprit stay fed, as without a batch (the same bits fail at the same token). */
        if (st == COLIBRI_E_NONFINITE && m > 1)
            for (size_t j = 0; j < m && (st = model_forward(c, tokens + i + j, 1, i + j + 1 == n)) == COLIBRI_OK; j++) {}
    }
    c->stats.tokens_fed = c->pos;
    if (st) {
        experts_settle(c); /* a layer that failed may have left fetches in flight */
        c->have_logits = 0;
        return st;
    }
    c->stats.cycles_total += ctx_now(c) - t0;
    return COLIBRI_OK;
}

colibri_status colibri_sample(colibri_ctx *c, colibri_sampler *s, uint32_t *token) {
    if (!c || !s || !token) return COLIBRI_E_NULL;
    if (!c->have_logits) return COLIBRI_E_NO_LOGITS;
    uint64_t t0 = ctx_now(c);
    *token = sample_token(s, c->a.logits, c->a.probs, c->a.sample_index, c->d.vocab);
    uint64_t dt = ctx_now(c) - t0;
    c->stats.cycles_sampling += dt;
    c->stats.cycles_total += dt;
    return COLIBRI_OK;
}

colibri_status colibri_step(colibri_ctx *c, colibri_sampler *s, uint32_t *token) {
    if (!c || !s || !token) return COLIBRI_E_NULL;
    if (!c->have_logits) return COLIBRI_E_NO_LOGITS;
    if (c->pos >= c->d.max_seq) return COLIBRI_E_SEQ_FULL;
    const uint64_t rng = s->rng; /* what sampling changes: a failed call leaves the caller's stream as it was */
    uint32_t t;
    colibri_status st = colibri_sample(c, s, &t);
    if (!st) st = colibri_feed(c, &t, 1);
    if (st) s->rng = rng;
    else *token = t;
    return st;
}

colibri_status colibri_logits(const colibri_ctx *c, const float **logits, uint32_t *vocab_size) {
    if (!c || !logits) return COLIBRI_E_NULL;
    if (!c->have_logits) return COLIBRI_E_NO_LOGITS;
    *logits = c->a.logits;
    if (vocab_size) *vocab_size = c->d.vocab;
    return COLIBRI_OK;
}

colibri_status colibri_get_stats(const colibri_ctx *c, colibri_stats *stats) {
    if (!c || !stats) return COLIBRI_E_NULL;
    if (stats->size != sizeof *stats) return COLIBRI_E_API_MISMATCH; /* a smaller struct would be overrun */
    *stats = c->stats;
    stats->size = sizeof *stats;
    return COLIBRI_OK;
}

uint32_t colibri_api_version(void) { return COLIBRI_API_VERSION; }

colibri_status colibri_get_info(const colibri_ctx *c, colibri_image_info *info) {
    if (!c || !info) return COLIBRI_E_NULL;
    *info = c->info;
    return COLIBRI_OK;
}

colibri_status colibri_get_kernels(const colibri_ctx *c, const char **name) {
    if (!c || !name) return COLIBRI_E_NULL;
    *name = c->kernels->name;
    return COLIBRI_OK;
}

const char *colibri_strerror(colibri_status s) {
    static const char *const names[COLIBRI_STATUS_COUNT] = {
        /* schema:status_messages (written by python -m colibri.schema from format/schema.toml) */
        [COLIBRI_OK] = "ok",
        [COLIBRI_E_NULL] = "null pointer argument",
        [COLIBRI_E_BAD_ARG] = "argument out of range",
        [COLIBRI_E_ARENA_TOO_SMALL] = "arena too small",
        [COLIBRI_E_ARENA_ALIGN] = "arena misaligned",
        [COLIBRI_E_IMAGE_TRUNCATED] = "image truncated",
        [COLIBRI_E_IMAGE_MAGIC] = "not a Colibri image (bad magic)",
        [COLIBRI_E_IMAGE_VERSION] = "unsupported image format version",
        [COLIBRI_E_IMAGE_HEADER_CRC] = "image header CRC mismatch",
        [COLIBRI_E_IMAGE_PAYLOAD_CRC] = "image payload CRC mismatch",
        [COLIBRI_E_IMAGE_HEADER] = "inconsistent image header",
        [COLIBRI_E_IMAGE_DIMS] = "invalid model dimensions",
        [COLIBRI_E_IMAGE_TABLE] = "invalid tensor table",
        [COLIBRI_E_IMAGE_BOUNDS] = "tensor out of bounds or misaligned",
        [COLIBRI_E_IMAGE_DTYPE] = "tensor dtype not supported by this build",
        [COLIBRI_E_IMAGE_PLAN] = "image arena plan disagrees with runtime",
        [COLIBRI_E_UNSUPPORTED] = "unsupported architecture or feature (or one this build leaves out)",
        [COLIBRI_E_TOKEN_RANGE] = "token id out of range",
        [COLIBRI_E_SEQ_FULL] = "sequence longer than the image's max_seq",
        [COLIBRI_E_NO_LOGITS] = "no logits yet: feed a token first",
        [COLIBRI_E_NONFINITE] = "NaN or infinity in the router or the logits",
        [COLIBRI_E_CACHE_TOO_SMALL] = "expert cache smaller than one layer's top-k",
        [COLIBRI_E_FETCH] = "expert fetch hook failed",
        [COLIBRI_E_EXPERT_CRC] = "expert block CRC mismatch",
        [COLIBRI_E_ARENA_OVERLAP] = "arena overlaps the image",
        [COLIBRI_E_API_MISMATCH] = "struct size unset or from another colibri.h",
        /* /schema:status_messages */
    };
    if ((unsigned)s >= COLIBRI_STATUS_COUNT) return "unknown status";
    return names[s];
}
