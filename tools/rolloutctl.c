/* rolloutctl - command-line client of a running rolloutd (client/rd_client.h).
 *   rolloutctl [--connect URL] generate (--prompt TEXT | --prompt-ids 1,2,3) [--chat] [-n N]
 *              [--max-tokens K] [--temperature T] [--top-p P] [--top-k K] [--min-p P] [--seed S]
 *              [--logprobs K] [--processed-logprobs] [--ignore-eos] [--json] [--model PATH]
 *   rolloutctl [--connect URL] status [--json]
 *   rolloutctl [--connect URL] bench [--clients C] [--requests R] [--n N] [--window W] [--seed S]
 *              [--max-tokens K] [--json]
 *   rolloutctl push-weights --connect URL1[,URL2,...] FILE --version V [--mode continue|drain|abort]
 *              [--dtype f32|bf16|f16] [--window W] [--chunk-mb M] [--perturb EPS] [--seed S] [--no-lane]
 *              [--fanout chain|direct] [--on-failure abort|commit] [--serve-dtype as_pushed|q8_0|q4_k|fp8] [--json]
 *   rolloutctl sync --from PEER --to URL [--wait SECONDS]
 * The default URL is tcp://127.0.0.1:7070. --auth-token-file F (or the
 * environment's ROLLOUTD_AUTH_TOKEN_FILE, or ROLLOUTD_AUTH_TOKEN holding the
 * secret itself) proves the daemon's shared secret (PROTOCOL.md §14) on every
 * connection. A tls+tcp:// URL verifies the daemon's certificate against
 * --tls-ca-file F (or ROLLOUTD_TLS_CA_FILE).
 *
 * push-weights --base OLD [--base-version B] sends each tensor of FILE as a delta against OLD's
 * (both .safetensors files or HF folders; B defaults to V - 1; PROTOCOL.md §10.14); a daemon that
 * refuses the delta gets FILE whole in the same call.
 * push-weights sends FILE (a .gguf, a .safetensors file or an HF folder) to
 * every daemon at once as weight version V (PROTOCOL.md §10), with a progress
 * line per daemon, and prints each daemon's result. A GGUF is dequantized and
 * sent as HF tensors in --dtype (default f32: bit-identical to the GGUF the
 * daemon may have loaded); safetensors go as stored (f32/f16/bf16).
 * --perturb EPS (GGUF only) multiplies every weight by 1 + EPS*u, u uniform in
 * [-1, 1) from --seed: a stand-in for a learner's gradient step. Chunks go
 * over the daemon's data lane when it offers one (--no-lane: over NNG).
 * With two or more daemons the push is a chain (PROTOCOL.md §10.11) when
 * every daemon relays and offers a data lane: this process sends each byte
 * once, to the first daemon, each daemon relays to the next, and the update
 * is committed on all only once every one has verified and built it; a
 * daemon that fails is routed around, and then --on-failure abort (the
 * default) aborts the update everywhere, commit commits it on the rest.
 * --fanout direct sends everything to every daemon at once, each committing
 * on its own (also what a chain falls back to without lanes, e.g. under TLS
 * or with --no-lane). --json prints one object per daemon, with "fanout"
 * and "hop" (0: fed by this process, k: k daemons relayed the chunks first).
 *
 * sync asks the daemon at PEER to push the weights it serves, at their
 * version, to the daemon at URL (WEIGHTS_SYNC, PROTOCOL.md §10.13): a node
 * that restarted rejoins without the learner sending anything. --wait S
 * waits up to S seconds until URL serves that version (exit 1 if not).
 *
 * generate prints what rollout-gen prints: the text of each sample, or with
 * --json one object per sample per line (sample, prompt_ids, token_ids,
 * logprobs, text, finish_reason, seed). A text prompt is sent as text (the
 * daemon tokenizes it, with --chat through its chat template); results carry
 * token ids only, so the text and the prompt ids printed come from the
 * tokenizer in --model PATH (default models/SmolLM2-135M-Instruct.Q4_1.gguf,
 * only its tokenizer is read), which must match the daemon's vocabulary.
 *
 * bench is a closed-loop load generator: C client threads, each with its own
 * connection and client id, each keeping W requests in flight, over the
 * workload rollout-bench uses (R random-token prompts of 16-256 tokens, each
 * generating 16-256 tokens, log-uniform, EOS ignored, seeds S + i; --max-tokens
 * caps the generated length). It reports generated tokens/s and the request
 * round-trip latency (submit to last sample received) p50/p90/p99.
 *
 * Exit status: 0 done, 1 a failure (connection, daemon error), 2 a bad flag
 * or a request the daemon refused as invalid. */
#include <cjson/cJSON.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/clock.h"
#include "base/err.h"
#include "engine/format/gguf.h"
#include "engine/text/tokenizer.h"
#include "tools/cli.h"
#include "client/rd_client.h"
#include "client/rd_delta.h"
#include "client/rd_push.h"
#include "engine/model/loader.h"
#include "engine/format/safetensors.h"
#include "engine/update/staging.h"

static const char *P = "rolloutctl";
#define DEFAULT_MODEL "models/SmolLM2-135M-Instruct.Q4_1.gguf"

/* Prints the failure; exit status 2 when the daemon refused a request as invalid, else 1. */
static int fail(const char *what, int rc, const rdc_client *c)
{
    fprintf(stderr, "%s: %s: %s\n", P, what, rd_errmsg());
    return rc == RDC_EDAEMON && c && rdc_error_code(c) == PROTO_E_INVALID_PARAMS ? 2 : 1;
}

/* Opens url and says HELLO as a new client. */
static int connect_hello(const char *url, const char *name, rdc_client **out)
{
    int rc = rdc_open(url, out);
    if (!rc && (rc = rdc_hello(*out, 0, name))) {
        rdc_close(*out);
        *out = NULL;
    }
    return rc;
}

/* ---- generate ---- */

