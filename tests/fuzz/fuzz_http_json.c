/* fuzz_http_json.c - libFuzzer target over the request readers of the HTTP
 * routes (daemon/api_read.c, api_read_rl.c, api_read_extra.c), without a server or an engine.
 *
 * The input's first byte picks the route reader (routes[byte % N]) and a
 * variant (byte / N: bit 0 no tokenizer, bit 1 a mixture-of-experts model's
 * limits); the rest is the request body, given to the reader as an exactly
 * sized heap copy (AddressSanitizer catches a read past it). The tokenizer
 * is a GGUF file's, loaded once (RD_FUZZ_MODEL, default
 * models/SmolLM2-135M-Instruct.Q4_1.gguf; build/testdata/tiny-qwen2.gguf, a
 * 300-token ChatML vocabulary, runs about twice as fast as a full one), so
 * text prompts and chat messages go through the real tokenizer and chat
 * template, and admission's vocabulary bound is that file's.
 *
 * The property, on every input: the reader either refuses, with an HTTP
 * status and a non-empty detail that is valid UTF-8 (it goes out in a JSON
 * answer), or returns a request whose every field is within its documented
 * bounds (check_call, check_update, ...). A generation call that was read is
 * then put through the checks admission makes against the limits
 * (api_admit_check: the same function api_admit calls); when those pass, what
 * would reach the engine is asserted in range: token ids below the vocabulary,
 * 1 <= n <= max_n, 1 <= max_tokens (0 only for a one-sample request that
 * scores its prompt), prompt + max_tokens within the context
 * and the KV pool, finite temperatures, top_p in (0, 1], ... Everything the
 * reader allocated is freed (LeakSanitizer is on).
 *
 * Adding a reader (a route added later): one line in routes[] below. A
 * generation route whose reader fills an api_call
 * (int api_read_X(cJSON *root, api_call *c, api_err *e)) takes
 * CALL_ROUTE(path, kind, reader, max_open) and gets check_call for free; any other
 * reader takes OTHER_ROUTE(path, fn) with a small fn that reads the body
 * (api_parse_json, or the query string), checks its own out struct's bounds
 * and frees what it made. The reader must live in a file the target links
 * without the server (daemon/api_read.c, or a file of readers only, added to
 * the fuzz rule in the Makefile). Selecting by byte % N keeps the existing
 * corpus meaningful only while N is unchanged; a new route means a fresh run.
 *
 * Build and run (make fuzz; docs/FUZZ.md has the recorded runs):
 *   python3 tests/fuzz/http_seeds.py SEEDS
 *   RD_FUZZ_MODEL=build/testdata/tiny-qwen2.gguf build/fuzz/fuzz_http_json -runs=10000000 \
 *       -max_len=4096 -rss_limit_mb=4096 -dict=tests/fuzz/http_json.dict CORPUS SEEDS */
#include "daemon/api_int.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/err.h"
#include "base/utf8.h"
#include "daemon/engine_thread.h"
#include "engine/format/gguf.h"
#include "engine/text/stopstr.h"
#include "engine/text/tokenizer.h"

