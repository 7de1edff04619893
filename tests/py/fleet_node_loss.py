"""A node of the fleet's Ray cluster dies (make test-ray-node-loss; not in tests/run.sh: two
raylets on this machine take half a minute). ray.cluster_utils.Cluster starts a head and a
worker node on this machine, each with one "rd_slot"; a fleet of 2 daemons (SPREAD) takes one
bundle on each, is pushed new weights as version 7, then the worker node is removed (its
raylet and every process on it killed). The fleet records actor_lost and a restart with
moved=True on the head node (Ray re-places the bundle there: the head has a spare slot), the
new daemon serves version 7 with outputs equal to its peer's, and shutdown leaves no daemon
and no placement group."""
import os
import subprocess
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import ROOT, TMP, case, main  # noqa: E402

sys.path.insert(0, os.path.join(ROOT, "tools", "python"))


@case
def a_lost_node_s_daemon_comes_back_on_another_node():
    try:
        import ray
        from ray.cluster_utils import Cluster
        from rolloutd.ray import RolloutFleet
    except ImportError:
        print("SKIP a_lost_node_s_daemon_comes_back_on_another_node (ray is not installed)")
        return
    os.environ["RAY_kill_child_processes_on_worker_exit"] = "0"     # the fleet's own clean-up is tested
    base = os.path.join(TMP, f"nl-{os.getpid()}")
    for name, seed in (("old", 801), ("new", 802)):
        subprocess.run([sys.executable, os.path.join(ROOT, "tools", "gen_tiny_model.py"), "--out",
                        f"{base}-{name}.gguf", "--dtype", "f32", "--seed", str(seed), "--ctx", "512", "--layers", "2",
                        "--dim", "64", "--ffn", "128", "--hf-out", f"{base}-{name}.npz"], check=True,
                       capture_output=True)
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 2, "resources": {"rd_slot": 2}})
    worker = cluster.add_node(num_cpus=1, resources={"rd_slot": 1})
    ray.init(address=cluster.address, logging_level="ERROR", log_to_driver=False)
    f = None
    try:
        cluster.wait_for_nodes()
        f = RolloutFleet(model=f"{base}-old.gguf", num_daemons=2, resources_per_daemon={"CPU": 0.5, "rd_slot": 1},
                         strategy="SPREAD", config={"threads": 1, "kv_cache_bytes": 16 << 20}, watch_interval_s=0.2)
        nodes = [m.info["node_id"] for m in f.members]
        assert len(set(nodes)) == 2 and worker.node_id in nodes, (nodes, worker.node_id)
        lost = nodes.index(worker.node_id)
        z = np.load(f"{base}-new.npz")
        pool = f.pool()
        pool.push_tensors([(k, np.ascontiguousarray(z[k], dtype=np.float32)) for k in z.files], version=7)
        old_pid = f.pids()[lost]
        cluster.remove_node(worker)
        deadline = time.time() + 120
        while f.event_counts().get("restarted", 0) < 1:
            assert time.time() < deadline, f.events()
            time.sleep(0.2)
        r = [e for e in f.events() if e["kind"] == "restarted"][0]
        assert r["index"] == lost and r["moved"] is True and r["version"] == 7, f.events()
        assert any(e["kind"] == "actor_lost" and e["index"] == lost for e in f.events()), f.events()
        assert f.members[lost].info["node_id"] != worker.node_id
        assert not os.path.exists(f"/proc/{old_pid}") or open(f"/proc/{old_pid}/stat").read().split()[2] == "Z"
        print(f"  node lost: daemon {lost} back on the head node at {r['url']} on version 7 in {r['seconds']} s")
        outs = []
        for u in f.nng_urls():
            from rolloutd import Client
            with Client(u, auth_token=f.secret) as c:
                outs.append([(list(map(int, s.token_ids)), s.logprobs.view(np.uint32).tolist(), s.version_finish)
                             for s in c.generate([[1, 40, 41, 42], [1, 7, 9]], n=2, max_tokens=10, temperature=1.0,
                                                 seed=[5, 6], ignore_eos=True)])
        assert outs[0] == outs[1] and all(v == 7 for _, _, v in outs[0]), outs
        pool.close()
        pids = f.pids()
        assert f.shutdown() == [0, 0]
        assert f.placement_state() == "REMOVED"
        for pid in pids:
            assert not os.path.exists(f"/proc/{pid}") or open(f"/proc/{pid}/stat").read().split()[2] == "Z", pid
        f = None
    finally:
        if f is not None:
            f.shutdown()
        ray.shutdown()
        cluster.shutdown()
        for name in ("old", "new"):
            for ext in (".gguf", ".npz"):
                if os.path.exists(f"{base}-{name}{ext}"):
                    os.unlink(f"{base}-{name}{ext}")


if __name__ == "__main__":
    main()
