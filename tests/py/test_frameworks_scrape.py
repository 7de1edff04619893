"""What RL frameworks, gateway schedulers and autoscalers check or scrape on a vLLM or SGLang server,
against a real build/rolloutd on loopback (issue 44; shared/reference/rl-requests-2026.md section 2).

- served_model_name (vLLM's --served-model-name): the id /v1/models lists (prime-rl's start-up check,
  utils/client.py maybe_check_has_model, run as it is written), the model of every /v1 answer and
  stream chunk, /get_model_info, /get_server_info, /status, HELLO_OK and the metrics' model_name
  label. A /v1 call (and /inference/v1/generate, /tokenize, /detokenize) naming a model nothing serves
  gets vLLM's 404 {"error": {"message": "The model `X` does not exist.", "type": "NotFoundError",
  "param": "model", "code": 404}} (the openai package raises NotFoundError); the served name, the
  file's base name, the model path, an empty or absent name are served. Without the key the daemon
  lists the file's base name, as before.
- /metrics under vLLM's and SGLang's names, parsed by the Prometheus text rules (and by
  prometheus_client's parser when it is installed, as prime-rl reads it): while a long request runs
  vllm:num_requests_running and sglang:num_running_reqs are 1 and the KV usage ratio is in (0, 1];
  after it, generation_tokens_total grew by exactly the tokens generated and prompt_tokens_total by
  the prompt's tokens; labels model_name = the served name and engine="0" (vLLM), engine_type,
  tp_rank, pp_rank (SGLang); vllm:cache_config_info's num_gpu_blocks x block_size is the pool.
- SGLang's /v1/loads (slime's server_control.py polls ?include=core until idle: its
  num_requests_from_load, run as written, counts the running request and 0 after) with its sections,
  ?format=prometheus, 400 for an unknown section or another dp_rank; /get_load; prime-rl's
  /liveness answers without the key, /v1/loads needs it.
- SGLang's /update_weights_from_tensor, /update_weights_from_distributed, /init_weights_update_group,
  /destroy_weights_update_group: 501, {"success": false} and a message naming the NNG push and
  /update_weights_from_disk.
- prime-rl's routed experts on /inference/v1/generate (choices[].routed_experts = {"data", "shape",
  "start", "dtype"}, prime_rl/inference/vllm/routed_experts.py) on the tiny MoE model
  (tests/py/moe_model.py, 3 layers, 16 experts, top 4): with enable_return_routed_experts every
  choice carries them (uint8), equal to /v1/completions' return_routed_experts (SGLang's int32 layout)
  and to the NNG client's compact form for the same seed; sampling_params.routed_experts_prompt_start
  leaves that many positions out ("start" says so), and one at or past the prompt's end is 400; a
  stream's last chunk carries them; without the flag only a request's return_routed_experts: true
  asks; a dense model refuses the flag at start (exit 2) and the ask with 400.
Every daemon ends with SIGTERM and must exit 0."""
import base64
import http.client
import json
import os
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import BUILD, MODEL, ROOT, TMP, case, main  # noqa: E402

from rdtest import Daemon, hello, stop_cleanly  # noqa: E402

sys.path.insert(0, os.path.join(ROOT, "tools", "python"))
from rolloutd import Client  # noqa: E402

import openai  # noqa: E402

SERVED = "HuggingFaceTB/SmolLM2-135M-Instruct"
BASE = os.path.basename(MODEL)[:-len(".gguf")]
TESTDATA = os.path.join(ROOT, os.environ.get("RD_TESTDATA", "build/testdata"))
MOE = os.path.join(TESTDATA, "tiny-moe-f32.gguf")
DENSE = os.path.join(TESTDATA, "tiny-f32.gguf")
LAYERS, K = 3, 4                       # moe_model.SHAPE
MOE_PROMPT = [5, 17, 42, 99, 7, 3, 250, 12]
KEY = "scrape-test-key"
KEYFILE = os.path.join(TMP, f"scrape-key-{os.getpid()}")
with open(KEYFILE, "w") as f:
    f.write(KEY + "\n")
os.chmod(KEYFILE, 0o600)

_daemons = {}


