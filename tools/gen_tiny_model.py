#!/usr/bin/env python3
"""Writes a tiny random Llama-architecture GGUF file, of any shape and dtype.

The model is made in Hugging Face layout (q_proj/k_proj rows in rotate-half
order) and Q/K are permuted the way llama.cpp's convert_hf_to_gguf.py does,
so a loader has to undo that exactly as it does for real files. 2-D weights
(token_embd too) use --dtype; norm weights stay F32. The quantizers below
follow ggml's reference ones (quantize_row_*_ref); the file is written with
the `gguf` package's GGUFWriter.

The tokenizer is a small GPT-2 byte-level BPE: three control tokens, the 256
byte tokens, then tokens learnt by BPE on a fixed text up to --vocab, with
merges that are consistent with them.

--expect-out DIR also writes, for a few tensors, the values the `gguf`
package's own dequantizer reads back from the file (DIR/<name>.f32, raw
little-endian float32, ggml row order) and DIR/meta.json with the config: an
independent check of a C dequantizer.
--hf-out FILE.npz writes the weights as the learner would hold them: the
file's dequantized values with the Q/K permutation undone, under HF names.

  gen_tiny_model.py --out F.gguf --dtype q4_1 --layers 2 --dim 64 --heads 4 \\
      --kv-heads 2 --ffn 128 --vocab 300 --ctx 256 --rope-theta 10000 --seed 1
"""
import argparse
import json
import os
import re
import sys

import numpy as np

try:
    import gguf
    from gguf import GGMLQuantizationType as QT
except ImportError:
    sys.exit("gen_tiny_model: the Python package `gguf` is missing (make setup)")

DTYPES = {"f32": QT.F32, "f16": QT.F16, "bf16": QT.BF16, "q8_0": QT.Q8_0, "q4_0": QT.Q4_0, "q4_1": QT.Q4_1}
FILE_TYPES = {"f32": 0, "f16": 1, "q4_0": 2, "q4_1": 3, "q8_0": 7, "bf16": 32}   # llama_ftype
CONTROL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHATML = ("{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content']"
          " + '<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}"
          "{% endif %}")


# --------------------------------------------------------------------------
# Quantizers (ggml's reference ones, one block of 32 per row slice). Each
# returns the raw bytes, shape (rows, bytes per row).

def f32_to_f16_bits(x):
    return np.asarray(x, dtype=np.float32).astype(np.float16).view(np.uint8)


def roundf(x):
    """C roundf: halves away from zero (np.round would go to even)."""
    return np.sign(x) * np.floor(np.abs(x) + np.float32(0.5))


