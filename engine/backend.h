/* backend.h - the compute interface the model runner drives.
 *
 * One struct of function pointers; the CPU backend (kernels/cpu) and the CUDA
 * backend (kernels/cuda) implement it. Every float pointer passed to an op is
 * backend memory ("device" memory: host memory for the CPU backend), obtained
 * from alloc(). Ops are enqueued in call order on the backend's one stream;
 * sync() waits for them. Row-major everywhere.
 *
 * Determinism contract (DESIGN.md): every op computes each output row with a
 * fixed reduction order that depends only on that row (and, for attention, on
 * that sequence's length), never on M, the batch or the thread count. */
#ifndef RD_BACKEND_H
#define RD_BACKEND_H

#include <stddef.h>
#include <stdint.h>

#include "engine/serve/sampler.h"

typedef struct rd_backend rd_backend;

/* Per-step metadata, host copies. The backend uploads it (step_upload) and
 * the ops read the device copy (rd_step_dev). Rows of a step are grouped by
 * sequence: rows [q_start[s], q_start[s+1]) belong to sequence s, in position
 * order, and are the last rows of that sequence (its context is ctx_len[s]
 * tokens including them). */
typedef struct {
    int32_t n_rows;             /* M: tokens computed this step */
    int32_t n_seqs;             /* sequences with rows this step */
    int32_t max_blocks;         /* row stride of block_tables */
    const int32_t *token_ids;   /* [n_rows] */
    const int32_t *positions;   /* [n_rows] absolute position in its sequence */
    const int32_t *slots;       /* [n_rows] KV slot = block * block_size + offset */
    const int32_t *q_start;     /* [n_seqs + 1] row offsets (prefix sums) */
    const int32_t *ctx_len;     /* [n_seqs] tokens in the KV cache after this step */
    const int32_t *block_tables;/* [n_seqs][max_blocks] physical block ids */
    const int32_t *lora_slots;  /* [n_rows] each row's LoRA adapter slot (runner_lora_set), -1 for the base
                                   model; NULL: every row base. The runner reads it, step_upload does not */
} rd_step;

/* Padding (CUDA graphs run a decode step padded to a fixed batch size): rows
 * past q_start[n_seqs] belong to no sequence; they carry token id -1 and
 * slot -1, write no KV and attend to nothing. Only backends with graph ops
 * ever see them. */

/* Device-side views of an uploaded rd_step (same shapes). */
typedef struct rd_step_dev {
    int32_t n_rows, n_seqs, max_blocks;
    const int32_t *token_ids, *positions, *slots, *q_start, *ctx_len, *block_tables;
} rd_step_dev;

/* Shape of the attention computed by attention(). */
typedef struct {
    int32_t n_heads;            /* query heads */
    int32_t n_kv_heads;         /* key/value heads (GQA: n_heads % n_kv_heads == 0) */
    int32_t head_dim;           /* elements per head */
    int32_t block_size;         /* tokens per KV block */
    float scale;                /* applied to q.k: 1/sqrt(head_dim), or the family's */
    int32_t window;             /* sliding window in tokens: a query at position p sees keys
                                   p-window+1 .. p; 0: the whole context (causal) */
} rd_attn_shape;

/* One device sampling request (ops.sample). */
typedef struct rd_sample_req {
    int32_t row;                /* logit row */
    uint32_t sample_idx, pos;   /* the RNG counter, as samp_sample's */
    const samp_params *sp;
    const samp_edit *edits;     /* [n_edits] host memory: applied to a copy of the row before the draw
                                   (samp_apply_edits, samp_sample_ex); NULL when n_edits is 0 */
    int32_t n_edits;
    int score;                  /* 1: no draw: the raw log-prob of score_token and the alternatives, as
                                   samp_score gives them (scoring a prompt token); edits are not applied */
    int32_t score_token;
} rd_sample_req;

/* Entries of a bytes-by-ggml_type array (linear_bytes_by_type): the ggml
 * codes the engine runs, and rolloutd's RD_TYPE_FP8_B32, are all below it. */
#define RD_WEIGHT_TYPES 72

/* Rows of a weight in its file dtype, for linear_load_q. */
#define RD_WPART_MAX 4
typedef struct {
    int32_t type;               /* ggml_type (engine/format/gguf.h) */
    int32_t rows;               /* output features in this part */
    const void *data;           /* rows x ggml_row_bytes(type, in) bytes, row-major, HF row order */
} rd_wpart;

