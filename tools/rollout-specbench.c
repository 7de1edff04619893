/* rollout-specbench - speculative decoding on vs off on a long-tail decode workload.
 *   rollout-specbench --model PATH [--backend cpu] [--threads T] [--batches 1,2,4] [--max-tokens 128]
 *                     [--spec-decode ngram] [--draft 6] [--reps 2] [--json-out FILE] [--grpo]
 *                     [--spec-max-batch B] [--spec-fixed] [--spread]
 * The tail of an RL round: B (1, 2, 4) samples decode alone. Prompts are code,
 * lists and worked arithmetic (structure that repeats, numbers and names that
 * come back, as in real answers), the default model's tokenizer encodes them;
 * each of the B requests takes the next prompt, one sample, max_tokens new
 * tokens, EOS ignored so both runs do the same work. For greedy and for
 * temperature 1 (seeded) and each B, it runs the requests with speculation
 * off and on (spec_decode = --spec-decode, the only drafter today ngram;
 * spec_max_draft = --draft, alias --spec-max-draft) alternately, --reps times, in one
 * process, and reports the tokens/s of both (the best rep of each), their
 * ratio, the acceptance rate (accepted / drafted), the mean tokens a verify
 * step kept per sequence, and whether every sample came out the same
 * (tokens and log-prob bits; it must, and a difference is reported, not
 * hidden). A benchmark, not a test: nothing here passes or fails on time.
 *
 * --grpo: a GRPO round instead. 16 math and code questions whose answers
 * repeat the question's numbers and names, each through the model's chat
 * template, n = 8 samples at temperature 1 (seeded), up to --max-tokens
 * (default 256) each, stopping at EOS as real rollouts do; the engine's
 * default batch (64 sequences, so the round starts with a queue and ends in
 * a tail). Off and on alternately, --reps times; per run: the round's wall
 * time, the tail's tokens/s (tokens drawn in the last 25% of the round's
 * time over that time), and for the speculating run the acceptance rate and
 * the mean accepted length (SGLang's: completion tokens / verify steps,
 * summed over samples). Medians over the reps, and whether every sample was
 * identical. --spread (with --grpo): the questions' max_tokens spread from
 * 16 to --max-tokens, quadratically (spread_budget), so the round has the
 * small-batch tail of a real one: on the small models here about half the
 * samples never say EOS, and with equal budgets they all stop in one step. --spec-max-batch B: the speculating runs' spec_max_batch (default
 * the engine's, 8). --spec-fixed: the speculating runs size drafts by
 * spec_len and the batch bound alone, not by the engine's measured step
 * times (eng_config.spec_fixed; spec_cost.h). */
#include <cjson/cJSON.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/clock.h"
#include "base/err.h"
#include "engine/model/loader.h"
#include "engine/serve/engine.h"
#include "tools/cli.h"

static const char *P = "rollout-specbench";
static int32_t spec_max_batch; /* --spec-max-batch: the engine's bound on a speculating step's batch (0: its default) */
static int spec_fixed;         /* --spec-fixed: drafts not sized by the measured step times */
static int grpo_spread;        /* --spread: the GRPO round's answer budgets spread out (a long tail) */

/* --spread: question i (of N_GRPO) may answer max_tokens * ((i + 1) / N_GRPO)^2 tokens, at least 16: most
   answers short, a few long, as a round's lengths are when answers end at EOS; the round ends with the last
   question's 8 samples decoding alone, the tail speculation is for. */
static int spread_budget(int max_tokens, int i, int n)
{
    const double f = (double)(i + 1) / n;
    const int t = (int)(max_tokens * f * f);
    return t < 16 ? 16 : t;
}

