/* api_int.h - what api.c, api_openai.c, api_update.c and api_read.c share: one
 * HTTP call's state, the request readers (api_read.c) and the per-sample text
 * (api.h has the module's contract). */
#ifndef RD_DAEMON_API_INT_H
#define RD_DAEMON_API_INT_H

#include <cjson/cJSON.h>
#include <stdint.h>

#include "daemon/admit.h"
#include "daemon/api.h"
#include "daemon/daemon.h"
#include "base/u64map.h"
#include "engine/text/stopstr.h"
#include "engine/text/tokenizer.h"

typedef enum { API_GENERATE, API_COMPLETIONS, API_CHAT, API_HEALTH } api_kind;

/* A refusal: HTTP status and the detail naming the field. */
typedef struct {
    int status;                 /* 0 = no error */
    char detail[600];
} api_err;

/* Sampling as the call asked, in the engine's terms. */
typedef struct {
    int32_t n;                  /* samples per prompt */
    int32_t max_tokens;         /* -1 = what the context leaves (capped by the daemon's max_tokens) */
    float temperature, top_p, min_p;
    int32_t top_k;              /* 0 = off */
    uint64_t seed;              /* 53 bits (a JSON number) */
    int has_seed;
    int ignore_eos;
    int32_t top_n;              /* alternatives per token (logprobs_topk) */
    char *stop_strs[STOP_MAX_STRS];
    int32_t n_stop_strs;
    int32_t *stop_ids;          /* [n_stop_ids] */
    int32_t n_stop_ids;
} api_params;

/* One streamed sample's progress (api_stream.c): the tokens the engine has
 * handed out while it runs, their bytes, and how much has gone out. */
typedef struct {
    int32_t n_tok, cap;         /* tokens received, capacity of the arrays */
    int32_t n_top;              /* alternatives per token */
    int32_t *ids;               /* [cap] */
    float *lps;                 /* [cap] raw log-probs */
    int32_t *top_ids;           /* [cap][n_top], or NULL */
    float *top_lps;             /* [cap][n_top], or NULL */
    char *raw;                  /* the tokens' bytes (tok_token_bytes; they add up to tok_decode) */
    size_t raw_len, raw_cap;
    size_t text_sent;           /* bytes of raw whose text has gone out (a closed UTF-8 boundary) */
    int32_t tok_sent;           /* tokens whose ids and log-probs have gone out */
    int begun;                  /* OpenAI chat: the role chunk went out */
} api_stream;

/* One prompt of a call = one engine request of n samples. */
typedef struct {
    uint64_t key;               /* engine key (API_KEY_BIT set) */
    int32_t *prompt;            /* [n_prompt] */
    int32_t n_prompt;
    int32_t n;                  /* samples */
    int32_t max_tokens;
    int32_t n_done;             /* samples back */
    eng_result *res;            /* [n], by sample index */
    uint8_t *have;              /* [n] */
    api_stream *st;             /* [n] streaming calls only */
    char *rid;                  /* SGLang: this prompt's rid (a list of rids), or NULL */
    int submitted;              /* given to the engine */
    int aborted;                /* an abort was sent */
} api_sub;

typedef struct api_call api_call;
struct api_call {
    api_call *prev, *next;      /* the API's live calls, in arrival order */
    int linked;
    api *a;
    const tok_tokenizer *tok;   /* the model's (NULL: none): text prompts and chat messages are tokenized with it */
    http_res *h;                /* NULL once finished */
    api_kind kind;
    uint64_t serial;
    int64_t created;            /* unix seconds */
    int gone;                   /* the client left (http_on_close) */
    int submitted;              /* 0 while held by a pause */
    int stream, include_usage;
    int batch;                  /* the prompt field was a list: answer a list */
    int return_logprob;         /* SGLang return_logprob; OpenAI logprobs asked */
    int return_token_ids;       /* vLLM's return_token_ids */
    int return_routes;          /* return_routed_experts (SGLang's name; also on /v1): each finished sample's
                                   routed experts, base64 of int32 [prompt + completion - 1][layers][top_k] */
    const char *top_field;      /* the field name top_n came from (for errors) */
    char *rid;                  /* SGLang rid (one string) */
    api_params p;
    int n_subs;
    api_sub *subs;              /* [n_subs] */
    int32_t n_total, n_done;    /* samples */
    void (*fmt_begin)(api_call *c);                 /* stream: headers (and a first event) */
    void (*fmt_sample)(api_call *c, int sub, int j);/* stream: one finished sample */
    void (*fmt_progress)(api_call *c, int sub, int j);/* stream: new tokens of a running sample (in st) */
    void (*fmt_done)(api_call *c);                  /* every sample in: answer or end the stream */
};

struct api {
    rd_daemon *d;
    u64map keys;                /* engine key -> api_call */
    api_call *head, *tail;
    uint64_t next_key;
    uint64_t n_calls;
    int64_t inflight;           /* subs not finished (held by a pause included) */
    int paused;
    int exiting;
    http_res *pause_wait;       /* a "wait" pause answered once nothing submitted runs */
    int frozen;                 /* a "keep" pause froze the engine (et_pause) */
    struct api_flush *flushes;  /* /flush_cache calls waiting for the engine */
    uint64_t next_flush;
};

