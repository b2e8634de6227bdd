/* The forward pass, following transformers' implementations of the supported families (docs/MODELS.md):
 *   x = embed[token]
 *   per layer (each as its record says: docs/FORMAT.md "Layers"):
 *               h = rmsnorm(x)
 *               q, k, v = Wq h (+bq), Wk h (+bk), Wv h (+bv); optional q/k RMSNorm (per head or
 *               across the projection) and clipping; rotate-half RoPE on q and k
 *               x += Wo attention(q, K cache, V cache) (+bo), with optional per-head sinks; or DeepSeek's
 *               multi-head latent attention (attention_mla)
 *               h = rmsnorm(x)
 *               x += dense SwiGLU MLP(h), or in a MoE layer
 *                    sum over the top-k experts of w_k * expert_k(h) (+ sigmoid(g . h) * shared(h), or
 *                    + shared(h)); the routers of route_topk; gpt-oss's expert biases and clamped SwiGLU
 *               Gemma 4's layers normalize attention's and the FFN's outputs, run the dense GeGLU MLP beside their
 *               experts and scale x per layer (ffn_block); its global layers have their own widths and RoPE
 *   logits = lm_head(rmsnorm(x)), soft-capped in Gemma
 * Weights are read in place from the image, in their stored dtype (docs/FORMAT.md "Dtypes"), except
 * routed experts with an expert cache, which come through it (experts.c); the KV cache (f32 or f16)
 * and activations live in the arena.
 * One pass computes one token (decode), or a run of prompt tokens together (a prefill batch,
 * colibri_options.prefill_batch): every matrix row is then read once for all of them, and each token's
 * value of a row is the same dot product, in the same order, as if it came alone, so the bits are too. */
#include "internal.h"
#include "rows.h"

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

/* out += b for each of n vectors of len, when the image has that bias */
static void add_bias(const colibri_ctx *c, float *out, uint32_t len, uint32_t n, uint32_t layer, uint32_t b_role) {
    if (!present(c, layer_index(c, layer, b_role))) return;
    const float *b = layer_w(c, layer, b_role);
    for (uint32_t t = 0; t < n; t++)
        for (uint32_t i = 0; i < len; i++) out[(size_t)t * len + i] += b[i];
}

/* Each token's v (dim wide, in place) normed by layer's `role` weights: Gemma 4's norms after a part. */
static void post_norm(const colibri_ctx *c, const token_buffers *tb, float *v, uint32_t layer, uint32_t role) {
    for (uint32_t t = 0; t < tb->n; t++)
        rmsnorm(v + (size_t)t * c->d.dim, v + (size_t)t * c->d.dim, layer_w(c, layer, role), c->d.dim, c->d.eps);
}
/* Whether `layer`'s record has option `opt` that only a Gemma 4 mechanism computes (the lean build has none). */
static int gemma4_option(const model_dims *d, uint32_t layer, uint32_t opt) {
    return WITH_GEMMA4 && (kind_of(d, layer)->options & opt);
}
/* Whether all n values are finite (x - x is 0 for finite x, NaN for inf and NaN). */
static int all_finite(const float *v, uint32_t n) {
    for (uint32_t i = 0; i < n; i++)
        if (v[i] - v[i] != 0.0f) return 0;
    return 1;
}
/* acc += s * v: how an FFN's output joins moe_out, the same expression for every kind and order */
static void add_scaled(float *acc, float s, const float *v, uint32_t n) {
    for (uint32_t i = 0; i < n; i++) acc[i] += s * v[i];
}

/* ---- the blocks: one file a mechanism ----
 * Each is compiled here, in this file's unit, as static functions the forward pass below calls: most are called
 * from one place, and in one unit the compiler inlines them there. Compiled as objects of their own, the calls
 * between them cost the Cortex-M4's lean runtime 700 bytes of its 16 KiB (docs/RUNTIME.md). */
