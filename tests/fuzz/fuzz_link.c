#define _POSIX_C_SOURCE 200112L /* posix_memalign */
/* libFuzzer harness for the device side of the serial protocol: the input is the byte stream a
 * board receives (frames, garbage, truncated frames, uploads, out-of-order commands). The board
 * has a valid image preloaded (COLIBRI_FUZZ_IMAGE), a 1 MiB upload region and a 4 MiB arena.
 * If the first input byte is odd, the rest is read as records (type, seq, len u16, payload) that
 * the harness frames with correct CRCs, so mutations reach the request handlers; otherwise the
 * bytes go to the board as they are. Built with ASan + UBSan by tools/fuzz.py. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "colibri.h"
#include "link.h"

static const uint8_t *in;
static size_t in_len, in_pos;
static uint8_t *image;
static size_t image_size;
static uint8_t *upload;
static void *arena;

static int read_byte(void) { return in_pos < in_len ? in[in_pos++] : -1; }
static void write_sink(const uint8_t *p, size_t n) { (void)p; (void)n; }

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    const char *path = getenv("COLIBRI_FUZZ_IMAGE");
    FILE *f = path ? fopen(path, "rb") : 0;
    if (!f) {
        fprintf(stderr, "fuzz_link: set COLIBRI_FUZZ_IMAGE to a valid image file\n");
        exit(2);
    }
    fseek(f, 0, SEEK_END);
    image_size = (size_t)ftell(f);
    fseek(f, 0, SEEK_SET);
    if (posix_memalign((void **)&image, 64, image_size) || fread(image, 1, image_size, f) != image_size) exit(2);
    fclose(f);
    if (posix_memalign((void **)&upload, 64, 1u << 20) || posix_memalign(&arena, 64, 4u << 20)) exit(2);
    return 0;
}

static uint8_t framed[1 << 20];

/* Wrap records (type, seq, len lo, len hi, payload...) into frames with valid CRCs. */
static size_t frame_records(const uint8_t *p, size_t n) {
    size_t out = 0;
    while (n >= 4) {
        size_t len = p[2] | (size_t)p[3] << 8;
        if (len > n - 4) len = n - 4;
        if (out + 10 + len > sizeof framed) break;
        uint8_t *f = framed + out;
        f[0] = 0xA5; f[1] = 0x5A; f[2] = p[0]; f[3] = p[1]; f[4] = (uint8_t)len; f[5] = (uint8_t)(len >> 8);
        memcpy(f + 6, p + 4, len);
        uint32_t crc = colibri_crc32(0, f + 2, 4 + len);
        for (int i = 0; i < 4; i++) f[6 + len + i] = (uint8_t)(crc >> (8 * i));
        out += 10 + len;
        p += 4 + len;
        n -= 4 + len;
    }
    return out;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    if (data[0] & 1) {
        in = framed;
        in_len = frame_records(data + 1, size - 1);
    } else {
        in = data + 1;
        in_len = size - 1;
    }
    in_pos = 0;
    board_io io = { .board = "fuzz", .read_byte = read_byte, .write = write_sink, .cycles = 0, .cycle_hz = 0,
                    .image = image, .image_size = image_size, .upload = upload, .upload_capacity = 1u << 20,
                    .arena = arena, .arena_size = 4u << 20 };
    link_serve(&io);
    return 0;
}
