/* Colibri inside FreeRTOS tasks, the same on every board with an RTOS build (scons board=NAME rtos=freertos;
 * docs/RTOS.md). Every object is static: FreeRTOS allocates nothing here (configSUPPORT_DYNAMIC_ALLOCATION 0).
 *
 *   deadline   (highest) released every tick (1 kHz); records how late each release runs, by the board's counter
 *   fetch      a stand-in for a DMA engine: copies an expert block out of the image region when the inference
 *              task's fetch_start queues it, and wakes that task, which waits in fetch_wait; at the inference
 *              tasks' priority, so the copy runs beside the computation (time-sliced), never inside fetch_start
 *   link       the serial protocol (link_serve_elsewhere): reads frames (sleeping on the UART's receive
 *              interrupt), hands each request to the inference task and writes its answer
 *   inference  owns the link's context: runs link_execute() for every request (the runtime's calls)
 *   pair       a second context on the same image, after the first in the arena, at the inference task's priority:
 *              the two share the core by time slicing (the board's requests PAIR_START, PAIR_RESULT); it generates
 *              over and over until told to stop, each time the same bits
 *   idle       waits for an interrupt
 *   worker     with two cores (an SMP build: configNUMBER_OF_CORES 2), one on each, pinned: the runtime's parallel_for
 *              hands each its share of the parts; every other task above is pinned to the first core, where it keeps
 *              one core's semantics
 *
 * The runtime takes no lock and masks no interrupt; the only critical sections here are the kernel's own and the
 * fetch engine's claim of a transfer record (a few instructions). */
#include <stdint.h>

#include "FreeRTOS.h"
#include "queue.h"
#include "task.h"

#include "colibri.h"
#include "link.h"
#include "rtos.h"

void *memcpy(void *dst, const void *src, size_t n);

#ifndef STACK_LINK
#error "board.toml's [rtos.freertos.stacks] gives every task's stack in bytes (-DSTACK_LINK=... from the build)"
#endif
#define WORDS(bytes) ((bytes) / sizeof(StackType_t))

/* Priorities: above the inference tasks, everything that must answer promptly. The fetch task shares the inference
 * tasks' priority: above them, xQueueSend in fetch_start would switch to it at once and the copy would be done before
 * fetch_start returned (a synchronous copy in disguise); at their priority it waits for the core as a DMA engine
 * waits for the bus: it copies when the inference task sleeps in fetch_wait or when the tick gives it a time slice. */
enum {
    PRIO_INFERENCE = tskIDLE_PRIORITY + 2, /* the link's context, the pair's and the fetch engine, time-sliced */
    PRIO_FETCH = PRIO_INFERENCE,
    PRIO_WORKER = tskIDLE_PRIORITY + 3, /* above the contexts: a part waited for runs at once */
    PRIO_LINK = tskIDLE_PRIORITY + 4,
    PRIO_DEADLINE = configMAX_PRIORITIES - 1,
};

/* Task notification indices (configTASK_NOTIFICATION_ARRAY_ENTRIES). */
enum { NOTIFY_JOB = 0, NOTIFY_FETCH = 1, NOTIFY_RX = 2, NOTIFY_PAIR = 3, NOTIFY_WORK = 4 };

#if configNUMBER_OF_CORES > 1
#define CORE() ((uint32_t)portGET_CORE_ID())
#else
#define CORE() 0u
#endif

/* The board's own requests (link.h: BOARD_REQ_FIRST..LAST), answered with type | 0x80 (docs/RTOS.md). */
enum { REQ_RTOS_STATS = 0x70, REQ_PAIR_START = 0x71, REQ_PAIR_RESULT = 0x72 };
#define LINK_BAD_PAYLOAD 203u
#define LINK_NOT_OPEN 204u

static const board_io *board;

typedef struct {
    StaticTask_t tcb;
    TaskHandle_t handle;
    uint32_t stack_bytes;
} task_slot;

static StackType_t link_stack[WORDS(STACK_LINK)], inference_stack[WORDS(STACK_INFERENCE)],
    fetch_stack[WORDS(STACK_FETCH)], deadline_stack[WORDS(STACK_DEADLINE)], pair_stack[WORDS(STACK_PAIR)];
