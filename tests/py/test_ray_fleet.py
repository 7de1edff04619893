"""rolloutd.ray.RolloutFleet (issue 23) on a local Ray cluster (ray.init here, a custom resource
"rd_slot" standing for the nodes a daemon may take), with two tiny models of one shape
(tools/gen_tiny_model.py; the second's HF state dict stands for the trainer's weights):

- a fleet of 2 daemons listens on this machine's non-loopback address (Ray's node IP), with a
  secret the fleet drew: a client without it is refused (NNG and HTTP), the secret is on no
  daemon's command line and in no file of the Ray session or the temp dir;
- generate through fleet.pool() and through sglang-router (router="sglang") on fleet.urls():
  the outputs equal a single daemon's (token ids and log-prob bits, per-request seeds);
- push_tensors from NumPy through the fleet's chain (hops 0 and 1: relay_allow admits the
  peers), then kill -9 one daemon while a thread generates through the pool: the fleet records
  "exited" and "restarted", the new daemon serves the pushed version (WEIGHTS_SYNC from its
  peer) with outputs equal to a single daemon on those weights, every request submitted after
  the restart completes (the load thread's and a batch through the Pool made before the
  kill), the router routes to the new URL and not the old, and a second chained push reaches
  the restarted daemon on its new port through the relay; an actor killed with SIGKILL takes
  its daemon along and is made again in its bundle (actor_lost, then restarted, synced); a
  daemon stopped with SIGSTOP (alive, answering nothing) is killed and replaced after
  unresponsive_s;
- shutdown: every daemon exits 0, no rolloutd process of the fleet is left, the placement
  group is REMOVED;
- a learner killed with SIGKILL leaves no daemon (the actors' children die with them)."""
import ipaddress
import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import ROOT, TMP, Skip, case, main  # noqa: E402
from rdtest import Daemon, stop_cleanly  # noqa: E402

sys.path.insert(0, os.path.join(ROOT, "tools", "python"))
from rolloutd import Client, DaemonError, Pool, proto  # noqa: E402

try:
    import ray
    from rolloutd.ray import RolloutFleet
except ImportError:
    ray = None

PROMPTS = [[1, 40, 41, 42, 43, 44, 45, 46], [1, 50, 60, 70, 80], [1, 7, 9], [1, 100, 200, 33]]
SEEDS = [11, 12, 13, 14]
CONFIG = {"threads": 1, "kv_cache_bytes": 16 << 20, "max_num_seqs": 8, "max_tokens": 256, "drain_s": 2,
          "shutdown_grace_s": 3}
_files = {}
_state = {}


def tiny(name, seed):
    if name not in _files:
        base = os.path.join(TMP, f"rf-{name}-{os.getpid()}")
        subprocess.run([sys.executable, os.path.join(ROOT, "tools", "gen_tiny_model.py"), "--out", base + ".gguf",
                        "--dtype", "f32", "--seed", str(seed), "--ctx", "512", "--layers", "2", "--dim", "64",
                        "--ffn", "128", "--hf-out", base + ".npz"], check=True, capture_output=True)
        _files[name] = base
    return _files[name]


def new_weights():
    z = np.load(tiny("new", 702) + ".npz")
    return [(k, np.ascontiguousarray(z[k], dtype=np.float32)) for k in z.files]


def samples(pool_or_client):
    out = pool_or_client.generate(PROMPTS, n=2, max_tokens=12, temperature=1.0, seed=SEEDS, ignore_eos=True)
    return [(s.index, s.sample_idx, list(map(int, s.token_ids)), s.logprobs.view(np.uint32).tolist(), s.version_finish)
            for s in out]


def call(base, path, body=None, key=None, method=None, timeout=60):
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(base + path, data=data, method=method or ("POST" if data is not None else "GET"),
                                 headers={"Content-Type": "application/json",
                                          **({"Authorization": f"Bearer {key}"} if key else {})})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            raw = r.read()
            return r.status, json.loads(raw) if raw else None
    except urllib.error.HTTPError as e:
        raw = e.read()
        return e.code, json.loads(raw) if raw else None


