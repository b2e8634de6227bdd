/* The hosted board: a Linux process that maps the image read-only, takes its arena with one
 * mmap, and speaks the device side of the serial protocol over stdin/stdout.
 *   colibri-hosted IMAGE [--arena-bytes N]
 * Without --arena-bytes the arena is exactly the image's plan. */
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

int main(int argc, char **argv) {
    if (argc != 2 && !(argc == 4 && strcmp(argv[2], "--arena-bytes") == 0)) {
        fprintf(stderr, "usage: %s IMAGE [--arena-bytes N]\n", argv[0]);
        return 2;
    }
    int fd = open(argv[1], O_RDONLY);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) != 0 || st.st_size <= 0) {
        fprintf(stderr, "colibri-hosted: cannot read image %s: %s\n", argv[1], strerror(errno));
        return 2;
    }
    size_t image_size = (size_t)st.st_size;
    void *image = mmap(0, image_size, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (image == MAP_FAILED) {
        fprintf(stderr, "colibri-hosted: mmap %s: %s\n", argv[1], strerror(errno));
        return 2;
    }
    /* Size the arena from the image's plan; a corrupt image gets a minimal arena and OPEN reports why. */
    colibri_image_info info = { 0 };
    size_t arena_size = colibri_image_verify(image, image_size, &info) == COLIBRI_OK ? (size_t)info.arena_bytes : 4096;
    if (argc == 4) arena_size = (size_t)strtoull(argv[3], 0, 0);
    void *arena = mmap(0, arena_size ? arena_size : 1, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (arena == MAP_FAILED) {
        fprintf(stderr, "colibri-hosted: cannot map a %zu-byte arena\n", arena_size);
        return 2;
    }
    board_io io = {
        .board = "hosted", .read_byte = read_byte, .write = write_all, .cycles = monotonic_ns,
        .cycle_hz = 1000000000u, .image = image, .image_size = image_size, .arena = arena, .arena_size = arena_size,
    };
    return link_serve(&io);
}
