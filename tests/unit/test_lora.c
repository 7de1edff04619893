/* test_lora.c - PEFT LoRA adapters (engine/model/lora.h): the adapters
 * tests/gen_testdata.sh writes (tools/gen_lora.py) load with the shapes the
 * model config gives each module, the right scale (rsLoRA too), the file's
 * dtypes and bytes; every refusal of lora.h is met, each naming its
 * problem, from a changed adapter_config.json or a hand-written
 * safetensors file; and the resident set evicts the least recently used
 * idle adapter, never a pinned one. */
#include <stdint.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/err.h"
#include "engine/format/gguf.h"
#include "engine/format/safetensors.h"
#include "engine/model/lora.h"
#include "engine/model/model.h"
#include "tests/unit/test.h"

#include <cjson/cJSON.h>

static const char *testdata(void)
{
    const char *d = getenv("RD_TESTDATA");
    return d && *d ? d : "build/testdata";
}

static char why[1024];

/* The config of testdata model NAME.gguf. */
static int model_cfg(const char *name, model_config *c)
{
    char path[600];
    snprintf(path, sizeof path, "%s/%s.gguf", testdata(), name);
    gguf_file *g;
    if (gguf_open(path, &g))
        return 0;
    int rc = model_config_from_gguf(g, c);
    gguf_close(g);
    return rc == 0;
}

#define NEED_CFG(name, c) \
    CHECK(model_cfg(name, c), "cannot read %s (run tests/gen_testdata.sh %s): %s", name, testdata(), rd_errmsg())

static void adapter_dir(const char *name, char *out, size_t cap)
{
    snprintf(out, cap, "%s/lora/%s", testdata(), name);
}

static void tmpdir(char *buf, size_t cap)
{
    const char *t = getenv("RD_TMP");
    snprintf(buf, cap, "%s/lora_XXXXXX", t && *t ? t : "/tmp");
    if (!mkdtemp(buf))
        buf[0] = 0;
}

static void rmtree(const char *dir)
{
    char cmd[700];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0)
        fprintf(stderr, "test_lora: %s failed\n", cmd);
}

static int write_text(const char *dir, const char *file, const char *text)
{
    char p[700];
    snprintf(p, sizeof p, "%s/%s", dir, file);
    FILE *f = fopen(p, "w");
    if (!f)
        return 0;
    int ok = fputs(text, f) != EOF;
    return fclose(f) == 0 && ok;
}

static char *read_text(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *s = malloc((size_t)n + 1);
    if (s && fread(s, 1, (size_t)n, f) != (size_t)n) {
        free(s);
        s = NULL;
    }
    fclose(f);
    if (s)
        s[n] = 0;
    return s;
}

/* Loads dir against c and expects code `want` with `needle` in the message
 * (and the folder named in it); 1 if so, else why says what came. */
static int refused(const char *dir, const model_config *c, int32_t max_rank, int want, const char *needle)
{
    lora_adapter *a = (lora_adapter *)1;
    int rc = lora_load_peft(dir, c, max_rank, &a);
    int ok = rc == want && a == NULL && strstr(rd_errmsg(), needle) && strstr(rd_errmsg(), "lora: '");
    snprintf(why, sizeof why, "rc %d (want %d), message '%.400s' (want '%s')", rc, want, rd_errmsg(), needle);
    if (rc == 0)
        lora_free(a);
    return ok;
}

/* ------------------------------------------------------------------------
 * The generated adapters load as written. */

typedef struct {
    const char *dir, *model;
    int32_t rank;
    float alpha;
    int rslora;
    uint32_t modules;           /* bits of lora_module */
    st_dtype dtype;
} good_case;

#define ATTN ((1u << LORA_Q) | (1u << LORA_K) | (1u << LORA_V) | (1u << LORA_O))
#define ALL (ATTN | (1u << LORA_GATE) | (1u << LORA_UP) | (1u << LORA_DOWN))

static const good_case GOOD[] = {
    {"tiny-f32-r8-attn", "tiny-f32", 8, 16, 0, ATTN, ST_F32},
    {"tiny-f32-r64-all", "tiny-f32", 64, 32, 0, ALL, ST_BF16},
    {"tiny-qwen3-r8-attn-rslora", "tiny-qwen3", 8, 16, 1, ATTN, ST_F16},
    {"tiny-qwen3-r64-all", "tiny-qwen3", 64, 64, 0, ALL, ST_F32},
    {"tiny-moe-r8-attn", "tiny-moe-f32", 8, 8, 0, ATTN, ST_BF16},
    {"tiny-moe-r64-attn", "tiny-moe-f32", 64, 128, 1, ATTN, ST_F16},
};

/* A module's [in, out] straight from the config (lora.h's table). */
static void want_shape(const model_config *c, int m, int64_t *in, int64_t *out)
{
    const int64_t q = (int64_t)c->n_heads * c->head_dim, kv = (int64_t)c->n_kv_heads * c->head_dim;
    switch (m) {
    case LORA_Q: *in = c->dim, *out = q; break;
    case LORA_K:
    case LORA_V: *in = c->dim, *out = kv; break;
    case LORA_O: *in = q, *out = c->dim; break;
    case LORA_GATE:
    case LORA_UP: *in = c->dim, *out = c->ffn_dim; break;
    default: *in = c->ffn_dim, *out = c->dim; break;
    }
}

static void test_generated_adapters_load(void)
{
    for (size_t i = 0; i < sizeof GOOD / sizeof GOOD[0]; i++) {
        const good_case *g = &GOOD[i];
        model_config c;
        NEED_CFG(g->model, &c);
        char dir[600];
        adapter_dir(g->dir, dir, sizeof dir);
        lora_adapter *a;
        int rc = lora_load_peft(dir, &c, 64, &a);
        CHECK(rc == 0, "%s: %s", g->dir, rd_errmsg());
        int ok = 1;
        snprintf(why, sizeof why, "%s: ", g->dir);
        const double scale = g->rslora ? g->alpha / sqrt((double)g->rank) : (double)g->alpha / g->rank;
        if (strcmp(a->name, g->dir) || a->rank != g->rank || a->alpha != g->alpha || a->rslora != g->rslora ||
            fabs(a->scale - scale) > 1e-6 * scale || a->modules != g->modules || a->n_layers != c.n_layers ||
            strcmp(a->arch, c.arch) || strcmp(a->path, dir)) {
            snprintf(why + strlen(why), sizeof why - strlen(why),
                     "name %s rank %d alpha %g rslora %d scale %g (want %g) modules %x (want %x) arch %s", a->name,
                     a->rank, a->alpha, a->rslora, a->scale, scale, a->modules, g->modules, a->arch);
            ok = 0;
        }
        uint64_t bytes = 0;
        int32_t pairs = 0;
        int pairs_ok = 1;
        for (int m = 0; ok && m < LORA_N_MODULES; m++) {
            int64_t in, out;
            want_shape(&c, m, &in, &out);
            const int on = (g->modules >> m) & 1;
            if (on && (a->in[m] != in || a->out[m] != out)) {
                snprintf(why + strlen(why), sizeof why - strlen(why), "%s in %d out %d, want %lld %lld",
                         lora_module_name((lora_module)m), a->in[m], a->out[m], (long long)in, (long long)out);
                ok = 0;
            }
            for (int32_t l = 0; l < c.n_layers; l++) {
                const lora_pair *p = lora_pair_at(a, l, (lora_module)m);
                if (!on) {
                    pairs_ok &= p->a == NULL && p->b == NULL;
                    continue;
                }
                pairs_ok &= p->a && p->b && p->a_dtype == g->dtype && p->b_dtype == g->dtype &&
                            (uintptr_t)p->a % 64 == 0 && (uintptr_t)p->b % 64 == 0;
                bytes += (uint64_t)(a->rank * in + out * a->rank) * st_dtype_size(g->dtype);
                pairs++;
            }
        }
        if (ok && !pairs_ok) {
            snprintf(why + strlen(why), sizeof why - strlen(why), "a pair's presence, dtype or alignment is wrong");
            ok = 0;
        }
        if (ok && (a->bytes != bytes || a->n_pairs != pairs)) {
            snprintf(why + strlen(why), sizeof why - strlen(why), "bytes %llu (want %llu), pairs %d (want %d)",
                     (unsigned long long)a->bytes, (unsigned long long)bytes, a->n_pairs, pairs);
            ok = 0;
        }
        CHECK(lora_pair_at(a, c.n_layers, LORA_Q) == NULL && lora_pair_at(a, 0, LORA_N_MODULES) == NULL,
              "out-of-range pairs must be NULL");
        lora_free(a);
        CHECK(ok, "%.300s", why);
    }
}

