/* config.c - see config.h. One table lists every key: its type, range and
 * where it lives; the JSON reader and the flag parser both walk it, so a key
 * and its flag (--key-with-dashes) can never disagree. */
#include "daemon/config.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/relay_allow.h"
#include "engine/serve/engine.h"
#include "engine/update/staging.h"
#include "base/err.h"
#include "base/utf8.h"

typedef enum { CFG_INT, CFG_TEXT, CFG_REAL } cfg_kind;

typedef struct {
    const char *key;            /* JSON key; the flag is --key with '_' -> '-' */
    cfg_kind kind;
    size_t off;                 /* offset in cfg_daemon */
    int64_t lo, hi;             /* CFG_INT: inclusive range; CFG_TEXT: hi = buffer bytes */
    const char *what;           /* shown in --help */
} cfg_field;

#define I(k, lo, hi, what) {#k, CFG_INT, offsetof(cfg_daemon, k), lo, hi, what}
#define R(k, lo, hi, what) {#k, CFG_REAL, offsetof(cfg_daemon, k), lo, hi, what}
#define S(k, what) {#k, CFG_TEXT, offsetof(cfg_daemon, k), 1, sizeof(((cfg_daemon *)0)->k), what}

static const cfg_field FIELDS[] = {
    S(model, "GGUF model file"),
    S(backend, "\"cpu\" or \"cuda\""),
    S(kv_dtype, "KV cache element type: \"auto\" (the backend's: f32 on cpu, bf16 on cuda), \"f32\" (exact), "
      "\"bf16\" or \"f16\" (half the bytes; cpu only for f16, and f32 is cpu only), \"fp8\" (cuda only: E4M3 "
      "with a power-of-two scale per token and kv head, a quarter of f32's bytes plus one per head_dim)"),
    S(serve_dtype, "what pushed weights are served as: \"as_pushed\" (their pushed dtype, f32/f16/bf16), "
      "\"q8_0\" (the linear weights, embedding and LM head quantized to Q8_0 at COMMIT, as llama.cpp's Q8_0 "
      "files hold them), \"q4_k\" (the layers' linears in Q4_K where their rows are whole 256-blocks, Q8_0 "
      "elsewhere) or \"fp8\" (the layers' dense linears in FP8 E4M3 blocks, run by the cuda backend; the "
      "embedding, LM head and MoE experts stay as pushed; the cpu holds them as bf16); norms, biases and the "
      "MoE router stay as pushed"),
    S(logprobs_mode, "the log-probs the HTTP routes answer (vLLM's --logprobs-mode): \"raw_logprobs\" (the model's "
      "distribution at temperature 1, before any processing) or \"processed_logprobs\" (after logit_bias, "
      "min_tokens, the penalties, temperature and the top-k / top-p / min-p renormalisation: the distribution "
      "each token was drawn from; 0 for a greedy token); the alternatives stay raw. NNG requests choose per "
      "request (PROCESSED_LOGPROBS)"),
    S(listen, "learner socket NNG URL (tcp://HOST:PORT)"),
    S(http_listen, "HTTP server HOST:PORT (/status, /metrics, /health)"),
    {"status_listen", CFG_TEXT, offsetof(cfg_daemon, http_listen), 1, sizeof(((cfg_daemon *)0)->http_listen),
     "old name of http_listen"},
    I(threads, 0, 1024, "engine threads (0 = all cores)"),
    I(kv_cache_bytes, 1 << 20, (int64_t)1 << 50, "KV cache budget in bytes"),
    I(block_size, 1, 1024, "tokens per KV block"),
    I(max_num_seqs, 1, 65536, "sequences per engine step"),
    I(max_batch_tokens, 1, 1 << 24, "tokens per engine step"),
    I(max_queued_requests, 1, 1 << 24, "unfinished requests before SUBMIT gets BUSY"),
    I(max_requests_per_submit, 1, 1 << 20, "requests in one SUBMIT"),
    I(max_n, 1, 65536, "samples per request"),
    I(max_tokens, 0, 1 << 24, "generated tokens per sample (0 = context - 1)"),
    I(max_prompt_tokens, 0, 1 << 24, "prompt tokens (0 = context - 1)"),
    I(max_message_bytes, 4096, (int64_t)1 << 32, "largest protocol frame in bytes"),
    I(result_retention, 1, 1 << 24, "results held per client until acknowledged"),
    I(retention_bytes, 4096, (int64_t)1 << 40, "bytes of results held per client"),
    I(max_wait_ms, 0, 3600000, "FETCH long-poll cap in ms"),
    I(client_ttl_s, 1, 30 * 86400, "seconds before a silent client is forgotten"),
    I(max_clients, 1, 1 << 20, "known clients"),
    I(nng_contexts, 1, 4096, "concurrent protocol requests (parked FETCHes included)"),
    I(drain_s, 0, 86400, "SIGTERM: seconds in-flight requests may still run"),
    I(shutdown_grace_s, 0, 86400, "SIGTERM: seconds to deliver results after the drain"),
    I(http_max_connections, 1, 65536, "open HTTP connections (beyond: the oldest idle one is evicted)"),
    I(max_http_body_bytes, 0, (int64_t)1 << 40, "HTTP request body in bytes (larger: 413)"),
    I(max_http_inflight_body_bytes, 0, (int64_t)1 << 40,
      "HTTP request bodies held at once over all connections, bytes (0 = no bound; beyond: 503)"),
    I(http_header_timeout_ms, 1, 3600000, "ms for a request's line and headers; also the longest body stall"),
    I(http_idle_timeout_ms, 1, 86400000, "ms a keep-alive HTTP connection may wait for its next request"),
    I(http_stream_queue_bytes, 4096, (int64_t)1 << 40, "bytes queued to a slow HTTP stream client before it is cut"),
    {"api_key_file", CFG_TEXT, offsetof(cfg_daemon, api_key_file), 0, sizeof(((cfg_daemon *)0)->api_key_file),
     "file holding the HTTP Bearer key (\"\" = no auth, loopback only)"},
    I(http_insecure, 0, 1, "1: allow HTTP on a non-loopback address without api_key_file"),
    {"auth_token_file", CFG_TEXT, offsetof(cfg_daemon, auth_token_file), 0, sizeof(((cfg_daemon *)0)->auth_token_file),
     "file holding the shared secret: learner connections must prove it (HMAC, PROTOCOL.md section 14); the HTTP "
     "Bearer key too unless api_key_file is set (\"\" = none, loopback only)"},
    {"tls_cert_file", CFG_TEXT, offsetof(cfg_daemon, tls_cert_file), 0, sizeof(((cfg_daemon *)0)->tls_cert_file),
     "PEM certificate (chain) for a tls+tcp:// listen address"},
    {"tls_key_file", CFG_TEXT, offsetof(cfg_daemon, tls_key_file), 0, sizeof(((cfg_daemon *)0)->tls_key_file),
     "PEM private key of tls_cert_file"},
    I(insecure, 0, 1, "1: allow the learner socket and the data lane on a non-loopback address without "
      "auth_token_file (/status shows it)"),
    I(prefix_cache, 0, 1, "1: reuse cached full prompt blocks across requests; 0: off"),
    S(spec_decode, "speculative decoding: \"off\" or \"ngram\" (drafts from the sequence, its group and recent "
      "completions of its prompt, verified while the batch is a tail; outputs are bit-identical to it off); "
      "\"auto\" (default): ngram when spec_max_draft > 0, else off"),
    I(spec_max_draft, 0, 16, "speculative decoding: drafted tokens verified per sequence and step at most (with "
      "spec_decode ngram 0 = 6; with auto 0 = off)"),
    I(spec_max_batch, 0, 4096, "speculative decoding: a step drafts only while at most this many sequences run "
      "(the tail; past it verify rows cost what they save; 0 = 8)"),
    S(spec_draft_sizing, "speculative decoding: \"measured\" (default: a draft is verified only when the timed "
      "step cost says it returns 1.25x its row) or \"fixed\" (up to spec_max_draft while the batch is a tail, "
      "whatever the machine: for tests and comparisons)"),
    I(spec_store_bytes, 0, (int64_t)1 << 40, "speculative decoding: bytes of recent completions kept by prompt "
      "(salted with the weight version) for drafts when a prompt is asked again; the oldest go first (0 = none)"),
    {"update_listen", CFG_TEXT, offsetof(cfg_daemon, update_listen), 0, sizeof(((cfg_daemon *)0)->update_listen),
     "weight-update data lane HOST:PORT (\"\" = the learner socket's host, any free port; \"off\")"},
    {"weights_from", CFG_TEXT, offsetof(cfg_daemon, weights_from), 0, sizeof(((cfg_daemon *)0)->weights_from),
     "a peer daemon's learner URL: once serving, ask it to push its current weights here (WEIGHTS_SYNC, "
     "PROTOCOL.md section 10.13; \"\" = no)"},
    {"advertise_url", CFG_TEXT, offsetof(cfg_daemon, advertise_url), 0, sizeof(((cfg_daemon *)0)->advertise_url),
     "the learner URL a peer dials to push weights here (\"\" = listen; needed when listen is a wildcard)"},
    R(gpu_memory_utilization, 0, 1, "cuda: size the KV pool as this fraction of free device memory after the "
      "weights (0 = use kv_cache_bytes)"),
    I(max_staging_bytes, 0, (int64_t)1 << 50, "bytes a weight update may stage (0 = updates refused)"),
    I(update_window, 1, 1024, "weight-update chunks staged at once"),
    I(update_idle_s, 1, 86400, "seconds before a silent weight transfer is aborted"),
    I(max_lane_connections, 1, 4096, "data lane connections open at once (beyond: the oldest one without an "
      "accepted LANE_AUTH or chunk is closed; when all have proven themselves the newcomer gets BUSY)"),
    {"relay_allow", CFG_TEXT, offsetof(cfg_daemon, relay_allow), 0, sizeof(((cfg_daemon *)0)->relay_allow),
     "addresses UPDATE_FORWARD may relay to: comma-separated HOST:PORT, HOST:*, [V6]:PORT, [V6]:*, \"loopback\" "
     "(127.0.0.0/8 and ::1, any port) or \"none\" (\"\" = loopback while listen is loopback, else none)"},
    {"http_tls_cert_file", CFG_TEXT, offsetof(cfg_daemon, http_tls_cert_file), 0,
     sizeof(((cfg_daemon *)0)->http_tls_cert_file), "PEM certificate (chain): the HTTP API speaks HTTPS"},
    {"http_tls_key_file", CFG_TEXT, offsetof(cfg_daemon, http_tls_key_file), 0,
     sizeof(((cfg_daemon *)0)->http_tls_key_file), "PEM private key of http_tls_cert_file"},
    {"served_model_name", CFG_TEXT, offsetof(cfg_daemon, served_model_name), 0,
     sizeof(((cfg_daemon *)0)->served_model_name),
     "the model's name (vLLM's --served-model-name): the id /v1/models lists, the model of every answer, the "
     "metrics' model_name label; /v1 requests naming another model get 404 (\"\" = the model file's base name)"},
    I(max_loras, 0, LORA_MAX_LORAS, "LoRA adapters resident at once (/v1/load_lora_adapter; loading one more evicts "
      "the least recently used idle one; 0 = none served)"),
    I(max_lora_rank, 1, LORA_MAX_RANK, "the largest LoRA rank an adapter may have"),
    I(enable_return_routed_experts, 0, 1, "1: every /inference/v1/generate choice carries its routed experts in "
      "prime-rl's compact form (vLLM's --enable-return-routed-experts; a mixture-of-experts model only)"),
};
#define N_FIELDS (sizeof FIELDS / sizeof FIELDS[0])

