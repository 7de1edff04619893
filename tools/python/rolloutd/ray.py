"""A fleet of rolloutd daemons placed, watched and restarted by Ray.

    import ray
    from rolloutd.ray import RolloutFleet
    ray.init(address="auto")
    fleet = RolloutFleet(model="/models/policy.gguf", num_daemons=4, resources_per_daemon={"GPU": 1},
                         strategy="STRICT_SPREAD", config={"max_tokens": 4096})
    pool = fleet.pool()                       # rolloutd.Pool over every daemon (chain pushes, auth)
    samples = pool.generate(prompts, n=8, max_tokens=256, temperature=1.0, seed=1)
    pool.push_tensors(model.state_dict().items(), version=step)
    fleet.shutdown()

The fleet makes a placement group with one bundle per daemon and one Ray actor
per bundle; each actor runs build/rolloutd as its child on its node's IP (never
loopback), so the daemon's CPUs or GPU are the bundle's. The fleet draws a
secret (32 random bytes, hex) and hands it to the actors as an argument; an
actor gives it to its daemon through a pipe (--auth-token-file /dev/fd/N), so
it is never written to any disk. The same secret is the HTTP Bearer key.

Watching: a thread polls every member (the actor answers whether its child is
running; the driver asks /health). A daemon that exits, or whose /health fails
for `unresponsive_s`, is killed and started again in its bundle; an actor that
is gone (its node died) is made again in the same bundle index, which Ray
places on a live node. The new daemon is started with weights_from a live
peer (WEIGHTS_SYNC), so it serves the fleet's current version; then every Pool
made by fleet.pool() and the router are told its new URLs. Each event is
logged (logger "rolloutd.ray") and kept in fleet.events().

Every node must hold the rolloutd binary and the model at the same paths (the
repository checked out and built at one path, e.g. on a shared file system,
or `binary=` / $ROLLOUTD_BINARY and `model=` naming local copies that exist at
that path on every node; with `pip install tools/python` pass binary=).
`ray` is imported only in this module.
"""
import collections
import ctypes
import json
import logging
import os
import secrets
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
import weakref

import ray
from ray.util.placement_group import placement_group, placement_group_table, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from .client import Client
from .pool import Pool
from .tensors import fetch_manifest

log = logging.getLogger("rolloutd.ray")

_HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(_HERE)))  # the repository (of tools/python/rolloutd)
DEFAULT_BINARY = os.environ.get("ROLLOUTD_BINARY") or os.path.join(ROOT, os.environ.get("RD_BUILD", "build"), "rolloutd")
STRATEGIES = ("STRICT_SPREAD", "SPREAD", "PACK", "STRICT_PACK")
PR_SET_PDEATHSIG = 1


def _free_port(host):
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def _http(url, path, key=None, timeout=5.0, body=None):
    """(status, parsed JSON or None); raises OSError when nothing answers."""
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url + path, data=data, method="POST" if data is not None else "GET",
                                 headers={"Content-Type": "application/json",
                                          **({"Authorization": f"Bearer {key}"} if key else {})})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            raw = r.read()
            return r.status, (json.loads(raw) if raw else None)
    except urllib.error.HTTPError as e:
        raw = e.read()
        try:
            return e.code, json.loads(raw) if raw else None
        except ValueError:
            return e.code, None


