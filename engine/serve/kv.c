/* kv.c - paged KV block manager and prefix cache (see kv.h).
 *
 * In data-flow order: the pool, the hash map and LRU list behind the prefix
 * cache, single blocks, then what sequences call (reserve, fork, free) and
 * the prefix cache's lookup and publish. */
#include "engine/serve/kv.h"

#include <stdlib.h>
#include <string.h>

#include "base/err.h"

struct kv_pool {
    int32_t block_size;         /* tokens per block */
    int32_t n_blocks;           /* blocks in the pool */
    int32_t n_free;             /* blocks that can be allocated: the free stack plus cached unused ones */
    int32_t n_stack;            /* entries in free_list */
    int32_t *free_list;         /* [n_blocks] stack of free, uncached block ids */
    int32_t *refs;              /* [n_blocks] references (0 = free or cached) */
    int32_t *fill;              /* [n_blocks] slots written (0..block_size) */
    /* prefix cache */
    uint64_t *hash;             /* [n_blocks] published hash, 0 = none */
    uint64_t *parent;           /* [n_blocks] the hash before it in its chain */
    int32_t *tokens;            /* [n_blocks][block_size] the tokens it holds (checked on a hit) */
    int32_t *lru_prev, *lru_next; /* [n_blocks] cached blocks with no reference, oldest first */
    int32_t lru_head, lru_tail; /* -1 when empty */
    int32_t n_cached;           /* blocks on the LRU list */
    uint64_t *map_key;          /* [map_cap] open addressing: hash -> block; key 0 = empty slot */
    int32_t *map_val;           /* [map_cap] */
    uint32_t map_cap;           /* power of two, >= 2 n_blocks */
    /* occupancy */
    int32_t peak_used;          /* most blocks in use at once */
    int64_t filled_slots;       /* sum of fill over used blocks */
    double waste_at_peak;       /* 1 - filled/(used*block_size) when peak_used was reached */
};

int kv_create(int32_t n_blocks, int32_t block_size, kv_pool **out)
{
    *out = NULL;
    if (n_blocks <= 0 || block_size <= 0)
        return rd_fail(RD_EINVAL, "kv: %d blocks of %d tokens: both must be positive", n_blocks, block_size);
    kv_pool *p = calloc(1, sizeof *p);
    if (!p)
        return rd_fail(RD_ENOMEM, "kv: cannot allocate bookkeeping for %d blocks", n_blocks);
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
        kv_destroy(p);
        return rd_fail(RD_ENOMEM, "kv: cannot allocate bookkeeping for %d blocks", n_blocks);
    }
    /* Low ids first out of the stack, so small runs touch little memory. */
    for (int32_t i = 0; i < n_blocks; i++)
        p->free_list[i] = n_blocks - 1 - i;
    p->n_stack = p->n_free = n_blocks;
    p->lru_head = p->lru_tail = -1;
    *out = p;
    return 0;
}

void kv_destroy(kv_pool *p)
{
    if (!p)
        return;
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
    free(p);
}

static int32_t used_blocks(const kv_pool *p) { return p->n_blocks - p->n_free; }

static double waste_now(const kv_pool *p)
{
    int32_t used = used_blocks(p);
    if (used == 0)
        return 0.0;
    return 1.0 - (double)p->filled_slots / ((double)used * p->block_size);
}

void kv_get_stats(const kv_pool *p, kv_stats *s)
{
    *s = (kv_stats){
        .block_size = p->block_size,
        .blocks_total = p->n_blocks,
        .blocks_used = used_blocks(p),
        .blocks_cached = p->n_cached,
        .peak_used = p->peak_used,
        .waste = waste_now(p),
        .waste_at_peak = p->waste_at_peak,
    };
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
    p->n_cached--;
}

static void lru_push(kv_pool *p, int32_t b)
{
    p->lru_prev[b] = p->lru_tail;
    p->lru_next[b] = -1;
    if (p->lru_tail >= 0) p->lru_next[p->lru_tail] = b; else p->lru_head = b;
    p->lru_tail = b;
    p->n_cached++;
}

/* ---- single blocks */

/* Takes a free block (refs = 1, fill = 0), evicting the cached block freed
 * longest ago when the stack is empty. Callers check n_free first. */
