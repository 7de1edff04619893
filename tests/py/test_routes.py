"""Routing replay on the wire (PROTOCOL.md version 2, §4.6; README "Routing replay"): a real
build/rolloutd on loopback serving a tiny random Qwen3-MoE (tests/py/moe_model.py, 3 layers,
16 experts, top 4) and a tiny dense model, driven by the Python client, raw NNG frames, urllib
and the openai package.

- A dense model asked for routes refuses that request alone (INVALID_PARAMS naming it over NNG,
  400 naming return_routed_experts over HTTP) and keeps serving the others.
- A version-1 client sees version-1 frames, byte for byte the frames a version-2 client that does
  not ask gets but for the header's version, and cannot ask (an undefined flag bit in version 1);
  a version-2 client that asked cannot FETCH its routes in a version-1 frame.
- The MoE daemon's routes: shape [n_prompt + n_tokens - 1, layers, k], ids in range and distinct
  per layer, equal to the float64 reference's (tests/py/ref_moe.py) where its probabilities are
  not near a tie, and the same bits over NNG (uint8 on the wire), /generate
  (meta_info.routed_experts, base64 int32), /v1/completions (each choice's routed_experts, read by
  the openai package, streaming too) and prime-rl's compact form; a request that does not ask gets
  none; a result whose routes could not fit max_message_bytes is refused at admission.
Each daemon ends with SIGTERM and must exit 0."""
import base64
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import ROOT, case, main  # noqa: E402

from rdtest import Daemon, rpc, stop_cleanly  # noqa: E402

sys.path.insert(0, os.path.join(ROOT, "tools", "python"))
from rolloutd import Client, DaemonError, Pool, proto  # noqa: E402

import openai  # noqa: E402

TESTDATA = os.path.join(ROOT, os.environ.get("RD_TESTDATA", "build/testdata"))
MOE = os.path.join(TESTDATA, "tiny-moe-f32.gguf")
DENSE = os.path.join(TESTDATA, "tiny-f32.gguf")
LAYERS, K, N_EXPERTS = 3, 4, 16       # moe_model.SHAPE
PROMPT = [5, 17, 42, 99, 7]
MAX_MESSAGE = 8192                    # small, so a long request's routes cannot fit a RESULTS frame

_daemons = {}


def daemon(which):
    if which not in _daemons:
        for path in (MOE, DENSE):
            assert os.path.exists(path), f"{path} is missing: run tests/gen_testdata.sh"
        if which == "moe":
            _daemons[which] = Daemon("--max-message-bytes", MAX_MESSAGE, model=MOE)
        else:
            _daemons[which] = Daemon(model=DENSE)
    return _daemons[which]


def post(d, path, body, timeout=120):
    """(status, parsed JSON body) of a POST to d's HTTP server."""
    return d.post(path, body, timeout)


def oai(d):
    return openai.OpenAI(base_url=f"http://127.0.0.1:{d.http_port}/v1", api_key="none", max_retries=0, timeout=120)


def sglang_routes(b64):
    """SGLang's layout: base64 of little-endian int32, [prompt + completion - 1, layers, top_k]."""
    return np.frombuffer(base64.b64decode(b64), dtype="<i4").reshape(-1, LAYERS, K)


# ---- a dense model ----

