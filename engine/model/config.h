/* config.h - a decoder's hyper-parameters (model_config), as the family
 * tables (arch.h) and the model (model.h) both read them. Its own header so
 * that the tables need not see the model, nor the model the tables' inside. */
#ifndef RD_MODEL_CONFIG_H
#define RD_MODEL_CONFIG_H

#include <stdint.h>

#define MODEL_MAX_HEAD_DIM 256

/* How RoPE angles are scaled: angle(pos, i) = pos * theta^(-2i/hd) / rope_div[i]. */
typedef enum {
    ROPE_PLAIN = 0,             /* rope_div all 1 */
    ROPE_LINEAR = 1,            /* rope_div all rope_factor */
    ROPE_LLAMA3 = 2,            /* Llama 3.x: rope_div from (factor, low, high, orig) */
    ROPE_FREQS = 3,             /* divisors given as they are (a GGUF rope_freqs.weight), parameters unknown */
} model_rope_type;

typedef struct model_config {
    char arch[32];              /* family (arch_desc.name): "llama", "qwen2", "qwen3" */
    int32_t n_layers;
    int32_t dim;                /* hidden size */
    int32_t n_heads;
    int32_t n_kv_heads;
    int32_t head_dim;           /* explicit (Qwen3) or dim / n_heads; n_heads * head_dim need not be dim */
    int32_t ffn_dim;            /* SwiGLU intermediate size */
    int32_t vocab;
    int32_t max_ctx;            /* tokens (context_length / max_position_embeddings) */
    float rope_theta;
    float norm_eps;
    int tied_embeddings;        /* 1: lm_head is token_embd */
    int32_t rope_type;          /* model_rope_type */
    float rope_factor;          /* ROPE_LINEAR, ROPE_LLAMA3: factor */
    float rope_low_freq;        /* ROPE_LLAMA3: low_freq_factor */
    float rope_high_freq;       /* ROPE_LLAMA3: high_freq_factor */
    int32_t rope_orig_ctx;      /* ROPE_LLAMA3: original_max_position_embeddings (tokens) */
    float rope_div[MODEL_MAX_HEAD_DIM / 2]; /* [head_dim / 2] angle divisors (all 1 for ROPE_PLAIN) */
    /* Sliding-window attention (Gemma 3): 0 / 0 for none. */
    int32_t sliding_window;     /* tokens a local layer's query sees (itself included) */
    int32_t swa_period;         /* layer l is global when l % swa_period == swa_period - 1, else local */
    float rope_local_theta;     /* RoPE base of the local layers (no scaling) */
    float attn_scalar;          /* q.k is scaled by attn_scalar^-0.5 (Gemma's query_pre_attn_scalar); 0: head_dim */
    float embed_scale;          /* embeddings multiplied by it (Gemma: sqrt(dim)); 0: not scaled */
    /* Mixture of experts (Qwen3-MoE): n_experts 0 for a dense FFN. Every
     * layer's FFN is then n_experts SwiGLU experts behind a softmax router. */
    int32_t n_experts;          /* experts per layer */
    int32_t n_experts_used;     /* k: the experts each token is routed to */
    int32_t expert_ffn_dim;     /* an expert's intermediate size */
    int moe_norm_topk;          /* 1: the k routing weights are divided by their sum */
} model_config;

#endif
