"""A float64 NumPy reference of the Llama-style decoders (llama, qwen2, qwen3)
and Gemma 3 (gemma3), read from a GGUF file or from a Hugging Face folder.

Independent of the C engine: a GGUF is parsed with the `gguf` package
(GGUFReader) and every tensor is dequantized with gguf.quants.dequantize; an
HF folder (config.json + model.safetensors) is read with the small
safetensors reader below. The weights are brought into Hugging Face layout
(llama.cpp's Q/K row permutation is undone for llama; Qwen GGUFs are not
permuted) and the forward pass is HF's: RMSNorm, rotate-half RoPE, GQA causal
attention scaled by 1/sqrt(head_dim), SwiGLU, tied embeddings when
output.weight / lm_head.weight is absent. Per family:
  qwen2  q/k/v projections add their bias (attn_{q,k,v}.bias; none on o_proj).
  qwen3  q_norm/k_norm: RMSNorm over head_dim of each head after the
         projection and before RoPE (eps = rms_norm_eps); head_dim explicit
         (attention.key_length), so the q width may differ from hidden.
  gemma3 (llama.cpp src/models/gemma3.cpp = HF Gemma3DecoderLayer) x =
         embed * sqrt(dim) (the float32 sqrtf(n_embd) llama.cpp uses); every
         RMSNorm multiplies by 1 + w: a GGUF holds 1 + w (the converter adds
         1), an HF folder w (load_hf adds 1 in float32); q_norm/k_norm per
         head before RoPE; NEOX (rotate-half) RoPE with base
         `rope.freq_base_swa` (default 10000; HF rope_local_base_freq) on
         local layers and rope.freq_base on global ones; q scaled by
         f_attention_scale = 1/sqrt(head_dim) (1/sqrt(dim/heads) for the
         62-layer 27B, as llama.cpp; HF query_pre_attn_scalar^-0.5), float32;
         local layers attend to keys p-W+1..p (W = attention.sliding_window);
         layer i is local when i % 6 < 5 (or as
         attention.sliding_window_pattern / HF layer_types say); o_proj ->
         post_attention_norm -> + residual; ffn_norm (HF
         pre_feedforward_layernorm) -> down(gelu_tanh(gate) * up) ->
         post_ffw_norm -> + residual; final norm; tied head; linear RoPE
         scaling on global layers only; final_logit_softcapping if present.
         GELU: model.gelu "tanh" (float64, HF's gelu_pytorch_tanh, the
         default) or "ggml_f16": llama.cpp's CPU GEGLU, which rounds the gate
         to fp16 and reads GELU from a table of fp16 values (ggml-cpu vec.h,
         GGML_GELU_FP16), used to show everything else agrees with llama.cpp
         to fp32 rounding.
RoPE: angle_i = pos * theta^(-2i/head_dim) / div_i, where div_i is
rope_freqs.weight[i] when the GGUF has it (Llama 3 scaling, as llama.cpp
applies it; from an HF config the same float32 divisors are computed from
rope_scaling {rope_type: llama3, ...}), times 1/factor for linear scaling
(`<arch>.rope.scaling.type` "linear" / rope_type "linear"). Everything is
computed in float64 from the dequantized (float32-exact) weights; eps, theta
and the divisors are the float32 values llama.cpp and the engine use.

    model = load("model.gguf")            # or load_hf("folder/")
    out = logits(model, [1, 2, 3])        # np.ndarray [3, vocab] float64

load(path, unpermute_qk=False) keeps llama.cpp's row order for Q/K on a llama
file, and unpermute_qk=True un-permutes a Qwen file that was never permuted:
deliberately wrong references, used to show that the parity tests are
sensitive to the layout.

f32_copy(src, dst) writes the GGUF with every tensor dequantized to F32 (same
values): llama.cpp on that copy, with an F32 KV cache and flash attention off,
computes in fp32 and agrees with this reference to ~1e-4 (on the Q4_1 file
itself it quantizes activations to 8 bits and differs by up to a few logits).

Command line:
  python3 tests/py/ref_llama.py MODEL.gguf|HF_DIR 1,2,3     top-5 logits per position
  python3 tests/py/ref_llama.py MODEL.gguf 1,2,3 --llamacpp also max |ref - llama.cpp|
      on the file and on its F32 copy (written next to /tmp)
"""
import os
import sys
from dataclasses import dataclass, field

