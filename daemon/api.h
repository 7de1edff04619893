/* api.h - the generation routes of the HTTP server: SGLang's native
 * /generate family and vLLM's OpenAI-compatible /v1 routes.
 *
 * Translation only: a route parses its JSON body (cJSON), passes it through
 * the admission an NNG SUBMIT goes through (admit.h: the HELLO_OK limits, the
 * KV pool, the queue bound, the engine request), and queues engine requests with et_add under keys of their own
 * (API_KEY_BIT set, so they never meet an NNG client's key). loop.c hands
 * every finished sample with such a key to api_on_result (and, for a stream,
 * each step's progress of its running samples); when a call's samples are all
 * in, the route answers (or, streaming, ends the stream it has fed). The engine path is the NNG one, so the same
 * prompt, parameters and seed give the same token ids and log-probs.
 *
 * Choices:
 *   - log-probs are the raw ones (temperature 1), as in NNG results; responses
 *     say so ("logprob_kind": "raw" in /generate meta_info);
 *   - a stream's engine requests ask for progress (eng_request.stream): after
 *     each step the engine thread hands over every running sample's new tokens,
 *     and the route sends one event per sample (SGLang: cumulative text, ids
 *     and log-probs; OpenAI: deltas), the text holding back what a stop string
 *     could still claim (api_stream.c); the last event is the finished sample;
 *   - a stop string cuts the text at the match (the ids keep the token that
 *     completed it); an EOS or stop token's text is not in the text;
 *   - pause / continue / abort_request act on requests that came over HTTP,
 *     except pause mode keep, which freezes the engine (every sequence) until
 *     continue; NNG clients have their own ABORT and the weight-update modes;
 *   - /flush_cache drops the engine's prefix cache at the next step boundary
 *     (eng_flush_cache), running requests or not;
 *   - vLLM's RL routes (/pause, /resume, /inference/v1/generate,
 *     /update_weights, ...) are api_vllm.c's; their pause is this one;
 *   - return_routed_experts (a mixture-of-experts model; 400 on a dense one)
 *     asks the engine for routes (eng_request.return_routes) and puts each
 *     finished sample's in its answer in SGLang's layout (api_routes_json).
 * Everything runs on the loop thread. */
#ifndef RD_DAEMON_API_H
#define RD_DAEMON_API_H

#include <stdint.h>

#include "daemon/http.h"
#include "engine/serve/engine.h"

#define API_KEY_BIT (1ull << 63)    /* engine keys of HTTP-owned requests */

typedef struct api api;

/* d is the rd_daemon (daemon.h includes this file). */
int api_create(void *d, api **out);
/* Frees what is left (after the engine thread and the HTTP server stopped). */
void api_destroy(api *a);
/* Appends the API's routes to table (room for API_MAX_ROUTES); returns how many. */
#define API_MAX_ROUTES 64
int api_routes(api *a, http_route *table);
/* A finished sample whose tag has API_KEY_BIT, or the progress of a
 * streaming one (r->partial); takes *r (zeroed on return). */
void api_on_result(api *a, eng_result *r);
/* The engine flushed its prefix cache for the /flush_cache call of key. */
void api_on_flushed(api *a, uint64_t key, int32_t n_flushed);
/* The engine thread did the memory release / resume of key (rc 0 or the
 * error, msg why). */
void api_on_memory(api *a, uint64_t key, int rc, const char *msg);
/* The engine thread loaded or unloaded a LoRA adapter for the call of key (rc 0), or could not (msg); a
 * load reports the adapter's rank, backend bytes and the idle adapter it evicted ("" none). */
void api_on_lora(api *a, uint64_t key, int rc, const char *msg, int32_t rank, int64_t bytes, const char *evicted);
/* HTTP calls not finished yet (the SIGTERM drain waits for them). */
int api_unfinished(const api *a);
/* Aborts every HTTP-owned engine request (drain time over). */
void api_abort_all(api *a);
/* SIGTERM's drain began: a keep pause ends, so frozen sequences may finish
 * within drain_s (calls held by a pause stay held, and are aborted with the rest). */
void api_drain(api *a);
/* The daemon is exiting: no engine results will come; answers nothing more. */
void api_shutdown(api *a);

#endif
