/* api_call.c - an HTTP call's life (api_int.h): admission, its engine
 * requests (held while paused), the finished samples and stream progress
 * coming back (api_on_result), the client leaving, the answer when all are
 * in; and what acts on every call: abort, the pause (modes and waits), the
 * prefix-cache flush.
 *
 * Below the routes, above the answers: a route (api.c, api_openai.c,
 * api_sglang.c, api_update.c, api_vllm.c) makes a call with api_call_new,
 * sets how its answer is formatted (api_call's fmt_* callbacks) and admits
 * it; this file calls back only through those callbacks and the ones a pause
 * wait or a flush was given, never a route by name, and it answers with
 * api_answer.c. So no two files of the API call each other in a circle
 * (tools/check_layers.py, rule calls). */
#include <cjson/cJSON.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "daemon/admit.h"
#include "daemon/api_int.h"
#include "daemon/daemon.h"
#include "daemon/log.h"
#include "base/err.h"

/* ---- calls ---- */

api_call *api_call_new(api *a, http_res *h, api_kind kind)
{
    api_call *c = calloc(1, sizeof *c);
    if (!c)
        return NULL;
    c->a = a;
    c->h = h;
    api_call_init(c, kind, a->d->L.tok);
    c->p.processed = !strcmp(a->d->cfg.logprobs_mode, "processed_logprobs");
    c->created = (int64_t)time(NULL);
    c->serial = ++a->n_calls;
    return c;
}

static void call_free(api_call *c)
{
    for (int i = 0; i < c->n_subs; i++) {
        api_sub *s = &c->subs[i];
        for (int32_t j = 0; s->res && j < s->n; j++)
            eng_result_free(&s->res[j]);
        for (int32_t j = 0; s->st && j < s->n; j++)
            api_stream_free(&s->st[j]);
        free(s->st);
        free(s->res);
        free(s->have);
    }
    api_call_clear(c);
    free(c);
}

void api_call_free(api_call *c) { call_free(c); }

static void link_call(api *a, api_call *c)
{
    c->prev = a->tail;
    c->next = NULL;
    if (a->tail)
        a->tail->next = c;
    else
        a->head = c;
    a->tail = c;
    c->linked = 1;
}

static void unlink_call(api *a, api_call *c)
{
    if (!c->linked)
        return;
    if (c->prev)
        c->prev->next = c->next;
    else
        a->head = c->next;
    if (c->next)
        c->next->prev = c->prev;
    else
        a->tail = c->prev;
    c->linked = 0;
}

static void check_pause_wait(api *a);

/* Every sample is in: answer (or end the stream) and free the call. */
static void call_finish(api *a, api_call *c)
{
    unlink_call(a, c);
    if (c->h) {
        if (c->gone)
            http_release(c->h);
        else if (c->fmt_done)
            c->fmt_done(c);
        else
            http_release(c->h);
        c->h = NULL;
    }
    call_free(c);
    check_pause_wait(a);
}

/* A sample is in (r moved into the call). */
static void take_sample(api *a, api_call *c, api_sub *s, eng_result *r)
{
    int32_t j = r->sample_idx;
    if (j < 0 || j >= s->n || s->have[j]) {
        eng_result_free(r);
        return;
    }
    s->res[j] = *r;
    memset(r, 0, sizeof *r);
    s->have[j] = 1;
    s->n_done++;
    c->n_done++;
    if (s->n_done == s->n) {
        umap_del(&a->keys, s->key);
        a->inflight--;
    }
    if (c->stream && !c->gone && c->fmt_sample)
        c->fmt_sample(c, (int)(s - c->subs), j);
    if (c->n_done == c->n_total)
        call_finish(a, c);
}

/* New tokens of a running sample of a streaming call (r freed here). */
static void take_progress(api_call *c, api_sub *s, eng_result *r)
{
    int32_t j = r->sample_idx;
    if (c->stream && !c->gone && s->st && j >= 0 && j < s->n && !s->have[j] &&
        r->token_offset == s->st[j].n_tok && c->fmt_progress) {
        if (api_stream_push(c->a, &s->st[j], r))
            log_line("HTTP stream %llu: out of memory; its tokens come at the end", (unsigned long long)s->key);
        else
            c->fmt_progress(c, (int)(s - c->subs), j);
    }
    eng_result_free(r);
}

