// cuda_backend.cu - the CUDA implementation of rd_backend_ops.
//
// Numerics: weights and the KV cache are bf16; activations between ops are
// fp32 (the runner's buffers). A linear layer passes its fp32 input to a
// bf16 x bf16 GEMM (cuBLASLt, fp32 accumulation and output) as two bf16
// halves, hi = bf16(x) and lo = bf16(x - hi), stacked as 2M rows of one GEMM
// (the weights are read once) and summed after: ~16 bits of the input, so the
// products are those of fp32 activations and bf16 weights to ~2^-17. The sum
// is deferred into the next kernel that reads the output (RMSNorm, RoPE,
// SwiGLU, GeGLU, a bias, the per-head norms, RMSNorm + add; see settle and
// take_split), so the split adds no kernel. RoPE is deferred in turn, so
// that the KV write runs inside it (cu_kv_write).
// RD_CUDA_ACT=bf16 passes hi only (half the GEMM FLOPs, a plain bf16 GEMM);
// RD_CUDA_ACT=mixed splits only the GEMMs with in > out (in a Llama block,
// the down projection: about a quarter of the FLOPs), hi only elsewhere.
// On SmolLM2-135M (8 prompts x 32 greedy tokens, emulated) the split keeps
// chosen-token log-probs within 0.046 nats of the fp32 CPU backend; hi only
// drifts to 0.071. The LM head runs in fp32 (fp32 hidden state times the
// weights in fp32); norms, RoPE, SwiGLU, softmax and sampling compute in fp32
// (sums of squares and sampling masses in double). The MoE experts
// (moe_ffn, cuda_moe.cu) take fp32 activations in every RD_CUDA_ACT mode.
//
// Batch invariance: every kernel here reduces in an order fixed by the row
// alone (see each kernel), and each GEMM shape runs one cuBLASLt algorithm,
// chosen at load time among candidates with no split-K by checking on the
// device that its rows come out bit-identical for every tested batch size
// (cuplan_gemm_check_sizes); if none passes, the fallback GEMM kernel (fixed
// order by construction) serves that shape.
//
// Threads: the engine thread runs the compute ops on the backend's stream and
// owns its CUDA graphs. A weight update builds new weights on a worker thread
// meanwhile (engine/update/staging.h): alloc, free, h2d, d2h, linear_load and
// linear_read from a thread other than the one that last uploaded a step are
// synchronous on a second stream, so they never enter the engine's stream or
// a graph being captured (captures use cudaStreamCaptureModeThreadLocal).
//
// Errors: ops that return void record the first failure (launch error,
// cuBLAS status, an op that is illegal during capture); the next call that
// returns a code (sync, d2h, h2d, step_upload, graph_end, graph_launch)
// reports it.
#include "kernels/cuda/cuda_internal.h"

#ifndef RD_CUDA_EMU
#include <cublasLt.h>
#endif

#include <pthread.h>

#include <atomic>
#include <cmath>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <utility>
#include <vector>

extern "C" {
#include "engine/backend.h"
#include "kernels/cuda/cuda_backend.h"
#include "base/err.h"
#include "engine/format/gguf.h"
#include "engine/model/quant_fp8.h"
#include "engine/serve/sampler.h"
}

#ifdef RD_CUDA_EMU
#define RD_CUDA_ENTRY rd_backend_cudaemu_create
#define RD_CUDA_NAME "cuda-emu"
#else
#define RD_CUDA_ENTRY rd_backend_cuda_create
#define RD_CUDA_NAME "cuda"
#endif

namespace RD_NS {

#ifndef RD_CUDA_EMU
bool rd_pdl = false;
#endif

// ------------------------------------------------------------------ state

struct gemm_choice {
    int32_t out, in;
    int f32;                    // 1: fp32 A and B (the LM head), else bf16
    int lt;                     // 1: cuBLASLt with algo, 0: the fallback kernel
    char what[128];             // how it was chosen (describe())
#ifndef RD_CUDA_EMU
    cublasLtMatmulAlgo_t algo;
#endif
};

struct weight {
    uint16_t *w;                // [out][in] bf16; NULL for an FP8 or Q8_0 weight
    uint8_t *f8;                // FP8 weights (serve_dtype fp8): E4M3 codes [out][in]; else NULL
    uint8_t *f8s;               // and their block scale bytes [out][in / 32] (engine/model/quant_fp8.h)
    int8_t *q8;                 // Q8_0 weights under RD_CUDA_Q8=tc: codes [out][in]; else NULL
    uint16_t *q8d;              // and their blocks' fp16 scales [out][in / 32], as in the file
    int32_t out, in;
    gemm_choice *ch;            // bf16 GEMM
    bool use_tc;                // the tensor-core GEMM serves this weight (RD_CUDA_GEMM=tc / RD_CUDA_FP8=tc)
    cuplan_tc tc;               // and its plan
    float *w32;                 // fp32 copy for the LM head (made on first use)
    gemm_choice *ch32;
};

struct shadow {                 // bf16 copy of an fp32 activation buffer
    const float *f32;
    uint16_t *bf;
    size_t cap;                 // elements in bf
    size_t n;                   // elements valid (0: stale)
    uint64_t used;              // for replacement
};

struct graph_h {
    cudaGraphExec_t exec;
    uint64_t epoch;
};

// The device table of one rd_moe's expert weights (moe_ffn): keyed by its
// host handle arrays, and checked against what the handles point at on every
// call (a weight swap replaces handles in those arrays, and a freed handle's
// address may come back as a new one, so the device pointers are compared,
// not the handles).
struct moe_table {
    const void *const *gate_up, *const *down; // the key
    int32_t n_experts;
    std::vector<const void *> ptrs;     // what dev holds (moe_args.table): gate_up's weights at e, down's at
                                        // n_experts + e (bf16, or Q8_0 codes), their Q8_0 scales (or NULL) at
                                        // 2 n_experts + e and 3 n_experts + e
    const void **dev;                   // [4 n_experts]
    int aligned;                        // every pointer 16-byte aligned
    int wf;                             // TC_WF_BF16 or TC_WF_Q8_0 when every expert is that format, else -1
    bool in_graph;                      // last written by a captured kernel: write it again at the next call
};

// One LoRA pair (lora_load): A and B in the file's dtype on the device.
struct lora_h {
    void *a, *b;                // A [rank][in], B [out][rank]
    int32_t rank, in, out;
    int32_t a_dt, b_dt;         // LORA_DT_*
    float scale;
    int64_t bytes;
};

// The device table of one rd_lora_batch (lora_apply), keyed by its host
// handle array like moe_table, and compared entry by entry (pointers, rank,
// dtypes, scale) with what the handles hold now on every call.
struct lora_table {
    const void *const *key;
    int32_t n_slots;
    std::vector<lora_dev> cur; // what dev holds
    lora_dev *dev;             // [n_slots]
    bool in_graph;             // last written by a captured kernel: write it again at the next call
};

#define N_SHADOW 8
#define GEMM_MAX_ROWS 512       // rows per cuBLASLt call: validated and tested up to this
#define LT_WS_BYTES ((size_t)32 << 20)

// Step upload buffer, in int32 units: fixed offsets derived from the caps.
struct step_layout {
    size_t meta, tok, pos, slot, rowseq, qs, ctx, tab, total;
};

struct cuda_be {
    rd_backend base;
    rd_backend_ops ops;         // this instance's (kv_dtype sets kv_elem_bytes / kv_scale_bytes)
    bool kv_fp8;                // kv_dtype fp8: E4M3 codes with a scale byte per (token, kv head)
    int dev;
    int n_sm;
    char dev_name[256];
    size_t total_mem;
    cudaStream_t st, aux;
    std::mutex aux_mu;
    std::atomic<const void *> owner; // thread owning st (see on_owner)
    int err;                    // sticky: first failure of a void op
    char errmsg[400];
    bool capturing;
    uint64_t capture_epoch;
    uint64_t epoch;             // bumped when a buffer a graph may use moves
    // step metadata
    int32_t *h_step, *d_step;
    int32_t rows_cap, tables_cap;
    step_layout L;
    cudaEvent_t step_ev;
    bool step_ev_live;
    int32_t step_rows, step_max_parts;
    // attention partials
    float *part_o, *part_ms;
    int32_t part_rows_cap, parts_cap, part_heads, part_hd;
    bool attn_fuse;             // the combine inside the partition kernel (RD_CUDA_ATTN_FUSE=0: its own kernel)
    bool attn_v0;               // RD_CUDA_ATTN_V0=1: session 30's schedule (2 waves, at most 16 CTAs per row and kv
                                // head, one key per load), to time against; the same bits
    unsigned *attn_count;       // its arrival counters [rows][n_kv], zero between launches
    size_t attn_count_cap;      // bytes
    bool attn_checked;
    // GEMM input
    uint16_t *xb;
    size_t xb_cap;
    shadow sh[N_SHADOW];
    uint64_t sh_tick;
    bool use_shadow;
    bool split;                 // bf16 copies of GEMM inputs hold hi + lo (RD_CUDA_ACT=bf16: hi only)
    bool split_contracting_only; // RD_CUDA_ACT=mixed: only GEMMs with in > out (down) use lo
    float *ysplit;              // [2][rows][out] the split GEMM's two halves
    size_t ysplit_cap;          // bytes
    bool head_fp32;             // RD_CUDA_HEAD=fp32: the LM head from an fp32 copy of the table
    float *yhead;               // [3][HEAD_ROWS][vocab] the LM head's three partial products
    size_t yhead_cap;           // bytes
    // The last split GEMM's sum, deferred: RMSNorm, RoPE or SwiGLU reading
    // pend_y completes it as it loads (one kernel less per GEMM); any other
    // op, copy or sync launches it first (settle). RD_CUDA_FUSE=0
    // (fuse_split false): nothing is deferred, neither sums nor RoPE.
    bool fuse_split;
    float *pend_y;              // destination of the deferred sum; NULL: none
    split_sum pend;
    // A RoPE deferred the same way (with the sum it took, if any): the KV
    // write that follows on the same q|k|v rows runs inside it.
    struct {
        float *x;               // NULL: none
        int32_t stride, m, n_heads, head_dim;
        const int32_t *positions;
        const float *cos_sin;
        split_sum ss;
        // the per-head RMSNorm it absorbed (nw NULL: none): heads < n_first with nw, the rest with nw2
        const float *nw, *nw2;
        int32_t n_first;
        float eps, w_off;
    } pend_rope;
    // A tensor-core GEMM deferred the same way: a SwiGLU or GeGLU that reads
    // all of its output next runs as its epilogue (TC_SWIGLU / TC_GEGLU).
    struct pend_norm_t {
        const float *x;         // NULL: none
        const float *w;
        int32_t m, d;
        float eps, w_off;
        float *out;
    };
    struct {
        const weight *W;        // NULL: none
        const float *x;
        int32_t m;
        float *y;
        int acc;
        pend_norm_t norm;       // its RMSNorm prologue (norm.x NULL: none)
        const float *bias;      // a bias added to its whole output (Qwen2's q|k|v), in its epilogue; NULL: none
        struct {                // a RoPE on its output, deferred with it (heads 0: none): its epilogue
            int32_t heads, head_dim;
            const int32_t *positions;
            const float *cos_sin;
        } rope;
        struct {                // per-head RMSNorms on its first heads, deferred with it (heads 0: none): with
                                // a RoPE on exactly those heads, the epilogue's first step; else run after it
            int32_t heads, head_dim, n_first; // heads < n_first with w, the rest (a joined k norm) with w2
            const float *w, *w2;
            float eps, w_off;
        } hnorm;
        decltype(tc_args::lora) lora; // lora_apply calls on its output whose expand is its epilogue (n 0: none)
        lora_args lora_shr[TC_LORA_MAX]; // and their shrinks, launched together just before it
    } pend_tc;
    // An RMSNorm of at most tc_norm_rows rows deferred in tensor-core mode:
    // a tensor-core GEMM reading its output next runs it as its prologue.
    pend_norm_t pend_norm;
    // A per-head RMSNorm deferred (RD_CUDA_FUSE): the next one, on the heads
    // right after it in the same rows (Qwen3's and Gemma 3's k norm after the
    // q norm), runs in the same launch.
    struct {
        float *x;               // NULL: none
        int32_t stride, m, n_heads, head_dim;
        const float *w, *w2;    // heads < n_first with w, the rest (a joined k norm) with w2
        int32_t n_first;
        float eps, w_off;
        split_sum ss;           // the sum it took from the GEMM before it
    } pend_hnorm;
    int32_t tc_norm_rows;       // RD_CUDA_NORM_ROWS (default 8; 0: never)
    bool norm_v0;               // RD_CUDA_NORM_V0=1: k_rmsnorm's loop form at every width (its register form's baseline)
    bool tc_route;              // tc mode: moe_route as the router GEMM's finishing step (RD_CUDA_TC_ROUTE=0: k_moe_route)
    bool tc_normadd;            // tc mode: rmsnorm_add as the projection's finishing step (RD_CUDA_TC_NORMADD=0: k_rmsnorm)
    bool tc_lora;               // tc mode: lora_apply's expand in the pending GEMM's epilogue (RD_CUDA_TC_LORA=0: its own)
    bool tc_hnorm;              // tc mode: q/k norms + RoPE + KV write in the q|k|v GEMM's epilogue (RD_CUDA_TC_HNORM=0: k_hnorm_rope)
    int32_t tc_big_rows;        // RD_CUDA_TC_BIG_ROWS: the tile kernel from this many rows (default 128; 0: never)
    int32_t tc_tile;            // RD_CUDA_TC_TILE: its tile side, 64 (default) or 128
    int tc_wmajor;              // RD_CUDA_TC_ORDER=weight: the tile kernels' grid with weight tiles fastest (tc_tile_grid)
    int tc_stages;              // RD_CUDA_TC_PIPE: the tile kernel's cp.async stages, 4 by default; 0: register staging
    int tc_wg;                  // RD_CUDA_TC_WG=1, 2, 4 (compute capability 9.0 only): the wgmma tile kernel
                                // (cuda_gemm_tc_wg.cu) with that many warpgroups a CTA; -1 (auto): per call,
                                // cuplan_wg_groups; 0: the mma.sync ones
    bool gemm_simple_only;
    bool gemm_tc;               // RD_CUDA_GEMM=tc: bf16 linears on the tensor-core GEMM (cuda_gemm_tc.cuh)
    bool fp8_tc;                // RD_CUDA_FP8=tc or w8a8: FP8 linears on it too
    bool fp8_q8;                // RD_CUDA_FP8=w8a8: with x quantized to E4M3, on FP8 tensor cores (TC_Q8)
    bool q8_tc;                 // RD_CUDA_Q8=tc or w8a8: Q8_0 weights kept as Q8_0 (linears on the tensor-core GEMM)
    bool q8_i8;                 // RD_CUDA_Q8=w8a8: their linears with x quantized to Q8_0, on int8 tensor cores (TC_I8)
    bool moe_tc;                // RD_CUDA_MOE=tc: the MoE experts on tensor cores (cuda_moe_tc.cu)
    float *tc_part;             // its sub-piece sums [q][rows][out] (plans with p > 1)
    size_t tc_part_cap;         // bytes
    unsigned *tc_count;         // its arrival counters, zero between launches
    size_t tc_count_cap;        // bytes
    std::mutex choice_mu;
    std::vector<gemm_choice *> choices;
    std::vector<std::pair<std::pair<int32_t, int32_t>, cuplan_tc>> tc_plans; // (out, in) -> plan, for describe()
#ifndef RD_CUDA_EMU
    cublasLtHandle_t lt, lt_aux;
    void *ws, *ws_aux;
#endif
    // mixture of experts: moe_ffn's scratch (grown outside capture) and its tables
    int32_t *moe_idx;           // [n_experts + 1] offsets, [m k] route order, [n_experts] routed experts
    size_t moe_idx_cap;         // bytes
    float *moe_act, *moe_h;     // [m k][ffn], [m k][dim]
    size_t moe_act_cap, moe_h_cap;
    std::vector<moe_table *> moe_tables;
    unsigned *moe_count;        // the down kernel's fused-combine arrival counters, zero between launches
    size_t moe_count_cap;       // bytes
    // LoRA: lora_apply's tables and its A x scratch [m][max_rank] (grown outside capture)
    std::vector<lora_table *> lora_tables;
    float *lora_t;
    size_t lora_t_cap;          // bytes
    // sampling
    sample_req *d_sreq, *h_sreq;
    sample_res *d_sres, *h_sres;
    int32_t s_cap;
    sample_edit *d_sedit, *h_sedit; // [all requests' edits], concatenated in request order
    size_t d_sedit_cap, h_sedit_cap; // bytes
    float *d_sproc;             // [requests with edits][vocab] their edited rows
    size_t sproc_cap;           // bytes
    bool sample_cta;            // RD_CUDA_SAMPLE=cta: one CTA per request over its whole row (no tiles)
    samp_tile *d_stile;         // the tiled sampler's [requests][samp_tiles(vocab)] partials
    uint64_t *d_stop;           // [requests][tiles][largest n_top] each tile's top keys
    unsigned *d_scount;         // [requests] arrival counters, zero between launches
    samp_cut *d_scut;           // [requests] the key searches of draws with a cut
    samp_bin *d_sbin;           // [draws with a cut][tiles][256] their rounds' histograms
    size_t stile_cap, stop_cap, scount_cap, scut_cap, sbin_cap; // bytes
};

static cuda_be *impl(rd_backend *be) { return (cuda_be *)be->impl; }

// The thread that last enqueued compute work (a kernel, a step upload, a
// graph) owns the compute stream: its memory ops go on that stream, in order
// with its kernels. Any other thread's are synchronous on the aux stream.
// Ownership is exclusive: the last thread to claim it owns the stream.
static thread_local char t_me; // its address names the thread
static bool on_owner(const cuda_be *b) { return b->owner.load(std::memory_order_relaxed) == &t_me; }

// The backend of a compute op, claiming the compute stream for this thread.
static cuda_be *compute(rd_backend *be)
{
    cuda_be *b = impl(be);
    b->owner.store(&t_me, std::memory_order_relaxed);
    return b;
}

static void fail(cuda_be *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void fail(cuda_be *b, const char *fmt, ...)
{
    if (b->err)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(b->errmsg, sizeof b->errmsg, fmt, ap);
    va_end(ap);
    b->err = RD_EIO;
}

static bool check_launch(cuda_be *b, const char *what)
{
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) {
        fail(b, "cuda: %s: %s", what, cudaGetErrorString(e));
        return false;
    }
    return true;
}

// Launches the deferred RoPE, writing the KV cache too when kv.kc is set.
static void launch_pending_rope(cuda_be *b, kv_out kv)
{
    const auto &r = b->pend_rope;
    if (r.nw)
        launch_hnorm_rope(b->st, r.x, r.stride, r.m, r.n_heads, r.head_dim, r.nw, r.n_first, r.nw2, r.eps, r.w_off, r.ss,
                          r.positions, r.cos_sin, kv);
    else
        launch_rope(b->st, r.x, r.stride, r.m, r.n_heads, r.head_dim, r.positions, r.cos_sin, r.ss, kv);
    b->pend_rope.x = nullptr;
    check_launch(b, "rope");
}

// Launches whatever is deferred (on the owner thread's stream).
static void launch_pending_tc(cuda_be *b, int epi, float *out, kv_out kv = kv_out{nullptr, 0, 0, nullptr, nullptr});

static void launch_pending_norm(cuda_be *b)
{
    const auto p = b->pend_norm;
    b->pend_norm.x = nullptr;
    launch_rmsnorm(b->st, (float *)p.x, p.w, p.m, p.d, p.eps, p.w_off, p.out, nullptr, 0, split_sum{nullptr, 0, 0},
                   nullptr, b->norm_v0);
    check_launch(b, "rmsnorm");
}

static void launch_pending_hnorm(cuda_be *b)
{
    const auto p = b->pend_hnorm;
    b->pend_hnorm.x = nullptr;
    launch_head_rmsnorm(b->st, p.x, p.stride, p.m, p.n_heads, p.head_dim, p.w, p.n_first, p.w2, p.eps, p.w_off, p.ss);
    check_launch(b, "head_rmsnorm");
}

// Everything deferred but a split sum: at most one of these is pending at a
// time (each op launches the others first), a split sum possibly beside them.
static void launch_pending_ops(cuda_be *b)
{
    if (b->pend_hnorm.x)
        launch_pending_hnorm(b);
    if (b->pend_norm.x)
        launch_pending_norm(b);
    if (b->pend_tc.W)
        launch_pending_tc(b, TC_PLAIN, nullptr);
    if (b->pend_rope.x)
        launch_pending_rope(b, kv_out{nullptr, 0, 0, nullptr, nullptr});
}

static void settle(cuda_be *b)
{
    launch_pending_ops(b);
    if (!b->pend_y)
        return;
    launch_add_split(b->st, b->pend.t, b->pend.n, b->pend_y, b->pend.acc);
    b->pend_y = nullptr;
    check_launch(b, "add_split");
}

// A compute op that reads no deferred sum: it is launched first.
static cuda_be *compute_op(rd_backend *be)
{
    cuda_be *b = compute(be);
    settle(b);
    return b;
}

// For an op that reads y[n] first: the deferred sum if it is y's (the op
// completes it), else none. Everything else deferred (another sum, a RoPE:
// the op may read what it rotates) is launched first, so the op comes after
// it on the stream.
static split_sum take_split(cuda_be *b, const float *y, int64_t n)
{
    split_sum none = {nullptr, 0, 0};
    launch_pending_ops(b);
    if (!b->pend_y)
        return none;
    if (b->pend_y != y || b->pend.n != n) {
        settle(b);
        return none;
    }
    b->pend_y = nullptr;
    return b->pend;
}

// Reports (and clears) the sticky error.
static int take_err(cuda_be *b)
{
    if (!b->err)
        return 0;
    int code = b->err;
    b->err = 0;
    return rd_fail(code, "%s", b->errmsg);
}

static int cuda_fail(cudaError_t e, const char *what)
{
    return rd_fail(e == cudaErrorMemoryAllocation ? RD_ENOMEM : RD_EIO, "cuda: %s: %s", what, cudaGetErrorString(e));
}

// (Re)allocates device memory to hold `need` bytes; a move bumps the epoch
// (captured graphs that used the old buffer must not run again).
static bool grow(cuda_be *b, void **p, size_t *cap_bytes, size_t need, const char *what)
{
    if (*p && *cap_bytes >= need)
        return true;
    if (b->capturing) {
        fail(b, "cuda: %s needs %zu bytes while a graph is being captured (run the step once uncaptured first)",
             what, need);
        return false;
    }
    size_t cap = *cap_bytes ? *cap_bytes : 4096;
    while (cap < need)
        cap *= 2;
    void *q = nullptr;
    cudaError_t e = cudaMalloc(&q, cap);
    if (e != cudaSuccess) {
        fail(b, "cuda: cannot allocate %zu bytes for %s: %s", cap, what, cudaGetErrorString(e));
        return false;
    }
    if (*p)
        cudaFree(*p);
    *p = q;
    *cap_bytes = cap;
    b->epoch++;
    return true;
}

// ------------------------------------------------------------------ shadows
//
// rmsnorm, attention, swiglu and geglu write a bf16 copy of their fp32
// output next to it; a linear layer whose input is that buffer (same pointer,
// same element count) reads the copy instead of converting. The copy is exactly
// what the conversion would produce (same rounding), so this only saves a
// kernel. Any write to a range drops the copies that overlap it.

static void shadow_written(cuda_be *b, const void *p, size_t bytes)
{
    const char *lo = (const char *)p, *hi = lo + bytes;
    for (shadow &s : b->sh) {
        if (!s.n)
            continue;
        const char *slo = (const char *)s.f32, *shi = slo + s.n * sizeof(float);
        if (slo < hi && lo < shi)
            s.n = 0;
    }
}

// Forgets every copy (host bookkeeping only): at step and graph boundaries,
// so that what a graph replay wrote can never be mistaken for a fresh copy.
static void shadow_reset(cuda_be *b)
{
    for (shadow &s : b->sh)
        s.n = 0;
}

// The bf16 buffer to fill for fp32 output `out` of n elements (NULL: none).
static uint16_t *shadow_claim(cuda_be *b, const float *out, size_t n)
{
    shadow_written(b, out, n * sizeof(float));
    if (!b->use_shadow)
        return nullptr;
    shadow *pick = nullptr;
    for (shadow &s : b->sh)
        if (s.f32 == out) {
            pick = &s;
            break;
        }
    if (!pick) {
        pick = &b->sh[0];
        for (shadow &s : b->sh)
            if (s.used < pick->used)
                pick = &s;
        pick->f32 = out;
        pick->n = 0;
    }
    size_t cap_bytes = pick->cap * sizeof(uint16_t), need = n * (b->split ? 2 : 1);
    if (pick->cap < need && b->capturing) {
        pick->f32 = nullptr; // not fatal: the linear layer converts instead
        return nullptr;
    }
    if (!grow(b, (void **)&pick->bf, &cap_bytes, need * sizeof(uint16_t), "a bf16 activation copy")) {
        pick->f32 = nullptr;
        return nullptr;
    }
    pick->cap = cap_bytes / sizeof(uint16_t);
    pick->used = ++b->sh_tick;
    return pick->bf;
}

static void shadow_commit(cuda_be *b, const float *out, size_t n)
{
    for (shadow &s : b->sh)
        if (s.f32 == out)
            s.n = n;
}

static const uint16_t *shadow_find(cuda_be *b, const float *x, size_t n)
{
    for (shadow &s : b->sh)
        if (s.n && s.f32 == x && s.n == n) {
            s.used = ++b->sh_tick;
            return s.bf;
        }
    return nullptr;
}

// ------------------------------------------------------------------ memory ops

static void *cu_alloc(rd_backend *be, size_t bytes)
{
    cuda_be *b = impl(be);
    if (b->capturing && on_owner(b)) {
        fail(b, "cuda: alloc during graph capture");
        return nullptr;
    }
    void *p = nullptr;
    if (cudaMalloc(&p, bytes ? bytes : 1) != cudaSuccess) {
        cudaGetLastError();
        return nullptr;
    }
    cudaError_t e;
    if (on_owner(b)) {
        e = cudaMemsetAsync(p, 0, bytes, b->st);
    } else {
        std::lock_guard<std::mutex> g(b->aux_mu);
        e = cudaMemsetAsync(p, 0, bytes, b->aux);
        if (e == cudaSuccess)
            e = cudaStreamSynchronize(b->aux);
    }
    if (e != cudaSuccess) {
        cudaFree(p);
        return nullptr;
    }
    return p;
}

static void cu_free(rd_backend *be, void *p)
{
    cuda_be *b = impl(be);
    if (!p)
        return;
    if (on_owner(b))
        shadow_written(b, p, 1); // a freed buffer's start can no longer be a shadow key
    for (shadow &s : b->sh)
        if (on_owner(b) && s.f32 == p)
            s.f32 = nullptr, s.n = 0;
    cudaFree(p);
}

static int copy(cuda_be *b, void *dst, const void *src, size_t bytes, cudaMemcpyKind kind, const char *what)
{
    if (!bytes)
        return 0;
    cudaError_t e;
    if (on_owner(b)) {
        if (b->capturing) {
            fail(b, "cuda: %s during graph capture", what);
            return take_err(b);
        }
        settle(b);
        if (kind != cudaMemcpyDeviceToHost)
            shadow_written(b, dst, bytes);
        e = cudaMemcpyAsync(dst, src, bytes, kind, b->st);
        if (e == cudaSuccess && kind == cudaMemcpyDeviceToHost)
            e = cudaStreamSynchronize(b->st); // the CPU backend's d2h is immediate too
    } else {
        std::lock_guard<std::mutex> g(b->aux_mu);
        e = cudaMemcpyAsync(dst, src, bytes, kind, b->aux);
        if (e == cudaSuccess)
            e = cudaStreamSynchronize(b->aux);
    }
    if (e != cudaSuccess)
        return cuda_fail(e, what);
    return on_owner(b) ? take_err(b) : 0;
}

static int cu_h2d(rd_backend *be, void *dst, const void *src, size_t bytes)
{
    return copy(impl(be), dst, src, bytes, cudaMemcpyHostToDevice, "h2d");
}

static int cu_d2h(rd_backend *be, void *dst, const void *src, size_t bytes)
{
    return copy(impl(be), dst, src, bytes, cudaMemcpyDeviceToHost, "d2h");
}

static int cu_d2d(rd_backend *be, void *dst, const void *src, size_t bytes)
{
    return copy(impl(be), dst, src, bytes, cudaMemcpyDeviceToDevice, "d2d");
}

static int cu_sync(rd_backend *be)
{
    cuda_be *b = impl(be);
    if (!on_owner(b))
        return 0; // other threads' ops are synchronous
    if (b->capturing) {
        fail(b, "cuda: sync during graph capture");
        return take_err(b);
    }
    settle(b);
    cudaError_t e = cudaStreamSynchronize(b->st);
    if (e != cudaSuccess)
        return cuda_fail(e, "stream synchronize");
    return take_err(b);
}

static int cu_mem_info(rd_backend *be, size_t *free_b, size_t *total_b)
{
    cudaError_t e = cudaMemGetInfo(free_b, total_b);
    return e == cudaSuccess ? 0 : cuda_fail(e, "cudaMemGetInfo");
}

// ------------------------------------------------------------------ GEMM choice

static const char *env(const char *k)
{
    const char *v = getenv(k);
    return v && *v ? v : nullptr;
}

#ifndef RD_CUDA_EMU
struct lt_problem {
    cublasLtMatmulDesc_t desc = nullptr;
    cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
};

static void lt_free(lt_problem *p)
{
    if (p->a) cublasLtMatrixLayoutDestroy(p->a);
    if (p->b) cublasLtMatrixLayoutDestroy(p->b);
    if (p->c) cublasLtMatrixLayoutDestroy(p->c);
    if (p->desc) cublasLtMatmulDescDestroy(p->desc);
    *p = lt_problem();
}

// Row-major y[n][out] = x[n][in] . W^T as column-major D(out x n) =
// op(A) B with A = W stored (in x out, ld in), op = T; B = x (in x n, ld in).
static cublasStatus_t lt_make(lt_problem *p, int32_t out, int32_t in, int32_t n, int f32)
{
    const cudaDataType_t ab = f32 ? CUDA_R_32F : CUDA_R_16BF;
    cublasStatus_t s = cublasLtMatmulDescCreate(&p->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F);
    const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
    if (s == CUBLAS_STATUS_SUCCESS)
        s = cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta);
    if (s == CUBLAS_STATUS_SUCCESS)
        s = cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb);
    if (s == CUBLAS_STATUS_SUCCESS)
        s = cublasLtMatrixLayoutCreate(&p->a, ab, (uint64_t)in, (uint64_t)out, (int64_t)in);
    if (s == CUBLAS_STATUS_SUCCESS)
        s = cublasLtMatrixLayoutCreate(&p->b, ab, (uint64_t)in, (uint64_t)n, (int64_t)in);
    if (s == CUBLAS_STATUS_SUCCESS)
        s = cublasLtMatrixLayoutCreate(&p->c, CUDA_R_32F, (uint64_t)out, (uint64_t)n, (int64_t)out);
    if (s != CUBLAS_STATUS_SUCCESS)
        lt_free(p);
    return s;
}

