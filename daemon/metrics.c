/* metrics.c - see metrics.h. Counts in /status "requests" are samples (the
 * engine's unit: a request with n = 8 is 8 sequences). */
#include "daemon/metrics.h"

#include <cjson/cJSON.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine/format/gguf.h"

void mx_window_push(mx_window *w, double t, int64_t prompt_tokens, int64_t gen_tokens)
{
    w->t[w->head] = t;
    w->prompt[w->head] = prompt_tokens;
    w->gen[w->head] = gen_tokens;
    w->head = (w->head + 1) % MX_WINDOW;
    if (w->n < MX_WINDOW)
        w->n++;
}

void mx_window_rates(const mx_window *w, double *prompt_per_s, double *gen_per_s)
{
    *prompt_per_s = *gen_per_s = 0;
    if (w->n < 2)
        return;
    int newest = (w->head + MX_WINDOW - 1) % MX_WINDOW;
    int oldest = (w->head + MX_WINDOW - w->n) % MX_WINDOW;
    double dt = w->t[newest] - w->t[oldest];
    if (dt <= 0)
        return;
    *prompt_per_s = (double)(w->prompt[newest] - w->prompt[oldest]) / dt;
    *gen_per_s = (double)(w->gen[newest] - w->gen[oldest]) / dt;
}

static double usage(const mx_snapshot *s)
{
    return s->eng.kv_blocks_total > 0 ? (double)s->eng.kv_blocks_used / s->eng.kv_blocks_total : 0.0;
}

