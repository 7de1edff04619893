"""The HTTP API over TLS (http_tls_cert_file / http_tls_key_file; daemon/http_tls.c, mbedTLS), with a
CA and a server certificate made here by the openssl command line tool:

- the `openai` package, trusting the CA file, against https://localhost: completions, and chat and
  completions streams whose deltas add up to the whole answer; a client that does not trust the CA
  gets no answer;
- /update_weights_from_disk over HTTPS while the learner socket is TLS too (the daemon's own push goes
  through an inproc listener): the next version serves, with the same tokens from the same file;
- a plain HTTP request to the HTTPS port gets a plain 400 "this port speaks HTTPS" and is closed; a
  broken handshake and a client that leaves mid-stream are closed too; the daemon keeps serving
  (/status counts the plain request);
- a certificate file that is not there stops the start, naming the key;
- SIGTERM: exit 0 (under the ASan build: no leak)."""
import json
import os
import socket
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import MODEL, TMP, case, main  # noqa: E402
from rdtest import Daemon, free_port  # noqa: E402

import openai  # noqa: E402

PROMPT = [1, 260, 33, 97, 151, 201, 28]  # ids of any test model
_tmp = tempfile.mkdtemp(prefix="rd-https-", dir=TMP)
_d = {}


def sh(*args):
    subprocess.run(args, check=True, capture_output=True)


def make_pki():
    """A CA, and a server certificate it signed for localhost and 127.0.0.1."""
    ca_key, ca, key, csr, cert = (os.path.join(_tmp, n) for n in ("ca.key", "ca.crt", "srv.key", "srv.csr", "srv.crt"))
    ext = os.path.join(_tmp, "srv.ext")
    with open(ext, "w") as f:
        f.write("subjectAltName=DNS:localhost,IP:127.0.0.1\nbasicConstraints=CA:FALSE\n")
    sh("openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
       "-keyout", ca_key, "-out", ca, "-days", "2", "-subj", "/CN=rolloutd test CA")
    sh("openssl", "req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes", "-keyout", key,
       "-out", csr, "-subj", "/CN=localhost")
    sh("openssl", "x509", "-req", "-in", csr, "-CA", ca, "-CAkey", ca_key, "-CAcreateserial", "-out", cert,
       "-days", "2", "-extfile", ext)
    return ca, cert, key


def pki():
    if "pki" not in _d:
        _d["pki"] = make_pki()
    return _d["pki"]


def ctx():
    return ssl.create_default_context(cafile=pki()[0])


def https(d, path, body=None, timeout=60):
    req = urllib.request.Request(f"https://localhost:{d.http_port}{path}", method="POST" if body is not None else "GET",
                                 data=json.dumps(body).encode() if body is not None else None,
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout, context=ctx()) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"null")


def daemon():
    """One daemon: HTTPS, and the learner socket on TLS with the same certificate."""
    if "d" not in _d:
        ca, cert, key = pki()
        port = free_port()
        d = Daemon("--http-tls-cert-file", cert, "--http-tls-key-file", key, "--tls-cert-file", cert,
                   "--tls-key-file", key, listen=f"tls+tcp://127.0.0.1:{port}", wait=False)
        deadline = time.time() + 60
        while True:
            try:
                if https(d, "/health", timeout=5)[0] == 200:
                    break
            except OSError:
                pass
            if d.proc.poll() is not None or time.time() > deadline:
                d.kill()
                raise AssertionError(f"rolloutd did not start: {d.tail()}")
            time.sleep(0.2)
        _d["d"] = d
    return _d["d"]


NAME = os.path.basename(MODEL)[:-len(".gguf")]   # the name the daemon serves the model under


def oai(verify=True):
    ca = pki()[0]
    http = openai.DefaultHttpxClient(verify=ca if verify else True)
    return openai.OpenAI(base_url=f"https://localhost:{daemon().http_port}/v1", api_key="none", max_retries=0,
                         timeout=60, http_client=http)


def serving(d):
    st, body = https(d, "/health")
    assert st == 200, (st, body)


