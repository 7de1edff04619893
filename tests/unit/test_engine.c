/* test_engine.c - the model runner and the engine (scheduler, paged KV,
 * groups, preemption, abort, stops) end to end.
 *
 * Most cases use the tiny random models that tests/gen_testdata.sh writes
 * into $RD_TESTDATA (default build/testdata; brought up to date on each run).
 * One case runs the real model ($RD_MODEL, default
 * models/SmolLM2-135M-Instruct.Q4_1.gguf) briefly, and is skipped when the
 * file is absent.
 *
 * Nothing here compares against numbers copied from the code under test:
 *   - the paged forward pass is checked against a plain double-precision
 *     forward pass over contiguous K/V written below, reading the GGUF tensors
 *     directly (in llama.cpp's layout, with llama.cpp's interleaved RoPE, so
 *     the engine's un-permutation + rotate-half is checked, not re-used);
 *   - everything else is checked against the same engine run another way
 *     (alone vs batched, one prefill vs chunks, big pool vs preempting pool),
 *     which the determinism contract (DESIGN.md) says must be bit-identical. */
#include <math.h>
#include <stdint.h>
#include <sys/stat.h>

#include "engine/serve/engine.h"
#include "base/err.h"
#include "engine/format/gguf.h"
#include "engine/serve/kv.h"
#include "engine/model/loader.h"
#include "engine/model/runner.h"
#include "tests/unit/engine_helpers.h"
#include "tests/unit/test.h"

/* ---------------------------------------------------------------------------
 * Models and small helpers. */

/* Backend of the engine cases: $RD_TEST_BACKEND ("cpu", "cuda", "cuda-emu"),
 * default cpu (the cuda-emu test binary defaults to cuda-emu). A bf16
 * backend (CUDA) is held to the fp32 reference more loosely; every other case
 * compares the engine with itself and stays bit-exact. */
#ifndef RD_TEST_BACKEND_DEFAULT
#define RD_TEST_BACKEND_DEFAULT "cpu"
#endif
static const char *test_backend(void)
{
    const char *b = getenv("RD_TEST_BACKEND");
    return b && *b ? b : RD_TEST_BACKEND_DEFAULT;
}

static rd_loaded tiny;          /* tiny-q4_1: the engine cases */
static rd_loaded tiny32;        /* tiny-f32: reference forward pass */
static rd_loaded untied;        /* tiny-untied (q4_0, separate output.weight) */
static int tiny_ok, tiny32_ok, untied_ok;

static int load_tiny(const char *name, rd_loaded *l)
{
    char path[512];
    snprintf(path, sizeof path, "%s/%s.gguf", testdata(), name);
    int rc = rd_load(path, test_backend(), test_threads(0), l);
    if (rc)
        fprintf(stderr, "test_engine: cannot load %s: %s\n", path, rd_errmsg());
    return rc == 0;
}

#define NEED(ok, what) CHECK(ok, "%s is not loaded (run tests/gen_testdata.sh %s)", what, testdata())

/* Deterministic token ids in [lo, hi). */
static void make_prompt(int32_t *p, int32_t n, uint32_t salt, int32_t lo, int32_t hi)
{
    uint64_t x = 0x9E3779B97F4A7C15ull * (salt + 1) + 12345;
    for (int32_t i = 0; i < n; i++) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        p[i] = lo + (int32_t)((x >> 33) % (uint64_t)(hi - lo));
    }
}

static eng_request make_req(const int32_t *prompt, int32_t n_prompt, int32_t n, int32_t max_tokens, float temp,
                            uint64_t seed)
{
    eng_request r;
    memset(&r, 0, sizeof r);
    r.prompt = prompt;
    r.n_prompt = n_prompt;
    r.n = n;
    r.max_tokens = max_tokens;
    r.sp = samp_default();
    r.sp.temperature = temp;
    r.sp.seed = seed;
    return r;
}

/* A config whose KV pool holds `blocks` blocks of 16 tokens for model m. */
static eng_config cfg_for(const model *m, int64_t blocks, int32_t max_batch_tokens, int32_t max_num_seqs)
{
    eng_config c = eng_default_config();
    c.kv_cache_bytes = blocks * model_kv_bytes_per_token(&m->cfg) / 4 * rd_backend_kv_elem_bytes(m->be) * 16;
    c.block_size = 16;
    c.max_batch_tokens = max_batch_tokens;
    c.max_num_seqs = max_num_seqs;
    return c;
}

/* ---------------------------------------------------------------------------
 * Collecting results. */

static res_set *res_new(void) { return calloc(1, sizeof(res_set)); }

static void res_free(res_set *s)
{
    if (!s)
        return;
    for (int i = 0; i < s->n; i++)
        eng_result_free(&s->r[i]);
    free(s);
}

static int run_steps(engine *e, int n, res_set *out)
{
    for (int i = 0; i < n && eng_busy(e); i++) {
        int rc = eng_step(e);
        if (rc < 0)
            return rc;
        collect(e, out);
    }
    return 0;
}

/* Runs one request alone in a fresh engine (cfg) and keeps its results. */
static int run_alone(model *m, const eng_config *cfg, const eng_request *r, res_set *out)
{
    engine *e;
    int rc = eng_create(m, cfg, &e);
    if (rc)
        return rc;
    int64_t id;
    rc = eng_add(e, r, &id);
    if (!rc)
        rc = drive(e, out);
    eng_stats st;
    eng_get_stats(e, &st);
    eng_destroy(e);
    if (!rc && st.kv_blocks_used != 0)
        rc = rd_fail(RD_EINVAL, "run_alone: %d KV blocks still used after the run", st.kv_blocks_used);
    return rc;
}

/* Bit-identical token ids, raw log-probs and finish reason. */
static int same_rollout(const eng_result *a, const eng_result *b, char *why, size_t cap)
{
    if (!a || !b) {
        snprintf(why, cap, "missing result (%p, %p)", (const void *)a, (const void *)b);
        return 0;
    }
    if (a->n_tokens != b->n_tokens || a->finish != b->finish) {
        snprintf(why, cap, "n_tokens %d vs %d, finish %d vs %d", a->n_tokens, b->n_tokens, a->finish, b->finish);
        return 0;
    }
    for (int32_t i = 0; i < a->n_tokens; i++)
        if (a->token_ids[i] != b->token_ids[i] || memcmp(&a->logprobs[i], &b->logprobs[i], sizeof(float))) {
            snprintf(why, cap, "token %d: id %d vs %d, logprob %.9g vs %.9g", i, a->token_ids[i], b->token_ids[i],
                     a->logprobs[i], b->logprobs[i]);
            return 0;
        }
    return 1;
}

/* a's tokens and log-probs are a prefix of b's (bit-identical). */
static int is_prefix(const eng_result *a, const eng_result *b, char *why, size_t cap)
{
    if (!a || !b) {
        snprintf(why, cap, "missing result (%p, %p)", (const void *)a, (const void *)b);
        return 0;
    }
    if (a->n_tokens > b->n_tokens) {
        snprintf(why, cap, "%d tokens, longer than the full run's %d", a->n_tokens, b->n_tokens);
        return 0;
    }
    for (int32_t i = 0; i < a->n_tokens; i++)
        if (a->token_ids[i] != b->token_ids[i] || memcmp(&a->logprobs[i], &b->logprobs[i], sizeof(float))) {
            snprintf(why, cap, "token %d: id %d vs %d, logprob %.9g vs %.9g", i, a->token_ids[i], b->token_ids[i],
                     a->logprobs[i], b->logprobs[i]);
            return 0;
        }
    return 1;
}

static int same_tokens(const eng_result *a, const eng_result *b)
{
    return a->n_tokens == b->n_tokens && memcmp(a->token_ids, b->token_ids, sizeof(int32_t) * a->n_tokens) == 0;
}

/* ---------------------------------------------------------------------------
 * 1a. Paged attention against a contiguous double-precision reference.
 *
 * The reference reads the GGUF tensors as stored: llama.cpp's layout, whose
 * Q/K rows of each head are permuted (convert_hf_to_gguf: row 2i+j of a head
 * is HF row j*hd/2+i) for llama.cpp's "normal" RoPE, which rotates adjacent
 * pairs (2i, 2i+1) by pos * theta^(-2i/hd). That is the same function as HF's
 * rotate-half on the un-permuted rows (pair (i, i+hd/2)); the engine takes the
 * second route, this reference the first, so a wrong un-permutation shows. */

typedef struct {
    int32_t L, d, nh, nkv, hd, ffn, vocab;
    double theta, eps;
    float *emb, *out, *onorm; /* out == emb when tied */
    struct ref_layer {
        float *an, *q, *k, *v, *o, *fn, *gate, *up, *down;
    } *l;
} ref_model;

static float *ref_tensor(const gguf_file *g, const char *name, uint64_t n, int *ok)
{
    const gguf_tensor *t = gguf_find_tensor(g, name);
    if (!t || t->n_elems != n) {
        *ok = 0;
        return NULL;
    }
    float *p = malloc(sizeof(float) * n);
    if (!p || gguf_dequant(t, p)) {
        free(p);
        *ok = 0;
        return NULL;
    }
    return p;
}

static void ref_free(ref_model *r)
{
    if (r->l)
        for (int32_t i = 0; i < r->L; i++) {
            struct ref_layer *y = &r->l[i];
            free(y->an), free(y->q), free(y->k), free(y->v), free(y->o);
            free(y->fn), free(y->gate), free(y->up), free(y->down);
        }
    free(r->l);
    if (r->out != r->emb)
        free(r->out);
    free(r->emb);
    free(r->onorm);
    memset(r, 0, sizeof *r);
}

static int ref_load(const gguf_file *g, ref_model *r)
{
    memset(r, 0, sizeof *r);
    uint32_t u;
    float f;
    if (gguf_get_u32(g, "llama.block_count", &u)) return 0;
    r->L = (int32_t)u;
    if (gguf_get_u32(g, "llama.embedding_length", &u)) return 0;
    r->d = (int32_t)u;
    if (gguf_get_u32(g, "llama.attention.head_count", &u)) return 0;
    r->nh = (int32_t)u;
    if (gguf_get_u32(g, "llama.attention.head_count_kv", &u)) return 0;
    r->nkv = (int32_t)u;
    if (gguf_get_u32(g, "llama.feed_forward_length", &u)) return 0;
    r->ffn = (int32_t)u;
    if (gguf_get_f32(g, "llama.rope.freq_base", &f)) return 0;
    r->theta = f;
    if (gguf_get_f32(g, "llama.attention.layer_norm_rms_epsilon", &f)) return 0;
    r->eps = f;
    r->hd = r->d / r->nh;
    const gguf_tensor *te = gguf_find_tensor(g, "token_embd.weight");
    if (!te)
        return 0;
    r->vocab = (int32_t)te->ne[1];
    int ok = 1;
    const uint64_t d = (uint64_t)r->d, qd = (uint64_t)r->nh * r->hd, kd = (uint64_t)r->nkv * r->hd,
                   ff = (uint64_t)r->ffn;
    r->emb = ref_tensor(g, "token_embd.weight", (uint64_t)r->vocab * d, &ok);
    r->out = gguf_find_tensor(g, "output.weight") ? ref_tensor(g, "output.weight", (uint64_t)r->vocab * d, &ok)
                                                  : r->emb;
    r->onorm = ref_tensor(g, "output_norm.weight", d, &ok);
    r->l = calloc((size_t)r->L, sizeof *r->l);
    if (!r->l)
        return 0;
    char name[96];
    for (int32_t i = 0; i < r->L; i++) {
        struct ref_layer *y = &r->l[i];
#define T(field, suffix, n) (snprintf(name, sizeof name, "blk.%d." suffix, i), y->field = ref_tensor(g, name, n, &ok))
        T(an, "attn_norm.weight", d);
        T(q, "attn_q.weight", qd * d);
        T(k, "attn_k.weight", kd * d);
        T(v, "attn_v.weight", kd * d);
        T(o, "attn_output.weight", d * qd);
        T(fn, "ffn_norm.weight", d);
        T(gate, "ffn_gate.weight", ff * d);
        T(up, "ffn_up.weight", ff * d);
        T(down, "ffn_down.weight", d * ff);
#undef T
    }
    return ok;
}

