/* test_spec.c - speculative decoding's exactness base.
 *
 * The verify forward (engine/serve/spec_verify.h) runs k drafted tokens of a
 * sequence in one forward against the paged KV; its logits at each of the k
 * positions must equal, bit for bit (memcmp), those of k single-token decode
 * steps, which this file builds by hand as one-row rd_steps through
 * runner_forward (the engine's decode). Checked for k = 1..8 at contexts that
 * put the k rows across KV block boundaries (block size 16, and 5 on one
 * tiny model), on tiny models of three families (Gemma 3's sliding window
 * included) and on the default model ($RD_MODEL, skipped when absent; not on
 * the CUDA emulator, too slow there). Before every verify pass, a pass of
 * random "rejected" drafts writes garbage K/V into the same slots: a verify
 * that read a slot past its row's position, or one the rollback left stale,
 * would differ. The cache starts as NaN, so a read of a slot nobody wrote
 * shows too. A second sequence with its own blocks verifies in the same step
 * (the rows of two sequences in one forward: a batch, as the scheduler will
 * make it).
 *
 * The comparison is of one code path against another that the determinism
 * contract (DESIGN.md) says must agree; test_engine.c checks the forward
 * pass itself against a double-precision reference. */
#include <math.h>
#include <stdint.h>

#include "base/err.h"
#include "engine/model/loader.h"
#include "engine/model/runner.h"
#include "engine/serve/engine.h"
#include "engine/serve/kv.h"
#include "engine/serve/spec_ngram.h"
#include "engine/serve/spec_plan.h"
#include "engine/serve/spec_verify.h"
#include "tests/unit/engine_helpers.h"
#include "tests/unit/test.h"

#ifndef RD_TEST_BACKEND_DEFAULT
#define RD_TEST_BACKEND_DEFAULT "cpu"
#endif
static const char *test_backend(void)
{
    const char *b = getenv("RD_TEST_BACKEND");
    return b && *b ? b : RD_TEST_BACKEND_DEFAULT;
}

#define KMAX 8

/* Deterministic token ids in [0, hi). */
static void make_tokens(int32_t *p, int32_t n, uint64_t salt, int32_t hi)
{
    uint64_t x = 0x9E3779B97F4A7C15ull * (salt + 1) + 12345;
    for (int32_t i = 0; i < n; i++) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        p[i] = (int32_t)((x >> 33) % (uint64_t)hi);
    }
}

/* Every layer's K and V cache to all-ones bits (NaN in f32 and bf16). */
static void poison_cache(runner *r)
{
    const model_config *c = &r->m->cfg;
    size_t n = (size_t)r->n_blocks * c->n_kv_heads * r->attn.block_size * c->head_dim;
    n *= (size_t)rd_backend_kv_elem_bytes(r->be);
    unsigned char *buf = malloc(n);
    if (!buf)
        return;
    memset(buf, 0xff, n);
    for (int32_t l = 0; l < c->n_layers; l++) {
        r->be->ops->h2d(r->be, r->k_cache[l], buf, n);
        r->be->ops->h2d(r->be, r->v_cache[l], buf, n);
    }
    r->be->ops->sync(r->be);
    free(buf);
}

/* The engine's decode or prefill, built by hand: tokens [from, to) of one
 * sequence in one step; logits of the last row into out (NULL: none). */
static int plain_step(runner *r, const int32_t *tokens, const int32_t *table, int32_t n_blocks, int32_t from,
                      int32_t to, float *out)
{
    const int32_t bs = r->attn.block_size, M = to - from;
    int32_t *pos = malloc(sizeof(int32_t) * M), *slot = malloc(sizeof(int32_t) * M);
    int rc = RD_ENOMEM;
    if (pos && slot) {
        for (int32_t i = 0; i < M; i++) {
            pos[i] = from + i;
            slot[i] = table[(from + i) / bs] * bs + (from + i) % bs;
        }
        int32_t qs[2] = {0, M}, ctx = to, last = M - 1;
        rd_step s = {.n_rows = M, .n_seqs = 1, .max_blocks = n_blocks, .token_ids = tokens + from,
                     .positions = pos, .slots = slot, .q_start = qs, .ctx_len = &ctx, .block_tables = table};
        rc = runner_forward(r, &s, &last, out ? 1 : 0, out);
    }
    free(pos), free(slot);
    return rc;
}

/* A scrambled permutation of 0..n-1 (block ids far from their order). */
static void scramble(int32_t *perm, int32_t n, uint64_t seed)
{
    for (int32_t i = 0; i < n; i++)
        perm[i] = i;
    uint64_t x = seed;
    for (int32_t i = n - 1; i > 0; i--) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        int32_t j = (int32_t)((x >> 33) % (uint64_t)(i + 1)), t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
    }
}

/* Verify vs decode on model m, block size bs, at each context length in
 * ctxs[]. Fills why and returns 0 on the first difference. */
static int verify_vs_decode(model *m, int32_t bs, const int32_t *ctxs, int n_ctxs, char *why, size_t cap)
{
    const int32_t V = m->cfg.vocab;
    int32_t max_ctx = 0;
    for (int i = 0; i < n_ctxs; i++)
        max_ctx = ctxs[i] > max_ctx ? ctxs[i] : max_ctx;
    const int32_t per_seq = (max_ctx + KMAX + bs - 1) / bs, n_blocks = 2 * per_seq + 3;
    int32_t *perm = malloc(sizeof(int32_t) * n_blocks);
    int32_t *tokens = malloc(sizeof(int32_t) * (max_ctx + KMAX)), junk[KMAX];
    float *ref = malloc(sizeof(float) * KMAX * V), *got = malloc(sizeof(float) * 2 * KMAX * V);
    runner r;
    int ok = 0, rc = perm && tokens && ref && got ? runner_init(&r, m, n_blocks, bs, max_ctx + 2 * KMAX, 2 * KMAX)
                                                  : RD_ENOMEM;
    if (rc) {
        snprintf(why, cap, "setup: %s", rd_errmsg());
        goto out;
    }
    scramble(perm, n_blocks, 77 + bs);
    const int32_t *tab_a = perm, *tab_b = perm + per_seq;
    for (int ci = 0; ci < n_ctxs; ci++) {
        const int32_t L = ctxs[ci];
        make_tokens(tokens, L + KMAX, 1000 + L, V);
        poison_cache(&r);
        /* The reference: the context prefilled in one step (no logits), then
         * KMAX decode steps of one token each. */
        rc = L > 0 ? plain_step(&r, tokens, tab_a, per_seq, 0, L, NULL) : 0;
        for (int32_t j = 0; j < KMAX && !rc; j++)
            rc = plain_step(&r, tokens, tab_a, per_seq, L + j, L + j + 1, ref + (size_t)j * V);
        for (int32_t k = 1; k <= KMAX && !rc; k++) {
            /* Rejected drafts first: garbage K/V in the slots the verify writes. */
            make_tokens(junk, KMAX, 5000 + 31 * L + k, V);
            spec_verify_seq bad = {junk, L, KMAX, tab_a, per_seq};
            rc = spec_verify_forward(&r, &bad, 1, got);
            spec_verify_seq v = {tokens + L, L, k, tab_a, per_seq};
            if (!rc)
                rc = spec_verify_forward(&r, &v, 1, got);
            if (rc)
                break;
            for (int32_t j = 0; j < k; j++)
                if (memcmp(got + (size_t)j * V, ref + (size_t)j * V, sizeof(float) * V)) {
                    int32_t t = 0;
                    while (!memcmp(&got[(size_t)j * V + t], &ref[(size_t)j * V + t], sizeof(float)))
                        t++;
                    snprintf(why, cap, "block size %d, context %d, k = %d: row %d (position %d) differs from "
                             "its decode step at token %d: %.9g vs %.9g", bs, L, k, j, L + j, t,
                             got[(size_t)j * V + t], ref[(size_t)j * V + t]);
                    goto out;
                }
        }
        /* Two sequences in one verify step: A (its KV as above) verifies
         * KMAX rows, B (the same context in other blocks) 5. */
        if (!rc && L > 0)
            rc = plain_step(&r, tokens, tab_b, per_seq, 0, L, NULL);
        if (!rc) {
            spec_verify_seq both[2] = {{tokens + L, L, KMAX, tab_a, per_seq}, {tokens + L, L, 5, tab_b, per_seq}};
            rc = spec_verify_forward(&r, both, 2, got);
        }
        if (rc)
            break;
        if (memcmp(got, ref, sizeof(float) * KMAX * V) || memcmp(got + (size_t)KMAX * V, ref, sizeof(float) * 5 * V)) {
            snprintf(why, cap, "block size %d, context %d: a two-sequence verify step differs from decode", bs, L);
            goto out;
        }
    }
    if (rc)
        snprintf(why, cap, "forward failed: %d (%s)", rc, rd_errmsg());
    ok = rc == 0;
out:
    if (perm && tokens && ref && got && r.be)
        runner_free(&r);
    free(perm), free(tokens), free(ref), free(got);
    return ok;
}

