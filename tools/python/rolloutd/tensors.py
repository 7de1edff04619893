"""Pushes from a trainer's tensors: (name, array) pairs, NumPy or torch (CPU or CUDA), as an
FSDP or Megatron state dict gives them, streamed to the daemons (Pool.push_tensors).

The update's manifest needs every tensor's CRC-32C before UPDATE_BEGIN, so the tensors are
read twice, one at a time: once to checksum them, once to send them. Only references to the
caller's tensors are kept (what its model holds anyway); each tensor's host bytes (a copy
from the GPU, a dtype conversion) exist while it is checksummed or sent, then go. For a
CPU NumPy array already in a wire dtype the bytes are the array itself (no copy).

Before anything is sent, the names and shapes are checked against the daemons' manifest
(GET /weights_manifest, or a {name: shape} given): names the model does not have, tensors
it has that are missing, and shape mismatches are refused together in one TensorMismatch
that lists them, so nothing is staged or committed."""
import inspect
import json
import threading
import time
import urllib.error
import urllib.request
from collections import OrderedDict

import numpy as np

from . import proto as P
from .crc32c import crc32c, crc32c_combine
from .client import MIN_CHUNK, PreparedUpdate, _wire_tensor, bf16_bits

DTYPES = {"f32": P.DTYPE_F32, "float32": P.DTYPE_F32, "f16": P.DTYPE_F16, "float16": P.DTYPE_F16,
          "bf16": P.DTYPE_BF16, "bfloat16": P.DTYPE_BF16}


class TensorMismatch(ValueError):
    """The tensors do not match the model: .unknown (names it does not have), .missing
    (its tensors not given), .shapes ({name: (given, the model's)})."""

    def __init__(self, unknown, missing, shapes):
        self.unknown, self.missing, self.shapes = list(unknown), list(missing), dict(shapes)
        lines = []
        if self.unknown:
            lines.append(f"{len(self.unknown)} names the model does not have: " + ", ".join(self.unknown[:20])
                         + (" ..." if len(self.unknown) > 20 else ""))
        if self.missing:
            lines.append(f"{len(self.missing)} of the model's tensors missing: " + ", ".join(self.missing[:20])
                         + (" ..." if len(self.missing) > 20 else ""))
        if self.shapes:
            lines.append(f"{len(self.shapes)} shape mismatches: " + ", ".join(
                f"{k} {list(g)} (the model's {list(w)})" for k, (g, w) in list(self.shapes.items())[:20])
                + (" ..." if len(self.shapes) > 20 else ""))
        super().__init__("push_tensors refused before UPDATE_BEGIN (nothing staged or committed):\n  "
                         + "\n  ".join(lines))


def fetch_manifest(http_url, api_key=None, timeout=30):
    """{HF name: shape tuple} of every tensor a push to that daemon may carry (GET /weights_manifest)."""
    req = urllib.request.Request(http_url.rstrip("/") + "/weights_manifest",
                                 headers={"Authorization": f"Bearer {api_key}"} if api_key else {})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        doc = json.loads(r.read())
    return {t["name"]: tuple(int(d) for d in t["shape"]) for t in doc["tensors"]}


def _shape(x):
    return tuple(int(d) for d in x.shape)


def check_tensors(items, manifest, partial=False):
    """Raises TensorMismatch listing every unknown name, missing tensor (unless partial) and
    wrong shape of items [(name, tensor)] against manifest {name: shape}."""
    given = OrderedDict()
    for name, x in items:
        given[name] = _shape(x)
    unknown = [n for n in given if n not in manifest]
    missing = [] if partial else [n for n in manifest if n not in given]
    shapes = {n: (s, tuple(manifest[n])) for n, s in given.items() if n in manifest and tuple(manifest[n]) != s}
    if unknown or missing or shapes:
        raise TensorMismatch(unknown, missing, shapes)


