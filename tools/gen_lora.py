#!/usr/bin/env python3
"""Writes a random LoRA adapter in PEFT's format for a GGUF model.

    tools/gen_lora.py --model M.gguf --out DIR [--rank 8] [--alpha 16]
        [--targets attention|mlp|all-linear|q_proj,v_proj|re:REGEX] [--rslora]
        [--dtype f32|f16|bf16] [--seed 0] [--layers 0,1]
        [--dora] [--modules-to-save] [--target lm_head|embed_tokens|NAME ...]

DIR gets adapter_config.json and adapter_model.safetensors, as PEFT's
save_pretrained writes them: tensors base_model.model.<module>.lora_A.weight
[r, in] and .lora_B.weight [out, r] for every module target_modules selects
(PEFT's matching: a list entry equal to the module's name or to a tail of it
after a '.', a regex string matching the whole name, "all-linear": every
linear but lm_head). Shapes come from the GGUF's tensors (ggml ne is [in,
out]), so the adapter fits the model; module names are the model's HF names
(model.layers.N.self_attn.q_proj, model.layers.N.mlp.experts.E.gate_proj).

--targets: attention (q, k, v, o as a list), mlp (gate, up, down), all-linear
(the string "all-linear", which PEFT also accepts), a comma list, or re:REGEX
(a regex string). --layers writes layers_to_transform. The variants rolloutd
refuses, for its tests: --dora (use_dora and lora_magnitude_vector tensors),
--modules-to-save (lm_head trained in full), --target NAME (one more target
module beside --targets, with its tensors where the model has it: lm_head
gets lora_A/lora_B, embed_tokens PEFT's lora_embedding_A/B; another name
only goes into target_modules).

Values: each tensor from its own stream (seed, name): A ~ N(0, 1/in),
B ~ N(0, 0.25/r) (PEFT starts B at zero; a test adapter must change the
output), rounded to --dtype. `adapter(...)` returns exactly the values the
file holds, as float32, for tests to compare against (tests/py/test_lora_load.py).
Only numpy and the gguf package: safetensors is a u64 little-endian header
length, the JSON header, then the raw data."""
import argparse
import json
import os
import re
import sys
import zlib

import numpy as np

ATTN = ["q_proj", "k_proj", "v_proj", "o_proj"]
MLP = ["gate_proj", "up_proj", "down_proj"]
# GGUF tensor -> HF module inside a layer (its ne is [in, out]; experts [in, out, n_expert]).
GGUF_TO_HF = {
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
    "ffn_gate_inp": "mlp.gate",
    "ffn_gate_exps": "mlp.experts.{e}.gate_proj",
    "ffn_up_exps": "mlp.experts.{e}.up_proj",
    "ffn_down_exps": "mlp.experts.{e}.down_proj",
}
ST_DTYPE = {"f32": "F32", "f16": "F16", "bf16": "BF16"}


def linear_modules(model_path):
    """{HF module name: (in, out)} for every linear of the model, plus
    (vocab, dim) for the embeddings and lm_head; and the layer count."""
    import gguf

    r = gguf.GGUFReader(model_path)
    mods = {}
    n_layers = 0
    vocab = dim = None
    for t in r.tensors:
        ne = [int(x) for x in t.shape]
        if t.name == "token_embd.weight":
            dim, vocab = ne[0], ne[1]
            continue
        m = re.fullmatch(r"blk\.(\d+)\.(\w+)\.weight", t.name)
        if not m or m.group(2) not in GGUF_TO_HF:
            continue
        layer, hf = int(m.group(1)), GGUF_TO_HF[m.group(2)]
        n_layers = max(n_layers, layer + 1)
        if "{e}" in hf:
            for e in range(ne[2]):
                mods[f"model.layers.{layer}." + hf.format(e=e)] = (ne[0], ne[1])
        else:
            mods[f"model.layers.{layer}.{hf}"] = (ne[0], ne[1])
    mods["model.embed_tokens"] = (vocab, dim)
    mods["lm_head"] = (dim, vocab)
    return mods, n_layers


def selects(targets, key):
    """PEFT's check_target_module_exists for target_modules (no layer filter)."""
    if isinstance(targets, str):
        if targets == "all-linear":
            return key not in ("lm_head", "model.embed_tokens")
        return re.fullmatch(targets, key) is not None
    return any(key == t or key.endswith("." + t) for t in targets)


def layer_of(key):
    m = re.match(r"model\.layers\.(\d+)\.", key)
    return int(m.group(1)) if m else None