/* ---------------------------------------------------------------------------
 * The n-gram drafter against a search written another way: for each match
 * length from the longest down, every window of the sources compared whole
 * (memcmp) with the suffix; the first length with any hit wins, then the
 * longest continuation, own tokens before siblings, the latest end. */

static int32_t naive_draft(const spec_draft_ctx *c, int32_t lo, int32_t hi, int32_t max_draft, int32_t *out)
{
    const spec_tokens *self = &c->self;
    for (int32_t m = hi; m >= lo; m--) {
        if (m > self->n)
            continue;
        const int32_t *suffix = self->ids + self->n - m;
        int32_t best_cont = 0, best_end = -1;
        const int32_t *best_src = NULL;
        for (int32_t r = 0; r <= c->n_siblings; r++) {
            const spec_tokens *src = r == 0 ? self : &c->siblings[r - 1];
            /* a window src[i .. i+m) followed by at least one token (in self: before the suffix's end) */
            for (int32_t i = 0; i + m < src->n; i++) {
                if (memcmp(src->ids + i, suffix, sizeof(int32_t) * m))
                    continue;
                int32_t end = i + m - 1, cont = src->n - 1 - end;
                cont = cont < max_draft ? cont : max_draft;
                /* later r only wins on a strictly longer continuation; the same r on >= (later end) */
                int take = best_src == NULL || cont > best_cont || (cont == best_cont && src->ids == best_src);
                if (take) {
                    best_cont = cont;
                    best_end = end;
                    best_src = src->ids;
                }
            }
        }
        if (best_src) {
            memcpy(out, best_src + best_end + 1, sizeof(int32_t) * best_cont);
            return best_cont;
        }
    }
    return 0;
}

static void test_ngram_hand(void)
{
    spec_drafter *d;
    spec_ngram_params p = spec_ngram_default();
    CHECK_OK(spec_ngram_create(&p, &d));
    int32_t out[8];
    /* 1 2 3 4 1 2 3: the suffix "1 2 3" occurred at 0..2, followed by 4 1 2 3 */
    const int32_t a[] = {1, 2, 3, 4, 1, 2, 3};
    spec_draft_ctx c = {{a, 7}, 3, NULL, 0};
    int32_t n = d->draft(d, &c, 4, out);
    int ok1 = n == 4 && out[0] == 4 && out[1] == 1 && out[2] == 2 && out[3] == 3;
    int32_t n_cap = d->draft(d, &c, 2, out);
    /* no earlier "9 7" nor a 1-token match (min_match 2): nothing */
    const int32_t b[] = {5, 6, 7, 9, 7};
    spec_draft_ctx cb = {{b, 5}, 2, NULL, 0};
    int32_t n_none = d->draft(d, &cb, 4, out);
    /* a sibling that went on further after the same words: 3 4 -> 8 8 8 from it */
    const int32_t me[] = {1, 3, 4, 2, 3, 4}, sib[] = {1, 3, 4, 8, 8, 8, 3, 4, 9};
    spec_tokens sibs[1] = {{sib, 9}};
    spec_draft_ctx cs = {{me, 6}, 1, sibs, 1};
    int32_t n_sib = d->draft(d, &cs, 3, out);
    int ok_sib = n_sib == 3 && out[0] == 2 && out[1] == 3 && out[2] == 4; /* own "3 4" at 1..2 offers 3: own wins */
    int32_t n_sib4 = d->draft(d, &cs, 4, out); /* own offers 3 (2 3 4), the sibling's first offers 6: its wins */
    int ok_sib4 = n_sib4 == 4 && out[0] == 8 && out[1] == 8 && out[2] == 8 && out[3] == 3;
    d->destroy(d);
    spec_ngram_params bad = {3, 2};
    int rc_bad = spec_ngram_create(&bad, &d);
    CHECK(ok1, "1 2 3 4 1 2 3: got %d tokens (%d %d ..)", n, out[0], out[1]);
    CHECK(n_cap == 2, "max_draft 2 gave %d", n_cap);
    CHECK(n_none == 0, "no match, got %d", n_none);
    CHECK(ok_sib && ok_sib4, "sibling cases: %d (own first), %d", n_sib, n_sib4);
    CHECK(rc_bad == RD_EINVAL, "min 3 > max 2 accepted: %d", rc_bad);
}

