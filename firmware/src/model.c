/* The forward pass for one token, following transformers' Mixtral:
 *   x = embed[token]
 *   per layer:  x += o_proj(attention(rope(q), rope(k), v))   on rmsnorm(x)
 *               x += sum_k w_k * expert_ffn_k(h)               on h = rmsnorm(x), top-k routing
 *   logits = lm_head(rmsnorm(x))
 * Weights are read in place from the image; the KV cache and activations live in the arena. */
#include "internal.h"

static const float *tensor(const colibri_ctx *c, uint32_t index) {
    return (const float *)(const void *)(c->image + rd64(c->table + (size_t)index * IMG_ENTRY_BYTES + 32));
}
static const float *layer_w(const colibri_ctx *c, uint32_t layer, uint32_t role) {
    return tensor(c, layer_tensor_index(&c->d, layer, role));
}

static uint64_t now(const colibri_ctx *c) { return c->opts.cycles ? c->opts.cycles(c->opts.user) : 0; }

static void attention(colibri_ctx *c, uint32_t layer) {
    const model_dims *d = &c->d;
    const arena_buffers *a = &c->a;
    const uint32_t pos = c->pos, hd = d->head_dim, group = d->n_heads / d->n_kv_heads;
    const size_t layer_base = (size_t)layer * d->max_seq * d->kv_dim;
    float *k_cur = a->k_cache + layer_base + (size_t)pos * d->kv_dim;
    float *v_cur = a->v_cache + layer_base + (size_t)pos * d->kv_dim;

    rmsnorm(a->xn, a->x, layer_w(c, layer, ROLE_ATTN_NORM), d->dim, d->eps);
    matvec(a->q, layer_w(c, layer, ROLE_WQ), a->xn, d->q_dim, d->dim);
    matvec(k_cur, layer_w(c, layer, ROLE_WK), a->xn, d->kv_dim, d->dim);
    matvec(v_cur, layer_w(c, layer, ROLE_WV), a->xn, d->kv_dim, d->dim);
    const float *cos = tensor(c, global_tensor_index(d, ROLE_ROPE_COS)) + (size_t)pos * (hd / 2);
    const float *sin = tensor(c, global_tensor_index(d, ROLE_ROPE_SIN)) + (size_t)pos * (hd / 2);
    rope(a->q, d->n_heads, hd, cos, sin);
    rope(k_cur, d->n_kv_heads, hd, cos, sin);

    for (uint32_t h = 0; h < d->n_heads; h++) {
        const float *q = a->q + (size_t)h * hd;
        const size_t kv_off = layer_base + (size_t)(h / group) * hd;
        float *att = a->att + (size_t)h * d->max_seq;
        for (uint32_t t = 0; t <= pos; t++) {
            att[t] = dot(q, a->k_cache + kv_off + (size_t)t * d->kv_dim, hd) * c->attn_scale;
        }
        softmax(att, pos + 1);
        float *out = a->attn_out + (size_t)h * hd;
        for (uint32_t i = 0; i < hd; i++) out[i] = 0.0f;
        for (uint32_t t = 0; t <= pos; t++) {
            const float *v = a->v_cache + kv_off + (size_t)t * d->kv_dim;
            for (uint32_t i = 0; i < hd; i++) out[i] += att[t] * v[i];
        }
    }
    matvec(a->moe_out, layer_w(c, layer, ROLE_WO), a->attn_out, d->dim, d->q_dim);
    for (uint32_t i = 0; i < d->dim; i++) a->x[i] += a->moe_out[i];
}

/* Softmax over all experts, keep the top_k (ties: lower index), optionally renormalize. */
static void route_topk(colibri_ctx *c, uint32_t layer) {
    const model_dims *d = &c->d;
    const arena_buffers *a = &c->a;
    matvec(a->router, layer_w(c, layer, ROLE_ROUTER), a->xn, d->n_experts, d->dim);
    softmax(a->router, d->n_experts);
    float sum = 0.0f;
    for (uint32_t k = 0; k < d->top_k; k++) {
        uint32_t best = 0;
        float best_p = -1.0f;
        for (uint32_t e = 0; e < d->n_experts; e++) {
            int taken = 0;
            for (uint32_t j = 0; j < k; j++) taken |= a->topk_index[j] == e;
            if (!taken && a->router[e] > best_p) { best = e; best_p = a->router[e]; }
        }
        a->topk_index[k] = best;
        a->topk_weight[k] = best_p;
        sum += best_p;
    }
    if (d->flags & IMG_FLAG_NORM_TOPK)
        for (uint32_t k = 0; k < d->top_k; k++) a->topk_weight[k] /= sum;
}

/* moe_out += weight * down(silu(gate(xn)) * up(xn)) for one expert. */
static void expert_ffn(colibri_ctx *c, uint32_t layer, uint32_t expert, float weight) {
    const model_dims *d = &c->d;
    const arena_buffers *a = &c->a;
    matvec(a->ffn_gate, tensor(c, expert_tensor_index(d, layer, expert, ROLE_EXPERT_GATE)), a->xn, d->ffn, d->dim);
    matvec(a->ffn_up, tensor(c, expert_tensor_index(d, layer, expert, ROLE_EXPERT_UP)), a->xn, d->ffn, d->dim);
    for (uint32_t i = 0; i < d->ffn; i++) {
        float g = a->ffn_gate[i];
        a->ffn_gate[i] = g / (1.0f + colibri_expf(-g)) * a->ffn_up[i];
    }
    const float *down = tensor(c, expert_tensor_index(d, layer, expert, ROLE_EXPERT_DOWN));
    for (uint32_t r = 0; r < d->dim; r++) a->moe_out[r] += weight * dot(down + (size_t)r * d->ffn, a->ffn_gate, d->ffn);
    c->stats.expert_calls++;
}

void model_forward(colibri_ctx *c, uint32_t token) {
    const model_dims *d = &c->d;
    const arena_buffers *a = &c->a;
    const float *embd = tensor(c, global_tensor_index(d, ROLE_TOKEN_EMBD)) + (size_t)token * d->dim;
    for (uint32_t i = 0; i < d->dim; i++) a->x[i] = embd[i];

    for (uint32_t layer = 0; layer < d->n_layers; layer++) {
        uint64_t t0 = now(c);
        attention(c, layer);
        rmsnorm(a->xn, a->x, layer_w(c, layer, ROLE_FFN_NORM), d->dim, d->eps);
        uint64_t t1 = now(c);
        route_topk(c, layer);
        uint64_t t2 = now(c);
        for (uint32_t i = 0; i < d->dim; i++) a->moe_out[i] = 0.0f;
        for (uint32_t k = 0; k < d->top_k; k++) expert_ffn(c, layer, a->topk_index[k], a->topk_weight[k]);
        for (uint32_t i = 0; i < d->dim; i++) a->x[i] += a->moe_out[i];
        uint64_t t3 = now(c);
        c->stats.cycles_attention += t1 - t0;
        c->stats.cycles_router += t2 - t1;
        c->stats.cycles_experts += t3 - t2;
    }
    uint64_t t4 = now(c);
    rmsnorm(a->xn, a->x, tensor(c, global_tensor_index(d, ROLE_OUTPUT_NORM)), d->dim, d->eps);
    matvec(a->logits, tensor(c, global_tensor_index(d, ROLE_LM_HEAD)), a->xn, d->vocab, d->dim);
    c->stats.cycles_lm_head += now(c) - t4;
    c->pos++;
    c->have_logits = 1;
}
