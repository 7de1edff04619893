"""serve_dtype q4_k and fp8 (issue 26): a bf16 push served quantized gives the
bits of a daemon started from a file holding the same quantized values, made
here by independent quantizers. Real daemons on loopback, the Python client.

- q4_k, on tiny-q4_k (Llama, dim 256, ffn 512, tied): the learner's weights
  are the file's, perturbed and rounded to bf16. Daemon A serves a GGUF of
  them written here: the layers' linears quantized to Q4_K by llama.cpp's own
  ggml (ggml_quantize_chunk from llama-cpp-python's libggml-base, which with
  no importance matrix runs quantize_row_q4_K_ref), the token embedding (also
  the LM head) to Q8_0 by the gguf package, norms f32. Daemon B starts from
  tiny-q4_k.gguf with --serve-dtype q4_k and is pushed the bf16 weights (HF
  names and layout). After the push B's greedy and sampled tokens and raw and
  processed log-probs equal A's bit for bit, and so do weights_bytes and the
  bytes by dtype ({"q4_K", "q8_0", "f32"});
- fp8, on tiny-bf16 (dim 64, ffn 128): A serves a bf16 GGUF whose layers'
  linears hold the FP8 values a NumPy reference quantizer gives (E4M3 nearest,
  ties to even, in 32-blocks scaled by the least power of two that keeps the
  block within 448: exact in bf16), the embedding and norms as pushed. B (the
  CPU backend, which holds FP8 weights as their bf16 values) is pushed the
  bf16 weights with --serve-dtype fp8 per push over a q8_0 config: bit-identical
  to A after; /status and the results say fp8; a push with a weight past FP8's
  range (57344) is refused naming the tensor, and B then serves the same bits
  at the same version. The CUDA FP8 GEMM itself is test_cuda_emu's."""
import os
import sys
import tempfile

import gguf
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import ROOT, TMP, case, main  # noqa: E402
from gguf_fast import GGUFReader  # noqa: E402  (the package's reader, its arrays read in one pass)
from rdtest import Daemon, stop_cleanly  # noqa: E402
from test_serve_dtype import first_difference, runs, writer_like  # noqa: E402
import ref_fp8  # noqa: E402
import ref_ggml  # noqa: E402
from ref_llama import unpermute  # noqa: E402

sys.path.insert(0, os.path.join(ROOT, "tools", "python"))
from rolloutd import Client, DaemonError, bf16_bits, proto  # noqa: E402

QT = gguf.GGMLQuantizationType
DATA = os.environ.get("RD_TESTDATA", os.path.join(ROOT, "build", "testdata"))
_tmp = tempfile.mkdtemp(prefix="rd-servequant-", dir=TMP)
_daemons = []

HF = {"attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
      "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
      "ffn_down": "mlp.down_proj", "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm"}


def hf_name(name):
    if name == "token_embd.weight":
        return "model.embed_tokens.weight"
    if name == "output_norm.weight":
        return "model.norm.weight"
    _, layer, kind, _ = name.split(".")
    return f"model.layers.{layer}.{HF[kind]}.weight"


def bf16(a):
    """a rounded to bf16 (the values a bf16 push carries), as float32."""
    return (bf16_bits(a).astype(np.uint32) << 16).view(np.float32)


def learner_weights(path, seed):
    """({GGUF name: float32 array in the file's layout}, {HF name: pushed array}, the reader):
    the file's values, the 2-D ones perturbed by up to ~5% and rounded to bf16 (pushed as bf16
    bits), the norms as they are (f32). Llama's q and k rows are unpermuted for the HF names."""
    r = GGUFReader(path)
    heads = int(r.fields["llama.attention.head_count"].contents())
    kv_heads = int(r.fields["llama.attention.head_count_kv"].contents())
    rng = np.random.default_rng(seed)
    file_vals, pushed = {}, {}
    for t in r.tensors:
        shape = tuple(int(d) for d in reversed(t.shape.tolist()))
        a = np.asarray(gguf.quants.dequantize(t.data, t.tensor_type), dtype=np.float32).reshape(shape)
        if a.ndim == 2:
            a = bf16(a * (1 + np.float32(0.05) * rng.standard_normal(a.shape).astype(np.float32)))
            hf = a
            if ".attn_q." in t.name or ".attn_k." in t.name:
                hf = np.ascontiguousarray(unpermute(a, heads if ".attn_q." in t.name else kv_heads))
            pushed[hf_name(t.name)] = bf16_bits(hf)
        else:
            pushed[hf_name(t.name)] = np.ascontiguousarray(a)
        file_vals[t.name] = np.ascontiguousarray(a)
    return file_vals, pushed, r