static void test_ngram_random(void)
{
    uint64_t x = 99;
#define RND(n) ((x = x * 6364136223846793005ull + 1442695040888963407ull), (int32_t)((x >> 33) % (uint64_t)(n)))
    int32_t self[64], sib[3][104], got[16], want[16]; /* n <= 60; a sibling: prompt <= 60 + 39 */
    int drafted = 0, from_sibling = 0;
    for (int it = 0; it < 3000; it++) {
        const int32_t vocab = 2 + RND(4), n = 1 + RND(60), n_sib = RND(4);
        spec_ngram_params p = {1 + RND(3), 0};
        p.max_match = p.min_match + RND(6);
        const int32_t max_draft = 1 + RND(10);
        for (int32_t i = 0; i < n; i++)
            self[i] = RND(vocab);
        spec_tokens sibs[3];
        const int32_t n_prompt = RND(n + 1);
        for (int32_t k = 0; k < n_sib; k++) {
            int32_t m = n_prompt + RND(40);
            memcpy(sib[k], self, sizeof(int32_t) * n_prompt); /* the same prompt, another output */
            for (int32_t i = n_prompt; i < m; i++)
                sib[k][i] = RND(vocab);
            sibs[k] = (spec_tokens){sib[k], m};
        }
        spec_draft_ctx c = {{self, n}, n_prompt, sibs, n_sib};
        spec_drafter *d;
        CHECK_OK(spec_ngram_create(&p, &d));
        int32_t ng = d->draft(d, &c, max_draft, got);
        d->destroy(d);
        int32_t nw = naive_draft(&c, p.min_match, p.max_match, max_draft, want);
        CHECK(ng == nw && !memcmp(got, want, sizeof(int32_t) * (ng > 0 ? ng : 0)),
              "case %d (n %d, siblings %d, match %d..%d, max_draft %d): drafter gave %d tokens, the naive search %d",
              it, n, n_sib, p.min_match, p.max_match, max_draft, ng, nw);
        drafted += ng > 0;
        c.n_siblings = 0;
        from_sibling += ng > 0 && naive_draft(&c, p.min_match, p.max_match, max_draft, want) != ng;
    }
#undef RND
    /* The cases must exercise both sources, not only "no match". */
    CHECK(drafted > 1000 && from_sibling > 100, "only %d drafts, %d changed by siblings", drafted, from_sibling);
}

static int load_model(const char *path, rd_loaded *l)
{
    int rc = rd_load(path, test_backend(), test_threads(0), l);
    if (rc)
        fprintf(stderr, "test_spec: cannot load %s: %s\n", path, rd_errmsg());
    return rc == 0;
}

/* ---------------------------------------------------------------------------
 * The engine with speculation on vs off: every sample's token ids, raw and
 * processed log-probs, alternatives, finish reason, stop string and version
 * spans bit-identical. The run with it on must have drafted, accepted some
 * drafts and rejected others (else it proved nothing), and give back every
 * KV block. */

#define SPEC_MAX_REQ 16
#define SPEC_MAX_RES 128

typedef struct {
    int n;
    eng_result r[SPEC_MAX_RES];
    eng_stats st;
} spec_run;

static void spec_run_free(spec_run *r)
{
    for (int i = 0; i < r->n; i++)
        eng_result_free(&r->r[i]);
    r->n = 0;
}

/* All requests queued at once (arrive_every 0) or one every arrive_every steps. */
static int run_engine(model *m, const eng_config *cfg, const eng_request *reqs, int n_req, int arrive_every,
                      spec_run *out)
{
    engine *e;
    int rc = eng_create(m, cfg, &e);
    if (rc)
        return rc;
    int added = 0;
    for (long step = 0; !rc && (added < n_req || eng_busy(e)); step++) {
        while (added < n_req && (arrive_every == 0 || step % arrive_every == 0)) {
            int64_t id;
            if ((rc = eng_add(e, &reqs[added++], &id)))
                break;
            if (arrive_every)
                break;
        }
        if (!rc && step > 400000)
            rc = rd_fail(RD_EINVAL, "run_engine: no end after %ld steps", step);
        if (!rc && (rc = eng_step(e)) > 0)
            rc = 0;
        int k;
        while (!rc && out->n < SPEC_MAX_RES && (k = eng_collect(e, out->r + out->n, SPEC_MAX_RES - out->n)) > 0)
            out->n += k;
    }
    eng_get_stats(e, &out->st);
    eng_destroy(e);
    if (!rc && out->st.kv_blocks_used != 0)
        rc = rd_fail(RD_EINVAL, "run_engine: %d KV blocks still used after the run", out->st.kv_blocks_used);
    return rc;
}

static const eng_result *find_res(const spec_run *s, int64_t req, int32_t sample)
{
    for (int i = 0; i < s->n; i++)
        if (s->r[i].req_id == req && s->r[i].sample_idx == sample)
            return &s->r[i];
    return NULL;
}

static int same_result(const eng_result *a, const eng_result *b, char *why, size_t cap)
{
    const int32_t n = a->n_tokens;
    if (a->n_tokens != b->n_tokens || a->finish != b->finish || a->stop_str != b->stop_str ||
        a->stop_text_offset != b->stop_text_offset) {
        snprintf(why, cap, "n_tokens %d vs %d, finish %d vs %d, stop_str %d vs %d", a->n_tokens, b->n_tokens,
                 a->finish, b->finish, a->stop_str, b->stop_str);
        return 0;
    }
    for (int32_t i = 0; i < n; i++)
        if (a->token_ids[i] != b->token_ids[i] || memcmp(&a->logprobs[i], &b->logprobs[i], sizeof(float)) ||
            (!a->logprobs_proc) != (!b->logprobs_proc) ||
            (a->logprobs_proc && memcmp(&a->logprobs_proc[i], &b->logprobs_proc[i], sizeof(float)))) {
            snprintf(why, cap, "token %d: id %d vs %d, logprob %.9g vs %.9g", i, a->token_ids[i], b->token_ids[i],
                     a->logprobs[i], b->logprobs[i]);
            return 0;
        }
    if (a->n_top != b->n_top ||
        (n > 0 && a->n_top > 0 && (memcmp(a->top_ids, b->top_ids, sizeof(int32_t) * n * a->n_top) ||
                                   memcmp(a->top_logprobs, b->top_logprobs, sizeof(float) * n * a->n_top)))) {
        snprintf(why, cap, "alternatives differ");
        return 0;
    }
    if (a->n_spans != b->n_spans || (a->n_spans > 0 && memcmp(a->spans, b->spans, sizeof(eng_span) * a->n_spans))) {
        snprintf(why, cap, "version spans differ (%d vs %d)", a->n_spans, b->n_spans);
        return 0;
    }
    return 1;
}

static int64_t spec_preemptions; /* in the runs with speculation on, summed */

