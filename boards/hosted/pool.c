/* The hosted board's threads, lent to the runtime through its parallel_for hook (the runtime itself
 * never creates one). threads - 1 workers wait for work; the calling thread works too. A call hands
 * out parts one at a time from a shared counter, so a part never runs twice and the call returns only
 * when every part has returned. Workers spin while work comes often (between the matrices of a token
 * it comes every few microseconds, and a sleep and wake would cost more than the wait) and sleep
 * (os_wait: a futex, or WaitOnAddress on Windows) once none has come for a while, so an idle board
 * (waiting for the host) burns no core. */
#include "pool.h"

#include <stdatomic.h>
#include <stdio.h>

#include "os.h"

/* About 100 microseconds of spinning before a worker sleeps. */
#define SPINS_BEFORE_SLEEP 20000

static struct {
    _Atomic uint32_t generation;      /* one per call: a worker's cue, and the word os_wait sleeps on */
    _Atomic uint64_t ticket;          /* generation << 32 | the next part to hand out */
    _Atomic uint32_t parts, parts_done, sleepers;
    void (*fn)(void *arg, uint32_t part);
    void *arg;
} pool;

/* Take parts of call `gen` until none is left. A worker that comes late (the call is over and another
 * has begun) finds another generation in the ticket and takes nothing. */
static void work(uint32_t gen) {
    uint64_t t = atomic_load(&pool.ticket);
    for (;;) {
        if ((uint32_t)(t >> 32) != gen || (uint32_t)t >= atomic_load(&pool.parts)) return;
        if (!atomic_compare_exchange_weak(&pool.ticket, &t, t + 1)) continue;
        pool.fn(pool.arg, (uint32_t)t);
        atomic_fetch_add(&pool.parts_done, 1);
        t = atomic_load(&pool.ticket);
    }
}

static void worker(void) {
    uint32_t seen = atomic_load(&pool.generation);
    for (;;) {
        uint32_t now;
        for (int spin = 0; (now = atomic_load(&pool.generation)) == seen; spin++) {
            if (spin < SPINS_BEFORE_SLEEP) {
                os_relax();
                continue;
            }
            atomic_fetch_add(&pool.sleepers, 1);
            os_wait(&pool.generation, seen); /* returns at once if the generation moved after the load above */
            atomic_fetch_sub(&pool.sleepers, 1);
            spin = 0;
        }
        seen = now;
        work(now);
    }
}

int pool_start(uint32_t threads) {
    for (uint32_t i = 1; i < threads; i++) {
        if (os_thread_start(worker) != 0) {
            fprintf(stderr, "colibri-hosted: cannot start thread %u of %u\n", i + 1, threads);
            return -1;
        }
    }
    return 0;
}

void pool_parallel_for(void (*fn)(void *arg, uint32_t part), void *arg, uint32_t parts) {
    const uint32_t gen = atomic_load(&pool.generation) + 1;
    pool.fn = fn;
    pool.arg = arg;
    atomic_store(&pool.parts, parts);
    atomic_store(&pool.parts_done, 0);
    atomic_store(&pool.ticket, (uint64_t)gen << 32); /* sequentially consistent: publishes fn and arg */
    atomic_store(&pool.generation, gen);
    if (atomic_load(&pool.sleepers)) os_wake_all(&pool.generation);
    work(gen);
    while (atomic_load(&pool.parts_done) < parts) os_relax();
}
