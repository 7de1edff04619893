/* loop.c - the loop thread: the learner protocol (PROTOCOL.md §5), result
 * delivery, FETCH long-polls, timers, signals and the shutdown sequence.
 * Nothing here computes or blocks: requests go to the engine thread as
 * commands, results come back through the wake async. */
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <unistd.h>

#include "daemon/admit.h"
#include "daemon/api.h"
#include "daemon/daemon.h"
#include "daemon/log.h"
#include "base/clock.h"
#include "base/err.h"

static rd_daemon *of_bridge(bridge *b) { return (rd_daemon *)((char *)b - offsetof(rd_daemon, br)); }

static void maybe_exit(rd_daemon *d);

/* ---- replies ---- */

static void send_out(rd_daemon *d, br_ctx *x)
{
    br_reply(x, d->out.data, d->out.len);
}

/* Replies are in the version of the request they answer (x->version), so a
 * version-1 client reads every reply it gets, byte for byte as before version 2. */
static void loop_reply_error(rd_daemon *d, br_ctx *x, uint32_t code, uint16_t type, const char *msg)
{
    d->errors++;
    proto_buf_reset(&d->out);
    if (proto_encode_error_version(&d->out, x->version, code, type, msg)) {
        br_reply(x, NULL, 0); /* cannot happen short of OOM: the client times out and retries */
        return;
    }
    send_out(d, x);
}

static void loop_reply_msg(rd_daemon *d, br_ctx *x, const proto_msg *m)
{
    proto_buf_reset(&d->out);
    proto_msg v = *m;           /* a shallow copy: the arrays stay the caller's */
    v.version = x->version;
    if (proto_encode(&d->out, &v)) {
        char why[600];
        snprintf(why, sizeof why, "cannot encode the %s reply: %s", proto_type_name(m->type), rd_errmsg());
        log_line("%s", why);
        loop_reply_error(d, x, PROTO_E_INTERNAL, (uint16_t)(m->type & 0x7f), why);
        return;
    }
    send_out(d, x);
}

static void reply_error_cb(void *ctx, br_ctx *x, uint32_t code, uint16_t type, const char *why)
{
    loop_reply_error(ctx, x, code, type, why);
}

static void reply_msg_cb(void *ctx, br_ctx *x, const proto_msg *m) { loop_reply_msg(ctx, x, m); }

host_reply loop_reply(rd_daemon *d) { return (host_reply){.msg = reply_msg_cb, .error = reply_error_cb, .ctx = d}; }

/* ---- results ---- */

/* Answers a FETCH with the client's held results (seq > ack), packed under
 * max_results and the byte budget; at least one when any is held. */
static void answer_fetch(rd_daemon *d, br_ctx *x, cl_client *c, const proto_fetch *f)
{
    uint64_t mmb = d->lim.max_message_bytes;
    uint64_t budget = f->max_bytes && f->max_bytes < mmb ? f->max_bytes : mmb;
    uint32_t cap = f->max_results < c->n_held ? f->max_results : c->n_held;
    proto_result *rs = cap ? malloc(sizeof *rs * cap) : NULL;
    if (cap && !rs) {
        loop_reply_error(d, x, PROTO_E_INTERNAL, PROTO_FETCH, "out of memory building RESULTS; retry the FETCH");
        return;
    }
    uint32_t k = 0;
    uint64_t total = PROTO_RESULTS_OVERHEAD;
    for (cl_result *r = c->held; r && k < cap; r = r->next) {
        if (k > 0 && total + r->bytes > budget)
            break;
        unsigned need = (r->pr.flags & PROTO_RESULT_LORA)     ? 6
                        : (r->pr.flags & PROTO_RESULT_SCORES) ? 5
                        : (r->pr.flags & PROTO_RESULT_SERVE)  ? 3
                        : (r->pr.flags & PROTO_RESULT_ROUTES) ? 2
                                                              : 1;
        if (need > (x->version ? x->version : 1u)) {
            char why[300];
            snprintf(why, sizeof why, "result seq %llu carries %s, which protocol version %u cannot say; FETCH in "
                     "version %u (the SUBMIT that asked for them was)", (unsigned long long)r->pr.seq,
                     need == 6   ? "its LoRA adapter's name"
                     : need == 5 ? "its prompt's scores"
                     : need == 3 ? "the serve_dtype that produced it"
                                 : "routed experts",
                     x->version ? x->version : 1, need);
            free(rs);
            loop_reply_error(d, x, PROTO_E_UNEXPECTED, PROTO_FETCH, why);
            return;
        }
        rs[k++] = r->pr;
        total += r->bytes;
    }
    proto_msg m = {.type = PROTO_RESULTS};
    m.results.ack_seq = c->ack_seq;
    m.results.pending_results = c->n_held - k;
    m.results.inflight_samples = c->reserved;
    m.results.n_results = k;
    m.results.results = rs;
    loop_reply_msg(d, x, &m);
    free(rs);
}

