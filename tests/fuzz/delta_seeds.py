"""Seeds for build/fuzz/fuzz_delta: delta streams the learner's encoder
(tools/python/rolloutd/delta.py) writes, RUNS, XOR_ZSTD and SPARSE_ZSTD records, in the
target's input layout (byte 0: element size by its low bit, byte 1: tensor
KiB - 1, then the stream).

    python3 tests/fuzz/delta_seeds.py CORPUS"""
import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools", "python"))
from rolloutd import delta as D  # noqa: E402

out = sys.argv[1]
os.makedirs(out, exist_ok=True)
rng = np.random.default_rng(3)
n = 0
for es, kib in ((2, 1), (2, 8), (4, 4), (2, 16)):
    tn = kib * 1024
    base = (np.arange(tn, dtype=np.uint64) * 131 + 7).astype(np.uint8)   # the target's base
    for frac, kinds in ((0.0, (D.RUNS,)), (0.01, (D.RUNS,)), (0.2, (D.XOR_ZSTD,)), (0.05, (D.RUNS, D.XOR_ZSTD)),
                        (0.03, (D.SPARSE_ZSTD,)), (0.3, D.KINDS)):
        new = base.copy()
        e = new.view(np.uint16 if es == 2 else np.uint32)
        m = rng.random(e.size) < frac
        e[m] ^= 1
        s, _ = D.encode_tensor(new, base, es, record_bytes=1024, kinds=kinds)
        with open(os.path.join(out, f"seed{n:02d}"), "wb") as f:
            f.write(bytes([1 if es == 4 else 0, kib - 1]) + s)
        n += 1
print(f"delta_seeds: {n} seeds in {out}")
