"""Weight updates, export and the chain on a mixture-of-experts model
(Qwen3-MoE), bit for bit, on the tiny random models of tests/py/moe_model.py
that tests/gen_testdata.sh writes (3 layers, 16 experts of which 4 are used,
HF names model.layers.N.mlp.experts.E.{gate,up,down}_proj.weight and the
router model.layers.N.mlp.gate.weight):

- GGUF (f32, f16, bf16, q8_0, q4_k_m) -> rollout-export (HF f32) -> reload:
  logits and seeded rollouts bit-identical, the export of the export the same
  bytes, every expert's tensor under its own number with the generator's
  values, and config.json reloads as the same MoE (num_experts,
  num_experts_per_tok, moe_intermediate_size, norm_topk_prob false kept);
- a push of every weight of another model (its folder read as a state dict
  with per-expert names, through Client.push_weights), in f32
  (NNG chunks of 4 KiB, so tensors span chunks) and in bf16 (data lane):
  greedy tokens and log-probs bit-identical to a daemon started on a folder
  holding those weights, /status weights_bytes equal to that daemon's (bf16
  pushes stay bf16: about 2 bytes a parameter, f32 4);
- a push of a few experts' tensors (expert 3 of layer 1: up alone, half of
  its gate|up, and down; the last expert of layer 0; the router of layer 2)
  equals a daemon on a folder where only those changed and differs from one
  where the same change went to expert 4 instead; pushing the originals back
  restores them; on Q4_K_M weights half an expert's gate|up (the rest read
  back) the same; on bf16 weights a partial bf16 push keeps weights_bytes;
- bad pushes refused naming the tensor and why (expert 16 of 16, "03", a
  layer past the end, a wrong shape, transformers' fused 3-D expert tensors,
  a NaN in an expert) with the old weights still serving;
- a chained push (Pool) to three daemons, then a fourth joining with
  weights_from: all on the new version with equal outputs, equal to a load of
  the weights; then a partial push fanned out directly reaches all alike;
- rolloutctl push-weights of a MoE .gguf and of HF folders (the C client's
  sources), and /update_weights_from_disk of a .gguf, equal a load of the
  same file."""
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import time
import urllib.request

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import BUILD, ROOT, TMP, case, main, run  # noqa: E402
from rdtest import Daemon  # noqa: E402
import moe_model  # noqa: E402

sys.path.insert(0, os.path.join(ROOT, "tools", "python"))
from rolloutd import Client, DaemonError, Pool, bf16_bits  # noqa: E402

sys.path.insert(0, os.path.join(ROOT, "tools"))
import gen_tiny_model as gtm  # noqa: E402

DATA = os.environ.get("RD_TESTDATA", os.path.join(ROOT, "build", "testdata"))
EXPORT = os.path.join(BUILD, "rollout-export")
LOGITS = os.path.join(BUILD, "rollout-logits")
GEN = os.path.join(BUILD, "rollout-gen")
CTL = os.path.join(BUILD, "rolloutctl")
WORK = tempfile.mkdtemp(prefix="rd-moeup-", dir=TMP)
DTYPES = moe_model.DTYPES
S = moe_model.SHAPE
E = S["n_expert"]
PROMPT = np.random.default_rng(7).integers(3, 300, 300).tolist()
PROMPTS = [PROMPT[:9], PROMPT[:40], PROMPT]
_daemons = []


def gguf(dt):
    return os.path.join(DATA, f"tiny-moe-{dt}.gguf")


def daemon(*extra, **kw):
    d = Daemon(*extra, **kw)
    _daemons.append(d)
    return d


def logits(path, ids=PROMPT):
    out = os.path.join(WORK, "logits.f32")
    if os.path.exists(out):
        os.remove(out)
    run([LOGITS, "--model", path, "--prompt-ids", ",".join(map(str, ids)), "--out", out])
    a = np.fromfile(out, dtype="<f4")
    assert a.size == len(ids) * S["vocab"] and np.isfinite(a).all(), (path, a.size)
    return a


def rollouts(path):
    p = run([GEN, "--model", path, "--prompt-ids", ",".join(map(str, PROMPT[:50])), "--temperature", "1",
             "--seed", "5", "--max-tokens", "16", "-n", "3", "--json", "--ignore-eos"])
    return [json.loads(line) for line in p.stdout.splitlines() if line.startswith("{")]


