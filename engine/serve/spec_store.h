/* spec_store.h - recent completions of prompts, kept across requests for the
 * n-gram drafter (spec_ngram.h).
 *
 * In RL the same prompts come back: a group split into n requests of one
 * sample, a retried request, the next epoch. Their earlier completions are
 * the best drafts there are, so a finished sample's generated tokens are
 * kept here under its prompt's key, and a later sequence with the same key
 * drafts from them (spec_plan.c). The key is a hash of the prompt's tokens
 * salted with the weight version, as the prefix cache salts its blocks: an
 * answer drafts only for the policy that wrote it, and a weight push leaves
 * the old entries to age out. Drafts only cost time (spec_draft.h), so a
 * hash collision costs drafts that miss, never a wrong output.
 *
 * Bounded in bytes: each entry counts its tokens (4 bytes each) plus
 * SPEC_STORE_ENTRY_BYTES of bookkeeping; a put that would pass the bound
 * evicts the oldest entries first (whatever their key). Single-threaded
 * (the engine's thread). */
#ifndef RD_SPEC_STORE_H
#define RD_SPEC_STORE_H

#include <stdint.h>

#include "engine/serve/spec_draft.h"

/* Bytes an entry is charged beyond its tokens (its header and map slot). */
#define SPEC_STORE_ENTRY_BYTES 64

typedef struct spec_store spec_store;

typedef struct {
    int64_t bytes;              /* charged now (tokens + SPEC_STORE_ENTRY_BYTES per entry) */
    int64_t max_bytes;          /* the bound */
    int32_t entries;            /* completions held */
    int64_t puts, evictions;    /* completions kept, and dropped for room, since creation */
} spec_store_stats;

/* A store of at most max_bytes (>= 1); RD_EINVAL, RD_ENOMEM. */
int spec_store_create(int64_t max_bytes, spec_store **out);
void spec_store_destroy(spec_store *s);

/* The key of a prompt under a weight version (never 0). */
uint64_t spec_store_key(const int32_t *prompt, int32_t n_prompt, uint64_t version);

/* Keeps a copy of tokens[0..n) (n >= 1) as the newest completion under key,
 * evicting the oldest entries until it fits. Returns 0; 0 without keeping it
 * when it alone is larger than the bound; RD_EINVAL for bad arguments;
 * RD_ENOMEM (not kept; entries evicted for its room stay evicted). */
int spec_store_put(spec_store *s, uint64_t key, const int32_t *tokens, int32_t n);

/* Up to max of key's completions, newest first, into out (their ids point
 * into the store: valid until the next put). Returns how many. */
int32_t spec_store_get(const spec_store *s, uint64_t key, spec_tokens *out, int32_t max);

void spec_store_get_stats(const spec_store *s, spec_store_stats *st);

#endif
