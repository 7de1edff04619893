#!/usr/bin/env python3
"""A GRPO-style round against a real rolloutd, end to end.

Starts build/rolloutd with the default model (configs/rolloutd.json, on free
loopback ports unless --url is given), waits for /health, sends 16 arithmetic
questions x n = 8 samples through the chat template, scores each sample with a
verifiable reward (the first integer in the decoded answer equals the sum),
prints per group the reward mean and the advantage spread (std), prints
throughput and KV-cache occupancy from /status every second while it runs,
then stops the daemon with SIGTERM and checks that it exits 0.

    tools/demo_learner.py [--config configs/rolloutd.json] [--model PATH] [--url URL --status HOST:PORT]
                          [--questions 16] [--n 8] [--max-tokens 24] [--temperature 0.8] [--seed 1]

Decoding: results carry token ids only, so the learner decodes them itself
with the vocabulary from the GGUF file (the `gguf` package) and GPT-2
byte-level decoding, as the daemon's tokenizer encodes.
"""
import argparse
import json
import os
import random
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tools", "python"))
from rolloutd import Client  # noqa: E402


# ---- decoding: GPT-2 byte-level BPE vocabulary from the GGUF file ----

def _byte_decoder():
    """The inverse of GPT-2's bytes_to_unicode: vocabulary character -> byte."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    k = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + k)
            k += 1
    return {chr(c): b for b, c in zip(bs, cs)}


class Detokenizer:
    def __init__(self, gguf_path):
        from gguf import GGUFReader
        r = GGUFReader(gguf_path)
        f = r.fields["tokenizer.ggml.tokens"]
        self.tokens = [bytes(f.parts[i]).decode("utf-8") for i in f.data]
        t = r.fields.get("tokenizer.ggml.token_type")
        self.types = [int(t.parts[i][0]) for i in t.data] if t else [1] * len(self.tokens)
        self.bd = _byte_decoder()

    def decode(self, ids):
        out = bytearray()
        for i in ids:
            piece = self.tokens[int(i)]
            if self.types[int(i)] == 3:         # control token: its text as is
                out += piece.encode()
            else:
                out += bytes(self.bd.get(ch, ord("?")) for ch in piece)
        return out.decode("utf-8", "replace")


# ---- the daemon ----

def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get_json(url, timeout=2.0):
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return json.loads(r.read().decode())


def wait_health(status_hostport, proc, timeout=120.0):
    t0 = time.time()
    while time.time() - t0 < timeout:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"rolloutd exited with {proc.returncode} while starting")
        try:
            with urllib.request.urlopen(f"http://{status_hostport}/health", timeout=1.0) as r:
                if r.status == 200:
                    return time.time() - t0
        except OSError:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"rolloutd did not answer /health on {status_hostport} within {timeout:.0f} s")


class StatusPoller(threading.Thread):
    """Prints one line per second from /status: throughput, KV occupancy, requests."""

    def __init__(self, status_hostport, t0):
        super().__init__(daemon=True)
        self.url = f"http://{status_hostport}/status"
        self.t0 = t0
        self.stop = threading.Event()
        self.peak_usage = 0.0
        self.peak_tps = 0.0

    def run(self):
        while not self.stop.wait(1.0):
            try:
                s = get_json(self.url)
            except (OSError, ValueError) as e:
                print(f"  [status] unavailable: {e}", flush=True)
                continue
            thr = s.get("throughput", {})
            kv = s.get("kv_cache", {})
            rq = s.get("requests", {})
            tps = float(thr.get("generated_tokens_per_s", 0) or 0)
            usage = float(kv.get("usage", 0) or 0)
            self.peak_tps = max(self.peak_tps, tps)
            self.peak_usage = max(self.peak_usage, usage)
            print(f"  [status t={time.time() - self.t0:5.1f}s] gen {tps:7.1f} tok/s  prompt "
                  f"{float(thr.get('prompt_tokens_per_s', 0) or 0):7.1f} tok/s  KV {kv.get('blocks_used', '?')}/"
                  f"{kv.get('blocks_total', '?')} blocks ({100 * usage:4.1f}%)  running {rq.get('running', '?')} "
                  f"waiting {rq.get('waiting', '?')}", flush=True)


# ---- the round ----

def questions(k, seed):
    rng = random.Random(seed)
    qs = []
    for _ in range(k):
        a, b = rng.randint(10, 99), rng.randint(10, 99)
        qs.append((f"What is {a} + {b}? Answer with just the number.", a + b))
    return qs


def reward(text, answer):
    """1 when the model's answer is the sum: the number after the last '=' or
    after "answer is" if there is one, else the first number in the text."""
    t = text.replace(",", "")
    m = re.search(r"(?:=|answer is)\s*(-?\d+)(?!.*(?:=|answer is))", t, re.S) or re.search(r"(-?\d+)", t)
    return 1.0 if m and int(m.group(1)) == answer else 0.0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rolloutd", default=os.path.join(ROOT, "build", "rolloutd"))
    ap.add_argument("--config", default=os.path.join(ROOT, "configs", "rolloutd.json"))
    ap.add_argument("--model", default=os.path.join(ROOT, "models", "SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("--url", help="use a running daemon at this URL (then --status is its HOST:PORT)")
    ap.add_argument("--status", default="127.0.0.1:7071")
    ap.add_argument("--questions", type=int, default=16)
    ap.add_argument("--n", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=24)
    ap.add_argument("--temperature", type=float, default=0.8)
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    if not (1 <= a.questions <= 1000 and 1 <= a.n <= 256 and 1 <= a.max_tokens <= 4096 and a.temperature >= 0):
        ap.error("expected 1 <= --questions <= 1000, 1 <= --n <= 256, 1 <= --max-tokens <= 4096, --temperature >= 0")

    print(f"loading the vocabulary from {a.model} ...", flush=True)
    detok = Detokenizer(a.model)

    proc = None
    if a.url:
        url, status = a.url, a.status
    else:
        url, status = f"tcp://127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"
        cmd = [a.rolloutd, "--config", a.config, "--model", a.model, "--listen", url, "--status-listen", status]
        print("starting:", " ".join(cmd), flush=True)
        proc = subprocess.Popen(cmd)
    rc = 1
    try:
        dt = wait_health(status, proc)
        print(f"rolloutd is healthy after {dt:.1f} s (learner socket {url}, status http://{status}/status)", flush=True)
        rc = run_round(a, url, status, detok)
    finally:
        if proc is not None:
            if proc.poll() is None:
                print("stopping rolloutd (SIGTERM) ...", flush=True)
                proc.send_signal(signal.SIGTERM)
                try:
                    code = proc.wait(timeout=60)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    code = proc.wait()
                    print("rolloutd did not exit within 60 s of SIGTERM; killed", flush=True)
                    rc = 1
            else:
                code = proc.returncode
            print(f"rolloutd exited with status {code}", flush=True)
            if code != 0:
                rc = 1
    return rc


def run_round(a, url, status, detok):
    qs = questions(a.questions, a.seed)
    t0 = time.time()
    poller = StatusPoller(status, t0)
    poller.start()
    with Client(url, name="demo-learner") as c:
        info = c.info
        print(f"connected: model {info.model_name} ({info.architecture}, {info.backend}), weight version "
              f"{info.weight_version}, client id {c.client_id:#x}", flush=True)
        print(f"GRPO round: {len(qs)} questions x n = {a.n}, chat template, temperature {a.temperature}, "
              f"max_tokens {a.max_tokens}", flush=True)
        stream = c.stream([q for q, _ in qs], n=a.n, max_tokens=a.max_tokens, temperature=a.temperature,
                          seed=a.seed, chat=True)
        groups = [[] for _ in qs]
        done = 0
        tokens = 0
        for s in stream:
            groups[s.index].append(s)
            tokens += len(s.token_ids)
            if len(groups[s.index]) == a.n:
                done += 1
                g = groups[s.index]
                r = np.array([reward(detok.decode(x.token_ids[:len(x.token_ids) - (x.finish_reason == "stop")]),
                                     qs[s.index][1]) for x in g])
                print(f"  group {done:2d}/{len(qs)} done (question {s.index:2d}) reward mean {r.mean():.3f} "
                      f"std {r.std():.3f}  [{time.time() - t0:5.1f}s]", flush=True)
    poller.stop.set()
    poller.join()
    wall = time.time() - t0

    print()
    print(f"{'q':>2}  {'question':<48} {'ans':>4} {'mean':>5} {'std':>5}  example answer")
    means, spreads, versions = [], [], set()
    for i, (g, (q, ans)) in enumerate(zip(groups, qs)):
        g.sort(key=lambda x: x.sample_idx)
        texts = [detok.decode(x.token_ids[:len(x.token_ids) - (x.finish_reason == "stop")]) for x in g]
        r = np.array([reward(t, ans) for t in texts])
        adv = (r - r.mean()) / (r.std() + 1e-6)      # GRPO advantages
        means.append(r.mean())
        spreads.append(adv.std())
        versions.update(x.version_finish for x in g)
        ex = texts[int(np.argmax(r))].strip().replace("\n", " ")[:40]
        print(f"{i:2d}  {q:<48} {ans:4d} {r.mean():5.2f} {r.std():5.2f}  {ex!r}")
    means = np.array(means)
    useful = int(sum(1 for s in spreads if s > 0))
    print()
    print(f"reward: mean {means.mean():.3f} over {len(qs) * a.n} samples; {useful}/{len(qs)} groups have a non-zero "
          f"advantage spread (the rest give GRPO no signal)")
    print(f"policy version(s) of the samples: {sorted(versions)}")
    print(f"generated {tokens} tokens in {wall:.1f} s: {tokens / wall:.1f} tok/s end to end; peak "
          f"{poller.peak_tps:.1f} tok/s and peak KV usage {100 * poller.peak_usage:.1f}% from /status")
    return 0


if __name__ == "__main__":
    sys.exit(main())