typedef struct {
    gguf_file *g;
    tok_tokenizer *tok;
} local_tok;

static int load_tok(const char *path, local_tok *lt)
{
    memset(lt, 0, sizeof *lt);
    int rc = gguf_open(path, &lt->g);
    if (!rc)
        rc = tok_load(lt->g, &lt->tok);
    return rc;
}

static char *decode(const tok_tokenizer *tok, const int32_t *ids, uint32_t n)
{
    char *text = NULL;
    size_t len = 0;
    if (tok_decode(tok, ids, n, &text, &len))
        return NULL;
    char *clean = cli_utf8_clean(text, len);
    free(text);
    return clean;
}

/* The stop token stays in token_ids (the learner trains on it) but not in the text. */
static uint32_t text_len(const proto_result *r)
{
    return r->finish == PROTO_FINISH_STOP && r->n_tokens > 0 ? r->n_tokens - 1 : r->n_tokens;
}

static void print_json(const tok_tokenizer *tok, const proto_result *r, const int32_t *prompt, uint32_t n_prompt)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "sample", r->sample_idx);
    cJSON_AddItemToObject(o, "prompt_ids", cJSON_CreateIntArray(prompt, (int)n_prompt));
    cJSON_AddItemToObject(o, "token_ids", cJSON_CreateIntArray(r->token_ids, (int)r->n_tokens));
    cJSON *lp = cJSON_AddArrayToObject(o, "logprobs");
    for (uint32_t i = 0; i < r->n_tokens; i++)
        cJSON_AddItemToArray(lp, cJSON_CreateNumber((double)r->logprobs[i]));
    if (r->logprobs_processed) {
        cJSON *pp = cJSON_AddArrayToObject(o, "logprobs_processed");
        for (uint32_t i = 0; i < r->n_tokens; i++)
            cJSON_AddItemToArray(pp, cJSON_CreateNumber((double)r->logprobs_processed[i]));
    }
    if (r->top_k > 0) {
        cJSON *tops = cJSON_AddArrayToObject(o, "top_logprobs");
        for (uint32_t i = 0; i < r->n_tokens; i++) {
            cJSON *row = cJSON_CreateArray();
            for (uint32_t j = 0; j < r->top_k; j++) {
                int32_t id = r->top_ids[(size_t)i * r->top_k + j];
                cJSON *pair = cJSON_CreateArray();
                cJSON_AddItemToArray(pair, cJSON_CreateNumber(id));
                cJSON_AddItemToArray(pair, cJSON_CreateNumber((double)r->top_logprobs[(size_t)i * r->top_k + j]));
                cJSON_AddItemToArray(row, pair);
            }
            cJSON_AddItemToArray(tops, row);
        }
    }
    char *text = decode(tok, r->token_ids, text_len(r));
    cJSON_AddStringToObject(o, "text", text ? text : "");
    free(text);
    cJSON_AddStringToObject(o, "finish_reason", rdc_finish_name(r->finish));
    char seed[24]; /* exact: a daemon-picked seed can pass 2^53 */
    snprintf(seed, sizeof seed, "%llu", (unsigned long long)r->seed);
    cJSON_AddRawToObject(o, "seed", seed);
    char *s = cJSON_PrintUnformatted(o);
    puts(s);
    free(s);
    cJSON_Delete(o);
}

