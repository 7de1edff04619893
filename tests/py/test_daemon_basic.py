"""End-to-end checks of build/rolloutd over the raw protocol (the Python codec
rolloutd.proto on a pynng req0 socket): HELLO, SUBMIT + FETCH bit-identical to
rollout-gen, /status, /metrics, /health, 404, abuse frames answered with ERROR,
and SIGTERM under load. One daemon (configs/test.json on free loopback ports)
serves every case; the last case shuts it down."""
import json
import math
import os
import signal
import socket
import struct
import subprocess
import sys
import time
import urllib.error
import urllib.request

import numpy as np
import pynng

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import BUILD, MODEL, ROOT, TMP, case, main, run  # noqa: E402

sys.path.insert(0, os.path.join(ROOT, "tools", "python"))
from rolloutd import proto  # noqa: E402

from rdtest import PROMPT, Daemon, fetch_all, free_port, greedy, hello, rpc  # noqa: E402,F401

D = None


def daemon():
    global D
    if D is None:
        D = Daemon()
    return D



@case
def hello_and_status_over_protocol():
    d = daemon()
    with d.sock() as s:
        h = hello(s)
        assert h.client_id != 0 and h.vocab_size == 49152 and h.max_context > 0, h
        assert h.max_message_bytes == 4 << 20, h.max_message_bytes
        assert h.flags & proto.HELLO_OK_TEXT and h.backend == "cpu", h
        st = rpc(s, proto.Status())
        assert isinstance(st, proto.StatusOk), st
        doc = json.loads(st.json)
        assert doc["learners"] >= 1, doc
        # Resume keeps the id; an unknown id is refused.
        r = rpc(s, proto.Hello(client_id=h.client_id))
        assert isinstance(r, proto.HelloOk) and r.flags & proto.HELLO_OK_RESUMED, r
        r = rpc(s, proto.Hello(client_id=12345))
        assert isinstance(r, proto.Error) and r.code == proto.E.UNKNOWN_CLIENT, r


@case
def greedy_is_bit_identical_to_rollout_gen():
    d = daemon()
    out = run([os.path.join(BUILD, "rollout-gen"), "--model", MODEL, "--prompt-ids", ",".join(map(str, PROMPT)),
               "--temperature", "0", "--max-tokens", "24", "--threads", "2", "--json"], cwd=ROOT)
    ref = json.loads(out.stdout.strip().splitlines()[0])
    with d.sock() as s:
        cid = hello(s).client_id
        ok = rpc(s, proto.Submit(client_id=cid, requests=[greedy(1, 24)]))
        assert isinstance(ok, proto.SubmitOk) and ok.items[0].status == 0, ok
        # The same id again is a DUPLICATE, accepted without running twice.
        dup = rpc(s, proto.Submit(client_id=cid, requests=[greedy(1, 24)]))
        assert dup.items[0].status == 0 and dup.items[0].flags & proto.SUBMIT_DUPLICATE, dup
        got, ack = fetch_all(s, cid, 1)
        r = got[1]
        assert r.client_req_id == 1 and r.n_prompt == len(PROMPT), r
        assert r.token_ids.tolist() == ref["token_ids"], (r.token_ids.tolist(), ref["token_ids"])
        want = np.array(ref["logprobs"], dtype=np.float32)
        assert np.array_equal(r.logprobs.view(np.uint32), want.view(np.uint32)), (r.logprobs, want)
        assert proto.FINISH_NAMES[r.finish] == ref["finish_reason"], (r.finish, ref["finish_reason"])
        assert r.spans == [(0, len(r.token_ids), 0)] and r.version_finish == 0, r.spans
        assert r.total_us > 0
        # Acked: nothing more; the request id is forgotten.
        r2 = rpc(s, proto.Fetch(client_id=cid, ack_seq=ack, max_results=8, wait_ms=0))
        assert r2.results == [] and r2.ack_seq == ack and r2.inflight_samples == 0, r2
        # An ack beyond the last seq is UNEXPECTED.
        e = rpc(s, proto.Fetch(client_id=cid, ack_seq=ack + 5, max_results=8))
        assert isinstance(e, proto.Error) and e.code == proto.E.UNEXPECTED, e
        # A text prompt through the chat template works too.
        t = proto.Request(client_req_id=2, n=1, max_tokens=4, temperature=0.0, prompt_text="What is 2+2?",
                          flags=proto.REQ_PROMPT_IS_TEXT | proto.REQ_CHAT_TEMPLATE)
        ok = rpc(s, proto.Submit(client_id=cid, requests=[t]))
        assert ok.items[0].status == 0, ok
        got, ack = fetch_all(s, cid, 1, ack)
        assert list(got.values())[0].n_prompt > 5
        rpc(s, proto.Fetch(client_id=cid, ack_seq=ack))
        bye = rpc(s, proto.Bye(client_id=cid))
        assert isinstance(bye, proto.ByeOk) and bye.pending_results == 0 and bye.inflight_samples == 0, bye