static int32_t block_alloc(kv_pool *p)
{
    int32_t b;
    if (p->n_stack > 0) {
        b = p->free_list[--p->n_stack];
    } else {
        b = p->lru_head;
        lru_remove(p, b);
        map_del(p, p->hash[b]);
        p->hash[b] = 0;
    }
    p->n_free--;
    p->refs[b] = 1;
    p->fill[b] = 0;
    return b;
}

static void block_unref(kv_pool *p, int32_t b)
{
    if (--p->refs[b] > 0)
        return;
    p->filled_slots -= p->fill[b];
    p->n_free++;
    if (p->hash[b]) {
        lru_push(p, b); /* keeps its contents (and fill) for a later hit */
        return;
    }
    p->fill[b] = 0;
    p->free_list[p->n_stack++] = b;
}

/* Records that slot off of block b was written. */
static void block_mark(kv_pool *p, int32_t b, int32_t off)
{
    if (off + 1 > p->fill[b]) {
        p->filled_slots += off + 1 - p->fill[b];
        p->fill[b] = off + 1;
    }
    /* Waste is judged at the peak, after the step's slots are written. */
    int32_t used = used_blocks(p);
    if (used >= p->peak_used) {
        p->peak_used = used;
        p->waste_at_peak = waste_now(p);
    }
}

/* ---- block tables */

/* Room for n entries in t (capacity doubles from 8, as a table grows one
 * block at a time while a sequence decodes). */
static int table_grow(kv_table *t, int32_t n)
{
    if (n <= t->cap)
        return 0;
    int32_t cap = t->cap ? t->cap : 8;
    while (cap < n)
        cap *= 2;
    int32_t *ids = realloc(t->ids, sizeof(int32_t) * (size_t)cap);
    if (!ids)
        return RD_ENOMEM;
    t->ids = ids;
    t->cap = cap;
    return 0;
}

int kv_reserve(kv_pool *p, kv_table *t, int32_t n_computed, int32_t n_new, int32_t *copy_src,
               int32_t *copy_dst)
{
    const int32_t bs = p->block_size;
    int32_t need = (n_computed + n_new + bs - 1) / bs;
    int32_t first = n_computed / bs; /* block receiving the first new slot */
    int cow = first < t->n && p->refs[t->ids[first]] > 1;
    int32_t fresh = need > t->n ? need - t->n : 0;
    if (p->n_free < fresh + cow || table_grow(t, t->n + fresh))
        return RD_ENOMEM;
    if (cow) {
        int32_t old = t->ids[first], nb = block_alloc(p);
        if (p->fill[old] > 0)
            block_mark(p, nb, p->fill[old] - 1); /* the copy holds what the original holds */
        block_unref(p, old);                     /* others still hold it: refs was > 1 */
        t->ids[first] = nb;
        *copy_src = old;
        *copy_dst = nb;
    }
    for (int32_t i = 0; i < fresh; i++)
        t->ids[t->n++] = block_alloc(p);
    return cow;
}

void kv_written(kv_pool *p, const kv_table *t, int32_t from, int32_t n)
{
    const int32_t bs = p->block_size;
    for (int32_t pos = from; pos < from + n; pos++)
        block_mark(p, t->ids[pos / bs], pos % bs);
}

int kv_fork(kv_pool *p, const kv_table *src, kv_table *dst)
{
    if (dst->n != 0)
        return rd_fail(RD_EINVAL, "kv: fork into a table that holds %d blocks", dst->n);
    if (table_grow(dst, src->n))
        return rd_fail(RD_ENOMEM, "kv: cannot grow a forked block table to %d blocks", src->n);
    for (int32_t i = 0; i < src->n; i++) {
        dst->ids[i] = src->ids[i];
        p->refs[src->ids[i]]++;
    }
    dst->n = src->n;
    return 0;
}

void kv_truncate(kv_pool *p, kv_table *t, int32_t n_tokens)
{
    const int32_t bs = p->block_size;
    const int32_t keep = n_tokens > 0 ? (n_tokens + bs - 1) / bs : 0;
    while (t->n > keep)
        block_unref(p, t->ids[--t->n]);
    if (keep > 0 && t->n == keep) {
        const int32_t b = t->ids[keep - 1], f = n_tokens - (keep - 1) * bs;
        if (p->refs[b] == 1 && p->hash[b] == 0 && p->fill[b] > f) {
            p->filled_slots -= p->fill[b] - f;
            p->fill[b] = f;
        }
    }
}

