"""Prompt scoring through the NNG door (issue 45, protocol version 5): a SUBMIT request scores its prompt
from score_from on (flag SCORE, the score tail; max_tokens 0 scores only) and each result carries the
prompt's raw log-probs and their alternatives (RESULT_SCORES, PROTOCOL.md §4.3, §4.6).

- Rescoring is exact: seeded rollouts through Client.generate (greedy, T=1, top-p 0.9 with n = 4) scored
  by Client.score as prompt + completion from the completion's first position give, at every completion
  position, the float32 bits of the completion's sampled log-probs, and its alternatives; the same while
  another client keeps the engine busy.
- Both doors agree: NNG scores equal /generate's meta_info.input_token_logprobs and input_top_logprobs
  bit for bit on the same daemon and prompt (from 0 and from a later position); compute_logprobs is
  tinker's form of the same; generate(prompt_logprobs_from=...) scores and generates in one request,
  the same tokens as without it and the same scores as score().
- Refusals (score_from past the prompt or negative, a text prompt's past its tokens, max_tokens 0
  without scoring, n 2 with max_tokens 0, a malformed score tail) are errors naming what was wrong, and
  the daemon keeps serving. A version-4 client works as before: its default requests run, the SCORE bit
  is refused as undefined in version 4, a version-4 FETCH of a scored result is UNEXPECTED (FETCH it in
  version 5). Pool scores as the Client does. The daemon ends with SIGTERM and must exit 0."""
import os
import sys

import numpy as np

from harness import ROOT, case, main
from rdtest import Daemon, rpc, stop_cleanly

sys.path.insert(0, os.path.join(ROOT, "tools", "python"))
from rolloutd import Client, DaemonError, Pool, VersionMismatch  # noqa: E402
from rolloutd import proto as P  # noqa: E402

TEXT = "The history of the printing press in Europe began"
_d = []


def daemon():
    if not _d:
        _d.append(Daemon(timeout=120))
    return _d[0]


def ids_of(text):
    st, doc = daemon().post("/tokenize", {"prompt": text})
    assert st == 200, doc
    return doc["tokens"]


def bits(values):
    """float32 bit patterns of a list of log-probs (None, position 0's, as NaN)."""
    return np.array([np.nan if v is None else v for v in values], dtype=np.float64).astype(np.float32).view(np.uint32)


def rollouts(c, ids):
    """Seeded rollouts with 2 alternatives per token: greedy, T=1, top-p 0.9 with n = 4 (6 samples)."""
    out = []
    for kw in (dict(temperature=0.0), dict(temperature=1.0, seed=3), dict(temperature=0.8, top_p=0.9, seed=4, n=4)):
        out += c.generate([ids], max_tokens=24, ignore_eos=True, logprobs=2, **kw)
    assert len(out) == 6 and all(len(s.token_ids) == 24 for s in out)
    return out


def check_rescored(c, ids, rs):
    full = [ids + s.token_ids.tolist() for s in rs]
    got = c.score(full, start=len(ids), top_logprobs=2, version=c.info.weight_version)
    for s, (lps, alts) in zip(rs, got):
        assert len(lps) == len(s.token_ids)
        assert np.array_equal(bits(lps), s.logprobs.view(np.uint32)), "log-probs differ from the sampled ones"
        for i, alt in enumerate(alts):
            want = [(int(t), float(v)) for t, v in zip(s.top_ids[i], s.top_logprobs[i]) if t >= 0]
            assert [t for t, _ in alt] == [t for t, _ in want], (i, alt, want)
            assert np.array_equal(bits([v for _, v in alt]), bits([v for _, v in want])), (i, alt, want)


@case
def rescoring_over_nng_gives_the_sampled_bits():
    ids = ids_of(TEXT)
    with Client(daemon().url) as c:
        assert c.version == P.VERSION and c.version >= 5, c.version   # prompt scoring: version 5 and later
        rs = rollouts(c, ids)
        check_rescored(c, ids, rs)
        # the same while another client keeps the engine busy with long samples
        with Client(daemon().url, name="busy") as busy:
            long = busy.stream([ids, ids[:5]], n=3, max_tokens=48, temperature=1.0, seed=8, ignore_eos=True)
            check_rescored(c, ids, rs)
            assert len(list(long)) == 6
        # a weight version the daemon does not serve: the scores come back, the guard refuses them
        try:
            c.score([ids], version=c.info.weight_version + 1)
            raise AssertionError("scores of another weight version accepted")
        except VersionMismatch as e:
            assert e.got == {c.info.weight_version}, e


def http_scores(ids, start, top):
    st, doc = daemon().post("/generate", {"input_ids": ids, "return_logprob": True, "logprob_start_len": start,
                                          "top_logprobs_num": top, "sampling_params": {"max_new_tokens": 0}})
    assert st == 200, doc
    mi = doc["meta_info"]
    return mi["input_token_logprobs"], mi.get("input_top_logprobs")


