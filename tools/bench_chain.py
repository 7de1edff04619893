#!/usr/bin/env python3
"""Chained vs direct weight broadcast (PROTOCOL.md §10.11), side by side in one run.

    tools/bench_chain.py                 loopback: 1 daemon, then 2, 4 and 8, chain and direct
    tools/bench_chain.py --netns [--rate 1gbit]
                                         root only: the learner and 4 daemons each in a network
                                         namespace behind a veth rate-limited with tc (tbf) both
                                         ways, as a learner NIC and node NICs would be

The update is the default model's weights, perturbed, as bf16 (269 MB). For each row: the wall
time of Pool.push_weights (UPDATE_BEGIN to the last COMMIT_OK, the two-phase commit included),
the transfer time (first chunk to every daemon holding every byte; the rest is each daemon's
conversion into backend weights and the swap), the learner's egress counted by the kernel
(tools/egress.py), and for chains the transfer overhead per hop against the single-daemon push. Each row is the better of two pushes. Prints a table and writes
build/bench-chain.json (or build/bench-chain-netns.json)."""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BUILD = os.path.join(ROOT, "build")
MODEL = os.path.join(ROOT, "models/SmolLM2-135M-Instruct.Q4_1.gguf")
sys.path.insert(0, os.path.join(ROOT, "tools", "python"))
sys.path.insert(0, os.path.join(ROOT, "tools"))
sys.path.insert(0, os.path.join(ROOT, "tests", "py"))
from rdtest import Daemon  # noqa: E402  (the tests' daemon lifecycle, for the loopback daemons)
SECRET = "bench-chain-secret-0123456789abcdef"


def update(workdir):
    """The perturbed bf16 update, as {name: uint16 array}."""
    import numpy as np
    from rolloutd import bf16_bits
    out = os.path.join(workdir, "hf")
    subprocess.run([os.path.join(BUILD, "rollout-export"), "--model", MODEL, "--out", out, "--dtype", "f32"],
                   check=True, capture_output=True)
    path = os.path.join(out, "model.safetensors")
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        hdr = json.loads(f.read(n))
    raw = np.memmap(path, dtype=np.uint8, mode="r", offset=8 + n)
    rng = np.random.default_rng(1)
    w = {}
    for k, v in hdr.items():
        if k != "__metadata__":
            a, b = v["data_offsets"]
            x = raw[a:b].view(np.float32).reshape(v["shape"])
            w[k] = bf16_bits(x * (1 + 0.01 * rng.standard_normal(x.shape, dtype=np.float32)))
    return w


def measure(urls, ports, w, fanout, version, chunk_mb, secret=None):
    """The better of two pushes: (wall s, egress bytes, results)."""
    from egress import Egress
    from rolloutd import Pool
    best = None
    with Pool(urls, auth_token=secret) as pool:
        prep = pool.prepare(w, chunk_mb << 20)
        for k in range(2):
            with Egress(ports) as e:
                t = time.perf_counter()
                res = pool.push_weights(prep, version=version + k, fanout=fanout)
                wall = time.perf_counter() - t
            assert all(r.version == version + k for r in res), res
            if best is None or wall < best[0]:
                best = (wall, e.bytes, res, max(r.transfer_seconds for r in res))
    return best


def rows_for(urls, ports, w, counts, chunk_mb, secret=None):
    size = sum(a.nbytes for a in w.values())
    version, rows = 1, []
    single = None
    for n in counts:
        for fanout in (("direct",) if n == 1 else ("direct", "chain")):
            wall, egress, res, xfer = measure(urls[:n], ports[:n], w, fanout, version, chunk_mb, secret)
            version += 2
            if n == 1:
                single, single_xfer = wall, xfer
            row = {"daemons": n, "fanout": fanout, "wall_s": wall, "transfer_s": xfer, "egress_bytes": egress,
                   "egress_x_model": egress / size, "wall_x_single": wall / single,
                   "transfer_x_single": xfer / single_xfer, "hops": [r.hop for r in res]}
            if fanout == "chain":
                row["per_hop_s"] = (xfer - single_xfer) / (n - 1)
            rows.append(row)
            print(f"  {n} daemons {fanout:>6}: {wall:6.2f} s (transfer {xfer:.2f} s), egress {egress / 1e6:7.1f} MB "
                  f"({egress / size:.3f} x the model), {wall / single:.2f} x the single push", flush=True)
    return size, rows


