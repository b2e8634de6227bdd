/* DeepSeek-V2/V3's multi-head latent attention (docs/MODELS.md).
 * Compiled in model.c's unit (it includes this file), so its functions are static. */

/* A per-head projection for every token: out[h] = w[h] x[h], where head h owns w's rows h * rows ..
 * and reads w.cols values at x + h * x_head, writing at out + h * out_head (strides: one token's). As few
 * dispatches as the quantized inputs' buffer allows (rows_work's heads): every head at once for a float matrix, as
 * many as the buffer's in_blocks blocks a token hold for a quantized one. */
static void per_head(colibri_ctx *c, const token_buffers *tb, const weight *w, uint32_t rows, const float *x,
                     uint32_t x_head, uint32_t x_stride, float *out, uint32_t out_head, uint32_t out_stride) {
    const uint32_t H = c->d.n_heads, blocks = (w->cols + QBLOCK - 1) / QBLOCK;
    const uint32_t group = DTYPE_TRAITS[w->dtype].block > 1u ? c->d.in_blocks / blocks : H; /* cols <= in_blocks' */
    for (uint32_t h = 0; h < H; h += group) {
        const uint32_t heads = H - h < group ? H - h : group;
        rows_work m = { .n_tok = tb->n, .n = 1, .x = x + (size_t)h * x_head, .x_stride = x_stride,
                        .out = { out + (size_t)h * out_head }, .out_stride = { out_stride },
                        .w = { weight_rows(w, h * rows, heads * rows) }, .heads = heads, .x_head = x_head,
                        .out_head = out_head };
        run_rows(c, tb, &m);
    }
}

/* Multi-head latent attention (DeepSeek-V2/V3, docs/MODELS.md) in the absorbed form: the cache holds each
 * position's normed latent c (kv_lora) and rotated rope key, shared by every head. Head h's score is
 * q_nope . (W_UK[h] c) + q_rope . k_rope = (W_UK[h]^T q_nope) . c + q_rope . k_rope, so its query is
 * W_UK[h]^T q_nope (WK_B holds every W_UK[h]^T) followed by q_rope; its value W_UV[h] c summed over
 * positions is W_UV[h] (the latent summed): WV_B after attention. Returns the output projection's input. The
 * layer's cache rows start at layer_base. */
static const float *attention_mla(colibri_ctx *c, const token_buffers *tb, uint32_t layer, size_t layer_base) {
    const model_dims *d = &c->d;
    const uint32_t n = tb->n, H = d->n_heads, hd = d->head_dim, rope_dim = d->rope_dim, nope = hd - rope_dim;
    const uint32_t lat = d->kv_lora, kd = d->att_dim, pairs = (kind_of(d, layer)->options & LAYER_OPT_ROPE_PAIRS) != 0;
    weight wkv_a = matrix(c, layer_index(c, layer, ROLE_WKV_A));
    const int lora = d->q_lora != 0; /* q = WQ_B rmsnorm(WQ_A x), or WQ x */
    rows_work a = { .n_tok = n, .n = 2, .x = tb->xn, .x_stride = d->dim, .out = { lora ? tb->q_a : tb->q, tb->k },
                    .out_stride = { lora ? d->q_lora : d->q_dim, d->kv_dim },
                    .w = { matrix(c, layer_index(c, layer, lora ? ROLE_WQ_A : ROLE_WQ)), wkv_a } };
    run_rows(c, tb, &a);
    if (lora) {
        for (uint32_t t = 0; t < n; t++)
            rmsnorm(tb->q_a + (size_t)t * d->q_lora, tb->q_a + (size_t)t * d->q_lora, layer_w(c, layer, ROLE_Q_A_NORM),
                    d->q_lora, d->eps);
        weight wq_b = matrix(c, layer_index(c, layer, ROLE_WQ_B));
        matmul(c, tb, tb->q, &wq_b, tb->q_a, n);
    }
    for (uint32_t t = 0; t < n; t++)
        rmsnorm(tb->k + (size_t)t * d->kv_dim, tb->k + (size_t)t * d->kv_dim, layer_w(c, layer, ROLE_KV_A_NORM), lat, d->eps);
    weight wk_b = matrix(c, layer_index(c, layer, ROLE_WK_B));
    per_head(c, tb, &wk_b, lat, tb->q, hd, d->q_dim, tb->q_att, kd, H * kd); /* head h's q_nope: wk_b.cols = nope */
    for (uint32_t t = 0; t < n; t++) {
        const uint32_t pos = c->pos + t;
        float *q = tb->q + (size_t)t * d->q_dim, *q_att = tb->q_att + (size_t)t * H * kd, *k = tb->k + (size_t)t * d->kv_dim;
        const float *cos, *sin;
        rope_rows(c, layer, pos, &cos, &sin);
        rope(q + nope, H, hd, rope_dim, pairs, cos, sin);
        rope(k + lat, 1, 0, rope_dim, pairs, cos, sin);
        for (uint32_t h = 0; h < H; h++)
            for (uint32_t i = 0; i < rope_dim; i++) q_att[(size_t)h * kd + lat + i] = q[(size_t)h * hd + nope + i];
        kv_store(c, c->a.k_cache, layer_base + (size_t)(pos % kv_rows(d, layer)) * d->kv_dim, k, d->kv_dim);
        attend_heads(c, layer, layer, layer_base, pos, q_att, tb->attn_out + (size_t)t * H * lat);
    }
    weight wv_b = matrix(c, layer_index(c, layer, ROLE_WV_B));
    per_head(c, tb, &wv_b, d->v_head_dim, tb->attn_out, lat, H * lat, tb->o_in, d->v_head_dim, d->o_dim);
    return tb->o_in;
}
