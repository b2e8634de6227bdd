/* Gemma 4's per-layer inputs.
 * Compiled in model.c's unit (it includes this file), so its functions are static. */

/* Gemma 4's per-layer inputs of the pass's tokens into tb->ple (token t's L * P values at t * L * P, layer l's
 * P of them at l * P; then a scratch of P per token): the token's row of PLE_EMBD times sqrt(P), plus the scaled
 * embedding x through the layer's P rows of PLE_MODEL_PROJ, times D^-1/2 and normed, the sum times 2^-1/2
 * (transformers' project_per_layer_inputs). */
static void per_layer_inputs(colibri_ctx *c, const token_buffers *tb, const uint32_t *tokens) {
    const model_dims *d = &c->d;
    const uint32_t P = d->ple_dim, LP = d->n_layers * P;
    const float token_scale = SQRTF((float)P), context_scale = 1.0f / SQRTF((float)d->dim);
    weight embd = matrix(c, global_tensor_index(d, ROLE_PLE_EMBD)), proj = matrix(c, global_tensor_index(d, ROLE_PLE_MODEL_PROJ));
    const float *norm = tensor(c, global_tensor_index(d, ROLE_PLE_PROJ_NORM));
    float *context = tb->ple + (size_t)tb->n * LP;
    for (uint32_t t = 0; t < tb->n; t++) weight_row(tb->ple + (size_t)t * LP, &embd, tokens[t]);
    for (size_t i = 0; i < (size_t)tb->n * LP; i++) tb->ple[i] *= token_scale;
    for (uint32_t l = 0; l < d->n_layers; l++) {
        weight rows = weight_rows(&proj, l * P, P);
        matmul(c, tb, context, &rows, tb->x, tb->n);
        for (uint32_t t = 0; t < tb->n; t++) {
            float *ctx = context + (size_t)t * P, *ple = tb->ple + (size_t)t * LP + (size_t)l * P;
            for (uint32_t j = 0; j < P; j++) ctx[j] *= context_scale;
            rmsnorm(ctx, ctx, norm, P, d->eps);
            for (uint32_t j = 0; j < P; j++) ple[j] = (ctx[j] + ple[j]) * 0.70710678118654752f;
        }
    }
}

/* x += what Gemma 4's layer adds from its per-layer input: gelu_tanh(PLE_GATE x) times the input, through
 * PLE_PROJ, normed. */
static void per_layer_input(colibri_ctx *c, const token_buffers *tb, uint32_t layer) {
    const model_dims *d = &c->d;
    const uint32_t P = d->ple_dim, LP = d->n_layers * P;
    float *gate = tb->ple + (size_t)tb->n * LP;
    weight w_gate = matrix(c, layer_index(c, layer, ROLE_PLE_GATE)), w_proj = matrix(c, layer_index(c, layer, ROLE_PLE_PROJ));
    matmul(c, tb, gate, &w_gate, tb->x, tb->n);
    for (uint32_t t = 0; t < tb->n; t++)
        for (uint32_t j = 0; j < P; j++)
            gate[t * P + j] = gelu_tanh(gate[t * P + j]) * tb->ple[(size_t)t * LP + (size_t)layer * P + j];
    matmul(c, tb, tb->ffn_out, &w_proj, gate, tb->n);
    post_norm(c, tb, tb->ffn_out, layer, ROLE_PLE_POST_NORM);
    for (size_t i = 0; i < (size_t)tb->n * d->dim; i++) tb->x[i] += tb->ffn_out[i];
}
