/* lora.h - LoRA adapters in PEFT's format, validated against a model, and
 * the set of adapters a daemon holds resident.
 *
 * An adapter adds to a linear y = W x the low-rank term s * B (A x), with
 * A [r][in], B [out][r] and s = alpha / r (rsLoRA: alpha / sqrt(r)); it is
 * kept unmerged, A and B in the dtype the file has them in (F32, F16 or
 * BF16), so that many adapters can share one base model and a row's result
 * does not depend on which others are resident.
 *
 * What a PEFT folder must hold (lora_load_peft):
 *   adapter_config.json   "peft_type": "LORA" (or absent), "r", "lora_alpha",
 *                         "target_modules" (a list: a module whose name is an
 *                         entry or ends in "." + entry; a string: a regex the
 *                         whole module name must match, Python's re.fullmatch;
 *                         or "all-linear"), "use_rslora", and optionally
 *                         "layers_to_transform" (an int or a list) with
 *                         "layers_pattern" null or "layers"; "lora_dropout"
 *                         is ignored (inference).
 *   adapter_model.safetensors
 *                         base_model.model.<module>.lora_A.weight  [r, in]
 *                         base_model.model.<module>.lora_B.weight  [out, r]
 *                         for every module the config selects and no other
 *                         tensor, <module> being the model's HF name
 *                         ("model.layers.3.self_attn.q_proj").
 * Targets: q_proj, k_proj, v_proj, o_proj (self_attn) and gate_proj, up_proj,
 * down_proj (mlp) of every dense family; Qwen3-MoE's attention only.
 * Refused, each by name (RD_ENOTSUP unless said): DoRA (use_dora, or a
 * lora_magnitude_vector tensor), modules_to_save, LoRA on embed_tokens,
 * lm_head, the MoE router or experts, per-module ranks or alphas
 * (rank_pattern, alpha_pattern), bias other than "none", lora_bias,
 * fan_in_fan_out, layer_replication, exclude_modules, target_parameters,
 * trainable_token_indices, QA-LoRA, aLoRA, another peft_type; a rank over
 * max_rank (RD_ERANGE); a target the model does not have, a tensor whose
 * shape does not fit the model, a tensor missing its A or B, an unexpected or
 * repeated tensor, a dtype other than F32/F16/BF16, corrupt JSON
 * (RD_EFORMAT); a missing file (RD_EIO).
 *
 * No threads here: the set is bookkeeping its owner (the engine thread)
 * calls under its own discipline. */
#ifndef RD_LORA_H
#define RD_LORA_H

#include <stddef.h>
#include <stdint.h>

#include "engine/format/safetensors.h"

struct model_config;

#define LORA_NAME_MAX 128       /* bytes of an adapter name, the NUL included */
#define LORA_MAX_RANK 1024      /* the largest max_rank a caller may allow */
#define LORA_MAX_LORAS 256      /* the largest resident set */

/* The linears an adapter may target, in a layer's order. */
typedef enum {
    LORA_Q,                     /* self_attn.q_proj:  in dim,              out n_heads * head_dim */
    LORA_K,                     /* self_attn.k_proj:  in dim,              out n_kv_heads * head_dim */
    LORA_V,                     /* self_attn.v_proj:  in dim,              out n_kv_heads * head_dim */
    LORA_O,                     /* self_attn.o_proj:  in n_heads * head_dim, out dim */
    LORA_GATE,                  /* mlp.gate_proj:     in dim,              out ffn_dim */
    LORA_UP,                    /* mlp.up_proj:       in dim,              out ffn_dim */
    LORA_DOWN,                  /* mlp.down_proj:     in ffn_dim,          out dim */
    LORA_N_MODULES
} lora_module;

/* One module's A and B in one layer. Row-major, little-endian, as in the
 * file; both NULL where the adapter leaves this module of this layer alone. */
