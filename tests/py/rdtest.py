"""Helpers shared by the tests that drive a real rolloutd over the raw
protocol: a daemon on free loopback ports, rpc over a pynng req0 socket, and
FETCH loops."""
import json
import os
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


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


class Daemon:
    def __init__(self, *extra, config="configs/test.json", model=None):
        self.port, self.http_port = free_port(), free_port()
        self.url = f"tcp://127.0.0.1:{self.port}"
        self.log = open(os.path.join(TMP, f"rolloutd-{self.port}.log"), "w+")
        self.proc = subprocess.Popen(
            [os.path.join(BUILD, "rolloutd"), "--config", os.path.join(ROOT, config),
             "--model", model or MODEL, "--listen", self.url, "--status-listen", f"127.0.0.1:{self.http_port}",
             *map(str, extra)],
            stdout=self.log, stderr=subprocess.STDOUT, cwd=ROOT)
        deadline = time.time() + 60
        while True:
            try:
                if self.http("/health")[0] == 200:
                    break
            except OSError:
                pass
            if self.proc.poll() is not None or time.time() > deadline:
                raise AssertionError(f"rolloutd did not start: {self.tail()}")
            time.sleep(0.1)

    def tail(self):
        self.log.flush()
        self.log.seek(0)
        return self.log.read()[-3000:]

    def http(self, path, method="GET"):
        req = urllib.request.Request(f"http://127.0.0.1:{self.http_port}{path}", method=method)
        try:
            with urllib.request.urlopen(req, timeout=10) as r:
                return r.status, r.headers.get("Content-Type", ""), r.read().decode()
        except urllib.error.HTTPError as e:
            return e.code, e.headers.get("Content-Type", ""), e.read().decode()

    def sock(self):
        return pynng.Req0(dial=self.url, recv_timeout=20000, send_timeout=5000, resend_time=-1)

    def kill(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


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
