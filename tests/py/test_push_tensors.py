"""Pool.push_tensors (issue 23): a trainer's (name, array) pairs pushed through the chain, against
real daemons on loopback and two tiny models of one shape (tools/gen_tiny_model.py, two seeds:
the policy before and after a step; the generator also writes the new one's HF state dict,
an independent source of names, shapes and values):

- GET /weights_manifest lists exactly the names and shapes of the generator's HF state dict
  (llama tied; qwen2 untied, with q/k/v biases);
- the new weights as NumPy arrays, pushed by push_tensors through a chain of two daemons, give
  outputs bit for bit equal to a daemon that got the same weights pushed from the HF folder by
  rolloutctl push-weights (the C client reading safetensors), both on the new version; each
  tensor's host bytes were made once for the checksums and once for the chain (not held all
  at once: a bf16 push from f32 arrays peaks far below the bf16 model's bytes, traced);
- torch tensors (CPU, and CUDA when there is one; fp32, bf16 and non-contiguous views) give the same
  outputs as the same values from NumPy (torch is installed by tools/setup.sh; SKIP only without it);
- a wrong name, a missing tensor and a transposed shape are refused together in one
  TensorMismatch naming each, before UPDATE_BEGIN: the daemons stay on their version with the
  same outputs; without a manifest the daemon's own check refuses the wrong shape and nothing
  is committed either."""
import os
import subprocess
import sys
import tracemalloc

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import BUILD, ROOT, TMP, Skip, case, main  # noqa: E402
from rdtest import Daemon, stop_cleanly  # noqa: E402

sys.path.insert(0, os.path.join(ROOT, "tools", "python"))
from rolloutd import Client, Pool, PoolError  # noqa: E402
from rolloutd.tensors import StreamedUpdate, TensorMismatch, fetch_manifest  # noqa: E402
from rolloutd.client import bf16_bits  # noqa: E402

PROMPTS = [[1, 40, 41, 42, 43, 44, 45, 46], [1, 50, 60, 70, 80], [1, 7, 9]]
SHAPE = ["--ctx", "512", "--layers", "6", "--dim", "256", "--ffn", "768"]
_files = {}
_daemons = []


def tiny(name, seed, *extra):
    """A tiny model (GGUF), its HF state dict (npz) and HF folder; cached per name."""
    if name not in _files:
        base = os.path.join(TMP, f"pt-{name}-{os.getpid()}")
        subprocess.run([sys.executable, os.path.join(ROOT, "tools", "gen_tiny_model.py"), "--out", base + ".gguf",
                        "--dtype", "f32", "--seed", str(seed), *SHAPE, *extra, "--hf-out", base + ".npz",
                        "--hf-dir", base + "-hf"], check=True, capture_output=True)
        _files[name] = base
    return _files[name]


def state(name):
    z = np.load(tiny(name, 0) + ".npz")
    return [(k, np.ascontiguousarray(z[k], dtype=np.float32)) for k in z.files]


def daemon(model):
    d = Daemon("--model", model, "--max-tokens", 256)
    _daemons.append(d)
    return d


def http(d):
    return f"http://127.0.0.1:{d.http_port}"


def sampled(d):
    with Client(d.url, name="probe") as c:
        out = c.generate(PROMPTS, n=2, max_tokens=16, temperature=1.0, seed=99, ignore_eos=True)
    return [(s.index, s.sample_idx, list(map(int, s.token_ids)), s.logprobs.view(np.uint32).tolist(), s.version_finish)
            for s in out]


def version(d):
    with Client(d.url, name="probe") as c:
        return c.info.weight_version


_pair = {}


def models():
    if not _pair:
        _pair["old"] = tiny("old", 601)
        _pair["new"] = tiny("new", 602)
    return _pair["old"], _pair["new"]