def write_like(r, dst, tensors, file_type):
    """A GGUF with r's metadata (general.file_type set) and tensors {name: (array, raw_dtype or None)}."""
    w = writer_like(r, dst, file_type)
    for t in r.tensors:
        a, raw = tensors[t.name]
        if raw is None:
            w.add_tensor(t.name, a)
        else:
            w.add_tensor(t.name, a, raw_dtype=raw)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def daemon(*extra, **kw):
    d = Daemon(*extra, **kw)
    _daemons.append(d)
    return d


def ggml_q4_k_file(r, vals, dst):
    """The GGUF ggml's quantizers make of vals {GGUF name: float32} (r's metadata): the layers'
    linears Q4_K, the embedding (also the tied LM head) Q8_0 (staging.c's serve_type), norms f32.
    Returns {name: (array, raw dtype)} as written."""
    tensors = {}
    for name, a in vals.items():
        if a.ndim == 1:
            tensors[name] = (a, None)
        elif name == "token_embd.weight":
            tensors[name] = (gguf.quants.quantize(a, QT.Q8_0), QT.Q8_0)
        else:
            tensors[name] = (ref_ggml.q4_k(a), QT.Q4_K)
    write_like(r, dst, tensors, 15)                  # LLAMA_FTYPE_MOSTLY_Q4_K_M
    return tensors


def drifting_rows(std, n, seed):
    """n rows of 256 bf16 values ~ N(0, std) whose Q4_K block ggml's quantizer does not give back
    from the block's own dequantized values (~0.05% of normal blocks): the rows a COMMIT that
    re-quantized what it serves would move."""
    rng = np.random.default_rng(seed)
    found = []
    for _ in range(40):
        a = bf16(rng.standard_normal((4096, 256)).astype(np.float32) * np.float32(std))
        q = ref_ggml.q4_k(a)
        again = ref_ggml.q4_k(np.asarray(gguf.quants.dequantize(q, QT.Q4_K), np.float32).reshape(a.shape))
        found += [a[i] for i in np.nonzero((q != again).any(axis=1))[0]]
        if len(found) >= n:
            return np.stack(found[:n])
    raise AssertionError(f"only {len(found)} of {n} drifting Q4_K rows in 40 x 4096 draws")


@case
def bf16_push_served_as_q4_k_bit_identical_to_ggmls_q4_k_file():
    src = os.path.join(DATA, "tiny-q4_k.gguf")
    vals, pushed, r = learner_weights(src, seed=261)
    ref = os.path.join(_tmp, "tiny-q4_k-ggml.gguf")
    ggml_q4_k_file(r, vals, ref)
    da, db = daemon(model=ref), daemon("--serve-dtype", "q4_k", model=src)
    with Client(da.url) as a, Client(db.url) as b:
        assert b.status()["serve_dtype"] == "q4_k", b.status().get("serve_dtype")
        ra = runs(a)
        assert first_difference(ra, runs(b)) is not None, "B matches the reference before the push"
        v = b.info.weight_version
        res = b.push_weights(pushed, v + 1)
        assert res.version == v + 1, res
        rb = runs(b)
        diff = first_difference(ra, rb)
        assert diff is None, diff
        assert all(s.serve_dtype == "q4_k" for s in rb), {s.serve_dtype for s in rb}
        # every linear (Q4_K or Q8_0) was quantized while the push arrived, not at COMMIT
        lw = b.status()["last_weight_update"]
        n2 = sum(1 for v in pushed.values() if v.ndim == 2)
        assert lw["prequantized_tensors"] == n2, (lw, n2)
        ma, mb = a.status()["memory"], b.status()["memory"]
        print(f"  weights_bytes: ggml's Q4_K file {ma['weights_bytes']}, the push {mb['weights_bytes']}; "
              f"by dtype {mb['weights_bytes_by_dtype']}", flush=True)
        assert ma["weights_bytes"] == mb["weights_bytes"], (ma, mb)
        assert ma["weights_bytes_by_dtype"] == mb["weights_bytes_by_dtype"], (ma, mb)
        assert set(mb["weights_bytes_by_dtype"]) == {"q4_K", "q8_0", "f32"}, mb