def read_st(path):
    """{name: array} in file order: float32 for F32, uint16 bits for BF16 (what push_weights sends as bf16)."""
    with open(path, "rb") as f:
        raw = f.read()
    (n,) = struct.unpack("<Q", raw[:8])
    hdr = json.loads(raw[8:8 + n])
    out = {}
    for k, v in hdr.items():
        if k == "__metadata__":
            continue
        dt = {"F32": np.float32, "BF16": np.uint16}[v["dtype"]]
        a, b = v["data_offsets"]
        out[k] = np.frombuffer(raw[8 + n + a:8 + n + b], dtype=dt).reshape(v["shape"])
    return out


def f32_of(a):
    return (a.astype(np.uint32) << 16).view(np.float32) if a.dtype == np.uint16 else a


def folder(name, w, dtype, like):
    """An HF folder WORK/name: like's config.json (torch_dtype set) and w (float32 values) as dtype."""
    out = os.path.join(WORK, name)
    os.makedirs(out, exist_ok=True)
    cfg = json.load(open(os.path.join(like, "config.json")))
    cfg["torch_dtype"] = "bfloat16" if dtype == "bf16" else "float32"
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
    gtm.write_safetensors(os.path.join(out, "model.safetensors"), {k: f32_of(v) for k, v in w.items()}, dtype)
    return out


_exports = {}


def export(dt, dtype="f32"):
    key = (dt, dtype)
    if key not in _exports:
        out = os.path.join(WORK, f"ex-{dt}-{dtype}")
        run([EXPORT, "--model", gguf(dt), "--out", out, "--dtype", dtype])
        _exports[key] = out
    return _exports[key]


_other = {}


def other(dtype):
    """An HF folder of another random MoE of the same shape (seed 43), F32 or BF16: push material."""
    if dtype not in _other:
        _, hf = moe_model.write_tiny_moe(os.path.join(WORK, "other"), dtype=dtype, seed=43)
        _other[dtype] = hf
    return _other[dtype]


def greedy(c, prompts=PROMPTS):
    return c.generate(prompts, max_tokens=10, temperature=0.0, ignore_eos=True)


def same(a, b):
    return len(a) == len(b) and all(
        np.array_equal(x.token_ids, y.token_ids) and np.array_equal(x.logprobs.view(np.uint32),
                                                                    y.logprobs.view(np.uint32))
        for x, y in zip(a, b))


def weights_bytes(c):
    return c.status()["memory"]["weights_bytes"]


def expert_names():
    return [f"model.layers.{i}.mlp.experts.{e}.{p}_proj.weight" for i in range(S["layers"]) for e in range(E)
            for p in ("gate", "up", "down")]


@case
def export_reload_is_bit_identical_for_every_dtype():
    for dt in DTYPES:
        src, out = gguf(dt), export(dt)
        a, b = logits(src), logits(out)
        assert np.array_equal(a, b), f"{dt}: export reload differs, max |diff| {np.abs(a - b).max()}"
        ra, rb = rollouts(src), rollouts(out)
        assert len(ra) == 3 and [r["token_ids"] for r in ra] == [r["token_ids"] for r in rb], dt
        assert all(np.array_equal(np.float32(x["logprobs"]), np.float32(y["logprobs"])) for x, y in zip(ra, rb))
        again = os.path.join(WORK, f"ex2-{dt}")
        run([EXPORT, "--model", out, "--out", again, "--dtype", "f32"])
        with open(os.path.join(out, "model.safetensors"), "rb") as f1, \
                open(os.path.join(again, "model.safetensors"), "rb") as f2:
            assert f1.read() == f2.read(), f"{dt}: re-export differs"
        s = moe_model.shape_for(dt)
        cfg = json.load(open(os.path.join(out, "config.json")))
        want = {"architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "num_experts": s["n_expert"],
                "num_experts_per_tok": s["k"], "moe_intermediate_size": s["ffn_exp"], "norm_topk_prob": True,
                "decoder_sparse_step": 1, "mlp_only_layers": [], "hidden_size": s["dim"], "head_dim": s["head_dim"],
                "num_hidden_layers": s["layers"], "tie_word_embeddings": False}
        assert {k: cfg.get(k) for k in want} == want, cfg
        # every tensor under its own name, with the generator's values (its HF folder holds the GGUF's
        # dequantized values): an expert exported under another's number fails here
        mine, gen = read_st(os.path.join(out, "model.safetensors")), read_st(
            os.path.join(DATA, f"tiny-moe-{dt}.hf", "model.safetensors"))
        assert sorted(mine) == sorted(gen), sorted(set(mine) ^ set(gen))[:5]
        bad = [k for k in gen if not np.array_equal(mine[k], f32_of(gen[k]))]
        assert not bad, f"{dt}: exported values differ from the generator's: {bad[:4]}"
        assert mine[f"model.layers.{s['layers'] - 1}.mlp.experts.{s['n_expert'] - 1}.down_proj.weight"].shape == \
            (s["dim"], s["ffn_exp"]) and mine["model.layers.0.mlp.gate.weight"].shape == (s["n_expert"], s["dim"])
    # bf16 export of the bf16 model: BF16 tensors, same logits
    out = export("bf16", "bf16")
    t = read_st(os.path.join(out, "model.safetensors"))
    assert all(v.dtype == np.uint16 for v in t.values())
    assert np.array_equal(logits(gguf("bf16")), logits(out)), "bf16 export reload differs"
    # norm_topk_prob false survives export (it changes the outputs)
    _, nonorm = moe_model.write_tiny_moe(os.path.join(WORK, "nonorm"), dtype="f32", seed=41, norm_topk_prob=False)
    out = os.path.join(WORK, "ex-nonorm")
    run([EXPORT, "--model", nonorm, "--out", out, "--dtype", "f32"])
    assert json.load(open(os.path.join(out, "config.json")))["norm_topk_prob"] is False
    a, b = logits(nonorm), logits(out)
    assert np.array_equal(a, b), f"norm_topk_prob false: export reload differs by {np.abs(a - b).max()}"
    assert not np.array_equal(a, logits(gguf("f32"))), "norm_topk_prob false made no difference"