/* Ends the samples of a call that never reached the engine (abort while
 * paused, a failed et_add) with no tokens. Returns 1 when that finished (and
 * freed) the call. */
static int fake_finish(api *a, api_call *c, api_sub *s, finish_reason why)
{
    for (int32_t j = 0; j < s->n; j++) {
        if (s->have[j])
            continue;
        eng_result r = {.tag = s->key, .sample_idx = j, .n_prompt = s->n_prompt, .finish = why, .stop_str = -1};
        r.version_finish = a->d->weight_version;
        int last = c->n_done + 1 == c->n_total;
        take_sample(a, c, s, &r);
        if (last)
            return 1;
    }
    return 0;
}

static int submit_sub(api *a, api_call *c, api_sub *s)
{
    rd_daemon *d = a->d;
    proto_request pr = api_sub_request(c, s);
    eng_request er;
    adm_engine_request(&pr, s->prompt, (uint32_t)s->n_prompt, c->p.seed, &er);
    er.stop_strs = (const char *const *)c->p.stop_strs;
    er.n_stop_strs = c->p.n_stop_strs;
    /* The call's sampling fields past the protocol's first ones: its proto_request carries no sampling
       tail, so they come from the call (read and checked by its route, daemon/sampling.def). */
    er.sp.repetition_penalty = c->p.repetition_penalty;
    er.sp.frequency_penalty = c->p.frequency_penalty;
    er.sp.presence_penalty = c->p.presence_penalty;
    er.min_tokens = c->p.min_tokens;
    er.max_tokens = s->max_tokens;
    er.score_prompt = c->score;
    er.score_from = c->score_from;
    er.n_want = s->n_want;
    er.want_ids = s->want_ids;
    er.sp.processed_logprobs = c->p.processed;
    er.n_bias = c->p.n_bias;
    er.bias_ids = c->p.bias_ids;
    er.bias_vals = c->p.bias_vals;
    er.stream = c->stream && c->fmt_progress;
    er.lora = s->lora ? s->lora : c->lora;
    er.tag = s->key;
    s->submitted = 1;
    if (et_add(&d->et, s->key, &er)) {
        log_line("HTTP request %llu not queued: %s", (unsigned long long)s->key, rd_errmsg());
        return fake_finish(a, c, s, FINISH_ERROR);
    }
    return 0;
}

/* Sends a call's requests to the engine (at admission, or on continue).
 * Returns 1 when a refusal finished (and freed) the call. */
static int call_submit(api *a, api_call *c)
{
    c->submitted = 1;
    for (int i = 0; i < c->n_subs; i++)
        if (submit_sub(a, c, &c->subs[i]))
            return 1;
    return 0;
}

static void on_client_close(http_res *h, void *ud)
{
    api_call *c = ud;
    api *a = c->a;
    c->gone = 1;
    if (a->exiting || !c->submitted) {
        /* Nothing will come back from the engine for it. */
        http_release(c->h);
        c->h = NULL;
        for (int i = 0; i < c->n_subs; i++)
            if (c->subs[i].n_done < c->subs[i].n && umap_del(&a->keys, c->subs[i].key))
                a->inflight--;
        unlink_call(a, c);
        call_free(c);
        check_pause_wait(a);
        return;
    }
    /* Abort what runs so its KV blocks return; the partial samples still come
     * back and then the call is freed (the handle released). */
    for (int i = 0; i < c->n_subs; i++) {
        api_sub *s = &c->subs[i];
        if (s->n_done < s->n && !s->aborted) {
            s->aborted = 1;
            et_abort(&a->d->et, s->key);
        }
    }
}

/* Checks a call against the limits, then queues it (or holds it while
 * paused). On success the call belongs to the API; on failure e says why and
 * the caller answers and frees. */
