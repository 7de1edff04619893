/* proto.c - encode and decode of the learner wire protocol (see proto.h and
 * PROTOCOL.md). Reads top to bottom: names, byte order and UTF-8, the decode
 * arena and cursor, one decoder per message (the weight-update ones last),
 * proto_decode, the byte buffer, one encoder per message, proto_encode, sizes
 * and request checks. */
#include "proto/proto.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/err.h"
#include "base/utf8.h"

/* ---- names ---- */

const char *proto_type_name(uint16_t type)
{
    switch (type) {
    case PROTO_HELLO: return "HELLO";
    case PROTO_SUBMIT: return "SUBMIT";
    case PROTO_FETCH: return "FETCH";
    case PROTO_ABORT: return "ABORT";
    case PROTO_STATUS: return "STATUS";
    case PROTO_BYE: return "BYE";
    case PROTO_AUTH_BEGIN: return "AUTH_BEGIN";
    case PROTO_AUTH: return "AUTH";
    case PROTO_UPDATE_BEGIN: return "UPDATE_BEGIN";
    case PROTO_UPDATE_CHUNK: return "UPDATE_CHUNK";
    case PROTO_UPDATE_COMMIT: return "UPDATE_COMMIT";
    case PROTO_UPDATE_ABORT: return "UPDATE_ABORT";
    case PROTO_UPDATE_FORWARD: return "UPDATE_FORWARD";
    case PROTO_UPDATE_PREPARE: return "UPDATE_PREPARE";
    case PROTO_LANE_AUTH: return "LANE_AUTH";
    case PROTO_WEIGHTS_SYNC: return "WEIGHTS_SYNC";
    case PROTO_HELLO_OK: return "HELLO_OK";
    case PROTO_SUBMIT_OK: return "SUBMIT_OK";
    case PROTO_RESULTS: return "RESULTS";
    case PROTO_ABORT_OK: return "ABORT_OK";
    case PROTO_STATUS_OK: return "STATUS_OK";
    case PROTO_BYE_OK: return "BYE_OK";
    case PROTO_AUTH_CHALLENGE: return "AUTH_CHALLENGE";
    case PROTO_AUTH_OK: return "AUTH_OK";
    case PROTO_UPDATE_BEGIN_OK: return "UPDATE_BEGIN_OK";
    case PROTO_UPDATE_CHUNK_OK: return "UPDATE_CHUNK_OK";
    case PROTO_UPDATE_COMMIT_OK: return "UPDATE_COMMIT_OK";
    case PROTO_UPDATE_ABORT_OK: return "UPDATE_ABORT_OK";
    case PROTO_UPDATE_FORWARD_OK: return "UPDATE_FORWARD_OK";
    case PROTO_UPDATE_PREPARE_OK: return "UPDATE_PREPARE_OK";
    case PROTO_WEIGHTS_SYNC_OK: return "WEIGHTS_SYNC_OK";
    case PROTO_ERROR: return "ERROR";
    default: return NULL;
    }
}

const char *proto_err_name(uint32_t code)
{
    switch (code) {
    case PROTO_E_BAD_MAGIC: return "BAD_MAGIC";
    case PROTO_E_UNSUPPORTED_VERSION: return "UNSUPPORTED_VERSION";
    case PROTO_E_MALFORMED: return "MALFORMED";
    case PROTO_E_TOO_LARGE: return "TOO_LARGE";
    case PROTO_E_UNKNOWN_TYPE: return "UNKNOWN_TYPE";
    case PROTO_E_UNEXPECTED: return "UNEXPECTED";
    case PROTO_E_INVALID_PARAMS: return "INVALID_PARAMS";
    case PROTO_E_BUSY: return "BUSY";
    case PROTO_E_UNKNOWN_CLIENT: return "UNKNOWN_CLIENT";
    case PROTO_E_UNKNOWN_REQUEST: return "UNKNOWN_REQUEST";
    case PROTO_E_SHUTTING_DOWN: return "SHUTTING_DOWN";
    case PROTO_E_INTERNAL: return "INTERNAL";
    case PROTO_E_CHECKSUM: return "CHECKSUM";
    case PROTO_E_STALE_VERSION: return "STALE_VERSION";
    case PROTO_E_UPDATE_CONFLICT: return "UPDATE_CONFLICT";
    case PROTO_E_UNAUTHORIZED: return "UNAUTHORIZED";
    default: return "UNKNOWN";
    }
}

int proto_is_request(uint16_t type)
{
    return (type >= PROTO_HELLO && type <= PROTO_AUTH) || (type >= PROTO_UPDATE_BEGIN && type <= PROTO_WEIGHTS_SYNC);
}

uint32_t proto_dtype_size(uint8_t dtype)
{
    switch (dtype) {
    case PROTO_DTYPE_F32: return 4;
    case PROTO_DTYPE_F16:
    case PROTO_DTYPE_BF16: return 2;
    default: return 0;
    }
}

/* Types this version encodes and decodes: every defined one. */
static int type_implemented(uint16_t type) { return proto_type_name(type) != NULL; }

uint32_t proto_err_from_rd(int rc)
{
    switch (rc) {
    case RD_EINVAL:
    case RD_ERANGE: return PROTO_E_INVALID_PARAMS;
    case RD_EBUSY: return PROTO_E_BUSY;
    case RD_ENOENT: return PROTO_E_UNKNOWN_REQUEST;
    default: return PROTO_E_INTERNAL;
    }
}

/* ---- little-endian loads and stores (unaligned) ---- */

static uint16_t ld16(const uint8_t *p) { return (uint16_t)(p[0] | p[1] << 8); }
static uint32_t ld32(const uint8_t *p) { return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24; }
static uint64_t ld64(const uint8_t *p) { return (uint64_t)ld32(p) | (uint64_t)ld32(p + 4) << 32; }

static void st16(uint8_t *p, uint16_t v) { p[0] = (uint8_t)v; p[1] = (uint8_t)(v >> 8); }
static void st32(uint8_t *p, uint32_t v)
{
    p[0] = (uint8_t)v; p[1] = (uint8_t)(v >> 8); p[2] = (uint8_t)(v >> 16); p[3] = (uint8_t)(v >> 24);
}
static void st64(uint8_t *p, uint64_t v) { st32(p, (uint32_t)v); st32(p + 4, (uint32_t)(v >> 32)); }

