/* RISC-V 64 bare metal under QEMU virt: NS16550A UART at 0x10000000 (byte-spaced registers),
 * the `time` CSR (CLINT mtime, 10 MHz) as counter, exit through the sifive_test device. The image region
 * (IMAGE_BASE, IMAGE_CAPACITY) comes from board.toml's [memory], the arena from the linker's ARENA region.
 *
 * Built with COLIBRI_FREERTOS (scons board=riscv64_virt rtos=freertos, docs/RTOS.md) the same board runs FreeRTOS:
 * its trap handler takes every trap (the tick is the CLINT's machine timer), the UART's receive interrupt reaches it
 * through the PLIC, the link task sleeps on that interrupt instead of polling, and board_main hands the board_io to
 * the tasks (boards/common/freertos/freertos.c). */
#include <stdint.h>

#include "colibri.h"
#include "link.h"
#if defined(COLIBRI_FREERTOS)
#include "rtos.h"
#endif

#define UART 0x10000000u
#define TEST_DEVICE 0x00100000u
#define TIMER_HZ 10000000u

#define REG8(a) (*(volatile uint8_t *)(uintptr_t)(a))

static void uart_init(void) {
    REG8(UART + 1) = 0x00; /* no interrupts */
    REG8(UART + 3) = 0x03; /* 8N1 */
    REG8(UART + 2) = 0xC7; /* FIFO, RX trigger 14: QEMU accepts more bytes per poll */
}

static void uart_write(const uint8_t *p, size_t n) {
    while (n--) {
        while (!(REG8(UART + 5) & 0x20)) {}
        REG8(UART) = *p++;
    }
}

#if defined(COLIBRI_FREERTOS)
/* IER bit 0 raises the UART's interrupt while received data waits (the FIFO at its trigger level, or a byte
 * there for four character times); the handler turns it off again and wakes the link task. */
static int uart_read_byte(void) {
    while (!(REG8(UART + 5) & 0x01)) {
        REG8(UART + 1) = 0x01;
        if (!(REG8(UART + 5) & 0x01)) rtos_wait_rx();
        REG8(UART + 1) = 0x00;
    }
    return REG8(UART);
}
#else
static int uart_read_byte(void) {
    while (!(REG8(UART + 5) & 0x01)) {}
    return REG8(UART);
}
#endif

static void uart_puts(const char *s) {
    while (*s) uart_write((const uint8_t *)s++, 1);
}

/* sifive_test: 0x5555 = pass (QEMU status 0); (code << 16) | 0x3333 = fail with status code. */
static _Noreturn void board_exit(uint32_t code) {
    *(volatile uint32_t *)(uintptr_t)TEST_DEVICE = code ? (code << 16) | 0x3333u : 0x5555u;
    for (;;) __asm__ volatile("wfi");
}

static uint64_t timer_ticks(void *user) {
    (void)user;
    uint64_t t;
    __asm__ volatile("csrr %0, time" : "=r"(t));
    return t;
}

_Noreturn void board_trap(uint64_t cause, uint64_t pc, uint64_t tval);
_Noreturn void board_trap(uint64_t cause, uint64_t pc, uint64_t tval) {
    static const char hex[] = "0123456789abcdef";
    char msg[] = "\r\ncolibri: trap mcause 0x0000000000000000 mepc 0x0000000000000000 mtval 0x0000000000000000\r\n";
    const uint64_t v[3] = { cause, pc, tval };
    const int at[3] = { 24, 48, 73 };
    for (int k = 0; k < 3; k++)
        for (int i = 0; i < 16; i++) msg[at[k] + i] = hex[(v[k] >> (60 - 4 * i)) & 0xF];
    uart_puts(msg);
    board_exit(127);
}

#if defined(COLIBRI_FREERTOS)
/* The PLIC (QEMU virt: 0x0C000000; UART0 is its source 10; hart 0's M mode is its context 0). */
#define PLIC 0x0C000000u
#define UART_IRQ 10u
#define REG32(a) (*(volatile uint32_t *)(uintptr_t)(a))

