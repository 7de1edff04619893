/* kv.c - paged KV block manager and prefix cache (see kv.h). */
#include "engine/kv.h"

#include <stdlib.h>
#include <string.h>

#include "engine/err.h"

int kv_init(kv_pool *p, int32_t n_blocks, int32_t block_size)
{
    memset(p, 0, sizeof *p);
    if (n_blocks <= 0 || block_size <= 0)
        return rd_fail(RD_EINVAL, "kv: %d blocks of %d tokens: both must be positive", n_blocks, block_size);
    p->block_size = block_size;
    p->n_blocks = n_blocks;
    p->map_cap = 16;
    while (p->map_cap < 2u * (uint32_t)n_blocks)
        p->map_cap *= 2;
    p->free_list = malloc(sizeof(int32_t) * n_blocks);
    p->refs = calloc((size_t)n_blocks, sizeof(int32_t));
    p->fill = calloc((size_t)n_blocks, sizeof(int32_t));
    p->hash = calloc((size_t)n_blocks, sizeof(uint64_t));
    p->parent = calloc((size_t)n_blocks, sizeof(uint64_t));
    p->tokens = calloc((size_t)n_blocks * block_size, sizeof(int32_t));
    p->lru_prev = malloc(sizeof(int32_t) * n_blocks);
    p->lru_next = malloc(sizeof(int32_t) * n_blocks);
    p->map_key = calloc(p->map_cap, sizeof(uint64_t));
    p->map_val = calloc(p->map_cap, sizeof(int32_t));
    if (!p->free_list || !p->refs || !p->fill || !p->hash || !p->parent || !p->tokens || !p->lru_prev ||
        !p->lru_next || !p->map_key || !p->map_val) {
        kv_free(p);
        return rd_fail(RD_ENOMEM, "kv: cannot allocate bookkeeping for %d blocks", n_blocks);
    }
    /* Low ids first out of the stack, so small runs touch little memory. */
    for (int32_t i = 0; i < n_blocks; i++)
        p->free_list[i] = n_blocks - 1 - i;
    p->n_stack = p->n_free = n_blocks;
    p->lru_head = p->lru_tail = -1;
    return 0;
}

void kv_free(kv_pool *p)
{
    free(p->free_list);
    free(p->refs);
    free(p->fill);
    free(p->hash);
    free(p->parent);
    free(p->tokens);
    free(p->lru_prev);
    free(p->lru_next);
    free(p->map_key);
    free(p->map_val);
    memset(p, 0, sizeof *p);
}

int32_t kv_used(const kv_pool *p) { return p->n_blocks - p->n_free; }

double kv_waste(const kv_pool *p)
{
    int32_t used = kv_used(p);
    if (used == 0)
        return 0.0;
    return 1.0 - (double)p->filled_slots / ((double)used * p->block_size);
}

/* ---- the hash map (linear probing, backward-shift deletion: no tombstones) */

static uint32_t slot_of(const kv_pool *p, uint64_t h) { return (uint32_t)(h * 0x9E3779B97F4A7C15ull >> 32) & (p->map_cap - 1); }

static int32_t map_get(const kv_pool *p, uint64_t h)
{
    for (uint32_t i = slot_of(p, h);; i = (i + 1) & (p->map_cap - 1)) {
        if (p->map_key[i] == 0)
            return -1;
        if (p->map_key[i] == h)
            return p->map_val[i];
    }
}

static void map_put(kv_pool *p, uint64_t h, int32_t b)
{
    uint32_t i = slot_of(p, h);
    while (p->map_key[i] != 0)
        i = (i + 1) & (p->map_cap - 1);
    p->map_key[i] = h;
    p->map_val[i] = b;
}

