"""The rolloutd learner wire protocol: encode and decode of every message.

proto/PROTOCOL.md is the specification; proto/proto.c is the C implementation.
Both decode the golden vectors in proto/testdata/ to the same fields and
refuse the same invalid frames with the same error codes.

    frame = encode(Submit(client_id=7, requests=[Request(client_req_id=1, prompt_ids=[1, 2, 3])]))
    msg = decode(frame)            # raises ProtoError(code, message) on a bad frame

Decoded token ids and log-probs are numpy arrays (int32 / float32) that view
the frame's bytes (read-only when the frame is `bytes`); copy them to keep
them writable. An UPDATE_CHUNK's data likewise decodes as a memoryview of the
frame (no copy); encoding takes bytes, bytearray, memoryview or a C-contiguous
numpy array (its raw bytes). Scalar f32 fields (temperature, top_p, min_p) decode as
numpy.float32, bit-exact. Encoding accepts lists or numpy arrays. Encoding refuses what
decoding would refuse (ValueError), so encode(m) always decodes back to m.
"""
import enum
import math
import struct
from dataclasses import dataclass, field
from typing import List, Optional, Tuple

import numpy as np

MAGIC = b"RLDP"
VERSION = 1
HEADER_BYTES = 16
DEFAULT_MAX_MESSAGE = 64 << 20
RESULTS_OVERHEAD = HEADER_BYTES + 24
ERROR_MESSAGE_MAX = 4096
MAX_CLIENT_NAME = 256          # bytes; a longer HELLO name is INVALID_PARAMS


class T(enum.IntEnum):
    """Message types; a reply's type is its request's | 0x80."""
    HELLO = 0x01
    SUBMIT = 0x02
    FETCH = 0x03
    ABORT = 0x04
    STATUS = 0x05
    BYE = 0x06
    AUTH_BEGIN = 0x07        # authentication (PROTOCOL.md §14)
    AUTH = 0x08
    UPDATE_BEGIN = 0x10      # weight updates (PROTOCOL.md §10), behind HELLO_OK feature bit 0
    UPDATE_CHUNK = 0x11
    UPDATE_COMMIT = 0x12
    UPDATE_ABORT = 0x13
    UPDATE_FORWARD = 0x14    # chained broadcast (§10.11), behind HELLO_OK feature bit 1
    UPDATE_PREPARE = 0x15
    LANE_AUTH = 0x16         # data lane only (§10.12)
    WEIGHTS_SYNC = 0x17      # push the serving weights to another daemon (§10.13)
    HELLO_OK = 0x81
    SUBMIT_OK = 0x82
    RESULTS = 0x83
    ABORT_OK = 0x84
    STATUS_OK = 0x85
    BYE_OK = 0x86
    AUTH_CHALLENGE = 0x87
    AUTH_OK = 0x88
    UPDATE_BEGIN_OK = 0x90
    UPDATE_CHUNK_OK = 0x91
    UPDATE_COMMIT_OK = 0x92
    UPDATE_ABORT_OK = 0x93
    UPDATE_FORWARD_OK = 0x94
    UPDATE_PREPARE_OK = 0x95
    WEIGHTS_SYNC_OK = 0x97
    ERROR = 0xFF


class E(enum.IntEnum):
    """Error codes of ERROR replies and SUBMIT_OK items."""
    BAD_MAGIC = 1
    UNSUPPORTED_VERSION = 2
    MALFORMED = 3
    TOO_LARGE = 4
    UNKNOWN_TYPE = 5
    UNEXPECTED = 6
    INVALID_PARAMS = 7
    BUSY = 8
    UNKNOWN_CLIENT = 9
    UNKNOWN_REQUEST = 10
    SHUTTING_DOWN = 11
    INTERNAL = 12
    CHECKSUM = 13            # a chunk's or a tensor's CRC-32C does not match its bytes
    STALE_VERSION = 14       # an update version not above the serving one
    UPDATE_CONFLICT = 15     # another weight transfer is in progress
    UNAUTHORIZED = 16        # the connection has not proved the shared secret (§14)


# Flag bits (bits not listed must be 0).
HELLO_OK_RESUMED = 0x1
HELLO_OK_TEXT = 0x2
HELLO_OK_CHAT = 0x4
HELLO_OK_FLAGS = 0x7

REQ_HAS_SEED = 0x1
REQ_PROCESSED_LOGPROBS = 0x2
REQ_IGNORE_EOS = 0x4
REQ_PROMPT_IS_TEXT = 0x8
REQ_CHAT_TEMPLATE = 0x10
REQ_FLAGS = 0x1F

SUBMIT_DUPLICATE = 0x1
SUBMIT_OK_FLAGS = 0x1
RESULT_PROCESSED = 0x1
RESULT_FLAGS = 0x1
ABORT_ALL = 0x1
ABORT_FLAGS = 0x1
BYE_DISCARD = 0x1
BYE_FLAGS = 0x1

FEATURE_WEIGHT_UPDATE = 0x1  # HELLO_OK.features: UPDATE_* messages are served
FEATURE_RELAY = 0x2          # UPDATE_FORWARD and UPDATE_PREPARE are served (§10.11)
FORWARD_AUTH = 0x1           # UPDATE_FORWARD: the next lane challenges; prove with the (wrapped) key
FORWARD_FLAGS = 0x1
PREP_STAGING, PREP_BUILDING, PREP_READY = 0, 1, 2
FWD_NONE, FWD_SENDING, FWD_DONE, FWD_FAILED = 0, 1, 2, 3
CHUNK_OK_DUPLICATE = 0x1     # the same chunk was already staged: acknowledged, no effect
CHUNK_OK_FLAGS = 0x1
MODE_CONTINUE, MODE_DRAIN, MODE_ABORT = 0, 1, 2
MODE_NAMES = {0: "continue", 1: "drain", 2: "abort"}
DTYPE_F32, DTYPE_F16, DTYPE_BF16 = 0, 1, 2
DTYPE_NAMES = {0: "f32", 1: "f16", 2: "bf16"}
DTYPE_SIZES = {0: 4, 1: 2, 2: 2}
MAX_DIMS = 4
MAX_TENSOR_NAME = 256        # bytes; a longer (or empty) name is MALFORMED

FINISH_STOP, FINISH_LENGTH, FINISH_ABORT, FINISH_ERROR = 1, 2, 3, 4
FINISH_NAMES = {1: "stop", 2: "length", 3: "abort", 4: "error"}

REQUEST_MIN_BYTES = 56
SUBMIT_ITEM_MIN_BYTES = 20
RESULT_MIN_BYTES = 88
SPAN_BYTES = 16
UPDATE_BEGIN_MIN_BYTES = 40
TENSOR_MIN_BYTES = 28        # empty name, one dimension


def dtype_size(dtype):
    """Bytes per element of a DTYPE_* (0 for an unknown one), as proto_dtype_size."""
    return DTYPE_SIZES.get(dtype, 0)


class ProtoError(Exception):
    """A frame was refused: code is the E.* value to reply with."""

    def __init__(self, code, message, type=0):
        super().__init__(f"{E(code).name if code in E._value2member_map_ else code}: {message}")
        self.code = int(code)
        self.message = message
        self.type = type        # the frame's header type when readable, else 0


def _i32(a):
    return np.ascontiguousarray(a, dtype="<i4")


def _f32(a):
    return np.ascontiguousarray(a, dtype="<f4")


def _empty_i32():
    return np.zeros(0, dtype="<i4")


def _empty_f32():
    return np.zeros(0, dtype="<f4")


# ---- messages ----

@dataclass
class Hello:
    client_id: int = 0
    min_version: int = VERSION
    max_version: int = VERSION
    flags: int = 0
    client_name: str = ""
    TYPE = T.HELLO


@dataclass
class HelloOk:
    client_id: int = 0
    version: int = VERSION
    flags: int = 0
    features: int = 0
    weight_version: int = 0
    vocab_size: int = 0
    max_context: int = 0
    n_layers: int = 0
    dim: int = 0
    n_heads: int = 0
    n_kv_heads: int = 0
    eos_id: int = -1
    max_prompt_tokens: int = 0
    max_message_bytes: int = DEFAULT_MAX_MESSAGE
    max_n: int = 0
    max_requests_per_submit: int = 0
    max_tokens: int = 0
    max_stop_ids: int = 0
    max_logprobs_topk: int = 0
    retention_results: int = 0
    retention_bytes: int = 0
    max_wait_ms: int = 0
    client_ttl_s: int = 0
    pending_results: int = 0
    inflight_samples: int = 0
    model_name: str = ""
    architecture: str = ""
    backend: str = ""
    server: str = ""
    TYPE = T.HELLO_OK


