#!/usr/bin/env python3
"""Writes a tiny random Qwen3-MoE (llama.cpp arch `qwen3moe`, HF
Qwen3MoeForCausalLM) as a GGUF and as a Hugging Face folder.

The model: Qwen3 attention (explicit head_dim, per-head q_norm/k_norm before
NEOX RoPE, no biases) and in every layer a mixture of experts: a router
[n_expert, dim] (kept F32 in every file, as convert_hf_to_gguf.py and
llama-quantize keep ffn_gate_inp.weight), softmax, top k, weights
renormalized, k SwiGLU experts of size ffn_exp, no shared expert; untied
lm_head (as Qwen3-30B-A3B).

GGUF (what llama.cpp's converter writes for Qwen3MoeForCausalLM):
  keys   qwen3moe.{context_length, embedding_length, block_count,
         feed_forward_length (HF intermediate_size: the dense size, unused by
         MoE layers; deliberately != expert_feed_forward_length),
         attention.head_count(_kv), attention.key_length/value_length,
         attention.layer_norm_rms_epsilon, rope.freq_base, expert_count,
         expert_used_count, expert_feed_forward_length}; the tokenizer of
         tools/gen_tiny_model.py (GPT-2 BPE, pre "qwen2").
  tensors token_embd, output_norm, output; blk.N.{attn_norm, attn_q, attn_k,
         attn_v, attn_output, attn_q_norm, attn_k_norm, ffn_norm,
         ffn_gate_inp (ne [dim, n_expert]), ffn_gate_exps / ffn_up_exps
         (ne [dim, ffn_exp, n_expert]), ffn_down_exps (ne [ffn_exp, dim,
         n_expert])}. Expert e's slice of a 3-D tensor is rows
         e*rows..(e+1)*rows-1 of the tensor read as 2-D (ne0 contiguous),
         i.e. numpy [n_expert, rows, cols] = HF experts.e.*_proj.weight.
dtypes: f32, f16, bf16, q8_0 (every 2-D/3-D weight but the router in that
dtype; 1-D norms F32), and q4_k_m: a llama-quantize Q4_K_M-like mix (Q4_K for
token_embd, attn_q/k/output, ffn_{gate,up}_exps; Q6_K for attn_v,
ffn_down_exps, output), which needs the K shape (rows multiples of 256:
KSHAPE). The quantizers are tools/gen_tiny_model.py's (ggml's reference ones
for q8_0; its own min/max ones for the K-quants: the gguf package 0.19 cannot
quantize K-quants, only dequantize them).

HF folder (config.json + model.safetensors, F32, or BF16 for dtype bf16): the
GGUF's dequantized values (gguf.quants.dequantize) under HF names, one tensor
per expert (model.layers.N.mlp.experts.E.{gate,up,down}_proj.weight) and the
router model.layers.N.mlp.gate.weight; config.json has norm_topk_prob (True
unless asked otherwise), decoder_sparse_step 1, mlp_only_layers []. No
tokenizer files (the existing tiny HF fixtures have none either).

Weights: each tensor from its own stream (seed, name), HF layout, float32.
Projections and experts N(0, 1/fan_in); embeddings and lm_head 2/sqrt(dim);
norms 1 + 0.1 N (q/k norms 1 + 0.3 N); the router ROUTER_STD/sqrt(dim), so
that the router logits of an RMS-normed row have a spread of ~ROUTER_STD and
the probabilities spread (not uniform, not one-hot).

    python3 tests/py/moe_model.py OUT_DIR [--dtype f32 ...] [--seed N] [--name NAME]
    from moe_model import write_tiny_moe
    gguf_path, hf_dir = write_tiny_moe("build/testdata", dtype="q8_0", seed=41)
"""
import argparse
import json
import os
import sys
import zlib

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "tools"))
import gen_tiny_model as gtm  # noqa: E402  (tokenizer, quantizers, safetensors writer)
import gen_moe_model as gmm  # noqa: E402  (the qwen3moe GGUF keys)

import gguf  # noqa: E402
from gguf import GGMLQuantizationType as QT  # noqa: E402
sys.path.insert(0, HERE)
from gguf_fast import GGUFReader  # noqa: E402  (the package's reader, its arrays read in one pass)

