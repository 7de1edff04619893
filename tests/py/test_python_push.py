"""Weight pushes from the Python client (Client.push_weights, rolloutd.Pool)
to real daemons on loopback (PROTOCOL.md §10):

- the default model's own weights (exported as HF f32 tensors) pushed to a
  GGUF-started daemon over the data lane and over NNG chunks: greedy outputs
  stay bit-identical and results report the new version;
- perturbed weights as raw bf16 bits: outputs change, the version goes up; a
  stale version raises DaemonError STALE_VERSION; a manifest checksum that does
  not match the bytes raises CHECKSUM and leaves the old weights serving;
- a Pool of two daemons: one push reaches both; Pool.generate returns results
  in prompt order, equal to each daemon's own, all on the new version;
- the prepared update's checksums against independent computations, and
  bf16_bits rounding."""
import os
import subprocess
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import BUILD, MODEL, ROOT, TMP, case, main, run  # noqa: E402
from rdtest import PROMPT, Daemon, stop_cleanly  # noqa: E402

sys.path.insert(0, os.path.join(ROOT, "tools", "python"))
from rolloutd import Client, DaemonError, Pool, PoolError, bf16_bits, prepare_update, proto  # noqa: E402
from rolloutd.crc32c import crc32c  # noqa: E402
from pushdata import perturbed_bf16, weights  # noqa: E402,F401

PROMPTS = [PROMPT, [1, 504, 3458, 282, 4649, 314, 216, 33, 30], [1, 9690, 314], [1, 2914, 28, 1345, 4649]]
_tmp = tempfile.mkdtemp(prefix="rd-pypush-", dir=TMP)
_prepared = None
_daemons = []


def daemon():
    d = Daemon()
    _daemons.append(d)
    return d


def greedy(c, prompts=PROMPTS, max_tokens=12):
    return c.generate(prompts, max_tokens=max_tokens, temperature=0.0, ignore_eos=True)


def sampled(c, prompts=PROMPTS):
    return c.generate(prompts, n=2, max_tokens=12, temperature=1.0, seed=4321, ignore_eos=True)


def same(a, b):
    """Bit-identical token ids and log-probs, sample for sample."""
    return len(a) == len(b) and all(
        (x.index, x.sample_idx) == (y.index, y.sample_idx) and np.array_equal(x.token_ids, y.token_ids) and
        np.array_equal(x.logprobs.view(np.uint32), y.logprobs.view(np.uint32)) for x, y in zip(a, b))


def on_version(samples, v):
    return all(s.version_admit == v and s.version_finish == v and [tuple(sp) for sp in s.spans] ==
               [(0, len(s.token_ids), v)] for s in samples)


DA = None


def daemon_a():
    global DA
    if DA is None:
        DA = daemon()
    return DA


@case
def own_weights_bit_identical_over_lane_and_nng():
    global _prepared
    with Client(daemon_a().url) as c:
        assert c.info.features & proto.FEATURE_WEIGHT_UPDATE
        v = c.info.weight_version
        base, base_s = greedy(c), sampled(c)
        prep = _prepared = c.prepare(weights())    # checksummed once, pushed twice
        assert prep.chunk_bytes == c.info.max_message_bytes - 64 and len(prep) == len(weights())
        r = c.push_weights(prep, v + 1)
        assert r.version == v + 1 and r.lane and r.bytes == prep.total_bytes == 538060032, r
        print(f"  lane: {r.mb_per_s:.0f} MB/s begin to commit ({r.transfer_mb_per_s:.0f} MB/s chunks), "
              f"{r.seconds:.2f} s, stall {r.stall_us} us, window {r.window}, chunks {r.chunk_bytes} B", flush=True)
        after = greedy(c)
        assert same(base, after), "a push of the same weights changed the outputs"
        assert same(base_s, sampled(c))
        assert on_version(after, v + 1)
        r = c.push_weights(prep, v + 2, lane=False, window=3)
        assert r.version == v + 2 and not r.lane and r.window == 3, r
        print(f"  nng:  {r.mb_per_s:.0f} MB/s begin to commit ({r.transfer_mb_per_s:.0f} MB/s chunks), "
              f"{r.seconds:.2f} s, stall {r.stall_us} us", flush=True)
        after = greedy(c)
        assert same(base, after) and on_version(after, v + 2)
        st = c.status()
        assert st["weight_version"] == v + 2 and not st["weight_update"]["in_progress"], st


