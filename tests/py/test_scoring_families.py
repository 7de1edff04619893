"""Scoring (issue 45) on every model family: SGLang's /generate with logprob_start_len and
max_new_tokens 0 (test_scoring.py checks the door itself on the default model).

For the tiny random models of tests/gen_testdata.sh, one daemon each: llama (tiny-f32), Llama 3
RoPE scaling (tiny-llama3, Q4_1), qwen2 (q|k|v biases, Q8_0), qwen3 (QK-norm, F16), gemma3 (window
8, Q8_0) and qwen3moe (tiny-moe-f32: 16 experts, top 4); and Gemma 3 270M when its file is there
(models/gemma-3-270m-q4_k_m.gguf, `make model-gemma3`; otherwise a SKIP line):
  (a) rescoring is exact: 36 seeded rollouts a model (4 prompts x greedy, T=1 with n=4, top_p 0.9
      with n=4; 40 tokens each, 16 on Gemma 3 270M) scored as prompt + completion from the completion's first position give
      at every completion position the float32 bits (compared as uint32) of their
      output_token_logprobs, the completion's ids; the same while 4 threads keep posting other
      generate requests, so the scoring rows share engine steps with decode rows;
  (b) the prompt log-probs of a 300-token prompt (200 on tiny-f32, whose context is 256), scored
      from position 0 (several chunks of ENG_SCORE_CHUNK rows), are within REF_TOL of log_softmax of the
      float64 NumPy reference's logits (tests/py/ref_llama.py; ref_moe.py for the MoE, on a prompt
      whose reference routing has no near tie, as test_qwen3moe.py picks them); scored again from
      a later position, the same bits there;
  (c) the MoE model returns its routed experts when scoring: a score-only request routes every
      prompt position ([n_prompt, layers, k]; all of them ran), equal to the rollout's routes
      ([n_prompt + n_tokens - 1]) on the positions both have and to the reference's routes.
Each daemon ends with SIGTERM and must exit 0 (the last case)."""
import base64
import os
import sys
import threading
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import ROOT, Skip, case, main  # noqa: E402
import ref_llama  # noqa: E402
import ref_moe  # noqa: E402

from rdtest import Daemon, status, stop_cleanly  # noqa: E402

TESTDATA = os.path.join(ROOT, os.environ.get("RD_TESTDATA", "build/testdata"))
GEMMA3 = os.environ.get("RD_GEMMA3", os.path.join(ROOT, "models", "gemma-3-270m-q4_k_m.gguf"))
REF_TOL = 1e-4       # engine log-probs vs the float64 reference (test_families' ENGINE_TOL on logits)
NEAR_TIE = 1e-6      # test_qwen3moe's: a router's k-th and (k+1)-th probabilities this close may swap
VOCAB = 300
N_PROMPT, N_GEN = 50, 40
# family: (file under TESTDATA, reference, prompt length scored against it)
FAMILIES = {
    "llama": ("tiny-f32.gguf", "dense", 200),
    "llama3": ("tiny-llama3.gguf", "dense", 300),
    "qwen2": ("tiny-qwen2.gguf", "dense", 300),
    "qwen3": ("tiny-qwen3.gguf", "dense", 300),
    "gemma3": ("tiny-gemma3.gguf", "dense", 300),
    "qwen3moe": ("tiny-moe-f32.gguf", "moe", 300),
}
SAMPLINGS = ({"temperature": 0}, {"temperature": 1.0, "sampling_seed": 3, "n": 4},
             {"temperature": 1.0, "top_p": 0.9, "sampling_seed": 4, "n": 4})
N_ROLL_PROMPTS = 4   # x 9 rollouts each: 36 seeded rollouts per model

_d = {}


def path_of(fam):
    return GEMMA3 if fam == "gemma3_270m" else os.path.join(TESTDATA, FAMILIES[fam][0])


def daemon(fam):
    if fam not in _d:
        assert os.path.exists(path_of(fam)), f"{path_of(fam)} is missing: run tests/gen_testdata.sh"
        _d[fam] = Daemon(model=path_of(fam))
    return _d[fam]


