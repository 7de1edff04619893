"""transformers as a second oracle (issue 47): the HF folders rolloutd reads and writes load with
AutoModelForCausalLM.from_pretrained, and transformers' fp32 logits equal rolloutd's on the same tokens
within fp32 summation-order noise, for every family; then the numbers RL users quote for a rollout
engine against their trainer, measured between transformers and rolloutd on the default model.

- The tiny model of each family (Llama 2 and 3, Qwen2, Qwen3, Qwen3-MoE, Gemma 3; their HF folders from
  tests/gen_testdata.sh, the Llama 2 one exported by rollout-export): transformers' fp32 logits within
  1e-4 of build/rollout-logits' at every position of a 40-token prompt, the same argmax everywhere.
- The default model (its Q4_1 weights exported as f32 HF tensors: the values the daemon serves) and
  Gemma 3 270M: within 2e-3 of rollouts' logits (30 and 18 layers of fp32 at vocabularies of 49152
  and 262144), the same argmax wherever the top two are 1e-2 apart.
- The mismatch: 32 rollouts of the default model from the daemon (greedy and T = 1, n = 4, 8 to 32
  tokens) rescored by transformers in fp32 and under bf16 autocast: the log-probs of the sampled
  tokens against the daemon's, max |dlogprob| and the K3 KL estimator (mean of r - 1 - log r, r the
  ratio of trainer to rollout probabilities), printed and written to RD_TMP/transformers-mismatch.json.
  fp32 must be below 1e-3 and 1e-6; bf16 is stated (it is the usual trainer's setting)."""
import json
import os
import subprocess
import sys

import numpy as np

from harness import BUILD, MODEL, ROOT, TMP, case, main, run
from rdtest import Daemon, stop_cleanly

sys.path.insert(0, os.path.join(ROOT, "tools", "python"))
from rolloutd import Client  # noqa: E402

import torch  # noqa: E402
from transformers import AutoModelForCausalLM  # noqa: E402

torch.set_grad_enabled(False)
torch.set_num_threads(2)
DATA = os.path.join(BUILD, "testdata")
WORK = os.path.join(TMP, "test_transformers")
os.makedirs(WORK, exist_ok=True)
GEMMA3 = os.path.join(ROOT, "models", "gemma-3-270m-q4_k_m.gguf")
_exports = {}


def export(src, name, dtype="f32"):
    """rollout-export of src as an HF folder (once per run)."""
    if name not in _exports:
        out = os.path.join(WORK, name)
        run([os.path.join(BUILD, "rollout-export"), "--model", src, "--out", out, "--dtype", dtype])
        _exports[name] = out
    return _exports[name]


def rd_logits(model, ids):
    out = os.path.join(WORK, "logits.bin")
    run([os.path.join(BUILD, "rollout-logits"), "--model", model, "--prompt-ids", ",".join(map(str, ids)),
         "--out", out])
    return np.fromfile(out, dtype="<f4").reshape(len(ids), -1)


def hf_model(folder, dtype=torch.float32):
    m = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype)
    m.eval()
    return m


def hf_logits(m, ids):
    return m(torch.tensor([ids])).logits[0].float().numpy()


def prompt(n, vocab, seed):
    return [1] + np.random.default_rng(seed).integers(2, vocab, n - 1).tolist()


def compare(folder, ids, tol, margin=0.0):
    """max |dlogit| between transformers and rolloutd on folder, and the argmax check where the top two
    are more than margin apart."""
    rd = rd_logits(folder, ids)
    hf = hf_logits(hf_model(folder), ids)
    assert rd.shape == hf.shape, (rd.shape, hf.shape)
    d = float(np.abs(rd - hf).max())
    top2 = np.sort(hf, axis=1)[:, -2:]
    clear = top2[:, 1] - top2[:, 0] > margin
    same = rd.argmax(1) == hf.argmax(1)
    print(f"  {os.path.basename(folder)}: max |dlogit| {d:.3g} over {len(ids)} positions x {rd.shape[1]}, "
          f"argmax equal at {int(same.sum())}/{len(ids)}")
    assert d < tol, f"{folder}: transformers and rolloutd differ by {d} (> {tol})"
    assert same[clear].all(), f"{folder}: argmax differs at {np.nonzero(~same & clear)[0].tolist()}"
    return d


