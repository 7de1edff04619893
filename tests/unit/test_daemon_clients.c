/* test_daemon_clients.c - the daemon's client table and result retention,
 * its hash map, and the /metrics text (compiled in: the daemon is not in
 * librollout.a). */
#include "daemon/clients.c"
#include "daemon/serve_hist.c"
#include "daemon/metrics.c"
#include "base/u64map.c"

#include "tests/unit/test.h"

static void map_put_get_delete(void)
{
    u64map m;
    umap_init(&m);
    for (uint64_t k = 1; k <= 5000; k++)
        CHECK_OK(umap_put(&m, k * 7919, (void *)(uintptr_t)k));
    for (uint64_t k = 1; k <= 5000; k += 2)
        CHECK(umap_del(&m, k * 7919) == (void *)(uintptr_t)k, "del %llu", (unsigned long long)k);
    for (uint64_t k = 1; k <= 5000; k++) {
        void *v = umap_get(&m, k * 7919);
        CHECK(v == (k % 2 ? NULL : (void *)(uintptr_t)k), "get %llu", (unsigned long long)k);
    }
    CHECK(m.count == 2500, "%zu", m.count);
    CHECK(umap_put(&m, 0, NULL) == RD_EINVAL, "key 0");
    umap_free(&m);
}

/* An engine result for request key with n_tokens tokens. */
static eng_result fake(uint64_t key, int32_t idx, int32_t n_tokens)
{
    eng_result r = {.tag = key, .sample_idx = idx, .n_tokens = n_tokens, .finish = FINISH_LENGTH};
    r.token_ids = calloc((size_t)n_tokens + 1, sizeof(int32_t));
    r.logprobs = calloc((size_t)n_tokens + 1, sizeof(float));
    return r;
}

static void retention_seq_and_acks(void)
{
    cl_table t;
    cl_init(&t, 4, 1 << 20);
    cl_client *c;
    CHECK_OK(cl_new(&t, "a", 0, &c));
    CHECK(c->id != 0 && cl_find(&t, c->id) == c, "find");
    uint64_t mb = proto_result_max_bytes(8, 0, 0);
    cl_req *q;
    CHECK_OK(cl_room(&t, c, 3, mb));
    CHECK_OK(cl_add_req(&t, c, 10, 3, mb, &q));
    CHECK(cl_room(&t, c, 2, mb) == RD_EBUSY, "3 reserved + 2 > 4");
    CHECK_OK(cl_room(&t, c, 1, mb));
    CHECK(cl_find_req(c, 10) == q && t.unfinished == 1, "request indexed");
    for (int i = 0; i < 3; i++) {
        eng_result r = fake(q->key, i, 5);
        CHECK(cl_finish(&t, &r, 0, 0, 0) == c, "finish %d", i);
    }
    CHECK(c->n_held == 3 && c->reserved == 0 && c->last_seq == 3 && t.unfinished == 0, "held");
    CHECK(c->held->pr.seq == 1 && c->held_tail->pr.seq == 3, "seq order");
    CHECK(c->held->bytes == proto_result_bytes(&c->held->pr) && c->held->bytes <= mb, "bytes");
    /* Still full until acked: held results count against retention. */
    CHECK(cl_room(&t, c, 2, mb) == RD_EBUSY, "held count");
    cl_ack(&t, c, 2);
    CHECK(c->n_held == 1 && c->held->pr.seq == 3, "ack 2");
    CHECK(cl_find_req(c, 10) == q, "remembered until every sample is acked");
    cl_ack(&t, c, 1); /* a lower ack changes nothing */
    CHECK(c->n_held == 1 && c->ack_seq == 2, "lower ack");
    cl_ack(&t, c, 3);
    CHECK(cl_idle(c) && cl_find_req(c, 10) == NULL, "forgotten after the last ack");
    cl_free(&t);
}

