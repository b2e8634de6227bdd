/* What the hosted boards need from their operating system. main.c and pool.c are the same program on
 * Linux (os_posix.c, this folder) and on Windows (boards/hosted_windows/os_win32.c); everything that
 * differs between the two is behind these functions. A function that cannot do its job prints why
 * ("colibri-hosted: ...") and ends the process with exit status 2, so callers never check. */
#ifndef COLIBRI_HOSTED_OS_H
#define COLIBRI_HOSTED_OS_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

/* ---- the protocol's byte stream: stdin and stdout, binary ---- */
/* Up to n bytes from stdin; 0 at end of stream or on an error. */
size_t os_read_stdin(uint8_t *buf, size_t n);
/* All n bytes to stdout; ends the process (status 3) if the host went away. */
void os_write_stdout(const uint8_t *p, size_t n);

/* ---- the image file ---- */
/* Map the whole file read-only; *size is its length (> 0). With populate, its pages are made resident
 * before this returns (a verifying pass over them is then a pass over memory, not page faults). */
const uint8_t *os_map_image(const char *path, size_t *size, int populate);
/* Unmap what os_map_image mapped. */
void os_unmap_image(const uint8_t *image, size_t size);
/* The first n bytes of the file in private, read-only, page-aligned memory. */
const uint8_t *os_read_image(const char *path, size_t n);
/* Copy n bytes out of the mapped image; nonzero if the file shrank under the copy, so the fetch fails
 * and the board goes on (Linux: the SIGBUS is caught; Windows ends the board instead, see os_win32.c). */
int os_copy_from_image(void *dst, const uint8_t *src, size_t n);
/* Tell the OS a range of the mapping is about to be read (willneed) or is done with. Only a hint. */
void os_advise(const uint8_t *p, size_t n, int willneed);

/* ---- memory and time ---- */
/* n bytes of zeroed, page-aligned read-write memory; pages are made when first touched. */
void *os_alloc(size_t n);
/* A monotonic clock in ticks of os_clock_hz() (the board's cycle counter). */
uint64_t os_clock(void *user);
uint64_t os_clock_hz(void);

/* ---- threads, for pool.c ---- */
/* Start a thread running fn() forever. 0 on success. */
int os_thread_start(void (*fn)(void));
/* Sleep while *word == seen (returns at once if it already differs; may return early). */
void os_wait(_Atomic uint32_t *word, uint32_t seen);
/* Wake every thread sleeping in os_wait on word. */
void os_wake_all(_Atomic uint32_t *word);
/* A pause inside a spin loop. */
void os_relax(void);

#endif
