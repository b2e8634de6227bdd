/* The hosted board's operating system calls on Linux (os.h): stdin/stdout, mmap, madvise, a futex. */
#define _GNU_SOURCE /* MAP_ANONYMOUS, MAP_POPULATE, syscall */
#include "os.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/futex.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

size_t os_read_stdin(uint8_t *buf, size_t n) {
    ssize_t r;
    do r = read(0, buf, n); while (r < 0 && errno == EINTR);
    return r > 0 ? (size_t)r : 0;
}

void os_write_stdout(const uint8_t *p, size_t n) {
    while (n) {
        ssize_t w = write(1, p, n);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) exit(3); /* host went away */
        p += w;
        n -= (size_t)w;
    }
}

static int open_image(const char *path, size_t *size) {
    int fd = open(path, O_RDONLY);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) != 0) {
        fprintf(stderr, "colibri-hosted: cannot read image %s: %s\n", path, strerror(errno));
        exit(2);
    }
    if (st.st_size <= 0) {
        fprintf(stderr, "colibri-hosted: cannot read image %s: empty file\n", path);
        exit(2);
    }
    *size = (size_t)st.st_size;
    return fd;
}

/* n bytes of zeroed private memory; with populate its pages are made now, not at first touch */
static void *map_anon(size_t n, int populate) {
    void *p = mmap(0, n ? n : 1, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | (populate ? MAP_POPULATE : 0), -1, 0);
    if (p == MAP_FAILED) {
        fprintf(stderr, "colibri-hosted: cannot map %zu bytes\n", n);
        exit(2);
    }
    return p;
}

/* A read of a mapped page past the end of a file that shrank since it was mapped raises SIGBUS. Inside
 * os_copy_from_image that is a failed copy; anywhere else (the runtime reading the image) nothing can go on. */
static sigjmp_buf copy_fault;
static volatile sig_atomic_t copying;

static void on_sigbus(int sig) {
    (void)sig;
    if (copying) siglongjmp(copy_fault, 1);
    static const char msg[] = "colibri-hosted: the image file shrank while the board was using it\n";
    if (write(2, msg, sizeof msg - 1) < 0) _exit(2);
    _exit(2);
}

const uint8_t *os_map_image(const char *path, size_t *size, int populate) {
    int fd = open_image(path, size);
    void *map = mmap(0, *size, PROT_READ, MAP_PRIVATE | (populate ? MAP_POPULATE : 0), fd, 0);
    if (map == MAP_FAILED) {
        fprintf(stderr, "colibri-hosted: mmap %s: %s\n", path, strerror(errno));
        exit(2);
    }
    close(fd);
    struct sigaction sa = { .sa_handler = on_sigbus };
    sigaction(SIGBUS, &sa, 0);
    return map;
}

void os_unmap_image(const uint8_t *image, size_t size) { munmap((void *)image, size); }

void *os_alloc(size_t n) { return map_anon(n, 0); }

const uint8_t *os_read_image(const char *path, size_t n) {
    size_t size;
    int fd = open_image(path, &size);
    uint8_t *p = map_anon(n, 1); /* faulting its pages one by one inside read() is several times slower */
    for (size_t done = 0; done < n;) {
        ssize_t r = pread(fd, p + done, n - done, (off_t)done);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) {
            fprintf(stderr, "colibri-hosted: cannot read image %s: %s\n", path, r ? strerror(errno) : "file shrank");
            exit(2);
        }
        done += (size_t)r;
    }
    close(fd);
    mprotect(p, n ? n : 1, PROT_READ);
    return p;
}

int os_copy_from_image(void *dst, const uint8_t *src, size_t n) {
    if (sigsetjmp(copy_fault, 1)) {
        copying = 0;
        return 1;
    }
    copying = 1;
    memcpy(dst, src, n);
    copying = 0;
    return 0;
}

/* madvise every page [p, p + n) touches (WILLNEED), or only the whole pages inside it (DONTNEED: a page
 * shared with a neighbouring block may still be wanted) */
void os_advise(const uint8_t *p, size_t n, int willneed) {
    const uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
    uintptr_t lo = (uintptr_t)p, hi = lo + n;
    if (willneed) {
        lo &= ~(page - 1);
        hi = (hi + page - 1) & ~(page - 1);
    } else {
        lo = (lo + page - 1) & ~(page - 1);
        hi &= ~(page - 1);
    }
    if (hi > lo) madvise((void *)lo, hi - lo, willneed ? MADV_WILLNEED : MADV_DONTNEED);
}

uint64_t os_clock(void *user) {
    (void)user;
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

uint64_t os_clock_hz(void) { return 1000000000u; }

static void *thread_main(void *fn) {
    ((void (*)(void))fn)();
    return 0;
}

int os_thread_start(void (*fn)(void)) {
    pthread_t t;
    if (pthread_create(&t, 0, thread_main, (void *)fn) != 0) return -1;
    pthread_detach(t);
    return 0;
}

void os_wait(_Atomic uint32_t *word, uint32_t seen) {
    syscall(SYS_futex, word, FUTEX_WAIT_PRIVATE, seen, 0, 0, 0);
}

void os_wake_all(_Atomic uint32_t *word) { syscall(SYS_futex, word, FUTEX_WAKE_PRIVATE, 0x7FFFFFFF, 0, 0, 0); }

void os_relax(void) {
#if defined(__x86_64__)
    _mm_pause();
#endif
}
