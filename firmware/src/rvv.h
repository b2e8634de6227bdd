/* The inline-assembly loops of the RISC-V vector kernels (kernels_rvv.c, whose opening says why they declare no
 * vector clobbers): kept apart so that kernels_rvv.c reads in one sitting. */
#ifndef COLIBRI_RVV_H
#define COLIBRI_RVV_H

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

/* The f16 values zero-extended into the e32 lanes of H widened to f32 in WIDE, exactly, as f16_to_f32 does it: normal
 * values and infinities/NaNs by rebiasing the exponent in the integer domain, subnormals as em * 2^-24 with the sign.
 * EM, SIGN and SUB are scratch register groups of H's size; vtype must be mask-undisturbed; uses v0, t0, t1, ft0. */
#define F16_WIDEN(H, EM, SIGN, WIDE, SUB)                                                                              \
    "li t0, 0x7FFF\n\tvand.vx " EM ", " H ", t0\n\t"                                 /* em */                         \
    "vxor.vv " SIGN ", " H ", " EM "\n\tvsll.vi " SIGN ", " SIGN ", 16\n\t"           /* the sign, at bit 31 */        \
    "li t0, 0x1C000\n\tvadd.vx " WIDE ", " EM ", t0\n\t"                             /* exponent 15 -> 127 */         \
    "li t1, 0x7C00\n\tvmsgeu.vx v0, " EM ", t1\n\t"                                                                    \
    "vadd.vx " WIDE ", " WIDE ", t0, v0.t\n\t"                                    /* infinity, NaN: exponent 255 */ \
    "vsll.vi " WIDE ", " WIDE ", 13\n\tvor.vv " WIDE ", " WIDE ", " SIGN "\n\t"                                         \
    "vfcvt.f.xu.v " SUB ", " EM "\n\t"                                                                                \
    "li t0, 0x33800000\n\tfmv.w.x ft0, t0\n\t"                                        /* 2^-24 */                      \
    "vfmul.vf " SUB ", " SUB ", ft0\n\tvor.vv " SUB ", " SUB ", " SIGN "\n\t"        /* em * 2^-24: exact */          \
    "li t1, 0x400\n\tvmsltu.vx v0, " EM ", t1\n\t"                                                                     \
    "vmerge.vvm " WIDE ", " WIDE ", " SUB ", v0\n\t"

/* accumulate: the elements in register groups of VLMAX (e32) at a time, each group's sums (ACC) held across the rows:
 * per row its p[t] into ft1, LOAD_ROW the row's values as f32 into ROW from t1, ROW = ROW * p[t], ACC = ACC + ROW
 * lane by lane, each element's additions in the scalar order (RVV keeps subnormals and makes NaNs canonical as the
 * scalar FPU does). */
#define ACCUMULATE_LOOP(LMUL, ACC, ROW, LOAD_ROW, E_SHIFT)                                                              \
    for (size_t left = n, vl; left; left -= vl, out += vl, v += vl)                                                   \
    __asm__ volatile("vsetvli %[vl], %[left], e32, " LMUL ", ta, mu\n\t"                                              \
                     "vle32.v " ACC ", (%[out])\n\t"                                                                   \
                     "mv t4, %[v]\n\tmv t5, %[p]\n\tmv t6, %[rows]\n\t"                                                \
                     "beqz t6, 2f\n"                                                                                  \
                     "1:\n\t"                                                                                         \
                     "flw ft1, 0(t5)\n\t"                                                                             \
                     LOAD_ROW                                                                                         \
                     "vfmul.vf " ROW ", " ROW ", ft1\n\t"                                                              \
                     "vfadd.vv " ACC ", " ACC ", " ROW "\n\t"                                                          \
                     "add t4, t4, %[step]\n\taddi t5, t5, 4\n\taddi t6, t6, -1\n\t"                                   \
                     "bnez t6, 1b\n"                                                                                  \
                     "2:\n\t"                                                                                         \
                     "vse32.v " ACC ", (%[out])\n\t"                                                                   \
                     : [vl] "=&r"(vl)                                                                                 \
                     : [left] "r"(left), [out] "r"(out), [v] "r"(v), [p] "r"(p), [rows] "r"((size_t)rows),            \
                       [step] "r"(stride << E_SHIFT)                                                                  \
                     : "t0", "t1", "t4", "t5", "t6", "ft0", "ft1", "memory")

#endif
