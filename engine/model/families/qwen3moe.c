/* qwen3moe.c - Qwen3-MoE (Qwen3-30B-A3B, 235B-A22B): Qwen3's attention (an
 * explicit head_dim, per-head q/k RMSNorms, NEOX RoPE, no biases) and in
 * every layer a mixture-of-experts FFN: a router linear [n_experts][dim]
 * whose fp32 logits go through a softmax, the top k experts (ties to the
 * lower id), their weights renormalized to sum 1 where norm_topk_prob says
 * so, and k SwiGLU experts of intermediate size moe_intermediate_size. No
 * shared expert.
 *
 * GGUF (llama.cpp's converter): the router is blk.N.ffn_gate_inp.weight and
 * each of gate, up and down one 3-D tensor holding every expert
 * (ffn_{gate,up,down}_exps); llama.cpp always renormalizes the top k for
 * this architecture. HF: mlp.gate.weight and mlp.experts.E.{gate,up,down}_proj. */
#include <cjson/cJSON.h>
#include <math.h>

#include "base/err.h"
#include "engine/format/gguf.h"
#include "engine/model/arch.h"
#include "engine/model/model.h"
#include "engine/model/runner.h"

static const arch_tensor TENSORS[] = {
    {"model.embed_tokens.weight", "token_embd.weight", AG_EMBED, AD_VOCAB, AD_HIDDEN, 0},
    {"model.layers.%d.self_attn.q_proj.weight", "blk.%d.attn_q.weight", AG_QKV, AD_Q, AD_HIDDEN, 0},
    {"model.layers.%d.self_attn.k_proj.weight", "blk.%d.attn_k.weight", AG_QKV, AD_KV, AD_HIDDEN, 0},
    {"model.layers.%d.self_attn.v_proj.weight", "blk.%d.attn_v.weight", AG_QKV, AD_KV, AD_HIDDEN, 0},
    {"model.layers.%d.self_attn.q_norm.weight", "blk.%d.attn_q_norm.weight", AG_Q_NORM, AD_ONE, AD_HEAD, 0},
    {"model.layers.%d.self_attn.k_norm.weight", "blk.%d.attn_k_norm.weight", AG_K_NORM, AD_ONE, AD_HEAD, 0},
    {"model.layers.%d.self_attn.o_proj.weight", "blk.%d.attn_output.weight", AG_O, AD_HIDDEN, AD_Q, 0},
    {"model.layers.%d.mlp.gate.weight", "blk.%d.ffn_gate_inp.weight", AG_ROUTER, AD_EXPERTS, AD_HIDDEN, 0},
    {"model.layers.%d.mlp.experts.%d.gate_proj.weight", "blk.%d.ffn_gate_exps.weight", AG_EXP_GATE_UP,
     AD_EXPERT_FFN, AD_HIDDEN, AT_EXPERT},
    {"model.layers.%d.mlp.experts.%d.up_proj.weight", "blk.%d.ffn_up_exps.weight", AG_EXP_GATE_UP, AD_EXPERT_FFN,
     AD_HIDDEN, AT_EXPERT},
    {"model.layers.%d.mlp.experts.%d.down_proj.weight", "blk.%d.ffn_down_exps.weight", AG_EXP_DOWN, AD_HIDDEN,
     AD_EXPERT_FFN, AT_EXPERT},
    {"model.layers.%d.input_layernorm.weight", "blk.%d.attn_norm.weight", AG_ATTN_NORM, AD_ONE, AD_HIDDEN, 0},
    {"model.layers.%d.post_attention_layernorm.weight", "blk.%d.ffn_norm.weight", AG_FFN_NORM, AD_ONE, AD_HIDDEN, 0},
    {"model.norm.weight", "output_norm.weight", AG_OUT_NORM, AD_ONE, AD_HIDDEN, 0},
    {"lm_head.weight", "output.weight", AG_LM_HEAD, AD_VOCAB, AD_HIDDEN, AT_UNTIED},
};

/* The MoE shape both sources end in. */
static int check_moe(model_config *c, const char *src)
{
    if (c->n_experts < 1 || c->n_experts > RD_MOE_MAX_EXPERTS || c->n_experts_used < 1 ||
        c->n_experts_used > RD_MOE_MAX_K || c->n_experts_used > c->n_experts || c->expert_ffn_dim < 1)
        return rd_fail(RD_EFORMAT, "model: %s: %d experts, %d used per token, expert FFN %d; expected 1 <= used <= "
                       "experts <= %d, used <= %d, FFN >= 1", src, c->n_experts, c->n_experts_used,
                       c->expert_ffn_dim, RD_MOE_MAX_EXPERTS, RD_MOE_MAX_K);
    return 0;
}