/* One layer's mixture-of-experts FFN (ops.moe_ffn): n_experts SwiGLU
 * experts; expert e's gate|up is a linear [2 ffn][dim] (its gate rows, then
 * its up rows) and its down a linear [dim][ffn], both handles from
 * linear_load / linear_load_q. */
typedef struct rd_moe {
    int32_t n_experts;
    int32_t ffn;                /* an expert's intermediate size */
    int32_t dim;                /* hidden size */
    void *const *gate_up;       /* [n_experts] linear handles (host array) */
    void *const *down;          /* [n_experts] linear handles (host array) */
} rd_moe;

/* One LoRA pair of one adapter for one (layer, module) (ops.lora_load):
 * the module's linear y = W x gains s * B (A x). A and B in the dtype the
 * adapter file holds them in: GGML_F32, GGML_F16 or GGML_BF16 (the backend
 * widens them exactly; how it keeps them is its own, see lora_load). */
typedef struct rd_lora_w {
    int32_t rank;               /* r: 1 .. RD_LORA_MAX_RANK */
    int32_t in, out;            /* the module's input and output features */
    float scale;                /* s: alpha / r, or alpha / sqrt(r) (rsLoRA) */
    int32_t a_type, b_type;     /* ggml types of A and B */
    const void *a;              /* A [rank][in], host memory, row-major */
    const void *b;              /* B [out][rank], host memory, row-major */
} rd_lora_w;

/* The adapters one lora_apply call can add, for one module of one layer:
 * slot s (a row's adapter) is w[s], a handle from lora_load, or NULL where
 * that adapter leaves this module alone. Every handle is [.][in] -> [out]
 * with rank <= max_rank. The engine keeps one such host array per (layer,
 * module) and rewrites its entries when the resident adapters change. */
typedef struct rd_lora_batch {
    int32_t n_slots;            /* 1 .. RD_LORA_MAX_SLOTS */
    void *const *w;             /* [n_slots] handles (host array) */
    int32_t in, out;
    int32_t max_rank;           /* bounds every handle's rank (CUDA sizes its launch and scratch by it) */
} rd_lora_batch;

#define RD_LORA_MAX_SLOTS 256   /* lora.h's LORA_MAX_LORAS */
#define RD_LORA_MAX_RANK 1024   /* lora.h's LORA_MAX_RANK */

/* The reduction order of lora_apply, the same on every backend so that
 * they agree bit for bit (fmaf rounds once, on the CPU as on the device):
 *   shrink, t[k] = A[k] . x for k < rank, as a warp of 32 lanes computes a
 *   dot product of length n = in: lane l accumulates from 0, with fmaf in
 *   element order, the 8-element chunks c = l, l + 32, l + 64, ... of
 *   [0, 8 (n / 8)), then the tail elements 8 (n / 8) + l, + 32, ... < n;
 *   the 32 partials then meet in the xor butterfly (for o = 16, 8, 4, 2, 1:
 *   p[l] = p[l] + p[l ^ o]);
 *   expand, for j < out: u = fmaf(B[j][k], t[k], u) over k = 0 .. rank-1
 *   from u = 0, then y[j] = y[j] + s * u (s * u rounded first).
 * t stays fp32 (never rounded to the weights' dtype). Both depend only on
 * the row and its adapter, never on m, the other rows or their adapters. */
#define RD_LORA_LANES 32
#define RD_LORA_CHUNK 8

