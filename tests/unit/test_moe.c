/* test_moe.c - mixture of experts on the CPU backend: the routing and expert
 * ops against a double-precision reference and against the dense ops they
 * are defined by, their batch invariance, and routing replay through the
 * engine (alone vs in batches, prefix-cache hits, preemption, forked
 * samples). The model is a tiny random Qwen3-MoE built in memory. */
#include <math.h>
#include <stdint.h>

#include "base/err.h"
#include "engine/backend.h"
#include "engine/model/model.h"
#include "engine/model/runner.h"
#include "engine/serve/engine.h"
#include "tests/unit/engine_helpers.h"
#include "tests/unit/test.h"

static uint64_t rng_state;

static uint64_t next_u64(void)
{
    uint64_t x = rng_state;
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    return rng_state = x;
}

/* Uniform in [-1, 1). */
static float uni(void) { return (float)((double)(next_u64() >> 11) / 9007199254740992.0 * 2.0 - 1.0); }

static uint64_t hash(const char *s)
{
    uint64_t h = 1469598103934665603ull;
    for (; *s; s++)
        h = (h ^ (uint8_t)*s) * 1099511628211ull;
    return h | 1;
}

/* Weights drawn from the tensor's name: norms near 1, the router wide (so
 * tokens spread over the experts), the rest small. */
static int fetch_random(void *ctx, const char *name, int64_t rows, int64_t cols, float *dst)
{
    rng_state = hash(name);
    float scale = strstr(name, "norm") ? 0.1f : strstr(name, "mlp.gate.") ? 1.0f : 0.15f;
    for (int64_t i = 0; i < rows * cols; i++)
        dst[i] = (strstr(name, "norm") ? 1.0f : 0.0f) + scale * uni();
    return 0;
}

static model_config moe_config(void)
{
    model_config c;
    memset(&c, 0, sizeof c);
    snprintf(c.arch, sizeof c.arch, "qwen3moe");
    c.n_layers = 2, c.dim = 64, c.n_heads = 4, c.n_kv_heads = 2, c.head_dim = 16, c.ffn_dim = 64;
    c.vocab = 97, c.max_ctx = 256, c.rope_theta = 10000, c.norm_eps = 1e-6f, c.tied_embeddings = 1;
    c.n_experts = 16, c.n_experts_used = 4, c.expert_ffn_dim = 32, c.moe_norm_topk = 1;
    return c;
}

static rd_backend *cpu(void)
{
    rd_backend *be = NULL;
    if (rd_backend_create("cpu", test_threads(2), &be))
        return NULL;
    return be;
}

/* ---------------------------------------------------------------- the ops */

/* softmax in double, then the k largest (ties to the lower id) */
static void ref_route(const float *l, int32_t E, int32_t k, int norm, int32_t *ids, double *w)
{
    double p[RD_MOE_MAX_EXPERTS], mx = l[0], sum = 0;
    for (int32_t e = 1; e < E; e++)
        mx = l[e] > mx ? l[e] : mx;
    for (int32_t e = 0; e < E; e++)
        sum += p[e] = exp((double)l[e] - mx);
    int taken[RD_MOE_MAX_EXPERTS] = {0};
    double ws = 0;
    for (int32_t j = 0; j < k; j++) {
        int32_t b = -1;
        for (int32_t e = 0; e < E; e++)
            if (!taken[e] && (b < 0 || p[e] > p[b]))
                b = e;
        taken[b] = 1;
        ids[j] = b;
        ws += w[j] = p[b] / sum;
    }
    for (int32_t j = 0; norm && j < k; j++)
        w[j] /= ws;
}

