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
    /* For link_serve_elsewhere() (an RTOS board: docs/RTOS.md): called for every request but QUIT, it must see that
     * link_execute() is called (in the task that owns the runtime's context) and return when it has returned. */
    void (*execute)(void);
    /* A board's own requests, types BOARD_REQ_FIRST..BOARD_REQ_LAST (NULL: none; such a type is then unknown, as
     * on every other board). Build the answer's payload in `answer` (MAX_PAYLOAD bytes), set *answer_len and return
     * 0: the answer goes out as type | 0x80. Or return an error code (a link error or a colibri_status) with
     * *detail. */
    uint32_t (*request)(uint8_t type, const uint8_t *payload, uint32_t len, uint8_t *answer, uint32_t *answer_len,
                        uint64_t *detail);
    /* May be NULL. Non-zero: the board cannot run a request of this type now, and it is answered LINK_BUSY (an RTOS
     * build's OPEN or upload while its second context reads the link's image and arena). */
    int (*busy)(uint8_t type);
} board_io;

#define BOARD_REQ_FIRST 0x70u
#define BOARD_REQ_LAST 0x7Fu

/* Serve requests; returns the exit code QUIT asked for, or 0 at end of stream. */
int link_serve(const board_io *io);

/* The same, each request run through io->execute (in another task) rather than here: the caller's stack never holds
 * the runtime's frames. */
int link_serve_elsewhere(const board_io *io);

/* Run the request link_serve_elsewhere() has received (answering it), in the task io->execute hands it to, while
 * link_serve_elsewhere() waits. */
void link_execute(void);

/* The image the link opens (the preloaded one or the last upload) and the arena its open context uses (0 when none
 * is open; arena_used may be NULL): where a board's fetch hook copies from, and where it may open a second context on
 * the same image, after the first in the arena. */
void link_context(const uint8_t **image, size_t *image_size, uint64_t *arena_used);

#endif
