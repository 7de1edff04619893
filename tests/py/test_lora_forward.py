"""LoRA adapters computed unmerged by the engine (y = W x + s B (A x), engine/model/runner.c) against
an independent float64 NumPy reference of the merged weights W + s B A (ref_llama.py, ref_moe.py).

For each tiny family (llama, Llama 3, qwen2, qwen3, gemma3 and Qwen3-MoE's attention), random
PEFT adapters written by tools/gen_lora.py (rank 8 attention-only, rank 64 all-linear, rsLoRA, f16
and bf16 tensors) run through build/rollout-logits --lora; every position's logits must be within
1e-4 of the reference, while the reference without the adapter is far from them (the adapter is
not a no-op). On the default model (SmolLM2, Q4_1), the unmerged adapter's greedy choice at each
position equals rolloutd's on an F32 copy of the model with the adapter merged in, wherever the
merged top-2 margin is clear."""
import os
import shutil
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import BUILD, MODEL, ROOT, TMP, Skip, case, main, run  # noqa: E402
import ref_llama  # noqa: E402
import ref_moe  # noqa: E402

sys.path.insert(0, os.path.join(ROOT, "tools"))
import gen_lora  # noqa: E402

LOGITS = os.path.join(BUILD, "rollout-logits")
DATA = os.path.join(ROOT, os.environ.get("RD_TESTDATA", "build/testdata"))
WORK = os.path.join(TMP, "test_lora_forward")
TOL = 1e-4
REF_KEY = {"q_proj": "wq", "k_proj": "wk", "v_proj": "wv", "o_proj": "wo", "gate_proj": "w_gate",
           "up_proj": "w_up", "down_proj": "w_down"}
GGUF_OF = {"q_proj": "attn_q", "k_proj": "attn_k", "v_proj": "attn_v", "o_proj": "attn_output",
           "gate_proj": "ffn_gate", "up_proj": "ffn_up", "down_proj": "ffn_down"}


def model(name):
    path = os.path.join(DATA, name + ".gguf")
    if not os.path.exists(path):
        raise AssertionError(f"{path} is missing (run tests/gen_testdata.sh)")
    return path


def make(model_path, name, **kw):
    out = os.path.join(WORK, name)
    shutil.rmtree(out, ignore_errors=True)
    config, tensors, dtypes = gen_lora.adapter(model_path, **kw)
    gen_lora.write(out, config, tensors, dtypes)
    return out, config, tensors


def deltas(config, tensors):
    """{(layer, module): s * B @ A} in float64 from the values the file holds."""
    r, alpha = config["r"], config["lora_alpha"]
    s = alpha / np.sqrt(r) if config.get("use_rslora") else alpha / r
    out = {}
    for name, a in tensors.items():
        if not name.endswith(".lora_A.weight"):
            continue
        module = name[len("base_model.model."):-len(".lora_A.weight")]   # model.layers.3.self_attn.q_proj
        parts = module.split(".")
        b = tensors[name.replace(".lora_A.", ".lora_B.")]
        out[(int(parts[2]), parts[-1])] = s * (b.astype(np.float64) @ a.astype(np.float64))
    return out


def engine_logits(model_path, ids, lora_dir=None):
    out = os.path.join(WORK, "logits.bin")
    args = [LOGITS, "--model", model_path, "--prompt-ids", ",".join(map(str, ids)), "--out", out]
    if lora_dir:
        args += ["--lora", lora_dir]
    run(args)
    return np.fromfile(out, dtype="<f4").reshape(len(ids), -1)


def check_family(name, variants, moe=False):
    path = model(name)
    ref = ref_moe if moe else ref_llama
    base = ref.load(path)
    rng = np.random.default_rng(7)
    ids = [int(x) for x in rng.integers(1, base.cfg.vocab, 40)]   # 40 positions span three KV blocks
    ref_base = ref.logits(base, ids)
    for i, kw in enumerate(variants):
        d, config, tensors = make(path, f"{name}-{i}", seed=100 + i, **kw)
        merged = ref.load(path)
        for (layer, module), delta in deltas(config, tensors).items():
            L = merged.layers[layer]
            L[REF_KEY[module]] = L[REF_KEY[module]] + delta
        want = ref.logits(merged, ids)
        got = engine_logits(path, ids, d)
        err = float(np.abs(got - want).max())
        moved = float(np.abs(ref_base - want).max())
        assert err < TOL, f"{name} {kw}: max |engine - reference of W + sBA| = {err:.3g} (tolerance {TOL})"
        assert moved > 100 * TOL, f"{name} {kw}: the adapter moves the logits by only {moved:.3g}"