/* Runs reqs with spec_max_draft 0 and draft, under cfg; compares. */
static int on_vs_off(model *m, eng_config cfg, const eng_request *reqs, int n_req, int arrive_every, int32_t draft,
                     int64_t *drafted, int64_t *accepted, char *why, size_t cap)
{
    spec_run *off = calloc(1, sizeof *off), *on = calloc(1, sizeof *on);
    int ok = 0;
    if (!off || !on) {
        snprintf(why, cap, "out of memory");
        goto out;
    }
    cfg.spec_max_draft = 0;
    int rc = run_engine(m, &cfg, reqs, n_req, arrive_every, off);
    cfg.spec_max_draft = draft;
    if (!rc)
        rc = run_engine(m, &cfg, reqs, n_req, arrive_every, on);
    if (rc) {
        snprintf(why, cap, "engine run failed: %d (%s)", rc, rd_errmsg());
        goto out;
    }
    if (off->n != on->n) {
        snprintf(why, cap, "%d results off, %d on", off->n, on->n);
        goto out;
    }
    for (int i = 0; i < off->n; i++) {
        const eng_result *a = &off->r[i], *b = find_res(on, a->req_id, a->sample_idx);
        char w[200];
        if (!b || !same_result(a, b, w, sizeof w)) {
            snprintf(why, cap, "request %lld sample %d: %s", (long long)a->req_id, a->sample_idx, b ? w : "missing");
            goto out;
        }
    }
    if (off->st.spec_drafted != 0) {
        snprintf(why, cap, "drafted %lld tokens with speculation off", (long long)off->st.spec_drafted);
        goto out;
    }
    /* The per-sample tallies add up to the engine's, and are 0 without speculation. */
    int64_t sum_d = 0, sum_a = 0, off_any = 0;
    for (int i = 0; i < on->n; i++) {
        const eng_result *b = &on->r[i];
        sum_d += b->spec_drafted;
        sum_a += b->spec_accepted;
        if (b->spec_accepted > b->spec_drafted || b->spec_accepted > b->n_tokens ||
            (b->n_tokens > 1 && b->finish != FINISH_ABORT && b->spec_steps < 1) || b->spec_steps > b->n_tokens) {
            snprintf(why, cap, "request %lld sample %d: drafted %d accepted %d steps %d for %d tokens",
                     (long long)b->req_id, b->sample_idx, b->spec_drafted, b->spec_accepted, b->spec_steps,
                     b->n_tokens);
            goto out;
        }
    }
    for (int i = 0; i < off->n; i++)
        off_any |= off->r[i].spec_drafted | off->r[i].spec_accepted | off->r[i].spec_steps;
    if (sum_d != on->st.spec_drafted || sum_a != on->st.spec_accepted || off_any) {
        snprintf(why, cap, "per-sample tallies: drafted %lld accepted %lld, engine %lld %lld; off nonzero %lld",
                 (long long)sum_d, (long long)sum_a, (long long)on->st.spec_drafted, (long long)on->st.spec_accepted,
                 (long long)off_any);
        goto out;
    }
    spec_preemptions += on->st.preemptions;
    *drafted += on->st.spec_drafted;
    *accepted += on->st.spec_accepted;
    ok = 1;
out:
    if (off)
        spec_run_free(off);
    if (on)
        spec_run_free(on);
    free(off), free(on);
    return ok;
}

/* A prompt that repeats itself: a block of `period` tokens, again and again. */
static void repeating_prompt(int32_t *p, int32_t n, int32_t period, uint64_t salt, int32_t vocab)
{
    make_tokens(p, period, salt, vocab);
    for (int32_t i = period; i < n; i++)
        p[i] = p[i - period];
}

static void test_engine_on_off_tiny(void)
{
    char path[256], why[400] = "";
    snprintf(path, sizeof path, "%s/tiny-q4_1.gguf", testdata());
    rd_loaded l;
    CHECK(load_model(path, &l), "cannot load %s", path);
    model *m = l.m;
    const int32_t V = m->cfg.vocab;
    static int32_t prompts[8][48];
    eng_request reqs[8];
    const float temps[8] = {0, 1, 0.7f, 1, 0, 1.3f, 1, 0};
    for (int i = 0; i < 8; i++) {
        repeating_prompt(prompts[i], 48, 3 + i, 40 + i, V);
        eng_request r;
        memset(&r, 0, sizeof r);
        r.prompt = prompts[i];
        r.n_prompt = 20 + 3 * i;
        r.n = i == 1 || i == 4 ? 4 : 1;               /* groups: drafts from siblings too */
        r.max_tokens = 17 + 11 * i;                     /* ends at many offsets inside a draft */
        r.sp = samp_default();
        r.sp.temperature = temps[i];
        r.sp.seed = 1000 + i;
        r.sp.top_p = i == 2 ? 0.9f : 1.0f;
        r.sp.top_k = i == 3 ? 20 : 0;
        r.sp.min_p = i == 5 ? 0.05f : 0.0f;
        r.sp.logprobs_topk = i % 3 == 0 ? 3 : 0;
        r.sp.processed_logprobs = i % 2;
        r.ignore_eos = 1;
        reqs[i] = r;
    }
    /* Logit edits (issue 44): a draft position must get the penalties a plain decode step would, its
       earlier drafts counted as generated, and a preempted sample its counts back from its tokens. */
    reqs[0].sp.repetition_penalty = 1.2f, reqs[0].sp.frequency_penalty = 0.3f;
    reqs[1].sp.presence_penalty = 0.5f, reqs[1].min_tokens = 5;
    const int32_t bias_ids[2] = {5, 9};
    const float bias_vals[2] = {2.0f, -1.0f};
    reqs[2].n_bias = 2, reqs[2].bias_ids = bias_ids, reqs[2].bias_vals = bias_vals;
    reqs[7].sp.repetition_penalty = 0.9f, reqs[7].sp.presence_penalty = -0.3f;
    /* A stop id inside the outputs: token 7 (the tiny vocabulary is small, so it comes up). */
    int32_t stop_ids[1] = {7};
    reqs[6].stop_ids = stop_ids;
    reqs[6].n_stop = 1;
    /* and in a group: its samples end at different steps, the finished ones' outputs draft for the rest */
    reqs[1].stop_ids = stop_ids;
    reqs[1].n_stop = 1;
    int64_t drafted = 0, accepted = 0;
    eng_config cfg = eng_default_config();
    cfg.block_size = 16;
    cfg.max_num_seqs = 32;
    cfg.max_batch_tokens = 256;
    cfg.kv_cache_bytes = 256 * model_kv_bytes_per_token(&m->cfg) / 4 * rd_backend_kv_elem_bytes(m->be) * 16;
    /* Drafts sized by spec_len alone: how many the step times allow depends on the machine's load, and these
       runs must draft to test anything. The preemption run below sizes them by the step times. */
    cfg.spec_fixed = 1;
    int ok = 1;
    const int32_t drafts[3] = {1, 4, 8};
    /* The emulator runs every CUDA thread on the CPU: one draft length there. */
    const int emu = !strcmp(test_backend(), "cuda-emu");
    const int n_req = emu ? 3 : 8; /* the emulator: requests 0-2 only, shorter */
    if (emu)
        for (int i = 0; i < n_req; i++)
            reqs[i].max_tokens = 12 + 5 * i;
    for (int d = emu ? 1 : 0; d < (emu ? 2 : 3) && ok; d++) {
        /* all at once, prefix cache on (the default) */
        ok = on_vs_off(m, cfg, reqs, n_req, 0, drafts[d], &drafted, &accepted, why, sizeof why);
        /* one arriving every 5 steps: speculation only in the gaps */
        if (ok && !emu)
            ok = on_vs_off(m, cfg, reqs, 8, 5, drafts[d], &drafted, &accepted, why, sizeof why);
    }
    /* A pool of 12 blocks: preemption (recompute) while drafting */
    eng_config small = cfg;
    small.kv_cache_bytes = 12 * model_kv_bytes_per_token(&m->cfg) / 4 * rd_backend_kv_elem_bytes(m->be) * 16;
    small.prefix_cache = 0;
    small.spec_fixed = 0;
    spec_preemptions = 0;
    if (ok)
        ok = on_vs_off(m, small, reqs, n_req, 0, 6, &drafted, &accepted, why, sizeof why);
    rd_unload(&l);
    CHECK(!ok || emu || spec_preemptions > 0, "the 12-block pool preempted nothing");
    CHECK(ok, "%s", why);
    CHECK(accepted > (emu ? 5 : 50) && drafted > accepted, "drafted %lld, accepted %lld: speculation was not exercised",
          (long long)drafted, (long long)accepted);
    printf("test_engine_on_off_tiny: drafted %lld, accepted %lld\n", (long long)drafted, (long long)accepted);
}

