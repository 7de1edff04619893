#!/usr/bin/env python3
"""The shared secret on the learner socket (PROTOCOL.md §14), against a real
rolloutd started with auth_token_file:

- without authenticating, HELLO, SUBMIT and STATUS get UNAUTHORIZED and
  nothing is admitted;
- a wrong secret is refused at AUTH (and the challenge is spent: the right
  proof cannot follow it without a new AUTH_BEGIN);
- a captured AUTH replayed on another connection, alone or after that
  connection's own AUTH_BEGIN, is refused;
- the right secret (Python client, rolloutctl through ROLLOUTD_AUTH_TOKEN_FILE)
  works, and the daemon's AUTH_OK proof is of the same secret;
- with a secret the daemon may bind a non-loopback address and the same
  secret is the HTTP Bearer key;
- its data lane challenges every connection (§10.12): no LANE_AUTH, a
  LANE_AUTH with a wrong proof, one for another transfer, or a replayed one
  (another connection's challenge) is refused with UNAUTHORIZED and nothing
  is staged; the right one stages the chunk.
The proofs are computed here with Python's hmac/hashlib, independently of
proto/auth.c."""
import hashlib
import hmac
import json
import os
import socket
import struct
import subprocess
import sys
import time
import urllib.error
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import BUILD, MODEL, TMP, case, main  # noqa: E402
from rdtest import Daemon, free_port, greedy, proto, rpc  # noqa: E402

from rolloutd import Client, DaemonError  # noqa: E402
from rolloutd.crc32c import crc32c  # noqa: E402

SECRET = b"s3cret-for-the-test-0123456789abcdef"
_d = {}


def secret_file(name, data):
    path = os.path.join(TMP, name)
    with open(path, "wb") as f:
        f.write(data + b"\n")
    os.chmod(path, 0o600)
    return path


def daemon():
    if "d" not in _d:
        _d["file"] = secret_file("auth-secret", SECRET)
        _d["d"] = Daemon("--auth-token-file", _d["file"])
    return _d["d"]


def proof(secret, daemon_side, cn, dn):
    label = b"rolloutd auth v1 daemon" if daemon_side else b"rolloutd auth v1 client"
    data = label + (cn + dn if daemon_side else dn + cn)
    return hmac.new(secret, data, hashlib.sha256).digest()


def handshake(s, secret):
    cn = os.urandom(32)
    ch = rpc(s, proto.AuthBegin(bytes=cn))
    assert isinstance(ch, proto.AuthChallenge), ch
    auth = proto.encode(proto.Auth(bytes=proof(secret, False, cn, ch.bytes)))
    return cn, ch.bytes, auth, rpc(s, auth)


def unauthorized(r, what):
    assert isinstance(r, proto.Error) and r.code == proto.E.UNAUTHORIZED, f"{what}: {r}"


@case
def nothing_is_served_before_auth():
    d = daemon()
    with d.sock() as s:
        unauthorized(rpc(s, proto.Hello(client_name="no-auth")), "HELLO")
        unauthorized(rpc(s, proto.Submit(client_id=1, requests=[greedy(1, 4)])), "SUBMIT")
        unauthorized(rpc(s, proto.Status()), "STATUS")
        unauthorized(rpc(s, proto.Auth(bytes=b"\0" * 32)), "AUTH without a challenge")
    code, _, body = d.http("/status")
    assert code == 401, f"/status without the Bearer key: {code}"


@case
def wrong_secret_is_refused_and_spends_the_challenge():
    d = daemon()
    with d.sock() as s:
        cn = os.urandom(32)
        ch = rpc(s, proto.AuthBegin(bytes=cn))
        unauthorized(rpc(s, proto.Auth(bytes=proof(b"not-the-secret-at-all!!", False, cn, ch.bytes))), "wrong")
        unauthorized(rpc(s, proto.Auth(bytes=proof(SECRET, False, cn, ch.bytes))), "right proof after a wrong one")
        unauthorized(rpc(s, proto.Hello(client_name="x")), "HELLO after failures")
    try:
        Client(d.url, auth_token=b"not-the-secret-at-all!!")
        raise AssertionError("a client with a wrong secret connected")
    except DaemonError as e:
        assert e.code == proto.E.UNAUTHORIZED, e