static int cmd_generate(const char *url, int argc, char **argv)
{
    const char *prompt = NULL, *model_path = DEFAULT_MODEL;
    int32_t *ids = NULL, n_ids = 0;
    int chat = 0, json = 0;
    proto_request q = {.n = 1, .max_tokens = 64, .temperature = 1.0f, .top_p = 1.0f};
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--prompt")) prompt = cli_value(P, argc, argv, &i);
        else if (!strcmp(a, "--prompt-ids")) { free(ids); ids = cli_ids(P, a, cli_value(P, argc, argv, &i), &n_ids); }
        else if (!strcmp(a, "--chat")) chat = 1;
        else if (!strcmp(a, "--json")) json = 1;
        else if (!strcmp(a, "--model")) model_path = cli_value(P, argc, argv, &i);
        else if (!strcmp(a, "-n") || !strcmp(a, "--n")) q.n = (uint32_t)cli_int(P, a, cli_value(P, argc, argv, &i), 1, 4096);
        else if (!strcmp(a, "--max-tokens")) q.max_tokens = (uint32_t)cli_int(P, a, cli_value(P, argc, argv, &i), 1, 1 << 20);
        else if (!strcmp(a, "--temperature")) q.temperature = (float)cli_float(P, a, cli_value(P, argc, argv, &i), 0, 100);
        else if (!strcmp(a, "--top-p")) q.top_p = (float)cli_float(P, a, cli_value(P, argc, argv, &i), 1e-6, 1);
        else if (!strcmp(a, "--top-k")) q.top_k = (int32_t)cli_int(P, a, cli_value(P, argc, argv, &i), 0, 1 << 20);
        else if (!strcmp(a, "--min-p")) q.min_p = (float)cli_float(P, a, cli_value(P, argc, argv, &i), 0, 1);
        else if (!strcmp(a, "--seed")) { q.seed = (uint64_t)cli_int(P, a, cli_value(P, argc, argv, &i), 0, INT64_MAX); q.flags |= PROTO_REQ_HAS_SEED; }
        else if (!strcmp(a, "--logprobs")) q.logprobs_topk = (uint32_t)cli_int(P, a, cli_value(P, argc, argv, &i), 0, 20);
        else if (!strcmp(a, "--processed-logprobs")) q.flags |= PROTO_REQ_PROCESSED_LOGPROBS;
        else if (!strcmp(a, "--ignore-eos")) q.flags |= PROTO_REQ_IGNORE_EOS;
        else if (!strcmp(a, "--system")) cli_die(P, "--system is not supported: protocol version 1 sends the prompt as one user turn%s%s", "", "");
        else cli_die(P, "generate: unknown flag '%s'%s (see the comment at the top of tools/rolloutctl.c)", a, "");
    }
    if (!prompt == !ids)
        cli_die(P, "usage: rolloutctl generate (--prompt TEXT | --prompt-ids 1,2,3) [options]%s%s", "", "");
    if (chat && !prompt)
        cli_die(P, "--chat needs --prompt TEXT%s%s", "", "");
    if (prompt && !*prompt)
        cli_die(P, "--prompt is empty; expected some text%s%s", "", "");

    local_tok lt;
    if (load_tok(model_path, &lt)) {
        fprintf(stderr, "%s: cannot load the tokenizer from %s (needed to print text and prompt ids; pass --model "
                "PATH of the daemon's model): %s\n", P, model_path, rd_errmsg());
        return 1;
    }
    /* The prompt ids to print; a text prompt is still sent as text for the daemon to tokenize. */
    if (prompt) {
        size_t nn = 0;
        int rc = chat ? tok_chat(lt.tok, NULL, prompt, &ids, &nn)
                      : tok_encode_prompt(lt.tok, prompt, strlen(prompt), &ids, &nn);
        if (rc) {
            fprintf(stderr, "%s: cannot tokenize the prompt: %s\n", P, rd_errmsg());
            return 1;
        }
        n_ids = (int32_t)nn;
    }

    rdc_client *c;
    int rc = connect_hello(url, "rolloutctl generate", &c);
    if (rc)
        return fail(url, rc, NULL);
    const proto_hello_ok *info = rdc_info(c);
    if ((int32_t)info->vocab_size != tok_vocab_size(lt.tok)) {
        fprintf(stderr, "%s: the daemon's vocabulary has %u tokens but %s has %d; pass --model PATH of the "
                "daemon's model\n", P, info->vocab_size, model_path, tok_vocab_size(lt.tok));
        return 1;
    }
    uint32_t need = PROTO_HELLO_OK_TEXT | (chat ? PROTO_HELLO_OK_CHAT : 0);
    if (prompt && (info->flags & need) == need) {
        q.flags |= PROTO_REQ_PROMPT_IS_TEXT | (chat ? PROTO_REQ_CHAT_TEMPLATE : 0);
        q.text.ptr = prompt;
        q.text.len = (uint32_t)strlen(prompt);
    } else { /* token ids (or a daemon without a tokenizer: ours did it) */
        q.prompt = ids;
        q.n_prompt = (uint32_t)n_ids;
    }
    rdc_sample *res;
    size_t n_res;
    if ((rc = rdc_run(c, &q, 1, &res, &n_res)))
        return fail("generate", rc, c);
    rdc_bye(c, 0, NULL);
    rdc_close(c);

    for (uint32_t want = 0; want < q.n; want++)
        for (size_t i = 0; i < n_res; i++) {
            const proto_result *r = &res[i].r;
            if (r->sample_idx != want)
                continue;
            if (r->n_prompt != (uint32_t)n_ids)
                fprintf(stderr, "%s: warning: the daemon's prompt has %u tokens, %s gives %d\n", P, r->n_prompt,
                        model_path, n_ids);
            if (json) {
                print_json(lt.tok, r, ids, (uint32_t)n_ids);
            } else {
                char *text = decode(lt.tok, r->token_ids, text_len(r));
                if (q.n > 1)
                    printf("--- sample %u (%s)\n", want, rdc_finish_name(r->finish));
                printf("%s\n", text ? text : "");
                free(text);
            }
        }
    rdc_samples_free(res, n_res);
    free(ids);
    tok_free(lt.tok);
    gguf_close(lt.g);
    return 0;
}

/* ---- status ---- */

static void print_value(const cJSON *v)
{
    if (cJSON_IsString(v))
        printf("%s", v->valuestring);
    else if (cJSON_IsNumber(v))
        printf("%.6g", v->valuedouble);
    else {
        char *s = cJSON_PrintUnformatted(v);
        printf("%s", s ? s : "?");
        free(s);
    }
}

static int cmd_status(const char *url, int argc, char **argv)
{
    int json = 0;
    for (int i = 0; i < argc; i++) {
        if (!strcmp(argv[i], "--json")) json = 1;
        else cli_die(P, "status: unknown flag '%s'%s (expected --json)", argv[i], "");
    }
    rdc_client *c;
    int rc = rdc_open(url, &c);
    if (rc)
        return fail(url, rc, NULL);
    char *doc;
    if ((rc = rdc_status(c, &doc)))
        return fail("status", rc, c);
    rdc_close(c);
    if (json) {
        puts(doc);
        free(doc);
        return 0;
    }
    cJSON *o = cJSON_Parse(doc);
    if (!cJSON_IsObject(o)) {
        fprintf(stderr, "%s: the status document is not a JSON object: %.200s\n", P, doc);
        return 1;
    }
    /* One line per top-level key; objects as key=value pairs. */
    for (const cJSON *it = o->child; it; it = it->next) {
        printf("%-16s ", it->string);
        if (cJSON_IsObject(it)) {
            for (const cJSON *f = it->child; f; f = f->next) {
                printf("%s=", f->string);
                print_value(f);
                printf(f->next ? "  " : "");
            }
        } else {
            print_value(it);
        }
        printf("\n");
    }
    cJSON_Delete(o);
    free(doc);
    return 0;
}

/* ---- bench ---- */

/* splitmix64 and the lengths of rollout-bench's workload generator. */
static uint64_t mix(uint64_t *s)
{
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}
static double unif(uint64_t *s) { return (mix(s) >> 11) * (1.0 / 9007199254740992.0); }
static int32_t tail_len(uint64_t *s) { return (int32_t)floor(16.0 * pow(16.0, unif(s))); }

typedef struct {
    const char *url;
    const proto_request *reqs;  /* [R] the workload */
    int R, window;
    atomic_int next;            /* next request index to take */
    double *latency;            /* [R] seconds, submit to last sample */
    pthread_barrier_t start;
    atomic_int failed;
} bench_shared;

