/* model_hf.c - Llama models from and to Hugging Face checkpoints
 * (config.json + safetensors), the format learners save and push.
 *
 * HF layout is the canonical one (DESIGN.md), so tensors go to model_build
 * as they are: no permutation. Export reads the weights back from the
 * backend and splits the fused linears, so a GGUF-loaded model exported here
 * and reloaded gives the same packed weights, hence bit-identical outputs. */
#include "engine/model/model.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "base/err.h"

/* ---------------------------------------------------------------- config */

static int cfg_int(const cJSON *root, const char *key, int required, int32_t dflt, int32_t *v)
{
    const cJSON *j = cJSON_GetObjectItemCaseSensitive(root, key);
    if (!j || cJSON_IsNull(j)) {
        if (required)
            return rd_fail(RD_EFORMAT, "model: config.json: \"%s\" missing (expected a positive integer)", key);
        *v = dflt;
        return 0;
    }
    double d = cJSON_IsNumber(j) ? j->valuedouble : -1;
    if (!(d >= 1) || d > 1e9 || d != floor(d))
        return rd_fail(RD_EFORMAT, "model: config.json: \"%s\" must be a positive integer", key);
    *v = (int32_t)d;
    return 0;
}

static int cfg_float(const cJSON *root, const char *key, double dflt, float *v)
{
    const cJSON *j = cJSON_GetObjectItemCaseSensitive(root, key);
    if (!j || cJSON_IsNull(j)) {
        *v = (float)dflt;
        return 0;
    }
    if (!cJSON_IsNumber(j) || !isfinite(j->valuedouble) || !(j->valuedouble > 0))
        return rd_fail(RD_EFORMAT, "model: config.json: \"%s\" must be a positive number", key);
    *v = (float)j->valuedouble;
    return 0;
}

/* A required positive number; shown names the key in messages. */
static int cfg_float_req(const cJSON *obj, const char *shown, const char *key, float *v)
{
    const cJSON *j = cJSON_GetObjectItemCaseSensitive(obj, key);
    if (!cJSON_IsNumber(j) || !isfinite(j->valuedouble) || !(j->valuedouble > 0))
        return rd_fail(RD_EFORMAT, "model: config.json: \"%s\" %s (expected a positive number)", shown,
                       j ? "is not a positive number" : "missing");
    *v = (float)j->valuedouble;
    return 0;
}

static int cfg_true(const cJSON *root, const char *key)
{
    return cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(root, key));
}

/* rope_scaling: null, {"rope_type"|"type": "default"}, "linear" {factor}
 * or "llama3" {factor, low_freq_factor, high_freq_factor,
 * original_max_position_embeddings}. Anything else names the type: the
 * engine never serves a scaled model with plain RoPE. */
