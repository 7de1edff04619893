/* admit.h - admission: the checks and the engine request that both front
 * doors (an NNG SUBMIT in loop.c, an HTTP route in api.c) apply to a request
 * before it reaches the engine thread, so the two doors accept the same
 * requests, refuse them with the same words, and queue the same work.
 *
 * A door first puts its request into the protocol's form (proto_request: the
 * NNG one is already, an HTTP route builds one from its JSON) and then calls,
 * in order: adm_check (the announced limits), adm_fits_kv once the prompt is
 * token ids, adm_queue_room, and adm_engine_request. What is door-specific
 * stays with the door: tokenizing a text prompt, the per-client retention of
 * results (NNG), holding calls while paused (HTTP). Messages carry no prefix
 * of their own beyond what proto_check_request writes; the door says which
 * request ("request 7: ...", "prompt 0: ..."). */
#ifndef RD_DAEMON_ADMIT_H
#define RD_DAEMON_ADMIT_H

#include <stddef.h>
#include <stdint.h>

#include "engine/serve/engine.h"
#include "proto/proto.h"

/* What admission reads of the daemon. */
typedef struct {
    const proto_hello_ok *lim;  /* the limits HELLO_OK announces */
    int32_t block_size;         /* tokens per KV block */
    int32_t kv_blocks_total;    /* blocks in the whole KV pool */
    uint64_t max_queued_requests; /* requests queued or running, both doors together */
} adm_limits;

struct rd_daemon;
/* The daemon's current limits (daemon.h). */
adm_limits adm_limits_of(const struct rd_daemon *d);

/* The request against the announced limits (proto_check_request): 0, or
 * -1 with msg set. */
int adm_check(const adm_limits *l, const proto_request *r, char *msg, size_t cap);

/* Whether n_prompt + max_tokens tokens fit the KV pool at all (a request that
 * does not could never run): 0, or -1 with msg set. */
int adm_fits_kv(const adm_limits *l, uint64_t n_prompt, uint64_t max_tokens, char *msg, size_t cap);

/* Whether `adding` more requests fit beside `unfinished` queued or running
 * ones (max_queued_requests): 0, or -1 with msg set (the door answers BUSY / 503). */
int adm_queue_room(const adm_limits *l, uint64_t unfinished, uint64_t adding, char *msg, size_t cap);

/* A fresh random seed for a request that gave none; salt varies the fallback
 * when the kernel's generator cannot answer. */
uint64_t adm_random_seed(uint64_t salt);

/* The engine request for a checked r whose prompt is the token ids
 * prompt[n_prompt] (r's own, or the door's tokenization of its text).
 * Sampling and stop fields come from r, the seed from seed; stop strings,
 * streaming and the tag are the door's to set afterwards. */
void adm_engine_request(const proto_request *r, const int32_t *prompt, uint32_t n_prompt, uint64_t seed,
                        eng_request *er);

#endif