static task_slot link_t, inference_t, fetch_t, deadline_t, pair_t;

/* ---- faults ---- */
/* configASSERT: "colibri: FreeRTOS assertion failed at tasks.c:1234" (the file's name without its folders). */
void rtos_assert_failed(const char *file, int line) {
    static char msg[64];
    const char *name = file;
    for (const char *s = file; *s; s++)
        if (*s == '/' || *s == '\\') name = s + 1;
    uint32_t n = 0, digits = 1;
    while (*name && n < sizeof msg - 8) msg[n++] = *name++;
    msg[n++] = ':';
    for (int rest = line; rest >= 10 && digits < 6; rest /= 10) digits++;
    for (uint32_t d = digits; d--; line /= 10) msg[n + d] = (char)('0' + line % 10);
    msg[n + digits] = 0;
    board_fatal("FreeRTOS assertion failed at ", msg);
}

void vApplicationStackOverflowHook(TaskHandle_t task, char *name);
void vApplicationStackOverflowHook(TaskHandle_t task, char *name) {
    (void)task;
    board_fatal("stack overflow in task ", name);
}

/* The idle task waits for an interrupt, so an idle board costs QEMU no host time; RTOS_STATS can make it spin instead
 * (flag bit 1), for a deadline measurement under QEMU's -icount, whose virtual clock then follows instructions alone
 * (a sleeping QEMU follows the host's clock, and wakes late by the host's scheduling). */
static volatile uint8_t idle_spins;
static uint8_t deadline_held; /* suspended by RTOS_STATS (only the inference task runs its requests) */

void vApplicationIdleHook(void);
void vApplicationIdleHook(void) {
    if (!idle_spins) board_idle();
}

/* ---- the link task and the inference task ---- */
/* Time slices between the two contexts (the two-context test's proof): a switch straight from one inference task to
 * the other while both are computing, neither having blocked. `computing` is set while a task is inside its runtime
 * calls and cleared wherever it blocks there (fetch_wait's sleep, PAIR_RESULT's wait), so a switch because the
 * running one blocked is not counted; nor is one through a higher-priority task (the link task woken by the UART),
 * as the switch-in hook sees which task ran just before. FreeRTOS also rotates equal-priority tasks whenever a
 * higher-priority one blocks, time slicing or not (taskSELECT_HIGHEST_PRIORITY_TASK steps through the ready list), so
 * the test holds the 1 kHz deadline task meanwhile (RTOS_STATS flag bit 2): what is left to switch between the two
 * mid-computation is the tick's time slice, and with configUSE_TIME_SLICING 0 the count stays 0. */
static volatile uint8_t inference_computing, pair_computing;
static volatile uint32_t slices_to_pair, slices_to_inference;
static TaskHandle_t running[configNUMBER_OF_CORES]; /* on each core, the task that had it before this switch */

/* The kernel's traceTASK_SWITCHED_IN, inside the scheduler with the new task current. */
void rtos_switched_in(void) {
    const TaskHandle_t now = xTaskGetCurrentTaskHandle();
    if (inference_computing && pair_computing) {
        if (running[CORE()] == inference_t.handle && now == pair_t.handle) slices_to_pair++;
        if (running[CORE()] == pair_t.handle && now == inference_t.handle) slices_to_inference++;
    }
    running[CORE()] = now;
}

/* link_serve's execute hook, in the link task: the inference task runs the request; wait for it. */
static void execute_in_inference_task(void) {
    xTaskNotifyGiveIndexed(inference_t.handle, NOTIFY_JOB);
    ulTaskNotifyTakeIndexed(NOTIFY_JOB, pdTRUE, portMAX_DELAY);
}

static void inference_task(void *arg) {
    (void)arg;
    for (;;) {
        ulTaskNotifyTakeIndexed(NOTIFY_JOB, pdTRUE, portMAX_DELAY);
        inference_computing = 1;
        link_execute();
        inference_computing = 0;
        xTaskNotifyGiveIndexed(link_t.handle, NOTIFY_JOB);
    }
}

static void link_task(void *arg) {
    board_stop((uint32_t)link_serve_elsewhere((const board_io *)arg)); /* QUIT's code, as on the bare board */
}

