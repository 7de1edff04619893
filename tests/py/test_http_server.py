"""The daemon's HTTP server for real: build/rolloutd on loopback, driven over
raw sockets and http.client. Keep-alive (1,000 requests on one connection),
pipelining in order, request bodies (Content-Length and chunked) against the
404/405 paths, 413 before the body is sent, 431, 400, slowloris eviction and
the header timeout, the idle keep-alive timeout, Bearer auth, and the bind
rule for non-loopback addresses. After every abuse case /health and /status
must still answer. The main daemon ends with SIGTERM and must exit 0 (under
the ASan build that includes the leak check)."""
import http.client
import json
import os
import socket
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import BUILD, TMP, case, main  # noqa: E402

from rdtest import Daemon, stop_cleanly  # noqa: E402

HEADER_TIMEOUT_MS = 3000
IDLE_TIMEOUT_MS = 2000
MAX_BODY = 1 << 20
MAX_CONNS = 64
BODY_BUDGET = 3 * MAX_BODY + 64  # max_http_inflight_body_bytes: three bodies of the largest size
KEY = "k3y-for-the-test_0123456789"

D = None


def daemon():
    global D
    if D is None:
        D = Daemon("--http-header-timeout-ms", HEADER_TIMEOUT_MS, "--http-idle-timeout-ms", IDLE_TIMEOUT_MS,
                   "--max-http-body-bytes", MAX_BODY, "--http-max-connections", MAX_CONNS,
                   "--max-http-inflight-body-bytes", BODY_BUDGET)
    return D


def status(d, headers=None):
    c = http.client.HTTPConnection("127.0.0.1", d.http_port, timeout=10)
    c.request("GET", "/status", headers=headers or {})
    r = c.getresponse()
    body = r.read()
    c.close()
    assert r.status == 200, (r.status, body)
    return json.loads(body)


def still_serving(d, headers=None):
    assert d.http("/health")[:2] == (200, "application/json"), "no /health"
    doc = status(d, headers)
    assert doc["backend"] == "cpu" and "kv_cache" in doc, doc


def raw(d, timeout=10):
    return socket.create_connection(("127.0.0.1", d.http_port), timeout=timeout)


class _Sock:
    """Lets http.client.HTTPResponse read one response after another from one
    buffered file (several pipelined responses arrive in one read); the
    response's close of its file is dropped."""
    class _File:
        def __init__(self, f):
            self._f = f

        def __getattr__(self, name):
            return getattr(self._f, name)

        def close(self):
            pass

    def __init__(self, f):
        self.f = self._File(f)

    def makefile(self, *a, **k):
        return self.f


def read_response(f, method="GET"):
    r = http.client.HTTPResponse(_Sock(f), method=method)
    r.begin()
    return r.status, dict((k.lower(), v) for k, v in r.getheaders()), r.read()


def closed_within(s, seconds):
    """True when the server closes s within seconds (EOF or reset)."""
    s.settimeout(seconds)
    try:
        while True:
            if not s.recv(65536):
                return True
    except (ConnectionResetError, BrokenPipeError):
        return True
    except socket.timeout:
        return False


@case
def keep_alive_1000_requests_on_one_connection():
    d = daemon()
    c = http.client.HTTPConnection("127.0.0.1", d.http_port, timeout=10)
    c.connect()
    sock, local = c.sock, c.sock.getsockname()
    for i in range(1000):
        path = ("/health", "/status", "/metrics")[i % 3]
        c.request("GET", path)
        r = c.getresponse()
        body = r.read()
        assert r.status == 200 and body, (i, r.status)
        assert r.getheader("Connection") == "keep-alive", r.getheaders()
        assert c.sock is sock and c.sock.getsockname() == local, f"request {i} reconnected"
    c.close()
    doc = status(d)
    assert doc["http"]["requests"] >= 1000, doc["http"]


