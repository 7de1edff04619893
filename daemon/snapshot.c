/* snapshot.c - what /status, /metrics and SGLang's load reports render: the
 * daemon's counters and the engine thread's latest stats, read now. Below the
 * loop and the HTTP routes, which both call it (so neither calls the other). */
#include <pthread.h>
#include <string.h>

#include "base/clock.h"
#include "daemon/daemon.h"

void snapshot_take(rd_daemon *d, mx_snapshot *s)
{
    memset(s, 0, sizeof *s);
    s->model = d->model_name;
    s->server = RD_SERVER_NAME;
    s->model_path = d->cfg.model;
    s->backend = d->cfg.backend;
    s->state = d->state == D_SERVING ? "serving" : "draining";
    s->weight_version = d->weight_version;
    s->uptime_s = (double)((uint64_t)clock_now_us() - d->t_start_us) / 1e6;
    s->eng = d->stats;
    uint32_t queued = 0;
    pthread_mutex_lock(&d->et.mu);
    queued = d->et.n_cmds;
    s->eng = d->et.stats;
    pthread_mutex_unlock(&d->et.mu);
    s->queued = (int32_t)queued;
    s->block_size = (int32_t)d->cfg.block_size;
    s->max_num_seqs = (int32_t)d->cfg.max_num_seqs;
    s->prefix_cache = d->cfg.prefix_cache != 0;
    s->max_loras = (int32_t)d->cfg.max_loras;
    s->max_lora_rank = (int32_t)d->cfg.max_lora_rank;
    s->loras = &d->loras;
    const model *m = d->L.m;
    int32_t kv_elem = rd_backend_kv_elem_bytes(d->L.be);
    s->kv_bytes = (int64_t)s->eng.kv_blocks_total * 2 * m->cfg.n_layers *
                  rd_backend_kv_block_bytes(d->L.be, m->cfg.n_kv_heads, s->block_size, m->cfg.head_dim);
    s->kv_dtype = kv_elem == 4 ? "f32" : kv_elem == 1 ? "fp8" : !strcmp(d->cfg.kv_dtype, "f16") ? "f16" : "bf16";
    s->serve_dtype = d->cfg.serve_dtype;
    s->weights_serve_dtype = sh_name(sh_code(&d->serve, d->weight_version));
    /* What the backend holds where it says (ops.linear_bytes: the CPU's file
     * dtypes or fp32 panels), counted by the engine thread at load and at
     * each update swap; else bf16 on CUDA plus its fp32 copy of the LM head. */
    s->weights_bytes = s->eng.weights_released ? 0 /* released (api_sglang.c) */
                     : d->L.be->ops->linear_bytes ? __atomic_load_n(&m->weights_bytes, __ATOMIC_RELAXED)
                                                  : m->n_params * 2 + (int64_t)m->cfg.vocab * m->cfg.dim * 4;
    for (int t = 0; t < RD_WEIGHT_TYPES; t++)
        s->weights_by_type[t] = s->eng.weights_released ? 0 : __atomic_load_n(&m->weights_bytes_by_type[t],
                                                                               __ATOMIC_RELAXED);
    s->gpu_memory_utilization = d->cfg.gpu_memory_utilization;
    mx_window_rates(&d->win, &s->prompt_tokens_per_s, &s->generated_tokens_per_s);
    s->learners = d->clients.n_clients;
    s->requests_accepted = d->accepted;
    s->requests_rejected = d->rejected;
    s->protocol_errors = d->errors;
    wing_snapshot(&d->wing, s);
    s->http_listen = d->cfg.http_listen;
    s->http_auth = d->http.key_len > 0;
    s->http_insecure = !d->http.key_len && !d->http.loopback;
    s->insecure = d->exposed || wing_exposed(&d->wing);
    s->http_connections = d->http.n_conns;
    s->http_requests = d->http.n_requests;
    s->http_evicted = d->http.n_evicted;
    s->http_timed_out = d->http.n_timeouts;
    s->http_body_bytes = d->http.body_bytes;
    s->http_body_refused = d->http.n_body_refused;
    s->http_tls = d->http.tls != NULL;
    s->http_tls_plain = d->http.n_tls_plain;
    s->http_tls_failed = d->http.n_tls_failed;
}