char *mx_status_json(const mx_snapshot *s)
{
    cJSON *o = cJSON_CreateObject();
    if (!o)
        return NULL;
    cJSON_AddStringToObject(o, "model", s->model);
    cJSON_AddStringToObject(o, "model_path", s->model_path);
    cJSON_AddStringToObject(o, "backend", s->backend);
    cJSON_AddStringToObject(o, "sampling", s->eng.device_sampling ? "device" : "host");
    cJSON_AddStringToObject(o, "state", s->state);
    cJSON_AddNumberToObject(o, "weight_version", (double)s->weight_version);
    /* The policy pushed weights are served under: a learner correcting for a
     * quantized rollout policy (TIS) reads it next to the version. */
    if (s->serve_dtype)
        cJSON_AddStringToObject(o, "serve_dtype", s->serve_dtype);
    if (s->weights_serve_dtype)
        cJSON_AddStringToObject(o, "weights_serve_dtype", s->weights_serve_dtype);
    cJSON_AddNumberToObject(o, "uptime_s", s->uptime_s);
    cJSON *rq = cJSON_AddObjectToObject(o, "requests");
    cJSON_AddNumberToObject(rq, "waiting", s->eng.waiting + s->queued);
    cJSON_AddNumberToObject(rq, "running", s->eng.running);
    cJSON_AddNumberToObject(rq, "completed", (double)s->eng.completed);
    cJSON_AddNumberToObject(rq, "aborted", (double)s->eng.aborted);
    cJSON_AddNumberToObject(rq, "accepted", (double)s->requests_accepted);
    cJSON_AddNumberToObject(rq, "rejected", (double)s->requests_rejected);
    cJSON *tp = cJSON_AddObjectToObject(o, "throughput");
    cJSON_AddNumberToObject(tp, "prompt_tokens_per_s", s->prompt_tokens_per_s);
    cJSON_AddNumberToObject(tp, "generated_tokens_per_s", s->generated_tokens_per_s);
    cJSON_AddNumberToObject(tp, "window_s", MX_WINDOW - 1);
    cJSON *tk = cJSON_AddObjectToObject(o, "tokens");
    cJSON_AddNumberToObject(tk, "prompt_total", (double)s->eng.prompt_tokens);
    cJSON_AddNumberToObject(tk, "generated_total", (double)s->eng.generated_tokens);
    cJSON_AddNumberToObject(tk, "preemptions_total", (double)s->eng.preemptions);
    cJSON_AddBoolToObject(o, "generation_paused", s->eng.paused); /* a "keep" pause froze every sequence */
    cJSON *kv = cJSON_AddObjectToObject(o, "kv_cache");
    cJSON_AddNumberToObject(kv, "block_size", s->block_size);
    cJSON_AddNumberToObject(kv, "blocks_total", s->eng.kv_blocks_total);
    cJSON_AddNumberToObject(kv, "blocks_used", s->eng.kv_blocks_used);
    cJSON_AddNumberToObject(kv, "blocks_cached", s->eng.kv_blocks_cached);
    cJSON_AddNumberToObject(kv, "usage", usage(s));
    cJSON_AddNumberToObject(kv, "peak_blocks", s->eng.kv_peak_blocks);
    cJSON_AddNumberToObject(kv, "bytes", (double)s->kv_bytes);
    if (s->kv_dtype)
        cJSON_AddStringToObject(kv, "dtype", s->kv_dtype);
    cJSON_AddNumberToObject(kv, "prefix_cache_query_tokens", (double)s->eng.prefix_query_tokens);
    cJSON_AddNumberToObject(kv, "prefix_cache_hit_tokens", (double)s->eng.prefix_hit_tokens);
    /* LoRA adapters resident, in the order loaded. */
    cJSON *lo = cJSON_AddObjectToObject(o, "lora");
    cJSON_AddNumberToObject(lo, "max_loras", s->max_loras);
    cJSON_AddNumberToObject(lo, "max_lora_rank", s->max_lora_rank);
    cJSON *la = cJSON_AddArrayToObject(lo, "adapters");
    for (int32_t i = 0; s->loras && i < s->loras->n; i++) {
        const lr_entry *x = &s->loras->e[i];
        cJSON *j = cJSON_CreateObject();
        cJSON_AddStringToObject(j, "name", x->name);
        cJSON_AddNumberToObject(j, "version", (double)x->version);
        cJSON_AddNumberToObject(j, "rank", x->rank);
        cJSON_AddNumberToObject(j, "bytes", (double)x->bytes);
        if (x->path)
            cJSON_AddStringToObject(j, "path", x->path);
        cJSON_AddBoolToObject(j, "pushed", x->path == NULL);
        cJSON_AddItemToArray(la, j);
    }
    cJSON_AddNumberToObject(lo, "pushes_ok", (double)s->lora_pushes_ok);
    cJSON_AddNumberToObject(lo, "pushes_failed", (double)s->lora_pushes_failed);
    /* Speculative decoding: drafted tokens verified, those drawn as drafted, their ratio (0 before any). */
    cJSON *sp = cJSON_AddObjectToObject(o, "spec_decode");
    cJSON_AddStringToObject(sp, "mode", eng_spec_mode_name(s->eng.spec_decode));
    cJSON_AddNumberToObject(sp, "max_draft", s->eng.spec_max_draft);
    cJSON_AddNumberToObject(sp, "max_batch", s->eng.spec_max_batch);
    cJSON_AddNumberToObject(sp, "store_bytes", (double)s->eng.spec_store_bytes);
    cJSON_AddNumberToObject(sp, "store_max_bytes", (double)s->eng.spec_store_max_bytes);
    cJSON_AddNumberToObject(sp, "store_entries", s->eng.spec_store_entries);
    cJSON_AddNumberToObject(sp, "drafted_tokens", (double)s->eng.spec_drafted);
    cJSON_AddNumberToObject(sp, "accepted_tokens", (double)s->eng.spec_accepted);
    cJSON_AddNumberToObject(sp, "acceptance_rate",
                            s->eng.spec_drafted > 0 ? (double)s->eng.spec_accepted / (double)s->eng.spec_drafted : 0.0);
    cJSON_AddNumberToObject(sp, "verify_steps", (double)s->eng.spec_steps);
    /* What sizes the drafts: the measured step times (their fit, null until two row counts were timed)
       or the fixed rules alone. */
    cJSON_AddStringToObject(sp, "draft_sizing", s->eng.spec_fixed ? "fixed" : "measured");
    if (s->eng.spec_cost_fitted) {
        cJSON *fit = cJSON_AddObjectToObject(sp, "step_fit");
        cJSON_AddNumberToObject(fit, "fixed_ms", s->eng.spec_step_ns * 1e-6);
        cJSON_AddNumberToObject(fit, "per_row_ms", s->eng.spec_row_ns * 1e-6);
    } else {
        cJSON_AddNullToObject(sp, "step_fit");
    }
    cJSON *mem = cJSON_AddObjectToObject(o, "memory");
    cJSON_AddNumberToObject(mem, "weights_bytes", (double)s->weights_bytes);
    /* By dtype ("q8_0", "bf16", "f32": norms and fp32 panels, ...), where the backend says: what a
     * serve_dtype push, or a partial one, left in memory. */
    cJSON *by = NULL;
    for (int t = 0; t < RD_WEIGHT_TYPES; t++)
        if (s->weights_by_type[t] > 0 && (by || (by = cJSON_AddObjectToObject(mem, "weights_bytes_by_dtype"))))
            cJSON_AddNumberToObject(by, ggml_type_name((ggml_type)t), (double)s->weights_by_type[t]);
    cJSON_AddNumberToObject(mem, "kv_cache_bytes", (double)s->kv_bytes);
    cJSON_AddNumberToObject(mem, "gpu_memory_utilization", s->gpu_memory_utilization);
    cJSON_AddNumberToObject(o, "learners", s->learners);
    cJSON_AddNumberToObject(o, "protocol_errors", (double)s->protocol_errors);
    cJSON_AddNumberToObject(o, "engine_steps", (double)s->eng.steps);
    cJSON *wu = cJSON_AddObjectToObject(o, "weight_update");
    cJSON_AddBoolToObject(wu, "in_progress", s->update_active);
    if (s->update_active) {
        cJSON_AddNumberToObject(wu, "version", (double)s->update_version);
        cJSON_AddStringToObject(wu, "phase", s->update_committing ? "committing" : "staging");
        cJSON_AddNumberToObject(wu, "bytes_staged", (double)s->update_staged);
        cJSON_AddNumberToObject(wu, "bytes_total", (double)s->update_total);
    }
    cJSON_AddNumberToObject(wu, "updates_ok", (double)s->updates_ok);
    cJSON_AddNumberToObject(wu, "updates_failed", (double)s->updates_failed);
    const up_last *l = s->last_update;
    if (l && l->happened) {
        static const char *MODES[] = {"continue", "drain", "abort"};
        cJSON *lw = cJSON_AddObjectToObject(o, "last_weight_update");
        cJSON_AddBoolToObject(lw, "ok", l->ok);
        cJSON_AddNumberToObject(lw, "version", (double)l->version);
        cJSON_AddStringToObject(lw, "mode", l->mode >= 0 && l->mode <= 2 ? MODES[l->mode] : "?");
        cJSON_AddNumberToObject(lw, "bytes", (double)l->bytes);
        cJSON_AddNumberToObject(lw, "tensors", l->n_tensors);
        /* delta pushes (§10.14): the kind, the bytes the chunks carried against the tensors' own, and the
         * share of the delta tensors' elements whose bits changed (null for a full push) */
        cJSON_AddStringToObject(lw, "kind", l->n_delta ? "delta" : "full");
        cJSON_AddNumberToObject(lw, "wire_bytes", (double)l->bytes);
        cJSON_AddNumberToObject(lw, "tensor_bytes", (double)l->tensor_bytes);
        cJSON_AddNumberToObject(lw, "delta_tensors", l->n_delta);
        if (l->n_delta && l->delta_elems && l->ok)
            cJSON_AddNumberToObject(lw, "changed_fraction", (double)l->delta_changed / (double)l->delta_elems);
        else
            cJSON_AddNullToObject(lw, "changed_fraction");
        cJSON_AddNumberToObject(lw, "prequantized_tensors", l->n_prequant);
        cJSON_AddNumberToObject(lw, "staged_s", (double)l->staged_us / 1e6);
        cJSON_AddNumberToObject(lw, "build_s", (double)l->build_us / 1e6);
        cJSON_AddNumberToObject(lw, "duration_s", (double)(l->staged_us + l->wait_us) / 1e6);
        cJSON_AddNumberToObject(lw, "swap_wait_ms", (double)l->wait_us / 1e3);
        cJSON_AddNumberToObject(lw, "stall_us", (double)l->stall_us);
        cJSON_AddNumberToObject(lw, "samples_aborted", l->n_aborted);
        cJSON_AddNumberToObject(lw, "engine_steps_during", (double)l->steps_during);
        cJSON_AddNumberToObject(lw, "ended_at_uptime_s", l->at_s);
        if (!l->ok)
            cJSON_AddStringToObject(lw, "error", l->error);
    } else {
        cJSON_AddNullToObject(o, "last_weight_update");
    }
    /* true when any socket faces a network without authentication */
    cJSON_AddBoolToObject(o, "insecure", s->insecure || s->http_insecure);
    if (s->http_listen) {
        cJSON *h = cJSON_AddObjectToObject(o, "http");
        cJSON_AddStringToObject(h, "listen", s->http_listen);
        cJSON_AddBoolToObject(h, "auth", s->http_auth);
        cJSON_AddBoolToObject(h, "insecure", s->http_insecure);
        cJSON_AddNumberToObject(h, "connections", s->http_connections);
        cJSON_AddNumberToObject(h, "requests", (double)s->http_requests);
        cJSON_AddNumberToObject(h, "evicted", (double)s->http_evicted);
        cJSON_AddNumberToObject(h, "timed_out", (double)s->http_timed_out);
        cJSON_AddNumberToObject(h, "body_bytes", (double)s->http_body_bytes);
        cJSON_AddNumberToObject(h, "body_refused", (double)s->http_body_refused);
        cJSON_AddBoolToObject(h, "tls", s->http_tls);
        cJSON_AddNumberToObject(h, "tls_plain_refused", (double)s->http_tls_plain);
        cJSON_AddNumberToObject(h, "tls_failed", (double)s->http_tls_failed);
    }
    char *text = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    return text;
}