def daemon(which):
    if which not in _daemons:
        if which == "served":
            _daemons[which] = Daemon("--served-model-name", SERVED, "--api-key-file", KEYFILE)
        elif which == "plain":
            _daemons[which] = Daemon()
        elif which == "moe":
            assert os.path.exists(MOE), f"{MOE} is missing: run tests/gen_testdata.sh"
            _daemons[which] = Daemon("--enable-return-routed-experts", "true", model=MOE)
        elif which == "moe_ask":
            _daemons[which] = Daemon(model=MOE)
        else:
            _daemons[which] = Daemon(model=DENSE)
    return _daemons[which]


def call(d, path, body=None, method=None, key=KEY, raw=False, timeout=300):
    """(status, JSON body or text) of one request to d."""
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(f"http://127.0.0.1:{d.http_port}{path}", data=data,
                                 method=method or ("POST" if data is not None else "GET"))
    if data is not None:
        req.add_header("Content-Type", "application/json")
    if key:
        req.add_header("Authorization", f"Bearer {key}")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            text = r.read().decode()
            return r.status, text if raw else json.loads(text)
    except urllib.error.HTTPError as e:
        text = e.read().decode()
        return e.code, text if raw else json.loads(text or "null")


def sse(d, path, body, key=KEY):
    """The data: events of a streamed POST, parsed."""
    c = http.client.HTTPConnection("127.0.0.1", d.http_port, timeout=300)
    headers = {"Content-Type": "application/json"}
    if key:
        headers["Authorization"] = f"Bearer {key}"
    c.request("POST", path, body=json.dumps(body), headers=headers)
    r = c.getresponse()
    assert r.status == 200, (r.status, r.read())
    events = [json.loads(line[6:]) for line in r.read().decode().split("\n")
              if line.startswith("data: ") and line != "data: [DONE]"]
    c.close()
    return events


def oai(d, key=KEY):
    return openai.OpenAI(base_url=f"http://127.0.0.1:{d.http_port}/v1", api_key=key or "none", max_retries=0,
                         timeout=300)


# ---- the Prometheus text format ----

def parse_labels(s):
    """'a="x",b="y\\"z"' -> {"a": "x", "b": 'y"z'} (the text format's escapes: \\\\, \\", \\n)."""
    out, i = {}, 0
    while i < len(s):
        eq = s.index("=", i)
        name = s[i:eq].strip()
        assert s[eq + 1] == '"', s
        j, val = eq + 2, []
        while s[j] != '"':
            if s[j] == "\\":
                j += 1
                val.append({"n": "\n", "\\": "\\", '"': '"'}[s[j]])
            else:
                val.append(s[j])
            j += 1
        out[name] = "".join(val)
        i = j + 1
        if i < len(s):
            assert s[i] == ",", s
            i += 1
    return out


def parse_metrics(text):
    """{(name, frozenset(labels)): value} and {family: type} by the text format's rules: every sample
    belongs to the family its # TYPE line declared just before it (a counter family named as its
    samples, ..._total, as prometheus_client writes vLLM's counters), no family is declared twice."""
    assert text.endswith("\n"), text[-100:]
    samples, types, family = {}, {}, None
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, typ = line.split(" ", 3)
            assert name not in types, f"family {name} declared twice"
            assert typ in ("gauge", "counter"), line
            types[name], family = typ, name
            continue
        if not line or line.startswith("# HELP "):
            continue
        assert not line.startswith("#"), line
        head, value = line.rsplit(" ", 1)
        name, labels = (head[:head.index("{")], parse_labels(head[head.index("{") + 1:-1])) if "{" in head \
            else (head, {})
        assert name == family, f"sample {name} outside its family ({family})"
        key = (name, frozenset(labels.items()))
        assert key not in samples, f"{line}: a second sample with the same labels"
        samples[key] = float(value)
    return samples, types


def metric(samples, name, **labels):
    """The one sample of name (whose labels include these)."""
    got = [v for (n, ls), v in samples.items() if n == name and set(labels.items()) <= set(ls)]
    assert len(got) == 1, (name, labels, got)
    return got[0]


def labels_of(samples, name):
    got = [dict(ls) for (n, ls), _ in samples.items() if n == name]
    assert len(got) == 1, (name, got)
    return got[0]


def scrape(d, key=KEY):
    st, text = call(d, "/metrics", key=key, raw=True)
    assert st == 200, (st, text)
    return parse_metrics(text)


# ---- served_model_name ----

