/* Which bytes of an image's tensor table the verifier reads, and how often: every call table.c makes to rd16/rd32/rd64
 * (image.c's; linked with -Wl,--wrap=rd16,--wrap=rd32,--wrap=rd64) is counted by the table entry field it reads.
 * Reads from the walk's own copy of an entry land outside the image and are not counted. Prints, after
 * colibri_image_verify and colibri_open of the image in argv[1], one line per entry field read from the image:
 * "field OFFSET reads N" (tests/test_sanitizers.py). */
#define _POSIX_C_SOURCE 200112L
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "colibri.h"
#include "format.h"

uint16_t __real_rd16(const uint8_t *p);
uint32_t __real_rd32(const uint8_t *p);
uint64_t __real_rd64(const uint8_t *p);

static const uint8_t *table, *table_end;
static unsigned long reads[IMG_ENTRY_BYTES];

static void count(const uint8_t *p) {
    if (p >= table && p < table_end) reads[(size_t)(p - table) % IMG_ENTRY_BYTES]++;
}
uint16_t __wrap_rd16(const uint8_t *p) { count(p); return __real_rd16(p); }
uint32_t __wrap_rd32(const uint8_t *p) { count(p); return __real_rd32(p); }
uint64_t __wrap_rd64(const uint8_t *p) { count(p); return __real_rd64(p); }

int main(int argc, char **argv) {
    if (argc != 2) return 2;
    FILE *f = fopen(argv[1], "rb");
    if (!f || fseek(f, 0, SEEK_END)) return 2;
    const long n = ftell(f);
    uint8_t *img = 0;
    if (n < IMG_HEADER_BYTES || posix_memalign((void **)&img, 64, (size_t)n) || fseek(f, 0, SEEK_SET) ||
        fread(img, 1, (size_t)n, f) != (size_t)n)
        return 2;
    fclose(f);
    const uint64_t at = __real_rd64(img + H_TABLE_OFFSET), entries = __real_rd32(img + H_N_TENSORS);
    table = img + at;
    table_end = table + entries * IMG_ENTRY_BYTES;
    colibri_image_info info;
    void *arena = 0;
    colibri_ctx *ctx = 0;
    const int opened = !colibri_image_verify(img, (size_t)n, &info) && !posix_memalign(&arena, 64, info.arena_bytes) &&
                       !colibri_open(img, (size_t)n, arena, info.arena_bytes, 0, &ctx, 0);
    free(arena);
    free(img);
    if (!opened) return 1;
    for (unsigned k = 0; k < IMG_ENTRY_BYTES; k++)
        if (reads[k]) printf("field %u reads %lu\n", k, reads[k]);
    printf("entries %llu\n", (unsigned long long)entries);
    return 0;
}