@case
def pipelined_requests_in_one_write_answered_in_order():
    d = daemon()
    with raw(d) as s:
        s.sendall(b"GET /health HTTP/1.1\r\nHost: t\r\n\r\n"
                  b"GET /status HTTP/1.1\r\nHost: t\r\n\r\n"
                  b"GET /nope HTTP/1.1\r\nHost: t\r\n\r\n"
                  b"HEAD /metrics HTTP/1.1\r\nHost: t\r\n\r\n"
                  b"GET /metrics HTTP/1.1\r\nHost: t\r\n\r\n"
                  b"POST /status HTTP/1.1\r\nHost: t\r\nContent-Length: 0\r\n\r\n"
                  b"GET /health HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n")
        f = s.makefile("rb")
        st, h, body = read_response(f)
        assert st == 200 and json.loads(body) == {"status": "ok"}, (st, body)
        st, h, body = read_response(f)
        assert st == 200 and "kv_cache" in json.loads(body), (st, body[:200])
        st, h, body = read_response(f)
        assert st == 404 and json.loads(body)["error"] == "not found", (st, body)
        st, h, body = read_response(f, method="HEAD")
        assert st == 200 and body == b"" and int(h["content-length"]) > 0, (st, h)
        st, h, body = read_response(f)
        assert st == 200 and b"rolloutd:num_requests_running" in body, (st, body[:200])
        st, h, body = read_response(f)
        assert st == 405 and h["allow"] == "GET, HEAD" and json.loads(body)["error"] == "method not allowed", (st, h)
        st, h, body = read_response(f)
        assert st == 200 and h["connection"] == "close", (st, h)
        assert f.read() == b""  # closed after Connection: close
    still_serving(d)


@case
def request_bodies_by_length_and_chunked_keep_the_connection_in_step():
    d = daemon()
    with raw(d) as s:
        f = s.makefile("rb")
        # A chunked body to a known path with the wrong method: 405 once the body is consumed ...
        s.sendall(b"POST /health HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n")
        for chunk in (b'{"prompt": ', b'"hello"', b"}"):
            s.sendall(b"%x\r\n%s\r\n" % (len(chunk), chunk))
            time.sleep(0.02)
        s.sendall(b"0\r\n\r\n")
        st, h, body = read_response(f)
        assert st == 405 and h["connection"] == "keep-alive", (st, h, body)
        # ... and a Content-Length body to an unknown path: 404.
        payload = b"x" * 100000
        s.sendall(b"POST /v0/nothing HTTP/1.1\r\nHost: t\r\nContent-Length: %d\r\n\r\n" % len(payload) + payload)
        st, h, body = read_response(f)
        assert st == 404, (st, body)
        # The connection is still in step: the next request is parsed as one.
        s.sendall(b"GET /health HTTP/1.1\r\nHost: t\r\n\r\n")
        st, h, body = read_response(f)
        assert st == 200 and json.loads(body) == {"status": "ok"}, (st, body)
    still_serving(d)


@case
def declared_body_over_the_limit_gets_413_before_it_is_sent():
    d = daemon()
    with raw(d) as s:
        s.sendall(b"POST /status HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
                  b"Content-Length: 1000000000000\r\n\r\n")
        f = s.makefile("rb")
        st, h, body = read_response(f)  # no body byte was sent
        assert st == 413 and h["connection"] == "close", (st, h)
        assert "max_http_body_bytes" in json.loads(body)["detail"], body
        assert closed_within(s, 10)
    still_serving(d)