static uint32_t f32_bits(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
static float bits_f32(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }

/* ---- UTF-8 ---- */

/* Returns the byte offset of the first invalid sequence, or len if the text
 * is valid UTF-8 (base/utf8.h: RFC 3629, the set Python's strict decoder
 * accepts). */
static size_t utf8_check(const uint8_t *s, size_t len) { return utf8_invalid_at(s, len); }

/* ---- decode: arena ---- */

/* One block per message, malloc'd at the first array or string and sized
 * from the frame: 2 x frame + 256 bytes covers the densest encoding of every
 * message but UPDATE_BEGIN (at most about 1.9 arena bytes per wire byte: a
 * 56-byte request becomes a 96-byte proto_request, a 20-byte SUBMIT_OK item
 * with a 1-byte message 32 + 8 bytes); an UPDATE_BEGIN gets
 * PROTO_ARENA_BOUND = 3 x frame + 256 (a 29-byte manifest tensor with a
 * 1-byte name becomes a 72-byte proto_tensor + 8 bytes). Pages never written
 * are never touched. */
struct proto_block {
    size_t cap;                 /* bytes in data */
    size_t used;                /* bytes handed out, each piece 8-byte aligned */
    uint8_t data[];             /* 16-byte aligned: malloc base + two size_t */
};

void proto_msg_free(proto_msg *m)
{
    free(m->arena);
    m->arena = NULL;
    m->arena_bytes = 0;
}

typedef struct {
    const uint8_t *p;           /* body */
    size_t len;                 /* body bytes */
    size_t off;                 /* bytes consumed */
    uint64_t owed;              /* minimum bytes the elements of the array being read still need
                                   after the current one: no field may use them */
    size_t frame_len;           /* header + body: sizes the arena */
    const char *type;           /* message name for errors */
    const char *arr;            /* element array being read ("requests"), or NULL */
    uint64_t idx;               /* its index */
    proto_msg *m;
} cursor;

/* "SUBMIT requests[3]" or "SUBMIT": where an error happened. */
static const char *where(const cursor *c, char *tmp, size_t cap)
{
    if (c->arr)
        snprintf(tmp, cap, "%s %s[%llu]", c->type, c->arr, (unsigned long long)c->idx);
    else
        snprintf(tmp, cap, "%s", c->type);
    return tmp;
}

/* Arena bytes for every message but UPDATE_BEGIN (see proto_block). */
#define ARENA_CAP_2X(n) (2 * (size_t)(n) + 256)

#define MALFORMED(c, ...) (((c)->m->wire_error = PROTO_E_MALFORMED), rd_fail(RD_EFORMAT, __VA_ARGS__))

static void *arena_alloc(cursor *c, size_t bytes)
{
    proto_msg *m = c->m;
    if (!m->arena) {
        size_t cap = m->type == PROTO_UPDATE_BEGIN ? PROTO_ARENA_BOUND(c->frame_len) : ARENA_CAP_2X(c->frame_len);
        m->arena = malloc(sizeof(proto_block) + cap);
        if (!m->arena) {
            m->wire_error = PROTO_E_INTERNAL;
            rd_fail(RD_ENOMEM, "%s: cannot allocate %zu bytes to decode a %zu-byte frame", c->type, cap, c->frame_len);
            return NULL;
        }
        m->arena->cap = cap;
        m->arena->used = 0;
        m->arena_bytes = cap;
    }
    proto_block *b = m->arena;
    size_t need = (bytes + 7) & ~(size_t)7;
    if (need > b->cap - b->used) {
        m->wire_error = PROTO_E_INTERNAL;
        rd_fail(RD_ENOMEM, "%s: decoder arena exhausted (%zu of %zu bytes used, %zu more needed); "
                "PROTO_ARENA_BOUND is too small for this frame", c->type, b->used, b->cap, need);
        return NULL;
    }
    void *p = b->data + b->used;
    b->used += need;
    return p;
}

/* Bytes the current field may use: those left, less what later elements of
 * the array being read need at least. So a count inside one element cannot
 * claim bytes a later element needs, and arena memory (sized from the frame)
 * is spent on distinct wire bytes only. */
static uint64_t avail(const cursor *c) { return c->len - c->off - c->owed; }

/* Checks that n more bytes exist; names the field and what was expected. */
static int need(cursor *c, uint64_t n, const char *field)
{
    if (n <= avail(c))
        return 0;
    char tmp[96];
    return MALFORMED(c, "%s: truncated at %s (body offset %zu): needs %llu bytes, %llu left in a %zu-byte body%s",
                     where(c, tmp, sizeof tmp), field, c->off, (unsigned long long)n, (unsigned long long)avail(c),
                     c->len, c->owed ? " besides what the later elements need" : "");
}

static int rd8(cursor *c, uint8_t *v, const char *f)
{
    int rc = need(c, 1, f);
    if (rc) return rc;
    *v = c->p[c->off];
    c->off += 1;
    return 0;
}
static int rd16(cursor *c, uint16_t *v, const char *f)
{
    int rc = need(c, 2, f);
    if (rc) return rc;
    *v = ld16(c->p + c->off);
    c->off += 2;
    return 0;
}
static int rd32(cursor *c, uint32_t *v, const char *f)
{
    int rc = need(c, 4, f);
    if (rc) return rc;
    *v = ld32(c->p + c->off);
    c->off += 4;
    return 0;
}
static int rdi32(cursor *c, int32_t *v, const char *f)
{
    uint32_t u;
    int rc = rd32(c, &u, f);
    *v = (int32_t)u;
    return rc;
}
static int rd64(cursor *c, uint64_t *v, const char *f)
{
    int rc = need(c, 8, f);
    if (rc) return rc;
    *v = ld64(c->p + c->off);
    c->off += 8;
    return 0;
}
static int rdf32(cursor *c, float *v, const char *f)
{
    uint32_t u;
    int rc = rd32(c, &u, f);
    *v = bits_f32(u);
    return rc;
}

/* A reserved field must be 0; unknown flag bits likewise. */
static int zero_bits(cursor *c, uint64_t v, uint64_t allowed, const char *field)
{
    if (!(v & ~allowed))
        return 0;
    char tmp[96];
    return MALFORMED(c, "%s: %s is 0x%llx; bits 0x%llx are not defined in protocol version %d and must be 0",
                     where(c, tmp, sizeof tmp), field, (unsigned long long)v, (unsigned long long)(v & ~allowed),
                     PROTO_VERSION);
}

static const char empty_str[1] = "";

/* str: u32 byte length, then that many bytes of UTF-8. A length outside
 * min_len..max_len is refused before the bytes are looked at. */
static int rdstr_len(cursor *c, proto_str *s, const char *field, uint32_t min_len, uint32_t max_len)
{
    uint32_t n;
    int rc = rd32(c, &n, field);
    if (rc) return rc;
    if (n < min_len || n > max_len) {
        char tmp[96];
        return MALFORMED(c, "%s: %s is %u bytes long; expected %u..%u bytes", where(c, tmp, sizeof tmp), field, n,
                         min_len, max_len);
    }
    if ((rc = need(c, n, field))) return rc;
    const uint8_t *src = c->p + c->off;
    size_t bad = utf8_check(src, n);
    if (bad != n) {
        char tmp[96];
        return MALFORMED(c, "%s: %s is not valid UTF-8 (byte %zu of %u, value 0x%02x); strings must be UTF-8",
                         where(c, tmp, sizeof tmp), field, bad, n, src[bad]);
    }
    if (n == 0) {
        s->ptr = empty_str;
        s->len = 0;
        return 0;
    }
    char *dst = arena_alloc(c, (size_t)n + 1);
    if (!dst) return RD_ENOMEM;
    memcpy(dst, src, n);
    dst[n] = 0;
    s->ptr = dst;
    s->len = n;
    c->off += n;
    return 0;
}

static int rdstr(cursor *c, proto_str *s, const char *field) { return rdstr_len(c, s, field, 0, UINT32_MAX); }

/* count elements of 4 bytes each (i32 or f32 bits), already checked against
 * the frame by the caller or here; copied into aligned arena memory. */
static int rdarr32(cursor *c, uint64_t count, void **out, const char *field)
{
    int rc = need(c, count * 4, field);
    if (rc) return rc;
    if (count == 0) {
        *out = NULL;
        return 0;
    }
    uint32_t *dst = arena_alloc(c, (size_t)count * 4);
    if (!dst) return RD_ENOMEM;
    const uint8_t *src = c->p + c->off;
    for (uint64_t i = 0; i < count; i++)
        dst[i] = ld32(src + 4 * i);
    c->off += (size_t)count * 4;
    *out = dst;
    return 0;
}

/* An element count, checked against the bytes left: each element needs at
 * least min_bytes, so a huge count fails here, before any allocation. */
static int rdcount(cursor *c, uint32_t *n, uint64_t min_bytes, const char *field)
{
    int rc = rd32(c, n, field);
    if (rc) return rc;
    if ((uint64_t)*n * min_bytes <= avail(c))
        return 0;
    char tmp[96];
    return MALFORMED(c, "%s: %s = %u needs at least %llu bytes, but %llu are left in the body%s",
                     where(c, tmp, sizeof tmp), field, *n, (unsigned long long)*n * min_bytes,
                     (unsigned long long)avail(c), c->owed ? " besides what the later elements need" : "");
}

/* ---- decode: one function per message body ---- */

#define TRY(x) do { int rc_ = (x); if (rc_) return rc_; } while (0)
/* Reads a u32-element array into dst (a const int32_t * or const float *). */
#define RDARR(c, n, dst, field) do { void *p_; TRY(rdarr32((c), (n), &p_, (field))); (dst) = p_; } while (0)
/* Allocates n elements of *dst from the arena, zeroed. */
#define ALLOC(c, n, dst) do {                                                         \
        void *p_ = arena_alloc((c), (size_t)(n) * sizeof *(dst));                      \
        if (!p_) return RD_ENOMEM;                                                    \
        memset(p_, 0, (size_t)(n) * sizeof *(dst));                                   \
        (dst) = p_;                                                                   \
    } while (0)

static int dec_hello(cursor *c, proto_hello *h)
{
    TRY(rd64(c, &h->client_id, "client_id"));
    TRY(rd16(c, &h->min_version, "min_version"));
    TRY(rd16(c, &h->max_version, "max_version"));
    TRY(rd32(c, &h->flags, "flags"));
    TRY(zero_bits(c, h->flags, 0, "flags"));
    return rdstr(c, &h->client_name, "client_name");
}

static int dec_hello_ok(cursor *c, proto_hello_ok *h)
{
    uint16_t reserved;
    TRY(rd64(c, &h->client_id, "client_id"));
    TRY(rd16(c, &h->version, "version"));
    TRY(rd16(c, &reserved, "reserved"));
    TRY(zero_bits(c, reserved, 0, "reserved"));
    TRY(rd32(c, &h->flags, "flags"));
    TRY(zero_bits(c, h->flags, PROTO_HELLO_OK_FLAGS, "flags"));
    TRY(rd64(c, &h->features, "features"));
    TRY(rd64(c, &h->weight_version, "weight_version"));
    TRY(rd32(c, &h->vocab_size, "vocab_size"));
    TRY(rd32(c, &h->max_context, "max_context"));
    TRY(rd32(c, &h->n_layers, "n_layers"));
    TRY(rd32(c, &h->dim, "dim"));
    TRY(rd32(c, &h->n_heads, "n_heads"));
    TRY(rd32(c, &h->n_kv_heads, "n_kv_heads"));
    TRY(rdi32(c, &h->eos_id, "eos_id"));
    TRY(rd32(c, &h->max_prompt_tokens, "max_prompt_tokens"));
    TRY(rd64(c, &h->max_message_bytes, "max_message_bytes"));
    TRY(rd32(c, &h->max_n, "max_n"));
    TRY(rd32(c, &h->max_requests_per_submit, "max_requests_per_submit"));
    TRY(rd32(c, &h->max_tokens, "max_tokens"));
    TRY(rd32(c, &h->max_stop_ids, "max_stop_ids"));
    TRY(rd32(c, &h->max_logprobs_topk, "max_logprobs_topk"));
    TRY(rd32(c, &h->retention_results, "retention_results"));
    TRY(rd64(c, &h->retention_bytes, "retention_bytes"));
    TRY(rd32(c, &h->max_wait_ms, "max_wait_ms"));
    TRY(rd32(c, &h->client_ttl_s, "client_ttl_s"));
    TRY(rd32(c, &h->pending_results, "pending_results"));
    TRY(rd32(c, &h->inflight_samples, "inflight_samples"));
    TRY(rdstr(c, &h->model_name, "model_name"));
    TRY(rdstr(c, &h->architecture, "architecture"));
    TRY(rdstr(c, &h->backend, "backend"));
    return rdstr(c, &h->server, "server");
}

#define REQUEST_MIN_BYTES 56    /* fixed fields 48 + stop count 4 + prompt count 4 */

