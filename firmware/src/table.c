/* The tensor table's checks: each role's shape and presence and each dtype's storage (format/schema.toml's tables),
 * a layer's facts and shape terms, the dense index, and the walk that checks every entry against its slot. Layout:
 * docs/FORMAT.md "Tensor table". All size arithmetic is 64-bit and overflow-checked. */
#include "internal.h"

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

/* Each role's shape and presence, from format/schema.toml: rows and columns as terms (TERM_NONE: a vector), the
 * condition its presence needs (facts needed and refused), and its IMG_ROLE_* attributes. */
#define CONDITION_ROW(need, deny) { need, deny },
#define ROLE_ROW(role, rows, cols, when, attrs) { rows, cols, when, attrs },
static const struct { uint32_t need, deny; } CONDITIONS[] = { IMG_CONDITIONS(CONDITION_ROW) };
static const struct { uint8_t rows, cols, when, attrs; } ROLE_SPECS[] = { IMG_ROLE_SPECS(ROLE_ROW) }; /* [role - 1] */

uint32_t kv_rows(const model_dims *d, uint32_t layer) {
    if (layer_conv(d, layer) || layer_delta(d, layer)) return 0; /* no KV cache: a state (blocks/state.c) */
    return layer_windowed(d, layer) ? d->window : d->max_seq;
}

/* A layer's facts (format/schema.toml [[fact]]): what a role's presence tests, its record's options and what its
 * record and the header say beside them. The global tensors' roles test the model-wide facts only (any layer's
 * facts hold those). */
static uint32_t layer_facts(const model_dims *d, uint32_t layer) {
    const layer_kind *k = kind_of(d, layer);
    const int mla = WITH_MLA && d->kv_lora != 0, kv_shared = layer_kv_shared(d, layer), moe = k->ffn != LAYER_FFN_DENSE;
    uint32_t facts = k->options;
    if (moe) facts |= IMG_FACT_MOE;
    if (k->ffn != LAYER_FFN_MOE) facts |= IMG_FACT_DENSE;
    if (mla) facts |= IMG_FACT_MLA | (d->q_lora ? IMG_FACT_Q_LORA : 0);
    if (layer_conv(d, layer)) facts |= IMG_FACT_CONV;
    else if (layer_delta(d, layer)) facts |= IMG_FACT_DELTA;
    else if (!mla && !kv_shared) facts |= IMG_FACT_OWN_KV;
    if (k->qk_norm) facts |= IMG_FACT_QK_NORM;
    if (kv_shared) facts |= IMG_FACT_KV_SHARED;
    if (k->shared) facts |= IMG_FACT_SHARED_FFN; /* a dense layer has none: layer_kinds */
    if (k->shared == LAYER_SHARED_GATED) facts |= IMG_FACT_SHARED_GATED;
    if (WITH_GEMMA4 && d->global_head_dim) facts |= IMG_FACT_GLOBAL_ROPE_TABLES;
    if (d->ple_dim) facts |= IMG_FACT_PLE;
    return facts;
}

