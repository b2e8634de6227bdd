/* RISC-V 64 entry under QEMU virt with -bios none: QEMU's reset stub jumps here in M-mode with
 * a0 = hart id. Park other harts, set sp and gp, enable the FPU and vector unit (mstatus.FS and
 * mstatus.VS must be set before the first FP or vector instruction), install the trap handler,
 * zero .bss and call board_main. */
    .section .text.boot, "ax"
    .global _start
_start:
    bnez a0, park
    la sp, __stack_top
    .option push
    .option norelax
    la gp, __global_pointer$
    .option pop
    li t0, (1 << 13) | (1 << 9)          /* mstatus.FS = initial, mstatus.VS = initial */
    csrs mstatus, t0
    csrwi fcsr, 0
    la t0, trap_entry
    csrw mtvec, t0
    la t0, __bss_start
    la t1, __bss_end
1:  bgeu t0, t1, 2f
    sd zero, 0(t0)
    addi t0, t0, 8
    j 1b
2:  call board_main
park:
    wfi
    j park

/* Any trap is fatal: hand mcause, mepc and mtval to board_trap(), which reports and exits. */
    .balign 4
trap_entry:
    csrr a0, mcause
    csrr a1, mepc
    csrr a2, mtval
    la sp, __stack_top
    call board_trap
    j park
