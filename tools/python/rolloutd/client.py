"""The Python client of rolloutd (proto/PROTOCOL.md), on pynng and numpy.

    from rolloutd import Client
    with Client("tcp://127.0.0.1:7070") as c:
        samples = c.generate([[1, 2, 3], [4, 5]], n=8, max_tokens=64, temperature=0.8, seed=1)
        for s in samples:          # sorted by (index, sample_idx)
            s.index, s.sample_idx, s.token_ids, s.logprobs, s.finish_reason, s.version_finish

Prompts are token-id lists (the learner owns tokenisation) or strings (the
daemon tokenizes them; chat=True wraps each as one user turn in the model's
chat template). `stream(...)` yields samples as they finish; `status()` is the
/status document; `abort()`; `close()` says BYE.

Routing replay (a mixture-of-experts model, protocol version 2):
generate(..., return_routes=True) gives each Sample .routes, an int32 array
[n_prompt + n_tokens - 1, layers, k] of the experts every position was routed
to (prompt then generated; highest weight first); return_routes="compact"
gives prime-rl's form instead, {"data": base64, "shape", "start": 0,
"dtype": "uint8" (up to 256 experts) | "uint16" | "int32"}, which
Sample.routes_compact() also builds from an array result.

vLLM's penalties (protocol version 4): generate(..., repetition_penalty=1.1,
frequency_penalty=0.5, presence_penalty=0.5, min_tokens=4,
logit_bias={token_id: bias}) sends them in the request's sampling tail, only
when one differs from its default, so a default request still works with an
older daemon; a non-default one raises ValueError there.

Prompt scoring (protocol version 5): score(prompts, start=0, top_logprobs=0)
gives each prompt's raw log-probs from position start on (None at position 0,
which has nothing before it), computed as a draw of that token from the same
logits would be: scoring prompt + completion from the completion's first
position returns the float32 bits the completion was sampled with;
compute_logprobs(prompts) is tinker's form (one list per prompt, as long as
the prompt, its first entry None). generate(..., prompt_logprobs_from=k)
scores the prompt and generates in one request (Sample.prompt_logprobs).

LoRA adapters (protocol version 6): generate(..., lora="name") runs the
samples under the adapter the daemon loaded as "name" (POST
/v1/load_lora_adapter; a list gives one name or None per prompt, None the
base model); each such Sample says .lora and .lora_version, the adapter and
its version its tokens were drawn under. A name the daemon has not loaded is
refused (DaemonError INVALID_PARAMS naming it).

Transport (PROTOCOL.md §1): one req0 socket with NNG's request resends off,
the receive size limit set to the daemon's max_message_bytes, and a receive
timeout of wait_ms + 10 s for FETCH (30 s otherwise); a timed-out exchange is
repeated, which the protocol makes safe. Each finished sample has a per-client
seq; the client skips seqs it has processed and acks the highest in its next
FETCH, so a resumed client (Client(url, client_id=...)) gets exactly the
results it had not processed. A Client is used by one thread at a time.

Weight updates (PROTOCOL.md §10):

    res = c.push_weights({"model.norm.weight": w, ...}, version=1)   # HF names -> arrays
    res.version, res.stall_us, res.mb_per_s

numpy float32 -> f32, float16 -> f16, uint16 -> raw bf16 bits (see
bf16_bits()), torch tensors when torch is installed (bfloat16 included). The
bytes are checksummed once (prepare_update(); a PreparedUpdate can be pushed
again, or to many daemons: rolloutd.Pool), sent over the daemon's data lane
when it offers one (else as UPDATE_CHUNKs over NNG, `window` req contexts at
once), then committed. Any failure aborts the transfer (the old weights keep
serving) and raises DaemonError (.code from proto.E) or TimeoutError_.
"""
import base64
import hashlib
import hmac
import json
import os
import socket
import struct
import sys
import threading
import time
from dataclasses import asdict, dataclass, field
from typing import Iterator, List, Optional, Sequence, Tuple, Union

import numpy as np
import pynng

from . import proto as P
from .crc32c import crc32c, crc32c_combine

DEFAULT_URL = "tcp://127.0.0.1:7070"
TIMEOUT_MS = 30000          # reply timeout of every request but FETCH
FETCH_MARGIN_MS = 10000     # FETCH waits wait_ms plus this
FETCH_WAIT_MS = 1000        # long-poll
RETRIES = 5                 # consecutive timeouts before giving up
CLOSE_TIMEOUT_MS = 2000     # close(): the ack and BYE wait at most this per try
SP_HEADER_MARGIN = 64       # NNG counts the req0 header in the message size
CHUNK_ROOM = 64             # a chunk's data is at most max_message_bytes - 64 (PROTOCOL.md §10.2)
MIN_CHUNK = 4096            # only a tensor's last chunk may be shorter (§10.4)
BEGIN_TIMEOUT_MS = 60000
CHUNK_TIMEOUT_MS = 60000    # one chunk's reply (NNG) or any reply while chunks are unanswered (lane)
COMMIT_TIMEOUT_MS = 600000  # drain mode waits for running sequences to finish
MAX_RESENDS = 100           # per chunk over NNG, after CHECKSUM refusals or lost replies (BUSY: until the timeout)
LANE_PASSES = 8             # data lane: passes over the chunks not acknowledged yet


class DaemonError(Exception):
    """The daemon refused a request: code is the PROTOCOL.md §9 error code."""

    def __init__(self, code, message, request=None):
        name = P.E(code).name if code in P.E._value2member_map_ else str(code)
        where = f" ({request})" if request else ""
        super().__init__(f"{name} ({code}){where}: {message}")
        self.code = int(code)
        self.name = name
        self.message = message


class TimeoutError_(Exception):
    """No reply in time (repeated RETRIES times)."""


@dataclass
class Sample:
    """One finished rollout sample."""
    index: int                       # the prompt's index in the generate()/stream() call
    sample_idx: int                  # 0..n-1
    token_ids: np.ndarray            # int32 [n_tokens] (a stop token is included)
    logprobs: np.ndarray             # float32 [n_tokens]: raw log-prob (temperature 1)
    finish_reason: str               # "stop", "length", "abort", "error"
    client_req_id: int = 0
    seq: int = 0                     # per-client sequence number
    seed: int = 0                    # the seed sampling used
    n_prompt: int = 0                # prompt tokens (after the daemon tokenized a text prompt)
    version_admit: int = 0           # policy version at admission
    version_finish: int = 0          # policy version at finish
    spans: List[Tuple[int, int, int]] = field(default_factory=list)  # (start, end, version)
    logprobs_processed: Optional[np.ndarray] = None  # float32, with processed_logprobs=True
    top_ids: Optional[np.ndarray] = None             # int32 [n_tokens, k] with logprobs=k
    top_logprobs: Optional[np.ndarray] = None        # float32 [n_tokens, k]
    n_preempt: int = 0
    queued_us: int = 0
    first_token_us: int = 0
    total_us: int = 0
    # with return_routes: int32 [n_prompt + n_tokens - 1, layers, k] (fewer positions for a sample aborted
    # early), or prime-rl's compact dict with return_routes="compact"
    routes: Optional[Union[np.ndarray, dict]] = None
    routes_wire: Optional[np.ndarray] = field(default=None, repr=False)  # the ids as sent: uint8/uint16/int32
    # which policy produced the tokens (protocol version 3): "as_pushed", "q8_0", "q4_k" or "fp8" (the daemon's serve_dtype for
    # version_finish; "unknown" for a version too old for the daemon's history), None from an older daemon
    serve_dtype: Optional[str] = None
    serve_dtype_first: Optional[str] = None          # the same for the first span's version
    # with prompt_logprobs_from=k (protocol version 5): float32 [n_prompt - k], the raw log-prob of prompt tokens
    # k.. given the ones before (NaN at position 0); None when not asked or when the daemon holds none (a sample
    # that failed before it ran). With logprobs=j, prompt_top_ids / prompt_top_logprobs [n_prompt - k, j].
    prompt_logprobs_from: int = 0
    prompt_logprobs: Optional[np.ndarray] = None
    prompt_top_ids: Optional[np.ndarray] = None
    prompt_top_logprobs: Optional[np.ndarray] = None
    # with lora=name (protocol version 6): the adapter the tokens were drawn under and its version (1 for the
    # name's first load, +1 per reload; 0 when not known: the sample failed before it ran); None on the base model
    lora: Optional[str] = None
    lora_version: int = 0

    @property
    def version(self):
        return self.version_finish

    def routes_compact(self, start=0):
        """prime-rl's form of the routes: {"data": base64 of the ids in the wire's dtype (uint8 up to 256
        experts, uint16 up to 65536, else int32), "shape": [positions, layers, k], "start": start, "dtype"};
        None when the sample has no routes."""
        if self.routes_wire is None:
            return None
        a = np.ascontiguousarray(self.routes_wire, dtype=self.routes_wire.dtype.newbyteorder("<"))
        return {"data": base64.b64encode(a.tobytes()).decode("ascii"), "shape": list(a.shape), "start": int(start),
                "dtype": P.ROUTE_DTYPE_NAMES[a.dtype.itemsize]}