import numpy as np
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gguf_fast import GGUFReader  # noqa: E402  (the package's reader, its arrays read in one pass)
from gguf.quants import dequantize


ARCHS = ("llama", "qwen2", "qwen3", "gemma3")
HF_ARCHS = {"LlamaForCausalLM": "llama", "Qwen2ForCausalLM": "qwen2", "Qwen3ForCausalLM": "qwen3",
            "Gemma3ForCausalLM": "gemma3"}
HF_MODEL_TYPES = {"gemma3_text": "gemma3"}


@dataclass
class Config:
    n_layer: int        # transformer blocks
    dim: int            # hidden size (n_embd)
    n_head: int         # query heads
    n_head_kv: int      # key/value heads (== n_head for MHA)
    head_dim: int       # per-head size
    ffn: int            # SwiGLU intermediate size
    vocab: int          # rows of the LM head
    eps: float          # RMSNorm epsilon
    theta: float        # RoPE base frequency
    ctx: int            # trained context length (informational)
    arch: str = "llama"  # llama | qwen2 | qwen3
    rope_scaling: str = "none"  # none | linear | llama3 (informational; inv_freq has it)
    # Gemma 3 (defaults: the other families)
    sliding_window: int = 0     # tokens a local layer's query sees, itself included; 0: none
    theta_local: float = 0.0    # RoPE base of local layers
    attn_scale: float = 0.0     # q scale; 0: 1/sqrt(head_dim)
    embd_scale: float = 1.0     # embeddings multiplied by it (float32 value)
    final_softcap: float = 0.0  # final logit soft-capping; 0: none


@dataclass
class Model:
    cfg: Config
    tok_embd: np.ndarray                    # [vocab, dim] float64
    layers: list = field(default_factory=list)  # dicts of HF-layout float64 weights (bq/bk/bv, q_norm/k_norm or None)
    norm: np.ndarray = None                 # [dim]
    lm_head: np.ndarray = None              # [vocab, dim] (tok_embd when tied)
    tied: bool = False                      # output.weight absent
    inv_freq: np.ndarray = None             # [head_dim/2] RoPE inverse frequencies, scaling included
    inv_freq_local: np.ndarray = None       # gemma3: local layers' ones (layers with L["local"])
    gelu: str = "tanh"                      # gemma3: "tanh" (exact) | "ggml_f16" (llama.cpp's CPU table)


# ---------------------------------------------------------------------------
# GGUF reading


def _field(reader, key, default=None):
    f = reader.fields.get(key)
    if f is None:
        if default is None:
            raise KeyError(f"GGUF metadata key {key!r} missing")
        return default
    v = f.parts[f.data[0]]
    if len(f.types) == 1 and f.types[0].name == "STRING":
        return bytes(v).decode("utf-8")
    return v[0].item()


def _tensor(t):
    """Dequantizes a ReaderTensor to float64 in numpy (HF) order: ggml ne[0] is the
    contiguous row length, so a 2-D tensor comes back as [ne1, ne0] = [out, in]."""
    w = dequantize(t.data, t.tensor_type)
    shape = tuple(int(d) for d in reversed(t.shape.tolist()))
    return np.asarray(w, dtype=np.float64).reshape(shape)


