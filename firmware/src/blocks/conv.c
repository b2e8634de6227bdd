/* LFM2's gated short convolution, a layer's mixer instead of attention (transformers' Lfm2MoeShortConv):
 *   b, c, x = CONV_IN h                                  (three rows of D, in that order)
 *   y[ch] = c[ch] * sum_j CONV_KERNEL[ch][j] * u[ch](p - K + 1 + j)   for u = b * x, K = conv_kernel, j = 0 .. K-1
 *   out = CONV_OUT y
 * u before position 0 is 0. Each channel's last K - 1 inputs u are the layer's state (blocks/state.c); a token of a
 * batch reads the state its batch-mates before it left, so a batch is the same sums, in the same order, as one token
 * a pass. Compiled in model.c's unit (it includes this file), so its functions are static. */

/* The layer's convolution of every token's xn (normed x) into moe_out, advancing `state` (the layer's) token by
 * token. Its y overwrites xn, which nothing reads after. */
static void short_conv(colibri_ctx *c, const token_buffers *tb, uint32_t layer, float *state) {
    const model_dims *d = &c->d;
    const uint32_t D = d->dim, n = tb->n;
    weight in = matrix(c, layer_index(c, layer, ROLE_CONV_IN));
    matmul(c, tb, tb->mix, &in, tb->xn, n);
    const float *w = layer_w(c, layer, ROLE_CONV_KERNEL); /* [D][K] */
    for (uint32_t t = 0; t < n; t++) {
        float *b = tb->mix + (size_t)t * 3 * D, *y = tb->xn + (size_t)t * D;
        const float *cg = b + D, *x = b + 2 * D;
        for (uint32_t ch = 0; ch < D; ch++) b[ch] *= x[ch]; /* u = b * x, in b's place */
        causal_conv(state, w, d->conv_kernel, D, b, y);
        for (uint32_t ch = 0; ch < D; ch++) y[ch] *= cg[ch];
    }
    c->xn_quantized = 0;
    weight out = matrix(c, layer_index(c, layer, ROLE_CONV_OUT));
    matmul(c, tb, tb->moe_out, &out, tb->xn, n);
}
