/* fuzz_proto.c - libFuzzer target for proto_decode (proto/proto.h).
 *
 * Decodes the input under two limits (none, and a small one); when it
 * decodes, touches every array element and string byte the message hands out
 * (AddressSanitizer then proves every view lies inside the arena), checks the
 * arena stays within PROTO_ARENA_BOUND, and re-encodes: the encoding is
 * canonical, so the bytes must come back identical. A refused frame must
 * leave a wire error code, a message and no memory held. Build and run:
 *   clang -std=c11 -D_GNU_SOURCE -g -O1 -I. -fsanitize=fuzzer,address,undefined \
 *       tests/fuzz/fuzz_proto.c proto/proto.c base/err.c -o build/fuzz/fuzz_proto -lm
 *   build/fuzz/fuzz_proto -max_total_time=60 CORPUS_DIR proto/testdata */
#include "base/err.h"
#include "proto/proto.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static volatile uint64_t sink;

static void touch(const void *p, uint64_t bytes)
{
    const uint8_t *b = p;
    for (uint64_t i = 0; i < bytes; i++)
        sink += b[i];
}

static void touch_str(proto_str s)
{
    touch(s.ptr, s.len);
    if (s.ptr[s.len] != 0)   /* decoded strings are NUL-terminated */
        abort();
}

static void touch_msg(const proto_msg *m)
{
    switch (m->type) {
    case PROTO_HELLO: touch_str(m->hello.client_name); break;
    case PROTO_HELLO_OK:
        touch_str(m->hello_ok.model_name);
        touch_str(m->hello_ok.architecture);
        touch_str(m->hello_ok.backend);
        touch_str(m->hello_ok.server);
        break;
    case PROTO_SUBMIT:
        for (uint32_t i = 0; i < m->submit.n_requests; i++) {
            const proto_request *r = &m->submit.requests[i];
            touch(r->stop_ids, 4ull * r->n_stop);
            touch(r->prompt, 4ull * r->n_prompt);
            touch_str(r->text);
            if (r->sampling) {  /* version 4: only with the flag */
                if (!(r->flags & PROTO_REQ_SAMPLING) || m->version < 4)
                    abort();
                touch(r->sampling, sizeof *r->sampling);
                touch(r->sampling->bias_ids, 4ull * r->sampling->n_bias);
                touch(r->sampling->bias_vals, 4ull * r->sampling->n_bias);
            }
            if (r->score_from && (!(r->flags & PROTO_REQ_SCORE) || m->version < 5))
                abort();        /* version 5: a score tail only with the flag */
            /* version 6: a name of 1..127 bytes exactly with the flag in a version-6 frame, "" otherwise */
            touch_str(r->lora);
            if ((r->lora.len != 0) != ((r->flags & PROTO_REQ_LORA) && m->version >= 6) ||
                r->lora.len > PROTO_MAX_LORA_NAME)
                abort();
        }
        break;
    case PROTO_SUBMIT_OK:
        for (uint32_t i = 0; i < m->submit_ok.n_items; i++)
            touch_str(m->submit_ok.items[i].message);
        break;
    case PROTO_RESULTS:
        for (uint32_t i = 0; i < m->results.n_results; i++) {
            const proto_result *r = &m->results.results[i];
            uint64_t n = r->n_tokens, nk = n * r->top_k;
            touch(r->token_ids, 4 * n);
            touch(r->logprobs, 4 * n);
            if (r->flags & PROTO_RESULT_PROCESSED)
                touch(r->logprobs_processed, 4 * n);
            touch(r->top_ids, 4 * nk);
            touch(r->top_logprobs, 4 * nk);
            touch(r->spans, sizeof(proto_span) * (uint64_t)r->n_spans);
            if (r->flags & PROTO_RESULT_ROUTES)
                touch(r->routes, (uint64_t)r->n_routes * r->route_layers * r->route_k * r->route_width);
            if (!r->scores != !(r->flags & PROTO_RESULT_SCORES))
                abort();        /* version 5: scores exactly with the flag */
            if (r->scores) {
                const proto_scores *s = r->scores;
                if (s->score_from > r->n_prompt || (s->n_scored && s->n_scored != r->n_prompt - s->score_from))
                    abort();
                touch(s, sizeof *s);
                touch(s->logprobs, 4ull * s->n_scored);
                touch(s->top_ids, 4ull * s->n_scored * r->top_k);
                touch(s->top_logprobs, 4ull * s->n_scored * r->top_k);
            }
            /* version 6: a name of 1..127 bytes exactly with the flag (a version-6 bit), "" and 0 otherwise */
            touch_str(r->lora);
            int lora = (r->flags & PROTO_RESULT_LORA) != 0;
            if ((r->lora.len != 0) != lora || r->lora.len > PROTO_MAX_LORA_NAME || (!lora && r->lora_version) ||
                (lora && m->version < 6))
                abort();
        }
        break;
    case PROTO_STATUS_OK: touch_str(m->status_ok.json); break;
    case PROTO_ERROR: touch_str(m->error.message); break;
    default: break;
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static const size_t limits[2] = {0, 256};
    for (int k = 0; k < 2; k++) {
        proto_msg m;
        int rc = proto_decode(data, size, limits[k], &m);
        if (rc) {
            if (m.wire_error < PROTO_E_BAD_MAGIC || m.wire_error > PROTO_E_UNKNOWN_TYPE || !rd_errmsg()[0] ||
                m.arena || m.arena_bytes)
                abort();
            continue;
        }
        if (m.arena_bytes > PROTO_ARENA_BOUND(size))
            abort();
        touch_msg(&m);
        proto_buf b;
        proto_buf_init(&b);
        if (proto_encode(&b, &m) != 0 || b.len != size || memcmp(b.data, data, size) != 0)
            abort();
        proto_buf_free(&b);
        proto_msg_free(&m);
    }
    return 0;
}
