/* The forward pass, following transformers' implementations of the supported families (docs/MODELS.md):
 *   x = embed[token]
 *   per layer:  h = rmsnorm(x)
 *               q, k, v = Wq h (+bq), Wk h (+bk), Wv h (+bv); optional q/k RMSNorm (per head or
 *               across the projection) and clipping; rotate-half RoPE on q and k
 *               x += Wo attention(q, K cache, V cache) (+bo), with optional per-head sinks; or DeepSeek's
 *               multi-head latent attention (attention_mla)
 *               h = rmsnorm(x)
 *               x += dense SwiGLU MLP(h), or in a MoE layer
 *                    sum over the top-k experts of w_k * expert_k(h) (+ sigmoid(g . h) * shared(h), or
 *                    + shared(h)); the routers of route_topk; gpt-oss's expert biases and clamped SwiGLU
 *               Gemma 4's layer normalizes attention's and the FFN's outputs, runs the dense GeGLU MLP beside its
 *               experts and scales x per layer (ffn_block); its global layers have their own widths and RoPE
 *   logits = lm_head(rmsnorm(x)), soft-capped in Gemma
 * Weights are read in place from the image, in their stored dtype (f32, f16, bf16, Q8_0, Q4_0), except
 * routed experts with an expert cache, which come through it (experts.c); the KV cache (f32 or f16)
 * and activations live in the arena.
 * One pass computes one token (decode), or a run of prompt tokens together (a prefill batch,
 * colibri_options.prefill_batch): every matrix row is then read once for all of them, and each token's
 * value of a row is the same dot product, in the same order, as if it came alone, so the bits are too. */
#include "internal.h"

/* Builds whose kernel sets have no tiles leave the tile path out (it would be dead code: the Cortex-M4
 * runtime must fit 16 KiB). */
#if defined(COLIBRI_X86_SIMD)
#define BUILD_HAS_TILES 1
#else
#define BUILD_HAS_TILES 0
#endif

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

/* Rows [r0, r0 + n) of w, as a matrix of their own (one head's part of a per-head projection). */
static weight weight_rows(const weight *w, uint32_t r0, uint32_t n) {
    static const uint8_t elem_bytes[DTYPE_COUNT] = { 4, 2, 2, 1, 0 }; /* Q4_0: half a byte, below */
    const size_t row_bytes = w->dtype == DTYPE_Q4_0 ? (size_t)w->blocks * (QBLOCK / 2)
                             : w->dtype == DTYPE_Q8_0 ? (size_t)w->blocks * QBLOCK : (size_t)w->cols * elem_bytes[w->dtype];
    weight part = *w;
    part.rows = n;
    part.data = (const uint8_t *)w->data + r0 * row_bytes;
    if (w->scales) part.scales = w->scales + (size_t)r0 * w->blocks;
    return part;
}


/* ---- the tokens of one pass ---- */

/* The pass's tokens' activations: the arena plan's single-token buffers, or the prefill batch region. */
static token_buffers tokens_in(colibri_ctx *c, uint32_t n) {
    if (n > 1) {
        token_buffers tb = c->batch;
        tb.n = n;
        return tb;
    }
    arena_buffers *a = &c->a;
    return (token_buffers){ .n = 1, .x = a->x, .xn = a->xn, .q = a->q, .q_a = a->q_a, .k = a->k_new, .v = a->v_new,
                            .q_att = a->q_att, .attn_out = a->attn_out, .o_in = a->o_in, .ple = a->ple, .moe_out = a->moe_out,
                            .gate = a->ffn_gate, .up = a->ffn_up,
                            .ffn_out = a->ffn_out, .gx = a->ffn_out, .expert_out = 0, .scalar = a->router, .topk_index = a->topk_index,
                            .topk_weight = a->topk_weight, .xq = a->xq, .xq_scale = a->xq_scale,
                            .xq_sum = a->xq_sum, .hq = a->hq, .hq_scale = a->hq_scale, .hq_sum = a->hq_sum };
}

/* ---- matrices times the tokens' vectors ---- */

/* A routed expert's extras in gpt-oss: biases after its gate, up and down matrices, and the clamped
 * activation when limit > 0. NULL for every other FFN. */
typedef struct {
    const float *bias[3];
    float alpha, limit;
} ffn_extras;

/* Up to three matrices that read the same tokens' vectors, each part computing a fixed share of every
 * matrix's rows for every token (the same code for a row whichever thread runs it: results do not depend
 * on the split). ROWS_SWIGLU: once a part has its rows of gate (out[0]) and up (out[1]), out[0][i] =
 * silu(out[0][i]) * out[1][i] for them, or with `extras` gpt-oss's form of it. */
enum rows_epilogue { ROWS_ONLY, ROWS_SWIGLU, ROWS_GEGLU }; /* GeGLU: gelu_tanh(gate) * up (Gemma 4) */
typedef struct {
    const kernel_set *k;
    uint32_t n_tok, n, parts;
    const float *x;          /* token t's input vector: x + t * x_stride */
    uint32_t x_stride;
    q8_vector xq;            /* and quantized (Q8_0/Q4_0 matrices): xq_blocks blocks per token */
    uint32_t xq_blocks;
    float *out[3];           /* token t's result of matrix j: out[j] + t * out_stride[j] */
    uint32_t out_stride[3];
    weight w[3];
    enum rows_epilogue epilogue;
    const ffn_extras *extras;
} rows_work;

/* Below this many weights a matrix is not worth waking other threads for (a router, a gate vector). */
#define PARALLEL_MIN_WEIGHTS 16384u