@dataclass
class Request:
    client_req_id: int = 0
    n: int = 1
    max_tokens: int = 16
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    seed: int = 0
    logprobs_topk: int = 0
    flags: int = 0
    stop_ids: np.ndarray = field(default_factory=_empty_i32)
    prompt_ids: np.ndarray = field(default_factory=_empty_i32)   # when flags lack REQ_PROMPT_IS_TEXT
    prompt_text: str = ""                                         # when flags have REQ_PROMPT_IS_TEXT


@dataclass
class Submit:
    client_id: int = 0
    requests: List[Request] = field(default_factory=list)
    TYPE = T.SUBMIT


@dataclass
class SubmitItem:
    client_req_id: int = 0
    status: int = 0          # 0 accepted, else an E code
    flags: int = 0           # SUBMIT_DUPLICATE
    message: str = ""


@dataclass
class SubmitOk:
    items: List[SubmitItem] = field(default_factory=list)
    TYPE = T.SUBMIT_OK


@dataclass
class Fetch:
    client_id: int = 0
    ack_seq: int = 0
    max_results: int = 0
    wait_ms: int = 0
    max_bytes: int = 0
    TYPE = T.FETCH


@dataclass
class Result:
    seq: int = 0
    client_req_id: int = 0
    sample_idx: int = 0
    finish: int = FINISH_STOP
    flags: int = 0           # RESULT_PROCESSED
    top_k: int = 0
    n_preempt: int = 0
    n_prompt: int = 0
    seed: int = 0
    version_admit: int = 0
    version_finish: int = 0
    queued_us: int = 0
    first_token_us: int = 0
    total_us: int = 0
    token_ids: np.ndarray = field(default_factory=_empty_i32)             # [n] int32
    logprobs: np.ndarray = field(default_factory=_empty_f32)              # [n] float32, raw
    logprobs_processed: Optional[np.ndarray] = None                       # [n] float32 with RESULT_PROCESSED
    top_ids: np.ndarray = field(default_factory=lambda: np.zeros((0, 0), "<i4"))       # [n, top_k]
    top_logprobs: np.ndarray = field(default_factory=lambda: np.zeros((0, 0), "<f4"))  # [n, top_k]
    spans: List[Tuple[int, int, int]] = field(default_factory=list)       # (start, end, version)


@dataclass
class Results:
    ack_seq: int = 0
    pending_results: int = 0
    inflight_samples: int = 0
    results: List[Result] = field(default_factory=list)
    TYPE = T.RESULTS


@dataclass
class Abort:
    client_id: int = 0
    client_req_id: int = 0
    flags: int = 0           # ABORT_ALL
    TYPE = T.ABORT


@dataclass
class AbortOk:
    n_requests: int = 0
    n_samples: int = 0
    TYPE = T.ABORT_OK


@dataclass
class Status:
    TYPE = T.STATUS


@dataclass
class StatusOk:
    json: str = ""
    TYPE = T.STATUS_OK


@dataclass
class Bye:
    client_id: int = 0
    flags: int = 0           # BYE_DISCARD
    TYPE = T.BYE


@dataclass
class ByeOk:
    pending_results: int = 0
    inflight_samples: int = 0
    TYPE = T.BYE_OK


@dataclass
class Error:
    code: int = E.INTERNAL
    request_type: int = 0
    version_max: int = VERSION
    message: str = ""
    TYPE = T.ERROR


@dataclass
class Tensor:
    """One tensor of an UPDATE_BEGIN manifest (Hugging Face name and layout)."""
    name: str = ""
    dtype: int = DTYPE_F32
    shape: List[int] = field(default_factory=list)    # 1..4 dims, outermost first
    nbytes: int = 0          # product of shape x dtype size
    crc32c: int = 0          # of the tensor's nbytes bytes


@dataclass
class UpdateBegin:
    client_id: int = 0
    version: int = 0         # the new policy version
    mode: int = MODE_CONTINUE
    window: int = 1          # chunks the sender wants in flight
    max_chunk_bytes: int = 0
    total_bytes: int = 0     # sum of the tensors' nbytes
    tensors: List[Tensor] = field(default_factory=list)
    TYPE = T.UPDATE_BEGIN


@dataclass
class UpdateBeginOk:
    xfer_id: int = 0
    window: int = 0
    max_chunk_bytes: int = 0
    staging_bytes: int = 0
    data_port: int = 0       # TCP port of the data lane (§10.10); 0 = none
    TYPE = T.UPDATE_BEGIN_OK


@dataclass
class UpdateChunk:
    xfer_id: int = 0
    chunk_seq: int = 0
    tensor_index: int = 0
    offset: int = 0          # bytes into the tensor
    crc32c: int = 0          # of data
    data: bytes = b""        # decoded: a memoryview of the frame
    TYPE = T.UPDATE_CHUNK


@dataclass
class UpdateChunkOk:
    xfer_id: int = 0
    chunk_seq: int = 0
    flags: int = 0           # CHUNK_OK_DUPLICATE
    bytes_staged: int = 0
    total_bytes: int = 0
    TYPE = T.UPDATE_CHUNK_OK


@dataclass
class UpdateCommit:
    xfer_id: int = 0
    TYPE = T.UPDATE_COMMIT


@dataclass
class UpdateCommitOk:
    version: int = 0         # now serving
    stall_us: int = 0
    wait_us: int = 0
    staged_us: int = 0
    n_aborted: int = 0
    TYPE = T.UPDATE_COMMIT_OK


@dataclass
class UpdateAbort:
    xfer_id: int = 0
    TYPE = T.UPDATE_ABORT


@dataclass
class UpdateAbortOk:
    bytes_freed: int = 0
    TYPE = T.UPDATE_ABORT_OK


AUTH_BYTES = 32


@dataclass
class UpdateForward:
    xfer_id: int = 0
    next_xfer_id: int = 0    # 0 = stop forwarding
    port: int = 0            # the next daemon's data lane
    flags: int = 0           # FORWARD_AUTH
    window: int = 1
    key: bytes = b"\0" * 32  # the next transfer's lane key, wrapped (§10.12)
    host: str = ""
    TYPE = T.UPDATE_FORWARD


@dataclass
class UpdateForwardOk:
    xfer_id: int = 0
    queued_bytes: int = 0
    TYPE = T.UPDATE_FORWARD_OK


@dataclass
class UpdatePrepare:
    xfer_id: int = 0
    TYPE = T.UPDATE_PREPARE


@dataclass
class UpdatePrepareOk:
    xfer_id: int = 0
    state: int = 0           # PREP_*
    forward: int = 0         # FWD_*
    forward_error: int = 0
    bytes_staged: int = 0
    total_bytes: int = 0
    forwarded_bytes: int = 0
    TYPE = T.UPDATE_PREPARE_OK


@dataclass
class WeightsSync:
    client_id: int = 0
    url: str = ""            # the daemon to push to
    TYPE = T.WEIGHTS_SYNC


@dataclass
class WeightsSyncOk:
    version: int = 0         # what will be pushed
    TYPE = T.WEIGHTS_SYNC_OK


@dataclass
class LaneAuth:
    xfer_id: int = 0
    proof: bytes = b"\0" * 32
    TYPE = T.LANE_AUTH


@dataclass
class _Auth32:
    """The four AUTH_* messages (§14): 32 bytes each."""
    bytes: bytes = b"\0" * AUTH_BYTES


class AuthBegin(_Auth32):
    TYPE = T.AUTH_BEGIN      # bytes: the client's nonce


class AuthChallenge(_Auth32):
    TYPE = T.AUTH_CHALLENGE  # bytes: the daemon's nonce


class Auth(_Auth32):
    TYPE = T.AUTH            # bytes: the client's proof


class AuthOk(_Auth32):
    TYPE = T.AUTH_OK         # bytes: the daemon's proof


CLASSES = {c.TYPE: c for c in (Hello, HelloOk, Submit, SubmitOk, Fetch, Results, Abort, AbortOk,
                               Status, StatusOk, Bye, ByeOk, Error, UpdateBegin, UpdateBeginOk, UpdateChunk,
                               UpdateChunkOk, UpdateCommit, UpdateCommitOk, UpdateAbort, UpdateAbortOk,
                               AuthBegin, AuthChallenge, Auth, AuthOk, UpdateForward, UpdateForwardOk,
                               UpdatePrepare, UpdatePrepareOk, LaneAuth, WeightsSync, WeightsSyncOk)}
