/* clients.c - see clients.h. */
#include "daemon/clients.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

#include "base/err.h"

void cl_init(cl_table *t, uint32_t retention_results, uint64_t retention_bytes)
{
    memset(t, 0, sizeof *t);
    umap_init(&t->clients);
    umap_init(&t->reqs);
    t->next_key = 1;
    t->retention_results = retention_results;
    t->retention_bytes = retention_bytes;
}

static void free_result(cl_result *r)
{
    eng_result_free(&r->er);
    if (r->spans != &r->one)
        free(r->spans);
    free(r);
}

/* Unlinks a request from its client and frees it; only when nothing of it is
 * in the engine. */
static void drop_req(cl_table *t, cl_req *q)
{
    cl_client *c = q->client;
    if (c) {
        if (q->prev)
            q->prev->next = q->next;
        else
            c->reqs = q->next;
        if (q->next)
            q->next->prev = q->prev;
        umap_del(&c->by_crid, q->client_req_id);
    }
    umap_del(&t->reqs, q->key);
    free(q);
}

void cl_free(cl_table *t)
{
    for (size_t i = 0; i < t->clients.cap; i++)
        if (t->clients.keys[i]) {
            cl_client *c = t->clients.vals[i];
            for (cl_result *r = c->held, *nx; r; r = nx) {
                nx = r->next;
                free_result(r);
            }
            umap_free(&c->by_crid);
            free(c);
        }
    for (size_t i = 0; i < t->reqs.cap; i++)
        if (t->reqs.keys[i])
            free(t->reqs.vals[i]);
    umap_free(&t->clients);
    umap_free(&t->reqs);
}

cl_client *cl_find(cl_table *t, uint64_t id) { return umap_get(&t->clients, id); }

static uint64_t random_id(void)
{
    uint64_t x = 0;
    if (getrandom(&x, sizeof x, 0) != (ssize_t)sizeof x) {
        /* No entropy source: mix the clock; ids only need to differ across restarts. */
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        x = ((uint64_t)ts.tv_sec * 1000000007ull) ^ ((uint64_t)ts.tv_nsec << 17) ^ (uint64_t)(uintptr_t)&x;
    }
    return x;
}

int cl_new(cl_table *t, const char *name, uint64_t now_us, cl_client **out)
{
    cl_client *c = calloc(1, sizeof *c);
    if (!c)
        return rd_fail(RD_ENOMEM, "client table: out of memory");
    do
        c->id = random_id();
    while (!c->id || umap_get(&t->clients, c->id));
    snprintf(c->name, sizeof c->name, "%s", name ? name : "");
    umap_init(&c->by_crid);
    c->last_seen_us = now_us;
    int rc = umap_put(&t->clients, c->id, c);
    if (rc) {
        free(c);
        return rc;
    }
    t->n_clients++;
    *out = c;
    return 0;
}

void cl_forget(cl_table *t, cl_client *c)
{
    for (cl_result *r = c->held, *nx; r; r = nx) {
        nx = r->next;
        r->req->n_acked++;
        free_result(r);
    }
    c->held = c->held_tail = NULL;
    for (cl_req *q = c->reqs, *nx; q; q = nx) {
        nx = q->next;
        if (q->n_finished == q->n) {
            drop_req(t, q);
        } else {
            /* The engine still has samples of it: keep the key so they can be
             * counted and dropped when they come back. */
            umap_del(&c->by_crid, q->client_req_id);
            q->client = NULL;
            q->next = q->prev = NULL;
        }
    }
    umap_free(&c->by_crid);
    umap_del(&t->clients, c->id);
    t->n_clients--;
    free(c);
}

int cl_idle(const cl_client *c) { return c->n_held == 0 && c->reserved == 0; }

cl_req *cl_find_req(cl_client *c, uint64_t client_req_id) { return umap_get(&c->by_crid, client_req_id); }

int cl_room(const cl_table *t, const cl_client *c, uint32_t n, uint64_t max_bytes)
{
    uint64_t results = (uint64_t)c->n_held + c->reserved + n;
    uint64_t bytes = c->held_bytes + c->reserved_bytes + (uint64_t)n * max_bytes;
    if (results > t->retention_results)
        return rd_fail(RD_EBUSY, "retention full: %u results held and %u samples in flight, +%u would pass "
                       "retention_results = %u; fetch and acknowledge results, then resubmit",
                       c->n_held, c->reserved, n, t->retention_results);
    if (bytes > t->retention_bytes)
        return rd_fail(RD_EBUSY, "retention full: %llu bytes held or reserved, +%llu would pass retention_bytes = "
                       "%llu; fetch and acknowledge results, then resubmit",
                       (unsigned long long)(c->held_bytes + c->reserved_bytes),
                       (unsigned long long)((uint64_t)n * max_bytes), (unsigned long long)t->retention_bytes);
    return 0;
}

