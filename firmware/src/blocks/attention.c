/* Standard attention (multi-head, grouped-query, sliding windows, Gemma 4's global layers and shared
 * caches), the KV cache's rows, RoPE, and the heads' softmax(q K^T) V, which MLA shares.
 * Compiled in model.c's unit (it includes this file), so its functions are static. */

/* The KV cache holds f32 or f16 (rounded to nearest even) per the image's kv_dtype. */
static void kv_store(const colibri_ctx *c, void *cache, size_t at, const float *v, uint32_t n) {
    if (c->d.kv_dtype == KV_F16) {
        for (uint32_t i = 0; i < n; i++) ((uint16_t *)cache)[at + i] = f32_to_f16(v[i]);
    } else {
        for (uint32_t i = 0; i < n; i++) ((float *)cache)[at + i] = v[i];
    }
}
static float kv_dot(const colibri_ctx *c, const void *cache, size_t at, const float *q, uint32_t n) {
    return c->d.kv_dtype == KV_F16 ? c->kernels->dot_f16((const uint16_t *)cache + at, q, n)
                                   : c->kernels->dot_f32((const float *)cache + at, q, n);
}
/* out[i] = the sum of p[t] * v_t[i] over the `seen` cached rows from ring row `first_row` on (`rows` in the ring,
 * row_dim apart from element `at`), oldest first: the kernel set's value sum over each run of consecutive rows (up
 * to the ring's end, then from its start), each element's rows in order. */
static void kv_accumulate(const colibri_ctx *c, float *out, const float *p, const void *cache, size_t at, size_t row_dim,
                          uint32_t first_row, uint32_t seen, uint32_t rows, uint32_t n) {
    for (uint32_t i = 0; i < n; i++) out[i] = 0.0f;
    for (uint32_t done = 0, r = first_row; done < seen; r = 0) {
        const uint32_t run = seen - done < rows - r ? seen - done : rows - r;
        const size_t from = at + (size_t)r * row_dim;
        if (c->d.kv_dtype == KV_F16) ACCUMULATE_F16(c->kernels)(out, p + done, (const uint16_t *)cache + from, row_dim, run, n);
        else ACCUMULATE_F32(c->kernels)(out, p + done, (const float *)cache + from, row_dim, run, n);
        done += run;
    }
}

/* The scores q_h . k_t of `heads` queries (q_stride apart, each row of out out_stride apart) against the `seen` cached
 * key rows from ring row `first_row` on, oldest first: the kernel set's scores over each run of consecutive rows, as
 * kv_accumulate reads them. */
static void kv_scores(const colibri_ctx *c, float *out, size_t out_stride, const void *cache, size_t at, size_t row_dim,
                      uint32_t first_row, uint32_t seen, uint32_t rows, const float *q, size_t q_stride, uint32_t heads,
                      uint32_t n) {
#if WITH_KERNEL_SCORES
    for (uint32_t done = 0, r = first_row; done < seen; r = 0) {
        const uint32_t run = seen - done < rows - r ? seen - done : rows - r;
        const size_t from = at + (size_t)r * row_dim;
        if (c->d.kv_dtype == KV_F16)
            c->kernels->scores_f16(out + done, out_stride, (const uint16_t *)cache + from, row_dim, run, q, q_stride, heads, n);
        else c->kernels->scores_f32(out + done, out_stride, (const float *)cache + from, row_dim, run, q, q_stride, heads, n);
        done += run;
    }
#else
    (void)c, (void)out, (void)out_stride, (void)cache, (void)at, (void)row_dim, (void)first_row, (void)seen, (void)rows;
    (void)q, (void)q_stride, (void)heads, (void)n;
#endif
}

/* RMSNorm on each of n_heads heads of hd, with shared weights (w NULL: none, Gemma 4's v norm whatever the q/k one). */
static void head_norm(const colibri_ctx *c, float *v, uint32_t n_heads, uint32_t hd, const float *w) {
    for (uint32_t h = 0; h < n_heads; h++) rmsnorm(v + (size_t)h * hd, v + (size_t)h * hd, w, hd, c->d.eps);
}