typedef struct {
    const void *a;              /* A [rank][in], a_dtype */
    const void *b;              /* B [out][rank], b_dtype */
    st_dtype a_dtype, b_dtype;  /* ST_F32, ST_F16 or ST_BF16 */
} lora_pair;

typedef struct lora_adapter {
    char name[LORA_NAME_MAX];   /* the folder's last component until lora_set_add names it */
    char *path;                 /* the folder it was read from (owned) */
    char arch[32];              /* the family it was checked against (model_config.arch) */
    int32_t rank;               /* r, every module */
    float alpha;                /* lora_alpha */
    int rslora;                 /* 1: use_rslora */
    float scale;                /* alpha / rank, or alpha / sqrt(rank) with rsLoRA */
    int32_t n_layers;           /* the model's */
    int32_t in[LORA_N_MODULES]; /* columns of A per module (0: the family has no such module) */
    int32_t out[LORA_N_MODULES];/* rows of B per module */
    uint32_t modules;           /* bit m set: module m has a pair in at least one layer */
    int32_t n_pairs;            /* (layer, module) pairs present */
    lora_pair *pairs;           /* [n_layers][LORA_N_MODULES] */
    uint64_t bytes;             /* A and B data, as stored (the file's bytes) */
    void *mem;                  /* owns every pair's data; the file is closed after loading, so a
                                   learner may overwrite the folder while the adapter serves */
} lora_adapter;

/* "q_proj", ... ("?" out of range). Inline, as lora_pair_at: the runner (which the families call) reads
 * adapters without calling into the loader, which calls the families' table (tools/check_layers.py). */
static inline const char *lora_module_name(lora_module m)
{
    static const char *const names[LORA_N_MODULES] = {
        "q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj",
    };
    return (unsigned)m < LORA_N_MODULES ? names[m] : "?";
}

/* Reads and checks the PEFT folder dir against the model mc (its family's
 * module names and shapes). max_rank: the largest r accepted, 1 ..
 * LORA_MAX_RANK. On error *out is NULL and rd_errmsg() names the folder and
 * the problem. */
int lora_load_peft(const char *dir, const struct model_config *mc, int32_t max_rank, lora_adapter **out);
/* The same from the two files' bytes in memory (a pushed adapter): config is adapter_config.json's text
 * (config_len bytes, not NUL-terminated), st adapter_model.safetensors' bytes (copied out: the adapter
 * does not keep them). label names it in messages and becomes its default name. */
int lora_load_peft_mem(const char *label, const char *config, size_t config_len, const uint8_t *st, size_t st_size,
                       const struct model_config *mc, int32_t max_rank, lora_adapter **out);
/* An adapter pushed as tensors (PROTOCOL.md §10.15): rank, alpha and rsLoRA as the push says, the targets
 * the modules its tensors name, each of which needs its lora_A and lora_B (PEFT's names, shapes and
 * dtypes, as in the file; t[i].data the bytes, copied out). Every check of lora_load_peft applies. out
 * NULL checks a manifest alone (data may be NULL): 0 when those tensors, once filled, would load. */
int lora_load_tensors(const char *label, int32_t rank, float alpha, int rslora, const st_tensor *t, size_t n,
                      const struct model_config *mc, int32_t max_rank, lora_adapter **out);
void lora_free(lora_adapter *a);

/* The pair of module m in layer l (its a and b NULL when absent). */
static inline const lora_pair *lora_pair_at(const lora_adapter *a, int32_t layer, lora_module m)
{
    if (!a || layer < 0 || layer >= a->n_layers || (unsigned)m >= LORA_N_MODULES)
        return NULL;
    return &a->pairs[(size_t)layer * LORA_N_MODULES + m];
}

/* Converts n values stored as dt (F32, F16, BF16) to fp32: tests, tools
 * and a reference path read A and B through it. */
int lora_to_f32(const void *src, st_dtype dt, size_t n, float *dst);

