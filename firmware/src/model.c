/* The forward pass for one token, following transformers' implementations of the supported
 * families (docs/MODELS.md):
 *   x = embed[token]
 *   per layer:  h = rmsnorm(x)
 *               q, k, v = Wq h (+bq), Wk h (+bk), Wv h (+bv); optional q/k RMSNorm (per head or
 *               across the projection) and clipping; rotate-half RoPE on q and k
 *               x += Wo attention(q, K cache, V cache) (+bo)
 *               h = rmsnorm(x)
 *               x += dense SwiGLU MLP(h), or in a MoE layer
 *                    sum over the top-k experts of w_k * expert_k(h) (+ sigmoid(g . h) * shared(h))
 *   logits = lm_head(rmsnorm(x))
 * Weights are read in place from the image, in their stored dtype (f32, f16, bf16, Q8_0, Q4_0), except
 * routed experts with an expert cache, which come through it (experts.c); the KV cache (f32 or f16)
 * and activations live in the arena. */
#include "internal.h"

/* An f32 vector (norm weights, biases, RoPE rows): the verifier allows only f32 there. */
static const float *tensor(const colibri_ctx *c, uint32_t index) {
    return (const float *)(const void *)(c->image + c->a.tensors[index].offset);
}
static int present(const colibri_ctx *c, uint32_t index) { return c->a.tensors[index].rows != 0; }
static uint32_t layer_index(const colibri_ctx *c, uint32_t layer, uint32_t role) {
    return layer_tensor_index(&c->d, layer, role);
}
static const float *layer_w(const colibri_ctx *c, uint32_t layer, uint32_t role) {
    return tensor(c, layer_index(c, layer, role));
}

/* A matrix in any dtype, as open() resolved table entry `index`, read from `block`: a copy of the
 * image's bytes from `block_offset` on (an expert cache slot), or the image itself (offset 0). */
static weight matrix_in(const colibri_ctx *c, uint32_t index, const uint8_t *block, uint64_t block_offset) {
    const tensor_ref *t = &c->a.tensors[index];
    weight w = { .data = block + (t->offset - block_offset),
                 .scales = t->scales ? (const uint16_t *)(const void *)(block + (t->scales - block_offset)) : 0,
                 .dtype = t->dtype, .rows = t->rows, .cols = t->cols };
    w.blocks = (w.cols + QBLOCK - 1) / QBLOCK;
    return w;
}
static weight matrix(const colibri_ctx *c, uint32_t index) { return matrix_in(c, index, c->image, 0); }


/* x quantized to Q8_0 in the arena: the normed x once per norm (many matvecs read it), any other
 * input at every call. */
static q8_vector quantized_input(colibri_ctx *c, const float *x, uint32_t n) {
    arena_buffers *a = &c->a;
    if (x == a->xn) {
        if (!c->xn_quantized) quantize_q8_0(a->xq, a->xq_scale, a->xq_sum, x, n);
        c->xn_quantized = 1;
        return (q8_vector){ a->xq, a->xq_scale, a->xq_sum };
    }
    quantize_q8_0(a->hq, a->hq_scale, a->hq_sum, x, n);
    return (q8_vector){ a->hq, a->hq_scale, a->hq_sum };
}

/* x normed into xn, the input of the matvecs that follow */
static void norm_input(colibri_ctx *c, const float *weights) {
    rmsnorm(c->a.xn, c->a.x, weights, c->d.dim, c->d.eps);
    c->xn_quantized = 0;
}

/* Up to three matrices that read one input, each part computing a fixed share of every matrix's rows
 * (the same code for a row whichever thread runs it: results do not depend on the split), and what
 * happens to each row once its part has it:
 *   ROWS_SWIGLU     out[0][i] = silu(out[0][i]) * out[1][i]    (gate and up of one FFN)
 *   ROWS_ACCUMULATE acc[i] += scale * out[0][i]                 (an FFN's down into moe_out) */
enum rows_epilogue { ROWS_ONLY, ROWS_SWIGLU, ROWS_ACCUMULATE };
typedef struct {
    const kernel_set *k;
    const float *x;      /* the input, f32 */
    q8_vector xq;        /* and quantized, when a matrix is Q8_0/Q4_0 */
    uint32_t n, parts;
    float *out[3];
    weight w[3];
    enum rows_epilogue epilogue;
    float scale;
    float *acc;
} rows_work;

