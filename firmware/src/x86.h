/* x86-64 SIMD for kernels_x86.c and crc32.c, under GCC and Clang (__x86_64__) or MSVC (_M_X64). GCC and
 * Clang compile a function for an instruction set when a target attribute asks (X86_TARGET); MSVC takes
 * the intrinsics in any function. Either way CPUID decides at open what runs (x86_cpuid, x86_xcr0). */
#ifndef COLIBRI_X86_H
#define COLIBRI_X86_H

#if (defined(__x86_64__) || defined(_M_X64)) && !defined(COLIBRI_KERNELS_SCALAR)
#define COLIBRI_X86_SIMD 1
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
#else
#include <intrin.h>
#define X86_TARGET(isa)
static inline void x86_cpuid(unsigned leaf, unsigned subleaf, unsigned regs[4]) {
    int r[4];
    __cpuidex(r, (int)leaf, (int)subleaf);
    for (int i = 0; i < 4; i++) regs[i] = (unsigned)r[i];
}
static inline unsigned x86_xcr0(void) { return (unsigned)_xgetbv(0); }
#endif

/* CPUID feature bits (Intel SDM vol. 2A, CPUID): leaf 1 ecx, leaf 7 ebx */
#define X86_1_ECX_PCLMUL (1u << 1)
#define X86_1_ECX_OSXSAVE (1u << 27)
#define X86_1_ECX_AVX (1u << 28)
#define X86_1_ECX_F16C (1u << 29)
#define X86_7_EBX_AVX2 (1u << 5)
#endif

#endif