def _sample(r, index, routes_format=None):
    k = r.top_k
    wire = np.array(r.routes) if r.flags & P.RESULT_ROUTES else None
    s = Sample(index=index, sample_idx=r.sample_idx, token_ids=np.array(r.token_ids, dtype=np.int32),
                  logprobs=np.array(r.logprobs, dtype=np.float32), finish_reason=P.FINISH_NAMES[r.finish],
                  client_req_id=r.client_req_id, seq=r.seq, seed=r.seed, n_prompt=r.n_prompt,
                  version_admit=r.version_admit, version_finish=r.version_finish, spans=list(r.spans),
                  logprobs_processed=None if r.logprobs_processed is None else np.array(r.logprobs_processed,
                                                                                        dtype=np.float32),
                  top_ids=np.array(r.top_ids, dtype=np.int32) if k else None,
                  top_logprobs=np.array(r.top_logprobs, dtype=np.float32) if k else None,
                  n_preempt=r.n_preempt, queued_us=r.queued_us, first_token_us=r.first_token_us, total_us=r.total_us,
                  routes_wire=wire)
    if r.flags & P.RESULT_SERVE:
        s.serve_dtype, s.serve_dtype_first = P.SERVE_NAMES[r.serve_dtype], P.SERVE_NAMES[r.serve_dtype_first]
    if r.flags & P.RESULT_SCORES:
        s.prompt_logprobs_from = r.score_from
        if len(r.prompt_logprobs) or r.score_from == r.n_prompt:
            s.prompt_logprobs = np.array(r.prompt_logprobs, dtype=np.float32)
            if k:
                s.prompt_top_ids = np.array(r.prompt_top_ids, dtype=np.int32)
                s.prompt_top_logprobs = np.array(r.prompt_top_logprobs, dtype=np.float32)
    if r.flags & P.RESULT_LORA:
        s.lora, s.lora_version = r.lora, r.lora_version
    if wire is not None:
        s.routes = s.routes_compact() if routes_format == "compact" else wire.astype(np.int32)
    return s


def _sampling_tail(repetition_penalty, frequency_penalty, presence_penalty, min_tokens, logit_bias):
    """The sampling tail's values when any differs from its default (else None), with "set" naming
    those that do; logit_bias {token id (int or its decimal string, as OpenAI's JSON keys): bias} becomes
    bias_ids / bias_vals in the dict's order."""
    ids, vals = [], []
    for k, v in (logit_bias or {}).items():
        try:
            ids.append(int(k))
        except (TypeError, ValueError):
            raise TypeError(f"logit_bias keys are token ids; got {k!r}") from None
        vals.append(float(v))
    t = {"repetition_penalty": float(repetition_penalty), "frequency_penalty": float(frequency_penalty),
         "presence_penalty": float(presence_penalty), "min_tokens": int(min_tokens),
         "bias_ids": np.array(ids, dtype=np.int32), "bias_vals": np.array(vals, dtype=np.float32)}
    if t["min_tokens"] < 0:
        raise ValueError(f"min_tokens = {t['min_tokens']}; expected 0..max_tokens")
    defaults = {"repetition_penalty": 1.0, "frequency_penalty": 0.0, "presence_penalty": 0.0, "min_tokens": 0}
    t["set"] = [k for k, d in defaults.items() if not t[k] == d] + (["logit_bias"] if ids else [])
    return t if t["set"] else None


def _routes_format(return_routes):
    """None (not asked), "array" or "compact" from a return_routes argument."""
    if return_routes in (None, False):
        return None
    if return_routes is True or return_routes == "array":
        return "array"
    if return_routes == "compact":
        return "compact"
    raise ValueError(f"return_routes={return_routes!r}; expected False, True / \"array\" or \"compact\"")


class Stream:
    """Iterator over the samples of one stream() call, in completion order.
    req_ids[i] is the client_req_id of prompt i; abort() aborts them all (the
    aborted samples still arrive, with finish_reason "abort")."""

    def __init__(self, client, reqs, routes_format=None):
        self._c = client
        self._reqs = reqs
        self._routes_format = routes_format
        self.req_ids = [q.client_req_id for q in reqs]
        self._base = self.req_ids[0] if reqs else 0
        self._left = [q.n for q in reqs]
        self._total = sum(self._left)
        self._got = 0
        self._next = 0          # first request not accepted yet
        self._pending = []      # samples fetched, not yet yielded
        if reqs:
            self._submit_some()     # the first piece now: refusals raise here, abort() works at once

    def __iter__(self):
        return self

    def _submit_some(self):
        c = self._c
        per = c.info.max_requests_per_submit or 64
        limit = c.info.max_message_bytes
        k, size = 0, P.HEADER_BYTES + 12
        while self._next + k < len(self._reqs) and k < per:
            q = self._reqs[self._next + k]
            b = 56 + 4 * len(q.stop_ids) + 4 * len(q.prompt_ids) + len(q.prompt_text.encode())
            if q.flags & P.REQ_SAMPLING:
                b += P.SAMPLING_TAIL_BYTES + P.BIAS_PAIR_BYTES * len(q.bias_ids)
            if q.flags & P.REQ_SCORE:
                b += P.SCORE_TAIL_BYTES
            if q.flags & P.REQ_LORA:
                b += P.LORA_TAIL_BYTES + len(q.lora.encode())
            if k and size + b > limit:
                break
            size += b
            k += 1
        items = c.submit(self._reqs[self._next:self._next + k])
        accepted = 0
        for i, it in enumerate(items):
            if it.status == 0:
                accepted = i + 1
            elif it.status != P.E.BUSY:
                # Abort what was accepted (its partial results still come to this client), then fail.
                live = [j for j in range(self._next) if self._left[j] > 0]
                live += [self._next + j for j, x in enumerate(items) if x.status == 0]
                for j in live:
                    try:
                        c.abort(self.req_ids[j])
                    except DaemonError:
                        pass
                raise DaemonError(it.status, it.message, f"prompt {self._next + i}")
        self._next += accepted

    def __next__(self):
        while not self._pending:
            if self._next < len(self._reqs):
                self._submit_some()
            if self._got >= self._total:
                raise StopIteration
            for r in self._c.fetch():
                i = r.client_req_id - self._base
                if not (0 <= i < len(self._reqs)) or self._left[i] == 0:
                    continue        # another call's request: acked and dropped
                self._left[i] -= 1
                self._got += 1
                self._pending.append(_sample(r, i, self._routes_format))
        return self._pending.pop(0)

    def abort(self):
        """Aborts every request of this stream that is not finished."""
        n = 0
        for i, rid in enumerate(self.req_ids[:self._next]):
            if self._left[i] > 0:
                n += self._c.abort(rid)[1]
        return n


def auth_secret(auth_token=None, auth_token_file=None):
    """The shared secret (PROTOCOL.md §14) as bytes: auth_token, else the first
    line of auth_token_file, else $ROLLOUTD_AUTH_TOKEN, else the file named by
    $ROLLOUTD_AUTH_TOKEN_FILE; None when none is given."""
    if auth_token is None and auth_token_file is None:
        auth_token = os.environ.get("ROLLOUTD_AUTH_TOKEN")
        auth_token_file = os.environ.get("ROLLOUTD_AUTH_TOKEN_FILE") if auth_token is None else None
    if auth_token is not None:
        return auth_token.encode() if isinstance(auth_token, str) else bytes(auth_token)
    if auth_token_file:
        with open(auth_token_file, "rb") as f:
            return f.read().strip(b" \t\r\n")
    return None


