"""Many rolloutd daemons as one: rollouts spread over them, weight pushes to all.

    from rolloutd import Pool
    with Pool(["tcp://10.0.0.1:7070", "tcp://10.0.0.2:7070"]) as pool:
        samples = pool.generate(prompts, n=8, max_tokens=64, temperature=0.8, seed=1)
        results = pool.push_weights(tensors, version=2)     # one PushResult per daemon

generate() and stream() take the parameters of Client.generate(); prompt i goes
to daemon i mod len(urls) (round robin), the daemons run concurrently (a
thread each), and samples keep the index of their prompt in the call.
score() and compute_logprobs() (protocol version 5) spread prompts the same way
and answer in the prompts' order, as Client.score does. generate(...,
lora="name") runs them under a LoRA adapter (protocol version 6), which every
daemon must have loaded under that name (a list: one name or None per prompt).
push_weights() checksums the tensors once (a PreparedUpdate) and sends them
either as a chain (fanout="chain", the default for 2 or more daemons): this
process sends every byte once, to the first daemon, which relays each verified
chunk to the next, and so on (PROTOCOL.md §10.11), then a two-phase commit; or
directly (fanout="direct"): to every daemon at once, each with its own window
and data lane (§10.8). It raises PoolError, holding every daemon's outcome,
if any failed.
Delta pushes (PROTOCOL.md §10.14): the Pool keeps the bytes of its last push
per tensor; the next push_weights sends each tensor as a delta against them
(rolloutd.delta: only what changed) when every daemon serves that version
(delta=None, the default; True forces it, False sends whole), or against
base= (tensors at base_version). A daemon that refuses the delta (it missed a
version, holds another dtype, serves quantized) gets the full push in the
same call, so every daemon ends on the new version.
A Pool is used by one thread at a time (its calls take a lock).
"""
import queue
import socket
import sys
import threading
import time
from typing import List

import numpy as np
import pynng

from . import delta as D
from . import proto as P
from .client import (DaemonError, PreparedUpdate, PushResult, Sample, TimeoutError_, Client, CHUNK_ROOM,  # noqa: F401
                     CHUNK_TIMEOUT_MS, _Push, _mode, _scores, _serve, _url_host, lane_key, wrap_pad)

POLL_S = 0.02               # UPDATE_PREPARE polls of a chain push
POLL_TIMEOUT_MS = 3000      # a daemon that does not answer a poll this fast is taken for dead
# a daemon answering a delta's UPDATE_BEGIN with one of these gets the full push instead
DELTA_REFUSALS = (P.E.BASE_MISMATCH, P.E.DTYPE_MISMATCH, P.E.BASE_QUANTIZED)


class PoolError(Exception):
    """At least one daemon failed. outcomes: [(url, PushResult or exception)]
    in the Pool's order; errors: {url: exception} for the failed ones."""

    def __init__(self, what, outcomes, committed=()):
        self.outcomes = outcomes
        self.committed = list(committed)    # URLs serving the new version anyway (on_failure="commit")
        self.errors = {u: r for u, r in outcomes if isinstance(r, BaseException)}
        lines = [f"  {u}: " + (f"failed: {type(r).__name__}: {r}" if isinstance(r, BaseException) else
                               f"ok (version {r.version})" if isinstance(r, PushResult) else "ok")
                 for u, r in outcomes]
        super().__init__(f"{what} failed on {len(self.errors)} of {len(outcomes)} daemons:\n" + "\n".join(lines))

    @property
    def codes(self):
        """{url: DaemonError code} of the failures the daemons reported."""
        return {u: e.code for u, e in self.errors.items() if isinstance(e, DaemonError)}