static cublasStatus_t lt_run(cublasLtHandle_t lt, const lt_problem &p, const cublasLtMatmulAlgo_t *algo,
                             const void *A, const void *B, float *C, float beta, void *ws, cudaStream_t st)
{
    const float alpha = 1.0f;
    return cublasLtMatmul(lt, p.desc, &alpha, A, p.a, B, p.b, &beta, C, p.c, C, p.c, algo, ws, LT_WS_BYTES, st);
}

// Candidates from the heuristic at n = 1 and n = 64, no split-K, no
// reduction scheme; each checked for validity at every check size, then for
// batch invariance on the device, then timed. Runs on stream st.
static void lt_select(cublasLtHandle_t lt, void *ws, cudaStream_t st, const void *A, gemm_choice *ch)
{
    const int32_t out = ch->out, in = ch->in;
    const int f32 = ch->f32;
    int32_t sizes[32];
    const int n_sizes = cuplan_gemm_check_sizes(sizes, 32);
    const int32_t nmax = sizes[n_sizes - 1];
    std::vector<cublasLtMatmulAlgo_t> cands;

    cublasLtMatmulPreference_t pref = nullptr;
    cublasLtMatmulPreferenceCreate(&pref);
    const uint64_t wsb = LT_WS_BYTES;
    const uint32_t red = CUBLASLT_REDUCTION_SCHEME_NONE;
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &wsb, sizeof wsb);
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, &red, sizeof red);
    const int32_t probe[3] = {64, 1, 256};
    for (int pi = 0; pi < 3; pi++) {
        lt_problem p;
        if (lt_make(&p, out, in, probe[pi], f32) != CUBLAS_STATUS_SUCCESS)
            continue;
        cublasLtMatmulHeuristicResult_t res[16];
        int nres = 0;
        if (cublasLtMatmulAlgoGetHeuristic(lt, p.desc, p.a, p.b, p.c, p.c, pref, 16, res, &nres) ==
            CUBLAS_STATUS_SUCCESS) {
            for (int i = 0; i < nres && cands.size() < 10; i++) {
                if (res[i].state != CUBLAS_STATUS_SUCCESS)
                    continue;
                int32_t splitk = 1;
                uint32_t scheme = 0;
                size_t wr = 0;
                cublasLtMatmulAlgoConfigGetAttribute(&res[i].algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &splitk,
                                                     sizeof splitk, &wr);
                cublasLtMatmulAlgoConfigGetAttribute(&res[i].algo, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, &scheme,
                                                     sizeof scheme, &wr);
                if (splitk > 1 || scheme != CUBLASLT_REDUCTION_SCHEME_NONE)
                    continue;
                bool dup = false;
                for (auto &c : cands)
                    dup |= memcmp(&c, &res[i].algo, sizeof c) == 0;
                if (!dup)
                    cands.push_back(res[i].algo);
            }
        }
        lt_free(&p);
    }
    cublasLtMatmulPreferenceDestroy(pref);

    const size_t ab = f32 ? 4 : 2;
    void *X = nullptr;
    float *Yref = nullptr, *Y = nullptr;
    unsigned *bad = nullptr;
    cudaEvent_t e0 = nullptr, e1 = nullptr;
    bool ok = cudaMalloc(&X, (size_t)nmax * in * ab) == cudaSuccess &&
              cudaMalloc((void **)&Yref, (size_t)nmax * out * 4) == cudaSuccess &&
              cudaMalloc((void **)&Y, (size_t)nmax * out * 4) == cudaSuccess &&
              cudaMalloc((void **)&bad, 16 * sizeof(unsigned)) == cudaSuccess && cudaEventCreate(&e0) == cudaSuccess &&
              cudaEventCreate(&e1) == cudaSuccess;
    std::vector<cuplan_gemm_cand> score(cands.size());
    if (ok) {
        if (f32)
            launch_fill_random(st, (float *)X, (int64_t)nmax * in, 12345u);
        else
            launch_fill_random(st, (uint16_t *)X, (int64_t)nmax * in, 12345u);
        cudaMemsetAsync(bad, 0, 16 * sizeof(unsigned), st);
        std::vector<lt_problem> probs(n_sizes);
        bool made = true;
        for (int si = 0; si < n_sizes; si++)
            made &= lt_make(&probs[si], out, in, sizes[si], f32) == CUBLAS_STATUS_SUCCESS;
        for (size_t ci = 0; made && ci < cands.size(); ci++) {
            cuplan_gemm_cand &sc = score[ci];
            sc.invariant = 0;
            sc.t_small = sc.t_mid = sc.t_large = -1;
            // Valid for every row count a call can have (gemm() cuts larger ones).
            bool valid = true;
            for (int32_t rows = 1; rows <= GEMM_MAX_ROWS && valid; rows++) {
                lt_problem p;
                cublasLtMatmulHeuristicResult_t chk;
                valid = lt_make(&p, out, in, rows, f32) == CUBLAS_STATUS_SUCCESS &&
                        cublasLtMatmulAlgoCheck(lt, p.desc, p.a, p.b, p.c, p.c, &cands[ci], &chk) ==
                            CUBLAS_STATUS_SUCCESS &&
                        chk.workspaceSize <= LT_WS_BYTES;
                lt_free(&p);
            }
            if (!valid)
                continue;
            unsigned *cnt = bad + ci;
            valid = lt_run(lt, probs[n_sizes - 1], &cands[ci], A, X, Yref, 0.0f, ws, st) == CUBLAS_STATUS_SUCCESS;
            for (int si = 0; si + 1 < n_sizes && valid; si++) {
                valid = lt_run(lt, probs[si], &cands[ci], A, X, Y, 0.0f, ws, st) == CUBLAS_STATUS_SUCCESS;
                launch_count_mismatch(st, Y, out, Yref, out, sizes[si], out, cnt);
            }
            // Timing: M = 1, 64 and 256, 5 runs each after a warm-up.
            int at[3] = {0, 0, 0};
            for (int si = 0; si < n_sizes; si++) {
                if (sizes[si] == 64)
                    at[1] = si;
                if (sizes[si] == 256)
                    at[2] = si;
            }
            double t[3] = {-1, -1, -1};
            for (int k = 0; k < 3 && valid; k++) {
                const lt_problem &p = probs[at[k]];
                lt_run(lt, p, &cands[ci], A, X, Y, 0.0f, ws, st);
                cudaEventRecord(e0, st);
                for (int r = 0; r < 5; r++)
                    lt_run(lt, p, &cands[ci], A, X, Y, 0.0f, ws, st);
                cudaEventRecord(e1, st);
                float ms = 0;
                if (cudaEventSynchronize(e1) == cudaSuccess && cudaEventElapsedTime(&ms, e0, e1) == cudaSuccess)
                    t[k] = ms / 5e3;
            }
            unsigned nbad = 1;
            if (valid && cudaMemcpyAsync(&nbad, cnt, sizeof nbad, cudaMemcpyDeviceToHost, st) == cudaSuccess &&
                cudaStreamSynchronize(st) == cudaSuccess) {
                sc.invariant = nbad == 0;
                sc.t_small = t[0];
                sc.t_mid = t[1];
                sc.t_large = t[2];
            }
        }
        for (auto &p : probs)
            lt_free(&p);
    }
    cudaStreamSynchronize(st);
    cudaGetLastError();
    if (X) cudaFree(X);
    if (Yref) cudaFree(Yref);
    if (Y) cudaFree(Y);
    if (bad) cudaFree(bad);
    if (e0) cudaEventDestroy(e0);
    if (e1) cudaEventDestroy(e1);

    int n_inv = 0;
    for (auto &s : score)
        n_inv += s.invariant;
    const int best = cuplan_pick_gemm(score.data(), (int)score.size());
    if (best >= 0) {
        ch->lt = 1;
        ch->algo = cands[best];
        int32_t tile = 0, stages = 0, algo_id = 0;
        size_t wr = 0;
        cublasLtMatmulAlgoConfigGetAttribute(&ch->algo, CUBLASLT_ALGO_CONFIG_ID, &algo_id, sizeof algo_id, &wr);
        cublasLtMatmulAlgoConfigGetAttribute(&ch->algo, CUBLASLT_ALGO_CONFIG_TILE_ID, &tile, sizeof tile, &wr);
        cublasLtMatmulAlgoConfigGetAttribute(&ch->algo, CUBLASLT_ALGO_CONFIG_STAGES_ID, &stages, sizeof stages, &wr);
        snprintf(ch->what, sizeof ch->what, "cublasLt algo %d tile %d stages %d (%d/%zu candidates invariant)",
                 algo_id, tile, stages, n_inv, cands.size());
    } else {
        ch->lt = 0;
        snprintf(ch->what, sizeof ch->what, "fallback kernel (%d/%zu cublasLt candidates invariant)", n_inv,
                 cands.size());
        fprintf(stderr, "rolloutd cuda: GEMM %dx%d %s: no batch-invariant cublasLt algorithm; using the fallback "
                        "kernel\n", out, in, f32 ? "fp32" : "bf16");
    }
}
#endif