static void ref_matvec(const float *w, int32_t rows, int32_t cols, const double *x, double *y)
{
    for (int32_t r = 0; r < rows; r++) {
        double s = 0;
        const float *wr = w + (size_t)r * cols;
        for (int32_t c = 0; c < cols; c++)
            s += (double)wr[c] * x[c];
        y[r] = s;
    }
}

static void ref_rmsnorm(const double *x, const float *w, int32_t d, double eps, double *out)
{
    double ss = 0;
    for (int32_t i = 0; i < d; i++)
        ss += x[i] * x[i];
    double inv = 1.0 / sqrt(ss / d + eps);
    for (int32_t i = 0; i < d; i++)
        out[i] = x[i] * inv * w[i];
}

/* llama.cpp "normal" RoPE: adjacent pairs. */
static void ref_rope_pairs(double *v, int32_t n_heads, int32_t hd, int32_t pos, double theta)
{
    for (int32_t h = 0; h < n_heads; h++)
        for (int32_t i = 0; i < hd / 2; i++) {
            double ang = pos * pow(theta, -2.0 * i / hd);
            double c = cos(ang), s = sin(ang);
            double *p = v + (size_t)h * hd + 2 * i;
            double a = p[0], b = p[1];
            p[0] = a * c - b * s;
            p[1] = a * s + b * c;
        }
}

/* logits[n][vocab] for every position of tokens[0..n), contiguous K/V. */
static int ref_forward(const ref_model *r, const int32_t *tokens, int32_t n, double *logits)
{
    const int32_t d = r->d, hd = r->hd, nh = r->nh, nkv = r->nkv, qd = nh * hd, kd = nkv * hd, F = r->ffn;
    double *x = malloc(sizeof(double) * n * d), *xn = malloc(sizeof(double) * d);
    double *q = malloc(sizeof(double) * n * qd), *k = malloc(sizeof(double) * n * kd);
    double *v = malloc(sizeof(double) * n * kd), *att = malloc(sizeof(double) * qd);
    double *tmp = malloc(sizeof(double) * (d > 2 * F ? d : 2 * F)), *sc = malloc(sizeof(double) * n);
    double *g = malloc(sizeof(double) * F), *u = malloc(sizeof(double) * F);
    int ok = x && xn && q && k && v && att && tmp && sc && g && u;
    for (int32_t p = 0; ok && p < n; p++)
        for (int32_t i = 0; i < d; i++)
            x[(size_t)p * d + i] = r->emb[(size_t)tokens[p] * d + i];
    for (int32_t l = 0; ok && l < r->L; l++) {
        const struct ref_layer *y = &r->l[l];
        for (int32_t p = 0; p < n; p++) {
            ref_rmsnorm(x + (size_t)p * d, y->an, d, r->eps, xn);
            ref_matvec(y->q, qd, d, xn, q + (size_t)p * qd);
            ref_matvec(y->k, kd, d, xn, k + (size_t)p * kd);
            ref_matvec(y->v, kd, d, xn, v + (size_t)p * kd);
            ref_rope_pairs(q + (size_t)p * qd, nh, hd, p, r->theta);
            ref_rope_pairs(k + (size_t)p * kd, nkv, hd, p, r->theta);
        }
        for (int32_t p = 0; p < n; p++) {
            for (int32_t h = 0; h < nh; h++) {
                int32_t kh = h / (nh / nkv);
                const double *qh = q + (size_t)p * qd + (size_t)h * hd;
                double mx = -INFINITY;
                for (int32_t j = 0; j <= p; j++) {
                    double s = 0;
                    for (int32_t e = 0; e < hd; e++)
                        s += qh[e] * k[(size_t)j * kd + (size_t)kh * hd + e];
                    sc[j] = s / sqrt((double)hd);
                    if (sc[j] > mx)
                        mx = sc[j];
                }
                double z = 0;
                for (int32_t j = 0; j <= p; j++)
                    z += sc[j] = exp(sc[j] - mx);
                for (int32_t e = 0; e < hd; e++) {
                    double s = 0;
                    for (int32_t j = 0; j <= p; j++)
                        s += sc[j] / z * v[(size_t)j * kd + (size_t)kh * hd + e];
                    att[(size_t)h * hd + e] = s;
                }
            }
            ref_matvec(y->o, d, qd, att, tmp);
            for (int32_t i = 0; i < d; i++)
                x[(size_t)p * d + i] += tmp[i];
        }
        for (int32_t p = 0; p < n; p++) {
            ref_rmsnorm(x + (size_t)p * d, y->fn, d, r->eps, xn);
            ref_matvec(y->gate, F, d, xn, g);
            ref_matvec(y->up, F, d, xn, u);
            for (int32_t i = 0; i < F; i++)
                g[i] = g[i] / (1.0 + exp(-g[i])) * u[i];
            ref_matvec(y->down, d, F, g, tmp);
            for (int32_t i = 0; i < d; i++)
                x[(size_t)p * d + i] += tmp[i];
        }
    }
    for (int32_t p = 0; ok && p < n; p++) {
        ref_rmsnorm(x + (size_t)p * d, r->onorm, d, r->eps, xn);
        ref_matvec(r->out, r->vocab, d, xn, logits + (size_t)p * r->vocab);
    }
    free(x), free(xn), free(q), free(k), free(v), free(att), free(tmp), free(sc), free(g), free(u);
    return ok;
}

/* Fills every layer's K and V cache with NaN, so a read of a slot that this
 * test did not write poisons the logits. */
static void poison_cache(runner *r)
{
    const model_config *c = &r->m->cfg;
    size_t n = (size_t)r->n_blocks * c->n_kv_heads * r->attn.block_size * c->head_dim;
    n *= (size_t)rd_backend_kv_elem_bytes(r->be);
    unsigned char *nan_buf = malloc(n);
    if (!nan_buf)
        return;
    memset(nan_buf, 0xff, n); /* all-ones: NaN as fp32 and as bf16 */
    for (int32_t l = 0; l < c->n_layers; l++) {
        r->be->ops->h2d(r->be, r->k_cache[l], nan_buf, n);
        r->be->ops->h2d(r->be, r->v_cache[l], nan_buf, n);
    }
    free(nan_buf);
}

/* A step over chunks of several sequences: seq i gets rows [from[i], to[i])
 * of its tokens; logits for every row are written to logits. */
typedef struct {
    const int32_t *tokens;
    const int32_t *table;       /* block table */
    int32_t n_blocks;
    int32_t from, to;
} chunk;

static int run_chunks(runner *r, const chunk *c, int32_t n, float *logits)
{
    const int32_t bs = r->attn.block_size;
    int32_t M = 0, maxb = 1;
    for (int32_t i = 0; i < n; i++) {
        M += c[i].to - c[i].from;
        if (c[i].n_blocks > maxb)
            maxb = c[i].n_blocks;
    }
    int32_t *tok = malloc(sizeof(int32_t) * M), *pos = malloc(sizeof(int32_t) * M);
    int32_t *slot = malloc(sizeof(int32_t) * M), *rows = malloc(sizeof(int32_t) * M);
    int32_t *qs = malloc(sizeof(int32_t) * (n + 1)), *ctx = malloc(sizeof(int32_t) * n);
    int32_t *tables = calloc((size_t)n * maxb, sizeof(int32_t));
    int rc = RD_ENOMEM;
    if (tok && pos && slot && rows && qs && ctx && tables) {
        int32_t m = 0;
        for (int32_t i = 0; i < n; i++) {
            qs[i] = m;
            for (int32_t p = c[i].from; p < c[i].to; p++, m++) {
                tok[m] = c[i].tokens[p];
                pos[m] = p;
                slot[m] = c[i].table[p / bs] * bs + p % bs;
                rows[m] = m;
            }
            ctx[i] = c[i].to;
            memcpy(tables + (size_t)i * maxb, c[i].table, sizeof(int32_t) * c[i].n_blocks);
        }
        qs[n] = m;
        rd_step s = {.n_rows = M, .n_seqs = n, .max_blocks = maxb, .token_ids = tok, .positions = pos,
                     .slots = slot, .q_start = qs, .ctx_len = ctx, .block_tables = tables};
        rc = runner_forward(r, &s, rows, M, logits);
    }
    free(tok), free(pos), free(slot), free(rows), free(qs), free(ctx), free(tables);
    return rc;
}

static void paged_vs_reference(rd_loaded *l, int32_t bs)
{
    ref_model ref;
    int loaded = ref_load(l->gguf, &ref);
    if (!loaded)
        ref_free(&ref);
    CHECK(loaded, "reading the reference weights from the GGUF file failed");
    const int32_t V = ref.vocab, NA = 50, NB = 37;
    int32_t ta[50], tb[37];
    make_prompt(ta, NA, 101, 0, V);
    make_prompt(tb, NB, 202, 0, V);
    double *ra = malloc(sizeof(double) * NA * V), *rb = malloc(sizeof(double) * NB * V);
    float *one = malloc(sizeof(float) * (NA + NB) * V), *chunked = malloc(sizeof(float) * (NA + NB) * V);
    int ok = ra && rb && one && chunked && ref_forward(&ref, ta, NA, ra) && ref_forward(&ref, tb, NB, rb);
    ref_free(&ref);

    /* Block tables: a scrambled permutation of the pool, A's then B's. */
    const int32_t ba = (NA + bs - 1) / bs, bb = (NB + bs - 1) / bs, n_blocks = ba + bb + 5;
    int32_t perm[64];
    for (int32_t i = 0; i < n_blocks; i++)
        perm[i] = i;
    uint64_t x = 77;
    for (int32_t i = n_blocks - 1; i > 0; i--) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        int32_t j = (int32_t)((x >> 33) % (uint64_t)(i + 1)), t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
    }
    const int32_t *tab_a = perm, *tab_b = perm + ba;
    int scrambled = 0;
    for (int32_t i = 0; i + 1 < ba; i++)
        scrambled |= tab_a[i + 1] != tab_a[i] + 1;
    int identity = 1;
    for (int32_t i = 0; i < ba; i++)
        identity &= tab_a[i] == i;

    runner r;
    int rc = ok ? runner_init(&r, l->m, n_blocks, bs, 128, 128) : RD_ENOMEM;
    double max_err = 0, max_ref = 0;
    int32_t worst_row = -1;
    int bitwise = 1, finite = 1;
    if (rc == 0) {
        /* Both prompts in one step. */
        poison_cache(&r);
        chunk one_step[2] = {{ta, tab_a, ba, 0, NA}, {tb, tab_b, bb, 0, NB}};
        rc = run_chunks(&r, one_step, 2, one);
        /* Again from a poisoned cache, in three steps of uneven chunks. */
        if (!rc) {
            poison_cache(&r);
            float *oa = chunked, *ob = chunked + (size_t)NA * V;
            chunk s1[2] = {{ta, tab_a, ba, 0, 13}, {tb, tab_b, bb, 0, 20}};
            chunk s2[2] = {{tb, tab_b, bb, 20, NB}, {ta, tab_a, ba, 13, 14}};
            chunk s3[1] = {{ta, tab_a, ba, 14, NA}};
            float *tmp = malloc(sizeof(float) * (NA + NB) * V);
            rc = tmp ? run_chunks(&r, s1, 2, tmp) : RD_ENOMEM;
            if (!rc) {
                memcpy(oa, tmp, sizeof(float) * 13 * V);
                memcpy(ob, tmp + (size_t)13 * V, sizeof(float) * 20 * V);
                rc = run_chunks(&r, s2, 2, tmp);
            }
            if (!rc) {
                memcpy(ob + (size_t)20 * V, tmp, sizeof(float) * (NB - 20) * V);
                memcpy(oa + (size_t)13 * V, tmp + (size_t)(NB - 20) * V, sizeof(float) * V);
                rc = run_chunks(&r, s3, 1, tmp);
            }
            if (!rc)
                memcpy(oa + (size_t)14 * V, tmp, sizeof(float) * (NA - 14) * V);
            free(tmp);
        }
        runner_free(&r);
    }
    if (rc == 0) {
        for (int32_t row = 0; row < NA + NB; row++) {
            const double *want = row < NA ? ra + (size_t)row * V : rb + (size_t)(row - NA) * V;
            for (int32_t t = 0; t < V; t++) {
                float got = one[(size_t)row * V + t];
                if (!isfinite(got))
                    finite = 0;
                double err = fabs(got - want[t]);
                max_ref = fabs(want[t]) > max_ref ? fabs(want[t]) : max_ref;
                if (!(err <= max_err)) {
                    max_err = err;
                    worst_row = row;
                }
            }
        }
        bitwise = memcmp(one, chunked, sizeof(float) * (NA + NB) * V) == 0;
    }
    free(ra), free(rb), free(one), free(chunked);
    CHECK(ok, "reference forward failed");
    CHECK(scrambled && !identity, "the block table is not scrambled");
    CHECK_OK(rc);
    CHECK(finite, "non-finite logits: a slot outside the context (poisoned with NaN) was read");
    /* fp32 everywhere: 1e-4. bf16 weights, activations and KV (CUDA): 2.5% of the largest logit. */
    double tol = rd_backend_kv_elem_bytes(l->be) == 4 ? 1e-4 : 0.025 * (max_ref > 1 ? max_ref : 1);
    CHECK(max_err <= tol, "block size %d: max |logit - reference| = %.3g at row %d (tolerance %.3g)", bs, max_err,
          worst_row, tol);
    CHECK(bitwise, "block size %d: logits of chunked prefill differ from one-step prefill", bs);
}

