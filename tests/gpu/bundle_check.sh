#!/usr/bin/env bash
# tests/gpu/bundle_check.sh - checks here, before spending device time, that
# tests/gpu/run.sh builds and runs from tools/gpu_bundle.sh's bundle alone,
# as on a GPU machine with none of the build packages and no network.
#
# As root, in a private mount namespace: every header, library and llhttp
# source of the bundled packages, and make, is hidden (an empty directory or
# /dev/null mounted over it), the tree is copied without build/ or models/, and
# `run.sh --dry-run` runs there with GPU_BUNDLE=1 and the model joined from
# the two parts, with a budget of 1500 s (the build starts from nothing).
# Passes when that run passes and its build used nothing of the hidden paths.
# Needs unshare(1) and root; takes ~10 minutes on 2 cores.
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$(pwd)
[ -f .gpu-bundle/sysroot.tar.gz ] && [ -f .gpu-model/model.part1 ] || tools/gpu_bundle.sh
COPY=$(mktemp -d /tmp/rd-bundle-check.XXXXXX)
trap 'rm -rf "$COPY"' EXIT
git ls-files -z | xargs -0 cp --parents -t "$COPY"
cp -r .gpu-bundle .gpu-model "$COPY"/
rm -rf /tmp/rd-model

exec unshare -m --propagation private bash -euo pipefail -c '
  copy=$1
  hidden=0
  for d in /usr/include/nng /usr/include/cjson /usr/include/uv /usr/share/llhttp /usr/share/include/llhttp \
           /usr/include/x86_64-linux-gnu/openblas-pthread /usr/lib/x86_64-linux-gnu/openblas-pthread; do
    [ -d "$d" ] && mount -t tmpfs none "$d" && hidden=$((hidden + 1))
  done
  L=/usr/lib/x86_64-linux-gnu
  # A bind mount over a symlink covers its target: the pcre2 libraries stay (the
  # system itself runs on them; its link-time name points at the same file).
  for f in /usr/bin/make /usr/include/uv.h /usr/include/pcre2.h /usr/include/x86_64-linux-gnu/cblas.h $L/libopenblas.so* \
           $L/libuv.so* $L/libnng.so* $L/libcjson.so* $L/libmbed*.so*; do
    [ -e "$f" ] && mount --bind /dev/null "$f" && hidden=$((hidden + 1))
  done
  echo "bundle_check: $hidden system paths hidden"
  cd "$copy"
  # The budget is the device call'"'"'s; here the build starts from nothing on fewer cores, so the dry run gets
  # room for every stage (this checks the bundle, not the time).
  OUT=$copy/gpu-out GPU_LOGS=$copy/gpu-logs GPU_BUNDLE=1 GPU_BUDGET_S=${GPU_BUDGET_S:-1500} tests/gpu/run.sh --dry-run
  # The compiler saw only the bundle: no dependency file names a hidden header.
  if grep -lE "(^|[ :])/usr/(include/(uv\.h|nng/|cjson/|pcre2\.h|x86_64-linux-gnu/cblas\.h)|share/llhttp)" -r build/obj --include=*.d; then
    echo "bundle_check: FAIL: objects above were built against system headers"; exit 1
  fi
  ldd build/rollout-gpubench | grep -E "libuv|libnng|libcjson|libopenblas" | grep -v /tmp/rd-sysroot &&
    { echo "bundle_check: FAIL: libraries above do not come from the bundle"; exit 1; }
  grep -c /tmp/rd-sysroot build/obj/engine/format/safetensors.d build/obj/daemon/loop.d
  grep -q "model-join	PASS" gpu-out/stages.tsv || { echo "bundle_check: FAIL: the model was not joined"; exit 1; }
  echo "bundle_check: PASS"
' bash "$COPY"
