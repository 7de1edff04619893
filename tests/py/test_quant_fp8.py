"""The C FP8 block quantizer (engine/model/quant_fp8.c, run through `build/tests/test_quant
--fp8 IN OUT`) against the NumPy reference (tests/py/ref_fp8.py), byte for byte: random
blocks at scales from 1e-38 to 5e4 (the exponent clamp at -117 among them), bf16-rounded
data (what a learner pushes), every E4M3 value and every midpoint between two neighbours
(ties to the even code) at several block exponents, the subnormal codes, blocks whose
max is exactly 448 x 2^e and one ulp above it, zero and negative-zero blocks. NaN or
infinite inputs, and a block past 448 x 2^7, make the C quantizer fail naming what is
wrong."""
import os
import subprocess
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ref_fp8  # noqa: E402
from harness import BUILD, TMP, case, main  # noqa: E402

_tmp = tempfile.mkdtemp(prefix="rd-fp8-", dir=TMP)


def c_fp8(x):
    """(bytes of the C quantizer's output, or None, and its stderr)."""
    src, dst = os.path.join(_tmp, "in.f32"), os.path.join(_tmp, "out.fp8")
    np.ascontiguousarray(x, dtype="<f4").tofile(src)
    p = subprocess.run([os.path.join(BUILD, "tests", "test_quant"), "--fp8", src, dst], capture_output=True,
                       text=True)
    if p.returncode != 0:
        return None, p.stderr
    with open(dst, "rb") as f:
        return f.read(), p.stderr


def same_bytes(x, what):
    x = np.ascontiguousarray(x, np.float32).reshape(-1)
    got, err = c_fp8(x)
    assert got is not None, f"{what}: the C quantizer failed: {err}"
    want = ref_fp8.encode(x)
    g = np.frombuffer(got, np.uint8).reshape(-1, 33)
    assert g.shape == want.shape, (what, g.shape, want.shape)
    bad = np.nonzero((g != want).any(axis=1))[0]
    if len(bad):
        b = int(bad[0])
        raise AssertionError(f"{what}: {len(bad)} blocks differ, first {b}: C {g[b].tolist()} NumPy "
                             f"{want[b].tolist()}; x {x[32 * b:32 * b + 32].tolist()}")
    return g


@case
def random_blocks_at_every_scale():
    rng = np.random.default_rng(268)
    n = 40000
    scale = 10.0 ** rng.uniform(-38, 4.6, n)
    x = (rng.standard_normal((n, 32)) * scale[:, None] / 4).astype(np.float32)
    x = np.where(np.abs(x) > 57344, np.float32(57344), x)
    g = same_bytes(x, "random")
    s = g[:, 0].astype(int) - 127
    print(f"  {n} blocks, block exponents {s.min()} .. {s.max()}, {int((s == -117).sum())} at the clamp", flush=True)
    assert s.min() == -117 and s.max() >= 6, (s.min(), s.max())


@case
def bf16_rounded_weights():
    rng = np.random.default_rng(269)
    x = (rng.standard_normal(32 * 20000) * 0.02).astype(np.float32)
    x = ((x.view(np.uint32) + 0x8000) & 0xFFFF0000).view(np.float32)    # bf16, as pushed
    same_bytes(x, "bf16")


@case
def every_value_and_midpoint_ties_to_even():
    v = ref_fp8.E4M3
    mids = (v[:-1] + v[1:]) / 2          # exact in float32: a binade's step halved
    body = np.concatenate([v, -v, mids, -mids, v[:-1] + (v[1:] - v[:-1]) / 4])
    for e in (-117, -20, 0, 7):
        x = (body * 2.0 ** e).astype(np.float32)
        assert np.array_equal(x.astype(np.float64), body * 2.0 ** e), "a test value is not exact"
        pad = (-len(x)) % 31
        blocks = np.concatenate([x, np.zeros(pad, np.float32)]).reshape(-1, 31)
        # every block's max is 448 x 2^e, so every value keeps the block exponent e
        x = np.concatenate([blocks, np.full((len(blocks), 1), 448 * 2.0 ** e, np.float32)], axis=1)
        g = same_bytes(x, f"values and midpoints at 2^{e}")
        assert (g[:, 0] == e + 127).all(), g[:, 0]


@case
def block_max_at_and_just_past_448_times_a_power_of_two():
    rng = np.random.default_rng(270)
    rows = []
    for e in range(-30, 8):
        top = np.float32(448 * 2.0 ** e)
        for m in (top, np.nextafter(top, np.float32(np.inf)), np.nextafter(top, np.float32(0))):
            if m > 57344:
                continue
            r = (rng.uniform(-1, 1, 32) * m).astype(np.float32)
            r[rng.integers(32)] = -m if rng.integers(2) else m
            rows.append(r)
    g = same_bytes(np.array(rows), "max at 448 x 2^e")
    assert len(set(g[:, 0].tolist())) > 30


@case
def zero_blocks_and_subnormal_codes():
    z = np.zeros(32, np.float32)
    nz = np.full(32, -0.0, np.float32)
    sub = (np.arange(32) / 8 * 2.0 ** -6).astype(np.float32)       # codes 0..8 and past, with max 3.875 x 2^-6
    sub[-1] = 448 * 2.0 ** -10                                      # block exponent -10: the others subnormal
    g = same_bytes(np.concatenate([z, nz, sub]), "zero, -0, subnormal")
    assert g[0, 0] == 127 and (g[0, 1:] == 0).all() and (g[1, 1:] == 0x80).all(), g[:2].tolist()


@case
def nonfinite_and_out_of_range_refused():
    for val, want in ((np.nan, "NaN"), (np.inf, "infinite"), (-np.inf, "infinite"), (6e4, "57344")):
        x = np.zeros(64, np.float32)
        x[40] = val
        got, err = c_fp8(x)
        assert got is None and want in err, (val, err)
        if want != "57344":
            assert "element 40" in err, err
        else:
            assert "block 1" in err, err


if __name__ == "__main__":
    main()
