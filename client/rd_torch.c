/* rd_torch.c - see rd_torch.h: the engine's forward for a learner's process. */
#include "client/rd_torch.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/crc32c.h"
#include "base/err.h"
#include "engine/model/loader.h"
#include "engine/model/runner.h"
#include "engine/serve/engine.h"
#include "engine/update/staging.h"

struct rdt_model {
    rd_loaded L;
    engine *e;
};

const char *rdt_error(void) { return rd_errmsg(); }

rdt_model *rdt_open(const char *path, int32_t n_threads)
{
    rdt_model *m = calloc(1, sizeof *m);
    if (!m) {
        rd_fail(RD_ENOMEM, "rdt_open: out of memory");
        return NULL;
    }
    if (rd_load(path, "cpu", n_threads, &m->L)) {
        free(m);
        return NULL;
    }
    /* Scoring only: no prefix cache (a scored prompt is computed whole anyway), no drafter. */
    eng_config c = eng_default_config();
    c.n_threads = n_threads;
    c.kv_cache_bytes = 256ll << 20;
    c.prefix_cache = 0;
    c.spec_decode = ENG_SPEC_OFF;
    c.spec_store_bytes = 0;
    if (eng_create(m->L.m, &c, &m->e)) {
        rd_unload(&m->L);
        free(m);
        return NULL;
    }
    return m;
}

void rdt_close(rdt_model *m)
{
    if (!m)
        return;
    eng_destroy(m->e);
    rd_unload(&m->L);
    free(m);
}

int32_t rdt_vocab(const rdt_model *m) { return m ? m->L.m->cfg.vocab : 0; }

int rdt_set_weights(rdt_model *m, int32_t n, const char *const *names, const void *const *data,
                    const int32_t *dtypes, const int64_t *shapes, const int32_t *n_dims, uint64_t version)
{
    if (!m || n < 1 || !names || !data || !dtypes || !shapes || !n_dims)
        return rd_fail(RD_EINVAL, "rdt_set_weights: a model and at least one tensor are needed");
    upd_spec *specs = calloc((size_t)n, sizeof *specs);
    if (!specs)
        return rd_fail(RD_ENOMEM, "rdt_set_weights: out of memory");
    uint64_t total = 0;
    for (int32_t i = 0; i < n; i++) {
        uint64_t elems = 1;
        specs[i] = (upd_spec){.name = names[i], .dtype = dtypes[i], .n_dims = n_dims[i]};
        for (int32_t d = 0; d < n_dims[i] && d < UPD_MAX_DIMS; d++) {
            specs[i].shape[d] = (uint64_t)shapes[(size_t)i * UPD_MAX_DIMS + d];
            elems *= specs[i].shape[d];
        }
        specs[i].nbytes = elems * upd_dtype_size(dtypes[i]);
        specs[i].crc32c = crc32c(0, data[i], specs[i].nbytes);
        total += specs[i].nbytes;
    }
    /* The daemon's own path for a push: the manifest checked against the model, the bytes staged and
     * verified, the backend's weights built from them and swapped in. */
    upd_stage *st = NULL;
    upd_patch *patch = NULL;
    int rc = upd_stage_create(&m->L.m->cfg, specs, n, total, UINT64_MAX, &st);
    for (int32_t i = 0; !rc && i < n; i++) {
        for (uint64_t off = 0; !rc && off < specs[i].nbytes; off += 1u << 30) {
            const uint64_t left = specs[i].nbytes - off;
            const uint32_t len = left < (1u << 30) ? (uint32_t)left : 1u << 30;
            const uint8_t *p = (const uint8_t *)data[i] + off;
            const uint32_t crc = crc32c(0, p, len);
            int dup;
            rc = upd_chunk_claim(st, (uint32_t)i, off, len, crc, &dup);
            if (!rc)
                rc = upd_chunk_fill(st, (uint32_t)i, off, p, len, crc);
            if (!rc)
                upd_chunk_settle(st, (uint32_t)i, off, 1);
        }
    }
    if (!rc)
        rc = upd_stage_verify(st);
    if (!rc)
        rc = upd_build(m->L.m, st, UPD_SERVE_AS_PUSHED, &patch);
    if (!rc) {
        upd_apply(m->L.m, patch);
        upd_patch_free(m->L.be, patch); /* the patch holds the old weights now */
        eng_set_version(m->e, version);
    }
    upd_stage_free(st);
    free(specs);
    return rc;
}