void cfg_defaults(cfg_daemon *c)
{
    memset(c, 0, sizeof *c);
    snprintf(c->model, sizeof c->model, "%s", "models/SmolLM2-135M-Instruct.Q4_1.gguf");
    snprintf(c->backend, sizeof c->backend, "%s", "cpu");
    snprintf(c->kv_dtype, sizeof c->kv_dtype, "%s", "auto");
    snprintf(c->serve_dtype, sizeof c->serve_dtype, "%s", "as_pushed");
    snprintf(c->logprobs_mode, sizeof c->logprobs_mode, "%s", "raw_logprobs");
    snprintf(c->spec_decode, sizeof c->spec_decode, "%s", "auto");
    snprintf(c->spec_draft_sizing, sizeof c->spec_draft_sizing, "%s", "measured");
    snprintf(c->listen, sizeof c->listen, "%s", "tcp://127.0.0.1:7070");
    snprintf(c->http_listen, sizeof c->http_listen, "%s", "127.0.0.1:7071");
    c->threads = 0;
    /* The engine's own defaults, so the daemon and the offline tools agree. */
    eng_config ec = eng_default_config();
    c->kv_cache_bytes = ec.kv_cache_bytes;
    c->block_size = ec.block_size;
    c->max_num_seqs = ec.max_num_seqs;
    c->max_batch_tokens = ec.max_batch_tokens;
    c->max_loras = 8;           /* prime-rl's max_loras */
    c->max_lora_rank = ENG_DEFAULT_LORA_RANK;
    c->max_queued_requests = 4096;
    c->max_requests_per_submit = 1024;
    c->max_n = 64;
    c->max_tokens = 0;
    c->max_prompt_tokens = 0;
    c->max_message_bytes = 64 << 20;
    c->result_retention = 4096;
    c->retention_bytes = (int64_t)256 << 20;
    c->max_wait_ms = 30000;
    c->client_ttl_s = 600;
    c->max_clients = 1024;
    c->nng_contexts = 64;
    c->drain_s = 30;
    c->shutdown_grace_s = 10;
    c->http_max_connections = 1024;
    c->max_http_body_bytes = 64 << 20;
    c->max_http_inflight_body_bytes = (int64_t)256 << 20;
    c->http_header_timeout_ms = 10000;
    c->http_idle_timeout_ms = 60000;
    c->http_stream_queue_bytes = 4 << 20;
    c->prefix_cache = ec.prefix_cache;
    c->spec_max_draft = ec.spec_max_draft;
    c->spec_store_bytes = ec.spec_store_bytes;
    c->max_staging_bytes = (int64_t)4 << 30;
    c->update_window = 8;
    c->update_idle_s = 60;
    c->max_lane_connections = 16;
}