static void test_route_matches_reference(void)
{
    rd_backend *be = cpu();
    CHECK(be, "cpu backend: %s", rd_errmsg());
    enum { M = 50, E = 16, K = 4 };
    float logits[M * E], w[M * K];
    int32_t ids[M * K];
    rng_state = 7;
    for (int i = 0; i < M * E; i++)
        logits[i] = 3.0f * uni();
    /* row 0: all equal (ties everywhere: ids 0..k-1); row 1: a tie at the k-th place */
    for (int e = 0; e < E; e++)
        logits[e] = 0.5f;
    for (int e = 0; e < E; e++)
        logits[E + e] = e < 3 ? 2.0f : e == 9 || e == 5 ? 1.0f : -1.0f;
    for (int norm = 0; norm < 2; norm++) {
        be->ops->moe_route(be, logits, M, E, K, norm, ids, w);
        for (int i = 0; i < M; i++) {
            int32_t rid[K];
            double rw[K];
            ref_route(logits + i * E, E, K, norm, rid, rw);
            for (int j = 0; j < K; j++) {
                CHECK(ids[i * K + j] == rid[j], "norm %d row %d route %d: expert %d, reference %d", norm, i, j,
                      ids[i * K + j], rid[j]);
                CHECK(fabs(w[i * K + j] - rw[j]) <= 1e-6 * rw[j] + 1e-9, "norm %d row %d route %d: %g vs %g", norm,
                      i, j, w[i * K + j], rw[j]);
            }
        }
    }
    CHECK(ids[0] == 0 && ids[1] == 1 && ids[2] == 2 && ids[3] == 3, "all tied: lower ids first");
    CHECK(ids[K + 3] == 5, "tie at the k-th place goes to the lower id, got %d", ids[K + 3]);
    /* A NaN row (a NaN hidden state) still names k distinct experts in range, with NaN weights. */
    logits[7] = NAN;
    be->ops->moe_route(be, logits, 1, E, K, 1, ids, w);
    for (int j = 0; j < K; j++)
        CHECK(ids[j] == j && isnan(w[j]), "NaN row: route %d is expert %d weight %g", j, ids[j], w[j]);
    rd_backend_destroy(be);
}

/* The experts' weights of one layer as backend linears, from fetch_random. */
typedef struct {
    void *gu[16], *down[16];
    rd_moe moe;
} experts;

static int load_experts(rd_backend *be, int32_t E, int32_t d, int32_t f, experts *x)
{
    float *w = malloc(sizeof(float) * 2 * (size_t)f * d);
    int rc = w ? 0 : RD_ENOMEM;
    for (int32_t e = 0; e < E && !rc; e++) {
        char name[64];
        snprintf(name, sizeof name, "gate_up.%d", e);
        fetch_random(NULL, name, 2 * f, d, w);
        if ((rc = be->ops->linear_load(be, w, 2 * f, d, &x->gu[e])))
            break;
        snprintf(name, sizeof name, "down.%d", e);
        fetch_random(NULL, name, d, f, w);
        rc = be->ops->linear_load(be, w, d, f, &x->down[e]);
    }
    free(w);
    x->moe = (rd_moe){.n_experts = E, .ffn = f, .dim = d, .gate_up = x->gu, .down = x->down};
    return rc;
}

/* moe_ffn is defined by the dense ops on one row: linear, swiglu, linear,
 * then fmaf over the routes in order. It must equal that bit for bit, and a
 * double computation of the same to float rounding; and a row's output must
 * not depend on the batch around it. */
static void test_ffn_is_the_dense_ops_and_batch_invariant(void)
{
    rd_backend *be = cpu();
    CHECK(be, "cpu backend: %s", rd_errmsg());
    enum { E = 12, D = 48, F = 40, K = 3, M = 37 };
    experts x;
    CHECK_OK(load_experts(be, E, D, F, &x));
    static float in[M * D], y[M * D], y1[D], gu[2 * F], ff[F], h[D], acc[D];
    static int32_t ids[M * K];
    static float w[M * K];
    rng_state = 11;
    for (int i = 0; i < M * D; i++)
        in[i] = uni();
    for (int i = 0; i < M; i++)
        for (int j = 0; j < K; j++) {
            /* distinct experts per row, rows 0..2 all on expert 5 (shared) */
            ids[i * K + j] = i < 3 && j == 0 ? 5 : (int32_t)((i * 7 + j * 5 + 1) % E);
            w[i * K + j] = 0.2f + 0.3f * (uni() + 1.0f);
        }
    int hit[E] = {0};
    for (int i = 0; i < M * K; i++)
        hit[ids[i]]++;
    for (int e = 0; e < E; e++)
        CHECK(hit[e] > 0, "expert %d unused by the case", e);
    memset(y, 0, sizeof y);
    be->ops->moe_ffn(be, &x.moe, in, ids, w, M, K, y);
    for (int i = 0; i < M; i++) {
        memset(acc, 0, sizeof acc);
        for (int j = 0; j < K; j++) {
            int e = ids[i * K + j];
            be->ops->linear(be, x.gu[e], in + i * D, 1, gu, 0);
            be->ops->swiglu(be, gu, 1, F, ff);
            be->ops->linear(be, x.down[e], ff, 1, h, 0);
            for (int c = 0; c < D; c++)
                acc[c] = fmaf(w[i * K + j], h[c], acc[c]);
        }
        CHECK(!memcmp(acc, y + i * D, sizeof acc), "row %d differs from the dense ops", i);
        /* the same row alone, on top of a residual */
        for (int c = 0; c < D; c++)
            y1[c] = 1.0f;
        be->ops->moe_ffn(be, &x.moe, in + i * D, ids + i * K, w + i * K, 1, K, y1);
        for (int c = 0; c < D; c++)
            CHECK(y1[c] == 1.0f + y[i * D + c], "row %d alone differs at %d", i, c);
    }
    for (int e = 0; e < E; e++) {
        be->ops->linear_free(be, x.gu[e]);
        be->ops->linear_free(be, x.down[e]);
    }
    rd_backend_destroy(be);
}