static void unpark(rd_daemon *d, br_ctx *x)
{
    x->parked = 0;
    uv_timer_stop(&x->timer);
}

/* Answers the client's parked FETCH now (with whatever is held). */
static void release_parked(rd_daemon *d, cl_client *c)
{
    br_ctx *x = c->parked;
    if (!x)
        return;
    c->parked = NULL;
    unpark(d, x);
    answer_fetch(d, x, c, &x->fetch);
}

/* Sends an abort for the request's unfinished samples; returns how many. */
static uint32_t abort_req(rd_daemon *d, cl_req *q)
{
    if (q->aborted || q->n_finished == q->n)
        return 0;
    q->aborted = 1;
    if (et_abort(&d->et, q->key))
        log_line("abort of request key %llu not queued: %s", (unsigned long long)q->key, rd_errmsg());
    return q->n - q->n_finished;
}

static void forget_client(rd_daemon *d, cl_client *c, const char *why)
{
    if (c->parked) {
        br_ctx *x = c->parked;
        c->parked = NULL;
        unpark(d, x);
        loop_reply_error(d, x, PROTO_E_UNKNOWN_CLIENT, PROTO_FETCH, "the client was forgotten while this FETCH waited");
    }
    for (cl_req *q = c->reqs; q; q = q->next)
        abort_req(d, q);
    log_line("client %016llx (%s) forgotten: %s", (unsigned long long)c->id, c->name, why);
    wing_on_client_forgotten(&d->wing, c->id);
    cl_forget(&d->clients, c);
}

static void take_results(rd_daemon *d)
{
    et_done *list = et_take(&d->et, &d->stats);
    int any = 0;
    for (et_done *e = list, *nx; e; e = nx) {
        nx = e->next;
        if (e->flush) {
            if (d->api)
                api_on_flushed(d->api, e->r.tag, e->n_flushed);
        } else if (e->mem) {
            if (d->api)
                api_on_memory(d->api, e->r.tag, e->mem_rc, e->mem_msg);
        } else if (e->lora && e->r.tag == XFER_LORA_KEY) {
            wing_on_lora(&d->wing, e->mem_rc, e->mem_msg, e->lora_rank, e->lora_bytes, e->lora_evicted);
        } else if (e->lora) {
            if (d->api)
                api_on_lora(d->api, e->r.tag, e->mem_rc, e->mem_msg, e->lora_rank, e->lora_bytes, e->lora_evicted);
        } else if (e->r.tag & API_KEY_BIT) {
            /* An HTTP call's sample or its progress (its own key space, api.h). */
            if (d->api)
                api_on_result(d->api, &e->r);
        } else if (e->r.partial) {
            /* NNG requests never ask for progress; nothing to deliver. */
        } else if (cl_finish(&d->clients, &e->r, d->weight_version, e->t_added_us, e->t_finish_us))
            any = 1;
        et_done_free(e);
    }
    if (!any)
        return;
    /* Wake the parked FETCHes of clients that now hold results. */
    for (int i = 0; i < d->br.n; i++) {
        br_ctx *x = &d->br.ctxs[i];
        if (!x->parked)
            continue;
        cl_client *c = cl_find(&d->clients, x->client_id);
        if (c && c->n_held > 0 && c->parked == x)
            release_parked(d, c);
    }
}

/* ---- requests ---- */

static uint64_t now_us(void) { return (uint64_t)clock_now_us(); }

