/* The MoE router: each token's top-k experts and their weights (softmax, sigmoid, a choice bias, groups,
 * gpt-oss's softmax over the top-k), and the one-layer-ahead guess of the next layer's experts.
 * Compiled in model.c's unit (it includes this file), so its functions are static. */

/* Below every choice score: an expert taken or left out (the scores are checked finite first). */
static float not_chosen(void) { return f32_from_bits(0xFF800000u); } /* -infinity */

/* The sum of the `top` best of n scores (best first; ties: the lower index), without reordering them. */
static float best_sum(const float *score, uint32_t n, uint32_t top) {
    float sum = 0.0f, prev = 0.0f;
    uint32_t prev_i = 0;
    for (uint32_t r = 0; r < top; r++) {
        uint32_t best = n;
        for (uint32_t i = 0; i < n; i++) {
            const int after_prev = !r || score[i] < prev || (score[i] == prev && i > prev_i);
            if (after_prev && (best == n || score[i] > score[best])) best = i;
        }
        prev = score[best];
        prev_i = best;
        sum += prev;
    }
    return sum;
}

/* Where the choice scores are: after the scores, or in the lean build the scores themselves. */
static float *choice_scores(const colibri_ctx *c) { return c->a.router + (WITH_ROUTERS ? c->d.n_experts : 0); }

/* Layer's routing of the normed vector xn: its experts' scores (softmax over the experts, or each one's
 * sigmoid) into a->router[0, E), their choice scores (plus the router bias, which chooses but never weighs)
 * into a->router[E, 2E), and with groups only the best topk_group groups' experts left to choose: a group
 * scores the sum of its group_top best choice scores (a->router[2E, 2E + n_group)). */
static colibri_status router_choice(colibri_ctx *c, const token_buffers *tb, uint32_t layer, const float *xn) {
    const model_dims *d = &c->d;
    const uint32_t E = d->n_experts, per_group = E / d->n_group;
    float *score = c->a.router, *choice = choice_scores(c), *group = score + 2 * E;
    weight router = matrix(c, layer_index(c, layer, ROLE_ROUTER));
    matmul(c, tb, score, &router, xn, 1);
    const layer_kind *kind = kind_of(d, layer);
    const float *bias = WITH_ROUTERS && (kind->options & LAYER_OPT_ROUTER_BIAS) ? layer_w(c, layer, ROLE_ROUTER_BIAS) : 0;
    if (WITH_ROUTERS && kind->router == LAYER_ROUTER_TOPK_SOFTMAX) { /* the logits (plus the Linear's bias) */
        for (uint32_t e = 0; bias && e < E; e++) score[e] += bias[e];
        bias = 0;
    } else if (WITH_ROUTERS && kind->router == LAYER_ROUTER_SIGMOID) {
        for (uint32_t e = 0; e < E; e++) score[e] = 1.0f / (1.0f + colibri_expf(-score[e]));
    } else {
        softmax(score, E, 0);
    }
    if (WITH_ROUTERS)
        for (uint32_t e = 0; e < E; e++) choice[e] = bias ? score[e] + bias[e] : score[e];
    if (!all_finite(choice, E)) return COLIBRI_E_NONFINITE; /* a NaN never wins a '>': expert 0 would be taken */
    if (!WITH_ROUTERS || d->n_group == 1) return COLIBRI_OK;
    for (uint32_t g = 0; g < d->n_group; g++) group[g] = best_sum(choice + g * per_group, per_group, d->group_top);
    for (uint32_t g = 0; g < d->n_group; g++) {
        uint32_t ahead = 0; /* groups ranked before g: a better sum, or the same and a lower index */
        for (uint32_t o = 0; o < d->n_group; o++) ahead += group[o] > group[g] || (group[o] == group[g] && o < g);
        if (ahead >= d->topk_group)
            for (uint32_t e = g * per_group; e < (g + 1) * per_group; e++) choice[e] = not_chosen();
    }
    return COLIBRI_OK;
}

/* The best choice left (ties: the lower index), then taken; *score gets its score first. router_choice
 * leaves at least top_k to choose (the verifier checks top_k <= topk_group * per_group), so there is one.
 * One scan: top_k picks cost top_k * n_experts (the verifier caps both: docs/SECURITY.md). */
static uint32_t pick_expert(const colibri_ctx *c, float *score) {
    float *choice = choice_scores(c);
    uint32_t best = 0;
    for (uint32_t e = 1; e < c->d.n_experts; e++)
        if (choice[e] > choice[best]) best = e;
    *score = c->a.router[best];
    choice[best] = not_chosen();
    return best;
}

/* Each token's top_k experts and their weights into tb's topk arrays: the chosen experts' scores,
 * optionally renormalized (divided by their sum plus the header's topk_norm_eps), times routed_scale. */
static colibri_status route_topk(colibri_ctx *c, const token_buffers *tb, uint32_t layer) {
    const model_dims *d = &c->d;
    const layer_kind *kind = kind_of(d, layer);
    for (uint32_t t = 0; t < tb->n; t++) {
        colibri_status st = router_choice(c, tb, layer, tb->xn + (size_t)t * d->dim);
        if (st) return st;
        uint32_t *index = tb->topk_index + (size_t)t * d->top_k;
        float *gate_weight = tb->topk_weight + (size_t)t * d->top_k, sum = 0.0f;
        for (uint32_t k = 0; k < d->top_k; k++) {
            index[k] = pick_expert(c, &gate_weight[k]);
            sum += gate_weight[k];
        }
        if (WITH_ROUTERS && kind->router == LAYER_ROUTER_TOPK_SOFTMAX) softmax(gate_weight, d->top_k, 0); /* gpt-oss */
        const float norm = sum + d->topk_norm_eps;
        const float *expert_scale = WITH_GEMMA4 && kind->ffn == LAYER_FFN_MOE_AND_DENSE ? layer_w(c, layer, ROLE_EXPERT_SCALE) : 0;
        for (uint32_t k = 0; k < d->top_k; k++) {
            if (kind->options & LAYER_OPT_NORM_TOPK) gate_weight[k] /= norm;
            if (WITH_ROUTERS) gate_weight[k] *= d->routed_scale; /* 1 without them */
            if (expert_scale) gate_weight[k] *= expert_scale[index[k]];
        }
    }
    return COLIBRI_OK;
}

/* One-layer-ahead prefetch: the next layer's router applied to this layer's FFN input names the
 * experts to start fetching now. A wrong guess costs a fetch, never a result: the next layer routes
 * on its own input as always. */
static void prefetch_next(colibri_ctx *c, const token_buffers *tb, uint32_t next) {
    if (router_choice(c, tb, next, tb->xn) != COLIBRI_OK) return; /* a non-finite guess: fetch nothing */
    for (uint32_t k = 0; k < c->d.top_k; k++) {
        float score;
        experts_fetch_ahead(c, next, pick_expert(c, &score));
    }
}
