#!/usr/bin/env python3
"""GRPO-style rounds against a real rolloutd, end to end, with weight pushes between them.

Starts build/rolloutd with the default model (configs/rolloutd.json, on free
loopback ports unless --url is given), waits for /health, and runs --rounds
rounds. Each round sends --questions arithmetic questions x n = 8 samples
through the chat template, scores each sample with a verifiable reward (the
first integer in the decoded answer equals the sum), prints per group the
reward mean and the advantage spread (std), and which policy versions its
samples were generated under (version_finish and the version spans of each
sample). Between rounds the "learner" pushes a new policy, version + 1, with
Client.push_weights (PROTOCOL.md §10): the model's own weights (exported once
as HF f32 tensors by build/rollout-export) times 1 + eps*u, u uniform in
[-1, 1), sent as bf16 bits; it prints the push's MB/s and the engine stall.
With --push-during the push instead starts while the next round is being
sampled (continue mode): samples that cross the swap show two version spans.
Throughput and KV-cache occupancy come from /status every second. At the end
the daemon is stopped with SIGTERM and must exit 0.

    tools/demo_learner.py [--config configs/rolloutd.json] [--model PATH] [--url URL --status HOST:PORT]
                          [--rounds 2] [--questions 8] [--n 8] [--max-tokens 24] [--temperature 0.8] [--seed 1]
                          [--eps 0.01] [--mode continue|drain|abort] [--push-during] [--no-push]

Decoding: results carry token ids only, so the learner decodes them itself
with the vocabulary from the GGUF file (the `gguf` package) and GPT-2
byte-level decoding, as the daemon's tokenizer encodes.
"""
import argparse
import json
import os
import random
import re
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tools", "python"))
from rolloutd import Client, DaemonError, TimeoutError_, bf16_bits  # noqa: E402


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
    ap.add_argument("--rounds", type=int, default=2, help="GRPO rounds; a weight push between each two")
    ap.add_argument("--questions", type=int, default=8, help="questions per round")
    ap.add_argument("--n", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=24)
    ap.add_argument("--temperature", type=float, default=0.8)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--eps", type=float, default=0.01, help="weight perturbation of each push: w * (1 + eps*u)")
    ap.add_argument("--mode", default="continue", choices=["continue", "drain", "abort"], help="swap mode of pushes")
    ap.add_argument("--push-during", action="store_true",
                    help="push while the next round samples (continue mode: samples cross the swap)")
    ap.add_argument("--no-push", action="store_true", help="no weight pushes between rounds")
    ap.add_argument("--export", default=os.path.join(ROOT, "build", "rollout-export"))
    a = ap.parse_args()
    if not (1 <= a.rounds <= 100 and 1 <= a.questions <= 1000 and 1 <= a.n <= 256 and 1 <= a.max_tokens <= 4096
            and a.temperature >= 0 and 0 <= a.eps < 1):
        ap.error("expected 1 <= --rounds <= 100, 1 <= --questions <= 1000, 1 <= --n <= 256, "
                 "1 <= --max-tokens <= 4096, --temperature >= 0, 0 <= --eps < 1")

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
        rc = run_rounds(a, url, status, detok)
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


# ---- the learner's side of a weight update ----

def read_safetensors(path):
    """{name: float32 array} of a .safetensors file (u64 header length, JSON header, data), memory-mapped."""
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        hdr = json.loads(f.read(n))
    raw = np.memmap(path, dtype=np.uint8, mode="r", offset=8 + n)
    dt = {"F32": np.float32, "F16": np.float16}
    return {k: raw[v["data_offsets"][0]:v["data_offsets"][1]].view(dt[v["dtype"]]).reshape(v["shape"])
            for k, v in hdr.items() if k != "__metadata__"}