/* ---------------------------------------------------------------- the engine */

static model *moe_model(rd_backend *be)
{
    model_config c = moe_config();
    model *m = NULL;
    if (model_build(&c, be, fetch_random, NULL, &m))
        return NULL;
    return m;
}

static engine *moe_engine(model *m, int64_t kv_bytes, int32_t max_seqs)
{
    eng_config ec = eng_default_config();
    ec.kv_cache_bytes = kv_bytes;
    ec.max_num_seqs = max_seqs;
    ec.max_batch_tokens = 256;
    engine *e = NULL;
    if (eng_create(m, &ec, &e))
        return NULL;
    return e;
}

static void prompt_of(int32_t seed, int32_t n, int32_t *out)
{
    rng_state = 1000 + (uint64_t)seed;
    for (int32_t i = 0; i < n; i++)
        out[i] = (int32_t)(next_u64() % 97);
}

static eng_request greedy(const int32_t *prompt, int32_t n, int32_t max_tokens)
{
    eng_request r;
    memset(&r, 0, sizeof r);
    r.prompt = prompt;
    r.n_prompt = n;
    r.n = 1;
    r.max_tokens = max_tokens;
    r.sp = samp_default();
    r.sp.temperature = 0.0f;
    r.ignore_eos = 1;
    r.return_routes = 1;
    return r;
}

/* Two results of the same request: the same tokens, log-probs and routes. */
static int same_result(const eng_result *a, const eng_result *b, char *why, size_t cap)
{
    if (a->n_tokens != b->n_tokens || memcmp(a->token_ids, b->token_ids, sizeof(int32_t) * a->n_tokens))
        return snprintf(why, cap, "tokens differ"), 0;
    if (memcmp(a->logprobs, b->logprobs, sizeof(float) * a->n_tokens))
        return snprintf(why, cap, "log-probs differ"), 0;
    if (a->n_routes != b->n_routes || a->route_layers != b->route_layers || a->route_k != b->route_k)
        return snprintf(why, cap, "route shapes %d/%d/%d vs %d/%d/%d", a->n_routes, a->route_layers, a->route_k,
                        b->n_routes, b->route_layers, b->route_k), 0;
    size_t n = (size_t)a->n_routes * a->route_layers * a->route_k;
    for (size_t i = 0; i < n; i++)
        if (a->routes[i] != b->routes[i])
            return snprintf(why, cap, "route %zu (position %zu): %d vs %d", i, i / (a->route_layers * a->route_k),
                            a->routes[i], b->routes[i]), 0;
    return 1;
}

/* The routes of a prompt prefilled alone in one runner step. */
static int prefill_routes(model *m, const int32_t *tok, int32_t n, int32_t *routes /* [L][n][k] */)
{
    float *logits = malloc(sizeof(float) * (size_t)n * m->cfg.vocab);
    const int32_t bs = 16, nb = (n + bs - 1) / bs;
    runner r;
    int rc = logits ? runner_init(&r, m, nb, bs, n, n) : RD_ENOMEM;
    if (rc) {
        free(logits);
        return rc;
    }
    int32_t pos[256], rows[256], table[16], qs[2] = {0, n}, ctx = n;
    for (int32_t i = 0; i < n; i++)
        pos[i] = rows[i] = i;
    for (int32_t i = 0; i < nb; i++)
        table[i] = i;
    rd_step s = {.n_rows = n, .n_seqs = 1, .max_blocks = nb, .token_ids = tok, .positions = pos, .slots = pos,
                 .q_start = qs, .ctx_len = &ctx, .block_tables = table};
    rc = runner_forward(&r, &s, rows, n, logits);
    if (!rc)
        rc = runner_routes(&r, n, routes);
    runner_free(&r);
    free(logits);
    return rc;
}