/* The first row of `part`: rows < 2^24 (IMG_MAX_DIM) and part <= COLIBRI_MAX_PARTS, so 32 bits hold the product. */
static uint32_t part_start(uint32_t rows, uint32_t part, uint32_t parts) {
    return rows * part / parts;
}

/* Rows r and r + 1 of w times two vectors with the kernel set's tile (docs/KERNELS.md); 0 if it has none
 * for w's dtype. out = { r.x0, r.x1, (r + 1).x0, (r + 1).x1 }. */
static int tile_rows(const kernel_set *k, const weight *w, uint32_t r, const float *x0, const float *x1,
                     const q8_vector *q0, const q8_vector *q1, float out[4]) {
    switch (w->dtype) {
    case DTYPE_Q8_0:
        if (!k->tile_q8_0) return 0;
        k->tile_q8_0((const int8_t *)w->data + (size_t)r * w->blocks * QBLOCK, w->scales + (size_t)r * w->blocks, q0, q1,
                     w->blocks, out);
        return 1;
    case DTYPE_Q4_0:
        if (!k->tile_q4_0) return 0;
        k->tile_q4_0((const uint8_t *)w->data + (size_t)r * w->blocks * (QBLOCK / 2), w->scales + (size_t)r * w->blocks,
                     q0, q1, w->blocks, out);
        return 1;
    case DTYPE_F32:
        if (!k->tile_f32) return 0;
        k->tile_f32((const float *)w->data + (size_t)r * w->cols, x0, x1, w->cols, out);
        return 1;
    case DTYPE_F16:
        if (!k->tile_f16) return 0;
        k->tile_f16((const uint16_t *)w->data + (size_t)r * w->cols, x0, x1, w->cols, out);
        return 1;
    default:
        if (!k->tile_bf16) return 0;
        k->tile_bf16((const uint16_t *)w->data + (size_t)r * w->cols, x0, x1, w->cols, out);
        return 1;
    }
}

static const float *token_x(const rows_work *m, uint32_t t) { return m->x + (size_t)t * m->x_stride; }
static q8_vector token_q(const rows_work *m, uint32_t t) {
    if (!m->xq.q) return (q8_vector){ 0, 0, 0 }; /* float matrices only: nothing was quantized */
    const size_t b = (size_t)t * m->xq_blocks;
    return (q8_vector){ m->xq.q + b * QBLOCK, m->xq.scale + b, m->xq.sum + b };
}

/* One token's rows [r0, r1) of w (x, or xq for the quantized dtypes), the dtype chosen once for all of
 * them: on a small model (rows of two or three blocks) choosing per row cost decode a sixth of a token's
 * instructions. */
static void token_rows(const kernel_set *k, const weight *w, const float *x, const q8_vector *xq, float *out,
                       uint32_t r0, uint32_t r1) {
    const uint32_t cols = w->cols;
    if (w->dtype == DTYPE_Q8_0) {
        k->rows_q8_0((const int8_t *)w->data + (size_t)r0 * w->blocks * QBLOCK, w->scales + (size_t)r0 * w->blocks, xq,
                     w->blocks, r1 - r0, out + r0);
    } else if (w->dtype == DTYPE_Q4_0) {
        k->rows_q4_0((const uint8_t *)w->data + (size_t)r0 * w->blocks * (QBLOCK / 2), w->scales + (size_t)r0 * w->blocks,
                     xq, w->blocks, r1 - r0, out + r0);
    } else if (w->dtype == DTYPE_F32) {
        for (uint32_t r = r0; r < r1; r++) out[r] = k->dot_f32((const float *)w->data + (size_t)r * cols, x, cols);
    } else {
        float (*dot16)(const uint16_t *, const float *, uint32_t) = w->dtype == DTYPE_F16 ? k->dot_f16 : k->dot_bf16;
        for (uint32_t r = r0; r < r1; r++) out[r] = dot16((const uint16_t *)w->data + (size_t)r * cols, x, cols);
    }
}

/* Matrix j's rows [r0, r1) for every token: each row is read from memory once for all of them, in
 * tiles of two rows and two tokens where the kernel set has them. */
static void matrix_rows(const rows_work *m, uint32_t j, uint32_t r0, uint32_t r1) {
    const weight *w = &m->w[j];
    float *out = m->out[j];
    const size_t os = m->out_stride[j];
    if (m->n_tok == 1) {
        const q8_vector q = token_q(m, 0);
        token_rows(m->k, w, m->x, &q, out, r0, r1);
        return;
    }
    uint32_t r = r0;
    for (; r + 2 <= r1; r += 2) {
        uint32_t t = 0;
        for (; t + 2 <= m->n_tok; t += 2) {
            const q8_vector q0 = token_q(m, t), q1 = token_q(m, t + 1);
            float o[4];
            if (!BUILD_HAS_TILES || !tile_rows(m->k, w, r, token_x(m, t), token_x(m, t + 1), &q0, &q1, o)) break;
            out[t * os + r] = o[0];
            out[(t + 1) * os + r] = o[1];
            out[t * os + r + 1] = o[2];
            out[(t + 1) * os + r + 1] = o[3];
        }
        for (; t < m->n_tok; t++) { /* no tile for this dtype, or the odd token */
            const q8_vector q = token_q(m, t);
            token_rows(m->k, w, token_x(m, t), &q, out + t * os, r, r + 2);
        }
    }
    for (uint32_t t = 0; r < r1 && t < m->n_tok; t++) { /* the odd row */
        const q8_vector q = token_q(m, t);
        token_rows(m->k, w, token_x(m, t), &q, out + t * os, r, r1);
    }
}

