"""Every family through export, reload and live weight updates, bit for bit.

For the tiny random models of each family that tests/gen_testdata.sh writes
(Qwen2 with q|k|v biases, untied; Qwen3 with q_norm/k_norm and a q width of
4 x 32 over hidden 64; Llama 3 with rope_freqs.weight and prompts past its
original context):

- GGUF -> rollout-export (HF f32) -> reload: logits and seeded rollouts
  bit-identical, the export of the export the same bytes, and config.json
  names the family (the Llama 3 rope_scaling recovered from the GGUF's
  divisors);
- the generator's own HF folder (written from the GGUF's values, not by our
  exporter) loads to the same logits as the GGUF;
- a daemon started on the GGUF, pushed its own export (data lane) serves
  bit-identical results; a push of only the family's own tensors (the Qwen2
  biases, the Qwen3 norms) changes the outputs, and pushing the originals
  back restores them bit for bit;
- bad pushes (a bias of the wrong length, a norm on a family without it) are
  refused naming the tensor, and the daemon keeps serving the old weights."""
import json
import os
import struct
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import BUILD, ROOT, TMP, case, main, run  # noqa: E402
from gguf_fast import GGUFReader  # noqa: E402  (the package's reader, its arrays read in one pass)
from rdtest import Daemon  # noqa: E402

sys.path.insert(0, os.path.join(ROOT, "tools", "python"))
from rolloutd import Client, DaemonError  # noqa: E402

DATA = os.environ.get("RD_TESTDATA", os.path.join(ROOT, "build", "testdata"))
EXPORT = os.path.join(BUILD, "rollout-export")
LOGITS = os.path.join(BUILD, "rollout-logits")
GEN = os.path.join(BUILD, "rollout-gen")
WORK = tempfile.mkdtemp(prefix="rd-famup-", dir=TMP)
FAMILIES = {"tiny-qwen2": "Qwen2ForCausalLM", "tiny-qwen3": "Qwen3ForCausalLM", "tiny-llama3": "LlamaForCausalLM",
            "tiny-gemma3": "Gemma3ForCausalLM"}
# 300 tokens: past the Llama 3 model's original context (64), so its scaled
# frequencies are exercised far from position 0.
PROMPT = np.random.default_rng(7).integers(3, 300, 300).tolist()
PROMPTS = [PROMPT[:9], PROMPT[:40], PROMPT]


def model(name):
    return os.path.join(DATA, name + ".gguf")


def logits(path, ids=PROMPT):
    out = os.path.join(WORK, "logits.f32")
    if os.path.exists(out):
        os.remove(out)
    run([LOGITS, "--model", path, "--prompt-ids", ",".join(map(str, ids)), "--out", out])
    a = np.fromfile(out, dtype="<f4")
    assert a.size == len(ids) * 300 and np.isfinite(a).all(), (path, a.size)
    return a


def rollouts(path):
    p = run([GEN, "--model", path, "--prompt-ids", ",".join(map(str, PROMPT[:50])), "--temperature", "1",
             "--seed", "5", "--max-tokens", "16", "-n", "3", "--json", "--ignore-eos"])
    return [json.loads(line) for line in p.stdout.splitlines() if line.startswith("{")]


def read_safetensors(path):
    with open(path, "rb") as f:
        raw = f.read()
    (n,) = struct.unpack("<Q", raw[:8])
    hdr = json.loads(raw[8:8 + n])
    return {k: np.frombuffer(raw[8 + n + v["data_offsets"][0]:8 + n + v["data_offsets"][1]],
                             dtype=np.float32).reshape(v["shape"])
            for k, v in hdr.items() if k != "__metadata__"}


def read_gguf_norm(path, name):
    return np.array(next(t.data for t in GGUFReader(path).tensors if t.name == name), dtype=np.float32)


_exports = {}


def export(name):
    if name not in _exports:
        out = os.path.join(WORK, "ex-" + name)
        run([EXPORT, "--model", model(name), "--out", out, "--dtype", "f32"])
        _exports[name] = out
    return _exports[name]