/* Only the link task reads the UART. A notification given before it waits is kept, so none is lost. */
void rtos_wait_rx(void) { ulTaskNotifyTakeIndexed(NOTIFY_RX, pdTRUE, portMAX_DELAY); }

void rtos_rx_from_isr(void) {
    BaseType_t woken = pdFALSE;
    vTaskNotifyGiveIndexedFromISR(link_t.handle, NOTIFY_RX, &woken);
    portYIELD_FROM_ISR(woken);
}

/* ---- the fetch task: a DMA engine's stand-in ----
 * fetch_start claims a transfer record, queues its index and returns; the fetch task copies the block out of the
 * image region (the board's slow memory) and wakes the record's owner, which waits in fetch_wait. With every record
 * in flight (the runtime starts at most a layer's misses and guesses at once: far fewer), the copy is made at once.
 * The counters show the transfers were asynchronous: still pending when fetch_start returned, and waited for by a
 * fetch_wait that had to sleep. */
#define TRANSFERS 16u
enum { XFER_FREE, XFER_QUEUED, XFER_DONE };
typedef struct {
    const uint8_t *src;
    void *dst;
    size_t bytes;
    TaskHandle_t owner;
    volatile uint8_t state;
} transfer;
static transfer transfers[TRANSFERS];
static StaticQueue_t fetch_queue_tcb;
static uint8_t fetch_queue_storage[TRANSFERS];
static QueueHandle_t fetch_queue;
static volatile uint32_t transfers_queued, transfers_at_once; /* queued to the fetch task; copied in fetch_start */
static volatile uint32_t transfers_pending;                   /* not yet copied when fetch_start returned */
static volatile uint32_t fetch_waits, fetch_sleeps;           /* fetch_wait for a queued transfer; of those, slept */

static int fetch_start(uint64_t offset, size_t bytes, void *dst) {
    const uint8_t *image;
    size_t size;
    link_context(&image, &size, 0);
    if (!image || offset > size || bytes > size - offset) return 1;
    uint32_t i;
    taskENTER_CRITICAL();
    for (i = 0; i < TRANSFERS && transfers[i].state != XFER_FREE; i++) {}
    if (i < TRANSFERS) transfers[i].state = XFER_QUEUED;
    taskEXIT_CRITICAL();
    if (i == TRANSFERS) { /* every record in flight: copy now */
        transfers_at_once++;
        memcpy(dst, image + offset, bytes);
        return 0;
    }
    transfer *t = &transfers[i];
    t->src = image + offset;
    t->dst = dst;
    t->bytes = bytes;
    t->owner = xTaskGetCurrentTaskHandle();
    const uint8_t index = (uint8_t)i;
    transfers_queued++;
    xQueueSend(fetch_queue, &index, portMAX_DELAY);
    if (t->state != XFER_DONE) transfers_pending++;
    return 0;
}

static int fetch_wait(void *dst) {
    TaskHandle_t me = xTaskGetCurrentTaskHandle();
    for (uint32_t i = 0; i < TRANSFERS; i++) {
        transfer *t = &transfers[i];
        if (t->state == XFER_FREE || t->dst != dst || t->owner != me) continue;
        uint32_t slept = 0;
        while (t->state != XFER_DONE) {
            slept = 1;
            inference_computing = 0; /* only the link's context streams experts */
            ulTaskNotifyTakeIndexed(NOTIFY_FETCH, pdTRUE, portMAX_DELAY);
            inference_computing = 1;
        }
        fetch_waits++;
        fetch_sleeps += slept;
        t->state = XFER_FREE;
        return 0;
    }
    return 0; /* copied at once by fetch_start */
}

static void fetch_task(void *arg) {
    (void)arg;
    for (;;) {
        uint8_t i;
        if (xQueueReceive(fetch_queue, &i, portMAX_DELAY) != pdPASS) continue;
        transfer *t = &transfers[i];
        memcpy(t->dst, t->src, t->bytes);
        t->state = XFER_DONE;
        xTaskNotifyGiveIndexed(t->owner, NOTIFY_FETCH);
    }
}