def parse_prometheus(text):
    assert text.endswith("\n")
    vals = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            assert line == "" or line.startswith("# HELP ") or line.startswith("# TYPE "), line
            continue
        name_labels, value = line.rsplit(" ", 1)
        name = name_labels.split("{", 1)[0]
        if "{" in name_labels:
            assert name_labels.endswith("}"), line
        # rolloutd's own names, and the same numbers under vLLM's and SGLang's (test_frameworks_scrape.py)
        assert name.split(":", 1)[0] in ("rolloutd", "vllm", "sglang"), line
        vals[name] = float(value)
    return vals


@case
def http_status_metrics_health_404():
    d = daemon()
    code, ctype, body = d.http("/status")
    assert code == 200 and ctype.startswith("application/json"), (code, ctype)
    doc = json.loads(body)
    for k in ("model", "backend", "weight_version", "uptime_s", "requests", "throughput", "kv_cache", "learners",
              "last_weight_update"):
        assert k in doc, k
    assert doc["backend"] == "cpu" and doc["sampling"] == "host", (doc["backend"], doc["sampling"])
    for k in ("waiting", "running", "completed", "aborted"):
        assert k in doc["requests"], k
    for k in ("block_size", "blocks_total", "blocks_used", "usage"):
        assert k in doc["kv_cache"], k
    assert set(doc["throughput"]) >= {"prompt_tokens_per_s", "generated_tokens_per_s"}
    # The CPU backend holds the weights in their file dtype: what it reports is about the file's size
    # (Q4_1 + Q8_0), not the 4 bytes per parameter of fp32 copies.
    wb, fsize = doc["memory"]["weights_bytes"], os.path.getsize(MODEL)
    assert 0.5 * fsize < wb <= 1.1 * fsize, (wb, fsize)
    code, ctype, body = d.http("/metrics")
    assert code == 200 and ctype.startswith("text/plain; version=0.0.4"), (code, ctype)
    m = parse_prometheus(body)
    for k in ("num_requests_running", "num_requests_waiting", "kv_cache_usage_perc", "prompt_tokens_total",
              "generation_tokens_total", "num_preemptions_total", "prefix_cache_hits_total", "weight_version"):
        assert "rolloutd:" + k in m, k
    assert d.http("/health")[:2] == (200, "application/json") and json.loads(d.http("/health")[2]) == {"status": "ok"}
    code, _, body = d.http("/nope")
    assert code == 404 and "error" in json.loads(body)
    assert d.http("/status", method="POST")[0] == 405
    # Garbage and a half request on raw TCP: a 400 or a close, and the server still answers.
    with socket.create_connection(("127.0.0.1", d.http_port), timeout=5) as c:
        c.sendall(b"\x00\x01garbage\r\n\r\n")
        data = c.recv(100)
        assert data == b"" or data.startswith(b"HTTP/1.1 400"), data
    half = socket.create_connection(("127.0.0.1", d.http_port), timeout=5)
    half.sendall(b"GET /sta")
    assert d.http("/health")[0] == 200
    half.close()


