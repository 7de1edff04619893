/* api_read_extra.c - readers of what routes read beside their main reader
 * (api_read.c, api_read_rl.c), with their contract (api_int.h): no server, no
 * engine, 0 or -1 with e naming the field; tests/fuzz/fuzz_http_json.c runs
 * them.
 *
 *   - the model a /v1 or vLLM call names (vLLM's _check_model: absent, null
 *     or "" is the served model; a name nothing serves is 404);
 *   - /inference/v1/generate's routed-experts ask (rolloutd's per-request
 *     return_routed_experts, vLLM's sampling_params.routed_experts_prompt_start);
 *   - SGLang's /v1/loads query (include, dp_rank, format). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/api_int.h"

static int done(const api_err *e) { return e->status ? -1 : 0; }

int api_read_model(cJSON *root, const char *const *names, int n_names, api_err *e)
{
    cJSON *m = cJSON_GetObjectItemCaseSensitive(root, "model");
    if (!m || cJSON_IsNull(m))
        return 0;
    if (!cJSON_IsString(m)) {
        api_bad(e, 400, "field \"model\": expected a string (the name GET /v1/models lists)");
        return -1;
    }
    if (!m->valuestring[0])
        return 0; /* vLLM's _is_model_supported: an empty name is the served model */
    for (int i = 0; i < n_names; i++)
        if (names[i] && names[i][0] && !strcmp(m->valuestring, names[i]))
            return 0;
    /* vLLM's words (serving_engine.py _check_model); the route answers NotFoundError, param "model" */
    api_bad(e, 404, "The model `%.400s` does not exist.", m->valuestring);
    return -1;
}

int api_read_routes_ask(cJSON *root, api_routes_ask *r, api_err *e)
{
    r->ask = 0;
    r->start = 0;
    api_bool(root, "return_routed_experts", &r->ask, e);
    cJSON *sp = cJSON_GetObjectItemCaseSensitive(root, "sampling_params");
    int64_t start = 0;
    /* the prompt positions before it are left out of the routes (a later turn of a conversation whose
     * earlier routes the trainer holds); the route checks it against the prompt's length */
    if (cJSON_IsObject(sp) && api_int(sp, "routed_experts_prompt_start", 0, INT32_MAX, &start, e) > 0)
        r->start = (int32_t)start;
    return done(e);
}

int api_read_loads(const char *query, api_loads_req *r, api_err *e)
{
    static const struct {
        const char *name;
        unsigned bits;
    } SECTIONS[] = {
        {"core", MX_LOADS_CORE},   {"memory", MX_LOADS_MEMORY}, {"spec", MX_LOADS_SPEC}, {"lora", MX_LOADS_LORA},
        {"disagg", MX_LOADS_DISAGG}, {"queues", MX_LOADS_QUEUES}, {"all", MX_LOADS_ALL},
    };
    r->sections = MX_LOADS_ALL;
    r->prometheus = 0;
    char v[256];
    int got = api_query_get(query, "include", v, sizeof v);
    if (got < 0)
        api_bad(e, 400, "query \"include\": longer than %zu bytes", sizeof v - 1);
    if (got > 0 && v[0]) {
        /* SGLang's GetLoadsReqInput: comma-separated names, each one of VALID_SECTIONS */
        r->sections = 0;
        for (char *p = v, *comma; !e->status && p; p = comma ? comma + 1 : NULL) {
            if ((comma = strchr(p, ',')))
                *comma = 0;
            while (*p == ' ')
                p++;
            size_t n = strlen(p);
            while (n && p[n - 1] == ' ')
                p[--n] = 0;
            unsigned bits = 0;
            for (size_t i = 0; i < sizeof SECTIONS / sizeof SECTIONS[0]; i++)
                if (!strcmp(p, SECTIONS[i].name))
                    bits = SECTIONS[i].bits;
            if (!bits)
                api_bad(e, 400, "query \"include\": invalid section \"%.60s\"; valid: all, core, disagg, lora, "
                        "memory, queues, spec", p);
            r->sections |= bits;
        }
    }
    if ((got = api_query_get(query, "dp_rank", v, sizeof v)) < 0 || (got > 0 && strcmp(v, "0")))
        api_bad(e, 400, "query \"dp_rank\" = \"%.40s\": this server has one data-parallel rank, 0", got > 0 ? v : "");
    if ((got = api_query_get(query, "format", v, sizeof v)) > 0)
        r->prometheus = !strcmp(v, "prometheus"); /* anything else is JSON, as SGLang answers it */
    else if (got < 0)
        api_bad(e, 400, "query \"format\": longer than %zu bytes; expected json or prometheus", sizeof v - 1);
    return done(e);
}
