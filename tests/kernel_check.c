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

/* Two rows of weights (a tile reads rows w and w + n) and two vectors (four quantized ones: the quantized tiles take
 * up to TILE_X); the dots use the first of each. The quantized rows kernels take a run of ROWS rows: the x86 Q4_0
 * one pairs x's values first from 8 rows on. */
#define ROWS 9u
#define TILE_X 4u
static float w32[2 * MAX_N], x32[2 * MAX_N];
static uint16_t w16[2 * MAX_N], scales[ROWS * MAX_BLOCKS];
static int8_t w8[ROWS * MAX_BLOCKS * QBLOCK], xq[TILE_X * MAX_BLOCKS * QBLOCK];
static uint8_t w4[ROWS * MAX_BLOCKS * QBLOCK / 2];
static uint8_t wb[ROWS * MAX_BLOCKS * 24u]; /* rows of a block dtype (Q5_1's 24 bytes per 32 values the widest) */
static float xq_scale[TILE_X * MAX_BLOCKS];
static int32_t xq_sum[TILE_X * MAX_BLOCKS];
/* quantize_q8_0's outputs, the kernel set's and the scalar one's */
static int8_t qa[MAX_BLOCKS * QBLOCK], qb[MAX_BLOCKS * QBLOCK];
static float sa[MAX_BLOCKS], sb[MAX_BLOCKS];
static int32_t suma[MAX_BLOCKS], sumb[MAX_BLOCKS];
/* swiglu's gate vector, the kernel set's copy and the scalar one's */
static float ga[MAX_N], gb[MAX_N];

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

/* A tile's four results against four reference dots (rows w, w + n; vectors x, x + n). */
static uint32_t tiles;
static void check_tile(const char *kernel, uint32_t n, const float got[4], const float want[4]) {
    for (int i = 0; i < 4; i++) check(kernel, n, got[i], want[i]);
    tiles++;
}
static const float *ref_tile_float(float (*dot)(const float *, const float *, uint32_t), const float *w, const float *x,
                                   uint32_t n, float want[4]) {
    for (int i = 0; i < 4; i++) want[i] = dot(w + (i / 2) * n, x + (i % 2) * n, n);
    return want;
}
static const float *ref_tile_half(float (*dot)(const uint16_t *, const float *, uint32_t), const uint16_t *w,
                                  const float *x, uint32_t n, float want[4]) {
    for (int i = 0; i < 4; i++) want[i] = dot(w + (i / 2) * n, x + (i % 2) * n, n);
    return want;
}

/* The quantized tiles (two rows of w8 or w4 times two vectors of xq) and the runs of rows by four vectors (ROWS - 1
 * rows, the vectors TILE_X x blocks apart) against the scalar rows, bit for bit. Every eighth case first makes one block's x scale NaN and another's weight scale infinite (f16
 * 0x7C00), where the set has tiles: every NaN that then arises is x86's default NaN (that of 0 * inf, inf - inf),
 * so even the payloads must match whatever order the additions took their operands in. */