static void forgotten_client_orphans_requests(void)
{
    cl_table t;
    cl_init(&t, 100, 1 << 20);
    cl_client *c;
    CHECK_OK(cl_new(&t, "b", 0, &c));
    cl_req *q;
    CHECK_OK(cl_add_req(&t, c, 1, 2, 1000, &q));
    uint64_t key = q->key;
    eng_result r = fake(key, 0, 3);
    CHECK(cl_finish(&t, &r, 0, 0, 0) == c, "first sample");
    cl_forget(&t, c);
    CHECK(t.n_clients == 0 && t.unfinished == 1, "the engine still has one sample");
    r = fake(key, 1, 3);
    CHECK(cl_finish(&t, &r, 0, 0, 0) == NULL, "dropped: no client");
    CHECK(t.unfinished == 0 && umap_get(&t.reqs, key) == NULL, "orphan freed");
    cl_free(&t);
}

static void prometheus_text(void)
{
    mx_snapshot s = {.model = "m\"x", .model_path = "p", .backend = "cpu", .state = "serving", .block_size = 16};
    s.eng.running = 3;
    s.eng.kv_blocks_total = 10;
    s.eng.kv_blocks_used = 5;
    s.eng.generated_tokens = 42;
    char *text = mx_prometheus(&s);
    CHECK(text != NULL, "oom");
    CHECK(strstr(text, "# TYPE rolloutd:num_requests_running gauge\n"), "type line");
    CHECK(strstr(text, "rolloutd:num_requests_running{model_name=\"m\\\"x\"} 3\n"), "escaped label: %s", text);
    CHECK(strstr(text, "rolloutd:kv_cache_usage_perc{model_name=\"m\\\"x\"} 0.5\n"), "usage");
    CHECK(strstr(text, "rolloutd:generation_tokens_total{model_name=\"m\\\"x\"} 42\n"), "counter");
    CHECK(text[strlen(text) - 1] == '\n', "ends with a newline");
    free(text);
    char *json = mx_status_json(&s);
    CHECK(json && strstr(json, "\"blocks_used\":5") && strstr(json, "\"last_weight_update\":null"), "%s", json);
    free(json);
    mx_window w = {0};
    double p, g;
    mx_window_push(&w, 0, 0, 0);
    for (int i = 1; i <= 20; i++)
        mx_window_push(&w, i, 10 * i, 100 * i);
    mx_window_rates(&w, &p, &g);
    CHECK(p == 10 && g == 100, "%g %g", p, g);
}

/* A request that asked for routes: its results carry the flag and the shape,
 * the ids narrowed in place to the request's width (the engine's int32 ids
 * become 1 or 2 bytes each, the same values); a sample without routes from
 * the engine (aborted before it ran) still has the flag, with 0 positions;
 * a request that did not ask gets no flag even when the engine has routes. */
static void routes_narrowed_in_place(void)
{
    cl_table t;
    cl_init(&t, 100, 1 << 20);
    cl_client *c;
    CHECK_OK(cl_new(&t, "r", 0, &c));
    for (uint8_t width = 1; width <= 4; width *= 2) {
        cl_req *q;
        CHECK_OK(cl_add_req(&t, c, width, 2, 1 << 16, &q));
        q->route_layers = 3, q->route_k = 2, q->route_width = width;
        eng_result r = fake(q->key, 0, 4);
        r.n_routes = 5, r.route_layers = 3, r.route_k = 2;
        r.routes = malloc(sizeof(int32_t) * 30);
        for (int i = 0; i < 30; i++)
            r.routes[i] = (i * 37) % (width == 1 ? 256 : width == 2 ? 65536 : 100000);
        CHECK(cl_finish(&t, &r, 0, 0, 0) == c, "finish");
        const proto_result *p = &c->held_tail->pr;
        CHECK((p->flags & PROTO_RESULT_ROUTES) && p->n_routes == 5 && p->route_layers == 3 && p->route_k == 2 &&
              p->route_width == width, "width %u: shape", width);
        for (int i = 0; i < 30; i++) {
            uint32_t want = (uint32_t)((i * 37) % (width == 1 ? 256 : width == 2 ? 65536 : 100000));
            uint32_t got = width == 1 ? ((const uint8_t *)p->routes)[i]
                           : width == 2 ? ((const uint16_t *)p->routes)[i] : (uint32_t)((const int32_t *)p->routes)[i];
            CHECK(got == want, "width %u: id %d is %u, expected %u", width, i, got, want);
        }
        CHECK(c->held_tail->bytes == proto_result_bytes(p) &&
              c->held_tail->bytes == 88 + 4 * 8 + 16 + proto_routes_bytes(5, 3, 2, width), "width %u: bytes", width);
        eng_result none = fake(q->key, 1, 0);     /* aborted before it ran: no routes from the engine */
        CHECK(cl_finish(&t, &none, 0, 0, 0) == c, "finish");
        p = &c->held_tail->pr;
        CHECK((p->flags & PROTO_RESULT_ROUTES) && p->n_routes == 0 && p->route_layers == 3 && p->routes == NULL,
              "no routes");
    }
    cl_req *q;
    CHECK_OK(cl_add_req(&t, c, 99, 1, 1 << 16, &q));
    eng_result r = fake(q->key, 0, 2);
    r.n_routes = 1, r.route_layers = 1, r.route_k = 1;
    r.routes = calloc(1, sizeof(int32_t));
    CHECK(cl_finish(&t, &r, 0, 0, 0) == c, "finish");
    CHECK(!(c->held_tail->pr.flags & PROTO_RESULT_ROUTES) && c->held_tail->pr.n_routes == 0, "routes not asked");
    cl_free(&t);
}