static int dec_request(cursor *c, proto_request *r)
{
    TRY(rd64(c, &r->client_req_id, "client_req_id"));
    TRY(rd32(c, &r->n, "n"));
    TRY(rd32(c, &r->max_tokens, "max_tokens"));
    TRY(rdf32(c, &r->temperature, "temperature"));
    TRY(rdf32(c, &r->top_p, "top_p"));
    TRY(rdi32(c, &r->top_k, "top_k"));
    TRY(rdf32(c, &r->min_p, "min_p"));
    TRY(rd64(c, &r->seed, "seed"));
    TRY(rd32(c, &r->logprobs_topk, "logprobs_topk"));
    TRY(rd32(c, &r->flags, "flags"));
    TRY(rdcount(c, &r->n_stop, 4, "n_stop"));
    RDARR(c, r->n_stop, r->stop_ids, "stop_ids");
    if (r->flags & PROTO_REQ_PROMPT_IS_TEXT)
        return rdstr(c, &r->text, "prompt_text");
    r->text.ptr = empty_str;
    r->text.len = 0;
    TRY(rdcount(c, &r->n_prompt, 4, "n_prompt"));
    RDARR(c, r->n_prompt, r->prompt, "prompt_ids");
    return 0;
}

static int dec_submit(cursor *c, proto_submit *s)
{
    TRY(rd64(c, &s->client_id, "client_id"));
    TRY(rdcount(c, &s->n_requests, REQUEST_MIN_BYTES, "n_requests"));
    if (s->n_requests == 0)
        return 0;
    proto_request *r;
    ALLOC(c, s->n_requests, r);
    s->requests = r;
    c->arr = "requests";
    c->owed = (uint64_t)s->n_requests * REQUEST_MIN_BYTES;
    for (uint32_t i = 0; i < s->n_requests; i++) {
        c->idx = i;
        c->owed -= REQUEST_MIN_BYTES;
        TRY(dec_request(c, &r[i]));
    }
    c->arr = NULL;
    return 0;
}

#define SUBMIT_ITEM_MIN_BYTES 20

static int dec_submit_ok(cursor *c, proto_submit_ok *s)
{
    TRY(rdcount(c, &s->n_items, SUBMIT_ITEM_MIN_BYTES, "n_items"));
    if (s->n_items == 0)
        return 0;
    proto_submit_item *it;
    ALLOC(c, s->n_items, it);
    s->items = it;
    c->arr = "items";
    c->owed = (uint64_t)s->n_items * SUBMIT_ITEM_MIN_BYTES;
    for (uint32_t i = 0; i < s->n_items; i++) {
        c->idx = i;
        c->owed -= SUBMIT_ITEM_MIN_BYTES;
        TRY(rd64(c, &it[i].client_req_id, "client_req_id"));
        TRY(rd32(c, &it[i].status, "status"));
        TRY(rd32(c, &it[i].flags, "flags"));
        TRY(zero_bits(c, it[i].flags, PROTO_SUBMIT_OK_FLAGS, "flags"));
        TRY(rdstr(c, &it[i].message, "message"));
    }
    c->arr = NULL;
    return 0;
}

static int dec_fetch(cursor *c, proto_fetch *f)
{
    TRY(rd64(c, &f->client_id, "client_id"));
    TRY(rd64(c, &f->ack_seq, "ack_seq"));
    TRY(rd32(c, &f->max_results, "max_results"));
    TRY(rd32(c, &f->wait_ms, "wait_ms"));
    return rd64(c, &f->max_bytes, "max_bytes");
}

#define RESULT_MIN_BYTES 88     /* fixed fields 80 + token count 4 + span count 4 */
#define SPAN_BYTES 16

/* PROTO_ARENA_BOUND holds: each element struct (plus an 8-byte piece for a
 * 1-byte string or one array element) takes at most twice its wire bytes. */
_Static_assert(sizeof(proto_request) + 8 <= 2 * (REQUEST_MIN_BYTES + 1), "proto_request outgrew the arena bound");
_Static_assert(sizeof(proto_submit_item) + 8 <= 2 * (SUBMIT_ITEM_MIN_BYTES + 1), "proto_submit_item outgrew it");
_Static_assert(sizeof(proto_result) + 8 <= 2 * RESULT_MIN_BYTES, "proto_result outgrew the arena bound");
_Static_assert(sizeof(proto_span) <= SPAN_BYTES, "proto_span outgrew the arena bound");

/* Spans are contiguous, cover [0, n_tokens) and carry increasing versions. */
static int check_spans(uint32_t n_tokens, uint32_t n_spans, const proto_span *s, char *why, size_t cap)
{
    if (n_tokens == 0 && n_spans != 0) {
        snprintf(why, cap, "has %u spans but no tokens; expected 0 spans", n_spans);
        return -1;
    }
    if (n_tokens > 0 && n_spans == 0) {
        snprintf(why, cap, "has %u tokens but no spans; expected spans covering [0, %u)", n_tokens, n_tokens);
        return -1;
    }
    uint32_t at = 0;
    for (uint32_t i = 0; i < n_spans; i++) {
        if (s[i].start != at || s[i].end <= s[i].start || s[i].end > n_tokens) {
            snprintf(why, cap, "span %u is [%u, %u); expected [%u, e) with %u < e <= n_tokens = %u", i,
                     s[i].start, s[i].end, at, at, n_tokens);
            return -1;
        }
        if (i > 0 && s[i].version <= s[i - 1].version) {
            snprintf(why, cap, "span %u has version %llu after %llu; expected increasing versions", i,
                     (unsigned long long)s[i].version, (unsigned long long)s[i - 1].version);
            return -1;
        }
        at = s[i].end;
    }
    if (at != n_tokens) {
        snprintf(why, cap, "spans end at token %u; expected them to cover all %u tokens", at, n_tokens);
        return -1;
    }
    return 0;
}

static int dec_result(cursor *c, proto_result *r)
{
    char tmp[96];
    TRY(rd64(c, &r->seq, "seq"));
    TRY(rd64(c, &r->client_req_id, "client_req_id"));
    TRY(rd32(c, &r->sample_idx, "sample_idx"));
    TRY(rd8(c, &r->finish, "finish"));
    if (r->finish < PROTO_FINISH_STOP || r->finish > PROTO_FINISH_ERROR)
        return MALFORMED(c, "%s: finish is %u; expected 1 (stop), 2 (length), 3 (abort) or 4 (error)",
                         where(c, tmp, sizeof tmp), r->finish);
    TRY(rd8(c, &r->flags, "flags"));
    TRY(zero_bits(c, r->flags, PROTO_RESULT_FLAGS, "flags"));
    TRY(rd16(c, &r->top_k, "top_k"));
    TRY(rd32(c, &r->n_preempt, "n_preempt"));
    TRY(rd32(c, &r->n_prompt, "n_prompt"));
    TRY(rd64(c, &r->seed, "seed"));
    TRY(rd64(c, &r->version_admit, "version_admit"));
    TRY(rd64(c, &r->version_finish, "version_finish"));
    TRY(rd64(c, &r->queued_us, "queued_us"));
    TRY(rd64(c, &r->first_token_us, "first_token_us"));
    TRY(rd64(c, &r->total_us, "total_us"));
    /* bytes per token: id + raw log-prob, processed log-prob, top_k (id, log-prob) pairs */
    uint64_t per_token = 8 + ((r->flags & PROTO_RESULT_PROCESSED) ? 4 : 0) + 8 * (uint64_t)r->top_k;
    TRY(rdcount(c, &r->n_tokens, per_token, "n_tokens"));
    uint64_t n = r->n_tokens, nk = n * r->top_k;
    RDARR(c, n, r->token_ids, "token_ids");
    RDARR(c, n, r->logprobs, "logprobs");
    if (r->flags & PROTO_RESULT_PROCESSED)
        RDARR(c, n, r->logprobs_processed, "logprobs_processed");
    RDARR(c, nk, r->top_ids, "top_ids");
    RDARR(c, nk, r->top_logprobs, "top_logprobs");
    TRY(rdcount(c, &r->n_spans, SPAN_BYTES, "n_spans"));
    if (r->n_spans) {
        proto_span *s;
        ALLOC(c, r->n_spans, s);
        for (uint32_t i = 0; i < r->n_spans; i++) {
            TRY(rd32(c, &s[i].start, "spans.start"));
            TRY(rd32(c, &s[i].end, "spans.end"));
            TRY(rd64(c, &s[i].version, "spans.version"));
        }
        r->spans = s;
    }
    char why[160];
    if (check_spans(r->n_tokens, r->n_spans, r->spans, why, sizeof why))
        return MALFORMED(c, "%s: %s", where(c, tmp, sizeof tmp), why);
    return 0;
}

static int dec_results(cursor *c, proto_results *r)
{
    uint32_t flags;
    TRY(rdcount(c, &r->n_results, RESULT_MIN_BYTES, "n_results"));
    TRY(rd32(c, &flags, "flags"));
    TRY(zero_bits(c, flags, 0, "flags"));
    TRY(rd64(c, &r->ack_seq, "ack_seq"));
    TRY(rd32(c, &r->pending_results, "pending_results"));
    TRY(rd32(c, &r->inflight_samples, "inflight_samples"));
    if (r->n_results == 0)
        return 0;
    proto_result *res;
    ALLOC(c, r->n_results, res);
    r->results = res;
    c->arr = "results";
    c->owed = (uint64_t)r->n_results * RESULT_MIN_BYTES;
    for (uint32_t i = 0; i < r->n_results; i++) {
        c->idx = i;
        c->owed -= RESULT_MIN_BYTES;
        TRY(dec_result(c, &res[i]));
    }
    c->arr = NULL;
    return 0;
}

static int dec_abort(cursor *c, proto_abort *a)
{
    TRY(rd64(c, &a->client_id, "client_id"));
    TRY(rd64(c, &a->client_req_id, "client_req_id"));
    TRY(rd32(c, &a->flags, "flags"));
    return zero_bits(c, a->flags, PROTO_ABORT_FLAGS, "flags");
}

