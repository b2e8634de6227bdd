/* The expert cache (docs/STREAMING.md): routed experts of the image's expert part come into arena
 * slots through the board's fetch hook when the router asks for them, and are checked against their
 * CRC (from the table open copied into the arena, not the live image) before any weight is read. Slots are reused least recently used first; a slot used in the
 * current layer step is never evicted, so a cache of top_k slots always holds one layer's experts.
 * Where a block comes from changes how fast a token is, never its bits: the kernels read the same
 * bytes from a slot as from the image. */
#include "internal.h"

#define NO_SLOT 0xFFFFFFFFu

/* The slot records and, after them, the image's expert CRC table as open copies it (a u32 per layer and
 * expert), together 64-byte aligned, then the slots; 0 on overflow past 2^63. */
uint64_t colibri_expert_cache_bytes(const colibri_image_info *info, uint32_t slots) {
    if (!info || slots == 0) return 0;
    const uint64_t slot = (info->expert_block_bytes + IMG_ALIGN - 1) & ~(uint64_t)(IMG_ALIGN - 1); /* < 2^52 */
    const size_t crcs = (size_t)info->n_layers * info->n_experts; /* a verified image holds them: fits a size_t */
    const uint64_t meta = ((uint64_t)slots * EXPERT_SLOT_META_BYTES + 4 * (uint64_t)crcs + IMG_ALIGN - 1) & ~(uint64_t)(IMG_ALIGN - 1);
    /* slot x slots in two 32-bit halves, each product exact in 64 bits; overflow is a high half past 32
     * bits or a carry out of a sum (no 64-bit division: that would pull in libgcc on 32-bit boards) */
    const uint64_t high = (slot >> 32) * slots, low = (slot & 0xFFFFFFFFu) * slots;
    if (high >> 32) return 0;
    const uint64_t data = (high << 32) + low, total = data + meta;
    if (data < low || total < data) return 0;
    return total;
}

static int async_hooks(const colibri_ctx *c) { return c->opts.fetch_start && c->opts.fetch_wait; }

static uint8_t *slot_data(const expert_cache *x, uint32_t i) { return x->slot_data + (size_t)i * x->slot_bytes; }

static uint32_t cache_find(const expert_cache *x, uint32_t layer, uint32_t expert) {
    for (uint32_t i = 0; i < x->n_slots; i++) {
        const expert_slot *s = &x->slots[i];
        if (s->state != SLOT_EMPTY && s->layer == layer && s->expert == expert) return i;
    }
    return NO_SLOT;
}

/* An empty slot, else the least recently used one that this layer step has not used (none are in
 * flight: every step starts by settling). NO_SLOT if every slot serves this step. */
static uint32_t cache_victim(const expert_cache *x) {
    uint32_t best = NO_SLOT;
    uint64_t best_use = UINT64_MAX;
    for (uint32_t i = 0; i < x->n_slots; i++) {
        const expert_slot *s = &x->slots[i];
        if (s->state == SLOT_EMPTY) return i;
        if (s->state == SLOT_READY && s->last_use != x->step && s->last_use < best_use) {
            best = i;
            best_use = s->last_use;
        }
    }
    return best;
}

/* Start copying expert (layer, expert) into slot i (with a blocking hook the copy is done on return). */
static colibri_status fetch_begin(colibri_ctx *c, uint32_t i, uint32_t layer, uint32_t expert, int guess) {
    expert_slot *s = &c->cache.slots[i];
    uint64_t offset, bytes;
    expert_block(c, layer, expert, &offset, &bytes);
    *s = (expert_slot){ .layer = layer, .expert = expert, .state = SLOT_PENDING, .prefetched = (uint32_t)guess,
                        .last_use = c->cache.step };
    uint64_t t0 = ctx_now(c);
    int r = async_hooks(c) ? c->opts.fetch_start(c->opts.user, offset, (size_t)bytes, slot_data(&c->cache, i))
                           : c->opts.fetch(c->opts.user, offset, (size_t)bytes, slot_data(&c->cache, i));
    c->stats.cycles_fetch_wait += ctx_now(c) - t0;
    c->stats.expert_bytes_fetched += bytes;
    if (r) {
        s->state = SLOT_EMPTY;
        return COLIBRI_E_FETCH;
    }
    return COLIBRI_OK;
}