/* The numbers a layer's tensor shapes are made of (format/schema.toml [[term]]), each <= 2^24 (read_dims). */
static void shape_terms(const model_dims *d, uint32_t layer, uint32_t t[TERM_COUNT]) {
    _Static_assert(TERM_COUNT == 30, "shape_terms sets every term of format/schema.toml");
    const uint32_t hd = layer_head_dim(d, layer), q_dim = d->n_heads * hd, kv_dim = layer_kv_dim(d, layer);
    const int head_norm = kind_of(d, layer)->qk_norm == LAYER_QK_NORM_HEAD, mla = WITH_MLA && d->kv_lora != 0;
    t[TERM_NONE] = 0;
    t[TERM_ONE] = 1;
    t[TERM_V] = d->vocab;
    t[TERM_D] = d->dim;
    t[TERM_S] = d->max_seq;
    t[TERM_H] = d->n_heads;
    t[TERM_E] = d->n_experts;
    t[TERM_F] = d->ffn;
    t[TERM_FD] = layer_dense_ffn(d, layer);
    t[TERM_FS] = d->shared_ffn;
    t[TERM_ROPE_HALF] = d->rope_dim / 2;
    t[TERM_Q_DIM] = q_dim;
    t[TERM_KV_DIM] = kv_dim;
    t[TERM_Q_NORM] = head_norm ? hd : q_dim;
    t[TERM_K_NORM] = head_norm ? hd : kv_dim;
    t[TERM_O_IN] = mla ? d->o_dim : q_dim;
    /* the terms only a mechanism the build leaves out uses: 0 there (no role made of them is present) */
    t[TERM_GLOBAL_ROPE_HALF] = WITH_GEMMA4 ? d->global_head_dim / 2 : 0;
    t[TERM_Q_LORA] = WITH_MLA ? d->q_lora : 0;
    t[TERM_KV_LORA] = WITH_MLA ? d->kv_lora : 0;
    t[TERM_KV_A] = WITH_MLA ? d->kv_lora + d->rope_dim : 0;
    t[TERM_K_B_ROWS] = WITH_MLA ? d->n_heads * d->kv_lora : 0;
    t[TERM_NOPE] = WITH_MLA ? d->head_dim - d->rope_dim : 0; /* MLA: rope_dim < head_dim; else equal */
    t[TERM_CONV_IN] = WITH_SHORT_CONV ? 3 * d->dim : 0; /* <= 2^24 with convolutions: read_dims */
    t[TERM_CONV_K] = WITH_SHORT_CONV ? d->conv_kernel : 0;
    t[TERM_DN_CONV] = WITH_DELTA_NET ? d->dn_conv : 0;
    t[TERM_DN_V] = WITH_DELTA_NET ? d->dn_v_heads * d->dn_v_dim : 0;
    t[TERM_DN_HEADS] = WITH_DELTA_NET ? d->dn_v_heads : 0;
    t[TERM_DN_V_DIM] = WITH_DELTA_NET ? d->dn_v_dim : 0;
    t[TERM_P] = WITH_PER_LAYER_INPUTS ? d->ple_dim : 0;
    t[TERM_LP] = WITH_PER_LAYER_INPUTS ? d->n_layers * d->ple_dim : 0;
}

/* A slot of the dense index: its (role, layer, expert), and the shape of its tensor (ndims 0: the model has none,
 * and the table does not list it) with the role's IMG_ROLE_* attributes. */
typedef struct { uint32_t role, layer, expert, ndims, dim0, dim1, attrs; } tensor_spec;

/* The role, layer and expert of slot i. */
static void slot_of(const model_dims *d, uint32_t i, tensor_spec *s) {
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
}

/* The shape and attributes of slot s's tensor, from its role's row of the schema; `facts` and `terms` are its
 * layer's (any layer's for a global tensor). */
static void spec_for(uint32_t facts, const uint32_t *terms, tensor_spec *s) {
    const uint32_t rows = ROLE_SPECS[s->role - 1].rows, cols = ROLE_SPECS[s->role - 1].cols;
    const uint32_t need = CONDITIONS[ROLE_SPECS[s->role - 1].when].need, deny = CONDITIONS[ROLE_SPECS[s->role - 1].when].deny;
    const int present = (facts & need) == need && !(facts & deny);
    s->ndims = present ? (cols != TERM_NONE ? 2u : 1u) : 0u;
    s->dim0 = terms[rows];
    s->dim1 = cols != TERM_NONE ? terms[cols] : 1u;
    s->attrs = ROLE_SPECS[s->role - 1].attrs;
}

_Static_assert(DTYPE_Q4_0 + 1 == DTYPE_Q4_1 && DTYPE_Q6_K + 1 == DTYPE_COUNT,
               "the block dtypes come after Q4_0 (format/schema.toml): the lean build refuses them as one range");