static float f32_bits(uint32_t u) {
    union { uint32_t u; float f; } v = { u };
    return v.f;
}
static void check_quant_tiles(const kernel_set *fast, const kernel_set *ref, uint32_t c, uint32_t blocks) {
    if (!fast->tile_q8_0 && !fast->tile_q4_0) return;
    if (c % 8 == 2) {
        xq_scale[next() % (TILE_X * blocks)] = f32_bits(0xFFC00000u);
        scales[next() % (2 * blocks)] = 0x7C00u;
    }
    q8_vector xs[TILE_X];
    for (uint32_t t = 0; t < TILE_X; t++) xs[t] = (q8_vector){ xq + t * blocks * QBLOCK, xq_scale + t * blocks, xq_sum + t * blocks };
    float want[2 * TILE_X], got[4], r[2];
    for (uint32_t t = 0; t < TILE_X; t++) {
        ref->rows_q8_0(w8, scales, &xs[t], blocks, 2, r);
        want[t] = r[0];
        want[TILE_X + t] = r[1];
    }
    for (uint32_t q4 = 0; q4 < 2; q4++) {
        if (q4)
            for (uint32_t t = 0; t < TILE_X; t++) {
                ref->rows_q4_0(w4, scales, &xs[t], blocks, 2, r);
                want[t] = r[0];
                want[TILE_X + t] = r[1];
            }
        if (q4 ? !fast->tile_q4_0 : !fast->tile_q8_0) continue;
        if (q4) fast->tile_q4_0(w4, scales, xs, blocks, got);
        else fast->tile_q8_0(w8, scales, xs, blocks, got);
        for (uint32_t i = 0; i < 4; i++) check(q4 ? "tile_q4_0" : "tile_q8_0", blocks, got[i], want[i / 2 * TILE_X + i % 2]);
        tiles++;
    }
#if defined(COLIBRI_X86_SIMD)
    if (fast->rows4_q8_0 || fast->rows4_q4_0) {
        enum { N = ROWS - 1, STRIDE = ROWS + 3 };
        float want4[TILE_X * STRIDE], got4[TILE_X * STRIDE], rr[N];
        for (uint32_t q4 = 0; q4 < 2; q4++) {
            if (q4 ? !fast->rows4_q4_0 : !fast->rows4_q8_0) continue;
            for (uint32_t t = 0; t < TILE_X; t++) {
                if (q4) ref->rows_q4_0(w4, scales, &xs[t], blocks, N, rr);
                else ref->rows_q8_0(w8, scales, &xs[t], blocks, N, rr);
                for (uint32_t i = 0; i < N; i++) want4[t * STRIDE + i] = rr[i];
            }
            if (q4) fast->rows4_q4_0(w4, scales, xs, blocks, N, got4, STRIDE);
            else fast->rows4_q8_0(w8, scales, xs, blocks, N, got4, STRIDE);
            for (uint32_t t = 0; t < TILE_X; t++)
                for (uint32_t i = 0; i < N; i++) check(q4 ? "rows4_q4_0" : "rows4_q8_0", blocks, got4[t * STRIDE + i], want4[t * STRIDE + i]);
            tiles++;
        }
    }
#endif
}

/* tiny: magnitudes whose products (and the quantized dots' block terms) are subnormal, which Helium
 * flushes to zero and the other boards keep: the kernels must still give the scalar bits. */
static void fill(uint32_t n, uint32_t blocks, int tiny) {
    const float scale = tiny ? 1e-20f : 1.0f;
    n *= 2; /* two rows, two vectors */
    for (uint32_t i = 0; i < n; i++) {
        w32[i] = uniform() * scale;
        x32[i] = uniform() * 4.0f * scale;
        /* f16 / bf16 bit patterns of every finite kind, subnormals included (no inf/NaN: they make
         * 0 * inf comparisons meaningless) */
        uint16_t h = (uint16_t)next();
        if ((h & 0x7C00u) == 0x7C00u) h &= 0x83FFu;
        w16[i] = h;
    }
    for (uint32_t i = 0; i < ROWS * blocks * QBLOCK; i++) w8[i] = (int8_t)(next() & 0xFF); /* -128..127: not only -127 */
    for (uint32_t i = 0; i < ROWS * blocks * QBLOCK / 2; i++) w4[i] = (uint8_t)next();
    for (uint32_t b = 0; b < ROWS * blocks; b++) scales[b] = f32_to_f16(uniform() * 0.05f);
    for (uint32_t i = 0; i < TILE_X * blocks * QBLOCK; i++) xq[i] = (int8_t)((int32_t)(next() % 255u) - 127); /* the quantizer's range */
    for (uint32_t b = 0; b < TILE_X * blocks; b++) {
        xq_scale[b] = uniform() * 0.03f * scale * scale;
        xq_sum[b] = 0;
        for (uint32_t i = 0; i < QBLOCK; i++) xq_sum[b] += xq[b * QBLOCK + i];
    }
}

/* The kernel set's quantize_q8_0 against the scalar one on x32: values, scales and sums bit for bit. Some
 * cases get a NaN, an infinity, subnormal values (which Helium flushes) or an all-zero block. */
static void check_quantize(const kernel_set *fast, const kernel_set *ref, uint32_t c, uint32_t n, uint32_t blocks) {
    if (c % 8 == 5) {
        x32[next() % n] = 0.0f / 0.0f;
        x32[next() % n] = -1.0f / 0.0f;
    }
    if (c % 8 == 6)
        for (uint32_t i = 0; i < n; i++) x32[i] *= 1e-39f; /* subnormal, and 0 where the product underflows */
    if (c % 8 == 7)
        for (uint32_t i = 0; i < n && i < QBLOCK; i++) x32[i] = 0.0f;
    fast->quantize_q8_0(qa, sa, suma, x32, n);
    ref->quantize_q8_0(qb, sb, sumb, x32, n);
    uint32_t bad = 0;
    for (uint32_t i = 0; i < blocks * QBLOCK; i++) bad |= qa[i] != qb[i];
    for (uint32_t b = 0; b < blocks; b++) bad |= bits(sa[b]) != bits(sb[b]) || suma[b] != sumb[b];
    check("quantize_q8_0", n, bad ? 1.0f : 0.0f, 0.0f);
}