@case
def chunked_body_growing_over_the_limit_gets_413_and_close():
    d = daemon()
    with raw(d) as s:
        s.sendall(b"POST /health HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n")
        block = b"y" * 65536
        try:
            for _ in range(2 * MAX_BODY // len(block)):
                s.sendall(b"10000\r\n" + block + b"\r\n")
        except (BrokenPipeError, ConnectionResetError):
            pass
        st, h, body = read_response(s.makefile("rb"))
        assert st == 413 and h["connection"] == "close", (st, h)
        assert closed_within(s, 10)
    still_serving(d)


@case
def bodies_held_at_once_are_bounded_server_wide():
    """max_http_inflight_body_bytes: connections that each declare a large body and send it slowly fill the
    budget; the next large one gets 503 before its body is sent, a small one still fits, and once a held
    body's connection goes the room is back."""
    d = daemon()
    head = (b"POST /status HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n"
            % MAX_BODY)
    slow = []
    for _ in range(3):
        s = raw(d)
        s.sendall(head + b"x" * 100)
        slow.append(s)
    time.sleep(0.2)
    assert status(d)["http"]["body_bytes"] == 3 * (MAX_BODY + 1), status(d)["http"]
    with raw(d) as s:
        s.sendall(head)
        st, h, body = read_response(s.makefile("rb"))
        assert st == 503 and h["connection"] == "close", (st, h, body)
        assert "max_http_inflight_body_bytes" in json.loads(body)["detail"], body
    with raw(d) as s:  # 11 bytes still fit
        s.sendall(b"POST /status HTTP/1.1\r\nHost: t\r\nContent-Length: 10\r\n\r\n0123456789")
        st, h, body = read_response(s.makefile("rb"))
        assert st == 405, (st, body)
    slow.pop().close()
    deadline = time.time() + 5
    while status(d)["http"]["body_bytes"] > 2 * (MAX_BODY + 1):
        assert time.time() < deadline, status(d)["http"]
        time.sleep(0.05)
    with raw(d) as s:
        s.sendall(head + b"y" * MAX_BODY)
        st, h, body = read_response(s.makefile("rb"))
        assert st == 405, (st, body)
    for s in slow:
        s.close()
    deadline = time.time() + 5
    while status(d)["http"]["body_bytes"] > 0:
        assert time.time() < deadline, status(d)["http"]
        time.sleep(0.05)
    assert status(d)["http"]["body_refused"] >= 1
    still_serving(d)


@case
def huge_headers_get_431_and_garbage_400():
    d = daemon()
    with raw(d) as s:
        s.sendall(b"GET /health HTTP/1.1\r\nHost: t\r\nX-Huge: " + b"h" * 65536 + b"\r\n\r\n")
        st, h, body = read_response(s.makefile("rb"))
        assert st == 431 and json.loads(body)["error"] == "request header fields too large", (st, body)
    still_serving(d)
    with raw(d) as s:
        s.sendall(b"GET /health HTTP/1.1\r\n" + b"".join(b"X-%d: v\r\n" % i for i in range(100)) + b"\r\n")
        assert read_response(s.makefile("rb"))[0] == 431
    for junk in (b"\x00\x01garbage\r\n\r\n", b"GET /health HTTP/7.1\r\n\r\n", b"GET /health HTTP/1.1\r\nNo colon\r\n\r\n",
                 b"POST /health HTTP/1.1\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n",
                 b"POST /health HTTP/1.1\r\nContent-Length: -3\r\n\r\n"):
        with raw(d) as s:
            s.sendall(junk)
            st, h, body = read_response(s.makefile("rb"))
            assert st == 400 and json.loads(body)["error"] == "bad request", (junk, st, body)
            assert closed_within(s, 10), junk
        still_serving(d)


@case
def slowloris_connections_are_evicted_and_then_timed_out():
    d = daemon()
    before = status(d)["http"]
    half = []
    for i in range(150):
        s = raw(d)
        s.sendall(b"GET /health HTTP/1.1\r\nHost: t\r\nX-Slow: ")
        half.append(s)
    # /health is admitted at once by evicting the oldest half-sent request.
    t0 = time.time()
    assert d.http("/health")[0] == 200
    doc = status(d)["http"]
    assert doc["evicted"] - before["evicted"] >= 150 - MAX_CONNS, doc
    assert doc["connections"] <= MAX_CONNS, doc
    # The ones left are closed by the header timeout.
    for s in half:
        assert closed_within(s, HEADER_TIMEOUT_MS / 1000 + 10), "a half-sent request outlived the header timeout"
        s.close()
    assert time.time() - t0 >= HEADER_TIMEOUT_MS / 1000 * 0.5, "closed before the header timeout"
    doc = status(d)["http"]
    assert doc["timed_out"] - before["timed_out"] >= 1, doc
    still_serving(d)


@case
def idle_keep_alive_connection_is_closed_after_the_idle_timeout():
    d = daemon()
    with raw(d) as s:
        f = s.makefile("rb")
        s.sendall(b"GET /health HTTP/1.1\r\nHost: t\r\n\r\n")
        assert read_response(f)[0] == 200
        time.sleep(IDLE_TIMEOUT_MS / 1000 / 2)  # within the idle time: still usable
        s.sendall(b"GET /health HTTP/1.1\r\nHost: t\r\n\r\n")
        assert read_response(f)[0] == 200
        t0 = time.time()
        assert closed_within(s, IDLE_TIMEOUT_MS / 1000 + 10), "idle connection never closed"
        assert time.time() - t0 >= IDLE_TIMEOUT_MS / 1000 * 0.8, time.time() - t0
    still_serving(d)


@case
def bearer_key_guards_every_route_but_health():
    keyfile = os.path.join(TMP, f"api-key-{os.getpid()}")
    with open(keyfile, "w") as f:
        f.write(KEY + "\n")
    os.chmod(keyfile, 0o600)
    a = Daemon("--api-key-file", keyfile)
    try:
        good = {"Authorization": f"Bearer {KEY}"}
        for path in ("/status", "/metrics", "/nope"):
            for hdrs in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": f"Bearer {KEY}x"},
                         {"Authorization": f"Basic {KEY}"}):
                c = http.client.HTTPConnection("127.0.0.1", a.http_port, timeout=10)
                c.request("GET", path, headers=hdrs)
                r = c.getresponse()
                body = r.read()
                assert r.status == 401, (path, hdrs, r.status)
                assert r.getheader("WWW-Authenticate") == "Bearer", r.getheaders()
                assert json.loads(body)["error"] == "unauthorized", body
                c.close()
        assert a.http("/health")[0] == 200  # probes carry no key
        # A body without the key: 401 before the body is sent, then close.
        with raw(a) as s:
            s.sendall(b"POST /status HTTP/1.1\r\nHost: t\r\nContent-Length: 50000000\r\n\r\n")
            st, h, body = read_response(s.makefile("rb"))
            assert st == 401 and h["www-authenticate"] == "Bearer" and h["connection"] == "close", (st, h)
            assert closed_within(s, 10)
        doc = status(a, good)
        assert doc["http"]["auth"] is True and doc["http"]["insecure"] is False, doc["http"]
        c = http.client.HTTPConnection("127.0.0.1", a.http_port, timeout=10)
        c.request("GET", "/metrics", headers=good)
        r = c.getresponse()
        assert r.status == 200 and b"rolloutd:" in r.read()
        c.request("GET", "/nope", headers=good)
        r = c.getresponse()
        assert r.status == 404, r.status
        r.read()
        c.close()
        still_serving(a, good)
    finally:
        a.kill()
        os.remove(keyfile)


