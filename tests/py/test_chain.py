"""Chained weight broadcast and the two-phase commit (PROTOCOL.md §10.11-10.13)
against real daemons on loopback, driven by rolloutd.Pool:

- four daemons, one chained push: each serves the new version with the same
  greedy outputs, the hops are 0..3, and this process's TCP egress, counted by
  the kernel (tcpi_bytes_sent of every socket it opened to the daemons), is
  the model plus a small overhead; a direct push of the same update costs
  about four models;
- a daemon killed (SIGKILL) mid-chain: with on_failure="commit" the others
  are routed around it, finish and serve the new version; restarted with
  weights_from a survivor, it comes up on that version with the same outputs;
- a daemon that joins late gets the serving version through `rolloutctl sync`
  (a daemon still on its file weights has nothing to hand on);
- with the default on_failure="abort", a daemon killed mid-chain leaves every
  survivor on the old weights, and the next push goes through;
- with a shared secret the chain authenticates every lane connection; a relay
  holding the wrong lane key is refused (UNAUTHORIZED) and stages nothing."""
import os
import signal
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import BUILD, ROOT, TMP, case, main  # noqa: E402
from rdtest import Daemon  # noqa: E402
from pushdata import perturbed_bf16, weights  # noqa: E402

from rolloutd import Client, Pool, PoolError, proto  # noqa: E402
import rolloutd.client as rc  # noqa: E402

sys.path.insert(0, os.path.join(ROOT, "tools"))
from egress import Egress  # noqa: E402

SECRET = b"chain-secret-for-the-test-0123456789"
_daemons = []


def daemon(*extra):
    d = Daemon(*extra)
    _daemons.append(d)
    return d


PROMPTS = [[1, 9690, 314, 253, 1345, 2914, 28], [1, 504, 3458, 282, 4649, 314, 216, 33, 30]]


def greedy(c):
    return c.generate(PROMPTS, max_tokens=12, temperature=0.0, ignore_eos=True)


def tokens(samples):
    return [list(map(int, s.token_ids)) for s in samples]


def version(d):
    with Client(d.url, name="probe", auth_token=getattr(d, "secret", None)) as c:
        return c.info.weight_version


def model_bytes(w):
    return sum(a.nbytes for a in w.values())


@case
def chain_of_four_sends_the_model_once():
    ds = [daemon() for _ in range(4)]
    w = perturbed_bf16(11)
    size = model_bytes(w)
    with Pool([d.url for d in ds]) as pool:
        before = tokens(greedy(pool.clients[0]))
        with Egress([d.port for d in ds]) as e:
            res = pool.push_weights(w, version=2)
        assert [r.hop for r in res] == [0, 1, 2, 3] and all(r.fanout == "chain" for r in res), res
        assert all(r.version == 2 for r in res) and [version(d) for d in ds] == [2, 2, 2, 2]
        outs = [tokens(greedy(c)) for c in pool.clients]
        assert all(o == outs[0] for o in outs), "the daemons of one chain serve different weights"
        assert outs[0] != before, "the pushed weights did not change the outputs"
        chain_egress = e.bytes
        assert size <= chain_egress <= 1.05 * size, f"chain egress {chain_egress} for a {size}-byte model"
        with Egress([d.port for d in ds]) as e:
            # whole: the same tensors again would go as a delta (issue 24) of a few bytes
            res = pool.push_weights(w, version=3, fanout="direct", delta=False)
        assert all(r.fanout == "direct" and r.version == 3 for r in res)
        assert e.bytes >= 4 * size, f"direct egress {e.bytes} for 4 daemons of a {size}-byte model"
        print(f"egress: chain {chain_egress / size:.4f} x the model, direct {e.bytes / size:.4f} x", flush=True)
        # a node that joins late: rolloutctl sync has a member push its serving weights to it
        late = daemon()
        ctl = [os.path.join(BUILD, "rolloutctl"), "sync"]
        r = subprocess.run(ctl + ["--from", late.url, "--to", ds[0].url], capture_output=True, text=True, timeout=60)
        assert r.returncode != 0 and "version 0" in r.stderr, (r.returncode, r.stderr)
        r = subprocess.run(ctl + ["--from", ds[3].url, "--to", late.url, "--wait", "120"], capture_output=True,
                           text=True, timeout=180)
        assert r.returncode == 0 and "serves version 3" in r.stdout, (r.returncode, r.stdout, r.stderr, late.tail())
        with Client(late.url) as c:
            assert tokens(greedy(c)) == tokens(greedy(pool.clients[3])), "the synced daemon serves other weights"
    for d in ds:
        d.kill()


