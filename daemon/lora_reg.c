/* lora_reg.c - the loop's table of resident LoRA adapters (lora_reg.h). */
#include "daemon/lora_reg.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/err.h"

void lr_free(lr_table *t)
{
    for (int32_t i = 0; i < t->n; i++)
        free(t->e[i].path);
    free(t->e);
    memset(t, 0, sizeof *t);
}

static int32_t index_of(const lr_table *t, const char *name)
{
    for (int32_t i = 0; i < t->n; i++)
        if (!strcmp(t->e[i].name, name))
            return i;
    return -1;
}

const lr_entry *lr_find(const lr_table *t, const char *name)
{
    int32_t i = name ? index_of(t, name) : -1;
    return i >= 0 ? &t->e[i] : NULL;
}

int lr_put(lr_table *t, const char *name, const char *path, uint64_t version, int32_t rank, int64_t bytes)
{
    char *p = path ? strdup(path) : NULL;
    if (path && !p)
        return rd_fail(RD_ENOMEM, "lora table: out of memory");
    int32_t i = index_of(t, name);
    if (i < 0) {
        if (t->n == t->cap) {
            int32_t cap = t->cap ? 2 * t->cap : 8;
            lr_entry *e = realloc(t->e, sizeof *e * (size_t)cap);
            if (!e) {
                free(p);
                return rd_fail(RD_ENOMEM, "lora table: out of memory");
            }
            t->e = e;
            t->cap = cap;
        }
        i = t->n++;
        memset(&t->e[i], 0, sizeof t->e[i]);
        snprintf(t->e[i].name, sizeof t->e[i].name, "%s", name);
    }
    free(t->e[i].path);
    t->e[i].path = p;
    t->e[i].version = version;
    t->e[i].rank = rank;
    t->e[i].bytes = bytes;
    return 0;
}

void lr_remove(lr_table *t, const char *name)
{
    int32_t i = name ? index_of(t, name) : -1;
    if (i < 0)
        return;
    free(t->e[i].path);
    memmove(&t->e[i], &t->e[i + 1], sizeof *t->e * (size_t)(t->n - i - 1));
    t->n--;
}