typedef struct rd_backend_ops {
    const char *name;           /* "cpu", "cuda" */

    /* memory */
    void *(*alloc)(rd_backend *be, size_t bytes);          /* NULL on failure; zeroed */
    void (*free)(rd_backend *be, void *p);
    int (*h2d)(rd_backend *be, void *dst, const void *src, size_t bytes);
    int (*d2h)(rd_backend *be, void *dst, const void *src, size_t bytes);
    int (*sync)(rd_backend *be);

    /* A linear layer's weight W[out][in] (fp32 host, HF layout) converted to
     * the backend's GEMM format. The same handle serves embedding lookups
     * (row i of W is token i's embedding) for tied embeddings. */
    int (*linear_load)(rd_backend *be, const float *w, int32_t out, int32_t in, void **handle);
    void (*linear_free)(rd_backend *be, void *handle);
    /* Reads a loaded weight back to the host as fp32 W[out][in] (export). */
    int (*linear_read)(rd_backend *be, const void *handle, float *w_host);
    /* Rows [row0, row0 + rows) of a loaded weight as ggml type `type`,
     * row-major into dst (rows x ggml_row_bytes(type, in) bytes), when the
     * backend holds those rows in exactly that type: the bytes
     * linear_load_q was given. RD_ENOTSUP (no message) when it holds them
     * otherwise: the caller reads fp32 with linear_read. A delta push reads
     * its base this way (no fp32 copy, no narrowing); a quantized COMMIT
     * reads the rows a push leaves out (no re-quantization). */
    int (*linear_read_native)(rd_backend *be, const void *handle, int32_t type, int32_t row0, int32_t rows,
                              void *dst);
    /* The same weight from its file bytes: parts stacked along out (a fused
     * q|k|v may mix dtypes), each in a ggml dtype (engine/format/gguf.h). The
     * backend may keep them in that dtype; every product it computes must
     * equal the one linear_load of the dequantized W (ggml_dequant_row)
     * gives, bit for bit, except where the backend documents a native path
     * that is closer to the dequantized values than its linear_load (CUDA's
     * Q8_0 weights under RD_CUDA_Q8=tc: docs/GPU.md). NULL: the loader
     * dequantizes and calls linear_load. */
    int (*linear_load_q)(rd_backend *be, const rd_wpart *parts, int32_t n_parts, int32_t in, void **handle);
    /* Bytes of backend memory a loaded weight holds (what /status reports). */
    int64_t (*linear_bytes)(rd_backend *be, const void *handle);
    /* The same bytes by dtype: adds them to bytes[ggml_type] (a fused weight
     * of mixed dtypes to each of its types; fp32 panels to GGML_F32).
     * bytes has RD_WEIGHT_TYPES entries. NULL: /status shows no breakdown. */
    void (*linear_bytes_by_type)(rd_backend *be, const void *handle, int64_t *bytes);

    /* y[M][out] = x[M][in] . W^T, then y += residual when accumulate (the
     * product is rounded first, so accumulate equals a separate add). */
    void (*linear)(rd_backend *be, const void *w, const float *x, int32_t m, float *y,
                   int accumulate);
    /* out[M][d] = W[ids[i]] x scale, each value's product rounded once in fp32 (scale 1: the rows as they
     * are; Gemma's sqrt(hidden) otherwise, so its embedding takes no second pass). */
    void (*embed)(rd_backend *be, const void *w, const int32_t *ids, int32_t m, float scale, float *out);
    /* out[i] = x[i] / sqrt(mean(x[i]^2) + eps) * (w + w_offset), per row of d.
     * w_offset is 0, or 1 for Gemma's (1 + w) norms (the weights stay HF's w;
     * with 0 the weight is used as it is). */
    void (*rmsnorm)(rd_backend *be, const float *x, const float *w, int32_t m, int32_t d,
                    float eps, float w_offset, float *out);
    /* Rotate-half RoPE in place on n_heads heads of head_dim starting at
     * x + row*stride, for each row at positions[row]; cos_sin is the table
     * [max_pos][head_dim/2][2] (cos, sin). */
    void (*rope)(rd_backend *be, float *x, int32_t stride, int32_t m, int32_t n_heads,
                 int32_t head_dim, const int32_t *positions, const float *cos_sin);
    /* y[i][j] += b[j] for j < n on the rows at y + i*stride (a linear's bias,
     * added to the rounded product: Qwen2's q|k|v). */
    void (*add_bias)(rd_backend *be, float *y, int32_t stride, int32_t m, int32_t n, const float *b);
    /* RMSNorm of each head in place, as rmsnorm over d = head_dim: the
     * n_heads heads of head_dim floats at x + row*stride + h*head_dim, each
     * with the same weight w[head_dim] (Qwen3's q_norm / k_norm, before RoPE). */
    void (*head_rmsnorm)(rd_backend *be, float *x, int32_t stride, int32_t m, int32_t n_heads,
                         int32_t head_dim, const float *w, float eps, float w_offset);
    /* out[M][f] = silu(gu[:, :f]) * gu[:, f:] (gu is [M][2f]) */
    void (*swiglu)(rd_backend *be, const float *gu, int32_t m, int32_t f, float *out);
    /* out[M][f] = gelu_tanh(gu[:, :f]) * gu[:, f:] (Gemma's gated FFN), with
     * gelu_tanh(g) = 0.5 g (1 + tanh(0.7978845608 (g + 0.044715 g^3))). */
    void (*geglu)(rd_backend *be, const float *gu, int32_t m, int32_t f, float *out);
    /* rmsnorm of x into out as rmsnorm gives it, then y[i] += out[i] (one
     * fp32 rounding): a post-norm whose output joins the residual stream
     * (Gemma 3's post-attention and post-FFN norms), one pass where a backend
     * can. x, out and y are [m][d] and distinct. */
    void (*rmsnorm_add)(rd_backend *be, const float *x, const float *w, int32_t m, int32_t d, float eps,
                        float w_offset, float *out, float *y);
    /* out[i] = x[rows[i]] for n rows of d floats */
    void (*gather_rows)(rd_backend *be, const float *x, const int32_t *rows, int32_t n,
                        int32_t d, float *out);

    /* Mixture-of-experts routing over m rows of router logits
     * [m][n_experts] (fp32): p = softmax(row) (the row's max subtracted,
     * expf, the sum in expert order in fp32, then each exp divided by it);
     * the k experts of largest p, ties to the lower expert id, written to
     * ids[m][k] in that order (largest first), their p to weights[m][k],
     * divided by the sum of the k (in that order, fp32) when norm is 1.
     * k <= n_experts <= RD_MOE_MAX_EXPERTS, k <= RD_MOE_MAX_K. */
    void (*moe_route)(rd_backend *be, const float *logits, int32_t m, int32_t n_experts, int32_t k, int norm,
                      int32_t *ids, float *weights);
    /* The experts over m rows x[m][dim]: for row i and its routes
     * j = 0..k-1 (e = ids[i][j], w = weights[i][j]), h_j =
     * down_e . swiglu(gate_up_e . x_i), each product computed as linear
     * computes that row (a row's result never depends on which rows share
     * its expert); then acc = fmaf(w_j, h_j, acc) over j in order from
     * acc = 0, and y_i += acc. Rows sharing an expert are grouped so each
     * expert's weights are read once per call. */
    void (*moe_ffn)(rd_backend *be, const rd_moe *moe, const float *x, const int32_t *ids, const float *weights,
                    int32_t m, int32_t k, float *y);
    /* Drops what the backend keeps for moe's handle arrays between moe_ffn
     * calls (CUDA: the device copy of the expert table, keyed by the
     * arrays' addresses). Called before the arrays are freed, outside any
     * graph capture and with no graph that uses them left to launch; NULL
     * where the backend keeps nothing (the CPU). Without it a model that is
     * freed and rebuilt (weights released and resumed, every training step
     * under verl's colocated mode) leaves a table per layer behind. */
    void (*moe_release)(rd_backend *be, const rd_moe *moe);

    /* ---- LoRA (unmerged adapters; engine/model/lora.h) ----
     * lora_load keeps one rd_lora_w on the backend, its host data copied
     * (the caller may free it). The CPU widens A and B to fp32 once at load
     * (f16 and bf16 widen exactly, so the products are those of the file's
     * values, and the host has the memory); CUDA keeps the file's dtype in
     * device memory and widens each element as it reads it (HBM is what
     * resident adapters compete for with the KV cache). RD_EINVAL for a
     * shape, rank or dtype outside rd_lora_w's. */
    int (*lora_load)(rd_backend *be, const rd_lora_w *w, void **handle);
    void (*lora_free)(rd_backend *be, void *handle);
    /* Bytes of backend memory a LoRA handle holds. */
    int64_t (*lora_bytes)(rd_backend *be, const void *handle);
    /* For each row i < m whose slot a = slots[i] is in [0, lb->n_slots) with
     * lb->w[a] not NULL: y[i][out_off + j] += s_a * (B_a (A_a x[i]))[j] for
     * j < lb->out, in the order RD_LORA_LANES states; other rows (slot -1:
     * the base model) are left as they are. x is [m][lb->in] (dense); y's
     * rows are y_stride floats apart and out_off + lb->out <= y_stride, so
     * a module's term lands at its offset in a fused q|k|v or gate|up
     * output. slots is backend memory [m] (the engine's per-row adapter
     * table, which a CUDA graph reads at replay). Call it after the base
     * linear has written y: the term is added to the rounded product. */
    void (*lora_apply)(rd_backend *be, const rd_lora_batch *lb, const float *x, const int32_t *slots, int32_t m,
                       float *y, int32_t y_stride, int32_t out_off);
    /* Drops what the backend keeps for lb->w between lora_apply calls
     * (CUDA: the device table of the slots' A, B, rank, dtypes and scale,
     * keyed by the array's address), as moe_release. NULL on the CPU. CUDA
     * writes that table whenever a call finds the slots' handles changed;
     * a graph captured while the table was current reads it at replay, so
     * after changing a slot, one lora_apply outside capture (any m) brings
     * the graph's reads up to date; one captured while it was stale writes
     * the pointers of its capture at every replay (capture again). */
    void (*lora_release)(rd_backend *be, const rd_lora_batch *lb);

    /* Paged KV: k_cache/v_cache of one layer are [n_blocks][n_kv_heads][block_size][head_dim].
     * kv_write stores row i's K and V (at k + i*stride, v + i*stride) in slot
     * slots[i]. */
    void (*kv_write)(rd_backend *be, const rd_attn_shape *a, const float *k, const float *v,
                     int32_t stride, const rd_step_dev *s, float *k_cache, float *v_cache);
    /* Causal attention of every row over its sequence's cached context
     * (positions 0..positions[row], or the last a->window of them); q rows at
     * q + row*stride; out [M][n_heads*head_dim]. */
    void (*attention)(rd_backend *be, const rd_attn_shape *a, const float *q, int32_t stride,
                      const rd_step_dev *s, const float *k_cache, const float *v_cache,
                      float *out);
    /* Copies whole blocks src[i] -> dst[i] in one layer's cache (copy-on-write). */
    void (*copy_blocks)(rd_backend *be, const rd_attn_shape *a, float *k_cache, float *v_cache,
                        const int32_t *src, const int32_t *dst, int32_t n);

    /* Uploads step metadata into backend-owned buffers valid until the next call. */
    int (*step_upload)(rd_backend *be, const rd_step *host, rd_step_dev *dev);

    void (*destroy)(rd_backend *be);

    /* The KV cache's element type (rd_backend_set_kv_dtype, which has
     * checked that name is "auto", "f32", "bf16", "f16" or "fp8"): sets it,
     * or RD_ENOTSUP naming the types the backend stores. */
    int (*set_kv_dtype)(rd_backend *be, const char *name);

    /* ---- Optional: zero / NULL where a backend does not provide them. ---- */

    /* Bytes per K/V element in the cache (0 means 4, fp32). The runner sizes
     * k_cache/v_cache with it; the CUDA backend stores bf16 (2). */
    int32_t kv_elem_bytes;
    /* Bytes a cache block adds per (token, kv head) besides its head_dim
     * elements: the CUDA backend's fp8 cache (kv_dtype fp8) keeps a scale
     * byte there. 0: none. See rd_backend_kv_block_bytes. */
    int32_t kv_scale_bytes;
    /* The LM head: y[M][out] = x[M][in] . W^T with fp32 x, fp32 products and
     * fp32 accumulation (the runner calls linear when this is NULL). */
    void (*lm_head)(rd_backend *be, const void *w, const float *x, int32_t m, float *y);
    /* Backend-to-backend memory copy, enqueued in order. */
    int (*d2d)(rd_backend *be, void *dst, const void *src, size_t bytes);
    /* Free and total device memory in bytes. */
    int (*mem_info)(rd_backend *be, size_t *free_bytes, size_t *total_bytes);
    /* One line naming the device and its configuration (for logs, benchmarks). */
    int (*describe)(rd_backend *be, char *buf, size_t cap);
    /* Graphs: the ops enqueued between graph_begin and graph_end (on the same
     * thread; no h2d, d2h, sync, alloc or free in between) are recorded, not
     * run; graph_launch replays them with the same arguments, reading
     * whatever the step buffers of the latest step_upload hold. graph_launch
     * returns RD_GRAPH_STALE (> 0, nothing run) when buffers the graph
     * refers to were reallocated since its capture: capture again. */
    int (*graph_begin)(rd_backend *be);
    int (*graph_end)(rd_backend *be, void **graph);
    int (*graph_launch)(rd_backend *be, void *graph);
    void (*graph_free)(rd_backend *be, void *graph);
    /* Samples n requests from logits rows [.][vocab] held by the backend, by
     * samp_sample_ex's rules (samp_score's for a request with score set) with each request's edits
     * applied to its row
     * (samp_edit_logit; the raw log-prob and the alternatives from the row
     * as it is) (same token for the same logits and seed up to
     * double rounding of its sums, see kernels/cuda/cuda_sample.cu); a row
     * whose logits samp_sample would reject gets token -1. Synchronous. */
    int (*sample)(rd_backend *be, const float *logits, int32_t vocab, const rd_sample_req *reqs,
                  int32_t n, samp_result *out);
} rd_backend_ops;

