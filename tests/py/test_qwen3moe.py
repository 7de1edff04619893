"""Qwen3-MoE (llama.cpp arch qwen3moe, HF Qwen3MoeForCausalLM): the tiny
random model of tests/py/moe_model.py and the float64 reference of
tests/py/ref_moe.py proven against llama.cpp, then the engine against both.

Part 1, independent of our C code:
  - the files carry the keys and tensors llama.cpp's qwen3moe loader takes
    (expert_count, expert_used_count, expert_feed_forward_length; router
    ffn_gate_inp ne [dim, E], F32 in every file; ffn_{gate,up}_exps ne [dim,
    F, E], ffn_down_exps ne [F, dim, E]); the HF folder has one tensor per
    expert and the GGUF's values;
  - the routing of the test prompts is not degenerate: every expert of every
    layer is hit, tokens share experts, the probabilities spread, no ties;
  - ref_moe's logits vs llama-cpp-python's on the F32 file (F32 KV cache, flash
    attention off) for prompts of 1..700 tokens: max |diff| < REF_TOL; and
    llama.cpp's own greedy continuation (24 tokens) is the reference's argmax
    with log-probs within LOGPROB_TOL;
  - sensitivity: wrong variants of the reference (no renormalization, k - 1
    experts, uniform weights, no q/k norm, router fed the un-normed rows,
    gate/up swapped, the expert axis of the 3-D tensors mixed up) miss
    llama.cpp by > FAR, so the comparison above can fail;
  - ref_moe.load_hf(folder) == ref_moe.load(gguf) (<= 1e-12) for every dtype,
    and a folder with norm_topk_prob false differs by > FAR (the flag matters).

Part 2, the engine (build/rollout-logits, build/rollout-gen); a model the
engine cannot load FAILS these cases, nothing is skipped:
  - logits vs the reference < ENGINE_TOL at every position for the GGUF of
    every dtype (quantized ones against the reference on the gguf package's
    dequantized values) and for HF folders (f32, bf16, q4_k_m values, and one
    with norm_topk_prob false against the reference without
    renormalization); and > FAR from the wrong variants (so these can fail);
  - greedy (24 tokens) on the F32 GGUF teacher-forced into llama.cpp: its
    argmax wherever its top-2 margin > MARGIN, log-probs within LOGPROB_TOL;
  - the routed experts per position and layer on the f32 and q4_k_m GGUFs
    (rollout-logits --routes-out FILE: int32 [n_layers][n][k] as
    runner_routes writes them, highest weight first) equal the reference's.
Near ties: a position where some layer's k-th and (k+1)-th router
probabilities are within NEAR_TIE may be routed either way by a float32
engine (llama.cpp's or ours), which changes it and, through attention, every
later position. So each prompt is the first of a fixed series of random ones
whose reference routing has no near tie anywhere (chosen by the reference
alone; the re-drawn ones are printed), and then every position is compared.

Files: TMP/qwen3moe/tiny-moe-<dtype>.gguf and .hf/ (regenerated on every run,
~2 s), TMP/qwen3moe/tiny-moe-f32-nonorm.hf/. (tests/unit/test_moe.c, the
C unit test of the MoE ops and routing replay, builds its own model in memory.)"""
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import BUILD, TMP, case, main, run  # noqa: E402
import moe_model  # noqa: E402
import ref_moe  # noqa: E402

LOGITS = os.path.join(BUILD, "rollout-logits")
ROLLOUT_GEN = os.path.join(BUILD, "rollout-gen")
DIR = os.path.join(TMP, "qwen3moe")

REF_TOL = 1e-4          # reference vs llama.cpp F32 (measured ~2.5e-5 at 700 tokens)
FAR = 1e-2              # a wrong reference variant must miss llama.cpp by more than this
ENGINE_TOL = 1e-4       # engine vs reference
MARGIN, LOGPROB_TOL = 0.01, 2e-3
NEAR_TIE = 1e-6
TIE_TRIES = 20
N_GEN = 24
VOCAB, CTX = 300, 1024
SEED = 41
LENGTHS = (1, 7, 40, 300, 700)
ENGINE_LENGTHS = (1, 7, 40, 100, 300)
GREEDY_LENGTHS = (20, 300, 700)
DTYPES = moe_model.DTYPES
HF_DTYPES = ("f32", "bf16", "q4_k_m")

