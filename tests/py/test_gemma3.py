"""Gemma 3 270M (the second real model, `make model-gemma3`) against llama.cpp.

Two llama.cpp oracles on the same weights, as for SmolLM2
(test_llamacpp_parity.py): an F32 copy of the file (every tensor dequantized
by the `gguf` package, F32 KV cache, flash attention off: llama.cpp then
computes in fp32 without activation quantization) and the Q4_K_M file itself.
Our engine runs the Q4_K_M file: it dequantizes to the same fp32 values.

For each prompt (Gemma turns, prose, code, numbers; 20-200 tokens, and one
of more than 600 so the 512-token window of the local layers is exercised),
tokenized by llama.cpp, our greedy 24-token continuation (build/rollout-gen)
is teacher-forced into llama.cpp. At every generated position, where
llama.cpp's top-2 margin exceeds MARGIN its argmax must be our token, and our
log-prob must be within LOGPROB nats of llama.cpp's log_softmax there:
F32: 0.05 / 0.01 nats. Q4_K_M: margin 0.5 as SmolLM2's Q4_1 check, but 1.0
nats instead of its 0.3: llama.cpp quantizes activations for its quantized
matmuls (Q8_K for the K-quants, Q8_0 for Q5_0), and on these prompts its own
Q4_K_M and F32 paths, on identical weights, differ by up to 0.67 nats at our
tokens (printed as "llama.cpp f32 vs q4_k_m"), so no exact engine can be
within 0.3 of it. The F32 oracle carries llama.cpp's fp16 GELU table
(GGML_GELU_FP16), a few 1e-3 of its own error (tests/py/test_families.py
measures it on tiny Gemma 3 models).

Skipped (SKIP lines) when the model file is absent."""
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import BUILD, ROOT, TMP, case, main, run  # noqa: E402
import ref_llama  # noqa: E402

MODEL = os.environ.get("RD_GEMMA3", os.path.join(ROOT, "models", "gemma-3-270m-q4_k_m.gguf"))
GEN = os.path.join(BUILD, "rollout-gen")
N_GEN = 24
BOUNDS = {"f32": dict(margin=0.05, logprob=0.01), "q4_k_m": dict(margin=0.5, logprob=1.0)}


def turns(*ts):
    s = "<bos>" + "".join(f"<start_of_turn>{role}\n{text}<end_of_turn>\n" for role, text in ts)
    return s + "<start_of_turn>model\n"


LONG = " ".join(
    f"Entry {i}: the river rose {i % 7 + 1} inches overnight near the {['mill', 'bridge', 'ford', 'weir'][i % 4]}, "
    f"and the keeper wrote it down." for i in range(40))
PROMPTS = {
    "turn_capital": turns(("user", "What is the capital of France? Answer in one sentence.")),
    "turn_math": turns(("user", "Natalia sold clips to 48 of her friends in April, and then she sold half as many "
                                "clips in May. How many clips did Natalia sell altogether? Think step by step.")),
    "turn_multi": turns(("user", "Give me a word that rhymes with cat."), ("model", "Hat."),
                        ("user", "Now use both words in a short sentence.")),
    "prose": ("The history of the printing press begins in the fifteenth century, when Johannes Gutenberg "
              "combined movable metal type, oil-based inks and a wooden press adapted from those used to make "
              "wine. Within a few decades, printing shops had spread across Europe, and"),
    "code_python": ("def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n    a, b = 0, 1\n"
                    "    for _ in range(n):\n        a, b = b, a + b\n    return a\n\n\ndef is_prime(n):\n"),
    "code_c": ("#include <stdio.h>\n\n/* Sum the integers given on the command line. */\nint main(int argc, "
               "char **argv)\n{\n    long sum = 0;\n    for (int i = 1; i < argc; i++)\n"),
    "numbers": "Prime numbers: 2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37, 41, 43, 47, 53, 59, 61, 67,",
    "multilingual": "Bonjour, je m'appelle Marie. 東京は日本の首都です。 Привет, как дела? The weather today is",
    "long_log": "Keeper's log.\n" + LONG + "\nSummary of the week:",
}
MIN_LEN = {"long_log": 601}

_llms = {}


def have_model():
    return os.path.exists(MODEL)


def f32_copy():
    out = os.path.join(TMP, "gemma3_f32.gguf")
    if not os.path.exists(out):
        ref_llama.f32_copy(MODEL, out + ".part")
        os.rename(out + ".part", out)
    return out