@case
def metrics_reflect_load():
    d = daemon()
    before = parse_prometheus(d.http("/metrics")[2])
    with d.sock() as s:
        cid = hello(s).client_id
        reqs = [greedy(100 + i, 48, prompt=PROMPT + [i + 5], n=2, flags=proto.REQ_IGNORE_EOS) for i in range(6)]
        ok = rpc(s, proto.Submit(client_id=cid, requests=reqs))
        assert all(it.status == 0 for it in ok.items), ok
        running = kv = 0
        deadline = time.time() + 60
        while time.time() < deadline and not (running and kv):
            m = parse_prometheus(d.http("/metrics")[2])
            running = max(running, m["rolloutd:num_requests_running"])
            kv = max(kv, m["rolloutd:kv_cache_usage_perc"])
            st = json.loads(d.http("/status")[2])
            kv = max(kv, st["kv_cache"]["blocks_used"])
            time.sleep(0.02)
        got, ack = fetch_all(s, cid, 12)
        assert running > 0 and kv > 0, (running, kv)
        assert all(len(r.token_ids) == 48 for r in got.values())
        # Seqs are gapless from 1.
        assert sorted(got) == list(range(1, 13)), sorted(got)
        rpc(s, proto.Fetch(client_id=cid, ack_seq=ack))
    after = parse_prometheus(d.http("/metrics")[2])
    assert after["rolloutd:generation_tokens_total"] >= before["rolloutd:generation_tokens_total"] + 12 * 48
    assert after["rolloutd:prompt_tokens_total"] > before["rolloutd:prompt_tokens_total"]


def frame_with(frame, magic=None, version=None, mtype=None, body_len=None, flags=None):
    hdr = bytearray(frame[:16])
    if magic is not None:
        hdr[0:4] = magic
    if version is not None:
        struct.pack_into("<H", hdr, 4, version)
    if mtype is not None:
        struct.pack_into("<H", hdr, 6, mtype)
    if body_len is not None:
        struct.pack_into("<I", hdr, 8, body_len)
    if flags is not None:
        struct.pack_into("<I", hdr, 12, flags)
    return bytes(hdr) + frame[16:]


@case
def abuse_gets_errors_and_daemon_keeps_serving():
    d = daemon()
    with d.sock() as s:
        cid = hello(s).client_id
        good = proto.encode(proto.Submit(client_id=cid, requests=[greedy(7, 4)]))
        rnd = np.random.default_rng(1)
        cases = [
            ("random bytes", bytes(rnd.integers(0, 256, 200, dtype=np.uint8)), proto.E.BAD_MAGIC),
            ("empty", b"", proto.E.MALFORMED),
            ("short header", good[:10], proto.E.MALFORMED),
            ("truncated frame", good[:len(good) - 9], proto.E.MALFORMED),
            ("wrong magic", frame_with(good, magic=b"XXXX"), proto.E.BAD_MAGIC),
            ("wrong version", frame_with(good, version=proto.VERSION + 1), proto.E.UNSUPPORTED_VERSION),
            ("length > frame", frame_with(good, body_len=len(good) - 16 + 100), proto.E.MALFORMED),
            ("length > limit", frame_with(good, body_len=1 << 30), proto.E.TOO_LARGE),
            ("header flags", frame_with(good, flags=1), proto.E.MALFORMED),
            ("unknown type", frame_with(good, mtype=0x42), proto.E.UNKNOWN_TYPE),
            ("undefined type next to the update types",
             frame_with(good, mtype=proto.undefined_type_after(proto.T.UPDATE_BEGIN)), proto.E.UNKNOWN_TYPE),
            ("a SUBMIT body typed UPDATE_BEGIN", frame_with(good, mtype=0x10), proto.E.MALFORMED),
            ("reply type", proto.encode(proto.AbortOk()), proto.E.UNEXPECTED),
            ("trailing bytes", frame_with(good + b"\0", body_len=len(good) - 15), proto.E.MALFORMED),
            ("submit unknown client", proto.encode(proto.Submit(client_id=99, requests=[greedy(1, 4)])),
             proto.E.UNKNOWN_CLIENT),
            ("hello bad versions", proto.encode(proto.Hello(min_version=proto.VERSION + 1, max_version=proto.VERSION + 2)),
             proto.E.UNSUPPORTED_VERSION),
            ("abort all with id", proto.encode(proto.Abort(client_id=cid, client_req_id=3, flags=proto.ABORT_ALL)),
             proto.E.INVALID_PARAMS),
            ("abort unknown", proto.encode(proto.Abort(client_id=cid, client_req_id=31337)),
             proto.E.UNKNOWN_REQUEST),
        ]
        for name, frame, code in cases:
            s.send(frame)
            r = proto.decode(s.recv())
            assert isinstance(r, proto.Error) and r.code == code, (name, r)
            assert r.message, name
        bad = [
            proto.Request(client_req_id=11, n=0, max_tokens=4, prompt_ids=PROMPT),
            proto.Request(client_req_id=12, n=1, max_tokens=100000, prompt_ids=PROMPT),
            proto.Request(client_req_id=13, n=1, max_tokens=4, prompt_ids=[1, 49152]),
            proto.Request(client_req_id=14, n=1, max_tokens=4, temperature=float("nan"), prompt_ids=PROMPT),
            proto.Request(client_req_id=15, n=1, max_tokens=4, prompt_ids=PROMPT, flags=0x80),
            proto.Request(client_req_id=16, n=1, max_tokens=4, prompt_ids=[]),
        ]
        ok = rpc(s, proto.Submit(client_id=cid, requests=bad + [greedy(17, 4)]))
        assert isinstance(ok, proto.SubmitOk), ok
        for it in ok.items[:-1]:
            assert it.status == proto.E.INVALID_PARAMS and it.message, it
        assert ok.items[-1].status == 0, ok.items[-1]
        got, ack = fetch_all(s, cid, 1)
        assert list(got.values())[0].client_req_id == 17
        rpc(s, proto.Bye(client_id=cid, flags=proto.BYE_DISCARD))
    # A fresh client is still served.
    with d.sock() as s:
        cid = hello(s).client_id
        assert rpc(s, proto.Submit(client_id=cid, requests=[greedy(1, 3)])).items[0].status == 0
        got, _ = fetch_all(s, cid, 1)
        assert len(got[1].token_ids) >= 1
    assert json.loads(d.http("/status")[2])["protocol_errors"] >= len(cases)