#define DTYPE_ROW(name, block, bytes, scale_bytes) [DTYPE_##name] = { block, bytes, scale_bytes },
const dtype_traits DTYPE_TRAITS[DTYPE_COUNT] = { IMG_DTYPES(DTYPE_ROW) };

/* Bytes of a rows x cols tensor's values in `dtype`, and of its block scales apart (0: none).
 * rows, cols <= 2^24 and a block's bytes < 2^8, so nothing here can overflow 64 bits. */
static void tensor_bytes(uint32_t dtype, uint32_t rows, uint32_t cols, uint64_t *values, uint64_t *scales) {
    const dtype_traits *t = &DTYPE_TRAITS[dtype];
    const uint64_t blocks = (uint64_t)rows * ((cols + t->block - 1u) / t->block);
    *values = blocks * t->bytes;
    *scales = blocks * t->scale_bytes;
}

/* Check one table entry against the spec of a present tensor; its bytes must lie in [data_offset, limit). *end is where
 * its bytes (scales included) end. */
static colibri_status check_entry(const uint8_t *e, const tensor_spec *s, uint64_t data_offset,
                                  uint64_t limit, uint64_t *end) {
    if (rd16(e + E_ROLE) != s->role || rd32(e + E_LAYER) != s->layer || rd32(e + E_EXPERT) != s->expert ||
        rd32(e + E_NDIMS) != s->ndims || rd32(e + E_DIM0) != s->dim0 || rd32(e + E_DIM1) != s->dim1 ||
        rd32(e + E_RESERVED) != 0)
        return COLIBRI_E_IMAGE_TABLE;
    uint32_t dtype = rd16(e + E_DTYPE);
    uint64_t off = rd64(e + E_OFFSET), scales_off = rd64(e + E_SCALES_OFFSET);
    if (dtype >= DTYPE_COUNT) return COLIBRI_E_IMAGE_DTYPE;
    if (!WITH_BLOCK_DTYPES && dtype > DTYPE_Q4_0) return COLIBRI_E_UNSUPPORTED; /* the block dtypes (mechanisms.h) */
    /* vectors and the tables read as floats (RoPE, expert biases) are f32; any other matrix may be narrower */
    if (dtype != DTYPE_F32 && (s->ndims != 2 || (s->attrs & IMG_ROLE_F32)))
        return COLIBRI_E_IMAGE_DTYPE;
    const dtype_traits *t = &DTYPE_TRAITS[dtype];
    const int scales_apart = t->scale_bytes != 0, quantized = WITH_BLOCK_DTYPES ? t->block > 1u : scales_apart;
    /* the input vector is quantized in blocks of QBLOCK as far as cols reaches: a longer block must end there */
    if (WITH_BLOCK_DTYPES && t->block > QBLOCK && s->dim1 % t->block) return COLIBRI_E_IMAGE_TABLE;
    uint64_t bytes, scales;
    tensor_bytes(dtype, s->dim0, s->dim1, &bytes, &scales);
    if (rd32(e + E_GROUP) != (quantized ? t->block : 0u) || rd64(e + E_BYTES) != bytes ||
        rd64(e + E_SCALES_BYTES) != scales)
        return COLIBRI_E_IMAGE_TABLE;
    if (off % IMG_ALIGN || off < data_offset || !add_ok(off, bytes, end) || *end > limit)
        return COLIBRI_E_IMAGE_BOUNDS;
    if (scales_apart) { /* the scales follow the values directly, so a tensor is one contiguous range */
        uint64_t at;
        if (!align_ok(*end, &at) || scales_off != at || !add_ok(scales_off, scales, end) || *end > limit)
            return COLIBRI_E_IMAGE_BOUNDS;
    } else if (scales_off != 0) {
        return COLIBRI_E_IMAGE_TABLE;
    }
    return COLIBRI_OK;
}