def auth_proof(secret, daemon_side, client_nonce, daemon_nonce):
    """HMAC-SHA256 proof of PROTOCOL.md §14 (proto/auth.h)."""
    if daemon_side:
        data = b"rolloutd auth v1 daemon" + client_nonce + daemon_nonce
    else:
        data = b"rolloutd auth v1 client" + daemon_nonce + client_nonce
    return hmac.new(secret, data, hashlib.sha256).digest()


def lane_key(secret, xfer_id):
    """The data lane key of one transfer (PROTOCOL.md §10.12, proto/auth.h)."""
    return hmac.new(secret, b"rolloutd lane key v1" + struct.pack("<Q", xfer_id), hashlib.sha256).digest()


def lane_proof(key, nonce, xfer_id):
    return hmac.new(key, b"rolloutd lane v1" + bytes(nonce) + struct.pack("<Q", xfer_id), hashlib.sha256).digest()


def wrap_pad(secret, xfer_id, next_xfer_id):
    """What a relaying daemon XORs with UPDATE_FORWARD.key to read the next lane key."""
    return hmac.new(secret, b"rolloutd key wrap v1" + struct.pack("<QQ", xfer_id, next_xfer_id),
                    hashlib.sha256).digest()


def lane_authenticate(sock, secret, xfer_id, url=""):
    """Answers a data lane's AUTH_CHALLENGE with the LANE_AUTH of xfer_id."""
    head = _recv_exact(sock, P.HEADER_BYTES + P.AUTH_BYTES)
    if not head:
        raise ConnectionError(f"{url}: data lane: closed before its challenge")
    m = P.decode(head, 0)
    if isinstance(m, P.Error):
        raise DaemonError(m.code, m.message, "LANE_AUTH")
    if not isinstance(m, P.AuthChallenge):
        raise P.ProtoError(P.E.UNEXPECTED, f"{url}: data lane: expected AUTH_CHALLENGE, got {m.TYPE.name}")
    sock.sendall(P.encode(P.LaneAuth(xfer_id=xfer_id, proof=lane_proof(lane_key(secret, xfer_id), m.bytes,
                                                                         xfer_id))))


def tls_client_config(url, tls_ca_file=None):
    """For a tls+tcp:// URL: a pynng client TLSConfig that verifies the daemon
    against tls_ca_file (else $ROLLOUTD_TLS_CA_FILE) and the URL's host; None
    for other URLs."""
    if not url.startswith("tls+tcp"):
        return None
    ca = tls_ca_file or os.environ.get("ROLLOUTD_TLS_CA_FILE")
    if not ca:
        raise ValueError(f"{url}: TLS needs the CA file that signed the daemon's certificate "
                         "(tls_ca_file= or ROLLOUTD_TLS_CA_FILE)")
    hostport = url.split("://", 1)[1]
    host = hostport[1:hostport.index("]")] if hostport.startswith("[") else hostport.rsplit(":", 1)[0]
    return pynng.TLSConfig(pynng.TLSConfig.MODE_CLIENT, server_name=host, ca_files=[ca],
                           auth_mode=pynng.TLSConfig.AUTH_MODE_REQUIRED)