@case
def full_pushes_equal_a_load_and_keep_their_dtype():
    d = daemon(model=gguf("q8_0"))
    with Client(d.url) as c:
        base, w0 = greedy(c), weights_bytes(c)
        for v, dtype, lane, chunk in ((1, "f32", False, 4096), (2, "bf16", True, 16 << 20)):
            hf = other(dtype)
            w = read_st(os.path.join(hf, "model.safetensors"))
            assert set(expert_names()) <= set(w) and len(w) == 3 + S["layers"] * (9 + 3 * E), len(w)
            assert all(x.dtype == (np.uint16 if dtype == "bf16" else np.float32) for x in w.values())
            r = c.push_weights(w, v, lane=lane, chunk_bytes=chunk)
            assert r.version == v and r.lane == lane and r.bytes == sum(x.nbytes for x in w.values()), r
            ref = daemon(model=hf)
            with Client(ref.url) as cr:
                got, want = greedy(c), greedy(cr)
                assert same(got, want), f"{dtype} push: outputs differ from a daemon started on the same weights"
                assert not same(got, base), f"{dtype} push: the outputs did not change"
                wa, wr = weights_bytes(c), weights_bytes(cr)
            n = sum(x.size for x in w.values())
            size = 2 if dtype == "bf16" else 4
            print(f"  {dtype} push of {len(w)} tensors ({r.bytes} bytes): weights_bytes {w0} -> {wa} "
                  f"(a load: {wr}; {n} parameters)", flush=True)
            assert wa == wr, f"{dtype} push holds {wa} bytes; a load of the same folder {wr}"
            assert size * n <= wa <= size * n * 1.05, (dtype, wa, n)
            ref.kill()
        assert c.status()["weight_version"] == 2


def changed(w, names, to_expert=None):
    """w with each tensor in names times 1.5 plus 0.25 (f32 values); to_expert moves the change to that
    expert's tensor of the same layer and kind instead (a wrong reference)."""
    out = {k: f32_of(v) for k, v in w.items()}
    for k in names:
        dst = k if to_expert is None else k.replace(".experts." + k.split(".experts.")[1].split(".")[0] + ".",
                                                     f".experts.{to_expert}.")
        out[dst] = (out[k] * np.float32(1.5) + np.float32(0.25)).astype(np.float32)
    return out


