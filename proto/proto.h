/* proto.h - the learner wire protocol: message structs, encode and decode.
 *
 * proto/PROTOCOL.md is the specification (byte layouts, state machine, error
 * codes); this file is its C implementation, shared by the daemon and the C
 * client. tools/python/rolloutd/proto.py is the Python one; both decode the
 * golden vectors in proto/testdata/.
 *
 * A frame is a 16-byte header (magic "RLDP", u16 version, u16 type, u32 body
 * length, u32 flags = 0) and a body of little-endian fixed-width fields,
 * u32-length-prefixed UTF-8 strings and u32-count-prefixed arrays.
 *
 * Decoding copies every array and string out of the frame into memory owned
 * by the proto_msg (an arena freed by proto_msg_free), so the received buffer
 * can be freed as soon as proto_decode returns, and arrays are aligned for
 * direct use (int32_t token ids, float log-probs). The one exception is
 * UPDATE_CHUNK: its data points into the received buffer (weight bytes are
 * not copied twice), so that buffer must outlive the use of the data. Every
 * count is checked against the bytes left in the frame before anything is
 * allocated: arena memory stays below PROTO_ARENA_BOUND(frame bytes).
 *
 * Encoding appends one frame to a growable proto_buf. Arrays in the structs
 * are read, never owned: the daemon can point a proto_result at an engine
 * result's arrays and encode without copying them first. */
#ifndef RD_PROTO_H
#define RD_PROTO_H

#include <stddef.h>
#include <stdint.h>

#define PROTO_MAGIC "RLDP"                  /* bytes 52 4C 44 50 */
#define PROTO_VERSION 6                     /* the newest version this code speaks (2: routing replay; 3: delta pushes,
                                               serve_dtype; 4: a request's sampling tail; 5: prompt scoring; 6: LoRA
                                               adapters) */
#define PROTO_VERSION_MIN 1                 /* the oldest; frames are written in it unless proto_msg.version says */
#define PROTO_HEADER_BYTES 16
#define PROTO_DEFAULT_MAX_MESSAGE (64u << 20) /* bytes; the daemon announces its own */
#define PROTO_MAX_CLIENT_NAME 256           /* bytes; a longer HELLO name is INVALID_PARAMS */
#define PROTO_MAX_ERROR_MESSAGE 4096        /* bytes; proto_encode_error cuts longer ones */
/* Arena bytes a decode of a frame of n bytes allocates (at most; once, at the
 * first array or string): 4n + 256 for an UPDATE_BEGIN or ADAPTER_BEGIN (a 29-byte manifest
 * tensor becomes an 88-byte proto_tensor plus its name), 3n + 256 for every
 * other message (a 56-byte request is a 120-byte proto_request, an 88-byte
 * result a 192-byte proto_result, since version 6 gave both an adapter name). */
#define PROTO_ARENA_BOUND(n) (4 * (size_t)(n) + 256)

/* Message types, from the one message table (proto/messages.def, which also
 * says what each is for). A reply's type is its request's | 0x80. */
typedef enum {
#define PROTO_MSG(NAME, CODE, DIR, MEMBER, STRUCT, LAYOUT, ELEM, ARRAY) PROTO_##NAME = CODE,
#include "proto/messages.def"
#undef PROTO_MSG
} proto_type;

/* Error codes carried by ERROR replies and by SUBMIT_OK items (PROTOCOL.md,
 * "Error codes", says when each is sent). */
typedef enum {
    PROTO_E_BAD_MAGIC = 1,
    PROTO_E_UNSUPPORTED_VERSION = 2,
    PROTO_E_MALFORMED = 3,          /* truncated, trailing bytes, bad count, bad UTF-8, reserved != 0 */
    PROTO_E_TOO_LARGE = 4,          /* frame or declared length above the receiver's limit */
    PROTO_E_UNKNOWN_TYPE = 5,
    PROTO_E_UNEXPECTED = 6,         /* valid message, wrong state or direction */
    PROTO_E_INVALID_PARAMS = 7,
    PROTO_E_BUSY = 8,
    PROTO_E_UNKNOWN_CLIENT = 9,
    PROTO_E_UNKNOWN_REQUEST = 10,
    PROTO_E_SHUTTING_DOWN = 11,
    PROTO_E_INTERNAL = 12,
    PROTO_E_CHECKSUM = 13,          /* a chunk's or a tensor's crc32c does not match its bytes */
    PROTO_E_STALE_VERSION = 14,     /* an update version not above the serving (or committing) one */
    PROTO_E_UPDATE_CONFLICT = 15,   /* another weight transfer is in progress */
    PROTO_E_UNAUTHORIZED = 16,      /* the connection has not proved the shared secret (§14) */
    PROTO_E_FORBIDDEN = 17,         /* an UPDATE_FORWARD target outside the daemon's relay_allow (§10.11) */
    /* version 3: a delta tensor (§10.14) the daemon cannot apply; refused at UPDATE_BEGIN, nothing staged */
    PROTO_E_BASE_MISMATCH = 18,     /* its base_version is not the serving version */
    PROTO_E_DTYPE_MISMATCH = 19,    /* the daemon holds that tensor in another dtype, or not from a push */
    PROTO_E_BASE_QUANTIZED = 20,    /* the daemon holds that tensor quantized (serve_dtype q8_0): no exact base */
} proto_err;

/* Flag bits. Bits not listed must be 0 (PROTOCOL.md says which message checks them). */
#define PROTO_HELLO_OK_RESUMED 0x1u     /* client_id was known: its requests and results were kept */
#define PROTO_HELLO_OK_TEXT 0x2u        /* the daemon tokenizes text prompts */
#define PROTO_HELLO_OK_CHAT 0x4u        /* the daemon can apply the model's chat template */
#define PROTO_HELLO_OK_FLAGS 0x7u

