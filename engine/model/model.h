/* model.h - a decoder model: config and weights in the backend.
 *
 * Which tensors a model has, and how they are fused, is its family's table
 * (engine/model/arch.h, engine/model/families/<family>.c). Weights are held in the canonical
 * Hugging Face layout (q_proj rows in rotate-half order); the GGUF loader
 * undoes llama.cpp's Q/K row permutation where the family has one. Q, K and
 * V are stored fused as one linear [(n_heads + 2 n_kv_heads) head_dim][dim]
 * and gate/up as one [2 ffn][dim], so a layer runs 4 GEMMs per step. */
#ifndef RD_MODEL_H
#define RD_MODEL_H

#include <stdint.h>

#include "engine/model/arch.h"
#include "engine/model/config.h"
#include "engine/backend.h"
#include "engine/format/gguf.h"

typedef struct {
    void *qkv;                  /* linear [(nh + 2 nkv) hd][dim] */
    float *post_attn_norm;      /* backend [dim], or NULL (Gemma 3 norms the attention output) */
    float *post_ffn_norm;       /* backend [dim], or NULL (and the FFN output) */
    float *qkv_bias;            /* backend [(nh + 2 nkv) hd], or NULL (Qwen2 has one) */
    void *o;                    /* linear [dim][nh hd] */
    void *gate_up;              /* linear [2 ffn][dim]: gate rows then up rows */
    void *down;                 /* linear [dim][ffn] */
    float *attn_norm;           /* backend [dim] */
    float *ffn_norm;            /* backend [dim] */
    float *q_norm, *k_norm;     /* backend [hd] per-head norms, or NULL (Qwen3 has them) */
    /* Mixture of experts (cfg.n_experts > 0), in place of gate_up / down: */
    void *router;               /* linear [n_experts][dim] */
    void **exp_gate_up;         /* [n_experts] linears [2 expert_ffn][dim]: gate rows then up rows */
    void **exp_down;            /* [n_experts] linears [dim][expert_ffn] */
} model_layer;

typedef struct {
    model_config cfg;
    const arch_desc *arch;      /* the family (cfg.arch) */
    rd_backend *be;             /* not owned */
    void *embed;                /* linear [vocab][dim]; also the LM head when tied */
    void *lm_head;              /* linear [vocab][dim]; == embed when tied */
    float *out_norm;            /* backend [dim] */
    float *rope;                /* backend [max_ctx][hd/2][2] cos, sin */
    float *rope_local;          /* the same at rope_local_theta, or NULL (no local layers) */
    model_layer *layers;        /* [n_layers] */
    int64_t n_params;           /* parameter count (tied counted once) */
    int64_t weights_bytes;      /* backend memory the weights hold (linear_bytes, else 4 per parameter);
                                   set by model_count_bytes at load and after an update swap */
    int64_t weights_bytes_by_type[RD_WEIGHT_TYPES]; /* weights_bytes by ggml_type (norms and other vectors:
                                   GGML_F32), where the backend tells (linear_bytes_by_type), else all 0 */
    uint64_t weights_gen;       /* bumped whenever weight pointers change (an update swap): a
                                   backend that caches them (CUDA graphs) must re-capture */
} model;

/* The model's slot for group g (layer ignored for model-wide groups,
 * expert but for per-expert groups). */
void **model_weight_slot(model *m, arch_group g, int32_t layer, int32_t expert);

/* Fills c->rope_div from c->rope_type and its parameters (not ROPE_FREQS,
 * whose divisors are given). RD_EINVAL names what is out of range. */
int model_rope_divisors(model_config *c);

/* Reads the config from GGUF metadata (general.architecture one of the
 * families, arch_names()). */
int model_config_from_gguf(const gguf_file *g, model_config *cfg);

/* Loads weights from an open GGUF file into backend be. */
int model_load_gguf(const gguf_file *g, rd_backend *be, model **out);
void model_free(model *m);
/* Frees the weights in the backend (memory release); the config stays, and
 * nothing may run the model until model_adopt gives it weights again. */
void model_drop_weights(model *m);
/* Moves src's weights into m (freeing m's, if any, and src itself), so
 * every holder of m sees them; RD_EINVAL (src untouched) when src's shape
 * differs from m's. Bumps weights_gen. */
int model_adopt(model *m, model *src);

/* Bytes of K+V per token across all layers at fp32. */
int64_t model_kv_bytes_per_token(const model_config *c);


/* ---- Shared model construction and the Hugging Face source/export (model_hf.c). */
#include "engine/format/safetensors.h"

/* Fills dst with the fp32 tensor of HF name hf_name in HF layout, checking it
 * is [rows][cols] (rows == 1: a vector of cols). */
typedef int (*model_fetch_fn)(void *ctx, const char *hf_name, int64_t rows, int64_t cols, float *dst);

/* Builds a model from HF-named fp32 tensors: the one place that decides the
 * fused layout (q|k|v, gate|up), so GGUF and safetensors loads agree bit for bit. */
int model_build(const model_config *cfg, rd_backend *be, model_fetch_fn fetch, void *ctx, model **out);

/* One weight's file bytes: writes type (ggml_type) and *nbytes bytes
 * (rows x ggml_row_bytes(type, cols), row-major, HF row order) into dst (cap
 * bytes). Returns 1 when the tensor does not come raw (fetch it as fp32). */
typedef int (*model_fetch_raw_fn)(void *ctx, const char *hf_name, int64_t rows, int64_t cols, int32_t *type,
                                  uint8_t *dst, size_t cap, size_t *nbytes);
/* model_build where the backend can take linear weights in file dtypes
 * (ops.linear_load_q): linear groups come through fetch_raw, the rest (and
 * any group a member of which does not come raw) through fetch. */
int model_build_raw(const model_config *cfg, rd_backend *be, model_fetch_fn fetch, model_fetch_raw_fn fetch_raw,
                    void *ctx, model **out);
/* Sums what the backend holds for the weights into m->weights_bytes. */
void model_count_bytes(model *m);

/* Config from an HF config.json text (a family's class, arch_by_hf).
 * RD_ENOTSUP names what is not supported (an architecture, a rope_scaling
 * type, a flag the family refuses). */
int model_config_from_hf_json(const char *json, model_config *cfg);
/* The config as HF config.json text (malloc'd). */
int model_config_to_hf_json(const model_config *cfg, const char *torch_dtype, char **out);

/* Loads from an HF folder (config.json + *.safetensors, possibly sharded) or
 * a .safetensors file with config.json next to it. */
int model_load_hf(const char *path, rd_backend *be, model **out);

/* One weight as an HF tensor in memory (export to a learner-side format). */
typedef struct {
    char name[96];
    st_dtype dtype;             /* ST_F32, ST_F16 or ST_BF16 */
    int n_dims;                 /* 1 or 2 */
    int64_t shape[2];
    size_t nbytes;
    uint8_t *data;              /* [nbytes], owned */
} model_hf_tensor;

/* Every weight of the model as HF tensors in dtype (*n of them, HF names and
 * layout): what a learner would push. Free with model_hf_tensors_free. */
int model_export_mem(const model *m, st_dtype dtype, model_hf_tensor **out, size_t *n);
void model_hf_tensors_free(model_hf_tensor *t, size_t n);

/* Writes dir/config.json and dir/model.safetensors (HF names and layout,
 * dtype ST_F32 / ST_F16 / ST_BF16) from the weights in the backend. */
int model_export_hf(const model *m, const char *dir, st_dtype dtype);

#endif