/* Every pair holds the file's bytes (tests/py/test_lora_load.py checks the
 * values against the generator's own), and the file may go away: the
 * adapter owns its copy. */
static void test_data_is_the_files_and_owned(void)
{
    static const struct {
        const char *dir, *model;
    } C[] = {{"tiny-f32-r64-all", "tiny-f32"}, {"tiny-qwen3-r8-attn-rslora", "tiny-qwen3"}};
    for (size_t i = 0; i < 2; i++) {
        model_config c;
        NEED_CFG(C[i].model, &c);
        char dir[600], path[700];
        adapter_dir(C[i].dir, dir, sizeof dir);
        /* Copied to a folder of its own, which is removed while the adapter lives. */
        char tmp[600];
        tmpdir(tmp, sizeof tmp);
        CHECK(tmp[0], "mkdtemp");
        char cmd[2200];
        snprintf(cmd, sizeof cmd, "cp '%s/adapter_config.json' '%s/adapter_model.safetensors' '%s/'", dir, dir, tmp);
        CHECK(system(cmd) == 0, "%.300s", cmd);
        lora_adapter *a;
        CHECK_OK(lora_load_peft(tmp, &c, 64, &a));
        rmtree(tmp);
        snprintf(path, sizeof path, "%s/adapter_model.safetensors", dir);
        st_file *f;
        CHECK_OK(st_open(path, &f));
        int bad = 0;
        char name[256];
        for (int32_t l = 0; l < c.n_layers; l++)
            for (int m = 0; m < LORA_N_MODULES; m++) {
                const lora_pair *p = lora_pair_at(a, l, (lora_module)m);
                if (!p->a)
                    continue;
                static const char *const path_of[] = {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj",
                                                      "self_attn.o_proj", "mlp.gate_proj", "mlp.up_proj",
                                                      "mlp.down_proj"};
                for (int b = 0; b < 2; b++) {
                    snprintf(name, sizeof name, "base_model.model.model.layers.%d.%s.lora_%c.weight", l, path_of[m],
                             b ? 'B' : 'A');
                    const st_tensor *t = st_find(f, name);
                    if (!t || memcmp(t->data, b ? p->b : p->a, t->n_elems * st_dtype_size(t->dtype)))
                        bad++;
                }
                /* The f32 view: the same values as the reader's conversion. */
                const size_t n = (size_t)a->rank * a->in[m];
                float *x = malloc(n * sizeof(float)), *y = malloc(n * sizeof(float));
                snprintf(name, sizeof name, "base_model.model.model.layers.%d.%s.lora_A.weight", l, path_of[m]);
                if (lora_to_f32(p->a, p->a_dtype, n, x) || st_read_f32(st_find(f, name), y) ||
                    memcmp(x, y, n * sizeof(float)))
                    bad++;
                free(x);
                free(y);
            }
        st_close(f);
        lora_free(a);
        CHECK(bad == 0, "%s: %d tensors differ from the file", C[i].dir, bad);
    }
}

/* The generator's refused variants. */
static void test_generated_refusals(void)
{
    model_config dense, moe;
    NEED_CFG("tiny-f32", &dense);
    NEED_CFG("tiny-moe-f32", &moe);
    char dir[600];
    adapter_dir("tiny-moe-r8-all", dir, sizeof dir);
    CHECK(refused(dir, &moe, 64, RD_ENOTSUP, "LoRA on the MoE experts is not supported"), "%.300s", why);
    CHECK(refused(dir, &moe, 64, RD_ENOTSUP, "model.layers.0.mlp.experts.0.gate_proj"), "%.300s", why);
    adapter_dir("tiny-f32-dora", dir, sizeof dir);
    CHECK(refused(dir, &dense, 64, RD_ENOTSUP, "\"use_dora\" is true: DoRA"), "%.300s", why);
    adapter_dir("tiny-f32-modules-to-save", dir, sizeof dir);
    CHECK(refused(dir, &dense, 64, RD_ENOTSUP, "\"modules_to_save\" is [\"lm_head\"]"), "%.300s", why);
    adapter_dir("tiny-f32-lm-head", dir, sizeof dir);
    CHECK(refused(dir, &dense, 64, RD_ENOTSUP, "target_modules selects lm_head: LoRA on the LM head"), "%.300s", why);
    /* Rank 64 over a limit of 32; an adapter for another model (qwen3's q is 128 wide, llama's 64). */
    adapter_dir("tiny-f32-r64-all", dir, sizeof dir);
    CHECK(refused(dir, &dense, 32, RD_ERANGE, "rank r = 64 is above the maximum LoRA rank 32"), "%.300s", why);
    adapter_dir("tiny-qwen3-r8-attn-rslora", dir, sizeof dir);
    CHECK(refused(dir, &dense, 64, RD_EFORMAT, "q_proj.lora_B.weight' has shape [128, 8]; expected [64, 8]"), "%.300s",
          why);
    /* The MoE's attention adapter on the dense model fits (same attention shapes), the dense
     * all-linear one on the MoE does not: its gate_proj names the experts'. */
    adapter_dir("tiny-f32-r64-all", dir, sizeof dir);
    CHECK(refused(dir, &moe, 64, RD_ENOTSUP, "experts.0.gate_proj: LoRA on the MoE experts"), "%.300s", why);
}

/* ------------------------------------------------------------------------
 * adapter_config.json variants, on the generated rank-8 attention adapter's
 * tensors (tiny-f32: llama, 2 layers, dim 64, q 64, kv 32, ffn 128). */

typedef struct {
    const char *key;            /* the key set, or removed when json is NULL */
    const char *json;
    int want;                   /* 0: loads */
    const char *needle;
} cfg_case;

