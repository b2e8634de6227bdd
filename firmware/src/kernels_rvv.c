/* RISC-V kernels: the V extension (RVV 1.0, VLEN >= 128). GCC 12 has no RVV intrinsics, so each
 * kernel is one inline-assembly loop. It declares no vector register, vl or vtype clobbers: GCC 12 knows
 * none of them by name. That is safe only while compiled code keeps nothing in vector registers or vtype
 * across these statements, so the board builds with -fno-tree-vectorize (boards/riscv64_virt/board.toml),
 * and a compiler that does know them must be given the clobbers instead (the #error below). Each function computes exactly what its scalar twin in kernels.c computes
 * (docs/KERNELS.md): the 16 float lanes are one e32/m4 register group with vl capped at 16 (a wider
 * machine must not spread the lanes further), the tail updates only its lanes (tail-undisturbed),
 * and the integer block sums come from widening multiplies and a widening reduction (exact).
 * f16 has no conversion instruction without Zvfh: its dot is the scalar kernel; attention's value sum widens f16
 * in the integer domain (F16_WIDEN). The loops are rvv.h's macros. */
#include "internal.h"

#if defined(__riscv_vector) && !defined(COLIBRI_KERNELS_SCALAR)

#include "rvv.h"

static float dot_f32_rvv(const float *w, const float *x, uint32_t n) {
    float acc[16];
    size_t left = n;
    FLOAT_DOT_LOOP("vsetvli zero, t0, e32, m4, tu, ma\n\tvle32.v v0, (%[w])\n\t", "2");
    return sum_lanes16(acc);
}

#if WITH_KERNEL_SCORES /* attention's scores: the scalar loop over this set's dot (f16 has none of its own) */
static SCORES_BY_DOT(scores_f32_rvv, float, dot_f32_rvv)
#endif

static float dot_bf16_rvv(const uint16_t *w, const float *x, uint32_t n) {
    float acc[16];
    size_t left = n;
    FLOAT_DOT_LOOP("vsetvli zero, t0, e16, m2, tu, ma\n\tvle16.v v12, (%[w])\n\t"
                   "vsetvli zero, t0, e32, m4, tu, ma\n\tvzext.vf2 v0, v12\n\tvsll.vi v0, v0, 16\n\t", "1");
    return sum_lanes16(acc);
}

/* The exact integer dot product of one Q8_0 block (32 int8 pairs). */
static int32_t block_q8(const int8_t *w, const int8_t *x) {
    long sum;
    __asm__ volatile("li t0, 32\n\t"
                     "vsetvli zero, t0, e8, m2, ta, ma\n\t"
                     "vle8.v v0, (%[w])\n\t"
                     "vle8.v v2, (%[x])\n\t"
                     "vwmul.vv v4, v0, v2\n\t"       /* 32 int16 products in v4..v7 */
                     "vsetivli zero, 1, e32, m1, ta, ma\n\t"
                     "vmv.s.x v8, zero\n\t"
                     "vsetvli zero, t0, e16, m4, ta, ma\n\t"
                     "vwredsum.vs v8, v4, v8\n\t"    /* their int32 sum in v8[0] */
                     "vsetivli zero, 1, e32, m1, ta, ma\n\t"
                     "vmv.x.s %[sum], v8\n\t"
                     : [sum] "=r"(sum)
                     : [w] "r"(w), [x] "r"(x)
                     : "t0", "memory");
    return (int32_t)sum;
}

/* The exact integer dot product of one Q4_0 block: 16 bytes of nibbles (value + 8) with 32 int8. */
static int32_t block_q4(const uint8_t *w, const int8_t *x) {
    long sum;
    __asm__ volatile("vsetivli zero, 16, e8, m1, ta, ma\n\t"
                     "vle8.v v0, (%[w])\n\t"
                     "vand.vi v1, v0, 15\n\t"
                     "vsrl.vi v2, v0, 4\n\t"
                     "li t0, 8\n\t"
                     "vsub.vx v1, v1, t0\n\t"        /* elements 0..15 */
                     "vsub.vx v2, v2, t0\n\t"        /* elements 16..31 */
                     "vle8.v v3, (%[x])\n\t"
                     "addi t1, %[x], 16\n\t"
                     "vle8.v v0, (t1)\n\t"
                     "vwmul.vv v4, v1, v3\n\t"       /* int16 products in v4..v5 */
                     "vwmul.vv v6, v2, v0\n\t"       /* and v6..v7 */
                     "vsetivli zero, 1, e32, m1, ta, ma\n\t"
                     "vmv.s.x v8, zero\n\t"
                     "vsetivli zero, 16, e16, m2, ta, ma\n\t"
                     "vwredsum.vs v8, v4, v8\n\t"
                     "vwredsum.vs v8, v6, v8\n\t"
                     "vsetivli zero, 1, e32, m1, ta, ma\n\t"
                     "vmv.x.s %[sum], v8\n\t"
                     : [sum] "=r"(sum)
                     : [w] "r"(w), [x] "r"(x)
                     : "t0", "t1", "memory");
    return (int32_t)sum;
}