@case
def partial_pushes_change_exactly_those_experts():
    ex = export("f32")
    like = os.path.join(DATA, "tiny-moe-f32.hf")
    w = read_st(os.path.join(ex, "model.safetensors"))
    experts = ["model.layers.1.mlp.experts.3.up_proj.weight", "model.layers.1.mlp.experts.3.down_proj.weight",
               f"model.layers.0.mlp.experts.{E - 1}.gate_proj.weight"]
    router = ["model.layers.2.mlp.gate.weight"]
    d = daemon(model=gguf("f32"))
    with Client(d.url) as c:
        base, w0 = greedy(c), weights_bytes(c)
        for v, names in ((1, experts), (2, experts + router)):
            new = changed(w, names)
            r = c.push_weights({k: new[k] for k in names}, v)
            assert r.version == v, r
            got = greedy(c)
            assert not same(got, base), f"pushing {names} changed nothing"
            ref = daemon(model=folder(f"partial-{v}", new, "f32", like))
            wrong = daemon(model=folder(f"wrong-{v}", changed(w, experts, to_expert=4) if v == 1 else
                                        changed(w, experts), "f32", like))
            with Client(ref.url) as cr, Client(wrong.url) as cw:
                assert same(got, greedy(cr)), f"after pushing {names} the outputs differ from a load with only " \
                                              "those changed"
                assert not same(got, greedy(cw)), "the reference with the change on another expert (or without " \
                                                  "the router) gives the same outputs: the comparison cannot fail"
            assert weights_bytes(c) == w0, (weights_bytes(c), w0)
            ref.kill()
            wrong.kill()
        c.push_weights({k: w[k] for k in experts + router}, 3)
        assert same(base, greedy(c)), "pushing the originals back did not restore the outputs"
    # quantized weights (Q4_K gate|up, Q6_K down): the other half of the group is read back
    ex = export("q4_k_m")
    w = read_st(os.path.join(ex, "model.safetensors"))
    names = ["model.layers.1.mlp.experts.3.up_proj.weight", "model.layers.0.mlp.gate.weight"]
    new = changed(w, names)
    d = daemon(model=gguf("q4_k_m"))
    ref = daemon(model=folder("partial-q4", new, "f32", ex))
    with Client(d.url) as c, Client(ref.url) as cr:
        base = greedy(c)
        c.push_weights({k: new[k] for k in names}, 1)
        got = greedy(c)
        assert not same(got, base) and same(got, greedy(cr)), "q4_k_m partial push: outputs"
    # bf16 weights: a bf16 push of one expert's gate_proj alone (half of its gate|up) stays bf16
    hf = os.path.join(DATA, "tiny-moe-bf16.hf")
    wb = read_st(os.path.join(hf, "model.safetensors"))
    name = "model.layers.1.mlp.experts.3.gate_proj.weight"
    new = {k: f32_of(v) for k, v in wb.items()}
    new[name] = gtm.bf16_round(new[name] * np.float32(1.5) + np.float32(0.25))
    d = daemon(model=hf)
    ref = daemon(model=folder("partial-bf16", new, "bf16", hf))
    with Client(d.url) as c, Client(ref.url) as cr:
        base, w0 = greedy(c), weights_bytes(c)
        c.push_weights({name: bf16_bits(new[name])}, 1)
        got = greedy(c)
        assert not same(got, base) and same(got, greedy(cr)), "bf16 partial push: outputs"
        assert weights_bytes(c) == w0 == weights_bytes(cr), (weights_bytes(c), w0, weights_bytes(cr))


@case
def bad_pushes_are_refused_and_the_old_weights_serve():
    w = read_st(os.path.join(export("f32"), "model.safetensors"))
    up3 = w["model.layers.0.mlp.experts.3.up_proj.weight"]
    good = {"model.layers.1.mlp.experts.2.down_proj.weight":
            w["model.layers.1.mlp.experts.2.down_proj.weight"] * np.float32(2)}
    nan = up3.copy()
    nan[5, 7] = np.nan
    bad = [
        ("model.layers.0.mlp.experts.16.up_proj.weight", up3, ["not a weight of this model", "expert 16",
                                                                "16 experts"]),
        ("model.layers.0.mlp.experts.03.up_proj.weight", up3, ["not a weight of this model", "'03'", "canonical"]),
        ("model.layers.3.mlp.experts.3.up_proj.weight", up3, ["not a weight of this model", "layer 3", "3 layers"]),
        ("model.layers.0.mlp.experts.3.up_proj.weight", up3.T.copy(), ["shape [64, 32]", "[32, 64]"]),
        ("model.layers.0.mlp.experts.3.down_proj.weight", up3, ["shape [32, 64]", "[64, 32]"]),
        ("model.layers.0.mlp.gate.weight", w["model.layers.0.mlp.gate.weight"][:15].copy(), ["[15, 64]", "[16, 64]"]),
        # transformers 5 keeps a layer's experts fused in 3-D parameters: not this daemon's names
        ("model.layers.0.mlp.experts.gate_up_proj", np.zeros((E, 2 * S["ffn_exp"], S["dim"]), np.float32),
         ["not a weight of this model", "model.layers.0.mlp.experts.0.gate_proj.weight"]),
        ("model.layers.0.mlp.experts.3.up_proj.weight", nan, ["element 327", "NaN"]),
    ]
    d = daemon(model=gguf("f32"))
    with Client(d.url) as c:
        base, w0 = greedy(c), weights_bytes(c)
        for name, x, words in bad:
            try:
                c.push_weights({**good, name: x}, 1)
                raise AssertionError(f"{name} {x.shape} was accepted")
            except DaemonError as e:
                assert name in str(e) and all(s in str(e) for s in words), (words, str(e))
                print(f"  refused: {e}", flush=True)
            assert c.status()["weight_version"] == 0 and weights_bytes(c) == w0
        assert same(base, greedy(c)), "a refused push changed the outputs"