static int dec_abort_ok(cursor *c, proto_abort_ok *a)
{
    TRY(rd32(c, &a->n_requests, "n_requests"));
    return rd32(c, &a->n_samples, "n_samples");
}

static int dec_bye(cursor *c, proto_bye *b)
{
    TRY(rd64(c, &b->client_id, "client_id"));
    TRY(rd32(c, &b->flags, "flags"));
    return zero_bits(c, b->flags, PROTO_BYE_FLAGS, "flags");
}

static int dec_bye_ok(cursor *c, proto_bye_ok *b)
{
    TRY(rd32(c, &b->pending_results, "pending_results"));
    return rd32(c, &b->inflight_samples, "inflight_samples");
}

static int dec_auth(cursor *c, proto_auth *a)
{
    TRY(need(c, PROTO_AUTH_BYTES, "bytes"));
    memcpy(a->bytes, c->p + c->off, PROTO_AUTH_BYTES);
    c->off += PROTO_AUTH_BYTES;
    return 0;
}

static int dec_error(cursor *c, proto_error *e)
{
    TRY(rd32(c, &e->code, "code"));
    if (e->code == 0)
        return MALFORMED(c, "ERROR: code is 0; expected an error code >= 1");
    TRY(rd16(c, &e->request_type, "request_type"));
    TRY(rd16(c, &e->version_max, "version_max"));
    return rdstr(c, &e->message, "message");
}

/* ---- decode: weight updates (PROTOCOL.md §10) ---- */

#define UPDATE_BEGIN_MIN_BYTES 40
#define TENSOR_MIN_BYTES 28     /* name length 4 + dtype, n_dims, reserved 4 + one dim 8 + nbytes 8 + crc32c 4 */

_Static_assert(sizeof(proto_tensor) + 8 <= 3 * (TENSOR_MIN_BYTES + 1), "proto_tensor outgrew the arena bound");

static int dec_tensor(cursor *c, proto_tensor *t)
{
    char tmp[96];
    uint16_t reserved;
    TRY(rdstr_len(c, &t->name, "name", 1, PROTO_MAX_TENSOR_NAME));
    TRY(rd8(c, &t->dtype, "dtype"));
    if (t->dtype > PROTO_DTYPE_BF16)
        return MALFORMED(c, "%s: dtype is %u; expected 0 (f32), 1 (f16) or 2 (bf16)", where(c, tmp, sizeof tmp),
                         t->dtype);
    TRY(rd8(c, &t->n_dims, "n_dims"));
    if (t->n_dims < 1 || t->n_dims > PROTO_MAX_DIMS)
        return MALFORMED(c, "%s: n_dims is %u; expected 1..%d", where(c, tmp, sizeof tmp), t->n_dims,
                         PROTO_MAX_DIMS);
    TRY(rd16(c, &reserved, "reserved"));
    TRY(zero_bits(c, reserved, 0, "reserved"));
    for (uint32_t d = 0; d < t->n_dims; d++)
        TRY(rd64(c, &t->shape[d], "shape"));
    TRY(rd64(c, &t->nbytes, "nbytes"));
    return rd32(c, &t->crc32c, "crc32c");
}

static int dec_update_begin(cursor *c, proto_update_begin *u)
{
    uint8_t r0, r1, r2;
    TRY(rd64(c, &u->client_id, "client_id"));
    TRY(rd64(c, &u->version, "version"));
    TRY(rd8(c, &u->mode, "mode"));
    if (u->mode > PROTO_MODE_ABORT)
        return MALFORMED(c, "%s: mode is %u; expected 0 (continue), 1 (drain) or 2 (abort)", c->type, u->mode);
    TRY(rd8(c, &r0, "reserved"));
    TRY(rd8(c, &r1, "reserved"));
    TRY(rd8(c, &r2, "reserved"));
    TRY(zero_bits(c, (uint32_t)r0 | (uint32_t)r1 << 8 | (uint32_t)r2 << 16, 0, "reserved"));
    TRY(rd32(c, &u->window, "window"));
    TRY(rd32(c, &u->max_chunk_bytes, "max_chunk_bytes"));
    TRY(rd64(c, &u->total_bytes, "total_bytes"));
    TRY(rdcount(c, &u->n_tensors, TENSOR_MIN_BYTES, "n_tensors"));
    if (u->n_tensors == 0)
        return 0;
    proto_tensor *t;
    ALLOC(c, u->n_tensors, t);
    u->tensors = t;
    c->arr = "tensors";
    c->owed = (uint64_t)u->n_tensors * TENSOR_MIN_BYTES;
    for (uint32_t i = 0; i < u->n_tensors; i++) {
        c->idx = i;
        c->owed -= TENSOR_MIN_BYTES;
        TRY(dec_tensor(c, &t[i]));
    }
    c->arr = NULL;
    return 0;
}

static int dec_update_begin_ok(cursor *c, proto_update_begin_ok *u)
{
    TRY(rd64(c, &u->xfer_id, "xfer_id"));
    TRY(rd32(c, &u->window, "window"));
    TRY(rd32(c, &u->max_chunk_bytes, "max_chunk_bytes"));
    TRY(rd64(c, &u->staging_bytes, "staging_bytes"));
    TRY(rd16(c, &u->data_port, "data_port"));
    uint16_t r16;
    uint32_t r32;
    TRY(rd16(c, &r16, "reserved"));
    TRY(zero_bits(c, r16, 0, "reserved"));
    TRY(rd32(c, &r32, "reserved"));
    return zero_bits(c, r32, 0, "reserved");
}

/* The data is not copied: it points into the frame (proto_update_chunk). */
static int dec_update_chunk(cursor *c, proto_update_chunk *u)
{
    TRY(rd64(c, &u->xfer_id, "xfer_id"));
    TRY(rd32(c, &u->chunk_seq, "chunk_seq"));
    TRY(rd32(c, &u->tensor_index, "tensor_index"));
    TRY(rd64(c, &u->offset, "offset"));
    TRY(rd32(c, &u->crc32c, "crc32c"));
    TRY(rdcount(c, &u->len, 1, "len"));
    u->data = c->p + c->off;
    c->off += u->len;
    return 0;
}

static int dec_update_chunk_ok(cursor *c, proto_update_chunk_ok *u)
{
    TRY(rd64(c, &u->xfer_id, "xfer_id"));
    TRY(rd32(c, &u->chunk_seq, "chunk_seq"));
    TRY(rd32(c, &u->flags, "flags"));
    TRY(zero_bits(c, u->flags, PROTO_CHUNK_OK_FLAGS, "flags"));
    TRY(rd64(c, &u->bytes_staged, "bytes_staged"));
    return rd64(c, &u->total_bytes, "total_bytes");
}

static int dec_update_commit_ok(cursor *c, proto_update_commit_ok *u)
{
    uint32_t reserved;
    TRY(rd64(c, &u->version, "version"));
    TRY(rd64(c, &u->stall_us, "stall_us"));
    TRY(rd64(c, &u->wait_us, "wait_us"));
    TRY(rd64(c, &u->staged_us, "staged_us"));
    TRY(rd32(c, &u->n_aborted, "n_aborted"));
    TRY(rd32(c, &reserved, "reserved"));
    return zero_bits(c, reserved, 0, "reserved");
}

static int dec_update_forward(cursor *c, proto_update_forward *u)
{
    TRY(rd64(c, &u->xfer_id, "xfer_id"));
    TRY(rd64(c, &u->next_xfer_id, "next_xfer_id"));
    TRY(rd16(c, &u->port, "port"));
    TRY(rd16(c, &u->flags, "flags"));
    TRY(zero_bits(c, u->flags, PROTO_FORWARD_FLAGS, "flags"));
    TRY(rd32(c, &u->window, "window"));
    TRY(need(c, PROTO_AUTH_BYTES, "key"));
    memcpy(u->key, c->p + c->off, PROTO_AUTH_BYTES);
    c->off += PROTO_AUTH_BYTES;
    return rdstr_len(c, &u->host, "host", 0, 255);
}

static int dec_update_forward_ok(cursor *c, proto_update_forward_ok *u)
{
    TRY(rd64(c, &u->xfer_id, "xfer_id"));
    return rd64(c, &u->queued_bytes, "queued_bytes");
}

static int dec_update_prepare_ok(cursor *c, proto_update_prepare_ok *u)
{
    uint16_t reserved;
    TRY(rd64(c, &u->xfer_id, "xfer_id"));
    TRY(rd8(c, &u->state, "state"));
    if (u->state > PROTO_PREP_READY)
        return MALFORMED(c, "%s: state is %u; expected 0 (staging), 1 (building) or 2 (ready)", c->type, u->state);
    TRY(rd8(c, &u->forward, "forward"));
    if (u->forward > PROTO_FWD_FAILED)
        return MALFORMED(c, "%s: forward is %u; expected 0..3", c->type, u->forward);
    TRY(rd16(c, &reserved, "reserved"));
    TRY(zero_bits(c, reserved, 0, "reserved"));
    TRY(rd32(c, &u->forward_error, "forward_error"));
    TRY(rd64(c, &u->bytes_staged, "bytes_staged"));
    TRY(rd64(c, &u->total_bytes, "total_bytes"));
    return rd64(c, &u->forwarded_bytes, "forwarded_bytes");
}

static int dec_lane_auth(cursor *c, proto_lane_auth *a)
{
    TRY(rd64(c, &a->xfer_id, "xfer_id"));
    TRY(need(c, PROTO_AUTH_BYTES, "proof"));
    memcpy(a->proof, c->p + c->off, PROTO_AUTH_BYTES);
    c->off += PROTO_AUTH_BYTES;
    return 0;
}

