#!/usr/bin/env python3
"""Prompt scoring (issue 45) next to plain prefill and next to llama.cpp's logits_all, and the
memory a long scored prompt takes (make bench-score, make bench-score-mem).

Speed (--part speed): one rolloutd (the default model unless --model; --threads T, prefix cache
off so that a repeated prompt is computed again, default max_batch_tokens 512) and the same
prompts, random token ids drawn once: a set of N prompts of L tokens posted at once (one thread
and keep-alive connection each), and one prompt of LONG tokens. Every rep runs each set
  prefill  POST /generate, max_new_tokens 1, temperature 0 (the prompt computed, one token drawn)
  scored   POST /generate, return_logprob, logprob_start_len 0, max_new_tokens 0 (every prompt
           position's log-prob, meta_info.input_token_logprobs; checked to have them all)
  llama.cpp  llama-cpp-python Llama(model, logits_all=True, n_threads=T, n_batch 512) on the same
           file and ids, one prompt after the other: reset(), eval(ids) (timed alone: "eval"),
           then log_softmax of every row of scores and the next token's entry (timed with it:
           "scored"); the daemon sits idle meanwhile
alternating the order of prefill and scored from rep to rep, after one untimed warm-up of each.
tokens/s = prompt tokens of the set / wall time of the pass (HTTP and JSON included on the
daemon's side); the table shows the median over reps and scored / prefill (the target: >= 0.8).
In brackets, tokens per CPU-second: the daemon's (/proc/PID/stat utime + stime, all its threads)
and this process's for llama.cpp (time.process_time, its OpenMP threads included), which moves
less than wall time when other work shares the cores (the load average is recorded per rep).
llama.cpp runs with OMP_WAIT_POLICY=passive unless the environment sets it (see below).

Memory (--part mem): a daemon scores one long prompt from position 0 while a thread samples its
VmRSS every 10 ms; VmHWM is read before and after. Reported next to the KV bytes of that many
tokens (layers x 2 x kv_heads x head_dim x 4: the CPU backend's f32 KV) plus one chunk's logits
(ENG_SCORE_CHUNK x vocab x 4) and next to what vocab x prompt_len floats would take. The CPU
backend zeroes its KV pool and its logit rows when the daemon starts, so both are in the idle RSS
already: the growth is what scoring itself allocates. Two runs:
  default model, the longest prompt it accepts (its context - 1: 8191 tokens for SmolLM2; the
      daemon refuses positions past the model's context_length);
  a 32k-token prompt (--mem-len) on a RoPE-only model with SmolLM2's vocabulary and width (vocab
      49152, dim 576, 9 heads over 3 KV heads, ffn 1536, tied, Q4_1) but 2 layers, its context
      40960: generated once by tools/gen_tiny_model.py into build/bench-score-32k.gguf (random
      weights). SmolLM2's own file with its context_length raised would do (it is RoPE-only), but
      its 30 layers' attention at 32k is ~16x that of the 8191-token run (~4 min here): an hour.

  python3 tools/bench_score.py [--part speed|mem|all] [--reps 3] [--n-prompts 16]
      [--prompt-len 512] [--long-len 2048] [--mem-len 32768] [--threads 2]
      [--json-out build/bench-score.json]
"""
import argparse
import http.client
import json
import os
import platform
import statistics
import subprocess
import sys
import threading
import time

import numpy as np

# llama.cpp's OpenMP threads spin at every barrier by default; on this shared 2-core machine a spinning
# thread whose partner lost its core stalls both (docs/PERF.md, 2026-11-29: 22 vs 67 tok/s under load).
# Passive waits keep its numbers meaningful while other work runs; set OMP_WAIT_POLICY to override.
os.environ.setdefault("OMP_WAIT_POLICY", "passive")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests", "py"))
sys.path.insert(0, os.path.join(ROOT, "tools"))
from rdtest import Daemon  # noqa: E402  (the tests' daemon lifecycle)
from gguf_fast import GGUFReader  # noqa: E402
from ref_llama import _field  # noqa: E402

SCORE_CHUNK = 128         # engine/serve/engine.h ENG_SCORE_CHUNK
SYN = os.path.join(ROOT, "build", "bench-score-32k.gguf")
SYN_ARGS = ["--arch", "llama", "--dtype", "q4_1", "--layers", "2", "--dim", "576", "--heads", "9", "--kv-heads", "3",
            "--ffn", "1536", "--vocab", "49152", "--ctx", "40960", "--rope-theta", "100000", "--tied", "--seed", "5"]


