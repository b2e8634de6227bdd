/* The gated FFN: a dense MLP, a shared expert or one routed expert (SwiGLU, GeGLU, gpt-oss's clamped form).
 * Compiled in model.c's unit (it includes this file), so its functions are static. */

/* ffn_out = down(act(gate x) * up x) for n vectors x (stride dim): one expert, the shared expert or a
 * dense MLP of `layer`, whose record names act (silu or gelu). `gate_index` is the table index of the gate matrix;
 * up and down follow it. The three matrices are read from `block` (see matrix_in). A routed expert's `extras`
 * (gpt-oss; else NULL) add its biases and its activation. */
static void swiglu_ffn(colibri_ctx *c, const token_buffers *tb, uint32_t layer, uint32_t gate_index, const uint8_t *block,
                       uint64_t block_offset, const float *x, uint32_t n, const ffn_extras *extras) {
    const uint32_t dim = c->d.dim, ffn = c->d.ffn_max;
    rows_work gate_up = { .n_tok = n, .n = 2, .x = x, .x_stride = dim, .out = { tb->gate, tb->up },
                          .out_stride = { ffn, ffn },
                          .w = { matrix_in(c, gate_index, block, block_offset),
                                 matrix_in(c, gate_index + 1, block, block_offset) },
                          .epilogue = WITH_GEMMA4 && kind_of(&c->d, layer)->activation == LAYER_ACT_GELU_TANH ? ROWS_GEGLU : ROWS_SWIGLU,
                          .extras = extras };
    run_rows(c, tb, &gate_up);
    rows_work down = { .n_tok = n, .n = 1, .x = tb->gate, .x_stride = ffn, .out = { tb->ffn_out }, .out_stride = { dim },
                       .w = { matrix_in(c, gate_index + 2, block, block_offset) } };
    run_rows(c, tb, &down);
    if (WITH_EXPERT_EXTRAS && extras && extras->bias[2])
        for (uint32_t t = 0; t < n; t++)
            for (uint32_t i = 0; i < dim; i++) tb->ffn_out[(size_t)t * dim + i] += extras->bias[2][i];
}
