/* runner.h - one forward pass of the model over a step's rows.
 *
 * The runner owns the KV cache memory (per layer, in the backend) and the
 * activation buffers sized for the largest step. It knows nothing of
 * requests: the scheduler hands it rows, slots and block tables. */
#ifndef RD_RUNNER_H
#define RD_RUNNER_H

#include <stdint.h>

#include "engine/backend.h"
#include "engine/model/lora.h"
#include "engine/model/model.h"

/* A decode step captured as a backend graph (CUDA), one per batch bucket. */
typedef struct {
    int32_t bucket;             /* rows the step is padded to (0: slot unused) */
    void *graph;                /* backend graph, or NULL before capture */
    int lora;                   /* captured with the LoRA calls (a step with adapter rows) */
    uint64_t weights_gen;       /* model->weights_gen it was captured with */
    uint64_t lora_gen;          /* runner.lora_gen it was captured with (lora graphs) */
    int seen;                   /* the bucket ran once uncaptured since weights_gen */
} runner_graph;

#define RUNNER_MAX_GRAPHS 80  /* the 35 buckets, with and without LoRA */
#define RUNNER_GRAPH_MAX_BATCH 256

typedef struct runner {
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
    float *tmp;                 /* [rows][dim] a sublayer's output before its post-norm (Gemma 3) */
    /* Mixture of experts (cfg.n_experts > 0; NULL otherwise) */
    float *router;              /* [rows][n_experts] router logits of the layer being run */
    float *route_w;             /* [rows][k] routing weights of that layer */
    int32_t *routes;            /* [n_layers][rows][k] the experts every row was routed to, each layer's
                                   block at l * max_rows * k (runner_routes reads them) */
    rd_moe *moe;                /* [n_layers] the experts' handles as the backend takes them */
    float *sel;                 /* [max_logits][dim] rows that get logits */
    float *logits;              /* [max_logits][vocab] */
    int32_t *logit_rows_dev;    /* [max_logits] */
    int32_t *cow_dev;           /* [2][max_rows] copy-on-write src, dst */
    int32_t last_logits;        /* logit rows the last forward left in logits */
    /* CUDA graphs for decode steps (backends with graph ops; RD_GRAPHS=0 turns them off) */
    int use_graphs;
    int32_t graph_cap;          /* largest bucket: min(max_rows, max_logits, 256) */
    runner_graph graphs[RUNNER_MAX_GRAPHS];
    int32_t *pad_host;          /* [4][graph_cap] token, position, slot, LoRA slot of a padded step */
    int64_t graph_replays, graph_captures, graph_eager; /* decode steps by how they ran */
    /* LoRA adapters (runner_lora_init; lora_n_slots 0 without): per (layer, module) the backend handles of
     * every slot, called after the module's linear for the rows whose adapter has it */
    int32_t lora_n_slots;       /* adapter slots (lora_set_slots) */
    int32_t lora_max_rank;      /* bounds every handle's rank */
    void **lora_w;              /* [n_layers][LORA_N_MODULES][lora_n_slots] handles, NULL where none */
    rd_lora_batch *lora_lb;     /* [n_layers][LORA_N_MODULES] lora_apply's views of lora_w */
    int32_t *lora_used;         /* [n_layers][LORA_N_MODULES] handles set (0: the module is skipped) */
    int32_t *lora_rows_dev;     /* [max_rows] backend: the step's slot per row (-1: base) */
    int lora_step;              /* the step being run has adapter rows */
    uint64_t lora_gen;          /* bumped by every runner_lora_set: LoRA graphs captured before go */
    /* Wall time of the forward passes by phase, nanoseconds, summed over steps:
     * the layers (embedding included) and the head (gather, final norm, LM
     * head, logits to the host, sync). On a backend whose ops run when called
     * (CPU) the split is exact; on an asynchronous one (CUDA) queued layer work
     * finishes inside the head's sync, and a graph replay counts as layers.
     * Under async_forward that GPU time lands in whatever waits next. */
    int64_t ns_layers, ns_head;
    /* Set by the caller: a forward whose logits stay in the backend returns
     * with its work still queued (no wait), so the host's bookkeeping and the
     * sampler's launch overlap it; runner_sample (which waits for its
     * results), a d2h or runner_wait waits. Off: every forward waits. */
    int async_forward;
    int pending;                /* a forward's work may still be queued (async_forward) */
} runner;

/* Allocates n_blocks KV blocks of block_size tokens and buffers for steps
 * of up to max_rows tokens and max_logits logit rows. */
int runner_init(runner *r, model *m, int32_t n_blocks, int32_t block_size, int32_t max_rows,
                int32_t max_logits);
void runner_free(runner *r);