/* The kernel set's swiglu against the scalar one, in place on copies of a gate vector (times w32): gates
 * within +-8 or +-120 (beyond the exponential's fast range both ways), or on its edges, with a NaN and
 * infinities in some cases. */
static void check_swiglu(const kernel_set *fast, const kernel_set *ref, uint32_t c, uint32_t n) {
    static const float edges[] = { 87.0f, -87.0f, 88.0f, -88.0f, 87.5f, -87.00001f, 88.00001f, 1e-40f, -0.0f };
    const float span = c % 3 == 0 ? 120.0f : 8.0f;
    for (uint32_t i = 0; i < n; i++) ga[i] = c % 5 == 4 ? edges[next() % 9] : uniform() * span;
    if (c % 7 == 6) {
        ga[next() % n] = 0.0f / 0.0f;
        ga[next() % n] = 1.0f / 0.0f;
        ga[next() % n] = -1.0f / 0.0f;
    }
    for (uint32_t i = 0; i < n; i++) gb[i] = ga[i];
    fast->swiglu(ga, w32, n);
    ref->swiglu(gb, w32, n);
    uint32_t bad = 0;
    for (uint32_t i = 0; i < n; i++) bad |= bits(ga[i]) != bits(gb[i]);
    check("swiglu", n, bad ? 1.0f : 0.0f, 0.0f);
}

/* Each block dtype's rows against the scalar ones on random blocks: random bits everywhere but the f16 scale fields
 * (finite, below 0.05 in magnitude) and MXFP4's exponent (2^-28 .. 2^11), so a sum overflows nowhere. K-quant rows
 * take the whole 256-element blocks of `blocks` (none when fewer than 8). Every other call probes the integer sums'
 * edges instead, with x all +127, all -127 or +-127 at random (the quantizer's extremes): every weight byte 0xFF (the
 * largest nibbles, 5- and 6-bit values, MXFP4's -12), or 0x00 and 0xFF at random (Q6_K's -32 too), Q6_K's scales
 * all -128 or -128 and 127 at random: where a SIMD kernel's byte products would saturate if any could. Those calls
 * also give half the f16 fields an edge value (the smallest subnormal, the largest negative one, -0, 65504: a kernel's
 * own f16 widening) and half of MXFP4's exponents 0, 1 (subnormal factors), 2 or 230 (2^102: no sum overflows). */
