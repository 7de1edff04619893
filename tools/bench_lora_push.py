#!/usr/bin/env python3
"""An adapter push's time against a full bf16 push of the model (the second half of make bench-lora),
side by side in one run on one daemon.

The default model's weights exported as bf16 HF tensors (rollout-export), and the four rank-32
all-linear bf16 adapters make bench-lora writes (build/bench-lora/a1..a4), pushed alternately ROUNDS
times each with the Python client over the data lane: a full bf16 push of the model, an adapter
pushed whole, and the same adapter pushed as deltas after a simulated optimizer step (3% of its
elements moved by one bf16 unit: Pool.push_adapter's delta path). Each time is UPDATE_BEGIN to
COMMIT_OK as the client sees it (PushResult.seconds). A shared machine: compare the rows of one run.

Prints a table and writes build/bench-lora-push.json."""
import json
import os
import statistics
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BUILD = os.path.join(ROOT, "build")
sys.path.insert(0, os.path.join(ROOT, "tests", "py"))
sys.path.insert(0, os.path.join(ROOT, "tools", "python"))
sys.path.insert(0, os.path.join(ROOT, "tools"))
import gen_lora  # noqa: E402
from bench_commit import export  # noqa: E402
from rdtest import Daemon  # noqa: E402
from rolloutd import Client, Pool  # noqa: E402
from rolloutd.lora import read_peft  # noqa: E402

ROUNDS = int(os.environ.get("ROUNDS", "5"))
ADAPTERS = os.path.join(BUILD, "bench-lora")


def main():
    tmp = tempfile.mkdtemp(prefix="rd-bench-lora-push-")
    weights = export("bf16", tmp)
    config, adapter = read_peft(os.path.join(ADAPTERS, "a1"))
    alpha = config["lora_alpha"]
    d = Daemon()
    rows = {"full_bf16": [], "adapter_whole": [], "adapter_delta": []}
    wire = {}
    try:
        with Client(d.url) as c, Pool([d.url]) as pool:
            prep = c.prepare(weights)
            version = c.info.weight_version
            av = 0
            cur = adapter
            for _ in range(ROUNDS):
                version += 1
                rows["full_bf16"].append(c.push_weights(prep, version).seconds)
                wire["full_bf16"] = prep.total_bytes
                av += 1
                rows["adapter_whole"].append(pool.push_adapter("bench", cur, av, alpha=alpha, delta=False)[0].seconds)
                wire["adapter_whole"] = pool.last_push["wire_bytes"]
                cur = gen_lora.nudged(cur, 0.03, av)
                av += 1
                rows["adapter_delta"].append(pool.push_adapter("bench", cur, av, alpha=alpha)[0].seconds)
                assert pool.last_push["kind"] == "delta", pool.last_push
                wire["adapter_delta"] = pool.last_push["wire_bytes"]
    finally:
        d.stop()
    full = statistics.median(rows["full_bf16"])
    res = {"rounds": ROUNDS, "loadavg_1m": os.getloadavg()[0], "rows": []}
    print(f"{'push':<16} {'wire MB':>9} {'median s':>9} {'vs full bf16':>13}")
    for k, v in rows.items():
        m = statistics.median(v)
        res["rows"].append({"push": k, "wire_bytes": wire[k], "seconds": v, "median_s": m, "ratio_to_full": m / full})
        print(f"{k:<16} {wire[k] / 1e6:9.2f} {m:9.3f} {m / full:13.3f}")
    with open(os.path.join(BUILD, "bench-lora-push.json"), "w") as f:
        json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