colibri_status table_walk(const uint8_t *img, model_dims *d, unsigned mode, tensor_ref *refs) {
    const int sums = !(mode & IMG_VERIFY_NO_CRC), full = !(mode & IMG_VERIFY_RESIDENT);
    const int clmul = sums && crc32_cpu_clmul(); /* asked once, not per expert block */
    d->expert_block_max = 0;
    d->streamed_experts = 0;
    /* the table lists the present tensors in the dense index's order: walk the index, taking an entry for each
     * tensor the model has (every layer has an ATTN_NORM, so a short table ends the walk within a layer) */
    const uint8_t *entries = img + d->table_offset;
    uint64_t prev_end = 0, block_start = 0;
    uint32_t next = 0; /* the next table entry */
    uint32_t facts = 0, terms[TERM_COUNT];
    for (uint32_t i = 0; i < d->n_tensors; i++) {
        tensor_spec s;
        slot_of(d, i, &s);
        if (i == 0 || s.role == ROLE_ATTN_NORM) { /* a new layer (the global tensors take layer 0's before the layers
                                                    * and the last layer's after them: any layer's hold the model-wide
                                                    * facts and terms, all a global role may use) */
            const uint32_t layer = s.layer != IMG_NO_INDEX ? s.layer : 0;
            facts = layer_facts(d, layer);
            shape_terms(d, layer, terms);
        }
        spec_for(facts, terms, &s);
        tensor_ref *ref = refs ? &refs[i] : 0;
        if (ref) *ref = (tensor_ref){ 0 }; /* rows 0: absent, until its entry is checked */
        if (!s.ndims) continue;
        if (next == d->n_entries) return COLIBRI_E_IMAGE_TABLE;
        /* the entry copied once: every check and every place taken from it reads the same bytes, whatever the
         * image does meanwhile */
        uint8_t e[IMG_ENTRY_BYTES];
        const uint8_t *listed = entries + (size_t)next++ * IMG_ENTRY_BYTES;
        for (uint32_t k = 0; k < IMG_ENTRY_BYTES; k++) e[k] = listed[k];
        const int routed = s.expert != IMG_NO_INDEX; /* a routed expert's: may lie in the expert part */
        uint64_t end, aligned_prev;
        const colibri_status st = check_entry(e, &s, d->data_offset, routed ? d->tensors_end : d->resident_bytes, &end);
        if (st) return st;
        if (ref) *ref = (tensor_ref){ .offset = rd64(e + E_OFFSET), .scales = rd64(e + E_SCALES_OFFSET), .rows = s.dim0,
                                      .cols = s.dim1, .dtype = rd16(e + E_DTYPE) };
        /* the up and down matrices of a SwiGLU block follow its gate matrix directly: one read covers it */
        if ((s.attrs & IMG_ROLE_FOLLOWS) && (!align_ok(prev_end, &aligned_prev) || rd64(e + E_OFFSET) != aligned_prev))
            return COLIBRI_E_IMAGE_BOUNDS;
        prev_end = end;
        if (s.role == ROLE_EXPERT_GATE) block_start = rd64(e + E_OFFSET);
        if (s.role == ROLE_EXPERT_DOWN) { /* a routed expert's block: wholly in one tier */
            const int streamed = block_start >= d->resident_bytes;
            if (!streamed && end > d->resident_bytes) return COLIBRI_E_IMAGE_BOUNDS;
            if (end - block_start > d->expert_block_max) d->expert_block_max = end - block_start;
            d->streamed_experts += (uint32_t)streamed;
            if (sums && (full || !streamed)) { /* addressable now: check it now (a streamed one is checked when fetched) */
                uint32_t want = rd32(img + d->expert_crc_offset + 4ull * ((uint64_t)s.layer * d->n_experts + s.expert));
                if (crc32_update(0, img + block_start, (size_t)(end - block_start), clmul) != want) return COLIBRI_E_EXPERT_CRC;
            }
        }
    }
    if (next != d->n_entries) return COLIBRI_E_IMAGE_TABLE; /* entries past the last tensor */
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
