/* x86_64 bare metal under QEMU (-M pc): COM1 16550 UART by polling, the TSC as cycle counter
 * (calibrated against the PIT), exit codes through isa-debug-exit, the image as a multiboot
 * module or uploaded over the serial link. Memory map: board.toml's [memory] (IMAGE_BASE: the upload region;
 * ARENA_BASE: the arena, to the end of RAM), docs/BOARDS.md. */
#include <stdint.h>

#include "colibri.h"
#include "link.h"

#define COM1 0x3F8
#define DEBUG_EXIT_PORT 0xF4
#define FAULT_EXIT_BASE 64        /* exit code 64 + vector for a CPU exception */

static inline void outb(uint16_t port, uint8_t v) { __asm__ volatile("outb %0, %1" : : "a"(v), "Nd"(port)); }
static inline uint8_t inb(uint16_t port) {
    uint8_t v;
    __asm__ volatile("inb %1, %0" : "=a"(v) : "Nd"(port));
    return v;
}

static void uart_init(void) {
    outb(COM1 + 1, 0x00); /* no interrupts */
    outb(COM1 + 3, 0x80); /* DLAB */
    outb(COM1 + 0, 0x01); /* divisor 1: 115200 baud (QEMU ignores it) */
    outb(COM1 + 1, 0x00);
    outb(COM1 + 3, 0x03); /* 8N1 */
    outb(COM1 + 2, 0xC7); /* FIFO on, cleared, RX trigger 14 bytes: 10x the throughput of 1 under QEMU */
    outb(COM1 + 4, 0x03);
}

static void uart_write(const uint8_t *p, size_t n) {
    while (n--) {
        while (!(inb(COM1 + 5) & 0x20)) {}
        outb(COM1, *p++);
    }
}

static int uart_read_byte(void) {
    while (!(inb(COM1 + 5) & 0x01)) {}
    return inb(COM1);
}

static void uart_puts(const char *s) {
    while (*s) uart_write((const uint8_t *)s++, 1);
}

static _Noreturn void board_exit(uint8_t code) {
    outb(DEBUG_EXIT_PORT, code); /* QEMU exits with status (code << 1) | 1 */
    for (;;) __asm__ volatile("cli; hlt");
}

static uint64_t rdtsc(void *user) {
    (void)user;
    uint32_t lo, hi;
    __asm__ volatile("rdtsc" : "=a"(lo), "=d"(hi));
    return (uint64_t)hi << 32 | lo;
}

/* TSC ticks in 10 ms of PIT channel 2 (1.193182 MHz), times 100. */
static uint64_t tsc_hz(void) {
    const uint16_t count = 11932;
    outb(0x61, (uint8_t)((inb(0x61) & ~0x02) | 0x01)); /* gate on, speaker off */
    outb(0x43, 0xB0);                                   /* channel 2, lo/hi byte, mode 0 */
    outb(0x42, count & 0xFF);
    outb(0x42, count >> 8);
    uint64_t t0 = rdtsc(0);
    while (!(inb(0x61) & 0x20)) {}
    return (rdtsc(0) - t0) * 100;
}

/* ---- exceptions: an IDT whose 32 stubs (boot.S) report the vector and exit ---- */
extern const uint8_t isr_stubs[];
static struct __attribute__((packed)) { uint16_t lo, sel; uint8_t ist, attr; uint16_t mid; uint32_t hi, zero; } idt[32];

static void idt_init(void) {
    for (int v = 0; v < 32; v++) {
        uint64_t a = (uint64_t)(uintptr_t)(isr_stubs + 16 * v);
        idt[v].lo = (uint16_t)a;
        idt[v].sel = 0x08;
        idt[v].ist = 0;
        idt[v].attr = 0x8E; /* present, interrupt gate */
        idt[v].mid = (uint16_t)(a >> 16);
        idt[v].hi = (uint32_t)(a >> 32);
        idt[v].zero = 0;
    }
    struct __attribute__((packed)) { uint16_t limit; uint64_t base; } ptr = { sizeof idt - 1, (uint64_t)(uintptr_t)idt };
    __asm__ volatile("lidt %0" : : "m"(ptr));
}

_Noreturn void board_fault(uint32_t vector);
_Noreturn void board_fault(uint32_t vector) {
    char msg[] = "\r\ncolibri: CPU exception vector 00\r\n";
    msg[32] = (char)('0' + vector / 10);
    msg[33] = (char)('0' + vector % 10);
    uart_puts(msg);
    board_exit((uint8_t)(FAULT_EXIT_BASE + vector));
}

/* ---- multiboot v1 info (only the fields we read) ---- */
struct mb_info { uint32_t flags, mem_lower, mem_upper, boot_device, cmdline, mods_count, mods_addr; };
struct mb_module { uint32_t start, end, cmdline, reserved; };

void board_main(const struct mb_info *mbi);
void board_main(const struct mb_info *mbi) {
    uart_init();
    idt_init();
    uint64_t ram_end = (mbi->flags & 1u) ? 0x100000u + (uint64_t)mbi->mem_upper * 1024u : 0;
    board_io io = {
        .board = "x86_64_baremetal", .read_byte = uart_read_byte, .write = uart_write, .cycles = rdtsc,
        .cycle_hz = tsc_hz(),
        .upload = (uint8_t *)(uintptr_t)IMAGE_BASE,
        .upload_capacity = ram_end > ARENA_BASE ? ARENA_BASE - IMAGE_BASE : 0,
        .arena = (void *)(uintptr_t)ARENA_BASE,
        .arena_size = ram_end > ARENA_BASE ? (size_t)(ram_end - ARENA_BASE) : 0, .prefill_batch = PREFILL_BATCH,
    };
    if ((mbi->flags & (1u << 3)) && mbi->mods_count > 0) {
        const struct mb_module *m = (const struct mb_module *)(uintptr_t)mbi->mods_addr;
        if (m->end > m->start && m->end <= ARENA_BASE) { /* an upload may overwrite it later; that replaces it */
            io.image = (const uint8_t *)(uintptr_t)m->start;
            io.image_size = m->end - m->start;
        } else {
            uart_puts("colibri: multiboot module reaches into the arena; ignored\r\n");
        }
    }
    uart_puts("colibri x86_64_baremetal ready\r\n");
    board_exit((uint8_t)link_serve(&io));
}
