/* qwen2.c - Qwen2 / Qwen2.5 / DeepSeek-R1-Distill-Qwen: the Llama layer plus
 * a bias on q, k and v (none on o; hard-wired in HF, no config flag). GGUF
 * keeps Q/K rows as HF has them (llama.cpp uses NEOX RoPE for Qwen), so
 * nothing is un-permuted. Sliding-window attention is off in every released
 * checkpoint (use_sliding_window false) and refused when asked for. */
#include <cjson/cJSON.h>

#include "engine/model/arch.h"
#include "base/err.h"
#include "engine/model/model.h"
#include "engine/model/runner.h"

static const arch_tensor TENSORS[] = {
    {"model.embed_tokens.weight", "token_embd.weight", AG_EMBED, AD_VOCAB, AD_HIDDEN, 0},
    {"model.layers.%d.self_attn.q_proj.weight", "blk.%d.attn_q.weight", AG_QKV, AD_Q, AD_HIDDEN, 0},
    {"model.layers.%d.self_attn.k_proj.weight", "blk.%d.attn_k.weight", AG_QKV, AD_KV, AD_HIDDEN, 0},
    {"model.layers.%d.self_attn.v_proj.weight", "blk.%d.attn_v.weight", AG_QKV, AD_KV, AD_HIDDEN, 0},
    {"model.layers.%d.self_attn.q_proj.bias", "blk.%d.attn_q.bias", AG_QKV_BIAS, AD_ONE, AD_Q, 0},
    {"model.layers.%d.self_attn.k_proj.bias", "blk.%d.attn_k.bias", AG_QKV_BIAS, AD_ONE, AD_KV, 0},
    {"model.layers.%d.self_attn.v_proj.bias", "blk.%d.attn_v.bias", AG_QKV_BIAS, AD_ONE, AD_KV, 0},
    {"model.layers.%d.self_attn.o_proj.weight", "blk.%d.attn_output.weight", AG_O, AD_HIDDEN, AD_Q, 0},
    {"model.layers.%d.mlp.gate_proj.weight", "blk.%d.ffn_gate.weight", AG_GATE_UP, AD_FFN, AD_HIDDEN, 0},
    {"model.layers.%d.mlp.up_proj.weight", "blk.%d.ffn_up.weight", AG_GATE_UP, AD_FFN, AD_HIDDEN, 0},
    {"model.layers.%d.mlp.down_proj.weight", "blk.%d.ffn_down.weight", AG_DOWN, AD_HIDDEN, AD_FFN, 0},
    {"model.layers.%d.input_layernorm.weight", "blk.%d.attn_norm.weight", AG_ATTN_NORM, AD_ONE, AD_HIDDEN, 0},
    {"model.layers.%d.post_attention_layernorm.weight", "blk.%d.ffn_norm.weight", AG_FFN_NORM, AD_ONE, AD_HIDDEN, 0},
    {"model.norm.weight", "output_norm.weight", AG_OUT_NORM, AD_ONE, AD_HIDDEN, 0},
    {"lm_head.weight", "output.weight", AG_LM_HEAD, AD_VOCAB, AD_HIDDEN, AT_UNTIED},
};

static int check_hf(const void *json, model_config *c)
{
    int rc = arch_hf_check_str(json, "hidden_act", "silu", "SwiGLU");
    if (rc)
        return rc;
    if (cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(json, "use_sliding_window")))
        return rd_fail(RD_ENOTSUP, "model: config.json: use_sliding_window is true; sliding-window attention is "
                                   "not supported yet (expected false: full attention)");
    return 0;
}

static void hf_extra(void *json, const model_config *c)
{
    cJSON_AddStringToObject(json, "hidden_act", "silu");
    cJSON_AddBoolToObject(json, "use_sliding_window", 0);
}

const arch_desc arch_qwen2 = {
    .name = "qwen2",
    .hf_class = "Qwen2ForCausalLM",
    .hf_model_type = "qwen2",
    .tensors = TENSORS,
    .n_tensors = sizeof TENSORS / sizeof TENSORS[0],
    .check_hf = check_hf,
    .hf_extra = hf_extra,
    .layer = runner_layer_decoder,
};
