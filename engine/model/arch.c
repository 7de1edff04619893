/* arch.c - the table arithmetic every loader, exporter, family and the
 * weight-update resolver share (arch.h). The registry of the families is
 * arch_registry.c: it lists the families, which call this file, so it sits
 * above them and this file below (tools/check_layers.py, rule calls). */
#include "engine/model/arch.h"

#include <stdio.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "base/err.h"
#include "engine/model/config.h"

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
    case AD_EXPERTS: return c->n_experts;
    case AD_EXPERT_FFN: return c->expert_ffn_dim;
    }
    return 0;
}

/* Here, not in model.c: the runner and the Gemma 3 family ask it, and model.c
 * sits above both (it loads through the registry, which lists the families). */
int arch_layer_is_local(const model_config *c, int32_t l)
{
    return c->sliding_window > 0 && c->swa_period > 0 && l % c->swa_period != c->swa_period - 1;
}

int arch_tensor_present(const model_config *c, const arch_tensor *t)
{
    return !((t->flags & AT_UNTIED) && c->tied_embeddings);
}

int arch_group_per_layer(arch_group g) { return g >= AG_FIRST_LAYER; }

int arch_group_per_expert(arch_group g) { return g == AG_EXP_GATE_UP || g == AG_EXP_DOWN; }

int32_t arch_group_units(const model_config *c, arch_group g)
{
    return arch_group_per_expert(g) ? c->n_experts : 1;
}

int arch_group_is_linear(arch_group g)
{
    return g == AG_EMBED || g == AG_LM_HEAD || g == AG_QKV || g == AG_O || g == AG_GATE_UP || g == AG_DOWN ||
           g == AG_ROUTER || g == AG_EXP_GATE_UP || g == AG_EXP_DOWN;
}

/* Names are formatted from the table's patterns, which contain at most one
 * "%d" (two for AT_EXPERT HF names; checked by test_arch), never from user
 * input. An argument a pattern does not use is ignored (C11 7.21.6.1). */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wformat-nonliteral"
#pragma GCC diagnostic ignored "-Wformat-extra-args"
void arch_hf_name(const arch_tensor *t, int32_t layer, int32_t expert, char *out, size_t cap)
{
    snprintf(out, cap, t->hf, layer, expert);
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

/* Reads a canonical decimal below limit at *p (advancing it); -1 if none. */
static int32_t read_index(const char **p, int32_t limit)
{
    const char *s = *p;
    if (*s < '0' || *s > '9' || (*s == '0' && s[1] >= '0' && s[1] <= '9'))
        return -1;
    int64_t v = 0;
    while (*s >= '0' && *s <= '9' && v <= limit)
        v = v * 10 + (*s++ - '0');
    if (v >= limit)
        return -1;
    *p = s;
    return (int32_t)v;
}

/* Whether name matches pattern tail `pat`, in which "%d" stands for one
 * canonical number below limit (stored in *v; pat has at most one). */
static int match_tail(const char *pat, const char *name, int32_t limit, int32_t *v)
{
    const char *d = strstr(pat, "%d");
    *v = 0;
    if (!d)
        return !strcmp(pat, name);
    size_t pre = (size_t)(d - pat);
    if (strncmp(pat, name, pre))
        return 0;
    const char *p = name + pre;
    if ((*v = read_index(&p, limit)) < 0)
        return 0;
    return !strcmp(d + 2, p);
}

int arch_resolve_hf(const arch_desc *a, const model_config *c, const char *name, const arch_tensor **out,
                    int32_t *layer, int32_t *expert)
{
    static const char prefix[] = "model.layers.";
    int32_t l = -1;
    const char *rest = NULL;
    /* Per-layer names all start "model.layers.N."; the rest is the pattern's tail. */
    if (!strncmp(name, prefix, sizeof prefix - 1)) {
        const char *p = name + sizeof prefix - 1;
        if ((l = read_index(&p, c->n_layers)) < 0 || *p != '.')
            return -1;
        rest = p + 1;
    }
    for (int32_t i = 0; i < a->n_tensors; i++) {
        const arch_tensor *t = &a->tensors[i];
        if (!arch_tensor_present(c, t))
            continue;
        int per_layer = arch_group_per_layer(t->group);
        if (per_layer != (rest != NULL))
            continue;
        int32_t e = 0;
        if (per_layer) {
            const char *tail = strstr(t->hf, "%d.");
            if (!tail || !match_tail(tail + 3, rest, (t->flags & AT_EXPERT) ? c->n_experts : 0, &e))
                continue;
        } else if (strcmp(t->hf, name)) {
            continue;
        }
        *out = t;
        *layer = per_layer ? l : -1;
        *expert = e;
        return 0;
    }
    return -1;
}

/* Whether name matches pattern pat with each "%d" standing for any run of
 * digits (canonical or not, in range or not): the numbers' texts go to
 * num[]/len[] (at most 2). */
static int match_loose(const char *pat, const char *name, const char *num[2], size_t len[2])
{
    int k = 0;
    while (*pat) {
        if (pat[0] == '%' && pat[1] == 'd') {
            if (*name < '0' || *name > '9' || k == 2)
                return 0;
            num[k] = name;
            while (*name >= '0' && *name <= '9')
                name++;
            len[k] = (size_t)(name - num[k]);
            k++;
            pat += 2;
        } else if (*pat++ != *name++) {
            return 0;
        }
    }
    return *name == 0;
}

int arch_hf_explain(const arch_desc *a, const model_config *c, const char *name, char *why, size_t cap)
{
    for (int32_t i = 0; i < a->n_tensors; i++) {
        const arch_tensor *t = &a->tensors[i];
        const char *num[2];
        size_t len[2];
        if (!match_loose(t->hf, name, num, len))
            continue;
        if (!arch_tensor_present(c, t)) {
            snprintf(why, cap, "%s exists only when the embeddings are untied; this model ties it to "
                     "model.embed_tokens.weight", t->hf);
            return 0;
        }
        /* The numbers in the pattern's order: the layer, then (AT_EXPERT) the expert. */
        for (int k = 0; k < 1 + ((t->flags & AT_EXPERT) != 0); k++) {
            const char *what = k ? "expert" : "layer";
            int32_t limit = k ? c->n_experts : c->n_layers;
            int shown = (int)(len[k] < 20 ? len[k] : 20);
            if (len[k] > 1 && num[k][0] == '0') {
                size_t z = 0;
                while (z + 1 < len[k] && num[k][z] == '0')
                    z++;
                snprintf(why, cap, "%s number '%.*s' is not written canonically (expected '%.*s': no leading zeros)",
                         what, shown, num[k], (int)(len[k] - z < 20 ? len[k] - z : 20), num[k] + z);
                return 0;
            }
            long long v = 0;
            for (size_t d = 0; d < len[k] && v <= limit; d++)
                v = v * 10 + (num[k][d] - '0');
            if (v >= limit) {
                snprintf(why, cap, "%s %.*s is out of range (the model has %d %s: 0..%d)", what, shown, num[k], limit,
                         k ? "experts per layer" : "layers", limit - 1);
                return 0;
            }
        }
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