void kv_free_seq(kv_pool *p, kv_table *t)
{
    /* In table order, which is the order its cached blocks join the LRU list
       and so the order they are evicted in (vLLM frees a chain tail first,
       so a partly evicted chain keeps its usable head; not done here, to
       keep the engine's behaviour as it was). */
    for (int32_t i = 0; i < t->n; i++)
        block_unref(p, t->ids[i]);
    free(t->ids);
    *t = (kv_table){0};
}

/* ---- prefix cache */

/* The chained hash of a full block: parent (0 for the first block), the
 * block's tokens, and salt (the weight version). Never 0 (0 marks an empty
 * map slot and an unpublished block). */
static uint64_t block_hash(uint64_t parent, const int32_t *tokens, int32_t n, uint64_t salt)
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

/* The cached block holding exactly this chain link, with a reference taken
 * (a cached unused block comes back into use); -1 if none. */
static int32_t cache_get(kv_pool *p, uint64_t hash, uint64_t parent, const int32_t *tokens)
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

/* Publishes full block b under hash (no effect if that hash is already cached). */
static void cache_put(kv_pool *p, int32_t b, uint64_t hash, uint64_t parent, const int32_t *tokens)
{
    if (p->hash[b] || map_get(p, hash) >= 0)
        return;
    p->hash[b] = hash;
    p->parent[b] = parent;
    memcpy(p->tokens + (size_t)b * p->block_size, tokens, sizeof(int32_t) * (size_t)p->block_size);
    map_put(p, hash, b);
}

int kv_prefix_lookup(kv_pool *p, kv_prefix *h, const int32_t *prompt, int32_t n_prompt, uint64_t salt,
                     kv_table *t)
{
    const int32_t bs = p->block_size;
    if (t->n != 0)
        return rd_fail(RD_EINVAL, "kv: prefix lookup into a table that holds %d blocks", t->n);
    if (!h->hashes || h->salt != salt) {
        int32_t n = (n_prompt - 1) / bs; /* at least one prompt token is always computed: its logits */
        uint64_t *hs = h->hashes ? h->hashes : malloc(sizeof(uint64_t) * (size_t)(n > 0 ? n : 1));
        if (!hs)
            return RD_ENOMEM;
        for (int32_t i = 0; i < n; i++)
            hs[i] = block_hash(i ? hs[i - 1] : 0, prompt + (size_t)i * bs, bs, salt);
        h->hashes = hs;
        h->n = n;
        h->salt = salt;
    }
    if (table_grow(t, h->n))
        return RD_ENOMEM;
    while (t->n < h->n) {
        int32_t i = t->n;
        int32_t b = cache_get(p, h->hashes[i], i ? h->hashes[i - 1] : 0, prompt + (size_t)i * bs);
        if (b < 0)
            break;
        t->ids[t->n++] = b;
    }
    return t->n;
}

void kv_prefix_publish(kv_pool *p, const kv_prefix *h, const int32_t *prompt, const kv_table *t,
                       int32_t n_computed, uint64_t salt, int32_t *n_published)
{
    const int32_t bs = p->block_size;
    if (!h->hashes || h->salt != salt)
        return;
    while (*n_published < h->n && (*n_published + 1) * bs <= n_computed) {
        int32_t i = (*n_published)++;
        cache_put(p, t->ids[i], h->hashes[i], i ? h->hashes[i - 1] : 0, prompt + (size_t)i * bs);
    }
}

void kv_prefix_free(kv_prefix *h)
{
    free(h->hashes);
    *h = (kv_prefix){0};
}

int32_t kv_prefix_flush(kv_pool *p)
{
    int32_t n = 0;
    /* Unused cached blocks: off the LRU list onto the free stack (n_free
     * already counts them, so only where they come from changes). */
    while (p->lru_head >= 0) {
        int32_t b = p->lru_head;
        lru_remove(p, b);
        p->fill[b] = 0;
        p->free_list[p->n_stack++] = b;
    }
    for (int32_t b = 0; b < p->n_blocks; b++)
        if (p->hash[b]) {
            p->hash[b] = 0;
            n++;
        }
    memset(p->map_key, 0, sizeof(uint64_t) * p->map_cap);
    return n;
}