typedef struct {
    char *buf;
    size_t len, cap;
    int oom;
} mx_text;

static void put(mx_text *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void put(mx_text *t, const char *fmt, ...)
{
    if (t->oom)
        return;
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int n = vsnprintf(t->buf + t->len, t->cap - t->len, fmt, ap);
        va_end(ap);
        if (n < 0) {
            t->oom = 1;
            return;
        }
        if ((size_t)n < t->cap - t->len) {
            t->len += (size_t)n;
            return;
        }
        size_t cap = t->cap * 2 + (size_t)n;
        char *b = realloc(t->buf, cap);
        if (!b) {
            t->oom = 1;
            return;
        }
        t->buf = b;
        t->cap = cap;
    }
}

/* One metric: # HELP, # TYPE and a sample line. Names follow vLLM's
 * (vllm:num_requests_running, ...) under our own prefix. */
static void metric(mx_text *t, const char *name, const char *type, const char *help, const char *labels, double v)
{
    put(t, "# HELP rolloutd:%s %s\n# TYPE rolloutd:%s %s\n", name, help, name, type);
    put(t, "rolloutd:%s{%s} %.17g\n", name, labels, v);
}

/* A metric under another engine's name (vllm:..., sglang:...), its labels as that engine writes them. */
static void metric_as(mx_text *t, const char *name, const char *type, const char *help, const char *labels, double v)
{
    put(t, "# HELP %s %s\n# TYPE %s %s\n%s{%s} %.17g\n", name, help, name, type, name, labels, v);
}