static void on_hello(rd_daemon *d, br_ctx *x, const proto_hello *h)
{
    /* The highest version both speak. */
    uint16_t lo = h->min_version > PROTO_VERSION_MIN ? h->min_version : PROTO_VERSION_MIN;
    uint16_t hi = h->max_version < PROTO_VERSION ? h->max_version : PROTO_VERSION;
    if (h->min_version > h->max_version || lo > hi) {
        char why[200];
        snprintf(why, sizeof why, "HELLO offers versions %u..%u; this daemon speaks %d to %d", h->min_version,
                 h->max_version, PROTO_VERSION_MIN, PROTO_VERSION);
        loop_reply_error(d, x, PROTO_E_UNSUPPORTED_VERSION, PROTO_HELLO, why);
        return;
    }
    if (h->client_name.len > PROTO_MAX_CLIENT_NAME) {
        char why[200];
        snprintf(why, sizeof why, "HELLO client_name has %u bytes; expected at most %d", h->client_name.len,
                 PROTO_MAX_CLIENT_NAME);
        loop_reply_error(d, x, PROTO_E_INVALID_PARAMS, PROTO_HELLO, why);
        return;
    }
    cl_client *c;
    uint32_t flags = 0;
    if (h->client_id == 0) {
        if (d->state != D_SERVING) {
            loop_reply_error(d, x, PROTO_E_SHUTTING_DOWN, PROTO_HELLO,
                        "the daemon is shutting down: no new clients (a known client_id may resume)");
            return;
        }
        if (d->clients.n_clients >= (uint32_t)d->cfg.max_clients) {
            char why[200];
            snprintf(why, sizeof why, "%u clients known (max_clients); retry later or resume an existing client_id",
                     d->clients.n_clients);
            loop_reply_error(d, x, PROTO_E_BUSY, PROTO_HELLO, why);
            return;
        }
        if (cl_new(&d->clients, h->client_name.ptr, now_us(), &c)) {
            loop_reply_error(d, x, PROTO_E_INTERNAL, PROTO_HELLO, rd_errmsg());
            return;
        }
        log_line("client %016llx hello (%s): new", (unsigned long long)c->id, c->name);
    } else {
        c = cl_find(&d->clients, h->client_id);
        if (!c) {
            char why[200];
            snprintf(why, sizeof why, "client_id %016llx is not known (never assigned, expired, or the daemon "
                     "restarted); HELLO with client_id 0 and resubmit", (unsigned long long)h->client_id);
            loop_reply_error(d, x, PROTO_E_UNKNOWN_CLIENT, PROTO_HELLO, why);
            return;
        }
        flags |= PROTO_HELLO_OK_RESUMED;
        c->leaving = 0;
        c->last_seen_us = now_us();
        release_parked(d, c);
        log_line("client %016llx hello (%s): resumed, %u results held, %u samples in flight",
                 (unsigned long long)c->id, c->name, c->n_held, c->reserved);
    }
    proto_msg m = {.type = PROTO_HELLO_OK};
    m.hello_ok = d->lim;
    m.hello_ok.client_id = c->id;
    m.hello_ok.version = hi;
    if (hi < 2)
        m.hello_ok.features &= ~(uint64_t)PROTO_FEATURE_ROUTES; /* a version-2 feature */
    m.hello_ok.flags |= flags;
    m.hello_ok.weight_version = d->weight_version;
    if (d->cfg.max_staging_bytes > 0)
        m.hello_ok.features |= PROTO_FEATURE_WEIGHT_UPDATE | PROTO_FEATURE_RELAY |
                               (d->cfg.max_loras > 0 ? PROTO_FEATURE_LORA_PUSH : 0);
    m.hello_ok.pending_results = c->n_held;
    m.hello_ok.inflight_samples = c->reserved;
    loop_reply_msg(d, x, &m);
}

/* One SUBMIT request (of a frame in protocol version `version`): 0 accepted,
 * else the item's code with msg filled. The checks are admission's (admit.h),
 * shared with the HTTP routes; retention, the frame limit on a result with
 * routes and the text prompt's tokenization are this door's. */
