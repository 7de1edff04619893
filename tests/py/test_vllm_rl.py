"""vLLM's RL surface as SkyRL, prime-rl and TRL's async GRPO call it (daemon/api_vllm.c), on real
daemons on loopback with an api key, and through vllm-router (PyPI, tools/setup.sh) in front of
two of them:

- the routes' shapes: /tokenize (text and chat messages) equal to the prompt ids the /v1 routes
  use, /detokenize back to the text, /inference/v1/generate's choices (token_ids, "token_id:N"
  log-prob entries, the sampled token first), the same tokens and log-probs as TRL's
  /v1/completions call (token-id prompt, return_token_ids, logprobs 0) and as its own stream,
  bits equal for the same request and seed; refusals by name (unsupported sampling fields,
  NCCL / CUDA IPC transfer: 501 naming /update_weights and the NNG push); /get_world_size 1;
- /abort_requests by request_id; /pause modes abort (partial outputs, finish_reason "abort"), wait (answers after the running
  call) and keep (a running call frozen, its tokens equal to an unpaused run's), new calls held
  until /resume, /is_paused;
- a SkyRL / prime-rl-style cycle through vllm-router: data (/inference/v1/generate,
  /v1/completions with token ids, /tokenize) through the router, control fanned out to each
  daemon (/pause?mode=keep, /update_weights from a directory in vLLM's and prime-rl's shapes,
  /resume, /is_paused, /reset_prefix_cache); the outputs after the update equal a daemon started
  on the new weights;
- the router under load while one daemon is SIGKILLed: no request fails, the other serves them;
  restarted on its port, the daemon is used again;
- auth: every new route needs the key; vllm-router passes the client's Authorization header on for
  the inference routes (/inference/v1/generate, /v1/*) and adds its own --api-key to the routes it
  forwards as its own (/tokenize, /detokenize).

SKIP lines (router cases only) where vllm-router cannot be imported."""
import atexit
import concurrent.futures
import http.client
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import rdtest  # noqa: E402
from harness import BUILD, MODEL, ROOT, TMP, case, main, run  # noqa: E402
from rdtest import PROMPT, Daemon, free_port, stop_cleanly  # noqa: E402

DATA = os.path.join(ROOT, os.environ.get("RD_TESTDATA", "build/testdata"))
TINY = os.path.join(DATA, "tiny-qwen3.gguf")  # its weights as an HF folder: tiny-qwen3.hf/
KEY = "vllm-rl-test-key"
WORK = tempfile.mkdtemp(prefix="rd-vllm-", dir=TMP)
KEYFILE = os.path.join(WORK, "key")
with open(KEYFILE, "w") as f:
    f.write(KEY + "\n")
os.chmod(KEYFILE, 0o600)

try:
    import vllm_router  # noqa: F401
    HAVE_ROUTER = True
except ImportError:
    HAVE_ROUTER = False


def call(port, path, body=None, method=None, key=KEY, timeout=300, raw=False):
    """(status, parsed JSON or None for an empty body) of one request."""
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=data, method=method or (
        "POST" if body is not None else "GET"), headers={"Content-Type": "application/json",
                                                        **({"Authorization": f"Bearer {key}"} if key else {})})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            b = r.read()
            return r.status, (b if raw else json.loads(b) if b else None)
    except urllib.error.HTTPError as e:
        b = e.read()
        try:
            return e.code, json.loads(b) if b else None
        except ValueError:
            return e.code, b.decode(errors="replace")


def post(port, path, body=None, **kw):
    return call(port, path, {} if body is None else body, method="POST", **kw)


def sse(port, path, body):
    """The data: events of a streamed POST, parsed, and whether [DONE] ended it."""
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=300)
    c.request("POST", path, body=json.dumps(body), headers={"Authorization": f"Bearer {KEY}",
                                                            "Content-Type": "application/json"})
    r = c.getresponse()
    assert r.status == 200, (r.status, r.read())
    events, done = [], False
    for line in r.read().decode().split("\n"):
        if line.startswith("data: "):
            if line == "data: [DONE]":
                done = True
            else:
                events.append(json.loads(line[6:]))
    c.close()
    return events, done