def http_gen(base, key, prompt, seed):
    st, r = call(base, "/generate", {"input_ids": prompt, "return_logprob": True, "sampling_params": {
        "max_new_tokens": 10, "temperature": 1.0, "sampling_seed": seed, "ignore_eos": True}}, key)
    assert st == 200, (st, r)
    return r["output_ids"], [t[0] for t in r["meta_info"]["output_token_logprobs"]]


def reference(version_weights=None):
    """A single daemon (loopback, no secret) on the old model, or pushed the new weights as version 7."""
    key = "ref-new" if version_weights else "ref-old"
    if key not in _state:
        d = Daemon("--model", tiny("old", 701) + ".gguf", *sum(([f"--{k.replace('_', '-')}", str(v)]
                                                              for k, v in CONFIG.items()), []))
        try:
            if version_weights:
                with Pool([d.url]) as p:
                    p.push_tensors(version_weights, version=7)
            with Client(d.url) as c:
                s = samples(c)
            r = [http_gen(f"http://127.0.0.1:{d.http_port}", None, p, sd) for p, sd in zip(PROMPTS, SEEDS)]
            _state[key] = (s, r)
        finally:
            stop_cleanly(d)
    return _state[key]


def cluster():
    if "ray" not in _state:
        # Ray's own clean-up of an exiting worker's children off: the fleet's (PR_SET_PDEATHSIG) is tested.
        os.environ["RAY_kill_child_processes_on_worker_exit"] = "0"
        ray.init(num_cpus=3, resources={"rd_slot": 3}, include_dashboard=False, log_to_driver=False,
                 logging_level="ERROR")
        _state["ray"] = True


def fleet():
    if "fleet" not in _state:
        cluster()
        _state["fleet"] = RolloutFleet(model=tiny("old", 701) + ".gguf", num_daemons=2,
                                       resources_per_daemon={"CPU": 0.5, "rd_slot": 1}, strategy="SPREAD",
                                       config=CONFIG, router="sglang", watch_interval_s=0.2, unresponsive_s=3.0)
    return _state["fleet"]


def skip(name):
    if ray is None:
        raise Skip("ray is not installed: tools/setup.sh installs it")
    try:
        import sglang_router  # noqa: F401
    except ImportError:
        raise Skip("sglang-router is not installed")
    return False


def host_of(url):
    return url.split("//", 1)[1].rsplit(":", 1)[0].strip("[]")


@case
def a_fleet_on_non_loopback_addresses_with_its_own_secret():
    if skip("a_fleet_on_non_loopback_addresses_with_its_own_secret"):
        return
    f = fleet()
    ip = ray.util.get_node_ip_address()
    assert len(f.urls()) == 2 and len(set(f.urls())) == 2
    for u in f.urls() + f.nng_urls():
        assert host_of(u) == ip and not ipaddress.ip_address(host_of(u)).is_loopback, (u, ip)
    assert [e["kind"] for e in f.events()] == ["started", "started"], f.events()
    # without the secret: refused on both sockets
    st, _ = call(f.urls()[0], "/generate", {"input_ids": [1, 2], "sampling_params": {"max_new_tokens": 1}})
    assert st == 401, st
    assert call(f.urls()[0], "/weights_manifest")[0] == 401
    assert call(f.urls()[0], "/weights_manifest", key=f.api_key)[0] == 200
    try:
        Client(f.nng_urls()[0]).generate([[1, 2]], max_tokens=1)
        raise AssertionError("served without the secret")
    except DaemonError as e:
        assert e.code == proto.E.UNAUTHORIZED, e
    # the secret is not on a command line nor in any file Ray or the daemons wrote
    for pid in f.pids():
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            argv = fh.read().split(b"\0")
        assert f.secret.encode() not in b" ".join(argv) and any(a.startswith(b"/dev/fd/") for a in argv), argv
    needle = f.secret.encode()
    session = os.path.realpath("/tmp/ray/session_latest")
    paths = [os.path.join(d, n) for d, _, ns in os.walk(session) for n in ns]
    paths += [os.path.join(TMP, n) for n in os.listdir(TMP) if n.startswith(("rolloutd-fleet-", "sglang-router-fleet-"))]
    assert len(paths) > 10, paths
    for p in paths:
        try:
            if os.path.isfile(p) and not os.path.islink(p) and os.path.getsize(p) < (64 << 20):
                with open(p, "rb") as fh:
                    assert needle not in fh.read(), f"the fleet's secret is in {p}"
        except (PermissionError, FileNotFoundError):
            pass