static uint32_t admit(rd_daemon *d, cl_client *c, const proto_request *r, uint16_t version, int *busy, char *msg,
                      size_t msg_cap)
{
    adm_limits lim = adm_limits_of(d);
    proto_hello_ok vlim = d->lim; /* the flags this request's version defines (v1: no RETURN_ROUTES) */
    vlim.version = version ? version : PROTO_VERSION_MIN;
    lim.lim = &vlim;
    int32_t *ids = NULL;
    size_t n_ids = 0;
    if (adm_check(&lim, r, msg, msg_cap))
        return PROTO_E_INVALID_PARAMS;
    char lora_why[300];
    if (adm_lora_resident(d, r, lora_why, sizeof lora_why)) {
        snprintf(msg, msg_cap, "request %llu: %s", (unsigned long long)r->client_req_id, lora_why);
        return PROTO_E_INVALID_PARAMS;
    }
    const int32_t *prompt = r->prompt;
    uint32_t n_prompt = r->n_prompt;
    if (r->flags & PROTO_REQ_PROMPT_IS_TEXT) {
        /* Tokenizing here is cheap for prompts (proto bounds them by the frame size). */
        int rc = (r->flags & PROTO_REQ_CHAT_TEMPLATE)
                     ? tok_chat(d->L.tok, NULL, r->text.ptr, &ids, &n_ids)
                     : tok_encode_prompt(d->L.tok, r->text.ptr, r->text.len, &ids, &n_ids);
        if (rc) {
            snprintf(msg, msg_cap, "request %llu: cannot tokenize the prompt: %s",
                     (unsigned long long)r->client_req_id, rd_errmsg());
            free(ids);
            return PROTO_E_INVALID_PARAMS;
        }
        if (n_ids == 0 || n_ids > UINT32_MAX || proto_check_lengths((uint32_t)n_ids, r->max_tokens, &d->lim)) {
            snprintf(msg, msg_cap, "request %llu: %s", (unsigned long long)r->client_req_id,
                     n_ids == 0 ? "the text tokenizes to no tokens; expected at least 1" : rd_errmsg());
            free(ids);
            return PROTO_E_INVALID_PARAMS;
        }
        prompt = ids;
        n_prompt = (uint32_t)n_ids;
        /* a scored text prompt's score_from, now that its length is known (a token prompt's was checked) */
        if (proto_check_score_from(r, n_prompt)) {
            snprintf(msg, msg_cap, "%s", rd_errmsg());
            free(ids);
            return PROTO_E_INVALID_PARAMS;
        }
    }
    uint32_t code = 0;
    char why[400];
    uint64_t max_bytes = adm_result_max_bytes(&lim, r, n_prompt);
    if (adm_fits_message(&lim, r, n_prompt, why, sizeof why)) {
        snprintf(msg, msg_cap, "request %llu: %s", (unsigned long long)r->client_req_id, why);
        code = PROTO_E_INVALID_PARAMS;
        goto out;
    }
    /* The whole sequence must fit the KV pool, or it could never run (the
     * lengths were checked against max_context above). */
    if (adm_fits_kv(&lim, n_prompt, r->max_tokens, why, sizeof why)) {
        snprintf(msg, msg_cap, "request %llu: %s", (unsigned long long)r->client_req_id, why);
        code = PROTO_E_INVALID_PARAMS;
        goto out;
    }
    /* A request larger than an empty client's retention would be BUSY forever. */
    if (r->n > d->lim.retention_results || (uint64_t)r->n * max_bytes > d->lim.retention_bytes) {
        snprintf(msg, msg_cap, "request %llu: n = %u samples of up to %llu bytes can never fit the retention "
                 "(%u results, %llu bytes); expected fewer samples or max_tokens",
                 (unsigned long long)r->client_req_id, r->n, (unsigned long long)max_bytes,
                 d->lim.retention_results, (unsigned long long)d->lim.retention_bytes);
        code = PROTO_E_INVALID_PARAMS;
        goto out;
    }
    if (*busy) {
        snprintf(msg, msg_cap, "an earlier request of this SUBMIT was BUSY (order is kept); resubmit later");
        code = PROTO_E_BUSY;
        goto out;
    }
    if (adm_queue_room(&lim, d->clients.unfinished, 1, msg, msg_cap)) {
        code = PROTO_E_BUSY;
        *busy = 1;
        goto out;
    }
    if (cl_room(&d->clients, c, r->n, max_bytes)) {
        snprintf(msg, msg_cap, "%s", rd_errmsg());
        code = PROTO_E_BUSY;
        *busy = 1;
        goto out;
    }
    cl_req *q;
    if (cl_add_req(&d->clients, c, r->client_req_id, r->n, max_bytes, &q)) {
        snprintf(msg, msg_cap, "%s", rd_errmsg());
        code = PROTO_E_INTERNAL;
        goto out;
    }
    q->t_accept_us = now_us();
    q->version_admit = d->weight_version;
    q->n_prompt = n_prompt;
    q->seed = (r->flags & PROTO_REQ_HAS_SEED) ? r->seed : adm_random_seed(q->key);
    q->serve = version >= 3;
    if (r->flags & PROTO_REQ_SCORE) {   /* version 5 (adm_check refused the bit before) */
        q->scored = 1;
        q->score_from = (uint32_t)r->score_from;
    }
    if (r->flags & PROTO_REQ_LORA)      /* version 6 (likewise); a resident adapter's name, < LORA_NAME_MAX */
        snprintf(q->lora, sizeof q->lora, "%s", r->lora.ptr);
    if (r->flags & PROTO_REQ_RETURN_ROUTES) {
        q->route_layers = lim.route_layers;
        q->route_k = lim.route_k;
        q->route_width = lim.route_width;
    }
    eng_request er;
    adm_engine_request(r, prompt, n_prompt, q->seed, &er);
    if (et_add(&d->et, q->key, &er)) {
        /* Not queued: undo the admission as if it never happened. */
        snprintf(msg, msg_cap, "%s", rd_errmsg());
        eng_result fake = {.tag = q->key, .finish = FINISH_ERROR};
        for (uint32_t i = 0; i < r->n; i++) {
            fake.sample_idx = (int32_t)i;
            cl_finish(&d->clients, &fake, d->weight_version, 0, 0);
        }
        code = PROTO_E_INTERNAL;
        goto out;
    }
out:
    free(ids);
    return code;
}

