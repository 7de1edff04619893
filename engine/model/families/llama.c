/* llama.c - the Llama family: Llama 2/3.x, SmolLM2, and every model
 * llama.cpp converts as "llama". Pre-norm decoder, SwiGLU, no biases. The
 * GGUF converter interleaves Q/K rows per head for llama.cpp's NORM RoPE;
 * the loader undoes it (AT_PERMUTE_*), so weights are in HF's rotate-half
 * order. Llama 3.x RoPE scaling is read by model.c / model_hf.c (it is not
 * a tensor of the table: rope_freqs.weight becomes the config's divisors). */
#include <cjson/cJSON.h>

#include "engine/model/arch.h"
#include "base/err.h"
#include "engine/model/model.h"
#include "engine/model/runner.h"

static const arch_tensor TENSORS[] = {
    {"model.embed_tokens.weight", "token_embd.weight", AG_EMBED, AD_VOCAB, AD_HIDDEN, 0},
    {"model.layers.%d.self_attn.q_proj.weight", "blk.%d.attn_q.weight", AG_QKV, AD_Q, AD_HIDDEN, AT_PERMUTE_Q},
    {"model.layers.%d.self_attn.k_proj.weight", "blk.%d.attn_k.weight", AG_QKV, AD_KV, AD_HIDDEN, AT_PERMUTE_K},
    {"model.layers.%d.self_attn.v_proj.weight", "blk.%d.attn_v.weight", AG_QKV, AD_KV, AD_HIDDEN, 0},
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
    const cJSON *root = json;
    if (cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(root, "attention_bias")) ||
        cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(root, "mlp_bias")))
        return rd_fail(RD_ENOTSUP, "model: config.json: attention_bias/mlp_bias are true; the llama family "
                                   "here has no biases (expected false)");
    return 0;
}

static void hf_extra(void *json, const model_config *c)
{
    cJSON_AddStringToObject(json, "hidden_act", "silu");
    cJSON_AddBoolToObject(json, "attention_bias", 0);
    cJSON_AddBoolToObject(json, "mlp_bias", 0);
}

const arch_desc arch_llama = {
    .name = "llama",
    .hf_class = "LlamaForCausalLM",
    .hf_model_type = "llama",
    .tensors = TENSORS,
    .n_tensors = sizeof TENSORS / sizeof TENSORS[0],
    .check_hf = check_hf,
    .hf_extra = hf_extra,
    .layer = runner_layer_decoder,
};
