/* engine_thread.c - see engine_thread.h. */
#include "daemon/engine_thread.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/clock.h"
#include "base/err.h"
#include "daemon/log.h"

static void free_cmd(et_cmd *c)
{
    if (c->kind == ET_SWAP && c->swap.patch)
        upd_patch_free(c->swap.m->be, c->swap.patch);
    free((void *)c->req.prompt);
    free((void *)c->req.stop_ids);
    free((void *)c->req.bias_ids);
    free((void *)c->req.bias_vals);
    for (int32_t i = 0; c->req.stop_strs && i < c->req.n_stop_strs; i++)
        free((void *)c->req.stop_strs[i]);
    free((void *)c->req.stop_strs);
    free(c->path);
    free(c->lora_name);
    lora_free(c->lora_built);
    free((void *)c->req.lora);
    free(c);
}

void et_done_free(et_done *d)
{
    eng_result_free(&d->r);
    free(d);
}

/* Caller holds mu. */
static void push_done(et_thread *t, et_done *d)
{
    if (t->done_tail)
        t->done_tail->next = d;
    else
        t->done = d;
    t->done_tail = d;
}

/* A request the engine refused after the loop accepted it (out of memory, a
 * limit the loop did not check): its samples still come back, as errors with no
 * tokens, so the client gets one result per sample. Caller holds mu. */
static void refuse(et_thread *t, const et_cmd *c, uint64_t now)
{
    log_line("engine refused request key %llu: %s", (unsigned long long)c->key, rd_errmsg());
    for (int32_t i = 0; i < c->req.n; i++) {
        et_done *d = calloc(1, sizeof *d);
        if (!d)
            continue;
        d->r.tag = c->key;
        d->r.sample_idx = i;
        d->r.n_prompt = c->req.n_prompt;
        d->r.token_ids = malloc(sizeof(int32_t));
        d->r.logprobs = malloc(sizeof(float));
        d->r.finish = FINISH_ERROR;
        d->t_added_us = d->t_finish_us = now;
        push_done(t, d);
    }
}

/* One memory release or resume (the engine is between steps); the answer. */
static et_done *run_memory(et_thread *t, const et_cmd *c)
{
    et_done *d = calloc(1, sizeof *d);
    if (!d)
        return NULL;
    d->mem = 1;
    d->r.tag = c->key;
    d->mem_tags = c->mem_tags;
    model *m = c->L->m;
    int rc = 0;
    eng_stats st;
    eng_get_stats(t->eng, &st);
    if (c->mem_op == ET_MEM_RELEASE) {
        if (eng_busy(t->eng))
            rc = rd_fail(RD_EBUSY, "requests are running or waiting (%d sequences): release memory once the engine "
                         "is idle (abort or finish them first)", (int)(st.running + st.waiting));
        if (!rc && (c->mem_tags & ET_MEM_KV))
            rc = eng_release_kv(t->eng);
        if (!rc && (c->mem_tags & ET_MEM_WEIGHTS) && !(rc = eng_set_weights_released(t->eng, 1)))
            model_drop_weights(m);
    } else {
        if (c->mem_tags & ET_MEM_WEIGHTS && !m->layers) {
            model *fresh;
            rc = rd_read_weights(c->L, c->path, c->same_file, &fresh);
            if (!rc && (rc = model_adopt(m, fresh)))
                model_free(fresh);
            if (!rc) {
                model_count_bytes(m);
                rc = eng_set_weights_released(t->eng, 0);
            }
        }
        if (!rc && (c->mem_tags & ET_MEM_KV))
            rc = eng_resume_kv(t->eng);
    }
    if (rc) {
        d->mem_rc = rc;
        snprintf(d->mem_msg, sizeof d->mem_msg, "%s", rd_errmsg());
    }
    d->t_added_us = d->t_finish_us = (uint64_t)clock_now_us();
    return d;
}

