"""Engine logits vs the float64 NumPy reference (ref_llama.py) on tiny random
models of every supported weight dtype.

For each model: build/rollout-logits writes float32 logits for every prompt
position; the reference computes the same in float64 from the GGUF read by the
`gguf` package. Requirement: max |diff| < 1e-4 at every position, for prompts of
1, 7, 40 and 100 tokens (40 and 100 span several 16-token KV blocks), GQA and
MHA, tied and untied embeddings. A sensitivity case shows that a reference which
keeps llama.cpp's Q/K row order (permutation not undone) is far outside the
tolerance, so the comparison would catch it."""
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import BUILD, ROOT, TMP, case, main, run  # noqa: E402
import ref_llama  # noqa: E402

GEN = os.path.join(ROOT, "tools", "gen_tiny_model.py")
LOGITS = os.path.join(BUILD, "rollout-logits")
TOL = 1e-4
LENGTHS = (1, 7, 40, 100)
VOCAB = 300

_models = {}


def tiny(dtype, heads=4, kv_heads=2, tied=False, seed=1, theta=10000, dim=64, ffn=128):
    """Generates (once) a tiny model and loads its reference."""
    key = (dtype, heads, kv_heads, tied, seed, theta, dim, ffn)
    if key not in _models:
        shape = "" if (dim, ffn) == (64, 128) else f"_d{dim}f{ffn}"
        name = f"tiny_{dtype}_h{heads}kv{kv_heads}_{'tied' if tied else 'untied'}_s{seed}_t{theta}{shape}.gguf"
        path = os.path.join(TMP, name)  # regenerated each run: the generator may change
        run([sys.executable, GEN, "--out", path, "--dtype", dtype, "--layers", "2", "--dim", str(dim),
             "--heads", str(heads), "--kv-heads", str(kv_heads), "--ffn", str(ffn), "--vocab", str(VOCAB),
             "--ctx", "256", "--rope-theta", str(theta), "--seed", str(seed),
             "--tied" if tied else "--untied"])
        m = ref_llama.load(path)
        assert m.tied == tied, f"{name}: generator tied={m.tied}, asked {tied}"
        assert (m.cfg.n_head, m.cfg.n_head_kv, m.cfg.vocab) == (heads, kv_heads, VOCAB), m.cfg
        _models[key] = (path, m)
    return _models[key]


def prompt(n, seed=0):
    return np.random.default_rng(1000 + n + 7919 * seed).integers(0, VOCAB, n).tolist()


def engine_logits(path, ids):
    out = os.path.join(TMP, "tiny_logits.f32")
    if os.path.exists(out):
        os.remove(out)
    run([LOGITS, "--model", path, "--prompt-ids", ",".join(map(str, ids)), "--out", out])
    a = np.fromfile(out, dtype="<f4")
    assert a.size == len(ids) * VOCAB, f"{out}: {a.size} floats, expected {len(ids)}x{VOCAB}"
    return a.reshape(len(ids), VOCAB).astype(np.float64)


def check(dtype, **kw):
    path, m = tiny(dtype, **kw)
    worst = []
    for n in LENGTHS:
        ids = prompt(n)
        ref = ref_llama.logits(m, ids)
        # Flat logits would make 1e-4 meaningless: demand visible structure.
        assert ref.std(axis=-1).min() > 1e-2, f"reference logits too flat (std {ref.std(axis=-1).min():.2e})"
        got = engine_logits(path, ids)
        assert np.isfinite(got).all(), f"{dtype} n={n}: non-finite engine logits"
        d = np.abs(got - ref).max(axis=-1)  # per position
        bad = np.nonzero(d >= TOL)[0]
        assert bad.size == 0, (f"{os.path.basename(path)} n={n}: {bad.size}/{n} positions over {TOL:g}, "
                               f"first at pos {bad[0]} (diff {d[bad[0]]:.3e}), max {d.max():.3e} at pos {d.argmax()}, "
                               f"|ref| max {np.abs(ref).max():.2f}")
        worst.append(f"n={n}:{d.max():.1e}")
    print(f"# {os.path.basename(path)} max|engine-ref| " + " ".join(worst), flush=True)