static int dec_body(cursor *c)
{
    proto_msg *m = c->m;
    switch (m->type) {
    case PROTO_HELLO: return dec_hello(c, &m->hello);
    case PROTO_HELLO_OK: return dec_hello_ok(c, &m->hello_ok);
    case PROTO_SUBMIT: return dec_submit(c, &m->submit);
    case PROTO_SUBMIT_OK: return dec_submit_ok(c, &m->submit_ok);
    case PROTO_FETCH: return dec_fetch(c, &m->fetch);
    case PROTO_RESULTS: return dec_results(c, &m->results);
    case PROTO_ABORT: return dec_abort(c, &m->abort_req);
    case PROTO_ABORT_OK: return dec_abort_ok(c, &m->abort_ok);
    case PROTO_STATUS: return 0;
    case PROTO_STATUS_OK: return rdstr(c, &m->status_ok.json, "json");
    case PROTO_BYE: return dec_bye(c, &m->bye);
    case PROTO_BYE_OK: return dec_bye_ok(c, &m->bye_ok);
    case PROTO_AUTH_BEGIN:
    case PROTO_AUTH:
    case PROTO_AUTH_CHALLENGE:
    case PROTO_AUTH_OK: return dec_auth(c, &m->auth);
    case PROTO_ERROR: return dec_error(c, &m->error);
    case PROTO_UPDATE_BEGIN: return dec_update_begin(c, &m->update_begin);
    case PROTO_UPDATE_BEGIN_OK: return dec_update_begin_ok(c, &m->update_begin_ok);
    case PROTO_UPDATE_CHUNK: return dec_update_chunk(c, &m->update_chunk);
    case PROTO_UPDATE_CHUNK_OK: return dec_update_chunk_ok(c, &m->update_chunk_ok);
    case PROTO_UPDATE_COMMIT: return rd64(c, &m->update_commit.xfer_id, "xfer_id");
    case PROTO_UPDATE_COMMIT_OK: return dec_update_commit_ok(c, &m->update_commit_ok);
    case PROTO_UPDATE_ABORT: return rd64(c, &m->update_abort.xfer_id, "xfer_id");
    case PROTO_UPDATE_ABORT_OK: return rd64(c, &m->update_abort_ok.bytes_freed, "bytes_freed");
    case PROTO_UPDATE_FORWARD: return dec_update_forward(c, &m->update_forward);
    case PROTO_UPDATE_FORWARD_OK: return dec_update_forward_ok(c, &m->update_forward_ok);
    case PROTO_UPDATE_PREPARE: return rd64(c, &m->update_prepare.xfer_id, "xfer_id");
    case PROTO_UPDATE_PREPARE_OK: return dec_update_prepare_ok(c, &m->update_prepare_ok);
    case PROTO_LANE_AUTH: return dec_lane_auth(c, &m->lane_auth);
    case PROTO_WEIGHTS_SYNC:
        TRY(rd64(c, &m->weights_sync.client_id, "client_id"));
        return rdstr_len(c, &m->weights_sync.url, "url", 1, 1024);
    case PROTO_WEIGHTS_SYNC_OK: return rd64(c, &m->weights_sync_ok.version, "version");
    default: return MALFORMED(c, "%s: no decoder (internal)", c->type);
    }
}

/* ---- proto_decode ---- */

static int fail_wire(proto_msg *out, uint32_t code, int rc) { out->wire_error = code; return rc; }

static int decode_frame(const uint8_t *buf, size_t len, size_t max_len, proto_msg *out)
{
    if (max_len && len > max_len)
        return fail_wire(out, PROTO_E_TOO_LARGE,
                         rd_fail(RD_ERANGE, "frame is %zu bytes; the limit is %zu bytes", len, max_len));
    if (len < PROTO_HEADER_BYTES)
        return fail_wire(out, PROTO_E_MALFORMED,
                         rd_fail(RD_EFORMAT, "frame is %zu bytes; expected at least the %d-byte header", len,
                                 PROTO_HEADER_BYTES));
    if (memcmp(buf, PROTO_MAGIC, 4) != 0)
        return fail_wire(out, PROTO_E_BAD_MAGIC,
                         rd_fail(RD_EFORMAT, "magic is %02x %02x %02x %02x; expected 52 4c 44 50 (\"RLDP\")", buf[0],
                                 buf[1], buf[2], buf[3]));
    uint16_t version = ld16(buf + 4), type = ld16(buf + 6);
    uint32_t body_len = ld32(buf + 8), flags = ld32(buf + 12);
    out->type = type;
    if (version != PROTO_VERSION)
        return fail_wire(out, PROTO_E_UNSUPPORTED_VERSION,
                         rd_fail(RD_ENOTSUP, "protocol version %u; this peer speaks version %d to %d", version,
                                 PROTO_VERSION, PROTO_VERSION));
    if (max_len && (uint64_t)body_len + PROTO_HEADER_BYTES > max_len)
        return fail_wire(out, PROTO_E_TOO_LARGE,
                         rd_fail(RD_ERANGE, "header declares a %u-byte body (%llu-byte frame); the limit is %zu bytes",
                                 body_len, (unsigned long long)body_len + PROTO_HEADER_BYTES, max_len));
    if ((uint64_t)body_len != len - PROTO_HEADER_BYTES)
        return fail_wire(out, PROTO_E_MALFORMED,
                         rd_fail(RD_EFORMAT, "header declares a %u-byte body but the frame carries %zu bytes after "
                                 "the header; expected them equal (%s)", body_len, len - PROTO_HEADER_BYTES,
                                 body_len > len - PROTO_HEADER_BYTES ? "truncated frame" : "trailing bytes"));
    if (flags != 0)
        return fail_wire(out, PROTO_E_MALFORMED,
                         rd_fail(RD_EFORMAT, "header flags are 0x%x; expected 0 in protocol version %d", flags,
                                 PROTO_VERSION));
    const char *name = proto_type_name(type);
    if (!type_implemented(type))
        return fail_wire(out, PROTO_E_UNKNOWN_TYPE,
                         rd_fail(RD_ENOTSUP, "message type 0x%02x is not defined; expected HELLO..BYE (0x01..0x06), "
                                 "UPDATE_BEGIN..WEIGHTS_SYNC (0x10..0x17), their replies (0x81..0x86, 0x90..0x95, 0x97) "
                                 "or ERROR (0xff)", type));
    cursor c = {.p = buf + PROTO_HEADER_BYTES, .len = body_len, .frame_len = len, .type = name, .m = out};
    int rc = dec_body(&c);
    if (rc)
        return rc;
    if (c.off != c.len)
        return MALFORMED(&c, "%s: %zu bytes after the last field (body offset %zu of %zu); expected none", name,
                         c.len - c.off, c.off, c.len);
    return 0;
}

int proto_decode(const uint8_t *buf, size_t len, size_t max_len, proto_msg *out)
{
    memset(out, 0, sizeof *out);
    int rc = decode_frame(buf, len, max_len, out);
    if (rc) {
        uint16_t type = out->type;
        uint32_t wire = out->wire_error ? out->wire_error : PROTO_E_INTERNAL;
        proto_msg_free(out);
        memset(out, 0, sizeof *out);
        out->type = type;
        out->wire_error = wire;
    }
    return rc;
}

/* ---- the byte buffer ---- */

void proto_buf_init(proto_buf *b) { memset(b, 0, sizeof *b); }
void proto_buf_reset(proto_buf *b) { b->len = 0; }
void proto_buf_free(proto_buf *b)
{
    free(b->data);
    memset(b, 0, sizeof *b);
}

static int buf_reserve(proto_buf *b, uint64_t extra)
{
    if (extra <= b->cap - b->len)
        return 0;
    if (extra > SIZE_MAX / 2 - b->len)
        return rd_fail(RD_ENOMEM, "proto_buf: cannot grow by %llu bytes", (unsigned long long)extra);
    size_t cap = b->cap ? b->cap : 256;
    while (cap - b->len < extra)
        cap *= 2;
    uint8_t *d = realloc(b->data, cap);
    if (!d)
        return rd_fail(RD_ENOMEM, "proto_buf: cannot grow to %zu bytes", cap);
    b->data = d;
    b->cap = cap;
    return 0;
}

/* ---- encode: writers ----
 * A message is written by one description (put_body) run twice: first with a
 * counting writer (p NULL: only n grows), which gives the body's size, then
 * into exactly that many reserved bytes. Every write checks the end pointer,
 * so even a description that wrote more on its second run than on its first
 * could not pass the reservation; proto_encode then refuses the frame. */

typedef struct {
    uint8_t *p;                 /* next byte to write; NULL while counting */
    uint8_t *end;               /* one past the reserved bytes */
    uint64_t n;                 /* bytes written (or counted) so far */
    int overflow;               /* a write did not fit before end (nothing was written past it) */
} writer;

/* Accounts for k bytes; 1 if they are to be written at p now. */
static int wroom(writer *w, uint64_t k)
{
    if (!w->p) {
        w->n += k;
        return 0;
    }
    if ((uint64_t)(w->end - w->p) < k) {
        w->overflow = 1;
        return 0;
    }
    w->n += k;
    return 1;
}
static void wbytes(writer *w, const void *src, uint64_t k)
{
    if (wroom(w, k) && k) {
        memcpy(w->p, src, k);
        w->p += k;
    }
}
static void w8(writer *w, uint8_t v) { wbytes(w, &v, 1); }
static void w16(writer *w, uint16_t v)
{
    uint8_t b[2];
    st16(b, v);
    wbytes(w, b, 2);
}
static void w32(writer *w, uint32_t v)
{
    uint8_t b[4];
    st32(b, v);
    wbytes(w, b, 4);
}
static void w64(writer *w, uint64_t v)
{
    uint8_t b[8];
    st64(b, v);
    wbytes(w, b, 8);
}
static void wf32(writer *w, float v) { w32(w, f32_bits(v)); }
static void wstr(writer *w, proto_str s)
{
    w32(w, s.len);
    wbytes(w, s.ptr, s.len);
}
static void warr32(writer *w, const void *a, uint64_t n)
{
    const uint8_t *src = a;
    if (!w->p) {
        w->n += 4 * n;
        return;
    }
    for (uint64_t i = 0; i < n; i++) {
        uint32_t v;
        memcpy(&v, src + 4 * i, 4);
        w32(w, v);
    }
}

