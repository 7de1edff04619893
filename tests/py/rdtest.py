"""Helpers shared by the tests (and tools/bench_*.py) that drive a real rolloutd: the one
daemon lifecycle (start on free loopback ports, wait for /health, stop cleanly on SIGTERM),
free_port, and for the raw protocol rpc over a pynng req0 socket and FETCH loops."""
import json
import os
import random
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pynng

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import BUILD, MODEL, ROOT, TMP  # noqa: E402

sys.path.insert(0, os.path.join(ROOT, "tools", "python"))
from rolloutd import proto  # noqa: E402

PROMPT = [1, 9690, 314, 253, 1345, 2914, 28]


def _ephemeral_low():
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 0


_EPHEMERAL_LOW = _ephemeral_low()
_handed_out = set()


def _port_range():
    """This process's share of 20000..ephemeral: tests/run.sh runs RD_PORT_SLOTS files at once and
    gives each its own slice (RD_PORT_SLOT), so two files never pick the same port."""
    lo, hi = 20000, _EPHEMERAL_LOW
    try:
        slot, slots = int(os.environ.get("RD_PORT_SLOT", "0")), int(os.environ.get("RD_PORT_SLOTS", "1"))
    except ValueError:
        slot, slots = 0, 1
    if slots > 1 and 0 <= slot < slots:
        width = (hi - lo) // slots
        lo, hi = lo + slot * width, lo + (slot + 1) * width
    return lo, hi


_PORT_LO, _PORT_HI = _port_range()
_pick = random.Random(os.getpid() ^ time.time_ns())


def free_port():
    """A loopback TCP port free right now (the one place the tests and benches pick ports).

    Picked below the kernel's ephemeral range where there is room: a port the kernel hands out
    for bind(0) can be handed again to an outgoing connection (a client dialling another daemon)
    before the daemon that was given it binds it, and the daemon then fails to start. Ports
    outside that range are never assigned by the kernel (nor are Ray's workers' 10002-19999, so
    the range starts at 20000); this process never hands one out twice, and files run side by side
    by tests/run.sh pick from separate slices of the range."""
    if _PORT_HI - _PORT_LO >= 1000:
        for _ in range(200):
            port = _pick.randrange(_PORT_LO, _PORT_HI)  # above Ray's worker ports (10002-19999)
            if port in _handed_out:
                continue
            with socket.socket() as s:
                try:
                    s.bind(("127.0.0.1", port))
                except OSError:
                    continue
            _handed_out.add(port)
            return port
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    _handed_out.add(port)
    return port


class Daemon:
    """build/rolloutd on free loopback ports; its stdout and stderr go to a log under RD_TMP.

    extra: more flags. config: a file under the repository, None for no --config. model: the
    default model unless given. listen: the learner socket (tcp://127.0.0.1:<free port> unless
    given). http_host: where the HTTP server binds, on a free port. env: variables added to the
    daemon's environment. With wait, returns once
    /health answers 200 and raises with the log's tail if the daemon exits or timeout s pass;
    wait=False returns at once (for a start that must fail)."""

    def __init__(self, *extra, config="configs/test.json", model=None, listen=None, http_host="127.0.0.1",
                 wait=True, timeout=60, env=None):
        self.port, self.http_port = free_port(), free_port()
        self.url = listen or f"tcp://127.0.0.1:{self.port}"
        self.log = open(os.path.join(TMP, f"rolloutd-{self.port}.log"), "w+")
        cfg = ["--config", os.path.join(ROOT, config)] if config else []
        self.proc = subprocess.Popen(
            [os.path.join(BUILD, "rolloutd"), *cfg, "--model", model or MODEL, "--listen", self.url,
             "--status-listen", f"{http_host}:{self.http_port}", *map(str, extra)],
            stdout=self.log, stderr=subprocess.STDOUT, cwd=ROOT, env={**os.environ, **(env or {})})
        if wait:
            self.wait_healthy(timeout)

    def wait_healthy(self, timeout=60):
        deadline = time.time() + timeout
        while True:
            try:
                if self.http("/health")[0] == 200:
                    return
            except OSError:
                pass
            if self.proc.poll() is not None or time.time() > deadline:
                self.kill()
                raise AssertionError(f"rolloutd did not start: {self.tail()}")
            time.sleep(0.1)

    def output(self):
        """Everything the daemon has written so far."""
        self.log.flush()
        self.log.seek(0)
        return self.log.read()

    def tail(self):
        return self.output()[-3000:]

    def http(self, path, method="GET"):
        req = urllib.request.Request(f"http://127.0.0.1:{self.http_port}{path}", method=method)
        try:
            with urllib.request.urlopen(req, timeout=10) as r:
                return r.status, r.headers.get("Content-Type", ""), r.read().decode()
        except urllib.error.HTTPError as e:
            return e.code, e.headers.get("Content-Type", ""), e.read().decode()

    def post(self, path, obj, timeout=120):
        """(status, decoded JSON answer) of a JSON POST to the HTTP server."""
        req = urllib.request.Request(f"http://127.0.0.1:{self.http_port}{path}", data=json.dumps(obj).encode(),
                                     method="POST", headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=timeout) as r:
                return r.status, json.loads(r.read())
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read() or b"null")

    def sock(self):
        return pynng.Req0(dial=self.url, recv_timeout=20000, send_timeout=5000, resend_time=-1)

    def exits_cleanly(self, timeout=60):
        """After a SIGTERM: exit status 0 within timeout s, and no sanitizer report in the log
        (under the ASan build: nothing leaked). Fails with the log's tail."""
        try:
            rc = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(f"rolloutd did not exit within {timeout} s of SIGTERM: {self.tail()}")
        log = self.tail()
        assert rc == 0 and "LeakSanitizer" not in log and "ERROR: AddressSanitizer" not in log, (rc, log)

    def stop(self, timeout=30):
        """SIGTERM, killed if still running after timeout s; returns the exit status. For
        clean-ups and benchmarks: it asserts nothing (exits_cleanly does)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.kill()
        return self.proc.returncode

    def kill(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def stop_cleanly(*daemons, timeout=60):
    """SIGTERM to all the daemons first (they drain at the same time), then each must exit cleanly."""
    for d in daemons:
        d.proc.send_signal(signal.SIGTERM)
    for d in daemons:
        d.exits_cleanly(timeout)


def rpc(s, m):
    s.send(m if isinstance(m, (bytes, bytearray)) else proto.encode(m))
    return proto.decode(s.recv())


def hello(s):
    r = rpc(s, proto.Hello(client_name="test_daemon_basic"))
    assert isinstance(r, proto.HelloOk), r
    return r


def fetch_all(s, cid, want, ack=0, timeout=120):
    """FETCHes until `want` results arrived; returns ({seq: result}, last ack)."""
    got = {}
    deadline = time.time() + timeout
    while len(got) < want:
        assert time.time() < deadline, f"only {len(got)} of {want} results"
        r = rpc(s, proto.Fetch(client_id=cid, ack_seq=ack, max_results=64, wait_ms=1000))
        assert isinstance(r, proto.Results), r
        for x in r.results:
            if x.seq > ack:
                got[x.seq] = x
                ack = x.seq
    return got, ack


def greedy(rid, max_tokens, prompt=PROMPT, n=1, flags=0):
    return proto.Request(client_req_id=rid, n=n, max_tokens=max_tokens, temperature=0.0, flags=flags,
                         prompt_ids=prompt)


def status(d):
    code, _, body = d.http("/status")
    assert code == 200, (code, body)
    return json.loads(body)
