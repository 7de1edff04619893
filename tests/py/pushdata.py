"""Weights for the push tests: the default model exported once as HF f32
tensors (build/rollout-export, memory-mapped), and perturbed copies."""
import json
import os
import struct
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import BUILD, MODEL, ROOT, TMP, run  # noqa: E402

sys.path.insert(0, os.path.join(ROOT, "tools", "python"))
from rolloutd import bf16_bits  # noqa: E402

_weights = None


def weights():
    """{HF name: float32 array}: the default model exported once by rollout-export (memory-mapped)."""
    global _weights
    if _weights is None:
        out = os.path.join(tempfile.mkdtemp(prefix="rd-weights-", dir=TMP), "hf")
        run([os.path.join(BUILD, "rollout-export"), "--model", MODEL, "--out", out, "--dtype", "f32"])
        path = os.path.join(out, "model.safetensors")
        with open(path, "rb") as f:
            (n,) = struct.unpack("<Q", f.read(8))
            hdr = json.loads(f.read(n))
        raw = np.memmap(path, dtype=np.uint8, mode="r", offset=8 + n)
        _weights = {}
        for k, v in hdr.items():
            if k != "__metadata__":
                assert v["dtype"] == "F32", v
                a, b = v["data_offsets"]
                _weights[k] = raw[a:b].view(np.float32).reshape(v["shape"])
    return _weights


def perturbed_bf16(seed, eps=0.01):
    """Every weight times 1 + eps * N(0, 1), as raw bf16 bits (uint16)."""
    rng = np.random.default_rng(seed)
    out = {}
    for k, w in weights().items():
        out[k] = bf16_bits(w * (1 + eps * rng.standard_normal(w.shape, dtype=np.float32)))
    return out