@case
def nng_scores_equal_http_input_token_logprobs():
    ids = ids_of(TEXT + " in the fifteenth century, when Johannes Gutenberg combined movable type")
    with Client(daemon().url) as c:
        for start in (0, 7):
            (lps, alts), = c.score([ids], start=start, top_logprobs=3)
            h_lps, h_tops = http_scores(ids, start, 3)
            assert len(lps) == len(h_lps) == len(ids) - start
            assert [t[1] for t in h_lps] == ids[start:]
            assert np.array_equal(bits(lps), bits([t[0] for t in h_lps])), start
            for a, h in zip(alts, h_tops):
                assert (a is None) == (h is None), (a, h)
                if a is not None:
                    assert [t for t, _ in a] == [t[1] for t in h]
                    assert np.array_equal(bits([v for _, v in a]), bits([t[0] for t in h]))
            if start == 0:
                assert lps[0] is None and alts[0] is None, "position 0 has nothing before it"
        # tinker's form: one entry per token, the first None; the same floats as score()
        full, = c.compute_logprobs([ids])
        assert len(full) == len(ids) and full[0] is None
        assert np.array_equal(bits(full), bits(c.score([ids])[0]))
        # a text prompt is scored after the daemon tokenizes it
        text, = c.score([TEXT], start=1)
        assert np.array_equal(bits(text), bits(c.score([ids_of(TEXT)], start=1)[0]))


@case
def top_k_alternatives_are_the_most_likely_tokens():
    ids = ids_of(TEXT)
    with Client(daemon().url) as c:
        (lps, alts), = c.score([ids], top_logprobs=5)
        for p in range(1, len(ids)):
            a = alts[p]
            assert len(a) == 5 and all(a[i][1] >= a[i + 1][1] for i in range(4)), a
            assert lps[p] <= a[0][1], (p, lps[p], a)
            hit = [v for t, v in a if t == ids[p]]
            assert not hit or np.float32(hit[0]).view(np.uint32) == np.float32(lps[p]).view(np.uint32), (p, hit)
            assert lps[p] < a[-1][1] or hit, "a token more likely than the 5th alternative is among them"


@case
def generate_scores_the_prompt_in_the_same_request():
    ids = ids_of(TEXT)
    with Client(daemon().url) as c:
        plain = c.generate([ids], n=2, max_tokens=8, temperature=0.7, seed=11)
        both = c.generate([ids], n=2, max_tokens=8, temperature=0.7, seed=11, logprobs=2, prompt_logprobs_from=2)
        (lps, alts), = c.score([ids], start=2, top_logprobs=2)
        for p, s in zip(plain, both):
            assert s.token_ids.tolist() == p.token_ids.tolist(), "scoring the prompt changed the sample"
            assert np.array_equal(s.logprobs.view(np.uint32), p.logprobs.view(np.uint32))
            assert s.prompt_logprobs_from == 2 and np.array_equal(s.prompt_logprobs.view(np.uint32), bits(lps))
            assert s.prompt_top_ids.shape == (len(ids) - 2, 2)
            assert [[int(t) for t in row] for row in s.prompt_top_ids] == [[t for t, _ in a] for a in alts]
        # from the prompt's end: nothing to score, the rollout as usual
        s, = c.generate([ids], max_tokens=4, temperature=0.0, prompt_logprobs_from=len(ids))
        assert s.prompt_logprobs is not None and len(s.prompt_logprobs) == 0 and len(s.token_ids) == 4
        assert c.score([ids], start=len(ids)) == [[]]


@case
def refusals_are_errors_and_the_daemon_keeps_serving():
    ids = ids_of(TEXT)
    with Client(daemon().url) as c:
        bad = [(lambda: c.score([ids], start=len(ids) + 1), f"score_from = {len(ids) + 1}; expected 0..{len(ids)}"),
               (lambda: c.score([ids], start=-1), "score_from = -1"),
               (lambda: c.score([TEXT], start=100), f"score_from = 100; expected 0..{len(ids)}"),
               (lambda: c.generate([ids], max_tokens=0), "max_tokens = 0; expected 1.."),
               (lambda: c.generate([ids], max_tokens=0, n=2, prompt_logprobs_from=0), "n = 2 with max_tokens = 0")]
        for fn, words in bad:
            try:
                fn()
                raise AssertionError(f"accepted; expected {words}")
            except DaemonError as e:
                assert e.code == P.E.INVALID_PARAMS and words in e.message and "expected" in e.message, (words, e)
        # a malformed score tail (cut in half) is an ERROR reply for the whole SUBMIT
        with daemon().sock() as s:
            ok = rpc(s, P.Hello(min_version=1, max_version=5, client_name="raw"))
            frame = P.encode(P.Submit(client_id=ok.client_id, requests=[
                P.Request(client_req_id=1, max_tokens=0, flags=P.REQ_SCORE, prompt_ids=ids)]), 5)
            err = rpc(s, frame[:8] + (len(frame) - 18).to_bytes(4, "little") + frame[12:-2])
            assert isinstance(err, P.Error) and err.code == P.E.MALFORMED and "score_from" in err.message, err
            rpc(s, P.Bye(client_id=ok.client_id))
        (lps, _), = c.score([ids], start=1, top_logprobs=1)
        assert len(lps) == len(ids) - 1, "the daemon still scores"
        c.version = 4                   # as if the daemon had chosen version 4
        try:
            c.score([ids])
            raise AssertionError("scored in version 4")
        except ValueError as e:
            assert "version 5" in str(e) and "version 4" in str(e), e


