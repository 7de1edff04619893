/* test_daemon_config.c - the daemon's config: defaults, JSON keys, the
 * messages for unknown keys and bad values, flag overrides. The daemon is not
 * in librollout.a, so its config module is compiled in here. */
#include "daemon/config.c"
#include "daemon/relay_allow.c"

#include "base/err.h"
#include "tests/unit/test.h"

static void defaults_match_the_issue(void)
{
    cfg_daemon c;
    cfg_defaults(&c);
    CHECK(!strcmp(c.listen, "tcp://127.0.0.1:7070"), "%.100s", c.listen);
    CHECK(!strcmp(c.http_listen, "127.0.0.1:7071"), "%.100s", c.http_listen);
    CHECK(!strcmp(c.model, "models/SmolLM2-135M-Instruct.Q4_1.gguf"), "%.100s", c.model);
    CHECK(c.block_size == 16 && c.max_num_seqs == 64 && c.kv_cache_bytes == (int64_t)1 << 30, "sizes");
    CHECK_OK(cfg_validate(&c));
}

static void json_keys_apply(void)
{
    cfg_daemon c;
    cfg_defaults(&c);
    CHECK_OK(cfg_parse_json(&c, "{\"kv_cache_bytes\": 67108864, \"listen\": \"tcp://127.0.0.1:9\", \"drain_s\": 0}",
                            "t"));
    CHECK(c.kv_cache_bytes == 64 << 20 && c.drain_s == 0, "%lld", (long long)c.kv_cache_bytes);
    CHECK(!strcmp(c.listen, "tcp://127.0.0.1:9"), "%.100s", c.listen);
    CHECK(c.max_num_seqs == 64, "untouched keys keep defaults");
}