static int32_t isum_q8_0_rvv(const void *w_row, const int8_t *xq, uint32_t b) {
    return block_q8((const int8_t *)w_row + (size_t)b * QBLOCK, xq + (size_t)b * QBLOCK);
}

static int32_t isum_q4_0_rvv(const void *w_row, const int8_t *xq, uint32_t b) {
    return block_q4((const uint8_t *)w_row + (size_t)b * (QBLOCK / 2), xq + (size_t)b * QBLOCK);
}

static float dot_q8_0_rvv(const void *w, const uint16_t *w_scale, const q8_vector *x, uint32_t blocks) {
    return dot_blocks(w, w_scale, x, blocks, isum_q8_0_rvv);
}
static float dot_q4_0_rvv(const void *w, const uint16_t *w_scale, const q8_vector *x, uint32_t blocks) {
    return dot_blocks(w, w_scale, x, blocks, isum_q4_0_rvv);
}

static void rows_q8_0_rvv(const int8_t *w, const uint16_t *w_scale, const q8_vector *x, uint32_t blocks, uint32_t rows,
                          float *out) {
    dot_rows(w, w_scale, x, blocks, rows, (size_t)blocks * QBLOCK, out, dot_q8_0_rvv);
}
static void rows_q4_0_rvv(const uint8_t *w, const uint16_t *w_scale, const q8_vector *x, uint32_t blocks, uint32_t rows,
                          float *out) {
    dot_rows(w, w_scale, x, blocks, rows, (size_t)blocks * (QBLOCK / 2), out, dot_q4_0_rvv);
}

static void accumulate_f32_rvv(float *out, const float *p, const float *v, size_t stride, uint32_t rows, uint32_t n) {
    ACCUMULATE_LOOP("m8", "v8", "v16", "vle32.v v16, (t4)\n\t", 2);
}
/* f16 rows: loaded as e16, zero-extended and widened by F16_WIDEN (e32/m4 groups: h v8, the values v20, the sums v24) */
static void accumulate_f16_rvv(float *out, const float *p, const uint16_t *v, size_t stride, uint32_t rows, uint32_t n) {
    ACCUMULATE_LOOP("m4", "v24", "v20",
                    "vsetvli zero, %[vl], e16, m2, ta, ma\n\tvle16.v v4, (t4)\n\t"
                    "vsetvli zero, %[vl], e32, m4, ta, mu\n\tvzext.vf2 v8, v4\n\t"
                    F16_WIDEN("v8", "v12", "v16", "v20", "v4"), 1);
}

#if WITH_BLOCK_DTYPES
/* ---- The block dtypes (docs/KERNELS.md "The block dtypes"), as kernels_block.c's rows compute them. A dtype's part
 * fills 8 blocks' terms at a time: each block's integer sum from widening multiplies and a widening reduction over its
 * values unpacked into bytes (exact), and its factors a and c. The float steps are shared: blocks 8 s + j into lane j
 * of one e32 register group (vl the blocks there are, at most 8), t = (float)isum * (a * x_d), t = t + (float)x_sum *
 * (c * x_d), acc += t lane by lane: each lane performs the scalar kernel's operations in its order (RVV's float
 * arithmetic keeps subnormals and makes NaNs canonical as the scalar FPU does), then the fixed tree. ---- */
typedef struct {
    int32_t isum[8];
    float a[8], c[8]; /* c: the dtypes with an offset */
} terms8;
/* A dtype's part: the n (<= 8; 8 for a K-quant) blocks at w, times x's values xq (and sums xsum), into t; returns the
 * address after them. */
