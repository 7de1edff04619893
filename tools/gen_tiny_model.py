#!/usr/bin/env python3
"""Writes a tiny random GGUF file of the Llama, Qwen2, Qwen3 or Gemma 3 family, of any shape and dtype.

The model is made in Hugging Face layout (q_proj/k_proj rows in rotate-half
order). For --arch llama, Q/K are permuted the way llama.cpp's
convert_hf_to_gguf.py does (llama.cpp runs Llama with interleaved-pair RoPE),
so a loader has to undo that exactly as it does for real files; qwen2/qwen3
run NEOX (rotate-half) RoPE in llama.cpp and the converter writes their rows
unchanged. 2-D weights (token_embd too) use --dtype; 1-D tensors (norms,
Qwen2's q/k/v biases, Qwen3's q_norm/k_norm, rope_freqs) stay F32. The
quantizers below follow ggml's reference ones (quantize_row_*_ref) for the
32-element blocks (q8_0, q4_0, q4_1, q5_0, q5_1); the K-quants (q4_k, q5_k,
q6_k: super-blocks of 256, so --dim, --ffn and heads*head_dim must be
multiples of 256) use simple quantizers of our own. The file is written with
the `gguf` package's GGUFWriter.

Families (--arch; GGUF general.architecture and the `<arch>.` key prefix):
  llama  no biases; rope.dimension_count written; Q/K permuted.
  qwen2  blk.N.attn_{q,k,v}.bias (none on attn_output); needs heads*head_dim == dim
         (llama.cpp's qwen2 loader shapes attn_q as [dim, dim]).
  qwen3  blk.N.attn_{q,k}_norm.weight [head_dim], no biases; --head-dim may make
         the q width heads*head_dim differ from --dim; attention.key_length and
         value_length = head_dim.
  gemma3 Gemma3ForCausalLM: blk.N.attn_{q,k}_norm.weight [head_dim], two more
         norms per layer (post_attention_norm after attention, post_ffw_norm
         after the FFN; ffn_norm is HF's pre_feedforward_layernorm), GELU-tanh
         gate, no biases, tied; key_length/value_length = head_dim;
         `gemma3.attention.sliding_window` = --sliding-window (default 8, so
         tiny prompts cross it). Layer i is local (windowed, RoPE base 10000)
         when i % 6 < 5 and global (rope.freq_base) otherwise: llama.cpp's
         defaults, so neither the pattern nor the local base is written (as
         convert_hf_to_gguf.py's Gemma3Model does); use --layers 6 or more for
         a global layer. Every norm is stored as 1 + w (the converter adds 1
         to each `*norm.weight`; HF's Gemma3RMSNorm multiplies by 1 + w and
         the folder keeps w). The norm weights w are multiples of 1/64 in
         [-0.5, 1], so w, 1 + w and the way back are exact in float32 (and
         bf16). Q/K rows unpermuted (NEOX RoPE). llama.cpp scales the
         embeddings by sqrt(dim) and attention by 1/sqrt(head_dim) (the
         non-27B rule; the folder's query_pre_attn_scalar = head_dim says the
         same).
--rope-scaling llama3:FACTOR:LOW:HIGH:ORIG (llama only: llama.cpp's qwen graphs
take no frequency factors and its loader rejects a file with an unused tensor)
writes rope_freqs.weight [head_dim/2] F32, the per-frequency divisors of
convert_hf_to_gguf.py (1, FACTOR or 1/((1-s)/FACTOR + s)), and no scaling key;
--rope-scaling linear:FACTOR writes `<arch>.rope.scaling.type` = "linear" and
`<arch>.rope.scaling.factor` (llama.cpp: freq_scale = 1/FACTOR), any family.

The tokenizer is a small GPT-2 byte-level BPE: three control tokens, the 256
byte tokens, then tokens learnt by BPE on a fixed text up to --vocab, with
merges that are consistent with them.

--expect-out DIR also writes, for a few tensors, the values the `gguf`
package's own dequantizer reads back from the file (DIR/<name>.f32, raw
little-endian float32, ggml row order) and DIR/meta.json with the config: an
independent check of a C dequantizer.
--hf-out FILE.npz writes the weights as the learner would hold them: the
file's dequantized values with the Q/K permutation undone, under HF names.
--hf-dir DIR writes the same values as a Hugging Face folder: DIR/config.json
(the family's config, rope_scaling included) and DIR/model.safetensors (F32,
or BF16 with --hf-dtype bf16, which rounds every weight to bf16 before the GGUF
is written so that both files hold the same values; it needs --dtype f32 or
bf16).

--init-std S (S > 0) draws every 2-D weight (token_embd too) from N(0, S^2)
and sets every norm (q_norm/k_norm too) to 1, as a freshly initialised model
(S = 0.02 is HF's initializer_range); each tensor has its own random stream
(seed, tensor name), so tensors are made one at a time while the file is
written and memory stays at about one fp32 tensor: this is the mode for
full-size files (tools/bench_qwen3.sh writes a Qwen3-0.6B-shaped one). Without
it (the default) the scales are the ones described in make_weights and the
output is what it has always been. --vocab 151936 is fine (the BPE below runs
out of text and extends tokens by a letter; 0.1 s).

The tokenizer's pre-tokenizer name (tokenizer.ggml.pre) is "smollm" for llama,
"llama-bpe" for llama with llama3 scaling, "qwen2" for qwen2/qwen3, "smollm"
for gemma3 (llama.cpp takes a GPT-2 vocab in a gemma3 file, as the converter
writes one for a Gemma 3 folder without tokenizer.model; it knows GPT-2's own
split as "gpt-2", not "gpt2", and "smollm" is the split this vocab was learnt
with. Real Gemma 3 files carry a SentencePiece vocab); --pre overrides it.

  gen_tiny_model.py --out F.gguf --dtype q4_1 --layers 2 --dim 64 --heads 4 \\
      --kv-heads 2 --ffn 128 --vocab 300 --ctx 256 --rope-theta 10000 --seed 1
  gen_tiny_model.py --arch qwen3 --out F.gguf --dim 64 --heads 4 --kv-heads 2 \\
      --head-dim 32 --ctx 1024 --rope-theta 1e6 --hf-dir F.hf
  gen_tiny_model.py --out F.gguf --rope-scaling llama3:8:1:4:256 --rope-theta 1000 --ctx 1024
  gen_tiny_model.py --arch gemma3 --out F.gguf --layers 6 --dim 64 --heads 4 --kv-heads 1 \\
      --head-dim 32 --ctx 1024 --rope-theta 1e6 --eps 1e-6 --sliding-window 8 --hf-dir F.hf
"""
import argparse
import json
import os
import re
import sys
import zlib