static const cfg_field *find_key(const char *key)
{
    for (size_t i = 0; i < N_FIELDS; i++)
        if (!strcmp(FIELDS[i].key, key))
            return &FIELDS[i];
    return NULL;
}

static int set_int(cfg_daemon *c, const cfg_field *f, double v, const char *origin)
{
    /* JSON numbers are doubles: refuse fractions and anything past 2^53,
     * where a double stops holding every integer. */
    if (!isfinite(v) || v != floor(v) || v < (double)f->lo || v > (double)f->hi || fabs(v) > 9007199254740992.0)
        return rd_fail(RD_EINVAL, "%s: key \"%s\" = %.17g; expected an integer in %lld..%lld (%s)", origin, f->key,
                       v, (long long)f->lo, (long long)f->hi, f->what);
    *(int64_t *)((char *)c + f->off) = (int64_t)v;
    return 0;
}

static int set_real(cfg_daemon *c, const cfg_field *f, double v, const char *origin)
{
    if (!isfinite(v) || v < (double)f->lo || v > (double)f->hi)
        return rd_fail(RD_EINVAL, "%s: key \"%s\" = %.17g; expected a number in %lld..%lld (%s)", origin, f->key, v,
                       (long long)f->lo, (long long)f->hi, f->what);
    *(double *)((char *)c + f->off) = v;
    return 0;
}

