#!/usr/bin/env python3
"""HTTP /generate next to the NNG protocol on the same daemon and workload
(issue 13's benchmark): closed-loop load with C concurrent streams, and the
idle round trip of a 1-token generation, side by side in one run.

  python3 tools/bench_http.py [--model PATH] [--concurrency 64] [--requests 256]
                              [--max-tokens 64] [--rtt 50] [--json]

One rolloutd (the default model unless --model) serves both. Each of C
threads takes the next request of a fixed list (prompt: 32 random token ids,
max_tokens generated, EOS ignored, temperature 1, seed = index) and waits for
it: over NNG through the Python client (rolloutd.Client.generate, one client
per thread), over HTTP as POST /generate with input_ids on a keep-alive
connection per thread. Both lists are the same, so both sides compute the
same tokens; the NNG pass runs first, then HTTP, then NNG again, and the
summary compares HTTP with the mean of the two NNG passes. tokens/s =
generated tokens / wall time of the pass. RTT: the median over --rtt
sequential 1-token requests on an idle daemon, each way."""
import argparse
import http.client
import json
import os
import random
import statistics
import sys
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tools", "python"))
sys.path.insert(0, os.path.join(ROOT, "tests", "py"))
from rdtest import Daemon  # noqa: E402  (the tests' daemon lifecycle)
from rolloutd import Client  # noqa: E402


def workload(n, max_tokens, vocab, seed=1):
    rng = random.Random(seed)
    return [dict(ids=[rng.randrange(100, vocab) for _ in range(32)], max_tokens=max_tokens, seed=i)
            for i in range(n)]


def run_pass(items, conc, one):
    """Runs one(item, state) over items with conc threads; returns (tokens, seconds)."""
    lock, nxt, tokens = threading.Lock(), [0], [0]

    def worker():
        state = {}
        while True:
            with lock:
                i = nxt[0]
                nxt[0] += 1
            if i >= len(items):
                break
            t = one(items[i], state)
            with lock:
                tokens[0] += t
        if "close" in state:
            state["close"]()

    threads = [threading.Thread(target=worker) for _ in range(conc)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return tokens[0], time.perf_counter() - t0


def nng_one(url):
    def one(it, state):
        if "c" not in state:
            state["c"] = Client(url, name="bench_http")
            state["close"] = state["c"].close
        out = state["c"].generate([it["ids"]], max_tokens=it["max_tokens"], temperature=1.0, seed=it["seed"],
                                  ignore_eos=True)
        return sum(len(s.token_ids) for s in out)
    return one


def http_one(port):
    def one(it, state):
        if "h" not in state:
            state["h"] = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
            state["close"] = state["h"].close
        body = json.dumps({"input_ids": it["ids"], "sampling_params": {
            "max_new_tokens": it["max_tokens"], "temperature": 1.0, "seed": it["seed"], "ignore_eos": True}})
        state["h"].request("POST", "/generate", body, {"Content-Type": "application/json"})
        r = state["h"].getresponse()
        doc = json.loads(r.read())
        assert r.status == 200, doc
        return len(doc["output_ids"])
    return one


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=os.path.join(ROOT, "models", "SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("--requests", type=int, default=256)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--rtt", type=int, default=50)
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()

    d = Daemon("--max-num-seqs", max(64, a.concurrency), "--max-queued-requests", 100000, "--threads", a.threads,
               config=None, model=a.model, timeout=120)
    try:
        url, hport = d.url, d.http_port
        c = Client(url, name="bench_http-probe")
        vocab = c.info.vocab_size
        # idle round trips, 1 generated token
        nng_rtt, http_rtt = [], []
        h = http.client.HTTPConnection("127.0.0.1", hport, timeout=60)
        one = json.dumps({"input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": 1, "temperature": 0}})
        for _ in range(a.rtt):
            t0 = time.perf_counter()
            c.generate([[1, 2, 3]], max_tokens=1, temperature=0.0)
            nng_rtt.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            h.request("POST", "/generate", one, {"Content-Type": "application/json"})
            h.getresponse().read()
            http_rtt.append(time.perf_counter() - t0)
        h.close()
        c.close()
        items = workload(a.requests, a.max_tokens, vocab)
        passes = [("nng", run_pass(items, a.concurrency, nng_one(url))),
                  ("http", run_pass(items, a.concurrency, http_one(hport))),
                  ("nng", run_pass(items, a.concurrency, nng_one(url)))]
    finally:
        d.stop(timeout=60)
    rate = {}
    for name, (tok, sec) in passes:
        rate.setdefault(name, []).append(tok / sec)
    nng = statistics.mean(rate["nng"])
    out = {"concurrency": a.concurrency, "requests": a.requests, "max_tokens": a.max_tokens,
           "passes": [{"path": n, "tokens": t, "seconds": s, "tokens_per_s": t / s} for n, (t, s) in passes],
           "http_over_nng": rate["http"][0] / nng,
           "rtt_ms": {"nng": 1e3 * statistics.median(nng_rtt), "http": 1e3 * statistics.median(http_rtt)}}
    if a.json:
        print(json.dumps(out))
        return
    for p in out["passes"]:
        print(f"{p['path']:<5} {p['tokens']:>7} tokens in {p['seconds']:6.2f} s: {p['tokens_per_s']:8.1f} tokens/s")
    print(f"HTTP / NNG (mean of the two NNG passes): {out['http_over_nng']:.3f}")
    print(f"idle 1-token round trip, median of {a.rtt}: NNG {out['rtt_ms']['nng']:.2f} ms, "
          f"HTTP {out['rtt_ms']['http']:.2f} ms")


if __name__ == "__main__":
    main()