/* Wait for slot i's copy if it is in flight, then check its CRC: only a checked block is READY. */
static colibri_status fetch_finish(colibri_ctx *c, uint32_t i) {
    expert_slot *s = &c->cache.slots[i];
    if (s->state != SLOT_PENDING) return COLIBRI_OK;
    uint8_t *dst = slot_data(&c->cache, i);
    if (async_hooks(c)) {
        uint64_t t0 = ctx_now(c);
        int r = c->opts.fetch_wait(c->opts.user, dst);
        c->stats.cycles_fetch_wait += ctx_now(c) - t0;
        if (r) {
            s->state = SLOT_EMPTY;
            return COLIBRI_E_FETCH;
        }
    }
    uint64_t offset, bytes;
    expert_block(c, s->layer, s->expert, &offset, &bytes);
    if (crc32_update(0, dst, (size_t)bytes, c->crc_clmul) != c->cache.crcs[(size_t)s->layer * c->d.n_experts + s->expert]) {
        s->state = SLOT_EMPTY;
        return COLIBRI_E_EXPERT_CRC;
    }
    s->state = SLOT_READY;
    return COLIBRI_OK;
}

colibri_status experts_settle(colibri_ctx *c) {
    colibri_status first = COLIBRI_OK;
    for (uint32_t i = 0; i < c->cache.n_slots; i++) {
        const int guess = c->cache.slots[i].prefetched;
        colibri_status st = fetch_finish(c, i);
        /* A guess never fails a feed, wherever its fetch fails (the blocking fetch or fetch_start in
         * experts_fetch_ahead, fetch_wait or the CRC here): its slot is emptied, and a router that then
         * chooses the block fetches it again; only that fetch's failure is the feed's. */
        if (st && !guess && !first) first = st;
    }
    return first;
}

colibri_status experts_load(colibri_ctx *c, uint32_t layer, uint32_t *slot) {
    expert_cache *x = &c->cache;
    colibri_status st = experts_settle(c);
    if (st) return st;
    x->step++;
    for (uint32_t k = 0; k < c->d.top_k; k++) {
        const uint32_t expert = c->a.topk_index[k];
        uint64_t offset, bytes;
        expert_block(c, layer, expert, &offset, &bytes);
        if (offset < c->d.resident_bytes) { /* pinned in the resident part: read in place */
            slot[k] = NO_SLOT;
            c->stats.expert_hits++;
            continue;
        }
        uint32_t i = cache_find(x, layer, expert);
        if (i != NO_SLOT) {
            c->stats.expert_hits++;
            c->stats.prefetch_used += x->slots[i].prefetched;
            x->slots[i].prefetched = 0;
            x->slots[i].last_use = x->step;
        } else {
            c->stats.expert_misses++;
            i = cache_victim(x); /* exists: open() made n_slots >= the streamed experts one step can use */
            st = fetch_begin(c, i, layer, expert, 0);
            if (st) return st;
        }
        slot[k] = i;
    }
    return COLIBRI_OK;
}

void experts_fetch_ahead(colibri_ctx *c, uint32_t layer, uint32_t expert) {
    expert_cache *x = &c->cache;
    uint64_t offset, bytes;
    expert_block(c, layer, expert, &offset, &bytes);
    if (offset < c->d.resident_bytes || cache_find(x, layer, expert) != NO_SLOT) return;
    uint32_t i = cache_victim(x);
    if (i == NO_SLOT) return; /* every slot serves this step: no room for a guess */
    if (fetch_begin(c, i, layer, expert, 1) == COLIBRI_OK) c->stats.prefetch_issued++; /* else dropped (settle) */
}

colibri_status expert_ready(colibri_ctx *c, uint32_t slot, uint32_t layer, uint32_t expert, const uint8_t **block,
                            uint64_t *block_offset) {
    uint64_t offset, bytes;
    expert_block(c, layer, expert, &offset, &bytes);
    if (slot == NO_SLOT) {
        *block = c->image + offset;
    } else {
        colibri_status st = fetch_finish(c, slot);
        if (st) return st;
        *block = slot_data(&c->cache, slot);
    }
    *block_offset = offset;
    return COLIBRI_OK;
}