#define PROTO_REQ_HAS_SEED 0x1u         /* seed is used; else the daemon picks one (returned in results) */
#define PROTO_REQ_PROCESSED_LOGPROBS 0x2u
#define PROTO_REQ_IGNORE_EOS 0x4u
#define PROTO_REQ_PROMPT_IS_TEXT 0x8u   /* prompt is UTF-8 text, else token ids */
#define PROTO_REQ_CHAT_TEMPLATE 0x10u   /* wrap the text as a user turn in the chat template */
#define PROTO_REQ_RETURN_ROUTES 0x20u   /* version 2: results carry the experts every position was routed to */
#define PROTO_REQ_SAMPLING 0x40u        /* version 4: a sampling tail follows the prompt (proto_sampling) */
#define PROTO_REQ_SCORE 0x80u           /* version 5: score the prompt from score_from on (the score tail, i32
                                           score_from, follows the sampling tail or the prompt); max_tokens may
                                           then be 0 (score only, n = 1) */
#define PROTO_REQ_LORA 0x100u          /* version 6: run the samples under a LoRA adapter (the lora tail, u16 name
                                           length + the name, follows the score tail, the sampling tail or the
                                           prompt) */
#define PROTO_REQ_FLAGS 0x1FFu
#define PROTO_REQ_FLAGS_V2 0x20u        /* the bits version 2 added (undefined in a version-1 request) */
#define PROTO_REQ_FLAGS_V4 0x40u        /* the bits version 4 added (undefined before version 4: no tail is read) */
#define PROTO_REQ_FLAGS_V5 0x80u        /* the bits version 5 added (undefined before version 5: no tail is read) */
#define PROTO_REQ_FLAGS_V6 0x100u       /* the bits version 6 added (undefined before version 6: no tail is read) */
#define PROTO_SCORE_TAIL_BYTES 4u       /* a request's score tail: i32 score_from */
#define PROTO_MAX_LORA_NAME 127u        /* bytes of an adapter name in a lora tail (1..127; the engine's
                                           LORA_NAME_MAX less its NUL) */
#define PROTO_LORA_TAIL_BYTES 2u        /* a request's lora tail without its name: u16 name length */
#define PROTO_SAMPLING_TAIL_BYTES 20u   /* the sampling tail without its bias pairs (8 bytes each) */
#define PROTO_MAX_BIAS 1024u            /* logit_bias entries a request may carry (the engine's ENG_MAX_BIAS) */
#define PROTO_MAX_ABS_BIAS 100.0f       /* a bias is in [-100, 100] (OpenAI's and the HTTP doors' range) */

#define PROTO_SUBMIT_DUPLICATE 0x1u     /* client_req_id was already known: accepted, not run twice */
#define PROTO_SUBMIT_OK_FLAGS 0x1u

#define PROTO_RESULT_PROCESSED 0x1u     /* logprobs_processed is present */
#define PROTO_RESULT_ROUTES 0x2u        /* version 2: the routes follow the spans */
#define PROTO_RESULT_SERVE 0x4u         /* version 3: the serve_dtype tail follows (the routes, else the spans) */
#define PROTO_RESULT_SCORES 0x8u        /* version 5: the prompt's scores follow (the serve tail, the routes, else
                                           the spans): proto_scores */
#define PROTO_RESULT_LORA 0x10u        /* version 6: the lora tail follows (the scores, the serve tail, the
                                           routes, else the spans): the adapter's name and version */
#define PROTO_RESULT_FLAGS 0x1Fu
#define PROTO_RESULT_FLAGS_V2 0x2u      /* the bits version 2 added (MALFORMED in a version-1 frame) */
#define PROTO_RESULT_FLAGS_V3 0x4u      /* the bits version 3 added (MALFORMED before version 3) */
#define PROTO_RESULT_FLAGS_V5 0x8u      /* the bits version 5 added (MALFORMED before version 5) */
#define PROTO_RESULT_FLAGS_V6 0x10u     /* the bits version 6 added (MALFORMED before version 6) */
/* A BITS field's B column: the bits each version after 1 added, a byte per
 * version (bits B & 0xFF came in version 2, (B >> 8) & 0xFF in version 3,
 * (B >> 24) & 0xFF in version 5, (B >> 32) & 0xFF in version 6):
 * PROTO_RESULT_FLAGS_V2 | PROTO_RESULT_FLAGS_V3 << 8 | PROTO_RESULT_FLAGS_V5 << 24 |
 * PROTO_RESULT_FLAGS_V6 << 32. */
#define PROTO_RESULT_FLAGS_LATER 0x1008000402ull
#define PROTO_SCORES_HEAD_BYTES 12u     /* a result's scores before their arrays: score_from, n_scored, reserved */
#define PROTO_RESULT_LORA_BYTES 10u     /* a result's lora tail without its name: u16 name length, u64 version */

/* serve_dtype (version 3): what the daemon serves a pushed policy as. In
 * UPDATE_BEGIN 0 means "the daemon's configured serve_dtype"; in a result
 * (PROTO_RESULT_SERVE) the codes say what produced the tokens. */
#define PROTO_SERVE_CONFIG 0u           /* UPDATE_BEGIN only: the daemon's config key serve_dtype */
#define PROTO_SERVE_AS_PUSHED 1u        /* the pushed dtype (f32/f16/bf16), or the file's for weights loaded */
#define PROTO_SERVE_Q8_0 2u             /* the pushed linears quantized to Q8_0 at COMMIT */
#define PROTO_SERVE_Q4_K 3u             /* the layers' linears to Q4_K (Q8_0 where Q4_K cannot go) at COMMIT */
#define PROTO_SERVE_FP8 4u              /* the layers' dense linears to FP8 E4M3 blocks at COMMIT */
#define PROTO_SERVE_MAX 4u
#define PROTO_SERVE_TAIL_BYTES 4u       /* a result's serve tail: serve_dtype u8, serve_dtype_first u8, reserved u16 */

#define PROTO_ABORT_ALL 0x1u            /* abort every request of the client (client_req_id must be 0) */
#define PROTO_ABORT_FLAGS 0x1u

