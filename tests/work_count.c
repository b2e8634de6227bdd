/* One feed through the public API, for tests that count its work: tests/test_work.py runs this under
 * valgrind's callgrind, which counts the instructions executed inside colibri_feed (deterministic, where a
 * timing is not). Built by the test against libcolibri.a.
 *   work_count IMAGE BATCH N    open with a prefill batch of BATCH tokens (0: one a pass), feed N tokens
 * (The program may allocate and print; the runtime it links does neither.) */
#define _POSIX_C_SOURCE 200112L /* posix_memalign (image_file.h) */
#include <stdio.h>
#include <stdlib.h>

#include "colibri.h"
#include "image_file.h"

static int fail(const char *what, colibri_status st) {
    fprintf(stderr, "%s: %s\n", what, colibri_strerror(st));
    return 1;
}

int main(int argc, char **argv) {
    if (argc != 4) {
        fprintf(stderr, "usage: %s IMAGE BATCH N\n", argv[0]);
        return 2;
    }
    size_t image_size;
    void *image = read_image_file(argv[1], &image_size);
    if (!image) return 2;
    const uint32_t batch = (uint32_t)strtoul(argv[2], 0, 10), n = (uint32_t)strtoul(argv[3], 0, 10);

    colibri_image_info info;
    colibri_status st = colibri_image_verify(image, image_size, &info);
    if (st) return fail("verify", st);
    const size_t arena_size = (size_t)(info.arena_bytes + colibri_prefill_bytes(&info, batch) + 63) / 64 * 64;
    void *arena = aligned_alloc(COLIBRI_ARENA_ALIGN, arena_size);
    colibri_options opts = { .size = sizeof(colibri_options), .prefill_batch = batch };
    colibri_ctx *ctx;
    if (!arena || (st = colibri_open(image, image_size, arena, arena_size, &opts, &ctx, NULL))) return fail("open", st);
    colibri_stats stats = COLIBRI_STATS_INIT;
    if (colibri_get_stats(ctx, &stats) || stats.prefill_batch != (batch > 1 ? batch : 0)) return fail("batch", COLIBRI_E_BAD_ARG);

    uint32_t *tokens = malloc(sizeof *tokens * (n ? n : 1));
    if (!tokens) return 2;
    for (uint32_t i = 0; i < n; i++) tokens[i] = (1u + 7u * i) % info.vocab_size;
    if ((st = colibri_feed(ctx, tokens, n))) return fail("feed", st);
    printf("fed %u\n", n);
    free(tokens);
    free(arena);
    free(image);
    return 0;
}