static int set_text(cfg_daemon *c, const cfg_field *f, const char *v, const char *origin)
{
    size_t n = strlen(v);
    if (n < (size_t)f->lo || n >= (size_t)f->hi)
        return rd_fail(RD_EINVAL, "%s: key \"%s\" has %zu bytes; expected a %sstring under %lld bytes (%s)",
                       origin, f->key, n, f->lo ? "non-empty " : "", (long long)f->hi, f->what);
    memcpy((char *)c + f->off, v, n + 1);
    return 0;
}

int cfg_parse_json(cfg_daemon *c, const char *text, const char *origin)
{
    cJSON *root = cJSON_Parse(text);
    if (!root) {
        const char *at = cJSON_GetErrorPtr();
        long off = at ? (long)(at - text) : -1;
        return rd_fail(RD_EINVAL, "%s: not valid JSON (near byte %ld); expected one JSON object", origin, off);
    }
    int rc = 0;
    if (!cJSON_IsObject(root)) {
        rc = rd_fail(RD_EINVAL, "%s: the top level is not a JSON object; expected {\"key\": value, ...}", origin);
        goto out;
    }
    /* An old name and its new one in the same object must agree (a later
     * source, such as a flag, may still override either). */
    const cJSON *a = cJSON_GetObjectItemCaseSensitive(root, "http_listen");
    const cJSON *b = cJSON_GetObjectItemCaseSensitive(root, "status_listen");
    if (cJSON_IsString(a) && cJSON_IsString(b) && strcmp(a->valuestring, b->valuestring)) {
        rc = rd_fail(RD_EINVAL, "%s: \"http_listen\" = \"%.200s\" and its old name \"status_listen\" = \"%.200s\" "
                     "differ; expected one of them", origin, a->valuestring, b->valuestring);
        goto out;
    }
    for (cJSON *it = root->child; it; it = it->next) {
        const cfg_field *f = find_key(it->string);
        if (!f) {
            rc = rd_fail(RD_EINVAL, "%s: unknown key \"%s\" (see configs/rolloutd.json for the known keys)", origin,
                         it->string);
            goto out;
        }
        if (f->kind == CFG_INT && f->lo == 0 && f->hi == 1 && cJSON_IsBool(it)) {
            /* A 0/1 switch also takes true/false. */
            *(int64_t *)((char *)c + f->off) = cJSON_IsTrue(it) ? 1 : 0;
        } else if (f->kind == CFG_INT || f->kind == CFG_REAL) {
            if (!cJSON_IsNumber(it)) {
                rc = rd_fail(RD_EINVAL, "%s: key \"%s\" is not a number; expected %s in %lld..%lld (%s)", origin,
                             f->key, f->kind == CFG_INT ? "an integer" : "a number", (long long)f->lo,
                             (long long)f->hi, f->what);
                goto out;
            }
            rc = f->kind == CFG_INT ? set_int(c, f, it->valuedouble, origin) : set_real(c, f, it->valuedouble, origin);
            if (rc)
                goto out;
        } else {
            if (!cJSON_IsString(it)) {
                rc = rd_fail(RD_EINVAL, "%s: key \"%s\" is not a string; expected %s", origin, f->key, f->what);
                goto out;
            }
            if ((rc = set_text(c, f, it->valuestring, origin)))
                goto out;
        }
    }
out:
    cJSON_Delete(root);
    return rc;
}