typedef const uint8_t *(*fill8_fn)(const uint8_t *w, uint32_t n, const int8_t *xq, const int32_t *xsum, terms8 *t);

/* out[j] = the f16 at p + j stride widened, for j < n (<= 8), by F16_WIDEN. (Every block dtype with f16 fields has
 * blocks of an even size: the fields are 2-byte aligned.) */
__attribute__((noinline)) static void f16_column(float *out, const uint8_t *p, size_t stride, size_t n) {
    __asm__ volatile("vsetvli zero, %[n], e16, m1, ta, ma\n\t"
                     "vlse16.v v1, (%[p]), %[stride]\n\t"
                     "vsetvli zero, %[n], e32, m2, ta, mu\n\t"
                     "vzext.vf2 v2, v1\n\t"
                     F16_WIDEN("v2", "v4", "v6", "v8", "v10")
                     "vse32.v v8, (%[out])\n\t"
                     :
                     : [n] "r"(n), [p] "r"(p), [stride] "r"(stride), [out] "r"(out)
                     : "t0", "t1", "ft0", "memory");
}
/* GGUF's 32-bit fields may sit at any even byte (Q5_0's qh): byte loads unless the target allows more. */
static uint32_t le32_at(const uint8_t *p) {
    uint32_t v;
    __builtin_memcpy(&v, p, 4);
    return v;
}

/* Every block dtype's rows: `fill` the dtype's part, `offset` whether it has c (format.h's dtype_has_offset). */
__attribute__((noinline)) static void rows_terms8(const uint8_t *w, const q8_vector *x, uint32_t blocks, uint32_t rows,
                                                  float *out, fill8_fn fill, long offset) {
    const q8_vector xv = *x;
    for (float *end = out + rows; out < end; out++) {
        float acc[8];
        zero_lanes8(acc);
        for (uint32_t b = 0; b < blocks; b += 8) {
            const size_t n = blocks - b < 8u ? blocks - b : 8u;
            terms8 t;
            w = fill(w, (uint32_t)n, xv.q + (size_t)b * QBLOCK, xv.sum + b, &t);
            __asm__ volatile("vsetvli zero, %[n], e32, m2, ta, ma\n\t"
                             "vle32.v v0, (%[isum])\n\tvfcvt.f.x.v v0, v0\n\t"     /* (float)isum: exact */
                             "vle32.v v2, (%[a])\n\tvle32.v v4, (%[xd])\n\t"
                             "vfmul.vv v2, v2, v4\n\t"                            /* a * x_d */
                             "vfmul.vv v0, v0, v2\n\t"                            /* t */
                             "beqz %[offset], 1f\n\t"
                             "vle32.v v6, (%[xsum])\n\tvfcvt.f.x.v v6, v6\n\t"
                             "vle32.v v2, (%[c])\n\tvfmul.vv v2, v2, v4\n\t"      /* c * x_d */
                             "vfmul.vv v6, v6, v2\n\t"
                             "vfadd.vv v0, v0, v6\n"                              /* t + (float)x_sum * (c * x_d) */
                             "1:\n\t"
                             "vle32.v v8, (%[acc])\n\tvfadd.vv v8, v8, v0\n\tvse32.v v8, (%[acc])\n\t"
                             :
                             : [n] "r"(n), [isum] "r"(t.isum), [a] "r"(t.a), [c] "r"(t.c), [xd] "r"(xv.scale + b),
                               [xsum] "r"(xv.sum + b), [offset] "r"(offset), [acc] "r"(acc)
                             : "memory");
        }
        *out = sum_lanes8(acc);
    }
}

/* The exact sum of the 32 products of elements 0..15 in v1 and 16..31 in v2 (e8 m1, vl 16) with x's values. */
#define ISUM_HALVES                                                                                                    \
    "vle8.v v3, (%[x])\n\taddi t1, %[x], 16\n\tvle8.v v4, (t1)\n\t"                                                    \
    "vwmul.vv v6, v1, v3\n\tvwmul.vv v10, v2, v4\n\t" /* int16 products in v6..v7 and v10..v11 */                     \
    "vsetivli zero, 1, e32, m1, ta, ma\n\tvmv.s.x v8, zero\n\t"                                                        \
    "vsetivli zero, 16, e16, m2, ta, ma\n\tvwredsum.vs v8, v6, v8\n\tvwredsum.vs v8, v10, v8\n\t"                      \
    "vsetivli zero, 1, e32, m1, ta, ma\n\tvmv.x.s %[sum], v8\n\t"

