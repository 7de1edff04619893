"""Delta weight pushes (issue 24, PROTOCOL.md §10.14) against real daemons on
loopback, driven by rolloutd.Pool and rolloutd.delta:

- a delta push serves bit for bit what a full push of the same bf16 weights
  serves (greedy and seeded sampled tokens and log-probs), on the tiny Qwen3
  and on the default model, directly and through a chain of 3; /status says
  kind "delta", its wire bytes and the changed fraction NumPy counts;
- refused at UPDATE_BEGIN with their own codes, the served weights untouched:
  a base version other than the serving one (BASE_MISMATCH), a tensor held in
  another dtype or as loaded from the file (DTYPE_MISMATCH), a tensor served
  quantized (BASE_QUANTIZED); a corrupted delta record (its chunk CRC made to
  match) is refused at COMMIT with CHECKSUM;
- a daemon that missed a version inside a chain refuses the delta, gets the
  full push in the same call, and every daemon ends on the new version;
- a learner killed mid-delta: the transfer ends, nothing is half-applied, the
  next delta against the old version goes through.
The weights move the way RL steps move them: fp32 master weights, one Adam
step at lr 1e-5 on random gradients, cast to bf16 (rolloutd.bf16_bits)."""
import os
import signal
import struct
import subprocess
import sys
import textwrap

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import MODEL, ROOT, case, main  # noqa: E402
from rdtest import Daemon  # noqa: E402

sys.path.insert(0, os.path.join(ROOT, "tools", "python"))
from rolloutd import Client, DaemonError, Pool, bf16_bits, proto  # noqa: E402
from rolloutd import delta as D  # noqa: E402

DATA = os.environ.get("RD_TESTDATA", os.path.join(ROOT, "build", "testdata"))
QWEN3 = os.path.join(DATA, "tiny-qwen3.gguf")
PROMPTS = [[1, 9, 31, 25, 13, 29, 28], [1, 50, 34, 28, 46, 31, 21, 33, 30]]
_daemons = []


def daemon(*extra, model=QWEN3):
    d = Daemon(*extra, model=model)
    _daemons.append(d)
    return d


def stop_all():
    while _daemons:
        _daemons.pop().stop()


def master(path=os.path.join(DATA, "tiny-qwen3.npz")):
    z = np.load(path)
    return {k: np.array(z[k], dtype=np.float32) for k in z.files}


def adam_steps(w, lr, steps, seed):
    """fp32 master weights after `steps` Adam steps on random gradients (betas 0.9, 0.999)."""
    rng = np.random.default_rng(seed)
    out = {}
    for k, x in w.items():
        x = x.copy()
        m = np.zeros_like(x)
        v = np.zeros_like(x)
        for t in range(1, steps + 1):
            g = rng.standard_normal(x.shape, dtype=np.float32)
            m = 0.9 * m + 0.1 * g
            v = 0.999 * v + 0.001 * g * g
            x -= lr * (m / (1 - 0.9 ** t)) / (np.sqrt(v / (1 - 0.999 ** t)) + 1e-8)
        out[k] = x
    return out


def bf16(w):
    return {k: bf16_bits(x) for k, x in w.items()}


def outputs(url):
    with Client(url, name="probe") as c:
        g = c.generate(PROMPTS, max_tokens=12, temperature=0.0, ignore_eos=True)
        s = c.generate(PROMPTS, n=3, max_tokens=12, temperature=1.0, seed=11, ignore_eos=True)
    return [(list(map(int, x.token_ids)), np.asarray(x.logprobs, dtype=np.float32).tobytes()) for x in g + s]


def version(url):
    with Client(url, name="probe") as c:
        return c.status()["weight_version"]


def last_update(url):
    with Client(url, name="probe") as c:
        return c.status()["last_weight_update"]


def changed_fraction(new, old):
    n = sum(int(np.count_nonzero(new[k] != old[k])) for k in new)
    return n / sum(new[k].size for k in new)


def refused(url, prep, ver, code):
    with Client(url, name="learner") as c:
        try:
            c.push_weights(prep, ver)
        except DaemonError as e:
            assert e.code == code, (proto.E(e.code).name, str(e))
            return str(e)
    raise AssertionError(f"{url} took the push; expected {proto.E(code).name}")


