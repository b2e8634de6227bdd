/* The image verifier: the header and the model's dimensions; the tensor table's walk is table.c's. Every byte a
 * later call reads is checked first. Layout: docs/FORMAT.md. All size arithmetic is 64-bit and overflow-checked. */
#include "internal.h"

uint16_t rd16(const uint8_t *p) { return (uint16_t)(p[0] | p[1] << 8); }

uint32_t rd32(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

uint64_t rd64(const uint8_t *p) { return (uint64_t)rd32(p) | (uint64_t)rd32(p + 4) << 32; }

static float rdf32(const uint8_t *p) {
    union { uint32_t u; float f; } v = { rd32(p) };
    return v.f;
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
    /* after read_dims, so that the lean build names a Gemma 4 image unsupported: its fields are reserved there */
    for (uint32_t i = WITH_GEMMA4 ? H_RESERVED : H_GLOBAL_HEAD_DIM; i < IMG_HEADER_BYTES; i++)
        if (img[i]) return COLIBRI_E_IMAGE_HEADER;
    /* the dense index open() fills from the table: every layer's slots, present or not (< 2^32 of them) */
    const uint64_t dense = TENSORS_BEFORE_LAYERS + (LAYER_FIXED + (uint64_t)TENSORS_PER_EXPERT * dims.n_experts) * dims.n_layers +
                           TENSORS_AFTER_LAYERS;
    if (dense > UINT32_MAX) return COLIBRI_E_IMAGE_DIMS;
    dims.n_tensors = (uint32_t)dense;
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