static void test_paged_attention_reference(void)
{
    NEED(tiny32_ok, "tiny-f32");
    paged_vs_reference(&tiny32, 16);
    if (test_case_failed)
        return;
    paged_vs_reference(&tiny32, 5);
    if (test_case_failed)
        return;
    NEED(untied_ok, "tiny-untied");
    paged_vs_reference(&untied, 16);
}

/* ---------------------------------------------------------------------------
 * 1b. One prefill vs chunked prefill vs prefill + decode, through the engine. */

static void chunked_prefill_case(float temp, uint64_t seed, char *why, size_t cap, int *ok)
{
    model *m = tiny.m;
    const int32_t NP = 60, MT = 24;
    int32_t p[60 + 24], filler[9];
    make_prompt(p, NP, 31, 3, m->cfg.vocab);
    make_prompt(filler, 9, 32, 3, m->cfg.vocab);
    eng_request rq = make_req(p, NP, 1, MT, temp, seed);
    res_set *base = res_new(), *alt = NULL;
    *ok = 0;
#define FAIL(...) do { snprintf(why, cap, __VA_ARGS__); goto out; } while (0)
    eng_config big = cfg_for(m, 64, 512, 64);
    if (run_alone(m, &big, &rq, base) || base->n != 1)
        FAIL("one-prefill run: %s", rd_errmsg());
    const eng_result *want = &base->r[0];
    if (want->n_tokens != MT)
        FAIL("one-prefill run gave %d tokens, expected %d", want->n_tokens, MT);

    /* Chunks of a fixed size: max_batch_tokens 7, 13, 59 (it must be >= max_num_seqs, here 4). */
    int32_t sizes[] = {7, 13, 59};
    for (int k = 0; k < 3; k++) {
        alt = res_new();
        eng_config c = cfg_for(m, 64, sizes[k], 4);
        engine *e;
        if (eng_create(m, &c, &e))
            FAIL("eng_create: %s", rd_errmsg());
        int64_t id;
        int rc = eng_add(e, &rq, &id);
        if (!rc)
            rc = drive(e, alt);
        eng_stats st;
        eng_get_stats(e, &st);
        eng_destroy(e);
        if (rc)
            FAIL("chunks of %d: %s", sizes[k], rd_errmsg());
        int64_t min_steps = (NP + sizes[k] - 1) / sizes[k] + MT - 1;
        if (st.steps < min_steps)
            FAIL("chunks of %d: %lld steps, the prompt was not chunked", sizes[k], (long long)st.steps);
        if (!same_rollout(alt->r, want, why, cap) || alt->n != 1) {
            char tmp[300];
            snprintf(tmp, sizeof tmp, "chunks of %d vs one prefill: %s", sizes[k], why);
            snprintf(why, cap, "%s", tmp);
            goto out;
        }
        res_free(alt);
        alt = NULL;
    }

    /* Uneven chunks: a filler request added first takes part of each step's budget. */
    {
        alt = res_new();
        eng_config c = cfg_for(m, 64, 16, 16);
        engine *e;
        if (eng_create(m, &c, &e))
            FAIL("eng_create: %s", rd_errmsg());
        eng_request fr = make_req(filler, 9, 1, 30, 1.0f, 3);
        int64_t fid, id;
        int rc = eng_add(e, &fr, &fid);
        if (!rc)
            rc = eng_add(e, &rq, &id);
        if (!rc)
            rc = drive(e, alt);
        eng_destroy(e);
        if (rc)
            FAIL("uneven chunks: %s", rd_errmsg());
        if (!same_rollout(res_find(alt, id, 0), want, why, cap)) {
            char tmp[300];
            snprintf(tmp, sizeof tmp, "uneven chunks vs one prefill: %s", why);
            snprintf(why, cap, "%s", tmp);
            goto out;
        }
        res_free(alt);
        alt = NULL;
    }

    /* Prefill + decode: the prompt extended by the first k generated tokens
     * (prefilled at positions that were decoded before) continues the same. */
    int32_t ks[] = {1, 5, 17};
    for (int j = 0; j < 3; j++) {
        int32_t k = ks[j];
        memcpy(p + NP, want->token_ids, sizeof(int32_t) * k);
        eng_request ext = make_req(p, NP + k, 1, MT - k, temp, seed);
        alt = res_new();
        if (run_alone(m, &big, &ext, alt) || alt->n != 1)
            FAIL("extended prompt: %s", rd_errmsg());
        const eng_result *g = alt->r;
        int same = g->n_tokens == MT - k && g->finish == want->finish &&
                   memcmp(g->token_ids, want->token_ids + k, sizeof(int32_t) * (MT - k)) == 0 &&
                   memcmp(g->logprobs, want->logprobs + k, sizeof(float) * (MT - k)) == 0;
        if (!same)
            FAIL("prompt + %d generated tokens does not continue as decode did (%d tokens, first %d vs %d, "
                 "logprob %.9g vs %.9g)", k, g->n_tokens, g->n_tokens ? g->token_ids[0] : -1,
                 want->token_ids[k], g->n_tokens ? g->logprobs[0] : NAN, want->logprobs[k]);
        res_free(alt);
        alt = NULL;
    }
    *ok = 1;
out:
#undef FAIL
    res_free(alt);
    res_free(base);
}

static void test_chunked_prefill_bitwise(void)
{
    NEED(tiny_ok, "tiny-q4_1");
    char why[400] = "";
    int ok;
    chunked_prefill_case(0.0f, 0, why, sizeof why, &ok);
    CHECK(ok, "greedy: %s", why);
    chunked_prefill_case(1.0f, 1234, why, sizeof why, &ok);
    CHECK(ok, "seeded: %s", why);
}

/* ---------------------------------------------------------------------------
 * 2. Preemption: a pool too small for the load forces recompute preemption;
 * every rollout still equals the same request run alone with a big pool. */

static void preemption_case(int32_t max_batch_tokens, char *why, size_t cap, int *ok)
{
    model *m = tiny.m;
    enum { NR = 12 };
    int32_t prompts[NR][48];
    eng_request rq[NR];
    int64_t ids[NR];
    for (int i = 0; i < NR; i++) {
        int32_t np = 5 + (i * 7) % 36;
        make_prompt(prompts[i], np, 400 + i, 3, m->cfg.vocab);
        rq[i] = make_req(prompts[i], np, i == 5 ? 3 : 1, 30 + (i * 13) % 40, i % 2 ? 1.0f : 0.0f, 900 + i);
    }
    res_set *got = res_new(), *alone = NULL;
    engine *e = NULL;
    *ok = 0;
#define FAIL(...) do { snprintf(why, cap, __VA_ARGS__); goto out; } while (0)
    eng_config small = cfg_for(m, 10, max_batch_tokens, 64);
    if (eng_create(m, &small, &e))
        FAIL("eng_create: %s", rd_errmsg());
    for (int i = 0; i < NR; i++)
        if (eng_add(e, &rq[i], &ids[i]))
            FAIL("eng_add %d: %s", i, rd_errmsg());
    if (drive(e, got))
        FAIL("drive: %s", rd_errmsg());
    eng_stats st;
    eng_get_stats(e, &st);
    if (st.preemptions == 0)
        FAIL("no preemption happened (pool %d blocks, peak %d)", st.kv_blocks_total, st.kv_peak_blocks);
    if (st.kv_blocks_used != 0 || st.kv_peak_blocks > st.kv_blocks_total)
        FAIL("after the run %d blocks used, peak %d of %d", st.kv_blocks_used, st.kv_peak_blocks,
             st.kv_blocks_total);
    int n_pre = 0, expect = 0;
    eng_config big = cfg_for(m, 64, 512, 64);
    for (int i = 0; i < NR; i++) {
        alone = res_new();
        if (run_alone(m, &big, &rq[i], alone))
            FAIL("alone %d: %s", i, rd_errmsg());
        for (int32_t s = 0; s < rq[i].n; s++, expect++) {
            const eng_result *a = res_find(got, ids[i], s);
            if (a && a->n_preempt > 0)
                n_pre++;
            char w[300];
            if (!same_rollout(a, res_find(alone, 1, s), w, sizeof w))
                FAIL("request %d sample %d (preempted %d times) vs alone: %s", i, s, a ? a->n_preempt : -1, w);
        }
        res_free(alone);
        alone = NULL;
    }
    if (got->n != expect)
        FAIL("%d results for %d samples", got->n, expect);
    if (n_pre == 0)
        FAIL("%lld preemptions but no result has n_preempt > 0", (long long)st.preemptions);
    *ok = 1;
out:
#undef FAIL
    eng_destroy(e);
    res_free(alone);
    res_free(got);
}

static void test_preemption(void)
{
    NEED(tiny_ok, "tiny-q4_1");
    char why[400] = "";
    int ok;
    preemption_case(512, why, sizeof why, &ok);
    CHECK(ok, "max_batch_tokens 512: %s", why);
    preemption_case(64, why, sizeof why, &ok);
    CHECK(ok, "max_batch_tokens 64: %s", why);
}

/* ---------------------------------------------------------------------------
 * 3. Batch invariance: a request alone vs inside a batch of 16 others of
 * different prompt lengths, added at different times and orders. */

typedef struct {
    int32_t prompt[64];
    eng_request rq;
    int64_t id;
} bi_req;

/* reqs[0] and reqs[1] are X greedy and X seeded; reqs[2..17] the others.
 * order: the order of adding; gaps[i]: steps run before adding order[i]. */
static void batch_case(model *m, bi_req *reqs, int n_req, const int *order, const int *gaps, int32_t mbt,
                       int64_t pool_blocks, int check_all, char *why, size_t cap, int *ok)
{
    res_set *got = res_new(), *alone = NULL;
    engine *e = NULL;
    *ok = 0;
#define FAIL(...) do { snprintf(why, cap, __VA_ARGS__); goto out; } while (0)
    eng_config c = cfg_for(m, pool_blocks, mbt, 64);
    if (eng_create(m, &c, &e))
        FAIL("eng_create: %s", rd_errmsg());
    int max_running = 0;
    for (int k = 0; k < n_req; k++) {
        for (int s = 0; s < gaps[k]; s++) {
            if (run_steps(e, 1, got))
                FAIL("step: %s", rd_errmsg());
            eng_stats st;
            eng_get_stats(e, &st);
            if (st.running > max_running)
                max_running = st.running;
        }
        bi_req *b = &reqs[order[k]];
        if (eng_add(e, &b->rq, &b->id))
            FAIL("eng_add: %s", rd_errmsg());
    }
    for (int it = 0; eng_busy(e); it++) {
        if (it > 100000)
            FAIL("still busy");
        if (eng_step(e) < 0)
            FAIL("step: %s", rd_errmsg());
        collect(e, got);
        eng_stats st;
        eng_get_stats(e, &st);
        if (st.running > max_running)
            max_running = st.running;
    }
    collect(e, got);
    if (max_running < 8)
        FAIL("at most %d sequences ran together; the batch is not a batch", max_running);
    eng_config big = cfg_for(m, pool_blocks, 512, 64);
    for (int i = 0; i < (check_all ? n_req : 2); i++) {
        alone = res_new();
        if (run_alone(m, &big, &reqs[i].rq, alone))
            FAIL("alone %d: %s", i, rd_errmsg());
        for (int32_t s = 0; s < reqs[i].rq.n; s++) {
            char w[300];
            if (!same_rollout(res_find(got, reqs[i].id, s), res_find(alone, 1, s), w, sizeof w))
                FAIL("%s sample %d, batched vs alone: %s",
                     i == 0 ? "X greedy" : i == 1 ? "X seeded" : "another request", s, w);
        }
        res_free(alone);
        alone = NULL;
    }
    *ok = 1;
out:
#undef FAIL
    eng_destroy(e);
    res_free(alone);
    res_free(got);
}

