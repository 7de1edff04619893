"""LoRA adapters through the NNG door (protocol version 6): a SUBMIT request names the adapter its samples run
under (flag LORA, the lora tail) and each result says which adapter and version produced it (RESULT_LORA,
PROTOCOL.md §4.3, §4.6), on the default model with a random rank-8 attention adapter from tools/gen_lora.py
loaded over HTTP (POST /v1/load_lora_adapter).

- Both doors agree: greedy samples under the adapter through Client.generate(lora=...) have the tokens and
  the float32 bits of the log-probs of /generate with lora_path, and differ from the base model's; results
  carry the adapter's name and version 1; a batch mixing adapter and base prompts gives each its own; a
  reload in place (load_inplace) gives version 2; Pool runs under the adapter as the Client does.
- A name the daemon has not loaded (never, or unloaded since) is that request's INVALID_PARAMS naming the
  adapter, beside accepted requests of the same SUBMIT; a malformed lora tail is an ERROR; the daemon keeps
  serving.
- A version-5 client works as before: HELLO offering 1..5 gets version 5, its requests run with the bytes and
  results of version 5, the LORA bit is refused as undefined there, the Client refuses lora= before sending,
  and a version-5 FETCH of a result produced under an adapter is UNEXPECTED (FETCH it in version 6).
The daemon ends with SIGTERM and must exit 0."""
import json
import os
import shutil
import struct
import sys
import urllib.error
import urllib.request

import numpy as np

from harness import MODEL, ROOT, TMP, case, main
from rdtest import Daemon, rpc, stop_cleanly

sys.path.insert(0, os.path.join(ROOT, "tools", "python"))
sys.path.insert(0, os.path.join(ROOT, "tools"))
import gen_lora  # noqa: E402
from rolloutd import Client, DaemonError, Pool  # noqa: E402
from rolloutd import proto as P  # noqa: E402

WORK = os.path.join(TMP, "test_nng_lora")
PROMPT = [1, 504, 3458, 282, 260, 2723, 15141, 314, 4250, 3028, 30]
NAME = "nng-math"
_d = []
_paths = {}


def daemon():
    if not _d:
        _d.append(Daemon(model=MODEL, timeout=120))
    return _d[0]


def adapter_path(seed):
    """A rank-8 attention adapter in PEFT's format for the default model (written once per seed)."""
    if seed not in _paths:
        out = os.path.join(WORK, f"attn-{seed}")
        shutil.rmtree(out, ignore_errors=True)
        config, tensors, dtypes = gen_lora.adapter(MODEL, rank=8, targets="attention", seed=seed)
        gen_lora.write(out, config, tensors, dtypes)
        _paths[seed] = out
    return _paths[seed]


