/* The routed experts of a MoE layer for the pass's tokens, each expert's weights read once for all of them.
 * Compiled in model.c's unit (it includes this file), so its functions are static. */

#define NO_PAIR 0xFFFFFFFFu /* the end of an expert's list of pairs */

/* A batch's (token, rank) pairs p = t * top_k + rank, linked by the expert they chose, in token order (a token
 * picks an expert once): expert e's first pair is first_pair[e], the one after p is next_pair[p]. One pass over
 * the pairs: n * top_k + n_experts steps per layer, and each expert's tokens are then a walk down its list. */
static void link_pairs(const colibri_ctx *c, const token_buffers *tb) {
    for (uint32_t e = 0; e < c->d.n_experts; e++) tb->first_pair[e] = NO_PAIR;
    for (uint32_t p = tb->n * c->d.top_k; p-- > 0;) { /* backwards: each list comes out in token order */
        uint32_t *first = &tb->first_pair[tb->topk_index[p]];
        tb->next_pair[p] = *first;
        *first = p;
    }
}

/* The routed experts into moe_out, each token adding its experts in rank order as one token alone does. Every
 * expert reads its weights once for all the tokens that chose it, at any rank: a batch runs each expert when the
 * rank-by-rank walk meets its first pair, on its pairs' xn rows gathered into gx, keeps the output per pair in
 * expert_out and adds the ranks in order afterwards; one token (no expert_out) runs its experts in rank order and
 * adds each as it comes. slot: with an expert cache (one token), each rank's cache slot. */
static colibri_status routed_experts(colibri_ctx *c, const token_buffers *tb, uint32_t layer, const uint32_t *slot) {
    const model_dims *d = &c->d;
    const uint32_t n = tb->n, top_k = d->top_k, dim = d->dim;
    if (tb->expert_out) link_pairs(c, tb);
    for (uint32_t k = 0; k < top_k; k++) {
        for (uint32_t t = 0; t < n; t++) {
            const uint32_t pair = t * top_k + k, expert = tb->topk_index[pair];
            if (tb->expert_out && tb->first_pair[expert] != pair) continue; /* run at its first pair */
            const uint64_t e0 = ctx_now(c);
            const float *x = tb->xn;
            uint32_t members = 1;
            if (tb->expert_out) {
                members = 0;
                for (uint32_t p = pair; p != NO_PAIR; p = tb->next_pair[p], members++)
                    for (uint32_t i = 0; i < dim; i++) tb->gx[(size_t)members * dim + i] = tb->xn[(size_t)(p / top_k) * dim + i];
                x = tb->gx;
            }
            const uint8_t *block = c->image;
            uint64_t block_offset = 0;
            if (c->cache.n_slots) {
                colibri_status st = expert_ready(c, slot[k], layer, expert, &block, &block_offset);
                if (st) return st;
            }
            ffn_extras extras = { .alpha = d->swiglu_alpha, .limit = d->swiglu_limit };
            if (WITH_EXPERT_EXTRAS && (kind_of(d, layer)->options & LAYER_OPT_EXPERT_BIAS)) {
                extras.bias[0] = layer_w(c, layer, ROLE_EXPERT_GATE_BIAS) + (size_t)expert * d->ffn;
                extras.bias[1] = layer_w(c, layer, ROLE_EXPERT_UP_BIAS) + (size_t)expert * d->ffn;
                extras.bias[2] = layer_w(c, layer, ROLE_EXPERT_DOWN_BIAS) + (size_t)expert * d->dim;
            }
            const int plain = !WITH_EXPERT_EXTRAS || (!extras.bias[0] && !(extras.limit > 0.0f));
            swiglu_ffn(c, tb, layer, expert_tensor_index(d, layer, expert, ROLE_EXPERT_GATE), block, block_offset, x, members,
                       plain ? 0 : &extras);
            if (tb->expert_out) {
                uint32_t m = 0;
                for (uint32_t p = pair; p != NO_PAIR; p = tb->next_pair[p], m++)
                    for (uint32_t i = 0; i < dim; i++) tb->expert_out[(size_t)p * dim + i] = tb->ffn_out[(size_t)m * dim + i];
            } else { /* one token, rank k */
                add_scaled(tb->moe_out, tb->topk_weight[k], tb->ffn_out, dim);
                c->a.topk_cycles[k] = ctx_now(c) - e0;
            }
            c->stats.expert_calls += members;
        }
    }
    if (tb->expert_out)
        for (uint32_t t = 0; t < n; t++)
            for (uint32_t k = 0; k < top_k; k++)
                add_scaled(tb->moe_out + (size_t)t * dim, tb->topk_weight[(size_t)t * top_k + k],
                           tb->expert_out + ((size_t)t * top_k + k) * dim, dim);
    return COLIBRI_OK;
}
