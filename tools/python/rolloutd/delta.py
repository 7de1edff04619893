"""Delta weight pushes (PROTOCOL.md §10.14): the sender's codec.

A delta tensor's chunks carry a stream of records, each covering a range of
the tensor's new bytes (RECORD_BYTES of them here); bytes no record covers keep
the base's value. Per record the encoder sends whichever is smaller:

    RUNS         (u32 skip, u32 count, count values) pairs of the changed
                 elements (gaps shorter than a run head are sent as values);
    XOR_ZSTD     the record's new bytes XOR the base's, one zstd frame;
    SPARSE_ZSTD  one zstd frame of the changed elements alone: u32 count, the
                 gaps between them as LEB128 varints, then their XORs with
                 the base as byte planes (byte 0 of every one, then byte 1...).

A few percent of the elements changed (an RL step) is SPARSE_ZSTD's case: it
compresses only what changed (the XOR frame compresses the whole record, and
a daemon decompresses all of it), and the planes put the XORs' mostly-zero
high bytes together. XOR_ZSTD is tried only where more than an eighth of a
record changed (SPARSE_ZSTD is then rarely smaller). The diff is vectorized
NumPy (one compare over the tensor, then per record np.flatnonzero);
encode_tensor() returns the stream and the number of changed elements. decode() is the reference decoder (the daemon's is
engine/update/delta.c), used by the tests.
"""
import os
import struct
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import zstandard

from . import proto as P

RUNS, XOR_ZSTD, SPARSE_ZSTD = 1, 2, 3
KINDS = (RUNS, XOR_ZSTD, SPARSE_ZSTD)
HEAD = struct.Struct("<B3xIQQ")     # kind, reserved, payload bytes, out_offset, out_bytes
HEAD_BYTES = HEAD.size              # 24
RECORD_BYTES = 1 << 20              # bytes of the tensor one record covers
MAX_RECORD = 16 << 20
ZSTD_LEVEL = 1                      # XOR streams are mostly zeros: level 1 is nearly as small and fastest

_UINT = {1: np.uint8, 2: np.uint16, 4: np.uint32}


