#!/usr/bin/env bash
# make bench-moe: decode tokens/s of a Qwen3-30B-A3B-shaped mixture of
# experts with 4 layers, in Q4_K and in Q8_0, at batch 1, 8, 32 and 64,
# rolloutd's engine next to llama.cpp on the same file and thread count
# (tools/bench_decode.sh: alternating rounds on a quiet machine), with the
# bytes a step reads against the machine's memory bandwidth.
#   tools/bench_moe.sh [THREADS]        (default 2)
#   env: DTYPES (default "q4_k q8_0"), BATCHES (default "1 8 32 64"), LAYERS
#        (default 4), PYTHON, LLAMA_ARGS (more bench_llamacpp.py flags, e.g.
#        --no-extra-bufts), ENGINE_ONLY=1 (no llama.cpp), and bench_decode.sh's
#        ROUNDS, QUIET, QUIET_WAIT
# The files (tools/gen_moe_model.py: hidden 2048, 32 / 4 heads of 128, 128
# experts, top 8, expert FFN 768, vocab 151,936, untied head; random codes
# behind fixed block scales, a random F32 router) are generated once under
# build/ and reused while the generator is older than them (~15 s and 1.8 GB
# for Q4_K, ~40 s and 3.3 GB for Q8_0).
# Before the rounds, tools/rollout-membw measures the read bandwidth on a
# quiet machine (the roofline). The engine records its routes (--routes:
# distinct experts per layer per step) and llama.cpp is fed random next tokens
# (--next random), the kind of token stream the engine's temperature-1 draws
# give on this random model, so both route to as many experts.
# If llama.cpp dies on a file (the AMX crash of some builds), the script says
# so and measures the engine alone (ENGINE_ONLY) for that file.
# Writes build/bench-moe-<dtype>.json (bench_decode.sh's), build/bench-moe.json
# (all of it) and prints a table.
set -euo pipefail
cd "$(dirname "$0")/.."
THREADS=${1:-2}
DTYPES=${DTYPES:-q4_k q8_0}
BATCHES=${BATCHES:-1 8 32 64}
LAYERS=${LAYERS:-4}
PY=${PYTHON:-python3}
QUIET=${QUIET:-0.4}
QUIET_WAIT=${QUIET_WAIT:-300}
GEN=tools/gen_moe_model.py
mkdir -p build

model_of() { echo "build/qwen3moe-30b-a3b-shape-${LAYERS}l-synth-$1.gguf"; }
for dt in $DTYPES; do
  m=$(model_of "$dt")
  if [ ! -f "$m" ] || [ "$GEN" -nt "$m" ]; then
    need=$(( LAYERS * 1100 + 800 ))                       # MB, Q8_0 (Q4_K: about half)
    avail=$(df -Pm build | awk 'NR == 2 {print $4}')
    [ "$avail" -gt "$need" ] || { echo "bench-moe: $avail MB free under build/, $m needs ~$need MB" >&2; exit 1; }
    echo "bench-moe: generating $m" >&2
    "$PY" "$GEN" --out "$m.tmp" --dtype "$dt" --layers "$LAYERS"
    mv "$m.tmp" "$m"
  fi
done

busy() { awk '/^cpu /{print $2 + $3 + $4 + $7 + $8}' /proc/stat; }
wait_quiet() {
  local t=0 b0 o
  while [ "$t" -lt "$QUIET_WAIT" ]; do
    b0=$(busy); sleep 2; t=$((t + 2))
    o=$(awk -v d=$(($(busy) - b0)) 'BEGIN{printf "%.2f", d / 200}')
    if awk -v o="$o" -v q="$QUIET" 'BEGIN{exit !(o <= q)}'; then return 0; fi
  done
  echo "    still busy after ${QUIET_WAIT}s; measuring anyway" >&2
}
wait_quiet
b0=$(busy)
/usr/bin/time -f '%e %U %S' -o build/bench-moe.membw.time build/rollout-membw --threads "$THREADS" --json \
  > build/bench-moe.membw.json
read -r wall usr sys < build/bench-moe.membw.time
other=$(awk -v d=$(($(busy) - b0)) -v w="$wall" -v u="$usr" -v s="$sys" \
  'BEGIN{o = (d / 100 - u - s) / w; printf "%.2f", o < 0 ? 0 : o}')