/* Below this many weights a matvec is not worth waking other threads for (a router, a gate vector). */
#define PARALLEL_MIN_WEIGHTS 16384u

/* out[r] = w[r] . x for r in [r0, r1), with kernel set k */
static void matvec_rows(const kernel_set *k, float *out, const weight *w, const float *x, const q8_vector *xq,
                        uint32_t r0, uint32_t r1) {
    const uint32_t cols = w->cols;
    if (w->dtype == DTYPE_Q8_0 || w->dtype == DTYPE_Q4_0) {
        const size_t row_bytes = (size_t)w->blocks * (w->dtype == DTYPE_Q8_0 ? QBLOCK : QBLOCK / 2);
        for (uint32_t r = r0; r < r1; r++) {
            const void *row = (const uint8_t *)w->data + r * row_bytes;
            const uint16_t *s = w->scales + (size_t)r * w->blocks;
            out[r] = w->dtype == DTYPE_Q8_0 ? k->dot_q8_0(row, s, xq, w->blocks) : k->dot_q4_0(row, s, xq, w->blocks);
        }
    } else if (w->dtype == DTYPE_F32) {
        for (uint32_t r = r0; r < r1; r++) out[r] = k->dot_f32((const float *)w->data + (size_t)r * cols, x, cols);
    } else {
        float (*dot16)(const uint16_t *, const float *, uint32_t) = w->dtype == DTYPE_F16 ? k->dot_f16 : k->dot_bf16;
        for (uint32_t r = r0; r < r1; r++) out[r] = dot16((const uint16_t *)w->data + (size_t)r * cols, x, cols);
    }
}

/* The first row of `part`: rows < 2^24 (IMG_MAX_DIM) and part <= COLIBRI_MAX_PARTS, so 32 bits hold the product. */
static uint32_t part_start(uint32_t rows, uint32_t part, uint32_t parts) {
    return rows * part / parts;
}

static void rows_part(void *arg, uint32_t part) {
    const rows_work *m = arg;
    for (uint32_t j = 0; j < m->n; j++)
        matvec_rows(m->k, m->out[j], &m->w[j], m->x, &m->xq, part_start(m->w[j].rows, part, m->parts),
                    part_start(m->w[j].rows, part + 1, m->parts));
    const uint32_t r0 = part_start(m->w[0].rows, part, m->parts), r1 = part_start(m->w[0].rows, part + 1, m->parts);
    float *a = m->out[0];
    if (m->epilogue == ROWS_SWIGLU) {
        for (uint32_t i = r0; i < r1; i++) a[i] = a[i] / (1.0f + colibri_expf(-a[i])) * m->out[1][i];
    } else if (m->epilogue == ROWS_ACCUMULATE) {
        for (uint32_t i = r0; i < r1; i++) m->acc[i] += m->scale * a[i];
    }
}

/* Run m: x quantized first if a matrix wants it, then every part, on the board's threads if it lends some. */
static void run_rows(colibri_ctx *c, rows_work *m) {
    uint64_t weights = 0;
    int quantized = 0;
    for (uint32_t j = 0; j < m->n; j++) {
        weights += (uint64_t)m->w[j].rows * m->w[j].cols;
        quantized |= m->w[j].dtype == DTYPE_Q8_0 || m->w[j].dtype == DTYPE_Q4_0;
    }
    m->k = c->kernels;
    if (quantized) m->xq = quantized_input(c, m->x, m->w[0].cols);
    m->parts = c->opts.parallel_parts > 1 && weights >= PARALLEL_MIN_WEIGHTS ? c->opts.parallel_parts : 1;
    if (m->parts == 1) rows_part(m, 0);
    else c->opts.parallel_for(c->opts.user, rows_part, m, m->parts);
}

/* out[rows] = w x[cols] */
static void matvec(colibri_ctx *c, float *out, const weight *w, const float *x) {
    rows_work m = { .x = x, .n = 1, .out = { out }, .w = { *w } };
    run_rows(c, &m);
}

