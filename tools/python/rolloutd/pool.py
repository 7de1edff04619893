"""Many rolloutd daemons as one: rollouts spread over them, weight pushes to all.

    from rolloutd import Pool
    with Pool(["tcp://10.0.0.1:7070", "tcp://10.0.0.2:7070"]) as pool:
        samples = pool.generate(prompts, n=8, max_tokens=64, temperature=0.8, seed=1)
        results = pool.push_weights(tensors, version=2)     # one PushResult per daemon

generate() and stream() take the parameters of Client.generate(); prompt i goes
to daemon i mod len(urls) (round robin), the daemons run concurrently (a
thread each), and samples keep the index of their prompt in the call.
push_weights() checksums the tensors once (a PreparedUpdate) and pushes them
to every daemon at once, each with its own window and data lane (PROTOCOL.md
§10.8); it raises PoolError, holding every daemon's outcome, if any failed.
A Pool is used by one thread at a time (its calls take a lock).
"""
import queue
import sys
import threading
import time
from typing import List

from .client import DaemonError, PreparedUpdate, PushResult, Sample, TimeoutError_, Client, CHUNK_ROOM  # noqa: F401


class PoolError(Exception):
    """At least one daemon failed. outcomes: [(url, PushResult or exception)]
    in the Pool's order; errors: {url: exception} for the failed ones."""

    def __init__(self, what, outcomes):
        self.outcomes = outcomes
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

    def _split(self, prompts, params):
        """Round robin: [(client, its prompts, its params, its prompt -> call index map)]."""
        seed = params.get("seed")
        per_prompt_seed = isinstance(seed, (list, tuple)) or hasattr(seed, "shape")
        if per_prompt_seed and len(seed) != len(prompts):
            raise ValueError(f"seed has {len(seed)} entries for {len(prompts)} prompts")
        parts = []
        n = len(self.clients)
        for k, c in enumerate(self.clients):
            idx = list(range(k, len(prompts), n))
            if not idx:
                continue
            p = dict(params)
            if per_prompt_seed:
                p["seed"] = [seed[i] for i in idx]
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
                     progress=None) -> List[PushResult]:
        """Pushes the tensors to every daemon at once as policy `version`
        (Client.push_weights' parameters; the checksums are computed once).
        Returns one PushResult per daemon, in the Pool's order; raises
        PoolError (every daemon's outcome in .outcomes) if any failed.
        progress: True for one stderr line with every daemon, or a
        callable(url, bytes_done, total)."""
        with self._lock:
            prep = self.prepare(tensors, chunk_bytes)
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
            jobs = [(c.url, (lambda c=c: c.push_weights(prep, version, mode=mode, window=window, lane=lane,
                                                           progress=cb(c.url) if cb else None)))
                    for c in self.clients]
            if progress is True:
                res = self._with_progress_line(jobs, done, prep.total_bytes)
            else:
                res = _run_all(jobs)
        if any(isinstance(r, BaseException) for _, r in res):
            raise PoolError(f"push of version {version}", res)
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
