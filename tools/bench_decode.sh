#!/usr/bin/env bash
# Decode tokens/s of one GGUF at several batch sizes, rolloutd's engine
# (rollout-bench --decode-only) next to llama.cpp (tools/bench_llamacpp.py) on
# the same file and thread count, alternating, on a quiet machine.
#   tools/bench_decode.sh MODEL [THREADS]        (default threads: nproc)
#   env: BATCHES (default "1 32"), ROUNDS (default 3), WORKLOAD (rollout-bench
#        flags, e.g. "--requests 64 --n 4": first, the engine's continuous vs
#        static batching run on that workload), NAME (output stem,
#        default bench-decode: build/NAME.json), PYTHON, QUIET (default 0.4),
#        QUIET_WAIT (default 300; 0: do not wait): see below; ENGINE_ARGS and
#        LLAMA_ARGS (extra flags for rollout-bench and bench_llamacpp.py, e.g.
#        "--routes" and "--next random"), MEMBW (the machine's read bandwidth in
#        GB/s, rollout-membw: adds the bandwidth roofline per batch size),
#        ENGINE_ONLY=1 (no llama.cpp runs: its columns are empty; for a
#        llama.cpp that crashes on the file)
# make bench-qwen3, make bench-gemma3 and make bench-moe call it.
# Each round runs, per batch size, the engine then llama.cpp (even rounds:
# llama.cpp first), each timing 64 decode steps after a 32-token prompt;
# llama.cpp runs one untimed repetition first. The summary is the median
# over rounds of each side's tokens/s, both as batch*steps/(total time) and as
# batch/(median step time), which a stall on a shared machine moves less, and
# the engine's split of a step (layers / head / sampling, rollout-bench's
# phase timers).
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
# The roofline figures come from the file's tensors (gguf package): the
# multiply-adds of a token are the 2-D weights a step multiplies by (the
# embedding table only when it is also the LM head), and a step streams those
# weights once: their GGUF bytes for both (the engine keeps the file's dtype;
# 4 bytes each with RD_CPU_WEIGHTS=f32).
# A mixture-of-experts file (3-D ffn_*_exps tensors) does not read all of its
# weights in a step: a step reads the dense matrices (attention, router, LM
# head) and, per layer, only the experts its rows were routed to. With
# ENGINE_ARGS=--routes the engine counts them (distinct experts per layer per
# step, rollout-bench's decode_experts_hit), and the roofline per batch size
# is dense bytes + layers x experts hit x bytes of one expert (gate, up and
# down), next to 128 x (1 - (1 - k/n)^B), what independent uniform routing
# would hit. llama.cpp is assumed to hit as many (same file, same kind of
# token stream: see bench_moe.sh). Multiply-adds per token: the dense
# matrices plus k experts per layer.
set -euo pipefail
cd "$(dirname "$0")/.."
MODEL=${1:?usage: tools/bench_decode.sh MODEL [THREADS]}
THREADS=${2:-$(nproc)}
BATCHES=${BATCHES:-1 32}
ROUNDS=${ROUNDS:-3}
NAME=${NAME:-bench-decode}
PY=${PYTHON:-python3}
QUIET=${QUIET:-0.4}
QUIET_WAIT=${QUIET_WAIT:-300}
[ -f "$MODEL" ] || { echo "bench_decode: $MODEL not found" >&2; exit 2; }

mkdir -p build
LOG=build/$NAME.rounds.jsonl
TIMES=build/$NAME.time
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
# shellcheck disable=SC2086
ours() { measure "$1" "$2" rolloutd build/rollout-bench --model "$MODEL" --threads "$THREADS" --decode-only --decode-batches "$2" ${ENGINE_ARGS:-} --json; }
theirs() {
  # shellcheck disable=SC2086
  measure "$1" "$2" llama_cpp "$PY" tools/bench_llamacpp.py --model "$MODEL" --threads "$THREADS" --batch "$2" \
    --prompt-len 32 --gen 64 --reps 1 --warmup 1 ${LLAMA_ARGS:-} --json
}

START=$(date -u +%FT%TZ)
echo "bench_decode: $MODEL, batches $BATCHES, $THREADS threads, $ROUNDS rounds, load average $(cut -d' ' -f1-3 /proc/loadavg)" >&2
if [ -n "${WORKLOAD:-}" ]; then
  echo "  workload $WORKLOAD" >&2
  # shellcheck disable=SC2086
  measure 0 0 workload build/rollout-bench --model "$MODEL" --threads "$THREADS" $WORKLOAD --json
fi
for r in $(seq 1 "$ROUNDS"); do
  for b in $BATCHES; do
    echo "  round $r batch $b" >&2
    if [ "${ENGINE_ONLY:-0}" = 1 ]; then ours "$r" "$b"
    elif [ $((r % 2)) -eq 1 ]; then ours "$r" "$b"; theirs "$r" "$b"; else theirs "$r" "$b"; ours "$r" "$b"; fi
  done
done
END=$(date -u +%FT%TZ)