def print_table(title, size, rows):
    print(f"\n{title} (update {size / 1e6:.0f} MB bf16)")
    print(f"{'daemons':>7} {'fanout':>6} {'wall s':>7} {'x single':>8} {'transfer s':>10} {'x single':>8} "
          f"{'egress MB':>9} {'x model':>7} {'s/hop':>6}")
    for r in rows:
        hop = f"{r['per_hop_s']:6.3f}" if "per_hop_s" in r else "     -"
        print(f"{r['daemons']:>7} {r['fanout']:>6} {r['wall_s']:>7.2f} {r['wall_x_single']:>8.2f} "
              f"{r['transfer_s']:>10.2f} {r['transfer_x_single']:>8.2f} {r['egress_bytes'] / 1e6:>9.1f} "
              f"{r['egress_x_model']:>7.3f} {hop}")


def start_daemon(prefix, listen, http, extra):
    """A daemon inside a network namespace (prefix: ip netns exec ...) on fixed addresses, which
    rdtest.Daemon (free loopback ports) does not do."""
    log = open("/tmp/bench-chain-" + listen.split("://")[1].replace(":", "-") + ".log", "w")
    p = subprocess.Popen(prefix + [os.path.join(BUILD, "rolloutd"), "--config", os.path.join(ROOT, "configs/test.json"),
                                   "--model", MODEL, "--listen", listen, "--status-listen", http, "--threads", "1",
                                   *extra], stdout=log, stderr=subprocess.STDOUT, cwd=ROOT)
    return p


def wait_up(url, secret=None):
    from rolloutd import Client
    for _ in range(600):
        try:
            with Client(url, auth_token=secret, timeout_ms=2000):
                return
        except Exception:
            time.sleep(0.1)
    raise SystemExit(f"rolloutd on {url} did not start")


def loopback(args):
    work = tempfile.mkdtemp(prefix="bench-chain-")
    ds = []
    try:
        w = update(work)
        # All start at once, then each is waited for.
        ds = [Daemon("--threads", "1", model=MODEL, wait=False) for _ in range(max(args.daemons))]
        for d in ds:
            d.wait_healthy()
        urls, ports = [d.url for d in ds], [d.port for d in ds]
        print("loopback (one machine: the cores and the loopback are shared by every daemon)")
        size, rows = rows_for(urls, ports, w, [1] + args.daemons, args.chunk_mb)
        print_table("loopback", size, rows)
        with open(os.path.join(BUILD, "bench-chain.json"), "w") as f:
            json.dump({"date": time.strftime("%Y-%m-%d"), "mode": "loopback", "update_bytes": size,
                       "chunk_mb": args.chunk_mb, "rows": rows}, f, indent=1)
    finally:
        for d in ds:
            d.kill()
        shutil.rmtree(work, ignore_errors=True)


# ---- network namespaces behind rate-limited veths ----

def sh(*cmd, check=True):
    return subprocess.run(list(cmd), check=check, capture_output=True, text=True)


def netns_setup(n, rate):
    """rdc-l (the learner) and rdc-1..n on a bridge; every veth shaped to rate both ways."""
    netns_teardown(n)
    sh("ip", "link", "add", "rdc-br", "type", "bridge")
    sh("ip", "link", "set", "rdc-br", "up")
    names = ["l"] + [str(i) for i in range(1, n + 1)]
    for k, name in enumerate(names):
        ns, host_end, ns_end = f"rdc-{name}", f"rdc-h{name}", f"rdc-n{name}"
        ip = f"10.77.0.{10 + k}"
        sh("ip", "netns", "add", ns)
        sh("ip", "link", "add", host_end, "type", "veth", "peer", "name", ns_end)
        sh("ip", "link", "set", ns_end, "netns", ns)
        sh("ip", "link", "set", host_end, "master", "rdc-br", "up")
        sh("ip", "netns", "exec", ns, "ip", "addr", "add", f"{ip}/24", "dev", ns_end)
        sh("ip", "netns", "exec", ns, "ip", "link", "set", ns_end, "up")
        sh("ip", "netns", "exec", ns, "ip", "link", "set", "lo", "up")
        # tbf on both ends: what enters the namespace and what leaves it, each at rate
        sh("tc", "qdisc", "add", "dev", host_end, "root", "tbf", "rate", rate, "burst", "256kb", "latency", "100ms")
        sh("ip", "netns", "exec", ns, "tc", "qdisc", "add", "dev", ns_end, "root", "tbf", "rate", rate, "burst",
           "256kb", "latency", "100ms")
    return [f"10.77.0.{10 + k}" for k in range(1, n + 1)]