def status(port):
    st, s = call(port, "/status")
    assert st == 200, s
    return s


def wait_running(port, n=1):
    deadline = time.time() + 30
    while status(port)["requests"]["running"] < n:
        assert time.time() < deadline, "the request never started"
        time.sleep(0.05)


_daemons = {}


def daemon(name, model=None):
    if name not in _daemons:
        _daemons[name] = Daemon("--api-key-file", KEYFILE, model=model)
    return _daemons[name]


def smol():
    return daemon("smol")


def gen_body(ids, seed, max_tokens=8, logprobs=None, **extra):
    sp = {"max_tokens": max_tokens, "temperature": 0.9, "seed": seed, "ignore_eos": True}
    if logprobs is not None:
        sp["logprobs"] = logprobs
    return {"model": "", "token_ids": ids, "sampling_params": sp, **extra}


def trl_body(ids, seed, max_tokens=8):
    """TRL async GRPO's /v1/completions payload (async_rollout_worker.py), with a seed."""
    return {"model": "", "prompt": ids, "max_tokens": max_tokens, "temperature": 0.9, "n": 1,
            "return_token_ids": True, "logprobs": 0, "seed": seed, "ignore_eos": True}


def gen_out(o):
    """(token ids, log-probs) of /inference/v1/generate's first choice."""
    ch = o["choices"][0]
    return ch["token_ids"], [x["logprob"] for x in (ch["logprobs"] or {"content": []})["content"]]


def cmpl_out(o):
    ch = o["choices"][0]
    return ch["token_ids"], ch["logprobs"]["token_logprobs"]


def bits(x):
    return np.asarray(x, dtype=np.float32).view(np.uint32).tolist()


# ---- the routes' shapes, on one daemon ----