_files, _refs, _llm, _llama_logits = {}, {}, [], {}


def model(dtype="f32", norm_topk_prob=True):
    key = (dtype, norm_topk_prob)
    if key not in _files:
        name = f"tiny-moe-{dtype}" + ("" if norm_topk_prob else "-nonorm")
        _files[key] = moe_model.write_tiny_moe(DIR, dtype, SEED, name=name, norm_topk_prob=norm_topk_prob)
    return _files[key]


def ref(path):
    if path not in _refs:
        _refs[path] = ref_moe.load_hf(path) if os.path.isdir(path) else ref_moe.load(path)
    return _refs[path]


def prompt(n, seed=0):
    return np.random.default_rng(9100 + n + 7919 * seed).integers(0, VOCAB, n).tolist()


_clean = {}


def clean_prompt(m, n, seed=0):
    """(ids, reference result) of the first of prompt(n, seed), prompt(n, seed +
    1000), ... whose routing has no near tie in any layer at any position (see
    the docstring): chosen by the reference alone, so the choice cannot hide an
    engine error, and every position of it is compared."""
    key = (id(m), n, seed)
    if key not in _clean:
        for j in range(TIE_TRIES):
            ids = prompt(n, seed + 1000 * j)
            res = ref_moe.forward(m, ids)
            if ref_moe.kth_gap(res.probs, m.cfg.k).min() >= NEAR_TIE:
                _clean[key] = (ids, res)
                break
        else:
            raise AssertionError(f"no prompt of {n} tokens without a near tie in {TIE_TRIES} tries")
    return _clean[key]


def llm():
    if not _llm:
        from llamacpp_info import Llama  # llama_cpp.Llama, printing its build and buffer types
        _llm.append(Llama(model_path=model("f32")[0], n_ctx=CTX, n_batch=512, n_threads=2, n_threads_batch=2,
                          logits_all=True, verbose=False, seed=0, type_k=0, type_v=0, flash_attn=False))
    return _llm[0]


def llama_logits(ids):
    key = tuple(ids)
    if key not in _llama_logits:
        m = llm()
        m.reset()
        m.eval(ids)
        _llama_logits[key] = np.array(m.scores[:len(ids)], dtype=np.float64)
    return _llama_logits[key]


def llama_greedy(ids, n):
    """llama.cpp's own greedy continuation (argmax of its logits, token by token)."""
    m = llm()
    m.reset()
    m.eval(ids)
    out = []
    for _ in range(n):
        t = int(np.argmax(m.scores[m.n_tokens - 1]))
        out.append(t)
        m.eval([t])
    return out


def log_softmax(z):
    mx = z.max(axis=-1, keepdims=True)
    return z - mx - np.log(np.exp(z - mx).sum(axis=-1, keepdims=True))


def margins(z):
    top2 = np.sort(z, axis=-1)[..., -2:]
    return top2[..., 1] - top2[..., 0]


# ---------------------------------------------------------------------------
# Part 1: the files, the reference, llama.cpp