static const struct { uint32_t dtype; uint8_t f16_at[2]; const char *name; } DTYPES_CHECKED[] = {
    { DTYPE_Q4_1, { 0, 2 }, "rows_q4_1" }, { DTYPE_Q5_0, { 0, 0 }, "rows_q5_0" }, { DTYPE_Q5_1, { 0, 2 }, "rows_q5_1" },
    { DTYPE_MXFP4, { 255, 255 }, "rows_mxfp4" }, { DTYPE_Q4_K, { 0, 2 }, "rows_q4_k" },
    { DTYPE_Q5_K, { 0, 2 }, "rows_q5_k" }, { DTYPE_Q6_K, { 208, 208 }, "rows_q6_k" },
};
static int8_t xe[MAX_BLOCKS * QBLOCK];
static int32_t xe_sum[MAX_BLOCKS];
static void check_block_dtypes(const kernel_set *fast, const kernel_set *ref, uint32_t blocks) {
    static uint32_t calls;
    const uint32_t call = calls++ % 8;
    const uint32_t edge = call % 2 ? call / 2 % 3 + 1 : 0; /* 0: random; 1: 0xFF, +127; 2: 0xFF, -127; 3: 0x00/0xFF, +-127 */
    for (uint32_t b = 0; b < blocks && edge; b++) {
        xe_sum[b] = 0;
        for (uint32_t i = 0; i < QBLOCK; i++) {
            xe[b * QBLOCK + i] = (int8_t)(edge == 1 ? 127 : edge == 2 ? -127 : next() & 1 ? 127 : -127);
            xe_sum[b] += xe[b * QBLOCK + i];
        }
    }
    static const uint16_t EDGE_F16[4] = { 0x0001, 0x83FF, 0x8000, 0x7BFF };
    static const uint8_t EDGE_E8M0[4] = { 0, 1, 2, 230 };
    for (uint32_t k = 0; k < sizeof DTYPES_CHECKED / sizeof DTYPES_CHECKED[0]; k++) {
        const uint32_t dtype = DTYPES_CHECKED[k].dtype, per = DTYPE_TRAITS[dtype].block / QBLOCK;
        const uint32_t n_blocks = blocks / per * per, row_blocks = n_blocks / per, bytes = DTYPE_TRAITS[dtype].bytes;
        rows_block_fn f = rows_block_for(fast, dtype), g = rows_block_for(ref, dtype);
        if (!f || !n_blocks) continue;
        for (uint32_t i = 0; i < ROWS * row_blocks * bytes; i++)
            wb[i] = (uint8_t)(!edge ? next() : edge < 3 || next() & 1 ? 0xFFu : 0x00u);
        for (uint32_t b = 0; b < ROWS * row_blocks; b++) {
            uint8_t *blk = wb + b * bytes;
            if (dtype == DTYPE_MXFP4) blk[0] = edge && next() & 1 ? EDGE_E8M0[next() % 4u] : (uint8_t)(100u + next() % 40u);
            for (uint32_t j = 0; j < 16 && edge && dtype == DTYPE_Q6_K; j++) blk[192 + j] = edge < 3 || next() & 1 ? 0x80u : 0x7Fu;
            for (uint32_t j = 0; j < 2 && dtype != DTYPE_MXFP4; j++) {
                uint16_t h = f32_to_f16(uniform() * 0.05f);
                if (edge && next() & 1) h = EDGE_F16[next() % 4u];
                blk[DTYPES_CHECKED[k].f16_at[j]] = (uint8_t)h;
                blk[DTYPES_CHECKED[k].f16_at[j] + 1] = (uint8_t)(h >> 8);
            }
        }
        const q8_vector xv = { edge ? xe : xq, xq_scale, edge ? xe_sum : xq_sum };
        float got[ROWS], want[ROWS];
        f(wb, &xv, n_blocks, ROWS, got);
        g(wb, &xv, n_blocks, ROWS, want);
        for (uint32_t r = 0; r < ROWS; r++) check(DTYPES_CHECKED[k].name, n_blocks, got[r], want[r]);
    }
}

/* The K-quant runs of rows by four vectors (rows4_q4_k, rows4_q5_k, rows4_q6_k) against the scalar rows, once a case
 * each: rows of 1 to 4 256-element blocks (6 rows), and every eighth case of 13 (18 rows, the four vectors overlapping
 * in xq: more than the 12 the x86 sets transpose at once and more than the 16 rows a segment of them serves). Random blocks and x as in
 * check_block_dtypes; every fourth case its integer edges (weight bytes 0xFF, or 0x00 and 0xFF at random, with x
 * +127, -127 or +-127 at random; Q6_K's scales -128 and 127), and every eighth a NaN x scale and an infinite d (f16
 * 0x7C00) in one block, whose NaNs are all x86's default one. */
