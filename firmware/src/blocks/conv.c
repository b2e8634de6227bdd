/* LFM2's gated short convolution, a layer's mixer instead of attention (transformers' Lfm2MoeShortConv):
 *   b, c, x = CONV_IN h                                  (three rows of D, in that order)
 *   y[ch] = c[ch] * sum_j CONV_KERNEL[ch][j] * u[ch](p - K + 1 + j)   for u = b * x, K = conv_kernel, j = 0 .. K-1
 *   out = CONV_OUT y
 * u before position 0 is 0. Each channel's last K - 1 inputs u are the layer's conv state (arena plan: conv_state),
 * oldest first; a token of a batch reads the state its batch-mates before it left, so a batch is the same sums, in
 * the same order, as one token a pass. Compiled in model.c's unit (it includes this file), so its functions are
 * static. */

/* The elements of every convolving layer's state (arena_plan's conv_state). */
static size_t conv_state_elements(const model_dims *d) {
    size_t n = 0;
    for (uint32_t l = 0; l < d->n_layers; l++)
        if (layer_conv(d, l)) n += (size_t)(d->conv_kernel - 1) * d->dim;
    return n;
}

/* Every convolving layer's state copied from `from` to `to` (put back after a failed pass), or with from NULL
 * zeroed: the inputs before position 0. */
static void conv_state_copy(const colibri_ctx *c, float *to, const float *from) {
    const size_t n = conv_state_elements(&c->d);
    for (size_t i = 0; i < n; i++) to[i] = from ? from[i] : 0.0f;
}

/* Before a pass: the state zeroed at position 0 (after open or a reset, whatever the arena held), then saved. */
static void conv_state_begin(const colibri_ctx *c) {
    if (c->pos == 0) conv_state_copy(c, c->a.conv_state, 0);
    conv_state_copy(c, c->a.conv_saved, c->a.conv_state);
}

/* The layer's convolution of every token's xn (normed x) into moe_out, advancing `state` (the layer's conv state)
 * token by token. Its y overwrites xn, which nothing reads after. */
static void short_conv(colibri_ctx *c, const token_buffers *tb, uint32_t layer, float *state) {
    const model_dims *d = &c->d;
    const uint32_t D = d->dim, K = d->conv_kernel, n = tb->n;
    weight in = matrix(c, layer_index(c, layer, ROLE_CONV_IN));
    matmul(c, tb, tb->bcx, &in, tb->xn, n);
    const float *w = layer_w(c, layer, ROLE_CONV_KERNEL); /* [D][K] */
    for (uint32_t t = 0; t < n; t++) {
        const float *b = tb->bcx + (size_t)t * 3 * D, *cg = b + D, *x = b + 2 * D;
        float *y = tb->xn + (size_t)t * D;
        for (uint32_t ch = 0; ch < D; ch++) {
            float *s = state + (size_t)ch * (K - 1);
            const float *wc = w + (size_t)ch * K, u = b[ch] * x[ch];
            float sum = 0.0f;
            for (uint32_t j = 0; j + 1 < K; j++) sum += wc[j] * s[j];
            sum += wc[K - 1] * u;
            for (uint32_t j = 0; j + 2 < K; j++) s[j] = s[j + 1];
            s[K - 2] = u;
            y[ch] = cg[ch] * sum;
        }
    }
    c->xn_quantized = 0;
    weight out = matrix(c, layer_index(c, layer, ROLE_CONV_OUT));
    matmul(c, tb, tb->moe_out, &out, tb->xn, n);
}