/* ---- two cores: the runtime's parallel_for over a worker task on each ----
 * The link's context opens with this hook (board_io.parallel_for): the calling task hands the parts to the workers,
 * worker k taking parts k, k + cores, ..., and sleeps until each has said it is done. The runtime splits its work so
 * that no sum depends on the split: the bits are one core's. */
#if configNUMBER_OF_CORES > 1
static StackType_t worker_stack[configNUMBER_OF_CORES][WORDS(STACK_WORKER)];
static task_slot worker_t[configNUMBER_OF_CORES];
static struct {
    void (*fn)(void *arg, uint32_t part);
    void *arg;
    uint32_t parts;
    TaskHandle_t caller;
} job;
static volatile uint32_t parts_on_core[configNUMBER_OF_CORES], parallel_calls;

static void worker_task(void *arg) {
    const uint32_t me = (uint32_t)(uintptr_t)arg;
    for (;;) {
        ulTaskNotifyTakeIndexed(NOTIFY_JOB, pdTRUE, portMAX_DELAY);
        for (uint32_t part = me; part < job.parts; part += configNUMBER_OF_CORES) {
            job.fn(job.arg, part);
            parts_on_core[CORE()]++; /* a worker is pinned, so its own count: no other core writes it */
        }
        xTaskNotifyGiveIndexed(job.caller, NOTIFY_WORK);
    }
}

static void parallel_for(void (*fn)(void *arg, uint32_t part), void *arg, uint32_t parts) {
    job.fn = fn;
    job.arg = arg;
    job.parts = parts;
    job.caller = xTaskGetCurrentTaskHandle();
    parallel_calls++;
    for (uint32_t k = 0; k < configNUMBER_OF_CORES; k++) xTaskNotifyGiveIndexed(worker_t[k].handle, NOTIFY_JOB);
    for (uint32_t k = 0; k < configNUMBER_OF_CORES; k++) ulTaskNotifyTakeIndexed(NOTIFY_WORK, pdFALSE, portMAX_DELAY);
}

/* The second core's idle task waits for an interrupt too (its doorbell wakes it: the board's vInterruptCore). */
void vApplicationPassiveIdleHook(void);
void vApplicationPassiveIdleHook(void) { board_idle(); }
#endif

/* ---- the deadline task: a 1 kHz job beside inference ----
 * Released every tick by xTaskDelayUntil; each release reads the board's counter. Lateness is measured against the
 * first release of the window plus k periods of the counter: its spread (max - min) is the release jitter. */
typedef struct {
    uint64_t releases;
    int64_t late_min, late_max;
    uint64_t interval_min, interval_max;
} deadline_window;
static struct {
    volatile uint8_t restart;
    volatile uint32_t seq; /* odd while the task updates the window: a reader (lower priority) reads again */
    uint64_t anchor, previous;
    deadline_window w;
} deadline;

/* A consistent copy of the window (its 64-bit fields are two words each on a 32-bit core). */
static deadline_window deadline_read(void) {
    deadline_window w;
    uint32_t seq;
    do {
        seq = deadline.seq;
        __asm__ volatile("" ::: "memory");
        w = deadline.w;
        __asm__ volatile("" ::: "memory");
    } while ((seq & 1u) || seq != deadline.seq);
    return w;
}

static void deadline_task(void *arg) {
    (void)arg;
    const uint64_t period = (uint32_t)board->cycle_hz / configTICK_RATE_HZ; /* (no 64-bit division: no libgcc) */
    TickType_t wake = xTaskGetTickCount();
    deadline.restart = 1;
    for (;;) {
        xTaskDelayUntil(&wake, 1);
        const uint64_t now = board->cycles(0);
        deadline_window *w = &deadline.w;
        deadline.seq++;
        __asm__ volatile("" ::: "memory");
        if (deadline.restart) {
            deadline.restart = 0;
            deadline.anchor = now;
            wake = xTaskGetTickCount(); /* after being held: from now, not a burst of the releases it missed */
            *w = (deadline_window){ .interval_min = UINT64_MAX };
        } else {
            w->releases++;
            const int64_t late = (int64_t)(now - deadline.anchor - w->releases * period);
            if (late < w->late_min) w->late_min = late;
            if (late > w->late_max) w->late_max = late;
            const uint64_t interval = now - deadline.previous;
            if (interval < w->interval_min) w->interval_min = interval;
            if (interval > w->interval_max) w->interval_max = interval;
        }
        __asm__ volatile("" ::: "memory");
        deadline.seq++;
        deadline.previous = now;
    }
}