#if defined(COLIBRI_X86_SIMD) && WITH_BLOCK_DTYPES
#define LONG_ROWS 18u
static uint8_t wl[LONG_ROWS * 13 * 210]; /* the long rows: 13 Q6_K blocks each */
static void check_rows4_k(const kernel_set *fast, const kernel_set *ref, uint32_t c) {
    if (!fast->rows4_q4_k && !fast->rows4_q5_k && !fast->rows4_q6_k) return;
    const int long_rows = c % 8 == 6;
    const uint32_t edge = c % 4 == 1 ? c / 4 % 3 + 1 : 0;
    const uint32_t groups = long_rows ? 13 : 1 + c % 4, rows = long_rows ? LONG_ROWS : 6, blocks = 8 * groups;
    uint8_t *const wk = long_rows ? wl : wb;
    const uint32_t apart = long_rows ? 12 : blocks, x_blocks = 3 * apart + blocks; /* at most TILE_X * MAX_BLOCKS */
    for (uint32_t b = 0; b < x_blocks; b++) {
        xq_sum[b] = 0;
        for (uint32_t i = 0; i < QBLOCK; i++) {
            const int32_t v = edge == 1 ? 127 : edge == 2 ? -127 : edge ? (next() & 1 ? 127 : -127) : (int32_t)(next() % 255u) - 127;
            xq[b * QBLOCK + i] = (int8_t)v;
            xq_sum[b] += v;
        }
        xq_scale[b] = uniform() * 0.03f;
    }
    if (c % 8 == 2) xq_scale[next() % x_blocks] = f32_bits(0xFFC00000u);
    q8_vector xs[TILE_X];
    for (uint32_t t = 0; t < TILE_X; t++)
        xs[t] = (q8_vector){ xq + t * apart * QBLOCK, xq_scale + t * apart, xq_sum + t * apart };
    static const struct { uint32_t dtype; uint8_t f16_at[2]; const char *name; } K[3] = {
        { DTYPE_Q4_K, { 0, 2 }, "rows4_q4_k" }, { DTYPE_Q5_K, { 0, 2 }, "rows4_q5_k" }, { DTYPE_Q6_K, { 208, 208 }, "rows4_q6_k" } };
    for (uint32_t k = 0; k < 3; k++) {
        const rows4_block_fn f = k == 2 ? fast->rows4_q6_k : k ? fast->rows4_q5_k : fast->rows4_q4_k;
        const rows_block_fn g = rows_block_for(ref, K[k].dtype);
        if (!f) continue;
        const uint32_t bytes = DTYPE_TRAITS[K[k].dtype].bytes;
        for (uint32_t i = 0; i < rows * groups * bytes; i++)
            wk[i] = (uint8_t)(!edge ? next() : edge < 3 || next() & 1 ? 0xFFu : 0x00u);
        for (uint32_t b = 0; b < rows * groups; b++) {
            uint8_t *blk = wk + b * bytes;
            for (uint32_t j = 0; j < 16 && edge && k == 2; j++) blk[192 + j] = next() & 1 ? 0x80u : 0x7Fu;
            for (uint32_t j = 0; j < 2; j++) {
                const uint16_t h = f32_to_f16(uniform() * 0.05f);
                blk[K[k].f16_at[j]] = (uint8_t)h;
                blk[K[k].f16_at[j] + 1] = (uint8_t)(h >> 8);
            }
        }
        if (c % 8 == 2) {
            uint8_t *d = wk + next() % (rows * groups) * bytes + K[k].f16_at[0];
            d[0] = 0x00u;
            d[1] = 0x7Cu;
        }
        enum { STRIDE = LONG_ROWS + 3 };
        float got[TILE_X * STRIDE], want[TILE_X * STRIDE];
        for (uint32_t t = 0; t < TILE_X; t++) g(wk, &xs[t], blocks, rows, want + t * STRIDE);
        f(wk, xs, blocks, rows, got, STRIDE);
        for (uint32_t t = 0; t < TILE_X; t++)
            for (uint32_t r = 0; r < rows; r++) check(K[k].name, blocks, got[t * STRIDE + r], want[t * STRIDE + r]);
        tiles++;
    }
}
#endif

/* The kernel set's accumulate_f32/_f16 against the scalar ones: `rows` rows of n values, `stride` apart (a KV
 * cache's row holds more than one head), into out that starts where a caller left it (zero, or a first run's sums).
 * Values uniform, or (tiny) with subnormal products and sums, which Helium flushes; some cases put a NaN (with a
 * payload of its own), an infinity, a -0 or values that overflow the sum into a row, and every f16 bit pattern
 * turns up (subnormals; infinities and NaNs in those cases). Every element must have the scalar bits, but for one thing:
 * where two NaNs meet in an addition, which payload it keeps is the operand order the compiler chose (C leaves it
 * open; GCC commutes x86's vaddps and addss as it likes), so a NaN there matches any NaN. */
