#!/usr/bin/env python3
"""Writes a Qwen3-30B-A3B-shaped GGUF (llama.cpp arch `qwen3moe`) with random
weights and fewer layers, for decode benchmarks (make bench-moe).

Shape (Qwen3-30B-A3B's config.json, but --layers of them, default 4 of 48):
hidden 2048, 32 query heads / 4 KV heads, head_dim 128, 128 experts, top 8,
expert FFN 768, vocab 151,936, untied lm_head, rope theta 1e6, eps 1e-6,
context 40,960 (feed_forward_length 6144 as the converter writes it; unused).
Names and keys are tests/py/moe_model.py's (llama.cpp's converter): blk.N.
ffn_gate_inp (the router, F32), ffn_{gate,up,down}_exps (3-D, every expert),
attn_q/k/v/output, attn_q_norm/k_norm; norms F32 as llama.cpp keeps them.

--dtype q8_0 or q4_k: every matrix (embedding, attention, experts, LM head)
in that dtype, the router and norms F32.

Why the values are not quantized from Gaussians: 4 layers hold 2.4 B expert
weights (2.6 GB of Q8_0), which tools/gen_tiny_model.py's NumPy quantizers
take many minutes to encode. Instead every quantized tensor is written as
its final block bytes directly: the codes are random bytes (each expert, each
tensor its own stream: no expert repeats another's bytes, so a decode step
reads as many distinct bytes as in a real model) and every block's scale
fields are one fixed value, chosen so that the dequantized weights have mean 0
and standard deviation --init-std (uniform, not Gaussian):
  Q8_0: d = std / 73.9 (random int8 codes, -128 made -127 as ggml never
        writes it; std ~sqrt((256^2 - 1) / 12));
  Q4_K: every sub-block scale and min 32, dmin = 7.5 d (mean 0), d = std /
        (32 * 4.61) (random nibbles 0..15, std sqrt(255 / 12)).
The decoders cost the same whatever the scale values, so the bytes read and the
work per step are those of a real file of this shape. The router is a real
random F32 matrix, N(0, (ROUTER_STD / sqrt(hidden))^2), so a normed row's
router logits spread by ~ROUTER_STD; norms are 1.

Routing. A trained MoE spreads tokens over its experts (a load-balancing
loss); random weights do not by themselves: with every matrix at std 0.02 the
attention outputs, which are alike across positions, outweigh the token
embeddings in the residual stream, and the routers of layers 1-3 sent 256
random tokens to only 32-65 of the 128 experts. So the embedding gets a larger
std (--embed-std, default 3): the residual stays dominated by each token's
own vector and, measured with rollout-logits --routes-out over 256 random
tokens, every layer uses all 128 experts and B random rows hit as many
distinct experts as independent uniform top-8 routing would (51.6 of 128 at
B = 8, 111 at 32, 125-126 at 64). make bench-moe counts them again in every
run (rollout-bench --routes).

    python3 tools/gen_moe_model.py --out build/m.gguf --dtype q8_0 [--layers 4] [--seed 1]
About 10 s and ~0.5 GB of memory for 4 layers (one tensor in memory at a time).
"""
import argparse
import os
import sys
import zlib

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gen_tiny_model as gtm  # noqa: E402  (tokenizer, chat template)

import gguf  # noqa: E402
from gguf import GGMLQuantizationType as QT  # noqa: E402

ARCH = "qwen3moe"
ROUTER_STD = 2.0
SHAPE = dict(dim=2048, heads=32, kv_heads=4, head_dim=128, ffn=6144, n_expert=128, k=8, ffn_exp=768,
             vocab=151936, ctx=40960, theta=1e6, eps=1e-6)
QTYPES = {"q8_0": QT.Q8_0, "q4_k": QT.Q4_K}
FILE_TYPES = {"q8_0": 7, "q4_k": 14}            # llama_ftype (Q4_K: MOSTLY_Q4_K_S, the nearest name)
BLOCK = {"q8_0": (32, 34), "q4_k": (256, 144)}  # values, bytes


def f16_bytes(x):
    return np.array([x], dtype=np.float16).view(np.uint8)


def block_head(dtype, std):
    """The fixed scale bytes at the start of every block, and their length."""
    if dtype == "q8_0":
        return f16_bytes(std / np.sqrt((256.0 ** 2 - 1) / 12))
    d = std / (32 * np.sqrt(255 / 12))
    ls = lm = np.full(8, 32, dtype=np.uint8)    # gen_tiny_model.quant_kx's get_scale_min_k4 packing
    sc = np.concatenate([ls[:4] | ((ls[4:] >> 4) << 6), lm[:4] | ((lm[4:] >> 4) << 6),
                         (ls[4:] & 15) | ((lm[4:] & 15) << 4)]).astype(np.uint8)
    return np.concatenate([f16_bytes(d), f16_bytes(7.5 * d), sc])


