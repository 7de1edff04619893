"""The sampling fields of issue 44 against a NumPy reference of vLLM's definitions.

A real build/rolloutd serves the default model with logprobs_mode processed_logprobs. For each
setting (repetition, frequency and presence penalties, logit_bias, min_tokens, alone and combined)
the daemon's greedy tokens must equal a reference that takes the model's raw logits of the same
sequence (build/rollout-logits: one prefill of prompt + completion, whose rows equal the decode
steps' by the engine's batch invariance), applies vLLM's processors to each row in NumPy (bias and
the min-tokens mask, repetition penalty over prompt + output, frequency and presence penalties over
the output's counts: vllm/v1/sample/sampler.py, vllm/model_executor/layers/utils.py) and takes the
argmax. Sampled requests (n = 4, temperature, top-k, top-p, min-p and penalties on) must draw each
token from the reference's kept set, with their processed log-prob equal to the reference's within
1e-6: each sample's counts are its own. A raw-mode daemon answers the raw log-probs, which must
equal log_softmax of the unedited row within 1e-6 whatever the penalties.
The daemons end with SIGTERM and must exit 0."""
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import BUILD, MODEL, TMP, case, main, run  # noqa: E402

from rdtest import Daemon, stop_cleanly  # noqa: E402

PROMPT = "The history of the printing press in Europe began"
_d = {}


def daemon(mode="processed_logprobs"):
    if mode not in _d:
        _d[mode] = Daemon("--logprobs-mode", mode, model=MODEL)
    return _d[mode]


def post(path, obj, mode="processed_logprobs", timeout=120):
    return daemon(mode).post(path, obj, timeout)


_eos = []


def stop_ids():
    """The model's EOS (and end of turn), which min_tokens masks: from the GGUF file."""
    if not _eos:
        from gguf_fast import GGUFReader
        f = GGUFReader(MODEL).fields
        for key in ("tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id"):
            if key in f:
                _eos.append(int(f[key].parts[f[key].data[0]][0]))
    return list(_eos)


def generate(sp, mode="processed_logprobs", prompt_ids=None):
    body = {"input_ids" if prompt_ids else "text": prompt_ids or PROMPT, "sampling_params": sp,
            "return_logprob": True}
    st, doc = post("/generate", body, mode)
    assert st == 200, (sp, st, doc)
    docs = doc if isinstance(doc, list) else [doc]
    out = []
    for d in docs:
        mi = d["meta_info"]
        prompt = [t for _, t, _ in mi["input_token_logprobs"]] if mi.get("input_token_logprobs") else None
        out.append((d["output_ids"], [lp for lp, _, _ in mi["output_token_logprobs"]], prompt))
    return out


def prompt_ids():
    st, doc = post("/tokenize", {"prompt": PROMPT})
    if st == 200:
        return doc["tokens"]
    raise AssertionError(("tokenize", st, doc))


def raw_logits(ids):
    """[len(ids)][vocab] fp32 logits of every position (rollout-logits, one prefill)."""
    path = os.path.join(TMP, "sampling_logits.bin")
    run([os.path.join(BUILD, "rollout-logits"), "--model", MODEL, "--prompt-ids", ",".join(map(str, ids)),
         "--out", path, "--threads", "2"])
    x = np.fromfile(path, dtype=np.float32)
    return x.reshape(len(ids), -1)


