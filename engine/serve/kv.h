/* kv.h - the paged KV block manager (bookkeeping only; the memory is the
 * runner's). The pool is opaque: a sequence holds a block table and changes
 * it only through these calls, so the policy (which blocks a sequence keeps,
 * shares, copies or gives back) lives in kv.c alone.
 *
 * Blocks are reference counted so the n samples of a group share their
 * prompt's blocks (kv_fork); a shared block is copied before it is written
 * (kv_reserve hands the copy to the caller, who makes the runner do it).
 *
 * Prefix cache: a full prompt block can be published under a hash that chains
 * the hashes of the blocks before it, its tokens and a salt, the weight
 * version (so a weight update never serves KV computed by other weights). A
 * published block whose last reference goes stays cached (least recently
 * freed first to be reused) until the pool needs it; a later request with the
 * same prefix takes it back instead of recomputing it.
 *
 * Errors are negative RD_* codes (success is 0, or a count where stated).
 * Running out of blocks is RD_ENOMEM with no message recorded: under load it
 * is expected, and the scheduler answers it by preempting. */
#ifndef RD_KV_H
#define RD_KV_H

#include <stdint.h>

typedef struct kv_pool kv_pool;

/* A sequence's block table: its token t lives in block ids[t / block_size],
 * slot t % block_size. Zero-initialised is empty; only the kv_ calls below
 * change it (they grow ids and take the references). */
typedef struct {
    int32_t n;                  /* blocks held, in token order */
    int32_t cap;                /* capacity of ids */
    int32_t *ids;               /* [cap] pool block ids; NULL when cap is 0 */
} kv_table;

/* A prompt's prefix-cache keys, computed once per request and weight version
 * and shared by its samples. Zero-initialised is "not hashed yet". */
typedef struct {
    uint64_t *hashes;           /* [n] hash of block i: chains blocks 0..i of the prompt and the salt */
    int32_t n;                  /* full prompt blocks hashed: those that leave >= 1 prompt token to
                                   compute (its logits give the first sampled token) */
    uint64_t salt;              /* the weight version the hashes were made under */
} kv_prefix;

typedef struct {
    int32_t block_size;         /* tokens per block */
    int32_t blocks_total;       /* blocks in the pool */
    int32_t blocks_used;        /* blocks with a reference (cached blocks nobody holds count as free) */
    int32_t blocks_cached;      /* published blocks nobody holds: reusable by a lookup until evicted */
    int32_t peak_used;          /* most blocks used at once, judged when slots are written */
    double waste;               /* fraction of the used blocks' slots that hold no token now */
    double waste_at_peak;       /* waste when peak_used was last reached */
} kv_stats;

/* A pool of n_blocks blocks of block_size tokens, all free. */
int kv_create(int32_t n_blocks, int32_t block_size, kv_pool **out);
void kv_destroy(kv_pool *p);
void kv_get_stats(const kv_pool *p, kv_stats *s);

/* Makes the slots of tokens [n_computed, n_computed + n_new) of t writable:
 * fresh blocks where t is short, and a private copy of the block receiving
 * token n_computed when that block is shared (a group's partial prompt block).
 * The copy is *copy_src -> *copy_dst, which the runner must make before the
 * step writes; t already holds copy_dst. Returns the copies written (0 or 1).
 * All or nothing: RD_ENOMEM leaves t and the pool as they were. */
int kv_reserve(kv_pool *p, kv_table *t, int32_t n_computed, int32_t n_new, int32_t *copy_src,
               int32_t *copy_dst);
/* Records that the slots of tokens [from, from + n) of t now hold K/V (the
 * occupancy and waste figures of kv_stats). */
void kv_written(kv_pool *p, const kv_table *t, int32_t from, int32_t n);
/* Empty dst shares every block of src (one more reference each): a forked
 * sample. RD_ENOMEM (dst stays empty) if dst cannot grow; RD_EINVAL if dst
 * is not empty. */
int kv_fork(kv_pool *p, const kv_table *src, kv_table *dst);
/* Speculative decoding's rollback: drops t's blocks past those that hold
 * tokens [0, n_tokens) (the slots of rejected drafts), last first, and
 * counts the last kept block as filled to n_tokens when t alone holds it. */
void kv_truncate(kv_pool *p, kv_table *t, int32_t n_tokens);
/* Drops t's references in table order (a block nobody else holds becomes
 * free, or cached if published) and leaves t empty, owning no memory. */
void kv_free_seq(kv_pool *p, kv_table *t);

/* Takes the longest cached prefix of prompt (full blocks under salt) into
 * the empty table t, hashing the prompt into h first unless h already holds
 * its hashes under salt. Returns the blocks taken (0..h->n): the first
 * blocks * block_size tokens need no computing. RD_ENOMEM (nothing taken, h
 * not hashed) when memory runs out. */
int kv_prefix_lookup(kv_pool *p, kv_prefix *h, const int32_t *prompt, int32_t n_prompt, uint64_t salt,
                     kv_table *t);
/* Publishes the full prompt blocks of t from *n_published on that the first
 * n_computed tokens complete, advancing *n_published. No effect unless h was
 * hashed under salt; the caller passes salt only when all of t's KV was
 * computed under that version. A block whose hash is already cached (another
 * sequence computed the same prefix) is left unpublished. */
void kv_prefix_publish(kv_pool *p, const kv_prefix *h, const int32_t *prompt, const kv_table *t,
                       int32_t n_computed, uint64_t salt, int32_t *n_published);
void kv_prefix_free(kv_prefix *h);
/* Drops every prefix-cache entry: a cached block nobody holds goes back to
 * the free stack, a held one stays with its holders but is unpublished (it
 * becomes free, not cached, when they let go). Requests keep their kv_prefix
 * hashes, but a later lookup finds nothing until blocks are published again.
 * Returns the entries dropped. */
int32_t kv_prefix_flush(kv_pool *p);

#endif