ARCH = "qwen3moe"
ROUTER_STD = 2.0
# Small shape (32-element blocks: f32, f16, bf16, q8_0): q width 4 x 32 = 128 over hidden 64.
SHAPE = dict(layers=3, dim=64, heads=4, kv_heads=2, head_dim=32, ffn=96, n_expert=16, k=4, ffn_exp=32,
             vocab=300, ctx=1024, theta=1e6, eps=1e-6)
# K-quant shape: every row (ne0) a multiple of 256.
KSHAPE = dict(SHAPE, layers=2, dim=256, heads=4, kv_heads=2, head_dim=64, ffn=768, ffn_exp=256)
DTYPES = ("f32", "f16", "bf16", "q8_0", "q4_k_m")
FILE_TYPES = {"f32": 0, "f16": 1, "q8_0": 7, "bf16": 32, "q4_k_m": 15}    # llama_ftype
QTYPES = {"f32": QT.F32, "f16": QT.F16, "bf16": QT.BF16, "q8_0": QT.Q8_0, "q4_k": QT.Q4_K, "q6_k": QT.Q6_K}
Q4_K_M = {"attn_v": "q6_k", "ffn_down_exps": "q6_k", "output": "q6_k"}   # the rest q4_k


def shape_for(dtype):
    return KSHAPE if dtype == "q4_k_m" else SHAPE


def tensor_dtype(gname, dtype):
    """The dtype a tensor is stored in (1-D norms and the router: f32)."""
    short = gname.split(".")[-2] if gname.startswith("blk.") else gname.split(".")[0]
    if short.endswith("_norm") or short == "ffn_gate_inp":
        return "f32"
    if dtype == "q4_k_m":
        return Q4_K_M.get(short, "q4_k")
    return dtype


def make_weights(s, seed):
    """HF state_dict (float32): {name: array}. Each tensor from its own stream."""
    def rng(name):
        return np.random.default_rng([seed, 0x3E0E, zlib.crc32(name.encode())])

    def lin(name, *shape):
        return (rng(name).standard_normal(shape) / np.sqrt(shape[-1])).astype(np.float32)

    def norm(name, n, spread=0.1):
        return (1.0 + spread * rng(name).standard_normal(n)).astype(np.float32)

    d, hd, E, F = s["dim"], s["head_dim"], s["n_expert"], s["ffn_exp"]
    w = {"model.embed_tokens.weight":
         (rng("embed").standard_normal((s["vocab"], d)) * 2 / np.sqrt(d)).astype(np.float32)}
    for i in range(s["layers"]):
        p = f"model.layers.{i}."
        w[p + "input_layernorm.weight"] = norm(p + "in", d)
        w[p + "self_attn.q_proj.weight"] = lin(p + "q", s["heads"] * hd, d)
        w[p + "self_attn.k_proj.weight"] = lin(p + "k", s["kv_heads"] * hd, d)
        w[p + "self_attn.v_proj.weight"] = lin(p + "v", s["kv_heads"] * hd, d)
        w[p + "self_attn.o_proj.weight"] = lin(p + "o", d, s["heads"] * hd)
        w[p + "self_attn.q_norm.weight"] = norm(p + "qn", hd, 0.3)
        w[p + "self_attn.k_norm.weight"] = norm(p + "kn", hd, 0.3)
        w[p + "post_attention_layernorm.weight"] = norm(p + "post", d)
        w[p + "mlp.gate.weight"] = (rng(p + "router").standard_normal((E, d)) * ROUTER_STD / np.sqrt(d)).astype(
            np.float32)
        gate, up, down = lin(p + "gate", E, F, d), lin(p + "up", E, F, d), lin(p + "down", E, d, F)
        for e in range(E):
            q = f"{p}mlp.experts.{e}."
            w[q + "gate_proj.weight"] = gate[e]
            w[q + "up_proj.weight"] = up[e]
            w[q + "down_proj.weight"] = down[e]
    w["model.norm.weight"] = norm("norm", d)
    w["lm_head.weight"] = (rng("lm_head").standard_normal((s["vocab"], d)) * 2 / np.sqrt(d)).astype(np.float32)
    return w


