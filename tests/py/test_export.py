"""HF export and safetensors loading: a model loaded from GGUF, exported as HF
tensors (rollout-export) and reloaded from the export gives bit-identical
logits and rollouts; the export matches the HF weights an independent path
(gen_tiny_model.py --hf-out) produces; corrupt files fail cleanly.

The safetensors reader here is written from the format description (u64 LE
header length, JSON header, data), independent of the C one."""
import json
import os
import struct
import subprocess
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import BUILD, MODEL, ROOT, TMP, Skip, case, main, run  # noqa: E402

EXPORT = os.path.join(BUILD, "rollout-export")
LOGITS = os.path.join(BUILD, "rollout-logits")
GEN = os.path.join(BUILD, "rollout-gen")
WORK = os.path.join(TMP, "test_export")
os.makedirs(WORK, exist_ok=True)
PROMPT = [1, 5, 9, 40, 7, 100, 3, 250]
SHAPE = ["--layers", "2", "--dim", "64", "--heads", "4", "--kv-heads", "2", "--ffn", "128", "--vocab", "300",
         "--ctx", "256"]


def tiny(dtype, extra=(), seed=5):
    """Generates a tiny model and its HF state_dict (npz) into the temp dir."""
    name = f"tiny-{dtype}{''.join(extra).replace('-', '')}"
    gguf = os.path.join(WORK, name + ".gguf")
    npz = os.path.join(WORK, name + ".npz")
    if not os.path.exists(npz):
        run([sys.executable, os.path.join(ROOT, "tools", "gen_tiny_model.py"), "--out", gguf, "--dtype", dtype,
             "--seed", str(seed), "--hf-out", npz, *SHAPE, *extra])
    return gguf, npz


def export(src, out, dtype="f32"):
    run([EXPORT, "--model", src, "--out", out, "--dtype", dtype])
    return out


def read_safetensors(path):
    """An independent reader: {name: np.ndarray(float32)} and the metadata."""
    with open(path, "rb") as f:
        raw = f.read()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n].decode("utf-8"))
    data = raw[8 + n:]
    meta = header.pop("__metadata__", {})
    out = {}
    spans = []
    for name, t in header.items():
        b, e = t["data_offsets"]
        spans.append((b, e))
        dt = {"F32": "<f4", "F16": "<f2", "BF16": "<u2"}[t["dtype"]]
        a = np.frombuffer(data[b:e], dtype=dt)
        if t["dtype"] == "BF16":
            a = (a.astype(np.uint32) << 16).view(np.float32)
        out[name] = a.astype(np.float32).reshape(t["shape"])
    spans.sort()
    assert spans[0][0] == 0 and spans[-1][1] == len(data), "data section fully used"
    assert all(spans[i][1] == spans[i + 1][0] for i in range(len(spans) - 1)), "contiguous, no overlap"
    return out, meta


def logits(model, ids=PROMPT):
    out = os.path.join(WORK, "logits.bin")
    run([LOGITS, "--model", model, "--prompt-ids", ",".join(map(str, ids)), "--out", out, "--threads", "1"])
    return np.fromfile(out, dtype="<f4")


def gen(model, *args):
    # --ignore-eos: an HF folder carries no tokenizer (so no EOS id); both runs
    # must decode the same number of tokens for the comparison to be about weights.
    # Bytes, not text: "text" may hold a partial UTF-8 sequence from byte tokens.
    cmd = [GEN, "--model", model, "--threads", "1", "--json", "--ignore-eos", *args]
    p = subprocess.run(cmd, capture_output=True)
    assert p.returncode == 0, f"{' '.join(cmd)} exited {p.returncode}: {p.stderr.decode(errors='replace')[-2000:]}"
    return [json.loads(line) for line in p.stdout.decode(errors="replace").splitlines() if line.strip()]


def same_rollouts(a, b):
    assert len(a) == len(b) and a, (len(a), len(b))
    for x, y in zip(a, b):
        assert x["token_ids"] == y["token_ids"], (x["token_ids"], y["token_ids"])
        assert np.array_equal(np.float32(x["logprobs"]), np.float32(y["logprobs"])), (x["logprobs"], y["logprobs"])


