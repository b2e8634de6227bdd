/* FreeRTOS on the Cortex-M4F of QEMU's mps2-an386 (scons board=cortex_m4 rtos=freertos; docs/RTOS.md): the kernel's
 * ARM_CM4F port. The tick is the core's SysTick on its 1 MHz reference clock: QEMU 7.2's mps2-an386 counts SysTick at
 * 1 MHz whichever source is chosen (measured: set to the 25 MHz processor clock, a 1 ms reload gave 25 ms ticks), so
 * the port is told the reference clock's rate and selects it. The tick also keeps the wrap count of the board's 32-bit
 * cycle counter (CMSDK timer 0, 25 MHz), which several tasks read (boards/common/cortex_m.c). */
#ifndef FREERTOS_CONFIG_H
#define FREERTOS_CONFIG_H

#define configCPU_CLOCK_HZ 25000000UL
#define configSYSTICK_CLOCK_HZ 1000000UL /* not the CPU's: the port selects the reference clock */
#define configUSE_TICK_HOOK 1

/* The port's handlers under the names boards/common/cortex_m.c's vector table gives them. */
#define vPortSVCHandler SVC_Handler
#define xPortPendSVHandler PendSV_Handler
#define xPortSysTickHandler SysTick_Handler

/* NVIC priorities (a byte each, the top bits implemented): interrupts at or below this urgency may call the
 * kernel's FromISR API; the kernel masks them (BASEPRI) in its critical sections. */
#define configMAX_SYSCALL_INTERRUPT_PRIORITY 0x40
#define configKERNEL_INTERRUPT_PRIORITY 0xE0
#define UART_IRQ_PRIORITY 0xC0      /* the UART's receive interrupt (boards/common/cortex_m.c) */

#include "colibri_freertos.h"

#endif