/* One adapter load or unload (the engine is between steps); the answer. */
static et_done *run_lora(et_thread *t, et_cmd *c)
{
    et_done *d = calloc(1, sizeof *d);
    if (!d)
        return NULL;
    d->lora = 1;
    d->r.tag = c->key;
    int rc;
    if (c->lora_op == ET_LORA_LOAD) {
        int32_t max_loras, max_rank;
        eng_lora_limits(t->eng, &max_loras, &max_rank);
        lora_adapter *a = c->lora_built;
        c->lora_built = NULL;
        rc = max_loras == 0 ? rd_fail(RD_ENOTSUP, "LoRA adapters are not served: max_loras is 0")
           : a             ? 0
                           : lora_load_peft(c->path, &eng_model(t->eng)->cfg, max_rank, &a);
        if (rc) {
            lora_free(a);
        } else {
            d->lora_rank = a->rank;
            rc = eng_lora_load(t->eng, a, c->lora_name, c->lora_version, c->lora_replace, d->lora_evicted,
                               sizeof d->lora_evicted);
            if (rc)
                lora_free(a);
        }
        lora_info info[LORA_MAX_LORAS];
        int32_t n = 0;
        if (!rc && !eng_lora_list(t->eng, info, LORA_MAX_LORAS, &n))
            for (int32_t i = 0; i < n; i++)
                if (!strcmp(info[i].name, c->lora_name))
                    d->lora_bytes = (int64_t)info[i].bytes;
    } else {
        rc = eng_lora_unload(t->eng, c->lora_name);
    }
    if (rc) {
        d->mem_rc = rc;
        snprintf(d->mem_msg, sizeof d->mem_msg, "%s", rd_errmsg());
    }
    d->t_added_us = d->t_finish_us = (uint64_t)clock_now_us();
    return d;
}

/* Runs the queued commands. Caller holds mu; eng_add copies what it needs, so
 * holding the lock only costs the copy. */
static void run_cmds(et_thread *t)
{
    while (t->cmds) {
        et_cmd *c = t->cmds;
        t->cmds = c->next;
        if (!t->cmds)
            t->cmds_tail = NULL;
        t->n_cmds--;
        uint64_t now = (uint64_t)clock_now_us();
        if (c->kind == ET_ADD) {
            int64_t id;
            eng_request r = c->req;
            r.tag = c->key;
            et_live *l = calloc(1, sizeof *l);
            if (l && eng_add(t->eng, &r, &id) == 0) {
                l->id = id;
                l->t_added_us = now;
                l->left = r.n;
                if (umap_put(&t->live, c->key, l)) {
                    /* Cannot track it: it still runs, only abort and timing lose it. */
                    free(l);
                }
            } else {
                if (!l)
                    rd_fail(RD_ENOMEM, "engine thread: out of memory");
                free(l);
                refuse(t, c, now);
            }
        } else if (c->kind == ET_SWAP) {
            t->swap = c->swap; /* swap_policy applies it */
            c->swap.patch = NULL;
        } else if (c->kind == ET_PAUSE) {
            if (c->pause == 2)
                eng_retract(t->eng);
            eng_pause(t->eng, c->pause != 0);
        } else if (c->kind == ET_MEMORY) {
            /* Reading weights takes a while: the loop may queue commands meanwhile. */
            pthread_mutex_unlock(&t->mu);
            et_done *d = run_memory(t, c);
            pthread_mutex_lock(&t->mu);
            if (d)
                push_done(t, d);
            else
                log_line("engine thread: out of memory answering a memory release");
        } else if (c->kind == ET_LORA) {
            /* Reading a folder takes a while too. */
            pthread_mutex_unlock(&t->mu);
            et_done *d = run_lora(t, c);
            pthread_mutex_lock(&t->mu);
            if (d)
                push_done(t, d);
            else
                log_line("engine thread: out of memory answering a LoRA load");
        } else if (c->kind == ET_FLUSH) {
            et_done *d = calloc(1, sizeof *d);
            int32_t n = eng_flush_cache(t->eng);
            if (d) {
                d->flush = 1;
                d->n_flushed = n;
                d->r.tag = c->key;
                d->t_added_us = d->t_finish_us = now;
                push_done(t, d);
            } else {
                log_line("engine thread: out of memory answering a cache flush");
            }
        } else {
            et_live *l = umap_get(&t->live, c->key);
            if (l)
                eng_abort(t->eng, l->id); /* RD_ENOENT: finished meanwhile, fine */
        }
        free_cmd(c);
    }
}

