/* Shared startup and drivers of the Cortex-M boards (cortex_m4, cortex_m55 under QEMU's MPS2/MPS3
 * machines): vector table, reset handler (FPU/MVE enable, .data copy, .bss zero), HardFault
 * report, CMSDK APB UART, a 64-bit cycle counter, semihosting exit. Each board's board.toml
 * supplies the addresses as -D flags: BOARD_NAME, UART_BASE, CPU_HZ in its cflags, and from its [memory]
 * (the memory map) IMAGE_BASE, IMAGE_CAPACITY (image and upload region) and the linker regions, whose ARENA
 * gives the symbols __arena_start/__arena_end.
 *
 * Built with COLIBRI_FREERTOS (scons board=NAME rtos=freertos, docs/RTOS.md) the same board runs FreeRTOS: the vector
 * table gains the kernel's SVC, PendSV and SysTick handlers (the tick from the core's own timer) and the UART's
 * receive interrupt (UART_RX_IRQ), the link task sleeps on that interrupt instead of polling, and board_main hands
 * the board_io to the tasks (boards/common/freertos/freertos.c). */
#include <stdint.h>

#include "colibri.h"
#include "link.h"
#if defined(COLIBRI_FREERTOS)
#include "rtos.h"
#endif

#define REG(addr) (*(volatile uint32_t *)(uintptr_t)(addr))

/* ---- semihosting: exit with a status QEMU passes on (needs -semihosting-config enable=on) ---- */
static _Noreturn void board_exit(uint32_t code) {
    uint32_t block[2] = { 0x20026u /* ADP_Stopped_ApplicationExit */, code };
    register uint32_t r0 __asm__("r0") = 0x20u; /* SYS_EXIT_EXTENDED: carries the status */
    register uint32_t *r1 __asm__("r1") = block;
    __asm__ volatile("bkpt 0xab" : : "r"(r0), "r"(r1) : "memory");
    for (;;) {}
}

/* ---- CMSDK APB UART: +0 DATA, +4 STATE (bit 0 TX full, bit 1 RX full), +8 CTRL, +0x10 BAUDDIV ---- */
static void uart_init(void) {
    REG(UART_BASE + 0x10) = 16;
    REG(UART_BASE + 0x08) = 3; /* TX and RX enable */
}

static void uart_write(const uint8_t *p, size_t n) {
    while (n--) {
        while (REG(UART_BASE + 0x04) & 1u) {}
        REG(UART_BASE) = *p++;
    }
}

#if defined(COLIBRI_FREERTOS)
/* CTRL bit 3 enables the receive interrupt, INTSTATUS (+0x0C) bit 1 is its flag (write 1 to clear). A byte that
 * arrived while the interrupt was off raises no flag, so the state is read again after enabling it. */
static int uart_read_byte(void) {
    while (!(REG(UART_BASE + 0x04) & 2u)) {
        REG(UART_BASE + 0x08) = 3u | 8u;
        if (!(REG(UART_BASE + 0x04) & 2u)) rtos_wait_rx();
        REG(UART_BASE + 0x08) = 3u;
    }
    return (int)(REG(UART_BASE) & 0xFFu);
}

static void uart_rx_isr(void) {
    REG(UART_BASE + 0x08) = 3u;  /* the receive interrupt off until the link task waits again */
    REG(UART_BASE + 0x0C) = 2u;
    rtos_rx_from_isr();
}
#else
static int uart_read_byte(void) {
    while (!(REG(UART_BASE + 0x04) & 2u)) {}
    return (int)(REG(UART_BASE) & 0xFFu);
}
#endif

static void uart_puts(const char *s) {
    while (*s) uart_write((const uint8_t *)s++, 1);
}

/* ---- cycle counter: a hardware counter at least 32 bits wide, read by polling ----
 * Not SysTick: it is 24 bits (0.5 s at 32 MHz), so a phase longer than that (any non-toy lm_head)
 * would wrap unseen between two reads, and counting its wrap interrupts is unreliable under QEMU's
 * TCG (the interrupt arrives milliseconds late: ../shared/BOARDS.md). QEMU models no DWT cycle
 * counter (a probe on both machines read 0 after enabling it).
 *   SSE_COUNTER (the M55's SSE-300): the subsystem's 64-bit system counter on the main clock;
 *   CMSDK_TIMER (the M4's AN386): CMSDK APB timer 0, a 32-bit down counter on the 25 MHz peripheral
 *   clock, extended to 64 bits by noticing wraps when read; reads must be less than 2^32 ticks apart
 *   (171 s), which any run's per-phase reads are. */
#if defined(SSE_COUNTER)
#define CNTCR (SSE_COUNTER)                /* control frame: bit 0 enables counting */
#define CNTCV_LO (SSE_COUNTER + 0x1000u)   /* read frame: the 64-bit count */
#define CNTCV_HI (SSE_COUNTER + 0x1004u)

