/* The state a layer keeps instead of a KV cache (LFM2's short convolutions, Qwen3.5's DeltaNets), sized by the model,
 * not by the context: its convolution's last conv_kernel - 1 inputs per channel, oldest first, then a DeltaNet's
 * value heads' dk x dv matrices. The layers' states follow one another in layer order (arena plan: state). A pass
 * saves the whole state first and puts it back when it fails, so a failed call feeds no token; at position 0 the
 * state is zeroed (the inputs before the first position are 0). Compiled in model.c's unit (it includes this file),
 * so its functions are static. */

/* The channels `layer` convolves: x, b and c (SHORT_CONV: D) or q, k and v (DELTA_NET: 2·Hk·dk + Hv·dv); 0 for a
 * layer without a state. */
static uint32_t conv_channels(const model_dims *d, uint32_t layer) {
    if (layer_conv(d, layer)) return d->dim;
    return layer_delta(d, layer) ? d->dn_conv : 0;
}

/* The elements of `layer`'s state (arena_plan's sum). */
static size_t layer_state_elements(const model_dims *d, uint32_t layer) {
    const size_t recurrent = layer_delta(d, layer) ? (size_t)d->dn_v_heads * d->dn_k_dim * d->dn_v_dim : 0;
    return (size_t)(d->conv_kernel - 1) * conv_channels(d, layer) + recurrent;
}

/* Every layer's state copied from `from` to `to` (put back after a failed pass), or with from NULL zeroed. */
static void state_copy(const colibri_ctx *c, float *to, const float *from) {
    size_t n = 0;
    for (uint32_t l = 0; l < c->d.n_layers; l++) n += layer_state_elements(&c->d, l);
    for (size_t i = 0; i < n; i++) to[i] = from ? from[i] : 0.0f;
}

/* Before a pass: the state zeroed at position 0 (after open or a reset, whatever the arena held), then saved. */
static void state_begin(const colibri_ctx *c) {
    if (c->pos == 0) state_copy(c, c->a.state, 0);
    state_copy(c, c->a.state_saved, c->a.state);
}

/* One position of a causal depthwise convolution over `channels`: y[ch] = sum_j w[ch][j] · u_(t-K+1+j)[ch], summed
 * in j's order from +0, the last K - 1 inputs in `state` (per channel, oldest first), which u then joins. y may be u. */
static void causal_conv(float *state, const float *w, uint32_t K, uint32_t channels, const float *u, float *y) {
    for (uint32_t ch = 0; ch < channels; ch++) {
        float *s = state + (size_t)ch * (K - 1);
        const float *wc = w + (size_t)ch * K, now = u[ch];
        float sum = 0.0f;
        for (uint32_t j = 0; j + 1 < K; j++) sum += wc[j] * s[j];
        sum += wc[K - 1] * now;
        for (uint32_t j = 0; j + 2 < K; j++) s[j] = s[j + 1];
        s[K - 2] = now;
        y[ch] = sum;
    }
}