static void collect(et_thread *t, uint64_t now)
{
    eng_result rs[64];
    int n;
    while ((n = eng_collect(t->eng, rs, 64)) > 0) {
        for (int i = 0; i < n; i++) {
            et_done *d = calloc(1, sizeof *d);
            if (!d) {
                eng_result_free(&rs[i]);
                continue;
            }
            d->r = rs[i];
            et_live *l = umap_get(&t->live, rs[i].tag);
            d->t_added_us = l ? l->t_added_us : now;
            d->t_finish_us = now;
            if (l && --l->left <= 0)
                free(umap_del(&t->live, rs[i].tag));
            push_done(t, d);
        }
    }
}

/* The progress of streaming samples, once per step and only when the loop
 * has taken the last batch. Caller holds mu. */
static void collect_progress(et_thread *t, uint64_t now)
{
    eng_result rs[64];
    int n, pushed = 0;
    if (t->n_partial > 0)
        return; /* the last batch is still untaken: what comes meanwhile goes with the next */
    while ((n = eng_collect_progress(t->eng, rs, 64)) > 0) {
        for (int i = 0; i < n; i++) {
            et_done *d = calloc(1, sizeof *d);
            if (!d) {
                eng_result_free(&rs[i]); /* its tokens still come with the final result */
                continue;
            }
            d->r = rs[i];
            d->t_added_us = d->t_finish_us = now;
            push_done(t, d);
            pushed++;
        }
        if (n < 64)
            break;
    }
    t->n_partial = pushed;
}

/* The swap policy, all of it (PROTOCOL.md §10.6), run at every step
 * boundary while a swap is pending: continue swaps at once, and running
 * sequences go on under the new weights; abort ends the started sequences
 * (their partial rollouts are returned), then swaps; drain holds new work
 * back, so nothing new starts on the old weights, and swaps once nothing
 * started is left. Caller holds mu. */
static void swap_policy(et_thread *t)
{
    et_swap *w = &t->swap;
    if (!w->active)
        return;
    if (!w->m->layers)
        return; /* the weights are released: the swap waits for them to be read back */
    if (w->mode == UPD_DRAIN) {
        eng_hold_new(t->eng, 1);
        if (eng_started(t->eng) > 0)
            return;
    }
    uint64_t t0 = (uint64_t)clock_now_us();
    int32_t n_aborted = w->mode == UPD_ABORT ? eng_abort_started(t->eng) : 0;
    upd_apply(w->m, w->patch);
    eng_set_version(t->eng, w->version);
    eng_hold_new(t->eng, 0);
    uint64_t t1 = (uint64_t)clock_now_us();
    t->swapped = (et_swapped){.version = w->version, .t_applied_us = t1, .stall_us = t1 - t0,
                              .n_aborted = n_aborted, .old = w->patch};
    t->swapped_ready = 1;
    memset(w, 0, sizeof *w);
    uv_async_send(t->wake);
}

static void engine_main(void *arg)
{
    et_thread *t = arg;
    pthread_mutex_lock(&t->mu);
    while (!t->stop) {
        run_cmds(t);
        swap_policy(t);
        /* An abort finishes samples without a step: collect them now, or an
         * engine left idle by the abort would sleep on them. */
        collect(t, (uint64_t)clock_now_us());
        /* Paused: frozen sequences wait, like an idle engine, for a command. */
        if (!eng_busy(t->eng) || eng_paused(t->eng)) {
            eng_get_stats(t->eng, &t->stats);
            if (t->done)
                uv_async_send(t->wake);
            pthread_cond_wait(&t->cv, &t->mu);
            continue;
        }
        pthread_mutex_unlock(&t->mu);
        int rc = eng_step(t->eng);
        pthread_mutex_lock(&t->mu);
        if (rc < 0)
            log_line("engine step failed: %s", rd_errmsg());
        uint64_t now = (uint64_t)clock_now_us();
        collect(t, now);
        collect_progress(t, now);
        eng_get_stats(t->eng, &t->stats);
        uv_async_send(t->wake);
    }
    pthread_mutex_unlock(&t->mu);
}

int et_start(et_thread *t, engine *e, uv_async_t *wake)
{
    memset(t, 0, sizeof *t);
    t->eng = e;
    t->wake = wake;
    umap_init(&t->live);
    pthread_mutex_init(&t->mu, NULL);
    pthread_cond_init(&t->cv, NULL);
    eng_get_stats(e, &t->stats);
    if (uv_thread_create(&t->thread, engine_main, t))
        return rd_fail(RD_ENOMEM, "cannot start the engine thread");
    t->started = 1;
    return 0;
}