class Weights:
    """The policy's weights as HF tensors: the model exported once by rollout-export (in the background, while
    the first round runs); new_version() is the stand-in for an optimizer step."""

    def __init__(self, a):
        self.a = a
        self.dir = tempfile.mkdtemp(prefix="rd-demo-")
        self.base = None
        self.error = None
        self.thread = threading.Thread(target=self._export, daemon=True)
        self.thread.start()

    def _export(self):
        out = os.path.join(self.dir, "hf")
        p = subprocess.run([self.a.export, "--model", self.a.model, "--out", out, "--dtype", "f32"],
                           capture_output=True, text=True)
        if p.returncode != 0:
            self.error = f"{self.a.export} exited {p.returncode}: {p.stderr.strip()[-500:]}"
            return
        self.base = read_safetensors(os.path.join(out, "model.safetensors"))

    def new_version(self, version):
        """{name: bf16 bits}: every weight times 1 + eps*u, u uniform in [-1, 1) (seeded by the version)."""
        self.thread.join()
        if self.error:
            raise RuntimeError(self.error)
        rng = np.random.default_rng(1000 + version)
        out = {}
        for k, w in self.base.items():
            u = rng.random(w.shape, dtype=np.float32)
            u *= np.float32(2 * self.a.eps)
            u += np.float32(1 - self.a.eps)
            u *= w
            out[k] = bf16_bits(u)
        return out

    def close(self):
        self.base = None
        shutil.rmtree(self.dir, ignore_errors=True)


def make_update(c, weights, version):
    """The next policy's tensors, checksummed for the push (a learner step's output)."""
    t0 = time.time()
    w = weights.new_version(version)
    step = time.time() - t0
    prep = c.prepare(w)
    print(f"learner: policy version {version} ready ({len(prep)} tensors, {prep.total_bytes / 1e6:.0f} MB as bf16; "
          f"perturbation eps {weights.a.eps} in {step:.1f} s, CRC-32C of every chunk in {prep.prepare_seconds:.1f} s)",
          flush=True)
    return prep


def push(c, prep, version, mode):
    """One push to the daemon; prints what it cost. Returns the PushResult or None when it failed."""
    try:
        r = c.push_weights(prep, version, mode=mode)
    except (DaemonError, TimeoutError_, ConnectionError) as e:
        print(f"learner: push of version {version} FAILED: {e}", flush=True)
        return None
    print(f"learner: pushed version {r.version} ({mode} mode) in {r.seconds:.2f} s: {r.mb_per_s:.0f} MB/s "
          f"(chunks {r.transfer_mb_per_s:.0f} MB/s over {'the data lane' if r.lane else 'NNG'}, window {r.window}, "
          f"{r.chunk_bytes >> 20} MiB chunks); engine stall {r.stall_us} us, swap {r.wait_us / 1e3:.0f} ms after "
          f"COMMIT, {r.n_aborted} samples aborted", flush=True)
    return r


def version_summary(samples):
    """'v1: 60 samples; v0->v1: 4 samples (crossed the swap)' from each sample's version spans."""
    kinds = {}
    for x in samples:
        vs = [sp[2] for sp in x.spans] or [x.version_finish]
        key = "->".join(f"v{v}" for v in vs)
        kinds[key] = kinds.get(key, 0) + 1
    return "; ".join(f"{k}: {n} samples" + (" (crossed the swap)" if "->" in k else "")
                     for k, n in sorted(kinds.items()))