REQUEST_TYPES = frozenset({T.HELLO, T.SUBMIT, T.FETCH, T.ABORT, T.STATUS, T.BYE, T.AUTH_BEGIN, T.AUTH,
                           T.UPDATE_BEGIN, T.UPDATE_CHUNK, T.UPDATE_COMMIT, T.UPDATE_ABORT, T.UPDATE_FORWARD,
                           T.UPDATE_PREPARE, T.LANE_AUTH, T.WEIGHTS_SYNC})
AUTH_TYPES = (T.AUTH_BEGIN, T.AUTH_CHALLENGE, T.AUTH, T.AUTH_OK)


def is_request(type_):
    """True for the request types a daemon serves (proto_is_request)."""
    return type_ in REQUEST_TYPES


# ---- decode ----

class _Reader:
    def __init__(self, buf, off, end, name):
        self.buf = buf
        self.off = off
        self.start = off
        self.end = end
        self.name = name
        self.arr = None
        self.idx = 0

    def where(self):
        return f"{self.name} {self.arr}[{self.idx}]" if self.arr else self.name

    def malformed(self, msg):
        return ProtoError(E.MALFORMED, f"{self.where()}: {msg}")

    def need(self, n, fld):
        left = self.end - self.off
        if n > left:
            raise self.malformed(f"truncated at {fld} (body offset {self.off - self.start}): needs {n} bytes, "
                                 f"{left} left in a {self.end - self.start}-byte body")

    def _unpack(self, fmt, size, fld):
        self.need(size, fld)
        v = struct.unpack_from(fmt, self.buf, self.off)[0]
        self.off += size
        return v

    def u8(self, fld): return self._unpack("<B", 1, fld)
    def u16(self, fld): return self._unpack("<H", 2, fld)
    def u32(self, fld): return self._unpack("<I", 4, fld)
    def i32(self, fld): return self._unpack("<i", 4, fld)
    def u64(self, fld): return self._unpack("<Q", 8, fld)
    def f32(self, fld):
        # numpy.float32 keeps the exact bits (a Python float would quiet a signalling NaN)
        self.need(4, fld)
        v = np.frombuffer(self.buf, dtype="<f4", count=1, offset=self.off)[0]
        self.off += 4
        return v

    def zero_bits(self, v, allowed, fld):
        if v & ~allowed:
            raise self.malformed(f"{fld} is {v:#x}; bits {v & ~allowed:#x} are not defined in protocol version "
                                 f"{VERSION} and must be 0")

    def count(self, min_bytes, fld):
        n = self.u32(fld)
        left = self.end - self.off
        if n * min_bytes > left:
            raise self.malformed(f"{fld} = {n} needs at least {n * min_bytes} bytes, but {left} are left in the body")
        return n

    def string(self, fld, min_len=0, max_len=None):
        n = self.u32(fld)
        if n < min_len or (max_len is not None and n > max_len):
            raise self.malformed(f"{fld} is {n} bytes long; expected {min_len}..{max_len} bytes")
        self.need(n, fld)
        raw = bytes(self.buf[self.off:self.off + n])
        try:
            s = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise self.malformed(f"{fld} is not valid UTF-8 (byte {e.start} of {n}, value {raw[e.start]:#04x}); "
                                 "strings must be UTF-8") from None
        self.off += n
        return s

    def raw(self, n, fld):
        """n bytes as a memoryview of the frame (no copy)."""
        self.need(n, fld)
        mv = memoryview(self.buf)
        if mv.format != "B" or mv.ndim != 1:
            mv = mv.cast("B")
        v = mv[self.off:self.off + n]
        self.off += n
        return v

    def array(self, n, dtype, fld):
        self.need(4 * n, fld)
        a = np.frombuffer(self.buf, dtype=dtype, count=n, offset=self.off) if n else np.zeros(0, dtype)
        self.off += 4 * n
        return a


def _check_spans(n_tokens, spans):
    """Returns why the spans are invalid, or None."""
    if n_tokens == 0 and spans:
        return f"has {len(spans)} spans but no tokens; expected 0 spans"
    if n_tokens > 0 and not spans:
        return f"has {n_tokens} tokens but no spans; expected spans covering [0, {n_tokens})"
    at = 0
    for i, (s, e, v) in enumerate(spans):
        if s != at or e <= s or e > n_tokens:
            return f"span {i} is [{s}, {e}); expected [{at}, e) with {at} < e <= n_tokens = {n_tokens}"
        if i > 0 and v <= spans[i - 1][2]:
            return f"span {i} has version {v} after {spans[i - 1][2]}; expected increasing versions"
        at = e
    if at != n_tokens:
        return f"spans end at token {at}; expected them to cover all {n_tokens} tokens"
    return None


def _dec_hello(r):
    m = Hello(client_id=r.u64("client_id"), min_version=r.u16("min_version"), max_version=r.u16("max_version"))
    m.flags = r.u32("flags")
    r.zero_bits(m.flags, 0, "flags")
    m.client_name = r.string("client_name")
    return m


def _dec_hello_ok(r):
    m = HelloOk()
    m.client_id = r.u64("client_id")
    m.version = r.u16("version")
    r.zero_bits(r.u16("reserved"), 0, "reserved")
    m.flags = r.u32("flags")
    r.zero_bits(m.flags, HELLO_OK_FLAGS, "flags")
    m.features = r.u64("features")
    m.weight_version = r.u64("weight_version")
    for f in ("vocab_size", "max_context", "n_layers", "dim", "n_heads", "n_kv_heads"):
        setattr(m, f, r.u32(f))
    m.eos_id = r.i32("eos_id")
    m.max_prompt_tokens = r.u32("max_prompt_tokens")
    m.max_message_bytes = r.u64("max_message_bytes")
    for f in ("max_n", "max_requests_per_submit", "max_tokens", "max_stop_ids", "max_logprobs_topk",
              "retention_results"):
        setattr(m, f, r.u32(f))
    m.retention_bytes = r.u64("retention_bytes")
    for f in ("max_wait_ms", "client_ttl_s", "pending_results", "inflight_samples"):
        setattr(m, f, r.u32(f))
    for f in ("model_name", "architecture", "backend", "server"):
        setattr(m, f, r.string(f))
    return m


def _dec_request(r):
    q = Request()
    q.client_req_id = r.u64("client_req_id")
    q.n = r.u32("n")
    q.max_tokens = r.u32("max_tokens")
    q.temperature = r.f32("temperature")
    q.top_p = r.f32("top_p")
    q.top_k = r.i32("top_k")
    q.min_p = r.f32("min_p")
    q.seed = r.u64("seed")
    q.logprobs_topk = r.u32("logprobs_topk")
    q.flags = r.u32("flags")
    n_stop = r.count(4, "n_stop")
    q.stop_ids = r.array(n_stop, "<i4", "stop_ids")
    if q.flags & REQ_PROMPT_IS_TEXT:
        q.prompt_text = r.string("prompt_text")
    else:
        n_prompt = r.count(4, "n_prompt")
        q.prompt_ids = r.array(n_prompt, "<i4", "prompt_ids")
    return q


def _dec_submit(r):
    m = Submit(client_id=r.u64("client_id"))
    n = r.count(REQUEST_MIN_BYTES, "n_requests")
    r.arr = "requests"
    for i in range(n):
        r.idx = i
        m.requests.append(_dec_request(r))
    r.arr = None
    return m


def _dec_submit_ok(r):
    m = SubmitOk()
    n = r.count(SUBMIT_ITEM_MIN_BYTES, "n_items")
    r.arr = "items"
    for i in range(n):
        r.idx = i
        it = SubmitItem(client_req_id=r.u64("client_req_id"), status=r.u32("status"), flags=r.u32("flags"))
        r.zero_bits(it.flags, SUBMIT_OK_FLAGS, "flags")
        it.message = r.string("message")
        m.items.append(it)
    r.arr = None
    return m


def _dec_fetch(r):
    return Fetch(client_id=r.u64("client_id"), ack_seq=r.u64("ack_seq"), max_results=r.u32("max_results"),
                 wait_ms=r.u32("wait_ms"), max_bytes=r.u64("max_bytes"))


