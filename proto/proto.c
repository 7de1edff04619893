/* proto.c - encode and decode of the learner wire protocol (see proto.h and
 * PROTOCOL.md). The messages are one table, proto/messages.def: this file
 * walks its field lists (decode, encode, encode checks) and hand-writes only
 * what the field kinds cannot say, the element tails of REQUEST, RESULT and
 * TENSOR and UPDATE_CHUNK's data. Reads top to bottom: the table as data and
 * names, byte order and UTF-8, the decode arena and cursor, the field walker
 * and the tails, proto_decode, the byte buffer, the writers, encode checks,
 * the field writer and the tails, proto_encode, sizes and request checks. */
#include "proto/proto.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/err.h"
#include "base/utf8.h"
#include "proto/proto_int.h"

/* ---- the table as data ---- */

/* Wire bytes of each field kind (STR and COUNT: their u32 prefix). */
#define FB_U8 1
#define FB_U16 2
#define FB_U32 4
#define FB_I32 4
#define FB_U64 8
#define FB_F32 4
#define FB_BITS8 1
#define FB_BITS16 2
#define FB_BITS32 4
#define FB_ENUM8 1
#define FB_RANGE32 4
#define FB_DIMS8 1
#define FB_RSV16 2
#define FB_RSV24 3
#define FB_RSV32 4
#define FB_STR 4
#define FB_BYTES32 PROTO_AUTH_BYTES
#define FB_COUNT 4
#define FIELD_BYTES(S, KIND, name, A, B, TEXT) + FB_##KIND
/* Fixed wire bytes of a field list: a compile-time constant. */
#define LAYOUT_BYTES(LAYOUT) (0 PROTO_FIELDS_##LAYOUT(FIELD_BYTES, _))

/* Reserved fields have no struct member; the others are checked against
 * their kind's size, so a table row cannot disagree with proto.h. */
#define OFF_U8(S, n) offsetof(S, n)
#define OFF_U16(S, n) offsetof(S, n)
#define OFF_U32(S, n) offsetof(S, n)
#define OFF_I32(S, n) offsetof(S, n)
#define OFF_U64(S, n) offsetof(S, n)
#define OFF_F32(S, n) offsetof(S, n)
#define OFF_BITS8(S, n) offsetof(S, n)
#define OFF_BITS16(S, n) offsetof(S, n)
#define OFF_BITS32(S, n) offsetof(S, n)
#define OFF_ENUM8(S, n) offsetof(S, n)
#define OFF_RANGE32(S, n) offsetof(S, n)
#define OFF_DIMS8(S, n) offsetof(S, n)
#define OFF_RSV16(S, n) 0
#define OFF_RSV24(S, n) 0
#define OFF_RSV32(S, n) 0
#define OFF_STR(S, n) offsetof(S, n)
#define OFF_BYTES32(S, n) offsetof(S, n)
#define OFF_COUNT(S, n) offsetof(S, n)
#define SIZE_OK(S, n, bytes) _Static_assert(sizeof(((S *)0)->n) == (bytes), #S "." #n " does not match its kind");
#define CHK_U8(S, n) SIZE_OK(S, n, 1)
#define CHK_U16(S, n) SIZE_OK(S, n, 2)
#define CHK_U32(S, n) SIZE_OK(S, n, 4)
#define CHK_I32(S, n) SIZE_OK(S, n, 4)
#define CHK_U64(S, n) SIZE_OK(S, n, 8)
#define CHK_F32(S, n) SIZE_OK(S, n, 4)
#define CHK_BITS8(S, n) SIZE_OK(S, n, 1)
#define CHK_BITS16(S, n) SIZE_OK(S, n, 2)
#define CHK_BITS32(S, n) SIZE_OK(S, n, 4)
#define CHK_ENUM8(S, n) SIZE_OK(S, n, 1)
#define CHK_RANGE32(S, n) SIZE_OK(S, n, 4)
#define CHK_DIMS8(S, n) SIZE_OK(S, n, 1)
#define CHK_RSV16(S, n)
#define CHK_RSV24(S, n)
#define CHK_RSV32(S, n)
#define CHK_STR(S, n) SIZE_OK(S, n, sizeof(proto_str))
#define CHK_BYTES32(S, n) SIZE_OK(S, n, PROTO_AUTH_BYTES)
#define CHK_COUNT(S, n) SIZE_OK(S, n, 4)

#define FIELD_DESC(S, KIND, name, A, B, TEXT) \
    {PROTO_FK_##KIND, (uint16_t)OFF_##KIND(S, name), #name, (uint64_t)(A), (uint64_t)(B), TEXT},
#define FIELD_CHECK(S, KIND, name, A, B, TEXT) CHK_##KIND(S, name)

/* Element field lists and descriptors. */
#define PROTO_ELEM(NAME, STRUCT, TAIL_MIN)                                                              \
    PROTO_FIELDS_##NAME(FIELD_CHECK, STRUCT)                                                            \
    static const proto_field fields_el_##NAME[] = {PROTO_FIELDS_##NAME(FIELD_DESC, STRUCT){0}};         \
    static const proto_elem_desc elem_##NAME = {PROTO_EL_##NAME, #NAME, fields_el_##NAME, sizeof(STRUCT), \
                                                 LAYOUT_BYTES(NAME) + (TAIL_MIN)};
#include "proto/messages.def"
#undef PROTO_ELEM

#define ELEM_PTR_NONE NULL
#define ELEM_PTR_BYTES NULL
#define ELEM_PTR_REQUEST (&elem_REQUEST)
#define ELEM_PTR_SUBMIT_ITEM (&elem_SUBMIT_ITEM)
#define ELEM_PTR_RESULT (&elem_RESULT)
#define ELEM_PTR_TENSOR (&elem_TENSOR)
#define ARRAY_OFF_none(S) 0
#define ARRAY_OFF_requests(S) offsetof(S, requests)
#define ARRAY_OFF_items(S) offsetof(S, items)
#define ARRAY_OFF_results(S) offsetof(S, results)
#define ARRAY_OFF_tensors(S) offsetof(S, tensors)
#define ARRAY_OFF_data(S) offsetof(S, data)

/* Message field lists and rows. */
#define PROTO_MSG(NAME, CODE, DIR, MEMBER, STRUCT, LAYOUT, ELEM, ARRAY)                                 \
    PROTO_FIELDS_##LAYOUT(FIELD_CHECK, STRUCT)                                                          \
    static const proto_field fields_##NAME[] = {PROTO_FIELDS_##LAYOUT(FIELD_DESC, STRUCT){0}};          \
    static const proto_msg_desc msg_##NAME = {CODE, #NAME, DIR_IS_REQ_##DIR, fields_##NAME, ELEM_PTR_##ELEM, \
                                              ELEM_RAW_##ELEM, (uint16_t)ARRAY_OFF_##ARRAY(STRUCT), #ARRAY};
#define DIR_IS_REQ_REQ 1
#define DIR_IS_REQ_REPLY 0
#define ELEM_RAW_NONE 0
#define ELEM_RAW_BYTES 1
#define ELEM_RAW_REQUEST 0
#define ELEM_RAW_SUBMIT_ITEM 0
#define ELEM_RAW_RESULT 0
#define ELEM_RAW_TENSOR 0
#include "proto/messages.def"
#undef PROTO_MSG

const proto_msg_desc *proto_msg_find(uint16_t type)
{
    switch (type) {
#define PROTO_MSG(NAME, CODE, DIR, MEMBER, STRUCT, LAYOUT, ELEM, ARRAY) case CODE: return &msg_##NAME;
#include "proto/messages.def"
#undef PROTO_MSG
    default: return NULL;
    }
}

