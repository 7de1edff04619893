"""Live weight updates end to end (PROTOCOL.md §10): real daemons on loopback,
pushed to by `rolloutctl push-weights` (data lane and NNG chunks) and by raw
UPDATE_* frames from the Python codec for the faults.

- a GGUF-started daemon fed its own weights (exported as HF f32 tensors, from
  the GGUF or from an HF folder) gives bit-identical results; perturbed
  weights change them and results carry the new version;
- continue mode while 64 sequences decode: every sample returns, version spans
  tile the tokens, some sequences cross the swap, the engine kept stepping
  while bytes arrived;
- drain and abort modes;
- faults (bad checksum, missing tensor, wrong shape or dtype, unknown name,
  duplicate and out-of-order chunks, commit without begin, stale version, a
  sender that disconnects mid-transfer): each leaves the old weights serving
  and the staging memory released;
- one push to two daemons: both serve the new version with equal outputs."""
import json
import os
import struct
import subprocess
import sys
import tempfile
import time

import numpy as np
import pynng

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import BUILD, MODEL, ROOT, TMP, case, main, run  # noqa: E402
from rdtest import PROMPT, Daemon, fetch_all, greedy, hello, rpc, status, stop_cleanly  # noqa: E402

sys.path.insert(0, os.path.join(ROOT, "tools", "python"))
from rolloutd import proto  # noqa: E402
from rolloutd.crc32c import crc32c  # noqa: E402

CTL = os.path.join(BUILD, "rolloutctl")
PROMPT2 = [1, 504, 3458, 282, 4649, 314, 216, 33, 30]
_tmp = tempfile.mkdtemp(prefix="rd-wu-", dir=TMP)
_export = None


def export_dir():
    """The default model exported once as HF f32 tensors (rollout-export)."""
    global _export
    if _export is None:
        _export = os.path.join(_tmp, "hf")
        run([os.path.join(BUILD, "rollout-export"), "--model", MODEL, "--out", _export, "--dtype", "f32"])
    return _export


def read_safetensors(path):
    """{name: numpy array} from a .safetensors file (the format is a u64 header length, JSON, data)."""
    with open(path, "rb") as f:
        raw = f.read()
    (n,) = struct.unpack("<Q", raw[:8])
    hdr = json.loads(raw[8:8 + n])
    out = {}
    dt = {"F32": np.float32, "F16": np.float16, "BF16": np.uint16}
    for k, v in hdr.items():
        if k == "__metadata__":
            continue
        a, b = v["data_offsets"]
        out[k] = np.frombuffer(raw[8 + n + a:8 + n + b], dtype=dt[v["dtype"]]).reshape(v["shape"])
    return out


def push(urls, source, version, *flags, check=True):
    """rolloutctl push-weights --json; returns one dict per daemon."""
    p = run([CTL, "push-weights", "--connect", ",".join(urls), source, "--version", str(version), "--json",
             *map(str, flags)], check=check)
    return [json.loads(line) for line in p.stdout.splitlines() if line.startswith("{")]


def generate(d, prompts, max_tokens=16, n=1, seeded=False):
    """Greedy (or seeded sampling) through the daemon; {(req, sample): result}."""
    s = d.sock()
    cid = hello(s).client_id
    reqs = []
    for i, p in enumerate(prompts):
        r = greedy(i + 1, max_tokens, prompt=p, n=n, flags=proto.REQ_IGNORE_EOS)
        if seeded:
            r.temperature, r.seed, r.flags = 1.0, 1234 + i, r.flags | proto.REQ_HAS_SEED
        reqs.append(r)
    ok = rpc(s, proto.Submit(client_id=cid, requests=reqs))
    assert all(it.status == 0 for it in ok.items), ok
    got, _ = fetch_all(s, cid, len(prompts) * n)
    s.close()
    return {(r.client_req_id, r.sample_idx): r for r in got.values()}


def same_outputs(a, b):
    """Bit-identical token ids and log-probs for every (request, sample)."""
    def bits(x):
        return np.asarray(x, dtype=np.float32).view(np.uint32)
    return a.keys() == b.keys() and all(
        np.array_equal(a[k].token_ids, b[k].token_ids) and np.array_equal(bits(a[k].logprobs), bits(b[k].logprobs))
        for k in a)