def bits(xs):
    return np.array(xs, dtype=np.float64).astype(np.float32).view(np.uint32)


def routes_of(mi, layers, k):
    return np.frombuffer(base64.b64decode(mi["routed_experts"]), dtype="<i4").reshape(-1, layers, k)


def prompt(n, seed=0):
    return np.random.default_rng(4500 + n + 7919 * seed).integers(0, VOCAB, n).tolist()


def score(d, ids, start, routes=False):
    body = {"input_ids": ids, "return_logprob": True, "logprob_start_len": start,
            "sampling_params": {"max_new_tokens": 0}}
    if routes:
        body["return_routed_experts"] = True
    st, doc = d.post("/generate", body)
    assert st == 200, doc
    assert doc["output_ids"] == [] and doc["meta_info"]["completion_tokens"] == 0, doc
    got = doc["meta_info"]["input_token_logprobs"]
    assert [t[1] for t in got] == ids[start:], (got[:3], ids[start:start + 3])
    return doc["meta_info"]


def rollouts(d, ids, n_gen, routes=False):
    out = []
    for sp in SAMPLINGS:
        body = {"input_ids": ids, "return_logprob": True,
                "sampling_params": {"max_new_tokens": n_gen, "ignore_eos": True, **sp}}
        if routes:
            body["return_routed_experts"] = True
        st, g = d.post("/generate", body)
        assert st == 200, g
        out += g if isinstance(g, list) else [g]
    assert len(out) == 9 and all(len(g["output_ids"]) == n_gen for g in out), [len(g["output_ids"]) for g in out]
    return out


def distinct_groups(sets):
    """n = 4 groups whose samples are not all the same (their own streams): the checks cover several
    completions per group there (a peaked tiny model may draw one completion four times)."""
    return sum(len({tuple(g["output_ids"]) for g in group}) > 1 for _, rs in sets for group in (rs[1:5], rs[5:]))


def check_rescored(d, ids, rs, moe=None):
    """Each rollout scored from its completion's first position: the ids and float32 bits it was
    sampled with; with moe = (layers, k), the routes of the positions both ran."""
    for g in rs:
        comp = g["output_ids"]
        mi = score(d, ids + comp, len(ids), routes=moe is not None)
        got = mi["input_token_logprobs"]
        want = [t[0] for t in g["meta_info"]["output_token_logprobs"]]
        assert [t[1] for t in g["meta_info"]["output_token_logprobs"]] == comp
        a, b = bits([t[0] for t in got]), bits(want)
        bad = np.flatnonzero(a != b)
        assert not bad.size, f"{bad.size} of {len(comp)} positions differ, first {bad[0]}: {got[bad[0]]} vs {want[bad[0]]}"
        if moe:
            r_score, r_roll = routes_of(mi, *moe), routes_of(g["meta_info"], *moe)
            n = len(ids) + len(comp)
            assert r_score.shape[0] == n and r_roll.shape[0] == n - 1, (r_score.shape, r_roll.shape)
            assert (r_score[:n - 1] == r_roll).all(), "scoring routed a position differently from the rollout"


def busy_while(d, fn, threads=4):
    """fn() while `threads` threads keep posting generate requests (until fn returns)."""
    stop, errors = threading.Event(), []

    def busy(k):
        j = 0
        while True:   # one request at least, then more until fn is done
            st, doc = d.post("/generate", {"input_ids": prompt(20 + k, seed=100 + j), "sampling_params": {
                "max_new_tokens": 64, "temperature": 1.0, "sampling_seed": 1000 * k + j, "ignore_eos": True}})
            if st != 200:
                errors.append(doc)
            j += 1
            if stop.is_set():
                break

    ts = [threading.Thread(target=busy, args=(k,)) for k in range(threads)]
    for t in ts:
        t.start()
    try:
        deadline = time.time() + 20
        while status(d)["requests"]["running"] < 1:   # the engine has other work before fn starts
            assert time.time() < deadline and not errors, ("the busy requests never ran", errors[:2])
            time.sleep(0.005)
        fn()
    finally:
        stop.set()
        for t in ts:
            t.join()
    assert not errors, errors[:2]


