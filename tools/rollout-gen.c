/* rollout-gen - offline rollouts from a model file, through the engine.
 *   rollout-gen --model PATH (--prompt TEXT | --prompt-ids 1,2,3) [--chat] [--system TEXT]
 *               [-n N] [--max-tokens K] [--temperature T] [--top-p P] [--top-k K] [--min-p P]
 *               [--seed S] [--logprobs K] [--ignore-eos] [--stop TEXT]... [--json] [--threads N]
 *               [--backend cpu] [--spec-decode off|ngram] [--spec-max-draft D]
 * Prints the text of each sample, or with --json one object per sample per
 * line: prompt_ids, token_ids, logprobs, text, finish_reason (+ sample, seed,
 * top_logprobs when asked, stop_str and stop_text_offset when a --stop string
 * ended it). A stop string cuts the text where it starts; the token that
 * completed it stays in token_ids. --temperature 0 is greedy. Without --seed a seed
 * is drawn from the clock and reported in the JSON. --spec-decode ngram: speculative
 * decoding with n-gram drafts, up to --spec-max-draft D tokens per step (default 6; D alone
 * still means ngram, as before the flag); the same output, faster or not. */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine/serve/engine.h"
#include "base/err.h"
#include "engine/model/loader.h"
#include "tools/cli.h"

static const char *P = "rollout-gen";

static const char *finish_name(finish_reason f)
{
    return f == FINISH_STOP ? "stop" : f == FINISH_LENGTH ? "length" : f == FINISH_ABORT ? "abort" : f == FINISH_ERROR ? "error" : "none";
}

static char *decode(const tok_tokenizer *tok, const int32_t *ids, int32_t n)
{
    char *text = NULL;
    size_t len = 0;
    if (!tok || tok_decode(tok, ids, (size_t)n, &text, &len))
        return NULL;
    char *clean = cli_utf8_clean(text, len);
    free(text);
    return clean;
}

/* The stop token stays in token_ids (the learner trains on it) but not in the
 * text; after a stop string the text ends where the string starts. */
static char *sample_text(const tok_tokenizer *tok, const eng_result *r)
{
    if (r->stop_str < 0)
        return decode(tok, r->token_ids, r->finish == FINISH_STOP && r->n_tokens > 0 ? r->n_tokens - 1 : r->n_tokens);
    char *text = NULL;
    size_t len = 0;
    if (!tok || tok_decode(tok, r->token_ids, (size_t)r->n_tokens, &text, &len))
        return NULL;
    char *clean = cli_utf8_clean(text, (size_t)r->stop_text_offset < len ? (size_t)r->stop_text_offset : len);
    free(text);
    return clean;
}

static void print_json(const tok_tokenizer *tok, const eng_result *r, uint64_t seed, const char *const *stops)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "sample", r->sample_idx);
    cJSON_AddItemToObject(o, "prompt_ids", cJSON_CreateIntArray(r->prompt_ids, r->n_prompt));
    cJSON_AddItemToObject(o, "token_ids", cJSON_CreateIntArray(r->token_ids, r->n_tokens));
    cJSON *lp = cJSON_AddArrayToObject(o, "logprobs");
    for (int32_t i = 0; i < r->n_tokens; i++)
        cJSON_AddItemToArray(lp, cJSON_CreateNumber((double)r->logprobs[i]));
    if (r->logprobs_proc) {
        cJSON *pp = cJSON_AddArrayToObject(o, "logprobs_processed");
        for (int32_t i = 0; i < r->n_tokens; i++)
            cJSON_AddItemToArray(pp, cJSON_CreateNumber((double)r->logprobs_proc[i]));
    }
    if (r->n_top > 0) {
        cJSON *tops = cJSON_AddArrayToObject(o, "top_logprobs");
        for (int32_t i = 0; i < r->n_tokens; i++) {
            cJSON *row = cJSON_CreateArray();
            for (int32_t j = 0; j < r->n_top; j++) {
                cJSON *pair = cJSON_CreateArray();
                cJSON_AddItemToArray(pair, cJSON_CreateNumber(r->top_ids[(size_t)i * r->n_top + j]));
                cJSON_AddItemToArray(pair, cJSON_CreateNumber((double)r->top_logprobs[(size_t)i * r->n_top + j]));
                cJSON_AddItemToArray(row, pair);
            }
            cJSON_AddItemToArray(tops, row);
        }
    }
    char *text = sample_text(tok, r);
    cJSON_AddStringToObject(o, "text", text ? text : "");
    free(text);
    cJSON_AddStringToObject(o, "finish_reason", finish_name(r->finish));
    if (r->stop_str >= 0) {
        cJSON_AddStringToObject(o, "stop_str", stops[r->stop_str]);
        cJSON_AddNumberToObject(o, "stop_text_offset", (double)r->stop_text_offset);
    }
    cJSON_AddNumberToObject(o, "seed", (double)seed);
    char *s = cJSON_PrintUnformatted(o);
    puts(s);
    free(s);
    cJSON_Delete(o);
}

