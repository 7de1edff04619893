"""serve_dtype q8_0 (issue 26): a bf16 push is served quantized to Q8_0, bit for
bit as llama.cpp's Q8_0 file of the same weights is. Real daemons on loopback,
driven by the Python client:

- from the tiny bf16 model (build/testdata/tiny-bf16.gguf, Llama, tied) the
  `gguf` package writes a Q8_0 GGUF (its own quantizer, gguf.quants; 2-D
  weights Q8_0, the token embedding (also the LM head) included, norms kept
  f32, as convert_hf_to_gguf.py --outtype q8_0 writes one). Daemon A serves
  that file; daemon B starts from the bf16 file with --serve-dtype q8_0 and
  is pushed the weights as a learner holds them (HF names; the 2-D ones bf16,
  the norms f32 as in the file). Before
  the push B's log-probs differ from A's (it serves bf16); after it the
  greedy tokens and the raw log-probs, and a seeded sampled run's tokens and
  raw and processed log-probs, are bit-identical to A's, and
  /status memory.weights_bytes equal: the file's tensor bytes plus the CPU
  GEMM's padding of the embedding's 300 rows to 19 panels of 16;
  /status serve_dtype says "q8_0" on B and "as_pushed" on A, and
  memory.weights_bytes_by_dtype {"q8_0": linears, "f32": norms} on both (B
  held bf16 and f32 before the push);
- a partial push (v_proj of layer 0, up_proj of layer 1) re-quantizes the fused
  rows it leaves out from what B serves, bit-identical to a daemon on the Q8_0
  file of the weights with those two tensors replaced;
- Qwen3-MoE (tiny-moe-bf16): a bf16 push of every expert and the router gives
  the bits of the gguf package's Q8_0 file (experts Q8_0, router f32); the
  router stays as pushed (bf16), the q8_0 bytes equal the file's;
- a push with a NaN in one tensor is refused (INVALID_PARAMS naming the tensor
  and NaN), and one with a weight Q8_0 cannot scale (1e7: max|x| / 127
  overflows fp16; an as_pushed daemon would serve it) is refused naming the
  tensor; after each B serves the same bits as before, at the same version."""
import os
import sys
import tempfile

import gguf
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import ROOT, TMP, case, main  # noqa: E402
from gguf_fast import GGUFReader  # noqa: E402  (the package's reader, its arrays read in one pass)
from rdtest import Daemon, stop_cleanly  # noqa: E402

sys.path.insert(0, os.path.join(ROOT, "tools", "python"))
from rolloutd import Client, DaemonError, bf16_bits, proto  # noqa: E402

DATA = os.environ.get("RD_TESTDATA", os.path.join(ROOT, "build", "testdata"))
BF16 = os.path.join(DATA, "tiny-bf16.gguf")
PROMPTS = [[1, 20, 30, 40, 50, 60], [1, 250, 7, 7, 7], [1, 100, 200, 299, 3, 4, 5, 6, 7, 8, 9]]
_tmp = tempfile.mkdtemp(prefix="rd-servedt-", dir=TMP)
_daemons = []
_q8 = None


def writer_like(r, dst, file_type):
    """A GGUFWriter at dst holding reader r's metadata, general.file_type set to file_type."""
    w = gguf.GGUFWriter(dst, arch=r.fields["general.architecture"].contents())
    for f in r.fields.values():
        if f.name == "general.architecture" or f.name.startswith("GGUF."):
            continue
        vt = f.types[0]
        st = f.types[-1] if vt == gguf.GGUFValueType.ARRAY else None
        w.add_key_value(f.name, file_type if f.name == "general.file_type" else f.contents(), vt, sub_type=st)
    return w