/* In this order: attention.c calls rings.c's ring_rows, mla.c attention.c's rope and heads, moe.c ffn.c's FFN. */
#include "blocks/rings.c"     /* a prefill batch over window rings */
#include "blocks/attention.c" /* standard attention, RoPE, the KV cache, the heads */
#include "blocks/mla.c"       /* multi-head latent attention */
#include "blocks/router.c"    /* the MoE router */
#include "blocks/ffn.c"       /* the gated FFN: dense MLP, shared expert, one routed expert */
#include "blocks/moe.c"       /* the routed experts of a pass */
#include "blocks/ple.c"       /* Gemma 4's per-layer inputs */
#include "blocks/state.c"     /* the state of the layers that keep one instead of a KV cache */
#include "blocks/conv.c"      /* LFM2's short convolutions */
#include "blocks/deltanet.c"  /* Qwen3.5's Gated DeltaNet */

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
                            .gate = a->ffn_gate, .up = a->ffn_up, .mix = a->mix, .q_gate = a->q_gate,
                            .ffn_out = a->ffn_out, .gx = a->ffn_out, .expert_out = 0, .scalar = a->router, .topk_index = a->topk_index,
                            .topk_weight = a->topk_weight, .xq = a->xq, .xq_scale = a->xq_scale,
                            .xq_sum = a->xq_sum, .hq = a->hq, .hq_scale = a->hq_scale, .hq_sum = a->hq_sum };
}

/* Each token's x normed into its xn, the input of the matrices that follow. */
static void norm_inputs(colibri_ctx *c, const token_buffers *tb, const float *weights) {
    for (uint32_t t = 0; t < tb->n; t++)
        rmsnorm(tb->xn + (size_t)t * c->d.dim, tb->x + (size_t)t * c->d.dim, weights, c->d.dim, c->d.eps);
    c->xn_quantized = 0;
}

/* The attention half of a layer for every token: x += Wo attention(rmsnorm(x)) (+ bo), or in a SHORT_CONV or DELTA_NET
 * layer its convolution or DeltaNet of rmsnorm(x), the output normed first with POST_ATTN_NORM. Token t sits at
 * position c->pos + t and sees the positions before it, its batch-mates included. kv_base: where the rows of the cache
 * it attends over (kv_source's) start in the KV cache; state: the layer's state (blocks/state.c). */
static void attention(colibri_ctx *c, const token_buffers *tb, uint32_t layer, size_t kv_base, float *state) {
    const model_dims *d = &c->d;
    const uint32_t n = tb->n;
    norm_inputs(c, tb, layer_w(c, layer, ROLE_ATTN_NORM));
    if (layer_conv(d, layer)) {
        short_conv(c, tb, layer, state);
    } else if (layer_delta(d, layer)) {
        delta_net(c, tb, layer, state);
    } else {
        const float *o_in = WITH_MLA && d->kv_lora ? attention_mla(c, tb, layer, kv_base) : attention_mha(c, tb, layer, kv_base);
        weight wo = matrix(c, layer_index(c, layer, ROLE_WO));
        matmul(c, tb, tb->moe_out, &wo, o_in, n);
        add_bias(c, tb->moe_out, d->dim, n, layer, ROLE_BO);
    }
    if (gemma4_option(d, layer, LAYER_OPT_POST_ATTN_NORM)) post_norm(c, tb, tb->moe_out, layer, ROLE_POST_ATTN_NORM);
    for (size_t i = 0; i < (size_t)n * d->dim; i++) tb->x[i] += tb->moe_out[i];
}

static const float one = 1.0f; /* the weight of an FFN that is not gated: the dense MLP, a plain shared expert */

/* moe_out[t] += w[t * stride] * ffn_out[t] for every token (the shared expert, the dense MLP) */
static void accumulate(const colibri_ctx *c, const token_buffers *tb, const float *w, uint32_t stride) {
    const uint32_t dim = c->d.dim;
    for (uint32_t t = 0; t < tb->n; t++)
        add_scaled(tb->moe_out + (size_t)t * dim, w[(size_t)t * stride], tb->ffn_out + (size_t)t * dim, dim);
}