int main(int argc, char **argv)
{
    const char *model_path = NULL, *prompt = NULL, *system = NULL, *backend = "cpu";
    int32_t *ids = NULL, n_ids = 0;
    int chat = 0, json = 0, threads = 0, ignore_eos = 0, have_seed = 0;
    int32_t n = 1, max_tokens = 64, n_stops = 0, spec_max_draft = 0;
    eng_spec_mode spec = ENG_SPEC_AUTO;
    const char *stops[STOP_MAX_STRS];
    samp_params sp = samp_default();
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--model")) model_path = cli_value(P, argc, argv, &i);
        else if (!strcmp(a, "--prompt")) prompt = cli_value(P, argc, argv, &i);
        else if (!strcmp(a, "--prompt-ids")) ids = cli_ids(P, a, cli_value(P, argc, argv, &i), &n_ids);
        else if (!strcmp(a, "--system")) system = cli_value(P, argc, argv, &i);
        else if (!strcmp(a, "--chat")) chat = 1;
        else if (!strcmp(a, "--json")) json = 1;
        else if (!strcmp(a, "--ignore-eos")) ignore_eos = 1;
        else if (!strcmp(a, "--stop")) {
            if (n_stops == STOP_MAX_STRS)
                cli_die(P, "at most 16 --stop strings (STOP_MAX_STRS)%s%s", "", "");
            stops[n_stops++] = cli_value(P, argc, argv, &i);
        }
        else if (!strcmp(a, "-n") || !strcmp(a, "--n")) n = (int32_t)cli_int(P, a, cli_value(P, argc, argv, &i), 1, 4096);
        else if (!strcmp(a, "--max-tokens")) max_tokens = (int32_t)cli_int(P, a, cli_value(P, argc, argv, &i), 1, 1 << 20);
        else if (!strcmp(a, "--temperature")) sp.temperature = (float)cli_float(P, a, cli_value(P, argc, argv, &i), 0, 100);
        else if (!strcmp(a, "--top-p")) sp.top_p = (float)cli_float(P, a, cli_value(P, argc, argv, &i), 1e-6, 1);
        else if (!strcmp(a, "--top-k")) sp.top_k = (int32_t)cli_int(P, a, cli_value(P, argc, argv, &i), 0, 1 << 20);
        else if (!strcmp(a, "--min-p")) sp.min_p = (float)cli_float(P, a, cli_value(P, argc, argv, &i), 0, 1);
        else if (!strcmp(a, "--seed")) { sp.seed = (uint64_t)cli_int(P, a, cli_value(P, argc, argv, &i), 0, INT64_MAX); have_seed = 1; }
        else if (!strcmp(a, "--logprobs")) sp.logprobs_topk = (int32_t)cli_int(P, a, cli_value(P, argc, argv, &i), 0, 20);
        else if (!strcmp(a, "--processed-logprobs")) sp.processed_logprobs = 1;
        else if (!strcmp(a, "--threads")) threads = (int)cli_int(P, a, cli_value(P, argc, argv, &i), 1, 256);
        else if (!strcmp(a, "--backend")) backend = cli_value(P, argc, argv, &i);
        else if (!strcmp(a, "--spec-decode")) {
            if (eng_spec_mode_parse(cli_value(P, argc, argv, &i), &spec))
                cli_die(P, "--spec-decode: %s%s", rd_errmsg(), "");
        }
        else if (!strcmp(a, "--spec-max-draft"))
            spec_max_draft = (int32_t)cli_int(P, a, cli_value(P, argc, argv, &i), 0, SEQ_MAX_DRAFT);
        else cli_die(P, "unknown flag '%s'%s (see the comment at the top of tools/rollout-gen.c)", a, "");
    }
    if (!model_path || (!prompt == !ids))
        cli_die(P, "usage: rollout-gen --model PATH (--prompt TEXT | --prompt-ids 1,2,3) [options]%s%s", "", "");
    if (chat && !prompt)
        cli_die(P, "--chat needs --prompt TEXT%s%s", "", "");
    if (!have_seed)
        sp.seed = (uint64_t)time(NULL) ^ ((uint64_t)clock() << 20);

    rd_loaded L;
    if (rd_load(model_path, backend, threads, &L)) {
        fprintf(stderr, "%s: %s\n", P, rd_errmsg());
        return 1;
    }
    if (prompt) {
        if (!L.tok) {
            fprintf(stderr, "%s: %s has no tokenizer; use --prompt-ids\n", P, model_path);
            return 1;
        }
        size_t nn = 0;
        int rc = chat ? tok_chat(L.tok, system, prompt, &ids, &nn)
                      : tok_encode_prompt(L.tok, prompt, strlen(prompt), &ids, &nn);
        if (rc) {
            fprintf(stderr, "%s: cannot tokenize the prompt: %s\n", P, rd_errmsg());
            return 1;
        }
        n_ids = (int32_t)nn;
    }

    eng_config cfg = eng_default_config();
    cfg.backend = backend;
    cfg.eos_id = L.tok ? tok_eos(L.tok) : -1;
    cfg.eot_id = L.tok ? tok_eot(L.tok) : -1; /* as rolloutd: a chat turn ends at its own marker too */
    cfg.tok = L.tok;
    cfg.spec_decode = spec;
    cfg.spec_max_draft = spec_max_draft;
    if (n > cfg.max_num_seqs)
        cfg.max_num_seqs = n;
    if (cfg.max_batch_tokens < cfg.max_num_seqs)
        cfg.max_batch_tokens = cfg.max_num_seqs;
    engine *e;
    if (eng_create(L.m, &cfg, &e)) {
        fprintf(stderr, "%s: %s\n", P, rd_errmsg());
        return 1;
    }
    eng_request req = {.prompt = ids, .n_prompt = n_ids, .n = n, .max_tokens = max_tokens, .sp = sp,
                       .ignore_eos = ignore_eos, .stop_strs = stops, .n_stop_strs = n_stops};
    int64_t id;
    if (eng_add(e, &req, &id)) {
        fprintf(stderr, "%s: %s\n", P, rd_errmsg());
        return 2;
    }
    eng_result *res = calloc((size_t)n, sizeof *res);
    int got = 0;
    while (got < n) {
        int rc = eng_step(e);
        if (rc < 0) {
            fprintf(stderr, "%s: step failed: %s\n", P, rd_errmsg());
            return 1;
        }
        got += eng_collect(e, res + got, n - got);
    }
    /* Print in sample order. */
    for (int32_t want = 0; want < n; want++)
        for (int i = 0; i < n; i++) {
            if (res[i].sample_idx != want)
                continue;
            if (json) {
                print_json(L.tok, &res[i], sp.seed, stops);
            } else {
                char *text = sample_text(L.tok, &res[i]);
                if (n > 1)
                    printf("--- sample %d (%s)\n", want, finish_name(res[i].finish));
                printf("%s\n", text ? text : "");
                free(text);
            }
            eng_result_free(&res[i]);
        }
    free(res);
    free(ids);
    eng_destroy(e);
    rd_unload(&L);
    return 0;
}
