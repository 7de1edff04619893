/* api_int.h - what the HTTP API's files share (api.h has the module's
 * contract): one HTTP call's state and the functions of each file. The files,
 * top to bottom (each calls only files below it; make layers checks that no
 * files call each other in a circle):
 *
 *   api.c          the route table, the API's life, SGLang's /generate family
 *   api_openai.c, api_sglang.c, api_vllm.c, api_update.c, api_manifest.c
 *                  the other routes (api_vllm.c calls api_update.c, which calls
 *                  api_sglang.c)
 *   api_call.c     a call's life: admission, results, abort, pause, flush
 *   api_stream.c   a streamed sample's progress
 *   api_answer.c   answers, the body as JSON, server-sent events, a sample's text
 *   api_read.c, api_read_rl.c   the request readers (no server, no engine)
 *   api_sampling.c the sampling table's fields
 *   api_field.c    a field's reader: numbers, integers, booleans, the refusal */
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
    float repetition_penalty;   /* 1 = off */
    float frequency_penalty, presence_penalty; /* 0 = off */
    int32_t min_tokens;         /* 0 = off */
    uint64_t seed;              /* 53 bits (a JSON number) */
    int has_seed;
    int ignore_eos;
    int keep_stop;              /* the stop token's text, or the matched stop string, stays in the text: 0 no,
                                   API_KEEP_WHOLE (SGLang's no_stop_trim: all of the token that completed the
                                   string) or API_KEEP_THROUGH (vLLM's include_stop_str_in_output: the text
                                   ends with the string) */
    int skip_special;           /* skip_special_tokens: control tokens add no text */
    int32_t top_n;              /* alternatives per token (logprobs_topk) */
    int processed;              /* the answers carry processed log-probs (the daemon's logprobs_mode) */
    char *stop_strs[STOP_MAX_STRS];
    int32_t n_stop_strs;
    int32_t *stop_ids;          /* [n_stop_ids] */
    int32_t n_stop_ids;
    int32_t n_bias;             /* logit_bias entries */
    int32_t *bias_ids;          /* [n_bias] */
    float *bias_vals;           /* [n_bias] */
} api_params;

enum { API_KEEP_WHOLE = 1, API_KEEP_THROUGH = 2 };

/* Where a sampling field is read (daemon/sampling.def's DOORS). */
enum {
    SD_SGL = 1,                 /* /generate sampling_params */
    SD_SGLT = 2,                /* /generate top level */
    SD_VSP = 4,                 /* /inference/v1/generate sampling_params */
    SD_CMPL = 8,                /* /v1/completions top level */
    SD_CHAT = 16,               /* /v1/chat/completions top level */
};
/* api_sampling.c: reads the sampling table's fields of door from o (prefix goes before each name in
 * errors: "sampling_params." or ""). At SD_SGL a name the table does not list for it is refused, as
 * SGLang refuses it; elsewhere it is left to the route (vLLM ignores unknown fields). */
int api_read_fields(cJSON *o, unsigned door, const char *prefix, api_params *p, api_err *e);

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
    size_t shown_sent;          /* bytes of the shown text (without control tokens' under skip_special_tokens)
                                   that have gone out: OpenAI deltas */
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
    int32_t n_want;             /* SGLang's token_ids_logprob for this prompt: ids whose log-probs every output
                                   token and scored prompt position report */
    int32_t *want_ids;          /* [n_want], or NULL */
    char *lora;                 /* SGLang's lora_path for this prompt (one per prompt), or NULL: the call's */
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
    int text_in_logprobs;       /* return_text_in_logprobs: each [logprob, id, text] names its token */
    int score;                  /* SGLang's logprob_start_len >= 0 with return_logprob: the prompt's tokens are
                                   scored from score_from on (meta_info.input_token_logprobs) */
    int32_t score_from;
    int32_t prompt_lp;          /* vLLM's prompt_logprobs (and /v1/completions' echo with logprobs): -1 none, else
                                   alternatives per prompt position beside the prompt token (api_prompt_logprobs_json);
                                   the engine computes max(top_n, prompt_lp) and api_on_result trims each side */
    int echo;                   /* /v1/completions echo: each choice's text (and logprobs) start with the prompt's */
    char *rid;                  /* SGLang rid (one string) */
    char *lora;                 /* the LoRA adapter its prompts run under ("model" naming one, or /generate's
                                   lora_path as one name), or NULL: the base model */
    api_params p;
    int n_subs;
    api_sub *subs;              /* [n_subs] */
    int32_t n_total, n_done;    /* samples */
    int routes_compact;         /* /inference/v1/generate: each finished choice's routed_experts in prime-rl's
                                   compact form ({data, shape, start, dtype}), from position routes_start */
    int32_t routes_start;       /* vLLM's routed_experts_prompt_start: prompt positions left out */
    void (*fmt_begin)(api_call *c);                 /* stream: headers (and a first event) */
    void (*fmt_sample)(api_call *c, int sub, int j);/* stream: one finished sample */
    void (*fmt_progress)(api_call *c, int sub, int j);/* stream: new tokens of a running sample (in st) */
    void (*fmt_done)(api_call *c);                  /* every sample in: answer or end the stream */
};