@case
def tokenize_detokenize_and_generate_shapes():
    p = smol().http_port
    text = "The capital of France is"
    st, t = post(p, "/tokenize", {"model": "", "prompt": text})
    assert st == 200 and t["count"] == len(t["tokens"]) and t["token_strs"] is None, t
    st, c = post(p, "/v1/completions", {"prompt": text, "max_tokens": 1, "return_token_ids": True})
    assert st == 200 and c["choices"][0]["prompt_token_ids"] == t["tokens"], (c, t)
    assert t["max_model_len"] == call(p, "/v1/models")[1]["data"][0]["max_model_len"]
    st, t2 = post(p, "/tokenize", {"prompt": text, "add_special_tokens": False, "return_token_strs": True})
    assert st == 200 and len(t2["token_strs"]) == t2["count"] and all(isinstance(s, str) for s in t2["token_strs"])
    assert post(p, "/detokenize", {"model": "", "tokens": t2["tokens"]}) == (200, {"prompt": text})
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi there"}]
    st, tc = post(p, "/tokenize", {"model": "", "messages": msgs})
    st2, cc = post(p, "/v1/chat/completions", {"messages": msgs, "max_tokens": 1, "return_token_ids": True})
    assert st == 200 and st2 == 200 and tc["tokens"] == cc["prompt_token_ids"], (tc, cc)
    assert post(p, "/tokenize", {"messages": msgs, "add_generation_prompt": False})[0] == 400
    assert post(p, "/detokenize", {"tokens": [10 ** 7]})[0] == 400
    # Token ids in, token ids and log-probs out.
    st, g = post(p, "/inference/v1/generate", gen_body(PROMPT, 5, logprobs=2, request_id="r-1"))
    assert st == 200 and g["request_id"] == "r-1" and len(g["choices"]) == 1, g
    ch = g["choices"][0]
    assert ch["index"] == 0 and ch["finish_reason"] == "length" and len(ch["token_ids"]) == 8, ch
    assert ch["version_spans"] == [[0, 8, 0]], ch
    for tid, e in zip(ch["token_ids"], ch["logprobs"]["content"]):
        assert e["token"] == f"token_id:{tid}" and e["logprob"] <= 0, e
        tops = e["top_logprobs"]
        assert len(tops) == 2 and tops[0] == {"token": f"token_id:{tid}", "logprob": e["logprob"], "bytes": None}
        assert tops[1]["token"] != tops[0]["token"], tops
    assert g["usage"] == {"prompt_tokens": len(PROMPT), "completion_tokens": 8, "total_tokens": len(PROMPT) + 8}
    # TRL's /v1/completions call: the same tokens and log-probs, bit for bit; the same seed again, the same.
    st, c = post(p, "/v1/completions", trl_body(PROMPT, 5))
    assert st == 200 and cmpl_out(c)[0] == ch["token_ids"], (c, ch)
    assert bits(cmpl_out(c)[1]) == bits(gen_out(g)[1])
    assert all(list(d.values()) == [lp] for d, lp in zip(c["choices"][0]["logprobs"]["top_logprobs"],
                                                         cmpl_out(c)[1])), "logprobs 0: the sampled token only"
    st, g2 = post(p, "/inference/v1/generate", gen_body(PROMPT, 5, logprobs=2))
    assert gen_out(g2)[0] == ch["token_ids"] and bits(gen_out(g2)[1]) == bits(gen_out(g)[1])
    assert gen_out(post(p, "/inference/v1/generate", gen_body(PROMPT, 6))[1])[0] != ch["token_ids"]
    # Streamed: deltas that add up to the same answer, the finish reason last, [DONE].
    events, done = sse(p, "/inference/v1/generate", {**gen_body(PROMPT, 5, logprobs=0), "stream": True,
                                                     "stream_options": {"include_usage": True}})
    assert done and events[-1]["choices"] == [] and events[-1]["usage"]["completion_tokens"] == 8, events[-1]
    chunks = [e["choices"][0] for e in events[:-1]]
    assert [x["token_ids"] for x in chunks if x["token_ids"]] and chunks[-1]["finish_reason"] == "length"
    assert all(x["finish_reason"] is None for x in chunks[:-1])
    assert sum((x["token_ids"] for x in chunks), []) == ch["token_ids"]
    lps = [e["logprob"] for x in chunks for e in x["logprobs"]["content"]]
    assert bits(lps) == bits(gen_out(g)[1])
    # n samples: one choice each, indexed.
    st, gn = post(p, "/inference/v1/generate", {**gen_body(PROMPT, 9), "sampling_params": {
        "n": 3, "max_tokens": 4, "seed": 9, "temperature": 1.0}})
    assert st == 200 and [c["index"] for c in gn["choices"]] == [0, 1, 2], gn
    # Refusals name the field.
    for bad, word in ((dict(gen_body(PROMPT, 1), sampling_params={"max_tokens": 4, "bad_words": ["x"]}),
                       "bad_words"),
                      (dict(gen_body(PROMPT, 1), sampling_params={"max_tokens": 4, "repetition_penalty": 0}),
                       "repetition_penalty"),
                      ({"token_ids": PROMPT}, "sampling_params"),
                      ({"token_ids": "abc", "sampling_params": {}}, "token_ids"),
                      (dict(gen_body(PROMPT, 1), sampling_params={"logprobs": 10 ** 6}), "logprobs")):
        st, r = post(p, "/inference/v1/generate", bad)
        assert st == 400 and word in r["error"]["message"], (bad, st, r)


@case
def weight_transfer_routes_and_world_size():
    p = smol().http_port
    assert call(p, "/get_world_size") == (200, {"world_size": 1})
    nccl = {"init_info": {"master_address": "127.0.0.1", "master_port": 29555, "rank_offset": 1, "world_size": 2}}
    st, r = post(p, "/init_weight_transfer_engine", nccl)
    assert st == 501 and "/update_weights" in r["detail"] and "push" in r["detail"], r
    assert post(p, "/init_weight_transfer_engine", {})[0] == 400
    assert post(p, "/init_weight_transfer_engine", {"init_info": {}}) == (
        200, {"message": "Weight transfer initialized"})
    assert post(p, "/start_weight_update", {"is_checkpoint_format": True})[0] == 200
    st, r = post(p, "/update_weights", {"update_info": {"names": ["w"], "dtype_names": ["bfloat16"],
                                                        "shapes": [[2]], "packed": True}})
    assert st == 501 and "NNG" in r["detail"], r
    st, r = post(p, "/update_weights", {"update_info": {"path": os.path.join(WORK, "nowhere")}})
    assert st == 400 and "nowhere" in r["error"], r
    assert post(p, "/update_weights", {"nothing": 1})[0] == 400
    assert post(p, "/finish_weight_update", {"weight_version": "1"})[0] == 200
    assert status(p)["weight_version"] == 0