class Client:
    def __init__(self, url=DEFAULT_URL, client_id=0, name="rolloutd-python", timeout_ms=TIMEOUT_MS,
                 auth_token=None, auth_token_file=None, tls_ca_file=None, max_version=P.VERSION):
        self.url = url
        if not P.VERSION_MIN <= max_version <= P.VERSION:
            raise ValueError(f"max_version = {max_version}; this client speaks protocol versions {P.VERSION_MIN} to "
                             f"{P.VERSION}")
        self.max_version = max_version   # the highest protocol version HELLO offers (a lower one pins the client)
        self._secret = auth_secret(auth_token, auth_token_file)
        self.timeout_ms = timeout_ms
        self.client_id = 0
        self.info = None             # proto.HelloOk
        self.version = P.VERSION_MIN # the protocol version HELLO chose (frames after it are sent in it)
        self.last_seq = 0            # highest seq processed; acked by the next FETCH
        self.next_req_id = 1
        self.name = name
        self._open = 0               # samples SUBMIT accepted whose results have not come back yet
        self._lock = threading.Lock()
        self._max = P.DEFAULT_MAX_MESSAGE
        self._sock = pynng.Req0(resend_time=-1, recv_max_size=P.DEFAULT_MAX_MESSAGE + SP_HEADER_MARGIN)
        tls = tls_client_config(url, tls_ca_file)
        if tls is not None:
            self._sock.tls_config = tls
        try:
            self._sock.dial(url, block=True)
        except pynng.NNGException as e:
            self._sock.close()
            raise ConnectionError(f"cannot connect to {url}: {e} (is rolloutd running there?)") from None
        if self._secret is not None:
            self.authenticate()
        self.hello(client_id, name)

    # ---- one exchange ----

    def authenticate(self):
        """AUTH_BEGIN + AUTH on the current connection; checks the daemon's
        proof. Raises DaemonError UNAUTHORIZED for a wrong secret."""
        if self._secret is None:
            raise ValueError("no shared secret: pass auth_token or auth_token_file")
        cn = os.urandom(P.AUTH_BYTES)
        ch = self._call(P.AuthBegin(bytes=cn), P.T.AUTH_CHALLENGE, reauth=False)
        ok = self._call(P.Auth(bytes=auth_proof(self._secret, False, cn, ch.bytes)), P.T.AUTH_OK, reauth=False)
        if not hmac.compare_digest(ok.bytes, auth_proof(self._secret, True, cn, ch.bytes)):
            raise DaemonError(P.E.UNAUTHORIZED, f"{self.url} answered AUTH with a proof of another secret", "AUTH")

    def _call(self, msg, want, timeout_ms=None, retries=RETRIES, reauth=True):
        # HELLO and AUTH_* in version 1 (every daemon reads them); the rest in the version HELLO chose
        v = P.VERSION_MIN if msg.TYPE in (P.T.HELLO, *P.AUTH_TYPES) else self.version
        frame = P.encode(msg, v)
        if len(frame) > self._max:
            raise ValueError(f"{msg.TYPE.name} is {len(frame)} bytes; the daemon accepts at most {self._max}")
        with self._lock:
            for attempt in range(retries):
                # a send waits for a connection: bounded too, so a dead daemon is a timeout, not a hang
                self._sock.recv_timeout = self._sock.send_timeout = timeout_ms or self.timeout_ms
                try:
                    self._sock.send(frame)
                    buf = self._sock.recv()
                    break
                except pynng.Timeout:
                    continue        # every request is safe to repeat (PROTOCOL.md §8)
            else:
                raise TimeoutError_(f"{msg.TYPE.name}: no reply from {self.url} after {retries} tries")
        reply = P.decode(buf, self._max)
        if isinstance(reply, P.Error) and reply.code == P.E.UNAUTHORIZED and reauth and self._secret is not None:
            # a new connection (NNG redialed): prove the secret on it and repeat (PROTOCOL.md §8)
            self.authenticate()
            return self._call(msg, want, timeout_ms, retries, reauth=False)
        if isinstance(reply, P.Error):
            raise DaemonError(reply.code, reply.message, msg.TYPE.name)
        if reply.TYPE != want:
            raise P.ProtoError(P.E.UNEXPECTED, f"the daemon answered {msg.TYPE.name} with {reply.TYPE.name}; "
                               f"expected {want.name}")
        return reply

    # ---- protocol operations ----

    def hello(self, client_id=0, name="rolloutd-python"):
        """HELLO: a new client (0) or resume client_id, offering protocol
        versions P.VERSION_MIN..max_version (1..6 unless the Client was made with a lower max_version; the daemon
        picks the highest it speaks). Returns the HelloOk."""
        ok = self._call(P.Hello(client_id=client_id, min_version=P.VERSION_MIN, max_version=self.max_version,
                                client_name=name), P.T.HELLO_OK)
        self.version = ok.version if P.VERSION_MIN <= ok.version <= self.max_version else P.VERSION_MIN
        if ok.client_id != client_id:
            self.last_seq = 0
            self.next_req_id = 1
        self.client_id = ok.client_id
        self.info = ok
        if ok.max_message_bytes >= P.HEADER_BYTES:
            self._max = ok.max_message_bytes
            if ok.max_message_bytes > P.DEFAULT_MAX_MESSAGE:
                self._sock.recv_max_size = ok.max_message_bytes + SP_HEADER_MARGIN
        return ok

    def resume(self):
        """HELLO with this client's id again (after a reconnect)."""
        return self.hello(self.client_id)

    def submit(self, requests: Sequence[P.Request]) -> List[P.SubmitItem]:
        """SUBMIT. A client silent for longer than the daemon's client_ttl_s (a long training step
        between rounds) has been forgotten: when nothing of it was left at the daemon (every
        accepted sample's result came back), nothing is lost, so it registers again (HELLO 0, a new
        client_id) and submits as that client; otherwise the UNKNOWN_CLIENT error says how many
        samples were dropped with it."""
        msg = P.Submit(client_id=self.client_id, requests=list(requests))
        try:
            ok = self._call(msg, P.T.SUBMIT_OK)
        except DaemonError as e:
            if e.code != P.E.UNKNOWN_CLIENT or not self.client_id:
                raise
            if self._open:
                ttl = self.info.client_ttl_s if self.info else "?"
                raise DaemonError(e.code, f"{e.message} (the daemon forgot this client after client_ttl_s = "
                                  f"{ttl} s of silence, and {self._open} submitted samples with it)", "SUBMIT") from None
            rid = self.next_req_id
            self.hello(0, self.name)
            self.next_req_id = rid      # ids already handed out stay unique within this Client
            msg.client_id = self.client_id
            ok = self._call(msg, P.T.SUBMIT_OK)
        for q, it in zip(msg.requests, ok.items):
            if it.status == 0:
                self._open += q.n
        return ok.items

    def fetch(self, max_results=256, wait_ms=FETCH_WAIT_MS) -> List[P.Result]:
        """FETCH acking last_seq; returns the results not processed before
        (last_seq moves past them: the caller processes them now)."""
        res = self._call(P.Fetch(client_id=self.client_id, ack_seq=self.last_seq, max_results=max_results,
                                 wait_ms=wait_ms), P.T.RESULTS, wait_ms + FETCH_MARGIN_MS)
        self.pending_results = res.pending_results
        self.inflight_samples = res.inflight_samples
        new = [r for r in res.results if r.seq > self.last_seq]
        self._open = max(0, self._open - len(new))
        if new:
            self.last_seq = new[-1].seq
        return new

    def ack(self):
        """Acknowledges every processed result now (FETCH with max_results 0)."""
        self._call(P.Fetch(client_id=self.client_id, ack_seq=self.last_seq), P.T.RESULTS)

    def abort(self, client_req_id=None):
        """Aborts one request, or all of this client's (None). Returns
        (requests, samples) aborted; the samples arrive with finish "abort"."""
        if client_req_id is None:
            ok = self._call(P.Abort(client_id=self.client_id, flags=P.ABORT_ALL), P.T.ABORT_OK)
        else:
            ok = self._call(P.Abort(client_id=self.client_id, client_req_id=client_req_id), P.T.ABORT_OK)
        return ok.n_requests, ok.n_samples

    def status(self) -> dict:
        return json.loads(self._call(P.Status(), P.T.STATUS_OK).json)

    def bye(self, discard=False):
        ok = self._call(P.Bye(client_id=self.client_id, flags=P.BYE_DISCARD if discard else 0), P.T.BYE_OK)
        return ok.pending_results, ok.inflight_samples

    def close(self, bye=True):
        """Acks what was processed, says BYE (unless bye=False) and closes the socket."""
        if self._sock is None:
            return
        try:
            if bye and self.client_id:     # one short try each: a dead daemon must not hold up close
                self._call(P.Fetch(client_id=self.client_id, ack_seq=self.last_seq), P.T.RESULTS, CLOSE_TIMEOUT_MS,
                           retries=1)
                self._call(P.Bye(client_id=self.client_id), P.T.BYE_OK, CLOSE_TIMEOUT_MS, retries=1)
        except (DaemonError, TimeoutError_, pynng.NNGException):
            pass
        finally:
            self._sock.close()
            self._sock = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # ---- rollouts ----

    def requests(self, prompts, n=1, max_tokens=16, temperature=1.0, top_p=1.0, top_k=0, min_p=0.0,
                 seed=None, stop=None, logprobs=0, processed_logprobs=False, ignore_eos=False, chat=False,
                 return_routes=False, repetition_penalty=1.0, frequency_penalty=0.0, presence_penalty=0.0,
                 min_tokens=0, logit_bias=None, prompt_logprobs_from=None, lora=None):
        """The protocol requests for prompts (fresh client_req_ids). seed: None
        (the daemon picks one per request, reported in each sample), an int
        (used for every prompt; the n samples of a prompt still differ) or a
        list with one seed per prompt. stop: extra stop token ids.
        return_routes: ask for the routed experts (True, "array" or "compact";
        a mixture-of-experts model and protocol version 2).
        repetition_penalty (> 0, 1 = off; prompt and output tokens), frequency_penalty and
        presence_penalty ([-2, 2], 0 = off; output counts), min_tokens (EOS and stop ids masked until
        this many tokens are generated) and logit_bias ({token id: bias in [-100, 100]}, at most 1024)
        are vLLM's; they go in the request's sampling tail (protocol version 4), sent only when one
        differs from its default. prompt_logprobs_from: None, or the first prompt position to score (an
        int, or a list with one per prompt; protocol version 5): each sample then carries the prompt's
        raw log-probs from there on (Sample.prompt_logprobs) and, with logprobs=k, their k alternatives;
        max_tokens may then be 0 (score only, n = 1). lora: None (the base model), the name of a LoRA adapter the
        daemon has loaded (1..127 bytes of UTF-8), or a list with one name or None per prompt (protocol version
        6): the samples run under it and say so (Sample.lora, Sample.lora_version)."""
        if _routes_format(return_routes) and self.version < 2:
            raise ValueError(f"{self.url} speaks protocol version {self.version}: it cannot return routed experts")
        tail = _sampling_tail(repetition_penalty, frequency_penalty, presence_penalty, min_tokens, logit_bias)
        if tail and self.version < 4:
            raise ValueError(f"{self.url} speaks protocol version {self.version}: it cannot take "
                             f"{', '.join(tail['set'])} (the sampling tail needs version 4; a newer rolloutd)")
        if prompt_logprobs_from is not None and self.version < 5:
            raise ValueError(f"{self.url} speaks protocol version {self.version}: it cannot score prompts "
                             "(prompt_logprobs_from needs version 5; a newer rolloutd)")
        loras = list(lora) if isinstance(lora, (list, tuple)) else [lora] * len(prompts)
        if len(loras) != len(prompts):
            raise ValueError(f"lora has {len(loras)} entries for {len(prompts)} prompts")
        for x in loras:
            if x is not None and not isinstance(x, str):
                raise TypeError(f"lora takes an adapter's name (a str) or None; got {type(x).__name__}")
        if any(loras) and self.version < 6:
            raise ValueError(f"{self.url} speaks protocol version {self.version}: it cannot run a LoRA adapter "
                             "(lora needs version 6; a newer rolloutd)")
        if isinstance(prompts, (str, bytes)) or (len(prompts) and np.isscalar(prompts[0]) and
                                                 not isinstance(prompts[0], str)):
            raise TypeError("prompts is a list of prompts: each a list of token ids or a string")
        stop_ids = np.array([] if stop is None else list(stop))
        if stop_ids.size and not np.issubdtype(stop_ids.dtype, np.integer):
            raise TypeError("stop takes token ids (the daemon matches ids, not strings)")
        seeds = seed if isinstance(seed, (list, tuple, np.ndarray)) else [seed] * len(prompts)
        if len(seeds) != len(prompts):
            raise ValueError(f"seed has {len(seeds)} entries for {len(prompts)} prompts")
        starts = prompt_logprobs_from if isinstance(prompt_logprobs_from, (list, tuple, np.ndarray)) else \
            [prompt_logprobs_from] * len(prompts)
        if len(starts) != len(prompts):
            raise ValueError(f"prompt_logprobs_from has {len(starts)} entries for {len(prompts)} prompts")
        reqs = []
        for p, s, start, adapter in zip(prompts, seeds, starts, loras):
            flags = (P.REQ_PROCESSED_LOGPROBS if processed_logprobs else 0) | (P.REQ_IGNORE_EOS if ignore_eos else 0) | \
                (P.REQ_RETURN_ROUTES if _routes_format(return_routes) else 0)
            if s is not None:
                flags |= P.REQ_HAS_SEED
            q = P.Request(client_req_id=self.next_req_id, n=n, max_tokens=max_tokens, temperature=temperature,
                          top_p=top_p, top_k=top_k, min_p=min_p, seed=0 if s is None else int(s),
                          logprobs_topk=logprobs, stop_ids=stop_ids.astype(np.int32))
            if tail:
                flags |= P.REQ_SAMPLING
                q.repetition_penalty, q.frequency_penalty = tail["repetition_penalty"], tail["frequency_penalty"]
                q.presence_penalty, q.min_tokens = tail["presence_penalty"], tail["min_tokens"]
                q.bias_ids, q.bias_vals = tail["bias_ids"], tail["bias_vals"]
            if start is not None:
                flags |= P.REQ_SCORE
                q.score_from = int(start)   # checked by the daemon against the (tokenized) prompt
            if adapter:                     # None or "": the base model, no tail (the bytes of any version)
                flags |= P.REQ_LORA
                q.lora = adapter            # its length is the codec's to check, its residence the daemon's
            self.next_req_id += 1
            if isinstance(p, str):
                q.flags = flags | P.REQ_PROMPT_IS_TEXT | (P.REQ_CHAT_TEMPLATE if chat else 0)
                q.prompt_text = p
            else:
                if chat:
                    raise ValueError("chat=True needs text prompts (the daemon applies the template to text)")
                q.flags = flags
                q.prompt_ids = np.asarray(p, dtype=np.int32)
            reqs.append(q)
        return reqs

    def stream(self, prompts, **params) -> Stream:
        """Submits the prompts and returns an iterator over their samples as
        they finish (Sample objects; .index is the prompt's position). Same
        parameters as generate()."""
        return Stream(self, self.requests(prompts, **params), _routes_format(params.get("return_routes")))

    def generate(self, prompts, **params) -> List[Sample]:
        """Runs the prompts to completion and returns every sample, sorted by
        (index, sample_idx). Parameters: n, max_tokens, temperature, top_p,
        top_k, min_p, seed, stop, logprobs (top-k alternatives per token),
        processed_logprobs, ignore_eos, chat, return_routes, repetition_penalty,
        frequency_penalty, presence_penalty, min_tokens, logit_bias, prompt_logprobs_from, lora (see requests()).
        An invalid request raises DaemonError (code INVALID_PARAMS) naming the prompt."""
        out = list(self.stream(prompts, **params))
        out.sort(key=lambda s: (s.index, s.sample_idx))
        return out

    # ---- prompt scoring (protocol version 5) ----

    def score(self, prompts, start=0, top_logprobs=0, version=None, chat=False):
        """Scores each prompt (token ids or text) from position start on (an int, or a list with one per
        prompt), generating nothing: per prompt a list of the raw log-probs of its tokens start..n-1, each
        given the tokens before it (None at position 0, which has nothing before it). They are the float32
        values a draw of each token from the same logits reports, so scoring prompt + completion from
        len(prompt) gives back the completion's Sample.logprobs bit for bit (same weights). With
        top_logprobs=k, per prompt a pair (log-probs, alternatives): alternatives[i] is the k most likely
        tokens at that position as (token id, log-prob), highest first (None at position 0). version: None,
        or the weight version the scores must come from (VersionMismatch if the daemon scored any prompt
        under another, e.g. a push landed meanwhile)."""
        samples = self.generate(prompts, max_tokens=0, n=1, temperature=0.0, logprobs=top_logprobs, chat=chat,
                                prompt_logprobs_from=start)
        return _scores(samples, top_logprobs, version)

    def compute_logprobs(self, prompts, version=None):
        """tinker's compute_logprobs: per prompt (token ids or text), one entry per token, its raw log-prob
        given the tokens before it; the first is None."""
        return self.score(prompts, start=0, version=version)

    # ---- weight updates (PROTOCOL.md §10) ----

    def prepare(self, tensors, chunk_bytes=16 << 20) -> "PreparedUpdate":
        """The tensors checksummed once, in chunks this daemon accepts (push it
        with push_weights, as often as needed)."""
        room = self._max - CHUNK_ROOM
        if isinstance(tensors, PreparedUpdate):
            return tensors if tensors.chunk_bytes <= room else tensors.rechunk(room)
        return PreparedUpdate(tensors, min(int(chunk_bytes), room))

    def push_weights(self, tensors, version, mode="continue", window=4, chunk_bytes=16 << 20, lane=True,
                     progress=None, serve_dtype=None) -> "PushResult":
        """Pushes tensors to the daemon as policy `version` and commits them.

        tensors: a dict (or a list of (name, array) pairs) of HF tensor name ->
        numpy array (float32 -> f32, float16 -> f16, uint16 -> raw bf16 bits)
        or torch tensor (float32, float16, bfloat16), or a PreparedUpdate
        (prepare_update(): already checksummed, e.g. to push it again or to
        several daemons). mode: "continue", "drain" or "abort" (§10.6).
        window: chunks in flight (the daemon may grant fewer); chunk_bytes:
        largest chunk (clamped to what the daemon accepts). lane: use the
        daemon's data lane when it offers one (False: UPDATE_CHUNKs over NNG).
        progress: a callable(bytes_done, total), called from this thread, or
        True for a line on stderr. serve_dtype: None (the daemon's config key
        serve_dtype), "as_pushed", "q8_0", "q4_k" or "fp8" for this push (protocol version 3).

        Returns a PushResult. On any failure the transfer is aborted (the old
        weights keep serving) and DaemonError (.code, e.g. STALE_VERSION),
        TimeoutError_ or ConnectionError is raised."""
        if not (self.info.features & P.FEATURE_WEIGHT_UPDATE):
            raise DaemonError(P.E.UNKNOWN_TYPE, "the daemon does not take weight updates (HELLO_OK feature bit 0 "
                              "is off)", "UPDATE_BEGIN")
        mode_v = _mode(mode)
        serve = _serve(serve_dtype, self)
        if int(window) < 1:
            raise ValueError(f"window = {window}; expected >= 1")
        prep = self.prepare(tensors, chunk_bytes)
        if progress is True:
            progress = _stderr_progress(self.url)
            newline = True
        else:
            newline = False
        try:
            return _Push(self, prep, int(version), mode_v, int(window), lane, progress, serve).run()
        finally:
            if newline:
                sys.stderr.write("\n")
                sys.stderr.flush()


    def push_adapter(self, name, tensors, version, alpha=None, rank=None, rslora=None, window=4,
                     chunk_bytes=16 << 20, lane=True, progress=None) -> "PushResult":
        """Pushes a LoRA adapter under name as its version (PROTOCOL.md §10.15): requests
        admitted once it is committed use it; requests already running finish on the
        version they started with. tensors: PEFT's lora_A / lora_B tensors by name (a
        dict or (name, array) pairs; "base_model.model." is added where missing), or a
        PEFT folder (adapter_config.json + adapter_model.safetensors). alpha, rank,
        rslora: the scale's terms (from the folder's config, else rank from lora_A,
        rslora False; alpha must then be given). version: above the daemon's version of
        that name. Returns a PushResult (version: the adapter's)."""
        if not (self.info.features & P.FEATURE_LORA_PUSH):
            raise DaemonError(P.E.UNKNOWN_TYPE, "the daemon does not take adapter pushes (HELLO_OK feature bit 3 "
                              "is off: no weight updates, or max_loras is 0)", "ADAPTER_BEGIN")
        from .lora import adapter_push_args
        tensors, adapter = adapter_push_args(name, tensors, alpha, rank, rslora)
        prep = self.prepare(tensors, chunk_bytes)
        return _Push(self, prep, int(version), P.MODE_CONTINUE, int(window), lane, progress,
                     adapter=adapter).run()


