/* lora.c - PEFT LoRA adapters and the resident set (lora.h).
 *
 * Loading is three passes, each of which can refuse the folder:
 *   1. adapter_config.json: the keys that change what the adapter computes
 *      are either understood or refused by name, never ignored;
 *   2. target_modules is matched, as PEFT matches it, against every linear
 *      module of the model (the family's table, arch.h): the selection says
 *      which (layer, module) pairs the file must hold, and a selected module
 *      rolloutd cannot serve (embeddings, LM head, MoE router or experts)
 *      is refused before the file is read;
 *   3. adapter_model.safetensors: every tensor must be the A or B of a
 *      selected pair, every selected pair needs both, with the shapes the
 *      model's config gives the module. Then the data is copied out and the
 *      file closed. */
#include "engine/model/lora.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "base/err.h"
#include "engine/model/arch.h"
#include "engine/model/config.h"

/* A config file is a few kB; anything much larger is not one. */
#define LORA_MAX_CONFIG (1u << 20)
/* Backtracking steps one regex match may take: module names are short, so
 * a real pattern needs a few hundred; a pathological one ((a+)+$) is cut
 * off and refused instead of spinning over thousands of expert names. */
#define LORA_MATCH_LIMIT 100000u
/* A and B start on a cache line each (SIMD loads in the compute op to come). */
#define LORA_ALIGN 64u

/* The module's HF name inside a layer (model.layers.N.<this>). */
static const char *const MOD_PATH[LORA_N_MODULES] = {
    "self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
    "mlp.gate_proj",    "mlp.up_proj",      "mlp.down_proj",
};

static const char PREFIX[] = "base_model.model.";   /* PEFT's wrapper around the model's names */

int lora_to_f32(const void *src, st_dtype dt, size_t n, float *dst)
{
    st_tensor t = {.name = "lora", .dtype = dt, .n_elems = n, .data = src};
    return st_read_f32(&t, dst);
}

void lora_free(lora_adapter *a)
{
    if (!a)
        return;
    free(a->pairs);
    free(a->mem);
    free(a->path);
    free(a);
}

/* ------------------------------------------------------------ the loader */

/* What a linear module of the model is to an adapter. */
typedef enum { K_LORA, K_EMBED, K_LM_HEAD, K_ROUTER, K_EXPERT, K_OTHER } mod_kind;

typedef struct {
    const char *dir;
    const model_config *mc;
    const arch_desc *ad;
    int32_t max_rank;
    /* target_modules: exactly one of these three. */
    int all_linear;
    pcre2_code *re;
    pcre2_match_data *md;
    pcre2_match_context *mctx;  /* bounds a regex's backtracking (LORA_MATCH_LIMIT) */
    int re_limit_hit;           /* a match ran out of its limit */
    const cJSON *list;          /* array of strings */
    uint8_t *hit;               /* [list size]: the entry matched a module */
    const char *re_text;
    uint8_t *layer_on;          /* [n_layers], or NULL: layers_to_transform absent (every layer) */
    int check_only;             /* lora_load_tensors without data: the checks, no copy */
    uint8_t *want;              /* [n_layers][LORA_N_MODULES]: selected by the config */
    const st_tensor **ta, **tb; /* [n_layers][LORA_N_MODULES]: found in the file */
    int32_t in[LORA_N_MODULES], out[LORA_N_MODULES];
} loader;

