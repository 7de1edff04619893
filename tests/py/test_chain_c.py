"""The C client's chained weight push (rd_chain.c, PROTOCOL.md §10.11) through
`rolloutctl push-weights --fanout chain` against real daemons on loopback:

- a chain of three daemons: every one serves the new version (HELLO_OK and
  /status), the JSON results say hops 0, 1, 2, only the first got bytes from
  rolloutctl, and greedy outputs are bit-identical across the three and to a
  fourth daemon given the same file by a direct push (and differ from the old
  weights, so a push that changed nothing cannot pass);
- a daemon that cannot be reached: --on-failure abort (the default) aborts
  the update everywhere (old weights serving, no transfer left open);
  --on-failure commit commits on the others, chained around it (hops 0, 1, 2);
- the last daemon killed mid-push: the others commit and keep running;
- daemons with a shared secret (lane keys, wrapped for the relaying daemon):
  the chain works with the secret and fails without it; then the middle
  daemon stops answering (SIGSTOP) once its transfer is open: the first
  relays to the third instead (--on-failure commit), both commit, the stopped
  one reports the failure and, resumed, still serves its old weights;
- every daemon exits cleanly on SIGTERM."""
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import BUILD, MODEL, ROOT, TMP, case, main, run  # noqa: E402
from rdtest import PROMPT, Daemon, free_port, stop_cleanly  # noqa: E402

sys.path.insert(0, os.path.join(ROOT, "tools", "python"))
from rolloutd import Client  # noqa: E402

CTL = os.path.join(BUILD, "rolloutctl")
PROMPTS = [PROMPT, [1, 504, 3458, 282, 4649, 314, 216, 33, 30], [1, 2914, 28, 1345, 4649]]
_tmp = tempfile.mkdtemp(prefix="rd-chainc-", dir=TMP)
SECRET_FILE = os.path.join(_tmp, "secret")
with open(SECRET_FILE, "w") as f:
    f.write("chain-test-secret-0123456789abcdef\n")
os.chmod(SECRET_FILE, 0o600)
_daemons = []
_plain = []     # five daemons without a secret
_authed = []    # three with SECRET_FILE


def daemons(n, *extra):
    """n daemons, started at once (each start mostly waits on its model load)."""
    with ThreadPoolExecutor(n) as ex:
        futs = [ex.submit(Daemon, *extra) for _ in range(n)]
    out, err = [], None
    for f in futs:
        try:
            out.append(f.result())
        except Exception as e:  # the ones that started are still killed at exit
            err = e
    _daemons.extend(out)
    if err:
        raise err
    return out


def plain():
    """Four daemons without a secret, and a fifth that one case kills."""
    if not _plain:
        _plain.extend(daemons(5))
    return _plain


def authed():
    if not _authed:
        _authed.extend(daemons(3, "--auth-token-file", SECRET_FILE))
    return _authed