class VersionMismatch(Exception):
    """score(..., version=v): a prompt was scored under another weight version. got: the versions seen."""

    def __init__(self, want, got):
        super().__init__(f"asked for scores of weight version {want}; the daemon scored under {sorted(got)}")
        self.want = want
        self.got = set(got)


def _scores(samples, top_logprobs=0, version=None):
    """score()'s answer from its samples (one per prompt, sorted by index)."""
    seen = {s.version_finish for s in samples} | {s.version_admit for s in samples}
    if version is not None and seen != {version}:
        raise VersionMismatch(version, seen)
    out = []
    for s in samples:
        if s.prompt_logprobs is None:
            raise DaemonError(P.E.INTERNAL, f"no scores came back (finish {s.finish_reason})", f"prompt {s.index}")
        lps = [None if np.isnan(v) else float(v) for v in s.prompt_logprobs]
        if not top_logprobs:
            out.append(lps)
            continue
        alts = []
        for i, v in enumerate(lps):
            ids, tl = s.prompt_top_ids[i], s.prompt_top_logprobs[i]
            alts.append(None if v is None else [(int(t), float(x)) for t, x in zip(ids, tl) if t >= 0])
        out.append((lps, alts))
    return out


# ---- weight updates: tensors, the prepared update, the push ----

