/* rollout-protodump - decodes protocol frames and prints their fields as JSON,
 * for debugging and for checking the C decoder against the Python one.
 *
 *   rollout-protodump [--max-len BYTES] FILE...
 *   rollout-protodump --crc32c FILE...
 *
 * Each FILE holds one frame. For each, one line: the message in the JSON form
 * of tools/python/rolloutd/proto.py to_json (u64 fields as decimal strings,
 * f32 values as numbers or "nan"/"inf"/"-inf", top-k arrays flat, chunk data
 * as lowercase hex), or {"error": CODE, "error_name": NAME, "message": WHY}
 * when the decoder refuses the frame. Exit status 0 when every frame decoded,
 * 1 when any was refused, 2 on bad usage or an unreadable file.
 *
 * With --crc32c, each FILE is any file: one line "CRC SIZE FILE", the CRC-32C
 * of its bytes as 8 lowercase hex digits (base/crc32c.h, the checksum of
 * weight updates) and its size in bytes. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "base/crc32c.h"
#include "base/err.h"
#include "proto/proto.h"
#include "tools/cli.h"

static void add_u64(cJSON *o, const char *k, uint64_t v)
{
    char s[24];
    snprintf(s, sizeof s, "%llu", (unsigned long long)v);
    cJSON_AddStringToObject(o, k, s);
}

static void add_num(cJSON *o, const char *k, double v) { cJSON_AddNumberToObject(o, k, v); }

static cJSON *f32_json(float f)
{
    if (isnan(f))
        return cJSON_CreateString("nan");
    if (isinf(f))
        return cJSON_CreateString(f > 0 ? "inf" : "-inf");
    /* %.17g: the float's exact value as a double (cJSON's own printing may
     * round the last digit) */
    char num[40];
    snprintf(num, sizeof num, "%.17g", (double)f);
    return cJSON_CreateRaw(num);
}

static void add_f32(cJSON *o, const char *k, float f) { cJSON_AddItemToObject(o, k, f32_json(f)); }

static void add_str(cJSON *o, const char *k, proto_str s)
{
    /* cJSON strings are NUL-terminated: decoded strings are (an inner NUL would cut it) */
    cJSON_AddStringToObject(o, k, s.len ? s.ptr : "");
}

static void add_i32s(cJSON *o, const char *k, const int32_t *a, uint64_t n)
{
    cJSON *arr = cJSON_AddArrayToObject(o, k);
    for (uint64_t i = 0; i < n; i++)
        cJSON_AddItemToArray(arr, cJSON_CreateNumber(a[i]));
}

static void add_f32s(cJSON *o, const char *k, const float *a, uint64_t n)
{
    cJSON *arr = cJSON_AddArrayToObject(o, k);
    for (uint64_t i = 0; i < n; i++)
        cJSON_AddItemToArray(arr, f32_json(a[i]));
}

static void hello_ok_json(cJSON *o, const proto_hello_ok *h)
{
    add_u64(o, "client_id", h->client_id);
    add_num(o, "version", h->version);
    add_num(o, "flags", h->flags);
    add_u64(o, "features", h->features);
    add_u64(o, "weight_version", h->weight_version);
    add_num(o, "vocab_size", h->vocab_size);
    add_num(o, "max_context", h->max_context);
    add_num(o, "n_layers", h->n_layers);
    add_num(o, "dim", h->dim);
    add_num(o, "n_heads", h->n_heads);
    add_num(o, "n_kv_heads", h->n_kv_heads);
    add_num(o, "eos_id", h->eos_id);
    add_num(o, "max_prompt_tokens", h->max_prompt_tokens);
    add_u64(o, "max_message_bytes", h->max_message_bytes);
    add_num(o, "max_n", h->max_n);
    add_num(o, "max_requests_per_submit", h->max_requests_per_submit);
    add_num(o, "max_tokens", h->max_tokens);
    add_num(o, "max_stop_ids", h->max_stop_ids);
    add_num(o, "max_logprobs_topk", h->max_logprobs_topk);
    add_num(o, "retention_results", h->retention_results);
    add_u64(o, "retention_bytes", h->retention_bytes);
    add_num(o, "max_wait_ms", h->max_wait_ms);
    add_num(o, "client_ttl_s", h->client_ttl_s);
    add_num(o, "pending_results", h->pending_results);
    add_num(o, "inflight_samples", h->inflight_samples);
    add_str(o, "model_name", h->model_name);
    add_str(o, "architecture", h->architecture);
    add_str(o, "backend", h->backend);
    add_str(o, "server", h->server);
}