def _dec_result(r):
    x = Result()
    x.seq = r.u64("seq")
    x.client_req_id = r.u64("client_req_id")
    x.sample_idx = r.u32("sample_idx")
    x.finish = r.u8("finish")
    if not FINISH_STOP <= x.finish <= FINISH_ERROR:
        raise r.malformed(f"finish is {x.finish}; expected 1 (stop), 2 (length), 3 (abort) or 4 (error)")
    x.flags = r.u8("flags")
    r.zero_bits(x.flags, RESULT_FLAGS, "flags")
    x.top_k = r.u16("top_k")
    x.n_preempt = r.u32("n_preempt")
    x.n_prompt = r.u32("n_prompt")
    for f in ("seed", "version_admit", "version_finish", "queued_us", "first_token_us", "total_us"):
        setattr(x, f, r.u64(f))
    proc = bool(x.flags & RESULT_PROCESSED)
    n = r.count(8 + (4 if proc else 0) + 8 * x.top_k, "n_tokens")
    x.token_ids = r.array(n, "<i4", "token_ids")
    x.logprobs = r.array(n, "<f4", "logprobs")
    if proc:
        x.logprobs_processed = r.array(n, "<f4", "logprobs_processed")
    x.top_ids = r.array(n * x.top_k, "<i4", "top_ids").reshape(n, x.top_k)
    x.top_logprobs = r.array(n * x.top_k, "<f4", "top_logprobs").reshape(n, x.top_k)
    n_spans = r.count(SPAN_BYTES, "n_spans")
    x.spans = [(r.u32("spans.start"), r.u32("spans.end"), r.u64("spans.version")) for _ in range(n_spans)]
    why = _check_spans(n, x.spans)
    if why:
        raise r.malformed(why)
    return x


def _dec_results(r):
    m = Results()
    n = r.count(RESULT_MIN_BYTES, "n_results")
    r.zero_bits(r.u32("flags"), 0, "flags")
    m.ack_seq = r.u64("ack_seq")
    m.pending_results = r.u32("pending_results")
    m.inflight_samples = r.u32("inflight_samples")
    r.arr = "results"
    for i in range(n):
        r.idx = i
        m.results.append(_dec_result(r))
    r.arr = None
    return m


def _dec_abort(r):
    m = Abort(client_id=r.u64("client_id"), client_req_id=r.u64("client_req_id"), flags=r.u32("flags"))
    r.zero_bits(m.flags, ABORT_FLAGS, "flags")
    return m


def _dec_bye(r):
    m = Bye(client_id=r.u64("client_id"), flags=r.u32("flags"))
    r.zero_bits(m.flags, BYE_FLAGS, "flags")
    return m


def _dec_error(r):
    code = r.u32("code")
    if code == 0:
        raise r.malformed("code is 0; expected an error code >= 1")
    return Error(code=code, request_type=r.u16("request_type"), version_max=r.u16("version_max"),
                 message=r.string("message"))


def _dec_tensor(r):
    t = Tensor(name=r.string("name", 1, MAX_TENSOR_NAME))
    t.dtype = r.u8("dtype")
    if t.dtype > DTYPE_BF16:
        raise r.malformed(f"dtype is {t.dtype}; expected 0 (f32), 1 (f16) or 2 (bf16)")
    n_dims = r.u8("n_dims")
    if not 1 <= n_dims <= MAX_DIMS:
        raise r.malformed(f"n_dims is {n_dims}; expected 1..{MAX_DIMS}")
    r.zero_bits(r.u16("reserved"), 0, "reserved")
    t.shape = [r.u64("shape") for _ in range(n_dims)]
    t.nbytes = r.u64("nbytes")
    t.crc32c = r.u32("crc32c")
    return t


def _dec_update_begin(r):
    m = UpdateBegin(client_id=r.u64("client_id"), version=r.u64("version"))
    m.mode = r.u8("mode")
    if m.mode > MODE_ABORT:
        raise r.malformed(f"mode is {m.mode}; expected 0 (continue), 1 (drain) or 2 (abort)")
    reserved = r.u8("reserved") | r.u8("reserved") << 8 | r.u8("reserved") << 16
    r.zero_bits(reserved, 0, "reserved")
    m.window = r.u32("window")
    m.max_chunk_bytes = r.u32("max_chunk_bytes")
    m.total_bytes = r.u64("total_bytes")
    n = r.count(TENSOR_MIN_BYTES, "n_tensors")
    r.arr = "tensors"
    for i in range(n):
        r.idx = i
        m.tensors.append(_dec_tensor(r))
    r.arr = None
    return m


def _dec_update_chunk(r):
    m = UpdateChunk(xfer_id=r.u64("xfer_id"), chunk_seq=r.u32("chunk_seq"), tensor_index=r.u32("tensor_index"),
                    offset=r.u64("offset"), crc32c=r.u32("crc32c"))
    m.data = r.raw(r.count(1, "len"), "data")
    return m


def _dec_update_chunk_ok(r):
    m = UpdateChunkOk(xfer_id=r.u64("xfer_id"), chunk_seq=r.u32("chunk_seq"), flags=r.u32("flags"))
    r.zero_bits(m.flags, CHUNK_OK_FLAGS, "flags")
    m.bytes_staged = r.u64("bytes_staged")
    m.total_bytes = r.u64("total_bytes")
    return m


def _dec_update_commit_ok(r):
    m = UpdateCommitOk(version=r.u64("version"), stall_us=r.u64("stall_us"), wait_us=r.u64("wait_us"),
                       staged_us=r.u64("staged_us"), n_aborted=r.u32("n_aborted"))
    r.zero_bits(r.u32("reserved"), 0, "reserved")
    return m



def _dec_update_begin_ok(r):
    m = UpdateBeginOk(xfer_id=r.u64("xfer_id"), window=r.u32("window"), max_chunk_bytes=r.u32("max_chunk_bytes"),
                      staging_bytes=r.u64("staging_bytes"), data_port=r.u16("data_port"))
    r.zero_bits(r.u16("reserved"), 0, "reserved")
    r.zero_bits(r.u32("reserved"), 0, "reserved")
    return m

def _dec_update_forward(r):
    m = UpdateForward(xfer_id=r.u64("xfer_id"), next_xfer_id=r.u64("next_xfer_id"), port=r.u16("port"),
                      flags=r.u16("flags"))
    r.zero_bits(m.flags, FORWARD_FLAGS, "flags")
    m.window = r.u32("window")
    m.key = bytes(r.raw(AUTH_BYTES, "key"))
    m.host = r.string("host", 0, 255)
    return m


def _dec_update_prepare_ok(r):
    m = UpdatePrepareOk(xfer_id=r.u64("xfer_id"), state=r.u8("state"))
    if m.state > PREP_READY:
        raise ProtoError(E.MALFORMED, f"{r.name}: state is {m.state}; expected 0 (staging), 1 (building) or 2 (ready)")
    m.forward = r.u8("forward")
    if m.forward > FWD_FAILED:
        raise ProtoError(E.MALFORMED, f"{r.name}: forward is {m.forward}; expected 0..3")
    r.zero_bits(r.u16("reserved"), 0, "reserved")
    m.forward_error = r.u32("forward_error")
    m.bytes_staged = r.u64("bytes_staged")
    m.total_bytes = r.u64("total_bytes")
    m.forwarded_bytes = r.u64("forwarded_bytes")
    return m