static void on_submit(rd_daemon *d, br_ctx *x, const proto_submit *s)
{
    cl_client *c = cl_find(&d->clients, s->client_id);
    if (!c) {
        loop_reply_error(d, x, PROTO_E_UNKNOWN_CLIENT, PROTO_SUBMIT, "SUBMIT from an unknown client_id; HELLO first");
        return;
    }
    c->last_seen_us = now_us();
    if (c->leaving) {
        loop_reply_error(d, x, PROTO_E_UNEXPECTED, PROTO_SUBMIT, "SUBMIT after BYE; HELLO again to resume first");
        return;
    }
    if (d->state != D_SERVING) {
        loop_reply_error(d, x, PROTO_E_SHUTTING_DOWN, PROTO_SUBMIT,
                    "the daemon is shutting down: no new requests (FETCH still delivers results)");
        return;
    }
    if (s->n_requests > d->lim.max_requests_per_submit) {
        char why[200];
        snprintf(why, sizeof why, "SUBMIT has %u requests; expected at most %u (max_requests_per_submit)",
                 s->n_requests, d->lim.max_requests_per_submit);
        loop_reply_error(d, x, PROTO_E_INVALID_PARAMS, PROTO_SUBMIT, why);
        return;
    }
    enum { MSG = 512 };
    uint32_t n = s->n_requests;
    proto_submit_item *items = calloc(n ? n : 1, sizeof *items);
    char *msgs = calloc(n ? n : 1, MSG);
    if (!items || !msgs) {
        free(items);
        free(msgs);
        loop_reply_error(d, x, PROTO_E_INTERNAL, PROTO_SUBMIT, "out of memory; retry the SUBMIT");
        return;
    }
    int busy = 0;
    for (uint32_t i = 0; i < n; i++) {
        const proto_request *r = &s->requests[i];
        char *msg = msgs + (size_t)i * MSG;
        items[i].client_req_id = r->client_req_id;
        if (cl_find_req(c, r->client_req_id)) {
            items[i].flags = PROTO_SUBMIT_DUPLICATE;
            continue;
        }
        items[i].status = admit(d, c, r, x->version, &busy, msg, MSG);
        if (items[i].status) {
            d->rejected++;
            items[i].message = (proto_str){msg, (uint32_t)strlen(msg)};
        } else {
            d->accepted++;
        }
    }
    proto_msg m = {.type = PROTO_SUBMIT_OK};
    m.submit_ok.n_items = n;
    m.submit_ok.items = items;
    loop_reply_msg(d, x, &m);
    free(items);
    free(msgs);
}

static void on_fetch(rd_daemon *d, br_ctx *x, const proto_fetch *f)
{
    cl_client *c = cl_find(&d->clients, f->client_id);
    if (!c) {
        loop_reply_error(d, x, PROTO_E_UNKNOWN_CLIENT, PROTO_FETCH, "FETCH from an unknown client_id; HELLO first");
        return;
    }
    c->last_seen_us = now_us();
    if (f->ack_seq > c->last_seq) {
        char why[200];
        snprintf(why, sizeof why, "FETCH ack_seq = %llu is above the last seq assigned to this client (%llu)",
                 (unsigned long long)f->ack_seq, (unsigned long long)c->last_seq);
        loop_reply_error(d, x, PROTO_E_UNEXPECTED, PROTO_FETCH, why);
        return;
    }
    cl_ack(&d->clients, c, f->ack_seq);
    /* A client has at most one parked FETCH: the older one is answered now. */
    release_parked(d, c);
    uint32_t wait = f->wait_ms < d->lim.max_wait_ms ? f->wait_ms : d->lim.max_wait_ms;
    int done = c->leaving && cl_idle(c);
    if (f->max_results == 0 || c->n_held > 0 || wait == 0 || done) {
        answer_fetch(d, x, c, f);
    } else {
        x->parked = 1;
        x->client_id = c->id;
        x->fetch = *f;
        c->parked = x;
        uv_timer_start(&x->timer, loop_on_fetch_timeout, wait, 0);
    }
    if (done)
        forget_client(d, c, "said BYE and everything is delivered");
    maybe_exit(d);
}

void loop_on_fetch_timeout(uv_timer_t *t)
{
    br_ctx *x = t->data;
    rd_daemon *d = of_bridge(x->b);
    if (!x->parked)
        return;
    x->parked = 0;
    cl_client *c = cl_find(&d->clients, x->client_id);
    if (!c) {
        loop_reply_error(d, x, PROTO_E_UNKNOWN_CLIENT, PROTO_FETCH, "the client was forgotten while this FETCH waited");
        return;
    }
    if (c->parked == x)
        c->parked = NULL;
    c->last_seen_us = now_us();
    answer_fetch(d, x, c, &x->fetch);
}

