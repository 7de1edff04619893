"""Protocol version 4's sampling tail against a live rolloutd: the NNG door takes vLLM's penalties,
min_tokens and logit_bias (PROTOCOL.md §4.3) and samples exactly as the HTTP door does.

One daemon (logprobs_mode processed_logprobs, so HTTP answers the log-probs the penalties change)
serves both doors. The same seeded request with the penalties, min_tokens and a logit_bias gives
identical token ids and raw and processed log-probs through the Python Client (NNG) and through
HTTP /generate (sampling_params, sampling_seed); a logit_bias of -100 on the greedy token moves it;
1024 bias entries arrive whole (the engine thread copies them before the decoded SUBMIT is freed);
out-of-range values are INVALID_PARAMS naming the field. Versions: a client offering only 1..3
gets version 3, its default requests (frames in version 3) run as before, and a version-3 SUBMIT
with the SAMPLING bit is refused for that bit; the Client refuses non-default fields when the
negotiated version is below 4 and sends default requests without the tail. Pool passes the new
keyword arguments through. The daemon ends with SIGTERM and must exit 0."""
import json
import os
import sys
import urllib.error
import urllib.request

import numpy as np

from harness import ROOT, case, main
from rdtest import Daemon, rpc, stop_cleanly

sys.path.insert(0, os.path.join(ROOT, "tools", "python"))
from rolloutd import Client, DaemonError, Pool  # noqa: E402
from rolloutd import proto as P  # noqa: E402

PROMPT = [1, 4093, 198, 1780, 314, 216, 34, 27, 34, 47, 2, 198, 1, 520, 9531, 198]
# the penalties at strengths that change a 135M model's choices, a bias pushing some tokens and
# banning others, min_tokens masking EOS for the first 12 tokens
SAMPLING = dict(repetition_penalty=1.3, frequency_penalty=0.5, presence_penalty=0.25, min_tokens=12,
                logit_bias={"198": -100.0, "216": 2.5, "34": -3.0, "2": -1.5})
_d = []


def daemon():
    if not _d:
        _d.append(Daemon("--logprobs-mode", "processed_logprobs", timeout=120))
    return _d[0]