def moe_shape():
    m = ref_moe.load(path_of("qwen3moe"))
    return m, (m.cfg.n_layer, m.cfg.k)


def rescoring_case(fam):
    def fn():
        d = daemon(fam)
        moe = moe_shape()[1] if fam == "qwen3moe" else None
        sets = [(ids, rollouts(d, ids, N_GEN, routes=moe is not None))
                for ids in (prompt(N_PROMPT, seed=50 + j) for j in range(N_ROLL_PROMPTS))]
        assert distinct_groups(sets) >= N_ROLL_PROMPTS, "the n=4 samples are mostly all the same"
        for ids, rs in sets:
            check_rescored(d, ids, rs, moe)
        busy_while(d, lambda: [check_rescored(d, ids, rs, moe) for ids, rs in sets])
    fn.__name__ = f"{fam}_rescoring_gives_the_sampled_bits_alone_and_busy"
    return case(fn)


def clean_moe_prompt(m, n):
    for j in range(20):
        ids = prompt(n, seed=1000 * j)
        res = ref_moe.forward(m, ids)
        if ref_moe.kth_gap(res.probs, m.cfg.k).min() >= NEAR_TIE:
            return ids, res
    raise AssertionError(f"no prompt of {n} tokens without a near tie in 20 tries")


def reference_case(fam):
    def fn():
        d = daemon(fam)
        _, kind, n = FAMILIES[fam]
        if kind == "moe":
            m, shape = moe_shape()
            ids, res = clean_moe_prompt(m, n)
            z = res.logits
        else:
            ids, shape = prompt(n, seed=1), None
            z = ref_llama.logits(ref_llama.load(path_of(fam)), ids)
        mi = score(d, ids, 0, routes=shape is not None)
        got = mi["input_token_logprobs"]
        assert got[0][0] is None and all(t[0] is not None for t in got[1:]), got[:2]
        lp = ref_llama.log_softmax(z)
        want = np.array([lp[p - 1, ids[p]] for p in range(1, n)])
        err = np.abs(np.array([t[0] for t in got[1:]]) - want)
        print(f"# {fam}: scored {n - 1} positions, max |log-prob - reference| {err.max():.2e}")
        assert err.max() <= REF_TOL, (fam, int(err.argmax()) + 1, err.max())
        # From a later position (a chunk boundary elsewhere): the same bits there.
        later = score(d, ids, 77)["input_token_logprobs"]
        assert (bits([t[0] for t in later]) == bits([t[0] for t in got[77:]])).all(), "scored from 77: other bits"
        if shape:
            r = routes_of(mi, *shape)
            assert r.shape == (n, *shape), r.shape
            want_r = res.routes.transpose(1, 0, 2)           # [L, T, k] -> [T, L, k]
            assert (r == want_r).all(), f"{int((r != want_r).any(axis=(1, 2)).sum())} positions routed otherwise"
    fn.__name__ = f"{fam}_prompt_logprobs_near_the_float64_reference"
    return case(fn)


for _fam in FAMILIES:
    rescoring_case(_fam)
    reference_case(_fam)


@case
def gemma3_270m_rescoring_gives_the_sampled_bits_alone_and_busy():
    if not os.path.exists(GEMMA3):
        raise Skip(f"{GEMMA3} is absent (make model-gemma3)")
    d = daemon("gemma3_270m")
    sets = []
    for text in ("The history of the printing press in Europe began", "Write a short poem about the sea:",
                 "def fibonacci(n):", "Q: 17 * 23 = ? A:"):
        st, doc = d.post("/tokenize", {"prompt": text})
        assert st == 200, doc
        sets.append((doc["tokens"], rollouts(d, doc["tokens"], 16)))
    assert distinct_groups(sets) >= 4, "the n=4 samples are mostly all the same"
    for ids, rs in sets:    # 36 rollouts
        check_rescored(d, ids, rs)
    busy_while(d, lambda: check_rescored(d, sets[0][0], sets[0][1][:3]), threads=2)


@case
def daemons_exit_cleanly():
    stop_cleanly(*_d.values())


if __name__ == "__main__":
    main()