/* Q4_1 {f16 d, m; u8 qs[16]}, Q5_0 {f16 d; u8 qh[4]; u8 qs[16]}, Q5_1 {f16 d, m; u8 qh[4]; u8 qs[16]}: elements 0..15
 * the low nibbles of qs, 16..31 the high ones; Q5's bit 4 of element i is bit i of qh, set under a mask made of qh's
 * halves (mask bit i: element i; 0 for Q4_1). Q5_0's values are 5 bits - 16: the sum of (q - 16) x is that of q x
 * less 16 times x's block sum. */
ALWAYS_INLINE const uint8_t *fill_q4_1_q5(const uint8_t *w, uint32_t n, const int8_t *xq, const int32_t *xsum,
                                          terms8 *t, uint32_t dtype, uint32_t bytes) {
    for (uint32_t j = 0; j < n; j++, w += bytes, xq += QBLOCK) {
        const uint32_t qh = dtype == DTYPE_Q4_1 ? 0u : le32_at(w + bytes - 20u); /* qh[4] before qs[16] */
        long sum;
        __asm__ volatile("vsetivli zero, 1, e32, m1, ta, ma\n\tvmv.s.x v0, %[lo]\n\t"
                         "vsetivli zero, 16, e8, m1, ta, mu\n\t"
                         "vle8.v v5, (%[qs])\n\tli t1, 16\n\t"
                         "vand.vi v1, v5, 15\n\tvor.vx v1, v1, t1, v0.t\n\t"
                         "vsetivli zero, 1, e32, m1, ta, ma\n\tvmv.s.x v0, %[hi]\n\t"
                         "vsetivli zero, 16, e8, m1, ta, mu\n\t"
                         "vsrl.vi v2, v5, 4\n\tvor.vx v2, v2, t1, v0.t\n\t"
                         ISUM_HALVES
                         : [sum] "=r"(sum)
                         : [lo] "r"((long)(qh & 0xFFFFu)), [hi] "r"((long)(qh >> 16)), [qs] "r"(w + bytes - 16u), [x] "r"(xq)
                         : "t1", "memory");
        t->isum[j] = (int32_t)sum - (dtype == DTYPE_Q5_0 ? 16 * xsum[j] : 0);
    }
    f16_column(t->a, w - bytes * n, bytes, n);
    if (dtype_has_offset(dtype)) f16_column(t->c, w - bytes * n + 2, bytes, n);
    return w;
}
#define FILL_Q4_1_Q5(name, NAME)                                                                                       \
    static const uint8_t *fill_##name(const uint8_t *w, uint32_t n, const int8_t *xq, const int32_t *xsum, terms8 *t) { \
        return fill_q4_1_q5(w, n, xq, xsum, t, DTYPE_##NAME, DTYPE_BYTES_##NAME);                                       \
    }
FILL_Q4_1_Q5(q4_1, Q4_1)
FILL_Q4_1_Q5(q5_0, Q5_0)
FILL_Q4_1_Q5(q5_1, Q5_1)

/* MXFP4 {u8 e; u8 qs[16]}: the nibbles' values (twice E2M1's) gathered from the table, times 2^(e - 128). */
static const int8_t MXFP4_TWICE[16] = { 0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12 };
static const uint8_t *fill_mxfp4(const uint8_t *w, uint32_t n, const int8_t *xq, const int32_t *xsum, terms8 *t) {
    (void)xsum;
    for (uint32_t j = 0; j < n; j++, w += DTYPE_BYTES_MXFP4, xq += QBLOCK) {
        long sum;
        __asm__ volatile("vsetivli zero, 16, e8, m1, ta, ma\n\t"
                         "vle8.v v0, (%[qs])\n\tvle8.v v5, (%[table])\n\t"
                         "vand.vi v9, v0, 15\n\tvsrl.vi v12, v0, 4\n\t"
                         "vrgather.vv v1, v5, v9\n\tvrgather.vv v2, v5, v12\n\t"
                         ISUM_HALVES
                         : [sum] "=r"(sum)
                         : [qs] "r"(w + 1), [table] "r"(MXFP4_TWICE), [x] "r"(xq)
                         : "t1", "memory");
        const uint32_t e = w[0];
        t->isum[j] = (int32_t)sum;
        t->a[j] = f32_from_bits(e < 2u ? 0x00200000u << e : (e - 1u) << 23);
    }
    return w;
}

