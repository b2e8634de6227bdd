/* An LD_PRELOAD library that counts heap allocations (malloc, calloc, realloc, posix_memalign,
 * aligned_alloc, memalign) in the process it is loaded into. On SIGUSR1 it writes the count so far to
 * the file named by MALLOC_COUNT_FILE. tests/test_sanitizers.py reads it around a generation on the
 * hosted board: the runtime promises no allocation after open, and the board none while it serves. */
#define _GNU_SOURCE
#include <fcntl.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <unistd.h>

extern void *__libc_malloc(size_t);
extern void *__libc_calloc(size_t, size_t);
extern void *__libc_realloc(void *, size_t);
extern void *__libc_memalign(size_t, size_t);

static atomic_ulong allocations;

void *malloc(size_t n) { atomic_fetch_add(&allocations, 1); return __libc_malloc(n); }
void *calloc(size_t n, size_t size) { atomic_fetch_add(&allocations, 1); return __libc_calloc(n, size); }
void *realloc(void *p, size_t n) { atomic_fetch_add(&allocations, 1); return __libc_realloc(p, n); }
void *memalign(size_t align, size_t n) { atomic_fetch_add(&allocations, 1); return __libc_memalign(align, n); }
void *aligned_alloc(size_t align, size_t n) { atomic_fetch_add(&allocations, 1); return __libc_memalign(align, n); }
int posix_memalign(void **out, size_t align, size_t n) {
    atomic_fetch_add(&allocations, 1);
    *out = __libc_memalign(align, n);
    return *out ? 0 : 12; /* ENOMEM */
}

/* async-signal-safe: open, write, close and a hand-made decimal */
static void report(int sig) {
    (void)sig;
    const char *path = getenv("MALLOC_COUNT_FILE");
    if (!path) return;
    char buf[24];
    int i = (int)sizeof buf;
    unsigned long v = atomic_load(&allocations);
    buf[--i] = '\n';
    do buf[--i] = (char)('0' + v % 10); while (v /= 10);
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0) return;
    if (write(fd, buf + i, sizeof buf - (size_t)i) < 0) { /* nothing to do in a signal handler */ }
    close(fd);
}

__attribute__((constructor)) static void install(void) {
    struct sigaction sa = { .sa_handler = report, .sa_flags = SA_RESTART };
    sigaction(SIGUSR1, &sa, 0);
}
