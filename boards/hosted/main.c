/* The hosted board: a Linux process that reads the image, takes its arena with one mmap, and speaks
 * the device side of the serial protocol over stdin/stdout.
 *   firmware.elf [IMAGE] [--copy | --stream] [--threads N] [--batch N] [--arena-bytes N] [--upload-bytes N]
 * With --threads N the runtime computes on N threads (pool.c), lent through its parallel_for hook; it
 * computes up to --batch prompt tokens in one pass (colibri_options.prefill_batch; default 64).
 * Without --arena-bytes the arena is the image's plan plus room for an expert cache of every
 * streamed expert (anonymous memory: pages an OPEN does not use are never touched, so never resident).
 * With --upload-bytes the link accepts an image uploaded over it, as a board without a file system does.
 *
 * Where the runtime's image comes from, three ways:
 * - by default the file is mapped read-only, its pages faulted in at once (MAP_POPULATE): open costs the
 *   runtime's one verifying pass over page-cache memory, not a copy (docs/PERFORMANCE.md). The file must
 *   not change while the board runs: a rewrite changes what the runtime reads, and a truncation ends the
 *   board with a message and exit status 2 (the SIGBUS is caught), never a crash dump.
 * - --copy reads the file into private memory once at start: a file rewritten or truncated while the
 *   board runs changes nothing, at the price of a copy of the image (slower to open).
 * - --stream reads the resident part only into private memory, and OPEN needs an expert cache: the expert
 *   part stays a read-only mapping of the file, reached only by the fetch hooks, which copy expert blocks
 *   out of it and tell the kernel what is coming and what is done with (madvise WILLNEED when a fetch
 *   starts, DONTNEED once it is copied), so resident memory stays near the resident part plus the cache.
 *   A fetch from a file that shrank is a failed fetch (COLIBRI_E_FETCH: the SIGBUS is caught around the
 *   copy), and a rewritten block fails its CRC (COLIBRI_E_EXPERT_CRC). */
#define _DEFAULT_SOURCE /* MAP_ANONYMOUS */
#include <errno.h>
#include <fcntl.h>
#include <setjmp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "colibri.h"
#include "link.h"
#include "pool.h"

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

/* A copy out of the mapping faults (SIGBUS) where the file has shrunk since it was mapped. */
static sigjmp_buf fetch_fault;
static volatile sig_atomic_t fetching;

static void on_sigbus(int sig) {
    (void)sig;
    if (fetching) siglongjmp(fetch_fault, 1);
    /* the runtime read a mapped page past the end of a file that shrank: nothing can go on */
    static const char msg[] = "colibri-hosted: the image file shrank while the board was using it\n";
    if (write(2, msg, sizeof msg - 1) < 0) _exit(2);
    _exit(2);
}

static int fetch_copy(uint64_t offset, size_t bytes, void *dst) {
    if (offset > mapped_size || bytes > mapped_size - offset) return 1;
    if (sigsetjmp(fetch_fault, 1)) {
        fetching = 0;
        return 1;
    }
    fetching = 1;
    memcpy(dst, mapped + offset, bytes);
    fetching = 0;
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

#define DEFAULT_BATCH PREFILL_BATCH /* board.toml's prefill_batch */

static int usage(const char *argv0) {
    fprintf(stderr, "usage: %s [IMAGE] [--stream] [--threads N] [--arena-bytes N] [--upload-bytes N]\n"
                    "  IMAGE            image file to run (or upload one over the link)\n"
                    "  --copy           read the image into private memory (immune to the file changing; slower)\n"
                    "  --stream         keep only the resident part in memory; OPEN must ask for an expert cache\n"
                    "  --threads N      compute on N threads (1 to %u; default 1)\n"
                    "  --batch N        prompt tokens computed in one pass (1 to %u; default %u)\n"
                    "  --arena-bytes N  arena size (default: the image's plan plus a cache of every streamed\n"
                    "                   expert, or 64 MiB without an image)\n"
                    "  --upload-bytes N give the link an upload region of N bytes\n", argv0, COLIBRI_MAX_PARTS,
            COLIBRI_MAX_BATCH, DEFAULT_BATCH);
    return 2;
}

static void *map_anon(size_t n, int populate) {
    void *p = mmap(0, n ? n : 1, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | (populate ? MAP_POPULATE : 0), -1, 0);
    if (p == MAP_FAILED) {
        fprintf(stderr, "colibri-hosted: cannot map %zu bytes\n", n);
        exit(2);
    }
    return p;
}

/* The first n bytes of the file in private, read-only memory (64-byte aligned: it is page aligned). Its
 * pages are made at once: faulting them one by one inside read() is several times slower. */
static const uint8_t *read_private(int fd, size_t n, const char *path) {
    uint8_t *p = map_anon(n, 1);
    for (size_t done = 0; done < n;) {
        ssize_t r = pread(fd, p + done, n - done, (off_t)done);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) {
            fprintf(stderr, "colibri-hosted: cannot read image %s: %s\n", path, r ? strerror(errno) : "file shrank");
            exit(2);
        }
        done += (size_t)r;
    }
    mprotect(p, n ? n : 1, PROT_READ);
    return p;
}