MODEL="$MODEL" THREADS="$THREADS" QUIET="$QUIET" START="$START" END="$END" LOG="$LOG" BATCHES="$BATCHES" \
  MEMBW="${MEMBW:-}" OUTJSON="build/$NAME.json" "$PY" - <<'PYEOF'
import json, os, platform, statistics
import gguf
rows = [json.loads(l) for l in open(os.environ["LOG"])]
work = [x for x in rows if x["side"] == "workload"]
rows = [x for x in rows if x["side"] != "workload"]
model = os.environ["MODEL"]
quiet = float(os.environ["QUIET"])
batches = [int(b) for b in os.environ["BATCHES"].split()]
rounds = sorted({x["round"] for x in rows})
clean = {b: [r for r in rounds if all(x["other_cores"] <= quiet for x in rows if x["round"] == r and x["batch"] == b)]
         for b in batches}
used = {b: clean[b] or rounds for b in batches}

def rates(side, b):
    """[(tokens/s, median-step tokens/s, other processes' cores, phases)] per round."""
    out = []
    for x in rows:
        if x["side"] != side or x["batch"] != b or x["round"] not in used[b]:
            continue
        r = x["r"]
        if side == "rolloutd":
            out.append((r["decode_tokens_per_s"][f"batch_{b}"], r["decode_tokens_per_s_median_step"][f"batch_{b}"],
                        x["other_cores"], r.get("decode_phase_share", {}).get(f"batch_{b}")))
        else:
            r = r[f"batch_{b}"]
            out.append((r["decode_tokens_per_s"], r["decode_tokens_per_s_median_step"], x["other_cores"], None))
    return out

# What a decode step multiplies by, from the file.
rd = gguf.GGUFReader(model)
names = {t.name for t in rd.tensors}
tied = "output.weight" not in names
mat_params = mat_bytes = 0
exp_params = exp_bytes = 0          # every expert of every layer (3-D *_exps tensors)
for t in rd.tensors:
    if len(t.shape) == 3 and "_exps" in t.name:
        exp_params += int(t.n_elements)
        exp_bytes += int(t.n_bytes)
    if len(t.shape) != 2 or (t.name == "token_embd.weight" and not tied):
        continue
    mat_params += int(t.n_elements)
    mat_bytes += int(t.n_bytes)
moe = None
if exp_params:
    kv = {f.name: f for f in rd.fields.values()}
    arch = bytes(kv["general.architecture"].parts[-1]).decode()
    def u32(key):
        f = kv[f"{arch}.{key}"]
        return int(f.parts[f.data[0]][0])
    n_exp, k_used, n_layers = u32("expert_count"), u32("expert_used_count"), u32("block_count")
    per_exp_params, per_exp_bytes = exp_params // (n_layers * n_exp), exp_bytes // (n_layers * n_exp)
    moe = {"n_experts": n_exp, "k": k_used, "n_layers": n_layers, "expert_params": per_exp_params,
           "expert_bytes": per_exp_bytes, "dense_params": mat_params, "dense_bytes": mat_bytes}
flops_per_token = 2 * (mat_params + (n_layers * k_used * per_exp_params if moe else 0))
f32 = os.environ.get("RD_CPU_WEIGHTS") == "f32"
eng_bytes = mat_params * 4 if f32 else mat_bytes
membw = float(os.environ["MEMBW"]) if os.environ.get("MEMBW") else None

def hits_of(b):
    """Median over the used rounds of the engine's mean distinct experts per layer per step."""
    h = [x["r"]["decode_experts_hit"][f"batch_{b}"]["mean"] for x in rows
         if x["side"] == "rolloutd" and x["batch"] == b and x["round"] in used[b] and "decode_experts_hit" in x["r"]]
    return statistics.median(h) if h else None
summary = {}
for b in batches:
    print(f"batch {b}: rounds {used[b]} of {rounds}" + ("" if clean[b] else
          f"  (WARNING: in no round were other processes at <= {quiet} busy cores on both sides; disturbed)"))
print(f"{'':<10}{'rolloutd':>10}{'llama.cpp':>11}{'ratio':>8}   {'median-step rate':>16}{'ratio':>8}"
      "   engine step: layers/head/sampling   rounds: ours/theirs tok/s (other busy cores)")
for b in batches:
    o, t = rates("rolloutd", b), rates("llama_cpp", b)
    nan = float("nan")              # ENGINE_ONLY: no llama.cpp rounds (None in the JSON)
    om, tm = statistics.median(x[0] for x in o), statistics.median(x[0] for x in t) if t else nan
    os_, ts_ = statistics.median(x[1] for x in o), statistics.median(x[1] for x in t) if t else nan
    ph = [x[3] for x in o if x[3]]
    phase = {k: statistics.median(p[k] for p in ph) for k in ("layers", "head", "sample", "other")} if ph else None
    summary[f"batch_{b}"] = {"rounds_used": used[b], "clean": bool(clean[b]), "rolloutd": om, "llama_cpp": tm, "ratio": om / tm,
                            "rolloutd_median_step": os_, "llama_cpp_median_step": ts_, "ratio_median_step": os_ / ts_,
                            "rolloutd_phase_share": phase, "rounds_rolloutd": o, "rounds_llama_cpp": t}
    per = " ".join(f"{a[0]:.1f}/{c[0]:.1f} ({a[2]:.1f}/{c[2]:.1f})" for a, c in zip(o, t))
    ps = f"{100 * phase['layers']:.0f}/{100 * phase['head']:.0f}/{100 * phase['sample']:.0f}%" if phase else "-"
    print(f"batch {b:<4}{om:>10.1f}{tm:>11.1f}{om / tm:>7.2f}x   {os_:>7.1f} /{ts_:>7.1f}{os_ / ts_:>7.2f}x   {ps:>22}"
          f"   {per}")