#define ACC_MAX_ROWS 13u
#define ACC_MAX_N 200u
#define ACC_MAX_STRIDE (ACC_MAX_N + 7u)
static float acc_v32[ACC_MAX_ROWS * ACC_MAX_STRIDE], acc_p[ACC_MAX_ROWS], acc_a[ACC_MAX_N], acc_b[ACC_MAX_N];
static uint16_t acc_v16[ACC_MAX_ROWS * ACC_MAX_STRIDE];
static float nan_with(uint32_t payload) {
    union { uint32_t u; float f; } v = { 0x7FC00000u | (payload & 0x3FFFFFu) };
    return v.f;
}
static uint32_t accumulate_differs(uint32_t n) {
    uint32_t bad = 0;
    for (uint32_t i = 0; i < n; i++) bad |= bits(acc_a[i]) != bits(acc_b[i]) && !(acc_a[i] != acc_a[i] && acc_b[i] != acc_b[i]);
    return bad;
}
static void check_accumulate(const kernel_set *fast, const kernel_set *ref, uint32_t c) {
    const uint32_t n = c < 70 ? c + 1 : 1 + next() % ACC_MAX_N, rows = 1 + next() % ACC_MAX_ROWS;
    const size_t stride = n + next() % 8u;
    const float scale = c % 4 == 3 ? 1e-20f : 1.0f;
    for (uint32_t t = 0; t < rows; t++) acc_p[t] = (uniform() + 1.0f) * 0.5f * scale;
    for (size_t i = 0; i < rows * stride; i++) {
        acc_v32[i] = uniform() * 8.0f * scale;
        acc_v16[i] = (uint16_t)next();
        if ((acc_v16[i] & 0x7C00u) == 0x7C00u && c % 8 != 5) acc_v16[i] &= 0x83FFu; /* infinities and NaNs: the edge cases' */
    }
    if (c % 8 == 5) { /* edges in the rows */
        static const float edges[] = { 1.0f / 0.0f, -1.0f / 0.0f, -0.0f, 3e38f, -3e38f, 1e-45f };
        for (uint32_t k = 0; k < 4; k++) acc_v32[next() % (rows * stride)] = edges[next() % 6u];
        acc_v32[next() % (rows * stride)] = nan_with(next());
        acc_v32[next() % (rows * stride)] = nan_with(next());
    }
    for (uint32_t i = 0; i < n; i++) acc_a[i] = acc_b[i] = c % 3 == 0 ? 0.0f : uniform() * scale;
    if (c % 8 == 6) { /* out already NaN in one element, -0 in another */
        const uint32_t at = next() % n;
        acc_a[at] = acc_b[at] = nan_with(next());
        acc_a[0] = acc_b[0] = -0.0f;
    }
    ACCUMULATE_F32(fast)(acc_a, acc_p, acc_v32, stride, rows, n);
    ACCUMULATE_F32(ref)(acc_b, acc_p, acc_v32, stride, rows, n);
    check("accumulate_f32", n, accumulate_differs(n) ? 1.0f : 0.0f, 0.0f);
    for (uint32_t i = 0; i < n; i++) acc_a[i] = acc_b[i] = c % 3 == 0 ? 0.0f : uniform() * scale;
    ACCUMULATE_F16(fast)(acc_a, acc_p, acc_v16, stride, rows, n);
    ACCUMULATE_F16(ref)(acc_b, acc_p, acc_v16, stride, rows, n);
    check("accumulate_f16", n, accumulate_differs(n) ? 1.0f : 0.0f, 0.0f);
}

/* The kernel set's scores_f32/_f16 against the scalar ones: 1..5 heads (four of a KV group at once, and those left
 * over) against 1..13 key rows (blocks of four and the rows after them), rows and queries wider than n (a cache row holds
 * more than one head), n a multiple of 16 in every other case past the first 70 (the vector kernels' fast path), else
 * any; uniform values, or (tiny) subnormal products; some cases put NaNs with payloads, infinities, -0 and values whose
 * products or sums overflow into the rows and a query, and every f16 bit pattern turns up there. Every score must have
 * the scalar bits, a NaN matching any NaN (accumulate's rule above: which operand's payload an addition of two NaNs
 * keeps is the compiler's choice). The K rows are accumulate's buffers, the queries w32's. */
