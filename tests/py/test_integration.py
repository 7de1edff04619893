"""Integration: a real rolloutd on free loopback ports, driven by the real
clients (the Python package, build/rolloutctl), compared with the offline
engine (build/rollout-gen)."""
import json
import os
import sys
import threading
import time

import numpy as np

from harness import BUILD, MODEL, ROOT, case, main, run
from rdtest import Daemon

sys.path.insert(0, os.path.join(ROOT, "tools", "python"))
from rolloutd import Client  # noqa: E402

GEN = os.path.join(BUILD, "rollout-gen")
CTL = os.path.join(BUILD, "rolloutctl")


_daemon = None


def daemon():
    global _daemon
    if _daemon is None:
        _daemon = Daemon(timeout=120)
    return _daemon


def offline(args):
    """rollout-gen --json lines, parsed."""
    p = run([GEN, "--model", MODEL, *args, "--json"])
    return [json.loads(line) for line in p.stdout.splitlines() if line.strip()]


def f32_bits(values):
    return np.array(values, dtype=np.float64).astype(np.float32).view(np.uint32)


def same_as_offline(prompt_ids, gen_args, **params):
    ref = offline(["--prompt-ids", ",".join(map(str, prompt_ids)), *gen_args])
    with Client(daemon().url) as c:
        got = c.generate([prompt_ids], **params)
    assert len(got) == len(ref), (len(got), len(ref))
    for s, r in zip(got, sorted(ref, key=lambda x: x["sample"])):
        assert s.sample_idx == r["sample"]
        assert s.token_ids.tolist() == r["token_ids"], (s.sample_idx, s.token_ids.tolist(), r["token_ids"])
        assert np.array_equal(s.logprobs.view(np.uint32), f32_bits(r["logprobs"])), s.sample_idx
        assert s.finish_reason == r["finish_reason"]
        assert s.n_prompt == len(prompt_ids)
    return got


PROMPT = [1, 4093, 198, 1780, 314, 216, 34, 27, 34, 47, 2, 198, 1, 520, 9531, 198]


@case
def bit_identical_greedy():
    same_as_offline(PROMPT, ["--temperature", "0", "--max-tokens", "24"], temperature=0.0, max_tokens=24)


@case
def bit_identical_seeded_n4():
    got = same_as_offline(PROMPT, ["--temperature", "0.8", "--top-p", "0.95", "--seed", "7", "-n", "4",
                                   "--max-tokens", "24"],
                          temperature=0.8, top_p=0.95, seed=7, n=4, max_tokens=24)
    assert len({tuple(s.token_ids.tolist()) for s in got}) > 1, "the 4 seeded samples should differ"
    assert all(s.seed == 7 for s in got)


@case
def four_clients_x_200_requests_exactly_once():
    d = daemon()
    n_clients, n_req = 4, 200
    errors, seen = [], {}

    def one(k):
        try:
            rng = np.random.default_rng(k)
            with Client(d.url, name=f"load-{k}") as c:
                prompts = [rng.integers(100, 40000, size=int(rng.integers(1, 12))).tolist() for _ in range(n_req)]
                reqs = []
                for p in prompts:
                    reqs += c.requests([p], n=1, max_tokens=int(rng.integers(1, 5)), temperature=1.0, seed=k)
                mine = {q.client_req_id for q in reqs}
                got = {}
                nxt = 0
                per = c.info.max_requests_per_submit or 64
                t0 = time.time()
                while len(got) < n_req:
                    assert time.time() - t0 < 240, f"client {k}: {len(got)}/{n_req} after 240 s"
                    if nxt < n_req:
                        items = c.submit(reqs[nxt:nxt + per])
                        for it in items:
                            if it.status == 0:
                                nxt += 1
                            else:
                                assert it.status == 8, (it.status, it.message)   # BUSY: retry later
                                break
                    for r in c.fetch(wait_ms=200):
                        assert r.client_req_id in mine, f"client {k} got request {r.client_req_id} it did not submit"
                        key = (r.client_req_id, r.sample_idx)
                        assert key not in got, f"client {k}: {key} delivered twice"
                        got[key] = r.seq
                seqs = sorted(got.values())
                assert seqs == list(range(1, n_req + 1)), f"client {k}: seqs not 1..{n_req} without gaps"
                assert c.fetch(wait_ms=100) == [], "results after the last one"
                seen[k] = len(got)
        except Exception as e:   # reported by the main thread
            errors.append(f"client {k}: {e!r}")

    th = [threading.Thread(target=one, args=(k,)) for k in range(n_clients)]
    for t in th:
        t.start()
    for t in th:
        t.join()
    assert not errors, errors
    assert seen == {k: n_req for k in range(n_clients)}, seen


