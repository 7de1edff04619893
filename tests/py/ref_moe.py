"""A float64 NumPy reference of Qwen3-MoE (llama.cpp arch `qwen3moe`, HF
Qwen3MoeForCausalLM), read from a GGUF (every tensor dequantized with
gguf.quants.dequantize) or from an HF folder (config.json + safetensors).
Independent of the C engine; the GGUF/safetensors readers and the small
numeric helpers are ref_llama's.

Forward pass (HF Qwen3MoeDecoderLayer = llama.cpp src/models/qwen3moe.cpp):
  x = embed[ids]
  per layer: h = rmsnorm(x, attn_norm); q/k/v projections (no biases);
             per-head rmsnorm of q and k (q_norm/k_norm over head_dim, eps
             rms_norm_eps) before rotate-half (NEOX) RoPE; GQA causal
             attention scaled by 1/sqrt(head_dim); x += o_proj(attn)
             h = rmsnorm(x, ffn_norm); router logits h @ Wr^T [T, E];
             p = softmax(logits); the top k experts by p, highest first, ties
             to the lower id (a stable sort of -p); weights w = p[top]
             renormalized to sum 1 when norm_topk (a GGUF: always, as
             llama.cpp for qwen3moe; an HF folder: config norm_topk_prob,
             transformers' default false); x += sum_j w_j down_e(silu(gate_e h)
             * up_e h)
  final rmsnorm, lm_head (untied; tied when output.weight / lm_head.weight is absent).
Everything in float64 from the float32-exact weights; eps and theta are the
float32 values a GGUF holds (an HF config's are rounded to float32 the same
way).

    m = load("tiny-moe-f32.gguf")           # or load_hf("tiny-moe-f32.hf")
    r = forward(m, [1, 2, 3])
    r.logits  [T, vocab]     r.routes [L, T, k] (expert ids, highest weight first)
    r.weights [L, T, k]      r.probs  [L, T, E] (softmax of the router logits)
    kth_gap(r.probs, k) [L, T]: p_(k) - p_(k+1), the sorted k-th minus (k+1)-th
    probability: a route comparison should skip positions where it is < 1e-6.

Model.variant takes deliberately wrong variants (for sensitivity checks):
"no_renorm", "k_minus_1", "uniform_weights", "no_qk_norm", "router_before_norm",
"gate_up_swapped", "experts_transposed" (expert slices read as [rows, E, cols]:
the axis order of a 3-D tensor mixed up), "ties_high" (ties to the higher id;
the same as the right one unless probabilities tie exactly).

Command line: python3 tests/py/ref_moe.py MODEL.gguf|HF_DIR 1,2,3   (top-5 logits, routes)
"""
import json
import os
import sys
from dataclasses import dataclass, field

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gguf_fast import GGUFReader  # noqa: E402
from ref_llama import _field, _tensor, read_safetensors, rmsnorm, rope, silu, base_inv_freq  # noqa: E402


@dataclass
class Config:
    n_layer: int
    dim: int
    n_head: int
    n_head_kv: int
    head_dim: int
    n_expert: int
    k: int
    ffn_exp: int
    vocab: int
    eps: float
    theta: float
    ctx: int
    norm_topk: bool = True
    ffn: int = 0           # the dense intermediate size (unused by MoE layers)


@dataclass
class Model:
    cfg: Config
    tok_embd: np.ndarray
    layers: list = field(default_factory=list)   # dicts: attn_norm wq wk wv wo q_norm k_norm ffn_norm router
    #                                               gate [E, F, D] up [E, F, D] down [E, D, F]
    norm: np.ndarray = None
    lm_head: np.ndarray = None
    tied: bool = False
    inv_freq: np.ndarray = None
    variant: str = ""


@dataclass
class Result:
    logits: np.ndarray     # [T, vocab]
    routes: np.ndarray     # [L, T, k] int, highest weight first
    weights: np.ndarray    # [L, T, k]
    probs: np.ndarray      # [L, T, E]
    router_logits: np.ndarray  # [L, T, E]