@case
def generate_through_the_pool_and_the_router_equals_one_daemon():
    if skip("generate_through_the_pool_and_the_router_equals_one_daemon"):
        return
    f = fleet()
    want, want_http = reference()
    with f.pool() as pool:
        assert pool.urls == f.nng_urls()
        assert samples(pool) == want
    got = [http_gen(f.router_url, f.api_key, p, s) for p, s in zip(PROMPTS, SEEDS)]
    assert got == want_http, "through sglang-router != one daemon"
    done = [call(u, "/status", key=f.api_key)[1]["requests"]["completed"] for u in f.urls()]
    assert all(n >= 2 for n in done), done     # the router used both


@case
def kill_9_under_load_restarts_the_daemon_on_the_current_version():
    if skip("kill_9_under_load_restarts_the_daemon_on_the_current_version"):
        return
    f = fleet()
    items = new_weights()
    want, want_http = reference(items)
    pool = f.pool()
    res = pool.push_tensors(items, version=7)
    assert sorted(r.hop for r in res) == [0, 1] and {r.version for r in res} == {7}, res
    assert samples(pool) == want
    log, stop = [], threading.Event()

    def load():
        while not stop.is_set():
            t = time.monotonic()
            try:
                ok = samples(pool) == want
            except Exception as e:         # the killed daemon's requests fail until the restart
                ok = type(e).__name__
                time.sleep(0.05)
            log.append((t, ok))
    th = threading.Thread(target=load, daemon=True)
    th.start()
    time.sleep(0.5)
    old_url, old_http, pid = f.nng_urls()[1], f.urls()[1], f.pids()[1]
    os.kill(pid, signal.SIGKILL)
    deadline = time.time() + 60
    while not any(e["kind"] == "restarted" for e in f.events()):
        assert time.time() < deadline, f.events()
        time.sleep(0.1)
    t_restart = time.monotonic()
    time.sleep(1.0)
    stop.set()
    th.join(60)
    ev = f.events()
    kinds = [e["kind"] for e in ev]
    assert kinds.count("exited") == 1 and kinds.count("restarted") == 1, ev
    r = [e for e in ev if e["kind"] == "restarted"][0]
    assert r["index"] == 1 and r["old_url"] == old_url and r["url"] != old_url and r["version"] == 7, r
    assert r["synced_from"] == f.nng_urls()[0] and f.event_counts()["restarted"] == 1, r
    assert f.pids()[1] != pid
    print(f"  restart: {r['seconds']} s from the exit to serving version 7 at {r['url']}; load requests before it: "
          f"{sum(1 for t, ok in log if t <= t_restart)} ({sum(1 for t, ok in log if t <= t_restart and ok is not True)} "
          f"failed), after it: {sum(1 for t, ok in log if t > t_restart)} (all equal)")
    after = [ok for t, ok in log if t > t_restart]
    assert after and all(ok is True for ok in after), f"requests submitted after the restart: {after}"
    assert samples(pool) == want, "the Pool made before the kill, after the restart"
    st, v = call(f.urls()[1], "/get_weight_version", key=f.api_key)
    assert (st, v) == (200, {"weight_version": "7"}), (st, v)
    workers = f.router_workers()
    assert f.urls()[1] in workers and old_http not in workers, workers
    got = [http_gen(f.router_url, f.api_key, p, s) for p, s in zip(PROMPTS, SEEDS) for _ in range(2)]
    assert got == [x for x in want_http for _ in range(2)], "through the router after the restart"
    # a second chained push reaches the restarted daemon on its new port (relay_allow: the node, any port)
    res = pool.push_tensors(items, version=8)
    assert sorted(r.hop for r in res) == [0, 1] and {r.version for r in res} == {8}, res
    pool.close()


