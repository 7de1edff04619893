/* api_sampling.c - the sampling fields of every HTTP door, read by the one
 * table daemon/sampling.def: each field's name at the door, its type, range
 * and effect, or the reason it is refused. No server and no engine here, so
 * tests/fuzz/fuzz_http_json.c runs it with the other readers. */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/api_int.h"
#include "engine/serve/engine.h"

/* The api_params member a row reads into (sampling.def's MEMBER). */
enum {
    M_NONE,
    M_temperature,
    M_top_p,
    M_top_k,
    M_min_p,
    M_repetition_penalty,
    M_frequency_penalty,
    M_presence_penalty,
    M_min_tokens,
    M_n,
    M_max_tokens,
    M_ignore_eos,
    M_keep_stop,
    M_skip_special,
};

typedef enum {
    SK_NUM,
    SK_NUM_GT,
    SK_INT,
    SK_TOPK,
    SK_SEED,
    SK_BOOL,
    SK_STOP,
    SK_IDS,
    SK_BIAS,
    SK_ROUTE,
    SK_SAME,
    SK_REFUSE,
    SK_FORMAT,
    SK_TOOLS,
} sf_kind;

typedef struct {
    const char *sglang, *vllm;  /* the field's name at SGLang's and vLLM's doors, or NULL */
    unsigned doors;             /* SD_* */
    sf_kind kind;
    double lo, hi;              /* range; SK_REFUSE: lo is the numeric default (NAN: none) */
    int member;                 /* M_* */
    const char *what;           /* effect, or the reason of a refusal */
} sf_row;

#define SF(SGLANG, VLLM, DOORS, KIND, LO, HI, MEMBER, WHAT) {SGLANG, VLLM, DOORS, KIND, LO, HI, M_##MEMBER, WHAT},
static const sf_row sf_table[] = {
#include "daemon/sampling.def"
};
#undef SF

#define SF_ROWS ((int)(sizeof sf_table / sizeof sf_table[0]))

static float *float_member(api_params *p, int m)
{
    switch (m) {
    case M_temperature: return &p->temperature;
    case M_top_p: return &p->top_p;
    case M_min_p: return &p->min_p;
    case M_repetition_penalty: return &p->repetition_penalty;
    case M_frequency_penalty: return &p->frequency_penalty;
    case M_presence_penalty: return &p->presence_penalty;
    default: return NULL;
    }
}

static int32_t *int_member(api_params *p, int m)
{
    switch (m) {
    case M_top_k: return &p->top_k;
    case M_min_tokens: return &p->min_tokens;
    case M_n: return &p->n;
    case M_max_tokens: return &p->max_tokens;
    default: return NULL;
    }
}

static int *bool_member(api_params *p, int m)
{
    switch (m) {
    case M_ignore_eos: return &p->ignore_eos;
    case M_keep_stop: return &p->keep_stop;
    case M_skip_special: return &p->skip_special;
    default: return NULL;
    }
}

/* Token ids: a list of integers in 0..2^31-1 (the engine checks them against the vocabulary). */
static int read_id_list(cJSON *v, const char *pre, const char *name, int32_t **ids, int32_t *n, api_err *e)
{
    if (!cJSON_IsArray(v)) {
        api_bad(e, 400, "field \"%s%s\": expected a list of token ids", pre, name);
        return -1;
    }
    int k = cJSON_GetArraySize(v), i = 0;
    int32_t *out = malloc(sizeof(int32_t) * (size_t)(k > 0 ? k : 1));
    if (!out) {
        api_bad(e, 500, "out of memory");
        return -1;
    }
    for (cJSON *x = v->child; x; x = x->next, i++) {
        if (!cJSON_IsNumber(x) || x->valuedouble != floor(x->valuedouble) || x->valuedouble < 0 ||
            x->valuedouble > 2147483647.0) {
            api_bad(e, 400, "field \"%s%s\"[%d]: expected a token id (an integer >= 0)", pre, name, i);
            free(out);
            return -1;
        }
        out[i] = (int32_t)x->valuedouble;
    }
    free(*ids);
    *ids = out;
    *n = k;
    return 0;
}