static const char *PROMPTS[] = {
    "def add(a, b):\n    return a + b\n\n\ndef sub(a, b):\n    return a - b\n\n\ndef mul(a, b):\n"
    "    return a * b\n\n\ndef",
    "Q: Tom has 12 apples and buys 7 more. How many apples does Tom have?\nA: Tom has 12 apples. He buys 7 "
    "more. 12 + 7 = 19. Tom has 19 apples.\nQ: Sara has 25 pens and gives away 9. How many pens does Sara "
    "have?\nA:",
    "List of US states and their capitals:\n1. Alabama - Montgomery\n2. Alaska - Juneau\n3. Arizona - "
    "Phoenix\n4.",
    "[{\"id\": 1, \"name\": \"alpha\", \"tags\": [\"a\", \"b\"]},\n {\"id\": 2, \"name\": \"beta\", \"tags\": "
    "[\"b\", \"c\"]},\n {\"id\": 3,",
};
#define N_PROMPTS 4

/* GRPO-shaped questions: names and numbers an answer repeats while it works. */
static const char *GRPO_Q[] = {
    "Alice has 37 marbles and Bob has 48 marbles. Alice gives Bob 12 marbles. How many marbles do Alice and Bob "
    "each have now? Show every step.",
    "A train leaves Springfield at 9:15 and travels 240 km at 80 km/h to Shelbyville. When does it arrive in "
    "Shelbyville? Explain step by step.",
    "Write a Python function count_vowels(text) that returns the number of vowels in text, then show "
    "count_vowels(\"banana\") and count_vowels(\"rhythm\") with their results.",
    "Maria buys 3 notebooks at $4.25 each and 2 pens at $1.75 each. She pays with a $20 bill. How much change "
    "does Maria get? Show each step.",
    "Write a Python function fizzbuzz(n) that returns a list of strings for 1 to n, then show fizzbuzz(15).",
    "The rectangle ABCD has AB = 12 cm and BC = 5 cm. What is the length of the diagonal AC? What is the area "
    "of ABCD? Explain.",
    "Tom reads 24 pages on Monday, 31 pages on Tuesday and 27 pages on Wednesday. His book has 150 pages. How "
    "many pages does Tom have left? Show your work.",
    "Write a C function int sum_array(const int *a, int n) that returns the sum of a[0..n), and a main that "
    "prints sum_array of {3, 7, 11, 19}.",
    "A farmer named Lee has 14 cows and 23 chickens. How many legs do Lee's animals have in total? Count the "
    "cows' legs and the chickens' legs separately.",
    "Solve for x: 3x + 17 = 62. Then check the answer by putting x back into 3x + 17.",
    "Write a Python class BankAccount with deposit(amount), withdraw(amount) and balance(), and show an account "
    "of Sam that deposits 100, withdraws 30 and deposits 45.",
    "Priya runs 5.5 km every day for 6 days and 8 km on the seventh day. How many kilometres does Priya run in "
    "the week? What is her average per day?",
    "Write a JavaScript function isPalindrome(s) and test it on \"racecar\", \"level\" and \"rolloutd\".",
    "A shop sells apples at 3 for $2. Carlos buys 18 apples and Dana buys 27 apples. How much do Carlos and Dana "
    "pay each, and together?",
    "Convert 1011011 from binary to decimal, then convert 91 back to binary, showing each division by 2.",
    "Write a Python function merge_sorted(a, b) that merges two sorted lists, and show merge_sorted([1, 4, 9], "
    "[2, 3, 10, 12]).",
};
#define N_GRPO 16
#define GRPO_N 8

typedef struct {
    double seconds;
    int64_t tokens, drafted, accepted, verify_steps;
    eng_result *res;            /* [B] by request order */
} run_out;

