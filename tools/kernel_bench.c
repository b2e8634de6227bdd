/* Single-thread matvec throughput of each dtype's kernels on the hosted board, next to a STREAM-style
 * triad and a read-only stream, on buffers far larger than the last-level cache. Built by SCons for the
 * hosted board as build/hosted/<mode>/kernel_bench.elf; tools/bench_kernels.py runs it and writes the table
 * and JSON.
 *   kernel_bench.elf [MIB]          (MIB: bytes of weights per matrix, default 512)
 *   kernel_bench.elf --triad N      (only the triad, on N threads)
 *   kernel_bench.elf --read N [MIB] (only the read stream, on N threads over MIB, default 2048: decode's limit,
 *                                    tools/bench.py's denominator)
 * Prints one JSON object per line: {"what": ..., "kernels": ..., "gbps": ..., "seconds": ...}; a matvec's also
 * has "in_cache_gbps", the kernel on HOT_BYTES of the matrix (where memory is no limit).
 * A host tool, not firmware: it may allocate. */
#define _POSIX_C_SOURCE 200809L
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "internal.h"

#define COLS 4096u
#define REPEATS 7
#define HOT_BYTES (512u << 10) /* half the 2nd-level cache of the machines measured */
#define HOT_PASSES 64u
#define READ_MIB 2048u /* the read stream's buffer: several times any last-level cache here (this VM reports 32-300 MiB) */

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static volatile float sink;

/* fn on each of `threads` slices of `size` bytes at once, the first on this thread */
static void run_parallel(void *(*fn)(void *), void *slices, size_t size, int threads) {
    pthread_t tid[64];
    for (int k = 1; k < threads; k++) pthread_create(&tid[k], 0, fn, (char *)slices + (size_t)k * size);
    fn(slices);
    for (int k = 1; k < threads; k++) pthread_join(tid[k], 0);
}

/* triad a = b + s c over one slice; 3 x 4 bytes moved per element, as STREAM counts */
typedef struct { float *a; const float *b, *c; size_t n; } triad_slice;
static void *triad_run(void *arg) {
    triad_slice *t = arg;
    for (size_t i = 0; i < t->n; i++) t->a[i] = t->b[i] + 0.5f * t->c[i];
    return 0;
}

/* The triad over three arrays of `bytes` each, split into `threads` slices run at once (each thread
 * first-touches its own slice); the median of REPEATS passes. */
static double triad(size_t bytes, int threads) {
    size_t n = bytes / sizeof(float);
    float *a = malloc(n * sizeof(float)), *b = malloc(n * sizeof(float)), *c = malloc(n * sizeof(float));
    if (!a || !b || !c || threads < 1 || threads > 64) exit(1);
    for (size_t i = 0; i < n; i++) { a[i] = 0.0f; b[i] = 1.0f; c[i] = 2.0f; }
    triad_slice slice[64];
    for (int k = 0; k < threads; k++)
        slice[k] = (triad_slice){ a + n * k / threads, b + n * k / threads, c + n * k / threads,
                                  n * (k + 1) / threads - n * k / threads };
    double t[REPEATS];
    for (int r = 0; r < REPEATS; r++) {
        double t0 = now();
        run_parallel(triad_run, slice, sizeof slice[0], threads);
        t[r] = now() - t0;
        sink = a[r];
    }
    qsort(t, REPEATS, sizeof t[0], cmp);
    printf("{\"what\": \"triad\", \"kernels\": \"-\", \"threads\": %d, \"gbps\": %.3f, \"seconds\": %.5f}\n", threads,
           3.0 * (double)n * 4 / t[REPEATS / 2] / 1e9, t[REPEATS / 2]);
    free(a);
    free(b);
    free(c);
    return t[REPEATS / 2];
}

/* The read stream: a sum of 64-bit words over one slice, the bytes a decode step's weights are to the kernels
 * (read once, nothing written back). Four accumulators so the adds never wait on each other; AVX2 where the
 * CPU has it (one core keeps more cache-line fills in flight with 32-byte loads than with 8-byte ones). */