static void on_abort(rd_daemon *d, br_ctx *x, const proto_abort *a)
{
    cl_client *c = cl_find(&d->clients, a->client_id);
    if (!c) {
        loop_reply_error(d, x, PROTO_E_UNKNOWN_CLIENT, PROTO_ABORT, "ABORT from an unknown client_id; HELLO first");
        return;
    }
    c->last_seen_us = now_us();
    proto_msg m = {.type = PROTO_ABORT_OK};
    if (a->flags & PROTO_ABORT_ALL) {
        if (a->client_req_id != 0) {
            loop_reply_error(d, x, PROTO_E_INVALID_PARAMS, PROTO_ABORT,
                        "ABORT with the ALL flag must have client_req_id 0");
            return;
        }
        for (cl_req *q = c->reqs; q; q = q->next) {
            uint32_t k = abort_req(d, q);
            if (k) {
                m.abort_ok.n_requests++;
                m.abort_ok.n_samples += k;
            }
        }
    } else {
        cl_req *q = cl_find_req(c, a->client_req_id);
        if (!q) {
            char why[200];
            snprintf(why, sizeof why, "ABORT of client_req_id %llu: no such request (never submitted, or finished "
                     "and acknowledged)", (unsigned long long)a->client_req_id);
            loop_reply_error(d, x, PROTO_E_UNKNOWN_REQUEST, PROTO_ABORT, why);
            return;
        }
        uint32_t k = abort_req(d, q);
        m.abort_ok.n_requests = k ? 1 : 0;
        m.abort_ok.n_samples = k;
    }
    loop_reply_msg(d, x, &m);
}

static void on_status(rd_daemon *d, br_ctx *x)
{
    char *json = loop_status_json(d);
    if (!json) {
        loop_reply_error(d, x, PROTO_E_INTERNAL, PROTO_STATUS, "out of memory building the status");
        return;
    }
    proto_msg m = {.type = PROTO_STATUS_OK};
    m.status_ok.json = (proto_str){json, (uint32_t)strlen(json)};
    loop_reply_msg(d, x, &m);
    free(json);
}

static void on_bye(rd_daemon *d, br_ctx *x, const proto_bye *b)
{
    proto_msg m = {.type = PROTO_BYE_OK};
    cl_client *c = cl_find(&d->clients, b->client_id);
    if (c && (b->flags & PROTO_BYE_DISCARD)) {
        forget_client(d, c, "BYE with DISCARD");
    } else if (c) {
        c->leaving = 1;
        c->last_seen_us = now_us();
        if (cl_idle(c)) {
            forget_client(d, c, "BYE");
        } else {
            m.bye_ok.pending_results = c->n_held;
            m.bye_ok.inflight_samples = c->reserved;
            log_line("client %016llx (%s) bye: %u results to fetch, %u samples running", (unsigned long long)c->id,
                     c->name, c->n_held, c->reserved);
        }
    }
    loop_reply_msg(d, x, &m);
    maybe_exit(d);
}

static void serve(rd_daemon *d, br_ctx *x)
{
    const uint8_t *body = nng_msg_body(x->msg);
    size_t len = nng_msg_len(x->msg);
    proto_msg m;
    int rc = proto_decode(body, len, d->lim.max_message_bytes, &m);
    x->version = m.version; /* the reply's; 0 (version 1) when the header was unreadable or of another version */
    if (rc) {
        loop_reply_error(d, x, m.wire_error, m.type, rd_errmsg());
        return;
    }
    uint32_t pipe = nng_pipe_id(nng_msg_get_pipe(x->msg));
    if (m.type == PROTO_AUTH_BEGIN || m.type == PROTO_AUTH || !pipe_auth_ok(&d->auth, &d->secret, pipe)) {
        if (m.type == PROTO_AUTH_BEGIN || m.type == PROTO_AUTH) {
            host_reply r = loop_reply(d);
            pipe_auth_on_message(&d->auth, &d->secret, &r, x, &m, pipe);
        } else {
            char why[200];
            snprintf(why, sizeof why, "%s on a connection that has not authenticated: this daemon needs the shared "
                     "secret (AUTH_BEGIN, then AUTH; PROTOCOL.md section 14)", proto_type_name(m.type));
            loop_reply_error(d, x, PROTO_E_UNAUTHORIZED, m.type, why);
        }
        proto_msg_free(&m);
        return;
    }
    if (m.type == PROTO_UPDATE_CHUNK) {
        /* The chunk's data points into the message: the staging job frees it. */
        nng_msg *msg = x->msg;
        x->msg = NULL;
        wing_on_chunk(&d->wing, x, &m.update_chunk, msg);
        proto_msg_free(&m);
        return;
    }
    /* The request's bytes were copied into m's arena: free the message now. */
    nng_msg_free(x->msg);
    x->msg = NULL;
    switch (m.type) {
    case PROTO_HELLO: on_hello(d, x, &m.hello); break;
    case PROTO_SUBMIT: on_submit(d, x, &m.submit); break;
    case PROTO_FETCH: on_fetch(d, x, &m.fetch); break;
    case PROTO_ABORT: on_abort(d, x, &m.abort_req); break;
    case PROTO_STATUS: on_status(d, x); break;
    case PROTO_BYE: on_bye(d, x, &m.bye); break;
    case PROTO_UPDATE_BEGIN:
    case PROTO_UPDATE_COMMIT:
    case PROTO_UPDATE_ABORT:
    case PROTO_UPDATE_PREPARE:
    case PROTO_UPDATE_FORWARD:
    case PROTO_ADAPTER_BEGIN:
    case PROTO_WEIGHTS_SYNC: wing_on_message(&d->wing, x, &m, pipe); break;
    case PROTO_LANE_AUTH:
        loop_reply_error(d, x, PROTO_E_UNEXPECTED, m.type, "LANE_AUTH belongs on the data lane (PROTOCOL.md 10.12)");
        break;
    default: {
        char why[200];
        snprintf(why, sizeof why, "%s (0x%02x) is a reply type; expected a request (HELLO..BYE)",
                 proto_type_name(m.type) ? proto_type_name(m.type) : "?", m.type);
        loop_reply_error(d, x, PROTO_E_UNEXPECTED, m.type, why);
    }
    }
    proto_msg_free(&m);
}