static void counter_init(void) { REG(CNTCR) |= 1u; }

static uint64_t counter_cycles(void *user) {
    (void)user;
    uint32_t hi, lo;
    do { /* the high word again: a carry between the two reads would tear the value */
        hi = REG(CNTCV_HI);
        lo = REG(CNTCV_LO);
    } while (hi != REG(CNTCV_HI));
    return (uint64_t)hi << 32 | lo;
}
#elif defined(CMSDK_TIMER) && defined(COLIBRI_FREERTOS)
/* Under FreeRTOS several tasks read the counter and may preempt each other mid-read, so readers only read: the tick
 * interrupt (every millisecond, far more often than the 171 s between wraps) is the one writer of the wrap count,
 * behind a sequence number a reader checks (a seqlock: no interrupt masked, no lock taken). The barriers are dmb: a
 * reader may be on another core (the Cortex-M33 board's second). */
#define SEQ_BARRIER() __asm__ volatile("dmb" ::: "memory")
static volatile uint32_t timer_seq, timer_last, timer_wraps;

static void counter_init(void) {
    REG(CMSDK_TIMER + 0x08) = 0xFFFFFFFFu; /* RELOAD */
    REG(CMSDK_TIMER + 0x04) = 0xFFFFFFFFu; /* VALUE */
    REG(CMSDK_TIMER + 0x00) = 1u;          /* CTRL: enable, no interrupt */
    timer_last = REG(CMSDK_TIMER + 0x04);
}

void vApplicationTickHook(void);
void vApplicationTickHook(void) {
    timer_seq++;
    SEQ_BARRIER();
    const uint32_t now = REG(CMSDK_TIMER + 0x04);
    if (now > timer_last) timer_wraps++;
    timer_last = now;
    SEQ_BARRIER();
    timer_seq++;
}

static uint64_t counter_cycles(void *user) {
    (void)user;
    uint32_t seq, last, wraps, now;
    do {
        seq = timer_seq;
        SEQ_BARRIER();
        last = timer_last;
        wraps = timer_wraps;
        now = REG(CMSDK_TIMER + 0x04);
        SEQ_BARRIER();
    } while ((seq & 1u) || seq != timer_seq);
    if (now > last) wraps++; /* wrapped since the tick's last look */
    return ((uint64_t)wraps << 32) + (0xFFFFFFFFu - now);
}
#elif defined(CMSDK_TIMER)
static uint32_t timer_last;
static uint64_t timer_wraps;

static void counter_init(void) {
    REG(CMSDK_TIMER + 0x08) = 0xFFFFFFFFu; /* RELOAD */
    REG(CMSDK_TIMER + 0x04) = 0xFFFFFFFFu; /* VALUE */
    REG(CMSDK_TIMER + 0x00) = 1u;          /* CTRL: enable, no interrupt */
    timer_last = REG(CMSDK_TIMER + 0x04);
}

static uint64_t counter_cycles(void *user) {
    (void)user;
    uint32_t now = REG(CMSDK_TIMER + 0x04);
    if (now > timer_last) timer_wraps++; /* counted down through zero and reloaded */
    timer_last = now;
    return (timer_wraps << 32) + (0xFFFFFFFFu - now);
}
#else
#error "board.toml must name the cycle counter: -DSSE_COUNTER=<control frame> or -DCMSDK_TIMER=<timer base>"
#endif

/* ---- faults: report the stacked PC and exit with code 127 ---- */
void hardfault_report(const uint32_t *frame);
void hardfault_report(const uint32_t *frame) {
    static const char hex[] = "0123456789abcdef";
    char msg[] = "\r\ncolibri: HardFault at pc 0x00000000\r\n";
    uint32_t pc = frame[6];
    for (int i = 0; i < 8; i++) msg[29 + i] = hex[(pc >> (28 - 4 * i)) & 0xF];
    uart_puts(msg);
    board_exit(127);
}

__attribute__((naked)) static void hardfault_handler(void) {
    __asm__ volatile("tst lr, #4\n ite eq\n mrseq r0, msp\n mrsne r0, psp\n b hardfault_report");
}

static void default_handler(void) { board_exit(126); }

/* ---- reset ---- */
extern uint32_t __stack_top, __data_load, __data_start, __data_end, __bss_start, __bss_end;
extern uint8_t __arena_start[], __arena_end[];
void board_main(void);

#if defined(COLIBRI_FREERTOS)
#define STACK_FILL 0xA5A5A5A5u
extern uint32_t __stack_bottom;
#endif

