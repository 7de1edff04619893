/* rollout-export - writes a loaded model as an HF checkpoint (config.json +
 * model.safetensors, HF names and layout), so a GGUF-loaded model can be
 * pushed to a learner or another daemon.
 *   rollout-export --model PATH(.gguf|.safetensors|HF folder) --out DIR [--dtype f32|bf16|f16]
 *                  [--threads N] [--backend cpu]
 * f32 (the default) is exact: reloading the export gives bit-identical outputs. */
#include <stdio.h>
#include <string.h>

#include "base/err.h"
#include "engine/model/loader.h"
#include "engine/format/safetensors.h"
#include "tools/cli.h"

static const char *P = "rollout-export";

int main(int argc, char **argv)
{
    const char *model_path = NULL, *out_dir = NULL, *backend = "cpu", *dt = "f32";
    int threads = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--model")) model_path = cli_value(P, argc, argv, &i);
        else if (!strcmp(a, "--out")) out_dir = cli_value(P, argc, argv, &i);
        else if (!strcmp(a, "--dtype")) dt = cli_value(P, argc, argv, &i);
        else if (!strcmp(a, "--threads")) threads = (int)cli_int(P, a, cli_value(P, argc, argv, &i), 1, 256);
        else if (!strcmp(a, "--backend")) backend = cli_value(P, argc, argv, &i);
        else cli_die(P, "unknown flag '%s'%s (see the comment at the top of rollout-export.c)", a, "");
    }
    if (!model_path || !out_dir)
        cli_die(P, "usage: rollout-export --model PATH --out DIR [--dtype f32|bf16|f16]%s%s", "", "");
    st_dtype dtype;
    if (st_dtype_parse(dt, &dtype))
        cli_die(P, "--dtype expects f32, bf16 or f16, got '%s'%s", dt, "");

    rd_loaded L;
    if (rd_load(model_path, backend, threads, &L)) {
        fprintf(stderr, "%s: %s\n", P, rd_errmsg());
        return 1;
    }
    int rc = model_export_hf(L.m, out_dir, dtype);
    if (rc)
        fprintf(stderr, "%s: %s\n", P, rd_errmsg());
    else
        fprintf(stderr, "%s: wrote %s/config.json and %s/model.safetensors (%s, %lld parameters)\n", P, out_dir,
                out_dir, st_dtype_name(dtype), (long long)L.m->n_params);
    rd_unload(&L);
    return rc ? 1 : 0;
}