def shape(path):
    """(n_layers, kv_heads, head_dim, vocab, context) from a GGUF's metadata."""
    g = GGUFReader(path)
    a = _field(g, "general.architecture")
    heads = int(_field(g, f"{a}.attention.head_count"))
    dim = int(_field(g, f"{a}.embedding_length"))
    head_dim = int(_field(g, f"{a}.attention.key_length", dim // heads))
    vocab = len(g.fields["tokenizer.ggml.tokens"].data)
    return (int(_field(g, f"{a}.block_count")), int(_field(g, f"{a}.attention.head_count_kv", heads)), head_dim,
            vocab, int(_field(g, f"{a}.context_length")))


def cpu_s(pid):
    """CPU seconds (user + system, all threads) process pid has used."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def post(conn, body):
    conn.request("POST", "/generate", json.dumps(body), {"Content-Type": "application/json"})
    r = conn.getresponse()
    doc = json.loads(r.read())
    if r.status != 200:
        raise RuntimeError(f"/generate answered {r.status}: {doc}")
    return doc


def body(ids, scored):
    if scored:
        return {"input_ids": ids, "return_logprob": True, "logprob_start_len": 0, "sampling_params": {"max_new_tokens": 0}}
    return {"input_ids": ids, "sampling_params": {"max_new_tokens": 1, "temperature": 0}}


def engine_pass(d, prompts, scored):
    """All prompts at once (one thread and connection each): (wall seconds, daemon CPU seconds)."""
    port = d.http_port
    errs = []

    def one(ids):
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=3600)
        try:
            doc = post(c, body(ids, scored))
            if scored:
                got = doc["meta_info"]["input_token_logprobs"]
                assert len(got) == len(ids) and got[0][0] is None and all(t[0] is not None for t in got[1:]), \
                    "scored positions missing"
            else:
                assert len(doc["output_ids"]) == 1, doc
        except Exception as e:  # noqa: BLE001  (reported after the pass)
            errs.append(e)
        finally:
            c.close()

    ts = [threading.Thread(target=one, args=(ids,)) for ids in prompts]
    c0, t0 = cpu_s(d.proc.pid), time.perf_counter()
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    dt, dc = time.perf_counter() - t0, cpu_s(d.proc.pid) - c0
    if errs:
        raise errs[0]
    return dt, dc


def llama_pass(llm, prompts):
    """(seconds of eval, seconds of eval + log-softmax, CPU seconds of eval + log-softmax), one prompt
    after the other (CPU: this process's, llama.cpp's threads included)."""
    t_eval = t_all = 0.0
    c0 = time.process_time()
    for ids in prompts:
        t0 = time.perf_counter()
        llm.reset()
        llm.eval(ids)
        t1 = time.perf_counter()
        z = np.asarray(llm.scores[:len(ids) - 1], dtype=np.float32)
        mx = z.max(axis=-1, keepdims=True)
        lse = mx[:, 0] + np.log(np.exp(z - mx).sum(axis=-1))
        lp = z[np.arange(len(ids) - 1), ids[1:]] - lse
        t2 = time.perf_counter()
        assert np.isfinite(lp).all() and (lp <= 1e-4).all()
        t_eval += t1 - t0
        t_all += t2 - t0
    return t_eval, t_all, time.process_time() - c0


def speed(a):
    n_layers, kv_heads, head_dim, vocab, ctx = shape(a.model)
    rng = np.random.default_rng(1)
    sets = {f"{a.n_prompts}x{a.prompt_len}": [rng.integers(100, vocab, a.prompt_len).tolist()
                                              for _ in range(a.n_prompts)],
            f"1x{a.long_len}": [rng.integers(100, vocab, a.long_len).tolist()]}
    d = Daemon("--threads", a.threads, "--prefix-cache", 0, "--max-num-seqs", max(64, a.n_prompts),
               config=None, model=a.model, timeout=120)
    rows = {name: {"prompt_tokens": sum(map(len, ps)), "prefill_s": [], "scored_s": [], "llamacpp_eval_s": [],
                   "llamacpp_scored_s": [], "prefill_cpu_s": [], "scored_cpu_s": [], "llamacpp_scored_cpu_s": []}
            for name, ps in sets.items()}
    try:
        from llamacpp_info import Llama
        llm = Llama(model_path=a.model, n_ctx=max(a.long_len, a.prompt_len) + 16, n_batch=512, n_threads=a.threads,
                    n_threads_batch=a.threads, logits_all=True, verbose=False, seed=0)
        for ps in sets.values():                      # warm-up, untimed
            engine_pass(d, ps, False)
            engine_pass(d, ps, True)
            llama_pass(llm, ps[:1])
        for rep in range(a.reps):
            for name, ps in sets.items():
                order = (False, True) if rep % 2 == 0 else (True, False)
                for scored in order:
                    dt, dc = engine_pass(d, ps, scored)
                    rows[name]["scored_s" if scored else "prefill_s"].append(dt)
                    rows[name]["scored_cpu_s" if scored else "prefill_cpu_s"].append(dc)
                te, ta, tc = llama_pass(llm, ps)
                rows[name]["llamacpp_eval_s"].append(te)
                rows[name]["llamacpp_scored_s"].append(ta)
                rows[name]["llamacpp_scored_cpu_s"].append(tc)
                r = rows[name]
                r.setdefault("loadavg_1min", []).append(os.getloadavg()[0])
                print(f"# rep {rep} {name}: prefill {r['prefill_s'][-1]:.2f} s (cpu {r['prefill_cpu_s'][-1]:.1f}), "
                      f"scored {r['scored_s'][-1]:.2f} s (cpu {r['scored_cpu_s'][-1]:.1f}), llama.cpp eval {te:.2f} s "
                      f"(+log-softmax {ta:.2f} s, cpu {tc:.1f}), load {os.getloadavg()[0]:.2f}", flush=True)
    finally:
        d.stop(timeout=120)
    out = []
    for name, r in rows.items():
        tok = r["prompt_tokens"]
        med = {k: statistics.median(r[k + "_s"]) for k in ("prefill", "scored", "llamacpp_eval", "llamacpp_scored",
                                                           "prefill_cpu", "scored_cpu", "llamacpp_scored_cpu")}
        # per rep: the two passes of a rep ran minutes apart at most, so their ratio drifts less
        per_rep = [p / s for p, s in zip(r["prefill_s"], r["scored_s"])]
        out.append({"set": name, **r, **{k + "_tokens_per_s": tok / v for k, v in med.items() if "cpu" not in k},
                    **{k.replace("_cpu", "") + "_tokens_per_cpu_s": tok / v for k, v in med.items() if "cpu" in k},
                    "scored_over_prefill": med["prefill"] / med["scored"],
                    "scored_over_prefill_per_rep": per_rep,
                    "scored_over_prefill_cpu": med["prefill_cpu"] / med["scored_cpu"],
                    "scored_over_llamacpp_scored": med["llamacpp_scored"] / med["scored"],
                    "scored_over_llamacpp_scored_cpu": med["llamacpp_scored_cpu"] / med["scored_cpu"]})
    return out


def proc_kib(pid, key):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    raise KeyError(key)


def mem_run(a, label, model, n_tokens, kv_budget=None):
    n_layers, kv_heads, head_dim, vocab, ctx = shape(model)
    n = min(n_tokens, ctx - 1)
    kv_tok = n_layers * 2 * kv_heads * head_dim * 4
    extra = ["--threads", a.threads, "--prefix-cache", 0, "--max-num-seqs", 4]
    if kv_budget:
        extra += ["--kv-cache-bytes", kv_budget]
    elif kv_tok * (n + 64) > (1 << 30):       # more than the default 1 GiB: the prompt's blocks and some slack
        extra += ["--kv-cache-bytes", kv_tok * (n + 1024)]
    d = Daemon(*extra, config=None, model=model, timeout=300)
    try:
        pid = d.proc.pid
        conn = http.client.HTTPConnection("127.0.0.1", d.http_port, timeout=7200)
        post(conn, body([100, 200, 300, 400], True))       # one small scoring call: its first-use allocations
        time.sleep(0.5)
        rss0, hwm0 = proc_kib(pid, "VmRSS"), proc_kib(pid, "VmHWM")
        peak = [rss0]
        stop = threading.Event()

        def sample():
            while not stop.is_set():
                peak[0] = max(peak[0], proc_kib(pid, "VmRSS"))
                time.sleep(0.01)

        ids = np.random.default_rng(2).integers(100, vocab, n).tolist()
        t = threading.Thread(target=sample)
        t.start()
        t0 = time.perf_counter()
        try:
            doc = post(conn, body(ids, True))
        finally:
            dt = time.perf_counter() - t0
            stop.set()
            t.join()
        got = doc["meta_info"]["input_token_logprobs"]
        assert len(got) == n and all(x[0] is not None for x in got[1:]), "scored positions missing"
        hwm1 = proc_kib(pid, "VmHWM")
        conn.close()
    finally:
        d.stop(timeout=120)
    kib = 1024
    res = {"label": label, "model": os.path.relpath(model, ROOT), "prompt_tokens": n, "model_context": ctx,
           "vocab": vocab, "layers": n_layers, "kv_heads": kv_heads, "head_dim": head_dim,
           "seconds": dt, "tokens_per_s": n / dt, "loadavg_1min": os.getloadavg()[0],
           "rss_idle_bytes": rss0 * kib, "hwm_before_bytes": hwm0 * kib, "hwm_after_bytes": hwm1 * kib,
           "rss_peak_sampled_bytes": peak[0] * kib,
           "peak_growth_bytes": max(hwm1 - hwm0, peak[0] - rss0) * kib,
           "kv_bytes_for_prompt": kv_tok * n, "chunk_logits_bytes": SCORE_CHUNK * vocab * 4,
           "full_logits_bytes": n * vocab * 4}
    res["growth_over_kv_plus_chunk"] = res["peak_growth_bytes"] / (res["kv_bytes_for_prompt"] + res["chunk_logits_bytes"])
    print(f"# mem {label}: {n} tokens scored in {dt:.1f} s, peak RSS growth {res['peak_growth_bytes'] / 2**20:.1f} MiB",
          flush=True)
    return res


def mem(a):
    if not os.path.exists(SYN):
        subprocess.run([sys.executable, os.path.join(ROOT, "tools", "gen_tiny_model.py"), "--out", SYN, *SYN_ARGS],
                       check=True, capture_output=True)
    out = []
    if not a.skip_default_mem:
        out.append(mem_run(a, "default model, its context - 1", a.model, 1 << 30))
    out.append(mem_run(a, f"{a.mem_len} tokens, RoPE-only 2-layer model (SmolLM2 vocab/width)", SYN, a.mem_len))
    return out


def table(res):
    mib = 2 ** 20
    if "speed" in res:
        print("tokens/s (wall, median of reps); tokens per CPU-second in brackets")
        print(f"{'set':<10} {'prefill':>16} {'scored':>16} {'scored/prefill':>16} "
              f"{'llama.cpp eval':>15} {'llama.cpp +lsm':>16} {'scored/llama.cpp':>17}")
        for r in res["speed"]:
            print(f"{r['set']:<10} {r['prefill_tokens_per_s']:>7.1f} [{r['prefill_tokens_per_cpu_s']:>6.1f}] "
                  f"{r['scored_tokens_per_s']:>7.1f} [{r['scored_tokens_per_cpu_s']:>6.1f}] "
                  f"{r['scored_over_prefill']:>7.3f} [{r['scored_over_prefill_cpu']:>6.3f}] "
                  f"{r['llamacpp_eval_tokens_per_s']:>15.1f} "
                  f"{r['llamacpp_scored_tokens_per_s']:>7.1f} [{r['llamacpp_scored_tokens_per_cpu_s']:>6.1f}] "
                  f"{r['scored_over_llamacpp_scored']:>7.3f} [{r['scored_over_llamacpp_scored_cpu']:>6.3f}]")
    if "mem" in res:
        print(f"{'memory run':<52} {'tokens':>6} {'tok/s':>7} {'idle RSS':>9} {'growth':>8} {'KV(n)':>8} "
              f"{'chunk':>6} {'growth/(KV+chunk)':>18} {'vocab x n':>10}  (MiB)")
        for r in res["mem"]:
            print(f"{r['label']:<52} {r['prompt_tokens']:>6} {r['tokens_per_s']:>7.1f} {r['rss_idle_bytes'] / mib:>9.1f} "
                  f"{r['peak_growth_bytes'] / mib:>8.1f} {r['kv_bytes_for_prompt'] / mib:>8.1f} "
                  f"{r['chunk_logits_bytes'] / mib:>6.1f} {r['growth_over_kv_plus_chunk']:>18.3f} "
                  f"{r['full_logits_bytes'] / mib:>10.0f}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=os.path.join(ROOT, "models", "SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("--part", choices=("speed", "mem", "all"), default="all")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--n-prompts", type=int, default=16)
    ap.add_argument("--prompt-len", type=int, default=512)
    ap.add_argument("--long-len", type=int, default=2048)
    ap.add_argument("--mem-len", type=int, default=32768)
    ap.add_argument("--skip-default-mem", action="store_true", help="memory: only the 32k run")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json-out", default=os.path.join(ROOT, "build", "bench-score.json"))
    a = ap.parse_args()
    res = {"date": time.strftime("%Y-%m-%d %H:%M:%S"), "host": platform.node(), "cpus": os.cpu_count(),
           "threads": a.threads, "model": os.path.relpath(a.model, ROOT),
           "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"), "loadavg_start": os.getloadavg()}
    if a.part in ("speed", "all"):
        res["speed"] = speed(a)
    if a.part in ("mem", "all"):
        res["mem"] = mem(a)
    res["loadavg_end"] = os.getloadavg()
    with open(a.json_out, "w") as f:
        json.dump(res, f, indent=1)
    table(res)
    print(f"wrote {a.json_out}")


if __name__ == "__main__":
    main()