@case
def an_actor_killed_with_sigkill_takes_its_daemon_and_is_replaced():
    if skip("an_actor_killed_with_sigkill_takes_its_daemon_and_is_replaced"):
        return
    f = fleet()
    pool = f.pool()
    v = int(call(f.urls()[1], "/get_weight_version", key=f.api_key)[1]["weight_version"])
    info = f.members[0].info
    os.kill(info["actor_pid"], signal.SIGKILL)
    deadline = time.time() + 30
    while os.path.exists(f"/proc/{info['pid']}") and open(f"/proc/{info['pid']}/stat").read().split()[2] != "Z":
        assert time.time() < deadline, "the daemon outlived its actor by 30 s"
        time.sleep(0.1)
    n0 = f.event_counts().get("restarted", 0)
    deadline = time.time() + 90
    while f.event_counts().get("restarted", 0) < n0 + 1:
        assert time.time() < deadline, f.events()
        time.sleep(0.2)
    lost = [e for e in f.events() if e["kind"] == "actor_lost"]
    r = [e for e in f.events() if e["kind"] == "restarted"][-1]
    assert len(lost) == 1 and lost[0]["index"] == 0 and r["index"] == 0 and r["version"] == v, f.events()
    assert f.members[0].info["actor_pid"] != info["actor_pid"]
    want = reference(new_weights())[0] if v == 8 else None
    got = samples(pool)
    assert all(s[4] == v for s in got), got
    if want is not None:       # version 8 holds the same weights as 7
        assert [s[:4] for s in got] == [s[:4] for s in want]
    pool.close()


@case
def a_daemon_that_stops_answering_is_replaced():
    if skip("a_daemon_that_stops_answering_is_replaced"):
        return
    f = fleet()
    pool = f.pool()
    v = int(call(f.urls()[0], "/get_weight_version", key=f.api_key)[1]["weight_version"])
    n0 = f.event_counts().get("restarted", 0)
    pid = f.pids()[1]
    os.kill(pid, signal.SIGSTOP)       # alive, answering nothing
    try:
        deadline = time.time() + 60
        while f.event_counts().get("restarted", 0) < n0 + 1:
            assert time.time() < deadline, f.events()
            time.sleep(0.2)
    finally:
        if os.path.exists(f"/proc/{pid}"):
            os.kill(pid, signal.SIGCONT)
    ev = [e for e in f.events() if e["kind"] == "unresponsive"]
    assert len(ev) == 1 and ev[0]["index"] == 1 and ev[0]["seconds"] >= 3.0, f.events()
    r = [e for e in f.events() if e["kind"] == "restarted"][-1]
    assert r["index"] == 1 and r["version"] == v and f.pids()[1] != pid, r
    assert not os.path.exists(f"/proc/{pid}") or open(f"/proc/{pid}/stat").read().split()[2] == "Z"
    assert all(s[4] == v for s in samples(pool))
    pool.close()


@case
def shutdown_leaves_no_daemon_and_no_placement_group():
    if skip("shutdown_leaves_no_daemon_and_no_placement_group"):
        return
    f = fleet()
    pids = f.pids()
    rcs = f.shutdown()
    assert rcs == [0, 0], rcs
    assert [e["index"] for e in f.events() if e["kind"] == "stopped"] == [0, 1], f.events()
    for pid in pids:
        assert not os.path.exists(f"/proc/{pid}") or open(f"/proc/{pid}/stat").read().split()[2] == "Z", pid
    assert f.placement_state() == "REMOVED", f.placement_state()
    assert f._router is None
    _state.pop("fleet")


