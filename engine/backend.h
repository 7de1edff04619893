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
} rd_step;

/* Device-side views of an uploaded rd_step (same shapes). */
typedef struct {
    int32_t n_rows, n_seqs, max_blocks;
    const int32_t *token_ids, *positions, *slots, *q_start, *ctx_len, *block_tables;
} rd_step_dev;

/* Shape of the attention computed by attention(). */
typedef struct {
    int32_t n_heads;            /* query heads */
    int32_t n_kv_heads;         /* key/value heads (GQA: n_heads % n_kv_heads == 0) */
    int32_t head_dim;           /* elements per head */
    int32_t block_size;         /* tokens per KV block */
    float scale;                /* 1/sqrt(head_dim) */
} rd_attn_shape;

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

    /* y[M][out] = x[M][in] . W^T, then y += residual when accumulate (the
     * product is rounded first, so accumulate equals a separate add). */
    void (*linear)(rd_backend *be, const void *w, const float *x, int32_t m, float *y,
                   int accumulate);
    /* out[M][d] = W[ids[i]] */
    void (*embed)(rd_backend *be, const void *w, const int32_t *ids, int32_t m, float *out);
    /* out[i] = x[i] / sqrt(mean(x[i]^2) + eps) * w, per row of d */
    void (*rmsnorm)(rd_backend *be, const float *x, const float *w, int32_t m, int32_t d,
                    float eps, float *out);
    /* Rotate-half RoPE in place on n_heads heads of head_dim starting at
     * x + row*stride, for each row at positions[row]; cos_sin is the table
     * [max_pos][head_dim/2][2] (cos, sin). */
    void (*rope)(rd_backend *be, float *x, int32_t stride, int32_t m, int32_t n_heads,
                 int32_t head_dim, const int32_t *positions, const float *cos_sin);
    /* out[M][f] = silu(gu[:, :f]) * gu[:, f:] (gu is [M][2f]) */
    void (*swiglu)(rd_backend *be, const float *gu, int32_t m, int32_t f, float *out);
    /* out[i] = x[rows[i]] for n rows of d floats */
    void (*gather_rows)(rd_backend *be, const float *x, const int32_t *rows, int32_t n,
                        int32_t d, float *out);

    /* Paged KV: k_cache/v_cache of one layer are [n_blocks][n_kv_heads][block_size][head_dim].
     * kv_write stores row i's K and V (at k + i*stride, v + i*stride) in slot
     * slots[i]. */
    void (*kv_write)(rd_backend *be, const rd_attn_shape *a, const float *k, const float *v,
                     int32_t stride, const rd_step_dev *s, float *k_cache, float *v_cache);
    /* Causal attention of every row over its sequence's cached context
     * (positions 0..positions[row]); q rows at q + row*stride; out [M][n_heads*head_dim]. */
    void (*attention)(rd_backend *be, const rd_attn_shape *a, const float *q, int32_t stride,
                      const rd_step_dev *s, const float *k_cache, const float *v_cache,
                      float *out);
    /* Copies whole blocks src[i] -> dst[i] in one layer's cache (copy-on-write). */
    void (*copy_blocks)(rd_backend *be, const rd_attn_shape *a, float *k_cache, float *v_cache,
                        const int32_t *src, const int32_t *dst, int32_t n);

    /* Uploads step metadata into backend-owned buffers valid until the next call. */
    int (*step_upload)(rd_backend *be, const rd_step *host, rd_step_dev *dev);

    void (*destroy)(rd_backend *be);
} rd_backend_ops;

struct rd_backend {
    const rd_backend_ops *ops;
    int n_threads;              /* CPU threads used by host kernels */
    void *impl;                 /* backend private state */
};

/* Creates a backend by name ("cpu" or "cuda"). RD_ENODEV when the backend is
 * not built in or no device is present. */
int rd_backend_create(const char *name, int n_threads, rd_backend **out);
void rd_backend_destroy(rd_backend *be);

#endif
