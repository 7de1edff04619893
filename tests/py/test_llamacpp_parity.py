"""Engine vs llama.cpp (llama-cpp-python) on the real model.

Two llama.cpp oracles, both independent of our C code:
  Q4_1 : the same GGUF file. llama.cpp quantizes activations to 8 bits for its
         quantized matmuls and keeps the KV cache in f16, so even an exact fp32
         engine differs from it by up to ~2.6 in logits and ~0.2 nats in
         log-probs on these prompts (measured with the float64 reference and
         with the F32 oracle below). Its bounds are therefore loose.
  F32  : a copy of the same GGUF with every tensor dequantized to F32 by the
         `gguf` package (identical weight values), run with an F32 KV cache and
         flash attention off: llama.cpp then computes in fp32 without activation
         quantization. The float64 NumPy reference (ref_llama.py) agrees with it
         to < 1e-4 in logits, so it is the tight oracle.

(a) For each prompt (ChatML chat, prose, code, numbers; 20-200 tokens, tokenized
    by llama.cpp's tokenizer), our greedy 32-token continuation from
    build/rollout-gen is teacher-forced into llama.cpp. At every generated
    position: where llama.cpp's top-2 logit margin > MARGIN its argmax must be
    our token, and |our logprob - llama.cpp log_softmax[our token]| < TOL.
    F32: MARGIN 0.01, TOL 2e-3 nats (tighter than the issue's 0.1 / 0.05; the
    float64 reference is within 1e-4 of this oracle).
    Q4_1: MARGIN 0.5, TOL 0.3 nats (an exact engine measures max 0.18 nats and
    one argmax flip at margin 0.18 on these prompts, so the issue's 0.1 / 0.05
    cannot hold against this oracle).
(b) Per-position prompt logits from build/rollout-logits vs llama.cpp's for one
    prompt: max |diff| (F32 < 2e-3, Q4_1 < 4.0) and top-1 agreement wherever
    llama.cpp's margin exceeds MARGIN.
"""
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import BUILD, MODEL, TMP, case, main, run  # noqa: E402
import ref_llama  # noqa: E402  (for f32_copy only: the float64 reference is too slow for this model)

GEN = os.path.join(BUILD, "rollout-gen")
LOGITS = os.path.join(BUILD, "rollout-logits")
N_GEN = 32
# Per oracle: top-2 margin below which argmax may differ; log-prob tolerance
# (nats); max |logit diff| for the prompt-logits case.
BOUNDS = {
    "f32": dict(margin=0.01, logprob=2e-3, logit=2e-3),
    "q4_1": dict(margin=0.5, logprob=0.3, logit=4.0),
}

SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"


def chatml(*turns):
    s = "".join(f"<|im_start|>{role}\n{text}<|im_end|>\n" for role, text in turns)
    return s + "<|im_start|>assistant\n"


PROMPTS = {
    "chat_capital": chatml(("system", SYSTEM), ("user", "What is the capital of France? Answer in one sentence.")),
    "chat_math": chatml(("system", SYSTEM), ("user",
        "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. "
        "How many clips did Natalia sell altogether in April and May? Think step by step.")),
    "chat_multiturn": chatml(("system", SYSTEM), ("user", "Give me a word that rhymes with cat."),
                             ("assistant", "Hat."), ("user", "Now use both words in a short sentence.")),
    "prose": (
        "The history of the printing press begins in the fifteenth century, when Johannes Gutenberg "
        "combined movable metal type, oil-based inks and a wooden press adapted from those used to make "
        "wine. Within a few decades, printing shops had spread to more than two hundred cities across "
        "Europe, and the cost of books fell so sharply that"),
    "code_python": (
        "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n    a, b = 0, 1\n"
        "    for _ in range(n):\n        a, b = b, a + b\n    return a\n\n\n"
        "def is_prime(n):\n    \"\"\"Return True if n is a prime number.\"\"\"\n    if n < 2:\n"
        "        return False\n"),
    "code_c": (
        "#include <stdio.h>\n#include <stdlib.h>\n\n/* Sum the integers given on the command line. */\n"
        "int main(int argc, char **argv)\n{\n    long sum = 0;\n    for (int i = 1; i < argc; i++)\n"),
    "numbers": "Prime numbers: 2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37, 41, 43, 47, 53, 59, 61, 67,",
    "table": (
        "| Year | Revenue (million USD) | Growth |\n|------|------|------|\n| 2019 | 120.5 | 4.2% |\n"
        "| 2020 | 98.7 | -18.1% |\n| 2021 | 134.0 | 35.8% |\n| 2022 |"),
    "long_prose": (
        "Photosynthesis is the process by which green plants, algae and some bacteria convert light "
        "energy into chemical energy. During this process, carbon dioxide and water are combined, using "
        "the energy of sunlight captured by chlorophyll, to produce glucose and oxygen. The light-dependent "
        "reactions take place in the thylakoid membranes of the chloroplast, where water molecules are "
        "split and ATP and NADPH are produced. The light-independent reactions, also known as the Calvin "
        "cycle, take place in the stroma, where the energy stored in ATP and NADPH is used to fix carbon "
        "dioxide into three-carbon sugars. These sugars are then used to build glucose, starch and "
        "cellulose. Photosynthesis is essential for life on Earth because it"),
}