static const cfg_case CFG[] = {
    {"use_dora", "true", RD_ENOTSUP, "\"use_dora\" is true: DoRA adapters"},
    {"modules_to_save", "[\"lm_head\", \"embed_tokens\"]", RD_ENOTSUP, "\"modules_to_save\" is [\"lm_head\""},
    {"rank_pattern", "{\"q_proj\": 16}", RD_ENOTSUP, "\"rank_pattern\" is {\"q_proj\":16}: per-module ranks"},
    {"alpha_pattern", "{\"v_proj\": 4}", RD_ENOTSUP, "\"alpha_pattern\" is {\"v_proj\":4}: per-module alphas"},
    {"bias", "\"all\"", RD_ENOTSUP, "\"bias\" is \"all\": trained biases"},
    {"bias", "\"lora_only\"", RD_ENOTSUP, "\"bias\" is \"lora_only\""},
    {"fan_in_fan_out", "true", RD_ENOTSUP, "\"fan_in_fan_out\" is true"},
    {"lora_bias", "true", RD_ENOTSUP, "\"lora_bias\" is true"},
    {"layer_replication", "[[0, 2], [1, 2]]", RD_ENOTSUP, "\"layer_replication\""},
    {"exclude_modules", "[\"k_proj\"]", RD_ENOTSUP, "\"exclude_modules\""},
    {"target_parameters", "[\"experts.gate_up_proj\"]", RD_ENOTSUP, "\"target_parameters\""},
    {"trainable_token_indices", "[5, 6]", RD_ENOTSUP, "\"trainable_token_indices\""},
    {"use_qalora", "true", RD_ENOTSUP, "QA-LoRA"},
    {"alora_invocation_tokens", "[1, 2]", RD_ENOTSUP, "aLoRA"},
    {"peft_type", "\"IA3\"", RD_ENOTSUP, "\"peft_type\" is \"IA3\": only LORA"},
    {"r", "0", RD_EFORMAT, "\"r\" must be a positive integer"},
    {"r", "8.5", RD_EFORMAT, "\"r\" must be a positive integer"},
    {"r", "\"8\"", RD_EFORMAT, "\"r\" must be a positive integer"},
    {"r", "16", RD_EFORMAT, "has shape [8, 64]; expected [16, 64]"},
    {"lora_alpha", "\"16\"", RD_EFORMAT, "\"lora_alpha\" must be a number"},
    {"use_rslora", "\"yes\"", RD_EFORMAT, "\"use_rslora\" must be true or false"},
    {"target_modules", NULL, RD_EFORMAT, "\"target_modules\" is missing"},
    {"target_modules", "5", RD_EFORMAT, "\"target_modules\" must be a non-empty list"},
    {"target_modules", "[]", RD_EFORMAT, "\"target_modules\" must be a non-empty list"},
    {"target_modules", "[\"q_proj\", 3]", RD_EFORMAT, "entry 1 is not a module name"},
    {"target_modules", "[\"q_proj\", \"k_proj\", \"v_proj\", \"o_proj\", \"foo_proj\"]", RD_EFORMAT,
     "target_modules names 'foo_proj', which is no linear module of this llama model"},
    {"target_modules", "[\"q_proj\", \"k_proj\", \"v_proj\", \"o_proj\", \"gate\"]", RD_EFORMAT, "names 'gate'"},
    {"target_modules", "[\"q_proj\", \"lm_head\"]", RD_ENOTSUP, "selects lm_head: LoRA on the LM head"},
    {"target_modules", "[\"q_proj\", \"embed_tokens\"]", RD_ENOTSUP,
     "selects model.embed_tokens: LoRA on the token embeddings"},
    {"target_modules", "\"(\"", RD_EFORMAT, "\"target_modules\" regex '(': missing closing parenthesis"},
    {"target_modules", "\"q_proj\"", RD_EFORMAT, "regex 'q_proj' matches no module of this llama model"},
    {"target_modules", "\".*\"", RD_ENOTSUP, "selects model.embed_tokens"},
    {"target_modules", "\"(.*.*)*y\"", RD_EFORMAT, "takes over 100000 backtracking steps on 'model.layers.0"},
    {"target_modules", "\"all-linear\"", RD_EFORMAT, "model.layers.0.mlp.gate_proj has no lora_A.weight"},
    {"target_modules", "[\"q_proj\", \"k_proj\", \"v_proj\", \"o_proj\", \"up_proj\"]", RD_EFORMAT,
     "model.layers.0.mlp.up_proj has no lora_A.weight"},
    {"target_modules", "[\"q_proj\", \"v_proj\"]", RD_EFORMAT,
     "k_proj.lora_A.weight' is for model.layers.0.self_attn.k_proj, which adapter_config.json does not select"},
    {"layers_to_transform", "5", RD_EFORMAT, "\"layers_to_transform\" names layer 5; the model has 2 layers"},
    {"layers_to_transform", "[0, -1]", RD_EFORMAT, "holds a value that is not a layer number"},
    {"layers_to_transform", "\"0\"", RD_EFORMAT, "must be a layer number or a list"},
    {"layers_to_transform", "[0]", RD_EFORMAT, "layers.1.self_attn.q_proj, which adapter_config.json does not"},
    {"layers_pattern", "\"h\"", RD_ENOTSUP, "\"layers_pattern\" is \"h\""},
    /* Accepted: PEFT's other spellings of the same adapter, and what inference ignores. */
    {"target_modules", "\"model\\\\.layers\\\\.\\\\d+\\\\.self_attn\\\\.(q|k|v|o)_proj\"", 0, ""},
    {"target_modules", "[\"self_attn.q_proj\", \"k_proj\", \"layers.0.self_attn.v_proj\", \"v_proj\", \"o_proj\"]", 0,
     ""},
    {"target_modules", "[\"model.layers.0.self_attn.q_proj\", \"model.layers.1.self_attn.q_proj\", \"k_proj\", "
                       "\"v_proj\", \"o_proj\", \"not_in_the_model_but_q\"]", RD_EFORMAT,
     "'not_in_the_model_but_q'"},
    {"layers_to_transform", "[0, 1]", 0, ""},
    {"layers_to_transform", "[1, 0, 1]", 0, ""},
    {"layers_pattern", "\"layers\"", 0, ""},
    {"layers_pattern", "[\"h\", \"layers\"]", 0, ""},
    {"lora_dropout", "0.3", 0, ""},
    {"peft_type", NULL, 0, ""},
    {"bias", "\"none\"", 0, ""},
    {"modules_to_save", "[]", 0, ""},
    {"rank_pattern", "{}", 0, ""},
    {"use_dora", "false", 0, ""},
    {"r", NULL, 0, ""},             /* PEFT's default r is 8 */
    {"lora_alpha", NULL, 0, ""},    /* and lora_alpha 8: scale 1 */
};