int cl_add_req(cl_table *t, cl_client *c, uint64_t client_req_id, uint32_t n, uint64_t max_bytes, cl_req **out)
{
    cl_req *q = calloc(1, sizeof *q);
    if (!q)
        return rd_fail(RD_ENOMEM, "client table: out of memory");
    q->key = t->next_key++;
    q->client_req_id = client_req_id;
    q->client = c;
    q->n = n;
    q->max_result_bytes = max_bytes;
    int rc = umap_put(&t->reqs, q->key, q);
    if (!rc && (rc = umap_put(&c->by_crid, client_req_id, q)))
        umap_del(&t->reqs, q->key);
    if (rc) {
        free(q);
        return rc;
    }
    q->next = c->reqs;
    if (c->reqs)
        c->reqs->prev = q;
    c->reqs = q;
    c->reserved += n;
    c->reserved_bytes += (uint64_t)n * max_bytes;
    t->unfinished++;
    *out = q;
    return 0;
}

/* n int32 expert ids rewritten in place as ids of width bytes (1, 2 or 4):
 * element i moves to byte i * width, never past where it was read from. */
static void narrow_routes(int32_t *ids, size_t n, uint8_t width)
{
    if (width == 1) {
        uint8_t *d = (uint8_t *)ids;
        for (size_t i = 0; i < n; i++)
            d[i] = (uint8_t)ids[i];
    } else if (width == 2) {
        for (size_t i = 0; i < n; i++) {
            uint16_t v = (uint16_t)ids[i];
            memcpy((uint8_t *)ids + 2 * i, &v, 2);
        }
    }
}

