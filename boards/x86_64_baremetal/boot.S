/* x86_64 bare-metal entry: QEMU's multiboot v1 loader enters here in 32-bit protected mode with
 * paging off (EAX = 0x2BADB002, EBX = multiboot info). We zero .bss, identity-map 0-4 GiB with
 * 2 MiB pages, enter long mode, enable SSE (and AVX when the CPU has it), and call
 * board_main(mbi). Facts behind each step: ../../../shared/BOARDS.md section 1, docs/BOARDS.md. */
    .set MB_MAGIC, 0x1BADB002
    .set MB_FLAGS, 0x3                  /* page-align modules, give memory info */

    .section .multiboot, "a"
    .align 4
    .long MB_MAGIC, MB_FLAGS, -(MB_MAGIC + MB_FLAGS)

    .section .bss
    .align 4096
pml4:   .skip 4096
pdpt:   .skip 4096
pds:    .skip 4096 * 4
mbi_ptr: .skip 8

    .section .stack, "aw", @nobits
    .align 16
stack:  .skip 65536
stack_top:

    .section .rodata
    .align 16
gdt:
    .quad 0
    .quad 0x00AF9A000000FFFF             /* 0x08: 64-bit code */
    .quad 0x00CF92000000FFFF             /* 0x10: data */
gdt_end:
gdt_ptr:
    .word gdt_end - gdt - 1
    .quad gdt

    .section .text.boot, "ax"
    .code32
    .global _start
_start:
    cli
    mov %ebx, %esi                       /* keep the multiboot info pointer */
    /* zero .bss (no stack needed) */
    mov $__bss_start, %edi
    mov $__bss_end, %ecx
    sub %edi, %ecx
    xor %eax, %eax
    cld
    rep stosb
    mov %esi, mbi_ptr
    mov $stack_top, %esp

    /* long mode available? CPUID 0x80000001 EDX bit 29 */
    mov $0x80000001, %eax
    cpuid
    bt $29, %edx
    jnc no_long_mode

    /* page tables: PML4[0] -> PDPT, PDPT[0..3] -> 4 PDs of 512 x 2 MiB pages = 0-4 GiB */
    mov $pdpt, %eax
    or $0x3, %eax
    mov %eax, pml4
    mov $0, %ecx
1:  mov %ecx, %eax
    shl $12, %eax
    add $pds, %eax
    or $0x3, %eax
    mov %eax, pdpt(,%ecx,8)
    inc %ecx
    cmp $4, %ecx
    jne 1b
    mov $0, %ecx                          /* 2048 PD entries: address = i * 2 MiB */
2:  mov %ecx, %eax
    shl $21, %eax
    or $0x83, %eax                        /* present, writable, 2 MiB page */
    mov %eax, pds(,%ecx,8)
    mov %ecx, %eax
    shr $11, %eax                         /* high dword: bits 32+ of the address */
    mov %eax, pds+4(,%ecx,8)
    inc %ecx
    cmp $2048, %ecx
    jne 2b

    mov %cr4, %eax
    or $(1 << 5), %eax                    /* PAE */
    mov %eax, %cr4
    mov $pml4, %eax
    mov %eax, %cr3
    mov $0xC0000080, %ecx                 /* EFER.LME */
    rdmsr
    or $(1 << 8), %eax
    wrmsr
    mov %cr0, %eax
    or $0x80000001, %eax                  /* PG | PE */
    mov %eax, %cr0
    lgdt gdt_ptr
    ljmp $0x08, $long_mode

no_long_mode:
    mov $0x3F8, %dx                       /* say why on COM1, then exit with code 126 */
    mov $'!', %al
    out %al, %dx
    mov $0xF4, %dx
    mov $126, %al
    out %al, %dx
    hlt

    .code64
long_mode:
    mov $0x10, %ax
    mov %ax, %ds
    mov %ax, %es
    mov %ax, %ss
    mov %ax, %fs
    mov %ax, %gs
    mov $stack_top, %rsp

    /* SSE: CR0.EM = 0, CR0.MP = 1; CR4.OSFXSR | CR4.OSXMMEXCPT */
    mov %cr0, %rax
    and $~(1 << 2), %rax
    or $(1 << 1), %rax
    mov %rax, %cr0
    mov %cr4, %rax
    or $(3 << 9), %rax
    mov %rax, %cr4
    /* AVX: if CPUID.1:ECX has XSAVE (26) and AVX (28), set CR4.OSXSAVE and XCR0 = x87|SSE|AVX, plus
     * AVX-512's opmask and ZMM state (bits 5-7) where CPUID.(0DH, 0).EAX says the CPU has them (QEMU's
     * TCG does not: there the AVX2 kernels run) */
    mov $1, %eax
    cpuid
    and $((1 << 26) | (1 << 28)), %ecx
    cmp $((1 << 26) | (1 << 28)), %ecx
    jne 3f
    mov %cr4, %rax
    or $(1 << 18), %rax
    mov %rax, %cr4
    mov $0xd, %eax
    xor %ecx, %ecx
    cpuid
    and $0xe0, %eax
    or $7, %eax
    xor %edx, %edx
    xor %ecx, %ecx
    xsetbv
3:
    mov mbi_ptr, %edi
    call board_main
4:  hlt
    jmp 4b

/* 32 exception stubs, 16 bytes apart (board.c computes their addresses from isr_stubs):
 * each passes its vector to board_fault(vector), which reports it and exits; none returns. */
    .balign 16
    .global isr_stubs
isr_stubs:
    .irp n, 0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,18,19,20,21,22,23,24,25,26,27,28,29,30,31
    .balign 16
    mov $\n, %edi
    and $-16, %rsp
    call board_fault
    .endr
