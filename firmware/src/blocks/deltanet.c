/* Qwen3.5's Gated DeltaNet, a layer's mixer instead of attention (transformers' Qwen3_5MoeGatedDeltaNet, its
 * recurrent form, one token after another):
 *   qkv = silu(conv(DN_QKV h)), z = DN_Z h, b = DN_B h, a = DN_A h    (the causal convolution as in blocks/state.c)
 *   q, k: L2-normed per key head (x / sqrt(sum x² + 1e-6)), q divided by sqrt(dk)
 *   per value head v (its key head v / (Hv / Hk)):  β = sigmoid(b_v), decay = exp(DN_DECAY_v · softplus(a_v + DN_DT_BIAS_v))
 *       S = decay · S;  δ = (v - Sᵀk) · β;  S = S + k δᵀ;  o = Sᵀq        (S: dk x dv, the head's state)
 *       o = rmsnorm(o) · DN_NORM · silu(z_v)
 *   out = DN_OUT o
 * Every sum runs over the key dim in order from +0. The convolution's inputs and the heads' S are the layer's state
 * (blocks/state.c). Compiled in model.c's unit (it includes this file), so its functions are static. */

static float silu_f(float x) { return x / (1.0f + colibri_expf(-x)); }

/* ln x for a finite x >= 1 (what softplus asks): x = m · 2^e with m in [sqrt(1/2), sqrt(2)), ln m from
 * s = (m - 1) / (m + 1) as 2s(1 + s²/3 + s⁴/5 + s⁶/7 + s⁸/9), |s| <= 0.172; e · ln 2 in two parts. */
static float ln_f(float x) {
    union { float f; uint32_t u; } v = { x };
    int e = (int)(v.u >> 23) - 127;
    v.u = (v.u & 0x007FFFFFu) | 0x3F800000u;
    float m = v.f;
    if (m > 1.41421356f) {
        m *= 0.5f;
        e++;
    }
    const float s = (m - 1.0f) / (m + 1.0f), s2 = s * s;
    const float p = 2.0f * s * (1.0f + s2 * (1.0f / 3 + s2 * (1.0f / 5 + s2 * (1.0f / 7 + s2 * (1.0f / 9)))));
    return (float)e * 0.693145751953125f + ((float)e * 1.42860682030941723212e-06f + p);
}

/* torch's softplus: x above 20, else log1p(e^x), as ln(1 + e) · e / ((1 + e) - 1) (exact where 1 + e rounds). */
static float softplus_f(float x) {
    if (x > 20.0f) return x;
    const float e = colibri_expf(x), u = 1.0f + e;
    return u == 1.0f ? e : ln_f(u) * (e / (u - 1.0f));
}

/* x / sqrt(sum x² + 1e-6) over n, in place (transformers' l2norm in the recurrent rule). */
static void l2norm(float *x, uint32_t n) {
    float ss = 0.0f;
    for (uint32_t i = 0; i < n; i++) ss += x[i] * x[i];
    const float inv = 1.0f / SQRTF(ss + 1e-6f);
    for (uint32_t i = 0; i < n; i++) x[i] *= inv;
}

/* One value head's step: S (dk x dv) decayed and updated by the delta rule with key k, value v and β; o = Sᵀq. */
static void delta_step(float *S, uint32_t dk, uint32_t dv, float decay, float beta, const float *q, const float *k,
                       const float *v, float *o) {
    for (size_t i = 0; i < (size_t)dk * dv; i++) S[i] *= decay;
    for (uint32_t j = 0; j < dv; j++) o[j] = 0.0f; /* Sᵀk, then δ */
    for (uint32_t i = 0; i < dk; i++)
        for (uint32_t j = 0; j < dv; j++) o[j] += S[(size_t)i * dv + j] * k[i];
    for (uint32_t j = 0; j < dv; j++) o[j] = (v[j] - o[j]) * beta;
    for (uint32_t i = 0; i < dk; i++)
        for (uint32_t j = 0; j < dv; j++) S[(size_t)i * dv + j] += k[i] * o[j];
    for (uint32_t j = 0; j < dv; j++) o[j] = 0.0f;
    for (uint32_t i = 0; i < dk; i++)
        for (uint32_t j = 0; j < dv; j++) o[j] += S[(size_t)i * dv + j] * q[i];
}

/* The layer's DeltaNet of every token's xn into moe_out, advancing `state` (the layer's) token by token. The pass's
 * part of the mix region holds, each n rows: qkv, z, the heads' outputs, b, a. */
static void delta_net(colibri_ctx *c, const token_buffers *tb, uint32_t layer, float *state) {
    const model_dims *d = &c->d;
    const uint32_t n = tb->n, C = d->dn_conv, Hk = d->dn_k_heads, Hv = d->dn_v_heads, dk = d->dn_k_dim, dv = d->dn_v_dim;
    const uint32_t V = Hv * dv, group = Hv / Hk;
    float *qkv = tb->mix, *z = qkv + (size_t)n * C, *out = z + (size_t)n * V, *b = out + (size_t)n * V, *a = b + (size_t)n * Hv;
    const uint32_t roles[4] = { ROLE_DN_QKV, ROLE_DN_Z, ROLE_DN_B, ROLE_DN_A };
    float *outs[4] = { qkv, z, b, a };
    for (unsigned i = 0; i < 4; i++) {
        weight w = matrix(c, layer_index(c, layer, roles[i]));
        matmul(c, tb, outs[i], &w, tb->xn, n);
    }
    const float *conv_w = layer_w(c, layer, ROLE_DN_CONV), *dt = layer_w(c, layer, ROLE_DN_DT_BIAS);
    const float *decay = layer_w(c, layer, ROLE_DN_DECAY), *norm_w = layer_w(c, layer, ROLE_DN_NORM);
    float *S = state + (size_t)(d->conv_kernel - 1) * C;
    const float q_scale = SQRTF((float)dk);
    for (uint32_t t = 0; t < n; t++) {
        float *x = qkv + (size_t)t * C, *q = x, *k = x + (size_t)Hk * dk, *v = k + (size_t)Hk * dk;
        causal_conv(state, conv_w, d->conv_kernel, C, x, x);
        for (uint32_t i = 0; i < C; i++) x[i] = silu_f(x[i]);
        for (uint32_t h = 0; h < Hk; h++) {
            l2norm(q + (size_t)h * dk, dk);
            l2norm(k + (size_t)h * dk, dk);
        }
        for (uint32_t i = 0; i < Hk * dk; i++) q[i] /= q_scale;
        for (uint32_t h = 0; h < Hv; h++) {
            const size_t at = (size_t)t * Hv + h, kh = (size_t)(h / group) * dk;
            const float beta = 1.0f / (1.0f + colibri_expf(-b[at]));
            const float g = colibri_expf(decay[h] * softplus_f(a[at] + dt[h]));
            float *o = out + (size_t)t * V + (size_t)h * dv;
            delta_step(S + (size_t)h * dk * dv, dk, dv, g, beta, q + kh, k + kh, v + (size_t)h * dv, o);
            rmsnorm(o, o, norm_w, dv, d->eps);
            const float *zh = z + (size_t)t * V + (size_t)h * dv;
            for (uint32_t j = 0; j < dv; j++) o[j] *= silu_f(zh[j]);
        }
    }
    weight w_out = matrix(c, layer_index(c, layer, ROLE_DN_OUT));
    matmul(c, tb, tb->moe_out, &w_out, out, n);
}
