#!/usr/bin/env python3
"""Quantized rollouts (make bench-quant, issue 26): a bf16 push served as bf16 vs as q8_0 and q4_k, side by side
in one run.

Per model (the default model, and Gemma 3 270M when `make model-gemma3` fetched it): the model's own
weights exported by rollout-export as a bf16 HF checkpoint (what a learner pushes), pushed with the
Python client to daemons started from the same file, one `--serve-dtype as_pushed` (serves bf16) and
one per quantized serve_dtype (SERVES, default q8_0,q4_k; each quantizes at COMMIT), then:

- COMMIT to serving: the daemon's own wait_us of each push (COMMIT's arrival to the swap), ROUNDS
  pushes to each, alternating;
- decode tokens/s at batch 1, 8, 32: B random-token prompts of 16 tokens, 64 new tokens each
  (ignore_eos, temperature 1), on one daemon then the other, the order swapped every round, ROUNDS
  rounds (interleaved, so a shared machine's load hits both sides alike). A round's rate is
  B * 63 / (the median over samples of total_us - first_token_us): the decode steps only, no
  prefill; the summary is the median over rounds, and the ratio q8_0 / bf16 per batch size;
- the policy mismatch a TIS user cares about: prompts sampled on the bf16 daemon (temperature 1,
  raw log-probs), every (prompt + sampled tokens) scored under both policies by teacher forcing
  (rollout-logits, one prefill: the bf16 policy from the exported HF folder itself, the q8_0 policy
  from a Q8_0 GGUF the `gguf` package wrote from the same bf16 values: test_serve_dtype shows the
  daemon's q8_0 push serves exactly such a file), then over the sampled tokens: mean and max
  |logp_q8 - logp_bf16|, the mean K3 estimate of KL(bf16 || q8_0) (r = p_q8 / p_bf16, k3 = r - 1 -
  log r), and the exact mean KL over the whole vocabulary at those positions. Two consistency
  checks are printed with it: the bf16 daemon's own sampled log-probs against the bf16 scoring, and
  the q8_0 daemon's own samples against the q8_0 scoring (decode vs prefill arithmetic, ~1e-5; a
  large value would mean the scoring file is not the policy the daemon serves).

Last, the GEMM alone (rollout-gemmbench, bf16 and Q8_0 alternating, one thread's CPU time): how much
of the bytes' 1.88x the M=1 decoders turn into speed, a number the machine's load moves little.
The load average and the daemons' /status weights_bytes are printed next to the numbers (a shared
machine: compare the columns of one run, not runs). Writes build/bench-quant.json.
The q4_k scoring file holds what staging.c's serve_type makes of the layers: Q4_K (by llama.cpp's own
ggml, tests/py/ref_ggml.py; test_serve_quant shows the daemon serves exactly such a file) where the rows
are whole 256-blocks, Q8_0 for the embedding, the LM head and other rows.
  env: ROUNDS (default 3), MODELS (comma-separated GGUF paths; default: the default model and
  Gemma 3 when present), SERVES (default q8_0,q4_k), TIS_PROMPTS (default 8), TIS_N (default 2),
  TIS_TOKENS (default 48)."""
import json
import os
import shutil
import statistics
import struct
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BUILD = os.path.join(ROOT, "build")
sys.path.insert(0, os.path.join(ROOT, "tests", "py"))
sys.path.insert(0, os.path.join(ROOT, "tools", "python"))
import gguf  # noqa: E402
import numpy as np  # noqa: E402
import ref_ggml  # noqa: E402
from rdtest import Daemon  # noqa: E402
from rolloutd import Client  # noqa: E402

DEFAULT = os.path.join(ROOT, "models/SmolLM2-135M-Instruct.Q4_1.gguf")
GEMMA3 = os.path.join(ROOT, "models/gemma-3-270m-q4_k_m.gguf")
ROUNDS = int(os.environ.get("ROUNDS", "3"))
SERVES = tuple(os.environ.get("SERVES", "q8_0,q4_k").split(","))
BATCHES = (1, 8, 32)
PROMPT, NEW = 16, 64
TIS_PROMPTS = int(os.environ.get("TIS_PROMPTS", "8"))
TIS_N = int(os.environ.get("TIS_N", "2"))
TIS_TOKENS = int(os.environ.get("TIS_TOKENS", "48"))
DAEMON_FLAGS = ("--max-num-seqs", "32", "--max-batch-tokens", "512", "--kv-cache-bytes", str(512 << 20),
                "--max-queued-requests", "256")