static void test_routes_alone_and_in_batches(void)
{
    rd_backend *be = cpu();
    CHECK(be, "cpu backend: %s", rd_errmsg());
    model *m = moe_model(be);
    CHECK(m, "model: %s", rd_errmsg());
    const int32_t L = m->cfg.n_layers, K = m->cfg.n_experts_used, NP = 21, GEN = 12;
    int32_t prompt[NP];
    prompt_of(0, NP, prompt);

    res_set *alone = calloc(1, sizeof *alone), *mixed = calloc(1, sizeof *mixed);
    CHECK(alone && mixed, "oom");
    engine *e = moe_engine(m, 4 << 20, 64);
    CHECK(e, "engine: %s", rd_errmsg());
    eng_request rq = greedy(prompt, NP, GEN);
    int64_t id;
    CHECK_OK(eng_add(e, &rq, &id));
    CHECK_OK(drive(e, alone));
    CHECK(alone->n == 1, "%d results", alone->n);
    const eng_result *a = &alone->r[0];
    CHECK(a->n_tokens == GEN && a->n_routes == NP + GEN - 1 && a->route_layers == L && a->route_k == K,
          "tokens %d routes %d x %d x %d", a->n_tokens, a->n_routes, a->route_layers, a->route_k);

    /* The prompt's routes are those of a plain prefill, and every expert is hit somewhere. */
    int32_t *pre = malloc(sizeof(int32_t) * (size_t)L * NP * K);
    CHECK(pre, "oom");
    CHECK_OK(prefill_routes(m, prompt, NP, pre));
    int hit[16] = {0};
    for (int32_t p = 0; p < NP; p++)
        for (int32_t l = 0; l < L; l++)
            for (int32_t j = 0; j < K; j++) {
                int32_t got = a->routes[((size_t)p * L + l) * K + j];
                CHECK(got == pre[((size_t)l * NP + p) * K + j], "position %d layer %d route %d: %d vs prefill %d",
                      p, l, j, got, pre[((size_t)l * NP + p) * K + j]);
                CHECK(got >= 0 && got < m->cfg.n_experts, "expert %d", got);
                hit[got]++;
            }
    free(pre);
    for (int32_t x = 0; x < m->cfg.n_experts; x++)
        CHECK(hit[x] > 0, "expert %d never routed to: the case does not exercise it", x);

    /* The same request among 1, 7 and 63 others, of other lengths. */
    int32_t others[64][40];
    for (int round = 0, sizes[] = {1, 7, 63}; round < 3; round++) {
        for (int i = 0; i < mixed->n; i++)
            eng_result_free(&mixed->r[i]);
        mixed->n = 0;
        int64_t want = -1;
        for (int i = 0; i <= sizes[round]; i++) {
            if (i == sizes[round] / 2) {
                CHECK_OK(eng_add(e, &rq, &want));
                continue;
            }
            int32_t n = 5 + (i * 13) % 35;
            prompt_of(100 + i + 1000 * round, n, others[i]);
            eng_request o = greedy(others[i], n, 3 + i % 17);
            CHECK_OK(eng_add(e, &o, &id));
        }
        CHECK_OK(drive(e, mixed));
        const eng_result *b = res_find(mixed, want, 0);
        char why[160];
        CHECK(b && same_result(a, b, why, sizeof why), "in a batch of %d: %s", sizes[round] + 1, b ? why : "no result");
    }
    /* prefix-cache hit: the prompt's blocks come from the cache, routes with them */
    eng_stats st;
    eng_get_stats(e, &st);
    CHECK(st.prefix_hit_tokens > 0, "the repeated prompt never hit the prefix cache");
    for (int i = 0; i < mixed->n; i++)
        eng_result_free(&mixed->r[i]);
    free(mixed);
    eng_destroy(e);

    /* preemption: a pool too small for all at once recomputes; the routes stay */
    e = moe_engine(m, 20 * 16 * (int64_t)model_kv_bytes_per_token(&m->cfg), 64);
    CHECK(e, "engine: %s", rd_errmsg());
    res_set *small = calloc(1, sizeof *small);
    int64_t want = -1;
    for (int i = 0; i < 12; i++) {
        if (i == 3) {
            CHECK_OK(eng_add(e, &rq, &want));
            continue;
        }
        prompt_of(500 + i, 30, others[i]);
        eng_request o = greedy(others[i], 30, 40);
        CHECK_OK(eng_add(e, &o, &id));
    }
    CHECK_OK(drive(e, small));
    eng_get_stats(e, &st);
    CHECK(st.preemptions > 0, "no preemption happened: the case does not exercise it");
    const eng_result *b = res_find(small, want, 0);
    char why[160];
    CHECK(b && same_result(a, b, why, sizeof why), "under preemption (%d of them): %s", b ? b->n_preempt : -1,
          b ? why : "no result");
    for (int i = 0; i < small->n; i++)
        eng_result_free(&small->r[i]);
    free(small);
    eng_destroy(e);

    /* n = 3 samples fork from one prefill: each carries the prompt's routes */
    e = moe_engine(m, 4 << 20, 64);
    res_set *forks = calloc(1, sizeof *forks);
    eng_request r3 = rq;
    r3.n = 3;
    r3.sp.temperature = 1.0f;
    r3.sp.seed = 5;
    CHECK_OK(eng_add(e, &r3, &id));
    CHECK_OK(drive(e, forks));
    CHECK(forks->n == 3, "%d samples", forks->n);
    for (int i = 0; i < 3; i++) {
        const eng_result *f = &forks->r[i];
        CHECK(f->n_routes == NP + f->n_tokens - 1, "sample %d: %d routes for %d tokens", i, f->n_routes,
              f->n_tokens);
        CHECK(!memcmp(f->routes, a->routes, sizeof(int32_t) * (size_t)NP * L * K), "sample %d: prompt routes differ",
              i);
    }
    for (int i = 0; i < forks->n; i++)
        eng_result_free(&forks->r[i]);
    free(forks);
    eng_destroy(e);

    eng_result_free(&alone->r[0]);
    free(alone);
    model_free(m);
    rd_backend_destroy(be);
}

