/* The FreeRTOS kernel includes <stdlib.h> and, with static allocation only, uses nothing from it (string.h here). */
#ifndef COLIBRI_FREERTOS_STDLIB_H
#define COLIBRI_FREERTOS_STDLIB_H
#include <stddef.h>
#endif