/* The FFN half of a layer into moe_out: routed experts (+ shared expert), or the dense MLP, each reading x
 * normed by FFN_NORM. MOE_AND_DENSE (Gemma 4's) has the experts beside the dense MLP, routed on x normed by
 * ROUTER_NORM and reading x normed by MOE_NORM, each part normed after; with POST_FFN_NORM the sum is too. Fills `t`
 * (one token: per-expert cycles). */
static colibri_status ffn_block(colibri_ctx *c, const token_buffers *tb, uint32_t layer, colibri_layer_trace *t) {
    const model_dims *d = &c->d;
    const uint32_t n = tb->n;
    const layer_kind *kind = kind_of(d, layer);
    const uint32_t shared = kind->shared;
    const int routed = kind->ffn != LAYER_FFN_DENSE, both = WITH_GEMMA4 && kind->ffn == LAYER_FFN_MOE_AND_DENSE;
    uint64_t t0 = ctx_now(c), t1 = t0;
    for (size_t i = 0; i < (size_t)n * d->dim; i++) tb->moe_out[i] = 0.0f;
    norm_inputs(c, tb, layer_w(c, layer, both ? ROLE_ROUTER_NORM : ROLE_FFN_NORM));
    if (routed) {
        colibri_status st = route_topk(c, tb, layer);
        if (st) return st;
        if (both) norm_inputs(c, tb, layer_w(c, layer, ROLE_MOE_NORM));
        t1 = ctx_now(c);
        uint32_t slot[IMG_MAX_TOP_K]; /* one token's routed experts' cache slots (a cache means one token a pass) */
        if (c->cache.n_slots) {
            st = experts_load(c, layer, slot);
            if (st) return st;
            const uint32_t next = layer + 1;
            if ((c->opts.expert_policy & COLIBRI_PREFETCH) && next < d->n_layers && kind_of(d, next)->ffn != LAYER_FFN_DENSE)
                prefetch_next(c, tb, next);
        }
        st = routed_experts(c, tb, layer, slot);
        if (st) return st;
        if (shared != LAYER_SHARED_NONE) {
            const float *scale = &one; /* ungated: each token's weight 1 (stride 0) */
            if (shared == LAYER_SHARED_GATED) { /* gated by sigmoid(g . x) */
                weight gate = matrix(c, layer_index(c, layer, ROLE_SHARED_EXPERT_GATE));
                matmul(c, tb, tb->scalar, &gate, tb->xn, n);
                for (uint32_t g = 0; g < n; g++) tb->scalar[g] = 1.0f / (1.0f + colibri_expf(-tb->scalar[g]));
                scale = tb->scalar;
            }
            swiglu_ffn(c, tb, layer, layer_index(c, layer, ROLE_SHARED_GATE), c->image, 0, tb->xn, n, 0);
            accumulate(c, tb, scale, scale == &one ? 0 : 1);
        }
        if (both) post_norm(c, tb, tb->moe_out, layer, ROLE_MOE_POST_NORM);
    }
    t->n_routed = routed ? d->top_k : 0;
    if (!routed || both) {
        if (both) norm_inputs(c, tb, layer_w(c, layer, ROLE_FFN_NORM)); /* xn holds the experts' norm */
        swiglu_ffn(c, tb, layer, layer_index(c, layer, ROLE_DENSE_GATE), c->image, 0, tb->xn, n, 0);
        if (both) post_norm(c, tb, tb->ffn_out, layer, ROLE_DENSE_POST_NORM);
        accumulate(c, tb, &one, 0);
    }
    if (gemma4_option(d, layer, LAYER_OPT_POST_FFN_NORM)) post_norm(c, tb, tb->moe_out, layer, ROLE_POST_FFN_NORM);
    uint64_t t2 = ctx_now(c);
    t->cycles_router = t1 - t0;
    t->cycles_ffn = t2 - t1;
    c->stats.cycles_router += t1 - t0;
    c->stats.cycles_experts += t2 - t1;
    return COLIBRI_OK;
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
        if (WITH_TRACE_CRC) t.crc_output = residual_crc(c, tb, i);
        if (i + 1 < n) t.cycles_attention = t.cycles_router = t.cycles_ffn = t.crc_attention = 0;
        c->opts.trace(c->opts.user, &t);
    }
}