int api_admit(api_call *c, api_err *e)
{
    api *a = c->a;
    rd_daemon *d = a->d;
    adm_limits lim = adm_limits_of(d);
    if (d->state != D_SERVING) {
        api_bad(e, 503, "the daemon is shutting down: no new requests");
        return -1;
    }
    if (a->mem_released) {
        api_bad(e, 503, "the engine's memory is released (%s%s%s): /resume_memory_occupation (or /wake_up) first",
                a->mem_released & ET_MEM_WEIGHTS ? "weights" : "", a->mem_released == 3 ? ", " : "",
                a->mem_released & ET_MEM_KV ? "kv_cache" : "");
        return -1;
    }
    if (c->p.n_stop_strs > 0 && !d->L.tok) {
        api_bad(e, 400, "field \"stop\": this model has no tokenizer, so stop strings cannot be matched");
        return -1;
    }
    if (c->return_routes && !(d->lim.features & PROTO_FEATURE_ROUTES)) {
        api_bad(e, 400, "field \"return_routed_experts\": the model (%s) is dense, not a mixture of experts: it has "
                "no routed experts to return", d->L.m->cfg.arch);
        return -1;
    }
    if (api_admit_check(c, &lim, e) || api_lora_check(a, c->lora, e))
        return -1;
    for (int i = 0; i < c->n_subs; i++)
        if (api_lora_check(a, c->subs[i].lora, e))
            return -1;
    /* The same bound, and the same words, as an NNG SUBMIT's BUSY. */
    char why[200];
    uint64_t unfinished = d->clients.unfinished + (uint64_t)a->inflight;
    if (adm_queue_room(&lim, unfinished, (uint64_t)c->n_subs, why, sizeof why)) {
        api_bad(e, 503, "%s", why);
        return -1;
    }
    if (!c->p.has_seed)
        c->p.seed = adm_random_seed(c->serial);
    c->p.seed &= ((uint64_t)1 << 53) - 1; /* reported back as a JSON number */
    for (int i = 0; i < c->n_subs; i++) {
        api_sub *s = &c->subs[i];
        s->res = calloc((size_t)s->n, sizeof *s->res);
        s->have = calloc((size_t)s->n, 1);
        if (c->stream)
            s->st = calloc((size_t)s->n, sizeof *s->st);
        s->key = API_KEY_BIT | ++a->next_key;
        if (!s->res || !s->have || (c->stream && !s->st) || umap_put(&a->keys, s->key, c)) {
            api_bad(e, 500, "out of memory");
            for (int k = 0; k <= i; k++)
                umap_del(&a->keys, c->subs[k].key);
            return -1;
        }
    }
    a->inflight += c->n_subs;
    link_call(a, c);
    http_on_close(c->h, on_client_close, c);
    if (c->stream && c->fmt_begin)
        c->fmt_begin(c);
    if (a->paused && c->kind != API_HEALTH)
        return 0; /* counted in inflight; queued until /continue_generation */
    call_submit(a, c);
    return 0;
}

/* Answers a route's refusal and frees the call. */
void api_refuse(api_call *c, const api_err *e)
{
    if (c->kind == API_COMPLETIONS || c->kind == API_CHAT)
        api_answer_error_v1(c->h, e);
    else
        api_answer_error(c->h, e);
    call_free(c);
}

/* Rows of k alternatives narrowed in place to rows of want (want < k). */
static void narrow_alts(int32_t *ids, float *lps, int32_t rows, int32_t k, int32_t want)
{
    if (!ids || !lps || want >= k)
        return;
    for (int32_t i = 0; i < rows; i++)
        for (int32_t q = 0; q < want; q++) {
            ids[(size_t)i * want + q] = ids[(size_t)i * k + q];
            lps[(size_t)i * want + q] = lps[(size_t)i * k + q];
        }
}

void api_on_result(api *a, eng_result *r)
{
    api_call *c = umap_get(&a->keys, r->tag);
    if (!c) {
        eng_result_free(r);
        return;
    }
    if (r->logprobs_proc) {
        /* logprobs_mode processed_logprobs: the answers' log-probs are the processed ones */
        float *raw = r->logprobs;
        r->logprobs = r->logprobs_proc;
        r->logprobs_proc = raw;
    }
    if (r->prompt_logprobs_proc) {
        float *raw = r->prompt_logprobs;
        r->prompt_logprobs = r->prompt_logprobs_proc;
        r->prompt_logprobs_proc = raw;
    }
    /* The engine listed max(top_n, prompt_lp) alternatives on both sides: each keeps what it asked for. */
    if (c->prompt_lp >= 0) {
        narrow_alts(r->top_ids, r->top_logprobs, r->n_tokens, r->n_top, c->p.top_n);
        if (r->n_top > c->p.top_n)
            r->n_top = c->p.top_n;
    }
    for (int i = 0; i < c->n_subs; i++)
        if (c->subs[i].key == r->tag) {
            if (r->partial)
                take_progress(c, &c->subs[i], r);
            else
                take_sample(a, c, &c->subs[i], r);
            return;
        }
    eng_result_free(r);
}

