/* pool.h - the CPU backend's worker threads.
 *
 * pool_run(n, fn, ctx) calls fn(ctx, task, worker) for task = 0..n-1 across
 * the calling thread and the workers, and returns when all have run. Tasks
 * are claimed one at a time from a shared counter, so a worker the OS has
 * descheduled (a shared machine) cannot hold back work it has not claimed;
 * idle workers spin briefly and then sleep. Why not OpenMP: its end-of-region
 * barrier waits for every thread to arrive, and on an oversubscribed machine
 * each of the ~300 regions of a step then waited for a time slice (measured:
 * 10x slower decode under load). */
#ifndef RD_POOL_H
#define RD_POOL_H

#include <stdint.h>

#define POOL_MAX_THREADS 64

typedef void (*pool_fn)(void *ctx, int32_t task, int32_t worker);

/* Starts n_threads - 1 workers (the caller is worker 0). Idempotent; the
 * first call fixes the size. */
int pool_init(int n_threads);
/* Threads taking part (>= 1). */
int pool_size(void);
/* Safe from any thread: jobs of different callers run one after the other.
 * Called from inside a task, the inner job runs inline on that thread. */
void pool_run(int32_t n_tasks, pool_fn fn, void *ctx);
/* Runs fn(ctx) on the calling thread while no job runs (e.g. to resize
 * per-worker buffers that running tasks would read). */
void pool_serial(void (*fn)(void *ctx), void *ctx);

#endif
