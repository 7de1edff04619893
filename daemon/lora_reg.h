/* lora_reg.h - the LoRA adapters the loop knows to be resident in the
 * engine: what admission checks a request's adapter name against, what
 * /v1/models, /status and /metrics list. The engine thread owns the
 * adapters themselves (eng_lora_load); this table follows its answers (a
 * load, the adapter it evicted, an unload). Loop thread only. */
#ifndef RD_DAEMON_LORA_REG_H
#define RD_DAEMON_LORA_REG_H

#include <stdint.h>

#include "engine/model/lora.h"

typedef struct {
    char name[LORA_NAME_MAX];
    char *path;                 /* the folder it was loaded from (owned), or NULL (pushed) */
    uint64_t version;
    int32_t rank;
    int64_t bytes;              /* the backend's */
} lr_entry;

typedef struct {
    lr_entry *e;                /* [n], in the order loaded */
    int32_t n, cap;
} lr_table;

void lr_free(lr_table *t);
/* The entry named name, or NULL. */
const lr_entry *lr_find(const lr_table *t, const char *name);
/* Adds name, or replaces the entry of that name (path copied; NULL allowed). 0 or RD_ENOMEM. */
int lr_put(lr_table *t, const char *name, const char *path, uint64_t version, int32_t rank, int64_t bytes);
/* Forgets name (nothing if absent). */
void lr_remove(lr_table *t, const char *name);

#endif