static int read_stop_strs(cJSON *v, const char *pre, const char *name, api_params *p, api_err *e)
{
    if (!cJSON_IsString(v) && !cJSON_IsArray(v)) {
        api_bad(e, 400, "field \"%s%s\": expected a string or a list of strings", pre, name);
        return -1;
    }
    int i = 0;
    for (cJSON *x = cJSON_IsString(v) ? v : v->child; x; x = cJSON_IsString(v) ? NULL : x->next, i++) {
        if (!cJSON_IsString(x) || !x->valuestring[0] || strlen(x->valuestring) > STOP_MAX_LEN) {
            api_bad(e, 400, "field \"%s%s\"[%d]: expected a non-empty string of at most %d bytes", pre, name, i,
                    STOP_MAX_LEN);
            return -1;
        }
        if (p->n_stop_strs >= STOP_MAX_STRS) {
            api_bad(e, 400, "field \"%s%s\": at most %d stop strings", pre, name, STOP_MAX_STRS);
            return -1;
        }
        if (!(p->stop_strs[p->n_stop_strs] = strdup(x->valuestring))) {
            api_bad(e, 500, "out of memory");
            return -1;
        }
        p->n_stop_strs++;
    }
    return 0;
}

/* logit_bias: {"token id": bias}, as OpenAI and SGLang take it (keys are decimal strings). */
static int read_bias(cJSON *v, const sf_row *r, const char *pre, const char *name, api_params *p, api_err *e)
{
    if (!cJSON_IsObject(v)) {
        api_bad(e, 400, "field \"%s%s\": expected an object of token id -> bias", pre, name);
        return -1;
    }
    int k = cJSON_GetArraySize(v);
    if (k > ENG_MAX_BIAS) {
        api_bad(e, 400, "field \"%s%s\": %d entries; at most %d", pre, name, k, ENG_MAX_BIAS);
        return -1;
    }
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)(k > 0 ? k : 1));
    float *vals = malloc(sizeof(float) * (size_t)(k > 0 ? k : 1));
    if (!ids || !vals) {
        free(ids);
        free(vals);
        api_bad(e, 500, "out of memory");
        return -1;
    }
    int i = 0;
    for (cJSON *x = v->child; x; x = x->next, i++) {
        char *end = NULL;
        long id = strtol(x->string, &end, 10);
        if (!x->string[0] || *end || id < 0 || id > 2147483647L) {
            api_bad(e, 400, "field \"%s%s\": key \"%.40s\" is not a token id", pre, name, x->string);
            break;
        }
        if (!cJSON_IsNumber(x) || !(x->valuedouble >= r->lo && x->valuedouble <= r->hi)) {
            api_bad(e, 400, "field \"%s%s\"[\"%.40s\"]: expected a number in %g..%g", pre, name, x->string, r->lo,
                    r->hi);
            break;
        }
        int dup = 0;
        for (int j = 0; j < i; j++)
            dup |= ids[j] == (int32_t)id;
        if (dup) {
            api_bad(e, 400, "field \"%s%s\": token %ld appears twice", pre, name, id);
            break;
        }
        ids[i] = (int32_t)id;
        vals[i] = (float)x->valuedouble;
    }
    if (e->status) {
        free(ids);
        free(vals);
        return -1;
    }
    free(p->bias_ids);
    free(p->bias_vals);
    p->bias_ids = ids;
    p->bias_vals = vals;
    p->n_bias = k;
    return 0;
}

/* Whether v holds a refused field's default: null, false, an empty list or object, or the number def. */
static int is_default(cJSON *v, double def)
{
    return cJSON_IsNull(v) || cJSON_IsFalse(v) || (cJSON_IsArray(v) && !v->child) ||
           (cJSON_IsObject(v) && !v->child) || (cJSON_IsNumber(v) && !isnan(def) && v->valuedouble == def);
}