def random_blocks(shape, dtype, std, seed, name):
    """uint8 [*shape[:-1], row bytes]: shape's rows as blocks of random codes
    behind the fixed scale fields."""
    qk, nb = BLOCK[dtype]
    *lead, cols = shape
    assert cols % qk == 0, f"{name}: row length {cols} is not a multiple of {qk}"
    n_blocks = int(np.prod(lead)) * cols // qk
    rng = np.random.default_rng([seed, 0x30EB, zlib.crc32(name.encode())])
    out = np.frombuffer(bytearray(rng.bytes(n_blocks * nb)), dtype=np.uint8).reshape(n_blocks, nb)
    head = block_head(dtype, std)
    out[:, :len(head)] = head
    if dtype == "q8_0":             # codes -127..127 as ggml writes them (0x80, -128, never occurs)
        q = out[:, len(head):]
        q[q == 0x80] = 0x81
    return out.reshape(*lead, cols // qk * nb)


def tensors(s, layers):
    """[(name, numpy-order shape, kind)]: kind 'q' (quantized), 'router', 'norm'; converter order."""
    d, hd, E, F = s["dim"], s["head_dim"], s["n_expert"], s["ffn_exp"]
    out = [("token_embd.weight", (s["vocab"], d), "q")]
    for i in range(layers):
        b = f"blk.{i}."
        out += [(b + "attn_norm.weight", (d,), "norm"),
                (b + "attn_q.weight", (s["heads"] * hd, d), "q"),
                (b + "attn_k.weight", (s["kv_heads"] * hd, d), "q"),
                (b + "attn_v.weight", (s["kv_heads"] * hd, d), "q"),
                (b + "attn_output.weight", (d, s["heads"] * hd), "q"),
                (b + "attn_q_norm.weight", (hd,), "norm"),
                (b + "attn_k_norm.weight", (hd,), "norm"),
                (b + "ffn_norm.weight", (d,), "norm"),
                (b + "ffn_gate_inp.weight", (E, d), "router"),
                (b + "ffn_gate_exps.weight", (E, F, d), "q"),
                (b + "ffn_up_exps.weight", (E, F, d), "q"),
                (b + "ffn_down_exps.weight", (E, d, F), "q")]
    out += [("output_norm.weight", (d,), "norm"), ("output.weight", (s["vocab"], d), "q")]
    return out


def add_metadata(w, s, n_layers, tokens, merges):
    """The qwen3moe GGUF keys of shape s (dict: ctx, dim, ffn, heads, kv_heads, head_dim, eps, theta,
    n_expert, k, ffn_exp) with n_layers layers, and gen_tiny_model's tokenizer (tokens, merges):
    what llama.cpp's converter writes for Qwen3MoeForCausalLM. tests/py/moe_model.py uses it too."""
    w.add_context_length(s["ctx"])
    w.add_embedding_length(s["dim"])
    w.add_block_count(n_layers)
    w.add_feed_forward_length(s["ffn"])
    w.add_head_count(s["heads"])
    w.add_head_count_kv(s["kv_heads"])
    w.add_key_length(s["head_dim"])
    w.add_value_length(s["head_dim"])
    w.add_layer_norm_rms_eps(s["eps"])
    w.add_rope_freq_base(s["theta"])
    w.add_expert_count(s["n_expert"])
    w.add_expert_used_count(s["k"])
    w.add_expert_feed_forward_length(s["ffn_exp"])
    w.add_vocab_size(len(tokens))
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("qwen2")
    w.add_token_list(tokens)
    w.add_token_types([3] * len(gtm.CONTROL_TOKENS) + [1] * (len(tokens) - len(gtm.CONTROL_TOKENS)))
    w.add_token_merges(merges)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_unk_token_id(0)
    w.add_pad_token_id(2)
    w.add_add_bos_token(False)
    w.add_chat_template(gtm.CHATML)


def main(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True)
    p.add_argument("--dtype", choices=sorted(QTYPES), default="q8_0")
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--init-std", type=float, default=0.02)
    p.add_argument("--embed-std", type=float, default=3.0)
    a = p.parse_args(argv)
    s = SHAPE
    tokens, merges = gtm.train_bpe(s["vocab"])

    w = gguf.GGUFWriter(a.out, arch=ARCH)
    w.add_name(f"qwen3moe-30b-a3b-shape-{a.layers}l-synth-{a.dtype}")
    w.add_file_type(FILE_TYPES[a.dtype])
    add_metadata(w, s, a.layers, tokens, merges)

    # Tensor infos first, then each tensor is made and written in turn.
    ts = tensors(s, a.layers)
    qk, nb = BLOCK[a.dtype]
    for name, shape, kind in ts:
        if kind == "q":
            bshape = shape[:-1] + (shape[-1] // qk * nb,)
            w.add_tensor_info(name, bshape, np.dtype(np.uint8), int(np.prod(bshape)), raw_dtype=QTYPES[a.dtype])
        else:
            w.add_tensor_info(name, shape, np.dtype(np.float32), int(np.prod(shape)) * 4)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    for name, shape, kind in ts:
        if kind == "q":
            std = a.embed_std if name == "token_embd.weight" else a.init_std
            w.write_tensor_data(random_blocks(shape, a.dtype, std, a.seed, name))
        elif kind == "router":
            rng = np.random.default_rng([a.seed, 0x30EC, zlib.crc32(name.encode())])
            x = rng.standard_normal(shape, dtype=np.float32)
            x *= np.float32(ROUTER_STD / np.sqrt(s["dim"]))
            w.write_tensor_data(x)
        else:
            w.write_tensor_data(np.ones(shape, dtype=np.float32))
    w.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
