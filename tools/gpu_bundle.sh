#!/usr/bin/env bash
# tools/gpu_bundle.sh - packs what tests/gpu/run.sh needs on a GPU machine
# that can reach no package registry (the device tool's H200 is one), into
# two git-ignored folders that travel as the device tool's `carry` paths:
#
#   .gpu-bundle/  sysroot.tar.gz  the build packages' headers, shared
#                                 libraries and llhttp sources, and make
#                                 (Debian's own .debs, unpacked; no static
#                                 libraries, docs)
#                 wheels/         the gguf wheel (tiny test models)
#                 model.part2     the default model from byte SPLIT on
#   .gpu-model/   model.part1     the default model's first SPLIT bytes
#
# Why two folders: a call carries at most 64 MiB with the working tree and
# the model alone is 94 MiB. The first call carries .gpu-model and copies the
# part to /tmp/rd-model; the second carries .gpu-bundle and runs the checks,
# which join the parts and verify the model's sha256 (docs/GPU.md, "Running
# it through the device tool", has both calls).
#
# Run here, after tools/setup.sh and make model (it needs apt's package lists
# and pip's access to PyPI). Idempotent; prints the folders' sizes.
set -euo pipefail
cd "$(dirname "$0")/.."

PKGS=(libuv1 libuv1-dev libnng1 libnng-dev libmbedcrypto7 libmbedtls14 libmbedx509-1 libmbedtls-dev libcjson1 libcjson-dev
      libopenblas0-pthread libopenblas-pthread-dev libgfortran5 libpcre2-8-0 libpcre2-dev node-llhttp make)
MODEL=models/SmolLM2-135M-Instruct.Q4_1.gguf
SPLIT=$((56 << 20))
PY=${PYTHON:-python3}

[ -f "$MODEL" ] || make model
rm -rf .gpu-bundle .gpu-model
mkdir -p .gpu-bundle/wheels .gpu-model
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# Packages: downloaded as .debs (no install), unpacked, trimmed to what the
# build and the programs need.
mkdir -p "$tmp/debs" "$tmp/root"
(cd "$tmp/debs" && apt-get download "${PKGS[@]}" 2>&1 | grep -v "^W: Download is performed unsandboxed" || true)
n=$(ls "$tmp"/debs/*.deb 2>/dev/null | wc -l)
[ "$n" -eq "${#PKGS[@]}" ] || { echo "gpu_bundle: got $n of ${#PKGS[@]} packages (run tools/setup.sh first)" >&2; exit 1; }
for d in "$tmp"/debs/*.deb; do dpkg -x "$d" "$tmp/root"; done
(cd "$tmp/root" && find . -name '*.a' -delete &&
  find usr/bin -type f ! -name make -delete &&
  rm -rf usr/share/doc usr/share/man usr/share/lintian usr/share/nodejs usr/share/gdb usr/share/info usr/share/locale \
    usr/lib/x86_64-linux-gnu/cmake usr/lib/x86_64-linux-gnu/openblas-pthread/cmake \
    usr/lib/x86_64-linux-gnu/openblas-pthread/liblapack*)
tar -czf .gpu-bundle/sysroot.tar.gz -C "$tmp/root" .

# gguf, as installed here (pure Python; numpy, pyyaml and tqdm are on the GPU image).
GGUF_VER=$("$PY" -c 'import importlib.metadata as m; print(m.version("gguf"))')
"$PY" -m pip download -q --no-deps --only-binary=:all: -d .gpu-bundle/wheels "gguf==$GGUF_VER"

head -c "$SPLIT" "$MODEL" > .gpu-model/model.part1
tail -c +"$((SPLIT + 1))" "$MODEL" > .gpu-bundle/model.part2
cat .gpu-model/model.part1 .gpu-bundle/model.part2 | cmp - "$MODEL"

du -sh .gpu-bundle .gpu-model
echo "gpu_bundle: call 1 carries .gpu-model, call 2 carries .gpu-bundle (docs/GPU.md)"