def gguf_tensors(s, hf):
    """[(gguf name, array in numpy order: 2-D [out, in], 3-D [n_expert, out, in])], converter order."""
    E = s["n_expert"]
    out = [("token_embd.weight", hf["model.embed_tokens.weight"])]
    for i in range(s["layers"]):
        p, b = f"model.layers.{i}.", f"blk.{i}."
        out += [(b + "attn_norm.weight", hf[p + "input_layernorm.weight"]),
                (b + "attn_q.weight", hf[p + "self_attn.q_proj.weight"]),
                (b + "attn_k.weight", hf[p + "self_attn.k_proj.weight"]),
                (b + "attn_v.weight", hf[p + "self_attn.v_proj.weight"]),
                (b + "attn_output.weight", hf[p + "self_attn.o_proj.weight"]),
                (b + "attn_q_norm.weight", hf[p + "self_attn.q_norm.weight"]),
                (b + "attn_k_norm.weight", hf[p + "self_attn.k_norm.weight"]),
                (b + "ffn_norm.weight", hf[p + "post_attention_layernorm.weight"]),
                (b + "ffn_gate_inp.weight", hf[p + "mlp.gate.weight"])]
        for g, h in (("ffn_gate_exps", "gate_proj"), ("ffn_up_exps", "up_proj"), ("ffn_down_exps", "down_proj")):
            out.append((b + g + ".weight", np.stack([hf[f"{p}mlp.experts.{e}.{h}.weight"] for e in range(E)])))
    out += [("output_norm.weight", hf["model.norm.weight"]), ("output.weight", hf["lm_head.weight"])]
    return out


def encode(arr, dt):
    """(array for GGUFWriter.add_tensor, raw_dtype or None): 3-D tensors are
    quantized as their 2-D view (rows of ne0), then shaped [n_expert, rows, bytes]."""
    if dt == "f32":
        return np.ascontiguousarray(arr, dtype=np.float32), None
    if dt == "f16":
        return np.ascontiguousarray(arr, dtype=np.float32).astype(np.float16), None
    flat = arr.reshape(-1, arr.shape[-1])
    data, qt = gtm.encode(flat, dt)
    return data.reshape(arr.shape[:-1] + (data.shape[-1],)), qt


def hf_config(s, dtype, norm_topk_prob):
    return {
        "architectures": ["Qwen3MoeForCausalLM"],
        "model_type": "qwen3_moe",
        "hidden_size": s["dim"],
        "intermediate_size": s["ffn"],
        "moe_intermediate_size": s["ffn_exp"],
        "num_experts": s["n_expert"],
        "num_experts_per_tok": s["k"],
        "norm_topk_prob": norm_topk_prob,
        "decoder_sparse_step": 1,
        "mlp_only_layers": [],
        "num_attention_heads": s["heads"],
        "num_key_value_heads": s["kv_heads"],
        "head_dim": s["head_dim"],
        "num_hidden_layers": s["layers"],
        "vocab_size": s["vocab"],
        "max_position_embeddings": s["ctx"],
        "rms_norm_eps": s["eps"],
        "rope_theta": s["theta"],
        "rope_scaling": None,
        "tie_word_embeddings": False,
        "hidden_act": "silu",
        "attention_bias": False,
        "attention_dropout": 0.0,
        "use_sliding_window": False,
        "sliding_window": None,
        "max_window_layers": s["layers"],
        "output_router_logits": False,
        "router_aux_loss_coef": 0.001,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "torch_dtype": "bfloat16" if dtype == "bf16" else "float32",
    }