def export_bf16(model, out):
    """The model's weights as a learner holds them in bf16: {HF name: uint16 bits or f32 array}."""
    subprocess.run([os.path.join(BUILD, "rollout-export"), "--model", model, "--out", out, "--dtype", "bf16"],
                   check=True, capture_output=True)
    path = os.path.join(out, "model.safetensors")
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        hdr = json.loads(f.read(n))
    raw = np.memmap(path, dtype=np.uint8, mode="r", offset=8 + n)
    views = {"BF16": np.uint16, "F32": np.float32, "F16": np.float16}
    return {k: raw[v["data_offsets"][0]:v["data_offsets"][1]].view(views[v["dtype"]]).reshape(v["shape"])
            for k, v in hdr.items() if k != "__metadata__"}


def bf16_round(a):
    """f32 -> the nearest bf16 value (ties to even), as f32: what a bf16 export of it holds."""
    u = np.ascontiguousarray(a, dtype=np.float32).view(np.uint32).astype(np.uint64)
    u = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
    return (u.astype(np.uint32) << 16).view(np.float32)


def quant_gguf(src, dst, serve):
    """src's tensors rounded to bf16 (the pushed values), then the 2-D ones quantized as serve_dtype
    `serve` holds them: q8_0 all to Q8_0 by gguf.quants (as convert_hf_to_gguf --outtype q8_0 does);
    q4_k the layers' 256-block rows to Q4_K by ggml, the rest Q8_0 (staging.c's serve_type); 1-D f32."""
    r = gguf.GGUFReader(src)
    arch = r.fields["general.architecture"].contents()
    # Gemma's GGUF stores every norm as 1 + w (llama.cpp's converter) while a learner pushes w (the HF
    # value) in bf16: the pushed norm is bf16(g - 1), so the file must hold 1 + bf16(g - 1), not bf16(g).
    norm_1p = arch == "gemma3"
    w = gguf.GGUFWriter(dst, arch=arch)
    for f in r.fields.values():
        if f.name == "general.architecture" or f.name.startswith("GGUF."):
            continue
        vt = f.types[0]
        st = f.types[-1] if vt == gguf.GGUFValueType.ARRAY else None
        w.add_key_value(f.name, 7 if f.name == "general.file_type" else f.contents(), vt, sub_type=st)
    for t in r.tensors:
        shape = tuple(int(d) for d in reversed(t.shape.tolist()))
        g = np.asarray(gguf.quants.dequantize(t.data, t.tensor_type), dtype=np.float32).reshape(shape)
        if norm_1p and t.name.endswith("norm.weight"):
            a = (bf16_round(g - np.float32(1)) + np.float32(1)).astype(np.float32)
        else:
            a = bf16_round(g)
        outer = t.name in ("token_embd.weight", "output.weight")
        if len(shape) == 2 and serve == "q4_k" and not outer and shape[1] % 256 == 0:
            w.add_tensor(t.name, ref_ggml.q4_k(a), raw_dtype=gguf.GGMLQuantizationType.Q4_K)
        elif len(shape) >= 2 and not t.name.endswith("ffn_gate_inp.weight"):
            w.add_tensor(t.name, gguf.quants.quantize(a, gguf.GGMLQuantizationType.Q8_0),
                         raw_dtype=gguf.GGMLQuantizationType.Q8_0)
        else:
            w.add_tensor(t.name, a)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def score(model, ids, start, tmp):
    """Teacher-forced log-probs of ids[start:] under model (rollout-logits, one prefill): (logp of
    each of those tokens float64 [n], log-softmax rows float64 [n, vocab])."""
    out = os.path.join(tmp, "logits.bin")
    subprocess.run([os.path.join(BUILD, "rollout-logits"), "--model", model, "--prompt-ids",
                    ",".join(map(str, ids)), "--out", out], check=True, capture_output=True)
    lg = np.fromfile(out, dtype=np.float32).reshape(len(ids), -1)[start - 1:len(ids) - 1].astype(np.float64)
    m = lg.max(axis=1, keepdims=True)
    ls = lg - m - np.log(np.exp(lg - m).sum(axis=1, keepdims=True))
    tok = np.asarray(ids[start:])
    return ls[np.arange(len(tok)), tok], ls