@case
def perturbed_bf16_changes_outputs_stale_and_bad_pushes_raise():
    with Client(daemon_a().url) as c:
        v = c.info.weight_version + 1
        base = greedy(c)
        w = perturbed_bf16(1)
        assert all(a.dtype == np.uint16 for a in w.values())
        seen = []
        r = c.push_weights(w, v, progress=lambda done, total: seen.append((done, total)))
        assert r.version == v and r.bytes == 538060032 // 2, r
        assert seen and seen[-1] == (r.bytes, r.bytes) and all(a[0] <= b[0] for a, b in zip(seen, seen[1:])), seen
        pert = greedy(c)
        assert not same(base, pert), "perturbed weights gave the same outputs"
        assert on_version(pert, v)

        norm = {"model.norm.weight": np.ascontiguousarray(weights()["model.norm.weight"] * np.float32(1.5))}
        for stale in (v, v - 1):
            try:
                c.push_weights(norm, stale)
                raise AssertionError("a stale version was accepted")
            except DaemonError as e:
                assert e.code == proto.E.STALE_VERSION, e
        # The daemon refuses what does not fit the model, naming it.
        for bad in ({"model.norm.bias": norm["model.norm.weight"]},
                    {"model.norm.weight": norm["model.norm.weight"][:100]}):
            try:
                c.push_weights(bad, v + 1)
                raise AssertionError("a bad manifest was accepted")
            except DaemonError as e:
                assert e.code == proto.E.INVALID_PARAMS and "model.norm" in e.message, e
        # A manifest CRC that does not match the bytes: CHECKSUM at COMMIT, the transfer is dropped.
        for lane in (True, False):
            prep = c.prepare(norm)
            prep.manifest[0].crc32c ^= 1
            try:
                c.push_weights(prep, v + 1, lane=lane)
                raise AssertionError("a wrong tensor checksum was accepted")
            except DaemonError as e:
                assert e.code == proto.E.CHECKSUM, e
        # Chunks whose CRC never matches: resent, then refused with CHECKSUM; the transfer is aborted.
        for lane in (True, False):
            prep = c.prepare(norm)
            prep.chunks = [(ti, off, n, crc ^ 1) for ti, off, n, crc in prep.chunks]
            try:
                c.push_weights(prep, v + 1, lane=lane)
                raise AssertionError("chunks with a wrong checksum were accepted")
            except DaemonError as e:
                assert e.code == proto.E.CHECKSUM, e
        # Types the wire does not carry are refused before anything is sent.
        for bad in ({"model.norm.weight": weights()["model.norm.weight"].astype(np.float64)},
                    {"model.norm.weight": np.zeros(0, np.float32)}, {}):
            try:
                c.push_weights(bad, v + 1)
                raise AssertionError(f"{bad} was accepted")
            except (TypeError, ValueError):
                pass
        st = c.status()
        assert st["weight_version"] == v and not st["weight_update"]["in_progress"], st
        assert same(pert, greedy(c)), "a failed push changed the outputs"


@case
def pool_pushes_to_two_daemons_and_generates_in_prompt_order():
    da, db = daemon_a(), daemon()
    with Pool([da.url, db.url]) as pool:
        va = pool.status()[0]["weight_version"]
        assert pool.status()[1]["weight_version"] == 0
        v = va + 1
        w = perturbed_bf16(2, eps=0.02)
        rs = pool.push_weights(w, v)
        assert [r.url for r in rs] == [da.url, db.url] and all(r.version == v and r.lane for r in rs), rs
        print("  pool: " + ", ".join(f"{r.url} {r.mb_per_s:.0f} MB/s stall {r.stall_us} us" for r in rs), flush=True)
        prompts = PROMPTS + [[1, 100 + i, 200 + i] + [300] * i for i in range(5)]
        out = pool.generate(prompts, max_tokens=10, temperature=0.0, ignore_eos=True)
        assert [s.index for s in out] == list(range(len(prompts))), [s.index for s in out]
        assert all(s.n_prompt == len(prompts[s.index]) for s in out), "a sample came back under another prompt"
        assert on_version(out, v)
        with Client(da.url) as ca, Client(db.url) as cb:
            ga = greedy(ca, prompts, 10)
            gb = greedy(cb, prompts, 10)
        assert same(ga, gb), "two daemons given the same push disagree"
        assert same(out, ga), "the Pool's results differ from a daemon's own"
        # Seeds per prompt follow their prompts; the stream yields every sample once.
        seeds = [10 + i for i in range(len(prompts))]
        s1 = pool.generate(prompts, n=2, max_tokens=6, temperature=1.0, seed=seeds, ignore_eos=True)
        with Client(db.url) as cb:
            s2 = cb.generate(prompts, n=2, max_tokens=6, temperature=1.0, seed=seeds, ignore_eos=True)
        assert same(s1, s2)
        got = sorted((s.index, s.sample_idx) for s in pool.stream(prompts, n=2, max_tokens=4, temperature=1.0))
        assert got == [(i, k) for i in range(len(prompts)) for k in range(2)], got
        # A stale push fails on both, and says so for each.
        try:
            pool.push_weights({"model.norm.weight": weights()["model.norm.weight"]}, v)
            raise AssertionError("a stale version was accepted")
        except PoolError as e:
            assert e.codes == {da.url: proto.E.STALE_VERSION, db.url: proto.E.STALE_VERSION}, e
        assert [s["weight_version"] for s in pool.status()] == [v, v]


