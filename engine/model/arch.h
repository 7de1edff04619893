/* arch.h - a model family as data.
 *
 * Each family (engine/model/families/<name>.c) is one arch_desc: the names it goes by
 * in GGUF and Hugging Face files, how its hyper-parameters are read beyond
 * the keys every decoder shares, its tensor table and its layer recipe.
 * Loading (GGUF, safetensors), freeing, parameter counting, HF export and
 * weight-update name resolution all loop over the table, so adding a family
 * is its own file (plus backend ops where it needs new ones).
 *
 * A tensor fills rows of one backend buffer, its group: fused groups (q|k|v,
 * gate|up, the q|k|v bias) hold their members in table order, so the table
 * also fixes the fused layout. */
#ifndef RD_ARCH_H
#define RD_ARCH_H

#include <stddef.h>
#include <stdint.h>

struct model_config;
struct runner;
struct rd_step_dev;

/* A tensor dimension in terms of the config. */
typedef enum {
    AD_ONE,                     /* 1: the tensor is a vector (rows only) */
    AD_HIDDEN,                  /* dim */
    AD_Q,                       /* n_heads * head_dim */
    AD_KV,                      /* n_kv_heads * head_dim */
    AD_FFN,                     /* ffn_dim */
    AD_VOCAB,                   /* vocab */
    AD_HEAD,                    /* head_dim */
    AD_EXPERTS,                 /* n_experts */
    AD_EXPERT_FFN,              /* expert_ffn_dim */
} arch_dim;

/* The backend buffers a model can hold. Model-wide groups first. */
typedef enum {
    AG_EMBED,                   /* linear [vocab][dim]; also the LM head when tied */
    AG_LM_HEAD,                 /* linear [vocab][dim] */
    AG_OUT_NORM,                /* vector [dim] */
    AG_QKV,                     /* linear [q + 2 kv][dim] */
    AG_QKV_BIAS,                /* vector [q + 2 kv] */
    AG_O,                       /* linear [dim][q] */
    AG_GATE_UP,                 /* linear [2 ffn][dim] */
    AG_DOWN,                    /* linear [dim][ffn] */
    AG_ATTN_NORM,               /* vector [dim] */
    AG_FFN_NORM,                /* vector [dim] */
    AG_Q_NORM,                  /* vector [head_dim] */
    AG_K_NORM,                  /* vector [head_dim] */
    AG_POST_ATTN_NORM,          /* vector [dim] (Gemma 3) */
    AG_POST_FFN_NORM,           /* vector [dim] (Gemma 3) */
    AG_ROUTER,                  /* linear [n_experts][dim] (MoE) */
    AG_EXP_GATE_UP,             /* per expert: linear [2 expert_ffn][dim] */
    AG_EXP_DOWN,                /* per expert: linear [dim][expert_ffn] */
    AG_COUNT
} arch_group;

#define AG_FIRST_LAYER AG_QKV

/* Tensor flags. */
#define AT_PERMUTE_Q 1u         /* GGUF rows interleaved per head for llama.cpp's NORM RoPE (n_heads) */
#define AT_PERMUTE_K 2u         /* the same over n_kv_heads */
#define AT_UNTIED 4u            /* present only when the embeddings are untied */
#define AT_NORM_1P 8u           /* GGUF holds 1 + w (Gemma's norms): the GGUF source subtracts 1 */
/* One tensor per expert (the groups AG_EXP_*): the HF name holds a second
 * "%d", the expert ("model.layers.%d.mlp.experts.%d.up_proj.weight"); GGUF
 * holds all of a layer's experts in one 3-D tensor (ggml ne {cols, rows,
 * n_experts}), expert e's [rows][cols] the e-th slice. */
#define AT_EXPERT 16u

typedef struct {
    const char *hf;             /* HF name; "%d" is the layer: "model.layers.%d.self_attn.q_proj.weight"
                                   (then the expert, AT_EXPERT) */
    const char *gguf;           /* GGUF name: "blk.%d.attn_q.weight" */
    arch_group group;
    arch_dim rows, cols;        /* [rows][cols] in HF layout; rows AD_ONE: a vector of cols */
    unsigned flags;             /* AT_* */
} arch_tensor;