/* A pause in "wait" mode held until no submitted HTTP call runs: one slot per
 * route that waits so (vLLM's /pause?mode=wait, SGLang's /pause_generation),
 * answered in this order. */
enum { API_WAIT_VLLM, API_WAIT_SGLANG, API_WAITS };
typedef struct {
    http_res *h;                /* NULL: none waits */
    void (*answer)(api *a, http_res *h, int arg); /* the route's answer, when nothing runs */
    int arg;
} api_wait;

struct api {
    rd_daemon *d;
    u64map keys;                /* engine key -> api_call */
    api_call *head, *tail;
    uint64_t next_key;
    uint64_t n_calls;
    int64_t inflight;           /* subs not finished (held by a pause included) */
    int paused;
    int exiting;
    api_wait waits[API_WAITS];  /* "wait" pauses, answered once nothing submitted runs (api_wait_begin) */
    int frozen;                 /* a "keep" pause froze the engine (et_pause) */
    struct api_flush *flushes;  /* /flush_cache calls waiting for the engine */
    uint64_t next_flush;
    /* api_sglang.c: memory release and the weights' source */
    struct api_mem *mems;       /* releases / resumes waiting for the engine thread */
    struct api_lora_op *lora_ops; /* adapter loads / unloads waiting for the engine thread (api_lora.c) */
    int mem_released;           /* ET_MEM_WEIGHTS | ET_MEM_KV now released */
    char *src_path;             /* the file the serving weights came from (model, or the last update from disk) */
    uint64_t src_version;       /* the version they were when src_path was noted */
    int src_ok;
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
/* /pause_generation: *mode is "abort" (also for root NULL: no body), "wait", "keep", "in_place" or
 * "retract" (static strings). */
int api_read_pause(cJSON *root, const char **mode, api_err *e);
/* /update_weights_from_disk: what to push, as which version (serving + 1 unless the body says). */
typedef struct {
    char path[CFG_STR];         /* model_path */
    int64_t version;            /* 1..INT64_MAX/2 */
    uint8_t mode;               /* PROTO_MODE_CONTINUE, _DRAIN or _ABORT */
    int flush_cache;            /* SGLang's flush_cache (default 1): drop the prefix cache once it serves */
    int keep_pause;             /* SGLang's keep_pause: stay paused in place after the update */
    uint8_t serve_dtype;        /* PROTO_SERVE_* ("serve_dtype": "as_pushed" | "q8_0" | "q4_k" | "fp8"); 0: the daemon's config */
} api_update_req;
int api_read_update_disk(cJSON *root, uint64_t serving, api_update_req *u, api_err *e);
/* api_read_rl.c: the readers of vLLM's and SGLang's RL routes (same contract). */
/* The value of name in query ("a=b&c=d"), percent-decoded into out: 1 found, 0 absent, -1 longer
 * than cap - 1 bytes. */
int api_query_get(const char *query, const char *name, char *out, size_t cap);
/* A boolean query parameter as pydantic reads one; keeps *out when absent. */
int api_query_bool(const char *query, const char *name, int *out, api_err *e);
/* vLLM's POST /pause?mode=&clear_cache=&wait_for_inflight_requests= */
typedef struct {
    const char *mode;           /* "abort" (the default), "wait" or "keep" (static strings) */
    int clear;                  /* clear_cache (default 1) */
} api_vllm_pause;
int api_read_vllm_pause(const char *query, api_vllm_pause *p, api_err *e);
int api_read_reset_prefix(const char *query, api_err *e);  /* /reset_prefix_cache's query */
/* /abort_requests: *ids the non-empty list of request_ids (borrowed from root), or NULL = every call. */
int api_read_abort_ids(cJSON *root, cJSON **ids, api_err *e);
/* /tokenize: a prompt (add_special_tokens) or chat messages, tokenized with tok (NULL: refused). */
typedef struct {
    int32_t *ids;               /* [n], malloc'd (free it) */
    size_t n;
    int strs;                   /* return_token_strs */
} api_tokenize_req;
int api_read_tokenize(cJSON *root, const tok_tokenizer *tok, api_tokenize_req *t, api_err *e);
/* /detokenize: tokens, each in 0..vocab-1, into *ids (malloc'd, [*n]). */
int api_read_detokenize(cJSON *root, int has_tok, uint32_t vocab, int32_t **ids, int32_t *n, api_err *e);
/* /inference/v1/generate (token ids in, kind API_COMPLETIONS): fills c as the other call readers do. */
int api_read_generate_tokens(cJSON *root, api_call *c, api_err *e);
/* vLLM's /update_weights {"update_info": {"path"}} or prime-rl's {"weight_dir"}. */
typedef struct {
    const char *path;           /* borrowed from root; shorter than CFG_STR */
    int64_t version;            /* weight_version, or serving + 1; 1..INT64_MAX/2 */
    int prime;                  /* the prime-rl form (its answer differs) */
} api_vllm_update;
int api_read_vllm_update(cJSON *root, uint64_t serving, api_vllm_update *u, api_err *e);
int api_read_init_transfer(cJSON *root, api_err *e);       /* /init_weight_transfer_engine */
/* SGLang's release / resume_memory_occupation tags (root NULL: no body): ET_MEM_WEIGHTS | ET_MEM_KV. */
int api_read_mem_tags(cJSON *root, int *tags, api_err *e);
int api_read_sleep(const char *query, int *abort_first, api_err *e);   /* vLLM's /sleep?level=&mode= */
int api_read_wake_up(const char *query, int *tags, api_err *e);        /* /wake_up?tags=: none = both */
/* What rolloutd offers instead of NCCL or CUDA IPC (vLLM's transfer routes' 501 answers). */
#define API_NO_COLLECTIVES                                                                                      \
    "rolloutd has no NCCL or CUDA IPC weight transfer; send the weights over its learner socket (the NNG push: " \
    "rolloutctl push-weights, or the Python Client.push_weights), or write them to a directory and POST "      \
    "/update_weights {\"update_info\": {\"path\": DIR}}"
/* api_read_extra.c: what routes read beside their main reader (same contract). */
/* A call's "model": absent, null or "" is the served model (vLLM's _is_model_supported); a string must
 * equal one of names[0..n_names) (the served name, the file's base name, the model path), else 404 with
 * vLLM's words "The model `X` does not exist."; another type is 400. */
int api_read_model(cJSON *root, const char *const *names, int n_names, api_err *e);
/* /inference/v1/generate: whether the request asks for routed experts (top-level return_routed_experts)
 * and vLLM's sampling_params.routed_experts_prompt_start (positions before it left out; 0..INT32_MAX). */
typedef struct {
    int ask;                    /* return_routed_experts: true */
    int32_t start;              /* routed_experts_prompt_start (0 when absent) */
} api_routes_ask;
int api_read_routes_ask(cJSON *root, api_routes_ask *r, api_err *e);
/* SGLang's GET /v1/loads?include=core,memory&dp_rank=0&format=prometheus */
typedef struct {
    unsigned sections;          /* MX_LOADS_* (metrics.h); every one when include is absent */
    int prometheus;             /* format=prometheus (anything else: JSON) */
} api_loads_req;
int api_read_loads(const char *query, api_loads_req *r, api_err *e);
/* A sub-request in the protocol's form (what admission checks). */
proto_request api_sub_request(const api_call *c, const api_sub *s);
/* The checks of api_admit that need only the limits: top_n, then per prompt its samples and
 * max_tokens (unset: what the context leaves), not empty, adm_check, adm_fits_kv; sets each
 * sub's n and max_tokens and c->n_total. */
int api_admit_check(api_call *c, const adm_limits *lim, api_err *e);

/* api_field.c: a field's reader. api_bad records a refusal (the first one
 * found is kept); a reader returns 0 when the field is absent or null, 1 when
 * read, -1 when refused (reported). */
void api_bad(api_err *e, int status, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
int api_num(cJSON *o, const char *name, double *out, api_err *e);
int api_int(cJSON *o, const char *name, int64_t lo, int64_t hi, int64_t *out, api_err *e);
int api_bool(cJSON *o, const char *name, int *out, api_err *e);
/* api_read.c: prompts. */
int api_read_prompts(api_call *c, cJSON *v, const char *field, api_err *e);
/* vLLM's prompt_logprobs (o's field name: null, or 0..20 alternatives; -1, the whole vocabulary, refused): the
 * call scores its prompts from position 0 (c->score, c->prompt_lp). */
void api_read_prompt_logprobs(cJSON *o, const char *name, api_call *c, api_err *e);
int api_add_prompt(api_call *c, int32_t *ids, int32_t n, api_err *e);
/* messages (chat turns) rendered in the model's chat format as one prompt of c. */
void api_read_messages(api_call *c, cJSON *root, api_err *e);

/* api_answer.c: answers, the body, streams, a sample's text. */
void api_answer_error(http_res *h, const api_err *e);     /* SGLang's shape */
void api_answer_error_v1(http_res *h, const api_err *e);  /* OpenAI's shape (the /v1 routes) */
void api_answer_json(http_res *h, int status, cJSON *doc);  /* doc is freed */
cJSON *api_ok_doc(void);                                  /* SGLang's {"success": true} */
cJSON *api_parse_body(const http_req *req, api_err *e);
void api_send_event(api_call *c, cJSON *doc);             /* "data: <doc>" (doc is freed) */
void api_send_done(api_call *c);                          /* "data: [DONE]", and the stream ends */
int api_sample_view(api *a, const eng_result *r, sample_view *v);
/* api_sample_view without the UTF-8 clean-up: the exact bytes (cut at a stop string). */
int api_sample_raw(api *a, const eng_result *r, sample_view *v);
/* api_sample_raw with p's keep_stop (no_stop_trim, include_stop_str_in_output) and skip_special_tokens
 * (p NULL: neither). */
int api_sample_text(api *a, const eng_result *r, sample_view *v, const api_params *p);
/* The clean (valid UTF-8) text of bytes [from, to) of raw, malloc'd. */
char *api_clean_slice(const char *raw, size_t from, size_t to, size_t *len);
char *api_token_text(api *a, int32_t id);
const char *api_token_bytes(api *a, int32_t id, size_t *n);
cJSON *api_spans_json(const eng_result *r);
/* A finished sample's routed experts as SGLang returns them: a JSON string,
 * the base64 of little-endian int32 ids [n_routes][route_layers][route_k]
 * (empty when the engine returned none); NULL when out of memory. */
cJSON *api_routes_json(const eng_result *r);
/* vLLM's prompt_logprobs of a scored result: one entry per prompt position, null at 0 (and where unscored),
 * else {"<id>": {"logprob", "rank", "decoded_token"}} with the prompt token first, then the call's
 * prompt_lp most likely tokens (a token listed once). */
cJSON *api_prompt_logprobs_json(api_call *c, const eng_result *r);
/* A log-prob as the answers write it: -inf (a scored token processed_logprobs drops) as vLLM's -9999.0, which JSON
 * can carry. */
double api_lp_value(float lp);

/* api_stream.c */
/* Appends a partial result's tokens and their bytes; 0 or RD_ENOMEM. */
int api_stream_push(api *a, api_stream *st, const eng_result *r);
/* Bytes of st->raw whose text can go out now: never a possible start of a
 * stop string (the longest tail that is a prefix of one is held back), nor a
 * character that later bytes could still complete; at or after text_sent. */
size_t api_stream_safe(const api_stream *st, const api_params *p);
/* Bytes [0, safe) of st's text without those of control tokens (skip_special_tokens), malloc'd:
 * st->raw is the tokens' bytes back to back, so the final text (api_sample_text) starts with it. */
char *api_stream_shown(api *a, const api_stream *st, size_t safe, size_t *len);
/* st's tokens [0, n_tok) as a result (arrays borrowed: never freed). */
eng_result api_stream_view(const api_stream *st, const eng_result *like);
void api_stream_free(api_stream *st);

/* The model a call names (api_read_model) against the served names and the resident LoRA adapters
 * (*lora, when not NULL, gets the adapter's name, valid until the table changes, or NULL for the base
 * model; with lora NULL an adapter's name is accepted as the base model's: /tokenize); on a refusal answers h as vLLM does (404 {"error":
 * {"message", "type": "NotFoundError", "param": "model", "code": 404}}) and returns -1. */
int api_check_model(api *a, cJSON *root, http_res *h, const char **lora);
/* api_call.c: a call's life, abort, pause, the prefix-cache flush. */
api_call *api_call_new(api *a, http_res *h, api_kind kind);
int api_admit(api_call *c, api_err *e);
void api_refuse(api_call *c, const api_err *e);
void api_call_free(api_call *c);                /* a call never admitted */
int api_abort_rid(api *a, const char *rid);     /* /abort_request {"rid"} (NULL: every call): how many were aborted */
void api_set_frozen(api *a, int frozen);        /* pause mode keep: et_pause, once per change */
/* A pause that freezes (in_place) or retracts (retract: running sequences go
 * back to the queue, KV dropped): sets the API's pause state as
 * /pause_generation does. */
void api_pause_mode(api *a, const char *mode);
void api_resume_held(api *a);                   /* /continue_generation: unpause, unfreeze, submit held calls */
/* Holds h in slot (API_WAIT_*) until no submitted HTTP call runs, then
 * answer(a, h, arg) (at once when none runs now); a client that leaves
 * first is released. */
void api_wait_begin(api *a, int slot, http_res *h, void (*answer)(api *a, http_res *h, int arg), int arg);
/* Drops the prefix cache at the engine's next step boundary, then answer(h,
 * n_flushed) (NULL: SGLang's /flush_cache answer). Finishes h either way. */
void api_flush_begin(api *a, http_res *h, void (*answer)(http_res *h, int32_t n_flushed));
void api_route_flush_cache(http_res *h, const http_req *req, void *ud); /* POST (api.c) and GET (api_sglang.c) */
/* For api_destroy: releases every call, flush and pause wait left. */
void api_calls_release(api *a);

/* The routes. api_openai.c: */
void api_route_models(http_res *h, const http_req *req, void *ud);
void api_route_completions(http_res *h, const http_req *req, void *ud);
void api_route_chat(http_res *h, const http_req *req, void *ud);

/* api_update.c: /update_weights_from_disk, and the update from a path vLLM's routes use too. */
void api_route_update_disk(http_res *h, const http_req *req, void *ud);
/* How a weight update from a path ended: rc 0 = the new version serves. */
typedef struct {
    int rc;
    const char *error;          /* why not, when rc != 0 */
    uint64_t version;           /* the daemon's version now */
    uint32_t n_aborted;
} api_update_result;
/* Pushes the weights at path (.gguf, .safetensors or an HF folder) to the
 * daemon itself as version (mode PROTO_MODE_*, flags API_UPD_*), then answer(h, result).
 * 0: h belongs to the update; else e says why (the caller answers). */
#define API_UPD_FLUSH_CACHE 1   /* drop the prefix cache once the new version serves (SGLang's flush_cache) */
#define API_UPD_KEEP_PAUSE 2    /* stay paused in place after the update (SGLang's keep_pause) */
#define API_UPD_SERVE(code) ((int)(code) << 8) /* push as serve_dtype PROTO_SERVE_* (0: the config's) */
#define API_UPD_SERVE_OF(flags) ((uint8_t)((flags) >> 8 & 0xFF))
int api_update_from_path(api *a, http_res *h, const char *path, uint64_t version, uint8_t mode, int flags,
                         void (*answer)(http_res *h, const api_update_result *r), api_err *e);

/* api_sglang.c */
/* Appends the SGLang / vLLM-sleep control routes to t; returns how many. */
int api_sglang_routes(api *a, http_route *t);
void api_sglang_free(api *a);
/* The serving weights are now those of path (NULL: no file) at version. */
void api_note_weights_source(api *a, const char *path, uint64_t version);

/* api_lora.c: LoRA adapter loads and unloads (vLLM's and SGLang's routes). */
int api_lora_routes(api *a, http_route *t);
void api_lora_free(api *a);
/* 0 when name is NULL, "" or a resident adapter; else -1 and a 400 naming it. */
int api_lora_check(const api *a, const char *name, api_err *e);

/* GET /weights_manifest (api_manifest.c). */
int api_manifest_routes(api *a, http_route *t);

/* api_vllm.c: vLLM's RL routes (/pause, /resume, /inference/v1/generate, ...). */
/* Appends the routes to table; returns how many. */
int api_vllm_routes(api *a, http_route *table);

#endif