@case
def abort_returns_partial_rollouts():
    d = daemon()
    with d.sock() as s:
        cid = hello(s).client_id
        ok = rpc(s, proto.Submit(client_id=cid, requests=[greedy(1, 200, n=2, flags=proto.REQ_IGNORE_EOS)]))
        assert ok.items[0].status == 0, ok
        time.sleep(0.3)
        a = rpc(s, proto.Abort(client_id=cid, client_req_id=1))
        assert isinstance(a, proto.AbortOk) and a.n_requests == 1 and a.n_samples == 2, a
        got, ack = fetch_all(s, cid, 2)
        assert all(r.finish == proto.FINISH_ABORT and len(r.token_ids) < 200 for r in got.values()), got
        rpc(s, proto.Bye(client_id=cid, flags=proto.BYE_DISCARD))


@case
def sigterm_under_load_exits_zero():
    d = daemon()
    with d.sock() as s:
        cid = hello(s).client_id
        reqs = [greedy(i + 1, 160, prompt=PROMPT + [i + 3], n=2, flags=proto.REQ_IGNORE_EOS) for i in range(6)]
        reqs.append(greedy(50, 2))
        ok = rpc(s, proto.Submit(client_id=cid, requests=reqs))
        assert all(it.status == 0 for it in ok.items), ok
        deadline = time.time() + 30
        while parse_prometheus(d.http("/metrics")[2])["rolloutd:num_requests_running"] == 0:
            assert time.time() < deadline
            time.sleep(0.02)
        d.proc.send_signal(signal.SIGTERM)
        time.sleep(0.2)
        r = rpc(s, proto.Submit(client_id=cid, requests=[greedy(99, 4)]))
        assert isinstance(r, proto.Error) and r.code == proto.E.SHUTTING_DOWN, r
        r = rpc(s, proto.Hello())
        assert isinstance(r, proto.Error) and r.code == proto.E.SHUTTING_DOWN, r
        got, ack = fetch_all(s, cid, 13, timeout=60)
        finishes = {r.finish for r in got.values()}
        assert finishes <= {proto.FINISH_LENGTH, proto.FINISH_ABORT, proto.FINISH_STOP}, finishes
        assert proto.FINISH_ABORT in finishes, finishes   # 160 tokens x 12 do not fit a 2 s drain
        assert {(r.client_req_id, r.sample_idx) for r in got.values()} == \
            {(i + 1, k) for i in range(6) for k in range(2)} | {(50, 0)}
        # The final ack lets it exit; its reply may be lost as the socket closes.
        s.recv_timeout = 3000
        try:
            rpc(s, proto.Fetch(client_id=cid, ack_seq=ack))
        except pynng.exceptions.NNGException:
            pass
    d.exits_cleanly(timeout=30)
    log = d.tail()
    assert "draining" in log and "exit 0" in log, log


if __name__ == "__main__":
    try:
        main()
    finally:
        if D is not None:
            D.kill()