# ---- pause modes ----

def _long(port, out, key, max_tokens=250, seed=3):
    out[key] = post(port, "/inference/v1/generate", gen_body(PROMPT, seed, max_tokens=max_tokens, logprobs=0))


@case
def pause_abort_wait_keep_and_resume():
    p = smol().http_port
    res = {}
    # /abort_requests by request_id, without a pause: the call answers with what it had.
    t0 = threading.Thread(target=lambda: res.update(r=post(p, "/inference/v1/generate", gen_body(
        PROMPT, 3, max_tokens=250, logprobs=0, request_id="rl-1"))))
    t0.start()
    wait_running(p)
    time.sleep(0.3)
    assert post(p, "/abort_requests", {"request_ids": ["nope"]}) == (200, {"status": "aborted", "aborted": 0})
    assert post(p, "/abort_requests", {"request_ids": ["rl-1"]}) == (200, {"status": "aborted", "aborted": 1})
    t0.join(300)
    ch = res["r"][1]["choices"][0]
    assert ch["finish_reason"] == "abort" and 0 < len(ch["token_ids"]) < 250 and len(ch["logprobs"]["content"]) == \
        len(ch["token_ids"]), ch
    assert call(p, "/is_paused") == (200, {"is_paused": False})
    # abort: the running call comes back with what it has; new calls wait for /resume.
    t = threading.Thread(target=_long, args=(p, res, "a"))
    t.start()
    wait_running(p)
    time.sleep(0.3)
    assert post(p, "/pause?mode=abort") == (200, {"status": "paused"})
    t.join(300)
    st, o = res["a"]
    assert st == 200 and o["choices"][0]["finish_reason"] == "abort", o
    assert 0 < len(o["choices"][0]["token_ids"]) < 250
    assert call(p, "/is_paused") == (200, {"is_paused": True})
    t2 = threading.Thread(target=_long, args=(p, res, "held", 4))
    t2.start()
    time.sleep(0.8)
    assert "held" not in res and status(p)["requests"]["running"] == 0, "a paused daemon must hold new calls"
    assert post(p, "/resume") == (200, {"status": "resumed"})
    t2.join(300)
    assert res["held"][0] == 200 and len(res["held"][1]["choices"][0]["token_ids"]) == 4
    assert call(p, "/is_paused") == (200, {"is_paused": False})
    # wait: answered once the running call has finished, whole; the prefix cache dropped (clear_cache).
    t3 = threading.Thread(target=_long, args=(p, res, "w", 12))
    t3.start()
    wait_running(p)
    st, r = post(p, "/pause?mode=wait&clear_cache=true")
    # The generation's answer went out before the pause's.
    s = status(p)
    assert st == 200 and r == {"status": "paused"} and s["requests"]["running"] == 0, (st, r)
    assert s["kv_cache"]["blocks_cached"] == 0, s["kv_cache"]
    t3.join(300)
    assert res["w"][1]["choices"][0]["finish_reason"] == "length" and len(res["w"][1]["choices"][0]["token_ids"]) == 12
    assert post(p, "/resume")[0] == 200
    # keep: the running call freezes (no tokens made), then goes on to the same tokens as an unpaused run.
    _long(p, res, "ref", 60, seed=4)
    t4 = threading.Thread(target=_long, args=(p, res, "k", 60, 4))
    t4.start()
    wait_running(p)
    time.sleep(0.3)
    assert post(p, "/pause?mode=keep&clear_cache=false") == (200, {"status": "paused"})
    deadline = time.time() + 30
    while not status(p)["generation_paused"]:  # the engine froze at a step boundary
        assert time.time() < deadline, "the engine never froze"
        time.sleep(0.05)
    time.sleep(0.3)
    g0 = status(p)["tokens"]["generated_total"]
    time.sleep(1.0)
    s = status(p)
    assert s["tokens"]["generated_total"] == g0 and s["generation_paused"] and "k" not in res, s
    assert post(p, "/pause?mode=sideways")[0] == 400
    # The same weights as the next version (a .gguf path works too): the frozen call goes on under it.
    assert post(p, "/update_weights", {"update_info": {"path": MODEL}}) == (
        200, {"message": "Weights updated", "weight_version": 1})
    assert status(p)["tokens"]["generated_total"] == g0
    assert post(p, "/resume")[0] == 200
    t4.join(300)
    assert gen_out(res["k"][1])[0] == gen_out(res["ref"][1])[0], "a keep pause changed the tokens"
    assert bits(gen_out(res["k"][1])[1]) == bits(gen_out(res["ref"][1])[1])
    spans = res["k"][1]["choices"][0]["version_spans"]
    assert len(spans) == 2 and spans[0][2] == 0 and spans[1][2] == 1 and spans[1][1] == 60, spans
    assert status(p)["generation_paused"] is False
    # reset_prefix_cache: vLLM's empty 200.
    assert post(p, "/reset_prefix_cache?reset_running_requests=true", raw=True) == (200, b"")