/* A request that named a LoRA adapter (protocol version 6): every result has the flag and the name; the
 * version is the engine's for a sample that ran, 0 for one the engine never took (no name in its result). */
static void lora_tail_on_results(void)
{
    cl_table t;
    cl_init(&t, 100, 1 << 20);
    cl_client *c;
    CHECK_OK(cl_new(&t, "l", 0, &c));
    cl_req *q;
    CHECK_OK(cl_add_req(&t, c, 1, 3, 1 << 16, &q));
    snprintf(q->lora, sizeof q->lora, "%s", "math-v1");
    eng_result r = fake(q->key, 0, 2);
    snprintf(r.lora, sizeof r.lora, "%s", "math-v1");
    r.lora_version = 3;
    CHECK(cl_finish(&t, &r, 0, 0, 0) == c, "finish");
    const proto_result *p = &c->held_tail->pr;
    CHECK((p->flags & PROTO_RESULT_LORA) && p->lora.len == 7 && !memcmp(p->lora.ptr, "math-v1", 7) &&
          p->lora_version == 3, "ran: flags 0x%x version %llu", p->flags, (unsigned long long)p->lora_version);
    CHECK(c->held_tail->bytes == proto_result_bytes(p) && c->held_tail->bytes == 88 + 2 * 8 + 16 + 17, "bytes %llu",
          (unsigned long long)c->held_tail->bytes);
    eng_result none = fake(q->key, 1, 0);       /* refused by the engine: no adapter in its result */
    none.finish = FINISH_ERROR;
    CHECK(cl_finish(&t, &none, 0, 0, 0) == c, "finish");
    p = &c->held_tail->pr;
    CHECK((p->flags & PROTO_RESULT_LORA) && !strcmp(p->lora.ptr, "math-v1") && p->lora_version == 0,
          "never ran: the request's name, version 0");
    proto_buf b;
    proto_buf_init(&b);
    proto_msg m = {.type = PROTO_RESULTS, .version = 6};
    m.results.n_results = 1;
    m.results.results = p;
    CHECK_OK(proto_encode(&b, &m));
    proto_buf_free(&b);
    cl_req *base;
    CHECK_OK(cl_add_req(&t, c, 2, 1, 1 << 16, &base));
    eng_result br = fake(base->key, 0, 1);
    CHECK(cl_finish(&t, &br, 0, 0, 0) == c, "finish");
    p = &c->held_tail->pr;
    CHECK(!(p->flags & PROTO_RESULT_LORA) && p->lora.len == 0 && p->lora_version == 0, "base model: no tail");
    cl_free(&t);
}

int main(void)
{
    RUN(map_put_get_delete);
    RUN(retention_seq_and_acks);
    RUN(forgotten_client_orphans_requests);
    RUN(routes_narrowed_in_place);
    RUN(lora_tail_on_results);
    RUN(prometheus_text);
    TEST_EXIT();
}