@case
def the_manifest_route_lists_the_state_dicts_names_and_shapes():
    for name, seed, extra in (("llama", 611, ()), ("qwen2", 612, ("--arch", "qwen2", "--untied"))):
        base = tiny(name, seed, *extra)
        d = daemon(base + ".gguf")
        try:
            got = fetch_manifest(http(d))
            z = np.load(base + ".npz")
            want = {k: tuple(z[k].shape) for k in z.files}
            assert got == want, (name, set(got) ^ set(want), {k for k in got if k in want and got[k] != want[k]})
            if name == "qwen2":
                assert "model.layers.0.self_attn.q_proj.bias" in got and "lm_head.weight" in got, sorted(got)[:8]
            else:
                assert "lm_head.weight" not in got     # tied
        finally:
            stop_cleanly(d)


@case
def numpy_push_equals_a_push_from_the_file():
    old, new = models()
    a1, a2, b = daemon(old + ".gguf"), daemon(old + ".gguf"), daemon(old + ".gguf")
    try:
        before = sampled(a1)
        items = state("new")
        with Pool([a1.url, a2.url]) as pool:
            pool.manifest = fetch_manifest(http(a1))
            res = pool.push_tensors(iter(items), version=5)        # a generator: read once
            assert [r.version for r in res] == [5, 5] and [r.fanout for r in res] == ["chain"] * 2, res
            assert sorted(r.hop for r in res) == [0, 1], res
        subprocess.run([os.path.join(BUILD, "rolloutctl"), "push-weights", "--connect", b.url, new + "-hf",
                        "--version", "5"], check=True, capture_output=True)
        ref = sampled(b)
        assert all(s[4] == 5 for s in ref), ref
        assert sampled(a1) == ref and sampled(a2) == ref, "push_tensors from NumPy != the push from the file"
        assert ref != before
        # Host bytes made per tensor: once to checksum (not kept), once to send (a chain: one feeder).
        upd = StreamedUpdate(items, chunk_bytes=64 << 10)
        assert upd.data.made == 0 and len(upd.data.cache) == 0
        with Client(a1.url) as c:
            c.push_weights(upd, 6)
        assert upd.data.made == len(items) and len(upd.data.cache) <= upd.data.keep, upd.data.made
        assert sampled(a1) == [s[:4] + (6,) for s in ref]
    finally:
        stop_cleanly(a1, a2, b)


@case
def a_bf16_push_from_f32_arrays_never_holds_the_model_twice():
    """The conversion happens one tensor at a time: the traced peak stays far below the bf16 model."""
    old, _ = models()
    d = daemon(old + ".gguf")
    try:
        items = state("new")
        bf16_bytes = sum(a.size * 2 for _, a in items)
        biggest = max(a.size * 2 for _, a in items)
        with Pool([d.url]) as pool:
            pool.push_tensors(items, version=2, dtype="bf16", chunk_bytes=256 << 10)    # warm: tables, buffers
            tracemalloc.start()
            tracemalloc.reset_peak()
            base = tracemalloc.get_traced_memory()[0]
            res = pool.push_tensors(items, version=3, dtype="bf16", chunk_bytes=256 << 10)
            peak = tracemalloc.get_traced_memory()[1] - base
            tracemalloc.stop()
        assert res[0].version == 3
        print(f"  bf16 push: traced peak {peak / 1e6:.2f} MB, bf16 model {bf16_bytes / 1e6:.2f} MB, largest tensor {biggest / 1e6:.2f} MB")
        # the checksum pass holds one converted tensor; the send pass at most `keep` (3) and a chunk
        assert peak < 4 * biggest + (2 << 20) and peak < bf16_bytes / 3, (peak, biggest, bf16_bytes)
        assert version(d) == 3
    finally:
        stop_cleanly(d)


