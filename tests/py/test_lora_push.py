"""LoRA adapters pushed over NNG (ADAPTER_BEGIN, PROTOCOL.md §10.15): a learner sends an adapter's lora_A and
lora_B under a name and version as a transfer (chunks over the data lane, checksummed, PREPARE, COMMIT), and
the daemon serves it as if it were loaded from a PEFT folder. On the default model with random adapters from
tools/gen_lora.py.

- A pushed adapter is the disk adapter, bit for bit: the same folder loaded over HTTP under one name and
  pushed under another give the same tokens and log-prob bits, greedy and sampled; /status lists it pushed,
  at its version; the results say its name and version.
- A chain of three daemons (Pool.push_adapter, fanout "chain": the learner feeds the first, each relays to
  the next) gives each daemon the adapter with the same bits as the disk load; direct pushes too.
- A push while a request decodes under the old version: that request finishes on it (its result says
  version 1 and its bits are those of version 1 alone), requests admitted after the COMMIT get version 2
  (the bits of version 2's folder loaded from disk).
- Bad pushes are refused and the adapter already there keeps serving: a version not above the resident one
  (STALE_VERSION), a shape that does not fit the model, a module the model has not, a lora_A without its
  lora_B, a rank over max_lora_rank, LoRA on lm_head, a tensor whose bytes do not match its checksum
  (CHECKSUM at COMMIT). Each names the problem.
The daemons end with SIGTERM and must exit 0."""
import os
import shutil
import sys
import threading
import time

import numpy as np

from harness import MODEL, ROOT, TMP, case, main
from rdtest import Daemon, status, stop_cleanly

sys.path.insert(0, os.path.join(ROOT, "tools", "python"))
sys.path.insert(0, os.path.join(ROOT, "tools"))
import gen_lora  # noqa: E402
from rolloutd import Client, DaemonError, Pool  # noqa: E402
from rolloutd import delta as D  # noqa: E402
from rolloutd import proto as P  # noqa: E402
from rolloutd.client import _Push  # noqa: E402
from rolloutd.lora import read_peft  # noqa: E402

WORK = os.path.join(TMP, "test_lora_push")
PROMPT = [1, 504, 3458, 282, 260, 2723, 15141, 314, 4250, 3028, 30]
_d = []
_paths = {}


def daemon():
    if not _d:
        _d.append(Daemon(model=MODEL, timeout=120))
    return _d[0]


def adapter_path(seed, targets="attention", rank=8, dtype="bf16"):
    """A random adapter in PEFT's format for the default model (written once per argument set)."""
    key = (seed, targets, rank, dtype)
    if key not in _paths:
        out = os.path.join(WORK, f"a-{seed}-{targets}-{rank}-{dtype}")
        shutil.rmtree(out, ignore_errors=True)
        config, tensors, dtypes = gen_lora.adapter(MODEL, rank=rank, alpha=2.0 * rank, targets=targets, seed=seed,
                                                   dtype=dtype)
        gen_lora.write(out, config, tensors, dtypes)
        _paths[key] = out
    return _paths[key]


def http_load(d, name, path, inplace=False):
    body = {"lora_name": name, "lora_path": path}
    if inplace:
        body["load_inplace"] = True
    st, doc = d.post("/load_lora_adapter", body)
    assert st == 200, (st, doc)


def runs(c, lora, n_tokens=12):
    """(greedy, three seeded T=1 samples) under lora: their tokens and log-prob bits."""
    g = c.generate([PROMPT], max_tokens=n_tokens, temperature=0.0, ignore_eos=True, lora=lora)
    t = c.generate([PROMPT], n=3, max_tokens=n_tokens, temperature=1.0, seed=11, ignore_eos=True, lora=lora)
    return [(s.token_ids.tolist(), s.logprobs.view(np.uint32).tolist()) for s in g + t]


def adapters_of(d):
    return {a["name"]: a for a in status(d)["lora"]["adapters"]}