/* ---- abort ---- */

/* SGLang's scheduler aborts every request whose rid starts with the one
 * asked for, so "abc" also reaches the samples "abc_0", "abc_1" of a call. */
static int rid_matches(const api_call *c, const char *rid)
{
    size_t n = strlen(rid);
    if (c->rid && !strncmp(c->rid, rid, n))
        return 1;
    for (int i = 0; i < c->n_subs; i++)
        if (c->subs[i].rid && !strncmp(c->subs[i].rid, rid, n))
            return 1;
    return 0;
}

/* Aborts one call: running samples end with what they have; a call still
 * held by a pause ends at once with no tokens. Returns 1 if anything was
 * aborted. The call may be freed on return. */
static int abort_call(api *a, api_call *c)
{
    if (!c->submitted) {
        for (int i = 0; i < c->n_subs; i++)
            if (fake_finish(a, c, &c->subs[i], FINISH_ABORT))
                break;
        return 1;
    }
    int any = 0;
    for (int i = 0; i < c->n_subs; i++) {
        api_sub *s = &c->subs[i];
        if (s->n_done < s->n && !s->aborted) {
            s->aborted = 1;
            et_abort(&a->d->et, s->key);
            any = 1;
        }
    }
    return any;
}

static int abort_matching(api *a, const char *rid)
{
    int n = 0;
    for (api_call *c = a->head, *nx; c; c = nx) {
        nx = c->next;
        if (c->kind == API_HEALTH)
            continue;
        if ((!rid || rid_matches(c, rid)) && abort_call(a, c))
            n++;
    }
    return n;
}

void api_abort_all(api *a) { abort_matching(a, NULL); }

int api_abort_rid(api *a, const char *rid) { return abort_matching(a, rid); }

/* ---- pause ---- */

/* Pauses in "wait" mode (SGLang's /pause_generation, vLLM's /pause?mode=wait):
 * each is answered once no submitted HTTP call runs, in slot order. The
 * routes say how to answer (api_wait_begin), so the calls' life never calls a
 * route. */
static void check_pause_wait(api *a)
{
    for (int i = 0; i < API_WAITS; i++) {
        api_wait *w = &a->waits[i];
        if (!w->h)
            continue;
        for (api_call *c = a->head; c; c = c->next)
            if (c->submitted && c->kind != API_HEALTH)
                return;
        http_res *h = w->h;
        w->h = NULL;
        w->answer(a, h, w->arg);
    }
}

static void on_wait_close(http_res *h, void *ud)
{
    api *a = ud;
    for (int i = 0; i < API_WAITS; i++)
        if (a->waits[i].h == h) {
            a->waits[i].h = NULL;
            http_release(h);
        }
}

void api_wait_begin(api *a, int slot, http_res *h, void (*answer)(api *a, http_res *h, int arg), int arg)
{
    a->waits[slot] = (api_wait){.h = h, .answer = answer, .arg = arg};
    http_on_close(h, on_wait_close, a);
    check_pause_wait(a);
}

/* Freezes or unfreezes the engine (pause mode keep), once per change. */
static void set_frozen(api *a, int frozen)
{
    if (a->frozen == frozen)
        return;
    if (et_pause(&a->d->et, frozen)) {
        log_line("HTTP pause: %s", rd_errmsg());
        return;
    }
    a->frozen = frozen;
}

void api_set_frozen(api *a, int frozen) { set_frozen(a, frozen); }