#define RD_GRAPH_STALE 1

/* Bounds of moe_route / moe_ffn (Qwen3-MoE: 128 experts, top 8). */
#define RD_MOE_MAX_EXPERTS 512
#define RD_MOE_MAX_K 32


struct rd_backend {
    const rd_backend_ops *ops;
    int n_threads;              /* CPU threads used by host kernels */
    void *impl;                 /* backend private state */
};

/* Creates a backend by name ("cpu" or "cuda"; NULL is "cpu"), from
 * rd_backend_registry (both in kernels/registry.c). RD_ENODEV when the
 * backend is not built in or no device is present. */
int rd_backend_create(const char *name, int n_threads, rd_backend **out);

/* One backend the build knows, by name. create is NULL where it is not built
 * in: absent then names how to build it, or is NULL for a backend that is
 * only ever linked in on purpose (the CUDA emulator of the tests), which
 * then counts as unknown. */
typedef struct {
    const char *name;           /* what rd_backend_create takes: "cpu", "cuda", "cuda-emu" */
    int (*create)(int n_threads, rd_backend **out);
    const char *absent;         /* how to build it in, when create is NULL; or NULL */
} rd_backend_entry;

/* The registry, ended by an entry with name NULL. It lives with the
 * backends (kernels/registry.c), which the engine does not include: each
 * backend's header declares its create function there. */
