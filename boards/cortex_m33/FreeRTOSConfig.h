/* FreeRTOS on the two Cortex-M33 of QEMU's mps2-an521 (scons board=cortex_m33 rtos=freertos; docs/RTOS.md): the
 * kernel's ARM_CM33_NTZ port, SMP on both cores, on the secure side only (the SAU is off after reset, as on the bare
 * board). The first core runs every task of the other boards' builds (pinned to it, so they keep one core's
 * semantics: time slicing between the two contexts, the deadline task above them) and one of the two parallel_for
 * workers; the second core runs the other worker (boards/common/freertos/freertos.c). The tick is the first core's
 * SysTick on the 20 MHz main clock; the cores wake each other through the SSE-200's MHU (smp.c). */
#ifndef FREERTOS_CONFIG_H
#define FREERTOS_CONFIG_H

#define configCPU_CLOCK_HZ 20000000UL
#define configSYSTICK_CLOCK_HZ configCPU_CLOCK_HZ
#define configUSE_TICK_HOOK 1       /* it keeps the wrap count of the board's 32-bit cycle counter (cortex_m.c) */

#define configENABLE_FPU 1          /* the runtime's floats: their registers are saved with a task's context */
#define configENABLE_MVE 0
#define configENABLE_MPU 0
#define configENABLE_TRUSTZONE 0
#define configRUN_FREERTOS_SECURE_ONLY 1
#define configCHECK_HANDLER_INSTALLATION 1

/* SMP: two cores; which one runs is read from the SSE-200's CPU identity register (its secure alias: 0 on the first
 * core, 1 on the second); the second is released by the board (smp.c) once the first has set the kernel up. */
#define configNUMBER_OF_CORES 2
#define configCORE_ID_REGISTER 0x5001F000UL
#define configWAKE_SECONDARY_CORES board_wake_secondary_cores
#define configUSE_CORE_AFFINITY 1
#define configRUN_MULTIPLE_PRIORITIES 1
#define configUSE_PASSIVE_IDLE_HOOK 1   /* the second core's idle task waits for an interrupt, as the first's */

/* NVIC priorities (a byte each, the top bits implemented): interrupts at or below this urgency may call the
 * kernel's FromISR API; the kernel masks them (BASEPRI) in its critical sections. */
#define configMAX_SYSCALL_INTERRUPT_PRIORITY 0x40
#define configKERNEL_INTERRUPT_PRIORITY 0xE0
#define UART_IRQ_PRIORITY 0xC0      /* the UART's receive interrupt (boards/common/cortex_m.c) */
#define DOORBELL_IRQ_PRIORITY 0xE0  /* the MHU's doorbell: it only pends PendSV, at the kernel's priority */

#include "colibri_freertos.h"

#endif