/* kv_truncate gives back the blocks past the kept tokens, last first. */
static void test_kv_truncate(void)
{
    kv_pool *p;
    CHECK_OK(kv_create(8, 16, &p));
    kv_table t = {0};
    int32_t src, dst;
    int rc = kv_reserve(p, &t, 0, 40, &src, &dst); /* 3 blocks */
    kv_written(p, &t, 0, 40);
    kv_stats a, b, c, d;
    kv_get_stats(p, &a);
    kv_truncate(p, &t, 17);
    kv_get_stats(p, &b);
    kv_truncate(p, &t, 16);
    kv_get_stats(p, &c);
    kv_truncate(p, &t, 0);
    kv_get_stats(p, &d);
    kv_free_seq(p, &t);
    kv_destroy(p);
    CHECK(rc == 0, "reserve: %d", rc);
    CHECK(a.blocks_used == 3 && b.blocks_used == 2 && c.blocks_used == 1 && d.blocks_used == 0,
          "blocks used %d -> %d -> %d -> %d (want 3 2 1 0)", a.blocks_used, b.blocks_used, c.blocks_used,
          d.blocks_used);
    /* 17 tokens in 2 blocks of 16: 15 slots empty */
    CHECK(fabs(b.waste - 15.0 / 32) < 1e-12, "waste after keeping 17 tokens: %g", b.waste);
}

/* The same on Gemma 3 (sliding window 8: drafts cross it) and Qwen3 (q/k norms), smaller. */
static void families_case(const char *name)
{
    char path[256], why[400] = "";
    snprintf(path, sizeof path, "%s/%s.gguf", testdata(), name);
    rd_loaded l;
    CHECK(load_model(path, &l), "cannot load %s", path);
    model *m = l.m;
    static int32_t prompts[4][40];
    eng_request reqs[4];
    for (int i = 0; i < 4; i++) {
        repeating_prompt(prompts[i], 40, 4 + i, 70 + i, m->cfg.vocab);
        eng_request r;
        memset(&r, 0, sizeof r);
        r.prompt = prompts[i];
        r.n_prompt = 24 + 4 * i;
        r.n = i == 1 ? 3 : 1;
        r.max_tokens = 30 + 9 * i;
        r.sp = samp_default();
        r.sp.temperature = i == 0 ? 0.0f : 1.0f;
        r.sp.seed = 500 + i;
        r.sp.top_p = i == 2 ? 0.9f : 1.0f;
        r.sp.processed_logprobs = 1;
        r.ignore_eos = 1;
        reqs[i] = r;
    }
    eng_config cfg = eng_default_config();
    cfg.max_num_seqs = 16;
    cfg.max_batch_tokens = 128;
    cfg.kv_cache_bytes = 64 * model_kv_bytes_per_token(&m->cfg) / 4 * rd_backend_kv_elem_bytes(m->be) * 16;
    cfg.spec_fixed = 1; /* drafts by spec_len: the step times could leave none to test */
    int64_t drafted = 0, accepted = 0;
    int ok = on_vs_off(m, cfg, reqs, 4, 0, 5, &drafted, &accepted, why, sizeof why);
    rd_unload(&l);
    CHECK(ok, "%s: %s", name, why);
    CHECK(accepted > 5 && drafted > accepted, "%s: drafted %lld, accepted %lld", name, (long long)drafted,
          (long long)accepted);
}

static void test_engine_on_off_families(void)
{
    families_case("tiny-gemma3");
    if (!test_case_failed)
        families_case("tiny-qwen3");
}

/* An abort between two verify steps: the partial sample is a prefix of the
 * full one without speculation (ids and log-prob bits), and the blocks all
 * come back. */
static void test_engine_abort_mid_draft(void)
{
    char path[256];
    snprintf(path, sizeof path, "%s/tiny-q4_1.gguf", testdata());
    rd_loaded l;
    CHECK(load_model(path, &l), "cannot load %s", path);
    model *m = l.m;
    static int32_t prompt[30];
    repeating_prompt(prompt, 30, 5, 9, m->cfg.vocab);
    eng_request r;
    memset(&r, 0, sizeof r);
    r.prompt = prompt;
    r.n_prompt = 30;
    r.n = 2;
    r.max_tokens = 120;
    r.sp = samp_default();
    r.sp.temperature = 0.0f;
    r.ignore_eos = 1;
    eng_config cfg = eng_default_config();
    cfg.max_num_seqs = 8;
    cfg.max_batch_tokens = 128;
    cfg.kv_cache_bytes = 64 * model_kv_bytes_per_token(&m->cfg) / 4 * rd_backend_kv_elem_bytes(m->be) * 16;
    cfg.spec_fixed = 1; /* drafts by spec_len: the step times could leave none to test */
    spec_run *full = calloc(1, sizeof *full);
    int rc = full ? run_engine(m, &cfg, &r, 1, 0, full) : RD_ENOMEM;
    cfg.spec_max_draft = 8;
    engine *e = NULL;
    if (!rc)
        rc = eng_create(m, &cfg, &e);
    int64_t id = 0;
    if (!rc)
        rc = eng_add(e, &r, &id);
    for (int i = 0; i < 12 && rc >= 0; i++)
        rc = eng_step(e);
    eng_stats st = {0};
    if (rc >= 0) {
        eng_get_stats(e, &st);
        rc = eng_abort(e, id);
    }
    eng_result part[2];
    int got = rc == 0 ? eng_collect(e, part, 2) : 0;
    eng_stats after = {0};
    if (e)
        eng_get_stats(e, &after);
    int prefix_ok = got == 2;
    for (int k = 0; k < got; k++) {
        const eng_result *f = find_res(full, part[k].req_id, part[k].sample_idx);
        prefix_ok &= f && part[k].finish == FINISH_ABORT && part[k].n_tokens > 0 && part[k].n_tokens < f->n_tokens &&
                     !memcmp(part[k].token_ids, f->token_ids, sizeof(int32_t) * part[k].n_tokens) &&
                     !memcmp(part[k].logprobs, f->logprobs, sizeof(float) * part[k].n_tokens);
    }
    for (int k = 0; k < got; k++)
        eng_result_free(&part[k]);
    if (e)
        eng_destroy(e);
    if (full)
        spec_run_free(full);
    free(full);
    rd_unload(&l);
    CHECK(rc == 0, "run: %d (%s)", rc, rd_errmsg());
    CHECK(st.spec_accepted > 0, "no draft was accepted before the abort (drafted %lld)", (long long)st.spec_drafted);
    CHECK(prefix_ok, "the aborted samples (%d) are not prefixes of the run without speculation", got);
    CHECK(after.kv_blocks_used == 0, "%d blocks still used after the abort", after.kv_blocks_used);
}