static double hit_rate(const mx_snapshot *s)
{
    return s->eng.prefix_query_tokens > 0 ? (double)s->eng.prefix_hit_tokens / (double)s->eng.prefix_query_tokens
                                          : 0.0;
}

/* Prompt tokens as vLLM and SGLang count them (each request's whole prompt): the rows the engine computed
 * plus those the prefix cache served. rolloutd:prompt_tokens_total counts the computed rows alone. */
static double prompt_tokens_all(const mx_snapshot *s)
{
    return (double)s->eng.prompt_tokens + (double)s->eng.prefix_hit_tokens;
}

/* The numbers frameworks, gateway schedulers and autoscalers scrape, under the names they scrape:
 * vLLM's (vllm/v1/metrics/loggers.py: labels model_name and engine; counters exposed with _total, as
 * prometheus_client writes them; prime-rl's orchestrator reads kv_cache_usage_perc, num_requests_running
 * and num_requests_waiting to pace its requests) and SGLang's (python/sglang/srt/metrics/collector.py: the
 * scheduler's gauges labelled model_name, engine_type, tp_rank, pp_rank; the tokenizer manager's counters
 * model_name, engine_type). One engine, rank 0, unified (no disaggregation). */
static void framework_metrics(mx_text *t, const mx_snapshot *s, const char *esc)
{
    char v[600], sg[700], st[640];
    snprintf(v, sizeof v, "model_name=\"%s\",engine=\"0\"", esc);
    snprintf(sg, sizeof sg, "model_name=\"%s\",engine_type=\"unified\",tp_rank=\"0\",pp_rank=\"0\"", esc);
    snprintf(st, sizeof st, "model_name=\"%s\",engine_type=\"unified\"", esc);
    double waiting = (double)s->eng.waiting + s->queued;
    metric_as(t, "vllm:num_requests_running", "gauge", "Number of requests in model execution batches.", v,
              s->eng.running);
    metric_as(t, "vllm:num_requests_waiting", "gauge", "Number of requests waiting to be processed.", v, waiting);
    metric_as(t, "vllm:kv_cache_usage_perc", "gauge", "KV-cache usage. 1 means 100 percent usage.", v, usage(s));
    metric_as(t, "vllm:num_preemptions_total", "counter", "Cumulative number of preemption from the engine.", v,
              (double)s->eng.preemptions);
    metric_as(t, "vllm:prompt_tokens_total", "counter", "Number of prefill tokens processed.", v,
              prompt_tokens_all(s));
    metric_as(t, "vllm:generation_tokens_total", "counter", "Number of generation tokens processed.", v,
              (double)s->eng.generated_tokens);
    metric_as(t, "vllm:prefix_cache_queries_total", "counter",
              "Prefix cache queries, in terms of number of queried tokens.", v, (double)s->eng.prefix_query_tokens);
    metric_as(t, "vllm:prefix_cache_hits_total", "counter", "Prefix cache hits, in terms of number of cached tokens.",
              v, (double)s->eng.prefix_hit_tokens);
    metric_as(t, "vllm:spec_decode_num_draft_tokens_total", "counter", "Number of draft tokens.", v,
              (double)s->eng.spec_drafted);
    metric_as(t, "vllm:spec_decode_num_accepted_tokens_total", "counter", "Number of accepted tokens.", v,
              (double)s->eng.spec_accepted);
    /* vLLM's info gauge: the cache config as labels (no model_name), value 1; prime-rl reads the pool's
     * size in tokens from num_gpu_blocks x block_size */
    put(t, "# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig\n"
           "# TYPE vllm:cache_config_info gauge\n"
           "vllm:cache_config_info{block_size=\"%d\",cache_dtype=\"%s\",enable_prefix_caching=\"%s\","
           "num_gpu_blocks=\"%d\",engine=\"0\"} 1\n",
        s->block_size, s->kv_dtype ? s->kv_dtype : "auto", s->prefix_cache ? "True" : "False",
        s->eng.kv_blocks_total);
    double tokens_used = (double)s->eng.kv_blocks_used * s->block_size;
    metric_as(t, "sglang:num_running_reqs", "gauge", "The number of running requests.", sg, s->eng.running);
    metric_as(t, "sglang:num_queue_reqs", "gauge", "The number of requests in the waiting queue.", sg, waiting);
    metric_as(t, "sglang:num_used_tokens", "gauge", "The number of used tokens.", sg, tokens_used);
    metric_as(t, "sglang:max_total_num_tokens", "gauge", "Maximum total number of tokens in the KV cache pool.", sg,
              (double)s->eng.kv_blocks_total * s->block_size);
    metric_as(t, "sglang:token_usage", "gauge", "The token usage.", sg, usage(s));
    metric_as(t, "sglang:gen_throughput", "gauge", "The generation throughput (token/s).", sg,
              s->generated_tokens_per_s);
    metric_as(t, "sglang:cache_hit_rate", "gauge", "The prefix cache hit rate.", sg, hit_rate(s));
    metric_as(t, "sglang:prompt_tokens_total", "counter", "Number of prefill tokens processed.", st,
              prompt_tokens_all(s));
    metric_as(t, "sglang:generation_tokens_total", "counter", "Number of generation tokens processed.", st,
              (double)s->eng.generated_tokens);
    metric_as(t, "sglang:cached_tokens_total", "counter", "Number of cached prompt tokens.", st,
              (double)s->eng.prefix_hit_tokens);
    metric_as(t, "sglang:num_requests_total", "counter", "Number of requests processed.", st,
              (double)(s->eng.completed + s->eng.aborted));
    metric_as(t, "sglang:num_aborted_requests_total", "counter", "Number of requests aborted.", st,
              (double)s->eng.aborted);
}

