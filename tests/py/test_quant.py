"""The C Q8_0 quantizer (engine/model/quant.c, run through `build/tests/test_quant
--q8_0 IN OUT`) against the `gguf` package's gguf.quants.quantize(.., Q8_0),
byte for byte: random blocks at scales from 1e-30 to 1e6 (fp16-subnormal and
fp16-zero scales among them), exact ties (x * id = k + 0.5, which round away
from zero), zero blocks, bf16-rounded data (what a learner pushes), tiny blocks
(1 / d overflowing fp32: gguf's NumPy cast gives 0, checked here, as the C
does) and the largest scale fp16 holds. Blocks gguf would give an infinite
scale (max |x| >= 65520 * 127), and NaN or infinite inputs, make the C
quantizer fail with a message naming what is wrong."""
import os
import subprocess
import tempfile
import warnings

import numpy as np
from gguf import GGMLQuantizationType as QT
from gguf import quants

from harness import BUILD, TMP, case, main

_tmp = tempfile.mkdtemp(prefix="rd-quant-", dir=TMP)


def c_q8_0(x):
    """(bytes of the C quantizer's output, or None, and its stderr)."""
    src, dst = os.path.join(_tmp, "in.f32"), os.path.join(_tmp, "out.q8")
    np.ascontiguousarray(x, dtype="<f4").tofile(src)
    p = subprocess.run([os.path.join(BUILD, "tests", "test_quant"), "--q8_0", src, dst], capture_output=True,
                       text=True)
    if p.returncode != 0:
        return None, p.stderr
    with open(dst, "rb") as f:
        return f.read(), p.stderr


def gguf_q8_0(x):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")       # the tiny blocks' 1 / d overflows (on purpose)
        return quants.quantize(np.asarray(x, dtype=np.float32).reshape(-1, 32), QT.Q8_0).tobytes()


def same_bytes(x, what):
    got, err = c_q8_0(x)
    assert got is not None, f"{what}: the C quantizer failed: {err}"
    want = gguf_q8_0(x)
    assert len(got) == len(want) == len(x) // 32 * 34, (what, len(got), len(want))
    if got != want:
        g, w = np.frombuffer(got, np.uint8).reshape(-1, 34), np.frombuffer(want, np.uint8).reshape(-1, 34)
        b = int(np.nonzero((g != w).any(axis=1))[0][0])
        raise AssertionError(f"{what}: block {b} differs: C {g[b].tolist()} gguf {w[b].tolist()}; "
                             f"x {x[32 * b:32 * b + 32].tolist()}")


@case
def random_blocks_at_every_scale():
    rng = np.random.default_rng(26)
    n_blocks = 60000
    scale = 10.0 ** rng.uniform(-30, 6.9, n_blocks).astype(np.float32)   # max |x| up to ~8e6 (d < 65504)
    x = (rng.standard_normal((n_blocks, 32)).astype(np.float32) * scale[:, None] / 4)
    amax = np.abs(x).max(axis=1)
    x = x[amax / np.float32(127) < 65504].reshape(-1)                      # the rest: see too_large_refused
    same_bytes(x, "random")
    d = np.frombuffer(gguf_q8_0(x), np.uint8).reshape(-1, 34)[:, :2].copy().view(np.float16).ravel()
    assert (d == 0).sum() > 100 and ((d != 0) & (np.abs(d) < 6.1e-5)).sum() > 100, "no fp16-zero/subnormal scales"


@case
def bf16_data_as_a_learner_pushes_it():
    rng = np.random.default_rng(7)
    w = (rng.standard_normal(32 * 20000) * 0.02).astype(np.float32)
    bits = (w.view(np.uint32) + 0x7FFF + ((w.view(np.uint32) >> 16) & 1)) >> 16 << 16   # round to bf16
    same_bytes(bits.astype(np.uint32).view(np.float32), "bf16")


@case
def exact_ties_round_away_from_zero():
    """max |x| = 127 * 2^e gives d = 2^e and id = 2^-e exactly: x = (k + 0.5) 2^e are ties."""
    rng = np.random.default_rng(1)
    blocks = []
    for e in range(-24, 16):
        for _ in range(20):
            k = rng.integers(-127, 127, 32).astype(np.float32) + np.float32(0.5)
            b = k * np.float32(2.0 ** e)
            b[rng.integers(0, 32)] = np.float32(127 * 2.0 ** e) * rng.choice([-1, 1])
            blocks.append(b)
    x = np.concatenate(blocks).astype(np.float32)
    same_bytes(x, "ties")
    q = np.frombuffer(gguf_q8_0(x[:32 * 20]), np.uint8).reshape(-1, 34)[:, 2:].view(np.int8).astype(np.float32)
    xb = x[:32 * 20].reshape(-1, 32) / np.float32(2.0 ** -24)
    assert np.array_equal(q, np.sign(xb) * np.floor(np.abs(xb) + 0.5)), "ties are not rounded away from zero"


@case
def zeros_tiny_and_the_largest_scale():
    blocks = [np.zeros(32, np.float32), -np.zeros(32, np.float32)]
    for amax in (1e-45, 1e-40, 3e-37, 3.6e-37, 3.8e-37, 1e-36, 1e-20, 65504 * 127.0, 65519 * 127.0):
        b = np.zeros(32, np.float32)
        b[3], b[7], b[30] = amax, -amax / 2, amax / 3
        blocks.append(b)
    x = np.concatenate(blocks).astype(np.float32)
    same_bytes(x, "edges")
    g = np.frombuffer(gguf_q8_0(x), np.uint8).reshape(-1, 34)
    assert not g[2:6].any(), "gguf no longer gives 0 for blocks whose 1 / d overflows: revisit quant.c's note"


@case
def too_large_refused():
    for amax in (65520 * 127.0, 8.4e6, 1e30, 3.4e38):
        x = np.zeros(64, np.float32)
        x[32 + 4] = -amax
        d = np.frombuffer(gguf_q8_0(x), np.uint8).reshape(-1, 34)[1, :2].copy().view(np.float16)[0]
        assert np.isinf(d), f"gguf writes a finite scale {d} for {amax}"
        got, err = c_q8_0(x)
        assert got is None and "block 1" in err and "overflows fp16" in err, (amax, err)


@case
def nan_and_inf_refused():
    for v, word in ((np.nan, "NaN"), (np.inf, "infinite"), (-np.inf, "infinite")):
        x = np.linspace(-1, 1, 96).astype(np.float32)
        x[77] = v
        got, err = c_q8_0(x)
        assert got is None and "element 77 " in err and word in err, (v, err)


if __name__ == "__main__":
    main()