static void make_batch(model *m, bi_req *reqs, int32_t lo, int32_t hi, int32_t others_tokens, int tiny_groups)
{
    make_prompt(reqs[0].prompt, 20, 1000, lo, hi);
    memcpy(reqs[1].prompt, reqs[0].prompt, sizeof reqs[0].prompt);
    reqs[0].rq = make_req(reqs[0].prompt, 20, 1, 16, 0.0f, 0);
    reqs[1].rq = make_req(reqs[1].prompt, 20, 1, 16, 1.0f, 4242);
    for (int i = 0; i < 16; i++) {
        bi_req *b = &reqs[2 + i];
        int32_t np = 5 + (i * 23) % 56; /* 5..60 */
        make_prompt(b->prompt, np, 1100 + i, lo, hi);
        int32_t mt = others_tokens ? others_tokens : 6 + (i * 5) % 19;
        b->rq = make_req(b->prompt, np, tiny_groups && i == 3 ? 3 : 1, mt, i % 3 ? 1.0f : 0.0f, 77 + i);
    }
}

static void test_batch_invariance_tiny(void)
{
    NEED(tiny_ok, "tiny-q4_1");
    bi_req *reqs = calloc(18, sizeof *reqs);
    CHECK(reqs, "oom");
    make_batch(tiny.m, reqs, 3, tiny.m->cfg.vocab, 0, 1);
    /* X greedy after 2 steps among others, X seeded in the middle. */
    int order1[18] = {2, 3, 4, 5, 6, 0, 7, 8, 9, 10, 11, 12, 1, 13, 14, 15, 16, 17};
    int gaps1[18] = {0, 0, 0, 1, 0, 2, 0, 0, 3, 0, 0, 1, 0, 2, 0, 0, 1, 0};
    int order2[18] = {17, 16, 15, 1, 14, 13, 12, 11, 10, 9, 8, 0, 7, 6, 5, 4, 3, 2};
    int gaps2[18] = {0, 1, 0, 0, 2, 0, 0, 0, 0, 1, 0, 0, 0, 3, 0, 0, 0, 0};
    char why[400] = "";
    int ok;
    batch_case(tiny.m, reqs, 18, order1, gaps1, 64, 128, 1, why, sizeof why, &ok);
    if (ok)
        batch_case(tiny.m, reqs, 18, order2, gaps2, 512, 128, 1, why, sizeof why, &ok);
    free(reqs);
    CHECK(ok, "%s", why);
}

/* The same with logit edits (issue 44) on X and on some of the others: penalties, a bias and
 * min_tokens are built from each sequence's own tokens, so they cannot depend on the batch either;
 * a group of 3 with a frequency penalty keeps each sample's own counts (checked against that
 * group run alone). */
static void test_batch_invariance_edits(void)
{
    NEED(tiny_ok, "tiny-q4_1");
    bi_req *reqs = calloc(18, sizeof *reqs);
    CHECK(reqs, "oom");
    make_batch(tiny.m, reqs, 3, tiny.m->cfg.vocab, 0, 1);
    static const int32_t bias_ids[3] = {4, 9, 17};
    static const float bias_vals[3] = {3.0f, -2.0f, 1.25f};
    static const int32_t stop[1] = {5};
    reqs[0].rq.sp.repetition_penalty = 1.4f, reqs[0].rq.sp.frequency_penalty = 0.4f;
    reqs[0].rq.n_bias = 3, reqs[0].rq.bias_ids = bias_ids, reqs[0].rq.bias_vals = bias_vals;
    reqs[1].rq.sp.presence_penalty = 0.6f, reqs[1].rq.sp.repetition_penalty = 0.85f;
    reqs[1].rq.min_tokens = 6, reqs[1].rq.stop_ids = stop, reqs[1].rq.n_stop = 1;
    reqs[5].rq.sp.frequency_penalty = 1.1f; /* the group of 3 (make_batch: others' index 3) */
    reqs[8].rq.sp.repetition_penalty = 1.9f;
    int order[18] = {2, 3, 4, 5, 6, 0, 7, 8, 9, 10, 11, 12, 1, 13, 14, 15, 16, 17};
    int gaps[18] = {0, 0, 0, 1, 0, 2, 0, 0, 3, 0, 0, 1, 0, 2, 0, 0, 1, 0};
    char why[400] = "";
    int ok;
    batch_case(tiny.m, reqs, 18, order, gaps, 64, 128, 1, why, sizeof why, &ok);
    free(reqs);
    CHECK(ok, "%s", why);
}

/* Scoring (issue 45): rescoring prompt + completion gives, at the completion's positions, the bits the
 * completion was sampled with: greedy, seeded and top-p requests (a group of 3 included) are
 * generated alone, then each prompt + completion is scored from the completion's first position, in
 * one engine together with 8 other requests (so scoring prefills are chunked by ENG_SCORE_CHUNK and
 * batched with decodes), score-only (max_tokens 0) and with tokens after it. Scored alternatives
 * equal the sampled ones too. Under the CUDA emulator (test_engine_cudaemu) the same runs on the
 * device sampler. */
static void test_rescoring_exact(void)
{
    NEED(tiny_ok, "tiny-q4_1");
    model *m = tiny.m;
    const int32_t V = m->cfg.vocab;
    eng_config c = cfg_for(m, 256, 64, 32);
    static int32_t prompts[3][40];
    static int32_t full[5][40 + 64];
    eng_request gen[3];
    const float temps[3] = {0.0f, 1.0f, 0.8f};
    for (int i = 0; i < 3; i++) {
        make_prompt(prompts[i], 9 + 11 * i, 300 + i, 3, V);
        gen[i] = make_req(prompts[i], 9 + 11 * i, i == 2 ? 3 : 1, 40, temps[i], 17 + i);
        gen[i].sp.top_p = i == 2 ? 0.9f : 1.0f;
        gen[i].sp.logprobs_topk = 3;
        gen[i].ignore_eos = 1;
    }
    res_set *alone = res_new(), *got = res_new();
    CHECK(alone && got, "oom");
    for (int i = 0; i < 3; i++) {
        res_set *one = res_new();
        CHECK(one && run_alone(m, &c, &gen[i], one) == 0, "generate %d: %s", i, rd_errmsg());
        for (int k = 0; k < one->n; k++) {
            alone->r[alone->n] = one->r[k];
            alone->r[alone->n].tag = (uint64_t)i;
            alone->n++;
        }
        one->n = 0;
        res_free(one);
    }
    CHECK(alone->n == 5, "%d rollouts, want 5", alone->n);
    engine *e;
    CHECK(eng_create(m, &c, &e) == 0, "eng_create: %s", rd_errmsg());
    int64_t ids[5], other_ids[8];
    static int32_t other_prompts[8][60];
    for (int k = 0; k < 8; k++) {
        make_prompt(other_prompts[k], 20 + 5 * k, 900 + k, 3, V);
        eng_request o = make_req(other_prompts[k], 20 + 5 * k, 1, 12, 1.0f, 50 + k);
        CHECK(eng_add(e, &o, &other_ids[k]) == 0, "add other: %s", rd_errmsg());
    }
    for (int k = 0; k < 5; k++) {
        const eng_result *r = &alone->r[k];
        const int i = (int)r->tag;
        memcpy(full[k], prompts[i], sizeof(int32_t) * (size_t)r->n_prompt);
        memcpy(full[k] + r->n_prompt, r->token_ids, sizeof(int32_t) * (size_t)r->n_tokens);
        eng_request q = make_req(full[k], r->n_prompt + r->n_tokens, 1, k % 2 ? 5 : 0, 1.0f, 1);
        q.score_prompt = 1;
        q.score_from = r->n_prompt;
        q.sp.logprobs_topk = 3;
        q.ignore_eos = 1;
        CHECK(eng_add(e, &q, &ids[k]) == 0, "add score %d: %s", k, rd_errmsg());
    }
    for (int it = 0; eng_busy(e); it++) {
        CHECK(it < 100000, "still busy");
        CHECK(eng_step(e) >= 0, "step: %s", rd_errmsg());
        collect(e, got);
    }
    collect(e, got);
    eng_destroy(e);
    int scored = 0;
    for (int k = 0; k < 5; k++) {
        const eng_result *r = &alone->r[k], *sc = res_find(got, ids[k], 0);
        CHECK(sc && sc->prompt_logprobs, "rollout %d: no scored result", k);
        CHECK(sc->n_tokens == (k % 2 ? 5 : 0), "rollout %d: %d tokens generated after scoring", k, sc->n_tokens);
        for (int32_t t = 0; t < r->n_tokens; t++) {
            const int32_t p = r->n_prompt + t;
            CHECK(!memcmp(&sc->prompt_logprobs[p], &r->logprobs[t], sizeof(float)),
                  "rollout %d token %d: scored %.9g, sampled %.9g", k, t, sc->prompt_logprobs[p], r->logprobs[t]);
            for (int32_t j = 0; j < 3; j++)
                CHECK(sc->prompt_top_ids[(size_t)p * 3 + j] == r->top_ids[(size_t)t * 3 + j] &&
                          !memcmp(&sc->prompt_top_logprobs[(size_t)p * 3 + j], &r->top_logprobs[(size_t)t * 3 + j],
                                  sizeof(float)),
                      "rollout %d token %d: alternative %d differs", k, t, j);
            scored++;
        }
        for (int32_t p = 0; p < r->n_prompt; p++)
            CHECK(isnan(sc->prompt_logprobs[p]), "rollout %d: prompt position %d scored before score_from", k, p);
    }
    printf("# %d completion tokens rescored, bit-identical\n", scored);
    res_free(alone);
    res_free(got);
}

/* Every family: a greedy and a seeded sequence alone and inside a batch of
 * 16 mixed-length requests, bit-identical (the Qwen2 bias, the Qwen3
 * per-head norms and the scaled RoPE table are all row-local; Gemma 3's
 * window of 8 is crossed by prompts of 5..60 tokens). */
static const char *FAMILY_MODELS[] = {"tiny-qwen2", "tiny-qwen3", "tiny-llama3", "tiny-gemma3"};

static void test_batch_invariance_families(void)
{
    for (size_t f = 0; f < sizeof FAMILY_MODELS / sizeof FAMILY_MODELS[0]; f++) {
        rd_loaded l;
        CHECK(load_tiny(FAMILY_MODELS[f], &l), "%s is not loaded (run tests/gen_testdata.sh %s): %s",
              FAMILY_MODELS[f], testdata(), rd_errmsg());
        bi_req *reqs = calloc(18, sizeof *reqs);
        int ok = 0;
        char why[400] = "oom";
        if (reqs) {
            make_batch(l.m, reqs, 3, l.m->cfg.vocab, 0, 1);
            int order[18] = {2, 3, 4, 5, 6, 0, 7, 8, 9, 10, 11, 12, 1, 13, 14, 15, 16, 17};
            int gaps[18] = {0, 0, 0, 1, 0, 2, 0, 0, 3, 0, 0, 1, 0, 2, 0, 0, 1, 0};
            batch_case(l.m, reqs, 18, order, gaps, 64, 128, 1, why, sizeof why, &ok);
        }
        free(reqs);
        rd_unload(&l);
        CHECK(ok, "%s: %s", FAMILY_MODELS[f], why);
    }
}