static int run_once(rd_loaded *L, const char *backend, int32_t **ids, const size_t *n_ids, int B, int max_tokens,
                    float temp, int draft, run_out *out)
{
    eng_config cfg = eng_default_config();
    cfg.backend = backend;
    cfg.spec_decode = draft > 0 ? ENG_SPEC_NGRAM : ENG_SPEC_OFF;
    cfg.spec_max_draft = draft;
    cfg.spec_max_batch = spec_max_batch;
    cfg.spec_fixed = spec_fixed;
    cfg.eos_id = -1;
    engine *e;
    int rc = eng_create(L->m, &cfg, &e);
    if (rc)
        return rc;
    memset(out, 0, sizeof *out);
    out->res = calloc((size_t)B, sizeof *out->res);
    int64_t req_ids[64];
    int64_t t0 = clock_now_ns();
    for (int i = 0; i < B && !rc; i++) {
        eng_request r = {.prompt = ids[i % N_PROMPTS], .n_prompt = (int32_t)n_ids[i % N_PROMPTS], .n = 1,
                         .max_tokens = max_tokens, .sp = samp_default(), .ignore_eos = 1};
        r.sp.temperature = temp;
        r.sp.seed = 1000 + i;
        rc = eng_add(e, &r, &req_ids[i]);
    }
    int got = 0;
    eng_result tmp;
    while (!rc && got < B) {
        int s = eng_step(e);
        if (s < 0) {
            rc = s;
            break;
        }
        while (eng_collect(e, &tmp, 1) == 1) {
            for (int i = 0; i < B; i++)
                if (req_ids[i] == tmp.req_id)
                    out->res[i] = tmp;
            got++;
        }
    }
    out->seconds = (clock_now_ns() - t0) * 1e-9;
    eng_stats st;
    eng_get_stats(e, &st);
    out->tokens = st.generated_tokens;
    out->drafted = st.spec_drafted;
    out->accepted = st.spec_accepted;
    out->verify_steps = st.spec_steps;
    eng_destroy(e);
    return rc;
}

static void free_run(run_out *r, int B)
{
    for (int i = 0; r->res && i < B; i++)
        eng_result_free(&r->res[i]);
    free(r->res);
    r->res = NULL;
}

static int same_outputs(const run_out *a, const run_out *b, int B)
{
    for (int i = 0; i < B; i++) {
        const eng_result *x = &a->res[i], *y = &b->res[i];
        if (x->n_tokens != y->n_tokens || memcmp(x->token_ids, y->token_ids, sizeof(int32_t) * x->n_tokens) ||
            memcmp(x->logprobs, y->logprobs, sizeof(float) * x->n_tokens))
            return 0;
    }
    return 1;
}

typedef struct {
    double seconds;             /* the round's wall time */
    double tail_tps;            /* tokens drawn in the last 25% of that time, per second */
    int64_t tokens, drafted, accepted, verify_ct; /* verify_ct: sum of the samples' spec_steps */
    eng_result *res;            /* [N_GRPO * GRPO_N] by (request, sample) */
} grpo_out;