_DECODERS = {
    T.HELLO: _dec_hello,
    T.HELLO_OK: _dec_hello_ok,
    T.SUBMIT: _dec_submit,
    T.SUBMIT_OK: _dec_submit_ok,
    T.FETCH: _dec_fetch,
    T.RESULTS: _dec_results,
    T.ABORT: _dec_abort,
    T.ABORT_OK: lambda r: AbortOk(n_requests=r.u32("n_requests"), n_samples=r.u32("n_samples")),
    T.STATUS: lambda r: Status(),
    T.STATUS_OK: lambda r: StatusOk(json=r.string("json")),
    T.BYE: _dec_bye,
    T.BYE_OK: lambda r: ByeOk(pending_results=r.u32("pending_results"), inflight_samples=r.u32("inflight_samples")),
    T.ERROR: _dec_error,
    T.UPDATE_BEGIN: _dec_update_begin,
    T.UPDATE_BEGIN_OK: _dec_update_begin_ok,
    T.UPDATE_CHUNK: _dec_update_chunk,
    T.UPDATE_CHUNK_OK: _dec_update_chunk_ok,
    T.UPDATE_COMMIT: lambda r: UpdateCommit(xfer_id=r.u64("xfer_id")),
    T.UPDATE_COMMIT_OK: _dec_update_commit_ok,
    T.UPDATE_ABORT: lambda r: UpdateAbort(xfer_id=r.u64("xfer_id")),
    T.UPDATE_ABORT_OK: lambda r: UpdateAbortOk(bytes_freed=r.u64("bytes_freed")),
    T.AUTH_BEGIN: lambda r: AuthBegin(bytes=bytes(r.raw(AUTH_BYTES, "bytes"))),
    T.AUTH_CHALLENGE: lambda r: AuthChallenge(bytes=bytes(r.raw(AUTH_BYTES, "bytes"))),
    T.AUTH: lambda r: Auth(bytes=bytes(r.raw(AUTH_BYTES, "bytes"))),
    T.AUTH_OK: lambda r: AuthOk(bytes=bytes(r.raw(AUTH_BYTES, "bytes"))),
    T.UPDATE_FORWARD: _dec_update_forward,
    T.UPDATE_FORWARD_OK: lambda r: UpdateForwardOk(xfer_id=r.u64("xfer_id"), queued_bytes=r.u64("queued_bytes")),
    T.UPDATE_PREPARE: lambda r: UpdatePrepare(xfer_id=r.u64("xfer_id")),
    T.UPDATE_PREPARE_OK: _dec_update_prepare_ok,
    T.LANE_AUTH: lambda r: LaneAuth(xfer_id=r.u64("xfer_id"), proof=bytes(r.raw(AUTH_BYTES, "proof"))),
    T.WEIGHTS_SYNC: lambda r: WeightsSync(client_id=r.u64("client_id"), url=r.string("url", 1, 1024)),
    T.WEIGHTS_SYNC_OK: lambda r: WeightsSyncOk(version=r.u64("version")),
}


def decode(buf, max_len=DEFAULT_MAX_MESSAGE):
    """Decodes one frame (bytes, bytearray or memoryview). max_len is the
    receiver's limit in bytes (0 = none). Raises ProtoError(code, message)
    with the checks in the order PROTOCOL.md gives (and proto.c applies)."""
    n = len(buf)
    if max_len and n > max_len:
        raise ProtoError(E.TOO_LARGE, f"frame is {n} bytes; the limit is {max_len} bytes")
    if n < HEADER_BYTES:
        raise ProtoError(E.MALFORMED, f"frame is {n} bytes; expected at least the {HEADER_BYTES}-byte header")
    if bytes(buf[:4]) != MAGIC:
        raise ProtoError(E.BAD_MAGIC, f"magic is {bytes(buf[:4]).hex(' ')}; expected 52 4c 44 50 (\"RLDP\")")
    version, type_, body_len, flags = struct.unpack_from("<HHII", buf, 4)
    if version != VERSION:
        raise ProtoError(E.UNSUPPORTED_VERSION,
                         f"protocol version {version}; this peer speaks version {VERSION} to {VERSION}", type_)
    if max_len and body_len + HEADER_BYTES > max_len:
        raise ProtoError(E.TOO_LARGE, f"header declares a {body_len}-byte body ({body_len + HEADER_BYTES}-byte "
                         f"frame); the limit is {max_len} bytes", type_)
    if body_len != n - HEADER_BYTES:
        why = "truncated frame" if body_len > n - HEADER_BYTES else "trailing bytes"
        raise ProtoError(E.MALFORMED, f"header declares a {body_len}-byte body but the frame carries "
                         f"{n - HEADER_BYTES} bytes after the header; expected them equal ({why})", type_)
    if flags != 0:
        raise ProtoError(E.MALFORMED, f"header flags are {flags:#x}; expected 0 in protocol version {VERSION}", type_)
    if type_ not in _DECODERS:
        raise ProtoError(E.UNKNOWN_TYPE, f"message type {type_:#04x} is not defined; expected HELLO..BYE "
                         "(0x01..0x06), UPDATE_BEGIN..WEIGHTS_SYNC (0x10..0x17), their replies (0x81..0x86, "
                         "0x90..0x95, 0x97) or ERROR (0xff)", type_)
    r = _Reader(buf, HEADER_BYTES, n, T(type_).name)
    try:
        msg = _DECODERS[type_](r)
    except ProtoError as e:
        e.type = type_
        raise
    if r.off != n:
        raise ProtoError(E.MALFORMED, f"{r.name}: {n - r.off} bytes after the last field (body offset "
                         f"{r.off - HEADER_BYTES} of {body_len}); expected none", type_)
    return msg


def peek_type(buf):
    """The header's message type, or None when there is no readable header."""
    if len(buf) < HEADER_BYTES or bytes(buf[:4]) != MAGIC:
        return None
    return struct.unpack_from("<H", buf, 6)[0]


# ---- encode ----

def _f32_bytes(x):
    with np.errstate(over="ignore", invalid="ignore"):
        return np.array(x, dtype="<f4").tobytes()


def _utf8(s, what):
    if not isinstance(s, str):
        raise ValueError(f"{what} must be a str, got {type(s).__name__}")
    try:
        return s.encode("utf-8")
    except UnicodeEncodeError as e:
        raise ValueError(f"{what} is not encodable as UTF-8: {e}") from None


def _str(out, s, what):
    b = _utf8(s, what)
    out.append(struct.pack("<I", len(b)))
    out.append(b)


def _flags_ok(v, allowed, what):
    if v & ~allowed:
        raise ValueError(f"{what} {v:#x} has undefined bits {v & ~allowed:#x}; expected them 0")


def _enc_request(out, q):
    stop = _i32(q.stop_ids)
    text = bool(q.flags & REQ_PROMPT_IS_TEXT)
    ids = _i32(q.prompt_ids)
    if text and len(ids):
        raise ValueError(f"request {q.client_req_id}: flags say the prompt is text but it has {len(ids)} token ids")
    if not text and q.prompt_text:
        raise ValueError(f"request {q.client_req_id}: has prompt text but flags lack REQ_PROMPT_IS_TEXT")
    out.append(struct.pack("<QII", q.client_req_id, q.n, q.max_tokens))
    out.append(_f32_bytes(q.temperature))
    out.append(_f32_bytes(q.top_p))
    out.append(struct.pack("<i", q.top_k))
    out.append(_f32_bytes(q.min_p))
    out.append(struct.pack("<QIII", q.seed, q.logprobs_topk, q.flags, len(stop)))
    out.append(stop.tobytes())
    if text:
        _str(out, q.prompt_text, "prompt_text")
    else:
        out.append(struct.pack("<I", len(ids)))
        out.append(ids.tobytes())


def raw_bytes(x, what="data"):
    """x as a flat bytes-like view: bytes, bytearray, memoryview (any format,
    C-contiguous) or a C-contiguous numpy array of any dtype (its raw bytes)."""
    if isinstance(x, np.ndarray):
        if not x.flags.c_contiguous:
            raise ValueError(f"{what}: a numpy array must be C-contiguous")
        return memoryview(x.reshape(-1).view(np.uint8))
    try:
        mv = memoryview(x)
    except TypeError:
        raise ValueError(f"{what} must be bytes-like or a numpy array, got {type(x).__name__}") from None
    if mv.format != "B" or mv.ndim != 1:
        if not mv.c_contiguous:
            raise ValueError(f"{what}: a memoryview must be C-contiguous")
        mv = mv.cast("B")
    return mv


def _enc_tensor(out, i, t):
    what = f"UPDATE_BEGIN tensors[{i}]"
    name = _utf8(t.name, f"{what} name")
    if not 1 <= len(name) <= MAX_TENSOR_NAME:
        raise ValueError(f"{what}: name is {len(name)} bytes long; expected 1..{MAX_TENSOR_NAME} bytes")
    if not 0 <= t.dtype <= DTYPE_BF16:
        raise ValueError(f"{what} {t.name!r}: dtype is {t.dtype}; expected 0 (f32), 1 (f16) or 2 (bf16)")
    shape = [int(d) for d in t.shape]
    if not 1 <= len(shape) <= MAX_DIMS:
        raise ValueError(f"{what} {t.name!r}: {len(shape)} dimensions; expected 1..{MAX_DIMS}")
    out.append(struct.pack("<I", len(name)))
    out.append(name)
    out.append(struct.pack(f"<BBH{len(shape)}QQI", t.dtype, len(shape), 0, *shape, t.nbytes, t.crc32c))


def result_bytes(x):
    """Encoded size of one result inside RESULTS."""
    n = len(x.token_ids)
    per = 8 + (4 if x.flags & RESULT_PROCESSED else 0) + 8 * x.top_k
    return RESULT_MIN_BYTES + per * n + SPAN_BYTES * len(x.spans)