@case
def gguf_keys_and_tensors():
    from gguf_fast import GGUFReader
    import ref_llama
    for dt in DTYPES:
        s = moe_model.shape_for(dt)
        path, hf = model(dt)
        r = GGUFReader(path)
        kv = {k: ref_llama._field(r, k) for k in r.fields if k.startswith("qwen3moe.") or k.startswith("general.")}
        want = {"general.architecture": "qwen3moe", "qwen3moe.block_count": s["layers"],
                "qwen3moe.embedding_length": s["dim"], "qwen3moe.feed_forward_length": s["ffn"],
                "qwen3moe.attention.head_count": s["heads"], "qwen3moe.attention.head_count_kv": s["kv_heads"],
                "qwen3moe.attention.key_length": s["head_dim"], "qwen3moe.attention.value_length": s["head_dim"],
                "qwen3moe.expert_count": s["n_expert"], "qwen3moe.expert_used_count": s["k"],
                "qwen3moe.expert_feed_forward_length": s["ffn_exp"], "qwen3moe.context_length": CTX,
                "qwen3moe.rope.freq_base": s["theta"]}
        for k, v in want.items():
            assert kv.get(k) == v, f"{dt}: {k} = {kv.get(k)!r}, expected {v!r}"
        assert "qwen3moe.expert_shared_count" not in kv and s["ffn"] != s["ffn_exp"], kv
        names = {t.name: t for t in r.tensors}
        per_layer = {"attn_norm", "attn_q", "attn_k", "attn_v", "attn_output", "attn_q_norm", "attn_k_norm",
                     "ffn_norm", "ffn_gate_inp", "ffn_gate_exps", "ffn_up_exps", "ffn_down_exps"}
        expect = {"token_embd.weight", "output_norm.weight", "output.weight"} | {
            f"blk.{i}.{n}.weight" for i in range(s["layers"]) for n in per_layer}
        assert set(names) == expect, (dt, sorted(set(names) ^ expect))
        D, E, F, q = s["dim"], s["n_expert"], s["ffn_exp"], s["heads"] * s["head_dim"]
        shapes = {"ffn_gate_inp": [D, E], "ffn_gate_exps": [D, F, E], "ffn_up_exps": [D, F, E],
                  "ffn_down_exps": [F, D, E], "attn_q": [D, q], "attn_output": [q, D], "attn_q_norm": [s["head_dim"]]}
        for n, t in names.items():
            short = n.split(".")[-2]
            if short in shapes:
                assert t.shape.tolist() == shapes[short], (dt, n, t.shape.tolist())   # ggml ne
            want_type = moe_model.tensor_dtype(n, dt)
            assert t.tensor_type.name == moe_model.QTYPES[want_type].name, (dt, n, t.tensor_type.name, want_type)
            if short == "ffn_gate_inp" or len(t.shape.tolist()) == 1:
                assert t.tensor_type.name == "F32", (dt, n, t.tensor_type.name)
        # The folder: config.json and per-expert tensors holding the GGUF's values.
        cfg = json.load(open(os.path.join(hf, "config.json")))
        cwant = {"architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "hidden_size": D,
                 "num_experts": E, "num_experts_per_tok": s["k"], "moe_intermediate_size": F,
                 "intermediate_size": s["ffn"], "norm_topk_prob": True, "decoder_sparse_step": 1,
                 "mlp_only_layers": [], "head_dim": s["head_dim"], "tie_word_embeddings": False}
        for k, v in cwant.items():
            assert cfg.get(k) == v, f"{dt}: config.json {k} = {cfg.get(k)!r}, expected {v!r}"
        w = ref_llama.read_safetensors(os.path.join(hf, "model.safetensors"))
        assert len(w) == 3 + s["layers"] * (9 + 3 * E), (dt, len(w))
        for i in (0, s["layers"] - 1):
            for gn, hn in (("ffn_gate_exps", "gate_proj"), ("ffn_up_exps", "up_proj"), ("ffn_down_exps", "down_proj")):
                g = ref_llama._tensor(names[f"blk.{i}.{gn}.weight"])
                for e in (0, 5, E - 1):
                    h = w[f"model.layers.{i}.mlp.experts.{e}.{hn}.weight"]
                    assert np.array_equal(g[e], h), (dt, i, gn, e)
            assert np.array_equal(ref_llama._tensor(names[f"blk.{i}.ffn_gate_inp.weight"]),
                                  w[f"model.layers.{i}.mlp.gate.weight"]), (dt, i)
    print(f"# files: {', '.join(DTYPES)} (q4_k_m in the K shape, dim {moe_model.KSHAPE['dim']})", flush=True)