/* Frees the KV cache buffers (and the captured graphs that point into
 * them); runner_kv_alloc makes them again, n_blocks as before. A forward
 * needs them. */
void runner_kv_free(runner *r);
int runner_kv_alloc(runner *r);
/* The model's weights were re-made (model_adopt): re-reads the pointers the
 * runner keeps (the experts' handles) and drops the captured graphs. */
void runner_rebind(runner *r);
/* Makes room for n_slots LoRA adapters of rank <= max_rank (1 .. RD_LORA_MAX_RANK): rows of a step name
 * theirs in rd_step.lora_slots. The modules it serves: q, k, v, o on every family, gate, up, down on dense
 * ones (lora.h). */
int runner_lora_init(runner *r, int32_t n_slots, int32_t max_rank);
/* Sets slot's handle (ops.lora_load, or NULL to clear it) for module m of layer l. A step's rows see the
 * handles set when it runs; graphs captured with other handles are dropped. RD_EINVAL out of range, or for
 * a module the family's layers do not run. */
int runner_lora_set(runner *r, int32_t slot, int32_t layer, lora_module m, void *handle);

/* An adapter's backend copies, one handle per (layer, module) pair it has: prepare makes them
 * ([n_layers][LORA_N_MODULES], NULL where it has none; *bytes the backend's), checking each pair's shape
 * against the model's; bind puts them in slot (which must be empty) and takes the array; discard frees
 * prepared handles that were never bound; unbind frees slot's. */
int runner_lora_prepare(runner *r, const lora_adapter *a, void ***handles, int64_t *bytes);
void runner_lora_bind(runner *r, int32_t slot, void **handles);
void runner_lora_discard(runner *r, void **handles);
void runner_lora_unbind(runner *r, int32_t slot);

/* Copies KV blocks src[i] -> dst[i] in every layer (copy-on-write). */
int runner_copy_blocks(runner *r, const int32_t *src, const int32_t *dst, int32_t n);

/* Runs the model over step s, writing the new rows' K/V into their slots,
 * and fills logits_host[n_logits][vocab] (fp32) for rows logit_rows[]
 * (logits_host NULL: they stay in the backend for runner_sample).
 * A pure decode step (one row per sequence, every row a logit row, in order)
 * runs as a backend graph when the backend has them: padded to its bucket,
 * uncaptured the first time a bucket is seen (and after a weight swap),
 * captured the second, replayed after. Results do not depend on which. */
int runner_forward(runner *r, const rd_step *s, const int32_t *logit_rows, int32_t n_logits,
                   float *logits_host);

/* The rows a graph-run decode step of m rows is padded to: the smallest of
 * 1, 2, 4 and the multiples of 8 up to 256 that holds m, or cap when that is
 * smaller; 0 when m > min(cap, 256) (the step runs uncaptured). */
int32_t runner_graph_bucket(int32_t m, int32_t cap);

/* The pre-norm decoder layer (Llama, Qwen2, Qwen3) over M rows of layer l:
 * rmsnorm -> q|k|v (+ bias where the layer has one) -> per-head q/k norms
 * (where it has them) -> RoPE -> KV write -> attention -> o (+residual) ->
 * rmsnorm -> gate|up -> SwiGLU -> down (+residual). A family's arch_desc.layer. */
void runner_layer_decoder(runner *r, const rd_step_dev *sd, int32_t M, int32_t l);

/* Qwen3-MoE's layer: Qwen3's attention, then rmsnorm -> router linear ->
 * moe_route (top k, into r->routes) -> moe_ffn (+residual). */
void runner_layer_moe(runner *r, const rd_step_dev *sd, int32_t M, int32_t l);

/* The experts the last runner_forward routed its first n rows to:
 * dst[n_layers][n][k] (k = n_experts_used). RD_EINVAL for a dense model. */
int runner_routes(runner *r, int32_t n, int32_t *dst);

/* Gemma 3's layer: (1 + w) norms around both sublayers (pre and post),
 * per-head q/k norms, the sliding window and local RoPE base on local
 * layers, GELU-tanh gated FFN. */
void runner_layer_gemma3(runner *r, const rd_step_dev *sd, int32_t M, int32_t l);

/* Samples from the logit rows the last runner_forward left in the backend:
 * request i takes row reqs[i].row. On the device when the backend samples
 * (ops.sample), else on the host with samp_sample. A row whose logits the
 * sampler rejects gets token -1. */
int runner_sample(runner *r, const rd_sample_req *reqs, int32_t n, samp_result *out);

/* Waits for the work a forward left queued under async_forward (no-op
 * otherwise); surfaces the backend's error if it failed. Callers wait
 * before anything that may replace what the queued work reads (a weight
 * swap, freeing the KV cache). */
int runner_wait(runner *r);

#endif