/* Q4_K {f16 d, dmin; u8 scales[12]; u8 qs[128]} and Q5_K {f16 d, dmin; u8 scales[12]; u8 qh[32]; u8 qs[128]}: sub-blocks
 * j and j + 1 (j even) are the low and high nibbles of qs[16 j ..], and for Q5_K bit 4 of element l of sub-block j is
 * bit j of qh[l]; the factors are d sc and -(dmin m) (exact) with the 6-bit scale and min of llama.cpp's
 * get_scale_min_k4, four at a time here: scm[j] the scales, scm[8 + j] the mins. */
__attribute__((noinline, noclone)) static const uint8_t *fill_k4(const uint8_t *w, const int8_t *xq, terms8 *t,
                                                                long five) {
    const uint32_t w0 = le32_at(w + 4), w1 = le32_at(w + 8), w2 = le32_at(w + 12);
    const uint32_t scm[4] = { w0 & 0x3F3F3F3Fu, (w2 & 0x0F0F0F0Fu) | (w0 >> 2 & 0x30303030u), w1 & 0x3F3F3F3Fu,
                              (w2 >> 4 & 0x0F0F0F0Fu) | (w1 >> 2 & 0x30303030u) };
    const uint8_t *qs = w + (five ? 48 : 16);
    float d[2]; /* d, dmin */
    f16_column(d, w, 2, 2);
    for (uint32_t j = 0; j < 8; j += 2, qs += 32, xq += 2 * QBLOCK) {
        long lo, hi;
        __asm__ volatile("li t0, 32\n\tvsetvli zero, t0, e8, m2, ta, ma\n\t"
                         "vle8.v v0, (%[qs])\n\t"
                         "vand.vi v4, v0, 15\n\tvsrl.vi v0, v0, 4\n\t"      /* sub-blocks j and j + 1 */
                         "beqz %[five], 1f\n\t"
                         "vle8.v v2, (%[qh])\n\tvsrl.vx v2, v2, %[j]\n\t"   /* bits j, j + 1 of qh at bits 0, 1 */
                         "vand.vi v6, v2, 1\n\tvsll.vi v6, v6, 4\n\tvor.vv v4, v4, v6\n\t"
                         "vand.vi v6, v2, 2\n\tvsll.vi v6, v6, 3\n\tvor.vv v0, v0, v6\n"
                         "1:\n\t"
                         "vle8.v v2, (%[x])\n\taddi t1, %[x], 32\n\tvle8.v v6, (t1)\n\t"
                         "vwmul.vv v8, v4, v2\n\tvwmul.vv v12, v0, v6\n\t"  /* int16 products: v8..v11, v12..v15 */
                         "vsetivli zero, 1, e32, m1, ta, ma\n\tvmv.s.x v16, zero\n\t"
                         "vsetvli zero, t0, e16, m4, ta, ma\n\tvwredsum.vs v17, v8, v16\n\tvwredsum.vs v18, v12, v16\n\t"
                         "vsetivli zero, 1, e32, m1, ta, ma\n\tvmv.x.s %[lo], v17\n\tvmv.x.s %[hi], v18\n\t"
                         : [lo] "=r"(lo), [hi] "=r"(hi)
                         : [qs] "r"(qs), [qh] "r"(w + 16), [five] "r"(five), [j] "r"((long)j), [x] "r"(xq)
                         : "t0", "t1", "memory");
        t->isum[j] = (int32_t)lo;
        t->isum[j + 1] = (int32_t)hi;
    }
    __asm__ volatile("vsetivli zero, 8, e8, mf2, ta, ma\n\t"
                     "vle8.v v1, (%[sc])\n\taddi t0, %[sc], 8\n\tvle8.v v3, (t0)\n\t"
                     "vsetivli zero, 8, e32, m2, ta, ma\n\t"
                     "vzext.vf4 v4, v1\n\tvzext.vf4 v6, v3\n\tvfcvt.f.xu.v v4, v4\n\tvfcvt.f.xu.v v6, v6\n\t"
                     "vfmul.vf v4, v4, %[d]\n\tvfmul.vf v6, v6, %[dmin]\n\tvfneg.v v6, v6\n\t" /* d sc, -(dmin m) */
                     "vse32.v v4, (%[a])\n\tvse32.v v6, (%[c])\n\t"
                     :
                     : [sc] "r"(scm), [d] "f"(d[0]), [dmin] "f"(d[1]), [a] "r"(t->a), [c] "r"(t->c)
                     : "t0", "memory");
    return qs;
}
static const uint8_t *fill_q4_k(const uint8_t *w, uint32_t n, const int8_t *xq, const int32_t *xsum, terms8 *t) {
    return (void)n, (void)xsum, fill_k4(w, xq, t, 0);
}
static const uint8_t *fill_q5_k(const uint8_t *w, uint32_t n, const int8_t *xq, const int32_t *xsum, terms8 *t) {
    return (void)n, (void)xsum, fill_k4(w, xq, t, 1);
}