@case
def dense_model_refuses_routes_and_keeps_serving():
    d = daemon("dense")
    with Client(d.url) as c:
        assert c.version == proto.VERSION and not c.info.features & proto.FEATURE_ROUTES, c.info
        try:
            c.generate([PROMPT], max_tokens=4, return_routes=True)
            raise AssertionError("a dense model returned routes")
        except DaemonError as e:
            assert e.code == proto.E.INVALID_PARAMS and "not a mixture of experts" in e.message, e
        # One SUBMIT: the request asking is refused, its neighbour runs.
        q = c.requests([PROMPT, PROMPT], max_tokens=3, temperature=0.0, return_routes=True)
        q[1].flags &= ~proto.REQ_RETURN_ROUTES
        items = c.submit(q)
        assert [it.status for it in items] == [proto.E.INVALID_PARAMS, 0], items
        got = c.fetch(wait_ms=5000)
        while not got:
            got = c.fetch(wait_ms=5000)
        assert got[0].client_req_id == q[1].client_req_id and not got[0].flags & proto.RESULT_ROUTES, got
        s = c.generate([PROMPT], max_tokens=3, temperature=0.0)
        assert len(s) == 1 and len(s[0].token_ids) >= 1 and s[0].routes is None
    st, out = post(d, "/generate", {"input_ids": PROMPT, "sampling_params": {"max_new_tokens": 3},
                                    "return_routed_experts": True})
    assert st == 400 and "return_routed_experts" in json.dumps(out) and "dense" in json.dumps(out), (st, out)
    try:
        oai(d).completions.create(model="tiny-f32", prompt=PROMPT, max_tokens=3,
                                  extra_body={"return_routed_experts": True})
        raise AssertionError("/v1/completions returned routes on a dense model")
    except openai.BadRequestError as e:
        assert "return_routed_experts" in e.body["message"], e.body
    st, out = post(d, "/generate", {"input_ids": PROMPT, "sampling_params": {"max_new_tokens": 3}})
    assert st == 200 and out["output_ids"] and "routed_experts" not in out["meta_info"], (st, out)


# ---- versions ----

def raw_hello(s, lo, hi):
    r = rpc(s, proto.Hello(min_version=lo, max_version=hi, client_name="test_routes"))
    assert isinstance(r, proto.HelloOk), r
    return r


def one_result_frame(s, cid, version):
    """The raw RESULTS frame (in `version`) holding this client's first result."""
    while True:
        s.send(proto.encode(proto.Fetch(client_id=cid, max_results=8, wait_ms=2000), version))
        f = s.recv()
        m = proto.decode(f)
        assert isinstance(m, proto.Results), m
        if m.results:
            return f, m


@case
def a_version_1_client_sees_the_bytes_it_always_did():
    d = daemon("moe")
    q = proto.Request(client_req_id=1, n=1, max_tokens=6, temperature=1.0, seed=11, flags=proto.REQ_HAS_SEED,
                      prompt_ids=PROMPT)
    with d.sock() as s1, d.sock() as s2:
        h1, h2 = raw_hello(s1, 1, 1), raw_hello(s2, 1, 2)
        assert h1.version == 1 and not h1.features & proto.FEATURE_ROUTES, h1
        assert h2.version == 2 and h2.features & proto.FEATURE_ROUTES, h2
        # Version 1 cannot ask: bit 5 is undefined there.
        ask = proto.Request(**{**q.__dict__, "client_req_id": 9, "flags": q.flags | proto.REQ_RETURN_ROUTES})
        s1.send(proto.encode(proto.Submit(client_id=h1.client_id, requests=[ask]), 1))
        ok = proto.decode(s1.recv())
        assert ok.items[0].status == proto.E.INVALID_PARAMS and "undefined bits 0x20" in ok.items[0].message, ok
        frames = []
        for s, h, v in ((s1, h1, 1), (s2, h2, 2)):
            s.send(proto.encode(proto.Submit(client_id=h.client_id, requests=[q]), v))
            r = s.recv()
            assert r[4] == v and proto.decode(r).items[0].status == 0, proto.decode(r)
            f, m = one_result_frame(s, h.client_id, v)
            assert f[4] == v and not m.results[0].flags & proto.RESULT_ROUTES, m
            frames.append(bytearray(f))
        # Equal but for the header's version and the timings (queued_us, first_token_us, total_us).
        for f in frames:
            f[16 + 24 + 56:16 + 24 + 80] = bytes(24)
        assert frames[0][:4] == frames[1][:4] and frames[0][6:] == frames[1][6:], "v1 and v2 results differ"
        # A version-2 client that asked cannot fetch its routes in a version-1 frame.
        ask.client_req_id = 2
        s2.send(proto.encode(proto.Submit(client_id=h2.client_id, requests=[ask]), 2))
        assert proto.decode(s2.recv()).items[0].status == 0
        seq = proto.decode(frames[1]).results[0].seq
        while True:
            s2.send(proto.encode(proto.Fetch(client_id=h2.client_id, ack_seq=seq, max_results=8, wait_ms=2000), 2))
            m = proto.decode(s2.recv())
            if m.results:
                break
        s2.send(proto.encode(proto.Fetch(client_id=h2.client_id, ack_seq=seq, max_results=8), 1))
        r = s2.recv()
        e = proto.decode(r)
        assert r[4] == 1 and isinstance(e, proto.Error) and e.code == proto.E.UNEXPECTED and "version 2" in e.message, e
        x = m.results[0]
        assert x.flags & proto.RESULT_ROUTES and x.routes.shape == (len(PROMPT) + len(x.token_ids) - 1, LAYERS, K)


