/* The hosted board: a Linux process that maps the image read-only, takes its arena with one
 * mmap, and speaks the device side of the serial protocol over stdin/stdout.
 *   firmware.elf [IMAGE] [--arena-bytes N] [--upload-bytes N]
 * Without --arena-bytes the arena is the image's plan plus room for an expert cache of every
 * streamed expert (anonymous memory: pages an OPEN does not use are never touched, so never resident).
 * With --upload-bytes the link accepts an image uploaded over it, as a board without a file system does.
 *
 * Expert streaming: the fetch hooks copy expert blocks out of the mapped file and tell the kernel what
 * is coming and what is done with (madvise WILLNEED when a fetch starts, DONTNEED once it is copied),
 * so the process's resident memory stays near the resident part plus the cache, not the image. */
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

/* ---- expert fetch from the mapped image ---- */
static const uint8_t *mapped;
static size_t mapped_size;

/* madvise the whole pages inside [p, p + n) (DONTNEED), or every page it touches (WILLNEED) */
static void advise(const uint8_t *p, size_t n, int advice) {
    const uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
    uintptr_t lo = (uintptr_t)p, hi = lo + n;
    if (advice == MADV_WILLNEED) {
        lo &= ~(page - 1);
        hi = (hi + page - 1) & ~(page - 1);
    } else {
        lo = (lo + page - 1) & ~(page - 1);
        hi &= ~(page - 1);
    }
    if (hi > lo) madvise((void *)lo, hi - lo, advice);
}

static int fetch_copy(uint64_t offset, size_t bytes, void *dst) {
    if (offset > mapped_size || bytes > mapped_size - offset) return 1;
    memcpy(dst, mapped + offset, bytes);
    advise(mapped + offset, bytes, MADV_DONTNEED);
    return 0;
}

/* Fetches started and not yet waited for: the runtime has at most one per cache slot. */
#define MAX_IN_FLIGHT 4096
static struct { void *dst; uint64_t offset; size_t bytes; } in_flight[MAX_IN_FLIGHT];
static unsigned n_in_flight;

static int fetch_start(uint64_t offset, size_t bytes, void *dst) {
    if (offset > mapped_size || bytes > mapped_size - offset || n_in_flight == MAX_IN_FLIGHT) return 1;
    advise(mapped + offset, bytes, MADV_WILLNEED); /* the kernel reads ahead while the runtime computes */
    in_flight[n_in_flight].dst = dst;
    in_flight[n_in_flight].offset = offset;
    in_flight[n_in_flight].bytes = bytes;
    n_in_flight++;
    return 0;
}

static int fetch_wait(void *dst) {
    for (unsigned i = 0; i < n_in_flight; i++) {
        if (in_flight[i].dst != dst) continue;
        int r = fetch_copy(in_flight[i].offset, in_flight[i].bytes, dst);
        in_flight[i] = in_flight[--n_in_flight];
        return r;
    }
    return 1; /* nothing started into dst */
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
                    .cycle_hz = 1000000000u, .fetch = fetch_copy, .fetch_start = fetch_start, .fetch_wait = fetch_wait };
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
        mapped = image;
        mapped_size = io.image_size;
        /* Size the arena from the image's plan; a corrupt image gets a small arena and OPEN says why. */
        colibri_image_info info = { 0 };
        if (!arena_given)
            arena_size = colibri_image_verify(image, io.image_size, &info) == COLIBRI_OK
                             ? (size_t)(info.arena_bytes + colibri_expert_cache_bytes(&info, info.streamed_experts))
                             : 4096;
        advise(image, io.image_size, MADV_DONTNEED); /* sizing read every page: start from none resident */
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
