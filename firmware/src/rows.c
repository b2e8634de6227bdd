/* The matrix driver: up to three matrices times the tokens' vectors, a fixed share of every matrix's rows
 * per part, the parts on the board's threads if it lends some (rows.h's rows_work). */
#include "rows.h"

/* Builds whose kernel sets have no tiles leave the tile path out (it would be dead code: the Cortex-M4
 * runtime must fit 16 KiB). */
#if defined(COLIBRI_X86_SIMD)
#define BUILD_HAS_TILES 1
#else
#define BUILD_HAS_TILES 0
#endif

/* Rows r and r + 1 of w times two vectors with the kernel set's tile (docs/KERNELS.md); 0 if it has none for w's
 * dtype. x: the vectors (the float dtypes), q: quantized (the others); out = { r.x0, r.x1, (r + 1).x0, (r + 1).x1 }. */
#if BUILD_HAS_TILES
static int tile_rows(const kernel_set *k, const weight *w, uint32_t r, const float *const *x, const q8_vector *q,
                     float out[4]) {
    switch (w->dtype) {
    case DTYPE_Q8_0:
        if (!k->tile_q8_0) return 0;
        k->tile_q8_0((const int8_t *)w->data + (size_t)r * w->blocks * QBLOCK, w->scales + (size_t)r * w->blocks, q,
                     w->blocks, out);
        return 1;
    case DTYPE_Q4_0:
        if (!k->tile_q4_0) return 0;
        k->tile_q4_0((const uint8_t *)w->data + (size_t)r * w->blocks * (QBLOCK / 2), w->scales + (size_t)r * w->blocks, q,
                     w->blocks, out);
        return 1;
    case DTYPE_F32:
        if (!k->tile_f32) return 0;
        k->tile_f32((const float *)w->data + (size_t)r * w->cols, x[0], x[1], w->cols, out);
        return 1;
    case DTYPE_F16:
        if (!k->tile_f16) return 0;
        k->tile_f16((const uint16_t *)w->data + (size_t)r * w->cols, x[0], x[1], w->cols, out);
        return 1;
    case DTYPE_BF16:
        if (!k->tile_bf16) return 0;
        k->tile_bf16((const uint16_t *)w->data + (size_t)r * w->cols, x[0], x[1], w->cols, out);
        return 1;
    default: /* the block dtypes have no tiles */
        return 0;
    }
}
#endif

/* Token t's input (of head h in a per-head rows_work, whose quantized inputs are the heads' in turn; else h is 0). */
static const float *token_x(const rows_work *m, uint32_t h, uint32_t t) {
    return m->x + (size_t)t * m->x_stride + (WITH_MLA ? (size_t)h * m->x_head : 0);
}
static q8_vector token_q(const rows_work *m, uint32_t h, uint32_t t) {
    if (!m->xq.q) return (q8_vector){ 0, 0, 0 }; /* float matrices only: nothing was quantized */
    const size_t b = ((WITH_MLA ? (size_t)h * m->n_tok : 0) + t) * m->xq_blocks;
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
    } else if (WITH_BLOCK_DTYPES && w->dtype != DTYPE_F16 && w->dtype != DTYPE_BF16) {
        const dtype_traits *t = &DTYPE_TRAITS[w->dtype];
        const size_t row_bytes = (size_t)(cols + t->block - 1u) / t->block * t->bytes;
        rows_block_for(k, w->dtype)((const uint8_t *)w->data + r0 * row_bytes, xq, w->blocks, r1 - r0, out + r0);
    } else {
        float (*dot16)(const uint16_t *, const float *, uint32_t) = w->dtype == DTYPE_F16 ? k->dot_f16 : k->dot_bf16;
        for (uint32_t r = r0; r < r1; r++) out[r] = dot16((const uint16_t *)w->data + (size_t)r * cols, x, cols);
    }
}

/* Rows [r0, r1) of matrix j (w, writing out) for every token, of head h's inputs in a per-head rows_work: each row
 * is read from memory once for all of them: in runs of rows by four tokens (then tiles of two rows by two tokens)
 * where the kernel set has them. Inlined in each part function, where h is 0 or the head. */
