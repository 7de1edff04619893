#!/usr/bin/env python3
"""Speculative decoding through the daemon under the events that move a sample around: a
preemption, an abort mid-request and a weight push during the requests. Outputs with
--spec-decode ngram must be bit-identical to it off.

A tiny f32 model (tools/gen_tiny_model.py) with a KV pool of 40 blocks, so that 16 long
samples preempt one another; two daemons, off and on, get the same requests:
- preemption: token ids, raw and processed log-probs (float32 bits), finish reasons and
  version spans equal; both daemons preempted, and the speculating one drafted and kept drafts;
- abort: a long request aborted over HTTP (/abort_request) while it runs comes back with a
  prefix (ids and log-prob bits) of the same request run to its end without speculation;
- weight push: the model's own weights pushed again as version 2 (mode continue) while the
  samples run: ids, log-probs and finish reasons equal those of the run without a push on the
  other daemon (the weights are the same), and each sample's spans tile its tokens, version 1
  then 2. Where the boundary falls depends on when the push lands, so the two daemons'
  boundaries are not compared; that a swap never splits a step's accepted drafts is
  tests/unit/test_spec.c's test_engine_version_between_steps."""
import json
import os
import subprocess
import sys
import threading
import time
import urllib.request

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import ROOT, TMP, case, main  # noqa: E402
from rdtest import Daemon, status, stop_cleanly  # noqa: E402

sys.path.insert(0, os.path.join(ROOT, "tools", "python"))
from rolloutd import Client  # noqa: E402

# 4 x 2 x 64 floats of K and V per token = 4 KiB; 40 blocks of 16 tokens.
KV_BYTES = 40 * 16 * 4096
_f, _d = {}, {}


def model():
    if not _f:
        path = os.path.join(TMP, f"spec-events-{os.getpid()}.gguf")
        subprocess.run([sys.executable, os.path.join(ROOT, "tools", "gen_tiny_model.py"), "--out", path, "--dtype",
                        "f32", "--seed", "501", "--ctx", "2048", "--layers", "4", "--dim", "256", "--ffn", "512",
                        "--hf-out", path[:-5] + ".npz"], check=True, capture_output=True)
        _f["gguf"], _f["npz"] = path, path[:-5] + ".npz"
    return _f["gguf"]


def daemons():
    if not _d:
        m = model()
        common = ("--model", m, "--kv-cache-bytes", KV_BYTES, "--max-tokens", 1500, "--max-num-seqs", 16)
        _d["off"] = Daemon(*common)
        # every running sample may speculate (the default bound, 8, leaves the preemption case few drafts);
        # drafts sized by spec_len alone: on this tiny model a row costs most of a step, so the measured
        # sizing may leave too few drafts on a loaded machine for the cases that need them
        _d["on"] = Daemon(*common, "--spec-decode", "ngram", "--spec-max-batch", 16, "--spec-draft-sizing", "fixed")
    return _d["off"], _d["on"]


def prompt(period, salt, n=24):
    base = [(salt * 37 + 11 * i) % 290 + 5 for i in range(period)]
    return [base[i % period] for i in range(n)]


PROMPTS = [prompt(3, 1), prompt(4, 2), prompt(5, 3), prompt(6, 4)]


def bits(a):
    return None if a is None else np.asarray(a, dtype=np.float32).view(np.uint32).tolist()


def key(s, spans=True):
    return (s.token_ids.tolist(), bits(s.logprobs), bits(s.logprobs_processed), s.finish_reason,
            [tuple(x) for x in s.spans] if spans else None)


def spec(d):
    return status(d)["spec_decode"]


@case
def preemption_spec_on_equals_off():
    off, on = daemons()
    got = {}
    for name, d in (("off", off), ("on", on)):
        with Client(d.url) as c:
            got[name] = c.generate(PROMPTS, n=4, max_tokens=150, temperature=1.0, seed=5, ignore_eos=True,
                                   processed_logprobs=True)
    assert len(got["off"]) == len(got["on"]) == 16
    for a, b in zip(got["off"], got["on"]):
        assert key(a) == key(b), f"prompt {a.index} sample {a.sample_idx} differs"
    pre = [status(d)["tokens"]["preemptions_total"] for d in (off, on)]
    sp = spec(on)
    assert pre[0] > 0 and pre[1] > 0, f"no preemption: {pre}"
    assert sp["accepted_tokens"] > 20 and sp["drafted_tokens"] > sp["accepted_tokens"], sp
    assert sp["draft_sizing"] == "fixed", sp  # the flag reached the engine
    print(f"preemption: 16 samples equal; preemptions off/on {pre}; {sp}", flush=True)