MEMBW=$("$PY" -c 'import json,sys; print(json.load(open(sys.argv[1]))["gb_per_s"])' build/bench-moe.membw.json)
echo "bench-moe: read bandwidth $MEMBW GB/s on $THREADS threads (other processes ~$other cores busy)" >&2

notes=()
for dt in $DTYPES; do
  m=$(model_of "$dt")
  only=${ENGINE_ONLY:-0}
  rc=0
  if [ "$only" != 1 ]; then
    # shellcheck disable=SC2086
    "$PY" tools/bench_llamacpp.py --model "$m" --threads "$THREADS" --batch 1 --prompt-len 4 --gen 2 --reps 1 \
      --warmup 0 ${LLAMA_ARGS:-} > "build/bench-moe-$dt.probe.log" 2>&1 || rc=$?
  fi
  if [ "$rc" != 0 ]; then
    why="exit status $rc$( [ "$rc" -gt 128 ] && echo ", signal $((rc - 128))"): $(tail -n 1 "build/bench-moe-$dt.probe.log" | cut -c1-100)"
    echo "bench-moe: llama.cpp failed on $m ($why); measuring the engine alone" >&2
    notes+=("$dt: llama.cpp from $("$PY" -c 'import llama_cpp, os; print(os.path.dirname(llama_cpp.__file__))' 2>&1) failed on the file, $why; engine alone")
    only=1
  fi
  BATCHES="$BATCHES" NAME=bench-moe-$dt ENGINE_ARGS="--routes" LLAMA_ARGS="--next random ${LLAMA_ARGS:-}" \
    MEMBW="$MEMBW" ENGINE_ONLY="$only" QUIET="$QUIET" QUIET_WAIT="$QUIET_WAIT" tools/bench_decode.sh "$m" "$THREADS"
done

DTYPES="$DTYPES" MEMBW_JSON=build/bench-moe.membw.json MEMBW_OTHER="$other" NOTES="$(printf '%s\n' "${notes[@]+"${notes[@]}"}")" \
  LLAMA_ARGS="${LLAMA_ARGS:-}" "$PY" - <<'PYEOF'
import json, os
dts = os.environ["DTYPES"].split()
bw = json.load(open(os.environ["MEMBW_JSON"]))
bw["other_cores"] = float(os.environ["MEMBW_OTHER"])
out = {"membw": bw, "notes": [n for n in os.environ["NOTES"].split("\n") if n],
       "llama_args": "--next random " + os.environ["LLAMA_ARGS"], "files": {}}
def f(x, fmt, scale=1, suffix=""):
    return "-" if x is None or x != x else format(x * scale, fmt) + suffix
print(f"\nbench-moe: read bandwidth {bw['gb_per_s']:.1f} GB/s ({bw['threads']} threads; 1 thread "
      f"{bw['gb_per_s_1_thread']:.1f})")
print(f"{'file':<6}{'batch':>6}{'rolloutd':>10}{'llama.cpp':>11}{'ratio':>7}{'med.step':>9}"
      f"{'experts/layer':>15}{'GB/step':>9}{'rd GB/s':>9}{'lc GB/s':>9}{'roofline':>10}{'rd %':>6}{'lc %':>6}")
for dt in dts:
    j = json.load(open(f"build/bench-moe-{dt}.json"))
    out["files"][dt] = j
    for k, s in j["summary"].items():
        r = s.get("moe_roofline", {})
        print(f"{dt:<6}{k.split('_')[1]:>6}{f(s['rolloutd'], '.1f'):>10}{f(s['llama_cpp'], '.1f'):>11}"
              f"{f(s['ratio'], '.2f', 1, 'x'):>7}{f(s['ratio_median_step'], '.2f', 1, 'x'):>9}"
              f"{f(r.get('experts_hit_per_layer'), '.1f'):>15}{f(r.get('bytes_per_step'), '.3f', 1e-9):>9}"
              f"{f(r.get('rolloutd_gb_per_s'), '.1f'):>9}{f(r.get('llama_cpp_gb_per_s'), '.1f'):>9}"
              f"{f(r.get('roofline_tokens_per_s'), '.1f'):>10}{f(r.get('rolloutd_of_roofline'), '.0f', 100):>6}"
              f"{f(r.get('llama_cpp_of_roofline'), '.0f', 100):>6}" + ("" if s["clean"] else "  (disturbed)"))
for n in out["notes"]:
    print("note:", n)
with open("build/bench-moe.json", "w") as fh:
    json.dump(out, fh, indent=1)
print("build/bench-moe.json")
PYEOF