for w in work:
    r = w["r"]
    print(f"workload: continuous {r['continuous']['tokens_per_s']:.1f} tokens/s "
          f"(mean batch {r['continuous']['mean_batch']:.1f}), static {r['static']['tokens_per_s']:.1f} "
          f"(mean batch {r['static']['mean_batch']:.1f}): {r['speedup']:.2f}x; {w['wall_s']} s, "
          f"other busy cores {w['other_cores']}")
for b in batches:
    if not moe:
        break
    s = summary[f"batch_{b}"]
    h = hits_of(b)
    uniform = moe["n_experts"] * (1 - (1 - moe["k"] / moe["n_experts"]) ** b)
    hh = h if h is not None else uniform
    step_bytes = moe["dense_bytes"] + moe["n_layers"] * hh * moe["expert_bytes"]
    if f32:
        step_bytes = (moe["dense_params"] + moe["n_layers"] * hh * moe["expert_params"]) * 4
    r = {"experts_hit_per_layer": h, "experts_hit_uniform": uniform, "bytes_per_step": step_bytes,
         "rolloutd_gb_per_s": s["rolloutd"] / b * step_bytes / 1e9,
         "llama_cpp_gb_per_s": s["llama_cpp"] / b * step_bytes / 1e9}
    if membw:
        r["roofline_tokens_per_s"] = b * membw * 1e9 / step_bytes
        r["rolloutd_of_roofline"] = s["rolloutd"] / r["roofline_tokens_per_s"]
        r["llama_cpp_of_roofline"] = s["llama_cpp"] / r["roofline_tokens_per_s"]
    s["moe_roofline"] = r
    print(f"batch {b}: experts hit per layer {'-' if h is None else f'{h:.1f}'} (uniform routing {uniform:.1f}) "
          f"of {moe['n_experts']}; a step reads {step_bytes / 1e9:.3f} GB (dense {moe['dense_bytes'] / 1e9:.3f} + "
          f"{moe['n_layers']} x {hh:.1f} x {moe['expert_bytes'] / 1e6:.2f} MB); rolloutd {r['rolloutd_gb_per_s']:.1f} GB/s, "
          f"llama.cpp {r['llama_cpp_gb_per_s']:.1f} GB/s" +
          (f"; at {membw:.1f} GB/s the roofline is {r['roofline_tokens_per_s']:.1f} tok/s (rolloutd "
           f"{100 * r['rolloutd_of_roofline']:.0f}%, llama.cpp {100 * r['llama_cpp_of_roofline']:.0f}%)" if membw else ""))
for b in batches:
    s = summary[f"batch_{b}"]
    if moe:
        print(f"batch {b}: GFLOP/s rolloutd {s['rolloutd'] * flops_per_token / 1e9:.1f}, "
              f"llama.cpp {s['llama_cpp'] * flops_per_token / 1e9:.1f} (active weights: dense + {moe['k']} experts per layer)")
        continue
    print(f"batch {b}: GFLOP/s rolloutd {s['rolloutd'] * flops_per_token / 1e9:.1f}, "
          f"llama.cpp {s['llama_cpp'] * flops_per_token / 1e9:.1f}" +
          (f"; weight GB/s rolloutd {s['rolloutd'] * eng_bytes / 1e9:.1f} ({'fp32' if f32 else 'file dtype'} "
           f"{eng_bytes / 1e9:.2f} GB/step), "
           f"llama.cpp {s['llama_cpp'] * mat_bytes / 1e9:.1f} (GGUF {mat_bytes / 1e9:.2f} GB/step)"
           if b == 1 else ""))
out = {"model": model, "model_bytes": os.path.getsize(model), "threads": int(os.environ["THREADS"]),
       "start": os.environ["START"], "end": os.environ["END"], "host": platform.node(),
       "quiet_cores": quiet, "matrix_params": mat_params, "flops_per_token": flops_per_token,
       "weight_bytes_per_step": {"rolloutd": eng_bytes, "llama_cpp_gguf": mat_bytes}, "moe": moe, "membw_gb_per_s": membw,
       "summary": summary, "workload": work, "runs": rows}
def no_nan(x):
    if isinstance(x, float) and x != x:
        return None
    if isinstance(x, dict):
        return {k: no_nan(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [no_nan(v) for v in x]
    return x
with open(os.environ["OUTJSON"], "w") as f:
    json.dump(no_nan(out), f, indent=1)
print(f"{os.environ['START']} .. {os.environ['END']}; {os.environ['OUTJSON']}")
PYEOF