ALL = [dict(rank=8, targets="attention"),
       dict(rank=64, targets="all-linear", alpha=32.0),
       dict(rank=16, targets="q_proj,v_proj,down_proj", rslora=True, dtype="f16"),
       dict(rank=8, targets="all-linear", dtype="bf16", layers=[1])]
ATTN = [dict(rank=8, targets="attention"),
        dict(rank=64, targets="attention", rslora=True, dtype="bf16")]


@case
def llama_adapters_match_merged_reference():
    check_family("tiny-f32", ALL)


@case
def llama3_adapters_match_merged_reference():
    check_family("tiny-llama3", ALL[:2])


@case
def qwen2_adapters_match_merged_reference():
    check_family("tiny-qwen2", ALL[:3])


@case
def qwen3_adapters_match_merged_reference():
    check_family("tiny-qwen3", ALL)


@case
def gemma3_adapters_match_merged_reference():
    check_family("tiny-gemma3", ALL[:3])


@case
def qwen3moe_attention_adapters_match_merged_reference():
    check_family("tiny-moe-f32", ATTN, moe=True)


def permute(w, n_head):
    """convert_hf_to_gguf's LlamaModel.permute (ref_llama.unpermute's inverse): HF rows to llama.cpp's."""
    rows, cols = w.shape
    return w.reshape(n_head, 2, rows // n_head // 2, cols).swapaxes(1, 2).reshape(rows, cols)


def merged_f32_copy(src, dst, delta):
    """src with every tensor dequantized to F32 and the adapter's deltas added (in GGUF row order)."""
    import gguf
    r = gguf.GGUFReader(src)
    n_head = int(ref_llama._field(r, "llama.attention.head_count"))
    n_head_kv = int(ref_llama._field(r, "llama.attention.head_count_kv", n_head))
    by_name = {f"blk.{layer}.{GGUF_OF[m]}.weight": (m, d) for (layer, m), d in delta.items()}
    w = gguf.GGUFWriter(dst, arch=ref_llama._field(r, "general.architecture"))
    for f in r.fields.values():
        if f.name == "general.architecture" or f.name.startswith("GGUF."):
            continue
        vt = f.types[0]
        st = f.types[-1] if vt == gguf.GGUFValueType.ARRAY else None
        w.add_key_value(f.name, 0 if f.name == "general.file_type" else f.contents(), vt, sub_type=st)
    for t in r.tensors:
        shape = tuple(int(x) for x in reversed(t.shape.tolist()))
        a = np.asarray(gguf.quants.dequantize(t.data, t.tensor_type), dtype=np.float64).reshape(shape)
        if t.name in by_name:
            m, d = by_name[t.name]
            if m in ("q_proj", "k_proj"):
                d = permute(d, n_head if m == "q_proj" else n_head_kv)
            a = a + d
        w.add_tensor(t.name, np.ascontiguousarray(a, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


@case
def default_model_adapter_greedy_equals_merged():
    if not os.path.exists(MODEL):
        raise Skip(f"{MODEL} is not here (make model)")
    rng = np.random.default_rng(3)
    ids = [int(x) for x in rng.integers(100, 40000, 48)]
    for i, kw in enumerate([dict(rank=8, targets="attention", alpha=64.0),
                            dict(rank=64, targets="all-linear", alpha=64.0, dtype="bf16")]):
        d, config, tensors = make(MODEL, f"default-{i}", seed=200 + i, **kw)
        merged = os.path.join(WORK, "merged.gguf")
        merged_f32_copy(MODEL, merged, deltas(config, tensors))
        got = engine_logits(MODEL, ids, d)
        want = engine_logits(merged, ids)
        base = engine_logits(MODEL, ids)
        top2 = np.sort(want, axis=1)[:, -2:]
        clear = (top2[:, 1] - top2[:, 0]) > 0.05
        agree = got.argmax(1) == want.argmax(1)
        assert clear.sum() >= len(ids) // 2, f"only {clear.sum()} of {len(ids)} positions have a clear margin"
        assert agree[clear].all(), f"{kw}: greedy differs from the merged model at {np.where(clear & ~agree)[0]}"
        changed = (base.argmax(1) != want.argmax(1)).sum()
        assert changed > 0, f"{kw}: the adapter changes no greedy choice; the check shows nothing"
        # The quantized base and its F32 copy hold the same values: the logits differ by rounding only
        # (3.8e-4 measured), well inside the margin asked for above.
        assert float(np.abs(got - want).max()) < 0.01, float(np.abs(got - want).max())


if __name__ == "__main__":
    os.makedirs(WORK, exist_ok=True)
    main()