/* Forward pass of one layer over a step's M rows (runner.c's blocks). */
typedef void (*arch_layer_fn)(struct runner *r, const struct rd_step_dev *sd, int32_t M, int32_t layer);

typedef struct arch_desc {
    const char *name;           /* model_config.arch and GGUF general.architecture */
    const char *hf_class;       /* config.json "architectures"[0] */
    const char *hf_model_type;  /* config.json "model_type" */
    const arch_tensor *tensors; /* [n_tensors]; per-layer names contain "%d" */
    int32_t n_tensors;
    /* Family rules on top of the shared keys (NULL: none). json is the
     * parsed config.json (a cJSON *); a failure names the key. */
    int (*check_hf)(const void *json, struct model_config *c);
    int (*check_gguf)(const void *gguf_file, struct model_config *c);
    /* Adds the family's own config.json fields to an export (a cJSON object). */
    void (*hf_extra)(void *json, const struct model_config *c);
    arch_layer_fn layer;
    /* Added to every RMSNorm weight when it is applied: 0, or 1 for Gemma's
     * (1 + w) norms (weights are held as HF's w; GGUF stores 1 + w and the
     * GGUF source subtracts it, AT_NORM_1P). */
    float norm_offset;
} arch_desc;

/* The families, by GGUF architecture or HF class / model_type. NULL: none
 * (arch_registry.c, with the table of families). */
const arch_desc *arch_by_name(const char *name, size_t len);
const arch_desc *arch_by_hf(const char *hf_class, const char *model_type);
/* "llama, qwen2, qwen3, ...": for error messages. */
const char *arch_names(void);

/* The value of a dimension under config c. */
int64_t arch_dim_value(const struct model_config *c, arch_dim d);
/* 1 if layer l attends through the sliding window. */
int arch_layer_is_local(const struct model_config *c, int32_t l);
/* Whether tensor t exists in a model of config c (an untied-only tensor
 * does not when the embeddings are tied). */
int arch_tensor_present(const struct model_config *c, const arch_tensor *t);
/* Tensor t's HF / GGUF name for layer (ignored for model-wide tensors) and
 * expert (ignored but for AT_EXPERT tensors' HF names; GGUF's are 3-D). */
void arch_hf_name(const arch_tensor *t, int32_t layer, int32_t expert, char *out, size_t cap);
void arch_gguf_name(const arch_tensor *t, int32_t layer, char *out, size_t cap);
/* 1 if group g is one per layer. */
int arch_group_per_layer(arch_group g);
/* 1 if group g is one per expert of a layer (AG_EXP_*). */
int arch_group_per_expert(arch_group g);
/* Instances of group g in one layer: n_experts for a per-expert group, else 1. */
int32_t arch_group_units(const struct model_config *c, arch_group g);
/* 1 if group g is a linear (a backend weight handle), 0 a backend vector. */
int arch_group_is_linear(arch_group g);
/* Rows and columns of group g's buffer under the family a (rows 1 for a
 * vector) and the first row of tensor t inside it. 0 rows: the family has
 * no such group. */
void arch_group_shape(const arch_desc *a, const struct model_config *c, arch_group g, int64_t *rows, int64_t *cols);
int64_t arch_tensor_row0(const arch_desc *a, const struct model_config *c, const arch_tensor *t);
/* Resolves an HF name: the tensor, its layer (-1 for model-wide) and its
 * expert (0 but for AT_EXPERT tensors). Numbers must be written canonically
 * ("3", not "03") and be < n_layers (< n_experts); untied-only tensors do
 * not resolve for a tied model. -1 if none. */
int arch_resolve_hf(const arch_desc *a, const struct model_config *c, const char *name, const arch_tensor **t,
                    int32_t *layer, int32_t *expert);

/* Why HF name `name`, which does not resolve, is not a weight of the model
 * although it has one of the family's forms: a layer or expert number out
 * of range or not canonical, or an untied-only tensor of a tied model. 0
 * with a sentence in why; -1 when the name has none of the forms. */
int arch_hf_explain(const arch_desc *a, const struct model_config *c, const char *name, char *why, size_t cap);

/* config.json key (absent is fine) must be the string want, else RD_ENOTSUP
 * naming it (the families' activation checks). */
int arch_hf_check_str(const void *json, const char *key, const char *want, const char *what);

#endif
