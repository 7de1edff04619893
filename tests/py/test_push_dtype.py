"""Pushed weights keep the pushed dtype (issue 12), against real daemons on
loopback, driven by the Python client:

- failed pushes onto the Q4_1-started default model (a tensor checksum that
  does not match, a transfer aborted half way): the daemon keeps serving the
  Q4_1 weights, /status memory.weights_bytes unchanged, greedy outputs and
  log-probs bit-identical;
- a bf16 push of every weight (the model's own bf16 export, written by
  rollout-export): the daemon then serves bf16 weights, with greedy outputs and
  log-probs bit-identical to a second daemon started from that bf16 HF folder,
  and weights_bytes equal to that daemon's (bf16 bytes: ~2.8x the Q4_1 ones,
  and half of what an fp32 copy would hold), so the Q4_1 weights are gone."""
import json
import os
import struct
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import BUILD, MODEL, ROOT, TMP, case, main, run  # noqa: E402
from rdtest import PROMPT, Daemon, stop_cleanly  # noqa: E402

sys.path.insert(0, os.path.join(ROOT, "tools", "python"))
from rolloutd import Client, DaemonError, proto  # noqa: E402

PROMPTS = [PROMPT, [1, 504, 3458, 282, 4649, 314, 216, 33, 30], [1, 9690, 314]]
_tmp = tempfile.mkdtemp(prefix="rd-pushdt-", dir=TMP)
_daemons = []
_hf = None


def bf16_export():
    """(folder, {HF name: uint16 array}): the default model exported once as bf16."""
    global _hf
    if _hf is None:
        out = os.path.join(_tmp, "hf-bf16")
        run([os.path.join(BUILD, "rollout-export"), "--model", MODEL, "--out", out, "--dtype", "bf16"])
        path = os.path.join(out, "model.safetensors")
        with open(path, "rb") as f:
            (n,) = struct.unpack("<Q", f.read(8))
            hdr = json.loads(f.read(n))
        raw = np.memmap(path, dtype=np.uint8, mode="r", offset=8 + n)
        t = {}
        for k, v in hdr.items():
            if k != "__metadata__":
                assert v["dtype"] == "BF16", v
                a, b = v["data_offsets"]
                t[k] = raw[a:b].view(np.uint16).reshape(v["shape"])
        _hf = (out, t)
    return _hf


def daemon(**kw):
    d = Daemon(**kw)
    _daemons.append(d)
    return d


def greedy(c):
    return c.generate(PROMPTS, max_tokens=24, temperature=0.0, ignore_eos=True)


def same(a, b):
    """Bit-identical token ids and log-probs, sample for sample."""
    return len(a) == len(b) and all(
        np.array_equal(x.token_ids, y.token_ids) and np.array_equal(x.logprobs.view(np.uint32),
                                                                     y.logprobs.view(np.uint32))
        for x, y in zip(a, b))


def weights_bytes(c):
    return c.status()["memory"]["weights_bytes"]


_da = None


def daemon_a():
    global _da
    if _da is None:
        _da = daemon()
    return _da


@case
def failed_pushes_keep_the_q4_1_weights():
    _, w = bf16_export()
    with Client(daemon_a().url) as c:
        v, w0, base = c.info.weight_version, weights_bytes(c), greedy(c)
        assert 0 < w0 <= os.path.getsize(MODEL), (w0, os.path.getsize(MODEL))
        # A tensor checksum that does not match its bytes: refused at COMMIT.
        prep = c.prepare(w)
        prep.manifest[len(prep.manifest) // 2].crc32c ^= 1
        try:
            c.push_weights(prep, v + 1)
            raise AssertionError("a wrong tensor checksum was accepted")
        except DaemonError as e:
            assert e.code == proto.E.CHECKSUM, e
        assert weights_bytes(c) == w0 and same(base, greedy(c)), "a refused push changed the model"

        # A transfer aborted half way (the progress callback raises): nothing built.
        class Stop(Exception):
            pass

        def stop_half(done, total):
            if done * 2 >= total:
                raise Stop()
        for lane in (True, False):
            try:
                c.push_weights(w, v + 1, lane=lane, progress=stop_half)
                raise AssertionError("the push was not stopped")
            except Stop:
                pass
            st = c.status()
            assert not st["weight_update"]["in_progress"] and st["weight_version"] == v, st
            assert weights_bytes(c) == w0 and same(base, greedy(c)), "an aborted push changed the model"


@case
def bf16_push_serves_bf16_bit_identical_to_a_bf16_load():
    hf, w = bf16_export()
    db = daemon(model=hf)
    with Client(daemon_a().url) as a, Client(db.url) as b:
        v, w0 = a.info.weight_version, weights_bytes(a)
        q4 = greedy(a)
        r = a.push_weights(w, v + 1)
        assert r.version == v + 1 and r.bytes == sum(t.nbytes for t in w.values()), r
        print(f"  bf16 push: {r.bytes} bytes, COMMIT to serving {r.wait_us / 1e3:.1f} ms, "
              f"weights_bytes {w0} -> {weights_bytes(a)} (bf16 load: {weights_bytes(b)})", flush=True)
        wa, wb = weights_bytes(a), weights_bytes(b)
        assert wa == wb, f"after the bf16 push {wa} bytes; the bf16 load holds {wb}"
        n_params = sum(t.size for t in w.values())
        assert 2 * n_params <= wa <= 2 * n_params * 1.02 and wa > 2 * w0, (wa, w0, n_params)
        pa, pb = greedy(a), greedy(b)
        assert same(pa, pb), "the bf16 push and the bf16 load give different outputs"
        assert all(s.version_admit == v + 1 for s in pa)
        assert not same(q4, pa), "the outputs are the Q4_1 ones (nothing swapped?)"


@case
def daemons_stop_cleanly():
    """SIGTERM exits 0 after the pushes (under ASan: nothing leaked)."""
    stop_cleanly(*_daemons)


if __name__ == "__main__":
    main()