def tis(ca, cb, vocab, hf_dir, q8_path, tmp, rng):
    """The policy mismatch on bf16-sampled tokens (see the module comment); cb serves q8_path's policy."""
    prompts = [[int(x) for x in rng.integers(10, min(vocab, 30000), PROMPT)] for _ in range(TIS_PROMPTS)]
    sa = ca.generate(prompts, n=TIS_N, max_tokens=TIS_TOKENS, temperature=1.0, seed=26, ignore_eos=True)
    sb = cb.generate(prompts, n=1, max_tokens=TIS_TOKENS, temperature=1.0, seed=27, ignore_eos=True)
    d, k3, kl, self_b, self_q = [], [], [], [], []
    for s in sa:
        ids = prompts[s.index] + [int(t) for t in s.token_ids]
        lb, rows_b = score(hf_dir, ids, PROMPT, tmp)
        lq, rows_q = score(q8_path, ids, PROMPT, tmp)
        self_b.append(np.abs(lb - s.logprobs.astype(np.float64)).max())
        d.append(lq - lb)
        r = np.exp(lq - lb)
        k3.append(r - 1 - (lq - lb))
        kl.append((np.exp(rows_b) * (rows_b - rows_q)).sum(axis=1))
    for s in sb:
        ids = prompts[s.index] + [int(t) for t in s.token_ids]
        lq, _ = score(q8_path, ids, PROMPT, tmp)
        self_q.append(np.abs(lq - s.logprobs.astype(np.float64)).max())
    d, k3, kl = np.concatenate(d), np.concatenate(k3), np.concatenate(kl)
    return {"tokens": int(d.size), "mean_abs_dlogprob": float(np.abs(d).mean()),
            "max_abs_dlogprob": float(np.abs(d).max()), "mean_dlogprob": float(d.mean()),
            "mean_k3_kl": float(k3.mean()), "mean_exact_kl": float(kl.mean()),
            "check_bf16_daemon_vs_scoring_max": float(max(self_b)),
            "check_q8_0_daemon_vs_scoring_max": float(max(self_q))}


def decode_rate(c, batch, rng, vocab):
    prompts = [[int(x) for x in rng.integers(10, min(vocab, 30000), PROMPT)] for _ in range(batch)]
    t0 = time.perf_counter()
    out = c.generate(prompts, max_tokens=NEW, temperature=1.0, ignore_eos=True)
    wall = time.perf_counter() - t0
    dec = statistics.median((s.total_us - s.first_token_us) / 1e6 for s in out)
    assert all(len(s.token_ids) == NEW for s in out), [len(s.token_ids) for s in out]
    return batch * (NEW - 1) / dec, batch * NEW / wall


def bench_model(model, tmp):
    name = os.path.basename(model)
    hf_dir = os.path.join(tmp, "bf16")
    w = export_bf16(model, hf_dir)
    paths = {}
    for q in SERVES:
        paths[q] = os.path.join(tmp, f"{q}.gguf")
        quant_gguf(model, paths[q], q)
    res = {"model": name, "rounds": ROUNDS, "push_bytes": 0}
    daemons = {"bf16": Daemon("--serve-dtype", "as_pushed", *DAEMON_FLAGS, model=model, timeout=120)}
    for q in SERVES:
        daemons[q] = Daemon("--serve-dtype", q, *DAEMON_FLAGS, model=model, timeout=120)
    clients = {}
    try:
        for k, d in daemons.items():
            clients[k] = Client(d.url).__enter__()
        cl, ca = clients, clients["bf16"]
        vocab = ca.info.vocab_size
        prep = ca.prepare(w)
        res["push_bytes"] = prep.total_bytes
        waits = {k: [] for k in cl}
        ver = {k: c.info.weight_version for k, c in cl.items()}
        for _ in range(ROUNDS):
            for k in cl:
                ver[k] += 1
                r = cl[k].push_weights(prep, ver[k])
                waits[k].append(r.wait_us / 1e3)
        res["commit_to_serving_ms"] = waits
        res["weights_bytes"] = {k: c.status()["memory"]["weights_bytes"] for k, c in cl.items()}
        res["weights_bytes_by_dtype"] = {k: c.status()["memory"].get("weights_bytes_by_dtype")
                                         for k, c in cl.items()}
        rng = np.random.default_rng(26)
        for k in cl:
            decode_rate(cl[k], 1, rng, vocab)      # warm-up
        rates = {k: {b: [] for b in BATCHES} for k in cl}
        walls = {k: {b: [] for b in BATCHES} for k in cl}
        loads = []
        for rnd in range(ROUNDS):
            order = list(cl) if rnd % 2 == 0 else list(cl)[::-1]
            for b in BATCHES:
                for k in order:
                    r, wr = decode_rate(cl[k], b, rng, vocab)
                    rates[k][b].append(r)
                    walls[k][b].append(wr)
            loads.append(os.getloadavg()[0])
            print(f"  {name} round {rnd + 1}/{ROUNDS}: " + ", ".join(
                f"b{b} " + "/".join(f"{rates[k][b][-1]:.1f}" for k in cl) for b in BATCHES)
                + f" tok/s ({'/'.join(cl)}), load {loads[-1]:.2f}", flush=True)
        res["decode_tok_s"] = rates
        res["wall_tok_s"] = walls
        res["loadavg_1m"] = loads
        res["tis"] = {q: tis(ca, cl[q], vocab, hf_dir, paths[q], tmp, np.random.default_rng(7)) for q in SERVES}
    finally:
        for c in clients.values():
            c.__exit__(None, None, None)
        for d in daemons.values():
            d.proc.terminate()
            d.proc.wait(timeout=60)
    return res