// The algorithm for shape (out, in, f32), chosen once per backend. A is the
// weight on the device (the self-test multiplies by it).
static gemm_choice *choose_gemm(cuda_be *b, int32_t out, int32_t in, int f32, const void *A, bool aux)
{
    std::lock_guard<std::mutex> g(b->choice_mu);
    for (gemm_choice *c : b->choices)
        if (c->out == out && c->in == in && c->f32 == f32)
            return c;
    gemm_choice *c = new gemm_choice();
    c->out = out;
    c->in = in;
    c->f32 = f32;
    c->lt = 0;
    snprintf(c->what, sizeof c->what, "fallback kernel%s", b->gemm_simple_only ? " (RD_CUDA_GEMM=simple)" : "");
#ifndef RD_CUDA_EMU
    if (!b->gemm_simple_only) {
        if (aux) {
            std::lock_guard<std::mutex> ga(b->aux_mu);
            lt_select(b->lt_aux, b->ws_aux, b->aux, A, c);
        } else {
            lt_select(b->lt, b->ws, b->st, A, c);
        }
    }
#else
    (void)A;
    (void)aux;
#endif
    b->choices.push_back(c);
    return c;
}

// ------------------------------------------------------------------ weights

// cudaMalloc + a copy of host, synchronous on the aux stream whatever the
// thread (the host buffer is freed right after). *dev is NULL on failure.
static int upload_new(cuda_be *b, void **dev, const void *host, size_t bytes, const char *what)
{
    *dev = nullptr;
    cudaError_t e = cudaMalloc(dev, bytes);
    if (e != cudaSuccess) {
        cudaGetLastError();
        *dev = nullptr;
        return rd_fail(RD_ENOMEM, "cuda: cannot allocate %zu bytes of device memory for %s", bytes, what);
    }
    std::lock_guard<std::mutex> g(b->aux_mu);
    e = cudaMemcpyAsync(*dev, host, bytes, cudaMemcpyHostToDevice, b->aux);
    if (e == cudaSuccess)
        e = cudaStreamSynchronize(b->aux);
    if (e != cudaSuccess) {
        cudaFree(*dev);
        *dev = nullptr;
        return cuda_fail(e, "uploading a weight");
    }
    return 0;
}

// Remembers a tensor-core plan for describe() (once per shape).
static void note_tc(cuda_be *b, int32_t out, int32_t in, const cuplan_tc &pl)
{
    std::lock_guard<std::mutex> g(b->choice_mu);
    for (const auto &e : b->tc_plans)
        if (e.first.first == out && e.first.second == in)
            return;
    b->tc_plans.push_back({{out, in}, pl});
}

static int cu_linear_load(rd_backend *be, const float *w, int32_t out, int32_t in, void **handle)
{
    cuda_be *b = impl(be);
    *handle = nullptr;
    if (out <= 0 || in <= 0)
        return rd_fail(RD_EINVAL, "cuda: linear_load shape [%d][%d] must be positive", out, in);
    const size_t n = (size_t)out * in;
    uint16_t *host = (uint16_t *)malloc(n * sizeof(uint16_t));
    weight *W = (weight *)calloc(1, sizeof(weight));
    if (!host || !W) {
        free(host);
        free(W);
        return rd_fail(RD_ENOMEM, "cuda: out of host memory converting a [%d][%d] weight", out, in);
    }
    cuplan_to_bf16(w, n, host);
    W->out = out;
    W->in = in;
    int rc = upload_new(b, (void **)&W->w, host, n * sizeof(uint16_t), "a weight");
    free(host);
    if (rc) {
        free(W);
        return rc;
    }
    W->ch = choose_gemm(b, out, in, 0, W->w, true);
    W->use_tc = b->gemm_tc && !cuplan_gemm_tc(out, in, b->n_sm, &W->tc);
    if (W->use_tc)
        note_tc(b, out, in, W->tc);
    *handle = W;
    return 0;
}

// Blocks of 32 one-byte codes after a scale of sbytes (FP8: 1, Q8_0's fp16
// d: 2), as parts hold them in row order, into codes [rows][in] and scales
// [rows][in / 32] (sbytes each).
static void split_blocks(const rd_wpart *parts, int32_t n_parts, int32_t in, size_t sbytes, uint8_t *codes,
                         uint8_t *scales)
{
    const size_t bb = sbytes + 32;  // bytes of a block
    size_t blk = 0;                 // blocks of the whole weight, in row order
    for (int32_t i = 0; i < n_parts; i++) {
        const uint8_t *src = (const uint8_t *)parts[i].data;
        for (size_t j = 0; j < (size_t)parts[i].rows * (in / 32); j++, blk++) {
            memcpy(scales + blk * sbytes, src + j * bb, sbytes);
            memcpy(codes + blk * 32, src + j * bb + sbytes, 32);
        }
    }
}

// FP8 blocks (serve_dtype fp8): the codes and the scale bytes go to the
// device as two arrays, [out][in] and [out][in / 32], which k_gemm_fp8 reads
// with aligned 16-byte loads.
static int load_fp8(cuda_be *b, const rd_wpart *parts, int32_t n_parts, int32_t out, int32_t in, void **handle)
{
    const size_t n = (size_t)out * in, nb = n / RD_FP8_BLOCK;
    uint8_t *codes = (uint8_t *)malloc(n), *scales = (uint8_t *)malloc(nb);
    weight *W = (weight *)calloc(1, sizeof(weight));
    if (!codes || !scales || !W) {
        free(codes), free(scales), free(W);
        return rd_fail(RD_ENOMEM, "cuda: out of host memory splitting a [%d][%d] fp8 weight", out, in);
    }
    split_blocks(parts, n_parts, in, RD_FP8_BYTES - RD_FP8_BLOCK, codes, scales);
    W->out = out;
    W->in = in;
    int rc = upload_new(b, (void **)&W->f8, codes, n, "an fp8 weight");
    if (!rc)
        rc = upload_new(b, (void **)&W->f8s, scales, nb, "an fp8 weight's scales");
    free(codes);
    free(scales);
    if (rc) {
        cudaFree(W->f8);
        free(W);
        return rc;
    }
    W->use_tc = b->fp8_tc && !cuplan_gemm_tc(out, in, b->n_sm, &W->tc);
    if (W->use_tc)
        note_tc(b, out, in, W->tc);
    *handle = W;
    return 0;
}

// Q8_0 blocks (RD_CUDA_Q8=tc; a layer's linear, the embedding or the LM
// head): the codes and the fp16 scales go to the device as two arrays,
// [out][in] and [out][in / 32], for the tensor-core GEMM (cuda_gemm_tc.cuh)
// and the embedding gather. 1 (nothing loaded) when the shape has no
// tensor-core plan: the caller takes the bf16 path.
#define Q8_BLOCK 32
#define Q8_BLOCK_BYTES 34       // fp16 d, then 32 int8 codes

static int load_q80(cuda_be *b, const rd_wpart *parts, int32_t n_parts, int32_t out, int32_t in, void **handle)
{
    cuplan_tc pl;
    if (cuplan_gemm_tc(out, in, b->n_sm, &pl))
        return 1;
    const size_t n = (size_t)out * in, nb = n / Q8_BLOCK;
    int8_t *codes = (int8_t *)malloc(n);
    uint16_t *scales = (uint16_t *)malloc(nb * sizeof(uint16_t));
    weight *W = (weight *)calloc(1, sizeof(weight));
    if (!codes || !scales || !W) {
        free(codes), free(scales), free(W);
        return rd_fail(RD_ENOMEM, "cuda: out of host memory splitting a [%d][%d] Q8_0 weight", out, in);
    }
    split_blocks(parts, n_parts, in, Q8_BLOCK_BYTES - Q8_BLOCK, (uint8_t *)codes, (uint8_t *)scales);
    W->out = out;
    W->in = in;
    int rc = upload_new(b, (void **)&W->q8, codes, n, "a Q8_0 weight");
    if (!rc)
        rc = upload_new(b, (void **)&W->q8d, scales, nb * sizeof(uint16_t), "a Q8_0 weight's scales");
    free(codes);
    free(scales);
    if (rc) {
        cudaFree(W->q8);
        free(W);
        return rc;
    }
    W->use_tc = true;
    W->tc = pl;
    note_tc(b, out, in, W->tc);
    *handle = W;
    return 0;
}

// File dtypes are dequantized on the host (engine/model/dequant.c) and take the
// fp32 path: the GPU keeps its bf16 copy. FP8 blocks stay FP8; Q8_0 stays
// Q8_0 under RD_CUDA_Q8=tc (linears, tables and MoE experts alike).
static int cu_linear_load_q(rd_backend *be, const rd_wpart *parts, int32_t n_parts, int32_t in, void **handle)
{
    *handle = nullptr;
    int64_t out = 0;
    int all_fp8 = 1, all_q8 = 1;
    for (int32_t i = 0; i < n_parts; i++) {
        out += parts[i].rows;
        all_fp8 &= parts[i].type == RD_TYPE_FP8_B32;
        all_q8 &= parts[i].type == GGML_Q8_0;
    }
    if (n_parts <= 0 || out <= 0 || in <= 0 || out > INT32_MAX)
        return rd_fail(RD_EINVAL, "cuda: linear_load_q with %d parts, %lld rows of %d", n_parts, (long long)out, in);
    if (all_fp8 && in % RD_FP8_BLOCK == 0)
        return load_fp8(impl(be), parts, n_parts, (int32_t)out, in, handle);
    if (all_q8 && impl(be)->q8_tc && in % Q8_BLOCK == 0) {
        const int rc = load_q80(impl(be), parts, n_parts, (int32_t)out, in, handle);
        if (rc <= 0)
            return rc;
    }
    float *w = (float *)malloc((size_t)out * in * sizeof(float));
    if (!w)
        return rd_fail(RD_ENOMEM, "cuda: out of host memory dequantizing a [%lld][%d] weight", (long long)out, in);
    int rc = 0;
    size_t at = 0;
    for (int32_t i = 0; i < n_parts && !rc; i++) {
        rc = ggml_dequant_row((ggml_type)parts[i].type, (const uint8_t *)parts[i].data, w + at,
                              (uint64_t)parts[i].rows * in);
        at += (size_t)parts[i].rows * in;
    }
    if (!rc)
        rc = cu_linear_load(be, w, (int32_t)out, in, handle);
    free(w);
    return rc;
}

static void cu_linear_free(rd_backend *be, void *handle)
{
    weight *W = (weight *)handle;
    if (!W)
        return;
    cudaFree(W->w);
    cudaFree(W->f8);
    cudaFree(W->f8s);
    cudaFree(W->q8);
    cudaFree(W->q8d);
    if (W->w32)
        cudaFree(W->w32);
    free(W);
}

// An FP8 weight's values, exactly (codes times their block's power of two).
static int read_fp8(cuda_be *b, const weight *W, float *w_host)
{
    const size_t n = (size_t)W->out * W->in, nb = n / RD_FP8_BLOCK;
    uint8_t *blocks = (uint8_t *)malloc(nb * RD_FP8_BYTES), *codes = (uint8_t *)malloc(n), *scales = (uint8_t *)malloc(nb);
    int rc = blocks && codes && scales ? 0 : rd_fail(RD_ENOMEM, "cuda: out of host memory reading an fp8 weight back");
    if (!rc)
        rc = copy(b, codes, W->f8, n, cudaMemcpyDeviceToHost, "reading an fp8 weight back");
    if (!rc)
        rc = copy(b, scales, W->f8s, nb, cudaMemcpyDeviceToHost, "reading an fp8 weight's scales back");
    if (!rc) {
        for (size_t j = 0; j < nb; j++) {
            blocks[j * RD_FP8_BYTES] = scales[j];
            memcpy(blocks + j * RD_FP8_BYTES + 1, codes + j * RD_FP8_BLOCK, RD_FP8_BLOCK);
        }
        rd_fp8_dequant(blocks, w_host, nb);
    }
    free(blocks), free(codes), free(scales);
    return rc;
}

// Rows [row0, row0 + rows) of a Q8_0 weight as the file's blocks (fp16 d, 32 codes).
static int read_q80_blocks(cuda_be *b, const weight *W, int32_t row0, int32_t rows, uint8_t *dst)
{
    const size_t bpr = (size_t)W->in / Q8_BLOCK, nb = (size_t)rows * bpr;
    int8_t *codes = (int8_t *)malloc(nb * Q8_BLOCK);
    uint16_t *scales = (uint16_t *)malloc(nb * sizeof(uint16_t));
    int rc = codes && scales ? 0 : rd_fail(RD_ENOMEM, "cuda: out of host memory reading a Q8_0 weight back");
    if (!rc)
        rc = copy(b, codes, W->q8 + (size_t)row0 * W->in, nb * Q8_BLOCK, cudaMemcpyDeviceToHost,
                  "reading a Q8_0 weight back");
    if (!rc)
        rc = copy(b, scales, W->q8d + (size_t)row0 * bpr, nb * sizeof(uint16_t), cudaMemcpyDeviceToHost,
                  "reading a Q8_0 weight's scales back");
    for (size_t j = 0; !rc && j < nb; j++) {
        memcpy(dst + j * Q8_BLOCK_BYTES, &scales[j], sizeof(uint16_t));
        memcpy(dst + j * Q8_BLOCK_BYTES + 2, codes + j * Q8_BLOCK, Q8_BLOCK);
    }
    free(codes), free(scales);
    return rc;
}

// A Q8_0 weight's values, exactly as ggml_dequant_row gives them (code x d).
static int read_q80(cuda_be *b, const weight *W, float *w_host)
{
    const size_t n = (size_t)W->out * W->in;
    uint8_t *blocks = (uint8_t *)malloc(n / Q8_BLOCK * Q8_BLOCK_BYTES);
    int rc = blocks ? read_q80_blocks(b, W, 0, W->out, blocks)
                    : rd_fail(RD_ENOMEM, "cuda: out of host memory reading a Q8_0 weight back");
    if (!rc)
        rc = ggml_dequant_row(GGML_Q8_0, blocks, w_host, n);
    free(blocks);
    return rc;
}

static int cu_linear_read(rd_backend *be, const void *handle, float *w_host)
{
    cuda_be *b = impl(be);
    const weight *W = (const weight *)handle;
    const size_t n = (size_t)W->out * W->in;
    if (W->f8)
        return read_fp8(b, W, w_host);
    if (W->q8)
        return read_q80(b, W, w_host);
    uint16_t *host = (uint16_t *)malloc(n * sizeof(uint16_t));
    if (!host)
        return rd_fail(RD_ENOMEM, "cuda: out of host memory reading a weight back");
    int rc = copy(b, host, W->w, n * sizeof(uint16_t), cudaMemcpyDeviceToHost, "reading a weight back");
    if (!rc)
        cuplan_from_bf16(host, n, w_host);
    free(host);
    return rc;
}

// The device holds every weight as bf16 [out][in], so bf16 rows come back as
// one copy; any other type is not what the device holds.
static int cu_linear_read_native(rd_backend *be, const void *handle, int32_t type, int32_t row0, int32_t rows,
                                 void *dst)
{
    cuda_be *b = impl(be);
    const weight *W = (const weight *)handle;
    if (row0 < 0 || rows <= 0 || row0 + rows > W->out)
        return rd_fail(RD_EINVAL, "cuda: rows [%d, %d) of a %d-row weight", row0, row0 + rows, W->out);
    if (type == GGML_Q8_0 && W->q8)
        return read_q80_blocks(b, W, row0, rows, (uint8_t *)dst);
    if (type != GGML_BF16 || !W->w)
        return RD_ENOTSUP;
    return copy(b, dst, W->w + (size_t)row0 * W->in, (size_t)rows * W->in * sizeof(uint16_t),
                cudaMemcpyDeviceToHost, "reading a weight's bf16 rows back");
}

