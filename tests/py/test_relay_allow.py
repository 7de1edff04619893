"""Relay targets bounded by relay_allow (PROTOCOL.md §10.11), against real daemons on loopback:

- UPDATE_FORWARD to a host outside the daemon's relay_allow (a TEST-NET address, its IPv4-mapped
  spelling, a loopback port not listed) is refused with FORBIDDEN (17), logged and counted in
  rolloutd:weight_update_relays_refused_total; the transfer stays open and a forward to a daemon
  inside the list is accepted; a daemon whose learner socket is not on loopback relays nowhere by
  default;
- a chain whose middle daemon may relay nowhere (--relay-allow none): its forward is refused, the
  Python pool (rolloutd.Pool) and the C client (rolloutctl push-weights --fanout chain) push to the
  daemon after it directly (hops 0, 1, 0), and all three serve the new version with the same greedy
  outputs;
- WEIGHTS_SYNC to a URL outside the list is refused FORBIDDEN the same way;
- every daemon keeps serving and exits cleanly."""
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import BUILD, MODEL, case, main  # noqa: E402
from rdtest import Daemon, free_port, stop_cleanly  # noqa: E402
from pushdata import perturbed_bf16  # noqa: E402

from rolloutd import Client, DaemonError, Pool, proto  # noqa: E402
import rolloutd.client as rc  # noqa: E402

CTL = os.path.join(BUILD, "rolloutctl")
PROMPTS = [[1, 260, 33, 97, 151, 201, 28], [1, 50, 34, 282, 46, 31, 216, 33, 30]]  # ids of any test model
_daemons = []


def daemon(*extra, **kw):
    d = Daemon(*extra, **kw)
    _daemons.append(d)
    return d


def metric(d, name):
    code, _, body = d.http("/metrics")
    assert code == 200, code
    for line in body.splitlines():
        if line.startswith(f"rolloutd:{name}{{"):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"no rolloutd:{name} in /metrics")


def version(d):
    with Client(d.url, name="probe") as c:
        return c.info.weight_version


def greedy(d):
    with Client(d.url, name="greedy") as c:
        return [list(map(int, s.token_ids))
                for s in c.generate(PROMPTS, max_tokens=12, temperature=0.0, ignore_eos=True)]


def forward(c, push, host, port, next_xfer=1):
    return c._call(proto.UpdateForward(xfer_id=push.xfer, next_xfer_id=next_xfer, port=port, window=2,
                                       host=host), proto.T.UPDATE_FORWARD_OK)


def forbidden(c, push, host, port):
    try:
        forward(c, push, host, port)
    except DaemonError as e:
        assert e.code == proto.E.FORBIDDEN == 17 and "relay_allow" in e.message, e
        return e.message
    raise AssertionError(f"UPDATE_FORWARD to {host}:{port} was accepted")


@case
def a_forward_outside_relay_allow_is_refused():
    lane_port = free_port()
    a = daemon()                                            # default: loopback (the learner socket is)
    b = daemon("--relay-allow", f"127.0.0.1:{lane_port}", "--update-listen", f"127.0.0.1:{free_port()}")
    w = perturbed_bf16(2)
    with Client(a.url) as ca, Client(b.url) as cb:
        prep = ca.prepare({"model.norm.weight": w["model.norm.weight"]})
        pa, pb = rc._Push(ca, prep, 9, 0, 2, True, None), rc._Push(cb, prep, 9, 0, 2, True, None)
        pa.begin()
        pb.begin()
        assert metric(a, "weight_update_relays_refused_total") == 0
        why = forbidden(ca, pa, "192.0.2.1", 7000)
        assert "192.0.2.1" in why and "loopback" in why, why
        forbidden(ca, pa, "::ffff:192.0.2.1", 7000)
        forbidden(ca, pa, "2001:db8::1", 7000)
        assert metric(a, "weight_update_relays_refused_total") == 2 + 1
        assert "refused to relay to 192.0.2.1:7000" in a.output(), a.tail()
        # the transfer is still open: a forward to a daemon inside the list (b's lane, loopback) goes
        ok = forward(ca, pa, "127.0.0.1", pb.begin_ok.data_port, pb.xfer)
        assert ok.xfer_id == pa.xfer, ok
        forward(ca, pa, "127.0.0.1", 1, 0)                  # next_xfer_id 0: stop relaying (never refused)
        # b allows one loopback port only
        forbidden(cb, pb, "127.0.0.1", pa.begin_ok.data_port)
        assert metric(b, "weight_update_relays_refused_total") == 1
        pa.abort()
        pb.abort()
    # off loopback the default is none: even a loopback target is refused
    port = free_port()
    c = daemon("--insecure", "1", listen=f"tcp://0.0.0.0:{port}")
    c.url = f"tcp://127.0.0.1:{port}"
    with Client(c.url) as cc:
        pc = rc._Push(cc, prep, 9, 0, 2, True, None)
        pc.begin()
        why = forbidden(cc, pc, "127.0.0.1", 7000)
        assert "(none)" in why, why
        pc.abort()
    for d in (a, b, c):
        assert d.http("/health")[0] == 200
    stop_cleanly(a, b, c)


