/* The image verifier: the header and the model's dimensions; the tensor table's walk is table.c's. Every byte a
 * later call reads is checked first. Layout: docs/FORMAT.md. All size arithmetic is 64-bit and overflow-checked. */
#include "internal.h"

uint16_t rd16(const uint8_t *p) { return (uint16_t)(p[0] | p[1] << 8); }

uint32_t rd32(const uint8_t *p) { return le32(p); }

uint64_t rd64(const uint8_t *p) { return (uint64_t)rd32(p) | (uint64_t)rd32(p + 4) << 32; }

static float rdf32(const uint8_t *p) {
    union { uint32_t u; float f; } v = { le32(p) };
    return v.f;
}

/* A scale the math multiplies by: finite and positive (rejects NaN). */
static int scale_ok(float s) { return s > 0.0f && s < 3.0e38f; }

/* The options a KV-sharing layer and its source must agree on: those of its attention, and how RoPE turns the keys. */
#define ATTENTION_OPTIONS (LAYER_STANDARD_OPTIONS | LAYER_OPT_ROPE_PAIRS)

/* The record's fields that take a table's values: offset, how many, those this build computes as a mask (format.h). */
#define ENUM_ROW(offset, count, lean) { offset, count, BUILD_VALUES(count, lean) },
static const struct { uint8_t offset, count, built; } LAYER_ENUMS[] = { IMG_LAYER_ENUMS(ENUM_ROW) };

/* The layers' kinds (docs/FORMAT.md "Layers"): each record resolved (a 0 is the header's value) and checked on its
 * own, then each layer's kind and the KV cache it reads. Sets the widest head and dense MLP of any layer, the window,
 * the global RoPE tables' head size and the ring windowed sharing layers read. A record with a value or option the
 * build leaves out is COLIBRI_E_UNSUPPORTED; any other invalid one COLIBRI_E_IMAGE_DIMS. */