@case
def torch_tensors_push_the_same():
    try:
        import torch
    except ImportError:
        raise Skip("torch is not installed")
    old, new = models()
    a, b = daemon(old + ".gguf"), daemon(old + ".gguf")
    try:
        items = state("new")
        with Pool([b.url]) as pb:
            pb.push_tensors(items, version=4)
        dev = "cuda" if torch.cuda.is_available() else "cpu"
        with Pool([a.url]) as pa:
            pa.push_tensors(((k, torch.from_numpy(v).to(dev)) for k, v in items), version=4)
        assert sampled(a) == sampled(b)
        # bf16 torch tensors are the bf16 bits NumPy pushes (bf16_bits: round to nearest even, as torch does)
        with Pool([b.url]) as pb:
            pb.push_tensors(((k, bf16_bits(v)) for k, v in items), version=5)
        with Pool([a.url]) as pa:
            pa.push_tensors(((k, torch.from_numpy(v).to(dev, torch.bfloat16)) for k, v in items), version=5)
        assert sampled(a) == sampled(b)
        # non-contiguous views (a transposed storage) push their values, not their memory order
        with Pool([b.url]) as pb:
            pb.push_tensors(items, version=6)
        with Pool([a.url]) as pa:
            pa.push_tensors(((k, torch.from_numpy(np.ascontiguousarray(v.T)).T if v.ndim == 2
                              else torch.from_numpy(v)) for k, v in items), version=6)
        assert sampled(a) == sampled(b)
    finally:
        stop_cleanly(a, b)


@case
def wrong_names_missing_tensors_and_shapes_are_refused_before_begin():
    old, _ = models()
    a1, a2 = daemon(old + ".gguf"), daemon(old + ".gguf")
    try:
        before, v0 = sampled(a1), version(a1)
        items = dict(state("new"))
        q = "model.layers.1.self_attn.q_proj.weight"
        bad = dict(items)
        bad["model.layers.9.mlp.up_proj.weight"] = items["model.layers.0.mlp.up_proj.weight"]   # no layer 9
        del bad["model.norm.weight"]
        bad["model.layers.2.mlp.down_proj.weight"] = items["model.layers.2.mlp.down_proj.weight"].T.copy()
        with Pool([a1.url, a2.url]) as pool:
            pool.manifest = fetch_manifest(http(a1))
            try:
                pool.push_tensors(bad.items(), version=v0 + 1)
                raise AssertionError("accepted")
            except TensorMismatch as e:
                msg = str(e)
                assert e.unknown == ["model.layers.9.mlp.up_proj.weight"], e.unknown
                assert e.missing == ["model.norm.weight"], e.missing
                assert list(e.shapes) == ["model.layers.2.mlp.down_proj.weight"], e.shapes
                for s in ("model.layers.9.mlp.up_proj.weight", "model.norm.weight", "model.layers.2.mlp.down_proj",
                          "[768, 256]", "[256, 768]", "nothing staged"):
                    assert s in msg, (s, msg)
            # partial=True: a subset of the model is a valid update (the rest keeps its values)
            res = pool.push_tensors([(q, items[q])], version=v0 + 1, partial=True)
            assert [r.version for r in res] == [v0 + 1] * 2
            v1 = v0 + 1
            mid = sampled(a1)
            # no manifest: the daemon's own UPDATE_BEGIN check refuses the shape; nothing committed
            pool.manifest = None
            try:
                pool.push_tensors([("model.layers.2.mlp.down_proj.weight",
                                    bad["model.layers.2.mlp.down_proj.weight"])], version=v1 + 1)
                raise AssertionError("accepted")
            except PoolError as e:
                assert "shape" in str(e) and "down_proj" in str(e), str(e)
        assert version(a1) == version(a2) == v1
        assert sampled(a1) == mid and mid != before
    finally:
        stop_cleanly(a1, a2)


if __name__ == "__main__":
    try:
        main()
    finally:
        for d in _daemons:
            d.stop()
        for base in _files.values():
            for p in (base + ".gguf", base + ".npz"):
                if os.path.exists(p):
                    os.unlink(p)
            subprocess.run(["rm", "-rf", base + "-hf"])