/* Escapes a label value as the text format wants it (backslash, quote, newline). */
static void label_escape(const char *in, char *esc, size_t cap)
{
    size_t k = 0;
    for (const char *p = in; *p && k < cap - 3; p++) {
        if (*p == '\\' || *p == '"')
            esc[k++] = '\\';
        if (*p == '\n') {
            esc[k++] = '\\';
            esc[k++] = 'n';
            continue;
        }
        esc[k++] = *p;
    }
    esc[k] = 0;
}

char *mx_prometheus(const mx_snapshot *s)
{
    mx_text t = {malloc(4096), 0, 4096, 0};
    if (!t.buf)
        return NULL;
    t.buf[0] = 0;
    char labels[600];
    /* The model name is the one label (low cardinality, as vLLM's model_name). */
    char esc[520];
    label_escape(s->model, esc, sizeof esc);
    snprintf(labels, sizeof labels, "model_name=\"%s\"", esc);
    metric(&t, "num_requests_running", "gauge", "Sequences in the running batch.", labels, s->eng.running);
    metric(&t, "num_requests_waiting", "gauge", "Sequences waiting to be scheduled (queued included).", labels,
           s->eng.waiting + s->queued);
    metric(&t, "kv_cache_usage_perc", "gauge", "KV cache usage: blocks used / blocks total (1 = full).", labels,
           usage(s));
    metric(&t, "kv_cache_blocks_used", "gauge", "KV cache blocks in use.", labels, s->eng.kv_blocks_used);
    metric(&t, "kv_cache_blocks_total", "gauge", "KV cache blocks in the pool.", labels, s->eng.kv_blocks_total);
    metric(&t, "prompt_tokens_total", "counter", "Prompt tokens computed (recomputation after preemption included).",
           labels, (double)s->eng.prompt_tokens);
    metric(&t, "generation_tokens_total", "counter", "Tokens generated.", labels, (double)s->eng.generated_tokens);
    metric(&t, "num_preemptions_total", "counter", "Sequences preempted (recompute).", labels,
           (double)s->eng.preemptions);
    metric(&t, "prefix_cache_queries_total", "counter",
           "Prompt tokens looked up in the prefix cache (full blocks, salted with the weight version).", labels,
           (double)s->eng.prefix_query_tokens);
    metric(&t, "prefix_cache_hits_total", "counter", "Prompt tokens served from the prefix cache, not recomputed.",
           labels, (double)s->eng.prefix_hit_tokens);
    metric(&t, "spec_decode_num_draft_tokens_total", "counter", "Drafted tokens verified (speculative decoding).",
           labels, (double)s->eng.spec_drafted);
    metric(&t, "spec_decode_num_accepted_tokens_total", "counter",
           "Drafted tokens kept: drawn as drafted (speculative decoding).", labels, (double)s->eng.spec_accepted);
    metric(&t, "request_success_total", "counter", "Samples finished (stop, length or error).", labels,
           (double)s->eng.completed);
    metric(&t, "request_aborted_total", "counter", "Samples finished by abort.", labels, (double)s->eng.aborted);
    metric(&t, "engine_steps_total", "counter", "Engine forward passes.", labels, (double)s->eng.steps);
    metric(&t, "lora_adapters", "gauge", "LoRA adapters resident.", labels, s->loras ? s->loras->n : 0);
    if (s->loras && s->loras->n > 0) {
        put(&t, "# HELP rolloutd:lora_adapter_bytes A resident LoRA adapter's backend bytes (labels: its name and "
            "version).\n# TYPE rolloutd:lora_adapter_bytes gauge\n");
        for (int32_t i = 0; i < s->loras->n; i++) {
            char name[2 * LORA_NAME_MAX];
            label_escape(s->loras->e[i].name, name, sizeof name);
            put(&t, "rolloutd:lora_adapter_bytes{%s,adapter=\"%s\",version=\"%llu\"} %lld\n", labels, name,
                (unsigned long long)s->loras->e[i].version, (long long)s->loras->e[i].bytes);
        }
    }
    metric(&t, "lora_pushes_total", "counter", "LoRA adapter pushes (ADAPTER_BEGIN) committed.", labels,
           (double)s->lora_pushes_ok);
    metric(&t, "lora_push_failures_total", "counter", "LoRA adapter pushes aborted or refused at commit.", labels,
           (double)s->lora_pushes_failed);
    metric(&t, "weight_version", "gauge", "Policy (weight) version now serving.", labels, (double)s->weight_version);
    metric(&t, "weight_updates_total", "counter", "Weight updates swapped in.", labels, (double)s->updates_ok);
    metric(&t, "weight_update_failures_total", "counter", "Weight transfers aborted or refused at commit.", labels,
           (double)s->updates_failed);
    metric(&t, "weight_update_bytes_total", "counter", "Bytes of weight updates swapped in.", labels,
           (double)s->update_bytes_total);
    metric(&t, "weight_update_in_progress", "gauge", "1 while a weight transfer is open.", labels, s->update_active);
    metric(&t, "weight_update_staged_bytes", "gauge", "Bytes of the open weight transfer staged so far.", labels,
           (double)s->update_staged);
    metric(&t, "weight_update_total_bytes", "gauge", "Bytes of the open weight transfer.", labels,
           (double)s->update_total);
    metric(&t, "weight_update_relays_refused_total", "counter",
           "UPDATE_FORWARDs refused FORBIDDEN: the target is outside relay_allow.", labels, (double)s->relays_refused);
    metric(&t, "lane_connections", "gauge", "Data lane connections open.", labels, s->lane_connections);
    metric(&t, "lane_connections_evicted_total", "counter",
           "Data lane connections that had not proven themselves, closed at max_lane_connections.", labels,
           (double)s->lane_evicted);
    metric(&t, "lane_connections_refused_total", "counter",
           "New data lane connections answered BUSY: every open one was a proven sender.", labels,
           (double)s->lane_refused);
    const up_last *lu = s->last_update;
    int have = lu && lu->happened && lu->ok;
    metric(&t, "weight_update_last_stall_seconds", "gauge", "Engine stall of the last swap.", labels,
           have ? (double)lu->stall_us / 1e6 : 0);
    metric(&t, "weight_update_last_duration_seconds", "gauge", "UPDATE_BEGIN to swap of the last update.", labels,
           have ? (double)(lu->staged_us + lu->wait_us) / 1e6 : 0);
    metric(&t, "learners_connected", "gauge", "Clients known to the daemon.", labels, s->learners);
    metric(&t, "protocol_errors_total", "counter", "ERROR replies sent on the learner socket.", labels,
           (double)s->protocol_errors);
    metric(&t, "uptime_seconds", "gauge", "Seconds since the daemon started.", labels, s->uptime_s);
    framework_metrics(&t, s, esc);
    if (t.oom) {
        free(t.buf);
        return NULL;
    }
    return t.buf;
}

