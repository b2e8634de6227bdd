/* x86-64 SIMD for kernels_x86.c and crc32.c, under GCC and Clang (__x86_64__) or MSVC (_M_X64). GCC and
 * Clang compile a function for an instruction set when a target attribute asks (X86_TARGET); MSVC takes
 * the intrinsics in any function. Either way CPUID decides at open what runs (x86_cpuid, x86_xcr0). */
#ifndef COLIBRI_X86_H
#define COLIBRI_X86_H

#include "internal.h" /* COLIBRI_X86_SIMD (kernels.h) */

#if defined(COLIBRI_X86_SIMD)
#include <immintrin.h>

#if defined(__GNUC__) || defined(__clang__)
#include <cpuid.h>
#define X86_TARGET(isa) __attribute__((target(isa)))
/* regs = eax, ebx, ecx, edx of CPUID leaf, subleaf */
static inline void x86_cpuid(unsigned leaf, unsigned subleaf, unsigned regs[4]) {
    __cpuid_count(leaf, subleaf, regs[0], regs[1], regs[2], regs[3]);
}
/* the low half of XCR0: which register states the OS (or the boot code) saves and enables */
static inline unsigned x86_xcr0(void) {
    unsigned lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    (void)hi;
    return lo;
}
/* A read prefetch into every cache level. Not _mm_prefetch: GCC 12 drops it when it reaches a loop through
 * an always_inline function with a target attribute (the quantized kernels' shared bodies). */
#define x86_prefetch(p) __builtin_prefetch((p), 0, 3)
#else
#include <intrin.h>
#define X86_TARGET(isa)
static inline void x86_cpuid(unsigned leaf, unsigned subleaf, unsigned regs[4]) {
    int r[4];
    __cpuidex(r, (int)leaf, (int)subleaf);
    for (int i = 0; i < 4; i++) regs[i] = (unsigned)r[i];
}
static inline unsigned x86_xcr0(void) { return (unsigned)_xgetbv(0); }
#define x86_prefetch(p) _mm_prefetch((const char *)(p), _MM_HINT_T0)
#endif

/* CPUID feature bits (Intel SDM vol. 2A, CPUID): leaf 1 ecx, leaf 7 ebx and ecx */
#define X86_1_ECX_PCLMUL (1u << 1)
#define X86_1_ECX_OSXSAVE (1u << 27)
#define X86_1_ECX_AVX (1u << 28)
#define X86_1_ECX_F16C (1u << 29)
#define X86_7_EBX_AVX2 (1u << 5)
#define X86_7_EBX_AVX512F (1u << 16)
#define X86_7_EBX_AVX512BW (1u << 30)
#define X86_7_EBX_AVX512VL (1u << 31)
#define X86_7_ECX_AVX512VNNI (1u << 11)
#endif

#endif