def _runs_payload(new_e, changed_idx, es):
    """RUNS payload for the changed element indices (sorted, relative to the
    record) of new_e (the record's new elements): runs merge across gaps of
    fewer elements than a run head's 8 bytes cost."""
    if len(changed_idx) == 0:
        return b""
    merge = max(0, 8 // es - 1)         # unchanged elements cheaper to resend than a new head
    gaps = np.diff(changed_idx) - 1
    brk = np.flatnonzero(gaps > merge)
    starts = np.concatenate(([changed_idx[0]], changed_idx[brk + 1]))
    ends = np.concatenate((changed_idx[brk], [changed_idx[-1]])) + 1
    counts = ends - starts
    prev_end = np.concatenate(([0], ends[:-1]))
    heads = np.empty((len(starts), 2), dtype="<u4")
    heads[:, 0] = starts - prev_end
    heads[:, 1] = counts
    total = int(counts.sum())
    # the element indices of every run, concatenated (np.repeat trick)
    offs = np.repeat(starts - np.concatenate(([0], np.cumsum(counts)[:-1])), counts) + np.arange(total)
    vals = new_e[offs].astype(new_e.dtype.newbyteorder("<"), copy=False).view(np.uint8).reshape(total, es)
    out = np.empty(8 * len(starts) + es * total, dtype=np.uint8)
    run_off = 8 * np.arange(len(starts)) + es * np.concatenate(([0], np.cumsum(counts)[:-1]))
    out[(run_off[:, None] + np.arange(8)).reshape(-1)] = heads.view(np.uint8).reshape(-1)
    val_pos = np.repeat(run_off + 8, counts) + es * (np.arange(total) - np.repeat(
        np.concatenate(([0], np.cumsum(counts)[:-1])), counts))
    out[(val_pos[:, None] + np.arange(es)).reshape(-1)] = vals.reshape(-1)
    return out.tobytes()


def _runs_bytes(changed_idx, es):
    """The RUNS payload's size for these changed element indices (sorted,
    non-empty), without building it: the same merging as _runs_payload."""
    merge = max(0, 8 // es - 1)
    gaps = np.diff(changed_idx) - 1
    brk = gaps > merge
    n_runs = int(np.count_nonzero(brk)) + 1
    total = int(changed_idx[-1]) - int(changed_idx[0]) + 1 - int(gaps[brk].sum())
    return 8 * n_runs + es * total


def _varints(g):
    """LEB128 bytes of the uint array g (values < 2**32), vectorized."""
    if len(g) == 0 or int(g.max()) < 128:
        return g.astype(np.uint8).tobytes()
    g = g.astype(np.uint64)
    nb = 1 + (g >= 1 << 7).astype(np.int64) + (g >= 1 << 14) + (g >= 1 << 21) + (g >= 1 << 28)
    ends = np.cumsum(nb)
    starts = ends - nb
    out = np.empty(int(ends[-1]), dtype=np.uint8)
    for j in range(5):
        m = nb > j
        if not m.any():
            break
        out[starts[m] + j] = ((g[m] >> np.uint64(7 * j)) & np.uint64(0x7F)).astype(np.uint8) | \
            ((nb[m] > j + 1).astype(np.uint8) << 7)
    return out.tobytes()


def _sparse_raw(new_e, base_e, changed_idx, es):
    """SPARSE_ZSTD's uncompressed bytes for the changed element indices
    (sorted, relative to the record) of the record's elements."""
    gaps = np.diff(changed_idx, prepend=-1) - 1
    x = (new_e[changed_idx] ^ base_e[changed_idx]).astype(new_e.dtype.newbyteorder("<"), copy=False)
    planes = x.view(np.uint8).reshape(len(changed_idx), es).T
    return struct.pack("<I", len(changed_idx)) + _varints(gaps) + planes.tobytes()


_local = threading.local()


def _compressor(level):
    st = getattr(_local, "cz", None)
    if st is None or st[0] != level:
        st = _local.cz = (level, zstandard.ZstdCompressor(level=level))
    return st[1]


def _xor_zstd(new, base, level):
    """One zstd frame of new XOR base (uint8 arrays of one record), from a
    per-thread buffer and compressor (a compressor is not thread-safe)."""
    st = getattr(_local, "st", None)
    if st is None or st[0] != level or len(st[2]) < len(new):
        st = _local.st = (level, zstandard.ZstdCompressor(level=level), np.empty(max(len(new), RECORD_BYTES), np.uint8))
    buf = st[2][:len(new)]
    if len(new) % 8 == 0:   # a word at a time
        np.bitwise_xor(new.view(np.uint64), base.view(np.uint64), out=buf.view(np.uint64))
    else:
        np.bitwise_xor(new, base, out=buf)
    return st[1].compress(buf)


def _record(new, base, ne, be, diff, off, n, es, level, kinds):
    """(head + payload, changed elements) of the record covering bytes
    [off, off + n), or (None, 0) when nothing in it changed."""
    e0, e1 = off // es, (off + n) // es
    idx = np.flatnonzero(diff[e0:e1])
    if len(idx) == 0:
        return None, 0
    best = (_runs_bytes(idx, es), RUNS) if RUNS in kinds else None
    if best is None or best[0] > 64:        # a few runs beat any zstd frame
        if SPARSE_ZSTD in kinds:
            z = _compressor(level).compress(_sparse_raw(ne[e0:e1], be[e0:e1], idx, es))
            if best is None or len(z) < best[0]:
                best = (len(z), SPARSE_ZSTD, z)
        if XOR_ZSTD in kinds and (8 * len(idx) > e1 - e0 or SPARSE_ZSTD not in kinds):
            z = _xor_zstd(new[off:off + n], base[off:off + n], level)
            if best is None or len(z) < best[0]:
                best = (len(z), XOR_ZSTD, z)
    if best[1] == RUNS:
        runs = _runs_payload(ne[e0:e1], idx, es)
        return HEAD.pack(RUNS, len(runs), off, n) + runs, len(idx)
    return HEAD.pack(best[1], best[0], off, n) + best[2], len(idx)


# ---- the project's C encoder, when it is built ----
#
# build/librddelta.so (make: client/rd_delta.c, what rolloutctl push-weights
# --base writes: the same record size, kinds and choice) runs outside the GIL
# (ctypes lets it go), so a tensor's slices encode on every thread at once;
# the NumPy encoder above holds the GIL in most of its per-record steps, and
# its threads barely add up. ROLLOUTD_DELTA_LIB names another copy;
# ROLLOUTD_DELTA_LIB=none keeps NumPy.

SLICE_RECORDS = 8           # records a thread encodes per call


def _load_c():
    import ctypes
    path = os.environ.get("ROLLOUTD_DELTA_LIB") or os.path.join(
        os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "build", "librddelta.so")
    if path == "none" or not os.path.exists(path):
        return None, None
    try:
        lib = ctypes.CDLL(os.path.abspath(path))
        f, free = lib.rdd_encode_range, lib.rdd_stream_free
    except (OSError, AttributeError):
        return None, None
    f.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_uint64, ctypes.c_uint32, ctypes.c_uint64,
                  ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(ctypes.c_uint64), ctypes.POINTER(ctypes.c_uint64)]
    f.restype = ctypes.c_int
    free.argtypes = [ctypes.c_void_p]
    free.restype = None
    return (f, free), os.path.abspath(path)


_C, C_LIB = _load_c()


def _c_range(new, base, es, off, n):
    """(records, changed) of bytes [off, off + n) through the C encoder."""
    import ctypes
    out, out_len, changed = ctypes.c_void_p(), ctypes.c_uint64(), ctypes.c_uint64()
    rc = _C[0](new.ctypes.data + off, base.ctypes.data + off, n, es, off, ctypes.byref(out), ctypes.byref(out_len),
               ctypes.byref(changed))
    if rc:
        raise MemoryError(f"delta: the C encoder failed ({rc})")
    try:
        return ctypes.string_at(out.value, out_len.value) if out_len.value else b"", changed.value
    finally:
        _C[1](out)


def encode_tensor(new, base, es, record_bytes=RECORD_BYTES, level=ZSTD_LEVEL, kinds=KINDS, executor=None, c=None):
    """(stream bytes, changed elements) of the delta from base to new: flat
    uint8 arrays (or buffers) of the same length, elements of es bytes;
    each record the smallest of the kinds allowed (the RUNS size is counted
    first and the runs built only when they win; XOR_ZSTD tried as the
    module says). executor (a concurrent.futures executor): records encoded
    on its threads (NumPy's large operations and zstd release the GIL; each
    thread keeps its own compressor). c: use the C encoder (None: when it is
    built and the record size, level and kinds are its own; True: it must
    be; False: NumPy)."""
    new = np.frombuffer(new, dtype=np.uint8) if not isinstance(new, np.ndarray) else new.reshape(-1).view(np.uint8)
    base = np.frombuffer(base, dtype=np.uint8) if not isinstance(base, np.ndarray) else base.reshape(-1).view(np.uint8)
    if len(new) != len(base) or len(new) % es:
        raise ValueError(f"delta: {len(new)} new bytes against {len(base)} base bytes of {es}-byte elements")
    rb = max(es, min(int(record_bytes), MAX_RECORD) // es * es)
    own = rb == RECORD_BYTES and level == ZSTD_LEVEL and tuple(kinds) == KINDS and es in (2, 4)
    if c is None:
        c = _C is not None and own
    elif c and (_C is None or not own):
        raise ValueError("delta: the C encoder is not built, or takes only its own record size, level and kinds")
    if c:
        sl = SLICE_RECORDS * RECORD_BYTES
        offs = range(0, len(new), sl)

        def one_c(off):
            return _c_range(new, base, es, off, min(sl, len(new) - off))

        done = list(executor.map(one_c, offs) if executor is not None and len(offs) > 1 else map(one_c, offs))
        stream = b"".join(r for r, _ in done)
        return stream or HEAD.pack(RUNS, 0, 0, es), sum(ch for _, ch in done)
    ne, be = new.view(_UINT[es]), base.view(_UINT[es])
    diff = ne != be
    offs = range(0, len(new), rb)

    def one(off):
        return _record(new, base, ne, be, diff, off, min(rb, len(new) - off), es, level, kinds)

    done = executor.map(one, offs) if executor is not None and len(offs) > 1 else map(one, offs)
    parts, changed = [], 0
    for rec, ch in done:
        if rec is not None:
            parts.append(rec)
            changed += ch
    if not parts:       # unchanged: one empty record (a delta has at least one byte)
        parts.append(HEAD.pack(RUNS, 0, 0, es))
    return b"".join(parts), changed


def decode(stream, base, es):
    """The new bytes (a uint8 array) from base and a stream (reference decoder)."""
    out = np.array(np.frombuffer(base, dtype=np.uint8) if not isinstance(base, np.ndarray)
                   else base.reshape(-1).view(np.uint8), copy=True)
    mv = memoryview(stream)
    at, end_prev = 0, 0
    dctx = zstandard.ZstdDecompressor()
    while at < len(mv):
        if len(mv) - at < HEAD_BYTES:
            raise ValueError(f"delta: {len(mv) - at} bytes left at {at}; a record head is {HEAD_BYTES}")
        kind, payload, off, n = HEAD.unpack_from(mv, at)
        if mv[at + 1:at + 4] != b"\0\0\0" or kind not in KINDS or off < end_prev or \
                off + n > len(out) or n == 0 or n > MAX_RECORD or off % es or n % es or \
                payload > len(mv) - at - HEAD_BYTES:
            raise ValueError(f"delta: bad record head at {at}: kind {kind}, payload {payload}, [{off}, +{n})")
        p = mv[at + HEAD_BYTES:at + HEAD_BYTES + payload]
        if kind == XOR_ZSTD:
            x = dctx.decompress(bytes(p), max_output_size=n)
            if len(x) != n:
                raise ValueError(f"delta: a zstd frame of {len(x)} bytes for {n}")
            out[off:off + n] ^= np.frombuffer(x, dtype=np.uint8)
        elif kind == SPARSE_ZSTD:
            x = dctx.decompress(bytes(p), max_output_size=4 + (n // es) * (5 + es))
            count = struct.unpack_from("<I", x)[0]
            if count == 0 or count > n // es or 4 + count * es > len(x):
                raise ValueError(f"delta: a bad sparse count {count} at record {at}")
            vend = len(x) - count * es
            planes = np.frombuffer(x, dtype=np.uint8, offset=vend).reshape(es, count)
            q, pos = 4, 0
            for k in range(count):
                gap, shift = 0, 0
                while True:
                    if q >= vend or shift > 28:
                        raise ValueError(f"delta: a bad varint at record {at}")
                    b = x[q]
                    q += 1
                    gap |= (b & 0x7F) << shift
                    shift += 7
                    if not b & 0x80:
                        break
                pos += gap
                if pos >= n // es:
                    raise ValueError(f"delta: a sparse gap past record {at}")
                out[off + pos * es:off + (pos + 1) * es] ^= planes[:, k]
                pos += 1
            if q != vend:
                raise ValueError(f"delta: {vend - q} bytes of gaps left over at record {at}")
        else:
            q, pos = 0, 0
            while q < payload:
                skip, count = struct.unpack_from("<II", p, q)
                q += 8
                pos += skip
                if count == 0 or (pos + count) * es > n or q + count * es > payload:
                    raise ValueError(f"delta: a bad run at record {at}")
                out[off + pos * es:off + (pos + count) * es] = np.frombuffer(p[q:q + count * es], dtype=np.uint8)
                q += count * es
                pos += count
        end_prev = off + n
        at += HEAD_BYTES + payload
    return out


def tensor_bytes(x):
    """(dtype code, shape, flat uint8 array) of a tensor as push_weights takes it."""
    from .client import _wire_tensor
    dt, shape, mv = _wire_tensor("tensor", x)
    return dt, shape, np.frombuffer(mv, dtype=np.uint8)


def _threads():
    return max(1, min(8, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1))


def prepare_delta(tensors, base, base_version, chunk_bytes=16 << 20, record_bytes=RECORD_BYTES, threads=None):
    """A PreparedUpdate sending each tensor as a delta against base (a dict
    name -> tensor, or name -> (dtype code, flat uint8 array)) at base_version
    where base has it in the same dtype and size, else whole. .delta_stats:
    tensors, delta tensors, changed elements, elements of the delta tensors,
    tensor bytes, wire bytes and the encoder's seconds. threads: records are
    encoded on this many threads (default: the CPUs this process may use, at
    most 8), and the new bytes' CRC-32Cs on one more, alongside."""
    import time
    from .client import PreparedUpdate
    t0 = time.perf_counter()
    items = list(tensors.items()) if hasattr(tensors, "items") else list(tensors)
    if not items:
        raise ValueError("push: no tensors")
    prep = object.__new__(PreparedUpdate)
    prep.manifest, prep.data = [], []
    stats = {"tensors": 0, "delta_tensors": 0, "changed": 0, "delta_elems": 0, "tensor_bytes": 0}
    seen = set()
    threads = _threads() if threads is None else max(1, int(threads))
    with ThreadPoolExecutor(threads, thread_name_prefix="delta") as ex, \
            ThreadPoolExecutor(1, thread_name_prefix="delta-crc") as crc_ex:
        crcs = []       # (tensor, future CRC-32C of its new bytes)
        _prepare_tensors(items, base, base_version, record_bytes, prep, stats, seen, ex, crc_ex, crcs)
        for t, f in crcs:
            t.crc32c = f.result()
    prep.total_bytes = sum(len(d) for d in prep.data)
    prep._chunk(chunk_bytes, None)
    prep.prepare_seconds = time.perf_counter() - t0
    stats["wire_bytes"] = prep.total_bytes
    stats["encode_seconds"] = prep.prepare_seconds
    prep.delta_stats = stats
    return prep


def _prepare_tensors(items, base, base_version, record_bytes, prep, stats, seen, ex, crc_ex, crcs):
    from .client import crc32c
    for name, x in items:
        if name in seen:
            raise ValueError(f"tensor {name!r} is listed twice")
        seen.add(name)
        dt, shape, new = tensor_bytes(x)
        es = P.DTYPE_SIZES[dt]
        b = base.get(name) if base is not None else None
        if b is not None and not isinstance(b, tuple):
            bdt, _, bb = tensor_bytes(b)
            b = (bdt, bb)
        t = P.Tensor(name=name, dtype=dt, shape=shape, nbytes=len(new))
        stats["tensors"] += 1
        stats["tensor_bytes"] += len(new)
        if b is not None and b[0] == dt and len(b[1]) == len(new):
            crcs.append((t, crc_ex.submit(crc32c, new)))
            stream, changed = encode_tensor(new, b[1], es, record_bytes, executor=ex)
            t.flags, t.wire_bytes, t.base_version = P.TENSOR_DELTA, len(stream), int(base_version)
            stats["delta_tensors"] += 1
            stats["changed"] += changed
            stats["delta_elems"] += len(new) // es
            prep.manifest.append(t)
            prep.data.append(memoryview(stream))
        else:
            prep.manifest.append(t)
            prep.data.append(memoryview(new))
