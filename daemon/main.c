/* main.c - rolloutd: load the model, start the engine thread, the learner
 * socket and the HTTP server, run the libuv loop until shutdown.
 *   rolloutd [--config FILE.json] [--model PATH] [--listen URL] [--http-listen HOST:PORT] [...]
 * Exit codes: 0 after a clean shutdown (SIGTERM/SIGINT, everything drained),
 * 1 when startup fails (model, ports) or on a second signal, 2 for a bad
 * config or flag. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/daemon.h"
#include "daemon/log.h"
#include "daemon/netaddr.h"
#include "proto/tls.h"
#include "base/clock.h"
#include "base/cpu_isa.h"
#include "base/err.h"

/* The model's names. model_base: the file's base name without ".gguf"
 * (general.name in GGUF files is often a training-run label), kept to
 * printable ASCII so it is valid UTF-8 on the wire and safe in a Prometheus
 * label. model_name, what every answer, /v1/models and the metrics show:
 * served_model_name when set (as vLLM's --served-model-name: prime-rl checks
 * at start that /v1/models lists the HF name it trains), else model_base. */
static void model_name(rd_daemon *d)
{
    const char *base = strrchr(d->cfg.model, '/');
    snprintf(d->model_base, sizeof d->model_base, "%.200s", base ? base + 1 : d->cfg.model);
    size_t n = strlen(d->model_base);
    if (n > 5 && !strcmp(d->model_base + n - 5, ".gguf"))
        d->model_base[n - 5] = 0;
    for (char *p = d->model_base; *p; p++)
        if ((unsigned char)*p < 0x20 || (unsigned char)*p >= 0x7f)
            *p = '?';
    /* cfg_validate checked it: valid UTF-8 without control bytes, shorter than the buffer */
    snprintf(d->model_name, sizeof d->model_name, "%s", d->cfg.served_model_name[0] ? d->cfg.served_model_name
                                                                                     : d->model_base);
}

static uint32_t min_u32(int64_t a, int64_t b) { return (uint32_t)(a < b ? a : b); }

/* HELLO_OK's model description and limits, from the model and the config. */
static void limits(rd_daemon *d)
{
    const model_config *mc = &d->L.m->cfg;
    proto_hello_ok *h = &d->lim;
    memset(h, 0, sizeof *h);
    h->version = PROTO_VERSION;
    if (mc->n_experts > 0)
        h->features |= PROTO_FEATURE_ROUTES; /* results can carry routed experts (version 2; on_hello hides it from 1) */
    if (d->L.tok) {
        h->flags |= PROTO_HELLO_OK_TEXT;
        if (tok_chat_kind(d->L.tok) != TOK_CHAT_NONE)
            h->flags |= PROTO_HELLO_OK_CHAT;
    }
    h->vocab_size = (uint32_t)mc->vocab;
    h->max_context = (uint32_t)mc->max_ctx;
    h->n_layers = (uint32_t)mc->n_layers;
    h->dim = (uint32_t)mc->dim;
    h->n_heads = (uint32_t)mc->n_heads;
    h->n_kv_heads = (uint32_t)mc->n_kv_heads;
    h->eos_id = d->L.tok ? tok_eos(d->L.tok) : -1;
    h->max_prompt_tokens = d->cfg.max_prompt_tokens ? min_u32(d->cfg.max_prompt_tokens, mc->max_ctx - 1)
                                                    : (uint32_t)(mc->max_ctx - 1);
    h->max_message_bytes = (uint64_t)d->cfg.max_message_bytes;
    /* The engine runs a request's n samples side by side: n <= max_num_seqs. */
    h->max_n = min_u32(d->cfg.max_n, d->cfg.max_num_seqs);
    h->max_requests_per_submit = (uint32_t)d->cfg.max_requests_per_submit;
    h->max_tokens = d->cfg.max_tokens ? min_u32(d->cfg.max_tokens, mc->max_ctx - 1) : (uint32_t)(mc->max_ctx - 1);
    /* The engine holds 16 stop ids and adds EOS as one of them, and the chat
     * format's end of turn as another where that is a different token. */
    int32_t eot = d->L.tok ? tok_eot(d->L.tok) : -1;
    h->max_stop_ids = SEQ_MAX_STOP - 1 - (eot >= 0 && eot != h->eos_id);
    h->max_logprobs_topk = 20;
    h->retention_results = (uint32_t)d->cfg.result_retention;
    h->retention_bytes = (uint64_t)d->cfg.retention_bytes;
    h->max_wait_ms = (uint32_t)d->cfg.max_wait_ms;
    h->client_ttl_s = (uint32_t)d->cfg.client_ttl_s;
    h->model_name = (proto_str){d->model_name, (uint32_t)strlen(d->model_name)};
    h->architecture = (proto_str){mc->arch, (uint32_t)strlen(mc->arch)};
    h->backend = (proto_str){d->cfg.backend, (uint32_t)strlen(d->cfg.backend)};
    h->server = (proto_str){RD_SERVER_NAME, (uint32_t)strlen(RD_SERVER_NAME)};
}

/* The learner socket, once bound: a non-loopback address needs the shared
 * secret or insecure (netaddr.h). The lane checks its own address in
 * lane_start. */
