/* kv.h - the paged KV block manager (bookkeeping only; the memory is the
 * runner's). Blocks are reference counted so the n samples of a group share
 * their prompt's blocks; a shared block is copied before it is written. */
#ifndef RD_KV_H
#define RD_KV_H

#include <stdint.h>

typedef struct {
    int32_t block_size;         /* tokens per block */
    int32_t n_blocks;           /* blocks in the pool */
    int32_t n_free;             /* entries in free_list */
    int32_t *free_list;         /* [n_blocks] stack of free block ids */
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

#endif