@case
def partial_push_served_as_q4_k_keeps_the_rows_it_leaves_out():
    """A push of layer 0's q_proj alone rebuilds the fused q|k|v: k and v keep their served Q4_K
    blocks, so the daemon equals ggml's file of the new q next to the old k and v. k holds rows
    whose blocks re-quantize differently, so a COMMIT that re-quantized the served rows fails."""
    src = os.path.join(DATA, "tiny-q4_k.gguf")
    vals, pushed, r = learner_weights(src, seed=263)
    heads = int(r.fields["llama.attention.head_count"].contents())
    kv_heads = int(r.fields["llama.attention.head_count_kv"].contents())
    k = vals["blk.0.attn_k.weight"]
    k[:4] = drifting_rows(k.std(), 4, seed=264)
    pushed["model.layers.0.self_attn.k_proj.weight"] = bf16_bits(np.ascontiguousarray(unpermute(k, kv_heads)))
    qk = ref_ggml.q4_k(k)
    assert not np.array_equal(qk, ref_ggml.q4_k(np.asarray(gguf.quants.dequantize(qk, QT.Q4_K), np.float32)
                                                .reshape(k.shape))), "k re-quantizes to its own blocks"
    rng = np.random.default_rng(265)
    q = vals["blk.0.attn_q.weight"]
    vals["blk.0.attn_q.weight"] = q2 = bf16(q * (1 + np.float32(0.05) * rng.standard_normal(q.shape).astype(np.float32)))
    ref = os.path.join(_tmp, "tiny-q4_k-partial.gguf")
    ggml_q4_k_file(r, vals, ref)
    dc, db = daemon(model=ref), daemon("--serve-dtype", "q4_k", model=src)
    with Client(dc.url) as c, Client(db.url) as b:
        v = b.info.weight_version
        b.push_weights(pushed, v + 1)
        rc = runs(c)
        assert first_difference(rc, runs(b)) is not None, "B serves the new q before it is pushed"
        res = b.push_weights({"model.layers.0.self_attn.q_proj.weight":
                              bf16_bits(np.ascontiguousarray(unpermute(q2, heads)))}, v + 2)
        assert res.version == v + 2, res
        diff = first_difference(rc, runs(b))
        assert diff is None, diff


_fp8 = None


def fp8_pair():
    """(A on the NumPy FP8 values as bf16, B on tiny-bf16 with serve_dtype q8_0, its pushed weights)."""
    global _fp8
    if _fp8 is None:
        src = os.path.join(DATA, "tiny-bf16.gguf")
        vals, pushed, r = learner_weights(src, seed=262)
        tensors = {}
        for name, a in vals.items():
            if a.ndim == 2 and name != "token_embd.weight":
                q = ref_fp8.values(a).astype(np.float32)
                b = bf16_bits(q)
                assert np.array_equal((b.astype(np.uint32) << 16).view(np.float32), q), "fp8 values not exact in bf16"
                tensors[name] = (b.view(np.uint8).reshape(a.shape[0], -1), QT.BF16)
            elif a.ndim == 2:
                tensors[name] = (bf16_bits(a).view(np.uint8).reshape(a.shape[0], -1), QT.BF16)
            else:
                tensors[name] = (a, None)
        ref = os.path.join(_tmp, "tiny-fp8-numpy.gguf")
        write_like(r, ref, tensors, 32)              # LLAMA_FTYPE_MOSTLY_BF16
        _fp8 = (daemon(model=ref), daemon("--serve-dtype", "q8_0", model=src), pushed)
    return _fp8


@case
def bf16_push_served_as_fp8_bit_identical_to_numpys_fp8_values():
    da, db, pushed = fp8_pair()
    with Client(da.url) as a, Client(db.url) as b:
        ra = runs(a)
        assert first_difference(ra, runs(b)) is not None, "B matches the reference before the push"
        v = b.info.weight_version
        res = b.push_weights(pushed, v + 1, serve_dtype="fp8")
        assert res.version == v + 1, res
        rb = runs(b)
        diff = first_difference(ra, rb)
        assert diff is None, diff
        assert all(s.serve_dtype == "fp8" for s in rb), {s.serve_dtype for s in rb}
        st = b.status()
        assert st["weights_serve_dtype"] == "fp8" and st["serve_dtype"] == "q8_0", st
        n_fp8 = sum(1 for k, v in pushed.items() if v.ndim == 2 and "embed_tokens" not in k)
        assert st["last_weight_update"]["prequantized_tensors"] == n_fp8, (st["last_weight_update"], n_fp8)
        ma, mb = a.status()["memory"], st["memory"]
        assert ma["weights_bytes"] == mb["weights_bytes"], (ma, mb)   # the CPU holds FP8 as bf16


@case
def fp8_push_past_the_range_refused_old_weights_serve():
    _, db, pushed = fp8_pair()
    name = "model.layers.1.mlp.down_proj.weight"
    with Client(db.url) as b:
        v0, base = b.info.weight_version, runs(b)
        w = dict(pushed)
        t = w[name].copy()
        t.reshape(-1)[40] = bf16_bits(np.array([6e4], np.float32))[0]   # fine as bf16, past 448 x 2^7
        w[name] = t
        try:
            b.push_weights(w, v0 + 1, serve_dtype="fp8")
            raise AssertionError("a push with 6e4 served as fp8 was accepted")
        except DaemonError as e:
            assert e.code == proto.E.INVALID_PARAMS and name in str(e) and "57344" in str(e), e
        st = b.status()
        assert st["weight_version"] == v0, st
        diff = first_difference(base, runs(b))
        assert diff is None, f"the refused push changed the outputs: {diff}"


@case
def daemons_stop_cleanly():
    stop_cleanly(*_daemons)


if __name__ == "__main__":
    main()