void et_stop(et_thread *t)
{
    if (!t->started)
        return;
    pthread_mutex_lock(&t->mu);
    t->stop = 1;
    pthread_cond_signal(&t->cv);
    pthread_mutex_unlock(&t->mu);
    uv_thread_join(&t->thread);
    t->started = 0;
    for (et_cmd *c = t->cmds, *nx; c; c = nx) {
        nx = c->next;
        free_cmd(c);
    }
    for (et_done *d = t->done, *nx; d; d = nx) {
        nx = d->next;
        et_done_free(d);
    }
    t->cmds = t->cmds_tail = NULL;
    t->done = t->done_tail = NULL;
    /* A swap that never happened frees its new buffers; one that did, the old. */
    if (t->swap.active)
        upd_patch_free(t->swap.m->be, t->swap.patch);
    if (t->swapped_ready && t->swapped.old)
        upd_patch_free(eng_model(t->eng)->be, t->swapped.old);
    t->swapped_ready = 0;
    memset(&t->swap, 0, sizeof t->swap);
    for (size_t i = 0; i < t->live.cap; i++)
        if (t->live.keys[i])
            free(t->live.vals[i]);
    umap_free(&t->live);
    pthread_mutex_destroy(&t->mu);
    pthread_cond_destroy(&t->cv);
}

static void push_cmd(et_thread *t, et_cmd *c)
{
    pthread_mutex_lock(&t->mu);
    if (t->cmds_tail)
        t->cmds_tail->next = c;
    else
        t->cmds = c;
    t->cmds_tail = c;
    t->n_cmds++;
    pthread_cond_signal(&t->cv);
    pthread_mutex_unlock(&t->mu);
}

int et_add(et_thread *t, uint64_t key, const eng_request *r)
{
    et_cmd *c = calloc(1, sizeof *c);
    int32_t *prompt = malloc(sizeof(int32_t) * (size_t)(r->n_prompt > 0 ? r->n_prompt : 1));
    int32_t *stop = malloc(sizeof(int32_t) * (size_t)(r->n_stop > 0 ? r->n_stop : 1));
    if (!c || !prompt || !stop) {
        free(c);
        free(prompt);
        free(stop);
        return rd_fail(RD_ENOMEM, "engine queue: out of memory");
    }
    memcpy(prompt, r->prompt, sizeof(int32_t) * (size_t)r->n_prompt);
    if (r->n_stop > 0)
        memcpy(stop, r->stop_ids, sizeof(int32_t) * (size_t)r->n_stop);
    c->kind = ET_ADD;
    c->key = key;
    c->req = *r;
    c->req.prompt = prompt;
    c->req.stop_ids = stop;
    /* Nothing of the caller's is left in the command for free_cmd to free. */
    c->req.bias_ids = NULL;
    c->req.bias_vals = NULL;
    c->req.n_bias = 0;
    c->req.stop_strs = NULL;
    c->req.n_stop_strs = 0;
    c->req.lora = NULL;
    if (r->lora && r->lora[0] && !(c->req.lora = strdup(r->lora))) {
        free_cmd(c);
        return rd_fail(RD_ENOMEM, "engine queue: out of memory");
    }
    /* logit_bias too: an NNG request's arrays live in the decoded SUBMIT, freed
     * when the door returns, long before the engine thread takes the command. */
    if (r->n_bias > 0) {
        int32_t *ids = malloc(sizeof(int32_t) * (size_t)r->n_bias);
        float *vals = malloc(sizeof(float) * (size_t)r->n_bias);
        c->req.bias_ids = ids;
        c->req.bias_vals = vals;
        if (!ids || !vals) {
            free_cmd(c);
            return rd_fail(RD_ENOMEM, "engine queue: out of memory");
        }
        memcpy(ids, r->bias_ids, sizeof(int32_t) * (size_t)r->n_bias);
        memcpy(vals, r->bias_vals, sizeof(float) * (size_t)r->n_bias);
        c->req.n_bias = r->n_bias;
    }
    /* Stop strings (HTTP API) are copied too: the caller's request may be gone
     * before the engine thread takes the command. */
    if (r->n_stop_strs > 0) {
        char **ss = calloc((size_t)r->n_stop_strs, sizeof *ss);
        if (!ss) {
            free_cmd(c);
            return rd_fail(RD_ENOMEM, "engine queue: out of memory");
        }
        c->req.stop_strs = (const char *const *)ss;
        for (int32_t i = 0; i < r->n_stop_strs; i++) {
            if (!(ss[i] = strdup(r->stop_strs[i]))) {
                free_cmd(c);
                return rd_fail(RD_ENOMEM, "engine queue: out of memory");
            }
            c->req.n_stop_strs = i + 1;
        }
    }
    push_cmd(t, c);
    return 0;
}

