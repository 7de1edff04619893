#!/usr/bin/env bash
# make bench-qwen3: decode tokens/s of a synthetic Qwen3-0.6B-shaped GGUF at
# batch 1 and 32, rolloutd's engine next to llama.cpp on the same file and
# thread count (tools/bench_decode.sh: alternating rounds on a quiet machine).
#   tools/bench_qwen3.sh [THREADS]        (default: nproc)
#   env: PRE (tokenizer.ggml.pre, default qwen2), PYTHON, and bench_decode.sh's
#        ROUNDS, QUIET, QUIET_WAIT
# The file (28 layers, hidden 1024, 16 heads, 8 KV heads, head_dim 128, FFN
# 3072, vocab 151,936, tied embeddings, rope theta 1e6, eps 1e-6, Q8_0 weights
# drawn from N(0, 0.02^2), norms 1) is generated once under build/ and reused
# while tools/gen_tiny_model.py is older than it (~15 s, ~1 GB of memory).
# The token ids of the benchmark prompts are random, so the pre-tokenizer does
# not matter for the numbers; "qwen2" is Qwen3's own and both loaders take it
# (the runs in docs/PERF.md of 2026-12-01 before 11:00 used "smollm", before
# our tokenizer had "qwen2": same weights, same outputs; llama.cpp has no
# "gpt2", it spells it "gpt-2").
# Writes build/bench-qwen3.json and prints a table.
set -euo pipefail
cd "$(dirname "$0")/.."
THREADS=${1:-$(nproc)}
PRE=${PRE:-qwen2}
PY=${PYTHON:-python3}
GEN=tools/gen_tiny_model.py
MODEL=build/qwen3-0.6b-synth-q8_0-$PRE.gguf
SHAPE=(--arch qwen3 --dtype q8_0 --layers 28 --dim 1024 --heads 16 --kv-heads 8 --head-dim 128 --ffn 3072
       --vocab 151936 --ctx 40960 --rope-theta 1e6 --eps 1e-6 --init-std 0.02 --tied --seed 1 --pre "$PRE")

mkdir -p build
if [ ! -f "$MODEL" ] || [ "$GEN" -nt "$MODEL" ]; then
  echo "bench-qwen3: generating $MODEL" >&2
  "$PY" "$GEN" --out "$MODEL.tmp" "${SHAPE[@]}"
  mv "$MODEL.tmp" "$MODEL"
fi
BATCHES="1 32" NAME=bench-qwen3 exec tools/bench_decode.sh "$MODEL" "$THREADS"