def result_max_bytes(max_tokens, processed, logprobs_topk):
    """The largest a result of these request parameters can be (spans included)."""
    return RESULT_MIN_BYTES + (8 + (4 if processed else 0) + 8 * logprobs_topk + SPAN_BYTES) * max_tokens


def _enc_result(out, x):
    ids = _i32(x.token_ids)
    n = len(ids)
    lp = _f32(x.logprobs)
    what = f"result seq {x.seq}"
    if not FINISH_STOP <= x.finish <= FINISH_ERROR:
        raise ValueError(f"{what}: finish is {x.finish}; expected 1..4")
    _flags_ok(x.flags, RESULT_FLAGS, f"{what}: flags")
    if lp.shape != (n,):
        raise ValueError(f"{what}: logprobs has shape {lp.shape}; expected ({n},)")
    proc = bool(x.flags & RESULT_PROCESSED)
    if proc:
        if x.logprobs_processed is None or _f32(x.logprobs_processed).shape != (n,):
            raise ValueError(f"{what}: flags have RESULT_PROCESSED; expected logprobs_processed of shape ({n},)")
    elif x.logprobs_processed is not None:
        raise ValueError(f"{what}: logprobs_processed given but flags lack RESULT_PROCESSED")
    if not 0 <= x.top_k <= 0xFFFF:
        raise ValueError(f"{what}: top_k = {x.top_k}; expected 0..65535")
    tid = _i32(x.top_ids).reshape(-1)
    tlp = _f32(x.top_logprobs).reshape(-1)
    if len(tid) != n * x.top_k or len(tlp) != n * x.top_k:
        raise ValueError(f"{what}: top_ids/top_logprobs have {len(tid)}/{len(tlp)} entries; expected "
                         f"n_tokens * top_k = {n * x.top_k}")
    spans = [tuple(int(v) for v in s) for s in x.spans]
    why = _check_spans(n, spans)
    if why:
        raise ValueError(f"{what}: {why}")
    out.append(struct.pack("<QQIBBHII", x.seq, x.client_req_id, x.sample_idx, x.finish, x.flags, x.top_k,
                           x.n_preempt, x.n_prompt))
    out.append(struct.pack("<6QI", x.seed, x.version_admit, x.version_finish, x.queued_us, x.first_token_us,
                           x.total_us, n))
    out.append(ids.tobytes())
    out.append(lp.tobytes())
    if proc:
        out.append(_f32(x.logprobs_processed).tobytes())
    out.append(tid.tobytes())
    out.append(tlp.tobytes())
    out.append(struct.pack("<I", len(spans)))
    for s, e, v in spans:
        out.append(struct.pack("<IIQ", s, e, v))


def _enc_body(m, out):
    t = m.TYPE
    if t == T.HELLO:
        _flags_ok(m.flags, 0, "HELLO flags")
        out.append(struct.pack("<QHHI", m.client_id, m.min_version, m.max_version, m.flags))
        _str(out, m.client_name, "client_name")
    elif t == T.HELLO_OK:
        _flags_ok(m.flags, HELLO_OK_FLAGS, "HELLO_OK flags")
        out.append(struct.pack("<QHHIQQ6IiIQ6IQ4I", m.client_id, m.version, 0, m.flags, m.features,
                               m.weight_version, m.vocab_size, m.max_context, m.n_layers, m.dim, m.n_heads,
                               m.n_kv_heads, m.eos_id, m.max_prompt_tokens, m.max_message_bytes, m.max_n,
                               m.max_requests_per_submit, m.max_tokens, m.max_stop_ids, m.max_logprobs_topk,
                               m.retention_results, m.retention_bytes, m.max_wait_ms, m.client_ttl_s,
                               m.pending_results, m.inflight_samples))
        for f in ("model_name", "architecture", "backend", "server"):
            _str(out, getattr(m, f), f)
    elif t == T.SUBMIT:
        out.append(struct.pack("<QI", m.client_id, len(m.requests)))
        for q in m.requests:
            _enc_request(out, q)
    elif t == T.SUBMIT_OK:
        out.append(struct.pack("<I", len(m.items)))
        for it in m.items:
            _flags_ok(it.flags, SUBMIT_OK_FLAGS, "SUBMIT_OK item flags")
            out.append(struct.pack("<QII", it.client_req_id, it.status, it.flags))
            _str(out, it.message, "message")
    elif t == T.FETCH:
        out.append(struct.pack("<QQIIQ", m.client_id, m.ack_seq, m.max_results, m.wait_ms, m.max_bytes))
    elif t == T.RESULTS:
        out.append(struct.pack("<IIQII", len(m.results), 0, m.ack_seq, m.pending_results, m.inflight_samples))
        for x in m.results:
            _enc_result(out, x)
    elif t == T.ABORT:
        _flags_ok(m.flags, ABORT_FLAGS, "ABORT flags")
        out.append(struct.pack("<QQI", m.client_id, m.client_req_id, m.flags))
    elif t == T.ABORT_OK:
        out.append(struct.pack("<II", m.n_requests, m.n_samples))
    elif t == T.STATUS:
        pass
    elif t == T.STATUS_OK:
        _str(out, m.json, "json")
    elif t == T.BYE:
        _flags_ok(m.flags, BYE_FLAGS, "BYE flags")
        out.append(struct.pack("<QI", m.client_id, m.flags))
    elif t == T.BYE_OK:
        out.append(struct.pack("<II", m.pending_results, m.inflight_samples))
    elif t == T.ERROR:
        if m.code == 0:
            raise ValueError("ERROR code is 0; expected an error code >= 1")
        out.append(struct.pack("<IHH", m.code, m.request_type, m.version_max))
        _str(out, m.message, "message")
    elif t == T.UPDATE_BEGIN:
        if not 0 <= m.mode <= MODE_ABORT:
            raise ValueError(f"UPDATE_BEGIN mode is {m.mode}; expected 0 (continue), 1 (drain) or 2 (abort)")
        out.append(struct.pack("<QQB3xIIQI", m.client_id, m.version, m.mode, m.window, m.max_chunk_bytes,
                               m.total_bytes, len(m.tensors)))
        for i, x in enumerate(m.tensors):
            _enc_tensor(out, i, x)
    elif t == T.UPDATE_BEGIN_OK:
        out.append(struct.pack("<QIIQH2x4x", m.xfer_id, m.window, m.max_chunk_bytes, m.staging_bytes, m.data_port))
    elif t == T.UPDATE_CHUNK:
        data = raw_bytes(m.data, "UPDATE_CHUNK data")
        out.append(struct.pack("<QIIQII", m.xfer_id, m.chunk_seq, m.tensor_index, m.offset, m.crc32c, len(data)))
        out.append(data)
    elif t == T.UPDATE_CHUNK_OK:
        _flags_ok(m.flags, CHUNK_OK_FLAGS, "UPDATE_CHUNK_OK flags")
        out.append(struct.pack("<QIIQQ", m.xfer_id, m.chunk_seq, m.flags, m.bytes_staged, m.total_bytes))
    elif t == T.UPDATE_FORWARD:
        _flags_ok(m.flags, FORWARD_FLAGS, "UPDATE_FORWARD flags")
        key = bytes(m.key)
        if len(key) != AUTH_BYTES:
            raise ValueError(f"UPDATE_FORWARD key: {len(key)} bytes; expected {AUTH_BYTES}")
        out.append(struct.pack("<QQHHI", m.xfer_id, m.next_xfer_id, m.port, m.flags, m.window) + key)
        if len(m.host.encode()) > 255:
            raise ValueError("UPDATE_FORWARD host: more than 255 bytes")
        _str(out, m.host, "host")
    elif t == T.UPDATE_FORWARD_OK:
        out.append(struct.pack("<QQ", m.xfer_id, m.queued_bytes))
    elif t == T.UPDATE_PREPARE_OK:
        if m.state > PREP_READY or m.forward > FWD_FAILED:
            raise ValueError(f"UPDATE_PREPARE_OK state {m.state} / forward {m.forward} out of range")
        out.append(struct.pack("<QBBHIQQQ", m.xfer_id, m.state, m.forward, 0, m.forward_error, m.bytes_staged,
                               m.total_bytes, m.forwarded_bytes))
    elif t == T.LANE_AUTH:
        proof = bytes(m.proof)
        if len(proof) != AUTH_BYTES:
            raise ValueError(f"LANE_AUTH proof: {len(proof)} bytes; expected {AUTH_BYTES}")
        out.append(struct.pack("<Q", m.xfer_id) + proof)
    elif t == T.WEIGHTS_SYNC:
        if not 1 <= len(m.url.encode()) <= 1024:
            raise ValueError("WEIGHTS_SYNC url: expected 1..1024 bytes")
        out.append(struct.pack("<Q", m.client_id))
        _str(out, m.url, "url")
    elif t == T.WEIGHTS_SYNC_OK:
        out.append(struct.pack("<Q", m.version))
    elif t in (T.UPDATE_COMMIT, T.UPDATE_ABORT, T.UPDATE_PREPARE):
        out.append(struct.pack("<Q", m.xfer_id))
    elif t == T.UPDATE_COMMIT_OK:
        out.append(struct.pack("<4QII", m.version, m.stall_us, m.wait_us, m.staged_us, m.n_aborted, 0))
    elif t == T.UPDATE_ABORT_OK:
        out.append(struct.pack("<Q", m.bytes_freed))
    elif t in AUTH_TYPES:
        b = bytes(m.bytes)
        if len(b) != AUTH_BYTES:
            raise ValueError(f"{t.name}: {len(b)} bytes; expected {AUTH_BYTES}")
        out.append(b)
    else:
        raise ValueError(f"cannot encode message type {t:#04x}")


