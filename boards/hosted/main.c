/* The hosted boards: an operating-system process that maps the image, takes its arena from the OS, and
 * speaks the device side of the serial protocol over stdin/stdout. The same program on Linux (board
 * `hosted`, os_posix.c) and Windows (board `hosted_windows`, boards/hosted_windows/os_win32.c): all
 * they differ in is behind os.h.
 *   firmware [IMAGE] [--copy | --stream] [--threads N] [--batch N] [--arena-bytes N] [--upload-bytes N]
 * With --threads N the runtime computes on N threads (pool.c), lent through its parallel_for hook; it
 * computes up to --batch prompt tokens in one pass (colibri_options.prefill_batch; board.toml's
 * prefill_batch by default).
 * Without --arena-bytes the arena is the image's plan plus room for an expert cache of every
 * streamed expert (pages an OPEN does not use are never touched, so never resident).
 * With --upload-bytes the link accepts an image uploaded over it, as a board without a file system does.
 *
 * Where the runtime's image comes from, three ways:
 * - by default the file is mapped read-only, its pages made resident at once: open costs the runtime's
 *   one verifying pass over page-cache memory, not a copy (docs/PERFORMANCE.md). The file must not change
 *   while the board runs: a rewrite changes what the runtime reads; a truncation ends the board with a
 *   message and exit status 2, never a crash dump (Windows refuses to truncate a mapped file).
 * - --copy reads the file into private memory once at start: a file rewritten or truncated while the
 *   board runs changes nothing, at the price of a copy of the image (slower to open).
 * - --stream reads the resident part only into private memory, and OPEN needs an expert cache: the expert
 *   part stays a read-only mapping of the file, reached only by the fetch hooks, which copy expert blocks
 *   out of it and tell the OS what is coming and what is done with (os_advise: madvise or
 *   PrefetchVirtualMemory), so resident memory stays near the resident part plus the cache. A fetch
 *   from a file that shrank is a failed fetch (COLIBRI_E_FETCH), and a rewritten block fails its CRC
 *   (COLIBRI_E_EXPERT_CRC). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "colibri.h"
#include "link.h"
#include "os.h"
#include "pool.h"

static uint8_t in_buf[1 << 16];
static size_t in_len, in_pos;

static int read_byte(void) {
    if (in_pos == in_len) {
        in_len = os_read_stdin(in_buf, sizeof in_buf);
        in_pos = 0;
        if (!in_len) return -1;
    }
    return in_buf[in_pos++];
}

/* ---- expert fetch from the mapped image ---- */
static const uint8_t *mapped;
static size_t mapped_size;

static int fetch_copy(uint64_t offset, size_t bytes, void *dst) {
    if (offset > mapped_size || bytes > mapped_size - offset) return 1;
    if (os_copy_from_image(dst, mapped + offset, bytes)) return 1;
    os_advise(mapped + offset, bytes, 0);
    return 0;
}

/* Fetches started and not yet waited for: the runtime has at most one per cache slot. */
#define MAX_IN_FLIGHT 4096
static struct { void *dst; uint64_t offset; size_t bytes; } in_flight[MAX_IN_FLIGHT];
static unsigned n_in_flight;

static int fetch_start(uint64_t offset, size_t bytes, void *dst) {
    if (offset > mapped_size || bytes > mapped_size - offset || n_in_flight == MAX_IN_FLIGHT) return 1;
    os_advise(mapped + offset, bytes, 1); /* the OS reads ahead while the runtime computes */
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
    board_io io = { .board = BOARD_NAME, .read_byte = read_byte, .write = os_write_stdout, .cycles = os_clock,
                    .cycle_hz = os_clock_hz() };
    if (path) {
        mapped = os_map_image(path, &mapped_size, !stream && !copy);
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
            io.image = os_read_image(path, io.image_size);
        } else {
            io.image = mapped;
            io.image_size = mapped_size;
        }
        if (stream) {
            io.fetch = fetch_copy;
            io.fetch_start = fetch_start;
            io.fetch_wait = fetch_wait;
        } else if (copy) {
            os_unmap_image(mapped, mapped_size); /* everything is in the private copy */
            mapped = 0;
            mapped_size = 0;
        }
    } else if (!arena_given) {
        arena_size = 64u << 20;
    }
    if (upload_size) {
        io.upload = os_alloc(upload_size);
        io.upload_capacity = upload_size;
    }
    io.prefill_batch = (uint32_t)batch;
    if (threads > 1) {
        if (pool_start((uint32_t)threads) != 0) return 2;
        io.parallel_for = pool_parallel_for;
        io.parallel_parts = (uint32_t)threads;
    }
    io.arena = os_alloc(arena_size);
    io.arena_size = arena_size;
    return link_serve(&io);
}