typedef struct { const uint64_t *p; size_t n; uint64_t sum; } read_slice;
#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
__attribute__((target("avx2"))) static uint64_t read_avx2(const uint64_t *p, size_t n) {
    __m256i s0 = _mm256_setzero_si256(), s1 = s0, s2 = s0, s3 = s0;
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        s0 = _mm256_add_epi64(s0, _mm256_load_si256((const __m256i *)(p + i)));
        s1 = _mm256_add_epi64(s1, _mm256_load_si256((const __m256i *)(p + i + 4)));
        s2 = _mm256_add_epi64(s2, _mm256_load_si256((const __m256i *)(p + i + 8)));
        s3 = _mm256_add_epi64(s3, _mm256_load_si256((const __m256i *)(p + i + 12)));
    }
    uint64_t lanes[4];
    _mm256_storeu_si256((__m256i *)lanes, _mm256_add_epi64(_mm256_add_epi64(s0, s1), _mm256_add_epi64(s2, s3)));
    uint64_t sum = lanes[0] + lanes[1] + lanes[2] + lanes[3];
    for (; i < n; i++) sum += p[i];
    return sum;
}
static int have_avx2(void) { return __builtin_cpu_supports("avx2"); }
#else
static uint64_t read_avx2(const uint64_t *p, size_t n) { (void)p; (void)n; return 0; }
static int have_avx2(void) { return 0; }
#endif
static uint64_t read_words(const uint64_t *p, size_t n) {
    uint64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
    size_t i = 0;
    for (; i + 4 <= n; i += 4) { s0 += p[i]; s1 += p[i + 1]; s2 += p[i + 2]; s3 += p[i + 3]; }
    for (; i < n; i++) s0 += p[i];
    return s0 + s1 + s2 + s3;
}
static void *read_run(void *arg) {
    read_slice *t = arg;
    t->sum = have_avx2() ? read_avx2(t->p, t->n) : read_words(t->p, t->n);
    return 0;
}
static void *read_touch(void *arg) {
    read_slice *t = arg;
    memset((void *)t->p, 1, t->n * sizeof(uint64_t));
    return 0;
}

/* The read stream over `bytes`, split into `threads` slices read at once (each thread first-touches its own
 * slice); GB/s counts the bytes read; the median of REPEATS passes. */
static double read_stream(size_t bytes, int threads) {
    size_t n = bytes / sizeof(uint64_t) / 64 * 64;
    uint64_t *a = aligned_alloc(64, n * sizeof(uint64_t));
    if (!a || threads < 1 || threads > 64) exit(1);
    read_slice slice[64];
    for (int k = 0; k < threads; k++) /* slices of whole 64-byte lines, so every load is aligned */
        slice[k] = (read_slice){ a + n / 8 * k / threads * 8, (n / 8 * (k + 1) / threads - n / 8 * k / threads) * 8, 0 };
    run_parallel(read_touch, slice, sizeof slice[0], threads);
    double t[REPEATS];
    for (int r = 0; r < REPEATS; r++) {
        double t0 = now();
        run_parallel(read_run, slice, sizeof slice[0], threads);
        t[r] = now() - t0;
        uint64_t sum = 0;
        for (int k = 0; k < threads; k++) sum += slice[k].sum;
        sink = (float)sum;
    }
    qsort(t, REPEATS, sizeof t[0], cmp);
    printf("{\"what\": \"read\", \"kernels\": \"%s\", \"threads\": %d, \"gbps\": %.3f, \"seconds\": %.5f, \"mib\": %zu}\n",
           have_avx2() ? "avx2" : "scalar", threads, (double)n * 8 / t[REPEATS / 2] / 1e9, t[REPEATS / 2], bytes >> 20);
    free(a);
    return t[REPEATS / 2];
}

/* the median of REPEATS timed runs of `passes` times w x (rows of COLS weights; out holds one result per
 * row), per pass */
static double time_matvec(const kernel_set *k, uint32_t dtype, const void *w, const uint16_t *scales, uint32_t rows,
                          uint32_t passes, const float *x, const q8_vector *xq, float *out) {
    const uint32_t blocks = COLS / QBLOCK;
    double t[REPEATS];
    for (int r = 0; r < REPEATS; r++) {
        double t0 = now();
        for (uint32_t pass = 0; pass < passes; pass++) switch (dtype) {
        case DTYPE_F32:
            for (uint32_t i = 0; i < rows; i++) out[i] = k->dot_f32((const float *)w + (size_t)i * COLS, x, COLS);
            break;
        case DTYPE_F16:
            for (uint32_t i = 0; i < rows; i++) out[i] = k->dot_f16((const uint16_t *)w + (size_t)i * COLS, x, COLS);
            break;
        case DTYPE_BF16:
            for (uint32_t i = 0; i < rows; i++) out[i] = k->dot_bf16((const uint16_t *)w + (size_t)i * COLS, x, COLS);
            break;
        case DTYPE_Q8_0: k->rows_q8_0(w, scales, xq, blocks, rows, out); break;
        case DTYPE_Q4_0: k->rows_q4_0(w, scales, xq, blocks, rows, out); break;
        default: rows_block_for(k, dtype)(w, xq, blocks, rows, out);
        }
        t[r] = (now() - t0) / passes;
        sink = out[rows - 1];
    }
    qsort(t, REPEATS, sizeof t[0], cmp);
    return t[REPEATS / 2];
}

