"""The C Q4_K quantizer (engine/model/quant.c, run through `build/tests/test_quant
--q4_k IN OUT`) against ggml's quantize_row_q4_K_ref (ggml_quantize_chunk(Q4_K, ..,
imatrix NULL) in llama-cpp-python's libggml-base.so), byte for byte, on both of
the C code's paths (AVX2's 8 lanes and, with RD_CPU_ISA=scalar, baseline SSE2's
4): random blocks at scales from 1e-30 to 1e6 (fp16-subnormal and fp16-zero
scales, subnormal sums among them), all-positive and all-negative blocks (min
> 0, max < 0), constant and zero blocks, blocks with one outlier, sub-blocks of
very different sizes (small 6-bit scales, zero d * sc), exact ties of
nearest_int, tiny blocks (63 / max overflowing fp32) and bf16-rounded data
(what a learner pushes): about 250,000 blocks. Blocks whose d or dmin ggml
would write as an infinite fp16, and NaN or infinite inputs, make the C
quantizer fail with a message naming the block or the element.

libggml-base.so is llama-cpp-python's, built by tools/setup.sh; its
quantize_row_q4_K_ref is baseline x86-64 code without fused multiply-adds,
as ours. A ggml built with FMA contraction would round some sums
differently and fail here naming the first block that differs."""
import ctypes
import os
import subprocess
import tempfile
from concurrent.futures import ThreadPoolExecutor

import llama_cpp
import numpy as np

from harness import BUILD, TMP, case, main

_tmp = tempfile.mkdtemp(prefix="rd-quant-q4k-", dir=TMP)
_ggml = ctypes.CDLL(os.path.join(os.path.dirname(llama_cpp.__file__), "lib", "libggml-base.so"))
_ggml.ggml_quantize_chunk.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64,
                                      ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p]
_ggml.ggml_quantize_chunk.restype = ctypes.c_size_t
GGML_TYPE_Q4_K = 12
QK, NB = 256, 144