def unpermute(w, n_head):
    """Inverse of convert_hf_to_gguf's LlamaModel.permute: llama.cpp stores the
    rows of each head as interleaved (x0,x1),(x2,x3)... pairs for its "normal"
    RoPE; HF keeps the first and second half of each head apart. Works on a
    1-D bias too."""
    if w.ndim == 1:
        return unpermute(w[:, None], n_head)[:, 0]
    rows, cols = w.shape
    return w.reshape(n_head, rows // n_head // 2, 2, cols).swapaxes(1, 2).reshape(rows, cols)


def base_inv_freq(theta, head_dim):
    """theta^(-2i/head_dim), i < head_dim/2, in float64."""
    return float(theta) ** (-np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)


def llama3_divisors(theta, head_dim, factor, low, high, orig):
    """Llama 3 scaling as per-frequency divisors of the base inverse frequency,
    computed in float64 from the config and rounded to float32 (what a GGUF's
    rope_freqs.weight holds): wavelength wl = 2 pi / inv; 1 below orig/high,
    factor above orig/low, in between 1/((1-s)/factor + s) with
    s = (orig/wl - low)/(high - low) (transformers' _compute_llama3_parameters,
    written as a divisor)."""
    wl = 2.0 * np.pi / base_inv_freq(theta, head_dim)
    s = (orig / wl - low) / (high - low)
    div = np.where(wl < orig / high, 1.0, np.where(wl > orig / low, factor, 1.0 / ((1.0 - s) / factor + s)))
    return div.astype(np.float32).astype(np.float64)


def _assemble(cfg, tok, get, has, norm, lm_head, unpermute_qk, rope_div, local=None):
    """Builds the Model from tensors in GGUF naming, get(name) -> float64 array in
    HF (numpy) order; rope_div: per-frequency divisors or None (global layers
    only for gemma3); local: per layer, True for a sliding-window layer."""
    if unpermute_qk is None:
        unpermute_qk = cfg.arch == "llama"
    m = Model(cfg=cfg, tok_embd=tok)
    q_width, kv_width = cfg.n_head * cfg.head_dim, cfg.n_head_kv * cfg.head_dim
    for i in range(cfg.n_layer):
        g = lambda n: get(f"blk.{i}.{n}")  # noqa: E731
        opt = lambda n: get(f"blk.{i}.{n}") if has(f"blk.{i}.{n}") else None  # noqa: E731
        L = dict(
            attn_norm=g("attn_norm.weight"), wq=g("attn_q.weight"), wk=g("attn_k.weight"), wv=g("attn_v.weight"),
            wo=g("attn_output.weight"), ffn_norm=g("ffn_norm.weight"), w_gate=g("ffn_gate.weight"),
            w_up=g("ffn_up.weight"), w_down=g("ffn_down.weight"),
            bq=opt("attn_q.bias"), bk=opt("attn_k.bias"), bv=opt("attn_v.bias"),
            q_norm=opt("attn_q_norm.weight"), k_norm=opt("attn_k_norm.weight"),
            post_attn_norm=opt("post_attention_norm.weight"), post_ffw_norm=opt("post_ffw_norm.weight"),
            local=bool(local and local[i]),
        )
        if unpermute_qk:
            L["wq"], L["wk"] = unpermute(L["wq"], cfg.n_head), unpermute(L["wk"], cfg.n_head_kv)
            if L["bq"] is not None:
                L["bq"], L["bk"] = unpermute(L["bq"], cfg.n_head), unpermute(L["bk"], cfg.n_head_kv)
        assert L["wq"].shape == (q_width, cfg.dim), L["wq"].shape
        assert L["wk"].shape == (kv_width, cfg.dim), L["wk"].shape
        assert L["wv"].shape == (kv_width, cfg.dim), L["wv"].shape
        assert L["wo"].shape == (cfg.dim, q_width), L["wo"].shape
        if cfg.arch == "qwen2":
            missing = [n for n in ("bq", "bk", "bv") if L[n] is None]
            assert not missing, f"qwen2 layer {i}: biases {missing} missing"
        if cfg.arch == "qwen3":
            assert L["q_norm"] is not None and L["k_norm"] is not None, f"qwen3 layer {i}: q_norm/k_norm missing"
            assert L["q_norm"].shape == L["k_norm"].shape == (cfg.head_dim,), L["q_norm"].shape
        if cfg.arch == "gemma3":
            missing = [n for n in ("q_norm", "k_norm", "post_attn_norm", "post_ffw_norm") if L[n] is None]
            assert not missing, f"gemma3 layer {i}: {missing} missing"
            assert L["q_norm"].shape == L["k_norm"].shape == (cfg.head_dim,), L["q_norm"].shape
        m.layers.append(L)
    m.norm = norm
    if lm_head is not None:
        m.lm_head = lm_head
    else:
        m.lm_head, m.tied = tok, True
    inv_freq = base_inv_freq(cfg.theta, cfg.head_dim)
    if rope_div is not None:
        inv_freq = inv_freq / rope_div
    m.inv_freq = inv_freq
    if cfg.arch == "gemma3":
        m.inv_freq_local = base_inv_freq(cfg.theta_local, cfg.head_dim)
    return m


def gemma3_local_layers(n_layer, pattern=6):
    """llama.cpp's set_swa_pattern(n, dense_first=false): layer i is local when
    i % n < n - 1 (every layer when n == 0); a list of booleans is taken as is."""
    if isinstance(pattern, (list, tuple, np.ndarray)):
        assert len(pattern) == n_layer, (len(pattern), n_layer)
        return [bool(x) for x in pattern]
    n = int(pattern)
    return [n == 0 or i % n < n - 1 for i in range(n_layer)]


def gemma3_attn_scale(n_layer, dim, n_head, head_dim):
    """llama.cpp's f_attention_scale (float32): 1/sqrt(n_embd/n_head) for the
    62-layer 27B, 1/sqrt(head_dim) otherwise."""
    d = dim // n_head if n_layer == 62 else head_dim
    return float(np.float32(1.0) / np.sqrt(np.float32(d)))


def load(path, unpermute_qk=None):
    """Reads a llama/qwen2/qwen3 GGUF. unpermute_qk: None = the family's layout
    (undo llama.cpp's permutation for llama only); True/False forces it (a wrong
    reference, for sensitivity checks)."""
    r = GGUFReader(path)
    arch = _field(r, "general.architecture")
    if arch not in ARCHS:
        raise ValueError(f"{path}: architecture {arch!r}, expected one of {ARCHS}")
    tensors = {t.name: t for t in r.tensors}
    k = lambda key, default=None: _field(r, f"{arch}.{key}", default)  # noqa: E731
    dim = int(k("embedding_length"))
    n_head = int(k("attention.head_count"))
    n_head_kv = int(k("attention.head_count_kv", n_head))
    head_dim = int(k("attention.key_length", dim // n_head))
    if int(k("attention.value_length", head_dim)) != head_dim:
        raise ValueError("value_length != key_length not supported")
    rope_dim = int(k("rope.dimension_count", head_dim))
    if rope_dim != head_dim:
        raise ValueError(f"partial rotary (rope dim {rope_dim} != head dim {head_dim}) not supported")
    tok = _tensor(tensors["token_embd.weight"])
    # llama.cpp: rope.scaling.type defaults to "linear", freq_scale = 1/factor
    # (1 without the key); rope_freqs.weight (Llama 3) divides theta_i further.
    scaling = k("rope.scaling.type", "linear")
    factor = float(k("rope.scaling.factor", 0.0))
    if scaling not in ("none", "linear"):
        raise ValueError(f"{path}: rope scaling {scaling!r} not supported by the reference")
    rope_div, kinds = None, []
    if "rope_freqs.weight" in tensors:
        # ggml_rope_ext's freq factors, for LLM_ARCH_LLAMA; llama.cpp's qwen2/qwen3
        # graphs take none and its loader refuses the unused tensor.
        if arch != "llama":
            raise ValueError(f"{path}: rope_freqs.weight in a {arch} file (llama.cpp would not load it)")
        rope_div = _tensor(tensors["rope_freqs.weight"])
        assert rope_div.shape == (head_dim // 2,), rope_div.shape
        kinds.append("llama3")
    if scaling == "linear" and factor not in (0.0, 1.0):
        rope_div = (rope_div if rope_div is not None else np.ones(head_dim // 2)) * factor
        kinds.append("linear")
    gemma, local = {}, None
    if arch == "gemma3":
        n_layer = int(k("block_count"))
        window = int(k("attention.sliding_window", 0))
        if window > 0:
            pat = r.fields.get(f"{arch}.attention.sliding_window_pattern")
            if pat is not None and len(pat.types) > 1:          # an array of booleans
                pattern = [bool(pat.parts[j][0]) for j in pat.data]
            else:
                pattern = int(k("attention.sliding_window_pattern", 6))
            local = gemma3_local_layers(n_layer, pattern)
        gemma = dict(sliding_window=window, theta_local=float(k("rope.freq_base_swa", 10000.0)),
                     attn_scale=gemma3_attn_scale(n_layer, dim, n_head, head_dim),
                     embd_scale=float(np.sqrt(np.float32(dim))),
                     final_softcap=float(k("final_logit_softcapping", 0.0)))
    cfg = Config(
        n_layer=int(k("block_count")),
        dim=dim,
        n_head=n_head,
        n_head_kv=n_head_kv,
        head_dim=head_dim,
        ffn=int(k("feed_forward_length")),
        vocab=tok.shape[0],
        eps=float(k("attention.layer_norm_rms_epsilon", 1e-5)),
        theta=float(k("rope.freq_base", 10000.0)),
        ctx=int(k("context_length", 2048)),
        arch=arch,
        rope_scaling="+".join(kinds) or "none",
        **gemma,
    )
    # The exact float32 values are what llama.cpp uses; keep eps/theta as stored.
    get = lambda n: _tensor(tensors[n])  # noqa: E731
    lm = _tensor(tensors["output.weight"]) if "output.weight" in tensors else None
    return _assemble(cfg, tok, get, lambda n: n in tensors, _tensor(tensors["output_norm.weight"]), lm,
                     unpermute_qk, rope_div, local)


# ---------------------------------------------------------------------------
# Hugging Face folder reading (config.json + model.safetensors)


def read_safetensors(path):
    """{name: float64 array} from a .safetensors file: u64 LE header length, JSON
    header {name: {dtype, shape, data_offsets}}, then the data (F32/F16/BF16)."""
    import json
    with open(path, "rb") as f:
        buf = f.read()
    n = int.from_bytes(buf[:8], "little")
    hdr = json.loads(buf[8:8 + n])
    data = memoryview(buf)[8 + n:]
    out = {}
    for name, e in hdr.items():
        if name == "__metadata__":
            continue
        b, end = e["data_offsets"]
        raw = data[b:end]
        if e["dtype"] == "F32":
            a = np.frombuffer(raw, dtype="<f4")
        elif e["dtype"] == "F16":
            a = np.frombuffer(raw, dtype="<f2")
        elif e["dtype"] == "BF16":
            a = (np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16).view(np.float32)
        else:
            raise ValueError(f"{path}: tensor {name}: dtype {e['dtype']} not supported")
        out[name] = a.astype(np.float64).reshape(e["shape"])
    return out


# HF name -> GGUF name (the converter's mapping), per layer.
_HF_LAYER = {
    "input_layernorm.weight": "attn_norm.weight", "post_attention_layernorm.weight": "ffn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight", "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight", "self_attn.o_proj.weight": "attn_output.weight",
    "self_attn.q_proj.bias": "attn_q.bias", "self_attn.k_proj.bias": "attn_k.bias",
    "self_attn.v_proj.bias": "attn_v.bias",
    "self_attn.q_norm.weight": "attn_q_norm.weight", "self_attn.k_norm.weight": "attn_k_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight", "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
}
# Gemma 3: post_attention_layernorm is the norm after attention, not before the FFN.
_HF_LAYER_GEMMA3 = dict(_HF_LAYER, **{
    "post_attention_layernorm.weight": "post_attention_norm.weight",
    "pre_feedforward_layernorm.weight": "ffn_norm.weight",
    "post_feedforward_layernorm.weight": "post_ffw_norm.weight",
})


def load_hf(folder):
    """Reads an HF folder (config.json, model.safetensors or an index of shards).
    eps, theta and the llama3 divisors are rounded to float32, as the GGUF holds
    them, so that a GGUF and the same weights as an HF folder give identical
    logits."""
    import json
    import os
    with open(os.path.join(folder, "config.json")) as f:
        c = json.load(f)
    archs = c.get("architectures") or []
    arch = next((HF_ARCHS[x] for x in archs if x in HF_ARCHS), None) or c.get("model_type")
    arch = HF_MODEL_TYPES.get(arch, arch)
    if arch not in ARCHS:
        raise ValueError(f"{folder}: architecture {archs or c.get('model_type')!r} not supported")
    idx = os.path.join(folder, "model.safetensors.index.json")
    if os.path.exists(idx):
        with open(idx) as f:
            files = sorted(set(json.load(f)["weight_map"].values()))
    else:
        files = ["model.safetensors"]
    w = {}
    for fn in files:
        w.update(read_safetensors(os.path.join(folder, fn)))
    f32 = lambda x: float(np.float32(x))  # noqa: E731
    dim, n_head = int(c["hidden_size"]), int(c["num_attention_heads"])
    head_dim = int(c.get("head_dim") or dim // n_head)
    theta = f32(c.get("rope_theta", 10000.0))
    rs = c.get("rope_scaling") or None
    rp = c.get("rope_parameters") or None
    if arch == "gemma3" and rp and "full_attention" in rp:       # transformers v5: per layer type
        theta = f32(rp["full_attention"].get("rope_theta", c.get("rope_theta", 1e6)))
        rs = rs or (rp["full_attention"] if rp["full_attention"].get("rope_type", "default") != "default" else None)
    rope_div, scaling = None, "none"
    if rs:
        scaling = rs.get("rope_type", rs.get("type"))
        if scaling == "llama3":
            rope_div = llama3_divisors(theta, head_dim, float(rs["factor"]), float(rs.get("low_freq_factor", 1.0)),
                                       float(rs.get("high_freq_factor", 4.0)),
                                       float(rs.get("original_max_position_embeddings", 8192)))
        elif scaling == "linear":
            rope_div = np.full(head_dim // 2, f32(rs["factor"]))
        else:
            raise ValueError(f"{folder}: rope_scaling {scaling!r} not supported by the reference")
    tok = w["model.embed_tokens.weight"]
    n_layer = int(c["num_hidden_layers"])
    gemma, local, layer_map = {}, None, _HF_LAYER
    if arch == "gemma3":
        layer_map = _HF_LAYER_GEMMA3
        if c.get("hidden_activation", c.get("hidden_act", "gelu_pytorch_tanh")) != "gelu_pytorch_tanh":
            raise ValueError(f"{folder}: hidden_activation {c.get('hidden_activation')!r} not supported")
        if c.get("attn_logit_softcapping") is not None:
            raise ValueError(f"{folder}: attn_logit_softcapping not supported (Gemma 3 has none)")
        window = int(c.get("sliding_window") or 0)
        if window > 0:
            if c.get("layer_types"):
                local = [t == "sliding_attention" for t in c["layer_types"]]
            else:
                local = gemma3_local_layers(n_layer, c.get("sliding_window_pattern",
                                                           c.get("_sliding_window_pattern", 6)))
        theta_local = c.get("rope_local_base_freq", 10000.0)
        if rp and "sliding_attention" in rp:
            theta_local = rp["sliding_attention"].get("rope_theta", theta_local)
        gemma = dict(sliding_window=window, theta_local=f32(theta_local),
                     attn_scale=float(np.float32(float(c.get("query_pre_attn_scalar", head_dim)) ** -0.5)),
                     embd_scale=float(np.sqrt(np.float32(dim))), final_softcap=float(c.get("final_logit_softcapping") or 0.0))
        # Gemma3RMSNorm multiplies by 1 + w: bring w to what a GGUF holds, in float32 as the converter does.
        for name in list(w):
            if name.endswith("norm.weight"):
                w[name] = (w[name].astype(np.float32) + np.float32(1.0)).astype(np.float64)
    cfg = Config(
        n_layer=n_layer, dim=dim, n_head=n_head,
        n_head_kv=int(c.get("num_key_value_heads") or n_head), head_dim=head_dim,
        ffn=int(c["intermediate_size"]), vocab=tok.shape[0], eps=f32(c.get("rms_norm_eps", 1e-6)), theta=theta,
        ctx=int(c.get("max_position_embeddings", 2048)), arch=arch, rope_scaling=scaling, **gemma,
    )
    g2h = {"output_norm.weight": "model.norm.weight", "output.weight": "lm_head.weight"}
    for i in range(cfg.n_layer):
        for h, g in layer_map.items():
            g2h[f"blk.{i}.{g}"] = f"model.layers.{i}.{h}"
    has = lambda n: g2h.get(n) in w  # noqa: E731
    get = lambda n: w[g2h[n]]  # noqa: E731
    tied = bool(c.get("tie_word_embeddings", False)) or "lm_head.weight" not in w
    lm = None if tied else w["lm_head.weight"]
    return _assemble(cfg, tok, get, has, w["model.norm.weight"], lm, False, rope_div, local)


# ---------------------------------------------------------------------------
# Forward pass (HF Llama)


def rmsnorm(x, w, eps):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


def rotate_half(x):
    h = x.shape[-1] // 2
    return np.concatenate([-x[..., h:], x[..., :h]], axis=-1)


def rope(x, pos, inv_freq):
    """x: [T, n_heads, head_dim]; HF rotate-half convention."""
    freqs = pos[:, None].astype(np.float64) * inv_freq[None, :]   # [T, hd/2]
    emb = np.concatenate([freqs, freqs], axis=-1)[:, None, :]     # [T, 1, hd]
    return x * np.cos(emb) + rotate_half(x) * np.sin(emb)


def silu(x):
    return x / (1.0 + np.exp(-x))


def gelu_tanh(x):
    """HF gelu_pytorch_tanh: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))."""
    return 0.5 * x * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (x + 0.044715 * x ** 3)))


_GELU_F16_TABLE = None


def gelu_ggml_f16(x):
    """llama.cpp's CPU GELU (ggml-cpu vec.h with GGML_GELU_FP16): x <= -10 -> 0,
    x >= 10 -> x, else the fp16 table value at fp16(x), the table being
    fp16(ggml_gelu_f32(v)) computed in float32 (tanhf as the correctly rounded
    float32 tanh: numpy's own float32 tanh is less accurate, and 1 + tanh
    cancels for negative v; this way the table equals a C build's bit for
    bit)."""
    global _GELU_F16_TABLE
    if _GELU_F16_TABLE is None:
        f = np.float32
        v = np.arange(65536, dtype=np.uint32).astype(np.uint16).view(np.float16).astype(np.float32)
        with np.errstate(over="ignore", invalid="ignore"):
            arg = f(0.79788456080286535587989211986876) * v * (f(1.0) + f(0.044715) * v * v)
            g = f(0.5) * v * (f(1.0) + np.tanh(arg.astype(np.float64)).astype(np.float32))
        _GELU_F16_TABLE = g.astype(np.float16).astype(np.float64)
    x32 = np.asarray(x, dtype=np.float32)
    with np.errstate(over="ignore"):
        idx = x32.astype(np.float16).view(np.uint16)
    y = _GELU_F16_TABLE[idx]
    return np.where(x32 <= -10, 0.0, np.where(x32 >= 10, np.asarray(x, dtype=np.float64), y))


def logits(model, ids):
    """Returns float64 logits [len(ids), vocab] for every position of `ids`
    (one causal sequence starting at position 0)."""
    c = model.cfg
    ids = np.asarray(ids, dtype=np.int64)
    T = len(ids)
    if T == 0:
        return np.zeros((0, c.vocab))
    if ids.min() < 0 or ids.max() >= c.vocab:
        raise ValueError(f"token id out of range [0, {c.vocab})")
    pos = np.arange(T)
    x = model.tok_embd[ids].copy()                                 # [T, dim]
    if c.embd_scale != 1.0:                                        # gemma3
        x = x * c.embd_scale
    group = c.n_head // c.n_head_kv
    mask = np.triu(np.full((T, T), -np.inf), k=1)                  # causal
    mask_local = mask                                              # local layers (gemma3): a key p - W
    if c.sliding_window > 0:                                       # or older is out too
        mask_local = mask + np.tril(np.full((T, T), -np.inf), k=-c.sliding_window)
    scale = c.attn_scale or 1.0 / np.sqrt(c.head_dim)
    gelu = gelu_ggml_f16 if model.gelu == "ggml_f16" else gelu_tanh
    for L in model.layers:
        h = rmsnorm(x, L["attn_norm"], c.eps)
        q, k, v = h @ L["wq"].T, h @ L["wk"].T, h @ L["wv"].T
        if L.get("bq") is not None:                                # qwen2
            q, k, v = q + L["bq"], k + L["bk"], v + L["bv"]
        q = q.reshape(T, c.n_head, c.head_dim)
        k = k.reshape(T, c.n_head_kv, c.head_dim)
        v = v.reshape(T, c.n_head_kv, c.head_dim)
        if L.get("q_norm") is not None:                            # qwen3: per head, before RoPE
            q = rmsnorm(q, L["q_norm"], c.eps)
            k = rmsnorm(k, L["k_norm"], c.eps)
        inv_freq = model.inv_freq_local if L.get("local") else model.inv_freq
        q = rope(q, pos, inv_freq)
        k = rope(k, pos, inv_freq)
        k = np.repeat(k, group, axis=1)                            # head j uses kv head j // group
        v = np.repeat(v, group, axis=1)
        s = np.einsum("thd,shd->hts", q, k) * scale + (mask_local if L.get("local") else mask)   # [H, T, T]
        s = s - s.max(axis=-1, keepdims=True)
        p = np.exp(s)
        p /= p.sum(axis=-1, keepdims=True)
        o = np.einsum("hts,shd->thd", p, v).reshape(T, c.n_head * c.head_dim)
        if c.arch == "gemma3":
            x = x + rmsnorm(o @ L["wo"].T, L["post_attn_norm"], c.eps)
            h = rmsnorm(x, L["ffn_norm"], c.eps)
            f = (gelu(h @ L["w_gate"].T) * (h @ L["w_up"].T)) @ L["w_down"].T
            x = x + rmsnorm(f, L["post_ffw_norm"], c.eps)
            continue
        x = x + o @ L["wo"].T
        h = rmsnorm(x, L["ffn_norm"], c.eps)
        x = x + (silu(h @ L["w_gate"].T) * (h @ L["w_up"].T)) @ L["w_down"].T
    x = rmsnorm(x, model.norm, c.eps)
    z = x @ model.lm_head.T
    if c.final_softcap:
        z = c.final_softcap * np.tanh(z / c.final_softcap)
    return z


def log_softmax(z):
    z = np.asarray(z, dtype=np.float64)
    m = z.max(axis=-1, keepdims=True)
    return z - m - np.log(np.exp(z - m).sum(axis=-1, keepdims=True))


def f32_copy(src, dst, scale=None):
    """Writes src with every tensor dequantized to F32 (metadata unchanged except
    general.file_type), for running llama.cpp without activation quantization.
    scale: {tensor name suffix: factor} multiplies those tensors (a power of two
    keeps the values exact)."""
    import gguf
    r = GGUFReader(src)
    w = gguf.GGUFWriter(dst, arch=_field(r, "general.architecture"))
    for f in r.fields.values():
        if f.name == "general.architecture" or f.name.startswith("GGUF."):
            continue
        vt = f.types[0]
        st = f.types[-1] if vt == gguf.GGUFValueType.ARRAY else None
        w.add_key_value(f.name, 0 if f.name == "general.file_type" else f.contents(), vt, sub_type=st)
    for t in r.tensors:
        shape = tuple(int(d) for d in reversed(t.shape.tolist()))
        a = np.ascontiguousarray(dequantize(t.data, t.tensor_type), dtype=np.float32).reshape(shape)
        for suffix, factor in (scale or {}).items():
            if t.name.endswith(suffix):
                a = (a * np.float32(factor)).astype(np.float32)
        w.add_tensor(t.name, a)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def _llamacpp_logits(path, ids, fp32):
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "tools"))
    from llamacpp_info import Llama  # llama_cpp.Llama, printing its build and buffer types
    kw = dict(type_k=0, type_v=0, flash_attn=False) if fp32 else {}
    llm = Llama(model_path=path, n_ctx=max(512, len(ids)), n_threads=2, logits_all=True, verbose=False, **kw)
    llm.eval(ids)
    return np.array(llm.scores[:len(ids)], dtype=np.float64)


if __name__ == "__main__":
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    if len(args) != 2:
        sys.exit("usage: ref_llama.py MODEL.gguf|HF_DIR ID,ID,... [--llamacpp]")
    ids = [int(t) for t in args[1].split(",")]
    import os as _os
    mdl = load_hf(args[0]) if _os.path.isdir(args[0]) else load(args[0])
    out = logits(mdl, ids)
    print(mdl.cfg, "tied" if mdl.tied else "untied")
    for i, row in enumerate(out):
        top = np.argsort(-row)[:5]
        print(i, " ".join(f"{t}:{row[t]:.4f}" for t in top))
    if "--llamacpp" in sys.argv:
        import os
        import tempfile
        z = _llamacpp_logits(args[0], ids, fp32=False)
        print(f"llama.cpp on the file: max|dlogit| {np.abs(z - out).max():.4g}, "
              f"top-1 agreement {(z.argmax(-1) == out.argmax(-1)).sum()}/{len(ids)}")
        with tempfile.TemporaryDirectory() as d:
            cp = os.path.join(d, "f32.gguf")
            f32_copy(args[0], cp)
            z = _llamacpp_logits(cp, ids, fp32=True)
        print(f"llama.cpp on its F32 copy (F32 KV): max|dlogit| {np.abs(z - out).max():.4g}, "
              f"top-1 agreement {(z.argmax(-1) == out.argmax(-1)).sum()}/{len(ids)}")