import numpy as np

try:
    import gguf
    from gguf import GGMLQuantizationType as QT
except ImportError:
    sys.exit("gen_tiny_model: the Python package `gguf` is missing (make setup)")

DTYPES = {"f32": QT.F32, "f16": QT.F16, "bf16": QT.BF16, "q8_0": QT.Q8_0, "q4_0": QT.Q4_0, "q4_1": QT.Q4_1,
          "q5_0": QT.Q5_0, "q5_1": QT.Q5_1, "q4_k": QT.Q4_K, "q5_k": QT.Q5_K, "q6_k": QT.Q6_K}
ARCHS = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM"}
FILE_TYPES = {"f32": 0, "f16": 1, "q4_0": 2, "q4_1": 3, "q8_0": 7, "bf16": 32,   # llama_ftype
              "q5_0": 8, "q5_1": 9, "q4_k": 14, "q5_k": 16, "q6_k": 18}          # (K: the _S variants)
BLOCK = {"q8_0": 32, "q4_0": 32, "q4_1": 32, "q5_0": 32, "q5_1": 32, "q4_k": 256, "q5_k": 256, "q6_k": 256}
CONTROL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHATML = ("{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content']"
          " + '<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}"
          "{% endif %}")
ARCHS["gemma3"] = "Gemma3ForCausalLM"     # its own parts: the "Gemma 3" section below


# --------------------------------------------------------------------------
# Quantizers (ggml's reference ones for the 32-element blocks; simple ones of
# our own for the K-quants, below). Each returns the raw bytes, shape (rows,
# bytes per row).

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


def pack_5bit(q):
    """(blocks, 32) values 0..31 -> (qh u32 little-endian as 4 bytes, qs[16]):
    low nibbles as q4_0 (j, j+16 in byte j), the fifth bit of element j in bit j of qh."""
    qs = (q[:, :16] & 15) | ((q[:, 16:] & 15) << 4)
    bits = (q >> 4).astype(np.uint32) << np.arange(32, dtype=np.uint32)
    qh = np.bitwise_or.reduce(bits, axis=1).astype("<u4").view(np.uint8).reshape(-1, 4)
    return qh, qs.astype(np.uint8)


def quant_q5_0(w):
    b = blocks_of(w)
    mx = np.take_along_axis(b, np.abs(b).argmax(axis=1)[:, None], axis=1)
    d = (mx / np.float32(-16)).astype(np.float32)
    with np.errstate(divide="ignore"):
        inv = np.where(d == 0, np.float32(0), np.float32(1) / d).astype(np.float32)
    q = np.minimum(31, np.trunc(b * inv + np.float32(16.5))).astype(np.uint8)
    qh, qs = pack_5bit(q)
    return np.concatenate([f32_to_f16_bits(d), qh, qs], axis=1).reshape(w.shape[0], -1)


def quant_q5_1(w):
    b = blocks_of(w)
    lo = b.min(axis=1, keepdims=True)
    hi = b.max(axis=1, keepdims=True)
    d = ((hi - lo) / np.float32(31)).astype(np.float32)
    with np.errstate(divide="ignore"):
        inv = np.where(d == 0, np.float32(0), np.float32(1) / d).astype(np.float32)
    q = np.minimum(31, np.trunc((b - lo) * inv + np.float32(0.5))).astype(np.uint8)
    qh, qs = pack_5bit(q)
    return np.concatenate([f32_to_f16_bits(d), f32_to_f16_bits(lo), qh, qs], axis=1).reshape(w.shape[0], -1)


# K-quants: super-blocks of 256. Not ggml's quantizers (which search for the
# best scales); straightforward min/max ones that still use every field in
# full: 6-bit sub-block scales and mins up to 63 (so the high bits packed for
# sub-blocks 4-7 are exercised), Q6_K's int8 scales down to -128 and quants
# from -32. Any valid block bytes serve: the tests compare dequantized values.

def f16_round(x):
    return np.asarray(x, dtype=np.float32).astype(np.float16).astype(np.float32)


def safe_div(a, b):
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(b == 0, np.float32(0), a / np.where(b == 0, np.float32(1), b)).astype(np.float32)


