"""Which policy produced a result (issue 26, protocol version 3): results carry the serve_dtype of
their weight version, and a push may choose its own serve_dtype. Real daemons on loopback, driven
by the Python client; the oracle for "served as q8_0" is a daemon on the `gguf` package's Q8_0 file
of the same bf16 weights (test_serve_dtype's q8_0_copy), for "as_pushed" a daemon on the bf16 file.

- a daemon configured as_pushed (tiny-bf16) reports serve_dtype "as_pushed" on its results before
  any push; a push with serve_dtype "q8_0" is served bit-identical to the Q8_0 file, its results say
  "q8_0" (serve_dtype and serve_dtype_first), /status weights_serve_dtype "q8_0" while the config's
  serve_dtype stays "as_pushed", HTTP /generate meta_info says "q8_0"; the next push without a
  serve_dtype is served as the config says (bit-identical to the bf16 file again, "as_pushed");
- Pool.push_weights(serve_dtype="q8_0") through a chain of two daemons serves the Q8_0 file's bits on both,
  and so does rolloutctl push-weights --serve-dtype q8_0 (the C push library);
- /update_weights_from_disk with "serve_dtype": "q8_0" of the bf16 file likewise serves the Q8_0
  file's bits and says "q8_0"; a bad serve_dtype there is a 400 naming the field; the weights of
  that version cannot be released (a resume would read the file's bf16 back, another policy: 400
  naming q8_0), those of an as_pushed disk push can;
- a version-2 client's results are the bytes they were (no RESULT_SERVE flag, no tail); a version-2
  UPDATE_BEGIN with the serve_dtype byte set is MALFORMED, a version-3 one with an undefined code
  (3) likewise; the daemon keeps serving;
- a version-3 request reserves the 4-byte tail: one that fits max_message_bytes with 2 bytes to spare
  is accepted in version 2 and refused in version 3, naming the tail;
- the Python client refuses an unknown serve_dtype before sending anything."""
import json
import os
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
from harness import ROOT, TMP, case, main  # noqa: E402
from rdtest import Daemon, rpc, stop_cleanly  # noqa: E402
_n = len(harness._cases)
from test_serve_dtype import BF16, PROMPTS, pushed_bf16, q8_0_copy, runs, same  # noqa: E402
del harness._cases[_n:]     # its helpers only, not its cases

sys.path.insert(0, os.path.join(ROOT, "tools", "python"))
from rolloutd import Client, Pool, proto  # noqa: E402

_tmp = tempfile.mkdtemp(prefix="rd-servepol-", dir=TMP)
_daemons = []
_q8 = None


def daemon(*extra, **kw):
    d = Daemon(*extra, **kw)
    _daemons.append(d)
    return d


def q8_daemon():
    global _q8
    if _q8 is None:
        path = os.path.join(_tmp, "tiny-q8_0.gguf")
        q8_0_copy(BF16, path)
        _q8 = daemon(model=path)
    return _q8


def post(d, path, body, timeout=120):
    """(status, parsed JSON body) of a POST to d's HTTP server."""
    return d.post(path, body, timeout)


def dtypes(samples):
    return {(s.serve_dtype, s.serve_dtype_first) for s in samples}


@case
def per_push_serve_dtype_over_the_config_and_results_say_which():
    a = q8_daemon()
    ref_bf16 = daemon(model=BF16)
    b = daemon("--serve-dtype", "as_pushed", model=BF16)
    with Client(a.url) as ca, Client(ref_bf16.url) as cr, Client(b.url) as cb:
        assert cb.version >= 3, cb.version  # serve_dtype in results: version 3 and later
        bf16_runs, q8_runs = runs(cr), runs(ca)
        assert not same(bf16_runs, q8_runs), "the bf16 and Q8_0 files give the same bits: the test shows nothing"
        r0 = runs(cb)
        assert dtypes(r0) == {("as_pushed", "as_pushed")}, dtypes(r0)
        assert same(r0, bf16_runs)
        v = cb.info.weight_version
        cb.push_weights(pushed_bf16(), v + 1, serve_dtype="q8_0")
        r1 = runs(cb)
        assert same(r1, q8_runs), "a push with serve_dtype q8_0 is not served as the gguf package's Q8_0 file"
        assert all(s.version_finish == v + 1 for s in r1)
        assert dtypes(r1) == {("q8_0", "q8_0")}, dtypes(r1)
        st = cb.status()
        assert st["serve_dtype"] == "as_pushed" and st["weights_serve_dtype"] == "q8_0", st
        assert set(st["memory"]["weights_bytes_by_dtype"]) == {"q8_0", "f32"}, st["memory"]
        code, out = post(b, "/generate", {"input_ids": PROMPTS[0], "sampling_params": {"max_new_tokens": 4}})
        assert code == 200 and out["meta_info"]["serve_dtype"] == "q8_0", (code, out)
        assert out["meta_info"]["weight_version"] == str(v + 1), out["meta_info"]
        cb.push_weights(pushed_bf16(), v + 2)      # no serve_dtype: the config's (as_pushed)
        r2 = runs(cb)
        assert same(r2, bf16_runs), "a push without serve_dtype is not served as pushed (bf16)"
        assert dtypes(r2) == {("as_pushed", "as_pushed")}, dtypes(r2)
        assert cb.status()["weights_serve_dtype"] == "as_pushed"
        code, out = post(b, "/generate", {"input_ids": PROMPTS[0], "sampling_params": {"max_new_tokens": 4}})
        assert code == 200 and out["meta_info"]["serve_dtype"] == "as_pushed", (code, out)
        try:
            cb.push_weights(pushed_bf16(), v + 3, serve_dtype="q4_0")
            raise AssertionError("serve_dtype q4_0 accepted")
        except ValueError as e:
            assert "q4_0" in str(e), e
        assert cb.status()["weight_version"] == v + 2


