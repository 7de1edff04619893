"""CRC-32C (Castagnoli) in numpy: the checksum of weight updates (PROTOCOL.md §10).

    crc32c(b"123456789") == 0xE3069283
    crc32c(b, crc32c(a)) == crc32c(a + b)          # zlib-style chaining
    crc32c_combine(crc32c(a), crc32c(b), len(b)) == crc32c(a + b)

Reflected polynomial 0x82F63B78, initial value and final xor 0xFFFFFFFF; the
same values as base/crc32c.c. Input: bytes, bytearray, memoryview or a
C-contiguous numpy array of any dtype (its raw bytes).

How it is fast in pure numpy. A CRC register is linear over GF(2): shifting
it past n zero bytes multiplies it by x^(8n) mod P, a 32x32 bit matrix applied
as two lookups in 65536-entry tables (one per 16-bit half). A long run of
bytes is cut into L interleaved lanes (lane k takes the 4-byte words k, k + L,
k + 2L, ...), and one numpy step advances all L lane registers by one word:

    c = shift(4L)(c ^ word)

so each lane's register stays "just before its next word". The last step
shifts by 4 only, leaving lane k's register at the end of its own last word,
4 (L - 1 - k) bytes before the end of the run; a tree of pairwise merges
(shift the left one past 4, 8, 16, ... bytes and xor) folds the L registers
into the register of the whole run. The initial register rides in lane 0.
What is left (shorter than 4L) goes through the same steps with fewer lanes,
the last few bytes through a byte-at-a-time table loop. About 0.5 table
lookups per byte, in numpy calls over 16384 lanes: several hundred MB/s.
"""
import numpy as np

POLY = 0x82F63B78
_MASK = 0xFFFFFFFF


# ---- GF(2) polynomials modulo P (reflected: bit 31 is x^0) ----

def _multmodp(a, b):
    """a * b mod P."""
    m, p = 1 << 31, 0
    while True:
        if a & m:
            p ^= b
            if not a & (m - 1):
                return p
        m >>= 1
        b = (b >> 1) ^ POLY if b & 1 else b >> 1


def _x2n_table():
    t, p = [], 1 << 30           # x^1
    for _ in range(67):          # x^(2^k) for k up to 3 + 63
        t.append(p)
        p = _multmodp(p, p)
    return t


_X2N = _x2n_table()


def _x8n(n):
    """x^(8n) mod P: the operator shifting a register past n zero bytes."""
    p, k = 1 << 31, 3
    while n:
        if n & 1:
            p = _multmodp(_X2N[k], p)
        n >>= 1
        k += 1
    return p


def crc32c_combine(crc1, crc2, len2):
    """The CRC-32C of A || B from crc1 = CRC of A, crc2 = CRC of B and len2 =
    len(B) in bytes (the initial and final xors cancel)."""
    if len2 < 0:
        raise ValueError(f"len2 = {len2}; expected >= 0")
    return _multmodp(_x8n(int(len2)), int(crc1) & _MASK) ^ (int(crc2) & _MASK)


# ---- tables ----

def _byte_table():
    t = []
    for b in range(256):
        c = b
        for _ in range(8):
            c = (c >> 1) ^ POLY if c & 1 else c >> 1
        t.append(c)
    return t


_T0 = _byte_table()


def _linear_table(images):
    """The table of a GF(2)-linear map on len(images) bits: entry x is the xor
    of images[i] over the bits i set in x."""
    t = np.zeros(1, dtype=np.uint32)
    for v in images:
        t = np.concatenate([t, t ^ np.uint32(v)])
    return t


class _Shift:
    """Multiplication of registers by x^(8n) mod P (a shift past n zero bytes),
    as two 16-bit lookup tables."""

    def __init__(self, n):
        op = _x8n(n)
        self.lo = _linear_table([_multmodp(op, 1 << i) for i in range(16)])
        self.hi = _linear_table([_multmodp(op, 1 << i) for i in range(16, 32)])

    def __call__(self, c):
        return np.take(self.lo, (c & 0xFFFF).astype(np.intp), mode="clip") ^ \
            np.take(self.hi, (c >> 16).astype(np.intp), mode="clip")


_shifts = {}


def _shift(n):
    s = _shifts.get(n)
    if s is None:
        s = _shifts[n] = _Shift(n)
    return s


