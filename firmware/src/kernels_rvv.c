/* RISC-V kernels: the V extension (RVV 1.0, VLEN >= 128). GCC 12 has no RVV intrinsics, so each
 * kernel is one inline-assembly loop. It declares no vector register, vl or vtype clobbers: GCC 12 knows
 * none of them by name. That is safe only while compiled code keeps nothing in vector registers or vtype
 * across these statements, so the board builds with -fno-tree-vectorize (boards/riscv64_virt/board.toml),
 * and a compiler that does know them must be given the clobbers instead (the #error below). Each function computes exactly what its scalar twin in kernels.c computes
 * (docs/KERNELS.md): the 16 float lanes are one e32/m4 register group with vl capped at 16 (a wider
 * machine must not spread the lanes further), the tail updates only its lanes (tail-undisturbed),
 * and the integer block sums come from widening multiplies and a widening reduction (exact).
 * f16 has no conversion instruction without Zvfh: it uses the scalar kernel. */
#include "internal.h"

#if defined(__riscv_vector) && !defined(COLIBRI_KERNELS_SCALAR)

#if defined(__clang__) || (defined(__GNUC__) && __GNUC__ >= 13)
#error "kernels_rvv.c: this compiler knows the vector registers: declare v0-v31, vl and vtype as its asm's clobbers"
#endif

/* acc[16] = the 16 lane sums of w[i] * x[i] (lane i % 16). LOAD_W puts the next t0 (<= 16) weights
 * into v0..v3 as f32; W_SHIFT is log2 of a stored weight's bytes. */
#define FLOAT_DOT_LOOP(LOAD_W, W_SHIFT)                                                                             \
    __asm__ volatile("vsetivli zero, 16, e32, m4, ta, ma\n\t"                                                     \
                     "vmv.v.i v8, 0\n\t"                                                                          \
                     "li t2, 16\n"                                                                                \
                     "1:\n\t"                                                                                     \
                     "beqz %[left], 3f\n\t"                                                                       \
                     "mv t0, %[left]\n\t"                                                                         \
                     "bleu t0, t2, 2f\n\t"                                                                        \
                     "mv t0, t2\n"                                                                                \
                     "2:\n\t"                                                                                     \
                     LOAD_W                                                                                       \
                     "vle32.v v4, (%[x])\n\t"                                                                     \
                     "vfmul.vv v0, v0, v4\n\t"                                                                    \
                     "vfadd.vv v8, v8, v0\n\t"                                                                    \
                     "sub %[left], %[left], t0\n\t"                                                               \
                     "slli t1, t0, " W_SHIFT "\n\t"                                                               \
                     "add %[w], %[w], t1\n\t"                                                                     \
                     "slli t1, t0, 2\n\t"                                                                         \
                     "add %[x], %[x], t1\n\t"                                                                     \
                     "j 1b\n"                                                                                     \
                     "3:\n\t"                                                                                     \
                     "vsetivli zero, 16, e32, m4, ta, ma\n\t"                                                     \
                     "vse32.v v8, (%[acc])\n\t"                                                                   \
                     : [w] "+r"(w), [x] "+r"(x), [left] "+r"(left)                                                \
                     : [acc] "r"(acc)                                                                             \
                     : "t0", "t1", "t2", "memory")

static float dot_f32_rvv(const float *w, const float *x, uint32_t n) {
    float acc[16];
    size_t left = n;
    FLOAT_DOT_LOOP("vsetvli zero, t0, e32, m4, tu, ma\n\tvle32.v v0, (%[w])\n\t", "2");
    return sum_lanes16(acc);
}

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

const kernel_set kernels_rvv = { .name = "rvv", .dot_f32 = dot_f32_rvv, .dot_f16 = dot_f16_scalar, .dot_bf16 = dot_bf16_rvv,
                                 .rows_q8_0 = rows_q8_0_rvv, .rows_q4_0 = rows_q4_0_rvv,
                                 .quantize_q8_0 = quantize_q8_0_scalar, .swiglu = swiglu_scalar, KERNELS_BLOCK_DTYPES_SCALAR };
#endif