extern const rd_backend_entry rd_backend_registry[];
void rd_backend_destroy(rd_backend *be);

/* Bytes per KV cache element of this backend (ops.kv_elem_bytes, or 4). */
int32_t rd_backend_kv_elem_bytes(const rd_backend *be);
/* Bytes of one block of one layer's K (or V) cache:
 * n_kv * block_size * (head_dim * elem bytes + ops.kv_scale_bytes). */
int64_t rd_backend_kv_block_bytes(const rd_backend *be, int32_t n_kv, int32_t block_size, int32_t head_dim);

/* The KV cache's element type (config key kv_dtype): "auto" (the backend's
 * own: f32 on the CPU, bf16 on CUDA), "f32", "bf16", "f16" or "fp8". The CPU
 * backend stores K/V in f32, bf16 or f16 (rounded to nearest even) and widens
 * them exactly in attention; CUDA stores bf16, or fp8: E4M3 codes with a
 * power-of-two scale per (token, kv head), kernels/cuda/cuda_kernels.cu. Call it before any runner or
 * engine is created on be (they size and read the cache by it). RD_EINVAL for
 * another name, RD_ENOTSUP for a type the backend does not store. */
int rd_backend_set_kv_dtype(rd_backend *be, const char *name);

/* KV pool bytes from a fraction of the device memory that is free now (call
 * it after the model is loaded): floor(util * free) - reserve_bytes, at least
 * 0. util in (0, 1]. RD_ENOTSUP for a backend without mem_info (the CPU:
 * size the pool in bytes instead). */
int rd_backend_kv_budget(rd_backend *be, double util, int64_t reserve_bytes, int64_t *bytes);
/* The arithmetic of rd_backend_kv_budget. */
int64_t rd_kv_budget_bytes(int64_t free_bytes, double util, int64_t reserve_bytes);

#endif