@case
def routing_is_not_degenerate():
    # Over the test prompts: every expert of every layer is hit, tokens share
    # experts, the top-k is sorted with weights summing to 1, the probabilities
    # spread (neither uniform nor one-hot) and no two tie exactly.
    for dt in ("f32", "q4_k_m"):
        m = ref(model(dt)[0])
        c = m.cfg
        used = np.zeros((c.n_layer, c.n_expert), dtype=int)
        for n in ENGINE_LENGTHS:
            res = ref_moe.forward(m, prompt(n, seed=2))
            for l in range(c.n_layer):
                used[l] += np.bincount(res.routes[l].ravel(), minlength=c.n_expert)
                top_p = np.take_along_axis(res.probs[l], res.routes[l], axis=-1)
                assert (np.diff(top_p, axis=-1) <= 0).all(), "top-k not sorted by weight"
                assert np.allclose(res.weights[l].sum(-1), 1.0), "weights do not sum to 1"
                assert (np.sort(res.probs[l], -1)[:, 1:] - np.sort(res.probs[l], -1)[:, :-1] > 0).all(), "exact tie"
            if n == 300:
                maxp = res.probs.max(-1)
                assert 0.25 < np.median(maxp) < 0.8, f"{dt}: median top probability {np.median(maxp):.3f}"
                shared = [len(set(res.routes[l, t]) & set(res.routes[l, t + 1])) for l in range(c.n_layer)
                          for t in range(n - 1)]
                assert 0 < np.mean([x > 0 for x in shared]) < 1, "consecutive tokens always/never share experts"
                sets = {tuple(sorted(x)) for x in res.routes[0]}
                assert len(sets) < n, "no two tokens routed to the same set of experts in layer 0"
                gap = ref_moe.kth_gap(res.probs, c.k).min()
        assert (used > 0).all(), f"{dt}: experts never hit: {np.argwhere(used == 0).tolist()}"
        print(f"# {dt}: expert hits per layer min {used.min()} max {used.max()}; 300 tokens: median top p "
              f"{np.median(maxp):.2f}, layer-0 distinct expert sets {len(sets)}, min k-th gap {gap:.1e}", flush=True)


@case
def reference_matches_llamacpp():
    m = ref(model("f32")[0])
    worst = []
    for n in LENGTHS:
        ids, res = clean_prompt(m, n)
        assert res.logits.std(axis=-1).min() > 0.1, "reference logits too flat"
        d = np.abs(llama_logits(ids) - res.logits).max(axis=-1)
        bad = np.nonzero(d >= REF_TOL)[0]
        assert bad.size == 0, (f"n={n}: {bad.size} positions over {REF_TOL:g}, first at {bad[0]} ({d[bad[0]]:.3e}), "
                               f"max {d.max():.3e} at {d.argmax()}")
        worst.append(f"n={n}:{d.max():.1e}")
    print("# max|ref - llama.cpp| " + " ".join(worst), flush=True)


@case
def reference_greedy_matches_llamacpp():
    m = ref(model("f32")[0])
    report = []
    for n in GREEDY_LENGTHS:
        ids = clean_prompt(m, n, seed=3)[0]
        toks = llama_greedy(ids, N_GEN)
        seq = ids + toks
        res = ref_moe.forward(m, seq)
        gap = ref_moe.kth_gap(res.probs, m.cfg.k).min()
        assert gap >= NEAR_TIE, f"n={n}: a near tie ({gap:.1e}) in the greedy continuation"
        z = res.logits[n - 1:n - 1 + N_GEN]
        zl = llama_logits(seq)[n - 1:n - 1 + N_GEN]
        ours = z.argmax(-1)
        assert ours.tolist() == toks, f"n={n}: reference greedy {ours.tolist()} vs llama.cpp {toks}"
        d = np.abs(log_softmax(z)[np.arange(N_GEN), toks] - log_softmax(zl)[np.arange(N_GEN), toks])
        assert d.max() < LOGPROB_TOL, f"n={n}: log-prob off by {d.max():.2e} at {d.argmax()}"
        report.append(f"n={n}:{d.max():.1e} (min margin {margins(z).min():.2f})")
    print("# reference vs llama.cpp greedy, max|dlogprob| " + " ".join(report), flush=True)


@case
def reference_sensitivity():
    m = ref(model("f32")[0])
    ids = clean_prompt(m, 300)[0]
    z = llama_logits(ids)
    report = []
    for variant in ("no_renorm", "k_minus_1", "uniform_weights", "no_qk_norm", "router_before_norm",
                    "gate_up_swapped", "experts_transposed"):
        w = ref_moe.Model(**{**m.__dict__, "variant": variant})
        d = np.abs(ref_moe.logits(w, ids) - z).max()
        report.append(f"{variant}:{d:.2f}")
        assert d > FAR, f"variant {variant} is within {d:.2e} of llama.cpp: the comparison cannot see it"
    print("# wrong variants vs llama.cpp, max|diff| " + " ".join(report), flush=True)


