/* FreeRTOS on QEMU's RISC-V virt machine, rv64gcv in M-mode (scons board=riscv64_virt rtos=freertos; docs/RTOS.md):
 * the kernel's RISC-V port with the CLINT's machine timer as the tick (chip_specific_extensions/
 * RISCV_MTIME_CLINT_no_extensions). It saves the FP and vector registers with a task's context when the task has
 * used them (mstatus.FS and VS dirty): the runtime's RVV kernels are preempted like any code. The port's assembly
 * reads configENABLE_FPU and configENABLE_VPU from the command line (board.toml's asflags), not from this file. */
#ifndef FREERTOS_CONFIG_H
#define FREERTOS_CONFIG_H

/* The port's name for the rate of mtime (the CLINT's 10 MHz): it steps mtimecmp by configCPU_CLOCK_HZ / tick rate. */
#define configCPU_CLOCK_HZ 10000000
#define configMTIME_BASE_ADDRESS 0x0200BFF8
#define configMTIMECMP_BASE_ADDRESS 0x02004000
#define configISR_STACK_SIZE_WORDS 512   /* the interrupts' own stack (the port switches to it): 4 KiB */

#ifndef configENABLE_FPU
#define configENABLE_FPU 1
#endif
#ifndef configENABLE_VPU
#define configENABLE_VPU 1
#endif

#define UART_IRQ_PRIORITY 1              /* unused: the PLIC's sources share one level here (board.c) */

#include "colibri_freertos.h"

#endif
