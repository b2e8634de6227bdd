/* The C library functions a freestanding compiler may emit calls to (struct copies, zeroing),
 * for boards without a C library. Built with -fno-tree-loop-distribute-patterns so these loops
 * are not themselves turned into calls to memcpy/memset. */
#include <stddef.h>
#include <stdint.h>

/* memcpy: a word at a time when both ends are word aligned (expert fetches copy whole 64-byte aligned blocks). */
typedef uintptr_t __attribute__((may_alias)) word;

void *memcpy(void *restrict dst, const void *restrict src, size_t n) {
    uint8_t *d = dst;
    const uint8_t *s = src;
    if ((((uintptr_t)d | (uintptr_t)s) & (sizeof(word) - 1)) == 0) {
        for (; n >= sizeof(word); n -= sizeof(word), d += sizeof(word), s += sizeof(word)) *(word *)d = *(const word *)s;
    }
    while (n--) *d++ = *s++;
    return dst;
}

void *memmove(void *dst, const void *src, size_t n) {
    uint8_t *d = dst;
    const uint8_t *s = src;
    if (d < s) {
        while (n--) *d++ = *s++;
    } else {
        while (n--) d[n] = s[n];
    }
    return dst;
}

/* A word at a time when dst is word aligned: the compiler zeroes structs and buffers with it in the forward pass. */
void *memset(void *dst, int c, size_t n) {
    uint8_t *d = dst;
    if (((uintptr_t)d & (sizeof(word) - 1)) == 0) {
        const word bytes = (word)(uint8_t)c * ((word)-1 / 0xFF); /* c in every byte */
        for (; n >= sizeof(word); n -= sizeof(word), d += sizeof(word)) *(word *)d = bytes;
    }
    while (n--) *d++ = (uint8_t)c;
    return dst;
}

int memcmp(const void *a, const void *b, size_t n) {
    const uint8_t *x = a, *y = b;
    for (; n--; x++, y++)
        if (*x != *y) return *x < *y ? -1 : 1;
    return 0;
}
