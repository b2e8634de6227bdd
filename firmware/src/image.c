/* The image verifier: every byte that a later call reads is checked here first.
 * Layout: docs/FORMAT.md. All size arithmetic is 64-bit and overflow-checked. */
#include "internal.h"

uint32_t rd32(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

uint64_t rd64(const uint8_t *p) { return (uint64_t)rd32(p) | (uint64_t)rd32(p + 4) << 32; }

static uint16_t rd16(const uint8_t *p) { return (uint16_t)(p[0] | p[1] << 8); }

static float rdf32(const uint8_t *p) {
    union { uint32_t u; float f; } v = { rd32(p) };
    return v.f;
}

/* Checked arithmetic: return 0 on overflow. */
static int add_ok(uint64_t a, uint64_t b, uint64_t *r) { *r = a + b; return *r >= a; }
static int mul_ok(uint64_t a, uint64_t b, uint64_t *r) {
    if (a != 0 && b > UINT64_MAX / a) return 0;
    *r = a * b;
    return 1;
}
static int align_ok(uint64_t a, uint64_t *r) {
    if (!add_ok(a, IMG_ALIGN - 1, r)) return 0;
    *r &= ~(uint64_t)(IMG_ALIGN - 1);
    return 1;
}

static const uint8_t MAGIC[8] = { 'C', 'O', 'L', 'I', 'B', 'R', 'I', 0 };

uint32_t layer_tensor_index(const model_dims *d, uint32_t layer, uint32_t role) {
    return TENSORS_BEFORE_LAYERS + layer * (LAYER_FIXED + TENSORS_PER_EXPERT * d->n_experts) +
           (role - ROLE_ATTN_NORM);
}

uint32_t expert_tensor_index(const model_dims *d, uint32_t layer, uint32_t expert, uint32_t role) {
    return layer_tensor_index(d, layer, ROLE_ATTN_NORM) + LAYER_FIXED + expert * TENSORS_PER_EXPERT +
           (role - ROLE_EXPERT_GATE);
}

uint32_t global_tensor_index(const model_dims *d, uint32_t role) {
    if (role <= ROLE_ROPE_SIN) return role - ROLE_TOKEN_EMBD;
    return layer_tensor_index(d, d->n_layers, ROLE_ATTN_NORM) + (role - ROLE_OUTPUT_NORM);
}

int tensor_present(const uint8_t *table, uint32_t index) {
    return rd32(table + (size_t)index * IMG_ENTRY_BYTES + E_NDIMS) != 0;
}

void tensors_resolve(const uint8_t *table, uint32_t n_tensors, tensor_ref *refs) {
    for (uint32_t i = 0; i < n_tensors; i++) {
        const uint8_t *e = table + (size_t)i * IMG_ENTRY_BYTES;
        refs[i] = (tensor_ref){ .offset = rd64(e + E_OFFSET), .scales = rd64(e + E_SCALES_OFFSET),
                                .rows = rd32(e + E_NDIMS) ? rd32(e + E_DIM0) : 0, .cols = rd32(e + E_DIM1),
                                .dtype = rd16(e + E_DTYPE) };
    }
}

/* A scale the math multiplies by: finite and positive (rejects NaN). */
static int scale_ok(float s) { return s > 0.0f && s < 3.0e38f; }

/* The attention's widths. Standard attention: RoPE over the whole head, values a head wide. MLA: one
 * latent shared by every head (n_kv_heads 1), RoPE on the last rope_dim dims of a q/k head, none of the
 * options standard attention has (biases, q/k norms, clipping). Nonzero: the dimensions are invalid. */
static int attention_dims(const uint8_t *h, model_dims *d) {
    d->q_lora = rd32(h + H_Q_LORA);
    d->kv_lora = rd32(h + H_KV_LORA);
    d->rope_dim = rd32(h + H_ROPE_DIM);
    d->v_head_dim = rd32(h + H_V_HEAD_DIM);
    d->attn_scale = rdf32(h + H_ATTN_SCALE);
    const uint32_t hd = d->head_dim, H = d->n_heads;
    /* Gemma 4's global layers: a head size and KV heads of their own (0: the others'; the lean build has none) */
    const uint32_t global_hd = WITH_GEMMA4 ? rd32(h + H_GLOBAL_HEAD_DIM) : 0;
    const uint32_t global_kv = WITH_GEMMA4 ? rd32(h + H_GLOBAL_KV_HEADS) : 0;
    d->global_head_dim = global_hd ? global_hd : hd;
    d->global_kv_heads = global_kv ? global_kv : d->n_kv_heads;
    const uint32_t widest = hd > d->global_head_dim ? hd : d->global_head_dim;
    if (!scale_ok(d->attn_scale) || (uint64_t)H * widest > IMG_MAX_DIM || d->global_head_dim % 2 ||
        H % d->global_kv_heads)
        return 1;
    d->q_dim = H * widest;
    d->o_dim = H * d->v_head_dim; /* checked below */
    if (!WITH_MLA || d->kv_lora == 0) { /* without them, read_dims refuses kv_lora > 0 */
        const uint32_t global_kv_dim = d->global_kv_heads * d->global_head_dim; /* both <= n_heads * widest */
        d->kv_dim = d->n_kv_heads * hd > global_kv_dim ? d->n_kv_heads * hd : global_kv_dim;
        d->att_dim = d->val_dim = widest;
        /* RoPE turns a whole head, with the table of the layer's head size: ROPE_COS/SIN hold head_dim / 2 a row,
         * so a global head size of its own needs its own tables (GLOBAL_ROPE's, global_head_dim / 2 a row) */
        return d->q_lora || d->rope_dim != hd || d->v_head_dim != hd ||
               (global_hd && global_hd != hd && !(d->flags & IMG_FLAG_GLOBAL_ROPE));
    }
    const uint32_t options = IMG_FLAG_QKV_BIAS | IMG_FLAG_O_BIAS | IMG_FLAG_QK_NORM_HEAD | IMG_FLAG_QK_NORM_FULL |
                             IMG_FLAG_V_NORM | IMG_FLAG_K_EQ_V | IMG_FLAG_GLOBAL_ROPE;
    if (d->n_kv_heads != 1 || (d->flags & options) || global_hd || global_kv || d->clip_qkv != 0.0f || d->rope_dim % 2 || d->rope_dim == 0 ||
        d->rope_dim >= hd || d->q_lora > IMG_MAX_DIM || d->kv_lora > IMG_MAX_DIM || d->v_head_dim == 0 ||
        d->v_head_dim > IMG_MAX_DIM)
        return 1;
    d->kv_dim = d->att_dim = d->kv_lora + d->rope_dim; /* both <= 2^24: no wrap */
    d->val_dim = d->kv_lora;
    const uint64_t widths[] = { (uint64_t)H * d->att_dim, (uint64_t)H * d->v_head_dim, d->kv_dim };
    for (unsigned i = 0; i < sizeof widths / sizeof widths[0]; i++)
        if (widths[i] > IMG_MAX_DIM) return 1;
    return 0;
}

/* Group-limited routing: n_group equal groups (at most 64: the router ranks them pairwise), topk_group of
 * them kept, a group scored by its best group_top scores, and enough experts kept for top_k. Without
 * experts: all 1. Nonzero: invalid. */
static int routing_dims(const uint8_t *h, model_dims *d) {
    d->n_group = rd32(h + H_N_GROUP);
    d->topk_group = rd32(h + H_TOPK_GROUP);
    d->group_top = rd32(h + H_GROUP_TOP);
    d->routed_scale = rdf32(h + H_ROUTED_SCALE);
    /* without the routers (n_group 1 already checked) and the expert extras (swiglu_* 0 already checked) neither
     * is read: plain routing and SwiGLU, as their 0 says (the lean build: mechanisms.h) */
    if (!WITH_ROUTERS || !WITH_EXPERT_EXTRAS) return d->topk_group != 1 || d->group_top != 1 || d->routed_scale != 1.0f;
    d->swiglu_alpha = rdf32(h + H_SWIGLU_ALPHA);
    d->swiglu_limit = rdf32(h + H_SWIGLU_LIMIT);
    /* gpt-oss's expert activation: limit and alpha finite and positive, with experts; else both 0 */
    if (d->swiglu_limit != 0.0f || d->swiglu_alpha != 0.0f)
        if (!scale_ok(d->swiglu_limit) || !scale_ok(d->swiglu_alpha) || !d->n_experts) return 1;
    /* top-k then softmax: its own weights, no sigmoid, renormalization or groups */
    if ((d->flags & IMG_FLAG_ROUTER_TOPK_SOFTMAX) &&
        ((d->flags & (IMG_FLAG_ROUTER_SIGMOID | IMG_FLAG_NORM_TOPK)) || d->n_group != 1))
        return 1;
    if (!scale_ok(d->routed_scale) || d->n_group == 0 || d->n_group > IMG_MAX_TOP_K || d->topk_group == 0 || d->topk_group > d->n_group)
        return 1;
    if (!d->n_experts) return d->n_group != 1 || d->topk_group != 1 || d->group_top != 1;
    if (d->n_experts % d->n_group) return 1;
    const uint32_t per_group = d->n_experts / d->n_group;
    return d->group_top == 0 || d->group_top > per_group || d->top_k > d->topk_group * per_group;
}

static colibri_status read_dims(const uint8_t *h, model_dims *d) {
    if (rd32(h + H_ARCH) != IMG_ARCH_MOE) return COLIBRI_E_UNSUPPORTED;
    d->vocab = rd32(h + H_VOCAB);
    d->dim = rd32(h + H_DIM);
    d->ffn = rd32(h + H_FFN);
    d->n_layers = rd32(h + H_LAYERS);
    d->n_heads = rd32(h + H_HEADS);
    d->n_kv_heads = rd32(h + H_KV_HEADS);
    d->head_dim = rd32(h + H_HEAD_DIM);
    d->n_experts = rd32(h + H_EXPERTS);
    d->top_k = rd32(h + H_TOP_K);
    d->max_seq = rd32(h + H_MAX_SEQ);
    d->dense_ffn = rd32(h + H_DENSE_FFN);
    d->shared_ffn = rd32(h + H_SHARED_FFN);
    d->flags = rd32(h + H_FLAGS);
    d->eps = rdf32(h + H_EPS);
    d->clip_qkv = rdf32(h + H_CLIP_QKV);
    d->kv_dtype = rd32(h + H_KV_DTYPE);
    if (d->kv_dtype != KV_F32 && d->kv_dtype != KV_F16) return COLIBRI_E_IMAGE_DTYPE;
    const uint32_t nonzero[] = { d->vocab, d->dim, d->n_layers, d->n_heads, d->n_kv_heads, d->head_dim, d->max_seq };
    for (unsigned i = 0; i < sizeof nonzero / sizeof nonzero[0]; i++)
        if (nonzero[i] == 0 || nonzero[i] > IMG_MAX_DIM) return COLIBRI_E_IMAGE_DIMS;
    const uint32_t maybe_zero[] = { d->ffn, d->n_experts, d->top_k, d->dense_ffn, d->shared_ffn };
    for (unsigned i = 0; i < sizeof maybe_zero / sizeof maybe_zero[0]; i++)
        if (maybe_zero[i] > IMG_MAX_DIM) return COLIBRI_E_IMAGE_DIMS;
    if (d->n_heads % d->n_kv_heads || d->head_dim % 2) return COLIBRI_E_IMAGE_DIMS;
    /* experts: none at all, or a positive count, expert size and 1 <= top_k <= count */
    if (d->n_experts ? (d->top_k == 0 || d->top_k > d->n_experts || d->ffn == 0) : (d->top_k || d->ffn))
        return COLIBRI_E_IMAGE_DIMS;
    if (d->n_experts > IMG_MAX_EXPERTS || d->top_k > IMG_MAX_TOP_K) return COLIBRI_E_IMAGE_DIMS;
    if (!(d->eps > 0.0f && d->eps < 1.0f) || !(d->clip_qkv >= 0.0f && d->clip_qkv < 3.0e38f)) /* rejects NaN */
        return COLIBRI_E_IMAGE_DIMS;
    /* a mechanism the build leaves out (mechanisms.h): its flags and fields are unsupported there */
    if (d->flags & ~BUILD_FLAGS) return COLIBRI_E_UNSUPPORTED;
    if ((!WITH_MLA && rd32(h + H_KV_LORA)) || (!WITH_ROUTERS && rd32(h + H_N_GROUP) != 1) ||
        (!WITH_EXPERT_EXTRAS && (rd32(h + H_SWIGLU_LIMIT) || rd32(h + H_SWIGLU_ALPHA))))
        return COLIBRI_E_UNSUPPORTED;
    if (attention_dims(h, d) || routing_dims(h, d)) return COLIBRI_E_IMAGE_DIMS;
    if (WITH_GEMMA4) { /* Gemma 4's: 0 or a scale; its layer has a dense MLP everywhere, per-layer inputs only in it;
                          * KV sharing only for standard attention (latent attention stores every layer's own rows) */
        d->embed_scale = rdf32(h + H_EMBED_SCALE);
        d->logit_softcap = rdf32(h + H_LOGIT_SOFTCAP);
        d->ple_dim = rd32(h + H_PLE_DIM);
        const uint32_t shared = rd32(h + H_KV_SHARED);
        const int gemma = (d->flags & IMG_FLAG_GEMMA4_LAYER) != 0;
        if (!(d->embed_scale == 0.0f || scale_ok(d->embed_scale)) || !(d->logit_softcap == 0.0f || scale_ok(d->logit_softcap)) ||
            (gemma && !d->dense_ffn) || ((d->ple_dim || shared) && !gemma) || (shared && d->kv_lora) ||
            ((d->flags & IMG_FLAG_DOUBLE_WIDE_MLP) && !shared) ||
            (uint64_t)d->n_layers * d->ple_dim > IMG_MAX_DIM || shared >= d->n_layers || d->dense_ffn > IMG_MAX_DIM / 2)
            return COLIBRI_E_IMAGE_DIMS;
        d->first_shared = d->n_layers - shared;
    } else { /* a build without Gemma 4's mechanisms reads their fields as 0 (none), and no layer shares a KV cache */
        d->first_shared = d->n_layers;
    }
    const uint32_t dense_max = !WITH_GEMMA4 || !(d->flags & IMG_FLAG_DOUBLE_WIDE_MLP) ? d->dense_ffn : 2 * d->dense_ffn;
    d->ffn_max = d->ffn > dense_max ? d->ffn : dense_max;
    if (d->shared_ffn > d->ffn_max) d->ffn_max = d->shared_ffn;
    uint32_t in_max = d->dim > d->q_dim ? d->dim : d->q_dim; /* the longest row: every matrix's columns */
    if (d->ffn_max > in_max) in_max = d->ffn_max;
    if (WITH_MLA || WITH_PER_LAYER_INPUTS) {
        const uint32_t newer_inputs[] = { d->q_lora, d->kv_lora, d->o_dim, d->ple_dim };
        for (unsigned i = 0; i < sizeof newer_inputs / sizeof newer_inputs[0]; i++)
            if (newer_inputs[i] > in_max) in_max = newer_inputs[i];
    }
    d->in_blocks = (in_max + QBLOCK - 1) / QBLOCK;
    if ((d->flags & IMG_FLAG_QK_NORM_HEAD) && (d->flags & IMG_FLAG_QK_NORM_FULL)) return COLIBRI_E_UNSUPPORTED;
    const uint32_t shared = d->flags & (IMG_FLAG_SHARED_EXPERT | IMG_FLAG_SHARED_PLAIN);
    if (shared == (IMG_FLAG_SHARED_EXPERT | IMG_FLAG_SHARED_PLAIN)) return COLIBRI_E_UNSUPPORTED;
    if (!shared != !d->shared_ffn || (d->shared_ffn && !d->n_experts)) return COLIBRI_E_IMAGE_DIMS;
    /* a window: 1 <= W <= max_seq (Gemma 4 keeps a window its sequence never outgrows: its layer kinds differ in
     * more than it) and at least one windowed layer, no bit past the last layer; none: no bit */
    d->window = rd32(h + H_SLIDING_WINDOW);
    uint32_t windowed = 0;
    for (uint32_t i = 0; i < IMG_WINDOW_LAYER_BYTES; i++) {
        d->window_layers[i] = h[H_WINDOW_LAYERS + i];
        for (uint32_t bit = 0; bit < 8; bit++) {
            if (!((d->window_layers[i] >> bit) & 1u)) continue;
            if (8 * i + bit >= d->n_layers) return COLIBRI_E_IMAGE_DIMS;
            windowed++;
        }
    }
    if (d->window ? (d->window > d->max_seq || !windowed) : windowed != 0) return COLIBRI_E_IMAGE_DIMS;
    if (WITH_GEMMA4) { /* the last layer of each kind with a cache of its own: kv_source, found once, not per token */
        d->kv_shared_source[0] = d->kv_shared_source[1] = IMG_NO_INDEX;
        for (uint32_t l = 0; l < d->first_shared; l++) d->kv_shared_source[layer_windowed(d, l)] = l;
        for (uint32_t l = d->first_shared; l < d->n_layers; l++)
            if (kv_source(d, l) == IMG_NO_INDEX) return COLIBRI_E_IMAGE_DIMS; /* no earlier layer of its kind keeps a cache */
    }
    return COLIBRI_OK;
}

/* The (role, layer, expert) the canonical table order puts at index i, and its shape; ndims 0
 * means the slot must be empty. `moe` says whether layer s->layer has routed experts. */
typedef struct { uint32_t role, layer, expert, ndims, dim0, dim1; } tensor_spec;

/* The shape of a slot only the newer families use (MLA's, the router bias, sinks, expert biases; cols stays 0
 * for a vector), and whether this model has it. */
static int newer_shape(const model_dims *d, uint32_t role, int moe, uint32_t *rows, uint32_t *cols) {
    const uint32_t f = d->flags;
    const int mla = d->kv_lora != 0, q_lora = mla && d->q_lora != 0;
    switch (role) {
    case ROLE_WQ_A: *rows = d->q_lora; *cols = d->dim; return q_lora;
    case ROLE_Q_A_NORM: *rows = d->q_lora; return q_lora;
    case ROLE_WQ_B: *rows = d->q_dim; *cols = d->q_lora; return q_lora;
    case ROLE_WKV_A: *rows = d->kv_dim; *cols = d->dim; return mla;
    case ROLE_KV_A_NORM: *rows = d->kv_lora; return mla;
    case ROLE_WK_B: *rows = d->n_heads * d->kv_lora; *cols = d->head_dim - d->rope_dim; return mla;
    case ROLE_WV_B: *rows = d->o_dim; *cols = d->kv_lora; return mla;
    case ROLE_SINKS: *rows = d->n_heads; return (f & IMG_FLAG_ATTN_SINKS) != 0;
    case ROLE_ROUTER_BIAS: *rows = d->n_experts; return moe && (f & IMG_FLAG_ROUTER_BIAS);
    case ROLE_POST_ATTN_NORM: case ROLE_POST_FFN_NORM: *rows = d->dim; return (f & IMG_FLAG_GEMMA4_LAYER) != 0;
    case ROLE_LAYER_SCALE: *rows = 1; return (f & IMG_FLAG_GEMMA4_LAYER) != 0;
    case ROLE_DENSE_POST_NORM: case ROLE_MOE_NORM: case ROLE_MOE_POST_NORM: case ROLE_ROUTER_NORM:
        *rows = d->dim;
        return moe && (f & IMG_FLAG_GEMMA4_LAYER);
    case ROLE_EXPERT_SCALE: *rows = d->n_experts; return moe && (f & IMG_FLAG_GEMMA4_LAYER);
    case ROLE_GLOBAL_ROPE_COS: case ROLE_GLOBAL_ROPE_SIN:
        *rows = d->max_seq;
        *cols = d->global_head_dim / 2;
        return (f & IMG_FLAG_GLOBAL_ROPE) != 0;
    /* Gemma 4's per-layer inputs: L * P <= 2^24 (read_dims) */
    case ROLE_PLE_GATE: *rows = d->ple_dim; *cols = d->dim; return d->ple_dim != 0;
    case ROLE_PLE_PROJ: *rows = d->dim; *cols = d->ple_dim; return d->ple_dim != 0;
    case ROLE_PLE_POST_NORM: *rows = d->dim; return d->ple_dim != 0;
    case ROLE_PLE_EMBD: *rows = d->vocab; *cols = d->n_layers * d->ple_dim; return d->ple_dim != 0;
    case ROLE_PLE_MODEL_PROJ: *rows = d->n_layers * d->ple_dim; *cols = d->dim; return d->ple_dim != 0;
    case ROLE_PLE_PROJ_NORM: *rows = d->ple_dim; return d->ple_dim != 0;
    default: /* ROLE_EXPERT_GATE_BIAS, ROLE_EXPERT_UP_BIAS, ROLE_EXPERT_DOWN_BIAS */
        *rows = d->n_experts;
        *cols = role == ROLE_EXPERT_DOWN_BIAS ? d->dim : d->ffn;
        return moe && (f & IMG_FLAG_EXPERT_BIAS);
    }
}

static void spec_for(const model_dims *d, uint32_t i, int moe, tensor_spec *s) {
    const uint32_t per_layer = LAYER_FIXED + TENSORS_PER_EXPERT * d->n_experts;
    s->layer = s->expert = IMG_NO_INDEX;
    if (i < TENSORS_BEFORE_LAYERS) {
        s->role = ROLE_TOKEN_EMBD + i;
    } else if (i - TENSORS_BEFORE_LAYERS < (uint64_t)per_layer * d->n_layers) {
        uint32_t j = i - TENSORS_BEFORE_LAYERS;
        s->layer = j / per_layer;
        j %= per_layer;
        if (j < LAYER_FIXED) {
            s->role = ROLE_ATTN_NORM + j;
        } else {
            s->expert = (j - LAYER_FIXED) / TENSORS_PER_EXPERT;
            s->role = ROLE_EXPERT_GATE + (j - LAYER_FIXED) % TENSORS_PER_EXPERT;
        }
    } else {
        s->role = ROLE_OUTPUT_NORM + (i - TENSORS_BEFORE_LAYERS - per_layer * d->n_layers);
    }
    const uint32_t D = d->dim, f = d->flags;
    const int mla = WITH_MLA && d->kv_lora != 0, q_lora = mla && d->q_lora != 0; /* WQ, WK, WV go with them */
    const int shared = moe && (f & (IMG_FLAG_SHARED_EXPERT | IMG_FLAG_SHARED_PLAIN)), qk_norm = (f & (IMG_FLAG_QK_NORM_HEAD | IMG_FLAG_QK_NORM_FULL)) != 0;
    const int head_norm = (f & IMG_FLAG_QK_NORM_HEAD) != 0;
    /* the layer's attention widths (Gemma 4's global layers have their own; MLA's WK, WV and their norms are absent) */
    const uint32_t hd = layer_head_dim(d, s->layer), q_dim = d->n_heads * hd, kv_dim = layer_kv_dim(d, s->layer);
    const int k_is_v = WITH_GEMMA4 && (f & IMG_FLAG_K_EQ_V) && !layer_windowed(d, s->layer); /* no WV, no BV */
    const int own_kv = !mla && !layer_kv_shared(d, s->layer); /* a KV-sharing layer has no k or v projection */
    const int dense = !moe || (WITH_GEMMA4 && (f & IMG_FLAG_GEMMA4_LAYER)); /* Gemma 4's MoE layers have it too */
    uint32_t rows = 0, cols = 0, present = 1; /* cols 0: a vector (norm weights, biases) */
    switch (s->role) {
    case ROLE_TOKEN_EMBD: case ROLE_LM_HEAD: rows = d->vocab; cols = D; break;
    case ROLE_ROPE_COS: case ROLE_ROPE_SIN: rows = d->max_seq; cols = d->rope_dim / 2; break;
    case ROLE_ATTN_NORM: case ROLE_FFN_NORM: case ROLE_OUTPUT_NORM: rows = D; break;
    case ROLE_WQ: rows = q_dim; cols = D; present = !q_lora; break;
    case ROLE_WK: case ROLE_WV: rows = kv_dim; cols = D; present = own_kv && !(s->role == ROLE_WV && k_is_v); break;
    case ROLE_WO: rows = D; cols = mla ? d->o_dim : q_dim; break;
    case ROLE_WQ_A: case ROLE_Q_A_NORM: case ROLE_WQ_B: case ROLE_WKV_A: case ROLE_KV_A_NORM: case ROLE_WK_B:
    case ROLE_WV_B: case ROLE_SINKS: case ROLE_ROUTER_BIAS: case ROLE_EXPERT_GATE_BIAS: case ROLE_EXPERT_UP_BIAS:
    case ROLE_EXPERT_DOWN_BIAS: case ROLE_POST_ATTN_NORM: case ROLE_POST_FFN_NORM: case ROLE_DENSE_POST_NORM:
    case ROLE_MOE_NORM: case ROLE_MOE_POST_NORM: case ROLE_ROUTER_NORM: case ROLE_EXPERT_SCALE: case ROLE_LAYER_SCALE:
    case ROLE_GLOBAL_ROPE_COS: case ROLE_GLOBAL_ROPE_SIN: case ROLE_PLE_GATE: case ROLE_PLE_PROJ: case ROLE_PLE_POST_NORM:
    case ROLE_PLE_EMBD: case ROLE_PLE_MODEL_PROJ: case ROLE_PLE_PROJ_NORM:
        present = WITH_NEWER_ROLES && newer_shape(d, s->role, moe, &rows, &cols);
        break;
    case ROLE_BQ: rows = q_dim; present = (f & IMG_FLAG_QKV_BIAS) != 0; break;
    case ROLE_BK: case ROLE_BV: rows = kv_dim; present = (f & IMG_FLAG_QKV_BIAS) && own_kv && !(s->role == ROLE_BV && k_is_v); break;
    case ROLE_BO: rows = D; present = (f & IMG_FLAG_O_BIAS) != 0; break;
    case ROLE_Q_NORM: rows = head_norm ? hd : q_dim; present = qk_norm; break;
    case ROLE_K_NORM: rows = head_norm ? hd : kv_dim; present = qk_norm && !layer_kv_shared(d, s->layer); break;
    case ROLE_DENSE_GATE: case ROLE_DENSE_UP: rows = layer_dense_ffn(d, s->layer); cols = D; present = dense; break;
    case ROLE_DENSE_DOWN: rows = D; cols = layer_dense_ffn(d, s->layer); present = dense; break;
    case ROLE_ROUTER: rows = d->n_experts; cols = D; present = moe; break;
    case ROLE_SHARED_GATE: case ROLE_SHARED_UP: rows = d->shared_ffn; cols = D; present = shared; break;
    case ROLE_SHARED_DOWN: rows = D; cols = d->shared_ffn; present = shared; break;
    case ROLE_SHARED_EXPERT_GATE: rows = 1; cols = D; present = moe && (f & IMG_FLAG_SHARED_EXPERT); break;
    case ROLE_EXPERT_GATE: case ROLE_EXPERT_UP: rows = d->ffn; cols = D; present = moe; break;
    case ROLE_EXPERT_DOWN: rows = D; cols = d->ffn; present = moe; break;
    default: break;
    }
    s->ndims = present ? (cols ? 2u : 1u) : 0u;
    s->dim0 = present ? rows : 0;
    s->dim1 = present ? (cols ? cols : 1u) : 0;
}

/* Bytes of a rows x cols tensor's values in `dtype`, and of its block scales (0 for float dtypes).
 * rows, cols <= 2^24, so nothing here can overflow 64 bits. */
static void tensor_bytes(uint32_t dtype, uint64_t rows, uint64_t cols, uint64_t *values, uint64_t *scales) {
    uint64_t blocks = rows * ((cols + QBLOCK - 1) / QBLOCK);
    *scales = 0;
    switch (dtype) {
    case DTYPE_F32: *values = rows * cols * 4; break;
    case DTYPE_F16: case DTYPE_BF16: *values = rows * cols * 2; break;
    case DTYPE_Q8_0: *values = blocks * QBLOCK; *scales = blocks * 2; break;
    default: *values = blocks * (QBLOCK / 2); *scales = blocks * 2; break; /* DTYPE_Q4_0 */
    }
}

/* Check one table entry against its spec; its bytes must lie in [data_offset, limit). *end is where
 * its bytes (scales included) end. */
static colibri_status check_entry(const uint8_t *e, const tensor_spec *s, uint64_t data_offset,
                                  uint64_t limit, uint64_t *end) {
    if (rd16(e + E_ROLE) != s->role || rd32(e + E_LAYER) != s->layer || rd32(e + E_EXPERT) != s->expert ||
        rd32(e + E_NDIMS) != s->ndims || rd32(e + E_DIM0) != s->dim0 || rd32(e + E_DIM1) != s->dim1 ||
        rd32(e + E_RESERVED) != 0)
        return COLIBRI_E_IMAGE_TABLE;
    uint32_t dtype = rd16(e + E_DTYPE);
    uint64_t off = rd64(e + E_OFFSET), scales_off = rd64(e + E_SCALES_OFFSET);
    if (s->ndims == 0) { /* an empty slot: nothing to read */
        *end = 0;
        return dtype == DTYPE_F32 && off == 0 && rd64(e + E_BYTES) == 0 && rd32(e + E_GROUP) == 0 && scales_off == 0 &&
               rd64(e + E_SCALES_BYTES) == 0 ? COLIBRI_OK : COLIBRI_E_IMAGE_TABLE;
    }
    if (dtype >= DTYPE_COUNT) return COLIBRI_E_IMAGE_DTYPE;
    /* vectors and the tables read as floats (RoPE, expert biases) are f32; any matrix may be narrower */
    const int table = s->role == ROLE_ROPE_COS || s->role == ROLE_ROPE_SIN ||
                      (WITH_EXPERT_EXTRAS && s->role >= ROLE_EXPERT_GATE_BIAS && s->role <= ROLE_EXPERT_DOWN_BIAS) ||
                      (WITH_GEMMA4 && (s->role == ROLE_GLOBAL_ROPE_COS || s->role == ROLE_GLOBAL_ROPE_SIN));
    if (dtype != DTYPE_F32 && (s->ndims != 2 || table))
        return COLIBRI_E_IMAGE_DTYPE;
    const int quantized = dtype == DTYPE_Q8_0 || dtype == DTYPE_Q4_0;
    uint64_t bytes, scales;
    tensor_bytes(dtype, s->dim0, s->dim1, &bytes, &scales);
    if (rd32(e + E_GROUP) != (quantized ? QBLOCK : 0) || rd64(e + E_BYTES) != bytes || rd64(e + E_SCALES_BYTES) != scales)
        return COLIBRI_E_IMAGE_TABLE;
    if (off % IMG_ALIGN || off < data_offset || !add_ok(off, bytes, end) || *end > limit)
        return COLIBRI_E_IMAGE_BOUNDS;
    if (quantized) { /* the scales follow the values directly, so a tensor is one contiguous range */
        uint64_t at;
        if (!align_ok(*end, &at) || scales_off != at || !add_ok(scales_off, scales, end) || *end > limit)
            return COLIBRI_E_IMAGE_BOUNDS;
    } else if (scales_off != 0) {
        return COLIBRI_E_IMAGE_TABLE;
    }
    return COLIBRI_OK;
}

colibri_status image_verify(const uint8_t *img, size_t size, unsigned mode, model_dims *d, const uint8_t **table,
                            colibri_image_info *info) {
    if (!img) return COLIBRI_E_NULL;
    if ((uintptr_t)img % IMG_ALIGN) return COLIBRI_E_BAD_ARG;
    if (size < IMG_HEADER_BYTES) return COLIBRI_E_IMAGE_TRUNCATED;
    for (int i = 0; i < 8; i++)
        if (img[i] != MAGIC[i]) return COLIBRI_E_IMAGE_MAGIC;
    if (rd32(img + H_VERSION) != IMG_VERSION) return COLIBRI_E_IMAGE_VERSION;
    static const uint8_t zero4[4] = { 0 };
    uint32_t crc = colibri_crc32(0, img, H_HEADER_CRC);
    crc = colibri_crc32(crc, zero4, 4);
    crc = colibri_crc32(crc, img + H_HEADER_CRC + 4, IMG_HEADER_BYTES - H_HEADER_CRC - 4);
    if (crc != rd32(img + H_HEADER_CRC)) return COLIBRI_E_IMAGE_HEADER_CRC;

    /* the resident part [0, resident) is read in place; the expert part [resident, image_bytes) is
     * read in place too (mode 0) or only through the fetch hook (IMG_VERIFY_RESIDENT) */
    const int full = !(mode & IMG_VERIFY_RESIDENT);
    uint64_t image_bytes = rd64(img + H_IMAGE_BYTES), resident = rd64(img + H_EXPERT_OFFSET);
    if (resident > image_bytes) return COLIBRI_E_IMAGE_HEADER;
    if ((full ? image_bytes : resident) > size) return COLIBRI_E_IMAGE_TRUNCATED;
    uint64_t table_offset = rd64(img + H_TABLE_OFFSET), data_offset = rd64(img + H_DATA_OFFSET);
    uint64_t crc_offset = rd64(img + H_EXPERT_CRC_OFFSET);
    uint64_t n_tensors = rd32(img + H_N_TENSORS), table_bytes, table_end;
    if (rd32(img + H_HEADER_BYTES) != IMG_HEADER_BYTES || rd32(img + H_ENTRY_BYTES) != IMG_ENTRY_BYTES)
        return COLIBRI_E_IMAGE_HEADER;
    uint32_t expert_align = rd32(img + H_EXPERT_ALIGN);
    if (expert_align == 0 || expert_align % IMG_ALIGN) return COLIBRI_E_IMAGE_HEADER;
    if (table_offset < IMG_HEADER_BYTES || table_offset % IMG_ALIGN || data_offset % IMG_ALIGN || resident % IMG_ALIGN ||
        !mul_ok(n_tensors, IMG_ENTRY_BYTES, &table_bytes) || !add_ok(table_offset, table_bytes, &table_end) ||
        table_end > data_offset || data_offset > resident)
        return COLIBRI_E_IMAGE_HEADER;
    const int sums = !(mode & IMG_VERIFY_NO_CRC), clmul = sums && crc32_cpu_clmul(); /* asked once, not per expert block */
    if (sums && crc32_update(0, img + IMG_HEADER_BYTES, (size_t)(resident - IMG_HEADER_BYTES), clmul) != rd32(img + H_PAYLOAD_CRC))
        return COLIBRI_E_IMAGE_PAYLOAD_CRC;
    /* the host's metadata section (tokenizer, chat template): after every tensor, never read by the runtime */
    uint64_t meta_offset = rd64(img + H_META_OFFSET), meta_bytes = rd64(img + H_META_BYTES), meta_end;
    uint64_t tensors_end = image_bytes; /* where tensor bytes must end */
    if (meta_bytes) {
        if (meta_offset % IMG_ALIGN || meta_offset < resident || !add_ok(meta_offset, meta_bytes, &meta_end) ||
            meta_end > image_bytes)
            return COLIBRI_E_IMAGE_HEADER;
        if (full && sums && crc32_update(0, img + meta_offset, (size_t)meta_bytes, clmul) != rd32(img + H_META_CRC))
            return COLIBRI_E_IMAGE_PAYLOAD_CRC;
        tensors_end = meta_offset;
    } else if (meta_offset || rd32(img + H_META_CRC)) {
        return COLIBRI_E_IMAGE_HEADER;
    }

    model_dims dims = { 0 }; /* a field no mechanism of the image (or of the build) sets is 0: none */
    colibri_status st = read_dims(img, &dims);
    if (st) return st;
    /* after read_dims, so that the lean build names a Gemma 4 image unsupported: its fields are reserved there */
    for (uint32_t i = WITH_GEMMA4 ? H_RESERVED : H_GLOBAL_HEAD_DIM; i < IMG_HEADER_BYTES; i++)
        if (img[i]) return COLIBRI_E_IMAGE_HEADER;
    uint64_t per_layer = LAYER_FIXED + (uint64_t)TENSORS_PER_EXPERT * dims.n_experts;
    if (n_tensors != TENSORS_BEFORE_LAYERS + per_layer * dims.n_layers + TENSORS_AFTER_LAYERS) return COLIBRI_E_IMAGE_TABLE;
    dims.n_tensors = (uint32_t)n_tensors;
    /* the expert CRC table: one u32 per (layer, expert), between the tensor table and the data */
    uint64_t crc_end; /* the table's bytes, < 2^24 * 2^10 * 4, fit; the offset plus them may wrap */
    if (dims.n_experts ? (crc_offset % IMG_ALIGN || crc_offset < table_end ||
                          !add_ok(crc_offset, 4ull * dims.n_layers * dims.n_experts, &crc_end) || crc_end > data_offset)
                       : crc_offset != 0)
        return COLIBRI_E_IMAGE_HEADER;
    dims.resident_bytes = resident;
    dims.expert_crc_offset = crc_offset; /* expert_block_max and streamed_experts: 0 so far */

    uint64_t prev_end = 0, block_start = 0;
    int moe = 0;
    for (uint32_t i = 0; i < n_tensors; i++) {
        tensor_spec s;
        spec_for(&dims, i, moe, &s);
        if (s.role == ROLE_ATTN_NORM) { /* a new layer: its kind is whether its router slot is filled */
            moe = tensor_present(img + table_offset, i + (ROLE_ROUTER - ROLE_ATTN_NORM));
            if (moe ? !dims.n_experts : !dims.dense_ffn) return COLIBRI_E_IMAGE_TABLE;
        }
        const uint8_t *e = img + table_offset + (uint64_t)i * IMG_ENTRY_BYTES;
        const int routed = s.role == ROLE_EXPERT_GATE || s.role == ROLE_EXPERT_UP || s.role == ROLE_EXPERT_DOWN;
        uint64_t end, aligned_prev;
        st = check_entry(e, &s, data_offset, routed ? tensors_end : resident, &end);
        if (st) return st;
        /* the up and down matrices of a SwiGLU block follow its gate matrix directly: one read covers it */
        const int follows = s.role == ROLE_EXPERT_UP || s.role == ROLE_EXPERT_DOWN || s.role == ROLE_SHARED_UP ||
                            s.role == ROLE_SHARED_DOWN || s.role == ROLE_DENSE_UP || s.role == ROLE_DENSE_DOWN;
        if (follows && s.ndims && (!align_ok(prev_end, &aligned_prev) || rd64(e + E_OFFSET) != aligned_prev))
            return COLIBRI_E_IMAGE_BOUNDS;
        prev_end = end;
        if (s.role == ROLE_EXPERT_GATE && s.ndims) block_start = rd64(e + E_OFFSET);
        if (s.role == ROLE_EXPERT_DOWN && s.ndims) { /* a routed expert's block: wholly in one tier */
            const int streamed = block_start >= resident;
            if (!streamed && end > resident) return COLIBRI_E_IMAGE_BOUNDS;
            if (end - block_start > dims.expert_block_max) dims.expert_block_max = end - block_start;
            dims.streamed_experts += (uint32_t)streamed;
            if (sums && (full || !streamed)) { /* addressable now: check it now (a streamed one is checked when fetched) */
                uint32_t want = rd32(img + crc_offset + 4ull * ((uint64_t)s.layer * dims.n_experts + s.expert));
                if (crc32_update(0, img + block_start, (size_t)(end - block_start), clmul) != want) return COLIBRI_E_EXPERT_CRC;
            }
        }
    }

    uint64_t arena;
    st = arena_plan(&dims, 0, 0, &arena);
    if (st) return st;
    dims.prefill_token_bytes = batch_plan(&dims, 1, 0, 0, 0);
    if (rd64(img + H_ARENA_BYTES) != arena) return COLIBRI_E_IMAGE_PLAN;

    if (d) *d = dims;
    if (table) *table = img + table_offset;
    if (info) {
        info->format_version = IMG_VERSION;
        info->image_bytes = image_bytes;
        info->arena_bytes = arena;
        info->payload_crc32 = rd32(img + H_PAYLOAD_CRC);
        info->vocab_size = dims.vocab;
        info->hidden_size = dims.dim;
        info->ffn_size = dims.ffn;
        info->n_layers = dims.n_layers;
        info->n_heads = dims.n_heads;
        info->n_kv_heads = dims.n_kv_heads;
        info->head_dim = dims.head_dim;
        info->n_experts = dims.n_experts;
        info->top_k = dims.top_k;
        info->max_seq = dims.max_seq;
        info->resident_bytes = resident;
        info->expert_block_bytes = dims.expert_block_max;
        info->streamed_experts = dims.streamed_experts;
        info->expert_cache_min = dims.top_k < dims.streamed_experts ? dims.top_k : dims.streamed_experts;
        info->prefill_token_bytes = dims.prefill_token_bytes;
    }
    return COLIBRI_OK;
}

void expert_block(const colibri_ctx *c, uint32_t layer, uint32_t expert, uint64_t *offset, uint64_t *bytes) {
    const tensor_ref *gate = &c->a.tensors[expert_tensor_index(&c->d, layer, expert, ROLE_EXPERT_GATE)];
    const tensor_ref *down = gate + 2; /* up and down follow the gate: one contiguous block */
    uint64_t values, scales;
    tensor_bytes(down->dtype, down->rows, down->cols, &values, &scales);
    *offset = gate->offset;
    *bytes = (down->scales ? down->scales + scales : down->offset + values) - gate->offset;
}

colibri_status colibri_image_verify(const void *image, size_t size, colibri_image_info *info) {
    return image_verify(image, size, 0, 0, 0, info);
}

colibri_status colibri_image_inspect(const void *image, size_t size, colibri_image_info *info) {
    return image_verify(image, size, IMG_VERIFY_NO_CRC, 0, 0, info);
}