int cfg_load_file(cfg_daemon *c, const char *path)
{
    FILE *fp = fopen(path, "rb");
    if (!fp)
        return rd_fail(RD_EINVAL, "config %s: cannot open (%s)", path, strerror(errno));
    /* A config is a few hundred bytes; 1 MiB is a generous cap against a wrong path. */
    char *buf = malloc((1 << 20) + 1);
    if (!buf) {
        fclose(fp);
        return rd_fail(RD_ENOMEM, "config %s: out of memory", path);
    }
    size_t n = fread(buf, 1, 1 << 20, fp);
    int big = n == (1 << 20) && fgetc(fp) != EOF;
    fclose(fp);
    if (big) {
        free(buf);
        return rd_fail(RD_EINVAL, "config %s: larger than 1 MiB; expected a small JSON object", path);
    }
    buf[n] = 0;
    char origin[CFG_STR + 16];
    snprintf(origin, sizeof origin, "config %s", path);
    int rc = cfg_parse_json(c, buf, origin);
    free(buf);
    return rc;
}

/* "--kv-cache-bytes" -> the field "kv_cache_bytes". */
static const cfg_field *find_flag(const char *flag)
{
    if (strncmp(flag, "--", 2) != 0 || strlen(flag) >= 64)
        return NULL;
    char key[64];
    size_t i = 0;
    for (const char *p = flag + 2; *p; p++)
        key[i++] = *p == '-' ? '_' : *p;
    key[i] = 0;
    return find_key(key);
}