cl_client *cl_finish(cl_table *t, eng_result *er, uint64_t weight_version, uint64_t t_added_us, uint64_t t_finish_us)
{
    cl_req *q = umap_get(&t->reqs, er->tag);
    if (!q) {
        eng_result_free(er);
        return NULL;
    }
    q->n_finished++;
    if (q->n_finished == q->n)
        t->unfinished--;
    cl_client *c = q->client;
    if (!c) {
        /* Orphan: its client is gone. Free it once the engine is done with it. */
        eng_result_free(er);
        if (q->n_finished == q->n)
            drop_req(t, q);
        return NULL;
    }
    c->reserved--;
    c->reserved_bytes -= q->max_result_bytes;
    cl_result *r = calloc(1, sizeof *r);
    if (!r) {
        /* Cannot hold it: count it acknowledged so the request can still be
         * freed; the client sees a gap-free seq stream without it. */
        eng_result_free(er);
        q->n_acked++;
        if (q->n_acked == q->n)
            drop_req(t, q);
        return NULL;
    }
    r->req = q;
    r->er = *er;
    memset(er, 0, sizeof *er);
    proto_result *p = &r->pr;
    p->seq = ++c->last_seq;
    p->client_req_id = q->client_req_id;
    p->sample_idx = (uint32_t)r->er.sample_idx;
    p->finish = (uint8_t)r->er.finish;
    if (p->finish < PROTO_FINISH_STOP || p->finish > PROTO_FINISH_ERROR)
        p->finish = PROTO_FINISH_ERROR;
    p->flags = r->er.logprobs_proc ? PROTO_RESULT_PROCESSED : 0;
    p->top_k = (uint16_t)(r->er.n_top > 0 ? r->er.n_top : 0);
    p->n_preempt = (uint32_t)r->er.n_preempt;
    p->n_prompt = q->n_prompt;
    p->seed = q->seed;
    p->version_admit = q->version_admit;
    p->version_finish = r->er.n_spans > 0 || r->er.version_finish ? r->er.version_finish : weight_version;
    p->queued_us = t_added_us > q->t_accept_us ? t_added_us - q->t_accept_us : 0;
    p->first_token_us = r->er.t_first_token_us > (int64_t)q->t_accept_us
                            ? (uint64_t)r->er.t_first_token_us - q->t_accept_us : 0;
    p->total_us = t_finish_us > q->t_accept_us ? t_finish_us - q->t_accept_us : 0;
    p->n_tokens = (uint32_t)r->er.n_tokens;
    p->token_ids = r->er.token_ids;
    p->logprobs = r->er.logprobs;
    p->logprobs_processed = r->er.logprobs_proc;
    p->top_ids = p->top_k ? r->er.top_ids : NULL;
    p->top_logprobs = p->top_k ? r->er.top_logprobs : NULL;
    if (p->n_tokens > 0 && r->er.n_spans > 0 && (r->spans = malloc(sizeof *r->spans * (size_t)r->er.n_spans))) {
        for (int32_t i = 0; i < r->er.n_spans; i++)
            r->spans[i] = (proto_span){(uint32_t)r->er.spans[i].start, (uint32_t)r->er.spans[i].end,
                                       r->er.spans[i].version};
        p->n_spans = (uint32_t)r->er.n_spans;
        p->spans = r->spans;
    } else if (p->n_tokens > 0) {
        /* No spans from the engine (or no memory for them): one span at the finish version. */
        r->one = (proto_span){0, p->n_tokens, p->version_finish};
        r->spans = &r->one;
        p->n_spans = 1;
        p->spans = r->spans;
    } else {
        r->spans = &r->one;
    }
    if (q->serve) {
        /* Which policy produced the tokens: the finish version's serve_dtype,
         * and the first span's (a push meanwhile may have changed it). */
        p->flags |= PROTO_RESULT_SERVE;
        p->serve_dtype = t->serve ? sh_code(t->serve, p->version_finish) : 0;
        p->serve_dtype_first = t->serve ? sh_code(t->serve, p->n_spans ? p->spans[0].version : p->version_finish) : 0;
    }
    if (q->route_layers) {
        /* Routes asked: the flag and the shape always, the ids when the engine
         * has them (none for a sample aborted before it ran). */
        p->flags |= PROTO_RESULT_ROUTES;
        p->route_layers = q->route_layers;
        p->route_k = q->route_k;
        p->route_width = q->route_width;
        if (r->er.routes && r->er.n_routes > 0 && r->er.route_layers == q->route_layers &&
            r->er.route_k == q->route_k) {
            narrow_routes(r->er.routes, (size_t)r->er.n_routes * q->route_layers * q->route_k, q->route_width);
            p->n_routes = (uint32_t)r->er.n_routes;
            p->routes = r->er.routes;
        }
    }
    if (q->scored) {
        /* Scores asked: the flag and score_from always; the positions from score_from on when the engine has
         * them all (not for a sample that failed before it was queued, nor when it ran out of memory for them). */
        p->flags |= PROTO_RESULT_SCORES;
        r->scores.score_from = q->score_from;
        int have = r->er.prompt_logprobs && r->er.n_prompt == (int32_t)q->n_prompt && q->score_from <= q->n_prompt &&
                   (p->top_k == 0 || (r->er.prompt_top_ids && r->er.prompt_top_logprobs));
        if (have) {
            size_t k = p->top_k, at = q->score_from;
            r->scores.n_scored = q->n_prompt - q->score_from;
            r->scores.logprobs = r->er.prompt_logprobs + at;
            r->scores.top_ids = k ? r->er.prompt_top_ids + at * k : NULL;
            r->scores.top_logprobs = k ? r->er.prompt_top_logprobs + at * k : NULL;
        }
        p->scores = &r->scores;
    }
    if (q->lora[0]) {
        /* The adapter asked for (version 6): the engine's name and version for a sample that ran; the request's
         * name and version 0 (not known) for one that never reached the engine (a failed et_add, an adapter
         * unloaded between admission and the engine thread). */
        const char *name = r->er.lora[0] ? r->er.lora : q->lora;
        p->flags |= PROTO_RESULT_LORA;
        p->lora = (proto_str){name, (uint32_t)strlen(name)};
        p->lora_version = r->er.lora[0] ? r->er.lora_version : 0;
    }
    r->bytes = proto_result_bytes(p);
    if (c->held_tail)
        c->held_tail->next = r;
    else
        c->held = r;
    c->held_tail = r;
    c->n_held++;
    c->held_bytes += r->bytes;
    return c;
}

void cl_ack(cl_table *t, cl_client *c, uint64_t ack)
{
    if (ack > c->ack_seq)
        c->ack_seq = ack;
    while (c->held && c->held->pr.seq <= ack) {
        cl_result *r = c->held;
        c->held = r->next;
        if (!c->held)
            c->held_tail = NULL;
        c->n_held--;
        c->held_bytes -= r->bytes;
        cl_req *q = r->req;
        q->n_acked++;
        free_result(r);
        /* A request is remembered (for DUPLICATE) until every sample is acked. */
        if (q->n_acked == q->n)
            drop_req(t, q);
    }
}
