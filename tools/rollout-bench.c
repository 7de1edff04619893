/* rollout-bench - throughput of the engine on a seeded rollout workload.
 *   rollout-bench --model PATH [--requests R] [--n N] [--seed S] [--max-num-seqs B]
 *                 [--threads T] [--kv-cache-mb MB] [--block-size 16] [--decode-batches 1,32]
 *                 [--decode-only] [--routes] [--json] [--spec-decode off|ngram] [--spec-max-draft D]
 * Workload: R prompts (random token ids, lengths 16-256) x n samples, each
 * sample generating a fixed length (16-256, long-tailed), EOS ignored so both
 * runs do the same work. It runs once with continuous batching and once as
 * static batches of the same size (a batch is admitted only when the previous
 * one has fully finished, so it runs until its longest member ends), and
 * reports both side by side with the speedup. Static batching is modelled as
 * padded batches do it: every member computes until the batch's longest
 * member ends (its extra tokens are padding and do not count as output).
 * --decode-batches also times
 * pure decode steps at the given batch sizes (prompt 32, 64 new tokens);
 * --decode-only skips the two workload runs (the JSON then has no
 * "continuous", "static" or "speedup"); the decode prompts are the same.
 * Each decode batch also reports where its steps' wall time went (engine
 * phase timers, eng_stats): the layers, the head (final norm + LM head +
 * logits out), drawing the tokens, and the rest (scheduling, bookkeeping).
 * --routes (MoE models): the decode requests also ask for their routes
 * (eng_request.return_routes, the engine's routing replay), and each decode
 * batch reports how many distinct experts a step's rows hit per layer: the
 * experts whose weights that step reads (mean, min and max over the 64 steps
 * x layers, and the mean per layer). Recording the routes costs a copy of
 * layers x B x k ids per step. --spec-decode ngram runs everything with
 * speculative decoding (up to --spec-max-draft drafted tokens, default 6): the
 * same tokens, in the time it takes; the JSON then has its drafted and
 * accepted counts. */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/clock.h"
#include "engine/backend.h"
#include "engine/serve/engine.h"
#include "base/err.h"
#include "engine/model/loader.h"
#include "tools/cli.h"

static const char *P = "rollout-bench";

/* splitmix64: the workload generator (not the sampler's RNG). */
static uint64_t mix(uint64_t *s)
{
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}
static double unif(uint64_t *s) { return (mix(s) >> 11) * (1.0 / 9007199254740992.0); }

typedef struct {
    int32_t n_prompt, gen;
    int32_t *prompt;
} work_item;

/* Long tail: log-uniform between 16 and 256, so the median is 64 and a few run to 256. */
static int32_t tail_len(uint64_t *s) { return (int32_t)floor(16.0 * pow(16.0, unif(s))); }

typedef struct {
    double seconds, tokens_per_s, mean_batch, kv_waste; /* tokens: requested output, padding excluded */
    int64_t decode_steps, tokens, kv_peak;
    int64_t spec_drafted, spec_accepted; /* speculative decoding's tokens (0 when off) */
} run_stats;

