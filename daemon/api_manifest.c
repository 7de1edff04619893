/* api_manifest.c - GET /weights_manifest: every tensor a weight push may carry, by its HF
 * name, with the shape the daemon checks it against (PROTOCOL.md §10.1). A learner
 * compares a trainer's state dict with it before UPDATE_BEGIN, so unknown names, missing
 * tensors and wrong shapes are refused together, naming each, before anything is staged
 * (rolloutd.Pool.push_tensors). Read-only; the names and shapes come from the family's
 * table (engine/model/families/) and the model's config, as the update's checks do. */
#include "daemon/api_int.h"
#include "engine/model/arch.h"
#include "engine/model/model.h"

/* One tensor: {"name": ..., "shape": [rows, cols]} or [cols] for a vector. */
static int add_tensor(cJSON *arr, const arch_tensor *t, const model_config *c, int32_t layer, int32_t expert)
{
    char name[128];
    arch_hf_name(t, layer, expert, name, sizeof name);
    cJSON *o = cJSON_CreateObject(), *shape = cJSON_CreateArray();
    if (!o || !shape || !cJSON_AddStringToObject(o, "name", name)) {
        cJSON_Delete(o);
        cJSON_Delete(shape);
        return -1;
    }
    cJSON_AddItemToObject(o, "shape", shape);
    if (arch_group_is_linear(t->group))
        cJSON_AddItemToArray(shape, cJSON_CreateNumber((double)arch_dim_value(c, t->rows)));
    cJSON_AddItemToArray(shape, cJSON_CreateNumber((double)arch_dim_value(c, t->cols)));
    cJSON_AddItemToArray(arr, o);
    return 0;
}

static void route_manifest(http_res *h, const http_req *req, void *ud)
{
    api *a = ud;
    const model *m = a->d->L.m;
    const model_config *c = &m->cfg;
    const arch_desc *ad = m->arch;
    cJSON *o = cJSON_CreateObject(), *arr = cJSON_CreateArray();
    if (!o || !arr) {
        cJSON_Delete(o);
        cJSON_Delete(arr);
        http_respond_error(h, 500, "internal", "out of memory for the manifest");
        return;
    }
    cJSON_AddStringToObject(o, "arch", c->arch);
    cJSON_AddBoolToObject(o, "tied_embeddings", c->tied_embeddings);
    cJSON_AddItemToObject(o, "tensors", arr);
    int rc = 0;
    for (int32_t i = 0; i < ad->n_tensors && !rc; i++) {
        const arch_tensor *t = &ad->tensors[i];
        if (!arch_tensor_present(c, t))
            continue;
        if (!arch_group_per_layer(t->group)) {
            rc = add_tensor(arr, t, c, -1, 0);
            continue;
        }
        int32_t units = (t->flags & AT_EXPERT) ? c->n_experts : 1;
        for (int32_t l = 0; l < c->n_layers && !rc; l++)
            for (int32_t e = 0; e < units && !rc; e++)
                rc = add_tensor(arr, t, c, l, e);
    }
    if (rc) {
        cJSON_Delete(o);
        http_respond_error(h, 500, "internal", "out of memory for the manifest");
        return;
    }
    cJSON_AddNumberToObject(o, "n_tensors", cJSON_GetArraySize(arr));
    api_answer_json(h, 200, o);
}

int api_manifest_routes(api *a, http_route *t)
{
    t[0] = (http_route){"GET", "/weights_manifest", route_manifest, a, 0};
    return 1;
}