int main(int argc, char **argv) {
    const char *path = 0;
    size_t arena_size = 0, upload_size = 0;
    int arena_given = 0, stream = 0, copy = 0;
    unsigned long threads = 1, batch = DEFAULT_BATCH;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--stream") == 0 && !copy) {
            stream = 1;
        } else if (strcmp(argv[i], "--copy") == 0 && !stream) {
            copy = 1;
        } else if (strcmp(argv[i], "--threads") == 0 && i + 1 < argc) {
            char *end;
            threads = strtoul(argv[++i], &end, 10);
            if (*end || threads < 1 || threads > COLIBRI_MAX_PARTS) return usage(argv[0]);
        } else if (strcmp(argv[i], "--batch") == 0 && i + 1 < argc) {
            char *end;
            batch = strtoul(argv[++i], &end, 10);
            if (*end || batch < 1 || batch > COLIBRI_MAX_BATCH) return usage(argv[0]);
        } else if (strcmp(argv[i], "--arena-bytes") == 0 && i + 1 < argc) {
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
        mapped_size = (size_t)st.st_size;
        void *map = mmap(0, mapped_size, PROT_READ, MAP_PRIVATE | (stream || copy ? 0 : MAP_POPULATE), fd, 0);
        if (map == MAP_FAILED) {
            fprintf(stderr, "colibri-hosted: mmap %s: %s\n", path, strerror(errno));
            return 2;
        }
        mapped = map;
        struct sigaction sa = { .sa_handler = on_sigbus };
        sigaction(SIGBUS, &sa, 0);
        /* Size the arena from the header and the table (OPEN verifies every byte, once); a broken image
         * gets a small arena and OPEN says why. */
        colibri_image_info info = { 0 };
        const int valid = colibri_image_inspect(mapped, mapped_size, &info) == COLIBRI_OK;
        if (!arena_given) { /* a cache and a batch are never both used: room for the larger */
            const uint64_t cache = colibri_expert_cache_bytes(&info, info.streamed_experts),
                           prefill = colibri_prefill_bytes(&info, (uint32_t)batch);
            arena_size = valid ? (size_t)(info.arena_bytes + (cache > prefill ? cache : prefill)) : 4096;
        }
        if (stream || copy) {
            io.image_size = stream && valid ? (size_t)info.resident_bytes : mapped_size;
            io.image = read_private(fd, io.image_size, path);
        } else {
            io.image = mapped;
            io.image_size = mapped_size;
        }
        close(fd);
        if (stream) {
            io.fetch = fetch_copy;
            io.fetch_start = fetch_start;
            io.fetch_wait = fetch_wait;
        } else if (copy) {
            munmap(map, mapped_size); /* everything is in the private copy */
            mapped = 0;
            mapped_size = 0;
        }
    } else if (!arena_given) {
        arena_size = 64u << 20;
    }
    if (upload_size) {
        io.upload = map_anon(upload_size, 0);
        io.upload_capacity = upload_size;
    }
    io.prefill_batch = (uint32_t)batch;
    if (threads > 1) {
        if (pool_start((uint32_t)threads) != 0) return 2;
        io.parallel_for = pool_parallel_for;
        io.parallel_parts = (uint32_t)threads;
    }
    io.arena = map_anon(arena_size, 0);
    io.arena_size = arena_size;
    return link_serve(&io);
}