def _run_all(jobs):
    """Runs fn() for every (key, fn) in its own thread; [(key, result or exception)] in order."""
    out = [None] * len(jobs)

    def one(k, key, fn):
        try:
            out[k] = (key, fn())
        except BaseException as e:  # reported with the others
            out[k] = (key, e)

    threads = [threading.Thread(target=one, args=(k, key, fn), daemon=True) for k, (key, fn) in enumerate(jobs)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return out


class PoolStream:
    """Iterator over the samples of one Pool.stream() call in the order they
    arrive from any daemon (Sample.index is the prompt's position in the call)."""

    def __init__(self, streams, maps):
        self._streams = streams
        self._q = queue.Queue()
        self._live = len(streams)
        self._threads = []
        for st, m in zip(streams, maps):
            t = threading.Thread(target=self._pump, args=(st, m), daemon=True)
            t.start()
            self._threads.append(t)

    def _pump(self, st, m):
        try:
            for s in st:
                s.index = m[s.index]
                self._q.put(s)
        except BaseException as e:
            self._q.put(e)
        finally:
            self._q.put(None)

    def __iter__(self):
        return self

    def __next__(self) -> Sample:
        while True:
            if self._live == 0 and self._q.empty():
                raise StopIteration
            x = self._q.get()
            if x is None:
                self._live -= 1
                continue
            if isinstance(x, BaseException):
                raise x
            return x

    def abort(self):
        """Aborts every unfinished request of this stream on every daemon."""
        return sum(st.abort() for st in self._streams)


class Pool:
    def __init__(self, urls, name="rolloutd-pool", **client_kw):
        if isinstance(urls, str):
            urls = [u for u in urls.split(",") if u]
        if not urls:
            raise ValueError("Pool: no daemon URLs")
        self.urls = list(urls)
        self.clients: List[Client] = []
        self._lock = threading.Lock()
        self._held = {}             # name -> (dtype code, flat uint8 copy): the last push's bytes
        self._held_version = None   # the version they are
        self._held_adapters = {}    # adapter name -> (version, {tensor: (dtype code, flat uint8 copy)}): deltas' bases
        self.last_push = None       # what the last push_weights sent (kind, wire bytes, delta stats)
        try:
            for u in self.urls:
                self.clients.append(Client(u, name=name, **client_kw))
        except BaseException:
            self.close()
            raise

    def __len__(self):
        return len(self.clients)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def close(self):
        for c in self.clients:
            c.close()

    PER_PROMPT = ("seed", "prompt_logprobs_from", "lora")  # parameters that may be a list with one entry per prompt

    def _split(self, prompts, params):
        """Round robin: [(client, its prompts, its params, its prompt -> call index map)]."""
        lists = {}
        for name in self.PER_PROMPT:
            v = params.get(name)
            if isinstance(v, (list, tuple)) or hasattr(v, "shape"):
                if len(v) != len(prompts):
                    raise ValueError(f"{name} has {len(v)} entries for {len(prompts)} prompts")
                lists[name] = v
        parts = []
        n = len(self.clients)
        for k, c in enumerate(self.clients):
            idx = list(range(k, len(prompts), n))
            if not idx:
                continue
            p = dict(params)
            for name, v in lists.items():
                p[name] = [v[i] for i in idx]
            parts.append((c, [prompts[i] for i in idx], p, idx))
        return parts

    def generate(self, prompts, **params) -> List[Sample]:
        """Client.generate over the daemons at once: every sample, sorted by
        (index, sample_idx), index being the prompt's position in prompts. A
        failure on any daemon raises (the first one, after all have ended)."""
        with self._lock:
            parts = self._split(list(prompts), params)
            res = _run_all([(c.url, (lambda c=c, pr=pr, p=p: c.generate(pr, **p))) for c, pr, p, _ in parts])
        out = []
        for (url, r), (_, _, _, idx) in zip(res, parts):
            if isinstance(r, BaseException):
                raise r
            for s in r:
                s.index = idx[s.index]
                out.append(s)
        out.sort(key=lambda s: (s.index, s.sample_idx))
        return out

    def score(self, prompts, start=0, top_logprobs=0, version=None, chat=False):
        """Client.score over the daemons at once (round robin), in the prompts' order. version: None, or the
        weight version every prompt must be scored under (client.VersionMismatch otherwise)."""
        samples = self.generate(prompts, max_tokens=0, n=1, temperature=0.0, logprobs=top_logprobs, chat=chat,
                                prompt_logprobs_from=start)
        return _scores(samples, top_logprobs, version)

    def compute_logprobs(self, prompts, version=None):
        """tinker's compute_logprobs over the daemons: per prompt one entry per token, the first None."""
        return self.score(prompts, start=0, version=version)

    def stream(self, prompts, **params) -> PoolStream:
        """Submits the prompts (round robin) and returns an iterator over the
        samples as they finish on any daemon."""
        with self._lock:
            parts = self._split(list(prompts), params)
            streams = []
            try:
                for c, pr, p, _ in parts:
                    streams.append(c.stream(pr, **p))
            except BaseException:
                for st in streams:
                    try:
                        st.abort()
                    except (DaemonError, TimeoutError_):
                        pass
                raise
            return PoolStream(streams, [idx for _, _, _, idx in parts])

    def prepare(self, tensors, chunk_bytes=16 << 20) -> PreparedUpdate:
        """The tensors checksummed once, in chunks every daemon accepts."""
        room = min(c._max for c in self.clients) - CHUNK_ROOM
        if isinstance(tensors, PreparedUpdate):
            return tensors if tensors.chunk_bytes <= room else tensors.rechunk(room)
        return PreparedUpdate(tensors, min(int(chunk_bytes), room))

    def push_weights(self, tensors, version, mode="continue", window=4, chunk_bytes=16 << 20, lane=True,
                     progress=None, fanout=None, on_failure="abort", delta=None, base=None,
                     base_version=None, keep=True, serve_dtype=None) -> List[PushResult]:
        """Pushes the tensors to every daemon as policy `version`
        (Client.push_weights' parameters; the checksums are computed once).

        fanout: "chain" (the default for 2 or more daemons) sends each byte
        once, to the first daemon, and the daemons relay it along the Pool's
        order; every daemon verifies and builds the update, and only when all
        have is it committed on all (two-phase). A daemon that dies or fails
        is routed around. on_failure="abort" (the default) then aborts the
        update everywhere (the old weights keep serving); "commit" commits it
        on the daemons that have it. "direct" sends everything to every
        daemon at once, each committing on its own. serve_dtype: None (each
        daemon's config), "as_pushed", "q8_0", "q4_k" or "fp8" for this push on every daemon.
        A chain needs the daemons' data lanes; where a daemon offers none (TLS)
        the push is direct.

        Returns one PushResult per daemon, in the Pool's order; raises
        PoolError (every daemon's outcome in .outcomes, .committed) if any
        failed. progress: True for one stderr line with every daemon, or a
        callable(url, bytes_done, total).

        delta: None (the default) sends deltas against the last push's bytes
        (or base=, tensors at base_version) when every daemon serves that
        version; True sends them whenever there is a base; False sends whole.
        A daemon refusing a delta (BASE_MISMATCH, DTYPE_MISMATCH,
        BASE_QUANTIZED) gets the full push in this call. keep=False does not
        keep this push's bytes (no delta against it later)."""
        fanout = self._fanout(fanout, on_failure)
        for c in self.clients:
            _serve(serve_dtype, c)      # refuses before anything is sent
        with self._lock:
            if isinstance(tensors, PreparedUpdate):
                delta, keep = False, False  # its bytes are not at hand as tensors
            bases, bver = None, None
            if delta is not False:
                if base is not None:
                    if base_version is None:
                        raise ValueError("push_weights: base= needs base_version=")
                    bases, bver = base, int(base_version)
                elif self._held:
                    bases, bver = self._held, self._held_version
            if bases is not None and delta is None:
                serving = [st.get("weight_version") for st in self._status_all()]
                if any(v != bver for v in serving):
                    bases = None        # a daemon is elsewhere: whole (a delta would be refused there anyway)
            full = None
            if bases is not None:
                prep = D.prepare_delta(tensors, bases, bver, min(int(chunk_bytes), self._room()))
                if prep.delta_stats["delta_tensors"] == 0:
                    full, prep = prep, None
            else:
                prep = None
            if prep is None:
                full = full or self.prepare(tensors, chunk_bytes)
            res = self._push_any(prep or full, full, tensors, chunk_bytes, version, mode, window, lane, progress,
                                 fanout, on_failure, serve_dtype)
            st = prep.delta_stats if prep is not None else None
            self.last_push = {"version": int(version), "kind": "delta" if prep is not None else "full",
                              "wire_bytes": (prep or full).total_bytes, "delta": st,
                              "full_pushes": [r.url for r in res if getattr(r, "delta_refused", False)]}
            if keep:
                self._keep(tensors, int(version))
            return res

    def push_adapter(self, name, tensors, version, alpha=None, rank=None, rslora=None, window=4,
                     chunk_bytes=16 << 20, lane=True, fanout=None, on_failure="abort", delta=None,
                     keep=True) -> List[PushResult]:
        """Pushes a LoRA adapter to every daemon under name as its version
        (Client.push_adapter's parameters; the checksums are computed once).
        fanout: "chain" (the default for 2 or more daemons: each byte sent
        once, relayed along the Pool's order, committed on all once every
        daemon has built it) or "direct". on_failure as push_weights'.
        delta: None or True sends deltas against this Pool's last push of
        that name (kept unless keep=False) where a tensor's dtype and size
        are the same; a daemon that refuses them (it holds another version)
        gets the adapter whole in this call; False sends it whole.
        Returns one PushResult per daemon; raises PoolError if any failed."""
        from .lora import adapter_push_args
        fanout = self._fanout(fanout, on_failure)
        items, adapter = adapter_push_args(name, tensors, alpha, rank, rslora)
        with self._lock:
            held = self._held_adapters.get(name)
            prep = full = None
            if delta is not False and held is not None:
                prep = D.prepare_delta(items, held[1], held[0], min(int(chunk_bytes), self._room()))
                if prep.delta_stats["delta_tensors"] == 0:
                    full, prep = prep, None
            if prep is None:
                full = full or self.prepare(items, chunk_bytes)
            res = self._push_any(prep or full, full, items, chunk_bytes, int(version), P.MODE_CONTINUE, window, lane,
                                 None, fanout, on_failure, adapter=adapter)
            st = prep.delta_stats if prep is not None else None
            self.last_push = {"version": int(version), "adapter": name, "kind": "delta" if prep is not None else "full",
                              "wire_bytes": (prep or full).total_bytes, "delta": st,
                              "full_pushes": [r.url for r in res if getattr(r, "delta_refused", False)]}
            if keep:
                kept = {}
                for k, x in items:
                    dt, _, b = D.tensor_bytes(x)
                    kept[k] = (dt, np.array(b, copy=True))
                self._held_adapters[name] = (int(version), kept)
            return res

    def _fanout(self, fanout, on_failure):
        """A push's fanout (None: "chain" for 2 or more daemons), its arguments checked."""
        if fanout is None:
            fanout = "chain" if len(self.clients) >= 2 else "direct"
        if fanout not in ("chain", "direct"):
            raise ValueError(f"fanout {fanout!r}; expected 'chain' or 'direct'")
        if on_failure not in ("abort", "commit"):
            raise ValueError(f"on_failure {on_failure!r}; expected 'abort' or 'commit'")
        return fanout

    def _room(self):
        return min(c._max for c in self.clients) - CHUNK_ROOM

    def _status_all(self):
        res = _run_all([(c.url, c.status) for c in self.clients])
        for _, r in res:
            if isinstance(r, BaseException):
                raise r
        return [r for _, r in res]

    def _keep(self, tensors, version):
        """Keeps a copy of the pushed bytes: the next push's base. The push
        succeeded, so the previous copy is no longer anyone's base: a tensor of
        the same size is copied into its memory (fresh pages cost more than
        the copy on a VM: 0.56 s for the default model's 269 MB here)."""
        items = tensors.items() if hasattr(tensors, "items") else tensors
        held = dict(self._held) if self._held else {}
        for name, x in items:
            dt, _, b = D.tensor_bytes(x)
            old = held.get(name)
            if old is not None and len(old[1]) == len(b) and old[1].flags.writeable:
                np.copyto(old[1], b)
                held[name] = (dt, old[1])
            else:
                held[name] = (dt, np.array(b, copy=True))
        self._held, self._held_version = held, version

    def _push_any(self, prep, full, tensors, chunk_bytes, version, mode, window, lane, progress, fanout,
                  on_failure, serve_dtype=None, adapter=None):
        """Pushes prep (a delta or a full update; adapter: a LoRA adapter's ADAPTER_BEGIN terms); daemons
        refusing a delta get full."""
        is_delta = full is None or prep is not full
        if fanout == "chain" and lane:
            ch = _Chain(self, prep, int(version), _mode(mode), int(window), on_failure, progress,
                        refusable=is_delta, serve=_serve(serve_dtype), adapter=adapter)
            res = ch.run()
            if res is not None:
                missing = [k for k, r in enumerate(res) if r is None]
                if missing:
                    full = full or self.prepare(tensors, chunk_bytes)
                    extra = _run_all([(k, (lambda k=k: self._full_one(self.clients[k], full, version, mode, window,
                                                                       lane, serve_dtype, adapter)))
                                      for k in missing])
                    bad = [(k, r) for k, r in extra if isinstance(r, BaseException)]
                    for k, r in extra:
                        res[k] = r
                    if bad:
                        raise PoolError(f"push of version {version} (full, to the daemons refusing the delta)",
                                        [(c.url, res[k]) for k, c in enumerate(self.clients)],
                                        [c.url for k, c in enumerate(self.clients)
                                         if isinstance(res[k], PushResult)])
                return res
        if not is_delta:
            return self._push_direct(prep, version, mode, window, lane, progress, serve_dtype, adapter)

        def one(c):
            try:
                return _push_one(c, prep, version, mode, window, lane, None, serve_dtype, adapter)
            except DaemonError as e:
                if e.code not in DELTA_REFUSALS:
                    raise
            return self._full_one(c, full or self.prepare(tensors, chunk_bytes), version, mode, window, lane,
                                  serve_dtype, adapter)
        res = _run_all([(c.url, (lambda c=c: one(c))) for c in self.clients])
        if any(isinstance(r, BaseException) for _, r in res):
            raise PoolError(f"push of version {version}", res, [u for u, r in res if isinstance(r, PushResult)])
        return [r for _, r in res]

    @staticmethod
    def _full_one(c, full, version, mode, window, lane, serve_dtype=None, adapter=None):
        r = _push_one(c, full, version, mode, window, lane, None, serve_dtype, adapter)
        r.delta_refused = True      # this daemon refused the delta and got the full version
        return r

    def _push_direct(self, prep, version, mode, window, lane, progress, serve_dtype=None, adapter=None):
        done = {c.url: 0 for c in self.clients}
        cb = None
        if progress:
            def cb_for(url):
                def f(d, total):
                    done[url] = d
                    if callable(progress):
                        progress(url, d, total)
                return f
            cb = cb_for
        jobs = [(c.url, (lambda c=c: _push_one(c, prep, version, mode, window, lane, cb(c.url) if cb else None,
                                                  serve_dtype, adapter)))
                for c in self.clients]
        if progress is True:
            res = self._with_progress_line(jobs, done, prep.total_bytes)
        else:
            res = _run_all(jobs)
        if any(isinstance(r, BaseException) for _, r in res):
            raise PoolError(f"push of version {version}", res,
                            [u for u, r in res if isinstance(r, PushResult)])
        return [r for _, r in res]

    @staticmethod
    def _with_progress_line(jobs, done, total):
        t0 = time.perf_counter()
        box = {}
        t = threading.Thread(target=lambda: box.setdefault("r", _run_all(jobs)), daemon=True)
        t.start()
        while True:
            t.join(0.25)
            dt = time.perf_counter() - t0
            line = " | ".join(f"{u} {100.0 * d / total:5.1f}% {d / 1e6 / dt if dt > 0 else 0:.0f} MB/s"
                              for u, d in done.items())
            sys.stderr.write("\r" + line + ("\n" if not t.is_alive() else "   "))
            sys.stderr.flush()
            if not t.is_alive():
                return box["r"]

    def status(self) -> List[dict]:
        """Each daemon's /status document, in the Pool's order."""
        with self._lock:
            res = _run_all([(c.url, c.status) for c in self.clients])
        for _, r in res:
            if isinstance(r, BaseException):
                raise r
        return [r for _, r in res]

    manifest = None     # {HF name: shape} push_tensors checks against (rolloutd.tensors.fetch_manifest)

    def push_tensors(self, named_tensors, version, dtype=None, manifest=None, partial=False, **push_kw):
        """Pushes a trainer's tensors: any iterable of (HF name, array) pairs or a dict, NumPy
        arrays or torch tensors (CPU or CUDA, brought to the host one at a time and never all
        at once), as version; dtype "bf16" | "f16" | "f32" converts them on the way (None:
        each tensor's own). Checked first against manifest ({name: shape}; default
        self.manifest, which fleet pools fetch from GET /weights_manifest): names the model
        does not have, its tensors missing (unless partial=True) and wrong shapes raise one
        rolloutd.tensors.TensorMismatch listing them all, before UPDATE_BEGIN (nothing staged
        or committed). push_kw: push_weights' (fanout, on_failure, mode, window, ...)."""
        from .tensors import push_tensors
        return push_tensors(self, named_tensors, version, dtype, manifest, partial, **push_kw)


def _push_one(c, prep, version, mode, window, lane, progress, serve_dtype, adapter):
    """One daemon's direct push: weights (Client.push_weights), or an adapter's ADAPTER_BEGIN transfer."""
    if adapter is None:
        return c.push_weights(prep, version, mode=mode, window=window, lane=lane, progress=progress,
                              serve_dtype=serve_dtype)
    return _Push(c, c.prepare(prep), int(version), _mode(mode), int(window), lane, progress, adapter=adapter).run()


def _numeric_host(url):
    """The numeric address a relaying daemon dials for url's daemon (IPv4 first, as the daemons
    bind what their URLs say)."""
    host = _url_host(url) or "127.0.0.1"
    infos = socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)
    infos.sort(key=lambda i: i[0] != socket.AF_INET)
    return infos[0][4][0]