def push(urls, version, seed, *flags, secret=False, check=True, popen=False):
    """rolloutctl push-weights of the default model, perturbed from `seed`, sent as bf16;
    one dict per daemon from --json (or the Popen when popen)."""
    env = dict(os.environ)
    env.pop("ROLLOUTD_AUTH_TOKEN", None)
    env.pop("ROLLOUTD_AUTH_TOKEN_FILE", None)
    if secret:
        env["ROLLOUTD_AUTH_TOKEN_FILE"] = SECRET_FILE
    args = [CTL, "push-weights", "--connect", ",".join(urls), MODEL, "--version", str(version), "--perturb", "0.01",
            "--seed", str(seed), "--dtype", "bf16", "--json", *map(str, flags)]
    if popen:
        return subprocess.Popen(args, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    p = run(args, env=env, check=check)
    return p.returncode, [json.loads(line) for line in p.stdout.splitlines() if line.startswith("{")]


def client(d, secret=False):
    return Client(d.url, auth_token_file=SECRET_FILE if secret else None)


def greedy(d, secret=False):
    with client(d, secret) as c:
        return c.generate(PROMPTS, max_tokens=12, temperature=0.0, ignore_eos=True)


def same(a, b):
    """Bit-identical token ids and log-probs, sample for sample."""
    return len(a) == len(b) and all(
        np.array_equal(x.token_ids, y.token_ids) and np.array_equal(x.logprobs.view(np.uint32), y.logprobs.view(np.uint32))
        for x, y in zip(a, b))


def status(d, secret=False):
    """The /status document (over STATUS: with a secret, HTTP wants a Bearer key)."""
    if not secret:
        return json.loads(d.http("/status")[2])
    with client(d, True) as c:
        return c.status()


def versions(ds, secret=False):
    """(HELLO_OK.weight_version, /status weight_version, a transfer open) per daemon."""
    out = []
    for d in ds:
        with client(d, secret) as c:
            hv = c.info.weight_version
        st = status(d, secret)
        out.append((hv, st["weight_version"], st["weight_update"]["in_progress"]))
    return out


def settle(ds, secret=False, timeout=20):
    """Waits until no daemon has a transfer open (an aborted one ends when its connection closes)."""
    deadline = time.time() + timeout
    while any(v[2] for v in versions(ds, secret)):
        assert time.time() < deadline, versions(ds, secret)
        time.sleep(0.05)


_direct = []


def direct_v1():
    """Greedy outputs of the fourth daemon after a direct push of version 1 (seed 7)."""
    if not _direct:
        d = plain()[3]
        rc, (r,) = push([d.url], 1, 7, "--fanout", "direct")
        assert rc == 0 and r["ok"] and r["version"] == 1 and r["fanout"] == "direct" and r["hop"] == 0, r
        _direct.append(greedy(d))
    return _direct[0]


@case
def chain_of_three_serves_the_update_like_a_direct_push():
    a, b, c, d, _ = plain()
    base = greedy(a)
    rc, rs = push([a.url, b.url, c.url], 1, 7, "--fanout", "chain")
    assert rc == 0 and [r["url"] for r in rs] == [a.url, b.url, c.url], rs
    assert all(r["ok"] and r["version"] == 1 and r["fanout"] == "chain" for r in rs), rs
    assert [r["hop"] for r in rs] == [0, 1, 2], rs
    total = rs[0]["bytes"]
    assert total == 538060032 // 2 and all(r["bytes"] == total for r in rs), rs
    # The learner's egress is the update once: only the first daemon got chunks from rolloutctl.
    assert rs[0]["wire_bytes"] >= total and rs[1]["wire_bytes"] == 0 and rs[2]["wire_bytes"] == 0, rs
    print("  chain: " + ", ".join(f"hop {r['hop']} {r['seconds']:.2f} s" for r in rs), flush=True)
    outs = [greedy(x) for x in (a, b, c)] + [direct_v1()]
    assert versions([a, b, c, d]) == [(1, 1, False)] * 4
    assert not same(base, outs[0]), "the perturbed weights gave the old outputs: nothing was pushed"
    for k, o in enumerate(outs[1:], 1):
        assert same(outs[0], o), f"daemon {k} disagrees with the first after the same push"


@case
def unreachable_daemon_aborts_everywhere_or_is_chained_around():
    a, b, c, _, _ = plain()
    v0 = versions([a])[0][0]
    dead = f"tcp://127.0.0.1:{free_port()}"
    urls = [a.url, dead, b.url, c.url]
    rc, rs = push(urls, v0 + 1, 8, check=False)     # the default fanout (chain) and on-failure (abort)
    assert rc == 1 and [r["url"] for r in rs] == urls, (rc, rs)
    assert not any(r["ok"] for r in rs), rs
    assert "connect" in rs[1]["error"], rs[1]
    for r in (rs[0], rs[2], rs[3]):
        assert r["fanout"] == "chain" and "another daemon of the chain failed" in r["error"], r
    settle([a, b, c])
    assert versions([a, b, c]) == [(v0, v0, False)] * 3
    rc, rs = push(urls, v0 + 1, 8, "--on-failure", "commit", check=False)
    assert rc == 1 and not rs[1]["ok"], (rc, rs)
    ok = [rs[0], rs[2], rs[3]]
    assert all(r["ok"] and r["version"] == v0 + 1 for r in ok) and [r["hop"] for r in ok] == [0, 1, 2], rs
    assert versions([a, b, c]) == [(v0 + 1, v0 + 1, False)] * 3


@case
def last_daemon_killed_mid_push_survivors_commit_and_keep_serving():
    """The relay into a dead daemon fails; the survivors commit (--on-failure commit) and keep running.
    (rolloutctl stops the relays before it commits, as rd_chain.c's unlink_relay says.)"""
    a, b, _, _, e = plain()
    v = versions([a])[0][0] + 1
    p = push([a.url, b.url, e.url], v, 10, "--on-failure", "commit", popen=True)
    killed = False
    try:
        deadline = time.time() + 30
        while time.time() < deadline and p.poll() is None:
            wu = json.loads(e.http("/status")[2])["weight_update"]
            if wu["in_progress"] and wu.get("bytes_staged", 0) > 0:
                e.proc.kill()
                killed = True
                break
            time.sleep(0.002)
        out, err = p.communicate(timeout=90)
    finally:
        if p.poll() is None:
            p.kill()
    assert killed, "the push ended before the last daemon got any bytes"
    rs = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    assert p.returncode == 1 and len(rs) == 3 and not rs[2]["ok"], (p.returncode, out, err[-2000:])
    assert rs[0]["ok"] and rs[1]["ok"] and [rs[0]["hop"], rs[1]["hop"]] == [0, 1], rs
    time.sleep(0.5)
    assert a.proc.poll() is None and b.proc.poll() is None, (a.tail(), b.tail())
    assert versions([a, b]) == [(v, v, False)] * 2
    assert same(greedy(a), greedy(b))
    _daemons.remove(e)


@case
def chain_with_secrets_and_a_daemon_that_stops_mid_push():
    x, y, z = authed()
    rc, rs = push([x.url, y.url, z.url], 1, 7, "--fanout", "chain", secret=True)
    assert rc == 0 and all(r["ok"] and r["version"] == 1 for r in rs) and [r["hop"] for r in rs] == [0, 1, 2], rs
    assert versions([x, y, z], True) == [(1, 1, False)] * 3
    ref = direct_v1()           # version 1 from the same file and seed, pushed directly
    for k, d in enumerate((x, y, z)):
        assert same(ref, greedy(d, True)), f"authenticated daemon {k} disagrees with the direct push"
    rc, rs = push([x.url, y.url, z.url], 2, 9, secret=False, check=False)
    assert rc == 1 and all(not r["ok"] and "UNAUTHORIZED" in r["error"] for r in rs), rs

    # The middle daemon stops answering (SIGSTOP: hung, not dead) once bytes reach it, typically while
    # it relays a chunk to the third: the first relays to the third instead. The third's lane cuts
    # the stalled connection after 3 s, freeing the chunk it held, and the rerouted relay, refused
    # BUSY until then, sends it again.
    version = 2
    p = push([x.url, y.url, z.url], version, 9, "--on-failure", "commit", secret=True, popen=True)
    wu = {}
    try:
        deadline = time.time() + 30
        while time.time() < deadline and p.poll() is None:
            wu = status(y, True)["weight_update"]
            if wu["in_progress"] and wu["bytes_staged"] > 0:
                y.proc.send_signal(signal.SIGSTOP)
                break
            time.sleep(0.001)
        out, err = p.communicate(timeout=120)
    finally:
        if p.poll() is None:
            p.kill()
        y.proc.send_signal(signal.SIGCONT)
    settle([x, y, z], True)
    assert wu.get("bytes_staged", 0) > 0, wu
    rs = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    assert p.returncode == 1 and len(rs) == 3, (p.returncode, out, err[-2000:])
    assert rs[0]["ok"] and rs[2]["ok"] and not rs[1]["ok"], rs
    assert [rs[0]["hop"], rs[2]["hop"]] == [0, 1] and rs[0]["version"] == rs[2]["version"] == version, rs
    assert "UPDATE_PREPARE" in rs[1]["error"] or "UPDATE_FORWARD" in rs[1]["error"], rs[1]
    print(f"  rerouted: {rs[1]['error'][:60]}; survivors in {rs[2]['seconds']:.1f} s", flush=True)
    assert versions([x, y, z], True) == [(version, version, False), (1, 1, False), (version, version, False)]
    assert same(greedy(x, True), greedy(z, True))


@case
def fanout_and_on_failure_flags_are_validated():
    for flag, value, want in (("--fanout", "ring", "expected chain or direct"),
                              ("--on-failure", "maybe", "expected abort or commit")):
        p = run([CTL, "push-weights", "--connect", "tcp://127.0.0.1:1", MODEL, "--version", "1", flag, value],
                check=False)
        assert p.returncode == 2 and want in p.stderr, (p.returncode, p.stderr)


@case
def daemons_stop_cleanly():
    """SIGTERM exits 0 after the chains, the aborts and the stop (under ASan: nothing leaked)."""
    stop_cleanly(*_daemons)


if __name__ == "__main__":
    try:
        main()
    finally:
        for d in _daemons:
            d.kill()
        subprocess.run(["rm", "-rf", _tmp])
