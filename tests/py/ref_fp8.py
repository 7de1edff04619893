"""FP8 E4M3 blocks by NumPy, written from the rule in engine/model/quant_fp8.h and
independent of its C: per block of 32 the least e >= -117 with max|x| <= 448 * 2^e
(0 for an all-zero block), then each x / 2^e to the nearest E4M3 value, ties to the
even code, saturated at 448; a block is its scale byte e + 127, then the 32 codes."""
import numpy as np

# The finite positive E4M3 values, codes 0..126 (0x7f is NaN), increasing:
# exponent field 0 is subnormal (m / 8 * 2^-6), else (1 + m / 8) * 2^(E - 7).
E4M3 = np.array([(c & 7) / 8 * 2.0 ** -6 if c >> 3 == 0 else (1 + (c & 7) / 8) * 2.0 ** ((c >> 3) - 7)
                 for c in range(127)])


def block_exponents(b):
    """b [n][32] float64 -> e [n]; raises on a block past 448 * 2^7."""
    amax = np.abs(b).max(axis=1)
    e = np.zeros(len(b), np.int64)
    nz = amax > 0
    e[nz] = np.ceil(np.log2(amax[nz] / 448.0)).astype(np.int64)
    e[nz & (np.ldexp(448.0, e - 1) >= amax)] -= 1      # log2's rounding, either way
    e[nz & (np.ldexp(448.0, e) < amax)] += 1
    e = np.maximum(e, -117)
    if (e > 7).any():
        raise ValueError("a block past 57344")
    return e


def encode(x):
    """x (float32, a multiple of 32 values) -> the blocks' bytes (uint8 [n][33])."""
    b = np.asarray(x, np.float32).astype(np.float64).reshape(-1, 32)
    e = block_exponents(b)
    y = np.abs(b) / np.ldexp(1.0, e)[:, None]       # exact: a power of two
    hi = np.clip(np.searchsorted(E4M3, y, side="left"), 1, 126)   # E4M3[hi - 1] < y <= E4M3[hi]
    lo = hi - 1
    dlo, dhi = y - E4M3[lo], E4M3[hi] - y
    code = np.where((dhi < dlo) | ((dhi == dlo) & (hi % 2 == 0)), hi, lo)
    code = np.where(y >= 448.0, 126, code).astype(np.uint8)
    code |= np.where(np.signbit(b), 0x80, 0).astype(np.uint8)
    out = np.empty((len(b), 33), np.uint8)
    out[:, 0] = (e + 127).astype(np.uint8)
    out[:, 1:] = code
    return out


def decode(blocks):
    """uint8 [n][33] -> float64 values [n * 32]."""
    blocks = np.asarray(blocks, np.uint8).reshape(-1, 33)
    c = blocks[:, 1:]
    v = E4M3[np.minimum(c & 0x7F, 126)] * np.where(c & 0x80, -1.0, 1.0)
    return (v * np.ldexp(1.0, blocks[:, :1].astype(np.int64) - 127)).reshape(-1)


def values(x):
    """The values the blocks of x hold (float64, x's shape)."""
    return decode(encode(x)).reshape(np.shape(x))