# ---- through vllm-router ----

def perturbed_folder():
    """tiny-qwen3's HF folder with every norm weight scaled: the 'trainer's' next weights."""
    out = os.path.join(WORK, "step1")
    if not os.path.isdir(out):
        src = TINY[:-5] + ".hf"
        os.makedirs(out)
        for name in os.listdir(src):
            if not name.endswith(".safetensors"):
                shutil.copy(os.path.join(src, name), out)
        for name in os.listdir(src):
            if name.endswith(".safetensors"):
                raw = open(os.path.join(src, name), "rb").read()
                n = int.from_bytes(raw[:8], "little")
                head = json.loads(raw[8:8 + n])
                data = bytearray(raw[8 + n:])
                for k, v in head.items():
                    if k != "__metadata__" and k.endswith("norm.weight"):
                        assert v["dtype"] == "F32", v
                        a, b = v["data_offsets"]
                        x = np.frombuffer(bytes(data[a:b]), dtype=np.float32) * np.float32(1.25)
                        data[a:b] = x.tobytes()
                open(os.path.join(out, name), "wb").write(raw[:8 + n] + bytes(data))
    return out


ROUTER = {}


def router_port():
    if "port" in ROUTER:
        return ROUTER["port"]
    a, b = daemon("a", TINY), daemon("b", TINY)
    port = free_port()
    log = open(os.path.join(WORK, "router.log"), "w+")
    cmd = [sys.executable, "-m", "vllm_router.launch_router", "--host", "127.0.0.1", "--port", str(port),
           "--worker-urls", f"http://127.0.0.1:{a.http_port}", f"http://127.0.0.1:{b.http_port}",
           "--policy", "round_robin", "--prometheus-port", str(free_port()),
           "--health-check-interval-secs", "1", "--health-failure-threshold", "1", "--health-success-threshold", "1",
           "--cb-failure-threshold", "1", "--cb-timeout-duration-secs", "2", "--cb-success-threshold", "1",
           "--worker-startup-timeout-secs", "60", "--worker-startup-check-interval", "1",
           "--retry-max-retries", "5", "--retry-initial-backoff-ms", "20", "--log-level", "warning",
           # the key the router adds to what it forwards as its own (/tokenize, /detokenize, unknown
           # routes); the inference routes carry the client's Authorization header instead
           "--api-key", KEY]
    if "proc" in ROUTER:
        raise AssertionError("vllm-router failed to start before")
    ROUTER["proc"] = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    ROUTER["log"] = log
    deadline = time.time() + 60
    while True:
        try:
            if call(port, "/health", timeout=2, raw=True)[0] == 200:
                break
        except OSError:
            pass
        if ROUTER["proc"].poll() is not None or time.time() > deadline:
            log.flush()
            log.seek(0)
            raise AssertionError(f"vllm-router did not start: {log.read()[-3000:]}")
        time.sleep(0.2)
    ROUTER["port"] = port
    return port