/* A version change between two verify steps (what a weight swap does to the
 * engine; the swap itself is upd_apply between steps): tokens drawn before it
 * carry the old version and those after it the new one, the boundary where
 * the sample stood when it came (eng_collect_progress says where), never
 * inside a step's accepted drafts; ids and log-prob bits equal to the run
 * without speculation and without the change. */
static void test_engine_version_between_steps(void)
{
    char path[256];
    snprintf(path, sizeof path, "%s/tiny-q4_1.gguf", testdata());
    rd_loaded l;
    CHECK(load_model(path, &l), "cannot load %s", path);
    model *m = l.m;
    static int32_t prompt[30];
    repeating_prompt(prompt, 30, 5, 9, m->cfg.vocab);
    eng_request r;
    memset(&r, 0, sizeof r);
    r.prompt = prompt;
    r.n_prompt = 30;
    r.n = 3;
    r.max_tokens = 90;
    r.sp = samp_default();
    r.sp.temperature = 0.9f;
    r.sp.seed = 31;
    r.ignore_eos = 1;
    eng_config cfg = eng_default_config();
    cfg.max_num_seqs = 8;
    cfg.max_batch_tokens = 128;
    cfg.kv_cache_bytes = 64 * model_kv_bytes_per_token(&m->cfg) / 4 * rd_backend_kv_elem_bytes(m->be) * 16;
    cfg.spec_fixed = 1; /* drafts by spec_len: the step times could leave none to test */
    spec_run *off = calloc(1, sizeof *off), *on = calloc(1, sizeof *on);
    int rc = off && on ? run_engine(m, &cfg, &r, 1, 0, off) : RD_ENOMEM;
    cfg.spec_max_draft = 8;
    engine *e = NULL;
    if (!rc)
        rc = eng_create(m, &cfg, &e);
    r.stream = 1;
    int64_t id = 0;
    if (!rc)
        rc = eng_add(e, &r, &id);
    int32_t at[3] = {0, 0, 0}; /* tokens each sample had at the change */
    eng_result prog[8];
    for (int i = 0; i < 15 && rc >= 0; i++) {
        rc = eng_step(e);
        int k = rc >= 0 ? eng_collect_progress(e, prog, 8) : 0;
        for (int j = 0; j < k; j++) {
            at[prog[j].sample_idx] = prog[j].token_offset + prog[j].n_tokens;
            eng_result_free(&prog[j]);
        }
    }
    eng_stats st = {0};
    if (rc >= 0) {
        eng_get_stats(e, &st);
        eng_set_version(e, 7);
        rc = 0;
    }
    while (rc == 0 && eng_busy(e)) {
        rc = eng_step(e) < 0 ? -1 : 0;
        int k;
        while ((k = eng_collect_progress(e, prog, 8)) > 0)
            for (int j = 0; j < k; j++)
                eng_result_free(&prog[j]);
        while (on->n < SPEC_MAX_RES && (k = eng_collect(e, on->r + on->n, SPEC_MAX_RES - on->n)) > 0)
            on->n += k;
    }
    int ok = rc == 0 && on->n == 3 && off->n == 3;
    char why[300] = "";
    for (int k = 0; ok && k < 3; k++) {
        const eng_result *a = find_res(off, id, k), *b = find_res(on, id, k);
        ok = a && b && a->n_tokens == b->n_tokens &&
             !memcmp(a->token_ids, b->token_ids, sizeof(int32_t) * a->n_tokens) &&
             !memcmp(a->logprobs, b->logprobs, sizeof(float) * a->n_tokens);
        if (!ok) {
            snprintf(why, sizeof why, "sample %d: tokens or log-probs differ from the run without speculation", k);
            break;
        }
        const int32_t c = at[k];
        ok = c > 0 && c < b->n_tokens && b->n_spans == 2 && b->spans[0].start == 0 && b->spans[0].end == c &&
             b->spans[0].version == 0 && b->spans[1].start == c && b->spans[1].end == b->n_tokens &&
             b->spans[1].version == 7;
        if (!ok)
            snprintf(why, sizeof why, "sample %d: %d spans, the first ending at %d, want 2 split at %d of %d", k,
                     b->n_spans, b->n_spans ? b->spans[0].end : -1, c, b->n_tokens);
    }
    if (e)
        eng_destroy(e);
    if (off)
        spec_run_free(off);
    if (on)
        spec_run_free(on);
    free(off), free(on);
    rd_unload(&l);
    CHECK(rc == 0, "run: %d (%s)", rc, rd_errmsg());
    CHECK(st.spec_accepted > 0, "no draft accepted before the change (drafted %lld)", (long long)st.spec_drafted);
    CHECK(ok, "%s", why);
}

static void tiny_case(const char *name, int32_t bs)
{
    char path[256], why[400] = "";
    snprintf(path, sizeof path, "%s/%s.gguf", testdata(), name);
    rd_loaded l;
    CHECK(load_model(path, &l), "cannot load %s (run tests/gen_testdata.sh %s)", path, testdata());
    /* Block size 16: 9 + 8 and 15 + 2 cross into the second block, 47 + 2 into
     * the fourth; 70 is past Gemma 3 tiny's window of 8. */
    const int32_t ctx16[] = {0, 1, 9, 15, 16, 31, 47, 70};
    const int32_t ctx5[] = {0, 3, 4, 5, 12, 23};
    /* The emulator runs every CUDA thread on the CPU: fewer contexts there. */
    const int emu = !strcmp(test_backend(), "cuda-emu");
    const int32_t emu16[] = {1, 15, 47}, emu5[] = {3, 12};
    int ok = bs == 16 ? verify_vs_decode(l.m, bs, emu ? emu16 : ctx16, emu ? 3 : 8, why, sizeof why)
                      : verify_vs_decode(l.m, bs, emu ? emu5 : ctx5, emu ? 2 : 6, why, sizeof why);
    rd_unload(&l);
    CHECK(ok, "%s: %s", name, why);
}

static void test_verify_tiny_llama(void)
{
    tiny_case("tiny-q4_1", 16);
    if (!test_case_failed)
        tiny_case("tiny-q4_1", 5);
}

static void test_verify_tiny_qwen3(void) { tiny_case("tiny-qwen3", 16); }

static void test_verify_tiny_gemma3(void) { tiny_case("tiny-gemma3", 16); }

static void test_verify_real(void)
{
    rd_loaded l;
    char why[400] = "";
    CHECK(load_model(real_model_path(), &l), "cannot load %s", real_model_path());
#ifdef __SANITIZE_ADDRESS__
    /* The ASan build runs the 135M model several times slower (two contexts took 83 s of the suite):
     * one context there, a prefill of 30 and a verify of 16 that cross a block; the tiny models run
     * the same code paths, and the plain build checks this model at four contexts. */
    const int32_t ctx[] = {30};
    const int n_ctx = 1;
#else
    const int32_t ctx[] = {1, 15, 30, 100};
    const int n_ctx = 4;
#endif
    int ok = verify_vs_decode(l.m, 16, ctx, n_ctx, why, sizeof why);
    rd_unload(&l);
    CHECK(ok, "%s: %s", real_model_path(), why);
}