/* ---- the pair: a second context, in its own task ----
 * It generates, then generates again from a reset context until PAIR_RESULT asks it to stop: it computes for as long
 * as the link's own generation goes on, however late the host's requests come, and every repetition must give the
 * first one's bits. */
#define PAIR_MAX 64u
static struct {
    uint32_t n_prompt, n_new, n_rows;
    uint32_t tokens[PAIR_MAX]; /* the prompt, then the tokens the first generation chose */
    uint32_t crcs[PAIR_MAX];   /* colibri_crc32 of the logits after each fed token */
    uint32_t again_tokens[PAIR_MAX], again_crcs[PAIR_MAX]; /* a repetition's */
    uint32_t status, runs, differing; /* generations made; of the later ones, those unlike the first */
    uint64_t cycles;                  /* the first generation's */
    volatile uint8_t running, stop, done;
    TaskHandle_t volatile waiter; /* set by PAIR_RESULT in the inference task, read by the pair task */
    const uint8_t *image;
    size_t image_size;
    uint8_t *arena;
    size_t arena_size;
} pair;

static uint32_t pair_row(colibri_ctx *ctx) {
    const float *logits;
    uint32_t vocab;
    if (colibri_logits(ctx, &logits, &vocab) != COLIBRI_OK) return 0;
    return colibri_crc32(0, logits, (size_t)vocab * sizeof(float));
}

/* The prompt (tokens[0..n_prompt)) a token at a time, then n_new greedy steps into tokens[n_prompt..]: every row's
 * logits' CRC into crcs. */
static colibri_status pair_generate(colibri_ctx *ctx, uint32_t *tokens, uint32_t *crcs) {
    colibri_status st;
    uint32_t rows = 0;
    for (uint32_t i = 0; i < pair.n_prompt; i++) {
        if ((st = colibri_feed(ctx, &tokens[i], 1))) return st;
        crcs[rows++] = pair_row(ctx);
    }
    colibri_sampler greedy;
    colibri_sampler_init(&greedy, 0.0f, 0, 1.0f, 0);
    for (uint32_t k = 0; k < pair.n_new; k++) {
        if ((st = colibri_step(ctx, &greedy, &tokens[pair.n_prompt + k]))) return st;
        crcs[rows++] = pair_row(ctx);
    }
    return COLIBRI_OK;
}

static colibri_status pair_run(void) {
    colibri_options opts = { .size = sizeof(colibri_options), .cycles = board->cycles };
    colibri_ctx *ctx = 0;
    uint64_t needed = 0;
    colibri_status st = colibri_open(pair.image, pair.image_size, pair.arena, pair.arena_size, &opts, &ctx, &needed);
    if (st) return st;
    const uint64_t t0 = board->cycles(0);
    if ((st = pair_generate(ctx, pair.tokens, pair.crcs))) return st;
    pair.cycles = board->cycles(0) - t0;
    pair.n_rows = pair.n_prompt + pair.n_new;
    pair.runs = 1;
    while (!pair.stop) {
        if ((st = colibri_reset(ctx))) return st;
        for (uint32_t i = 0; i < pair.n_prompt; i++) pair.again_tokens[i] = pair.tokens[i];
        if ((st = pair_generate(ctx, pair.again_tokens, pair.again_crcs))) return st;
        pair.runs++;
        uint32_t same = 1;
        for (uint32_t i = 0; i < pair.n_rows; i++)
            same &= pair.again_tokens[i] == pair.tokens[i] && pair.again_crcs[i] == pair.crcs[i];
        pair.differing += !same;
    }
    return COLIBRI_OK;
}

static void pair_task(void *arg) {
    (void)arg;
    for (;;) {
        ulTaskNotifyTakeIndexed(NOTIFY_JOB, pdTRUE, portMAX_DELAY);
        pair_computing = 1;
        pair.status = pair_run();
        pair_computing = 0;
        pair.running = 0;
        pair.done = 1;
        if (pair.waiter) xTaskNotifyGiveIndexed(pair.waiter, NOTIFY_PAIR);
    }
}