/* What a sample's answer shows. */
typedef struct {
    char *text;                 /* malloc'd: decoded, cut at a stop string, without a stop token */
    size_t len;
    const char *finish;         /* "stop", "length", "abort" */
    int32_t matched_id;         /* the stop or EOS token, or -1 */
    int32_t matched_str;        /* index into the call's stop strings, or -1 */
} sample_view;

/* api_read.c: the readers (no server, no engine; tests/fuzz/fuzz_http_json.c runs them). A reader
 * returns 0, or -1 with e set (the first problem found: status and a detail naming the field);
 * absent fields keep their defaults. */
void api_params_init(api_params *p);
void api_params_free(api_params *p);
/* A call's kind, tokenizer and default parameters (api_call_new calls it). */
void api_call_init(api_call *c, api_kind kind, const tok_tokenizer *tok);
/* Frees what the readers put in c: the subs' prompts and rids, the subs, the rid, the parameters. */
void api_call_clear(api_call *c);
/* The body as a JSON object: the tree (cJSON_Delete it), or NULL with e set. */
cJSON *api_parse_json(const char *body, size_t len, api_err *e);
/* Route readers: the body (a JSON object) into the call. */
int api_read_generate(cJSON *root, api_call *c, api_err *e);     /* SGLang /generate */
int api_read_completions(cJSON *root, api_call *c, api_err *e);  /* /v1/completions */
int api_read_chat(cJSON *root, api_call *c, api_err *e);         /* /v1/chat/completions */
/* /abort_request: *all, or *rid (borrowed from root; NULL when absent). */
int api_read_abort(cJSON *root, int *all, const char **rid, api_err *e);
/* /pause_generation: *mode is "abort" (also for root NULL: no body), "wait", "keep" or "in_place"
 * (static strings). */
int api_read_pause(cJSON *root, const char **mode, api_err *e);
/* /update_weights_from_disk: what to push, as which version (serving + 1 unless the body says). */
typedef struct {
    char path[CFG_STR];         /* model_path */
    int64_t version;            /* 1..INT64_MAX/2 */
    uint8_t mode;               /* PROTO_MODE_CONTINUE, _DRAIN or _ABORT */
} api_update_req;
int api_read_update_disk(cJSON *root, uint64_t serving, api_update_req *u, api_err *e);
/* A sub-request in the protocol's form (what admission checks). */
proto_request api_sub_request(const api_call *c, const api_sub *s);
/* The checks of api_admit that need only the limits: top_n, then per prompt its samples and
 * max_tokens (unset: what the context leaves), not empty, adm_check, adm_fits_kv; sets each
 * sub's n and max_tokens and c->n_total. */
int api_admit_check(api_call *c, const adm_limits *lim, api_err *e);

void api_bad(api_err *e, int status, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
void api_answer_error(http_res *h, const api_err *e);
void api_answer_error_v1(http_res *h, const api_err *e);
void api_answer_json(http_res *h, int status, cJSON *doc);
cJSON *api_parse_body(const http_req *req, api_err *e);
int api_num(cJSON *o, const char *name, double *out, api_err *e);
int api_int(cJSON *o, const char *name, int64_t lo, int64_t hi, int64_t *out, api_err *e);
int api_bool(cJSON *o, const char *name, int *out, api_err *e);
int api_read_sampling(cJSON *o, const char *max_name, api_params *p, api_err *e);
int api_read_prompts(api_call *c, cJSON *v, const char *field, api_err *e);
int api_add_prompt(api_call *c, int32_t *ids, int32_t n, api_err *e);
api_call *api_call_new(api *a, http_res *h, api_kind kind);
int api_admit(api_call *c, api_err *e);
void api_refuse(api_call *c, const api_err *e);
int api_sample_view(api *a, const eng_result *r, sample_view *v);
/* api_sample_view without the UTF-8 clean-up: the exact bytes (cut at a stop string). */
int api_sample_raw(api *a, const eng_result *r, sample_view *v);
/* The clean (valid UTF-8) text of bytes [from, to) of raw, malloc'd. */
char *api_clean_slice(const char *raw, size_t from, size_t to, size_t *len);

/* api_stream.c */
/* Appends a partial result's tokens and their bytes; 0 or RD_ENOMEM. */
int api_stream_push(api *a, api_stream *st, const eng_result *r);
/* Bytes of st->raw whose text can go out now: never a possible start of a
 * stop string (the longest tail that is a prefix of one is held back), nor a
 * character that later bytes could still complete; at or after text_sent. */
size_t api_stream_safe(const api_stream *st, const api_params *p);
/* st's tokens [0, n_tok) as a result (arrays borrowed: never freed). */
eng_result api_stream_view(const api_stream *st, const eng_result *like);
void api_stream_free(api_stream *st);
char *api_token_text(api *a, int32_t id);
const char *api_token_bytes(api *a, int32_t id, size_t *n);
cJSON *api_spans_json(const eng_result *r);
/* A finished sample's routed experts as SGLang returns them: a JSON string,
 * the base64 of little-endian int32 ids [n_routes][route_layers][route_k]
 * (empty when the engine returned none); NULL when out of memory. */
cJSON *api_routes_json(const eng_result *r);
void api_send_event(api_call *c, cJSON *doc);
void api_send_done(api_call *c);

void api_route_models(http_res *h, const http_req *req, void *ud);
void api_route_completions(http_res *h, const http_req *req, void *ud);
void api_route_chat(http_res *h, const http_req *req, void *ud);
void api_route_update_disk(http_res *h, const http_req *req, void *ud);

#endif