@case
def encoder_streams_decode_to_the_new_bytes_on_threads_too():
    """The encoder against its reference decoder on random tensors, record sizes and
    changes (bf16/f16 and f32 elements): the changed count is exact, the stream decodes
    to the new bytes, the runs it sizes without building are the runs it would build,
    and the threaded encoder writes the same stream."""
    from concurrent.futures import ThreadPoolExecutor
    rng = np.random.default_rng(3)
    seen = set()
    with ThreadPoolExecutor(3) as ex:
        for trial in range(200):
            es = (2, 4)[trial % 2]
            n = int(rng.integers(1, 4000))
            hi = 2 ** (8 * es)
            new = rng.integers(0, hi, n, dtype=np.uint16 if es == 2 else np.uint32)
            base = new.copy()
            idx = np.sort(rng.choice(n, int(rng.integers(1, n + 1)), replace=False))
            base[idx] ^= (rng.integers(1, 4, len(idx)) << int(rng.integers(0, 8 * es - 2))).astype(base.dtype)
            assert D._runs_bytes(idx, es) == len(D._runs_payload(new, idx, es)), trial
            rb = int(rng.integers(es, 5000))
            s, ch = D.encode_tensor(new.view(np.uint8), base.view(np.uint8), es, record_bytes=rb)
            assert ch == len(idx), (trial, ch, len(idx))
            assert np.array_equal(D.decode(s, base.view(np.uint8), es), new.view(np.uint8)), trial
            s2, ch2 = D.encode_tensor(new.view(np.uint8), base.view(np.uint8), es, record_bytes=rb, executor=ex)
            assert (s2, ch2) == (s, ch), trial
            at = 0
            while at < len(s):
                kind, payload, _, _ = D.HEAD.unpack_from(s, at)
                seen.add(kind)
                at += D.HEAD_BYTES + payload
            for only in D.KINDS:    # each kind alone decodes too
                s3, ch3 = D.encode_tensor(new.view(np.uint8), base.view(np.uint8), es, record_bytes=rb, kinds=(only,))
                assert ch3 == ch and np.array_equal(D.decode(s3, base.view(np.uint8), es), new.view(np.uint8)), \
                    (trial, only)
    assert seen == set(D.KINDS), seen       # the choice takes each kind somewhere

    def leb128(v):
        out = bytearray()
        while True:
            out.append((v & 0x7F) | (0x80 if v > 0x7F else 0))
            v >>= 7
            if not v:
                return bytes(out)
    gaps = [0, 1, 127, 128, 300, 16383, 16384, 2 ** 21 - 1, 2 ** 21, 2 ** 28 - 1, 2 ** 28, 2 ** 32 - 1]
    assert D._varints(np.array(gaps, dtype=np.int64)) == b"".join(map(leb128, gaps))