static int rope_from_hf(const cJSON *root, model_config *c)
{
    const cJSON *rs = cJSON_GetObjectItemCaseSensitive(root, "rope_scaling");
    c->rope_type = ROPE_PLAIN;
    if (rs && !cJSON_IsNull(rs)) {
        if (!cJSON_IsObject(rs))
            return rd_fail(RD_EFORMAT, "model: config.json: rope_scaling must be null or an object");
        const cJSON *ty = cJSON_GetObjectItemCaseSensitive(rs, "rope_type");
        if (!ty)
            ty = cJSON_GetObjectItemCaseSensitive(rs, "type");
        if (!cJSON_IsString(ty))
            return rd_fail(RD_EFORMAT, "model: config.json: rope_scaling has no \"rope_type\" string");
        const char *t = ty->valuestring;
        int rc;
        if (!strcmp(t, "default")) {
            c->rope_type = ROPE_PLAIN;
        } else if (!strcmp(t, "linear")) {
            c->rope_type = ROPE_LINEAR;
            if ((rc = cfg_float_req(rs, "rope_scaling.factor", "factor", &c->rope_factor))) return rc;
        } else if (!strcmp(t, "llama3")) {
            c->rope_type = ROPE_LLAMA3;
            if ((rc = cfg_float_req(rs, "rope_scaling.factor", "factor", &c->rope_factor))) return rc;
            if ((rc = cfg_float_req(rs, "rope_scaling.low_freq_factor", "low_freq_factor", &c->rope_low_freq)))
                return rc;
            if ((rc = cfg_float_req(rs, "rope_scaling.high_freq_factor", "high_freq_factor", &c->rope_high_freq)))
                return rc;
            if ((rc = cfg_int(rs, "original_max_position_embeddings", 1, 0, &c->rope_orig_ctx))) return rc;
        } else {
            return rd_fail(RD_ENOTSUP, "model: config.json: rope_scaling type \"%.40s\" is not supported "
                                       "(supported: default, linear, llama3)", t);
        }
    }
    int rc = model_rope_divisors(c);
    if (rc)
        return rc;
    /* Exact divisors written by an export whose source gave them as they
     * are (a GGUF rope_freqs.weight): they take precedence, bit for bit. */
    const cJSON *ex = cJSON_GetObjectItemCaseSensitive(root, "rolloutd_rope_divisors");
    if (!ex || cJSON_IsNull(ex))
        return 0;
    if (!cJSON_IsArray(ex) || cJSON_GetArraySize(ex) != c->head_dim / 2)
        return rd_fail(RD_EFORMAT, "model: config.json: rolloutd_rope_divisors must be an array of head_dim / 2 = %d "
                       "numbers", c->head_dim / 2);
    int i = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, ex)
    {
        if (!cJSON_IsNumber(e) || !(e->valuedouble > 0) || !isfinite(e->valuedouble))
            return rd_fail(RD_EFORMAT, "model: config.json: rolloutd_rope_divisors[%d] must be a positive number", i);
        c->rope_div[i++] = (float)e->valuedouble;
    }
    if (c->rope_type == ROPE_PLAIN)
        c->rope_type = ROPE_FREQS;
    return 0;
}

static int check_config(const cJSON *root, model_config *c)
{
    const cJSON *arch = cJSON_GetObjectItemCaseSensitive(root, "architectures");
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(root, "model_type");
    const arch_desc *fam = NULL;
    const cJSON *a;
    cJSON_ArrayForEach(a, arch) if (!fam && cJSON_IsString(a)) fam = arch_by_hf(a->valuestring, NULL);
    if (!arch && cJSON_IsString(type))
        fam = arch_by_hf(NULL, type->valuestring);
    if (!fam) {
        const cJSON *first = cJSON_GetArrayItem(arch, 0);
        return rd_fail(RD_ENOTSUP, "model: config.json: architecture '%.40s' is not supported (expected "
                       "LlamaForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM, Qwen3MoeForCausalLM or Gemma3ForCausalLM)",
                       cJSON_IsString(first) ? first->valuestring
                       : cJSON_IsString(type) ? type->valuestring : "(none)");
    }

    int rc;
    snprintf(c->arch, sizeof c->arch, "%s", fam->name);
    if ((rc = cfg_int(root, "hidden_size", 1, 0, &c->dim))) return rc;
    if ((rc = cfg_int(root, "intermediate_size", 1, 0, &c->ffn_dim))) return rc;
    if ((rc = cfg_int(root, "num_attention_heads", 1, 0, &c->n_heads))) return rc;
    if ((rc = cfg_int(root, "num_key_value_heads", 0, c->n_heads, &c->n_kv_heads))) return rc;
    if ((rc = cfg_int(root, "num_hidden_layers", 1, 0, &c->n_layers))) return rc;
    if ((rc = cfg_int(root, "vocab_size", 1, 0, &c->vocab))) return rc;
    if ((rc = cfg_int(root, "max_position_embeddings", 1, 0, &c->max_ctx))) return rc;
    /* Defaults are transformers' LlamaConfig defaults. */
    if ((rc = cfg_float(root, "rms_norm_eps", 1e-6, &c->norm_eps))) return rc;
    if ((rc = cfg_float(root, "rope_theta", 10000.0, &c->rope_theta))) return rc;
    c->tied_embeddings = cfg_true(root, "tie_word_embeddings");

    if (c->n_layers > 512 || c->n_heads % c->n_kv_heads || c->max_ctx > (1 << 24))
        return rd_fail(RD_EFORMAT,
                       "model: config.json: inconsistent shape: layers %d hidden %d heads %d kv_heads %d ctx %d "
                       "(need heads %% kv_heads == 0, layers <= 512)",
                       c->n_layers, c->dim, c->n_heads, c->n_kv_heads, c->max_ctx);
    /* head_dim is explicit in Qwen3 (and may make the q width differ from
     * hidden_size); otherwise hidden_size / num_attention_heads. */
    const cJSON *hdj = cJSON_GetObjectItemCaseSensitive(root, "head_dim");
    if (hdj && !cJSON_IsNull(hdj)) {
        if ((rc = cfg_int(root, "head_dim", 1, 0, &c->head_dim))) return rc;
    } else {
        if (c->dim % c->n_heads)
            return rd_fail(RD_EFORMAT, "model: config.json: hidden_size %d is not a multiple of num_attention_heads "
                           "%d and head_dim is absent", c->dim, c->n_heads);
        c->head_dim = c->dim / c->n_heads;
    }
    if (c->head_dim % 2 || c->head_dim > MODEL_MAX_HEAD_DIM)
        return rd_fail(RD_EFORMAT, "model: config.json: head_dim %d; expected an even number up to %d", c->head_dim,
                       MODEL_MAX_HEAD_DIM);
    if ((rc = rope_from_hf(root, c)))
        return rc;
    return fam->check_hf ? fam->check_hf(root, c) : 0;
}