MODES = {"continue": P.MODE_CONTINUE, "drain": P.MODE_DRAIN, "abort": P.MODE_ABORT}


def _serve(serve_dtype, client=None):
    """A push's serve_dtype as its UPDATE_BEGIN code (0: the daemon's config)."""
    if serve_dtype is None:
        return P.SERVE_CONFIG
    if serve_dtype not in P.SERVE_CODES:
        raise ValueError(f"serve_dtype {serve_dtype!r}; expected None, 'as_pushed', 'q8_0', 'q4_k' or 'fp8'")
    if client is not None and client.version < 3:
        raise ValueError(f"{client.url} speaks protocol version {client.version}: it cannot take a push's serve_dtype")
    return P.SERVE_CODES[serve_dtype]


def _mode(mode):
    if isinstance(mode, str):
        if mode not in MODES:
            raise ValueError(f"mode {mode!r}; expected 'continue', 'drain' or 'abort'")
        return MODES[mode]
    if int(mode) not in P.MODE_NAMES:
        raise ValueError(f"mode {mode}; expected 0 (continue), 1 (drain) or 2 (abort)")
    return int(mode)


def bf16_bits(a):
    """The bfloat16 bit patterns (a uint16 array, what push_weights sends as
    bf16) of a float array, rounded to nearest even; NaN stays NaN."""
    a = np.ascontiguousarray(a, dtype=np.float32)
    u = a.view(np.uint32)
    out = ((u + (np.uint32(0x7FFF) + ((u >> 16) & np.uint32(1)))) >> 16).astype(np.uint16)
    nan = np.isnan(a)
    if nan.any():
        out[nan] = ((u[nan] >> 16) | 0x40).astype(np.uint16)
    return out


def _wire_tensor(name, x):
    """(dtype code, shape, flat uint8 memoryview of the little-endian bytes) of
    one tensor; copies only what must be (device, layout, byte order)."""
    if type(x).__module__.split(".")[0] == "torch":
        import torch  # only when the caller already uses it
        t = x.detach()
        if t.device.type != "cpu":
            t = t.cpu()
        t = t.contiguous()
        if t.dtype == torch.bfloat16:
            a, dt = t.view(torch.int16).numpy().view(np.uint16), P.DTYPE_BF16
        elif t.dtype == torch.float32:
            a, dt = t.numpy(), P.DTYPE_F32
        elif t.dtype == torch.float16:
            a, dt = t.numpy(), P.DTYPE_F16
        else:
            raise TypeError(f"tensor {name!r}: torch dtype {t.dtype}; expected float32, float16 or bfloat16")
    else:
        a = x if isinstance(x, np.ndarray) else np.asarray(x)
        if a.dtype.name == "bfloat16":     # e.g. ml_dtypes: the same bits
            a, dt = np.ascontiguousarray(a).view(np.uint16), P.DTYPE_BF16
        elif a.dtype.kind == "f" and a.dtype.itemsize == 4:
            dt = P.DTYPE_F32
        elif a.dtype.kind == "f" and a.dtype.itemsize == 2:
            dt = P.DTYPE_F16
        elif a.dtype.kind == "u" and a.dtype.itemsize == 2:
            dt = P.DTYPE_BF16
        else:
            raise TypeError(f"tensor {name!r}: dtype {a.dtype}; expected float32 (f32), float16 (f16) or uint16 "
                            f"(bf16 bits: bf16_bits(a) converts floats)")
    a = np.ascontiguousarray(a, dtype=a.dtype.newbyteorder("<"))
    if not 1 <= a.ndim <= P.MAX_DIMS:
        raise ValueError(f"tensor {name!r}: {a.ndim} dimensions; expected 1..{P.MAX_DIMS}")
    if a.size == 0:
        raise ValueError(f"tensor {name!r} is empty")
    return dt, [int(d) for d in a.shape], memoryview(a.reshape(-1).view(np.uint8))


class PreparedUpdate:
    """Tensors ready to push: their bytes (views, not copies), the manifest
    (P.Tensor per tensor, with its CRC-32C) and the chunks (tensor index,
    offset, length, CRC-32C), every byte checksummed once. Push it with
    Client.push_weights or Pool.push_weights, as often as needed."""

    def __init__(self, tensors, chunk_bytes=16 << 20):
        t0 = time.perf_counter()
        items = list(tensors.items()) if hasattr(tensors, "items") else list(tensors)
        if not items:
            raise ValueError("push: no tensors")
        self.manifest = []
        self.data = []              # flat uint8 memoryviews, one per tensor
        seen = set()
        for name, x in items:
            if not isinstance(name, str) or not name:
                raise ValueError(f"tensor name {name!r}; expected a non-empty string (the HF name)")
            if name in seen:
                raise ValueError(f"tensor {name!r} is listed twice")
            seen.add(name)
            dt, shape, mv = _wire_tensor(name, x)
            self.manifest.append(P.Tensor(name=name, dtype=dt, shape=shape, nbytes=len(mv)))
            self.data.append(mv)
        self.total_bytes = sum(t.nbytes for t in self.manifest)
        self._chunk(chunk_bytes, None)
        self.prepare_seconds = time.perf_counter() - t0

    def _chunk(self, chunk_bytes, expect):
        cb = int(chunk_bytes)
        if cb < MIN_CHUNK:
            raise ValueError(f"chunk size {cb}; expected at least {MIN_CHUNK} bytes")
        self.chunk_bytes = cb
        self.chunks = []            # (tensor index, offset, len, crc32c)
        for i, mv in enumerate(self.data):
            crc = 0
            for off in range(0, len(mv), cb):
                n = min(cb, len(mv) - off)
                c = crc32c(mv[off:off + n])
                self.chunks.append((i, off, n, c))
                crc = crc32c_combine(crc, c, n)
            if self.manifest[i].flags & P.TENSOR_DELTA:
                continue    # a delta's crc32c is of its new bytes (delta.prepare_delta), its chunks carry the stream
            if expect is None:
                self.manifest[i].crc32c = crc
            elif crc != expect[i].crc32c:
                raise RuntimeError(f"tensor {expect[i].name!r} changed after it was prepared (CRC-32C "
                                   f"{crc:08x}, prepared {expect[i].crc32c:08x})")

    def rechunk(self, chunk_bytes):
        """The same update in chunks of at most chunk_bytes (checksums them again)."""
        new = object.__new__(PreparedUpdate)
        new.manifest, new.data, new.total_bytes = self.manifest, self.data, self.total_bytes
        t0 = time.perf_counter()
        new._chunk(chunk_bytes, self.manifest)
        new.prepare_seconds = time.perf_counter() - t0
        return new

    @property
    def names(self):
        return [t.name for t in self.manifest]

    def __len__(self):
        return len(self.manifest)

    def __repr__(self):
        return (f"PreparedUpdate({len(self.manifest)} tensors, {self.total_bytes / 1e6:.1f} MB, "
                f"{len(self.chunks)} chunks of <= {self.chunk_bytes} bytes)")


def prepare_update(tensors, chunk_bytes=16 << 20) -> PreparedUpdate:
    """Checksums tensors once for one or more pushes (see Client.push_weights)."""
    return PreparedUpdate(tensors, chunk_bytes)


