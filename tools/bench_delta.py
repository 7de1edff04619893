"""make bench-delta: full vs delta weight pushes of the default model in bf16
(issue 24, PROTOCOL.md §10.14), the way RL steps change the weights.

    tools/bench_delta.py [--daemons 4] [--lrs 1e-6,1e-5]
    tools/bench_delta.py --netns [--rate 1gbit]     (root: bench_chain.py's namespaces, 4 daemons)
    [--rounds 3]: measured pushes per row, the median reported (after two whole pushes to warm every daemon)

fp32 master weights (the default model exported as HF f32) take Adam steps
on random gradients (betas 0.9/0.999, eps 1e-8; the measured step is the
third, so m and v have history) at each learning rate; each version is the
master cast to bf16. For every lr, one run compares, on the same daemons,
pushing version k+1 after version k:

  full   the whole bf16 model;
  delta  Pool's default (deltas against the last push's bytes);

directly to 1 daemon and chained to N (default 4), on loopback. Columns: the
changed fraction (NumPy's count of bf16 elements whose bits changed), bytes
on the wire (the kernel's tcpi_bytes_sent of this process's sockets to the
daemons: tools/egress.py), learner CPU seconds (time.process_time over the
call: preparing / diffing / encoding and sending), the call's wall time (until
every daemon serves) and COMMIT to serving on the first daemon (its /status
swap wait; the chain's build happens at PREPARE, before the COMMIT). Writes
build/bench-delta.json (--netns: build/bench-delta-netns.json, the learner and
every daemon in its own network namespace behind links shaped with tc)."""
import argparse
import json
import os
import shutil
import sys
import tempfile
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BUILD = os.path.join(ROOT, "build")
MODEL = os.path.join(ROOT, "models/SmolLM2-135M-Instruct.Q4_1.gguf")
sys.path.insert(0, os.path.join(ROOT, "tools", "python"))
sys.path.insert(0, os.path.join(ROOT, "tools"))
sys.path.insert(0, os.path.join(ROOT, "tests", "py"))
from rdtest import Daemon  # noqa: E402


def master(workdir):
    """The default model's weights as fp32 {name: array} (rollout-export --dtype f32)."""
    import subprocess
    out = os.path.join(workdir, "hf")
    subprocess.run([os.path.join(BUILD, "rollout-export"), "--model", MODEL, "--out", out, "--dtype", "f32"],
                   check=True, capture_output=True)
    path = os.path.join(out, "model.safetensors")
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        hdr = json.loads(f.read(n))
    raw = np.memmap(path, dtype=np.uint8, mode="r", offset=8 + n)
    w = {}
    for k, v in hdr.items():
        if k != "__metadata__":
            a, b = v["data_offsets"]
            w[k] = np.array(raw[a:b].view(np.float32).reshape(v["shape"]))
    return w


class Adam:
    def __init__(self, w, lr, seed):
        self.w = {k: x.copy() for k, x in w.items()}
        self.m = {k: np.zeros_like(x) for k, x in w.items()}
        self.v = {k: np.zeros_like(x) for k, x in w.items()}
        self.lr, self.t = np.float32(lr), 0
        self.rng = np.random.default_rng(seed)

    def step(self):
        self.t += 1
        c1, c2 = np.float32(1 - 0.9 ** self.t), np.float32(1 - 0.999 ** self.t)
        for k, x in self.w.items():
            g = self.rng.standard_normal(x.shape, dtype=np.float32) * np.float32(1e-3)
            m, v = self.m[k], self.v[k]
            m *= np.float32(0.9)
            m += np.float32(0.1) * g
            v *= np.float32(0.999)
            v += np.float32(0.001) * g * g
            x -= self.lr * (m / c1) / (np.sqrt(v / c2) + np.float32(1e-8))

    def bf16(self):
        from rolloutd import bf16_bits
        return {k: bf16_bits(x) for k, x in self.w.items()}