static void refusals_name_the_key(void)
{
    static const struct {
        const char *json, *needle;
    } bad[] = {
        {"{\"kv_cache_byte\": 1}", "unknown key \"kv_cache_byte\""},
        {"{\"max_num_seqs\": \"8\"}", "\"max_num_seqs\" is not a number"},
        {"{\"max_num_seqs\": 0}", "\"max_num_seqs\" = 0"},
        {"{\"max_num_seqs\": 2.5}", "expected an integer"},
        {"{\"threads\": -1}", "\"threads\""},
        {"{\"listen\": 7070}", "\"listen\" is not a string"},
        {"{\"model\": \"\"}", "\"model\""},
        {"[1, 2]", "not a JSON object"},
        {"{\"drain_s\": 1,", "not valid JSON"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        cfg_daemon c;
        cfg_defaults(&c);
        int rc = cfg_parse_json(&c, bad[i].json, "t");
        CHECK(rc == RD_EINVAL, "%s accepted", bad[i].json);
        CHECK(strstr(rd_errmsg(), bad[i].needle), "%s: message '%s' lacks '%s'", bad[i].json, rd_errmsg(),
              bad[i].needle);
    }
    cfg_daemon c;
    cfg_defaults(&c);
    snprintf(c.backend, sizeof c.backend, "tpu");
    CHECK(cfg_validate(&c) == RD_EINVAL && strstr(rd_errmsg(), "\"backend\""), "%s", rd_errmsg());
    cfg_defaults(&c);
    snprintf(c.http_listen, sizeof c.http_listen, "localhost");
    CHECK(cfg_validate(&c) == RD_EINVAL && strstr(rd_errmsg(), "\"http_listen\""), "%s", rd_errmsg());
    cfg_defaults(&c);
    c.max_batch_tokens = 8;
    CHECK(cfg_validate(&c) == RD_EINVAL && strstr(rd_errmsg(), "max_batch_tokens"), "%s", rd_errmsg());
}

static void flags_override_the_file(void)
{
    const char *path = "/tmp/test_daemon_config.json";
    FILE *f = fopen(path, "w");
    CHECK(f != NULL, "cannot write %s", path);
    fputs("{\"max_num_seqs\": 8, \"max_batch_tokens\": 64, \"threads\": 3}", f);
    fclose(f);
    /* Flags before --config still override it. */
    char *argv[] = {"rolloutd", "--threads", "2", "--config", (char *)path, "--listen", "tcp://127.0.0.1:1234",
                    "--status-listen", "127.0.0.1:1235", "--kv-cache-bytes", "33554432", "--result-retention",
                    "99", NULL};
    int argc = (int)(sizeof argv / sizeof argv[0]) - 1, help = 0;
    cfg_daemon c;
    CHECK_OK(cfg_from_args(&c, argc, argv, &help));
    CHECK(!help, "help");
    CHECK(c.max_num_seqs == 8 && c.max_batch_tokens == 64, "file values");
    CHECK(c.threads == 2, "flag beats file: %lld", (long long)c.threads);
    CHECK(!strcmp(c.listen, "tcp://127.0.0.1:1234") && !strcmp(c.http_listen, "127.0.0.1:1235"), "addresses");
    CHECK(c.kv_cache_bytes == 32 << 20 && c.result_retention == 99, "sizes");

    char *bad1[] = {"rolloutd", "--max-num-seqs", "lots", NULL};
    CHECK(cfg_from_args(&c, 3, bad1, &help) == RD_EINVAL && strstr(rd_errmsg(), "--max-num-seqs"), "%s",
          rd_errmsg());
    char *bad2[] = {"rolloutd", "--frobnicate", "1", NULL};
    CHECK(cfg_from_args(&c, 3, bad2, &help) == RD_EINVAL && strstr(rd_errmsg(), "--frobnicate"), "%s", rd_errmsg());
    char *bad3[] = {"rolloutd", "--threads", NULL};
    CHECK(cfg_from_args(&c, 2, bad3, &help) == RD_EINVAL && strstr(rd_errmsg(), "needs a value"), "%s",
          rd_errmsg());
    char *bad4[] = {"rolloutd", "--config", "/nonexistent/x.json", NULL};
    CHECK(cfg_from_args(&c, 3, bad4, &help) == RD_EINVAL && strstr(rd_errmsg(), "/nonexistent/x.json"), "%s",
          rd_errmsg());
    char *h[] = {"rolloutd", "--help", NULL};
    CHECK_OK(cfg_from_args(&c, 2, h, &help));
    CHECK(help && strstr(cfg_usage(), "--kv-cache-bytes"), "usage");
    remove(path);
}

static void http_keys_and_the_old_listen_name(void)
{
    cfg_daemon c;
    cfg_defaults(&c);
    CHECK(c.http_max_connections == 1024 && c.max_http_body_bytes == 64 << 20, "limits");
    CHECK(c.http_header_timeout_ms == 10000 && c.http_idle_timeout_ms == 60000, "timeouts");
    CHECK(c.http_stream_queue_bytes == 4 << 20 && c.api_key_file[0] == 0 && c.http_insecure == 0, "stream, auth");
    /* status_listen is the old name of http_listen: both set the same field. */
    CHECK_OK(cfg_parse_json(&c, "{\"status_listen\": \"127.0.0.1:9\"}", "t"));
    CHECK(!strcmp(c.http_listen, "127.0.0.1:9"), "%.100s", c.http_listen);
    CHECK_OK(cfg_parse_json(&c, "{\"http_listen\": \"127.0.0.1:8\", \"status_listen\": \"127.0.0.1:8\"}", "t"));
    CHECK(!strcmp(c.http_listen, "127.0.0.1:8"), "%.100s", c.http_listen);
    int rc = cfg_parse_json(&c, "{\"http_listen\": \"127.0.0.1:8\", \"status_listen\": \"127.0.0.1:9\"}", "t");
    CHECK(rc == RD_EINVAL && strstr(rd_errmsg(), "\"http_listen\"") && strstr(rd_errmsg(), "\"status_listen\""), "%s",
          rd_errmsg());
    /* 0/1 switches take true/false too; other values are refused. */
    CHECK_OK(cfg_parse_json(&c, "{\"http_insecure\": true, \"prefix_cache\": false}", "t"));
    CHECK(c.http_insecure == 1 && c.prefix_cache == 0, "bools");
    CHECK_OK(cfg_parse_json(&c, "{\"http_insecure\": 0, \"api_key_file\": \"/etc/rolloutd.key\"}", "t"));
    CHECK(c.http_insecure == 0 && !strcmp(c.api_key_file, "/etc/rolloutd.key"), "key file");
    static const struct {
        const char *json, *needle;
    } bad[] = {
        {"{\"http_insecure\": 2}", "\"http_insecure\""},
        {"{\"http_insecure\": \"yes\"}", "\"http_insecure\" is not a number"},
        {"{\"max_http_body_bytes\": -1}", "\"max_http_body_bytes\""},
        {"{\"http_header_timeout_ms\": 0}", "\"http_header_timeout_ms\""},
        {"{\"http_idle_timeout_ms\": 0}", "\"http_idle_timeout_ms\""},
        {"{\"http_stream_queue_bytes\": 10}", "\"http_stream_queue_bytes\""},
        {"{\"http_max_connections\": 0}", "\"http_max_connections\""},
        {"{\"api_key_file\": 1}", "\"api_key_file\" is not a string"},
        {"{\"threads\": true}", "\"threads\" is not a number"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        cfg_defaults(&c);
        rc = cfg_parse_json(&c, bad[i].json, "t");
        CHECK(rc == RD_EINVAL && strstr(rd_errmsg(), bad[i].needle), "%s: %d '%s'", bad[i].json, rc, rd_errmsg());
    }
    /* Flags: the two names must agree on one command line; a flag overrides the file's old name. */
    int help;
    char *a1[] = {"rolloutd", "--http-listen", "127.0.0.1:1", "--status-listen", "127.0.0.1:2", NULL};
    rc = cfg_from_args(&c, 5, a1, &help);
    CHECK(rc == RD_EINVAL && strstr(rd_errmsg(), "--http-listen") && strstr(rd_errmsg(), "--status-listen"), "%s",
          rd_errmsg());
    char *a2[] = {"rolloutd", "--config", "configs/test.json", "--http-listen", "127.0.0.1:5", "--http-insecure",
                  "true", "--max-http-body-bytes", "1024", NULL};
    CHECK_OK(cfg_from_args(&c, 9, a2, &help));
    CHECK(!strcmp(c.http_listen, "127.0.0.1:5") && c.http_insecure == 1 && c.max_http_body_bytes == 1024, "%.100s",
          c.http_listen);
    CHECK(strstr(cfg_usage(), "--http-listen") && strstr(cfg_usage(), "--api-key-file") &&
              strstr(cfg_usage(), "--update-idle-s"), "usage is cut");
}

/* relay_allow: the entry forms, the default by the learner socket's address, and refusals naming the entry. */
static void relay_allow_parses(void)
{
    ra_list l;
    CHECK_OK(ra_parse("10.0.0.2:7000, 10.0.0.3:*,[fd00::5]:7001,[::1]:*", 0, &l));
    CHECK(l.n == 4, "%d entries", l.n);
    CHECK(ra_allows(&l, "10.0.0.2", 7000) && !ra_allows(&l, "10.0.0.2", 7001), "HOST:PORT is one port");
    CHECK(ra_allows(&l, "10.0.0.3", 1) && ra_allows(&l, "10.0.0.3", 65535), "HOST:* is any port");
    CHECK(ra_allows(&l, "fd00:0::5", 7001) && !ra_allows(&l, "fd00::5", 7000), "[V6]:PORT, any spelling");
    CHECK(ra_allows(&l, "::1", 9) && !ra_allows(&l, "127.0.0.1", 9), "[::1]:* is not 127.0.0.1");
    CHECK(!ra_allows(&l, "10.0.0.4", 7000) && !ra_allows(&l, "example.com", 7000) && !ra_allows(&l, "", 1),
          "outside, a name, empty");
    CHECK(ra_allows(&l, "::ffff:10.0.0.3", 5), "an IPv4-mapped host matches its IPv4 entry");
    char d[200];
    ra_describe(&l, d, sizeof d);
    CHECK(!strcmp(d, "10.0.0.2:7000,10.0.0.3:*,[fd00::5]:7001,[::1]:*"), "%s", d);
    /* The default: loopback while the learner socket is on loopback, else nothing. */
    CHECK_OK(ra_parse("", 1, &l));
    CHECK(ra_allows(&l, "127.0.0.1", 7000) && ra_allows(&l, "127.5.0.1", 1) && ra_allows(&l, "::1", 2) &&
              !ra_allows(&l, "10.0.0.1", 7000), "default on loopback");
    CHECK_OK(ra_parse("", 0, &l));
    CHECK(l.n == 0 && !ra_allows(&l, "127.0.0.1", 7000), "default off loopback: none");
    ra_describe(&l, d, sizeof d);
    CHECK(!strcmp(d, "none"), "%s", d);
    CHECK_OK(ra_parse("none", 1, &l));
    CHECK(l.n == 0, "none");
    CHECK_OK(ra_parse("loopback,192.168.1.9:*", 0, &l));
    CHECK(ra_allows(&l, "127.0.0.1", 5) && ra_allows(&l, "192.168.1.9", 5) && !ra_allows(&l, "192.168.1.8", 5),
          "loopback entry");
    CHECK(ra_url_is_loopback("tcp://127.0.0.1:7070") && ra_url_is_loopback("tcp://[::1]:7070") &&
              ra_url_is_loopback("ipc:///tmp/x") && ra_url_is_loopback("tls+tcp://127.0.0.1:1") &&
              !ra_url_is_loopback("tcp://0.0.0.0:7070") && !ra_url_is_loopback("tcp://localhost:7070") &&
              !ra_url_is_loopback("tcp://10.0.0.1:7070"), "learner URLs");
    /* WEIGHTS_SYNC's url: host and port from a learner URL; localhost is 127.0.0.1, other names are out. */
    CHECK_OK(ra_parse("10.0.0.2:7070,[fd00::5]:*", 1, &l));
    CHECK(ra_allows_url(&l, "tcp://10.0.0.2:7070") && ra_allows_url(&l, "tls+tcp://10.0.0.2:7070") &&
              !ra_allows_url(&l, "tcp://10.0.0.2:7071") && ra_allows_url(&l, "tcp://[fd00::5]:9") &&
              !ra_allows_url(&l, "tcp://host.example:7070") && !ra_allows_url(&l, "tcp://10.0.0.2") &&
              !ra_allows_url(&l, "tcp://localhost:7070") && !ra_allows_url(&l, "ipc:///tmp/x"), "urls");
    CHECK_OK(ra_parse("", 1, &l));
    CHECK(ra_allows_url(&l, "tcp://localhost:7070") && ra_allows_url(&l, "tcp://127.0.0.1:1") &&
              ra_allows_url(&l, "tcp://[::1]:2") && !ra_allows_url(&l, "tcp://192.0.2.1:7070"), "default urls");
    const char *bad[] = {"10.0.0.1", "10.0.0.1:0", "10.0.0.1:70000", "10.0.0.1:x", "fd00::1:7000", "[10.0.0.1]:1",
                         "host.example:7000", "none,10.0.0.1:*", "10.0.0.1:*,", "[fd00::1]7000", "*:7000"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        int rc = ra_parse(bad[i], 1, &l);
        CHECK(rc == RD_EINVAL && strstr(rd_errmsg(), "relay_allow"), "\"%s\": rc %d: %s", bad[i], rc, rd_errmsg());
        CHECK(l.n == 0, "a refused list is empty");
    }
    /* Through the config: a bad list stops the daemon at start, a good one goes by its flag. */
    cfg_daemon c;
    int help;
    char *a1[] = {"rolloutd", "--relay-allow", "10.0.0.1:77", NULL};
    CHECK_OK(cfg_from_args(&c, 3, a1, &help));
    CHECK(!strcmp(c.relay_allow, "10.0.0.1:77"), "%.100s", c.relay_allow);
    char *a2[] = {"rolloutd", "--relay-allow", "10.0.0.1", NULL};
    CHECK(cfg_from_args(&c, 3, a2, &help) == RD_EINVAL && strstr(rd_errmsg(), "\"10.0.0.1\""), "%s", rd_errmsg());
    cfg_defaults(&c);
    CHECK(c.max_lane_connections == 16 && !c.relay_allow[0] && !c.http_tls_cert_file[0], "new defaults");
    CHECK_OK(cfg_parse_json(&c, "{\"http_tls_cert_file\": \"a.pem\"}", "test"));
    CHECK(cfg_validate(&c) == RD_EINVAL && strstr(rd_errmsg(), "http_tls_key_file"), "%s", rd_errmsg());
}

/* serve_dtype: as_pushed by default, q8_0 from a file or a flag, anything
 * else refused naming the key and the values it takes. */
static void serve_dtype_values(void)
{
    cfg_daemon c;
    cfg_defaults(&c);
    CHECK(!strcmp(c.serve_dtype, "as_pushed"), "default %s", c.serve_dtype);
    CHECK_OK(cfg_parse_json(&c, "{\"serve_dtype\": \"q8_0\"}", "t"));
    CHECK_OK(cfg_validate(&c));
    CHECK(!strcmp(c.serve_dtype, "q8_0"), "%s", c.serve_dtype);
    char *argv[] = {"rolloutd", "--serve-dtype", "as_pushed", NULL};
    int help = 0;
    CHECK_OK(cfg_from_args(&c, 3, argv, &help));
    CHECK(!strcmp(c.serve_dtype, "as_pushed"), "flag: %s", c.serve_dtype);
    const char *bad[] = {"{\"serve_dtype\": \"int4\"}", "{\"serve_dtype\": \"Q8_0\"}", "{\"serve_dtype\": \"\"}"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        cfg_defaults(&c);
        int rc = cfg_parse_json(&c, bad[i], "t");
        if (rc == 0)
            rc = cfg_validate(&c);
        CHECK(rc == RD_EINVAL && strstr(rd_errmsg(), "serve_dtype") &&
              (strstr(rd_errmsg(), "\"q4_k\" or \"fp8\"") || strstr(rd_errmsg(), "empty")), "%s: %d '%s'",
              bad[i], rc, rd_errmsg());
    }
    char *argv2[] = {"rolloutd", "--serve-dtype", "fp4", NULL};
    cfg_daemon d;
    int rc = cfg_from_args(&d, 3, argv2, &help);
    if (rc == 0)
        rc = cfg_validate(&d);
    CHECK(rc == RD_EINVAL && strstr(rd_errmsg(), "\"fp4\"") && strstr(rd_errmsg(), "q8_0"), "%d '%s'", rc,
          rd_errmsg());
}

/* spec_decode: auto by default (old configs: spec_max_draft alone decides),
 * off and ngram from a file or a flag, anything else refused naming the key. */
static void spec_decode_values(void)
{
    cfg_daemon c;
    cfg_defaults(&c);
    CHECK(!strcmp(c.spec_decode, "auto") && c.spec_max_draft == 0, "default %s/%lld", c.spec_decode,
          (long long)c.spec_max_draft);
    CHECK_OK(cfg_parse_json(&c, "{\"spec_decode\": \"ngram\", \"spec_max_draft\": 4}", "t"));
    CHECK_OK(cfg_validate(&c));
    CHECK(!strcmp(c.spec_decode, "ngram") && c.spec_max_draft == 4, "%s", c.spec_decode);
    char *argv[] = {"rolloutd", "--spec-decode", "off", NULL};
    int help = 0;
    CHECK_OK(cfg_from_args(&c, 3, argv, &help));
    CHECK(!strcmp(c.spec_decode, "off"), "flag: %s", c.spec_decode);
    const char *bad[] = {"{\"spec_decode\": \"eagle\"}", "{\"spec_decode\": \"Ngram\"}",
                         "{\"spec_decode\": 1}"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        cfg_defaults(&c);
        int rc = cfg_parse_json(&c, bad[i], "t");
        if (rc == 0)
            rc = cfg_validate(&c);
        CHECK(rc == RD_EINVAL && strstr(rd_errmsg(), "spec_decode") && strstr(rd_errmsg(), "ngram"), "%s: %d '%s'",
              bad[i], rc, rd_errmsg());
    }
}

/* spec_draft_sizing: measured by default, fixed from a file or a flag, anything
 * else refused naming the key and its values. */
static void spec_draft_sizing_values(void)
{
    cfg_daemon c;
    cfg_defaults(&c);
    CHECK(!strcmp(c.spec_draft_sizing, "measured"), "default %s", c.spec_draft_sizing);
    CHECK_OK(cfg_parse_json(&c, "{\"spec_draft_sizing\": \"fixed\"}", "t"));
    CHECK_OK(cfg_validate(&c));
    CHECK(!strcmp(c.spec_draft_sizing, "fixed"), "%s", c.spec_draft_sizing);
    char *argv[] = {"rolloutd", "--spec-draft-sizing", "measured", NULL};
    int help = 0;
    CHECK_OK(cfg_from_args(&c, 3, argv, &help));
    CHECK(!strcmp(c.spec_draft_sizing, "measured"), "flag: %s", c.spec_draft_sizing);
    const char *bad[] = {"{\"spec_draft_sizing\": \"auto\"}", "{\"spec_draft_sizing\": \"Fixed\"}",
                         "{\"spec_draft_sizing\": 0}"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        cfg_defaults(&c);
        int rc = cfg_parse_json(&c, bad[i], "t");
        if (rc == 0)
            rc = cfg_validate(&c);
        CHECK(rc == RD_EINVAL && strstr(rd_errmsg(), "spec_draft_sizing") && strstr(rd_errmsg(), "measured"),
              "%s: %d '%s'", bad[i], rc, rd_errmsg());
    }
}

/* served_model_name (vLLM's --served-model-name) goes into JSON, a Prometheus label and HELLO_OK: valid
 * UTF-8 without control bytes, under 256 bytes; "" (the default) keeps the file's base name. */
static void served_model_name_values(void)
{
    cfg_daemon c;
    cfg_defaults(&c);
    CHECK(!c.served_model_name[0] && c.enable_return_routed_experts == 0, "defaults");
    CHECK_OK(cfg_parse_json(&c, "{\"served_model_name\": \"Qwen/Qwen3-4B\", \"enable_return_routed_experts\": true}",
                            "t"));
    CHECK(!strcmp(c.served_model_name, "Qwen/Qwen3-4B") && c.enable_return_routed_experts == 1, "%s",
          c.served_model_name);
    CHECK_OK(cfg_validate(&c));
    CHECK_OK(cfg_parse_json(&c, "{\"served_model_name\": \"caf\\u00e9 \\u6a21\\u578b\"}", "t"));
    CHECK_OK(cfg_validate(&c));
    static const char *bad[] = {"a\tb", "a\x7f", "\xff\xfe", "\xc3"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        snprintf(c.served_model_name, sizeof c.served_model_name, "%s", bad[i]);
        CHECK(cfg_validate(&c) == RD_EINVAL && strstr(rd_errmsg(), "served_model_name"), "%zu: %s", i, rd_errmsg());
    }
    char big[400];
    snprintf(big, sizeof big, "{\"served_model_name\": \"%0300d\"}", 0);
    cfg_defaults(&c);
    CHECK(cfg_parse_json(&c, big, "t") == RD_EINVAL && strstr(rd_errmsg(), "served_model_name"), "%s", rd_errmsg());
}

static void shipped_config_spells_the_defaults(void)
{
    cfg_daemon c, d;
    cfg_defaults(&c);
    cfg_defaults(&d);
    CHECK_OK(cfg_load_file(&c, "configs/rolloutd.json"));
    for (size_t i = 0; i < N_FIELDS; i++) {
        const cfg_field *f = &FIELDS[i];
        const char *a = (const char *)&c + f->off, *b = (const char *)&d + f->off;
        size_t n = f->kind == CFG_TEXT ? (size_t)f->hi : f->kind == CFG_INT ? sizeof(int64_t) : sizeof(double);
        CHECK(!memcmp(a, b, n), "configs/rolloutd.json: \"%s\" differs from the default", f->key);
    }
}

static void shipped_configs_load(void)
{
    const char *files[] = {"configs/rolloutd.json", "configs/test.json"};
    for (int i = 0; i < 2; i++) {
        cfg_daemon c;
        cfg_defaults(&c);
        CHECK_OK(cfg_load_file(&c, files[i]));
        CHECK_OK(cfg_validate(&c));
    }
}

int main(void)
{
    RUN(defaults_match_the_issue);
    RUN(json_keys_apply);
    RUN(refusals_name_the_key);
    RUN(flags_override_the_file);
    RUN(http_keys_and_the_old_listen_name);
    RUN(relay_allow_parses);
    RUN(serve_dtype_values);
    RUN(spec_decode_values);
    RUN(spec_draft_sizing_values);
    RUN(served_model_name_values);
    RUN(shipped_config_spells_the_defaults);
    RUN(shipped_configs_load);
    TEST_EXIT();
}