def check_spans(r):
    """Spans tile [0, n_tokens) with increasing versions (the codec checks this too)."""
    if len(r.token_ids) == 0:
        assert not r.spans
        return
    at = 0
    for st, en, v in r.spans:  # (start, end, version)
        assert st == at and en > st, r.spans
        at = en
    assert at == len(r.token_ids), (r.spans, len(r.token_ids))


# ---------------------------------------------------------------- pushes

DA = None


def daemon_a():
    global DA
    if DA is None:
        DA = Daemon()
    return DA


@case
def self_push_is_bit_identical_perturbed_push_changes_outputs():
    d = daemon_a()
    prompts = [PROMPT, PROMPT2]
    base = generate(d, prompts)
    base_s = generate(d, prompts, n=2, seeded=True)
    # The GGUF's own weights as f32 HF tensors over the data lane.
    (r,) = push([d.url], MODEL, 1)
    assert r["ok"] and r["version"] == 1, r
    after = generate(d, prompts)
    assert same_outputs(base, after), "a push of the same weights changed the outputs"
    assert same_outputs(base_s, generate(d, prompts, n=2, seeded=True))
    for x in after.values():
        assert x.version_admit == 1 and x.version_finish == 1 and [tuple(sp) for sp in x.spans] == [
            (0, len(x.token_ids), 1)]
    # The same weights from an HF folder (safetensors), over NNG chunks instead of the lane.
    (r,) = push([d.url], export_dir(), 2, "--no-lane", "--window", 3, "--chunk-mb", 1)
    assert r["ok"] and r["version"] == 2, r
    assert same_outputs(base, generate(d, prompts))
    # Perturbed weights (bf16 on the wire): outputs change, results say version 3.
    (r,) = push([d.url], MODEL, 3, "--perturb", "0.05", "--dtype", "bf16")
    assert r["ok"] and r["version"] == 3 and r["stall_us"] < 1_000_000, r
    pert = generate(d, prompts)
    assert not same_outputs(base, pert), "perturbed weights gave the same outputs"
    assert all(x.version_finish == 3 for x in pert.values())
    st = status(d)
    assert st["weight_version"] == 3 and st["last_weight_update"]["ok"], st
    assert st["weight_update"]["updates_ok"] == 3 and not st["weight_update"]["in_progress"], st


def prefix_hits(d):
    return status(d)["kv_cache"]["prefix_cache_hit_tokens"]


@case
def prefix_cache_is_salted_with_the_weight_version():
    d = daemon_a()
    long_prompt = [1] + [(37 * i) % 3000 + 200 for i in range(40)]  # 2 full blocks before the last token
    first = generate(d, [long_prompt])
    h0 = prefix_hits(d)
    assert same_outputs(first, generate(d, [long_prompt]))
    assert prefix_hits(d) - h0 == 32, "a repeated prompt must reuse its 2 cached blocks"
    # The same weights under a new version: the cached blocks belong to the old version.
    v = status(d)["weight_version"]
    w = read_safetensors(os.path.join(export_dir(), "model.safetensors"))
    a = np.ascontiguousarray(w["model.layers.3.input_layernorm.weight"])
    s = d.sock()
    cid = hello(s).client_id
    ok = begin(s, cid, v + 1, [("model.layers.3.input_layernorm.weight", a, proto.DTYPE_F32)])
    assert isinstance(ok, proto.UpdateBeginOk), ok
    assert isinstance(chunk(s, ok.xfer_id, 0, a, 0, a.nbytes), proto.UpdateChunkOk)
    assert isinstance(rpc(s, proto.UpdateCommit(xfer_id=ok.xfer_id)), proto.UpdateCommitOk)
    s.close()
    h1 = prefix_hits(d)
    again = generate(d, [long_prompt])
    assert prefix_hits(d) == h1, "a block computed under the old version was reused after an update"
    generate(d, [long_prompt])
    assert prefix_hits(d) - h1 == 32, "blocks computed under the new version are reused"
    assert again.keys() == first.keys()


@case
def stale_version_is_refused():
    d = daemon_a()
    v = status(d)["weight_version"]
    (r,) = push([d.url], MODEL, v, check=False)
    assert not r["ok"] and r["error_code"] == proto.E.STALE_VERSION, r
    assert status(d)["weight_version"] == v


# ---------------------------------------------------------------- raw frames

