#!/usr/bin/env python3
"""llama.cpp decode throughput on a GGUF, as the baseline for rollout-bench.

Uses llama-cpp-python's low-level API (the C API through ctypes): one context
per batch size with n_seq_max = batch and one seq_id per sequence. It
prefills every prompt once (prompt-len tokens per sequence, distinct fixed
token ids); each repetition then trims the KV cache back to the prompts and
runs `gen` decode steps in which every sequence adds one token (its greedy
next token). Only llama_decode (+ llama_synchronize) is timed; reading logits
and the argmax are outside the timer. decode_tokens_per_s = batch * gen /
(sum of decode-step times), the median over repetitions (after one untimed
warm-up repetition); decode_tokens_per_s_median_step = batch / (median step
time), which is robust to stalls on a shared machine. The prefill is timed on
its second run (the first warms up).

--next random feeds each sequence a seeded random token id (100..vocab-1) at
every step instead of its greedy one: on a random-weight mixture-of-experts
file that gives the token stream the engine's temperature-1 sampling gives
(its logits are nearly flat), so both route rows to as many distinct experts
(make bench-moe); the logits are still computed for every row.
--no-extra-bufts loads with use_extra_bufts off (no CPU repack or AMX buffer
types): a workaround for a llama.cpp build whose AMX path crashes
(tools/setup.sh builds one without it); it measures a slower llama.cpp.

  python3 tools/bench_llamacpp.py --model models/SmolLM2-135M-Instruct.Q4_1.gguf \
      --threads 2 --batch 1,32 --prompt-len 32 --gen 64 --json
"""
import argparse
import json
import statistics
import sys
import time

import numpy as np

import llamacpp_info

try:
    import llama_cpp as L
except ImportError:
    sys.exit("bench_llamacpp: llama-cpp-python is not installed (tools/setup.sh installs it)")


class Batch:
    """A llama_batch with room for `cap` tokens, each in one sequence."""

    def __init__(self, cap):
        self.cap = cap
        self.b = L.llama_batch_init(cap, 0, 1)

    def fill(self, entries):
        """entries: (token, pos, seq_id, want_logits) tuples."""
        assert len(entries) <= self.cap
        b = self.b
        for i, (tok, pos, seq, out) in enumerate(entries):
            b.token[i] = tok
            b.pos[i] = pos
            b.n_seq_id[i] = 1
            b.seq_id[i][0] = seq
            b.logits[i] = 1 if out else 0
        b.n_tokens = len(entries)

    def free(self):
        L.llama_batch_free(self.b)


def decode(ctx, batch, entries):
    """Decodes entries in one llama_decode call; returns its seconds."""
    batch.fill(entries)
    t0 = time.perf_counter()
    rc = L.llama_decode(ctx, batch.b)
    L.llama_synchronize(ctx)
    dt = time.perf_counter() - t0
    if rc != 0:
        raise RuntimeError(f"llama_decode returned {rc} for {len(entries)} tokens")
    return dt


def argmax_rows(ctx, entries, n_vocab):
    """Greedy next token for each entry that asked for logits, by seq_id."""
    nxt = {}
    for i, (_, _, seq, out) in enumerate(entries):
        if out:
            p = L.llama_get_logits_ith(ctx, i)
            nxt[seq] = int(np.ctypeslib.as_array(p, shape=(n_vocab,)).argmax())
    return nxt