def q8_0_copy(src, dst, replace=None):
    """src with every 2-D and 3-D (MoE experts) tensor quantized to Q8_0 by gguf.quants, as
    convert_hf_to_gguf.py --outtype q8_0 does: norms (1-D) and the MoE router (ffn_gate_inp)
    stay f32; replace: {GGUF tensor name: float32 array in the file's row order} used instead of
    src's values."""
    r = GGUFReader(src)
    w = writer_like(r, dst, 7)  # MOSTLY_Q8_0
    nbytes = 0
    for t in r.tensors:
        shape = tuple(int(d) for d in reversed(t.shape.tolist()))
        a = np.ascontiguousarray(gguf.quants.dequantize(t.data, t.tensor_type), dtype=np.float32).reshape(shape)
        if replace and t.name in replace:
            a = np.ascontiguousarray(replace[t.name], dtype=np.float32).reshape(shape)
        if len(shape) >= 2 and not t.name.endswith("ffn_gate_inp.weight"):
            q = gguf.quants.quantize(a, gguf.GGMLQuantizationType.Q8_0)
            w.add_tensor(t.name, q, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
            nbytes += q.nbytes
        else:
            assert t.tensor_type == gguf.GGMLQuantizationType.F32, (t.name, t.tensor_type)
            w.add_tensor(t.name, a)
            nbytes += a.nbytes
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return nbytes


def q8_file():
    """(path, tensor bytes) of the Q8_0 copy of the bf16 model, written once."""
    global _q8
    if _q8 is None:
        path = os.path.join(_tmp, "tiny-q8_0-gguf-py.gguf")
        _q8 = (path, q8_0_copy(BF16, path))
    return _q8


def pushed_bf16():
    """The bf16 model's weights as a learner holds them: HF names and layout, the 2-D ones as
    bf16 bits (the file's values are bf16, so the rounding is exact), the norms f32 (the file's)."""
    z = np.load(os.path.join(DATA, "tiny-bf16.npz"))
    out = {}
    for k in z.files:
        if z[k].ndim == 1:
            out[k] = np.ascontiguousarray(z[k], dtype=np.float32)
            continue
        b = bf16_bits(z[k])
        assert np.array_equal((b.astype(np.uint32) << 16).view(np.float32), z[k]), f"{k} is not bf16"
        out[k] = b
    return out


def daemon(*extra, **kw):
    d = Daemon(*extra, **kw)
    _daemons.append(d)
    return d


def runs(c):
    """Greedy and seeded sampled rollouts (raw and processed log-probs)."""
    g = c.generate(PROMPTS, max_tokens=24, temperature=0.0, ignore_eos=True)
    s = c.generate(PROMPTS, n=3, max_tokens=16, temperature=0.9, top_p=0.9, seed=26, ignore_eos=True,
                   processed_logprobs=True)
    return g + s


def bits(a):
    return np.asarray(a, dtype=np.float32).view(np.uint32)


def first_difference(a, b):
    """None when the runs are bit-identical, else what differs first."""
    if len(a) != len(b):
        return f"{len(a)} vs {len(b)} results"
    for i, (x, y) in enumerate(zip(a, b)):
        if not np.array_equal(x.token_ids, y.token_ids):
            return f"result {i}: tokens {list(x.token_ids)} vs {list(y.token_ids)}"
        if not np.array_equal(bits(x.logprobs), bits(y.logprobs)):
            d = np.abs(np.asarray(x.logprobs, np.float64) - np.asarray(y.logprobs, np.float64)).max()
            return f"result {i}: log-probs differ, max |d| {d}"
        px, py = getattr(x, "processed_logprobs", None), getattr(y, "processed_logprobs", None)
        if (px is None) != (py is None) or (px is not None and not np.array_equal(bits(px), bits(py))):
            return f"result {i}: processed log-probs differ"
    return None


def same(a, b):
    return first_difference(a, b) is None


_ab = None


def daemons_a_b():
    global _ab
    if _ab is None:
        path, _ = q8_file()
        _ab = (daemon(model=path), daemon("--serve-dtype", "q8_0", model=BF16))
    return _ab


@case
def bf16_push_served_as_q8_0_bit_identical_to_a_gguf_q8_0_file():
    da, db = daemons_a_b()
    _, file_bytes = q8_file()
    with Client(da.url) as a, Client(db.url) as b:
        sa, sb = a.status(), b.status()
        assert sa["serve_dtype"] == "as_pushed" and sb["serve_dtype"] == "q8_0", (sa.get("serve_dtype"),
                                                                                 sb.get("serve_dtype"))
        by_b0 = sb["memory"]["weights_bytes_by_dtype"]
        assert set(by_b0) == {"bf16", "f32"} and sum(by_b0.values()) == sb["memory"]["weights_bytes"], sb["memory"]
        ra, rb0 = runs(a), runs(b)
        assert not same(ra, rb0), "B serves bf16 yet matches the Q8_0 file before the push"
        w = pushed_bf16()
        v = b.info.weight_version
        r = b.push_weights(w, v + 1)
        assert r.version == v + 1, r
        print(f"  bf16 push of {r.bytes} bytes served as q8_0: COMMIT to serving {r.wait_us / 1e3:.1f} ms", flush=True)
        rb = runs(b)
        for x, y in zip(ra, rb):
            assert np.array_equal(x.token_ids, y.token_ids), (x.token_ids, y.token_ids)
            d = np.abs(np.asarray(x.logprobs, np.float64) - np.asarray(y.logprobs, np.float64)).max()
            assert np.array_equal(bits(x.logprobs), bits(y.logprobs)), f"log-probs differ, max |d| {d}"
        assert same(ra, rb), "processed log-probs differ"
        assert all(s.version_admit == v + 1 for s in rb)
        wa, wb = a.status()["memory"]["weights_bytes"], b.status()["memory"]["weights_bytes"]
        pad = (16 - 300 % 16) % 16 * (64 // 32 * 34)    # the embedding's rows padded to 16-row panels
        print(f"  weights_bytes: file load {wa}, push {wb}; Q8_0 file tensors {file_bytes} + panel padding {pad}",
              flush=True)
        assert wa == wb == file_bytes + pad, (wa, wb, file_bytes, pad)
        ba, bb = a.status()["memory"]["weights_bytes_by_dtype"], b.status()["memory"]["weights_bytes_by_dtype"]
        norms = sum(t.nbytes for t in w.values() if t.ndim == 1)
        assert ba == bb == {"q8_0": wa - norms, "f32": norms}, (ba, bb, norms)


@case
def partial_push_keeps_the_rows_it_leaves_out():
    """Only v_proj of layer 0 (fused with q and k) and up_proj of layer 1 (fused with gate),
    perturbed: B quantizes them and keeps the Q8_0 blocks of the q, k and gate rows it serves;
    A2 serves the gguf package's Q8_0 file of the weights
    with those two tensors replaced. v and up are not permuted by the GGUF layout, so the file's
    rows are the HF rows."""
    _, db = daemons_a_b()
    rng = np.random.default_rng(5)
    z = np.load(os.path.join(DATA, "tiny-bf16.npz"))
    new = {}
    for hf in ("model.layers.0.self_attn.v_proj.weight", "model.layers.1.mlp.up_proj.weight"):
        x = z[hf] * (1 + np.float32(0.05) * rng.standard_normal(z[hf].shape).astype(np.float32))
        new[hf] = bf16_bits(x)
    as_f32 = {k: (v.astype(np.uint32) << 16).view(np.float32) for k, v in new.items()}
    path = os.path.join(_tmp, "tiny-q8_0-partial.gguf")
    q8_0_copy(BF16, path, {"blk.0.attn_v.weight": as_f32["model.layers.0.self_attn.v_proj.weight"],
                           "blk.1.ffn_up.weight": as_f32["model.layers.1.mlp.up_proj.weight"]})
    da2 = daemon(model=path)
    with Client(da2.url) as a2, Client(db.url) as b:
        before = runs(b)
        v = b.info.weight_version
        r = b.push_weights(new, v + 1)
        assert r.version == v + 1, r
        rb, ra2 = runs(b), runs(a2)
        assert not same(before, rb), "the partial push changed nothing"
        assert same(ra2, rb), "a partial q8_0 push differs from the Q8_0 file of the same weights"
        assert a2.status()["memory"]["weights_bytes"] == b.status()["memory"]["weights_bytes"]


def read_bf16_folder(path):
    """{name: uint16 bf16 bits} of an HF folder's model.safetensors (every tensor BF16)."""
    import json
    import struct
    with open(os.path.join(path, "model.safetensors"), "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        hdr = json.loads(f.read(n))
        raw = f.read()
    out = {}
    for k, v in hdr.items():
        if k != "__metadata__":
            assert v["dtype"] == "BF16", (k, v["dtype"])
            a, b = v["data_offsets"]
            out[k] = np.frombuffer(raw[a:b], np.uint16).reshape(v["shape"])
    return out


@case
def moe_push_quantizes_the_experts_not_the_router():
    """Qwen3-MoE (tiny-moe-bf16, 16 experts): a bf16 push of its HF folder (every expert's
    gate/up/down by name, the router mlp.gate) to a q8_0 daemon gives the bits of the gguf
    package's Q8_0 file (experts Q8_0, the router kept f32 as llama.cpp keeps ffn_gate_inp);
    the router is held as pushed, bf16 (the same values, so the same products), so only the
    q8_0 bytes equal the file's."""
    src = os.path.join(DATA, "tiny-moe-bf16.gguf")
    path = os.path.join(_tmp, "tiny-moe-q8_0-gguf-py.gguf")
    q8_0_copy(src, path)
    da, db = daemon(model=path), daemon("--serve-dtype", "q8_0", model=src)
    w = read_bf16_folder(os.path.join(DATA, "tiny-moe-bf16.hf"))
    with Client(da.url) as a, Client(db.url) as b:
        b0 = runs(b)
        v = b.info.weight_version
        b.push_weights(w, v + 1)
        ra, rb = runs(a), runs(b)
        assert not same(b0, rb), "the push changed nothing"
        assert same(ra, rb), "the q8_0 MoE push differs from the gguf package's Q8_0 file"
        ba, bb = a.status()["memory"]["weights_bytes_by_dtype"], b.status()["memory"]["weights_bytes_by_dtype"]
        router = sum(t.nbytes for k, t in w.items() if k.endswith("mlp.gate.weight"))
        assert ba["q8_0"] == bb["q8_0"] and bb["bf16"] == router and set(bb) == {"q8_0", "bf16", "f32"}, (ba, bb)
        assert ba["f32"] == bb["f32"] + 2 * router, (ba, bb)   # the file's router is f32


@case
def nonfinite_or_unscalable_push_refused_old_weights_serve():
    _, db = daemons_a_b()
    with Client(db.url) as b:
        v0, base = b.info.weight_version, runs(b)
        wb0 = b.status()["memory"]["weights_bytes"]
        for name, val, want in (("model.layers.1.mlp.down_proj.weight", np.nan, "NaN"),
                                ("model.layers.0.self_attn.k_proj.weight", 1e7, "overflows fp16")):
            w = pushed_bf16()
            t = w[name].copy()
            t.reshape(-1)[77] = bf16_bits(np.array([val], np.float32))[0]
            w[name] = t
            try:
                b.push_weights(w, v0 + 1)
                raise AssertionError(f"a push with {val} in {name} was accepted")
            except DaemonError as e:
                assert e.code == proto.E.INVALID_PARAMS and name in str(e) and want in str(e), e
            st = b.status()
            assert st["weight_version"] == v0 and st["memory"]["weights_bytes"] == wb0, st
            assert same(base, runs(b)), f"the refused push ({val}) changed the outputs"


@case
def daemons_stop_cleanly():
    stop_cleanly(*_daemons)


if __name__ == "__main__":
    main()