def http_generate(sp, prompt=PROMPT):
    body = json.dumps({"input_ids": prompt, "sampling_params": sp, "return_logprob": True}).encode()
    req = urllib.request.Request(f"http://127.0.0.1:{daemon().http_port}/generate", data=body, method="POST",
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            doc = json.loads(r.read())
    except urllib.error.HTTPError as e:
        raise AssertionError(f"/generate {e.code}: {e.read()[:500]}") from None
    docs = doc if isinstance(doc, list) else [doc]
    return [(d["output_ids"], [lp for lp, _, _ in d["meta_info"]["output_token_logprobs"]]) for d in docs]


def rpc_v(s, m, version):
    """One exchange with m encoded in protocol version `version`; the reply's bytes."""
    s.send(P.encode(m, version))
    return s.recv()


def f32_bits(values):
    return np.array(values, dtype=np.float64).astype(np.float32).view(np.uint32)


def as_http(params):
    """The Client's keyword arguments as /generate's sampling_params (SGLang's names)."""
    names = {"max_tokens": "max_new_tokens", "min_tokens": "min_new_tokens", "seed": "sampling_seed"}
    return {names.get(k, k): v for k, v in params.items() if k != "processed_logprobs"}


@case
def nng_and_http_give_the_same_tokens_and_logprobs():
    params = dict(n=3, max_tokens=24, temperature=0.8, top_p=0.95, top_k=40, seed=1234, **SAMPLING)
    with Client(daemon().url) as c:
        assert c.version == P.VERSION and c.version >= 4, c.version   # the sampling tail: version 4 and later
        got = c.generate([PROMPT], processed_logprobs=True, **params)
        plain = c.generate([PROMPT], processed_logprobs=True,
                           **{k: v for k, v in params.items() if k not in SAMPLING})
    ref = http_generate(as_http(params))
    assert len(got) == len(ref) == 3
    for s, (ids, lps) in zip(got, ref):
        assert s.token_ids.tolist() == ids, (s.sample_idx, s.token_ids.tolist(), ids)
        assert np.array_equal(s.logprobs_processed.view(np.uint32), f32_bits(lps)), s.sample_idx
        assert len(s.token_ids) >= SAMPLING["min_tokens"], "min_tokens: no stop before 12 tokens"
        assert 198 not in s.token_ids.tolist(), "a bias of -100 bans the token"
    assert [s.token_ids.tolist() for s in got] != [s.token_ids.tolist() for s in plain], \
        "the sampling tail changed nothing"
    # greedy, raw log-probs: a daemon answers raw ones on the NNG door whatever its HTTP mode
    g = dict(n=1, max_tokens=16, temperature=0.0, **SAMPLING)
    with Client(daemon().url) as c:
        a = c.generate([PROMPT], **g)[0]
        b = c.generate([PROMPT], **g)[0]
    assert a.token_ids.tolist() == b.token_ids.tolist() == http_generate(as_http(g))[0][0]
    assert np.array_equal(a.logprobs.view(np.uint32), b.logprobs.view(np.uint32))


@case
def logit_bias_moves_the_greedy_token_and_1024_entries_arrive():
    with Client(daemon().url) as c:
        first = int(c.generate([PROMPT], max_tokens=1, temperature=0.0)[0].token_ids[0])
        moved = c.generate([PROMPT], max_tokens=1, temperature=0.0, logit_bias={first: -100.0})[0]
        assert int(moved.token_ids[0]) != first
        # 1024 entries (the limit), the greedy token's ban last: every pair reached the engine. Submitted
        # while the engine thread is busy with long samples, so it takes them well after the door has
        # freed the decoded SUBMIT (et_add copies the arrays; under ASan a view would be a use after free)
        ids = [i for i in range(3000, 3000 + 1100) if i != first][:1023] + [first]
        with Client(daemon().url, name="busy") as busy:
            long = busy.stream([PROMPT, PROMPT[:5]], n=4, max_tokens=64, temperature=1.0, seed=3, ignore_eos=True)
            many = c.generate([PROMPT] * 4, max_tokens=4, temperature=0.0,
                              logit_bias={i: (-100.0 if i == first else 0.5) for i in ids})
            assert len(list(long)) == 8
        assert all(int(s.token_ids[0]) == int(moved.token_ids[0]) or int(s.token_ids[0]) in ids[:-1]
                   for s in many), [s.token_ids.tolist() for s in many]
        assert all(int(s.token_ids[0]) != first for s in many)


@case
def out_of_range_values_are_invalid_params_naming_the_field():
    with Client(daemon().url) as c:
        vocab = c.info.vocab_size
        bad = [(dict(repetition_penalty=0.0), "repetition_penalty"), (dict(repetition_penalty=float("nan")),
               "repetition_penalty"), (dict(frequency_penalty=2.5), "frequency_penalty"),
               (dict(presence_penalty=-3.0), "presence_penalty"), (dict(min_tokens=9), "min_tokens"),
               (dict(logit_bias={vocab: 1.0}), "bias_ids"), (dict(logit_bias={5: 101.0}), "bias_vals"),
               (dict(logit_bias={i: 1.0 for i in range(1025)}), "logit_bias entries")]
        for kw, name in bad:
            try:
                c.generate([PROMPT], max_tokens=8, **kw)
                raise AssertionError(f"accepted {kw}")
            except DaemonError as e:
                assert e.code == P.E.INVALID_PARAMS and name in e.message and "expected" in e.message, (kw, e)
        assert len(c.generate([PROMPT], max_tokens=2, temperature=0.0)) == 1, "the client still works"


@case
def a_version_3_client_runs_default_requests_and_is_refused_the_bit():
    d = daemon()
    with d.sock() as s:
        ok = rpc(s, P.Hello(min_version=1, max_version=3, client_name="v3-learner"))
        assert isinstance(ok, P.HelloOk) and ok.version == 3, ok
        cid = ok.client_id
        plain = P.Request(client_req_id=1, max_tokens=6, temperature=0.0, prompt_ids=PROMPT)
        flagged = P.Request(client_req_id=2, max_tokens=6, temperature=0.0, prompt_ids=PROMPT,
                            flags=P.REQ_SAMPLING)
        frame = P.encode(P.Submit(client_id=cid, requests=[plain, flagged]), 3)
        assert P.frame_version(frame) == 3
        s.send(frame)
        reply = s.recv()
        assert P.frame_version(reply) == 3, "a daemon answers a frame in its own version"
        items = P.decode(reply).items
        assert items[0].status == 0, items[0]
        assert items[1].status == P.E.INVALID_PARAMS and "undefined bits 0x40" in items[1].message and \
            "protocol version 3" in items[1].message, items[1]
        # a FETCH in version 2 cannot carry the serve tail: UNEXPECTED, naming the version to FETCH in
        got = None
        for _ in range(60):
            reply = P.decode(rpc_v(s, P.Fetch(client_id=cid, max_results=8, wait_ms=1000), 2))
            if isinstance(reply, P.Error):
                got = reply
                break
            assert isinstance(reply, P.Results) and not reply.results, reply
        assert got is not None and got.code == P.E.UNEXPECTED and "serve_dtype" in got.message and \
            "version 3" in got.message, got
        results = []
        for _ in range(60):                   # FETCH in version 3 too: its results carry the serve tail
            res = P.decode(rpc_v(s, P.Fetch(client_id=cid, max_results=8, wait_ms=1000), 3))
            assert isinstance(res, P.Results), res
            results += res.results
            if results:
                break
        assert len(results) == 1, results
        r = results[0]
        assert r.client_req_id == 1 and len(r.token_ids) > 0 and r.flags & P.RESULT_SERVE
        # the same default request in version 4 gives the same tokens
        with Client(d.url) as c:
            assert c.generate([PROMPT], max_tokens=6, temperature=0.0)[0].token_ids.tolist() == r.token_ids.tolist()
        P.decode(rpc_v(s, P.Fetch(client_id=cid, ack_seq=r.seq), 3))
        rpc(s, P.Bye(client_id=cid))


@case
def the_client_sends_the_tail_only_when_needed_and_only_to_version_4():
    with Client(daemon().url) as c:
        q = c.requests([PROMPT], max_tokens=4)[0]
        assert not q.flags & P.REQ_SAMPLING and not q.has_sampling()
        q = c.requests([PROMPT], max_tokens=4, min_tokens=2)[0]
        assert q.flags & P.REQ_SAMPLING and q.min_tokens == 2
        c.version = 3                          # as if the daemon had chosen version 3
        for kw in (dict(repetition_penalty=1.1), dict(frequency_penalty=0.1), dict(presence_penalty=-0.1),
                   dict(min_tokens=1), dict(logit_bias={5: 1.0})):
            try:
                c.generate([PROMPT], max_tokens=4, **kw)
                raise AssertionError(f"sent {kw} in version 3")
            except ValueError as e:
                assert "version 4" in str(e) and "version 3" in str(e), e
        out = c.generate([PROMPT], max_tokens=4, temperature=0.0, repetition_penalty=1.0, logit_bias={})
        assert len(out) == 1 and len(out[0].token_ids) > 0, "defaults go out as a version-3 request"


@case
def pool_passes_the_sampling_arguments():
    params = dict(n=2, max_tokens=16, temperature=0.7, seed=5, **SAMPLING)
    with Client(daemon().url) as c:
        want = [s.token_ids.tolist() for s in c.generate([PROMPT, PROMPT[:8]], **params)]
    with Pool([daemon().url]) as p:
        got = [s.token_ids.tolist() for s in p.generate([PROMPT, PROMPT[:8]], **params)]
    assert got == want


@case
def daemon_exits_cleanly():
    stop_cleanly(daemon())


if __name__ == "__main__":
    try:
        main()
    finally:
        for d in _d:
            d.stop()