def edit_row(row, prompt, out, sp, extra_stops):
    """vLLM's processors on one fp32 row, each operation rounded to fp32 as the engine does."""
    f32 = np.float32
    x = row.astype(np.float32).copy()
    for k, b in (sp.get("logit_bias") or {}).items():
        x[int(k)] = f32(x[int(k)] + f32(b))
    if len(out) < sp.get("min_new_tokens", 0):
        for t in stop_ids() + list(sp.get("stop_token_ids", [])) + extra_stops:
            x[t] = -np.inf
    rep = f32(sp.get("repetition_penalty", 1.0))
    if rep != 1:
        seen = np.array(sorted(set(prompt) | set(out)), dtype=np.int64)
        v = x[seen]
        x[seen] = np.where(v > 0, v / rep, v * rep).astype(np.float32)
    counts = np.bincount(np.array(out, dtype=np.int64), minlength=x.size).astype(np.float32)[:x.size]
    x = (x - f32(sp.get("frequency_penalty", 0.0)) * counts).astype(np.float32)
    x = (x - np.where(counts > 0, f32(sp.get("presence_penalty", 0.0)), f32(0))).astype(np.float32)
    return x


def kept_logprobs(x, sp):
    """Processed log-probs over the kept set (-inf outside it): temperature, top-k, top-p within
    the top-k set, min-p on p / p_max; the set is a prefix of the rank order (logit descending,
    ties to the lower id)."""
    t = sp.get("temperature", 1.0)
    y = x.astype(np.float64) / t
    order = sorted(range(x.size), key=lambda i: (-x[i], i))
    order = [i for i in order if np.isfinite(x[i])]
    k = sp.get("top_k", -1)
    if k and k > 0:
        order = order[:k]
    p = np.exp(y[order] - y[order[0]])
    top_p = sp.get("top_p", 1.0)
    n = len(order)
    if top_p < 1:
        c = np.cumsum(p)
        n = int(np.argmax(c >= top_p * c[-1])) + 1
    min_p = sp.get("min_p", 0.0)
    n = min(n, int(np.sum(p >= min_p)))
    keep = order[:n]
    lp = np.full(x.size, -np.inf)
    z = np.log(np.sum(np.exp(y[keep] - y[order[0]]))) + y[order[0]]
    lp[keep] = y[keep] - z
    return lp


GREEDY_CASES = [
    {"repetition_penalty": 1.8},
    {"repetition_penalty": 0.7},
    {"frequency_penalty": 1.5},
    {"presence_penalty": 2.0},
    {"frequency_penalty": -0.5, "presence_penalty": 0.8},
    {"repetition_penalty": 1.3, "frequency_penalty": 0.6, "presence_penalty": 0.4},
]


def check_greedy(sp, base_out, extra_stops=()):
    """The daemon's greedy completion under sp equals the reference's, token for token."""
    ids = prompt_ids()
    sp = {"max_new_tokens": 24, "temperature": 0, **sp}
    out, lps, _ = generate(sp)[0]
    assert out, (sp, out)
    rows = raw_logits(ids + out[:-1])
    for g, tok in enumerate(out):
        x = edit_row(rows[len(ids) - 1 + g], ids, out[:g], sp, list(extra_stops))
        want = int(np.argmax(x))
        assert tok == want, (sp, g, tok, want, out)
        assert lps[g] == 0.0, (sp, g, lps[g])   # greedy: the processed distribution is a point mass
    return out


@case
def penalties_greedy_equal_numpy_reference():
    base = generate({"max_new_tokens": 24, "temperature": 0})[0][0]
    changed = 0
    for sp in GREEDY_CASES:
        out = check_greedy(sp, base)
        changed += out != base
    # The penalties matter on this prompt: most settings change the completion.
    assert changed >= len(GREEDY_CASES) - 1, changed


@case
def logit_bias_greedy_equals_reference():
    base = generate({"max_new_tokens": 24, "temperature": 0})[0][0]
    # Push a token no completion uses to the top, and forbid the base completion's first token.
    sp = {"logit_bias": {str(base[0]): -100, "17": 12.5}}
    out = check_greedy(sp, base)
    assert out[0] != base[0] and 17 in out, (out, base)
    # Bias and penalties together: the bias goes in before the repetition penalty.
    check_greedy({"logit_bias": {"17": 9.0}, "repetition_penalty": 1.5, "frequency_penalty": 0.3}, base)