#define PROTO_FEATURE_WEIGHT_UPDATE 0x1u /* HELLO_OK.features: UPDATE_* messages are served */
#define PROTO_FEATURE_RELAY 0x2u        /* UPDATE_FORWARD, UPDATE_PREPARE and WEIGHTS_SYNC are served (§10.11) */
#define PROTO_FEATURE_ROUTES 0x4u       /* version 2: a mixture-of-experts model; requests may ask RETURN_ROUTES (§4.6) */
#define PROTO_FEATURE_LORA_PUSH 0x8u    /* ADAPTER_BEGIN is served: LoRA adapters pushed as transfers (§10.15) */

#define PROTO_ADAPTER_RSLORA 0x1u       /* ADAPTER_BEGIN.flags: scale alpha / sqrt(rank) (use_rslora) */
#define PROTO_ADAPTER_FLAGS 0x1u
#define PROTO_MAX_ADAPTER_NAME 127      /* bytes of an adapter's name */

#define PROTO_FORWARD_AUTH 0x1u         /* UPDATE_FORWARD: the next daemon's lane challenges; prove with key */
#define PROTO_FORWARD_FLAGS 0x1u

/* UPDATE_PREPARE_OK.state and .forward */
enum { PROTO_PREP_STAGING = 0, PROTO_PREP_BUILDING = 1, PROTO_PREP_READY = 2 };
enum { PROTO_FWD_NONE = 0, PROTO_FWD_SENDING = 1, PROTO_FWD_DONE = 2, PROTO_FWD_FAILED = 3 };

#define PROTO_CHUNK_OK_DUPLICATE 0x1u   /* the same chunk was already staged: acknowledged, no effect */
#define PROTO_CHUNK_OK_FLAGS 0x1u

/* Weight-update modes (UPDATE_BEGIN.mode). */
enum { PROTO_MODE_CONTINUE = 0, PROTO_MODE_DRAIN = 1, PROTO_MODE_ABORT = 2 };
/* TENSOR.flags (version 3): the tensor's chunks carry a delta (§10.14)
 * against its bytes at base_version, wire_bytes long, decoding to nbytes
 * whose CRC-32C is crc32c. */
#define PROTO_TENSOR_DELTA 0x1u
#define PROTO_TENSOR_FLAGS 0x1u
#define PROTO_TENSOR_FLAGS_LATER 0x100u /* B column: PROTO_TENSOR_FLAGS << 8, every TENSOR flag came in version 3 */
/* Tensor dtypes in an update manifest. */
enum { PROTO_DTYPE_F32 = 0, PROTO_DTYPE_F16 = 1, PROTO_DTYPE_BF16 = 2 };
#define PROTO_MAX_DIMS 4
#define PROTO_MAX_TENSOR_NAME 256       /* bytes; a longer name is MALFORMED */

#define PROTO_BYE_DISCARD 0x1u          /* abort in-flight work, drop retained results, forget now */
#define PROTO_BYE_FLAGS 0x1u

/* Finish reasons in results (same numbers as the engine's finish_reason). */
enum { PROTO_FINISH_STOP = 1, PROTO_FINISH_LENGTH = 2, PROTO_FINISH_ABORT = 3, PROTO_FINISH_ERROR = 4 };

/* A UTF-8 string. Decoded strings are followed by a NUL (not counted in len),
 * so ptr is also a C string when the text has no NUL inside. For encoding,
 * ptr may be NULL when len is 0. */
typedef struct {
    const char *ptr;
    uint32_t len;               /* bytes */
} proto_str;

/* HELLO: client -> daemon. */
typedef struct {
    uint64_t client_id;         /* 0 = new client; else the id to resume */
    uint16_t min_version;       /* protocol versions the client speaks */
    uint16_t max_version;
    uint32_t flags;             /* none defined: 0 */
    proto_str client_name;      /* free text for logs and /status */
} proto_hello;

/* HELLO_OK: the model, the limits and the client's id. */
typedef struct {
    uint64_t client_id;         /* assigned (HELLO had 0) or resumed */
    uint16_t version;           /* protocol version chosen for this client */
    uint32_t flags;             /* PROTO_HELLO_OK_* */
    uint64_t features;          /* PROTO_FEATURE_* bits (optional features the daemon serves) */
    uint64_t weight_version;    /* policy version now serving */
    uint32_t vocab_size;        /* token ids are 0..vocab_size-1 */
    uint32_t max_context;       /* tokens: prompt + generated */
    uint32_t n_layers;
    uint32_t dim;               /* hidden size */
    uint32_t n_heads;
    uint32_t n_kv_heads;
    int32_t eos_id;             /* -1 = none */
    uint32_t max_prompt_tokens;
    uint64_t max_message_bytes; /* largest frame (header included) either side may send */
    uint32_t max_n;             /* samples per request */
    uint32_t max_requests_per_submit;
    uint32_t max_tokens;        /* generated tokens per sample */
    uint32_t max_stop_ids;
    uint32_t max_logprobs_topk;
    uint32_t retention_results; /* results kept per client until acked (plus reserved in-flight) */
    uint64_t retention_bytes;   /* bytes of encoded results likewise */
    uint32_t max_wait_ms;       /* FETCH wait_ms is capped at this */
    uint32_t client_ttl_s;      /* a client silent this long is forgotten */
    uint32_t pending_results;   /* results held for this client now (a resumed client) */
    uint32_t inflight_samples;  /* samples of this client not finished yet */
    proto_str model_name;
    proto_str architecture;     /* "llama", ... */
    proto_str backend;          /* "cpu", "cuda" */
    proto_str server;           /* software and version, e.g. "rolloutd 0.1.0" */
} proto_hello_ok;