def begin(s, cid, version, tensors, mode=proto.MODE_CONTINUE, window=4, max_chunk=1 << 20):
    man = [proto.Tensor(name=n, dtype=dt, shape=list(a.shape), nbytes=a.nbytes, crc32c=crc32c(a))
           for n, a, dt in tensors]
    return rpc(s, proto.UpdateBegin(client_id=cid, version=version, mode=mode, window=window,
                                    max_chunk_bytes=max_chunk, total_bytes=sum(t.nbytes for t in man), tensors=man))


def chunk(s, xid, ti, a, off, ln, seq=0, crc=None):
    data = bytes(memoryview(a).cast("B")[off:off + ln])
    return rpc(s, proto.UpdateChunk(xfer_id=xid, chunk_seq=seq, tensor_index=ti, offset=off,
                                    crc32c=crc32c(data) if crc is None else crc, data=data))


def assert_error(r, code):
    assert isinstance(r, proto.Error) and r.code == code, r


@case
def faults_leave_the_old_weights_serving():
    d = Daemon()
    try:
        faults(d)
        stop_cleanly(d)
    finally:
        d.kill()


def faults(d):
    w = read_safetensors(os.path.join(export_dir(), "model.safetensors"))
    norm = np.ascontiguousarray(w["model.norm.weight"] * np.float32(1.5))  # a real change if it ever landed
    q0 = np.ascontiguousarray(w["model.layers.0.self_attn.q_proj.weight"] * np.float32(-1))
    v0 = status(d)["weight_version"]
    base = generate(d, [PROMPT])
    s = d.sock()
    cid = hello(s).client_id
    F32 = proto.DTYPE_F32

    # Commit and chunk without a begin.
    assert_error(rpc(s, proto.UpdateCommit(xfer_id=12345)), proto.E.UNEXPECTED)
    assert_error(chunk(s, 12345, 0, norm, 0, norm.nbytes), proto.E.UNEXPECTED)
    # Stale version, unknown name, wrong shape, wrong dtype (bytes of f32 declared as f16).
    assert_error(begin(s, cid, v0, [("model.norm.weight", norm, F32)]), proto.E.STALE_VERSION)
    assert_error(begin(s, cid, v0 + 1, [("model.norm.bias", norm, F32)]), proto.E.INVALID_PARAMS)
    assert_error(begin(s, cid, v0 + 1, [("model.norm.weight", norm[:100], F32)]), proto.E.INVALID_PARAMS)
    bad = rpc(s, proto.UpdateBegin(client_id=cid, version=v0 + 1, window=1, max_chunk_bytes=1 << 20,
                                   total_bytes=norm.nbytes,
                                   tensors=[proto.Tensor(name="model.norm.weight", dtype=proto.DTYPE_F16,
                                                         shape=[576], nbytes=norm.nbytes, crc32c=0)]))
    assert_error(bad, proto.E.INVALID_PARAMS)
    assert "f16" in bad.message, bad

    # A chunk with a bad checksum: refused; the transfer stays open; commit then misses bytes.
    ok = begin(s, cid, v0 + 1, [("model.norm.weight", norm, F32)])
    assert isinstance(ok, proto.UpdateBeginOk), ok
    assert_error(begin(s, cid, v0 + 2, [("model.norm.weight", norm, F32)]), proto.E.UPDATE_CONFLICT)
    assert_error(chunk(s, ok.xfer_id, 0, norm, 0, norm.nbytes, crc=1), proto.E.CHECKSUM)
    assert status(d)["weight_update"]["in_progress"]
    r = rpc(s, proto.UpdateCommit(xfer_id=ok.xfer_id))
    assert_error(r, proto.E.INVALID_PARAMS)
    assert "missing bytes" in r.message, r
    assert not status(d)["weight_update"]["in_progress"], "a failed commit must free the transfer"

    # A missing tensor at commit: two tensors announced, one sent.
    ok = begin(s, cid, v0 + 1, [("model.norm.weight", norm, F32), ("model.layers.0.self_attn.q_proj.weight", q0, F32)])
    assert isinstance(chunk(s, ok.xfer_id, 0, norm, 0, norm.nbytes), proto.UpdateChunkOk)
    r = rpc(s, proto.UpdateCommit(xfer_id=ok.xfer_id))
    assert_error(r, proto.E.INVALID_PARAMS)
    assert "q_proj" in r.message, r

    # A manifest crc that does not match the bytes: CHECKSUM at commit.
    man = proto.Tensor(name="model.norm.weight", dtype=F32, shape=[576], nbytes=norm.nbytes, crc32c=crc32c(norm) ^ 1)
    ok = rpc(s, proto.UpdateBegin(client_id=cid, version=v0 + 1, window=1, max_chunk_bytes=1 << 20,
                                  total_bytes=norm.nbytes, tensors=[man]))
    assert isinstance(chunk(s, ok.xfer_id, 0, norm, 0, norm.nbytes), proto.UpdateChunkOk)
    assert_error(rpc(s, proto.UpdateCommit(xfer_id=ok.xfer_id)), proto.E.CHECKSUM)

    # Overlapping chunks with other data are refused; an explicit abort frees the staging.
    ok = begin(s, cid, v0 + 1, [("model.layers.0.self_attn.q_proj.weight", q0, F32)])
    assert isinstance(chunk(s, ok.xfer_id, 0, q0, 0, 65536), proto.UpdateChunkOk)
    assert_error(chunk(s, ok.xfer_id, 0, q0, 32768, 65536), proto.E.INVALID_PARAMS)
    ab = rpc(s, proto.UpdateAbort(xfer_id=ok.xfer_id))
    assert isinstance(ab, proto.UpdateAbortOk) and ab.bytes_freed == q0.nbytes, ab
    assert isinstance(rpc(s, proto.UpdateAbort(xfer_id=ok.xfer_id)), proto.UpdateAbortOk)  # a repeat is fine

    # The sender disconnects mid-transfer: the daemon drops the transfer.
    s2 = d.sock()
    cid2 = hello(s2).client_id
    ok = begin(s2, cid2, v0 + 1, [("model.layers.0.self_attn.q_proj.weight", q0, F32)])
    assert isinstance(chunk(s2, ok.xfer_id, 0, q0, 0, 65536), proto.UpdateChunkOk)
    assert status(d)["weight_update"]["in_progress"]
    s2.close()
    deadline = time.time() + 10
    while status(d)["weight_update"]["in_progress"]:
        assert time.time() < deadline, "the transfer outlived its sender's connection"
        time.sleep(0.05)
    assert "connection closed" in status(d)["last_weight_update"]["error"]

    st = status(d)
    assert st["weight_version"] == v0 and st["weight_update"]["updates_failed"] >= 5, st
    assert same_outputs(base, generate(d, [PROMPT])), "a failed update changed the outputs"

    # Duplicate and out-of-order chunks still make a correct update (of the unchanged weights).
    same = np.ascontiguousarray(w["model.layers.0.self_attn.q_proj.weight"])
    ok = begin(s, cid, v0 + 1, [("model.layers.0.self_attn.q_proj.weight", same, F32)], window=2)
    step = 1 << 18
    offs = list(range(0, same.nbytes, step))[::-1]
    for k, off in enumerate(offs):
        r = chunk(s, ok.xfer_id, 0, same, off, min(step, same.nbytes - off), seq=k)
        assert isinstance(r, proto.UpdateChunkOk) and not r.flags, r
    r = chunk(s, ok.xfer_id, 0, same, offs[0], min(step, same.nbytes - offs[0]))
    assert isinstance(r, proto.UpdateChunkOk) and r.flags & proto.CHUNK_OK_DUPLICATE, r
    c = rpc(s, proto.UpdateCommit(xfer_id=ok.xfer_id))
    assert isinstance(c, proto.UpdateCommitOk) and c.version == v0 + 1, c
    assert rpc(s, proto.UpdateCommit(xfer_id=ok.xfer_id)) == c, "a repeated COMMIT must get the same reply"
    assert same_outputs(base, generate(d, [PROMPT]))
    s.close()


