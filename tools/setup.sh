#!/usr/bin/env bash
# Installs every Debian and PyPI package rolloutd needs. Idempotent: a second run
# only checks. Run as root (or with sudo available) on Debian 12.
set -euo pipefail

APT_PKGS=(build-essential pkg-config clang libclang-rt-14-dev
          libuv1-dev libnng-dev libmbedtls-dev libcjson-dev libopenblas-dev libpcre2-dev node-llhttp libzstd-dev
          unzip ca-certificates openssl)
PIP_PKGS=("numpy" "gguf" "pynng" "openai" "llama-cpp-python==0.3.36" "vllm-router==0.1.17")
PIP_PKGS+=("sglang-router==0.3.2")  # the SGLang router (a prebuilt wheel): tests/py/test_sglang_rl.py
PIP_PKGS+=("zstandard==0.25.0")     # delta weight pushes (issue 24): tools/python/rolloutd/delta.py
# The learner side (issue 47): transformers as the second oracle (tests/py/test_transformers.py) and torch
# tensors pushed as they are. PyPI's torch wheel brings its CUDA libraries: about 2 minutes and 5.6 GB here.
PIP_PKGS+=("torch==2.15.0" "transformers==5.23.0")

SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"

missing=()
for p in "${APT_PKGS[@]}"; do
  dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
if [ "${#missing[@]}" -gt 0 ]; then
  echo "setup: installing Debian packages: ${missing[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}"
fi

# Ray (a prebuilt wheel, cp311 manylinux2014): rolloutd.ray, the fleet; tests/py/test_ray_fleet.py
PIP_PKGS+=("ray==2.60.0")

PY=${PYTHON:-python3}

# llama.cpp (the oracle and the benchmarks' baseline) is built for this CPU's
# features, named one by one rather than -march=native, with llama.cpp's AMX
# paths off: on an AVX-512 + AMX Xeon its AMX buffer type crashes llama_decode
# on every quantized file. Its repacked CPU kernels (AVX2/AVX-512) stay on.
llama_cmake_args() {
  local flags args="-DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DGGML_NATIVE=OFF"
  flags=" $(grep -m1 '^flags' /proc/cpuinfo | cut -d: -f2) "
  local f opt
  for f in avx:AVX avx2:AVX2 fma:FMA f16c:F16C bmi2:BMI2 avx_vnni:AVX_VNNI avx512f:AVX512 \
           avx512vbmi:AVX512_VBMI avx512_vnni:AVX512_VNNI avx512_bf16:AVX512_BF16; do
    opt=OFF
    [[ "$flags" == *" ${f%%:*} "* ]] && opt=ON
    args+=" -DGGML_${f##*:}=$opt"
  done
  echo "$args -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF"
}
LLAMA_ARGS=$(llama_cmake_args)
# The flags an installed llama-cpp-python was built with (written next to it
# by this script): a copy built otherwise (by hand, or by an older setup.sh
# with -DGGML_NATIVE=ON) is rebuilt.
llama_stamp() {
  "$PY" -c 'import os, llama_cpp; print(os.path.join(os.path.dirname(llama_cpp.__file__), "rolloutd-cmake-args"))' \
    2>/dev/null
}

need_pip=()
rebuild_llama=0
for p in "${PIP_PKGS[@]}"; do
  name=${p%%=*}
  mod=$(echo "$name" | tr '-' '_')
  [ "$name" = "llama-cpp-python" ] && mod=llama_cpp
  if ! "$PY" -c "import $mod" >/dev/null 2>&1; then
    need_pip+=("$p")
  elif [ "$name" = "llama-cpp-python" ]; then
    stamp=$(llama_stamp)
    if [ -z "$stamp" ] || [ "$(cat "$stamp" 2>/dev/null)" != "$LLAMA_ARGS" ]; then
      need_pip+=("$p")
      rebuild_llama=1
    fi
  fi
done
if [ "${#need_pip[@]}" -gt 0 ]; then
  echo "setup: installing PyPI packages: ${need_pip[*]} (llama-cpp-python compiles llama.cpp: several minutes)"
  echo "setup: llama.cpp CMAKE_ARGS: $LLAMA_ARGS"
  export CMAKE_ARGS="$LLAMA_ARGS" CMAKE_BUILD_PARALLEL_LEVEL=$(nproc)
  if [ "$rebuild_llama" -eq 1 ]; then
    # Only llama-cpp-python, and from source: pip's cache may hold the wheel built otherwise.
    "$PY" -m pip install -q --force-reinstall --no-deps --no-cache-dir "llama-cpp-python==0.3.36"
    need_pip=("${need_pip[@]/llama-cpp-python==0.3.36}")
  fi
  rest=()
  for p in "${need_pip[@]}"; do [ -n "$p" ] && rest+=("$p"); done
  # No cache: a wheel of llama-cpp-python cached from a build with other flags would be reused.
  [ "${#rest[@]}" -gt 0 ] && "$PY" -m pip install -q --no-cache-dir "${rest[@]}"
  stamp=$(llama_stamp)
  [ -n "$stamp" ] && echo "$LLAMA_ARGS" > "$stamp"
fi
echo "setup: ok"