@case
def a_killed_daemon_is_routed_around_and_rejoins_with_weights_from():
    ds = [daemon() for _ in range(4)]
    w = weights()                                    # f32: 538 MB, so the kill lands mid-chain
    size = model_bytes(w)
    seen = {}

    def progress(url, staged, total):
        seen[url] = staged
        victim = ds[1]
        if victim.proc.poll() is None and seen.get(ds[0].url, 0) >= total // 5:
            seen["victim_at_kill"] = seen.get(victim.url, 0)
            victim.proc.send_signal(signal.SIGKILL)
    with Pool([d.url for d in ds]) as pool:
        try:
            pool.push_weights(w, version=5, window=2, chunk_bytes=1 << 20, progress=progress, on_failure="commit")
            raise AssertionError("the push did not report the killed daemon")
        except PoolError as e:
            assert list(e.errors) == [ds[1].url], e
            assert e.committed == [ds[0].url, ds[2].url, ds[3].url], e.committed
            res = dict(e.outcomes)
            assert all(res[d.url].version == 5 for d in (ds[0], ds[2], ds[3]))
        assert seen["victim_at_kill"] < size, "the daemon was killed after it had everything"
        survivors = [pool.clients[k] for k in (0, 2, 3)]
        outs = [tokens(greedy(c)) for c in survivors]
        assert outs[1] == outs[0] and outs[2] == outs[0]
    ds[1].proc.wait()
    back = daemon("--weights-from", ds[2].url)
    deadline = time.time() + 120
    while version(back) != 5:
        assert time.time() < deadline, f"the restarted daemon did not pull version 5: {back.tail()}"
        time.sleep(0.2)
    with Client(back.url) as c:
        assert tokens(greedy(c)) == outs[0], "the rejoined daemon serves other weights than its peer"
    for d in ds + [back]:
        d.kill()


@case
def by_default_a_failure_aborts_the_update_everywhere():
    ds = [daemon() for _ in range(3)]
    w = weights()
    with Pool([d.url for d in ds]) as pool:
        before = [tokens(greedy(c)) for c in pool.clients]

        def progress(url, staged, total):
            if ds[2].proc.poll() is None and url == ds[0].url and staged >= total // 5:
                ds[2].proc.send_signal(signal.SIGKILL)
        try:
            pool.push_weights(w, version=7, window=2, chunk_bytes=1 << 20, progress=progress)
            raise AssertionError("the push succeeded with a daemon killed")
        except PoolError as e:
            assert e.committed == [] and ds[2].url in e.errors, e
    assert [version(d) for d in ds[:2]] == [0, 0], "a survivor serves the update that was aborted"
    with Pool([d.url for d in ds[:2]]) as pool:
        assert [tokens(greedy(c)) for c in pool.clients] == before[:2]
        res = pool.push_weights(perturbed_bf16(3), version=8)    # nothing was left open
        assert [r.version for r in res] == [8, 8]
    for d in ds:
        d.kill()


def secret_file():
    path = os.path.join(TMP, "chain-secret")
    with open(path, "wb") as f:
        f.write(SECRET + b"\n")
    os.chmod(path, 0o600)
    return path


@case
def with_a_secret_the_chain_authenticates_and_a_wrong_relay_key_is_refused():
    ds = [daemon("--auth-token-file", secret_file()) for _ in range(3)]
    for d in ds:
        d.secret = SECRET
    w = perturbed_bf16(5)
    with Pool([d.url for d in ds], auth_token=SECRET) as pool:
        res = pool.push_weights(w, version=4)
        assert [r.hop for r in res] == [0, 1, 2] and [version(d) for d in ds] == [4, 4, 4]
        outs = [tokens(greedy(c)) for c in pool.clients]
        assert outs[1] == outs[0] and outs[2] == outs[0]
        # a relay given a key that is not the next transfer's: refused by the next lane, nothing staged there
        a, b = pool.clients[0], pool.clients[1]
        prep = pool.prepare({"model.norm.weight": w["model.norm.weight"]})
        pa, pb = (rc._Push(c, prep, 9, 0, 2, True, None) for c in (a, b))
        pa.begin()
        pb.begin()
        a._call(proto.UpdateForward(xfer_id=pa.xfer, next_xfer_id=pb.xfer, port=pb.begin_ok.data_port,
                                    flags=proto.FORWARD_AUTH, window=2, key=bytes(32), host="127.0.0.1"),
                proto.T.UPDATE_FORWARD_OK)
        pa.send()
        deadline = time.time() + 30
        while True:
            st = a._call(proto.UpdatePrepare(xfer_id=pa.xfer), proto.T.UPDATE_PREPARE_OK)
            if st.forward == proto.FWD_FAILED or time.time() > deadline:
                break
            time.sleep(0.05)
        assert st.forward == proto.FWD_FAILED and st.forward_error == proto.E.UNAUTHORIZED, st
        assert b._call(proto.UpdatePrepare(xfer_id=pb.xfer), proto.T.UPDATE_PREPARE_OK).bytes_staged == 0
        pa.abort()
        pb.abort()
    for d in ds:
        d.kill()


if __name__ == "__main__":
    try:
        main()
    finally:
        for d in _daemons:
            d.kill()
