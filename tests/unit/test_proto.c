/* test_proto.c - the wire protocol codec against its golden vectors and under
 * abuse.
 *
 * proto/testdata/vectors.json (written by tools/python/rolloutd/gen_golden.py
 * with the Python codec) lists valid frames with their decoded fields and
 * invalid frames with the error code a decoder must return. Here: every valid
 * frame decodes to its fields and re-encodes to the same bytes; the fields
 * built from the JSON encode to the same bytes; every invalid frame gives its
 * code; request checks give the listed codes; random messages of every type
 * round-trip; every truncation of every golden frame is refused; random byte
 * mutations never crash and whatever decodes re-encodes to the same bytes.
 * The weight-update messages (PROTOCOL.md §10) go through all of it, plus
 * their own checks: chunk data points into the frame, dense manifests stay
 * within the arena bound, the encoder refuses bad modes, dtypes and names.
 * So do version 2's routes (§4.6), plus test_routes: each width, the
 * version rules (a version-1 frame neither carries nor encodes them, the
 * request flag needs version 2 and the ROUTES feature), sizes, the arena.
 * Version 4's sampling tail likewise, plus test_sampling: the round trip of
 * the tail, the version rules (no tail before version 4, the flag refused
 * there), malformed tails (truncated, a count past the bytes, trailing
 * bytes), the range checks (NaN penalties, n_bias past PROTO_MAX_BIAS, ids
 * outside the vocabulary, repeated ids) and the arena.
 * Version 5's prompt scoring likewise, plus test_scoring: the request's score
 * tail after the sampling tail, a result's scores after the serve tail (bytes,
 * round trips, sizes), the version rules both ways, malformed scores (a count
 * past the bytes or not the prompt's, flags, trailing bytes), the checks
 * (score_from in 0..n_prompt, max_tokens 0 only when scoring and then n = 1,
 * the scores counted in the largest result) and the arena.
 * Version 6's LoRA adapters likewise, plus test_lora: the request's lora tail
 * after the score tail, a result's after its scores (bytes, round trips,
 * sizes), the version rules both ways, malformed tails (an empty, long, cut or
 * non-UTF-8 name, trailing bytes), the checks (the flag from version 6, a name
 * without NUL, the name counted in the largest result) and the arena, whose
 * bound version 6 raised to 3 x frame + 256.
 * Run from the repository root (RD_PROTO_TESTDATA overrides the folder). */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/crc32c.h"
#include "base/err.h"
#include "proto/proto.h"
#include "tests/unit/test.h"

/* ---- small helpers: files, a pool of test allocations, an RNG ---- */

static const char *testdata(void)
{
    const char *d = getenv("RD_PROTO_TESTDATA");
    return d && *d ? d : "proto/testdata";
}

static uint8_t *read_file(const char *name, size_t *len)
{
    char path[512];
    snprintf(path, sizeof path, "%s/%s", testdata(), name);
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *buf = malloc(n > 0 ? (size_t)n : 1);
    if (n > 0 && fread(buf, 1, (size_t)n, f) != (size_t)n) {
        free(buf);
        fclose(f);
        return NULL;
    }
    fclose(f);
    *len = (size_t)n;
    return buf;
}

static void *pool[1 << 16];
static int pool_n;

static void *palloc(size_t n)
{
    void *p = calloc(1, n ? n : 1);
    if (pool_n < (int)(sizeof pool / sizeof pool[0]))
        pool[pool_n++] = p;
    return p;
}

static void pool_free(void)
{
    while (pool_n)
        free(pool[--pool_n]);
}

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;
static uint64_t rnd(void)
{
    uint64_t x = rng_state;
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    rng_state = x;
    return x * 0x2545F4914F6CDD1Dull;
}
static uint32_t rnd_below(uint32_t n) { return n ? (uint32_t)(rnd() % n) : 0; }

static cJSON *vectors;

static int load_vectors(void)
{
    if (vectors)
        return 0;
    size_t len;
    char *text = (char *)read_file("vectors.json", &len);
    if (!text)
        return -1;
    char *z = realloc(text, len + 1);
    z[len] = 0;
    vectors = cJSON_Parse(z);
    free(z);
    return vectors ? 0 : -1;
}

/* ---- JSON (the form of proto.py to_json) -> proto_msg ---- */

static char jerr[256];

static const cJSON *jget(const cJSON *o, const char *k)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    if (!v && !jerr[0])
        snprintf(jerr, sizeof jerr, "missing key %s", k);
    return v;
}
static double jnum(const cJSON *o, const char *k)
{
    const cJSON *v = jget(o, k);
    return v && cJSON_IsNumber(v) ? v->valuedouble : 0;
}
static uint64_t ju64(const cJSON *o, const char *k)
{
    const cJSON *v = jget(o, k);
    return v && cJSON_IsString(v) ? strtoull(v->valuestring, NULL, 10) : 0;
}
static float jf32v(const cJSON *v)
{
    if (cJSON_IsString(v)) {
        if (!strcmp(v->valuestring, "nan")) return NAN;
        if (!strcmp(v->valuestring, "inf")) return INFINITY;
        return -INFINITY;
    }
    return (float)v->valuedouble;
}
static float jf32(const cJSON *o, const char *k)
{
    const cJSON *v = jget(o, k);
    return v ? jf32v(v) : 0;
}
static proto_str jstr(const cJSON *o, const char *k)
{
    const cJSON *v = jget(o, k);
    proto_str s = {"", 0};
    if (v && cJSON_IsString(v)) {
        s.ptr = v->valuestring;
        s.len = (uint32_t)strlen(v->valuestring);
    }
    return s;
}
static const int32_t *ji32s(const cJSON *o, const char *k, uint32_t *n)
{
    const cJSON *a = jget(o, k);
    *n = a ? (uint32_t)cJSON_GetArraySize(a) : 0;
    if (!*n)
        return NULL;
    int32_t *d = palloc(*n * sizeof *d);
    uint32_t i = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, a) d[i++] = (int32_t)e->valuedouble;
    return d;
}
static const float *jf32s(const cJSON *o, const char *k, uint32_t *n)
{
    const cJSON *a = jget(o, k);
    *n = a && cJSON_IsArray(a) ? (uint32_t)cJSON_GetArraySize(a) : 0;
    if (!*n)
        return NULL;
    float *d = palloc(*n * sizeof *d);
    uint32_t i = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, a) d[i++] = jf32v(e);
    return d;
}

static const uint8_t *jhex(const cJSON *o, const char *k, uint32_t *n)
{
    const cJSON *v = jget(o, k);
    *n = 0;
    if (!v || !cJSON_IsString(v))
        return NULL;
    size_t len = strlen(v->valuestring);
    *n = (uint32_t)(len / 2);
    uint8_t *d = palloc(*n);
    for (uint32_t i = 0; i < *n; i++) {
        unsigned x = 0;
        sscanf(v->valuestring + 2 * i, "%2x", &x);
        d[i] = (uint8_t)x;
    }
    return d;
}

static uint64_t ju64v(const cJSON *v) { return cJSON_IsString(v) ? strtoull(v->valuestring, NULL, 10) : 0; }

static uint16_t type_by_name(const char *name)
{
    for (int t = 0; t < 0x100; t++) {
        const char *n = proto_type_name((uint16_t)t);
        if (n && !strcmp(n, name))
            return (uint16_t)t;
    }
    return 0;
}

/* A manifest's tensors from vectors.json. */
static proto_tensor *json_tensors(const cJSON *a, uint32_t *n_out)
{
    uint32_t n = a ? (uint32_t)cJSON_GetArraySize(a) : 0;
    proto_tensor *t = n ? palloc(n * sizeof *t) : NULL;
    uint32_t i = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, a) {
        t[i].name = jstr(e, "name");
        t[i].dtype = (uint8_t)jnum(e, "dtype");
        const cJSON *sh = jget(e, "shape"), *d;
        t[i].n_dims = sh ? (uint8_t)cJSON_GetArraySize(sh) : 0;
        uint32_t k = 0;
        cJSON_ArrayForEach(d, sh) {
            if (k < PROTO_MAX_DIMS)
                t[i].shape[k] = ju64v(d);
            k++;
        }
        t[i].nbytes = ju64(e, "nbytes");
        t[i].crc32c = (uint32_t)jnum(e, "crc32c");
        t[i].flags = (uint16_t)jnum(e, "flags");
        if (t[i].flags & PROTO_TENSOR_DELTA) {
            t[i].wire_bytes = ju64(e, "wire_bytes");
            t[i].base_version = ju64(e, "base_version");
        }
        i++;
    }
    *n_out = n;
    return t;
}

static void json_to_msg(const cJSON *o, proto_msg *m)
{
    memset(m, 0, sizeof *m);
    const cJSON *t = jget(o, "type");
    m->type = t && cJSON_IsString(t) ? type_by_name(t->valuestring) : 0;
    switch (m->type) {
    case PROTO_HELLO: {
        proto_hello *h = &m->hello;
        h->client_id = ju64(o, "client_id");
        h->min_version = (uint16_t)jnum(o, "min_version");
        h->max_version = (uint16_t)jnum(o, "max_version");
        h->flags = (uint32_t)jnum(o, "flags");
        h->client_name = jstr(o, "client_name");
        break;
    }
    case PROTO_HELLO_OK: {
        proto_hello_ok *h = &m->hello_ok;
        h->client_id = ju64(o, "client_id");
        h->version = (uint16_t)jnum(o, "version");
        h->flags = (uint32_t)jnum(o, "flags");
        h->features = ju64(o, "features");
        h->weight_version = ju64(o, "weight_version");
        h->vocab_size = (uint32_t)jnum(o, "vocab_size");
        h->max_context = (uint32_t)jnum(o, "max_context");
        h->n_layers = (uint32_t)jnum(o, "n_layers");
        h->dim = (uint32_t)jnum(o, "dim");
        h->n_heads = (uint32_t)jnum(o, "n_heads");
        h->n_kv_heads = (uint32_t)jnum(o, "n_kv_heads");
        h->eos_id = (int32_t)jnum(o, "eos_id");
        h->max_prompt_tokens = (uint32_t)jnum(o, "max_prompt_tokens");
        h->max_message_bytes = ju64(o, "max_message_bytes");
        h->max_n = (uint32_t)jnum(o, "max_n");
        h->max_requests_per_submit = (uint32_t)jnum(o, "max_requests_per_submit");
        h->max_tokens = (uint32_t)jnum(o, "max_tokens");
        h->max_stop_ids = (uint32_t)jnum(o, "max_stop_ids");
        h->max_logprobs_topk = (uint32_t)jnum(o, "max_logprobs_topk");
        h->retention_results = (uint32_t)jnum(o, "retention_results");
        h->retention_bytes = ju64(o, "retention_bytes");
        h->max_wait_ms = (uint32_t)jnum(o, "max_wait_ms");
        h->client_ttl_s = (uint32_t)jnum(o, "client_ttl_s");
        h->pending_results = (uint32_t)jnum(o, "pending_results");
        h->inflight_samples = (uint32_t)jnum(o, "inflight_samples");
        h->model_name = jstr(o, "model_name");
        h->architecture = jstr(o, "architecture");
        h->backend = jstr(o, "backend");
        h->server = jstr(o, "server");
        break;
    }
    case PROTO_SUBMIT: {
        m->submit.client_id = ju64(o, "client_id");
        const cJSON *a = jget(o, "requests");
        uint32_t n = a ? (uint32_t)cJSON_GetArraySize(a) : 0;
        proto_request *rs = n ? palloc(n * sizeof *rs) : NULL;
        uint32_t i = 0;
        const cJSON *e;
        cJSON_ArrayForEach(e, a) {
            proto_request *r = &rs[i++];
            r->client_req_id = ju64(e, "client_req_id");
            r->n = (uint32_t)jnum(e, "n");
            r->max_tokens = (uint32_t)jnum(e, "max_tokens");
            r->temperature = jf32(e, "temperature");
            r->top_p = jf32(e, "top_p");
            r->top_k = (int32_t)jnum(e, "top_k");
            r->min_p = jf32(e, "min_p");
            r->seed = ju64(e, "seed");
            r->logprobs_topk = (uint32_t)jnum(e, "logprobs_topk");
            r->flags = (uint32_t)jnum(e, "flags");
            r->stop_ids = ji32s(e, "stop_ids", &r->n_stop);
            r->prompt = ji32s(e, "prompt_ids", &r->n_prompt);
            r->text = jstr(e, "prompt_text");
            const cJSON *so = cJSON_GetObjectItemCaseSensitive(e, "sampling"); /* version 4 */
            if (so) {
                proto_sampling *sp = palloc(sizeof *sp);
                memset(sp, 0, sizeof *sp);
                sp->repetition_penalty = jf32(so, "repetition_penalty");
                sp->frequency_penalty = jf32(so, "frequency_penalty");
                sp->presence_penalty = jf32(so, "presence_penalty");
                sp->min_tokens = (uint32_t)jnum(so, "min_tokens");
                uint32_t nv = 0;
                sp->bias_ids = ji32s(so, "bias_ids", &sp->n_bias);
                sp->bias_vals = jf32s(so, "bias_vals", &nv);
                if (nv != sp->n_bias)
                    snprintf(jerr, sizeof jerr, "sampling: %u bias_ids, %u bias_vals", sp->n_bias, nv);
                r->sampling = sp;
            }
            const cJSON *sf = cJSON_GetObjectItemCaseSensitive(e, "score_from"); /* version 5 */
            if (sf)
                r->score_from = (int32_t)sf->valuedouble;
            if (cJSON_GetObjectItemCaseSensitive(e, "lora")) /* version 6 */
                r->lora = jstr(e, "lora");
        }
        m->submit.n_requests = n;
        m->submit.requests = rs;
        break;
    }
    case PROTO_SUBMIT_OK: {
        const cJSON *a = jget(o, "items");
        uint32_t n = a ? (uint32_t)cJSON_GetArraySize(a) : 0;
        proto_submit_item *it = n ? palloc(n * sizeof *it) : NULL;
        uint32_t i = 0;
        const cJSON *e;
        cJSON_ArrayForEach(e, a) {
            it[i].client_req_id = ju64(e, "client_req_id");
            it[i].status = (uint32_t)jnum(e, "status");
            it[i].flags = (uint32_t)jnum(e, "flags");
            it[i].message = jstr(e, "message");
            i++;
        }
        m->submit_ok.n_items = n;
        m->submit_ok.items = it;
        break;
    }
    case PROTO_FETCH:
        m->fetch.client_id = ju64(o, "client_id");
        m->fetch.ack_seq = ju64(o, "ack_seq");
        m->fetch.max_results = (uint32_t)jnum(o, "max_results");
        m->fetch.wait_ms = (uint32_t)jnum(o, "wait_ms");
        m->fetch.max_bytes = ju64(o, "max_bytes");
        break;
    case PROTO_RESULTS: {
        m->results.ack_seq = ju64(o, "ack_seq");
        m->results.pending_results = (uint32_t)jnum(o, "pending_results");
        m->results.inflight_samples = (uint32_t)jnum(o, "inflight_samples");
        const cJSON *a = jget(o, "results");
        uint32_t n = a ? (uint32_t)cJSON_GetArraySize(a) : 0;
        proto_result *rs = n ? palloc(n * sizeof *rs) : NULL;
        uint32_t i = 0, cnt;
        const cJSON *e;
        cJSON_ArrayForEach(e, a) {
            proto_result *r = &rs[i++];
            r->seq = ju64(e, "seq");
            r->client_req_id = ju64(e, "client_req_id");
            r->sample_idx = (uint32_t)jnum(e, "sample_idx");
            r->finish = (uint8_t)jnum(e, "finish");
            r->flags = (uint8_t)jnum(e, "flags");
            r->top_k = (uint16_t)jnum(e, "top_k");
            r->n_preempt = (uint32_t)jnum(e, "n_preempt");
            r->n_prompt = (uint32_t)jnum(e, "n_prompt");
            r->seed = ju64(e, "seed");
            r->version_admit = ju64(e, "version_admit");
            r->version_finish = ju64(e, "version_finish");
            r->queued_us = ju64(e, "queued_us");
            r->first_token_us = ju64(e, "first_token_us");
            r->total_us = ju64(e, "total_us");
            r->token_ids = ji32s(e, "token_ids", &r->n_tokens);
            r->logprobs = jf32s(e, "logprobs", &cnt);
            r->logprobs_processed = jf32s(e, "logprobs_processed", &cnt);
            r->top_ids = ji32s(e, "top_ids", &cnt);
            r->top_logprobs = jf32s(e, "top_logprobs", &cnt);
            if (cJSON_GetObjectItemCaseSensitive(e, "serve_dtype")) { /* version 3 */
                r->serve_dtype = (uint8_t)jnum(e, "serve_dtype");
                r->serve_dtype_first = (uint8_t)jnum(e, "serve_dtype_first");
            }
            const cJSON *so = cJSON_GetObjectItemCaseSensitive(e, "scores"); /* version 5 */
            if (so) {
                proto_scores *sc = palloc(sizeof *sc);
                uint32_t nids = 0, nlps = 0;
                sc->score_from = (uint32_t)jnum(so, "score_from");
                sc->logprobs = jf32s(so, "logprobs", &sc->n_scored);
                sc->top_ids = ji32s(so, "top_ids", &nids);
                sc->top_logprobs = jf32s(so, "top_logprobs", &nlps);
                if (nids != sc->n_scored * r->top_k || nlps != nids)
                    snprintf(jerr, sizeof jerr, "scores: %u alternatives for %u positions x top_k %u", nids,
                             sc->n_scored, r->top_k);
                r->scores = sc;
            }
            if (cJSON_GetObjectItemCaseSensitive(e, "lora")) { /* version 6 */
                r->lora = jstr(e, "lora");
                r->lora_version = ju64(e, "lora_version");
            }
            const cJSON *ro = cJSON_GetObjectItemCaseSensitive(e, "routes");
            if (ro) {
                r->route_layers = (uint16_t)jnum(ro, "layers");
                r->route_k = (uint8_t)jnum(ro, "k");
                r->route_width = (uint8_t)jnum(ro, "width");
                const cJSON *ids = jget(ro, "ids"), *x;
                uint32_t nid = ids ? (uint32_t)cJSON_GetArraySize(ids) : 0, per = r->route_layers * r->route_k;
                r->n_routes = per ? nid / per : 0;
                uint8_t *dst = nid ? palloc((size_t)nid * r->route_width) : NULL;
                uint32_t k = 0;
                cJSON_ArrayForEach(x, ids) {
                    if (r->route_width == 1)
                        dst[k] = (uint8_t)x->valuedouble;
                    else if (r->route_width == 2)
                        ((uint16_t *)dst)[k] = (uint16_t)x->valuedouble;
                    else
                        ((int32_t *)dst)[k] = (int32_t)x->valuedouble;
                    k++;
                }
                r->routes = dst;
            }
            const cJSON *sp = jget(e, "spans"), *s;
            r->n_spans = sp ? (uint32_t)cJSON_GetArraySize(sp) : 0;
            proto_span *spans = r->n_spans ? palloc(r->n_spans * sizeof *spans) : NULL;
            uint32_t k = 0;
            cJSON_ArrayForEach(s, sp) {
                spans[k].start = (uint32_t)jnum(s, "start");
                spans[k].end = (uint32_t)jnum(s, "end");
                spans[k].version = ju64(s, "version");
                k++;
            }
            r->spans = spans;
        }
        m->results.n_results = n;
        m->results.results = rs;
        break;
    }
    case PROTO_ABORT:
        m->abort_req.client_id = ju64(o, "client_id");
        m->abort_req.client_req_id = ju64(o, "client_req_id");
        m->abort_req.flags = (uint32_t)jnum(o, "flags");
        break;
    case PROTO_ABORT_OK:
        m->abort_ok.n_requests = (uint32_t)jnum(o, "n_requests");
        m->abort_ok.n_samples = (uint32_t)jnum(o, "n_samples");
        break;
    case PROTO_STATUS_OK: m->status_ok.json = jstr(o, "json"); break;
    case PROTO_BYE:
        m->bye.client_id = ju64(o, "client_id");
        m->bye.flags = (uint32_t)jnum(o, "flags");
        break;
    case PROTO_BYE_OK:
        m->bye_ok.pending_results = (uint32_t)jnum(o, "pending_results");
        m->bye_ok.inflight_samples = (uint32_t)jnum(o, "inflight_samples");
        break;
    case PROTO_ERROR:
        m->error.code = (uint32_t)jnum(o, "code");
        m->error.request_type = (uint16_t)jnum(o, "request_type");
        m->error.version_max = (uint16_t)jnum(o, "version_max");
        m->error.message = jstr(o, "message");
        break;
    case PROTO_UPDATE_BEGIN: {
        proto_update_begin *u = &m->update_begin;
        u->client_id = ju64(o, "client_id");
        u->version = ju64(o, "version");
        u->mode = (uint8_t)jnum(o, "mode");
        u->serve_dtype = (uint8_t)jnum(o, "serve_dtype");
        u->window = (uint32_t)jnum(o, "window");
        u->max_chunk_bytes = (uint32_t)jnum(o, "max_chunk_bytes");
        u->total_bytes = ju64(o, "total_bytes");
        u->tensors = json_tensors(jget(o, "tensors"), &u->n_tensors);
        break;
    }
    case PROTO_ADAPTER_BEGIN: {
        proto_adapter_begin *u = &m->adapter_begin;
        u->client_id = ju64(o, "client_id");
        u->version = ju64(o, "version");
        u->flags = (uint8_t)jnum(o, "flags");
        u->rank = (uint32_t)jnum(o, "rank");
        u->lora_alpha = (float)jnum(o, "lora_alpha");
        u->window = (uint32_t)jnum(o, "window");
        u->max_chunk_bytes = (uint32_t)jnum(o, "max_chunk_bytes");
        u->total_bytes = ju64(o, "total_bytes");
        u->name = jstr(o, "name");
        u->tensors = json_tensors(jget(o, "tensors"), &u->n_tensors);
        break;
    }
    case PROTO_UPDATE_BEGIN_OK:
    case PROTO_ADAPTER_BEGIN_OK:
        m->update_begin_ok.xfer_id = ju64(o, "xfer_id");
        m->update_begin_ok.window = (uint32_t)jnum(o, "window");
        m->update_begin_ok.max_chunk_bytes = (uint32_t)jnum(o, "max_chunk_bytes");
        m->update_begin_ok.staging_bytes = ju64(o, "staging_bytes");
        m->update_begin_ok.data_port = (uint16_t)jnum(o, "data_port");
        break;
    case PROTO_UPDATE_CHUNK:
        m->update_chunk.xfer_id = ju64(o, "xfer_id");
        m->update_chunk.chunk_seq = (uint32_t)jnum(o, "chunk_seq");
        m->update_chunk.tensor_index = (uint32_t)jnum(o, "tensor_index");
        m->update_chunk.offset = ju64(o, "offset");
        m->update_chunk.crc32c = (uint32_t)jnum(o, "crc32c");
        m->update_chunk.data = jhex(o, "data", &m->update_chunk.len);
        break;
    case PROTO_UPDATE_CHUNK_OK:
        m->update_chunk_ok.xfer_id = ju64(o, "xfer_id");
        m->update_chunk_ok.chunk_seq = (uint32_t)jnum(o, "chunk_seq");
        m->update_chunk_ok.flags = (uint32_t)jnum(o, "flags");
        m->update_chunk_ok.bytes_staged = ju64(o, "bytes_staged");
        m->update_chunk_ok.total_bytes = ju64(o, "total_bytes");
        break;
    case PROTO_UPDATE_COMMIT: m->update_commit.xfer_id = ju64(o, "xfer_id"); break;
    case PROTO_UPDATE_COMMIT_OK:
        m->update_commit_ok.version = ju64(o, "version");
        m->update_commit_ok.stall_us = ju64(o, "stall_us");
        m->update_commit_ok.wait_us = ju64(o, "wait_us");
        m->update_commit_ok.staged_us = ju64(o, "staged_us");
        m->update_commit_ok.n_aborted = (uint32_t)jnum(o, "n_aborted");
        break;
    case PROTO_UPDATE_ABORT: m->update_abort.xfer_id = ju64(o, "xfer_id"); break;
    case PROTO_UPDATE_ABORT_OK: m->update_abort_ok.bytes_freed = ju64(o, "bytes_freed"); break;
    case PROTO_AUTH_BEGIN:
    case PROTO_AUTH:
    case PROTO_AUTH_CHALLENGE:
    case PROTO_AUTH_OK: {
        uint32_t n;
        const uint8_t *b = jhex(o, "bytes", &n);
        if (b && n == PROTO_AUTH_BYTES)
            memcpy(m->auth.bytes, b, PROTO_AUTH_BYTES);
        break;
    }
    case PROTO_UPDATE_FORWARD: {
        proto_update_forward *u = &m->update_forward;
        u->xfer_id = ju64(o, "xfer_id");
        u->next_xfer_id = ju64(o, "next_xfer_id");
        u->port = (uint16_t)jnum(o, "port");
        u->flags = (uint16_t)jnum(o, "flags");
        u->window = (uint32_t)jnum(o, "window");
        u->host = jstr(o, "host");
        uint32_t n;
        const uint8_t *b = jhex(o, "key", &n);
        if (b && n == PROTO_AUTH_BYTES)
            memcpy(u->key, b, PROTO_AUTH_BYTES);
        break;
    }
    case PROTO_UPDATE_FORWARD_OK:
        m->update_forward_ok.xfer_id = ju64(o, "xfer_id");
        m->update_forward_ok.queued_bytes = ju64(o, "queued_bytes");
        break;
    case PROTO_UPDATE_PREPARE: m->update_prepare.xfer_id = ju64(o, "xfer_id"); break;
    case PROTO_UPDATE_PREPARE_OK: {
        proto_update_prepare_ok *u = &m->update_prepare_ok;
        u->xfer_id = ju64(o, "xfer_id");
        u->state = (uint8_t)jnum(o, "state");
        u->forward = (uint8_t)jnum(o, "forward");
        u->forward_error = (uint32_t)jnum(o, "forward_error");
        u->bytes_staged = ju64(o, "bytes_staged");
        u->total_bytes = ju64(o, "total_bytes");
        u->forwarded_bytes = ju64(o, "forwarded_bytes");
        break;
    }
    case PROTO_WEIGHTS_SYNC:
        m->weights_sync.client_id = ju64(o, "client_id");
        m->weights_sync.url = jstr(o, "url");
        break;
    case PROTO_WEIGHTS_SYNC_OK: m->weights_sync_ok.version = ju64(o, "version"); break;
    case PROTO_LANE_AUTH: {
        m->lane_auth.xfer_id = ju64(o, "xfer_id");
        uint32_t n;
        const uint8_t *b = jhex(o, "proof", &n);
        if (b && n == PROTO_AUTH_BYTES)
            memcpy(m->lane_auth.proof, b, PROTO_AUTH_BYTES);
        break;
    }
    }
}