/* ---- encode: validation and body size, one pass per message ---- */

static int enc_str_ok(const char *msg, const char *field, proto_str s)
{
    if (s.len && !s.ptr)
        return rd_fail(RD_EINVAL, "%s: %s has length %u but no bytes", msg, field, s.len);
    size_t bad = utf8_check((const uint8_t *)s.ptr, s.len);
    if (s.len && bad != s.len)
        return rd_fail(RD_EINVAL, "%s: %s is not valid UTF-8 (byte %zu of %u); strings must be UTF-8", msg, field,
                       bad, s.len);
    return 0;
}

static int enc_flags_ok(const char *msg, const char *field, uint64_t v, uint64_t allowed)
{
    if (v & ~allowed)
        return rd_fail(RD_EINVAL, "%s: %s 0x%llx has undefined bits 0x%llx; expected them 0", msg, field,
                       (unsigned long long)v, (unsigned long long)(v & ~allowed));
    return 0;
}

static int enc_arr_ok(const char *msg, const char *field, const void *p, uint64_t n)
{
    if (n && !p)
        return rd_fail(RD_EINVAL, "%s: %s has %llu elements but no data", msg, field, (unsigned long long)n);
    return 0;
}

static int request_ok(const proto_request *r)
{
    const char *m = "SUBMIT request";
    int text = (r->flags & PROTO_REQ_PROMPT_IS_TEXT) != 0;
    TRY(enc_arr_ok(m, "stop_ids", r->stop_ids, r->n_stop));
    if (text && r->n_prompt)
        return rd_fail(RD_EINVAL, "%s %llu: flags say the prompt is text but it has %u token ids; expected one of "
                       "the two", m, (unsigned long long)r->client_req_id, r->n_prompt);
    if (!text && r->text.len)
        return rd_fail(RD_EINVAL, "%s %llu: has prompt text but flags lack PROTO_REQ_PROMPT_IS_TEXT", m,
                       (unsigned long long)r->client_req_id);
    if (text)
        TRY(enc_str_ok(m, "prompt_text", r->text));
    else
        TRY(enc_arr_ok(m, "prompt_ids", r->prompt, r->n_prompt));
    return 0;
}

static void put_result(writer *w, const proto_result *r);

uint64_t proto_result_bytes(const proto_result *r)
{
    writer c = {0};
    put_result(&c, r);
    return c.n;
}

uint64_t proto_result_max_bytes(uint32_t max_tokens, int processed, uint32_t logprobs_topk)
{
    /* every token may start a new span, so at most max_tokens spans */
    uint64_t per_token = 8 + (processed ? 4 : 0) + 8 * (uint64_t)logprobs_topk + SPAN_BYTES;
    return RESULT_MIN_BYTES + per_token * max_tokens;
}

static int result_ok(const proto_result *r)
{
    const char *m = "RESULTS result";
    if (r->finish < PROTO_FINISH_STOP || r->finish > PROTO_FINISH_ERROR)
        return rd_fail(RD_EINVAL, "%s seq %llu: finish is %u; expected 1..4", m, (unsigned long long)r->seq,
                       r->finish);
    TRY(enc_flags_ok(m, "flags", r->flags, PROTO_RESULT_FLAGS));
    TRY(enc_arr_ok(m, "token_ids", r->token_ids, r->n_tokens));
    TRY(enc_arr_ok(m, "logprobs", r->logprobs, r->n_tokens));
    if (r->flags & PROTO_RESULT_PROCESSED)
        TRY(enc_arr_ok(m, "logprobs_processed", r->logprobs_processed, r->n_tokens));
    TRY(enc_arr_ok(m, "top_ids", r->top_ids, (uint64_t)r->n_tokens * r->top_k));
    TRY(enc_arr_ok(m, "top_logprobs", r->top_logprobs, (uint64_t)r->n_tokens * r->top_k));
    TRY(enc_arr_ok(m, "spans", r->spans, r->n_spans));
    char why[160];
    if (check_spans(r->n_tokens, r->n_spans, r->spans, why, sizeof why))
        return rd_fail(RD_EINVAL, "%s seq %llu: %s", m, (unsigned long long)r->seq, why);
    return 0;
}

/* A manifest tensor: what dec_tensor checks. */
static int tensor_ok(const proto_tensor *t, uint32_t i)
{
    const char *m = "UPDATE_BEGIN tensors";
    if (t->name.len < 1 || t->name.len > PROTO_MAX_TENSOR_NAME)
        return rd_fail(RD_EINVAL, "%s[%u]: name is %u bytes long; expected 1..%d bytes", m, i, t->name.len,
                       PROTO_MAX_TENSOR_NAME);
    TRY(enc_str_ok(m, "name", t->name));
    if (t->dtype > PROTO_DTYPE_BF16)
        return rd_fail(RD_EINVAL, "%s[%u] '%.*s': dtype is %u; expected 0 (f32), 1 (f16) or 2 (bf16)", m, i,
                       (int)t->name.len, t->name.ptr, t->dtype);
    if (t->n_dims < 1 || t->n_dims > PROTO_MAX_DIMS)
        return rd_fail(RD_EINVAL, "%s[%u] '%.*s': n_dims is %u; expected 1..%d", m, i, (int)t->name.len,
                       t->name.ptr, t->n_dims, PROTO_MAX_DIMS);
    return 0;
}

/* Validates m (its size comes from the counting pass of put_body). */
static int msg_ok(const proto_msg *m)
{
    const char *name = proto_type_name(m->type);
    if (!type_implemented(m->type))
        return rd_fail(RD_ENOTSUP, "cannot encode message type 0x%02x: not defined in protocol version %d", m->type,
                       PROTO_VERSION);
    switch (m->type) {
    case PROTO_HELLO:
        TRY(enc_flags_ok(name, "flags", m->hello.flags, 0));
        TRY(enc_str_ok(name, "client_name", m->hello.client_name));
        return 0;
    case PROTO_HELLO_OK: {
        const proto_hello_ok *h = &m->hello_ok;
        TRY(enc_flags_ok(name, "flags", h->flags, PROTO_HELLO_OK_FLAGS));
        TRY(enc_str_ok(name, "model_name", h->model_name));
        TRY(enc_str_ok(name, "architecture", h->architecture));
        TRY(enc_str_ok(name, "backend", h->backend));
        TRY(enc_str_ok(name, "server", h->server));
        return 0;
    }
    case PROTO_SUBMIT: {
        const proto_submit *s = &m->submit;
        TRY(enc_arr_ok(name, "requests", s->requests, s->n_requests));
        for (uint32_t i = 0; i < s->n_requests; i++)
            TRY(request_ok(&s->requests[i]));
        return 0;
    }
    case PROTO_SUBMIT_OK: {
        const proto_submit_ok *s = &m->submit_ok;
        TRY(enc_arr_ok(name, "items", s->items, s->n_items));
        for (uint32_t i = 0; i < s->n_items; i++) {
            TRY(enc_flags_ok(name, "item flags", s->items[i].flags, PROTO_SUBMIT_OK_FLAGS));
            TRY(enc_str_ok(name, "item message", s->items[i].message));
        }
        return 0;
    }
    case PROTO_FETCH: return 0;
    case PROTO_RESULTS: {
        const proto_results *r = &m->results;
        TRY(enc_arr_ok(name, "results", r->results, r->n_results));
        for (uint32_t i = 0; i < r->n_results; i++)
            TRY(result_ok(&r->results[i]));
        return 0;
    }
    case PROTO_ABORT:
        TRY(enc_flags_ok(name, "flags", m->abort_req.flags, PROTO_ABORT_FLAGS));
        return 0;
    case PROTO_ABORT_OK: return 0;
    case PROTO_STATUS: return 0;
    case PROTO_STATUS_OK:
        TRY(enc_str_ok(name, "json", m->status_ok.json));
        return 0;
    case PROTO_BYE:
        TRY(enc_flags_ok(name, "flags", m->bye.flags, PROTO_BYE_FLAGS));
        return 0;
    case PROTO_BYE_OK: return 0;
    case PROTO_AUTH_BEGIN:
    case PROTO_AUTH:
    case PROTO_AUTH_CHALLENGE:
    case PROTO_AUTH_OK: return 0;
    case PROTO_ERROR:
        if (m->error.code == 0)
            return rd_fail(RD_EINVAL, "ERROR: code is 0; expected a PROTO_E_* code >= 1");
        TRY(enc_str_ok(name, "message", m->error.message));
        return 0;
    case PROTO_UPDATE_BEGIN: {
        const proto_update_begin *u = &m->update_begin;
        if (u->mode > PROTO_MODE_ABORT)
            return rd_fail(RD_EINVAL, "UPDATE_BEGIN: mode is %u; expected 0 (continue), 1 (drain) or 2 (abort)",
                           u->mode);
        TRY(enc_arr_ok(name, "tensors", u->tensors, u->n_tensors));
        for (uint32_t i = 0; i < u->n_tensors; i++)
            TRY(tensor_ok(&u->tensors[i], i));
        return 0;
    }
    case PROTO_UPDATE_BEGIN_OK: return 0;
    case PROTO_UPDATE_CHUNK:
        TRY(enc_arr_ok(name, "data", m->update_chunk.data, m->update_chunk.len));
        return 0;
    case PROTO_UPDATE_CHUNK_OK:
        TRY(enc_flags_ok(name, "flags", m->update_chunk_ok.flags, PROTO_CHUNK_OK_FLAGS));
        return 0;
    case PROTO_UPDATE_COMMIT: return 0;
    case PROTO_UPDATE_COMMIT_OK: return 0;
    case PROTO_UPDATE_ABORT: return 0;
    case PROTO_UPDATE_ABORT_OK: return 0;
    case PROTO_UPDATE_FORWARD: {
        const proto_update_forward *u = &m->update_forward;
        TRY(enc_flags_ok(name, "flags", u->flags, PROTO_FORWARD_FLAGS));
        TRY(enc_str_ok(name, "host", u->host));
        if (u->host.len > 255)
            return rd_fail(RD_EINVAL, "UPDATE_FORWARD: host is %u bytes; expected at most 255", u->host.len);
        return 0;
    }
    case PROTO_UPDATE_FORWARD_OK: return 0;
    case PROTO_UPDATE_PREPARE: return 0;
    case PROTO_UPDATE_PREPARE_OK:
        if (m->update_prepare_ok.state > PROTO_PREP_READY || m->update_prepare_ok.forward > PROTO_FWD_FAILED)
            return rd_fail(RD_EINVAL, "UPDATE_PREPARE_OK: state %u / forward %u out of range",
                           m->update_prepare_ok.state, m->update_prepare_ok.forward);
        return 0;
    case PROTO_LANE_AUTH: return 0;
    case PROTO_WEIGHTS_SYNC:
        TRY(enc_str_ok(name, "url", m->weights_sync.url));
        if (m->weights_sync.url.len < 1 || m->weights_sync.url.len > 1024)
            return rd_fail(RD_EINVAL, "WEIGHTS_SYNC: url is %u bytes; expected 1..1024", m->weights_sync.url.len);
        return 0;
    case PROTO_WEIGHTS_SYNC_OK: return 0;
    default:
        return rd_fail(RD_ENOTSUP, "cannot encode message type 0x%02x", m->type);
    }
}

