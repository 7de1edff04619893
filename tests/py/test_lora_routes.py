"""LoRA adapters over HTTP (daemon/api_lora.c), called as their clients call them, on the default model with
random PEFT adapters from tools/gen_lora.py:

- vLLM's /v1/load_lora_adapter and /v1/unload_lora_adapter (text answers, OpenAI-shaped errors), the adapter
  listed by /v1/models with its parent, served as `model` through the `openai` package, with load_inplace;
- SGLang's /load_lora_adapter and /generate's lora_path, one name or one per prompt (AReaL's requests), and
  prime-rl's load / generate / unload sequence on /inference/v1/generate;
- every door gives an adapter's request the same tokens and log-probs (the same engine rows), different from
  the base model's, and base requests beside them are unchanged;
- bad input (a missing folder, DoRA, a rank over --max-lora-rank, an adapter of another model, a name not
  loaded, unloading an adapter in use) is a clear 4xx and the daemon keeps serving; --max-loras 2 evicts the
  least recently used adapter; /status and /metrics list the resident ones with versions and bytes.
The daemons end with SIGTERM and must exit 0."""
import json
import os
import shutil
import sys
import threading
import time
import urllib.error
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import MODEL, ROOT, TMP, case, main  # noqa: E402

from rdtest import Daemon, stop_cleanly  # noqa: E402

sys.path.insert(0, os.path.join(ROOT, "tools"))
import gen_lora  # noqa: E402

WORK = os.path.join(TMP, "test_lora_routes")
DATA = os.path.join(ROOT, os.environ.get("RD_TESTDATA", "build/testdata"))
PROMPT = [1, 504, 3458, 282, 260, 2723, 15141, 314, 4250, 3028, 30]
_d = {}
_ad = {}


def adapter(name, **kw):
    """A PEFT folder for the default model (written once)."""
    if name not in _ad:
        out = os.path.join(WORK, name)
        shutil.rmtree(out, ignore_errors=True)
        config, tensors, dtypes = gen_lora.adapter(MODEL, **kw)
        gen_lora.write(out, config, tensors, dtypes)
        _ad[name] = out
    return _ad[name]


def daemon(key="main", *extra):
    if key not in _d:
        _d[key] = Daemon(*extra, model=MODEL)
    return _d[key]