static void test_config_variants(void)
{
    model_config c;
    NEED_CFG("tiny-f32", &c);
    char base[600], path[700], tmp[600];
    adapter_dir("tiny-f32-r8-attn", base, sizeof base);
    snprintf(path, sizeof path, "%s/adapter_config.json", base);
    char *text = read_text(path);
    CHECK(text, "cannot read %.300s (run tests/gen_testdata.sh)", path);
    tmpdir(tmp, sizeof tmp);
    CHECK(tmp[0], "mkdtemp");
    char src[1300], dst[700];
    snprintf(src, sizeof src, "%s", base);
    if (src[0] != '/') {
        char cwd[600];
        CHECK(getcwd(cwd, sizeof cwd), "getcwd");
        snprintf(src, sizeof src, "%s/%s", cwd, base);
    }
    strcat(src, "/adapter_model.safetensors");
    snprintf(dst, sizeof dst, "%s/adapter_model.safetensors", tmp);
    CHECK(symlink(src, dst) == 0, "symlink %.300s", src);
    int failed = 0;
    char first[1024] = "";
    for (size_t i = 0; i < sizeof CFG / sizeof CFG[0]; i++) {
        const cfg_case *k = &CFG[i];
        cJSON *root = cJSON_Parse(text);
        cJSON_DeleteItemFromObjectCaseSensitive(root, k->key);
        if (k->json)
            cJSON_AddItemToObject(root, k->key, cJSON_Parse(k->json));
        char *s = cJSON_Print(root);
        cJSON_Delete(root);
        int wrote = write_text(tmp, "adapter_config.json", s);
        free(s);
        CHECK(wrote, "cannot write the config");
        int ok;
        if (k->want == 0) {
            lora_adapter *a = NULL;
            int rc = lora_load_peft(tmp, &c, 64, &a);
            ok = rc == 0 && a->n_pairs == 2 * 4 && a->rank == 8;
            if (ok && k->json == NULL && !strcmp(k->key, "lora_alpha"))
                ok = a->scale == 1.0f;
            snprintf(why, sizeof why, "loads: rc %d '%.300s'", rc, rc ? rd_errmsg() : "");
            lora_free(a);
        } else {
            ok = refused(tmp, &c, 64, k->want, k->needle);
        }
        if (!ok && !failed++)
            snprintf(first, sizeof first, "%s = %.60s: %.800s", k->key, k->json ? k->json : "(absent)", why);
    }
    /* Not a JSON object, and not JSON. */
    CHECK(write_text(tmp, "adapter_config.json", "[1, 2]"), "write");
    int ok1 = refused(tmp, &c, 64, RD_EFORMAT, "adapter_config.json is not a JSON object");
    CHECK(write_text(tmp, "adapter_config.json", "{\"r\": 8, \"target_modules\": [\"q_proj\"],"), "write");
    int ok2 = refused(tmp, &c, 64, RD_EFORMAT, "adapter_config.json is not valid JSON (error near byte");
    free(text);
    rmtree(tmp);
    CHECK(failed == 0, "%d of %zu variants wrong; first: %.300s", failed, sizeof CFG / sizeof CFG[0], first);
    CHECK(ok1 && ok2, "bad JSON: %.300s", why);
}

/* ------------------------------------------------------------------------
 * Hand-written safetensors files: every tensor-level refusal. */

typedef struct {
    char name[200];
    const char *dtype;          /* "F32", "BF16", "I32", ... */
    int nd;
    int64_t shape[3];
} tspec;

static size_t dsize(const char *d) { return !strcmp(d, "F32") || !strcmp(d, "I32") ? 4 : 2; }

/* Writes the tensors (data: small values, exact in every dtype) to dir/file. */
static int write_st(const char *dir, const char *file, const tspec *t, int n)
{
    size_t cap = 256 + (size_t)n * 320, len = 0, off = 0;
    char *h = malloc(cap);
    len += (size_t)snprintf(h + len, cap - len, "{\"__metadata__\":{\"format\":\"pt\"}");
    for (int i = 0; i < n; i++) {
        size_t elems = 1;
        char shape[80] = "";
        for (int d = 0; d < t[i].nd; d++) {
            elems *= (size_t)t[i].shape[d];
            snprintf(shape + strlen(shape), sizeof shape - strlen(shape), "%s%lld", d ? "," : "",
                     (long long)t[i].shape[d]);
        }
        size_t bytes = elems * dsize(t[i].dtype);
        len += (size_t)snprintf(h + len, cap - len, ",\"%s\":{\"dtype\":\"%s\",\"shape\":[%s],\"data_offsets\":[%zu,%zu]}",
                                t[i].name, t[i].dtype, shape, off, off + bytes);
        off += bytes;
    }
    len += (size_t)snprintf(h + len, cap - len, "}");
    char p[700];
    snprintf(p, sizeof p, "%s/%s", dir, file);
    FILE *f = fopen(p, "wb");
    uint8_t hl[8];
    for (int i = 0; i < 8; i++)
        hl[i] = (uint8_t)((uint64_t)len >> (8 * i));
    int ok = f && fwrite(hl, 1, 8, f) == 8 && fwrite(h, 1, len, f) == len;
    for (size_t i = 0; ok && i < off; i++)
        ok = fputc(i % 2 ? 0x3c : 0, f) != EOF;   /* F16 1.0 halves / small F32 and BF16 values */
    free(h);
    return f && fclose(f) == 0 && ok;
}

/* The tiny-f32 q_proj adapter of rank 8 in both layers, then the change. */
static int q_only(tspec *t, int32_t layers)
{
    int n = 0;
    for (int32_t l = 0; l < layers; l++)
        for (int b = 0; b < 2; b++) {
            snprintf(t[n].name, sizeof t[n].name, "base_model.model.model.layers.%d.self_attn.q_proj.lora_%c.weight",
                     l, b ? 'B' : 'A');
            t[n].dtype = "F32";
            t[n].nd = 2;
            t[n].shape[0] = b ? 64 : 8;
            t[n].shape[1] = b ? 8 : 64;
            n++;
        }
    return n;
}

static const char *Q_CONFIG = "{\"peft_type\": \"LORA\", \"r\": 8, \"lora_alpha\": 16, \"target_modules\": [\"q_proj\"]}";

