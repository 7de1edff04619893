/* engine_helpers.h - helpers shared by the unit tests that run the engine or
 * the runner on a model: collecting results, stepping an engine until it is
 * idle, and the logits of one prompt prefilled in one step.
 *
 * Everything is static inline (one copy per test binary, no warning where a
 * test uses only part of it). */
#ifndef RD_TEST_ENGINE_HELPERS_H
#define RD_TEST_ENGINE_HELPERS_H

#include <stdint.h>
#include <stdlib.h>
#include <sys/stat.h>

#include "base/err.h"
#include "engine/model/runner.h"
#include "engine/serve/engine.h"

/* The tiny models of tests/gen_testdata.sh: $RD_TESTDATA, default build/testdata. */
static inline const char *testdata(void)
{
    const char *d = getenv("RD_TESTDATA");
    return d && *d ? d : "build/testdata";
}

/* The real model: $RD_MODEL, default the SmolLM2 file of make model. */
static inline const char *real_model_path(void)
{
    const char *m = getenv("RD_MODEL");
    return m && *m ? m : "models/SmolLM2-135M-Instruct.Q4_1.gguf";
}

static inline int file_exists(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0;
}

/* CPU threads for the backend: $RD_TEST_THREADS, default dflt (0: all cores). */
static inline int test_threads(int dflt)
{
    const char *t = getenv("RD_TEST_THREADS");
    return t && *t ? atoi(t) : dflt;
}

/* Results of a case; the cases stay far below MAX_RES. */
#define MAX_RES 256

typedef struct {
    int n;
    eng_result r[MAX_RES];
} res_set;

/* Moves finished samples into out. */
static inline void collect(engine *e, res_set *out)
{
    int k;
    while (out->n < MAX_RES && (k = eng_collect(e, out->r + out->n, MAX_RES - out->n)) > 0)
        out->n += k;
}

/* Steps until nothing is waiting or running, collecting as it goes. A step
 * may compute nothing right after a preemption; several in a row is a hang. */
static inline int drive(engine *e, res_set *out)
{
    int idle = 0;
    for (long it = 0; eng_busy(e); it++) {
        if (it > 200000)
            return rd_fail(RD_EINVAL, "drive: still busy after %ld steps", it);
        int rc = eng_step(e);
        if (rc < 0)
            return rc;
        idle = rc == 0 ? idle + 1 : 0;
        if (idle > 3)
            return rd_fail(RD_EINVAL, "drive: %d steps in a row computed nothing while busy", idle);
        collect(e, out);
    }
    collect(e, out);
    return 0;
}

static inline const eng_result *res_find(const res_set *s, int64_t req, int32_t sample)
{
    for (int i = 0; i < s->n; i++)
        if (s->r[i].req_id == req && s->r[i].sample_idx == sample)
            return &s->r[i];
    return NULL;
}

/* Logits of every position of one sequence prefilled in one step on m (its
 * backend, its kv_dtype): out holds n rows of the vocabulary. */
static inline int seq_logits(model *m, const int32_t *tok, int32_t n, float *out)
{
    const int32_t bs = 16, nb = (n + bs - 1) / bs;
    runner r;
    int rc = runner_init(&r, m, nb, bs, n, n);
    if (rc)
        return rc;
    int32_t *pos = malloc(sizeof(int32_t) * n), *slot = malloc(sizeof(int32_t) * n);
    int32_t *rows = malloc(sizeof(int32_t) * n), *table = malloc(sizeof(int32_t) * nb);
    int32_t qs[2] = {0, n}, ctx = n;
    if (pos && slot && rows && table) {
        for (int32_t i = 0; i < n; i++)
            pos[i] = slot[i] = rows[i] = i;
        for (int32_t i = 0; i < nb; i++)
            table[i] = i;
        rd_step s = {.n_rows = n, .n_seqs = 1, .max_blocks = nb, .token_ids = tok, .positions = pos,
                     .slots = slot, .q_start = qs, .ctx_len = &ctx, .block_tables = table};
        rc = runner_forward(&r, &s, rows, n, out);
    } else {
        rc = RD_ENOMEM;
    }
    free(pos), free(slot), free(rows), free(table);
    runner_free(&r);
    return rc;
}

#endif