DRIVER = r"""
import sys, time
sys.path.insert(0, sys.argv[1])
import ray
ray.init(address=sys.argv[2], logging_level="ERROR", log_to_driver=False)
from rolloutd.ray import RolloutFleet
f = RolloutFleet(model=sys.argv[3], num_daemons=1, resources_per_daemon={"CPU": 0.5, "rd_slot": 1},
                 config={"threads": 1, "kv_cache_bytes": 16 << 20})
print("PID", f.pids()[0], flush=True)
time.sleep(600)
"""


@case
def a_learner_killed_with_sigkill_leaves_no_daemon():
    if skip("a_learner_killed_with_sigkill_leaves_no_daemon"):
        return
    cluster()
    addr = ray.get_runtime_context().gcs_address
    p = subprocess.Popen([sys.executable, "-c", DRIVER, os.path.join(ROOT, "tools", "python"), addr,
                          tiny("old", 701) + ".gguf"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        line = ""
        deadline = time.time() + 90
        while not line.startswith("PID"):
            assert time.time() < deadline and p.poll() is None, "the learner did not start its fleet"
            line = p.stdout.readline()
        pid = int(line.split()[1])
        assert os.path.exists(f"/proc/{pid}")
        p.kill()
        p.wait()
        deadline = time.time() + 60
        while os.path.exists(f"/proc/{pid}") and open(f"/proc/{pid}/stat").read().split()[2] != "Z":
            assert time.time() < deadline, f"rolloutd {pid} outlived its learner by 60 s"
            time.sleep(0.2)
    finally:
        if p.poll() is None:
            p.kill()


OWNER = r"""
import sys, threading, time
sys.path.insert(0, sys.argv[1])
from rolloutd.ray import DaemonHost
h = DaemonHost(sys.argv[2], sys.argv[3], ["--threads", "1", "--kv-cache-bytes", str(16 << 20)], "s" * 32)
box = {}
t = threading.Thread(target=lambda: box.update(h.start("none")))
t.start()
t.join()
time.sleep(1.0)
print("PID", box["pid"], h.poll(), flush=True)
time.sleep(600)
"""


@case
def the_daemon_outlives_the_thread_that_started_it_and_dies_with_its_owner():
    """PR_SET_PDEATHSIG is bound to the thread that forks: the actor's owner thread lives as long
    as the daemon, so a start() called from a thread that then ends leaves the daemon running;
    the owner process killed with SIGKILL (no Ray here to clean up) takes the daemon with it."""
    if ray is None:
        raise Skip("ray is not installed")
    from rolloutd.ray import DEFAULT_BINARY
    p = subprocess.Popen([sys.executable, "-c", OWNER, os.path.join(ROOT, "tools", "python"), DEFAULT_BINARY,
                          tiny("old", 701) + ".gguf"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        line = p.stdout.readline().split()
        assert line and line[0] == "PID", line
        pid = int(line[1])
        assert line[2] == "None" and os.path.exists(f"/proc/{pid}"), ("the daemon died with the starting thread", line)
        p.kill()
        p.wait()
        deadline = time.time() + 10
        while os.path.exists(f"/proc/{pid}") and open(f"/proc/{pid}/stat").read().split()[2] != "Z":
            if time.time() > deadline:
                os.kill(pid, signal.SIGKILL)
                raise AssertionError(f"rolloutd {pid} outlived its owner by 10 s")
            time.sleep(0.1)
    finally:
        if p.poll() is None:
            p.kill()


if __name__ == "__main__":
    try:
        main()
    finally:
        if "fleet" in _state:
            _state["fleet"].shutdown()
        if ray is not None and ray.is_initialized():
            ray.shutdown()
        for base in _files.values():
            for ext in (".gguf", ".npz"):
                if os.path.exists(base + ext):
                    os.unlink(base + ext)
