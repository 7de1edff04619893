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

Versions: decode accepts VERSION_MIN..VERSION and records the frame's version
on the message (m.wire_version, not a dataclass field: equality ignores it);
encode(m) writes m.wire_version, or version=..., or VERSION_MIN (1) for a
message built by hand. Version 2 adds routing replay: the request flag
REQ_RETURN_ROUTES and a result's routes (RESULT_ROUTES), a numpy array
[n_routes, layers, k] of uint8, uint16 or int32 expert ids (its dtype is the
width on the wire). Version 3 adds serve_dtype: UPDATE_BEGIN.serve_dtype (SERVE_*,
0 = the daemon's config) and a result's serve_dtype / serve_dtype_first
(RESULT_SERVE), which policy produced its tokens. Version 4 adds a request's
sampling tail (flag REQ_SAMPLING): repetition_penalty, frequency_penalty,
presence_penalty, min_tokens and logit_bias (bias_ids, bias_vals), on the wire
exactly when the flag is set in a version-4 frame (a Request without it holds
the defaults; encoding non-defaults without it is refused). Version 5 adds
prompt scoring: a request's score tail (flag REQ_SCORE: score_from, the first
prompt position scored; max_tokens may then be 0, n 1) and a result's scores
(RESULT_SCORES): score_from, prompt_logprobs [n_scored] float32 (raw; NaN at
position 0) and, with top_k, prompt_top_ids / prompt_top_logprobs
[n_scored, top_k]; n_scored is n_prompt - score_from, or 0 when the daemon holds
no scores for the sample. Version 6 adds LoRA adapters: a request's lora tail
(flag REQ_LORA: lora, the adapter's name, 1..127 bytes of UTF-8 after a u16
length) and a result's (RESULT_LORA): lora and lora_version, the adapter and
its version the sample ran under; a Request or Result without them has lora
"" (and lora_version 0).
"""
import enum
import math
import struct
from dataclasses import dataclass, field, make_dataclass
from typing import List, Optional, Tuple

import numpy as np

from . import proto_table as _table

MAGIC = b"RLDP"
VERSION = 6                 # the newest version this codec speaks (2: routing replay; 3: delta pushes, serve_dtype;
                            # 4: a request's sampling tail; 5: prompt scoring; 6: LoRA adapters)
VERSION_MIN = 1             # the oldest; frames are written in it unless told otherwise
HEADER_BYTES = 16
DEFAULT_MAX_MESSAGE = 64 << 20
RESULTS_OVERHEAD = HEADER_BYTES + 24
ERROR_MESSAGE_MAX = 4096
MAX_CLIENT_NAME = 256          # bytes; a longer HELLO name is INVALID_PARAMS

AUTH_BYTES = 32             # AUTH_* nonces and proofs, lane keys

# Message types come from the one message table (proto/messages.def, through
# the generated proto_table.py); a reply's type is its request's | 0x80.
T = enum.IntEnum("T", [(name, code) for name, code, _ in _table.TYPES], module=__name__)
T.__doc__ = "Message types (proto/messages.def); a reply's type is its request's | 0x80."
REQUEST_TYPES = frozenset(T[name] for name, _, served in _table.TYPES if served)


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
    FORBIDDEN = 17           # an UPDATE_FORWARD target outside the daemon's relay_allow (§10.11)
    BASE_MISMATCH = 18       # version 3: a delta's base_version is not the serving version (§10.14)
    DTYPE_MISMATCH = 19      # version 3: the daemon holds the delta's tensor in another dtype, or not from a push
    BASE_QUANTIZED = 20      # version 3: the daemon holds the delta's tensor quantized (serve_dtype q8_0)


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
REQ_RETURN_ROUTES = 0x20     # version 2: results carry the experts each position was routed to
REQ_SAMPLING = 0x40          # version 4: a sampling tail follows the prompt (penalties, min_tokens, logit_bias)
REQ_SCORE = 0x80             # version 5: score the prompt from score_from on (the score tail follows); max_tokens may be 0
REQ_LORA = 0x100             # version 6: run the samples under a LoRA adapter (the lora tail follows: u16 length, name)
REQ_FLAGS = 0x1FF
REQ_FLAGS_V2 = 0x20          # the bits version 2 added
REQ_FLAGS_V4 = 0x40          # the bits version 4 added (before it no tail is read and check_request refuses them)
REQ_FLAGS_V5 = 0x80          # the bits version 5 added (likewise)
REQ_FLAGS_V6 = 0x100         # the bits version 6 added (likewise)
SCORE_TAIL_BYTES = 4         # a request's score tail: i32 score_from
MAX_LORA_NAME = 127          # bytes of an adapter name in a lora tail (1..127)
LORA_TAIL_BYTES = 2          # a request's lora tail without its name: u16 name length
SAMPLING_TAIL_BYTES = 20     # the sampling tail without its (i32 id, f32 bias) pairs, 8 bytes each
MAX_BIAS = 1024              # logit_bias entries a request may carry
MAX_ABS_BIAS = 100.0         # a bias is in [-100, 100]

SUBMIT_DUPLICATE = 0x1
SUBMIT_OK_FLAGS = 0x1
RESULT_PROCESSED = 0x1
RESULT_ROUTES = 0x2          # version 2: the routes follow the spans
RESULT_SERVE = 0x4           # version 3: the serve tail (serve_dtype, serve_dtype_first) follows the routes/spans
RESULT_SCORES = 0x8          # version 5: the prompt's scores follow (after the serve tail, the routes or the spans)
RESULT_LORA = 0x10           # version 6: the lora tail (adapter name, version) follows (after the scores, ...)
RESULT_FLAGS = 0x1F
RESULT_FLAGS_V2 = 0x2        # the bits version 2 added (MALFORMED in a version-1 frame)
RESULT_FLAGS_V3 = 0x4        # the bits version 3 added (MALFORMED before version 3)
RESULT_FLAGS_V5 = 0x8        # the bits version 5 added (MALFORMED before version 5)
RESULT_FLAGS_V6 = 0x10       # the bits version 6 added (MALFORMED before version 6)
SCORES_HEAD_BYTES = 12       # a result's scores before their arrays: score_from, flags (0), n_scored
RESULT_LORA_BYTES = 10       # a result's lora tail without its name: u16 name length, u64 version
SERVE_CONFIG, SERVE_AS_PUSHED, SERVE_Q8_0, SERVE_Q4_K, SERVE_FP8 = 0, 1, 2, 3, 4   # serve_dtype codes (0: UPDATE_BEGIN only)
SERVE_NAMES = {0: "unknown", 1: "as_pushed", 2: "q8_0", 3: "q4_k", 4: "fp8"}   # in a result 0: a version no longer known
SERVE_CODES = {"as_pushed": 1, "q8_0": 2, "q4_k": 3, "fp8": 4}
SERVE_MAX = 4
SERVE_TAIL_BYTES = 4         # serve_dtype u8, serve_dtype_first u8, reserved u16
ABORT_ALL = 0x1
ABORT_FLAGS = 0x1
BYE_DISCARD = 0x1
BYE_FLAGS = 0x1

FEATURE_WEIGHT_UPDATE = 0x1  # HELLO_OK.features: UPDATE_* messages are served
FEATURE_RELAY = 0x2          # UPDATE_FORWARD and UPDATE_PREPARE are served (§10.11)
FEATURE_ROUTES = 0x4         # version 2: a mixture-of-experts model; requests may ask REQ_RETURN_ROUTES
FEATURE_LORA_PUSH = 0x8      # ADAPTER_BEGIN is served: LoRA adapters pushed as transfers (§10.15)
ADAPTER_RSLORA = 0x1         # ADAPTER_BEGIN.flags: scale lora_alpha / sqrt(rank)
FORWARD_AUTH = 0x1           # UPDATE_FORWARD: the next lane challenges; prove with the (wrapped) key
FORWARD_FLAGS = 0x1
PREP_STAGING, PREP_BUILDING, PREP_READY = 0, 1, 2
FWD_NONE, FWD_SENDING, FWD_DONE, FWD_FAILED = 0, 1, 2, 3
CHUNK_OK_DUPLICATE = 0x1     # the same chunk was already staged: acknowledged, no effect
CHUNK_OK_FLAGS = 0x1
MODE_CONTINUE, MODE_DRAIN, MODE_ABORT = 0, 1, 2
MODE_NAMES = {0: "continue", 1: "drain", 2: "abort"}
TENSOR_DELTA = 0x1          # version 3: the tensor's chunks carry a delta against base_version (§10.14)
TENSOR_FLAGS = 0x1
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
BIAS_PAIR_BYTES = 8          # a sampling tail's (i32 id, f32 bias)
_BIAS_PAIR = np.dtype([("id", "<i4"), ("bias", "<f4")])
ROUTES_HEAD_BYTES = 8        # n_routes u32, layers u16, k u8, width u8
ROUTE_DTYPES = {1: "<u1", 2: "<u2", 4: "<i4"}   # id width on the wire -> numpy dtype
ROUTE_DTYPE_NAMES = {1: "uint8", 2: "uint16", 4: "int32"}
UPDATE_BEGIN_MIN_BYTES = 40
TENSOR_MIN_BYTES = 28        # empty name, one dimension


def dtype_size(dtype):
    """Bytes per element of a DTYPE_* (0 for an unknown one), as proto_dtype_size."""
    return DTYPE_SIZES.get(dtype, 0)


def route_width(n_experts):
    """Bytes per expert id routes of a model with n_experts are sent in (proto_route_width)."""
    return 1 if n_experts <= 256 else 2 if n_experts <= 65536 else 4


def routes_bytes(positions, layers, k, width):
    """Bytes a result's routes add (proto_routes_bytes)."""
    return ROUTES_HEAD_BYTES + positions * layers * k * width


