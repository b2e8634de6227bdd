/* Between a board's hardware code and the FreeRTOS tasks that serve Colibri on it (boards/common/freertos/freertos.c,
 * docs/RTOS.md). The board starts the machine, fills a board_io and calls rtos_start(); its UART's receive interrupt
 * calls rtos_rx_from_isr(), and its read_byte waits in rtos_wait_rx() for it. */
#ifndef COLIBRI_RTOS_H
#define COLIBRI_RTOS_H

#include "FreeRTOSConfig.h" /* the board's, in boards/<name>/: UART_IRQ_PRIORITY */
#include "link.h"

/* Create the tasks (link, inference, fetch, deadline, pair: static memory) and start the scheduler. Never returns.
 * Fills io's execute, request and fetch hooks. */
_Noreturn void rtos_start(board_io *io);

/* In the link task's read_byte: sleep until the UART's receive interrupt (rtos_rx_from_isr). */
void rtos_wait_rx(void);
/* In the UART's receive interrupt, after it has masked itself: wake the link task. */
void rtos_rx_from_isr(void);

/* The board's: print "colibri: <what><name>" on its console and stop with code 125. */
_Noreturn void board_fatal(const char *what, const char *name);
/* The board's: stop the machine with this exit code (QUIT's). */
_Noreturn void board_stop(uint32_t code);
/* The board's: wait for an interrupt (the idle task's hook). */
void board_idle(void);
/* The board's: the stack its interrupt handlers run on (Cortex-M: the main stack; RISC-V: the port's own), its bytes
 * and the most of them used so far (the part whose fill pattern has been overwritten). */
void board_interrupt_stack(uint32_t *bytes, uint32_t *used);

#endif
