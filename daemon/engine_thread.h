/* engine_thread.h - the thread that owns the engine.
 *
 * loop -> engine: a command queue under a mutex + condvar (add a request,
 * abort one, stop). engine -> loop: finished samples and a stats snapshot
 * after every step, under the same mutex, announced with uv_async_send. The
 * engine thread never touches a socket; it sleeps on the condvar when it has
 * nothing to run. */
#ifndef RD_DAEMON_ENGINE_THREAD_H
#define RD_DAEMON_ENGINE_THREAD_H

#include <pthread.h>
#include <stdint.h>
#include <uv.h>

#include "daemon/u64map.h"
#include "engine/engine.h"

typedef enum { ET_ADD, ET_ABORT } et_kind;

typedef struct et_cmd {
    struct et_cmd *next;
    et_kind kind;
    uint64_t key;               /* daemon request key (the engine tag) */
    eng_request req;            /* ET_ADD; prompt and stop_ids are owned (freed after eng_add) */
} et_cmd;

/* A finished sample with the engine thread's timestamps. */
typedef struct et_done {
    struct et_done *next;
    eng_result r;               /* r.tag = key */
    uint64_t t_added_us;        /* monotonic µs when eng_add took the request */
    uint64_t t_finish_us;       /* when the step that finished it ended */
} et_done;

/* A request inside the engine (engine thread only). */
typedef struct {
    int64_t id;                 /* engine request id */
    uint64_t t_added_us;
    int32_t left;               /* samples not collected yet */
} et_live;

typedef struct {
    engine *eng;                /* owned by the thread while it runs */
    uv_thread_t thread;
    uv_async_t *wake;           /* the loop's async (results and stats ready) */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    et_cmd *cmds, *cmds_tail;   /* loop -> engine */
    et_done *done, *done_tail;  /* engine -> loop */
    eng_stats stats;            /* latest snapshot */
    uint32_t n_cmds;            /* commands not yet taken by the engine */
    int stop;
    int started;
    /* engine thread only */
    u64map live;                /* key -> et_live, while the engine has samples of it */
} et_thread;

int et_start(et_thread *t, engine *e, uv_async_t *wake);
/* Stops and joins the thread; unclaimed commands and results are freed. */
void et_stop(et_thread *t);

/* Queue commands (loop thread). et_add copies the prompt and stop ids. */
int et_add(et_thread *t, uint64_t key, const eng_request *r);
int et_abort(et_thread *t, uint64_t key);

/* Takes every finished sample (a list the caller frees with et_done_free) and
 * copies the latest stats. */
et_done *et_take(et_thread *t, eng_stats *stats);
void et_done_free(et_done *d);

uint64_t et_now_us(void);

#endif