#if BUILD_HAS_TILES
/* Tokens [t, n_tok) of rows r, r + 1 in tiles of two while the set has one: the first token left. */
static uint32_t tile_tokens(const rows_work *m, const weight *w, float *out, size_t os, uint32_t h, uint32_t r, uint32_t t) {
    for (; t + 2 <= m->n_tok; t += 2) {
        const float *x[2] = { token_x(m, h, t), token_x(m, h, t + 1) };
        const q8_vector q[2] = { token_q(m, h, t), token_q(m, h, t + 1) };
        float o[4];
        if (!tile_rows(m->k, w, r, x, q, o)) break;
        out[t * os + r] = o[0];
        out[(t + 1) * os + r] = o[1];
        out[t * os + r + 1] = o[2];
        out[(t + 1) * os + r + 1] = o[3];
    }
    return t;
}
/* Rows [r, r + rows) (even) for the tokens in fours through the set's rows4 for w's dtype: the first token left. */
static uint32_t rows4_tokens(const rows_work *m, const weight *w, float *out, size_t os, uint32_t h, uint32_t r,
                             uint32_t rows) {
    const kernel_set *k = m->k;
    uint32_t t = 0;
#if WITH_BLOCK_DTYPES
    const rows4_block_fn kq = w->dtype == DTYPE_Q4_K ? k->rows4_q4_k : w->dtype == DTYPE_Q5_K ? k->rows4_q5_k
                              : w->dtype == DTYPE_Q6_K ? k->rows4_q6_k : 0;
    if (kq) {
        const dtype_traits *d = &DTYPE_TRAITS[w->dtype];
        const size_t row_bytes = (size_t)(w->cols + d->block - 1u) / d->block * d->bytes;
        for (; t + 4 <= m->n_tok; t += 4) {
            q8_vector q[4];
            for (uint32_t i = 0; i < 4; i++) q[i] = token_q(m, h, t + i);
            kq((const uint8_t *)w->data + r * row_bytes, q, w->blocks, rows, out + t * os + r, os);
        }
        return t;
    }
#endif
    if (w->dtype == DTYPE_Q8_0 ? !k->rows4_q8_0 : w->dtype != DTYPE_Q4_0 || !k->rows4_q4_0) return 0;
    for (; t + 4 <= m->n_tok; t += 4) {
        q8_vector q[4];
        for (uint32_t i = 0; i < 4; i++) q[i] = token_q(m, h, t + i);
        if (w->dtype == DTYPE_Q8_0)
            k->rows4_q8_0((const int8_t *)w->data + (size_t)r * w->blocks * QBLOCK, w->scales + (size_t)r * w->blocks, q,
                          w->blocks, rows, out + t * os + r, os);
        else
            k->rows4_q4_0((const uint8_t *)w->data + (size_t)r * w->blocks * (QBLOCK / 2), w->scales + (size_t)r * w->blocks,
                          q, w->blocks, rows, out + t * os + r, os);
    }
    return t;
}
#endif
/* Rows a rows4 call takes: their weights stay in the 1st- or 2nd-level cache across the tokens' calls. */
#define ROWS4_CHUNK 64u
ALWAYS_INLINE void matrix_rows(const rows_work *m, uint32_t j, const weight *w, float *out, uint32_t h, uint32_t r0,
                               uint32_t r1) {
    const size_t os = m->out_stride[j];
    if (m->n_tok == 1) {
        const q8_vector q = token_q(m, h, 0);
        token_rows(m->k, w, token_x(m, h, 0), &q, out, r0, r1);
        return;
    }
    uint32_t r = r0;
#if BUILD_HAS_TILES
    while (r + 2 <= r1) {
        /* a chunk of rows (an even count) the set's rows4 takes for each four tokens: x arranged once per chunk */
        const uint32_t chunk = r1 - r < ROWS4_CHUNK ? (r1 - r) & ~1u : ROWS4_CHUNK;
        const uint32_t t4 = rows4_tokens(m, w, out, os, h, r, chunk);
        for (const uint32_t end = r + chunk; r < end; r += 2) {
            for (uint32_t t = tile_tokens(m, w, out, os, h, r, t4); t < m->n_tok; t++) { /* no tile, or the odd token */
                const q8_vector q = token_q(m, h, t);
                token_rows(m->k, w, token_x(m, h, t), &q, out + t * os, r, r + 2);
            }
        }
    }
#else
    for (; r + 2 <= r1; r += 2) /* two rows for every token */
        for (uint32_t t = 0; t < m->n_tok; t++) {
            const q8_vector q = token_q(m, h, t);
            token_rows(m->k, w, token_x(m, h, t), &q, out + t * os, r, r + 2);
        }
#endif
    for (uint32_t t = 0; r < r1 && t < m->n_tok; t++) { /* the odd row */
        const q8_vector q = token_q(m, h, t);
        token_rows(m->k, w, token_x(m, h, t), &q, out + t * os, r, r1);
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
        matrix_rows(m, j, &m->w[j], m->out[j], 0, part_start(m->w[j].rows, part, m->parts),
                    part_start(m->w[j].rows, part + 1, m->parts));
    if (m->epilogue != ROWS_ONLY) {
        const uint32_t r0 = part_start(m->w[0].rows, part, m->parts), r1 = part_start(m->w[0].rows, part + 1, m->parts);
        for (uint32_t t = 0; t < m->n_tok; t++) {
            float *g = m->out[0] + (size_t)t * m->out_stride[0];
            const float *u = m->out[1] + (size_t)t * m->out_stride[1];
            if (WITH_EXPERT_EXTRAS && m->extras) {
                const ffn_extras *e = m->extras;
                for (uint32_t i = r0; i < r1; i++) g[i] = clamped_glu(e, g[i], u[i], i);
            } else if (WITH_GEMMA4 && m->epilogue == ROWS_GEGLU) {
                for (uint32_t i = r0; i < r1; i++) g[i] = gelu_tanh(g[i]) * u[i];
            } else {
                m->k->swiglu(g + r0, u + r0, r1 - r0);
            }
        }
    }
}

/* A per-head rows_work's (heads > 1) part: its share of the heads' rows taken as one run, each head's rows a matrix
 * of its own with the head's inputs and outputs (a row's result is the same whichever part computes it). A function
 * of its own: rows_part's frame is on the FreeRTOS tasks' deepest paths (docs/RTOS.md), and stays without it. */
static void head_part(void *arg, uint32_t part) {
    const rows_work *m = arg;
    const uint32_t per = m->w[0].rows / m->heads, r0 = part_start(m->w[0].rows, part, m->parts),
                   r1 = part_start(m->w[0].rows, part + 1, m->parts);
    for (uint32_t h = r0 / per; h * per < r1; h++) {
        const weight w = weight_rows(&m->w[0], h * per, per);
        matrix_rows(m, 0, &w, m->out[0] + (size_t)h * m->out_head, h, r0 > h * per ? r0 - h * per : 0,
                    r1 < (h + 1) * per ? r1 - h * per : per);
    }
}

/* A per-head rows_work's inputs quantized, head by head, each token's at `blocks` blocks apart. */
NOINLINE static void quantize_heads(const colibri_ctx *c, const rows_work *m, int8_t *q, float *scale,
                                    int32_t *sum, uint32_t blocks) {
    for (uint32_t h = 0, v = 0; h < m->heads; h++)
        for (uint32_t t = 0; t < m->n_tok; t++, v++)
            c->kernels->quantize_q8_0(q + (size_t)v * blocks * QBLOCK, scale + (size_t)v * blocks, sum + (size_t)v * blocks,
                                      m->x + (size_t)h * m->x_head + (size_t)t * m->x_stride, m->w[0].cols);
}

/* Run m: the inputs quantized first if a matrix wants it (the normed xn once per norm, since many
 * matrices read it), then every part, on the board's threads if it lends some. */
void run_rows(colibri_ctx *c, const token_buffers *tb, rows_work *m) {
    uint64_t weights = 0;
    int quantized = 0;
    for (uint32_t j = 0; j < m->n; j++) {
        weights += (uint64_t)m->w[j].rows * m->w[j].cols;
        quantized |= WITH_BLOCK_DTYPES ? DTYPE_TRAITS[m->w[j].dtype].block > 1u
                                       : m->w[j].dtype == DTYPE_Q8_0 || m->w[j].dtype == DTYPE_Q4_0;
    }
    m->k = c->kernels;
    if (quantized) {
        const int is_xn = m->x == tb->xn && m->n_tok == tb->n; /* all the tokens' xn: quantized once per norm */
        /* a token's blocks: room for the longest row, or per head one head's (head_part) */
        const int heads = WITH_MLA && m->heads > 1;
        const uint32_t blocks = heads ? (m->w[0].cols + QBLOCK - 1) / QBLOCK : c->d.in_blocks;
        int8_t *q = is_xn ? tb->xq : tb->hq;
        float *scale = is_xn ? tb->xq_scale : tb->hq_scale;
        int32_t *sum = is_xn ? tb->xq_sum : tb->hq_sum;
        if (heads)
            quantize_heads(c, m, q, scale, sum, blocks);
        else if (!is_xn || !c->xn_quantized)
            for (uint32_t t = 0; t < m->n_tok; t++)
                c->kernels->quantize_q8_0(q + (size_t)t * blocks * QBLOCK, scale + (size_t)t * blocks,
                                          sum + (size_t)t * blocks, m->x + (size_t)t * m->x_stride, m->w[0].cols);
        c->xn_quantized |= is_xn;
        m->xq = (q8_vector){ q, scale, sum };
        m->xq_blocks = blocks;
    }
    m->parts = c->opts.parallel_parts > 1 && weights >= PARALLEL_MIN_WEIGHTS ? c->opts.parallel_parts : 1;
    void (*part_fn)(void *, uint32_t) = WITH_MLA && m->heads > 1 ? head_part : rows_part;
    if (m->parts == 1) part_fn(m, 0);
    else c->opts.parallel_for(c->opts.user, part_fn, m, m->parts);
}

/* out = w x for n_tok vectors x (strides: w's columns in, its rows out) */
void matmul(colibri_ctx *c, const token_buffers *tb, float *out, const weight *w, const float *x,
                   uint32_t n_tok) {
    rows_work m = { .n_tok = n_tok, .n = 1, .x = x, .x_stride = w->cols, .out = { out }, .out_stride = { w->rows },
                    .w = { *w } };
    run_rows(c, tb, &m);
}
