/* daemon.h - the daemon's state, owned by the loop thread (main.c builds it,
 * loop.c serves the protocol, the timers and the signals). */
#ifndef RD_DAEMON_DAEMON_H
#define RD_DAEMON_DAEMON_H

#include <stdint.h>
#include <uv.h>

#include "daemon/bridge.h"
#include "daemon/clients.h"
#include "daemon/config.h"
#include "daemon/engine_thread.h"
#include "daemon/host.h"
#include "daemon/http.h"
#include "daemon/lora_reg.h"
#include "daemon/metrics.h"
#include "daemon/pipe_auth.h"
#include "daemon/update/wing.h"
#include "engine/model/loader.h"
#include "proto/proto.h"

#define RD_SERVER_NAME "rolloutd 0.1.0"

/* d_state is in host.h (the wing reads it). */

typedef struct rd_daemon {
    cfg_daemon cfg;
    rd_loaded L;                /* backend, model, tokenizer */
    engine *eng;                /* run by the engine thread */
    char model_name[256];       /* what answers show: served_model_name, else model_base */
    char model_base[256];       /* the model file's base name without .gguf (/v1 requests may name it too) */
    proto_hello_ok lim;         /* model description and limits (HELLO_OK minus the per-client fields) */
    int32_t kv_blocks_total;    /* for admission: a request must fit the whole pool */
    uint64_t weight_version;    /* policy version serving (0 until weight updates, issue 4) */
    uint64_t t_start_us;

    uv_loop_t loop;
    uv_async_t wake;            /* NNG requests and engine results are ready */
    uv_timer_t tick;            /* 1 s: throughput window, client TTL */
    uv_timer_t drain_timer;     /* SIGTERM + drain_s: abort what still runs */
    uv_timer_t grace_timer;     /* then shutdown_grace_s to deliver results */
    uv_signal_t sigint, sigterm;
    bridge br;
    http_server http;
    struct api *api;            /* the HTTP generation routes (api.h), NULL before loop_http_start */
    et_thread et;
    cl_table clients;
    sh_hist serve;              /* the serve_dtype of each recent weight version (results, HTTP, /status) */
    lr_table loras;             /* the LoRA adapters resident in the engine (api_lora.c keeps it) */
    mx_window win;
    eng_stats stats;            /* latest engine snapshot */

    d_state state;
    int drain_expired;          /* the drain time passed: everything unfinished was aborted */
    int grace_started;
    int n_signals;
    int64_t accepted, rejected, errors;
    proto_buf out;              /* encoding scratch for replies */
    int exit_code;
    int exposed;                /* the learner socket is on a non-loopback address (insecure) */
    host_secret secret;         /* the shared secret (auth_token_file) for every socket */
    pipe_auth auth;             /* the learner socket's handshakes (pipe_auth.c) */
    wing wing;                  /* weight updates: transfers, lane, relays, sync (update/wing.h) */
} rd_daemon;

/* snapshot.c: what /status, /metrics and the load reports render, now (the engine thread's latest stats
 * included). */
void snapshot_take(rd_daemon *d, mx_snapshot *s);

/* loop.c */
/* The reply interface the parts below the loop answer through (host.h). */
host_reply loop_reply(rd_daemon *d);
void loop_on_wake(uv_async_t *h);
void loop_on_tick(uv_timer_t *t);
void loop_on_signal(uv_signal_t *s, int signum);
void loop_on_fetch_timeout(uv_timer_t *t);
/* Closes NNG, stops the engine thread, then closes every libuv handle so
 * uv_run returns. */
void loop_shutdown(rd_daemon *d);
char *loop_status_json(void *ud);
char *loop_metrics_text(void *ud);
/* The HTTP server with the daemon's route table (/status, /metrics, /health). */
int loop_http_start(rd_daemon *d);

#endif
