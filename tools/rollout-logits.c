/* rollout-logits - writes the fp32 logits of every prompt position, for
 * parity tests against independent references.
 *   rollout-logits --model PATH --prompt-ids 1,2,3 --out FILE [--routes-out FILE] [--lora DIR] [--threads N]
 *                  [--backend cpu]
 * FILE gets n_prompt x vocab little-endian float32, row-major. The prompt is
 * computed as one prefill through the paged KV cache. --routes-out (MoE
 * models) writes the experts every position was routed to, as runner_routes
 * gives them: little-endian int32 [n_layers][n_prompt][k], each position's k
 * experts highest weight first. --lora runs every position under the PEFT
 * adapter in DIR (engine/model/lora.h), unmerged, as the daemon serves it. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/err.h"
#include "engine/model/loader.h"
#include "engine/model/lora.h"
#include "engine/model/runner.h"
#include "tools/cli.h"

static const char *P = "rollout-logits";

int main(int argc, char **argv)
{
    const char *model_path = NULL, *out_path = NULL, *routes_path = NULL, *backend = "cpu", *lora_dir = NULL;
    int32_t *ids = NULL, n = 0;
    int threads = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--model")) model_path = cli_value(P, argc, argv, &i);
        else if (!strcmp(a, "--prompt-ids")) ids = cli_ids(P, a, cli_value(P, argc, argv, &i), &n);
        else if (!strcmp(a, "--out")) out_path = cli_value(P, argc, argv, &i);
        else if (!strcmp(a, "--routes-out")) routes_path = cli_value(P, argc, argv, &i);
        else if (!strcmp(a, "--lora")) lora_dir = cli_value(P, argc, argv, &i);
        else if (!strcmp(a, "--threads")) threads = (int)cli_int(P, a, cli_value(P, argc, argv, &i), 1, 256);
        else if (!strcmp(a, "--backend")) backend = cli_value(P, argc, argv, &i);
        else cli_die(P, "unknown flag '%s'%s (see the comment at the top of rollout-logits.c)", a, "");
    }
    if (!model_path || !ids || !out_path)
        cli_die(P, "usage: rollout-logits --model PATH --prompt-ids 1,2,3 --out FILE%s%s", "", "");

    rd_loaded L;
    if (rd_load(model_path, backend, threads, &L)) {
        fprintf(stderr, "%s: %s\n", P, rd_errmsg());
        free(ids);
        return 1;
    }
    const model_config *c = &L.m->cfg;
    for (int32_t i = 0; i < n; i++)
        if (ids[i] >= c->vocab) {
            fprintf(stderr, "%s: token id %d at index %d is outside the vocabulary (0..%d)\n", P, ids[i], i, c->vocab - 1);
            return 2;
        }
    if (n > c->max_ctx) {
        fprintf(stderr, "%s: %d tokens exceed the context of %d\n", P, n, c->max_ctx);
        return 2;
    }
    const int32_t bs = 16, n_blocks = (n + bs - 1) / bs;
    runner r;
    if (runner_init(&r, L.m, n_blocks, bs, n, n)) {
        fprintf(stderr, "%s: %s\n", P, rd_errmsg());
        return 1;
    }
    lora_adapter *ad = NULL;
    int32_t *lora_rows = NULL;
    if (lora_dir) {
        void **h;
        int64_t bytes;
        if (lora_load_peft(lora_dir, c, LORA_MAX_RANK, &ad) || runner_lora_init(&r, 1, ad->rank) ||
            runner_lora_prepare(&r, ad, &h, &bytes)) {
            fprintf(stderr, "%s: %s\n", P, rd_errmsg());
            return 1;
        }
        runner_lora_bind(&r, 0, h);
        lora_rows = calloc((size_t)n, sizeof(int32_t));   /* every row slot 0 */
    }
    int32_t *pos = malloc(sizeof(int32_t) * n), *slots = malloc(sizeof(int32_t) * n);
    int32_t *table = malloc(sizeof(int32_t) * n_blocks), *rows = malloc(sizeof(int32_t) * n);
    for (int32_t i = 0; i < n; i++)
        pos[i] = slots[i] = rows[i] = i;
    /* Blocks in reverse order, so the test covers a table that is not the identity. */
    for (int32_t b = 0; b < n_blocks; b++)
        table[b] = n_blocks - 1 - b;
    for (int32_t i = 0; i < n; i++)
        slots[i] = table[i / bs] * bs + i % bs;
    int32_t q_start[2] = {0, n}, ctx[1] = {n};
    rd_step s = {.n_rows = n, .n_seqs = 1, .max_blocks = n_blocks, .token_ids = ids, .positions = pos,
                 .slots = slots, .q_start = q_start, .ctx_len = ctx, .block_tables = table,
                 .lora_slots = lora_rows};
    float *logits = malloc(sizeof(float) * (size_t)n * c->vocab);
    if (runner_forward(&r, &s, rows, n, logits)) {
        fprintf(stderr, "%s: %s\n", P, rd_errmsg());
        return 1;
    }
    FILE *f = fopen(out_path, "wb");
    if (!f || fwrite(logits, sizeof(float), (size_t)n * c->vocab, f) != (size_t)n * c->vocab || fclose(f)) {
        fprintf(stderr, "%s: cannot write %s\n", P, out_path);
        return 1;
    }
    if (routes_path) {
        const size_t nr = (size_t)c->n_layers * (size_t)n * (size_t)(c->n_experts_used > 0 ? c->n_experts_used : 1);
        int32_t *routes = malloc(sizeof(int32_t) * nr);
        if (!routes || runner_routes(&r, n, routes)) {
            fprintf(stderr, "%s: %s\n", P, routes ? rd_errmsg() : "out of memory");
            return 1;
        }
        FILE *rf = fopen(routes_path, "wb");
        if (!rf || fwrite(routes, sizeof(int32_t), nr, rf) != nr || fclose(rf)) {
            fprintf(stderr, "%s: cannot write %s\n", P, routes_path);
            return 1;
        }
        free(routes);
    }
    free(logits);
    free(pos);
    free(slots);
    free(table);
    free(rows);
    free(ids);
    runner_lora_unbind(&r, 0);
    runner_free(&r);
    lora_free(ad);
    free(lora_rows);
    rd_unload(&L);
    return 0;
}