void loop_on_wake(uv_async_t *h)
{
    rd_daemon *d = h->data;
    /* Results first, so a FETCH in this batch sees them. */
    take_results(d);
    wing_on_wake(&d->wing);
    uint32_t pipes[64];
    int np;
    while ((np = br_take_closed(&d->br, pipes, 64)) > 0)
        for (int i = 0; i < np; i++) {
            wing_on_pipe_closed(&d->wing, pipes[i]);
            pipe_auth_on_closed(&d->auth, pipes[i]);
        }
    br_ctx *x;
    while ((x = br_next(&d->br)))
        serve(d, x);
    maybe_exit(d);
}

/* ---- status ---- */

char *loop_status_json(void *ud)
{
    mx_snapshot s;
    snapshot_take(ud, &s);
    return mx_status_json(&s);
}

char *loop_metrics_text(void *ud)
{
    mx_snapshot s;
    snapshot_take(ud, &s);
    return mx_prometheus(&s);
}

/* ---- HTTP routes (http.h); the generation routes join this table ---- */

static void answer_doc(http_res *h, char *doc, const char *ctype, const char *what)
{
    if (!doc) {
        char detail[100];
        snprintf(detail, sizeof detail, "out of memory building %s", what);
        http_respond_error(h, 500, "internal error", detail);
        return;
    }
    http_respond(h, 200, ctype, doc, strlen(doc));
    free(doc);
}

static void route_status(http_res *h, const http_req *r, void *ud)
{
    answer_doc(h, loop_status_json(ud), "application/json", "the status");
}

static void route_metrics(http_res *h, const http_req *r, void *ud)
{
    answer_doc(h, loop_metrics_text(ud), "text/plain; version=0.0.4; charset=utf-8", "the metrics");
}

static void route_health(http_res *h, const http_req *r, void *ud)
{
    static const char ok[] = "{\"status\":\"ok\"}\n";
    http_respond(h, 200, "application/json", ok, sizeof ok - 1);
}

int loop_http_start(rd_daemon *d)
{
    static const http_route routes[] = {
        {"GET", "/status", route_status, NULL, 0},
        {"GET", "/metrics", route_metrics, NULL, 0},
        {"GET", "/health", route_health, NULL, HTTP_ROUTE_PUBLIC}, /* probes carry no key */
        /* prime-rl's inference server's liveness probe (a vLLM server has no key on it either): 200 while
         * the loop thread answers */
        {"GET", "/liveness", route_health, NULL, HTTP_ROUTE_PUBLIC},
    };
    enum { N = sizeof routes / sizeof routes[0] };
    http_route table[N + API_MAX_ROUTES];
    for (int i = 0; i < N; i++) {
        table[i] = routes[i];
        table[i].ud = d;
    }
    int rc;
    if (!d->api && (rc = api_create(d, &d->api)))
        return rc;
    int n = N + api_routes(d->api, table + N);
    char key[HTTP_MAX_KEY + 1] = "";
    size_t key_len = 0;
    if (d->cfg.api_key_file[0] && (rc = http_read_key(d->cfg.api_key_file, key, &key_len)))
        return rc;
    if (!d->cfg.api_key_file[0] && d->secret.len) { /* one secret for every socket (DESIGN.md) */
        memcpy(key, d->secret.bytes, d->secret.len + 1);
        key_len = d->secret.len;
    }
    http_config hc = {
        .listen = d->cfg.http_listen,
        .max_conns = (int)d->cfg.http_max_connections,
        .max_body_bytes = (size_t)d->cfg.max_http_body_bytes,
        .max_inflight_body_bytes = (size_t)d->cfg.max_http_inflight_body_bytes,
        .header_timeout_ms = (uint64_t)d->cfg.http_header_timeout_ms,
        .idle_timeout_ms = (uint64_t)d->cfg.http_idle_timeout_ms,
        .stream_queue_bytes = (size_t)d->cfg.http_stream_queue_bytes,
        .api_key = key,
        .insecure = (int)d->cfg.http_insecure,
        .tls_cert_file = d->cfg.http_tls_cert_file,
        .tls_key_file = d->cfg.http_tls_key_file,
    };
    rc = http_start(&d->http, &d->loop, &hc, table, n);
    memset(key, 0, sizeof key); /* the server keeps its own copy */
    if (rc)
        return rc;
    if (!d->http.key_len && !d->http.loopback)
        log_line("warning: HTTP on %s without auth (http_insecure)", d->cfg.http_listen);
    return 0;
}