static int fail(const loader *x, int code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int fail(const loader *x, int code, const char *fmt, ...)
{
    char msg[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return rd_fail(code, "lora: '%.200s': %s", x->dir, msg);
}

/* The whole of path, NUL-terminated (malloc'd); NULL with errno set. */
static char *read_text(const char *path, size_t limit, int *too_big)
{
    *too_big = 0;
    FILE *fp = fopen(path, "rb");
    if (!fp)
        return NULL;
    struct stat sb;
    if (fstat(fileno(fp), &sb) != 0 || !S_ISREG(sb.st_mode)) {
        fclose(fp);
        errno = EISDIR;
        return NULL;
    }
    if ((uint64_t)sb.st_size > limit) {
        fclose(fp);
        *too_big = 1;
        return NULL;
    }
    size_t n = (size_t)sb.st_size;
    char *buf = malloc(n + 1);
    if (!buf || fread(buf, 1, n, fp) != n) {
        const int e = buf ? EIO : ENOMEM;   /* fread sets no errno of its own on a short read */
        free(buf);
        fclose(fp);
        errno = e;
        return NULL;
    }
    fclose(fp);
    buf[n] = 0;
    return buf;
}

static int exists(const char *dir, const char *file)
{
    char p[4200];
    snprintf(p, sizeof p, "%s/%s", dir, file);
    struct stat sb;
    return stat(p, &sb) == 0;
}

/* key absent or null: *v = dflt; a boolean: its value; else RD_EFORMAT. */
static int cfg_bool(const loader *x, const cJSON *root, const char *key, int dflt, int *v)
{
    const cJSON *j = cJSON_GetObjectItemCaseSensitive(root, key);
    if (!j || cJSON_IsNull(j)) {
        *v = dflt;
        return 0;
    }
    if (!cJSON_IsBool(j))
        return fail(x, RD_EFORMAT, "adapter_config.json: \"%s\" must be true or false", key);
    *v = cJSON_IsTrue(j);
    return 0;
}

/* Whether key is absent, null, false, "" or an empty list or object: the
 * values by which PEFT says an option is off. */
static int cfg_off(const cJSON *root, const char *key)
{
    const cJSON *j = cJSON_GetObjectItemCaseSensitive(root, key);
    if (!j || cJSON_IsNull(j) || cJSON_IsFalse(j))
        return 1;
    if (cJSON_IsString(j))
        return j->valuestring[0] == 0;
    if (cJSON_IsArray(j) || cJSON_IsObject(j))
        return j->child == NULL;
    return 0;
}

/* The value as compact JSON for a message (at most cap - 1 bytes). */
static const char *shown(const cJSON *root, const char *key, char *buf, size_t cap)
{
    char *s = cJSON_PrintUnformatted(cJSON_GetObjectItemCaseSensitive(root, key));
    snprintf(buf, cap, "%s", s ? s : "?");
    if (s && strlen(s) >= cap && cap > 4)
        memcpy(buf + cap - 4, "...", 4);
    free(s);
    return buf;
}

/* Options that change what an adapter computes and that rolloutd does not
 * serve: each refused by its key, so that no adapter is silently served as
 * something else than it was trained as. */
static int check_refused(const loader *x, const cJSON *root)
{
    static const struct {
        const char *key, *why;
    } OFF[] = {
        {"use_dora", "DoRA adapters (weight-decomposed LoRA) are not supported, only plain LoRA"},
        {"modules_to_save", "modules trained in full beside the adapter are not supported"},
        {"rank_pattern", "per-module ranks are not supported (one r for every module)"},
        {"alpha_pattern", "per-module alphas are not supported (one lora_alpha for every module)"},
        {"lora_bias", "a bias on lora_B is not supported"},
        {"fan_in_fan_out", "transposed (Conv1D, GPT-2 style) weights are not supported"},
        {"layer_replication", "layer replication is not supported"},
        {"exclude_modules", "exclude_modules is not supported (list the targets instead)"},
        {"target_parameters", "LoRA on parameters (MoE expert tensors) is not supported"},
        {"trainable_token_indices", "trained token embeddings are not supported"},
        {"use_qalora", "QA-LoRA is not supported"},
        {"alora_invocation_tokens", "activated LoRA (aLoRA) is not supported"},
    };
    char v[96];
    for (size_t i = 0; i < sizeof OFF / sizeof OFF[0]; i++)
        if (!cfg_off(root, OFF[i].key))
            return fail(x, RD_ENOTSUP, "adapter_config.json: \"%s\" is %s: %s", OFF[i].key,
                        shown(root, OFF[i].key, v, sizeof v), OFF[i].why);
    const cJSON *bias = cJSON_GetObjectItemCaseSensitive(root, "bias");
    if (bias && !cJSON_IsNull(bias) && !(cJSON_IsString(bias) && !strcmp(bias->valuestring, "none")))
        return fail(x, RD_ENOTSUP, "adapter_config.json: \"bias\" is %s: trained biases are not supported "
                    "(only \"none\")", shown(root, "bias", v, sizeof v));
    const cJSON *pt = cJSON_GetObjectItemCaseSensitive(root, "peft_type");
    if (pt && !cJSON_IsNull(pt) && !(cJSON_IsString(pt) && !strcmp(pt->valuestring, "LORA")))
        return fail(x, RD_ENOTSUP, "adapter_config.json: \"peft_type\" is %s: only LORA adapters are read",
                    shown(root, "peft_type", v, sizeof v));
    return 0;
}

/* r, lora_alpha, use_rslora (PEFT's defaults 8, 8, false when absent). */
static int read_rank(const loader *x, const cJSON *root, lora_adapter *a)
{
    const cJSON *r = cJSON_GetObjectItemCaseSensitive(root, "r");
    double rv = 8;
    if (r && !cJSON_IsNull(r)) {
        if (!cJSON_IsNumber(r) || !(r->valuedouble >= 1) || r->valuedouble > 1e9 ||
            r->valuedouble != floor(r->valuedouble))
            return fail(x, RD_EFORMAT, "adapter_config.json: \"r\" must be a positive integer");
        rv = r->valuedouble;
    }
    if (rv > x->max_rank)
        return fail(x, RD_ERANGE, "rank r = %.0f is above the maximum LoRA rank %d", rv, x->max_rank);
    const cJSON *al = cJSON_GetObjectItemCaseSensitive(root, "lora_alpha");
    double alpha = 8;
    if (al && !cJSON_IsNull(al)) {
        if (!cJSON_IsNumber(al) || !isfinite(al->valuedouble) || fabs(al->valuedouble) > 1e30)
            return fail(x, RD_EFORMAT, "adapter_config.json: \"lora_alpha\" must be a number");
        alpha = al->valuedouble;
    }
    int rc = cfg_bool(x, root, "use_rslora", 0, &a->rslora);
    if (rc)
        return rc;
    a->rank = (int32_t)rv;
    a->alpha = (float)alpha;
    a->scale = (float)(a->rslora ? alpha / sqrt(rv) : alpha / rv);
    return 0;
}

/* layers_to_transform (an int or a list of ints, each a layer of the
 * model) and layers_pattern, which must name the model's layer list. */
static int read_layers(loader *x, const cJSON *root)
{
    const int32_t nl = x->mc->n_layers;
    const cJSON *lp = cJSON_GetObjectItemCaseSensitive(root, "layers_pattern");
    if (lp && !cJSON_IsNull(lp)) {
        int ok = cJSON_IsString(lp) && !strcmp(lp->valuestring, "layers");
        if (cJSON_IsArray(lp))
            for (const cJSON *e = lp->child; e; e = e->next)
                ok |= cJSON_IsString(e) && !strcmp(e->valuestring, "layers");
        if (!ok) {
            char v[96];
            return fail(x, RD_ENOTSUP, "adapter_config.json: \"layers_pattern\" is %s; this model's layers are "
                        "model.layers.N (\"layers\")", shown(root, "layers_pattern", v, sizeof v));
        }
    }
    const cJSON *lt = cJSON_GetObjectItemCaseSensitive(root, "layers_to_transform");
    if (!lt || cJSON_IsNull(lt))
        return 0;
    if (!(x->layer_on = calloc((size_t)nl, 1)))
        return fail(x, RD_ENOMEM, "out of memory");
    const cJSON *one = cJSON_IsNumber(lt) ? lt : NULL;
    if (!one && !cJSON_IsArray(lt))
        return fail(x, RD_EFORMAT, "adapter_config.json: \"layers_to_transform\" must be a layer number or a "
                    "list of them");
    for (const cJSON *e = one ? one : lt->child; e; e = one ? NULL : e->next) {
        if (!cJSON_IsNumber(e) || e->valuedouble != floor(e->valuedouble) || !(e->valuedouble >= 0))
            return fail(x, RD_EFORMAT, "adapter_config.json: \"layers_to_transform\" holds a value that is not a "
                        "layer number");
        if (e->valuedouble >= nl)
            return fail(x, RD_EFORMAT, "adapter_config.json: \"layers_to_transform\" names layer %.0f; the "
                        "model has %d layers", e->valuedouble, nl);
        x->layer_on[(int32_t)e->valuedouble] = 1;
    }
    return 0;
}

static int read_targets(loader *x, const cJSON *root)
{
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(root, "target_modules");
    if (!t || cJSON_IsNull(t))
        return fail(x, RD_EFORMAT, "adapter_config.json: \"target_modules\" is missing");
    if (cJSON_IsString(t)) {
        if (!strcmp(t->valuestring, "all-linear")) {
            x->all_linear = 1;
            return 0;
        }
        int err;
        PCRE2_SIZE at;
        x->re_text = t->valuestring;
        x->re = pcre2_compile((PCRE2_SPTR)t->valuestring, PCRE2_ZERO_TERMINATED, 0, &err, &at, NULL);
        if (!x->re) {
            PCRE2_UCHAR msg[160];
            pcre2_get_error_message(err, msg, sizeof msg);
            return fail(x, RD_EFORMAT, "adapter_config.json: \"target_modules\" regex '%.100s': %s at offset %zu",
                        t->valuestring, (const char *)msg, (size_t)at);
        }
        if (!(x->md = pcre2_match_data_create_from_pattern(x->re, NULL)) ||
            !(x->mctx = pcre2_match_context_create(NULL)))
            return fail(x, RD_ENOMEM, "out of memory");
        pcre2_set_match_limit(x->mctx, LORA_MATCH_LIMIT);
        return 0;
    }
    if (!cJSON_IsArray(t) || !t->child)
        return fail(x, RD_EFORMAT, "adapter_config.json: \"target_modules\" must be a non-empty list of module "
                    "names, a regex or \"all-linear\"");
    int n = 0;
    for (const cJSON *e = t->child; e; e = e->next, n++)
        if (!cJSON_IsString(e) || !e->valuestring[0])
            return fail(x, RD_EFORMAT, "adapter_config.json: \"target_modules\" entry %d is not a module name", n);
    x->list = t;
    if (!(x->hit = calloc((size_t)n, 1)))
        return fail(x, RD_ENOMEM, "out of memory");
    return 0;
}

static mod_kind classify(const arch_tensor *t, lora_module *m)
{
    switch (t->group) {
    case AG_EMBED: return K_EMBED;
    case AG_LM_HEAD: return K_LM_HEAD;
    case AG_ROUTER: return K_ROUTER;
    case AG_EXP_GATE_UP:
    case AG_EXP_DOWN: return K_EXPERT;
    default: break;
    }
    static const char pre[] = "model.layers.%d.";
    if (strncmp(t->hf, pre, sizeof pre - 1))
        return K_OTHER;
    const char *rest = t->hf + sizeof pre - 1;
    for (int i = 0; i < LORA_N_MODULES; i++) {
        size_t n = strlen(MOD_PATH[i]);
        if (!strncmp(rest, MOD_PATH[i], n) && !strcmp(rest + n, ".weight")) {
            *m = (lora_module)i;
            return K_LORA;
        }
    }
    return K_OTHER;
}

/* The refusal of a selected module rolloutd does not serve LoRA on. */
static int refuse_kind(const loader *x, mod_kind k, const char *what)
{
    switch (k) {
    case K_EMBED:
        return fail(x, RD_ENOTSUP, "%s: LoRA on the token embeddings (embed_tokens) is not supported", what);
    case K_LM_HEAD: return fail(x, RD_ENOTSUP, "%s: LoRA on the LM head (lm_head) is not supported", what);
    case K_ROUTER: return fail(x, RD_ENOTSUP, "%s: LoRA on the MoE router (mlp.gate) is not supported", what);
    case K_EXPERT:
        return fail(x, RD_ENOTSUP, "%s: LoRA on the MoE experts is not supported (%s: the attention's q_proj, "
                    "k_proj, v_proj, o_proj only)", what, x->mc->arch);
    default: return fail(x, RD_ENOTSUP, "%s: LoRA on this module is not supported", what);
    }
}

/* Whether target_modules selects module key, as PEFT decides it: a list
 * entry equal to key or to a tail of it after a '.'; a regex matching all of
 * key; "all-linear": every nn.Linear but the output layer. */
static int selects(loader *x, const char *key, mod_kind k)
{
    if (x->all_linear)
        return k != K_LM_HEAD && k != K_EMBED;
    if (x->re) {
        int rc = pcre2_match(x->re, (PCRE2_SPTR)key, PCRE2_ZERO_TERMINATED, 0, PCRE2_ANCHORED | PCRE2_ENDANCHORED,
                             x->md, x->mctx);
        if (rc == PCRE2_ERROR_MATCHLIMIT || rc == PCRE2_ERROR_DEPTHLIMIT)
            x->re_limit_hit = 1;
        return rc >= 0;
    }
    int any = 0, i = 0;
    const size_t kl = strlen(key);
    for (const cJSON *e = x->list->child; e; e = e->next, i++) {
        const size_t el = strlen(e->valuestring);
        if (!strcmp(key, e->valuestring) ||
            (kl > el && key[kl - el - 1] == '.' && !strcmp(key + kl - el, e->valuestring))) {
            x->hit[i] = 1;
            any = 1;
        }
    }
    return any;
}

/* One linear module of the model: selected (and, where layers_to_transform
 * is given, in one of its layers) it is wanted or refused. */
static int visit(loader *x, const char *key, mod_kind k, lora_module m, int32_t layer, int *n_sel)
{
    const int sel = selects(x, key, k);
    if (x->re_limit_hit)
        return fail(x, RD_EFORMAT, "the target_modules regex '%.100s' takes over %u backtracking steps on '%.100s'",
                    x->re_text, LORA_MATCH_LIMIT, key);
    if (!sel)
        return 0;
    if (x->layer_on && (layer < 0 || !x->layer_on[layer]))
        return 0;
    if (k != K_LORA) {
        char what[160];
        snprintf(what, sizeof what, "target_modules selects %.120s", key);
        return refuse_kind(x, k, what);
    }
    x->want[(size_t)layer * LORA_N_MODULES + m] = 1;
    (*n_sel)++;
    return 0;
}

/* Visits every instance of table tensor t's module (per layer, per expert). */
static int visit_tensor(loader *x, const arch_tensor *t, mod_kind k, lora_module m, int *n_sel)
{
    const model_config *c = x->mc;
    const int per_layer = arch_group_per_layer(t->group);
    const int32_t nl = per_layer ? c->n_layers : 1;
    const int32_t ne = (t->flags & AT_EXPERT) ? c->n_experts : 1;
    char key[256];
    for (int32_t l = 0; l < nl; l++)
        for (int32_t e = 0; e < ne; e++) {
            arch_hf_name(t, l, e, key, sizeof key);
            char *dot = strrchr(key, '.');   /* the module is the weight's owner */
            if (dot && !strcmp(dot, ".weight"))
                *dot = 0;
            int rc = visit(x, key, k, m, per_layer ? l : -1, n_sel);
            if (rc)
                return rc;
        }
    return 0;
}

/* Matches target_modules against every linear module of the model (the
 * family's table; the LM head always, as HF models have an lm_head module
 * even when it shares the embeddings' weight). Kind by kind, so that the
 * refusal of a selection spanning several kinds (all-linear on an MoE)
 * names the experts before the router. */
static int select_modules(loader *x)
{
    static const mod_kind ORDER[] = {K_LORA, K_EXPERT, K_ROUTER, K_EMBED, K_OTHER};
    const model_config *c = x->mc;
    int n_sel = 0, rc;
    for (size_t o = 0; o < sizeof ORDER / sizeof ORDER[0]; o++)
        for (int32_t i = 0; i < x->ad->n_tensors; i++) {
            const arch_tensor *t = &x->ad->tensors[i];
            lora_module m = LORA_Q;
            if (!arch_group_is_linear(t->group) || t->group == AG_LM_HEAD || classify(t, &m) != ORDER[o])
                continue;
            if (ORDER[o] == K_LORA) {
                x->in[m] = (int32_t)arch_dim_value(c, t->cols);
                x->out[m] = (int32_t)arch_dim_value(c, t->rows);
            }
            if ((rc = visit_tensor(x, t, ORDER[o], m, &n_sel)))
                return rc;
        }
    if ((rc = visit(x, "lm_head", K_LM_HEAD, LORA_Q, -1, &n_sel)))
        return rc;
    if (x->list) {
        int i = 0;
        for (const cJSON *e = x->list->child; e; e = e->next, i++)
            if (!x->hit[i]) {
                char have[160] = "";
                for (int m = 0; m < LORA_N_MODULES; m++)
                    if (x->in[m])
                        snprintf(have + strlen(have), sizeof have - strlen(have), "%s%s", have[0] ? ", " : "",
                                 lora_module_name(m));
                return fail(x, RD_EFORMAT, "target_modules names '%.80s', which is no linear module of this %s "
                            "model (LoRA targets it has: %s)", e->valuestring, c->arch, have);
            }
    }
    if (n_sel == 0) {
        if (x->re)
            return fail(x, RD_EFORMAT, "the target_modules regex '%.100s' matches no module of this %s model%s",
                        x->re_text, c->arch, x->layer_on ? " in layers_to_transform" : "");
        return fail(x, RD_EFORMAT, "target_modules selects no module of this %s model%s", c->arch,
                    x->layer_on ? " in layers_to_transform" : "");
    }
    return 0;
}

static int ends_with(const char *s, const char *tail)
{
    size_t n = strlen(s), k = strlen(tail);
    return n >= k && !strcmp(s + n - k, tail);
}

/* Sorts one tensor of the file into its pair, or refuses it. */
static int place_tensor(loader *x, const st_tensor *t)
{
    const char *name = t->name;
    if (strstr(name, "lora_magnitude_vector"))
        return fail(x, RD_ENOTSUP, "tensor '%.120s' is DoRA's magnitude: DoRA adapters are not supported", name);
    if (strstr(name, "lora_embedding_A") || strstr(name, "lora_embedding_B"))
        return fail(x, RD_ENOTSUP, "tensor '%.120s': LoRA on the token embeddings (embed_tokens) is not "
                    "supported", name);
    if (ends_with(name, ".lora_B.bias"))
        return fail(x, RD_ENOTSUP, "tensor '%.120s': a bias on lora_B is not supported", name);
    int is_b = ends_with(name, ".lora_B.weight");
    if ((!is_b && !ends_with(name, ".lora_A.weight")) || strncmp(name, PREFIX, sizeof PREFIX - 1))
        return fail(x, RD_EFORMAT, "unexpected tensor '%.120s' (a PEFT LoRA file holds only "
                    "base_model.model.<module>.lora_A.weight and .lora_B.weight)", name);
    char module[256], w[270];
    const char *m0 = name + sizeof PREFIX - 1;
    size_t ml = strlen(m0) - strlen(".lora_A.weight");
    if (ml == 0 || ml >= sizeof module)
        return fail(x, RD_EFORMAT, "unexpected tensor '%.120s'", name);
    memcpy(module, m0, ml);
    module[ml] = 0;
    if (!strcmp(module, "lm_head")) {
        char what[300];
        snprintf(what, sizeof what, "tensor '%.120s'", name);
        return refuse_kind(x, K_LM_HEAD, what);
    }
    snprintf(w, sizeof w, "%s.weight", module);
    const arch_tensor *at;
    int32_t layer, expert;
    if (arch_resolve_hf(x->ad, x->mc, w, &at, &layer, &expert) != 0) {
        char why[200] = "";
        if (arch_hf_explain(x->ad, x->mc, w, why, sizeof why) != 0)
            snprintf(why, sizeof why, "no module of this %s model is called '%.80s'", x->mc->arch, module);
        return fail(x, RD_EFORMAT, "tensor '%.120s' does not fit the model: %s", name, why);
    }
    lora_module m = LORA_Q;
    mod_kind k = classify(at, &m);
    if (k != K_LORA) {
        char what[300];
        snprintf(what, sizeof what, "tensor '%.120s'", name);
        return refuse_kind(x, k, what);
    }
    const size_t slot = (size_t)layer * LORA_N_MODULES + m;
    if (!x->want[slot])
        return fail(x, RD_EFORMAT, "tensor '%.120s' is for %s, which adapter_config.json does not select "
                    "(target_modules%s)", name, module, x->layer_on ? ", layers_to_transform" : "");
    const st_tensor **dst = is_b ? &x->tb[slot] : &x->ta[slot];
    if (*dst)
        return fail(x, RD_EFORMAT, "tensor '%.120s' appears twice", name);
    if (t->dtype != ST_F32 && t->dtype != ST_F16 && t->dtype != ST_BF16)
        return fail(x, RD_ENOTSUP, "tensor '%.120s' is %s; LoRA tensors must be F32, F16 or BF16", name,
                    st_dtype_name(t->dtype));
    *dst = t;
    return 0;
}

/* A [r, in] and B [out, r] of pair (layer, m), both present. */
static int check_pair(const loader *x, int32_t layer, lora_module m, int32_t r)
{
    const size_t slot = (size_t)layer * LORA_N_MODULES + m;
    const char *path = MOD_PATH[m];
    for (int b = 0; b < 2; b++) {
        const st_tensor *t = b ? x->tb[slot] : x->ta[slot];
        const char *ab = b ? "lora_B" : "lora_A";
        if (!t)
            return fail(x, RD_EFORMAT, "model.layers.%d.%s has no %s.weight (target_modules selects the module, "
                        "which then needs both lora_A and lora_B)", layer, path, ab);
        const int64_t want0 = b ? x->out[m] : r, want1 = b ? r : x->in[m];
        if (t->n_dims != 2 || t->shape[0] != want0 || t->shape[1] != want1) {
            char got[64] = "";
            for (int d = 0; d < t->n_dims && d < 4; d++)
                snprintf(got + strlen(got), sizeof got - strlen(got), "%s%lld", d ? ", " : "",
                         (long long)t->shape[d]);
            return fail(x, RD_EFORMAT, "tensor '%.120s' has shape [%s]; expected [%lld, %lld] (%s is %s with r = %d, "
                        "%s in = %d, out = %d)", t->name, got, (long long)want0, (long long)want1, ab,
                        b ? "[out, r]" : "[r, in]", r, lora_module_name(m), x->in[m], x->out[m]);
        }
    }
    return 0;
}

static size_t round_up(size_t n) { return (n + LORA_ALIGN - 1) / LORA_ALIGN * LORA_ALIGN; }

/* Copies every pair's data out of the file into one allocation. */
static int take_data(loader *x, lora_adapter *a)
{
    const size_t n = (size_t)x->mc->n_layers * LORA_N_MODULES;
    size_t total = 0;
    for (size_t i = 0; i < n; i++)
        if (x->want[i])
            total += round_up(x->ta[i]->n_elems * st_dtype_size(x->ta[i]->dtype)) +
                     round_up(x->tb[i]->n_elems * st_dtype_size(x->tb[i]->dtype));
    if (!(a->pairs = calloc(n, sizeof *a->pairs)) || !(a->mem = aligned_alloc(LORA_ALIGN, round_up(total))))
        return fail(x, RD_ENOMEM, "out of memory for %zu bytes of adapter", total);
    uint8_t *p = a->mem;
    for (size_t i = 0; i < n; i++) {
        if (!x->want[i])
            continue;
        const st_tensor *ts[2] = {x->ta[i], x->tb[i]};
        for (int b = 0; b < 2; b++) {
            const size_t bytes = ts[b]->n_elems * st_dtype_size(ts[b]->dtype);
            memcpy(p, ts[b]->data, bytes);
            if (b) {
                a->pairs[i].b = p;
                a->pairs[i].b_dtype = ts[b]->dtype;
            } else {
                a->pairs[i].a = p;
                a->pairs[i].a_dtype = ts[b]->dtype;
            }
            a->bytes += bytes;
            p += round_up(bytes);
        }
        a->modules |= 1u << (i % LORA_N_MODULES);
        a->n_pairs++;
    }
    return 0;
}

/* The folder's last component, the adapter's name until it is given one. */
static void default_name(const char *dir, char *out, size_t cap)
{
    size_t n = strlen(dir);
    while (n > 1 && dir[n - 1] == '/')
        n--;
    size_t s = n;
    while (s > 0 && dir[s - 1] != '/')
        s--;
    size_t k = n - s < cap - 1 ? n - s : cap - 1;
    memcpy(out, dir + s, k);
    out[k] = 0;
}

static void reset_loader(loader *x);

/* The config's text, then the tensors of the safetensors file f: the checks both entry points share. */
static int load_parts(loader *x, lora_adapter *a, const char *text, const st_file *f)
{
    const model_config *c = x->mc;
    cJSON *root = cJSON_Parse(text);
    int rc = 0;
    if (!root || !cJSON_IsObject(root)) {
        const char *at = cJSON_GetErrorPtr();
        long off = root || !at || at < text || at > text + strlen(text) ? -1 : (long)(at - text);
        rc = off >= 0 ? fail(x, RD_EFORMAT, "adapter_config.json is not valid JSON (error near byte %ld)", off)
                      : fail(x, RD_EFORMAT, "adapter_config.json is not a JSON object");
        goto out;
    }
    if ((rc = check_refused(x, root)) || (rc = read_rank(x, root, a)) || (rc = read_layers(x, root)) ||
        (rc = read_targets(x, root)) || (rc = select_modules(x)))
        goto out;
    if (!f)
        goto out;   /* the caller reports the missing file after the config's refusals */
    for (size_t i = 0; i < f->n_tensors; i++)
        if ((rc = place_tensor(x, &f->tensors[i])))
            goto out;
    for (int32_t l = 0; l < c->n_layers; l++)
        for (int m = 0; m < LORA_N_MODULES; m++)
            if (x->want[(size_t)l * LORA_N_MODULES + m] && (rc = check_pair(x, l, (lora_module)m, a->rank)))
                goto out;
    if (x->check_only || (rc = take_data(x, a)))
        goto out;
    memcpy(a->in, x->in, sizeof a->in);
    memcpy(a->out, x->out, sizeof a->out);
out:
    cJSON_Delete(root);
    return rc;
}

/* The folder's two files. */
static int load_dir(loader *x, lora_adapter *a)
{
    struct stat sb;
    if (stat(x->dir, &sb) != 0)
        return fail(x, RD_EIO, "cannot open the adapter folder: %s", strerror(errno));
    if (!S_ISDIR(sb.st_mode))
        return fail(x, RD_EIO, "not a folder (a PEFT adapter is a folder with adapter_config.json and "
                    "adapter_model.safetensors)");
    char path[4200];
    snprintf(path, sizeof path, "%s/adapter_config.json", x->dir);
    int too_big;
    char *text = read_text(path, LORA_MAX_CONFIG, &too_big);
    if (!text)
        return too_big ? fail(x, RD_EFORMAT, "adapter_config.json is over %u bytes; not an adapter config",
                              LORA_MAX_CONFIG)
                       : fail(x, RD_EIO, "cannot read adapter_config.json: %s", strerror(errno));
    st_file *f = NULL;
    int rc = load_parts(x, a, text, NULL);   /* the config's refusals come before the file's */
    if (!rc) {
        snprintf(path, sizeof path, "%s/adapter_model.safetensors", x->dir);
        if (stat(path, &sb) != 0) {
            rc = exists(x->dir, "adapter_model.bin")
                     ? fail(x, RD_ENOTSUP, "holds adapter_model.bin (a pickle), which is not read; save it with "
                            "safe_serialization=True (adapter_model.safetensors)")
                     : fail(x, RD_EIO, "cannot open adapter_model.safetensors: %s", strerror(errno));
        } else if ((rc = st_open(path, &f))) {
            char msg[300];
            snprintf(msg, sizeof msg, "%s", rd_errmsg());
            rc = fail(x, rc, "adapter_model.safetensors: %s", msg);
        }
    }
    if (!rc) {
        reset_loader(x);
        rc = load_parts(x, a, text, f);
    }
    st_close(f);
    free(text);
    return rc;
}

/* Frees what one pass of load_parts kept in x, so that a second pass starts clean. */
static void reset_loader(loader *x)
{
    const size_t n = (size_t)x->mc->n_layers * LORA_N_MODULES;
    pcre2_match_context_free(x->mctx);
    pcre2_match_data_free(x->md);
    pcre2_code_free(x->re);
    free(x->hit);
    free(x->layer_on);
    x->mctx = NULL;
    x->md = NULL;
    x->re = NULL;
    x->hit = NULL;
    x->layer_on = NULL;
    x->list = NULL;
    x->all_linear = 0;
    x->re_text = NULL;
    x->re_limit_hit = 0;
    memset(x->want, 0, n);
    memset(x->ta, 0, n * sizeof *x->ta);
    memset(x->tb, 0, n * sizeof *x->tb);
}

/* One entry point's work: dir names the folder (or labels an in-memory adapter in messages); text and f
 * are the in-memory parts (text NULL: read the folder). */
static int load_any(const char *dir, const char *text, const st_file *f, const model_config *mc, int32_t max_rank,
                    int check_only, lora_adapter **out)
{
    if (!out && !check_only)
        return rd_fail(RD_EINVAL, "lora_load_peft: out is NULL");
    if (out)
        *out = NULL;
    if (!dir || !*dir || !mc)
        return rd_fail(RD_EINVAL, "lora_load_peft: a folder (or a name) and a model config are needed");
    if (max_rank < 1 || max_rank > LORA_MAX_RANK)
        return rd_fail(RD_EINVAL, "lora_load_peft: max_rank %d is outside 1..%d", max_rank, LORA_MAX_RANK);
    const arch_desc *ad = arch_by_name(mc->arch, strnlen(mc->arch, sizeof mc->arch));
    if (!ad || mc->n_layers < 1)
        return rd_fail(RD_EINVAL, "lora_load_peft: the model config (arch '%.32s', %d layers) names no family",
                       mc->arch, mc->n_layers);
    const size_t n = (size_t)mc->n_layers * LORA_N_MODULES;
    loader x = {.dir = dir, .mc = mc, .ad = ad, .max_rank = max_rank, .check_only = check_only};
    lora_adapter *a = calloc(1, sizeof *a);
    int rc;
    x.want = calloc(n, 1);
    x.ta = calloc(n, sizeof *x.ta);
    x.tb = calloc(n, sizeof *x.tb);
    if (!a || !x.want || !x.ta || !x.tb || !(a->path = strdup(dir))) {
        rc = rd_fail(RD_ENOMEM, "lora: out of memory");
    } else {
        a->n_layers = mc->n_layers;
        snprintf(a->arch, sizeof a->arch, "%s", mc->arch);
        default_name(dir, a->name, sizeof a->name);
        rc = text ? load_parts(&x, a, text, f) : load_dir(&x, a);
    }
    reset_loader(&x);
    free(x.want);
    free(x.ta);
    free(x.tb);
    if (rc || check_only) {
        lora_free(a);
        return rc;
    }
    *out = a;
    return 0;
}

int lora_load_peft(const char *dir, const model_config *mc, int32_t max_rank, lora_adapter **out)
{
    return load_any(dir, NULL, NULL, mc, max_rank, 0, out);
}

/* The module a PEFT tensor name is for ("model.layers.0.self_attn.q_proj"), or 0 if it is no lora_A/lora_B
 * weight (the loader then refuses it by name). */
static int pushed_module(const char *name, char *out, size_t cap)
{
    const size_t n = strlen(name), p = sizeof PREFIX - 1, tail = strlen(".lora_A.weight");
    if (n <= p + tail || strncmp(name, PREFIX, p) ||
        (!ends_with(name, ".lora_A.weight") && !ends_with(name, ".lora_B.weight")) || n - p - tail >= cap)
        return 0;
    memcpy(out, name + p, n - p - tail);
    out[n - p - tail] = 0;
    return 1;
}

int lora_load_tensors(const char *label, int32_t rank, float alpha, int rslora, const st_tensor *t, size_t n,
                      const model_config *mc, int32_t max_rank, lora_adapter **out)
{
    const int check_only = !out;
    if (out)
        *out = NULL;
    if (!t || n == 0)
        return rd_fail(RD_EINVAL, "lora: '%.200s': a pushed adapter needs its lora_A and lora_B tensors",
                       label ? label : "?");
    for (size_t i = 0; i < n && !check_only; i++)
        if (!t[i].data)
            return rd_fail(RD_EINVAL, "lora: '%.200s': tensor '%.120s' has no data", label ? label : "?",
                           t[i].name);
    /* The config PEFT would have written: its targets are exactly the modules the tensors name, so every
     * check of a folder's adapter (pairs complete, shapes, refused modules) applies unchanged. */
    cJSON *root = cJSON_CreateObject(), *mods = cJSON_CreateArray();
    char module[256];
    int any = 0, rc = 0;
    if (!root || !mods) {
        rc = rd_fail(RD_ENOMEM, "lora: out of memory");
    } else {
        for (size_t i = 0; i < n; i++) {
            if (!pushed_module(t[i].name, module, sizeof module))
                continue;
            int seen = 0;
            for (const cJSON *e = mods->child; e && !seen; e = e->next)
                seen = !strcmp(e->valuestring, module);
            if (!seen) {
                cJSON_AddItemToArray(mods, cJSON_CreateString(module));
                any = 1;
            }
        }
        cJSON_AddStringToObject(root, "peft_type", "LORA");
        cJSON_AddNumberToObject(root, "r", rank);
        cJSON_AddNumberToObject(root, "lora_alpha", alpha);
        cJSON_AddBoolToObject(root, "use_rslora", rslora != 0);
        cJSON_AddItemToObject(root, "target_modules", mods);
        mods = NULL;
    }
    char *text = rc ? NULL : cJSON_PrintUnformatted(root);
    if (!rc && !text)
        rc = rd_fail(RD_ENOMEM, "lora: out of memory");
    if (!rc && !any)
        rc = rd_fail(RD_EFORMAT, "lora: '%.200s': no tensor is a LoRA weight (base_model.model.<module>.lora_A.weight "
                     "and .lora_B.weight; the first is '%.120s')", label ? label : "?", t[0].name);
    if (!rc) {
        st_file f = {.n_tensors = n, .tensors = (st_tensor *)t};
        rc = load_any(label, text, &f, mc, max_rank, check_only, check_only ? NULL : out);
    }
    cJSON_free(text);
    cJSON_Delete(mods);
    cJSON_Delete(root);
    return rc;
}

int lora_load_peft_mem(const char *label, const char *config, size_t config_len, const uint8_t *st, size_t st_size,
                       const model_config *mc, int32_t max_rank, lora_adapter **out)
{
    if (out)
        *out = NULL;
    if (!config || !st || config_len > LORA_MAX_CONFIG)
        return rd_fail(RD_EINVAL, "lora: '%.200s': adapter_config.json of %zu bytes (1..%u) and "
                       "adapter_model.safetensors are needed", label ? label : "?", config_len, LORA_MAX_CONFIG);
    char *text = malloc(config_len + 1);
    if (!text)
        return rd_fail(RD_ENOMEM, "lora: out of memory");
    memcpy(text, config, config_len);
    text[config_len] = 0;
    st_file *f = NULL;
    int rc = st_parse(st, st_size, &f);
    if (rc) {
        char msg[300];
        snprintf(msg, sizeof msg, "%s", rd_errmsg());
        rc = rd_fail(rc, "lora: '%.200s': adapter_model.safetensors: %s", label ? label : "?", msg);
    } else {
        rc = load_any(label, text, f, mc, max_rank, 0, out);
    }
    st_close(f);
    free(text);
    return rc;
}

/* ------------------------------------------------------- the resident set */

typedef enum { SLOT_FREE = 0, SLOT_LIVE, SLOT_RETIRED } slot_state;

typedef struct {
    slot_state state;
    lora_adapter *a;
    uint64_t version;
    uint64_t uid;
    int32_t pins;
    uint64_t used;              /* the set's clock at the last add or pin: least is least recent */
    uint64_t added;             /* the clock at its add: the listing's order */
} lora_slot;

struct lora_set {
    int32_t cap;                /* max_loras: live adapters at most */
    int32_t n_slots;            /* 2 * cap */
    int32_t n_live;
    uint64_t clock;
    lora_slot *slots;           /* [n_slots] */
    lora_free_fn on_free;
    void *on_free_ctx;
};

int lora_set_new(int32_t max_loras, lora_set **out)
{
    if (!out)
        return rd_fail(RD_EINVAL, "lora_set_new: out is NULL");
    *out = NULL;
    if (max_loras < 1 || max_loras > LORA_MAX_LORAS)
        return rd_fail(RD_EINVAL, "lora: max_loras %d is outside 1..%d", max_loras, LORA_MAX_LORAS);
    lora_set *s = calloc(1, sizeof *s);
    if (!s || !(s->slots = calloc(2 * (size_t)max_loras, sizeof *s->slots))) {
        free(s);
        return rd_fail(RD_ENOMEM, "lora: out of memory");
    }
    s->cap = max_loras;
    s->n_slots = 2 * max_loras;
    *out = s;
    return 0;
}

/* Frees slot i's adapter (the owner's hook first) and empties the slot. */
static void drop(lora_set *s, int32_t i)
{
    lora_slot *sl = &s->slots[i];
    if (s->on_free)
        s->on_free(s->on_free_ctx, i, sl->a);
    lora_free(sl->a);
    if (sl->state == SLOT_LIVE)
        s->n_live--;
    memset(sl, 0, sizeof *sl);
}

void lora_set_free(lora_set *s)
{
    if (!s)
        return;
    for (int32_t i = 0; i < s->n_slots; i++)
        if (s->slots[i].state != SLOT_FREE)
            drop(s, i);
    free(s->slots);
    free(s);
}

void lora_set_on_free(lora_set *s, lora_free_fn fn, void *ctx)
{
    s->on_free = fn;
    s->on_free_ctx = ctx;
}

int32_t lora_set_slots(const lora_set *s) { return s ? s->n_slots : 0; }

static int32_t find(const lora_set *s, const char *name)
{
    for (int32_t i = 0; i < s->n_slots; i++)
        if (s->slots[i].state == SLOT_LIVE && !strcmp(s->slots[i].a->name, name))
            return i;
    return -1;
}

int lora_set_add(lora_set *s, lora_adapter *a, const char *name, uint64_t version, int replace, char *evicted,
                 size_t evicted_cap, int32_t *slot)
{
    if (evicted && evicted_cap)
        evicted[0] = 0;
    if (!s || !a)
        return rd_fail(RD_EINVAL, "lora_set_add: no set or no adapter");
    if (!name)
        name = a->name;
    const size_t len = strlen(name);
    if (len == 0 || len >= LORA_NAME_MAX)
        return rd_fail(RD_EINVAL, "lora: an adapter name must be 1 to %d bytes (got %zu)", LORA_NAME_MAX - 1, len);
    const int32_t old = find(s, name);
    if (old >= 0 && !replace)
        return rd_fail(RD_EINVAL, "lora: an adapter named '%s' is already loaded (unload it first)", name);
    for (int32_t i = 0; i < s->n_slots; i++)
        if (s->slots[i].state != SLOT_FREE && s->slots[i].a == a)
            return rd_fail(RD_EINVAL, "lora: this adapter is already in the set as '%s'", a->name);
    /* The new adapter needs a free slot and, unless it replaces one, room among the live. */
    int32_t free_slot = -1;
    for (int32_t i = 0; i < s->n_slots && free_slot < 0; i++)
        if (s->slots[i].state == SLOT_FREE)
            free_slot = i;
    if (old >= 0 && s->slots[old].pins == 0)
        free_slot = free_slot >= 0 ? free_slot : old;   /* it goes first: its slot is the new one's */
    int32_t victim = -1;
    if (old < 0 && (s->n_live == s->cap || free_slot < 0)) {
        for (int32_t i = 0; i < s->n_slots; i++)
            if (s->slots[i].state == SLOT_LIVE && s->slots[i].pins == 0 &&
                (victim < 0 || s->slots[i].used < s->slots[victim].used))
                victim = i;
        if (victim < 0)
            return rd_fail(RD_EBUSY, "lora: all %d adapter slots (max_loras) hold adapters that running sequences "
                           "use; '%s' can be loaded when one is idle", s->cap, name);
        if (free_slot < 0)
            free_slot = victim;
    }
    if (free_slot < 0)
        return rd_fail(RD_EBUSY, "lora: every slot holds an adapter that running sequences use (%d replaced ones "
                       "wait for theirs to end); '%s' can be loaded when one is idle", s->n_slots - s->n_live, name);
    if (victim >= 0) {
        if (evicted && evicted_cap)
            snprintf(evicted, evicted_cap, "%s", s->slots[victim].a->name);
        drop(s, victim);
    }
    if (old >= 0) {
        if (s->slots[old].pins == 0) {
            drop(s, old);
        } else {
            s->slots[old].state = SLOT_RETIRED;
            s->n_live--;
        }
    }
    memmove(a->name, name, len + 1);   /* name may be a->name itself */
    s->clock++;
    s->slots[free_slot] = (lora_slot){.state = SLOT_LIVE, .a = a, .version = version, .uid = s->clock,
                                      .pins = 0, .used = s->clock, .added = s->clock};
    s->n_live++;
    if (slot)
        *slot = free_slot;
    return 0;
}

int lora_set_remove(lora_set *s, const char *name)
{
    if (!s || !name)
        return rd_fail(RD_EINVAL, "lora_set_remove: no set or no name");
    int32_t i = find(s, name);
    if (i < 0)
        return rd_fail(RD_ENOENT, "lora: no adapter named '%.128s' is loaded", name);
    if (s->slots[i].pins > 0)
        return rd_fail(RD_EBUSY, "lora: adapter '%s' is in use by %d running sequence%s; it can be unloaded when "
                       "they end", name, s->slots[i].pins, s->slots[i].pins == 1 ? "" : "s");
    drop(s, i);
    return 0;
}

int lora_set_get(const lora_set *s, const char *name, const lora_adapter **a, uint64_t *version)
{
    if (!s || !name || !a)
        return rd_fail(RD_EINVAL, "lora_set_get: no set, name or output");
    *a = NULL;
    int32_t i = find(s, name);
    if (i < 0)
        return rd_fail(RD_ENOENT, "lora: no adapter named '%.128s' is loaded", name);
    *a = s->slots[i].a;
    if (version)
        *version = s->slots[i].version;
    return 0;
}

int lora_set_pin(lora_set *s, const char *name, lora_pinned *out)
{
    if (!s || !name || !out)
        return rd_fail(RD_EINVAL, "lora_set_pin: no set, name or output");
    int32_t i = find(s, name);
    if (i < 0)
        return rd_fail(RD_ENOENT, "lora: no adapter named '%.128s' is loaded", name);
    lora_slot *sl = &s->slots[i];
    if (sl->pins == INT32_MAX)
        return rd_fail(RD_ERANGE, "lora: adapter '%s' has %d pins", name, sl->pins);
    sl->pins++;
    sl->used = ++s->clock;
    *out = (lora_pinned){.a = sl->a, .version = sl->version, .uid = sl->uid, .slot = i};
    return 0;
}

int lora_set_unpin(lora_set *s, int32_t slot)
{
    if (!s)
        return rd_fail(RD_EINVAL, "lora_set_unpin: no set");
    if (slot < 0 || slot >= s->n_slots || s->slots[slot].state == SLOT_FREE)
        return rd_fail(RD_ENOENT, "lora_set_unpin: slot %d holds no adapter", slot);
    lora_slot *sl = &s->slots[slot];
    if (sl->pins == 0)
        return rd_fail(RD_EINVAL, "lora: adapter '%s' is not pinned", sl->a->name);
    if (--sl->pins == 0 && sl->state == SLOT_RETIRED)
        drop(s, slot);
    return 0;
}

int32_t lora_set_count(const lora_set *s) { return s ? s->n_live : 0; }

int32_t lora_set_capacity(const lora_set *s) { return s ? s->cap : 0; }

int lora_set_list(const lora_set *s, lora_info *out, int32_t cap, int32_t *n)
{
    if (!s || !n || (cap > 0 && !out))
        return rd_fail(RD_EINVAL, "lora_set_list: no set or no output");
    int32_t k = 0;
    uint64_t after = 0;
    /* In the order added: the live slot with the least add stamp above the last listed. */
    while (k < cap) {
        int32_t next = -1;
        for (int32_t i = 0; i < s->n_slots; i++)
            if (s->slots[i].state == SLOT_LIVE && s->slots[i].added > after &&
                (next < 0 || s->slots[i].added < s->slots[next].added))
                next = i;
        if (next < 0)
            break;
        const lora_slot *sl = &s->slots[next];
        out[k++] = (lora_info){.name = sl->a->name, .version = sl->version, .rank = sl->a->rank,
                               .bytes = sl->a->bytes, .pins = sl->pins, .slot = next};
        after = sl->added;
    }
    *n = k;
    return 0;
}