/* out += b, when the image has that bias */
static void add_bias(const colibri_ctx *c, float *out, uint32_t n, uint32_t layer, uint32_t b_role) {
    if (!present(c, layer_index(c, layer, b_role))) return;
    const float *b = layer_w(c, layer, b_role);
    for (uint32_t i = 0; i < n; i++) out[i] += b[i];
}

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
/* out[i] += p * v[i] for one cached v row; the dtype is chosen once per row, not per element */
static void kv_accumulate(const colibri_ctx *c, float *out, float p, const void *cache, size_t at, uint32_t n) {
    if (c->d.kv_dtype == KV_F16) {
        for (uint32_t i = 0; i < n; i++) out[i] += p * f16_to_f32(((const uint16_t *)cache)[at + i]);
    } else {
        for (uint32_t i = 0; i < n; i++) out[i] += p * ((const float *)cache)[at + i];
    }
}

/* q/k RMSNorm: across the whole projection, or on each head with shared weights. */
static void qk_norm(const colibri_ctx *c, float *v, uint32_t n_heads, const float *w) {
    const model_dims *d = &c->d;
    if (d->flags & IMG_FLAG_QK_NORM_FULL) {
        rmsnorm(v, v, w, n_heads * d->head_dim, d->eps);
    } else {
        for (uint32_t h = 0; h < n_heads; h++) rmsnorm(v + (size_t)h * d->head_dim, v + (size_t)h * d->head_dim, w,
                                                       d->head_dim, d->eps);
    }
}

static void clip(float *v, uint32_t n, float limit) {
    for (uint32_t i = 0; i < n; i++) v[i] = v[i] > limit ? limit : (v[i] < -limit ? -limit : v[i]);
}

static void attention(colibri_ctx *c, uint32_t layer) {
    const model_dims *d = &c->d;
    const arena_buffers *a = &c->a;
    const uint32_t pos = c->pos, hd = d->head_dim, group = d->n_heads / d->n_kv_heads;
    const size_t layer_base = (size_t)layer * d->max_seq * d->kv_dim;
    float *k_cur = a->k_new, *v_cur = a->v_new; /* this position's k and v in f32, stored once final */

    norm_input(c, layer_w(c, layer, ROLE_ATTN_NORM));
    rows_work qkv = { .x = a->xn, .n = 3, .out = { a->q, k_cur, v_cur },
                      .w = { matrix(c, layer_index(c, layer, ROLE_WQ)), matrix(c, layer_index(c, layer, ROLE_WK)),
                             matrix(c, layer_index(c, layer, ROLE_WV)) } };
    run_rows(c, &qkv);
    add_bias(c, a->q, d->q_dim, layer, ROLE_BQ);
    add_bias(c, k_cur, d->kv_dim, layer, ROLE_BK);
    add_bias(c, v_cur, d->kv_dim, layer, ROLE_BV);
    if (d->flags & (IMG_FLAG_QK_NORM_HEAD | IMG_FLAG_QK_NORM_FULL)) {
        qk_norm(c, a->q, d->n_heads, layer_w(c, layer, ROLE_Q_NORM));
        qk_norm(c, k_cur, d->n_kv_heads, layer_w(c, layer, ROLE_K_NORM));
    }
    if (d->clip_qkv > 0.0f) {
        clip(a->q, d->q_dim, d->clip_qkv);
        clip(k_cur, d->kv_dim, d->clip_qkv);
        clip(v_cur, d->kv_dim, d->clip_qkv);
    }
    const float *cos = tensor(c, global_tensor_index(d, ROLE_ROPE_COS)) + (size_t)pos * (hd / 2);
    const float *sin = tensor(c, global_tensor_index(d, ROLE_ROPE_SIN)) + (size_t)pos * (hd / 2);
    rope(a->q, d->n_heads, hd, cos, sin);
    rope(k_cur, d->n_kv_heads, hd, cos, sin);
    kv_store(c, a->k_cache, layer_base + (size_t)pos * d->kv_dim, k_cur, d->kv_dim);
    kv_store(c, a->v_cache, layer_base + (size_t)pos * d->kv_dim, v_cur, d->kv_dim);

    for (uint32_t h = 0; h < d->n_heads; h++) {
        const float *q = a->q + (size_t)h * hd;
        const size_t kv_off = layer_base + (size_t)(h / group) * hd;
        float *att = a->att + (size_t)h * d->max_seq;
        for (uint32_t t = 0; t <= pos; t++) att[t] = kv_dot(c, a->k_cache, kv_off + (size_t)t * d->kv_dim, q, hd) * c->attn_scale;
        softmax(att, pos + 1);
        float *out = a->attn_out + (size_t)h * hd;
        for (uint32_t i = 0; i < hd; i++) out[i] = 0.0f;
        for (uint32_t t = 0; t <= pos; t++) kv_accumulate(c, out, att[t], a->v_cache, kv_off + (size_t)t * d->kv_dim, hd);
    }
    weight wo = matrix(c, layer_index(c, layer, ROLE_WO));
    matvec(c, a->moe_out, &wo, a->attn_out);
    add_bias(c, a->moe_out, d->dim, layer, ROLE_BO);
    for (uint32_t i = 0; i < d->dim; i++) a->x[i] += a->moe_out[i];
}

