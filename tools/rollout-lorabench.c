/* rollout-lorabench - decode tokens/s with LoRA adapters against the base model.
 *   rollout-lorabench [--model PATH] --adapter DIR [--adapter DIR ...] [--batches 1,8,32]
 *                     [--adapters 0,1,4] [--max-tokens 64] [--prompt-len 16] [--reps 3]
 *                     [--threads 2] [--temperature 0] [--seed 1] [--backend cpu] [--json FILE]
 *
 * What it measures, and why: an RL trainer that serves many LoRA policies
 * from one base model (one adapter per run or per experiment) pays for the
 * unmerged term s * B (A x) on every row of every linear of every step
 * (engine/model/lora.h, the backend op lora_apply). This tool puts a number
 * on that price where it matters, the decode steps: for each batch size B
 * (--batches) and each count K of distinct adapters (--adapters; 0 = every
 * row the base model), B requests (n 1, a short prompt of random token ids
 * each, max_tokens new tokens, EOS ignored, greedy unless --temperature) are
 * spread round-robin over the first K adapters (row i runs under adapter
 * i % K) and run to the end on one engine that holds every --adapter DIR
 * resident (max_loras >= 4). Only the steps whose rows are all decode rows
 * are timed (a step that computed prompt rows, eng_stats.prompt_tokens, is
 * left out), so the prefill is not in the figure. tokens/s = tokens those
 * steps drew / their wall time.
 *
 * Every configuration runs in the same process on the same engine, --reps
 * times, interleaved (rep r runs each batch's configurations starting at a
 * different one), so drift on a shared machine lands on all of them alike;
 * the table gives each configuration's median tokens/s over the reps and its
 * ratio to the base (K = 0) of the same batch: the median over the reps of
 * the rep's tokens/s over that rep's base, the two measured back to back.
 * The ratio is the number to read: the absolute tokens/s move with the
 * machine's load. A second table gives the same per CPU-second (the
 * process's CPU time over the same steps), which other processes on a
 * shared machine move less than wall time.
 *
 * It also checks what it ran: row i under adapter a must give the same
 * tokens and log-prob bits whatever the batch and whatever the other rows'
 * adapters (backend.h: a row's LoRA result depends only on the row and its
 * adapter), and an adapter must change what the base model draws (else the
 * adapters were not applied). A failed check is reported, in the table's
 * footer and the JSON, and the exit status is 1; the numbers are still
 * written. A benchmark, not a test: nothing fails on time.
 *
 * --json FILE writes the configuration, the adapters (rank, alpha, the
 * file's bytes and the backend's), the model's bytes, per batch and adapter
 * count every rep's tokens/s and tokens per CPU-second, their medians and
 * ratios to the base, and the checks.
 * `make bench-lora` generates 4 rank-32 all-linear adapters and runs this. */
#include <cjson/cJSON.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "base/clock.h"
#include "base/err.h"
#include "engine/model/loader.h"
#include "engine/model/lora.h"
#include "engine/serve/engine.h"
#include "tools/cli.h"

static const char *P = "rollout-lorabench";

#define MAX_ADAPTERS 64         /* --adapter DIRs at most */
#define MAX_BATCH 256           /* the largest --batches entry */

/* The run's settings, the adapters as loaded and the rows' prompts. */
typedef struct {
    int32_t *batches, n_batches;
    int32_t *counts, n_counts;  /* distinct adapters per configuration (--adapters) */
    int32_t max_tokens, prompt_len, reps;
    float temperature;
    uint64_t seed;
    int32_t n_adapters;
    const char *dirs[MAX_ADAPTERS];
    char names[MAX_ADAPTERS][16];
    int32_t rank[MAX_ADAPTERS];
    float alpha[MAX_ADAPTERS], scale[MAX_ADAPTERS];
    int32_t n_pairs[MAX_ADAPTERS];
    uint64_t file_bytes[MAX_ADAPTERS];     /* lora_adapter.bytes: A and B as the file stores them */
    uint64_t resident_bytes[MAX_ADAPTERS]; /* eng_lora_list: what the backend keeps */
    int32_t max_batch;
    int32_t *prompts;           /* [max_batch][prompt_len] row i's prompt, the same at every batch size */
} bench;

