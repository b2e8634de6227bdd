/* The matrix driver (rows.c): up to three matrices that read the same tokens' vectors, computed a fixed share of
 * every matrix's rows per part, the parts on the board's threads if it lends some. */
#ifndef COLIBRI_ROWS_H
#define COLIBRI_ROWS_H

#include "internal.h"


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
    /* heads > 1 (MLA's per-head projections; n 1, no epilogue): w[0] is `heads` matrices of w[0].rows / heads rows
     * each, one a head, and head h reads x + h * x_head and writes out[0] + h * out_head (then the token strides);
     * its quantized inputs are xq_blocks blocks a token, head by head. Its rows are split over the parts as one. */
    uint32_t heads, x_head, out_head;
} rows_work;

/* Below this many weights a matrix is not worth waking other threads for (a router, a gate vector). */
#define PARALLEL_MIN_WEIGHTS 16384u

/* The first row of `part`: rows < 2^24 (IMG_MAX_DIM) and part <= COLIBRI_MAX_PARTS, so 32 bits hold the product. */
static inline uint32_t part_start(uint32_t rows, uint32_t part, uint32_t parts) {
    return rows * part / parts;
}

/* Rows [r0, r0 + n) of w, as a matrix of their own (one head's part of a per-head projection). */
static inline weight weight_rows(const weight *w, uint32_t r0, uint32_t n) {
    const dtype_traits *t = &DTYPE_TRAITS[w->dtype];
    const size_t row_bytes = (size_t)((w->cols + t->block - 1u) / t->block) * t->bytes;
    weight part = *w;
    part.rows = n;
    part.data = (const uint8_t *)w->data + r0 * row_bytes;
    if (w->scales) part.scales = w->scales + (size_t)r0 * w->blocks;
    return part;
}

/* Run m: its inputs quantized first if a matrix wants them, then every part. */
void run_rows(colibri_ctx *c, const token_buffers *tb, rows_work *m);
/* out = w x for n_tok vectors x (strides: w's columns in, its rows out) */
void matmul(colibri_ctx *c, const token_buffers *tb, float *out, const weight *w, const float *x, uint32_t n_tok);

#endif
