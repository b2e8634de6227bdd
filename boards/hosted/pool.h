/* The hosted board's thread pool: the runtime's parallel_for hook (colibri.h). */
#ifndef COLIBRI_HOSTED_POOL_H
#define COLIBRI_HOSTED_POOL_H

#include <stdint.h>

/* Start threads - 1 workers (the caller of pool_parallel_for is the last thread). 0 on success. */
int pool_start(uint32_t threads);

/* Run fn(arg, part) for every part in [0, parts) on the pool and the calling thread; return when all have. */
void pool_parallel_for(void (*fn)(void *arg, uint32_t part), void *arg, uint32_t parts);

#endif