@case
def a_pushed_adapter_is_the_disk_adapter_bit_for_bit():
    d = daemon()
    path = adapter_path(1, targets="all-linear", rank=16)
    http_load(d, "disk-1", path)
    with Client(d.url) as c:
        assert c.info.features & P.FEATURE_LORA_PUSH, c.info.features
        r = c.push_adapter("pushed-1", path, version=1)
        assert r.version == 1 and r.bytes > 0, r
        want = runs(c, "disk-1")
        got = runs(c, "pushed-1")
        assert got == want, "the pushed adapter's samples differ from the same adapter loaded from disk"
        assert runs(c, None) != want, "the adapter changes nothing"
        s, = c.generate([PROMPT], max_tokens=2, temperature=0.0, lora="pushed-1")
        assert s.lora == "pushed-1" and s.lora_version == 1, (s.lora, s.lora_version)
        # the tensors as a dict without PEFT's prefix, alpha given: the same adapter again, as version 2
        config, tensors = read_peft(path)
        plain = {k[len("base_model.model."):]: v for k, v in tensors.items()}
        r = c.push_adapter("pushed-1", plain, version=2, alpha=config["lora_alpha"])
        assert r.version == 2
        assert runs(c, "pushed-1") == want
    a = adapters_of(d)
    assert a["pushed-1"]["version"] == 2 and a["pushed-1"]["pushed"] and a["pushed-1"]["rank"] == 16, a
    assert not a["disk-1"]["pushed"] and a["pushed-1"]["bytes"] == a["disk-1"]["bytes"], a
    lo = status(d)["lora"]
    assert lo["pushes_ok"] >= 2, lo
    st, _, text = d.http("/metrics")
    text = text.decode() if isinstance(text, bytes) else text
    assert st == 200 and "rolloutd:lora_pushes_total" in text, st


@case
def a_chain_of_three_daemons_gets_the_same_bits():
    path = adapter_path(2, targets="attention", rank=8)
    ds = [Daemon(model=MODEL, timeout=120) for _ in range(3)]
    try:
        http_load(ds[0], "ref", path)
        with Client(ds[0].url) as c:
            want = runs(c, "ref")
        with Pool([d.url for d in ds]) as pool:
            res = pool.push_adapter("chained", path, version=5)
            assert [r.fanout for r in res] == ["chain"] * 3 and [r.hop for r in res] == [0, 1, 2], \
                [(r.fanout, r.hop) for r in res]
            assert all(r.version == 5 for r in res)
            got = pool.generate([PROMPT] * 3, max_tokens=12, temperature=0.0, ignore_eos=True, lora="chained")
            assert all(s.lora == "chained" and s.lora_version == 5 for s in got)
            for d in ds:
                with Client(d.url) as c:
                    assert runs(c, "chained") == want, f"{d.url}: the relayed adapter differs from the disk load"
            # direct: every daemon fed by the learner
            res = pool.push_adapter("chained", path, version=6, fanout="direct")
            assert [r.fanout for r in res] == ["direct"] * 3 and all(r.version == 6 for r in res)
        for d in ds:
            assert adapters_of(d)["chained"]["version"] == 6
    finally:
        for d in ds:
            stop_cleanly(d)


@case
def a_push_during_decode_changes_only_later_requests():
    d = daemon()
    v1, v2 = adapter_path(3), adapter_path(4)
    http_load(d, "ref-v1", v1)
    http_load(d, "ref-v2", v2)
    n_long = 160
    with Client(d.url) as c:
        c.push_adapter("live", v1, version=1)
        alone = c.generate([PROMPT], max_tokens=n_long, temperature=0.0, ignore_eos=True, lora="ref-v1")[0]
        want2 = runs(c, "ref-v2")
        box = {}

        def long_run():
            with Client(d.url) as c2:
                box["s"] = c2.generate([PROMPT], max_tokens=n_long, temperature=0.0, ignore_eos=True, lora="live")[0]
        t = threading.Thread(target=long_run)
        t.start()
        deadline = time.time() + 60
        while status(d)["requests"]["running"] < 1 and time.time() < deadline:
            time.sleep(0.01)
        assert status(d)["requests"]["running"] >= 1, "the long request never started"
        c.push_adapter("live", v2, version=2)
        after = runs(c, "live")
        t.join(120)
        s = box["s"]
        assert s.lora == "live" and s.lora_version == 1, (s.lora, s.lora_version)
        assert s.token_ids.tolist() == alone.token_ids.tolist() and \
            np.array_equal(s.logprobs.view(np.uint32), alone.logprobs.view(np.uint32)), \
            "the request running across the push did not finish on version 1"
        assert after == want2, "requests after the push do not run version 2"
        late, = c.generate([PROMPT], max_tokens=2, temperature=0.0, lora="live")
        assert late.lora_version == 2