// ------------------------------------------------------------------ compute ops

static void gemm(cuda_be *b, gemm_choice *ch, const void *A, const void *x, int32_t m, float *y, int acc)
{
#ifndef RD_CUDA_EMU
    if (ch->lt) {
        // Rows are independent, so cutting a tall GEMM into calls of at most
        // GEMM_MAX_ROWS rows changes no bit of the result.
        const size_t xs = ch->f32 ? sizeof(float) : sizeof(uint16_t);
        for (int32_t r0 = 0; r0 < m; r0 += GEMM_MAX_ROWS) {
            const int32_t rows = m - r0 < GEMM_MAX_ROWS ? m - r0 : GEMM_MAX_ROWS;
            lt_problem p;
            cublasStatus_t s = lt_make(&p, ch->out, ch->in, rows, ch->f32);
            if (s == CUBLAS_STATUS_SUCCESS)
                s = lt_run(b->lt, p, &ch->algo, A, (const char *)x + (size_t)r0 * ch->in * xs,
                           y + (size_t)r0 * ch->out, acc ? 1.0f : 0.0f, b->ws, b->st);
            lt_free(&p);
            if (s != CUBLAS_STATUS_SUCCESS) {
                fail(b, "cuda: cublasLtMatmul [%d x %d] x %d rows failed (status %d)", ch->out, ch->in, rows, (int)s);
                return;
            }
        }
        return;
    }
#endif
    if (ch->f32)
        fail(b, "cuda: internal: fp32 GEMM without cublasLt");
    else
        launch_gemm_simple(b->st, (const uint16_t *)A, (const uint16_t *)x, m, ch->out, ch->in, y, acc);
    check_launch(b, "gemm");
}

// The tensor-core GEMM: fp32 x straight in (no bf16 copy), its sums final.
// Its scratch grows outside a capture, as the runner's first step of a
// bucket is. Deferred (pend_tc) when a gated FFN could end it, launched by
// the next op otherwise.
static void run_tc(cuda_be *b, const weight *W, const float *x, int32_t m, float *y, int accumulate, int epi,
                   const cuda_be::pend_norm_t &norm, int pieces, const decltype(cuda_be::pend_tc.rope) *rope = nullptr,
                   kv_out kv = kv_out{nullptr, 0, 0, nullptr, nullptr}, const float *bias = nullptr,
                   const decltype(cuda_be::pend_tc.hnorm) *hnorm = nullptr, const decltype(tc_args::route) *route = nullptr,
                   const decltype(tc_args::nadd) *nadd = nullptr, const decltype(tc_args::lora) *lora = nullptr,
                   const lora_args *lora_shr = nullptr)
{
    tc_args a{};
    if (lora && lora->n) { // the shrinks the epilogue's terms read, in one launch before it
        a.lora = *lora;
        launch_lora_shrinks(b->st, lora_shr, lora->n);
        if (!check_launch(b, "lora_shrink"))
            return;
    }
    a.bias = bias;
    if (route)
        a.route = *route;
    if (nadd)
        a.nadd = *nadd;
    if (epi == TC_ROPE) {
        a.rope.heads = rope->heads, a.rope.head_dim = rope->head_dim;
        a.rope.positions = rope->positions, a.rope.cos_sin = rope->cos_sin, a.rope.kv = kv;
        if (hnorm && hnorm->heads) { // (exactly the rotated heads: cu_rope checked)
            a.rope.nw = hnorm->w, a.rope.nw2 = hnorm->w2, a.rope.n_first = hnorm->n_first;
            a.rope.eps = hnorm->eps, a.rope.w_off = hnorm->w_off;
        }
    }
    a.w = W->w, a.f8 = W->f8, a.f8s = W->f8s, a.q8 = W->q8, a.q8d = W->q8d;
    a.x = x, a.y = y;
    a.m = m, a.out = W->out, a.in = W->in, a.acc = accumulate, a.big_rows = b->tc_big_rows, a.big_tile = b->tc_tile;
    a.wmajor = b->tc_wmajor;
    a.stages = b->tc_stages, a.wg = b->tc_wg >= 0 ? b->tc_wg : cuplan_wg_groups(W->out, m, b->n_sm);
#ifndef RD_CUDA_EMU
    a.prefetch = rd_pdl;
#endif
    if (norm.x) {
        a.x = norm.x, a.nw = norm.w, a.eps = norm.eps, a.w_off = norm.w_off, a.xn = norm.out;
        shadow_written(b, norm.out, (size_t)m * W->in * sizeof(float));
    }
    const int64_t parts = gemm_tc_part_floats(W->tc, a), counters = gemm_tc_counters(W->tc, a);
    if (parts && !grow(b, (void **)&b->tc_part, &b->tc_part_cap, (size_t)parts * sizeof(float), "the GEMM's partial sums"))
        return;
    if (counters && b->tc_count_cap < (size_t)counters * sizeof(unsigned)) {
        size_t cap = b->tc_count_cap;
        if (!grow(b, (void **)&b->tc_count, &cap, (size_t)counters * sizeof(unsigned), "the GEMM's counters"))
            return;
        cudaMemsetAsync(b->tc_count, 0, cap, b->st); // kept zero by the kernels from here on
        b->tc_count_cap = cap;
    }
    a.part = b->tc_part, a.count = b->tc_count;
    shadow_written(b, y, (size_t)m * W->out * sizeof(float));
    launch_gemm_tc(b->st, W->tc, a, pieces, epi);
    check_launch(b, "gemm_tc");
}

// x's bf16 pieces for a linear layer: hi and lo (the split), or hi alone;
// TC_Q8 for an FP8 weight under RD_CUDA_FP8=w8a8, TC_I8 for a Q8_0 one under
// RD_CUDA_Q8=w8a8.
static int tc_pieces(const cuda_be *b, const weight *W)
{
    if (W->f8 && b->fp8_q8)
        return TC_Q8;
    if (W->q8 && b->q8_i8)
        return TC_I8;
    return b->split && !(b->split_contracting_only && W->in <= W->out) ? 2 : 1;
}

// epi TC_PLAIN launches it as it is (with its RoPE epilogue if one joined it);
// a gated epi writes the gated FFN's output to out.
static void launch_pending_tc(cuda_be *b, int epi, float *out, kv_out kv)
{
    const auto p = b->pend_tc;
    b->pend_tc.W = nullptr;
    if (epi == TC_PLAIN && p.rope.heads)
        epi = TC_ROPE;
    run_tc(b, p.W, p.x, p.m, epi == TC_PLAIN || epi == TC_ROPE ? p.y : out, p.acc, epi, p.norm, tc_pieces(b, p.W),
           &p.rope, kv, p.bias, &p.hnorm, nullptr, nullptr, &p.lora, p.lora_shr);
    if (p.hnorm.heads && !p.rope.heads) { // no RoPE came: the norms on their own, after the GEMM
        launch_head_rmsnorm(b->st, p.y, p.W->out, p.m, p.hnorm.heads, p.hnorm.head_dim, p.hnorm.w, p.hnorm.n_first,
                            p.hnorm.w2, p.hnorm.eps, p.hnorm.w_off, split_sum{nullptr, 0, 0});
        check_launch(b, "head_rmsnorm");
    }
}

// (b from compute(), nothing settled yet: a deferred RMSNorm of x may become the prologue.)
static void linear_tc(cuda_be *b, const weight *W, const float *x, int32_t m, float *y, int accumulate)
{
    cuda_be::pend_norm_t norm{};
    if (b->pend_norm.x && b->pend_norm.out == x && b->pend_norm.m == m && b->pend_norm.d == W->in) {
        norm = b->pend_norm;
        b->pend_norm.x = nullptr;
    }
    settle(b);
    if (b->fuse_split && W->out % 2 == 0) {
        // (accumulating ones too, Llama's o and down onto the residual: their LoRA terms can join them)
        shadow_written(b, y, (size_t)m * W->out * sizeof(float));
        b->pend_tc = {W, x, m, y, accumulate, norm, nullptr, {0, 0, nullptr, nullptr},
                      {0, 0, 0, nullptr, nullptr, 0.0f, 0.0f}, {}, {}};
        return;
    }
    run_tc(b, W, x, m, y, accumulate, TC_PLAIN, norm, tc_pieces(b, W));
}

// A SwiGLU / GeGLU on the whole output of the deferred tensor-core GEMM:
// launched as its epilogue (true), or false after launching what was pending.
static bool gated_tc(cuda_be *b, const float *gu, int32_t m, int32_t f, float *out, int epi)
{
    if (b->pend_tc.W && b->pend_tc.y == gu && b->pend_tc.m == m && b->pend_tc.W->out == 2 * f && !b->pend_tc.acc &&
        !b->pend_tc.bias && !b->pend_tc.rope.heads && !b->pend_tc.hnorm.heads) {
        shadow_written(b, out, (size_t)m * f * sizeof(float));
        launch_pending_tc(b, epi, out);
        return true;
    }
    return false;
}

static void cu_linear(rd_backend *be, const void *w, const float *x, int32_t m, float *y, int accumulate)
{
    cuda_be *b = compute(be);
    const weight *W = (const weight *)w;
    if (W->use_tc && m > 0) {
        linear_tc(b, W, x, m, y, accumulate);
        return;
    }
    settle(b);
    if (m <= 0)
        return;
    if (W->f8) {                // fp32 x straight in: no bf16 copy, no split
        shadow_written(b, y, (size_t)m * W->out * sizeof(float));
        launch_gemm_fp8(b->st, W->f8, W->f8s, x, m, W->out, W->in, y, accumulate);
        check_launch(b, "gemm_fp8");
        return;
    }
    const size_t n_in = (size_t)m * W->in, parts = b->split ? 2 : 1;
    const uint16_t *xb = shadow_find(b, x, n_in);
    if (!xb) {
        size_t cap_bytes = b->xb_cap * sizeof(uint16_t);
        if (!grow(b, (void **)&b->xb, &cap_bytes, parts * n_in * sizeof(uint16_t), "the GEMM input buffer"))
            return;
        b->xb_cap = cap_bytes / sizeof(uint16_t);
        launch_to_bf16(b->st, x, (int64_t)n_in, b->xb, b->split ? (int64_t)n_in : 0);
        check_launch(b, "to_bf16");
        xb = b->xb;
    }
    const size_t n_out = (size_t)m * W->out;
    shadow_written(b, y, n_out * sizeof(float));
    if (!b->split || (b->split_contracting_only && W->in <= W->out)) {
        gemm(b, W->ch, W->w, xb, m, y, accumulate); // rows [0, m): the hi halves
        return;
    }
    // Rows [0, m) are the hi halves, [m, 2m) the lo halves: one GEMM over 2m
    // rows reads the weights once; the two products are then summed.
    if (!grow(b, (void **)&b->ysplit, &b->ysplit_cap, 2 * n_out * sizeof(float), "the split GEMM output"))
        return;
    gemm(b, W->ch, W->w, xb, 2 * m, b->ysplit, 0);
    b->pend_y = y;
    b->pend = split_sum{b->ysplit, (int64_t)n_out, accumulate};
    if (!b->fuse_split)
        settle(b);
}

// The LM head: fp32 hidden state times the bf16 table with fp32 products
// and sums. x goes in as three bf16 pieces (hi + mid + lo = x exactly),
// stacked as 3 x rows of one GEMM with the bf16 table, so every product is
// exact and the sums are fp32: the logits of an fp32 GEMM up to summation
// order, at half the bytes of an fp32 table and on tensor cores. Rows go in
// chunks of HEAD_ROWS to bound the scratch. RD_CUDA_HEAD=fp32: an fp32 copy
// of the table and an fp32 GEMM instead (made on first use).
#define HEAD_ROWS 128

static void lm_head_fp32(cuda_be *b, weight *W, const float *x, int32_t m, float *y)
{
#ifndef RD_CUDA_EMU
    if (!W->ch32 && !b->gemm_simple_only) {
        if (b->capturing) {
            fail(b, "cuda: the fp32 LM head is first used inside a graph capture (run once uncaptured first)");
            return;
        }
        const size_t n = (size_t)W->out * W->in;
        if (cudaMalloc((void **)&W->w32, n * sizeof(float)) != cudaSuccess) {
            cudaGetLastError();
            W->w32 = nullptr;
            fail(b, "cuda: cannot allocate %zu bytes for the fp32 LM head", n * sizeof(float));
            return;
        }
        launch_from_bf16(b->st, W->w, (int64_t)n, W->w32);
        W->ch32 = choose_gemm(b, W->out, W->in, 1, W->w32, false);
        if (!W->ch32->lt) {
            cudaFree(W->w32);
            W->w32 = nullptr;
        }
    }
    if (W->ch32 && W->ch32->lt) {
        gemm(b, W->ch32, W->w32, x, m, y, 0);
        return;
    }
#endif
    // bf16 weights, fp32 x, fp32 products and sums: the same math in a fixed order.
    launch_gemm_simple(b->st, W->w, x, m, W->out, W->in, y, 0);
    check_launch(b, "lm_head");
}

static void cu_lm_head(rd_backend *be, const void *w, const float *x, int32_t m, float *y)
{
    cuda_be *b = compute(be);
    weight *W = (weight *)w;
    cuda_be::pend_norm_t norm{};
    if (W->use_tc && !(b->head_fp32 && W->w) && b->pend_norm.x && b->pend_norm.out == x && b->pend_norm.m == m &&
        b->pend_norm.d == W->in) {
        norm = b->pend_norm; // the final RMSNorm (a few rows: a decode step) becomes the head's prologue
        b->pend_norm.x = nullptr;
    }
    settle(b);
    if (m <= 0)
        return;
    if (W->f8) {
        fail(b, "cuda: the LM head is an fp8 weight; serve_dtype fp8 keeps it bf16");
        return;
    }
    shadow_written(b, y, (size_t)m * W->out * sizeof(float));
    if (b->head_fp32 && W->w) { // (a Q8_0 table's three-piece head is already fp32-exact in its products)
        lm_head_fp32(b, W, x, m, y);
        return;
    }
    if (W->use_tc) { // x as three exact pieces in the tensor-core GEMM: one kernel
        run_tc(b, W, x, m, y, 0, TC_PLAIN, norm, 3);
        return;
    }
    const int32_t rows = m < HEAD_ROWS ? m : HEAD_ROWS;
    size_t xb_bytes = b->xb_cap * sizeof(uint16_t);
    const bool ok = grow(b, (void **)&b->xb, &xb_bytes, (size_t)3 * rows * W->in * sizeof(uint16_t), "the LM head input");
    b->xb_cap = xb_bytes / sizeof(uint16_t);
    if (!ok || !grow(b, (void **)&b->yhead, &b->yhead_cap, (size_t)3 * rows * W->out * sizeof(float), "the LM head pieces"))
        return;
    for (int32_t r0 = 0; r0 < m; r0 += rows) {
        const int32_t mc = m - r0 < rows ? m - r0 : rows;
        launch_to_bf16x3(b->st, x + (size_t)r0 * W->in, (int64_t)mc * W->in, b->xb);
        gemm(b, W->ch, W->w, b->xb, 3 * mc, b->yhead, 0);
        launch_add3(b->st, b->yhead, (int64_t)mc * W->out, y + (size_t)r0 * W->out);
        check_launch(b, "lm_head");
    }
}

static void cu_embed(rd_backend *be, const void *w, const int32_t *ids, int32_t m, float scale, float *out)
{
    cuda_be *b = compute_op(be);
    const weight *W = (const weight *)w;
    if (W->f8) {
        fail(b, "cuda: the embedding is an fp8 weight; serve_dtype fp8 keeps it bf16");
        return;
    }
    shadow_written(b, out, (size_t)m * W->in * sizeof(float));
    if (W->q8)
        launch_embed_q8(b->st, W->q8, W->q8d, W->out, W->in, ids, m, scale, out);
    else
        launch_embed(b->st, W->w, W->out, W->in, ids, m, scale, out);
    check_launch(b, "embed");
}

static void cu_rmsnorm(rd_backend *be, const float *x, const float *w, int32_t m, int32_t d, float eps, float w_off,
                       float *out)
{
    cuda_be *b = compute(be);
    const size_t n = (size_t)m * d;
    const split_sum ss = take_split(b, x, (int64_t)n); // x is then written: the op's x is the residual stream
    const char *xe = (const char *)(x + n), *oe = (const char *)(out + n);
    if (!ss.t && b->gemm_tc && b->fuse_split && m <= b->tc_norm_rows &&
        ((const char *)out >= xe || (const char *)x >= oe)) {
        shadow_written(b, out, n * sizeof(float));
        b->pend_norm = {x, w, m, d, eps, w_off, out};
        return;
    }
    uint16_t *bf = shadow_claim(b, out, n);
    launch_rmsnorm(b->st, (float *)x, w, m, d, eps, w_off, out, bf, b->split ? (int64_t)n : 0, ss, nullptr, b->norm_v0);
    if (check_launch(b, "rmsnorm") && bf)
        shadow_commit(b, out, n);
}

static void cu_rope(rd_backend *be, float *x, int32_t stride, int32_t m, int32_t n_heads, int32_t head_dim,
                    const int32_t *positions, const float *cos_sin)
{
    cuda_be *b = compute(be);
    const auto &pt = b->pend_tc;
    if (pt.W && pt.y == x && !pt.acc && !pt.rope.heads && pt.m == m && pt.W->out == stride &&
        head_dim % 16 == 0 && (int64_t)n_heads * head_dim <= stride && !(b->tc_big_rows > 0 && m >= b->tc_big_rows) &&
        (!pt.hnorm.heads || (pt.hnorm.heads == n_heads && pt.hnorm.head_dim == head_dim))) {
        // The q|k|v GEMM is still pending (with the per-head norms of exactly these heads, if any): the RoPE
        // (and the KV write, if it comes next) becomes its epilogue.
        shadow_written(b, x, (size_t)m * stride * sizeof(float));
        b->pend_tc.rope = {n_heads, head_dim, positions, cos_sin};
        return;
    }
    const auto hn = b->pend_hnorm;
    split_sum ss;
    b->pend_rope.nw = nullptr;
    if (hn.x == x && hn.n_heads == n_heads && hn.head_dim == head_dim && hn.stride == stride && hn.m == m &&
        hnorm_rope_fits(head_dim)) {
        // The per-head norms of exactly these heads, pending: one kernel for both (k_hnorm_rope).
        b->pend_hnorm.x = nullptr;
        settle(b);
        ss = hn.ss;
        b->pend_rope.nw = hn.w, b->pend_rope.nw2 = hn.w2, b->pend_rope.n_first = hn.n_first;
        b->pend_rope.eps = hn.eps, b->pend_rope.w_off = hn.w_off;
    } else {
        ss = take_split(b, x, (int64_t)m * stride); // (and an earlier RoPE: none in a forward pass)
    }
    shadow_written(b, x, (size_t)m * stride * sizeof(float));
    b->pend_rope.x = x;
    b->pend_rope.stride = stride, b->pend_rope.m = m, b->pend_rope.n_heads = n_heads;
    b->pend_rope.head_dim = head_dim, b->pend_rope.positions = positions, b->pend_rope.cos_sin = cos_sin;
    b->pend_rope.ss = ss;
    if (!b->fuse_split)
        settle(b);
}