@dataclass
class PushResult:
    """One daemon's completed push."""
    url: str
    version: int                # now serving
    stall_us: int               # the engine did not step because of the swap
    wait_us: int                # COMMIT's arrival to the swap
    staged_us: int              # UPDATE_BEGIN to COMMIT, on the daemon
    n_aborted: int              # samples returned aborted (abort mode)
    bytes: int                  # tensor bytes pushed
    seconds: float              # UPDATE_BEGIN to COMMIT_OK, here
    transfer_seconds: float     # first chunk sent to last chunk acknowledged (chain: to every daemon having all)
    lane: bool                  # chunks went over the data lane
    window: int                 # chunks in flight, as granted
    chunk_bytes: int
    retries: int = 0            # chunks sent again (BUSY, CHECKSUM, timeouts)
    wire_bytes: int = 0         # chunk frame bytes this process sent to it (resends included)
    fanout: str = "direct"      # "chain": it got the chunks from the daemon before it (hop > 0)
    hop: int = 0                # its place in the chain (0: fed by this process)

    @property
    def mb_per_s(self):
        """Tensor MB (1e6 bytes) per second, UPDATE_BEGIN to COMMIT_OK."""
        return self.bytes / 1e6 / self.seconds if self.seconds > 0 else 0.0

    @property
    def transfer_mb_per_s(self):
        return self.bytes / 1e6 / self.transfer_seconds if self.transfer_seconds > 0 else 0.0

    def as_dict(self):
        d = asdict(self)
        d["mb_per_s"] = self.mb_per_s
        return d

    def __getitem__(self, k):   # res["version"] works too
        return getattr(self, k)


def _stderr_progress(url):
    t0 = time.perf_counter()

    def show(done, total):
        dt = time.perf_counter() - t0
        sys.stderr.write(f"\r{url} {100.0 * done / total if total else 100.0:5.1f}% {done / 1e6:.0f}/"
                         f"{total / 1e6:.0f} MB {done / 1e6 / dt if dt > 0 else 0.0:.0f} MB/s   ")
        sys.stderr.flush()
    return show


def _url_host(url):
    """The host of a tcp:// URL (where the data lane listens), or None."""
    for scheme in ("tcp://", "tcp4://", "tcp6://"):
        if url.startswith(scheme):
            hp = url[len(scheme):]
            host = hp.rsplit(":", 1)[0] if ":" in hp else hp
            if host.startswith("[") and host.endswith("]"):
                host = host[1:-1]
            return host or "127.0.0.1"
    return None


def _chunk_head(xfer, seq, ti, off, crc, n):
    """An UPDATE_CHUNK frame without its data: header + 32 fixed bytes (proto_lane_encode_head)."""
    return struct.pack("<4sHHIIQIIQII", P.MAGIC, P.VERSION_MIN, P.T.UPDATE_CHUNK, 32 + n, 0, xfer, seq, ti, off, crc, n)


def _recv_exact(sock, n):
    buf = bytearray(n)
    view, got = memoryview(buf), 0
    while got < n:
        k = sock.recv_into(view[got:])
        if k == 0:
            return None if got == 0 else b""
        got += k
    return bytes(buf)


def _send_all(sock, parts):
    sent = sock.sendmsg(parts)
    for p in parts:
        if sent >= len(p):
            sent -= len(p)
            continue
        sock.sendall(memoryview(p)[sent:])
        sent = 0