/* Not asked: no routes; asked of a dense model: refused with a reason. */
static void test_routes_only_when_asked_and_only_for_moe(void)
{
    rd_backend *be = cpu();
    CHECK(be, "cpu backend: %s", rd_errmsg());
    model *m = moe_model(be);
    CHECK(m, "model: %s", rd_errmsg());
    engine *e = moe_engine(m, 4 << 20, 8);
    int32_t prompt[9];
    prompt_of(3, 9, prompt);
    eng_request rq = greedy(prompt, 9, 4);
    rq.return_routes = 0;
    int64_t id;
    res_set *rs = calloc(1, sizeof *rs);
    CHECK_OK(eng_add(e, &rq, &id));
    CHECK_OK(drive(e, rs));
    CHECK(rs->n == 1 && rs->r[0].n_routes == 0 && rs->r[0].routes == NULL, "routes without asking");
    eng_result_free(&rs->r[0]);
    free(rs);
    eng_destroy(e);
    model_free(m);

    model_config c = moe_config();
    snprintf(c.arch, sizeof c.arch, "qwen3");
    c.n_experts = c.n_experts_used = c.expert_ffn_dim = 0;
    CHECK_OK(model_build(&c, be, fetch_random, NULL, &m));
    e = moe_engine(m, 4 << 20, 8);
    CHECK(e, "engine: %s", rd_errmsg());
    rq.return_routes = 1;
    CHECK(eng_add(e, &rq, &id) == RD_EINVAL && strstr(rd_errmsg(), "not a mixture-of-experts"), "%s", rd_errmsg());
    eng_destroy(e);
    model_free(m);
    rd_backend_destroy(be);
}

int main(void)
{
    RUN(test_route_matches_reference);
    RUN(test_ffn_is_the_dense_ops_and_batch_invariant);
    RUN(test_routes_alone_and_in_batches);
    RUN(test_routes_only_when_asked_and_only_for_moe);
    TEST_EXIT();
}