static int check_exposure(rd_daemon *d)
{
    nng_sockaddr sa;
    if (nng_listener_get_addr(d->br.listener, NNG_OPT_LOCADDR, &sa) != 0)
        return rd_fail(RD_EIO, "listen \"%s\": cannot read the bound address", d->cfg.listen);
    if (net_nng_is_loopback(&sa) || d->secret.len)
        return 0;
    if (!d->cfg.insecure)
        return rd_fail(RD_EINVAL, "listen \"%s\" is not a loopback address and no auth_token_file is set: anyone "
                       "who reaches it could replace the policy; set auth_token_file (a shared secret the clients "
                       "prove), or insecure = 1 (--insecure 1) to serve it without", d->cfg.listen);
    d->exposed = 1;
    log_line("warning: the learner socket %s faces the network without authentication (insecure)", d->cfg.listen);
    return 0;
}

/* What the weight-update wing is handed: pointers into d, which lives until exit. */
static void wing_setup(rd_daemon *d)
{
    host_env env = {
        .reply = loop_reply(d),
        .cfg = &d->cfg,
        .loop = &d->loop,
        .et = &d->et,
        .m = d->L.m,
        .clients = &d->clients,
        .state = &d->state,
        .weight_version = &d->weight_version,
        .serve = &d->serve,
        .max_message_bytes = &d->lim.max_message_bytes,
        .t_start_us = &d->t_start_us,
        .secret = &d->secret,
        .loras = &d->loras,
    };
    wing_init(&d->wing, &env);
}

static int start(rd_daemon *d)
{
    eng_config ec = eng_default_config();
    ec.backend = d->cfg.backend;
    ec.n_threads = (int)d->cfg.threads;
    ec.kv_cache_bytes = d->cfg.kv_cache_bytes;
    if (d->cfg.gpu_memory_utilization > 0) {
        /* The weights are loaded: the pool takes the fraction of what is left, minus room for the LM
         * head's scratch (at most an fp32 copy of the table) and the step buffers. */
        const model_config *mc = &d->L.m->cfg;
        int64_t reserve = (int64_t)mc->vocab * mc->dim * 4 + ((int64_t)256 << 20);
        int rc = rd_backend_kv_budget(d->L.be, d->cfg.gpu_memory_utilization, reserve, &ec.kv_cache_bytes);
        if (rc)
            return rc;
        log_line("gpu_memory_utilization %.2f: KV pool of %lld bytes", d->cfg.gpu_memory_utilization,
                 (long long)ec.kv_cache_bytes);
    }
    ec.block_size = (int32_t)d->cfg.block_size;
    ec.max_num_seqs = (int32_t)d->cfg.max_num_seqs;
    ec.max_batch_tokens = (int32_t)d->cfg.max_batch_tokens;
    ec.prefix_cache = (int)d->cfg.prefix_cache;
    ec.spec_max_draft = (int32_t)d->cfg.spec_max_draft;
    ec.spec_max_batch = (int32_t)d->cfg.spec_max_batch;
    ec.spec_fixed = !strcmp(d->cfg.spec_draft_sizing, "fixed");
    ec.spec_store_bytes = d->cfg.spec_store_bytes;
    ec.max_loras = (int32_t)d->cfg.max_loras;
    ec.max_lora_rank = (int32_t)d->cfg.max_lora_rank;
    if (eng_spec_mode_parse(d->cfg.spec_decode, &ec.spec_decode)) /* cfg_validate checked it */
        return RD_EINVAL;
    /* The loop bounds queued requests itself (BUSY); the engine must never refuse. */
    ec.max_waiting = (int32_t)d->cfg.max_queued_requests + 1;
    ec.eos_id = d->L.tok ? tok_eos(d->L.tok) : -1; /* as rollout-gen: same results for the same request */
    ec.eot_id = d->L.tok ? tok_eot(d->L.tok) : -1;
    ec.tok = d->L.tok; /* stop strings (HTTP API) */
    int rc = eng_create(d->L.m, &ec, &d->eng);
    if (rc)
        return rc;
    eng_get_stats(d->eng, &d->stats);
    d->kv_blocks_total = d->stats.kv_blocks_total;

    uv_async_init(&d->loop, &d->wake, loop_on_wake);
    d->wake.data = d;
    uv_timer_init(&d->loop, &d->tick);
    uv_timer_init(&d->loop, &d->drain_timer);
    uv_timer_init(&d->loop, &d->grace_timer);
    d->tick.data = d->drain_timer.data = d->grace_timer.data = d;
    uv_timer_start(&d->tick, loop_on_tick, 1000, 1000);
    uv_signal_init(&d->loop, &d->sigint);
    uv_signal_init(&d->loop, &d->sigterm);
    d->sigint.data = d->sigterm.data = d;
    uv_signal_start(&d->sigint, loop_on_signal, SIGINT);
    uv_signal_start(&d->sigterm, loop_on_signal, SIGTERM);

    if ((rc = et_start(&d->et, d->eng, &d->wake)))
        return rc;
    if ((rc = pipe_auth_load(&d->auth, d->cfg.auth_token_file, &d->secret)))
        return rc;
    nng_tls_config *tls = NULL;
    if (proto_tls_url(d->cfg.listen) && (rc = proto_tls_server(d->cfg.tls_cert_file, d->cfg.tls_key_file, &tls)))
        return rd_fail(rc, "listen %s: %s", d->cfg.listen, rd_errmsg());
    rc = br_open(&d->br, &d->loop, d->cfg.listen, (int)d->cfg.nng_contexts, (size_t)d->cfg.max_message_bytes,
                 &d->wake, tls);
    if (tls)
        nng_tls_config_free(tls); /* the listener holds its own reference */
    if (rc)
        return rc;
    if ((rc = check_exposure(d)))
        return rc;
    if (proto_tls_url(d->cfg.listen) && (rc = br_listen_self(&d->br))) /* /update_weights_from_disk */
        return rc;
    if ((rc = wing_start_lane(&d->wing)))
        return rc;
    if ((rc = loop_http_start(d)))
        return rc;
    if ((rc = wing_start_sync(&d->wing)))
        return rc;
    return 0;
}

