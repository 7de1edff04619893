/* rollout-protodump - decodes protocol frames and prints their fields as JSON,
 * for debugging and for checking the C decoder against the Python one.
 *
 *   rollout-protodump [--max-len BYTES] FILE...
 *   rollout-protodump --crc32c FILE...
 *
 * Each FILE holds one frame. For each, one line: the message in the JSON form
 * of tools/python/rolloutd/proto.py to_json (u64 fields as decimal strings,
 * f32 values as numbers or "nan"/"inf"/"-inf", top-k arrays flat, a result's
 * routes (version 2) as {"layers", "k", "width", "ids"} with the ids flat, its serve_dtype and
 * serve_dtype_first (version 3) as numbers, a request's sampling tail (version 4) as "sampling":
 * {"repetition_penalty", "frequency_penalty", "presence_penalty", "min_tokens", "bias_ids",
 * "bias_vals"}, its score tail (version 5) as "score_from", a result's scores (version 5) as "scores":
 * {"score_from", "logprobs", "top_ids", "top_logprobs"} with the alternatives flat, a request's lora
 * tail (version 6) as "lora" (the adapter's name), a result's (version 6) as "lora" and
 * "lora_version" (a u64 string), chunk data
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
#include "proto/proto_int.h"
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

/* The element tails: what the table's field kinds cannot say (proto.c has the same three). */
/* version: the frame's (a request's score tail is in the frame with flag SCORE from version 5 on, its lora
 * tail with flag LORA from version 6 on). */
static void request_tail_json(cJSON *o, const proto_request *r, uint16_t version)
{
    add_i32s(o, "stop_ids", r->stop_ids, r->n_stop);
    add_i32s(o, "prompt_ids", r->prompt, r->n_prompt);
    add_str(o, "prompt_text", r->text);
    const proto_sampling *s = r->sampling;
    if (s) {
        /* version 4, flag SAMPLING: {"repetition_penalty", ..., "bias_ids", "bias_vals"} */
        cJSON *so = cJSON_AddObjectToObject(o, "sampling");
        add_f32(so, "repetition_penalty", s->repetition_penalty);
        add_f32(so, "frequency_penalty", s->frequency_penalty);
        add_f32(so, "presence_penalty", s->presence_penalty);
        add_num(so, "min_tokens", s->min_tokens);
        add_i32s(so, "bias_ids", s->bias_ids, s->n_bias);
        add_f32s(so, "bias_vals", s->bias_vals, s->n_bias);
    }
    if ((r->flags & PROTO_REQ_SCORE) && version >= 5)
        add_num(o, "score_from", r->score_from);
    if ((r->flags & PROTO_REQ_LORA) && version >= 6)
        add_str(o, "lora", r->lora);
}

static void result_tail_json(cJSON *o, const proto_result *r)
{
    uint64_t nk = (uint64_t)r->n_tokens * r->top_k;
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
    if (r->flags & PROTO_RESULT_SERVE) { /* version 3 */
        add_num(o, "serve_dtype", r->serve_dtype);
        add_num(o, "serve_dtype_first", r->serve_dtype_first);
    }
    if (r->scores) { /* version 5: {"score_from", "logprobs", "top_ids", "top_logprobs": flat [n_scored x top_k]} */
        const proto_scores *s = r->scores;
        uint64_t snk = (uint64_t)s->n_scored * r->top_k;
        cJSON *so = cJSON_AddObjectToObject(o, "scores");
        add_num(so, "score_from", s->score_from);
        add_f32s(so, "logprobs", s->logprobs, s->n_scored);
        add_i32s(so, "top_ids", s->top_ids, snk);
        add_f32s(so, "top_logprobs", s->top_logprobs, snk);
    }
    if (r->flags & PROTO_RESULT_LORA) { /* version 6 */
        add_str(o, "lora", r->lora);
        add_u64(o, "lora_version", r->lora_version);
    }
    if (!(r->flags & PROTO_RESULT_ROUTES))
        return;
    /* version 2: {"layers", "k", "width", "ids": flat [n_routes x layers x k]} */
    cJSON *ro = cJSON_AddObjectToObject(o, "routes");
    add_num(ro, "layers", r->route_layers);
    add_num(ro, "k", r->route_k);
    add_num(ro, "width", r->route_width);
    cJSON *ids = cJSON_AddArrayToObject(ro, "ids");
    uint64_t n = (uint64_t)r->n_routes * r->route_layers * r->route_k;
    for (uint64_t i = 0; i < n; i++) {
        double v = r->route_width == 1   ? ((const uint8_t *)r->routes)[i]
                   : r->route_width == 2 ? ((const uint16_t *)r->routes)[i]
                                         : ((const int32_t *)r->routes)[i];
        cJSON_AddItemToArray(ids, cJSON_CreateNumber(v));
    }
}

