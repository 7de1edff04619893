/* loader.c - see loader.h. */
#include "engine/model/loader.h"

#include <string.h>
#include <sys/stat.h>

#include "base/err.h"

/* An HF checkpoint: a folder, or a file named *.safetensors. Anything else
 * takes the GGUF path exactly as before (and its error messages). */
static int is_hf(const char *path)
{
    struct stat sb;
    size_t n = strlen(path);
    if (stat(path, &sb) == 0 && S_ISDIR(sb.st_mode))
        return 1;
    return n >= 12 && !strcmp(path + n - 12, ".safetensors");
}

int rd_load(const char *path, const char *backend, int n_threads, rd_loaded *out)
{
    memset(out, 0, sizeof *out);
    int rc;
    if (is_hf(path)) {
        /* No tokenizer from an HF folder yet: tok stays NULL. */
        if ((rc = rd_backend_create(backend, n_threads, &out->be)) ||
            (rc = model_load_hf(path, out->be, &out->m))) {
            rd_unload(out);
            return rc;
        }
        return 0;
    }
    rc = gguf_open(path, &out->gguf);
    if (rc)
        return rc;
    if ((rc = rd_backend_create(backend, n_threads, &out->be)))
        goto fail;
    if ((rc = model_load_gguf(out->gguf, out->be, &out->m)))
        goto fail;
    if (gguf_find_kv(out->gguf, "tokenizer.ggml.model") && (rc = tok_load(out->gguf, &out->tok)))
        goto fail;
    /* The backend holds its own copy of every weight now. */
    gguf_drop_data_pages(out->gguf);
    return 0;
fail:
    rd_unload(out);
    return rc;
}

int rd_read_weights(rd_loaded *l, const char *path, int same_file, model **out)
{
    *out = NULL;
    if (is_hf(path))
        return model_load_hf(path, l->be, out);
    int rc;
    if (same_file && l->gguf) {
        /* The mapping is still open (the tokenizer's strings): its pages come back from the file. */
        if (!(rc = model_load_gguf(l->gguf, l->be, out)))
            gguf_drop_data_pages(l->gguf);
        return rc;
    }
    gguf_file *g;
    if ((rc = gguf_open(path, &g)))
        return rc;
    rc = model_load_gguf(g, l->be, out);
    gguf_close(g);
    return rc;
}

void rd_unload(rd_loaded *l)
{
    if (l->tok)
        tok_free(l->tok);
    if (l->m)
        model_free(l->m);
    if (l->be)
        rd_backend_destroy(l->be);
    if (l->gguf)
        gguf_close(l->gguf);
    memset(l, 0, sizeof *l);
}