def http_generate(d, body, out, k):
    req = urllib.request.Request(f"http://127.0.0.1:{d.http_port}/generate", data=json.dumps(body).encode(),
                                 method="POST", headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=300) as r:
        out[k] = json.loads(r.read())


def ids_lps(o):
    return o["output_ids"], bits([t[0] for t in o["meta_info"]["output_token_logprobs"]])


@case
def abort_mid_request_is_a_prefix():
    off, on = daemons()
    body = {"input_ids": PROMPTS[1], "return_logprob": True,
            "sampling_params": {"max_new_tokens": 500, "temperature": 0.0, "ignore_eos": True, "n": 2}}
    full = {}
    http_generate(off, body, full, "ref")
    ref = full["ref"]
    assert len(ref) == 2 and all(len(o["output_ids"]) == 500 for o in ref)
    for name, d in (("off", off), ("on", on)):
        out, rid = {}, f"spec-abort-{name}"
        g0, a0 = status(d)["tokens"]["generated_total"], spec(d)["accepted_tokens"]
        t = threading.Thread(target=http_generate, args=(d, {**body, "rid": rid}, out, "r"))
        t.start()
        deadline = time.time() + 60
        while status(d)["tokens"]["generated_total"] - g0 < 150:
            assert time.time() < deadline and t.is_alive(), "the request did not get going"
            time.sleep(0.01)
        urllib.request.urlopen(urllib.request.Request(
            f"http://127.0.0.1:{d.http_port}/abort_request", data=json.dumps({"rid": rid}).encode(), method="POST",
            headers={"Content-Type": "application/json"}), timeout=10).read()
        t.join(60)
        assert "r" in out, f"{name}: no answer after the abort"
        for o, f in zip(out["r"], ref):
            assert o["meta_info"]["finish_reason"]["type"] == "abort", o["meta_info"]["finish_reason"]
            ids, lps = ids_lps(o)
            rids, rlps = ids_lps(f)
            assert 0 < len(ids) < len(rids), f"{name}: {len(ids)} tokens at the abort"
            assert ids == rids[:len(ids)] and lps == rlps[:len(ids)], f"{name}: not a prefix of the full run"
        if name == "on":
            assert spec(d)["accepted_tokens"] > a0, "the speculating daemon kept no draft before the abort"


@case
def weight_push_during_requests():
    off, on = daemons()
    params = dict(n=2, max_tokens=400, temperature=1.0, seed=9, ignore_eos=True, processed_logprobs=True)
    with Client(off.url) as c:
        ref = c.generate(PROMPTS[2:], **params)  # no push: version 1 throughout
    npz = np.load(_f["npz"])
    tensors = {k: np.ascontiguousarray(npz[k], dtype=np.float32) for k in npz.files}
    for name, d in (("off", off), ("on", on)):
        out = {}
        a0 = spec(d)["accepted_tokens"]
        g0 = status(d)["tokens"]["generated_total"]

        def run():
            with Client(d.url) as c:
                out["r"] = c.generate(PROMPTS[2:], **params)
        t = threading.Thread(target=run)
        t.start()
        deadline = time.time() + 60
        while status(d)["tokens"]["generated_total"] - g0 < 300:
            assert time.time() < deadline and t.is_alive(), "the requests did not get going"
            time.sleep(0.01)
        with Client(d.url) as c:
            r = c.push_weights(tensors, 2, mode="continue")
        t.join(120)
        assert "r" in out, f"{name}: no results"
        v = 2
        assert r.version == v, r
        for a, b in zip(ref, out["r"]):
            assert key(a, spans=False) == key(b, spans=False), f"{name}: prompt {a.index} sample {a.sample_idx}"
            sp = [tuple(x) for x in b.spans]
            assert len(sp) == 2 and sp[0][0] == 0 and sp[0][1] == sp[1][0] and sp[1][1] == len(b.token_ids) and \
                sp[0][2] < v == sp[1][2], f"{name}: spans {sp}"
        if name == "on":
            assert spec(d)["accepted_tokens"] > a0, "the speculating daemon kept no draft"


@case
def shutdown():
    stop_cleanly(*daemons())


if __name__ == "__main__":
    main()
