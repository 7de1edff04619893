/* rollout-specbench - speculative decoding on vs off on a long-tail decode workload.
 *   rollout-specbench --model PATH [--backend cpu] [--threads T] [--batches 1,2,4] [--max-tokens 128]
 *                     [--spec-decode ngram] [--draft 6] [--reps 2] [--json-out FILE]
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
 * hidden). A benchmark, not a test: nothing here passes or fails on time. */
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

int main(int argc, char **argv)
{
    const char *model_path = NULL, *backend = "cpu";
    int threads = 2, max_tokens = 128, draft = 6, reps = 2;
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
