"""The data lane's connection bound, max_lane_connections (PROTOCOL.md §10.10), against a real daemon:

- 1,000 lane connections opened at once, none of them sending anything: the daemon keeps serving
  (/health, a generation), at most max_lane_connections (16) stay open (rolloutd:lane_connections),
  the rest are evicted oldest first (rolloutd:lane_connections_evicted_total), and a real push over
  the lane still succeeds while the flood's sockets are still open; the same with a shared secret
  (every flood connection is challenged and none proves itself);
- when every open connection is a proven sender (max_lane_connections 2, each has fed a chunk of the
  open transfer), a newcomer gets ERROR BUSY and is closed (..._refused_total), and the senders keep
  feeding: the transfer completes and commits;
- the daemons exit cleanly."""
import os
import socket
import sys
import tempfile
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import TMP, case, main  # noqa: E402
from rdtest import Daemon, free_port, stop_cleanly  # noqa: E402
from pushdata import perturbed_bf16  # noqa: E402

from rolloutd import Client, proto  # noqa: E402
import rolloutd.client as rc  # noqa: E402

SECRET = "lane-limit-secret-0123456789abcdef"
FLOOD = 1000
_daemons = []


def daemon(*extra):
    d = Daemon(*extra)
    _daemons.append(d)
    return d


def metric(d, name):
    """A value from /metrics (with the daemon's secret, its HTTP key, when it has one)."""
    req = urllib.request.Request(f"http://127.0.0.1:{d.http_port}/metrics")
    if getattr(d, "secret", None):
        req.add_header("Authorization", f"Bearer {d.secret}")
    with urllib.request.urlopen(req, timeout=10) as r:
        body = r.read().decode()
    for line in body.splitlines():
        if line.startswith(f"rolloutd:{name}{{"):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"no rolloutd:{name} in /metrics")


def flood(port, n):
    """n TCP connections to the lane, all started at once (non-blocking connects), left silent."""
    socks = []
    for _ in range(n):
        s = socket.socket()
        s.setblocking(False)
        s.connect_ex(("127.0.0.1", port))
        socks.append(s)
    return socks


def generate_one(d, secret=None):
    with Client(d.url, name="probe", auth_token=secret) as c:
        out = c.generate([[1, 260, 33, 97, 151, 201, 28]], max_tokens=4, temperature=0.0, ignore_eos=True)
        assert len(out[0].token_ids) == 4


def flood_then_push(secret=None):
    lane = free_port()
    extra = ["--update-listen", f"127.0.0.1:{lane}"]
    if secret:
        path = os.path.join(tempfile.mkdtemp(prefix="rd-lanelimit-", dir=TMP), "secret")
        with open(path, "w") as f:
            f.write(secret + "\n")
        os.chmod(path, 0o600)
        extra += ["--auth-token-file", path]
    d = daemon(*extra)
    d.secret = secret
    assert metric(d, "lane_connections") == 0
    socks = flood(lane, FLOOD)
    try:
        deadline = time.time() + 60
        most = 0
        while True:
            open_now = metric(d, "lane_connections")
            most = max(most, open_now)
            evicted = metric(d, "lane_connections_evicted_total")
            if evicted >= FLOOD - 16 or time.time() > deadline:
                break
            time.sleep(0.1)
        assert evicted == FLOOD - 16 and metric(d, "lane_connections") == 16, (evicted, open_now)
        assert most <= 16, most
        assert metric(d, "lane_connections_refused_total") == 0
        assert d.http("/health")[0] == 200          # public
        generate_one(d, secret)
        # a real push over the lane, the flood's sockets still open on this side
        w = perturbed_bf16(7)
        tensors = {k: w[k] for k in list(w)[:4]}
        with Client(d.url, name="pusher", auth_token=secret) as c:
            r = c.push_weights(tensors, version=2, chunk_bytes=1 << 16)
            assert r.version == 2 and r.lane, r
        with Client(d.url, name="probe", auth_token=secret) as c:
            assert c.info.weight_version == 2
        assert metric(d, "lane_connections") <= 16
        if not secret:  # (with one, the flood's last 16 are cut 5 s after their accept: no LANE_AUTH came)
            assert metric(d, "lane_connections_evicted_total") == FLOOD - 16 + 1  # the pusher made room
    finally:
        for s in socks:
            s.close()
    stop_cleanly(d)


@case
def a_thousand_silent_lane_connections_leave_the_daemon_serving():
    flood_then_push()


@case
def the_same_with_a_secret():
    flood_then_push(SECRET)


def read_frame(s, timeout=10):
    s.settimeout(timeout)
    buf = b""
    while len(buf) < proto.HEADER_BYTES:
        got = s.recv(proto.HEADER_BYTES - len(buf))
        if not got:
            return None
        buf += got
    body = int.from_bytes(buf[8:12], "little")
    while len(buf) < proto.HEADER_BYTES + body:
        got = s.recv(proto.HEADER_BYTES + body - len(buf))
        if not got:
            return None
        buf += got
    return proto.decode(buf)


@case
def a_newcomer_gets_busy_when_every_connection_is_a_sender():
    lane = free_port()
    d = daemon("--update-listen", f"127.0.0.1:{lane}", "--max-lane-connections", "2")
    w = perturbed_bf16(8)
    with Client(d.url, name="pusher") as c:
        # a tensor of a few chunks (the smallest of at least three 64 KiB chunks; a tiny model's largest, in 4 KiB ones)
        big = sorted((a.nbytes, k) for k, a in w.items())
        fit = [k for n, k in big if n >= 3 * 65536]
        name, chunk = (fit[0], 65536) if fit else (big[-1][1], 4096)
        prep = c.prepare({name: w[name]}, chunk_bytes=chunk)
        assert len(prep.chunks) >= 3, len(prep.chunks)
        push = rc._Push(c, prep, 2, 0, 8, True, None)
        push.begin()
        senders = []
        for i in range(2):                  # each proves itself with one chunk of the open transfer
            s = socket.create_connection(("127.0.0.1", lane))
            ti, off, n, crc = push.p.chunks[i]
            s.sendall(rc._chunk_head(push.xfer, i, ti, off, crc, n) + bytes(push.p.data[ti][off:off + n]))
            ok = read_frame(s)
            assert isinstance(ok, proto.UpdateChunkOk) and ok.chunk_seq == i, ok
            senders.append(s)
        late = socket.create_connection(("127.0.0.1", lane))
        busy = read_frame(late)
        assert isinstance(busy, proto.Error) and busy.code == proto.E.BUSY and "max_lane_connections" in busy.message, \
            busy
        assert late.recv(1) == b"", "the refused connection stays open"
        late.close()
        assert metric(d, "lane_connections_refused_total") == 1
        assert metric(d, "lane_connections_evicted_total") == 0
        assert metric(d, "lane_connections") == 2
        # the senders were not cut: one of them feeds the rest, and the transfer commits
        s = senders[0]
        for i in range(2, len(push.p.chunks)):
            ti, off, n, crc = push.p.chunks[i]
            s.sendall(rc._chunk_head(push.xfer, i, ti, off, crc, n) + bytes(push.p.data[ti][off:off + n]))
            ok = read_frame(s)
            assert isinstance(ok, proto.UpdateChunkOk) and ok.chunk_seq == i, ok
        for s in senders:
            s.close()
        r = c._call(proto.UpdateCommit(xfer_id=push.xfer), proto.T.UPDATE_COMMIT_OK, 60000)
        assert r.version == 2, r
    stop_cleanly(d)


if __name__ == "__main__":
    try:
        main()
    finally:
        for d in _daemons:
            d.kill()
