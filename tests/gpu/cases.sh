#!/usr/bin/env bash
# tests/gpu/cases.sh BINARY CASE,CASE,... - runs a unit test binary's cases
# (RD_TEST_ONLY) in one process; if that process dies (a signal, an abort: a
# case the emulator lets through and the device does not), each case that
# printed no PASS/FAIL line runs again in a process of its own, so one crash
# does not hide the others' results. Exit 0 when every case passed, else 1.
set -uo pipefail
bin=$1
cases=$2
out=$(mktemp)
RD_TEST_ONLY=$cases "$bin" > "$out" 2>&1
rc=$?
cat "$out"
if [ "$rc" -gt 1 ]; then
  echo "# $bin died (exit $rc): the cases without a result run one per process"
  IFS=, read -ra all <<< "$cases"
  for c in "${all[@]}"; do
    grep -q "^\(PASS\|FAIL\) $c\b" "$out" && continue
    RD_TEST_ONLY=$c "$bin" > "$out.one" 2>&1
    one=$?
    cat "$out.one"
    cat "$out.one" >> "$out"
    grep -q "^\(PASS\|FAIL\) $c\b" "$out.one" || echo "FAIL $c: the process died (exit $one)" | tee -a "$out"
  done
  rc=0
fi
grep -q '^FAIL ' "$out" && rc=1
rm -f "$out" "$out.one"
exit "$rc"
