/* runner.h - one forward pass of the model over a step's rows.
 *
 * The runner owns the KV cache memory (per layer, in the backend) and the
 * activation buffers sized for the largest step. It knows nothing of
 * requests: the scheduler hands it rows, slots and block tables. */
#ifndef RD_RUNNER_H
#define RD_RUNNER_H

#include <stdint.h>

#include "engine/backend.h"
#include "engine/model.h"

typedef struct {
    model *m;                   /* not owned */
    rd_backend *be;             /* not owned */
    rd_attn_shape attn;
    int32_t n_blocks;           /* KV blocks in the pool */
    int32_t max_rows;           /* most rows (tokens) per step */
    int32_t max_logits;         /* most logit rows per step */
    float **k_cache, **v_cache; /* [n_layers] -> backend [n_blocks][nkv][block_size][hd] */
    /* activations (backend memory), rows = max_rows unless noted */
    float *x;                   /* [rows][dim] residual stream */
    float *xn;                  /* [rows][dim] normed */
    float *qkv;                 /* [rows][(nh + 2 nkv) hd] */
    float *att;                 /* [rows][nh hd] */
    float *gu;                  /* [rows][2 ffn] */
    float *ff;                  /* [rows][ffn] */
    float *sel;                 /* [max_logits][dim] rows that get logits */
    float *logits;              /* [max_logits][vocab] */
    int32_t *logit_rows_dev;    /* [max_logits] */
    int32_t *cow_dev;           /* [2][max_rows] copy-on-write src, dst */
} runner;

/* Allocates n_blocks KV blocks of block_size tokens and buffers for steps
 * of up to max_rows tokens and max_logits logit rows. */
int runner_init(runner *r, model *m, int32_t n_blocks, int32_t block_size, int32_t max_rows,
                int32_t max_logits);
void runner_free(runner *r);

/* Copies KV blocks src[i] -> dst[i] in every layer (copy-on-write). */
int runner_copy_blocks(runner *r, const int32_t *src, const int32_t *dst, int32_t n);

/* Runs the model over step s, writing the new rows' K/V into their slots,
 * and fills logits_host[n_logits][vocab] (fp32) for rows logit_rows[]. */
int runner_forward(runner *r, const rd_step *s, const int32_t *logit_rows, int32_t n_logits,
                   float *logits_host);

#endif
