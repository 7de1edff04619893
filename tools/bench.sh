#!/usr/bin/env bash
# make bench: the engine's benchmark and llama.cpp's, in one run on the same
# model file and thread count, so the ratios compare like with like.
#   tools/bench.sh [MODEL] [THREADS]
# Writes build/bench.json and prints a table.
set -euo pipefail
cd "$(dirname "$0")/.."
MODEL=${1:-models/SmolLM2-135M-Instruct.Q4_1.gguf}
THREADS=${2:-$(nproc)}
PY=${PYTHON:-python3}

echo "rollout-bench: 64 requests x n=4, then decode at batch 1 and 32 ($THREADS threads)" >&2
ours=$(build/rollout-bench --model "$MODEL" --requests 64 --n 4 --threads "$THREADS" --decode-batches 1,32 --json)
echo "llama.cpp (llama-cpp-python): decode at batch 1 and 32 ($THREADS threads)" >&2
theirs=$("$PY" tools/bench_llamacpp.py --model "$MODEL" --threads "$THREADS" --batch 1,32 --prompt-len 32 --gen 64 --json | tail -n 1)

OURS="$ours" THEIRS="$theirs" "$PY" - <<'PYEOF'
import json, os
o = json.loads(os.environ["OURS"]); t = json.loads(os.environ["THEIRS"])
c, s = o["continuous"], o["static"]
print(f"{'mode':<12}{'tokens/s':>10}{'steps':>8}{'batch':>8}{'kv_peak':>9}{'kv_waste':>10}")
for name, r in (("continuous", c), ("static", s)):
    print(f"{name:<12}{r['tokens_per_s']:>10.1f}{r['decode_steps']:>8}{r['mean_batch']:>8.1f}"
          f"{r['kv_peak_blocks']:>9}{100*r['kv_waste_frac']:>9.2f}%")
print(f"speedup continuous/static: {o['speedup']:.2f}x")
print(f"{'decode':<12}{'rolloutd':>10}{'llama.cpp':>11}{'ratio':>8}")
out = {"rollout_bench": o, "llama_cpp": t, "decode_ratio": {}}
for b in (1, 32):
    ours = o["decode_tokens_per_s"][f"batch_{b}"]
    theirs = t[f"batch_{b}"]["decode_tokens_per_s"]
    out["decode_ratio"][f"batch_{b}"] = ours / theirs
    print(f"batch {b:<6}{ours:>10.1f}{theirs:>11.1f}{ours/theirs:>7.2f}x")
os.makedirs("build", exist_ok=True)
with open("build/bench.json", "w") as f:
    json.dump(out, f, indent=1)
PYEOF
