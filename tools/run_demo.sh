#!/usr/bin/env bash
# The main job's demo: builds what is missing, fetches the default model, starts
# rolloutd with it and runs GRPO-style rounds, with a weight push between them, through the Python client
# (tools/demo_learner.py), then shuts the daemon down cleanly.
#   tools/run_demo.sh [demo_learner.py flags]
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x build/rolloutd ] || make -j"$(nproc)" all
[ -f models/SmolLM2-135M-Instruct.Q4_1.gguf ] || make model
exec "${PYTHON:-python3}" tools/demo_learner.py "$@"