/* gpt-oss's expert activation of element i (transformers' GptOssExperts._apply_gate): the biases added, then
 * with a limit the gate clamped above and up to +-limit, (up + 1) * gate * sigmoid(alpha * gate). */
static float clamped_glu(const ffn_extras *e, float g, float u, uint32_t i) {
    if (e->bias[0]) {
        g += e->bias[0][i];
        u += e->bias[1][i];
    }
    if (!(e->limit > 0.0f)) return g / (1.0f + colibri_expf(-g)) * u;
    g = g > e->limit ? e->limit : g;
    u = u > e->limit ? e->limit : (u < -e->limit ? -e->limit : u);
    return (u + 1.0f) * (g / (1.0f + colibri_expf(-(e->alpha * g))));
}

static void rows_part(void *arg, uint32_t part) {
    const rows_work *m = arg;
    for (uint32_t j = 0; j < m->n; j++)
        matrix_rows(m, j, part_start(m->w[j].rows, part, m->parts), part_start(m->w[j].rows, part + 1, m->parts));
    if (m->epilogue != ROWS_ONLY) {
        const uint32_t r0 = part_start(m->w[0].rows, part, m->parts), r1 = part_start(m->w[0].rows, part + 1, m->parts);
        for (uint32_t t = 0; t < m->n_tok; t++) {
            float *g = m->out[0] + (size_t)t * m->out_stride[0];
            const float *u = m->out[1] + (size_t)t * m->out_stride[1];
            if (!COLIBRI_LEAN && m->extras) {
                const ffn_extras *e = m->extras;
                for (uint32_t i = r0; i < r1; i++) g[i] = clamped_glu(e, g[i], u[i], i);
            } else if (!COLIBRI_LEAN && m->epilogue == ROWS_GEGLU) {
                for (uint32_t i = r0; i < r1; i++) g[i] = gelu_tanh(g[i]) * u[i];
            } else {
                m->k->swiglu(g + r0, u + r0, r1 - r0);
            }
        }
    }
}

/* Run m: the inputs quantized first if a matrix wants it (the normed xn once per norm, since many
 * matrices read it), then every part, on the board's threads if it lends some. */
static void run_rows(colibri_ctx *c, const token_buffers *tb, rows_work *m) {
    uint64_t weights = 0;
    int quantized = 0;
    for (uint32_t j = 0; j < m->n; j++) {
        weights += (uint64_t)m->w[j].rows * m->w[j].cols;
        quantized |= m->w[j].dtype == DTYPE_Q8_0 || m->w[j].dtype == DTYPE_Q4_0;
    }
    m->k = c->kernels;
    if (quantized) {
        const int is_xn = m->x == tb->xn && m->n_tok == tb->n; /* all the tokens' xn: quantized once per norm */
        const uint32_t blocks = c->d.in_blocks;
        int8_t *q = is_xn ? tb->xq : tb->hq;
        float *scale = is_xn ? tb->xq_scale : tb->hq_scale;
        int32_t *sum = is_xn ? tb->xq_sum : tb->hq_sum;
        if (!is_xn || !c->xn_quantized)
            for (uint32_t t = 0; t < m->n_tok; t++)
                c->kernels->quantize_q8_0(q + (size_t)t * blocks * QBLOCK, scale + (size_t)t * blocks,
                                          sum + (size_t)t * blocks, m->x + (size_t)t * m->x_stride, m->w[0].cols);
        c->xn_quantized |= is_xn;
        m->xq = (q8_vector){ q, scale, sum };
        m->xq_blocks = blocks;
    }
    m->parts = c->opts.parallel_parts > 1 && weights >= PARALLEL_MIN_WEIGHTS ? c->opts.parallel_parts : 1;
    if (m->parts == 1) rows_part(m, 0);
    else c->opts.parallel_for(c->opts.user, rows_part, m, m->parts);
}

/* out = w x for n_tok vectors x (strides: w's columns in, its rows out) */
static void matmul(colibri_ctx *c, const token_buffers *tb, float *out, const weight *w, const float *x,
                   uint32_t n_tok) {
    rows_work m = { .n_tok = n_tok, .n = 1, .x = x, .x_stride = w->cols, .out = { out }, .out_stride = { w->rows },
                    .w = { *w } };
    run_rows(c, tb, &m);
}

/* out += b for each of n vectors of len, when the image has that bias */
static void add_bias(const colibri_ctx *c, float *out, uint32_t len, uint32_t n, uint32_t layer, uint32_t b_role) {
    if (!present(c, layer_index(c, layer, b_role))) return;
    const float *b = layer_w(c, layer, b_role);
    for (uint32_t t = 0; t < n; t++)
        for (uint32_t i = 0; i < len; i++) out[(size_t)t * len + i] += b[i];
}