/* ---- encode: writing bodies ---- */

static void put_request(writer *w, const proto_request *r)
{
    w64(w, r->client_req_id);
    w32(w, r->n);
    w32(w, r->max_tokens);
    wf32(w, r->temperature);
    wf32(w, r->top_p);
    w32(w, (uint32_t)r->top_k);
    wf32(w, r->min_p);
    w64(w, r->seed);
    w32(w, r->logprobs_topk);
    w32(w, r->flags);
    w32(w, r->n_stop);
    warr32(w, r->stop_ids, r->n_stop);
    if (r->flags & PROTO_REQ_PROMPT_IS_TEXT) {
        wstr(w, r->text);
    } else {
        w32(w, r->n_prompt);
        warr32(w, r->prompt, r->n_prompt);
    }
}

static void put_result(writer *w, const proto_result *r)
{
    uint64_t n = r->n_tokens, nk = n * r->top_k;
    w64(w, r->seq);
    w64(w, r->client_req_id);
    w32(w, r->sample_idx);
    w8(w, r->finish);
    w8(w, r->flags);
    w16(w, r->top_k);
    w32(w, r->n_preempt);
    w32(w, r->n_prompt);
    w64(w, r->seed);
    w64(w, r->version_admit);
    w64(w, r->version_finish);
    w64(w, r->queued_us);
    w64(w, r->first_token_us);
    w64(w, r->total_us);
    w32(w, r->n_tokens);
    warr32(w, r->token_ids, n);
    warr32(w, r->logprobs, n);
    if (r->flags & PROTO_RESULT_PROCESSED)
        warr32(w, r->logprobs_processed, n);
    warr32(w, r->top_ids, nk);
    warr32(w, r->top_logprobs, nk);
    w32(w, r->n_spans);
    for (uint32_t i = 0; i < r->n_spans; i++) {
        w32(w, r->spans[i].start);
        w32(w, r->spans[i].end);
        w64(w, r->spans[i].version);
    }
}

static void put_body(writer *w, const proto_msg *m)
{
    switch (m->type) {
    case PROTO_HELLO:
        w64(w, m->hello.client_id);
        w16(w, m->hello.min_version);
        w16(w, m->hello.max_version);
        w32(w, m->hello.flags);
        wstr(w, m->hello.client_name);
        break;
    case PROTO_HELLO_OK: {
        const proto_hello_ok *h = &m->hello_ok;
        w64(w, h->client_id);
        w16(w, h->version);
        w16(w, 0);
        w32(w, h->flags);
        w64(w, h->features);
        w64(w, h->weight_version);
        w32(w, h->vocab_size);
        w32(w, h->max_context);
        w32(w, h->n_layers);
        w32(w, h->dim);
        w32(w, h->n_heads);
        w32(w, h->n_kv_heads);
        w32(w, (uint32_t)h->eos_id);
        w32(w, h->max_prompt_tokens);
        w64(w, h->max_message_bytes);
        w32(w, h->max_n);
        w32(w, h->max_requests_per_submit);
        w32(w, h->max_tokens);
        w32(w, h->max_stop_ids);
        w32(w, h->max_logprobs_topk);
        w32(w, h->retention_results);
        w64(w, h->retention_bytes);
        w32(w, h->max_wait_ms);
        w32(w, h->client_ttl_s);
        w32(w, h->pending_results);
        w32(w, h->inflight_samples);
        wstr(w, h->model_name);
        wstr(w, h->architecture);
        wstr(w, h->backend);
        wstr(w, h->server);
        break;
    }
    case PROTO_SUBMIT:
        w64(w, m->submit.client_id);
        w32(w, m->submit.n_requests);
        for (uint32_t i = 0; i < m->submit.n_requests; i++)
            put_request(w, &m->submit.requests[i]);
        break;
    case PROTO_SUBMIT_OK:
        w32(w, m->submit_ok.n_items);
        for (uint32_t i = 0; i < m->submit_ok.n_items; i++) {
            const proto_submit_item *it = &m->submit_ok.items[i];
            w64(w, it->client_req_id);
            w32(w, it->status);
            w32(w, it->flags);
            wstr(w, it->message);
        }
        break;
    case PROTO_FETCH:
        w64(w, m->fetch.client_id);
        w64(w, m->fetch.ack_seq);
        w32(w, m->fetch.max_results);
        w32(w, m->fetch.wait_ms);
        w64(w, m->fetch.max_bytes);
        break;
    case PROTO_RESULTS:
        w32(w, m->results.n_results);
        w32(w, 0);
        w64(w, m->results.ack_seq);
        w32(w, m->results.pending_results);
        w32(w, m->results.inflight_samples);
        for (uint32_t i = 0; i < m->results.n_results; i++)
            put_result(w, &m->results.results[i]);
        break;
    case PROTO_ABORT:
        w64(w, m->abort_req.client_id);
        w64(w, m->abort_req.client_req_id);
        w32(w, m->abort_req.flags);
        break;
    case PROTO_ABORT_OK:
        w32(w, m->abort_ok.n_requests);
        w32(w, m->abort_ok.n_samples);
        break;
    case PROTO_STATUS: break;
    case PROTO_STATUS_OK: wstr(w, m->status_ok.json); break;
    case PROTO_BYE:
        w64(w, m->bye.client_id);
        w32(w, m->bye.flags);
        break;
    case PROTO_BYE_OK:
        w32(w, m->bye_ok.pending_results);
        w32(w, m->bye_ok.inflight_samples);
        break;
    case PROTO_AUTH_BEGIN:
    case PROTO_AUTH:
    case PROTO_AUTH_CHALLENGE:
    case PROTO_AUTH_OK: wbytes(w, m->auth.bytes, PROTO_AUTH_BYTES); break;
    case PROTO_ERROR:
        w32(w, m->error.code);
        w16(w, m->error.request_type);
        w16(w, m->error.version_max);
        wstr(w, m->error.message);
        break;
    case PROTO_UPDATE_BEGIN: {
        const proto_update_begin *u = &m->update_begin;
        w64(w, u->client_id);
        w64(w, u->version);
        w8(w, u->mode);
        w8(w, 0);
        w16(w, 0);
        w32(w, u->window);
        w32(w, u->max_chunk_bytes);
        w64(w, u->total_bytes);
        w32(w, u->n_tensors);
        for (uint32_t i = 0; i < u->n_tensors; i++) {
            const proto_tensor *t = &u->tensors[i];
            wstr(w, t->name);
            w8(w, t->dtype);
            w8(w, t->n_dims);
            w16(w, 0);
            for (uint32_t d = 0; d < t->n_dims; d++)
                w64(w, t->shape[d]);
            w64(w, t->nbytes);
            w32(w, t->crc32c);
        }
        break;
    }
    case PROTO_UPDATE_BEGIN_OK:
        w64(w, m->update_begin_ok.xfer_id);
        w32(w, m->update_begin_ok.window);
        w32(w, m->update_begin_ok.max_chunk_bytes);
        w64(w, m->update_begin_ok.staging_bytes);
        w16(w, m->update_begin_ok.data_port);
        w16(w, 0);
        w32(w, 0);
        break;
    case PROTO_UPDATE_CHUNK: {
        const proto_update_chunk *u = &m->update_chunk;
        w64(w, u->xfer_id);
        w32(w, u->chunk_seq);
        w32(w, u->tensor_index);
        w64(w, u->offset);
        w32(w, u->crc32c);
        w32(w, u->len);
        wbytes(w, u->data, u->len);
        break;
    }
    case PROTO_UPDATE_CHUNK_OK:
        w64(w, m->update_chunk_ok.xfer_id);
        w32(w, m->update_chunk_ok.chunk_seq);
        w32(w, m->update_chunk_ok.flags);
        w64(w, m->update_chunk_ok.bytes_staged);
        w64(w, m->update_chunk_ok.total_bytes);
        break;
    case PROTO_UPDATE_COMMIT: w64(w, m->update_commit.xfer_id); break;
    case PROTO_UPDATE_COMMIT_OK:
        w64(w, m->update_commit_ok.version);
        w64(w, m->update_commit_ok.stall_us);
        w64(w, m->update_commit_ok.wait_us);
        w64(w, m->update_commit_ok.staged_us);
        w32(w, m->update_commit_ok.n_aborted);
        w32(w, 0);
        break;
    case PROTO_UPDATE_ABORT: w64(w, m->update_abort.xfer_id); break;
    case PROTO_UPDATE_ABORT_OK: w64(w, m->update_abort_ok.bytes_freed); break;
    case PROTO_UPDATE_FORWARD: {
        const proto_update_forward *u = &m->update_forward;
        w64(w, u->xfer_id);
        w64(w, u->next_xfer_id);
        w16(w, u->port);
        w16(w, u->flags);
        w32(w, u->window);
        wbytes(w, u->key, PROTO_AUTH_BYTES);
        wstr(w, u->host);
        break;
    }
    case PROTO_UPDATE_FORWARD_OK:
        w64(w, m->update_forward_ok.xfer_id);
        w64(w, m->update_forward_ok.queued_bytes);
        break;
    case PROTO_UPDATE_PREPARE: w64(w, m->update_prepare.xfer_id); break;
    case PROTO_UPDATE_PREPARE_OK: {
        const proto_update_prepare_ok *u = &m->update_prepare_ok;
        w64(w, u->xfer_id);
        w8(w, u->state);
        w8(w, u->forward);
        w16(w, 0);
        w32(w, u->forward_error);
        w64(w, u->bytes_staged);
        w64(w, u->total_bytes);
        w64(w, u->forwarded_bytes);
        break;
    }
    case PROTO_LANE_AUTH:
        w64(w, m->lane_auth.xfer_id);
        wbytes(w, m->lane_auth.proof, PROTO_AUTH_BYTES);
        break;
    case PROTO_WEIGHTS_SYNC:
        w64(w, m->weights_sync.client_id);
        wstr(w, m->weights_sync.url);
        break;
    case PROTO_WEIGHTS_SYNC_OK: w64(w, m->weights_sync_ok.version); break;
    }
}