int cfg_from_args(cfg_daemon *c, int argc, char **argv, int *help)
{
    cfg_defaults(c);
    *help = 0;
    /* The file first, wherever --config appears, so every other flag overrides it. */
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            *help = 1;
            return 0;
        }
        if (!strcmp(argv[i], "--config")) {
            if (i + 1 >= argc)
                return rd_fail(RD_EINVAL, "flag --config needs a value (a JSON file)");
            int rc = cfg_load_file(c, argv[++i]);
            if (rc)
                return rc;
        }
    }
    const char *new_name = NULL, *old_name = NULL; /* --http-listen, --status-listen */
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--config")) {
            i++;
            continue;
        }
        const cfg_field *f = find_flag(argv[i]);
        if (!f)
            return rd_fail(RD_EINVAL, "unknown flag '%s' (rolloutd --help lists them)", argv[i]);
        if (i + 1 >= argc)
            return rd_fail(RD_EINVAL, "flag %s needs a value (%s)", argv[i], f->what);
        const char *v = argv[++i];
        if (!strcmp(f->key, "http_listen"))
            new_name = v;
        if (!strcmp(f->key, "status_listen"))
            old_name = v;
        if (new_name && old_name && strcmp(new_name, old_name))
            return rd_fail(RD_EINVAL, "flags --http-listen %.200s and its old name --status-listen %.200s differ; "
                           "expected one of them", new_name, old_name);
        char origin[80];
        snprintf(origin, sizeof origin, "flag %s", argv[i - 1]);
        if (f->kind == CFG_TEXT) {
            int rc = set_text(c, f, v, origin);
            if (rc)
                return rc;
        } else if (f->kind == CFG_REAL) {
            char *end;
            errno = 0;
            double x = strtod(v, &end);
            if (errno || end == v || *end)
                return rd_fail(RD_EINVAL, "%s: '%s' is not a number; expected a number in %lld..%lld (%s)", origin, v,
                               (long long)f->lo, (long long)f->hi, f->what);
            int rc = set_real(c, f, x, origin);
            if (rc)
                return rc;
        } else if (f->lo == 0 && f->hi == 1 && (!strcmp(v, "true") || !strcmp(v, "false"))) {
            *(int64_t *)((char *)c + f->off) = !strcmp(v, "true");
        } else {
            char *end;
            errno = 0;
            long long x = strtoll(v, &end, 10);
            if (errno || end == v || *end)
                return rd_fail(RD_EINVAL, "%s: '%s' is not an integer; expected an integer in %lld..%lld (%s)", origin,
                               v, (long long)f->lo, (long long)f->hi, f->what);
            int rc = set_int(c, f, (double)x, origin);
            if (rc)
                return rc;
        }
    }
    return cfg_validate(c);
}