/* ---- SGLang's load reports ---- */

/* One field of a rank's load, for both forms of /v1/loads. */
typedef struct {
    const char *section;        /* NULL: the rank's own fields; else the nested object's JSON name */
    const char *prom;           /* the section's prefix in ?format=prometheus names (SGLang: spec, disagg) */
    const char *name;
    double v;
    int is_int;
} mx_field;

/* The fields sections asks for, in SGLang's order (GetLoadsReqOutput in managers/io_struct.py). Tokens
 * are KV slots: blocks x block_size. SGLang's num_total_tokens also counts the waiting prompts' tokens,
 * which the engine's snapshot does not hold: here it is the tokens in use. Sections SGLang leaves out
 * when they are None are left out (lora, disaggregation; speculative while speculative decoding is off);
 * so is utilization, which has no counterpart here. */
static int load_fields(const mx_snapshot *s, unsigned sections, double unix_s, mx_field *f)
{
    int n = 0;
    double block = s->block_size, used = (double)s->eng.kv_blocks_used * block;
    double total = (double)s->eng.kv_blocks_total * block, waiting = (double)s->eng.waiting + s->queued;
    f[n++] = (mx_field){NULL, NULL, "dp_rank", 0, 1};
    f[n++] = (mx_field){NULL, NULL, "timestamp", unix_s, 0};
    if (sections & MX_LOADS_CORE) {
        f[n++] = (mx_field){NULL, NULL, "num_running_reqs", s->eng.running, 1};
        f[n++] = (mx_field){NULL, NULL, "num_waiting_reqs", waiting, 1};
        f[n++] = (mx_field){NULL, NULL, "num_used_tokens", used, 1};
        f[n++] = (mx_field){NULL, NULL, "num_total_tokens", used, 1};
        f[n++] = (mx_field){NULL, NULL, "max_total_num_tokens", total, 1};
        f[n++] = (mx_field){NULL, NULL, "token_usage", usage(s), 0};
        f[n++] = (mx_field){NULL, NULL, "gen_throughput", s->generated_tokens_per_s, 0};
        f[n++] = (mx_field){NULL, NULL, "cache_hit_rate", hit_rate(s), 0};
        f[n++] = (mx_field){NULL, NULL, "max_running_requests", s->max_num_seqs, 1};
    }
    if (sections & MX_LOADS_MEMORY) {
        f[n++] = (mx_field){"memory", "memory", "weight_gb", (double)s->weights_bytes / (1 << 30), 0};
        f[n++] = (mx_field){"memory", "memory", "kv_cache_gb", (double)s->kv_bytes / (1 << 30), 0};
        f[n++] = (mx_field){"memory", "memory", "graph_gb", 0, 0};
        f[n++] = (mx_field){"memory", "memory", "token_capacity", total, 1};
    }
    if ((sections & MX_LOADS_SPEC) && s->eng.spec_decode != ENG_SPEC_OFF) {
        /* SGLang's accept length: tokens a verify step yields (the accepted drafts and the one drawn after) */
        double steps = (double)s->eng.spec_steps;
        f[n++] = (mx_field){"speculative", "spec", "accept_length",
                            steps > 0 ? ((double)s->eng.spec_accepted + steps) / steps : 0.0, 0};
        f[n++] = (mx_field){"speculative", "spec", "accept_rate",
                            s->eng.spec_drafted > 0 ? (double)s->eng.spec_accepted / (double)s->eng.spec_drafted
                                                    : 0.0, 0};
    }
    if (sections & MX_LOADS_QUEUES) {
        f[n++] = (mx_field){"queues", "queues", "waiting", waiting, 1};
        f[n++] = (mx_field){"queues", "queues", "grammar", 0, 1};
        /* a keep (in-place) pause holds every running sequence where it is */
        f[n++] = (mx_field){"queues", "queues", "paused", s->eng.paused ? s->eng.running : 0, 1};
        f[n++] = (mx_field){"queues", "queues", "retracted", 0, 1}; /* a retract puts them back in waiting */
    }
    return n;
}