int model_config_from_hf_json(const char *json, model_config *c)
{
    memset(c, 0, sizeof *c);
    cJSON *root = cJSON_Parse(json);
    if (!cJSON_IsObject(root)) {
        cJSON_Delete(root);
        return rd_fail(RD_EFORMAT, "model: config.json is not a JSON object");
    }
    int rc = check_config(root, c);
    cJSON_Delete(root);
    return rc;
}

/* Scaling parameters that reproduce divisors given as they are (a GGUF
 * rope_freqs.weight), for config.json. All 1: plain; all equal: linear;
 * else llama3, whose divisors are 1, the factor, or 1 / ((1-s)/f + s) with
 * s = (orig/wl - low) / (high - low) linear in 1/wl. Only the line matters
 * (low, high and orig scaled together give the same divisors), so low is
 * taken as 1 and the line fitted through the smooth divisors; with fewer
 * than two of them high = 4, as in every released Llama 3.x. 0 and *exact
 * when they reproduce every divisor bit for bit, 0 when within 1e-5, -1
 * when none fit. */
static int recover_scaling(const model_config *c, model_config *out, int *exact)
{
    const int32_t half = c->head_dim / 2;
    float fmax = 0, fmin = INFINITY;
    for (int32_t i = 0; i < half; i++) {
        fmax = c->rope_div[i] > fmax ? c->rope_div[i] : fmax;
        fmin = c->rope_div[i] < fmin ? c->rope_div[i] : fmin;
    }
    model_config t = *c;
    if (fmin == fmax) {
        t.rope_type = fmax == 1.0f ? ROPE_PLAIN : ROPE_LINEAR;
        t.rope_factor = fmax;
    } else {
        /* (x, s) of the smooth divisors: x = 1/wl */
        double x0 = 0, s0 = 0, x1 = 0, s1 = 0;
        int n = 0;
        for (int32_t i = 0; i < half; i++) {
            double d = c->rope_div[i];
            if (d <= 1.0 * (1 + 1e-6) || d >= fmax * (1 - 1e-6))
                continue;
            double x = pow((double)c->rope_theta, -2.0 * i / c->head_dim) / (2.0 * M_PI);
            double sm = (1.0 / d - 1.0 / fmax) / (1.0 - 1.0 / fmax);
            if (n++ == 0)
                x0 = x, s0 = sm;
            else
                x1 = x, s1 = sm;
        }
        double high = 4.0, orig;
        if (n >= 2) {
            double A = (s1 - s0) / (x1 - x0), B = A * x0 - s0; /* s = A x - B */
            if (!(B > 0) || !(A > 0))
                return -1;
            high = 1.0 + 1.0 / B;
            orig = A / B;
        } else if (n == 1) {
            orig = (s0 * (high - 1.0) + 1.0) / x0;
        } else {
            /* no smooth divisor: any orig between the last kept and the first
             * scaled wavelength (times high) fits; take their geometric mean */
            double wl_keep = 0, wl_scaled = INFINITY;
            for (int32_t i = 0; i < half; i++) {
                double wl = 2.0 * M_PI / pow((double)c->rope_theta, -2.0 * i / c->head_dim);
                if (c->rope_div[i] == 1.0f && wl > wl_keep)
                    wl_keep = wl;
                if (c->rope_div[i] == fmax && wl < wl_scaled)
                    wl_scaled = wl;
            }
            orig = sqrt(wl_keep * high * wl_scaled);
        }
        if (!(orig >= 1 && orig < 1e9))
            return -1;
        t.rope_type = ROPE_LLAMA3;
        t.rope_factor = fmax;
        t.rope_low_freq = 1.0f;
        t.rope_high_freq = (float)high;
        t.rope_orig_ctx = (int32_t)lround(orig);
    }
    if (model_rope_divisors(&t))
        return -1;
    int same = 1;
    for (int32_t i = 0; i < half; i++) {
        same &= t.rope_div[i] == c->rope_div[i];
        if (!(fabs((double)t.rope_div[i] - c->rope_div[i]) <= 1e-5 * c->rope_div[i]))
            return -1;
    }
    *out = t;
    *exact = same;
    return 0;
}