static colibri_status layer_kinds(const uint8_t *h, model_dims *d) {
    const uint32_t n_kinds = le32(h + H_LAYER_KINDS), mla = d->kv_lora != 0;
    if (n_kinds == 0 || n_kinds > IMG_MAX_LAYER_KINDS || d->n_layers > IMG_MAX_LAYERS) return COLIBRI_E_IMAGE_DIMS;
    d->att_dim = d->head_dim;
    for (uint32_t k = 0; k < n_kinds; k++) {
        const uint8_t *r = h + H_KINDS + k * IMG_LAYER_BYTES;
        for (unsigned i = 0; i < sizeof LAYER_ENUMS / sizeof LAYER_ENUMS[0]; i++) {
            if (r[LAYER_ENUMS[i].offset] >= LAYER_ENUMS[i].count) return COLIBRI_E_IMAGE_DIMS;
            if (!(LAYER_ENUMS[i].built >> r[LAYER_ENUMS[i].offset] & 1)) return COLIBRI_E_UNSUPPORTED;
        }
        layer_kind *t = &d->kinds[k];
        const uint32_t hd = le32(r + R_HEAD_DIM), kv = le32(r + R_KV_HEADS), fd = le32(r + R_DENSE_FFN);
        const uint32_t options = t->options = le32(r + R_OPTIONS), window = t->window = le32(r + R_WINDOW);
        t->kv_source = le32(r + R_KV_SOURCE);
        if ((options & ~LAYER_KNOWN_OPTIONS) || rd16(r + R_RESERVED)) return COLIBRI_E_IMAGE_DIMS;
        /* what the build leaves out: an option, or Gemma 4's geometry of its own and shared cache */
        if ((options & ~BUILD_OPTIONS) || (!WITH_GEMMA4 && (hd | kv || t->kv_source != IMG_NO_INDEX)))
            return COLIBRI_E_UNSUPPORTED;
        const uint32_t ffn = t->ffn = r[R_FFN];
        if (WITH_SHORT_CONV || WITH_DELTA_NET) t->attention = r[R_ATTENTION]; /* (the lean build's is every layer's) */
        const int conv = (WITH_SHORT_CONV && t->attention == LAYER_ATTN_SHORT_CONV) ||
                         (WITH_DELTA_NET && t->attention == LAYER_ATTN_DELTA_NET); /* a state, no KV cache */
        t->router = r[R_ROUTER];
        t->activation = r[R_ACTIVATION];
        t->qk_norm = r[R_QK_NORM];
        t->shared = r[R_SHARED];
        t->dense_ffn = ffn == LAYER_FFN_MOE ? 0 : fd ? fd : d->dense_ffn;
        /* latent attention is every layer's; the feed-forward block: experts need E > 0 and come with their router,
         * options and shared expert (one exactly when the header sizes it), a dense MLP needs a width (and no other
         * layer one); gpt-oss's top-k softmax weighs its own way */
        if ((conv ? mla : r[R_ATTENTION] != (mla ? LAYER_ATTN_LATENT : LAYER_ATTN_STANDARD)) ||
            (ffn == LAYER_FFN_DENSE ? (t->router | t->shared || (options & LAYER_EXPERT_OPTIONS))
                                    : (!d->n_experts || !t->shared != !d->shared_ffn)) ||
            (ffn == LAYER_FFN_MOE ? fd != 0 : t->dense_ffn == 0) || fd > IMG_MAX_DIM ||
            (WITH_ROUTERS && t->router == LAYER_ROUTER_TOPK_SOFTMAX && ((options & LAYER_OPT_NORM_TOPK) || le32(h + H_N_GROUP) != 1)))
            return COLIBRI_E_IMAGE_DIMS;
        /* a window: 1 <= W <= max_seq, the same W in every windowed layer */
        if (window > d->max_seq || (window && d->window && window != d->window)) return COLIBRI_E_IMAGE_DIMS;
        if (window) d->window = window;
        if (t->dense_ffn > d->ffn_max) d->ffn_max = t->dense_ffn;
        /* a geometry of its own, attention's options and cache sharing: standard attention's; a head of its own size
         * rotates with the global tables, all of one size */
        t->head_dim = hd ? hd : d->head_dim;
        t->kv_heads = kv ? kv : d->n_kv_heads;
        /* a short convolution or a DeltaNet: none of attention's geometry, options, norms, window or cache */
        if (conv && ((options & LAYER_STANDARD_OPTIONS) || t->qk_norm || hd | kv || window || t->kv_source != IMG_NO_INDEX))
            return COLIBRI_E_IMAGE_DIMS;
        if (!WITH_GEMMA4) continue; /* the header's geometry (a record of its own: refused above) */
        if (WITH_MLA && mla) {
            if (hd | kv || (options & LAYER_STANDARD_OPTIONS) || t->qk_norm || t->kv_source != IMG_NO_INDEX) return COLIBRI_E_IMAGE_DIMS;
            continue;
        }
        const int global_rope = (options & LAYER_OPT_GLOBAL_ROPE) != 0;
        if (t->head_dim % 2 || t->head_dim > IMG_MAX_DIM || t->kv_heads > IMG_MAX_DIM || d->n_heads % t->kv_heads ||
            (!global_rope && t->head_dim != d->head_dim) || (global_rope && d->global_head_dim && t->head_dim != d->global_head_dim))
            return COLIBRI_E_IMAGE_DIMS;
        if (global_rope) d->global_head_dim = t->head_dim;
        if (t->head_dim > d->att_dim) d->att_dim = t->head_dim; /* the widest head (MLA's is set after) */
    }
    /* each layer's kind; a sharing layer's source comes before it, keeps its own cache of the same geometry and options, and
     * every windowed sharing layer reads one ring (the one a prefill pass's saved rows stand for: arena.c) */
    d->shared_ring = IMG_NO_INDEX;
    uint32_t used = 0, convs = 0, deltas = 0; /* every record is some layer's kind: none adds a window or a width no
                                               * layer has */
    for (uint32_t l = 0; l < IMG_MAX_LAYERS; l++) { /* (and the bytes past the last layer's are 0) */
        const uint8_t kind = h[H_LAYER_KIND + l];
        if (l >= d->n_layers) {
            if (kind) return COLIBRI_E_IMAGE_DIMS;
            continue;
        }
        if ((d->kind_of[l] = kind) >= n_kinds) return COLIBRI_E_IMAGE_DIMS;
        used |= 1u << kind;
        const layer_kind *t = kind_of(d, l);
        convs += layer_conv(d, l);
        deltas += layer_delta(d, l);
        if (WITH_DELTA_NET) d->options_any |= t->options; /* (read by the plan only for ATTN_GATE) */
        const uint32_t src = t->kv_source;
        if (!WITH_GEMMA4 || src == IMG_NO_INDEX) continue;
        const layer_kind *s = kind_of(d, src < l ? src : l);
        if (src >= l || s->kv_source != IMG_NO_INDEX || s->attention != t->attention || s->head_dim != t->head_dim || s->kv_heads != t->kv_heads ||
            s->window != t->window || ((s->options ^ t->options) & ATTENTION_OPTIONS) || (t->window && d->shared_ring != IMG_NO_INDEX && d->shared_ring != src))
            return COLIBRI_E_IMAGE_DIMS;
        if (t->window) d->shared_ring = src;
    }
    /* and the bytes past the records are 0: one model, one header */
    for (uint32_t i = H_KINDS + n_kinds * IMG_LAYER_BYTES; i < H_KINDS + IMG_MAX_LAYER_KINDS * IMG_LAYER_BYTES; i++)
        if (h[i]) return COLIBRI_E_IMAGE_DIMS;
    /* a kernel size exactly when some layer convolves (the x, b and c rows fit a shape term); a DeltaNet's geometry
     * exactly when some layer is one, its value heads a multiple of its key heads, its widths shape terms */
    const uint32_t Hk = d->dn_k_heads, Hv = d->dn_v_heads, dk = d->dn_k_dim, dv = d->dn_v_dim;
    const uint64_t dn_conv = 2ull * Hk * dk + (uint64_t)Hv * dv, dn_mix = dn_conv + 2ull * Hv * dv + 2ull * Hv;
    if ((WITH_SHORT_CONV || WITH_DELTA_NET) && (!(convs | deltas) != !d->conv_kernel || (convs && 3ull * d->dim > IMG_MAX_DIM)))
        return COLIBRI_E_IMAGE_DIMS;
    if (WITH_DELTA_NET && (deltas ? !(Hk && dk && dv && Hv && Hv % Hk == 0 && dn_mix <= IMG_MAX_DIM) : (Hk | Hv | dk | dv) != 0))
        return COLIBRI_E_IMAGE_DIMS;
    d->dn_conv = deltas ? (uint32_t)dn_conv : 0;
    const uint64_t conv_mix = convs ? 3ull * d->dim : 0, delta_mix = deltas ? dn_mix : 0; /* both <= 2^24 */
    d->mix_dim = (uint32_t)(conv_mix > delta_mix ? conv_mix : delta_mix);
    return used != (1u << n_kinds) - 1 ? COLIBRI_E_IMAGE_DIMS : COLIBRI_OK;
}