@case
def the_c_encoder_on_threads_writes_streams_the_reference_decodes():
    """A built tree's Python package encodes through build/librddelta.so (client/rd_delta.c, outside
    the GIL) by default: tensors of several 8-record slices encoded on threads decode (reference
    decoder) to the new bytes with NumPy's changed count, at a few percent changed and at most, in
    2- and 4-byte elements; ROLLOUTD_DELTA_LIB=none leaves NumPy."""
    from concurrent.futures import ThreadPoolExecutor
    assert D.C_LIB is not None and D.C_LIB.endswith("librddelta.so"), "a built tree must load build/librddelta.so"
    rng = np.random.default_rng(11)
    n2 = (2 * D.SLICE_RECORDS * D.RECORD_BYTES + 3 * D.RECORD_BYTES + 10) // 2     # 2 slices and a part
    with ThreadPoolExecutor(3) as ex:
        for dt, n, frac in ((np.uint16, n2, 0.02), (np.uint16, n2, 0.6), (np.uint32, n2 // 4, 0.05)):
            base = rng.integers(0, np.iinfo(dt).max, n, dtype=dt)
            new = base.copy()
            idx = np.flatnonzero(rng.random(n) < frac)
            new[idx] ^= rng.integers(1, 256, len(idx)).astype(dt)
            es = np.dtype(dt).itemsize
            s, ch = D.encode_tensor(new.view(np.uint8), base.view(np.uint8), es, executor=ex)
            assert ch == len(idx), (dt, frac, ch, len(idx))
            assert np.array_equal(D.decode(s, base.view(np.uint8), es), new.view(np.uint8)), (dt, frac)
            assert s == D.encode_tensor(new.view(np.uint8), base.view(np.uint8), es, c=True)[0], "threads changed it"
    env = dict(os.environ, ROLLOUTD_DELTA_LIB="none")
    out = subprocess.run([sys.executable, "-c", "import sys; sys.path.insert(0, sys.argv[1]); "
                          "from rolloutd import delta; print(delta.C_LIB)", os.path.join(ROOT, "tools", "python")],
                         env=env, capture_output=True, text=True, check=True).stdout.strip()
    assert out == "None", out


W0 = W1 = W2 = W3 = None


def weights():
    global W0, W1, W2, W3
    if W0 is None:
        m0 = master()
        m1 = adam_steps(m0, 1e-5, 1, 1)
        m2 = adam_steps(m1, 1e-5, 1, 2)
        m3 = adam_steps(m2, 1e-5, 1, 3)
        W0, W1, W2, W3 = bf16(m0), bf16(m1), bf16(m2), bf16(m3)
    return W0, W1, W2, W3


@case
def delta_push_serves_what_a_full_push_serves_qwen3():
    w0, w1, _, _ = weights()
    frac = changed_fraction(w1, w0)
    assert 0 < frac < 0.5, frac
    ref, dd = daemon(), daemon()
    try:
        with Client(ref.url, name="ref") as c:
            c.push_weights(w0, 1)
            c.push_weights(w1, 2)
        with Pool([dd.url]) as pool:
            pool.push_weights(w0, 1)
            assert pool.last_push["kind"] == "full"
            pool.push_weights(w1, 2)
            lp = pool.last_push
        assert lp["kind"] == "delta" and lp["delta"]["delta_tensors"] == len(w1), lp
        assert version(dd.url) == 2
        assert outputs(dd.url) == outputs(ref.url), "delta push serves other bits than the full push"
        lu = last_update(dd.url)
        assert lu["ok"] and lu["kind"] == "delta" and lu["delta_tensors"] == len(w1), lu
        full_bytes = sum(x.nbytes for x in w1.values())
        assert lu["tensor_bytes"] == full_bytes and lu["wire_bytes"] == lp["wire_bytes"] < full_bytes, lu
        assert abs(lu["changed_fraction"] - frac) < 1e-12, (lu["changed_fraction"], frac)
        assert last_update(ref.url)["kind"] == "full" and last_update(ref.url)["changed_fraction"] is None
    finally:
        stop_all()


@case
def delta_push_serves_what_a_full_push_serves_default_model():
    from pushdata import weights as default_weights
    m0 = {k: np.array(v) for k, v in default_weights().items()}
    w0 = bf16(m0)
    rng = np.random.default_rng(5)
    # one Adam step at lr 1e-5 (the first step moves each weight by lr * sign(g))
    w1 = {k: bf16_bits(x - np.float32(1e-5) * np.sign(rng.standard_normal(x.shape, dtype=np.float32)))
          for k, x in m0.items()}
    ref, dd = daemon(model=MODEL), daemon(model=MODEL)
    try:
        with Client(ref.url, name="ref") as c:
            c.push_weights(w0, 1)
            c.push_weights(w1, 2)
        with Pool([dd.url]) as pool:
            pool.push_weights(w0, 1)
            pool.push_weights(w1, 2)
            lp = pool.last_push
        assert lp["kind"] == "delta", lp
        assert outputs(dd.url) == outputs(ref.url), "delta push serves other bits than the full push"
        lu = last_update(dd.url)
        assert abs(lu["changed_fraction"] - changed_fraction(w1, w0)) < 1e-12, lu
        assert lu["wire_bytes"] < 0.5 * lu["tensor_bytes"], lu
    finally:
        stop_all()


@case
def delta_refusals_have_their_own_codes_and_leave_the_weights():
    w0, w1, _, _ = weights()
    fresh, dd, q8 = daemon(), daemon(), daemon("--serve-dtype", "q8_0")
    try:
        # held as loaded from the file: no pushed bf16 base
        why = refused(fresh.url, D.prepare_delta(w1, w0, 0), 1, proto.E.DTYPE_MISMATCH)
        assert "not from a push" in why, why
        with Client(dd.url, name="learner") as c:
            c.push_weights(w0, 1)
        before = outputs(dd.url)
        why = refused(dd.url, D.prepare_delta(w1, w0, 7), 2, proto.E.BASE_MISMATCH)
        assert "base_version 7" in why and "serves version 1" in why, why
        f16 = {k: x.astype(np.float16) for k, x in master().items()}
        f16b = {k: (x + np.float16(1e-3)).astype(np.float16) for k, x in f16.items()}
        why = refused(dd.url, D.prepare_delta(f16b, f16, 1), 2, proto.E.DTYPE_MISMATCH)
        assert "is f16" in why and "in bf16" in why, why
        # a corrupted record whose chunk CRC matches (corrupted before the chunks are checksummed): a RUNS
        # value, or a sparse record's XOR, decodes to other bytes, which only the tensor's CRC-32C catches;
        # a zstd frame that fails to decode, or a sparse record whose gaps end early, is malformed
        real = D.encode_tensor
        name = "model.layers.1.mlp.down_proj.weight"

        def last_sparse(s, bend):
            """s with its last record (SPARSE_ZSTD) recompressed after bend(content bytes)."""
            import zstandard
            at = 0
            while True:
                kind, payload, off, n = D.HEAD.unpack_from(s, at)
                if at + D.HEAD_BYTES + payload == len(s):
                    break
                at += D.HEAD_BYTES + payload
            assert kind == D.SPARSE_ZSTD, kind
            raw = bytearray(zstandard.ZstdDecompressor().decompress(s[at + D.HEAD_BYTES:]))
            z = zstandard.ZstdCompressor(level=1).compress(bytes(bend(raw)))
            return s[:at] + D.HEAD.pack(kind, len(z), off, n) + z

        def flip_last(b):
            b[-1] ^= 0x01
            return b

        def value_bit(raw):     # the last changed element's XOR, its low byte: a mantissa bit
            count = struct.unpack_from("<I", raw)[0]
            raw[len(raw) - 2 * count + count - 1] ^= 0x01
            return raw

        def cut_gaps(raw):      # one changed element fewer, its planes kept: the gaps run out early
            count = struct.unpack_from("<I", raw)[0]
            return raw[:4] + raw[4:len(raw) - 2 * count - 1] + raw[len(raw) - 2 * count:]

        for kind, bend, code in ((D.RUNS, flip_last, proto.E.CHECKSUM),
                                 (D.XOR_ZSTD, flip_last, proto.E.INVALID_PARAMS),
                                 (D.SPARSE_ZSTD, value_bit, proto.E.CHECKSUM),
                                 (D.SPARSE_ZSTD, cut_gaps, proto.E.INVALID_PARAMS)):
            def corrupt(new, base, es, *a, **k):
                k["kinds"] = (kind,)
                s, n = real(new, base, es, *a, **k)
                if kind == D.SPARSE_ZSTD:
                    return last_sparse(s, bend), n
                return bytes(bend(bytearray(s))), n     # the last value of the last run, or the frame's end
            D.encode_tensor = corrupt
            try:
                prep = D.prepare_delta({name: w1[name]}, w0, 1)
            finally:
                D.encode_tensor = real
            why = refused(dd.url, prep, 2, code)
            assert "down_proj" in why, why
        # a delta whose new bytes hold a NaN (the non-finite check runs on a delta tensor's decoded bytes,
        # group by group), in the manifest's last linear weight: the groups before it were already built
        nan = dict(w1)
        last = [k for k in nan if k.endswith("down_proj.weight")][-1]
        bad = nan[last].copy()
        bad.reshape(-1)[bad.size // 2] = 0x7FC0     # bf16 NaN
        nan[last] = bad
        for kind in D.KINDS:    # whichever record writes it
            def only(new, base, es, *a, **k):
                k["kinds"] = (kind,)
                return real(new, base, es, *a, **k)
            D.encode_tensor = only
            try:
                prep = D.prepare_delta(nan, w0, 1)
            finally:
                D.encode_tensor = real
            why = refused(dd.url, prep, 2, proto.E.INVALID_PARAMS)
            assert "NaN" in why and f"element {bad.size // 2} " in why, (kind, why)
        assert version(dd.url) == 1 and outputs(dd.url) == before, "a refused delta changed the weights"
        # served quantized: the bf16 base is gone
        with Client(q8.url, name="learner") as c:
            c.push_weights(w0, 1)
        why = refused(q8.url, D.prepare_delta(w1, w0, 1), 2, proto.E.BASE_QUANTIZED)
        assert "quantized" in why, why
        # and the daemon still takes a good delta
        with Client(dd.url, name="learner") as c:
            c.push_weights(D.prepare_delta(w1, w0, 1), 2)
        assert version(dd.url) == 2 and last_update(dd.url)["kind"] == "delta"
    finally:
        stop_all()


@case
def a_push_served_quantized_is_no_delta_base():
    """A per-push serve_dtype (issue 26) meets deltas: a delta applied to the pushed bf16 bytes and
    served as q8_0 serves what a full push served as q8_0 does; what it leaves held is quantized, so
    the next delta is refused BASE_QUANTIZED and the Pool pushes that version whole, after which
    deltas (served as pushed) go through again."""
    w0, w1, w2, w3 = weights()
    dd, ref = daemon(), daemon("--serve-dtype", "q8_0")
    try:
        with Client(ref.url, name="ref") as c:
            c.push_weights(w1, 2)
        with Pool([dd.url]) as pool:
            pool.push_weights(w0, 1)
            pool.push_weights(w1, 2, serve_dtype="q8_0")
            assert pool.last_push["kind"] == "delta", pool.last_push
            assert outputs(dd.url) == outputs(ref.url), "a delta served as q8_0 differs from a full q8_0 push"
            pool.push_weights(w2, 3)
            lp = pool.last_push
            assert lp["full_pushes"] == [dd.url], lp     # refused as a delta, pushed whole in the same call
            assert version(dd.url) == 3 and last_update(dd.url)["kind"] == "full"
            pool.push_weights(w3, 4)
            assert pool.last_push["kind"] == "delta" and not pool.last_push["full_pushes"], pool.last_push
            assert last_update(dd.url)["kind"] == "delta" and version(dd.url) == 4
    finally:
        stop_all()


@case
def delta_through_a_chain_of_three():
    w0, w1, _, _ = weights()
    ref = daemon()
    ds = [daemon(), daemon(), daemon()]
    try:
        with Client(ref.url, name="ref") as c:
            c.push_weights(w0, 1)
            c.push_weights(w1, 2)
        with Pool([d.url for d in ds]) as pool:
            pool.push_weights(w0, 1)
            res = pool.push_weights(w1, 2, fanout="chain")
            assert pool.last_push["kind"] == "delta" and not pool.last_push["full_pushes"], pool.last_push
        assert sorted(r.hop for r in res) == [0, 1, 2], [r.hop for r in res]
        want = outputs(ref.url)
        for d in ds:
            assert version(d.url) == 2 and last_update(d.url)["kind"] == "delta", last_update(d.url)
            assert outputs(d.url) == want, f"{d.url} serves other bits after the chained delta"
    finally:
        stop_all()


@case
def a_daemon_that_missed_a_version_still_ends_on_the_new_one():
    w0, w1, w2, _ = weights()
    ref = daemon()
    a, b, c = daemon(), daemon(), daemon()
    try:
        with Client(ref.url, name="ref") as r:
            r.push_weights(w2, 2)
        with Pool([a.url, b.url, c.url]) as pool:
            pool.push_weights(w0, 1)
            for d in (a, c):                  # b misses version 2: it stays on 1
                with Client(d.url, name="learner") as cl:
                    cl.push_weights(w1, 2)
            # a and c serve 2, b serves 1: a forced delta against version 2
            res = pool.push_weights(w2, 3, base=w1, base_version=2, delta=True, fanout="chain")
            assert pool.last_push["kind"] == "delta" and pool.last_push["full_pushes"] == [b.url], pool.last_push
        assert [getattr(r, "delta_refused", False) for r in res] == [False, True, False]
        with Client(ref.url, name="ref") as r:
            r.push_weights(w2, 3)
        want = outputs(ref.url)
        for d, kind in ((a, "delta"), (b, "full"), (c, "delta")):
            assert version(d.url) == 3 and last_update(d.url)["kind"] == kind, (d.url, last_update(d.url))
            assert outputs(d.url) == want, d.url
    finally:
        stop_all()


@case
def learner_killed_mid_delta_leaves_nothing_half_applied():
    w0, w1, _, _ = weights()
    dd = daemon("--update-idle-s", "2")
    try:
        with Client(dd.url, name="learner") as c:
            c.push_weights(w0, 1)
        before = outputs(dd.url)
        # a learner that dies (SIGKILL) once the first chunks of its delta are acknowledged
        script = textwrap.dedent(f"""
            import os, signal, sys
            import numpy as np
            sys.path.insert(0, {os.path.join(ROOT, "tools", "python")!r})
            sys.path.insert(0, {os.path.dirname(os.path.abspath(__file__))!r})
            import test_delta as T
            from rolloutd import Client, delta as D
            w0, w1, _, _ = T.weights()
            prep = D.prepare_delta(w1, w0, 1, chunk_bytes=4096)
            def die(done, total):
                if done > 0:
                    os.kill(os.getpid(), signal.SIGKILL)
            with Client({dd.url!r}, name="doomed") as c:
                c.push_weights(prep, 2, window=1, progress=die)
        """)
        p = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
        assert p.returncode == -signal.SIGKILL, (p.returncode, p.stderr[-2000:])
        import time
        deadline = time.time() + 15
        while True:
            lu = last_update(dd.url)
            if lu and lu["version"] == 2 and not lu["ok"]:
                break
            assert time.time() < deadline, f"the dead learner's transfer is still open: {lu}"
            time.sleep(0.2)
        assert version(dd.url) == 1 and outputs(dd.url) == before, "a killed delta changed the weights"
        with Pool([dd.url]) as pool:
            pool.push_weights(w1, 2, base=w0, base_version=1)
            assert pool.last_push["kind"] == "delta"
        assert version(dd.url) == 2
    finally:
        stop_all()


def write_safetensors(path, tensors):
    """tensors {name: uint16 bf16 bits}: a .safetensors file (BF16), written here."""
    import json
    import struct
    hdr, off, blobs = {}, 0, []
    for k, a in tensors.items():
        b = np.ascontiguousarray(a, dtype="<u2").tobytes()
        hdr[k] = {"dtype": "BF16", "shape": list(a.shape), "data_offsets": [off, off + len(b)]}
        off += len(b)
        blobs.append(b)
    h = json.dumps(hdr).encode()
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


@case
def rolloutctl_push_weights_base_sends_deltas():
    """rolloutctl push-weights NEW --base OLD (the C encoder, client/rd_delta.c): the daemon on the base
    version serves what a full push serves; one still on its file refuses and gets NEW whole."""
    import tempfile
    from harness import BUILD, TMP
    w0, w1, _, _ = weights()
    work = tempfile.mkdtemp(prefix="rd-delta-ctl-", dir=TMP)
    old, new = os.path.join(work, "old.safetensors"), os.path.join(work, "new.safetensors")
    write_safetensors(old, w0)
    write_safetensors(new, w1)
    ref, dd, fresh = daemon(), daemon(), daemon()
    try:
        with Client(ref.url, name="ref") as c:
            c.push_weights(w1, 2)
        with Client(dd.url, name="learner") as c:
            c.push_weights(w0, 1)
        p = subprocess.run([os.path.join(BUILD, "rolloutctl"), "push-weights", "--connect", f"{dd.url},{fresh.url}",
                            new, "--version", "2", "--base", old, "--fanout", "direct"],
                           capture_output=True, text=True, timeout=120)
        assert p.returncode == 0, (p.stdout, p.stderr)
        assert f"{fresh.url} refused the delta; pushed it whole" in p.stderr, p.stderr
        lu = last_update(dd.url)
        assert lu["kind"] == "delta" and lu["delta_tensors"] == len(w1) and lu["wire_bytes"] < lu["tensor_bytes"], lu
        assert abs(lu["changed_fraction"] - changed_fraction(w1, w0)) < 1e-12, lu
        assert last_update(fresh.url)["kind"] == "full" and version(fresh.url) == 2
        want = outputs(ref.url)
        assert outputs(dd.url) == want and outputs(fresh.url) == want
    finally:
        stop_all()


if __name__ == "__main__":
    main()