# Lane counts, largest first; a run of L lanes covers a multiple of 4L bytes.
_LANES = (16384, 2048, 256, 32)


def _lanes(reg, words, L):
    """The register after the bytes of words (uint32, shape (m, L): words[j, k]
    is the 4-byte word j * L + k), starting from register reg."""
    m = words.shape[0]
    c = np.zeros(L, dtype=np.uint32)
    c[0] = reg
    x = np.empty(L, dtype=np.uint32)
    t = np.empty(L, dtype=np.uint32)
    i_lo = np.empty(L, dtype=np.intp)    # intp indices: np.take converts nothing
    i_hi = np.empty(L, dtype=np.intp)
    mid, end = _shift(4 * L), _shift(4)
    for j in range(m):
        op = end if j == m - 1 else mid
        np.bitwise_xor(c, words[j], out=x)
        np.bitwise_and(x, 0xFFFF, out=i_lo)
        np.right_shift(x, 16, out=i_hi)
        np.take(op.lo, i_lo, out=c, mode="clip")
        np.take(op.hi, i_hi, out=t, mode="clip")
        np.bitwise_xor(c, t, out=c)
    # fold: lane k ends 4 (L - 1 - k) bytes before the run's end
    width = 4
    while len(c) > 1:
        c = _shift(width)(c[0::2]) ^ c[1::2]
        width *= 2
    return int(c[0])


def _bytewise(reg, b):
    t = _T0
    for x in b.tobytes():
        reg = (reg >> 8) ^ t[(reg ^ x) & 0xFF]
    return reg


def _as_u8(data):
    if isinstance(data, np.ndarray):
        if not data.flags.c_contiguous:
            raise ValueError("crc32c: a numpy array must be C-contiguous")
        return data.reshape(-1).view(np.uint8)
    mv = memoryview(data)
    if mv.format != "B" or mv.ndim != 1:
        if not mv.c_contiguous:
            raise ValueError("crc32c: a memoryview must be C-contiguous")
        mv = mv.cast("B")
    return np.frombuffer(mv, dtype=np.uint8)


def crc32c_numpy(data, crc=0):
    """The CRC-32C of data, continuing from crc (the CRC of what came before;
    0 to start), in NumPy."""
    b = _as_u8(data)
    reg = (int(crc) & _MASK) ^ _MASK
    at, n = 0, len(b)
    for L in _LANES:
        span = 4 * L
        m = (n - at) // span
        if m:
            words = b[at:at + m * span].view("<u4").reshape(m, L)
            reg = _lanes(reg, words, L)
            at += m * span
    if at < n:
        reg = _bytewise(reg, b[at:])
    return reg ^ _MASK


# ---- the project's C CRC-32C, when it is built ----
#
# build/librdcrc32c.so (make: base/crc32c.c, SSE4.2's crc32 instruction over
# three streams) runs at many GB/s and outside the GIL (ctypes lets it go), so
# a push's checksums overlap its encoding on other threads; the NumPy path
# above runs at ~0.7 GB/s holding the GIL for most of it. ROLLOUTD_CRC32C_LIB
# names another copy; ROLLOUTD_CRC32C_LIB=none keeps NumPy.

def _load_c():
    import ctypes
    import os
    path = os.environ.get("ROLLOUTD_CRC32C_LIB") or os.path.join(
        os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "build", "librdcrc32c.so")
    if path == "none" or not os.path.exists(path):
        return None, None
    try:
        f = ctypes.CDLL(os.path.abspath(path)).crc32c
    except (OSError, AttributeError):
        return None, None
    f.argtypes = [ctypes.c_uint32, ctypes.c_void_p, ctypes.c_size_t]
    f.restype = ctypes.c_uint32
    if f(0, b"123456789", 9) != 0xE3069283:   # a library that is not ours
        return None, None
    return f, os.path.abspath(path)


_C, C_LIB = _load_c()


def crc32c_c(data, crc=0):
    """The same through the C library (C_LIB); only when it loaded."""
    b = _as_u8(data)
    return int(_C(int(crc) & _MASK, b.ctypes.data if len(b) else None, len(b)))


def crc32c(data, crc=0):
    """The CRC-32C of data, continuing from crc (the CRC of what came before;
    0 to start): the C library's when it is built, else NumPy's."""
    return crc32c_c(data, crc) if _C is not None else crc32c_numpy(data, crc)