typedef struct {
    bench_shared *sh;
    int64_t tokens;             /* generated tokens received */
    double t_end;               /* when its last request finished */
    int rc;
    char err[512];
} bench_thread;

typedef struct {
    int idx;                    /* request index, -1 = free */
    uint64_t client_req_id;
    uint32_t left;              /* samples still to arrive */
    double t0;
} bench_slot;

static void *bench_main(void *arg)
{
    bench_thread *bt = arg;
    bench_shared *sh = bt->sh;
    rdc_client *c = NULL;
    int rc = connect_hello(sh->url, "rolloutctl bench", &c);
    pthread_barrier_wait(&sh->start);
    if (rc)
        goto done;
    bench_slot *slots = calloc((size_t)sh->window, sizeof *slots);
    for (int s = 0; s < sh->window; s++)
        slots[s].idx = -1;
    int inflight = 0, pending = -1; /* pending: a request refused BUSY, to resubmit */
    while (!atomic_load(&sh->failed)) {
        while (inflight < sh->window) {
            int idx = pending >= 0 ? pending : atomic_fetch_add(&sh->next, 1);
            if (idx >= sh->R)
                break;
            proto_request q = sh->reqs[idx];
            q.client_req_id = rdc_next_req_id(c);
            proto_msg reply;
            double t0 = clock_now_s();
            if ((rc = rdc_submit(c, &q, 1, &reply)))
                goto out;
            uint32_t st = reply.submit_ok.items[0].status;
            if (st && st != PROTO_E_BUSY) {
                rc = rd_fail(RDC_EDAEMON, "request %d refused: %s: %s", idx, proto_err_name(st),
                             reply.submit_ok.items[0].message.ptr);
                proto_msg_free(&reply);
                goto out;
            }
            proto_msg_free(&reply);
            if (st == PROTO_E_BUSY) {
                pending = idx;
                break;
            }
            pending = -1;
            for (int s = 0; s < sh->window; s++)
                if (slots[s].idx < 0) {
                    slots[s] = (bench_slot){.idx = idx, .client_req_id = q.client_req_id, .left = q.n, .t0 = t0};
                    break;
                }
            inflight++;
        }
        if (inflight == 0 && pending < 0)
            break;
        proto_msg reply;
        uint32_t first;
        if ((rc = rdc_fetch_new(c, 256, 1000, &reply, &first)))
            goto out;
        double t = clock_now_s();
        for (uint32_t i = first; i < reply.results.n_results; i++) {
            const proto_result *r = &reply.results.results[i];
            bt->tokens += r->n_tokens;
            for (int s = 0; s < sh->window; s++)
                if (slots[s].idx >= 0 && slots[s].client_req_id == r->client_req_id && --slots[s].left == 0) {
                    sh->latency[slots[s].idx] = t - slots[s].t0;
                    slots[s].idx = -1;
                    inflight--;
                    bt->t_end = t;
                }
        }
        proto_msg_free(&reply);
    }
    proto_msg reply;
    if (!(rc = rdc_fetch(c, 0, 0, &reply))) /* ack the last results */
        proto_msg_free(&reply);
    rdc_bye(c, 0, NULL);
out:
    free(slots);
done:
    if (rc) {
        bt->rc = rc;
        snprintf(bt->err, sizeof bt->err, "%s", rd_errmsg());
        atomic_store(&sh->failed, 1);
    }
    rdc_close(c);
    return NULL;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Nearest-rank percentile of sorted v[n]. */
static double pct(const double *v, int n, double p)
{
    int k = (int)ceil(p / 100.0 * n);
    return v[k < 1 ? 0 : k - 1];
}

static int cmd_bench(const char *url, int argc, char **argv)
{
    int C = 4, R = 64, n = 4, W = 1, json = 0;
    int32_t cap = 0;
    uint64_t seed = 1;
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--clients")) C = (int)cli_int(P, a, cli_value(P, argc, argv, &i), 1, 1024);
        else if (!strcmp(a, "--requests")) R = (int)cli_int(P, a, cli_value(P, argc, argv, &i), 1, 1000000);
        else if (!strcmp(a, "--n") || !strcmp(a, "-n")) n = (int)cli_int(P, a, cli_value(P, argc, argv, &i), 1, 256);
        else if (!strcmp(a, "--window")) W = (int)cli_int(P, a, cli_value(P, argc, argv, &i), 1, 1024);
        else if (!strcmp(a, "--seed")) seed = (uint64_t)cli_int(P, a, cli_value(P, argc, argv, &i), 0, INT64_MAX);
        else if (!strcmp(a, "--max-tokens")) cap = (int32_t)cli_int(P, a, cli_value(P, argc, argv, &i), 1, 1 << 20);
        else if (!strcmp(a, "--json")) json = 1;
        else cli_die(P, "bench: unknown flag '%s'%s (see the comment at the top of tools/rolloutctl.c)", a, "");
    }
    /* One connection first, for the vocabulary the workload draws from. */
    rdc_client *c;
    int rc = connect_hello(url, "rolloutctl bench", &c);
    if (rc)
        return fail(url, rc, NULL);
    uint32_t vocab = rdc_info(c)->vocab_size;
    uint32_t max_n = rdc_info(c)->max_n;
    rdc_bye(c, 0, NULL);
    rdc_close(c);
    if (vocab <= 100) {
        fprintf(stderr, "%s: the daemon's vocabulary has %u tokens; the bench workload needs more than 100\n", P, vocab);
        return 1;
    }
    if (max_n && (uint32_t)n > max_n)
    {
        fprintf(stderr, "%s: --n %d exceeds the daemon's max_n %u\n", P, n, max_n);
        return 2;
    }

    uint64_t rng = seed;
    proto_request *reqs = calloc((size_t)R, sizeof *reqs);
    int32_t **prompts = calloc((size_t)R, sizeof *prompts);
    int64_t work_tokens = 0;
    for (int r = 0; r < R; r++) {
        int32_t np = tail_len(&rng), gen = tail_len(&rng);
        if (cap && gen > cap)
            gen = cap;
        prompts[r] = malloc(sizeof(int32_t) * (size_t)np);
        for (int32_t i = 0; i < np; i++)
            prompts[r][i] = 100 + (int32_t)(mix(&rng) % (uint64_t)(vocab - 100));
        reqs[r] = (proto_request){.n = (uint32_t)n, .max_tokens = (uint32_t)gen, .temperature = 1.0f, .top_p = 1.0f,
                                  .seed = seed + (uint64_t)r, .flags = PROTO_REQ_HAS_SEED | PROTO_REQ_IGNORE_EOS,
                                  .n_prompt = (uint32_t)np, .prompt = prompts[r]};
        work_tokens += (int64_t)gen * n;
    }

    bench_shared sh = {.url = url, .reqs = reqs, .R = R, .window = W};
    atomic_init(&sh.next, 0);
    atomic_init(&sh.failed, 0);
    sh.latency = calloc((size_t)R, sizeof *sh.latency);
    pthread_barrier_init(&sh.start, NULL, (unsigned)C + 1);
    bench_thread *bt = calloc((size_t)C, sizeof *bt);
    pthread_t *th = calloc((size_t)C, sizeof *th);
    for (int i = 0; i < C; i++) {
        bt[i].sh = &sh;
        if (pthread_create(&th[i], NULL, bench_main, &bt[i])) {
            fprintf(stderr, "%s: cannot start client thread %d\n", P, i);
            return 1;
        }
    }
    pthread_barrier_wait(&sh.start);
    double t0 = clock_now_s(), t_end = t0;
    int64_t tokens = 0;
    for (int i = 0; i < C; i++) {
        pthread_join(th[i], NULL);
        tokens += bt[i].tokens;
        if (bt[i].t_end > t_end)
            t_end = bt[i].t_end;
    }
    for (int i = 0; i < C; i++)
        if (bt[i].rc) {
            fprintf(stderr, "%s: bench client %d: %s\n", P, i, bt[i].err);
            return 1;
        }
    double dt = t_end - t0;
    qsort(sh.latency, (size_t)R, sizeof *sh.latency, cmp_double);
    double mean = 0;
    for (int i = 0; i < R; i++)
        mean += sh.latency[i] / R;
    double p50 = pct(sh.latency, R, 50), p90 = pct(sh.latency, R, 90), p99 = pct(sh.latency, R, 99);
    double tps = dt > 0 ? tokens / dt : 0, rps = dt > 0 ? R / dt : 0;
    if (json) {
        cJSON *o = cJSON_CreateObject();
        cJSON_AddNumberToObject(o, "clients", C);
        cJSON_AddNumberToObject(o, "requests", R);
        cJSON_AddNumberToObject(o, "n", n);
        cJSON_AddNumberToObject(o, "window", W);
        cJSON_AddNumberToObject(o, "seed", (double)seed);
        cJSON_AddNumberToObject(o, "seconds", dt);
        cJSON_AddNumberToObject(o, "generated_tokens", (double)tokens);
        cJSON_AddNumberToObject(o, "workload_tokens", (double)work_tokens);
        cJSON_AddNumberToObject(o, "tokens_per_s", tps);
        cJSON_AddNumberToObject(o, "requests_per_s", rps);
        cJSON *l = cJSON_AddObjectToObject(o, "latency_ms");
        cJSON_AddNumberToObject(l, "p50", 1e3 * p50);
        cJSON_AddNumberToObject(l, "p90", 1e3 * p90);
        cJSON_AddNumberToObject(l, "p99", 1e3 * p99);
        cJSON_AddNumberToObject(l, "mean", 1e3 * mean);
        cJSON_AddNumberToObject(l, "max", 1e3 * sh.latency[R - 1]);
        char *s = cJSON_PrintUnformatted(o);
        puts(s);
        free(s);
        cJSON_Delete(o);
    } else {
        printf("workload: %d requests x n=%d, %lld generated tokens, %d clients x window %d, seed %llu\n", R, n,
               (long long)work_tokens, C, W, (unsigned long long)seed);
        printf("%12s %10s %10s %10s %10s %10s %8s\n", "tokens/s", "req/s", "p50 ms", "p90 ms", "p99 ms", "max ms", "secs");
        printf("%12.1f %10.2f %10.1f %10.1f %10.1f %10.1f %8.2f\n", tps, rps, 1e3 * p50, 1e3 * p90, 1e3 * p99,
               1e3 * sh.latency[R - 1], dt);
    }
    for (int r = 0; r < R; r++)
        free(prompts[r]);
    free(prompts);
    free(reqs);
    free(sh.latency);
    free(bt);
    free(th);
    pthread_barrier_destroy(&sh.start);
    return 0;
}