def one_batch_size(model, n_vocab, B, args):
    ctx_per_seq = (args.prompt_len + args.gen + 1 + 255) // 256 * 256
    cp = L.llama_context_default_params()
    cp.n_ctx = B * ctx_per_seq
    cp.n_seq_max = B
    cp.n_batch = cp.n_ubatch = max(B, min(512, B * args.prompt_len))
    cp.n_threads = cp.n_threads_batch = args.threads
    cp.no_perf = True
    cp.kv_unified = args.kv_unified
    cp.flash_attn_type = {"auto": L.LLAMA_FLASH_ATTN_TYPE_AUTO, "on": L.LLAMA_FLASH_ATTN_TYPE_ENABLED,
                          "off": L.LLAMA_FLASH_ATTN_TYPE_DISABLED}[args.flash_attn]
    ctx = L.llama_init_from_model(model, cp)
    if not ctx:
        raise RuntimeError(f"llama_init_from_model failed for batch {B}")
    batch = Batch(cp.n_batch)
    rng = np.random.default_rng(args.seed)
    prompts = [rng.integers(100, n_vocab, args.prompt_len).tolist() for _ in range(B)]
    reps = []
    try:
        # Prefill once (timed, reported); each repetition then trims every
        # sequence back to its prompt and decodes `gen` steps from there.
        mem = L.llama_get_memory(ctx)
        entries = [(t, p, s, p == args.prompt_len - 1) for s, pr in enumerate(prompts) for p, t in enumerate(pr)]
        for _ in range(2):
            L.llama_memory_clear(mem, True)
            t_prefill, first = 0.0, {}
            for i in range(0, len(entries), cp.n_batch):
                chunk = entries[i:i + cp.n_batch]
                t_prefill += decode(ctx, batch, chunk)
                first.update(argmax_rows(ctx, chunk, n_vocab))
        for rep in range(args.warmup + args.reps):
            if not L.llama_memory_seq_rm(mem, -1, args.prompt_len, -1):
                raise RuntimeError("llama_memory_seq_rm failed")
            nxt, steps = dict(first), []
            pick = np.random.default_rng([args.seed, 1, rep])
            for g in range(args.gen):
                pos = args.prompt_len + g
                chunk = [(nxt[s], pos, s, True) for s in range(B)]
                steps.append(decode(ctx, batch, chunk))
                if args.next == "random":
                    nxt = {s: int(t) for s, t in enumerate(pick.integers(100, n_vocab, B))}
                else:
                    nxt = argmax_rows(ctx, chunk, n_vocab)
            if rep >= args.warmup:
                reps.append((sum(steps), statistics.median(steps)))
    finally:
        batch.free()
        L.llama_free(ctx)
    t_pre = t_prefill
    t_dec = statistics.median(r[0] for r in reps)
    return {
        "decode_tokens_per_s": B * args.gen / t_dec,
        "prefill_tokens_per_s": B * args.prompt_len / t_pre,
        "ms_per_decode_step": 1000 * t_dec / args.gen,
        "median_step_ms": 1000 * statistics.median(r[1] for r in reps),
        "decode_tokens_per_s_median_step": B / statistics.median(r[1] for r in reps),
        "batch": B, "threads": args.threads, "prompt_len": args.prompt_len, "gen": args.gen,
        "reps": args.reps, "flash_attn": args.flash_attn, "kv_unified": args.kv_unified, "next": args.next,
        "extra_bufts": not args.no_extra_bufts,
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--batch", default="1,32", help="comma-separated batch sizes (sequences per decode step)")
    ap.add_argument("--prompt-len", type=int, default=32)
    ap.add_argument("--gen", type=int, default=64, help="decode steps per sequence")
    ap.add_argument("--reps", type=int, default=3, help="timed repetitions (median reported)")
    ap.add_argument("--warmup", type=int, default=1, help="untimed repetitions first")
    ap.add_argument("--seed", type=int, default=0, help="seed of the fixed prompt token ids")
    ap.add_argument("--kv-unified", action="store_true", help="one KV buffer for all sequences (default: one per sequence)")
    ap.add_argument("--flash-attn", choices=("auto", "on", "off"), default="auto")
    ap.add_argument("--next", choices=("greedy", "random"), default="greedy",
                    help="each step's next token: the greedy one, or a seeded random id (see above)")
    ap.add_argument("--no-extra-bufts", action="store_true",
                    help="load with use_extra_bufts off (no repack / AMX buffer types; see above)")
    ap.add_argument("--json", action="store_true", help="print one JSON object on the last line")
    ap.add_argument("--verbose", action="store_true", help="keep llama.cpp's log")
    args = ap.parse_args()
    sizes = [int(x) for x in args.batch.split(",") if x]
    if not sizes or min(sizes) < 1 or max(sizes) > 256:
        sys.exit("bench_llamacpp: --batch sizes must be in 1..256")
    if args.prompt_len < 1 or args.gen < 1 or args.reps < 1:
        sys.exit("bench_llamacpp: --prompt-len, --gen and --reps must be >= 1")

    # llama.cpp's log is kept only with --verbose (llama-cpp-python's callback prints at ERROR).
    import llama_cpp._logger
    llama_cpp._logger.set_verbose(args.verbose)
    L.llama_backend_init()
    mp = L.llama_model_default_params()
    if args.no_extra_bufts:
        mp.use_extra_bufts = False
    with llamacpp_info.capture() as bufs:
        model = L.llama_model_load_from_file(args.model.encode(), mp)
    if not model:
        sys.exit(f"bench_llamacpp: cannot load {args.model}")
    # Which build and buffer types ran (CPU_REPACK: llama.cpp's repacked kernels).
    print(llamacpp_info.describe(args.model, bufs))
    n_vocab = L.llama_vocab_n_tokens(L.llama_model_get_vocab(model))
    results = {}
    try:
        for B in sizes:
            results[f"batch_{B}"] = one_batch_size(model, n_vocab, B, args)
    finally:
        L.llama_model_free(model)

    print(f"llama.cpp (llama-cpp-python {L.__version__}), {args.model}, {args.threads} threads, "
          f"prompt {args.prompt_len}, gen {args.gen}, median of {args.reps}, flash-attn {args.flash_attn}, "
          f"kv {'unified' if args.kv_unified else 'per sequence'}")
    print(f"{'batch':>6} {'prefill tok/s':>14} {'decode tok/s':>13} {'ms/step':>9} {'median ms/step':>15}")
    for r in results.values():
        print(f"{r['batch']:>6} {r['prefill_tokens_per_s']:>14.1f} {r['decode_tokens_per_s']:>13.1f} "
              f"{r['ms_per_decode_step']:>9.2f} {r['median_step_ms']:>15.2f}")
    if args.json:
        print(json.dumps(results))


if __name__ == "__main__":
    main()
