/* kv.h - the paged KV block manager (bookkeeping only; the memory is the
 * runner's). Blocks are reference counted so the n samples of a group share
 * their prompt's blocks; a shared block is copied before it is written.
 *
 * Prefix cache: a full prompt block can be published under a hash that chains
 * the hashes of the blocks before it, its tokens and the weight version (so a
 * weight update never serves KV computed by other weights). A published block
 * whose last reference goes stays cached (least recently freed first to be
 * reused) until the pool needs it; a later request with the same prefix takes
 * it back instead of recomputing it. */
#ifndef RD_KV_H
#define RD_KV_H

#include <stdint.h>

typedef struct {
    int32_t block_size;         /* tokens per block */
    int32_t n_blocks;           /* blocks in the pool */
    int32_t n_free;             /* blocks that can be allocated: the free stack plus cached unused ones */
    int32_t n_stack;            /* entries in free_list */
    int32_t *free_list;         /* [n_blocks] stack of free, uncached block ids */
    /* prefix cache */
    uint64_t *hash;             /* [n_blocks] published hash, 0 = none */
    uint64_t *parent;           /* [n_blocks] the hash before it in its chain */
    int32_t *tokens;            /* [n_blocks][block_size] the tokens it holds (checked on a hit) */
    int32_t *lru_prev, *lru_next; /* [n_blocks] cached blocks with no reference, oldest first */
    int32_t lru_head, lru_tail; /* -1 when empty */
    uint64_t *map_key;          /* [map_cap] open addressing: hash -> block */
    int32_t *map_val;
    uint32_t map_cap;           /* power of two, >= 2 n_blocks */
    int32_t *refs;              /* [n_blocks] references (0 = free) */
    int32_t *fill;              /* [n_blocks] slots written (0..block_size) */
    int32_t peak_used;          /* most blocks in use at once */
    int64_t filled_slots;       /* sum of fill over used blocks */
    double waste_at_peak;       /* 1 - filled/(used*block_size) when peak_used was reached */
} kv_pool;

int kv_init(kv_pool *p, int32_t n_blocks, int32_t block_size);
void kv_free(kv_pool *p);

int32_t kv_used(const kv_pool *p);
/* Takes a free block (refs = 1, fill = 0): RD_ENOMEM when none is left. */
int kv_alloc(kv_pool *p, int32_t *block);
void kv_ref(kv_pool *p, int32_t block);
void kv_unref(kv_pool *p, int32_t block);
/* Records that slot offset `off` of block was written. */
void kv_mark(kv_pool *p, int32_t block, int32_t off);
/* Fraction of the used blocks' slots that hold no token right now. */
double kv_waste(const kv_pool *p);

/* The chained hash of a full block: parent (0 for the first block), the
 * block's tokens, and salt (the weight version). Never 0. */
uint64_t kv_block_hash(uint64_t parent, const int32_t *tokens, int32_t n, uint64_t salt);
/* The cached block holding exactly this chain link, with a reference taken
 * (a cached unused block comes back into use); -1 if none. */
int32_t kv_lookup(kv_pool *p, uint64_t hash, uint64_t parent, const int32_t *tokens);
/* Publishes a full block under hash (no effect if that hash is already cached). */
void kv_publish(kv_pool *p, int32_t block, uint64_t hash, uint64_t parent, const int32_t *tokens);

#endif