/* Deterministic noise for --perturb: splitmix64 of (seed, tensor, element). */
static double noise(uint64_t seed, uint64_t t, uint64_t e)
{
    uint64_t z = seed ^ (t * 0x9e3779b97f4a7c15ull) ^ (e * 0xbf58476d1ce4e5b9ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    return (double)(z >> 11) / (double)(1ull << 53) * 2.0 - 1.0;
}

static int cmd_push(const char *urls, int argc, char **argv)
{
    const char *file = NULL;
    long long version = -1;
    int mode = PROTO_MODE_CONTINUE, json = 0;
    st_dtype dtype = ST_F32;
    double perturb = 0;
    uint64_t seed = 1;
    rdp_options o = {.window = 4, .chunk_bytes = 16u << 20, .client_name = "rolloutctl push-weights"};
    const char *base_file = NULL;
    long long base_version = -1;
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--version")) version = cli_int(P, a, cli_value(P, argc, argv, &i), 1, INT64_MAX);
        else if (!strcmp(a, "--base")) base_file = cli_value(P, argc, argv, &i);
        else if (!strcmp(a, "--base-version")) base_version = cli_int(P, a, cli_value(P, argc, argv, &i), 0, INT64_MAX);
        else if (!strcmp(a, "--mode")) {
            const char *v = cli_value(P, argc, argv, &i);
            if (!strcmp(v, "continue")) mode = PROTO_MODE_CONTINUE;
            else if (!strcmp(v, "drain")) mode = PROTO_MODE_DRAIN;
            else if (!strcmp(v, "abort")) mode = PROTO_MODE_ABORT;
            else cli_die(P, "--mode '%s'%s: expected continue, drain or abort", v, "");
        } else if (!strcmp(a, "--dtype")) {
            const char *v = cli_value(P, argc, argv, &i);
            if (st_dtype_parse(v, &dtype) || (dtype != ST_F32 && dtype != ST_BF16 && dtype != ST_F16))
                cli_die(P, "--dtype '%s'%s: expected f32, bf16 or f16", v, "");
        } else if (!strcmp(a, "--window")) o.window = (uint32_t)cli_int(P, a, cli_value(P, argc, argv, &i), 1, 1024);
        else if (!strcmp(a, "--chunk-mb")) o.chunk_bytes = (uint32_t)cli_int(P, a, cli_value(P, argc, argv, &i), 1, 1024) << 20;
        else if (!strcmp(a, "--perturb")) {
            const char *v = cli_value(P, argc, argv, &i);
            char *end;
            perturb = strtod(v, &end);
            if (*end || !(perturb >= 0 && perturb < 1))
                cli_die(P, "--perturb '%s'%s: expected a number in [0, 1)", v, "");
        } else if (!strcmp(a, "--seed")) seed = (uint64_t)cli_int(P, a, cli_value(P, argc, argv, &i), 0, INT64_MAX);
        else if (!strcmp(a, "--json")) json = 1;
        else if (!strcmp(a, "--no-lane")) o.no_lane = 1;
        else if (!strcmp(a, "--fanout")) {
            const char *v = cli_value(P, argc, argv, &i);
            if (!strcmp(v, "chain")) o.fanout = RDP_FANOUT_CHAIN;
            else if (!strcmp(v, "direct")) o.fanout = RDP_FANOUT_DIRECT;
            else cli_die(P, "--fanout '%s'%s: expected chain or direct", v, "");
        } else if (!strcmp(a, "--serve-dtype")) { /* this push's, over each daemon's config (version 3) */
            const char *v = cli_value(P, argc, argv, &i);
            upd_serve sv;
            if (upd_serve_parse(v, &sv))
                cli_die(P, "--serve-dtype '%s'%s: expected as_pushed, q8_0, q4_k or fp8", v, "");
            o.serve_dtype = (uint8_t)(PROTO_SERVE_AS_PUSHED + sv);
        } else if (!strcmp(a, "--on-failure")) {
            const char *v = cli_value(P, argc, argv, &i);
            if (!strcmp(v, "abort")) o.on_failure = RDP_ON_FAILURE_ABORT;
            else if (!strcmp(v, "commit")) o.on_failure = RDP_ON_FAILURE_COMMIT;
            else cli_die(P, "--on-failure '%s'%s: expected abort or commit", v, "");
        }
        else if (a[0] == '-') cli_die(P, "push-weights: unknown flag '%s'%s", a, "");
        else if (!file) file = a;
        else cli_die(P, "push-weights: a second FILE '%s'%s; expected one", a, "");
    }
    if (!file || version < 1)
        cli_die(P, "usage: rolloutctl push-weights --connect URL1[,URL2,...] FILE --version V [--mode M]%s%s", "", "");
    o.version = (uint64_t)version;
    o.mode = (uint8_t)mode;
    o.progress = !json;

    /* The tensors: dequantized from GGUF, or mapped from safetensors. */
    size_t len = strlen(file);
    int is_gguf = len > 5 && !strcmp(file + len - 5, ".gguf");
    rd_loaded L = {0};
    model_hf_tensor *mt = NULL;
    size_t n_mt = 0;
    rdp_source src = {0};
    rdp_tensor *ts = NULL;
    int n_ts = 0, rc;
    if (is_gguf) {
        if ((rc = rd_load(file, "cpu", 0, &L)) || (rc = model_export_mem(L.m, perturb > 0 ? ST_F32 : dtype, &mt, &n_mt))) {
            fprintf(stderr, "%s: %s: %s\n", P, file, rd_errmsg());
            rd_unload(&L);
            return 1;
        }
        ts = calloc(n_mt, sizeof *ts);
        for (size_t i = 0; ts && i < n_mt; i++) {
            model_hf_tensor *t = &mt[i];
            if (perturb > 0) {
                /* Perturb in f32, then convert to the wire dtype in place. */
                float *w = (float *)t->data;
                size_t ne = t->nbytes / 4;
                for (size_t e = 0; e < ne; e++)
                    w[e] = (float)(w[e] * (1.0 + perturb * noise(seed, i, e)));
                if (dtype != ST_F32) {
                    uint16_t *h = (uint16_t *)t->data;
                    for (size_t e = 0; e < ne; e++)
                        h[e] = dtype == ST_BF16 ? rd_f32_to_bf16(w[e]) : st_f32_to_f16(w[e]);
                    t->nbytes = ne * 2;
                    t->dtype = dtype;
                }
            }
            ts[n_ts++] = (rdp_tensor){.name = t->name, .dtype = t->dtype == ST_F32 ? PROTO_DTYPE_F32
                                                               : t->dtype == ST_BF16 ? PROTO_DTYPE_BF16 : PROTO_DTYPE_F16,
                                      .n_dims = (uint8_t)t->n_dims, .nbytes = t->nbytes, .data = t->data,
                                      .shape = {(uint64_t)t->shape[0], (uint64_t)t->shape[1]}};
        }
    } else {
        if (perturb > 0)
            cli_die(P, "--perturb works on a .gguf source only, got '%s'%s", file, "");
        /* Mapped as the daemon's /update_weights_from_disk maps it. */
        if ((rc = rdp_source_open(file, &src))) {
            fprintf(stderr, "%s: %s\n", P, rd_errmsg());
            return 1;
        }
        ts = src.ts;
        n_ts = src.n;
    }
    if (!ts) {
        fprintf(stderr, "%s: out of memory\n", P);
        return 1;
    }
    /* --base OLD: each tensor as a delta against OLD's (PROTOCOL.md §10.14), at --base-version
     * (default: the version before this one). */
    rdp_source bsrc = {0};
    rdd_set dset = {0};
    if (base_file) {
        if (is_gguf || perturb > 0)
            cli_die(P, "--base takes two .safetensors files or HF folders, got '%s'%s", file, "");
        if ((rc = rdp_source_open(base_file, &bsrc))) {
            fprintf(stderr, "%s: %s\n", P, rd_errmsg());
            return 1;
        }
        if ((rc = rdd_make(ts, n_ts, bsrc.ts, bsrc.n, (uint64_t)(base_version >= 0 ? base_version : version - 1),
                           &dset))) {
            fprintf(stderr, "%s: %s\n", P, rd_errmsg());
            return 1;
        }
        if (!json)
            fprintf(stderr, "%s: %d of %d tensors as deltas against %s (version %lld): %.2f%% of their elements "
                    "changed, %.1f MB to send instead of %.1f MB\n", P, dset.n_delta, n_ts, base_file,
                    base_version >= 0 ? base_version : version - 1,
                    dset.elems ? 100.0 * (double)dset.changed / (double)dset.elems : 0.0,
                    (double)dset.wire_bytes / 1e6, (double)dset.tensor_bytes / 1e6);
    }

    /* The daemons: a comma-separated list. */
    char *list = strdup(urls);
    int n_targets = 0;
    rdp_target targets[64];
    for (char *save = NULL, *u = strtok_r(list, ",", &save); u && n_targets < 64; u = strtok_r(NULL, ",", &save))
        targets[n_targets++] = (rdp_target){.url = u};
    if (!base_file) {
        rc = rdp_push(targets, n_targets, ts, n_ts, &o);
    } else {
        /* The deltas to all; a daemon refusing them (it serves another version, holds another dtype or
         * quantized) gets the whole tensors, and the daemons of a chain aborted because of it the deltas again. */
        rc = rdp_push(targets, n_targets, dset.ts, n_ts, &o);
        rdp_target redo[64], full[64];
        int ir[64], iff[64], n_redo = 0, n_full = 0;
        for (int i = 0; rc && i < n_targets; i++) {
            uint32_t e = targets[i].err_code;
            if (targets[i].rc && (e == PROTO_E_BASE_MISMATCH || e == PROTO_E_DTYPE_MISMATCH || e == PROTO_E_BASE_QUANTIZED)) {
                iff[n_full] = i;
                full[n_full++] = (rdp_target){.url = targets[i].url};
            } else if (targets[i].rc == RDP_EABORTED) {
                ir[n_redo] = i;
                redo[n_redo++] = (rdp_target){.url = targets[i].url};
            }
        }
        if (n_full) {
            rc = n_redo ? rdp_push(redo, n_redo, dset.ts, n_ts, &o) : 0;
            int rc2 = rdp_push(full, n_full, ts, n_ts, &o);
            rc = rc ? rc : rc2;
            for (int k = 0; k < n_redo; k++)
                targets[ir[k]] = redo[k];
            for (int k = 0; k < n_full; k++) {
                targets[iff[k]] = full[k];
                if (!json && !full[k].rc)
                    fprintf(stderr, "%s: %s refused the delta; pushed it whole\n", P, full[k].url);
            }
            rc = 0;
            for (int i = 0; i < n_targets; i++)
                if (targets[i].rc && !rc)
                    rc = targets[i].rc;
        }
    }
    for (int i = 0; i < n_targets; i++) {
        rdp_target *t = &targets[i];
        double mbps = t->seconds > 0 ? (double)t->bytes_acked / 1e6 / t->seconds : 0;
        if (json) {
            printf("{\"url\":\"%s\",\"ok\":%s,\"version\":%llu,\"bytes\":%llu,\"wire_bytes\":%llu,"
                   "\"seconds\":%.6f,\"transfer_seconds\":%.6f,\"mb_per_s\":%.3f,\"stall_us\":%llu,\"wait_us\":%llu,\"staged_us\":%llu,"
                   "\"n_aborted\":%u,\"retries\":%u,\"fanout\":\"%s\",\"hop\":%d,\"error_code\":%u,\"error\":",
                   t->url, t->rc ? "false" : "true", (unsigned long long)t->commit.version,
                   (unsigned long long)t->bytes_acked, (unsigned long long)t->wire_bytes, t->seconds,
                   t->transfer_seconds, mbps,
                   (unsigned long long)t->commit.stall_us, (unsigned long long)t->commit.wait_us,
                   (unsigned long long)t->commit.staged_us, t->commit.n_aborted, t->retries,
                   t->fanout == RDP_FANOUT_CHAIN ? "chain" : "direct", t->hop, t->err_code);
            cJSON *e = cJSON_CreateString(t->error);
            char *es = cJSON_PrintUnformatted(e);
            printf("%s}\n", es ? es : "\"\"");
            free(es);
            cJSON_Delete(e);
        } else if (t->rc) {
            printf("%s: FAILED: %s\n", t->url, t->error);
        } else {
            char how[48] = "";
            if (t->fanout == RDP_FANOUT_CHAIN)
                snprintf(how, sizeof how, ", chain hop %d", t->hop);
            printf("%s: version %llu serving; %.1f MB in %.2f s (%.0f MB/s)%s, swap wait %.1f ms, stall %llu us%s\n",
                   t->url, (unsigned long long)t->commit.version, (double)t->bytes_acked / 1e6, t->seconds, mbps, how,
                   (double)t->commit.wait_us / 1e3, (unsigned long long)t->commit.stall_us,
                   t->commit.n_aborted ? ", samples aborted" : "");
        }
    }
    free(list);
    rdd_free(&dset);
    rdp_source_close(&bsrc);
    if (ts != src.ts)
        free(ts);
    model_hf_tensors_free(mt, n_mt);
    rdp_source_close(&src);
    rd_unload(&L);
    return rc ? 1 : 0;
}