def quant_kx(w, nmax):
    """Q4_K (nmax 15) / Q5_K (nmax 31): y = d*sc * q - dmin*m per sub-block of 32.
    Returns (d, dmin, scales[12], q (blocks, 256) in 0..nmax)."""
    b = blocks_of(w, 256).reshape(-1, 8, 32)
    lo = np.minimum(b.min(axis=2), np.float32(0))           # the min is subtracted: m >= 0
    scale = ((b.max(axis=2) - lo) / np.float32(nmax)).astype(np.float32)
    mn = -lo
    d = f16_round(scale.max(axis=1, keepdims=True) / np.float32(63))
    dmin = f16_round(mn.max(axis=1, keepdims=True) / np.float32(63))
    ls = np.clip(roundf(safe_div(scale, d)), 0, 63).astype(np.uint8)
    lm = np.clip(roundf(safe_div(mn, dmin)), 0, 63).astype(np.uint8)
    es = (d * ls).astype(np.float32)[:, :, None]
    em = (dmin * lm).astype(np.float32)[:, :, None]
    q = np.clip(roundf(safe_div(b + em, np.broadcast_to(es, b.shape))), 0, nmax).astype(np.uint8)
    # ggml's get_scale_min_k4 layout: bytes 0-3 scales 0-3 (+ top bits of
    # scales 4-7), 4-7 mins 0-3 (+ top bits of mins 4-7), 8-11 the low
    # nibbles of scale (low) and min (high) 4-7.
    sc = np.concatenate([ls[:, :4] | ((ls[:, 4:] >> 4) << 6), lm[:, :4] | ((lm[:, 4:] >> 4) << 6),
                         (ls[:, 4:] & 15) | ((lm[:, 4:] & 15) << 4)], axis=1).astype(np.uint8)
    return d, dmin, sc, q.reshape(-1, 256)


def pack_k_nibbles(q):
    """(blocks, 256) -> qs[128]: per 64 elements c, byte 32c+l = q[64c+l] | q[64c+32+l] << 4."""
    q = q.reshape(-1, 4, 2, 32) & 15
    return (q[:, :, 0, :] | (q[:, :, 1, :] << 4)).reshape(-1, 128).astype(np.uint8)


def quant_q4_k(w):
    d, dmin, sc, q = quant_kx(w, 15)
    out = np.concatenate([f32_to_f16_bits(d), f32_to_f16_bits(dmin), sc, pack_k_nibbles(q)], axis=1)
    return out.reshape(w.shape[0], -1)


def quant_q5_k(w):
    d, dmin, sc, q = quant_kx(w, 31)
    hi = (q >> 4).reshape(-1, 4, 2, 32).astype(np.uint8)     # bit 2c (low nibble) and 2c+1 (high) of qh[l]
    shift = (2 * np.arange(4)[:, None] + np.arange(2)[None, :]).astype(np.uint8)[None, :, :, None]
    qh = np.bitwise_or.reduce((hi << shift).reshape(-1, 8, 32), axis=1).astype(np.uint8)
    out = np.concatenate([f32_to_f16_bits(d), f32_to_f16_bits(dmin), sc, qh, pack_k_nibbles(q)], axis=1)
    return out.reshape(w.shape[0], -1)


def quant_q6_k(w):
    """y = d * sc * (L - 32), sc int8 per sub-block of 16, L 0..63."""
    b = blocks_of(w, 256).reshape(-1, 16, 16)
    mx = np.take_along_axis(b, np.abs(b).argmax(axis=2)[:, :, None], axis=2)[:, :, 0]
    s = (mx / np.float32(-32)).astype(np.float32)             # the extreme of each sub-block -> -32
    smax = np.take_along_axis(s, np.abs(s).argmax(axis=1)[:, None], axis=1)
    d = f16_round(smax / np.float32(-128))                    # the largest scale -> -128
    sc = np.clip(roundf(safe_div(s, d)), -128, 127).astype(np.int8)
    es = (d * sc.astype(np.float32)).astype(np.float32)[:, :, None]
    L = (np.clip(roundf(safe_div(b, np.broadcast_to(es, b.shape))), -32, 31) + 32).astype(np.uint8)
    L = L.reshape(-1, 2, 4, 32)                               # half, quarter, l
    ql = np.concatenate([L[:, :, 0] & 15 | (L[:, :, 2] & 15) << 4,
                         L[:, :, 1] & 15 | (L[:, :, 3] & 15) << 4], axis=2).reshape(-1, 128)
    qh = (L[:, :, 0] >> 4 | (L[:, :, 1] >> 4) << 2 | (L[:, :, 2] >> 4) << 4 | (L[:, :, 3] >> 4) << 6).reshape(-1, 64)
    out = np.concatenate([ql.astype(np.uint8), qh.astype(np.uint8), sc.view(np.uint8), f32_to_f16_bits(d)], axis=1)
    return out.reshape(w.shape[0], -1)


def quant_bf16(w):
    u = np.ascontiguousarray(w, dtype=np.float32).view(np.uint32).astype(np.uint64)
    is_nan = (u & 0x7FFFFFFF) > 0x7F800000
    rounded = (u + 0x7FFF + ((u >> 16) & 1)) >> 16                # nearest, ties to even
    bits = np.where(is_nan, (u >> 16) | 0x40, rounded).astype(np.uint16)
    return bits.view(np.uint8).reshape(w.shape[0], -1)


QUANT_BLOCK = {"q8_0": (32, 34), "q4_0": (32, 18), "q4_1": (32, 20), "bf16": (1, 2),   # values, bytes
               "q5_0": (32, 22), "q5_1": (32, 24), "q4_k": (256, 144), "q5_k": (256, 176), "q6_k": (256, 210)}
ENCODE_CHUNK = 1 << 22          # values quantized at a time (the quantizers' temporaries are a few times that)