static void test_file_refusals(void)
{
    model_config c, moe;
    NEED_CFG("tiny-f32", &c);
    NEED_CFG("tiny-moe-f32", &moe);
    char tmp[600], sub[700];
    tmpdir(tmp, sizeof tmp);
    CHECK(tmp[0], "mkdtemp");
    tspec t[12];
    int n;
    /* Missing folder, folder without a config, without weights, with a pickle, a file not a folder. */
    snprintf(sub, sizeof sub, "%s/none", tmp);
    CHECK(refused(sub, &c, 64, RD_EIO, "cannot open the adapter folder: No such file"), "%.300s", why);
    CHECK(refused(tmp, &c, 64, RD_EIO, "cannot read adapter_config.json: No such file"), "%.300s", why);
    CHECK(write_text(tmp, "adapter_config.json", Q_CONFIG), "write");
    CHECK(refused(tmp, &c, 64, RD_EIO, "cannot open adapter_model.safetensors: No such file"), "%.300s", why);
    CHECK(write_text(tmp, "adapter_model.bin", "pickle"), "write");
    CHECK(refused(tmp, &c, 64, RD_ENOTSUP, "holds adapter_model.bin (a pickle), which is not read"), "%.300s", why);
    snprintf(sub, sizeof sub, "%s/adapter_model.bin", tmp);
    CHECK(refused(sub, &c, 64, RD_EIO, "not a folder"), "%.300s", why);
    /* The good file first, so that each refusal below is its change's. */
    n = q_only(t, 2);
    CHECK(write_st(tmp, "adapter_model.safetensors", t, n), "write");
    lora_adapter *a;
    CHECK_OK(lora_load_peft(tmp, &c, 64, &a));
    CHECK(a->n_pairs == 2 && a->modules == 1u << LORA_Q && a->bytes == 2 * 2 * 8 * 64 * 4 && a->scale == 2.0f,
          "pairs %d modules %x bytes %llu scale %g", a->n_pairs, a->modules, (unsigned long long)a->bytes, a->scale);
    lora_free(a);
    /* Truncated. */
    CHECK(write_text(tmp, "adapter_model.safetensors", "\x10\0\0\0\0\0\0\0{}"), "write");
    CHECK(refused(tmp, &c, 64, RD_EFORMAT, "adapter_model.safetensors: "), "%.300s", why);

    static const struct {
        int what;
        int want;
        const char *needle;
    } K[] = {
        {0, RD_EFORMAT, "model.layers.1.self_attn.q_proj has no lora_B.weight"},
        {1, RD_EFORMAT, "layers.0.self_attn.q_proj.lora_A.weight' has shape [8, 65]; expected [8, 64] (lora_A is "
                        "[r, in] with r = 8, q_proj in = 64, out = 64)"},
        {2, RD_EFORMAT, "lora_B.weight' has shape [64, 4]; expected [64, 8]"},
        {3, RD_EFORMAT, "has shape [512]; expected [8, 64]"},
        {4, RD_ENOTSUP, "q_proj.lora_magnitude_vector' is DoRA's magnitude"},
        {5, RD_ENOTSUP, "lora_embedding_A': LoRA on the token embeddings"},
        {6, RD_ENOTSUP, "q_proj.lora_B.bias': a bias on lora_B"},
        {7, RD_EFORMAT, "unexpected tensor 'model.layers.0.self_attn.q_proj.lora_A.weight'"},
        {8, RD_EFORMAT, "layers.7.self_attn.q_proj.lora_A.weight' does not fit the model: "},
        {9, RD_EFORMAT, "no module of this llama model is called 'model.layers.0.self_attn.x_proj'"},
        {10, RD_ENOTSUP, "lm_head.lora_A.weight': LoRA on the LM head"},
        {11, RD_ENOTSUP, "is I32; LoRA tensors must be F32, F16 or BF16"},
        {12, RD_EFORMAT, "appears twice"},
        {13, RD_EFORMAT, "unexpected tensor 'base_model.model.model.layers.0.self_attn.q_proj.weight'"},
    };
    int failed = 0;
    char first[1100] = "";
    for (size_t i = 0; i < sizeof K / sizeof K[0]; i++) {
        n = q_only(t, 2);
        switch (K[i].what) {
        case 0: n--; break;                                     /* layer 1's B */
        case 1: t[0].shape[1] = 65; break;
        case 2: t[1].shape[1] = 4; break;
        case 3: t[0].nd = 1, t[0].shape[0] = 512; break;
        case 4:
            snprintf(t[n].name, sizeof t[n].name, "base_model.model.model.layers.0.self_attn.q_proj.lora_magnitude_vector");
            t[n].dtype = "F32", t[n].nd = 1, t[n].shape[0] = 64, n++;
            break;
        case 5:
            snprintf(t[n].name, sizeof t[n].name, "base_model.model.model.embed_tokens.lora_embedding_A");
            t[n].dtype = "F32", t[n].nd = 2, t[n].shape[0] = 8, t[n].shape[1] = 300, n++;
            break;
        case 6:
            snprintf(t[n].name, sizeof t[n].name, "base_model.model.model.layers.0.self_attn.q_proj.lora_B.bias");
            t[n].dtype = "F32", t[n].nd = 1, t[n].shape[0] = 64, n++;
            break;
        case 7: memmove(t[0].name, t[0].name + 17, strlen(t[0].name + 17) + 1); break;   /* no base_model.model. */
        case 8: memcpy(strstr(t[0].name, "layers.0"), "layers.7", 8); break;
        case 9:
            t[n] = t[0];
            memcpy(strstr(t[n].name, "q_proj"), "x_proj", 6);
            n++;
            break;
        case 10:
            snprintf(t[n].name, sizeof t[n].name, "base_model.model.lm_head.lora_A.weight");
            t[n].dtype = "F32", t[n].nd = 2, t[n].shape[0] = 8, t[n].shape[1] = 64, n++;
            break;
        case 11: t[2].dtype = "I32"; break;
        case 12: t[n] = t[0], n++; break;
        case 13:
            snprintf(t[n].name, sizeof t[n].name, "base_model.model.model.layers.0.self_attn.q_proj.weight");
            t[n].dtype = "F32", t[n].nd = 2, t[n].shape[0] = 64, t[n].shape[1] = 64, n++;
            break;
        }
        int ok = write_st(tmp, "adapter_model.safetensors", t, n) && refused(tmp, &c, 64, K[i].want, K[i].needle);
        if (!ok && !failed++)
            snprintf(first, sizeof first, "case %d: %s", K[i].what, why);
    }
    CHECK(failed == 0, "%d of %zu wrong; first: %.300s", failed, sizeof K / sizeof K[0], first);

    /* F16 A with BF16 B: each kept in its own dtype. */
    n = q_only(t, 2);
    t[0].dtype = "F16", t[1].dtype = "BF16", t[2].dtype = "BF16", t[3].dtype = "F16";
    CHECK(write_st(tmp, "adapter_model.safetensors", t, n), "write");
    CHECK_OK(lora_load_peft(tmp, &c, 64, &a));
    const lora_pair *p0 = lora_pair_at(a, 0, LORA_Q), *p1 = lora_pair_at(a, 1, LORA_Q);
    int dt_ok = p0->a_dtype == ST_F16 && p0->b_dtype == ST_BF16 && p1->a_dtype == ST_BF16 && p1->b_dtype == ST_F16 &&
                a->bytes == 2 * 2 * 8 * 64 * 2;
    lora_free(a);
    CHECK(dt_ok, "mixed dtypes not kept");

    /* layers_to_transform: a file with layer 1 only. */
    CHECK(write_text(tmp, "adapter_config.json", "{\"r\": 8, \"lora_alpha\": 8, \"use_rslora\": true, "
                                                 "\"target_modules\": [\"q_proj\"], \"layers_to_transform\": 1}"),
          "write");
    n = q_only(t, 2);
    CHECK(write_st(tmp, "adapter_model.safetensors", t + 2, 2), "write");
    CHECK_OK(lora_load_peft(tmp, &c, 64, &a));
    int lt_ok = a->n_pairs == 1 && !lora_pair_at(a, 0, LORA_Q)->a && lora_pair_at(a, 1, LORA_Q)->a &&
                fabsf(a->scale - 8 / sqrtf(8)) < 1e-6f;
    lora_free(a);
    CHECK(lt_ok, "layers_to_transform 1 not honoured");
    CHECK(write_st(tmp, "adapter_model.safetensors", t, 2), "write");
    CHECK(refused(tmp, &c, 64, RD_EFORMAT, "layers.0.self_attn.q_proj, which adapter_config.json does not select "
                                           "(target_modules, layers_to_transform)"), "%.300s", why);

    /* The MoE: an expert tensor in an attention adapter's file is refused by name; so is a
     * regex that takes in the router. */
    CHECK(write_text(tmp, "adapter_config.json", Q_CONFIG), "write");
    n = q_only(t, 2);
    for (int i = 0; i < n; i++)
        if (t[i].shape[0] == 64)
            t[i].shape[0] = 128;       /* qwen3-moe's q: 4 heads x 32 */
    snprintf(t[n].name, sizeof t[n].name, "base_model.model.model.layers.1.mlp.experts.3.up_proj.lora_A.weight");
    t[n].dtype = "F32", t[n].nd = 2, t[n].shape[0] = 8, t[n].shape[1] = 64, n++;
    CHECK(write_st(tmp, "adapter_model.safetensors", t, n), "write");
    CHECK(refused(tmp, &moe, 64, RD_ENOTSUP, "experts.3.up_proj.lora_A.weight': LoRA on the MoE experts is not "
                                             "supported (qwen3moe: the attention's q_proj"), "%.300s", why);
    CHECK(write_text(tmp, "adapter_config.json", "{\"r\": 8, \"target_modules\": \".*\\\\.(q_proj|gate)\"}"), "write");
    CHECK(refused(tmp, &moe, 64, RD_ENOTSUP, "selects model.layers.0.mlp.gate: LoRA on the MoE router"), "%.300s", why);
    CHECK(write_text(tmp, "adapter_config.json", "{\"r\": 8, \"target_modules\": [\"q_proj\", \"down_proj\"]}"),
          "write");
    CHECK(refused(tmp, &moe, 64, RD_ENOTSUP, "selects model.layers.0.mlp.experts.0.down_proj"), "%.300s", why);

    /* Bad arguments. */
    model_config odd = c;
    snprintf(odd.arch, sizeof odd.arch, "gpt2");
    a = (lora_adapter *)1;
    CHECK(lora_load_peft(tmp, &odd, 64, &a) == RD_EINVAL && a == NULL && strstr(rd_errmsg(), "gpt2"), "%s",
          rd_errmsg());
    CHECK(lora_load_peft(tmp, &c, 0, &a) == RD_EINVAL && strstr(rd_errmsg(), "max_rank 0"), "%s", rd_errmsg());
    CHECK(lora_load_peft(tmp, &c, LORA_MAX_RANK + 1, &a) == RD_EINVAL, "%s", rd_errmsg());
    CHECK(lora_load_peft(NULL, &c, 8, &a) == RD_EINVAL, "%s", rd_errmsg());
    rmtree(tmp);
}