static int rope_to_hf(const model_config *c, cJSON *o)
{
    model_config p = *c;
    int exact = 1;
    if (c->rope_type == ROPE_FREQS && recover_scaling(c, &p, &exact))
        return rd_fail(RD_ENOTSUP, "model: export: the RoPE divisors (rope_freqs.weight) fit no llama3 or linear "
                                   "rope_scaling; config.json cannot express them");
    if (p.rope_type == ROPE_PLAIN) {
        cJSON_AddNullToObject(o, "rope_scaling");
        return 0;
    }
    cJSON *rs = cJSON_AddObjectToObject(o, "rope_scaling");
    cJSON_AddStringToObject(rs, "rope_type", p.rope_type == ROPE_LINEAR ? "linear" : "llama3");
    cJSON_AddNumberToObject(rs, "factor", (double)p.rope_factor);
    if (p.rope_type == ROPE_LLAMA3) {
        cJSON_AddNumberToObject(rs, "low_freq_factor", (double)p.rope_low_freq);
        cJSON_AddNumberToObject(rs, "high_freq_factor", (double)p.rope_high_freq);
        cJSON_AddNumberToObject(rs, "original_max_position_embeddings", p.rope_orig_ctx);
    }
    /* Divisors the parameters reproduce only to rounding travel as they
     * are, so a reload is bit-identical (model_config_from_hf_json prefers them). */
    if (!exact) {
        cJSON *ex = cJSON_AddArrayToObject(o, "rolloutd_rope_divisors");
        for (int32_t i = 0; i < c->head_dim / 2; i++)
            cJSON_AddItemToArray(ex, cJSON_CreateNumber((double)c->rope_div[i]));
    }
    return 0;
}

int model_config_to_hf_json(const model_config *c, const char *torch_dtype, char **out)
{
    *out = NULL;
    const arch_desc *fam = arch_by_name(c->arch, strlen(c->arch));
    if (!fam)
        return rd_fail(RD_ENOTSUP, "model: export: architecture '%.31s' is not supported", c->arch);
    cJSON *o = cJSON_CreateObject();
    cJSON *arch = cJSON_AddArrayToObject(o, "architectures");
    cJSON_AddItemToArray(arch, cJSON_CreateString(fam->hf_class));
    cJSON_AddStringToObject(o, "model_type", fam->hf_model_type);
    cJSON_AddNumberToObject(o, "hidden_size", c->dim);
    cJSON_AddNumberToObject(o, "intermediate_size", c->ffn_dim);
    cJSON_AddNumberToObject(o, "num_attention_heads", c->n_heads);
    cJSON_AddNumberToObject(o, "num_key_value_heads", c->n_kv_heads);
    cJSON_AddNumberToObject(o, "num_hidden_layers", c->n_layers);
    cJSON_AddNumberToObject(o, "head_dim", c->head_dim);
    cJSON_AddNumberToObject(o, "vocab_size", c->vocab);
    cJSON_AddNumberToObject(o, "max_position_embeddings", c->max_ctx);
    /* Written as the double of the float: cJSON prints enough digits to
     * round-trip it, so a reload gets the identical float. */
    cJSON_AddNumberToObject(o, "rms_norm_eps", (double)c->norm_eps);
    cJSON_AddNumberToObject(o, "rope_theta", (double)c->rope_theta);
    int rc = rope_to_hf(c, o);
    if (rc) {
        cJSON_Delete(o);
        return rc;
    }
    cJSON_AddBoolToObject(o, "tie_word_embeddings", c->tied_embeddings);
    if (fam->hf_extra)
        fam->hf_extra(o, c);
    cJSON_AddStringToObject(o, "torch_dtype", torch_dtype);
    *out = cJSON_Print(o);
    cJSON_Delete(o);
    return *out ? 0 : rd_fail(RD_ENOMEM, "model: cannot print config.json");
}