static void read_row(cJSON *v, const sf_row *r, const char *pre, const char *name, api_params *p, api_err *e)
{
    double x = 0;
    if (r->kind == SK_NUM || r->kind == SK_NUM_GT || r->kind == SK_INT || r->kind == SK_TOPK || r->kind == SK_SEED) {
        if (!cJSON_IsNumber(v)) {
            api_bad(e, 400, "field \"%s%s\": expected a number", pre, name);
            return;
        }
        x = v->valuedouble;
    }
    switch (r->kind) {
    case SK_NUM:
    case SK_NUM_GT:
        if (!isfinite(x) || (r->kind == SK_NUM ? !(x >= r->lo) : !(x > r->lo)) || !(x <= r->hi)) {
            api_bad(e, 400, "field \"%s%s\" = %g: expected a number in %s%g, %g%s", pre, name, x,
                    r->kind == SK_NUM ? "[" : "(", r->lo, r->hi, isinf(r->hi) ? ")" : "]");
            return;
        }
        *float_member(p, r->member) = (float)x;
        return;
    case SK_INT:
    case SK_TOPK:
        if (x != floor(x) || !(x >= r->lo && x <= r->hi)) {
            api_bad(e, 400, "field \"%s%s\" = %g: expected an integer in %.0f..%.0f", pre, name, x, r->lo, r->hi);
            return;
        }
        *int_member(p, r->member) = r->kind == SK_TOPK && x < 0 ? 0 : (int32_t)x; /* -1 is "off" as 0 is */
        return;
    case SK_SEED:
        if (x != floor(x) || !(x >= 0 && x < 9007199254740992.0)) {
            api_bad(e, 400, "field \"%s%s\" = %g: expected an integer in 0..%lld", pre, name, x,
                    (long long)(((int64_t)1 << 53) - 1));
            return;
        }
        p->seed = (uint64_t)x;
        p->has_seed = 1;
        return;
    case SK_BOOL:
        if (!cJSON_IsBool(v)) {
            api_bad(e, 400, "field \"%s%s\": expected true or false", pre, name);
            return;
        }
        *bool_member(p, r->member) = cJSON_IsTrue(v);
        return;
    case SK_STOP:
        read_stop_strs(v, pre, name, p, e);
        return;
    case SK_IDS:
        read_id_list(v, pre, name, &p->stop_ids, &p->n_stop_ids, e);
        return;
    case SK_BIAS:
        read_bias(v, r, pre, name, p, e);
        return;
    case SK_ROUTE:
    case SK_SAME:
        return;
    case SK_REFUSE:
        if (!is_default(v, r->lo))
            api_bad(e, 400, "field \"%s%s\": not supported: %s", pre, name, r->what);
        return;
    case SK_FORMAT: {
        cJSON *t = cJSON_GetObjectItemCaseSensitive(v, "type");
        if (!cJSON_IsObject(v) || !cJSON_IsString(t) || strcmp(t->valuestring, "text"))
            api_bad(e, 400, "field \"%s%s\": not supported: %s", pre, name, r->what);
        return;
    }
    case SK_TOOLS:
        if (!cJSON_IsString(v) || (strcmp(v->valuestring, "none") && strcmp(v->valuestring, "auto")))
            api_bad(e, 400, "field \"%s%s\": not supported: %s", pre, name, r->what);
        return;
    }
}

static const char *row_name(const sf_row *r, unsigned door)
{
    return door & (SD_SGL | SD_SGLT) ? r->sglang : r->vllm;
}

int api_read_fields(cJSON *o, unsigned door, const char *prefix, api_params *p, api_err *e)
{
    for (int i = 0; i < SF_ROWS && !e->status; i++) {
        const sf_row *r = &sf_table[i];
        const char *name = row_name(r, door);
        if (!(r->doors & door) || !name)
            continue;
        cJSON *v = cJSON_GetObjectItemCaseSensitive(o, name);
        if (v && !cJSON_IsNull(v))
            read_row(v, r, prefix, name, p, e);
    }
    if (p->keep_stop)
        p->keep_stop = door & (SD_SGL | SD_SGLT) ? API_KEEP_WHOLE : API_KEEP_THROUGH;
    if (door == SD_SGL)
        for (cJSON *x = o->child; x && !e->status; x = x->next) {
            int known = 0;
            for (int i = 0; i < SF_ROWS && !known; i++)
                known = (sf_table[i].doors & SD_SGL) && sf_table[i].sglang && !strcmp(sf_table[i].sglang, x->string);
            if (!known)
                api_bad(e, 400, "field \"%s%.60s\": not a sampling parameter SGLang knows (sampling.def lists "
                        "every one this door reads)", prefix, x->string);
        }
    return e->status ? -1 : 0;
}
