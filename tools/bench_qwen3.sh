#!/usr/bin/env bash
# make bench-qwen3: decode tokens/s of a synthetic Qwen3-0.6B-shaped GGUF at
# batch 1 and 32, rolloutd's engine (rollout-bench --decode-only) next to
# llama.cpp (tools/bench_llamacpp.py) on the same file and thread count.
#   tools/bench_qwen3.sh [THREADS]        (default: nproc)
#   env: ROUNDS (default 3), PRE (tokenizer.ggml.pre, default qwen2), PYTHON,
#        QUIET (default 0.4), QUIET_WAIT (default 300; 0: do not wait): see below
# The file (28 layers, hidden 1024, 16 heads, 8 KV heads, head_dim 128, FFN
# 3072, vocab 151,936, tied embeddings, rope theta 1e6, eps 1e-6, Q8_0 weights
# drawn from N(0, 0.02^2), norms 1) is generated once under build/ and reused
# while tools/gen_tiny_model.py is older than it (~15 s, ~1 GB of memory).
# The token ids of the benchmark prompts are random, so the pre-tokenizer does
# not matter for the numbers; "qwen2" is Qwen3's own and both loaders take it
# (the runs in docs/PERF.md of 2026-12-01 used "smollm", before our tokenizer
# had "qwen2": same weights, same outputs; llama.cpp has no "gpt2", it spells
# it "gpt-2").
# Each round runs, per batch size, the engine then llama.cpp (even rounds:
# llama.cpp first), each timing 64 decode steps after a 32-token prompt;
# llama.cpp runs one untimed repetition first. The summary is the median
# over rounds of each side's tokens/s, both as batch*steps/(total time) and as
# batch/(median step time), which a stall on a shared machine moves less.
# Each measurement also records how many cores other processes kept busy
# meanwhile ("other_cores": busy time in /proc/stat minus the benchmark's own
# CPU time, over its wall time): on a shared machine that says which rounds
# were disturbed. llama.cpp (OpenMP, spinning barriers) suffers far more from
# it than the engine's pool: with ~1 core kept busy by other work, its
# batch-32 rate fell 13x, the engine's 2.2x. (nice does not help against other
# sessions: with autogroup scheduling it only ranks processes of one session.)
# So before each measurement the script waits (up to QUIET_WAIT seconds) for
# a 2-second window in which other processes keep at most QUIET cores busy,
# and the summary of a batch size uses the rounds in which both sides'
# measurements of it stayed at or under QUIET ("clean"), or all rounds,
# flagged, when none did.
# Writes build/bench-qwen3.json and prints a table.
set -euo pipefail
cd "$(dirname "$0")/.."
THREADS=${1:-$(nproc)}
ROUNDS=${ROUNDS:-3}
PRE=${PRE:-qwen2}
PY=${PYTHON:-python3}
QUIET=${QUIET:-0.4}
QUIET_WAIT=${QUIET_WAIT:-300}
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

LOG=build/bench-qwen3.rounds.jsonl
TIMES=build/bench-qwen3.time
: > "$LOG"
busy() { awk '/^cpu /{print $2 + $3 + $4 + $7 + $8}' /proc/stat; }    # user nice system irq softirq, 1/100 s
wait_quiet() {
  local t=0 b0 o
  while [ "$t" -lt "$QUIET_WAIT" ]; do
    b0=$(busy); sleep 2; t=$((t + 2))
    o=$(awk -v d=$(($(busy) - b0)) 'BEGIN{printf "%.2f", d / 200}')
    if awk -v o="$o" -v q="$QUIET" 'BEGIN{exit !(o <= q)}'; then return 0; fi
    [ $((t % 30)) -ne 2 ] || echo "    waiting for a quiet machine (other processes: $o cores busy)" >&2
  done
  echo "    still busy after ${QUIET_WAIT}s; measuring anyway" >&2
}
measure() {   # round, batch, side, command...: runs it, appends a line to $LOG
  local round=$1 b=$2 side=$3 j b0 b1
  shift 3
  wait_quiet
  b0=$(busy)
  j=$(/usr/bin/time -f '%e %U %S' -o "$TIMES" "$@" | tail -n 1)
  b1=$(busy)
  read -r wall usr sys < "$TIMES"
  other=$(awk -v d=$((b1 - b0)) -v w="$wall" -v u="$usr" -v s="$sys" 'BEGIN{o = (d / 100 - u - s) / w; printf "%.2f", o < 0 ? 0 : o}')
  echo "{\"round\": $round, \"batch\": $b, \"side\": \"$side\", \"wall_s\": $wall, \"cpu_s\": $(awk -v u="$usr" -v s="$sys" 'BEGIN{print u + s}'), \"other_cores\": $other, \"r\": $j}" >> "$LOG"
}
ours() { measure "$1" "$2" rolloutd build/rollout-bench --model "$MODEL" --threads "$THREADS" --decode-only --decode-batches "$2" --json; }
theirs() {
  measure "$1" "$2" llama_cpp "$PY" tools/bench_llamacpp.py --model "$MODEL" --threads "$THREADS" --batch "$2" \
    --prompt-len 32 --gen 64 --reps 1 --warmup 1 --json
}