// Qwen2's q|k|v bias, on the linear's output: the deferred sum of that
// linear (y's whole [m][stride]) is completed in the same kernel.
static void cu_add_bias(rd_backend *be, float *y, int32_t stride, int32_t m, int32_t n, const float *bias)
{
    cuda_be *b = compute(be);
    if (m <= 0 || n <= 0)
        return;
    const auto &pt = b->pend_tc;
    if (pt.W && pt.y == y && !pt.acc && !pt.bias && !pt.rope.heads && !pt.hnorm.heads && !pt.lora.n && pt.m == m &&
        n == stride && n == pt.W->out) {
        // On the whole output of the pending tensor-core GEMM: added in its epilogue.
        shadow_written(b, y, (size_t)m * stride * sizeof(float));
        b->pend_tc.bias = bias;
        return;
    }
    const split_sum ss = take_split(b, y, (int64_t)m * stride);
    const int64_t span = ss.t ? (int64_t)m * stride : (int64_t)(m - 1) * stride + n;
    shadow_written(b, y, (size_t)span * sizeof(float));
    launch_add_bias(b->st, y, stride, m, n, bias, ss);
    check_launch(b, "add_bias");
}

// Qwen3's q_norm / k_norm, before RoPE. Called on Q first (x = the q|k|v
// rows the linear wrote), it completes the deferred sum of the whole rows, so
// the K call and the RoPE after it find none; the RoPE is still deferred and
// runs with the KV write.
static void cu_head_rmsnorm(rd_backend *be, float *x, int32_t stride, int32_t m, int32_t n_heads, int32_t head_dim,
                            const float *w, float eps, float w_off)
{
    cuda_be *b = compute(be);
    if (m <= 0 || n_heads <= 0)
        return;
    auto &pt = b->pend_tc;
    auto &hn = pt.hnorm;
    if (b->tc_hnorm && pt.W && !pt.acc && !pt.rope.heads && pt.m == m && pt.W->out == stride &&
        !(b->tc_big_rows > 0 && m >= b->tc_big_rows) && hnorm_rope_fits(head_dim)) {
        // The q|k|v GEMM is still pending: the q norm waits with it for the k norm and the RoPE (the three
        // become its epilogue); the k norm on the heads right after the q norm's joins it.
        if (!hn.heads && x == pt.y && (int64_t)n_heads * head_dim <= stride) {
            shadow_written(b, x, (size_t)m * stride * sizeof(float));
            hn = {n_heads, head_dim, n_heads, w, nullptr, eps, w_off};
            return;
        }
        if (hn.heads && hn.n_first == hn.heads && x == pt.y + (size_t)hn.heads * head_dim && head_dim == hn.head_dim &&
            eps == hn.eps && w_off == hn.w_off && (int64_t)(hn.heads + n_heads) * head_dim <= stride) {
            hn.heads += n_heads;
            hn.w2 = w;
            return;
        }
    }
    auto &p = b->pend_hnorm;
    if (p.x && p.n_first == p.n_heads && x == p.x + (size_t)p.n_heads * p.head_dim && stride == p.stride && m == p.m &&
        head_dim == p.head_dim && eps == p.eps && w_off == p.w_off &&
        (int64_t)(p.n_heads + n_heads) * head_dim <= stride) {
        // the k norm joins the pending q norm (and may join the RoPE next)
        shadow_written(b, x, (size_t)((int64_t)(m - 1) * stride + (int64_t)n_heads * head_dim) * sizeof(float));
        p.n_heads += n_heads;
        p.w2 = w;
        return;
    }
    const split_sum ss = take_split(b, x, (int64_t)m * stride); // (launches a pending head norm first)
    const int64_t span = ss.t ? (int64_t)m * stride : (int64_t)(m - 1) * stride + (int64_t)n_heads * head_dim;
    shadow_written(b, x, (size_t)span * sizeof(float));
    if (b->fuse_split) {
        b->pend_hnorm.x = x;
        b->pend_hnorm.stride = stride, b->pend_hnorm.m = m, b->pend_hnorm.n_heads = n_heads;
        b->pend_hnorm.head_dim = head_dim, b->pend_hnorm.w = w, b->pend_hnorm.eps = eps, b->pend_hnorm.w_off = w_off;
        b->pend_hnorm.n_first = n_heads, b->pend_hnorm.w2 = nullptr;
        b->pend_hnorm.ss = ss;
        return;
    }
    launch_head_rmsnorm(b->st, x, stride, m, n_heads, head_dim, w, n_heads, nullptr, eps, w_off, ss);
    check_launch(b, "head_rmsnorm");
}

static void cu_swiglu(rd_backend *be, const float *gu, int32_t m, int32_t f, float *out)
{
    cuda_be *b = compute(be);
    if (gated_tc(b, gu, m, f, out, TC_SWIGLU))
        return;
    const size_t n = (size_t)m * f;
    const split_sum ss = take_split(b, gu, (int64_t)n * 2);
    uint16_t *bf = shadow_claim(b, out, n);
    launch_swiglu(b->st, (float *)gu, m, f, out, bf, b->split ? (int64_t)n : 0, ss);
    if (check_launch(b, "swiglu") && bf)
        shadow_commit(b, out, n);
}

// Gemma's gated FFN, as cu_swiglu: completes gate|up's deferred sum and
// writes the bf16 copy of its output for the down projection.
static void cu_geglu(rd_backend *be, const float *gu, int32_t m, int32_t f, float *out)
{
    cuda_be *b = compute(be);
    if (gated_tc(b, gu, m, f, out, TC_GEGLU))
        return;
    const size_t n = (size_t)m * f;
    const split_sum ss = take_split(b, gu, (int64_t)n * 2);
    uint16_t *bf = shadow_claim(b, out, n);
    launch_geglu(b->st, (float *)gu, m, f, out, bf, b->split ? (int64_t)n : 0, ss);
    if (check_launch(b, "geglu") && bf)
        shadow_commit(b, out, n);
}

// out = RMSNorm(x), y += out in one kernel (Gemma 3's post-norms), completing x's deferred sum (the o or down
// projection's) as it reads it; in tc mode, up to tc_norm_rows rows, the pending projection's finishing step
// (TC_NORMADD). No bf16 copy of out: the add is its reader.
static void cu_rmsnorm_add(rd_backend *be, const float *x, const float *w, int32_t m, int32_t d, float eps,
                           float w_off, float *out, float *y)
{
    cuda_be *b = compute(be);
    const size_t n = (size_t)m * d;
    if (n == 0)
        return;
    const auto &pt = b->pend_tc;
    if (b->tc_normadd && pt.W && pt.y == x && !pt.acc && !pt.bias && !pt.rope.heads && !pt.hnorm.heads && pt.m == m &&
        pt.W->out == d && m <= b->tc_norm_rows && !(b->tc_big_rows > 0 && m >= b->tc_big_rows) && !b->pend_y &&
        (tc_pieces(b, pt.W) == 1 || tc_pieces(b, pt.W) == 2) && out != y && out != x && y != x && out != pt.x &&
        y != pt.x && (!pt.norm.x || (out != pt.norm.out && y != pt.norm.out && out != pt.norm.x && y != pt.norm.x))) {
        // The projection is still pending (and nothing else is): the norm and the add become its finishing step,
        // one warp a row of the row tile's last CTA, so only a few rows (the prologue's bound).
        const auto p = b->pend_tc;
        b->pend_tc.W = nullptr;
        shadow_written(b, out, n * sizeof(float));
        shadow_written(b, y, n * sizeof(float));
        const decltype(tc_args::nadd) nadd = {w, eps, w_off, out, y};
        run_tc(b, p.W, p.x, p.m, p.y, 0, TC_NORMADD, p.norm, tc_pieces(b, p.W), nullptr,
               kv_out{nullptr, 0, 0, nullptr, nullptr}, nullptr, nullptr, nullptr, &nadd, &p.lora, p.lora_shr);
            return;
    }
    const split_sum ss = take_split(b, x, (int64_t)n); // (another deferred sum, y's included, is completed first)
    if (ss.t) // x is written back completed
        shadow_written(b, x, n * sizeof(float));
    shadow_written(b, out, n * sizeof(float));
    shadow_written(b, y, n * sizeof(float));
    launch_rmsnorm(b->st, (float *)x, w, m, d, eps, w_off, out, nullptr, 0, ss, y, b->norm_v0);
    check_launch(b, "rmsnorm_add");
}

static void cu_gather_rows(rd_backend *be, const float *x, const int32_t *rows, int32_t n, int32_t d, float *out)
{
    cuda_be *b = compute_op(be);
    shadow_written(b, out, (size_t)n * d * sizeof(float));
    launch_gather(b->st, x, rows, n, d, out);
    check_launch(b, "gather_rows");
}

static void cu_kv_write(rd_backend *be, const rd_attn_shape *a, const float *k, const float *v, int32_t stride,
                        const rd_step_dev *s, float *k_cache, float *v_cache)
{
    cuda_be *b = compute(be);
    const auto &r = b->pend_rope;
    const int32_t hd = a->head_dim, nkv = a->n_kv_heads;
    const auto &pt = b->pend_tc;
    if (!b->kv_fp8 && pt.W && pt.rope.heads && pt.m == s->n_rows && pt.rope.head_dim == hd && pt.rope.heads > nkv &&
        k == pt.y + (size_t)(pt.rope.heads - nkv) * hd && v == pt.y + (size_t)pt.rope.heads * hd && stride == pt.W->out &&
        stride - pt.rope.heads * hd == nkv * hd) {
        // K is the pending RoPE's last n_kv heads, V the columns after them: the GEMM's epilogue writes both.
        launch_pending_tc(b, TC_PLAIN, nullptr, kv_out{s->slots, nkv, a->block_size, (uint16_t *)k_cache, (uint16_t *)v_cache});
        return;
    }
    if (b->kv_fp8) {
        // A head's scale needs all its values: the RoPE runs first, then one
        // warp per head quantizes (not fused into the RoPE kernel).
        settle(b);
        launch_kv_write_fp8(b->st, k, v, stride, s->slots, s->n_rows, nkv, hd, a->block_size, (uint8_t *)k_cache,
                            (uint8_t *)v_cache);
        check_launch(b, "kv_write_fp8");
        return;
    }
    if (r.x && !b->pend_y && r.m == s->n_rows && r.stride == stride && r.head_dim == hd && r.n_heads > nkv &&
        k == r.x + (size_t)(r.n_heads - nkv) * hd && v == r.x + (size_t)r.n_heads * hd &&
        stride - r.n_heads * hd == nkv * hd) {
        // K is the deferred RoPE's last n_kv heads, V the columns after them: one kernel.
        launch_pending_rope(b, kv_out{s->slots, nkv, a->block_size, (uint16_t *)k_cache, (uint16_t *)v_cache});
        return;
    }
    settle(b);
    launch_kv_write(b->st, k, v, stride, s->slots, s->n_rows, nkv, hd, a->block_size, (uint16_t *)k_cache,
                    (uint16_t *)v_cache);
    check_launch(b, "kv_write");
}

static void cu_copy_blocks(rd_backend *be, const rd_attn_shape *a, float *k_cache, float *v_cache,
                           const int32_t *src, const int32_t *dst, int32_t n)
{
    cuda_be *b = compute_op(be);
    if (b->kv_fp8)
        launch_copy_blocks_bytes(b->st, k_cache, v_cache, src, dst, n,
                                 rd_backend_kv_block_bytes(be, a->n_kv_heads, a->block_size, a->head_dim));
    else
        launch_copy_blocks(b->st, (uint16_t *)k_cache, (uint16_t *)v_cache, src, dst, n,
                           (int64_t)a->n_kv_heads * a->block_size * a->head_dim);
    check_launch(b, "copy_blocks");
}

// ------------------------------------------------------------------ mixture of experts

// The router's softmax top-k. A split sum pending on the logits (the router
// linear's) is completed inside the kernel, which writes the logits back.
static void cu_moe_route(rd_backend *be, const float *logits, int32_t m, int32_t n_experts, int32_t k, int norm,
                         int32_t *ids, float *weights)
{
    cuda_be *b = compute(be);
    if (m <= 0)
        return;
    if (n_experts < 1 || n_experts > RD_MOE_MAX_EXPERTS || k < 1 || k > n_experts || k > RD_MOE_MAX_K) {
        settle(b);
        fail(b, "cuda: moe_route with %d experts, top %d (at most %d experts, top %d)", n_experts, k,
             RD_MOE_MAX_EXPERTS, RD_MOE_MAX_K);
        return;
    }
    const int64_t n = (int64_t)m * n_experts;
    shadow_written(b, ids, (size_t)m * k * sizeof(int32_t));
    shadow_written(b, weights, (size_t)m * k * sizeof(float));
    const auto &pt = b->pend_tc;
    if (b->tc_route && pt.W && pt.y == logits && !pt.acc && !pt.bias && !pt.rope.heads && !pt.hnorm.heads && pt.m == m &&
        pt.W->out == n_experts && !(b->tc_big_rows > 0 && m >= b->tc_big_rows) &&
        (tc_pieces(b, pt.W) == 1 || tc_pieces(b, pt.W) == 2)) {
        // The router's GEMM is still pending: the routing becomes its finishing step.
        const auto p = b->pend_tc;
        b->pend_tc.W = nullptr;
        const decltype(tc_args::route) route = {ids, weights, k, norm};
        run_tc(b, p.W, p.x, p.m, p.y, 0, TC_ROUTE, p.norm, tc_pieces(b, p.W), nullptr, kv_out{nullptr, 0, 0, nullptr, nullptr},
               nullptr, nullptr, &route, nullptr, &p.lora, p.lora_shr);
            return;
    }
    const split_sum ss = take_split(b, logits, n);
    shadow_written(b, logits, (size_t)n * sizeof(float));
    launch_moe_route(b->st, (float *)logits, m, n_experts, k, norm, ids, weights, ss);
    check_launch(b, "moe_route");
}

// The device table of moe's experts, (re)written when a handle now points at
// other weights; NULL (and the sticky error set) when a handle is missing or
// has the wrong shape, or a new table would need an allocation during
// capture. The write is a kernel on the stream: inside a capture it goes into
// the graph (each replay rewrites the same pointers), and every later call
// writes it again until one outside capture has: that graph may never run.
// An expert weight's rows as the MoE kernels read them: bf16, or Q8_0 codes.
static const void *moe_wptr(const weight *W) { return W->q8 ? (const void *)W->q8 : (const void *)W->w; }

static moe_table *moe_table_for(cuda_be *b, const rd_moe *moe)
{
    const int32_t E = moe->n_experts, f = moe->ffn, d = moe->dim;
    moe_table *t = nullptr;
    for (moe_table *c : b->moe_tables)
        if (c->gate_up == moe->gate_up && c->down == moe->down && c->n_experts == E) {
            t = c;
            break;
        }
    bool same = t && !t->in_graph;
    for (int32_t e = 0; e < E; e++) {
        const weight *gu = (const weight *)moe->gate_up[e], *dn = (const weight *)moe->down[e];
        if (!gu || !dn || (!gu->w && !gu->q8) || (!dn->w && !dn->q8) || gu->out != 2 * f || gu->in != d ||
            dn->out != d || dn->in != f) {
            fail(b, "cuda: moe_ffn: expert %d's weights are missing, fp8, or not [%d][%d] and [%d][%d]", e, 2 * f, d,
                 d, f);
            return nullptr;
        }
        same = same && t->ptrs[e] == moe_wptr(gu) && t->ptrs[E + e] == moe_wptr(dn) && t->ptrs[2 * E + e] == gu->q8d &&
               t->ptrs[3 * E + e] == dn->q8d;
    }
    if (same)
        return t;
    if (!t) {
        if (b->capturing) {
            fail(b, "cuda: moe_ffn is first called on these experts during a graph capture (run the step once "
                    "uncaptured first)");
            return nullptr;
        }
        t = new moe_table();
        t->gate_up = moe->gate_up;
        t->down = moe->down;
        t->n_experts = E;
        cudaError_t e = cudaMalloc((void **)&t->dev, 4 * (size_t)E * sizeof(const void *));
        if (e != cudaSuccess) {
            cudaGetLastError();
            delete t;
            fail(b, "cuda: cannot allocate the expert table of %d experts: %s", E, cudaGetErrorString(e));
            return nullptr;
        }
        b->moe_tables.push_back(t);
    }
    t->ptrs.resize(4 * (size_t)E);
    t->aligned = 1;
    int n_q8 = 0;
    for (int32_t e = 0; e < E; e++) {
        const weight *gu = (const weight *)moe->gate_up[e], *dn = (const weight *)moe->down[e];
        t->ptrs[e] = moe_wptr(gu);
        t->ptrs[E + e] = moe_wptr(dn);
        t->ptrs[2 * E + e] = gu->q8d;
        t->ptrs[3 * E + e] = dn->q8d;
        t->aligned &= (uintptr_t)t->ptrs[e] % 16 == 0 && (uintptr_t)t->ptrs[E + e] % 16 == 0;
        n_q8 += (gu->q8d != nullptr) + (dn->q8d != nullptr);
    }
    t->wf = n_q8 == 0 ? TC_WF_BF16 : n_q8 == 2 * E ? TC_WF_Q8_0 : -1;
    t->in_graph = b->capturing;
    launch_moe_set_table(b->st, t->dev, t->ptrs.data(), 0, 4 * E);
    return check_launch(b, "moe_ffn expert table") ? t : nullptr;
}

static void moe_table_free(moe_table *t)
{
    cudaFree(t->dev);
    delete t;
}