/* Each token's x normed into its xn, the input of the matrices that follow. */
static void norm_inputs(colibri_ctx *c, const token_buffers *tb, const float *weights) {
    for (uint32_t t = 0; t < tb->n; t++)
        rmsnorm(tb->xn + (size_t)t * c->d.dim, tb->x + (size_t)t * c->d.dim, weights, c->d.dim, c->d.eps);
    c->xn_quantized = 0;
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

/* RMSNorm on each of n_heads heads of hd, with shared weights (w NULL: none, Gemma 4's v norm whatever the q/k one). */
static void head_norm(const colibri_ctx *c, float *v, uint32_t n_heads, uint32_t hd, const float *w) {
    for (uint32_t h = 0; h < n_heads; h++) rmsnorm(v + (size_t)h * hd, v + (size_t)h * hd, w, hd, c->d.eps);
}

/* q/k RMSNorm: across the whole projection, or on each head. */
static void qk_norm(const colibri_ctx *c, float *v, uint32_t n_heads, uint32_t hd, const float *w) {
    if (c->d.flags & IMG_FLAG_QK_NORM_FULL) rmsnorm(v, v, w, n_heads * hd, c->d.eps);
    else head_norm(c, v, n_heads, hd, w);
}

static void clip(float *v, uint32_t n, float limit) {
    for (uint32_t i = 0; i < n; i++) v[i] = v[i] > limit ? limit : (v[i] < -limit ? -limit : v[i]);
}

/* ---- a prefill batch and the window rings ----
 * A pass of n tokens at positions pos .. pos + n - 1 stores token t's K/V row into a windowed layer's ring (W
 * rows, position p in row p % W) just before t attends, so inside the layer no token meets a row a later one
 * wrote. Two readers come after the whole pass has written its rows, and would meet them: the replay of a
 * failed pass (one token at a time, colibri_feed), which must find the rings as they were before it, and a
 * Gemma 4 layer sharing an earlier layer's ring, whose token t must find it as it was after token t. So a
 * pass first saves the m = min(n, W) ring rows it will overwrite (row (pos + j) % W as saved row j) of every
 * windowed layer that owns its cache, into the prefill batch region (batch_plan); a failed pass puts them
 * back (model_forward), and a sharing layer exchanges them with the pass's rows (attention_mha). */

/* Ring rows (pos + j) % W of `layer` (its cache from element layer_base on), K then V, for j in [j0, j1),
 * against its saved rows j: copied there, or with `swap` exchanged (what restores them too: the saved copy is
 * not read again). Bytes: the rows are in the cache's dtype and no row is 4-byte aligned for certain. */
static void ring_rows(const colibri_ctx *c, uint32_t layer, size_t layer_base, uint8_t *saved, uint32_t j0, uint32_t j1,
                      int swap) {
    const size_t elem = c->d.kv_dtype == KV_F16 ? 2 : 4, row_bytes = (size_t)layer_kv_dim(&c->d, layer) * elem;
    uint8_t *const cache[2] = { c->a.k_cache, c->a.v_cache }; /* MLA: no V cache */
    for (uint32_t k = 0; k < 2 && cache[k]; k++, saved += c->rings.rows * row_bytes)
        for (uint32_t j = j0; j < j1; j++) {
            uint8_t *r = cache[k] + layer_base * elem + (size_t)((c->pos + j) % c->d.window) * row_bytes;
            for (size_t i = 0; i < row_bytes; i++) {
                const uint8_t kept = saved[j * row_bytes + i];
                saved[j * row_bytes + i] = r[i];
                if (swap) r[i] = kept;
            }
        }
}

/* Every cache-owning windowed layer's ring rows this pass overwrites: saved before it, or (swap) put back after
 * it failed. */
static void rings_save(const colibri_ctx *c, uint32_t n, int swap) {
    const model_dims *d = &c->d;
    const uint32_t m = n < d->window ? n : d->window;
    uint8_t *saved = c->rings.saved;
    size_t layer_base = 0;
    for (uint32_t l = 0; l < d->n_layers; l++) {
        if (layer_windowed(d, l)) {
            ring_rows(c, l, layer_base, saved, 0, m, swap);
            saved += (c->a.v_cache ? 2u : 1u) * c->rings.rows * (size_t)layer_kv_dim(d, l) * (d->kv_dtype == KV_F16 ? 2 : 4);
        }
        layer_base += (size_t)kv_rows(d, l) * layer_kv_dim(d, l);
    }
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
    const int mla = !COLIBRI_LEAN && d->kv_lora;
    const uint32_t kd = mla ? d->att_dim : layer_head_dim(d, cache), vd = mla ? d->val_dim : kd;
    const uint32_t group = d->n_heads / layer_kv_heads(d, cache), rows = kv_rows(d, cache), row_dim = layer_kv_dim(d, cache);
    const uint32_t first = hw->pos >= rows ? hw->pos - rows + 1 : 0, seen = hw->pos - first + 1, first_row = first % rows;
    const void *values = mla ? a->k_cache : a->v_cache;
    const float *sinks = !COLIBRI_LEAN && (d->flags & IMG_FLAG_ATTN_SINKS) ? layer_w(c, hw->layer, ROLE_SINKS) : 0;
    const uint32_t h_end = part_start(d->n_heads, part + 1, hw->parts);
    for (uint32_t h = part_start(d->n_heads, part, hw->parts); h < h_end; h++) {
        const float *q = hw->q_all + (size_t)h * kd;
        const size_t kv_off = hw->layer_base + (size_t)(h / group) * kd;
        float *att = a->att + (size_t)h * d->max_seq;
        for (uint32_t t = 0, r = first_row; t < seen; t++, r = r + 1 == rows ? 0 : r + 1)
            att[t] = kv_dot(c, a->k_cache, kv_off + (size_t)r * row_dim, q, kd) * d->attn_scale;
        softmax(att, seen, sinks ? sinks + h : 0);
        float *out = hw->out_all + (size_t)h * vd;
        for (uint32_t i = 0; i < vd; i++) out[i] = 0.0f;
        for (uint32_t t = 0, r = first_row; t < seen; t++, r = r + 1 == rows ? 0 : r + 1)
            kv_accumulate(c, out, att[t], values, kv_off + (size_t)r * row_dim, vd);
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
    const uint32_t parts = COLIBRI_LEAN ? 1 : c->opts.parallel_parts;
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

/* Position pos's cos and sin rows of the RoPE tables `layer` rotates with (Gemma 4's global layers: their own). */
static void rope_rows(const colibri_ctx *c, uint32_t layer, uint32_t pos, const float **cos, const float **sin) {
    const model_dims *d = &c->d;
    const int global = !COLIBRI_LEAN && (d->flags & IMG_FLAG_GLOBAL_ROPE) && !layer_windowed(d, layer);
    const size_t at = (size_t)pos * ((global ? d->global_head_dim : d->rope_dim) / 2);
    *cos = tensor(c, global_tensor_index(d, global ? ROLE_GLOBAL_ROPE_COS : ROLE_ROPE_COS)) + at;
    *sin = tensor(c, global_tensor_index(d, global ? ROLE_GLOBAL_ROPE_SIN : ROLE_ROPE_SIN)) + at;
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
    const uint32_t n = tb->n, hd = layer_head_dim(d, layer), kv_heads = layer_kv_heads(d, layer);
    const uint32_t q_dim = d->n_heads * hd, kv_dim = kv_heads * hd, pairs = !COLIBRI_LEAN && (d->flags & IMG_FLAG_ROPE_PAIRS);
    /* Gemma 4: a layer sharing an earlier one's KV cache computes only q; attention_k_eq_v: v is k's projection */
    const uint32_t cache = kv_source(d, layer), shared = cache != layer;
    const int k_is_v = !COLIBRI_LEAN && !shared && !present(c, layer_index(c, layer, ROLE_WV));
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
    const int qk_norms = (d->flags & (IMG_FLAG_QK_NORM_HEAD | IMG_FLAG_QK_NORM_FULL)) != 0;
    const int exchange = !COLIBRI_LEAN && shared && n > 1 && layer_windowed(d, cache); /* saved rows: the ring before */
    if (exchange) ring_rows(c, cache, layer_base, c->rings.shared, 0, n, 1);
    for (uint32_t t = 0; t < n; t++) {
        const uint32_t pos = c->pos + t;
        float *q = tb->q + (size_t)t * q_dim, *k = tb->k + (size_t)t * kv_dim, *v = tb->v + (size_t)t * kv_dim;
        const float *cos, *sin;
        rope_rows(c, layer, pos, &cos, &sin);
        if (qk_norms) qk_norm(c, q, d->n_heads, hd, layer_w(c, layer, ROLE_Q_NORM));
        if (d->clip_qkv > 0.0f) clip(q, q_dim, d->clip_qkv);
        rope(q, d->n_heads, hd, hd, pairs, cos, sin);
        if (!shared) { /* this position's k and v into the layer's cache */
            if (qk_norms) qk_norm(c, k, kv_heads, hd, layer_w(c, layer, ROLE_K_NORM));
            if (!COLIBRI_LEAN && (d->flags & IMG_FLAG_V_NORM)) head_norm(c, v, kv_heads, hd, 0);
            if (d->clip_qkv > 0.0f) {
                clip(k, kv_dim, d->clip_qkv);
                clip(v, kv_dim, d->clip_qkv);
            }
            rope(k, kv_heads, hd, hd, pairs, cos, sin);
            const size_t row = layer_base + (size_t)(pos % kv_rows(d, layer)) * kv_dim;
            kv_store(c, c->a.k_cache, row, k, kv_dim);
            kv_store(c, c->a.v_cache, row, v, kv_dim);
        }
        if (exchange) ring_rows(c, cache, layer_base, c->rings.shared, t, t + 1, 1); /* t's row back */
        attend_heads(c, layer, cache, layer_base, pos, q, tb->attn_out + (size_t)t * q_dim);
    }
    return tb->attn_out;
}

/* A per-head projection for every token: out[h] = w[h] x[h], where head h owns w's rows h * rows ..
 * and reads w.cols values at x + h * x_head, writing at out + h * out_head (strides: one token's). */
static void per_head(colibri_ctx *c, const token_buffers *tb, const weight *w, uint32_t rows, const float *x,
                     uint32_t x_head, uint32_t x_stride, float *out, uint32_t out_head, uint32_t out_stride) {
    for (uint32_t h = 0; h < c->d.n_heads; h++) {
        rows_work m = { .n_tok = tb->n, .n = 1, .x = x + (size_t)h * x_head, .x_stride = x_stride,
                        .out = { out + (size_t)h * out_head }, .out_stride = { out_stride },
                        .w = { weight_rows(w, h * rows, rows) } };
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
    const uint32_t lat = d->kv_lora, kd = d->att_dim, pairs = (d->flags & IMG_FLAG_ROPE_PAIRS) != 0;
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

/* Each token's v (dim wide, in place) normed by layer's `role` weights: Gemma 4's norms after a part. */
static void post_norm(const colibri_ctx *c, const token_buffers *tb, float *v, uint32_t layer, uint32_t role) {
    for (uint32_t t = 0; t < tb->n; t++)
        rmsnorm(v + (size_t)t * c->d.dim, v + (size_t)t * c->d.dim, layer_w(c, layer, role), c->d.dim, c->d.eps);
}

static int gemma4_layer(const model_dims *d) { return !COLIBRI_LEAN && (d->flags & IMG_FLAG_GEMMA4_LAYER); }

/* The attention half of a layer for every token: x += Wo attention(rmsnorm(x)) (+ bo), normed first in
 * Gemma 4. Token t sits at position c->pos + t and sees the positions before it, its batch-mates included.
 * kv_base: where the rows of the cache it attends over (kv_source's) start in the KV cache. */
static void attention(colibri_ctx *c, const token_buffers *tb, uint32_t layer, size_t kv_base) {
    const model_dims *d = &c->d;
    const uint32_t n = tb->n;
    norm_inputs(c, tb, layer_w(c, layer, ROLE_ATTN_NORM));
    const float *o_in = !COLIBRI_LEAN && d->kv_lora ? attention_mla(c, tb, layer, kv_base) : attention_mha(c, tb, layer, kv_base);
    weight wo = matrix(c, layer_index(c, layer, ROLE_WO));
    matmul(c, tb, tb->moe_out, &wo, o_in, n);
    add_bias(c, tb->moe_out, d->dim, n, layer, ROLE_BO);
    if (gemma4_layer(d)) post_norm(c, tb, tb->moe_out, layer, ROLE_POST_ATTN_NORM);
    for (size_t i = 0; i < (size_t)n * d->dim; i++) tb->x[i] += tb->moe_out[i];
}

/* Whether all n values are finite (x - x is 0 for finite x, NaN for inf and NaN). */
static int all_finite(const float *v, uint32_t n) {
    for (uint32_t i = 0; i < n; i++)
        if (v[i] - v[i] != 0.0f) return 0;
    return 1;
}

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
static float *choice_scores(const colibri_ctx *c) { return c->a.router + (COLIBRI_LEAN ? 0 : c->d.n_experts); }

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
    const float *bias = !COLIBRI_LEAN && (d->flags & IMG_FLAG_ROUTER_BIAS) ? layer_w(c, layer, ROLE_ROUTER_BIAS) : 0;
    if (!COLIBRI_LEAN && (d->flags & IMG_FLAG_ROUTER_TOPK_SOFTMAX)) { /* the logits (plus the Linear's bias) */
        for (uint32_t e = 0; bias && e < E; e++) score[e] += bias[e];
        bias = 0;
    } else if (!COLIBRI_LEAN && (d->flags & IMG_FLAG_ROUTER_SIGMOID)) {
        for (uint32_t e = 0; e < E; e++) score[e] = 1.0f / (1.0f + colibri_expf(-score[e]));
    } else {
        softmax(score, E, 0);
    }
    if (!COLIBRI_LEAN)
        for (uint32_t e = 0; e < E; e++) choice[e] = bias ? score[e] + bias[e] : score[e];
    if (!all_finite(choice, E)) return COLIBRI_E_NONFINITE; /* a NaN never wins a '>': expert 0 would be taken */
    if (COLIBRI_LEAN || d->n_group == 1) return COLIBRI_OK;
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
 * optionally renormalized (the 1e-20 is DeepSeek-V3's; below a sum's rounding for softmax scores), times
 * routed_scale. */
static colibri_status route_topk(colibri_ctx *c, const token_buffers *tb, uint32_t layer) {
    const model_dims *d = &c->d;
    for (uint32_t t = 0; t < tb->n; t++) {
        colibri_status st = router_choice(c, tb, layer, tb->xn + (size_t)t * d->dim);
        if (st) return st;
        uint32_t *index = tb->topk_index + (size_t)t * d->top_k;
        float *gate_weight = tb->topk_weight + (size_t)t * d->top_k, sum = 0.0f;
        for (uint32_t k = 0; k < d->top_k; k++) {
            index[k] = pick_expert(c, &gate_weight[k]);
            sum += gate_weight[k];
        }
        if (!COLIBRI_LEAN && (d->flags & IMG_FLAG_ROUTER_TOPK_SOFTMAX)) softmax(gate_weight, d->top_k, 0); /* gpt-oss */
        const float norm = sum + 1e-20f;
        const float *expert_scale = gemma4_layer(d) ? layer_w(c, layer, ROLE_EXPERT_SCALE) : 0;
        for (uint32_t k = 0; k < d->top_k; k++) {
            if (d->flags & IMG_FLAG_NORM_TOPK) gate_weight[k] /= norm;
            if (!COLIBRI_LEAN) gate_weight[k] *= d->routed_scale; /* 1 in the lean build */
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

/* ffn_out = down(silu(gate x) * up x) for n vectors x (stride dim): one expert, the shared expert or a
 * dense MLP. `gate_index` is the table index of the gate matrix; up and down follow it. The three
 * matrices are read from `block` (see matrix_in). A routed expert's `extras` (gpt-oss; else NULL) add its
 * biases and its activation. */
static void swiglu_ffn(colibri_ctx *c, const token_buffers *tb, uint32_t gate_index, const uint8_t *block,
                       uint64_t block_offset, const float *x, uint32_t n, const ffn_extras *extras) {
    const uint32_t dim = c->d.dim, ffn = c->d.ffn_max;
    rows_work gate_up = { .n_tok = n, .n = 2, .x = x, .x_stride = dim, .out = { tb->gate, tb->up },
                          .out_stride = { ffn, ffn },
                          .w = { matrix_in(c, gate_index, block, block_offset),
                                 matrix_in(c, gate_index + 1, block, block_offset) },
                          .epilogue = !COLIBRI_LEAN && (c->d.flags & IMG_FLAG_GELU_TANH) ? ROWS_GEGLU : ROWS_SWIGLU, .extras = extras };
    run_rows(c, tb, &gate_up);
    rows_work down = { .n_tok = n, .n = 1, .x = tb->gate, .x_stride = ffn, .out = { tb->ffn_out }, .out_stride = { dim },
                       .w = { matrix_in(c, gate_index + 2, block, block_offset) } };
    run_rows(c, tb, &down);
    if (!COLIBRI_LEAN && extras && extras->bias[2])
        for (uint32_t t = 0; t < n; t++)
            for (uint32_t i = 0; i < dim; i++) tb->ffn_out[(size_t)t * dim + i] += extras->bias[2][i];
}

static const float one = 1.0f; /* the weight of an FFN that is not gated: the dense MLP, a plain shared expert */

/* acc += s * v: how an FFN's output joins moe_out, the same expression for every kind and order */
static void add_scaled(float *acc, float s, const float *v, uint32_t n) {
    for (uint32_t i = 0; i < n; i++) acc[i] += s * v[i];
}

/* moe_out[t] += w[t * stride] * ffn_out[t] for every token (the shared expert, the dense MLP) */
static void accumulate(const colibri_ctx *c, const token_buffers *tb, const float *w, uint32_t stride) {
    const uint32_t dim = c->d.dim;
    for (uint32_t t = 0; t < tb->n; t++)
        add_scaled(tb->moe_out + (size_t)t * dim, w[(size_t)t * stride], tb->ffn_out + (size_t)t * dim, dim);
}

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
            if (!COLIBRI_LEAN && (d->flags & IMG_FLAG_EXPERT_BIAS)) {
                extras.bias[0] = layer_w(c, layer, ROLE_EXPERT_GATE_BIAS) + (size_t)expert * d->ffn;
                extras.bias[1] = layer_w(c, layer, ROLE_EXPERT_UP_BIAS) + (size_t)expert * d->ffn;
                extras.bias[2] = layer_w(c, layer, ROLE_EXPERT_DOWN_BIAS) + (size_t)expert * d->dim;
            }
            const int plain = COLIBRI_LEAN || (!extras.bias[0] && !(extras.limit > 0.0f));
            swiglu_ffn(c, tb, expert_tensor_index(d, layer, expert, ROLE_EXPERT_GATE), block, block_offset, x, members,
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

/* The FFN half of a layer into moe_out: routed experts (+ shared expert), or the dense MLP, each reading x
 * normed by FFN_NORM. Gemma 4's layer has the dense MLP in every layer and in a MoE layer the experts beside
 * it, routed on x normed by ROUTER_NORM and reading x normed by MOE_NORM; each part is normed after, and their
 * sum too. Fills `t` (one token: per-expert cycles). */
static colibri_status ffn_block(colibri_ctx *c, const token_buffers *tb, uint32_t layer, colibri_layer_trace *t) {
    const model_dims *d = &c->d;
    const uint32_t n = tb->n;
    const int gemma = gemma4_layer(d), routed = present(c, layer_index(c, layer, ROLE_ROUTER));
    uint64_t t0 = ctx_now(c), t1 = t0;
    for (size_t i = 0; i < (size_t)n * d->dim; i++) tb->moe_out[i] = 0.0f;
    norm_inputs(c, tb, layer_w(c, layer, gemma && routed ? ROLE_ROUTER_NORM : ROLE_FFN_NORM));
    if (routed) {
        colibri_status st = route_topk(c, tb, layer);
        if (st) return st;
        if (gemma) norm_inputs(c, tb, layer_w(c, layer, ROLE_MOE_NORM));
        t1 = ctx_now(c);
        uint32_t slot[IMG_MAX_TOP_K]; /* one token's routed experts' cache slots (a cache means one token a pass) */
        if (c->cache.n_slots) {
            st = experts_load(c, layer, slot);
            if (st) return st;
            const uint32_t next = layer + 1;
            if ((c->opts.expert_policy & COLIBRI_PREFETCH) && next < d->n_layers &&
                present(c, layer_index(c, next, ROLE_ROUTER)))
                prefetch_next(c, tb, next);
        }
        st = routed_experts(c, tb, layer, slot);
        if (st) return st;
        if (d->flags & (IMG_FLAG_SHARED_EXPERT | IMG_FLAG_SHARED_PLAIN)) {
            const float *scale = &one; /* ungated: each token's weight 1 (stride 0) */
            if (d->flags & IMG_FLAG_SHARED_EXPERT) { /* gated by sigmoid(g . x) */
                weight gate = matrix(c, layer_index(c, layer, ROLE_SHARED_EXPERT_GATE));
                matmul(c, tb, tb->scalar, &gate, tb->xn, n);
                for (uint32_t g = 0; g < n; g++) tb->scalar[g] = 1.0f / (1.0f + colibri_expf(-tb->scalar[g]));
                scale = tb->scalar;
            }
            swiglu_ffn(c, tb, layer_index(c, layer, ROLE_SHARED_GATE), c->image, 0, tb->xn, n, 0);
            accumulate(c, tb, scale, scale == &one ? 0 : 1);
        }
        if (gemma) post_norm(c, tb, tb->moe_out, layer, ROLE_MOE_POST_NORM);
    }
    t->n_routed = routed ? d->top_k : 0;
    if (!routed || gemma) {
        if (gemma) norm_inputs(c, tb, layer_w(c, layer, ROLE_FFN_NORM)); /* xn holds the experts' norm */
        swiglu_ffn(c, tb, layer_index(c, layer, ROLE_DENSE_GATE), c->image, 0, tb->xn, n, 0);
        if (gemma && routed) post_norm(c, tb, tb->ffn_out, layer, ROLE_DENSE_POST_NORM);
        accumulate(c, tb, &one, 0);
    }
    if (gemma) post_norm(c, tb, tb->moe_out, layer, ROLE_POST_FFN_NORM);
    uint64_t t2 = ctx_now(c);
    t->cycles_router = t1 - t0;
    t->cycles_ffn = t2 - t1;
    c->stats.cycles_router += t1 - t0;
    c->stats.cycles_experts += t2 - t1;
    return COLIBRI_OK;
}

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

/* CRC-32 of token t's residual stream, for the trace. */
static uint32_t residual_crc(const colibri_ctx *c, const token_buffers *tb, uint32_t t) {
    return crc32_update(0, tb->x + (size_t)t * c->d.dim, (size_t)c->d.dim * sizeof(float), c->crc_clmul);
}

/* The trace hook for every token of the pass after `layer`. A batch's layer cycles are its tokens'
 * together: the last token carries them, the others 0 (and no per-expert cycles); so does the CRC after the
 * attention half, taken of the last token only (the others' rows have moved on by now). */
static void trace_layer(colibri_ctx *c, const token_buffers *tb, const colibri_layer_trace *layer) {
    if (!c->opts.trace) return;
    const uint32_t n = tb->n;
    if (n > 1)
        for (uint32_t k = 0; k < c->d.top_k; k++) c->a.topk_cycles[k] = 0; /* no per-expert cycles in a batch */
    for (uint32_t i = 0; i < n; i++) {
        colibri_layer_trace t = *layer;
        t.pos = c->pos + i;
        t.experts = tb->topk_index + (size_t)i * c->d.top_k;
        t.weights = tb->topk_weight + (size_t)i * c->d.top_k;
        if (!COLIBRI_LEAN) t.crc_output = residual_crc(c, tb, i);
        if (i + 1 < n) t.cycles_attention = t.cycles_router = t.cycles_ffn = t.crc_attention = 0;
        c->opts.trace(c->opts.user, &t);
    }
}

/* A pass that fails feeds none of its n tokens: nor do their rows stay in the window rings. */
static colibri_status pass_failed(const colibri_ctx *c, uint32_t n, colibri_status st) {
    if (!COLIBRI_LEAN && n > 1 && c->rings.rows) rings_save(c, n, 1);
    return st;
}

colibri_status model_forward(colibri_ctx *c, const uint32_t *tokens, uint32_t n, int want_logits) {
    const model_dims *d = &c->d;
    const token_buffers tb = tokens_in(c, n);
    if (!COLIBRI_LEAN && n > 1 && c->rings.rows) rings_save(c, n, 0); /* over window rings: what the pass overwrites */
    weight embd = matrix(c, global_tensor_index(d, ROLE_TOKEN_EMBD));
    for (uint32_t t = 0; t < n; t++) weight_row(tb.x + (size_t)t * d->dim, &embd, tokens[t]);
    if (!COLIBRI_LEAN && d->embed_scale != 0.0f)
        for (size_t i = 0; i < (size_t)n * d->dim; i++) tb.x[i] *= d->embed_scale;
    if (!COLIBRI_LEAN && d->ple_dim) per_layer_inputs(c, &tb, tokens);

    /* Each layer's KV rows follow every earlier layer's (arena_plan's order), so their starts are a running sum. A
     * sharing layer reads its kv_source's rows: the last layer of its kind with rows of its own, seen before it. */
    size_t kv_end = 0, kind_base[2] = { 0, 0 }; /* [windowed] */
    for (uint32_t layer = 0; layer < d->n_layers; layer++) {
        colibri_layer_trace t = { .layer = layer, .cycles_expert = c->a.topk_cycles };
        const int windowed = layer_windowed(d, layer);
        if (!layer_kv_shared(d, layer)) kind_base[windowed] = kv_end;
        kv_end += (size_t)kv_rows(d, layer) * layer_kv_dim(d, layer);
        uint64_t t0 = ctx_now(c);
        attention(c, &tb, layer, kind_base[windowed]);
        t.cycles_attention = ctx_now(c) - t0;
        if (!COLIBRI_LEAN && c->opts.trace) t.crc_attention = residual_crc(c, &tb, n - 1);
        c->stats.cycles_attention += t.cycles_attention;
        colibri_status st = ffn_block(c, &tb, layer, &t);
        if (st) return pass_failed(c, n, st);
        for (size_t i = 0; i < (size_t)n * d->dim; i++) tb.x[i] += tb.moe_out[i];
        if (gemma4_layer(d)) { /* Gemma 4's per-layer input, and its scalar per layer */
            if (d->ple_dim) per_layer_input(c, &tb, layer);
            const float scale = layer_w(c, layer, ROLE_LAYER_SCALE)[0];
            for (size_t i = 0; i < (size_t)n * d->dim; i++) tb.x[i] *= scale;
        }
        trace_layer(c, &tb, &t);
    }
    if (want_logits) { /* the last token's only: a prefill wants no other */
        uint64_t t4 = ctx_now(c);
        float *xn = tb.xn + (size_t)(n - 1) * d->dim;
        rmsnorm(xn, tb.x + (size_t)(n - 1) * d->dim, tensor(c, global_tensor_index(d, ROLE_OUTPUT_NORM)), d->dim, d->eps);
        c->xn_quantized = 0;
        weight lm_head = matrix(c, global_tensor_index(d, ROLE_LM_HEAD));
        matmul(c, &tb, c->a.logits, &lm_head, xn, 1);
        c->stats.cycles_lm_head += ctx_now(c) - t4;
        if (!all_finite(c->a.logits, d->vocab)) return pass_failed(c, n, COLIBRI_E_NONFINITE);
        if (!COLIBRI_LEAN && d->logit_softcap != 0.0f) /* Gemma's final soft-capping: cap * tanh(logits / cap) */
            for (uint32_t i = 0; i < d->vocab; i++) c->a.logits[i] = d->logit_softcap * tanh_f(c->a.logits[i] / d->logit_softcap);
    }
    c->pos += n;
    c->have_logits = want_logits;
    return COLIBRI_OK;
}