/* ---- deep equality (floats compared bit for bit) ---- */

static char neq[200];

#define FIELD(a, b, name)                                                                  \
    do {                                                                                   \
        if ((a) != (b)) {                                                                  \
            snprintf(neq, sizeof neq, "%s: %llu != %llu", name, (unsigned long long)(a),   \
                     (unsigned long long)(b));                                             \
            return 0;                                                                      \
        }                                                                                  \
    } while (0)

static int f32_eq(float a, float b) { return memcmp(&a, &b, 4) == 0; }

#define FFIELD(a, b, name)                                                                 \
    do {                                                                                   \
        if (!f32_eq((a), (b))) {                                                           \
            snprintf(neq, sizeof neq, "%s: %.9g != %.9g", name, (double)(a), (double)(b)); \
            return 0;                                                                      \
        }                                                                                  \
    } while (0)

static int str_eq(proto_str a, proto_str b, const char *name)
{
    if (a.len != b.len || (a.len && memcmp(a.ptr, b.ptr, a.len))) {
        snprintf(neq, sizeof neq, "%s: '%.*s' != '%.*s'", name, (int)(a.len < 60 ? a.len : 60), a.ptr ? a.ptr : "",
                 (int)(b.len < 60 ? b.len : 60), b.ptr ? b.ptr : "");
        return 0;
    }
    return 1;
}
#define SFIELD(a, b, name) do { if (!str_eq((a), (b), (name))) return 0; } while (0)

static int arr_eq(const void *a, const void *b, uint64_t n, const char *name)
{
    if (n && (!a || !b || memcmp(a, b, n * 4))) {
        snprintf(neq, sizeof neq, "%s: arrays of %llu differ", name, (unsigned long long)n);
        return 0;
    }
    return 1;
}
#define AFIELD(a, b, n, name) do { if (!arr_eq((a), (b), (n), (name))) return 0; } while (0)

static int tensors_eq(const proto_tensor *x, const proto_tensor *y, uint32_t n)
{
    for (uint32_t i = 0; i < n; i++) {
        const proto_tensor *s = &x[i], *t = &y[i];
        SFIELD(s->name, t->name, "tensor name");
        FIELD(s->dtype, t->dtype, "tensor dtype");
        FIELD(s->n_dims, t->n_dims, "tensor n_dims");
        for (uint32_t d = 0; d < s->n_dims && d < PROTO_MAX_DIMS; d++)
            FIELD(s->shape[d], t->shape[d], "tensor shape");
        FIELD(s->nbytes, t->nbytes, "tensor nbytes");
        FIELD(s->crc32c, t->crc32c, "tensor crc32c");
        FIELD(s->flags, t->flags, "tensor flags");
        FIELD(s->wire_bytes, t->wire_bytes, "tensor wire_bytes");
        FIELD(s->base_version, t->base_version, "tensor base_version");
    }
    return 1;
}

static int request_eq(const proto_request *a, const proto_request *b)
{
    FIELD(a->client_req_id, b->client_req_id, "client_req_id");
    FIELD(a->n, b->n, "n");
    FIELD(a->max_tokens, b->max_tokens, "max_tokens");
    FFIELD(a->temperature, b->temperature, "temperature");
    FFIELD(a->top_p, b->top_p, "top_p");
    FIELD(a->top_k, b->top_k, "top_k");
    FFIELD(a->min_p, b->min_p, "min_p");
    FIELD(a->seed, b->seed, "seed");
    FIELD(a->logprobs_topk, b->logprobs_topk, "logprobs_topk");
    FIELD(a->flags, b->flags, "flags");
    FIELD(a->n_stop, b->n_stop, "n_stop");
    AFIELD(a->stop_ids, b->stop_ids, a->n_stop, "stop_ids");
    FIELD(a->n_prompt, b->n_prompt, "n_prompt");
    AFIELD(a->prompt, b->prompt, a->n_prompt, "prompt");
    SFIELD(a->text, b->text, "text");
    FIELD(a->sampling != NULL, b->sampling != NULL, "has a sampling tail");
    if (a->sampling) {
        const proto_sampling *x = a->sampling, *y = b->sampling;
        FFIELD(x->repetition_penalty, y->repetition_penalty, "repetition_penalty");
        FFIELD(x->frequency_penalty, y->frequency_penalty, "frequency_penalty");
        FFIELD(x->presence_penalty, y->presence_penalty, "presence_penalty");
        FIELD(x->min_tokens, y->min_tokens, "min_tokens");
        FIELD(x->n_bias, y->n_bias, "n_bias");
        AFIELD(x->bias_ids, y->bias_ids, x->n_bias, "bias_ids");
        AFIELD(x->bias_vals, y->bias_vals, x->n_bias, "bias_vals");
    }
    FIELD(a->score_from, b->score_from, "score_from");
    SFIELD(a->lora, b->lora, "lora");
    return 1;
}

static int result_eq(const proto_result *a, const proto_result *b)
{
    FIELD(a->seq, b->seq, "seq");
    FIELD(a->client_req_id, b->client_req_id, "client_req_id");
    FIELD(a->sample_idx, b->sample_idx, "sample_idx");
    FIELD(a->finish, b->finish, "finish");
    FIELD(a->flags, b->flags, "flags");
    FIELD(a->top_k, b->top_k, "top_k");
    FIELD(a->n_preempt, b->n_preempt, "n_preempt");
    FIELD(a->n_prompt, b->n_prompt, "n_prompt");
    FIELD(a->seed, b->seed, "seed");
    FIELD(a->version_admit, b->version_admit, "version_admit");
    FIELD(a->version_finish, b->version_finish, "version_finish");
    FIELD(a->queued_us, b->queued_us, "queued_us");
    FIELD(a->first_token_us, b->first_token_us, "first_token_us");
    FIELD(a->total_us, b->total_us, "total_us");
    FIELD(a->n_tokens, b->n_tokens, "n_tokens");
    uint64_t n = a->n_tokens, nk = n * a->top_k;
    AFIELD(a->token_ids, b->token_ids, n, "token_ids");
    AFIELD(a->logprobs, b->logprobs, n, "logprobs");
    if (a->flags & PROTO_RESULT_PROCESSED)
        AFIELD(a->logprobs_processed, b->logprobs_processed, n, "logprobs_processed");
    AFIELD(a->top_ids, b->top_ids, nk, "top_ids");
    AFIELD(a->top_logprobs, b->top_logprobs, nk, "top_logprobs");
    FIELD(a->n_spans, b->n_spans, "n_spans");
    for (uint32_t i = 0; i < a->n_spans; i++) {
        FIELD(a->spans[i].start, b->spans[i].start, "span start");
        FIELD(a->spans[i].end, b->spans[i].end, "span end");
        FIELD(a->spans[i].version, b->spans[i].version, "span version");
    }
    if (a->flags & PROTO_RESULT_SERVE) {
        FIELD(a->serve_dtype, b->serve_dtype, "serve_dtype");
        FIELD(a->serve_dtype_first, b->serve_dtype_first, "serve_dtype_first");
    }
    FIELD(a->scores != NULL, b->scores != NULL, "has scores");
    if (a->scores) {
        const proto_scores *x = a->scores, *y = b->scores;
        FIELD(x->score_from, y->score_from, "score_from");
        FIELD(x->n_scored, y->n_scored, "n_scored");
        AFIELD(x->logprobs, y->logprobs, x->n_scored, "prompt logprobs");
        AFIELD(x->top_ids, y->top_ids, (uint64_t)x->n_scored * a->top_k, "prompt top_ids");
        AFIELD(x->top_logprobs, y->top_logprobs, (uint64_t)x->n_scored * a->top_k, "prompt top_logprobs");
    }
    SFIELD(a->lora, b->lora, "lora");
    FIELD(a->lora_version, b->lora_version, "lora_version");
    if (a->flags & PROTO_RESULT_ROUTES) {
        FIELD(a->n_routes, b->n_routes, "n_routes");
        FIELD(a->route_layers, b->route_layers, "route_layers");
        FIELD(a->route_k, b->route_k, "route_k");
        FIELD(a->route_width, b->route_width, "route_width");
        uint64_t bytes = (uint64_t)a->n_routes * a->route_layers * a->route_k * a->route_width;
        if (bytes && memcmp(a->routes, b->routes, (size_t)bytes)) {
            snprintf(neq, sizeof neq, "routes differ");
            return 0;
        }
    }
    return 1;
}