def maybe_check_has_model(port, model_name):
    """prime-rl's start-up check (src/prime_rl/utils/client.py), on one server."""
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/models", headers={"Authorization": f"Bearer {KEY}"})
    with urllib.request.urlopen(req, timeout=30) as r:
        models = json.loads(r.read())["data"]
    if not any(model["id"] == model_name for model in models):
        raise ValueError(f"Model {model_name} was not found in the inference pool")


@case
def served_model_name_is_the_name_everywhere():
    d = daemon("served")
    maybe_check_has_model(d.http_port, SERVED)
    try:
        maybe_check_has_model(d.http_port, BASE)
        raise AssertionError("/v1/models lists the file's name beside the served one")
    except ValueError:
        pass
    st, models = call(d, "/v1/models")
    assert st == 200 and [m["id"] for m in models["data"]] == [SERVED], models
    assert models["data"][0]["root"].endswith(os.path.basename(MODEL)), models
    c = oai(d)
    r = c.completions.create(model=SERVED, prompt="The capital of France is", max_tokens=3, temperature=0)
    assert r.model == SERVED, r
    r = c.chat.completions.create(model=SERVED, messages=[{"role": "user", "content": "Hi"}], max_tokens=3)
    assert r.model == SERVED, r
    chunks = list(c.completions.create(model=SERVED, prompt="Once upon", max_tokens=4, stream=True))
    assert chunks and {ch.model for ch in chunks} == {SERVED}, chunks
    chunks = list(c.chat.completions.create(model=SERVED, messages=[{"role": "user", "content": "Hi"}],
                                            max_tokens=3, stream=True))
    assert chunks and {ch.model for ch in chunks} == {SERVED}, chunks
    st, info = call(d, "/get_model_info")
    assert st == 200 and info["model_name"] == SERVED and info["model_path"].endswith(".gguf"), info
    st, info = call(d, "/get_server_info")
    assert st == 200 and info["served_model_name"] == SERVED, info
    st, status = call(d, "/status")
    assert st == 200 and status["model"] == SERVED, status
    with d.sock() as s:
        assert hello(s).model_name == SERVED
    samples, _ = scrape(d)
    for name in ("rolloutd:num_requests_running", "vllm:num_requests_running", "sglang:num_running_reqs",
                 "sglang:prompt_tokens_total"):
        assert labels_of(samples, name)["model_name"] == SERVED, name


@case
def a_model_nothing_serves_gets_vllms_404():
    d = daemon("served")
    c = oai(d)
    # served: the served name, the file's base name, its path; an empty or absent model is the served one
    for name in (SERVED, BASE, MODEL):
        r = c.completions.create(model=name, prompt=[1, 2, 3], max_tokens=1)
        assert r.model == SERVED and len(r.choices) == 1, (name, r)
    for body in ({"model": "", "prompt": [1, 2], "max_tokens": 1}, {"prompt": [1, 2], "max_tokens": 1},
                 {"model": None, "prompt": [1, 2], "max_tokens": 1}):
        st, out = call(d, "/v1/completions", body)
        assert st == 200 and out["model"] == SERVED, (body, st, out)
    try:
        c.completions.create(model="Qwen/Qwen3-4B", prompt="x", max_tokens=1)
        raise AssertionError("another model's name was served")
    except openai.NotFoundError as e:
        assert e.status_code == 404 and e.body == {"message": "The model `Qwen/Qwen3-4B` does not exist.",
                                                   "type": "NotFoundError", "param": "model", "code": 404}, e.body
    want = {"error": {"message": "The model `policy` does not exist.", "type": "NotFoundError", "param": "model",
                      "code": 404}}
    for path, body in (("/v1/completions", {"prompt": "x", "max_tokens": 1}),
                       ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}]}),
                       ("/inference/v1/generate", {"token_ids": [1, 2], "sampling_params": {"max_tokens": 1}}),
                       ("/tokenize", {"prompt": "x"}), ("/detokenize", {"tokens": [1]})):
        st, out = call(d, path, {"model": "policy", **body})
        assert (st, out) == (404, want), (path, st, out)
        st, out = call(d, path, {"model": SERVED, **body})
        assert st == 200, (path, st, out)
    st, out = call(d, "/v1/completions", {"model": 7, "prompt": "x", "max_tokens": 1})
    assert st == 400 and "model" in out["error"]["message"], (st, out)
    with openai.OpenAI(base_url=f"http://127.0.0.1:{d.http_port}/v1", api_key=KEY, max_retries=0) as c2:
        try:
            list(c2.completions.create(model="x", prompt="x", max_tokens=1, stream=True))
            raise AssertionError("a stream for another model began")
        except openai.NotFoundError:
            pass
    # the daemon keeps serving
    assert c.completions.create(model=SERVED, prompt="x", max_tokens=1).choices


