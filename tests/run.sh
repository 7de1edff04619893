#!/usr/bin/env bash
# Runs the test suite: every C unit test binary in BUILD/tests, then the Python
# tests in tests/py (oracles: NumPy, llama.cpp through llama-cpp-python).
# Each prints PASS/FAIL lines; this script counts them and ends with
# "N passed, N failed", exiting non-zero on any failure.
#   tests/run.sh [BUILD] [--unit-only]
# RD_TEST_JOBS test files run at once (default 2): most files wait on daemons, sockets and
# subprocesses for much of their time, so two at a time keep two cores busy. Each file gets its
# own RD_TMP and its own slice of the loopback ports (RD_PORT_SLOT of RD_PORT_SLOTS, read by
# rdtest.free_port). RD_TEST_JOBS=1 runs them one after another, slowest first.
set -uo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build}
MODE=${2:-}
PY=${PYTHON:-python3}
JOBS=${RD_TEST_JOBS:-2}
# llama.cpp's oracles on one thread when files share the cores (tools/llamacpp_info.py says why).
[ "$JOBS" -gt 1 ] && export RD_LLAMA_THREADS=${RD_LLAMA_THREADS:-1}
export RD_BUILD=$BUILD
export RD_MODEL=${RD_MODEL:-models/SmolLM2-135M-Instruct.Q4_1.gguf}
export RD_TMP=${RD_TMP:-$(mktemp -d)}
trap 'rm -rf "$RD_TMP"' EXIT
RES=$RD_TMP/results
mkdir -p "$RES"

# The job list: one line per test file, NAME then the command (shell-quoted), run by eval.
job_names=()
job_cmds=()
add() {
  local name=$1; shift
  job_names+=("$name")
  job_cmds+=("$(printf '%q ' "$@")")
}

# Tiny random models for the unit tests (idempotent, a few seconds; before any job reads them).
export RD_TESTDATA=${RD_TESTDATA:-build/testdata}
gen_failed=0
tests/gen_testdata.sh "$RD_TESTDATA" >/dev/null || { echo "FAIL gen_testdata"; gen_failed=1; }

for t in "$BUILD"/tests/test_*; do
  [ -x "$t" ] || continue
  add "$(basename "$t")" "$t"
done

# The GEMM's checks against the scalar fmaf chain on the kernels' AVX2 and plain C paths too
# (base/cpu_isa.h; on a host without AVX2 both fall back to plain C).
for isa in avx2 scalar; do
  [ -x "$BUILD/tests/test_gemm" ] && add "$isa:test_gemm" env RD_CPU_ISA=$isa "$BUILD/tests/test_gemm"
done

# The same unit tests built with AddressSanitizer + UBSan (make asan-build). test_cuda_emu, the
# CUDA kernels on the CPU emulator, is left to `make asan` (all unit tests under ASan) and `make
# test-cuda-emu`: under ASan it took 212 s of the suite, and the plain build runs it here.
if [ -n "${RD_ASAN_BUILD:-}" ]; then
  for t in "$RD_ASAN_BUILD"/tests/test_*; do
    [ -x "$t" ] || continue
    case "$(basename "$t")" in test_cuda_emu | test_lora_engine_emu) continue ;; esac
    add "asan:$(basename "$t")" "$t"
  done
fi