@case
def replayed_auth_is_refused():
    d = daemon()
    with d.sock() as a:
        cn, dn, auth, ok = handshake(a, SECRET)
        assert isinstance(ok, proto.AuthOk), ok
        assert ok.bytes == proof(SECRET, True, cn, dn), "the daemon's proof is not of the secret"
        assert isinstance(rpc(a, proto.Hello(client_name="authed")), proto.HelloOk)
        with d.sock() as b:
            unauthorized(rpc(b, auth), "replayed AUTH alone")
            ch = rpc(b, proto.AuthBegin(bytes=cn))      # even with the same client nonce
            assert isinstance(ch, proto.AuthChallenge) and ch.bytes != dn, "the daemon nonce repeated"
            unauthorized(rpc(b, auth), "replayed AUTH after a new challenge")
            unauthorized(rpc(b, proto.Hello(client_name="replay")), "HELLO after a replay")


@case
def right_secret_generates_and_status_counts_nothing_insecure():
    d = daemon()
    with Client(d.url, auth_token_file=_d["file"]) as c:
        out = list(c.generate([[1, 9690, 314]], max_tokens=4, temperature=0.0))
        assert len(out) == 1 and len(out[0].token_ids) == 4, out
    req = urllib.request.Request(f"http://127.0.0.1:{d.http_port}/status",
                                 headers={"Authorization": "Bearer " + SECRET.decode()})
    with urllib.request.urlopen(req, timeout=10) as r:
        doc = json.loads(r.read())
    assert doc["insecure"] is False and doc["http"]["auth"] is True, (doc["insecure"], doc["http"])
    env = dict(os.environ, ROLLOUTD_AUTH_TOKEN_FILE=_d["file"])
    r = subprocess.run([os.path.join(BUILD, "rolloutctl"), "--connect", d.url, "status", "--json"], env=env,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and json.loads(r.stdout)["model"], (r.returncode, r.stderr)
    env.pop("ROLLOUTD_AUTH_TOKEN_FILE")
    r = subprocess.run([os.path.join(BUILD, "rolloutctl"), "--connect", d.url, "status"], env=env,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode != 0 and "UNAUTHORIZED" in r.stderr, (r.returncode, r.stderr)


@case
def update_weights_from_disk_proves_the_secret_too():
    # the route pushes through the daemon's own learner socket, so it must authenticate like any client
    d = daemon()
    body = json.dumps({"model_path": MODEL, "weight_version": "7"}).encode()
    req = urllib.request.Request(f"http://127.0.0.1:{d.http_port}/update_weights_from_disk", data=body,
                                 headers={"Authorization": "Bearer " + SECRET.decode(),
                                          "Content-Type": "application/json"}, method="POST")
    with urllib.request.urlopen(req, timeout=300) as r:
        doc = json.loads(r.read())
    assert doc["success"] is True and doc["weight_version"] == "7", doc


def lane_key(secret, xfer):
    return hmac.new(secret, b"rolloutd lane key v1" + struct.pack("<Q", xfer), hashlib.sha256).digest()


def lane_proof(key, nonce, xfer):
    return hmac.new(key, b"rolloutd lane v1" + nonce + struct.pack("<Q", xfer), hashlib.sha256).digest()


def recv_frame(sock):
    head = b""
    while len(head) < 16:
        k = sock.recv(16 - len(head))
        if not k:
            return None
        head += k
    n = struct.unpack_from("<I", head, 8)[0]
    body = b""
    while len(body) < n:
        k = sock.recv(n - len(body))
        if not k:
            return None
        body += k
    return proto.decode(head + body, 0)


def closed(sock):
    try:
        return sock.recv(1) == b""
    except OSError:
        return True


@case
def with_a_secret_a_network_address_is_allowed_and_the_lane_authenticates():
    port = free_port()
    d = Daemon("--auth-token-file", secret_file("auth-secret-2", SECRET), "--listen", f"tcp://0.0.0.0:{port}")
    data = bytes(range(256)) * 9                     # 2304 bytes = model.norm.weight in f32 (576 floats)
    crc = crc32c(data)
    try:
        with Client(f"tcp://127.0.0.1:{port}", auth_token=SECRET) as c:
            ok = c._call(proto.UpdateBegin(client_id=c.client_id, version=5, window=1, max_chunk_bytes=1 << 20,
                                           total_bytes=4 * 576, tensors=[proto.Tensor(name="model.norm.weight", dtype=0,
                                                                                      shape=[576], nbytes=4 * 576,
                                                                                      crc32c=crc)]),
                         proto.T.UPDATE_BEGIN_OK)
            assert ok.data_port, "with a secret the data lane should be on, authenticated"
            x = ok.xfer_id
            chunk = struct.pack("<4sHHIIQIIQII", proto.MAGIC, proto.VERSION, proto.T.UPDATE_CHUNK, 32 + len(data), 0,
                                x, 0, 0, 0, crc, len(data)) + data

            def staged():
                return c._call(proto.UpdatePrepare(xfer_id=x), proto.T.UPDATE_PREPARE_OK).bytes_staged

            def lane():
                s = socket.create_connection(("127.0.0.1", ok.data_port), timeout=20)
                ch = recv_frame(s)
                assert isinstance(ch, proto.AuthChallenge), ch
                return s, ch.bytes

            key = lane_key(SECRET, x)
            # 0: a connection that never answers its challenge is cut (5 s), not held
            s, _ = lane()
            t0 = time.time()
            s.settimeout(20)
            assert closed(s) and time.time() - t0 < 12, "a silent lane connection was held open"
            # 1: a chunk with no LANE_AUTH
            s, nonce = lane()
            s.sendall(chunk)
            r = recv_frame(s)
            assert isinstance(r, proto.Error) and r.code == proto.E.UNAUTHORIZED, r
            assert closed(s) and staged() == 0
            # 2: a wrong proof (another secret), 3: the right proof for another transfer id
            for secret, xid in ((b"not-the-secret-0123456789", x), (SECRET, x + 1)):
                s, nonce = lane()
                proof = lane_proof(lane_key(secret, xid), nonce, xid)
                s.sendall(proto.encode(proto.LaneAuth(xfer_id=xid, proof=proof)) + chunk)
                r = recv_frame(s)
                assert isinstance(r, proto.Error) and r.code == proto.E.UNAUTHORIZED, r
                assert closed(s) and staged() == 0
            # 4: a proof captured on one connection, replayed on another (a new challenge)
            s1, nonce1 = lane()
            captured = proto.encode(proto.LaneAuth(xfer_id=x, proof=lane_proof(key, nonce1, x)))
            s1.close()
            s, _ = lane()
            s.sendall(captured + chunk)
            r = recv_frame(s)
            assert isinstance(r, proto.Error) and r.code == proto.E.UNAUTHORIZED, r
            assert closed(s) and staged() == 0
            # 5: the right proof on its own challenge stages the chunk
            s, nonce = lane()
            s.sendall(proto.encode(proto.LaneAuth(xfer_id=x, proof=lane_proof(key, nonce, x))) + chunk)
            r = recv_frame(s)
            assert isinstance(r, proto.UpdateChunkOk) and r.bytes_staged == len(data), r
            s.close()
            assert staged() == len(data)
            c._call(proto.UpdateAbort(xfer_id=x), proto.T.UPDATE_ABORT_OK)
    finally:
        d.kill()


@case
def a_short_secret_file_is_refused_at_start():
    r = subprocess.run([os.path.join(BUILD, "rolloutd"), "--auth-token-file", secret_file("auth-short", b"short"),
                        "--listen", f"tcp://127.0.0.1:{free_port()}", "--http-listen", f"127.0.0.1:{free_port()}"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode != 0 and "auth_token_file" in r.stderr and "16" in r.stderr, (r.returncode, r.stderr[-500:])


if __name__ == "__main__":
    try:
        main()
    finally:
        if "d" in _d:
            _d["d"].kill()