@case
def without_the_key_the_files_name_is_served():
    d = daemon("plain")
    st, models = call(d, "/v1/models", key=None)
    assert st == 200 and [m["id"] for m in models["data"]] == [BASE], models
    r = oai(d, key=None).completions.create(model=BASE, prompt="x", max_tokens=1)
    assert r.model == BASE
    st, out = call(d, "/v1/completions", {"model": SERVED, "prompt": "x", "max_tokens": 1}, key=None)
    assert st == 404 and out["error"]["type"] == "NotFoundError", (st, out)
    # a name with a control byte cannot be served (it goes into JSON, labels and HELLO_OK)
    p = subprocess.run([os.path.join(BUILD, "rolloutd"), "--served-model-name", "a\x01b", "--model", MODEL],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and "served_model_name" in p.stderr, (p.returncode, p.stderr)


# ---- metrics ----

def long_request(d, out, max_tokens):
    out["r"] = call(d, "/v1/completions", {"model": SERVED, "prompt": "Tell me a long story about a dragon.",
                                           "max_tokens": max_tokens, "ignore_eos": True, "temperature": 0.8,
                                           "seed": 3, "return_token_ids": True})


@case
def vllm_and_sglang_metrics_move_as_requests_run():
    d = daemon("served")
    samples, types = scrape(d)
    vl = {"model_name": SERVED, "engine": "0"}
    sg = {"model_name": SERVED, "engine_type": "unified", "tp_rank": "0", "pp_rank": "0"}
    st_ = {"model_name": SERVED, "engine_type": "unified"}
    for name, typ in (("vllm:num_requests_running", "gauge"), ("vllm:num_requests_waiting", "gauge"),
                      ("vllm:kv_cache_usage_perc", "gauge"), ("vllm:prompt_tokens_total", "counter"),
                      ("vllm:generation_tokens_total", "counter"), ("vllm:num_preemptions_total", "counter"),
                      ("vllm:prefix_cache_queries_total", "counter"), ("vllm:prefix_cache_hits_total", "counter")):
        assert types.get(name) == typ, (name, types.get(name))
        assert labels_of(samples, name) == vl, (name, labels_of(samples, name))
    for name, typ in (("sglang:num_running_reqs", "gauge"), ("sglang:num_queue_reqs", "gauge"),
                      ("sglang:token_usage", "gauge"), ("sglang:gen_throughput", "gauge")):
        assert types.get(name) == typ and labels_of(samples, name) == sg, name
    for name in ("sglang:prompt_tokens_total", "sglang:generation_tokens_total"):
        assert types.get(name) == "counter" and labels_of(samples, name) == st_, name
    info = labels_of(samples, "vllm:cache_config_info")
    st, status = call(d, "/status")
    assert int(info["num_gpu_blocks"]) == status["kv_cache"]["blocks_total"], (info, status["kv_cache"])
    assert int(info["block_size"]) == status["kv_cache"]["block_size"] and info["engine"] == "0", info
    assert metric(samples, "sglang:max_total_num_tokens") == \
        status["kv_cache"]["blocks_total"] * status["kv_cache"]["block_size"]

    # settle: nothing runs
    deadline = time.time() + 60
    while metric(scrape(d)[0], "vllm:num_requests_running") != 0:
        assert time.time() < deadline, "requests still running before the case"
        time.sleep(0.1)
    before, _ = scrape(d)
    out = {}
    t = threading.Thread(target=long_request, args=(d, out, 200))
    t.start()
    seen = None
    deadline = time.time() + 120
    while t.is_alive() and time.time() < deadline:
        m, _ = scrape(d)
        if metric(m, "vllm:num_requests_running") >= 1:
            seen = m
            break
        time.sleep(0.02)
    assert seen is not None, "vllm:num_requests_running never showed the running request"
    assert metric(seen, "vllm:num_requests_running") == 1 and metric(seen, "sglang:num_running_reqs") == 1, seen
    assert 0 < metric(seen, "vllm:kv_cache_usage_perc") <= 1, metric(seen, "vllm:kv_cache_usage_perc")
    assert metric(seen, "sglang:token_usage") == metric(seen, "vllm:kv_cache_usage_perc")
    assert metric(seen, "sglang:num_used_tokens") > 0
    t.join(300)
    st, r = out["r"]
    assert st == 200 and r["choices"][0]["finish_reason"] == "length", (st, r)
    n_gen, n_prompt = r["usage"]["completion_tokens"], r["usage"]["prompt_tokens"]
    assert n_gen == 200 and len(r["choices"][0]["token_ids"]) == 200, r["usage"]
    deadline = time.time() + 30
    while True:  # the engine's counters reach /metrics with its next snapshot
        after, _ = scrape(d)
        grown = metric(after, "vllm:generation_tokens_total") - metric(before, "vllm:generation_tokens_total")
        if grown == n_gen or time.time() > deadline:
            break
        time.sleep(0.05)
    assert grown == n_gen, (grown, n_gen)
    for name in ("sglang:generation_tokens_total", "rolloutd:generation_tokens_total"):
        assert metric(after, name) - metric(before, name) == n_gen, name
    for name in ("vllm:prompt_tokens_total", "sglang:prompt_tokens_total"):
        assert metric(after, name) - metric(before, name) == n_prompt, (name, n_prompt)
    assert metric(after, "vllm:num_requests_running") == 0 and metric(after, "sglang:num_running_reqs") == 0
    assert metric(after, "vllm:kv_cache_usage_perc") <= metric(seen, "vllm:kv_cache_usage_perc")

    # prometheus_client's parser, as prime-rl's orchestrator reads /metrics (when it is installed here)
    try:
        from prometheus_client.parser import text_string_to_metric_families
    except ImportError:
        return
    st, text = call(d, "/metrics", raw=True)
    fams = {f.name: f for f in text_string_to_metric_families(text)}
    assert fams["vllm:num_requests_running"].type == "gauge"
    assert fams["vllm:generation_tokens"].type == "counter"
    assert [s.name for s in fams["vllm:generation_tokens"].samples] == ["vllm:generation_tokens_total"]


# ---- loads, liveness ----

def num_requests_from_load(load):
    """slime's reading of /v1/loads (slime/backends/sglang_utils/server_control.py)."""
    if isinstance(load, list):
        return sum(num_requests_from_load(item) for item in load)
    if not isinstance(load, dict):
        return 0
    if "loads" in load:
        return num_requests_from_load(load["loads"])
    for key in ("num_reqs", "num_total_reqs", "total_reqs"):
        value = load.get(key)
        if isinstance(value, int):
            return value
    running = load.get("num_running_reqs", load.get("total_running_reqs"))
    waiting = load.get("num_waiting_reqs", load.get("total_waiting_reqs"))
    return (running if isinstance(running, int) else 0) + (waiting if isinstance(waiting, int) else 0)


@case
def sglang_loads_and_prime_rl_liveness():
    d = daemon("served")
    st, doc = call(d, "/v1/loads?include=core")
    assert st == 200 and set(doc) == {"timestamp", "version", "accelerator", "num_accelerators", "loads"}, doc
    assert doc["timestamp"].endswith("+00:00") and len(doc["loads"]) == 1, doc
    core = doc["loads"][0]
    assert set(core) == {"dp_rank", "timestamp", "num_running_reqs", "num_waiting_reqs", "num_used_tokens",
                         "num_total_tokens", "max_total_num_tokens", "token_usage", "gen_throughput",
                         "cache_hit_rate", "max_running_requests"}, core
    assert core["dp_rank"] == 0 and core["max_running_requests"] == 16, core
    st, status = call(d, "/status")
    assert core["max_total_num_tokens"] == status["kv_cache"]["blocks_total"] * status["kv_cache"]["block_size"]
    deadline = time.time() + 60
    while num_requests_from_load(call(d, "/v1/loads?include=core")[1]):
        assert time.time() < deadline
        time.sleep(0.1)
    out = {}
    t = threading.Thread(target=long_request, args=(d, out, 160))
    t.start()
    busy = None
    while t.is_alive():
        doc = call(d, "/v1/loads?include=core")[1]
        # running, not only queued: a waiting request holds no KV yet (seen once in CI: 1 waiting, 0 tokens)
        if num_requests_from_load(doc) and doc["loads"][0]["num_running_reqs"] >= 1:
            busy = doc
            gl = call(d, "/get_load")[1]
            break
        time.sleep(0.02)
    t.join(300)
    assert busy and busy["loads"][0]["num_running_reqs"] + busy["loads"][0]["num_waiting_reqs"] == 1, busy
    assert busy["loads"][0]["num_used_tokens"] > 0 and 0 < busy["loads"][0]["token_usage"] <= 1, busy
    assert isinstance(gl, list) and gl[0]["dp_rank"] == 0 and gl[0]["num_reqs"] >= 1, gl
    assert out["r"][0] == 200
    deadline = time.time() + 30
    while num_requests_from_load(call(d, "/v1/loads?include=core")[1]):
        assert time.time() < deadline, "the load never went back to 0"
        time.sleep(0.05)
    st, gl = call(d, "/get_load")
    assert st == 200 and set(gl[0]) == {"dp_rank", "num_reqs", "num_waiting_reqs", "num_tokens", "ts_tic"}, gl
    # the sections
    st, doc = call(d, "/v1/loads")
    load = doc["loads"][0]
    assert set(load["memory"]) == {"weight_gb", "kv_cache_gb", "graph_gb", "token_capacity"}, load
    assert load["memory"]["token_capacity"] == core["max_total_num_tokens"] and load["memory"]["weight_gb"] > 0
    assert set(load["queues"]) == {"waiting", "grammar", "paused", "retracted"}, load
    assert "speculative" not in load and "lora" not in load, load      # off / none here: SGLang leaves them out
    st, doc = call(d, "/v1/loads?include=memory,queues")
    assert "num_running_reqs" not in doc["loads"][0] and "memory" in doc["loads"][0], doc
    st, text = call(d, "/v1/loads?include=core&format=prometheus", raw=True)
    assert st == 200, text
    samples, types = parse_metrics(text)
    assert metric(samples, "sglang_max_total_num_tokens", dp_rank="0") == core["max_total_num_tokens"]
    assert set(types.values()) == {"gauge"} and "sglang_dp_rank" not in types, types
    for q in ("include=cores", "include=core,bogus", "dp_rank=1"):
        st, out = call(d, f"/v1/loads?{q}")
        assert st == 400 and "detail" in out, (q, st, out)
    # /liveness: public as /health (probes carry no key); the load report needs the key as /metrics does
    assert call(d, "/liveness", key=None) == (200, {"status": "ok"})
    assert call(d, "/v1/loads", key=None)[0] == 401 and call(d, "/get_load", key=None)[0] == 401


@case
def sglang_collective_weight_routes_are_501():
    d = daemon("served")
    for path in ("/update_weights_from_tensor", "/update_weights_from_distributed", "/init_weights_update_group",
                 "/destroy_weights_update_group"):
        st, out = call(d, path, {"names": ["w"], "dtypes": ["bfloat16"], "shapes": [[2, 2]], "group_name": "g"})
        assert st == 501 and out["success"] is False, (path, st, out)
        for words in (path, "push", "/update_weights_from_disk", "/update_weights"):
            assert words in out["message"] and out["message"] == out["detail"], (path, words, out)
    assert call(d, "/update_weights_from_tensor", method="GET")[0] == 405


# ---- prime-rl's routed experts ----

def compact_ids(re_):
    """prime-rl's decoding of a compact routed_experts (the trainer's RoutedExperts)."""
    assert set(re_) == {"data", "shape", "start", "dtype"}, re_
    return np.frombuffer(base64.b64decode(re_["data"]), dtype=np.dtype(re_["dtype"])).reshape(re_["shape"])


def generate_body(seed, max_tokens=6, n=1, **sp):
    return {"token_ids": MOE_PROMPT, "sampling_params": {"max_tokens": max_tokens, "temperature": 1.0,
                                                         "seed": seed, "n": n, **sp}}


@case
def prime_rl_routed_experts_on_inference_generate():
    d = daemon("moe")
    st, g = call(d, "/inference/v1/generate", generate_body(21, n=2))
    assert st == 200 and len(g["choices"]) == 2, (st, g)
    # the same requests through /v1/completions (SGLang's int32 layout) and the NNG client (compact)
    st, c = call(d, "/v1/completions", {"prompt": MOE_PROMPT, "max_tokens": 6, "temperature": 1.0, "seed": 21,
                                        "n": 2, "return_routed_experts": True, "return_token_ids": True})
    assert st == 200, c
    with Client(d.url) as cl:
        nng = cl.generate([MOE_PROMPT], n=2, max_tokens=6, temperature=1.0, seed=21, return_routes="compact")
    for ch, cc, s in zip(g["choices"], c["choices"], sorted(nng, key=lambda s: s.sample_idx)):
        assert ch["token_ids"] == cc["token_ids"] == list(s.token_ids), (ch, cc, s)
        re_ = ch["routed_experts"]
        assert re_["dtype"] == "uint8" and re_["start"] == 0, re_
        assert re_["shape"] == [len(MOE_PROMPT) + len(ch["token_ids"]) - 1, LAYERS, K], re_
        ids = compact_ids(re_)
        ref = np.frombuffer(base64.b64decode(cc["routed_experts"]), dtype="<i4").reshape(-1, LAYERS, K)
        assert np.array_equal(ids.astype(np.int32), ref), (ids, ref)
        assert re_ == s.routes, (re_, s.routes)      # byte for byte prime-rl's form the NNG client builds
        assert ids.max() < 16 and all(len(set(row)) == K for row in ids.reshape(-1, K)), ids
    # routed_experts_prompt_start: the positions before it are left out
    st, g3 = call(d, "/inference/v1/generate", generate_body(21, n=2, routed_experts_prompt_start=3))
    assert st == 200, g3
    for a, b in zip(g["choices"], g3["choices"]):
        assert a["token_ids"] == b["token_ids"]
        ra, rb = a["routed_experts"], b["routed_experts"]
        assert rb["start"] == 3 and rb["shape"][0] == ra["shape"][0] - 3, (ra, rb)
        assert np.array_equal(compact_ids(b["routed_experts"]), compact_ids(a["routed_experts"])[3:])
    for start in (len(MOE_PROMPT), 10 ** 6):
        st, out = call(d, "/inference/v1/generate", generate_body(1, routed_experts_prompt_start=start))
        assert st == 400 and "routed_experts_prompt_start" in out["error"]["message"], (start, st, out)
    st, out = call(d, "/inference/v1/generate", generate_body(1, routed_experts_prompt_start=-1))
    assert st == 400 and "routed_experts_prompt_start" in out["error"]["message"], (st, out)
    # a stream: the choice's last chunk carries them
    body = generate_body(21, n=1)
    body["stream"] = True
    events = sse(d, "/inference/v1/generate", body, key=None)
    last = [e for e in events if e["choices"] and e["choices"][0]["finish_reason"]]
    assert len(last) == 1 and all("routed_experts" not in e["choices"][0] for e in events if e not in last), events
    toks = [t for e in events if e["choices"] for t in e["choices"][0]["token_ids"]]
    st, one = call(d, "/inference/v1/generate", generate_body(21, n=1))
    assert toks == one["choices"][0]["token_ids"]
    assert last[0]["choices"][0]["routed_experts"] == one["choices"][0]["routed_experts"]


@case
def without_the_flag_a_request_asks():
    d = daemon("moe_ask")
    st, g = call(d, "/inference/v1/generate", generate_body(5))
    assert st == 200 and "routed_experts" not in g["choices"][0], g
    st, g2 = call(d, "/inference/v1/generate", {**generate_body(5), "return_routed_experts": True})
    assert st == 200 and g2["choices"][0]["token_ids"] == g["choices"][0]["token_ids"], g2
    assert compact_ids(g2["choices"][0]["routed_experts"]).shape == (len(MOE_PROMPT) + 5, LAYERS, K)
    dense = daemon("dense")
    st, out = call(dense, "/inference/v1/generate", {**generate_body(5), "return_routed_experts": True})
    assert st == 400 and "return_routed_experts" in out["error"]["message"], (st, out)
    p = subprocess.run([os.path.join(BUILD, "rolloutd"), "--config", os.path.join(ROOT, "configs/test.json"),
                        "--model", DENSE, "--enable-return-routed-experts", "1"],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and "enable_return_routed_experts" in p.stderr and "dense" in p.stderr, \
        (p.returncode, p.stderr)


@case
def sigterm_exits_zero():
    stop_cleanly(*_daemons.values())
    _daemons.clear()


if __name__ == "__main__":
    try:
        main()
    finally:
        for dd in _daemons.values():
            dd.kill()