static void uart_irq_init(void) {
    REG8(UART + 3) = 0x83; /* the divisor latch: 1, so the receive timeout (four characters) is 100 us, not 4 ms */
    REG8(UART + 0) = 0x01;
    REG8(UART + 1) = 0x00;
    REG8(UART + 3) = 0x03;
    REG32(PLIC + 4u * UART_IRQ) = 1;           /* priority */
    REG32(PLIC + 0x2000u) = 1u << UART_IRQ;    /* enabled for context 0 */
    REG32(PLIC + 0x200000u) = 0;               /* context 0's threshold */
}

/* The kernel's trap handler (portASM.S) calls these for what is not its own (the machine timer, ecall). */
void freertos_risc_v_application_interrupt_handler(uint64_t cause, uint64_t pc);
void freertos_risc_v_application_interrupt_handler(uint64_t cause, uint64_t pc) {
    if (cause != (1ull << 63 | 11u)) board_trap(cause, pc, 0); /* only the machine external interrupt is expected */
    const uint32_t irq = REG32(PLIC + 0x200004u); /* claim */
    if (irq == UART_IRQ) REG8(UART + 1) = 0x00;   /* off until the link task waits again */
    REG32(PLIC + 0x200004u) = irq;                /* complete */
    if (irq == UART_IRQ) rtos_rx_from_isr();
}

void freertos_risc_v_application_exception_handler(uint64_t cause, uint64_t pc);
void freertos_risc_v_application_exception_handler(uint64_t cause, uint64_t pc) {
    uint64_t tval;
    __asm__ volatile("csrr %0, mtval" : "=r"(tval));
    board_trap(cause, pc, tval);
}

_Noreturn void board_fatal(const char *what, const char *name) {
    uart_puts("\r\ncolibri: ");
    uart_puts(what);
    uart_puts(name);
    uart_puts("\r\n");
    board_exit(125);
}

_Noreturn void board_stop(uint32_t code) { board_exit(code); }

void board_idle(void) { __asm__ volatile("wfi"); }

/* The port's interrupt stack (configISR_STACK_SIZE_WORDS words below xISRStackTop), which its xPortStartScheduler
 * fills with 0xee (portISR_STACK_FILL_BYTE): every trap runs on it. */
extern const uint64_t xISRStackTop;
void board_interrupt_stack(uint32_t *bytes, uint32_t *used) {
    const uint32_t size = configISR_STACK_SIZE_WORDS * 8u;
    const uint8_t *p = (const uint8_t *)(uintptr_t)(xISRStackTop - size), *top = p + size;
    while (p < top && *p == 0xEEu) p++;
    *bytes = size;
    *used = (uint32_t)(top - p);
}

void freertos_risc_v_trap_handler(void);
#endif

extern uint8_t __arena_start[], __arena_end[];
void board_main(void);
void board_main(void) {
    uart_init();
    static board_io io; /* static: the tasks keep it once board_main's stack is left behind */
    io = (board_io){
        .board = "riscv64_virt", .read_byte = uart_read_byte, .write = uart_write, .cycles = timer_ticks,
        .cycle_hz = TIMER_HZ,
        /* QEMU's loader may have put an image here; if not, OPEN says "bad magic" until one is uploaded */
        .image = (const uint8_t *)(uintptr_t)IMAGE_BASE, .image_size = IMAGE_CAPACITY,
        .upload = (uint8_t *)(uintptr_t)IMAGE_BASE, .upload_capacity = IMAGE_CAPACITY,
        .arena = __arena_start, .arena_size = (size_t)(__arena_end - __arena_start), .prefill_batch = PREFILL_BATCH,
    };
#if defined(COLIBRI_FREERTOS)
    uart_irq_init();
    __asm__ volatile("csrw mtvec, %0" : : "r"(freertos_risc_v_trap_handler)); /* every trap is the kernel's now */
    uart_puts("FreeRTOS: colibri riscv64_virt ready\r\n");
    rtos_start(&io);
#else
    uart_puts("colibri riscv64_virt ready\r\n");
    board_exit((uint32_t)link_serve(&io));
#endif
}