static int grpo_once(rd_loaded *L, const char *backend, int32_t **ids, const size_t *n_ids, int max_tokens,
                     int draft, grpo_out *out)
{
    eng_config cfg = eng_default_config();
    cfg.backend = backend;
    cfg.spec_decode = draft > 0 ? ENG_SPEC_NGRAM : ENG_SPEC_OFF;
    cfg.spec_max_draft = draft;
    cfg.spec_max_batch = spec_max_batch;
    cfg.spec_fixed = spec_fixed;
    cfg.eos_id = tok_eos(L->tok);
    cfg.eot_id = tok_eot(L->tok);
    engine *e;
    int rc = eng_create(L->m, &cfg, &e);
    if (rc)
        return rc;
    memset(out, 0, sizeof *out);
    const int total = N_GRPO * GRPO_N;
    out->res = calloc((size_t)total, sizeof *out->res);
    /* Per step: its end time and the tokens drawn so far, for the tail. */
    int64_t cap = 1 << 16, n_steps = 0;
    int64_t *t_ns = malloc(sizeof(int64_t) * (size_t)cap), *toks = malloc(sizeof(int64_t) * (size_t)cap);
    int64_t req_ids[N_GRPO];
    const int64_t t0 = clock_now_ns();
    for (int i = 0; i < N_GRPO && !rc; i++) {
        eng_request r = {.prompt = ids[i], .n_prompt = (int32_t)n_ids[i], .n = GRPO_N,
                         .max_tokens = grpo_spread ? spread_budget(max_tokens, i, N_GRPO) : max_tokens,
                         .sp = samp_default()};
        r.sp.temperature = 1.0f;
        r.sp.seed = 5000 + i;
        rc = eng_add(e, &r, &req_ids[i]);
    }
    int got = 0;
    eng_result tmp;
    while (!rc && got < total) {
        int k = eng_step(e);
        if (k < 0) {
            rc = k;
            break;
        }
        eng_stats st;
        eng_get_stats(e, &st);
        if (n_steps < cap) {
            t_ns[n_steps] = clock_now_ns();
            toks[n_steps++] = st.generated_tokens;
        }
        while (eng_collect(e, &tmp, 1) == 1) {
            for (int i = 0; i < N_GRPO; i++)
                if (req_ids[i] == tmp.req_id && tmp.sample_idx < GRPO_N)
                    out->res[i * GRPO_N + tmp.sample_idx] = tmp;
            got++;
        }
    }
    const int64_t t1 = clock_now_ns();
    out->seconds = (t1 - t0) * 1e-9;
    const int64_t cut = t1 - (t1 - t0) / 4;
    int64_t before = 0; /* tokens drawn by the last step that ended before the cut */
    for (int64_t i = 0; i < n_steps && t_ns[i] <= cut; i++)
        before = toks[i];
    eng_stats st;
    eng_get_stats(e, &st);
    out->tokens = st.generated_tokens;
    out->tail_tps = (double)(st.generated_tokens - before) / ((t1 - cut) * 1e-9);
    out->drafted = st.spec_drafted;
    out->accepted = st.spec_accepted;
    for (int i = 0; i < total; i++)
        out->verify_ct += out->res[i].spec_steps;
    free(t_ns);
    free(toks);
    eng_destroy(e);
    return rc;
}

