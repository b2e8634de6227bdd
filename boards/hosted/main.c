/* The hosted board: a Linux process that maps the image read-only, takes its arena with one
 * mmap, and speaks the device side of the serial protocol over stdin/stdout.
 *   firmware.elf [IMAGE] [--arena-bytes N] [--upload-bytes N]
 * Without --arena-bytes the arena is exactly the image's plan. With --upload-bytes the link accepts
 * an image uploaded over it, as a board without a file system does. */
#define _DEFAULT_SOURCE /* MAP_ANONYMOUS */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "colibri.h"
#include "link.h"

static uint8_t in_buf[1 << 16];
static size_t in_len, in_pos;

static int read_byte(void) {
    if (in_pos == in_len) {
        ssize_t n;
        do n = read(0, in_buf, sizeof in_buf); while (n < 0 && errno == EINTR);
        if (n <= 0) return -1;
        in_len = (size_t)n;
        in_pos = 0;
    }
    return in_buf[in_pos++];
}

static void write_all(const uint8_t *p, size_t n) {
    while (n) {
        ssize_t w = write(1, p, n);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) exit(3); /* host went away */
        p += w;
        n -= (size_t)w;
    }
}

static uint64_t monotonic_ns(void *user) {
    (void)user;
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static int usage(const char *argv0) {
    fprintf(stderr, "usage: %s [IMAGE] [--arena-bytes N] [--upload-bytes N]\n"
                    "  IMAGE            image file to map (or upload one over the link)\n"
                    "  --arena-bytes N  arena size (default: exactly the image's plan, or 64 MiB without one)\n"
                    "  --upload-bytes N give the link an upload region of N bytes\n", argv0);
    return 2;
}

static void *map_anon(size_t n) {
    void *p = mmap(0, n ? n : 1, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) {
        fprintf(stderr, "colibri-hosted: cannot map %zu bytes\n", n);
        exit(2);
    }
    return p;
}

int main(int argc, char **argv) {
    const char *path = 0;
    size_t arena_size = 0, upload_size = 0;
    int arena_given = 0;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--arena-bytes") == 0 && i + 1 < argc) {
            arena_size = (size_t)strtoull(argv[++i], 0, 0);
            arena_given = 1;
        } else if (strcmp(argv[i], "--upload-bytes") == 0 && i + 1 < argc) {
            upload_size = (size_t)strtoull(argv[++i], 0, 0);
        } else if (argv[i][0] != '-' && !path) {
            path = argv[i];
        } else {
            return usage(argv[0]);
        }
    }
    board_io io = { .board = "hosted", .read_byte = read_byte, .write = write_all, .cycles = monotonic_ns,
                    .cycle_hz = 1000000000u };
    if (path) {
        int fd = open(path, O_RDONLY);
        struct stat st;
        if (fd < 0 || fstat(fd, &st) != 0 || st.st_size <= 0) {
            fprintf(stderr, "colibri-hosted: cannot read image %s: %s\n", path, strerror(errno));
            return 2;
        }
        io.image_size = (size_t)st.st_size;
        void *image = mmap(0, io.image_size, PROT_READ, MAP_PRIVATE, fd, 0);
        close(fd);
        if (image == MAP_FAILED) {
            fprintf(stderr, "colibri-hosted: mmap %s: %s\n", path, strerror(errno));
            return 2;
        }
        io.image = image;
        /* Size the arena from the image's plan; a corrupt image gets a small arena and OPEN says why. */
        colibri_image_info info = { 0 };
        if (!arena_given)
            arena_size = colibri_image_verify(image, io.image_size, &info) == COLIBRI_OK ? (size_t)info.arena_bytes : 4096;
    } else if (!arena_given) {
        arena_size = 64u << 20;
    }
    if (upload_size) {
        io.upload = map_anon(upload_size);
        io.upload_capacity = upload_size;
    }
    io.arena = map_anon(arena_size);
    io.arena_size = arena_size;
    return link_serve(&io);
}