def write_tiny_moe(out_dir, dtype="f32", seed=41, name=None, hf=True, norm_topk_prob=True):
    """Writes OUT_DIR/NAME.gguf (and OUT_DIR/NAME.hf/ when hf) and returns
    (gguf path, hf folder or None). NAME defaults to tiny-moe-<dtype>.
    norm_topk_prob only goes into config.json (llama.cpp always renormalizes)."""
    if dtype not in DTYPES:
        raise ValueError(f"dtype {dtype!r}: expected one of {DTYPES}")
    s = shape_for(dtype)
    name = name or f"tiny-moe-{dtype}"
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, name + ".gguf")
    hf_w = make_weights(s, seed)
    if dtype == "bf16":            # every weight bf16-exact, so the folder can hold BF16
        hf_w = {k: gtm.bf16_round(v) for k, v in hf_w.items()}
    tokens, merges = gtm.train_bpe(s["vocab"])

    w = gguf.GGUFWriter(path + ".part", arch=ARCH)
    w.add_name(f"tiny-qwen3moe-{dtype}")
    w.add_file_type(FILE_TYPES[dtype])
    gmm.add_metadata(w, s, s["layers"], tokens, merges)
    tensors = gguf_tensors(s, hf_w)
    for gname, arr in tensors:
        data, qt = encode(arr, tensor_dtype(gname, dtype))
        w.add_tensor(gname, data, raw_dtype=qt)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    os.replace(path + ".part", path)

    hf_dir = None
    if hf:
        hf_dir = os.path.join(out_dir, name + ".hf")
        write_hf(path, hf_dir, s, dtype, norm_topk_prob)
    return path, hf_dir


def write_hf(gguf_path, hf_dir, s, dtype, norm_topk_prob=True):
    """The folder with the GGUF's dequantized values (read back with the gguf package)."""
    r = GGUFReader(gguf_path)
    g = {}
    for t in r.tensors:
        shape = tuple(int(d) for d in reversed(t.shape.tolist()))
        g[t.name] = np.asarray(gguf.quants.dequantize(t.data, t.tensor_type), dtype=np.float32).reshape(shape)
    st = {"model.embed_tokens.weight": g["token_embd.weight"]}
    for i in range(s["layers"]):
        p, b = f"model.layers.{i}.", f"blk.{i}."
        for gn, hn in (("attn_norm", "input_layernorm"), ("attn_q", "self_attn.q_proj"),
                       ("attn_k", "self_attn.k_proj"), ("attn_v", "self_attn.v_proj"),
                       ("attn_output", "self_attn.o_proj"), ("attn_q_norm", "self_attn.q_norm"),
                       ("attn_k_norm", "self_attn.k_norm"), ("ffn_norm", "post_attention_layernorm"),
                       ("ffn_gate_inp", "mlp.gate")):
            st[f"{p}{hn}.weight"] = g[f"{b}{gn}.weight"]
        for e in range(s["n_expert"]):
            for gn, hn in (("ffn_gate_exps", "gate_proj"), ("ffn_up_exps", "up_proj"),
                           ("ffn_down_exps", "down_proj")):
                st[f"{p}mlp.experts.{e}.{hn}.weight"] = g[f"{b}{gn}.weight"][e]
    st["model.norm.weight"] = g["output_norm.weight"]
    st["lm_head.weight"] = g["output.weight"]
    os.makedirs(hf_dir, exist_ok=True)
    with open(os.path.join(hf_dir, "config.json"), "w") as f:
        json.dump(hf_config(s, dtype, norm_topk_prob), f, indent=2)
        f.write("\n")
    gtm.write_safetensors(os.path.join(hf_dir, "model.safetensors"), st, "bf16" if dtype == "bf16" else "f32")


def main(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("out_dir")
    p.add_argument("--dtype", action="append", choices=DTYPES, help="repeatable (default: every dtype)")
    p.add_argument("--seed", type=int, default=41)
    p.add_argument("--name", help="file name without .gguf (one --dtype only)")
    p.add_argument("--no-hf", action="store_true")
    p.add_argument("--no-norm-topk-prob", action="store_true", help="config.json norm_topk_prob false")
    a = p.parse_args(argv)
    dtypes = a.dtype or list(DTYPES)
    if a.name and len(dtypes) != 1:
        p.error("--name needs exactly one --dtype")
    for dt in dtypes:
        path, hf = write_tiny_moe(a.out_dir, dt, a.seed, a.name, not a.no_hf, not a.no_norm_topk_prob)
        print(path, hf or "")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