/* Q6_K sub-block k of a 128-value half: its low nibbles from v1, v2 (ql[0 .. 31]) or v3, v4 (ql[32 .. 63]) by LO, its
 * top 2 bits from qh (v5, v6) by HI (to bits 4, 5), -32, times x's 32 values at t1 (advanced); the 16s' sums to R0, R1. */
#define Q6_SUB(LO_A, LO_B, LO, HI, R0, R1)                                                                             \
    LO("v9", LO_A) LO("v10", LO_B) HI("v11", "v5") "vor.vv v9, v9, v11\n\t" HI("v11", "v6") "vor.vv v10, v10, v11\n\t"   \
    "vsub.vx v9, v9, t2\n\tvsub.vx v10, v10, t2\n\t"                                                                   \
    "vle8.v v7, (t1)\n\taddi t1, t1, 16\n\tvle8.v v8, (t1)\n\taddi t1, t1, 16\n\t"                                     \
    "vwmul.vv v12, v9, v7\n\tvwmul.vv v14, v10, v8\n\t"                                                                \
    "vsetivli zero, 16, e16, m2, ta, ma\n\tvwredsum.vs " R0 ", v12, v16\n\tvwredsum.vs " R1 ", v14, v16\n\t"           \
    "vsetivli zero, 16, e8, m1, ta, ma\n\t"
#define Q6_LOW(D, S) "vand.vi " D ", " S ", 15\n\t"
#define Q6_HIGH(D, S) "vsrl.vi " D ", " S ", 4\n\t"
#define Q6_TOP4(D, S) "vsll.vi " D ", " S ", 4\n\tvand.vx " D ", " D ", t3\n\t" /* bits 0, 1 */
#define Q6_TOP2(D, S) "vsll.vi " D ", " S ", 2\n\tvand.vx " D ", " D ", t3\n\t" /* bits 2, 3 */
#define Q6_TOP0(D, S) "vand.vx " D ", " S ", t3\n\t"                            /* bits 4, 5 */
#define Q6_TOPR(D, S) "vsrl.vi " D ", " S ", 2\n\tvand.vx " D ", " D ", t3\n\t" /* bits 6, 7 */

/* Q6_K: {u8 ql[128]; u8 qh[64]; i8 scales[16]; f16 d}: sub-block j = 4 n + k has the low 4 bits of its values in
 * ql[64 n + 32 (k & 1) ..] (the high nibbles for k >= 2) and their top 2 in bits 2 k, 2 k + 1 of qh[32 n ..]; each 16
 * values' sum of (6 bits - 32) x times the 16's scale (|isum| <= 32 x 4096 x 127, below 2^24); the factor is d. A
 * half's four sub-blocks in one statement, its 96 bytes loaded once. */