/* The attention's widths, after layer_kinds. Standard attention: RoPE over a head's first rope_dim dims, values a head
 * wide. MLA:
 * one latent shared by every head (n_kv_heads 1), RoPE on the last rope_dim dims of a q/k head, no clipping (nor the
 * options standard attention has: layer_kinds). Nonzero: the dimensions are invalid. */
static int attention_dims(const uint8_t *h, model_dims *d) {
    d->q_lora = le32(h + H_Q_LORA);
    d->rope_dim = le32(h + H_ROPE_DIM);
    d->v_head_dim = le32(h + H_V_HEAD_DIM);
    d->attn_scale = rdf32(h + H_ATTN_SCALE);
    const uint32_t hd = d->head_dim, H = d->n_heads, widest = d->att_dim;
    if (!scale_ok(d->attn_scale) || (uint64_t)H * widest > IMG_MAX_DIM) return 1;
    d->q_dim = H * widest;
    d->o_dim = H * d->v_head_dim; /* checked below */
    if (!WITH_MLA || d->kv_lora == 0) { /* without them, read_dims refuses kv_lora > 0 */
        d->kv_dim = WITH_GEMMA4 ? 0 : d->n_kv_heads * hd; /* the widest K row (Gemma 4: its layers, which may differ) */
        for (uint32_t l = 0; WITH_GEMMA4 && l < d->n_layers; l++) /* each <= n_heads * widest */
            if (layer_kv_dim(d, l) > d->kv_dim) d->kv_dim = layer_kv_dim(d, l);
        d->val_dim = widest;
        /* RoPE turns a head's first rope_dim dims (all of it but in Qwen3.5's), or with GLOBAL_ROPE a whole head with
         * the table of the layer's head size (layer_kinds) */
        return d->q_lora || d->rope_dim == 0 || d->rope_dim > hd || d->rope_dim % 2 || d->v_head_dim != hd;
    }
    if (d->n_kv_heads != 1 || d->clip_qkv != 0.0f || d->rope_dim % 2 || d->rope_dim == 0 ||
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
    d->n_group = le32(h + H_N_GROUP);
    d->topk_group = le32(h + H_TOPK_GROUP);
    d->group_top = le32(h + H_GROUP_TOP);
    d->routed_scale = rdf32(h + H_ROUTED_SCALE);
    /* without the routers (n_group 1 already checked) and the expert extras (swiglu_* 0 already checked) neither
     * is read: plain routing and SwiGLU, as their 0 says (the lean build: mechanisms.h) */
    if (!WITH_ROUTERS || !WITH_EXPERT_EXTRAS) return d->topk_group != 1 || d->group_top != 1 || d->routed_scale != 1.0f;
    d->swiglu_alpha = rdf32(h + H_SWIGLU_ALPHA);
    d->swiglu_limit = rdf32(h + H_SWIGLU_LIMIT);
    /* gpt-oss's expert activation: limit and alpha finite and positive, with experts; else both 0 */
    if (d->swiglu_limit != 0.0f || d->swiglu_alpha != 0.0f)
        if (!scale_ok(d->swiglu_limit) || !scale_ok(d->swiglu_alpha) || !d->n_experts) return 1;
    if (!scale_ok(d->routed_scale) || d->n_group == 0 || d->n_group > IMG_MAX_TOP_K || d->topk_group == 0 || d->topk_group > d->n_group)
        return 1;
    if (!d->n_experts) return d->n_group != 1 || d->topk_group != 1 || d->group_top != 1;
    if (d->n_experts % d->n_group) return 1;
    const uint32_t per_group = d->n_experts / d->n_group;
    return d->group_top == 0 || d->group_top > per_group || d->top_k > d->topk_group * per_group;
}

static colibri_status read_dims(const uint8_t *h, model_dims *d) {
    if (le32(h + H_ARCH) != IMG_ARCH_MOE) return COLIBRI_E_UNSUPPORTED;
    d->vocab = le32(h + H_VOCAB);
    d->dim = le32(h + H_DIM);
    d->ffn = le32(h + H_FFN);
    d->n_layers = le32(h + H_LAYERS);
    d->n_heads = le32(h + H_HEADS);
    d->n_kv_heads = le32(h + H_KV_HEADS);
    d->head_dim = le32(h + H_HEAD_DIM);
    d->n_experts = le32(h + H_EXPERTS);
    d->top_k = le32(h + H_TOP_K);
    d->max_seq = le32(h + H_MAX_SEQ);
    d->dense_ffn = le32(h + H_DENSE_FFN);
    d->shared_ffn = le32(h + H_SHARED_FFN);
    d->eps = rdf32(h + H_EPS);
    d->clip_qkv = rdf32(h + H_CLIP_QKV);
    d->kv_dtype = le32(h + H_KV_DTYPE);
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
    /* a mechanism the build leaves out (mechanisms.h): its fields are unsupported there (its records': layer_kinds) */
    if ((!WITH_MLA && le32(h + H_KV_LORA)) || (!WITH_ROUTERS && le32(h + H_N_GROUP) != 1) ||
        (!WITH_EXPERT_EXTRAS && (le32(h + H_SWIGLU_LIMIT) || le32(h + H_SWIGLU_ALPHA))))
        return COLIBRI_E_UNSUPPORTED;
    d->kv_lora = WITH_MLA ? le32(h + H_KV_LORA) : 0;
    d->conv_kernel = WITH_SHORT_CONV || WITH_DELTA_NET ? le32(h + H_CONV_KERNEL) : 0; /* without: 0 (unsupported) */
    if (WITH_DELTA_NET) {
        d->dn_k_heads = rd16(h + H_DN_K_HEADS);
        d->dn_v_heads = rd16(h + H_DN_V_HEADS);
        d->dn_k_dim = rd16(h + H_DN_K_DIM);
        d->dn_v_dim = rd16(h + H_DN_V_DIM);
    }
    if (d->conv_kernel == 1 || d->conv_kernel > IMG_MAX_CONV_KERNEL) return COLIBRI_E_IMAGE_DIMS;
    /* the top-k renormalization's epsilon: with experts, 0 <= eps < 1 (rejects NaN); else 0 */
    d->topk_norm_eps = rdf32(h + H_TOPK_NORM_EPS);
    if (d->n_experts ? !(d->topk_norm_eps >= 0.0f && d->topk_norm_eps < 1.0f) : le32(h + H_TOPK_NORM_EPS) != 0)
        return COLIBRI_E_IMAGE_DIMS;
    if (d->shared_ffn && !d->n_experts) return COLIBRI_E_IMAGE_DIMS;
    const colibri_status st = layer_kinds(h, d);
    if (st) return st;
    if (attention_dims(h, d) || routing_dims(h, d)) return COLIBRI_E_IMAGE_DIMS;
    if (WITH_GEMMA4) { /* Gemma 4's: 0 or a scale; per-layer inputs */
        d->embed_scale = rdf32(h + H_EMBED_SCALE);
        d->logit_softcap = rdf32(h + H_LOGIT_SOFTCAP);
        d->ple_dim = le32(h + H_PLE_DIM);
        if (!(d->embed_scale == 0.0f || scale_ok(d->embed_scale)) || !(d->logit_softcap == 0.0f || scale_ok(d->logit_softcap)) ||
            (uint64_t)d->n_layers * d->ple_dim > IMG_MAX_DIM)
            return COLIBRI_E_IMAGE_DIMS;
    }
    if (d->ffn > d->ffn_max) d->ffn_max = d->ffn; /* layer_kinds set the widest dense MLP of the records */
    if (d->dense_ffn > d->ffn_max) d->ffn_max = d->dense_ffn;
    if (d->shared_ffn > d->ffn_max) d->ffn_max = d->shared_ffn;
    uint32_t in_max = d->dim > d->q_dim ? d->dim : d->q_dim; /* the longest row: every matrix's columns */
    if (d->ffn_max > in_max) in_max = d->ffn_max;
    if (WITH_MLA || WITH_PER_LAYER_INPUTS) {
        const uint32_t newer_inputs[] = { d->q_lora, d->kv_lora, d->o_dim, d->ple_dim, d->dn_v_heads * d->dn_v_dim };
        for (unsigned i = 0; i < sizeof newer_inputs / sizeof newer_inputs[0]; i++)
            if (newer_inputs[i] > in_max) in_max = newer_inputs[i];
    }
    d->in_blocks = (in_max + QBLOCK - 1) / QBLOCK;
    return COLIBRI_OK;
}


colibri_status image_verify(const uint8_t *img, size_t size, unsigned mode, model_dims *d, colibri_image_info *info) {
    if (!img) return COLIBRI_E_NULL;
    if ((uintptr_t)img % IMG_ALIGN) return COLIBRI_E_BAD_ARG;
    if (size < IMG_HEADER_BYTES) return COLIBRI_E_IMAGE_TRUNCATED;
    if (rd64(img + H_MAGIC) != IMG_MAGIC) return COLIBRI_E_IMAGE_MAGIC;
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
    /* the reserved bytes are 0; in the lean build so are Gemma 4's and the short convolutions' fields, which come just
     * before */
    _Static_assert(H_LOGIT_SOFTCAP == H_EMBED_SCALE + 4 && H_PLE_DIM == H_EMBED_SCALE + 8 &&
                       H_CONV_KERNEL == H_EMBED_SCALE + 12 && H_DN_K_HEADS == H_EMBED_SCALE + 16 &&
                       H_RESERVED == H_EMBED_SCALE + 24,
                   "Gemma 4's, the convolutions' and the DeltaNets' header fields are those before the reserved bytes");
    _Static_assert(WITH_GEMMA4 == WITH_SHORT_CONV && WITH_SHORT_CONV == WITH_DELTA_NET, "one build leaves out all");
    for (uint32_t i = WITH_GEMMA4 ? H_RESERVED : H_EMBED_SCALE; i < IMG_HEADER_BYTES; i++)
        if (img[i]) return i < H_RESERVED ? COLIBRI_E_UNSUPPORTED : COLIBRI_E_IMAGE_HEADER;
    /* the dense index open() fills from the table: every layer's slots, present or not (the caps on layers and
     * experts keep it far below 2^32) */
    _Static_assert(TENSORS_BEFORE_LAYERS + (LAYER_FIXED + TENSORS_PER_EXPERT * (uint64_t)IMG_MAX_EXPERTS) * IMG_MAX_LAYERS +
                       TENSORS_AFTER_LAYERS < UINT32_MAX / 2, "the dense index fits a u32");
    dims.n_tensors = TENSORS_BEFORE_LAYERS + (LAYER_FIXED + TENSORS_PER_EXPERT * dims.n_experts) * dims.n_layers +
                     TENSORS_AFTER_LAYERS;
    dims.n_entries = (uint32_t)n_tensors;
    /* the expert CRC table: one u32 per (layer, expert), between the tensor table and the data */
    uint64_t crc_end; /* the table's bytes, < 2^24 * 2^10 * 4, fit; the offset plus them may wrap */
    if (dims.n_experts ? (crc_offset % IMG_ALIGN || crc_offset < table_end ||
                          !add_ok(crc_offset, 4ull * dims.n_layers * dims.n_experts, &crc_end) || crc_end > data_offset)
                       : crc_offset != 0)
        return COLIBRI_E_IMAGE_HEADER;
    dims.resident_bytes = resident;
    dims.expert_crc_offset = crc_offset;

    dims.table_offset = table_offset;
    dims.data_offset = data_offset;
    dims.tensors_end = tensors_end;
    st = table_walk(img, &dims, mode, 0);
    if (st) return st;

    uint64_t arena;
    st = arena_plan(&dims, 0, 0, &arena);
    if (st) return st;
    dims.prefill_token_bytes = batch_plan(&dims, 1, 0, 0, 0);
    if (rd64(img + H_ARENA_BYTES) != arena) return COLIBRI_E_IMAGE_PLAN;

    if (d) *d = dims;
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


colibri_status colibri_image_verify(const void *image, size_t size, colibri_image_info *info) {
    return image_verify(image, size, 0, 0, info);
}

colibri_status colibri_image_inspect(const void *image, size_t size, colibri_image_info *info) {
    return image_verify(image, size, IMG_VERIFY_NO_CRC, 0, info);
}