/* ---- proto_encode ---- */

int proto_encode(proto_buf *b, const proto_msg *m)
{
    TRY(msg_ok(m));
    writer count = {0};
    put_body(&count, m);
    uint64_t size = count.n;
    if (size > UINT32_MAX)
        return rd_fail(RD_EINVAL, "%s: body would be %llu bytes; the format allows at most %u",
                       proto_type_name(m->type), (unsigned long long)size, UINT32_MAX);
    TRY(buf_reserve(b, PROTO_HEADER_BYTES + size));
    uint8_t *start = b->data + b->len;
    writer w = {start, start + PROTO_HEADER_BYTES + size, 0, 0};
    wbytes(&w, PROTO_MAGIC, 4);
    w16(&w, PROTO_VERSION);
    w16(&w, m->type);
    w32(&w, (uint32_t)size);
    w32(&w, 0);
    put_body(&w, m);
    if (w.overflow || w.p != w.end)
        return rd_fail(RD_EINVAL, "%s: wrote %llu bytes into a frame of %llu (the message changed while it was "
                       "encoded?); nothing was sent", proto_type_name(m->type), (unsigned long long)w.n,
                       (unsigned long long)(PROTO_HEADER_BYTES + size));
    b->len += PROTO_HEADER_BYTES + size;
    return 0;
}

int proto_encode_error(proto_buf *b, uint32_t code, uint16_t request_type, const char *message)
{
    char text[PROTO_MAX_ERROR_MESSAGE + 1];
    size_t n = message ? strlen(message) : 0;
    if (n > PROTO_MAX_ERROR_MESSAGE)
        n = PROTO_MAX_ERROR_MESSAGE;
    memcpy(text, message ? message : "", n);
    /* replace invalid sequences by '?' (a cut multi-byte character included) */
    size_t at = 0;
    while ((at += utf8_check((const uint8_t *)text + at, n - at)) < n)
        text[at++] = '?';
    proto_msg m = {.type = PROTO_ERROR};
    m.error.code = code ? code : PROTO_E_INTERNAL;
    m.error.request_type = request_type;
    m.error.version_max = PROTO_VERSION;
    m.error.message.ptr = text;
    m.error.message.len = (uint32_t)n;
    return proto_encode(b, &m);
}

/* ---- request checks (INVALID_PARAMS in SUBMIT_OK) ---- */

static int check_ids(const char *what, uint64_t id, const int32_t *ids, uint32_t n, uint32_t vocab)
{
    for (uint32_t i = 0; i < n; i++)
        if (ids[i] < 0 || (uint32_t)ids[i] >= vocab)
            return rd_fail(RD_EINVAL, "request %llu: %s[%u] = %d; expected a token id in 0..%u (vocab_size %u)",
                           (unsigned long long)id, what, i, ids[i], vocab - 1, vocab);
    return 0;
}

int proto_check_lengths(uint32_t n_prompt, uint32_t max_tokens, const proto_hello_ok *lim)
{
    if (n_prompt == 0)
        return rd_fail(RD_EINVAL, "the prompt is empty; expected at least 1 token");
    if (n_prompt > lim->max_prompt_tokens)
        return rd_fail(RD_EINVAL, "the prompt has %u tokens; the limit is max_prompt_tokens = %u", n_prompt,
                       lim->max_prompt_tokens);
    if ((uint64_t)n_prompt + max_tokens > lim->max_context)
        return rd_fail(RD_EINVAL, "prompt (%u tokens) + max_tokens (%u) = %llu exceeds the context of %u tokens",
                       n_prompt, max_tokens, (unsigned long long)n_prompt + max_tokens, lim->max_context);
    return 0;
}

int proto_check_request(const proto_request *r, const proto_hello_ok *lim)
{
    unsigned long long id = (unsigned long long)r->client_req_id;
    if (r->flags & ~PROTO_REQ_FLAGS)
        return rd_fail(RD_EINVAL, "request %llu: flags 0x%x have undefined bits 0x%x; expected only bits 0x%x "
                       "(protocol version %d)", id, r->flags, r->flags & ~PROTO_REQ_FLAGS, PROTO_REQ_FLAGS, PROTO_VERSION);
    if (r->n < 1 || r->n > lim->max_n)
        return rd_fail(RD_EINVAL, "request %llu: n = %u; expected 1..%u", id, r->n, lim->max_n);
    if (r->max_tokens < 1 || r->max_tokens > lim->max_tokens)
        return rd_fail(RD_EINVAL, "request %llu: max_tokens = %u; expected 1..%u", id, r->max_tokens, lim->max_tokens);
    if (!isfinite(r->temperature) || r->temperature < 0)
        return rd_fail(RD_EINVAL, "request %llu: temperature = %g; expected a finite number >= 0", id,
                       (double)r->temperature);
    if (!(r->top_p > 0 && r->top_p <= 1))
        return rd_fail(RD_EINVAL, "request %llu: top_p = %g; expected 0 < top_p <= 1", id, (double)r->top_p);
    if (r->top_k < 0)
        return rd_fail(RD_EINVAL, "request %llu: top_k = %d; expected >= 0 (0 = off)", id, r->top_k);
    if (!(r->min_p >= 0 && r->min_p <= 1))
        return rd_fail(RD_EINVAL, "request %llu: min_p = %g; expected 0 <= min_p <= 1", id, (double)r->min_p);
    if (r->logprobs_topk > lim->max_logprobs_topk)
        return rd_fail(RD_EINVAL, "request %llu: logprobs_topk = %u; expected 0..%u", id, r->logprobs_topk,
                       lim->max_logprobs_topk);
    if (r->n_stop > lim->max_stop_ids)
        return rd_fail(RD_EINVAL, "request %llu: %u stop ids; expected at most %u", id, r->n_stop, lim->max_stop_ids);
    TRY(check_ids("stop_ids", r->client_req_id, r->stop_ids, r->n_stop, lim->vocab_size));
    uint64_t worst = proto_result_max_bytes(r->max_tokens, (r->flags & PROTO_REQ_PROCESSED_LOGPROBS) != 0,
                                            r->logprobs_topk);
    if (worst + PROTO_RESULTS_OVERHEAD > lim->max_message_bytes)
        return rd_fail(RD_EINVAL, "request %llu: a result of max_tokens = %u with these log-prob options can take "
                       "%llu bytes; expected it to fit max_message_bytes = %llu", id, r->max_tokens,
                       (unsigned long long)(worst + PROTO_RESULTS_OVERHEAD), (unsigned long long)lim->max_message_bytes);
    if (r->flags & PROTO_REQ_PROMPT_IS_TEXT) {
        if (!(lim->flags & PROTO_HELLO_OK_TEXT))
            return rd_fail(RD_EINVAL, "request %llu: a text prompt, but this daemon has no tokenizer; send token ids",
                           id);
        if ((r->flags & PROTO_REQ_CHAT_TEMPLATE) && !(lim->flags & PROTO_HELLO_OK_CHAT))
            return rd_fail(RD_EINVAL, "request %llu: chat_template asked, but the model has no chat template", id);
        if (r->text.len == 0)
            return rd_fail(RD_EINVAL, "request %llu: the prompt text is empty; expected at least 1 byte", id);
        return 0;
    }
    if (r->flags & PROTO_REQ_CHAT_TEMPLATE)
        return rd_fail(RD_EINVAL, "request %llu: chat_template needs a text prompt (flag prompt_is_text)", id);
    int rc = proto_check_lengths(r->n_prompt, r->max_tokens, lim);
    if (rc) {
        char why[400];
        snprintf(why, sizeof why, "%s", rd_errmsg());
        return rd_fail(rc, "request %llu: %s", id, why);
    }
    return check_ids("prompt_ids", r->client_req_id, r->prompt, r->n_prompt, lim->vocab_size);
}