@case
def hf_folder_equals_gguf():
    ids = prompt(100, seed=1)
    worst = 0.0
    for dt in DTYPES:
        g, h = model(dt)
        d = np.abs(ref_moe.logits(ref(g), ids) - ref_moe.logits(ref(h), ids)).max()
        worst = max(worst, d)
        assert d <= 1e-12, f"{dt}: |hf - gguf| {d:.3e}"
    _, h = model("f32", norm_topk_prob=False)
    m = ref(h)
    assert m.cfg.norm_topk is False
    d = np.abs(ref_moe.logits(m, ids) - ref_moe.logits(ref(model("f32")[0]), ids)).max()
    assert d > FAR, f"norm_topk_prob false changes the logits by only {d:.2e}"
    print(f"# HF folder vs GGUF max|diff| {worst:.1e}; norm_topk_prob false moves them by {d:.2f}", flush=True)


# ---------------------------------------------------------------------------
# Part 2: the engine


def engine_logits(path, ids):
    out = os.path.join(DIR, "logits.f32")
    if os.path.exists(out):
        os.remove(out)
    run([LOGITS, "--model", path, "--prompt-ids", ",".join(map(str, ids)), "--out", out])
    a = np.fromfile(out, dtype="<f4")
    assert a.size == len(ids) * VOCAB, f"{out}: {a.size} floats, expected {len(ids)}x{VOCAB}"
    return a.reshape(len(ids), VOCAB).astype(np.float64)


def engine_vs_ref(label, path, m=None):
    m = m or ref(path)
    errs, worst, tries = [], 0.0, []
    for n in ENGINE_LENGTHS:
        ids, res = clean_prompt(m, n, seed=2)
        if ids != prompt(n, seed=2):
            tries.append(n)
        got = engine_logits(path, ids)
        if not np.isfinite(got).all():
            errs.append(f"n={n}: non-finite engine logits")
            continue
        d = np.abs(got - res.logits).max(axis=-1)
        worst = max(worst, d.max())
        if d.max() >= ENGINE_TOL:
            errs.append(f"n={n}: max {d.max():.3e} at pos {d.argmax()} (first over at "
                        f"{np.nonzero(d >= ENGINE_TOL)[0][0]})")
    print(f"# {label}: max|engine - ref| {worst:.1e}" + (f" (prompts of {tries} tokens re-drawn: near tie)"
                                                            if tries else ""), flush=True)
    assert not errs, f"{label}: " + "; ".join(errs)


def _gguf_case(dt):
    def fn():
        engine_vs_ref(f"gguf {dt}", model(dt)[0])
    fn.__name__ = f"engine_logits_gguf_{dt}"
    case(fn)


def _hf_case(dt):
    def fn():
        engine_vs_ref(f"hf {dt}", model(dt)[1])
    fn.__name__ = f"engine_logits_hf_{dt}"
    case(fn)


for _dt in DTYPES:
    _gguf_case(_dt)
for _dt in HF_DTYPES:
    _hf_case(_dt)


@case
def engine_logits_hf_norm_topk_prob_false():
    path = model("f32", norm_topk_prob=False)[1]
    m = ref(path)
    assert m.cfg.norm_topk is False
    engine_vs_ref("hf f32 norm_topk_prob false", path, m)


@case
def engine_logits_miss_wrong_references():
    # The engine comparisons can fail: the engine's logits are > FAR from the
    # wrong variants of the reference, and on the norm_topk_prob false folder
    # > FAR from the renormalizing reference (the engine reads the flag).
    ids, _ = clean_prompt(ref(model("f32")[0]), 100, seed=2)
    got = engine_logits(model("f32")[0], ids)
    m = ref(model("f32")[0])
    report = []
    for variant in ("no_renorm", "k_minus_1", "experts_transposed", "gate_up_swapped", "router_before_norm"):
        d = np.abs(got - ref_moe.logits(ref_moe.Model(**{**m.__dict__, "variant": variant}), ids)).max()
        report.append(f"{variant}:{d:.2f}")
        assert d > FAR, f"engine within {d:.2e} of the {variant} reference"
    d = np.abs(engine_logits(model("f32", norm_topk_prob=False)[1], ids) - ref_moe.logits(m, ids)).max()
    report.append(f"nonorm-folder-vs-renorm-ref:{d:.2f}")
    assert d > FAR, f"the norm_topk_prob false folder is within {d:.2e} of the renormalizing reference"
    print("# engine vs wrong references max|diff| " + " ".join(report), flush=True)