/* ---- timers ---- */

void loop_on_tick(uv_timer_t *t)
{
    rd_daemon *d = t->data;
    eng_stats st;
    pthread_mutex_lock(&d->et.mu);
    st = d->et.stats;
    pthread_mutex_unlock(&d->et.mu);
    mx_window_push(&d->win, (double)now_us() / 1e6, st.prompt_tokens, st.generated_tokens);
    wing_on_tick(&d->wing);
    /* Client TTL: a parked FETCH counts as activity. */
    uint64_t now = now_us(), ttl = (uint64_t)d->cfg.client_ttl_s * 1000000u;
    u64map *m = &d->clients.clients;
    uint64_t expired[64];
    int n = 0;
    for (size_t i = 0; i < m->cap && n < 64; i++) {
        cl_client *c = m->keys[i] ? m->vals[i] : NULL;
        if (c && !c->parked && now - c->last_seen_us > ttl)
            expired[n++] = c->id;
    }
    for (int i = 0; i < n; i++) {
        cl_client *c = cl_find(&d->clients, expired[i]);
        if (c)
            forget_client(d, c, "silent for client_ttl_s");
    }
}

static void on_grace(uv_timer_t *t)
{
    rd_daemon *d = t->data;
    log_line("shutdown: delivery grace period over; exiting");
    loop_shutdown(d);
}

static void on_drain(uv_timer_t *t)
{
    rd_daemon *d = t->data;
    d->drain_expired = 1;
    uint32_t n = 0;
    for (size_t i = 0; i < d->clients.reqs.cap; i++) {
        cl_req *q = d->clients.reqs.keys[i] ? d->clients.reqs.vals[i] : NULL;
        if (q && abort_req(d, q))
            n++;
    }
    if (d->api)
        api_abort_all(d->api);
    log_line("shutdown: drain time over; %u unfinished requests aborted (their partial rollouts are delivered)", n);
    maybe_exit(d);
}

/* Draining ends when nothing runs; the daemon exits once every client has
 * acknowledged everything (or said BYE), or the grace period ends. */
static void maybe_exit(rd_daemon *d)
{
    if (d->state != D_DRAINING || d->clients.unfinished > 0 || (d->api && api_unfinished(d->api) > 0))
        return;
    int delivered = 1;
    u64map *m = &d->clients.clients;
    for (size_t i = 0; i < m->cap; i++) {
        cl_client *c = m->keys[i] ? m->vals[i] : NULL;
        if (c && c->n_held > 0 && !c->leaving)
            delivered = 0;
    }
    if (delivered) {
        log_line("shutdown: every result delivered; exiting");
        loop_shutdown(d);
        return;
    }
    if (!d->grace_started) {
        d->grace_started = 1;
        log_line("shutdown: nothing running; %lld s for clients to fetch their results",
                 (long long)d->cfg.shutdown_grace_s);
        uv_timer_start(&d->grace_timer, on_grace, (uint64_t)d->cfg.shutdown_grace_s * 1000u, 0);
    }
}

void loop_on_signal(uv_signal_t *s, int signum)
{
    rd_daemon *d = s->data;
    if (++d->n_signals > 1) {
        log_line("second signal (%d): exiting now", signum);
        _exit(1);
    }
    log_line("signal %d: draining (no new submits; %lld s for running requests, then abort)", signum,
             (long long)d->cfg.drain_s);
    d->state = D_DRAINING;
    if (d->api)
        api_drain(d->api);
    uv_timer_stop(&d->tick);
    uv_timer_start(&d->drain_timer, on_drain, (uint64_t)d->cfg.drain_s * 1000u, 0);
    maybe_exit(d);
}

static void close_one(uv_handle_t *h, void *arg)
{
    if (!uv_is_closing(h))
        uv_close(h, NULL);
}

void loop_shutdown(rd_daemon *d)
{
    if (d->state == D_EXITING)
        return;
    d->state = D_EXITING;
    /* NNG and the engine thread first: both may still call uv_async_send. */
    br_close(&d->br);
    et_stop(&d->et);
    if (d->api)
        api_shutdown(d->api); /* no engine results will come: calls still open are cut */
    http_stop(&d->http);
    api_destroy(d->api);
    d->api = NULL;
    lr_free(&d->loras);
    wing_stop(&d->wing);
    log_line("shutdown: socket closed, engine stopped");
    uv_walk(&d->loop, close_one, NULL);
}
