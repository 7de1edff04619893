#!/usr/bin/env python3
"""A training step with rolloutd.torch (exact log-probs) against the same step in transformers (make bench-learner),
side by side in one run.

The default model's f32 export, one batch of --batch sequences of --len tokens (random ids), the loss
-sum(w * token log-probs) / batch with fixed random weights w. A step is: the optimizer's step (AdamW),
the log-probs, the backward. For rolloutd.torch that includes copying the stepped parameters into its
engine (the first forward after a step does) and the engine's forward; for transformers its forward.
Steps alternate between the two, --reps each after one warm-up of each; the medians and their ratio
are printed and written to build/bench-learner.json (target: exact <= 1.5x)."""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tools", "python"))
import numpy as np  # noqa: E402
import torch  # noqa: E402

MODEL = os.path.join(ROOT, "models", "SmolLM2-135M-Instruct.Q4_1.gguf")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--len", type=int, default=48)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    import rolloutd.torch as rt
    from transformers import AutoModelForCausalLM
    tmp = tempfile.mkdtemp(prefix="rd-bench-learner-")
    export = os.path.join(tmp, "policy")
    subprocess.run([os.path.join(ROOT, "build", "rollout-export"), "--model", MODEL, "--out", export], check=True,
                   capture_output=True)
    exact = rt.from_pretrained(export, threads=a.threads)
    hf = AutoModelForCausalLM.from_pretrained(export, dtype=torch.float32)
    rng = np.random.default_rng(0)
    seqs = [[1] + rng.integers(2, 49152, a.len - 1).tolist() for _ in range(a.batch)]
    w = torch.from_numpy(rng.standard_normal((a.batch, a.len - 1)).astype(np.float32))
    ids = torch.tensor(seqs)
    opt_e = torch.optim.AdamW(exact.parameters(), lr=1e-6)
    opt_h = torch.optim.AdamW(hf.parameters(), lr=1e-6)

    def step_exact():
        opt_e.step()
        opt_e.zero_grad()
        lp = exact.token_logprobs(ids)
        (-(w * lp).sum() / a.batch).backward()

    def step_hf():
        opt_h.step()
        opt_h.zero_grad()
        z = hf(ids).logits.float()
        lp = torch.log_softmax(z[:, :-1], -1).gather(-1, ids[:, 1:, None]).squeeze(-1)
        (-(w * lp).sum() / a.batch).backward()

    times = {"exact": [], "transformers": []}
    for rep in range(a.reps + 1):
        for name, fn in (("exact", step_exact), ("transformers", step_hf)):
            t0 = time.perf_counter()
            fn()
            if rep:
                times[name].append(time.perf_counter() - t0)
    med = {k: statistics.median(v) for k, v in times.items()}
    ratio = med["exact"] / med["transformers"]
    print(f"batch {a.batch} x {a.len} tokens, {a.threads} threads, {a.reps} steps each (interleaved)")
    for k in times:
        print(f"  {k:<13} median {med[k]:.2f} s  ({', '.join(f'{t:.2f}' for t in times[k])})")
    print(f"  exact / transformers: {ratio:.2f}x")
    with open(os.path.join(ROOT, "build", "bench-learner.json"), "w") as f:
        json.dump({"batch": a.batch, "len": a.len, "threads": a.threads, "seconds": times, "median_s": med,
                   "ratio": ratio, "loadavg_1m": os.getloadavg()[0]}, f, indent=1)


if __name__ == "__main__":
    main()