/* The union member each row names is where the codec reads and writes. */
#define PROTO_MSG(NAME, CODE, DIR, MEMBER, STRUCT, LAYOUT, ELEM, ARRAY) \
    _Static_assert(offsetof(proto_msg, MEMBER) == offsetof(proto_msg, hello), #MEMBER " is not in the union");
#include "proto/messages.def"
#undef PROTO_MSG

/* Element sizes the decoder's bounds are built on (PROTOCOL.md gives them too). */
#define REQUEST_MIN_BYTES 56    /* fixed fields 48 + stop count 4 + prompt count 4 */
#define SUBMIT_ITEM_MIN_BYTES 20
#define RESULT_MIN_BYTES 88     /* fixed fields 80 + token count 4 + span count 4 */
#define SPAN_BYTES 16
#define TENSOR_MIN_BYTES 28     /* name length 4 + dtype, n_dims, reserved 4 + one dim 8 + nbytes 8 + crc32c 4 */
#define BIAS_PAIR_BYTES 8       /* a sampling tail's (i32 id, f32 bias) */
_Static_assert(LAYOUT_BYTES(REQUEST) + 8 == REQUEST_MIN_BYTES, "REQUEST layout changed");
_Static_assert(LAYOUT_BYTES(SUBMIT_ITEM) == SUBMIT_ITEM_MIN_BYTES, "SUBMIT_ITEM layout changed");
_Static_assert(LAYOUT_BYTES(RESULT) + 8 == RESULT_MIN_BYTES, "RESULT layout changed");
_Static_assert(LAYOUT_BYTES(TENSOR) + 20 == TENSOR_MIN_BYTES, "TENSOR layout changed");
_Static_assert(LAYOUT_BYTES(RESULTS) + PROTO_HEADER_BYTES == PROTO_RESULTS_OVERHEAD, "RESULTS layout changed");
_Static_assert(LAYOUT_BYTES(UPDATE_CHUNK) + PROTO_HEADER_BYTES == PROTO_CHUNK_HEAD_BYTES, "UPDATE_CHUNK layout changed");
_Static_assert(PROTO_MAX_DIMS == 4, "TENSOR n_dims text says 1..4");

/* PROTO_ARENA_BOUND holds: each element struct (plus an 8-byte piece for a
 * 1-byte string or one array element) takes at most three times its wire
 * bytes (four times for a tensor, see proto_block). Version 6 made it three:
 * the adapter name a request and a result may carry grew both structs past
 * twice their smallest wire size. A request with a 1-byte text prompt and a
 * 1-byte adapter name (its lora tail: 3 wire bytes) holds two 8-byte pieces. */
#define ARENA_FACTOR 3
_Static_assert(sizeof(proto_request) + 8 <= ARENA_FACTOR * (REQUEST_MIN_BYTES + 1),
               "proto_request outgrew the arena bound");
_Static_assert(sizeof(proto_request) + 8 + 8 <= ARENA_FACTOR * (REQUEST_MIN_BYTES + 1 + PROTO_LORA_TAIL_BYTES + 1),
               "proto_request with an adapter name outgrew the arena bound");
/* A sampling tail's struct takes at most twice its 20 wire bytes; its two
 * bias arrays 8 bytes per pair plus at most 8 of alignment, which the first
 * pair's 8 wire bytes pay for. */
_Static_assert(sizeof(proto_sampling) <= 2 * PROTO_SAMPLING_TAIL_BYTES, "proto_sampling outgrew the arena bound");
_Static_assert(sizeof(proto_submit_item) + 8 <= ARENA_FACTOR * (SUBMIT_ITEM_MIN_BYTES + 1),
               "proto_submit_item outgrew it");
_Static_assert(sizeof(proto_result) + 8 <= ARENA_FACTOR * RESULT_MIN_BYTES, "proto_result outgrew the arena bound");
/* A scored result's proto_scores is paid for by the 12 bytes of its head (a
 * result's arrays, spans and routes take at most twice their own wire bytes,
 * so the 8 bytes above are spare for a result); an adapter name's piece by
 * its lora tail, at least 11 wire bytes. */
_Static_assert(sizeof(proto_result) + sizeof(proto_scores) <=
                   ARENA_FACTOR * (RESULT_MIN_BYTES + PROTO_SCORES_HEAD_BYTES),
               "proto_scores outgrew the arena bound");
_Static_assert(sizeof(proto_result) + sizeof(proto_scores) + 8 + 8 <=
                   ARENA_FACTOR * (RESULT_MIN_BYTES + PROTO_SCORES_HEAD_BYTES + PROTO_RESULT_LORA_BYTES + 1),
               "a result with scores and an adapter name outgrew the arena bound");
_Static_assert(PROTO_MAX_LORA_NAME <= UINT16_MAX, "a lora tail's name length is a u16");
/* A routes array takes at most one 8-byte piece more than its wire bytes; its
 * 8-byte head on the wire pays for that piece. */
#define ROUTES_HEAD_BYTES 8     /* n_routes u32, route_layers u16, route_k u8, route_width u8 */
_Static_assert(sizeof(proto_span) <= SPAN_BYTES, "proto_span outgrew the arena bound");
_Static_assert(sizeof(proto_tensor) + 8 <= 4 * (TENSOR_MIN_BYTES + 1), "proto_tensor outgrew the arena bound");

/* ---- names ---- */

const char *proto_type_name(uint16_t type)
{
    const proto_msg_desc *d = proto_msg_find(type);
    return d ? d->name : NULL;
}

int proto_is_request(uint16_t type)
{
    const proto_msg_desc *d = proto_msg_find(type);
    return d && d->is_request;
}

void proto_types_expected(char *out, size_t cap)
{
    size_t n = 0;
    out[0] = 0;
    for (unsigned t = 0; t < 0x100; t++) {
        if (!proto_msg_find((uint16_t)t) || (t > 0 && proto_msg_find((uint16_t)(t - 1))))
            continue;
        unsigned end = t;       /* the run of consecutive codes starting at t */
        while (end + 1 < 0x100 && proto_msg_find((uint16_t)(end + 1)))
            end++;
        int k;
        if (end == t)
            k = snprintf(out + n, cap - n, "%s%s (0x%02x)", n ? ", " : "", proto_type_name((uint16_t)t), t);
        else
            k = snprintf(out + n, cap - n, "%s%s..%s (0x%02x..0x%02x)", n ? ", " : "", proto_type_name((uint16_t)t),
                         proto_type_name((uint16_t)end), t, end);
        if (k < 0 || (size_t)k >= cap - n)
            return;             /* cut: the caller's buffer is too small, the text stays NUL-terminated */
        n += (size_t)k;
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
    case PROTO_E_FORBIDDEN: return "FORBIDDEN";
    case PROTO_E_BASE_MISMATCH: return "BASE_MISMATCH";
    case PROTO_E_DTYPE_MISMATCH: return "DTYPE_MISMATCH";
    case PROTO_E_BASE_QUANTIZED: return "BASE_QUANTIZED";
    default: return "UNKNOWN";
    }
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


/* ---- UTF-8 ---- */

/* Returns the byte offset of the first invalid sequence, or len if the text
 * is valid UTF-8 (base/utf8.h: RFC 3629, the set Python's strict decoder
 * accepts). */
static size_t utf8_check(const uint8_t *s, size_t len) { return utf8_invalid_at(s, len); }

/* ---- decode: arena ---- */

/* One block per message, malloc'd at the first array or string and sized
 * from the frame: 3 x frame + 256 bytes covers the densest encoding of every
 * message but UPDATE_BEGIN (at most about 2.3 arena bytes per wire byte: a
 * 60-byte request with a 1-byte text prompt and a 1-byte adapter name becomes
 * a 120-byte proto_request + two 8-byte pieces, a 20-byte SUBMIT_OK item
 * with a 1-byte message 32 + 8 bytes); an UPDATE_BEGIN gets
 * PROTO_ARENA_BOUND = 4 x frame + 256 (a 29-byte manifest tensor with a
 * 1-byte name becomes an 88-byte proto_tensor + 8 bytes). Pages never written
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
    uint16_t version;           /* the frame's protocol version */
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
#define ARENA_CAP(n) (ARENA_FACTOR * (size_t)(n) + 256)

#define MALFORMED(c, ...) (((c)->m->wire_error = PROTO_E_MALFORMED), rd_fail(RD_EFORMAT, __VA_ARGS__))

static void *arena_alloc(cursor *c, size_t bytes)
{
    proto_msg *m = c->m;
    if (!m->arena) {
        size_t cap = m->type == PROTO_UPDATE_BEGIN || m->type == PROTO_ADAPTER_BEGIN ? PROTO_ARENA_BOUND(c->frame_len) : ARENA_CAP(c->frame_len);
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
static int rd64(cursor *c, uint64_t *v, const char *f)
{
    int rc = need(c, 8, f);
    if (rc) return rc;
    *v = ld64(c->p + c->off);
    c->off += 8;
    return 0;
}

/* A reserved field must be 0; unknown flag bits likewise. */
static int zero_bits(cursor *c, uint64_t v, uint64_t allowed, const char *field)
{
    if (!(v & ~allowed))
        return 0;
    char tmp[96];
    return MALFORMED(c, "%s: %s is 0x%llx; bits 0x%llx are not defined in protocol version %u and must be 0",
                     where(c, tmp, sizeof tmp), field, (unsigned long long)v, (unsigned long long)(v & ~allowed),
                     c->version);
}

/* The bits a BITS field may have in a frame of this version: those of A,
 * less those B says a later version added (a byte of B per version from 2). */
static uint64_t bits_allowed(const proto_field *f, uint16_t version)
{
    uint64_t a = f->a;
    for (unsigned v = version + 1u; v <= PROTO_VERSION; v++)
        if (v >= 2)
            a &= ~((f->b >> (8 * (v - 2))) & 0xFF);
    return a;
}

/* Version 3 gave UPDATE_BEGIN's reserved byte a meaning (serve_dtype); in an
 * older frame it is still reserved. */
static int serve_dtype_ok(const proto_msg *m, uint16_t version)
{
    if (m->type != PROTO_UPDATE_BEGIN || version >= 3 || m->update_begin.serve_dtype == 0)
        return 0;
    return rd_fail(RD_EFORMAT, "UPDATE_BEGIN: serve_dtype is %u in a protocol version %u frame; it is defined from "
                   "version 3 and must be 0 before", m->update_begin.serve_dtype, version);
}

static const char empty_str[1] = "";

/* The n bytes of a string whose length was read (and checked): UTF-8,
 * copied into the arena with a NUL after them. */
static int rdstr_bytes(cursor *c, proto_str *s, const char *field, uint32_t n)
{
    int rc;
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

/* A length outside min_len..max_len is refused before the bytes are looked at. */
static int bad_len(cursor *c, const char *field, uint32_t n, uint32_t min_len, uint32_t max_len)
{
    char tmp[96];
    return MALFORMED(c, "%s: %s is %u bytes long; expected %u..%u bytes", where(c, tmp, sizeof tmp), field, n, min_len,
                     max_len);
}

/* str: u32 byte length, then that many bytes of UTF-8. */
static int rdstr_len(cursor *c, proto_str *s, const char *field, uint32_t min_len, uint32_t max_len)
{
    uint32_t n;
    int rc = rd32(c, &n, field);
    if (rc) return rc;
    if (n < min_len || n > max_len)
        return bad_len(c, field, n, min_len, max_len);
    return rdstr_bytes(c, s, field, n);
}

static int rdstr(cursor *c, proto_str *s, const char *field) { return rdstr_len(c, s, field, 0, UINT32_MAX); }

/* A lora tail's adapter name (version 6): u16 byte length, 1..PROTO_MAX_LORA_NAME,
 * then that many bytes of UTF-8 (a u16, not a str's u32: the name is short). */
static int rdlora_name(cursor *c, proto_str *s)
{
    uint16_t n;
    int rc = rd16(c, &n, "lora_name");
    if (rc) return rc;
    if (n < 1 || n > PROTO_MAX_LORA_NAME)
        return bad_len(c, "lora_name", n, 1, PROTO_MAX_LORA_NAME);
    return rdstr_bytes(c, s, "lora_name", n);
}

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


/* ---- decode: the field walker ---- */

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

/* A value outside an ENUM8 / RANGE32 / DIMS8 field's range. */
static int bad_value(cursor *c, const proto_field *f, uint64_t v)
{
    char tmp[96];
    return MALFORMED(c, "%s: %s is %llu; expected %s", where(c, tmp, sizeof tmp), f->name, (unsigned long long)v,
                     f->text);
}

/* Reads the fields of list f into the struct at base, checking each as its
 * kind says, in wire order (so the first bad field is the one reported). */
static int dec_fields(cursor *c, const proto_field *f, void *base)
{
    for (; f->kind != PROTO_FK_END; f++) {
        uint8_t *dst = (uint8_t *)base + f->offset;
        uint8_t v8;
        uint16_t v16;
        uint32_t v32;
        uint64_t v64;
        switch ((proto_field_kind)f->kind) {
        case PROTO_FK_U8: TRY(rd8(c, dst, f->name)); break;
        case PROTO_FK_U16: TRY(rd16(c, (uint16_t *)dst, f->name)); break;
        case PROTO_FK_U32:
        case PROTO_FK_I32:
        case PROTO_FK_F32:
            TRY(rd32(c, &v32, f->name));
            memcpy(dst, &v32, 4);   /* an i32 or f32 member keeps the bits */
            break;
        case PROTO_FK_U64: TRY(rd64(c, &v64, f->name)); memcpy(dst, &v64, 8); break;
        case PROTO_FK_BITS8:
            TRY(rd8(c, dst, f->name));
            TRY(zero_bits(c, *dst, bits_allowed(f, c->version), f->name));
            break;
        case PROTO_FK_BITS16:
            TRY(rd16(c, &v16, f->name));
            TRY(zero_bits(c, v16, bits_allowed(f, c->version), f->name));
            memcpy(dst, &v16, 2);
            break;
        case PROTO_FK_BITS32:
            TRY(rd32(c, &v32, f->name));
            TRY(zero_bits(c, v32, bits_allowed(f, c->version), f->name));
            memcpy(dst, &v32, 4);
            break;
        case PROTO_FK_ENUM8:
        case PROTO_FK_DIMS8:
            TRY(rd8(c, dst, f->name));
            if (*dst < f->a || *dst > f->b)
                return bad_value(c, f, *dst);
            break;
        case PROTO_FK_RANGE32:
            TRY(rd32(c, &v32, f->name));
            if (v32 < f->a || v32 > f->b)
                return bad_value(c, f, v32);
            memcpy(dst, &v32, 4);
            break;
        case PROTO_FK_RSV16: TRY(rd16(c, &v16, f->name)); TRY(zero_bits(c, v16, 0, f->name)); break;
        case PROTO_FK_RSV24:
            /* byte by byte, so a truncated frame is reported at the byte it ends on */
            v32 = 0;
            for (int i = 0; i < 3; i++) {
                TRY(rd8(c, &v8, f->name));
                v32 |= (uint32_t)v8 << (8 * i);
            }
            TRY(zero_bits(c, v32, 0, f->name));
            break;
        case PROTO_FK_RSV32: TRY(rd32(c, &v32, f->name)); TRY(zero_bits(c, v32, 0, f->name)); break;
        case PROTO_FK_STR: TRY(rdstr_len(c, (proto_str *)dst, f->name, (uint32_t)f->a, (uint32_t)f->b)); break;
        case PROTO_FK_BYTES32:
            TRY(need(c, PROTO_AUTH_BYTES, f->name));
            memcpy(dst, c->p + c->off, PROTO_AUTH_BYTES);
            c->off += PROTO_AUTH_BYTES;
            break;
        case PROTO_FK_COUNT:
            TRY(rdcount(c, &v32, f->a, f->name));
            memcpy(dst, &v32, 4);
            break;
        case PROTO_FK_END: break;
        }
    }
    return 0;
}

/* The value of a list's COUNT field: how many elements follow. */
static uint32_t list_count(const proto_field *f, const void *base)
{
    uint32_t n = 0;
    for (; f->kind != PROTO_FK_END; f++)
        if (f->kind == PROTO_FK_COUNT)
            memcpy(&n, (const uint8_t *)base + f->offset, 4);
    return n;
}

/* ---- decode: the element tails (what the field kinds cannot say) ---- */

/* REQUEST's sampling tail (flag SAMPLING, version 4): three f32 penalties,
 * min_tokens, n_bias, then n_bias (i32 id, f32 bias) pairs, split into two
 * aligned arrays. The values are kept as sent (NaN included): the ranges are
 * proto_check_request's. */
static int dec_sampling(cursor *c, proto_request *r)
{
    proto_sampling t = {0};
    uint32_t bits;
    TRY(rd32(c, &bits, "repetition_penalty"));
    memcpy(&t.repetition_penalty, &bits, 4);
    TRY(rd32(c, &bits, "frequency_penalty"));
    memcpy(&t.frequency_penalty, &bits, 4);
    TRY(rd32(c, &bits, "presence_penalty"));
    memcpy(&t.presence_penalty, &bits, 4);
    TRY(rd32(c, &t.min_tokens, "min_tokens"));
    TRY(rdcount(c, &t.n_bias, BIAS_PAIR_BYTES, "n_bias"));
    proto_sampling *s;
    ALLOC(c, 1, s);
    if (t.n_bias) {
        int32_t *ids;
        float *vals;
        ALLOC(c, t.n_bias, ids);
        ALLOC(c, t.n_bias, vals);
        const uint8_t *src = c->p + c->off;
        for (uint32_t i = 0; i < t.n_bias; i++) {
            ids[i] = (int32_t)ld32(src + BIAS_PAIR_BYTES * (size_t)i);
            bits = ld32(src + BIAS_PAIR_BYTES * (size_t)i + 4);
            memcpy(&vals[i], &bits, 4);
        }
        c->off += (size_t)t.n_bias * BIAS_PAIR_BYTES;
        t.bias_ids = ids;
        t.bias_vals = vals;
    }
    *s = t;
    r->sampling = s;
    return 0;
}

/* REQUEST: stop ids, then a text prompt or token ids as its flags say, then
 * (flag SAMPLING, version 4 on) the sampling tail, then (flag SCORE, version 5
 * on) the score tail, then (flag LORA, version 6 on) the lora tail. In an
 * older frame SAMPLING, SCORE and LORA are undefined bits: they switch nothing
 * on (proto_check_request refuses them). */
static int dec_request_tail(cursor *c, proto_request *r)
{
    TRY(rdcount(c, &r->n_stop, 4, "n_stop"));
    RDARR(c, r->n_stop, r->stop_ids, "stop_ids");
    if (r->flags & PROTO_REQ_PROMPT_IS_TEXT) {
        TRY(rdstr(c, &r->text, "prompt_text"));
    } else {
        r->text.ptr = empty_str;
        r->text.len = 0;
        TRY(rdcount(c, &r->n_prompt, 4, "n_prompt"));
        RDARR(c, r->n_prompt, r->prompt, "prompt_ids");
    }
    if ((r->flags & PROTO_REQ_SAMPLING) && c->version >= 4)
        TRY(dec_sampling(c, r));
    if ((r->flags & PROTO_REQ_SCORE) && c->version >= 5) {
        uint32_t v;
        TRY(rd32(c, &v, "score_from"));
        r->score_from = (int32_t)v;   /* kept as sent: the range is proto_check_request's */
    }
    r->lora.ptr = empty_str;
    r->lora.len = 0;
    if ((r->flags & PROTO_REQ_LORA) && c->version >= 6)
        TRY(rdlora_name(c, &r->lora));
    return 0;
}

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

/* RESULT routes (flag ROUTES): n_routes, layers, k and the id width, then
 * n_routes x layers x k ids of that width, copied into aligned arena memory
 * of the same width (so the arena grows by the wire bytes, not four times). */
static int dec_routes(cursor *c, proto_result *r)
{
    char tmp[96];
    TRY(rd32(c, &r->n_routes, "n_routes"));
    TRY(rd16(c, &r->route_layers, "route_layers"));
    TRY(rd8(c, &r->route_k, "route_k"));
    TRY(rd8(c, &r->route_width, "route_width"));
    uint32_t w = r->route_width;
    if (w != 1 && w != 2 && w != 4)
        return MALFORMED(c, "%s: route_width is %u; expected 1, 2 or 4 (bytes per expert id)",
                         where(c, tmp, sizeof tmp), w);
    if (r->route_layers == 0 || r->route_k == 0)
        return MALFORMED(c, "%s: routes of %u layers x %u experts; expected at least 1 of each",
                         where(c, tmp, sizeof tmp), r->route_layers, r->route_k);
    uint64_t n = (uint64_t)r->n_routes * r->route_layers * r->route_k;
    if (n * w > avail(c))
        return MALFORMED(c, "%s: n_routes = %u needs %llu bytes (%u layers x %u experts x %u bytes), but %llu are "
                         "left in the body%s", where(c, tmp, sizeof tmp), r->n_routes, (unsigned long long)(n * w),
                         r->route_layers, r->route_k, w, (unsigned long long)avail(c),
                         c->owed ? " besides what the later elements need" : "");
    if (n == 0)
        return 0;
    uint8_t *dst = arena_alloc(c, (size_t)(n * w));
    if (!dst)
        return RD_ENOMEM;
    const uint8_t *src = c->p + c->off;
    if (w == 1) {
        memcpy(dst, src, (size_t)n);
    } else if (w == 2) {
        uint16_t *d16 = (uint16_t *)dst;
        for (uint64_t i = 0; i < n; i++)
            d16[i] = ld16(src + 2 * i);
    } else {
        uint32_t *d32 = (uint32_t *)dst;
        for (uint64_t i = 0; i < n; i++)
            d32[i] = ld32(src + 4 * i);
    }
    c->off += (size_t)(n * w);
    r->routes = dst;
    return 0;
}

/* RESULT scores (flag SCORES, version 5): score_from, flags (none defined:
 * 0), n_scored, then n_scored raw log-probs and n_scored x top_k alternatives
 * (ids, then log-probs), into an arena proto_scores. The positions must be
 * those of the prompt from score_from on, or none. */
static int dec_scores(cursor *c, proto_result *r)
{
    char tmp[96];
    proto_scores t = {0};
    uint32_t flags;
    TRY(rd32(c, &t.score_from, "score_from"));
    TRY(rd32(c, &flags, "scores flags"));
    TRY(zero_bits(c, flags, 0, "scores flags"));
    TRY(rdcount(c, &t.n_scored, 4 + 8 * (uint64_t)r->top_k, "n_scored"));
    if (t.score_from > r->n_prompt || (t.n_scored != 0 && t.n_scored != r->n_prompt - t.score_from))
        return MALFORMED(c, "%s: scores from position %u, %u of them, in a prompt of %u tokens; expected "
                         "score_from <= n_prompt and n_scored 0 or n_prompt - score_from", where(c, tmp, sizeof tmp),
                         t.score_from, t.n_scored, r->n_prompt);
    uint64_t nk = (uint64_t)t.n_scored * r->top_k;
    proto_scores *s;
    ALLOC(c, 1, s);
    RDARR(c, t.n_scored, t.logprobs, "prompt_logprobs");
    RDARR(c, nk, t.top_ids, "prompt_top_ids");
    RDARR(c, nk, t.top_logprobs, "prompt_top_logprobs");
    *s = t;
    r->scores = s;
    return 0;
}

/* RESULT: the token arrays (their lengths depend on flags and top_k), then
 * spans, then (flag ROUTES) the routes, (flag SERVE) the serve tail, (flag
 * SCORES) the prompt's scores and (flag LORA) the adapter's name and version.
 * Each flag is defined only from its version on (dec_fields has checked). */
static int dec_result_tail(cursor *c, proto_result *r)
{
    char tmp[96];
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
    if (r->flags & PROTO_RESULT_ROUTES)
        TRY(dec_routes(c, r));
    if (r->flags & PROTO_RESULT_SERVE) {
        uint16_t rsv;
        TRY(rd8(c, &r->serve_dtype, "serve_dtype"));
        TRY(rd8(c, &r->serve_dtype_first, "serve_dtype_first"));
        TRY(rd16(c, &rsv, "serve reserved"));
        if (r->serve_dtype > PROTO_SERVE_MAX || r->serve_dtype_first > PROTO_SERVE_MAX || rsv)
            return MALFORMED(c, "%s: serve_dtype %u, serve_dtype_first %u, reserved %u; expected 0..%u, 0..%u, 0",
                             where(c, tmp, sizeof tmp), r->serve_dtype, r->serve_dtype_first, rsv, PROTO_SERVE_MAX,
                             PROTO_SERVE_MAX);
    }
    if (r->flags & PROTO_RESULT_SCORES)
        TRY(dec_scores(c, r));
    r->lora.ptr = empty_str;
    if (r->flags & PROTO_RESULT_LORA) {
        TRY(rdlora_name(c, &r->lora));
        TRY(rd64(c, &r->lora_version, "lora_version"));
    }
    return 0;
}

/* TENSOR: n_dims dimensions in mid-element, then nbytes and crc32c, then
 * (flag DELTA, version 3 only) wire_bytes (>= 1) and base_version. */
static int dec_tensor_tail(cursor *c, proto_tensor *t)
{
    char tmp[96];
    for (uint32_t d = 0; d < t->n_dims; d++)
        TRY(rd64(c, &t->shape[d], "shape"));
    TRY(rd64(c, &t->nbytes, "nbytes"));
    TRY(rd32(c, &t->crc32c, "crc32c"));
    if (!(t->flags & PROTO_TENSOR_DELTA))
        return 0;
    if (c->version < 3)
        return MALFORMED(c, "%s: flags 0x%x: DELTA is defined from protocol version 3; this frame is version %u",
                         where(c, tmp, sizeof tmp), t->flags, c->version);
    TRY(rd64(c, &t->wire_bytes, "wire_bytes"));
    TRY(rd64(c, &t->base_version, "base_version"));
    if (t->wire_bytes == 0)
        return MALFORMED(c, "%s: wire_bytes is 0; expected a delta of at least 1 byte", where(c, tmp, sizeof tmp));
    return 0;
}

static int dec_elem_tail(cursor *c, const proto_elem_desc *e, void *el)
{
    switch ((proto_elem_id)e->id) {
    case PROTO_EL_REQUEST: return dec_request_tail(c, el);
    case PROTO_EL_RESULT: return dec_result_tail(c, el);
    case PROTO_EL_TENSOR: return dec_tensor_tail(c, el);
    case PROTO_EL_SUBMIT_ITEM: return 0;
    }
    return 0;
}

/* The n elements after a message's fields, into zeroed arena memory. Each
 * element is held to the bytes the later ones need at least (cursor.owed). */
static int dec_elems(cursor *c, const proto_msg_desc *d, void *body, uint32_t n)
{
    const proto_elem_desc *e = d->elem;
    if (n == 0)
        return 0;
    uint8_t *arr = arena_alloc(c, (size_t)n * e->size);
    if (!arr)
        return RD_ENOMEM;
    memset(arr, 0, (size_t)n * e->size);
    const void *ptr = arr;
    memcpy((uint8_t *)body + d->array_offset, &ptr, sizeof ptr);
    c->arr = d->array_name;
    c->owed = (uint64_t)n * e->min_bytes;
    for (uint32_t i = 0; i < n; i++) {
        c->idx = i;
        c->owed -= e->min_bytes;
        void *el = arr + (size_t)i * e->size;
        TRY(dec_fields(c, e->fields, el));
        TRY(dec_elem_tail(c, e, el));
    }
    c->arr = NULL;
    return 0;
}

static int dec_body(cursor *c, const proto_msg_desc *d)
{
    void *body = &c->m->hello;
    TRY(dec_fields(c, d->fields, body));
    uint32_t n = list_count(d->fields, body);
    if (d->raw_bytes) {
        /* UPDATE_CHUNK: the data is not copied, it points into the frame (proto_update_chunk) */
        const uint8_t *data = c->p + c->off;
        memcpy((uint8_t *)body + d->array_offset, &data, sizeof data);
        c->off += n;
        return 0;
    }
    return d->elem ? dec_elems(c, d, body, n) : 0;
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
    if (version < PROTO_VERSION_MIN || version > PROTO_VERSION)
        return fail_wire(out, PROTO_E_UNSUPPORTED_VERSION,
                         rd_fail(RD_ENOTSUP, "protocol version %u; this peer speaks version %d to %d", version,
                                 PROTO_VERSION_MIN, PROTO_VERSION));
    out->version = version;
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
                         rd_fail(RD_EFORMAT, "header flags are 0x%x; expected 0 in protocol version %u", flags,
                                 version));
    const proto_msg_desc *d = proto_msg_find(type);
    if (!d) {
        char expected[512];
        proto_types_expected(expected, sizeof expected);
        return fail_wire(out, PROTO_E_UNKNOWN_TYPE,
                         rd_fail(RD_ENOTSUP, "message type 0x%02x is not defined; expected one of %s", type, expected));
    }
    const char *name = d->name;
    cursor c = {.p = buf + PROTO_HEADER_BYTES, .len = body_len, .frame_len = len, .type = name, .version = version,
                .m = out};
    int rc = dec_body(&c, d);
    if (rc)
        return rc;
    if (c.off != c.len)
        return MALFORMED(&c, "%s: %zu bytes after the last field (body offset %zu of %zu); expected none", name,
                         c.len - c.off, c.off, c.len);
    if (serve_dtype_ok(out, version))
        return fail_wire(out, PROTO_E_MALFORMED, RD_EFORMAT);
    return 0;
}

int proto_decode(const uint8_t *buf, size_t len, size_t max_len, proto_msg *out)
{
    memset(out, 0, sizeof *out);
    int rc = decode_frame(buf, len, max_len, out);
    if (rc) {
        uint16_t type = out->type, version = out->version;
        uint32_t wire = out->wire_error ? out->wire_error : PROTO_E_INTERNAL;
        proto_msg_free(out);
        memset(out, 0, sizeof *out);
        out->type = type;
        out->version = version;
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

/* n ids of width bytes (uint8_t, uint16_t or int32_t in memory), little-endian. */
static void warr_w(writer *w, const void *a, uint64_t n, uint32_t width)
{
    if (!w->p || width == 1) {
        if (width == 1)
            wbytes(w, a, n);
        else
            w->n += n * width;
        return;
    }
    if (width == 4) {
        warr32(w, a, n);
        return;
    }
    const uint8_t *src = a;
    for (uint64_t i = 0; i < n; i++) {
        uint16_t v;
        memcpy(&v, src + 2 * i, 2);
        w16(w, v);
    }
}

/* ---- encode: checks (what the decoder would refuse), walking the same lists ---- */

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

static int enc_arr_ok(const char *msg, const char *field, const void *p, uint64_t n)
{
    if (n && !p)
        return rd_fail(RD_EINVAL, "%s: %s has %llu elements but no data", msg, field, (unsigned long long)n);
    return 0;
}

/* "SUBMIT_OK items[2]" or "HELLO": where an encode check failed. */
static const char *enc_where(const char *type, const char *arr, uint32_t idx, char *tmp, size_t cap)
{
    if (!arr)
        return type;
    snprintf(tmp, cap, "%s %s[%u]", type, arr, idx);
    return tmp;
}

static int fields_ok(const proto_field *f, const void *base, const char *type, const char *arr, uint32_t idx,
                     uint16_t version)
{
    char tmp[96];
    for (; f->kind != PROTO_FK_END; f++) {
        const uint8_t *src = (const uint8_t *)base + f->offset;
        uint64_t v = 0;
        switch ((proto_field_kind)f->kind) {
        case PROTO_FK_BITS8:
        case PROTO_FK_ENUM8:
        case PROTO_FK_DIMS8: v = *src; break;
        case PROTO_FK_BITS16: { uint16_t x; memcpy(&x, src, 2); v = x; break; }
        case PROTO_FK_BITS32:
        case PROTO_FK_RANGE32: { uint32_t x; memcpy(&x, src, 4); v = x; break; }
        default: break;
        }
        switch ((proto_field_kind)f->kind) {
        case PROTO_FK_BITS8:
        case PROTO_FK_BITS16:
        case PROTO_FK_BITS32: {
            uint64_t allowed = bits_allowed(f, version);
            if (v & ~allowed)
                return rd_fail(RD_EINVAL, "%s: %s 0x%llx has bits 0x%llx undefined in protocol version %u; expected "
                               "them 0", enc_where(type, arr, idx, tmp, sizeof tmp), f->name, (unsigned long long)v,
                               (unsigned long long)(v & ~allowed), version);
            break;
        }
        case PROTO_FK_ENUM8:
        case PROTO_FK_DIMS8:
        case PROTO_FK_RANGE32:
            if (v < f->a || v > f->b)
                return rd_fail(RD_EINVAL, "%s: %s is %llu; expected %s", enc_where(type, arr, idx, tmp, sizeof tmp),
                               f->name, (unsigned long long)v, f->text);
            break;
        case PROTO_FK_STR: {
            proto_str s;
            memcpy(&s, src, sizeof s);
            if (s.len < f->a || s.len > f->b)
                return rd_fail(RD_EINVAL, "%s: %s is %u bytes long; expected %llu..%llu bytes",
                               enc_where(type, arr, idx, tmp, sizeof tmp), f->name, s.len, (unsigned long long)f->a,
                               (unsigned long long)f->b);
            TRY(enc_str_ok(enc_where(type, arr, idx, tmp, sizeof tmp), f->name, s));
            break;
        }
        default: break;
        }
    }
    return 0;
}

/* An adapter name where a lora tail carries it: 1..PROTO_MAX_LORA_NAME bytes of UTF-8. */
static int lora_name_ok(const char *msg, unsigned long long id, proto_str name)
{
    if (name.len < 1 || name.len > PROTO_MAX_LORA_NAME)
        return rd_fail(RD_EINVAL, "%s %llu: the adapter name is %u bytes long; expected 1..%u bytes", msg, id,
                       name.len, PROTO_MAX_LORA_NAME);
    return enc_str_ok(msg, "lora_name", name);
}

static int request_tail_ok(const proto_request *r, uint16_t version)
{
    const char *m = "SUBMIT request";
    int text = (r->flags & PROTO_REQ_PROMPT_IS_TEXT) != 0;
    int tail = (r->flags & PROTO_REQ_SAMPLING) && version >= 4;
    if (tail && !r->sampling)
        return rd_fail(RD_EINVAL, "%s %llu: flags have SAMPLING but sampling is NULL; expected the sampling tail", m,
                       (unsigned long long)r->client_req_id);
    if (!tail && r->sampling)
        return rd_fail(RD_EINVAL, "%s %llu: a sampling tail needs flag PROTO_REQ_SAMPLING in protocol version 4 or "
                       "later; encoding version %u, flags 0x%x", m, (unsigned long long)r->client_req_id, version,
                       r->flags);
    if (tail) {
        TRY(enc_arr_ok(m, "bias_ids", r->sampling->bias_ids, r->sampling->n_bias));
        TRY(enc_arr_ok(m, "bias_vals", r->sampling->bias_vals, r->sampling->n_bias));
    }
    if (r->score_from != 0 && !((r->flags & PROTO_REQ_SCORE) && version >= 5))
        return rd_fail(RD_EINVAL, "%s %llu: score_from %d needs flag PROTO_REQ_SCORE in protocol version 5 or later; "
                       "encoding version %u, flags 0x%x", m, (unsigned long long)r->client_req_id, r->score_from,
                       version, r->flags);
    /* the lora tail: on the wire exactly with the flag in a version-6 frame */
    if ((r->flags & PROTO_REQ_LORA) && version >= 6)
        TRY(lora_name_ok(m, (unsigned long long)r->client_req_id, r->lora));
    else if (r->lora.len)
        return rd_fail(RD_EINVAL, "%s %llu: an adapter name needs flag PROTO_REQ_LORA in protocol version 6 or "
                       "later; encoding version %u, flags 0x%x", m, (unsigned long long)r->client_req_id, version,
                       r->flags);
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

/* A result's scores: present exactly with flag SCORES, positions from
 * score_from to the prompt's end (or none), arrays for them. */
static int scores_ok(const proto_result *r)
{
    const char *m = "RESULTS result";
    unsigned long long seq = (unsigned long long)r->seq;
    const proto_scores *s = r->scores;
    if (!(r->flags & PROTO_RESULT_SCORES)) {
        if (s)
            return rd_fail(RD_EINVAL, "%s seq %llu: scores without flag PROTO_RESULT_SCORES", m, seq);
        return 0;
    }
    if (!s)
        return rd_fail(RD_EINVAL, "%s seq %llu: flags have SCORES but scores is NULL", m, seq);
    if (s->score_from > r->n_prompt || (s->n_scored != 0 && s->n_scored != r->n_prompt - s->score_from))
        return rd_fail(RD_EINVAL, "%s seq %llu: scores from position %u, %u of them, in a prompt of %u tokens; "
                       "expected score_from <= n_prompt and n_scored 0 or n_prompt - score_from", m, seq,
                       s->score_from, s->n_scored, r->n_prompt);
    TRY(enc_arr_ok(m, "prompt_logprobs", s->logprobs, s->n_scored));
    TRY(enc_arr_ok(m, "prompt_top_ids", s->top_ids, (uint64_t)s->n_scored * r->top_k));
    return enc_arr_ok(m, "prompt_top_logprobs", s->top_logprobs, (uint64_t)s->n_scored * r->top_k);
}

static int result_tail_ok(const proto_result *r)
{
    const char *m = "RESULTS result";
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
    if ((r->flags & PROTO_RESULT_SERVE) && (r->serve_dtype > PROTO_SERVE_MAX || r->serve_dtype_first > PROTO_SERVE_MAX))
        return rd_fail(RD_EINVAL, "%s seq %llu: serve_dtype %u / serve_dtype_first %u; expected 0..%u", m,
                       (unsigned long long)r->seq, r->serve_dtype, r->serve_dtype_first, PROTO_SERVE_MAX);
    TRY(scores_ok(r));
    if (r->flags & PROTO_RESULT_LORA)
        TRY(lora_name_ok("RESULTS result seq", (unsigned long long)r->seq, r->lora));
    else if (r->lora.len || r->lora_version)
        return rd_fail(RD_EINVAL, "%s seq %llu: an adapter name or lora_version without flag PROTO_RESULT_LORA", m,
                       (unsigned long long)r->seq);
    if (!(r->flags & PROTO_RESULT_ROUTES))
        return 0;
    if (r->route_width != 1 && r->route_width != 2 && r->route_width != 4)
        return rd_fail(RD_EINVAL, "%s seq %llu: route_width is %u; expected 1, 2 or 4", m, (unsigned long long)r->seq,
                       r->route_width);
    if (r->route_layers == 0 || r->route_k == 0)
        return rd_fail(RD_EINVAL, "%s seq %llu: routes of %u layers x %u experts; expected at least 1 of each", m,
                       (unsigned long long)r->seq, r->route_layers, r->route_k);
    return enc_arr_ok(m, "routes", r->routes, (uint64_t)r->n_routes * r->route_layers * r->route_k);
}

static int tensor_tail_ok(const proto_tensor *t, uint16_t version)
{
    if (!(t->flags & PROTO_TENSOR_DELTA))
        return 0;
    if (version < 3)
        return rd_fail(RD_EINVAL, "UPDATE_BEGIN tensor '%.*s': DELTA is defined from protocol version 3; encoding %u",
                       (int)(t->name.len < 200 ? t->name.len : 200), t->name.ptr ? t->name.ptr : "", version);
    if (t->wire_bytes == 0)
        return rd_fail(RD_EINVAL, "UPDATE_BEGIN tensor '%.*s': a delta of wire_bytes 0; expected >= 1",
                       (int)(t->name.len < 200 ? t->name.len : 200), t->name.ptr ? t->name.ptr : "");
    return 0;
}

static int elem_tail_ok(const proto_elem_desc *e, const void *el, uint16_t version)
{
    switch ((proto_elem_id)e->id) {
    case PROTO_EL_REQUEST: return request_tail_ok(el, version);
    case PROTO_EL_RESULT: return result_tail_ok(el);
    case PROTO_EL_TENSOR: return tensor_tail_ok(el, version);
    case PROTO_EL_SUBMIT_ITEM: return 0;
    }
    return 0;
}

/* The element pointer of a message with an array (NULL when it has none). */
static const uint8_t *elems_of(const proto_msg_desc *d, const void *body)
{
    const uint8_t *p;
    memcpy(&p, (const uint8_t *)body + d->array_offset, sizeof p);
    return p;
}

/* Validates m (its size comes from the counting pass of put_body). */
static int msg_ok(const proto_msg *m, const proto_msg_desc *d, uint16_t version)
{
    const void *body = &m->hello;
    TRY(fields_ok(d->fields, body, d->name, NULL, 0, version));
    if (!d->elem && !d->raw_bytes)
        return 0;
    uint32_t n = list_count(d->fields, body);
    const uint8_t *arr = elems_of(d, body);
    TRY(enc_arr_ok(d->name, d->array_name, arr, n));
    for (uint32_t i = 0; d->elem && i < n; i++) {
        const void *el = arr + (size_t)i * d->elem->size;
        TRY(fields_ok(d->elem->fields, el, d->name, d->array_name, i, version));
        TRY(elem_tail_ok(d->elem, el, version));
    }
    return 0;
}

/* ---- encode: writing bodies ---- */

static void put_fields(writer *w, const proto_field *f, const void *base)
{
    for (; f->kind != PROTO_FK_END; f++) {
        const uint8_t *src = (const uint8_t *)base + f->offset;
        uint16_t v16;
        uint32_t v32;
        uint64_t v64;
        switch ((proto_field_kind)f->kind) {
        case PROTO_FK_U8:
        case PROTO_FK_BITS8:
        case PROTO_FK_ENUM8:
        case PROTO_FK_DIMS8: w8(w, *src); break;
        case PROTO_FK_U16:
        case PROTO_FK_BITS16: memcpy(&v16, src, 2); w16(w, v16); break;
        case PROTO_FK_U32:
        case PROTO_FK_I32:
        case PROTO_FK_F32:
        case PROTO_FK_BITS32:
        case PROTO_FK_RANGE32:
        case PROTO_FK_COUNT: memcpy(&v32, src, 4); w32(w, v32); break;
        case PROTO_FK_U64: memcpy(&v64, src, 8); w64(w, v64); break;
        case PROTO_FK_RSV16: w16(w, 0); break;
        case PROTO_FK_RSV24: w8(w, 0); w16(w, 0); break;
        case PROTO_FK_RSV32: w32(w, 0); break;
        case PROTO_FK_STR: {
            proto_str s;
            memcpy(&s, src, sizeof s);
            wstr(w, s);
            break;
        }
        case PROTO_FK_BYTES32: wbytes(w, src, PROTO_AUTH_BYTES); break;
        case PROTO_FK_END: break;
        }
    }
}

static void wf32(writer *w, float f)
{
    uint32_t v;
    memcpy(&v, &f, 4);
    w32(w, v);
}

/* The prompt, then the sampling tail, then the score tail, then the lora
 * tail: msg_ok has checked that sampling is set exactly when the frame carries
 * it (flag SAMPLING, version 4 on), score_from is 0 unless the frame carries it
 * (flag SCORE, version 5 on) and the adapter name likewise (flag LORA,
 * version 6 on; a name of 1..PROTO_MAX_LORA_NAME bytes then). */
static void put_request_tail(writer *w, const proto_request *r, uint16_t version)
{
    w32(w, r->n_stop);
    warr32(w, r->stop_ids, r->n_stop);
    if (r->flags & PROTO_REQ_PROMPT_IS_TEXT) {
        wstr(w, r->text);
    } else {
        w32(w, r->n_prompt);
        warr32(w, r->prompt, r->n_prompt);
    }
    const proto_sampling *s = r->sampling;
    if (s) {
        wf32(w, s->repetition_penalty);
        wf32(w, s->frequency_penalty);
        wf32(w, s->presence_penalty);
        w32(w, s->min_tokens);
        w32(w, s->n_bias);
        for (uint32_t i = 0; i < s->n_bias; i++) {
            w32(w, (uint32_t)s->bias_ids[i]);
            wf32(w, s->bias_vals[i]);
        }
    }
    if (version >= 5 && (r->flags & PROTO_REQ_SCORE))
        w32(w, (uint32_t)r->score_from);
    if (version >= 6 && (r->flags & PROTO_REQ_LORA)) {
        w16(w, (uint16_t)r->lora.len);
        wbytes(w, r->lora.ptr, r->lora.len);
    }
}

static void put_result_tail(writer *w, const proto_result *r)
{
    uint64_t n = r->n_tokens, nk = n * r->top_k;
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
    if (r->flags & PROTO_RESULT_ROUTES) {
        w32(w, r->n_routes);
        w16(w, r->route_layers);
        w8(w, r->route_k);
        w8(w, r->route_width);
        warr_w(w, r->routes, (uint64_t)r->n_routes * r->route_layers * r->route_k, r->route_width);
    }
    if (r->flags & PROTO_RESULT_SERVE) {
        w8(w, r->serve_dtype);
        w8(w, r->serve_dtype_first);
        w16(w, 0);
    }
    const proto_scores *s = r->scores;
    if (s) {
        uint64_t nk = (uint64_t)s->n_scored * r->top_k;
        w32(w, s->score_from);
        w32(w, 0);
        w32(w, s->n_scored);
        warr32(w, s->logprobs, s->n_scored);
        warr32(w, s->top_ids, nk);
        warr32(w, s->top_logprobs, nk);
    }
    if (r->flags & PROTO_RESULT_LORA) {
        w16(w, (uint16_t)r->lora.len);
        wbytes(w, r->lora.ptr, r->lora.len);
        w64(w, r->lora_version);
    }
}

static void put_tensor_tail(writer *w, const proto_tensor *t)
{
    for (uint32_t d = 0; d < t->n_dims; d++)
        w64(w, t->shape[d]);
    w64(w, t->nbytes);
    w32(w, t->crc32c);
    if (t->flags & PROTO_TENSOR_DELTA) {
        w64(w, t->wire_bytes);
        w64(w, t->base_version);
    }
}

/* version: the frame's (a request's tails depend on it; a result's are
 * switched on by its flags alone). */
static void put_elem(writer *w, const proto_elem_desc *e, const void *el, uint16_t version)
{
    put_fields(w, e->fields, el);
    switch ((proto_elem_id)e->id) {
    case PROTO_EL_REQUEST: put_request_tail(w, el, version); break;
    case PROTO_EL_RESULT: put_result_tail(w, el); break;
    case PROTO_EL_TENSOR: put_tensor_tail(w, el); break;
    case PROTO_EL_SUBMIT_ITEM: break;
    }
}

static void put_body(writer *w, const proto_msg *m, const proto_msg_desc *d)
{
    const void *body = &m->hello;
    put_fields(w, d->fields, body);
    if (!d->elem && !d->raw_bytes)
        return;
    uint32_t n = list_count(d->fields, body);
    const uint8_t *arr = elems_of(d, body);
    if (d->raw_bytes) {
        wbytes(w, arr, n);
        return;
    }
    uint16_t version = m->version ? m->version : PROTO_VERSION_MIN;
    for (uint32_t i = 0; i < n; i++)
        put_elem(w, d->elem, arr + (size_t)i * d->elem->size, version);
}

/* ---- sizes ---- */

uint64_t proto_result_bytes(const proto_result *r)
{
    writer c = {0};
    put_elem(&c, &elem_RESULT, r, PROTO_VERSION);
    return c.n;
}

uint64_t proto_result_max_bytes(uint32_t max_tokens, int processed, uint32_t logprobs_topk)
{
    /* every token may start a new span, so at most max_tokens spans */
    uint64_t per_token = 8 + (processed ? 4 : 0) + 8 * (uint64_t)logprobs_topk + SPAN_BYTES;
    return RESULT_MIN_BYTES + per_token * max_tokens;
}

uint64_t proto_scores_bytes(uint64_t n_scored, uint32_t top_k)
{
    return PROTO_SCORES_HEAD_BYTES + n_scored * (4 + 8 * (uint64_t)top_k);
}

uint64_t proto_lora_bytes(uint32_t name_len) { return PROTO_RESULT_LORA_BYTES + (uint64_t)name_len; }

uint64_t proto_routes_bytes(uint64_t positions, uint32_t layers, uint32_t k, uint32_t width)
{
    return ROUTES_HEAD_BYTES + positions * layers * k * width;
}

uint8_t proto_route_width(uint32_t n_experts)
{
    return n_experts <= 256 ? 1 : n_experts <= 65536 ? 2 : 4;
}

/* ---- proto_encode ---- */

int proto_encode(proto_buf *b, const proto_msg *m)
{
    const proto_msg_desc *d = proto_msg_find(m->type);
    if (!d)
        return rd_fail(RD_ENOTSUP, "cannot encode message type 0x%02x: not defined in protocol version %d", m->type,
                       PROTO_VERSION);
    uint16_t version = m->version ? m->version : PROTO_VERSION_MIN;
    if (version > PROTO_VERSION)
        return rd_fail(RD_EINVAL, "%s: cannot encode in protocol version %u; this code speaks %d to %d", d->name,
                       version, PROTO_VERSION_MIN, PROTO_VERSION);
    TRY(msg_ok(m, d, version));
    if (serve_dtype_ok(m, version))
        return RD_EINVAL;
    writer count = {0};
    put_body(&count, m, d);
    uint64_t size = count.n;
    if (size > UINT32_MAX)
        return rd_fail(RD_EINVAL, "%s: body would be %llu bytes; the format allows at most %u", d->name,
                       (unsigned long long)size, UINT32_MAX);
    TRY(buf_reserve(b, PROTO_HEADER_BYTES + size));
    uint8_t *start = b->data + b->len;
    writer w = {start, start + PROTO_HEADER_BYTES + size, 0, 0};
    wbytes(&w, PROTO_MAGIC, 4);
    w16(&w, version);
    w16(&w, m->type);
    w32(&w, (uint32_t)size);
    w32(&w, 0);
    put_body(&w, m, d);
    if (w.overflow || w.p != w.end)
        return rd_fail(RD_EINVAL, "%s: wrote %llu bytes into a frame of %llu (the message changed while it was "
                       "encoded?); nothing was sent", d->name, (unsigned long long)w.n,
                       (unsigned long long)(PROTO_HEADER_BYTES + size));
    b->len += PROTO_HEADER_BYTES + size;
    return 0;
}

int proto_encode_error(proto_buf *b, uint32_t code, uint16_t request_type, const char *message)
{
    return proto_encode_error_version(b, 0, code, request_type, message);
}

int proto_encode_error_version(proto_buf *b, uint16_t version, uint32_t code, uint16_t request_type,
                               const char *message)
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
    proto_msg m = {.type = PROTO_ERROR, .version = version};
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

static int cmp_i32(const void *a, const void *b)
{
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

/* The sampling tail (version 4): the ranges of DESIGN.md's sampling table,
 * the HTTP doors' too (daemon/sampling.def). */
static int check_sampling(const proto_request *r, const proto_hello_ok *lim)
{
    unsigned long long id = (unsigned long long)r->client_req_id;
    const proto_sampling *s = r->sampling;
    if (!s)
        return rd_fail(RD_EINVAL, "request %llu: flags have SAMPLING but the request has no sampling tail; expected "
                       "proto_request.sampling set", id);
    if (!isfinite(s->repetition_penalty) || !(s->repetition_penalty > 0))
        return rd_fail(RD_EINVAL, "request %llu: repetition_penalty = %g; expected a finite number > 0 (1 = off)", id,
                       (double)s->repetition_penalty);
    if (!(s->frequency_penalty >= -2 && s->frequency_penalty <= 2))
        return rd_fail(RD_EINVAL, "request %llu: frequency_penalty = %g; expected -2 <= frequency_penalty <= 2 "
                       "(0 = off)", id, (double)s->frequency_penalty);
    if (!(s->presence_penalty >= -2 && s->presence_penalty <= 2))
        return rd_fail(RD_EINVAL, "request %llu: presence_penalty = %g; expected -2 <= presence_penalty <= 2 "
                       "(0 = off)", id, (double)s->presence_penalty);
    if (s->min_tokens > r->max_tokens)
        return rd_fail(RD_EINVAL, "request %llu: min_tokens = %u; expected 0..max_tokens (%u)", id, s->min_tokens,
                       r->max_tokens);
    if (s->n_bias > PROTO_MAX_BIAS)
        return rd_fail(RD_EINVAL, "request %llu: %u logit_bias entries; expected at most %u", id, s->n_bias,
                       PROTO_MAX_BIAS);
    TRY(check_ids("bias_ids", r->client_req_id, s->bias_ids, s->n_bias, lim->vocab_size));
    for (uint32_t i = 0; i < s->n_bias; i++)
        if (!(s->bias_vals[i] >= -PROTO_MAX_ABS_BIAS && s->bias_vals[i] <= PROTO_MAX_ABS_BIAS))
            return rd_fail(RD_EINVAL, "request %llu: bias_vals[%u] = %g (token %d); expected -100 <= bias <= 100", id,
                           i, (double)s->bias_vals[i], s->bias_ids[i]);
    if (s->n_bias < 2)
        return 0;
    /* distinct ids: sorted, a repeat sits next to its twin (n log n: a SUBMIT may carry many requests) */
    int32_t sorted[PROTO_MAX_BIAS];
    memcpy(sorted, s->bias_ids, sizeof(int32_t) * s->n_bias);
    qsort(sorted, s->n_bias, sizeof sorted[0], cmp_i32);
    for (uint32_t k = 1; k < s->n_bias; k++) {
        if (sorted[k] != sorted[k - 1])
            continue;
        uint32_t first = 0, i = 0;
        while (s->bias_ids[first] != sorted[k])
            first++;
        for (i = first + 1; s->bias_ids[i] != sorted[k]; i++)
            ;
        return rd_fail(RD_EINVAL, "request %llu: bias_ids[%u] = %d repeats bias_ids[%u]; expected distinct token ids",
                       id, i, sorted[k], first);
    }
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
    if (max_tokens == 0 && n_prompt >= lim->max_context)
        return rd_fail(RD_EINVAL, "the prompt has %u tokens; expected at most %u with max_tokens 0 (a scored prompt "
                       "must leave one position of the context of %u tokens)", n_prompt, lim->max_context - 1,
                       lim->max_context);
    return 0;
}

int proto_check_score_from(const proto_request *r, uint32_t n_prompt)
{
    if (!(r->flags & PROTO_REQ_SCORE) || (r->score_from >= 0 && (uint32_t)r->score_from <= n_prompt))
        return 0;
    return rd_fail(RD_EINVAL, "request %llu: score_from = %d; expected 0..%u (a position of the prompt's %u tokens)",
                   (unsigned long long)r->client_req_id, r->score_from, n_prompt, n_prompt);
}

int proto_check_request(const proto_request *r, const proto_hello_ok *lim)
{
    unsigned long long id = (unsigned long long)r->client_req_id;
    unsigned version = lim->version >= 2 ? lim->version : 1;
    uint32_t allowed = PROTO_REQ_FLAGS;
    if (version < 2)
        allowed &= ~PROTO_REQ_FLAGS_V2;
    if (version < 4)
        allowed &= ~PROTO_REQ_FLAGS_V4;
    if (version < 5)
        allowed &= ~PROTO_REQ_FLAGS_V5;
    if (version < 6)
        allowed &= ~PROTO_REQ_FLAGS_V6;
    if (r->flags & ~allowed)
        return rd_fail(RD_EINVAL, "request %llu: flags 0x%x have undefined bits 0x%x; expected only bits 0x%x "
                       "(protocol version %u)", id, r->flags, r->flags & ~allowed, allowed, version);
    if ((r->flags & PROTO_REQ_RETURN_ROUTES) && !(lim->features & PROTO_FEATURE_ROUTES))
        return rd_fail(RD_EINVAL, "request %llu: routed experts asked (return_routes), but the model (%.*s) is not a "
                       "mixture of experts; expected the flag only where HELLO_OK.features has ROUTES", id,
                       (int)lim->architecture.len, lim->architecture.len ? lim->architecture.ptr : "");
    int lora = (r->flags & PROTO_REQ_LORA) != 0;
    if (lora && (r->lora.len < 1 || r->lora.len > PROTO_MAX_LORA_NAME || !r->lora.ptr))
        return rd_fail(RD_EINVAL, "request %llu: flag LORA with an adapter name of %u bytes; expected 1..%u bytes", id,
                       r->lora.len, PROTO_MAX_LORA_NAME);
    /* the daemon looks the name up as a C string: a NUL inside would name another adapter */
    if (lora && memchr(r->lora.ptr, 0, r->lora.len))
        return rd_fail(RD_EINVAL, "request %llu: the adapter name has a NUL byte at %u; expected a name without one",
                       id, (unsigned)((const char *)memchr(r->lora.ptr, 0, r->lora.len) - r->lora.ptr));
    if (r->n < 1 || r->n > lim->max_n)
        return rd_fail(RD_EINVAL, "request %llu: n = %u; expected 1..%u", id, r->n, lim->max_n);
    int score = (r->flags & PROTO_REQ_SCORE) != 0;
    if (r->max_tokens < (score ? 0u : 1u) || r->max_tokens > lim->max_tokens)
        return rd_fail(RD_EINVAL, "request %llu: max_tokens = %u; expected %u..%u%s", id, r->max_tokens,
                       score ? 0u : 1u, lim->max_tokens, r->max_tokens == 0 ? " (0 only for a request that scores its "
                       "prompt: flag SCORE, protocol version 5)" : "");
    if (r->max_tokens == 0 && r->n != 1)
        return rd_fail(RD_EINVAL, "request %llu: n = %u with max_tokens = 0; expected n = 1 (a request that only "
                       "scores its prompt has one sample)", id, r->n);
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
    if (r->flags & PROTO_REQ_SAMPLING)
        TRY(check_sampling(r, lim));
    if (score && r->score_from < 0)
        return rd_fail(RD_EINVAL, "request %llu: score_from = %d; expected 0..n_prompt (a position of the prompt)", id,
                       r->score_from);
    uint64_t worst = proto_result_max_bytes(r->max_tokens, (r->flags & PROTO_REQ_PROCESSED_LOGPROBS) != 0,
                                            r->logprobs_topk);
    /* the scores of a token prompt (a text prompt's are the daemon's to count once it is tokenized) */
    uint64_t scored = score && !(r->flags & PROTO_REQ_PROMPT_IS_TEXT) && (uint32_t)r->score_from <= r->n_prompt
                          ? r->n_prompt - (uint32_t)r->score_from : 0;
    if (score && !(r->flags & PROTO_REQ_PROMPT_IS_TEXT))
        worst += proto_scores_bytes(scored, r->logprobs_topk);
    if (lora)
        worst += proto_lora_bytes(r->lora.len);
    if (worst + PROTO_RESULTS_OVERHEAD > lim->max_message_bytes)
        return rd_fail(RD_EINVAL, "request %llu: a result of max_tokens = %u%s%s with these log-prob options can take "
                       "%llu bytes; expected it to fit max_message_bytes = %llu", id, r->max_tokens,
                       score ? " and its prompt's scores" : "", lora ? " and its adapter's name" : "",
                       (unsigned long long)(worst + PROTO_RESULTS_OVERHEAD),
                       (unsigned long long)lim->max_message_bytes);
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
    TRY(proto_check_score_from(r, r->n_prompt));
    return check_ids("prompt_ids", r->client_req_id, r->prompt, r->n_prompt, lim->vocab_size);
}