@case
def f32_gqa_untied():
    check("f32", tied=False)


@case
def f16_gqa_tied():
    check("f16", tied=True)


@case
def bf16_gqa_untied():
    check("bf16", tied=False)


@case
def q8_0_gqa_tied():
    check("q8_0", tied=True)


@case
def q4_0_gqa_untied():
    check("q4_0", tied=False)


@case
def q4_1_gqa_tied():
    check("q4_1", tied=True)


@case
def q5_0_gqa_untied():
    check("q5_0", tied=False, seed=4)


@case
def q5_1_gqa_tied():
    check("q5_1", tied=True, seed=5)


K_SHAPE = dict(dim=256, ffn=512)


@case
def q4_k_gqa_tied():
    check("q4_k", tied=True, seed=6, **K_SHAPE)


@case
def q5_k_gqa_untied():
    check("q5_k", tied=False, seed=7, **K_SHAPE)


@case
def q6_k_gqa_untied():
    check("q6_k", tied=False, seed=8, **K_SHAPE)


@case
def f32_mha_tied():
    check("f32", heads=4, kv_heads=4, tied=True, seed=2)


@case
def q4_1_mha_untied_theta1e5():
    check("q4_1", heads=4, kv_heads=4, tied=False, seed=3, theta=100000)


@case
def reference_is_causal():
    # Logits of a prefix must not depend on what follows it.
    _, m = tiny("f32", tied=False)
    ids = prompt(40)
    full = ref_llama.logits(m, ids)
    part = ref_llama.logits(m, ids[:17])
    assert np.abs(full[:17] - part).max() < 1e-10


@case
def reference_matches_llamacpp_f32():
    # The oracle itself, checked against llama.cpp on the same tiny F32 files
    # (F32 KV cache, no flash attention: llama.cpp then computes in fp32), GQA
    # and MHA: this pins the reference's reading of the Q/K permutation, RoPE
    # and GQA head mapping to llama.cpp's, independently of our C code.
    from llamacpp_info import Llama  # llama_cpp.Llama, printing its build and buffer types
    for kw in (dict(tied=False), dict(heads=4, kv_heads=4, tied=True, seed=2)):
        path, m = tiny("f32", **kw)
        ids = prompt(100)
        llm = Llama(model_path=path, n_ctx=256, n_threads=2, logits_all=True, verbose=False,
                    type_k=0, type_v=0, flash_attn=False)
        llm.eval(ids)
        z = np.array(llm.scores[:len(ids)], dtype=np.float64)
        del llm
        d = np.abs(z - ref_llama.logits(m, ids)).max()
        print(f"# {os.path.basename(path)}: |ref - llama.cpp| {d:.2e}", flush=True)
        assert d < TOL, f"{os.path.basename(path)}: reference vs llama.cpp {d:.3e} >= {TOL}"


@case
def permutation_sensitivity():
    # A reference that keeps llama.cpp's Q/K row order (HF rotate-half RoPE on
    # interleaved rows) must miss by far more than the tolerance, and so must
    # the engine against it: the 1e-4 check above can fail on a Q/K layout bug.
    # (Position 0 is unaffected: RoPE is the identity there.)
    path, m = tiny("f32", tied=False)
    wrong = ref_llama.load(path, unpermute_qk=False)
    ids = prompt(40)
    ref = ref_llama.logits(m, ids)
    bad = ref_llama.logits(wrong, ids)
    d_ref = np.abs(bad - ref).max()
    assert d_ref > 1e-3, f"unpermuted reference differs by only {d_ref:.2e}"
    got = engine_logits(path, ids)
    d_eng = np.abs(got - bad).max()
    assert d_eng > 1e-3, f"engine matches the unpermuted reference ({d_eng:.2e})"
    print(f"# permutation not undone: |wrong-ref| {d_ref:.3e}, |engine-wrong| {d_eng:.3e}", flush=True)


if __name__ == "__main__":
    main()