/* ---- sync ---- */

static int cmd_sync(int argc, char **argv)
{
    const char *from = NULL, *to = NULL;
    double wait_s = 0;
    for (int i = 0; i < argc; i++) {
        if (!strcmp(argv[i], "--from")) from = cli_value(P, argc, argv, &i);
        else if (!strcmp(argv[i], "--to")) to = cli_value(P, argc, argv, &i);
        else if (!strcmp(argv[i], "--wait")) wait_s = (double)cli_int(P, "--wait", cli_value(P, argc, argv, &i), 0, 86400);
        else cli_die(P, "sync: unknown flag '%s'%s (expected --from PEER --to URL [--wait S])", argv[i], "");
    }
    if (!from || !to)
        cli_die(P, "usage: rolloutctl sync --from PEER --to URL [--wait SECONDS]%s%s", "", "");
    rdc_client *c;
    int rc = connect_hello(from, "rolloutctl sync", &c);
    if (rc)
        return fail(from, rc, NULL);
    proto_msg req = {.type = PROTO_WEIGHTS_SYNC}, rep;
    req.weights_sync.client_id = rdc_client_id(c);
    req.weights_sync.url = (proto_str){to, (uint32_t)strlen(to)};
    if ((rc = rdc_call(c, &req, PROTO_WEIGHTS_SYNC_OK, RDC_TIMEOUT_MS, &rep)))
        return fail("sync", rc, c);
    uint64_t version = rep.weights_sync_ok.version;
    proto_msg_free(&rep);
    rdc_bye(c, 0, NULL);
    rdc_close(c);
    printf("%s is pushing version %llu to %s\n", from, (unsigned long long)version, to);
    if (wait_s <= 0)
        return 0;
    double deadline = clock_now_s() + wait_s;
    while (clock_now_s() < deadline) {
        rdc_client *t;
        if (!connect_hello(to, "rolloutctl sync --wait", &t)) {
            uint64_t serving = rdc_info(t)->weight_version;
            rdc_bye(t, 0, NULL);
            rdc_close(t);
            if (serving >= version) {
                printf("%s serves version %llu\n", to, (unsigned long long)serving);
                return 0;
            }
        }
        struct timespec ts = {0, 200 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    fprintf(stderr, "%s: sync: %s did not serve version %llu within %.0f s\n", P, to, (unsigned long long)version,
            wait_s);
    return 1;
}

int main(int argc, char **argv)
{
    const char *url = RDC_DEFAULT_URL;
    int i = 1;
    for (; i < argc; i++) {
        if (!strcmp(argv[i], "--connect")) url = cli_value(P, argc, argv, &i);
        else if (!strcmp(argv[i], "--auth-token-file")) setenv("ROLLOUTD_AUTH_TOKEN_FILE", cli_value(P, argc, argv, &i), 1);
        else if (!strcmp(argv[i], "--tls-ca-file")) setenv("ROLLOUTD_TLS_CA_FILE", cli_value(P, argc, argv, &i), 1);
        else if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            printf("usage: rolloutctl [--connect URL] [--auth-token-file F] (generate | status | bench | push-weights | "
                   "sync) [flags]\n"
                   "  push-weights --connect URL1[,URL2,...] FILE --version V [--mode continue|drain|abort]\n"
                   "      [--dtype f32|bf16|f16] [--window W] [--chunk-mb M] [--perturb EPS] [--seed S] [--no-lane]\n"
                   "      [--fanout chain|direct] [--on-failure abort|commit] [--serve-dtype as_pushed|q8_0|q4_k|fp8] [--json]\n"
                   "      --fanout: chain (the default for 2+ daemons with data lanes) sends each byte once and\n"
                   "      relays it daemon to daemon, committing on all once all are ready; direct sends to each.\n"
                   "      --on-failure (chain): abort everywhere (default) or commit on the daemons that have it.\n"
                   "  sync --from PEER --to URL [--wait SECONDS]: PEER pushes the weights it serves to URL\n"
                   "see the comment at the top of tools/rolloutctl.c for each command's flags\n");
            return 0;
        } else break;
    }
    if (i >= argc)
        cli_die(P, "usage: rolloutctl [--connect URL] (generate | status | bench | push-weights) [flags]%s%s", "", "");
    const char *cmd = argv[i++];
    /* --connect is also accepted after the command. */
    int n = 0;
    char **rest = calloc((size_t)(argc - i + 1), sizeof *rest);
    for (; i < argc; i++) {
        if (!strcmp(argv[i], "--connect")) url = cli_value(P, argc, argv, &i);
        else rest[n++] = argv[i];
    }
    if (strncmp(url, "tcp://", 6) && strncmp(url, "tls+tcp://", 10) && strncmp(url, "ipc://", 6) &&
        strncmp(url, "inproc://", 9))
        cli_die(P, "--connect expects a URL like tcp://127.0.0.1:7070, got '%s'%s", url, "");
    int rc;
    if (!strcmp(cmd, "generate")) rc = cmd_generate(url, n, rest);
    else if (!strcmp(cmd, "status")) rc = cmd_status(url, n, rest);
    else if (!strcmp(cmd, "bench")) rc = cmd_bench(url, n, rest);
    else if (!strcmp(cmd, "push-weights")) rc = cmd_push(url, n, rest);
    else if (!strcmp(cmd, "sync")) rc = cmd_sync(n, rest);
    else cli_die(P, "unknown command '%s'%s; expected generate, status, bench, push-weights or sync", cmd, "");
    free(rest);
    return rc;
}
