/* gemma3.c - Gemma 3 (text): google/gemma-3-270m .. 27b.
 *
 * Differs from Llama in every sublayer: RMSNorms weigh by (1 + w) and wrap
 * both sublayers (input and post-attention, pre- and post-FFN), q and k are
 * normed per head before RoPE, the FFN is GELU-tanh gated, embeddings are
 * scaled by sqrt(hidden), and 5 of every 6 layers attend through a sliding
 * window with their own RoPE base (10,000; the global layers use
 * rope_theta, with the scaling where there is one). The LM head is tied.
 *
 * llama.cpp's converter stores every norm as 1 + w (AT_NORM_1P: the GGUF
 * source subtracts 1), and its GGUF has no keys for the layer pattern (6),
 * the local base (10,000) or the attention scale: those are llama.cpp's
 * constants, repeated here. */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "engine/model/arch.h"
#include "base/err.h"
#include "engine/format/gguf.h"
#include "engine/model/model.h"
#include "engine/model/runner.h"

static const arch_tensor TENSORS[] = {
    {"model.embed_tokens.weight", "token_embd.weight", AG_EMBED, AD_VOCAB, AD_HIDDEN, 0},
    {"model.layers.%d.input_layernorm.weight", "blk.%d.attn_norm.weight", AG_ATTN_NORM, AD_ONE, AD_HIDDEN, AT_NORM_1P},
    {"model.layers.%d.self_attn.q_proj.weight", "blk.%d.attn_q.weight", AG_QKV, AD_Q, AD_HIDDEN, 0},
    {"model.layers.%d.self_attn.k_proj.weight", "blk.%d.attn_k.weight", AG_QKV, AD_KV, AD_HIDDEN, 0},
    {"model.layers.%d.self_attn.v_proj.weight", "blk.%d.attn_v.weight", AG_QKV, AD_KV, AD_HIDDEN, 0},
    {"model.layers.%d.self_attn.q_norm.weight", "blk.%d.attn_q_norm.weight", AG_Q_NORM, AD_ONE, AD_HEAD, AT_NORM_1P},
    {"model.layers.%d.self_attn.k_norm.weight", "blk.%d.attn_k_norm.weight", AG_K_NORM, AD_ONE, AD_HEAD, AT_NORM_1P},
    {"model.layers.%d.self_attn.o_proj.weight", "blk.%d.attn_output.weight", AG_O, AD_HIDDEN, AD_Q, 0},
    {"model.layers.%d.post_attention_layernorm.weight", "blk.%d.post_attention_norm.weight", AG_POST_ATTN_NORM, AD_ONE,
     AD_HIDDEN, AT_NORM_1P},
    {"model.layers.%d.pre_feedforward_layernorm.weight", "blk.%d.ffn_norm.weight", AG_FFN_NORM, AD_ONE, AD_HIDDEN,
     AT_NORM_1P},
    {"model.layers.%d.mlp.gate_proj.weight", "blk.%d.ffn_gate.weight", AG_GATE_UP, AD_FFN, AD_HIDDEN, 0},
    {"model.layers.%d.mlp.up_proj.weight", "blk.%d.ffn_up.weight", AG_GATE_UP, AD_FFN, AD_HIDDEN, 0},
    {"model.layers.%d.mlp.down_proj.weight", "blk.%d.ffn_down.weight", AG_DOWN, AD_HIDDEN, AD_FFN, 0},
    {"model.layers.%d.post_feedforward_layernorm.weight", "blk.%d.post_ffw_norm.weight", AG_POST_FFN_NORM, AD_ONE,
     AD_HIDDEN, AT_NORM_1P},
    {"model.norm.weight", "output_norm.weight", AG_OUT_NORM, AD_ONE, AD_HIDDEN, AT_NORM_1P},
};

#define GEMMA3_PERIOD 6            /* layer l is global when l % 6 == 5 (llama.cpp, HF's sliding_window_pattern) */
#define GEMMA3_LOCAL_THETA 10000.0f

/* What every Gemma 3 shares, then the window: 0 is refused (it would make
 * the local layers see nothing). */
static int finish(model_config *c, int64_t window, const char *where)
{
    if (window <= 0 || window > (1 << 24))
        return rd_fail(RD_EFORMAT, "model: %s is %lld; expected a positive sliding window (tokens)", where,
                       (long long)window);
    c->sliding_window = (int32_t)window;
    c->embed_scale = sqrtf((float)c->dim); /* in fp32, as llama.cpp (HF rounds it to the weights' dtype first) */
    if (!c->tied_embeddings)
        return rd_fail(RD_ENOTSUP, "model: a Gemma 3 with a separate output.weight / lm_head.weight; the family "
                                   "ties its LM head to the embedding");
    return 0;
}

static int check_gguf(const void *gf, model_config *c)
{
    const gguf_file *g = gf;
    uint32_t w;
    int rc = gguf_get_u32(g, "gemma3.attention.sliding_window", &w);
    if (rc)
        return rd_fail(RD_EFORMAT, "model: gemma3.attention.sliding_window missing or not an integer");
    /* Soft-capping is not implemented: refuse a file that asks for it. */
    static const char *caps[] = {"gemma3.attn_logit_softcapping", "gemma3.final_logit_softcapping"};
    for (int i = 0; i < 2; i++) {
        float cap = 0.0f;
        if (gguf_get_f32(g, caps[i], &cap) == 0 && cap != 0.0f)
            return rd_fail(RD_ENOTSUP, "model: %s is %g; logit soft-capping is not supported", caps[i], cap);
    }
    c->swa_period = GEMMA3_PERIOD;
    c->rope_local_theta = GEMMA3_LOCAL_THETA;
    /* llama.cpp: 1/sqrt(head_dim), except the 27B (62 layers): 1/sqrt(hidden / heads). */
    c->attn_scalar = c->n_layers == 62 ? (float)c->dim / (float)c->n_heads : (float)c->head_dim;
    return finish(c, w, "gemma3.attention.sliding_window");
}

