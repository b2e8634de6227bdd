/* RISC-V 64 bare metal under QEMU virt: NS16550A UART at 0x10000000 (byte-spaced registers),
 * the `time` CSR (CLINT mtime, 10 MHz) as counter, exit through the sifive_test device. The image region
 * (IMAGE_BASE, IMAGE_CAPACITY) comes from board.toml's [memory], the arena from the linker's ARENA region. */
#include <stdint.h>

#include "colibri.h"
#include "link.h"

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

static int uart_read_byte(void) {
    while (!(REG8(UART + 5) & 0x01)) {}
    return REG8(UART);
}

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

extern uint8_t __arena_start[], __arena_end[];
void board_main(void);
void board_main(void) {
    uart_init();
    board_io io = {
        .board = "riscv64_virt", .read_byte = uart_read_byte, .write = uart_write, .cycles = timer_ticks,
        .cycle_hz = TIMER_HZ,
        /* QEMU's loader may have put an image here; if not, OPEN says "bad magic" until one is uploaded */
        .image = (const uint8_t *)(uintptr_t)IMAGE_BASE, .image_size = IMAGE_CAPACITY,
        .upload = (uint8_t *)(uintptr_t)IMAGE_BASE, .upload_capacity = IMAGE_CAPACITY,
        .arena = __arena_start, .arena_size = (size_t)(__arena_end - __arena_start), .prefill_batch = PREFILL_BATCH,
    };
    uart_puts("colibri riscv64_virt ready\r\n");
    board_exit((uint32_t)link_serve(&io));
}
