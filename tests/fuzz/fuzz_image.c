#define _POSIX_C_SOURCE 200112L /* posix_memalign */
/* libFuzzer harness: an arbitrary byte string as an image -> verify -> open -> one prefill step ->
 * one sampled decode step. The first input byte chooses whether the harness first rewrites both
 * CRCs to match (so mutations reach the checks behind them) or passes the bytes as they are.
 * Built with ASan + UBSan by tools/fuzz.py; any out-of-bounds access or UB aborts the run. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "colibri.h"

#define MAX_ARENA (64u << 20)

static void put32(uint8_t *p, uint32_t v) { for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i)); }

static void reseal(uint8_t *img, size_t size) {
    if (size < 256) return;
    uint64_t image_bytes = 0;
    for (int i = 0; i < 8; i++) image_bytes |= (uint64_t)img[16 + i] << (8 * i);
    if (image_bytes > size || image_bytes < 256) image_bytes = size;
    put32(img + 28, colibri_crc32(0, img + 256, (size_t)image_bytes - 256));
    put32(img + 24, 0);
    put32(img + 24, colibri_crc32(0, img, 256));
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    const int seal = data[0] & 1;
    data++;
    size--;
    void *image = 0;
    if (posix_memalign(&image, 64, size ? size : 1)) return 0; /* exact size: ASan sees any overread */
    memcpy(image, data, size);
    if (seal) reseal(image, size);

    colibri_image_info info;
    if (colibri_image_verify(image, size, &info) == COLIBRI_OK && info.arena_bytes <= MAX_ARENA) {
        void *arena = 0;
        if (!posix_memalign(&arena, COLIBRI_ARENA_ALIGN, (size_t)info.arena_bytes)) {
            colibri_ctx *ctx = 0;
            uint64_t needed = 0;
            if (colibri_open(image, size, arena, (size_t)info.arena_bytes, 0, &ctx, &needed) != COLIBRI_OK) abort();
            uint32_t tok = info.vocab_size - 1;
            colibri_sampler s;
            colibri_sampler_init(&s, 0.8f, 3, 0.9f, 1);
            /* a verified image may still hold NaN or infinite weights: that is a named error, nothing else */
            colibri_status st = colibri_feed(ctx, &tok, 1);
            if (st != COLIBRI_OK && st != COLIBRI_E_NONFINITE) abort();
            if (st == COLIBRI_OK) {
                st = colibri_step(ctx, &s, &tok);
                if (st != COLIBRI_OK && st != COLIBRI_E_SEQ_FULL && st != COLIBRI_E_NONFINITE) abort();
            }
            free(arena);
        }
    }
    free(image);
    return 0;
}