/* ------------------------------------------------------------------ load */

typedef struct {
    const st_set *s;
    const char *path;
} st_source;

static int st_fetch(void *ctx, const char *name, int64_t rows, int64_t cols, float *dst)
{
    const st_source *src = ctx;
    const st_tensor *t = st_set_find(src->s, name);
    if (!t)
        return rd_fail(RD_EFORMAT, "model: tensor '%s' missing from '%s'", name, src->path);
    int ok = rows == 1 ? t->n_dims == 1 && t->shape[0] == cols
                       : t->n_dims == 2 && t->shape[0] == rows && t->shape[1] == cols;
    if (!ok) {
        char got[96] = "[";
        for (int i = 0; i < t->n_dims && i < 4; i++)
            snprintf(got + strlen(got), sizeof got - strlen(got), "%s%lld", i ? ", " : "", (long long)t->shape[i]);
        snprintf(got + strlen(got), sizeof got - strlen(got), "%s]", t->n_dims > 4 ? ", ..." : "");
        if (rows == 1)
            return rd_fail(RD_EFORMAT, "model: tensor '%s' has shape %s, expected [%lld]", name, got, (long long)cols);
        return rd_fail(RD_EFORMAT, "model: tensor '%s' has shape %s, expected [%lld, %lld]", name, got,
                       (long long)rows, (long long)cols);
    }
    return st_read_f32(t, dst);
}

/* A 2-D F32, F16 or BF16 tensor as its file bytes (the same little-endian
 * element layout as GGUF's), so a backend can keep the checkpoint's dtype;
 * 1 for anything else (st_fetch converts it). */
static int st_fetch_raw(void *ctx, const char *name, int64_t rows, int64_t cols, int32_t *type, uint8_t *dst,
                        size_t cap, size_t *nbytes)
{
    const st_source *src = ctx;
    const st_tensor *t = st_set_find(src->s, name);
    if (!t || t->n_dims != 2 || t->shape[0] != rows || t->shape[1] != cols)
        return 1;               /* st_fetch says what is wrong */
    int32_t ty = t->dtype == ST_F32 ? GGML_F32 : t->dtype == ST_F16 ? GGML_F16 : t->dtype == ST_BF16 ? GGML_BF16 : -1;
    size_t n = (size_t)(t->end - t->begin);
    if (ty < 0 || n != (size_t)rows * cols * (ty == GGML_F32 ? 4 : 2) || n > cap)
        return 1;
    memcpy(dst, t->data, n);
    *type = ty;
    *nbytes = n;
    return 0;
}

static char *read_file(const char *path)
{
    FILE *fp = fopen(path, "rb");
    if (!fp)
        return NULL;
    char *buf = NULL;
    size_t n = 0, cap = 0, got;
    do {
        if (cap - n < 4097) {
            char *nb = realloc(buf, cap = cap * 2 + 8192);
            if (!nb) {
                free(buf);
                fclose(fp);
                return NULL;
            }
            buf = nb;
        }
        got = fread(buf + n, 1, cap - n - 1, fp);
        n += got;
    } while (got > 0);
    fclose(fp);
    buf[n] = 0;
    return buf;
}