static rd_loaded real;
static int real_ok = -1; /* -1: not tried */

static void test_batch_invariance_real(void)
{
    CHECK(real_ok == 1, "cannot load %s: %s", real_model_path(), rd_errmsg());
    bi_req *reqs = calloc(18, sizeof *reqs);
    CHECK(reqs, "oom");
    make_batch(real.m, reqs, 100, 20000, 8, 0);
    int order[18] = {2, 3, 4, 5, 0, 6, 7, 8, 9, 10, 1, 11, 12, 13, 14, 15, 16, 17};
    int gaps[18] = {0, 0, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0, 2, 0, 0, 1, 0, 0};
    char why[400] = "";
    int ok;
    batch_case(real.m, reqs, 18, order, gaps, 128, 100, 0, why, sizeof why, &ok);
    free(reqs);
    CHECK(ok, "%s", why);
}

/* ---------------------------------------------------------------------------
 * 4. Groups: n samples prefill once and share the prompt's blocks. */

static int32_t cdiv(int32_t a, int32_t b) { return (a + b - 1) / b; }

static void group_blocks_case(int32_t np, char *why, size_t cap, int *ok)
{
    model *m = tiny.m;
    const int32_t N = 8, MT = 30, BS = 16;
    int32_t p[64];
    make_prompt(p, np, 50 + np, 3, m->cfg.vocab);
    eng_request rq = make_req(p, np, N, MT, 1.0f, 5);
    engine *e = NULL;
    res_set *got = res_new();
    *ok = 0;
#define FAIL(...) do { snprintf(why, cap, __VA_ARGS__); goto out; } while (0)
    eng_config c = cfg_for(m, 256, 512, 64);
    if (eng_create(m, &c, &e))
        FAIL("eng_create: %s", rd_errmsg());
    int64_t id;
    if (eng_add(e, &rq, &id))
        FAIL("eng_add: %s", rd_errmsg());
    eng_stats st;
    if (eng_step(e) != np)
        FAIL("the prefill step did not compute the %d prompt rows", np);
    eng_get_stats(e, &st);
    if (st.kv_blocks_used != cdiv(np, BS) || st.running != N)
        FAIL("after prefill: %d blocks used (want %d), %d running (want %d)", st.kv_blocks_used, cdiv(np, BS),
             st.running, N);
    const int32_t shared = np / BS; /* full prompt blocks stay shared */
    for (int32_t k = 1; k < MT; k++) {
        int rows = eng_step(e);
        if (rows != N)
            FAIL("decode step %d computed %d rows, want %d", k, rows, N);
        eng_get_stats(e, &st);
        int32_t want = shared + N * (cdiv(np + k, BS) - shared);
        if (k < MT - 1 && st.kv_blocks_used != want)
            FAIL("prompt %d, after decode step %d: %d blocks used, want %d shared + %d x %d private = %d", np, k,
                 st.kv_blocks_used, shared, N, cdiv(np + k, BS) - shared, want);
    }
    if (drive(e, got))
        FAIL("drive: %s", rd_errmsg());
    eng_get_stats(e, &st);
    if (st.prompt_tokens != np)
        FAIL("%lld prompt rows computed for a group of %d over a %d-token prompt (want %d: prefill once)",
             (long long)st.prompt_tokens, N, np, np);
    if (st.kv_blocks_used != 0 || got->n != N)
        FAIL("at the end %d blocks used, %d results", st.kv_blocks_used, got->n);
    *ok = 1;
out:
#undef FAIL
    eng_destroy(e);
    res_free(got);
}

static int run_group(int32_t np, int32_t n, float temp, uint64_t seed, int32_t mt, res_set *out)
{
    int32_t p[64];
    make_prompt(p, np, 60, 3, tiny.m->cfg.vocab);
    eng_request rq = make_req(p, np, n, mt, temp, seed);
    eng_config c = cfg_for(tiny.m, 256, 512, 64);
    return run_alone(tiny.m, &c, &rq, out);
}

static void test_groups(void)
{
    NEED(tiny_ok, "tiny-q4_1");
    char why[400] = "";
    int ok;
    group_blocks_case(40, why, sizeof why, &ok);
    CHECK(ok, "%s", why);
    group_blocks_case(32, why, sizeof why, &ok);
    CHECK(ok, "%s", why);

    /* Seeded samples differ, repeat with the same seed, change with another. */
    res_set *a = res_new(), *a2 = res_new(), *b = res_new(), *g = res_new(), *one = res_new();
    int rc = run_group(40, 8, 1.0f, 99, 24, a);
    if (!rc) rc = run_group(40, 8, 1.0f, 99, 24, a2);
    if (!rc) rc = run_group(40, 8, 1.0f, 100, 24, b);
    if (!rc) rc = run_group(40, 8, 0.0f, 99, 24, g);
    if (!rc) rc = run_group(40, 1, 1.0f, 99, 24, one);
    int differ = 0, repeat = 1, changed = 0, greedy_same = 1, complete = a->n == 8 && a2->n == 8 && b->n == 8 &&
                                                                          g->n == 8 && one->n == 1;
    int sample0_same = 0;
    char w[300] = "";
    if (!rc && complete) {
        for (int i = 0; i < 8; i++)
            for (int j = i + 1; j < 8; j++)
                differ += !same_tokens(res_find(a, 1, i), res_find(a, 1, j));
        for (int i = 0; i < 8; i++) {
            repeat &= same_rollout(res_find(a, 1, i), res_find(a2, 1, i), w, sizeof w);
            changed += !same_tokens(res_find(a, 1, i), res_find(b, 1, i));
            greedy_same &= same_rollout(res_find(g, 1, i), res_find(g, 1, 0), w, sizeof w);
        }
        /* Sample 0 of a group uses the same random stream as a lone request:
         * forking and copy-on-write must not change it. */
        sample0_same = same_rollout(res_find(a, 1, 0), res_find(one, 1, 0), w, sizeof w);
    }
    res_free(a), res_free(a2), res_free(b), res_free(g), res_free(one);
    CHECK_OK(rc);
    CHECK(complete, "missing results");
    CHECK(differ >= 26, "only %d of 28 pairs of seeded samples differ", differ);
    CHECK(repeat, "the same seed did not repeat the samples exactly: %s", w);
    CHECK(changed >= 6, "another seed changed only %d of 8 samples", changed);
    CHECK(greedy_same, "greedy samples of one group differ: %s", w);
    CHECK(sample0_same, "sample 0 of the group differs from the lone request with the same seed: %s", w);
}

/* ---------------------------------------------------------------------------
 * 5. Bad input. */

static void test_bad_input(void)
{
    NEED(tiny_ok, "tiny-q4_1");
    model *m = tiny.m;
    const int32_t V = m->cfg.vocab, CTX = m->cfg.max_ctx;
    int32_t pa[20], pb[33];
    make_prompt(pa, 20, 70, 3, V);
    make_prompt(pb, 33, 71, 3, V);
    eng_request ga = make_req(pa, 20, 2, 12, 1.0f, 8), gb = make_req(pb, 33, 1, 15, 0.0f, 0);

    int32_t *longp = malloc(sizeof(int32_t) * (CTX + 10));
    CHECK(longp, "oom");
    make_prompt(longp, CTX + 10, 72, 3, V);
    int32_t bad_hi[20], bad_neg[20], stops_bad[1] = {V}, stops_many[17] = {0};
    memcpy(bad_hi, pa, sizeof pa);
    memcpy(bad_neg, pa, sizeof pa);
    bad_hi[7] = V;
    bad_neg[3] = -1;

    struct { const char *what; eng_request r; } bad[32];
    int nb = 0;
#define BAD(desc, ...) do { eng_request r_ = ga; __VA_ARGS__; bad[nb].what = desc; bad[nb++].r = r_; } while (0)
    BAD("n = 0", r_.n = 0);
    BAD("n = -3", r_.n = -3);
    BAD("n > max_num_seqs", r_.n = 65);
    BAD("max_tokens = 0", r_.max_tokens = 0);
    BAD("max_tokens = -1", r_.max_tokens = -1);
    BAD("prompt = context length", r_.prompt = longp; r_.n_prompt = CTX);
    BAD("prompt longer than the context", r_.prompt = longp; r_.n_prompt = CTX + 10);
    BAD("empty prompt", r_.n_prompt = 0);
    BAD("NULL prompt", r_.prompt = NULL);
    BAD("token id = vocab", r_.prompt = bad_hi);
    BAD("negative token id", r_.prompt = bad_neg);
    BAD("NaN temperature", r_.sp.temperature = NAN);
    BAD("infinite temperature", r_.sp.temperature = INFINITY);
    BAD("negative temperature", r_.sp.temperature = -0.5f);
    BAD("top_p = 0", r_.sp.top_p = 0.0f);
    BAD("top_p > 1", r_.sp.top_p = 1.5f);
    BAD("NaN top_p", r_.sp.top_p = NAN);
    BAD("negative top_k", r_.sp.top_k = -1);
    BAD("logprobs_topk 21", r_.sp.logprobs_topk = 21);
    BAD("stop id = vocab", r_.stop_ids = stops_bad; r_.n_stop = 1);
    BAD("17 stop ids", r_.stop_ids = stops_many; r_.n_stop = 17);
    BAD("negative n_stop", r_.n_stop = -1);
    BAD("n_stop 2 with NULL stop_ids", r_.stop_ids = NULL; r_.n_stop = 2);
#undef BAD

    res_set *clean = res_new(), *dirty = res_new();
    engine *e = NULL;
    int64_t ida = 0, idb = 0;
    eng_config c = cfg_for(m, 64, 64, 16);
    int rc = eng_create(m, &c, &e);
    if (!rc)
        rc = eng_add(e, &ga, &ida);
    if (!rc)
        rc = eng_add(e, &gb, &idb);
    if (!rc)
        rc = drive(e, clean);
    eng_destroy(e);
    e = NULL;
    CHECK_OK(rc);

    char why[400] = "";
    int all_rejected = 1;
    int64_t dida = 0, didb = 0;
    rc = eng_create(m, &c, &e);
    if (!rc)
        rc = eng_add(e, &ga, &dida);
    if (!rc)
        rc = run_steps(e, 2, dirty); /* a is running when the bad ones arrive */
    for (int i = 0; !rc && i < nb && all_rejected; i++) {
        rd_fail(RD_OK, "%s", "");
        int64_t id = -77;
        eng_stats before, after;
        eng_get_stats(e, &before);
        int brc = eng_add(e, &bad[i].r, &id);
        eng_get_stats(e, &after);
        if (brc >= 0 || brc == RD_EBUSY || rd_errmsg()[0] == 0 || after.waiting != before.waiting ||
            after.running != before.running || after.kv_blocks_used != before.kv_blocks_used) {
            snprintf(why, sizeof why, "%s: returned %d, message '%s', waiting %d -> %d", bad[i].what, brc,
                     rd_errmsg(), before.waiting, after.waiting);
            all_rejected = 0;
        }
        if (i == nb / 2 && !rc)
            rc = eng_add(e, &gb, &didb); /* b arrives among the bad ones */
    }
    if (!rc)
        rc = drive(e, dirty);
    eng_destroy(e);
    e = NULL;
    free(longp);
    char w[300] = "";
    int same = 1;
    if (!rc && all_rejected) {
        for (int32_t s = 0; s < 2 && same; s++)
            if (!same_rollout(res_find(dirty, dida, s), res_find(clean, ida, s), w, sizeof w))
                same = 0;
        if (same && !same_rollout(res_find(dirty, didb, 0), res_find(clean, idb, 0), w, sizeof w))
            same = 0;
        same &= dirty->n == 3;
    }
    res_free(clean), res_free(dirty);
    CHECK_OK(rc);
    CHECK(all_rejected, "%s", why);
    CHECK(same, "good requests changed by the bad ones: %s", w);

    /* A prompt of max_ctx - 1 tokens is fine (one token of room). */
    {
        int32_t edge_p[300];
        CHECK(CTX - 1 <= 300, "context too large for this case");
        make_prompt(edge_p, CTX - 1, 73, 3, V);
        eng_request edge = make_req(edge_p, CTX - 1, 1, 5, 0.0f, 0);
        res_set *r = res_new();
        eng_config c2 = cfg_for(m, 64, 512, 16);
        rc = run_alone(m, &c2, &edge, r);
        int n = r->n, nt = n ? r->r[0].n_tokens : -1;
        res_free(r);
        CHECK_OK(rc);
        CHECK(n == 1 && nt == 1, "prompt of max_ctx-1: %d results, %d tokens (want 1, 1)", n, nt);
    }

    /* RD_EBUSY once max_waiting requests wait; accepted again after a step. */
    {
        eng_config c3 = cfg_for(m, 64, 512, 16);
        c3.max_waiting = 3;
        res_set *r = res_new();
        int64_t id;
        rc = eng_create(m, &c3, &e);
        int busy_rc = 0, after_rc = -1, waiting = -1;
        char busy_msg[300] = "";
        for (int i = 0; !rc && i < 3; i++)
            rc = eng_add(e, &gb, &id);
        if (!rc) {
            rd_fail(RD_OK, "%s", "");
            busy_rc = eng_add(e, &gb, &id);
            snprintf(busy_msg, sizeof busy_msg, "%s", rd_errmsg());
            eng_stats st;
            eng_get_stats(e, &st);
            waiting = st.waiting;
            rc = run_steps(e, 1, r);
            if (!rc)
                after_rc = eng_add(e, &gb, &id);
            if (!rc)
                rc = drive(e, r);
        }
        int n = r->n;
        eng_destroy(e);
        res_free(r);
        CHECK_OK(rc);
        CHECK(busy_rc == RD_EBUSY && busy_msg[0], "4th request with max_waiting 3: returned %d, message '%s'",
              busy_rc, busy_msg);
        CHECK(waiting == 3, "%d waiting after the refused add", waiting);
        CHECK(after_rc == 0, "after a step the add still fails: %d (%s)", after_rc, rd_errmsg());
        CHECK(n == 4, "%d results, want 4", n);
    }
}