@case
def min_tokens_masks_stop_tokens_until_reached():
    base = generate({"max_new_tokens": 24, "temperature": 0})[0][0]
    stop = base[2]
    out = generate({"max_new_tokens": 24, "temperature": 0, "stop_token_ids": [stop]})[0][0]
    assert out[-1] == stop and len(out) <= 3, (out, base)
    sp = {"stop_token_ids": [stop], "min_new_tokens": 10}
    out = check_greedy(sp, base)
    assert len(out) >= 10 and stop not in out[:10], out
    # min_tokens > max_tokens is refused, naming the field.
    st, doc = post("/generate", {"text": PROMPT, "sampling_params": {"max_new_tokens": 4, "min_new_tokens": 5}})
    assert st == 400 and "min_new_tokens" in doc["detail"], (st, doc)


@case
def sampled_processed_logprobs_equal_reference():
    ids = prompt_ids()
    sp = {"max_new_tokens": 16, "temperature": 0.8, "top_k": 40, "top_p": 0.9, "min_p": 0.02, "n": 4,
          "sampling_seed": 11, "repetition_penalty": 1.2, "frequency_penalty": 0.5, "presence_penalty": 0.3,
          "logit_bias": {"13": 2.0}}
    samples = generate(sp)
    assert len(samples) == 4 and len({tuple(s[0]) for s in samples}) > 1, samples
    worst = 0.0
    for out, lps, _ in samples:
        rows = raw_logits(ids + out[:-1])
        for g, tok in enumerate(out):
            ref = kept_logprobs(edit_row(rows[len(ids) - 1 + g], ids, out[:g], sp, []), sp)
            assert np.isfinite(ref[tok]), (g, tok, "drawn outside the reference's kept set")
            worst = max(worst, abs(ref[tok] - lps[g]))
    assert worst <= 1e-6, worst


@case
def raw_logprobs_ignore_the_penalties():
    ids = prompt_ids()
    sp = {"max_new_tokens": 12, "temperature": 0, "repetition_penalty": 1.6, "presence_penalty": 1.0}
    out, lps, _ = generate(sp, mode="raw_logprobs")[0]
    rows = raw_logits(ids + out[:-1])
    for g, tok in enumerate(out):
        r = rows[len(ids) - 1 + g].astype(np.float64)
        want = r[tok] - (np.log(np.sum(np.exp(r - r.max()))) + r.max())
        assert abs(want - lps[g]) <= 1e-5, (g, want, lps[g])
    # Under the processed daemon the same greedy tokens come back (the mode changes only what is reported).
    assert generate(sp)[0][0] == out


@case
def samples_keep_their_own_counts_and_batches_do_not_matter():
    """n = 4 seeded with penalties: each sample equals itself when the request runs beside 12
    others, and a request's samples come back the same through /v1/completions."""
    sp = {"max_new_tokens": 16, "temperature": 1.0, "n": 4, "sampling_seed": 5, "repetition_penalty": 1.4,
          "frequency_penalty": 0.7}
    alone = [s[0] for s in generate(sp)]
    import threading
    others, res = [], {}

    def busy(i):
        res[i] = generate({**sp, "sampling_seed": 100 + i, "n": 3})

    for i in range(4):
        others.append(threading.Thread(target=busy, args=(i,)))
    for t in others:
        t.start()
    again = [s[0] for s in generate(sp)]
    for t in others:
        t.join()
    assert again == alone
    st, doc = post("/v1/completions", {"prompt": PROMPT, "max_tokens": 16, "temperature": 1.0, "n": 4, "seed": 5,
                                       "repetition_penalty": 1.4, "frequency_penalty": 0.7,
                                       "return_token_ids": True})
    assert st == 200, doc
    assert [c["token_ids"] for c in doc["choices"]] == alone


@case
def daemons_exit_cleanly():
    stop_cleanly(*_d.values())


if __name__ == "__main__":
    main()
