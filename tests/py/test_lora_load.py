"""LoRA adapters in PEFT's format (engine/model/lora.h) through rollout-lora-info: adapters written
by tools/gen_lora.py for every tiny family (and the default model when it is there) load with
every A and B equal, value for value, to what the generator computed from its seed; rank, alpha,
scale (rsLoRA too), bytes and each module's in/out are the model's; and the variants rolloutd
refuses (DoRA, modules_to_save, LoRA on lm_head or embed_tokens, MoE experts, a rank over
--max-rank) exit 1 with a message naming the problem."""
import json
import os
import shutil
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import BUILD, MODEL, ROOT, TMP, Skip, case, main, run  # noqa: E402

sys.path.insert(0, os.path.join(ROOT, "tools"))
import gen_lora  # noqa: E402

INFO = os.path.join(BUILD, "rollout-lora-info")
DATA = os.path.join(ROOT, os.environ.get("RD_TESTDATA", "build/testdata"))
WORK = os.path.join(TMP, "test_lora_load")
DTYPE_BYTES = {"f32": 4, "f16": 2, "bf16": 2}
MODULE_OF = {"q_proj": "self_attn.q_proj", "k_proj": "self_attn.k_proj", "v_proj": "self_attn.v_proj",
             "o_proj": "self_attn.o_proj", "gate_proj": "mlp.gate_proj", "up_proj": "mlp.up_proj",
             "down_proj": "mlp.down_proj"}


def model(name):
    path = os.path.join(DATA, name + ".gguf")
    if not os.path.exists(path):
        raise AssertionError(f"{path} is missing (run tests/gen_testdata.sh)")
    return path


def make(model_path, name, **kw):
    """Writes an adapter with gen_lora's own functions; returns (dir, config, tensors)."""
    out = os.path.join(WORK, name)
    shutil.rmtree(out, ignore_errors=True)
    config, tensors, dtypes = gen_lora.adapter(model_path, **kw)
    gen_lora.write(out, config, tensors, dtypes)
    return out, config, tensors


def info(model_path, adapter, max_rank=64, dump=None, check=True):
    args = [INFO, "--model", model_path, "--adapter", adapter, "--max-rank", str(max_rank)]
    if dump:
        shutil.rmtree(dump, ignore_errors=True)
        os.makedirs(dump)
        args += ["--dump", dump]
    return run(args, check=check)


def check_loaded(model_path, name, **kw):
    """Generates, loads and compares everything rollout-lora-info reports."""
    out, config, tensors = make(model_path, name, **kw)
    dump = out + ".dump"
    got = json.loads(info(model_path, out, dump=dump).stdout)
    rank, alpha = kw.get("rank", 8), kw.get("alpha", 16.0)
    rslora, dtype = kw.get("rslora", False), kw.get("dtype", "f32")
    want_scale = np.float32(alpha / np.sqrt(rank) if rslora else alpha / rank)
    assert got["name"] == name and got["rank"] == rank and got["alpha"] == alpha, got
    assert got["rslora"] == rslora and np.float32(got["scale"]) == want_scale, (got["scale"], want_scale)
    mods, _ = gen_lora.linear_modules(model_path)
    n_pairs = 0
    nbytes = 0
    for p in got["pairs"]:
        key = f"base_model.model.model.layers.{p['layer']}.{MODULE_OF[p['module']]}"
        a, b = tensors.pop(key + ".lora_A.weight"), tensors.pop(key + ".lora_B.weight")
        fin, fout = mods[key[len("base_model.model."):]]
        io = got["modules"][p["module"]]
        assert (io["in"], io["out"]) == (fin, fout), (p, io, fin, fout)
        assert a.shape == (rank, fin) and b.shape == (fout, rank), (key, a.shape, b.shape)
        assert p["a_dtype"] == p["b_dtype"] == gen_lora.ST_DTYPE[dtype], p
        stem = os.path.join(dump, f"{p['layer']}.{p['module']}")
        ga = np.fromfile(stem + ".A.f32", dtype="<f4").reshape(a.shape)
        gb = np.fromfile(stem + ".B.f32", dtype="<f4").reshape(b.shape)
        # Bit for bit: the stored dtype's values, converted exactly.
        assert np.array_equal(ga.view(np.uint32), a.view(np.uint32)), f"{key} A differs"
        assert np.array_equal(gb.view(np.uint32), b.view(np.uint32)), f"{key} B differs"
        n_pairs += 1
        nbytes += (a.size + b.size) * DTYPE_BYTES[dtype]
    assert not tensors, f"tensors the loader did not report: {sorted(tensors)[:4]}"
    assert got["n_pairs"] == n_pairs and got["bytes"] == nbytes, (got["n_pairs"], n_pairs, got["bytes"], nbytes)
    return got


