"""rolloutd.torch (issue 47): a PyTorch module whose forward is rolloutd's own engine in the learner's process
and whose backward is PyTorch's, so a trainer's log-probs equal the rollouts' bit for bit.

- Exact, fp32: 32 rollouts of the default model from the daemon (greedy and T = 1 with n = 4, 8 to 40
  tokens, several prompts): the module, built from the f32 export of the same weights, gives the
  float32 bits of every sampled token's log-prob the daemon returned (output_token_logprobs).
- Exact, bf16: the module in bf16, its parameters pushed to the daemon as they are (Pool.push_tensors,
  torch tensors): the same, on the new rollouts (whose results say the pushed version).
- After an optimizer step (AdamW on a policy-gradient loss) and a push of the stepped parameters: the same
  again, and the log-probs moved.
- Gradients: the module's gradients of a weighted sum of log-probs equal transformers' autograd on the
  same weights within 1e-4 relative per tensor (every parameter of the default model); the values differ
  from transformers' by fp32 rounding only.
- forward(input_ids): the logits of rollout-logits (the runner's prefill), bit for bit, [B, T, vocab].
- Every family: the tiny Llama 3, Qwen2, Qwen3, Gemma 3 and Qwen3-MoE models served from their HF folders:
  the module's log-probs of 6 sampled rollouts each are the daemon's bits.
The daemon ends with SIGTERM and must exit 0."""
import os
import sys

import numpy as np

from harness import BUILD, MODEL, ROOT, TMP, case, main, run
from rdtest import Daemon, stop_cleanly

sys.path.insert(0, os.path.join(ROOT, "tools", "python"))
import torch  # noqa: E402
import rolloutd.torch as rt  # noqa: E402
from rolloutd import Client, Pool  # noqa: E402

torch.set_num_threads(2)
WORK = os.path.join(TMP, "test_rolloutd_torch")
os.makedirs(WORK, exist_ok=True)
PROMPTS = [[1, 504, 3458, 282, 260, 2723, 15141, 314, 4250, 3028, 30],
           [1, 9690, 198, 2683, 359, 253, 5356, 5646, 11173, 30],
           [1, 504, 3458, 282, 2114, 15, 2114, 30],
           [1, 1489, 314, 260, 1345, 282, 4250, 47]]
_state = {}


def export():
    if "export" not in _state:
        out = os.path.join(WORK, "default-f32.hf")
        run([os.path.join(BUILD, "rollout-export"), "--model", MODEL, "--out", out, "--dtype", "f32"])
        _state["export"] = out
    return _state["export"]


def daemon():
    if "d" not in _state:
        _state["d"] = Daemon(model=MODEL, timeout=120)
    return _state["d"]


def rollouts(c, version=None):
    """32 samples: per prompt 4 seeded T = 1 and 4 greedy, lengths 8, 16, 24, 40."""
    out = []
    for k, p in enumerate(PROMPTS):
        n = (8, 16, 24, 40)[k]
        out += [(p, s) for s in c.generate([p], n=4, max_tokens=n, temperature=1.0, seed=10 + k, ignore_eos=True)]
        out += [(p, s) for s in c.generate([p] * 4, max_tokens=n, temperature=0.0, ignore_eos=True)]
    assert len(out) == 32
    if version is not None:
        assert all(s.version_admit == version and s.version_finish == version for _, s in out), \
            [(s.version_admit, s.version_finish) for _, s in out][:4]
    return out


def trainer_logprobs(policy, samples):
    """The module's log-probs of each sample's generated tokens (one batched call)."""
    seqs = [list(p) + s.token_ids.tolist() for p, s in samples]
    lps = policy.token_logprobs(seqs)
    return [lp[len(p) - 1:] for (p, _), lp in zip(samples, lps)]


def assert_exact(policy, samples):
    got = trainer_logprobs(policy, samples)
    bad = [(i, float((g.detach().numpy().astype(np.float64) - s.logprobs).__abs__().max()))
           for i, ((_, s), g) in enumerate(zip(samples, got))
           if not np.array_equal(g.detach().numpy().view(np.uint32), s.logprobs.view(np.uint32))]
    assert not bad, f"{len(bad)} of {len(samples)} rollouts differ from the trainer's log-probs: {bad[:4]}"
    return got


@case
def exact_fp32_equals_the_daemons_logprobs():
    policy = rt.from_pretrained(export(), dtype=torch.float32)
    with Client(daemon().url) as c:
        assert_exact(policy, rollouts(c, version=0))


@case
def exact_bf16_after_a_push_of_the_modules_parameters():
    policy = rt.from_pretrained(export(), dtype=torch.bfloat16)
    with Pool([daemon().url]) as pool:
        pool.push_tensors(policy.named_parameters(), version=1)
    with Client(daemon().url) as c:
        assert_exact(policy, rollouts(c, version=1))


