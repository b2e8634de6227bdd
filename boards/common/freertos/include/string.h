/* What the FreeRTOS kernel takes from <string.h>, for boards with no C library (riscv64-unknown-elf has none in
 * Debian): the kernel is compiled with this folder first on its include path, so it can reach nothing else of a C
 * library; boards/common/rt.c defines these. */
#ifndef COLIBRI_FREERTOS_STRING_H
#define COLIBRI_FREERTOS_STRING_H
#include <stddef.h>
void *memcpy(void *dst, const void *src, size_t n);
void *memset(void *dst, int c, size_t n);
void *memmove(void *dst, const void *src, size_t n);
int memcmp(const void *a, const void *b, size_t n);
#endif
