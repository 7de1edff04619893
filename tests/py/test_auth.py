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
- with a secret the daemon may bind a non-loopback address, its data lane is
  off (UPDATE_BEGIN_OK data_port 0), and the same secret is the HTTP Bearer key.
The proofs are computed here with Python's hmac/hashlib, independently of
proto/auth.c."""
import hashlib
import hmac
import json
import os
import subprocess
import sys
import urllib.error
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import BUILD, MODEL, TMP, case, main  # noqa: E402
from rdtest import Daemon, free_port, greedy, proto, rpc  # noqa: E402

from rolloutd import Client, DaemonError  # noqa: E402

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


@case
def with_a_secret_a_network_address_is_allowed_and_the_lane_is_off():
    port = free_port()
    d = Daemon("--auth-token-file", secret_file("auth-secret-2", SECRET), "--listen", f"tcp://0.0.0.0:{port}")
    try:
        with Client(f"tcp://127.0.0.1:{port}", auth_token=SECRET) as c:
            ok = c._call(proto.UpdateBegin(client_id=c.client_id, version=5, window=1, max_chunk_bytes=1 << 20,
                                           total_bytes=4 * 576, tensors=[proto.Tensor(name="model.norm.weight", dtype=0,
                                                                                      shape=[576], nbytes=4 * 576,
                                                                                      crc32c=0)]),
                         proto.T.UPDATE_BEGIN_OK)
            assert ok.data_port == 0, f"the data lane is on ({ok.data_port}) although it has no authentication"
            c._call(proto.UpdateAbort(xfer_id=ok.xfer_id), proto.T.UPDATE_ABORT_OK)
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