/* ---------------------------------------------------------------------------
 * 6. Abort. */

static void test_abort(void)
{
    NEED(tiny_ok, "tiny-q4_1");
    model *m = tiny.m;
    const int32_t V = m->cfg.vocab, N = 4, MT = 40;
    int32_t pr[30], p1[12], p2[45];
    make_prompt(pr, 30, 80, 3, V);
    make_prompt(p1, 12, 81, 3, V);
    make_prompt(p2, 45, 82, 3, V);
    eng_request R = make_req(pr, 30, N, MT, 1.0f, 21);
    eng_request O1 = make_req(p1, 12, 1, 20, 0.0f, 0), O2 = make_req(p2, 45, 1, 25, 1.0f, 22);
    eng_config big = cfg_for(m, 64, 512, 64);
    res_set *fr = res_new(), *f1 = res_new(), *f2 = res_new(), *got = res_new();
    int rc = run_alone(m, &big, &R, fr);
    if (!rc) rc = run_alone(m, &big, &O1, f1);
    if (!rc) rc = run_alone(m, &big, &O2, f2);

    /* Running and forked: partial rollouts, prefixes of the full ones. */
    engine *e = NULL;
    int64_t idr = 0, id1 = 0, id2 = 0;
    int abort_rc = -1, again_rc = 0, unknown_rc = 0, prefix = 1, aborted_ok = 1, others_ok = 1;
    char w[300] = "", unknown_msg[300] = "";
    int32_t min_tok = MT, max_tok = -1;
    eng_stats st = {0};
    if (!rc) rc = eng_create(m, &big, &e);
    if (!rc) rc = eng_add(e, &O1, &id1);
    if (!rc) rc = eng_add(e, &R, &idr);
    if (!rc) rc = eng_add(e, &O2, &id2);
    if (!rc) rc = run_steps(e, 6, got);
    if (!rc) {
        abort_rc = eng_abort(e, idr);
        collect(e, got);
        again_rc = eng_abort(e, idr);
        rd_fail(RD_OK, "%s", "");
        unknown_rc = eng_abort(e, 12345);
        snprintf(unknown_msg, sizeof unknown_msg, "%s", rd_errmsg());
        rc = drive(e, got);
        eng_get_stats(e, &st);
    }
    if (!rc) {
        for (int32_t s = 0; s < N; s++) {
            const eng_result *a = res_find(got, idr, s);
            if (!a || a->finish != FINISH_ABORT) {
                aborted_ok = 0;
                snprintf(w, sizeof w, "sample %d: %s", s, a ? "finish is not FINISH_ABORT" : "missing");
                break;
            }
            if (a->n_tokens < min_tok) min_tok = a->n_tokens;
            if (a->n_tokens > max_tok) max_tok = a->n_tokens;
            if (!is_prefix(a, res_find(fr, 1, s), w, sizeof w)) {
                prefix = 0;
                break;
            }
        }
        others_ok = same_rollout(res_find(got, id1, 0), res_find(f1, 1, 0), w, sizeof w) &&
                    same_rollout(res_find(got, id2, 0), res_find(f2, 1, 0), w, sizeof w);
    }
    eng_destroy(e);
    e = NULL;
    int n_got = got->n;
    CHECK_OK(rc);
    CHECK(abort_rc == 0, "eng_abort of a running request returned %d", abort_rc);
    CHECK(aborted_ok, "%s", w);
    CHECK(prefix, "aborted sample is not a prefix of the full run: %s", w);
    /* Step 1 prefilled every prompt (87 rows, within budget) and forked R with
     * one token per sample; steps 2..6 each added one. */
    CHECK(min_tok == 6 && max_tok == 6, "aborted samples have %d..%d tokens (want the 6 generated so far)",
          min_tok, max_tok);
    CHECK(others_ok, "other requests changed by the abort: %s", w);
    CHECK(n_got == N + 2, "%d results, want %d", n_got, N + 2);
    CHECK(again_rc == RD_ENOENT, "aborting twice returned %d", again_rc);
    CHECK(unknown_rc == RD_ENOENT && unknown_msg[0], "unknown id: returned %d, message '%s'", unknown_rc,
          unknown_msg);
    CHECK(st.aborted == N && st.kv_blocks_used == 0, "stats: aborted %lld (want %d), %d blocks used",
          (long long)st.aborted, N, st.kv_blocks_used);

    /* Not yet forked: mid chunked prefill, and still waiting. Every sample
     * comes back, empty. */
    for (int phase = 0; phase < 2; phase++) {
        res_set *r = res_new();
        eng_config c = cfg_for(m, 64, 16, 16);
        rc = eng_create(m, &c, &e);
        if (!rc) rc = eng_add(e, &R, &idr);
        if (!rc) rc = run_steps(e, phase, r); /* phase 1: 16 of 30 prompt rows computed */
        int busy = !rc && eng_busy(e);
        if (!rc) rc = eng_abort(e, idr);
        if (!rc) collect(e, r);
        int seen = 0, good = 1;
        for (int i = 0; i < r->n; i++) {
            const eng_result *a = &r->r[i];
            if (a->req_id != idr || a->finish != FINISH_ABORT || a->n_tokens != 0 || a->sample_idx < 0 ||
                a->sample_idx >= N || a->n_prompt != 30 || !a->prompt_ids ||
                memcmp(a->prompt_ids, pr, sizeof pr) != 0)
                good = 0;
            else
                seen |= 1 << a->sample_idx;
        }
        int n = r->n;
        eng_get_stats(e, &st);
        int busy_after = eng_busy(e);
        eng_destroy(e);
        e = NULL;
        res_free(r);
        CHECK_OK(rc);
        CHECK(busy, "phase %d: the request finished before the abort", phase);
        CHECK(n == N && good && seen == (1 << N) - 1,
              "%s: %d results (want %d, one per sample, empty, FINISH_ABORT, with the prompt)",
              phase ? "mid-prefill" : "waiting", n, N);
        CHECK(!busy_after && st.kv_blocks_used == 0, "after the abort: busy %d, %d blocks used", busy_after,
              st.kv_blocks_used);
    }

    /* Finished (collected or not) requests cannot be aborted. */
    {
        res_set *r = res_new();
        rc = eng_create(m, &big, &e);
        if (!rc) rc = eng_add(e, &O1, &id1);
        if (!rc) rc = eng_add(e, &O2, &id2);
        int ab1 = 0, ab2 = 0;
        if (!rc) {
            while (eng_busy(e) && eng_step(e) >= 0)
                ;
            ab1 = eng_abort(e, id1); /* finished, not collected */
            collect(e, r);
            ab2 = eng_abort(e, id2); /* collected */
        }
        int ok = r->n == 2 && same_rollout(res_find(r, id1, 0), res_find(f1, 1, 0), w, sizeof w);
        eng_destroy(e);
        e = NULL;
        res_free(r);
        CHECK_OK(rc);
        CHECK(ab1 == RD_ENOENT && ab2 == RD_ENOENT, "abort of finished requests returned %d, %d", ab1, ab2);
        CHECK(ok, "results after a refused abort: %s", w);
    }
    res_free(fr), res_free(f1), res_free(f2), res_free(got);
}

/* ---------------------------------------------------------------------------
 * 7. Stop conditions. */

/* First index >= from whose token does not occur before it, or -1. */
static int32_t fresh_token_index(const eng_result *r, int32_t from)
{
    for (int32_t j = from; j < r->n_tokens; j++) {
        int seen = 0;
        for (int32_t i = 0; i < j; i++)
            seen |= r->token_ids[i] == r->token_ids[j];
        if (!seen)
            return j;
    }
    return -1;
}