@case
def a_version_4_client_runs_as_before():
    ids = ids_of(TEXT)
    d = daemon()
    with d.sock() as s:
        ok = rpc(s, P.Hello(min_version=1, max_version=4, client_name="v4-learner"))
        assert isinstance(ok, P.HelloOk) and ok.version == 4, ok
        cid = ok.client_id
        plain = P.Request(client_req_id=1, max_tokens=6, temperature=0.0, prompt_ids=ids)
        flagged = P.Request(client_req_id=2, max_tokens=6, temperature=0.0, prompt_ids=ids, flags=P.REQ_SCORE)
        zero = P.Request(client_req_id=3, max_tokens=0, temperature=0.0, prompt_ids=ids)
        frame = P.encode(P.Submit(client_id=cid, requests=[plain, flagged, zero]), 4)
        s.send(frame)
        reply = s.recv()
        assert P.frame_version(reply) == 4, "a daemon answers a frame in its own version"
        items = P.decode(reply).items
        assert items[0].status == 0, items[0]
        assert items[1].status == P.E.INVALID_PARAMS and "undefined bits 0x80" in items[1].message and \
            "protocol version 4" in items[1].message, items[1]
        assert items[2].status == P.E.INVALID_PARAMS and "max_tokens = 0; expected 1.." in items[2].message, items[2]
        results = []
        for _ in range(60):
            s.send(P.encode(P.Fetch(client_id=cid, max_results=8, wait_ms=1000), 4))
            reply = s.recv()
            assert P.frame_version(reply) == 4
            results += P.decode(reply).results
            if results:
                break
        r, = results
        assert r.client_req_id == 1 and len(r.token_ids) == 6 and r.flags == P.RESULT_SERVE, r.flags
        with Client(d.url) as c:
            assert c.generate([ids], max_tokens=6, temperature=0.0)[0].token_ids.tolist() == r.token_ids.tolist()
        s.send(P.encode(P.Fetch(client_id=cid, ack_seq=r.seq), 4))
        P.decode(s.recv())
        rpc(s, P.Bye(client_id=cid))
    # a client of version 5 that FETCHes its scored result in a version-4 frame is told to use version 5
    with d.sock() as s:
        ok = rpc(s, P.Hello(min_version=1, max_version=5, client_name="mixed"))
        assert ok.version == 5
        cid = ok.client_id
        sub = rpc(s, P.encode(P.Submit(client_id=cid, requests=[
            P.Request(client_req_id=1, max_tokens=0, flags=P.REQ_SCORE, score_from=1, prompt_ids=ids)]), 5))
        assert isinstance(sub, P.SubmitOk) and sub.items[0].status == 0, sub
        got = None
        for _ in range(60):
            s.send(P.encode(P.Fetch(client_id=cid, max_results=8, wait_ms=1000), 4))
            reply = P.decode(s.recv())
            if isinstance(reply, P.Error):
                got = reply
                break
        assert got is not None and got.code == P.E.UNEXPECTED and "prompt's scores" in got.message and \
            "version 5" in got.message, got
        res = rpc(s, P.encode(P.Fetch(client_id=cid, max_results=8, wait_ms=1000), 5))
        x, = res.results
        assert x.flags & P.RESULT_SCORES and x.score_from == 1 and len(x.prompt_logprobs) == len(ids) - 1
        assert len(x.token_ids) == 0 and x.finish == P.FINISH_LENGTH
        s.send(P.encode(P.Fetch(client_id=cid, ack_seq=x.seq), 5))
        s.recv()
        rpc(s, P.Bye(client_id=cid))


@case
def pool_scores_as_the_client_does():
    prompts = [ids_of(TEXT), ids_of("Once upon a time, in a land far away"), ids_of("def f(x):\n    return")]
    starts = [1, 3, 0]
    with Client(daemon().url) as c:
        want = c.score(prompts, start=starts, top_logprobs=2)
        want_full = c.compute_logprobs(prompts)
    with Pool([daemon().url, daemon().url]) as p:
        got = p.score(prompts, start=starts, top_logprobs=2)
        assert p.compute_logprobs(prompts) == want_full
    assert [len(lps) for lps, _ in got] == [len(q) - k for q, k in zip(prompts, starts)]
    for (a, x), (b, y) in zip(got, want):
        assert np.array_equal(bits(a), bits(b)) and x == y


@case
def daemon_exits_cleanly():
    stop_cleanly(daemon())


if __name__ == "__main__":
    try:
        main()
    finally:
        for d in _d:
            d.stop()