def scores_bytes(n_scored, top_k):
    """Bytes a result's scores add (proto_scores_bytes): the head and n_scored x (4 + 8 x top_k)."""
    return SCORES_HEAD_BYTES + n_scored * (4 + 8 * top_k)


def lora_bytes(name_len):
    """Bytes a result's lora tail adds (proto_lora_bytes): u16 length, the name, u64 version."""
    return RESULT_LORA_BYTES + name_len


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
# Each message class is built from its table layout: one dataclass field per
# wire field (reserved fields and counts have none), a list for the array a
# message carries. Fields default to 0 / "" / 32 zero bytes, except these.
# The element classes whose layout is special (Request, Result, Tensor) are
# written out below.

_DEFAULTS = {
    "HELLO": {"min_version": VERSION_MIN, "max_version": VERSION_MIN},
    "HELLO_OK": {"version": VERSION_MIN, "eos_id": -1, "max_message_bytes": DEFAULT_MAX_MESSAGE},
    "ERROR": {"code": E.INTERNAL, "version_max": VERSION},
    "UPDATE_BEGIN": {"mode": MODE_CONTINUE, "window": 1},
    "UPDATE_FORWARD": {"window": 1},
    "ADAPTER_BEGIN": {"window": 1},
}
_HIDDEN = ("RSV16", "RSV24", "RSV32", "COUNT", "DIMS8")   # kinds with no attribute


def _camel(name):
    return "".join(w.capitalize() for w in name.split("_"))


def _make_class(name, layout, array=None, array_default=list, type_=None):
    defaults = _DEFAULTS.get(name, {})
    fields = []
    for kind, fname, _a, _b, _t in _table.LAYOUTS[layout]:
        if kind in _HIDDEN:
            continue
        d = defaults.get(fname, "" if kind == "STR" else b"\0" * AUTH_BYTES if kind == "BYTES32" else
                         0.0 if kind == "F32" else 0)
        fields.append((fname, type(d), field(default=d)))
    if array:
        fields.append((array, object, field(default_factory=array_default)))
    ns = {"TYPE": type_, "wire_version": 0} if type_ is not None else {}
    cls = make_dataclass(_camel(name), fields, namespace=ns)
    cls.__module__ = __name__
    return cls


SubmitItem = _make_class("SUBMIT_ITEM", "SUBMIT_ITEM")


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
    # the sampling tail (version 4, flag REQ_SAMPLING); these defaults without it
    repetition_penalty: float = 1.0    # finite, > 0; 1 = off (a prompt or output token: logit / r if > 0, else * r)
    frequency_penalty: float = 0.0     # [-2, 2]; minus f times the token's count in the output
    presence_penalty: float = 0.0      # [-2, 2]; minus p once if the token is in the output
    min_tokens: int = 0                # 0..max_tokens: EOS and stop ids masked until this many are generated
    bias_ids: np.ndarray = field(default_factory=_empty_i32)     # [n_bias] distinct token ids (logit_bias keys)
    bias_vals: np.ndarray = field(default_factory=_empty_f32)    # [n_bias] in [-100, 100], added to the logits
    # the score tail (version 5, flag REQ_SCORE): the first prompt position scored; 0 without it
    score_from: int = 0
    # the lora tail (version 6, flag REQ_LORA): the adapter the samples run under; "" without it (the base model)
    lora: str = ""

    def has_sampling(self):
        """Whether any sampling-tail field differs from its default (the tail is then needed: version 4)."""
        return (float(self.repetition_penalty) != 1.0 or float(self.frequency_penalty) != 0.0 or
                float(self.presence_penalty) != 0.0 or int(self.min_tokens) != 0 or len(self.bias_ids) > 0 or
                len(self.bias_vals) > 0)


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
    routes: Optional[np.ndarray] = None   # with RESULT_ROUTES: [n_routes, layers, k] uint8/uint16/int32 expert ids
    serve_dtype: int = 0         # with RESULT_SERVE (version 3): SERVE_* of the weights at version_finish
    serve_dtype_first: int = 0   # with RESULT_SERVE: SERVE_* of the first span's version
    # with RESULT_SCORES (version 5): the raw log-prob of prompt tokens score_from.. (NaN at position 0) and
    # their top_k alternatives; n_scored = len(prompt_logprobs) is n_prompt - score_from, or 0 (none held)
    score_from: int = 0
    prompt_logprobs: Optional[np.ndarray] = None                          # [n_scored] float32
    prompt_top_ids: Optional[np.ndarray] = None                           # [n_scored, top_k] int32
    prompt_top_logprobs: Optional[np.ndarray] = None                      # [n_scored, top_k] float32
    # with RESULT_LORA (version 6): the adapter the sample ran under and its version (0: not known, the sample
    # failed before it ran); "" and 0 without the flag
    lora: str = ""
    lora_version: int = 0


@dataclass
class Tensor:
    """One tensor of an UPDATE_BEGIN manifest (Hugging Face name and layout)."""
    name: str = ""
    dtype: int = DTYPE_F32
    shape: List[int] = field(default_factory=list)    # 1..4 dims, outermost first
    nbytes: int = 0          # product of shape x dtype size
    crc32c: int = 0          # of the tensor's nbytes bytes (a delta's: of the new bytes, after applying)
    flags: int = 0           # TENSOR_DELTA (version 3)
    wire_bytes: int = 0      # TENSOR_DELTA: bytes its chunks carry (the encoded delta, >= 1)
    base_version: int = 0    # TENSOR_DELTA: the weight version the delta applies to