static cJSON *request_json(const proto_request *r)
{
    cJSON *o = cJSON_CreateObject();
    add_u64(o, "client_req_id", r->client_req_id);
    add_num(o, "n", r->n);
    add_num(o, "max_tokens", r->max_tokens);
    add_f32(o, "temperature", r->temperature);
    add_f32(o, "top_p", r->top_p);
    add_num(o, "top_k", r->top_k);
    add_f32(o, "min_p", r->min_p);
    add_u64(o, "seed", r->seed);
    add_num(o, "logprobs_topk", r->logprobs_topk);
    add_num(o, "flags", r->flags);
    add_i32s(o, "stop_ids", r->stop_ids, r->n_stop);
    add_i32s(o, "prompt_ids", r->prompt, r->n_prompt);
    add_str(o, "prompt_text", r->text);
    return o;
}

static cJSON *result_json(const proto_result *r)
{
    cJSON *o = cJSON_CreateObject();
    uint64_t nk = (uint64_t)r->n_tokens * r->top_k;
    add_u64(o, "seq", r->seq);
    add_u64(o, "client_req_id", r->client_req_id);
    add_num(o, "sample_idx", r->sample_idx);
    add_num(o, "finish", r->finish);
    add_num(o, "flags", r->flags);
    add_num(o, "top_k", r->top_k);
    add_num(o, "n_preempt", r->n_preempt);
    add_num(o, "n_prompt", r->n_prompt);
    add_u64(o, "seed", r->seed);
    add_u64(o, "version_admit", r->version_admit);
    add_u64(o, "version_finish", r->version_finish);
    add_u64(o, "queued_us", r->queued_us);
    add_u64(o, "first_token_us", r->first_token_us);
    add_u64(o, "total_us", r->total_us);
    add_i32s(o, "token_ids", r->token_ids, r->n_tokens);
    add_f32s(o, "logprobs", r->logprobs, r->n_tokens);
    if (r->logprobs_processed)
        add_f32s(o, "logprobs_processed", r->logprobs_processed, r->n_tokens);
    else if (r->flags & PROTO_RESULT_PROCESSED)
        cJSON_AddArrayToObject(o, "logprobs_processed");
    else
        cJSON_AddNullToObject(o, "logprobs_processed");
    add_i32s(o, "top_ids", r->top_ids, nk);
    add_f32s(o, "top_logprobs", r->top_logprobs, nk);
    cJSON *spans = cJSON_AddArrayToObject(o, "spans");
    for (uint32_t i = 0; i < r->n_spans; i++) {
        cJSON *s = cJSON_CreateObject();
        add_num(s, "start", r->spans[i].start);
        add_num(s, "end", r->spans[i].end);
        add_u64(s, "version", r->spans[i].version);
        cJSON_AddItemToArray(spans, s);
    }
    return o;
}

static cJSON *tensor_json(const proto_tensor *t)
{
    cJSON *o = cJSON_CreateObject();
    add_str(o, "name", t->name);
    add_num(o, "dtype", t->dtype);
    cJSON *shape = cJSON_AddArrayToObject(o, "shape");
    for (uint32_t d = 0; d < t->n_dims; d++) {
        char s[24];
        snprintf(s, sizeof s, "%llu", (unsigned long long)t->shape[d]);
        cJSON_AddItemToArray(shape, cJSON_CreateString(s));
    }
    add_u64(o, "nbytes", t->nbytes);
    add_num(o, "crc32c", t->crc32c);
    return o;
}