/* Where layer `layer`'s KV rows start in the cache: after every earlier layer's. */
static size_t kv_start(const model_dims *d, uint32_t layer) {
    size_t at = 0;
    for (uint32_t l = 0; l < layer; l++) at += (size_t)kv_rows(d, l) * layer_kv_dim(d, l);
    return at;
}

/* A pass that fails feeds none of its n tokens: nor do their rows stay in the window rings, nor their inputs in
 * the conv state. */
static colibri_status pass_failed(const colibri_ctx *c, uint32_t n, colibri_status st) {
    if (WITH_WINDOW_RINGS && n > 1 && c->rings.rows) rings_save(c, n, 1);
    if ((WITH_SHORT_CONV || WITH_DELTA_NET) && c->a.state) state_copy(c, c->a.state, c->a.state_saved);
    return st;
}

colibri_status model_forward(colibri_ctx *c, const uint32_t *tokens, uint32_t n, int want_logits) {
    const model_dims *d = &c->d;
    const token_buffers tb = tokens_in(c, n);
    if (WITH_WINDOW_RINGS && n > 1 && c->rings.rows) rings_save(c, n, 0); /* over window rings: what the pass overwrites */
    if ((WITH_SHORT_CONV || WITH_DELTA_NET) && c->a.state) state_begin(c);
    weight embd = matrix(c, global_tensor_index(d, ROLE_TOKEN_EMBD));
    for (uint32_t t = 0; t < n; t++) weight_row(tb.x + (size_t)t * d->dim, &embd, tokens[t]);
    if (WITH_GEMMA4 && d->embed_scale != 0.0f)
        for (size_t i = 0; i < (size_t)n * d->dim; i++) tb.x[i] *= d->embed_scale;
    if (WITH_PER_LAYER_INPUTS && d->ple_dim) per_layer_inputs(c, &tb, tokens);

    /* Each layer's KV rows follow every earlier layer's (arena_plan's order), so their starts are a running sum. A
     * sharing layer reads its kv_source's rows, which start where that layer's do. */
    size_t kv_end = 0, state_at = 0; /* and each layer's state follows the one before */
    for (uint32_t layer = 0; layer < d->n_layers; layer++) {
        colibri_layer_trace t = { .layer = layer, .cycles_expert = c->a.topk_cycles };
        const size_t kv_base = layer_kv_shared(d, layer) ? kv_start(d, kv_source(d, layer)) : kv_end;
        kv_end += (size_t)kv_rows(d, layer) * layer_kv_dim(d, layer);
        uint64_t t0 = ctx_now(c);
        const size_t state_elements = layer_state_elements(d, layer);
        attention(c, &tb, layer, kv_base, state_elements ? c->a.state + state_at : 0);
        state_at += state_elements;
        t.cycles_attention = ctx_now(c) - t0;
        if (WITH_TRACE_CRC && c->opts.trace) t.crc_attention = residual_crc(c, &tb, n - 1);
        c->stats.cycles_attention += t.cycles_attention;
        colibri_status st = ffn_block(c, &tb, layer, &t);
        if (st) return pass_failed(c, n, st);
        for (size_t i = 0; i < (size_t)n * d->dim; i++) tb.x[i] += tb.moe_out[i];
        if (WITH_PER_LAYER_INPUTS && d->ple_dim) per_layer_input(c, &tb, layer); /* Gemma 4's per-layer input */
        if (gemma4_option(d, layer, LAYER_OPT_LAYER_SCALE)) { /* and its scalar per layer */
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
        if (WITH_GEMMA4 && d->logit_softcap != 0.0f) /* Gemma's final soft-capping: cap * tanh(logits / cap) */
            for (uint32_t i = 0; i < d->vocab; i++) c->a.logits[i] = d->logit_softcap * tanh_f(c->a.logits[i] / d->logit_softcap);
    }
    c->pos += n;
    c->have_logits = want_logits;
    return COLIBRI_OK;
}