_ELEM_CLASSES = {"REQUEST": Request, "SUBMIT_ITEM": SubmitItem, "RESULT": Result, "TENSOR": Tensor}

CLASSES = {}
for _name, (_layout, _elem, _array) in _table.MESSAGES.items():
    CLASSES[T[_name]] = _make_class(_name, _layout, _array, bytes if _elem == "BYTES" else list, T[_name])
    globals()[CLASSES[T[_name]].__name__] = CLASSES[T[_name]]   # Hello, HelloOk, ... (the public names)
AUTH_TYPES = (T.AUTH_BEGIN, T.AUTH_CHALLENGE, T.AUTH, T.AUTH_OK)


def is_request(type_):
    """True for the request types a daemon serves (proto_is_request)."""
    return type_ in REQUEST_TYPES


def types_expected():
    """The defined types in runs of consecutive codes, as the UNKNOWN_TYPE
    message lists them (proto_types_expected in C)."""
    codes = sorted(T)
    runs, i = [], 0
    while i < len(codes):
        j = i
        while j + 1 < len(codes) and codes[j + 1] == codes[j] + 1:
            j += 1
        a, b = codes[i], codes[j]
        runs.append(f"{a.name} ({a:#04x})" if a == b else f"{a.name}..{b.name} ({a:#04x}..{b:#04x})")
        i = j + 1
    return ", ".join(runs)


def undefined_type_after(type_):
    """The first undefined type code above type_ (tests pick "the undefined
    type next to the update types" with it, so a new message cannot break them)."""
    t = int(type_) + 1
    while t in T._value2member_map_:
        t += 1
    return t


# ---- decode ----