static const uint8_t *fill_q6_k(const uint8_t *w, uint32_t n, const int8_t *xq, const int32_t *xsum, terms8 *t) {
    (void)n, (void)xsum;
    const int8_t *scales = (const int8_t *)(w + 192);
    float d;
    f16_column(&d, w + 208, 0, 1);
    for (uint32_t half = 0; half < 2; half++, xq += 4 * QBLOCK) {
        long s[8];
        __asm__ volatile("vsetivli zero, 1, e32, m1, ta, ma\n\tvmv.s.x v16, zero\n\t"
                         "vsetivli zero, 16, e8, m1, ta, ma\n\t"
                         "vle8.v v1, (%[ql])\n\taddi t1, %[ql], 16\n\tvle8.v v2, (t1)\n\t"
                         "addi t1, %[ql], 32\n\tvle8.v v3, (t1)\n\taddi t1, %[ql], 48\n\tvle8.v v4, (t1)\n\t"
                         "vle8.v v5, (%[qh])\n\taddi t1, %[qh], 16\n\tvle8.v v6, (t1)\n\t"
                         "li t2, 32\n\tli t3, 0x30\n\tmv t1, %[x]\n\t"
                         Q6_SUB("v1", "v2", Q6_LOW, Q6_TOP4, "v17", "v18")
                         Q6_SUB("v3", "v4", Q6_LOW, Q6_TOP2, "v19", "v20")
                         Q6_SUB("v1", "v2", Q6_HIGH, Q6_TOP0, "v21", "v22")
                         Q6_SUB("v3", "v4", Q6_HIGH, Q6_TOPR, "v23", "v24")
                         "vsetivli zero, 1, e32, m1, ta, ma\n\t"
                         "vmv.x.s %[s0], v17\n\tvmv.x.s %[s1], v18\n\tvmv.x.s %[s2], v19\n\tvmv.x.s %[s3], v20\n\t"
                         "vmv.x.s %[s4], v21\n\tvmv.x.s %[s5], v22\n\tvmv.x.s %[s6], v23\n\tvmv.x.s %[s7], v24\n\t"
                         : [s0] "=&r"(s[0]), [s1] "=&r"(s[1]), [s2] "=&r"(s[2]), [s3] "=&r"(s[3]), [s4] "=&r"(s[4]),
                           [s5] "=&r"(s[5]), [s6] "=&r"(s[6]), [s7] "=&r"(s[7])
                         : [ql] "r"(w + 64u * half), [qh] "r"(w + 128 + 32u * half), [x] "r"(xq)
                         : "t1", "t2", "t3", "memory");
        for (uint32_t k = 0; k < 4; k++) {
            const uint32_t j = 4 * half + k;
            t->isum[j] = scales[2 * j] * (int32_t)s[2 * k] + scales[2 * j + 1] * (int32_t)s[2 * k + 1];
            t->a[j] = d;
        }
    }
    return w + DTYPE_BYTES_Q6_K;
}

#define ROWS_RVV(name, NAME)                                                                                           \
    static void rows_##name##_rvv(const uint8_t *w, const q8_vector *x, uint32_t blocks, uint32_t rows, float *out) { \
        rows_terms8(w, x, blocks, rows, out, fill_##name, (long)dtype_has_offset(DTYPE_##NAME));                       \
    }
ROWS_RVV(q4_1, Q4_1)
ROWS_RVV(q5_0, Q5_0)
ROWS_RVV(q5_1, Q5_1)
ROWS_RVV(mxfp4, MXFP4)
ROWS_RVV(q4_k, Q4_K)
ROWS_RVV(q5_k, Q5_K)
ROWS_RVV(q6_k, Q6_K)
#define KERNELS_BLOCK_DTYPES_RVV                                                                                       \
    .rows_q4_1 = rows_q4_1_rvv, .rows_q5_0 = rows_q5_0_rvv, .rows_q5_1 = rows_q5_1_rvv, .rows_mxfp4 = rows_mxfp4_rvv,    \
    .rows_q4_k = rows_q4_k_rvv, .rows_q5_k = rows_q5_k_rvv, .rows_q6_k = rows_q6_k_rvv
#else
#define KERNELS_BLOCK_DTYPES_RVV /* the lean build: none */
#endif

const kernel_set kernels_rvv = { .name = "rvv", .dot_f32 = dot_f32_rvv, .dot_f16 = dot_f16_scalar, .dot_bf16 = dot_bf16_rvv,
                                 .rows_q8_0 = rows_q8_0_rvv, .rows_q4_0 = rows_q4_0_rvv,
                                 .quantize_q8_0 = quantize_q8_0_scalar, .swiglu = swiglu_scalar,
                                 KERNELS_ACCUMULATE(accumulate_f32_rvv, accumulate_f16_rvv)
                                 KERNELS_SCORES(scores_f32_rvv, scores_f16_scalar, softmax) KERNELS_BLOCK_DTYPES_RVV };
#endif