if [ "$MODE" != "--unit-only" ]; then
  for t in tests/py/test_*.py; do
    [ -f "$t" ] || continue
    add "$(basename "$t" .py)" "$PY" "$t"
  done
  # The daemon's abuse and shutdown tests again against the ASan/UBSan build.
  if [ -n "${RD_ASAN_BUILD:-}" ] && [ -x "$RD_ASAN_BUILD/rolloutd" ]; then
    add "asan:test_daemon_basic" env RD_BUILD="$RD_ASAN_BUILD" ASAN_OPTIONS=detect_leaks=1 \
      "$PY" tests/py/test_daemon_basic.py
    # The HTTP server's abuse cases (slowloris, limits, garbage, auth), ending in a SIGTERM exit with no leak.
    add "asan:test_http_server" env RD_BUILD="$RD_ASAN_BUILD" ASAN_OPTIONS=detect_leaks=1 \
      "$PY" tests/py/test_http_server.py
    # The authentication handshake (wrong secrets, replays, reconnects) against the ASan daemon.
    add "asan:test_auth" env RD_BUILD="$RD_ASAN_BUILD" "$PY" tests/py/test_auth.py
    # The generation routes' lifecycles: streams, stops, disconnects mid-request and mid-stream, abort,
    # pause, 400s and 503s, SIGTERM with an open call. The output-parity cases stay in the plain run
    # (text_is_valid_utf8_whatever_the_tokens alone took 253 s under ASan).
    add "asan:test_http_api" env RD_BUILD="$RD_ASAN_BUILD" ASAN_OPTIONS=detect_leaks=1 \
      RD_CASES=openai_completions_stream_with_usage,generate_streams_cumulative_and_holds_back_stop_prefixes,stop_strings_across_tokens_and_at_the_first,abort_all_returns_partial_outputs,pause_and_continue,bad_fields_get_400_naming_them,busy_gets_503_with_the_nng_words,clients_that_leave_free_their_kv_blocks,update_weights_from_disk,pause_keep_freezes_and_continue_resumes,sigterm_exits_zero \
      "$PY" tests/py/test_http_api.py
    # vLLM's RL routes: pause modes, updates from a directory, vllm-router with a daemon SIGKILLed, SIGTERM with no leak.
    add "asan:test_vllm_rl" env RD_BUILD="$RD_ASAN_BUILD" ASAN_OPTIONS=detect_leaks=1 "$PY" tests/py/test_vllm_rl.py
    # Routing replay: routes narrowed in place, base64 for HTTP, refusals, SIGTERM with no leak.
    add "asan:test_routes" env RD_BUILD="$RD_ASAN_BUILD" ASAN_OPTIONS=detect_leaks=1 "$PY" tests/py/test_routes.py
    # PEFT LoRA adapters loaded and refused by the ASan/UBSan rollout-lora-info (every refusal path, no leak).
    add "asan:test_lora_load" env RD_BUILD="$RD_ASAN_BUILD" ASAN_OPTIONS=detect_leaks=1 \
      RD_CASES=every_family_rank_8_and_64_attention_and_all_linear,rslora_regex_lists_and_layers_to_transform,refused_variants_name_the_problem \
      "$PY" tests/py/test_lora_load.py
    # LoRA over HTTP against the ASan daemon: loads, refusals, unload in use, eviction, SIGTERM with no leak.
    add "asan:test_lora_routes" env RD_BUILD="$RD_ASAN_BUILD" ASAN_OPTIONS=detect_leaks=1 \
      RD_CASES=prime_rl_and_sglang_sequence,bad_adapters_refused_daemon_keeps_serving,max_loras_evicts_least_recently_used_and_metrics,daemons_exit_cleanly \
      "$PY" tests/py/test_lora_routes.py
    # Adapter pushes over NNG against the ASan daemon: every refusal, a checksum failure at COMMIT, a good push after.
    add "asan:test_lora_push" env RD_BUILD="$RD_ASAN_BUILD" ASAN_OPTIONS=detect_leaks=1 \
      RD_CASES=bad_pushes_are_refused_and_the_old_adapter_keeps_serving,zz_stop "$PY" tests/py/test_lora_push.py
    # Bad model files of every family against the ASan/UBSan tools.
    add "asan:test_family_bad_input" env RD_BUILD="$RD_ASAN_BUILD" "$PY" tests/py/test_family_bad_input.py
    # The chain: a relay whose successor dies, aborts everywhere, lane authentication (ASan daemons).
    add "asan:test_chain" env RD_BUILD="$RD_ASAN_BUILD" \
      RD_CASES=by_default_a_failure_aborts_the_update_everywhere,with_a_secret_the_chain_authenticates_and_a_wrong_relay_key_is_refused \
      "$PY" tests/py/test_chain.py
    # Weight-update faults against the ASan daemon, which must then exit with no leak.
    add "asan:test_weight_update" env RD_BUILD="$RD_ASAN_BUILD" ASAN_OPTIONS=detect_leaks=1 \
      RD_CASES=faults_leave_the_old_weights_serving,data_lane_refuses_garbage_and_keeps_serving "$PY" tests/py/test_weight_update.py
    # SGLang's RL routes: pause modes, update, memory release and resume (KV pool and weights freed and made again).
    add "asan:test_sglang_rl" env RD_BUILD="$RD_ASAN_BUILD" ASAN_OPTIONS=detect_leaks=1 \
      RD_CASES=slime_cycle_one_daemon,pause_in_place_and_retract,vllm_sleep_wake_up,weights_from_an_nng_push_cannot_be_released \
      "$PY" tests/py/test_sglang_rl.py
    # The sampling fields (penalties, logit_bias, min_tokens) against the NumPy reference, under ASan/UBSan.
    add "asan:test_sampling_params" env RD_BUILD="$RD_ASAN_BUILD" ASAN_OPTIONS=detect_leaks=1 \
      RD_CASES=penalties_greedy_equal_numpy_reference,min_tokens_masks_stop_tokens_until_reached,samples_keep_their_own_counts_and_batches_do_not_matter,daemons_exit_cleanly \
      "$PY" tests/py/test_sampling_params.py
    # The NNG door's sampling tail (protocol version 4): logit_bias arrays copied before the decoded SUBMIT is freed.
    add "asan:test_nng_sampling" env RD_BUILD="$RD_ASAN_BUILD" ASAN_OPTIONS=detect_leaks=1 \
      "$PY" tests/py/test_nng_sampling.py
    # token_ids_logprob's per-sub id lists and per-token arrays (engine results to meta_info), no leak.
    add "asan:test_scoring" env RD_BUILD="$RD_ASAN_BUILD" ASAN_OPTIONS=detect_leaks=1 \
      RD_CASES=token_ids_logprob_on_generate,slime_opd_call_and_refusals,daemons_exit_cleanly \
      "$PY" tests/py/test_scoring.py
    # Prompt log-probs and echo on the vLLM / OpenAI doors (narrowed alternatives, echo's joined arrays), no leak.
    add "asan:test_scoring_doors" env RD_BUILD="$RD_ASAN_BUILD" ASAN_OPTIONS=detect_leaks=1 \
      RD_CASES=completions_prompt_logprobs_and_echo_rescore_exactly,chat_prompt_logprobs,refusals,daemons_exit_cleanly \
      "$PY" tests/py/test_scoring_doors.py
    # The NNG door's prompt scoring (protocol version 5): scored results held, encoded and freed, no leak at exit.
    add "asan:test_nng_scoring" env RD_BUILD="$RD_ASAN_BUILD" ASAN_OPTIONS=detect_leaks=1 \
      "$PY" tests/py/test_nng_scoring.py
    # Relays refused outside relay_allow (FORBIDDEN), the chain's fallback, clean exits (ASan daemons).
    add "asan:test_relay_allow" env RD_BUILD="$RD_ASAN_BUILD" ASAN_OPTIONS=detect_leaks=1 \
      "$PY" tests/py/test_relay_allow.py
    # 1,000 lane connections at once, eviction and BUSY at max_lane_connections, no leak at exit.
    add "asan:test_lane_limit" env RD_BUILD="$RD_ASAN_BUILD" ASAN_OPTIONS=detect_leaks=1 \
      "$PY" tests/py/test_lane_limit.py
    # HTTPS: TLS sessions, streams over TLS, plain HTTP on the TLS port, a SIGTERM exit with no leak.
    add "asan:test_https" env RD_BUILD="$RD_ASAN_BUILD" ASAN_OPTIONS=detect_leaks=1 \
      "$PY" tests/py/test_https.py
    # GET /weights_manifest and push_tensors' refusals before UPDATE_BEGIN (ASan daemons, no leak at exit).
    add "asan:test_push_tensors" env RD_BUILD="$RD_ASAN_BUILD" ASAN_OPTIONS=detect_leaks=1 \
      RD_CASES=the_manifest_route_lists_the_state_dicts_names_and_shapes,wrong_names_missing_tensors_and_shapes_are_refused_before_begin \
      "$PY" tests/py/test_push_tensors.py
  fi