@case
def export_reload_is_bit_identical_for_every_family():
    for name, cls in FAMILIES.items():
        src = model(name)
        out = export(name)
        a, b = logits(src), logits(out)
        assert np.array_equal(a, b), f"{name}: export reload differs, max |diff| {np.abs(a - b).max()}"
        ra, rb = rollouts(src), rollouts(out)
        assert len(ra) == 3 and [r["token_ids"] for r in ra] == [r["token_ids"] for r in rb], name
        assert all(np.array_equal(np.float32(x["logprobs"]), np.float32(y["logprobs"])) for x, y in zip(ra, rb))
        again = os.path.join(WORK, "ex2-" + name)
        run([EXPORT, "--model", out, "--out", again, "--dtype", "f32"])
        with open(os.path.join(out, "model.safetensors"), "rb") as f1, \
                open(os.path.join(again, "model.safetensors"), "rb") as f2:
            assert f1.read() == f2.read(), f"{name}: re-export differs"
        cfg = json.load(open(os.path.join(out, "config.json")))
        assert cfg["architectures"] == [cls], cfg
        tensors = read_safetensors(os.path.join(out, "model.safetensors"))
        if name == "tiny-qwen2":
            assert tensors["model.layers.1.self_attn.k_proj.bias"].shape == (32,)
            assert "lm_head.weight" in tensors and not cfg["tie_word_embeddings"]
            assert cfg.get("use_sliding_window") is False
        if name == "tiny-qwen3":
            assert cfg["head_dim"] == 32 and cfg["hidden_size"] == 64
            assert tensors["model.layers.0.self_attn.q_proj.weight"].shape == (128, 64)
            assert tensors["model.layers.0.self_attn.o_proj.weight"].shape == (64, 128)
            assert tensors["model.layers.1.self_attn.q_norm.weight"].shape == (32,)
            assert not any(k.endswith(".bias") for k in tensors)
        if name == "tiny-gemma3":
            assert cfg["sliding_window"] == 8 and cfg["sliding_window_pattern"] == 6, cfg
            assert cfg["layer_types"][5] == "full_attention" and cfg["layer_types"][4] == "sliding_attention"
            # HF's w, not the GGUF's 1 + w
            g = read_gguf_norm(model(name), "blk.0.post_ffw_norm.weight")
            assert np.array_equal(tensors["model.layers.0.post_feedforward_layernorm.weight"], g - np.float32(1))
        if name == "tiny-llama3":
            rs = cfg["rope_scaling"]
            assert rs["rope_type"] == "llama3" and rs["factor"] == 8 and \
                rs["original_max_position_embeddings"] == 64, rs
            assert rs["low_freq_factor"] == 1 and rs["high_freq_factor"] == 4, rs


@case
def generator_hf_folder_loads_like_the_gguf():
    """The generator writes the GGUF's own values as an HF folder with its
    family config.json: loading it gives the GGUF's logits exactly."""
    for name in FAMILIES:
        a, b = logits(model(name)), logits(os.path.join(DATA, name + ".hf"))
        assert np.array_equal(a, b), f"{name}: HF folder differs, max |diff| {np.abs(a - b).max()}"


def greedy(c, prompts=PROMPTS):
    return c.generate(prompts, max_tokens=10, temperature=0.0, ignore_eos=True)


def seeded(c):
    return c.generate(PROMPTS[:2], n=2, max_tokens=10, temperature=1.0, seed=99, ignore_eos=True)


def same(a, b):
    return len(a) == len(b) and all(
        np.array_equal(x.token_ids, y.token_ids) and np.array_equal(x.logprobs.view(np.uint32),
                                                                    y.logprobs.view(np.uint32))
        for x, y in zip(a, b))


@case
def pushes_are_bit_identical_and_reach_every_family_tensor():
    for name in FAMILIES:
        d = Daemon(model=model(name))
        try:
            w = read_safetensors(os.path.join(export(name), "model.safetensors"))
            with Client(d.url) as c:
                base, base_s = greedy(c), seeded(c)
                r = c.push_weights(w, 1)
                assert r.version == 1 and r.lane, r
                assert same(base, greedy(c)) and same(base_s, seeded(c)), f"{name}: own weights changed outputs"
                # the family's own tensors, alone, by their HF names
                own = {k: v for k, v in w.items()
                       if k.endswith(".bias") or "q_norm" in k or "k_norm" in k} or \
                    {k: v for k, v in w.items() if k.endswith("input_layernorm.weight")}
                assert own, name
                changed = {k: (v * np.float32(1.5) + np.float32(0.25)).astype(np.float32) for k, v in own.items()}
                c.push_weights(changed, 2)
                assert not same(base, greedy(c)), f"{name}: pushing {sorted(changed)[:3]} changed nothing"
                c.push_weights(own, 3)
                assert same(base, greedy(c)), f"{name}: pushing the originals back did not restore the outputs"
                # refused pushes name the tensor and leave the weights serving
                bad = dict(own)
                k0 = sorted(bad)[0]
                bad[k0] = np.concatenate([bad[k0], np.zeros(2, np.float32)])
                try:
                    c.push_weights(bad, 4)
                    raise AssertionError(f"{name}: a {k0} of the wrong length was accepted")
                except DaemonError as e:
                    assert k0 in str(e) and "shape" in str(e), str(e)
                foreign = "model.layers.0.self_attn.q_norm.weight" if name not in ("tiny-qwen3", "tiny-gemma3") \
                    else "model.layers.0.self_attn.q_proj.bias"
                try:
                    c.push_weights({foreign: np.ones(32, np.float32)}, 4)
                    raise AssertionError(f"{name}: {foreign} was accepted")
                except DaemonError as e:
                    assert foreign in str(e) and "not a weight of this model" in str(e), str(e)
                assert same(base, greedy(c)) and c.status()["weight_version"] == 3
        finally:
            d.kill()


if __name__ == "__main__":
    main()