def encode(m):
    """One frame (bytes) for message m. Raises ValueError for what decode would
    refuse, struct.error for a field out of its integer range."""
    if getattr(m, "TYPE", None) not in CLASSES:
        raise ValueError(f"cannot encode {type(m).__name__}: not a protocol message")
    out = []
    _enc_body(m, out)
    body = b"".join(out)
    if len(body) > 0xFFFFFFFF:
        raise ValueError(f"{m.TYPE.name}: body would be {len(body)} bytes; the format allows at most 2^32-1")
    return struct.pack("<4sHHII", MAGIC, VERSION, m.TYPE, len(body), 0) + body


def encode_error(code, request_type, message):
    """An ERROR frame, as proto_encode_error builds it: the message cut to 4096
    bytes, each byte of a character cut at the limit replaced by '?'."""
    b = message.encode("utf-8", "replace")[:ERROR_MESSAGE_MAX]
    s = b.decode("utf-8", "ignore")
    s += "?" * (len(b) - len(s.encode("utf-8")))
    return encode(Error(code=code or E.INTERNAL, request_type=request_type, version_max=VERSION, message=s))


# ---- request checks (the daemon's, also usable before sending) ----

def check_lengths(n_prompt, max_tokens, lim):
    if n_prompt == 0:
        raise ProtoError(E.INVALID_PARAMS, "the prompt is empty; expected at least 1 token")
    if n_prompt > lim.max_prompt_tokens:
        raise ProtoError(E.INVALID_PARAMS, f"the prompt has {n_prompt} tokens; the limit is max_prompt_tokens = "
                         f"{lim.max_prompt_tokens}")
    if n_prompt + max_tokens > lim.max_context:
        raise ProtoError(E.INVALID_PARAMS, f"prompt ({n_prompt} tokens) + max_tokens ({max_tokens}) = "
                         f"{n_prompt + max_tokens} exceeds the context of {lim.max_context} tokens")


def check_request(q, lim):
    """Raises ProtoError(INVALID_PARAMS) when request q does not fit the
    daemon's limits and model (lim: its HelloOk); the same checks, in the same
    order, as proto_check_request in C."""
    rid = q.client_req_id

    def bad(msg):
        return ProtoError(E.INVALID_PARAMS, f"request {rid}: {msg}")

    if q.flags & ~REQ_FLAGS:
        raise bad(f"flags {q.flags:#x} have undefined bits {q.flags & ~REQ_FLAGS:#x}; expected only bits "
                  f"{REQ_FLAGS:#x} (protocol version {VERSION})")
    if not 1 <= q.n <= lim.max_n:
        raise bad(f"n = {q.n}; expected 1..{lim.max_n}")
    if not 1 <= q.max_tokens <= lim.max_tokens:
        raise bad(f"max_tokens = {q.max_tokens}; expected 1..{lim.max_tokens}")
    if not math.isfinite(q.temperature) or q.temperature < 0:
        raise bad(f"temperature = {q.temperature}; expected a finite number >= 0")
    if not 0 < q.top_p <= 1:
        raise bad(f"top_p = {q.top_p}; expected 0 < top_p <= 1")
    if q.top_k < 0:
        raise bad(f"top_k = {q.top_k}; expected >= 0 (0 = off)")
    if not 0 <= q.min_p <= 1:
        raise bad(f"min_p = {q.min_p}; expected 0 <= min_p <= 1")
    if q.logprobs_topk > lim.max_logprobs_topk:
        raise bad(f"logprobs_topk = {q.logprobs_topk}; expected 0..{lim.max_logprobs_topk}")
    stop = np.asarray(q.stop_ids, dtype=np.int64)
    if len(stop) > lim.max_stop_ids:
        raise bad(f"{len(stop)} stop ids; expected at most {lim.max_stop_ids}")
    _check_ids("stop_ids", rid, stop, lim.vocab_size)
    worst = result_max_bytes(q.max_tokens, q.flags & REQ_PROCESSED_LOGPROBS, q.logprobs_topk) + RESULTS_OVERHEAD
    if worst > lim.max_message_bytes:
        raise bad(f"a result of max_tokens = {q.max_tokens} with these log-prob options can take {worst} bytes; "
                  f"expected it to fit max_message_bytes = {lim.max_message_bytes}")
    if q.flags & REQ_PROMPT_IS_TEXT:
        if not lim.flags & HELLO_OK_TEXT:
            raise bad("a text prompt, but this daemon has no tokenizer; send token ids")
        if q.flags & REQ_CHAT_TEMPLATE and not lim.flags & HELLO_OK_CHAT:
            raise bad("chat_template asked, but the model has no chat template")
        if not q.prompt_text:
            raise bad("the prompt text is empty; expected at least 1 byte")
        return
    if q.flags & REQ_CHAT_TEMPLATE:
        raise bad("chat_template needs a text prompt (flag prompt_is_text)")
    ids = np.asarray(q.prompt_ids, dtype=np.int64)
    try:
        check_lengths(len(ids), q.max_tokens, lim)
    except ProtoError as e:
        raise bad(e.message) from None
    _check_ids("prompt_ids", rid, ids, lim.vocab_size)


def _check_ids(what, rid, ids, vocab):
    badpos = np.nonzero((ids < 0) | (ids >= vocab))[0]
    if len(badpos):
        i = int(badpos[0])
        raise ProtoError(E.INVALID_PARAMS, f"request {rid}: {what}[{i}] = {int(ids[i])}; expected a token id in "
                         f"0..{vocab - 1} (vocab_size {vocab})")


# ---- the JSON form of a message (golden vectors, rollout-protodump) ----
# u64 fields are decimal strings (JSON numbers lose precision past 2^53);
# f32 values are numbers (the float's exact value) or "nan", "inf", "-inf";
# top_ids/top_logprobs are flat, row-major [n_tokens * top_k].

_U64 = {"client_id", "client_req_id", "seed", "features", "weight_version", "max_message_bytes",
        "retention_bytes", "ack_seq", "max_bytes", "seq", "version_admit", "version_finish", "queued_us",
        "first_token_us", "total_us", "xfer_id", "total_bytes", "staging_bytes", "offset", "bytes_staged",
        "stall_us", "wait_us", "staged_us", "bytes_freed", "nbytes", "next_xfer_id", "queued_bytes",
        "forwarded_bytes"}
# "version" is a u16 in HELLO_OK but a u64 here
_U64_BY_TYPE = {T.UPDATE_BEGIN: _U64 | {"version"}, T.UPDATE_COMMIT_OK: _U64 | {"version"},
                T.WEIGHTS_SYNC_OK: _U64 | {"version"}}


def _jf(x):
    x = float(x)
    if math.isnan(x):
        return "nan"
    if math.isinf(x):
        return "inf" if x > 0 else "-inf"
    return x


def _fj(v):
    if isinstance(v, str):
        return {"nan": math.nan, "inf": math.inf, "-inf": -math.inf}[v]
    return float(v)


def _jfl(a):
    return [_jf(x) for x in np.asarray(a, dtype=np.float32).reshape(-1)]


def _jil(a):
    return [int(x) for x in np.asarray(a).reshape(-1)]