/* q/k RMSNorm: across the whole projection (`full`), or on each head. */
static void qk_norm(const colibri_ctx *c, int full, float *v, uint32_t n_heads, uint32_t hd, const float *w) {
    if (full) rmsnorm(v, v, w, n_heads * hd, c->d.eps);
    else head_norm(c, v, n_heads, hd, w);
}

static void clip(float *v, uint32_t n, float limit) {
    for (uint32_t i = 0; i < n; i++) v[i] = v[i] > limit ? limit : (v[i] < -limit ? -limit : v[i]);
}

typedef struct {
    colibri_ctx *c;
    uint32_t layer, cache, pos, parts;
    size_t layer_base;
    const float *q_all;
    float *out_all;
} heads_work;

/* Heads [n_heads * part / parts, n_heads * (part + 1) / parts) of a heads_work: each head has its own
 * scores row (a.att) and output, so parts share nothing and a head's bits do not depend on its part. */
static void heads_part(void *arg, uint32_t part) {
    const heads_work *hw = arg;
    colibri_ctx *c = hw->c;
    const model_dims *d = &c->d;
    const arena_buffers *a = &c->a;
    const uint32_t cache = hw->cache;
    const int mla = WITH_MLA && d->kv_lora;
    const uint32_t kd = mla ? d->att_dim : layer_head_dim(d, cache), vd = mla ? d->val_dim : kd;
    const uint32_t group = d->n_heads / layer_kv_heads(d, cache), rows = kv_rows(d, cache), row_dim = layer_kv_dim(d, cache);
    const uint32_t first = hw->pos >= rows ? hw->pos - rows + 1 : 0, seen = hw->pos - first + 1, first_row = first % rows;
    const void *values = mla ? a->k_cache : a->v_cache;
    const float *sinks = WITH_SINKS && (kind_of(d, hw->layer)->options & LAYER_OPT_ATTN_SINKS) ? layer_w(c, hw->layer, ROLE_SINKS) : 0;
    const uint32_t h_start = part_start(d->n_heads, part, hw->parts), h_end = part_start(d->n_heads, part + 1, hw->parts);
    for (uint32_t h = h_start; h < h_end; h++) {
        const float *q = hw->q_all + (size_t)h * kd;
        const size_t kv_off = hw->layer_base + (size_t)(h / group) * kd;
        float *att = a->att + (size_t)h * d->max_seq;
        if (WITH_KERNEL_SCORES) {
            if (h % group == 0 || h == h_start) { /* the scores of this KV head's queries in this part, its rows read once */
                const uint32_t g_end = (h / group + 1) * group < h_end ? (h / group + 1) * group : h_end;
                kv_scores(c, att, d->max_seq, a->k_cache, kv_off, row_dim, first_row, seen, rows, q, kd, g_end - h, kd);
            }
            for (uint32_t t = 0; t < seen; t++) att[t] *= d->attn_scale;
        } else
            for (uint32_t t = 0, r = first_row; t < seen; t++, r = r + 1 == rows ? 0 : r + 1)
                att[t] = kv_dot(c, a->k_cache, kv_off + (size_t)r * row_dim, q, kd) * d->attn_scale;
#if WITH_KERNEL_SCORES
        c->kernels->softmax(att, seen, sinks ? sinks + h : 0);
#else
        softmax(att, seen, sinks ? sinks + h : 0);
#endif
        float *out = hw->out_all + (size_t)h * vd;
        kv_accumulate(c, out, att, values, kv_off, row_dim, first_row, seen, rows, vd);
    }
}

/* softmax(q K^T * scale) V for every head of layer's token at position pos, over the positions the cache of
 * `cache` (the layer itself, or the one whose cache it shares) still holds, oldest first (with a sliding window
 * the ring's oldest row comes first); that cache starts at layer_base. Head h's query (att_dim wide, at q_all +
 * h * att_dim) meets its KV head's key rows; its output is val_dim wide. MLA has one KV head whose key row
 * starts with the latent, and the latent is the value (no V cache).
 * The heads are split across the board's threads if it lends some (a part may have no head); the lean
 * build, for boards without threads, leaves the split out. */