def read_frame(sock):
    head = b""
    while len(head) < 16:
        got = sock.recv(16 - len(head))
        if not got:
            return None
        head += got
    (n,) = struct.unpack("<I", head[8:12])
    body = b""
    while len(body) < n:
        got = sock.recv(n - len(body))
        assert got, "the daemon closed the data lane inside a reply"
        body += got
    return proto.decode(head + body)


@case
def data_lane_refuses_garbage_and_keeps_serving():
    d = Daemon()
    try:
        data_lane_abuse(d)
        stop_cleanly(d)
    finally:
        d.kill()


def data_lane_abuse(d):
    import socket as so
    s = d.sock()
    cid = hello(s).client_id
    a = np.arange(576, dtype=np.float32)
    ok = begin(s, cid, status(d)["weight_version"] + 1, [("model.norm.weight", a, proto.DTYPE_F32)])
    assert isinstance(ok, proto.UpdateBeginOk) and ok.data_port > 0, ok
    # Random bytes: one ERROR frame, then the daemon closes the connection.
    c = so.create_connection(("127.0.0.1", ok.data_port), timeout=10)
    c.sendall(os.urandom(48))
    r = read_frame(c)
    assert isinstance(r, proto.Error) and r.code in (proto.E.BAD_MAGIC, proto.E.UNSUPPORTED_VERSION,
                                                     proto.E.UNEXPECTED, proto.E.MALFORMED, proto.E.TOO_LARGE), r
    assert read_frame(c) is None, "the connection stays open after a bad frame"
    c.close()
    data = a.tobytes()
    bad = proto.encode(proto.UpdateChunk(xfer_id=ok.xfer_id ^ 1, chunk_seq=1, tensor_index=0, offset=0,
                                         crc32c=crc32c(data), data=data))
    good = proto.encode(proto.UpdateChunk(xfer_id=ok.xfer_id, chunk_seq=2, tensor_index=0, offset=0,
                                          crc32c=crc32c(data), data=data))
    # A sender that vanishes inside a chunk releases the chunk's range; the transfer stays open for
    # another sender (a chained push reroutes around a relaying daemon that died mid-chunk, §10.11).
    c = so.create_connection(("127.0.0.1", ok.data_port), timeout=10)
    c.sendall(good[:100])
    c.close()
    time.sleep(0.5)
    wu = status(d)["weight_update"]
    assert wu["in_progress"] and wu["bytes_staged"] == 0, wu
    # A well-formed chunk for an unknown transfer: its bytes are read and refused; the stream goes on,
    # and the range the cut chunk held is free again.
    c = so.create_connection(("127.0.0.1", ok.data_port), timeout=10)
    c.sendall(bad + good)
    r1, r2 = read_frame(c), read_frame(c)
    assert isinstance(r1, proto.Error) and r1.code == proto.E.UNEXPECTED, r1
    assert isinstance(r2, proto.UpdateChunkOk) and r2.chunk_seq == 2 and r2.bytes_staged == a.nbytes, r2
    c.close()
    assert isinstance(rpc(s, proto.UpdateAbort(xfer_id=ok.xfer_id)), proto.UpdateAbortOk)
    assert not status(d)["weight_update"]["in_progress"]
    s.close()
    assert generate(d, [PROMPT])  # still serving