@case
def engine_greedy_vs_llamacpp():
    path = model("f32")[0]
    errs, report = [], []
    for n in GREEDY_LENGTHS:
        ids = clean_prompt(ref(path), n, seed=3)[0]
        p = run([ROLLOUT_GEN, "--model", path, "--prompt-ids", ",".join(map(str, ids)), "--max-tokens", str(N_GEN),
                 "--temperature", "0", "--ignore-eos", "--json"])
        lines = [ln for ln in p.stdout.splitlines() if ln.strip().startswith("{")]
        assert len(lines) == 1, f"rollout-gen printed {len(lines)} JSON lines: {p.stdout[-500:]}"
        res = json.loads(lines[0])
        ours = [int(t) for t in res["token_ids"]]
        lp = np.array(res["logprobs"], dtype=np.float64)
        assert len(ours) == N_GEN == len(lp), (len(ours), len(lp))
        z = llama_logits(ids + ours)[n - 1:n - 1 + N_GEN]           # row j predicts ours[j]
        ref_lp = log_softmax(z)[np.arange(N_GEN), ours]
        mg, top = margins(z), z.argmax(axis=-1)
        wrong = [j for j in range(N_GEN) if mg[j] > MARGIN and top[j] != ours[j]]
        d = np.abs(lp - ref_lp)
        if wrong:
            errs.append(f"n={n}: argmax differs where margin > {MARGIN} at {wrong[:6]} "
                        f"(ours {[ours[j] for j in wrong[:6]]}, llama.cpp {[int(top[j]) for j in wrong[:6]]})")
        if d.max() >= LOGPROB_TOL:
            errs.append(f"n={n}: logprob off by {d.max():.2e} at {d.argmax()}")
        report.append(f"n={n}:{d.max():.1e} ({int((mg <= MARGIN).sum())} steps with margin <= {MARGIN})")
    print("# engine greedy vs llama.cpp max|dlogprob| " + " ".join(report), flush=True)
    assert not errs, "; ".join(errs)


def engine_routes(dt):
    # The experts the engine routed every position to, per layer, in the
    # reference's order (highest weight first).
    path = model(dt)[0]
    m = ref(path)
    c = m.cfg
    errs, report = [], []
    for n in (7, 100, 300):
        ids, res = clean_prompt(m, n, seed=2)
        out = os.path.join(DIR, "routes.i32")
        if os.path.exists(out):
            os.remove(out)
        run([LOGITS, "--model", path, "--prompt-ids", ",".join(map(str, ids)), "--out",
             os.path.join(DIR, "logits.f32"), "--routes-out", out])
        a = np.fromfile(out, dtype="<i4")
        assert a.size == c.n_layer * n * c.k, f"{out}: {a.size} ints, expected {c.n_layer}x{n}x{c.k}"
        got = a.reshape(c.n_layer, n, c.k)
        want = res.routes
        same_set = (np.sort(got, -1) == np.sort(want, -1)).all(-1)
        same_order = (got == want).all(-1)
        if not same_set.all():
            l, t = np.argwhere(~same_set)[0]
            errs.append(f"n={n}: {int((~same_set).sum())} (layer, position) routed to other experts, first layer "
                        f"{l} pos {t}: engine {got[l, t].tolist()} ref {want[l, t].tolist()}")
        elif not same_order.all():
            l, t = np.argwhere(~same_order)[0]
            errs.append(f"n={n}: same experts, other order at layer {l} pos {t}: engine {got[l, t].tolist()} "
                        f"ref {want[l, t].tolist()} (expected highest weight first)")
        report.append(f"n={n}:{int(same_order.sum())}/{same_order.size}")
    print(f"# {dt}: engine routes equal to the reference's " + " ".join(report), flush=True)
    assert not errs, f"{dt}: " + "; ".join(errs)


def _routes_case(dt):
    def fn():
        engine_routes(dt)
    fn.__name__ = f"engine_routes_{dt}"
    case(fn)


for _dt in ("f32", "q4_k_m"):
    _routes_case(_dt)


if __name__ == "__main__":
    main()
