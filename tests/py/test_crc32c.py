"""CRC-32C in numpy (tools/python/rolloutd/crc32c.py): the catalogue's check
values, a bit-by-bit reference on random data of many lengths and offsets,
every accepted input type, chaining, combine, and agreement with the C
implementation (base/crc32c.c, through `rollout-protodump --crc32c`).
Prints the numpy version's speed (informational, not asserted)."""
import os
import random
import sys
import time

import numpy as np

from harness import BUILD, ROOT, TMP, case, main, run

sys.path.insert(0, os.path.join(ROOT, "tools", "python"))
from rolloutd import crc32c as CRC  # noqa: E402
from rolloutd.crc32c import crc32c, crc32c_combine  # noqa: E402

POLY = 0x82F63B78


def ref_bitwise(data, crc=0):
    """Straight from the definition, one bit at a time."""
    c = crc ^ 0xFFFFFFFF
    for x in bytes(data):
        c ^= x
        for _ in range(8):
            c = (c >> 1) ^ POLY if c & 1 else c >> 1
    return c ^ 0xFFFFFFFF


_T = []
for _b in range(256):
    _c = _b
    for _ in range(8):
        _c = (_c >> 1) ^ POLY if _c & 1 else _c >> 1
    _T.append(_c)


def ref_table(data, crc=0):
    """Byte at a time (checked against ref_bitwise below), for long inputs."""
    c = crc ^ 0xFFFFFFFF
    for x in bytes(data):
        c = (c >> 8) ^ _T[(c ^ x) & 0xFF]
    return c ^ 0xFFFFFFFF


@case
def check_values(f=None):
    f = f or crc32c
    assert f(b"123456789") == 0xE3069283
    assert f(bytes(32)) == 0x8A9136AA
    assert f(b"\xff" * 32) == 0x62A8AB43
    assert f(bytes(range(32))) == 0x46DD794E            # RFC 3720 B.4
    assert f(bytes(range(31, -1, -1))) == 0x113FDB5C
    assert f(b"") == 0 and f(b"", 0x12345678) == 0x12345678
    assert f(b"a") == 0xC1D04330
    assert ref_bitwise(b"123456789") == ref_table(b"123456789") == 0xE3069283


@case
def matches_bitwise_reference(f=None):
    f = f or crc32c
    rng = np.random.default_rng(1)
    buf = rng.integers(0, 256, 5000 + 16, dtype=np.uint8).tobytes()
    lengths = list(range(0, 140)) + [int(x) for x in rng.integers(0, 5001, 150)] + [4095, 4096, 4097, 5000]
    for i, n in enumerate(lengths):
        off = i % 16
        seed = 0 if i % 3 == 0 else int(rng.integers(0, 2 ** 32))
        d = buf[off:off + n]
        want = ref_bitwise(d, seed)
        got = f(d, seed)
        assert got == want, f"length {n} offset {off} seed {seed:#x}: {got:#010x} != {want:#010x}"


@case
def long_inputs_match_table_reference(f=None):
    f = f or crc32c
    # lengths around the lane runs (4 x 16384, 4 x 2048, 4 x 256, 4 x 32 bytes) and above
    rng = np.random.default_rng(2)
    buf = rng.integers(0, 256, 400000, dtype=np.uint8).tobytes()
    for n in (127, 128, 129, 1023, 1024, 1025, 8191, 8192, 8193, 65535, 65536, 65537, 65536 + 8192 + 1024 + 128 + 3,
              131072 * 2 + 5, 399990):
        for off in (0, 1, 7):
            d = buf[off:off + n]
            assert f(d) == ref_table(d), (n, off)
            assert f(d, 0xDEADBEEF) == ref_table(d, 0xDEADBEEF), (n, off)


@case
def accepts_bytes_like_and_numpy(f=None):
    f = f or crc32c
    rng = np.random.default_rng(3)
    a = rng.standard_normal((37, 129)).astype("<f4")
    raw = a.tobytes()
    want = ref_table(raw)
    views = [raw, bytearray(raw), memoryview(raw), memoryview(bytearray(raw)), a, a.view("<u2"), a.view(np.uint8),
             a.reshape(-1), memoryview(a), np.frombuffer(raw, dtype=np.uint8)]
    for v in views:
        assert f(v) == want, type(v)
    # slices at odd offsets (unaligned views)
    u8 = np.frombuffer(raw, dtype=np.uint8)
    assert f(u8[3:3 + 8001]) == ref_table(raw[3:3 + 8001])
    assert f(memoryview(raw)[5:]) == ref_table(raw[5:])
    # bf16 as uint16, f16, 0-d and empty arrays
    h = a.astype("<f2")
    assert f(h) == ref_table(h.tobytes())
    assert f(np.float32(1.5).reshape(())) == ref_table(np.float32(1.5).tobytes())
    assert f(np.zeros((0, 4), dtype="<f4")) == 0
    for bad in (a[:, ::2], a.T):
        try:
            f(bad)
            raise AssertionError("a non-contiguous array was accepted")
        except ValueError:
            pass