fi

# Longest first, so that no long file starts last while the other slot sits idle. The list is
# the slowest files of a 2-core run (their "took" lines); the rest follow in the order added.
SLOW_FIRST="test_cuda_emu test_gemma3 test_families test_weight_update asan:test_http_api test_http_api
asan:test_relay_allow asan:test_chain test_chain asan:test_spec test_llamacpp_parity test_chain_c asan:test_vllm_rl
test_delta test_integration asan:test_daemon_basic test_tokenizer_gemma test_gguf test_spec_decode"
order=()
for s in $SLOW_FIRST; do
  for i in "${!job_names[@]}"; do [ "${job_names[$i]}" = "$s" ] && order+=("$i"); done
done
slow=" $(echo $SLOW_FIRST) "
for i in "${!job_names[@]}"; do
  case "$slow" in *" ${job_names[$i]} "*) ;; *) order+=("$i") ;; esac
done

# One job: its PASS/FAIL/SKIP lines and its time go to stdout in one piece (under a lock, so two
# jobs' lines never interleave); its counts go to RES/<index>.count.
run_one() {
  local idx=$1 slot=$2 name=${job_names[$1]} cmd=${job_cmds[$1]}
  local out rc t0=$SECONDS tmp=$RD_TMP/job-$idx
  mkdir -p "$tmp"
  # The job's CPU seconds too (its processes, daemons included, once reaped): with the cores shared
  # between jobs, CPU time is what a file costs. `times` ends the output with the shell's own times,
  # then its children's (the last line).
  out=$(export RD_TMP=$tmp RD_PORT_SLOT=$slot RD_PORT_SLOTS=$JOBS; eval "$cmd" 2>&1; rc=$?; times; exit $rc); rc=$?
  local cpu
  cpu=$(printf '%s\n' "$out" | tail -n 1 | awk '{ s = 0; for (i = 1; i <= 2; i++) { split($i, a, /[ms]/); s += a[1] * 60 + a[2] } printf "%.0f", s }')
  out=$(printf '%s\n' "$out" | head -n -2)
  local p f report
  p=$(printf '%s\n' "$out" | grep -c '^PASS ')
  f=$(printf '%s\n' "$out" | grep -c '^FAIL ')
  # PASS/FAIL/SKIP lines, and which llama.cpp build and buffer types an oracle ran (tools/llamacpp_info.py).
  report=$(printf '%s\n' "$out" | grep -E '^(PASS|FAIL|SKIP) |^llama\.cpp: ' | sed "s|^|[$name] |"
    # Where the suite's time goes (one line per file; not counted).
    echo "[$name] took $((SECONDS - t0)) s (cpu ${cpu:-?} s)"
    if [ "$rc" -ne 0 ] && [ "$f" -eq 0 ]; then
      # Crashed or failed without a FAIL line: show the tail and count it.
      printf '%s\n' "$out" | tail -n 20 | sed "s|^|[$name] |"
      echo "[$name] FAIL (exit $rc)"
    fi)
  [ "$rc" -ne 0 ] && [ "$f" -eq 0 ] && f=1
  echo "$p $f" > "$RES/$idx.count"
  ( flock 9; printf '%s\n' "$report" ) 9>"$RES/print.lock"
}

# Each slot takes the next job off the shared queue until none is left.
echo 0 > "$RES/next"
take() { ( flock 9; local i; i=$(cat "$RES/next"); echo $((i + 1)) > "$RES/next"; echo "$i" ) 9>"$RES/next.lock"; }
slot_loop() {
  local slot=$1 k
  while k=$(take) && [ "$k" -lt "${#order[@]}" ]; do
    run_one "${order[$k]}" "$slot"
  done
}
for ((s = 0; s < JOBS; s++)); do slot_loop "$s" & done
wait

passed=0
failed=$gen_failed
for i in "${!job_names[@]}"; do
  if [ -f "$RES/$i.count" ]; then
    read -r p f < "$RES/$i.count"
  else
    echo "[${job_names[$i]}] FAIL (never ran)"; p=0; f=1
  fi
  passed=$((passed + p))
  failed=$((failed + f))
done
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ] && [ "$passed" -gt 0 ]
