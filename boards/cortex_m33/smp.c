/* The second Cortex-M33 of the SSE-200 under FreeRTOS's SMP port (scons board=cortex_m33 rtos=freertos; docs/RTOS.md):
 * how it is released, how it starts the scheduler, and the doorbell the cores ring each other with.
 *
 * At reset the SSE-200 holds the second core in CPUWAIT. xPortStartScheduler, on the first core, calls
 * board_wake_secondary_cores (configWAKE_SECONDARY_CORES) once the kernel is set up: it points INITSVTOR1 at this
 * file's vector table (its own stack, its own reset entry) and clears the CPUWAIT bit, which starts the core there.
 * The second core enables its FPU, waits for the kernel's go-ahead (ucPrimaryCoreInitDoneFlag), gives its own
 * exceptions the kernel's priorities, says it is ready (ucSecondaryCoresReadyFlags) and starts its first task with the
 * port's SVC, as the first core does.
 *
 * The kernel asks a core to reschedule (portYIELD_CORE, a task made ready for it by the other core) through
 * vInterruptCore: MHU0 raises that core's interrupt 6 (CPU0INTR_SET, CPU1INTR_SET), whose handler clears it and
 * pends PendSV there. Without it the second core, which has no tick of its own, would sleep in its idle task's wfi
 * with a worker ready to run. */
#include <stdint.h>

#include "FreeRTOS.h"
#include "task.h"

#include "rtos.h"

#define REG(addr) (*(volatile uint32_t *)(uintptr_t)(addr))

#define SYSCTL 0x50021000u          /* the SSE-200's system control block (secure) */
#define INITSVTOR1 (SYSCTL + 0x114u)
#define CPUWAIT (SYSCTL + 0x118u)
#define MHU0 0x50003000u            /* CPU0INTR_SET +0x04, CPU0INTR_CLR +0x08, CPU1INTR_SET +0x14, CPU1INTR_CLR +0x18 */

extern volatile uint8_t ucPrimaryCoreInitDoneFlag;
extern volatile uint8_t ucSecondaryCoresReadyFlags[configNUMBER_OF_CORES - 1];
void vPortConfigureInterruptPriorities(void);
void SVC_Handler(void);
void PendSV_Handler(void);
void SysTick_Handler(void);

/* Ring a core's doorbell: it pends PendSV there, and the kernel picks its task. */
void vInterruptCore(uint8_t core);
void vInterruptCore(uint8_t core) {
    __asm__ volatile("dsb" ::: "memory"); /* what the kernel wrote is visible to the core woken */
    REG(MHU0 + (core ? 0x14u : 0x04u)) = 1u;
}

/* The doorbell's handler, on either core (interrupt 6 of each core's NVIC). */
void board_doorbell_isr(void);
void board_doorbell_isr(void) {
    REG(MHU0 + (portGET_CORE_ID() ? 0x18u : 0x08u)) = 1u;
    REG(0xE000ED04u) = 1u << 28; /* ICSR.PENDSVSET */
}

static void doorbell_enable(void) {
    *(volatile uint8_t *)(uintptr_t)(0xE000E400u + DOORBELL_IRQ) = DOORBELL_IRQ_PRIORITY; /* NVIC_IPR */
    REG(0xE000E100u) = 1u << DOORBELL_IRQ;                                                 /* NVIC_ISER0 */
}

/* ---- the second core ---- */
static _Noreturn void second_core_fault(void) { board_fatal("fault on the second core", ""); }

_Noreturn void second_core_start(void);
_Noreturn void second_core_start(void) {
    REG(0xE000ED88u) |= 0xFu << 20; /* CPACR: its own FPU */
    __asm__ volatile("dsb\n isb" ::: "memory");
    while (!ucPrimaryCoreInitDoneFlag) {}
    vPortConfigureInterruptPriorities();
    doorbell_enable();
    ucSecondaryCoresReadyFlags[0] = 1;
    __asm__ volatile("dsb\n svc 102" ::: "memory"); /* portSVC_START_SCHEDULER: its first task */
    for (;;) {}
}

/* Its stack before the scheduler runs, and for its exception handlers after (the tasks have their own). */
static uint64_t second_core_stack[512];

typedef void (*vector)(void);
/* VTOR's alignment: the table's size rounded up to a power of two (49 entries: 256 bytes). */
__attribute__((aligned(256), used)) static const vector second_core_vectors[16 + DOORBELL_IRQ + 1] = {
    (vector)(uintptr_t)(second_core_stack + sizeof second_core_stack / sizeof second_core_stack[0]),
    (vector)second_core_start, second_core_fault, second_core_fault, second_core_fault, second_core_fault,
    second_core_fault, 0, 0, 0, 0, SVC_Handler, second_core_fault, 0, PendSV_Handler, second_core_fault,
    [16 + DOORBELL_IRQ] = board_doorbell_isr,
};

/* configWAKE_SECONDARY_CORES, from xPortStartScheduler on the first core: the second starts at its table. */
BaseType_t board_wake_secondary_cores(void);
BaseType_t board_wake_secondary_cores(void) {
    doorbell_enable(); /* the first core's doorbell too */
    REG(INITSVTOR1) = (uint32_t)(uintptr_t)second_core_vectors;
    REG(CPUWAIT) = 0; /* clearing its bit resets the core from INITSVTOR1 */
    return pdTRUE;
}
