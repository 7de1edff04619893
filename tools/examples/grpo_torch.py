#!/usr/bin/env python3
"""GRPO with a PyTorch trainer against rolloutd (make example-grpo): the trainer's log-probs either equal
the rollouts' bit for bit (--policy exact: rolloutd.torch) or are transformers' (--policy transformers).

Starts build/rolloutd with the default model (configs/rolloutd.json, free loopback ports), exports the
same weights as f32 HF tensors (rollout-export) for the trainer, and runs --steps steps of:
  1. rollouts: --prompts arithmetic questions ("What is a + b? Answer with just the number.", the chat
     template applied by the daemon's /tokenize), n = --n samples each at T = 1;
  2. rewards: 1 for the right sum (the number after the last "=" or "answer is", else the first one),
     plus the fraction of the answer's characters that are digits (answer with numbers, not prose);
     advantages: the reward minus its group's mean, over the group's std (+ 1e-4);
  3. a policy-gradient step on the mean over samples of -advantage x the sample's mean token log-prob
     (one step per batch: on-policy, the importance ratio is 1), AdamW (--lr);
  4. the new weights pushed to the daemon (the module's parameters as they are: fp32, or bf16 with
     --dtype bf16), as the next version: Pool.push_tensors, or with --push delta (the default for
     bf16) Pool.push_weights sending deltas against the last push.
One line per step (--json: one JSON object per line): reward mean, the trainer's log-probs of the sampled
tokens against the rollouts' (max |dlogprob| and the K3 KL estimator, mean of r - 1 - log r with r the
trainer's probability over the rollout's), the rollout, train and push seconds, and the version the
daemon served the step's rollouts at. In exact mode K3 is 0 and max |dlogprob| 0 at every step.

Why this task: a 135M instruct model rarely gets a two-digit sum right and mostly answers with prose
("Awesome! I'd be happy to..."), so the sum alone gives groups with no variance (GRPO learns nothing from
them); the digit fraction is dense (every sample has some, and they differ within a group from the first
step), it is what the prompt asks for, a few steps of AdamW can move it on two cores, and it is checked
from the tokens alone.

    tools/examples/grpo_torch.py [--policy exact|transformers] [--steps 10] [--prompts 8] [--n 4]
                                 [--max-tokens 12] [--lr 3e-5] [--dtype f32|bf16] [--seed 1] [--json]"""
import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tools", "python"))
sys.path.insert(0, os.path.join(ROOT, "tools"))
import torch  # noqa: E402
from demo_learner import Detokenizer, free_port, questions, wait_health  # noqa: E402
from demo_learner import reward as correct  # noqa: E402
from rolloutd import Pool  # noqa: E402

MODEL = os.path.join(ROOT, "models", "SmolLM2-135M-Instruct.Q4_1.gguf")


def reward(text, answer):
    """1 for the right sum (demo_learner's rule: the number after the last '=' or "answer is", else the first
    number), plus the fraction of the answer's non-space characters that are digits."""
    chars = [ch for ch in text if not ch.isspace()]
    return correct(text, answer) + (sum(ch.isdigit() for ch in chars) / len(chars) if chars else 0.0)