static void stop_case(float temp, uint64_t seed, char *why, size_t cap, int *ok)
{
    model *m = tiny.m;
    const int32_t MT = 40;
    int32_t p[20];
    eng_config big = cfg_for(m, 64, 512, 64);
    res_set *full = NULL, *r = NULL;
    eng_request rq;
    int32_t j = -1;
    *ok = 0;
#define FAIL(...) do { snprintf(why, cap, __VA_ARGS__); goto out; } while (0)
    for (uint32_t salt = 0; salt < 20 && j < 0; salt++) {
        res_free(full);
        full = res_new();
        make_prompt(p, 20, 90 + salt, 3, m->cfg.vocab);
        rq = make_req(p, 20, 1, MT, temp, seed);
        if (run_alone(m, &big, &rq, full) || full->n != 1)
            FAIL("full run: %s", rd_errmsg());
        if (full->r[0].n_tokens != MT || full->r[0].finish != FINISH_LENGTH)
            FAIL("full run: %d tokens, finish %d (want %d, FINISH_LENGTH)", full->r[0].n_tokens,
                 full->r[0].finish, MT);
        j = fresh_token_index(&full->r[0], 3);
    }
    if (j < 0)
        FAIL("no generated token suitable as a stop id");
    const eng_result *f = &full->r[0];
    int32_t stop = f->token_ids[j];

    /* A stop id (with an unrelated one first) ends the sample at its first
     * occurrence, the stop token included. */
    int32_t stops[2] = {0, stop};
    for (int32_t t = 3; t < m->cfg.vocab; t++) {
        int used = 0;
        for (int32_t i = 0; i < f->n_tokens; i++)
            used |= f->token_ids[i] == t;
        if (!used) {
            stops[0] = t;
            break;
        }
    }
    eng_request sr = rq;
    sr.stop_ids = stops;
    sr.n_stop = 2;
    r = res_new();
    if (run_alone(m, &big, &sr, r) || r->n != 1)
        FAIL("stop run: %s", rd_errmsg());
    const eng_result *a = &r->r[0];
    char w[300];
    if (a->finish != FINISH_STOP || a->n_tokens != j + 1 || a->token_ids[j] != stop)
        FAIL("stop id %d (first generated at index %d): %d tokens, finish %d, last %d (want %d, FINISH_STOP, %d)",
             stop, j, a->n_tokens, a->finish, a->n_tokens ? a->token_ids[a->n_tokens - 1] : -1, j + 1, stop);
    if (!is_prefix(a, f, w, sizeof w))
        FAIL("stopped run is not a prefix of the full one: %s", w);
    res_free(r);

    /* The model's EOS (eos_id in the config) stops too, unless ignore_eos. */
    eng_config ec = big;
    ec.eos_id = stop;
    r = res_new();
    if (run_alone(m, &ec, &rq, r) || r->n != 1)
        FAIL("eos run: %s", rd_errmsg());
    a = &r->r[0];
    if (a->finish != FINISH_STOP || a->n_tokens != j + 1 || !is_prefix(a, f, w, sizeof w))
        FAIL("eos_id %d: %d tokens, finish %d (want %d, FINISH_STOP)", stop, a->n_tokens, a->finish, j + 1);
    res_free(r);
    eng_request ir = rq;
    ir.ignore_eos = 1;
    r = res_new();
    if (run_alone(m, &ec, &ir, r) || r->n != 1)
        FAIL("ignore_eos run: %s", rd_errmsg());
    if (!same_rollout(&r->r[0], f, w, sizeof w))
        FAIL("ignore_eos: %s", w);
    res_free(r);

    /* The chat format's end of turn (eot_id) stops as EOS does when EOS is
     * another token (a Llama 3 file whose eos is <|end_of_text|>), and
     * ignore_eos ignores it as well. */
    ec = big;
    ec.eos_id = stops[0];
    ec.eot_id = stop;
    r = res_new();
    if (run_alone(m, &ec, &rq, r) || r->n != 1)
        FAIL("eot run: %s", rd_errmsg());
    a = &r->r[0];
    if (a->finish != FINISH_STOP || a->n_tokens != j + 1 || !is_prefix(a, f, w, sizeof w))
        FAIL("eot_id %d: %d tokens, finish %d (want %d, FINISH_STOP)", stop, a->n_tokens, a->finish, j + 1);
    res_free(r);
    r = res_new();
    if (run_alone(m, &ec, &ir, r) || r->n != 1)
        FAIL("ignore_eos run with eot_id: %s", rd_errmsg());
    if (!same_rollout(&r->r[0], f, w, sizeof w))
        FAIL("ignore_eos with eot_id: %s", w);
    res_free(r);

    /* max_tokens: FINISH_LENGTH with exactly that many tokens. */
    int32_t mts[] = {1, 2, 7, 33};
    for (int k = 0; k < 4; k++) {
        eng_request lr = rq;
        lr.max_tokens = mts[k];
        r = res_new();
        if (run_alone(m, &big, &lr, r) || r->n != 1)
            FAIL("max_tokens %d: %s", mts[k], rd_errmsg());
        a = &r->r[0];
        if (a->finish != FINISH_LENGTH || a->n_tokens != mts[k] || !is_prefix(a, f, w, sizeof w))
            FAIL("max_tokens %d: %d tokens, finish %d (want FINISH_LENGTH, prefix of the full run)", mts[k],
                 a->n_tokens, a->finish);
        res_free(r);
    }
    r = NULL;

    /* A group with max_tokens 1 finishes right at the fork, every sample with
     * its one token; sample 0 draws what the lone request drew. */
    {
        eng_request g1 = rq;
        g1.n = 4;
        g1.max_tokens = 1;
        r = res_new();
        if (run_alone(m, &big, &g1, r) || r->n != 4)
            FAIL("group with max_tokens 1: %d results (%s)", r->n, rd_errmsg());
        for (int i = 0; i < 4; i++)
            if (r->r[i].finish != FINISH_LENGTH || r->r[i].n_tokens != 1)
                FAIL("group with max_tokens 1: sample %d has %d tokens, finish %d", r->r[i].sample_idx,
                     r->r[i].n_tokens, r->r[i].finish);
        if (!is_prefix(res_find(r, 1, 0), f, w, sizeof w))
            FAIL("group with max_tokens 1, sample 0: %s", w);
        res_free(r);
        r = NULL;
    }

    /* A group with a stop id: each sample stops at its own first occurrence. */
    {
        int32_t stop1[1] = {stop};
        eng_request g = rq, gs;
        g.n = 4;
        gs = g;
        gs.stop_ids = stop1;
        gs.n_stop = 1;
        res_set *gf = res_new();
        r = res_new();
        int rc = run_alone(m, &big, &g, gf);
        if (!rc)
            rc = run_alone(m, &big, &gs, r);
        int stopped = 0, good = rc == 0 && gf->n == 4 && r->n == 4;
        for (int32_t s = 0; good && s < 4; s++) {
            const eng_result *u = res_find(gf, 1, s), *v = res_find(r, 1, s);
            int32_t first = -1;
            for (int32_t i = 0; u && i < u->n_tokens && first < 0; i++)
                if (u->token_ids[i] == stop)
                    first = i;
            if (!u || !v || !is_prefix(v, u, w, sizeof w))
                good = 0;
            else if (first >= 0) {
                good = v->finish == FINISH_STOP && v->n_tokens == first + 1;
                stopped++;
            } else
                good = v->finish == FINISH_LENGTH && v->n_tokens == MT;
            if (!good)
                snprintf(w, sizeof w, "sample %d: %d tokens, finish %d, stop first at %d", s, v ? v->n_tokens : -1,
                         v ? (int)v->finish : -1, first);
        }
        res_free(gf);
        if (!good)
            FAIL("group with a stop id: %s (%s)", w, rd_errmsg());
        if (stopped == 0)
            FAIL("group with a stop id: no sample produced it");
        res_free(r);
        r = NULL;
    }

    /* The context length ends generation: 256 - 250 = 6 tokens. */
    {
        const int32_t CTX = m->cfg.max_ctx;
        int32_t lp[300];
        if (CTX > 300)
            FAIL("context %d too large for this case", CTX);
        make_prompt(lp, CTX - 6, 95, 3, m->cfg.vocab);
        eng_request cr = make_req(lp, CTX - 6, 2, 100, temp, seed);
        r = res_new();
        if (run_alone(m, &big, &cr, r) || r->n != 2)
            FAIL("context run: %s", rd_errmsg());
        for (int i = 0; i < 2; i++)
            if (r->r[i].finish != FINISH_LENGTH || r->r[i].n_tokens != 6)
                FAIL("prompt of ctx-6 with max_tokens 100: %d tokens, finish %d (want 6, FINISH_LENGTH)",
                     r->r[i].n_tokens, r->r[i].finish);
    }
    *ok = 1;
out:
#undef FAIL
    res_free(full);
    res_free(r);
}

static void test_stop_conditions(void)
{
    NEED(tiny_ok, "tiny-q4_1");
    char why[400] = "";
    int ok;
    stop_case(0.0f, 0, why, sizeof why, &ok);
    CHECK(ok, "greedy: %s", why);
    stop_case(1.0f, 31337, why, sizeof why, &ok);
    CHECK(ok, "seeded: %s", why);
}

/* ---------------------------------------------------------------------------
 * Brings the test data up to date (tests/gen_testdata.sh does nothing when
 * it already is). */
static void ensure_testdata(void)
{
    if (file_exists("tests/gen_testdata.sh")) {
        char cmd[600];
        snprintf(cmd, sizeof cmd, "tests/gen_testdata.sh '%s' >/dev/null", testdata());
        if (system(cmd) != 0)
            fprintf(stderr, "test_engine: %s failed\n", cmd);
    }
}

/* ---------------------------------------------------------------------------
 * Prefix cache: a request whose prompt starts with full blocks another
 * request computed takes them instead of recomputing them, and its rollout is
 * bit-identical to a run without the cache (fresh engine, cache off). A
 * weight version change makes old blocks unreachable; eviction only costs hits. */

static void test_prefix_cache(void)
{
    NEED(tiny_ok, "tiny-q4_1");
    model *m = tiny.m;
    int32_t pa[70], pc[60];
    make_prompt(pa, 70, 901, 3, m->cfg.vocab);
    memcpy(pc, pa, sizeof(int32_t) * 40);
    make_prompt(pc + 40, 20, 902, 3, m->cfg.vocab);
    eng_config on = cfg_for(m, 64, 64, 8), off = on;
    off.prefix_cache = 0;
    eng_request ra = make_req(pa, 70, 1, 8, 0.0f, 1), rq_c = make_req(pc, 60, 1, 8, 0.0f, 1);
    eng_request rg = make_req(pa, 70, 4, 8, 1.0f, 77);
    res_set *ref_a = res_new(), *ref_c = res_new(), *ref_g = res_new(), *got = res_new();
    CHECK_OK(run_alone(m, &off, &ra, ref_a));
    CHECK_OK(run_alone(m, &off, &rq_c, ref_c));
    CHECK_OK(run_alone(m, &off, &rg, ref_g));

    engine *e;
    CHECK_OK(eng_create(m, &on, &e));
    int64_t id[6];
    eng_stats st0, st1;
    char why[256];
    CHECK_OK(eng_add(e, &ra, &id[0]));
    CHECK_OK(drive(e, got));
    eng_get_stats(e, &st0);
    CHECK(st0.prefix_hit_tokens == 0 && st0.prefix_query_tokens == 64, "first run: %lld hits of %lld",
          (long long)st0.prefix_hit_tokens, (long long)st0.prefix_query_tokens);
    /* The same prompt again: 4 full blocks ((70 - 1) / 16) come from the cache. */
    CHECK_OK(eng_add(e, &ra, &id[1]));
    CHECK_OK(drive(e, got));
    eng_get_stats(e, &st1);
    CHECK(st1.prefix_hit_tokens == 64, "repeat: %lld hit tokens, expected 64", (long long)st1.prefix_hit_tokens);
    CHECK(st1.prompt_tokens - st0.prompt_tokens == 6, "repeat computed %lld prompt tokens, expected 6",
          (long long)(st1.prompt_tokens - st0.prompt_tokens));
    CHECK(same_rollout(res_find(got, id[1], 0), &ref_a->r[0], why, sizeof why), "cached prefix: %s", why);
    /* A prompt sharing 40 tokens: 2 blocks hit, the rest computed. */
    CHECK_OK(eng_add(e, &rq_c, &id[2]));
    CHECK_OK(drive(e, got));
    eng_get_stats(e, &st0);
    CHECK(st0.prefix_hit_tokens - st1.prefix_hit_tokens == 32, "shared 40 tokens: %lld hit, expected 32",
          (long long)(st0.prefix_hit_tokens - st1.prefix_hit_tokens));
    CHECK(same_rollout(res_find(got, id[2], 0), &ref_c->r[0], why, sizeof why), "partial prefix: %s", why);
    /* A seeded group of 4 on the cached prefix samples exactly as without the cache. */
    CHECK_OK(eng_add(e, &rg, &id[3]));
    CHECK_OK(drive(e, got));
    for (int32_t k = 0; k < 4; k++)
        CHECK(same_rollout(res_find(got, id[3], k), res_find(ref_g, ref_g->r[0].req_id, k), why, sizeof why),
              "group sample %d on a cached prefix: %s", k, why);
    /* Another weight version: the old blocks are not reachable (same weights here, so same outputs). */
    eng_get_stats(e, &st0);
    eng_set_version(e, 5);
    CHECK_OK(eng_add(e, &ra, &id[4]));
    CHECK_OK(drive(e, got));
    eng_get_stats(e, &st1);
    CHECK(st1.prefix_hit_tokens == st0.prefix_hit_tokens, "a new version hit %lld old tokens",
          (long long)(st1.prefix_hit_tokens - st0.prefix_hit_tokens));
    CHECK(same_rollout(res_find(got, id[4], 0), &ref_a->r[0], why, sizeof why), "new version: %s", why);
    CHECK(st1.kv_blocks_used == 0, "%d blocks used when idle (cached blocks must count as free)", st1.kv_blocks_used);
    /* Fill the pool with other prompts so the cached blocks get evicted: still correct, no leak. */
    int32_t other[200];
    for (int k = 0; k < 3; k++) {
        make_prompt(other, 200, 950 + (uint32_t)k, 3, m->cfg.vocab);
        eng_request ro = make_req(other, 200, 2, 16, 0.0f, 1);
        CHECK_OK(eng_add(e, &ro, &id[5]));
    }
    CHECK_OK(eng_add(e, &ra, &id[5]));
    CHECK_OK(drive(e, got));
    CHECK(same_rollout(res_find(got, id[5], 0), &ref_a->r[0], why, sizeof why), "after eviction: %s", why);
    eng_get_stats(e, &st1);
    CHECK(st1.kv_blocks_used == 0, "%d blocks leaked", st1.kv_blocks_used);
    eng_destroy(e);
    res_free(ref_a);
    res_free(ref_c);
    res_free(ref_g);
    res_free(got);
}