int rdt_token_logprobs(rdt_model *m, const int32_t *ids, const int32_t *lens, int32_t B, float *out)
{
    if (!m || !ids || !lens || B < 1 || !out)
        return rd_fail(RD_EINVAL, "rdt_token_logprobs: a model, token ids, lengths and an output are needed");
    int64_t *req = malloc(sizeof(int64_t) * (size_t)B);
    size_t *at_in = malloc(sizeof(size_t) * (size_t)B), *at_out = malloc(sizeof(size_t) * (size_t)B);
    int rc = req && at_in && at_out ? 0 : rd_fail(RD_ENOMEM, "rdt_token_logprobs: out of memory");
    size_t in = 0, o = 0;
    for (int32_t b = 0; !rc && b < B; b++) {
        if (lens[b] < 2) {
            rc = rd_fail(RD_EINVAL, "rdt_token_logprobs: sequence %d has %d tokens; expected at least 2", b, lens[b]);
            break;
        }
        at_in[b] = in;
        at_out[b] = o;
        in += (size_t)lens[b];
        o += (size_t)lens[b] - 1;
    }
    /* Every sequence one scoring request (no token drawn): the log-prob the engine's sampler gives each
     * token, whatever else shares the step. */
    int32_t added = 0;
    for (int32_t b = 0; !rc && b < B; b++) {
        eng_request r;
        memset(&r, 0, sizeof r);
        r.prompt = ids + at_in[b];
        r.n_prompt = lens[b];
        r.n = 1;
        r.max_tokens = 0;
        r.sp = samp_default();
        r.score_prompt = 1;
        r.score_from = 1;
        r.tag = (uint64_t)b;
        rc = eng_add(m->e, &r, &req[b]);
        added += !rc;
    }
    int32_t done = 0;
    eng_result res[16];
    while (added > 0 && done < added) {
        if (eng_busy(m->e) && eng_step(m->e) < 0 && !rc)
            rc = rd_fail(RD_EINVAL, "rdt_token_logprobs: engine step: %s", rd_errmsg());
        int got = eng_collect(m->e, res, 16);
        for (int k = 0; k < got; k++) {
            const eng_result *r = &res[k];
            const int32_t b = (int32_t)r->tag;
            if (!rc && (!r->prompt_logprobs || r->finish == FINISH_ABORT || r->finish == FINISH_ERROR))
                rc = rd_fail(RD_EINVAL, "rdt_token_logprobs: sequence %d was not scored", b);
            if (!rc)
                memcpy(out + at_out[b], r->prompt_logprobs + 1, sizeof(float) * (size_t)(lens[b] - 1));
            eng_result_free(&res[k]);
            done++;
        }
        if (got == 0 && !eng_busy(m->e) && done < added && !rc)
            rc = rd_fail(RD_EINVAL, "rdt_token_logprobs: %d sequences never finished", added - done);
        if (rc && !eng_busy(m->e) && got == 0)
            break;
    }
    free(req);
    free(at_in);
    free(at_out);
    return rc;
}

int rdt_logits(rdt_model *m, const int32_t *ids, int32_t n, float *out)
{
    if (!m || !ids || n < 1 || !out)
        return rd_fail(RD_EINVAL, "rdt_logits: a model, token ids and an output are needed");
    const model_config *c = &m->L.m->cfg;
    if (n > c->max_ctx)
        return rd_fail(RD_EINVAL, "rdt_logits: %d tokens exceed the context of %d", n, c->max_ctx);
    for (int32_t i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= c->vocab)
            return rd_fail(RD_EINVAL, "rdt_logits: token %d at %d is outside the vocabulary (0..%d)", ids[i], i,
                           c->vocab - 1);
    /* One prefill step of the whole sequence through a paged KV cache of its own, as rollout-logits runs it. */
    const int32_t bs = 16, n_blocks = (n + bs - 1) / bs;
    runner r;
    int rc = runner_init(&r, m->L.m, n_blocks, bs, n, n);
    if (rc)
        return rc;
    int32_t *pos = malloc(sizeof(int32_t) * (size_t)n), *slots = malloc(sizeof(int32_t) * (size_t)n);
    int32_t *table = malloc(sizeof(int32_t) * (size_t)n_blocks), *rows = malloc(sizeof(int32_t) * (size_t)n);
    rc = pos && slots && table && rows ? 0 : rd_fail(RD_ENOMEM, "rdt_logits: out of memory");
    if (!rc) {
        for (int32_t i = 0; i < n; i++)
            pos[i] = slots[i] = rows[i] = i;
        for (int32_t b = 0; b < n_blocks; b++)
            table[b] = b;
        int32_t q_start[2] = {0, n}, ctx[1] = {n};
        rd_step s = {.n_rows = n, .n_seqs = 1, .max_blocks = n_blocks, .token_ids = ids, .positions = pos,
                     .slots = slots, .q_start = q_start, .ctx_len = ctx, .block_tables = table};
        rc = runner_forward(&r, &s, rows, n, out);
    }
    free(pos);
    free(slots);
    free(table);
    free(rows);
    runner_free(&r);
    return rc;
}