#if WITH_KERNEL_SCORES
#define SCORES_MAX_HEADS 5u
#define SCORES_OUT_STRIDE (ACC_MAX_ROWS + 3u)
static float sc_a[SCORES_MAX_HEADS * SCORES_OUT_STRIDE], sc_b[SCORES_MAX_HEADS * SCORES_OUT_STRIDE];
static uint32_t scores_differ(uint32_t heads, uint32_t rows) {
    uint32_t bad = 0;
    for (uint32_t h = 0; h < heads; h++)
        for (uint32_t t = 0; t < rows; t++) {
            const float a = sc_a[h * SCORES_OUT_STRIDE + t], b = sc_b[h * SCORES_OUT_STRIDE + t];
            bad |= bits(a) != bits(b) && !(a != a && b != b);
        }
    return bad;
}
static void check_scores(const kernel_set *fast, const kernel_set *ref, uint32_t c) {
    const uint32_t n = c < 70 ? c + 1 : c % 2 ? 16u * (1u + next() % (ACC_MAX_N / 16u)) : 1 + next() % ACC_MAX_N;
    const uint32_t rows = 1 + next() % ACC_MAX_ROWS, heads = 1 + next() % SCORES_MAX_HEADS;
    const size_t k_stride = n + next() % 8u, q_stride = n + next() % 8u;
    const float scale = c % 4 == 3 ? 1e-20f : 1.0f;
    for (size_t i = 0; i < rows * k_stride; i++) {
        acc_v32[i] = uniform() * 8.0f * scale;
        acc_v16[i] = (uint16_t)next();
        if ((acc_v16[i] & 0x7C00u) == 0x7C00u && c % 8 != 5) acc_v16[i] &= 0x83FFu; /* infinities and NaNs: the edge cases' */
    }
    for (size_t i = 0; i < heads * q_stride; i++) w32[i] = uniform() * 4.0f * scale;
    if (c % 8 == 5) { /* edges in the rows and a query */
        static const float edges[] = { 1.0f / 0.0f, -1.0f / 0.0f, -0.0f, 3e38f, -3e38f, 1e-45f };
        for (uint32_t e = 0; e < 4; e++) acc_v32[next() % (rows * k_stride)] = edges[next() % 6u];
        acc_v32[next() % (rows * k_stride)] = nan_with(next());
        w32[next() % (heads * q_stride)] = edges[next() % 6u];
        w32[next() % (heads * q_stride)] = nan_with(next());
    }
    for (uint32_t i = 0; i < SCORES_MAX_HEADS * SCORES_OUT_STRIDE; i++) sc_a[i] = sc_b[i] = 0.0f;
    fast->scores_f32(sc_a, SCORES_OUT_STRIDE, acc_v32, k_stride, rows, w32, q_stride, heads, n);
    ref->scores_f32(sc_b, SCORES_OUT_STRIDE, acc_v32, k_stride, rows, w32, q_stride, heads, n);
    check("scores_f32", n, scores_differ(heads, rows) ? 1.0f : 0.0f, 0.0f);
    fast->scores_f16(sc_a, SCORES_OUT_STRIDE, acc_v16, k_stride, rows, w32, q_stride, heads, n);
    ref->scores_f16(sc_b, SCORES_OUT_STRIDE, acc_v16, k_stride, rows, w32, q_stride, heads, n);
    check("scores_f16", n, scores_differ(heads, rows) ? 1.0f : 0.0f, 0.0f);
}

/* The kernel set's softmax against the scalar one, in place on copies of a head's scores: n from 1 to 80 and then
 * any up to ACC_MAX_N; spreads of +-8 (every exponential in the vector range), +-60 (some differences below -87) and
 * +-1e4; some cases with a sink (above the scores or not), a NaN (first, or anywhere), infinities, -0 and +0 as the
 * largest score. Every probability must have the scalar bits, a NaN matching any NaN. */
static float sm_a[ACC_MAX_N], sm_b[ACC_MAX_N];
static void check_softmax(const kernel_set *fast, const kernel_set *ref, uint32_t c) {
    static const float edges[] = { 1.0f / 0.0f, -1.0f / 0.0f, -0.0f, 0.0f, 88.0f, -87.0f };
    const uint32_t n = c < 80 ? c + 1 : 1 + next() % ACC_MAX_N;
    const float spread = c % 3 == 0 ? 8.0f : c % 3 == 1 ? 60.0f : 1e4f;
    for (uint32_t i = 0; i < n; i++) sm_a[i] = uniform() * spread - (c % 5 == 4 ? spread : 0.0f);
    if (c % 6 == 5) sm_a[next() % n] = edges[next() % 6u];
    if (c % 10 == 7) sm_a[c % 20 == 7 ? 0 : next() % n] = nan_with(next());
    for (uint32_t i = 0; i < n; i++) sm_b[i] = sm_a[i];
    const float sink = c % 4 == 1 ? uniform() * spread : c % 8 == 3 ? 2.0f * spread : 0.0f;
    fast->softmax(sm_a, n, c % 4 == 1 || c % 8 == 3 ? &sink : 0);
    ref->softmax(sm_b, n, c % 4 == 1 || c % 8 == 3 ? &sink : 0);
    uint32_t bad = 0;
    for (uint32_t i = 0; i < n; i++) bad |= bits(sm_a[i]) != bits(sm_b[i]) && !(sm_a[i] != sm_a[i] && sm_b[i] != sm_b[i]);
    check("softmax", n, bad ? 1.0f : 0.0f, 0.0f);
}
#else /* the lean build has no scores or softmax entry: their three cases pass */
static void check_scores(const kernel_set *fast, const kernel_set *ref, uint32_t c) { (void)fast, (void)ref, (void)c; }
static void check_softmax(const kernel_set *fast, const kernel_set *ref, uint32_t c) { (void)fast, (void)ref, (void)c; }
#endif

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
#if WITH_BLOCK_DTYPES
    /* the block dtypes whose rows the set takes from kernels_block.c, which the checks below then hold to themselves */
    say("scalar block rows:");
    for (uint32_t k = 0; k < sizeof DTYPES_CHECKED / sizeof DTYPES_CHECKED[0] && fast != ref; k++) {
        if (rows_block_for(fast, DTYPES_CHECKED[k].dtype) != rows_block_for(ref, DTYPES_CHECKED[k].dtype)) continue;
        say(" ");
        say(DTYPES_CHECKED[k].name);
    }
    say("\r\n");
