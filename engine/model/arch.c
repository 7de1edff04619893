/* arch.c - the family registry and the table arithmetic every loader,
 * exporter and the weight-update resolver share (arch.h). */
#include "engine/model/arch.h"

#include <stdio.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "base/err.h"
#include "engine/model/config.h"

extern const arch_desc arch_llama, arch_qwen2, arch_qwen3, arch_gemma3;

static const arch_desc *const FAMILIES[] = {&arch_llama, &arch_qwen2, &arch_qwen3, &arch_gemma3};
#define N_FAMILIES (sizeof FAMILIES / sizeof FAMILIES[0])

const arch_desc *arch_by_name(const char *name, size_t len)
{
    for (size_t i = 0; i < N_FAMILIES; i++)
        if (strlen(FAMILIES[i]->name) == len && !memcmp(FAMILIES[i]->name, name, len))
            return FAMILIES[i];
    return NULL;
}

const arch_desc *arch_by_hf(const char *hf_class, const char *model_type)
{
    for (size_t i = 0; i < N_FAMILIES; i++)
        if ((hf_class && !strcmp(FAMILIES[i]->hf_class, hf_class)) ||
            (!hf_class && model_type && !strcmp(FAMILIES[i]->hf_model_type, model_type)))
            return FAMILIES[i];
    return NULL;
}

const char *arch_names(void) { return "llama, qwen2, qwen3, gemma3"; }

int64_t arch_dim_value(const model_config *c, arch_dim d)
{
    switch (d) {
    case AD_ONE: return 1;
    case AD_HIDDEN: return c->dim;
    case AD_Q: return (int64_t)c->n_heads * c->head_dim;
    case AD_KV: return (int64_t)c->n_kv_heads * c->head_dim;
    case AD_FFN: return c->ffn_dim;
    case AD_VOCAB: return c->vocab;
    case AD_HEAD: return c->head_dim;
    }
    return 0;
}

int arch_tensor_present(const model_config *c, const arch_tensor *t)
{
    return !((t->flags & AT_UNTIED) && c->tied_embeddings);
}

int arch_group_per_layer(arch_group g) { return g >= AG_FIRST_LAYER; }

int arch_group_is_linear(arch_group g)
{
    return g == AG_EMBED || g == AG_LM_HEAD || g == AG_QKV || g == AG_O || g == AG_GATE_UP || g == AG_DOWN;
}

/* Names are formatted from the table's patterns, which contain at most one
 * "%d" (checked by test_arch), never from user input. */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wformat-nonliteral"
void arch_hf_name(const arch_tensor *t, int32_t layer, char *out, size_t cap)
{
    snprintf(out, cap, t->hf, layer);
}

void arch_gguf_name(const arch_tensor *t, int32_t layer, char *out, size_t cap)
{
    snprintf(out, cap, t->gguf, layer);
}
#pragma GCC diagnostic pop

/* Members of a fused group stack along rows (linears) or along the vector. */
static int64_t extent(const model_config *c, const arch_tensor *t)
{
    return arch_group_is_linear(t->group) ? arch_dim_value(c, t->rows) : arch_dim_value(c, t->cols);
}

void arch_group_shape(const arch_desc *a, const model_config *c, arch_group g, int64_t *rows, int64_t *cols)
{
    int64_t n = 0, other = 0;
    for (int32_t i = 0; i < a->n_tensors; i++) {
        const arch_tensor *t = &a->tensors[i];
        if (t->group != g)
            continue;
        n += extent(c, t);
        other = arch_group_is_linear(g) ? arch_dim_value(c, t->cols) : 1;
    }
    if (arch_group_is_linear(g)) {
        *rows = n;
        *cols = other;
    } else {
        *rows = n ? 1 : 0;
        *cols = n;
    }
}

int64_t arch_tensor_row0(const arch_desc *a, const model_config *c, const arch_tensor *t)
{
    int64_t at = 0;
    for (const arch_tensor *u = a->tensors; u < t; u++)
        if (u->group == t->group)
            at += extent(c, u);
    return at;
}

int arch_resolve_hf(const arch_desc *a, const model_config *c, const char *name, const arch_tensor **out,
                    int32_t *layer)
{
    int l = -1, n = 0;
    const char *rest = NULL;
    /* Per-layer names all start "model.layers.N."; the rest is the pattern's tail. */
    if (sscanf(name, "model.layers.%d.%n", &l, &n) == 1 && n > 0) {
        char canon[48];
        snprintf(canon, sizeof canon, "model.layers.%d.", l);
        if (l < 0 || l >= c->n_layers || (int)strlen(canon) != n || strncmp(canon, name, (size_t)n))
            return -1;
        rest = name + n;
    }
    for (int32_t i = 0; i < a->n_tensors; i++) {
        const arch_tensor *t = &a->tensors[i];
        if (!arch_tensor_present(c, t))
            continue;
        int per_layer = arch_group_per_layer(t->group);
        if (per_layer != (rest != NULL))
            continue;
        if (per_layer) {
            const char *tail = strstr(t->hf, "%d.");
            if (!tail || strcmp(tail + 3, rest))
                continue;
        } else if (strcmp(t->hf, name)) {
            continue;
        }
        *out = t;
        *layer = per_layer ? l : -1;
        return 0;
    }
    return -1;
}

int arch_hf_check_str(const void *json, const char *key, const char *want, const char *what)
{
    const cJSON *j = cJSON_GetObjectItemCaseSensitive(json, key);
    if (j && !(cJSON_IsString(j) && !strcmp(j->valuestring, want)))
        return rd_fail(RD_ENOTSUP, "model: config.json: %s must be \"%s\" (%s)", key, want, what);
    return 0;
}
