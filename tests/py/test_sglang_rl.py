"""SGLang's RL surface (issue 22) as slime calls it, with plain HTTP: batch /generate on token
ids with return_logprob, /pause_generation in its three modes (abort: partial outputs come back;
in_place: frozen, KV kept; retract: back to the queue, KV dropped, resumed by
/continue_generation with the same tokens), /update_weights_from_disk with a weight_version,
GET /flush_cache, /get_weight_version, /get_server_info and /server_info, and
/release_memory_occupation / /resume_memory_occupation between rounds (the KV bytes in /status
really drop, generation is refused meanwhile, and the outputs after resume equal those before).
After the update the outputs equal those of a daemon started on the new weights. Then the same
cycle through sglang-router (PyPI, 0.3.2) over two daemons, and vLLM's /sleep, /wake_up and
/is_sleeping on the same mechanism. Two tiny models of one shape (tools/gen_tiny_model.py, two
seeds) stand for the policy before and after a training step."""
import json
import os
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import ROOT, TMP, Skip, case, main  # noqa: E402

from rdtest import Daemon, free_port, stop_cleanly  # noqa: E402

KEY = "sglang-rl-key_0123456789"
PROMPTS = [[1, 40, 41, 42, 43, 44, 45, 46], [1, 50, 60, 70, 80]]
_files = {}


def models():
    """Two tiny GGUF models of the same shape, different weights: (old, new)."""
    if not _files:
        for name, seed in (("old", 501), ("new", 502)):
            path = os.path.join(TMP, f"sglang-rl-{name}-{os.getpid()}.gguf")
            subprocess.run([sys.executable, os.path.join(ROOT, "tools", "gen_tiny_model.py"), "--out", path,
                            "--dtype", "f32", "--seed", str(seed), "--ctx", "2048", "--layers", "4", "--dim", "256",
                            "--ffn", "512", "--hf-out", path[:-5] + ".npz"], check=True,
                           capture_output=True)
            _files[name] = path
            _files[name + ".npz"] = path[:-5] + ".npz"
    return _files["old"], _files["new"]


def keyfile():
    kf = os.path.join(TMP, f"rd-sglang-key-{os.getpid()}")
    with open(kf, "w") as f:
        f.write(KEY + "\n")
    os.chmod(kf, 0o600)
    return kf


def start(model):
    return Daemon("--api-key-file", keyfile(), "--model", model, "--max-tokens", 2000)