@case
def non_loopback_bind_needs_a_key_or_the_insecure_flag():
    d = Daemon(http_host="0.0.0.0", wait=False)
    try:
        rc = d.proc.wait(timeout=120)
    finally:
        d.kill()
    text = d.output()
    assert rc == 1, (rc, text[-2000:])
    assert "0.0.0.0" in text and "api_key_file" in text and "http_insecure" in text, text[-2000:]
    d = Daemon("--http-insecure", "true", http_host="0.0.0.0")
    try:
        doc = status(d)
        assert doc["http"]["insecure"] is True and doc["http"]["auth"] is False, doc["http"]
        assert doc["http"]["listen"] == f"0.0.0.0:{d.http_port}", doc["http"]
    finally:
        d.kill()


@case
def both_listen_names_must_agree():
    r = subprocess.run([os.path.join(BUILD, "rolloutd"), "--http-listen", "127.0.0.1:1", "--status-listen",
                        "127.0.0.1:2"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "status-listen" in r.stderr and "http-listen" in r.stderr, (r.returncode, r.stderr)


@case
def sigterm_exits_zero_after_the_abuse():
    d = daemon()
    still_serving(d)
    stop_cleanly(d)


if __name__ == "__main__":
    try:
        main()
    finally:
        if D is not None:
            D.kill()