@case
def exact_after_an_optimizer_step_and_a_push():
    policy = rt.from_pretrained(export(), dtype=torch.float32)
    with Pool([daemon().url]) as pool:
        pool.push_tensors(policy.named_parameters(), version=2)
        with Client(daemon().url) as c:
            samples = rollouts(c, version=2)
        before = assert_exact(policy, samples)
        # a policy-gradient step: advantages +1 / -1 by group half, AdamW
        opt = torch.optim.AdamW(policy.parameters(), lr=1e-4)
        lps = trainer_logprobs(policy, samples)
        loss = -sum((1.0 if i % 8 < 4 else -1.0) * lp.sum() for i, lp in enumerate(lps)) / 32
        loss.backward()
        opt.step()
        pool.push_tensors(policy.named_parameters(), version=3)
        with Client(daemon().url) as c:
            after = rollouts(c, version=3)
        assert_exact(policy, after)
        moved = max(float((a.detach() - b.detach()).abs().max()) for a, b in zip(trainer_logprobs(policy, samples),
                                                                               before))
        assert moved > 1e-4, f"the step moved no log-prob ({moved})"


@case
def gradients_equal_transformers_autograd():
    from transformers import AutoModelForCausalLM
    policy = rt.from_pretrained(export(), dtype=torch.float32)
    ref = AutoModelForCausalLM.from_pretrained(export(), dtype=torch.float32)
    rng = np.random.default_rng(3)
    seqs = [[1] + rng.integers(2, 49152, n - 1).tolist() for n in (12, 20, 31)]
    w = [torch.from_numpy(rng.standard_normal(len(s) - 1).astype(np.float32)) for s in seqs]
    lps = policy.token_logprobs(seqs)
    sum((a * b).sum() for a, b in zip(lps, w)).backward()
    total, worst = 0, (0.0, "")
    for s, ww, lp in zip(seqs, w, lps):
        ids = torch.tensor([s])
        z = ref(ids).logits.float()
        r = torch.log_softmax(z[0, :-1], -1).gather(-1, ids[0, 1:, None]).squeeze(-1)
        d = float((r.detach() - lp.detach()).abs().max())
        assert d < 1e-3, f"the module's values are more than fp32 rounding from transformers' ({d})"
        total = total + (r * ww).sum()
    total.backward()
    mine = dict(policy.hf.named_parameters())
    n = 0
    for name, p in ref.named_parameters():
        g, h = mine[name].grad, p.grad
        rel = float((g - h).norm() / h.norm().clamp_min(1e-30))
        worst = max(worst, (rel, name))
        n += 1
    print(f"  {n} parameter gradients; the largest relative difference {worst[0]:.3g} ({worst[1]})")
    assert worst[0] < 1e-4, worst


@case
def forward_gives_the_runners_logits():
    policy = rt.from_pretrained(export(), dtype=torch.float32)
    ids = torch.tensor([PROMPTS[2], PROMPTS[3]])
    z = policy(ids)
    assert z.shape == (2, 8, 49152) and z.dtype == torch.float32
    for b in range(2):
        out = os.path.join(WORK, "logits.bin")
        run([os.path.join(BUILD, "rollout-logits"), "--model", export(), "--prompt-ids",
             ",".join(map(str, PROMPTS[2 + b])), "--out", out])
        want = np.fromfile(out, dtype="<f4").reshape(8, -1)
        assert np.array_equal(z[b].detach().numpy().view(np.uint32), want.view(np.uint32))
    z.sum().backward()
    assert policy.hf.model.embed_tokens.weight.grad is not None


@case
def exact_on_every_dense_family_and_the_moe():
    """The tiny model of each family served by a daemon from its HF folder: the module on the same folder
    gives every sampled token's log-prob bits (Qwen3-MoE too: the values are the engine's, routing included)."""
    for fam in ("tiny-llama3", "tiny-qwen2", "tiny-qwen3", "tiny-gemma3", "tiny-moe-f32"):
        folder = os.path.join(BUILD, "testdata", fam + ".hf")
        d = Daemon(model=folder, timeout=120)
        try:
            prompts = [[1, 17, 42, 99, 7], [1, 250, 3, 18, 77, 5, 123]]
            with Client(d.url) as c:
                samples = [(p, s) for p in prompts
                           for s in c.generate([p], n=3, max_tokens=12, temperature=1.0, seed=4, ignore_eos=True)]
            assert_exact(rt.from_pretrained(folder), samples)
        finally:
            stop_cleanly(d)


@case
def zz_stop():
    if "d" in _state:
        stop_cleanly(_state.pop("d"))


if __name__ == "__main__":
    main()