def call(base, path, body=None, method=None, timeout=60, key=KEY):
    """(status, parsed JSON or None) of a call; body None and no method: GET."""
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(base + path, data=data, method=method or ("POST" if data is not None else "GET"),
                                 headers={"Content-Type": "application/json", "Authorization": f"Bearer {key}"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            raw = r.read()
            return r.status, json.loads(raw) if raw else None
    except urllib.error.HTTPError as e:
        raw = e.read()
        return e.code, json.loads(raw) if raw else None


def base(d):
    return f"http://127.0.0.1:{d.http_port}"


def gen(b, prompts=PROMPTS, n_new=12, seed=7, **extra):
    st, r = call(b, "/generate", {"input_ids": prompts, "return_logprob": True,
                                  "sampling_params": {"max_new_tokens": n_new, "temperature": 1.0, "top_p": 1.0,
                                                      "sampling_seed": seed, "ignore_eos": True}, **extra})
    assert st == 200, (st, r)
    return r


def ids_lps(r):
    return [(o["output_ids"], [t[0] for t in o["meta_info"]["output_token_logprobs"]]) for o in r]


def status(b):
    return call(b, "/status")[1]


def wait_running(b, n=1, timeout=20):
    deadline = time.time() + timeout
    while status(b)["requests"]["running"] < n:
        assert time.time() < deadline, status(b)
        time.sleep(0.02)


def long_gen(b, out, key, n_new=1500):
    out[key] = call(b, "/generate", {"input_ids": PROMPTS[0], "sampling_params": {
        "max_new_tokens": n_new, "ignore_eos": True, "sampling_seed": 3}, "return_logprob": True}, timeout=120)


def slime_cycle(b, d_new_ref, direct):
    """One slime round against base URL b; direct: the daemons' own URLs (control calls go
    to each, as slime makes them)."""
    r0 = gen(b)
    assert len(r0) == 2 and all(len(o["output_ids"]) == 12 for o in r0), r0
    assert all(len(o["meta_info"]["output_token_logprobs"]) == 12 for o in r0)
    assert all(t[1] == i for o in r0 for t, i in zip(o["meta_info"]["output_token_logprobs"], o["output_ids"]))
    # pause (abort): the long request comes back now with its partial output.
    res = {}
    t = threading.Thread(target=long_gen, args=(direct[0], res, "a"))
    t.start()
    wait_running(direct[0])
    time.sleep(0.2)
    for u in direct:
        assert call(u, "/pause_generation", {"mode": "abort"}) == (200, {"success": True})
    t.join(60)
    st, o = res["a"]
    assert st == 200 and o["meta_info"]["finish_reason"]["type"] == "abort", o
    assert 0 < len(o["output_ids"]) < 1500 and len(o["meta_info"]["output_token_logprobs"]) == len(o["output_ids"])
    # GET /flush_cache (slime's method), the update with a version, the version read back.
    for u in direct:
        assert call(u, "/flush_cache")[0] == 200
        st, r = call(u, "/update_weights_from_disk", {"model_path": d_new_ref[1], "weight_version": "7",
                                                    "flush_cache": True, "abort_all_requests": False}, timeout=120)
        assert st == 200 and r["success"] is True and r["weight_version"] == "7", r
        assert call(u, "/get_weight_version") == (200, {"weight_version": "7"})
        assert call(u, "/continue_generation", {}) == (200, {"success": True})
    r1 = gen(b)
    assert all(o["meta_info"]["weight_version"] == "7" for o in r1)
    assert ids_lps(r1) == ids_lps(gen(base(d_new_ref[0]))), "after the update: the new weights' outputs"
    assert ids_lps(r1) != ids_lps(r0)
    # Release and resume between rounds: the KV pool really goes and comes back.
    for u in direct:
        kv0 = status(u)["kv_cache"]["bytes"]
        assert kv0 > 0
        st, r = call(u, "/release_memory_occupation", {})
        assert st == 200 and r["success"] is True, r
        s = status(u)
        assert s["kv_cache"]["bytes"] == 0 and s["memory"]["weights_bytes"] == 0, s["kv_cache"]
        st, r = call(u, "/generate", {"input_ids": PROMPTS[0], "sampling_params": {"max_new_tokens": 2}})
        assert st == 503 and "released" in json.dumps(r), (st, r)
        st, r = call(u, "/resume_memory_occupation", {"tags": ["weights"]})
        assert st == 200, r
        assert status(u)["kv_cache"]["bytes"] == 0
        st, r = call(u, "/resume_memory_occupation", {"tags": ["kv_cache"]})
        assert st == 200, r
        assert status(u)["kv_cache"]["bytes"] == kv0
    assert ids_lps(gen(b)) == ids_lps(r1), "the weights read back give the same outputs"


@case
def slime_cycle_one_daemon():
    old, new = models()
    d, ref = start(old), start(new)
    try:
        b = base(d)
        for path in ("/get_server_info", "/server_info"):
            st, info = call(b, path)
            assert st == 200 and info["model_path"] == old and info["tokenizer_path"] == old, info
            assert info["tp_size"] == 1 and info["dp_size"] == 1 and info["page_size"] > 0, info
            assert info["context_length"] == 2048 and info["max_total_num_tokens"] > 0, info
            assert info["weight_version"] == "0" and info["enable_memory_saver"] is True, info
        assert call(b, "/get_weight_version") == (200, {"weight_version": "0"})
        assert call(b, "/get_weight_version", key="wrong")[0] == 401
        # return_text_in_logprobs names each token; custom_logit_processor and input log-probs are refused.
        r = gen(b, prompts=PROMPTS[0], n_new=3, return_text_in_logprobs=True)
        assert all(isinstance(t[2], str) for t in r["meta_info"]["output_token_logprobs"]), r
        st, e = call(b, "/generate", {"input_ids": PROMPTS[0], "custom_logit_processor": "x"})
        assert st == 400 and "custom_logit_processor" in json.dumps(e), e
        # Prompt log-probs (issue 45): one entry per prompt position, position 0's log-prob null.
        st, e = call(b, "/generate", {"input_ids": PROMPTS[0], "logprob_start_len": 0, "return_logprob": True,
                                      "sampling_params": {"max_new_tokens": 2}})
        ins = e["meta_info"]["input_token_logprobs"]
        assert st == 200 and len(ins) == len(PROMPTS[0]) and ins[0][0] is None and ins[1][0] < 0, e
        # One rid for a batch: each sample's id is rid_<k>, and aborting by the rid reaches them all.
        r = gen(b, n_new=2, rid="grp")
        assert [o["meta_info"]["id"] for o in r] == ["grp_0", "grp_1"], r
        r = gen(b, n_new=2, rid=["p", "q"])
        assert [o["meta_info"]["id"] for o in r] == ["p", "q"], r
        # no_stop_trim keeps the stop token's text; by default it is cut.
        g = gen(b, prompts=PROMPTS[0], n_new=6, return_text_in_logprobs=True)
        t = g["output_ids"][3]
        texts = []
        for keep in (False, True):
            st, o = call(b, "/generate", {"input_ids": PROMPTS[0], "sampling_params": {
                "max_new_tokens": 6, "temperature": 1.0, "sampling_seed": 7, "ignore_eos": True,
                "stop_token_ids": [t], "no_stop_trim": keep}})
            assert st == 200 and o["meta_info"]["finish_reason"] == {"type": "stop", "matched": t}, o
            assert o["output_ids"][-1] == t and len(o["output_ids"]) <= 4, o
            texts.append(o["text"])
        assert texts[1].startswith(texts[0]) and len(texts[1]) > len(texts[0]), texts
        slime_cycle(b, (ref, new), [b])
    finally:
        stop_cleanly(d, ref)


@case
def pause_in_place_and_retract():
    old, _ = models()
    d = start(old)
    try:
        b = base(d)
        res = {}
        # Unpaused reference of the long request.
        long_gen(b, res, "ref")
        ref = res["ref"][1]
        for mode in ("in_place", "retract"):
            t = threading.Thread(target=long_gen, args=(b, res, mode))
            t.start()
            wait_running(b)
            time.sleep(0.3)
            assert call(b, "/pause_generation", {"mode": mode}) == (200, {"success": True})
            time.sleep(0.3)  # the step in flight ends
            s0 = status(b)
            g0 = s0["tokens"]["generated_total"]
            if mode == "in_place":
                assert s0["requests"]["running"] == 1 and s0["kv_cache"]["blocks_used"] > 0, s0
            else:  # back in the queue, its KV given back
                assert s0["requests"]["running"] == 0 and s0["requests"]["waiting"] == 1, s0["requests"]
                assert s0["kv_cache"]["blocks_used"] == 0, s0["kv_cache"]
            time.sleep(0.5)
            assert status(b)["tokens"]["generated_total"] == g0 and mode not in res, "paused, it made tokens"
            assert call(b, "/continue_generation", {}) == (200, {"success": True})
            t.join(60)
            st, o = res[mode]
            assert st == 200 and o["meta_info"]["finish_reason"]["type"] == "length", o
            assert o["output_ids"] == ref["output_ids"], f"{mode}: the same tokens as unpaused"
    finally:
        stop_cleanly(d)


@case
def sglang_router_over_two_daemons():
    try:
        import sglang_router  # noqa: F401
    except ImportError:
        raise Skip("sglang-router is not installed")
    old, new = models()
    d1, d2, ref = start(old), start(old), start(new)
    port = free_port()
    log = open(os.path.join(TMP, f"sglang-router-{port}.log"), "w+")
    router = subprocess.Popen([sys.executable, "-m", "sglang_router.launch_router", "--host", "127.0.0.1",
                               "--port", str(port), "--worker-urls", base(d1), base(d2), "--policy", "round_robin",
                               "--api-key", KEY, "--log-level", "warn",
                               # Its metrics on a free port: the router dies when the default 29000 is taken.
                               "--prometheus-host", "127.0.0.1", "--prometheus-port", str(free_port())],
                              stdout=log, stderr=subprocess.STDOUT)
    try:
        rb = f"http://127.0.0.1:{port}"
        deadline = time.time() + 60
        while True:
            try:
                if call(rb, "/generate", {"input_ids": PROMPTS[0], "sampling_params": {"max_new_tokens": 1}})[0] == 200:
                    break
            except OSError:
                pass
            assert router.poll() is None and time.time() < deadline, log.seek(0) or log.read()[-3000:]
            time.sleep(0.3)
        # The router's fan-out of a cache flush reaches both daemons (it passes the key on).
        st, _ = call(rb, "/flush_cache", {}, method="POST")
        assert st == 200, st
        for _ in range(4):
            gen(rb, prompts=PROMPTS[0], n_new=2)
        a1, a2 = (status(base(x))["requests"]["completed"] for x in (d1, d2))
        assert a1 >= 2 and a2 >= 2, (a1, a2)
        slime_cycle(rb, (ref, new), [base(d1), base(d2)])
    finally:
        router.terminate()
        router.wait(10)
        stop_cleanly(d1, d2, ref)


@case
def vllm_sleep_wake_up():
    old, _ = models()
    d = start(old)
    try:
        b = base(d)
        before = ids_lps(gen(b))
        kv0 = status(b)["kv_cache"]["bytes"]
        assert call(b, "/is_sleeping") == (200, {"is_sleeping": False})
        # A sleep while a request runs is refused; with mode=abort it ends the request first.
        res = {}
        t = threading.Thread(target=long_gen, args=(b, res, "a"))
        t.start()
        wait_running(b)
        st, _ = call(b, "/release_memory_occupation", {})
        assert st == 400, st
        assert call(b, "/sleep?level=1&mode=abort", {}) == (200, None)
        t.join(60)
        assert res["a"][1]["meta_info"]["finish_reason"]["type"] == "abort"
        assert call(b, "/is_sleeping") == (200, {"is_sleeping": True})
        assert status(b)["kv_cache"]["bytes"] == 0
        assert call(b, "/wake_up?tags=weights", {}) == (200, None)
        assert call(b, "/is_sleeping") == (200, {"is_sleeping": True})
        assert call(b, "/wake_up?tags=kv_cache", {}) == (200, None)
        assert call(b, "/is_sleeping") == (200, {"is_sleeping": False})
        assert status(b)["kv_cache"]["bytes"] == kv0
        assert ids_lps(gen(b)) == before
        assert call(b, "/sleep?level=2", {}) == (200, None)
        assert call(b, "/wake_up", {}) == (200, None)
        assert ids_lps(gen(b)) == before
        # Asleep at SIGTERM: the daemon still exits 0 (under ASan: nothing leaked).
        assert call(b, "/sleep?level=1", {}) == (200, None)
    finally:
        stop_cleanly(d)


@case
def weights_from_an_nng_push_cannot_be_released():
    """An NNG push leaves no file to read the weights back from: releasing them is refused with
    the reason; the KV cache alone can still go and come back. A later update from disk gives the
    weights a file again."""
    import numpy as np
    sys.path.insert(0, os.path.join(ROOT, "tools", "python"))
    from rolloutd import Client
    old, new = models()
    d, ref = start(old), start(new)
    try:
        b = base(d)
        want = ids_lps(gen(base(ref)))
        npz = np.load(_files["new.npz"])
        with Client(d.url) as c:
            r = c.push_weights({k: np.ascontiguousarray(npz[k], dtype=np.float32) for k in npz.files}, 9)
            assert r.version == 9, r
        assert call(b, "/get_weight_version") == (200, {"weight_version": "9"})
        assert ids_lps(gen(b)) == want
        st, e = call(b, "/release_memory_occupation", {"tags": ["weights"]})
        assert st == 400 and "NNG push" in json.dumps(e), (st, e)
        st, e = call(b, "/release_memory_occupation", {"tags": None})
        assert st == 400, (st, e)
        assert call(b, "/release_memory_occupation", {"tags": ["kv_cache"]})[0] == 200
        assert status(b)["kv_cache"]["bytes"] == 0 and status(b)["memory"]["weights_bytes"] > 0
        assert call(b, "/resume_memory_occupation", {"tags": ["kv_cache"]})[0] == 200
        assert ids_lps(gen(b)) == want
        st, r = call(b, "/update_weights_from_disk", {"model_path": new, "weight_version": "10"}, timeout=120)
        assert st == 200, r
        assert call(b, "/release_memory_occupation", {})[0] == 200
        assert call(b, "/resume_memory_occupation", {})[0] == 200
        assert ids_lps(gen(b)) == want
    finally:
        stop_cleanly(d, ref)


def sse_texts(b, body, timeout=120):
    """The text of each event of a streamed /generate, in order."""
    req = urllib.request.Request(b + "/generate", data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    out = []
    with urllib.request.urlopen(req, timeout=timeout) as r:
        for line in r:
            line = line.decode().strip()
            if line == "data: [DONE]":
                break
            if line.startswith("data: "):
                out.append(json.loads(line[6:])["text"])
    return out


@case
def skip_special_tokens_in_streams():
    """skip_special_tokens drops control tokens' text from the answer and from every progress event of
    a stream: each event's text is a prefix of the final one, which equals the answer without streaming.
    tiny-qwen2 (build/testdata) has ChatML's control tokens in a 300-token vocabulary, so random
    weights at temperature 1 sample them now and then."""
    model = os.path.join(ROOT, os.environ.get("RD_TESTDATA", "build/testdata"), "tiny-qwen2.gguf")
    d = Daemon("--model", model, "--max-tokens", 2000)
    try:
        b = base(d)

        def body(seed, skip, stream=False):
            return {"input_ids": [1, 2, 3], "stream": stream, "sampling_params": {
                "max_new_tokens": 1000, "temperature": 1.0, "sampling_seed": seed, "ignore_eos": True,
                "skip_special_tokens": skip}}
        found = None
        for seed in range(40):
            _, plain = call(b, "/generate", body(seed, False), key="")
            _, skipped = call(b, "/generate", body(seed, True), key="")
            if plain["text"] != skipped["text"]:
                found = (seed, plain, skipped)
                break
        assert found, "no seed of 40 sampled a control token in 1000 tokens"
        seed, plain, skipped = found
        assert plain["output_ids"] == skipped["output_ids"], "the ids keep the control tokens"
        assert len(skipped["text"]) < len(plain["text"]), (plain["text"], skipped["text"])
        for skip, whole in ((True, skipped), (False, plain)):
            texts = sse_texts(b, body(seed, skip, stream=True))
            assert len(texts) >= 3, (len(texts), [len(t) for t in texts])
            bad = [t for t in texts if not whole["text"].startswith(t)]
            assert not bad, (skip, bad[:2], whole["text"])
            assert texts[-1] == whole["text"], (skip, texts[-1], whole["text"])
    finally:
        stop_cleanly(d)


if __name__ == "__main__":
    try:
        main()
    finally:
        for p in _files.values():
            if os.path.exists(p):
                os.unlink(p)
