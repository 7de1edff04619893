#!/usr/bin/env python3
"""llama.cpp's prompt-lookup decoding, the reference point of `make bench-spec`.

  tools/bench_lookup.py --from build/bench-spec.json [--reps 2] [--json-out FILE]

Reads the model, threads, max_tokens, draft length and prompt token ids that
rollout-specbench wrote, and decodes each prompt alone (batch 1: llama-cpp-python
runs one sequence) through llama-cpp-python, without and with its
LlamaPromptLookupDecoding draft model (n-gram lookup in the prompt and output,
max_ngram_size 2, num_pred_tokens = the specbench's spec_max_draft), greedy and
temperature 1 (seeded; top_k, top_p, min_p and repeat penalty off, as the
specbench's sampler). Both runs decode max_tokens tokens, EOS included (the
generator is read until then), as the specbench ignores EOS. It prints the
tokens/s of each (best of --reps), their ratio, and how many prompts came out
with the same tokens: llama.cpp checks a draft by comparing its sampled token,
but its logits for a k-token batch are not bit-identical to one token at a time,
so the outputs can differ from its own non-speculative ones. Prompt 0 alone is
what the specbench's batch-1 row decodes. A benchmark: nothing passes or fails."""
import argparse
import json
import sys
import time

import numpy as np


def decode(llm, ids, max_tokens, temp, seed):
    llm.reset()
    llm.set_seed(seed)
    out = []
    t0 = time.perf_counter()
    for tok in llm.generate(ids, temp=temp, top_k=0, top_p=1.0, min_p=0.0, repeat_penalty=1.0, reset=True):
        out.append(int(tok))
        if len(out) == max_tokens:
            break
    return out, time.perf_counter() - t0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--from", dest="src", required=True, help="rollout-specbench's --json-out (not --grpo)")
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--json-out")
    a = ap.parse_args()
    with open(a.src) as f:
        spec = json.load(f)
    if "prompt_ids" not in spec:
        sys.exit(f"{a.src}: no prompt_ids (written by rollout-specbench without --grpo)")
    import llama_cpp
    from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

    n_ctx = max(len(p) for p in spec["prompt_ids"]) + spec["max_tokens"] + 16
    common = dict(model_path=spec["model"], n_ctx=n_ctx, n_threads=spec["threads"], n_threads_batch=spec["threads"],
                  n_batch=512, verbose=False)
    engines = {"off": llama_cpp.Llama(**common),
               "lookup": llama_cpp.Llama(**common, draft_model=LlamaPromptLookupDecoding(
                   max_ngram_size=2, num_pred_tokens=spec["spec_max_draft"]))}
    rows = []
    print(f"{'temp':<6} {'prompt':>6} {'off tok/s':>10} {'lookup tok/s':>13} {'ratio':>7} {'same':>5}")
    for temp in (0.0, 1.0):
        for p, ids in enumerate(spec["prompt_ids"]):
            best, toks = {}, {}
            for _ in range(a.reps):
                for name, llm in engines.items():  # alternating, as the specbench does
                    out, dt = decode(llm, ids, spec["max_tokens"], temp, 1234 + p)
                    best[name] = min(best.get(name, dt), dt)
                    toks.setdefault(name, out)
            tps = {k: len(toks[k]) / v for k, v in best.items()}
            same = toks["off"] == toks["lookup"]
            rows.append(dict(temperature=temp, prompt=p, off_tok_s=tps["off"], lookup_tok_s=tps["lookup"],
                             ratio=tps["lookup"] / tps["off"], same=same, tokens=len(toks["off"])))
            print(f"{temp:<6.1f} {p:>6} {tps['off']:>10.1f} {tps['lookup']:>13.1f} {tps['lookup'] / tps['off']:>6.2f}x "
                  f"{'yes' if same else 'NO':>5}", flush=True)
        r = [x for x in rows if x["temperature"] == temp]
        gm = float(np.exp(np.mean([np.log(x["ratio"]) for x in r])))
        print(f"{temp:<6.1f} {'all':>6} {'':>10} {'':>13} {gm:>6.2f}x {sum(x['same'] for x in r):>3}/{len(r)}"
              "  (geometric mean of the ratios; prompts with identical tokens)", flush=True)
    if a.json_out:
        with open(a.json_out, "w") as f:
            json.dump({"model": spec["model"], "threads": spec["threads"], "max_tokens": spec["max_tokens"],
                       "num_pred_tokens": spec["spec_max_draft"], "max_ngram_size": 2,
                       "llama_cpp_python": llama_cpp.__version__, "runs": rows}, f, indent=1)


if __name__ == "__main__":
    main()