def netns_teardown(n):
    for name in ["l"] + [str(i) for i in range(1, n + 1)]:
        sh("ip", "netns", "del", f"rdc-{name}", check=False)
        sh("ip", "link", "del", f"rdc-h{name}", check=False)
    sh("ip", "link", "del", "rdc-br", check=False)


def netns(args):
    n = 4
    work = tempfile.mkdtemp(prefix="bench-chain-")
    secret = os.path.join(work, "secret")
    with open(secret, "w") as f:
        f.write(SECRET + "\n")
    os.chmod(secret, 0o600)
    procs = []
    try:
        ips = netns_setup(n, args.rate)
        urls = [f"tcp://{ip}:7070" for ip in ips]
        # off loopback a daemon relays only to relay_allow (PROTOCOL.md section 10.11): the fleet's addresses
        allow = ",".join(f"{ip}:*" for ip in ips)
        for k, u in enumerate(urls):
            procs.append(start_daemon(["ip", "netns", "exec", f"rdc-{k + 1}"], u, "127.0.0.1:7071",
                                      ["--auth-token-file", secret, "--relay-allow", allow]))
        # the learner runs in its own namespace: its one veth is the learner's NIC
        r = subprocess.run(["ip", "netns", "exec", "rdc-l", sys.executable, os.path.abspath(__file__), "--learner",
                            ",".join(urls), "--chunk-mb", str(args.chunk_mb), "--rate", args.rate],
                           cwd=ROOT, text=True)
        if r.returncode:
            raise SystemExit(f"the learner failed ({r.returncode})")
    finally:
        for p in procs:
            p.kill()
            p.wait()
        netns_teardown(n)
        shutil.rmtree(work, ignore_errors=True)


def learner(args):
    urls = args.learner.split(",")
    for u in urls:
        wait_up(u, SECRET)
    work = tempfile.mkdtemp(prefix="bench-chain-")
    try:
        w = update(work)
        ports = [int(u.rsplit(":", 1)[1]) for u in urls]
        print(f"network namespaces: learner and {len(urls)} daemons, every veth shaped to {args.rate} both ways, "
              f"authenticated lanes, {args.chunk_mb} MiB chunks")
        size, rows = rows_for(urls, ports, w, [1, len(urls)], args.chunk_mb, SECRET)
        print_table(f"rate-limited links ({args.rate})", size, rows)
        with open(os.path.join(BUILD, "bench-chain-netns.json"), "w") as f:
            json.dump({"date": time.strftime("%Y-%m-%d"), "mode": "netns", "rate": args.rate, "update_bytes": size,
                       "chunk_mb": args.chunk_mb, "rows": rows}, f, indent=1)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--daemons", default="2,4,8", help="loopback: daemon counts (default 2,4,8)")
    ap.add_argument("--netns", action="store_true", help="rate-limited network namespaces (root)")
    ap.add_argument("--rate", default="1gbit", help="netns: tc rate of every link (default 1gbit)")
    ap.add_argument("--chunk-mb", type=int, default=4, help="chunk size in MiB (default 4)")
    ap.add_argument("--learner", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.learner:
        return learner(args)
    args.daemons = [int(x) for x in args.daemons.split(",")]
    return netns(args) if args.netns else loopback(args)


if __name__ == "__main__":
    sys.exit(main())