def tokenize_chat(status, question):
    body = json.dumps({"messages": [{"role": "user", "content": question}]}).encode()
    req = urllib.request.Request(f"http://{status}/tokenize", data=body, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as r:
        return json.loads(r.read())["tokens"]


def hf_logprobs(hf, seqs):
    """transformers' log-prob of each token given the ones before, per sequence (right-padded batch)."""
    T = max(len(s) for s in seqs)
    ids = torch.zeros((len(seqs), T), dtype=torch.long)
    for b, s in enumerate(seqs):
        ids[b, :len(s)] = torch.as_tensor(s)
    lp = torch.log_softmax(hf(ids).logits.float()[:, :-1], -1).gather(-1, ids[:, 1:, None]).squeeze(-1)
    return [lp[b, :len(s) - 1] for b, s in enumerate(seqs)]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--policy", default="exact", choices=["exact", "transformers"])
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--n", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=12)
    ap.add_argument("--lr", type=float, default=3e-5)
    ap.add_argument("--dtype", default="f32", choices=["f32", "bf16"])
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--threads", type=int, default=2, help="the trainer's torch threads")
    ap.add_argument("--push", default="auto", choices=["auto", "full", "delta"],
                    help="full: Pool.push_tensors (nothing kept); delta: Pool.push_weights with deltas against the "
                         "last push (keeps a copy of the pushed bytes); auto: delta for bf16 (an AdamW step changes "
                         "few bf16 values), full for f32 (it changes nearly every f32 value)")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    torch.manual_seed(a.seed)
    torch.set_num_threads(a.threads)
    dtype = torch.float32 if a.dtype == "f32" else torch.bfloat16
    delta = a.push == "delta" or (a.push == "auto" and a.dtype == "bf16")
    tmp = tempfile.mkdtemp(prefix="rd-grpo-")
    export = os.path.join(tmp, "policy")
    subprocess.run([os.path.join(ROOT, "build", "rollout-export"), "--model", MODEL, "--out", export, "--dtype",
                    "f32"], check=True, capture_output=True)
    if a.policy == "exact":
        import rolloutd.torch as rt
        policy = rt.from_pretrained(export, dtype=dtype)
        params, logprobs = policy.engine_state, policy.token_logprobs
    else:
        from transformers import AutoModelForCausalLM
        policy = AutoModelForCausalLM.from_pretrained(export, dtype=dtype)
        params, logprobs = policy.named_parameters, (lambda seqs: hf_logprobs(policy, seqs))
    opt = torch.optim.AdamW(policy.parameters(), lr=a.lr, weight_decay=0.0)
    detok = Detokenizer(MODEL)
    url, status = f"tcp://127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"
    proc = subprocess.Popen([os.path.join(ROOT, "build", "rolloutd"), "--config",
                             os.path.join(ROOT, "configs", "rolloutd.json"), "--model", MODEL, "--listen", url,
                             "--status-listen", status], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    rewards, rc = [], 1
    try:
        wait_health(status, proc)
        with Pool([url]) as pool:
            version = 0
            if a.dtype == "bf16":   # the daemon serves what the trainer holds from the start
                version = 1
                pool.push_tensors(params(), version=version)
            for step in range(1, a.steps + 1):
                qs = questions(a.prompts, a.seed * 1000 + step)
                prompts = [tokenize_chat(status, q) for q, _ in qs]
                t0 = time.perf_counter()
                samples = pool.generate(prompts, n=a.n, max_tokens=a.max_tokens, temperature=1.0,
                                        seed=a.seed * 1000 + step)
                t1 = time.perf_counter()
                groups = {}
                for s in samples:
                    groups.setdefault(s.index, []).append(s)
                seqs, adv, rs, rollout_lp = [], [], [], []
                for i, g in sorted(groups.items()):
                    r = np.array([reward(detok.decode(s.token_ids[:len(s.token_ids) - (s.finish_reason == "stop")]),
                                         qs[i][1]) for s in g])
                    rs += r.tolist()
                    adv += ((r - r.mean()) / (r.std() + 1e-4)).tolist()
                    for s in g:
                        seqs.append((len(prompts[i]), list(prompts[i]) + s.token_ids.tolist()))
                        rollout_lp.append(s.logprobs.astype(np.float64))
                lps = logprobs([x for _, x in seqs])
                comp = [lp[n - 1:] for (n, _), lp in zip(seqs, lps)]
                d = np.concatenate([c.detach().double().numpy() - r for c, r in zip(comp, rollout_lp)])
                k3 = float(np.mean(np.exp(d) - 1.0 - d))
                loss = -sum(A * c.mean() for A, c in zip(adv, comp)) / len(comp)
                opt.zero_grad()
                loss.backward()
                opt.step()
                t2 = time.perf_counter()
                version += 1
                if delta:
                    pool.push_weights({n: t.detach() for n, t in params()}, version)
                else:
                    pool.push_tensors(params(), version=version)
                t3 = time.perf_counter()
                lp_push = getattr(pool, "last_push", None) or {}
                served = sorted({s.version_finish for s in samples})
                rewards.append(float(np.mean(rs)))
                row = {"step": step, "reward_mean": rewards[-1], "k3_kl": k3, "max_abs_dlogprob": float(np.abs(d).max()),
                       "rollout_s": t1 - t0, "train_s": t2 - t1, "push_s": t3 - t2, "rollout_version": served,
                       "pushed_version": version, "tokens": int(d.size),
                       "push_kind": lp_push.get("kind", "full") if delta else "full",
                       "push_wire_mb": (lp_push.get("wire_bytes", 0) / 1e6) if delta else None}
                if a.json:
                    print(json.dumps(row), flush=True)
                else:
                    how = f" ({row['push_kind']}, {row['push_wire_mb']:.1f} MB)" if delta else ""
                    print(f"step {step:3d}  reward {rewards[-1]:.3f}  K3 {k3:.3g}  max|dlp| {row['max_abs_dlogprob']:.3g}"
                          f"  rollout {row['rollout_s']:.1f}s train {row['train_s']:.1f}s push {row['push_s']:.1f}s{how}"
                          f"  rollouts at v{'/'.join(map(str, served))} -> v{version}", flush=True)
        k = min(3, len(rewards))
        first, last = float(np.mean(rewards[:k])), float(np.mean(rewards[-k:]))
        summary = {"policy": a.policy, "dtype": a.dtype, "seed": a.seed, "steps": a.steps,
                   "first_3_reward": first, "last_3_reward": last}
        print(json.dumps(summary) if a.json else
              f"reward: first {k} steps {first:.3f}, last {k} steps {last:.3f} ({a.policy}, {a.dtype}, seed {a.seed})",
              flush=True)
        rc = 0
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            code = proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            code = -1
        if code != 0:
            print(f"rolloutd exited with {code}", file=sys.stderr)
            rc = 1
    return rc


if __name__ == "__main__":
    sys.exit(main())