/* SGLang's modes (new calls wait until /continue_generation in each):
 *   abort: every HTTP request ends now with what it has (finish "abort");
 *   retract: every running sequence goes back to the queue, its KV dropped
 *     and its tokens kept (the scheduler's preemption); on continue it is
 *     recomputed, under the weights serving then, and goes on;
 *   in_place (vLLM's keep): every sequence freezes where it is, its KV kept
 *     (a weight update may swap in between: it goes on under the new version). */
void api_pause_mode(api *a, const char *mode)
{
    a->paused = 1;
    if (!strcmp(mode, "abort")) {
        set_frozen(a, 0); /* abort ends what a keep froze */
        abort_matching(a, NULL);
    } else if (!strcmp(mode, "retract")) {
        if (et_retract(&a->d->et))
            log_line("HTTP pause: %s", rd_errmsg());
        else
            a->frozen = 1;
    } else {
        set_frozen(a, 1);
    }
}

void api_resume_held(api *a)
{
    a->paused = 0;
    set_frozen(a, 0);
    for (api_call *c = a->head, *nx; c; c = nx) {
        nx = c->next;
        if (!c->submitted)
            call_submit(a, c); /* may free c; nx was read before */
    }
}

/* ---- the prefix cache ---- */

/* A /flush_cache call waiting for the engine thread's answer. */
struct api_flush {
    struct api_flush *next;
    uint64_t key;
    http_res *h;                /* NULL once the client left */
    void (*answer)(http_res *h, int32_t n_flushed); /* NULL: SGLang's answer */
};

static void on_flush_close(http_res *h, void *ud)
{
    api *a = ud;
    for (struct api_flush *f = a->flushes; f; f = f->next)
        if (f->h == h) {
            f->h = NULL;
            http_release(h);
        }
}

/* SGLang refuses a flush while requests run; here it always succeeds, at the
 * next step boundary: cached blocks nobody holds become free, blocks in use
 * keep their KV but are never served from the cache again (eng_flush_cache),
 * so a pause (any mode), flush, weight update sequence is safe too. */
void api_flush_begin(api *a, http_res *h, void (*answer)(http_res *h, int32_t n_flushed))
{
    struct api_flush *f = calloc(1, sizeof *f);
    if (!f) {
        http_respond_error(h, 500, "internal error", "out of memory");
        return;
    }
    f->key = API_KEY_BIT | ++a->next_key;
    f->h = h;
    f->answer = answer;
    if (et_flush_cache(&a->d->et, f->key)) {
        free(f);
        http_respond_error(h, 500, "internal error", rd_errmsg());
        return;
    }
    f->next = a->flushes;
    a->flushes = f;
    http_on_close(h, on_flush_close, a);
}

void api_route_flush_cache(http_res *h, const http_req *req, void *ud) { api_flush_begin(ud, h, NULL); }

void api_on_flushed(api *a, uint64_t key, int32_t n_flushed)
{
    for (struct api_flush **pf = &a->flushes; *pf; pf = &(*pf)->next) {
        struct api_flush *f = *pf;
        if (f->key != key)
            continue;
        *pf = f->next;
        if (f->h && f->answer) {
            f->answer(f->h, n_flushed);
        } else if (f->h) {
            cJSON *o = api_ok_doc();
            cJSON_AddStringToObject(o, "message", "Cache flushed.");
            cJSON_AddNumberToObject(o, "flushed_blocks", n_flushed);
            api_answer_json(f->h, 200, o);
        }
        free(f);
        return;
    }
}

/* ---- the API's calls as a whole ---- */

int api_unfinished(const api *a)
{
    int n = 0;
    for (const api_call *c = a->head; c; c = c->next)
        n++;
    return n;
}

void api_drain(api *a) { set_frozen(a, 0); }

void api_shutdown(api *a)
{
    a->exiting = 1;
}

void api_calls_release(api *a)
{
    while (a->head) {
        api_call *c = a->head;
        unlink_call(a, c);
        if (c->h)
            http_release(c->h);
        call_free(c);
    }
    while (a->flushes) {
        struct api_flush *f = a->flushes;
        a->flushes = f->next;
        if (f->h)
            http_release(f->h);
        free(f);
    }
    for (int i = 0; i < API_WAITS; i++)
        if (a->waits[i].h) {
            http_release(a->waits[i].h);
            a->waits[i].h = NULL;
        }
}