static void attend_heads(colibri_ctx *c, uint32_t layer, uint32_t cache, size_t layer_base, uint32_t pos,
                         const float *q_all, float *out_all) {
    const uint32_t parts = WITH_THREADED_HEADS ? c->opts.parallel_parts : 1;
    heads_work hw = { c, layer, cache, pos, parts > 1 ? parts : 1, layer_base, q_all, out_all };
    if (hw.parts > 1) c->opts.parallel_for(c->opts.user, heads_part, &hw, hw.parts);
    else heads_part(&hw, 0);
}

/* RoPE on n vectors of dim (the rotated part of each head, `stride` apart) with this position's cos/sin
 * rows: the two halves rotated together, or with `pairs` adjacent elements (DeepSeek's layout). */
static void rope(float *v, uint32_t n, uint32_t stride, uint32_t dim, int pairs, const float *cos, const float *sin) {
    const uint32_t half = dim / 2, second = pairs ? 1 : half, step = pairs ? 2 : 1;
    for (uint32_t h = 0; h < n; h++) {
        float *x = v + (size_t)h * stride;
        for (uint32_t i = 0; i < half; i++) {
            float *p = x + i * step, a = p[0], b = p[second];
            p[0] = a * cos[i] - b * sin[i];
            p[second] = b * cos[i] + a * sin[i];
        }
    }
}

/* Position pos's cos and sin rows of the RoPE tables `layer` rotates with (Gemma 4's global layers: their own), and
 * how many of a head's first dims they rotate (rope_dim: all, or Qwen3.5's part). */
static uint32_t rope_rows(const colibri_ctx *c, uint32_t layer, uint32_t pos, const float **cos, const float **sin) {
    const model_dims *d = &c->d;
    const int global = WITH_GEMMA4 && (kind_of(d, layer)->options & LAYER_OPT_GLOBAL_ROPE);
    const uint32_t rotated = global ? d->global_head_dim : d->rope_dim;
    const size_t at = (size_t)pos * (rotated / 2);
    *cos = tensor(c, global_tensor_index(d, global ? ROLE_GLOBAL_ROPE_COS : ROLE_ROPE_COS)) + at;
    *sin = tensor(c, global_tensor_index(d, global ? ROLE_GLOBAL_ROPE_SIN : ROLE_ROPE_SIN)) + at;
    return rotated;
}

/* Standard attention's q, k, v for every token, then each token in turn: q/k (and v) norms, clipping, RoPE,
 * its k and v into the cache, its heads. Tokens of a batch store and attend one after another, so within the
 * layer no token reads a row a later one wrote; a layer sharing a windowed ring reads it after its owner stored
 * the whole pass, so it takes the ring back to where it was before the pass and gives token t's row back just
 * before t attends (n <= W there: colibri_open's batch_limit). The layer's widths are its own (Gemma 4's global
 * layers have a head size and KV heads of theirs, and there v may be k's projection). Returns the output
 * projection's input, q_dim of the layer per token. The cache's rows start at layer_base (attention). */