_llms = {}
_ours = {}


def f32_copy():
    """The model with every tensor dequantized to F32 by the gguf package (see
    ref_llama.f32_copy). Written once per TMP."""
    out = os.path.join(TMP, "parity_f32_" + os.path.basename(MODEL))
    if not os.path.exists(out):
        ref_llama.f32_copy(MODEL, out + ".part")
        os.rename(out + ".part", out)
    return out


def llm(kind="q4_1"):
    if kind not in _llms:
        from llamacpp_info import Llama  # llama_cpp.Llama, printing its build and buffer types
        kw = dict(n_ctx=512, n_batch=512, n_threads=2, n_threads_batch=2, logits_all=True, verbose=False, seed=0)
        if kind == "f32":  # fp32 everywhere: F32 weights, F32 KV cache (GGML_TYPE_F32 = 0), no flash attention
            _llms[kind] = Llama(model_path=f32_copy(), type_k=0, type_v=0, flash_attn=False, **kw)
        else:
            _llms[kind] = Llama(model_path=MODEL, **kw)
    return _llms[kind]


def tokenize(text):
    return llm().tokenize(text.encode("utf-8"), add_bos=False, special=True)


def llama_logits(ids, kind="q4_1"):
    """llama.cpp's float32 logits for every position of ids, as float64."""
    m = llm(kind)
    m.reset()
    m.eval(ids)
    return np.array(m.scores[:len(ids)], dtype=np.float64)


def log_softmax(z):
    mx = z.max(axis=-1, keepdims=True)
    return z - mx - np.log(np.exp(z - mx).sum(axis=-1, keepdims=True))


def margins(z):
    top2 = np.sort(z, axis=-1)[..., -2:]
    return top2[..., 1] - top2[..., 0]


def our_greedy(ids):
    key = tuple(ids)
    if key in _ours:
        return _ours[key]
    p = run([GEN, "--model", MODEL, "--prompt-ids", ",".join(map(str, ids)), "--max-tokens", str(N_GEN),
             "--temperature", "0", "--ignore-eos", "--json"])
    lines = [ln for ln in p.stdout.splitlines() if ln.strip().startswith("{")]
    assert len(lines) == 1, f"rollout-gen printed {len(lines)} JSON lines, expected 1: {p.stdout[-500:]}"
    r = json.loads(lines[0])
    assert list(r["prompt_ids"]) == list(ids), "prompt_ids echo differs from the prompt sent"
    assert len(r["token_ids"]) == N_GEN == len(r["logprobs"]), (len(r["token_ids"]), len(r["logprobs"]))
    assert r["finish_reason"] == "length", r["finish_reason"]
    _ours[key] = ([int(t) for t in r["token_ids"]], np.array(r["logprobs"], dtype=np.float64), r)
    return _ours[key]


def engine_prompt_logits(ids, vocab):
    out = os.path.join(TMP, "parity_logits.f32")
    if os.path.exists(out):
        os.remove(out)
    run([LOGITS, "--model", MODEL, "--prompt-ids", ",".join(map(str, ids)), "--out", out])
    a = np.fromfile(out, dtype="<f4")
    assert a.size == len(ids) * vocab, f"{a.size} floats, expected {len(ids)}x{vocab}"
    return a.reshape(len(ids), vocab).astype(np.float64)


@case
def prompts_tokenize_in_range():
    for name, text in PROMPTS.items():
        n = len(tokenize(text))
        assert 20 <= n <= 200, f"{name}: {n} tokens"
    chat = tokenize(PROMPTS["chat_capital"])
    assert chat[0] == 1 and chat.count(1) == 3, f"ChatML special tokens not parsed: {chat[:8]}"