# ---------------------------------------------------------------- modes under load

def submit_load(d, n_req, n, max_tokens, first_id=1):
    s = d.sock()
    cid = hello(s).client_id
    prompts = [[1] + [(97 * i + 13 * j) % 4000 + 100 for j in range(8 + i % 5)] for i in range(n_req)]
    reqs = [greedy(first_id + i, max_tokens, prompt=p, n=n, flags=proto.REQ_IGNORE_EOS) for i, p in enumerate(prompts)]
    ok = rpc(s, proto.Submit(client_id=cid, requests=reqs))
    assert all(it.status == 0 for it in ok.items), ok
    return s, cid


@case
def continue_mode_while_64_sequences_decode():
    d = Daemon("--max-num-seqs", 68, "--max-batch-tokens", 512, "--kv-cache-bytes", 256 << 20,
               "--max-queued-requests", 256, "--max-tokens", 1500)
    try:
        s, cid = submit_load(d, 16, 4, 40)
        # Four long sequences outlast the push however slow the machine is: they are
        # aborted once the new weights serve, so they must have crossed the swap.
        ok = rpc(s, proto.Submit(client_id=cid, requests=[greedy(100 + i, 1500, prompt=PROMPT, flags=proto.REQ_IGNORE_EOS)
                                                         for i in range(4)]))
        assert all(it.status == 0 for it in ok.items), ok
        deadline = time.time() + 60
        while status(d)["requests"]["running"] < 32:  # decoding has started
            assert time.time() < deadline
            time.sleep(0.05)
        (r,) = push([d.url], MODEL, 1, "--perturb", "0.02")
        assert r["ok"], r
        while status(d)["weight_version"] != 1:
            assert time.time() < deadline + 60
            time.sleep(0.05)
        time.sleep(0.3)  # a few tokens under version 1
        for i in range(4):
            assert isinstance(rpc(s, proto.Abort(client_id=cid, client_req_id=100 + i)), proto.AbortOk)
        got, _ = fetch_all(s, cid, 68, timeout=300)
        assert len(got) == 68 and sorted(got) == list(range(1, 69)), "results lost or duplicated"
        crossed = 0
        for x in got.values():
            check_spans(x)
            vs = [sp[2] for sp in x.spans]
            assert x.version_finish == vs[-1]
            if x.client_req_id >= 100:
                assert x.finish == proto.FINISH_ABORT and vs == [0, 1], (x.finish, vs)
                crossed += 1
            else:
                assert x.finish == proto.FINISH_LENGTH and len(x.token_ids) == 40, x
                assert vs in ([0], [0, 1], [1]), vs
        assert crossed == 4, crossed
        lw = status(d)["last_weight_update"]
        assert lw["ok"] and lw["engine_steps_during"] > 0, lw  # the engine stepped while bytes arrived
        s.close()
    finally:
        d.kill()