def round_to(x, dtype):
    """float32 values as the file holds them in dtype (round to nearest even)."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    if dtype == "f16":
        return x.astype(np.float16).astype(np.float32)
    if dtype == "bf16":
        u = x.view(np.uint32).astype(np.uint64)
        u = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16) << 16
        return u.astype(np.uint32).view(np.float32)
    return x


def encode(x, dtype):
    x = round_to(x, dtype)
    if dtype == "f16":
        return x.astype("<f2").tobytes()
    if dtype == "bf16":
        return (x.view(np.uint32) >> 16).astype("<u2").tobytes()
    return x.astype("<f4").tobytes()


def stream(seed, name):
    return np.random.default_rng([seed, zlib.crc32(name.encode())])


def parse_targets(text):
    if text == "attention":
        return list(ATTN)
    if text == "mlp":
        return list(MLP)
    if text == "all-linear":
        return "all-linear"
    if text.startswith("re:"):
        return text[3:]
    return [t for t in text.split(",") if t]


def adapter(model_path, rank=8, alpha=16.0, targets="attention", rslora=False, dtype="f32", seed=0, layers=None,
            dora=False, modules_to_save=False, extra_targets=()):
    """(adapter_config dict, {tensor name: float32 array as stored}, {tensor name: dtype})."""
    mods, n_layers = linear_modules(model_path)
    tm = parse_targets(targets) if isinstance(targets, str) else list(targets)
    if extra_targets:
        if isinstance(tm, str):
            raise SystemExit("gen_lora: --target needs a list --targets, not a regex or all-linear")
        tm = tm + list(extra_targets)
    config = {
        "alpha_pattern": {},
        "auto_mapping": None,
        "base_model_name_or_path": os.path.basename(model_path),
        "bias": "none",
        "fan_in_fan_out": False,
        "inference_mode": True,
        "init_lora_weights": True,
        "layer_replication": None,
        "layers_pattern": None,
        "layers_to_transform": layers,
        "loftq_config": {},
        "lora_alpha": alpha,
        "lora_dropout": 0.05,
        "megatron_config": None,
        "megatron_core": "megatron.core",
        "modules_to_save": ["lm_head"] if modules_to_save else None,
        "peft_type": "LORA",
        "r": rank,
        "rank_pattern": {},
        "revision": None,
        "target_modules": tm,
        "task_type": "CAUSAL_LM",
        "use_dora": bool(dora),
        "use_rslora": bool(rslora),
    }
    tensors, dtypes = {}, {}

    def put(name, shape, std):
        tensors[name] = round_to(stream(seed, name).standard_normal(shape, dtype=np.float32) * np.float32(std), dtype)
        dtypes[name] = dtype

    for key, (fin, fout) in mods.items():
        if not selects(tm, key):
            continue
        if layers is not None:
            lay = layer_of(key)
            if lay is None or lay not in (layers if isinstance(layers, list) else [layers]):
                continue
        base = "base_model.model." + key
        if key == "model.embed_tokens":
            # PEFT's embedding LoRA: lora_embedding_A [r, vocab], lora_embedding_B [dim, r], no ".weight".
            put(base + ".lora_embedding_A", (rank, fin), 1.0)
            put(base + ".lora_embedding_B", (fout, rank), 0.5 / np.sqrt(rank))
            continue
        put(base + ".lora_A.weight", (rank, fin), 1.0 / np.sqrt(fin))
        put(base + ".lora_B.weight", (fout, rank), 0.5 / np.sqrt(rank))
        if dora:
            put(base + ".lora_magnitude_vector", (fout,), 1.0)
    if modules_to_save:
        fin, fout = mods["lm_head"]
        put("base_model.model.lm_head.weight", (fout, fin), 1.0 / np.sqrt(fin))
    if not tensors:
        raise SystemExit(f"gen_lora: target_modules {tm!r} select no module of {model_path} ({n_layers} layers)")
    return config, tensors, dtypes


def nudged(tensors, frac, seed):
    """bf16 tensors (uint16 bit patterns) with about frac of their elements moved by one unit in the last
    place (away from an all-ones mantissa): an optimizer step's worth of change, for delta pushes."""
    rng = np.random.default_rng(seed)
    out = {}
    for k, v in tensors.items():
        w = v.copy().reshape(-1)
        idx = rng.choice(w.size, max(1, int(w.size * frac)), replace=False)
        w[idx] = w[idx] + np.where(w[idx] & 0x7F == 0x7F, -1, 1).astype(np.uint16)
        out[k] = w.reshape(v.shape)
    return out


def write_safetensors(path, tensors, dtypes):
    header, blobs, off = {"__metadata__": {"format": "pt"}}, [], 0
    for name, x in tensors.items():
        b = encode(x, dtypes[name])
        header[name] = {"dtype": ST_DTYPE[dtypes[name]], "shape": list(x.shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)   # the data starts 8-aligned, as the reference writer pads it
    tmp = path + ".partial"
    with open(tmp, "wb") as f:
        f.write(len(h).to_bytes(8, "little"))
        f.write(h)
        for b in blobs:
            f.write(b)
    os.replace(tmp, path)


def write(out, config, tensors, dtypes):
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "adapter_config.json"), "w") as f:
        json.dump(config, f, indent=2, sort_keys=True)
        f.write("\n")
    write_safetensors(os.path.join(out, "adapter_model.safetensors"), tensors, dtypes)


def parse_layers(text):
    v = [int(x) for x in text.split(",") if x != ""]
    return v[0] if len(v) == 1 else v


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True, help="the GGUF model the adapter is for")
    p.add_argument("--out", required=True, help="the adapter folder to write")
    p.add_argument("--rank", type=int, default=8)
    p.add_argument("--alpha", type=float, default=16.0)
    p.add_argument("--targets", default="attention",
                   help="attention, mlp, all-linear, a comma list of module names, or re:REGEX")
    p.add_argument("--rslora", action="store_true")
    p.add_argument("--dtype", choices=sorted(ST_DTYPE), default="f32")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--layers", type=parse_layers, default=None, help="layers_to_transform: N or N,M,...")
    p.add_argument("--dora", action="store_true", help="write a DoRA adapter (refused by rolloutd)")
    p.add_argument("--modules-to-save", action="store_true", help="save lm_head in full (refused by rolloutd)")
    p.add_argument("--target", action="append", default=[],
                   help="one more target module (lm_head, embed_tokens, any name); repeatable")
    a = p.parse_args(argv)
    if a.rank < 1:
        p.error("--rank must be >= 1")
    config, tensors, dtypes = adapter(a.model, a.rank, a.alpha, a.targets, a.rslora, a.dtype, a.seed, a.layers,
                                      a.dora, a.modules_to_save, a.target)
    write(a.out, config, tensors, dtypes)
    print(f"gen_lora: wrote {a.out} ({len(tensors)} tensors, rank {a.rank})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