static int msg_eq(const proto_msg *a, const proto_msg *b)
{
    neq[0] = 0;
    FIELD(a->type, b->type, "type");
    switch (a->type) {
    case PROTO_HELLO:
        FIELD(a->hello.client_id, b->hello.client_id, "client_id");
        FIELD(a->hello.min_version, b->hello.min_version, "min_version");
        FIELD(a->hello.max_version, b->hello.max_version, "max_version");
        FIELD(a->hello.flags, b->hello.flags, "flags");
        SFIELD(a->hello.client_name, b->hello.client_name, "client_name");
        return 1;
    case PROTO_HELLO_OK: {
        const proto_hello_ok *x = &a->hello_ok, *y = &b->hello_ok;
        FIELD(x->client_id, y->client_id, "client_id");
        FIELD(x->version, y->version, "version");
        FIELD(x->flags, y->flags, "flags");
        FIELD(x->features, y->features, "features");
        FIELD(x->weight_version, y->weight_version, "weight_version");
        FIELD(x->vocab_size, y->vocab_size, "vocab_size");
        FIELD(x->max_context, y->max_context, "max_context");
        FIELD(x->n_layers, y->n_layers, "n_layers");
        FIELD(x->dim, y->dim, "dim");
        FIELD(x->n_heads, y->n_heads, "n_heads");
        FIELD(x->n_kv_heads, y->n_kv_heads, "n_kv_heads");
        FIELD(x->eos_id, y->eos_id, "eos_id");
        FIELD(x->max_prompt_tokens, y->max_prompt_tokens, "max_prompt_tokens");
        FIELD(x->max_message_bytes, y->max_message_bytes, "max_message_bytes");
        FIELD(x->max_n, y->max_n, "max_n");
        FIELD(x->max_requests_per_submit, y->max_requests_per_submit, "max_requests_per_submit");
        FIELD(x->max_tokens, y->max_tokens, "max_tokens");
        FIELD(x->max_stop_ids, y->max_stop_ids, "max_stop_ids");
        FIELD(x->max_logprobs_topk, y->max_logprobs_topk, "max_logprobs_topk");
        FIELD(x->retention_results, y->retention_results, "retention_results");
        FIELD(x->retention_bytes, y->retention_bytes, "retention_bytes");
        FIELD(x->max_wait_ms, y->max_wait_ms, "max_wait_ms");
        FIELD(x->client_ttl_s, y->client_ttl_s, "client_ttl_s");
        FIELD(x->pending_results, y->pending_results, "pending_results");
        FIELD(x->inflight_samples, y->inflight_samples, "inflight_samples");
        SFIELD(x->model_name, y->model_name, "model_name");
        SFIELD(x->architecture, y->architecture, "architecture");
        SFIELD(x->backend, y->backend, "backend");
        SFIELD(x->server, y->server, "server");
        return 1;
    }
    case PROTO_SUBMIT:
        FIELD(a->submit.client_id, b->submit.client_id, "client_id");
        FIELD(a->submit.n_requests, b->submit.n_requests, "n_requests");
        for (uint32_t i = 0; i < a->submit.n_requests; i++)
            if (!request_eq(&a->submit.requests[i], &b->submit.requests[i]))
                return 0;
        return 1;
    case PROTO_SUBMIT_OK:
        FIELD(a->submit_ok.n_items, b->submit_ok.n_items, "n_items");
        for (uint32_t i = 0; i < a->submit_ok.n_items; i++) {
            const proto_submit_item *x = &a->submit_ok.items[i], *y = &b->submit_ok.items[i];
            FIELD(x->client_req_id, y->client_req_id, "client_req_id");
            FIELD(x->status, y->status, "status");
            FIELD(x->flags, y->flags, "flags");
            SFIELD(x->message, y->message, "message");
        }
        return 1;
    case PROTO_FETCH:
        FIELD(a->fetch.client_id, b->fetch.client_id, "client_id");
        FIELD(a->fetch.ack_seq, b->fetch.ack_seq, "ack_seq");
        FIELD(a->fetch.max_results, b->fetch.max_results, "max_results");
        FIELD(a->fetch.wait_ms, b->fetch.wait_ms, "wait_ms");
        FIELD(a->fetch.max_bytes, b->fetch.max_bytes, "max_bytes");
        return 1;
    case PROTO_RESULTS:
        FIELD(a->results.ack_seq, b->results.ack_seq, "ack_seq");
        FIELD(a->results.pending_results, b->results.pending_results, "pending_results");
        FIELD(a->results.inflight_samples, b->results.inflight_samples, "inflight_samples");
        FIELD(a->results.n_results, b->results.n_results, "n_results");
        for (uint32_t i = 0; i < a->results.n_results; i++)
            if (!result_eq(&a->results.results[i], &b->results.results[i]))
                return 0;
        return 1;
    case PROTO_ABORT:
        FIELD(a->abort_req.client_id, b->abort_req.client_id, "client_id");
        FIELD(a->abort_req.client_req_id, b->abort_req.client_req_id, "client_req_id");
        FIELD(a->abort_req.flags, b->abort_req.flags, "flags");
        return 1;
    case PROTO_ABORT_OK:
        FIELD(a->abort_ok.n_requests, b->abort_ok.n_requests, "n_requests");
        FIELD(a->abort_ok.n_samples, b->abort_ok.n_samples, "n_samples");
        return 1;
    case PROTO_STATUS: return 1;
    case PROTO_STATUS_OK: SFIELD(a->status_ok.json, b->status_ok.json, "json"); return 1;
    case PROTO_BYE:
        FIELD(a->bye.client_id, b->bye.client_id, "client_id");
        FIELD(a->bye.flags, b->bye.flags, "flags");
        return 1;
    case PROTO_BYE_OK:
        FIELD(a->bye_ok.pending_results, b->bye_ok.pending_results, "pending_results");
        FIELD(a->bye_ok.inflight_samples, b->bye_ok.inflight_samples, "inflight_samples");
        return 1;
    case PROTO_ERROR:
        FIELD(a->error.code, b->error.code, "code");
        FIELD(a->error.request_type, b->error.request_type, "request_type");
        FIELD(a->error.version_max, b->error.version_max, "version_max");
        SFIELD(a->error.message, b->error.message, "message");
        return 1;
    case PROTO_UPDATE_BEGIN: {
        const proto_update_begin *x = &a->update_begin, *y = &b->update_begin;
        FIELD(x->client_id, y->client_id, "client_id");
        FIELD(x->version, y->version, "version");
        FIELD(x->mode, y->mode, "mode");
        FIELD(x->serve_dtype, y->serve_dtype, "serve_dtype");
        FIELD(x->window, y->window, "window");
        FIELD(x->max_chunk_bytes, y->max_chunk_bytes, "max_chunk_bytes");
        FIELD(x->total_bytes, y->total_bytes, "total_bytes");
        FIELD(x->n_tensors, y->n_tensors, "n_tensors");
        return tensors_eq(x->tensors, y->tensors, x->n_tensors);
    }
    case PROTO_ADAPTER_BEGIN: {
        const proto_adapter_begin *x = &a->adapter_begin, *y = &b->adapter_begin;
        FIELD(x->client_id, y->client_id, "client_id");
        FIELD(x->version, y->version, "version");
        FIELD(x->flags, y->flags, "flags");
        FIELD(x->rank, y->rank, "rank");
        FFIELD(x->lora_alpha, y->lora_alpha, "lora_alpha");
        FIELD(x->window, y->window, "window");
        FIELD(x->max_chunk_bytes, y->max_chunk_bytes, "max_chunk_bytes");
        FIELD(x->total_bytes, y->total_bytes, "total_bytes");
        SFIELD(x->name, y->name, "name");
        FIELD(x->n_tensors, y->n_tensors, "n_tensors");
        return tensors_eq(x->tensors, y->tensors, x->n_tensors);
    }
    case PROTO_UPDATE_BEGIN_OK:
    case PROTO_ADAPTER_BEGIN_OK:
        FIELD(a->update_begin_ok.xfer_id, b->update_begin_ok.xfer_id, "xfer_id");
        FIELD(a->update_begin_ok.window, b->update_begin_ok.window, "window");
        FIELD(a->update_begin_ok.max_chunk_bytes, b->update_begin_ok.max_chunk_bytes, "max_chunk_bytes");
        FIELD(a->update_begin_ok.staging_bytes, b->update_begin_ok.staging_bytes, "staging_bytes");
        FIELD(a->update_begin_ok.data_port, b->update_begin_ok.data_port, "data_port");
        return 1;
    case PROTO_UPDATE_CHUNK:
        FIELD(a->update_chunk.xfer_id, b->update_chunk.xfer_id, "xfer_id");
        FIELD(a->update_chunk.chunk_seq, b->update_chunk.chunk_seq, "chunk_seq");
        FIELD(a->update_chunk.tensor_index, b->update_chunk.tensor_index, "tensor_index");
        FIELD(a->update_chunk.offset, b->update_chunk.offset, "offset");
        FIELD(a->update_chunk.crc32c, b->update_chunk.crc32c, "crc32c");
        FIELD(a->update_chunk.len, b->update_chunk.len, "len");
        if (a->update_chunk.len && memcmp(a->update_chunk.data, b->update_chunk.data, a->update_chunk.len)) {
            snprintf(neq, sizeof neq, "data: %u bytes differ", a->update_chunk.len);
            return 0;
        }
        return 1;
    case PROTO_UPDATE_CHUNK_OK:
        FIELD(a->update_chunk_ok.xfer_id, b->update_chunk_ok.xfer_id, "xfer_id");
        FIELD(a->update_chunk_ok.chunk_seq, b->update_chunk_ok.chunk_seq, "chunk_seq");
        FIELD(a->update_chunk_ok.flags, b->update_chunk_ok.flags, "flags");
        FIELD(a->update_chunk_ok.bytes_staged, b->update_chunk_ok.bytes_staged, "bytes_staged");
        FIELD(a->update_chunk_ok.total_bytes, b->update_chunk_ok.total_bytes, "total_bytes");
        return 1;
    case PROTO_UPDATE_COMMIT: FIELD(a->update_commit.xfer_id, b->update_commit.xfer_id, "xfer_id"); return 1;
    case PROTO_UPDATE_COMMIT_OK:
        FIELD(a->update_commit_ok.version, b->update_commit_ok.version, "version");
        FIELD(a->update_commit_ok.stall_us, b->update_commit_ok.stall_us, "stall_us");
        FIELD(a->update_commit_ok.wait_us, b->update_commit_ok.wait_us, "wait_us");
        FIELD(a->update_commit_ok.staged_us, b->update_commit_ok.staged_us, "staged_us");
        FIELD(a->update_commit_ok.n_aborted, b->update_commit_ok.n_aborted, "n_aborted");
        return 1;
    case PROTO_UPDATE_ABORT: FIELD(a->update_abort.xfer_id, b->update_abort.xfer_id, "xfer_id"); return 1;
    case PROTO_UPDATE_ABORT_OK:
        FIELD(a->update_abort_ok.bytes_freed, b->update_abort_ok.bytes_freed, "bytes_freed");
        return 1;
    case PROTO_AUTH_BEGIN:
    case PROTO_AUTH:
    case PROTO_AUTH_CHALLENGE:
    case PROTO_AUTH_OK:
        if (memcmp(a->auth.bytes, b->auth.bytes, PROTO_AUTH_BYTES)) {
            snprintf(neq, sizeof neq, "bytes differ");
            return 0;
        }
        return 1;
    case PROTO_UPDATE_FORWARD: {
        const proto_update_forward *x = &a->update_forward, *y = &b->update_forward;
        FIELD(x->xfer_id, y->xfer_id, "xfer_id");
        FIELD(x->next_xfer_id, y->next_xfer_id, "next_xfer_id");
        FIELD(x->port, y->port, "port");
        FIELD(x->flags, y->flags, "flags");
        FIELD(x->window, y->window, "window");
        if (!str_eq(x->host, y->host, "host"))
            return 0;
        if (memcmp(x->key, y->key, PROTO_AUTH_BYTES)) {
            snprintf(neq, sizeof neq, "key differs");
            return 0;
        }
        return 1;
    }
    case PROTO_UPDATE_FORWARD_OK:
        FIELD(a->update_forward_ok.xfer_id, b->update_forward_ok.xfer_id, "xfer_id");
        FIELD(a->update_forward_ok.queued_bytes, b->update_forward_ok.queued_bytes, "queued_bytes");
        return 1;
    case PROTO_UPDATE_PREPARE: FIELD(a->update_prepare.xfer_id, b->update_prepare.xfer_id, "xfer_id"); return 1;
    case PROTO_UPDATE_PREPARE_OK: {
        const proto_update_prepare_ok *x = &a->update_prepare_ok, *y = &b->update_prepare_ok;
        FIELD(x->xfer_id, y->xfer_id, "xfer_id");
        FIELD(x->state, y->state, "state");
        FIELD(x->forward, y->forward, "forward");
        FIELD(x->forward_error, y->forward_error, "forward_error");
        FIELD(x->bytes_staged, y->bytes_staged, "bytes_staged");
        FIELD(x->total_bytes, y->total_bytes, "total_bytes");
        FIELD(x->forwarded_bytes, y->forwarded_bytes, "forwarded_bytes");
        return 1;
    }
    case PROTO_WEIGHTS_SYNC:
        FIELD(a->weights_sync.client_id, b->weights_sync.client_id, "client_id");
        return str_eq(a->weights_sync.url, b->weights_sync.url, "url");
    case PROTO_WEIGHTS_SYNC_OK:
        FIELD(a->weights_sync_ok.version, b->weights_sync_ok.version, "version");
        return 1;
    case PROTO_LANE_AUTH:
        FIELD(a->lane_auth.xfer_id, b->lane_auth.xfer_id, "xfer_id");
        if (memcmp(a->lane_auth.proof, b->lane_auth.proof, PROTO_AUTH_BYTES)) {
            snprintf(neq, sizeof neq, "proof differs");
            return 0;
        }
        return 1;
    }
    snprintf(neq, sizeof neq, "type 0x%x not compared", a->type);
    return 0;
}

/* ---- golden vectors ---- */

static const uint16_t all_types[] = {
    PROTO_HELLO, PROTO_HELLO_OK, PROTO_SUBMIT, PROTO_SUBMIT_OK, PROTO_FETCH, PROTO_RESULTS, PROTO_ABORT,
    PROTO_ABORT_OK, PROTO_STATUS, PROTO_STATUS_OK, PROTO_BYE, PROTO_BYE_OK, PROTO_ERROR, PROTO_UPDATE_BEGIN,
    PROTO_UPDATE_BEGIN_OK, PROTO_UPDATE_CHUNK, PROTO_UPDATE_CHUNK_OK, PROTO_UPDATE_COMMIT, PROTO_UPDATE_COMMIT_OK,
    PROTO_UPDATE_ABORT, PROTO_UPDATE_ABORT_OK, PROTO_AUTH_BEGIN, PROTO_AUTH_CHALLENGE, PROTO_AUTH, PROTO_AUTH_OK,
    PROTO_UPDATE_FORWARD, PROTO_UPDATE_FORWARD_OK, PROTO_UPDATE_PREPARE, PROTO_UPDATE_PREPARE_OK, PROTO_LANE_AUTH,
    PROTO_WEIGHTS_SYNC, PROTO_WEIGHTS_SYNC_OK, PROTO_ADAPTER_BEGIN, PROTO_ADAPTER_BEGIN_OK};

static void test_golden_valid(void)
{
    CHECK(load_vectors() == 0, "cannot read %s/vectors.json (run from the repository root)", testdata());
    const cJSON *valid = cJSON_GetObjectItem(vectors, "valid"), *v;
    CHECK(cJSON_GetArraySize(valid) >= 20, "only %d valid vectors", cJSON_GetArraySize(valid));
    proto_buf b;
    proto_buf_init(&b);
    int types_seen[0x100] = {0};
    cJSON_ArrayForEach(v, valid) {
        const char *file = cJSON_GetObjectItem(v, "file")->valuestring;
        size_t len;
        uint8_t *data = read_file(file, &len);
        CHECK(data, "cannot read %s", file);
        proto_msg got, want;
        int rc = proto_decode(data, len, PROTO_DEFAULT_MAX_MESSAGE, &got);
        CHECK(rc == 0, "%s: decode failed: %s", file, rd_errmsg());
        jerr[0] = 0;
        json_to_msg(cJSON_GetObjectItem(v, "message"), &want);
        CHECK(!jerr[0], "%s: vectors.json: %s", file, jerr);
        want.version = (uint16_t)jnum(v, "version");
        CHECK(!jerr[0] && got.version == want.version, "%s: version %u, vectors.json says %u", file, got.version,
              want.version);
        CHECK(msg_eq(&got, &want), "%s: decoded field differs from vectors.json: %s", file, neq);
        types_seen[got.type] = 1;
        /* decoded -> encoded: the same bytes */
        proto_buf_reset(&b);
        CHECK_OK(proto_encode(&b, &got));
        CHECK(b.len == len && !memcmp(b.data, data, len), "%s: re-encoding the decoded message gives %zu bytes "
              "(%s), the file has %zu", file, b.len, b.len == len ? "different" : "a different size", len);
        /* fields from the JSON -> encoded: the same bytes */
        proto_buf_reset(&b);
        CHECK_OK(proto_encode(&b, &want));
        CHECK(b.len == len && !memcmp(b.data, data, len), "%s: encoding the vectors.json fields differs", file);
        proto_msg_free(&got);
        free(data);
        pool_free();
    }
    proto_buf_free(&b);
    for (size_t i = 0; i < sizeof all_types / sizeof all_types[0]; i++)
        CHECK(types_seen[all_types[i]], "no golden vector of type %s", proto_type_name(all_types[i]));
}

static void test_golden_invalid(void)
{
    CHECK(load_vectors() == 0, "cannot read vectors.json");
    const cJSON *inv = cJSON_GetObjectItem(vectors, "invalid"), *v;
    CHECK(cJSON_GetArraySize(inv) >= 15, "only %d invalid vectors", cJSON_GetArraySize(inv));
    cJSON_ArrayForEach(v, inv) {
        const char *file = cJSON_GetObjectItem(v, "file")->valuestring;
        uint32_t code = (uint32_t)cJSON_GetObjectItem(v, "error")->valuedouble;
        size_t max_len = (size_t)cJSON_GetObjectItem(v, "max_len")->valuedouble;
        size_t len;
        uint8_t *data = read_file(file, &len);
        CHECK(data, "cannot read %s", file);
        proto_msg m;
        rd_fail(0, "%s", "");
        int rc = proto_decode(data, len, max_len, &m);
        CHECK(rc < 0, "%s: decoded, expected error %u", file, code);
        CHECK(m.wire_error == code, "%s: error %u (%s), expected %u (%s): %s", file, m.wire_error,
              proto_err_name(m.wire_error), code, proto_err_name(code), rd_errmsg());
        CHECK(strlen(rd_errmsg()) > 20, "%s: no useful message: '%s'", file, rd_errmsg());
        CHECK(m.arena == NULL && m.arena_bytes == 0, "%s: a failed decode holds memory", file);
        proto_msg_free(&m);
        free(data);
    }
}

/* proto_check_request against hello_ok.bin's limits gives the codes listed. */
static int read_limits(const char *file, proto_msg *lim)
{
    size_t len;
    uint8_t *data = read_file(file, &len);
    if (!data)
        return -1;
    int rc = proto_decode(data, len, 0, lim);
    free(data);
    return rc;
}

static void test_golden_check_request(void)
{
    CHECK(load_vectors() == 0, "cannot read vectors.json");
    const char *limits_file = cJSON_GetObjectItem(vectors, "check_limits")->valuestring;
    size_t len;
    proto_msg lim;
    CHECK(read_limits(limits_file, &lim) == 0, "cannot read %s", limits_file);
    const cJSON *valid = cJSON_GetObjectItem(vectors, "valid"), *v;
    int checked = 0;
    cJSON_ArrayForEach(v, valid) {
        const cJSON *expect = cJSON_GetObjectItem(v, "check_request");
        if (!expect)
            continue;
        const char *file = cJSON_GetObjectItem(v, "file")->valuestring;
        const cJSON *own = cJSON_GetObjectItem(v, "check_limits");
        proto_msg own_lim;
        if (own)
            CHECK(read_limits(own->valuestring, &own_lim) == 0, "cannot read %s", own->valuestring);
        uint8_t *data = read_file(file, &len);
        proto_msg m;
        CHECK_OK(proto_decode(data, len, 0, &m));
        CHECK(m.type == PROTO_SUBMIT && (int)m.submit.n_requests == cJSON_GetArraySize(expect), "%s", file);
        for (uint32_t i = 0; i < m.submit.n_requests; i++) {
            int want = (int)cJSON_GetArrayItem(expect, (int)i)->valuedouble;
            int rc = proto_check_request(&m.submit.requests[i], own ? &own_lim.hello_ok : &lim.hello_ok);
            int got = rc ? (int)proto_err_from_rd(rc) : 0;
            CHECK(got == want, "%s request %u: code %d, expected %d (%s)", file, i, got, want, rc ? rd_errmsg() : "ok");
            if (rc)
                CHECK(strstr(rd_errmsg(), "expected") || strstr(rd_errmsg(), "limit") || strstr(rd_errmsg(), "exceeds") ||
                      strstr(rd_errmsg(), "send token ids") || strstr(rd_errmsg(), "needs"),
                      "%s request %u: message does not say what was expected: %s", file, i, rd_errmsg());
            checked++;
        }
        if (own)
            proto_msg_free(&own_lim);
        proto_msg_free(&m);
        free(data);
    }
    CHECK(checked >= 10, "only %d requests checked", checked);
    /* lengths alone: what the daemon calls after tokenizing a text prompt */
    CHECK(proto_check_lengths(1, lim.hello_ok.max_context - 1, &lim.hello_ok) == 0, "fits exactly");
    CHECK(proto_check_lengths(2, lim.hello_ok.max_context - 1, &lim.hello_ok) == RD_EINVAL, "one past the context");
    CHECK(proto_check_lengths(0, 1, &lim.hello_ok) == RD_EINVAL, "empty prompt");
    CHECK(proto_check_lengths(lim.hello_ok.max_prompt_tokens + 1, 1, &lim.hello_ok) == RD_EINVAL, "long prompt");
    proto_msg_free(&lim);
}

/* Every prefix of every golden frame is refused, both as is (the header's
 * length no longer matches) and with the header's length patched to the
 * prefix (so the body parser meets the cut). Each prefix is copied into an
 * allocation of exactly its size so ASan sees any read past it. */
static void test_truncation(void)
{
    CHECK(load_vectors() == 0, "cannot read vectors.json");
    const cJSON *valid = cJSON_GetObjectItem(vectors, "valid"), *v;
    long tried = 0;
    cJSON_ArrayForEach(v, valid) {
        const char *file = cJSON_GetObjectItem(v, "file")->valuestring;
        size_t len;
        uint8_t *data = read_file(file, &len);
        for (size_t k = 0; k < len; k++) {
            uint8_t *cut = malloc(k ? k : 1);
            memcpy(cut, data, k);
            proto_msg m;
            int rc = proto_decode(cut, k, 0, &m);
            CHECK(rc < 0 && m.wire_error == PROTO_E_MALFORMED, "%s cut at %zu: rc %d, error %u", file, k, rc,
                  m.wire_error);
            if (k >= PROTO_HEADER_BYTES) {
                uint32_t body = (uint32_t)(k - PROTO_HEADER_BYTES);
                memcpy(cut + 8, &body, 4);  /* little-endian host assumed by this test only */
                rc = proto_decode(cut, k, 0, &m);
                CHECK(rc < 0 && m.wire_error == PROTO_E_MALFORMED, "%s cut at %zu with patched length: rc %d, "
                      "error %u", file, k, rc, m.wire_error);
                CHECK(strstr(rd_errmsg(), "truncated") || strstr(rd_errmsg(), "needs"),
                      "%s cut at %zu: message should say truncated: %s", file, k, rd_errmsg());
            }
            free(cut);
            tried++;
        }
        free(data);
    }
    CHECK(tried > 1000, "only %ld prefixes", tried);
}

/* Random byte mutations never crash; whatever still decodes re-encodes to the
 * very same bytes (the encoding is canonical). */
static void test_mutations(void)
{
    CHECK(load_vectors() == 0, "cannot read vectors.json");
    const cJSON *valid = cJSON_GetObjectItem(vectors, "valid"), *v;
    proto_buf b;
    proto_buf_init(&b);
    long decoded = 0, total = 0;
    rng_state = 12345;
    cJSON_ArrayForEach(v, valid) {
        const char *file = cJSON_GetObjectItem(v, "file")->valuestring;
        size_t len;
        uint8_t *data = read_file(file, &len);
        uint8_t *mut = malloc(len);
        for (int iter = 0; iter < 10000; iter++) {
            memcpy(mut, data, len);
            int flips = 1 + (int)rnd_below(4);
            for (int f = 0; f < flips; f++) {
                size_t at = rnd_below((uint32_t)len);
                switch (rnd_below(4)) {
                case 0: mut[at] ^= (uint8_t)(1u << rnd_below(8)); break;
                case 1: mut[at] = (uint8_t)rnd(); break;
                case 2: mut[at] = 0xFF; break;
                default: mut[at] = 0; break;
                }
            }
            size_t mlen = rnd_below(8) == 0 ? rnd_below((uint32_t)len + 1) : len;
            uint8_t *exact = malloc(mlen ? mlen : 1);
            memcpy(exact, mut, mlen);
            proto_msg m;
            total++;
            if (proto_decode(exact, mlen, 0, &m) == 0) {
                decoded++;
                proto_buf_reset(&b);
                CHECK(proto_encode(&b, &m) == 0, "%s: a mutated frame decoded but does not re-encode: %s", file,
                      rd_errmsg());
                CHECK(b.len == mlen && !memcmp(b.data, exact, mlen), "%s iteration %d: decoded but re-encodes "
                      "differently (%zu vs %zu bytes)", file, iter, b.len, mlen);
                CHECK(m.arena_bytes <= PROTO_ARENA_BOUND(mlen), "arena %zu > bound", m.arena_bytes);
                proto_msg_free(&m);
            } else {
                CHECK(m.wire_error >= 1 && m.wire_error <= PROTO_E_INTERNAL, "error code %u", m.wire_error);
                CHECK(m.wire_error != PROTO_E_INTERNAL, "%s: internal error on a mutated frame: %s", file, rd_errmsg());
            }
            free(exact);
        }
        free(mut);
        free(data);
    }
    proto_buf_free(&b);
    CHECK(decoded > 100 && decoded < total, "decoded %ld of %ld mutations", decoded, total);
}

/* ---- random messages of every type ---- */

static proto_str rnd_str(uint32_t max_chars)
{
    static const char *pieces[] = {"a", "Z", "0", " ", "\n", "é", "ß", "中", "文", "✓", "🚀", "π", "\x7f"};
    uint32_t n = rnd_below(max_chars + 1);
    char *s = palloc(n * 4 + 1);
    size_t len = 0;
    for (uint32_t i = 0; i < n; i++) {
        const char *p = pieces[rnd_below(sizeof pieces / sizeof pieces[0])];
        memcpy(s + len, p, strlen(p));
        len += strlen(p);
    }
    proto_str r = {s, (uint32_t)len};
    return r;
}