static double num(const cJSON *o, const char *key, double dflt)
{
    const cJSON *j = cJSON_GetObjectItemCaseSensitive(o, key);
    return cJSON_IsNumber(j) ? j->valuedouble : dflt;
}

static int check_hf(const void *json, model_config *c)
{
    const cJSON *root = json;
    int rc = arch_hf_check_str(json, "hidden_activation", "gelu_pytorch_tanh", "GELU-tanh gated FFN");
    if (rc)
        return rc;
    static const char *caps[] = {"attn_logit_softcapping", "final_logit_softcapping"};
    for (int i = 0; i < 2; i++) {
        const cJSON *j = cJSON_GetObjectItemCaseSensitive(root, caps[i]);
        if (j && !cJSON_IsNull(j))
            return rd_fail(RD_ENOTSUP, "model: config.json: %s is set; logit soft-capping is not supported "
                                       "(expected null)", caps[i]);
    }
    /* The layer pattern: sliding_window_pattern, or layer_types listing it. */
    int32_t period = (int32_t)num(root, "sliding_window_pattern", GEMMA3_PERIOD);
    const cJSON *types = cJSON_GetObjectItemCaseSensitive(root, "layer_types");
    if (cJSON_IsArray(types)) {
        int32_t i = 0, first_full = -1;
        const cJSON *t;
        cJSON_ArrayForEach(t, types)
        {
            if (first_full < 0 && cJSON_IsString(t) && !strcmp(t->valuestring, "full_attention"))
                first_full = i;
            i++;
        }
        period = first_full + 1;
        if (i != c->n_layers || period < 1)
            return rd_fail(RD_EFORMAT, "model: config.json: layer_types has %d entries and no full_attention; "
                           "expected %d", i, c->n_layers);
        i = 0;
        cJSON_ArrayForEach(t, types)
        {
            const char *want = i % period == period - 1 ? "full_attention" : "sliding_attention";
            if (!cJSON_IsString(t) || strcmp(t->valuestring, want))
                return rd_fail(RD_ENOTSUP, "model: config.json: layer_types[%d] is not \"%s\"; only a repeating "
                               "pattern of sliding layers then one full layer is supported", i, want);
            i++;
        }
    }
    if (period < 1 || period > 1024)
        return rd_fail(RD_EFORMAT, "model: config.json: sliding_window_pattern %d; expected 1..1024", period);
    c->swa_period = period;
    c->rope_local_theta = (float)num(root, "rope_local_base_freq", GEMMA3_LOCAL_THETA);
    c->attn_scalar = (float)num(root, "query_pre_attn_scalar", 256);
    if (!(c->rope_local_theta > 0) || !(c->attn_scalar > 0))
        return rd_fail(RD_EFORMAT, "model: config.json: rope_local_base_freq %g / query_pre_attn_scalar %g must be "
                       "positive", c->rope_local_theta, c->attn_scalar);
    const cJSON *tie = cJSON_GetObjectItemCaseSensitive(root, "tie_word_embeddings");
    if (!tie || cJSON_IsNull(tie))
        c->tied_embeddings = 1; /* Gemma's default */
    const cJSON *w = cJSON_GetObjectItemCaseSensitive(root, "sliding_window");
    return finish(c, cJSON_IsNumber(w) ? (int64_t)w->valuedouble : 0, "config.json sliding_window");
}

static void hf_extra(void *json, const model_config *c)
{
    cJSON_AddStringToObject(json, "hidden_activation", "gelu_pytorch_tanh");
    cJSON_AddNumberToObject(json, "sliding_window", c->sliding_window);
    cJSON_AddNumberToObject(json, "sliding_window_pattern", c->swa_period);
    cJSON *types = cJSON_AddArrayToObject(json, "layer_types");
    for (int32_t l = 0; l < c->n_layers; l++)
        cJSON_AddItemToArray(types, cJSON_CreateString(arch_layer_is_local(c, l) ? "sliding_attention"
                                                                                  : "full_attention"));
    cJSON_AddNumberToObject(json, "rope_local_base_freq", (double)c->rope_local_theta);
    cJSON_AddNumberToObject(json, "query_pre_attn_scalar", (double)c->attn_scalar);
    cJSON_AddNullToObject(json, "attn_logit_softcapping");
    cJSON_AddNullToObject(json, "final_logit_softcapping");
}

const arch_desc arch_gemma3 = {
    .name = "gemma3",
    .hf_class = "Gemma3ForCausalLM",
    .hf_model_type = "gemma3_text",
    .tensors = TENSORS,
    .n_tensors = sizeof TENSORS / sizeof TENSORS[0],
    .check_hf = check_hf,
    .check_gguf = check_gguf,
    .hf_extra = hf_extra,
    .layer = runner_layer_gemma3,
    .norm_offset = 1.0f,
};
