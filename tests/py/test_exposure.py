#!/usr/bin/env python3
"""Loopback by default (DESIGN.md, Security): without a shared secret
(auth_token_file, test_auth.py) the daemon refuses to put the learner socket
or the data lane on a non-loopback address unless started with insecure = 1,
and /status then says "insecure": true. Real daemons on this machine's addresses; the refusals are
checked by exit status and the message naming the key."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import case, main  # noqa: E402
from rdtest import Daemon, free_port, status  # noqa: E402


def refused(listen, *flags):
    d = Daemon(*flags, listen=listen, wait=False)
    try:
        rc = d.proc.wait(timeout=120)
    finally:
        d.kill()
    return rc, d.output()


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
    d = Daemon("--insecure", "1", listen=f"tcp://0.0.0.0:{port}")
    try:
        doc = status(d)
        assert doc["insecure"] is True, doc.get("insecure")
    finally:
        d.kill()
    d = Daemon(listen=f"tcp://127.0.0.1:{free_port()}")
    try:
        doc = status(d)
        assert doc["insecure"] is False, doc.get("insecure")
    finally:
        d.kill()


if __name__ == "__main__":
    main()
