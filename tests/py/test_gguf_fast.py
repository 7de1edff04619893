"""gguf_fast.GGUFReader against the `gguf` package's own reader: every field
(name, offset, types, data indexes, and each part's dtype, shape and values)
and every tensor (name, type, shape, data offset, bytes) of the default
model (string arrays: the vocabulary and merges; an int32 array) and of a
file written here with arrays of every scalar type and an
array of arrays (which the package's own code parses) are the same."""
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import MODEL, TMP, case, main  # noqa: E402
from gguf_fast import GGUFReader as Fast  # noqa: E402

import gguf  # noqa: E402



def same_reader(path, want_arrays):
    a, b = gguf.GGUFReader(path), Fast(path)
    assert list(a.fields) == list(b.fields), path
    arrays = set()
    for k, fa in a.fields.items():
        fb = b.fields[k]
        assert (fa.offset, fa.name, fa.data, fa.types) == (fb.offset, fb.name, fb.data, fb.types), k
        assert len(fa.parts) == len(fb.parts), k
        for pa, pb in zip(fa.parts, fb.parts):
            assert pa.dtype == pb.dtype and pa.shape == pb.shape and np.array_equal(pa, pb), k
        assert fa.contents() == fb.contents(), k
        if fa.types[0] == gguf.GGUFValueType.ARRAY and len(fa.types) > 1:
            arrays.add(fa.types[1])
    assert want_arrays <= arrays, (path, arrays)
    ta = [(t.name, t.tensor_type, t.shape.tolist(), t.data_offset, t.n_bytes) for t in a.tensors]
    tb = [(t.name, t.tensor_type, t.shape.tolist(), t.data_offset, t.n_bytes) for t in b.tensors]
    assert ta == tb and ta, path
    assert all(np.array_equal(x.data, y.data) for x, y in zip(a.tensors[:4], b.tensors[:4]))


@case
def the_default_model_reads_the_same():
    same_reader(MODEL, {gguf.GGUFValueType.STRING, gguf.GGUFValueType.INT32})


@case
def arrays_of_every_type_read_the_same():
    V = gguf.GGUFValueType
    path = os.path.join(TMP, f"gguf-fast-{os.getpid()}.gguf")
    w = gguf.GGUFWriter(path, arch="llama")
    rng = np.random.default_rng(3)
    kinds = {V.UINT8: np.uint8, V.INT8: np.int8, V.UINT16: np.uint16, V.INT16: np.int16, V.UINT32: np.uint32,
             V.INT32: np.int32, V.FLOAT32: np.float32, V.UINT64: np.uint64, V.INT64: np.int64, V.FLOAT64: np.float64}
    for vt, dt in kinds.items():
        vals = rng.integers(0, 100, 37).astype(dt).tolist()
        w.add_key_value(f"test.{vt.name.lower()}", vals, V.ARRAY, sub_type=vt)
    w.add_key_value("test.bool", [True, False, True], V.ARRAY, sub_type=V.BOOL)
    w.add_key_value("test.strings", ["", "a", "\u00e9t\u00e9", "x" * 300], V.ARRAY, sub_type=V.STRING)
    w.add_key_value("test.nested", [[1, 2], [3]], V.ARRAY, sub_type=V.ARRAY)
    w.add_key_value("test.scalar", 7, V.UINT32)
    w.add_tensor("t", np.arange(64, dtype=np.float32).reshape(4, 16))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    try:
        same_reader(path, set(kinds) | {V.BOOL, V.STRING, V.ARRAY})
    finally:
        os.unlink(path)


if __name__ == "__main__":
    main()