# ---- a mixture of experts ----

def check_routes(r, n_prompt, n_tokens):
    assert r.shape == (n_prompt + n_tokens - 1, LAYERS, K), r.shape
    assert r.min() >= 0 and r.max() < N_EXPERTS, (r.min(), r.max())
    assert all(len(set(row)) == K for row in r.reshape(-1, K)), "an expert twice in one position's top-k"


def against_reference(seq, routes):
    """The engine's routes of seq (all its positions) equal the float64 reference's wherever the
    reference is not within 1e-4 of a tie: the same experts past the k-th gap, the same order past
    every gap among the top k. Returns how many (position, layer) pairs were compared."""
    import ref_moe
    res = ref_moe.forward(ref_moe.load(MOE), list(seq))
    want = res.routes.transpose(1, 0, 2)                  # [L, T, k] -> [T, L, k]
    p = -np.sort(-res.probs, axis=-1)                     # [L, T, E] descending
    gaps = (p[..., :K] - p[..., 1:K + 1]).transpose(1, 0, 2)
    compared = 0
    for t in range(want.shape[0]):
        for layer in range(LAYERS):
            g = gaps[t, layer]
            if g[K - 1] < 1e-4:
                continue                                  # the k-th and (k+1)-th nearly tie
            if g.min() >= 1e-4:
                assert (routes[t, layer] == want[t, layer]).all(), (t, layer, routes[t, layer], want[t, layer])
            else:
                assert set(routes[t, layer]) == set(want[t, layer]), (t, layer, routes[t, layer], want[t, layer])
            compared += 1
    return compared


