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

Transport (PROTOCOL.md §1): one req0 socket with NNG's request resends off,
the receive size limit set to the daemon's max_message_bytes, and a receive
timeout of wait_ms + 10 s for FETCH (30 s otherwise); a timed-out exchange is
repeated, which the protocol makes safe. Each finished sample has a per-client
seq; the client skips seqs it has processed and acks the highest in its next
FETCH, so a resumed client (Client(url, client_id=...)) gets exactly the
results it had not processed. A Client is used by one thread at a time.
"""
import json
import threading
from dataclasses import dataclass, field
from typing import Iterator, List, Optional, Sequence, Tuple, Union

import numpy as np
import pynng

from . import proto as P

DEFAULT_URL = "tcp://127.0.0.1:7070"
TIMEOUT_MS = 30000          # reply timeout of every request but FETCH
FETCH_MARGIN_MS = 10000     # FETCH waits wait_ms plus this
FETCH_WAIT_MS = 1000        # long-poll
RETRIES = 5                 # consecutive timeouts before giving up
SP_HEADER_MARGIN = 64       # NNG counts the req0 header in the message size


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

    @property
    def version(self):
        return self.version_finish


def _sample(r, index):
    k = r.top_k
    return Sample(index=index, sample_idx=r.sample_idx, token_ids=np.array(r.token_ids, dtype=np.int32),
                  logprobs=np.array(r.logprobs, dtype=np.float32), finish_reason=P.FINISH_NAMES[r.finish],
                  client_req_id=r.client_req_id, seq=r.seq, seed=r.seed, n_prompt=r.n_prompt,
                  version_admit=r.version_admit, version_finish=r.version_finish, spans=list(r.spans),
                  logprobs_processed=None if r.logprobs_processed is None else np.array(r.logprobs_processed,
                                                                                        dtype=np.float32),
                  top_ids=np.array(r.top_ids, dtype=np.int32) if k else None,
                  top_logprobs=np.array(r.top_logprobs, dtype=np.float32) if k else None,
                  n_preempt=r.n_preempt, queued_us=r.queued_us, first_token_us=r.first_token_us, total_us=r.total_us)


class Stream:
    """Iterator over the samples of one stream() call, in completion order.
    req_ids[i] is the client_req_id of prompt i; abort() aborts them all (the
    aborted samples still arrive, with finish_reason "abort")."""

    def __init__(self, client, reqs):
        self._c = client
        self._reqs = reqs
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
                self._pending.append(_sample(r, i))
        return self._pending.pop(0)

    def abort(self):
        """Aborts every request of this stream that is not finished."""
        n = 0
        for i, rid in enumerate(self.req_ids[:self._next]):
            if self._left[i] > 0:
                n += self._c.abort(rid)[1]
        return n


class Client:
    def __init__(self, url=DEFAULT_URL, client_id=0, name="rolloutd-python", timeout_ms=TIMEOUT_MS):
        self.url = url
        self.timeout_ms = timeout_ms
        self.client_id = 0
        self.info = None             # proto.HelloOk
        self.last_seq = 0            # highest seq processed; acked by the next FETCH
        self.next_req_id = 1
        self._lock = threading.Lock()
        self._max = P.DEFAULT_MAX_MESSAGE
        self._sock = pynng.Req0(resend_time=-1, recv_max_size=P.DEFAULT_MAX_MESSAGE + SP_HEADER_MARGIN)
        try:
            self._sock.dial(url, block=True)
        except pynng.NNGException as e:
            self._sock.close()
            raise ConnectionError(f"cannot connect to {url}: {e} (is rolloutd running there?)") from None
        self.hello(client_id, name)

    # ---- one exchange ----

    def _call(self, msg, want, timeout_ms=None, retries=RETRIES):
        frame = P.encode(msg)
        if len(frame) > self._max:
            raise ValueError(f"{msg.TYPE.name} is {len(frame)} bytes; the daemon accepts at most {self._max}")
        with self._lock:
            for attempt in range(retries):
                self._sock.recv_timeout = timeout_ms or self.timeout_ms
                self._sock.send(frame)
                try:
                    buf = self._sock.recv()
                    break
                except pynng.Timeout:
                    continue        # every request is safe to repeat (PROTOCOL.md §8)
            else:
                raise TimeoutError_(f"{msg.TYPE.name}: no reply from {self.url} after {retries} tries")
        reply = P.decode(buf, self._max)
        if isinstance(reply, P.Error):
            raise DaemonError(reply.code, reply.message, msg.TYPE.name)
        if reply.TYPE != want:
            raise P.ProtoError(P.E.UNEXPECTED, f"the daemon answered {msg.TYPE.name} with {reply.TYPE.name}; "
                               f"expected {want.name}")
        return reply

    # ---- protocol operations ----

    def hello(self, client_id=0, name="rolloutd-python"):
        """HELLO: a new client (0) or resume client_id. Returns the HelloOk."""
        ok = self._call(P.Hello(client_id=client_id, client_name=name), P.T.HELLO_OK)
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
        ok = self._call(P.Submit(client_id=self.client_id, requests=list(requests)), P.T.SUBMIT_OK)
        return ok.items

    def fetch(self, max_results=256, wait_ms=FETCH_WAIT_MS) -> List[P.Result]:
        """FETCH acking last_seq; returns the results not processed before
        (last_seq moves past them: the caller processes them now)."""
        res = self._call(P.Fetch(client_id=self.client_id, ack_seq=self.last_seq, max_results=max_results,
                                 wait_ms=wait_ms), P.T.RESULTS, wait_ms + FETCH_MARGIN_MS)
        self.pending_results = res.pending_results
        self.inflight_samples = res.inflight_samples
        new = [r for r in res.results if r.seq > self.last_seq]
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
            if bye and self.client_id:
                self.ack()
                self.bye()
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
                 seed=None, stop=None, logprobs=0, processed_logprobs=False, ignore_eos=False, chat=False):
        """The protocol requests for prompts (fresh client_req_ids). seed: None
        (the daemon picks one per request, reported in each sample), an int
        (used for every prompt; the n samples of a prompt still differ) or a
        list with one seed per prompt. stop: extra stop token ids."""
        if isinstance(prompts, (str, bytes)) or (len(prompts) and np.isscalar(prompts[0]) and
                                                 not isinstance(prompts[0], str)):
            raise TypeError("prompts is a list of prompts: each a list of token ids or a string")
        stop_ids = np.array([] if stop is None else list(stop))
        if stop_ids.size and not np.issubdtype(stop_ids.dtype, np.integer):
            raise TypeError("stop takes token ids (the daemon matches ids, not strings)")
        seeds = seed if isinstance(seed, (list, tuple, np.ndarray)) else [seed] * len(prompts)
        if len(seeds) != len(prompts):
            raise ValueError(f"seed has {len(seeds)} entries for {len(prompts)} prompts")
        reqs = []
        for p, s in zip(prompts, seeds):
            flags = (P.REQ_PROCESSED_LOGPROBS if processed_logprobs else 0) | (P.REQ_IGNORE_EOS if ignore_eos else 0)
            if s is not None:
                flags |= P.REQ_HAS_SEED
            q = P.Request(client_req_id=self.next_req_id, n=n, max_tokens=max_tokens, temperature=temperature,
                          top_p=top_p, top_k=top_k, min_p=min_p, seed=0 if s is None else int(s),
                          logprobs_topk=logprobs, stop_ids=stop_ids.astype(np.int32))
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
        return Stream(self, self.requests(prompts, **params))

    def generate(self, prompts, **params) -> List[Sample]:
        """Runs the prompts to completion and returns every sample, sorted by
        (index, sample_idx). Parameters: n, max_tokens, temperature, top_p,
        top_k, min_p, seed, stop, logprobs (top-k alternatives per token),
        processed_logprobs, ignore_eos, chat. An invalid request raises
        DaemonError (code INVALID_PARAMS) naming the prompt."""
        out = list(self.stream(prompts, **params))
        out.sort(key=lambda s: (s.index, s.sample_idx))
        return out