@case
def pool_chain_push_takes_serve_dtype():
    """Pool.push_weights(serve_dtype="q8_0") over a chain of two as_pushed daemons: both serve the Q8_0
    file's bits and say q8_0."""
    a = q8_daemon()
    ds = [daemon("--serve-dtype", "as_pushed", model=BF16) for _ in range(2)]
    with Client(a.url) as ca, Pool([d.url for d in ds]) as pool:
        q8_runs = runs(ca)
        res = pool.push_weights(pushed_bf16(), 5, serve_dtype="q8_0", fanout="chain")
        assert [r.version for r in res] == [5, 5] and res[1].fanout == "chain", res
        for d in ds:
            with Client(d.url) as c:
                r = runs(c)
                assert same(r, q8_runs), f"{d.url}: a chained q8_0 push differs from the Q8_0 file"
                assert dtypes(r) == {("q8_0", "q8_0")}, dtypes(r)


@case
def rolloutctl_push_takes_serve_dtype():
    """rolloutctl push-weights --serve-dtype q8_0 (the C push library, its UPDATE_BEGIN in version 3) of the
    bf16 file to two as_pushed daemons (a chain): both serve the Q8_0 file's bits; a bad value is refused."""
    import subprocess
    a = q8_daemon()
    ds = [daemon("--serve-dtype", "as_pushed", model=BF16) for _ in range(2)]
    ctl = os.path.join(ROOT, os.environ.get("RD_BUILD", "build"), "rolloutctl")
    urls = ",".join(d.url for d in ds)
    bad = subprocess.run([ctl, "push-weights", "--connect", urls, BF16, "--version", "3", "--serve-dtype", "int4"],
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode != 0 and "serve-dtype" in bad.stderr, (bad.returncode, bad.stderr)
    # f32 on the wire: the file's bf16 weights exactly, and its f32 norms unrounded (as the Q8_0 file has them)
    ok = subprocess.run([ctl, "push-weights", "--connect", urls, BF16, "--version", "3", "--serve-dtype", "q8_0",
                         "--json"], capture_output=True, text=True, timeout=300)
    assert ok.returncode == 0, ok.stderr[-2000:]
    with Client(a.url) as ca:
        q8_runs = runs(ca)
    for d in ds:
        with Client(d.url) as c:
            r = runs(c)
            assert c.info.weight_version == 3 and same(r, q8_runs), f"{d.url}: rolloutctl's q8_0 push differs"
            assert dtypes(r) == {("q8_0", "q8_0")}, dtypes(r)


@case
def update_weights_from_disk_takes_serve_dtype():
    a = q8_daemon()
    b = daemon("--serve-dtype", "as_pushed", model=BF16)
    with Client(a.url) as ca, Client(b.url) as cb:
        q8_runs = runs(ca)
        assert not same(runs(cb), q8_runs)
        code, out = post(b, "/update_weights_from_disk", {"model_path": BF16, "serve_dtype": "int4"})
        assert code == 400 and "serve_dtype" in json.dumps(out), (code, out)
        code, out = post(b, "/update_weights_from_disk", {"model_path": BF16, "serve_dtype": "q8_0"})
        assert code == 200 and out.get("success"), (code, out)
        r = runs(cb)
        assert same(r, q8_runs), "/update_weights_from_disk serve_dtype q8_0 differs from the Q8_0 file"
        assert dtypes(r) == {("q8_0", "q8_0")}, dtypes(r)
        # the file would give back bf16 on resume, not this policy: releasing the weights is refused
        code, out = post(b, "/release_memory_occupation", {"tags": ["weights"]})
        assert code == 400 and "q8_0" in json.dumps(out), (code, out)
        assert same(runs(cb), q8_runs), "the refused release changed what is served"
        code, out = post(b, "/update_weights_from_disk", {"model_path": BF16, "serve_dtype": "as_pushed"})
        assert code == 200 and out.get("success"), (code, out)
        code, out = post(b, "/release_memory_occupation", {"tags": ["weights"]})
        assert code == 200, (code, out)
        code, out = post(b, "/resume_memory_occupation", {"tags": ["weights"]})
        assert code == 200, (code, out)
        assert dtypes(runs(cb)) == {("as_pushed", "as_pushed")}


@case
def version_2_clients_see_the_old_bytes_and_cannot_set_serve_dtype():
    b = daemon("--serve-dtype", "q8_0", model=BF16)
    q = proto.Request(client_req_id=1, n=1, max_tokens=5, temperature=1.0, seed=3, flags=proto.REQ_HAS_SEED,
                      prompt_ids=PROMPTS[0])
    with b.sock() as s2, b.sock() as s3:
        h2 = rpc(s2, proto.Hello(min_version=1, max_version=2, client_name="v2"))
        h3 = rpc(s3, proto.Hello(min_version=1, max_version=3, client_name="v3"))
        assert h2.version == 2 and h3.version == 3, (h2, h3)
        frames = {}
        for s, h, v in ((s2, h2, 2), (s3, h3, 3)):
            s.send(proto.encode(proto.Submit(client_id=h.client_id, requests=[q]), v))
            assert proto.decode(s.recv()).items[0].status == 0
            while True:
                s.send(proto.encode(proto.Fetch(client_id=h.client_id, max_results=8, wait_ms=2000), v))
                f = s.recv()
                m = proto.decode(f)
                if m.results:
                    frames[v] = (f, m.results[0])
                    break
        (f2, x2), (f3, x3) = frames[2], frames[3]
        assert not x2.flags & proto.RESULT_SERVE and x3.flags & proto.RESULT_SERVE, (x2.flags, x3.flags)
        assert x3.serve_dtype == x3.serve_dtype_first == proto.SERVE_AS_PUSHED, x3   # the file, as loaded
        assert len(f3) == len(f2) + proto.SERVE_TAIL_BYTES, (len(f2), len(f3))
        assert np.array_equal(x2.token_ids, x3.token_ids)
        # the serve_dtype byte of UPDATE_BEGIN: reserved before version 3, 0..4 from it
        ub = proto.UpdateBegin(client_id=h3.client_id, version=9, serve_dtype=2, window=1, max_chunk_bytes=4096,
                               total_bytes=4, tensors=[proto.Tensor("model.norm.weight", proto.DTYPE_F32, [1], 4)])
        good = bytearray(proto.encode(ub, 3))
        for version, code in ((2, 2), (3, proto.SERVE_MAX + 1)):
            bad = bytearray(good)
            bad[4] = version
            bad[16 + 16 + 1] = code     # after client_id, version, mode
            s3.send(bytes(bad))
            e = proto.decode(s3.recv())
            assert isinstance(e, proto.Error) and e.code == proto.E.MALFORMED and "serve_dtype" in e.message, e
    with Client(b.url) as c:
        assert c.generate([PROMPTS[1]], max_tokens=3)[0].serve_dtype == "as_pushed"


@case
def version_3_requests_reserve_the_serve_tail():
    """A request whose worst-case result fits max_message_bytes with 2 bytes to spare is accepted in
    version 2 and refused in version 3 (its results carry the 4-byte serve tail), by name."""
    mt = 200
    worst = proto.RESULT_MIN_BYTES + mt * (8 + proto.SPAN_BYTES) + proto.RESULTS_OVERHEAD
    assert worst == proto.result_max_bytes(mt, False, 0) + proto.RESULTS_OVERHEAD
    b = daemon("--max-message-bytes", worst + 2, model=BF16)
    q = proto.Request(client_req_id=1, n=1, max_tokens=mt, temperature=1.0, prompt_ids=PROMPTS[0][:2])
    with b.sock() as s:
        for v, want in ((2, 0), (3, proto.E.INVALID_PARAMS)):
            h = rpc(s, proto.Hello(min_version=1, max_version=v, client_name=f"v{v}"))
            q.client_req_id += 1
            s.send(proto.encode(proto.Submit(client_id=h.client_id, requests=[q]), v))
            item = proto.decode(s.recv()).items[0]
            assert item.status == want, (v, item)
            if want:
                assert "serve_dtype tail" in item.message, item.message
            else:
                s.send(proto.encode(proto.Abort(client_id=h.client_id, flags=proto.ABORT_ALL), v))
                s.recv()


@case
def daemons_stop_cleanly():
    stop_cleanly(*_daemons)


if __name__ == "__main__":
    main()
