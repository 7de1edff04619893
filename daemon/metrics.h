/* metrics.h - what /status (JSON) and /metrics (Prometheus text 0.0.4) say,
 * rendered from one snapshot, plus the throughput window the 1 s timer feeds. */
#ifndef RD_DAEMON_METRICS_H
#define RD_DAEMON_METRICS_H

#include <stdint.h>

#include "daemon/lora_reg.h"
#include "engine/backend.h"
#include "engine/serve/engine.h"

#define MX_WINDOW 11            /* samples kept: a 10 s window at 1 s ticks */

/* Token counters sampled once a second. */
typedef struct {
    double t[MX_WINDOW];        /* seconds (monotonic) */
    int64_t prompt[MX_WINDOW];  /* prompt tokens computed so far */
    int64_t gen[MX_WINDOW];     /* tokens generated so far */
    int n;                      /* samples held */
    int head;                   /* next slot to write */
} mx_window;

void mx_window_push(mx_window *w, double t, int64_t prompt_tokens, int64_t gen_tokens);
/* Tokens per second between the oldest and newest sample (0 with fewer than 2). */
void mx_window_rates(const mx_window *w, double *prompt_per_s, double *gen_per_s);

/* The last weight update, for /status and /metrics. */
typedef struct {
    int happened;               /* 0 until the first update ends */
    int ok;                     /* 1: swapped in; 0: failed or aborted (error says why) */
    uint64_t version;
    int mode;                   /* PROTO_MODE_* */
    uint64_t bytes;             /* manifest bytes: what the chunks carried */
    uint32_t n_tensors;
    uint32_t n_delta;           /* tensors sent as deltas (0: a full push) */
    uint64_t tensor_bytes;      /* the tensors' own bytes (a delta's once applied) */
    uint64_t delta_elems;       /* elements of the delta tensors */
    uint64_t delta_changed;     /* ... whose bits changed */
    uint32_t n_prequant;        /* tensors quantized while the push arrived (serve_dtype), not at COMMIT */
    uint64_t staged_us;         /* UPDATE_BEGIN -> COMMIT */
    uint64_t build_us;          /* COMMIT -> new weights built */
    uint64_t wait_us;           /* COMMIT -> swapped */
    uint64_t stall_us;          /* the engine thread swapping instead of stepping */
    int32_t n_aborted;          /* samples an abort-mode swap ended */
    uint64_t steps_during;      /* engine steps between UPDATE_BEGIN and the swap */
    double at_s;                /* uptime when it ended */
    char error[256];
} up_last;