// The handle arrays are about to be freed: their tables go (a new model's
// arrays may reuse the addresses, and a model rebuilt every training step
// would otherwise add a table per layer each time). cudaFree waits for the
// kernels that may still read it; a graph that holds it is never launched
// again (backend.h). Inside a capture cudaFree is not allowed: the table then
// stays until cu_destroy.
static void cu_moe_release(rd_backend *be, const rd_moe *moe)
{
    cuda_be *b = impl(be);
    if (b->capturing)
        return;
    for (size_t i = 0; i < b->moe_tables.size();) {
        moe_table *t = b->moe_tables[i];
        if (t->gate_up == moe->gate_up && t->down == moe->down) {
            moe_table_free(t);
            b->moe_tables.erase(b->moe_tables.begin() + (long)i);
        } else {
            i++;
        }
    }
}

// The experts: the routes grouped by expert on the device, then one kernel
// for every expert's gate|up and one for every expert's down (cuda_moe.cu:
// bf16 weights, fp32 activations and sums), then the weighted sum into y.
// Small batches, fusions on: the sort inside the two expert kernels and the
// sum inside down's (two launches at batch 1, the same bits).
static void cu_moe_ffn(rd_backend *be, const rd_moe *moe, const float *x, const int32_t *ids, const float *weights,
                       int32_t m, int32_t k, float *y)
{
    cuda_be *b = compute_op(be);
    if (m <= 0)
        return;
    const int32_t E = moe->n_experts, f = moe->ffn, d = moe->dim;
    if (E < 1 || E > RD_MOE_MAX_EXPERTS || k < 1 || k > E || k > RD_MOE_MAX_K || f <= 0 || d <= 0) {
        fail(b, "cuda: moe_ffn with %d experts, top %d, ffn %d, dim %d (at most %d experts, top %d)", E, k, f, d,
             RD_MOE_MAX_EXPERTS, RD_MOE_MAX_K);
        return;
    }
    moe_table *t = moe_table_for(b, moe);
    if (!t)
        return;
    const size_t routes = (size_t)m * k;
    // The tensor-core experts: one weight format, reduced lengths the GEMM's chunks divide, aligned
    // weights, and a work list that fits a grid's y (else the CUDA-core kernels serve the call).
    const int64_t n_work = (int64_t)std::min<size_t>((size_t)E, routes) + (int64_t)((routes + 15) / 16);
    cuplan_tc pl_gu{}, pl_down{};
    const bool tc = b->moe_tc && t->wf >= 0 && t->aligned && n_work <= 65535 && !cuplan_moe_tc(d, &pl_gu) &&
                    !cuplan_moe_tc(f, &pl_down);
    const size_t idx_n = (size_t)2 * E + 1 + routes + (tc ? 2 * routes + 2 * (size_t)n_work : 0);
    if (!grow(b, (void **)&b->moe_idx, &b->moe_idx_cap, idx_n * sizeof(int32_t), "the MoE route order") ||
        !grow(b, (void **)&b->moe_act, &b->moe_act_cap, routes * f * sizeof(float), "the MoE expert activations") ||
        !grow(b, (void **)&b->moe_h, &b->moe_h_cap, routes * d * sizeof(float), "the MoE expert outputs"))
        return;
    const size_t counters = (size_t)std::max(moe_dim_tiles(d), (d + CUPLAN_TC_NT - 1) / CUPLAN_TC_NT) * sizeof(unsigned);
    if (b->fuse_split && b->moe_count_cap < counters) {
        size_t cap = b->moe_count_cap;
        if (!grow(b, (void **)&b->moe_count, &cap, counters, "the MoE combine's counters"))
            return;
        cudaMemsetAsync(b->moe_count, 0, cap, b->st); // kept zero by the kernels from here on
        b->moe_count_cap = cap;
    }
    shadow_written(b, y, (size_t)m * d * sizeof(float));
    moe_args a;
    a.table = t->dev;
    a.n_experts = E;
    a.ffn = f;
    a.dim = d;
    a.w_aligned = t->aligned;
    a.x = x;
    a.ids = ids;
    a.weights = weights;
    a.m = m;
    a.k = k;
    a.y = y;
    a.off = b->moe_idx;
    a.order = b->moe_idx + E + 1;
    a.active = b->moe_idx + E + 1 + routes;
    a.act = b->moe_act;
    a.h = b->moe_h;
    a.tc_wf = tc ? t->wf : -1;
    a.pl_gu = pl_gu;
    a.pl_down = pl_down;
    a.pos = tc ? a.active + E : nullptr;
    a.xrow = tc ? a.pos + routes : nullptr;
    a.work = tc ? a.xrow + routes : nullptr;
    a.n_work = tc ? (int32_t)n_work : 0;
    a.count = b->fuse_split ? b->moe_count : nullptr;
    launch_moe_ffn(b->st, a);
    check_launch(b, "moe_ffn");
}

// ------------------------------------------------------------------ LoRA

static int lora_dt(int32_t ggml, int32_t *dt, size_t *es)
{
    if (ggml == GGML_F32)
        return *dt = LORA_DT_F32, *es = 4, 1;
    if (ggml == GGML_F16)
        return *dt = LORA_DT_F16, *es = 2, 1;
    if (ggml == GGML_BF16)
        return *dt = LORA_DT_BF16, *es = 2, 1;
    return 0;
}

// A and B go to the device as the file has them (f32, f16 or bf16): the
// kernels widen each element exactly as they read it.
static int cu_lora_load(rd_backend *be, const rd_lora_w *w, void **handle)
{
    cuda_be *b = impl(be);
    *handle = nullptr;
    int32_t adt = 0, bdt = 0;
    size_t aes = 0, bes = 0;
    if (!w || w->rank < 1 || w->rank > RD_LORA_MAX_RANK || w->in <= 0 || w->out <= 0 || !w->a || !w->b ||
        !lora_dt(w->a_type, &adt, &aes) || !lora_dt(w->b_type, &bdt, &bes) || !std::isfinite(w->scale))
        return rd_fail(RD_EINVAL, "cuda: lora_load: rank %d (1..%d), [%d] -> [%d], A %s, B %s: not a LoRA pair",
                       w ? w->rank : 0, RD_LORA_MAX_RANK, w ? w->in : 0, w ? w->out : 0,
                       w ? ggml_type_name((ggml_type)w->a_type) : "?", w ? ggml_type_name((ggml_type)w->b_type) : "?");
    lora_h *L = (lora_h *)calloc(1, sizeof(lora_h));
    if (!L)
        return rd_fail(RD_ENOMEM, "cuda: out of host memory for a LoRA handle");
    const size_t na = (size_t)w->rank * w->in * aes, nb = (size_t)w->out * w->rank * bes;
    int rc = upload_new(b, &L->a, w->a, na, "a LoRA A");
    if (!rc)
        rc = upload_new(b, &L->b, w->b, nb, "a LoRA B");
    if (rc) {
        if (L->a)
            cudaFree(L->a);
        free(L);
        return rc;
    }
    L->rank = w->rank;
    L->in = w->in;
    L->out = w->out;
    L->a_dt = adt;
    L->b_dt = bdt;
    L->scale = w->scale;
    L->bytes = (int64_t)(na + nb);
    *handle = L;
    return 0;
}

static void cu_lora_free(rd_backend *be, void *handle)
{
    lora_h *L = (lora_h *)handle;
    if (!L)
        return;
    cudaFree(L->a);
    cudaFree(L->b);
    free(L);
}

static int64_t cu_lora_bytes(rd_backend *be, const void *handle)
{
    return handle ? ((const lora_h *)handle)->bytes : 0;
}

// The device table of lb's slots, (re)written when an entry changed; NULL
// (and the sticky error set) on a handle of another shape, or a new table
// during capture. Written by a kernel on the stream, as moe_table_for.
static lora_table *lora_table_for(cuda_be *b, const rd_lora_batch *lb)
{
    std::vector<lora_dev> want((size_t)lb->n_slots);
    memset(want.data(), 0, want.size() * sizeof(lora_dev));
    for (int32_t s = 0; s < lb->n_slots; s++) {
        const lora_h *L = (const lora_h *)lb->w[s];
        if (!L)
            continue;
        if (L->in != lb->in || L->out != lb->out || L->rank > lb->max_rank) {
            fail(b, "cuda: lora_apply: slot %d holds a rank-%d [%d] -> [%d] pair, the call is [%d] -> [%d] up to "
                    "rank %d", s, L->rank, L->in, L->out, lb->in, lb->out, lb->max_rank);
            return nullptr;
        }
        want[(size_t)s] = lora_dev{L->a, L->b, L->scale, L->rank, L->a_dt, L->b_dt};
    }
    lora_table *t = nullptr;
    for (lora_table *c : b->lora_tables)
        if (c->key == lb->w && c->n_slots == lb->n_slots) {
            t = c;
            break;
        }
    if (t && !t->in_graph && !memcmp(t->cur.data(), want.data(), want.size() * sizeof(lora_dev)))
        return t;
    if (!t) {
        if (b->capturing) {
            fail(b, "cuda: lora_apply is first called on this slot array during a graph capture (run the step "
                    "once uncaptured first)");
            return nullptr;
        }
        t = new lora_table();
        t->key = lb->w;
        t->n_slots = lb->n_slots;
        cudaError_t e = cudaMalloc((void **)&t->dev, (size_t)lb->n_slots * sizeof(lora_dev));
        if (e != cudaSuccess) {
            cudaGetLastError();
            delete t;
            fail(b, "cuda: cannot allocate the LoRA table of %d slots: %s", lb->n_slots, cudaGetErrorString(e));
            return nullptr;
        }
        b->lora_tables.push_back(t);
    }
    t->cur = want;
    t->in_graph = b->capturing;
    launch_lora_set_table(b->st, t->dev, t->cur.data(), lb->n_slots);
    return check_launch(b, "lora table") ? t : nullptr;
}

static void lora_table_free(lora_table *t)
{
    cudaFree(t->dev);
    delete t;
}

static void cu_lora_release(rd_backend *be, const rd_lora_batch *lb)
{
    cuda_be *b = impl(be);
    if (b->capturing)
        return;
    for (size_t i = 0; i < b->lora_tables.size();) {
        lora_table *t = b->lora_tables[i];
        if (t->key == lb->w) {
            lora_table_free(t);
            b->lora_tables.erase(b->lora_tables.begin() + (long)i);
        } else {
            i++;
        }
    }
}

// Whatever is deferred into y (a split GEMM's sum) is launched first
// (compute_op): the term is added to the linear's rounded output.
static void cu_lora_apply(rd_backend *be, const rd_lora_batch *lb, const float *x, const int32_t *slots, int32_t m,
                          float *y, int32_t y_stride, int32_t out_off)
{
    cuda_be *b = compute(be);
    if (m <= 0)
        return;
    if (!lb || lb->n_slots < 1 || lb->n_slots > RD_LORA_MAX_SLOTS || lb->in <= 0 || lb->out <= 0 ||
        lb->max_rank < 1 || lb->max_rank > RD_LORA_MAX_RANK || out_off < 0 || out_off + lb->out > y_stride) {
        settle(b);
        fail(b, "cuda: lora_apply with %d slots, [%d] -> [%d] at %d of %d, max rank %d", lb ? lb->n_slots : 0,
             lb ? lb->in : 0, lb ? lb->out : 0, out_off, y_stride, lb ? lb->max_rank : 0);
        return;
    }
    lora_table *t = lora_table_for(b, lb); // (its table write, if any, goes before the pending GEMM: it reads it)
    if (!t)
        return;
    lora_args a{};
    a.table = t->dev;
    a.n_slots = lb->n_slots;
    a.in = lb->in;
    a.out = lb->out;
    a.max_rank = lb->max_rank;
    a.x = x;
    a.slots = slots;
    a.m = m;
    a.y = y;
    a.y_stride = y_stride;
    a.out_off = out_off;
    const int64_t need = (int64_t)m * lb->max_rank;
    auto &pt = b->pend_tc;
    // this call's A x goes after the last joined call's in lora_t
    const tc_lora *last = pt.lora.n ? &pt.lora.tg[pt.lora.n - 1] : nullptr;
    const int64_t used = last ? (last->t - b->lora_t) + (int64_t)m * last->max_rank : 0;
    const float *gx = pt.norm.x ? pt.norm.out : pt.x; // what the pending GEMM multiplies
    if (b->tc_lora && pt.W && pt.y == y && pt.W->out == y_stride && pt.m == m && x == gx && lb->in == pt.W->in &&
        !pt.rope.heads && !pt.hnorm.heads && pt.lora.n < TC_LORA_MAX && (!pt.lora.n || pt.lora.slots == slots) &&
        !(b->tc_big_rows > 0 && m >= b->tc_big_rows) && !b->pend_y &&
        (pt.lora.n ? (size_t)(used + need) * sizeof(float) <= b->lora_t_cap
                   : grow(b, (void **)&b->lora_t, &b->lora_t_cap, (size_t)(TC_LORA_MAX * need) * sizeof(float),
                          "the LoRA A x"))) {
        // The GEMM that wrote y is still pending: its expand becomes the GEMM's epilogue, and its shrink (on the
        // GEMM's input: with its RMSNorm prologue, normalizing x as the prologue will) joins the other calls' in
        // one launch just before the GEMM; t kept per call. (The joins after it write the GEMM's output or, for
        // rmsnorm_add, buffers other than its x: the shrink reads what it would have read now.)
        if (pt.norm.x)
            a.x = pt.norm.x, a.nw = pt.norm.w, a.eps = pt.norm.eps, a.w_off = pt.norm.w_off;
        a.t = b->lora_t + used;
        shadow_written(b, y, (size_t)m * y_stride * sizeof(float));
        pt.lora_shr[pt.lora.n] = a;
        pt.lora.tg[pt.lora.n++] = tc_lora{t->dev, lb->n_slots, lb->max_rank, a.t, out_off, lb->out};
        pt.lora.slots = slots;
        return;
    }
    settle(b);
    if (b->err || !grow(b, (void **)&b->lora_t, &b->lora_t_cap, (size_t)need * sizeof(float), "the LoRA A x"))
        return;
    a.t = b->lora_t;
    shadow_written(b, y, (size_t)m * y_stride * sizeof(float));
    launch_lora_apply(b->st, a);
    check_launch(b, "lora_apply");
}

// Partial-result buffers for rows x heads x partitions.
static bool ensure_parts(cuda_be *b, int32_t rows, int32_t heads, int32_t hd, int32_t parts)
{
    if (rows <= b->part_rows_cap && heads == b->part_heads && hd == b->part_hd && parts <= b->parts_cap)
        return true;
    int32_t r = rows > b->part_rows_cap ? rows : b->part_rows_cap;
    int32_t p = b->parts_cap > 0 ? b->parts_cap : 16;
    while (p < parts)
        p *= 2;
    if (heads != b->part_heads || hd != b->part_hd)
        r = rows;
    size_t no = (size_t)r * heads * p * hd * sizeof(float), nm = (size_t)r * heads * p * 2 * sizeof(float);
    size_t co = 0, cm = 0;
    void *po = nullptr, *pm = nullptr;
    if (!grow(b, &po, &co, no, "attention partials") || !grow(b, &pm, &cm, nm, "attention partials")) {
        if (po)
            cudaFree(po);
        return false;
    }
    if (b->part_o)
        cudaFree(b->part_o);
    if (b->part_ms)
        cudaFree(b->part_ms);
    b->part_o = (float *)po;
    b->part_ms = (float *)pm;
    b->part_rows_cap = r;
    b->parts_cap = p;
    b->part_heads = heads;
    b->part_hd = hd;
    return true;
}

static void cu_attention(rd_backend *be, const rd_attn_shape *a, const float *q, int32_t stride, const rd_step_dev *s,
                         const float *k_cache, const float *v_cache, float *out)
{
    cuda_be *b = compute_op(be);
    if (!b->attn_checked) {
        if (cuplan_attn_check(a->n_heads, a->n_kv_heads, a->head_dim)) {
            fail(b, "%s", rd_errmsg());
            return;
        }
        b->attn_checked = true;
    }
    const int32_t rows = s->n_rows;
    if (rows <= 0)
        return;
    if (s->token_ids != b->d_step + b->L.tok) {
        fail(b, "cuda: attention called with step metadata this backend did not upload");
        return;
    }
    if (!ensure_parts(b, rows, a->n_heads, a->head_dim, b->step_max_parts))
        return;
    const size_t counters = (size_t)rows * a->n_kv_heads * sizeof(unsigned);
    if (b->attn_fuse && b->attn_count_cap < counters) {
        size_t cap = b->attn_count_cap;
        if (!grow(b, (void **)&b->attn_count, &cap, counters, "the attention counters"))
            return;
        cudaMemsetAsync(b->attn_count, 0, cap, b->st); // kept zero by the kernels from here on
        b->attn_count_cap = cap;
    }
    const size_t n = (size_t)rows * a->n_heads * a->head_dim;
    uint16_t *bf = shadow_claim(b, out, n);
    attn_params p;
    p.q = q;
    p.q_stride = stride;
    p.k_cache = (const uint16_t *)k_cache;
    p.v_cache = (const uint16_t *)v_cache;
    p.fp8 = b->kv_fp8;
    p.positions = s->positions;
    p.row_seq = b->d_step + b->L.rowseq;
    p.block_tables = s->block_tables;
    p.table_stride = b->d_step + b->L.meta;
    p.n_heads = a->n_heads;
    p.n_kv = a->n_kv_heads;
    p.head_dim = a->head_dim;
    p.block_size = a->block_size;
    p.scale = a->scale;
    p.window = a->window > 0 ? a->window : 0;
    p.rows = rows;
    // (parts_cap holds the step's rows without a window: a windowed layer's
    // need no more)
    p.z = cuplan_attn_z(rows, a->n_kv_heads, cuplan_attn_layer_parts(b->capturing ? 0 : b->step_max_parts, p.window),
                        b->n_sm, b->attn_v0 ? 2 : CUPLAN_ATTN_WAVES, b->attn_v0 ? 16 : CUPLAN_ATTN_MAX_Z);
    p.unroll = b->attn_v0 ? 1 : CUPLAN_ATTN_UNROLL;
    p.parts_cap = b->parts_cap;
    p.part_o = b->part_o;
    p.part_ms = b->part_ms;
    p.out = out;
    p.out_bf = bf;
    p.lo_off = b->split ? (int64_t)n : 0;
    p.count = b->attn_fuse ? b->attn_count : nullptr;
    launch_attention(b->st, p);
    if (check_launch(b, "attention") && bf)
        shadow_commit(b, out, n);
}

// ------------------------------------------------------------------ steps

