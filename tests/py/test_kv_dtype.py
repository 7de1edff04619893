"""The daemon's kv_dtype key (issue 12), on real daemons on loopback:

- a value that is not a KV type, or one the CUDA backend does not store, is a
  config error: rolloutd exits 2 with a message naming the key and the values
  it takes, before loading anything;
- kv_dtype f32 serves the same greedy bits as the default ("auto" = f32 on the
  CPU); bf16 and f16 daemons serve, report kv_cache.dtype in /status, and the
  same byte budget holds twice the blocks; their greedy log-probs are close to
  f32's where the tokens agree (the bound test_kv_dtype measures)."""
import os
import subprocess
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import BUILD, MODEL, ROOT, case, main  # noqa: E402
from rdtest import PROMPT, Daemon, stop_cleanly  # noqa: E402

sys.path.insert(0, os.path.join(ROOT, "tools", "python"))
from rolloutd import Client  # noqa: E402

PROMPTS = [PROMPT, [1, 504, 3458, 282, 4649, 314, 216, 33, 30]]
_daemons = []


def greedy(c):
    return c.generate(PROMPTS, max_tokens=32, temperature=0.0, ignore_eos=True)


@case
def bad_values_are_config_errors():
    for extra, needle in ((["--kv-dtype", "fp8"], '"fp8"'), (["--kv-dtype", "F32"], '"F32"'),
                          (["--backend", "cuda", "--kv-dtype", "f32"], "bf16"),
                          (["--backend", "cuda", "--kv-dtype", "f16"], "bf16")):
        p = subprocess.run([os.path.join(BUILD, "rolloutd"), "--config", os.path.join(ROOT, "configs/test.json"),
                            "--model", MODEL, *extra], capture_output=True, text=True, timeout=60)
        assert p.returncode == 2 and "kv_dtype" in p.stderr and needle in p.stderr, (extra, p.returncode, p.stderr)
        assert "loading" not in p.stdout + p.stderr, p.stdout


@case
def each_dtype_serves_and_reports_itself():
    ds = {t: Daemon("--kv-dtype", t) for t in ("auto", "f32", "bf16", "f16")}
    _daemons.extend(ds.values())
    out, kv = {}, {}
    for t, d in ds.items():
        with Client(d.url) as c:
            out[t] = greedy(c)
            kv[t] = c.status()["kv_cache"]
    assert kv["auto"]["dtype"] == kv["f32"]["dtype"] == "f32" and kv["bf16"]["dtype"] == "bf16" and \
        kv["f16"]["dtype"] == "f16", kv
    for t in ("bf16", "f16"):
        assert kv[t]["blocks_total"] >= 2 * kv["f32"]["blocks_total"] - 1, (t, kv[t], kv["f32"])
    for a, b in zip(out["auto"], out["f32"]):
        assert np.array_equal(a.token_ids, b.token_ids) and np.array_equal(a.logprobs.view(np.uint32),
                                                                            b.logprobs.view(np.uint32))
    for t, bound in (("bf16", 0.05), ("f16", 0.006)):
        for a, b in zip(out["f32"], out[t]):
            n = 0
            while n < len(a.token_ids) and a.token_ids[n] == b.token_ids[n]:
                n += 1
            assert n >= 8, (t, a.token_ids, b.token_ids)
            d = np.abs(a.logprobs[:n].astype(np.float64) - b.logprobs[:n])
            print(f"  {t}: {n} tokens agree with f32, max |dlogprob| {d.max():.6f} over them", flush=True)
            assert d.max() < bound, (t, d.max())


@case
def daemons_stop_cleanly():
    stop_cleanly(*_daemons)


if __name__ == "__main__":
    main()
