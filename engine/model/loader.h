/* loader.h - opens a model file into a ready backend, model and tokenizer:
 * the few lines every tool and the daemon start with. */
#ifndef RD_LOADER_H
#define RD_LOADER_H

#include "engine/backend.h"
#include "engine/format/gguf.h"
#include "engine/model/model.h"
#include "engine/text/tokenizer.h"

typedef struct {
    gguf_file *gguf;            /* kept open for the tokenizer's strings */
    rd_backend *be;
    model *m;
    tok_tokenizer *tok;         /* NULL when the file has no tokenizer */
} rd_loaded;

int rd_load(const char *path, const char *backend, int n_threads, rd_loaded *out);
void rd_unload(rd_loaded *l);
/* Reads the weights of path (a GGUF file, a .safetensors file or an HF
 * folder) into a new model on l's backend; same_file: path is the file l was
 * loaded from (its open mapping is read again). */
int rd_read_weights(rd_loaded *l, const char *path, int same_file, model **out);

#endif