int model_load_hf(const char *path, rd_backend *be, model **out)
{
    *out = NULL;
    struct stat sb;
    if (stat(path, &sb) != 0)
        return rd_fail(RD_EIO, "model: cannot open '%s': %s", path, strerror(errno));
    /* config.json is in the folder, or next to a lone .safetensors file. */
    char cfg_path[4096];
    if (S_ISDIR(sb.st_mode)) {
        snprintf(cfg_path, sizeof cfg_path, "%s/config.json", path);
    } else {
        const char *slash = strrchr(path, '/');
        if (slash)
            snprintf(cfg_path, sizeof cfg_path, "%.*s/config.json", (int)(slash - path), path);
        else
            snprintf(cfg_path, sizeof cfg_path, "config.json");
    }
    char *json = read_file(cfg_path);
    if (!json)
        return rd_fail(RD_EIO, "model: cannot read '%s' (an HF model needs config.json): %s", cfg_path,
                       strerror(errno));
    model_config cfg;
    int rc = model_config_from_hf_json(json, &cfg);
    free(json);
    if (rc) {
        char msg[512];
        snprintf(msg, sizeof msg, "%s", rd_errmsg());
        return rd_fail(rc, "%s: %s", cfg_path, msg);
    }
    st_set *s;
    if ((rc = st_set_open(path, &s)))
        return rc;
    /* A checkpoint without lm_head.weight ties it to the embedding whatever
     * tie_word_embeddings says (as transformers does when loading it). */
    if (!cfg.tied_embeddings && !st_set_find(s, "lm_head.weight"))
        cfg.tied_embeddings = 1;
    st_source src = {.s = s, .path = path};
    rc = model_build_raw(&cfg, be, st_fetch, st_fetch_raw, &src, out);
    st_set_close(s);
    return rc;
}

/* ---------------------------------------------------------------- export */

typedef struct {
    const void *linear;         /* backend linear handle, or NULL for a vector */
    const float *vec;           /* backend vector */
    int64_t row0, rows, cols;   /* slice of the linear's rows (a vector: rows 1) */
} ex_part;

typedef struct {
    const model *m;
    const ex_part *parts;
    float *buf;                 /* one whole linear read back */
    const void *cached;         /* the linear now in buf (q/k/v and gate/up share one read) */
} ex_ctx;

static int ex_fill(void *ctx, size_t i, float *dst)
{
    ex_ctx *x = ctx;
    const ex_part *p = &x->parts[i];
    rd_backend *be = x->m->be;
    if (!p->linear)
        return be->ops->d2h(be, dst, p->vec, sizeof(float) * (size_t)p->cols);
    if (x->cached != p->linear) {
        int rc = be->ops->linear_read(be, p->linear, x->buf);
        if (rc)
            return rc;
        x->cached = p->linear;
    }
    memcpy(dst, x->buf + (size_t)p->row0 * p->cols, sizeof(float) * (size_t)(p->rows * p->cols));
    return 0;
}

/* Tensors the model exports (the family's table, each layer's once). */
static size_t export_count(const model *m)
{
    size_t n = 0;
    for (int32_t i = 0; i < m->arch->n_tensors; i++) {
        const arch_tensor *t = &m->arch->tensors[i];
        if (arch_tensor_present(&m->cfg, t))
            n += arch_group_per_layer(t->group) ? (size_t)m->cfg.n_layers * (size_t)arch_group_units(&m->cfg, t->group)
                                                : 1;
    }
    return n;
}

static size_t plan_one(const model *m, const arch_tensor *t, int32_t l, int32_t e, char (*names)[96], ex_part *parts,
                       size_t k)
{
    const model_config *c = &m->cfg;
    arch_hf_name(t, l, e, names[k], sizeof names[k]);
    void *buf = *model_weight_slot((model *)m, t->group, l, e);
    int64_t at = arch_tensor_row0(m->arch, c, t);
    if (arch_group_is_linear(t->group))
        parts[k] = (ex_part){.linear = buf, .row0 = at, .rows = arch_dim_value(c, t->rows),
                             .cols = arch_dim_value(c, t->cols)};
    else
        parts[k] = (ex_part){.vec = (const float *)buf + at, .rows = 1, .cols = arch_dim_value(c, t->cols)};
    return k + 1;
}