#define CHECK(x)                                                                                                       \
    do {                                                                                                               \
        if (!(x)) {                                                                                                    \
            fprintf(stderr, "fuzz_http_json: %s:%d: property broken: %s\n", __FILE__, __LINE__, #x);                   \
            abort();                                                                                                   \
        }                                                                                                              \
    } while (0)

static gguf_file *g_file;          /* stays open: the tokenizer may point into it */
static tok_tokenizer *g_tok;
static int32_t g_vocab;

/* Limits as a daemon on the default model announces them (configs/test.json's
 * sizes); the MoE variant adds the ROUTES feature and a routing shape. */
static proto_hello_ok g_hello;
static adm_limits g_lim_dense, g_lim_moe;

static int route_variant;       /* the input's variant bits, for the readers below */

/* ---- the property of every refusal ---- */

static void check_refusal(const api_err *e)
{
    CHECK(e->status == 400 || e->status == 404 || e->status == 500 || e->status == 501 || e->status == 503);
    size_t n = strnlen(e->detail, sizeof e->detail);
    CHECK(n > 0 && n < sizeof e->detail);
    CHECK(utf8_invalid_at((const uint8_t *)e->detail, n) == n);
}

/* ---- generation calls ---- */

/* What a reader may return: every field within its documented bounds. */
static void check_call(const api_call *c, api_kind kind, int max_open)
{
    const api_params *p = &c->p;
    CHECK(c->kind == kind);
    CHECK(c->n_subs >= 1 && c->subs);
    CHECK(kind != API_CHAT || c->n_subs == 1);
    CHECK(c->top_field && c->top_field[0]);
    int with_rid = c->subs[0].rid != NULL;
    for (int i = 0; i < c->n_subs; i++) {
        const api_sub *s = &c->subs[i];
        CHECK(s->prompt && s->n_prompt >= 0);
        for (int32_t j = 0; j < s->n_prompt; j++)
            CHECK(s->prompt[j] >= 0);
        CHECK((s->rid != NULL) == with_rid); /* a rid list names every prompt or none */
        CHECK(!s->res && !s->have && !s->st && !s->submitted && s->key == 0);
        CHECK(s->n_want >= 0 && s->n_want <= SAMP_MAX_WANT && (s->n_want == 0 || s->want_ids));
        for (int32_t j = 0; j < s->n_want; j++)
            CHECK(s->want_ids[j] >= 0);
    }
    CHECK(!(with_rid && c->rid));
    CHECK(p->n >= 1 && p->n <= (1 << 20));
    CHECK(p->max_tokens == -1 || (p->max_tokens >= 0 && p->max_tokens <= (1 << 30)));
    CHECK(max_open || p->max_tokens >= 0); /* /generate and /v1/completions have defaults */
    /* scoring: SGLang's logprob_start_len with return_logprob, or vLLM's prompt_logprobs (echo's included) */
    CHECK(!c->score || (c->score_from >= 0 && (c->return_logprob || c->prompt_lp >= 0)));
    CHECK(c->prompt_lp >= -1 && c->prompt_lp <= 20 && (c->prompt_lp < 0 || c->score));
    CHECK(!c->echo || !c->stream);
    CHECK(p->top_k >= 0 && p->top_k <= (1 << 30));
    CHECK(p->top_n >= 0 && p->top_n <= (1 << 20));
    CHECK(!p->has_seed || p->seed < ((uint64_t)1 << 53));
    CHECK(p->has_seed == 0 || p->has_seed == 1);
    CHECK(p->ignore_eos == 0 || p->ignore_eos == 1);
    CHECK(!isnan(p->temperature) && !isnan(p->top_p) && !isnan(p->min_p)); /* JSON has no NaN */
    CHECK(p->n_stop_strs >= 0 && p->n_stop_strs <= STOP_MAX_STRS);
    for (int i = 0; i < p->n_stop_strs; i++) {
        CHECK(p->stop_strs[i]);
        size_t n = strlen(p->stop_strs[i]);
        CHECK(n >= 1 && n <= STOP_MAX_LEN);
    }
    CHECK(p->n_stop_ids >= 0 && (p->n_stop_ids == 0 || p->stop_ids));
    for (int32_t i = 0; i < p->n_stop_ids; i++)
        CHECK(p->stop_ids[i] >= 0);
    const int flags[] = {c->stream, c->include_usage, c->batch, c->return_logprob, c->return_token_ids,
                         c->return_routes};
    for (size_t i = 0; i < sizeof flags / sizeof flags[0]; i++)
        CHECK(flags[i] == 0 || flags[i] == 1);
    CHECK(kind == API_GENERATE || !c->batch);
    CHECK(kind != API_GENERATE || (!c->include_usage && !c->return_token_ids));
}

/* What admission lets through to the engine. */
static void check_admitted(const api_call *c, const adm_limits *lim)
{
    const proto_hello_ok *h = lim->lim;
    const api_params *p = &c->p;
    CHECK(isfinite(p->temperature) && p->temperature >= 0);
    CHECK(p->top_p > 0 && p->top_p <= 1);
    CHECK(p->min_p >= 0 && p->min_p <= 1);
    CHECK(p->top_k >= 0);
    CHECK((uint32_t)p->top_n <= h->max_logprobs_topk);
    CHECK((uint32_t)p->n_stop_ids <= h->max_stop_ids);
    for (int32_t i = 0; i < p->n_stop_ids; i++)
        CHECK((uint32_t)p->stop_ids[i] < h->vocab_size);
    CHECK(!c->return_routes || (h->features & PROTO_FEATURE_ROUTES));
    int64_t total = 0;
    for (int i = 0; i < c->n_subs; i++) {
        const api_sub *s = &c->subs[i];
        CHECK(s->n == p->n && s->n >= 1 && (uint32_t)s->n <= h->max_n);
        CHECK(s->max_tokens >= (c->score ? 0 : 1) && (uint32_t)s->max_tokens <= h->max_tokens);
        CHECK(s->max_tokens > 0 || s->n == 1);
        CHECK(!c->score || c->score_from <= s->n_prompt);
        CHECK(p->max_tokens < 0 || s->max_tokens == p->max_tokens);
        CHECK(s->n_prompt >= 1 && (uint32_t)s->n_prompt <= h->max_prompt_tokens);
        CHECK((uint64_t)s->n_prompt + (uint64_t)s->max_tokens <= h->max_context);
        uint64_t blocks = ((uint64_t)s->n_prompt + (uint64_t)s->max_tokens + (uint64_t)lim->block_size - 1) /
                          (uint64_t)lim->block_size;
        CHECK(blocks <= (uint64_t)lim->kv_blocks_total);
        for (int32_t j = 0; j < s->n_prompt; j++)
            CHECK((uint32_t)s->prompt[j] < h->vocab_size);
        total += s->n;
    }
    CHECK(c->n_total == total);
}

typedef int (*call_reader)(cJSON *root, api_call *c, api_err *e);

static void run_call(api_kind kind, call_reader read, int max_open, const char *body, size_t len)
{
    api_err e = {0};
    cJSON *root = api_parse_json(body, len, &e);
    if (!root) {
        check_refusal(&e);
        return;
    }
    api_call c;
    memset(&c, 0, sizeof c);
    api_call_init(&c, kind, (route_variant & 1) ? NULL : g_tok);
    int rc = read(root, &c, &e);
    cJSON_Delete(root); /* the handlers free the tree before admission: nothing read may point into it */
    if (rc) {
        CHECK(rc == -1);
        check_refusal(&e);
    } else {
        CHECK(e.status == 0);
        check_call(&c, kind, max_open);
        const adm_limits *lim = (route_variant & 2) ? &g_lim_moe : &g_lim_dense;
        if (api_admit_check(&c, lim, &e))
            check_refusal(&e);
        else
            check_admitted(&c, lim);
    }
    api_call_clear(&c);
    CHECK(!c.subs && !c.rid && c.p.n_stop_strs == 0 && !c.p.stop_ids);
}

/* ---- control routes ---- */

static void run_abort(const char *body, size_t len)
{
    api_err e = {0};
    cJSON *root = api_parse_json(body, len, &e);
    if (!root) {
        check_refusal(&e);
        return;
    }
    int all = -1;
    const char *rid = (const char *)1;
    if (api_read_abort(root, &all, &rid, &e)) {
        check_refusal(&e);
    } else {
        CHECK(e.status == 0);
        CHECK(all == 0 || all == 1);
        CHECK(all || rid); /* what the handler dereferences */
        if (rid)
            (void)strlen(rid); /* a string inside the tree */
    }
    cJSON_Delete(root);
}

static void run_pause(const char *body, size_t len)
{
    api_err e = {0};
    cJSON *root = NULL;
    if (len && !(root = api_parse_json(body, len, &e))) { /* the handler reads no body when it is empty */
        check_refusal(&e);
        return;
    }
    const char *mode = NULL;
    if (api_read_pause(root, &mode, &e)) {
        check_refusal(&e);
    } else {
        CHECK(e.status == 0 && mode);
        CHECK(!strcmp(mode, "abort") || !strcmp(mode, "wait") || !strcmp(mode, "keep") || !strcmp(mode, "in_place") ||
              !strcmp(mode, "retract"));
    }
    cJSON_Delete(root);
}

static void run_update(const char *body, size_t len)
{
    api_err e = {0};
    cJSON *root = api_parse_json(body, len, &e);
    if (!root) {
        check_refusal(&e);
        return;
    }
    uint64_t serving = (route_variant & 2) ? 41 : 0;
    api_update_req u;
    if (api_read_update_disk(root, serving, &u, &e)) {
        check_refusal(&e);
    } else {
        CHECK(e.status == 0);
        size_t n = strnlen(u.path, sizeof u.path);
        CHECK(n >= 1 && n < sizeof u.path);
        CHECK(u.version >= 1 && u.version <= INT64_MAX / 2);
        CHECK(u.mode == PROTO_MODE_CONTINUE || u.mode == PROTO_MODE_DRAIN || u.mode == PROTO_MODE_ABORT);
    }
    cJSON_Delete(root);
}

/* ---- vLLM's and SGLang's RL routes (api_read_rl.c) ---- */

/* A body reader's frame: the tree, or the refusal of a body that is no JSON object. */
static cJSON *parse_or_check(const char *body, size_t len)
{
    api_err e = {0};
    cJSON *root = api_parse_json(body, len, &e);
    if (!root)
        check_refusal(&e);
    return root;
}

/* The body as the query string of the URL (the HTTP layer hands the part after '?', NUL-terminated). */
static char *as_query(const char *body, size_t len)
{
    char *q = malloc(len + 1);
    if (!q)
        abort();
    memcpy(q, body, len);
    q[len] = 0;
    return q;
}

static void check_result(int rc, const api_err *e)
{
    CHECK(rc == 0 || rc == -1);
    if (rc)
        check_refusal(e);
    else
        CHECK(e->status == 0);
}

static void run_vllm_pause(const char *body, size_t len)
{
    char *q = as_query(body, len);
    api_err e = {0};
    api_vllm_pause p = {0};
    int rc = api_read_vllm_pause(q, &p, &e);
    check_result(rc, &e);
    if (!rc) {
        CHECK(p.mode && (!strcmp(p.mode, "abort") || !strcmp(p.mode, "wait") || !strcmp(p.mode, "keep")));
        CHECK(p.clear == 0 || p.clear == 1);
    }
    e = (api_err){0};
    check_result(api_read_reset_prefix(q, &e), &e); /* the same kind of query, other names */
    free(q);
}

static void run_sleep(const char *body, size_t len)
{
    char *q = as_query(body, len);
    api_err e = {0};
    int abort_first = -1, tags = -1;
    int rc = api_read_sleep(q, &abort_first, &e);
    check_result(rc, &e);
    CHECK(abort_first == 0 || abort_first == 1);
    e = (api_err){0};
    rc = api_read_wake_up(q, &tags, &e);
    check_result(rc, &e);
    CHECK(rc || (tags >= 1 && tags <= (ET_MEM_WEIGHTS | ET_MEM_KV)));
    free(q);
}

static void run_abort_ids(const char *body, size_t len)
{
    cJSON *root = parse_or_check(body, len);
    if (!root)
        return;
    api_err e = {0};
    cJSON *ids = (cJSON *)1;
    int rc = api_read_abort_ids(root, &ids, &e);
    check_result(rc, &e);
    if (!rc && ids) {
        CHECK(cJSON_IsArray(ids) && ids->child);
        for (cJSON *x = ids->child; x; x = x->next)
            CHECK(cJSON_IsString(x) && x->valuestring); /* what the handler passes to api_abort_rid */
    }
    cJSON_Delete(root);
}

static void run_tokenize(const char *body, size_t len)
{
    cJSON *root = parse_or_check(body, len);
    if (!root)
        return;
    api_err e = {0};
    api_tokenize_req t;
    int rc = api_read_tokenize(root, (route_variant & 1) ? NULL : g_tok, &t, &e);
    cJSON_Delete(root);
    check_result(rc, &e);
    if (rc) {
        CHECK(!t.ids && t.n == 0);
        return;
    }
    CHECK(t.strs == 0 || t.strs == 1);
    CHECK(t.n == 0 || t.ids);
    for (size_t i = 0; i < t.n; i++)
        CHECK(t.ids[i] >= 0 && t.ids[i] < g_vocab);
    free(t.ids);
}

static void run_detokenize(const char *body, size_t len)
{
    cJSON *root = parse_or_check(body, len);
    if (!root)
        return;
    api_err e = {0};
    int32_t *ids = (int32_t *)1, n = -1;
    int rc = api_read_detokenize(root, !(route_variant & 1), (uint32_t)g_vocab, &ids, &n, &e);
    cJSON_Delete(root);
    check_result(rc, &e);
    if (rc) {
        CHECK(!ids && n == 0);
        return;
    }
    CHECK(ids && n >= 0);
    for (int32_t i = 0; i < n; i++)
        CHECK(ids[i] >= 0 && ids[i] < g_vocab);
    /* what the handler does next: the ids' text, made valid UTF-8 for the JSON answer */
    char *raw = NULL;
    size_t raw_len = 0, clean_len = 0;
    if (!tok_decode(g_tok, ids, (size_t)n, &raw, &raw_len)) {
        char *text = utf8_clean(raw, raw_len, &clean_len);
        CHECK(text && utf8_invalid_at((const uint8_t *)text, clean_len) == clean_len);
        free(text);
    }
    free(raw);
    free(ids);
}

static void run_vllm_update(const char *body, size_t len)
{
    cJSON *root = parse_or_check(body, len);
    if (!root)
        return;
    api_err e = {0};
    api_vllm_update u;
    uint64_t serving = (route_variant & 2) ? (uint64_t)(INT64_MAX / 2) : 0; /* the largest version there is */
    int rc = api_read_vllm_update(root, serving, &u, &e);
    check_result(rc, &e);
    if (!rc) {
        CHECK(u.path && u.path[0] && strlen(u.path) < CFG_STR);
        CHECK(u.version >= 1 && u.version <= INT64_MAX / 2);
        CHECK(u.prime == 0 || u.prime == 1);
    }
    e = (api_err){0};
    check_result(api_read_init_transfer(root, &e), &e); /* the same body to the transfer's first phase */
    cJSON_Delete(root);
}

static void run_mem_tags(const char *body, size_t len)
{
    cJSON *root = NULL;
    api_err e = {0};
    if (len && !(root = api_parse_json(body, len, &e))) { /* the handler reads no body when it is empty */
        check_refusal(&e);
        return;
    }
    int tags = -1;
    int rc = api_read_mem_tags(root, &tags, &e);
    check_result(rc, &e);
    CHECK(rc || (tags >= 0 && tags <= (ET_MEM_WEIGHTS | ET_MEM_KV)));
    cJSON_Delete(root);
}

/* api_read_extra.c: the model a /v1 call names, against the names a daemon serves (its served name, the
 * file's base name, the path): served or refused (404 for an unknown name), never anything else. */
static void run_model(const char *body, size_t len)
{
    cJSON *root = parse_or_check(body, len);
    if (!root)
        return;
    static const char *const names[] = {"served/name", "tiny-qwen2", "build/testdata/tiny-qwen2.gguf"};
    api_err e = {0};
    int rc = api_read_model(root, names, (route_variant & 1) ? 1 : 3, &e);
    check_result(rc, &e);
    CHECK(!rc || e.status == 400 || e.status == 404);
    cJSON *m = cJSON_GetObjectItemCaseSensitive(root, "model");
    if (!rc && m && cJSON_IsString(m) && m->valuestring[0]) { /* served: it is one of the names */
        int found = 0;
        for (int i = 0; i < ((route_variant & 1) ? 1 : 3); i++)
            found |= !strcmp(m->valuestring, names[i]);
        CHECK(found);
    }
    cJSON_Delete(root);
}

/* /inference/v1/generate's routed-experts ask. */
static void run_routes_ask(const char *body, size_t len)
{
    cJSON *root = parse_or_check(body, len);
    if (!root)
        return;
    api_err e = {0};
    api_routes_ask r = {-1, -1};
    int rc = api_read_routes_ask(root, &r, &e);
    check_result(rc, &e);
    if (!rc)
        CHECK((r.ask == 0 || r.ask == 1) && r.start >= 0);
    cJSON_Delete(root);
}

/* SGLang's /v1/loads query. */
static void run_loads(const char *body, size_t len)
{
    char *q = as_query(body, len);
    api_err e = {0};
    api_loads_req r = {0};
    int rc = api_read_loads(q, &r, &e);
    check_result(rc, &e);
    if (!rc)
        CHECK(r.sections >= 1 && r.sections <= MX_LOADS_ALL && (r.prometheus == 0 || r.prometheus == 1));
    free(q);
}

/* ---- the table: one line per route reader ---- */

typedef struct {
    const char *path;                           /* the route, for the record */
    api_kind kind;                              /* call readers */
    call_reader read;                           /* a reader that fills an api_call, or NULL */
    int max_open;                               /* call readers: max_tokens may stay -1 (what the context leaves) */
    void (*run)(const char *body, size_t len);  /* any other reader, with its own checks */
} route;

#define CALL_ROUTE(path, kind, reader, max_open) {path, kind, reader, max_open, NULL}
#define OTHER_ROUTE(path, fn) {path, API_GENERATE, NULL, 0, fn}

static const route routes[] = {
    CALL_ROUTE("/generate", API_GENERATE, api_read_generate, 0),
    CALL_ROUTE("/v1/completions", API_COMPLETIONS, api_read_completions, 0),
    CALL_ROUTE("/v1/chat/completions", API_CHAT, api_read_chat, 1),
    OTHER_ROUTE("/abort_request", run_abort),
    OTHER_ROUTE("/pause_generation", run_pause),
    OTHER_ROUTE("/update_weights_from_disk", run_update),
    CALL_ROUTE("/inference/v1/generate", API_COMPLETIONS, api_read_generate_tokens, 1),
    OTHER_ROUTE("/pause?, /reset_prefix_cache?", run_vllm_pause),
    OTHER_ROUTE("/sleep?, /wake_up?", run_sleep),
    OTHER_ROUTE("/abort_requests", run_abort_ids),
    OTHER_ROUTE("/tokenize", run_tokenize),
    OTHER_ROUTE("/detokenize", run_detokenize),
    OTHER_ROUTE("/update_weights, /init_weight_transfer_engine", run_vllm_update),
    OTHER_ROUTE("/release_memory_occupation", run_mem_tags),
    OTHER_ROUTE("/v1/*, /inference/v1/generate, /tokenize: model", run_model),
    OTHER_ROUTE("/inference/v1/generate: routed experts", run_routes_ask),
    OTHER_ROUTE("/v1/loads?", run_loads),
};
#define N_ROUTES (sizeof routes / sizeof routes[0])

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    const char *path = getenv("RD_FUZZ_MODEL");
    if (!path || !path[0])
        path = "models/SmolLM2-135M-Instruct.Q4_1.gguf";
    if (gguf_open(path, &g_file) || tok_load(g_file, &g_tok)) {
        fprintf(stderr, "fuzz_http_json: cannot load the tokenizer of %s (set RD_FUZZ_MODEL): %s\n", path,
                rd_errmsg());
        exit(2);
    }
    g_vocab = tok_vocab_size(g_tok);
    g_hello = (proto_hello_ok){
        .version = 2,
        .flags = PROTO_HELLO_OK_TEXT | PROTO_HELLO_OK_CHAT,
        .vocab_size = (uint32_t)g_vocab,
        .max_context = 8192,
        .max_prompt_tokens = 8191,
        .max_message_bytes = 4u << 20,
        .max_n = 64,
        .max_requests_per_submit = 64,
        .max_tokens = 256,
        .max_stop_ids = 15,
        .max_logprobs_topk = 20,
        .eos_id = tok_eos(g_tok),
    };
    static proto_hello_ok moe;
    moe = g_hello;
    moe.features = PROTO_FEATURE_ROUTES;
    g_lim_dense = (adm_limits){.lim = &g_hello, .block_size = 16, .kv_blocks_total = 512, .max_queued_requests = 64};
    g_lim_moe = g_lim_dense;
    g_lim_moe.lim = &moe;
    g_lim_moe.route_layers = 4;
    g_lim_moe.route_k = 4;
    g_lim_moe.route_width = 1;
    fprintf(stderr, "fuzz_http_json: %zu route readers; tokenizer of %s (%d tokens)\n", N_ROUTES, path, g_vocab);
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    const route *r = &routes[data[0] % N_ROUTES];
    route_variant = data[0] / N_ROUTES;
    size_t len = size - 1;
    char *body = malloc(len ? len : 1);
    if (!body)
        abort();
    memcpy(body, data + 1, len);
    if (r->read)
        run_call(r->kind, r->read, r->max_open, body, len);
    else
        r->run(body, len);
    free(body);
    return 0;
}
