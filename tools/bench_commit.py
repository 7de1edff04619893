#!/usr/bin/env python3
"""COMMIT-to-serving time of a weight push (make bench-commit), side by side in one run.

The default model's own weights, exported by rollout-export as bf16 and as f32 HF tensors, pushed
to one Q4_1-started daemon with the Python client, alternately, ROUNDS times each: idle, then while
`rolloutctl bench` keeps the engine decoding. The number is the daemon's own wait_us (COMMIT's
arrival to the swap: the repack into the GEMM's layout, then the wait for a step boundary), with
/status memory.weights_bytes after each kind of push. The load average is printed next to it
(a shared machine: compare the rows of one run, not runs).

Prints a table and writes build/bench-commit.json."""
import json
import os
import shutil
import statistics
import struct
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BUILD = os.path.join(ROOT, "build")
sys.path.insert(0, os.path.join(ROOT, "tests", "py"))
sys.path.insert(0, os.path.join(ROOT, "tools", "python"))
import numpy as np  # noqa: E402
from rdtest import Daemon  # noqa: E402
from rolloutd import Client  # noqa: E402

MODEL = os.path.join(ROOT, "models/SmolLM2-135M-Instruct.Q4_1.gguf")
ROUNDS = int(os.environ.get("ROUNDS", "5"))


def export(dtype, tmp):
    out = os.path.join(tmp, dtype)
    subprocess.run([os.path.join(BUILD, "rollout-export"), "--model", MODEL, "--out", out, "--dtype", dtype],
                   check=True, capture_output=True)
    path = os.path.join(out, "model.safetensors")
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        hdr = json.loads(f.read(n))
    raw = np.memmap(path, dtype=np.uint8, mode="r", offset=8 + n)
    view = np.uint16 if dtype == "bf16" else np.float32
    return {k: raw[v["data_offsets"][0]:v["data_offsets"][1]].view(view).reshape(v["shape"])
            for k, v in hdr.items() if k != "__metadata__"}


def main():
    tmp = tempfile.mkdtemp(prefix="rd-bench-commit-")
    w = {"bf16": export("bf16", tmp), "f32": export("f32", tmp)}
    d = Daemon()
    res = {"rounds": ROUNDS, "rows": []}
    try:
        with Client(d.url) as c:
            prep = {k: c.prepare(v) for k, v in w.items()}     # checksummed once
            version = c.info.weight_version
            res["weights_bytes_q4_1"] = c.status()["memory"]["weights_bytes"]
            for load in (False, True):
                bench = None
                if load:
                    bench = subprocess.Popen([os.path.join(BUILD, "rolloutctl"), "--connect", d.url, "bench",
                                              "--clients", "4", "--requests", "100000", "--n", "2", "--max-tokens",
                                              "64", "--json"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                    time.sleep(3)
                waits = {"bf16": [], "f32": []}
                held = {}
                for _ in range(ROUNDS):
                    for k in ("bf16", "f32"):
                        version += 1
                        r = c.push_weights(prep[k], version)
                        waits[k].append(r.wait_us / 1e3)
                        held[k] = c.status()["memory"]["weights_bytes"]
                if bench:
                    bench.kill()
                    bench.wait()
                for k in ("bf16", "f32"):
                    res["rows"].append({"dtype": k, "under_load": load, "bytes": prep[k].total_bytes,
                                        "commit_to_serving_ms": waits[k], "median_ms": statistics.median(waits[k]),
                                        "weights_bytes": held[k], "loadavg_1m": os.getloadavg()[0]})
    finally:
        d.proc.terminate()
        d.proc.wait(timeout=60)
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"Q4_1 as loaded: weights_bytes {res['weights_bytes_q4_1']}")
    print(f"{'push':>5} {'decoding':>8} {'MB':>6} {'COMMIT->serving median ms':>26} {'min':>7} {'max':>7} "
          f"{'weights_bytes':>14} {'load':>5}")
    for r in res["rows"]:
        print(f"{r['dtype']:>5} {str(r['under_load']):>8} {r['bytes'] / 1e6:6.0f} {r['median_ms']:26.1f} "
              f"{min(r['commit_to_serving_ms']):7.1f} {max(r['commit_to_serving_ms']):7.1f} "
              f"{r['weights_bytes']:14d} {r['loadavg_1m']:5.2f}")
    with open(os.path.join(BUILD, "bench-commit.json"), "w") as f:
        json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
