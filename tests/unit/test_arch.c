/* test_arch.c - the family tables (engine/model/families/) are consistent: names are
 * well-formed patterns, every tensor resolves back to itself, fused groups
 * tile their buffers exactly, and lookups by GGUF and HF names agree. */
#include "engine/model/arch.h"
#include "base/err.h"
#include "engine/model/model.h"
#include "tests/unit/test.h"

static const char *FAMS[] = {"llama", "qwen2", "qwen3", "qwen3moe", "gemma3"};

/* A Qwen3-4B-like shape: q width (4 x 32) != hidden (96). */
static model_config shape(const char *fam, int tied)
{
    model_config c;
    memset(&c, 0, sizeof c);
    snprintf(c.arch, sizeof c.arch, "%s", fam);
    c.n_layers = 3, c.dim = 96, c.n_heads = 4, c.n_kv_heads = 2, c.head_dim = 32, c.ffn_dim = 160;
    c.vocab = 300, c.max_ctx = 64, c.rope_theta = 10000, c.norm_eps = 1e-6f, c.tied_embeddings = tied;
    if (!strcmp(fam, "qwen3moe"))
        c.n_experts = 12, c.n_experts_used = 3, c.expert_ffn_dim = 48;
    return c;
}

static int count(const char *s, const char *sub)
{
    int n = 0;
    for (const char *p = strstr(s, sub); p; p = strstr(p + 1, sub))
        n++;
    return n;
}

static void test_name_patterns(void)
{
    for (size_t f = 0; f < sizeof FAMS / sizeof FAMS[0]; f++) {
        const arch_desc *a = arch_by_name(FAMS[f], strlen(FAMS[f]));
        CHECK(a && a->layer && a->n_tensors > 0, "%s missing", FAMS[f]);
        CHECK(arch_by_hf(a->hf_class, NULL) == a && arch_by_hf(NULL, a->hf_model_type) == a, "%s by hf", a->name);
        for (int32_t i = 0; i < a->n_tensors; i++) {
            const arch_tensor *t = &a->tensors[i];
            int per = arch_group_per_layer(t->group), ex = (t->flags & AT_EXPERT) != 0;
            /* per-layer: exactly one %d, in the prefix every resolver assumes
             * (an expert's HF name a second one, for the expert) */
            CHECK(count(t->hf, "%") == per + ex && count(t->gguf, "%") == per, "%s: %s / %s", a->name, t->hf, t->gguf);
            CHECK(ex == arch_group_per_expert(t->group), "%s: %s: AT_EXPERT exactly on the experts' groups", a->name,
                  t->hf);
            if (per)
                CHECK(!strncmp(t->hf, "model.layers.%d.", 16) && !strncmp(t->gguf, "blk.%d.", 7), "%s: %s", a->name,
                      t->hf);
            CHECK(arch_group_is_linear(t->group) ? t->rows != AD_ONE : t->rows == AD_ONE, "%s: %s shape", a->name,
                  t->hf);
            for (int32_t j = 0; j < i; j++)
                CHECK(strcmp(t->hf, a->tensors[j].hf) && strcmp(t->gguf, a->tensors[j].gguf), "%s: %s twice",
                      a->name, t->hf);
        }
    }
}

static void test_resolve_round_trip(void)
{
    for (size_t f = 0; f < sizeof FAMS / sizeof FAMS[0]; f++)
        for (int tied = 0; tied < 2; tied++) {
            const arch_desc *a = arch_by_name(FAMS[f], strlen(FAMS[f]));
            model_config c = shape(FAMS[f], tied);
            for (int32_t i = 0; i < a->n_tensors; i++) {
                const arch_tensor *t = &a->tensors[i];
                int per = arch_group_per_layer(t->group);
                for (int32_t l = per ? 0 : -1; l < (per ? c.n_layers : 0); l++)
                    for (int32_t e = 0; e < (per ? arch_group_units(&c, t->group) : 1); e++) {
                        char name[128];
                        arch_hf_name(t, l, e, name, sizeof name);
                        const arch_tensor *got = NULL;
                        int32_t gl = -2, ge = -2;
                        int rc = arch_resolve_hf(a, &c, name, &got, &gl, &ge);
                        if (!arch_tensor_present(&c, t)) {
                            CHECK(rc != 0, "%s: tied model resolves %s", a->name, name);
                            continue;
                        }
                        CHECK(rc == 0 && got == t && gl == l && ge == e, "%s: %s resolves to %s layer %d expert %d",
                              a->name, name, got ? got->hf : "-", gl, ge);
                    }
            }
            const arch_tensor *t;
            int32_t l, e;
            CHECK(arch_resolve_hf(a, &c, "model.layers.3.input_layernorm.weight", &t, &l, &e) != 0,
                  "layer past the end");
            CHECK(arch_resolve_hf(a, &c, "model.layers.01.input_layernorm.weight", &t, &l, &e) != 0, "non-canonical");
            CHECK(arch_resolve_hf(a, &c, "model.layers.-1.input_layernorm.weight", &t, &l, &e) != 0, "negative layer");
            CHECK(arch_resolve_hf(a, &c, "model.layers.0.self_attn.q_proj.weightx", &t, &l, &e) != 0, "suffix");
            if (c.n_experts) {
                CHECK(arch_resolve_hf(a, &c, "model.layers.0.mlp.experts.12.up_proj.weight", &t, &l, &e) != 0,
                      "expert past the end");
                CHECK(arch_resolve_hf(a, &c, "model.layers.0.mlp.experts.03.up_proj.weight", &t, &l, &e) != 0,
                      "non-canonical expert");
                CHECK(arch_resolve_hf(a, &c, "model.layers.0.mlp.experts.x.up_proj.weight", &t, &l, &e) != 0,
                      "no expert number");
                CHECK(arch_resolve_hf(a, &c, "model.layers.2.mlp.experts.11.down_proj.weight", &t, &l, &e) == 0 &&
                          l == 2 && e == 11 && t->group == AG_EXP_DOWN, "the last expert");
            }
        }
}

