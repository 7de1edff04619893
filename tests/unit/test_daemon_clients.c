/* test_daemon_clients.c - the daemon's client table and result retention,
 * its hash map, and the /metrics text (compiled in: the daemon is not in
 * librollout.a). */
#include "daemon/clients.c"
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

int main(void)
{
    RUN(map_put_get_delete);
    RUN(retention_seq_and_acks);
    RUN(forgotten_client_orphans_requests);
    RUN(prometheus_text);
    TEST_EXIT();
}