/* ------------------------------------------------------------------------
 * The resident set: at most max_loras adapters by name, each with the
 * version it was loaded as and a pin count (the sequences using it), in a
 * numbered slot that stays its own while it is resident: the engine keeps
 * the backend's copy of an adapter by slot, and a sequence names its
 * adapter by slot. The set owns its adapters. Pinned adapters are never
 * evicted nor removed. An adapter replaced under its name (a push of a new
 * version) while sequences use it is retired: it keeps its slot, serves
 * the sequences that pinned it, and is freed at its last unpin; new pins
 * get the new one. Slots: 2 * max_loras (resident and retired). */

typedef struct lora_set lora_set;

/* Called as the set frees an adapter (removed, evicted, replaced or retired
 * and unpinned, or at lora_set_free), before lora_free(a), with the slot it
 * held: the owner drops what it keeps for that slot. */
typedef void (*lora_free_fn)(void *ctx, int32_t slot, lora_adapter *a);

/* One adapter as /status lists it; name valid while the adapter is resident. */
typedef struct {
    const char *name;
    uint64_t version;
    int32_t rank;
    uint64_t bytes;             /* lora_adapter.bytes */
    int32_t pins;               /* sequences using it now */
    int32_t slot;
} lora_info;

/* What a pin gives a sequence. */
typedef struct {
    const lora_adapter *a;
    uint64_t version;           /* the version it was added as */
    uint64_t uid;               /* unique to this add (never reused by the set): a replaced adapter's
                                   successor under the same name and version has another */
    int32_t slot;
} lora_pinned;

/* max_loras: 1 .. LORA_MAX_LORAS. */
int lora_set_new(int32_t max_loras, lora_set **out);
/* Frees the set and every adapter in it, pinned or retired (shutdown),
 * calling the free hook for each. */
void lora_set_free(lora_set *s);
void lora_set_on_free(lora_set *s, lora_free_fn fn, void *ctx);
/* Slot numbers are 0 .. lora_set_slots() - 1. */
int32_t lora_set_slots(const lora_set *s);

/* Adds adapter a under name (NULL: a->name; copied into a->name) and
 * version; *slot (may be NULL) gets its slot. A name already resident is
 * RD_EINVAL unless replace, which supersedes it (freed now if unpinned,
 * else retired). A full set first evicts its least recently used adapter
 * with no pins (evicted, if not NULL, gets its name; "" when none was
 * evicted); if every adapter is pinned, or every slot holds a pinned
 * retired one, RD_EBUSY. On success the set owns a; on failure the caller
 * still does. */
int lora_set_add(lora_set *s, lora_adapter *a, const char *name, uint64_t version, int replace, char *evicted,
                 size_t evicted_cap, int32_t *slot);
/* Removes and frees adapter name: RD_ENOENT if it is not resident, RD_EBUSY
 * while it is pinned. */
int lora_set_remove(lora_set *s, const char *name);
/* Looks name up without counting a use (RD_ENOENT if absent); version may
 * be NULL. */
int lora_set_get(const lora_set *s, const char *name, const lora_adapter **a, uint64_t *version);
/* Pins name for a sequence: one more pin, and it becomes the most recently
 * used. RD_ENOENT if absent. */
int lora_set_pin(lora_set *s, const char *name, lora_pinned *out);
/* Gives back a pin on slot (lora_pinned.slot): by slot rather than by name,
 * so that a sequence releases exactly what it pinned, retired or not.
 * RD_ENOENT if the slot holds nothing, RD_EINVAL if it has no pins. */
int lora_set_unpin(lora_set *s, int32_t slot);

/* Resident (not retired) adapters. */
int32_t lora_set_count(const lora_set *s);
int32_t lora_set_capacity(const lora_set *s);
/* The resident adapters in the order they were added: up to cap into
 * out[], *n the number written. */
int lora_set_list(const lora_set *s, lora_info *out, int32_t cap, int32_t *n);

#endif