def one_push(urls, ports, pool, w, version, fanout, delta, secret=None):
    from egress import Egress
    from rolloutd import Client
    cpu0, t0 = time.process_time(), time.perf_counter()
    with Egress(ports) as e:
        res = pool.push_weights(w, version, fanout=fanout, delta=delta)
    wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    assert all(r.version == version for r in res), res
    with Client(urls[0], name="bench-probe", auth_token=secret) as c:
        lu = c.status()["last_weight_update"]
    return {"wall_s": wall, "learner_cpu_s": cpu, "wire_bytes": e.bytes, "kind": pool.last_push["kind"],
            "commit_to_serving_ms": lu["swap_wait_ms"], "build_s": lu["build_s"],
            "daemon_changed_fraction": lu.get("changed_fraction"), "encode_s":
            (pool.last_push["delta"] or {}).get("encode_seconds")}


def rows_for(urls, ports, m0, lrs, secret=None, rounds=3):
    """Per lr, fanout and kind, `rounds` measured pushes (each after the base pushed whole): the
    row holds the median round (by wall time) and every round's wall time. First every daemon
    takes two whole bf16 pushes, so no row pays a daemon's first bf16 build (fresh memory where
    the loaded Q4_1 weights were smaller) and full and delta compare in the same state."""
    from rolloutd import Pool
    rows, version = [], 1
    warm = Adam(m0, 1e-6, seed=3).bf16()
    with Pool(urls, auth_token=secret) as pool:
        for _ in range(2):
            pool.push_weights(warm, version, fanout="direct", delta=False)
            version += 1
    for lr in lrs:
        opt = Adam(m0, lr, seed=7)
        opt.step()
        opt.step()
        base = opt.bf16()
        opt.step()
        new = opt.bf16()
        frac = sum(int(np.count_nonzero(new[k] != base[k])) for k in new) / sum(x.size for x in new.values())
        for n, fanout in ((1, "direct"), (len(urls), "chain")):
            for delta in (False, None):
                got = []
                for _ in range(rounds):
                    with Pool(urls[:n], auth_token=secret) as pool:
                        pool.push_weights(base, version, fanout=fanout, delta=False)     # the base, whole
                        got.append(one_push(urls[:n], ports[:n], pool, new, version + 1, fanout, delta, secret))
                    version += 2
                got.sort(key=lambda r: r["wall_s"])
                r = dict(got[len(got) // 2])
                r["wall_s_rounds"] = [g["wall_s"] for g in got]
                r.update({"lr": lr, "changed_fraction": frac, "daemons": n, "fanout": fanout})
                rows.append(r)
                print(f"  lr {lr:g} changed {100 * frac:.2f}%  {n} daemon(s) {fanout:>6} {r['kind']:>5}: "
                      f"wire {r['wire_bytes'] / 1e6:8.2f} MB, learner CPU {r['learner_cpu_s']:6.2f} s, "
                      f"wall {r['wall_s']:6.2f} s (rounds {', '.join(f'{w:.2f}' for w in r['wall_s_rounds'])}), "
                      f"COMMIT->serving {r['commit_to_serving_ms']:7.2f} ms", flush=True)
    print(f"\n{'lr':>6} {'changed':>8} {'daemons':>7} {'fanout':>6} {'kind':>5} {'wire MB':>8} {'x full':>7} "
          f"{'CPU s':>6} {'wall s':>7} {'x full':>7} {'C->S ms':>8}")
    for r in rows:
        full = next(x for x in rows if x["lr"] == r["lr"] and x["daemons"] == r["daemons"] and x["kind"] == "full")
        r["wire_x_full"] = r["wire_bytes"] / full["wire_bytes"]
        r["wall_x_full"] = r["wall_s"] / full["wall_s"]
        print(f"{r['lr']:>6g} {100 * r['changed_fraction']:>7.2f}% {r['daemons']:>7} {r['fanout']:>6} "
              f"{r['kind']:>5} {r['wire_bytes'] / 1e6:>8.2f} {r['wire_x_full']:>7.3f} {r['learner_cpu_s']:>6.2f} "
              f"{r['wall_s']:>7.2f} {r['wall_x_full']:>7.2f} {r['commit_to_serving_ms']:>8.2f}")
    return rows


def netns(args):
    import subprocess
    import bench_chain as bc
    n = 4
    work = tempfile.mkdtemp(prefix="bench-delta-")
    secret = os.path.join(work, "secret")
    with open(secret, "w") as f:
        f.write(bc.SECRET + "\n")
    os.chmod(secret, 0o600)
    procs = []
    try:
        ips = bc.netns_setup(n, args.rate)
        urls = [f"tcp://{ip}:7070" for ip in ips]
        allow = ",".join(f"{ip}:*" for ip in ips)
        for k, u in enumerate(urls):
            procs.append(bc.start_daemon(["ip", "netns", "exec", f"rdc-{k + 1}"], u, "127.0.0.1:7071",
                                         ["--auth-token-file", secret, "--relay-allow", allow]))
        r = subprocess.run(["ip", "netns", "exec", "rdc-l", sys.executable, os.path.abspath(__file__), "--learner",
                            ",".join(urls), "--lrs", args.lrs, "--rate", args.rate, "--rounds", str(args.rounds)], cwd=ROOT, text=True)
        if r.returncode:
            raise SystemExit(f"the learner failed ({r.returncode})")
    finally:
        for p in procs:
            p.kill()
            p.wait()
        bc.netns_teardown(n)
        shutil.rmtree(work, ignore_errors=True)


def learner(args):
    import bench_chain as bc
    urls = args.learner.split(",")
    for u in urls:
        bc.wait_up(u, bc.SECRET)
    work = tempfile.mkdtemp(prefix="bench-delta-")
    try:
        m0 = master(work)
        size = sum(x.size * 2 for x in m0.values())
        ports = [int(u.rsplit(":", 1)[1]) for u in urls]
        print(f"default model, {size / 1e6:.0f} MB in bf16; network namespaces: the learner and {len(urls)} daemons, "
              f"every veth shaped to {args.rate} both ways, authenticated lanes", flush=True)
        rows = rows_for(urls, ports, m0, [float(x) for x in args.lrs.split(",")], bc.SECRET, args.rounds)
        with open(os.path.join(BUILD, "bench-delta-netns.json"), "w") as f:
            json.dump({"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "mode": "netns", "rate": args.rate,
                       "model_bf16_bytes": size, "rows": rows}, f, indent=1)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--daemons", type=int, default=4)
    ap.add_argument("--lrs", default="1e-6,1e-5")
    ap.add_argument("--netns", action="store_true", help="rate-limited network namespaces (root)")
    ap.add_argument("--rate", default="1gbit")
    ap.add_argument("--rounds", type=int, default=3, help="measured pushes per row (the median is reported)")
    ap.add_argument("--learner", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.learner:
        return learner(args)
    if args.netns:
        return netns(args)
    work = tempfile.mkdtemp(prefix="bench-delta-")
    ds = []
    try:
        m0 = master(work)
        size = sum(x.size * 2 for x in m0.values())
        ds = [Daemon("--threads", "1", model=MODEL, wait=False) for _ in range(args.daemons)]
        for d in ds:
            d.wait_healthy()
        urls, ports = [d.url for d in ds], [d.port for d in ds]
        print(f"default model, {size / 1e6:.0f} MB in bf16; loopback, {args.daemons} daemons (threads 1), "
              f"{os.cpu_count()} cores shared by every daemon and this learner", flush=True)
        rows = rows_for(urls, ports, m0, [float(x) for x in args.lrs.split(",")], rounds=args.rounds)
        with open(os.path.join(BUILD, "bench-delta.json"), "w") as f:
            json.dump({"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "mode": "loopback",
                       "model_bf16_bytes": size, "rows": rows}, f, indent=1)
    finally:
        for d in ds:
            d.kill()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