static int cmp_dbl(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, cmp_dbl);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* The GRPO round, off vs on (see the top of the file). */
static int grpo_bench(rd_loaded *L, const char *backend, int max_tokens, int draft, int reps, const char *json_out,
                      const char *model_path, int threads)
{
    int32_t *ids[N_GRPO];
    size_t n_ids[N_GRPO];
    for (int p = 0; p < N_GRPO; p++)
        if (tok_chat(L->tok, NULL, GRPO_Q[p], &ids[p], &n_ids[p])) {
            fprintf(stderr, "%s: %s\n", P, rd_errmsg());
            return 1;
        }
    const int total = N_GRPO * GRPO_N;
    double *round_off = calloc((size_t)reps, sizeof(double)), *round_on = calloc((size_t)reps, sizeof(double));
    double *tail_off = calloc((size_t)reps, sizeof(double)), *tail_on = calloc((size_t)reps, sizeof(double));
    double *ratio_round = calloc((size_t)reps, sizeof(double)), *ratio_tail = calloc((size_t)reps, sizeof(double));
    int same = 1;
    int64_t tokens = 0, drafted = 0, accepted = 0, verify_ct = 0;
    printf("%-4s %9s %9s %8s %12s %12s %8s %8s %9s %9s %5s\n", "rep", "off s", "on s", "round", "off tail/s",
           "on tail/s", "tail", "drafted", "accepted", "acc.len", "same");
    for (int r = 0; r < reps; r++) {
        grpo_out off, on;
        if (grpo_once(L, backend, ids, n_ids, max_tokens, 0, &off) ||
            grpo_once(L, backend, ids, n_ids, max_tokens, draft, &on)) {
            fprintf(stderr, "%s: run failed: %s\n", P, rd_errmsg());
            return 1;
        }
        int s = off.tokens == on.tokens;
        for (int i = 0; i < total && s; i++) {
            const eng_result *x = &off.res[i], *y = &on.res[i];
            s = x->n_tokens == y->n_tokens && x->finish == y->finish &&
                !memcmp(x->token_ids, y->token_ids, sizeof(int32_t) * (size_t)x->n_tokens) &&
                !memcmp(x->logprobs, y->logprobs, sizeof(float) * (size_t)x->n_tokens);
        }
        same &= s;
        round_off[r] = off.seconds, round_on[r] = on.seconds;
        tail_off[r] = off.tail_tps, tail_on[r] = on.tail_tps;
        ratio_round[r] = off.seconds / on.seconds;
        ratio_tail[r] = on.tail_tps / off.tail_tps;
        tokens = on.tokens, drafted = on.drafted, accepted = on.accepted, verify_ct = on.verify_ct;
        printf("%-4d %9.2f %9.2f %7.2fx %12.1f %12.1f %7.2fx %8lld %8.1f%% %9.2f %5s\n", r, off.seconds, on.seconds,
               ratio_round[r], off.tail_tps, on.tail_tps, ratio_tail[r], (long long)drafted,
               drafted ? 100.0 * accepted / drafted : 0.0, verify_ct ? (double)tokens / verify_ct : 0.0,
               s ? "yes" : "NO");
        fflush(stdout);
        for (int i = 0; i < total; i++) {
            eng_result_free(&off.res[i]);
            eng_result_free(&on.res[i]);
        }
        free(off.res);
        free(on.res);
    }
    const double m_round = median(ratio_round, reps), m_tail = median(ratio_tail, reps);
    printf("median over %d reps: whole round %.2fx, tail tokens/s %.2fx; %lld tokens, outputs identical: %s\n", reps,
           m_round, m_tail, (long long)tokens, same ? "yes" : "NO");
    if (json_out) {
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "workload", "grpo");
        cJSON_AddStringToObject(o, "model", model_path);
        cJSON_AddNumberToObject(o, "threads", threads);
        cJSON_AddNumberToObject(o, "prompts", N_GRPO);
        cJSON_AddNumberToObject(o, "n", GRPO_N);
        cJSON_AddNumberToObject(o, "max_tokens", max_tokens);
        cJSON_AddStringToObject(o, "budgets", grpo_spread ? "spread" : "equal");
        cJSON_AddNumberToObject(o, "spec_max_draft", draft);
        cJSON_AddNumberToObject(o, "spec_max_batch", spec_max_batch);
        cJSON_AddBoolToObject(o, "spec_fixed", spec_fixed);
        cJSON_AddNumberToObject(o, "reps", reps);
        cJSON_AddNumberToObject(o, "tokens", (double)tokens);
        cJSON_AddNumberToObject(o, "round_s_off_median", median(round_off, reps));
        cJSON_AddNumberToObject(o, "round_s_on_median", median(round_on, reps));
        cJSON_AddNumberToObject(o, "tail_tokens_per_s_off_median", median(tail_off, reps));
        cJSON_AddNumberToObject(o, "tail_tokens_per_s_on_median", median(tail_on, reps));
        cJSON_AddNumberToObject(o, "round_speedup_median", m_round);
        cJSON_AddNumberToObject(o, "tail_speedup_median", m_tail);
        cJSON_AddNumberToObject(o, "drafted", (double)drafted);
        cJSON_AddNumberToObject(o, "accepted", (double)accepted);
        cJSON_AddNumberToObject(o, "acceptance_rate", drafted ? (double)accepted / drafted : 0.0);
        cJSON_AddNumberToObject(o, "mean_accept_length", verify_ct ? (double)tokens / verify_ct : 0.0);
        cJSON_AddBoolToObject(o, "outputs_identical", same);
        char *txt = cJSON_Print(o);
        FILE *f = fopen(json_out, "w");
        if (!f || fprintf(f, "%s\n", txt) < 0) {
            fprintf(stderr, "%s: cannot write %s\n", P, json_out);
            return 1;
        }
        fclose(f);
        free(txt);
        cJSON_Delete(o);
    }
    for (int p = 0; p < N_GRPO; p++)
        free(ids[p]);
    free(round_off), free(round_on), free(tail_off), free(tail_on), free(ratio_round), free(ratio_tail);
    return same ? 0 : 1;
}