int main(int argc, char **argv)
{
    /* NNG sends with MSG_NOSIGNAL; libuv's writes can still raise SIGPIPE. */
    signal(SIGPIPE, SIG_IGN);
    static rd_daemon D;
    rd_daemon *d = &D;
    int help;
    if (cfg_from_args(&d->cfg, argc, argv, &help)) {
        fprintf(stderr, "rolloutd: %s\n", rd_errmsg());
        return 2;
    }
    if (help) {
        fputs(cfg_usage(), stdout);
        return 0;
    }
    d->t_start_us = (uint64_t)clock_now_us();
    log_line("loading %s (backend %s)", d->cfg.model, d->cfg.backend);
    if (!strcmp(d->cfg.backend, "cpu"))
        log_line("CPU kernels: the %s path (this CPU supports up to %s; RD_CPU_ISA=scalar|avx2|avx512 picks a "
                 "lower one)", cpu_isa_name(cpu_isa_active()), cpu_isa_name(cpu_isa_best()));
    if (rd_load(d->cfg.model, d->cfg.backend, (int)d->cfg.threads, &d->L)) {
        fprintf(stderr, "rolloutd: cannot load the model: %s\n", rd_errmsg());
        return 1;
    }
    /* Before the engine sizes its KV pool by the element size. cfg_validate
     * has checked the name and the backend, so this only fails on a bug. */
    if (rd_backend_set_kv_dtype(d->L.be, d->cfg.kv_dtype)) {
        fprintf(stderr, "rolloutd: %s\n", rd_errmsg());
        rd_unload(&d->L);
        return 2;
    }
    model_name(d);
    limits(d);
    if (d->cfg.enable_return_routed_experts && !(d->lim.features & PROTO_FEATURE_ROUTES)) {
        /* a trainer that replays routes must hear at start that none will come, not from its first
         * batch of answers */
        fprintf(stderr, "rolloutd: enable_return_routed_experts: the model %s (%s) is dense, not a mixture of "
                "experts: it has no routed experts to return\n", d->cfg.model, d->L.m->cfg.arch);
        rd_unload(&d->L);
        return 2;
    }
    cl_init(&d->clients, d->lim.retention_results, d->lim.retention_bytes);
    /* the weights loaded at start are served as the file holds them */
    sh_init(&d->serve, d->weight_version, PROTO_SERVE_AS_PUSHED);
    d->clients.serve = &d->serve;
    proto_buf_init(&d->out);
    uv_loop_init(&d->loop);
    wing_setup(d);

    int rc = start(d);
    if (rc) {
        fprintf(stderr, "rolloutd: %s\n", rd_errmsg());
        d->exit_code = 1;
        d->state = D_DRAINING;
        loop_shutdown(d);
    } else {
        log_line("model %s: %d layers, vocab %d, context %d; KV cache %d blocks of %lld tokens",
                 d->model_name, d->L.m->cfg.n_layers, d->L.m->cfg.vocab, d->L.m->cfg.max_ctx, d->kv_blocks_total,
                 (long long)d->cfg.block_size);
        log_line("listening on %s (learners), %s://%s (HTTP, %s)", d->cfg.listen, d->http.tls ? "https" : "http",
                 d->cfg.http_listen, d->http.key_len ? "Bearer key required" : "no auth");
        if (d->wing.lane)
            log_line("weight-update data lane on TCP port %u", lane_port(d->wing.lane));
    }
    uv_run(&d->loop, UV_RUN_DEFAULT);
    if (uv_loop_close(&d->loop))
        log_line("warning: libuv handles still open at exit");
    wing_free(&d->wing); /* joins the sync threads (they never touch the loop), frees the lane */
    free(d->br.ctxs);
    pthread_mutex_destroy(&d->br.mu);
    cl_free(&d->clients);
    pipe_auth_free(&d->auth, &d->secret);
    proto_buf_free(&d->out);
    if (d->eng)
        eng_destroy(d->eng);
    rd_unload(&d->L);
    log_line("exit %d", d->exit_code);
    return d->exit_code;
}