def _scalars(obj, names, u64=_U64):
    d = {}
    for n in names:
        v = getattr(obj, n)
        d[n] = str(int(v)) if n in u64 else (_jf(v) if isinstance(v, float) else v)
    return d


_FIELDS = {
    T.HELLO: ["client_id", "min_version", "max_version", "flags", "client_name"],
    T.HELLO_OK: ["client_id", "version", "flags", "features", "weight_version", "vocab_size", "max_context",
                 "n_layers", "dim", "n_heads", "n_kv_heads", "eos_id", "max_prompt_tokens", "max_message_bytes",
                 "max_n", "max_requests_per_submit", "max_tokens", "max_stop_ids", "max_logprobs_topk",
                 "retention_results", "retention_bytes", "max_wait_ms", "client_ttl_s", "pending_results",
                 "inflight_samples", "model_name", "architecture", "backend", "server"],
    T.SUBMIT: ["client_id"],
    T.SUBMIT_OK: [],
    T.FETCH: ["client_id", "ack_seq", "max_results", "wait_ms", "max_bytes"],
    T.RESULTS: ["ack_seq", "pending_results", "inflight_samples"],
    T.ABORT: ["client_id", "client_req_id", "flags"],
    T.ABORT_OK: ["n_requests", "n_samples"],
    T.STATUS: [],
    T.STATUS_OK: ["json"],
    T.BYE: ["client_id", "flags"],
    T.BYE_OK: ["pending_results", "inflight_samples"],
    T.ERROR: ["code", "request_type", "version_max", "message"],
    T.UPDATE_BEGIN: ["client_id", "version", "mode", "window", "max_chunk_bytes", "total_bytes"],
    T.UPDATE_BEGIN_OK: ["xfer_id", "window", "max_chunk_bytes", "staging_bytes", "data_port"],
    T.UPDATE_CHUNK: ["xfer_id", "chunk_seq", "tensor_index", "offset", "crc32c"],
    T.UPDATE_CHUNK_OK: ["xfer_id", "chunk_seq", "flags", "bytes_staged", "total_bytes"],
    T.UPDATE_COMMIT: ["xfer_id"],
    T.UPDATE_COMMIT_OK: ["version", "stall_us", "wait_us", "staged_us", "n_aborted"],
    T.UPDATE_ABORT: ["xfer_id"],
    T.UPDATE_ABORT_OK: ["bytes_freed"],
    T.UPDATE_FORWARD: ["xfer_id", "next_xfer_id", "port", "flags", "window", "host"],
    T.UPDATE_FORWARD_OK: ["xfer_id", "queued_bytes"],
    T.UPDATE_PREPARE: ["xfer_id"],
    T.UPDATE_PREPARE_OK: ["xfer_id", "state", "forward", "forward_error", "bytes_staged", "total_bytes",
                          "forwarded_bytes"],
    T.LANE_AUTH: ["xfer_id"],
    T.WEIGHTS_SYNC: ["client_id", "url"],
    T.WEIGHTS_SYNC_OK: ["version"],
    T.AUTH_BEGIN: [],
    T.AUTH_CHALLENGE: [],
    T.AUTH: [],
    T.AUTH_OK: [],
}
_TENSOR_FIELDS = ["name", "dtype", "nbytes", "crc32c"]     # and shape, a list of u64 strings
_REQ_FIELDS = ["client_req_id", "n", "max_tokens", "temperature", "top_p", "top_k", "min_p", "seed",
               "logprobs_topk", "flags"]
_RES_FIELDS = ["seq", "client_req_id", "sample_idx", "finish", "flags", "top_k", "n_preempt", "n_prompt", "seed",
               "version_admit", "version_finish", "queued_us", "first_token_us", "total_us"]


def to_json(m):
    """The message as a JSON-ready dict (the form vectors.json uses)."""
    d = {"type": m.TYPE.name}
    d.update(_scalars(m, _FIELDS[m.TYPE], _U64_BY_TYPE.get(m.TYPE, _U64)))
    if m.TYPE == T.SUBMIT:
        d["requests"] = []
        for q in m.requests:
            r = _scalars(q, _REQ_FIELDS)
            r["temperature"], r["top_p"], r["min_p"] = _jf(q.temperature), _jf(q.top_p), _jf(q.min_p)
            r["stop_ids"] = _jil(q.stop_ids)
            r["prompt_ids"] = _jil(q.prompt_ids)
            r["prompt_text"] = q.prompt_text
            d["requests"].append(r)
    elif m.TYPE == T.SUBMIT_OK:
        d["items"] = [_scalars(it, ["client_req_id", "status", "flags", "message"]) for it in m.items]
    elif m.TYPE == T.RESULTS:
        d["results"] = []
        for x in m.results:
            r = _scalars(x, _RES_FIELDS)
            r["token_ids"] = _jil(x.token_ids)
            r["logprobs"] = _jfl(x.logprobs)
            r["logprobs_processed"] = None if x.logprobs_processed is None else _jfl(x.logprobs_processed)
            r["top_ids"] = _jil(x.top_ids)
            r["top_logprobs"] = _jfl(x.top_logprobs)
            r["spans"] = [{"start": int(s), "end": int(e), "version": str(int(v))} for s, e, v in x.spans]
            d["results"].append(r)
    elif m.TYPE == T.UPDATE_BEGIN:
        d["tensors"] = []
        for x in m.tensors:
            r = _scalars(x, ["name", "dtype"])
            r["shape"] = [str(int(v)) for v in x.shape]
            r.update(_scalars(x, ["nbytes", "crc32c"]))
            d["tensors"].append(r)
    elif m.TYPE == T.UPDATE_CHUNK:
        d["data"] = bytes(raw_bytes(m.data)).hex()
    elif m.TYPE in AUTH_TYPES:
        d["bytes"] = bytes(m.bytes).hex()
    elif m.TYPE == T.UPDATE_FORWARD:
        d["key"] = bytes(m.key).hex()
    elif m.TYPE == T.LANE_AUTH:
        d["proof"] = bytes(m.proof).hex()
    return d


def _set(obj, d, names, u64=_U64):
    for n in names:
        v = d[n]
        if n in u64:
            v = int(v)
        setattr(obj, n, v)


def from_json(d):
    """The inverse of to_json."""
    t = T[d["type"]]
    m = CLASSES[t]()
    _set(m, d, _FIELDS[t], _U64_BY_TYPE.get(t, _U64))
    if t == T.SUBMIT:
        for r in d["requests"]:
            q = Request()
            _set(q, r, _REQ_FIELDS)
            q.temperature, q.top_p, q.min_p = _fj(r["temperature"]), _fj(r["top_p"]), _fj(r["min_p"])
            q.stop_ids = np.array(r["stop_ids"], dtype="<i4")
            q.prompt_ids = np.array(r["prompt_ids"], dtype="<i4")
            q.prompt_text = r["prompt_text"]
            m.requests.append(q)
    elif t == T.SUBMIT_OK:
        for r in d["items"]:
            it = SubmitItem()
            _set(it, r, ["client_req_id", "status", "flags", "message"])
            m.items.append(it)
    elif t == T.RESULTS:
        for r in d["results"]:
            x = Result()
            _set(x, r, _RES_FIELDS)
            n = len(r["token_ids"])
            x.token_ids = np.array(r["token_ids"], dtype="<i4")
            x.logprobs = np.array([_fj(v) for v in r["logprobs"]], dtype="<f4")
            if r["logprobs_processed"] is not None:
                x.logprobs_processed = np.array([_fj(v) for v in r["logprobs_processed"]], dtype="<f4")
            x.top_ids = np.array(r["top_ids"], dtype="<i4").reshape(n, x.top_k)
            x.top_logprobs = np.array([_fj(v) for v in r["top_logprobs"]], dtype="<f4").reshape(n, x.top_k)
            x.spans = [(s["start"], s["end"], int(s["version"])) for s in r["spans"]]
            m.results.append(x)
    elif t == T.UPDATE_BEGIN:
        for r in d["tensors"]:
            x = Tensor()
            _set(x, r, _TENSOR_FIELDS)
            x.shape = [int(v) for v in r["shape"]]
            m.tensors.append(x)
    elif t == T.UPDATE_CHUNK:
        m.data = bytes.fromhex(d["data"])
    elif t == T.UPDATE_FORWARD:
        m.key = bytes.fromhex(d["key"])
    elif t == T.LANE_AUTH:
        m.proof = bytes.fromhex(d["proof"])
    elif t in AUTH_TYPES:
        m.bytes = bytes.fromhex(d["bytes"])
    return m