static void tensor_tail_json(cJSON *o, const proto_tensor *t)
{
    cJSON *shape = cJSON_AddArrayToObject(o, "shape");
    for (uint32_t d = 0; d < t->n_dims; d++) {
        char s[24];
        snprintf(s, sizeof s, "%llu", (unsigned long long)t->shape[d]);
        cJSON_AddItemToArray(shape, cJSON_CreateString(s));
    }
    add_u64(o, "nbytes", t->nbytes);
    add_num(o, "crc32c", t->crc32c);
    if (t->flags & PROTO_TENSOR_DELTA) {
        add_u64(o, "wire_bytes", t->wire_bytes);
        add_u64(o, "base_version", t->base_version);
    }
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

/* The fields of a table layout, in its order; 32-byte fields last, as hex
 * (the JSON form of proto.py to_json). Reserved fields and counts are not shown. */
static void fields_json(cJSON *o, const proto_field *f, const void *base)
{
    for (const proto_field *x = f; x->kind != PROTO_FK_END; x++) {
        const uint8_t *src = (const uint8_t *)base + x->offset;
        uint16_t u16;
        uint32_t u32;
        int32_t i32;
        uint64_t u64;
        float f32;
        proto_str str;
        switch ((proto_field_kind)x->kind) {
        case PROTO_FK_U8:
        case PROTO_FK_BITS8:
        case PROTO_FK_ENUM8: add_num(o, x->name, *src); break;
        case PROTO_FK_U16:
        case PROTO_FK_BITS16: memcpy(&u16, src, 2); add_num(o, x->name, u16); break;
        case PROTO_FK_U32:
        case PROTO_FK_BITS32:
        case PROTO_FK_RANGE32: memcpy(&u32, src, 4); add_num(o, x->name, u32); break;
        case PROTO_FK_I32: memcpy(&i32, src, 4); add_num(o, x->name, i32); break;
        case PROTO_FK_U64: memcpy(&u64, src, 8); add_u64(o, x->name, u64); break;
        case PROTO_FK_F32: memcpy(&f32, src, 4); add_f32(o, x->name, f32); break;
        case PROTO_FK_STR: memcpy(&str, src, sizeof str); add_str(o, x->name, str); break;
        default: break;         /* reserved, counts, n_dims (shown as the shape), BYTES32 (below) */
        }
    }
    for (const proto_field *x = f; x->kind != PROTO_FK_END; x++)
        if (x->kind == PROTO_FK_BYTES32)
            add_hex(o, x->name, (const uint8_t *)base + x->offset, PROTO_AUTH_BYTES);
}

static uint32_t fields_count(const proto_field *f, const void *base)
{
    uint32_t n = 0;
    for (; f->kind != PROTO_FK_END; f++)
        if (f->kind == PROTO_FK_COUNT)
            memcpy(&n, (const uint8_t *)base + f->offset, 4);
    return n;
}

static cJSON *elem_json(const proto_elem_desc *e, const void *el, uint16_t version)
{
    cJSON *o = cJSON_CreateObject();
    fields_json(o, e->fields, el);
    switch ((proto_elem_id)e->id) {
    case PROTO_EL_REQUEST: request_tail_json(o, el, version); break;
    case PROTO_EL_RESULT: result_tail_json(o, el); break;
    case PROTO_EL_TENSOR: tensor_tail_json(o, el); break;
    case PROTO_EL_SUBMIT_ITEM: break;
    }
    return o;
}

static cJSON *msg_json(const proto_msg *m)
{
    const proto_msg_desc *d = proto_msg_find(m->type);
    const void *body = &m->hello;
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "type", d->name);
    fields_json(o, d->fields, body);
    if (!d->elem && !d->raw_bytes)
        return o;
    uint32_t n = fields_count(d->fields, body);
    const uint8_t *arr;
    memcpy(&arr, (const uint8_t *)body + d->array_offset, sizeof arr);
    if (d->raw_bytes) {
        add_hex(o, d->array_name, arr, n);
        return o;
    }
    cJSON *a = cJSON_AddArrayToObject(o, d->array_name);
    for (uint32_t i = 0; i < n; i++)
        cJSON_AddItemToArray(a, elem_json(d->elem, arr + (size_t)i * d->elem->size, m->version));
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
