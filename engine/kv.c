/* kv.c - paged KV block manager (see kv.h). */
#include "engine/kv.h"

#include <stdlib.h>

#include "engine/err.h"

int kv_init(kv_pool *p, int32_t n_blocks, int32_t block_size)
{
    if (n_blocks <= 0 || block_size <= 0)
        return rd_fail(RD_EINVAL, "kv: %d blocks of %d tokens: both must be positive", n_blocks, block_size);
    p->block_size = block_size;
    p->n_blocks = n_blocks;
    p->free_list = malloc(sizeof(int32_t) * n_blocks);
    p->refs = calloc((size_t)n_blocks, sizeof(int32_t));
    p->fill = calloc((size_t)n_blocks, sizeof(int32_t));
    if (!p->free_list || !p->refs || !p->fill) {
        kv_free(p);
        return rd_fail(RD_ENOMEM, "kv: cannot allocate bookkeeping for %d blocks", n_blocks);
    }
    /* Low ids first out of the stack, so small runs touch little memory. */
    for (int32_t i = 0; i < n_blocks; i++)
        p->free_list[i] = n_blocks - 1 - i;
    p->n_free = n_blocks;
    p->peak_used = 0;
    p->filled_slots = 0;
    p->waste_at_peak = 0.0;
    return 0;
}

void kv_free(kv_pool *p)
{
    free(p->free_list);
    free(p->refs);
    free(p->fill);
    p->free_list = p->refs = p->fill = NULL;
}

int32_t kv_used(const kv_pool *p) { return p->n_blocks - p->n_free; }

double kv_waste(const kv_pool *p)
{
    int32_t used = kv_used(p);
    if (used == 0)
        return 0.0;
    return 1.0 - (double)p->filled_slots / ((double)used * p->block_size);
}

int kv_alloc(kv_pool *p, int32_t *block)
{
    if (p->n_free == 0)
        return RD_ENOMEM; /* expected under load: the scheduler preempts */
    int32_t b = p->free_list[--p->n_free];
    p->refs[b] = 1;
    p->fill[b] = 0;
    *block = b;
    return 0;
}

void kv_ref(kv_pool *p, int32_t block) { p->refs[block]++; }

void kv_unref(kv_pool *p, int32_t block)
{
    if (--p->refs[block] == 0) {
        p->filled_slots -= p->fill[block];
        p->fill[block] = 0;
        p->free_list[p->n_free++] = block;
    }
}

void kv_mark(kv_pool *p, int32_t block, int32_t off)
{
    if (off + 1 > p->fill[block]) {
        p->filled_slots += off + 1 - p->fill[block];
        p->fill[block] = off + 1;
    }
    /* Waste is judged at the peak, after the step's slots are written. */
    int32_t used = kv_used(p);
    if (used >= p->peak_used) {
        p->peak_used = used;
        p->waste_at_peak = kv_waste(p);
    }
}