def llm(kind):
    if kind not in _llms:
        from llamacpp_info import Llama  # llama_cpp.Llama, printing its build and buffer types
        kw = dict(n_ctx=1024, n_batch=1024, n_threads=2, n_threads_batch=2, logits_all=True, verbose=False, seed=0)
        if kind == "f32":
            _llms[kind] = Llama(model_path=f32_copy(), type_k=0, type_v=0, flash_attn=False, **kw)
        else:
            _llms[kind] = Llama(model_path=MODEL, **kw)
    return _llms[kind]


def tokenize(text):
    return llm("q4_k_m").tokenize(text.encode("utf-8"), add_bos=False, special=True)


def log_softmax(z):
    mx = z.max(axis=-1, keepdims=True)
    return z - mx - np.log(np.exp(z - mx).sum(axis=-1, keepdims=True))


def margins(z):
    top2 = np.sort(z, axis=-1)[..., -2:]
    return top2[..., 1] - top2[..., 0]


def our_greedy(ids):
    p = run([GEN, "--model", MODEL, "--prompt-ids", ",".join(map(str, ids)), "--max-tokens", str(N_GEN),
             "--temperature", "0", "--ignore-eos", "--json"])
    (line,) = [ln for ln in p.stdout.splitlines() if ln.startswith("{")]
    r = json.loads(line)
    assert list(r["prompt_ids"]) == list(ids) and len(r["token_ids"]) == N_GEN, r
    return [int(t) for t in r["token_ids"]], np.array(r["logprobs"], dtype=np.float64)


def llama_rows(kind, ids, ours):
    """llama.cpp's logits at the rows that predict our tokens (row j predicts ours[j])."""
    m = llm(kind)
    m.reset()
    n = len(ids) - 1
    if hasattr(m, "_logits_all"):
        # The prompt's first n rows in a batch that asks for no logits (llama-cpp-python 0.3's per-batch
        # flag): the 262,144-row head over every prompt row was most of this file's time.
        m._logits_all = False
        try:
            m.eval(ids[:n])
        finally:
            m._logits_all = True
        m.eval(ids[n:] + ours)
    else:
        m.eval(ids + ours)
    return np.array(m.scores[n:n + N_GEN], dtype=np.float64)


def compare(name, kind, ids, ours, our_lp, z):
    b = BOUNDS[kind]
    ref_lp = log_softmax(z)[np.arange(N_GEN), ours]
    d = np.abs(our_lp - ref_lp)
    mg, top = margins(z), z.argmax(axis=-1)
    wrong = [j for j in range(N_GEN) if mg[j] > b["margin"] and top[j] != ours[j]]
    print(f"# {name} vs llama.cpp {kind}: prompt {len(ids)} tok, max|dlogprob| {d.max():.2e}, "
          f"{int((top != np.array(ours)).sum())} argmax mismatches (any margin)", flush=True)
    errs = []
    if wrong:
        errs.append(f"{kind}: argmax differs where margin > {b['margin']} at {wrong}")
    if d.max() >= b["logprob"]:
        errs.append(f"{kind}: logprob differs by {d.max():.4f} at {int(d.argmax())} (>= {b['logprob']})")
    return errs


@case
def prompts_tokenize_in_range():
    for name, text in PROMPTS.items():
        n = len(tokenize(text))
        lo, hi = (MIN_LEN[name], 1000) if name in MIN_LEN else (20, 200)
        assert lo <= n <= hi, f"{name}: {n} tokens"


def _case(name):
    def fn():
        ids = tokenize(PROMPTS[name])
        ours, lp = our_greedy(ids)
        assert np.isfinite(lp).all() and (lp <= 1e-6).all(), lp[:4]
        zf, zq = llama_rows("f32", ids, ours), llama_rows("q4_k_m", ids, ours)
        gap = np.abs(log_softmax(zf) - log_softmax(zq))[np.arange(N_GEN), ours]
        print(f"# {name}: llama.cpp f32 vs q4_k_m at our tokens: max|dlogprob| {gap.max():.3f}", flush=True)
        errs = compare(name, "f32", ids, ours, lp, zf) + compare(name, "q4_k_m", ids, ours, lp, zq)
        assert not errs, "; ".join(errs)
    fn.__name__ = f"greedy_{name}"
    return case(fn)


for _n in PROMPTS:
    _case(_n)


if __name__ == "__main__":
    if not have_model():
        print(f"SKIP test_gemma3: {MODEL} is absent (make model-gemma3)")
        sys.exit(0)
    main()
