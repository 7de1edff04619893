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

#include "base/u64map.h"
#include "engine/model/loader.h"
#include "engine/serve/engine.h"
#include "engine/update/staging.h"

typedef enum { ET_ADD, ET_ABORT, ET_SWAP, ET_PAUSE, ET_FLUSH, ET_MEMORY, ET_LORA } et_kind;

/* LoRA adapters (et_lora): load a PEFT folder under a name, or unload one. */
#define ET_LORA_LOAD 1
#define ET_LORA_UNLOAD 2

/* Memory release / resume (et_memory): what, and which parts. */
#define ET_MEM_RELEASE 1
#define ET_MEM_RESUME 2
#define ET_MEM_WEIGHTS 1
#define ET_MEM_KV 2

/* A weight swap the engine thread performs at a step boundary (PROTOCOL.md §10.6). */
typedef struct {
    int active;
    upd_patch *patch;           /* new weights; after the swap, the old ones */
    model *m;                   /* the engine's model (written only between steps) */
    uint64_t version;
    upd_mode mode;              /* when in-flight sequences meet the new weights */
} et_swap;

/* What the loop learns once the swap happened. */
typedef struct {
    uint64_t version;
    uint64_t t_applied_us;      /* monotonic µs when the new weights were in */
    uint64_t stall_us;          /* the engine thread spent this long swapping instead of stepping */
    int32_t n_aborted;          /* samples ended by an abort-mode swap */
    upd_patch *old;             /* the replaced buffers, for the loop to free off-thread */
} et_swapped;

typedef struct et_cmd {
    struct et_cmd *next;
    et_kind kind;
    uint64_t key;               /* daemon request key (the engine tag) */
    eng_request req;            /* ET_ADD; prompt and stop_ids are owned (freed after eng_add) */
    et_swap swap;               /* ET_SWAP */
    int pause;                  /* ET_PAUSE: 1 freeze every sequence, 0 go on, 2 retract then freeze */
    int mem_op, mem_tags;       /* ET_MEMORY: ET_MEM_RELEASE / RESUME, ET_MEM_WEIGHTS | ET_MEM_KV */
    rd_loaded *L;               /* ET_MEMORY: the daemon's model (its backend, its open file) */
    char *path;                 /* ET_MEMORY resume of weights: the file to read them from (owned) */
    int same_file;              /* path is the file L was loaded from */
    int lora_op;                /* ET_LORA: ET_LORA_LOAD (path = the PEFT folder) or ET_LORA_UNLOAD */
    char *lora_name;            /* ET_LORA: the adapter's name (owned) */
    uint64_t lora_version;      /* ET_LORA load: the version it serves as */
    int lora_replace;           /* ET_LORA load: a resident adapter of that name is replaced (else refused) */
    lora_adapter *lora_built;   /* ET_LORA load of a pushed adapter (et_lora_put): loaded already (owned) */
} et_cmd;

/* A finished sample with the engine thread's timestamps; or the progress of
 * a streaming one (r.partial); or (flush set) a prefix-cache flush done. */
typedef struct et_done {
    struct et_done *next;
    eng_result r;               /* r.tag = key */
    int flush;                  /* 1: the answer to et_flush_cache(key); only r.tag is set */
    int32_t n_flushed;          /* flush: prefix-cache entries dropped */
    int mem;                    /* 1: the answer to et_memory(key); r.tag is set */
    int mem_rc;                 /* mem: 0 or the error code */
    int mem_tags;               /* mem: the parts released (or resumed) */
    char mem_msg[400];          /* mem: why not, when mem_rc */
    int lora;                   /* 1: the answer to et_lora(key); r.tag is set, mem_rc and mem_msg say how it went */
    int32_t lora_rank;          /* lora load: the adapter's rank */
    int64_t lora_bytes;         /* lora load: the backend's bytes for it */
    char lora_evicted[LORA_NAME_MAX]; /* lora load: the idle adapter it evicted ("" none) */
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
    int32_t n_partial;          /* progress results in done (the loop has not taken them yet) */
    int stop;
    int started;
    int swapped_ready;          /* swapped holds a finished swap for the loop */
    et_swapped swapped;
    /* engine thread only */
    u64map live;                /* key -> et_live, while the engine has samples of it */
    et_swap swap;               /* a swap waiting for its step boundary (drain: for started work to end) */
} et_thread;

int et_start(et_thread *t, engine *e, uv_async_t *wake);
/* Stops and joins the thread; unclaimed commands and results are freed. */
void et_stop(et_thread *t);

/* Queue commands (loop thread). et_add copies the prompt, stop ids, logit_bias and stop strings: the caller's
 * request may be freed as soon as it returns. */
int et_add(et_thread *t, uint64_t key, const eng_request *r);
int et_abort(et_thread *t, uint64_t key);
/* Freezes (1) or unfreezes (0) every sequence at the next step boundary (eng_pause). */
int et_pause(et_thread *t, int pause);
/* Retracts every running sequence (eng_retract) and freezes the engine,
 * at the next step boundary; et_pause(t, 0) lets them run again. */
int et_retract(et_thread *t);
/* Releases (op ET_MEM_RELEASE) or re-creates (ET_MEM_RESUME) the parts in
 * tags between steps: the KV pool (eng_release_kv) and the weights
 * (model_drop_weights, then rd_read_weights(path) and model_adopt on
 * resume). A release is refused while the engine has sequences. The answer
 * comes back through et_take as an et_done with mem set and r.tag = key. */
int et_memory(et_thread *t, uint64_t key, int op, int tags, rd_loaded *L, const char *path, int same_file);
/* Loads the PEFT adapter in folder path as name at version (op ET_LORA_LOAD; lora_load_peft against the
 * engine's model, then eng_lora_load; replace: supersede a resident one of that name) or unloads name
 * (ET_LORA_UNLOAD), between steps; the folder is read off the loop thread. The answer comes back through
 * et_take as an et_done with lora set and r.tag = key. */
int et_lora(et_thread *t, uint64_t key, int op, const char *name, const char *path, uint64_t version, int replace);
/* The same load for an adapter built already (a push, lora_load_tensors), replacing a resident one of that
 * name; the engine thread takes a (frees it if the load fails). On RD_ENOMEM the caller keeps a. */
int et_lora_put(et_thread *t, uint64_t key, const char *name, lora_adapter *a, uint64_t version);
/* Flushes the prefix cache between steps; the answer comes back through
 * et_take as an et_done with flush set and r.tag = key. */
int et_flush_cache(et_thread *t, uint64_t key);
/* The one call that applies a weight update: hands a built patch to the
 * engine thread, which applies mode's swap policy (continue: swap at the
 * next step boundary, running sequences go on under the new weights; abort:
 * end the started ones, then swap; drain: start nothing new and swap once
 * started work has finished), then wakes the loop (et_take_swapped). The
 * patch is the thread's from here on. */
int et_apply_update(et_thread *t, model *m, upd_patch *patch, uint64_t version, upd_mode mode);
/* 1 and *out filled when a swap has happened since the last call. */
int et_take_swapped(et_thread *t, et_swapped *out);

/* Takes every finished sample (a list the caller frees with et_done_free) and
 * copies the latest stats. Progress of streaming requests comes in the same
 * list, before its sample's final result: at most one batch per step, and
 * none while the last batch is still untaken (what the engine samples
 * meanwhile comes with the next one), so a slow loop gets fewer, larger ones. */
et_done *et_take(et_thread *t, eng_stats *stats);
void et_done_free(et_done *d);

#endif