static int gguf_u32(const gguf_file *g, const char *key, int32_t *v)
{
    uint32_t u;
    if (gguf_get_u32(g, key, &u) || u > (1u << 30))
        return rd_fail(RD_EFORMAT, "model: %s missing or not an integer", key);
    *v = (int32_t)u;
    return 0;
}

static int check_gguf(const void *gf, model_config *c)
{
    const gguf_file *g = gf;
    int rc;
    if ((rc = gguf_u32(g, "qwen3moe.expert_count", &c->n_experts)) ||
        (rc = gguf_u32(g, "qwen3moe.expert_used_count", &c->n_experts_used)) ||
        (rc = gguf_u32(g, "qwen3moe.expert_feed_forward_length", &c->expert_ffn_dim)))
        return rc;
    int32_t shared = 0;
    if (gguf_get_u32(g, "qwen3moe.expert_shared_count", (uint32_t *)&shared) == 0 && shared != 0)
        return rd_fail(RD_ENOTSUP, "model: qwen3moe.expert_shared_count is %d; shared experts are not supported",
                       shared);
    c->moe_norm_topk = 1;
    return check_moe(c, "GGUF");
}

static int hf_int(const cJSON *root, const char *key, int32_t *v)
{
    const cJSON *j = cJSON_GetObjectItemCaseSensitive(root, key);
    if (!cJSON_IsNumber(j) || !(j->valuedouble >= 1) || j->valuedouble > 1e9 ||
        j->valuedouble != floor(j->valuedouble))
        return rd_fail(RD_EFORMAT, "model: config.json: \"%s\" missing or not a positive integer", key);
    *v = (int32_t)j->valuedouble;
    return 0;
}

extern const arch_desc arch_qwen3;

static int check_hf(const void *json, model_config *c)
{
    const cJSON *root = json;
    /* The attention is Qwen3's, and so are its config rules. */
    int rc = arch_qwen3.check_hf(json, c);
    if (rc)
        return rc;
    if ((rc = hf_int(root, "num_experts", &c->n_experts)) ||
        (rc = hf_int(root, "num_experts_per_tok", &c->n_experts_used)) ||
        (rc = hf_int(root, "moe_intermediate_size", &c->expert_ffn_dim)))
        return rc;
    /* Every layer sparse: decoder_sparse_step 1 and no dense-only layers. */
    const cJSON *step = cJSON_GetObjectItemCaseSensitive(root, "decoder_sparse_step");
    if (step && !(cJSON_IsNumber(step) && step->valuedouble == 1))
        return rd_fail(RD_ENOTSUP, "model: config.json: decoder_sparse_step must be 1 (every layer a MoE layer)");
    const cJSON *dense = cJSON_GetObjectItemCaseSensitive(root, "mlp_only_layers");
    if (dense && !cJSON_IsNull(dense) && !(cJSON_IsArray(dense) && cJSON_GetArraySize(dense) == 0))
        return rd_fail(RD_ENOTSUP, "model: config.json: mlp_only_layers must be empty (dense layers inside a MoE "
                                   "model are not supported)");
    const cJSON *shared = cJSON_GetObjectItemCaseSensitive(root, "shared_expert_intermediate_size");
    if (cJSON_IsNumber(shared) && shared->valuedouble != 0)
        return rd_fail(RD_ENOTSUP, "model: config.json: shared_expert_intermediate_size is set; shared experts are "
                                   "not supported");
    /* transformers' Qwen3MoeConfig default is false. */
    c->moe_norm_topk = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(root, "norm_topk_prob"));
    return check_moe(c, "config.json");
}

static void hf_extra(void *json, const model_config *c)
{
    arch_qwen3.hf_extra(json, c);
    cJSON_AddNumberToObject(json, "num_experts", c->n_experts);
    cJSON_AddNumberToObject(json, "num_experts_per_tok", c->n_experts_used);
    cJSON_AddNumberToObject(json, "moe_intermediate_size", c->expert_ffn_dim);
    cJSON_AddBoolToObject(json, "norm_topk_prob", c->moe_norm_topk);
    cJSON_AddNumberToObject(json, "decoder_sparse_step", 1);
    cJSON_AddItemToObject(json, "mlp_only_layers", cJSON_CreateArray());
}

const arch_desc arch_qwen3moe = {
    .name = "qwen3moe",
    .hf_class = "Qwen3MoeForCausalLM",
    .hf_model_type = "qwen3_moe",
    .tensors = TENSORS,
    .n_tensors = sizeof TENSORS / sizeof TENSORS[0],
    .check_hf = check_hf,
    .check_gguf = check_gguf,
    .hf_extra = hf_extra,
    .layer = runner_layer_moe,
};