/* A request's sampling tail (version 4, flag PROTO_REQ_SAMPLING): vLLM's
 * penalties, min_tokens and logit_bias, applied as DESIGN.md's sampling table
 * orders them (bias and the min-tokens mask, the repetition penalty over
 * prompt + output, frequency and presence over output counts, then
 * temperature and truncation). A request without the tail samples as if it
 * held the defaults: 1, 0, 0, 0 and no bias. proto_check_request checks the
 * ranges; the decoder only the structure. */
typedef struct {
    float repetition_penalty;   /* finite, > 0; 1 = off: a token of the prompt or the output has its logit x
                                   become x / r (x > 0) or x * r */
    float frequency_penalty;    /* [-2, 2]; 0 = off: minus f times the token's count in the output */
    float presence_penalty;     /* [-2, 2]; 0 = off: minus p once if the token is in the output */
    uint32_t min_tokens;        /* 0..max_tokens: EOS and stop ids are masked (-inf) until this many tokens are
                                   generated; 0 = off */
    uint32_t n_bias;            /* logit_bias entries, 0..PROTO_MAX_BIAS */
    const int32_t *bias_ids;    /* [n_bias] distinct token ids, each 0..vocab_size-1 */
    const float *bias_vals;     /* [n_bias] finite, in [-100, 100]: added to the token's logit before the penalties */
} proto_sampling;

/* One request of a SUBMIT: a prompt and how to sample n continuations. */
typedef struct {
    uint64_t client_req_id;     /* the client's id, unique per client */
    uint32_t n;                 /* samples, >= 1 */
    uint32_t max_tokens;        /* generated tokens per sample, >= 1 */
    float temperature;          /* 0 = greedy */
    float top_p;                /* (0, 1]; 1 = off */
    int32_t top_k;              /* >= 0; 0 = off */
    float min_p;                /* [0, 1]; 0 = off */
    uint64_t seed;              /* used when flags has PROTO_REQ_HAS_SEED */
    uint32_t logprobs_topk;     /* alternatives reported per token */
    uint32_t flags;             /* PROTO_REQ_*; checked by proto_check_request, not by decode */
    int32_t score_from;         /* version 5, flags with PROTO_REQ_SCORE: the first prompt position scored,
                                   0..n_prompt (position 0 has no log-prob: nothing comes before it); on the
                                   wire the score tail, after the sampling tail. 0 otherwise: encoding writes
                                   it exactly when the flag is set in a version-5 frame (and refuses a non-zero
                                   one elsewhere). Here, beside flags, where the struct has room for it */
    uint32_t n_stop;
    const int32_t *stop_ids;    /* [n_stop] extra stop token ids */
    uint32_t n_prompt;          /* token prompt (flags without PROMPT_IS_TEXT); 0 for text */
    const int32_t *prompt;      /* [n_prompt] token ids */
    proto_str text;             /* text prompt (flags with PROMPT_IS_TEXT); empty otherwise */
    const proto_sampling *sampling; /* version 4, flags with PROTO_REQ_SAMPLING: the sampling tail after the
                                       prompt; NULL otherwise (the defaults). Encoding writes it exactly when
                                       the flag is set in a version-4 frame (and refuses it elsewhere) */
    proto_str lora;             /* version 6, flags with PROTO_REQ_LORA: the LoRA adapter the samples run under
                                   (its name as the daemon loaded it), 1..PROTO_MAX_LORA_NAME bytes of UTF-8;
                                   on the wire the lora tail, after the score tail. Empty otherwise (the base
                                   model; decoded as "", so ptr is always a C string): encoding writes it
                                   exactly when the flag is set in a version-6 frame (and refuses a name
                                   elsewhere, and the flag there without one) */
} proto_request;

/* SUBMIT: client -> daemon. */
typedef struct {
    uint64_t client_id;
    uint32_t n_requests;
    const proto_request *requests; /* [n_requests] */
} proto_submit;

/* SUBMIT_OK: one item per request, in the SUBMIT's order. */
typedef struct {
    uint64_t client_req_id;
    uint32_t status;            /* 0 = accepted, else a PROTO_E_* code */
    uint32_t flags;             /* PROTO_SUBMIT_DUPLICATE */
    proto_str message;          /* why it was refused; empty when accepted */
} proto_submit_item;

typedef struct {
    uint32_t n_items;
    const proto_submit_item *items; /* [n_items] */
} proto_submit_ok;

/* FETCH: client -> daemon; a long-poll for results, carrying the ack. */
typedef struct {
    uint64_t client_id;
    uint64_t ack_seq;           /* every result with seq <= ack_seq was received (0 = none) */
    uint32_t max_results;       /* 0 = only ack, return at once */
    uint32_t wait_ms;           /* wait this long for a first result (capped at max_wait_ms) */
    uint64_t max_bytes;         /* RESULTS frame budget; 0 = max_message_bytes */
} proto_fetch;

/* A policy-version span: generated tokens [start, end) came from version. */
typedef struct {
    uint32_t start;             /* token index into token_ids */
    uint32_t end;               /* exclusive */
    uint64_t version;
} proto_span;

/* The prompt's scores in a result (flags PROTO_RESULT_SCORES; version 5): the
 * raw log-prob (temperature 1, before any edit or truncation) of each prompt
 * token from score_from on, given the tokens before it, with the bits a draw
 * of that token from the same logits has (so scoring prompt + completion from
 * the completion's start gives back the completion's sampled log-probs); NaN
 * at position 0, which has nothing before it. The alternatives per position
 * are the result's top_k (the request's logprobs_topk), as for its tokens. */
typedef struct {
    uint32_t score_from;        /* the prompt position logprobs[0] is of, 0..n_prompt */
    uint32_t n_scored;          /* positions carried: n_prompt - score_from, or 0 (the daemon holds no scores:
                                   a sample that failed before its prompt ran) */
    const float *logprobs;      /* [n_scored] */
    const int32_t *top_ids;     /* [n_scored][top_k] the top_k highest raw log-probs per position; -1 pads */
    const float *top_logprobs;  /* [n_scored][top_k]; -inf pads */
} proto_scores;