@case
def tiny_export_reload_is_bit_identical():
    for dtype, extra in [("q4_1", ()), ("f32", ()), ("q8_0", ("--untied",))]:
        gguf, _ = tiny(dtype, extra)
        out = export(gguf, os.path.join(WORK, f"ex-{dtype}"))
        a, b = logits(gguf), logits(out)
        assert a.size == len(PROMPT) * 300 and np.isfinite(a).all()
        assert np.array_equal(a, b), f"{dtype}: max |diff| {np.abs(a - b).max()}"
        # the lone .safetensors file (config.json next to it) loads the same
        assert np.array_equal(a, logits(os.path.join(out, "model.safetensors")))
        args = ["--prompt-ids", "1,5,9", "--temperature", "1", "--seed", "3", "--max-tokens", "12", "-n", "2"]
        same_rollouts(gen(gguf, *args), gen(out, *args))
        # export of the export is the same bytes: the round trip is a fixed point
        again = export(out, os.path.join(WORK, f"ex2-{dtype}"))
        with open(os.path.join(out, "model.safetensors"), "rb") as f1, \
                open(os.path.join(again, "model.safetensors"), "rb") as f2:
            assert f1.read() == f2.read(), f"{dtype}: re-export differs"


@case
def export_matches_independent_hf_weights():
    for dtype, extra in [("q4_1", ()), ("bf16", ("--untied",))]:
        gguf, npz = tiny(dtype, extra)
        out = export(gguf, os.path.join(WORK, f"hf-{dtype}"))
        got, meta = read_safetensors(os.path.join(out, "model.safetensors"))
        assert meta == {"format": "pt"}, meta
        want = dict(np.load(npz))
        assert set(got) == set(want), (sorted(set(got) ^ set(want)))
        for name, w in want.items():
            assert got[name].shape == w.shape, (name, got[name].shape, w.shape)
            assert np.array_equal(got[name], w.astype(np.float32)), f"{name}: max |diff| {np.abs(got[name] - w).max()}"
        cfg = json.load(open(os.path.join(out, "config.json")))
        assert cfg["architectures"] == ["LlamaForCausalLM"] and cfg["hidden_size"] == 64
        assert cfg["num_key_value_heads"] == 2 and cfg["tie_word_embeddings"] == (not extra)
        assert cfg["rope_scaling"] is None and cfg["vocab_size"] == 300
    # bf16 / f16 exports hold the rounded values
    gguf, npz = tiny("f32")
    want = dict(np.load(npz))
    for dt, np_round in [("bf16", lambda w: ((w.view(np.uint32) + 0x7fff + ((w.view(np.uint32) >> 16) & 1))
                                              & 0xffff0000).view(np.float32)),
                         ("f16", lambda w: w.astype(np.float16).astype(np.float32))]:
        out = export(gguf, os.path.join(WORK, f"hf-f32-as-{dt}"), dt)
        got, _ = read_safetensors(os.path.join(out, "model.safetensors"))
        for name, w in want.items():
            assert np.array_equal(got[name], np_round(w.astype(np.float32))), f"{dt} {name}"
        assert json.load(open(os.path.join(out, "config.json")))["torch_dtype"] == \
            {"bf16": "bfloat16", "f16": "float16"}[dt]
        # and they load and run (bf16 re-export through f32 is exact)
        assert np.isfinite(logits(out)).all()


