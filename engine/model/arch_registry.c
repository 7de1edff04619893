/* arch_registry.c - the family registry (arch.h): every family of
 * engine/model/families/, looked up by GGUF architecture or HF class.
 *
 * A file of its own, above the families: each family's descriptor refers to
 * the runner's layer recipes and to arch.c's helpers, and the loaders
 * (model.c, model_hf.c) look families up here, so with the table in arch.c
 * arch.c and the families called each other in a circle
 * (tools/check_layers.py, rule calls). */
#include "engine/model/arch.h"

#include <string.h>

extern const arch_desc arch_llama, arch_qwen2, arch_qwen3, arch_qwen3moe, arch_gemma3;

static const arch_desc *const FAMILIES[] = {&arch_llama, &arch_qwen2, &arch_qwen3, &arch_qwen3moe, &arch_gemma3};
#define N_FAMILIES (sizeof FAMILIES / sizeof FAMILIES[0])

const arch_desc *arch_by_name(const char *name, size_t len)
{
    for (size_t i = 0; i < N_FAMILIES; i++)
        if (strlen(FAMILIES[i]->name) == len && !memcmp(FAMILIES[i]->name, name, len))
            return FAMILIES[i];
    return NULL;
}

const arch_desc *arch_by_hf(const char *hf_class, const char *model_type)
{
    for (size_t i = 0; i < N_FAMILIES; i++)
        if ((hf_class && !strcmp(FAMILIES[i]->hf_class, hf_class)) ||
            (!hf_class && model_type && !strcmp(FAMILIES[i]->hf_model_type, model_type)))
            return FAMILIES[i];
    return NULL;
}

const char *arch_names(void) { return "llama, qwen2, qwen3, qwen3moe, gemma3"; }