/* Every weight as an HF tensor: its name and where it lives in the backend
 * (a row slice of a fused linear, or a slice of a vector), in the table's
 * order: the model-wide tensors listed before the layers, every layer's,
 * then the rest. names and parts hold export_count() entries; returns how
 * many were filled. */
static size_t export_plan(const model *m, char (*names)[96], ex_part *parts)
{
    const arch_desc *a = m->arch;
    int32_t first = 0;
    while (first < a->n_tensors && !arch_group_per_layer(a->tensors[first].group))
        first++;
    size_t k = 0;
    for (int32_t i = 0; i < first; i++)
        if (arch_tensor_present(&m->cfg, &a->tensors[i]))
            k = plan_one(m, &a->tensors[i], -1, 0, names, parts, k);
    /* A layer's experts in HF's order: expert by expert, each one's tensors in table order. */
    for (int32_t l = 0; l < m->cfg.n_layers; l++) {
        for (int32_t i = first; i < a->n_tensors; i++)
            if (arch_group_per_layer(a->tensors[i].group) && !(a->tensors[i].flags & AT_EXPERT))
                k = plan_one(m, &a->tensors[i], l, 0, names, parts, k);
        for (int32_t e = 0; e < m->cfg.n_experts; e++)
            for (int32_t i = first; i < a->n_tensors; i++)
                if (a->tensors[i].flags & AT_EXPERT)
                    k = plan_one(m, &a->tensors[i], l, e, names, parts, k);
    }
    for (int32_t i = first; i < a->n_tensors; i++)
        if (!arch_group_per_layer(a->tensors[i].group) && arch_tensor_present(&m->cfg, &a->tensors[i]))
            k = plan_one(m, &a->tensors[i], -1, 0, names, parts, k);
    return k;
}

/* Floats of the largest linear read back whole (fused q|k|v, gate|up, or the embedding). */
static size_t export_buf_floats(const model *m)
{
    size_t big = 0;
    for (int g = 0; g < AG_COUNT; g++) {
        int64_t rows, cols;
        arch_group_shape(m->arch, &m->cfg, (arch_group)g, &rows, &cols);
        if ((size_t)(rows * cols) > big)
            big = (size_t)(rows * cols);
    }
    return big;
}

int model_export_hf(const model *m, const char *dir, st_dtype dtype)
{
    const model_config *c = &m->cfg;
    rd_backend *be = m->be;
    if (dtype != ST_F32 && dtype != ST_F16 && dtype != ST_BF16)
        return rd_fail(RD_EINVAL, "model: export dtype %s is not f32, f16 or bf16", st_dtype_name(dtype));
    if (!be->ops->linear_read)
        return rd_fail(RD_ENOTSUP, "model: the %s backend cannot read weights back", be->ops->name);
    if (mkdir(dir, 0755) != 0 && errno != EEXIST)
        return rd_fail(RD_EIO, "model: cannot create '%s': %s", dir, strerror(errno));

    size_t n = export_count(m);
    st_spec *specs = calloc(n, sizeof *specs);
    ex_part *parts = calloc(n, sizeof *parts);
    char (*names)[96] = calloc(n, sizeof *names);
    float *buf = malloc(export_buf_floats(m) * sizeof(float));
    char *json = NULL;
    int rc = 0;
    if (!specs || !parts || !names || !buf) {
        rc = rd_fail(RD_ENOMEM, "model: export: out of memory");
        goto out;
    }
    size_t k = export_plan(m, names, parts);
    for (size_t i = 0; i < k; i++) {
        specs[i] = (st_spec){.name = names[i], .dtype = dtype, .n_dims = parts[i].linear ? 2 : 1};
        specs[i].shape[0] = parts[i].linear ? parts[i].rows : parts[i].cols;
        specs[i].shape[1] = parts[i].linear ? parts[i].cols : 0;
    }

    const char *torch = dtype == ST_F32 ? "float32" : dtype == ST_BF16 ? "bfloat16" : "float16";
    char path[4096], tmp[4096];
    snprintf(path, sizeof path, "%s/config.json", dir);
    if ((rc = model_config_to_hf_json(c, torch, &json)))
        goto out;
    FILE *fp = fopen(path, "w");
    if (!fp || fputs(json, fp) == EOF || fputc('\n', fp) == EOF || fclose(fp)) {
        rc = rd_fail(RD_EIO, "model: cannot write '%s': %s", path, strerror(errno));
        goto out;
    }
    if ((rc = be->ops->sync(be)))
        goto out;
    /* Written under a temporary name and renamed, so a failed export never
     * leaves a truncated model.safetensors that looks complete. */
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    snprintf(tmp, sizeof tmp, "%s/model.safetensors.partial", dir);
    ex_ctx x = {.m = m, .parts = parts, .buf = buf};
    if ((rc = st_write(tmp, specs, k, "{\"format\":\"pt\"}", ex_fill, &x))) {
        remove(tmp);
        goto out;
    }
    if (rename(tmp, path) != 0)
        rc = rd_fail(RD_EIO, "model: cannot rename '%s' to '%s': %s", tmp, path, strerror(errno));
out:
    free(json);
    free(buf);
    free(names);
    free(parts);
    free(specs);
    return rc;
}