@case
def hf_folder_written_by_numpy_loads():
    """A sharded HF folder written here, not by rollout-export, loads and matches the GGUF."""
    gguf, npz = tiny("f32")
    w = dict(np.load(npz))
    d = os.path.join(WORK, "sharded")
    os.makedirs(d, exist_ok=True)
    names = sorted(w)
    shards = [names[: len(names) // 2], names[len(names) // 2:]]
    wmap = {}
    for i, part in enumerate(shards):
        fn = f"model-{i + 1:05d}-of-00002.safetensors"
        write_safetensors(os.path.join(d, fn), {n: w[n] for n in part[::-1]}, bf16=False)
        wmap.update({n: fn for n in part})
    json.dump({"metadata": {}, "weight_map": wmap}, open(os.path.join(d, "model.safetensors.index.json"), "w"))
    json.dump({"architectures": ["LlamaForCausalLM"], "hidden_size": 64, "intermediate_size": 128,
               "num_attention_heads": 4, "num_key_value_heads": 2, "num_hidden_layers": 2, "vocab_size": 300,
               "max_position_embeddings": 256, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
               "tie_word_embeddings": True, "rope_scaling": None}, open(os.path.join(d, "config.json"), "w"))
    assert np.array_equal(logits(gguf), logits(d))


def write_safetensors(path, tensors, bf16=False, header_override=None):
    header, blobs, off = {"__metadata__": {"format": "pt"}}, [], 0
    for name, a in tensors.items():
        b = np.ascontiguousarray(a, dtype="<f4").tobytes()
        header[name] = {"dtype": "F32", "shape": list(a.shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    if header_override:
        header_override(header)
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


@case
def corrupt_files_fail_cleanly():
    gguf, npz = tiny("f32")
    w = dict(np.load(npz))
    cfg_src = os.path.join(export(gguf, os.path.join(WORK, "ex-corrupt-src")), "config.json")
    emb = "model.embed_tokens.weight"

    def bad(tag, want, **kw):
        d = os.path.join(WORK, "bad-" + tag)
        os.makedirs(d, exist_ok=True)
        with open(cfg_src) as f, open(os.path.join(d, "config.json"), "w") as g:
            cfg = json.load(f)
            if "cfg" in kw:
                kw.pop("cfg")(cfg)
            json.dump(cfg, g)
        path = os.path.join(d, "model.safetensors")
        if "raw" in kw:
            with open(path, "wb") as f:
                f.write(kw["raw"])
        else:
            write_safetensors(path, kw.get("tensors", w), header_override=kw.get("hdr"))
            if "cut" in kw:
                os.truncate(path, os.path.getsize(path) - kw["cut"])
        p = run([LOGITS, "--model", d, "--prompt-ids", "1,2", "--out", os.path.join(d, "x.bin")], check=False)
        assert p.returncode != 0, f"{tag}: exit 0"
        assert want in p.stderr, f"{tag}: stderr {p.stderr.strip()!r} lacks {want!r}"
        assert "Traceback" not in p.stderr and p.returncode in (1, 2), f"{tag}: rc {p.returncode}"

    bad("truncated", "out of range", cut=100)
    bad("short", "shorter than the 8-byte header", raw=b"\x05\x00")
    bad("hdrlen", "runs past the end of the file", raw=struct.pack("<Q", 1 << 40) + b"{}")
    bad("json", "header is not a JSON object", raw=struct.pack("<Q", 9) + b"{\"a\": [1,")

    def size_mismatch(h):
        h[emb]["shape"] = [300, 63]
    bad("size", f"tensor '{emb}': data_offsets", hdr=size_mismatch)

    def overlap(h):
        h["model.norm.weight"]["data_offsets"] = [0, 256]
    bad("overlap", "overlap", hdr=overlap)

    def dtype(h):
        h[emb]["dtype"] = "Q4_K"
    bad("dtype", f"tensor '{emb}': dtype 'Q4_K' is unknown", hdr=dtype)
    bad("missing", "tensor 'model.layers.1.mlp.up_proj.weight' missing",
        tensors={k: v for k, v in w.items() if k != "model.layers.1.mlp.up_proj.weight"})
    t = dict(w)
    t["model.layers.0.self_attn.k_proj.weight"] = t["model.layers.0.self_attn.k_proj.weight"][:16]
    bad("shape", "tensor 'model.layers.0.self_attn.k_proj.weight' has shape [16, 64], expected [32, 64]", tensors=t)
    bad("rope", "rope_scaling type \"yarn\" is not supported",
        cfg=lambda c: c.update(rope_scaling={"rope_type": "yarn", "factor": 4.0}))
    bad("arch", "not supported", cfg=lambda c: c.update(architectures=["MistralForCausalLM"]))
    # Llama tensors under a Qwen2 config: the family's table asks for the q bias
    bad("qwen2-no-bias", "tensor 'model.layers.0.self_attn.q_proj.bias' missing",
        cfg=lambda c: c.update(architectures=["Qwen2ForCausalLM"], model_type="qwen2"))
    bad("qwen3-no-norm", "tensor 'model.layers.0.self_attn.q_norm.weight' missing",
        cfg=lambda c: c.update(architectures=["Qwen3ForCausalLM"], model_type="qwen3"))
    bad("sliding", "use_sliding_window",
        cfg=lambda c: c.update(architectures=["Qwen2ForCausalLM"], use_sliding_window=True))
    # no config.json at all
    d = os.path.join(WORK, "bad-noconfig")
    os.makedirs(d, exist_ok=True)
    write_safetensors(os.path.join(d, "model.safetensors"), w)
    p = run([LOGITS, "--model", d, "--prompt-ids", "1", "--out", os.path.join(d, "x.bin")], check=False)
    assert p.returncode != 0 and "config.json" in p.stderr, p.stderr


@case
def real_model_export_reload_bit_identical():
    if not os.path.exists(MODEL):
        raise Skip(f"{MODEL} missing")
    out = export(MODEL, os.path.join(WORK, "smollm2-f32"))
    assert os.path.getsize(os.path.join(out, "model.safetensors")) > 500_000_000
    cfg = json.load(open(os.path.join(out, "config.json")))
    assert cfg["num_hidden_layers"] == 30 and cfg["hidden_size"] == 576 and cfg["rope_theta"] == 100000.0
    args = ["--prompt-ids", "1,504,3458,314,2114,28", "--temperature", "0", "--max-tokens", "8"]
    a, b = gen(MODEL, *args), gen(out, *args)
    assert len(a[0]["token_ids"]) == 8
    same_rollouts(a, b)


if __name__ == "__main__":
    main()