/* Bad shapes get an error, not a forward. */
static void test_verify_bad_input(void)
{
    char path[256];
    snprintf(path, sizeof path, "%s/tiny-q4_1.gguf", testdata());
    rd_loaded l;
    CHECK(load_model(path, &l), "cannot load %s", path);
    runner r;
    int rc = runner_init(&r, l.m, 4, 16, 32, 8);
    if (rc)
        rd_unload(&l);
    CHECK_OK(rc);
    int32_t tok[16] = {0}, table[4] = {0, 1, 2, 3};
    spec_verify_seq short_table = {tok, 30, 4, table, 2};   /* 2 blocks of 16 < 34 tokens */
    spec_verify_seq too_many = {tok, 0, 9, table, 4};       /* 9 logit rows > 8 */
    spec_verify_seq no_rows = {tok, 0, 0, table, 4};
    int r1 = spec_verify_forward(&r, &short_table, 1, NULL);
    int r2 = spec_verify_forward(&r, &too_many, 1, NULL);
    int r3 = spec_verify_forward(&r, &no_rows, 1, NULL);
    int r4 = spec_verify_forward(&r, &no_rows, 0, NULL);
    runner_free(&r);
    rd_unload(&l);
    CHECK(r1 == RD_ERANGE && r2 == RD_ERANGE && r3 == RD_EINVAL && r4 == RD_EINVAL, "got %d %d %d %d", r1, r2, r3,
          r4);
}

/* spec_decode: the names parse, and each (mode, spec_max_draft) pair resolves
 * as engine.h says: auto follows spec_max_draft (old configs), off drafts
 * nothing whatever the length, ngram without a length drafts up to 6. */
static void test_spec_modes(void)
{
    eng_spec_mode m = ENG_SPEC_OFF;
    CHECK(eng_spec_mode_parse("ngram", &m) == 0 && m == ENG_SPEC_NGRAM, "ngram");
    CHECK(eng_spec_mode_parse("off", &m) == 0 && m == ENG_SPEC_OFF, "off");
    CHECK(eng_spec_mode_parse("auto", &m) == 0 && m == ENG_SPEC_AUTO, "auto");
    CHECK(eng_spec_mode_parse("NGRAM", &m) == RD_EINVAL && strstr(rd_errmsg(), "\"ngram\""), "%s", rd_errmsg());
    CHECK(eng_spec_mode_parse("", &m) == RD_EINVAL, "empty");
    char path[256];
    snprintf(path, sizeof path, "%s/tiny-q4_1.gguf", testdata());
    rd_loaded l;
    CHECK(load_model(path, &l), "cannot load %s", path);
    static int32_t prompt[40];
    repeating_prompt(prompt, 40, 4, 3, l.m->cfg.vocab);
    eng_request r;
    memset(&r, 0, sizeof r);
    r.prompt = prompt;
    r.n_prompt = 40;
    r.n = 1;
    r.max_tokens = 40;
    r.sp = samp_default();
    r.sp.temperature = 0.0f;
    r.ignore_eos = 1;
    const struct {
        eng_spec_mode mode;
        int32_t draft;
        eng_spec_mode want_mode;
        int32_t want_draft;
    } cases[] = {
        {ENG_SPEC_AUTO, 0, ENG_SPEC_OFF, 0},  {ENG_SPEC_AUTO, 4, ENG_SPEC_NGRAM, 4},
        {ENG_SPEC_OFF, 8, ENG_SPEC_OFF, 0},   {ENG_SPEC_NGRAM, 0, ENG_SPEC_NGRAM, ENG_SPEC_DEFAULT_DRAFT},
        {ENG_SPEC_NGRAM, 3, ENG_SPEC_NGRAM, 3},
    };
    char why[200] = "";
    for (size_t i = 0; i < sizeof cases / sizeof cases[0] && !why[0]; i++) {
        eng_config cfg = eng_default_config();
        cfg.spec_decode = cases[i].mode;
        cfg.spec_max_draft = cases[i].draft;
        spec_run *run = calloc(1, sizeof *run);
        int rc = run ? run_engine(l.m, &cfg, &r, 1, 0, run) : RD_ENOMEM;
        if (rc)
            snprintf(why, sizeof why, "case %zu: %d (%s)", i, rc, rd_errmsg());
        else if (run->st.spec_decode != cases[i].want_mode || run->st.spec_max_draft != cases[i].want_draft)
            snprintf(why, sizeof why, "case %zu: resolved to %s/%d, expected %s/%d", i,
                     eng_spec_mode_name(run->st.spec_decode), run->st.spec_max_draft,
                     eng_spec_mode_name(cases[i].want_mode), cases[i].want_draft);
        else if ((run->st.spec_drafted > 0) != (cases[i].want_mode == ENG_SPEC_NGRAM))
            snprintf(why, sizeof why, "case %zu: drafted %lld tokens as %s", i, (long long)run->st.spec_drafted,
                     eng_spec_mode_name(cases[i].want_mode));
        if (run)
            spec_run_free(run);
        free(run);
    }
    eng_config bad = eng_default_config();
    bad.spec_decode = (eng_spec_mode)7;
    engine *e = NULL;
    int rc = eng_create(l.m, &bad, &e);
    if (e)
        eng_destroy(e);
    rd_unload(&l);
    CHECK(!why[0], "%s", why);
    CHECK(rc == RD_EINVAL, "spec_decode 7 gave %d", rc);
}

/* The per-sequence rule (spec_feedback): steps that keep 1 of 8 drafts pull
 * the running rate under SPEC_MIN_RATE and the sequence waits; steps that
 * keep half never make it wait. */
static void test_spec_rate_rule(void)
{
    int waited_low = -1, waited_half = 0;
    for (int pass = 0; pass < 2; pass++) {
        seq s;
        memset(&s, 0, sizeof s);
        s.spec_rate = 1.0f;
        const int32_t kept = pass == 0 ? 1 : 4;
        for (int step = 0; step < 30; step++) {
            s.n_draft = 8;
            s.spec_base = 100;
            s.n_tokens = 100 + 1 + kept; /* its kept drafts and the draw after them */
            spec_feedback(&s, 8, NULL);
            if (s.spec_wait > 0) {
                if (pass == 0 && waited_low < 0)
                    waited_low = step;
                if (pass == 1)
                    waited_half = 1;
                s.spec_wait = 0;
            }
        }
    }
    CHECK(waited_low > 0 && waited_low < 15, "1 of 8 kept: first wait at step %d", waited_low);
    CHECK(!waited_half, "half kept: it waited");
}

/* The per-step rule: with spec_max_batch 2, nothing is drafted while more
 * than 2 sequences run, and drafting starts once the tail is down to 2. */