def blocks_of(w, qk=32):
    rows, cols = w.shape
    assert cols % qk == 0, f"row length {cols} is not a multiple of {qk}"
    return w.astype(np.float32).reshape(rows * cols // qk, qk)


def quant_q8_0(w):
    b = blocks_of(w)
    d = np.abs(b).max(axis=1, keepdims=True) / np.float32(127)
    with np.errstate(divide="ignore"):
        inv = np.where(d == 0, np.float32(0), np.float32(1) / d).astype(np.float32)
    q = roundf(b * inv).astype(np.int8).view(np.uint8)
    return np.concatenate([f32_to_f16_bits(d), q], axis=1).reshape(w.shape[0], -1)


def quant_q4_0(w):
    b = blocks_of(w)
    # max is the signed value of largest magnitude, so the block's extreme
    # maps to -8 exactly and the other side has 7 steps.
    mx = np.take_along_axis(b, np.abs(b).argmax(axis=1)[:, None], axis=1)
    d = (mx / np.float32(-8)).astype(np.float32)
    with np.errstate(divide="ignore"):
        inv = np.where(d == 0, np.float32(0), np.float32(1) / d).astype(np.float32)
    q = np.minimum(15, np.trunc(b * inv + np.float32(8.5))).astype(np.uint8)
    packed = q[:, :16] | (q[:, 16:] << 4)          # low nibble j, high nibble j+16
    return np.concatenate([f32_to_f16_bits(d), packed], axis=1).reshape(w.shape[0], -1)


def quant_q4_1(w):
    b = blocks_of(w)
    lo = b.min(axis=1, keepdims=True)
    hi = b.max(axis=1, keepdims=True)
    d = ((hi - lo) / np.float32(15)).astype(np.float32)
    with np.errstate(divide="ignore"):
        inv = np.where(d == 0, np.float32(0), np.float32(1) / d).astype(np.float32)
    q = np.minimum(15, np.trunc((b - lo) * inv + np.float32(0.5))).astype(np.uint8)
    packed = q[:, :16] | (q[:, 16:] << 4)
    return np.concatenate([f32_to_f16_bits(d), f32_to_f16_bits(lo), packed], axis=1).reshape(w.shape[0], -1)


def quant_bf16(w):
    u = np.ascontiguousarray(w, dtype=np.float32).view(np.uint32).astype(np.uint64)
    is_nan = (u & 0x7FFFFFFF) > 0x7F800000
    rounded = (u + 0x7FFF + ((u >> 16) & 1)) >> 16                # nearest, ties to even
    bits = np.where(is_nan, (u >> 16) | 0x40, rounded).astype(np.uint16)
    return bits.view(np.uint8).reshape(w.shape[0], -1)


def encode(w, dtype):
    """(array to hand to GGUFWriter, raw_dtype or None)."""
    if dtype == "f32":
        return np.ascontiguousarray(w, dtype=np.float32), None
    if dtype == "f16":
        return np.ascontiguousarray(w, dtype=np.float32).astype(np.float16), None   # rounds to nearest even
    quant = {"bf16": quant_bf16, "q8_0": quant_q8_0, "q4_0": quant_q4_0, "q4_1": quant_q4_1}[dtype]
    return np.ascontiguousarray(quant(w)), DTYPES[dtype]


# --------------------------------------------------------------------------
# Tokenizer: GPT-2 byte-level alphabet and a tiny BPE trained on fixed text.

def bytes_to_unicode():
    """GPT-2's byte -> printable unicode char table."""
    keep = list(range(0x21, 0x7F)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    table, extra = {}, 0
    for b in range(256):
        if b in keep:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + extra)
            extra += 1
    return table


TRAIN_TEXT = """\
The quick brown fox jumps over the lazy dog. Reinforcement learning from verifiable rewards samples
many completions for each prompt, scores them, and updates the policy. The rollout server keeps the
weights in memory, runs every sequence in one batch, and returns the tokens with their log probabilities.
Hello world! Hello there, how are you today? I am fine, thank you. What is 12 + 34? It is 46.
In the beginning the model knows nothing; after training on the data it learns the patterns of the
language. Paris is the capital of France, Berlin is the capital of Germany, and Rome is in Italy.
def main(): return 0  # code is text too
"""

PRETOKENIZE = re.compile(r"'s|'t|'re|'ve|'m|'ll|'d| ?[A-Za-z]+|[0-9]| ?[^\sA-Za-z0-9]+|\s+(?!\S)|\s+")


def train_bpe(n_tokens):
    """Returns (tokens, merges) with len(tokens) == n_tokens."""
    b2u = bytes_to_unicode()
    tokens = list(CONTROL_TOKENS) + [b2u[b] for b in range(256)]
    known = set(tokens)
    merges = []
    words = {}
    for piece in PRETOKENIZE.findall(TRAIN_TEXT):
        sym = tuple(b2u[b] for b in piece.encode("utf-8"))
        words[sym] = words.get(sym, 0) + 1
    while len(tokens) < n_tokens:
        pairs = {}
        for w, n in words.items():
            for a, b in zip(w, w[1:]):
                pairs[(a, b)] = pairs.get((a, b), 0) + n
        if not pairs:
            break
        (a, b), _ = min(pairs.items(), key=lambda kv: (-kv[1], kv[0]))   # most frequent, then by text
        merges.append(f"{a} {b}")
        if a + b not in known:
            tokens.append(a + b)
            known.add(a + b)
        merged = {}
        for w, n in words.items():
            out, i = [], 0
            while i < len(w):
                if i + 1 < len(w) and w[i] == a and w[i + 1] == b:
                    out.append(a + b)
                    i += 2
                else:
                    out.append(w[i])
                    i += 1
            merged[tuple(out)] = merged.get(tuple(out), 0) + n
        words = merged
    # The text is used up: extend learnt tokens by a letter, in a fixed order.
    base = [t for t in tokens[len(CONTROL_TOKENS) + 256:]] or [b2u[c] for c in b"etaoin"]
    letters = [b2u[c] for c in b"etaoinshrdlucmfwypvbgkjqxz"]
    i = 0
    while len(tokens) < n_tokens:
        a = base[i % len(base)]
        for b in letters:
            if len(tokens) >= n_tokens:
                break
            if a + b not in known:
                merges.append(f"{a} {b}")
                tokens.append(a + b)
                known.add(a + b)
                base.append(a + b)
        i += 1
    return tokens, merges


# --------------------------------------------------------------------------
# Weights in HF layout, then the GGUF permutation.

def permute(w, n_head):
    """convert_hf_to_gguf.py's LlamaModel.permute: rotate-half rows -> interleaved pairs."""
    rows, cols = w.shape
    return w.reshape(n_head, 2, rows // n_head // 2, cols).swapaxes(1, 2).reshape(rows, cols)


def unpermute(w, n_head):
    rows, cols = w.shape
    return w.reshape(n_head, rows // n_head // 2, 2, cols).swapaxes(1, 2).reshape(rows, cols)


def make_weights(a, rng):
    """HF state_dict (float32). Projections use std 1/sqrt(fan_in) so that
    activations stay O(1); embeddings use 2/sqrt(dim) so that (tied) logits
    have a spread of a couple of units rather than all being ~equal."""
    hd = a.dim // a.heads

    def lin(out_f, in_f):
        return (rng.standard_normal((out_f, in_f)) / np.sqrt(in_f)).astype(np.float32)

    def norm():
        return (1.0 + 0.1 * rng.standard_normal(a.dim)).astype(np.float32)

    w = {"model.embed_tokens.weight": (rng.standard_normal((a.vocab, a.dim)) * 2 / np.sqrt(a.dim)).astype(np.float32)}
    for i in range(a.layers):
        p = f"model.layers.{i}."
        w[p + "input_layernorm.weight"] = norm()
        w[p + "self_attn.q_proj.weight"] = lin(a.heads * hd, a.dim)
        w[p + "self_attn.k_proj.weight"] = lin(a.kv_heads * hd, a.dim)
        w[p + "self_attn.v_proj.weight"] = lin(a.kv_heads * hd, a.dim)
        w[p + "self_attn.o_proj.weight"] = lin(a.dim, a.heads * hd)
        w[p + "post_attention_layernorm.weight"] = norm()
        w[p + "mlp.gate_proj.weight"] = lin(a.ffn, a.dim)
        w[p + "mlp.up_proj.weight"] = lin(a.ffn, a.dim)
        w[p + "mlp.down_proj.weight"] = lin(a.dim, a.ffn)
    w["model.norm.weight"] = norm()
    if not a.tied:
        w["lm_head.weight"] = (rng.standard_normal((a.vocab, a.dim)) * 2 / np.sqrt(a.dim)).astype(np.float32)
    return w


def gguf_tensors(a, hf):
    """[(gguf name, hf name, array in GGUF row order, permute heads or 0)]."""
    out = [("token_embd.weight", "model.embed_tokens.weight", 0)]
    for i in range(a.layers):
        p, b = f"model.layers.{i}.", f"blk.{i}."
        out += [
            (b + "attn_norm.weight", p + "input_layernorm.weight", 0),
            (b + "attn_q.weight", p + "self_attn.q_proj.weight", a.heads),
            (b + "attn_k.weight", p + "self_attn.k_proj.weight", a.kv_heads),
            (b + "attn_v.weight", p + "self_attn.v_proj.weight", 0),
            (b + "attn_output.weight", p + "self_attn.o_proj.weight", 0),
            (b + "ffn_norm.weight", p + "post_attention_layernorm.weight", 0),
            (b + "ffn_gate.weight", p + "mlp.gate_proj.weight", 0),
            (b + "ffn_up.weight", p + "mlp.up_proj.weight", 0),
            (b + "ffn_down.weight", p + "mlp.down_proj.weight", 0),
        ]
    out.append(("output_norm.weight", "model.norm.weight", 0))
    if not a.tied:
        out.append(("output.weight", "lm_head.weight", 0))
    return [(g, h, permute(hf[h], n) if n else hf[h], n) for g, h, n in out]


# --------------------------------------------------------------------------

def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True)
    p.add_argument("--dtype", default="f32", choices=sorted(DTYPES))
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--kv-heads", type=int, default=2)
    p.add_argument("--ffn", type=int, default=128)
    p.add_argument("--vocab", type=int, default=300)
    p.add_argument("--ctx", type=int, default=256)
    p.add_argument("--rope-theta", type=float, default=10000.0)
    p.add_argument("--eps", type=float, default=1e-5)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--alignment", type=int, default=0, help="write general.alignment (power of two)")
    p.add_argument("--version", type=int, default=3, choices=[2, 3])
    g = p.add_mutually_exclusive_group()
    g.add_argument("--tied", dest="tied", action="store_true", default=True)
    g.add_argument("--untied", dest="tied", action="store_false")
    p.add_argument("--expect-out")
    p.add_argument("--hf-out")
    a = p.parse_args(argv)
    need = len(CONTROL_TOKENS) + 256
    if a.vocab < need:
        p.error(f"--vocab must be at least {need} (control + byte tokens)")
    if a.dim % a.heads or (a.dim // a.heads) % 2 or a.heads % a.kv_heads:
        p.error("--dim must be a multiple of --heads with an even head dim, and --heads a multiple of --kv-heads")
    if a.dtype in ("q8_0", "q4_0", "q4_1") and (a.dim % 32 or a.ffn % 32):
        p.error(f"{a.dtype} needs --dim and --ffn to be multiples of 32 (the block size)")
    if a.alignment and (a.alignment & (a.alignment - 1)):
        p.error("--alignment must be a power of two")
    return a


def main(argv):
    a = parse_args(argv)
    rng = np.random.default_rng(a.seed)
    hf = make_weights(a, rng)
    tokens, merges = train_bpe(a.vocab)
    hd = a.dim // a.heads

    w = gguf.GGUFWriter(a.out, arch="llama")
    if a.alignment:
        w.add_custom_alignment(a.alignment)
    w.add_name(f"tiny-llama-{a.dtype}")
    w.add_file_type(FILE_TYPES[a.dtype])
    w.add_context_length(a.ctx)
    w.add_embedding_length(a.dim)
    w.add_block_count(a.layers)
    w.add_feed_forward_length(a.ffn)
    w.add_head_count(a.heads)
    w.add_head_count_kv(a.kv_heads)
    w.add_layer_norm_rms_eps(a.eps)
    w.add_rope_freq_base(a.rope_theta)
    w.add_rope_dimension_count(hd)
    w.add_vocab_size(len(tokens))
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("smollm")
    w.add_token_list(tokens)
    w.add_token_types([3] * len(CONTROL_TOKENS) + [1] * (len(tokens) - len(CONTROL_TOKENS)))
    w.add_token_merges(merges)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_unk_token_id(0)
    w.add_pad_token_id(2)
    w.add_add_bos_token(False)
    w.add_chat_template(CHATML)

    tensors = gguf_tensors(a, hf)
    for name, _, arr, _ in tensors:
        if arr.ndim == 1:
            w.add_tensor(name, arr.astype(np.float32))      # norms stay F32
        else:
            data, raw = encode(arr, a.dtype)
            w.add_tensor(name, data, raw_dtype=raw)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()

    if a.expect_out or a.hf_out:
        write_checks(a, tensors)
    if a.version != 3:
        # v2 and v3 have the same layout (v3 only allowed big-endian files).
        with open(a.out, "r+b") as f:
            f.seek(4)
            f.write(int(a.version).to_bytes(4, "little"))
    return 0


def write_checks(a, tensors):
    """Reads the file back with the gguf package and dequantizes with it."""
    reader = gguf.GGUFReader(a.out)
    by_name = {t.name: t for t in reader.tensors}

    def values(name):
        t = by_name[name]
        return np.asarray(gguf.quants.dequantize(t.data, t.tensor_type), dtype=np.float32)

    if a.expect_out:
        os.makedirs(a.expect_out, exist_ok=True)
        names = ["token_embd.weight", "output_norm.weight", "blk.0.attn_norm.weight", "blk.0.attn_q.weight",
                 "blk.0.attn_k.weight", "blk.0.attn_v.weight", "blk.0.ffn_down.weight"]
        names += ["blk.1.ffn_gate.weight"] if a.layers > 1 else []
        names += [] if a.tied else ["output.weight"]
        for n in names:
            values(n).astype("<f4").tofile(os.path.join(a.expect_out, n + ".f32"))
        meta = {"dtype": a.dtype, "layers": a.layers, "dim": a.dim, "heads": a.heads, "kv_heads": a.kv_heads,
                "head_dim": a.dim // a.heads, "ffn": a.ffn, "vocab": a.vocab, "ctx": a.ctx,
                "rope_theta": a.rope_theta, "eps": a.eps, "seed": a.seed, "tied": a.tied, "version": a.version,
                "alignment": a.alignment or 32, "bos": 1, "eos": 2, "expected": names}
        with open(os.path.join(a.expect_out, "meta.json"), "w") as f:
            json.dump(meta, f, indent=1)
            f.write("\n")
    if a.hf_out:
        state = {h: (unpermute(values(g).reshape(arr.shape), n) if n else values(g).reshape(arr.shape))
                 for g, h, arr, n in tensors}
        np.savez(a.hf_out, **state)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