static void add_hex(cJSON *o, const char *k, const uint8_t *p, uint32_t n)
{
    static const char digits[] = "0123456789abcdef";
    char *s = malloc(2 * (size_t)n + 1);
    if (!s) {
        fprintf(stderr, "rollout-protodump: out of memory\n");
        exit(2);
    }
    for (uint32_t i = 0; i < n; i++) {
        s[2 * i] = digits[p[i] >> 4];
        s[2 * i + 1] = digits[p[i] & 15];
    }
    s[2 * (size_t)n] = 0;
    cJSON_AddStringToObject(o, k, s);
    free(s);
}

static cJSON *msg_json(const proto_msg *m)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "type", proto_type_name(m->type));
    switch (m->type) {
    case PROTO_HELLO:
        add_u64(o, "client_id", m->hello.client_id);
        add_num(o, "min_version", m->hello.min_version);
        add_num(o, "max_version", m->hello.max_version);
        add_num(o, "flags", m->hello.flags);
        add_str(o, "client_name", m->hello.client_name);
        break;
    case PROTO_HELLO_OK: hello_ok_json(o, &m->hello_ok); break;
    case PROTO_SUBMIT: {
        add_u64(o, "client_id", m->submit.client_id);
        cJSON *a = cJSON_AddArrayToObject(o, "requests");
        for (uint32_t i = 0; i < m->submit.n_requests; i++)
            cJSON_AddItemToArray(a, request_json(&m->submit.requests[i]));
        break;
    }
    case PROTO_SUBMIT_OK: {
        cJSON *a = cJSON_AddArrayToObject(o, "items");
        for (uint32_t i = 0; i < m->submit_ok.n_items; i++) {
            const proto_submit_item *it = &m->submit_ok.items[i];
            cJSON *x = cJSON_CreateObject();
            add_u64(x, "client_req_id", it->client_req_id);
            add_num(x, "status", it->status);
            add_num(x, "flags", it->flags);
            add_str(x, "message", it->message);
            cJSON_AddItemToArray(a, x);
        }
        break;
    }
    case PROTO_FETCH:
        add_u64(o, "client_id", m->fetch.client_id);
        add_u64(o, "ack_seq", m->fetch.ack_seq);
        add_num(o, "max_results", m->fetch.max_results);
        add_num(o, "wait_ms", m->fetch.wait_ms);
        add_u64(o, "max_bytes", m->fetch.max_bytes);
        break;
    case PROTO_RESULTS: {
        add_u64(o, "ack_seq", m->results.ack_seq);
        add_num(o, "pending_results", m->results.pending_results);
        add_num(o, "inflight_samples", m->results.inflight_samples);
        cJSON *a = cJSON_AddArrayToObject(o, "results");
        for (uint32_t i = 0; i < m->results.n_results; i++)
            cJSON_AddItemToArray(a, result_json(&m->results.results[i]));
        break;
    }
    case PROTO_ABORT:
        add_u64(o, "client_id", m->abort_req.client_id);
        add_u64(o, "client_req_id", m->abort_req.client_req_id);
        add_num(o, "flags", m->abort_req.flags);
        break;
    case PROTO_ABORT_OK:
        add_num(o, "n_requests", m->abort_ok.n_requests);
        add_num(o, "n_samples", m->abort_ok.n_samples);
        break;
    case PROTO_STATUS: break;
    case PROTO_STATUS_OK: add_str(o, "json", m->status_ok.json); break;
    case PROTO_BYE:
        add_u64(o, "client_id", m->bye.client_id);
        add_num(o, "flags", m->bye.flags);
        break;
    case PROTO_BYE_OK:
        add_num(o, "pending_results", m->bye_ok.pending_results);
        add_num(o, "inflight_samples", m->bye_ok.inflight_samples);
        break;
    case PROTO_ERROR:
        add_num(o, "code", m->error.code);
        add_num(o, "request_type", m->error.request_type);
        add_num(o, "version_max", m->error.version_max);
        add_str(o, "message", m->error.message);
        break;
    case PROTO_UPDATE_BEGIN: {
        const proto_update_begin *u = &m->update_begin;
        add_u64(o, "client_id", u->client_id);
        add_u64(o, "version", u->version);
        add_num(o, "mode", u->mode);
        add_num(o, "window", u->window);
        add_num(o, "max_chunk_bytes", u->max_chunk_bytes);
        add_u64(o, "total_bytes", u->total_bytes);
        cJSON *a = cJSON_AddArrayToObject(o, "tensors");
        for (uint32_t i = 0; i < u->n_tensors; i++)
            cJSON_AddItemToArray(a, tensor_json(&u->tensors[i]));
        break;
    }
    case PROTO_UPDATE_BEGIN_OK:
        add_u64(o, "xfer_id", m->update_begin_ok.xfer_id);
        add_num(o, "window", m->update_begin_ok.window);
        add_num(o, "max_chunk_bytes", m->update_begin_ok.max_chunk_bytes);
        add_u64(o, "staging_bytes", m->update_begin_ok.staging_bytes);
        add_num(o, "data_port", m->update_begin_ok.data_port);
        break;
    case PROTO_UPDATE_CHUNK:
        add_u64(o, "xfer_id", m->update_chunk.xfer_id);
        add_num(o, "chunk_seq", m->update_chunk.chunk_seq);
        add_num(o, "tensor_index", m->update_chunk.tensor_index);
        add_u64(o, "offset", m->update_chunk.offset);
        add_num(o, "crc32c", m->update_chunk.crc32c);
        add_hex(o, "data", m->update_chunk.data, m->update_chunk.len);
        break;
    case PROTO_UPDATE_CHUNK_OK:
        add_u64(o, "xfer_id", m->update_chunk_ok.xfer_id);
        add_num(o, "chunk_seq", m->update_chunk_ok.chunk_seq);
        add_num(o, "flags", m->update_chunk_ok.flags);
        add_u64(o, "bytes_staged", m->update_chunk_ok.bytes_staged);
        add_u64(o, "total_bytes", m->update_chunk_ok.total_bytes);
        break;
    case PROTO_UPDATE_COMMIT: add_u64(o, "xfer_id", m->update_commit.xfer_id); break;
    case PROTO_UPDATE_COMMIT_OK:
        add_u64(o, "version", m->update_commit_ok.version);
        add_u64(o, "stall_us", m->update_commit_ok.stall_us);
        add_u64(o, "wait_us", m->update_commit_ok.wait_us);
        add_u64(o, "staged_us", m->update_commit_ok.staged_us);
        add_num(o, "n_aborted", m->update_commit_ok.n_aborted);
        break;
    case PROTO_UPDATE_ABORT: add_u64(o, "xfer_id", m->update_abort.xfer_id); break;
    case PROTO_UPDATE_ABORT_OK: add_u64(o, "bytes_freed", m->update_abort_ok.bytes_freed); break;
    case PROTO_AUTH_BEGIN:
    case PROTO_AUTH:
    case PROTO_AUTH_CHALLENGE:
    case PROTO_AUTH_OK: add_hex(o, "bytes", m->auth.bytes, PROTO_AUTH_BYTES); break;
    case PROTO_UPDATE_FORWARD: {
        const proto_update_forward *u = &m->update_forward;
        add_u64(o, "xfer_id", u->xfer_id);
        add_u64(o, "next_xfer_id", u->next_xfer_id);
        add_num(o, "port", u->port);
        add_num(o, "flags", u->flags);
        add_num(o, "window", u->window);
        add_str(o, "host", u->host);
        add_hex(o, "key", u->key, PROTO_AUTH_BYTES);
        break;
    }
    case PROTO_UPDATE_FORWARD_OK:
        add_u64(o, "xfer_id", m->update_forward_ok.xfer_id);
        add_u64(o, "queued_bytes", m->update_forward_ok.queued_bytes);
        break;
    case PROTO_UPDATE_PREPARE: add_u64(o, "xfer_id", m->update_prepare.xfer_id); break;
    case PROTO_UPDATE_PREPARE_OK: {
        const proto_update_prepare_ok *u = &m->update_prepare_ok;
        add_u64(o, "xfer_id", u->xfer_id);
        add_num(o, "state", u->state);
        add_num(o, "forward", u->forward);
        add_num(o, "forward_error", u->forward_error);
        add_u64(o, "bytes_staged", u->bytes_staged);
        add_u64(o, "total_bytes", u->total_bytes);
        add_u64(o, "forwarded_bytes", u->forwarded_bytes);
        break;
    }
    case PROTO_WEIGHTS_SYNC:
        add_u64(o, "client_id", m->weights_sync.client_id);
        add_str(o, "url", m->weights_sync.url);
        break;
    case PROTO_WEIGHTS_SYNC_OK: add_u64(o, "version", m->weights_sync_ok.version); break;
    case PROTO_LANE_AUTH:
        add_u64(o, "xfer_id", m->lane_auth.xfer_id);
        add_hex(o, "proof", m->lane_auth.proof, PROTO_AUTH_BYTES);
        break;
    }
    return o;
}