/* One finished sample. */
typedef struct {
    uint64_t seq;               /* per-client sequence number, from 1, gapless */
    uint64_t client_req_id;
    uint32_t sample_idx;        /* 0..n-1 */
    uint8_t finish;             /* PROTO_FINISH_* */
    uint8_t flags;              /* PROTO_RESULT_PROCESSED */
    uint16_t top_k;             /* alternatives per token in top_ids/top_logprobs (0 = none) */
    uint32_t n_preempt;         /* times the sample was preempted and recomputed */
    uint32_t n_prompt;          /* prompt tokens (after tokenizing a text prompt) */
    uint64_t seed;              /* the seed sampling used (the request's, or the daemon's pick) */
    uint64_t version_admit;     /* weight version when the request was admitted */
    uint64_t version_finish;    /* weight version when the sample finished */
    uint64_t queued_us;         /* microseconds from acceptance to first scheduled */
    uint64_t first_token_us;    /* from acceptance to the first generated token (0: none) */
    uint64_t total_us;          /* from acceptance to finish */
    uint32_t n_tokens;          /* generated tokens (a stop token is included) */
    uint32_t n_spans;           /* 0 when n_tokens is 0, else >= 1 */
    const int32_t *token_ids;   /* [n_tokens] */
    const float *logprobs;      /* [n_tokens] raw log-prob (temperature 1), fp32 */
    const float *logprobs_processed; /* [n_tokens] when flags has PROCESSED, else NULL */
    const int32_t *top_ids;     /* [n_tokens][top_k], row-major; -1 pads rows with fewer */
    const float *top_logprobs;  /* [n_tokens][top_k]; -inf pads */
    const proto_span *spans;    /* [n_spans] contiguous, covering [0, n_tokens), versions increasing */
    /* Routing replay (flags has PROTO_RESULT_ROUTES; version 2): for each
     * position that ran through the model, prompt then generated, each
     * layer's top-k experts, highest routing weight first. */
    uint32_t n_routes;          /* positions (n_prompt + n_tokens - 1 when all ran; fewer after an early abort) */
    uint16_t route_layers;      /* >= 1 */
    uint8_t route_k;            /* experts per position and layer, >= 1 */
    uint8_t route_width;        /* bytes per id: 1 (routes is uint8_t[]), 2 (uint16_t[]) or 4 (int32_t[]) */
    const void *routes;         /* [n_routes][route_layers][route_k] ids of route_width bytes (host order) */
    /* The policy's serve_dtype (flags has PROTO_RESULT_SERVE; version 3):
     * PROTO_SERVE_AS_PUSHED or _Q8_0 (0: not known, a version older than the
     * daemon's history of pushes). */
    uint8_t serve_dtype;        /* of the weights at version_finish */
    uint8_t serve_dtype_first;  /* of the first span's version (differs only when a push changed it meanwhile) */
    /* The prompt's scores (flags has PROTO_RESULT_SCORES; version 5): set
     * exactly when the flag is, NULL otherwise. */
    const proto_scores *scores;
    /* The LoRA adapter the sample ran under (flags has PROTO_RESULT_LORA;
     * version 6: results of a request that named one). Empty and 0 without
     * the flag (decoded as ""); encoding refuses them there. */
    proto_str lora;             /* its name, 1..PROTO_MAX_LORA_NAME bytes of UTF-8 */
    uint64_t lora_version;      /* the adapter's version the tokens were drawn under (1 for a name's first load,
                                   +1 per reload); 0: not known (the sample failed before it ran) */
} proto_result;

/* RESULTS: the reply to FETCH. */
typedef struct {
    uint64_t ack_seq;           /* the client's acknowledged seq as the daemon now has it */
    uint32_t pending_results;   /* results held after these (not in this reply) */
    uint32_t inflight_samples;  /* accepted samples not finished yet */
    uint32_t n_results;
    const proto_result *results; /* [n_results], seq increasing */
} proto_results;

/* ABORT: client -> daemon. */
typedef struct {
    uint64_t client_id;
    uint64_t client_req_id;     /* 0 with PROTO_ABORT_ALL */
    uint32_t flags;             /* PROTO_ABORT_ALL */
} proto_abort;

typedef struct {
    uint32_t n_requests;        /* requests aborted now */
    uint32_t n_samples;         /* their unfinished samples, delivered later with finish = abort */
} proto_abort_ok;

/* STATUS has no body. STATUS_OK carries the /status JSON document. */
typedef struct {
    proto_str json;
} proto_status_ok;

/* BYE: client -> daemon. */
typedef struct {
    uint64_t client_id;
    uint32_t flags;             /* PROTO_BYE_DISCARD */
} proto_bye;

typedef struct {
    uint32_t pending_results;   /* still to be fetched (0 and 0: forgotten now) */
    uint32_t inflight_samples;
} proto_bye_ok;

/* AUTH_BEGIN (client nonce), AUTH_CHALLENGE (daemon nonce), AUTH (the
 * client's proof) and AUTH_OK (the daemon's): 32 bytes each (§14). */
#define PROTO_AUTH_BYTES 32
typedef struct {
    uint8_t bytes[PROTO_AUTH_BYTES];
} proto_auth;

/* ERROR: the reply to any request that failed as a whole. */
typedef struct {
    uint32_t code;              /* PROTO_E_*, >= 1 */
    uint16_t request_type;      /* the failed request's type, 0 if its header was unreadable */
    uint16_t version_max;       /* highest protocol version the sender speaks */
    proto_str message;          /* what was wrong and what was expected */
} proto_error;

