/* config.h - rolloutd's settings: defaults, a JSON config file (cJSON) and
 * command-line overrides. An unknown key, a wrong type or an out-of-range
 * value is refused with a message naming the key and what was expected. */
#ifndef RD_DAEMON_CONFIG_H
#define RD_DAEMON_CONFIG_H

#include <stdint.h>

#define CFG_STR 512                 /* bytes for path and address strings */

typedef struct {
    char model[CFG_STR];            /* GGUF file */
    char backend[16];               /* "cpu" or "cuda" */
    char kv_dtype[8];               /* KV cache elements: "auto" (cpu f32, cuda bf16), "f32", "bf16", "f16" */
    char serve_dtype[16];           /* pushed linear weights: "as_pushed" (their dtype), "q8_0", "q4_k" or "fp8" (quantized at COMMIT) */
    char logprobs_mode[24];         /* HTTP answers' log-probs: "raw_logprobs" or "processed_logprobs" (vLLM's names) */
    char listen[CFG_STR];           /* NNG URL of the learner socket, e.g. tcp://127.0.0.1:7070 */
    char http_listen[CFG_STR];      /* HOST:PORT of the HTTP server (status_listen is its old name) */
    int64_t threads;                /* engine threads; 0 = all cores */
    int64_t kv_cache_bytes;         /* KV pool budget, bytes */
    int64_t block_size;             /* tokens per KV block */
    int64_t max_num_seqs;           /* sequences per engine step */
    int64_t max_batch_tokens;       /* token budget per engine step */
    int64_t max_queued_requests;    /* accepted, unfinished requests (all clients) before BUSY */
    int64_t max_requests_per_submit;
    int64_t max_n;                  /* samples per request (also capped by max_num_seqs) */
    int64_t max_tokens;             /* generated tokens per sample; 0 = context - 1 */
    int64_t max_prompt_tokens;      /* 0 = context - 1 */
    int64_t max_message_bytes;      /* largest frame either side may send */
    int64_t result_retention;       /* results held per client (unacked + reserved in-flight) */
    int64_t retention_bytes;        /* the same bound in encoded bytes */
    int64_t max_wait_ms;            /* FETCH long-poll cap */
    int64_t client_ttl_s;           /* a silent client is forgotten after this */
    int64_t max_clients;            /* known clients before HELLO(0) is refused BUSY */
    int64_t nng_contexts;           /* concurrent requests (and parked FETCHes) on the socket */
    int64_t drain_s;                /* SIGTERM: seconds in-flight requests may run before abort */
    int64_t shutdown_grace_s;       /* then seconds left for clients to fetch their results */
    int64_t http_max_connections;   /* open HTTP connections (the oldest idle one is evicted beyond) */
    int64_t max_http_body_bytes;    /* request body, bytes (decoded), before 413 */
    int64_t max_http_inflight_body_bytes; /* all request bodies held at once, bytes, before 503 (0 = no bound) */
    int64_t http_header_timeout_ms; /* request line + headers must arrive within this; also the longest body stall */
    int64_t http_idle_timeout_ms;   /* a keep-alive connection waiting for its next request is closed after this */
    int64_t http_stream_queue_bytes; /* bytes queued to one slow client before its stream is cut */
    char api_key_file[CFG_STR];     /* file holding the HTTP Bearer key; "" = no auth */
    int64_t http_insecure;          /* 1: serve HTTP on a non-loopback address without a key */
    char auth_token_file[CFG_STR];  /* the shared secret; "" = no authentication */
    char tls_cert_file[CFG_STR];    /* PEM certificate for a tls+tcp:// listen */
    char tls_key_file[CFG_STR];     /* its PEM key */
    int64_t insecure;               /* 1: the learner socket and data lane may face a network (no auth yet) */
    int64_t prefix_cache;           /* 1: reuse cached full prompt blocks (salted with the weight version) */
    char spec_decode[8];            /* speculative decoding's drafter: "off", "ngram", or "auto" (the default: ngram
                                       when spec_max_draft > 0, the rule of configs from before the key) */
    int64_t spec_max_draft;         /* drafted tokens per sequence and step at most (ngram: 0 = 6; auto: 0 = off) */
    int64_t spec_max_batch;         /* a step speculates only while at most this many sequences run (0 = 8) */
    char spec_draft_sizing[10];     /* "measured" (default: drafts that pay at the timed step cost) or "fixed"
                                       (spec_max_draft and the batch bound alone: drafts whatever the machine) */
    int64_t spec_store_bytes;       /* recent completions kept by prompt for the drafter, bytes (0 = none) */
    char update_listen[CFG_STR];    /* data lane HOST:PORT; "" = the learner socket's host, any port; "off" */
    char weights_from[CFG_STR];     /* a peer's learner URL: at start, ask it for its serving weights; "" = no */
    char advertise_url[CFG_STR];    /* the learner URL peers dial back (weights_from); "" = listen */
    double gpu_memory_utilization;  /* cuda: KV pool = this fraction of free device memory (0 = kv_cache_bytes) */
    int64_t max_staging_bytes;      /* weight update: bytes a transfer may stage */
    int64_t update_window;          /* weight update: chunks staged at once */
    int64_t update_idle_s;          /* weight update: a transfer silent this long is aborted */
    int64_t max_lane_connections;   /* data lane connections open at once (the oldest unproven is evicted) */
    char relay_allow[CFG_STR];      /* UPDATE_FORWARD targets: HOST:PORT, HOST:*, [V6]:PORT, ...; "" = default */
    char http_tls_cert_file[CFG_STR]; /* PEM certificate: the HTTP API speaks HTTPS */
    char http_tls_key_file[CFG_STR];  /* its PEM key */
    char served_model_name[256];    /* vLLM's --served-model-name: the model's name in /v1/models, every answer and
                                       the metrics' model_name label; "" = the model file's base name */
    int64_t enable_return_routed_experts; /* vLLM's flag: every /inference/v1/generate choice carries its routed
                                       experts (prime-rl's compact form); a MoE model only */
    int64_t max_loras;              /* LoRA adapters resident at once (vLLM's --max-loras; 0 = none served) */
    int64_t max_lora_rank;          /* the largest adapter rank loaded (vLLM's --max-lora-rank) */
} cfg_daemon;

/* The defaults (configs/rolloutd.json spells the same values). */
void cfg_defaults(cfg_daemon *c);

/* Applies a JSON object's keys over c. RD_EINVAL with a message naming the key. */
int cfg_parse_json(cfg_daemon *c, const char *text, const char *origin);

/* Reads and applies a JSON file. */
int cfg_load_file(cfg_daemon *c, const char *path);

/* Full command line: defaults, then the --config file (if given), then the
 * other flags in order. *help is set for --help. */
int cfg_from_args(cfg_daemon *c, int argc, char **argv, int *help);

/* Cross-field checks once everything is applied. */
int cfg_validate(const cfg_daemon *c);

/* The usage text. */
const char *cfg_usage(void);

#endif
