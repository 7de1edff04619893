/* u64map.c - see u64map.h. */
#include "base/u64map.h"

#include <stdlib.h>

#include "base/err.h"

static size_t slot(uint64_t key, size_t cap)
{
    /* splitmix64 finalizer: client ids are random, request keys sequential. */
    key ^= key >> 30;
    key *= 0xbf58476d1ce4e5b9ull;
    key ^= key >> 27;
    key *= 0x94d049bb133111ebull;
    key ^= key >> 31;
    return (size_t)key & (cap - 1);
}

void umap_init(u64map *m)
{
    m->keys = NULL;
    m->vals = NULL;
    m->cap = m->count = 0;
}

void umap_free(u64map *m)
{
    free(m->keys);
    free(m->vals);
    umap_init(m);
}

void *umap_get(const u64map *m, uint64_t key)
{
    if (!m->cap || !key)
        return NULL;
    for (size_t i = slot(key, m->cap);; i = (i + 1) & (m->cap - 1)) {
        if (m->keys[i] == key)
            return m->vals[i];
        if (!m->keys[i])
            return NULL;
    }
}

static int grow(u64map *m)
{
    size_t cap = m->cap ? m->cap * 2 : 64;
    uint64_t *keys = calloc(cap, sizeof *keys);
    void **vals = calloc(cap, sizeof *vals);
    if (!keys || !vals) {
        free(keys);
        free(vals);
        return rd_fail(RD_ENOMEM, "hash map: out of memory growing to %zu slots", cap);
    }
    for (size_t j = 0; j < m->cap; j++) {
        if (!m->keys[j])
            continue;
        size_t i = slot(m->keys[j], cap);
        while (keys[i])
            i = (i + 1) & (cap - 1);
        keys[i] = m->keys[j];
        vals[i] = m->vals[j];
    }
    free(m->keys);
    free(m->vals);
    m->keys = keys;
    m->vals = vals;
    m->cap = cap;
    return 0;
}

int umap_put(u64map *m, uint64_t key, void *val)
{
    if (!key)
        return rd_fail(RD_EINVAL, "hash map: key 0 is reserved");
    /* Keep the load under 1/2 so probes stay short. */
    if ((m->count + 1) * 2 > m->cap) {
        int rc = grow(m);
        if (rc)
            return rc;
    }
    size_t i = slot(key, m->cap);
    while (m->keys[i] && m->keys[i] != key)
        i = (i + 1) & (m->cap - 1);
    if (!m->keys[i])
        m->count++;
    m->keys[i] = key;
    m->vals[i] = val;
    return 0;
}

void *umap_del(u64map *m, uint64_t key)
{
    if (!m->cap || !key)
        return NULL;
    size_t mask = m->cap - 1, i = slot(key, m->cap);
    while (m->keys[i] != key) {
        if (!m->keys[i])
            return NULL;
        i = (i + 1) & mask;
    }
    void *val = m->vals[i];
    /* Backward shift: move later entries of the probe run into the hole when
     * their home slot is at or before it (cyclically). */
    size_t j = i;
    for (;;) {
        j = (j + 1) & mask;
        if (!m->keys[j])
            break;
        size_t home = slot(m->keys[j], m->cap);
        if (((j - home) & mask) >= ((j - i) & mask)) {
            m->keys[i] = m->keys[j];
            m->vals[i] = m->vals[j];
            i = j;
        }
    }
    m->keys[i] = 0;
    m->vals[i] = NULL;
    m->count--;
    return val;
}