class _Chain:
    """One chained push (PROTOCOL.md §10.11): UPDATE_BEGIN on every daemon,
    UPDATE_FORWARD from each to the next, this process feeding the first;
    UPDATE_PREPARE polls until every daemon has verified and built the update;
    then UPDATE_COMMIT on all (or UPDATE_ABORT on all)."""

    def __init__(self, pool, prep, version, mode, window, on_failure, progress, refusable=False, serve=0,
                 adapter=None):
        self.pool, self.prep, self.version, self.mode = pool, prep, version, mode
        self.refusable = refusable  # a delta: daemons refusing it at BEGIN leave the chain (pushed whole after)
        self.refused = {}           # index -> the DaemonError: not in the chain, its result None
        self.window, self.on_failure, self.progress = window, on_failure, progress
        self.clients = pool.clients
        self.pushes = [_Push(c, prep, version, mode, window, True, None, serve, adapter) for c in self.clients]
        self.errors = {}            # index -> exception: that daemon is out of the chain
        self.feeders = {}           # index -> (thread, box): this process sends to that daemon
        self.next_of = {}           # index -> the index it forwards to
        self.t_staged = None        # when every daemon had every byte

    def alive(self):
        return [i for i in range(len(self.clients)) if i not in self.errors and i not in self.refused]

    def run(self):
        """The PushResults, or None to push directly instead (a daemon without a lane or relay)."""
        for c in self.clients:
            if not (c.info.features & P.FEATURE_RELAY):
                return None
        t0 = time.perf_counter()
        begun = _run_all([(k, self.pushes[k].begin) for k in range(len(self.clients))])
        for k, r in begun:
            if self.refusable and isinstance(r, DaemonError) and r.code in DELTA_REFUSALS:
                self.refused[k] = r
            elif isinstance(r, BaseException):
                self.errors[k] = r
        if any(not isinstance(r, BaseException) and not r.data_port for _, r in begun):
            for k in self.alive():
                self.pushes[k].abort()
            return None     # no data lane (TLS): the direct push
        try:
            if self.errors and self.on_failure == "abort":
                raise _Failed()
            alive = self.alive()
            if not alive and self.refused and not self.errors:
                return [None] * len(self.clients)   # every daemon refused the delta: all get it whole
            if not alive:
                raise _Failed()
            smallest = min(self.pushes[k].begin_ok.max_chunk_bytes for k in alive)
            prep = self.prep if smallest >= self.prep.chunk_bytes else self.prep.rechunk(smallest)
            for k in alive:
                self.pushes[k].use(prep)
            for a, b in zip(alive, alive[1:]):
                try:
                    self.forward(a, b)
                except DaemonError as e:
                    if e.code != P.E.FORBIDDEN:
                        raise
                    # b is outside a's relay_allow: this process feeds b itself; the chain goes on from b.
            t1 = time.perf_counter()
            fed_by = set(self.next_of.values())
            for k in alive:
                if k not in fed_by:
                    self.feed(k)
            self.wait_prepared()
            t2 = self.t_staged or time.perf_counter()
            if self.errors and self.on_failure == "abort":
                raise _Failed()
        except BaseException as e:
            for k in self.alive():
                self.pushes[k].abort()
            self.stop_feeders()
            if isinstance(e, _Failed):
                raise PoolError(f"chained push of version {self.version} (aborted everywhere)", self.outcomes({}))
            raise
        self.stop_feeders()
        committed = _run_all([(k, self.pushes[k]._commit) for k in self.alive()])
        results = {}
        for k, r in committed:
            if isinstance(r, BaseException):
                self.errors[k] = r
            else:
                results[k] = self.pushes[k].result(r, t0=t0, t1=t1, t2=t2, fanout="chain",
                                                   hop=self.hop(k))
        if self.errors:
            raise PoolError(f"chained push of version {self.version}", self.outcomes(results),
                            [self.clients[k].url for k in results])
        return [results.get(k) for k in range(len(self.clients))]

    def outcomes(self, results):
        out = []
        for k, c in enumerate(self.clients):
            if k in results:
                out.append((c.url, results[k]))
            elif k in self.errors:
                out.append((c.url, self.errors[k]))
            else:
                out.append((c.url, RuntimeError("aborted: another daemon of the chain failed")))
        return out

    def hop(self, k):
        """How many daemons the chunks passed before k (0: fed by this process)."""
        if k in self.feeders:
            return 0
        prev = {b: a for a, b in self.next_of.items()}
        n = 0
        while k in prev:
            k = prev[k]
            n += 1
        return n

    def forward(self, a, b):
        """Daemon a relays to daemon b from now on (everything it has first)."""
        ca, cb = self.clients[a], self.clients[b]
        pa, pb = self.pushes[a], self.pushes[b]
        key, flags = b"\0" * P.AUTH_BYTES, 0
        if cb._secret is not None:
            key, flags = lane_key(cb._secret, pb.xfer), P.FORWARD_AUTH
            if ca._secret is not None:      # wrapped: a stays the only one who can read it
                key = bytes(x ^ y for x, y in zip(key, wrap_pad(ca._secret, pa.xfer, pb.xfer)))
        ca._call(P.UpdateForward(xfer_id=pa.xfer, next_xfer_id=pb.xfer, port=pb.begin_ok.data_port, flags=flags,
                                 window=min(self.window, pb.window), key=key, host=_numeric_host(cb.url)),
                 P.T.UPDATE_FORWARD_OK, POLL_TIMEOUT_MS, retries=2)
        self.next_of[a] = b

    def feed(self, k):
        """This process sends every chunk to daemon k (in a thread)."""
        box = {}
        push = self.pushes[k]

        def go():
            try:
                push.send()
            except BaseException as e:
                box["error"] = e
        t = threading.Thread(target=go, name="rolloutd-chain-feed", daemon=True)
        t.start()
        self.feeders[k] = (t, box)

    def stop_feeders(self):
        for k, (t, _) in list(self.feeders.items()):
            if t.is_alive():
                self.pushes[k].fail(RuntimeError("the chained push ended"))
                self.pushes[k]._interrupt()
            t.join(10)

    def drop(self, k, err):
        """Daemon k is out: its predecessor (or this process) feeds its successor."""
        if k in self.errors:
            return
        self.errors[k] = err
        prev = [a for a, b in self.next_of.items() if b == k]
        succ = self.next_of.pop(k, None)
        while succ is not None and succ in self.errors:
            succ = self.next_of.get(succ)
        if k in self.feeders:
            t, _ = self.feeders.pop(k)
            self.pushes[k].fail(RuntimeError("dropped from the chain"))
            self.pushes[k]._interrupt()
        for a in prev:
            del self.next_of[a]
        if succ is None:
            return
        for a in prev:
            if a not in self.errors:
                try:
                    self.forward(a, succ)
                    return
                except (DaemonError, TimeoutError_, ConnectionError, pynng.NNGException):
                    pass        # a's staging is gone, or a is gone too: this process feeds succ
        if succ not in self.feeders:
            self.feed(succ)

    def wait_prepared(self):
        last, t_last = -1, time.monotonic()
        while True:
            if self.errors and self.on_failure == "abort":
                return      # aborted everywhere by run()
            states = {}
            for k in self.alive():
                try:
                    states[k] = self.clients[k]._call(P.UpdatePrepare(xfer_id=self.pushes[k].xfer),
                                                      P.T.UPDATE_PREPARE_OK, POLL_TIMEOUT_MS, retries=1)
                except (DaemonError, TimeoutError_, ConnectionError, pynng.NNGException, P.ProtoError) as e:
                    self.drop(k, e)
            for k, (t, box) in list(self.feeders.items()):
                if not t.is_alive() and "error" in box and k not in self.errors:
                    self.drop(k, box["error"])
            alive = self.alive()
            if not alive:
                return
            if self.t_staged is None and all(k in states and states[k].bytes_staged == states[k].total_bytes
                                             for k in alive):
                self.t_staged = time.perf_counter()     # every byte everywhere: the transfer's end
            if all(k in states and states[k].state == P.PREP_READY for k in alive):
                if self.progress is True:
                    sys.stderr.write("\n")
                return
            for a, b in list(self.next_of.items()):     # a relay that failed while b still answers: again once
                st = states.get(a)
                if st is not None and st.forward == P.FWD_FAILED and b not in self.errors:
                    try:
                        self.forward(a, b)
                    except (DaemonError, TimeoutError_, ConnectionError, pynng.NNGException) as e:
                        if isinstance(e, DaemonError) and e.code == P.E.FORBIDDEN:
                            del self.next_of[a]     # a may not relay to b: this process feeds b itself
                            if b not in self.feeders:
                                self.feed(b)
                            continue
                        self.drop(b, ConnectionError(f"{self.clients[a].url} cannot relay to "
                                                     f"{self.clients[b].url}"))
            done = sum(st.bytes_staged for st in states.values())
            if callable(self.progress):
                for k, st in states.items():
                    self.progress(self.clients[k].url, st.bytes_staged, st.total_bytes)
            elif self.progress:
                sys.stderr.write("\r" + " | ".join(
                    f"{self.clients[k].url} {100.0 * st.bytes_staged / max(1, st.total_bytes):5.1f}%"
                    + (" ready" if st.state == P.PREP_READY else "") for k, st in sorted(states.items())) + "   ")
                sys.stderr.flush()
            now = time.monotonic()
            if done != last:
                last, t_last = done, now
            elif now - t_last > CHUNK_TIMEOUT_MS / 1000:
                for k in alive:
                    if states.get(k) is None or states[k].state != P.PREP_READY:
                        self.drop(k, TimeoutError_(f"{self.clients[k].url}: no progress of the chained push "
                                                   f"in {CHUNK_TIMEOUT_MS / 1000:.0f} s"))
            time.sleep(POLL_S)


class _Failed(Exception):
    """A chain member failed and on_failure is "abort"."""