/* ---- the board's requests ---- */
static void put32(uint8_t *p, uint32_t v) { for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i)); }
static void put64(uint8_t *p, uint64_t v) { put32(p, (uint32_t)v); put32(p + 4, (uint32_t)(v >> 32)); }
static uint32_t get32(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

/* RTOS_STATS [u32 flags: bit 0 restarts the deadline window, bit 1 makes the idle task spin rather than wait for an
 * interrupt, bit 2 holds the deadline task (vTaskSuspend; these two until a RTOS_STATS without them)] -> u32 tick Hz,
 * u32 counter ticks a period, the named counters (u32 n, then n of char[16] name, u64 value: a host reads the ones it
 * knows by name) and every task's stack. */
static uint8_t *put_name(uint8_t *p, const char *name) {
    uint32_t c = 0;
    for (const char *s = name; *s && c < 15; s++) p[c++] = (uint8_t)*s;
    while (c < 16) p[c++] = 0;
    return p + 16;
}

static uint8_t *put_counter(uint8_t *p, const char *name, uint64_t value) {
    p = put_name(p, name);
    put64(p, value);
    return p + 8;
}

static uint32_t rtos_stats(const uint8_t *in, uint32_t len, uint8_t *out, uint32_t *out_len) {
    if (len != 0 && len != 4) return LINK_BAD_PAYLOAD;
    put32(out, configTICK_RATE_HZ);
    put32(out + 4, (uint32_t)board->cycle_hz / configTICK_RATE_HZ);
    const deadline_window w = deadline_read();
    uint8_t *p = out + 12; /* the counters, a name and a value each (written in turn: no table on the stack) */
    p = put_counter(p, "releases", w.releases); /* of the deadline task in the window */
    p = put_counter(p, "late_min", (uint64_t)w.late_min); /* counter ticks, signed */
    p = put_counter(p, "late_max", (uint64_t)w.late_max);
    p = put_counter(p, "interval_min", w.releases ? w.interval_min : 0);
    p = put_counter(p, "interval_max", w.interval_max);
    p = put_counter(p, "slices_to_pair", slices_to_pair); /* time slices between the contexts, mid-computation */
    p = put_counter(p, "slices_to_inf", slices_to_inference);
    p = put_counter(p, "xfer_queued", transfers_queued);   /* expert blocks the fetch task copied */
    p = put_counter(p, "xfer_at_once", transfers_at_once); /* copied in fetch_start: every record in flight */
    p = put_counter(p, "xfer_pending", transfers_pending); /* not yet copied when fetch_start returned */
    p = put_counter(p, "fetch_waits", fetch_waits);        /* fetch_wait calls for a queued transfer */
    p = put_counter(p, "fetch_sleeps", fetch_sleeps);      /* of those, the ones that slept until it was copied */
    p = put_counter(p, "cores", configNUMBER_OF_CORES);
#if configNUMBER_OF_CORES > 1
    p = put_counter(p, "parallel_calls", parallel_calls);  /* the runtime's parallel_for */
    p = put_counter(p, "parts_core0", parts_on_core[0]);   /* the parts the workers ran on each core */
    p = put_counter(p, "parts_core1", parts_on_core[1]);
#endif
    put32(out + 8, (uint32_t)(p - (out + 12)) / 24u);
    const struct { const char *name; TaskHandle_t handle; uint32_t bytes; } tasks[] = {
        { "link", link_t.handle, link_t.stack_bytes },
        { "inference", inference_t.handle, inference_t.stack_bytes },
        { "fetch", fetch_t.handle, fetch_t.stack_bytes },
        { "deadline", deadline_t.handle, deadline_t.stack_bytes },
        { "pair", pair_t.handle, pair_t.stack_bytes },
#if configNUMBER_OF_CORES > 1
        { "idle", xTaskGetIdleTaskHandleForCore(0), configMINIMAL_STACK_SIZE * sizeof(StackType_t) },
#else
        { "idle", xTaskGetIdleTaskHandle(), configMINIMAL_STACK_SIZE * sizeof(StackType_t) },
#endif
#if configNUMBER_OF_CORES > 1
        { "worker0", worker_t[0].handle, worker_t[0].stack_bytes },
        { "worker1", worker_t[1].handle, worker_t[1].stack_bytes },
#endif
    };
    const uint32_t n = sizeof tasks / sizeof tasks[0];
    put32(p, n + 1);
    p += 4;
    for (uint32_t i = 0; i < n; i++, p += 12) { /* char name[16], u32 stack bytes, u32 most used, u32 priority */
        p = put_name(p, tasks[i].name);
        const uint32_t unused = (uint32_t)uxTaskGetStackHighWaterMark(tasks[i].handle) * sizeof(StackType_t);
        put32(p, tasks[i].bytes);
        put32(p + 4, tasks[i].bytes - unused);
        put32(p + 8, (uint32_t)uxTaskPriorityGet(tasks[i].handle));
    }
    uint32_t irq_bytes, irq_used; /* and the interrupt handlers' stack, as a task of no priority */
    board_interrupt_stack(&irq_bytes, &irq_used);
    p = put_name(p, "interrupts");
    put32(p, irq_bytes);
    put32(p + 4, irq_used);
    put32(p + 8, 0);
    p += 12;
    *out_len = (uint32_t)(p - out);
    if (len == 4) {
        const uint32_t flags = get32(in);
        idle_spins = (flags & 2u) != 0;
        if (flags & 1u) deadline.restart = 1;
        if ((flags & 4u) && !deadline_held) vTaskSuspend(deadline_t.handle);
        if (!(flags & 4u) && deadline_held) {
            deadline.restart = 1;
            vTaskResume(deadline_t.handle);
        }
        deadline_held = (flags & 4u) != 0;
    }
    return 0;
}

/* PAIR_START u32 new tokens, u32 prompt tokens, u32 prompt[]: open a second context on the link's image, after the
 * link's open context in the arena, and generate greedily in the pair task, at the inference task's priority. */
static uint32_t pair_start(const uint8_t *in, uint32_t len, uint8_t *out, uint32_t *out_len, uint64_t *detail) {
    if (len < 8) return LINK_BAD_PAYLOAD;
    const uint32_t n_new = get32(in), n_prompt = get32(in + 4);
    if (n_prompt == 0 || n_prompt > PAIR_MAX || n_new > PAIR_MAX - n_prompt || len != 8 + 4 * n_prompt) {
        *detail = PAIR_MAX;
        return LINK_BAD_PAYLOAD;
    }
    if (pair.running) return LINK_BAD_PAYLOAD;
    uint64_t used;
    link_context(&pair.image, &pair.image_size, &used);
    if (!used) return LINK_NOT_OPEN; /* the link's context is open first: the pair's arena follows it */
    used = (used + COLIBRI_ARENA_ALIGN - 1) & ~(uint64_t)(COLIBRI_ARENA_ALIGN - 1);
    if (used >= board->arena_size) return COLIBRI_E_ARENA_TOO_SMALL;
    pair.arena = (uint8_t *)board->arena + used;
    pair.arena_size = board->arena_size - (size_t)used;
    pair.n_prompt = n_prompt;
    pair.n_new = n_new;
    pair.n_rows = pair.runs = pair.differing = 0;
    pair.cycles = 0;
    for (uint32_t i = 0; i < n_prompt; i++) pair.tokens[i] = get32(in + 8 + 4 * i);
    pair.done = pair.stop = 0;
    pair.running = 1;
    xTaskNotifyGiveIndexed(pair_t.handle, NOTIFY_JOB);
    put64(out, (uint64_t)(pair.arena - (uint8_t *)board->arena));
    *out_len = 8;
    return 0;
}

/* PAIR_RESULT: stop the pair after its current generation and wait for it, then u32 status, u32 rows, u64 cycles (the
 * first generation's), u32 generations, u32 of them unlike the first, u32 tokens[prompt + new], u32 crcs[rows] (the
 * first generation's). */
static uint32_t pair_result(uint8_t *out, uint32_t *out_len) {
    if (!pair.running && !pair.done) return LINK_NOT_OPEN;
    pair.waiter = xTaskGetCurrentTaskHandle();
    pair.stop = 1;
    inference_computing = 0; /* it blocks here: switching to the pair now is no time slice */
    while (!pair.done) ulTaskNotifyTakeIndexed(NOTIFY_PAIR, pdTRUE, portMAX_DELAY);
    inference_computing = 1;
    pair.waiter = 0;
    put32(out, pair.status);
    put32(out + 4, pair.n_rows);
    put64(out + 8, pair.cycles);
    put32(out + 16, pair.runs);
    put32(out + 20, pair.differing);
    uint8_t *p = out + 24;
    for (uint32_t i = 0; i < pair.n_prompt + pair.n_new; i++, p += 4) put32(p, pair.tokens[i]);
    for (uint32_t i = 0; i < pair.n_rows; i++, p += 4) put32(p, pair.crcs[i]);
    *out_len = (uint32_t)(p - out);
    return 0;
}

/* The link's OPEN and uploads while the pair runs: the pair reads the link's image, and its arena follows the link's
 * context's (an OPEN with another cache would move that boundary under it). */
static int busy(uint8_t type) {
    return pair.running && (type == 0x02u /* OPEN */ || (type >= 0x06u && type <= 0x08u) /* UPLOAD_* */);
}

static uint32_t board_request(uint8_t type, const uint8_t *in, uint32_t len, uint8_t *out, uint32_t *out_len,
                              uint64_t *detail) {
    switch (type) {
    case REQ_RTOS_STATS: return rtos_stats(in, len, out, out_len);
    case REQ_PAIR_START: return pair_start(in, len, out, out_len, detail);
    case REQ_PAIR_RESULT: return len ? LINK_BAD_PAYLOAD : pair_result(out, out_len);
    default: *detail = type; return 202u; /* LINK_UNKNOWN_TYPE */
    }
}

/* ---- start ---- */
static TaskHandle_t create(task_slot *t, TaskFunction_t fn, const char *name, StackType_t *stack, uint32_t bytes,
                           UBaseType_t prio, void *arg) {
    t->stack_bytes = bytes;
    t->handle = xTaskCreateStatic(fn, name, (configSTACK_DEPTH_TYPE)WORDS(bytes), arg, prio, stack, &t->tcb);
    return t->handle;
}

/* Every task but the workers on the first core (an SMP build): there they keep one core's semantics. */
static void pin(TaskHandle_t task, uint32_t core) {
#if configNUMBER_OF_CORES > 1
    vTaskCoreAffinitySet(task, (UBaseType_t)1 << core);
#else
    (void)task;
    (void)core;
#endif
}

_Noreturn void rtos_start(board_io *io) {
    io->execute = execute_in_inference_task;
    io->request = board_request;
    io->busy = busy;
    io->fetch_start = fetch_start;
    io->fetch_wait = fetch_wait;
#if configNUMBER_OF_CORES > 1
    io->parallel_for = parallel_for;
    io->parallel_parts = configNUMBER_OF_CORES;
#endif
    board = io;
    fetch_queue = xQueueCreateStatic(TRANSFERS, 1, fetch_queue_storage, &fetch_queue_tcb);
    pin(create(&deadline_t, deadline_task, "deadline", deadline_stack, STACK_DEADLINE, PRIO_DEADLINE, 0), 0);
    pin(create(&fetch_t, fetch_task, "fetch", fetch_stack, STACK_FETCH, PRIO_FETCH, 0), 0);
    pin(create(&link_t, link_task, "link", link_stack, STACK_LINK, PRIO_LINK, io), 0);
    pin(create(&inference_t, inference_task, "inference", inference_stack, STACK_INFERENCE, PRIO_INFERENCE, 0), 0);
    pin(create(&pair_t, pair_task, "pair", pair_stack, STACK_PAIR, PRIO_INFERENCE, 0), 0);
#if configNUMBER_OF_CORES > 1
    for (uint32_t k = 0; k < configNUMBER_OF_CORES; k++)
        pin(create(&worker_t[k], worker_task, k ? "worker1" : "worker0", worker_stack[k], STACK_WORKER, PRIO_WORKER,
                   (void *)(uintptr_t)k), k);
#endif
    vTaskStartScheduler();
    board_fatal("the scheduler did not start", "");
}