START=$(date -u +%FT%TZ)
echo "bench-qwen3: $MODEL, $THREADS threads, $ROUNDS rounds, load average $(cut -d' ' -f1-3 /proc/loadavg)" >&2
for r in $(seq 1 "$ROUNDS"); do
  for b in 1 32; do
    echo "  round $r batch $b" >&2
    if [ $((r % 2)) -eq 1 ]; then ours "$r" "$b"; theirs "$r" "$b"; else theirs "$r" "$b"; ours "$r" "$b"; fi
  done
done
END=$(date -u +%FT%TZ)

MODEL="$MODEL" THREADS="$THREADS" QUIET="$QUIET" START="$START" END="$END" LOG="$LOG" "$PY" - <<'PYEOF'
import json, os, platform, statistics
rows = [json.loads(l) for l in open(os.environ["LOG"])]
model = os.environ["MODEL"]
quiet = float(os.environ["QUIET"])
rounds = sorted({x["round"] for x in rows})
clean = {b: [r for r in rounds if all(x["other_cores"] <= quiet for x in rows if x["round"] == r and x["batch"] == b)]
         for b in (1, 32)}
used = {b: clean[b] or rounds for b in (1, 32)}

def rates(side, b):
    """[(tokens/s, median-step tokens/s, other processes' cores)] per round."""
    out = []
    for x in rows:
        if x["side"] != side or x["batch"] != b or x["round"] not in used[b]:
            continue
        r = x["r"]
        if side == "rolloutd":
            out.append((r["decode_tokens_per_s"][f"batch_{b}"], r["decode_tokens_per_s_median_step"][f"batch_{b}"],
                        x["other_cores"]))
        else:
            r = r[f"batch_{b}"]
            out.append((r["decode_tokens_per_s"], r["decode_tokens_per_s_median_step"], x["other_cores"]))
    return out

# Weight bytes a decode step streams (the roofline at small batch): rolloutd
# holds fp32 copies, llama.cpp the Q8_0 blocks (34 bytes per 32 weights).
L, D, H, KV, HD, F, V = 28, 1024, 16, 8, 128, 3072, 151936
per_layer = D * H * HD * 2 + D * KV * HD * 2 + 3 * D * F
params = L * per_layer + V * D                       # tied: the LM head is the embedding table
flops_per_token = 2 * params
summary = {}
for b in (1, 32):
    print(f"batch {b}: rounds {used[b]} of {rounds}" + ("" if clean[b] else
          f"  (WARNING: in no round were other processes at <= {quiet} busy cores on both sides; disturbed)"))
print(f"{'':<10}{'rolloutd':>10}{'llama.cpp':>11}{'ratio':>8}   {'median-step rate':>16}{'ratio':>8}"
      "   rounds: ours/theirs tok/s (other busy cores)")
for b in (1, 32):
    o, t = rates("rolloutd", b), rates("llama_cpp", b)
    om, tm = statistics.median(x[0] for x in o), statistics.median(x[0] for x in t)
    os_, ts_ = statistics.median(x[1] for x in o), statistics.median(x[1] for x in t)
    summary[f"batch_{b}"] = {"rounds_used": used[b], "clean": bool(clean[b]), "rolloutd": om, "llama_cpp": tm, "ratio": om / tm,
                            "rolloutd_median_step": os_, "llama_cpp_median_step": ts_, "ratio_median_step": os_ / ts_,
                            "rounds_rolloutd": o, "rounds_llama_cpp": t}
    per = " ".join(f"{a[0]:.1f}/{c[0]:.1f} ({a[2]:.1f}/{c[2]:.1f})" for a, c in zip(o, t))
    print(f"batch {b:<4}{om:>10.1f}{tm:>11.1f}{om / tm:>7.2f}x   {os_:>7.1f} /{ts_:>7.1f}{os_ / ts_:>7.2f}x   {per}")
for b in (1, 32):
    s = summary[f"batch_{b}"]
    print(f"batch {b}: GFLOP/s rolloutd {s['rolloutd'] * flops_per_token / 1e9:.1f}, "
          f"llama.cpp {s['llama_cpp'] * flops_per_token / 1e9:.1f}" +
          (f"; weight GB/s rolloutd {s['rolloutd'] * params * 4 / 1e9:.1f} (fp32 {params * 4 / 1e9:.2f} GB/step), "
           f"llama.cpp {s['llama_cpp'] * params * 34 / 32 / 1e9:.1f} (Q8_0 {params * 34 / 32 / 1e9:.2f} GB/step)"
           if b == 1 else ""))
out = {"model": model, "model_bytes": os.path.getsize(model), "threads": int(os.environ["THREADS"]),
       "start": os.environ["START"], "end": os.environ["END"], "host": platform.node(),
       "quiet_cores": quiet, "params": params, "flops_per_token": flops_per_token,
       "weight_bytes_per_step": {"rolloutd_fp32": params * 4, "llama_cpp_q8_0": params * 34 // 32},
       "summary": summary, "runs": rows}
with open("build/bench-qwen3.json", "w") as f:
    json.dump(out, f, indent=1)
print(f"{os.environ['START']} .. {os.environ['END']}; build/bench-qwen3.json")
PYEOF