_Noreturn void reset_handler(void);
_Noreturn void reset_handler(void) {
    REG(0xE000ED88u) |= 0xFu << 20; /* CPACR: CP10/CP11 full access (FPU, and MVE on the M55) */
    __asm__ volatile("dsb\n isb" ::: "memory");
#if defined(COLIBRI_FREERTOS)
    /* The main stack below this frame filled with a pattern, so board_interrupt_stack can tell how deep it has been
     * used (the start-up path, then the interrupt handlers once the scheduler runs). Nothing below the stack pointer
     * is live here; 64 bytes of room are left for this loop's own spills. */
    uint32_t *sp;
    __asm__ volatile("mov %0, sp" : "=r"(sp));
    for (volatile uint32_t *p = &__stack_bottom; p < sp - 16;) *p++ = STACK_FILL;
#endif
    for (uint32_t *s = &__data_load, *d = &__data_start; d < &__data_end;) *d++ = *s++;
    for (uint32_t *d = &__bss_start; d < &__bss_end;) *d++ = 0;
    board_main();
    board_exit(0);
}

typedef void (*vector)(void);
#if defined(COLIBRI_FREERTOS)
void SVC_Handler(void);
void PendSV_Handler(void);
void SysTick_Handler(void);
#if defined(DOORBELL_IRQ)
void board_doorbell_isr(void); /* a board with two cores: the other core asks this one to reschedule (its smp.c) */
#endif
#define SVC_VECTOR SVC_Handler
#define PENDSV_VECTOR PendSV_Handler
#define SYSTICK_VECTOR SysTick_Handler
#define VECTORS (16 + UART_RX_IRQ + 1)
#else
#define SVC_VECTOR default_handler
#define PENDSV_VECTOR default_handler
#define SYSTICK_VECTOR default_handler
#define VECTORS 16
#endif
__attribute__((section(".vectors"), used)) static const vector vectors[VECTORS] = {
    (vector)(uintptr_t)&__stack_top, (vector)reset_handler, default_handler, hardfault_handler,
    default_handler, default_handler, default_handler, 0, 0, 0, 0,
    SVC_VECTOR, default_handler, 0, PENDSV_VECTOR, SYSTICK_VECTOR,
#if defined(COLIBRI_FREERTOS)
    [16 + UART_RX_IRQ] = uart_rx_isr,
#if defined(DOORBELL_IRQ)
    [16 + DOORBELL_IRQ] = board_doorbell_isr,
#endif
#endif
};

#if defined(COLIBRI_FREERTOS)
_Noreturn void board_fatal(const char *what, const char *name) {
    uart_puts("\r\ncolibri: ");
    uart_puts(what);
    uart_puts(name);
    uart_puts("\r\n");
    board_exit(125);
}

_Noreturn void board_stop(uint32_t code) { board_exit(code); }

void board_idle(void) { __asm__ volatile("wfi"); }

/* The main stack: the start-up path, then (FreeRTOS resets it when the scheduler starts) every exception handler. */
void board_interrupt_stack(uint32_t *bytes, uint32_t *used) {
    const uint32_t *p = &__stack_bottom;
    while (p < &__stack_top && *p == STACK_FILL) p++;
    *bytes = (uint32_t)((uintptr_t)&__stack_top - (uintptr_t)&__stack_bottom);
    *used = (uint32_t)((uintptr_t)&__stack_top - (uintptr_t)p);
}

/* NVIC: the UART's receive interrupt enabled, at a priority below configMAX_SYSCALL_INTERRUPT_PRIORITY's (it calls
 * the kernel's FromISR API), the lowest the kernel's own handlers do not use. */
static void uart_irq_init(void) {
    *(volatile uint8_t *)(uintptr_t)(0xE000E400u + UART_RX_IRQ) = UART_IRQ_PRIORITY; /* NVIC_IPR, a byte each */
    REG(0xE000E100u + 4u * (UART_RX_IRQ / 32u)) = 1u << (UART_RX_IRQ % 32u); /* NVIC_ISER */
}
#endif

void board_main(void) {
    REG(0xE000ED08u) = (uint32_t)(uintptr_t)vectors; /* VTOR */
    uart_init();
    counter_init();
    static board_io io; /* static: FreeRTOS reuses this (main) stack for interrupts once the scheduler runs */
    io = (board_io){
        .board = BOARD_NAME, .read_byte = uart_read_byte, .write = uart_write, .cycles = counter_cycles,
        .cycle_hz = CPU_HZ,
        /* QEMU's loader may have put an image here; if not, OPEN says "bad magic" until one is uploaded */
        .image = (const uint8_t *)(uintptr_t)IMAGE_BASE, .image_size = IMAGE_CAPACITY,
        .upload = (uint8_t *)(uintptr_t)IMAGE_BASE, .upload_capacity = IMAGE_CAPACITY,
        .arena = __arena_start, .arena_size = (size_t)(__arena_end - __arena_start), .prefill_batch = PREFILL_BATCH,
    };
#if defined(COLIBRI_FREERTOS)
    uart_irq_init();
    uart_puts("FreeRTOS: colibri " BOARD_NAME " ready\r\n");
    rtos_start(&io);
#else
    uart_puts("colibri " BOARD_NAME " ready\r\n");
    board_exit((uint32_t)link_serve(&io));
#endif
}