class _Reader:
    def __init__(self, buf, off, end, name, version=VERSION_MIN):
        self.version = version
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
                                 f"{self.version} and must be 0")

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

    def lora_name(self):
        """A lora tail's adapter name (version 6): u16 length, 1..MAX_LORA_NAME, then UTF-8."""
        n = self.u16("lora_name")
        if not 1 <= n <= MAX_LORA_NAME:
            raise self.malformed(f"lora_name is {n} bytes long; expected 1..{MAX_LORA_NAME} bytes")
        self.need(n, "lora_name")
        raw = bytes(self.buf[self.off:self.off + n])
        try:
            s = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise self.malformed(f"lora_name is not valid UTF-8 (byte {e.start} of {n}, value {raw[e.start]:#04x}); "
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


_SCALAR = {"U8": "u8", "U16": "u16", "U32": "u32", "I32": "i32", "U64": "u64", "F32": "f32",
           "BITS8": "u8", "BITS16": "u16", "BITS32": "u32", "ENUM8": "u8", "RANGE32": "u32", "DIMS8": "u8",
           "RSV16": "u16", "RSV32": "u32", "COUNT": "u32"}


def _dec_fields(r, layout, obj):
    """Reads a table layout into obj, checking each field as its kind says
    (dec_fields in proto.c). Returns the hidden values (counts, n_dims) by name."""
    hidden = {}
    for kind, name, a, b, text in layout:
        if kind == "STR":
            setattr(obj, name, r.string(name, a, b))
            continue
        if kind == "BYTES32":
            setattr(obj, name, bytes(r.raw(AUTH_BYTES, name)))
            continue
        if kind == "COUNT":
            hidden[name] = r.count(a, name)
            continue
        if kind == "RSV24":     # byte by byte, as the C decoder reads it
            r.zero_bits(r.u8(name) | r.u8(name) << 8 | r.u8(name) << 16, 0, name)
            continue
        v = getattr(r, _SCALAR[kind])(name)
        if kind.startswith("BITS") or kind.startswith("RSV"):
            r.zero_bits(v, _bits_allowed(a, b, r.version) if kind.startswith("BITS") else 0, name)
        elif kind in ("ENUM8", "RANGE32", "DIMS8") and not a <= v <= b:
            raise r.malformed(f"{name} is {v}; expected {text}")
        if kind.startswith("RSV"):
            continue
        if kind == "DIMS8":
            hidden[name] = v
        else:
            setattr(obj, name, v)
    return hidden


# ---- decode: the element tails (what the field kinds cannot say) ----

def _dec_request_tail(r, q, hidden):
    q.stop_ids = r.array(r.count(4, "n_stop"), "<i4", "stop_ids")
    if q.flags & REQ_PROMPT_IS_TEXT:
        q.prompt_text = r.string("prompt_text")
    else:
        q.prompt_ids = r.array(r.count(4, "n_prompt"), "<i4", "prompt_ids")
    if q.flags & REQ_SAMPLING and r.version >= 4:    # before version 4 the bit switches nothing on
        q.repetition_penalty = r.f32("repetition_penalty")
        q.frequency_penalty = r.f32("frequency_penalty")
        q.presence_penalty = r.f32("presence_penalty")
        q.min_tokens = r.u32("min_tokens")
        n = r.count(BIAS_PAIR_BYTES, "n_bias")
        pairs = np.frombuffer(r.buf, dtype=_BIAS_PAIR, count=n, offset=r.off) if n else np.zeros(0, _BIAS_PAIR)
        q.bias_ids, q.bias_vals = pairs["id"], pairs["bias"]
        r.off += BIAS_PAIR_BYTES * n
    if q.flags & REQ_SCORE and r.version >= 5:       # before version 5 the bit switches nothing on
        q.score_from = r.i32("score_from")
    if q.flags & REQ_LORA and r.version >= 6:        # before version 6 the bit switches nothing on
        q.lora = r.lora_name()


def _dec_result_tail(r, x, hidden):
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
    if x.flags & RESULT_ROUTES:
        _dec_routes(r, x)
    if x.flags & RESULT_SERVE:
        x.serve_dtype, x.serve_dtype_first, rsv = r.u8("serve_dtype"), r.u8("serve_dtype_first"), r.u16("serve reserved")
        if x.serve_dtype > SERVE_MAX or x.serve_dtype_first > SERVE_MAX or rsv:
            raise r.malformed(f"serve_dtype {x.serve_dtype}, serve_dtype_first {x.serve_dtype_first}, reserved {rsv}; "
                              f"expected 0..{SERVE_MAX}, 0..{SERVE_MAX}, 0")
    if x.flags & RESULT_SCORES:
        _dec_scores(r, x)
    if x.flags & RESULT_LORA:           # version 6 (_dec_fields refused the bit before)
        x.lora = r.lora_name()
        x.lora_version = r.u64("lora_version")


def _dec_scores(r, x):
    """score_from, flags (0), n_scored, then the log-probs and the alternatives (views of the frame)."""
    x.score_from = r.u32("score_from")
    r.zero_bits(r.u32("scores flags"), 0, "scores flags")
    n = r.count(4 + 8 * x.top_k, "n_scored")
    if x.score_from > x.n_prompt or n not in (0, x.n_prompt - x.score_from):
        raise r.malformed(f"scores from position {x.score_from}, {n} of them, in a prompt of {x.n_prompt} tokens; "
                          "expected score_from <= n_prompt and n_scored 0 or n_prompt - score_from")
    x.prompt_logprobs = r.array(n, "<f4", "prompt_logprobs")
    x.prompt_top_ids = r.array(n * x.top_k, "<i4", "prompt_top_ids").reshape(n, x.top_k)
    x.prompt_top_logprobs = r.array(n * x.top_k, "<f4", "prompt_top_logprobs").reshape(n, x.top_k)


def _dec_routes(r, x):
    """n_routes, layers, k, width, then the ids (a view of the frame, as the token arrays)."""
    n_routes, layers, k, w = r.u32("n_routes"), r.u16("route_layers"), r.u8("route_k"), r.u8("route_width")
    if w not in ROUTE_DTYPES:
        raise r.malformed(f"route_width is {w}; expected 1, 2 or 4 (bytes per expert id)")
    if layers == 0 or k == 0:
        raise r.malformed(f"routes of {layers} layers x {k} experts; expected at least 1 of each")
    n = n_routes * layers * k
    left = r.end - r.off
    if n * w > left:
        raise r.malformed(f"n_routes = {n_routes} needs {n * w} bytes ({layers} layers x {k} experts x {w} bytes), "
                          f"but {left} are left in the body")
    x.routes = np.frombuffer(r.buf, dtype=ROUTE_DTYPES[w], count=n, offset=r.off).reshape(n_routes, layers, k) \
        if n else np.zeros((n_routes, layers, k), ROUTE_DTYPES[w])
    r.off += n * w


def _dec_tensor_tail(r, t, hidden):
    t.shape = [r.u64("shape") for _ in range(hidden["n_dims"])]
    t.nbytes = r.u64("nbytes")
    t.crc32c = r.u32("crc32c")
    if not t.flags & TENSOR_DELTA:
        return
    if r.version < 3:
        raise r.malformed(f"flags {t.flags:#x}: DELTA is defined from protocol version 3; this frame is version "
                          f"{r.version}")
    t.wire_bytes = r.u64("wire_bytes")
    t.base_version = r.u64("base_version")
    if t.wire_bytes == 0:
        raise r.malformed("wire_bytes is 0; expected a delta of at least 1 byte")


_DEC_TAILS = {"REQUEST": _dec_request_tail, "RESULT": _dec_result_tail, "TENSOR": _dec_tensor_tail}


def _dec_body(r, type_):
    layout, elem, array = _table.MESSAGES[type_.name]
    m = CLASSES[type_]()
    hidden = _dec_fields(r, _table.LAYOUTS[layout], m)
    if elem is None:
        return m
    n = next(v for k, v in hidden.items())          # the layout's one COUNT
    if elem == "BYTES":                              # UPDATE_CHUNK: a view of the frame, no copy
        m.data = r.raw(n, "data")
        return m
    cls, fields, tail = _ELEM_CLASSES[elem], _table.LAYOUTS[elem], _DEC_TAILS.get(elem)
    items = getattr(m, array)
    r.arr = array
    for i in range(n):
        r.idx = i
        x = cls()
        h = _dec_fields(r, fields, x)
        if tail:
            tail(r, x, h)
        items.append(x)
    r.arr = None
    return m


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
    if not VERSION_MIN <= version <= VERSION:
        raise ProtoError(E.UNSUPPORTED_VERSION,
                         f"protocol version {version}; this peer speaks version {VERSION_MIN} to {VERSION}", type_)
    if max_len and body_len + HEADER_BYTES > max_len:
        raise ProtoError(E.TOO_LARGE, f"header declares a {body_len}-byte body ({body_len + HEADER_BYTES}-byte "
                         f"frame); the limit is {max_len} bytes", type_)
    if body_len != n - HEADER_BYTES:
        why = "truncated frame" if body_len > n - HEADER_BYTES else "trailing bytes"
        raise ProtoError(E.MALFORMED, f"header declares a {body_len}-byte body but the frame carries "
                         f"{n - HEADER_BYTES} bytes after the header; expected them equal ({why})", type_)
    if flags != 0:
        raise ProtoError(E.MALFORMED, f"header flags are {flags:#x}; expected 0 in protocol version {version}", type_)
    if type_ not in T._value2member_map_:
        raise ProtoError(E.UNKNOWN_TYPE, f"message type {type_:#04x} is not defined; expected one of "
                         f"{types_expected()}", type_)
    r = _Reader(buf, HEADER_BYTES, n, T(type_).name, version)
    try:
        msg = _dec_body(r, T(type_))
    except ProtoError as e:
        e.type = type_
        raise
    if r.off != n:
        raise ProtoError(E.MALFORMED, f"{r.name}: {n - r.off} bytes after the last field (body offset "
                         f"{r.off - HEADER_BYTES} of {body_len}); expected none", type_)
    if type_ == T.UPDATE_BEGIN and version < 3 and msg.serve_dtype:
        raise ProtoError(E.MALFORMED, f"UPDATE_BEGIN: serve_dtype is {msg.serve_dtype} in a protocol version "
                         f"{version} frame; it is defined from version 3 and must be 0 before", type_)
    msg.wire_version = version
    return msg


def frame_version(buf):
    """The header's protocol version, or None when there is no readable header."""
    if len(buf) < HEADER_BYTES or bytes(buf[:4]) != MAGIC:
        return None
    return struct.unpack_from("<H", buf, 4)[0]


def _bits_allowed(a, b, version):
    """The bits of a BITS field (A; B those each later version added, a byte per version from 2) a frame of
    this version may set."""
    for v in range(max(version + 1, 2), VERSION + 1):
        a &= ~((b >> (8 * (v - 2))) & 0xFF)
    return a


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


def _flags_ok(v, allowed, what, version=VERSION):
    if v & ~allowed:
        raise ValueError(f"{what} {v:#x} has bits {v & ~allowed:#x} undefined in protocol version {version}; "
                         "expected them 0")


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


def result_bytes(x):
    """Encoded size of one result inside RESULTS."""
    n = len(x.token_ids)
    per = 8 + (4 if x.flags & RESULT_PROCESSED else 0) + 8 * x.top_k
    size = RESULT_MIN_BYTES + per * n + SPAN_BYTES * len(x.spans)
    if x.flags & RESULT_ROUTES:
        size += ROUTES_HEAD_BYTES + np.asarray(x.routes).nbytes
    if x.flags & RESULT_SERVE:
        size += SERVE_TAIL_BYTES
    if x.flags & RESULT_SCORES:
        size += scores_bytes(len(x.prompt_logprobs), x.top_k)
    if x.flags & RESULT_LORA:
        size += lora_bytes(len(x.lora.encode("utf-8")))
    return size


def result_max_bytes(max_tokens, processed, logprobs_topk):
    """The largest a result of these request parameters can be (spans included)."""
    return RESULT_MIN_BYTES + (8 + (4 if processed else 0) + 8 * logprobs_topk + SPAN_BYTES) * max_tokens


_PACK = {"U8": "<B", "U16": "<H", "U32": "<I", "I32": "<i", "U64": "<Q", "BITS8": "<B", "BITS16": "<H",
         "BITS32": "<I", "ENUM8": "<B", "RANGE32": "<I", "DIMS8": "<B", "COUNT": "<I"}
_ZEROS = {"RSV16": b"\0" * 2, "RSV24": b"\0" * 3, "RSV32": b"\0" * 4}


def _enc_fields(out, layout, obj, hidden, what, version=VERSION_MIN):
    """Appends a table layout's fields of obj, refusing what the decoder would
    refuse in that protocol version (ValueError). hidden gives the COUNT and DIMS8 values."""
    for kind, name, a, b, text in layout:
        if kind in _ZEROS:
            out.append(_ZEROS[kind])
            continue
        v = hidden[name] if kind in ("COUNT", "DIMS8") else getattr(obj, name)
        if kind == "STR":
            s = _utf8(v, f"{what} {name}")
            if not a <= len(s) <= b:
                raise ValueError(f"{what}: {name} is {len(s)} bytes long; expected {a}..{b} bytes")
            out.append(struct.pack("<I", len(s)))
            out.append(s)
        elif kind == "BYTES32":
            v = bytes(v)
            if len(v) != AUTH_BYTES:
                raise ValueError(f"{what} {name}: {len(v)} bytes; expected {AUTH_BYTES}")
            out.append(v)
        elif kind == "F32":
            out.append(_f32_bytes(v))
        else:
            if kind.startswith("BITS"):
                _flags_ok(v, _bits_allowed(a, b, version), f"{what} {name}", version)
            elif kind in ("ENUM8", "RANGE32", "DIMS8") and not a <= v <= b:
                raise ValueError(f"{what}: {name} is {v}; expected {text}")
            out.append(struct.pack(_PACK[kind], v))


def _sampling_tail(q, version):
    """Whether q's frame carries the sampling tail: flag REQ_SAMPLING in version 4 or later."""
    return bool(q.flags & REQ_SAMPLING) and version >= 4


def _score_tail(q, version):
    """Whether q's frame carries the score tail: flag REQ_SCORE in version 5 or later."""
    return bool(q.flags & REQ_SCORE) and version >= 5


def _lora_tail(q, version):
    """Whether q's frame carries the lora tail: flag REQ_LORA in version 6 or later."""
    return bool(q.flags & REQ_LORA) and version >= 6


def _lora_name(name, what):
    """An adapter name where a lora tail carries it, as bytes: 1..MAX_LORA_NAME bytes of UTF-8 (ValueError)."""
    b = _utf8(name, f"{what} lora")
    if not 1 <= len(b) <= MAX_LORA_NAME:
        raise ValueError(f"{what}: the adapter name is {len(b)} bytes long; expected 1..{MAX_LORA_NAME} bytes")
    return b


def _request_check(q, what, version=VERSION_MIN):
    if not _sampling_tail(q, version) and q.has_sampling():
        raise ValueError(f"request {q.client_req_id}: sampling fields (penalties, min_tokens, logit_bias) need flag "
                         f"REQ_SAMPLING in protocol version 4 or later; encoding version {version}, flags {q.flags:#x}")
    if not _score_tail(q, version) and q.score_from != 0:
        raise ValueError(f"request {q.client_req_id}: score_from {q.score_from} needs flag REQ_SCORE in protocol "
                         f"version 5 or later; encoding version {version}, flags {q.flags:#x}")
    lora = _lora_name(q.lora, f"request {q.client_req_id}") if _lora_tail(q, version) else None
    if lora is None and q.lora:
        raise ValueError(f"request {q.client_req_id}: an adapter name needs flag REQ_LORA in protocol version 6 or "
                         f"later; encoding version {version}, flags {q.flags:#x}")
    if len(_i32(q.bias_ids)) != len(_f32(q.bias_vals)):
        raise ValueError(f"request {q.client_req_id}: {len(_i32(q.bias_ids))} bias_ids but {len(_f32(q.bias_vals))} "
                         "bias_vals; expected one value per id")
    text = bool(q.flags & REQ_PROMPT_IS_TEXT)
    if text and len(_i32(q.prompt_ids)):
        raise ValueError(f"request {q.client_req_id}: flags say the prompt is text but it has "
                         f"{len(_i32(q.prompt_ids))} token ids")
    if not text and q.prompt_text:
        raise ValueError(f"request {q.client_req_id}: has prompt text but flags lack REQ_PROMPT_IS_TEXT")
    return {"sampling": _sampling_tail(q, version), "score": _score_tail(q, version), "lora": lora}


def _enc_request_tail(out, q, hidden):
    stop = _i32(q.stop_ids)
    out.append(struct.pack("<I", len(stop)))
    out.append(stop.tobytes())
    if q.flags & REQ_PROMPT_IS_TEXT:
        _str(out, q.prompt_text, "prompt_text")
    else:
        ids = _i32(q.prompt_ids)
        out.append(struct.pack("<I", len(ids)))
        out.append(ids.tobytes())
    if hidden["sampling"]:
        out.append(_f32_bytes([q.repetition_penalty, q.frequency_penalty, q.presence_penalty]))
        ids, vals = _i32(q.bias_ids), _f32(q.bias_vals)
        out.append(struct.pack("<II", q.min_tokens, len(ids)))
        pairs = np.empty(len(ids), _BIAS_PAIR)
        pairs["id"], pairs["bias"] = ids, vals
        out.append(pairs.tobytes())
    if hidden["score"]:
        out.append(struct.pack("<i", q.score_from))
    if hidden["lora"] is not None:
        out.append(struct.pack("<H", len(hidden["lora"])))
        out.append(hidden["lora"])


def _result_check(x, what, version=VERSION_MIN):
    what = f"result seq {x.seq}"
    n = len(_i32(x.token_ids))
    lp = _f32(x.logprobs)
    if lp.shape != (n,):
        raise ValueError(f"{what}: logprobs has shape {lp.shape}; expected ({n},)")
    if x.flags & RESULT_PROCESSED:
        if x.logprobs_processed is None or _f32(x.logprobs_processed).shape != (n,):
            raise ValueError(f"{what}: flags have RESULT_PROCESSED; expected logprobs_processed of shape ({n},)")
    elif x.logprobs_processed is not None:
        raise ValueError(f"{what}: logprobs_processed given but flags lack RESULT_PROCESSED")
    if not 0 <= x.top_k <= 0xFFFF:
        raise ValueError(f"{what}: top_k = {x.top_k}; expected 0..65535")
    nk = n * x.top_k
    if len(_i32(x.top_ids).reshape(-1)) != nk or len(_f32(x.top_logprobs).reshape(-1)) != nk:
        raise ValueError(f"{what}: top_ids/top_logprobs have {len(_i32(x.top_ids).reshape(-1))}/"
                         f"{len(_f32(x.top_logprobs).reshape(-1))} entries; expected n_tokens * top_k = {nk}")
    why = _check_spans(n, [tuple(int(v) for v in s) for s in x.spans])
    if why:
        raise ValueError(f"{what}: {why}")
    if x.flags & RESULT_ROUTES:
        _routes_array(x.routes, what)
    if x.flags & RESULT_SERVE and not (0 <= x.serve_dtype <= SERVE_MAX and 0 <= x.serve_dtype_first <= SERVE_MAX):
        raise ValueError(f"{what}: serve_dtype {x.serve_dtype} / serve_dtype_first {x.serve_dtype_first}; "
                         f"expected 0..{SERVE_MAX}")
    _scores_check(x, what)
    if x.flags & RESULT_LORA:
        return {"lora": _lora_name(x.lora, what)}
    if x.lora or x.lora_version:
        raise ValueError(f"{what}: an adapter name or lora_version without flag RESULT_LORA")
    return {"lora": None}


def _scores_check(x, what):
    """A result's scores: exactly with RESULT_SCORES, from score_from to the prompt's end (or none)."""
    if not x.flags & RESULT_SCORES:
        if x.prompt_logprobs is not None:
            raise ValueError(f"{what}: prompt_logprobs given but flags lack RESULT_SCORES")
        return
    if x.prompt_logprobs is None:
        raise ValueError(f"{what}: flags have RESULT_SCORES; expected prompt_logprobs")
    n = len(_f32(x.prompt_logprobs).reshape(-1))
    if not 0 <= x.score_from <= x.n_prompt or n not in (0, x.n_prompt - x.score_from):
        raise ValueError(f"{what}: scores from position {x.score_from}, {n} of them, in a prompt of {x.n_prompt} "
                         "tokens; expected score_from <= n_prompt and n_scored 0 or n_prompt - score_from")
    nk = n * x.top_k
    ids = _i32(x.prompt_top_ids if x.prompt_top_ids is not None else []).reshape(-1)
    lps = _f32(x.prompt_top_logprobs if x.prompt_top_logprobs is not None else []).reshape(-1)
    if len(ids) != nk or len(lps) != nk:
        raise ValueError(f"{what}: prompt_top_ids/prompt_top_logprobs have {len(ids)}/{len(lps)} entries; expected "
                         f"n_scored * top_k = {nk}")


def _routes_array(a, what):
    """A result's routes as the little-endian array its bytes go out in (ValueError when it cannot be)."""
    if a is None:
        raise ValueError(f"{what}: flags have RESULT_ROUTES; expected routes, an array [n_routes, layers, k]")
    a = np.asarray(a)
    kinds = {("u", 1): "<u1", ("u", 2): "<u2", ("i", 4): "<i4"}
    if (a.dtype.kind, a.dtype.itemsize) not in kinds:
        raise ValueError(f"{what}: routes have dtype {a.dtype}; expected uint8, uint16 or int32 (the width on the wire)")
    if a.ndim != 3 or not 1 <= a.shape[1] <= 0xFFFF or not 1 <= a.shape[2] <= 0xFF or a.shape[0] > 0xFFFFFFFF:
        raise ValueError(f"{what}: routes have shape {a.shape}; expected [n_routes, 1..65535 layers, 1..255 experts]")
    return np.ascontiguousarray(a, dtype=kinds[(a.dtype.kind, a.dtype.itemsize)])


def _enc_result_tail(out, x, hidden):
    ids = _i32(x.token_ids)
    out.append(struct.pack("<I", len(ids)))
    out.append(ids.tobytes())
    out.append(_f32(x.logprobs).tobytes())
    if x.flags & RESULT_PROCESSED:
        out.append(_f32(x.logprobs_processed).tobytes())
    out.append(_i32(x.top_ids).reshape(-1).tobytes())
    out.append(_f32(x.top_logprobs).reshape(-1).tobytes())
    out.append(struct.pack("<I", len(x.spans)))
    for s, e, v in x.spans:
        out.append(struct.pack("<IIQ", int(s), int(e), int(v)))
    if x.flags & RESULT_ROUTES:
        a = _routes_array(x.routes, "routes")
        out.append(struct.pack("<IHBB", a.shape[0], a.shape[1], a.shape[2], a.dtype.itemsize))
        out.append(a.tobytes())
    if x.flags & RESULT_SERVE:
        out.append(struct.pack("<BBH", x.serve_dtype, x.serve_dtype_first, 0))
    if x.flags & RESULT_SCORES:
        lp = _f32(x.prompt_logprobs).reshape(-1)
        out.append(struct.pack("<III", x.score_from, 0, len(lp)))
        out.append(lp.tobytes())
        if x.top_k and len(lp):
            out.append(_i32(x.prompt_top_ids).reshape(-1).tobytes())
            out.append(_f32(x.prompt_top_logprobs).reshape(-1).tobytes())
    if hidden["lora"] is not None:
        out.append(struct.pack("<H", len(hidden["lora"])))
        out.append(hidden["lora"])
        out.append(struct.pack("<Q", x.lora_version))


def _tensor_check(t, what, version=VERSION):
    if t.flags & TENSOR_DELTA and version < 3:
        raise ValueError(f"{what}: DELTA is defined from protocol version 3; encoding {version}")
    if t.flags & TENSOR_DELTA and t.wire_bytes < 1:
        raise ValueError(f"{what}: a delta of wire_bytes {t.wire_bytes}; expected >= 1")
    return {"n_dims": len(t.shape)}


def _enc_tensor_tail(out, t, hidden):
    shape = [int(d) for d in t.shape]
    out.append(struct.pack(f"<{len(shape)}QQI", *shape, t.nbytes, t.crc32c))
    if t.flags & TENSOR_DELTA:
        out.append(struct.pack("<QQ", t.wire_bytes, t.base_version))


# element layout -> (checks before any byte is written, returning the hidden values; the tail writer)
_ENC_TAILS = {"REQUEST": (_request_check, _enc_request_tail), "RESULT": (_result_check, _enc_result_tail),
              "TENSOR": (_tensor_check, _enc_tensor_tail)}


def _enc_body(m, out, version):
    t = m.TYPE
    layout, elem, array = _table.MESSAGES[t.name]
    if elem is None:
        _enc_fields(out, _table.LAYOUTS[layout], m, {}, t.name, version)
        return
    items = raw_bytes(m.data, f"{t.name} data") if elem == "BYTES" else getattr(m, array)
    count = next(f[1] for f in _table.LAYOUTS[layout] if f[0] == "COUNT")
    _enc_fields(out, _table.LAYOUTS[layout], m, {count: len(items)}, t.name, version)
    if elem == "BYTES":
        out.append(items)
        return
    check, tail = _ENC_TAILS.get(elem, (lambda x, what, version: {}, None))
    for i, x in enumerate(items):
        what = f"{t.name} {array}[{i}]"
        hidden = check(x, what, version)
        _enc_fields(out, _table.LAYOUTS[elem], x, hidden, what, version)
        if tail:
            tail(out, x, hidden)


def encode(m, version=None):
    """One frame (bytes) for message m in protocol version `version` (None:
    m.wire_version, which decode sets, else VERSION_MIN). Raises ValueError for
    what decode would refuse in that version, struct.error for a field out of
    its integer range."""
    if getattr(m, "TYPE", None) not in CLASSES:
        raise ValueError(f"cannot encode {type(m).__name__}: not a protocol message")
    version = version or getattr(m, "wire_version", 0) or VERSION_MIN
    if not VERSION_MIN <= version <= VERSION:
        raise ValueError(f"{m.TYPE.name}: cannot encode in protocol version {version}; this codec speaks "
                         f"{VERSION_MIN} to {VERSION}")
    if m.TYPE == T.UPDATE_BEGIN and version < 3 and m.serve_dtype:
        raise ValueError(f"UPDATE_BEGIN: serve_dtype is {m.serve_dtype} in a protocol version {version} frame; it is "
                         "defined from version 3 and must be 0 before")
    out = []
    _enc_body(m, out, version)
    body = b"".join(out)
    if len(body) > 0xFFFFFFFF:
        raise ValueError(f"{m.TYPE.name}: body would be {len(body)} bytes; the format allows at most 2^32-1")
    return struct.pack("<4sHHII", MAGIC, version, m.TYPE, len(body), 0) + body


def encode_error(code, request_type, message, version=None):
    """An ERROR frame, as proto_encode_error builds it: the message cut to 4096
    bytes, each byte of a character cut at the limit replaced by '?'."""
    b = message.encode("utf-8", "replace")[:ERROR_MESSAGE_MAX]
    s = b.decode("utf-8", "ignore")
    s += "?" * (len(b) - len(s.encode("utf-8")))
    return encode(Error(code=code or E.INTERNAL, request_type=request_type, version_max=VERSION, message=s), version)


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
    if max_tokens == 0 and n_prompt >= lim.max_context:
        raise ProtoError(E.INVALID_PARAMS, f"the prompt has {n_prompt} tokens; expected at most {lim.max_context - 1} "
                         f"with max_tokens 0 (a scored prompt must leave one position of the context of "
                         f"{lim.max_context} tokens)")


def check_score_from(q, n_prompt):
    """A scored request's score_from against its prompt of n_prompt tokens (proto_check_score_from)."""
    if q.flags & REQ_SCORE and not 0 <= q.score_from <= n_prompt:
        raise ProtoError(E.INVALID_PARAMS, f"request {q.client_req_id}: score_from = {q.score_from}; expected "
                         f"0..{n_prompt} (a position of the prompt's {n_prompt} tokens)")


def check_request(q, lim):
    """Raises ProtoError(INVALID_PARAMS) when request q does not fit the
    daemon's limits and model (lim: its HelloOk); the same checks, in the same
    order, as proto_check_request in C."""
    rid = q.client_req_id

    def bad(msg):
        return ProtoError(E.INVALID_PARAMS, f"request {rid}: {msg}")

    version = lim.version if lim.version >= 2 else 1
    allowed = REQ_FLAGS & ~(REQ_FLAGS_V2 if version < 2 else 0) & ~(REQ_FLAGS_V4 if version < 4 else 0) & \
        ~(REQ_FLAGS_V5 if version < 5 else 0) & ~(REQ_FLAGS_V6 if version < 6 else 0)
    if q.flags & ~allowed:
        raise bad(f"flags {q.flags:#x} have undefined bits {q.flags & ~allowed:#x}; expected only bits "
                  f"{allowed:#x} (protocol version {version})")
    if q.flags & REQ_RETURN_ROUTES and not lim.features & FEATURE_ROUTES:
        raise bad(f"routed experts asked (return_routes), but the model ({lim.architecture}) is not a mixture of "
                  "experts; expected the flag only where HELLO_OK.features has ROUTES")
    lora = q.lora.encode("utf-8") if q.flags & REQ_LORA else b""
    if q.flags & REQ_LORA and not 1 <= len(lora) <= MAX_LORA_NAME:
        raise bad(f"flag LORA with an adapter name of {len(lora)} bytes; expected 1..{MAX_LORA_NAME} bytes")
    if b"\0" in lora:      # the daemon looks the name up as a C string: a NUL inside would name another adapter
        raise bad(f"the adapter name has a NUL byte at {lora.index(0)}; expected a name without one")
    if not 1 <= q.n <= lim.max_n:
        raise bad(f"n = {q.n}; expected 1..{lim.max_n}")
    score = bool(q.flags & REQ_SCORE)
    if not (0 if score else 1) <= q.max_tokens <= lim.max_tokens:
        hint = " (0 only for a request that scores its prompt: flag SCORE, protocol version 5)" if q.max_tokens == 0 \
            else ""
        raise bad(f"max_tokens = {q.max_tokens}; expected {0 if score else 1}..{lim.max_tokens}{hint}")
    if q.max_tokens == 0 and q.n != 1:
        raise bad(f"n = {q.n} with max_tokens = 0; expected n = 1 (a request that only scores its prompt has one "
                  "sample)")
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
    if q.flags & REQ_SAMPLING:
        _check_sampling(q, bad, lim)
    if score and q.score_from < 0:
        raise bad(f"score_from = {q.score_from}; expected 0..n_prompt (a position of the prompt)")
    worst = result_max_bytes(q.max_tokens, q.flags & REQ_PROCESSED_LOGPROBS, q.logprobs_topk) + RESULTS_OVERHEAD
    text = bool(q.flags & REQ_PROMPT_IS_TEXT)
    if score and not text:      # a text prompt's scores are the daemon's to count once it is tokenized
        n_prompt = len(q.prompt_ids)
        worst += scores_bytes(n_prompt - q.score_from if q.score_from <= n_prompt else 0, q.logprobs_topk)
    if q.flags & REQ_LORA:
        worst += lora_bytes(len(lora))
    if worst > lim.max_message_bytes:
        what = (" and its prompt's scores" if score else "") + (" and its adapter's name" if q.flags & REQ_LORA else "")
        raise bad(f"a result of max_tokens = {q.max_tokens}{what} with these log-prob options can take {worst} "
                  f"bytes; expected it to fit max_message_bytes = {lim.max_message_bytes}")
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
    check_score_from(q, len(ids))
    _check_ids("prompt_ids", rid, ids, lim.vocab_size)


def _check_sampling(q, bad, lim):
    """The sampling tail's ranges (check_sampling in proto.c), in its order."""
    r, f, p = float(q.repetition_penalty), float(q.frequency_penalty), float(q.presence_penalty)
    if not math.isfinite(r) or not r > 0:
        raise bad(f"repetition_penalty = {_g(r)}; expected a finite number > 0 (1 = off)")
    if not -2 <= f <= 2:
        raise bad(f"frequency_penalty = {_g(f)}; expected -2 <= frequency_penalty <= 2 (0 = off)")
    if not -2 <= p <= 2:
        raise bad(f"presence_penalty = {_g(p)}; expected -2 <= presence_penalty <= 2 (0 = off)")
    if q.min_tokens > q.max_tokens:
        raise bad(f"min_tokens = {q.min_tokens}; expected 0..max_tokens ({q.max_tokens})")
    ids = np.asarray(q.bias_ids, dtype=np.int64)
    vals = np.asarray(q.bias_vals, dtype=np.float32)
    if len(ids) > MAX_BIAS:
        raise bad(f"{len(ids)} logit_bias entries; expected at most {MAX_BIAS}")
    _check_ids("bias_ids", q.client_req_id, ids, lim.vocab_size)
    for i, v in enumerate(vals):
        if not -MAX_ABS_BIAS <= v <= MAX_ABS_BIAS:
            raise bad(f"bias_vals[{i}] = {_g(v)} (token {int(ids[i])}); expected -100 <= bias <= 100")
    dup = np.unique(ids, return_counts=True)
    twice = dup[0][dup[1] > 1]
    if len(twice):
        v = int(twice[0])            # the smallest repeated id, as proto.c reports it
        first, i = [int(k) for k in np.nonzero(ids == v)[0][:2]]
        raise bad(f"bias_ids[{i}] = {v} repeats bias_ids[{first}]; expected distinct token ids")


def _g(x):
    """A float as C's %g prints it."""
    x = float(x)
    if math.isnan(x):
        return "nan" if math.copysign(1, x) > 0 else "-nan"
    if math.isinf(x):
        return "inf" if x > 0 else "-inf"
    return "%g" % x


def _check_ids(what, rid, ids, vocab):
    badpos = np.nonzero((ids < 0) | (ids >= vocab))[0]
    if len(badpos):
        i = int(badpos[0])
        raise ProtoError(E.INVALID_PARAMS, f"request {rid}: {what}[{i}] = {int(ids[i])}; expected a token id in "
                         f"0..{vocab - 1} (vocab_size {vocab})")


# ---- the JSON form of a message (golden vectors, rollout-protodump) ----
# u64 fields are decimal strings (JSON numbers lose precision past 2^53);
# f32 values are numbers (the float's exact value) or "nan", "inf", "-inf";
# 32-byte fields and chunk data are lowercase hex, after the other fields;
# top_ids/top_logprobs are flat, row-major [n_tokens * top_k].


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


def _fields_json(obj, layout, d):
    """The layout's visible fields of obj into d, 32-byte fields last."""
    for kind, name, *_ in layout:
        if kind in _HIDDEN or kind == "BYTES32":
            continue
        v = getattr(obj, name)
        d[name] = str(int(v)) if kind == "U64" else _jf(v) if kind == "F32" else v
    for kind, name, *_ in layout:
        if kind == "BYTES32":
            d[name] = bytes(getattr(obj, name)).hex()
    return d


def _json_fields(obj, layout, d):
    """The inverse of _fields_json."""
    for kind, name, *_ in layout:
        if kind in _HIDDEN:
            continue
        v = d[name]
        setattr(obj, name, int(v) if kind == "U64" else _fj(v) if kind == "F32" else
                bytes.fromhex(v) if kind == "BYTES32" else v)
    return obj


def _request_json(q, r, version):
    r["stop_ids"] = _jil(q.stop_ids)
    r["prompt_ids"] = _jil(q.prompt_ids)
    r["prompt_text"] = q.prompt_text
    if _sampling_tail(q, version):      # version 4, flag REQ_SAMPLING: the tail as it is on the wire
        r["sampling"] = {"repetition_penalty": _jf(q.repetition_penalty), "frequency_penalty": _jf(q.frequency_penalty),
                         "presence_penalty": _jf(q.presence_penalty), "min_tokens": int(q.min_tokens),
                         "bias_ids": _jil(q.bias_ids), "bias_vals": _jfl(q.bias_vals)}
    if _score_tail(q, version):         # version 5, flag REQ_SCORE
        r["score_from"] = int(q.score_from)
    if _lora_tail(q, version):          # version 6, flag REQ_LORA
        r["lora"] = q.lora


def _json_request(r, q):
    q.stop_ids = np.array(r["stop_ids"], dtype="<i4")
    q.prompt_ids = np.array(r["prompt_ids"], dtype="<i4")
    q.prompt_text = r["prompt_text"]
    if "sampling" in r:
        t = r["sampling"]
        q.repetition_penalty, q.frequency_penalty, q.presence_penalty = (
            np.float32(_fj(t[k])) for k in ("repetition_penalty", "frequency_penalty", "presence_penalty"))
        q.min_tokens = t["min_tokens"]
        q.bias_ids = np.array(t["bias_ids"], dtype="<i4")
        q.bias_vals = np.array([_fj(v) for v in t["bias_vals"]], dtype="<f4")
    if "score_from" in r:
        q.score_from = r["score_from"]
    if "lora" in r:
        q.lora = r["lora"]


def _result_json(x, r, version):
    r["token_ids"] = _jil(x.token_ids)
    r["logprobs"] = _jfl(x.logprobs)
    r["logprobs_processed"] = None if x.logprobs_processed is None else _jfl(x.logprobs_processed)
    r["top_ids"] = _jil(x.top_ids)
    r["top_logprobs"] = _jfl(x.top_logprobs)
    r["spans"] = [{"start": int(s), "end": int(e), "version": str(int(v))} for s, e, v in x.spans]
    if x.flags & RESULT_ROUTES:
        a = np.asarray(x.routes)
        r["routes"] = {"layers": int(a.shape[1]), "k": int(a.shape[2]), "width": int(a.dtype.itemsize),
                       "ids": _jil(a)}
    if x.flags & RESULT_SERVE:
        r["serve_dtype"], r["serve_dtype_first"] = int(x.serve_dtype), int(x.serve_dtype_first)
    if x.flags & RESULT_SCORES:
        r["scores"] = {"score_from": int(x.score_from), "logprobs": _jfl(x.prompt_logprobs),
                       "top_ids": _jil(x.prompt_top_ids if x.prompt_top_ids is not None else []),
                       "top_logprobs": _jfl(x.prompt_top_logprobs if x.prompt_top_logprobs is not None else [])}
    if x.flags & RESULT_LORA:           # version 6
        r["lora"], r["lora_version"] = x.lora, str(int(x.lora_version))


def _json_result(r, x):
    n = len(r["token_ids"])
    x.token_ids = np.array(r["token_ids"], dtype="<i4")
    x.logprobs = np.array([_fj(v) for v in r["logprobs"]], dtype="<f4")
    if r["logprobs_processed"] is not None:
        x.logprobs_processed = np.array([_fj(v) for v in r["logprobs_processed"]], dtype="<f4")
    x.top_ids = np.array(r["top_ids"], dtype="<i4").reshape(n, x.top_k)
    x.top_logprobs = np.array([_fj(v) for v in r["top_logprobs"]], dtype="<f4").reshape(n, x.top_k)
    x.spans = [(s["start"], s["end"], int(s["version"])) for s in r["spans"]]
    if "routes" in r:
        t = r["routes"]
        x.routes = np.array(t["ids"], dtype=ROUTE_DTYPES[t["width"]]).reshape(-1, t["layers"], t["k"])
    if "serve_dtype" in r:
        x.serve_dtype, x.serve_dtype_first = r["serve_dtype"], r["serve_dtype_first"]
    if "scores" in r:
        t = r["scores"]
        x.score_from = t["score_from"]
        x.prompt_logprobs = np.array([_fj(v) for v in t["logprobs"]], dtype="<f4")
        ns = len(x.prompt_logprobs)
        x.prompt_top_ids = np.array(t["top_ids"], dtype="<i4").reshape(ns, x.top_k)
        x.prompt_top_logprobs = np.array([_fj(v) for v in t["top_logprobs"]], dtype="<f4").reshape(ns, x.top_k)
    if "lora" in r:
        x.lora, x.lora_version = r["lora"], int(r["lora_version"])


def _tensor_json(t, r, version):
    r["shape"] = [str(int(v)) for v in t.shape]
    r["nbytes"] = str(int(t.nbytes))
    r["crc32c"] = t.crc32c
    if t.flags & TENSOR_DELTA:
        r["wire_bytes"] = str(int(t.wire_bytes))
        r["base_version"] = str(int(t.base_version))


def _json_tensor(r, t):
    t.shape = [int(v) for v in r["shape"]]
    t.nbytes = int(r["nbytes"])
    t.crc32c = r["crc32c"]
    if t.flags & TENSOR_DELTA:
        t.wire_bytes = int(r["wire_bytes"])
        t.base_version = int(r["base_version"])


_JSON_TAILS = {"REQUEST": (_request_json, _json_request), "RESULT": (_result_json, _json_result),
               "TENSOR": (_tensor_json, _json_tensor)}


def to_json(m):
    """The message as a JSON-ready dict (the form vectors.json uses), as encode(m) writes it: in
    m.wire_version (a decoded message's frame version), else VERSION_MIN."""
    version = getattr(m, "wire_version", 0) or VERSION_MIN
    layout, elem, array = _table.MESSAGES[m.TYPE.name]
    d = _fields_json(m, _table.LAYOUTS[layout], {"type": m.TYPE.name})
    if elem == "BYTES":
        d[array] = bytes(raw_bytes(m.data)).hex()
    elif elem is not None:
        tail = _JSON_TAILS.get(elem, (None, None))[0]
        d[array] = []
        for x in getattr(m, array):
            r = _fields_json(x, _table.LAYOUTS[elem], {})
            if tail:
                tail(x, r, version)
            d[array].append(r)
    return d


def from_json(d):
    """The inverse of to_json."""
    t = T[d["type"]]
    layout, elem, array = _table.MESSAGES[t.name]
    m = _json_fields(CLASSES[t](), _table.LAYOUTS[layout], d)
    if elem == "BYTES":
        m.data = bytes.fromhex(d[array])
    elif elem is not None:
        tail = _JSON_TAILS.get(elem, (None, None))[1]
        for r in d[array]:
            x = _json_fields(_ELEM_CLASSES[elem](), _table.LAYOUTS[elem], r)
            if tail:
                tail(r, x)
            getattr(m, array).append(x)
    return m