/* One tensor of an update manifest (HF name and layout). */
typedef struct {
    proto_str name;             /* e.g. "model.layers.0.self_attn.q_proj.weight" */
    uint8_t dtype;              /* PROTO_DTYPE_* */
    uint8_t n_dims;             /* 1..PROTO_MAX_DIMS */
    uint64_t shape[PROTO_MAX_DIMS]; /* [n_dims], outermost first; unused entries 0 */
    uint16_t flags;             /* PROTO_TENSOR_DELTA (version 3) */
    uint32_t crc32c;            /* of the tensor's nbytes bytes (a delta's: of the new bytes, after applying) */
    uint64_t nbytes;            /* product of shape x dtype size */
    uint64_t wire_bytes;        /* DELTA: bytes its chunks carry (the encoded delta, >= 1); else 0 */
    uint64_t base_version;      /* DELTA: the weight version the delta applies to; else 0 */
} proto_tensor;

/* UPDATE_BEGIN: client -> daemon; opens a weight transfer. */
typedef struct {
    uint64_t client_id;
    uint64_t version;           /* the new policy version; above the serving one */
    uint8_t mode;               /* PROTO_MODE_* */
    uint8_t serve_dtype;        /* version 3: PROTO_SERVE_* for this push (0: the daemon's config); 0 before */
    uint32_t window;            /* chunks the sender wants in flight, >= 1 */
    uint32_t max_chunk_bytes;   /* largest chunk data the sender will send, >= 1 */
    uint64_t total_bytes;       /* bytes its chunks carry: the sum of the tensors' nbytes (a delta's wire_bytes) */
    uint32_t n_tensors;
    const proto_tensor *tensors; /* [n_tensors] */
} proto_update_begin;

/* ADAPTER_BEGIN: client -> daemon; opens the transfer of a LoRA adapter
 * (§10.15), answered with ADAPTER_BEGIN_OK (UPDATE_BEGIN_OK's layout). */
typedef struct {
    uint64_t client_id;
    uint64_t version;           /* the adapter's version; above the one resident under name, if any */
    uint8_t flags;              /* PROTO_ADAPTER_RSLORA */
    uint32_t rank;              /* r of every pair */
    float lora_alpha;           /* the scale is lora_alpha / rank (rsLoRA: / sqrt(rank)) */
    uint32_t window;            /* chunks the sender wants in flight, >= 1 */
    uint32_t max_chunk_bytes;   /* largest chunk data the sender will send, >= 1 */
    uint64_t total_bytes;       /* bytes its chunks carry */
    proto_str name;             /* the adapter's name, 1..PROTO_MAX_ADAPTER_NAME bytes */
    uint32_t n_tensors;
    const proto_tensor *tensors; /* [n_tensors]: PEFT names, base_model.model.<module>.lora_{A,B}.weight */
} proto_adapter_begin;

typedef struct {
    uint64_t xfer_id;           /* names the transfer in CHUNK/COMMIT/ABORT; never 0 */
    uint32_t window;            /* chunks the daemon stages at once (<= requested) */
    uint32_t max_chunk_bytes;   /* granted (<= requested) */
    uint64_t staging_bytes;     /* bytes the daemon set aside */
    uint16_t data_port;         /* TCP port of the data lane on the daemon's host (§10.10); 0 = none */
} proto_update_begin_ok;

/* UPDATE_CHUNK: a slice of one tensor's bytes. The decoded data points into
 * the received frame, unaligned and not copied (the one exception to "decoded
 * data lives in the arena"): keep the frame until data is consumed. For
 * encoding, data may be NULL when len is 0. */
typedef struct {
    uint64_t xfer_id;
    uint32_t chunk_seq;         /* the sender's chunk number, echoed in the ack */
    uint32_t tensor_index;      /* into the manifest */
    uint64_t offset;            /* bytes into the tensor */
    uint32_t crc32c;            /* of data */
    uint32_t len;               /* bytes of data */
    const uint8_t *data;        /* [len] */
} proto_update_chunk;

typedef struct {
    uint64_t xfer_id;
    uint32_t chunk_seq;
    uint32_t flags;             /* PROTO_CHUNK_OK_DUPLICATE */
    uint64_t bytes_staged;      /* of the transfer so far */
    uint64_t total_bytes;
} proto_update_chunk_ok;

/* UPDATE_COMMIT and UPDATE_ABORT carry only the transfer id. */
typedef struct {
    uint64_t xfer_id;
} proto_update_ref;

typedef struct {
    uint64_t version;           /* now serving */
    uint64_t stall_us;          /* the engine did not step for this long to swap */
    uint64_t wait_us;           /* from the COMMIT's arrival to the swap (one step in continue mode) */
    uint64_t staged_us;         /* from UPDATE_BEGIN to the COMMIT */
    uint32_t n_aborted;         /* samples aborted by an abort-mode swap */
} proto_update_commit_ok;

typedef struct {
    uint64_t bytes_freed;       /* staging memory released */
} proto_update_abort_ok;

/* UPDATE_FORWARD: learner -> daemon; relay every verified chunk of xfer_id
 * to the next daemon's data lane as its transfer next_xfer_id (§10.11). */
typedef struct {
    uint64_t xfer_id;           /* this daemon's open transfer */
    uint64_t next_xfer_id;      /* the next daemon's transfer; 0 = stop forwarding */
    uint16_t port;              /* the next daemon's data lane port */
    uint16_t flags;             /* PROTO_FORWARD_AUTH */
    uint32_t window;            /* chunks in flight to the next daemon, >= 1 */
    uint8_t key[PROTO_AUTH_BYTES]; /* the next transfer's lane key, wrapped (§10.12); zeros without AUTH */
    proto_str host;             /* numeric IP of the next daemon's lane, 1..255 bytes (empty when stopping) */
} proto_update_forward;

typedef struct {
    uint64_t xfer_id;
    uint64_t queued_bytes;      /* bytes already staged here, sent to the next daemon first */
} proto_update_forward_ok;

/* UPDATE_PREPARE carries the transfer id (proto_update_ref); its reply: */
typedef struct {
    uint64_t xfer_id;
    uint8_t state;              /* PROTO_PREP_*: READY = verified and built, COMMIT only swaps */
    uint8_t forward;            /* PROTO_FWD_* */
    uint32_t forward_error;     /* FAILED: the next daemon's PROTO_E_* code, 0 for a broken connection */
    uint64_t bytes_staged;      /* verified here */
    uint64_t total_bytes;
    uint64_t forwarded_bytes;   /* acknowledged by the next daemon */
} proto_update_prepare_ok;