static void map_del(kv_pool *p, uint64_t h)
{
    uint32_t m = p->map_cap - 1, i = slot_of(p, h);
    while (p->map_key[i] != h) {
        if (p->map_key[i] == 0)
            return;
        i = (i + 1) & m;
    }
    /* Shift later entries of the cluster back over the hole when their home allows it. */
    for (uint32_t j = (i + 1) & m; p->map_key[j] != 0; j = (j + 1) & m) {
        uint32_t home = slot_of(p, p->map_key[j]);
        if (((j - home) & m) >= ((j - i) & m)) {
            p->map_key[i] = p->map_key[j];
            p->map_val[i] = p->map_val[j];
            i = j;
        }
    }
    p->map_key[i] = 0;
}

/* ---- the list of cached blocks nobody uses, oldest first */

static void lru_remove(kv_pool *p, int32_t b)
{
    if (p->lru_prev[b] >= 0) p->lru_next[p->lru_prev[b]] = p->lru_next[b]; else p->lru_head = p->lru_next[b];
    if (p->lru_next[b] >= 0) p->lru_prev[p->lru_next[b]] = p->lru_prev[b]; else p->lru_tail = p->lru_prev[b];
}

static void lru_push(kv_pool *p, int32_t b)
{
    p->lru_prev[b] = p->lru_tail;
    p->lru_next[b] = -1;
    if (p->lru_tail >= 0) p->lru_next[p->lru_tail] = b; else p->lru_head = b;
    p->lru_tail = b;
}

/* ---- blocks */

int kv_alloc(kv_pool *p, int32_t *block)
{
    int32_t b;
    if (p->n_stack > 0) {
        b = p->free_list[--p->n_stack];
    } else if (p->lru_head >= 0) {
        /* Evict the cached block freed longest ago. */
        b = p->lru_head;
        lru_remove(p, b);
        map_del(p, p->hash[b]);
        p->hash[b] = 0;
    } else {
        return RD_ENOMEM; /* expected under load: the scheduler preempts */
    }
    p->n_free--;
    p->refs[b] = 1;
    p->fill[b] = 0;
    *block = b;
    return 0;
}

void kv_ref(kv_pool *p, int32_t block) { p->refs[block]++; }

void kv_unref(kv_pool *p, int32_t block)
{
    if (--p->refs[block] > 0)
        return;
    p->filled_slots -= p->fill[block];
    p->n_free++;
    if (p->hash[block]) {
        lru_push(p, block); /* keeps its contents (and fill) for a later hit */
        return;
    }
    p->fill[block] = 0;
    p->free_list[p->n_stack++] = block;
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

/* ---- prefix cache */

uint64_t kv_block_hash(uint64_t parent, const int32_t *tokens, int32_t n, uint64_t salt)
{
    /* FNV-1a over the words, finished with a splitmix64 round; a hit is also
     * checked against the stored tokens and parent, so a collision costs a miss. */
    uint64_t h = 0xcbf29ce484222325ull ^ parent;
    h = (h ^ salt) * 0x100000001b3ull;
    for (int32_t i = 0; i < n; i++)
        h = (h ^ (uint32_t)tokens[i]) * 0x100000001b3ull;
    h ^= h >> 30;
    h *= 0xbf58476d1ce4e5b9ull;
    h ^= h >> 27;
    h *= 0x94d049bb133111ebull;
    h ^= h >> 31;
    return h ? h : 1;
}

int32_t kv_lookup(kv_pool *p, uint64_t hash, uint64_t parent, const int32_t *tokens)
{
    int32_t b = map_get(p, hash);
    if (b < 0 || p->parent[b] != parent ||
        memcmp(p->tokens + (size_t)b * p->block_size, tokens, sizeof(int32_t) * (size_t)p->block_size))
        return -1;
    if (p->refs[b] == 0) {
        lru_remove(p, b);
        p->n_free--;
        p->filled_slots += p->fill[b];
    }
    p->refs[b]++;
    return b;
}

void kv_publish(kv_pool *p, int32_t block, uint64_t hash, uint64_t parent, const int32_t *tokens)
{
    if (p->hash[block] || map_get(p, hash) >= 0)
        return;
    p->hash[block] = hash;
    p->parent[block] = parent;
    memcpy(p->tokens + (size_t)block * p->block_size, tokens, sizeof(int32_t) * (size_t)p->block_size);
    map_put(p, hash, block);
}