/* Whether all n values are finite (x - x is 0 for finite x, NaN for inf and NaN). */
static int all_finite(const float *v, uint32_t n) {
    for (uint32_t i = 0; i < n; i++)
        if (v[i] - v[i] != 0.0f) return 0;
    return 1;
}

/* Layer's router probabilities for xn into a->router: softmax over all experts. */
static colibri_status router_probs(colibri_ctx *c, uint32_t layer) {
    weight router = matrix(c, layer_index(c, layer, ROLE_ROUTER));
    matvec(c, c->a.router, &router, c->a.xn);
    softmax(c->a.router, c->d.n_experts);
    return all_finite(c->a.router, c->d.n_experts) ? COLIBRI_OK : COLIBRI_E_NONFINITE;
}

/* The most probable expert left in a->router (ties: lower index), marked taken below any probability;
 * *p gets its probability. One scan, so top_k picks cost top_k * n_experts (the verifier caps both:
 * docs/SECURITY.md). */
static uint32_t pick_expert(const colibri_ctx *c, float *p) {
    float *probs = c->a.router;
    uint32_t best = 0;
    float best_p = -1.0f;
    for (uint32_t e = 0; e < c->d.n_experts; e++)
        if (probs[e] > best_p) { best = e; best_p = probs[e]; }
    probs[best] = -2.0f; /* taken: below the -1 every pick starts from */
    *p = best_p;
    return best;
}

/* Keep the top_k experts and their weights, optionally renormalized. The router buffer is not read after this. */
static colibri_status route_topk(colibri_ctx *c, uint32_t layer) {
    const model_dims *d = &c->d;
    const arena_buffers *a = &c->a;
    colibri_status st = router_probs(c, layer);
    if (st) return st;
    float sum = 0.0f;
    for (uint32_t k = 0; k < d->top_k; k++) {
        a->topk_index[k] = pick_expert(c, &a->topk_weight[k]);
        sum += a->topk_weight[k];
    }
    if (d->flags & IMG_FLAG_NORM_TOPK)
        for (uint32_t k = 0; k < d->top_k; k++) a->topk_weight[k] /= sum;
    return COLIBRI_OK;
}

/* One-layer-ahead prefetch: the next layer's router applied to this layer's FFN input names the
 * experts to start fetching now. A wrong guess costs a fetch, never a result: the next layer routes
 * on its own input as always. */
static void prefetch_next(colibri_ctx *c, uint32_t next) {
    if (router_probs(c, next) != COLIBRI_OK) return; /* a non-finite guess: fetch nothing */
    for (uint32_t k = 0; k < c->d.top_k; k++) {
        float p;
        experts_fetch_ahead(c, next, pick_expert(c, &p));
    }
}

/* moe_out += scale * down(silu(gate xn) * up xn): one expert, the shared expert or a dense MLP.
 * `gate_index` is the table index of the gate matrix; up and down follow it. The three matrices are
 * read from `block` (see matrix_in). */
static void swiglu_ffn(colibri_ctx *c, uint32_t gate_index, float scale, const uint8_t *block,
                       uint64_t block_offset) {
    const arena_buffers *a = &c->a;
    rows_work gate_up = { .x = a->xn, .n = 2, .out = { a->ffn_gate, a->ffn_up },
                          .w = { matrix_in(c, gate_index, block, block_offset),
                                 matrix_in(c, gate_index + 1, block, block_offset) },
                          .epilogue = ROWS_SWIGLU };
    run_rows(c, &gate_up);
    rows_work down = { .x = a->ffn_gate, .n = 1, .out = { a->ffn_out },
                       .w = { matrix_in(c, gate_index + 2, block, block_offset) },
                       .epilogue = ROWS_ACCUMULATE, .scale = scale, .acc = a->moe_out };
    run_rows(c, &down);
}