static uint64_t rnd_u64(void)
{
    switch (rnd_below(4)) {
    case 0: return 0;
    case 1: return UINT64_MAX;
    case 2: return rnd_below(1000);
    default: return rnd();
    }
}

static float rnd_f32(void)
{
    uint32_t u = (uint32_t)rnd();
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static int32_t *rnd_i32s(uint64_t n)
{
    if (!n)
        return NULL;
    int32_t *a = palloc(n * 4);
    for (uint64_t i = 0; i < n; i++)
        a[i] = (int32_t)rnd();
    return a;
}

static float *rnd_f32s(uint64_t n)
{
    if (!n)
        return NULL;
    float *a = palloc(n * 4);
    for (uint64_t i = 0; i < n; i++)
        a[i] = rnd_f32();
    return a;
}

/* An adapter name: 1..PROTO_MAX_LORA_NAME bytes of UTF-8 (rnd_str's 30 characters are at most 120 bytes). */
static proto_str rnd_lora_name(void)
{
    proto_str s = rnd_str(30);
    return s.len ? s : (proto_str){"a", 1};
}

/* version: the frame's; a request with SAMPLING gets a tail from version 4 on. */
static void rnd_request(proto_request *r, uint16_t version)
{
    r->client_req_id = rnd_u64();
    r->n = (uint32_t)rnd();
    r->max_tokens = (uint32_t)rnd();
    r->temperature = rnd_f32();
    r->top_p = rnd_f32();
    r->top_k = (int32_t)rnd();
    r->min_p = rnd_f32();
    r->seed = rnd_u64();
    r->logprobs_topk = (uint32_t)rnd();
    r->flags = (uint32_t)rnd() & (rnd_below(2) ? PROTO_REQ_FLAGS : 0xFFFFFFFFu);
    r->n_stop = rnd_below(5);
    r->stop_ids = rnd_i32s(r->n_stop);
    if (r->flags & PROTO_REQ_PROMPT_IS_TEXT) {
        r->text = rnd_str(30);
    } else {
        r->n_prompt = rnd_below(40);
        r->prompt = rnd_i32s(r->n_prompt);
    }
    if ((r->flags & PROTO_REQ_SAMPLING) && version >= 4) {
        proto_sampling *s = palloc(sizeof *s);
        s->repetition_penalty = rnd_f32();
        s->frequency_penalty = rnd_f32();
        s->presence_penalty = rnd_f32();
        s->min_tokens = (uint32_t)rnd();
        s->n_bias = rnd_below(2) ? 0 : rnd_below(20);
        s->bias_ids = rnd_i32s(s->n_bias);
        s->bias_vals = rnd_f32s(s->n_bias);
        r->sampling = s;
    }
    if ((r->flags & PROTO_REQ_SCORE) && version >= 5)
        r->score_from = (int32_t)rnd();
    if ((r->flags & PROTO_REQ_LORA) && version >= 6)
        r->lora = rnd_lora_name();
}

static void rnd_result(proto_result *r)
{
    r->seq = rnd_u64();
    r->client_req_id = rnd_u64();
    r->sample_idx = (uint32_t)rnd();
    r->finish = (uint8_t)(1 + rnd_below(4));
    r->flags = (uint8_t)rnd_below(2);
    r->top_k = (uint16_t)rnd_below(5);
    r->n_preempt = (uint32_t)rnd();
    r->n_prompt = (uint32_t)rnd();
    r->seed = rnd_u64();
    r->version_admit = rnd_u64();
    r->version_finish = rnd_u64();
    r->queued_us = rnd_u64();
    r->first_token_us = rnd_u64();
    r->total_us = rnd_u64();
    r->n_tokens = rnd_below(4) == 0 ? 0 : rnd_below(50);
    uint64_t n = r->n_tokens, nk = n * r->top_k;
    r->token_ids = rnd_i32s(n);
    r->logprobs = rnd_f32s(n);
    r->logprobs_processed = (r->flags & PROTO_RESULT_PROCESSED) ? rnd_f32s(n) : NULL;
    r->top_ids = rnd_i32s(nk);
    r->top_logprobs = rnd_f32s(nk);
    /* contiguous spans over [0, n) with increasing versions */
    proto_span *s = n ? palloc(n * sizeof *s) : NULL;
    uint32_t k = 0, at = 0;
    uint64_t version = rnd_below(100);
    while (at < n) {
        uint32_t len = 1 + rnd_below((uint32_t)(n - at));
        s[k].start = at;
        s[k].end = at + len;
        s[k].version = version;
        version += 1 + rnd_below(3);
        at += len;
        k++;
    }
    r->n_spans = k;
    r->spans = s;
    if (rnd_below(3) == 0) {    /* version 5: the prompt's scores (the caller sets the version) */
        proto_scores *sc = palloc(sizeof *sc);
        r->n_prompt = rnd_below(30);
        sc->score_from = rnd_below(r->n_prompt + 1);
        sc->n_scored = rnd_below(4) == 0 ? 0 : r->n_prompt - sc->score_from;
        sc->logprobs = rnd_f32s(sc->n_scored);
        sc->top_ids = rnd_i32s((uint64_t)sc->n_scored * r->top_k);
        sc->top_logprobs = rnd_f32s((uint64_t)sc->n_scored * r->top_k);
        r->flags |= PROTO_RESULT_SCORES;
        r->scores = sc;
    }
    if (rnd_below(3) == 0) {    /* version 6: the adapter (the caller sets the version) */
        r->flags |= PROTO_RESULT_LORA;
        r->lora = rnd_lora_name();
        r->lora_version = rnd_u64();
    }
    if (rnd_below(2)) {         /* version 2: routes of some width (the caller sets the version) */
        static const uint8_t widths[] = {1, 2, 4};
        r->flags |= PROTO_RESULT_ROUTES;
        r->route_width = widths[rnd_below(3)];
        r->route_layers = (uint16_t)(1 + rnd_below(4));
        r->route_k = (uint8_t)(1 + rnd_below(3));
        r->n_routes = rnd_below(3) == 0 ? 0 : rnd_below(20);
        uint64_t bytes = (uint64_t)r->n_routes * r->route_layers * r->route_k * r->route_width;
        uint8_t *ids = bytes ? palloc((size_t)bytes) : NULL;
        for (uint64_t i = 0; i < bytes; i++)
            ids[i] = (uint8_t)rnd();
        r->routes = ids;
    }
}

/* 0..5 manifest tensors of random names, dtypes and shapes. */
static proto_tensor *rnd_tensors(uint32_t *n_out)
{
    uint32_t n = rnd_below(6);
    proto_tensor *t = n ? palloc(n * sizeof *t) : NULL;
    for (uint32_t i = 0; i < n; i++) {
        do
            t[i].name = rnd_str(60);
        while (t[i].name.len == 0 || t[i].name.len > PROTO_MAX_TENSOR_NAME);
        t[i].dtype = (uint8_t)rnd_below(3);
        t[i].n_dims = (uint8_t)(1 + rnd_below(PROTO_MAX_DIMS));
        for (uint32_t d = 0; d < t[i].n_dims; d++)
            t[i].shape[d] = rnd_u64();
        t[i].nbytes = rnd_u64();
        t[i].crc32c = (uint32_t)rnd();
    }
    *n_out = n;
    return t;
}

static void rnd_msg(uint16_t type, proto_msg *m)
{
    memset(m, 0, sizeof *m);
    m->type = type;
    m->version = (uint16_t)(rnd_below(3)); /* 0 (= 1), 1 or 2; 2 whenever a result has routes */
    switch (type) {
    case PROTO_HELLO:
        m->hello.client_id = rnd_u64();
        m->hello.min_version = (uint16_t)rnd();
        m->hello.max_version = (uint16_t)rnd();
        m->hello.client_name = rnd_str(20);
        break;
    case PROTO_HELLO_OK: {
        proto_hello_ok *h = &m->hello_ok;
        h->client_id = rnd_u64();
        h->version = (uint16_t)rnd();
        h->flags = (uint32_t)rnd() & PROTO_HELLO_OK_FLAGS;
        h->features = rnd_u64();
        h->weight_version = rnd_u64();
        h->vocab_size = (uint32_t)rnd();
        h->max_context = (uint32_t)rnd();
        h->n_layers = (uint32_t)rnd();
        h->dim = (uint32_t)rnd();
        h->n_heads = (uint32_t)rnd();
        h->n_kv_heads = (uint32_t)rnd();
        h->eos_id = (int32_t)rnd();
        h->max_prompt_tokens = (uint32_t)rnd();
        h->max_message_bytes = rnd_u64();
        h->max_n = (uint32_t)rnd();
        h->max_requests_per_submit = (uint32_t)rnd();
        h->max_tokens = (uint32_t)rnd();
        h->max_stop_ids = (uint32_t)rnd();
        h->max_logprobs_topk = (uint32_t)rnd();
        h->retention_results = (uint32_t)rnd();
        h->retention_bytes = rnd_u64();
        h->max_wait_ms = (uint32_t)rnd();
        h->client_ttl_s = (uint32_t)rnd();
        h->pending_results = (uint32_t)rnd();
        h->inflight_samples = (uint32_t)rnd();
        h->model_name = rnd_str(30);
        h->architecture = rnd_str(8);
        h->backend = rnd_str(5);
        h->server = rnd_str(20);
        break;
    }
    case PROTO_SUBMIT: {
        m->version = (uint16_t)rnd_below(PROTO_VERSION + 1); /* any; 4 carries sampling tails, 5 score tails, 6 lora */
        m->submit.client_id = rnd_u64();
        m->submit.n_requests = rnd_below(6);
        proto_request *r = m->submit.n_requests ? palloc(m->submit.n_requests * sizeof *r) : NULL;
        for (uint32_t i = 0; i < m->submit.n_requests; i++)
            rnd_request(&r[i], m->version);
        m->submit.requests = r;
        break;
    }
    case PROTO_SUBMIT_OK: {
        m->submit_ok.n_items = rnd_below(6);
        proto_submit_item *it = m->submit_ok.n_items ? palloc(m->submit_ok.n_items * sizeof *it) : NULL;
        for (uint32_t i = 0; i < m->submit_ok.n_items; i++) {
            it[i].client_req_id = rnd_u64();
            it[i].status = (uint32_t)rnd();
            it[i].flags = (uint32_t)rnd() & PROTO_SUBMIT_OK_FLAGS;
            it[i].message = rnd_str(40);
        }
        m->submit_ok.items = it;
        break;
    }
    case PROTO_FETCH:
        m->fetch.client_id = rnd_u64();
        m->fetch.ack_seq = rnd_u64();
        m->fetch.max_results = (uint32_t)rnd();
        m->fetch.wait_ms = (uint32_t)rnd();
        m->fetch.max_bytes = rnd_u64();
        break;
    case PROTO_RESULTS: {
        m->results.ack_seq = rnd_u64();
        m->results.pending_results = (uint32_t)rnd();
        m->results.inflight_samples = (uint32_t)rnd();
        m->results.n_results = rnd_below(5);
        proto_result *r = m->results.n_results ? palloc(m->results.n_results * sizeof *r) : NULL;
        for (uint32_t i = 0; i < m->results.n_results; i++) {
            rnd_result(&r[i]);
            if ((r[i].flags & PROTO_RESULT_ROUTES) && m->version < 2)
                m->version = 2;
            if ((r[i].flags & PROTO_RESULT_SCORES) && m->version < 5)
                m->version = 5;
            if (r[i].flags & PROTO_RESULT_LORA)
                m->version = 6;
        }
        m->results.results = r;
        break;
    }
    case PROTO_ABORT:
        m->abort_req.client_id = rnd_u64();
        m->abort_req.client_req_id = rnd_u64();
        m->abort_req.flags = (uint32_t)rnd() & PROTO_ABORT_FLAGS;
        break;
    case PROTO_ABORT_OK:
        m->abort_ok.n_requests = (uint32_t)rnd();
        m->abort_ok.n_samples = (uint32_t)rnd();
        break;
    case PROTO_STATUS: break;
    case PROTO_STATUS_OK: m->status_ok.json = rnd_str(100); break;
    case PROTO_BYE:
        m->bye.client_id = rnd_u64();
        m->bye.flags = (uint32_t)rnd() & PROTO_BYE_FLAGS;
        break;
    case PROTO_BYE_OK:
        m->bye_ok.pending_results = (uint32_t)rnd();
        m->bye_ok.inflight_samples = (uint32_t)rnd();
        break;
    case PROTO_ERROR:
        m->error.code = 1 + rnd_below(100);
        m->error.request_type = (uint16_t)rnd();
        m->error.version_max = (uint16_t)rnd();
        m->error.message = rnd_str(60);
        break;
    case PROTO_UPDATE_BEGIN: {
        proto_update_begin *u = &m->update_begin;
        u->client_id = rnd_u64();
        u->version = rnd_u64();
        u->mode = (uint8_t)rnd_below(3);
        u->window = (uint32_t)rnd();
        u->max_chunk_bytes = (uint32_t)rnd();
        u->total_bytes = rnd_u64();
        u->tensors = rnd_tensors(&u->n_tensors);
        break;
    }
    case PROTO_ADAPTER_BEGIN: {
        proto_adapter_begin *u = &m->adapter_begin;
        u->client_id = rnd_u64();
        u->version = rnd_u64();
        u->flags = (uint8_t)rnd_below(2);
        u->rank = (uint32_t)rnd();
        u->lora_alpha = (float)rnd_below(1000) / 8.0f;
        u->window = (uint32_t)rnd();
        u->max_chunk_bytes = (uint32_t)rnd();
        u->total_bytes = rnd_u64();
        do
            u->name = rnd_str(40);
        while (u->name.len == 0 || u->name.len > PROTO_MAX_ADAPTER_NAME);
        u->tensors = rnd_tensors(&u->n_tensors);
        break;
    }
    case PROTO_UPDATE_BEGIN_OK:
    case PROTO_ADAPTER_BEGIN_OK:
        m->update_begin_ok.xfer_id = rnd_u64();
        m->update_begin_ok.window = (uint32_t)rnd();
        m->update_begin_ok.max_chunk_bytes = (uint32_t)rnd();
        m->update_begin_ok.staging_bytes = rnd_u64();
        m->update_begin_ok.data_port = (uint16_t)rnd();
        break;
    case PROTO_UPDATE_CHUNK: {
        proto_update_chunk *u = &m->update_chunk;
        u->xfer_id = rnd_u64();
        u->chunk_seq = (uint32_t)rnd();
        u->tensor_index = (uint32_t)rnd();
        u->offset = rnd_u64();
        u->crc32c = (uint32_t)rnd();
        u->len = rnd_below(4) == 0 ? 0 : rnd_below(300);
        uint8_t *d = u->len ? palloc(u->len) : NULL;
        for (uint32_t i = 0; i < u->len; i++)
            d[i] = (uint8_t)rnd();
        u->data = d;
        break;
    }
    case PROTO_UPDATE_CHUNK_OK:
        m->update_chunk_ok.xfer_id = rnd_u64();
        m->update_chunk_ok.chunk_seq = (uint32_t)rnd();
        m->update_chunk_ok.flags = (uint32_t)rnd() & PROTO_CHUNK_OK_FLAGS;
        m->update_chunk_ok.bytes_staged = rnd_u64();
        m->update_chunk_ok.total_bytes = rnd_u64();
        break;
    case PROTO_UPDATE_COMMIT: m->update_commit.xfer_id = rnd_u64(); break;
    case PROTO_UPDATE_COMMIT_OK:
        m->update_commit_ok.version = rnd_u64();
        m->update_commit_ok.stall_us = rnd_u64();
        m->update_commit_ok.wait_us = rnd_u64();
        m->update_commit_ok.staged_us = rnd_u64();
        m->update_commit_ok.n_aborted = (uint32_t)rnd();
        break;
    case PROTO_UPDATE_ABORT: m->update_abort.xfer_id = rnd_u64(); break;
    case PROTO_UPDATE_ABORT_OK: m->update_abort_ok.bytes_freed = rnd_u64(); break;
    case PROTO_AUTH_BEGIN:
    case PROTO_AUTH:
    case PROTO_AUTH_CHALLENGE:
    case PROTO_AUTH_OK:
        for (int i = 0; i < PROTO_AUTH_BYTES; i++)
            m->auth.bytes[i] = (uint8_t)rnd();
        break;
    case PROTO_UPDATE_FORWARD: {
        proto_update_forward *u = &m->update_forward;
        u->xfer_id = rnd_u64();
        u->next_xfer_id = rnd_u64();
        u->port = (uint16_t)rnd();
        u->flags = (uint16_t)(rnd() & PROTO_FORWARD_FLAGS);
        u->window = (uint32_t)rnd();
        for (int i = 0; i < PROTO_AUTH_BYTES; i++)
            u->key[i] = (uint8_t)rnd();
        u->host = (proto_str){"10.1.2.3", 8};
        break;
    }
    case PROTO_UPDATE_FORWARD_OK:
        m->update_forward_ok.xfer_id = rnd_u64();
        m->update_forward_ok.queued_bytes = rnd_u64();
        break;
    case PROTO_UPDATE_PREPARE: m->update_prepare.xfer_id = rnd_u64(); break;
    case PROTO_UPDATE_PREPARE_OK: {
        proto_update_prepare_ok *u = &m->update_prepare_ok;
        u->xfer_id = rnd_u64();
        u->state = (uint8_t)rnd_below(3);
        u->forward = (uint8_t)rnd_below(4);
        u->forward_error = (uint32_t)rnd();
        u->bytes_staged = rnd_u64();
        u->total_bytes = rnd_u64();
        u->forwarded_bytes = rnd_u64();
        break;
    }
    case PROTO_WEIGHTS_SYNC:
        m->weights_sync.client_id = rnd_u64();
        m->weights_sync.url = (proto_str){"tcp://10.9.8.7:7070", 19};
        break;
    case PROTO_WEIGHTS_SYNC_OK: m->weights_sync_ok.version = rnd_u64(); break;
    case PROTO_LANE_AUTH:
        m->lane_auth.xfer_id = rnd_u64();
        for (int i = 0; i < PROTO_AUTH_BYTES; i++)
            m->lane_auth.proof[i] = (uint8_t)rnd();
        break;
    }
}

static void test_random_roundtrip(void)
{
    const uint16_t *types = all_types;
    proto_buf b, b2;
    proto_buf_init(&b);
    proto_buf_init(&b2);
    rng_state = 777;
    for (int iter = 0; iter < 2000; iter++) {
        for (size_t t = 0; t < sizeof all_types / sizeof all_types[0]; t++) {
            proto_msg m, d;
            rnd_msg(types[t], &m);
            proto_buf_reset(&b);
            CHECK(proto_encode(&b, &m) == 0, "%s iteration %d: encode: %s", proto_type_name(types[t]), iter,
                  rd_errmsg());
            CHECK(proto_decode(b.data, b.len, b.len, &d) == 0, "%s iteration %d: decode: %s",
                  proto_type_name(types[t]), iter, rd_errmsg());
            CHECK(msg_eq(&d, &m), "%s iteration %d: round trip differs: %s", proto_type_name(types[t]), iter, neq);
            CHECK(d.arena_bytes <= PROTO_ARENA_BOUND(b.len), "arena %zu for a %zu-byte frame", d.arena_bytes, b.len);
            proto_buf_reset(&b2);
            CHECK_OK(proto_encode(&b2, &d));
            CHECK(b2.len == b.len && !memcmp(b2.data, b.data, b.len), "%s: re-encode differs",
                  proto_type_name(types[t]));
            if (types[t] == PROTO_RESULTS)
                for (uint32_t i = 0; i < m.results.n_results; i++) {
                    proto_buf_reset(&b2);
                    proto_msg one = {.type = PROTO_RESULTS, .version = m.version};
                    one.results.n_results = 1;
                    one.results.results = &m.results.results[i];
                    CHECK_OK(proto_encode(&b2, &one));
                    CHECK(b2.len == PROTO_RESULTS_OVERHEAD + proto_result_bytes(&m.results.results[i]),
                          "proto_result_bytes is off: frame %zu", b2.len);
                }
            proto_msg_free(&d);
            pool_free();
        }
    }
    /* several frames appended to one buffer decode one by one */
    proto_buf_reset(&b);
    proto_msg a, c;
    rnd_msg(PROTO_FETCH, &a);
    CHECK_OK(proto_encode(&b, &a));
    size_t first = b.len;
    rnd_msg(PROTO_ERROR, &c);
    CHECK_OK(proto_encode(&b, &c));
    proto_msg d;
    CHECK_OK(proto_decode(b.data, first, 0, &d));
    CHECK(msg_eq(&d, &a), "first frame: %s", neq);
    CHECK_OK(proto_decode(b.data + first, b.len - first, 0, &d));
    CHECK(msg_eq(&d, &c), "second frame: %s", neq);
    proto_msg_free(&d);
    pool_free();
    proto_buf_free(&b);
    proto_buf_free(&b2);
}

/* The densest frames of each array-bearing message decode within the arena,
 * and a huge count is refused without allocating. */
static void test_dense_frames(void)
{
    proto_buf b;
    proto_buf_init(&b);
    proto_msg m, d;
    /* 20000 minimal requests, each with a 1-byte text prompt */
    memset(&m, 0, sizeof m);
    m.type = PROTO_SUBMIT;
    m.submit.n_requests = 20000;
    proto_request *r = palloc(20000 * sizeof *r);
    for (int i = 0; i < 20000; i++) {
        r[i].flags = PROTO_REQ_PROMPT_IS_TEXT;
        r[i].text.ptr = "x";
        r[i].text.len = 1;
    }
    m.submit.requests = r;
    CHECK_OK(proto_encode(&b, &m));
    CHECK(proto_decode(b.data, b.len, 0, &d) == 0, "dense SUBMIT: %s", rd_errmsg());
    CHECK(d.arena_bytes <= 3 * b.len + 256, "arena: every message but UPDATE_BEGIN keeps 3 x frame + 256");
    proto_msg_free(&d);
    /* 1-token, 1-span results */
    memset(&m, 0, sizeof m);
    m.type = PROTO_RESULTS;
    m.results.n_results = 20000;
    proto_result *res = palloc(20000 * sizeof *res);
    static const int32_t tok = 5;
    static const float lp = -1;
    static const proto_span span = {0, 1, 3};
    for (int i = 0; i < 20000; i++) {
        res[i].finish = PROTO_FINISH_STOP;
        res[i].n_tokens = 1;
        res[i].token_ids = &tok;
        res[i].logprobs = &lp;
        res[i].n_spans = 1;
        res[i].spans = &span;
    }
    m.results.results = res;
    proto_buf_reset(&b);
    CHECK_OK(proto_encode(&b, &m));
    CHECK(proto_decode(b.data, b.len, 0, &d) == 0, "dense RESULTS: %s", rd_errmsg());
    proto_msg_free(&d);
    /* items with 1-byte messages */
    memset(&m, 0, sizeof m);
    m.type = PROTO_SUBMIT_OK;
    m.submit_ok.n_items = 20000;
    proto_submit_item *it = palloc(20000 * sizeof *it);
    for (int i = 0; i < 20000; i++) {
        it[i].message.ptr = "y";
        it[i].message.len = 1;
    }
    m.submit_ok.items = it;
    proto_buf_reset(&b);
    CHECK_OK(proto_encode(&b, &m));
    CHECK(proto_decode(b.data, b.len, 0, &d) == 0, "dense SUBMIT_OK: %s", rd_errmsg());
    proto_msg_free(&d);
    /* a manifest of 1-dimensional tensors with 1-byte names (29 wire bytes,
     * 72 + 8 arena bytes each): the densest UPDATE_BEGIN */
    memset(&m, 0, sizeof m);
    m.type = PROTO_UPDATE_BEGIN;
    m.update_begin.n_tensors = 20000;
    proto_tensor *t = palloc(20000 * sizeof *t);
    for (int i = 0; i < 20000; i++) {
        t[i].name.ptr = "w";
        t[i].name.len = 1;
        t[i].n_dims = 1;
        t[i].shape[0] = (uint64_t)i;
    }
    m.update_begin.tensors = t;
    proto_buf_reset(&b);
    CHECK_OK(proto_encode(&b, &m));
    CHECK(b.len == 16 + 40 + 20000 * 29, "dense UPDATE_BEGIN is %zu bytes", b.len);
    CHECK(proto_decode(b.data, b.len, 0, &d) == 0, "dense UPDATE_BEGIN: %s", rd_errmsg());
    CHECK(d.arena_bytes <= PROTO_ARENA_BOUND(b.len), "arena %zu > bound %zu", d.arena_bytes,
          PROTO_ARENA_BOUND(b.len));
    CHECK(d.update_begin.tensors[19999].shape[0] == 19999 && !strcmp(d.update_begin.tensors[7].name.ptr, "w"),
          "fields");
    proto_msg_free(&d);
    /* a count the bytes cannot hold is refused without allocating */
    uint32_t n_fit = (uint32_t)((b.len - 16 - 40) / 28);
    memcpy(b.data + 16 + 36, &n_fit, 4);    /* little-endian host assumed by this test only */
    n_fit++;
    memcpy(b.data + 16 + 36, &n_fit, 4);
    CHECK(proto_decode(b.data, b.len, 0, &d) == RD_EFORMAT && d.wire_error == PROTO_E_MALFORMED && !d.arena,
          "n_tensors past the bytes: %s", rd_errmsg());
    CHECK(strstr(rd_errmsg(), "n_tensors"), "message: %s", rd_errmsg());
    pool_free();
    /* the limit: a frame one byte over max_len is TOO_LARGE, at max_len it decodes */
    memset(&m, 0, sizeof m);
    m.type = PROTO_STATUS_OK;
    m.status_ok.json.ptr = "{}";
    m.status_ok.json.len = 2;
    proto_buf_reset(&b);
    CHECK_OK(proto_encode(&b, &m));
    CHECK(proto_decode(b.data, b.len, b.len, &d) == 0, "at the limit: %s", rd_errmsg());
    proto_msg_free(&d);
    CHECK(proto_decode(b.data, b.len, b.len - 1, &d) == RD_ERANGE && d.wire_error == PROTO_E_TOO_LARGE, "over");
    proto_buf_free(&b);
}

/* The encoder refuses what the decoder would, appending nothing. */
static void test_encode_refuses(void)
{
    proto_buf b;
    proto_buf_init(&b);
    proto_msg m;
    CHECK_OK(proto_encode(&b, &(proto_msg){.type = PROTO_STATUS}));
    size_t len0 = b.len;

    memset(&m, 0, sizeof m);
    m.type = PROTO_HELLO;
    m.hello.client_name.ptr = "\xc0\x80";
    m.hello.client_name.len = 2;
    CHECK(proto_encode(&b, &m) == RD_EINVAL && b.len == len0, "bad UTF-8 accepted");
    m.hello.client_name.len = 0;
    m.hello.flags = 1;
    CHECK(proto_encode(&b, &m) == RD_EINVAL && b.len == len0, "HELLO flags accepted");

    proto_request r = {.flags = PROTO_REQ_PROMPT_IS_TEXT, .n_prompt = 1, .prompt = (const int32_t[]){1}};
    memset(&m, 0, sizeof m);
    m.type = PROTO_SUBMIT;
    m.submit.n_requests = 1;
    m.submit.requests = &r;
    CHECK(proto_encode(&b, &m) == RD_EINVAL && b.len == len0, "text flag with token ids accepted");
    r.flags = 0;
    r.n_prompt = 3;
    r.prompt = NULL;
    CHECK(proto_encode(&b, &m) == RD_EINVAL && b.len == len0, "NULL prompt with n_prompt 3 accepted");

    proto_result res = {.finish = 0};
    memset(&m, 0, sizeof m);
    m.type = PROTO_RESULTS;
    m.results.n_results = 1;
    m.results.results = &res;
    CHECK(proto_encode(&b, &m) == RD_EINVAL && b.len == len0, "finish 0 accepted");
    static const int32_t toks[3] = {1, 2, 3};
    static const float lps[3] = {-1, -2, -3};
    proto_span bad[2] = {{0, 2, 5}, {2, 3, 5}};
    res = (proto_result){.finish = PROTO_FINISH_STOP, .n_tokens = 3, .token_ids = toks, .logprobs = lps,
                         .n_spans = 2, .spans = bad};
    CHECK(proto_encode(&b, &m) == RD_EINVAL && b.len == len0, "spans with equal versions accepted");
    CHECK(strstr(rd_errmsg(), "increasing"), "message: %s", rd_errmsg());
    bad[1].version = 6;
    CHECK_OK(proto_encode(&b, &m));
    b.len = len0;
    res.n_spans = 0;
    CHECK(proto_encode(&b, &m) == RD_EINVAL && b.len == len0, "tokens without spans accepted");

    /* weight updates */
    proto_tensor t = {.name = {"model.norm.weight", 17}, .dtype = PROTO_DTYPE_BF16, .n_dims = 1, .shape = {576},
                      .nbytes = 1152};
    memset(&m, 0, sizeof m);
    m.type = PROTO_UPDATE_BEGIN;
    m.update_begin.n_tensors = 1;
    m.update_begin.tensors = &t;
    CHECK_OK(proto_encode(&b, &m));
    CHECK(b.len == len0 + 16 + 40 + 4 + 17 + 4 + 8 + 12, "UPDATE_BEGIN size %zu", b.len - len0);
    b.len = len0;
    m.update_begin.mode = 3;
    CHECK(proto_encode(&b, &m) == RD_EINVAL && b.len == len0, "mode 3 accepted");
    m.update_begin.mode = PROTO_MODE_ABORT;
    t.dtype = 3;
    CHECK(proto_encode(&b, &m) == RD_EINVAL && b.len == len0, "dtype 3 accepted");
    t.dtype = PROTO_DTYPE_F32;
    t.n_dims = 0;
    CHECK(proto_encode(&b, &m) == RD_EINVAL && b.len == len0, "n_dims 0 accepted");
    t.n_dims = 5;
    CHECK(proto_encode(&b, &m) == RD_EINVAL && b.len == len0, "n_dims 5 accepted");
    t.n_dims = 4;
    t.name.len = 0;
    CHECK(proto_encode(&b, &m) == RD_EINVAL && b.len == len0, "empty name accepted");
    char longname[PROTO_MAX_TENSOR_NAME + 1];
    memset(longname, 'n', sizeof longname);
    t.name.ptr = longname;
    t.name.len = PROTO_MAX_TENSOR_NAME + 1;
    CHECK(proto_encode(&b, &m) == RD_EINVAL && b.len == len0, "257-byte name accepted");
    t.name.len = PROTO_MAX_TENSOR_NAME;
    CHECK_OK(proto_encode(&b, &m));
    b.len = len0;
    t.name.ptr = "a\xed\xa0\x80";
    t.name.len = 4;
    CHECK(proto_encode(&b, &m) == RD_EINVAL && b.len == len0, "surrogate in a name accepted");
    m.update_begin.tensors = NULL;
    CHECK(proto_encode(&b, &m) == RD_EINVAL && b.len == len0, "tensors NULL with n_tensors 1 accepted");
    memset(&m, 0, sizeof m);
    m.type = PROTO_UPDATE_CHUNK;
    m.update_chunk.len = 5;
    CHECK(proto_encode(&b, &m) == RD_EINVAL && b.len == len0, "chunk data NULL with len 5 accepted");
    m.update_chunk.len = 0;
    CHECK_OK(proto_encode(&b, &m));
    b.len = len0;
    memset(&m, 0, sizeof m);
    m.type = PROTO_UPDATE_CHUNK_OK;
    m.update_chunk_ok.flags = 2;
    CHECK(proto_encode(&b, &m) == RD_EINVAL && b.len == len0, "CHUNK_OK flags 2 accepted");
    m.type = 0x19;
    CHECK(proto_encode(&b, &m) == RD_ENOTSUP && b.len == len0, "type 0x19 encoded");
    memset(&m, 0, sizeof m);
    m.type = 0x77;
    CHECK(proto_encode(&b, &m) == RD_ENOTSUP && b.len == len0, "undefined type encoded");
    m.type = PROTO_ERROR;
    CHECK(proto_encode(&b, &m) == RD_EINVAL && b.len == len0, "error code 0 encoded");
    proto_buf_free(&b);
}

static void test_encode_error(void)
{
    proto_buf b;
    proto_buf_init(&b);
    CHECK_OK(proto_encode_error(&b, PROTO_E_BUSY, PROTO_SUBMIT, "retention full: 10 of 10 results; fetch first"));
    proto_msg m;
    CHECK_OK(proto_decode(b.data, b.len, 0, &m));
    CHECK(m.type == PROTO_ERROR && m.error.code == PROTO_E_BUSY && m.error.request_type == PROTO_SUBMIT &&
          m.error.version_max == PROTO_VERSION, "fields");
    CHECK(!strcmp(m.error.message.ptr, "retention full: 10 of 10 results; fetch first"), "message");
    proto_msg_free(&m);
    /* long, with invalid UTF-8 and a multi-byte character cut at the 4096-byte limit */
    char *big = malloc(6000);
    memset(big, 'a', 6000);
    big[10] = (char)0xff;
    memcpy(big + 4094, "中", 3);
    big[5999] = 0;
    proto_buf_reset(&b);
    CHECK_OK(proto_encode_error(&b, PROTO_E_INTERNAL, 0, big));
    CHECK_OK(proto_decode(b.data, b.len, 0, &m));
    CHECK(m.error.message.len == 4096 && m.error.message.ptr[10] == '?' && m.error.message.ptr[4094] == '?' &&
          m.error.message.ptr[4095] == '?', "len %u", m.error.message.len);
    proto_msg_free(&m);
    free(big);
    proto_buf_reset(&b);
    CHECK_OK(proto_encode_error(&b, 0, 0, NULL));
    CHECK_OK(proto_decode(b.data, b.len, 0, &m));
    CHECK(m.error.code == PROTO_E_INTERNAL && m.error.message.len == 0, "code 0 becomes INTERNAL");
    proto_msg_free(&m);
    proto_buf_free(&b);
}

/* An UPDATE_CHUNK's data points into the frame (not copied), unaligned, and
 * its crc32c field is the CRC-32C (base/crc32c.h) of those bytes. */
static void test_update_chunk_data(void)
{
    size_t len;
    uint8_t *data = read_file("update_chunk.bin", &len);
    CHECK(data, "cannot read update_chunk.bin");
    proto_msg m;
    CHECK_OK(proto_decode(data, len, 0, &m));
    CHECK(m.type == PROTO_UPDATE_CHUNK && m.update_chunk.len == len - 48, "len %u", m.update_chunk.len);
    CHECK(m.update_chunk.data == data + 48, "data does not point into the frame");
    CHECK(m.arena == NULL && m.arena_bytes == 0, "a chunk decode allocated %zu bytes", m.arena_bytes);
    CHECK(crc32c(0, m.update_chunk.data, m.update_chunk.len) == m.update_chunk.crc32c,
          "crc32c of the data 0x%08x, field 0x%08x", crc32c(0, m.update_chunk.data, m.update_chunk.len),
          m.update_chunk.crc32c);
    proto_msg_free(&m);
    /* at an odd address too */
    uint8_t *odd = malloc(len + 1);
    memcpy(odd + 1, data, len);
    CHECK_OK(proto_decode(odd + 1, len, 0, &m));
    CHECK(m.update_chunk.data == odd + 1 + 48 && !memcmp(m.update_chunk.data, data + 48, len - 48), "odd");
    free(odd);
    free(data);
}

/* Version 2's routes on their own: each width decodes to its own width (not
 * widened), the version rules hold both ways, the encoder refuses what the
 * decoder would, sizes add up, and a frame dense with tiny routed results
 * stays within the arena bound. */
static void test_routes(void)
{
    static const uint8_t u8[2 * 3 * 2] = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 255};
    static const uint16_t u16[2 * 3 * 2] = {0, 1, 299, 3, 4, 5, 6, 7, 8, 9, 10, 65535};
    static const int32_t i32[2 * 3 * 2] = {0, 1, 70000, 3, 4, 5, 6, 7, 8, 9, INT32_MAX, -1};
    const void *ids[3] = {u8, u16, i32};
    const uint8_t widths[3] = {1, 2, 4};
    const int32_t tok[1] = {5};
    const float lp[1] = {-1.0f};
    proto_span span = {0, 1, 3};
    proto_buf b;
    proto_buf_init(&b);
    for (int w = 0; w < 3; w++) {
        proto_result r = {.seq = 1, .finish = PROTO_FINISH_STOP, .flags = PROTO_RESULT_ROUTES, .n_prompt = 2,
                          .n_tokens = 1, .token_ids = tok, .logprobs = lp, .n_spans = 1, .spans = &span,
                          .n_routes = 2, .route_layers = 3, .route_k = 2, .route_width = widths[w], .routes = ids[w]};
        proto_msg m = {.type = PROTO_RESULTS, .version = 2}, d;
        m.results.n_results = 1;
        m.results.results = &r;
        proto_buf_reset(&b);
        CHECK_OK(proto_encode(&b, &m));
        CHECK(b.len == PROTO_RESULTS_OVERHEAD + proto_result_bytes(&r) &&
              proto_result_bytes(&r) == 88 + 8 + 16 + proto_routes_bytes(2, 3, 2, widths[w]), "width %u: %zu bytes",
              widths[w], b.len);
        CHECK(b.data[4] == 2 && b.data[5] == 0, "header version %u", b.data[4]);
        CHECK_OK(proto_decode(b.data, b.len, 0, &d));
        const proto_result *g = &d.results.results[0];
        CHECK(d.version == 2 && g->route_width == widths[w] && g->n_routes == 2 && g->route_layers == 3 &&
              g->route_k == 2 && !memcmp(g->routes, ids[w], 12 * (size_t)widths[w]), "width %u decodes", widths[w]);
        CHECK(((uintptr_t)g->routes & 7) == 0, "routes not aligned");
        proto_msg_free(&d);
        /* the same frame in version 1: the flag is undefined there */
        uint8_t *v1 = malloc(b.len);
        memcpy(v1, b.data, b.len);
        v1[4] = 1;
        CHECK(proto_decode(v1, b.len, 0, &d) == RD_EFORMAT && d.wire_error == PROTO_E_MALFORMED &&
              strstr(rd_errmsg(), "version 1"), "a version-1 frame with routes: %s", rd_errmsg());
        free(v1);
        size_t len0 = b.len;
        m.version = 1;
        CHECK(proto_encode(&b, &m) == RD_EINVAL && b.len == len0, "routes encoded in version 1");
        m.version = 0;
        CHECK(proto_encode(&b, &m) == RD_EINVAL && b.len == len0, "routes encoded in the default version");
        m.version = 2;
        r.route_width = 3;
        CHECK(proto_encode(&b, &m) == RD_EINVAL && b.len == len0, "route_width 3 encoded");
        r.route_width = widths[w];
        r.route_layers = 0;
        CHECK(proto_encode(&b, &m) == RD_EINVAL && b.len == len0, "0 layers encoded");
        r.route_layers = 3;
        r.routes = NULL;
        CHECK(proto_encode(&b, &m) == RD_EINVAL && b.len == len0, "NULL routes with n_routes 2 encoded");
        r.n_routes = 0;
        CHECK_OK(proto_encode(&b, &m));   /* none: a sample that never ran */
        m.version = PROTO_VERSION + 1;
        b.len = len0;
        CHECK(proto_encode(&b, &m) == RD_EINVAL && b.len == len0, "a version past PROTO_VERSION encoded");
    }
    /* without routes a version-2 frame is the version-1 frame but for the header's version */
    proto_result plain = {.seq = 1, .finish = PROTO_FINISH_STOP, .n_tokens = 1, .token_ids = tok, .logprobs = lp,
                          .n_spans = 1, .spans = &span};
    proto_msg m1 = {.type = PROTO_RESULTS, .version = 1}, m2 = {.type = PROTO_RESULTS, .version = 2};
    m1.results.n_results = m2.results.n_results = 1;
    m1.results.results = m2.results.results = &plain;
    proto_buf b2;
    proto_buf_init(&b2);
    proto_buf_reset(&b);
    CHECK_OK(proto_encode(&b, &m1));
    CHECK_OK(proto_encode(&b2, &m2));
    CHECK(b.len == b2.len && b.data[4] == 1 && b2.data[4] == 2 && !memcmp(b.data + 6, b2.data + 6, b.len - 6),
          "a version-2 frame without routes differs from version 1's");
    proto_buf_free(&b2);
    CHECK(proto_route_width(2) == 1 && proto_route_width(256) == 1 && proto_route_width(257) == 2 &&
          proto_route_width(65536) == 2 && proto_route_width(65537) == 4, "route widths");
    /* 20000 results of one token each with a single 1-byte route: the arena bound holds */
    enum { N = 20000 };
    proto_result *rs = palloc(N * sizeof *rs);
    for (int i = 0; i < N; i++)
        rs[i] = (proto_result){.seq = (uint64_t)i + 1, .finish = PROTO_FINISH_STOP, .flags = PROTO_RESULT_ROUTES,
                               .n_tokens = 1, .token_ids = tok, .logprobs = lp, .n_spans = 1, .spans = &span,
                               .n_routes = 1, .route_layers = 1, .route_k = 1, .route_width = 1, .routes = u8};
    proto_msg dense = {.type = PROTO_RESULTS, .version = 2}, d;
    dense.results.n_results = N;
    dense.results.results = rs;
    proto_buf_reset(&b);
    CHECK_OK(proto_encode(&b, &dense));
    CHECK_OK(proto_decode(b.data, b.len, 0, &d));
    CHECK(d.arena_bytes <= PROTO_ARENA_BOUND(b.len) && d.results.n_results == N, "arena %zu for %zu bytes",
          d.arena_bytes, b.len);
    proto_msg_free(&d);
    /* the request flag: undefined in version 1, needs the ROUTES feature in version 2 */
    proto_hello_ok lim = {.version = 2, .features = PROTO_FEATURE_ROUTES, .vocab_size = 100, .max_context = 64,
                          .max_prompt_tokens = 32, .max_message_bytes = 1 << 20, .max_n = 4, .max_tokens = 16,
                          .architecture = {"qwen3moe", 8}};
    const int32_t prompt[2] = {1, 2};
    proto_request q = {.client_req_id = 9, .n = 1, .max_tokens = 4, .top_p = 1, .flags = PROTO_REQ_RETURN_ROUTES,
                       .n_prompt = 2, .prompt = prompt};
    CHECK(proto_check_request(&q, &lim) == 0, "version 2 with ROUTES: %s", rd_errmsg());
    lim.version = 1;
    CHECK(proto_check_request(&q, &lim) == RD_EINVAL && strstr(rd_errmsg(), "undefined bits 0x20"), "version 1: %s",
          rd_errmsg());
    lim.version = 2;
    lim.features = 0;
    lim.architecture = (proto_str){"llama", 5};
    CHECK(proto_check_request(&q, &lim) == RD_EINVAL && strstr(rd_errmsg(), "(llama) is not a mixture of experts"),
          "dense: %s", rd_errmsg());
    q.flags = 0;
    CHECK(proto_check_request(&q, &lim) == 0, "no flag: %s", rd_errmsg());
    /* an ERROR in version 2 says so in its header; its body is version 1's */
    proto_buf_reset(&b);
    CHECK_OK(proto_encode_error_version(&b, 2, PROTO_E_BUSY, PROTO_SUBMIT, "busy"));
    CHECK(b.data[4] == 2, "error version %u", b.data[4]);
    proto_buf_reset(&b);
    CHECK_OK(proto_encode_error(&b, PROTO_E_BUSY, PROTO_SUBMIT, "busy"));
    CHECK(b.data[4] == 1, "default error version %u", b.data[4]);
    proto_buf_free(&b);
    pool_free();
}

