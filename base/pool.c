/* pool.c - see pool.h.
 *
 * One job at a time. `claim` packs (generation << 32 | next task): a worker
 * claims a task with a CAS that also proves the job is still the one it saw.
 * Publishing a job first closes the claim under the new generation (task
 * CLOSED, never claimable), then writes fn/ctx/n_tasks, then opens it at task
 * 0: a late worker of the previous job can no longer claim anything while the
 * fields change, and fn/ctx are read only after a successful claim, when the
 * job cannot move on until that task is done.
 *
 * Callers: the engine thread runs its step's jobs, and a weight update's
 * build (a libuv worker) runs its repacking on the same threads. `run_mu`
 * makes the jobs of different callers take turns, so one job at a time
 * still holds; a task that calls pool_run runs its inner job inline (it
 * already holds the pool, and waiting for itself would deadlock). */
#include "base/pool.h"

#include <immintrin.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>

#include "base/err.h"

static struct {
    int n;                              /* threads incl. the caller */
    pthread_t tid[POOL_MAX_THREADS];
    pthread_mutex_t mu;
    pthread_cond_t cv;
    _Atomic uint64_t claim;             /* generation << 32 | next task */
    _Atomic int32_t done;               /* tasks finished in this generation */
    pool_fn fn;                         /* stable while any task of the job is claimed */
    void *ctx;
    _Atomic uint32_t n_tasks;
} P = {.n = 0, .mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER};

static pthread_mutex_t init_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_mutex_t run_mu = PTHREAD_MUTEX_INITIALIZER;   /* held by the caller whose job runs */
static _Thread_local int in_pool;   /* 1 on a worker, and on a caller while it holds run_mu */

#define CLOSED 0xffffffffu

/* Runs tasks of generation gen until none are left; returns how many ran. */
static int32_t drain(uint32_t gen, int32_t worker)
{
    int32_t ran = 0;
    for (;;) {
        uint64_t v = atomic_load_explicit(&P.claim, memory_order_acquire);
        if ((uint32_t)(v >> 32) != gen)
            break;
        uint32_t idx = (uint32_t)v;
        if (idx == CLOSED) { /* the job is being published: it opens in a moment */
            _mm_pause();
            continue;
        }
        if (idx >= atomic_load_explicit(&P.n_tasks, memory_order_relaxed))
            break;
        if (!atomic_compare_exchange_weak_explicit(&P.claim, &v, v + 1, memory_order_acq_rel,
                                                   memory_order_acquire))
            continue;
        P.fn(P.ctx, (int32_t)idx, worker);
        atomic_fetch_add_explicit(&P.done, 1, memory_order_release);
        ran++;
    }
    return ran;
}

static void *worker_main(void *arg)
{
    int32_t me = (int32_t)(intptr_t)arg;
    uint32_t seen = 0;
    in_pool = 1;
    for (;;) {
        uint32_t gen = seen;
        /* Spin a little: the next job of a step usually follows within microseconds. */
        for (int i = 0; i < 4000; i++) {
            gen = (uint32_t)(atomic_load_explicit(&P.claim, memory_order_acquire) >> 32);
            if (gen != seen)
                break;
            _mm_pause();
        }
        if (gen == seen) {
            pthread_mutex_lock(&P.mu);
            while ((gen = (uint32_t)(atomic_load(&P.claim) >> 32)) == seen)
                pthread_cond_wait(&P.cv, &P.mu);
            pthread_mutex_unlock(&P.mu);
        }
        seen = gen;
        drain(gen, me);
    }
    return NULL;
}

int pool_init(int n_threads)
{
    pthread_mutex_lock(&init_mu);
    if (P.n == 0) {
        if (n_threads < 1)
            n_threads = 1;
        if (n_threads > POOL_MAX_THREADS)
            n_threads = POOL_MAX_THREADS;
        P.n = 1;
        for (int i = 1; i < n_threads; i++) {
            pthread_attr_t at;
            pthread_attr_init(&at);
            pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
            int rc = pthread_create(&P.tid[i], &at, worker_main, (void *)(intptr_t)i);
            pthread_attr_destroy(&at);
            if (rc)
                break;
            P.n++;
        }
    }
    pthread_mutex_unlock(&init_mu);
    return 0;
}

int pool_size(void) { return P.n > 0 ? P.n : 1; }

void pool_run(int32_t n_tasks, pool_fn fn, void *ctx)
{
    if (n_tasks <= 0)
        return;
    if (in_pool) {              /* nested: this thread already holds the pool */
        for (int32_t t = 0; t < n_tasks; t++)
            fn(ctx, t, 0);
        return;
    }
    pthread_mutex_lock(&run_mu);
    in_pool = 1;
    if (P.n <= 1 || n_tasks == 1) {
        /* Inline, but still under run_mu: the task may use worker 0's
         * buffers, which another caller's job would use too. */
        for (int32_t t = 0; t < n_tasks; t++)
            fn(ctx, t, 0);
        in_pool = 0;
        pthread_mutex_unlock(&run_mu);
        return;
    }
    /* The previous job is complete (we waited for it): close, fill, open. */
    uint64_t gen = (uint32_t)((atomic_load(&P.claim) >> 32) + 1);
    atomic_store_explicit(&P.claim, (gen << 32) | CLOSED, memory_order_seq_cst);
    P.fn = fn;
    P.ctx = ctx;
    atomic_store_explicit(&P.n_tasks, (uint32_t)n_tasks, memory_order_relaxed);
    atomic_store_explicit(&P.done, 0, memory_order_relaxed);
    pthread_mutex_lock(&P.mu);
    atomic_store_explicit(&P.claim, gen << 32, memory_order_release);
    pthread_cond_broadcast(&P.cv);
    pthread_mutex_unlock(&P.mu);

    drain((uint32_t)gen, 0);
    for (int spins = 0; atomic_load_explicit(&P.done, memory_order_acquire) < n_tasks; spins++) {
        if (spins < 20000)
            _mm_pause();
        else
            sched_yield(); /* a worker holding a task was descheduled */
    }
    in_pool = 0;
    pthread_mutex_unlock(&run_mu);
}

typedef struct {
    void (*fn)(void *ctx);
    void *ctx;
} serial_job;

static void serial_task(void *ctx, int32_t t, int32_t worker)
{
    serial_job *j = ctx;
    j->fn(j->ctx);
}

void pool_serial(void (*fn)(void *ctx), void *ctx)
{
    serial_job j = {fn, ctx};
    pool_run(1, serial_task, &j);
}
