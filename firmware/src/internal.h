/* Internal declarations shared by the runtime's translation units, by concern: image.h (the image as read),
 * plan.h (the arena), kernels.h (the kernels), and here the context and the files' entry points. Not part of
 * the API. */
#ifndef COLIBRI_INTERNAL_H
#define COLIBRI_INTERNAL_H

#include "colibri.h"
#include "image.h"
#include "kernels.h"
#include "plan.h"

struct colibri_ctx {
    const kernel_set *kernels;
    const uint8_t *image;
    colibri_image_info info;
    arena_buffers a;
    uint32_t pos;        /* tokens in the KV cache */
    int have_logits;
    int xn_quantized;    /* a.xq holds a.xn quantized (reset whenever xn is written) */
    int crc_clmul;       /* crc32_cpu_clmul(), asked at open: every fetched expert block is summed */
    expert_cache cache;  /* n_slots 0: experts read in place */
    token_buffers batch; /* the prefill batch region (n 0: none) */
    ring_saves rings;    /* in it, the window rings' saved rows */
    colibri_stats stats;
    colibri_options opts;
    model_dims d;        /* last: the fields above are read at shorter offsets, and its own end with the layer kinds */
};

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