class _Push:
    """One daemon's push: BEGIN, the chunks (lane or NNG), COMMIT; ABORT on failure."""

    def __init__(self, client, prep, version, mode, window, lane, progress, serve=0, adapter=None):
        self.c, self.p, self.version, self.mode = client, prep, version, mode
        self.adapter = adapter      # an adapter's push: {name, rank, alpha, rslora} (ADAPTER_BEGIN), else None
        self.serve = serve          # UPDATE_BEGIN serve_dtype (P.SERVE_*; 0: the daemon's config)
        self.want_window, self.want_lane, self.progress = window, lane, progress
        self.cv = threading.Condition()
        self.acked = bytearray(len(prep.chunks))
        self.done_bytes = 0
        self.outstanding = 0
        self.retries = 0
        self.wire = 0
        self.error = None
        self.sock = None            # the data lane's socket
        self.ctxs = []              # the NNG req contexts

    # shared state, under cv
    def ack(self, i):
        with self.cv:
            if not self.acked[i]:
                self.acked[i] = 1
                self.done_bytes += self.p.chunks[i][2]
            self.cv.notify_all()

    def count(self, wire=0, retries=0):
        with self.cv:
            self.wire += wire
            self.retries += retries

    def fail(self, exc):
        with self.cv:
            if self.error is None:
                self.error = exc
            self.cv.notify_all()

    def begin(self):
        """UPDATE_BEGIN (ADAPTER_BEGIN for an adapter); rechunks the update if the daemon grants smaller
        chunks. A learner silent for longer than the daemon's client_ttl_s (a long training step since its
        last call) has been forgotten: a push holds nothing at the daemon before it begins, so the client
        registers again (HELLO 0) and begins once more."""
        try:
            return self._begin()
        except DaemonError as e:
            if e.code != P.E.UNKNOWN_CLIENT:
                raise
            self.c.hello(0, self.c.name)
            return self._begin()

    def _begin(self):
        c, p = self.c, self.p
        self.t0 = time.perf_counter()
        if self.adapter is not None:
            a = self.adapter
            ok = c._call(P.AdapterBegin(client_id=c.client_id, version=self.version,
                                        flags=P.ADAPTER_RSLORA if a["rslora"] else 0, rank=a["rank"],
                                        lora_alpha=a["alpha"], window=self.want_window, max_chunk_bytes=p.chunk_bytes,
                                        total_bytes=p.total_bytes, name=a["name"], tensors=p.manifest),
                         P.T.ADAPTER_BEGIN_OK, BEGIN_TIMEOUT_MS, retries=1)
        else:
            ok = c._call(P.UpdateBegin(client_id=c.client_id, version=self.version, mode=self.mode,
                                       serve_dtype=self.serve, window=self.want_window, max_chunk_bytes=p.chunk_bytes,
                                       total_bytes=p.total_bytes, tensors=p.manifest),
                         P.T.UPDATE_BEGIN_OK, BEGIN_TIMEOUT_MS, retries=1)
        self.xfer, self.window, self.begin_ok = ok.xfer_id, max(1, ok.window), ok
        if ok.max_chunk_bytes < p.chunk_bytes:      # the daemon grants less than it announced room for
            self.use(p.rechunk(ok.max_chunk_bytes))
        return ok

    def use(self, prep):
        """Sends prep's chunks (the same tensors, another chunk size) from now on."""
        self.p = prep
        self.acked = bytearray(len(prep.chunks))
        self.done_bytes = 0

    def send(self):
        """Every chunk, over the data lane or NNG, until each is acknowledged."""
        c, p = self.c, self.p
        host = _url_host(c.url)
        self.use_lane = use_lane = bool(self.want_lane and self.begin_ok.data_port and host)
        self.t1 = time.perf_counter()
        sock = None
        if use_lane:
            try:
                sock = socket.create_connection((host, self.begin_ok.data_port), timeout=CHUNK_TIMEOUT_MS / 1000)
            except OSError:
                self.use_lane = use_lane = False     # no route to the lane: the same chunks over NNG
        worker = threading.Thread(target=self._lane if use_lane else self._nng, args=(sock,) if use_lane else (),
                                  name="rolloutd-push", daemon=True)
        worker.start()
        try:
            while worker.is_alive():
                worker.join(0.25)
                if self.progress:
                    self.progress(self.done_bytes, p.total_bytes)
            if self.progress:
                self.progress(self.done_bytes, p.total_bytes)
        except BaseException as e:  # KeyboardInterrupt (or progress raised): stop the senders, abort
            self.fail(e)
            self._interrupt()
            worker.join()
            raise
        if self.error is None and self.done_bytes != p.total_bytes:
            self.fail(RuntimeError(f"push: {self.done_bytes} of {p.total_bytes} bytes acknowledged"))
        if self.error is not None:
            raise self.error
        self.t2 = time.perf_counter()

    def abort(self):
        try:
            self.c._call(P.UpdateAbort(xfer_id=self.xfer), P.T.UPDATE_ABORT_OK, 10000, retries=1)
        except Exception:
            pass    # gone already (a failed COMMIT aborts the transfer) or unreachable

    def result(self, r, t0=None, t1=None, t2=None, fanout="direct", hop=0):
        p = self.p
        t0 = self.t0 if t0 is None else t0
        return PushResult(url=self.c.url, version=r.version, stall_us=r.stall_us, wait_us=r.wait_us,
                          staged_us=r.staged_us, n_aborted=r.n_aborted, bytes=p.total_bytes,
                          seconds=time.perf_counter() - t0,
                          transfer_seconds=(self.t2 if t2 is None else t2) - (self.t1 if t1 is None else t1),
                          lane=getattr(self, "use_lane", True), window=self.window, chunk_bytes=p.chunk_bytes,
                          retries=self.retries, wire_bytes=self.wire, fanout=fanout, hop=hop)

    def run(self):
        self.begin()
        try:
            self.send()
            r = self._commit()
        except BaseException:
            self.abort()
            raise
        return self.result(r)

    def _interrupt(self):
        """Unblocks the sender threads (they see self.error and end)."""
        try:
            if self.sock is not None:
                self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        for x in list(self.ctxs):
            try:
                x.close()
            except pynng.NNGException:
                pass

    def _commit(self):
        deadline = time.monotonic() + COMMIT_TIMEOUT_MS / 1000
        while True:
            try:
                return self.c._call(P.UpdateCommit(xfer_id=self.xfer), P.T.UPDATE_COMMIT_OK, COMMIT_TIMEOUT_MS,
                                    retries=2)
            except DaemonError as e:
                # BUSY: a repeated COMMIT while the first is still committing; the reply will come.
                if e.code != P.E.BUSY or time.monotonic() > deadline:
                    raise
                time.sleep(0.05)

    # ---- UPDATE_CHUNKs over NNG: `window` req contexts, each with one chunk outstanding ----

    def _nng(self):
        c, p = self.c, self.p
        with c._lock:   # a context takes the socket's receive timeout when it opens
            c._sock.recv_timeout = CHUNK_TIMEOUT_MS
            ctxs = self.ctxs = [c._sock.new_context() for _ in range(self.window)]
        nxt = iter(range(len(p.chunks)))
        nxt_lock = threading.Lock()

        def slot(ctx):
            while self.error is None:
                with nxt_lock:
                    i = next(nxt, None)
                if i is None:
                    return
                ti, off, n, crc = p.chunks[i]
                frame = b"".join((_chunk_head(self.xfer, i, ti, off, crc, n), p.data[ti][off:off + n]))
                deadline = time.monotonic() + CHUNK_TIMEOUT_MS / 1000
                last, resends, busy, timeouts = None, 0, 0, 0
                while True:
                    if self.error is not None:
                        return
                    if timeouts >= RETRIES:
                        self.fail(TimeoutError_(f"UPDATE_CHUNK {i}: no reply from {c.url} after {timeouts} tries"))
                        return
                    if resends > MAX_RESENDS or (busy and time.monotonic() > deadline):
                        why = f"not accepted after {resends} resends and {busy} BUSY replies"
                        self.fail(DaemonError(last.code, f"{last.message} ({why})", f"UPDATE_CHUNK {i}"))
                        return
                    try:
                        self.count(wire=len(frame))
                        ctx.send(frame)
                        buf = ctx.recv()
                    except pynng.Timeout:
                        self.count(retries=1)   # a lost reply: the resend is safe (§8)
                        timeouts += 1
                        continue
                    except Exception as e:  # pynng.NNGException, or the context closed by _interrupt
                        self.fail(ConnectionError(f"{c.url}: UPDATE_CHUNK {i}: {e}"))
                        return
                    try:
                        m = P.decode(buf, c._max)
                    except P.ProtoError as e:
                        self.fail(e)
                        return
                    if isinstance(m, P.UpdateChunkOk):
                        self.ack(i)
                        break
                    if isinstance(m, P.Error) and m.code in (P.E.BUSY, P.E.CHECKSUM):
                        self.count(retries=1)   # window full, or damaged on the way: send it again
                        last, timeouts = m, 0
                        if m.code == P.E.BUSY:  # resent until the chunk timeout
                            busy += 1
                            time.sleep(min(0.05, 0.002 * busy))
                        else:
                            resends += 1
                        continue
                    if isinstance(m, P.Error):
                        self.fail(DaemonError(m.code, m.message, f"UPDATE_CHUNK {i}"))
                    else:
                        self.fail(P.ProtoError(P.E.UNEXPECTED, f"UPDATE_CHUNK answered with {m.TYPE.name}"))
                    return

        threads = [threading.Thread(target=slot, args=(x,), daemon=True) for x in ctxs]
        try:
            for t in threads:
                t.start()
            for t in threads:
                t.join()
        finally:
            for x in ctxs:
                try:
                    x.close()
                except pynng.NNGException:
                    pass

    # ---- the data lane (§10.10): chunk heads + the tensors' bytes on one TCP stream ----

    def _lane(self, sock):
        p = self.p
        self.sock = sock
        self.sending = True
        self.reader_done = False
        self.reader_done_early = False     # the stream ended while chunks were being sent
        self.refusal = None
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if self.c._secret is not None:
                lane_authenticate(sock, self.c._secret, self.xfer, self.c.url)
            reader = threading.Thread(target=self._lane_reader, args=(sock,), daemon=True)
            reader.start()
            for _ in range(LANE_PASSES):    # later passes resend what was refused (CHECKSUM, BUSY)
                todo = [i for i in range(len(p.chunks)) if not self.acked[i]]
                if not todo:
                    break
                for i in todo:
                    with self.cv:
                        while self.outstanding >= self.window and self.error is None and not self.reader_done:
                            self.cv.wait(1.0)
                        if self.error is not None or self.reader_done:
                            break
                        self.outstanding += 1
                    ti, off, n, crc = p.chunks[i]
                    try:
                        _send_all(sock, [_chunk_head(self.xfer, i, ti, off, crc, n), p.data[ti][off:off + n]])
                    except OSError as e:
                        self.fail(ConnectionError(f"{self.c.url}: data lane: the connection broke while "
                                                  f"sending: {e}"))
                        break
                    self.count(wire=P.HEADER_BYTES + 32 + n)
                with self.cv:
                    while self.outstanding > 0 and self.error is None and not self.reader_done:
                        self.cv.wait(1.0)
                    if self.error is not None or self.reader_done:
                        self.reader_done_early = self.reader_done
                        break
            self.sending = False
            if self.error is None:
                try:
                    sock.shutdown(socket.SHUT_WR)   # done: the daemon closes its side
                except OSError:
                    pass
            else:
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
            reader.join()
            if self.error is None and not all(self.acked):
                left = len(self.acked) - sum(self.acked)
                if self.refusal is not None and not self.reader_done_early:
                    self.fail(DaemonError(self.refusal.code, f"{self.refusal.message} ({left} chunks still refused "
                                          f"after {LANE_PASSES} passes)", "UPDATE_CHUNK (data lane)"))
                else:
                    self.fail(ConnectionError(f"{self.c.url}: data lane: the daemon closed the stream with {left} "
                                              f"chunks not acknowledged"))
        except BaseException as e:
            self.fail(e)
        finally:
            sock.close()

    def _lane_reader(self, sock):
        p = self.p
        try:
            while True:
                try:
                    head = _recv_exact(sock, P.HEADER_BYTES)
                    if not head:
                        break
                    body_len = struct.unpack_from("<I", head, 8)[0]
                    if body_len > 65536:
                        raise P.ProtoError(P.E.TOO_LARGE, f"data lane: a {body_len}-byte reply")
                    body = _recv_exact(sock, body_len) if body_len else b""
                    if body is None or len(body) != body_len:
                        break
                except socket.timeout:
                    with self.cv:
                        if self.outstanding == 0 and self.sending:
                            continue
                        if self.outstanding == 0:
                            break
                    raise TimeoutError_(f"{self.c.url}: data lane: no reply in {CHUNK_TIMEOUT_MS / 1000:.0f} s")
                m = P.decode(head + body, 0)
                if isinstance(m, P.UpdateChunkOk) and m.xfer_id == self.xfer and m.chunk_seq < len(p.chunks):
                    with self.cv:
                        self.outstanding -= 1
                    self.ack(m.chunk_seq)
                elif isinstance(m, P.Error) and m.code in (P.E.CHECKSUM, P.E.BUSY):
                    with self.cv:   # the error names no chunk: the next pass resends what is not acknowledged
                        self.outstanding -= 1
                        self.retries += 1
                        self.refusal = m
                        self.cv.notify_all()
                elif isinstance(m, P.Error):
                    raise DaemonError(m.code, m.message, "UPDATE_CHUNK (data lane)")
                else:
                    raise P.ProtoError(P.E.UNEXPECTED, f"data lane: an unexpected reply {m}")
        except (OSError, ValueError) as e:
            with self.cv:
                quiet = self.error is not None or not self.sending and self.outstanding == 0
            if not quiet:
                self.fail(ConnectionError(f"{self.c.url}: data lane: {e}"))
        except Exception as e:
            self.fail(e)
        finally:
            with self.cv:
                self.reader_done = True
                self.cv.notify_all()
