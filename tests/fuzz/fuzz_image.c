#define _POSIX_C_SOURCE 200112L /* posix_memalign */
/* libFuzzer harness: an arbitrary byte string as an image -> verify -> open -> one prefill step ->
 * one sampled decode step. The first input byte chooses whether the harness first rewrites the image's
 * CRCs to match (bit 0, reseal.c: so mutations reach the checks behind them) or passes the bytes as
 * they are, and whether routed experts are streamed (bit 1): opened with the smallest expert cache,
 * the expert part reached only through a fetch hook that copies from the (hostile) bytes, so every
 * expert block is checked only when it arrives (docs/STREAMING.md), and whether the prompt goes through
 * a prefill batch (bit 2: four tokens a pass, so the kernel sets' runs of rows by four tokens run too, then
 * one; the matrices split into parts run last first by a parallel_for hook), five tokens in one feed. image_mutator.c mutates header fields and table entries.
 * Built with ASan + UBSan by tools/fuzz.py; any out-of-bounds access or UB aborts the run.
 * With COLIBRI_FUZZ_REPORT set, each input prints how far it got (tests/test_fuzz.py reads it). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "colibri.h"
#include "format.h"
#include "reseal.h"

#define MAX_ARENA (64u << 20)
#define NOT_REACHED (-1)

/* How far the current input got: each call's status, NOT_REACHED before it runs. */
static struct { int verify, open, feed, step; } reached;
static int report;

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    report = getenv("COLIBRI_FUZZ_REPORT") != 0;
    return 0;
}

/* slow memory: the input bytes themselves, bounds-checked like a board's hook */
typedef struct { const uint8_t *bytes; size_t size; } region;

static int fetch(void *user, uint64_t offset, size_t n, void *dst) {
    const region *r = user;
    if (offset > r->size || n > r->size - offset) return 1;
    memcpy(dst, r->bytes + offset, n);
    return 0;
}

/* the parts of a parallel region, last first (any order must give the same result) */
static void parts_reversed(void *user, void (*fn)(void *arg, uint32_t part), void *arg, uint32_t parts) {
    (void)user;
    while (parts--) fn(arg, parts);
}

/* a prefill step and one sampled decode step: a verified image may still hold NaN or infinite
 * weights, and a streamed block may be corrupt or out of reach: those are named errors, nothing else */
static void run(colibri_ctx *ctx, uint32_t vocab, size_t n_prompt) {
    uint32_t prompt[5] = { vocab - 1, 0, vocab / 2, vocab > 1 ? 1 : 0, vocab / 3 }, tok;
    colibri_sampler s;
    colibri_sampler_init(&s, 0.8f, 3, 0.9f, 1);
    colibri_status st = reached.feed = colibri_feed(ctx, prompt, n_prompt);
    if (st != COLIBRI_OK && st != COLIBRI_E_NONFINITE && st != COLIBRI_E_EXPERT_CRC && st != COLIBRI_E_FETCH &&
        !(st == COLIBRI_E_SEQ_FULL && n_prompt > 1)) /* max_seq may be below the five tokens */
        abort();
    if (st == COLIBRI_OK) {
        st = reached.step = colibri_step(ctx, &s, &tok);
        if (st != COLIBRI_OK && st != COLIBRI_E_SEQ_FULL && st != COLIBRI_E_NONFINITE && st != COLIBRI_E_EXPERT_CRC &&
            st != COLIBRI_E_FETCH)
            abort();
    }
}

/* Open with the smallest expert cache (top_k slots, from the header: open checks it) and run. */
static void run_streamed(const uint8_t *image, size_t size) {
    region slow = { image, size };
    const uint32_t top_k = size >= IMG_HEADER_BYTES ? (uint32_t)get_le(image + H_TOP_K, 4) : 1;
    colibri_options opts = { .size = sizeof(colibri_options), .expert_cache = top_k, .fetch = fetch,
                             .user = &slow, .expert_policy = COLIBRI_PREFETCH };
    static uint8_t probe[64] __attribute__((aligned(64)));
    colibri_ctx *ctx = 0;
    uint64_t needed = 0;
    const colibri_status probed = colibri_open(image, size, probe, 0, &opts, &ctx, &needed); /* verifies first */
    if (probed != COLIBRI_E_ARENA_TOO_SMALL) reached.open = probed;
    if (probed != COLIBRI_E_ARENA_TOO_SMALL || needed > MAX_ARENA) return;
    void *arena = 0;
    if (posix_memalign(&arena, COLIBRI_ARENA_ALIGN, (size_t)needed)) return;
    if ((reached.open = colibri_open(image, size, arena, (size_t)needed, &opts, &ctx, &needed)) != COLIBRI_OK) abort();
    colibri_image_info info;
    colibri_get_info(ctx, &info);
    run(ctx, info.vocab_size, 1);
    free(arena);
}

static void run_input(const uint8_t *data, size_t size) {
    const int seal = data[0] & 1, streamed = data[0] & 2, batched = data[0] & 4;
    data++;
    size--;
    void *image = 0;
    if (posix_memalign(&image, 64, size ? size : 1)) return; /* exact size: ASan sees any overread */
    memcpy(image, data, size);
    if (seal) reseal(image, size);

    colibri_image_info info, inspected;
    memset(&info, 0, sizeof info); /* padding too: compared with memcmp below */
    memset(&inspected, 0, sizeof inspected);
    const colibri_status inspect = colibri_image_inspect(image, size, &inspected);
    if (streamed) {
        run_streamed(image, size);
    } else if ((reached.verify = colibri_image_verify(image, size, &info)) == COLIBRI_OK && info.arena_bytes <= MAX_ARENA) {
        /* inspect checks a subset of what verify does: what verify passes, it passes with the same facts */
        if (inspect != COLIBRI_OK || memcmp(&inspected, &info, sizeof info) != 0) abort();
        const colibri_options opts = { .size = sizeof(colibri_options), .prefill_batch = 4, .parallel_for = parts_reversed, .parallel_parts = 2 };
        const uint64_t bytes = info.arena_bytes + (batched ? colibri_prefill_bytes(&info, opts.prefill_batch) : 0);
        void *arena = 0;
        if (bytes <= MAX_ARENA && !posix_memalign(&arena, COLIBRI_ARENA_ALIGN, (size_t)bytes)) {
            colibri_ctx *ctx = 0;
            uint64_t needed = 0;
            reached.open = colibri_open(image, size, arena, (size_t)bytes, batched ? &opts : 0, &ctx, &needed);
            if (reached.open != COLIBRI_OK) abort();
            run(ctx, info.vocab_size, batched ? 5 : 1);
            free(arena);
        }
    }
    free(image);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    reached.verify = reached.open = reached.feed = reached.step = NOT_REACHED;
    run_input(data, size);
    if (report)
        fprintf(stderr, "reached: mode %u verify %d open %d feed %d step %d\n", data[0], reached.verify, reached.open,
                reached.feed, reached.step);
    return 0;
}