static int run_workload(model *m, const eng_config *cfg, const work_item *w, int R, int n, int static_batch,
                        uint64_t seed, run_stats *out)
{
    engine *e;
    if (eng_create(m, cfg, &e))
        return -1;
    int per_batch = cfg->max_num_seqs / n;
    if (per_batch < 1)
        per_batch = 1;
    eng_result res[256];
    int next = 0;
    int64_t useful = 0;
    double t0 = clock_now_s();
    while (next < R || eng_busy(e)) {
        if (!static_batch || !eng_busy(e)) {
            int limit = static_batch ? per_batch : R;
            int32_t longest = 0;
            for (int k = 0; k < limit && next + k < R; k++)
                longest = w[next + k].gen > longest ? w[next + k].gen : longest;
            for (int k = 0; k < limit && next < R; k++, next++) {
                samp_params sp = samp_default();
                sp.seed = seed + (uint64_t)next;
                useful += (int64_t)w[next].gen * n;
                eng_request rq = {.prompt = w[next].prompt, .n_prompt = w[next].n_prompt, .n = n,
                                  .max_tokens = static_batch ? longest : w[next].gen, .sp = sp,
                                  .ignore_eos = 1};
                int64_t id;
                if (eng_add(e, &rq, &id)) {
                    fprintf(stderr, "%s: %s\n", P, rd_errmsg());
                    return -1;
                }
            }
        }
        if (eng_step(e) < 0) {
            fprintf(stderr, "%s: step failed: %s\n", P, rd_errmsg());
            return -1;
        }
        int got;
        while ((got = eng_collect(e, res, 256)) > 0)
            for (int i = 0; i < got; i++)
                eng_result_free(&res[i]);
    }
    double dt = clock_now_s() - t0;
    eng_stats st;
    eng_get_stats(e, &st);
    out->seconds = dt;
    out->tokens = useful;
    out->tokens_per_s = useful / dt;
    out->decode_steps = st.steps;
    out->mean_batch = st.steps ? (double)st.seqs_total / st.steps : 0;
    out->kv_peak = st.kv_peak_blocks;
    out->kv_waste = st.kv_waste_at_peak;
    out->spec_drafted = st.spec_drafted;
    out->spec_accepted = st.spec_accepted;
    eng_destroy(e);
    return 0;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Decode-only throughput at batch B: B distinct prompts of 32 tokens are
 * prefilled, then the 64 steps that each add one token per sequence are timed.
 * Returns tokens / (total time); *median_tps gets B / (median step time),
 * which a stall on a shared machine moves less (bench_llamacpp.py reports
 * the same pair). */
/* Shares of the timed decode steps' wall time (eng_stats phases). */
typedef struct {
    double layers, head, sample, other;
} phase_share;

/* --routes: distinct experts a decode step hit, per layer. */
typedef struct {
    double mean, *layer_mean;   /* over the timed steps (x layers); layer_mean [n_layers] */
    int32_t min, max, n_layers;
} moe_hits;

/* Distinct experts among the B sequences' routes at positions 32..95 (the
 * 64 timed steps), per layer. */
static int count_hits(engine *e, const model_config *c, int B, moe_hits *h)
{
    const int32_t L = c->n_layers, k = c->n_experts_used, E = c->n_experts;
    eng_result *res = calloc((size_t)B, sizeof *res);
    h->layer_mean = calloc((size_t)L, sizeof(double));
    h->n_layers = L;
    h->min = INT32_MAX;
    h->max = 0;
    h->mean = 0;
    if (!res || !h->layer_mean)
        return rd_fail(RD_ENOMEM, "rollout-bench: out of memory");
    int got = 0, n;
    while (got < B && (n = eng_collect(e, res + got, B - got)) > 0)
        got += n;
    int rc = 0;
    if (got != B)
        rc = rd_fail(RD_EINVAL, "rollout-bench: %d of %d decode sequences finished", got, B);
    for (int b = 0; b < got && !rc; b++)
        if (res[b].n_routes < 96 || res[b].route_layers != L || res[b].route_k != k)
            rc = rd_fail(RD_EINVAL, "rollout-bench: sequence %d returned %d positions of routes (expected >= 96)", b,
                         res[b].n_routes);
    for (int32_t t = 32; t < 96 && !rc; t++)
        for (int32_t l = 0; l < L; l++) {
            uint8_t seen[RD_MOE_MAX_EXPERTS] = {0};
            int32_t hits = 0;
            for (int b = 0; b < B; b++)
                for (int32_t j = 0; j < k; j++) {
                    int32_t x = res[b].routes[((size_t)t * L + l) * k + j];
                    if (x >= 0 && x < E && !seen[x]) {
                        seen[x] = 1;
                        hits++;
                    }
                }
            h->layer_mean[l] += hits / 64.0;
            h->mean += hits / (64.0 * L);
            h->min = hits < h->min ? hits : h->min;
            h->max = hits > h->max ? hits : h->max;
        }
    for (int b = 0; b < got; b++)
        eng_result_free(&res[b]);
    free(res);
    return rc;
}

static double decode_tps(model *m, const eng_config *base, int B, uint64_t *rng, double *median_tps,
                         phase_share *ph, moe_hits *hits)
{
    eng_config cfg = *base;
    cfg.max_num_seqs = B > cfg.max_num_seqs ? B : cfg.max_num_seqs;
    if (cfg.max_batch_tokens < 32 * B)
        cfg.max_batch_tokens = 32 * B;
    engine *e;
    if (eng_create(m, &cfg, &e))
        return -1;
    int32_t prompt[32];
    for (int b = 0; b < B; b++) {
        for (int i = 0; i < 32; i++)
            prompt[i] = 100 + (int32_t)(mix(rng) % 20000);
        samp_params sp = samp_default();
        sp.seed = (uint64_t)b;
        eng_request rq = {.prompt = prompt, .n_prompt = 32, .n = 1, .max_tokens = 65, .sp = sp, .ignore_eos = 1,
                          .return_routes = hits != NULL};
        int64_t id;
        if (eng_add(e, &rq, &id))
            return -1;
    }
    if (eng_step(e) < 0) /* the prefill of all B prompts and their first token */
        return -1;
    eng_stats s0, s1;
    eng_get_stats(e, &s0);
    double t0 = clock_now_s(), step_s[64];
    int64_t toks = 0;
    for (int i = 0; i < 64; i++) {
        double ts = clock_now_s();
        int rc = eng_step(e);
        if (rc < 0)
            return -1;
        step_s[i] = clock_now_s() - ts;
        toks += rc;
    }
    double dt = clock_now_s() - t0;
    eng_get_stats(e, &s1);
    if (hits && count_hits(e, &m->cfg, B, hits))
        return -1;
    eng_destroy(e);
    ph->layers = (s1.ns_layers - s0.ns_layers) * 1e-9 / dt;
    ph->head = (s1.ns_head - s0.ns_head) * 1e-9 / dt;
    ph->sample = (s1.ns_sample - s0.ns_sample) * 1e-9 / dt;
    ph->other = 1.0 - ph->layers - ph->head - ph->sample;
    qsort(step_s, 64, sizeof step_s[0], cmp_double);
    *median_tps = B / (0.5 * (step_s[31] + step_s[32]));
    return toks / dt;
}

int main(int argc, char **argv)
{
    const char *model_path = NULL;
    int R = 64, n = 4, json = 0, threads = 0, max_seqs = 64, decode_only = 0, routes = 0;
    int64_t kv_mb = 1024;
    int32_t block_size = 16;
    uint64_t seed = 1;
    int32_t *dec_b = NULL, n_dec = 0, spec_max_draft = 0;
    eng_spec_mode spec = ENG_SPEC_AUTO; /* as the daemon: --spec-max-draft D alone means ngram */
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--model")) model_path = cli_value(P, argc, argv, &i);
        else if (!strcmp(a, "--requests")) R = (int)cli_int(P, a, cli_value(P, argc, argv, &i), 1, 100000);
        else if (!strcmp(a, "--n")) n = (int)cli_int(P, a, cli_value(P, argc, argv, &i), 1, 256);
        else if (!strcmp(a, "--seed")) seed = (uint64_t)cli_int(P, a, cli_value(P, argc, argv, &i), 0, INT64_MAX);
        else if (!strcmp(a, "--max-num-seqs")) max_seqs = (int)cli_int(P, a, cli_value(P, argc, argv, &i), 1, 4096);
        else if (!strcmp(a, "--threads")) threads = (int)cli_int(P, a, cli_value(P, argc, argv, &i), 1, 256);
        else if (!strcmp(a, "--block-size")) block_size = (int32_t)cli_int(P, a, cli_value(P, argc, argv, &i), 1, 1024);
        else if (!strcmp(a, "--kv-cache-mb")) kv_mb = cli_int(P, a, cli_value(P, argc, argv, &i), 1, 1 << 24);
        else if (!strcmp(a, "--decode-batches")) dec_b = cli_ids(P, a, cli_value(P, argc, argv, &i), &n_dec);
        else if (!strcmp(a, "--decode-only")) decode_only = 1;
        else if (!strcmp(a, "--routes")) routes = 1;
        else if (!strcmp(a, "--json")) json = 1;
        else if (!strcmp(a, "--spec-decode")) {
            if (eng_spec_mode_parse(cli_value(P, argc, argv, &i), &spec))
                cli_die(P, "--spec-decode: %s%s", rd_errmsg(), "");
        }
        else if (!strcmp(a, "--spec-max-draft"))
            spec_max_draft = (int32_t)cli_int(P, a, cli_value(P, argc, argv, &i), 0, SEQ_MAX_DRAFT);
        else cli_die(P, "unknown flag '%s'%s (see the comment at the top of tools/rollout-bench.c)", a, "");
    }
    if (!model_path)
        cli_die(P, "usage: rollout-bench --model PATH [--requests R] [--n N] [--seed S] [--json]%s%s", "", "");
    if (n > max_seqs)
        cli_die(P, "--n must not exceed --max-num-seqs%s%s", "", "");
    if (decode_only && n_dec == 0)
        cli_die(P, "--decode-only needs --decode-batches%s%s", "", "");
    for (int32_t i = 0; i < n_dec; i++)
        if (dec_b[i] < 1 || dec_b[i] > 1024)
            cli_die(P, "--decode-batches expects sizes in 1..1024%s%s", "", "");

    rd_loaded L;
    if (rd_load(model_path, "cpu", threads, &L)) {
        fprintf(stderr, "%s: %s\n", P, rd_errmsg());
        return 1;
    }
    const model_config *mc = &L.m->cfg;
    if (routes && mc->n_experts == 0)
        cli_die(P, "--routes needs a mixture-of-experts model (%s has none)%s", model_path, "");
    uint64_t rng = seed;
    work_item *w = calloc((size_t)R, sizeof *w);
    int64_t work_tokens = 0;
    for (int r = 0; r < R; r++) {
        w[r].n_prompt = tail_len(&rng);
        w[r].gen = tail_len(&rng);
        w[r].prompt = malloc(sizeof(int32_t) * w[r].n_prompt);
        for (int32_t i = 0; i < w[r].n_prompt; i++)
            w[r].prompt[i] = 100 + (int32_t)(mix(&rng) % (uint64_t)(mc->vocab - 100));
        work_tokens += (int64_t)w[r].gen * n;
    }

    eng_config cfg = eng_default_config();
    cfg.max_num_seqs = max_seqs;
    cfg.max_batch_tokens = 512 > max_seqs ? 512 : max_seqs;
    cfg.kv_cache_bytes = kv_mb << 20;
    cfg.block_size = block_size;
    cfg.spec_decode = spec;
    cfg.spec_max_draft = spec_max_draft;
    run_stats cont = {0}, stat = {0};
    double speedup = 0;
    if (!decode_only) {
        if (run_workload(L.m, &cfg, w, R, n, 0, seed, &cont) || run_workload(L.m, &cfg, w, R, n, 1, seed, &stat))
            return 1;
        speedup = cont.tokens_per_s / stat.tokens_per_s;
    }

    double *dec = calloc((size_t)(n_dec ? n_dec : 1), sizeof *dec);
    double *dec_med = calloc((size_t)(n_dec ? n_dec : 1), sizeof *dec_med);
    phase_share *ph = calloc((size_t)(n_dec ? n_dec : 1), sizeof *ph);
    moe_hits *hits = calloc((size_t)(n_dec ? n_dec : 1), sizeof *hits);
    for (int32_t i = 0; i < n_dec; i++)
        if ((dec[i] = decode_tps(L.m, &cfg, dec_b[i], &rng, &dec_med[i], &ph[i], routes ? &hits[i] : NULL)) < 0) {
            fprintf(stderr, "%s: decode benchmark failed: %s\n", P, rd_errmsg());
            return 1;
        }

    if (json) {
        cJSON *o = cJSON_CreateObject();
        const run_stats *rs[2] = {&cont, &stat};
        const char *names[2] = {"continuous", "static"};
        for (int k = 0; k < 2 && !decode_only; k++) {
            cJSON *x = cJSON_AddObjectToObject(o, names[k]);
            cJSON_AddNumberToObject(x, "tokens_per_s", rs[k]->tokens_per_s);
            cJSON_AddNumberToObject(x, "decode_steps", (double)rs[k]->decode_steps);
            cJSON_AddNumberToObject(x, "mean_batch", rs[k]->mean_batch);
            cJSON_AddNumberToObject(x, "kv_peak_blocks", (double)rs[k]->kv_peak);
            cJSON_AddNumberToObject(x, "kv_waste_frac", rs[k]->kv_waste);
            cJSON_AddNumberToObject(x, "seconds", rs[k]->seconds);
            cJSON_AddNumberToObject(x, "generated_tokens", (double)rs[k]->tokens);
            if (spec == ENG_SPEC_NGRAM || (spec == ENG_SPEC_AUTO && spec_max_draft > 0)) {
                cJSON_AddNumberToObject(x, "spec_drafted_tokens", (double)rs[k]->spec_drafted);
                cJSON_AddNumberToObject(x, "spec_accepted_tokens", (double)rs[k]->spec_accepted);
            }
        }
        if (!decode_only)
            cJSON_AddNumberToObject(o, "speedup", speedup);
        cJSON_AddNumberToObject(o, "block_size", block_size);
        cJSON_AddNumberToObject(o, "threads", L.be->n_threads);
        cJSON *d = cJSON_AddObjectToObject(o, "decode_tokens_per_s");
        for (int32_t i = 0; i < n_dec; i++) {
            char k[32];
            snprintf(k, sizeof k, "batch_%d", dec_b[i]);
            cJSON_AddNumberToObject(d, k, dec[i]);
        }
        cJSON *dm = cJSON_AddObjectToObject(o, "decode_tokens_per_s_median_step");
        for (int32_t i = 0; i < n_dec; i++) {
            char k[32];
            snprintf(k, sizeof k, "batch_%d", dec_b[i]);
            cJSON_AddNumberToObject(dm, k, dec_med[i]);
        }
        cJSON *dp = cJSON_AddObjectToObject(o, "decode_phase_share");
        for (int32_t i = 0; i < n_dec; i++) {
            char k[32];
            snprintf(k, sizeof k, "batch_%d", dec_b[i]);
            cJSON *x = cJSON_AddObjectToObject(dp, k);
            cJSON_AddNumberToObject(x, "layers", ph[i].layers);
            cJSON_AddNumberToObject(x, "head", ph[i].head);
            cJSON_AddNumberToObject(x, "sample", ph[i].sample);
            cJSON_AddNumberToObject(x, "other", ph[i].other);
        }
        if (routes) {
            cJSON *dh = cJSON_AddObjectToObject(o, "decode_experts_hit");
            cJSON_AddNumberToObject(dh, "n_experts", mc->n_experts);
            cJSON_AddNumberToObject(dh, "k", mc->n_experts_used);
            cJSON_AddNumberToObject(dh, "n_layers", mc->n_layers);
            for (int32_t i = 0; i < n_dec; i++) {
                char k[32];
                snprintf(k, sizeof k, "batch_%d", dec_b[i]);
                cJSON *x = cJSON_AddObjectToObject(dh, k);
                cJSON_AddNumberToObject(x, "mean", hits[i].mean);
                cJSON_AddNumberToObject(x, "min", hits[i].min);
                cJSON_AddNumberToObject(x, "max", hits[i].max);
                cJSON *pl = cJSON_AddArrayToObject(x, "per_layer");
                for (int32_t l = 0; l < hits[i].n_layers; l++)
                    cJSON_AddItemToArray(pl, cJSON_CreateNumber(hits[i].layer_mean[l]));
            }
        }
        char *s = cJSON_PrintUnformatted(o);
        puts(s);
        free(s);
        cJSON_Delete(o);
    } else {
        if (!decode_only) {
            printf("workload: %d requests x n=%d, %lld generated tokens, max_num_seqs %d, block size %d, %d threads\n",
                   R, n, (long long)work_tokens, max_seqs, block_size, L.be->n_threads);
            printf("%-12s %12s %8s %8s %10s %10s %8s\n", "mode", "tokens/s", "steps", "batch", "kv_peak", "kv_waste", "secs");
            const run_stats *rs[2] = {&cont, &stat};
            const char *names[2] = {"continuous", "static"};
            for (int k = 0; k < 2; k++)
                printf("%-12s %12.1f %8lld %8.1f %10lld %9.2f%% %8.1f\n", names[k], rs[k]->tokens_per_s,
                       (long long)rs[k]->decode_steps, rs[k]->mean_batch, (long long)rs[k]->kv_peak,
                       100 * rs[k]->kv_waste, rs[k]->seconds);
            printf("speedup (continuous / static): %.2fx\n", speedup);
        }
        for (int32_t i = 0; i < n_dec; i++)
            printf("decode batch %-4d %10.1f tokens/s (median step: %.1f), %d threads; step time: layers %.1f%%, "
                   "head (norm, LM head) %.1f%%, sampling %.1f%%, other %.1f%%\n",
                   dec_b[i], dec[i], dec_med[i], L.be->n_threads, 100 * ph[i].layers, 100 * ph[i].head,
                   100 * ph[i].sample, 100 * ph[i].other);
        for (int32_t i = 0; i < n_dec && routes; i++)
            printf("decode batch %-4d distinct experts a step hit per layer: mean %.1f (min %d, max %d) of %d, "
                   "top %d\n", dec_b[i], hits[i].mean, hits[i].min, hits[i].max, mc->n_experts, mc->n_experts_used);
    }
    return 0;
}
