/* The sequence documented at the top of colibri.h as a complete hosted program: embed the runtime,
 * generate greedily, print the tokens. tests/test_runtime_api.py builds it against libcolibri.a.
 *   api_example IMAGE N_NEW TOKEN...
 * (The program may allocate and print; the runtime it links does neither.) */
#include <stdio.h>
#include <stdlib.h>

#include "colibri.h"

static int fail(const char *what, colibri_status st) {
    fprintf(stderr, "%s: %s\n", what, colibri_strerror(st));
    return 1;
}

int main(int argc, char **argv) {
    if (argc < 4) {
        fprintf(stderr, "usage: %s IMAGE N_NEW TOKEN...\n", argv[0]);
        return 2;
    }
    FILE *f = fopen(argv[1], "rb");
    if (!f) return 2;
    fseek(f, 0, SEEK_END);
    size_t image_size = (size_t)ftell(f);
    fseek(f, 0, SEEK_SET);
    void *image = aligned_alloc(64, (image_size + 63) / 64 * 64); /* the image must be 64-byte aligned */
    if (!image || fread(image, 1, image_size, f) != image_size) return 2;
    fclose(f);

    if (colibri_api_version() != COLIBRI_API_VERSION) return fail("version", COLIBRI_E_API_MISMATCH); /* another library */
    colibri_image_info info;
    colibri_status st = colibri_image_verify(image, image_size, &info);
    if (st) return fail("verify", st);
    void *arena = aligned_alloc(COLIBRI_ARENA_ALIGN, (size_t)(info.arena_bytes + 63) / 64 * 64);
    colibri_ctx *ctx;
    st = colibri_open(image, image_size, arena, (size_t)info.arena_bytes, NULL, &ctx, NULL);
    if (st) return fail("open", st);

    uint32_t prompt[64];
    int n_prompt = argc - 3 < 64 ? argc - 3 : 64;
    for (int i = 0; i < n_prompt; i++) prompt[i] = (uint32_t)strtoul(argv[3 + i], 0, 10);
    if ((st = colibri_feed(ctx, prompt, (size_t)n_prompt))) return fail("feed", st);

    colibri_sampler s;
    colibri_sampler_init(&s, 0.0f, 0, 1.0f, 42);
    for (int i = 0, n = atoi(argv[2]); i < n; i++) {
        uint32_t tok;
        if ((st = colibri_step(ctx, &s, &tok))) return fail("step", st);
        printf("%u%c", tok, i + 1 < n ? ' ' : '\n');
    }
    colibri_stats stats = COLIBRI_STATS_INIT; /* its size set: the library checks it */
    if ((st = colibri_get_stats(ctx, &stats))) return fail("stats", st);
    if (stats.tokens_fed != (uint32_t)n_prompt + (uint32_t)atoi(argv[2])) return fail("stats", COLIBRI_E_BAD_ARG);
    free(arena);
    free(image);
    return 0;
}