/* LANE_AUTH: the first frame of a data lane connection to a daemon with a
 * secret, answering its AUTH_CHALLENGE (§10.12). */
typedef struct {
    uint64_t xfer_id;           /* the one transfer this connection may feed */
    uint8_t proof[PROTO_AUTH_BYTES];
} proto_lane_auth;

/* WEIGHTS_SYNC: client (or a restarted daemon) -> daemon; "push the weights
 * you serve, at their version, to the daemon at url" (§10.13). */
typedef struct {
    uint64_t client_id;
    proto_str url;              /* the target's learner socket, 1..1024 bytes */
} proto_weights_sync;

typedef struct {
    uint64_t version;           /* the version that will be pushed */
} proto_weights_sync_ok;

typedef struct proto_block proto_block;

/* One message. For encoding set type and the matching member; for decoding
 * proto_decode fills it. */
typedef struct {
    uint16_t type;              /* proto_type */
    uint16_t version;           /* decode: the frame's (0 when its header was unreadable or of a version
                                   not spoken); encode: the version to write, 0 = PROTO_VERSION_MIN */
    uint32_t wire_error;        /* after a failed decode: the PROTO_E_* code to reply with */
    union {
        proto_hello hello;
        proto_hello_ok hello_ok;
        proto_submit submit;
        proto_submit_ok submit_ok;
        proto_fetch fetch;
        proto_results results;
        proto_abort abort_req;
        proto_abort_ok abort_ok;
        proto_status_ok status_ok;
        proto_bye bye;
        proto_bye_ok bye_ok;
        proto_auth auth;        /* the four AUTH_* types */
        proto_error error;
        proto_update_begin update_begin;
        proto_update_begin_ok update_begin_ok;
        proto_update_chunk update_chunk;
        proto_update_chunk_ok update_chunk_ok;
        proto_update_ref update_commit;
        proto_update_commit_ok update_commit_ok;
        proto_update_ref update_abort;
        proto_update_abort_ok update_abort_ok;
        proto_update_forward update_forward;
        proto_update_forward_ok update_forward_ok;
        proto_update_ref update_prepare;
        proto_update_prepare_ok update_prepare_ok;
        proto_lane_auth lane_auth;
        proto_weights_sync weights_sync;
        proto_weights_sync_ok weights_sync_ok;
        proto_adapter_begin adapter_begin;
    };
    proto_block *arena;         /* decoded arrays and strings (proto_msg_free) */
    size_t arena_bytes;         /* bytes allocated for them */
} proto_msg;

/* Decodes one frame of len bytes. max_len is the receiver's limit in bytes
 * (0 = no limit beyond the format's). Never reads outside buf[0..len).
 * On success returns 0: out holds the message and owns its arrays until
 * proto_msg_free(out); buf is not referenced, except by an UPDATE_CHUNK's
 * data, which points into buf (keep buf while it is used). On failure returns a negative
 * RD_E* code, rd_errmsg() says what was wrong and what was expected,
 * out->wire_error is the PROTO_E_* code for the ERROR reply, out->type is the
 * header's type when the header was readable (else 0), and nothing is held.
 * Checks in this order: size (TOO_LARGE), header length (MALFORMED), magic,
 * version, body length (TOO_LARGE above max_len, else MALFORMED if it differs
 * from len - 16), header flags (MALFORMED), type (UNKNOWN_TYPE: not defined),
 * then the body (MALFORMED). */
int proto_decode(const uint8_t *buf, size_t len, size_t max_len, proto_msg *out);

/* Frees what a decode allocated; safe on a zeroed or failed message. */
void proto_msg_free(proto_msg *m);

/* A growable byte buffer frames are appended to. */
typedef struct {
    uint8_t *data;
    size_t len;                 /* bytes used */
    size_t cap;                 /* bytes allocated */
} proto_buf;

void proto_buf_init(proto_buf *b);
void proto_buf_reset(proto_buf *b);     /* len = 0, keeps the memory */
void proto_buf_free(proto_buf *b);

/* Appends one frame encoding m (m->type selects the member) in version
 * m->version (0: PROTO_VERSION_MIN). Refuses (RD_EINVAL,
 * nothing appended) what the decoder would reject: a version not spoken,
 * invalid UTF-8, unknown flag bits of that version (except request flags),
 * finish out of range, bad spans, routes with a width other than 1, 2, 4 or
 * no layers or experts, a text flag
 * with token ids, a request's sampling tail other than exactly with flag
 * SAMPLING in a version-4 frame, a non-zero score_from without flag SCORE in a
 * version-5 frame, a result's scores other than exactly with flag SCORES (a
 * version-5 bit), scores with score_from past n_prompt or n_scored other than 0
 * or n_prompt - score_from, a request's adapter name other than exactly with
 * flag LORA in a version-6 frame, a result's name or lora_version without flag
 * LORA (a version-6 bit), an adapter name not 1..PROTO_MAX_LORA_NAME bytes of
 * UTF-8 where the flag is, an update mode, tensor dtype or n_dims out of range, a tensor
 * name not 1..PROTO_MAX_TENSOR_NAME bytes, an array with a count but no data,
 * a body over 4 GiB; RD_ENOTSUP for an undefined type; RD_ENOMEM if the buffer
 * cannot grow. */
int proto_encode(proto_buf *b, const proto_msg *m);

/* Appends an ERROR frame: code (PROTO_E_*; 0 becomes INTERNAL), the failed
 * request's type (0 if unknown), version_max = PROTO_VERSION, and message
 * (NUL-terminated, may be NULL) cut to PROTO_MAX_ERROR_MESSAGE bytes; each byte
 * of invalid UTF-8 (a character cut at the limit included) becomes '?'. */
