/* FreeRTOS on the Cortex-M55 of QEMU's mps3-an547 (scons board=cortex_m55 rtos=freertos; docs/RTOS.md). The kernel's
 * ARM_CM55_NTZ port, on the secure side only: the SAU is off after reset and every access is secure, as on the bare
 * board. The tick is the core's SysTick on the 32 MHz processor clock. */
#ifndef FREERTOS_CONFIG_H
#define FREERTOS_CONFIG_H

#define configCPU_CLOCK_HZ 32000000UL
#define configSYSTICK_CLOCK_HZ configCPU_CLOCK_HZ

#define configENABLE_FPU 1          /* the runtime's floats: their registers are saved with a task's context */
#define configENABLE_MVE 1          /* and Helium's (kernels_mve.c) */
#define configENABLE_MPU 0
#define configENABLE_TRUSTZONE 0
#define configRUN_FREERTOS_SECURE_ONLY 1
#define configCHECK_HANDLER_INSTALLATION 1

/* NVIC priorities (a byte each, the top bits implemented): interrupts at or below this urgency may call the
 * kernel's FromISR API; the kernel masks them (BASEPRI) in its critical sections. */
#define configMAX_SYSCALL_INTERRUPT_PRIORITY 0x40
#define configKERNEL_INTERRUPT_PRIORITY 0xE0
#define UART_IRQ_PRIORITY 0xC0      /* the UART's receive interrupt (boards/common/cortex_m.c) */

#include "colibri_freertos.h"

#endif