/* One finished row kept as the reference for (row, adapter): the first
 * time that pair ran. */
typedef struct {
    int32_t n;                  /* 0: not yet seen */
    int32_t *tokens;
    float *logprobs;
} ref_row;

/* What the checks found over the whole run. */
typedef struct {
    int64_t rows_checked, rows_differing; /* against the first run of the same (row, adapter) */
    int64_t adapter_rows, adapter_rows_changed; /* adapter rows compared to the same row's base output */
    int64_t short_rows;         /* rows that did not draw max_tokens tokens */
} checks;

/* One run of one configuration. */
typedef struct {
    double decode_s;            /* wall time of the all-decode steps */
    double decode_cpu_s;        /* the process's CPU time over the same steps */
    int64_t decode_tokens, decode_steps, other_steps;
} run_out;

/* splitmix64: the prompts' generator (not the sampler's RNG). */
static uint64_t mix(uint64_t *s)
{
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* The process's CPU time (every thread), seconds. */
static double cpu_now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int cmp_double(const void *a, const void *b)
{
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(const double *v, int32_t n)
{
    double s[128];
    if (n <= 0 || n > 128)
        return 0.0;
    memcpy(s, v, sizeof(double) * (size_t)n);
    qsort(s, (size_t)n, sizeof s[0], cmp_double);
    return n % 2 ? s[n / 2] : 0.5 * (s[n / 2 - 1] + s[n / 2]);
}

/* The median over the reps of cell v's tokens/s over the base's of the same
 * rep (base[r]): each rep ran a batch's configurations back to back, so a
 * rep's ratio sees one machine state where the medians of the two columns
 * may come from different ones. */
static double median_ratio(const double *v, const double *base, int32_t reps)
{
    double q[128];
    if (reps <= 0 || reps > 128)
        return 0.0;
    for (int32_t r = 0; r < reps; r++)
        q[r] = base[r] > 0 ? v[r] / base[r] : 0.0;
    return median(q, reps);
}

/* Compares result r (row i, adapter a: -1 for the base) to the first run of
 * the pair, or keeps it as that reference; and, for an adapter row, to the
 * same row's base output when there is one. */
static int check_row(ref_row *refs, int32_t n_adapters, int32_t row, int32_t a, const eng_result *r, checks *ck)
{
    ref_row *ref = &refs[(size_t)row * (size_t)(n_adapters + 1) + (size_t)(a + 1)];
    if (ref->n == 0) {
        ref->tokens = malloc(sizeof(int32_t) * (size_t)r->n_tokens);
        ref->logprobs = malloc(sizeof(float) * (size_t)r->n_tokens);
        if (!ref->tokens || !ref->logprobs)
            return rd_fail(RD_ENOMEM, "%s: out of memory for the reference outputs", P);
        memcpy(ref->tokens, r->token_ids, sizeof(int32_t) * (size_t)r->n_tokens);
        memcpy(ref->logprobs, r->logprobs, sizeof(float) * (size_t)r->n_tokens);
        ref->n = r->n_tokens;
    } else {
        ck->rows_checked++;
        if (ref->n != r->n_tokens || memcmp(ref->tokens, r->token_ids, sizeof(int32_t) * (size_t)r->n_tokens) ||
            memcmp(ref->logprobs, r->logprobs, sizeof(float) * (size_t)r->n_tokens))
            ck->rows_differing++;
    }
    const ref_row *base = &refs[(size_t)row * (size_t)(n_adapters + 1)];
    if (a >= 0 && base->n > 0) {
        ck->adapter_rows++;
        if (base->n != r->n_tokens || memcmp(base->tokens, r->token_ids, sizeof(int32_t) * (size_t)r->n_tokens))
            ck->adapter_rows_changed++;
    }
    return 0;
}

/* Runs B rows spread round-robin over the first k adapters (k 0: the base)
 * to the end; times the steps that computed no prompt row. refs NULL: no
 * checks (the warm-up). */
static int run_once(engine *e, const bench *b, int32_t B, int32_t k, int32_t max_tokens, ref_row *refs,
                    checks *ck, run_out *out)
{
    memset(out, 0, sizeof *out);
    int rc = 0;
    for (int32_t i = 0; i < B && !rc; i++) {
        eng_request rq = {.prompt = b->prompts + (size_t)i * (size_t)b->prompt_len, .n_prompt = b->prompt_len,
                          .n = 1, .max_tokens = max_tokens, .sp = samp_default(), .ignore_eos = 1,
                          .lora = k > 0 ? b->names[i % k] : NULL, .tag = (uint64_t)i};
        rq.sp.temperature = b->temperature;
        rq.sp.seed = b->seed + (uint64_t)i;
        int64_t id;
        rc = eng_add(e, &rq, &id);
    }
    int32_t got = 0;
    eng_result res[64];
    while (!rc && got < B) {
        eng_stats s0, s1;
        eng_get_stats(e, &s0);
        const double c0 = cpu_now_s();
        const int64_t t0 = clock_now_ns();
        const int rows = eng_step(e);
        const int64_t t1 = clock_now_ns();
        const double c1 = cpu_now_s();
        if (rows < 0) {
            rc = rows;
            break;
        }
        eng_get_stats(e, &s1);
        if (rows > 0 && s1.prompt_tokens == s0.prompt_tokens) {
            out->decode_s += (double)(t1 - t0) * 1e-9;
            out->decode_cpu_s += c1 - c0;
            out->decode_tokens += s1.generated_tokens - s0.generated_tokens;
            out->decode_steps++;
        } else {
            out->other_steps++;
        }
        int n;
        while ((n = eng_collect(e, res, 64)) > 0) {
            for (int j = 0; j < n; j++) {
                const int32_t i = (int32_t)res[j].tag;
                if (res[j].n_tokens != max_tokens && ck)
                    ck->short_rows++;
                if (!rc && refs && i >= 0 && i < B)
                    rc = check_row(refs, b->n_adapters, i, k > 0 ? i % k : -1, &res[j], ck);
                eng_result_free(&res[j]);
            }
            got += n;
        }
        if (!rc && got < B && !eng_busy(e))
            rc = rd_fail(RD_EINVAL, "%s: the engine went idle with %d of %d rows collected", P, (int)got, (int)B);
    }
    return rc;
}

/* Reads every --adapter folder against the model and makes it resident in
 * e as "lora<i>" (version 1). */
static int load_adapters(engine *e, const model *m, bench *b, int32_t max_rank)
{
    for (int32_t i = 0; i < b->n_adapters; i++) {
        lora_adapter *a = NULL;
        int rc = lora_load_peft(b->dirs[i], &m->cfg, max_rank, &a);
        if (rc)
            return rc;
        snprintf(b->names[i], sizeof b->names[i], "lora%d", (int)i);
        b->rank[i] = a->rank;
        b->alpha[i] = a->alpha;
        b->scale[i] = a->scale;
        b->n_pairs[i] = a->n_pairs;
        b->file_bytes[i] = a->bytes;
        if ((rc = eng_lora_load(e, a, b->names[i], 1, 0, NULL, 0))) {
            lora_free(a);
            return rc;
        }
    }
    lora_info info[MAX_ADAPTERS];
    int32_t n = 0;
    int rc = eng_lora_list(e, info, MAX_ADAPTERS, &n);
    for (int32_t j = 0; j < n && !rc; j++)
        for (int32_t i = 0; i < b->n_adapters; i++)
            if (!strcmp(info[j].name, b->names[i]))
                b->resident_bytes[i] = info[j].bytes;
    return rc;
}

/* The largest rank among the folders, read ahead of the engine (its max_lora_rank). */
static int scan_ranks(const model *m, const bench *b, int32_t *max_rank)
{
    *max_rank = 1;
    for (int32_t i = 0; i < b->n_adapters; i++) {
        lora_adapter *a = NULL;
        int rc = lora_load_peft(b->dirs[i], &m->cfg, LORA_MAX_RANK, &a);
        if (rc)
            return rc;
        if (a->rank > *max_rank)
            *max_rank = a->rank;
        lora_free(a);
    }
    return 0;
}

/* One table: per batch, each count's median of vals (tokens per second
 * or per CPU-second), its ratio to the base (median_ratio), and the extra
 * time a token costs under adapters (1/v - 1/v_base of the medians,
 * microseconds). */
static void print_table(const bench *b, const double *vals, const char *unit)
{
    printf("\n%-6s", "batch");
    for (int32_t ki = 0; ki < b->n_counts; ki++) {
        char h[48];
        snprintf(h, sizeof h, "%d adapter%s %s", (int)b->counts[ki], b->counts[ki] == 1 ? "" : "s", unit);
        printf(" %22s", h);
        if (ki > 0)
            printf(" %7s %10s", "ratio", "+us/token");
    }
    printf("\n");
    for (int32_t bi = 0; bi < b->n_batches; bi++) {
        const double *base = vals + (size_t)bi * (size_t)b->n_counts * (size_t)b->reps;
        const double base_med = median(base, b->reps);
        printf("%-6d", (int)b->batches[bi]);
        for (int32_t ki = 0; ki < b->n_counts; ki++) {
            const double *v = vals + ((size_t)bi * (size_t)b->n_counts + (size_t)ki) * (size_t)b->reps;
            const double med = median(v, b->reps);
            printf(" %22.1f", med);
            if (ki > 0)
                printf(" %6.3fx %10.1f", median_ratio(v, base, b->reps),
                       med > 0 && base_med > 0 ? 1e6 / med - 1e6 / base_med : 0.0);
        }
        printf("\n");
    }
}

static int write_json(const char *path, const bench *b, const char *model_path, const rd_loaded *L,
                      int64_t model_file_bytes, const double *tps, const double *cps, const checks *ck, int ok)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "model", model_path);
    cJSON_AddNumberToObject(o, "model_file_bytes", (double)model_file_bytes);
    cJSON_AddNumberToObject(o, "model_weights_bytes", (double)L->m->weights_bytes);
    cJSON_AddStringToObject(o, "backend", L->be->ops->name);
    cJSON_AddNumberToObject(o, "threads", L->be->n_threads);
    cJSON_AddNumberToObject(o, "max_tokens", b->max_tokens);
    cJSON_AddNumberToObject(o, "prompt_len", b->prompt_len);
    cJSON_AddNumberToObject(o, "temperature", b->temperature);
    cJSON_AddNumberToObject(o, "reps", b->reps);
    cJSON *ad = cJSON_AddArrayToObject(o, "adapters");
    for (int32_t i = 0; i < b->n_adapters; i++) {
        cJSON *x = cJSON_CreateObject();
        cJSON_AddStringToObject(x, "name", b->names[i]);
        cJSON_AddStringToObject(x, "dir", b->dirs[i]);
        cJSON_AddNumberToObject(x, "rank", b->rank[i]);
        cJSON_AddNumberToObject(x, "alpha", b->alpha[i]);
        cJSON_AddNumberToObject(x, "scale", b->scale[i]);
        cJSON_AddNumberToObject(x, "pairs", b->n_pairs[i]);
        cJSON_AddNumberToObject(x, "file_bytes", (double)b->file_bytes[i]);
        cJSON_AddNumberToObject(x, "resident_bytes", (double)b->resident_bytes[i]);
        cJSON_AddItemToArray(ad, x);
    }
    cJSON *rs = cJSON_AddArrayToObject(o, "results");
    for (int32_t bi = 0; bi < b->n_batches; bi++) {
        const double *base = tps + (size_t)bi * (size_t)b->n_counts * (size_t)b->reps;
        const double base_med = median(base, b->reps);
        for (int32_t ki = 0; ki < b->n_counts; ki++) {
            const double *v = tps + ((size_t)bi * (size_t)b->n_counts + (size_t)ki) * (size_t)b->reps;
            const double med = median(v, b->reps);
            cJSON *x = cJSON_CreateObject();
            cJSON_AddNumberToObject(x, "batch", b->batches[bi]);
            cJSON_AddNumberToObject(x, "adapters", b->counts[ki]);
            cJSON_AddNumberToObject(x, "tokens_per_s_median", med);
            cJSON_AddNumberToObject(x, "ratio_to_base", median_ratio(v, base, b->reps));
            cJSON_AddNumberToObject(x, "ratio_of_medians", base_med > 0 ? med / base_med : 0.0);
            cJSON *reps = cJSON_AddArrayToObject(x, "tokens_per_s");
            for (int32_t r = 0; r < b->reps; r++)
                cJSON_AddItemToArray(reps, cJSON_CreateNumber(v[r]));
            const double *cbase = cps + (size_t)bi * (size_t)b->n_counts * (size_t)b->reps;
            const double *cv = cps + ((size_t)bi * (size_t)b->n_counts + (size_t)ki) * (size_t)b->reps;
            cJSON_AddNumberToObject(x, "tokens_per_cpu_s_median", median(cv, b->reps));
            cJSON_AddNumberToObject(x, "cpu_ratio_to_base", median_ratio(cv, cbase, b->reps));
            cJSON *creps = cJSON_AddArrayToObject(x, "tokens_per_cpu_s");
            for (int32_t r = 0; r < b->reps; r++)
                cJSON_AddItemToArray(creps, cJSON_CreateNumber(cv[r]));
            cJSON_AddItemToArray(rs, x);
        }
    }
    cJSON *c = cJSON_AddObjectToObject(o, "checks");
    cJSON_AddNumberToObject(c, "rows_rerun", (double)ck->rows_checked);
    cJSON_AddNumberToObject(c, "rows_rerun_differing", (double)ck->rows_differing);
    cJSON_AddNumberToObject(c, "adapter_rows", (double)ck->adapter_rows);
    cJSON_AddNumberToObject(c, "adapter_rows_changed_from_base", (double)ck->adapter_rows_changed);
    cJSON_AddNumberToObject(c, "short_rows", (double)ck->short_rows);
    cJSON_AddBoolToObject(c, "ok", ok);
    char *txt = cJSON_Print(o);
    cJSON_Delete(o);
    if (!txt)
        return rd_fail(RD_ENOMEM, "%s: out of memory for the JSON", P);
    FILE *f = fopen(path, "w");
    int rc = 0;
    if (!f || fprintf(f, "%s\n", txt) < 0)
        rc = rd_fail(RD_EIO, "%s: cannot write %s", P, path);
    if (f && fclose(f) && !rc)
        rc = rd_fail(RD_EIO, "%s: cannot write %s", P, path);
    free(txt);
    return rc;
}