def encode(w, dtype):
    """(array to hand to GGUFWriter, raw_dtype or None). Quantized row by
    row in chunks (every block is independent, so the bytes are the same as
    in one go) to bound the temporaries on large tensors."""
    if dtype == "f32":
        return np.ascontiguousarray(w, dtype=np.float32), None
    if dtype == "f16":
        return np.ascontiguousarray(w, dtype=np.float32).astype(np.float16), None   # rounds to nearest even
    quant = {"bf16": quant_bf16, "q8_0": quant_q8_0, "q4_0": quant_q4_0, "q4_1": quant_q4_1, "q5_0": quant_q5_0,
             "q5_1": quant_q5_1, "q4_k": quant_q4_k, "q5_k": quant_q5_k, "q6_k": quant_q6_k}[dtype]
    rows, cols = w.shape
    step = max(1, ENCODE_CHUNK // cols)
    if rows <= step:
        return np.ascontiguousarray(quant(w)), DTYPES[dtype]
    qk, nb = QUANT_BLOCK[dtype]
    out = np.empty((rows, cols // qk * nb), dtype=np.uint8)
    for r in range(0, rows, step):
        out[r:r + step] = quant(w[r:r + step])
    return out, DTYPES[dtype]


def encoded_spec(shape, dtype):
    """(shape, numpy dtype, bytes, raw_dtype) of encode()'s result for a 2-D
    tensor of this shape: GGUFWriter's tensor info, written before the data."""
    rows, cols = shape
    if dtype in ("f32", "f16"):
        npt = np.float32 if dtype == "f32" else np.float16
        return (rows, cols), np.dtype(npt), rows * cols * np.dtype(npt).itemsize, None
    qk, nb = QUANT_BLOCK[dtype]
    return (rows, cols // qk * nb), np.dtype(np.uint8), rows * (cols // qk) * nb, DTYPES[dtype]


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


class Lazy:
    """A tensor made when called (--init-std): its shape is known up front."""

    def __init__(self, shape, fn):
        self.shape, self.fn = tuple(shape), fn

    def __call__(self):
        return self.fn()


def value(x):
    return x() if isinstance(x, Lazy) else x


def make_weights_init_std(a):
    """HF state_dict of --init-std: 2-D weights N(0, S^2), float32, each from
    its own stream (seed, name) and made only when the file is written; norms 1."""
    hd = a.head_dim
    std = np.float32(a.init_std)

    def lin(name, out_f, in_f):
        def make():
            rng = np.random.default_rng([a.seed, 0x1D57D, zlib.crc32(name.encode())])
            x = rng.standard_normal((out_f, in_f), dtype=np.float32)
            x *= std
            return x
        return Lazy((out_f, in_f), make)

    shapes = {"model.embed_tokens.weight": (a.vocab, a.dim)}
    for i in range(a.layers):
        p = f"model.layers.{i}."
        shapes.update({p + "self_attn.q_proj.weight": (a.heads * hd, a.dim),
                       p + "self_attn.k_proj.weight": (a.kv_heads * hd, a.dim),
                       p + "self_attn.v_proj.weight": (a.kv_heads * hd, a.dim),
                       p + "self_attn.o_proj.weight": (a.dim, a.heads * hd),
                       p + "mlp.gate_proj.weight": (a.ffn, a.dim),
                       p + "mlp.up_proj.weight": (a.ffn, a.dim),
                       p + "mlp.down_proj.weight": (a.dim, a.ffn)})
    if not a.tied:
        shapes["lm_head.weight"] = (a.vocab, a.dim)
    w = {name: lin(name, *shape) for name, shape in shapes.items()}
    ones = np.ones(a.dim, dtype=np.float32)
    for i in range(a.layers):
        p = f"model.layers.{i}."
        w[p + "input_layernorm.weight"] = ones
        w[p + "post_attention_layernorm.weight"] = ones
        if a.arch == "qwen2":
            for n, rows in (("q", a.heads * hd), ("k", a.kv_heads * hd), ("v", a.kv_heads * hd)):
                w[p + f"self_attn.{n}_proj.bias"] = np.zeros(rows, dtype=np.float32)
        if a.arch == "qwen3":
            for n in ("q", "k"):
                w[p + f"self_attn.{n}_norm.weight"] = np.ones(hd, dtype=np.float32)
    w["model.norm.weight"] = ones
    return w


def make_weights(a, rng):
    """HF state_dict (float32). Projections use std 1/sqrt(fan_in) so that
    activations stay O(1); embeddings use 2/sqrt(dim) so that (tied) logits
    have a spread of a couple of units rather than all being ~equal. The
    tensors only Qwen has (biases, q_norm/k_norm) come from a second stream so
    that a llama file's values do not depend on them."""
    if a.arch == "gemma3":
        return gemma3_weights(a, rng)
    hd = a.head_dim
    extra = np.random.default_rng([a.seed, 0x9E3779B9])

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
        if a.arch == "qwen2":
            # Real Qwen2 biases are large next to the weights (q/k ones above
            # all); 0.5 makes a missing bias show in every logit.
            for n, rows in (("q", a.heads * hd), ("k", a.kv_heads * hd), ("v", a.kv_heads * hd)):
                w[p + f"self_attn.{n}_proj.bias"] = (0.5 * extra.standard_normal(rows)).astype(np.float32)
        if a.arch == "qwen3":
            for n in ("q", "k"):
                w[p + f"self_attn.{n}_norm.weight"] = (1.0 + 0.3 * extra.standard_normal(hd)).astype(np.float32)
    w["model.norm.weight"] = norm()
    if not a.tied:
        w["lm_head.weight"] = (rng.standard_normal((a.vocab, a.dim)) * 2 / np.sqrt(a.dim)).astype(np.float32)
    return w


def llama3_divisors(theta, head_dim, factor, low, high, orig):
    """rope_freqs.weight as convert_hf_to_gguf.py writes it for rope_type
    "llama3": for each inv_i = theta^(-2i/d), wavelength wl = 2 pi / inv_i,
    divisor 1 if wl < orig/high, FACTOR if wl > orig/low, otherwise
    1 / ((1 - s)/FACTOR + s) with s = (orig/wl - low)/(high - low). Computed in
    float64 (the converter uses float32 frequencies; the stored float32 values
    agree except perhaps in the last bit), stored as float32."""
    out = np.empty(head_dim // 2, dtype=np.float64)
    for i in range(head_dim // 2):
        inv = float(theta) ** (-2.0 * i / head_dim)
        wl = 2.0 * np.pi / inv
        if wl < orig / high:
            out[i] = 1.0
        elif wl > orig / low:
            out[i] = factor
        else:
            sm = (orig / wl - low) / (high - low)
            out[i] = 1.0 / ((1.0 - sm) / factor + sm)
    return out.astype(np.float32)


def gguf_tensors(a, hf):
    """[(gguf name, hf name or None, array in GGUF row order, permute heads or 0)].
    Q/K are permuted only for llama (llama.cpp's LLAMA rope type is the
    interleaved one; qwen2/qwen3 are NEOX, HF's rotate-half)."""
    if a.arch == "gemma3":
        return gemma3_tensors(a, hf)
    perm = a.arch == "llama"
    out = [("token_embd.weight", "model.embed_tokens.weight", 0)]
    for i in range(a.layers):
        p, b = f"model.layers.{i}.", f"blk.{i}."
        out += [
            (b + "attn_norm.weight", p + "input_layernorm.weight", 0),
            (b + "attn_q.weight", p + "self_attn.q_proj.weight", a.heads if perm else 0),
            (b + "attn_k.weight", p + "self_attn.k_proj.weight", a.kv_heads if perm else 0),
            (b + "attn_v.weight", p + "self_attn.v_proj.weight", 0),
        ]
        if a.arch == "qwen2":
            out += [(b + f"attn_{n}.bias", p + f"self_attn.{n}_proj.bias", 0) for n in "qkv"]
        out.append((b + "attn_output.weight", p + "self_attn.o_proj.weight", 0))
        if a.arch == "qwen3":
            out += [(b + f"attn_{n}_norm.weight", p + f"self_attn.{n}_norm.weight", 0) for n in "qk"]
        out += [
            (b + "ffn_norm.weight", p + "post_attention_layernorm.weight", 0),
            (b + "ffn_gate.weight", p + "mlp.gate_proj.weight", 0),
            (b + "ffn_up.weight", p + "mlp.up_proj.weight", 0),
            (b + "ffn_down.weight", p + "mlp.down_proj.weight", 0),
        ]
    out.append(("output_norm.weight", "model.norm.weight", 0))
    if not a.tied:
        out.append(("output.weight", "lm_head.weight", 0))
    def perm(x, n):
        if isinstance(x, Lazy):
            return Lazy(x.shape, lambda: permute(x(), n))
        return permute(x, n)

    tensors = [(g, h, perm(hf[h], n) if n else hf[h], n) for g, h, n in out]
    if a.rope_scaling and a.rope_scaling[0] == "llama3":
        # The converter yields it before the model's own tensors.
        tensors.insert(0, ("rope_freqs.weight", None, llama3_divisors(a.rope_theta, a.head_dim, *a.rope_scaling[1:]), 0))
    return tensors


# --------------------------------------------------------------------------
# Gemma 3 (--arch gemma3): llama.cpp src/models/gemma3.cpp, HF Gemma3DecoderLayer.

GEMMA3_SWA_PERIOD = 6             # layer i is local when i % 6 < 5 (llama.cpp's default, HF's sliding_window_pattern)
GEMMA3_LOCAL_THETA = 10000.0      # local layers' RoPE base (llama.cpp's default, HF's rope_local_base_freq)

# (GGUF name, HF name) per layer, in the order the tensors are written.
GEMMA3_LAYER = [
    ("attn_norm.weight", "input_layernorm.weight"),
    ("attn_q.weight", "self_attn.q_proj.weight"),
    ("attn_k.weight", "self_attn.k_proj.weight"),
    ("attn_v.weight", "self_attn.v_proj.weight"),
    ("attn_q_norm.weight", "self_attn.q_norm.weight"),
    ("attn_k_norm.weight", "self_attn.k_norm.weight"),
    ("attn_output.weight", "self_attn.o_proj.weight"),
    ("post_attention_norm.weight", "post_attention_layernorm.weight"),
    ("ffn_norm.weight", "pre_feedforward_layernorm.weight"),
    ("ffn_gate.weight", "mlp.gate_proj.weight"),
    ("ffn_up.weight", "mlp.up_proj.weight"),
    ("ffn_down.weight", "mlp.down_proj.weight"),
    ("post_ffw_norm.weight", "post_feedforward_layernorm.weight"),
]


def norm_shift(a, hf_name):
    """What the GGUF adds to an HF tensor: 1 for every Gemma 3 `*norm.weight`
    (convert_hf_to_gguf.py's Gemma3Model.norm_shift), else 0."""
    return 1.0 if a.arch == "gemma3" and hf_name is not None and hf_name.endswith("norm.weight") else 0.0


def gemma3_weights(a, rng):
    """HF state_dict (float32) of a Gemma 3 text model. Projections and
    embeddings as for the other families (the embeddings are scaled by
    sqrt(dim) in the forward pass). Norm weights are HF's w (the layer
    multiplies by 1 + w): multiples of 1/64 in [-0.5, 1], spread 0.25, so
    that w + 1 and (w + 1) - 1 are exact in float32 and in bf16."""
    hd = a.head_dim

    def lin(out_f, in_f):
        return (rng.standard_normal((out_f, in_f)) / np.sqrt(in_f)).astype(np.float32)

    def norm(n):
        k = np.clip(np.round(16.0 * rng.standard_normal(n)), -32, 64)
        return (k / 64.0).astype(np.float32)

    w = {"model.embed_tokens.weight": (rng.standard_normal((a.vocab, a.dim)) * 2 / np.sqrt(a.dim)).astype(np.float32)}
    for i in range(a.layers):
        p = f"model.layers.{i}."
        w[p + "input_layernorm.weight"] = norm(a.dim)
        w[p + "self_attn.q_proj.weight"] = lin(a.heads * hd, a.dim)
        w[p + "self_attn.k_proj.weight"] = lin(a.kv_heads * hd, a.dim)
        w[p + "self_attn.v_proj.weight"] = lin(a.kv_heads * hd, a.dim)
        w[p + "self_attn.q_norm.weight"] = norm(hd)
        w[p + "self_attn.k_norm.weight"] = norm(hd)
        w[p + "self_attn.o_proj.weight"] = lin(a.dim, a.heads * hd)
        w[p + "post_attention_layernorm.weight"] = norm(a.dim)
        w[p + "pre_feedforward_layernorm.weight"] = norm(a.dim)
        w[p + "mlp.gate_proj.weight"] = lin(a.ffn, a.dim)
        w[p + "mlp.up_proj.weight"] = lin(a.ffn, a.dim)
        w[p + "mlp.down_proj.weight"] = lin(a.dim, a.ffn)
        w[p + "post_feedforward_layernorm.weight"] = norm(a.dim)
    w["model.norm.weight"] = norm(a.dim)
    return w


def gemma3_tensors(a, hf):
    """gguf_tensors for gemma3: no permutation (NEOX RoPE), every norm + 1, tied."""
    out = [("token_embd.weight", "model.embed_tokens.weight")]
    for i in range(a.layers):
        out += [(f"blk.{i}.{g}", f"model.layers.{i}.{h}") for g, h in GEMMA3_LAYER]
    out.append(("output_norm.weight", "model.norm.weight"))
    return [(g, h, (hf[h] + np.float32(norm_shift(a, h))).astype(np.float32), 0) for g, h in out]


def gemma3_config(a):
    """config.json of a Gemma3ForCausalLM (transformers' Gemma3TextConfig names)."""
    return {
        "architectures": ["Gemma3ForCausalLM"],
        "model_type": "gemma3_text",
        "hidden_size": a.dim,
        "intermediate_size": a.ffn,
        "num_attention_heads": a.heads,
        "num_key_value_heads": a.kv_heads,
        "head_dim": a.head_dim,
        "num_hidden_layers": a.layers,
        "vocab_size": a.vocab,
        "max_position_embeddings": a.ctx,
        "rms_norm_eps": a.eps,
        "rope_theta": a.rope_theta,
        "rope_local_base_freq": GEMMA3_LOCAL_THETA,
        "rope_scaling": None,
        "sliding_window": a.sliding_window,
        "sliding_window_pattern": GEMMA3_SWA_PERIOD,
        "layer_types": ["sliding_attention" if i % GEMMA3_SWA_PERIOD < GEMMA3_SWA_PERIOD - 1 else "full_attention"
                        for i in range(a.layers)],
        # llama.cpp scales q by 1/sqrt(head_dim) for every size but the 27B; HF by query_pre_attn_scalar^-0.5
        "query_pre_attn_scalar": a.head_dim,
        "hidden_activation": "gelu_pytorch_tanh",
        "attn_logit_softcapping": None,
        "final_logit_softcapping": None,
        "attention_bias": False,
        "use_bidirectional_attention": False,
        "tie_word_embeddings": True,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "pad_token_id": 2,
        "torch_dtype": {"f32": "float32", "bf16": "bfloat16"}[a.hf_dtype],
    }


def bf16_round(x):
    """float32 values rounded to the nearest bf16 (ties to even), as float32."""
    bits = quant_bf16(np.atleast_2d(x)).view(np.uint16).astype(np.uint32) << 16
    return bits.view(np.float32).reshape(np.shape(x))


# --------------------------------------------------------------------------

def parse_rope_scaling(text):
    """'llama3:FACTOR:LOW:HIGH:ORIG' -> ('llama3', f, low, high, orig); 'linear:FACTOR' -> ('linear', f)."""
    parts = text.split(":")
    try:
        if parts[0] == "llama3" and len(parts) == 5:
            f, lo, hi, orig = float(parts[1]), float(parts[2]), float(parts[3]), int(parts[4])
            if f >= 1 and 0 < lo < hi and orig > 0:
                return ("llama3", f, lo, hi, orig)
        elif parts[0] == "linear" and len(parts) == 2:
            f = float(parts[1])
            if f > 0:
                return ("linear", f)
    except ValueError:
        pass
    raise argparse.ArgumentTypeError(
        f"{text!r}: expected llama3:FACTOR:LOW:HIGH:ORIG (FACTOR >= 1, 0 < LOW < HIGH, ORIG > 0) or linear:FACTOR")


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True)
    p.add_argument("--arch", default="llama", choices=list(ARCHS))
    p.add_argument("--dtype", default="f32", choices=sorted(DTYPES))
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--kv-heads", type=int, default=2)
    p.add_argument("--head-dim", type=int, default=0, help="per-head size (default dim/heads)")
    p.add_argument("--ffn", type=int, default=128)
    p.add_argument("--vocab", type=int, default=300)
    p.add_argument("--ctx", type=int, default=256)
    p.add_argument("--rope-theta", type=float, default=10000.0)
    p.add_argument("--rope-scaling", type=parse_rope_scaling, default=None,
                   help="llama3:FACTOR:LOW:HIGH:ORIG or linear:FACTOR")
    p.add_argument("--eps", type=float, default=1e-5)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--init-std", type=float, default=0.0,
                   help="2-D weights N(0, S^2), norms 1, made tensor by tensor (default: the tiny-model scales)")
    p.add_argument("--alignment", type=int, default=0, help="write general.alignment (power of two)")
    p.add_argument("--version", type=int, default=3, choices=[2, 3])
    p.add_argument("--pre", default=None, help="tokenizer.ggml.pre (default: by family)")
    p.add_argument("--sliding-window", type=int, default=None,
                   help="gemma3: tokens a local layer's query sees, itself included (default 8)")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--tied", dest="tied", action="store_true", default=True)
    g.add_argument("--untied", dest="tied", action="store_false")
    p.add_argument("--expect-out")
    p.add_argument("--hf-out")
    p.add_argument("--hf-dir")
    p.add_argument("--hf-dtype", default="f32", choices=["f32", "bf16"])
    a = p.parse_args(argv)
    need = len(CONTROL_TOKENS) + 256
    if a.vocab < need:
        p.error(f"--vocab must be at least {need} (control + byte tokens)")
    explicit_hd = a.head_dim != 0
    if not explicit_hd:
        if a.dim % a.heads:
            p.error("--dim must be a multiple of --heads (or give --head-dim)")
        a.head_dim = a.dim // a.heads
    if a.head_dim <= 0 or a.head_dim % 2 or a.heads % a.kv_heads:
        p.error("the head dim must be even and positive, and --heads a multiple of --kv-heads")
    if a.arch == "qwen2" and a.heads * a.head_dim != a.dim:
        p.error("qwen2 needs heads * head_dim == dim (llama.cpp's qwen2 loader shapes attn_q as [dim, dim])")
    q_width = a.heads * a.head_dim
    qk = BLOCK.get(a.dtype)
    if qk and (a.dim % qk or a.ffn % qk or q_width % qk):
        p.error(f"{a.dtype} needs --dim, --ffn and heads*head_dim to be multiples of {qk} (the block size)")
    if a.alignment and (a.alignment & (a.alignment - 1)):
        p.error("--alignment must be a power of two")
    if a.rope_scaling and a.rope_scaling[0] == "llama3" and a.arch != "llama":
        p.error("llama3 rope scaling is for --arch llama only (llama.cpp's qwen graphs ignore rope_freqs "
                "and its loader rejects the unused tensor)")
    if a.init_std < 0:
        p.error("--init-std must be >= 0")
    if a.hf_dtype == "bf16" and a.dtype not in ("f32", "bf16"):
        p.error("--hf-dtype bf16 needs --dtype f32 or bf16 (other dtypes' values are not bf16-exact)")
    if a.arch == "gemma3":
        if a.sliding_window is None:
            a.sliding_window = 8
        if a.sliding_window < 1:
            p.error("--sliding-window must be at least 1")
        if not a.tied:
            p.error("gemma3 is tied (llama.cpp would take an output.weight, the HF class has no lm_head)")
        if a.rope_scaling:
            p.error("--rope-scaling is not written for gemma3")
    elif a.sliding_window is not None:
        p.error("--sliding-window is for --arch gemma3")
    # llama keeps its original keys (no key_length unless the head dim is not dim/heads).
    a.write_head_dim = a.arch in ("qwen3", "gemma3") or a.head_dim * a.heads != a.dim
    if a.pre is None:
        a.pre = ("qwen2" if a.arch in ("qwen2", "qwen3") else "smollm" if a.arch == "gemma3"
                 else "llama-bpe" if a.rope_scaling and a.rope_scaling[0] == "llama3" else "smollm")
    return a


def main(argv):
    a = parse_args(argv)
    if a.init_std > 0:
        hf = make_weights_init_std(a)
    else:
        hf = make_weights(a, np.random.default_rng(a.seed))
    if a.hf_dtype == "bf16":
        hf = {k: (Lazy(v.shape, lambda v=v: bf16_round(v())) if isinstance(v, Lazy) else bf16_round(v))
              for k, v in hf.items()}
    tokens, merges = train_bpe(a.vocab)
    hd = a.head_dim

    w = gguf.GGUFWriter(a.out, arch=a.arch)
    if a.alignment:
        w.add_custom_alignment(a.alignment)
    w.add_name(f"tiny-{a.arch}-{a.dtype}")
    w.add_file_type(FILE_TYPES[a.dtype])
    w.add_context_length(a.ctx)
    w.add_embedding_length(a.dim)
    w.add_block_count(a.layers)
    w.add_feed_forward_length(a.ffn)
    w.add_head_count(a.heads)
    w.add_head_count_kv(a.kv_heads)
    w.add_layer_norm_rms_eps(a.eps)
    w.add_rope_freq_base(a.rope_theta)
    if a.arch == "llama":          # the converter writes it for Llama only
        w.add_rope_dimension_count(hd)
    if a.write_head_dim:
        w.add_key_length(hd)
        w.add_value_length(hd)
    if a.rope_scaling and a.rope_scaling[0] == "linear":
        w.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        w.add_rope_scaling_factor(a.rope_scaling[1])
    if a.arch == "gemma3":        # the pattern (6) and the local base (10000) are llama.cpp's defaults
        w.add_sliding_window(a.sliding_window)
    w.add_vocab_size(len(tokens))
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(a.pre)
    w.add_token_list(tokens)
    w.add_token_types([3] * len(CONTROL_TOKENS) + [1] * (len(tokens) - len(CONTROL_TOKENS)))
    w.add_token_merges(merges)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_unk_token_id(0)
    w.add_pad_token_id(2)
    w.add_add_bos_token(False)
    w.add_chat_template(CHATML)

    # Tensor infos first, then each tensor is made, encoded and written in
    # turn (what add_tensor + write_tensors_to_file write, without holding
    # every tensor in memory).
    tensors = gguf_tensors(a, hf)
    del hf
    for name, _, arr, _ in tensors:
        if len(arr.shape) == 1:                              # norms, biases, rope_freqs stay F32
            w.add_tensor_info(name, arr.shape, np.dtype(np.float32), arr.shape[0] * 4)
        else:
            shape, npt, nbytes, raw = encoded_spec(arr.shape, a.dtype)
            w.add_tensor_info(name, shape, npt, nbytes, raw_dtype=raw)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    for name, _, arr, _ in tensors:
        if len(arr.shape) == 1:
            w.write_tensor_data(np.ascontiguousarray(arr, dtype=np.float32))
        else:
            data, _ = encode(value(arr), a.dtype)
            w.write_tensor_data(data)
    w.close()

    if a.expect_out or a.hf_out or a.hf_dir:
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
        names += ["blk.0.attn_q.bias", "blk.0.attn_k.bias", "blk.0.attn_v.bias"] if a.arch == "qwen2" else []
        names += ["blk.0.attn_q_norm.weight", "blk.0.attn_k_norm.weight"] if a.arch in ("qwen3", "gemma3") else []
        names += ["blk.0.post_attention_norm.weight", "blk.0.post_ffw_norm.weight"] if a.arch == "gemma3" else []
        names += ["rope_freqs.weight"] if "rope_freqs.weight" in by_name else []
        for n in names:
            values(n).astype("<f4").tofile(os.path.join(a.expect_out, n + ".f32"))
        meta = {"dtype": a.dtype, "layers": a.layers, "dim": a.dim, "heads": a.heads, "kv_heads": a.kv_heads,
                "head_dim": a.head_dim, "ffn": a.ffn, "vocab": a.vocab, "ctx": a.ctx,
                "rope_theta": a.rope_theta, "eps": a.eps, "seed": a.seed, "tied": a.tied, "version": a.version,
                "alignment": a.alignment or 32, "bos": 1, "eos": 2, "expected": names}
        if a.arch != "llama":               # llama's meta.json stays as it was
            meta["arch"] = a.arch
        if a.rope_scaling:
            meta["rope_scaling"] = list(a.rope_scaling)
        if a.arch == "gemma3":
            meta["sliding_window"] = a.sliding_window
        with open(os.path.join(a.expect_out, "meta.json"), "w") as f:
            json.dump(meta, f, indent=1)
            f.write("\n")
    if a.hf_out or a.hf_dir:
        state = {h: (unpermute(values(g).reshape(arr.shape), n) if n else values(g).reshape(arr.shape))
                 for g, h, arr, n in tensors if h is not None}
        for h in state:                      # Gemma 3 norms: the file holds 1 + w, HF w (exact: see gemma3_weights)
            if norm_shift(a, h):
                state[h] = (state[h] - np.float32(norm_shift(a, h))).astype(np.float32)
        if a.hf_out:
            np.savez(a.hf_out, **state)
        if a.hf_dir:
            write_hf_dir(a, state)


# --------------------------------------------------------------------------
# Hugging Face folder: config.json + model.safetensors

def hf_config(a):
    if a.arch == "gemma3":
        return gemma3_config(a)
    arch = ARCHS[a.arch]
    rs = None
    if a.rope_scaling and a.rope_scaling[0] == "llama3":
        _, f, lo, hi, orig = a.rope_scaling
        rs = {"rope_type": "llama3", "factor": f, "low_freq_factor": lo, "high_freq_factor": hi,
              "original_max_position_embeddings": orig}
    elif a.rope_scaling:
        rs = {"rope_type": "linear", "factor": a.rope_scaling[1]}
    c = {
        "architectures": [arch],
        "model_type": a.arch,
        "hidden_size": a.dim,
        "intermediate_size": a.ffn,
        "num_attention_heads": a.heads,
        "num_key_value_heads": a.kv_heads,
        "num_hidden_layers": a.layers,
        "head_dim": a.head_dim,
        "vocab_size": a.vocab,
        "max_position_embeddings": a.ctx,
        "rms_norm_eps": a.eps,
        "rope_theta": a.rope_theta,
        "rope_scaling": rs,
        "tie_word_embeddings": a.tied,
        "hidden_act": "silu",
        "bos_token_id": 1,
        "eos_token_id": 2,
        "torch_dtype": {"f32": "float32", "bf16": "bfloat16"}[a.hf_dtype],
    }
    if a.arch == "llama":
        c.update(attention_bias=False, mlp_bias=False)
    elif a.arch == "qwen2":
        # Qwen2's q/k/v biases are hard-coded in HF (no flag); the sliding
        # window is configured but off, as in the released checkpoints.
        c.update(use_sliding_window=False, sliding_window=a.ctx, max_window_layers=a.layers)
    else:
        c.update(attention_bias=False, use_sliding_window=False, sliding_window=None)
    return c


def write_safetensors(path, state, dtype):
    """The safetensors format: u64 little-endian header length, a JSON header
    {name: {dtype, shape, data_offsets [begin, end) into the data}}, padded with
    spaces to a multiple of 8, then the raw little-endian tensor bytes."""
    header, blobs, off = {"__metadata__": {"format": "pt"}}, [], 0
    for name, arr in state.items():
        x = np.ascontiguousarray(arr, dtype="<f4")
        if dtype == "bf16":
            bits = x.view("<u4")
            if (bits & 0xFFFF).any():
                raise ValueError(f"{name}: values are not bf16-exact")
            raw = (bits >> 16).astype("<u2").tobytes()
        else:
            raw = x.tobytes()
        header[name] = {"dtype": "BF16" if dtype == "bf16" else "F32", "shape": list(x.shape),
                        "data_offsets": [off, off + len(raw)]}
        blobs.append(raw)
        off += len(raw)
    text = json.dumps(header, separators=(",", ":")).encode("utf-8")
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(len(text).to_bytes(8, "little"))
        f.write(text)
        for b in blobs:
            f.write(b)


def write_hf_dir(a, state):
    os.makedirs(a.hf_dir, exist_ok=True)
    with open(os.path.join(a.hf_dir, "config.json"), "w") as f:
        json.dump(hf_config(a), f, indent=2)
        f.write("\n")
    write_safetensors(os.path.join(a.hf_dir, "model.safetensors"), state, a.hf_dtype)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