/* The members of each group tile it: offsets are contiguous from 0 and end
 * at the group's size. */
static void test_groups_tile(void)
{
    for (size_t f = 0; f < sizeof FAMS / sizeof FAMS[0]; f++) {
        const arch_desc *a = arch_by_name(FAMS[f], strlen(FAMS[f]));
        model_config c = shape(FAMS[f], 0);
        for (int g = 0; g < AG_COUNT; g++) {
            int64_t rows, cols, at = 0;
            arch_group_shape(a, &c, (arch_group)g, &rows, &cols);
            for (int32_t i = 0; i < a->n_tensors; i++) {
                const arch_tensor *t = &a->tensors[i];
                if (t->group != (arch_group)g)
                    continue;
                CHECK(arch_tensor_row0(a, &c, t) == at, "%s: %s starts at %lld, expected %lld", a->name, t->hf,
                      (long long)arch_tensor_row0(a, &c, t), (long long)at);
                if (arch_group_is_linear(t->group)) {
                    CHECK(arch_dim_value(&c, t->cols) == cols, "%s: %s cols", a->name, t->hf);
                    at += arch_dim_value(&c, t->rows);
                } else {
                    at += arch_dim_value(&c, t->cols);
                }
            }
            CHECK(at == (arch_group_is_linear((arch_group)g) ? rows : cols), "%s: group %d size", a->name, g);
        }
        int64_t rows, cols;
        arch_group_shape(a, &c, AG_QKV, &rows, &cols);
        CHECK(rows == (4 + 2 * 2) * 32 && cols == 96, "%s: qkv %lld x %lld", a->name, (long long)rows,
              (long long)cols);
        arch_group_shape(a, &c, AG_O, &rows, &cols);
        CHECK(rows == 96 && cols == 128, "%s: o is [hidden][q width]", a->name);
    }
    /* what differs between the families */
    model_config c = shape("qwen2", 0);
    int64_t r, k;
    arch_group_shape(arch_by_name("qwen2", 5), &c, AG_QKV_BIAS, &r, &k);
    CHECK(r == 1 && k == (4 + 2 * 2) * 32, "qwen2 bias %lld", (long long)k);
    arch_group_shape(arch_by_name("llama", 5), &c, AG_QKV_BIAS, &r, &k);
    CHECK(r == 0, "llama has no bias");
    arch_group_shape(arch_by_name("qwen3", 5), &c, AG_Q_NORM, &r, &k);
    CHECK(r == 1 && k == 32, "qwen3 q_norm over head_dim");
    arch_group_shape(arch_by_name("qwen2", 5), &c, AG_Q_NORM, &r, &k);
    CHECK(r == 0, "qwen2 has no q_norm");
}

static void test_unknown_family(void)
{
    CHECK(arch_by_name("gemma2", 6) == NULL && arch_by_name("llam", 4) == NULL, "lookup");
    CHECK(arch_by_hf("MistralForCausalLM", NULL) == NULL, "hf lookup");
    model_config c = shape("mamba", 0);
    model *m = NULL;
    CHECK(model_build(&c, NULL, NULL, NULL, &m) == RD_ENOTSUP && strstr(rd_errmsg(), "mamba") && !m, "%s",
          rd_errmsg());
}

int main(void)
{
    RUN(test_name_patterns);
    RUN(test_resolve_round_trip);
    RUN(test_groups_tile);
    RUN(test_unknown_family);
    TEST_EXIT();
}
