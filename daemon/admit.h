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
    /* Routing replay (a mixture-of-experts model; all 0 for a dense one, whose
     * HELLO_OK.features lacks ROUTES so adm_check refuses RETURN_ROUTES): */
    uint16_t route_layers;      /* layers each position is routed in */
    uint8_t route_k;            /* experts per position and layer */
    uint8_t route_width;        /* bytes per id on the NNG wire (proto_route_width) */
} adm_limits;

struct rd_daemon;
/* The daemon's current limits (daemon.h). */
adm_limits adm_limits_of(const struct rd_daemon *d);

/* The request against the announced limits (proto_check_request): 0, or
 * -1 with msg set. */
int adm_check(const adm_limits *l, const proto_request *r, char *msg, size_t cap);

/* Whether the LoRA adapter a checked request r names (flag LORA, version 6)
 * is resident in the engine now (the daemon's table, daemon/lora_reg.h): 0
 * (also when it names none), or -1 with msg naming the adapter. */
int adm_lora_resident(const struct rd_daemon *d, const proto_request *r, char *msg, size_t cap);

/* The largest result a checked request r with an n_prompt-token prompt can
 * produce on the NNG wire: proto_result_max_bytes, plus its routes (all
 * n_prompt + max_tokens - 1 positions) when it asks for them, the serve tail
 * (version 3 on), its prompt's scores (n_prompt - score_from positions)
 * when it scores them and its adapter's name and version when it names one. */
uint64_t adm_result_max_bytes(const adm_limits *l, const proto_request *r, uint32_t n_prompt);

/* Whether that result fits one RESULTS frame (max_message_bytes): 0, or -1
 * with msg set. The NNG door's check (proto_check_request has checked it
 * without the routes, whose size depends on the prompt and the model, and
 * without a text prompt's scores). */
int adm_fits_message(const adm_limits *l, const proto_request *r, uint32_t n_prompt, char *msg, size_t cap);

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
 * Sampling (the sampling tail's penalties, min_tokens and logit_bias included, when r has one), stop,
 * routes (RETURN_ROUTES), prompt scoring (SCORE: score_prompt, score_from) and adapter (LORA: lora) fields
 * come from r, the seed from seed; stop strings, streaming and the tag are the door's to set afterwards.
 * Arrays and the adapter's name point into r and prompt: et_add copies them. */
void adm_engine_request(const proto_request *r, const int32_t *prompt, uint32_t n_prompt, uint64_t seed,
                        eng_request *er);

#endif