/* The FFN half of a layer: routed experts (+ shared expert), or the dense MLP. Fills `t`. */
static colibri_status ffn_block(colibri_ctx *c, uint32_t layer, colibri_layer_trace *t) {
    const model_dims *d = &c->d;
    const arena_buffers *a = &c->a;
    uint64_t t0 = ctx_now(c), t1 = t0;
    if (present(c, layer_index(c, layer, ROLE_ROUTER))) {
        colibri_status st = route_topk(c, layer);
        if (st) return st;
        t1 = ctx_now(c);
        uint32_t slot[IMG_MAX_TOP_K]; /* each routed expert's cache slot */
        if (c->cache.n_slots) {
            st = experts_load(c, layer, slot);
            if (st) return st;
            const uint32_t next = layer + 1;
            if ((c->opts.expert_policy & COLIBRI_PREFETCH) && next < d->n_layers &&
                present(c, layer_index(c, next, ROLE_ROUTER)))
                prefetch_next(c, next);
        }
        for (uint32_t k = 0; k < d->top_k; k++) {
            uint64_t e0 = ctx_now(c);
            const uint32_t expert = a->topk_index[k];
            const uint8_t *block = c->image;
            uint64_t block_offset = 0;
            if (c->cache.n_slots) {
                st = expert_ready(c, slot[k], layer, expert, &block, &block_offset);
                if (st) return st;
            }
            swiglu_ffn(c, expert_tensor_index(d, layer, expert, ROLE_EXPERT_GATE), a->topk_weight[k], block,
                       block_offset);
            a->topk_cycles[k] = ctx_now(c) - e0;
            c->stats.expert_calls++;
        }
        if (d->flags & IMG_FLAG_SHARED_EXPERT) {
            weight gate = matrix(c, layer_index(c, layer, ROLE_SHARED_EXPERT_GATE));
            float g;
            matvec(c, &g, &gate, a->xn);
            swiglu_ffn(c, layer_index(c, layer, ROLE_SHARED_GATE), 1.0f / (1.0f + colibri_expf(-g)),
                       c->image, 0);
        }
        t->n_routed = d->top_k;
    } else {
        swiglu_ffn(c, layer_index(c, layer, ROLE_DENSE_GATE), 1.0f, c->image, 0);
        t->n_routed = 0;
    }
    uint64_t t2 = ctx_now(c);
    t->cycles_router = t1 - t0;
    t->cycles_ffn = t2 - t1;
    c->stats.cycles_router += t1 - t0;
    c->stats.cycles_experts += t2 - t1;
    return COLIBRI_OK;
}

colibri_status model_forward(colibri_ctx *c, uint32_t token, int want_logits) {
    const model_dims *d = &c->d;
    const arena_buffers *a = &c->a;
    weight embd = matrix(c, global_tensor_index(d, ROLE_TOKEN_EMBD));
    weight_row(a->x, &embd, token);

    for (uint32_t layer = 0; layer < d->n_layers; layer++) {
        colibri_layer_trace t = { .pos = c->pos, .layer = layer, .experts = a->topk_index,
                                  .weights = a->topk_weight, .cycles_expert = a->topk_cycles };
        uint64_t t0 = ctx_now(c);
        attention(c, layer);
        norm_input(c, layer_w(c, layer, ROLE_FFN_NORM));
        t.cycles_attention = ctx_now(c) - t0;
        c->stats.cycles_attention += t.cycles_attention;
        for (uint32_t i = 0; i < d->dim; i++) a->moe_out[i] = 0.0f;
        colibri_status st = ffn_block(c, layer, &t);
        if (st) return st;
        for (uint32_t i = 0; i < d->dim; i++) a->x[i] += a->moe_out[i];
        if (c->opts.trace) c->opts.trace(c->opts.user, &t);
    }
    if (want_logits) {
        uint64_t t4 = ctx_now(c);
        norm_input(c, tensor(c, global_tensor_index(d, ROLE_OUTPUT_NORM)));
        weight lm_head = matrix(c, global_tensor_index(d, ROLE_LM_HEAD));
        matvec(c, a->logits, &lm_head, a->xn);
        c->stats.cycles_lm_head += ctx_now(c) - t4;
        if (!all_finite(a->logits, d->vocab)) return COLIBRI_E_NONFINITE;
    }
    c->pos++;
    c->have_logits = want_logits;
    return COLIBRI_OK;
}