class DaemonHost:
    """The Ray actor of one bundle: owns one rolloutd child on this node's IP.

    The child is spawned by a thread of the actor that lives as long as the
    child (PR_SET_PDEATHSIG is bound to the thread that forked, not the
    process), with PR_SET_PDEATHSIG = SIGKILL: if the actor's process dies
    (the learner died and Ray reaped its actors, or the node's raylet went),
    the daemon dies with it."""

    def __init__(self, binary, model, flags, secret, cwd=None):
        self.binary, self.model, self.flags, self.cwd = binary, model, list(flags), cwd
        self._secret = secret
        self.ip = ray.util.get_node_ip_address()
        self.proc = None
        self.log_path = None
        self.info = None

    def node_ip(self):
        return self.ip

    def start(self, relay_allow, weights_from="", timeout=120.0):
        """Starts the daemon (stopping a previous one); returns its URLs once /health answers."""
        self.stop(5)
        for path, what in ((self.binary, "the rolloutd binary"), (self.model, "the model")):
            if not os.path.exists(path):
                raise FileNotFoundError(f"{what} {path} does not exist on node {self.ip} (every node needs it at "
                                        f"the same path)")
        port, http_port = _free_port(self.ip), _free_port(self.ip)
        host = f"[{self.ip}]" if ":" in self.ip else self.ip
        url, http_url = f"tcp://{host}:{port}", f"http://{host}:{http_port}"
        rfd, wfd = os.pipe()
        os.write(wfd, self._secret.encode() + b"\n")    # far below a pipe's buffer
        os.close(wfd)
        argv = [self.binary, "--model", self.model, "--listen", url, "--http-listen", f"{host}:{http_port}",
                "--auth-token-file", f"/dev/fd/{rfd}", "--relay-allow", relay_allow, *self.flags]
        if weights_from:
            argv += ["--weights-from", weights_from]
        self.log_path = os.path.join(os.environ.get("RD_TMP", "/tmp"), f"rolloutd-fleet-{os.getpid()}-{port}.log")
        box, ready = {}, threading.Event()
        t = threading.Thread(target=self._own, args=(argv, rfd, box, ready), name="rolloutd-owner", daemon=True)
        t.start()
        ready.wait()
        os.close(rfd)
        if "error" in box:
            raise box["error"]
        self.proc = box["proc"]
        deadline = time.time() + timeout
        while True:
            try:
                if _http(http_url, "/health", timeout=2)[0] == 200:
                    break
            except OSError:
                pass
            if self.proc.poll() is not None or time.time() > deadline:
                tail = self.tail()
                self.stop(5)
                raise RuntimeError(f"rolloutd on {self.ip} did not start: {tail}")
            time.sleep(0.1)
        self.info = {"url": url, "http_url": http_url, "pid": self.proc.pid, "node_ip": self.ip,
                     "node_id": ray.get_runtime_context().get_node_id() if ray.is_initialized() else None,
                     "log": self.log_path,
                     "actor_pid": os.getpid()}
        return self.info

    def _own(self, argv, rfd, box, ready):
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            parent = os.getpid()

            def pdeathsig():
                libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
                if os.getppid() != parent:      # the actor died between fork and prctl
                    os._exit(1)
            logf = open(self.log_path, "wb")
            box["proc"] = proc = subprocess.Popen(argv, pass_fds=(rfd,), preexec_fn=pdeathsig, stdout=logf,
                                                  stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=self.cwd)
            logf.close()
        except BaseException as e:
            box["error"] = e
            ready.set()
            return
        ready.set()
        proc.wait()     # this thread, the child's parent for PR_SET_PDEATHSIG, lives as long as the child

    def poll(self):
        """None while the daemon runs; its exit status once it exited; "none" before a start."""
        if self.proc is None:
            return "none"
        return self.proc.poll()

    def pid(self):
        return self.proc.pid if self.proc is not None else None

    def stop(self, timeout=60.0):
        """SIGTERM (the daemon drains: running requests finish and are delivered), SIGKILL after
        timeout s; returns the exit status (None if none ran)."""
        p = self.proc
        if p is None:
            return None
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
            try:
                p.wait(timeout)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        self.proc = None
        return p.returncode

    def kill(self):
        """SIGKILL now (a daemon that stopped answering)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def tail(self, n=3000):
        try:
            with open(self.log_path, "rb") as f:
                return f.read().decode(errors="replace")[-n:]
        except OSError:
            return ""


class FleetPool(Pool):
    """A Pool whose daemons the fleet replaces in place when it restarts one (same index)."""

    def __init__(self, urls, name="rolloutd-fleet", **client_kw):
        self._name, self._client_kw = name, dict(client_kw)
        super().__init__(urls, name=name, **client_kw)

    def _cut(self, i):
        """Unblocks a call waiting on daemon i, which is dead (it raises)."""
        c = self.clients[i]
        try:
            if c._sock is not None:
                c._sock.close()
        except Exception:
            pass

    def _replace(self, i, url):
        new = Client(url, name=self._name, **self._client_kw)
        self._cut(i)
        with self._lock:
            old, self.clients[i], self.urls[i] = self.clients[i], new, url
        try:
            old._sock = None
        except Exception:
            pass


class _Member:
    def __init__(self, index):
        self.index = index
        self.actor = None
        self.info = None            # DaemonHost.start's dict
        self.up = False
        self.bad_since = None       # when /health first failed (monotonic)


class RolloutFleet:
    """num_daemons rolloutd daemons in a Ray placement group (see the module's doc).

    model: the model file or HF folder (at this path on every node). resources_per_daemon:
    one bundle, e.g. {"GPU": 1} or {"CPU": 4} (custom resources too). strategy: Ray's
    placement strategy. config: daemon settings, {"max_tokens": 4096, ...} (each becomes
    --key-with-dashes VALUE; listen, http_listen, auth_token_file and relay_allow are the
    fleet's). router="sglang" starts sglang-router over the daemons (fleet.router_url).
    relay_allow: where daemons may relay a chained push; default every node of the Ray
    cluster (its IP, any port), so a daemon restarted on a new port or another node of the
    cluster is still inside every peer's list."""

    def __init__(self, model, num_daemons=1, resources_per_daemon=None, strategy="SPREAD", config=None,
                 router=None, router_host="127.0.0.1", router_port=0, binary=None, watch=True,
                 watch_interval_s=0.5, unresponsive_s=10.0, start_timeout_s=120.0, relay_allow=None,
                 placement_timeout_s=120.0):
        if strategy not in STRATEGIES:
            raise ValueError(f"strategy {strategy!r}; expected one of {', '.join(STRATEGIES)}")
        if int(num_daemons) < 1:
            raise ValueError(f"num_daemons {num_daemons}; expected at least 1")
        if router not in (None, "sglang"):
            raise ValueError(f"router {router!r}; expected None or 'sglang'")
        for k in ("listen", "http_listen", "status_listen", "auth_token_file", "api_key_file", "model"):
            if k in (config or {}):
                raise ValueError(f"config[{k!r}] is set by the fleet")
        if not ray.is_initialized():
            ray.init(address="auto")
        self.model = os.path.abspath(model)
        self.binary = os.path.abspath(binary or DEFAULT_BINARY)
        self.n = int(num_daemons)
        self.bundle = dict(resources_per_daemon or {"CPU": 1})
        self.strategy = strategy
        self.config = dict(config or {})
        self.secret = secrets.token_hex(32)       # held by this process and the actors, never on disk
        self.watch_interval_s, self.unresponsive_s = watch_interval_s, unresponsive_s
        self.start_timeout_s = start_timeout_s
        self._relay_allow = relay_allow
        self._events = []
        self._counts = collections.Counter()
        self._pools = weakref.WeakSet()
        self._manifest = None                     # GET /weights_manifest of the model, fetched once
        self._lock = threading.RLock()            # members, events
        self._stop = threading.Event()
        self._watcher = None
        self.router_url = None
        self._router = None
        self._router_log = None
        self.members = [_Member(i) for i in range(self.n)]
        self.pg = placement_group([dict(self.bundle) for _ in range(self.n)], strategy=strategy,
                                  name=f"rolloutd-fleet-{os.getpid()}-{secrets.token_hex(3)}")
        try:
            ready, _ = ray.wait([self.pg.ready()], timeout=placement_timeout_s)
            if not ready:
                raise RuntimeError(f"the placement group of {self.n} bundles {self.bundle} ({strategy}) was not "
                                   f"placed within {placement_timeout_s} s: the cluster lacks the resources "
                                   f"(ray status shows them)")
            for m in self.members:
                m.actor = self._actor(m.index)
            infos = ray.get([m.actor.start.remote(self.relay_allow(), "", start_timeout_s) for m in self.members])
            for m, info in zip(self.members, infos):
                m.info, m.up = info, True
                self._event("started", m.index, url=info["url"], node_ip=info["node_ip"])
            if router == "sglang":
                self._start_router(router_host, router_port)
        except BaseException:
            self.shutdown()
            raise
        if watch:
            self._watcher = threading.Thread(target=self._watch, name="rolloutd-fleet-watch", daemon=True)
            self._watcher.start()

    # ---- placement ----

    def _flags(self):
        out = []
        for k, v in self.config.items():
            if isinstance(v, bool):
                v = int(v)
            out += [f"--{k.replace('_', '-')}", str(v)]
        return out

    def _actor(self, i):
        res = dict(self.bundle)
        opts = {"num_cpus": res.pop("CPU", 0), "num_gpus": res.pop("GPU", 0), "max_concurrency": 4,
                "scheduling_strategy": PlacementGroupSchedulingStrategy(self.pg, placement_group_bundle_index=i)}
        res.pop("memory", None)
        # The workers import rolloutd.ray from this repository (at the same path on every node).
        path = os.path.dirname(_HERE)  # tools/python
        opts["runtime_env"] = {"env_vars": {"PYTHONPATH": os.pathsep.join(
            x for x in (path, os.environ.get("PYTHONPATH", "")) if x)}}
        if res:
            opts["resources"] = res
        cls = ray.remote(DaemonHost)
        return cls.options(**opts).remote(self.binary, self.model, self._flags(), self.secret, ROOT)

    def relay_allow(self):
        """The daemons' relay_allow: every alive node of the cluster, any port."""
        if self._relay_allow:
            return self._relay_allow
        ips = sorted({n["NodeManagerAddress"] for n in ray.nodes() if n.get("Alive")})
        return ",".join(f"[{ip}]:*" if ":" in ip else f"{ip}:*" for ip in ips) or "none"

    # ---- what the learner uses ----

    def urls(self):
        """The daemons' HTTP URLs (for a router), in bundle order."""
        with self._lock:
            return [m.info["http_url"] for m in self.members]

    def nng_urls(self):
        with self._lock:
            return [m.info["url"] for m in self.members]

    def pool(self, **client_kw) -> FleetPool:
        """A Pool over every daemon (chain fanout for 2+, the fleet's secret); the fleet
        points it at a restarted daemon's new URL."""
        with self._lock:
            urls, http = self.nng_urls(), self.urls()
        if self._manifest is None:
            self._manifest = fetch_manifest(http[0], self.secret)
        p = FleetPool(urls, auth_token=self.secret, **client_kw)
        p.manifest = self._manifest             # push_tensors checks a state dict against it
        with self._lock:
            self._pools.add(p)
        return p

    @property
    def api_key(self):
        """The Bearer key of the daemons' HTTP APIs (the fleet's secret)."""
        return self.secret

    def events(self):
        """Every event so far: dicts with time, kind (started, exited, unresponsive, actor_lost,
        restarted, restart_failed, stopped), index and details; counts in event_counts()."""
        with self._lock:
            return [dict(e) for e in self._events]

    def event_counts(self):
        with self._lock:
            return dict(self._counts)

    def _event(self, kind, index, **detail):
        e = {"time": time.time(), "kind": kind, "index": index, **detail}
        with self._lock:
            self._events.append(e)
            self._counts[kind] += 1
        (log.warning if kind in ("exited", "unresponsive", "actor_lost", "restart_failed") else log.info)(
            "rolloutd fleet: daemon %d %s %s", index, kind, detail)

    # ---- the router ----

    def _start_router(self, host, port):
        port = port or _free_port(host)
        self._router_log = open(os.path.join(os.environ.get("RD_TMP", "/tmp"), f"sglang-router-fleet-{port}.log"), "w+")
        # sglang-router has no key file: the key is on its command line (this host only).
        self._router = subprocess.Popen(
            [sys.executable, "-m", "sglang_router.launch_router", "--host", host, "--port", str(port),
             "--worker-urls", *self.urls(), "--policy", "round_robin", "--api-key", self.secret,
             "--prometheus-host", host, "--prometheus-port", str(_free_port(host)),   # not 29000: may be taken
             "--log-level", "warn"], stdout=self._router_log, stderr=subprocess.STDOUT)
        self.router_url = f"http://{host}:{port}"
        deadline = time.time() + 60
        while True:
            try:
                st, _ = _http(self.router_url, "/generate", self.secret, 30,
                              {"input_ids": [1, 2], "sampling_params": {"max_new_tokens": 1}})
                if st == 200:
                    return
            except OSError:
                pass
            if self._router.poll() is not None or time.time() > deadline:
                self._router_log.seek(0)
                raise RuntimeError(f"sglang-router did not start: {self._router_log.read()[-2000:]}")
            time.sleep(0.3)

    def router_workers(self):
        """{url: healthy} of sglang-router's workers (GET /workers)."""
        st, body = _http(self.router_url, "/workers", self.secret, 10)
        if st != 200:
            raise RuntimeError(f"sglang-router GET /workers answered {st}: {body}")
        return {w["url"]: bool(w.get("is_healthy")) for w in body.get("workers", [])}

    def _router_swap(self, old, new, timeout=30.0):
        """Tells sglang-router (0.3.2's control plane: POST /workers, DELETE /workers/{id}):
        new in (with the key it passes on), once it is healthy there old out."""
        if self._router is None:
            return
        try:
            st, body = _http(self.router_url, "/workers", self.secret, 10, body={"url": new, "api_key": self.secret})
            if st >= 300:
                raise RuntimeError(f"POST /workers answered {st}: {body}")
            deadline = time.time() + timeout
            while not self.router_workers().get(new):
                if time.time() > deadline:
                    raise RuntimeError(f"{new} not healthy in sglang-router after {timeout} s")
                time.sleep(0.2)
            st, body = _http(self.router_url, "/workers", self.secret, 10)
            for w in body.get("workers", []):
                if w["url"] == old:
                    req = urllib.request.Request(f"{self.router_url}/workers/{w['id']}", method="DELETE",
                                                 headers={"Authorization": f"Bearer {self.secret}"})
                    with urllib.request.urlopen(req, timeout=10) as r:
                        r.read()
        except (OSError, RuntimeError, ValueError) as e:
            self._event("router_update_failed", -1, old=old, new=new, error=str(e)[:500])

    # ---- watching ----

    def _watch(self):
        while not self._stop.wait(self.watch_interval_s):
            for m in self.members:
                if self._stop.is_set():
                    return
                try:
                    self._check(m)
                except Exception as e:     # the watcher must go on
                    log.exception("rolloutd fleet: watching daemon %d: %s", m.index, e)

    def _check(self, m):
        try:
            rc = ray.get(m.actor.poll.remote(), timeout=10)
        except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError) as e:
            self._down(m)
            self._event("actor_lost", m.index, url=m.info["url"], error=f"{type(e).__name__}: {e}"[:500])
            try:
                ray.kill(m.actor, no_restart=True)
            except Exception:
                pass
            m.actor = self._actor(m.index)
            self._restart(m)
            return
        if rc is not None:
            self._down(m)
            self._event("exited", m.index, url=m.info["url"], returncode=rc)
            self._restart(m)
            return
        try:
            ok = _http(m.info["http_url"], "/health", timeout=2)[0] == 200
        except OSError:
            ok = False
        if ok:
            m.bad_since = None
            return
        now = time.monotonic()
        if m.bad_since is None:
            m.bad_since = now
        elif now - m.bad_since > self.unresponsive_s:
            seconds = round(now - m.bad_since, 1)
            self._down(m)
            self._event("unresponsive", m.index, url=m.info["url"], seconds=seconds)
            try:
                ray.get(m.actor.kill.remote(), timeout=10)
            except Exception:
                pass
            self._restart(m)

    def _down(self, m):
        with self._lock:
            m.up = False
            m.bad_since = None
        for p in list(self._pools):
            p._cut(m.index)         # calls waiting on it fail now, not after their timeouts

    def _peer(self, m):
        with self._lock:
            for o in self.members:
                if o is not m and o.up:
                    return o
        return None

    def _restart(self, m):
        t0 = time.monotonic()
        peer = self._peer(m)
        old = m.info
        try:
            info = ray.get(m.actor.start.remote(self.relay_allow(), peer.info["url"] if peer else "",
                                                self.start_timeout_s), timeout=self.start_timeout_s + 30)
            version = self._synced(info, peer)
        except Exception as e:
            self._event("restart_failed", m.index, url=old["url"], error=f"{type(e).__name__}: {e}"[:1000])
            return
        for p in list(self._pools):
            try:
                p._replace(m.index, info["url"])
            except Exception as e:
                log.warning("rolloutd fleet: a pool could not reach the restarted daemon %d: %s", m.index, e)
        self._router_swap(old["http_url"], info["http_url"])
        with self._lock:
            m.info, m.up, m.bad_since = info, True, None
        self._event("restarted", m.index, old_url=old["url"], url=info["url"], node_ip=info["node_ip"],
                    moved=info["node_id"] != old.get("node_id"), version=version,
                    synced_from=peer.info["url"] if peer else None, seconds=round(time.monotonic() - t0, 2))

    def _synced(self, info, peer, timeout=120.0):
        """Waits until the restarted daemon serves its peer's weight version (WEIGHTS_SYNC
        runs once it serves); returns the version."""
        if peer is None:
            return self._version(info)
        deadline = time.time() + timeout
        while True:
            want, got = self._version(peer.info), self._version(info)
            if got == want:
                return got
            if time.time() > deadline:
                raise RuntimeError(f"{info['url']} serves version {got}, its peer {peer.info['url']} {want}, "
                                   f"after {timeout} s")
            time.sleep(0.1)

    def _version(self, info):
        st, body = _http(info["http_url"], "/get_weight_version", self.secret)
        if st != 200:
            raise RuntimeError(f"{info['http_url']}/get_weight_version answered {st}: {body}")
        return int(body["weight_version"])

    # ---- the end ----

    def pids(self):
        """The daemons' process ids (for tests)."""
        with self._lock:
            return [m.info["pid"] if m.info else None for m in self.members]

    def shutdown(self, timeout=60.0):
        """Stops watching; SIGTERM to every daemon at once (each drains: running requests finish
        and their results are delivered), the actors killed, the placement group removed, the
        router stopped. Returns the daemons' exit statuses."""
        self._stop.set()
        if self._watcher is not None and self._watcher is not threading.current_thread():
            self._watcher.join(30)
        for p in list(self._pools):
            try:
                p.close()
            except Exception:
                pass
        rcs = []
        live = [m for m in self.members if m.actor is not None and m.info is not None]
        for m in self.members:
            if m.actor is not None and m.info is None:
                try:
                    ray.kill(m.actor, no_restart=True)
                except Exception:
                    pass
                m.actor = None
        refs = [m.actor.stop.remote(timeout) for m in live]
        for m, r in zip(live, refs):
            try:
                rcs.append(ray.get(r, timeout=timeout + 30))
            except Exception as e:
                rcs.append(e)
            self._event("stopped", m.index, returncode=rcs[-1] if not isinstance(rcs[-1], Exception) else str(rcs[-1]))
        for m in live:
            try:
                ray.kill(m.actor, no_restart=True)
            except Exception:
                pass
            m.actor = None
        if getattr(self, "pg", None) is not None:
            try:
                remove_placement_group(self.pg)
            except Exception:
                pass
        if self._router is not None:
            self._router.terminate()
            try:
                self._router.wait(10)
            except subprocess.TimeoutExpired:
                self._router.kill()
            self._router = None
        return rcs

    def placement_state(self):
        """The placement group's state in Ray ("CREATED", "REMOVED", ...)."""
        return placement_group_table(self.pg).get("state")

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.shutdown()