/* ------------------------------------------------------- export to memory */

int model_export_mem(const model *m, st_dtype dtype, model_hf_tensor **out, size_t *n_out)
{
    *out = NULL;
    *n_out = 0;
    rd_backend *be = m->be;
    if (dtype != ST_F32 && dtype != ST_F16 && dtype != ST_BF16)
        return rd_fail(RD_EINVAL, "model: export dtype %s is not f32, f16 or bf16", st_dtype_name(dtype));
    if (!be->ops->linear_read)
        return rd_fail(RD_ENOTSUP, "model: the %s backend cannot read weights back", be->ops->name);
    size_t n = export_count(m);
    model_hf_tensor *ts = calloc(n, sizeof *ts);
    ex_part *parts = calloc(n, sizeof *parts);
    char (*names)[96] = calloc(n, sizeof *names);
    size_t big = export_buf_floats(m);
    float *buf = malloc(big * sizeof(float)), *one = malloc(big * sizeof(float));
    int rc = 0;
    size_t k = 0;
    if (!ts || !parts || !names || !buf || !one) {
        rc = rd_fail(RD_ENOMEM, "model: export: out of memory");
        goto out;
    }
    k = export_plan(m, names, parts);
    for (size_t i = 0; i < k; i++) {
        snprintf(ts[i].name, sizeof ts[i].name, "%s", names[i]);
        ts[i].dtype = dtype;
        ts[i].n_dims = parts[i].linear ? 2 : 1;
        ts[i].shape[0] = parts[i].linear ? parts[i].rows : parts[i].cols;
        ts[i].shape[1] = parts[i].linear ? parts[i].cols : 0;
    }
    if ((rc = be->ops->sync(be)))
        goto out;
    ex_ctx x = {.m = m, .parts = parts, .buf = buf};
    for (size_t i = 0; i < k; i++) {
        size_t elems = (size_t)(parts[i].rows * parts[i].cols);
        size_t esz = dtype == ST_F32 ? 4 : 2;
        ts[i].nbytes = elems * esz;
        ts[i].data = malloc(ts[i].nbytes);
        if (!ts[i].data) {
            rc = rd_fail(RD_ENOMEM, "model: export: out of memory for '%s'", ts[i].name);
            goto out;
        }
        if ((rc = ex_fill(&x, i, one)))
            goto out;
        if (dtype == ST_F32) {
            memcpy(ts[i].data, one, ts[i].nbytes);
        } else {
            uint16_t *h = (uint16_t *)ts[i].data;
            for (size_t e = 0; e < elems; e++)
                h[e] = dtype == ST_BF16 ? rd_f32_to_bf16(one[e]) : st_f32_to_f16(one[e]);
        }
    }
out:
    free(buf);
    free(one);
    free(names);
    free(parts);
    if (rc) {
        model_hf_tensors_free(ts, k);
        return rc;
    }
    *out = ts;
    *n_out = k;
    return 0;
}

void model_hf_tensors_free(model_hf_tensor *t, size_t n)
{
    for (size_t i = 0; t && i < n; i++)
        free(t[i].data);
    free(t);
}