/* ------------------------------------------------------------------------
 * The resident set. */

static lora_adapter *fake(int32_t rank, uint64_t bytes)
{
    lora_adapter *a = calloc(1, sizeof *a);
    a->rank = rank;
    a->bytes = bytes;
    snprintf(a->name, sizeof a->name, "unnamed");
    return a;
}

static int names_are(const lora_set *s, const char *want)
{
    lora_info info[8];
    int32_t n;
    if (lora_set_list(s, info, 8, &n))
        return 0;
    char got[256] = "";
    for (int32_t i = 0; i < n; i++)
        snprintf(got + strlen(got), sizeof got - strlen(got), "%s%s", i ? "," : "", info[i].name);
    snprintf(why, sizeof why, "resident '%s', want '%s'", got, want);
    return !strcmp(got, want);
}

static void test_set_lru_eviction(void)
{
    lora_set *s;
    CHECK_OK(lora_set_new(3, &s));
    char ev[LORA_NAME_MAX];
    CHECK_OK(lora_set_add(s, fake(8, 100), "a", 1, 0, ev, sizeof ev, NULL));
    CHECK_OK(lora_set_add(s, fake(16, 200), "b", 1, 0, ev, sizeof ev, NULL));
    CHECK_OK(lora_set_add(s, fake(32, 300), "c", 7, 0, ev, sizeof ev, NULL));
    CHECK(ev[0] == 0 && lora_set_count(s) == 3 && lora_set_capacity(s) == 3, "no eviction below capacity");
    /* a used again (pin, unpin): b is now the least recently used. */
    lora_pinned pa;
    uint64_t ver;
    CHECK_OK(lora_set_pin(s, "a", &pa));
    CHECK_OK(lora_set_unpin(s, pa.slot));
    CHECK_OK(lora_set_add(s, fake(8, 1), "d", 2, 0, ev, sizeof ev, NULL));
    CHECK(!strcmp(ev, "b"), "evicted '%s', want b", ev);
    CHECK(names_are(s, "a,c,d"), "%.300s", why);
    /* get counts no use: c stays the least recent. */
    const lora_adapter *g;
    CHECK_OK(lora_set_get(s, "c", &g, &ver));
    CHECK(ver == 7 && g->rank == 32, "get: version %llu rank %d", (unsigned long long)ver, g->rank);
    CHECK_OK(lora_set_add(s, fake(8, 1), "e", 3, 0, ev, sizeof ev, NULL));
    CHECK(!strcmp(ev, "c"), "evicted '%s', want c", ev);
    CHECK_OK(lora_set_add(s, fake(8, 1), "f", 4, 0, NULL, 0, NULL));
    CHECK(names_are(s, "d,e,f"), "%.300s", why);
    lora_set_free(s);
}

static void test_set_pins(void)
{
    lora_set *s;
    CHECK_OK(lora_set_new(2, &s));
    char ev[LORA_NAME_MAX];
    lora_adapter *x = fake(8, 10);
    CHECK_OK(lora_set_add(s, x, "old", 1, 0, ev, sizeof ev, NULL));
    CHECK_OK(lora_set_add(s, fake(8, 20), "mid", 1, 0, ev, sizeof ev, NULL));
    lora_pinned pa, pc;
    /* Pinned twice, then the other is touched: old is least recent but pinned, so mid goes. */
    CHECK_OK(lora_set_pin(s, "old", &pa));
    CHECK_OK(lora_set_pin(s, "old", &pa));
    CHECK(pa.a == x && pa.version == 1 && !strcmp(pa.a->name, "old"), "pin gave the wrong adapter");
    CHECK_OK(lora_set_add(s, fake(8, 30), "new", 2, 0, ev, sizeof ev, NULL));
    CHECK(!strcmp(ev, "mid"), "evicted '%s', want mid (old is pinned)", ev);
    /* Everything pinned: a full set refuses, and the adapter stays the caller's. */
    CHECK_OK(lora_set_pin(s, "new", &pc));
    lora_adapter *y = fake(8, 40);
    int rc = lora_set_add(s, y, "late", 3, 0, ev, sizeof ev, NULL);
    CHECK(rc == RD_EBUSY && strstr(rd_errmsg(), "all 2 adapter slots (max_loras) hold adapters that running sequences use"),
          "rc %d: %s", rc, rd_errmsg());
    CHECK(ev[0] == 0 && names_are(s, "old,new"), "%.300s", why);
    /* Remove while pinned is refused; after the pins are given back it works. */
    rc = lora_set_remove(s, "old");
    CHECK(rc == RD_EBUSY && strstr(rd_errmsg(), "'old' is in use by 2 running sequences"), "rc %d: %s", rc,
          rd_errmsg());
    CHECK_OK(lora_set_unpin(s, pa.slot));
    CHECK(lora_set_remove(s, "old") == RD_EBUSY && strstr(rd_errmsg(), "by 1 running sequence;"), "%s", rd_errmsg());
    CHECK_OK(lora_set_unpin(s, pa.slot));
    rc = lora_set_unpin(s, pa.slot);
    CHECK(rc == RD_EINVAL && strstr(rd_errmsg(), "'old' is not pinned"), "rc %d: %s", rc, rd_errmsg());
    CHECK_OK(lora_set_remove(s, "old"));
    CHECK(lora_set_unpin(s, pa.slot) == RD_ENOENT, "unpin of a removed adapter");
    CHECK_OK(lora_set_add(s, y, "late", 3, 0, ev, sizeof ev, NULL));
    CHECK(ev[0] == 0 && names_are(s, "new,late"), "%.300s", why);
    /* The listing for /status. */
    lora_info info[4];
    int32_t n;
    CHECK_OK(lora_set_list(s, info, 4, &n));
    CHECK(n == 2 && info[0].pins == 1 && info[0].version == 2 && info[0].bytes == 30 && info[1].pins == 0 &&
              info[1].version == 3 && info[1].rank == 8 && info[1].bytes == 40,
          "listing wrong");
    CHECK_OK(lora_set_list(s, info, 1, &n));
    CHECK(n == 1, "listing cut at cap");
    lora_set_free(s);   /* frees a pinned adapter too (shutdown) */
}

