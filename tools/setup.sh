#!/usr/bin/env bash
# Installs every Debian and PyPI package rolloutd needs. Idempotent: a second run
# only checks. Run as root (or with sudo available) on Debian 12.
set -euo pipefail

APT_PKGS=(build-essential pkg-config clang libclang-rt-14-dev
          libuv1-dev libnng-dev libmbedtls-dev libcjson-dev libopenblas-dev libpcre2-dev node-llhttp
          unzip ca-certificates openssl)
PIP_PKGS=("numpy" "gguf" "pynng" "openai" "llama-cpp-python==0.3.36")

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

PY=${PYTHON:-python3}
need_pip=()
for p in "${PIP_PKGS[@]}"; do
  name=${p%%=*}
  mod=$(echo "$name" | tr '-' '_')
  [ "$name" = "llama-cpp-python" ] && mod=llama_cpp
  "$PY" -c "import $mod" >/dev/null 2>&1 || need_pip+=("$p")
done
if [ "${#need_pip[@]}" -gt 0 ]; then
  echo "setup: installing PyPI packages: ${need_pip[*]} (llama-cpp-python compiles llama.cpp: several minutes)"
  # llama.cpp is built for this CPU without curl, tests or examples.
  CMAKE_ARGS="-DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DGGML_NATIVE=ON" \
    CMAKE_BUILD_PARALLEL_LEVEL=$(nproc) \
    "$PY" -m pip install -q "${need_pip[@]}"
fi
echo "setup: ok"