def version(d):
    with Client(d.url, name="probe") as c:
        return c.info.weight_version


@case
def a_chain_of_three_and_a_rejoining_daemon_serve_the_same_moe():
    hf = other("bf16")
    w = read_st(os.path.join(hf, "model.safetensors"))
    ds = [daemon(model=gguf("q8_0")) for _ in range(3)]
    ref = daemon(model=hf)
    with Pool([d.url for d in ds]) as pool, Client(ref.url) as cr:
        before = greedy(pool.clients[0])
        res = pool.push_weights(w, version=5, chunk_bytes=64 << 10)
        assert [r.hop for r in res] == [0, 1, 2] and all(r.fanout == "chain" for r in res), res
        assert [version(d) for d in ds] == [5, 5, 5]
        want = greedy(cr)
        outs = [greedy(c) for c in pool.clients]
        assert all(same(o, want) for o in outs), "a daemon of the chain serves other weights than a load"
        assert not same(outs[0], before), "the chain's push changed nothing"
        wb = weights_bytes(cr)
        assert all(weights_bytes(c) == wb for c in pool.clients), "the chain's daemons hold other dtypes"
        # a fourth daemon pulls the serving weights from one of them (WEIGHTS_SYNC: the daemon's own export)
        late = daemon("--weights-from", ds[2].url, model=gguf("f32"))
        deadline = time.time() + 60
        while version(late) != 5:
            assert time.time() < deadline, f"the joining daemon did not pull version 5: {late.tail()}"
            time.sleep(0.2)
        with Client(late.url) as cl:
            assert same(greedy(cl), want), "the daemon that joined serves other weights"
        # and a direct fan-out of a partial push reaches all three alike
        part = {k: bf16_bits(f32_of(w[k]) * np.float32(1.25)) for k in
                ("model.layers.2.mlp.experts.7.gate_proj.weight", "model.layers.0.mlp.gate.weight")}
        res = pool.push_weights(part, version=6, fanout="direct")
        assert all(r.version == 6 and r.fanout == "direct" for r in res)
        outs = [greedy(c) for c in pool.clients]
        assert all(same(o, outs[0]) for o in outs) and not same(outs[0], want)
    for d in ds + [ref, late]:
        d.kill()


@case
def rolloutctl_pushes_a_moe_gguf_and_folder():
    d = daemon(model=gguf("f32"))
    for v, src in ((1, gguf("q8_0")), (2, other("f32")), (3, other("bf16"))):
        with Client(d.url) as c:
            before = greedy(c)
        p = subprocess.run([CTL, "push-weights", "--connect", d.url, src, "--version", str(v), "--json"],
                           capture_output=True, text=True, timeout=120)
        assert p.returncode == 0, (p.returncode, p.stdout, p.stderr)
        ref = daemon(model=src)
        with Client(d.url) as c, Client(ref.url) as cr:
            assert c.info.weight_version == v
            got = greedy(c)
            assert same(got, greedy(cr)), f"rolloutctl push of {src}: outputs differ from a load of it"
            assert not same(got, before), f"rolloutctl push of {src} changed nothing"
            assert weights_bytes(c) == weights_bytes(cr) or src.endswith(".gguf"), src
        ref.kill()
    # the HTTP route pushes a file to the daemon itself through the same client code
    with Client(d.url) as c:
        before = greedy(c)
    body = json.dumps({"model_path": gguf("bf16"), "weight_version": "4"}).encode()
    req = urllib.request.Request(f"http://127.0.0.1:{d.http_port}/update_weights_from_disk", data=body,
                                 method="POST", headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as r:
        res = json.loads(r.read())
    assert res["success"] is True and res["weight_version"] == "4", res
    ref = daemon(model=gguf("bf16"))
    with Client(d.url) as c, Client(ref.url) as cr:
        got = greedy(c)
        assert same(got, greedy(cr)) and not same(got, before), "/update_weights_from_disk of a MoE GGUF: outputs"
    ref.kill()


if __name__ == "__main__":
    try:
        main()
    finally:
        for d in _daemons:
            d.kill()
        shutil.rmtree(WORK, ignore_errors=True)