static void test_set_names(void)
{
    lora_set *s;
    CHECK(lora_set_new(0, &s) == RD_EINVAL && lora_set_new(LORA_MAX_LORAS + 1, &s) == RD_EINVAL, "bad max_loras");
    CHECK_OK(lora_set_new(4, &s));
    lora_adapter *a = fake(8, 1), *b = fake(8, 1);
    CHECK_OK(lora_set_add(s, a, "math", 1, 0, NULL, 0, NULL));
    int rc = lora_set_add(s, b, "math", 2, 0, NULL, 0, NULL);
    CHECK(rc == RD_EINVAL && strstr(rd_errmsg(), "an adapter named 'math' is already loaded"), "rc %d: %s", rc,
          rd_errmsg());
    CHECK(lora_set_add(s, a, "math2", 2, 0, NULL, 0, NULL) == RD_EINVAL, "the same adapter twice");
    CHECK(lora_set_add(s, b, "", 2, 0, NULL, 0, NULL) == RD_EINVAL && strstr(rd_errmsg(), "1 to 127 bytes"), "%s",
          rd_errmsg());
    char longname[200];
    memset(longname, 'x', 150);
    longname[150] = 0;
    CHECK(lora_set_add(s, b, longname, 2, 0, NULL, 0, NULL) == RD_EINVAL, "a 150-byte name");
    /* NULL name: the adapter's own. */
    snprintf(b->name, sizeof b->name, "code");
    CHECK_OK(lora_set_add(s, b, NULL, 5, 0, NULL, 0, NULL));
    CHECK(names_are(s, "math,code"), "%.300s", why);
    const lora_adapter *g;
    rc = lora_set_get(s, "nope", &g, NULL);
    CHECK(rc == RD_ENOENT && g == NULL && strstr(rd_errmsg(), "no adapter named 'nope' is loaded"), "%s",
          rd_errmsg());
    lora_pinned gp;
    CHECK(lora_set_pin(s, "nope", &gp) == RD_ENOENT, "pin of an absent name");
    CHECK(lora_set_remove(s, "nope") == RD_ENOENT, "remove of an absent name");
    CHECK_OK(lora_set_remove(s, "math"));
    CHECK(names_are(s, "code"), "%.300s", why);
    lora_set_free(s);
}

/* The free hook's record: which slots were freed, in order. */
static char freed[256];

static void note_free(void *ctx, int32_t slot, lora_adapter *a)
{
    (void)ctx;
    snprintf(freed + strlen(freed), sizeof freed - strlen(freed), "%s%d:%s", freed[0] ? "," : "", slot, a->name);
}

/* A push of a new version under a resident name: the pinned old one is retired (keeps its slot, serves its
   sequences, freed at its last unpin), new pins get the new one; slots are never shared while in use. */
static void test_set_replace_retires(void)
{
    lora_set *s;
    CHECK_OK(lora_set_new(2, &s));
    lora_set_on_free(s, note_free, NULL);
    freed[0] = 0;
    CHECK(lora_set_slots(s) == 4, "slots %d, want 2 * max_loras", lora_set_slots(s));
    int32_t sa, sb, sa2;
    CHECK_OK(lora_set_add(s, fake(8, 1), "a", 1, 0, NULL, 0, &sa));
    CHECK_OK(lora_set_add(s, fake(8, 1), "b", 1, 0, NULL, 0, &sb));
    CHECK(sa != sb, "two adapters in one slot");
    lora_pinned p1, p2;
    CHECK_OK(lora_set_pin(s, "a", &p1));
    CHECK(p1.slot == sa, "pin slot %d, want %d", p1.slot, sa);
    /* Replace a (pinned): a new slot, the old retired and not freed, the set still at 2 live. */
    CHECK_OK(lora_set_add(s, fake(16, 2), "a", 2, 1, NULL, 0, &sa2));
    CHECK(sa2 != sa && sa2 != sb && freed[0] == 0 && lora_set_count(s) == 2, "replace: slot %d, freed '%s'", sa2, freed);
    CHECK_OK(lora_set_pin(s, "a", &p2));
    CHECK(p2.slot == sa2 && p2.version == 2 && p2.a->rank == 16 && p2.uid != p1.uid, "new pins get the new adapter");
    CHECK(names_are(s, "b,a"), "%.300s", why);
    /* The retired one's last unpin frees it (the hook sees its slot). */
    CHECK_OK(lora_set_unpin(s, p1.slot));
    CHECK(!strcmp(freed, "0:a") && sa == 0, "freed '%s'", freed);
    CHECK(lora_set_unpin(s, p1.slot) == RD_ENOENT, "unpin of a freed retired slot");
    /* Replacing an idle adapter frees it at once. */
    freed[0] = 0;
    CHECK_OK(lora_set_add(s, fake(8, 3), "b", 3, 1, NULL, 0, &sb));
    CHECK(!strcmp(freed, "1:b"), "freed '%s'", freed);
    /* Without replace a resident name is refused. */
    lora_adapter *x = fake(8, 1);
    CHECK(lora_set_add(s, x, "b", 4, 0, NULL, 0, NULL) == RD_EINVAL, "name in use without replace");
    /* Fill the slots with pinned retired adapters: then a replace finds no slot and says so. Now: slot 0 b v3,
       slot 2 a v2 (pinned by p2). */
    lora_pinned q1, q2, q3;
    int32_t sl;
    CHECK_OK(lora_set_pin(s, "b", &q1));
    CHECK_OK(lora_set_add(s, fake(8, 1), "b", 5, 1, NULL, 0, &sl));  /* b v3 retired (slot 0) */
    CHECK_OK(lora_set_add(s, fake(8, 1), "a", 7, 1, NULL, 0, &sl));  /* a v2 retired (slot 2) */
    CHECK_OK(lora_set_pin(s, "a", &q2));
    CHECK_OK(lora_set_pin(s, "b", &q3));
    int rc = lora_set_add(s, x, "b", 6, 1, NULL, 0, NULL);           /* 2 retired + 2 live, all pinned */
    CHECK(rc == RD_EBUSY && strstr(rd_errmsg(), "(2 replaced ones wait"), "rc %d: %s", rc, rd_errmsg());
    rc = lora_set_add(s, x, "c", 6, 0, NULL, 0, NULL);
    CHECK(rc == RD_EBUSY && strstr(rd_errmsg(), "all 2 adapter slots"), "rc %d: %s", rc, rd_errmsg());
    freed[0] = 0;
    CHECK_OK(lora_set_unpin(s, p2.slot));
    CHECK(!strcmp(freed, "2:a"), "freed '%.40s'", freed);
    CHECK_OK(lora_set_unpin(s, q2.slot));
    freed[0] = 0;
    CHECK_OK(lora_set_add(s, x, "c", 6, 0, NULL, 0, &sl));           /* evicts a v7, the only idle live one */
    CHECK(!strcmp(freed, "3:a") && sl == 2 && names_are(s, "b,c"), "freed %.40s, slot %d; %.100s", freed, sl, why);
    freed[0] = 0;
    lora_set_free(s);
    CHECK(strstr(freed, ":b") && strstr(freed, ":c"), "shutdown frees through the hook: '%s'", freed);
}