@case
def oracles_consistent():
    # The F32 copy is the same model (top-1 agrees with the Q4_1 file where
    # confident, logits within the Q4_1 noise), and the F32 bounds are tight
    # enough to catch llama.cpp-style activation quantization.
    ids = tokenize(PROMPTS["long_prose"])
    zq, zf = llama_logits(ids, "q4_1"), llama_logits(ids, "f32")
    d = np.abs(zq - zf).max()
    agree = (zq.argmax(-1) == zf.argmax(-1)) | (margins(zq) <= BOUNDS["q4_1"]["margin"])
    print(f"# llama.cpp Q4_1 vs F32 copy: max|dlogit| {d:.3f}, top-1 agree (confident) {agree.sum()}/{len(ids)}",
          flush=True)
    assert agree.all() and d < BOUNDS["q4_1"]["logit"], f"F32 copy disagrees with the Q4_1 file (max {d:.3f})"
    assert d > BOUNDS["f32"]["logit"], f"Q4_1 and F32 llama.cpp differ by only {d:.2e}: F32 bound not discriminating"


def compare_greedy(name, kind, ids, ours, our_lp):
    b = BOUNDS[kind]
    z = llama_logits(ids + ours, kind)[len(ids) - 1:len(ids) - 1 + N_GEN]  # row j predicts ours[j]
    ref_lp = log_softmax(z)[np.arange(N_GEN), ours]
    d_lp = np.abs(our_lp - ref_lp)
    mg = margins(z)
    top = z.argmax(axis=-1)
    wrong = [j for j in range(N_GEN) if mg[j] > b["margin"] and top[j] != ours[j]]
    bad = np.nonzero(d_lp >= b["logprob"])[0].tolist()
    print(f"# {name} vs llama.cpp {kind}: prompt {len(ids)} tok, max|dlogprob| {d_lp.max():.2e} at {d_lp.argmax()}, "
          f"{int((mg <= 0.1).sum())} positions with margin <= 0.1, {int((top != np.array(ours)).sum())} argmax "
          f"mismatches (any margin)", flush=True)
    errs = []
    if wrong:
        errs.append(f"{kind}: llama.cpp argmax differs where margin > {b['margin']} at positions {wrong}: "
                    + ", ".join(f"pos {j}: ours {ours[j]} llama {top[j]} margin {mg[j]:.3f}" for j in wrong[:4]))
    if bad:
        j = int(d_lp.argmax())
        errs.append(f"{kind}: logprob differs by >= {b['logprob']} at positions {bad} "
                    f"(max {d_lp[j]:.4f} at {j}: ours {our_lp[j]:.4f} llama {ref_lp[j]:.4f})")
    return errs


def greedy_parity(name):
    ids = tokenize(PROMPTS[name])
    ours, our_lp, r = our_greedy(ids)
    assert np.isfinite(our_lp).all() and (our_lp <= 1e-6).all(), f"bad logprobs {our_lp[:4]}"
    errs = compare_greedy(name, "f32", ids, ours, our_lp) + compare_greedy(name, "q4_1", ids, ours, our_lp)
    assert not errs, "; ".join(errs)


def _greedy_case(name):
    def fn():
        greedy_parity(name)
    fn.__name__ = f"greedy_{name}"
    return case(fn)


for _name in PROMPTS:
    _greedy_case(_name)


@case
def prompt_logits_parity():
    ids = tokenize(PROMPTS["long_prose"])
    errs = []
    got = None
    for kind in ("f32", "q4_1"):
        b = BOUNDS[kind]
        z = llama_logits(ids, kind)
        if got is None:
            got = engine_prompt_logits(ids, z.shape[1])
            assert np.isfinite(got).all(), "non-finite engine logits"
        d = np.abs(got - z).max(axis=-1)
        confident = margins(z) > b["margin"]
        agree = got.argmax(axis=-1) == z.argmax(axis=-1)
        print(f"# prompt logits vs llama.cpp {kind} ({len(ids)} positions): max|diff| {d.max():.4g} at pos "
              f"{d.argmax()}, mean of per-position max {d.mean():.4g}, top-1 agreement {agree.sum()}/{len(ids)} "
              f"({confident.sum()} positions with margin > {b['margin']})", flush=True)
        bad = np.nonzero(confident & ~agree)[0]
        if bad.size:
            errs.append(f"{kind}: top-1 differs where margin > {b['margin']} at positions {bad.tolist()}")
        if d.max() >= b["logit"]:
            errs.append(f"{kind}: max |logit diff| {d.max():.4g} at pos {d.argmax()} >= {b['logit']}")
    assert not errs, "; ".join(errs)


if __name__ == "__main__":
    main()
