/* The optimized kernels against the scalar ones, on the board itself: a program built by SCons as
 * build/<board>/<mode>/kernel_check.elf from the board's own startup and drivers, with this file in
 * place of the protocol (it defines link_serve, which every board's main calls). It runs every
 * kernel of kernels_select() and of kernels_scalar on the same random inputs (lengths with tails:
 * not multiples of the vector width or of the block size; weights over the whole int8 range, f16
 * subnormals and bf16 values of every exponent), compares the results bit for bit, prints a report
 * and exits with 0 only if every case matched. tests/test_kernels.py runs it on every board. */
#include "internal.h"
#include "link.h"

#define MAX_N 1100u
#define MAX_BLOCKS (MAX_N / QBLOCK + 1u)
#define CASES 400u

static float w32[MAX_N], x32[MAX_N];
static uint16_t w16[MAX_N], scales[MAX_BLOCKS];
static int8_t w8[MAX_BLOCKS * QBLOCK], xq[MAX_BLOCKS * QBLOCK];
static uint8_t w4[MAX_BLOCKS * QBLOCK / 2];
static float xq_scale[MAX_BLOCKS];
static int32_t xq_sum[MAX_BLOCKS];

static uint64_t rng = 0x9E3779B97F4A7C15u;
static uint32_t next(void) { /* xorshift64* */
    rng ^= rng >> 12;
    rng ^= rng << 25;
    rng ^= rng >> 27;
    return (uint32_t)((rng * 0x2545F4914F6CDD1Du) >> 32);
}
static float uniform(void) { return (float)(next() >> 8) * (1.0f / 16777216.0f) * 2.0f - 1.0f; }

static const board_io *out;
static void say(const char *s) {
    size_t n = 0;
    while (s[n]) n++;
    out->write((const uint8_t *)s, n);
}
static void say_u32(uint32_t v) {
    char buf[11];
    int i = 10;
    buf[i] = 0;
    do buf[--i] = (char)('0' + v % 10); while (v /= 10);
    say(buf + i);
}

static uint32_t bits(float f) {
    union { float f; uint32_t u; } v = { f };
    return v.u;
}

static uint32_t mismatches;
static void check(const char *kernel, uint32_t n, float got, float want) {
    if (bits(got) == bits(want)) return;
    if (mismatches++ < 10) {
        say("MISMATCH ");
        say(kernel);
        say(" n=");
        say_u32(n);
        say("\r\n");
    }
}

static void fill(uint32_t n, uint32_t blocks) {
    for (uint32_t i = 0; i < n; i++) {
        w32[i] = uniform();
        x32[i] = uniform() * 4.0f;
        /* f16 / bf16 bit patterns of every finite kind, subnormals included (no inf/NaN: they make
         * 0 * inf comparisons meaningless) */
        uint16_t h = (uint16_t)next();
        if ((h & 0x7C00u) == 0x7C00u) h &= 0x83FFu;
        w16[i] = h;
    }
    for (uint32_t i = 0; i < blocks * QBLOCK; i++) {
        w8[i] = (int8_t)(next() & 0xFF);                   /* -128..127: the kernels must not assume -127 */
        xq[i] = (int8_t)((int32_t)(next() % 255u) - 127);  /* the activation quantizer's range */
    }
    for (uint32_t i = 0; i < blocks * QBLOCK / 2; i++) w4[i] = (uint8_t)next();
    for (uint32_t b = 0; b < blocks; b++) {
        scales[b] = f32_to_f16(uniform() * 0.05f);
        xq_scale[b] = uniform() * 0.03f;
        xq_sum[b] = 0;
        for (uint32_t i = 0; i < QBLOCK; i++) xq_sum[b] += xq[b * QBLOCK + i];
    }
}

static void say_hex64(uint64_t v) { /* hex: 64-bit division would pull libgcc into 32-bit boards */
    static const char digits[] = "0123456789abcdef";
    char buf[17];
    for (int i = 0; i < 16; i++) buf[i] = digits[(v >> (60 - 4 * i)) & 15u];
    buf[16] = 0;
    say(buf);
}

/* The cycle counter across one long phase: two readings around a spin of 2^27 iterations, more than
 * 2^24 cycles on every board (a 24-bit counter would wrap unseen). tests/test_kernels.py compares
 * their difference with the time the host saw pass between the two lines. */
static void clock_check(const board_io *io) {
    if (!io->cycles) return;
    say("clock ");
    say_hex64(io->cycles(0));
    say("\r\n");
    for (volatile uint32_t spin = 1u << 29; spin; spin--) {}
    say("clock ");
    say_hex64(io->cycles(0));
    say(" hz ");
    say_hex64(io->cycle_hz);
    say("\r\n");
}

int link_serve(const board_io *io) {
    out = io;
    const kernel_set *fast = kernels_select(), *ref = &kernels_scalar;
    say("kernel_check ");
    say(io->board);
    say(": kernels ");
    say(fast->name);
    say("\r\n");
    uint32_t cases = 0;
    for (uint32_t c = 0; c < CASES; c++) {
        /* small lengths often (every tail), large ones sometimes (the main loops) */
        uint32_t n = c < 80 ? c + 1 : 1 + next() % MAX_N, blocks = (n + QBLOCK - 1) / QBLOCK;
        fill(n, blocks);
        check("dot_f32", n, fast->dot_f32(w32, x32, n), ref->dot_f32(w32, x32, n));
        check("dot_f16", n, fast->dot_f16(w16, x32, n), ref->dot_f16(w16, x32, n));
        for (uint32_t i = 0; i < n; i++) w16[i] &= 0xC7FFu; /* bf16 magnitudes below 2^8: finite products */
        check("dot_bf16", n, fast->dot_bf16(w16, x32, n), ref->dot_bf16(w16, x32, n));
        const q8_vector xv = { xq, xq_scale, xq_sum };
        check("dot_q8_0", blocks, fast->dot_q8_0(w8, scales, &xv, blocks), ref->dot_q8_0(w8, scales, &xv, blocks));
        check("dot_q4_0", blocks, fast->dot_q4_0(w4, scales, &xv, blocks), ref->dot_q4_0(w4, scales, &xv, blocks));
        cases += 5;
    }
    say("kernel_check: ");
    say_u32(cases);
    say(" cases, ");
    say_u32(mismatches);
    say(" mismatches\r\n");
    clock_check(io);
    return mismatches ? 1 : 0;
}