int cfg_validate(const cfg_daemon *c)
{
    if (strcmp(c->backend, "cpu") && strcmp(c->backend, "cuda"))
        return rd_fail(RD_EINVAL, "key \"backend\" = \"%s\"; expected \"cpu\" or \"cuda\"", c->backend);
    if (strcmp(c->kv_dtype, "auto") && strcmp(c->kv_dtype, "f32") && strcmp(c->kv_dtype, "bf16") &&
        strcmp(c->kv_dtype, "f16") && strcmp(c->kv_dtype, "fp8"))
        return rd_fail(RD_EINVAL, "key \"kv_dtype\" = \"%s\"; expected \"auto\", \"f32\", \"bf16\", \"f16\" or "
                       "\"fp8\"", c->kv_dtype);
    upd_serve sv;
    if (strcmp(c->logprobs_mode, "raw_logprobs") && strcmp(c->logprobs_mode, "processed_logprobs"))
        return rd_fail(RD_EINVAL, "key \"logprobs_mode\" = \"%s\"; expected \"raw_logprobs\" or \"processed_logprobs\" "
                       "(vLLM's raw_logits and processed_logits are not served)", c->logprobs_mode);
    if (upd_serve_parse(c->serve_dtype, &sv))
        return rd_fail(RD_EINVAL, "key \"serve_dtype\" = \"%s\"; expected \"as_pushed\", \"q8_0\", \"q4_k\" or "
                       "\"fp8\"", c->serve_dtype);
    eng_spec_mode sm;
    if (eng_spec_mode_parse(c->spec_decode, &sm))
        return rd_fail(RD_EINVAL, "key \"spec_decode\" = \"%s\"; expected \"off\" or \"ngram\" (or \"auto\": ngram "
                       "when spec_max_draft > 0)", c->spec_decode);
    if (strcmp(c->spec_draft_sizing, "measured") && strcmp(c->spec_draft_sizing, "fixed"))
        return rd_fail(RD_EINVAL, "key \"spec_draft_sizing\" = \"%s\"; expected \"measured\" or \"fixed\"",
                       c->spec_draft_sizing);
    if (!strcmp(c->backend, "cuda") && (!strcmp(c->kv_dtype, "f32") || !strcmp(c->kv_dtype, "f16")))
        return rd_fail(RD_EINVAL, "key \"kv_dtype\" = \"%s\" with backend \"cuda\": the CUDA backend stores the KV "
                       "cache as bf16 or fp8; expected \"auto\", \"bf16\" or \"fp8\"", c->kv_dtype);
    if (!strcmp(c->backend, "cpu") && !strcmp(c->kv_dtype, "fp8"))
        return rd_fail(RD_EINVAL, "key \"kv_dtype\" = \"fp8\" with backend \"cpu\": fp8 is the cuda backend's; the "
                       "cpu stores \"f32\", \"bf16\" or \"f16\"");
    if (strncmp(c->listen, "tcp://", 6) && strncmp(c->listen, "tls+tcp://", 10) && strncmp(c->listen, "ipc://", 6))
        return rd_fail(RD_EINVAL, "key \"listen\" = \"%s\"; expected an NNG URL like tcp://127.0.0.1:7070 (or "
                       "tls+tcp://, ipc://)", c->listen);
    if (!strncmp(c->listen, "tls+tcp://", 10) && (!c->tls_cert_file[0] || !c->tls_key_file[0]))
        return rd_fail(RD_EINVAL, "key \"listen\" = \"%s\" is TLS: set tls_cert_file and tls_key_file (PEM files)",
                       c->listen);
    const char *colon = strrchr(c->http_listen, ':');
    char *end = NULL;
    long port = colon ? strtol(colon + 1, &end, 10) : -1;
    if (!colon || colon == c->http_listen || !end || *end || port < 0 || port > 65535 || end == colon + 1)
        return rd_fail(RD_EINVAL, "key \"http_listen\" (or status_listen) = \"%s\"; expected HOST:PORT like "
                       "127.0.0.1:7071", c->http_listen);
    ra_list allow;
    if (ra_parse(c->relay_allow, 0, &allow))
        return RD_EINVAL; /* the message names the entry */
    if (!c->http_tls_cert_file[0] != !c->http_tls_key_file[0])
        return rd_fail(RD_EINVAL, "key \"%s\" is set without \"%s\"; expected both PEM files (HTTPS) or neither",
                       c->http_tls_cert_file[0] ? "http_tls_cert_file" : "http_tls_key_file",
                       c->http_tls_cert_file[0] ? "http_tls_key_file" : "http_tls_cert_file");
    /* The name goes into JSON strings, a Prometheus label and HELLO_OK: valid UTF-8 without control bytes. */
    size_t nn = strlen(c->served_model_name);
    if (utf8_invalid_at((const uint8_t *)c->served_model_name, nn) != nn)
        return rd_fail(RD_EINVAL, "key \"served_model_name\" is not valid UTF-8; expected a model name such as "
                       "\"Qwen/Qwen3-4B\"");
    for (size_t i = 0; i < nn; i++)
        if ((unsigned char)c->served_model_name[i] < 0x20 || c->served_model_name[i] == 0x7f)
            return rd_fail(RD_EINVAL, "key \"served_model_name\" holds control byte 0x%02x at %zu; expected a "
                           "printable name", (unsigned char)c->served_model_name[i], i);
    if (c->max_batch_tokens < c->max_num_seqs)
        return rd_fail(RD_EINVAL, "key \"max_batch_tokens\" = %lld is below max_num_seqs = %lld; expected >= it "
                       "(every running sequence needs a token per step)",
                       (long long)c->max_batch_tokens, (long long)c->max_num_seqs);
    return 0;
}

const char *cfg_usage(void)
{
    static char text[8192];
    if (text[0])
        return text;
    size_t n = (size_t)snprintf(text, sizeof text,
                                "usage: rolloutd [--config FILE.json] [--KEY VALUE ...]\n"
                                "Every config key is also a flag (--kv-cache-bytes for kv_cache_bytes):\n");
    for (size_t i = 0; i < N_FIELDS && n < sizeof text; i++) {
        char flag[64];
        size_t k = 0;
        for (const char *p = FIELDS[i].key; *p && k < sizeof flag - 1; p++)
            flag[k++] = *p == '_' ? '-' : *p;
        flag[k] = 0;
        n += (size_t)snprintf(text + n, sizeof text - n, "  --%-26s %s\n", flag, FIELDS[i].what);
    }
    return text;
}