static int read_file(const char *path, uint8_t **data, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return rd_fail(RD_EIO, "cannot open %s", path);
    size_t cap = 4096, n = 0;
    uint8_t *buf = malloc(cap);
    for (;;) {
        if (n == cap) {
            uint8_t *b = realloc(buf, cap *= 2);
            if (!b) {
                free(buf);
                fclose(f);
                return rd_fail(RD_ENOMEM, "%s: out of memory", path);
            }
            buf = b;
        }
        size_t got = fread(buf + n, 1, cap - n, f);
        n += got;
        if (got == 0)
            break;
    }
    int err = ferror(f);
    fclose(f);
    if (err) {
        free(buf);
        return rd_fail(RD_EIO, "cannot read %s", path);
    }
    *data = buf;
    *len = n;
    return 0;
}

int main(int argc, char **argv)
{
    const char *prog = "rollout-protodump";
    size_t max_len = PROTO_DEFAULT_MAX_MESSAGE;
    int first = 1, any_refused = 0, crc_mode = 0;
    for (; first < argc && argv[first][0] == '-' && argv[first][1]; first++) {
        if (!strcmp(argv[first], "--crc32c")) {
            crc_mode = 1;
        } else if (!strcmp(argv[first], "--max-len")) {
            const char *v = cli_value(prog, argc, argv, &first);
            max_len = (size_t)cli_int(prog, "--max-len", v, 0, (long long)1 << 40);
        } else if (!strcmp(argv[first], "-h") || !strcmp(argv[first], "--help")) {
            printf("usage: rollout-protodump [--max-len BYTES] FILE...\n"
                   "       rollout-protodump --crc32c FILE...\n"
                   "  prints each frame's decoded fields as one JSON line (or its error);\n"
                   "  with --crc32c, each file's CRC-32C (8 hex digits), its size and its name\n");
            return 0;
        } else {
            fprintf(stderr, "%s: unknown flag %s; expected --max-len, --crc32c or files\n", prog, argv[first]);
            return 2;
        }
    }
    if (first >= argc) {
        fprintf(stderr, "usage: rollout-protodump [--max-len BYTES] FILE... | --crc32c FILE...\n");
        return 2;
    }
    if (crc_mode) {
        for (int i = first; i < argc; i++) {
            uint8_t *data = NULL;
            size_t len = 0;
            if (read_file(argv[i], &data, &len)) {
                fprintf(stderr, "%s: %s\n", prog, rd_errmsg());
                return 2;
            }
            printf("%08x %zu %s\n", crc32c(0, data, len), len, argv[i]);
            free(data);
        }
        return 0;
    }
    for (int i = first; i < argc; i++) {
        uint8_t *data = NULL;
        size_t len = 0;
        if (read_file(argv[i], &data, &len)) {
            fprintf(stderr, "%s: %s\n", prog, rd_errmsg());
            return 2;
        }
        proto_msg m;
        cJSON *o;
        if (proto_decode(data, len, max_len, &m) == 0) {
            o = msg_json(&m);
        } else {
            any_refused = 1;
            o = cJSON_CreateObject();
            add_num(o, "error", m.wire_error);
            cJSON_AddStringToObject(o, "error_name", proto_err_name(m.wire_error));
            cJSON_AddStringToObject(o, "message", rd_errmsg());
        }
        char *s = cJSON_PrintUnformatted(o);
        printf("%s\n", s);
        free(s);
        cJSON_Delete(o);
        proto_msg_free(&m);
        free(data);
    }
    return any_refused;
}