/* Little-endian reads for checking a frame's bytes. */
static uint32_t le32(const uint8_t *p) { return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24; }
static float lef32(const uint8_t *p)
{
    uint32_t v = le32(p);
    float f;
    memcpy(&f, &v, 4);
    return f;
}

/* proto_check_request's verdict on r against lim: 0, or RD_EINVAL with want in the message. */
static int refused_with(const proto_request *r, const proto_hello_ok *lim, const char *want)
{
    return proto_check_request(r, lim) == RD_EINVAL && strstr(rd_errmsg(), want) && strstr(rd_errmsg(), "expected");
}

/* Version 4's sampling tail (PROTOCOL.md §4.3): its bytes, the round trip,
 * the version rules both ways, malformed tails, the range checks, the arena. */
static void test_sampling(void)
{
    proto_buf b, b2;
    proto_buf_init(&b);
    proto_buf_init(&b2);
    static const int32_t prompt[] = {1, 2, 3}, ids[] = {7, 99, 0};
    static const float vals[] = {-100.0f, 2.5f, 100.0f};
    proto_sampling tail = {.repetition_penalty = 1.25f, .frequency_penalty = -0.5f, .presence_penalty = 2.0f,
                           .min_tokens = 4, .n_bias = 3, .bias_ids = ids, .bias_vals = vals};
    proto_sampling plain = {.repetition_penalty = 1.0f};
    proto_request rq[3] = {
        {.client_req_id = 1, .n = 2, .max_tokens = 8, .temperature = 1, .top_p = 1, .seed = 5,
         .flags = PROTO_REQ_HAS_SEED | PROTO_REQ_SAMPLING, .n_prompt = 3, .prompt = prompt, .sampling = &tail},
        {.client_req_id = 2, .n = 1, .max_tokens = 8, .temperature = 0, .top_p = 1, .n_prompt = 3, .prompt = prompt},
        {.client_req_id = 3, .n = 1, .max_tokens = 8, .top_p = 1, .flags = PROTO_REQ_PROMPT_IS_TEXT | PROTO_REQ_SAMPLING,
         .text = {"hi", 2}, .sampling = &plain},
    };
    proto_msg m = {.type = PROTO_SUBMIT, .version = 4}, d;
    m.submit.client_id = 9;
    m.submit.n_requests = 3;
    m.submit.requests = rq;
    CHECK_OK(proto_encode(&b, &m));
    /* the bytes: request 0's tail after its prompt (body 12 + 48 fields + n_stop 4 + n_prompt 4 + 3 ids) */
    const uint8_t *t0 = b.data + 16 + 12 + 48 + 4 + 4 + 12;
    CHECK(lef32(t0) == 1.25f && lef32(t0 + 4) == -0.5f && lef32(t0 + 8) == 2.0f && le32(t0 + 12) == 4 &&
          le32(t0 + 16) == 3, "tail head");
    CHECK((int32_t)le32(t0 + 20) == 7 && lef32(t0 + 24) == -100.0f && (int32_t)le32(t0 + 28) == 99 &&
          lef32(t0 + 32) == 2.5f && le32(t0 + 36) == 0 && lef32(t0 + 40) == 100.0f, "pairs: (id, bias) in turn");
    CHECK(b.len == 16 + 12 + (56 + 12 + 20 + 24) + (56 + 12) + (56 + 2 + 20), "frame of %zu bytes", b.len);
    CHECK_OK(proto_decode(b.data, b.len, 0, &d));
    CHECK(msg_eq(&d, &m), "round trip: %s", neq);
    CHECK(d.submit.requests[0].sampling && d.submit.requests[0].sampling->bias_vals[2] == 100.0f &&
          !d.submit.requests[1].sampling && d.submit.requests[2].sampling->n_bias == 0, "decoded tails");
    CHECK(((uintptr_t)d.submit.requests[0].sampling->bias_vals & 3) == 0, "bias values aligned");
    CHECK_OK(proto_encode(&b2, &d));
    CHECK(b2.len == b.len && !memcmp(b2.data, b.data, b.len), "re-encode differs");
    proto_msg_free(&d);

    /* version rules: a tail is written and read only in version 4 */
    size_t len0 = b2.len;
    for (uint16_t v = 0; v < 4; v++) {
        m.version = v;
        CHECK(proto_encode(&b2, &m) == RD_EINVAL && b2.len == len0 && strstr(rd_errmsg(), "version 4"),
              "a tail encoded in version %u", v);
    }
    m.version = 4;
    rq[0].sampling = NULL;
    CHECK(proto_encode(&b2, &m) == RD_EINVAL && b2.len == len0 && strstr(rd_errmsg(), "sampling is NULL"),
          "the flag without its tail encoded in version 4");
    rq[0].sampling = &tail;
    rq[1].sampling = &tail;
    CHECK(proto_encode(&b2, &m) == RD_EINVAL && b2.len == len0, "a tail without the flag encoded");
    rq[1].sampling = NULL;
    /* the version-4 frame relabelled version 3: no tail is read there, so its bytes are left over */
    memcpy(b2.data, b.data, b.len);
    b2.data[4] = 3;
    CHECK(proto_decode(b2.data, b.len, 0, &d) == RD_EFORMAT && d.wire_error == PROTO_E_MALFORMED,
          "a version-3 frame with a tail decoded");
    /* the flag alone in version 3: encoded without a tail, decoded as an undefined bit, refused by the check */
    proto_request old = {.client_req_id = 7, .n = 1, .max_tokens = 4, .top_p = 1, .flags = PROTO_REQ_SAMPLING,
                         .n_prompt = 3, .prompt = prompt};
    proto_msg m3 = {.type = PROTO_SUBMIT, .version = 3};
    m3.submit.n_requests = 1;
    m3.submit.requests = &old;
    proto_buf_reset(&b2);
    CHECK_OK(proto_encode(&b2, &m3));
    CHECK(b2.len == 16 + 12 + 56 + 12, "version-3 frame of %zu bytes", b2.len);
    CHECK_OK(proto_decode(b2.data, b2.len, 0, &d));
    CHECK(d.version == 3 && d.submit.requests[0].flags == PROTO_REQ_SAMPLING && !d.submit.requests[0].sampling,
          "flag kept, no tail");
    proto_hello_ok lim = {.version = 3, .vocab_size = 100, .max_context = 64, .max_prompt_tokens = 60, .max_n = 4,
                          .max_tokens = 32, .max_stop_ids = 4, .max_logprobs_topk = 5,
                          .max_message_bytes = PROTO_DEFAULT_MAX_MESSAGE};
    CHECK(refused_with(&d.submit.requests[0], &lim, "undefined bits 0x40") && strstr(rd_errmsg(), "protocol version 3"),
          "version 3: %s", rd_errmsg());
    lim.version = 1;
    CHECK(refused_with(&d.submit.requests[0], &lim, "undefined bits 0x40"), "version 1: %s", rd_errmsg());
    lim.version = 4;
    CHECK(refused_with(&d.submit.requests[0], &lim, "no sampling tail"), "hand-built flag alone: %s", rd_errmsg());
    proto_msg_free(&d);
    /* without the flag a version-4 frame is the version-1 frame but for the header's version */
    proto_msg m1 = {.type = PROTO_SUBMIT, .version = 1}, m4 = {.type = PROTO_SUBMIT, .version = 4};
    m1.submit.n_requests = m4.submit.n_requests = 1;
    m1.submit.requests = m4.submit.requests = &rq[1];
    proto_buf_reset(&b2);
    CHECK_OK(proto_encode(&b2, &m1));
    size_t l1 = b2.len;
    CHECK_OK(proto_encode(&b2, &m4));
    CHECK(b2.len == 2 * l1 && !memcmp(b2.data + 6, b2.data + l1 + 6, l1 - 6) && b2.data[l1 + 4] == 4,
          "a version-4 frame without the tail differs from version 1's");

    /* malformed tails: the one-request frame cut anywhere in its tail, a count past the bytes, a trailing byte */
    proto_msg one = {.type = PROTO_SUBMIT, .version = 4};
    one.submit.n_requests = 1;
    one.submit.requests = &rq[0];
    proto_buf_reset(&b2);
    CHECK_OK(proto_encode(&b2, &one));
    size_t at_tail = 16 + 12 + 56 + 12;
    CHECK(b2.len == at_tail + 20 + 24, "one-request frame");
    uint8_t *cut = malloc(b2.len + 1);
    for (size_t k = at_tail; k < b2.len; k++) {
        memcpy(cut, b2.data, k);
        uint32_t body = (uint32_t)(k - 16);
        memcpy(cut + 8, &body, 4);              /* little-endian host assumed by this test only */
        CHECK(proto_decode(cut, k, 0, &d) == RD_EFORMAT && d.wire_error == PROTO_E_MALFORMED && !d.arena,
              "cut at %zu decoded", k);
    }
    CHECK(strstr(rd_errmsg(), "bias_ids") || strstr(rd_errmsg(), "n_bias"), "last cut: %s", rd_errmsg());
    memcpy(cut, b2.data, b2.len);
    uint32_t huge = 0xFFFFFFFFu, four = 4;
    memcpy(cut + at_tail + 16, &huge, 4);
    CHECK(proto_decode(cut, b2.len, 0, &d) == RD_EFORMAT && d.wire_error == PROTO_E_MALFORMED && !d.arena &&
          strstr(rd_errmsg(), "n_bias"), "n_bias 2^32-1: %s", rd_errmsg());
    memcpy(cut + at_tail + 16, &four, 4);
    CHECK(proto_decode(cut, b2.len, 0, &d) == RD_EFORMAT && strstr(rd_errmsg(), "n_bias"), "n_bias 4 of 3: %s",
          rd_errmsg());
    memcpy(cut, b2.data, b2.len);
    cut[b2.len] = 0;
    uint32_t body = (uint32_t)(b2.len + 1 - 16);
    memcpy(cut + 8, &body, 4);
    CHECK(proto_decode(cut, b2.len + 1, 0, &d) == RD_EFORMAT && d.wire_error == PROTO_E_MALFORMED, "trailing byte");
    free(cut);
    /* a NaN penalty is well-formed (the decoder keeps the bits); the check refuses it */
    proto_sampling nan_tail = tail;
    nan_tail.repetition_penalty = NAN;
    rq[0].sampling = &nan_tail;
    proto_buf_reset(&b2);
    CHECK_OK(proto_encode(&b2, &one));
    CHECK_OK(proto_decode(b2.data, b2.len, 0, &d));
    CHECK(isnan(d.submit.requests[0].sampling->repetition_penalty), "NaN kept");
    CHECK(refused_with(&d.submit.requests[0], &lim, "repetition_penalty = nan"), "NaN: %s", rd_errmsg());
    proto_msg_free(&d);
    rq[0].sampling = &tail;

    /* the range checks, each naming its field */
    proto_request r = rq[0];
    proto_sampling t = tail;
    r.sampling = &t;
    CHECK(proto_check_request(&r, &lim) == 0, "valid: %s", rd_errmsg());
    struct { float *f; float v; const char *name; } bad_f[] = {
        {&t.repetition_penalty, 0.0f, "repetition_penalty"}, {&t.repetition_penalty, -1.0f, "repetition_penalty"},
        {&t.repetition_penalty, INFINITY, "repetition_penalty"}, {&t.frequency_penalty, 2.01f, "frequency_penalty"},
        {&t.frequency_penalty, NAN, "frequency_penalty"}, {&t.presence_penalty, -2.5f, "presence_penalty"},
        {&t.presence_penalty, -INFINITY, "presence_penalty"},
    };
    for (size_t i = 0; i < sizeof bad_f / sizeof bad_f[0]; i++) {
        float keep = *bad_f[i].f;
        *bad_f[i].f = bad_f[i].v;
        CHECK(refused_with(&r, &lim, bad_f[i].name), "%s = %g: %s", bad_f[i].name, (double)bad_f[i].v, rd_errmsg());
        *bad_f[i].f = keep;
    }
    t.frequency_penalty = -2.0f;
    t.presence_penalty = 2.0f;
    t.repetition_penalty = 1e-30f;
    t.min_tokens = r.max_tokens;
    CHECK(proto_check_request(&r, &lim) == 0, "bounds: %s", rd_errmsg());
    t.min_tokens = r.max_tokens + 1;
    CHECK(refused_with(&r, &lim, "min_tokens = 9"), "min_tokens: %s", rd_errmsg());
    t.min_tokens = 0;
    int32_t bids[3] = {7, 100, 0};
    float bvals[3] = {1, 2, 3};
    t.bias_ids = bids;
    t.bias_vals = bvals;
    CHECK(refused_with(&r, &lim, "bias_ids[1] = 100"), "id past the vocabulary: %s", rd_errmsg());
    bids[1] = -1;
    CHECK(refused_with(&r, &lim, "bias_ids[1] = -1"), "negative id: %s", rd_errmsg());
    bids[1] = 0;
    CHECK(refused_with(&r, &lim, "bias_ids[2] = 0 repeats bias_ids[1]"), "repeat: %s", rd_errmsg());
    bids[1] = 5;
    bvals[2] = 100.5f;
    CHECK(refused_with(&r, &lim, "bias_vals[2]"), "bias past 100: %s", rd_errmsg());
    bvals[2] = NAN;
    CHECK(refused_with(&r, &lim, "bias_vals[2]"), "NaN bias: %s", rd_errmsg());
    bvals[2] = -100.0f;
    CHECK(proto_check_request(&r, &lim) == 0, "valid bias: %s", rd_errmsg());
    /* PROTO_MAX_BIAS distinct pairs pass, one more is refused; both decode (the count is the check's) */
    int32_t *many = palloc(sizeof(int32_t) * (PROTO_MAX_BIAS + 1));
    float *many_v = palloc(sizeof(float) * (PROTO_MAX_BIAS + 1));
    for (uint32_t i = 0; i <= PROTO_MAX_BIAS; i++) {
        many[i] = (int32_t)(PROTO_MAX_BIAS - i);
        many_v[i] = (float)i / 16.0f - 32.0f;
    }
    lim.vocab_size = 2 * PROTO_MAX_BIAS;
    t.bias_ids = many;
    t.bias_vals = many_v;
    for (uint32_t n = PROTO_MAX_BIAS; n <= PROTO_MAX_BIAS + 1; n++) {
        t.n_bias = n;
        one.submit.requests = &r;
        proto_buf_reset(&b2);
        CHECK_OK(proto_encode(&b2, &one));
        CHECK_OK(proto_decode(b2.data, b2.len, 0, &d));
        CHECK(d.submit.requests[0].sampling->n_bias == n, "n_bias");
        int rc = proto_check_request(&d.submit.requests[0], &lim);
        CHECK(n == PROTO_MAX_BIAS ? rc == 0 : refused_with(&d.submit.requests[0], &lim, "1025 logit_bias entries"),
              "n_bias %u: %s", n, rc ? rd_errmsg() : "accepted");
        proto_msg_free(&d);
    }
    many[PROTO_MAX_BIAS - 1] = many[3];         /* a repeat far apart */
    t.n_bias = PROTO_MAX_BIAS;
    CHECK(refused_with(&r, &lim, "repeats bias_ids[3]"), "repeat among 1024: %s", rd_errmsg());

    /* the arena: a SUBMIT dense with tails stays within 3 x frame + 256 */
    enum { N = 20000 };
    proto_request *dense = palloc(N * sizeof *dense);
    static const int32_t one_id = 5;
    static const float one_val = 1;
    proto_sampling s0 = {.repetition_penalty = 1}, s1 = {.n_bias = 1, .bias_ids = &one_id, .bias_vals = &one_val};
    for (int i = 0; i < N; i++) {
        dense[i].flags = PROTO_REQ_PROMPT_IS_TEXT | PROTO_REQ_SAMPLING;
        dense[i].text.ptr = "x";
        dense[i].text.len = 1;
        dense[i].sampling = i % 2 ? &s1 : &s0;
    }
    proto_msg dm = {.type = PROTO_SUBMIT, .version = 4};
    dm.submit.n_requests = N;
    dm.submit.requests = dense;
    proto_buf_reset(&b2);
    CHECK_OK(proto_encode(&b2, &dm));
    CHECK(proto_decode(b2.data, b2.len, 0, &d) == 0, "dense SUBMIT with tails: %s", rd_errmsg());
    CHECK(d.arena_bytes <= 3 * b2.len + 256, "arena %zu for a %zu-byte frame", d.arena_bytes, b2.len);
    CHECK(d.submit.requests[N - 1].sampling->bias_ids[0] == 5, "fields");
    proto_msg_free(&d);
    pool_free();
    proto_buf_free(&b);
    proto_buf_free(&b2);
}