/* Queues a command with no payload beyond key and pause. */
static int push_simple(et_thread *t, et_kind kind, uint64_t key, int pause)
{
    et_cmd *c = calloc(1, sizeof *c);
    if (!c)
        return rd_fail(RD_ENOMEM, "engine queue: out of memory");
    c->kind = kind;
    c->key = key;
    c->pause = pause;
    push_cmd(t, c);
    return 0;
}

int et_abort(et_thread *t, uint64_t key) { return push_simple(t, ET_ABORT, key, 0); }

int et_pause(et_thread *t, int pause) { return push_simple(t, ET_PAUSE, 0, pause); }

int et_flush_cache(et_thread *t, uint64_t key) { return push_simple(t, ET_FLUSH, key, 0); }

int et_retract(et_thread *t) { return push_simple(t, ET_PAUSE, 0, 2); }

int et_memory(et_thread *t, uint64_t key, int op, int tags, rd_loaded *L, const char *path, int same_file)
{
    et_cmd *c = calloc(1, sizeof *c);
    if (!c || (path && !(c->path = strdup(path)))) {
        free(c);
        return rd_fail(RD_ENOMEM, "engine queue: out of memory");
    }
    c->kind = ET_MEMORY;
    c->key = key;
    c->mem_op = op;
    c->mem_tags = tags;
    c->L = L;
    c->same_file = same_file;
    push_cmd(t, c);
    return 0;
}

/* An ET_LORA command (NULL: out of memory, reported). */
static et_cmd *lora_cmd(uint64_t key, int op, const char *name, const char *path, uint64_t version, int replace)
{
    et_cmd *c = calloc(1, sizeof *c);
    if (!c || !(c->lora_name = strdup(name)) || (path && !(c->path = strdup(path)))) {
        if (c)
            free(c->lora_name);
        free(c);
        rd_fail(RD_ENOMEM, "engine queue: out of memory");
        return NULL;
    }
    c->kind = ET_LORA;
    c->key = key;
    c->lora_op = op;
    c->lora_version = version;
    c->lora_replace = replace;
    return c;
}

int et_lora(et_thread *t, uint64_t key, int op, const char *name, const char *path, uint64_t version, int replace)
{
    et_cmd *c = lora_cmd(key, op, name, path, version, replace);
    if (!c)
        return RD_ENOMEM;
    push_cmd(t, c);
    return 0;
}

int et_lora_put(et_thread *t, uint64_t key, const char *name, lora_adapter *a, uint64_t version)
{
    et_cmd *c = lora_cmd(key, ET_LORA_LOAD, name, NULL, version, 1);
    if (!c)
        return RD_ENOMEM;
    c->lora_built = a;
    push_cmd(t, c);
    return 0;
}

et_done *et_take(et_thread *t, eng_stats *stats)
{
    pthread_mutex_lock(&t->mu);
    et_done *d = t->done;
    t->done = t->done_tail = NULL;
    t->n_partial = 0;
    if (stats)
        *stats = t->stats;
    pthread_mutex_unlock(&t->mu);
    return d;
}

int et_apply_update(et_thread *t, model *m, upd_patch *patch, uint64_t version, upd_mode mode)
{
    et_cmd *c = calloc(1, sizeof *c);
    if (!c)
        return rd_fail(RD_ENOMEM, "engine queue: out of memory");
    c->kind = ET_SWAP;
    c->swap = (et_swap){.active = 1, .patch = patch, .m = m, .version = version, .mode = mode};
    push_cmd(t, c);
    return 0;
}

int et_take_swapped(et_thread *t, et_swapped *out)
{
    pthread_mutex_lock(&t->mu);
    int ready = t->swapped_ready;
    if (ready) {
        *out = t->swapped;
        t->swapped_ready = 0;
        memset(&t->swapped, 0, sizeof t->swapped);
    }
    pthread_mutex_unlock(&t->mu);
    return ready;
}