int proto_encode_error(proto_buf *b, uint32_t code, uint16_t request_type, const char *message);
/* The same ERROR frame in protocol version `version` (0: PROTO_VERSION_MIN), as
 * a reply to a frame of that version. */
int proto_encode_error_version(proto_buf *b, uint16_t version, uint32_t code, uint16_t request_type,
                               const char *message);

/* Encoded size in bytes of one result inside RESULTS, and the largest a
 * result of a request with these parameters can be (spans included), for
 * packing replies under FETCH.max_bytes and reserving retention. A RESULTS
 * frame is PROTO_RESULTS_OVERHEAD bytes plus its results. */
#define PROTO_RESULTS_OVERHEAD (PROTO_HEADER_BYTES + 24)
uint64_t proto_result_bytes(const proto_result *r);
uint64_t proto_result_max_bytes(uint32_t max_tokens, int processed, uint32_t logprobs_topk);
/* Bytes a result's scores add (RESULT_SCORES): their 12-byte head and
 * n_scored x (4 + 8 x top_k); n_scored is n_prompt - score_from. */
uint64_t proto_scores_bytes(uint64_t n_scored, uint32_t top_k);
/* Bytes a result's lora tail adds (RESULT_LORA): u16 name length, the name of
 * name_len bytes, u64 version. */
uint64_t proto_lora_bytes(uint32_t name_len);
/* Bytes the routes of a result add (RESULT_ROUTES): their 8-byte head and
 * positions x layers x k ids of width bytes; positions is at most
 * n_prompt + max_tokens - 1. */
uint64_t proto_routes_bytes(uint64_t positions, uint32_t layers, uint32_t k, uint32_t width);
/* The id width routes of a model with n_experts experts are sent in: 1 byte
 * up to 256 experts, 2 up to 65536, else 4. */
uint8_t proto_route_width(uint32_t n_experts);

/* Checks one decoded request against the daemon's limits and model (lim is the
 * HELLO_OK the daemon sends, lim->version the request's protocol version): flags
 * (RETURN_ROUTES from version 2 on, and only with lim->features ROUTES; SAMPLING from version 4 on; SCORE
 * from version 5 on; LORA from version 6 on, with a name of 1..PROTO_MAX_LORA_NAME bytes without NUL; whether
 * the adapter is loaded is the daemon's question), n, max_tokens (0 only with SCORE, and then n = 1), sampling
 * ranges (NaN refused), stop
 * ids in 0..vocab_size-1, the sampling tail (penalties, min_tokens <= max_tokens, at most PROTO_MAX_BIAS
 * distinct bias ids in 0..vocab_size-1 with finite values in [-100, 100]), score_from >= 0, prompt ids in
 * 0..vocab_size-1, prompt length, prompt + max_tokens within the context, score_from <= n_prompt, the
 * largest result (its scores included) within max_message_bytes, text/chat support. Returns 0 or RD_EINVAL with a
 * message; the SUBMIT_OK item then carries PROTO_E_INVALID_PARAMS. */
int proto_check_request(const proto_request *r, const proto_hello_ok *lim);
/* The length part alone, for a text prompt once the daemon has tokenized it.
 * max_tokens 0 (a request that only scores its prompt) still leaves one
 * position of the context, as the engine needs. */
int proto_check_lengths(uint32_t n_prompt, uint32_t max_tokens, const proto_hello_ok *lim);
/* A scored request's score_from against its prompt of n_prompt tokens
 * (0..n_prompt), for a text prompt once the daemon has tokenized it; 0 or
 * RD_EINVAL with a message naming the request. */
int proto_check_score_from(const proto_request *r, uint32_t n_prompt);

/* "HELLO", "RESULTS", ...; NULL for a type this version does not define. */
const char *proto_type_name(uint16_t type);
/* "BAD_MAGIC", ...; "UNKNOWN" for others. */
const char *proto_err_name(uint32_t code);
/* Bytes per element of a PROTO_DTYPE_* (0 for an unknown one). */
uint32_t proto_dtype_size(uint8_t dtype);
/* 1 for the request types a daemon serves (HELLO..BYE, UPDATE_*), else 0. */
int proto_is_request(uint16_t type);
/* The wire code for a library error (RD_EINVAL/RD_ERANGE -> INVALID_PARAMS,
 * RD_EBUSY -> BUSY, RD_ENOENT -> UNKNOWN_REQUEST, else INTERNAL). */
uint32_t proto_err_from_rd(int rc);

/* ---- The data lane (PROTOCOL.md §10.10): UPDATE_CHUNK frames on a plain TCP
 * stream, read head first so the data can land straight in the staging area. */
#define PROTO_CHUNK_HEAD_BYTES (PROTO_HEADER_BYTES + 32) /* frame header + the chunk's fixed fields */
/* Writes the head of an UPDATE_CHUNK frame for c (c->len bytes of data follow it). */
void proto_lane_encode_head(uint8_t out[PROTO_CHUNK_HEAD_BYTES], const proto_update_chunk *c);
/* Reads a head: the frame header must say a version spoken (PROTO_VERSION_MIN..
 * PROTO_VERSION; heads are written in version 1), type UPDATE_CHUNK, flags
 * 0 and body_len = 32 + len within max_len. On failure returns RD_EFORMAT with
 * *wire_error the PROTO_E_* code; c->data is left NULL. */
int proto_lane_decode_head(const uint8_t in[PROTO_CHUNK_HEAD_BYTES], size_t max_len, proto_update_chunk *c,
                           uint32_t *wire_error);
/* Where the first frame of a stream ends: buf holds the len bytes received so
 * far. 1 when a whole frame is there (*frame_len its bytes, header included),
 * 0 when more bytes are needed, RD_EFORMAT when its header announces a body
 * over max_body (the stream cannot be read on). Only the header's body_len is
 * read; the frame itself is then proto_decode's to check. */
int proto_lane_next_frame(const uint8_t *buf, size_t len, size_t max_body, size_t *frame_len);

#endif