def raw_post(d, path, obj):
    """(status, content type, text) of a JSON POST."""
    req = urllib.request.Request(f"http://127.0.0.1:{d.http_port}{path}", data=json.dumps(obj).encode(),
                                 method="POST", headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            return r.status, r.headers.get("Content-Type", ""), r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.headers.get("Content-Type", ""), e.read().decode()


def load(d, name, path, vllm=True, **extra):
    route = "/v1/load_lora_adapter" if vllm else "/load_lora_adapter"
    return raw_post(d, route, {"lora_name": name, "lora_path": path, **extra})


def gen(d, lora=None, prompt=PROMPT, n=12):
    """/generate greedy: (ids, log-probs)."""
    body = {"input_ids": prompt, "return_logprob": True,
            "sampling_params": {"max_new_tokens": n, "temperature": 0, "ignore_eos": True}}
    if lora is not None:
        body["lora_path"] = lora
    st, doc = d.post("/generate", body)
    assert st == 200, (st, doc)
    lp = doc["meta_info"]["output_token_logprobs"]
    return [x[1] for x in lp], [x[0] for x in lp]


def ensure_loaded(d, name, path):
    st, _, text = load(d, name, path)
    assert st == 200 or "already been loaded" in text, (st, text)


@case
def vllm_load_list_serve_unload():
    d = daemon()
    path = adapter("math", rank=32, targets="all-linear", alpha=64.0, seed=1)
    st, ctype, text = load(d, "math", path)
    assert st == 200 and text == "Success: LoRA adapter 'math' added successfully.", (st, text)
    st, _, text = load(d, "math", path)
    assert st == 400 and "has already been loaded" in json.loads(text)["error"]["message"], (st, text)
    st, _, body = d.http("/v1/models")
    models = {m["id"]: m for m in json.loads(body)["data"]}
    base = [m for m in models.values() if m["parent"] is None]
    assert len(base) == 1 and models["math"]["parent"] == base[0]["id"] and models["math"]["root"] == path, models
    # served as model through the openai package: the adapter's answer, named as the adapter
    import openai
    c = openai.OpenAI(base_url=f"http://127.0.0.1:{d.http_port}/v1", api_key="none", max_retries=0)
    r = c.completions.create(model="math", prompt=PROMPT, max_tokens=12, temperature=0, logprobs=1,
                             extra_body={"ignore_eos": True, "return_token_ids": True})
    assert r.model == "math", r.model
    ids, lps = gen(d, "math")
    assert r.choices[0].token_ids == ids and r.choices[0].logprobs.token_logprobs == lps, (r.choices[0], ids)
    base_ids, base_lps = gen(d)
    assert base_lps != lps, "the adapter changes nothing"
    st, _, text = raw_post(d, "/v1/unload_lora_adapter", {"lora_name": "math"})
    assert st == 200 and text == "Success: LoRA adapter 'math' removed successfully.", (st, text)
    st, _, text = raw_post(d, "/v1/unload_lora_adapter", {"lora_name": "math"})
    assert st == 404 and "cannot be found" in text, (st, text)
    try:
        c.completions.create(model="math", prompt=PROMPT, max_tokens=2)
        raise AssertionError("an unloaded adapter still serves")
    except openai.NotFoundError:
        pass


@case
def every_door_same_rows_and_base_unchanged():
    d = daemon()
    path = adapter("style", rank=8, targets="attention", alpha=32.0, seed=2)
    ensure_loaded(d, "style", path)
    base_ids, base_lps = gen(d)
    ids, lps = gen(d, "style")
    # /inference/v1/generate with the adapter as model (prime-rl's route)
    st, doc = d.post("/inference/v1/generate", {"model": "style", "token_ids": PROMPT, "sampling_params": {
        "max_tokens": 12, "temperature": 0, "ignore_eos": True, "logprobs": 0}})
    assert st == 200, doc
    ch = doc["choices"][0]
    assert ch["token_ids"] == ids, (ch["token_ids"], ids)
    # AReaL: one lora_path per prompt, null for the base model; a batch of both, each row its own
    st, doc = d.post("/generate", {"input_ids": [PROMPT, PROMPT, PROMPT], "return_logprob": True,
                                   "lora_path": ["style", None, "style"],
                                   "sampling_params": {"max_new_tokens": 12, "temperature": 0, "ignore_eos": True}})
    assert st == 200, doc
    got = [([x[1] for x in o["meta_info"]["output_token_logprobs"]],
            [x[0] for x in o["meta_info"]["output_token_logprobs"]]) for o in doc]
    assert got[0] == (ids, lps) and got[2] == (ids, lps) and got[1] == (base_ids, base_lps), got
    # base requests running beside adapter ones are unchanged
    outs = {}

    def worker(k, lora):
        outs[k] = gen(d, lora)
    ts = [threading.Thread(target=worker, args=(k, "style" if k % 2 else None)) for k in range(6)]
    [t.start() for t in ts]
    [t.join() for t in ts]
    for k in range(6):
        assert outs[k] == ((ids, lps) if k % 2 else (base_ids, base_lps)), k


@case
def prime_rl_and_sglang_sequence():
    d = daemon()
    path = adapter("run-7", rank=16, targets="q_proj,v_proj", alpha=32.0, seed=3)
    st, _, text = load(d, "run-7", path, vllm=False)
    doc = json.loads(text)
    assert st == 200 and doc["success"] is True and doc["loaded_adapters"]["run-7"] == path, (st, doc)
    # unseeded at temperature 1 (prime-rl's request): ignore_eos, or a first-token EOS ends it early (seen once)
    st, doc = d.post("/inference/v1/generate", {"model": "run-7", "token_ids": PROMPT,
                                                "sampling_params": {"max_tokens": 4, "temperature": 1.0,
                                                                    "ignore_eos": True}})
    assert st == 200 and len(doc["choices"][0]["token_ids"]) == 4, doc
    # load_inplace: the next version under the same name; /status shows it
    path2 = adapter("run-7b", rank=16, targets="q_proj,v_proj", alpha=32.0, seed=4)
    before = gen(d, "run-7")
    st, _, text = load(d, "run-7", path2, load_inplace=True)
    assert st == 200, text
    after = gen(d, "run-7")
    assert before != after, "load_inplace served the old adapter"
    # SGLang's answers say which adapter and which load of it produced the tokens
    st, doc = d.post("/generate", {"input_ids": PROMPT, "lora_path": "run-7", "sampling_params": {"max_new_tokens": 2}})
    assert st == 200 and doc["meta_info"]["lora_path"] == "run-7" and doc["meta_info"]["lora_version"] == 2, doc
    st, doc = d.post("/generate", {"input_ids": PROMPT, "sampling_params": {"max_new_tokens": 2}})
    assert st == 200 and "lora_path" not in doc["meta_info"], doc
    st, _, body = d.http("/status")
    ads = {a["name"]: a for a in json.loads(body)["lora"]["adapters"]}
    assert ads["run-7"]["version"] == 2 and ads["run-7"]["rank"] == 16 and ads["run-7"]["bytes"] > 0, ads
    st, _, text = raw_post(d, "/unload_lora_adapter", {"lora_name": "run-7"})
    assert st == 200 and json.loads(text)["success"] is True, text
    st, doc = d.post("/inference/v1/generate", {"model": "run-7", "token_ids": PROMPT,
                                                "sampling_params": {"max_tokens": 4}})
    assert st == 404, (st, doc)


@case
def bad_adapters_refused_daemon_keeps_serving():
    d = daemon()
    cases = [
        (os.path.join(WORK, "nope"), "cannot open the adapter folder"),
        (adapter("dora", rank=8, dora=True, seed=5), "DoRA"),
        (adapter("big", rank=128, targets="q_proj", seed=6), "r = 128 is above the maximum LoRA rank 64"),
        (os.path.join(DATA, "lora", "tiny-f32-r8-attn"), "q_proj"),
    ]
    for path, word in cases:
        st, _, text = load(d, "bad", path)
        assert st == 400 and word in text, (path, st, text)
    st, _, text = load(d, "", adapter("style", rank=8, targets="attention", alpha=32.0, seed=2))
    assert st == 400 and "lora_name" in text, text
    st, _, text = load(d, "pin", adapter("style", rank=8, targets="attention", alpha=32.0, seed=2), vllm=False,
                       pinned=True)
    assert st == 400 and '"pinned"' in json.loads(text)["error_message"], text
    st, doc = d.post("/generate", {"input_ids": PROMPT, "lora_path": "never-loaded",
                                   "sampling_params": {"max_new_tokens": 2}})
    assert st == 400 and "never-loaded" in json.dumps(doc) and "not loaded" in json.dumps(doc), (st, doc)
    st, doc = d.post("/generate", {"input_ids": [PROMPT, PROMPT], "lora_path": ["style"],
                                   "sampling_params": {"max_new_tokens": 2}})
    assert st == 400 and "one per prompt" in json.dumps(doc), (st, doc)
    # unloading an adapter a request runs on is refused; the request finishes
    ensure_loaded(d, "style", adapter("style", rank=8, targets="attention", alpha=32.0, seed=2))
    res = {}

    def long_run():
        res["r"] = d.post("/generate", {"input_ids": PROMPT, "lora_path": "style",
                                        "sampling_params": {"max_new_tokens": 256, "ignore_eos": True}})
    t = threading.Thread(target=long_run)
    t.start()
    for _ in range(600):    # until the engine runs it (then it holds the adapter)
        if json.loads(d.http("/status")[2])["requests"]["running"] > 0:
            break
        time.sleep(0.01)
    st, _, refused = raw_post(d, "/v1/unload_lora_adapter", {"lora_name": "style"})
    t.join()
    assert refused and "in use" in refused, refused
    assert res["r"][0] == 200 and len(res["r"][1]["output_ids"]) == 256, res["r"][0]
    assert gen(d)[0], "the base model no longer serves"


@case
def max_loras_evicts_least_recently_used_and_metrics():
    d = daemon("two", "--max-loras", "2")
    paths = [adapter(f"e{i}", rank=8, targets="attention", seed=10 + i) for i in range(3)]
    for i in range(2):
        st, _, text = load(d, f"e{i}", paths[i])
        assert st == 200, text
    gen(d, "e0", n=1)          # e0 used: e1 is now the least recently used
    st, _, text = load(d, "e2", paths[2])
    assert st == 200, text
    st, _, body = d.http("/v1/models")
    ids = [m["id"] for m in json.loads(body)["data"] if m["parent"] is not None]
    assert sorted(ids) == ["e0", "e2"], ids
    st, _, text = d.http("/metrics")
    assert "rolloutd:lora_adapters{" in text and 'adapter="e2",version="1"' in text, text[-2000:]
    st, _, body = d.http("/get_server_info")
    info = json.loads(body)
    assert info["enable_lora"] is True and info["max_loras_per_batch"] == 2, info


@case
def daemons_exit_cleanly():
    stop_cleanly(*_d.values())


if __name__ == "__main__":
    os.makedirs(WORK, exist_ok=True)
    main()