int main(int argc, char **argv)
{
    const char *model_path = NULL, *backend = "cpu";
    int threads = 2, max_tokens = 0, draft = 6, reps = 2, grpo = 0;
    const char *json_out = NULL;
    int32_t *batches = NULL, n_batches = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--model")) model_path = cli_value(P, argc, argv, &i);
        else if (!strcmp(a, "--backend")) backend = cli_value(P, argc, argv, &i);
        else if (!strcmp(a, "--threads")) threads = (int)cli_int(P, a, cli_value(P, argc, argv, &i), 1, 256);
        else if (!strcmp(a, "--batches")) batches = cli_ids(P, a, cli_value(P, argc, argv, &i), &n_batches);
        else if (!strcmp(a, "--max-tokens")) max_tokens = (int)cli_int(P, a, cli_value(P, argc, argv, &i), 1, 4096);
        else if (!strcmp(a, "--spec-decode")) {
            eng_spec_mode m;
            if (eng_spec_mode_parse(cli_value(P, argc, argv, &i), &m) || m != ENG_SPEC_NGRAM)
                cli_die(P, "--spec-decode: the speculating side's drafter; expected ngram%s%s", "", "");
        }
        else if (!strcmp(a, "--draft") || !strcmp(a, "--spec-max-draft")) draft = (int)cli_int(P, a, cli_value(P, argc, argv, &i), 1, 16);
        else if (!strcmp(a, "--reps")) reps = (int)cli_int(P, a, cli_value(P, argc, argv, &i), 1, 100);
        else if (!strcmp(a, "--json-out")) json_out = cli_value(P, argc, argv, &i);
        else if (!strcmp(a, "--grpo")) grpo = 1;
        else if (!strcmp(a, "--spread")) grpo_spread = 1;
        else if (!strcmp(a, "--spec-fixed")) spec_fixed = 1;
        else if (!strcmp(a, "--spec-max-batch"))
            spec_max_batch = (int32_t)cli_int(P, a, cli_value(P, argc, argv, &i), 0, 4096);
        else cli_die(P, "unknown option %s%s", a, "");
    }
    if (!model_path)
        cli_die(P, "--model is required%s%s", "", "");
    static int32_t dflt[3] = {1, 2, 4};
    if (!batches) {
        batches = dflt;
        n_batches = 3;
    }
    for (int32_t b = 0; b < n_batches; b++)
        if (batches[b] < 1 || batches[b] > 64)
            cli_die(P, "--batches: each batch must be in 1..64%s%s", "", "");
    rd_loaded L;
    if (rd_load(model_path, backend, threads, &L)) {
        fprintf(stderr, "%s: %s\n", P, rd_errmsg());
        return 1;
    }
    if (!L.tok) {
        fprintf(stderr, "%s: %s has no tokenizer\n", P, model_path);
        return 1;
    }
    if (grpo) {
        int rc = grpo_bench(&L, backend, max_tokens ? max_tokens : 256, draft, reps, json_out, model_path, threads);
        rd_unload(&L);
        return rc;
    }
    if (!max_tokens)
        max_tokens = 128;
    int32_t *ids[N_PROMPTS];
    size_t n_ids[N_PROMPTS];
    for (int p = 0; p < N_PROMPTS; p++)
        if (tok_encode_prompt(L.tok, PROMPTS[p], strlen(PROMPTS[p]), &ids[p], &n_ids[p])) {
            fprintf(stderr, "%s: %s\n", P, rd_errmsg());
            return 1;
        }
    cJSON *root = cJSON_CreateObject(), *rows = cJSON_AddArrayToObject(root, "runs");
    cJSON_AddStringToObject(root, "model", model_path);
    cJSON_AddStringToObject(root, "backend", backend);
    cJSON_AddNumberToObject(root, "threads", threads);
    cJSON_AddNumberToObject(root, "max_tokens", max_tokens);
    cJSON_AddNumberToObject(root, "spec_max_draft", draft);
    /* The prompts as token ids: tools/bench_lookup.py runs llama.cpp's lookup decoding on the same ones. */
    cJSON *pj = cJSON_AddArrayToObject(root, "prompt_ids");
    for (int p = 0; p < N_PROMPTS; p++) {
        cJSON *a = cJSON_CreateArray();
        for (size_t k = 0; k < n_ids[p]; k++)
            cJSON_AddItemToArray(a, cJSON_CreateNumber(ids[p][k]));
        cJSON_AddItemToArray(pj, a);
    }
    printf("%-6s %2s %10s %10s %7s %10s %12s %6s\n", "temp", "B", "off tok/s", "on tok/s", "ratio",
               "accepted", "tokens/step", "same");
    const float temps[2] = {0.0f, 1.0f};
    for (int t = 0; t < 2; t++)
        for (int32_t bi = 0; bi < n_batches; bi++) {
            const int B = batches[bi];
            double best_off = 1e30, best_on = 1e30;
            int64_t tokens = 0, drafted = 0, accepted = 0, steps = 0;
            int same = 1;
            for (int r = 0; r < reps; r++) {
                run_out off, on;
                if (run_once(&L, backend, ids, n_ids, B, max_tokens, temps[t], 0, &off) ||
                    run_once(&L, backend, ids, n_ids, B, max_tokens, temps[t], draft, &on)) {
                    fprintf(stderr, "%s: run failed: %s\n", P, rd_errmsg());
                    return 1;
                }
                best_off = off.seconds < best_off ? off.seconds : best_off;
                best_on = on.seconds < best_on ? on.seconds : best_on;
                tokens = off.tokens;
                same &= on.tokens == off.tokens && same_outputs(&off, &on, B);
                drafted = on.drafted;
                accepted = on.accepted;
                steps = on.verify_steps;
                free_run(&off, B);
                free_run(&on, B);
            }
            const double tps_off = tokens / best_off, tps_on = tokens / best_on;
            const double rate = drafted ? (double)accepted / drafted : 0.0;
            /* tokens a verify step kept per sequence: 1 drawn + its accepted drafts */
            const double kept = steps ? 1.0 + (double)accepted / steps / B : 0.0;
            printf("%-6.1f %2d %10.1f %10.1f %6.2fx %9.1f%% %12.2f %6s\n", temps[t], B, tps_off, tps_on,
                       tps_on / tps_off, 100 * rate, kept, same ? "yes" : "NO");
            cJSON *o = cJSON_CreateObject();
            cJSON_AddNumberToObject(o, "temperature", temps[t]);
            cJSON_AddNumberToObject(o, "batch", B);
            cJSON_AddNumberToObject(o, "tokens", (double)tokens);
            cJSON_AddNumberToObject(o, "off_tokens_per_s", tps_off);
            cJSON_AddNumberToObject(o, "on_tokens_per_s", tps_on);
            cJSON_AddNumberToObject(o, "speedup", tps_on / tps_off);
            cJSON_AddNumberToObject(o, "drafted", (double)drafted);
            cJSON_AddNumberToObject(o, "accepted", (double)accepted);
            cJSON_AddNumberToObject(o, "acceptance_rate", rate);
            cJSON_AddNumberToObject(o, "verify_steps", (double)steps);
            cJSON_AddBoolToObject(o, "outputs_identical", same);
            cJSON_AddItemToArray(rows, o);
        }
    if (json_out) {
        char *s = cJSON_Print(root);
        FILE *f = fopen(json_out, "w");
        if (!f || fprintf(f, "%s\n", s) < 0) {
            fprintf(stderr, "%s: cannot write %s\n", P, json_out);
            return 1;
        }
        fclose(f);
        free(s);
    }
    cJSON_Delete(root);
    for (int p = 0; p < N_PROMPTS; p++)
        free(ids[p]);
    rd_unload(&L);
    return 0;
}