def _host(name, x, dtype):
    """(dtype code, shape, flat uint8 memoryview) of one tensor on the host in the wire dtype
    asked (None: its own)."""
    if dtype is not None:
        want = DTYPES[dtype]
        if type(x).__module__.split(".")[0] == "torch":
            import torch  # only when the caller already uses it
            x = x.detach().to({P.DTYPE_F32: torch.float32, P.DTYPE_F16: torch.float16,
                               P.DTYPE_BF16: torch.bfloat16}[want])
        else:
            a = x if isinstance(x, np.ndarray) else np.asarray(x)
            bits = a.dtype.kind == "u" and a.dtype.itemsize == 2       # bf16 bit patterns
            if want == P.DTYPE_BF16:
                x = a if bits else bf16_bits(a)
            else:
                f = (a.astype(np.uint32) << 16).view(np.float32) if bits else a
                x = f.astype(np.float16 if want == P.DTYPE_F16 else np.float32)
    return _wire_tensor(name, x)


class _LazyData:
    """PreparedUpdate.data for a StreamedUpdate: tensor i's host bytes made on access, the last
    few kept (chunks of one tensor are sent one after another)."""

    def __init__(self, items, dtype, keep=3):
        self.items, self.dtype, self.keep = items, dtype, keep
        self.cache = OrderedDict()
        self.lock = threading.Lock()
        self.made = 0               # host materializations (tests count them)

    def __len__(self):
        return len(self.items)

    def __getitem__(self, i):
        with self.lock:
            mv = self.cache.get(i)
            if mv is not None:
                self.cache.move_to_end(i)
                return mv
        name, x = self.items[i]
        mv = _host(name, x, self.dtype)[2]
        with self.lock:
            self.made += 1
            self.cache[i] = mv
            while len(self.cache) > self.keep:
                self.cache.popitem(last=False)
        return mv

    def __iter__(self):
        for i in range(len(self.items)):
            yield self[i]


class StreamedUpdate(PreparedUpdate):
    """A PreparedUpdate over (name, tensor) pairs that never holds every tensor's host bytes
    at once (see the module's doc). Push it with Client.push_weights or Pool.push_weights."""

    def __init__(self, named_tensors, dtype=None, chunk_bytes=16 << 20):
        t0 = time.perf_counter()
        if dtype is not None and dtype not in DTYPES:
            raise ValueError(f"dtype {dtype!r}; expected one of {', '.join(DTYPES)} or None (each tensor's own)")
        items = list(named_tensors.items()) if hasattr(named_tensors, "items") else list(named_tensors)
        if not items:
            raise ValueError("push_tensors: no tensors")
        cb = int(chunk_bytes)
        if cb < MIN_CHUNK:
            raise ValueError(f"chunk size {cb}; expected at least {MIN_CHUNK} bytes")
        self.manifest, self.chunks, self.chunk_bytes = [], [], cb
        seen = set()
        for ti, (name, x) in enumerate(items):       # the checksum pass: one tensor's bytes at a time
            if not isinstance(name, str) or not name:
                raise ValueError(f"tensor name {name!r}; expected a non-empty string (the HF name)")
            if name in seen:
                raise ValueError(f"tensor {name!r} is listed twice")
            seen.add(name)
            dt, shape, mv = _host(name, x, dtype)
            crc = 0
            for off in range(0, len(mv), cb):
                n = min(cb, len(mv) - off)
                c = crc32c(mv[off:off + n])
                self.chunks.append((ti, off, n, c))
                crc = crc32c_combine(crc, c, n)
            self.manifest.append(P.Tensor(name=name, dtype=dt, shape=shape, nbytes=len(mv), crc32c=crc))
            del mv
        self.data = _LazyData(items, dtype)
        self.total_bytes = sum(t.nbytes for t in self.manifest)
        self.prepare_seconds = time.perf_counter() - t0


def push_tensors(pool, named_tensors, version, dtype=None, manifest=None, partial=False, **push_kw):
    """Pool.push_tensors (see there)."""
    items = list(named_tensors.items()) if hasattr(named_tensors, "items") else list(named_tensors)
    if manifest is None:
        manifest = getattr(pool, "manifest", None)
    if manifest is not None:
        check_tensors(items, manifest, partial)
    room = min(c._max for c in pool.clients) - 64
    upd = StreamedUpdate(items, dtype, min(int(push_kw.pop("chunk_bytes", 16 << 20)), room))
    if "keep" in inspect.signature(pool.push_weights).parameters:
        push_kw.setdefault("keep", False)   # a Pool that keeps a push's bytes (delta bases) would hold the model twice
    return pool.push_weights(upd, version, **push_kw)