@case
def openai_over_https_with_the_ca_file():
    c = oai()
    r = c.completions.create(model=NAME, prompt=PROMPT, max_tokens=6, temperature=0,
                             extra_body={"return_token_ids": True})
    assert len(r.choices[0].model_dump()["token_ids"]) == 6, r
    whole = c.completions.create(model=NAME, prompt="Once upon a time", max_tokens=8, n=2, seed=3)
    chunks = list(c.completions.create(model=NAME, prompt="Once upon a time", max_tokens=8, n=2, seed=3, stream=True,
                                       stream_options={"include_usage": True}))
    texts = {}
    for ch in chunks:
        if ch.choices:
            texts[ch.choices[0].index] = texts.get(ch.choices[0].index, "") + ch.choices[0].text
    assert len(chunks) > 4 and [texts[0], texts[1]] == [x.text for x in whole.choices], (texts, whole)
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens >= 2, chunks[-1]
    msgs = [{"role": "user", "content": "Say hi."}]
    full = c.chat.completions.create(model=NAME, messages=msgs, max_tokens=8, temperature=0)
    parts = [ch.choices[0].delta.content or "" for ch in
             c.chat.completions.create(model=NAME, messages=msgs, max_tokens=8, temperature=0, stream=True)
             if ch.choices]
    assert "".join(parts) == full.choices[0].message.content and len(parts) > 2, (parts, full)
    # a client that does not trust the CA gets nothing
    try:
        oai(verify=False).completions.create(model=NAME, prompt=PROMPT, max_tokens=2)
        raise AssertionError("a client without the CA file was answered")
    except openai.APIConnectionError:
        pass
    serving(daemon())


@case
def update_weights_from_disk_over_https():
    d = daemon()
    st, before = https(d, "/generate", {"input_ids": PROMPT, "sampling_params": {"max_new_tokens": 6,
                                                                                  "temperature": 0}})
    assert st == 200, before
    v = int(https(d, "/get_model_info")[1]["weight_version"])
    st, r = https(d, "/update_weights_from_disk", {"model_path": MODEL, "weight_version": str(v + 1)}, timeout=300)
    assert st == 200 and r["success"] is True and r["weight_version"] == str(v + 1), (st, r, d.tail())
    st, after = https(d, "/generate", {"input_ids": PROMPT, "sampling_params": {"max_new_tokens": 6,
                                                                                 "temperature": 0}})
    assert after["output_ids"] == before["output_ids"], "the same weights give the same tokens"
    assert after["meta_info"]["weight_version"] == str(v + 1), after["meta_info"]


def raw(d, data, timeout=10):
    """Sends data on a plain TCP connection; everything the daemon answers until it closes."""
    with socket.create_connection(("127.0.0.1", d.http_port), timeout=timeout) as s:
        s.sendall(data)
        out = b""
        while True:
            try:
                got = s.recv(65536)
            except ConnectionResetError:
                return out
            if not got:
                return out
            out += got


@case
def plain_http_to_the_https_port_is_refused_cleanly():
    d = daemon()
    out = raw(d, b"GET /health HTTP/1.1\r\nHost: localhost\r\n\r\n")
    head, _, body = out.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 400 "), out
    assert b"Connection: close" in head and b"this port speaks HTTPS" in body, out
    assert json.loads(body)["error"] == "bad request", body
    # urllib over http:// gets the same 400
    try:
        urllib.request.urlopen(f"http://127.0.0.1:{d.http_port}/health", timeout=10)
        raise AssertionError("plain HTTP was served")
    except urllib.error.HTTPError as e:
        assert e.code == 400 and b"HTTPS" in e.read()
    # a handshake record of garbage: closed, with at most a TLS alert record (type 21)
    out = raw(d, b"\x16\x03\x01\x00\x05hello" + b"\x00" * 64)
    assert out == b"" or out[0] == 21, out
    # a stream client that leaves after its first event
    s = ctx().wrap_socket(socket.create_connection(("127.0.0.1", d.http_port), timeout=30), server_hostname="localhost")
    body = json.dumps({"model": NAME, "prompt": "Tell a long story", "max_tokens": 200, "stream": True,
                       "ignore_eos": True}).encode()
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
              b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
    got = b""
    while b"data: " not in got:
        got += s.recv(4096)
    assert got.startswith(b"HTTP/1.1 200"), got
    s.close()
    serving(d)
    st, status = https(d, "/status")
    h = status["http"]
    assert h["tls"] is True and h["tls_plain_refused"] == 2 and h["tls_failed"] >= 1, h
    r = oai().completions.create(model=NAME, prompt=PROMPT, max_tokens=3, temperature=0)
    assert r.choices[0].text, r


@case
def a_missing_certificate_stops_the_start():
    d = Daemon("--http-tls-cert-file", os.path.join(_tmp, "none.crt"), "--http-tls-key-file",
               os.path.join(_tmp, "none.key"), wait=False)
    rc = d.proc.wait(60)
    assert rc != 0 and "http_tls_cert_file" in d.output(), (rc, d.tail())
    d = Daemon("--http-tls-cert-file", pki()[1], wait=False)
    rc = d.proc.wait(60)
    assert rc == 2 and "http_tls_key_file" in d.output(), (rc, d.tail())


@case
def sigterm_exits_cleanly():
    d = daemon()
    serving(d)
    d.proc.send_signal(15)
    d.exits_cleanly(60)
    _d.pop("d")


if __name__ == "__main__":
    try:
        main()
    finally:
        if "d" in _d:
            _d["d"].kill()