def post_text(path, obj):
    """(status, text) of a JSON POST: vLLM's adapter routes answer text."""
    req = urllib.request.Request(f"http://127.0.0.1:{daemon().http_port}{path}", data=json.dumps(obj).encode(),
                                 method="POST", headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def load(name, seed=1, inplace=False):
    body = {"lora_name": name, "lora_path": adapter_path(seed)}
    if inplace:
        body["load_inplace"] = True
    st, text = post_text("/v1/load_lora_adapter", body)
    assert st == 200, (st, text)


def loaded():
    """The adapter NAME, loaded once (version 1 until a test reloads it)."""
    if not getattr(loaded, "done", False):
        load(NAME)
        loaded.done = True


def bits(values):
    return np.array(values, dtype=np.float64).astype(np.float32).view(np.uint32)


def http_greedy(lora=None, n=12):
    """/generate greedy with lora_path: (token ids, log-prob bits)."""
    body = {"input_ids": PROMPT, "return_logprob": True,
            "sampling_params": {"max_new_tokens": n, "temperature": 0, "ignore_eos": True}}
    if lora is not None:
        body["lora_path"] = lora
    st, doc = daemon().post("/generate", body)
    assert st == 200, (st, doc)
    lp = doc["meta_info"]["output_token_logprobs"]
    return [x[1] for x in lp], bits([x[0] for x in lp])


def nng_greedy(c, lora=None, n=12, prompts=1):
    return c.generate([PROMPT] * prompts, max_tokens=n, temperature=0.0, ignore_eos=True, lora=lora)


@case
def nng_adapter_samples_equal_http_lora_path():
    loaded()
    with Client(daemon().url) as c:
        assert c.version == P.VERSION == 6 and c.info.version == 6, (c.version, c.info.version)
        s, = nng_greedy(c, NAME)
        ids, lps = http_greedy(NAME)
        assert s.token_ids.tolist() == ids, (s.token_ids.tolist(), ids)
        assert np.array_equal(s.logprobs.view(np.uint32), lps), "NNG and HTTP log-probs differ under the adapter"
        assert s.lora == NAME and s.lora_version == 1, (s.lora, s.lora_version)
        base, = nng_greedy(c)
        b_ids, b_lps = http_greedy()
        assert base.token_ids.tolist() == b_ids and np.array_equal(base.logprobs.view(np.uint32), b_lps)
        assert base.lora is None and base.lora_version == 0, (base.lora, base.lora_version)
        assert not np.array_equal(base.logprobs.view(np.uint32), lps), "the adapter changes nothing"
        # one call mixing adapter and base prompts: each its own rows, the same bits as alone
        a, b = c.generate([PROMPT, PROMPT], max_tokens=12, temperature=0.0, ignore_eos=True, lora=[NAME, None])
        assert a.lora == NAME and b.lora is None
        assert np.array_equal(a.logprobs.view(np.uint32), lps) and np.array_equal(b.logprobs.view(np.uint32), b_lps)
        # sampled, n = 3, seeded: every sample says the adapter; the same seed gives the same samples again
        first = c.generate([PROMPT], n=3, max_tokens=8, temperature=1.0, seed=5, lora=NAME)
        again = c.generate([PROMPT], n=3, max_tokens=8, temperature=1.0, seed=5, lora=NAME)
        assert all(x.lora == NAME and x.lora_version == 1 for x in first + again)
        assert [x.token_ids.tolist() for x in first] == [x.token_ids.tolist() for x in again]
    # on the wire: the result's flag and tail in a version-6 frame
    with daemon().sock() as s:
        ok = rpc(s, P.Hello(min_version=1, max_version=6, client_name="raw"))
        assert ok.version == 6, ok
        sub = rpc(s, P.encode(P.Submit(client_id=ok.client_id, requests=[
            P.Request(client_req_id=1, max_tokens=4, temperature=0.0, flags=P.REQ_LORA, lora=NAME,
                      prompt_ids=PROMPT)]), 6))
        assert sub.items[0].status == 0, sub.items[0]
        x = fetch_one(s, ok.client_id, 6)
        assert x.flags & P.RESULT_LORA and x.lora == NAME and x.lora_version == 1, (x.flags, x.lora)
        assert x.token_ids.tolist() == ids[:4]
        s.send(P.encode(P.Fetch(client_id=ok.client_id, ack_seq=x.seq), 6))
        s.recv()
        rpc(s, P.Bye(client_id=ok.client_id))


def fetch_one(s, cid, version):
    for _ in range(120):
        s.send(P.encode(P.Fetch(client_id=cid, max_results=8, wait_ms=1000), version))
        reply = s.recv()
        assert P.frame_version(reply) == version, "a daemon answers a frame in its own version"
        res = P.decode(reply)
        assert isinstance(res, P.Results), res
        if res.results:
            x, = res.results
            return x
    raise AssertionError("no result")


@case
def a_reload_in_place_is_version_2():
    loaded()
    load("nng-reload", seed=2)
    with Client(daemon().url) as c:
        one, = nng_greedy(c, "nng-reload", n=6)
        assert one.lora == "nng-reload" and one.lora_version == 1
        load("nng-reload", seed=3, inplace=True)
        two, = nng_greedy(c, "nng-reload", n=6)
        assert two.lora == "nng-reload" and two.lora_version == 2, (two.lora, two.lora_version)
        assert not np.array_equal(one.logprobs.view(np.uint32), two.logprobs.view(np.uint32)), "the same weights"


@case
def an_adapter_not_loaded_is_invalid_params():
    loaded()
    with Client(daemon().url) as c:
        try:
            nng_greedy(c, "never-loaded")
            raise AssertionError("an unknown adapter accepted")
        except DaemonError as e:
            assert e.code == P.E.INVALID_PARAMS and "'never-loaded'" in e.message and "not loaded" in e.message \
                and "expected" in e.message, e
        # one SUBMIT: the request under a known adapter and the base one are accepted, the other refused alone
        ok, bad, base = c.requests([PROMPT] * 3, max_tokens=4, temperature=0.0, lora=[NAME, "nope", None])
        items = c.submit([ok, bad, base])
        assert [it.status for it in items] == [0, P.E.INVALID_PARAMS, 0], items
        assert items[1].message.startswith(f"request {bad.client_req_id}: LoRA adapter 'nope' is not loaded"), items[1]
        got = []
        while len(got) < 2:
            got += c.fetch()
        assert sorted((r.client_req_id, r.lora) for r in got) == [(ok.client_req_id, NAME), (base.client_req_id, "")]
        # loaded, then unloaded: refused again
        load("nng-gone", seed=4)
        assert nng_greedy(c, "nng-gone", n=2)[0].lora == "nng-gone"
        st, text = post_text("/v1/unload_lora_adapter", {"lora_name": "nng-gone"})
        assert st == 200, (st, text)
        try:
            nng_greedy(c, "nng-gone", n=2)
            raise AssertionError("an unloaded adapter accepted")
        except DaemonError as e:
            assert e.code == P.E.INVALID_PARAMS and "'nng-gone'" in e.message, e
        # a name too long never leaves the client
        try:
            nng_greedy(c, "x" * 128)
            raise AssertionError("a 128-byte name sent")
        except ValueError as e:
            assert "expected 1..127" in str(e), e
    # a malformed lora tail (cut inside the name) is an ERROR for the whole SUBMIT
    with daemon().sock() as s:
        ok = rpc(s, P.Hello(min_version=1, max_version=6, client_name="raw"))
        frame = P.encode(P.Submit(client_id=ok.client_id, requests=[
            P.Request(client_req_id=1, max_tokens=4, flags=P.REQ_LORA, lora=NAME, prompt_ids=PROMPT)]), 6)
        err = rpc(s, frame[:8] + struct.pack("<I", len(frame) - 18) + frame[12:-2])
        assert isinstance(err, P.Error) and err.code == P.E.MALFORMED and "lora_name" in err.message, err
        rpc(s, P.Bye(client_id=ok.client_id))
    with Client(daemon().url) as c:
        assert len(nng_greedy(c, NAME, n=2)[0].token_ids) == 2, "the daemon still serves"


@case
def a_version_5_client_runs_as_before():
    loaded()
    d = daemon()
    with Client(d.url) as c6:
        want = nng_greedy(c6, n=6)[0].token_ids.tolist()
    with Client(d.url, max_version=5) as c:
        assert c.version == 5 and c.info.version == 5, c.version
        s, = nng_greedy(c, n=6)
        assert s.token_ids.tolist() == want and s.lora is None
        try:
            nng_greedy(c, NAME)
            raise AssertionError("lora= sent in version 5")
        except ValueError as e:
            assert "version 6" in str(e) and "version 5" in str(e), e
    with d.sock() as s:
        ok = rpc(s, P.Hello(min_version=1, max_version=5, client_name="v5-learner"))
        assert isinstance(ok, P.HelloOk) and ok.version == 5, ok
        cid = ok.client_id
        plain = P.Request(client_req_id=1, max_tokens=6, temperature=0.0, prompt_ids=PROMPT)
        flagged = P.Request(client_req_id=2, max_tokens=6, temperature=0.0, prompt_ids=PROMPT, flags=P.REQ_LORA)
        frame = P.encode(P.Submit(client_id=cid, requests=[plain, flagged]), 5)
        s.send(frame)
        reply = s.recv()
        assert P.frame_version(reply) == 5
        items = P.decode(reply).items
        assert items[0].status == 0, items[0]
        assert items[1].status == P.E.INVALID_PARAMS and "undefined bits 0x100" in items[1].message and \
            "protocol version 5" in items[1].message, items[1]
        r = fetch_one(s, cid, 5)
        assert r.client_req_id == 1 and r.token_ids.tolist() == want and r.flags == P.RESULT_SERVE, r.flags
        s.send(P.encode(P.Fetch(client_id=cid, ack_seq=r.seq), 5))
        P.decode(s.recv())
        rpc(s, P.Bye(client_id=cid))
    # a client of version 6 that FETCHes its adapter's result in a version-5 frame is told to use version 6
    with d.sock() as s:
        ok = rpc(s, P.Hello(min_version=1, max_version=6, client_name="mixed"))
        cid = ok.client_id
        sub = rpc(s, P.encode(P.Submit(client_id=cid, requests=[
            P.Request(client_req_id=1, max_tokens=2, flags=P.REQ_LORA, lora=NAME, prompt_ids=PROMPT)]), 6))
        assert sub.items[0].status == 0, sub
        got = None
        for _ in range(60):
            s.send(P.encode(P.Fetch(client_id=cid, max_results=8, wait_ms=1000), 5))
            reply = P.decode(s.recv())
            if isinstance(reply, P.Error):
                got = reply
                break
        assert got is not None and got.code == P.E.UNEXPECTED and "LoRA adapter" in got.message and \
            "version 6" in got.message, got
        x = fetch_one(s, cid, 6)
        assert x.lora == NAME and x.lora_version == 1
        s.send(P.encode(P.Fetch(client_id=cid, ack_seq=x.seq), 6))
        s.recv()
        rpc(s, P.Bye(client_id=cid))


@case
def pool_runs_under_an_adapter():
    loaded()
    with Client(daemon().url) as c:
        want = nng_greedy(c, NAME, n=6)[0]
    with Pool([daemon().url, daemon().url]) as p:
        got = p.generate([PROMPT, PROMPT, PROMPT], max_tokens=6, temperature=0.0, ignore_eos=True,
                         lora=[NAME, None, NAME])
    assert [s.lora for s in got] == [NAME, None, NAME]
    for s in (got[0], got[2]):
        assert s.token_ids.tolist() == want.token_ids.tolist() and s.lora_version == 1
        assert np.array_equal(s.logprobs.view(np.uint32), want.logprobs.view(np.uint32))


@case
def daemon_exits_cleanly():
    stop_cleanly(daemon())


if __name__ == "__main__":
    try:
        main()
    finally:
        for d in _d:
            d.stop()