@case
def chaining(f=None):
    f = f or crc32c
    rng = random.Random(4)
    data = bytes(rng.getrandbits(8) for _ in range(100000))
    whole = f(data)
    assert whole == ref_table(data)
    for _ in range(40):
        k = rng.randrange(len(data) + 1)
        assert f(data[k:], f(data[:k])) == whole, k
    c, at = 0, 0
    while at < len(data):
        n = rng.choice([0, 1, 3, rng.randrange(5000)])
        c = f(data[at:at + n], c)
        at += n
    assert c == whole


@case
def numpy_and_c_paths_each_pass_the_checks_above():
    """crc32c is the C library's when the tree is built (make: build/librdcrc32c.so), NumPy's
    otherwise: both paths pass the same checks, and a built tree loads the library."""
    so = os.path.join(ROOT, "build", "librdcrc32c.so")
    if os.path.exists(so) and os.environ.get("ROLLOUTD_CRC32C_LIB") is None:
        assert CRC.C_LIB == os.path.abspath(so), (CRC.C_LIB, so)
    impls = [CRC.crc32c_numpy] + ([CRC.crc32c_c] if CRC.C_LIB else [])
    for f in impls:
        for check in (check_values, matches_bitwise_reference, long_inputs_match_table_reference,
                      accepts_bytes_like_and_numpy, chaining):
            check(f)
    assert CRC.crc32c is not None and (CRC.C_LIB is None or crc32c(b"123456789") == 0xE3069283)


@case
def combine():
    rng = random.Random(5)
    data = bytes(rng.getrandbits(8) for _ in range(30000))
    for i in range(300):
        a = i if i < 20 else rng.randrange(len(data) + 1)
        n = rng.randrange(a, len(data) + 1)
        assert crc32c_combine(crc32c(data[:a]), crc32c(data[a:n]), n - a) == crc32c(data[:n]), (a, n)
    assert crc32c_combine(0x12345678, 0, 0) == 0x12345678
    z = bytes(1 << 20)
    assert crc32c_combine(crc32c(z), crc32c(z), len(z)) == crc32c(z + z)
    big = (5 << 32) | 12345                                   # past 4 GiB: shift composition
    assert crc32c_combine(0xCAFEBABE, 0x01234567, big) == \
        crc32c_combine(crc32c_combine(0xCAFEBABE, 0, big // 2), 0x01234567, big - big // 2)


@case
def agrees_with_c():
    tool = os.path.join(BUILD, "rollout-protodump")
    assert os.path.exists(tool), f"{tool} is missing: run make first"
    rng = np.random.default_rng(6)
    d = os.path.join(TMP, "crc32c_files")
    os.makedirs(d, exist_ok=True)
    paths, want = [], []
    for i, n in enumerate([0, 1, 9, 31, 1000, 65536 + 77, 100003, 3 << 20, (5 << 20) + 13]):
        data = b"123456789" if n == 9 else rng.integers(0, 256, n, dtype=np.uint8).tobytes()
        p = os.path.join(d, f"c{i}.bin")
        with open(p, "wb") as f:
            f.write(data)
        paths.append(p)
        want.append((crc32c(data), n))
    out = run([tool, "--crc32c"] + paths).stdout.splitlines()
    assert len(out) == len(paths), out
    for line, p, (crc, n) in zip(out, paths, want):
        c_crc, c_len, c_path = line.split(" ", 2)
        assert c_path == p and int(c_len) == n, line
        assert int(c_crc, 16) == crc, f"{p} ({n} bytes): C {c_crc}, numpy {crc:08x}"
    assert out[2].startswith("e3069283 9 ")


@case
def speed_informational():
    rng = np.random.default_rng(7)
    for size in (1 << 20, 64 << 20):
        data = rng.integers(0, 256, size, dtype=np.uint8)
        for name, f in [("numpy", CRC.crc32c_numpy)] + ([("C library", CRC.crc32c_c)] if CRC.C_LIB else []):
            f(data[:1 << 16])                                # tables built
            best = 0.0
            for _ in range(2):
                t = time.perf_counter()
                f(data)
                best = max(best, size / (time.perf_counter() - t) / 1e6)
            print(f"# {name} crc32c on {size >> 20} MiB: {best:.0f} MB/s", flush=True)


if __name__ == "__main__":
    main()