@case
def moe_routes_over_nng_http_and_openai_agree():
    d = daemon("moe")
    params = dict(n=2, max_tokens=8, temperature=1.0, seed=5, ignore_eos=True)
    with Client(d.url) as c:
        assert c.version == proto.VERSION and c.info.features & proto.FEATURE_ROUTES and c.info.architecture == "qwen3moe"
        samples = c.generate([PROMPT, PROMPT[:2]], return_routes=True, **params)
        plain = c.generate([PROMPT], **params)
        compact = c.generate([PROMPT], return_routes="compact", **params)
    assert len(samples) == 4 and all(s.routes is None and s.routes_wire is None for s in plain)
    compared = 0
    for s in samples:
        n_prompt = len(PROMPT) if s.index == 0 else 2
        assert s.n_prompt == n_prompt and s.routes.dtype == np.int32 and s.routes_wire.dtype == np.uint8, s
        check_routes(s.routes, n_prompt, len(s.token_ids))
        seq = (PROMPT if s.index == 0 else PROMPT[:2]) + list(s.token_ids[:-1])
        compared += against_reference(seq, s.routes)
    total = sum(s.routes.shape[0] for s in samples) * LAYERS
    print(f"# routes of 4 samples: {compared} of {total} (position, layer) pairs compared with the reference",
          flush=True)
    assert compared >= 0.8 * total, f"only {compared} of {total} pairs compared"
    # the same request asking nothing samples the same tokens (routes cost bytes, not bits)
    mine = [s for s in samples if s.index == 0]
    assert [s.token_ids.tolist() for s in plain] == [s.token_ids.tolist() for s in mine]
    # prime-rl's compact form: uint8 (16 experts), shape and start, the same ids
    for s, cs in zip(mine, compact):
        rc = cs.routes
        assert set(rc) == {"data", "shape", "start", "dtype"} and rc["dtype"] == "uint8" and rc["start"] == 0, rc
        ids = np.frombuffer(base64.b64decode(rc["data"]), dtype=np.uint8).reshape(rc["shape"])
        assert (ids == s.routes).all() and s.routes_compact() == rc
    # SGLang's /generate: meta_info.routed_experts
    st, out = post(d, "/generate", {"input_ids": PROMPT, "return_routed_experts": True, "sampling_params": {
        "max_new_tokens": 8, "n": 2, "temperature": 1.0, "seed": 5, "ignore_eos": True}})
    assert st == 200 and len(out) == 2, (st, out)
    for o, s in zip(out, mine):
        assert o["output_ids"] == s.token_ids.tolist(), "HTTP and NNG sample differently"
        r = sglang_routes(o["meta_info"]["routed_experts"])
        assert r.shape[0] == o["meta_info"]["prompt_tokens"] + o["meta_info"]["completion_tokens"] - 1
        assert (r == s.routes).all(), "HTTP and NNG routes differ"
    st, out = post(d, "/generate", {"input_ids": PROMPT, "sampling_params": {"max_new_tokens": 2}})
    assert st == 200 and "routed_experts" not in out["meta_info"], out
    # OpenAI /v1/completions: each choice's routed_experts, through the openai package
    kw = dict(model="tiny-moe-f32", prompt=PROMPT, max_tokens=8, n=2, temperature=1.0, seed=5,
              extra_body={"return_routed_experts": True, "return_token_ids": True, "ignore_eos": True})
    r = oai(d).completions.create(**kw)
    for ch in r.choices:
        dump = ch.model_dump()
        s = mine[ch.index]
        assert dump["token_ids"] == s.token_ids.tolist() and (sglang_routes(dump["routed_experts"]) == s.routes).all()
    streamed = {}
    for chunk in oai(d).completions.create(stream=True, **kw):
        for ch in chunk.choices:
            ex = ch.model_dump().get("routed_experts")
            if ex is not None:
                assert ch.finish_reason is not None, "routes come with the last chunk"
                streamed[ch.index] = sglang_routes(ex)
    assert sorted(streamed) == [0, 1] and all((streamed[i] == mine[i].routes).all() for i in (0, 1))
    r = oai(d).completions.create(model="tiny-moe-f32", prompt=PROMPT, max_tokens=2)
    assert "routed_experts" not in r.choices[0].model_dump(), "routes without asking"


@case
def moe_pool_and_text_prompts_and_the_frame_limit():
    d = daemon("moe")
    with Pool([d.url]) as p:
        s = p.generate(["hello world"], max_tokens=4, temperature=0.0, return_routes=True)
        assert len(s) == 1
        check_routes(s[0].routes, s[0].n_prompt, len(s[0].token_ids))
        # Routes of up to 8 + (n_prompt + 249) x 12 bytes on top of the rest cannot fit a
        # MAX_MESSAGE-byte RESULTS frame: refused at admission, while the same request without fits.
        try:
            p.generate([PROMPT], max_tokens=250, return_routes=True)
            raise AssertionError("a result larger than max_message_bytes was admitted")
        except DaemonError as e:
            assert e.code == proto.E.INVALID_PARAMS and "routed experts" in e.message and \
                "max_message_bytes" in e.message, e
        s = p.generate([PROMPT], max_tokens=250, temperature=0.0, ignore_eos=True)
        assert len(s[0].token_ids) == 250


@case
def daemons_exit_cleanly():
    stop_cleanly(*_daemons.values())
    _daemons.clear()


if __name__ == "__main__":
    try:
        main()
    finally:
        for d in _daemons.values():
            d.kill()