#define MX_MAX_LOAD_FIELDS 32

char *mx_loads_json(const mx_snapshot *s, unsigned sections, double unix_s)
{
    mx_field f[MX_MAX_LOAD_FIELDS];
    int n = load_fields(s, sections, unix_s, f);
    cJSON *o = cJSON_CreateObject();
    if (!o)
        return NULL;
    /* datetime.now(timezone.utc).isoformat(), as SGLang writes it */
    time_t sec = (time_t)unix_s;
    struct tm tm;
    char iso[64] = "";
    if (gmtime_r(&sec, &tm)) {
        size_t k = strftime(iso, sizeof iso, "%Y-%m-%dT%H:%M:%S", &tm);
        snprintf(iso + k, sizeof iso - k, ".%06d+00:00", (int)((unix_s - (double)sec) * 1e6));
    }
    cJSON_AddStringToObject(o, "timestamp", iso);
    cJSON_AddStringToObject(o, "version", s->server ? s->server : "rolloutd");
    cJSON_AddNullToObject(o, "accelerator"); /* SGLang: the device's marketing name, None when unknown */
    cJSON_AddNumberToObject(o, "num_accelerators", 1);
    cJSON *load = cJSON_CreateObject();
    cJSON_AddItemToArray(cJSON_AddArrayToObject(o, "loads"), load);
    for (int i = 0; load && i < n; i++) {
        cJSON *into = load;
        if (f[i].section && !(into = cJSON_GetObjectItemCaseSensitive(load, f[i].section)))
            into = cJSON_AddObjectToObject(load, f[i].section);
        cJSON_AddNumberToObject(into, f[i].name, f[i].v);
    }
    char *text = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    return text;
}

