/* The FreeRTOS settings every Colibri board shares (docs/RTOS.md). A board's FreeRTOSConfig.h (boards/<name>/) sets
 * what is its own (clock, interrupt priorities, the port's options) and then includes this file.
 *
 * Static allocation only: no heap anywhere in the image (configSUPPORT_DYNAMIC_ALLOCATION 0, and no heap_N.c is
 * compiled), so the footprint check of the whole ELF still finds no allocator; pvPortMalloc and vPortFree are on
 * its forbidden list. */
#ifndef COLIBRI_FREERTOS_H
#define COLIBRI_FREERTOS_H

#define configUSE_PREEMPTION 1
#define configUSE_TIME_SLICING 1                 /* two inference tasks of one priority share the core by the tick */
#define configUSE_PORT_OPTIMISED_TASK_SELECTION 0
#define configUSE_TICKLESS_IDLE 0
#define configTICK_RATE_HZ 1000                  /* the deadline task's period is one tick: 1 kHz */
#define configMAX_PRIORITIES 8
#define configMINIMAL_STACK_SIZE 256             /* words: the idle task's (it only waits for an interrupt) */
#define configMAX_TASK_NAME_LEN 12
#define configTICK_TYPE_WIDTH_IN_BITS TICK_TYPE_WIDTH_32_BITS
#define configIDLE_SHOULD_YIELD 1
#define configTASK_NOTIFICATION_ARRAY_ENTRIES 5  /* a request, a transfer, a received byte, a pair, parallel work */
#define configQUEUE_REGISTRY_SIZE 0
#define configENABLE_BACKWARD_COMPATIBILITY 0
#define configNUM_THREAD_LOCAL_STORAGE_POINTERS 0
#define configUSE_MINI_LIST_ITEM 1
#define configSTACK_DEPTH_TYPE uint32_t
#define configMESSAGE_BUFFER_LENGTH_TYPE size_t
#define configUSE_NEWLIB_REENTRANT 0

#define configSUPPORT_STATIC_ALLOCATION 1
#define configSUPPORT_DYNAMIC_ALLOCATION 0
#define configKERNEL_PROVIDED_STATIC_MEMORY 1    /* the idle task's stack and TCB: static arrays in tasks.c */
#define configAPPLICATION_ALLOCATED_HEAP 0

#define configUSE_TIMERS 0
#define configUSE_EVENT_GROUPS 0
#define configUSE_STREAM_BUFFERS 0
#define configUSE_CO_ROUTINES 0
#define configUSE_TASK_NOTIFICATIONS 1
#define configUSE_MUTEXES 0
#define configUSE_RECURSIVE_MUTEXES 0
#define configUSE_COUNTING_SEMAPHORES 0
#define configUSE_QUEUE_SETS 0
#define configUSE_APPLICATION_TASK_TAG 0
#define configUSE_POSIX_ERRNO 0

#ifndef configUSE_TICK_HOOK
#define configUSE_TICK_HOOK 0                    /* a board whose counter needs the tick sets it (cortex_m4) */
#endif
#define configUSE_IDLE_HOOK 1                    /* wait for an interrupt: an idle board costs QEMU no host CPU */
#define configUSE_MALLOC_FAILED_HOOK 0
#define configUSE_DAEMON_TASK_STARTUP_HOOK 0
#define configCHECK_FOR_STACK_OVERFLOW 2         /* checked at every switch: a task past its stack stops the board */
#define configGENERATE_RUN_TIME_STATS 0
#define configUSE_TRACE_FACILITY 0
#define configUSE_STATS_FORMATTING_FUNCTIONS 0

#define INCLUDE_vTaskPrioritySet 0
#define INCLUDE_uxTaskPriorityGet 1
#define INCLUDE_vTaskDelete 0
#define INCLUDE_vTaskSuspend 1
#define INCLUDE_xTaskDelayUntil 1
#define INCLUDE_vTaskDelay 1
#define INCLUDE_xTaskGetSchedulerState 1
#define INCLUDE_xTaskGetCurrentTaskHandle 1
#define INCLUDE_uxTaskGetStackHighWaterMark 1
#define INCLUDE_xTaskGetIdleTaskHandle 1
#define INCLUDE_eTaskGetState 0
#define INCLUDE_xTimerPendFunctionCall 0
#define INCLUDE_xTaskAbortDelay 0
#define INCLUDE_xTaskGetHandle 0
#define INCLUDE_xTaskResumeFromISR 0

/* A failed assertion or an overflowed stack stops the board with a message (boards/common/freertos/freertos.c). */
#ifndef __ASSEMBLER__
void rtos_assert_failed(const char *file, int line);
void rtos_switched_in(void);
#endif
#define configASSERT(x) do { if (!(x)) rtos_assert_failed(__FILE__, __LINE__); } while (0)
/* Counts the time slices between the two inference tasks (the two-context test's proof: freertos.c). */
#define traceTASK_SWITCHED_IN() rtos_switched_in()

#endif
