"""llama.cpp's own quantizers, from the ggml library llama-cpp-python ships (libggml-base):
ggml_quantize_chunk with no importance matrix runs ggml's quantize_row_*_ref. The oracle the
Q4_K tests and benchmarks compare against."""
import ctypes
import os

import numpy as np

Q4_K = 12
_lib = None


def _ggml():
    global _lib
    if _lib is None:
        import llama_cpp
        _lib = ctypes.CDLL(os.path.join(os.path.dirname(llama_cpp.__file__), "lib", "libggml-base.so"))
        _lib.ggml_quantize_chunk.restype = ctypes.c_size_t
        _lib.ggml_quantize_chunk.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64,
                                             ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p]
    return _lib


def q4_k(a):
    """a [rows][cols] (cols a multiple of 256) quantized to Q4_K by ggml: uint8 [rows][cols / 256 * 144]."""
    a = np.ascontiguousarray(a, dtype=np.float32)
    rows, cols = a.shape
    out = np.zeros((rows, cols // 256 * 144), np.uint8)
    n = _ggml().ggml_quantize_chunk(Q4_K, a.ctypes.data, out.ctypes.data, 0, rows, cols, None)
    assert n == out.nbytes, (n, out.nbytes)
    return out
