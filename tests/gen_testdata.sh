#!/usr/bin/env bash
# Generates the tiny GGUF models the tests use into OUTDIR (default
# build/testdata):
#   tiny-<dtype>.gguf   for f32 f16 bf16 q8_0 q4_0 q4_1 q5_0 q5_1 (GGUF v3, tied embeddings)
#   tiny-<dtype>.gguf   for q4_k q5_k q6_k: the same with --dim 256 --ffn 512
#                       (K-quant rows are multiples of 256)
#   tiny-v2.gguf        q8_0, GGUF version 2, general.alignment = 64
#   tiny-untied.gguf    q4_0 with a separate output.weight
#   tiny-qwen2.gguf, tiny-qwen3.gguf, tiny-llama3.gguf, tiny-gemma3.gguf: one per family (and X.hf/)
#   tiny-moe-<dtype>.gguf and tiny-moe-<dtype>.hf/ for f32 f16 bf16 q8_0 q4_k_m: Qwen3-MoE
#                       (tests/py/moe_model.py: 16 experts, top 4; q4_k_m with dim 256)
#   lora/<model>-<variant>/  PEFT LoRA adapters (tools/gen_lora.py) for tiny-f32 (llama),
#                       tiny-qwen3, tiny-gemma3 and tiny-moe-f32: rank 8 to 64,
#                       attention-only, MLP-only and all-linear, f32 / f16 / bf16, rsLoRA,
#                       a regex target; four per dense family to serve at once; and the
#                       variants rolloutd refuses (DoRA, modules_to_save, lm_head, MoE experts)
# Next to each model X.gguf: X/ (expected dequantized values from the gguf
# package, meta.json with the config) and X.npz (the HF-layout state_dict).
# Deterministic (fixed seeds); a second run with nothing changed does nothing.
#   tests/gen_testdata.sh [OUTDIR]
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-build/testdata}
PY=${PYTHON:-python3}
GEN=tools/gen_tiny_model.py
STAMP=$OUT/.complete

MOE=tests/py/moe_model.py
LORA=tools/gen_lora.py
if [ -f "$STAMP" ] && [ "$STAMP" -nt "$GEN" ] && [ "$STAMP" -nt "$0" ] && [ "$STAMP" -nt "$MOE" ] &&
   [ "$STAMP" -nt "$LORA" ]; then
  exit 0
fi
mkdir -p "$OUT"
rm -f "$STAMP"

SHAPE=(--layers 2 --dim 64 --heads 4 --kv-heads 2 --ffn 128 --vocab 300 --ctx 256 --rope-theta 10000)
gen() {   # name, extra args...
  local name=$1; shift
  rm -rf "${OUT:?}/$name"
  "$PY" "$GEN" --out "$OUT/$name.gguf" "${SHAPE[@]}" --expect-out "$OUT/$name" --hf-out "$OUT/$name.npz" "$@"
}

pids=()
seed=1
for dt in f32 f16 bf16 q8_0 q4_0 q4_1; do
  gen "tiny-$dt" --dtype "$dt" --seed "$seed" & pids+=($!)
  seed=$((seed + 1))
done
# Appended after the loop above so that the earlier files keep their seeds.
gen tiny-q5_0 --dtype q5_0 --seed 7 & pids+=($!)
gen tiny-q5_1 --dtype q5_1 --seed 8 & pids+=($!)
KSHAPE=(--dim 256 --ffn 512)
seed=31
for dt in q4_k q5_k q6_k; do
  gen "tiny-$dt" "${KSHAPE[@]}" --dtype "$dt" --seed "$seed" & pids+=($!)
  seed=$((seed + 1))
done
gen tiny-v2 --dtype q8_0 --seed 11 --version 2 --alignment 64 & pids+=($!)
gen tiny-untied --dtype q4_0 --seed 12 --untied & pids+=($!)
# One per family (each with its HF folder X.hf/): Qwen2 with q|k|v biases,
# untied; Qwen3 with a q width (4 x 32) over hidden 64; Llama 3 RoPE scaling
# (rope_freqs.weight) with a context where all three frequency bands matter.
gen tiny-qwen2 --arch qwen2 --dtype q8_0 --untied --ctx 1024 --seed 21 --hf-dir "$OUT/tiny-qwen2.hf" & pids+=($!)
gen tiny-qwen3 --arch qwen3 --head-dim 32 --dtype f16 --ctx 1024 --seed 22 --hf-dir "$OUT/tiny-qwen3.hf" & pids+=($!)
# Gemma 3: 6 layers (5 local, 1 global), window 8, q width 4 x 32 over hidden 64.
gen tiny-gemma3 --arch gemma3 --layers 6 --kv-heads 1 --head-dim 32 --dtype q8_0 --ctx 1024 --rope-theta 1000000 \
  --eps 1e-6 --sliding-window 8 --seed 24 --hf-dir "$OUT/tiny-gemma3.hf" & pids+=($!)
