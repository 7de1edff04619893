#!/usr/bin/env python3
"""The learner socket over TLS (tls+tcp://, NNG's TLS transport with mbedTLS),
with certificates made here by the openssl command line tool:

- a round trip (Python client, rolloutctl) that verifies the daemon's
  self-signed certificate against it as the CA and the URL's host name;
- a client trusting another CA, and a plain tcp:// client, get nothing;
- the data lane is off under TLS (UPDATE_BEGIN_OK data_port 0: weight chunks
  stay inside the encrypted socket);
- TLS and the shared secret together;
- a missing certificate is an error at start naming the key."""
import json
import os
import subprocess
import sys

import pynng

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import BUILD, TMP, case, main  # noqa: E402
from rdtest import Daemon, free_port, proto  # noqa: E402

from rolloutd import Client  # noqa: E402

_d = {}


def make_cert(name):
    key, cert = os.path.join(TMP, f"{name}.key"), os.path.join(TMP, f"{name}.crt")
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
                    "-keyout", key, "-out", cert, "-days", "2", "-subj", "/CN=localhost",
                    "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1"],
                   check=True, capture_output=True)
    return cert, key


def tls_daemon(*extra):
    cert, key = _d.setdefault("pair", make_cert("rd-tls"))
    port = free_port()
    d = Daemon("--listen", f"tls+tcp://127.0.0.1:{port}", "--tls-cert-file", cert, "--tls-key-file", key, *extra)
    return d, f"tls+tcp://localhost:{port}", cert


@case
def round_trip_verifies_the_daemon():
    d, url, cert = tls_daemon()
    try:
        with Client(url, tls_ca_file=cert) as c:
            out = list(c.generate([[1, 9690, 314]], max_tokens=4, temperature=0.0))
            assert len(out) == 1 and len(out[0].token_ids) == 4, out
            ok = c._call(proto.UpdateBegin(client_id=c.client_id, version=3, window=1, max_chunk_bytes=1 << 20,
                                           total_bytes=4 * 576,
                                           tensors=[proto.Tensor(name="model.norm.weight", dtype=0, shape=[576],
                                                                 nbytes=4 * 576, crc32c=0)]),
                         proto.T.UPDATE_BEGIN_OK)
            assert ok.data_port == 0, f"a plain-TCP data lane ({ok.data_port}) next to a TLS socket"
            c._call(proto.UpdateAbort(xfer_id=ok.xfer_id), proto.T.UPDATE_ABORT_OK)
        env = dict(os.environ, ROLLOUTD_TLS_CA_FILE=cert)
        r = subprocess.run([os.path.join(BUILD, "rolloutctl"), "--connect", url, "status", "--json"], env=env,
                           capture_output=True, text=True, timeout=60)
        assert r.returncode == 0 and json.loads(r.stdout)["model"], (r.returncode, r.stderr)
        # another CA: the handshake fails, nothing is answered
        other, _ = make_cert("rd-tls-other")
        s = pynng.Req0(resend_time=-1, recv_timeout=1500, send_timeout=1500)
        s.tls_config = pynng.TLSConfig(pynng.TLSConfig.MODE_CLIENT, server_name="localhost", ca_files=[other],
                                       auth_mode=pynng.TLSConfig.AUTH_MODE_REQUIRED)
        try:
            s.dial(url, block=False)
            s.send(proto.encode(proto.Status()))
            s.recv()
            raise AssertionError("a client trusting another CA got an answer")
        except pynng.NNGException:
            pass
        finally:
            s.close()
        # plain TCP to the TLS port
        s = pynng.Req0(resend_time=-1, recv_timeout=1500, send_timeout=1500)
        try:
            s.dial(url.replace("tls+tcp://", "tcp://"), block=False)
            s.send(proto.encode(proto.Status()))
            s.recv()
            raise AssertionError("a plain TCP client got an answer from the TLS socket")
        except pynng.NNGException:
            pass
        finally:
            s.close()
        assert d.http("/health")[0] == 200, "the daemon stopped serving"
    finally:
        d.kill()


@case
def tls_with_the_shared_secret():
    secret = os.path.join(TMP, "tls-secret")
    with open(secret, "w") as f:
        f.write("another-secret-0123456789\n")
    os.chmod(secret, 0o600)
    d, url, cert = tls_daemon("--auth-token-file", secret)
    try:
        with Client(url, tls_ca_file=cert, auth_token_file=secret) as c:
            assert c.info.vocab_size > 0
        s = pynng.Req0(resend_time=-1, recv_timeout=10000)
        s.tls_config = pynng.TLSConfig(pynng.TLSConfig.MODE_CLIENT, server_name="localhost", ca_files=[cert],
                                       auth_mode=pynng.TLSConfig.AUTH_MODE_REQUIRED)
        s.dial(url, block=True)
        s.send(proto.encode(proto.Hello(client_name="tls-no-secret")))
        r = proto.decode(s.recv())
        s.close()
        assert isinstance(r, proto.Error) and r.code == proto.E.UNAUTHORIZED, r
    finally:
        d.kill()


@case
def missing_certificate_is_an_error_at_start():
    r = subprocess.run([os.path.join(BUILD, "rolloutd"), "--listen", f"tls+tcp://127.0.0.1:{free_port()}",
                        "--http-listen", f"127.0.0.1:{free_port()}"], capture_output=True, text=True, timeout=120)
    assert r.returncode != 0 and "tls_cert_file" in r.stderr, (r.returncode, r.stderr[-600:])


if __name__ == "__main__":
    main()