def ggml_q4_k(x):
    """ggml's blocks of x (n multiple of 256) as a (blocks, 144) uint8 array. ctypes lets go of the
    GIL during the call, so slices run on every CPU (the suite's time: ggml is the slow side)."""
    x = np.ascontiguousarray(x, dtype=np.float32).reshape(-1)
    nb = x.size // QK
    out = np.zeros(nb * NB, np.uint8)
    step = max(1, -(-nb // (os.cpu_count() or 1)))

    def part(b0):
        n = min(step, nb - b0)
        got = _ggml.ggml_quantize_chunk(GGML_TYPE_Q4_K, x[b0 * QK:].ctypes.data, out[b0 * NB:].ctypes.data, 0,
                                        n, QK, None)
        assert got == n * NB, (got, n)

    with ThreadPoolExecutor(os.cpu_count() or 1) as pool:
        list(pool.map(part, range(0, nb, step)))
    return out.reshape(-1, NB)


def c_q4_k(x, isas=(None,)):
    """[(the C quantizer's blocks, or None, and its stderr)] per RD_CPU_ISA in isas (None: the
    default), the runs side by side."""
    src = os.path.join(_tmp, "in.f32")
    np.ascontiguousarray(x, dtype="<f4").tofile(src)
    runs = []
    for k, isa in enumerate(isas):
        dst = os.path.join(_tmp, f"out{k}.q4k")
        env = dict(os.environ)
        if isa:
            env["RD_CPU_ISA"] = isa
        runs.append((dst, subprocess.Popen([os.path.join(BUILD, "tests", "test_quant"), "--q4_k", src, dst],
                                           stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)))
    res = []
    for dst, p in runs:
        err = p.communicate()[1]
        res.append((None, err) if p.returncode else (np.fromfile(dst, np.uint8).reshape(-1, NB), err))
    return res if len(isas) > 1 else res[0]


def fp16_d(q):
    """(d, dmin) of each block as float32."""
    return (q[:, 0:2].copy().view(np.float16).astype(np.float32).ravel(),
            q[:, 2:4].copy().view(np.float16).astype(np.float32).ravel())


def same_bytes(x, what, want=None):
    x = np.ascontiguousarray(x, dtype=np.float32).reshape(-1)
    if want is None:
        want = ggml_q4_k(x)
    for isa, (got, err) in zip((None, "scalar"), c_q4_k(x, (None, "scalar"))):
        path = "scalar (SSE2)" if isa else "default"
        assert got is not None, f"{what} [{path}]: the C quantizer failed: {err}"
        assert got.shape == want.shape, (what, got.shape, want.shape)
        diff = np.nonzero((got != want).any(axis=1))[0]
        if diff.size:
            b = int(diff[0])
            raise AssertionError(f"{what} [{path}]: {diff.size} of {len(want)} blocks differ, first block {b}: "
                                 f"C {got[b].tolist()} ggml {want[b].tolist()}; x {x[QK * b:QK * b + QK].tolist()}")
    return want


def finite_scales(x):
    """x's blocks whose ggml d and dmin are finite fp16 (the others: see too_large_refused), and ggml's bytes."""
    x = np.asarray(x, np.float32).reshape(-1, QK)
    q = ggml_q4_k(x)
    d, dmin = fp16_d(q)
    ok = np.isfinite(d) & np.isfinite(dmin)
    return x[ok], q[ok], int((~ok).sum())


@case
def random_blocks_at_every_scale():
    rng = np.random.default_rng(44)
    n = 40000
    scale = 10.0 ** rng.uniform(-30, 6, n)
    x = (rng.standard_normal((n, QK)) * scale[:, None]).astype(np.float32)
    x, q, dropped = finite_scales(x)
    assert dropped < n // 100, dropped
    same_bytes(x, "random", q)
    d, _ = fp16_d(q)
    assert (d == 0).sum() > 100 and ((d != 0) & (d < 6.1e-5)).sum() > 100, "no fp16-zero/subnormal scales"


@case
def bf16_data_as_a_learner_pushes_it():
    rng = np.random.default_rng(7)
    w = (rng.standard_normal(QK * 100000) * 0.02).astype(np.float32)
    u = w.view(np.uint32)
    bits = (u + 0x7FFF + ((u >> 16) & 1)) >> 16 << 16            # round to bf16
    same_bytes(bits.astype(np.uint32).view(np.float32), "bf16")


@case
def one_signed_blocks_constants_and_zeros():
    rng = np.random.default_rng(3)
    pos = np.abs(rng.standard_normal((10000, QK))) * 10.0 ** rng.uniform(-8, 4, (10000, 1)) + 1e-3
    neg = -np.abs(rng.standard_normal((10000, QK))) * 10.0 ** rng.uniform(-8, 4, (10000, 1)) - 1e-3
    assert (pos.min(axis=1) > 0).all() and (neg.max(axis=1) < 0).all()
    same_bytes(pos, "all positive (min > 0)")
    same_bytes(neg, "all negative (max < 0)")
    consts = [0.0, -0.0, 1.0, -1.0, 0.02, -0.02, 1e-30, -1e-30, 1e-40, -1e-40, 3.0e6, -4.0e6, 65504.0, -123.456]
    blocks = [np.full(QK, c, np.float32) for c in consts]
    mixed = np.zeros((len(consts), QK), np.float32)            # a constant per sub-block
    for i, c in enumerate(consts):
        mixed[i] = np.repeat(np.float32(c) * np.arange(-3, 5, dtype=np.float32) / 4, 32)
    q = same_bytes(np.concatenate([np.stack(blocks), mixed]), "constants")
    assert not q[:2].any(), "a zero block is not all zero bytes"


@case
def outliers_and_sub_blocks_of_very_different_sizes():
    rng = np.random.default_rng(11)
    n = 20000
    x = rng.standard_normal((n, QK)).astype(np.float32) * np.float32(0.02)
    x[np.arange(n), rng.integers(0, QK, n)] = np.float32(0.02) * rng.choice([-1, 1], n) * 10.0 ** rng.uniform(1, 4, n)
    same_bytes(x, "one outlier")
    # Sub-blocks 10^-6 .. 1 of the largest: 6-bit scales and mins of 0 or 1, zero d * sc (L kept from the fit).
    y = rng.standard_normal((n, QK)) * np.repeat(10.0 ** rng.uniform(-6, 0, (n, 8)), 32, axis=1)
    y += np.repeat(rng.uniform(-1, 1, (n, 8)) * (rng.uniform(size=(n, 8)) < 0.5), 32, axis=1)   # offsets: mins
    q = same_bytes(y.astype(np.float32), "mixed sub-blocks")
    sc = q[:, 4:8] & 63
    assert (sc == 0).sum() > 1000 and (sc == 1).sum() > 1000, "no sub-blocks with 6-bit scale 0 or 1"


@case
def ties_of_nearest_int_and_tiny_blocks():
    """Blocks of k + 0.5 (k in 0..14) with 0 and 15 present: iscale 1, so nearest_int gets exact ties
    (to even); and tiny maxima where 63 / max overflows fp32 or every sum is subnormal."""
    rng = np.random.default_rng(5)
    blocks = []
    for e in range(-20, 12):
        for _ in range(40):
            b = (rng.integers(0, 15, QK) + 0.5) * 2.0 ** e
            for j in range(8):
                b[32 * j + rng.integers(0, 32)] = 0.0
                b[32 * j + rng.integers(0, 32)] = 15 * 2.0 ** e
            blocks.append(b)
    for amax in (1e-45, 1e-44, 1e-42, 1e-40, 1e-39, 1e-38, 2e-37, 1e-36, 1e-30, 1e-20):
        for _ in range(20):
            b = rng.standard_normal(QK) * amax
            b[rng.integers(0, QK)] = amax
            blocks.append(b)
    same_bytes(np.concatenate(blocks), "ties and tiny")


@case
def too_large_refused():
    """ggml writes an infinite fp16 d or dmin; the C quantizer refuses naming the block. Just below the
    edge both agree."""
    for v, word in ((-4.2e6, "dmin"), (-1e30, ""), (7e7, "scale d"), (3.4e38, "scale d")):
        x = np.linspace(-1, 1, 3 * QK).astype(np.float32)
        x[2 * QK + 17] = v
        d, dmin = fp16_d(ggml_q4_k(x))
        assert np.isinf(d[2]) or np.isinf(dmin[2]), f"ggml writes finite scales for {v}"
        got, err = c_q4_k(x)
        assert got is None and "block 2 " in err and "overflows fp16" in err and word in err, (v, err)
    x = np.linspace(-1, 1, 2 * QK).astype(np.float32)
    x[QK + 3], x[QK + 40] = -4.0e6, 6.0e7          # dmin ~63500, d ~63500: the largest fp16s hold them
    same_bytes(x, "just below the fp16 edge")


@case
def nan_inf_and_partial_blocks_refused():
    for v, word in ((np.nan, "NaN"), (np.inf, "infinite"), (-np.inf, "infinite")):
        x = np.linspace(-1, 1, 3 * QK).astype(np.float32)
        x[600] = v
        got, err = c_q4_k(x)
        assert got is None and "element 600 " in err and word in err, (v, err)
    got, err = c_q4_k(np.zeros(QK + 32, np.float32))
    assert got is None and "multiple of the block size 256" in err, err


if __name__ == "__main__":
    main()