static step_layout layout_for(int32_t rows_cap, int32_t tables_cap)
{
    step_layout L;
    L.meta = 0;
    L.tok = 4;
    L.pos = L.tok + rows_cap;
    L.slot = L.pos + rows_cap;
    L.rowseq = L.slot + rows_cap;
    L.qs = L.rowseq + rows_cap;
    L.ctx = L.qs + rows_cap + 1;
    L.tab = L.ctx + rows_cap;
    L.total = L.tab + tables_cap;
    return L;
}

static int cu_step_upload(rd_backend *be, const rd_step *h, rd_step_dev *d)
{
    cuda_be *b = compute_op(be);
    if (b->capturing)
        return rd_fail(RD_EINVAL, "cuda: step_upload during graph capture");
    const int32_t n = h->n_rows, ns = h->n_seqs, mb = h->max_blocks;
    if (n <= 0 || ns <= 0 || ns > n || mb <= 0)
        return rd_fail(RD_EINVAL, "cuda: step of %d rows, %d sequences, %d blocks per table", n, ns, mb);
    const int64_t tables = (int64_t)ns * mb;
    if (n > b->rows_cap || tables > b->tables_cap) {
        int32_t rc_ = b->rows_cap > 0 ? b->rows_cap : 64, tc = b->tables_cap > 0 ? b->tables_cap : 1024;
        while (rc_ < n)
            rc_ *= 2;
        while (tc < tables)
            tc *= 2;
        step_layout L = layout_for(rc_, tc);
        int32_t *hp = nullptr, *dp = nullptr;
        if (b->step_ev_live)
            cudaEventSynchronize(b->step_ev);
        if (cudaMallocHost((void **)&hp, L.total * sizeof(int32_t)) != cudaSuccess ||
            cudaMalloc((void **)&dp, L.total * sizeof(int32_t)) != cudaSuccess) {
            cudaGetLastError();
            if (hp)
                cudaFreeHost(hp);
            return rd_fail(RD_ENOMEM, "cuda: cannot allocate step buffers for %d rows", rc_);
        }
        if (b->h_step)
            cudaFreeHost(b->h_step);
        if (b->d_step)
            cudaFree(b->d_step);
        b->h_step = hp;
        b->d_step = dp;
        b->rows_cap = rc_;
        b->tables_cap = tc;
        b->L = L;
        b->epoch++;
    }
    if (b->step_ev_live)
        cudaEventSynchronize(b->step_ev); // the previous upload has left the staging buffer
    const step_layout &L = b->L;
    int32_t *hs = b->h_step;
    memset(hs, 0, 4 * sizeof(int32_t));
    hs[L.meta] = mb;
    memcpy(hs + L.tok, h->token_ids, n * sizeof(int32_t));
    memcpy(hs + L.pos, h->positions, n * sizeof(int32_t));
    memcpy(hs + L.slot, h->slots, n * sizeof(int32_t));
    memcpy(hs + L.qs, h->q_start, (ns + 1) * sizeof(int32_t));
    memcpy(hs + L.ctx, h->ctx_len, ns * sizeof(int32_t));
    memcpy(hs + L.tab, h->block_tables, tables * sizeof(int32_t));
    int32_t max_parts = 1;
    for (int32_t r = 0; r < n; r++)
        hs[L.rowseq + r] = -1;
    for (int32_t s = 0; s < ns; s++) {
        int32_t r0 = h->q_start[s], r1 = h->q_start[s + 1];
        if (r0 < 0 || r1 < r0 || r1 > n)
            return rd_fail(RD_EINVAL, "cuda: q_start[%d..%d] = %d..%d is not within %d rows", s, s + 1, r0, r1, n);
        for (int32_t r = r0; r < r1; r++) {
            hs[L.rowseq + r] = s;
            int32_t parts = cuplan_attn_parts(h->positions[r] + 1);
            if (parts > max_parts)
                max_parts = parts;
        }
    }
    b->step_rows = n;
    b->step_max_parts = max_parts;
    shadow_reset(b);
    if (b->part_heads > 0 && !ensure_parts(b, n, b->part_heads, b->part_hd, max_parts))
        return take_err(b);
    cudaError_t e = cudaMemcpyAsync(b->d_step, hs, (L.tab + tables) * sizeof(int32_t), cudaMemcpyHostToDevice, b->st);
    if (e == cudaSuccess)
        e = cudaEventRecord(b->step_ev, b->st);
    if (e != cudaSuccess)
        return cuda_fail(e, "uploading step metadata");
    b->step_ev_live = true;
    const int32_t *dp = b->d_step;
    d->n_rows = n;
    d->n_seqs = ns;
    d->max_blocks = mb;
    d->token_ids = dp + L.tok;
    d->positions = dp + L.pos;
    d->slots = dp + L.slot;
    d->q_start = dp + L.qs;
    d->ctx_len = dp + L.ctx;
    d->block_tables = dp + L.tab;
    return take_err(b);
}

// ------------------------------------------------------------------ graphs

static int cu_graph_begin(rd_backend *be)
{
    cuda_be *b = compute_op(be);
    if (b->capturing)
        return rd_fail(RD_EINVAL, "cuda: graph_begin while already capturing");
    int rc = take_err(b);
    if (rc)
        return rc;
    cudaError_t e = cudaStreamBeginCapture(b->st, cudaStreamCaptureModeThreadLocal);
    if (e != cudaSuccess)
        return cuda_fail(e, "begin graph capture");
    b->capturing = true;
    b->capture_epoch = b->epoch;
    shadow_reset(b);
    return 0;
}

static int cu_graph_end(rd_backend *be, void **graph)
{
    cuda_be *b = impl(be);
    *graph = nullptr;
    if (!b->capturing)
        return rd_fail(RD_EINVAL, "cuda: graph_end without graph_begin");
    settle(b); // part of the captured step
    cudaGraph_t g = nullptr;
    cudaError_t e = cudaStreamEndCapture(b->st, &g);
    b->capturing = false;
    shadow_reset(b);
    int rc = 0;
    if (e != cudaSuccess)
        rc = cuda_fail(e, "end graph capture");
    else if (b->err)
        rc = take_err(b);
    else if (b->epoch != b->capture_epoch)
        rc = rd_fail(RD_EINVAL, "cuda: buffers moved during graph capture");
    cudaGraphExec_t exec = nullptr;
    if (!rc) {
        e = cudaGraphInstantiate(&exec, g, 0);
        if (e != cudaSuccess)
            rc = cuda_fail(e, "instantiate graph");
    }
    if (g)
        cudaGraphDestroy(g);
    cudaGetLastError();
    if (rc)
        return rc;
    graph_h *h = new graph_h{exec, b->epoch};
    *graph = h;
    return 0;
}

static int cu_graph_launch(rd_backend *be, void *graph)
{
    cuda_be *b = compute_op(be);
    graph_h *h = (graph_h *)graph;
    if (h->epoch != b->epoch)
        return RD_GRAPH_STALE;
    shadow_reset(b);
    cudaError_t e = cudaGraphLaunch(h->exec, b->st);
    if (e != cudaSuccess)
        return cuda_fail(e, "graph launch");
    return take_err(b);
}

static void cu_graph_free(rd_backend *be, void *graph)
{
    graph_h *h = (graph_h *)graph;
    if (!h)
        return;
    cudaGraphExecDestroy(h->exec);
    delete h;
}

// ------------------------------------------------------------------ sampling

// Grows a sampling buffer (device, or pinned host when host) to need bytes;
// the old contents are not kept. Not grow(): sampling is synchronous and never
// captured, so a move does not bump the epoch (captured steps stay valid).
// The old buffer goes first, so peak memory is the new size alone.
static int sample_grow(cuda_be *b, void **p, size_t *cap_bytes, size_t need, bool host, const char *what)
{
    if (*p && *cap_bytes >= need)
        return 0;
    if (b->capturing)
        return rd_fail(RD_EINVAL, "cuda: sample during graph capture");
    size_t cap = *cap_bytes ? *cap_bytes : 4096;
    while (cap < need)
        cap *= 2;
    if (*p) {
        if (host)
            cudaFreeHost(*p);
        else
            cudaFree(*p);
    }
    *p = nullptr;
    *cap_bytes = 0;
    void *q = nullptr;
    if ((host ? cudaMallocHost(&q, cap) : cudaMalloc(&q, cap)) != cudaSuccess) {
        cudaGetLastError();
        return rd_fail(RD_ENOMEM, "cuda: cannot allocate %zu bytes for %s", cap, what);
    }
    *p = q;
    *cap_bytes = cap;
    return 0;
}

static int cu_sample(rd_backend *be, const float *logits, int32_t vocab, const rd_sample_req *reqs, int32_t n,
                     samp_result *out)
{
    cuda_be *b = compute_op(be);
    if (n <= 0)
        return 0;
    if (vocab <= 0)
        return rd_fail(RD_EINVAL, "cuda: sample: vocab %d", vocab);
    int64_t n_edits = 0;        // all requests' edits
    int32_t n_proc = 0;         // requests with edits: rows of d_sproc
    for (int32_t i = 0; i < n; i++) {
        int rc = samp_validate(reqs[i].sp);
        if (rc)
            return rc;
        static_assert(SAMP_MAX_WANT == 32, "sample_req.want_ids holds 32 ids");
        for (int32_t j = 0; j < reqs[i].sp->n_want; j++)
            if (reqs[i].sp->want_ids[j] < 0 || reqs[i].sp->want_ids[j] >= vocab)
                return rd_fail(RD_EINVAL, "cuda: sample: request %d asks the log-prob of token %d (vocabulary %d)", i,
                               reqs[i].sp->want_ids[j], vocab);
        if (reqs[i].score && (reqs[i].score_token < 0 || reqs[i].score_token >= vocab || reqs[i].n_edits))
            return rd_fail(RD_EINVAL, "cuda: sample: request %d scores token %d (vocabulary %d, %d edits)", i,
                           reqs[i].score_token, vocab, reqs[i].n_edits);
        if (reqs[i].n_edits < 0 || (reqs[i].n_edits > 0 && !reqs[i].edits))
            return rd_fail(RD_EINVAL, "cuda: sample: request %d has %d edits at %p", i, reqs[i].n_edits,
                           (const void *)reqs[i].edits);
        if (reqs[i].n_edits > 0) {
            n_edits += reqs[i].n_edits;
            n_proc++;
        }
    }
    if (n_edits > INT32_MAX) // sample_req.edit_off is an int32
        return rd_fail(RD_EINVAL, "cuda: sample: %lld logit edits in one call", (long long)n_edits);
    if (n > b->s_cap) {
        int32_t cap = b->s_cap > 0 ? b->s_cap : 64;
        while (cap < n)
            cap *= 2;
        if (b->capturing)
            return rd_fail(RD_EINVAL, "cuda: sample during graph capture");
        cudaFree(b->d_sreq);
        cudaFree(b->d_sres);
        cudaFreeHost(b->h_sreq);
        cudaFreeHost(b->h_sres);
        b->d_sreq = b->h_sreq = nullptr;
        b->d_sres = b->h_sres = nullptr;
        b->s_cap = 0;
        if (cudaMalloc((void **)&b->d_sreq, cap * sizeof(sample_req)) != cudaSuccess ||
            cudaMalloc((void **)&b->d_sres, cap * sizeof(sample_res)) != cudaSuccess ||
            cudaMallocHost((void **)&b->h_sreq, cap * sizeof(sample_req)) != cudaSuccess ||
            cudaMallocHost((void **)&b->h_sres, cap * sizeof(sample_res)) != cudaSuccess) {
            cudaGetLastError();
            return rd_fail(RD_ENOMEM, "cuda: cannot allocate sampling buffers for %d requests", cap);
        }
        b->s_cap = cap;
    }
    if (n_edits > 0) {
        const size_t edit_bytes = (size_t)n_edits * sizeof(sample_edit);
        const size_t proc_bytes = (size_t)n_proc * (size_t)vocab * sizeof(float);
        int rc = sample_grow(b, (void **)&b->d_sproc, &b->sproc_cap, proc_bytes, false, "edited logit rows");
        if (!rc)
            rc = sample_grow(b, (void **)&b->d_sedit, &b->d_sedit_cap, edit_bytes, false, "logit edits");
        if (!rc)
            rc = sample_grow(b, (void **)&b->h_sedit, &b->h_sedit_cap, edit_bytes, true, "logit edits");
        if (rc)
            return rc;
    }
    int32_t max_top = 0;        // the largest n_top: the tiled sampler's top keys per tile
    int32_t n_cut = 0;          // requests that draw through a top-k / top-p cut
    int32_t cut_rounds = 0;     // rounds of their key searches: 8 per search (top-k's, top-p's)
    if (!b->sample_cta) {
        for (int32_t i = 0; i < n; i++)
            max_top = reqs[i].sp->logprobs_topk > max_top ? reqs[i].sp->logprobs_topk : max_top;
        const size_t tiles = (size_t)n * (size_t)samp_tiles(vocab);
        const size_t count_bytes = (size_t)n * sizeof(unsigned);
        const bool new_counts = !b->d_scount || b->scount_cap < count_bytes;
        int rc = sample_grow(b, (void **)&b->d_stile, &b->stile_cap, tiles * sizeof(samp_tile), false,
                             "sampler tiles");
        if (!rc && max_top > 0)
            rc = sample_grow(b, (void **)&b->d_stop, &b->stop_cap, tiles * (size_t)max_top * sizeof(uint64_t),
                             false, "sampler top keys");
        if (!rc)
            rc = sample_grow(b, (void **)&b->d_scount, &b->scount_cap, count_bytes, false, "sampler counters");
        if (rc)
            return rc;
        if (new_counts && cudaMemsetAsync(b->d_scount, 0, b->scount_cap, b->st) != cudaSuccess)
            return cuda_fail(cudaGetLastError(), "sample: counters");
    }
    int64_t edit_off = 0;
    int32_t proc_row = 0;
    for (int32_t i = 0; i < n; i++) {
        const samp_params *sp = reqs[i].sp;
        sample_req &q = b->h_sreq[i];
        q.row = reqs[i].row;
        q.proc_row = -1;
        q.edit_off = 0;
        q.n_edits = reqs[i].n_edits;
        if (q.n_edits > 0) {
            q.proc_row = proc_row++;
            q.edit_off = (int32_t)edit_off;
            for (int32_t j = 0; j < q.n_edits; j++) {
                const samp_edit &se = reqs[i].edits[j];
                sample_edit &de = b->h_sedit[edit_off + j];
                de.token = se.token;
                de.n_out = se.n_out;
                de.seen = se.seen;
                de.mask = se.mask;
                de.pad = 0;
                de.bias = se.bias;
            }
            edit_off += q.n_edits;
        }
        q.rep = sp->repetition_penalty;
        q.freq = sp->frequency_penalty;
        q.pres = sp->presence_penalty;
        q.temperature = sp->temperature;
        q.top_k = sp->top_k;
        q.top_p = sp->top_p;
        q.min_p = sp->min_p;
        q.seed_lo = (uint32_t)sp->seed;
        q.seed_hi = (uint32_t)(sp->seed >> 32);
        q.sample_idx = reqs[i].sample_idx;
        q.pos = reqs[i].pos;
        q.n_top = sp->logprobs_topk;
        q.score_token = reqs[i].score ? reqs[i].score_token : -1;
        q.score_proc = reqs[i].score && sp->processed_logprobs;
        q.n_want = sp->n_want;
        for (int32_t j = 0; j < sp->n_want; j++)
            q.want_ids[j] = sp->want_ids[j];
        q.cut_slot = -1;
        if (!b->sample_cta && sample_has_cut(q, vocab)) {
            q.cut_slot = n_cut++;
            const int32_t searches = (q.top_k > 0 && q.top_k < vocab) + (q.top_p < 1.0f);
            cut_rounds = 8 * searches > cut_rounds ? 8 * searches : cut_rounds;
        }
    }
    if (n_cut > 0) {
        int rc = sample_grow(b, (void **)&b->d_scut, &b->scut_cap, (size_t)n * sizeof(samp_cut), false,
                             "sampler key searches");
        if (!rc)
            rc = sample_grow(b, (void **)&b->d_sbin, &b->sbin_cap,
                             (size_t)n_cut * (size_t)samp_tiles(vocab) * 256 * sizeof(samp_bin), false,
                             "sampler histograms");
        if (rc)
            return rc;
    }
    cudaError_t e = cudaMemcpyAsync(b->d_sreq, b->h_sreq, n * sizeof(sample_req), cudaMemcpyHostToDevice, b->st);
    if (e == cudaSuccess && n_edits > 0) {
        e = cudaMemcpyAsync(b->d_sedit, b->h_sedit, (size_t)n_edits * sizeof(sample_edit), cudaMemcpyHostToDevice,
                            b->st);
        if (e == cudaSuccess) {
            launch_edit_rows(b->st, logits, vocab, b->d_sreq, n, b->d_sedit, b->d_sproc);
            e = cudaGetLastError();
        }
    }
    if (e == cudaSuccess && b->sample_cta) {
        launch_sample(b->st, logits, n_edits > 0 ? b->d_sproc : nullptr, vocab, b->d_sreq, n, b->d_sres);
        e = cudaGetLastError();
    } else if (e == cudaSuccess) {
        launch_sample_tiled(b->st, logits, n_edits > 0 ? b->d_sproc : nullptr, vocab, b->d_sreq, n, b->d_stile,
                            b->d_stop, max_top, b->d_scount, n_cut, cut_rounds, b->d_scut, b->d_sbin, b->d_sres);
        e = cudaGetLastError();
    }
    if (e == cudaSuccess)
        e = cudaMemcpyAsync(b->h_sres, b->d_sres, n * sizeof(sample_res), cudaMemcpyDeviceToHost, b->st);
    if (e == cudaSuccess)
        e = cudaStreamSynchronize(b->st);
    if (e != cudaSuccess)
        return cuda_fail(e, "sample");
    for (int32_t i = 0; i < n; i++) {
        const sample_res &r = b->h_sres[i];
        samp_result &o = out[i];
        memset(&o, 0, sizeof o);
        o.token = r.token;
        o.logprob = r.logprob;
        o.logprob_processed = reqs[i].sp->processed_logprobs ? r.logprob_proc : NAN;
        o.rank = reqs[i].score ? r.rank : 0;
        for (int32_t j = 0; r.token >= 0 && j < reqs[i].sp->n_want; j++)
            o.want_lps[j] = r.want_lp[j];
        o.n_top = r.token >= 0 ? r.n_top : 0;
        for (int32_t j = 0; j < o.n_top; j++) {
            o.top_ids[j] = r.top_ids[j];
            o.top_logprobs[j] = r.top_lp[j];
        }
    }
    return take_err(b);
}

