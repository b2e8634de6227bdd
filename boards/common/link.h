/* The device side of the serial protocol (docs/PROTOCOL.md), shared by every board.
 * A board fills a board_io with its byte stream, cycle counter, image and arena, then calls
 * link_serve(), which answers requests until QUIT or the end of the stream. */
#ifndef COLIBRI_LINK_H
#define COLIBRI_LINK_H

#include <stddef.h>
#include <stdint.h>

typedef struct {
    const char *board;                          /* name reported in INFO */
    int (*read_byte)(void);                     /* blocking; negative at end of stream */
    void (*write)(const uint8_t *p, size_t n);  /* blocking, writes all n bytes */
    uint64_t (*cycles)(void *user);             /* may be NULL */
    uint64_t cycle_hz;                          /* counter frequency, 0 if unknown */
    const uint8_t *image;                       /* a preloaded image (64-byte aligned), or NULL */
    size_t image_size;
    uint8_t *upload;                            /* RAM for an image uploaded over the link, or NULL */
    size_t upload_capacity;
    void *arena;                                /* COLIBRI_ARENA_ALIGN aligned */
    size_t arena_size;
    /* Expert streaming (OPEN with an expert cache): how the runtime reaches the expert part. NULL:
     * copy from the image region above (bounds-checked), which then stands in for slow memory.
     * fetch_start/fetch_wait may be NULL (no asynchronous transfers). All return 0 on success. */
    int (*fetch)(uint64_t offset, size_t bytes, void *dst);
    int (*fetch_start)(uint64_t offset, size_t bytes, void *dst);
    int (*fetch_wait)(void *dst);
    /* Cores lent to the runtime (colibri_options.parallel_for): run fn for every part in [0, parts)
     * and return when all have. NULL, or parallel_parts <= 1: one core, as on bare metal. */
    void (*parallel_for)(void (*fn)(void *arg, uint32_t part), void *arg, uint32_t parts);
    uint32_t parallel_parts;
    /* Prompt tokens computed in one pass (colibri_options.prefill_batch) when OPEN asks for no expert
     * cache: at most this many, as many as the arena has room for. 0: one token a pass. */
    uint32_t prefill_batch;
} board_io;

/* Serve requests; returns the exit code QUIT asked for, or 0 at end of stream. */
int link_serve(const board_io *io);

#endif
