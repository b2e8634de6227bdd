#define _POSIX_C_SOURCE 200112L /* posix_memalign */
/* An image run for the sanitizer tests (tests/test_sanitizers.py): the image file read into memory of exactly
 * its size, verified, opened in an arena of exactly the bytes open asks for, then fed TOKENS tokens (ids 0, 1,
 * ... modulo the vocabulary) one at a time, or BATCH at a time through a prefill batch. The test builds it with
 * the sanitizer it needs, so a read past the image or a write past the arena is a report, not silence.
 * With -DCHECK_DEFINED (MemorySanitizer only) it also checks, after open, that every field of the context's model
 * description and every arena pointer the runtime keeps is defined: a build that leaves one unset (the lean one
 * reads only what it uses) names each such field and exits 1.
 * Prints "verify S open S feed S" (the statuses); exit 0 unless a sanitizer reports first.
 * usage: image_run IMAGE TOKENS [BATCH] */
#include <stdio.h>
#include <stdlib.h>

#include "image_file.h"
#include "internal.h"

#ifdef CHECK_DEFINED
#include <sanitizer/msan_interface.h>

/* every model_dims field (padding is not a field: it may stay undefined) */
#define DIMS_FIELDS(X)                                                                                               \
    X(vocab) X(dim) X(ffn) X(n_layers) X(n_heads) X(n_kv_heads) X(head_dim) X(n_experts) X(top_k) X(max_seq)         \
    X(dense_ffn) X(shared_ffn) X(kv_dtype) X(eps) X(clip_qkv) X(window) X(global_head_dim) X(shared_ring)   \
    X(q_lora) X(kv_lora) X(rope_dim) X(v_head_dim) X(attn_scale) X(n_group) X(topk_group) X(group_top)               \
    X(routed_scale) X(swiglu_alpha) X(swiglu_limit) X(embed_scale) X(logit_softcap) X(ple_dim) X(q_dim) X(kv_dim)    \
    X(ffn_max) X(att_dim) X(val_dim) X(o_dim) X(in_blocks) X(n_tensors) X(n_entries) X(resident_bytes)               \
    X(conv_kernel) X(dn_k_heads) X(dn_v_heads) X(dn_k_dim) X(dn_v_dim) X(dn_conv) X(mix_dim) X(options_any)          \
    X(topk_norm_eps) X(expert_block_max) X(streamed_experts) X(expert_crc_offset) X(table_offset) X(data_offset)    \
    X(tensors_end) X(prefill_token_bytes) X(kinds) X(kind_of)
/* the arena plan's and the prefill batch region's buffers, NULL or not: every one the schema's plan lists (plan.h) */
#define ARENA_FIELDS(X) PLAN_MODEL_BUFFERS(X)
#define BATCH_FIELDS(X) PLAN_PASS_BUFFERS(X)

/* Names every field with an undefined byte on stderr; nonzero if there was one. */
static int check_defined(const colibri_ctx *c) {
    int undefined = 0;
#define CHECK(owner, f)                                                                                              \
    if (__msan_test_shadow(&c->owner.f, sizeof c->owner.f) != -1) {                                                 \
        fprintf(stderr, "undefined after open: %s.%s\n", #owner, #f);                                              \
        undefined = 1;                                                                                               \
    }
#define CHECK_D(f) CHECK(d, f)
#define CHECK_A(f, elem, count, when) CHECK(a, f)
#define CHECK_B(f, elem, count, when) CHECK(batch, f)
    DIMS_FIELDS(CHECK_D)
    ARENA_FIELDS(CHECK_A)
    if (c->batch.n) {
        BATCH_FIELDS(CHECK_B)
    }
    return undefined;
}
#endif

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: image_run IMAGE TOKENS [BATCH]\n");
        return 2;
    }
    size_t size;
    void *image = read_image_file(argv[1], &size), *arena = 0;
    if (!image) return 2;
    const uint32_t tokens = (uint32_t)strtoul(argv[2], 0, 10), batch = argc > 3 ? (uint32_t)strtoul(argv[3], 0, 10) : 0;

    colibri_image_info info;
    colibri_status st = colibri_image_verify(image, size, &info);
    printf("verify %d", (int)st);
    if (st == COLIBRI_OK) {
        colibri_options opts = { .size = sizeof(colibri_options), .prefill_batch = batch };
        const uint64_t need = info.arena_bytes + colibri_prefill_bytes(&info, batch);
        colibri_ctx *ctx = 0;
        if (posix_memalign(&arena, COLIBRI_ARENA_ALIGN, (size_t)need)) return 2;
        st = colibri_open(image, size, arena, (size_t)need, &opts, &ctx, 0);
        printf(" open %d", (int)st);
        if (st == COLIBRI_OK) {
#ifdef CHECK_DEFINED
            if (check_defined(ctx)) return 1;
#endif
            uint32_t ids[COLIBRI_MAX_BATCH];
            const uint32_t per_feed = batch > 1 ? batch : 1;
            for (uint32_t fed = 0; fed < tokens && st == COLIBRI_OK; fed += per_feed) {
                const uint32_t n = tokens - fed < per_feed ? tokens - fed : per_feed;
                for (uint32_t i = 0; i < n; i++) ids[i] = (fed + i) % info.vocab_size;
                st = colibri_feed(ctx, ids, n);
            }
            printf(" feed %d", (int)st);
        }
    }
    printf("\n");
    free(arena);
    free(image);
    return 0;
}