// ------------------------------------------------------------------ lifecycle

static int cu_describe(rd_backend *be, char *buf, size_t cap)
{
    cuda_be *b = impl(be);
    std::lock_guard<std::mutex> g(b->choice_mu);
    int k = snprintf(buf, cap, "%s: %s, %d SMs, %.1f GiB; kv %s;%s%s%s gemm%s%s%s:", RD_CUDA_NAME, b->dev_name,
                     b->n_sm, b->total_mem / 1073741824.0, b->kv_fp8 ? "fp8" : "bf16",
                     b->fuse_split ? "" : " fusions off (RD_CUDA_FUSE=0);",
                     b->sample_cta ? " sampler one CTA per request (RD_CUDA_SAMPLE=cta);" : "",
                     b->moe_tc ? " MoE experts on tensor cores (RD_CUDA_MOE=tc);" : "",
                     b->gemm_tc ? " (tensor-core kernel for bf16 linears, RD_CUDA_GEMM=tc)" : "",
                     b->fp8_q8   ? " (FP8 linears W8A8 on FP8 tensor cores, RD_CUDA_FP8=w8a8)"
                     : b->fp8_tc ? " (FP8 linears on tensor cores, RD_CUDA_FP8=tc)"
                                 : "",
                     b->q8_i8   ? " (Q8_0 weights kept Q8_0, linears W8A8 on int8 tensor cores, RD_CUDA_Q8=w8a8)"
                     : b->q8_tc ? " (Q8_0 weights kept Q8_0, linears on tensor cores, RD_CUDA_Q8=tc)"
                                : "");
    for (gemm_choice *c : b->choices) {
        if (k < 0 || (size_t)k >= cap)
            break;
        k += snprintf(buf + k, cap - k, " [%dx%d%s: %s]", c->out, c->in, c->f32 ? " fp32" : "", c->what);
    }
    for (const auto &e : b->tc_plans) {
        if (k < 0 || (size_t)k >= cap)
            break;
        k += snprintf(buf + k, cap - k, " [%dx%d: tensor-core kernel, %d sub-pieces of %d (%d warps x %d CTAs along K)]",
                      e.first.first, e.first.second, e.second.q, e.second.kp, e.second.wk, e.second.p);
    }
    return 0;
}

static void cu_destroy(rd_backend *be)
{
    cuda_be *b = impl(be);
    if (b->capturing) {
        cudaGraph_t g = nullptr;
        cudaStreamEndCapture(b->st, &g);
        if (g)
            cudaGraphDestroy(g);
    }
    cudaStreamSynchronize(b->st);
    for (gemm_choice *c : b->choices)
        delete c;
    for (shadow &s : b->sh)
        if (s.bf)
            cudaFree(s.bf);
    if (b->xb) cudaFree(b->xb);
    if (b->ysplit) cudaFree(b->ysplit);
    if (b->tc_part) cudaFree(b->tc_part);
    if (b->tc_count) cudaFree(b->tc_count);
    if (b->yhead) cudaFree(b->yhead);
    if (b->part_o) cudaFree(b->part_o);
    if (b->attn_count) cudaFree(b->attn_count);
    if (b->part_ms) cudaFree(b->part_ms);
    if (b->d_step) cudaFree(b->d_step);
    if (b->h_step) cudaFreeHost(b->h_step);
    for (moe_table *t : b->moe_tables)
        moe_table_free(t);
    if (b->moe_idx) cudaFree(b->moe_idx);
    if (b->moe_act) cudaFree(b->moe_act);
    if (b->moe_h) cudaFree(b->moe_h);
    if (b->moe_count) cudaFree(b->moe_count);
    for (lora_table *t : b->lora_tables)
        lora_table_free(t);
    if (b->lora_t) cudaFree(b->lora_t);
    if (b->d_sreq) cudaFree(b->d_sreq);
    if (b->d_sres) cudaFree(b->d_sres);
    if (b->h_sreq) cudaFreeHost(b->h_sreq);
    if (b->h_sres) cudaFreeHost(b->h_sres);
    if (b->d_sedit) cudaFree(b->d_sedit);
    if (b->h_sedit) cudaFreeHost(b->h_sedit);
    if (b->d_sproc) cudaFree(b->d_sproc);
    if (b->d_stile) cudaFree(b->d_stile);
    if (b->d_stop) cudaFree(b->d_stop);
    if (b->d_scount) cudaFree(b->d_scount);
    if (b->d_scut) cudaFree(b->d_scut);
    if (b->d_sbin) cudaFree(b->d_sbin);
    if (b->step_ev) cudaEventDestroy(b->step_ev);
#ifndef RD_CUDA_EMU
    if (b->lt) cublasLtDestroy(b->lt);
    if (b->lt_aux) cublasLtDestroy(b->lt_aux);
    if (b->ws) cudaFree(b->ws);
    if (b->ws_aux) cudaFree(b->ws_aux);
#endif
    cudaStreamDestroy(b->st);
    cudaStreamDestroy(b->aux);
    delete b;
}

// kv_dtype: the cache is bf16 and nothing else.
static int cu_set_kv_dtype(rd_backend *be, const char *name)
{
    cuda_be *b = impl(be);
    if (strcmp(name, "bf16") && strcmp(name, "auto") && strcmp(name, "fp8"))
        return rd_fail(RD_ENOTSUP, "kv_dtype \"%s\": the %s backend stores the KV cache as bf16 or fp8 (use \"bf16\", "
                       "\"auto\" or \"fp8\")", name, be->ops->name);
    b->kv_fp8 = !strcmp(name, "fp8");
    b->ops.kv_elem_bytes = b->kv_fp8 ? 1 : 2;
    b->ops.kv_scale_bytes = b->kv_fp8 ? 1 : 0;
    return 0;
}

static int64_t cu_linear_bytes(rd_backend *be, const void *handle)
{
    const weight *W = (const weight *)handle;
    const int64_t n = (int64_t)W->out * W->in;
    if (W->q8)
        return n + n / Q8_BLOCK * (int64_t)sizeof(uint16_t);
    return W->f8 ? n + n / RD_FP8_BLOCK : n * (int64_t)sizeof(uint16_t);
}

static void cu_linear_bytes_by_type(rd_backend *be, const void *handle, int64_t *bytes)
{
    const weight *W = (const weight *)handle;
    bytes[W->f8 ? RD_TYPE_FP8_B32 : W->q8 ? GGML_Q8_0 : GGML_BF16] += cu_linear_bytes(be, handle);
}

static rd_backend_ops make_ops()
{
    rd_backend_ops o;
    memset(&o, 0, sizeof o);
    o.name = RD_CUDA_NAME;
    o.alloc = cu_alloc;
    o.free = cu_free;
    o.h2d = cu_h2d;
    o.d2h = cu_d2h;
    o.sync = cu_sync;
    o.linear_load = cu_linear_load;
    o.linear_free = cu_linear_free;
    o.linear_read = cu_linear_read;
    o.linear_read_native = cu_linear_read_native;
    o.linear_load_q = cu_linear_load_q;
    o.linear_bytes = cu_linear_bytes;
    o.linear_bytes_by_type = cu_linear_bytes_by_type;
    o.linear = cu_linear;
    o.embed = cu_embed;
    o.rmsnorm = cu_rmsnorm;
    o.add_bias = cu_add_bias;
    o.head_rmsnorm = cu_head_rmsnorm;
    o.rope = cu_rope;
    o.swiglu = cu_swiglu;
    o.geglu = cu_geglu;
    o.rmsnorm_add = cu_rmsnorm_add;
    o.gather_rows = cu_gather_rows;
    o.moe_route = cu_moe_route;
    o.moe_ffn = cu_moe_ffn;
    o.moe_release = cu_moe_release;
    o.lora_load = cu_lora_load;
    o.lora_free = cu_lora_free;
    o.lora_bytes = cu_lora_bytes;
    o.lora_apply = cu_lora_apply;
    o.lora_release = cu_lora_release;
    o.kv_write = cu_kv_write;
    o.attention = cu_attention;
    o.copy_blocks = cu_copy_blocks;
    o.step_upload = cu_step_upload;
    o.destroy = cu_destroy;
    o.set_kv_dtype = cu_set_kv_dtype;
    o.kv_elem_bytes = 2;
    o.lm_head = cu_lm_head;
    o.d2d = cu_d2d;
    o.mem_info = cu_mem_info;
    o.describe = cu_describe;
    o.graph_begin = cu_graph_begin;
    o.graph_end = cu_graph_end;
    o.graph_launch = cu_graph_launch;
    o.graph_free = cu_graph_free;
    o.sample = cu_sample;
    return o;
}

static const rd_backend_ops cuda_ops = make_ops();

// The switches create reads and the values each takes ("#": a non-negative
// integer); unset or empty is the default. Anything else fails creation, so
// a misspelt switch never runs, and is timed as, the default.
struct env_switch {
    const char *name;
    const char *values[6];      // NULL-terminated
};
static const env_switch env_switches[] = {
    {"RD_CUDA_DEVICE", {"#"}},        {"RD_CUDA_SHADOW", {"0", "1"}},     {"RD_CUDA_ACT", {"bf16", "mixed"}},
    {"RD_CUDA_HEAD", {"fp32"}},       {"RD_CUDA_FUSE", {"0", "1"}},       {"RD_CUDA_GEMM", {"simple", "tc"}},
    {"RD_CUDA_FP8", {"tc", "w8a8"}},  {"RD_CUDA_Q8", {"tc", "w8a8"}},     {"RD_CUDA_MOE", {"tc"}},
    {"RD_CUDA_NORM_ROWS", {"#"}},     {"RD_CUDA_PDL", {"0", "1"}},        {"RD_CUDA_ATTN_FUSE", {"0", "1"}},
    {"RD_CUDA_ATTN_V0", {"0", "1"}},  {"RD_CUDA_TC_BIG_ROWS", {"#"}},     {"RD_CUDA_TC_TILE", {"64", "128"}},
    {"RD_CUDA_TC_HNORM", {"0", "1"}}, {"RD_CUDA_NORM_V0", {"0", "1"}}, {"RD_CUDA_TC_ROUTE", {"0", "1"}},
    {"RD_CUDA_TC_PIPE", {"0", "2", "3", "4", "6"}}, {"RD_CUDA_SAMPLE", {"cta"}}, {"RD_CUDA_TC_NORMADD", {"0", "1"}},
    {"RD_CUDA_TC_LORA", {"0", "1"}},  {"RD_CUDA_TC_WG", {"0", "1", "2", "4", "auto"}},
    {"RD_CUDA_TC_ORDER", {"batch", "weight"}},
};

static bool env_number(const char *v)
{
    char *end = nullptr;
    const long n = strtol(v, &end, 10);
    return *v >= '0' && *v <= '9' && *end == 0 && n >= 0 && n <= 1000000;
}

static int env_check(void)
{
    for (const env_switch &sw : env_switches) {
        const char *v = env(sw.name);
        if (!v)
            continue;
        bool ok = false;
        char list[64] = "";
        for (int i = 0; sw.values[i] && !ok; i++) {
            ok = !strcmp(sw.values[i], "#") ? env_number(v) : !strcmp(sw.values[i], v);
            const size_t at = strlen(list);
            snprintf(list + at, sizeof list - at, "%s%s", i ? ", " : "",
                     !strcmp(sw.values[i], "#") ? "a non-negative integer" : sw.values[i]);
        }
        if (!ok)
            return rd_fail(RD_EINVAL, "backend '%s': %s=%s is not a value it takes (%s; unset for the default)",
                           RD_CUDA_NAME, sw.name, v, list);
    }
    return 0;
}

static int create(int n_threads, rd_backend **out)
{
    *out = nullptr;
    if (int rc = env_check())
        return rc;
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess || n == 0) {
        cudaGetLastError();
        return rd_fail(RD_ENODEV, "backend 'cuda': no usable CUDA device (%s)",
                       e != cudaSuccess ? cudaGetErrorString(e) : "device count is 0");
    }
    int dev = 0;
    if (const char *d = env("RD_CUDA_DEVICE"))
        dev = atoi(d);
    if (dev < 0 || dev >= n)
        return rd_fail(RD_ENODEV, "backend 'cuda': RD_CUDA_DEVICE=%d but %d device(s) present", dev, n);
    if ((e = cudaSetDevice(dev)) != cudaSuccess)
        return rd_fail(RD_ENODEV, "backend 'cuda': cudaSetDevice(%d): %s", dev, cudaGetErrorString(e));
    cudaDeviceProp prop;
    if ((e = cudaGetDeviceProperties(&prop, dev)) != cudaSuccess)
        return rd_fail(RD_ENODEV, "backend 'cuda': device %d: %s", dev, cudaGetErrorString(e));

    const char *wg = env("RD_CUDA_TC_WG"); // sm_90a code only: refused elsewhere rather than ignored
    if (wg && strcmp(wg, "0") && !(prop.major == 9 && prop.minor == 0))
        return rd_fail(RD_EINVAL, "backend '%s': RD_CUDA_TC_WG=%s needs a compute capability 9.0 device (wgmma); "
                       "device %d is %d.%d", RD_CUDA_NAME, wg, dev, prop.major, prop.minor);

    cuda_be *b = new cuda_be();
    b->ops = cuda_ops;
    b->base.ops = &b->ops;
    b->base.n_threads = n_threads;
    b->base.impl = b;
    b->dev = dev;
    b->n_sm = prop.multiProcessorCount;
    snprintf(b->dev_name, sizeof b->dev_name, "%s", prop.name);
    b->total_mem = prop.totalGlobalMem;
    const char *sh = env("RD_CUDA_SHADOW");
    b->use_shadow = !(sh && !strcmp(sh, "0"));
    const char *act = env("RD_CUDA_ACT");
    b->split = !(act && !strcmp(act, "bf16")); // default: split (see the header comment)
    b->split_contracting_only = act && !strcmp(act, "mixed");
    const char *hd = env("RD_CUDA_HEAD");
    b->head_fp32 = hd && !strcmp(hd, "fp32");
    const char *fu = env("RD_CUDA_FUSE");
    b->fuse_split = !(fu && !strcmp(fu, "0"));
    const char *gm = env("RD_CUDA_GEMM");
    b->gemm_simple_only = gm && !strcmp(gm, "simple");
    b->gemm_tc = gm && !strcmp(gm, "tc");
    const char *f8 = env("RD_CUDA_FP8");
    b->fp8_q8 = f8 && !strcmp(f8, "w8a8");
    b->fp8_tc = b->fp8_q8 || (f8 && !strcmp(f8, "tc"));
    const char *q8 = env("RD_CUDA_Q8");
    b->q8_i8 = q8 && !strcmp(q8, "w8a8");
    b->q8_tc = b->q8_i8 || (q8 && !strcmp(q8, "tc"));
    const char *mo = env("RD_CUDA_MOE");
    b->moe_tc = mo && !strcmp(mo, "tc");
    // The tensor-core GEMM reads fp32 activations: the producers' bf16 copies would go unread.
    if (b->gemm_tc)
        b->use_shadow = false;
    const char *nr = env("RD_CUDA_NORM_ROWS");
    b->tc_norm_rows = nr ? atoi(nr) : 8;
#ifndef RD_CUDA_EMU
    const char *pd = env("RD_CUDA_PDL");
    rd_pdl = pd && !strcmp(pd, "1");
#endif
    const char *nv0 = env("RD_CUDA_NORM_V0");
    b->norm_v0 = nv0 && !strcmp(nv0, "1");
    const char *sa = env("RD_CUDA_SAMPLE");
    b->sample_cta = sa && !strcmp(sa, "cta");
    const char *tr = env("RD_CUDA_TC_ROUTE");
    b->tc_route = !(tr && !strcmp(tr, "0"));
    const char *na = env("RD_CUDA_TC_NORMADD");
    b->tc_normadd = !(na && !strcmp(na, "0"));
    const char *tl = env("RD_CUDA_TC_LORA");
    b->tc_lora = !(tl && !strcmp(tl, "0"));
    const char *hn = env("RD_CUDA_TC_HNORM");
    b->tc_hnorm = !(hn && !strcmp(hn, "0"));
    const char *af = env("RD_CUDA_ATTN_FUSE");
    b->attn_fuse = !(af && !strcmp(af, "0"));
    const char *a0 = env("RD_CUDA_ATTN_V0");
    b->attn_v0 = a0 && !strcmp(a0, "1");
    const char *br = env("RD_CUDA_TC_BIG_ROWS");
    b->tc_big_rows = br ? atoi(br) : 128;
    const char *tt = env("RD_CUDA_TC_TILE");
    b->tc_tile = tt && !strcmp(tt, "128") ? 128 : 64;
    const char *to = env("RD_CUDA_TC_ORDER");
    b->tc_wmajor = to && !strcmp(to, "weight");
    const char *tp = env("RD_CUDA_TC_PIPE");
    b->tc_stages = tp ? atoi(tp) : 4;
    b->tc_wg = wg ? (!strcmp(wg, "auto") ? -1 : atoi(wg)) : 0;
#ifdef RD_CUDA_EMU
    b->gemm_simple_only = true;
#endif
    bool ok = cudaStreamCreateWithFlags(&b->st, cudaStreamNonBlocking) == cudaSuccess &&
              cudaStreamCreateWithFlags(&b->aux, cudaStreamNonBlocking) == cudaSuccess &&
              cudaEventCreate(&b->step_ev) == cudaSuccess;
#ifndef RD_CUDA_EMU
    ok = ok && cublasLtCreate(&b->lt) == CUBLAS_STATUS_SUCCESS && cublasLtCreate(&b->lt_aux) == CUBLAS_STATUS_SUCCESS &&
         cudaMalloc(&b->ws, LT_WS_BYTES) == cudaSuccess && cudaMalloc(&b->ws_aux, LT_WS_BYTES) == cudaSuccess;
#endif
    ok = ok && (b->tc_stages == 0 || gemm_tc_setup(b->tc_stages) == cudaSuccess);
    ok = ok && (b->tc_stages == 0 || b->tc_wg == 0 || gemm_tc_wgp_setup(b->tc_stages) == cudaSuccess);
    if (!ok) {
        const char *why = cudaGetErrorString(cudaGetLastError());
        cu_destroy(&b->base);
        return rd_fail(RD_ENODEV, "backend 'cuda': cannot set up streams/cuBLASLt/kernels on device %d (%s)", dev, why);
    }
    *out = &b->base;
    return 0;
}

}  // namespace RD_NS

extern "C" int RD_CUDA_ENTRY(int n_threads, rd_backend **out) { return RD_NS::create(n_threads, out); }
