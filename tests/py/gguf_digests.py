#!/usr/bin/env python3
"""Writes, for every tensor of a GGUF file, what the `gguf` package's own
dequantizer (gguf.quants.dequantize) reads from it, as a JSON list in file
order: {name, type (ggml code), ne (ggml order), n, digest, head, tail}.
test_gguf compares our C dequantizer with it tensor by tensor.

digest is an exact, position-weighted fingerprint of the float32 values in
ggml order: the sum over i of bits(y[i]) * (2i + 1) modulo 2^64, where
bits() is the IEEE bit pattern as an unsigned 32-bit integer (decimal
string: JSON numbers are doubles). head and tail are the first and last 4
values (as bit patterns), for the message when a tensor differs.
Large tensors are dequantized a slice of rows at a time.
  gguf_digests.py FILE.gguf OUT.json"""
import json
import sys

import numpy as np

try:
    import gguf
    from gguf_fast import GGUFReader
except ImportError:
    sys.exit("gguf_digests: the Python package `gguf` is missing (make setup)")

ROWS = 8192


def digest(reader_tensor):
    t = reader_tensor
    data = t.data
    rows = data.shape[0] if data.ndim > 1 else 1
    total = np.uint64(0)
    start = 0                       # element index of the slice's first value
    head = tail = None
    for r0 in range(0, rows, ROWS):
        part = data[r0:r0 + ROWS] if data.ndim > 1 else data
        y = np.ascontiguousarray(gguf.quants.dequantize(np.asarray(part), t.tensor_type), dtype=np.float32).ravel()
        bits = y.view(np.uint32).astype(np.uint64)
        w = np.arange(start, start + y.size, dtype=np.uint64) * np.uint64(2) + np.uint64(1)
        with np.errstate(over="ignore"):
            total = total + np.sum(bits * w, dtype=np.uint64)     # wraps modulo 2^64
        if head is None:
            head = bits[:4].tolist()
        tail = bits[-4:].tolist()
        start += y.size
    return int(total), start, head, tail


def main(argv):
    if len(argv) != 2:
        sys.exit(__doc__)
    reader = GGUFReader(argv[0])
    out = []
    for t in reader.tensors:
        d, n, head, tail = digest(t)
        assert n == int(t.n_elements), f"{t.name}: {n} values, expected {t.n_elements}"
        out.append({"name": t.name, "type": int(t.tensor_type), "ne": [int(x) for x in t.shape], "n": n,
                    "digest": str(d), "head": head, "tail": tail})
    with open(argv[1], "w") as f:
        json.dump(out, f, indent=0)
        f.write("\n")
    print(f"gguf_digests: {len(out)} tensors of {argv[0]} -> {argv[1]}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