int main(int argc, char **argv) {
    if (argc == 3 && strcmp(argv[1], "--triad") == 0) {
        triad(256u << 20, atoi(argv[2]));
        return 0;
    }
    if ((argc == 3 || argc == 4) && strcmp(argv[1], "--read") == 0) {
        read_stream((size_t)(argc == 4 ? (unsigned)atoi(argv[3]) : READ_MIB) << 20, atoi(argv[2]));
        return 0;
    }
    const size_t budget = (size_t)(argc > 1 ? atoi(argv[1]) : 512) << 20;
    static const char *names[DTYPE_COUNT] = { "f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "mxfp4", "q4_k", "q5_k",
                                              "q6_k" };
    double bytes_per_weight[DTYPE_COUNT]; /* scales included */
    for (uint32_t d = 0; d < DTYPE_COUNT; d++)
        bytes_per_weight[d] = (double)(DTYPE_TRAITS[d].bytes + DTYPE_TRAITS[d].scale_bytes) / DTYPE_TRAITS[d].block;
    float *x = malloc(COLS * sizeof(float));
    int8_t *xq = malloc(COLS);
    float *xq_scale = malloc(COLS / QBLOCK * sizeof(float));
    int32_t *xq_sum = malloc(COLS / QBLOCK * sizeof(int32_t));
    uint8_t *w = malloc(budget);
    uint16_t *scales = malloc(budget / 16);
    float *out = malloc(budget / COLS * sizeof(float)); /* one per row: the scales cap every dtype at budget / COLS rows */
    if (!x || !xq || !xq_scale || !xq_sum || !w || !scales || !out) return 1;
    srand(1);
    for (uint32_t i = 0; i < COLS; i++) x[i] = (float)rand() / (float)RAND_MAX - 0.5f;
    quantize_q8_0_scalar(xq, xq_scale, xq_sum, x, COLS);
    const q8_vector xv = { xq, xq_scale, xq_sum };
    for (size_t i = 0; i < budget; i++) w[i] = (uint8_t)(rand() & 0x3F); /* finite f16/bf16 patterns */
    for (size_t i = 0; i < budget / 32; i++) scales[i] = 0x2000;

    triad(budget / 2, 1);
    read_stream((size_t)READ_MIB << 20, 1);

    /* Each kernel twice: streaming the whole budget from memory, then on HOT_BYTES of it that stay in
     * the 2nd-level cache, many passes per timing: what the kernel computes at when memory is no limit. */
    const kernel_set *sets[] = { &kernels_scalar, kernels_select() };
    for (uint32_t dtype = 0; dtype < DTYPE_COUNT; dtype++) {
        uint32_t rows = (uint32_t)((double)budget / (bytes_per_weight[dtype] * COLS));
        if (DTYPE_TRAITS[dtype].scale_bytes && (size_t)rows * COLS / QBLOCK * 2 > budget / 16) rows = (uint32_t)(budget / 16 / 2 / (COLS / QBLOCK));
        const uint32_t hot_rows = (uint32_t)(HOT_BYTES / (bytes_per_weight[dtype] * COLS));
        const double bytes_per_row = bytes_per_weight[dtype] * COLS;
        for (int s = 0; s < 2; s++) {
            if (s == 1 && sets[1] == sets[0]) break;
            double sec = time_matvec(sets[s], dtype, w, scales, rows, 1, x, &xv, out);
            double hot = time_matvec(sets[s], dtype, w, scales, hot_rows, HOT_PASSES, x, &xv, out);
            printf("{\"what\": \"matvec %s\", \"kernels\": \"%s\", \"gbps\": %.3f, \"seconds\": %.5f, \"rows\": %u, \"cols\": %u, "
                   "\"in_cache_gbps\": %.3f}\n",
                   names[dtype], sets[s]->name, bytes_per_row * rows / sec / 1e9, sec, rows, COLS,
                   bytes_per_row * hot_rows / hot / 1e9);
            fflush(stdout);
        }
    }
    return 0;
}
