"""The Python client against a live rolloutd: stream order, generate's
shape, abort returning partial rollouts, daemon errors surfaced with their
code, resume, status."""
import os
import sys
import time

import numpy as np

import harness
from harness import MODEL, ROOT, TMP, case, main

_n_cases = len(harness._cases)
from test_integration import Daemon  # noqa: E402
del harness._cases[_n_cases:]        # only the daemon helper: its cases run in their own file

sys.path.insert(0, os.path.join(ROOT, "tools", "python"))
from rolloutd import Client, DaemonError, Pool  # noqa: E402

_d = None


def url():
    global _d
    if _d is None:
        _d = Daemon()
    return _d.url


@case
def stream_yields_each_sample_once_in_seq_order():
    with Client(url()) as c:
        prompts = [[100 + i, 101 + i, 102 + i] for i in range(5)]
        st = c.stream(prompts, n=3, max_tokens=4, temperature=1.0, seed=11)
        got = list(st)
        assert len(got) == 15
        assert [s.seq for s in got] == sorted(s.seq for s in got), "stream must yield in completion (seq) order"
        assert len({(s.index, s.sample_idx) for s in got}) == 15
        assert {s.client_req_id for s in got} == set(st.req_ids)
        for s in got:
            assert s.token_ids.dtype == np.int32 and s.logprobs.dtype == np.float32
            assert len(s.token_ids) == len(s.logprobs) <= 4
            assert s.finish_reason in ("stop", "length") and s.n_prompt == 3
            assert np.all(s.logprobs <= 0)
            assert s.spans and s.spans[0][0] == 0 and s.spans[-1][1] == len(s.token_ids)


@case
def generate_sorted_and_text_prompts():
    with Client(url()) as c:
        out = c.generate([[100, 200, 300], "What is 1 + 1?"], n=2, max_tokens=3, temperature=0.0)
        assert [(s.index, s.sample_idx) for s in out] == [(0, 0), (0, 1), (1, 0), (1, 1)]
        assert out[0].token_ids.tolist() == out[1].token_ids.tolist(), "greedy samples agree"
        chat = c.generate(["What is 1 + 1?"], max_tokens=3, temperature=0.0, chat=True)
        assert chat[0].n_prompt > out[2].n_prompt, "the chat template adds tokens"


@case
def abort_returns_partial_rollouts():
    with Client(url()) as c:
        k = min(400, c.info.max_tokens)
        st = c.stream([[100, 101, 102], [200, 201]], n=2, max_tokens=k, temperature=1.0, seed=1, ignore_eos=True)
        time.sleep(0.5)                                # submitted by stream(): let them run a little
        n_samples = st.abort()
        rest = list(st)
        assert len(rest) == 4
        aborted = [s for s in rest if s.finish_reason == "abort"]
        assert aborted and n_samples == len(aborted), (n_samples, [s.finish_reason for s in rest])
        for s in aborted:
            assert len(s.token_ids) < k and len(s.token_ids) == len(s.logprobs)


@case
def invalid_params_raise_daemon_errors():
    with Client(url()) as c:
        vocab, ctx = c.info.vocab_size, c.info.max_context
        bad = [dict(n=0), dict(temperature=float("nan")), dict(max_tokens=ctx + 10), dict(top_p=0.0)]
        for params in bad:
            try:
                c.generate([[1, 2, 3]], **{"max_tokens": 2, **params})
                raise AssertionError(f"{params} was accepted")
            except DaemonError as e:
                assert e.code == 7 and e.name == "INVALID_PARAMS" and e.message, (params, e)
        try:
            c.generate([[1, vocab]], max_tokens=2)
            raise AssertionError("a token id >= vocab was accepted")
        except DaemonError as e:
            assert e.code == 7 and str(vocab) in str(e), e
        try:
            c.abort(10 ** 12)
            raise AssertionError("abort of an unknown request succeeded")
        except DaemonError as e:
            assert e.code == 10, e
        assert len(c.generate([[1, 2, 3]], max_tokens=2)) == 1, "the client still works after errors"


@case
def unknown_client_and_resume():
    with Client(url()) as c:
        try:
            Client(url(), client_id=0x1234567)
            raise AssertionError("resuming an unknown client id succeeded")
        except DaemonError as e:
            assert e.code == 9, e
        ok = c.resume()
        assert ok.client_id == c.client_id and ok.flags & 1


@case
def a_client_forgotten_after_client_ttl_submits_again_unless_it_lost_samples():
    """A client silent past client_ttl_s (a learner's long training step) is forgotten. With every
    result back, its next generate registers it again (a new client_id) and returns the same
    rollouts; with a sample it never fetched, SUBMIT fails as UNKNOWN_CLIENT and says one sample
    was dropped, instead of carrying on as if nothing was lost."""
    d = Daemon("--client-ttl-s", "1")
    try:
        with Client(d.url) as c:
            assert c.info.client_ttl_s == 1, c.info
            a = c.generate([[5, 6, 7]], max_tokens=4, temperature=1.0, seed=3)
            first = c.client_id
            time.sleep(3.5)          # the daemon checks once a second
            b = c.generate([[5, 6, 7]], max_tokens=4, temperature=1.0, seed=3)
            assert c.client_id != first, "the client was not forgotten: the test waited too little"
            assert [s.token_ids.tolist() for s in a] == [s.token_ids.tolist() for s in b], (a, b)
            c.submit(c.requests([[8, 9]], max_tokens=2))
            time.sleep(3.5)
            try:
                c.submit(c.requests([[8, 9]], max_tokens=2))
                raise AssertionError("a client that lost a sample was silently registered again")
            except DaemonError as e:
                assert e.code == 9 and "1 submitted samples" in e.message, e
    finally:
        d.stop()


@case
def a_forgotten_learner_still_pushes():
    """A learner silent past client_ttl_s (its training step) pushes weights and an adapter on the same
    Client and Pool: the push registers it again and goes through (a push holds nothing at the daemon before
    its BEGIN, so nothing is lost)."""
    sys.path.insert(0, os.path.join(ROOT, "tools"))
    import gen_lora
    d = Daemon("--client-ttl-s", "1")
    try:
        with Client(d.url) as c, Pool([d.url]) as pool:
            w = {"model.norm.weight": np.ones(576, dtype=np.float32)}
            first = c.client_id
            time.sleep(3.5)
            r = c.push_weights(w, 1)
            assert r.version == 1 and c.client_id != first, (r.version, c.client_id, first)
            config, tensors, dtypes = gen_lora.adapter(MODEL, rank=4, targets="attention", seed=1)
            folder = os.path.join(TMP, "test_clients_adapter")
            gen_lora.write(folder, config, tensors, dtypes)
            time.sleep(3.5)
            res = pool.push_adapter("after-ttl", folder, 1)
            assert res[0].version == 1
            assert c.generate([[5, 6, 7]], max_tokens=2, lora="after-ttl")[0].lora == "after-ttl"
    finally:
        d.stop()


@case
def status_document():
    with Client(url()) as c:
        s = c.status()
        assert s["kv_cache"]["blocks_total"] > 0 and "requests" in s and "throughput" in s


if __name__ == "__main__":
    try:
        main()
    finally:
        if _d is not None:
            _d.stop()