typedef struct {
    const char *model;          /* model name (the served one) */
    const char *server;         /* "rolloutd 0.1.0" (/v1/loads' version) */
    const char *model_path;
    const char *backend;
    const char *state;          /* "serving" or "draining" */
    uint64_t weight_version;
    double uptime_s;
    eng_stats eng;              /* latest engine snapshot */
    int32_t queued;             /* accepted requests not yet taken by the engine */
    int32_t block_size;         /* tokens per KV block */
    int32_t max_num_seqs;       /* sequences per engine step at most (SGLang's max_running_requests) */
    int prefix_cache;           /* the prefix cache is on (vLLM's enable_prefix_caching) */
    int64_t kv_bytes;           /* the KV pool's device (or host) memory */
    const char *kv_dtype;       /* what the KV cache stores: "f32", "bf16" or "f16" */
    const char *serve_dtype;    /* what pushes are served as (config serve_dtype): "as_pushed", "q8_0", "q4_k" or "fp8" */
    const char *weights_serve_dtype; /* what the serving version was served as (a push may choose its own) */
    int64_t weights_bytes;      /* the model's weights in the backend */
    int64_t weights_by_type[RD_WEIGHT_TYPES]; /* the same by ggml_type; all 0: the backend does not say */
    double gpu_memory_utilization; /* the config's fraction (0: the pool came from kv_cache_bytes) */
    double prompt_tokens_per_s, generated_tokens_per_s;
    uint32_t learners;          /* clients known to the daemon */
    int64_t requests_accepted;  /* requests accepted since start */
    int64_t requests_rejected;  /* SUBMIT items refused (INVALID_PARAMS, BUSY) */
    int64_t protocol_errors;    /* ERROR replies sent */
    /* weight updates */
    int update_active;          /* a transfer is open */
    int update_committing;      /* ... and committing (converting or waiting for the swap) */
    uint64_t update_version;    /* its version */
    uint64_t update_staged, update_total; /* bytes */
    const up_last *last_update;
    uint64_t updates_ok, updates_failed, update_bytes_total;
    uint64_t lora_pushes_ok, lora_pushes_failed; /* adapter pushes (ADAPTER_BEGIN) that served, that failed */
    int lane_connections;       /* data lane connections open now */
    uint64_t lane_evicted;      /* ... closed unproven to admit new ones (max_lane_connections) */
    uint64_t lane_refused;      /* ... refused BUSY at max_lane_connections */
    uint64_t relays_refused;    /* UPDATE_FORWARDs refused FORBIDDEN (relay_allow) */
    /* the HTTP server */
    const char *http_listen;    /* HOST:PORT as configured */
    int http_auth;              /* a Bearer key is required (api_key_file) */
    int http_insecure;          /* serving a non-loopback address without a key (http_insecure) */
    int insecure;               /* the learner socket or the data lane faces a network without auth (insecure) */
    int32_t http_connections;   /* open connections */
    uint64_t http_requests;     /* requests routed since start */
    uint64_t http_evicted;      /* connections closed to admit new ones at http_max_connections */
    uint64_t http_timed_out;    /* connections closed by the header or body timeout */
    uint64_t http_body_bytes;   /* request bodies held now, bytes */
    uint64_t http_body_refused; /* requests refused (503) at max_http_inflight_body_bytes */
    int http_tls;               /* the HTTP API speaks HTTPS (http_tls_cert_file) */
    uint64_t http_tls_plain;    /* plain HTTP requests to it, answered 400 */
    uint64_t http_tls_failed;   /* connections closed by a failed handshake or a bad record */
    /* LoRA adapters */
    int32_t max_loras, max_lora_rank; /* the config's (max_loras 0: none served) */
    const lr_table *loras;      /* the resident ones (the loop's table; valid while the snapshot is used) */
} mx_snapshot;

/* malloc'd, NUL-terminated; NULL when out of memory. */
char *mx_status_json(const mx_snapshot *s);
/* rolloutd:* metrics, then the same numbers under vLLM's (vllm:*) and SGLang's (sglang:*) names with the
 * labels their scrapers read (model_name = the served name; engine, tp_rank, ...). */
char *mx_prometheus(const mx_snapshot *s);

/* SGLang's /v1/loads sections (its include= names: core, memory, spec, lora, disagg, queues, all). */
#define MX_LOADS_CORE 1u
#define MX_LOADS_MEMORY 2u
#define MX_LOADS_SPEC 4u
#define MX_LOADS_LORA 8u            /* no adapters here: the section is left out, as SGLang leaves out None */
#define MX_LOADS_DISAGG 16u         /* no disaggregation: left out too */
#define MX_LOADS_QUEUES 32u
#define MX_LOADS_ALL 63u
/* SGLang's GET /v1/loads answer: {"timestamp" (ISO 8601, UTC), "version", "accelerator", "num_accelerators",
 * "loads": [one rank's {dp_rank, timestamp, the core fields, "memory", "speculative", "queues"}]}, the
 * sections those bits ask; unix_s is the wall clock. */
char *mx_loads_json(const mx_snapshot *s, unsigned sections, double unix_s);
/* The same as ?format=prometheus writes it: sglang_<field>{dp_rank="0"} lines (gauges). */
char *mx_loads_prometheus(const mx_snapshot *s, unsigned sections, double unix_s);
/* SGLang's older GET /get_load: [{dp_rank, num_reqs, num_waiting_reqs, num_tokens, ts_tic}]. */
char *mx_get_load_json(const mx_snapshot *s, double unix_s);

#endif
