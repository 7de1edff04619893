"""One build, every x86-64 host: the CPU kernels' plain C, AVX2 and AVX-512 paths (base/cpu_isa.h,
forced with RD_CPU_ISA) give the daemon the same outputs, bit for bit.

- rolloutd carries no AVX or AVX-512 instruction outside the kernels' dispatched functions (objdump):
  the default build has no -march flag (NATIVE=1 adds it), so a host without them runs it.
- The same requests (greedy and sampled with a seed, n = 4 samples, a batch of 4 prompts decoding
  together, top-5 alternatives) against daemons on the plain C, AVX2 and AVX-512 paths: equal token
  ids and equal log-probs and alternatives as float32 bits; each daemon's log names its path. The
  daemons serve two tiny models (a Qwen3-MoE in Q4_K/Q6_K and a dense Llama 3): the plain C path
  needs ~0.7 s per token row on the default model without hardware FMA, and test_cpu_isa (C)
  compares the default model's logits on every path.
- RD_CPU_ISA naming an unknown path, or one above the host's, is reported and the best path is
  used; the daemon serves.
Paths the host lacks are SKIP lines."""
import os
import re
import subprocess

from harness import BUILD, ROOT, case, main
from rdtest import PROMPT, Daemon, fetch_all, hello, proto, rpc, stop_cleanly


def host_best():
    flags = open("/proc/cpuinfo").read().split("flags", 1)[1].split("\n", 1)[0].split()
    if all(f in flags for f in ("avx2", "fma", "f16c")):
        return "avx512" if "avx512f" in flags else "avx2"
    return "scalar"


ORDER = ["scalar", "avx2", "avx512"]
PATHS = ORDER[:ORDER.index(host_best()) + 1]
MAX_TOKENS = 8


TESTDATA = os.environ.get("RD_TESTDATA", os.path.join(ROOT, "build", "testdata"))
MODELS = [os.path.join(TESTDATA, f) for f in ("tiny-moe-q4_k_m.gguf", "tiny-llama3.gguf")]
TINY_PROMPT = [5, 17, 42, 99, 7, 250, 31]


def requests(prompt=PROMPT):
    """A batch that decodes together: 4 prompts, greedy and sampled, n = 4 forks, top-5 (kept
    small: the plain C path is ~20x slower than AVX2)."""
    reqs = []
    for i in range(4):
        reqs.append(proto.Request(client_req_id=10 + i, n=4 if i % 2 else 1, max_tokens=MAX_TOKENS,
                                  temperature=0.0 if i % 3 == 0 else 0.9, top_p=0.95, seed=1234 + i,
                                  logprobs_topk=5, flags=proto.REQ_IGNORE_EOS | proto.REQ_HAS_SEED, prompt_ids=prompt + [i * 17 + 3]))
    return reqs


def outputs(d, prompt):
    with d.sock() as s:
        cid = hello(s).client_id
        reqs = requests(prompt)
        ok = rpc(s, proto.Submit(client_id=cid, requests=reqs))
        assert all(it.status == 0 for it in ok.items), ok
        got, _ = fetch_all(s, cid, sum(r.n for r in reqs), timeout=600)
    return {(r.client_req_id, r.sample_idx): (r.token_ids.tobytes(), r.logprobs.tobytes(), r.top_ids.tobytes(),
                                              r.top_logprobs.tobytes()) for r in got.values()}


@case
def the_build_targets_baseline_x86_64():
    # The AVX and AVX-512 registers appear only in the kernels' dispatched functions (compiled for
    # their target, entered where cpu_isa_active() says the host has it).
    out = subprocess.run(["objdump", "-d", "--no-show-raw-insn", os.path.join(BUILD, "rolloutd")],
                         capture_output=True, text=True, check=True).stdout
    vector_funcs, func = set(), None
    for line in out.splitlines():
        if line.endswith(">:"):
            func = line.split("<", 1)[1][:-2]
        elif func and ("%ymm" in line or "%zmm" in line):
            vector_funcs.add(func)
    kernel = re.compile(r"(_avx2|_avx512)$|^(tile_|qr_GGML_|qs_\d|qr2_GGML_|qs2_\d)|^(store16|store_panel|decode_avx512|"
                        r"rows_avx2|rows_avx512|q4k_rows_avx2|put_panel2)")
    stray = sorted(f for f in vector_funcs if not kernel.search(f))
    assert vector_funcs and not stray, f"AVX instructions outside the dispatched kernels: {stray[:20]}"


@case
def every_path_gives_the_same_bits():
    for isa in ORDER:
        if isa not in PATHS:
            print(f"SKIP {isa}_path: this CPU lacks it (compared: {', '.join(PATHS)})")
    for model in MODELS:
        assert os.path.exists(model), f"{model} is missing: run tests/gen_testdata.sh"
        results = {}
        for isa in PATHS:
            d = Daemon(env={"RD_CPU_ISA": isa}, model=model, timeout=120)
            try:
                assert f"CPU kernels: the {isa} path" in d.output(), d.tail()
                results[isa] = outputs(d, TINY_PROMPT)
            finally:
                stop_cleanly(d)
        ref = results["scalar"]
        assert len(ref) == 1 + 4 + 1 + 4, len(ref)
        for isa in PATHS[1:]:
            for k, v in ref.items():
                names = ("token ids", "log-probs", "top ids", "top log-probs")
                for name, a, b in zip(names, v, results[isa][k]):
                    assert a == b, f"{os.path.basename(model)} request {k}: {name} differ between scalar and {isa}"
        # Not vacuous: the sampled samples differ from one another.
        assert len({v[0] for v in ref.values()}) > 4, os.path.basename(model)


@case
def a_bad_or_too_high_request_falls_back_to_the_best_path():
    best = PATHS[-1]
    for want, says in (("avx9", "is not scalar, avx2 or avx512"), ("avx512", "supports up to")):
        if want == "avx512" and best == "avx512":
            continue
        d = Daemon(env={"RD_CPU_ISA": want})
        try:
            log = d.output()
            assert says in log and f"CPU kernels: the {best} path" in log, log[-2000:]
            with d.sock() as s:
                cid = hello(s).client_id
                rpc(s, proto.Submit(client_id=cid, requests=[requests()[0]]))
                got, _ = fetch_all(s, cid, 1)
                assert len(next(iter(got.values())).token_ids) == MAX_TOKENS
        finally:
            stop_cleanly(d)


if __name__ == "__main__":
    main()