@atexit.register
def _leftovers():
    """Whatever a failed or skipped case left running (the last case stops them cleanly)."""
    if "proc" in ROUTER and ROUTER["proc"].poll() is None:
        ROUTER["proc"].kill()
    for d in _daemons.values():
        d.kill()


def router_case(fn):
    """harness.case, but a SKIP line where vllm-router cannot be imported."""
    if HAVE_ROUTER:
        return case(fn)
    print(f"SKIP {fn.__name__}: vllm-router is not installed (tools/setup.sh installs vllm-router==0.1.17)")
    return fn


PROMPTS = [[1, 17, 40, 99, 123, 7], [1, 200, 201, 5], [1, 64, 65, 66, 67, 68, 69, 70], [1, 250, 3]]


def served(ports, fn):
    """fn's answer from each daemon directly (they hold the same weights, so they must agree)."""
    outs = [fn(p) for p in ports]
    assert all(o == outs[0] for o in outs), outs
    return outs[0]


def generate_all(port, seed0=100):
    """Each prompt through /inference/v1/generate and TRL's /v1/completions: (ids, bits) per call."""
    out = []
    for i, ids in enumerate(PROMPTS):
        st, g = post(port, "/inference/v1/generate", gen_body(ids, seed0 + i, max_tokens=12, logprobs=0))
        assert st == 200, g
        t, lp = gen_out(g)
        st, c = post(port, "/v1/completions", trl_body(ids, seed0 + i, max_tokens=12))
        assert st == 200, c
        assert cmpl_out(c)[0] == t and bits(cmpl_out(c)[1]) == bits(lp), "the two routes disagree"
        out.append((t, bits(lp)))
    return out


@router_case
def skyrl_cycle_through_vllm_router():
    r = router_port()
    a, b = _daemons["a"], _daemons["b"]
    direct = served([a.http_port, b.http_port], generate_all)
    before = [status(d.http_port)["requests"]["completed"] for d in (a, b)]
    assert generate_all(r) == direct, "the router's answers differ from the daemons'"
    after = [status(d.http_port)["requests"]["completed"] for d in (a, b)]
    assert all(x > y for x, y in zip(after, before)), f"round robin used one daemon only: {before} -> {after}"
    st, t = post(r, "/tokenize", {"model": "", "prompt": "hello world", "add_special_tokens": True})
    assert st == 200 and t["tokens"] == post(a.http_port, "/tokenize", {"prompt": "hello world"})[1]["tokens"], t
    assert post(r, "/detokenize", {"model": "", "tokens": t["tokens"]}) == (200, {"prompt": "hello world"})
    # Control, fanned out to every daemon: pause (keep), weights from a directory, resume.
    new = perturbed_folder()
    for d in (a, b):
        assert post(d.http_port, "/pause?mode=keep&clear_cache=false") == (200, {"status": "paused"})
        assert call(d.http_port, "/is_paused") == (200, {"is_paused": True})
    # A call that arrives during the pause waits, then is served by the new weights.
    held = {}
    th = threading.Thread(target=lambda: held.update(o=post(r, "/inference/v1/generate",
                                                            gen_body(PROMPTS[0], 100, 12, logprobs=0))))
    th.start()
    assert post(a.http_port, "/update_weights", {"update_info": {"path": new}}) == (
        200, {"message": "Weights updated", "weight_version": 1})
    assert post(b.http_port, "/update_weights", {"weight_dir": new}) == (200, {"status": "ok", "weight_version": 1})
    assert "o" not in held
    for d in (a, b):
        assert post(d.http_port, "/resume") == (200, {"status": "resumed"})
        assert call(d.http_port, "/is_paused") == (200, {"is_paused": False})
        assert post(d.http_port, "/reset_prefix_cache", raw=True) == (200, b"")
    th.join(300)
    assert held["o"][0] == 200 and held["o"][1]["choices"][0]["version_spans"] == [[0, 12, 1]], held
    # The outputs now equal a daemon started on the new weights (its folder has no tokenizer: no EOS,
    # the calls ignore it anyway), and differ from before.
    ref = Daemon("--api-key-file", KEYFILE, model=new)
    try:
        want = generate_all_tokens(ref.http_port)
    finally:
        ref.stop()
    got = generate_all(r)
    assert [x for x, _ in got] == [x for x, _ in want] and [y for _, y in got] == [y for _, y in want], \
        "after the update the outputs differ from a daemon started on the new weights"
    assert got != direct, "the update changed nothing"
    assert held["o"][1]["choices"][0]["token_ids"] == got[0][0]