@case
def drain_and_abort_modes():
    d = Daemon("--max-num-seqs", 4, "--max-queued-requests", 64, "--max-tokens", 800, "--kv-cache-bytes", 192 << 20)
    try:
        # drain: started sequences finish on version 0, queued ones run on 1; nothing mixes versions.
        # 48 requests, 4 at a time: the queue outlasts the push (about 12 waves of 48 steps).
        s, cid = submit_load(d, 48, 1, 48)
        deadline = time.time() + 60
        while status(d)["requests"]["running"] < 4:
            assert time.time() < deadline
            time.sleep(0.05)
        (r,) = push([d.url], MODEL, 1, "--mode", "drain", "--perturb", "0.02")
        assert r["ok"] and r["n_aborted"] == 0, r
        got, ack = fetch_all(s, cid, 48, timeout=300)
        versions = set()
        for x in got.values():
            check_spans(x)
            assert len({sp[2] for sp in x.spans}) == 1, "drain mode mixed versions in one sequence"
            versions.add(x.spans[0][2])
        assert versions == {0, 1}, versions
        # abort: started sequences come back aborted with what they had, on version 1.
        # long enough to be running whenever the push lands
        ok = rpc(s, proto.Submit(client_id=cid, requests=[greedy(100 + i, 800, prompt=PROMPT, flags=proto.REQ_IGNORE_EOS)
                                                         for i in range(4)]))
        assert all(it.status == 0 for it in ok.items), ok
        while status(d)["requests"]["running"] < 4:
            time.sleep(0.05)
        time.sleep(0.5)
        (r,) = push([d.url], MODEL, 2, "--mode", "abort", "--perturb", "0.03")
        assert r["ok"] and r["n_aborted"] >= 4, r
        more, _ = fetch_all(s, cid, 4, ack=ack, timeout=120)
        for x in more.values():
            assert x.finish == proto.FINISH_ABORT and 0 < len(x.token_ids) < 800, x
            assert [sp[2] for sp in x.spans] == [1] and x.version_finish == 1, x  # ended just before the swap
        s.close()
    finally:
        d.kill()


@case
def one_push_reaches_two_daemons():
    a, b = daemon_a(), Daemon()
    try:
        va = status(a)["weight_version"]
        rs = push([a.url, b.url], MODEL, va + 1, "--perturb", "0.04", "--seed", 7)
        assert len(rs) == 2 and all(r["ok"] and r["version"] == va + 1 for r in rs), rs
        ga, gb = generate(a, [PROMPT, PROMPT2]), generate(b, [PROMPT, PROMPT2])
        assert same_outputs(ga, gb), "two daemons given the same push disagree"
        assert all(x.version_finish == va + 1 for x in list(ga.values()) + list(gb.values()))
    finally:
        b.kill()


@case
def shutdown_is_clean():
    """SIGTERM exits 0 (under the ASan build: no leak of staging or weights)."""
    stop_cleanly(daemon_a())


if __name__ == "__main__":
    try:
        main()
    finally:
        if DA:
            DA.kill()
        subprocess.run(["rm", "-rf", _tmp])
