"""A float64 NumPy reference of a Llama-family decoder, read from a GGUF file.

Independent of the C engine: the file is parsed with the `gguf` package
(GGUFReader) and every tensor is dequantized with gguf.quants.dequantize. The
weights are brought into Hugging Face layout (llama.cpp's Q/K row permutation
is undone) and the forward pass is HF Llama's: RMSNorm, rotate-half RoPE,
GQA causal attention scaled by 1/sqrt(head_dim), SwiGLU, tied embeddings when
output.weight is absent. Everything is computed in float64 from the
dequantized (float32-exact) weights.

    model = load("model.gguf")
    out = logits(model, [1, 2, 3])        # np.ndarray [3, vocab] float64

load(path, unpermute_qk=False) keeps llama.cpp's row order for Q/K: a deliberately
wrong reference, used to show that the parity tests are sensitive to it.

f32_copy(src, dst) writes the GGUF with every tensor dequantized to F32 (same
values): llama.cpp on that copy, with an F32 KV cache and flash attention off,
computes in fp32 and agrees with this reference to ~1e-4 (on the Q4_1 file
itself it quantizes activations to 8 bits and differs by up to a few logits).

Command line:
  python3 tests/py/ref_llama.py MODEL.gguf 1,2,3            top-5 logits per position
  python3 tests/py/ref_llama.py MODEL.gguf 1,2,3 --llamacpp also max |ref - llama.cpp|
      on the file and on its F32 copy (written next to /tmp)
"""
import sys
from dataclasses import dataclass, field

import numpy as np
from gguf import GGUFReader
from gguf.quants import dequantize


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