int main(int argc, char **argv)
{
    const char *model_path = "models/SmolLM2-135M-Instruct.Q4_1.gguf", *backend = "cpu", *json_path = NULL;
    int threads = 2;
    bench b = {.max_tokens = 64, .prompt_len = 16, .reps = 3, .seed = 1};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--model")) model_path = cli_value(P, argc, argv, &i);
        else if (!strcmp(a, "--adapter")) {
            if (b.n_adapters == MAX_ADAPTERS)
                cli_die(P, "at most %s --adapter folders%s", "64", "");
            b.dirs[b.n_adapters++] = cli_value(P, argc, argv, &i);
        }
        else if (!strcmp(a, "--batches")) b.batches = cli_ids(P, a, cli_value(P, argc, argv, &i), &b.n_batches);
        else if (!strcmp(a, "--adapters")) b.counts = cli_ids(P, a, cli_value(P, argc, argv, &i), &b.n_counts);
        else if (!strcmp(a, "--max-tokens")) b.max_tokens = (int32_t)cli_int(P, a, cli_value(P, argc, argv, &i), 2, 4096);
        else if (!strcmp(a, "--prompt-len")) b.prompt_len = (int32_t)cli_int(P, a, cli_value(P, argc, argv, &i), 1, 1024);
        else if (!strcmp(a, "--reps")) b.reps = (int32_t)cli_int(P, a, cli_value(P, argc, argv, &i), 1, 100);
        else if (!strcmp(a, "--threads")) threads = (int)cli_int(P, a, cli_value(P, argc, argv, &i), 0, 256);
        else if (!strcmp(a, "--temperature"))
            b.temperature = (float)cli_float(P, a, cli_value(P, argc, argv, &i), 0.0, 100.0);
        else if (!strcmp(a, "--seed")) b.seed = (uint64_t)cli_int(P, a, cli_value(P, argc, argv, &i), 0, INT64_MAX);
        else if (!strcmp(a, "--backend")) backend = cli_value(P, argc, argv, &i);
        else if (!strcmp(a, "--json")) json_path = cli_value(P, argc, argv, &i);
        else cli_die(P, "unknown flag '%s'%s (see the comment at the top of tools/rollout-lorabench.c)", a, "");
    }
    static int32_t dflt_batches[3] = {1, 8, 32}, dflt_counts[3] = {0, 1, 4};
    if (!b.batches) {
        b.batches = dflt_batches;
        b.n_batches = 3;
    }
    if (!b.counts) {
        b.counts = dflt_counts;
        b.n_counts = 3;
    }
    for (int32_t i = 0; i < b.n_batches; i++) {
        if (b.batches[i] < 1 || b.batches[i] > MAX_BATCH)
            cli_die(P, "--batches: each batch must be in 1..%s%s", "256", "");
        b.max_batch = b.batches[i] > b.max_batch ? b.batches[i] : b.max_batch;
    }
    int32_t max_count = 0;
    for (int32_t i = 0; i < b.n_counts; i++)
        max_count = b.counts[i] > max_count ? b.counts[i] : max_count;
    if (b.counts[0] != 0)
        cli_die(P, "--adapters: the first count must be 0 (the base every ratio is taken against)%s%s", "", "");
    if (max_count > b.n_adapters) {
        char need[16];
        snprintf(need, sizeof need, "%d", (int)max_count);
        cli_die(P, "--adapters asks for %s distinct adapters; give that many --adapter DIR (got %s)", need,
                b.n_adapters ? "fewer" : "none");
    }

    rd_loaded L;
    if (rd_load(model_path, backend, threads, &L)) {
        fprintf(stderr, "%s: %s\n", P, rd_errmsg());
        return 1;
    }
    struct stat st;
    const int64_t model_file_bytes = stat(model_path, &st) ? 0 : (int64_t)st.st_size;

    /* Row i's prompt: prompt_len random ids, the same at every batch size and configuration. */
    uint64_t rng = b.seed;
    b.prompts = malloc(sizeof(int32_t) * (size_t)b.max_batch * (size_t)b.prompt_len);
    if (!b.prompts) {
        fprintf(stderr, "%s: out of memory\n", P);
        return 1;
    }
    for (size_t i = 0; i < (size_t)b.max_batch * (size_t)b.prompt_len; i++)
        b.prompts[i] = 100 + (int32_t)(mix(&rng) % (uint64_t)(L.m->cfg.vocab - 100));

    int32_t max_rank = 1;
    if (scan_ranks(L.m, &b, &max_rank)) {
        fprintf(stderr, "%s: %s\n", P, rd_errmsg());
        return 1;
    }
    eng_config cfg = eng_default_config();
    cfg.backend = backend;
    cfg.n_threads = threads;
    cfg.eos_id = -1;
    cfg.eot_id = -1;
    cfg.prefix_cache = 0;       /* every run computes its prompts alike */
    cfg.spec_decode = ENG_SPEC_OFF;
    cfg.max_num_seqs = b.max_batch > cfg.max_num_seqs ? b.max_batch : cfg.max_num_seqs;
    /* Every prompt in one prefill step, so the decode steps start together. */
    const int32_t prefill = b.max_batch * b.prompt_len;
    cfg.max_batch_tokens = prefill > cfg.max_batch_tokens ? prefill : cfg.max_batch_tokens;
    cfg.max_loras = b.n_adapters > 4 ? b.n_adapters : 4;
    cfg.max_lora_rank = max_rank;
    engine *e;
    if (eng_create(L.m, &cfg, &e) || load_adapters(e, L.m, &b, max_rank)) {
        fprintf(stderr, "%s: %s\n", P, rd_errmsg());
        return 1;
    }

    const size_t n_cells = (size_t)b.n_batches * (size_t)b.n_counts;
    double *tps = calloc(n_cells * (size_t)b.reps, sizeof(double)); /* [batch][count][rep] tokens/s */
    double *cps = calloc(n_cells * (size_t)b.reps, sizeof(double)); /* the same per CPU-second */
    ref_row *refs = calloc((size_t)b.max_batch * (size_t)(b.n_adapters + 1), sizeof(ref_row));
    if (!tps || !cps || !refs) {
        fprintf(stderr, "%s: out of memory\n", P);
        return 1;
    }
    checks ck = {0};
    run_out ro;
    /* Warm-up (not timed): the largest batch, base and every adapter, a few tokens; pages the weights and
       adapters in and grows the engine's scratch. */
    if (run_once(e, &b, b.max_batch, 0, 8, NULL, NULL, &ro) ||
        run_once(e, &b, b.max_batch, max_count, 8, NULL, NULL, &ro)) {
        fprintf(stderr, "%s: warm-up failed: %s\n", P, rd_errmsg());
        return 1;
    }
    printf("%s: %s, %s backend, %d threads; %d adapters resident (rank %d); %d new tokens after a %d-token "
           "prompt per row, %s, %d reps\n", P, model_path, L.be->ops->name, L.be->n_threads, (int)b.n_adapters,
           (int)max_rank, (int)b.max_tokens, (int)b.prompt_len, b.temperature > 0 ? "sampled" : "greedy",
           (int)b.reps);
    fflush(stdout);
    for (int32_t r = 0; r < b.reps; r++)
        for (int32_t bi = 0; bi < b.n_batches; bi++)
            for (int32_t j = 0; j < b.n_counts; j++) {
                const int32_t ki = (j + r) % b.n_counts; /* each rep starts a batch's runs at another count */
                if (run_once(e, &b, b.batches[bi], b.counts[ki], b.max_tokens, refs, &ck, &ro)) {
                    fprintf(stderr, "%s: batch %d with %d adapters: %s\n", P, (int)b.batches[bi],
                            (int)b.counts[ki], rd_errmsg());
                    return 1;
                }
                const double v = ro.decode_s > 0 ? (double)ro.decode_tokens / ro.decode_s : 0.0;
                const double c = ro.decode_cpu_s > 0 ? (double)ro.decode_tokens / ro.decode_cpu_s : 0.0;
                const size_t at = ((size_t)bi * (size_t)b.n_counts + (size_t)ki) * (size_t)b.reps + (size_t)r;
                tps[at] = v;
                cps[at] = c;
                fprintf(stderr, "rep %d batch %3d adapters %d: %8.1f tokens/s, %8.1f per CPU-s (%lld decode steps, "
                        "%lld tokens)\n", (int)r, (int)b.batches[bi], (int)b.counts[ki], v, c,
                        (long long)ro.decode_steps, (long long)ro.decode_tokens);
            }

    print_table(&b, tps, "tok/s");
    printf("(tokens per CPU-second: the process's CPU time over the same steps, which moves less with other load)");
    print_table(&b, cps, "tok/CPU-s");
    for (int32_t i = 0; i < b.n_adapters; i++)
        printf("adapter %s: %s, rank %d, alpha %g (scale %g), %d (layer, module) pairs, %llu bytes in the file, "
               "%llu resident\n", b.names[i], b.dirs[i], (int)b.rank[i], b.alpha[i], b.scale[i], (int)b.n_pairs[i],
               (unsigned long long)b.file_bytes[i], (unsigned long long)b.resident_bytes[i]);
    printf("model: %lld bytes in the file, %lld resident\n", (long long)model_file_bytes,
           (long long)L.m->weights_bytes);
    const int ok = ck.rows_differing == 0 && ck.short_rows == 0 &&
                   (ck.adapter_rows == 0 || ck.adapter_rows_changed > 0);
    printf("checks: %lld reruns of a (row, adapter) pair, %lld differing; %lld of %lld adapter rows drew other "
           "tokens than the base; %lld rows short of max_tokens: %s\n", (long long)ck.rows_checked,
           (long long)ck.rows_differing, (long long)ck.adapter_rows_changed, (long long)ck.adapter_rows,
           (long long)ck.short_rows, ok ? "ok" : "FAILED");
    int rc = 0;
    if (json_path && (rc = write_json(json_path, &b, model_path, &L, model_file_bytes, tps, cps, &ck, ok)))
        fprintf(stderr, "%s: %s\n", P, rd_errmsg());

    for (size_t i = 0; i < (size_t)b.max_batch * (size_t)(b.n_adapters + 1); i++) {
        free(refs[i].tokens);
        free(refs[i].logprobs);
    }
    free(refs);
    free(tps);
    free(cps);
    free(b.prompts);
    if (b.batches != dflt_batches)
        free(b.batches);
    if (b.counts != dflt_counts)
        free(b.counts);
    eng_destroy(e);
    rd_unload(&L);
    return rc || !ok ? 1 : 0;
}