gen tiny-llama3 --dtype q4_1 --rope-theta 500000 --rope-scaling llama3:8:1:4:64 --ctx 1024 --seed 23 \
  --hf-dir "$OUT/tiny-llama3.hf" & pids+=($!)
# Qwen3-MoE (its own generator; no X/ or X.npz, its HF folder holds the GGUF's values).
"$PY" "$MOE" "$OUT" --seed 41 >/dev/null & pids+=($!)

fail=0
for p in "${pids[@]}"; do
  wait "$p" || fail=1
done
if [ "$fail" -ne 0 ]; then
  echo "gen_testdata: generating a model failed" >&2
  exit 1
fi

# LoRA adapters, once their models exist (tests/unit/test_lora.c, tests/py/test_lora_load.py).
rm -rf "${OUT:?}/lora"
lora() {   # model, name, gen_lora.py args...
  local model=$1 name=$2; shift 2
  "$PY" "$LORA" --model "$OUT/$model.gguf" --out "$OUT/lora/$name" "$@" >/dev/null
}
pids=()
lora tiny-f32 tiny-f32-r8-attn --rank 8 --alpha 16 --targets attention --dtype f32 --seed 1 & pids+=($!)
lora tiny-f32 tiny-f32-r64-all --rank 64 --alpha 32 --targets all-linear --dtype bf16 --seed 2 & pids+=($!)
lora tiny-qwen3 tiny-qwen3-r8-attn-rslora --rank 8 --alpha 16 --rslora --targets attention --dtype f16 \
  --seed 3 & pids+=($!)
lora tiny-qwen3 tiny-qwen3-r64-all --rank 64 --alpha 64 --targets q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj \
  --dtype f32 --seed 4 & pids+=($!)
lora tiny-moe-f32 tiny-moe-r8-attn --rank 8 --alpha 8 --targets attention --dtype bf16 --seed 5 & pids+=($!)
lora tiny-moe-f32 tiny-moe-r64-attn --rank 64 --alpha 128 --rslora \
  --targets 're:model\.layers\.\d+\.self_attn\.[qkvo]_proj' --dtype f16 --seed 6 & pids+=($!)
# Served side by side in one batch (tests/unit/test_lora_engine.c): four per family, and Gemma 3's.
lora tiny-f32 tiny-f32-r16-mlp --rank 16 --alpha 16 --targets mlp --dtype f16 --seed 11 & pids+=($!)
lora tiny-f32 tiny-f32-r32-qv-rslora --rank 32 --alpha 8 --rslora --targets q_proj,v_proj --dtype f32 \
  --seed 12 & pids+=($!)
lora tiny-qwen3 tiny-qwen3-r16-mlp --rank 16 --alpha 32 --targets mlp --dtype bf16 --seed 13 & pids+=($!)
lora tiny-qwen3 tiny-qwen3-r32-all --rank 32 --alpha 32 --targets all-linear --dtype f16 --seed 14 & pids+=($!)
lora tiny-gemma3 tiny-gemma3-r8-all --rank 8 --alpha 16 --targets all-linear --dtype bf16 --seed 15 & pids+=($!)
lora tiny-gemma3 tiny-gemma3-r32-attn --rank 32 --alpha 16 --targets attention --dtype f32 --seed 16 & pids+=($!)
# Refused: all-linear on the MoE takes in its experts and router; DoRA; lm_head in full; LoRA on lm_head.
lora tiny-moe-f32 tiny-moe-r8-all --rank 8 --targets all-linear --seed 7 & pids+=($!)
lora tiny-f32 tiny-f32-dora --rank 8 --dora --seed 8 & pids+=($!)
lora tiny-f32 tiny-f32-modules-to-save --rank 8 --modules-to-save --seed 9 & pids+=($!)
lora tiny-f32 tiny-f32-lm-head --rank 8 --target lm_head --seed 10 & pids+=($!)
for p in "${pids[@]}"; do
  wait "$p" || fail=1
done
if [ "$fail" -ne 0 ]; then
  echo "gen_testdata: generating a LoRA adapter failed" >&2
  exit 1
fi
touch "$STAMP"
echo "gen_testdata: wrote $(ls "$OUT"/*.gguf | wc -l) models to $OUT"