@dataclass
class Model:
    cfg: Config
    tok_embd: np.ndarray                    # [vocab, dim] float64
    layers: list = field(default_factory=list)  # dicts of HF-layout float64 weights
    norm: np.ndarray = None                 # [dim]
    lm_head: np.ndarray = None              # [vocab, dim] (tok_embd when tied)
    tied: bool = False                      # output.weight absent
    inv_freq: np.ndarray = None             # [head_dim/2] RoPE inverse frequencies


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
    RoPE; HF keeps the first and second half of each head apart."""
    rows, cols = w.shape
    return w.reshape(n_head, rows // n_head // 2, 2, cols).swapaxes(1, 2).reshape(rows, cols)


def load(path, unpermute_qk=True):
    """Reads a llama-architecture GGUF. unpermute_qk=False keeps llama.cpp's Q/K
    row order (a wrong reference, for sensitivity checks)."""
    r = GGUFReader(path)
    arch = _field(r, "general.architecture")
    if arch != "llama":
        raise ValueError(f"{path}: architecture {arch!r}, expected 'llama'")
    tensors = {t.name: t for t in r.tensors}
    dim = int(_field(r, "llama.embedding_length"))
    n_head = int(_field(r, "llama.attention.head_count"))
    n_head_kv = int(_field(r, "llama.attention.head_count_kv", n_head))
    head_dim = int(_field(r, "llama.attention.key_length", dim // n_head))
    rope_dim = int(_field(r, "llama.rope.dimension_count", head_dim))
    if rope_dim != head_dim:
        raise ValueError(f"partial rotary (rope dim {rope_dim} != head dim {head_dim}) not supported")
    tok = _tensor(tensors["token_embd.weight"])
    cfg = Config(
        n_layer=int(_field(r, "llama.block_count")),
        dim=dim,
        n_head=n_head,
        n_head_kv=n_head_kv,
        head_dim=head_dim,
        ffn=int(_field(r, "llama.feed_forward_length")),
        vocab=tok.shape[0],
        eps=float(_field(r, "llama.attention.layer_norm_rms_epsilon", 1e-5)),
        theta=float(_field(r, "llama.rope.freq_base", 10000.0)),
        ctx=int(_field(r, "llama.context_length", 2048)),
    )
    # The exact float32 values are what llama.cpp uses; keep eps/theta as stored.
    m = Model(cfg=cfg, tok_embd=tok)
    for i in range(cfg.n_layer):
        g = lambda n: _tensor(tensors[f"blk.{i}.{n}.weight"])  # noqa: E731
        q, k = g("attn_q"), g("attn_k")
        if unpermute_qk:
            q = unpermute(q, n_head)
            k = unpermute(k, n_head_kv)
        m.layers.append(dict(
            attn_norm=g("attn_norm"), wq=q, wk=k, wv=g("attn_v"), wo=g("attn_output"),
            ffn_norm=g("ffn_norm"), w_gate=g("ffn_gate"), w_up=g("ffn_up"), w_down=g("ffn_down"),
        ))
        assert q.shape == (n_head * head_dim, dim), q.shape
        assert k.shape == (n_head_kv * head_dim, dim), k.shape
    m.norm = _tensor(tensors["output_norm.weight"])
    if "output.weight" in tensors:
        m.lm_head = _tensor(tensors["output.weight"])
    else:
        m.lm_head, m.tied = tok, True
    inv_freq = cfg.theta ** (-np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
    if "rope_freqs.weight" in tensors:  # llama3-style scaling: llama.cpp divides theta_i by the factor
        inv_freq = inv_freq / _tensor(tensors["rope_freqs.weight"])
    m.inv_freq = inv_freq
    return m


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
    group = c.n_head // c.n_head_kv
    mask = np.triu(np.full((T, T), -np.inf), k=1)                  # causal
    scale = 1.0 / np.sqrt(c.head_dim)
    for L in model.layers:
        h = rmsnorm(x, L["attn_norm"], c.eps)
        q = (h @ L["wq"].T).reshape(T, c.n_head, c.head_dim)
        k = (h @ L["wk"].T).reshape(T, c.n_head_kv, c.head_dim)
        v = (h @ L["wv"].T).reshape(T, c.n_head_kv, c.head_dim)
        q = rope(q, pos, model.inv_freq)
        k = rope(k, pos, model.inv_freq)
        k = np.repeat(k, group, axis=1)                            # head j uses kv head j // group
        v = np.repeat(v, group, axis=1)
        s = np.einsum("thd,shd->hts", q, k) * scale + mask         # [H, T, T]
        s = s - s.max(axis=-1, keepdims=True)
        p = np.exp(s)
        p /= p.sum(axis=-1, keepdims=True)
        o = np.einsum("hts,shd->thd", p, v).reshape(T, c.n_head * c.head_dim)
        x = x + o @ L["wo"].T
        h = rmsnorm(x, L["ffn_norm"], c.eps)
        x = x + (silu(h @ L["w_gate"].T) * (h @ L["w_up"].T)) @ L["w_down"].T
    x = rmsnorm(x, model.norm, c.eps)
    return x @ model.lm_head.T


def log_softmax(z):
    z = np.asarray(z, dtype=np.float64)
    m = z.max(axis=-1, keepdims=True)
    return z - m - np.log(np.exp(z - m).sum(axis=-1, keepdims=True))


def f32_copy(src, dst):
    """Writes src with every tensor dequantized to F32 (metadata unchanged except
    general.file_type), for running llama.cpp without activation quantization."""
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
        w.add_tensor(t.name, np.ascontiguousarray(dequantize(t.data, t.tensor_type), dtype=np.float32).reshape(shape))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def _llamacpp_logits(path, ids, fp32):
    from llama_cpp import Llama
    kw = dict(type_k=0, type_v=0, flash_attn=False) if fp32 else {}
    llm = Llama(model_path=path, n_ctx=max(512, len(ids)), n_threads=2, logits_all=True, verbose=False, **kw)
    llm.eval(ids)
    return np.array(llm.scores[:len(ids)], dtype=np.float64)


if __name__ == "__main__":
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    if len(args) != 2:
        sys.exit("usage: ref_llama.py MODEL.gguf ID,ID,... [--llamacpp]")
    ids = [int(t) for t in args[1].split(",")]
    mdl = load(args[0])
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