/* Version 5: a request's score tail, a result's scores. */
static void test_scoring(void)
{
    proto_buf b, b2;
    proto_buf_init(&b);
    proto_buf_init(&b2);
    static const int32_t prompt[] = {1, 2, 3, 4}, bid[] = {9};
    static const float bval[] = {-1.0f};
    proto_sampling tail = {.repetition_penalty = 1.5f, .n_bias = 1, .bias_ids = bid, .bias_vals = bval};
    proto_request rq[3] = {
        {.client_req_id = 1, .n = 1, .max_tokens = 0, .top_p = 1, .logprobs_topk = 2, .flags = PROTO_REQ_SCORE,
         .n_prompt = 4, .prompt = prompt},
        {.client_req_id = 2, .n = 2, .max_tokens = 8, .temperature = 1, .top_p = 1,
         .flags = PROTO_REQ_SCORE | PROTO_REQ_SAMPLING, .score_from = 3, .n_prompt = 4, .prompt = prompt,
         .sampling = &tail},
        {.client_req_id = 3, .n = 1, .max_tokens = 8, .top_p = 1, .n_prompt = 4, .prompt = prompt},
    };
    proto_msg m = {.type = PROTO_SUBMIT, .version = 5}, d;
    m.submit.n_requests = 3;
    m.submit.requests = rq;
    CHECK_OK(proto_encode(&b, &m));
    /* the bytes: request 0's score tail right after its prompt (48 fields + n_stop + n_prompt + 4 ids = 72),
       request 1's after its sampling tail (20 + one 8-byte pair) */
    const uint8_t *q0 = b.data + 16 + 12, *q1 = q0 + 72 + 4;
    CHECK(b.len == 16 + 12 + (72 + 4) + (72 + 28 + 4) + 72, "frame of %zu bytes", b.len);
    CHECK((int32_t)le32(q0 + 72) == 0 && le32(q0 + 44) == PROTO_REQ_SCORE && le32(q0 + 12) == 0, "request 0");
    CHECK(lef32(q1 + 72) == 1.5f && (int32_t)le32(q1 + 92) == 9 && lef32(q1 + 96) == -1.0f &&
          (int32_t)le32(q1 + 100) == 3, "request 1: the sampling tail, then score_from");
    CHECK_OK(proto_decode(b.data, b.len, 0, &d));
    CHECK(msg_eq(&d, &m), "round trip: %s", neq);
    CHECK(d.submit.requests[1].score_from == 3 && d.submit.requests[1].sampling->n_bias == 1 &&
          d.submit.requests[2].score_from == 0, "decoded tails");
    proto_buf_reset(&b2);
    CHECK_OK(proto_encode(&b2, &d));
    CHECK(b2.len == b.len && !memcmp(b2.data, b.data, b.len), "re-encode differs");
    proto_msg_free(&d);

    /* version rules: the tail is written and read only in version 5 */
    proto_request sq = {.client_req_id = 7, .n = 1, .max_tokens = 4, .top_p = 1, .flags = PROTO_REQ_SCORE,
                        .score_from = 2, .n_prompt = 4, .prompt = prompt};
    proto_msg one = {.type = PROTO_SUBMIT, .version = 5};
    one.submit.n_requests = 1;
    one.submit.requests = &sq;
    size_t len0 = b2.len;
    for (uint16_t v = 0; v < 5; v++) {
        one.version = v;
        CHECK(proto_encode(&b2, &one) == RD_EINVAL && b2.len == len0 && strstr(rd_errmsg(), "version 5"),
              "a score_from encoded in version %u", v);
    }
    sq.flags = 0;
    one.version = 5;
    CHECK(proto_encode(&b2, &one) == RD_EINVAL && b2.len == len0 && strstr(rd_errmsg(), "needs flag"),
          "a score_from without the flag encoded");
    /* the flag alone (score_from 0) in version 4: no tail, decoded as an undefined bit, refused by the check */
    sq.flags = PROTO_REQ_SCORE;
    sq.score_from = 0;
    one.version = 4;
    proto_buf_reset(&b2);
    CHECK_OK(proto_encode(&b2, &one));
    CHECK(b2.len == 16 + 12 + 72, "version-4 frame of %zu bytes", b2.len);
    CHECK_OK(proto_decode(b2.data, b2.len, 0, &d));
    proto_hello_ok lim = {.version = 4, .vocab_size = 100, .max_context = 64, .max_prompt_tokens = 64, .max_n = 4,
                          .max_tokens = 32, .max_stop_ids = 4, .max_logprobs_topk = 5,
                          .max_message_bytes = PROTO_DEFAULT_MAX_MESSAGE};
    CHECK(d.version == 4 && d.submit.requests[0].flags == PROTO_REQ_SCORE, "flag kept");
    CHECK(refused_with(&d.submit.requests[0], &lim, "undefined bits 0x80") && strstr(rd_errmsg(), "protocol version 4"),
          "version 4: %s", rd_errmsg());
    proto_msg_free(&d);
    /* the version-5 frame relabelled version 4: its score tail is left over */
    sq.score_from = 2;
    one.version = 5;
    proto_buf_reset(&b2);
    CHECK_OK(proto_encode(&b2, &one));
    CHECK(b2.len == 16 + 12 + 72 + 4, "one scored request");
    b2.data[4] = 4;
    CHECK(proto_decode(b2.data, b2.len, 0, &d) == RD_EFORMAT && d.wire_error == PROTO_E_MALFORMED,
          "a version-4 frame with a score tail decoded");
    b2.data[4] = 5;
    /* cut inside the score tail, a trailing byte */
    uint8_t *cut = malloc(b2.len + 1);
    for (size_t k = b2.len - 4; k < b2.len; k++) {
        memcpy(cut, b2.data, k);
        uint32_t body = (uint32_t)(k - 16);
        memcpy(cut + 8, &body, 4);              /* little-endian host assumed by this test only */
        CHECK(proto_decode(cut, k, 0, &d) == RD_EFORMAT && d.wire_error == PROTO_E_MALFORMED && !d.arena &&
              strstr(rd_errmsg(), "score_from"), "cut at %zu: %s", k, rd_errmsg());
    }
    memcpy(cut, b2.data, b2.len);
    cut[b2.len] = 0;
    uint32_t body = (uint32_t)(b2.len + 1 - 16);
    memcpy(cut + 8, &body, 4);
    CHECK(proto_decode(cut, b2.len + 1, 0, &d) == RD_EFORMAT && d.wire_error == PROTO_E_MALFORMED, "trailing byte");
    free(cut);

    /* the checks */
    lim.version = 5;
    sq.max_tokens = 4;
    CHECK(proto_check_request(&sq, &lim) == 0, "valid: %s", rd_errmsg());
    sq.score_from = 4;
    CHECK(proto_check_request(&sq, &lim) == 0, "score_from = n_prompt: %s", rd_errmsg());
    sq.score_from = 5;
    CHECK(refused_with(&sq, &lim, "score_from = 5; expected 0..4"), "past the prompt: %s", rd_errmsg());
    sq.score_from = -1;
    CHECK(refused_with(&sq, &lim, "score_from = -1"), "negative: %s", rd_errmsg());
    sq.score_from = 0;
    sq.max_tokens = 0;
    CHECK(proto_check_request(&sq, &lim) == 0, "score only: %s", rd_errmsg());
    sq.n = 2;
    CHECK(refused_with(&sq, &lim, "n = 2 with max_tokens = 0"), "n 2 scoring only: %s", rd_errmsg());
    sq.n = 1;
    sq.flags = 0;
    CHECK(refused_with(&sq, &lim, "max_tokens = 0; expected 1..32 (0 only for a request that scores its prompt"),
          "max_tokens 0 unscored: %s", rd_errmsg());
    sq.flags = PROTO_REQ_SCORE;
    sq.max_tokens = 33;
    CHECK(refused_with(&sq, &lim, "max_tokens = 33; expected 0..32"), "max_tokens past the limit: %s", rd_errmsg());
    sq.max_tokens = 0;
    int32_t *full = palloc(sizeof(int32_t) * 64);
    sq.prompt = full;
    sq.n_prompt = 64;
    CHECK(refused_with(&sq, &lim, "must leave one position"), "the whole context scored: %s", rd_errmsg());
    sq.n_prompt = 63;
    CHECK(proto_check_request(&sq, &lim) == 0, "63 of 64: %s", rd_errmsg());
    CHECK(proto_check_lengths(64, 0, &lim) == RD_EINVAL && proto_check_lengths(63, 0, &lim) == 0, "lengths");
    /* the scores count in the largest result */
    sq.logprobs_topk = 5;
    uint64_t need = PROTO_RESULTS_OVERHEAD + proto_result_max_bytes(0, 0, 5) + proto_scores_bytes(63, 5);
    CHECK(proto_scores_bytes(63, 5) == 12 + 63 * 44, "proto_scores_bytes");
    lim.max_message_bytes = need;
    CHECK(proto_check_request(&sq, &lim) == 0, "at max_message_bytes: %s", rd_errmsg());
    lim.max_message_bytes = need - 1;
    CHECK(refused_with(&sq, &lim, "its prompt's scores"), "one byte over: %s", rd_errmsg());
    lim.max_message_bytes = PROTO_DEFAULT_MAX_MESSAGE;
    /* a text prompt's score_from: the daemon's check once it is tokenized */
    proto_request tq = {.client_req_id = 8, .n = 1, .max_tokens = 0, .top_p = 1,
                        .flags = PROTO_REQ_SCORE | PROTO_REQ_PROMPT_IS_TEXT, .score_from = 10, .text = {"hi", 2}};
    lim.flags = PROTO_HELLO_OK_TEXT;
    CHECK(proto_check_request(&tq, &lim) == 0, "text: %s", rd_errmsg());
    CHECK(proto_check_score_from(&tq, 3) == RD_EINVAL && strstr(rd_errmsg(), "request 8: score_from = 10; expected 0..3"),
          "after tokenizing: %s", rd_errmsg());
    CHECK(proto_check_score_from(&tq, 10) == 0, "score_from = n_prompt after tokenizing");
    tq.flags = PROTO_REQ_PROMPT_IS_TEXT;
    CHECK(proto_check_score_from(&tq, 3) == 0, "not scored: nothing to check");

    /* a result's scores, after the serve tail */
    static const float plp[4] = {NAN, -1.5f, -0.25f, -3.0f}, tlp[8] = {-INFINITY, -INFINITY, -0.5f, -1.0f, -0.125f,
                                                                        -2.0f, -1.0f, -4.0f};
    static const int32_t tid[8] = {-1, -1, 7, 2, 3, 1, 4, 0};
    proto_scores sc = {.score_from = 0, .n_scored = 4, .logprobs = plp, .top_ids = tid, .top_logprobs = tlp};
    proto_result res = {.seq = 1, .client_req_id = 1, .finish = PROTO_FINISH_LENGTH,
                        .flags = PROTO_RESULT_SERVE | PROTO_RESULT_SCORES, .top_k = 2, .n_prompt = 4,
                        .serve_dtype = PROTO_SERVE_AS_PUSHED, .serve_dtype_first = PROTO_SERVE_AS_PUSHED, .scores = &sc};
    proto_msg rm = {.type = PROTO_RESULTS, .version = 5};
    rm.results.n_results = 1;
    rm.results.results = &res;
    proto_buf_reset(&b);
    CHECK_OK(proto_encode(&b, &rm));
    CHECK(proto_result_bytes(&res) == 88 + 4 + proto_scores_bytes(4, 2) && b.len == PROTO_RESULTS_OVERHEAD +
          proto_result_bytes(&res), "a score-only result of %zu bytes", b.len);
    const uint8_t *h = b.data + PROTO_RESULTS_OVERHEAD + 88 + 4;
    CHECK(le32(h) == 0 && le32(h + 4) == 0 && le32(h + 8) == 4 && isnan(lef32(h + 12)) && lef32(h + 16) == -1.5f,
          "scores head and log-probs");
    CHECK((int32_t)le32(h + 28) == -1 && (int32_t)le32(h + 36) == 7 && lef32(h + 60) == -INFINITY &&
          lef32(h + 68) == -0.5f && h + 92 == b.data + b.len, "alternatives: ids, then log-probs, ending the frame");
    CHECK_OK(proto_decode(b.data, b.len, 0, &d));
    CHECK(msg_eq(&d, &rm), "round trip: %s", neq);
    CHECK(((uintptr_t)d.results.results[0].scores->logprobs & 3) == 0, "aligned");
    proto_buf_reset(&b2);
    CHECK_OK(proto_encode(&b2, &d));
    CHECK(b2.len == b.len && !memcmp(b2.data, b.data, b.len), "re-encode differs");
    proto_msg_free(&d);
    /* version rules: SCORES is a version-5 bit both ways */
    rm.version = 4;
    len0 = b2.len;
    CHECK(proto_encode(&b2, &rm) == RD_EINVAL && b2.len == len0 && strstr(rd_errmsg(), "undefined in protocol version 4"),
          "scores encoded in version 4: %s", rd_errmsg());
    rm.version = 5;
    memcpy(b2.data, b.data, b.len);
    b2.data[4] = 4;
    CHECK(proto_decode(b2.data, b.len, 0, &d) == RD_EFORMAT && d.wire_error == PROTO_E_MALFORMED &&
          strstr(rd_errmsg(), "flags"), "a version-4 frame with scores: %s", rd_errmsg());
    /* the encoder refuses scores without the flag, the flag without scores, positions not the prompt's */
    res.flags = PROTO_RESULT_SERVE;
    CHECK(proto_encode(&b2, &rm) == RD_EINVAL && b2.len == len0, "scores without the flag");
    res.flags |= PROTO_RESULT_SCORES;
    res.scores = NULL;
    CHECK(proto_encode(&b2, &rm) == RD_EINVAL && strstr(rd_errmsg(), "scores is NULL"), "the flag alone");
    res.scores = &sc;
    sc.score_from = 1;
    CHECK(proto_encode(&b2, &rm) == RD_EINVAL && strstr(rd_errmsg(), "n_scored 0 or n_prompt - score_from"),
          "4 positions from 1 of 4: %s", rd_errmsg());
    sc.score_from = 5;
    sc.n_scored = 0;
    CHECK(proto_encode(&b2, &rm) == RD_EINVAL && b2.len == len0, "score_from past the prompt");
    sc.score_from = 1;
    CHECK_OK(proto_encode(&b2, &rm));   /* none held (a sample that failed before it ran) */
    CHECK(b2.len - len0 == PROTO_RESULTS_OVERHEAD + 88 + 4 + 12, "n_scored 0");
    CHECK_OK(proto_decode(b2.data + len0, b2.len - len0, 0, &d));
    CHECK(d.results.results[0].scores && d.results.results[0].scores->n_scored == 0 &&
          d.results.results[0].scores->score_from == 1 && !d.results.results[0].scores->logprobs, "none held");
    proto_msg_free(&d);
    sc.score_from = 0;
    sc.n_scored = 4;
    /* malformed scores: a count that is not the prompt's or past the bytes, flags, every cut, a trailing byte */
    cut = malloc(b.len + 1);
    size_t at = PROTO_RESULTS_OVERHEAD + 88 + 4;
    struct { size_t off; uint32_t v; const char *why; } bad[] = {
        {at, 1, "n_scored 0 or n_prompt - score_from"}, {at, 5, "score_from <= n_prompt"},
        {at + 4, 1, "scores flags"}, {at + 8, 3, "n_scored 0 or n_prompt - score_from"},
        {at + 8, 0xFFFFFFFFu, "n_scored"}, {at + 8, 5, "n_scored"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        memcpy(cut, b.data, b.len);
        memcpy(cut + bad[i].off, &bad[i].v, 4);
        CHECK(proto_decode(cut, b.len, 0, &d) == RD_EFORMAT && d.wire_error == PROTO_E_MALFORMED && !d.arena &&
              strstr(rd_errmsg(), bad[i].why), "patch %zu: %s", i, rd_errmsg());
    }
    for (size_t k = at; k < b.len; k++) {
        memcpy(cut, b.data, k);
        body = (uint32_t)(k - 16);
        memcpy(cut + 8, &body, 4);
        CHECK(proto_decode(cut, k, 0, &d) == RD_EFORMAT && d.wire_error == PROTO_E_MALFORMED && !d.arena,
              "cut at %zu decoded", k);
    }
    memcpy(cut, b.data, b.len);
    cut[b.len] = 0;
    body = (uint32_t)(b.len + 1 - 16);
    memcpy(cut + 8, &body, 4);
    CHECK(proto_decode(cut, b.len + 1, 0, &d) == RD_EFORMAT && d.wire_error == PROTO_E_MALFORMED, "trailing byte");
    free(cut);

    /* the arena: RESULTS dense with scored results (no tokens, none or one position scored, no serve tail: 100 and
       104 wire bytes each, 224 and 232 arena bytes) decode within 3 x frame + 256 */
    enum { N = 20000 };
    proto_result *dense = palloc(N * sizeof *dense);
    static const float one_lp = -2.0f;
    proto_scores none = {.score_from = 1}, first = {.score_from = 0, .n_scored = 1, .logprobs = &one_lp};
    for (int i = 0; i < N; i++) {
        dense[i].finish = PROTO_FINISH_LENGTH;
        dense[i].flags = PROTO_RESULT_SCORES;
        dense[i].n_prompt = 1;
        dense[i].scores = i % 2 ? &first : &none;
    }
    proto_msg dm = {.type = PROTO_RESULTS, .version = 5};
    dm.results.n_results = N;
    dm.results.results = dense;
    proto_buf_reset(&b2);
    CHECK_OK(proto_encode(&b2, &dm));
    CHECK(b2.len == PROTO_RESULTS_OVERHEAD + (size_t)N / 2 * (100 + 104), "dense frame of %zu bytes", b2.len);
    CHECK(proto_decode(b2.data, b2.len, 0, &d) == 0, "dense RESULTS with scores: %s", rd_errmsg());
    CHECK(d.arena_bytes <= 3 * b2.len + 256, "arena %zu for a %zu-byte frame", d.arena_bytes, b2.len);
    CHECK(d.results.results[N - 1].scores->logprobs[0] == -2.0f && d.results.results[0].scores->score_from == 1,
          "fields");
    proto_msg_free(&d);
    pool_free();
    proto_buf_free(&b);
    proto_buf_free(&b2);
}

static uint16_t le16(const uint8_t *p) { return (uint16_t)(p[0] | p[1] << 8); }
static uint64_t le64(const uint8_t *p) { return (uint64_t)le32(p) | (uint64_t)le32(p + 4) << 32; }

/* Replaces a frame's body length (little-endian host assumed by these tests only). */
static void set_body_len(uint8_t *frame, size_t frame_len)
{
    uint32_t body = (uint32_t)(frame_len - 16);
    memcpy(frame + 8, &body, 4);
}

/* Version 6: a request's lora tail, a result's. */
static void test_lora(void)
{
    proto_buf b, b2;
    proto_buf_init(&b);
    proto_buf_init(&b2);
    static const int32_t prompt[] = {1, 2, 3, 4};
    proto_sampling tail = {.repetition_penalty = 1.5f};
    proto_request rq[3] = {
        {.client_req_id = 1, .n = 1, .max_tokens = 8, .top_p = 1, .flags = PROTO_REQ_LORA, .n_prompt = 4,
         .prompt = prompt, .lora = {"math-v1", 7}},
        {.client_req_id = 2, .n = 2, .max_tokens = 8, .temperature = 1, .top_p = 1,
         .flags = PROTO_REQ_LORA | PROTO_REQ_SAMPLING | PROTO_REQ_SCORE, .score_from = 3, .n_prompt = 4,
         .prompt = prompt, .sampling = &tail, .lora = {"\xc3\xa9", 2}},
        {.client_req_id = 3, .n = 1, .max_tokens = 8, .top_p = 1, .n_prompt = 4, .prompt = prompt},
    };
    proto_msg m = {.type = PROTO_SUBMIT, .version = 6}, d;
    m.submit.n_requests = 3;
    m.submit.requests = rq;
    CHECK_OK(proto_encode(&b, &m));
    /* the bytes: request 0's lora tail right after its prompt (72 bytes), request 1's after its sampling tail
       (20 bytes, no pairs) and its score tail (4) */
    const uint8_t *q0 = b.data + 16 + 12, *q1 = q0 + 72 + 2 + 7;
    CHECK(b.len == 16 + 12 + (72 + 9) + (72 + 20 + 4 + 2 + 2) + 72, "frame of %zu bytes", b.len);
    CHECK(le32(q0 + 44) == PROTO_REQ_LORA && le16(q0 + 72) == 7 && !memcmp(q0 + 74, "math-v1", 7), "request 0");
    CHECK(lef32(q1 + 72) == 1.5f && (int32_t)le32(q1 + 92) == 3 && le16(q1 + 96) == 2 &&
          !memcmp(q1 + 98, "\xc3\xa9", 2), "request 1: the sampling tail, score_from, then the lora tail");
    CHECK_OK(proto_decode(b.data, b.len, 0, &d));
    CHECK(msg_eq(&d, &m), "round trip: %s", neq);
    const proto_request *dr = d.submit.requests;
    CHECK(!strcmp(dr[0].lora.ptr, "math-v1") && dr[1].score_from == 3 && dr[1].lora.len == 2 &&
          dr[2].lora.len == 0 && dr[2].lora.ptr && !dr[2].lora.ptr[0], "decoded names are C strings, \"\" without");
    proto_buf_reset(&b2);
    CHECK_OK(proto_encode(&b2, &d));
    CHECK(b2.len == b.len && !memcmp(b2.data, b.data, b.len), "re-encode differs");
    proto_msg_free(&d);

    /* version rules: the tail is written and read only in version 6, exactly with the flag */
    char name128[129];
    memset(name128, 'x', 128);
    name128[128] = 0;
    proto_request lq = {.client_req_id = 7, .n = 1, .max_tokens = 4, .top_p = 1, .flags = PROTO_REQ_LORA,
                        .n_prompt = 4, .prompt = prompt, .lora = {"math-v1", 7}};
    proto_msg one = {.type = PROTO_SUBMIT, .version = 6};
    one.submit.n_requests = 1;
    one.submit.requests = &lq;
    size_t len0 = b2.len;
    for (uint16_t v = 0; v < 6; v++) {
        one.version = v;
        CHECK(proto_encode(&b2, &one) == RD_EINVAL && b2.len == len0 && strstr(rd_errmsg(), "version 6"),
              "an adapter name encoded in version %u", v);
    }
    one.version = 6;
    lq.flags = 0;
    CHECK(proto_encode(&b2, &one) == RD_EINVAL && b2.len == len0 && strstr(rd_errmsg(), "needs flag PROTO_REQ_LORA"),
          "a name without the flag: %s", rd_errmsg());
    lq.flags = PROTO_REQ_LORA;
    struct { proto_str name; const char *why; } badname[] = {
        {{NULL, 0}, "0 bytes long; expected 1..127"}, {{name128, 128}, "128 bytes long; expected 1..127"},
        {{"a\xc0\x80", 3}, "not valid UTF-8"}, {{NULL, 3}, "no bytes"},
    };
    for (size_t i = 0; i < sizeof badname / sizeof badname[0]; i++) {
        lq.lora = badname[i].name;
        CHECK(proto_encode(&b2, &one) == RD_EINVAL && b2.len == len0 && strstr(rd_errmsg(), badname[i].why),
              "bad name %zu encoded: %s", i, rd_errmsg());
    }
    lq.lora = (proto_str){name128, 127};
    CHECK_OK(proto_encode(&b2, &one));
    CHECK(b2.len - len0 == 16 + 12 + 72 + 2 + 127, "the longest name");
    /* the flag alone in version 5: no tail, decoded as an undefined bit, refused by the check */
    lq.lora = (proto_str){NULL, 0};
    one.version = 5;
    proto_buf_reset(&b2);
    CHECK_OK(proto_encode(&b2, &one));
    CHECK(b2.len == 16 + 12 + 72, "version-5 frame of %zu bytes", b2.len);
    CHECK_OK(proto_decode(b2.data, b2.len, 0, &d));
    proto_hello_ok lim = {.version = 5, .vocab_size = 100, .max_context = 64, .max_prompt_tokens = 64, .max_n = 4,
                          .max_tokens = 32, .max_stop_ids = 4, .max_logprobs_topk = 5,
                          .max_message_bytes = PROTO_DEFAULT_MAX_MESSAGE};
    CHECK(d.version == 5 && d.submit.requests[0].flags == PROTO_REQ_LORA && d.submit.requests[0].lora.len == 0,
          "flag kept, no name read");
    CHECK(refused_with(&d.submit.requests[0], &lim, "undefined bits 0x100") &&
          strstr(rd_errmsg(), "protocol version 5"), "version 5: %s", rd_errmsg());
    proto_msg_free(&d);
    /* the version-6 frame relabelled version 5: its lora tail is left over */
    lq.lora = (proto_str){"math-v1", 7};
    one.version = 6;
    proto_buf_reset(&b2);
    CHECK_OK(proto_encode(&b2, &one));
    CHECK(b2.len == 16 + 12 + 72 + 9, "one request under an adapter");
    b2.data[4] = 5;
    CHECK(proto_decode(b2.data, b2.len, 0, &d) == RD_EFORMAT && d.wire_error == PROTO_E_MALFORMED,
          "a version-5 frame with a lora tail decoded");
    b2.data[4] = 6;
    /* malformed tails: every cut inside it, a trailing byte, a name of 0 or 128 bytes, past the frame, not UTF-8 */
    uint8_t *cut = malloc(b2.len + 200);
    for (size_t k = b2.len - 9; k < b2.len; k++) {
        memcpy(cut, b2.data, k);
        set_body_len(cut, k);
        CHECK(proto_decode(cut, k, 0, &d) == RD_EFORMAT && d.wire_error == PROTO_E_MALFORMED && !d.arena &&
              strstr(rd_errmsg(), "lora_name"), "cut at %zu: %s", k, rd_errmsg());
    }
    memcpy(cut, b2.data, b2.len);
    cut[b2.len] = 0;
    set_body_len(cut, b2.len + 1);
    CHECK(proto_decode(cut, b2.len + 1, 0, &d) == RD_EFORMAT && d.wire_error == PROTO_E_MALFORMED, "trailing byte");
    size_t at = b2.len - 9;     /* the tail's u16 length */
    struct { uint16_t len; uint8_t first; const char *why; } bad[] = {
        {0, 'm', "lora_name is 0 bytes long; expected 1..127"}, {128, 'm', "lora_name is 128 bytes long"},
        {8, 'm', "truncated at lora_name"}, {7, 0xff, "lora_name is not valid UTF-8"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        memcpy(cut, b2.data, b2.len);
        cut[at] = (uint8_t)bad[i].len;
        cut[at + 1] = (uint8_t)(bad[i].len >> 8);
        cut[at + 2] = bad[i].first;
        CHECK(proto_decode(cut, b2.len, 0, &d) == RD_EFORMAT && d.wire_error == PROTO_E_MALFORMED && !d.arena &&
              strstr(rd_errmsg(), bad[i].why), "patch %zu: %s", i, rd_errmsg());
    }
    /* a 128-byte name with its bytes there is refused too, before they are read */
    memcpy(cut, b2.data, at);
    cut[at] = 128;
    cut[at + 1] = 0;
    memset(cut + at + 2, 'x', 128);
    set_body_len(cut, at + 2 + 128);
    CHECK(proto_decode(cut, at + 2 + 128, 0, &d) == RD_EFORMAT && strstr(rd_errmsg(), "expected 1..127"),
          "128 bytes: %s", rd_errmsg());
    free(cut);

    /* the checks */
    lim.version = 6;
    CHECK(proto_check_request(&lq, &lim) == 0, "valid: %s", rd_errmsg());
    lim.version = 5;
    CHECK(refused_with(&lq, &lim, "undefined bits 0x100"), "the flag in version 5: %s", rd_errmsg());
    lim.version = 6;
    lq.lora = (proto_str){"a\0b", 3};
    CHECK(refused_with(&lq, &lim, "request 7: the adapter name has a NUL byte at 1"), "NUL: %s", rd_errmsg());
    lq.lora = (proto_str){NULL, 0};
    CHECK(refused_with(&lq, &lim, "flag LORA with an adapter name of 0 bytes; expected 1..127"), "no name: %s",
          rd_errmsg());
    lq.lora = (proto_str){name128, 128};
    CHECK(refused_with(&lq, &lim, "of 128 bytes; expected 1..127"), "128 bytes: %s", rd_errmsg());
    lq.lora = (proto_str){"math-v1", 7};
    /* the name counts in the largest result */
    CHECK(proto_lora_bytes(7) == 17, "proto_lora_bytes");
    uint64_t need = PROTO_RESULTS_OVERHEAD + proto_result_max_bytes(4, 0, 0) + proto_lora_bytes(7);
    lim.max_message_bytes = need;
    CHECK(proto_check_request(&lq, &lim) == 0, "at max_message_bytes: %s", rd_errmsg());
    lim.max_message_bytes = need - 1;
    CHECK(refused_with(&lq, &lim, "and its adapter's name"), "one byte over: %s", rd_errmsg());
    lq.flags = 0;
    lq.lora = (proto_str){NULL, 0};
    CHECK(proto_check_request(&lq, &lim) == 0, "the same request on the base model fits: %s", rd_errmsg());
    lim.max_message_bytes = PROTO_DEFAULT_MAX_MESSAGE;

    /* a result's lora tail, after its scores */
    proto_scores sc = {.score_from = 2};
    proto_result res = {.seq = 1, .client_req_id = 1, .finish = PROTO_FINISH_LENGTH,
                        .flags = PROTO_RESULT_SERVE | PROTO_RESULT_SCORES | PROTO_RESULT_LORA, .n_prompt = 2,
                        .serve_dtype = PROTO_SERVE_AS_PUSHED, .serve_dtype_first = PROTO_SERVE_AS_PUSHED, .scores = &sc,
                        .lora = {"math-v1", 7}, .lora_version = 0x0102030405060708ull};
    proto_msg rm = {.type = PROTO_RESULTS, .version = 6};
    rm.results.n_results = 1;
    rm.results.results = &res;
    proto_buf_reset(&b);
    CHECK_OK(proto_encode(&b, &rm));
    CHECK(proto_result_bytes(&res) == 88 + 4 + 12 + 17 && b.len == PROTO_RESULTS_OVERHEAD + proto_result_bytes(&res),
          "a result of %zu bytes", b.len);
    const uint8_t *h = b.data + PROTO_RESULTS_OVERHEAD + 88 + 4 + 12;
    CHECK(b.data[PROTO_RESULTS_OVERHEAD + 21] == 0x1c && le16(h) == 7 && !memcmp(h + 2, "math-v1", 7) &&
          le64(h + 9) == 0x0102030405060708ull && h + 17 == b.data + b.len, "the tail: length, name, version");
    CHECK_OK(proto_decode(b.data, b.len, 0, &d));
    CHECK(msg_eq(&d, &rm), "round trip: %s", neq);
    CHECK(!strcmp(d.results.results[0].lora.ptr, "math-v1"), "NUL-terminated");
    proto_buf_reset(&b2);
    CHECK_OK(proto_encode(&b2, &d));
    CHECK(b2.len == b.len && !memcmp(b2.data, b.data, b.len), "re-encode differs");
    proto_msg_free(&d);
    /* a result without the flag decodes with "" and 0 */
    proto_result plain = {.seq = 2, .client_req_id = 3, .finish = PROTO_FINISH_LENGTH};
    rm.results.results = &plain;
    proto_buf_reset(&b2);
    CHECK_OK(proto_encode(&b2, &rm));
    CHECK_OK(proto_decode(b2.data, b2.len, 0, &d));
    CHECK(d.results.results[0].lora.ptr && d.results.results[0].lora.len == 0 &&
          d.results.results[0].lora_version == 0, "no tail");
    proto_msg_free(&d);
    rm.results.results = &res;
    /* version rules: LORA is a version-6 bit both ways */
    rm.version = 5;
    len0 = b2.len;
    CHECK(proto_encode(&b2, &rm) == RD_EINVAL && b2.len == len0 &&
          strstr(rd_errmsg(), "undefined in protocol version 5"), "a lora tail encoded in version 5: %s", rd_errmsg());
    rm.version = 6;
    memcpy(b2.data, b.data, b.len);
    b2.data[4] = 5;
    CHECK(proto_decode(b2.data, b.len, 0, &d) == RD_EFORMAT && d.wire_error == PROTO_E_MALFORMED &&
          strstr(rd_errmsg(), "flags"), "a version-5 frame with a lora tail: %s", rd_errmsg());
    /* the encoder refuses a name or a version without the flag, the flag without a name, a name too long */
    res.flags = PROTO_RESULT_SERVE | PROTO_RESULT_SCORES;
    CHECK(proto_encode(&b2, &rm) == RD_EINVAL && strstr(rd_errmsg(), "without flag PROTO_RESULT_LORA"), "name alone");
    res.lora = (proto_str){NULL, 0};
    CHECK(proto_encode(&b2, &rm) == RD_EINVAL && strstr(rd_errmsg(), "without flag PROTO_RESULT_LORA"),
          "version alone");
    res.lora_version = 0;
    CHECK_OK(proto_encode(&b2, &rm));   /* neither: no tail */
    res.flags |= PROTO_RESULT_LORA;
    len0 = b2.len;
    CHECK(proto_encode(&b2, &rm) == RD_EINVAL && b2.len == len0 && strstr(rd_errmsg(), "0 bytes long"),
          "the flag alone: %s", rd_errmsg());
    res.lora = (proto_str){name128, 128};
    CHECK(proto_encode(&b2, &rm) == RD_EINVAL && strstr(rd_errmsg(), "128 bytes long"), "128 bytes: %s", rd_errmsg());
    res.lora = (proto_str){"math-v1", 7};
    res.lora_version = 0x0102030405060708ull;
    /* malformed: a name of 0 or 128 bytes or one past the bytes, not UTF-8; every cut; a trailing byte */
    cut = malloc(b.len + 1);
    at = (size_t)(h - b.data);
    struct { uint16_t len; uint8_t first; const char *why; } rbad[] = {
        {0, 'm', "lora_name is 0 bytes long"}, {128, 'm', "lora_name is 128 bytes long"},
        {16, 'm', "truncated at lora_name"}, {7, 0xff, "not valid UTF-8"},
    };
    for (size_t i = 0; i < sizeof rbad / sizeof rbad[0]; i++) {
        memcpy(cut, b.data, b.len);
        cut[at] = (uint8_t)rbad[i].len;
        cut[at + 1] = (uint8_t)(rbad[i].len >> 8);
        cut[at + 2] = rbad[i].first;
        CHECK(proto_decode(cut, b.len, 0, &d) == RD_EFORMAT && d.wire_error == PROTO_E_MALFORMED && !d.arena &&
              strstr(rd_errmsg(), rbad[i].why), "patch %zu: %s", i, rd_errmsg());
    }
    for (size_t k = at; k < b.len; k++) {
        memcpy(cut, b.data, k);
        set_body_len(cut, k);
        CHECK(proto_decode(cut, k, 0, &d) == RD_EFORMAT && d.wire_error == PROTO_E_MALFORMED && !d.arena &&
              (strstr(rd_errmsg(), "lora_name") || strstr(rd_errmsg(), "lora_version")), "cut at %zu: %s", k,
              rd_errmsg());
    }
    memcpy(cut, b.data, b.len);
    cut[b.len] = 0;
    set_body_len(cut, b.len + 1);
    CHECK(proto_decode(cut, b.len + 1, 0, &d) == RD_EFORMAT && d.wire_error == PROTO_E_MALFORMED, "trailing byte");
    free(cut);

    /* the arena: a SUBMIT dense with 1-byte text prompts under 1-byte adapter names (60 wire bytes, 120 + 8 + 8
       arena bytes each: more than 2 x frame, the bound before version 6) decodes within 3 x frame + 256 */
    enum { N = 20000 };
    proto_request *dense = palloc(N * sizeof *dense);
    for (int i = 0; i < N; i++) {
        dense[i].flags = PROTO_REQ_PROMPT_IS_TEXT | PROTO_REQ_LORA;
        dense[i].text = (proto_str){"x", 1};
        dense[i].lora = (proto_str){"a", 1};
    }
    proto_msg dm = {.type = PROTO_SUBMIT, .version = 6};
    dm.submit.n_requests = N;
    dm.submit.requests = dense;
    proto_buf_reset(&b2);
    CHECK_OK(proto_encode(&b2, &dm));
    CHECK(b2.len == 16 + 12 + (size_t)N * 60, "dense frame of %zu bytes", b2.len);
    CHECK(proto_decode(b2.data, b2.len, 0, &d) == 0, "dense SUBMIT with adapter names: %s", rd_errmsg());
    CHECK(d.arena_bytes <= 3 * b2.len + 256 && d.arena_bytes <= PROTO_ARENA_BOUND(b2.len), "arena %zu for %zu bytes",
          d.arena_bytes, b2.len);
    CHECK(!strcmp(d.submit.requests[N - 1].lora.ptr, "a") && !strcmp(d.submit.requests[N - 1].text.ptr, "x"),
          "fields");
    proto_msg_free(&d);
    /* ... and RESULTS dense with tokenless results under 1-byte adapter names (99 wire bytes, 200 arena) */
    proto_result *rdense = palloc(N * sizeof *rdense);
    for (int i = 0; i < N; i++) {
        rdense[i].finish = PROTO_FINISH_LENGTH;
        rdense[i].flags = PROTO_RESULT_LORA;
        rdense[i].lora = (proto_str){"a", 1};
        rdense[i].lora_version = (uint64_t)i;
    }
    proto_msg rdm = {.type = PROTO_RESULTS, .version = 6};
    rdm.results.n_results = N;
    rdm.results.results = rdense;
    proto_buf_reset(&b2);
    CHECK_OK(proto_encode(&b2, &rdm));
    CHECK(b2.len == PROTO_RESULTS_OVERHEAD + (size_t)N * 99, "dense frame of %zu bytes", b2.len);
    CHECK(proto_decode(b2.data, b2.len, 0, &d) == 0, "dense RESULTS with adapter names: %s", rd_errmsg());
    CHECK(d.arena_bytes <= 3 * b2.len + 256, "arena %zu for a %zu-byte frame", d.arena_bytes, b2.len);
    CHECK(d.results.results[N - 1].lora_version == N - 1 && !strcmp(d.results.results[N - 1].lora.ptr, "a"),
          "fields");
    proto_msg_free(&d);
    pool_free();
    proto_buf_free(&b);
    proto_buf_free(&b2);
}

static void test_names(void)
{
    CHECK(!strcmp(proto_type_name(PROTO_RESULTS), "RESULTS"), "type name");
    CHECK(proto_type_name(0x42) == NULL, "undefined type has a name");
    CHECK(!strcmp(proto_err_name(PROTO_E_BUSY), "BUSY") && !strcmp(proto_err_name(999), "UNKNOWN"), "err names");
    CHECK(proto_is_request(PROTO_HELLO) && proto_is_request(PROTO_BYE) && !proto_is_request(PROTO_HELLO_OK) &&
          proto_is_request(PROTO_UPDATE_BEGIN) && proto_is_request(PROTO_UPDATE_CHUNK) &&
          proto_is_request(PROTO_UPDATE_COMMIT) && proto_is_request(PROTO_UPDATE_ABORT) &&
          !proto_is_request(PROTO_UPDATE_BEGIN_OK) && !proto_is_request(PROTO_UPDATE_ABORT_OK), "is_request");
    CHECK(proto_is_request(PROTO_AUTH_BEGIN) && proto_is_request(PROTO_AUTH) && !proto_is_request(PROTO_AUTH_OK) &&
          !proto_is_request(PROTO_AUTH_CHALLENGE) && !proto_is_request(0x09) && !proto_is_request(0x19) &&
          !proto_is_request(PROTO_ERROR), "is_request (auth)");
    static const char *update_names[] = {"UPDATE_BEGIN", "UPDATE_CHUNK", "UPDATE_COMMIT", "UPDATE_ABORT"};
    for (int i = 0; i < 4; i++) {
        char ok[32];
        snprintf(ok, sizeof ok, "%s_OK", update_names[i]);
        CHECK(!strcmp(proto_type_name((uint16_t)(PROTO_UPDATE_BEGIN + i)), update_names[i]) &&
              !strcmp(proto_type_name((uint16_t)(PROTO_UPDATE_BEGIN_OK + i)), ok), "update type names");
    }
    CHECK(proto_type_name(0x19) == NULL && proto_type_name(0x96) == NULL, "0x19/0x96 have names");
    CHECK(proto_is_request(PROTO_UPDATE_FORWARD) && proto_is_request(PROTO_UPDATE_PREPARE) &&
          proto_is_request(PROTO_LANE_AUTH) && !proto_is_request(PROTO_UPDATE_PREPARE_OK) &&
          !strcmp(proto_type_name(PROTO_UPDATE_PREPARE_OK), "UPDATE_PREPARE_OK"), "chain types");
    CHECK(!strcmp(proto_err_name(13), "CHECKSUM") && !strcmp(proto_err_name(14), "STALE_VERSION") &&
          !strcmp(proto_err_name(15), "UPDATE_CONFLICT") && !strcmp(proto_err_name(16), "UNAUTHORIZED") &&
              !strcmp(proto_err_name(17), "FORBIDDEN") && !strcmp(proto_err_name(18), "BASE_MISMATCH") &&
          !strcmp(proto_err_name(19), "DTYPE_MISMATCH") && !strcmp(proto_err_name(20), "BASE_QUANTIZED") &&
          !strcmp(proto_err_name(21), "UNKNOWN"), "update errors");
    CHECK(proto_dtype_size(PROTO_DTYPE_F32) == 4 && proto_dtype_size(PROTO_DTYPE_F16) == 2 &&
          proto_dtype_size(PROTO_DTYPE_BF16) == 2 && proto_dtype_size(3) == 0, "dtype sizes");
    CHECK(proto_err_from_rd(RD_EBUSY) == PROTO_E_BUSY && proto_err_from_rd(RD_EINVAL) == PROTO_E_INVALID_PARAMS &&
          proto_err_from_rd(RD_ENOENT) == PROTO_E_UNKNOWN_REQUEST && proto_err_from_rd(RD_EIO) == PROTO_E_INTERNAL,
          "err_from_rd");
    CHECK(proto_result_max_bytes(10, 1, 2) == 88 + 10 * (8 + 4 + 16 + 16), "result_max_bytes");
    /* a failed decode reports the header's type for the ERROR reply */
    uint8_t frame[17] = {'R', 'L', 'D', 'P', 1, 0, PROTO_STATUS, 0, 1, 0, 0, 0, 0, 0, 0, 0, 9};
    proto_msg m;
    CHECK(proto_decode(frame, sizeof frame, 0, &m) == RD_EFORMAT && m.type == PROTO_STATUS &&
          m.wire_error == PROTO_E_MALFORMED, "type %u error %u", m.type, m.wire_error);
}

int main(void)
{
    RUN(test_golden_valid);
    RUN(test_golden_invalid);
    RUN(test_golden_check_request);
    RUN(test_truncation);
    RUN(test_mutations);
    RUN(test_random_roundtrip);
    RUN(test_dense_frames);
    RUN(test_encode_refuses);
    RUN(test_encode_error);
    RUN(test_update_chunk_data);
    RUN(test_routes);
    RUN(test_sampling);
    RUN(test_scoring);
    RUN(test_lora);
    RUN(test_names);
    pool_free();
    cJSON_Delete(vectors);
    TEST_EXIT();
}
