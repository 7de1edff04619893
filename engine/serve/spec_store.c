/* spec_store.c - recent completions by prompt (see spec_store.h).
 *
 * Entries sit on one list in insertion order (head = oldest), which is the
 * eviction order, and on a chain per key (newest to oldest) that the map
 * reaches through its newest entry. The oldest entry overall is also the
 * oldest of its key, so evicting it only cuts the tail of its chain. */
#include "engine/serve/spec_store.h"

#include <stdlib.h>
#include <string.h>

#include "base/err.h"
#include "base/u64map.h"

typedef struct entry entry;
struct entry {
    uint64_t key;
    entry *next, *prev;         /* insertion order: next is newer */
    entry *older;               /* the next older completion of the same key, or NULL */
    entry *newer;               /* the next newer one of the same key, or NULL (then the map points here) */
    int32_t n;                  /* tokens */
    int32_t tokens[];           /* [n] */
};

struct spec_store {
    int64_t max_bytes, bytes;   /* the bound and what is charged now, bytes */
    entry *oldest, *newest;
    u64map by_key;              /* key -> its newest entry */
    int32_t entries;
    int64_t puts, evictions;
};

static int64_t charge(int32_t n) { return (int64_t)n * (int64_t)sizeof(int32_t) + SPEC_STORE_ENTRY_BYTES; }

int spec_store_create(int64_t max_bytes, spec_store **out)
{
    *out = NULL;
    if (max_bytes < 1)
        return rd_fail(RD_EINVAL, "spec_store: max_bytes %lld must be >= 1", (long long)max_bytes);
    spec_store *s = calloc(1, sizeof *s);
    if (!s)
        return rd_fail(RD_ENOMEM, "spec_store: out of memory");
    s->max_bytes = max_bytes;
    umap_init(&s->by_key);
    *out = s;
    return 0;
}

void spec_store_destroy(spec_store *s)
{
    if (!s)
        return;
    for (entry *e = s->oldest; e;) {
        entry *next = e->next;
        free(e);
        e = next;
    }
    umap_free(&s->by_key);
    free(s);
}

uint64_t spec_store_key(const int32_t *prompt, int32_t n_prompt, uint64_t version)
{
    /* FNV-1a over the tokens' bytes, then the version, then a finalizer that spreads the bits. */
    uint64_t h = 0xcbf29ce484222325ull;
    for (int32_t i = 0; i < n_prompt; i++) {
        uint32_t t = (uint32_t)prompt[i];
        for (int b = 0; b < 4; b++, t >>= 8)
            h = (h ^ (t & 0xFFu)) * 0x100000001b3ull;
    }
    h ^= version * 0x9E3779B97F4A7C15ull;
    h ^= h >> 33;
    h *= 0xff51afd7ed558ccdull;
    h ^= h >> 33;
    return h ? h : 1; /* the map's keys are nonzero */
}

/* Drops the oldest entry (the tail of its key's chain). */
static void evict_oldest(spec_store *s)
{
    entry *e = s->oldest;
    s->oldest = e->next;
    if (s->oldest)
        s->oldest->prev = NULL;
    else
        s->newest = NULL;
    if (e->newer)
        e->newer->older = NULL;
    else
        umap_del(&s->by_key, e->key); /* it was its key's only entry */
    s->bytes -= charge(e->n);
    s->entries--;
    s->evictions++;
    free(e);
}

int spec_store_put(spec_store *s, uint64_t key, const int32_t *tokens, int32_t n)
{
    if (!s || key == 0 || !tokens || n < 1)
        return rd_fail(RD_EINVAL, "spec_store: put needs a store, a nonzero key and >= 1 token");
    const int64_t c = charge(n);
    if (c > s->max_bytes)
        return 0;
    entry *e = malloc(sizeof *e + sizeof(int32_t) * (size_t)n);
    if (!e)
        return rd_fail(RD_ENOMEM, "spec_store: out of memory for %d tokens", n);
    e->key = key;
    e->n = n;
    memcpy(e->tokens, tokens, sizeof(int32_t) * (size_t)n);
    /* Room first: the map may then find this key's chain gone, and start a new one. */
    while (s->bytes + c > s->max_bytes)
        evict_oldest(s);
    entry *prev_newest = umap_get(&s->by_key, key);
    if (umap_put(&s->by_key, key, e)) {
        free(e);
        return rd_fail(RD_ENOMEM, "spec_store: out of memory for the key map");
    }
    e->older = prev_newest;
    e->newer = NULL;
    if (prev_newest)
        prev_newest->newer = e;
    e->next = NULL;
    e->prev = s->newest;
    if (s->newest)
        s->newest->next = e;
    else
        s->oldest = e;
    s->newest = e;
    s->bytes += c;
    s->entries++;
    s->puts++;
    return 0;
}

int32_t spec_store_get(const spec_store *s, uint64_t key, spec_tokens *out, int32_t max)
{
    int32_t k = 0;
    if (!s || key == 0)
        return 0;
    for (const entry *e = umap_get(&s->by_key, key); e && k < max; e = e->older)
        out[k++] = (spec_tokens){e->tokens, e->n};
    return k;
}

void spec_store_get_stats(const spec_store *s, spec_store_stats *st)
{
    memset(st, 0, sizeof *st);
    if (!s)
        return;
    st->bytes = s->bytes;
    st->max_bytes = s->max_bytes;
    st->entries = s->entries;
    st->puts = s->puts;
    st->evictions = s->evictions;
}