def _check(m):
    c = m.cfg
    assert 1 <= c.k <= c.n_expert, (c.k, c.n_expert)
    for i, L in enumerate(m.layers):
        want = {"wq": (c.n_head * c.head_dim, c.dim), "wk": (c.n_head_kv * c.head_dim, c.dim),
                "wv": (c.n_head_kv * c.head_dim, c.dim), "wo": (c.dim, c.n_head * c.head_dim),
                "q_norm": (c.head_dim,), "k_norm": (c.head_dim,), "attn_norm": (c.dim,), "ffn_norm": (c.dim,),
                "router": (c.n_expert, c.dim), "gate": (c.n_expert, c.ffn_exp, c.dim),
                "up": (c.n_expert, c.ffn_exp, c.dim), "down": (c.n_expert, c.dim, c.ffn_exp)}
        for n, shp in want.items():
            assert L[n].shape == shp, f"layer {i} {n}: shape {L[n].shape}, expected {shp}"
    assert m.lm_head.shape == (c.vocab, c.dim), m.lm_head.shape
    m.inv_freq = base_inv_freq(c.theta, c.head_dim)
    return m


def load(path):
    """A qwen3moe GGUF. norm_topk is True (llama.cpp always renormalizes for this arch)."""
    r = GGUFReader(path)
    arch = _field(r, "general.architecture")
    if arch != "qwen3moe":
        raise ValueError(f"{path}: architecture {arch!r}, expected 'qwen3moe'")
    t = {x.name: x for x in r.tensors}
    k = lambda key, default=None: _field(r, f"qwen3moe.{key}", default)  # noqa: E731
    if int(k("expert_shared_count", 0)):
        raise ValueError("shared experts not supported")
    dim, n_head = int(k("embedding_length")), int(k("attention.head_count"))
    head_dim = int(k("attention.key_length", dim // n_head))
    assert int(k("attention.value_length", head_dim)) == head_dim
    tok = _tensor(t["token_embd.weight"])
    cfg = Config(n_layer=int(k("block_count")), dim=dim, n_head=n_head,
                 n_head_kv=int(k("attention.head_count_kv", n_head)), head_dim=head_dim,
                 n_expert=int(k("expert_count")), k=int(k("expert_used_count")),
                 ffn_exp=int(k("expert_feed_forward_length")), vocab=tok.shape[0],
                 eps=float(k("attention.layer_norm_rms_epsilon")), theta=float(k("rope.freq_base", 10000.0)),
                 ctx=int(k("context_length", 2048)), norm_topk=True, ffn=int(k("feed_forward_length", 0)))
    g = lambda n: _tensor(t[n])  # noqa: E731
    m = Model(cfg=cfg, tok_embd=tok)
    for i in range(cfg.n_layer):
        b = f"blk.{i}."
        m.layers.append(dict(
            attn_norm=g(b + "attn_norm.weight"), wq=g(b + "attn_q.weight"), wk=g(b + "attn_k.weight"),
            wv=g(b + "attn_v.weight"), wo=g(b + "attn_output.weight"), q_norm=g(b + "attn_q_norm.weight"),
            k_norm=g(b + "attn_k_norm.weight"), ffn_norm=g(b + "ffn_norm.weight"),
            router=g(b + "ffn_gate_inp.weight"), gate=g(b + "ffn_gate_exps.weight"),
            up=g(b + "ffn_up_exps.weight"), down=g(b + "ffn_down_exps.weight")))
    m.norm = g("output_norm.weight")
    if "output.weight" in t:
        m.lm_head = g("output.weight")
    else:
        m.lm_head, m.tied = tok, True
    return _check(m)


def load_hf(folder):
    """An HF Qwen3MoeForCausalLM folder (model.safetensors or an index of shards)."""
    with open(os.path.join(folder, "config.json")) as f:
        c = json.load(f)
    if "Qwen3MoeForCausalLM" not in (c.get("architectures") or []) and c.get("model_type") != "qwen3_moe":
        raise ValueError(f"{folder}: not a Qwen3MoeForCausalLM")
    if int(c.get("decoder_sparse_step", 1)) != 1 or c.get("mlp_only_layers"):
        raise ValueError(f"{folder}: dense layers (decoder_sparse_step / mlp_only_layers) not supported")
    idx = os.path.join(folder, "model.safetensors.index.json")
    files = sorted(set(json.load(open(idx))["weight_map"].values())) if os.path.exists(idx) else ["model.safetensors"]
    w = {}
    for fn in files:
        w.update(read_safetensors(os.path.join(folder, fn)))
    f32 = lambda x: float(np.float32(x))  # noqa: E731
    dim, n_head = int(c["hidden_size"]), int(c["num_attention_heads"])
    tok = w["model.embed_tokens.weight"]
    cfg = Config(n_layer=int(c["num_hidden_layers"]), dim=dim, n_head=n_head,
                 n_head_kv=int(c.get("num_key_value_heads") or n_head),
                 head_dim=int(c.get("head_dim") or dim // n_head), n_expert=int(c["num_experts"]),
                 k=int(c["num_experts_per_tok"]), ffn_exp=int(c["moe_intermediate_size"]),
                 vocab=tok.shape[0], eps=f32(c.get("rms_norm_eps", 1e-6)), theta=f32(c.get("rope_theta", 10000.0)),
                 ctx=int(c.get("max_position_embeddings", 2048)), norm_topk=bool(c.get("norm_topk_prob", False)),
                 ffn=int(c.get("intermediate_size", 0)))
    m = Model(cfg=cfg, tok_embd=tok)
    for i in range(cfg.n_layer):
        p = f"model.layers.{i}."
        ex = lambda n: np.stack([w[f"{p}mlp.experts.{e}.{n}.weight"] for e in range(cfg.n_expert)])  # noqa: E731
        m.layers.append(dict(
            attn_norm=w[p + "input_layernorm.weight"], wq=w[p + "self_attn.q_proj.weight"],
            wk=w[p + "self_attn.k_proj.weight"], wv=w[p + "self_attn.v_proj.weight"],
            wo=w[p + "self_attn.o_proj.weight"], q_norm=w[p + "self_attn.q_norm.weight"],
            k_norm=w[p + "self_attn.k_norm.weight"], ffn_norm=w[p + "post_attention_layernorm.weight"],
            router=w[p + "mlp.gate.weight"], gate=ex("gate_proj"), up=ex("up_proj"), down=ex("down_proj")))
    m.norm = w["model.norm.weight"]
    tied = bool(c.get("tie_word_embeddings", False)) or "lm_head.weight" not in w
    m.lm_head, m.tied = (tok, True) if tied else (w["lm_head.weight"], False)
    return _check(m)


def softmax(z):
    z = z - z.max(axis=-1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(axis=-1, keepdims=True)


def route(probs, k, norm, ties_low=True):
    """(top [T, k] ids highest first, ties to the lower id; weights [T, k])."""
    if ties_low:
        top = np.argsort(-probs, axis=-1, kind="stable")[:, :k]
    else:
        E = probs.shape[-1]
        top = (E - 1 - np.argsort(-probs[:, ::-1], axis=-1, kind="stable"))[:, :k]
    w = np.take_along_axis(probs, top, axis=-1)
    if norm:
        w = w / w.sum(axis=-1, keepdims=True)
    return top, w


def kth_gap(probs, k):
    """[..., ] p_(k) - p_(k+1) of the probabilities sorted descending (inf when k == E)."""
    s = -np.sort(-probs, axis=-1)
    if k >= s.shape[-1]:
        return np.full(s.shape[:-1], np.inf)
    return s[..., k - 1] - s[..., k]


def moe(L, h, c, variant="", router_in=None):
    """The MoE FFN of one layer over rows h [T, D]: (out [T, D], top, w, probs, logits).
    router_in: the rows the router sees (h unless given: a wrong variant)."""
    logits = (h if router_in is None else router_in) @ L["router"].T
    probs = softmax(logits)
    k = c.k - 1 if variant == "k_minus_1" else c.k
    top, w = route(probs, k, c.norm_topk and variant != "no_renorm", ties_low=variant != "ties_high")
    if variant == "uniform_weights":
        w = np.full_like(w, 1.0 / k)
    gate, up, down = L["gate"], L["up"], L["down"]
    if variant == "gate_up_swapped":
        gate, up = up, gate
    if variant == "experts_transposed":     # [E, R, C] bytes read as [R, E, C]
        gate, up, down = (a.reshape(a.shape[1], a.shape[0], a.shape[2]).swapaxes(0, 1) for a in (gate, up, down))
    out = np.zeros_like(h)
    for e in np.unique(top):
        rows, slot = np.nonzero(top == e)
        x = h[rows]
        y = (silu(x @ gate[e].T) * (x @ up[e].T)) @ down[e].T
        out[rows] += w[rows, slot][:, None] * y
    return out, top, w, probs, logits


def forward(m, ids):
    c = m.cfg
    ids = np.asarray(ids, dtype=np.int64)
    T = len(ids)
    if T == 0 or ids.min() < 0 or ids.max() >= c.vocab:
        raise ValueError(f"expected 1 or more token ids in [0, {c.vocab})")
    pos = np.arange(T)
    x = m.tok_embd[ids].copy()
    group = c.n_head // c.n_head_kv
    mask = np.triu(np.full((T, T), -np.inf), k=1)
    scale = 1.0 / np.sqrt(c.head_dim)
    routes, weights, probs, rlogits = [], [], [], []
    for L in m.layers:
        h = rmsnorm(x, L["attn_norm"], c.eps)
        q = (h @ L["wq"].T).reshape(T, c.n_head, c.head_dim)
        k = (h @ L["wk"].T).reshape(T, c.n_head_kv, c.head_dim)
        v = (h @ L["wv"].T).reshape(T, c.n_head_kv, c.head_dim)
        if m.variant != "no_qk_norm":
            q = rmsnorm(q, L["q_norm"], c.eps)
            k = rmsnorm(k, L["k_norm"], c.eps)
        q, k = rope(q, pos, m.inv_freq), rope(k, pos, m.inv_freq)
        k, v = np.repeat(k, group, axis=1), np.repeat(v, group, axis=1)
        s = np.einsum("thd,shd->hts", q, k) * scale + mask
        s = s - s.max(axis=-1, keepdims=True)
        p = np.exp(s)
        p /= p.sum(axis=-1, keepdims=True)
        x = x + np.einsum("hts,shd->thd", p, v).reshape(T, -1) @ L["wo"].T
        h = rmsnorm(x, L["ffn_norm"], c.eps)
        out, top, w, pr, lg = moe(L, h, c, m.variant, x if m.variant == "router_before_norm" else None)
        x = x + out
        routes.append(top)
        weights.append(w)
        probs.append(pr)
        rlogits.append(lg)
    x = rmsnorm(x, m.norm, c.eps)
    return Result(logits=x @ m.lm_head.T, routes=np.stack(routes), weights=np.stack(weights),
                  probs=np.stack(probs), router_logits=np.stack(rlogits))


def logits(m, ids):
    return forward(m, ids).logits


def log_softmax(z):
    z = np.asarray(z, dtype=np.float64)
    mx = z.max(axis=-1, keepdims=True)
    return z - mx - np.log(np.exp(z - mx).sum(axis=-1, keepdims=True))


def greedy(m, ids, n):
    """n greedy tokens after ids (full recompute each step): (tokens, log-probs, per-step top-2 margins)."""
    seq, toks, lps, mgs = list(ids), [], [], []
    for _ in range(n):
        z = forward(m, seq).logits[-1]
        t = int(np.argmax(z))
        top2 = np.sort(z)[-2:]
        toks.append(t)
        lps.append(float(log_softmax(z)[t]))
        mgs.append(float(top2[1] - top2[0]))
        seq.append(t)
    return toks, np.array(lps), np.array(mgs)


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit("usage: ref_moe.py MODEL.gguf|HF_DIR ID,ID,...")
    mdl = load_hf(sys.argv[1]) if os.path.isdir(sys.argv[1]) else load(sys.argv[1])
    res = forward(mdl, [int(t) for t in sys.argv[2].split(",")])
    print(mdl.cfg)
    for i, row in enumerate(res.logits):
        top = np.argsort(-row)[:5]
        print(i, " ".join(f"{t}:{row[t]:.4f}" for t in top), "| routes",
              " ".join(",".join(map(str, res.routes[l, i])) for l in range(mdl.cfg.n_layer)))