def refused(c, name, tensors, version, code, *words, **kw):
    try:
        c.push_adapter(name, tensors, version, **kw)
    except DaemonError as e:
        assert e.code == code, (e.code, e.message)
        for w in words:
            assert w in e.message, (w, e.message)
        return e
    raise AssertionError(f"push of {name} version {version} accepted")


@case
def bad_pushes_are_refused_and_the_old_adapter_keeps_serving():
    d = daemon()
    path = adapter_path(5)
    config, tensors = read_peft(path)
    alpha = config["lora_alpha"]
    q_a = "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight"
    q_b = "base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight"
    with Client(d.url) as c:
        c.push_adapter("keep", path, version=3)
        want = runs(c, "keep")
        refused(c, "keep", path, 3, P.E.STALE_VERSION, "not above the resident version 3")
        refused(c, "keep", path, 2, P.E.STALE_VERSION, "not above")
        bad = dict(tensors)
        bad[q_a] = np.zeros((8, 100), dtype=np.uint16)
        refused(c, "keep", bad, 4, P.E.INVALID_PARAMS, "q_proj.lora_A.weight", "[8, 100]", "expected [8, 576]",
                alpha=alpha)
        bad = dict(tensors)
        bad["base_model.model.model.layers.0.self_attn.rope_proj.lora_A.weight"] = bad[q_a]
        bad["base_model.model.model.layers.0.self_attn.rope_proj.lora_B.weight"] = bad[q_b]
        refused(c, "keep", bad, 4, P.E.INVALID_PARAMS, "rope_proj", alpha=alpha)
        bad = dict(tensors)
        del bad[q_b]
        refused(c, "keep", bad, 4, P.E.INVALID_PARAMS, "model.layers.0.self_attn.q_proj has no lora_B.weight",
                alpha=alpha)
        bad = {k: v for k, v in tensors.items()}
        bad["base_model.model.lm_head.lora_A.weight"] = np.zeros((8, 576), dtype=np.uint16)
        bad["base_model.model.lm_head.lora_B.weight"] = np.zeros((49152, 8), dtype=np.uint16)
        refused(c, "keep", bad, 4, P.E.INVALID_PARAMS, "lm_head", alpha=alpha)
        big = adapter_path(6, rank=128)
        refused(c, "keep", big, 4, P.E.INVALID_PARAMS, "rank 128", "max_lora_rank")
        # a manifest checksum that the bytes do not match: refused at COMMIT, nothing swapped
        prep = c.prepare(list(tensors.items()))
        prep.manifest[0].crc32c ^= 1
        try:
            _Push(c, prep, 4, P.MODE_CONTINUE, 4, True, None,
                  adapter={"name": "keep", "rank": 8, "alpha": alpha, "rslora": False}).run()
            raise AssertionError("a push whose bytes do not match its checksum was committed")
        except DaemonError as e:
            assert e.code == P.E.CHECKSUM and "CRC-32C" in e.message, (e.code, e.message)
        assert runs(c, "keep") == want, "a refused push changed the adapter"
        assert adapters_of(d)["keep"]["version"] == 3
        # and a good one goes through after all that
        c.push_adapter("keep", adapter_path(7), version=4)
        assert adapters_of(d)["keep"]["version"] == 4