static const float *attention_mha(colibri_ctx *c, const token_buffers *tb, uint32_t layer, size_t layer_base) {
    const model_dims *d = &c->d;
    const layer_kind *kind = kind_of(d, layer);
    const uint32_t n = tb->n, hd = layer_head_dim(d, layer), kv_heads = layer_kv_heads(d, layer);
    const uint32_t q_dim = d->n_heads * hd, kv_dim = kv_heads * hd, pairs = WITH_ROPE_PAIRS && (kind->options & LAYER_OPT_ROPE_PAIRS);
    /* Gemma 4: a layer sharing an earlier one's KV cache computes only q; attention_k_eq_v: v is k's projection */
    const uint32_t cache = kv_source(d, layer), shared = cache != layer;
    const int k_is_v = WITH_GEMMA4 && !shared && !present(c, layer_index(c, layer, ROLE_WV));
    weight wq = matrix(c, layer_index(c, layer, ROLE_WQ)), wk = matrix(c, layer_index(c, layer, ROLE_WK)),
           wv = matrix(c, layer_index(c, layer, ROLE_WV));
    rows_work qkv = { .n_tok = n, .n = shared ? 1 : k_is_v ? 2 : 3, .x = tb->xn, .x_stride = d->dim,
                      .out = { tb->q, tb->k, tb->v }, .out_stride = { q_dim, kv_dim, kv_dim }, .w = { wq, wk, wv } };
    run_rows(c, tb, &qkv);
    add_bias(c, tb->q, q_dim, n, layer, ROLE_BQ);
    add_bias(c, tb->k, kv_dim, n, layer, ROLE_BK);
    add_bias(c, tb->v, kv_dim, n, layer, ROLE_BV);
    if (k_is_v)
        for (size_t i = 0; i < (size_t)n * kv_dim; i++) tb->v[i] = tb->k[i];
    const int gated = WITH_DELTA_NET && (kind->options & LAYER_OPT_ATTN_GATE);
    if (gated) { /* Qwen3.5's gate on each head's output */
        weight wg = matrix(c, layer_index(c, layer, ROLE_WQ_GATE));
        matmul(c, tb, tb->q_gate, &wg, tb->xn, n);
    }
    const int qk_norms = kind->qk_norm != LAYER_QK_NORM_NONE, full_norm = kind->qk_norm == LAYER_QK_NORM_FULL;
    const int exchange = WITH_WINDOW_RINGS && shared && n > 1 && layer_windowed(d, cache); /* saved rows: the ring before */
    if (exchange) ring_rows(c, cache, layer_base, c->rings.shared, 0, n, 1);
    for (uint32_t t = 0; t < n; t++) {
        const uint32_t pos = c->pos + t;
        float *q = tb->q + (size_t)t * q_dim, *k = tb->k + (size_t)t * kv_dim, *v = tb->v + (size_t)t * kv_dim;
        const float *cos, *sin;
        const uint32_t rotated = rope_rows(c, layer, pos, &cos, &sin);
        if (qk_norms) qk_norm(c, full_norm, q, d->n_heads, hd, layer_w(c, layer, ROLE_Q_NORM));
        if (d->clip_qkv > 0.0f) clip(q, q_dim, d->clip_qkv);
        rope(q, d->n_heads, hd, rotated, pairs, cos, sin);
        if (!shared) { /* this position's k and v into the layer's cache */
            if (qk_norms) qk_norm(c, full_norm, k, kv_heads, hd, layer_w(c, layer, ROLE_K_NORM));
            if (WITH_GEMMA4 && (kind->options & LAYER_OPT_V_NORM)) head_norm(c, v, kv_heads, hd, 0);
            if (d->clip_qkv > 0.0f) {
                clip(k, kv_dim, d->clip_qkv);
                clip(v, kv_dim, d->clip_qkv);
            }
            rope(k, kv_heads, hd, rotated, pairs, cos, sin);
            const size_t row = layer_base + (size_t)(pos % kv_rows(d, layer)) * kv_dim;
            kv_store(c, c->a.k_cache, row, k, kv_dim);
            kv_store(c, c->a.v_cache, row, v, kv_dim);
        }
        if (exchange) ring_rows(c, cache, layer_base, c->rings.shared, t, t + 1, 1); /* t's row back */
        float *out = tb->attn_out + (size_t)t * q_dim;
        attend_heads(c, layer, cache, layer_base, pos, q, out);
        for (uint32_t i = 0; gated && i < q_dim; i++) out[i] *= 1.0f / (1.0f + colibri_expf(-tb->q_gate[(size_t)t * q_dim + i]));
    }
    return tb->attn_out;
}