#endif
    uint32_t cases = 0;
    for (uint32_t c = 0; c < CASES; c++) {
        /* small lengths often (every tail), large ones sometimes (the main loops) */
        uint32_t n = c < 80 ? c + 1 : 1 + next() % MAX_N, blocks = (n + QBLOCK - 1) / QBLOCK;
        fill(n, blocks, c % 4 == 3);
        check("dot_f32", n, fast->dot_f32(w32, x32, n), ref->dot_f32(w32, x32, n));
        check("dot_f16", n, fast->dot_f16(w16, x32, n), ref->dot_f16(w16, x32, n));
        const q8_vector xv = { xq, xq_scale, xq_sum };
        float got[ROWS], want[ROWS], tile[4];
        fast->rows_q8_0(w8, scales, &xv, blocks, ROWS, got); /* each row starts where the one before ends */
        ref->rows_q8_0(w8, scales, &xv, blocks, ROWS, want);
        for (uint32_t r = 0; r < ROWS; r++) check("rows_q8_0", blocks, got[r], want[r]);
        fast->rows_q4_0(w4, scales, &xv, blocks, ROWS, got);
        ref->rows_q4_0(w4, scales, &xv, blocks, ROWS, want);
        for (uint32_t r = 0; r < ROWS; r++) check("rows_q4_0", blocks, got[r], want[r]);
        check_block_dtypes(fast, ref, blocks);
        cases += 4;
        if (fast->tile_f32) {
            fast->tile_f32(w32, x32, x32 + n, n, tile);
            check_tile("tile_f32", n, tile, ref_tile_float(ref->dot_f32, w32, x32, n, want));
        }
        if (fast->tile_f16) {
            fast->tile_f16(w16, x32, x32 + n, n, tile);
            check_tile("tile_f16", n, tile, ref_tile_half(ref->dot_f16, w16, x32, n, want));
        }
        check_quant_tiles(fast, ref, c, blocks);
        for (uint32_t i = 0; i < 2 * n; i++) w16[i] &= 0xC7FFu; /* bf16 magnitudes below 2^8: finite products */
        check("dot_bf16", n, fast->dot_bf16(w16, x32, n), ref->dot_bf16(w16, x32, n));
        cases++;
        if (fast->tile_bf16) {
            fast->tile_bf16(w16, x32, x32 + n, n, tile);
            check_tile("tile_bf16", n, tile, ref_tile_half(ref->dot_bf16, w16, x32, n, want));
        }
        check_quantize(fast, ref, c, n, blocks);
        check_swiglu(fast, ref, c, n);
        check_accumulate(fast, ref, c);
        check_scores(fast, ref, c);
        check_softmax(fast, ref, c);
#if defined(COLIBRI_X86_SIMD) && WITH_BLOCK_DTYPES
        check_rows4_k(fast, ref, c); /* last: it fills xq's blocks as it needs them */
#endif
        cases += 7;
    }
    say("kernel_check: ");
    say_u32(cases);
    say(" cases, ");
    say_u32(tiles);
    say(" tiles, ");
    say_u32(mismatches);
    say(" mismatches\r\n");
    clock_check(io);
    return mismatches ? 1 : 0;
}