@case
def prepared_checksums_match_independent_crcs():
    w = weights()
    prep = _prepared or prepare_update(w, 4 << 20)
    by_name = {t.name: t for t in prep.manifest}
    # Whole-tensor CRCs in one pass, against the per-chunk CRCs the prepared update combined.
    multi = [t.name for t in prep.manifest if t.nbytes > prep.chunk_bytes]
    assert multi, "no tensor spans several chunks"
    for name in multi[:2] + ["model.layers.0.self_attn.q_proj.weight", "model.layers.29.mlp.down_proj.weight"]:
        assert by_name[name].crc32c == crc32c(w[name]), name
    # Another chunking (odd size) gives the same tensor CRCs; the chunks tile each tensor.
    other = prepare_update({k: w[k] for k in multi[:1] + ["model.norm.weight"]}, (1 << 20) + 12345)
    for t in other.manifest:
        assert t.crc32c == by_name[t.name].crc32c
    ends = {}
    for ti, off, n, crc in other.chunks:
        assert off == ends.get(ti, 0) and n <= other.chunk_bytes
        assert crc == crc32c(other.data[ti][off:off + n])
        ends[ti] = off + n
    assert [ends[i] for i in range(len(other))] == [t.nbytes for t in other.manifest]
    # A bit-by-bit CRC-32C (the definition, nothing shared with crc32c.py) of a small tensor.
    def crc_bitwise(b):
        c = 0xFFFFFFFF
        for x in b:
            c ^= x
            for _ in range(8):
                c = (c >> 1) ^ (0x82F63B78 & -(c & 1))
        return c ^ 0xFFFFFFFF
    assert crc_bitwise(b"123456789") == 0xE3069283
    assert by_name["model.norm.weight"].crc32c == crc_bitwise(w["model.norm.weight"].tobytes())
    # bf16 bits: round to nearest even, like torch's float -> bfloat16.
    x = np.array([1.0, -2.5, 1 + 2 ** -8, 1 + 3 * 2 ** -8, 1 + 2 ** -8 + 2 ** -20, np.finfo(np.float32).max,
                  np.inf, -0.0], dtype=np.float32)
    assert bf16_bits(x).tolist() == [0x3F80, 0xC020, 0x3F80, 0x3F82, 0x3F81, 0x7F80, 0x7F80, 0x8000], \
        [hex(v) for v in bf16_bits(x)]
    n = bf16_bits(np.float32([np.nan]))[0]
    assert n & 0x7F80 == 0x7F80 and n & 0x7F, hex(n)
    # Non-contiguous and big-endian arrays are laid out as the wire needs them.
    a = np.arange(8192, dtype=np.float32).reshape(64, 128)
    p1 = prepare_update({"t": a.T}, 4096)
    assert p1.manifest[0].shape == [128, 64] and p1.manifest[0].crc32c == crc32c(np.ascontiguousarray(a.T))
    p2 = prepare_update({"t": a.astype(">f4")}, 4096)
    assert p2.manifest[0].crc32c == crc32c(a)


@case
def daemons_stop_cleanly():
    """SIGTERM exits 0 after the pushes and the aborted transfers (under ASan: nothing leaked)."""
    stop_cleanly(*_daemons)


if __name__ == "__main__":
    try:
        main()
    finally:
        for d in _daemons:
            d.kill()
        subprocess.run(["rm", "-rf", _tmp])