/* Streaming progress: a streaming group's partial results, per sample, add up
 * to its final tokens and log-probs, which are bit-identical to the same
 * request without streaming; a request that did not ask gets none. Pause
 * freezes every sequence (no rows, no tokens) with its KV kept; the flush
 * empties the prefix cache and nothing changes in the outputs. */
static void test_progress_pause_flush(void)
{
    NEED(tiny_ok, "tiny-q4_1");
    model *m = tiny.m;
    int32_t pa[40];
    make_prompt(pa, 40, 931, 3, m->cfg.vocab);
    eng_config cfg = cfg_for(m, 64, 64, 8);
    eng_request rs = make_req(pa, 40, 3, 12, 1.0f, 55), rn = rs;
    rs.sp.logprobs_topk = 2;
    rn.sp.logprobs_topk = 2;
    rs.stream = 1;
    res_set *ref = res_new(), *got = res_new();
    CHECK_OK(run_alone(m, &cfg, &rn, ref));
    engine *e;
    CHECK_OK(eng_create(m, &cfg, &e));
    int64_t id_s, id_n;
    CHECK_OK(eng_add(e, &rs, &id_s));
    CHECK_OK(eng_add(e, &rn, &id_n));
    int32_t ids[3][16], n_got[3] = {0}, n_partials = 0, bad = 0;
    float lps[3][16];
    eng_result pr[8];
    for (int it = 0; it < 1000 && eng_busy(e); it++) {
        CHECK(eng_step(e) >= 0, "step: %s", rd_errmsg());
        int n = eng_collect_progress(e, pr, 8);
        for (int i = 0; i < n; i++) {
            eng_result *r = &pr[i];
            int32_t j = r->sample_idx;
            if (!r->partial || r->req_id != id_s || j < 0 || j > 2 || r->token_offset != n_got[j] ||
                n_got[j] + r->n_tokens > 12 || r->n_top != 2)
                bad++;
            else
                for (int32_t k = 0; k < r->n_tokens; k++, n_got[j]++) {
                    ids[j][n_got[j]] = r->token_ids[k];
                    lps[j][n_got[j]] = r->logprobs[k];
                }
            n_partials++;
            eng_result_free(r);
        }
        collect(e, got);
    }
    CHECK(bad == 0, "%d partial results out of place", bad);
    CHECK(n_partials >= 3 * 8, "%d partial results for 3 samples of 12 tokens", n_partials);
    char why[256];
    for (int32_t j = 0; j < 3; j++) {
        const eng_result *a = res_find(got, id_s, j), *b = res_find(got, id_n, j), *w = res_find(ref, ref->r[0].req_id, j);
        CHECK(a && b && w, "sample %d missing", j);
        if (!a || !b || !w)
            continue;
        CHECK(same_rollout(a, w, why, sizeof why), "streamed sample %d vs alone: %s", j, why);
        CHECK(same_rollout(b, w, why, sizeof why), "plain sample %d vs alone: %s", j, why);
        /* The last token finishes the sample: it comes only with the final result. */
        CHECK(n_got[j] == a->n_tokens - 1 && !memcmp(ids[j], a->token_ids, sizeof(int32_t) * n_got[j]) &&
              !memcmp(lps[j], a->logprobs, sizeof(float) * n_got[j]), "sample %d: %d streamed tokens of %d", j,
              n_got[j], a->n_tokens);
    }

    /* Pause: a running request makes no rows and no tokens, and keeps its blocks. */
    int64_t id_p;
    eng_request rp = make_req(pa, 40, 1, 30, 0.0f, 1);
    CHECK_OK(eng_add(e, &rp, &id_p));
    CHECK(eng_step(e) > 0 && eng_step(e) > 0, "steps before the pause");
    eng_stats s0, s1;
    eng_get_stats(e, &s0);
    eng_pause(e, 1);
    for (int i = 0; i < 5; i++)
        CHECK(eng_step(e) == 0, "a paused engine computed rows");
    eng_get_stats(e, &s1);
    CHECK(s1.paused && s1.generated_tokens == s0.generated_tokens && s1.kv_blocks_used == s0.kv_blocks_used &&
          s1.running == 1 && eng_busy(e), "paused: %lld -> %lld tokens, %d -> %d blocks",
          (long long)s0.generated_tokens, (long long)s1.generated_tokens, s0.kv_blocks_used, s1.kv_blocks_used);
    eng_pause(e, 0);
    CHECK_OK(drive(e, got));
    const eng_result *rpr = res_find(got, id_p, 0);
    CHECK(rpr && rpr->finish == FINISH_LENGTH && rpr->n_tokens == 30, "resumed request did not finish");

    /* Flush: the cached prompt blocks go; the next run recomputes them and samples the same. */
    eng_get_stats(e, &s0);
    CHECK(s0.kv_blocks_cached >= 2 && s0.kv_blocks_used == 0, "%d cached blocks before the flush",
          s0.kv_blocks_cached);
    CHECK(eng_flush_cache(e) >= 2, "flush dropped nothing");
    eng_get_stats(e, &s1);
    CHECK(s1.kv_blocks_cached == 0 && s1.kv_blocks_used == 0, "%d cached blocks after the flush", s1.kv_blocks_cached);
    int64_t id_a;
    CHECK_OK(eng_add(e, &rn, &id_a));
    CHECK_OK(drive(e, got));
    eng_get_stats(e, &s0);
    CHECK(s0.prefix_hit_tokens == s1.prefix_hit_tokens, "a flushed prefix was hit");
    for (int32_t j = 0; j < 3; j++)
        CHECK(same_rollout(res_find(got, id_a, j), res_find(ref, ref->r[0].req_id, j), why, sizeof why),
              "after the flush, sample %d: %s", j, why);
    eng_destroy(e);
    res_free(ref);
    res_free(got);
}

/* SGLang's retract and memory release (issue 22): retracted sequences lose
 * their KV, wait, and finish with the tokens they would have had; a released
 * KV pool and released weights refuse requests, and once made again (the
 * weights read back from the file) give the same rollouts. */
static void test_retract_release(void)
{
    NEED(tiny_ok, "tiny-q4_1");
    model *m = tiny.m;
    int32_t pa[40];
    make_prompt(pa, 40, 977, 3, m->cfg.vocab);
    eng_config cfg = cfg_for(m, 64, 64, 8);
    eng_request rq = make_req(pa, 40, 2, 30, 1.0f, 91);
    res_set *ref = res_new(), *got = res_new();
    CHECK_OK(run_alone(m, &cfg, &rq, ref));
    engine *e;
    CHECK_OK(eng_create(m, &cfg, &e));
    int64_t id;
    CHECK_OK(eng_add(e, &rq, &id));
    for (int i = 0; i < 6; i++)
        CHECK(eng_step(e) > 0, "step %d before the retract", i);
    eng_stats s0, s1;
    CHECK(eng_retract(e) == 2, "two running samples retract");
    eng_pause(e, 1);
    eng_get_stats(e, &s0);
    CHECK(s0.running == 0 && s0.waiting == 2 && s0.kv_blocks_used == 0, "retracted: %d running, %d waiting, %d blocks",
          s0.running, s0.waiting, s0.kv_blocks_used);
    CHECK(eng_step(e) == 0 && eng_release_kv(e) == RD_EBUSY, "paused and retracted: no rows, no release");
    eng_pause(e, 0);
    CHECK_OK(drive(e, got));
    char why[256];
    for (int32_t j = 0; j < 2; j++)
        CHECK(same_rollout(res_find(got, id, j), res_find(ref, ref->r[0].req_id, j), why, sizeof why),
              "retracted sample %d vs alone: %s", j, why);

    /* The KV pool goes and comes back the same size. */
    eng_get_stats(e, &s0);
    CHECK_OK(eng_release_kv(e));
    eng_get_stats(e, &s1);
    CHECK(s1.kv_released && s1.kv_blocks_total == 0, "released: %d blocks", s1.kv_blocks_total);
    int64_t id2;
    CHECK(eng_add(e, &rq, &id2) == RD_EBUSY, "a request was taken with the KV pool released");
    CHECK_OK(eng_resume_kv(e));
    eng_get_stats(e, &s1);
    CHECK(!s1.kv_released && s1.kv_blocks_total == s0.kv_blocks_total, "resumed: %d blocks of %d",
          s1.kv_blocks_total, s0.kv_blocks_total);

    /* The weights: dropped, refused, read back from the file, the same rollouts. */
    CHECK_OK(eng_set_weights_released(e, 1));
    model_drop_weights(m);
    CHECK(eng_add(e, &rq, &id2) == RD_EBUSY && eng_step(e) == 0, "a request was taken with the weights released");
    char path[512];
    snprintf(path, sizeof path, "%s/tiny-q4_1.gguf", testdata());
    model *fresh;
    CHECK_OK(rd_read_weights(&tiny, path, 1, &fresh));
    CHECK_OK(model_adopt(m, fresh));
    model_count_bytes(m);
    CHECK_OK(eng_set_weights_released(e, 0));
    CHECK_OK(eng_add(e, &rq, &id2));
    CHECK_OK(drive(e, got));
    for (int32_t j = 0; j < 2; j++)
        CHECK(same_rollout(res_find(got, id2, j), res_find(ref, ref->r[0].req_id, j), why, sizeof why),
              "after the weights came back, sample %d: %s", j, why);
    /* A model of another shape is refused and leaves the weights serving. */
    snprintf(path, sizeof path, "%s/tiny-q4_k.gguf", testdata());
    if (rd_read_weights(&tiny, path, 0, &fresh) == 0) {
        CHECK(model_adopt(m, fresh) == RD_EINVAL, "weights of another shape were adopted");
        model_free(fresh);
    }
    eng_destroy(e);
    res_free(ref);
    res_free(got);
}

int main(void)
{
    ensure_testdata();
    tiny_ok = load_tiny("tiny-q4_1", &tiny);
    tiny32_ok = load_tiny("tiny-f32", &tiny32);
    untied_ok = load_tiny("tiny-untied", &untied);

    RUN(test_paged_attention_reference);
    RUN(test_chunked_prefill_bitwise);
    RUN(test_preemption);
    RUN(test_batch_invariance_tiny);
    RUN(test_batch_invariance_edits);
    RUN(test_rescoring_exact);
    RUN(test_batch_invariance_families);
    RUN(test_groups);
    RUN(test_bad_input);
    RUN(test_abort);
    RUN(test_stop_conditions);
    RUN(test_prefix_cache);
    RUN(test_progress_pause_flush);
    RUN(test_retract_release);

    if (tiny_ok) rd_unload(&tiny);
    if (tiny32_ok) rd_unload(&tiny32);
    if (untied_ok) rd_unload(&untied);

    if (!strcmp(test_backend(), "cuda-emu")) {
        printf("SKIP test_batch_invariance_real: the 135M model is too slow on the CUDA emulator\n");
#if defined(__SANITIZE_ADDRESS__)
    } else if (1) {
        /* 41 s of the suite under ASan; the tiny models above take every code path it does there,
         * and the plain build runs it. */
        printf("SKIP test_batch_invariance_real: under ASan (the plain build runs it)\n");
#endif
    } else if (file_exists(real_model_path())) {
        real_ok = rd_load(real_model_path(), test_backend(), test_threads(0), &real) == 0;
        RUN(test_batch_invariance_real);
        if (real_ok)
            rd_unload(&real);
    } else {
        printf("SKIP test_batch_invariance_real: %s not found (make model)\n", real_model_path());
    }
    TEST_EXIT();
}