def generate_all_tokens(port, seed0=100):
    """generate_all through /inference/v1/generate only (a daemon without a tokenizer serves it too)."""
    out = []
    for i, ids in enumerate(PROMPTS):
        st, g = post(port, "/inference/v1/generate", gen_body(ids, seed0 + i, max_tokens=12, logprobs=0))
        assert st == 200, g
        t, lp = gen_out(g)
        out.append((t, bits(lp)))
    return out


def daemon_on(http_port, model):
    """A Daemon whose HTTP server takes http_port (a restart on the port the router knows)."""
    ports = iter([free_port(), http_port])
    orig = rdtest.free_port
    rdtest.free_port = lambda: next(ports)
    try:
        return Daemon("--api-key-file", KEYFILE, model=model)
    finally:
        rdtest.free_port = orig


@router_case
def router_fails_over_when_a_daemon_dies_and_uses_it_again():
    r = router_port()
    a, b = _daemons["a"], _daemons["b"]
    n, fails, done, killed = 80, [], [], {}
    lock = threading.Lock()

    def one(i):
        st, g = post(r, "/inference/v1/generate", gen_body(PROMPTS[i % 4], 1000 + i, max_tokens=24))
        if st != 200:
            fails.append((i, st, g))
        with lock:
            done.append(i)
            # The 15th answer kills b from the worker that got it: a busy machine that is slow to wake
            # the main thread cannot let every request finish first.
            if len(done) == 15:
                killed["b_served"] = status(b.http_port)["requests"]["completed"]
                b.kill()  # SIGKILL: connections reset, no answer for what it ran
                killed["at"] = len(done)
        return st

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        futs = [pool.submit(one, i) for i in range(n)]
        for f in futs:
            f.result(timeout=120)
    b_served, at_kill = killed["b_served"], killed["at"]
    assert not fails, f"{len(fails)} requests failed through the router: {fails[:3]}"
    assert b_served > 0 and at_kill < n - 8, (b_served, at_kill)
    port = b.http_port
    served_a = status(a.http_port)["requests"]["completed"]
    # Restarted on the same port: the router's health check and circuit breaker take it back.
    b2 = daemon_on(port, TINY)
    _daemons["b"] = b2
    # A rejoining daemon catches up on the weights before it serves (the cycle's update).
    if os.path.isdir(os.path.join(WORK, "step1")):
        assert post(port, "/update_weights", {"weight_dir": perturbed_folder()})[0] == 200
    deadline = time.time() + 60
    while status(port)["requests"]["completed"] == 0:
        assert time.time() < deadline, f"the restarted daemon was never used again: {ROUTER['log'].name}"
        st, _ = post(r, "/inference/v1/generate", gen_body(PROMPTS[0], 7, max_tokens=2))
        assert st == 200
        time.sleep(0.2)
    assert status(a.http_port)["requests"]["completed"] > served_a