_chain = []


def chain():
    """Three daemons; the middle one may relay nowhere."""
    if not _chain:
        _chain.extend([daemon(), daemon("--relay-allow", "none"), daemon()])
    return _chain


@case
def the_python_pool_pushes_directly_past_a_refused_relay():
    ds = chain()
    before = greedy(ds[0])
    with Pool([d.url for d in ds]) as pool:
        res = pool.push_weights(perturbed_bf16(3), version=2)
    assert all(r.version == 2 and r.fanout == "chain" for r in res), res
    assert [r.hop for r in res] == [0, 1, 0], [r.hop for r in res]
    assert [version(d) for d in ds] == [2, 2, 2]
    outs = [greedy(d) for d in ds]
    assert outs[1] == outs[0] and outs[2] == outs[0], "the daemons serve different weights"
    assert metric(ds[1], "weight_update_relays_refused_total") == 1
    assert metric(ds[0], "weight_update_relays_refused_total") == 0
    assert "refused to relay" in ds[1].output()
    # WEIGHTS_SYNC makes a daemon dial a URL too: bounded by the same list
    for d, url in ((ds[0], "tcp://192.0.2.1:7070"), (ds[1], ds[2].url)):
        with Client(d.url, name="sync") as c:
            try:
                c._call(proto.WeightsSync(client_id=c.client_id, url=url), proto.T.WEIGHTS_SYNC_OK)
                raise AssertionError(f"WEIGHTS_SYNC to {url} was accepted")
            except DaemonError as e:
                assert e.code == proto.E.FORBIDDEN and "relay_allow" in e.message, e
    assert metric(ds[1], "weight_update_relays_refused_total") == 2
    assert outs[0] != before, "the pushed weights did not change the outputs"


@case
def rolloutctl_pushes_directly_past_a_refused_relay():
    ds = chain()
    v = version(ds[0]) + 1
    p = subprocess.run([CTL, "push-weights", "--connect", ",".join(d.url for d in ds), MODEL, "--version", str(v),
                        "--perturb", "0.01", "--seed", "4", "--dtype", "bf16", "--fanout", "chain", "--json"],
                       capture_output=True, text=True, timeout=600)
    rs = [json.loads(line) for line in p.stdout.splitlines() if line.startswith("{")]
    assert p.returncode == 0 and len(rs) == 3, (p.returncode, p.stdout, p.stderr[-2000:])
    assert all(r["ok"] and r["version"] == v and r["fanout"] == "chain" for r in rs), rs
    assert [r["hop"] for r in rs] == [0, 1, 0], rs
    assert [version(d) for d in ds] == [v, v, v]
    outs = [greedy(d) for d in ds]
    assert outs[1] == outs[0] and outs[2] == outs[0]
    assert metric(ds[1], "weight_update_relays_refused_total") >= 1
    stop_cleanly(*ds)


if __name__ == "__main__":
    try:
        main()
    finally:
        for d in _daemons:
            d.kill()