def run_rounds(a, url, status, detok):
    t0 = time.time()
    poller = StatusPoller(status, t0)
    poller.start()
    weights = owned = None if a.no_push or a.rounds < 2 else Weights(a)
    rc, tokens, all_means, pushes = 0, 0, [], []
    try:
        with Client(url, name="demo-learner") as c:
            info = c.info
            print(f"connected: model {info.model_name} ({info.architecture}, {info.backend}), weight version "
                  f"{info.weight_version}, client id {c.client_id:#x}", flush=True)
            version = info.weight_version
            for rnd in range(a.rounds):
                pusher = None
                if rnd and weights:
                    try:
                        prep = make_update(c, weights, version + 1)
                    except RuntimeError as e:
                        print(f"learner: no weight push: {e}", flush=True)
                        pushes.append(None)
                        weights = None
                        prep = None
                    if prep and a.push_during:
                        # The weight sync runs on its own connection while this round samples.
                        def bg(v=version + 1, prep=prep):
                            with Client(url, name="demo-learner-push") as pc:
                                pushes.append(push(pc, prep, v, a.mode))
                        pusher = threading.Thread(target=bg)
                        version += 1
                    elif prep:
                        pushes.append(push(c, prep, version + 1, a.mode))
                        version += 1
                n_tok, means = run_round(a, c, rnd, t0, detok, pusher)
                tokens += n_tok
                all_means += means
            if any(r is None for r in pushes):
                rc = 1
    finally:
        poller.stop.set()
        poller.join()
        if owned:
            owned.close()
    wall = time.time() - t0
    print()
    costs = ", ".join(f"{r.mb_per_s:.0f} MB/s stall {r.stall_us} us" if r else "failed" for r in pushes)
    print(f"{a.rounds} rounds: reward mean {np.mean(all_means):.3f} over {len(all_means) * a.n} samples; "
          f"{len(pushes)} weight push{'es' if len(pushes) != 1 else ''}" + (f" ({costs})" if pushes else ""))
    print(f"generated {tokens} tokens in {wall:.1f} s: {tokens / wall:.1f} tok/s end to end; peak "
          f"{poller.peak_tps:.1f} tok/s and peak KV usage {100 * poller.peak_usage:.1f}% from /status")
    return rc


def run_round(a, c, rnd, t0, detok, pusher=None):
    qs = questions(a.questions, a.seed + rnd)
    print(f"GRPO round {rnd + 1}/{a.rounds}: {len(qs)} questions x n = {a.n}, chat template, temperature "
          f"{a.temperature}, max_tokens {a.max_tokens}", flush=True)
    stream = c.stream([q for q, _ in qs], n=a.n, max_tokens=a.max_tokens, temperature=a.temperature,
                      seed=a.seed + rnd, chat=True)
    if pusher:
        pusher.start()
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
            vs = sorted({sp[2] for x in g for sp in x.spans} or {x.version_finish for x in g})
            print(f"  group {done:2d}/{len(qs)} done (question {s.index:2d}) reward mean {r.mean():.3f} "
                  f"std {r.std():.3f}  policy v{'/v'.join(map(str, vs))}  [{time.time() - t0:5.1f}s]", flush=True)
    if pusher:
        pusher.join()

    print()
    print(f"{'q':>2}  {'question':<48} {'ans':>4} {'mean':>5} {'std':>5}  example answer")
    means, spreads = [], []
    for i, (g, (q, ans)) in enumerate(zip(groups, qs)):
        g.sort(key=lambda x: x.sample_idx)
        texts = [detok.decode(x.token_ids[:len(x.token_ids) - (x.finish_reason == "stop")]) for x in g]
        r = np.array([reward(t, ans) for t in texts])
        adv = (r - r.mean()) / (r.std() + 1e-6)      # GRPO advantages
        means.append(r.mean())
        spreads.append(adv.std())
        ex = texts[int(np.argmax(r))].strip().replace("\n", " ")[:40]
        print(f"{i:2d}  {q:<48} {ans:4d} {r.mean():5.2f} {r.std():5.2f}  {ex!r}")
    useful = int(sum(1 for s in spreads if s > 0))
    samples = [x for g in groups for x in g]
    print(f"round {rnd + 1}: reward mean {np.mean(means):.3f} over {len(samples)} samples; {useful}/{len(qs)} groups "
          f"have a non-zero advantage spread (the rest give GRPO no signal)")
    print(f"round {rnd + 1}: policy versions of the samples (version spans): {version_summary(samples)}; "
          f"version_finish {sorted({x.version_finish for x in samples})}", flush=True)
    print()
    return tokens, means


if __name__ == "__main__":
    sys.exit(main())
