#!/usr/bin/env bash
# The main job until the daemon exists: a small batch of rollouts from the
# default model through the offline engine, printed with per-token log-probs.
set -euo pipefail
cd "$(dirname "$0")/.."
MODEL=${1:-models/SmolLM2-135M-Instruct.Q4_1.gguf}
PY=${PYTHON:-python3}

for q in "What is 12 + 7? Answer with a number." "Name a colour of the sky."; do
  echo "=== prompt: $q  (chat template, n=4, temperature 0.8, top_p 0.95, seed 42)"
  build/rollout-gen --model "$MODEL" --prompt "$q" --chat -n 4 --max-tokens 32 \
      --temperature 0.8 --top-p 0.95 --seed 42 --json |
    "$PY" -c '
import json, sys
for line in sys.stdin:
    r = json.loads(line)
    lp = r["logprobs"]
    print(f"--- sample {r[\"sample\"]}  finish={r[\"finish_reason\"]}  tokens={len(r[\"token_ids\"])}  "
          f"sum logprob={sum(lp):.3f}")
    print("    text:", r["text"].replace("\n", " "))
    print("    first tokens (id: logprob):",
          ", ".join(f"{t}: {l:.3f}" for t, l in list(zip(r["token_ids"], lp))[:8]))
'
done