@router_case
def cache_aware_router_keeps_a_prefix_on_one_daemon():
    """vllm-router's default policy over the same two daemons: calls that share a long prefix land
    on one daemon, and their answers equal the daemons' own."""
    router_port()
    a, b = _daemons["a"], _daemons["b"]
    port = free_port()
    log = open(os.path.join(WORK, "router-ca.log"), "w+")
    proc = subprocess.Popen([sys.executable, "-m", "vllm_router.launch_router", "--host", "127.0.0.1", "--port",
                             str(port), "--worker-urls", f"http://127.0.0.1:{a.http_port}",
                             f"http://127.0.0.1:{b.http_port}", "--policy", "cache_aware", "--prometheus-port",
                             str(free_port()), "--api-key", KEY, "--log-level", "warning"],
                            stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.time() + 60
        while True:
            try:
                if call(port, "/health", timeout=2, raw=True)[0] == 200:
                    break
            except OSError:
                pass
            assert proc.poll() is None and time.time() < deadline, "vllm-router (cache_aware) did not start"
            time.sleep(0.2)
        before = [status(d.http_port)["requests"]["completed"] for d in (a, b)]
        prefix = "The quick brown fox jumps over the lazy dog, and then it runs far away into the woods. "
        for i in range(6):
            body = {"model": "", "prompt": prefix + f"Step {i}:", "max_tokens": 4, "temperature": 0.9, "seed": i,
                    "return_token_ids": True, "ignore_eos": True}
            st, c = post(port, "/v1/completions", body)
            assert st == 200 and c["choices"][0]["token_ids"] == post(a.http_port, "/v1/completions", body)[1][
                "choices"][0]["token_ids"], c
        after = [status(d.http_port)["requests"]["completed"] for d in (a, b)]
        routed = [x - y - (6 if d is a else 0) for x, y, d in zip(after, before, (a, b))]
        assert sorted(routed) == [0, 6], f"a shared prefix was spread over the daemons: {routed}"
    finally:
        proc.kill()
        proc.wait()


@router_case
def auth_on_every_new_route_and_through_the_router():
    p = smol().http_port
    routes = [("POST", "/pause"), ("POST", "/resume"), ("GET", "/is_paused"), ("POST", "/abort_requests"),
              ("POST", "/reset_prefix_cache"),
              ("POST", "/tokenize"), ("POST", "/detokenize"), ("POST", "/inference/v1/generate"),
              ("POST", "/update_weights"), ("POST", "/init_weight_transfer_engine"), ("POST", "/start_weight_update"),
              ("POST", "/finish_weight_update"), ("GET", "/get_world_size")]
    for method, path in routes:
        for key in (None, "wrong"):
            st, _ = call(p, path, {} if method == "POST" else None, method=method, key=key)
            assert st == 401, (path, key, st)
    assert call(p, "/is_paused")[0] == 200 and call(p, "/get_world_size")[0] == 200
    # The router passes the client's Authorization header on to the daemon for the inference routes
    # (its own --api-key goes with /tokenize: see the cycle).
    r = router_port()
    assert post(r, "/inference/v1/generate", gen_body(PROMPTS[1], 1), key=None)[0] == 401
    assert post(r, "/inference/v1/generate", gen_body(PROMPTS[1], 1), key="wrong")[0] == 401
    assert post(r, "/inference/v1/generate", gen_body(PROMPTS[1], 1))[0] == 200
    assert post(r, "/v1/completions", trl_body(PROMPTS[1], 1), key=None)[0] == 401


@case
def sigterm_exits_cleanly():
    if "proc" in ROUTER:
        ROUTER["proc"].send_signal(signal.SIGTERM)
        try:
            ROUTER["proc"].wait(20)
        except subprocess.TimeoutExpired:
            ROUTER["proc"].kill()
    # One daemon still has a call frozen by a keep pause: the drain unfreezes and finishes it.
    p = smol().http_port
    ds = [d for d in _daemons.values() if d.proc.poll() is None]
    res = {}
    t = threading.Thread(target=_long, args=(p, res, "last", 250))
    t.start()
    wait_running(p)
    assert post(p, "/pause?mode=keep")[0] == 200
    stop_cleanly(*ds)
    t.join(300)
    assert res["last"][0] == 200, res
    shutil.rmtree(WORK, ignore_errors=True)


if __name__ == "__main__":
    main()