def as_folder(path, config, tensors):
    """tensors (bf16 bits) written as a PEFT folder: what loading it over HTTP reads."""
    f32 = {k: (v.astype(np.uint32) << 16).view(np.float32) for k, v in tensors.items()}
    gen_lora.write(path, config, f32, {k: "bf16" for k in tensors})
    return path


@case
def adapter_deltas_are_exact_and_refused_without_their_base():
    d = daemon()
    config, t1 = read_peft(adapter_path(8, targets="all-linear", rank=16))
    t2 = gen_lora.nudged(t1, 0.03, 1)
    t3 = gen_lora.nudged(t2, 0.03, 2)
    t4 = gen_lora.nudged(t3, 0.03, 3)
    http_load(d, "ref-d2", as_folder(os.path.join(WORK, "d2"), config, t2))
    http_load(d, "ref-d3", as_folder(os.path.join(WORK, "d3"), config, t3))
    alpha = config["lora_alpha"]
    with Pool([d.url]) as pool:
        pool.push_adapter("delta-a", t1, version=1, alpha=alpha)
        assert pool.last_push["kind"] == "full"
        pool.push_adapter("delta-a", t2, version=2, alpha=alpha)
        lp = pool.last_push
        full_bytes = sum(v.nbytes for v in t1.values())
        assert lp["kind"] == "delta" and lp["delta"]["delta_tensors"] == len(t1), lp
        assert lp["wire_bytes"] < full_bytes / 2, (lp["wire_bytes"], full_bytes)
        with Client(d.url) as c:
            assert runs(c, "delta-a") == runs(c, "ref-d2"), "the delta push is not the adapter it encodes"
            # deltas against a version this daemon does not hold: BASE_MISMATCH, nothing staged
            prep = D.prepare_delta(list(t3.items()), pool._held_adapters["delta-a"][1], 1, 1 << 20)
            terms = {"name": "delta-a", "rank": 16, "alpha": alpha, "rslora": False}
            try:
                _Push(c, prep, 3, P.MODE_CONTINUE, 4, True, None, adapter=terms).run()
                raise AssertionError("a delta against version 1 accepted")
            except DaemonError as e:
                assert e.code == P.E.BASE_MISMATCH and "version 2" in e.message, (e.code, e.message)
            # a delta whose result is not the bytes it promises: CHECKSUM naming the tensor at COMMIT
            prep = D.prepare_delta(list(t3.items()), pool._held_adapters["delta-a"][1], 2, 1 << 20)
            bad = prep.manifest[0]
            bad.crc32c ^= 0x10
            try:
                _Push(c, prep, 3, P.MODE_CONTINUE, 4, True, None, adapter=terms).run()
                raise AssertionError("a delta with a wrong checksum committed")
            except DaemonError as e:
                assert e.code == P.E.CHECKSUM and bad.name in e.message, (e.code, e.message)
            assert runs(c, "delta-a") == runs(c, "ref-d2"), "a refused delta changed the adapter"
        pool.push_adapter("delta-a", t3, version=3, alpha=alpha)
        assert pool.last_push["kind"] == "delta"
        with Client(d.url) as c:
            assert runs(c, "delta-a") == runs(c, "ref-d3")
        held = dict(pool._held_adapters)
    # A second daemon never saw the adapter: in a chain it refuses the deltas at ADAPTER_BEGIN and gets the
    # adapter whole in the same call; both then serve the same bits.
    d2 = Daemon(model=MODEL, timeout=120)
    try:
        with Pool([d.url, d2.url]) as pool:
            pool._held_adapters = held      # this learner pushed version 3 before (to the first daemon)
            res = pool.push_adapter("delta-a", t4, version=4, alpha=alpha)
            assert pool.last_push["kind"] == "delta" and pool.last_push["full_pushes"] == [d2.url], pool.last_push
            assert all(r.version == 4 for r in res)
            with Client(d.url) as a, Client(d2.url) as b:
                assert runs(a, "delta-a") == runs(b, "delta-a")
    finally:
        stop_cleanly(d2)


@case
def zz_stop():
    for d in _d:
        stop_cleanly(d)
    _d.clear()


if __name__ == "__main__":
    main()