@case
def every_tiny_family_equals_transformers_fp32():
    folders = [os.path.join(DATA, f + ".hf") for f in ("tiny-llama3", "tiny-qwen2", "tiny-qwen3", "tiny-gemma3",
                                                        "tiny-moe-f32")]
    folders.append(export(os.path.join(DATA, "tiny-f32.gguf"), "tiny-llama2.hf"))
    for k, f in enumerate(folders):
        with open(os.path.join(f, "config.json")) as c:
            vocab = json.load(c)["vocab_size"]
        compare(f, prompt(40, vocab, k), 1e-4)


@case
def the_default_model_and_gemma3_equal_transformers_fp32():
    compare(export(MODEL, "default-f32.hf"), prompt(48, 49152, 7), 2e-3, margin=1e-2)
    compare(export(GEMMA3, "gemma3-f32.hf"), prompt(32, 262144, 8), 2e-3, margin=1e-2)


def log_softmax(z):
    z = z - z.max(-1, keepdims=True)
    return z - np.log(np.exp(z).sum(-1, keepdims=True))


def mismatch(m, groups, autocast):
    """max |dlogprob| and K3 KL of the trainer (m) against the rollouts' log-probs of the sampled tokens;
    groups: (prompt, samples of one length), each one batch through m."""
    diffs = []
    for prompt_ids, samples in groups:
        ids = np.array([list(prompt_ids) + s.token_ids.tolist() for s in samples])
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            z = m(torch.from_numpy(ids)).logits.float().numpy()
        lp = log_softmax(z.astype(np.float64))
        n = len(prompt_ids)
        for b, s in enumerate(samples):
            trainer = lp[b, np.arange(n - 1, ids.shape[1] - 1), ids[b, n:]]
            diffs.append(trainer - s.logprobs.astype(np.float64))
    d = np.concatenate(diffs)
    k3 = float(np.mean(np.exp(d) - 1.0 - d))
    return float(np.abs(d).max()), k3, int(d.size)


@case
def the_mismatch_transformers_vs_rolloutd_default_model():
    folder = export(MODEL, "default-f32.hf")
    d = Daemon(model=MODEL, timeout=120)
    try:
        prompts = [[1, 504, 3458, 282, 260, 2723, 15141, 314, 4250, 3028, 30],
                   [1, 9690, 198, 2683, 359, 253, 5356, 5646, 11173, 30],
                   [1, 504, 3458, 282, 2114, 15, 2114, 30],
                   [1, 1489, 314, 260, 1345, 282, 4250, 47]]
        groups = []
        with Client(d.url) as c:
            for k, p in enumerate(prompts):
                n_tok = (8, 16, 24, 32)[k]
                sampled = c.generate([p], n=4, max_tokens=n_tok, temperature=1.0, seed=k, ignore_eos=True)
                greedy = c.generate([p] * 4, max_tokens=n_tok, temperature=0.0, ignore_eos=True)
                groups.append((p, sampled + greedy))
    finally:
        stop_cleanly(d)
    assert sum(len(g) for _, g in groups) == 32
    m = hf_model(folder)
    out = {"samples": 32}
    for name, autocast in (("fp32", False), ("bf16_autocast", True)):
        mx, k3, n = mismatch(m, groups, autocast)
        out[name] = {"max_abs_dlogprob": mx, "k3_kl": k3, "tokens": n}
        print(f"  transformers {name} vs rolloutd: max |dlogprob| {mx:.3g}, K3 KL {k3:.3g} over {n} tokens")
    with open(os.path.join(TMP, "transformers-mismatch.json"), "w") as f:
        json.dump(out, f, indent=1)
    assert out["fp32"]["max_abs_dlogprob"] < 1e-3 and out["fp32"]["k3_kl"] < 1e-6, out
    assert out["bf16_autocast"]["k3_kl"] > out["fp32"]["k3_kl"], "bf16 autocast changed nothing: autocast is off"


if __name__ == "__main__":
    main()
