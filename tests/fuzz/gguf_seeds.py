#!/usr/bin/env python3
"""Writes small seed inputs for the GGUF fuzz target (tests/fuzz/fuzz_gguf.c)
into DIR: one GGUF file per tensor type the engine dequantizes, each with a
few metadata keys and two small tensors of that type (a [block, 2] matrix and
a [block] vector: 256 elements for the K-quants, 32 for the other blocks),
plus a file holding one tensor of every type. Random block bytes (seeded):
any bytes are a valid block.
  python3 tests/fuzz/gguf_seeds.py DIR"""
import os
import sys

import numpy as np

try:
    import gguf
    from gguf import GGMLQuantizationType as QT
except ImportError:
    sys.exit("gguf_seeds: the Python package `gguf` is missing (make setup)")

TYPES = [QT.F32, QT.F16, QT.BF16, QT.Q4_0, QT.Q4_1, QT.Q5_0, QT.Q5_1, QT.Q8_0, QT.Q4_K, QT.Q5_K, QT.Q6_K]


def raw(rng, qt, ne0, rows):
    blck, size = gguf.GGML_QUANT_SIZES[qt]
    b = rng.integers(0, 256, (rows, ne0 // blck * size), dtype=np.uint8)
    return b


def write(path, tensors):
    w = gguf.GGUFWriter(path, arch="llama")
    w.add_name("seed")
    w.add_block_count(1)
    for name, qt, data in tensors:
        w.add_tensor(name, data, raw_dtype=qt)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def main(argv):
    if len(argv) != 1:
        sys.exit(__doc__)
    out = argv[0]
    os.makedirs(out, exist_ok=True)
    rng = np.random.default_rng(1)
    every = []
    for qt in TYPES:
        blck = gguf.GGML_QUANT_SIZES[qt][0]
        ne0 = 256 if blck == 256 else 32
        t = [("w", qt, raw(rng, qt, ne0, 2)), ("v", qt, raw(rng, qt, ne0, 1)[0])]
        write(os.path.join(out, f"seed-{qt.name.lower()}.gguf"), t)
        every.append((f"t.{qt.name.lower()}", qt, raw(rng, qt, ne0, 1)[0]))
    write(os.path.join(out, "seed-all.gguf"), every)
    print(f"gguf_seeds: wrote {len(TYPES) + 1} files to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