/* A real adapter through the set: loaded, pinned, listed with its bytes. */
static void test_set_with_loaded_adapters(void)
{
    model_config c;
    NEED_CFG("tiny-qwen3", &c);
    lora_set *s;
    CHECK_OK(lora_set_new(1, &s));
    char dir[600], ev[LORA_NAME_MAX];
    lora_adapter *a, *b;
    adapter_dir("tiny-qwen3-r8-attn-rslora", dir, sizeof dir);
    CHECK_OK(lora_load_peft(dir, &c, 64, &a));
    adapter_dir("tiny-qwen3-r64-all", dir, sizeof dir);
    CHECK_OK(lora_load_peft(dir, &c, 64, &b));
    const uint64_t bytes_b = b->bytes;
    CHECK_OK(lora_set_add(s, a, NULL, 1, 0, ev, sizeof ev, NULL));
    CHECK_OK(lora_set_add(s, b, "all", 2, 0, ev, sizeof ev, NULL));
    CHECK(!strcmp(ev, "tiny-qwen3-r8-attn-rslora"), "evicted '%s'", ev);
    lora_info info;
    int32_t n;
    CHECK_OK(lora_set_list(s, &info, 1, &n));
    CHECK(n == 1 && !strcmp(info.name, "all") && info.rank == 64 && info.bytes == bytes_b && info.version == 2,
          "listing: %s rank %d", info.name, info.rank);
    lora_set_free(s);
}

/* The whole of path (malloc'd), *n its bytes; NULL if unreadable. */
static uint8_t *slurp(const char *path, size_t *n)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *b = len > 0 ? malloc((size_t)len) : NULL;
    if (b && fread(b, 1, (size_t)len, f) != (size_t)len) {
        free(b);
        b = NULL;
    }
    fclose(f);
    *n = b ? (size_t)len : 0;
    return b;
}

/* A pushed adapter (the two files' bytes in memory) loads to the same adapter as its folder, byte for
   byte, and is refused for what the folder would be refused for. */
static void test_load_from_memory(void)
{
    model_config c;
    NEED_CFG("tiny-qwen3", &c);
    char dir[600], path[900];
    adapter_dir("tiny-qwen3-r64-all", dir, sizeof dir);
    size_t nc, ns;
    snprintf(path, sizeof path, "%s/adapter_config.json", dir);
    uint8_t *cfg = slurp(path, &nc);
    snprintf(path, sizeof path, "%s/adapter_model.safetensors", dir);
    uint8_t *st = slurp(path, &ns);
    CHECK(cfg && st, "cannot read %.200s", dir);
    lora_adapter *a, *b;
    CHECK_OK(lora_load_peft(dir, &c, 64, &a));
    CHECK_OK(lora_load_peft_mem("pushed", (const char *)cfg, nc, st, ns, &c, 64, &b));
    CHECK(!strcmp(b->name, "pushed") && a->rank == b->rank && a->scale == b->scale && a->n_pairs == b->n_pairs &&
              a->bytes == b->bytes,
          "the in-memory adapter differs");
    for (int32_t l = 0; l < c.n_layers; l++)
        for (int m = 0; m < LORA_N_MODULES; m++) {
            const lora_pair *pa = lora_pair_at(a, l, (lora_module)m), *pb = lora_pair_at(b, l, (lora_module)m);
            const size_t na = pa->a ? (size_t)a->rank * a->in[m] * st_dtype_size(pa->a_dtype) : 0;
            const size_t nb = pa->b ? (size_t)a->out[m] * a->rank * st_dtype_size(pa->b_dtype) : 0;
            CHECK((pa->a == NULL) == (pb->a == NULL) && (!na || !memcmp(pa->a, pb->a, na)) &&
                      (!nb || !memcmp(pa->b, pb->b, nb)),
                  "layer %d %s differs", l, lora_module_name((lora_module)m));
        }
    lora_free(a);
    lora_free(b);
    free(st);
    /* The bytes are copied out: the buffer may go. Refusals: a rank over the limit, truncated tensors,
       a corrupt config. */
    st = slurp(path, &ns);
    int rc = lora_load_peft_mem("pushed", (const char *)cfg, nc, st, ns, &c, 16, &b);
    CHECK(rc == RD_ERANGE && b == NULL && strstr(rd_errmsg(), "'pushed'"), "rc %d: %s", rc, rd_errmsg());
    rc = lora_load_peft_mem("pushed", (const char *)cfg, nc, st, ns / 2, &c, 64, &b);
    CHECK(rc == RD_EFORMAT && strstr(rd_errmsg(), "adapter_model.safetensors"), "rc %d: %s", rc, rd_errmsg());
    rc = lora_load_peft_mem("pushed", "{\"r\": 8,", 8, st, ns, &c, 64, &b);
    CHECK(rc == RD_EFORMAT && strstr(rd_errmsg(), "not valid JSON"), "rc %d: %s", rc, rd_errmsg());
    free(cfg);
    free(st);
}

static void ensure_testdata(void)
{
    if (access("tests/gen_testdata.sh", X_OK) == 0) {
        char cmd[600];
        snprintf(cmd, sizeof cmd, "tests/gen_testdata.sh '%s' >/dev/null", testdata());
        if (system(cmd) != 0)
            fprintf(stderr, "test_lora: %s failed\n", cmd);
    }
}

int main(void)
{
    ensure_testdata();
    RUN(test_generated_adapters_load);
    RUN(test_data_is_the_files_and_owned);
    RUN(test_generated_refusals);
    RUN(test_config_variants);
    RUN(test_file_refusals);
    RUN(test_set_lru_eviction);
    RUN(test_set_pins);
    RUN(test_set_names);
    RUN(test_set_replace_retires);
    RUN(test_set_with_loaded_adapters);
    RUN(test_load_from_memory);
    TEST_EXIT();
}