char *mx_loads_prometheus(const mx_snapshot *s, unsigned sections, double unix_s)
{
    mx_field f[MX_MAX_LOAD_FIELDS];
    int n = load_fields(s, sections, unix_s, f);
    mx_text t = {malloc(2048), 0, 2048, 0};
    if (!t.buf)
        return NULL;
    t.buf[0] = 0;
    /* _format_loads_prometheus (entrypoints/v1_loads.py): every number but dp_rank, one gauge each,
     * sglang_<field> or sglang_<section>_<field>, labelled with the rank */
    for (int i = 0; i < n; i++) {
        if (!strcmp(f[i].name, "dp_rank"))
            continue;
        char name[96];
        snprintf(name, sizeof name, "sglang_%s%s%s", f[i].prom ? f[i].prom : "", f[i].prom ? "_" : "", f[i].name);
        put(&t, "# TYPE %s gauge\n%s{dp_rank=\"0\"} %.17g\n", name, name, f[i].v);
    }
    if (t.oom) {
        free(t.buf);
        return NULL;
    }
    return t.buf;
}

char *mx_get_load_json(const mx_snapshot *s, double unix_s)
{
    cJSON *a = cJSON_CreateArray(), *o = cJSON_CreateObject();
    if (!a || !o) {
        cJSON_Delete(a);
        cJSON_Delete(o);
        return NULL;
    }
    cJSON_AddItemToArray(a, o);
    double waiting = (double)s->eng.waiting + s->queued;
    cJSON_AddNumberToObject(o, "dp_rank", 0);
    cJSON_AddNumberToObject(o, "num_reqs", s->eng.running + waiting); /* running and waiting, as SGLang counts */
    cJSON_AddNumberToObject(o, "num_waiting_reqs", waiting);
    cJSON_AddNumberToObject(o, "num_tokens", (double)s->eng.kv_blocks_used * s->block_size);
    cJSON_AddNumberToObject(o, "ts_tic", unix_s);
    char *text = cJSON_PrintUnformatted(a);
    cJSON_Delete(a);
    return text;
}