@case
def reconnect_gets_undelivered_results_once():
    d = daemon()
    a = Client(d.url, name="dropper")
    prompts = [[100 + i, 200 + i, 300 + i] for i in range(6)]
    reqs = a.requests(prompts, n=2, max_tokens=16, temperature=1.0, seed=3, ignore_eos=True)
    assert all(it.status == 0 for it in a.submit(reqs))
    processed = {}
    t0 = time.time()
    while not processed and time.time() - t0 < 60:     # take part of the results, ack none
        for r in a.fetch(max_results=3, wait_ms=500):
            processed[(r.client_req_id, r.sample_idx)] = r.token_ids.tolist()
    assert 0 < len(processed) < 12, len(processed)
    cid, last = a.client_id, a.last_seq
    a.close(bye=False)                                 # gone mid-stream, nothing acked
    time.sleep(0.3)
    b = Client(d.url, client_id=cid, name="dropper-again")
    assert b.client_id == cid and b.info.flags & 1, "HELLO_OK should say RESUMED"
    b.last_seq = last                                  # what the learner had processed
    b.next_req_id = a.next_req_id
    t0 = time.time()
    while len(processed) < 12:
        assert time.time() - t0 < 120, f"{len(processed)}/12 after 120 s"
        for r in b.fetch(wait_ms=500):
            key = (r.client_req_id, r.sample_idx)
            assert key not in processed, f"{key} delivered twice"
            processed[key] = r.token_ids.tolist()
    assert b.fetch(wait_ms=100) == []
    assert set(processed) == {(q.client_req_id, i) for q in reqs for i in range(2)}
    assert all(len(t) == 16 for t in processed.values())
    b.close()


@case
def rolloutctl_generate_json_equals_rollout_gen():
    d = daemon()
    args = ["--prompt", "What is 12 + 30?", "--chat", "-n", "2", "--max-tokens", "20", "--temperature", "0.7",
            "--seed", "5", "--json"]
    ref = run([GEN, "--model", MODEL, *args]).stdout
    got = run([CTL, "--connect", d.url, "generate", *args, "--model", MODEL]).stdout
    assert got == ref, f"\nrolloutctl: {got}\nrollout-gen: {ref}"
    ids = ["--prompt-ids", ",".join(map(str, PROMPT)), "--max-tokens", "8", "--temperature", "0"]
    got, ref = run([CTL, "--connect", d.url, "generate", *ids]).stdout, run([GEN, "--model", MODEL, *ids]).stdout
    assert got == ref, f"\nrolloutctl: {got!r}\nrollout-gen: {ref!r}"


@case
def rolloutctl_status_json_parses():
    d = daemon()
    s = json.loads(run([CTL, "--connect", d.url, "status", "--json"]).stdout)
    for k in ("model", "backend", "weight_version", "requests", "kv_cache", "throughput"):
        assert k in s, k
    text = run([CTL, "--connect", d.url, "status"]).stdout
    assert "kv_cache" in text and "blocks_total=" in text, text


@case
def rolloutctl_bench_tiny_load():
    d = daemon()
    out = run([CTL, "--connect", d.url, "bench", "--clients", "2", "--requests", "4", "--n", "2",
               "--max-tokens", "3", "--json"]).stdout
    b = json.loads(out)
    assert b["requests"] == 4 and b["clients"] == 2
    assert b["generated_tokens"] == b["workload_tokens"] > 0, b
    assert b["tokens_per_s"] > 0 and 0 < b["latency_ms"]["p50"] <= b["latency_ms"]["p99"], b


@case
def rolloutctl_flags_are_validated():
    d = daemon()
    for args in (["generate"], ["generate", "--prompt", "x", "--prompt-ids", "1"], ["generate", "--prompt-ids", "1",
                 "--chat"], ["generate", "--prompt", "x", "-n", "0"], ["generate", "--prompt", "x", "--top-p", "2"],
                 ["bench", "--clients", "0"], ["status", "--bogus"], ["frobnicate"]):
        p = run([CTL, "--connect", d.url, *args], check=False)
        assert p.returncode == 2 and p.stderr.strip(), (args, p.returncode, p.stderr)
    p = run([CTL, "--connect", "tcp://127.0.0.1:1", "status"], check=False)
    assert p.returncode == 1 and "connect" in p.stderr, p.stderr


if __name__ == "__main__":
    try:
        main()
    finally:
        if _daemon is not None:
            _daemon.stop()