def report(res):
    print(f"\n{res['model']}: bf16 push of {res['push_bytes'] / 1e6:.0f} MB, {res['rounds']} rounds, "
          f"load average {min(res['loadavg_1m']):.2f}-{max(res['loadavg_1m']):.2f}")
    wb = res["weights_bytes"]
    print("  weights_bytes: bf16 " + str(wb["bf16"]) + "".join(
        f", {q} {wb[q]} ({wb[q] / wb['bf16']:.3f}x)" for q in SERVES))
    cm = res["commit_to_serving_ms"]
    print("  COMMIT to serving ms (median, min-max): " + ", ".join(
        f"{k} {statistics.median(v):.0f} ({min(v):.0f}-{max(v):.0f})" for k, v in cm.items()))
    for q in SERVES:
        print(f"  {'batch':>5} {'bf16 tok/s':>11} {q + ' tok/s':>11} {q + '/bf16':>10}   (decode steps; median over "
              f"rounds)")
        for b in BATCHES:
            x = statistics.median(res["decode_tok_s"]["bf16"][b])
            y = statistics.median(res["decode_tok_s"][q][b])
            ratios = [v / p for p, v in zip(res["decode_tok_s"]["bf16"][b], res["decode_tok_s"][q][b])]
            print(f"  {b:>5} {x:11.1f} {y:11.1f} {y / x:10.2f}   (per round {min(ratios):.2f}-{max(ratios):.2f})")
        t = res["tis"][q]
        print(f"  TIS {q}, {t['tokens']} bf16-sampled tokens: mean |dlogprob| {t['mean_abs_dlogprob']:.4f}, max "
              f"{t['max_abs_dlogprob']:.4f}, mean dlogprob {t['mean_dlogprob']:+.4f}, mean K3 KL "
              f"{t['mean_k3_kl']:.2e}, exact mean KL {t['mean_exact_kl']:.2e}")
        print(f"  checks: bf16 daemon vs bf16 scoring max |d| {t['check_bf16_daemon_vs_scoring_max']:.1e}, "
              f"{q} daemon vs {q} scoring max |d| {t['check_q8_0_daemon_vs_scoring_max']:.1e}")


def gemm_profile(reps=2):
    """The GEMM alone (rollout-gemmbench: one thread, its CPU time, weights streamed from DRAM), bf16 and
    Q8_0 alternating: {type: {rows: [G weights/s per rep]}}, which says how much of the bytes' 1.88x the
    decoders turn into speed, independent of the machine's load."""
    out = {"bf16": {}, "q8_0": {}}
    for _ in range(reps):
        for t in out:
            txt = subprocess.run([os.path.join(BUILD, "rollout-gemmbench"), "--type", t, "--rows", "1,8,32"],
                                 check=True, capture_output=True, text=True).stdout
            for line in txt.splitlines():
                f = line.split()
                if f and f[0].startswith("M=") and f[1] == t:
                    out[t].setdefault(int(f[0][2:]), []).append(float(f[2]))
    return out


def main():
    models = os.environ.get("MODELS")
    models = models.split(",") if models else [DEFAULT] + ([GEMMA3] if os.path.exists(GEMMA3) else [])
    out = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "nproc": os.cpu_count(), "models": []}
    for m in models:
        tmp = tempfile.mkdtemp(prefix="rd-bench-quant-")
        try:
            res = bench_model(m, tmp)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        out["models"].append(res)
        report(res)
    g = out["gemm"] = gemm_profile()
    print("\nThe GEMM alone (rollout-gemmbench, 1 thread, CPU time, best of 7 per run), G weights/s:")
    for m in sorted(g["bf16"]):
        b, q = g["bf16"][m], g["q8_0"][m]
        print(f"  M={m:<3} bf16 {' '.join(f'{x:.2f}' for x in b)}   q8_0 {' '.join(f'{x:.2f}' for x in q)}   "
              f"q8_0/bf16 {max(q) / max(b):.2f}")
    with open(os.path.join(BUILD, "bench-quant.json"), "w") as f:
        json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
