#!/usr/bin/env python3
"""Loopback by default (DESIGN.md, Security): without a shared secret
(auth_token_file, test_auth.py) the daemon refuses to put the learner socket
or the data lane on a non-loopback address unless started with insecure = 1,
and /status then says "insecure": true. Real daemons on this machine's addresses; the refusals are
checked by exit status and the message naming the key."""
import json
import os
import subprocess
import sys
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import BUILD, MODEL, ROOT, TMP, case, main  # noqa: E402
from rdtest import free_port  # noqa: E402


def start(listen, *flags):
    http_port = free_port()
    log = open(os.path.join(TMP, f"rolloutd-exposure-{http_port}.log"), "w+")
    p = subprocess.Popen([os.path.join(BUILD, "rolloutd"), "--config", os.path.join(ROOT, "configs/test.json"),
                          "--model", MODEL, "--listen", listen, "--http-listen", f"127.0.0.1:{http_port}",
                          *map(str, flags)], stdout=log, stderr=subprocess.STDOUT, cwd=ROOT)
    return p, http_port, log


def refused(listen, *flags):
    p, _, log = start(listen, *flags)
    try:
        rc = p.wait(timeout=120)
    finally:
        if p.poll() is None:
            p.kill()
    log.seek(0)
    return rc, log.read()


def status_of(p, http_port):
    deadline = time.time() + 60
    while True:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{http_port}/status", timeout=5) as r:
                return json.loads(r.read())
        except OSError:
            pass
        assert p.poll() is None and time.time() < deadline, "the daemon did not start"
        time.sleep(0.1)


@case
def non_loopback_learner_socket_needs_insecure():
    rc, text = refused(f"tcp://0.0.0.0:{free_port()}")
    assert rc != 0, f"started on 0.0.0.0 without insecure: {text[-1500:]}"
    assert "0.0.0.0" in text and "insecure" in text and "loopback" in text, text[-1500:]


@case
def non_loopback_data_lane_needs_insecure():
    rc, text = refused(f"tcp://127.0.0.1:{free_port()}", "--update-listen", "0.0.0.0:0")
    assert rc != 0, f"the lane went on 0.0.0.0 without insecure: {text[-1500:]}"
    assert "data lane" in text and "insecure" in text, text[-1500:]


@case
def insecure_serves_and_status_says_so():
    port = free_port()
    p, http_port, _ = start(f"tcp://0.0.0.0:{port}", "--insecure", "1")
    try:
        doc = status_of(p, http_port)
        assert doc["insecure"] is True, doc.get("insecure")
    finally:
        p.kill()
        p.wait()
    p, http_port, _ = start(f"tcp://127.0.0.1:{free_port()}")
    try:
        doc = status_of(p, http_port)
        assert doc["insecure"] is False, doc.get("insecure")
    finally:
        p.kill()
        p.wait()


if __name__ == "__main__":
    main()
