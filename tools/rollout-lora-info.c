/* rollout-lora-info - loads a PEFT LoRA adapter against a model and prints
 * what was loaded as JSON, or why it was refused (exit 1, the message on
 * stderr): the check a learner can run before pushing an adapter.
 *   rollout-lora-info --model PATH --adapter DIR [--max-rank N] [--dump OUTDIR]
 * PATH: a GGUF file or an HF folder (config.json); only the config is read.
 * Printed: name, path, arch, rank, alpha, scale, rslora, bytes, n_pairs, the
 * modules with their in/out, and per pair its layer, module and dtypes.
 * --dump writes every pair's A and B as little-endian float32 (the stored
 * values converted exactly) to OUTDIR/L.MODULE.A.f32 and .B.f32, for tests
 * to compare with what the adapter's writer meant. */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "base/err.h"
#include "engine/format/gguf.h"
#include "engine/model/lora.h"
#include "engine/model/model.h"
#include "tools/cli.h"

static const char *P = "rollout-lora-info";

static int read_config(const char *path, model_config *c)
{
    struct stat sb;
    if (stat(path, &sb) == 0 && S_ISDIR(sb.st_mode)) {
        char p[4200];
        snprintf(p, sizeof p, "%s/config.json", path);
        FILE *f = fopen(p, "rb");
        if (!f)
            return rd_fail(RD_EIO, "cannot open '%s'", p);
        fseek(f, 0, SEEK_END);
        long n = ftell(f);
        fseek(f, 0, SEEK_SET);
        char *text = n >= 0 ? malloc((size_t)n + 1) : NULL;
        size_t got = text ? fread(text, 1, (size_t)n, f) : 0;
        fclose(f);
        if (!text || got != (size_t)n) {
            free(text);
            return rd_fail(RD_EIO, "cannot read '%s'", p);
        }
        text[n] = 0;
        int rc = model_config_from_hf_json(text, c);
        free(text);
        return rc;
    }
    gguf_file *g;
    int rc = gguf_open(path, &g);
    if (rc)
        return rc;
    rc = model_config_from_gguf(g, c);
    gguf_close(g);
    return rc;
}

static int dump_one(const char *dir, int32_t layer, const char *mod, const char *ab, const void *src, st_dtype dt,
                    size_t n)
{
    float *v = malloc(sizeof(float) * n);
    if (!v)
        return rd_fail(RD_ENOMEM, "out of memory");
    int rc = lora_to_f32(src, dt, n, v);
    char p[4200];
    snprintf(p, sizeof p, "%s/%d.%s.%s.f32", dir, layer, mod, ab);
    FILE *f = rc ? NULL : fopen(p, "wb");
    if (!rc && (!f || fwrite(v, sizeof(float), n, f) != n || fclose(f)))
        rc = rd_fail(RD_EIO, "cannot write '%s'", p);
    free(v);
    return rc;
}

int main(int argc, char **argv)
{
    const char *model_path = NULL, *dir = NULL, *dump = NULL;
    int32_t max_rank = 64;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--model")) model_path = cli_value(P, argc, argv, &i);
        else if (!strcmp(a, "--adapter")) dir = cli_value(P, argc, argv, &i);
        else if (!strcmp(a, "--max-rank")) max_rank = (int32_t)cli_int(P, a, cli_value(P, argc, argv, &i), 1,
                                                                        LORA_MAX_RANK);
        else if (!strcmp(a, "--dump")) dump = cli_value(P, argc, argv, &i);
        else cli_die(P, "unknown flag '%s'%s (see the comment at the top of rollout-lora-info.c)", a, "");
    }
    if (!model_path || !dir)
        cli_die(P, "usage: rollout-lora-info --model PATH --adapter DIR [--max-rank N] [--dump OUTDIR]%s%s", "", "");

    model_config c;
    lora_adapter *ad = NULL;
    if (read_config(model_path, &c) || lora_load_peft(dir, &c, max_rank, &ad)) {
        fprintf(stderr, "%s: %s\n", P, rd_errmsg());
        return 1;
    }
    cJSON *o = cJSON_CreateObject(), *mods = cJSON_CreateObject(), *pairs = cJSON_CreateArray();
    cJSON_AddStringToObject(o, "name", ad->name);
    cJSON_AddStringToObject(o, "path", ad->path);
    cJSON_AddStringToObject(o, "arch", ad->arch);
    cJSON_AddNumberToObject(o, "rank", ad->rank);
    cJSON_AddNumberToObject(o, "alpha", ad->alpha);
    cJSON_AddNumberToObject(o, "scale", ad->scale);
    cJSON_AddBoolToObject(o, "rslora", ad->rslora);
    cJSON_AddNumberToObject(o, "bytes", (double)ad->bytes);
    cJSON_AddNumberToObject(o, "n_layers", ad->n_layers);
    cJSON_AddNumberToObject(o, "n_pairs", ad->n_pairs);
    for (int m = 0; m < LORA_N_MODULES; m++)
        if (ad->modules & (1u << m)) {
            cJSON *io = cJSON_CreateObject();
            cJSON_AddNumberToObject(io, "in", ad->in[m]);
            cJSON_AddNumberToObject(io, "out", ad->out[m]);
            cJSON_AddItemToObject(mods, lora_module_name((lora_module)m), io);
        }
    cJSON_AddItemToObject(o, "modules", mods);
    int rc = 0;
    for (int32_t l = 0; l < ad->n_layers && !rc; l++)
        for (int m = 0; m < LORA_N_MODULES && !rc; m++) {
            const lora_pair *p = lora_pair_at(ad, l, (lora_module)m);
            if (!p->a)
                continue;
            cJSON *e = cJSON_CreateObject();
            cJSON_AddNumberToObject(e, "layer", l);
            cJSON_AddStringToObject(e, "module", lora_module_name((lora_module)m));
            cJSON_AddStringToObject(e, "a_dtype", st_dtype_name(p->a_dtype));
            cJSON_AddStringToObject(e, "b_dtype", st_dtype_name(p->b_dtype));
            cJSON_AddItemToArray(pairs, e);
            if (dump) {
                const size_t na = (size_t)ad->rank * ad->in[m], nb = (size_t)ad->out[m] * ad->rank;
                rc = dump_one(dump, l, lora_module_name((lora_module)m), "A", p->a, p->a_dtype, na);
                if (!rc)
                    rc = dump_one(dump, l, lora_module_name((lora_module)m), "B", p->b, p->b_dtype, nb);
            }
        }
    cJSON_AddItemToObject(o, "pairs", pairs);
    if (!rc) {
        char *s = cJSON_Print(o);
        printf("%s\n", s ? s : "{}");
        free(s);
    } else {
        fprintf(stderr, "%s: %s\n", P, rd_errmsg());
    }
    cJSON_Delete(o);
    lora_free(ad);
    return rc ? 1 : 0;
}
