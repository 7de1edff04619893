/* seq.c - sequences and the queues that hold them (see seq.h). */
#include "engine/serve/seq.h"

#include <stdlib.h>

/* ---- lists */

void seq_list_remove(seq_list *l, seq *s)
{
    if (s->prev) s->prev->next = s->next; else l->head = s->next;
    if (s->next) s->next->prev = s->prev; else l->tail = s->prev;
    s->next = s->prev = NULL;
    l->count--;
}

void seq_list_push_back(seq_list *l, seq *s)
{
    s->next = NULL;
    s->prev = l->tail;
    if (l->tail) l->tail->next = s; else l->head = s;
    l->tail = s;
    l->count++;
}

void seq_list_push_front(seq_list *l, seq *s)
{
    s->prev = NULL;
    s->next = l->head;
    if (l->head) l->head->prev = s; else l->tail = s;
    l->head = s;
    l->count++;
}

void seq_list_insert_after(seq_list *l, seq *at, seq *s)
{
    s->prev = at;
    s->next = at->next;
    if (at->next) at->next->prev = s; else l->tail = s;
    at->next = s;
    l->count++;
}

/* ---- sequences */

void seq_destroy(seq *s)
{
    if (!s)
        return;
    free(s->tokens); /* its blocks went back with kv_free_seq */
    free(s->logprobs);
    free(s->logprobs_proc);
    free(s->top_ids);
    free(s->top_lps);
    free(s->want_lps);
    free(s->spans);
    free(s->routes);
    stop_scan_free(&s->scan);
    seq_req *r = s->req;
    if (r && --r->live == 0)
        seq_req_free(r);
    free(s);
}

void seq_req_free(seq_req *r)
{
    if (!r)
        return;
    if (r->loras && r->lora_slot >= 0)
        lora_set_unpin(r->loras, r->lora_slot);
    free(r->prompt);
    free(r->bias_ids);
    free(r->bias_vals);
    free(r->prompt_lps);
    free(r->prompt_top_ids);
    free(r->prompt_top_lps);
    free(r->prompt_lps_proc);
    free(r->prompt_ranks);
    free(r->want_ids);
    free(r->prompt_want_lps);
    stop_set_free(&r->stops);
    kv_prefix_free(&r->prefix);
    for (int32_t i = 0; i < r->n_done_outs; i++)
        free(r->done_outs[i]);
    free(r->done_outs);
    free(r->done_lens);
    free(r);
}

seq *seq_new(seq_req *r, int32_t sample_idx, int32_t cap)
{
    seq *s = calloc(1, sizeof *s);
    if (!s)
        return NULL;
    s->req = r;
    r->live++;
    s->sample_idx = sample_idx;
    s->fork_n = 1;
    s->spec_rate = 1.0f; /* drafts are tried before they are judged */
    s->spec_keep_p = 1.0f;
    s->cap = cap;
    stop_scan_init(&s->scan);
    int32_t k = r->sp.logprobs_topk;
    s->tokens = malloc(sizeof(int32_t) * cap);
    s->logprobs = malloc(sizeof(float) * cap);
    if (r->sp.processed_logprobs)
        s->logprobs_proc = malloc(sizeof(float) * cap);
    if (k > 0) {
        s->top_ids = malloc(sizeof(int32_t) * (size_t)cap * k);
        s->top_lps = malloc(sizeof(float) * (size_t)cap * k);
    }
    if (r->sp.n_want > 0)
        s->want_lps = malloc(sizeof(float) * (size_t)cap * r->sp.n_want);
    if (!s->tokens || !s->logprobs || (r->sp.processed_logprobs && !s->logprobs_proc) ||
        (k > 0 && (!s->top_ids || !s->top_lps)) || (r->sp.n_want > 0 && !s->want_lps)) {
        r->live--; /* the caller still owns the request: a failed sequence never took it */
        s->req = NULL;
        seq_destroy(s);
        return NULL;
    }
    return s;
}

int seq_started(const seq *s)
{
    return s->state == SEQ_RUNNING || s->n_tokens > s->req->n_prompt || s->sample_idx > 0;
}