static void test_spec_batch_rule(void)
{
    char path[256];
    snprintf(path, sizeof path, "%s/tiny-q4_1.gguf", testdata());
    rd_loaded l;
    CHECK(load_model(path, &l), "cannot load %s", path);
    static int32_t prompt[40];
    repeating_prompt(prompt, 40, 4, 3, l.m->cfg.vocab);
    eng_config cfg = eng_default_config();
    cfg.spec_decode = ENG_SPEC_NGRAM;
    cfg.spec_max_batch = 2;
    cfg.spec_fixed = 1; /* the batch rule alone, not the step times */
    engine *e = NULL;
    int rc = eng_create(l.m, &cfg, &e);
    for (int i = 0; i < 4 && !rc; i++) {
        eng_request r;
        memset(&r, 0, sizeof r);
        r.prompt = prompt;
        r.n_prompt = 40;
        r.n = 1;
        r.max_tokens = 20 + 20 * i;
        r.sp = samp_default();
        r.sp.temperature = 0.0f;
        r.ignore_eos = 1;
        int64_t id;
        rc = eng_add(e, &r, &id);
    }
    int64_t drafted_wide = 0, drafted_tail = 0;
    eng_result res[4];
    while (!rc && eng_busy(e)) {
        eng_stats before;
        eng_get_stats(e, &before);
        int k = eng_step(e);
        if (k < 0) {
            rc = k;
            break;
        }
        eng_stats after;
        eng_get_stats(e, &after);
        if (before.running > 2)
            drafted_wide += after.spec_drafted - before.spec_drafted;
        else
            drafted_tail += after.spec_drafted - before.spec_drafted;
        for (int n; (n = eng_collect(e, res, 4)) > 0;)
            for (int i = 0; i < n; i++)
                eng_result_free(&res[i]);
    }
    eng_destroy(e);
    rd_unload(&l);
    CHECK(rc == 0, "run: %d (%s)", rc, rd_errmsg());
    CHECK(drafted_wide == 0, "drafted %lld tokens while more than 2 ran", (long long)drafted_wide);
    CHECK(drafted_tail > 0, "nothing drafted in the tail");
}

/* One request of prompt p run alone on e to its end; its result into *out. */
static int run_one(engine *e, const eng_request *r, eng_result *out)
{
    int64_t id;
    int rc = eng_add(e, r, &id);
    while (!rc && eng_busy(e)) {
        int k = eng_step(e);
        rc = k < 0 ? k : 0;
    }
    return rc ? rc : eng_collect(e, out, 1) == 1 ? 0 : RD_EINVAL;
}

/* The store of completions across requests: the same prompt asked again
 * (temperature 1, another seed) drafts from the first answer and keeps more
 * drafts than without the store; after a version change the store has
 * nothing for it (keyed by version): the same drafts as without the store.
 * Outputs equal with and without the store. */
static void test_spec_store_across_requests(void)
{
    char path[256];
    snprintf(path, sizeof path, "%s/tiny-q4_1.gguf", testdata());
    rd_loaded l;
    CHECK(load_model(path, &l), "cannot load %s", path);
    static int32_t prompt[24];
    make_tokens(prompt, 24, 77, l.m->cfg.vocab);
    eng_request r;
    memset(&r, 0, sizeof r);
    r.prompt = prompt;
    r.n_prompt = 24;
    r.n = 1;
    r.max_tokens = 80;
    r.sp = samp_default();
    r.sp.temperature = 0.0f;
    r.ignore_eos = 1;
    /* [store on/off][first, again, after the version change] */
    eng_result res[2][3];
    memset(res, 0, sizeof res);
    eng_stats st[2];
    int rc = 0;
    for (int on = 0; on < 2 && !rc; on++) {
        eng_config cfg = eng_default_config();
        cfg.spec_decode = ENG_SPEC_NGRAM;
        cfg.spec_store_bytes = on ? (int64_t)1 << 20 : 0;
        cfg.spec_fixed = 1; /* drafts by the store alone, not by step times that differ between the engines */
        engine *e = NULL;
        rc = eng_create(l.m, &cfg, &e);
        if (!rc)
            rc = run_one(e, &r, &res[on][0]);
        if (!rc)
            rc = run_one(e, &r, &res[on][1]);
        if (!rc) {
            eng_set_version(e, 2);
            rc = run_one(e, &r, &res[on][2]);
        }
        if (e) {
            eng_get_stats(e, &st[on]);
            eng_destroy(e);
        }
    }
    rd_unload(&l);
    char why[200] = "";
    for (int k = 0; k < 3 && !rc; k++)
        if (!same_result(&res[0][k], &res[1][k], why, sizeof why))
            break;
    const int32_t acc_off = res[0][1].spec_accepted, acc_on = res[1][1].spec_accepted;
    const int32_t acc_v2_off = res[0][2].spec_accepted, acc_v2_on = res[1][2].spec_accepted;
    const int32_t n = res[1][1].n_tokens;
    for (int on = 0; on < 2; on++)
        for (int k = 0; k < 3; k++)
            eng_result_free(&res[on][k]);
    CHECK(rc == 0, "run: %d (%s)", rc, rd_errmsg());
    CHECK(!why[0], "store on vs off: %s", why);
    CHECK(st[1].spec_store_entries == 3 && st[0].spec_store_entries == 0, "entries %d / %d",
          st[1].spec_store_entries, st[0].spec_store_entries);
    CHECK(acc_on > acc_off && acc_on >= n / 2, "asked again: %d drafts kept with the store, %d without (of %d tokens)",
          acc_on, acc_off, n);
    CHECK(acc_v2_on == acc_v2_off, "after the version change: %d kept with the store, %d without", acc_v2_on,
          acc_v2_off);
}

int main(void)
{
    if (file_exists("tests/gen_testdata.sh")) {
        char cmd[600];
        snprintf(cmd, sizeof cmd, "tests/gen_testdata.sh '%s' >/dev/null", testdata());
        if (system(cmd) != 0)
            fprintf(stderr, "test_spec: %s failed\n", cmd);
    }
    RUN(test_ngram_hand);
    RUN(test_ngram_random);
    RUN(test_verify_bad_input);
    RUN(test_kv_truncate);
    RUN(test_engine_on_off_tiny);
    RUN(test_spec_modes);
    RUN(test_spec_rate_rule);
    RUN(test_spec_batch_rule);
    RUN(test_spec_store_across_requests);
    if (!strcmp(test_backend(), "cuda-emu")) {
        printf("SKIP test_engine_on_off_families: too slow on the CUDA emulator\n");
        printf("SKIP test_engine_abort_mid_draft: too slow on the CUDA emulator\n");
        printf("SKIP test_engine_version_between_steps: too slow on the CUDA emulator\n");
    } else {
        RUN(test_engine_on_off_families);
        RUN(test_engine_abort_mid_draft);
        RUN(test_engine_version_between_steps);
    }
    RUN(test_verify_tiny_llama);
    RUN(test_verify_tiny_qwen3);
    RUN(test_verify_tiny_gemma3);
    if (!strcmp(test_backend(), "cuda-emu"))
        printf("SKIP test_verify_real: the 135M model is too slow on the CUDA emulator\n");
    else if (file_exists(real_model_path()))
        RUN(test_verify_real);
    else
        printf("SKIP test_verify_real: %s not found (make model)\n", real_model_path());
    TEST_EXIT();
}
