/* u64map.h - a hash map from nonzero 64-bit keys to pointers (client ids,
 * request keys). Open addressing with linear probing and backward-shift
 * deletion, so there are no tombstones and lookups stay short. */
#ifndef RD_DAEMON_U64MAP_H
#define RD_DAEMON_U64MAP_H

#include <stddef.h>
#include <stdint.h>

typedef struct {
    uint64_t *keys;             /* [cap]; 0 = empty slot */
    void **vals;                /* [cap] */
    size_t cap;                 /* power of two, or 0 before the first put */
    size_t count;
} u64map;

void umap_init(u64map *m);
void umap_free(u64map *m);
void *umap_get(const u64map *m, uint64_t key);
/* Inserts or replaces; key must be nonzero. RD_ENOMEM if the table cannot grow. */
int umap_put(u64map *m, uint64_t key, void *val);
/* Removes key; returns its value or NULL. */
void *umap_del(u64map *m, uint64_t key);

#endif