@case
def every_family_rank_8_and_64_attention_and_all_linear():
    os.makedirs(WORK, exist_ok=True)
    dense = ["tiny-f32", "tiny-qwen2", "tiny-qwen3", "tiny-llama3", "tiny-gemma3"]
    for i, m in enumerate(dense):
        path = model(m)
        got = check_loaded(path, f"{m}-r8-attn", rank=8, alpha=16.0, targets="attention", dtype="f32", seed=i)
        assert set(got["modules"]) == {"q_proj", "k_proj", "v_proj", "o_proj"}, got["modules"]
        got = check_loaded(path, f"{m}-r64-all", rank=64, alpha=32.0, targets="all-linear", dtype="bf16",
                           seed=10 + i)
        assert len(got["modules"]) == 7, got["modules"]
    moe = model("tiny-moe-f32")
    got = check_loaded(moe, "moe-r8-attn", rank=8, alpha=8.0, targets="attention", dtype="f16", seed=30)
    got = check_loaded(moe, "moe-r64-attn", rank=64, alpha=64.0, targets="attention", dtype="bf16", seed=31)
    assert got["n_pairs"] == 4 * got["n_layers"], got


@case
def rslora_regex_lists_and_layers_to_transform():
    q3 = model("tiny-qwen3")
    got = check_loaded(q3, "rs", rank=16, alpha=16.0, rslora=True, targets="attention", dtype="f16", seed=40)
    assert abs(got["scale"] - 4.0) < 1e-6, got["scale"]
    check_loaded(q3, "regex", rank=8, targets=r"re:model\.layers\.\d+\.(self_attn\.[qv]_proj|mlp\.down_proj)",
                 dtype="bf16", seed=41)
    got = check_loaded(q3, "mlp-list", rank=4, targets="gate_proj,up_proj,down_proj", seed=42)
    assert set(got["modules"]) == {"gate_proj", "up_proj", "down_proj"}, got["modules"]
    got = check_loaded(q3, "one-layer", rank=8, targets="attention", layers=1, seed=43)
    assert {p["layer"] for p in got["pairs"]} == {1} and got["n_pairs"] == 4, got["pairs"]
    gemma = model("tiny-gemma3")   # 6 layers
    got = check_loaded(gemma, "layers-0-5", rank=8, targets="q_proj,o_proj", layers=[0, 5], seed=44)
    assert {p["layer"] for p in got["pairs"]} == {0, 5} and got["n_pairs"] == 4, got["pairs"]


@case
def default_model_rank_32():
    if not os.path.exists(MODEL):
        raise Skip(f"{MODEL} is missing (make model)")
    got = check_loaded(MODEL, "smollm2-r32", rank=32, alpha=64.0, targets="all-linear", dtype="bf16", seed=50)
    assert got["n_pairs"] == 7 * got["n_layers"] and got["modules"]["q_proj"] == {"in": 576, "out": 576}, got


def refused(model_path, name, needle, max_rank=64, **kw):
    out, _, _ = make(model_path, name, **kw)
    p = info(model_path, out, max_rank=max_rank, check=False)
    assert p.returncode == 1 and not p.stdout, (p.returncode, p.stdout[:200])
    assert needle in p.stderr and f"'{out}'" in p.stderr, p.stderr


@case
def refused_variants_name_the_problem():
    f32, moe = model("tiny-f32"), model("tiny-moe-f32")
    refused(f32, "dora", '"use_dora" is true: DoRA adapters', dora=True)
    refused(f32, "mts", '"modules_to_save" is ["lm_head"]', modules_to_save=True)
    refused(f32, "lm-head", "target_modules selects lm_head: LoRA on the LM head", extra_targets=["lm_head"])
    refused(f32, "embed", "selects model.embed_tokens: LoRA on the token embeddings",
            extra_targets=["embed_tokens"])
    refused(f32, "unknown", "target_modules names 'qkv_proj', which is no linear module of this llama model",
            extra_targets=["qkv_proj"])
    refused(moe, "moe-all", "selects model.layers.0.mlp.experts.0.gate_proj: LoRA on the MoE experts",
            targets="all-linear")
    refused(moe, "moe-mlp", "LoRA on the MoE experts is not supported", targets="mlp")
    refused(moe, "moe-router", "selects model.layers.0.mlp.gate: LoRA on the MoE router", targets="gate")
    refused(f32, "r128", "rank r = 128 is above the maximum LoRA rank 64", rank=128)
    refused(f32, "r16", "rank r = 16 is above the maximum LoRA rank 8", max_rank=8, rank=16)
    # An adapter for another model: qwen3's q_proj is 128 wide, tiny-f32's 64.
    out, _, _ = make(model("tiny-qwen3"), "other-model", targets="attention")
    p = info(f32, out, check=False)
    assert p.returncode == 1 and "has shape [128, 8]; expected [64, 8]" in p.stderr, p.stderr


if __name__ == "__main__":
    if not os.path.exists(INFO):
        print(f"FAIL setup: {INFO} is missing (make)")
        sys.exit(1)
    main()
