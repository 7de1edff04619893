#!/usr/bin/env python3
"""Assembles one results file from a GPU check's stage JSONs (tests/gpu/run.sh, issue 48).

    tools/gpu_results.py --logs DIR [--summary summary.json] [--json results.json] [--markdown results.md]

DIR holds a JSON per stage, named after it (rollout-gpubench's --json) and its log (NAME.log). Each
document is recognised by its fields: bench (decode against the roofline), gemm (the linear op per
shape, rows and variant), attn (attention at long context), copybw, info, parity, invariance. The
profile stages' logs (ncu --print-summary per-kernel) give the per-kernel GPU times. Written: one JSON
document (the GPU, the copy bandwidth, every row, the stages' statuses) and markdown tables for
docs/PERF.md, also printed: issue 48's targets judged, then the defaults the run settles (each default set
before a device could time it, against its alternative, with a verdict). Python 3 standard library only: the
device machine has nothing else.
Exit 0, or 2 on bad arguments; a stage JSON that does not parse is reported in the document's
"unreadable" list and skipped. A gemm, moe or bench document with "complete": false is the snapshot a stage
left when its timeout or a fault ended it (written after each variant or batch): its rows are used, and the
stage is named in the "partial" list."""
import argparse
import glob
import json
import os
import re
import sys
import time


def load(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def kind(doc):
    """What produced a stage document, by its fields."""
    if not isinstance(doc, dict):
        return None
    if "batches" in doc and "weight_bytes_per_step" in doc:
        return "bench"
    if isinstance(doc.get("results"), list) and "moe_shape" in doc:
        return "moe"
    if isinstance(doc.get("results"), list) and "variants" in doc:
        return "gemm"
    if isinstance(doc.get("results"), list) and "target_x_copy" in doc:
        return "attn"
    if "copy_gbps" in doc and "mib" in doc:
        return "copybw"
    if "mem_total" in doc and "describe" in doc:
        return "info"
    if "prompts" in doc and "tol" in doc:
        return "parity"
    if "equal_batched" in doc:
        return "invariance"
    if "draws" in doc:
        return "sampler"
    if "mean_k3_kl" in doc:
        return "tis"
    if isinstance(doc.get("results"), list) and isinstance(doc.get("adapters"), list):
        return "lora"
    return None


def num(x, nd=3):
    return None if x is None else round(float(x), nd)


UNITS_US = {"nsecond": 1e-3, "ns": 1e-3, "usecond": 1.0, "us": 1.0, "msecond": 1e3, "ms": 1e3, "second": 1e6, "s": 1e6}


def parse_ncu(text):
    """Per-kernel GPU time from `ncu --print-summary per-kernel --metrics gpu__time_duration.sum`: a kernel's
    line (its name, launch shape, maybe "Invocations N"), then a table whose gpu__time_duration.sum row
    holds the unit and the minimum, maximum and average. Best effort: lines it cannot read are skipped."""
    kernels = []
    header = None
    for line in text.splitlines():
        s = line.rstrip()
        if not s.strip() or s.lstrip().startswith(("==", "---", "Section:", "Metric Name")):
            continue
        if "gpu__time_duration.sum" in s:
            toks = s.split()
            i = toks.index("gpu__time_duration.sum") if "gpu__time_duration.sum" in toks else -1
            rest = toks[i + 1:] if i >= 0 else []
            unit = rest[0] if rest and not re.match(r"^[-+0-9.,]+$", rest[0]) else "nsecond"
            vals = []
            for t in rest[1:] if rest and rest[0] == unit else rest:
                try:
                    vals.append(float(t.replace(",", "")))
                except ValueError:
                    pass
            if not vals or header is None:
                continue
            f = UNITS_US.get(unit, 1e-3)
            name, inv = header
            k = {"kernel": name, "unit": unit, "avg_us": round(vals[-1] * f, 3)}
            if len(vals) >= 3:
                k["min_us"], k["max_us"] = round(vals[0] * f, 3), round(vals[1] * f, 3)
            if inv:
                k["invocations"] = inv
                k["total_us"] = round(vals[-1] * f * inv, 3)
            kernels.append(k)
            continue
        if len(s) - len(s.lstrip()) <= 2 and not s.lstrip()[0].isdigit():
            m = re.search(r"Invocations\s+(\d+)", s)
            name = s.strip()
            name = re.split(r"\s+\(\d+, \d+, \d+\)x\(\d+, \d+, \d+\)", name)[0]
            header = (name[:200], int(m.group(1)) if m else None)
    return kernels


def variant_point(stage, r, what):
    """One point of a gemm or moe stage (rollout-gpubench's variant runs): what was measured, then the numbers."""
    return dict({"stage": stage}, **what, rows=r.get("rows"), variant=r.get("variant"), us=num(r.get("us")),
                us_stream=num(r.get("us_stream")), graph=r.get("graph"), gbps=num(r.get("gbps"), 1),
                x_copy=num(r.get("x_copy")), tflops=num(r.get("tflops")), x_peak=num(r.get("x_peak"), 4),
                invariant=r.get("invariant"))


def variant_verdicts(stage, doc):
    """Each variant's batch-invariance verdict in a gemm or moe stage."""
    return [{"stage": stage, "variant": v.get("name"), "env": v.get("env"), "invariant": v.get("invariant"),
             "error": v.get("error")} for v in doc.get("variants", [])]


def assemble(logs, summary):
    out = {"date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "gpu": None, "describe": None,
           "copy_gbps": None, "stages": [], "bench": [], "gemm": [], "gemm_invariance": [], "moe": [], "attention": [],
           "checks": [], "tis": [], "ncu": [], "sampler": [], "lora": [], "unreadable": [], "partial": []}
    if summary:
        for k in ("date", "host", "gpu", "dry_run", "seconds"):
            if k in summary:
                out[k] = summary[k]
        out["stages"] = summary.get("stages", [])
    for path in sorted(glob.glob(os.path.join(logs, "*.json"))):
        stage = os.path.splitext(os.path.basename(path))[0]
        doc = load(path)
        if doc is None:
            out["unreadable"].append(stage)
            continue
        if isinstance(doc, dict) and doc.get("complete") is False:
            out["partial"].append(stage)
        k = kind(doc)
        if k == "info":
            out["describe"] = doc.get("describe")
            out["mem_total"] = doc.get("mem_total")
        elif k == "copybw":
            out["copy_gbps"] = num(doc.get("copy_gbps"), 1)
        elif k == "bench":
            for b in doc.get("batches", []):
                row = {"stage": stage, "model": doc.get("model"), "label": (doc.get("label") or "").strip(),
                       "backend": doc.get("backend"), "weights": doc.get("weights", "bf16"),
                       "kv_dtype": doc.get("kv_dtype"), "layers": doc.get("layers"),
                       "layers_full": doc.get("layers_full"), "prompt": doc.get("prompt"),
                       "kv_fill": doc.get("kv_fill", False), "batch": b.get("batch"),
                       "step_ms": num(b.get("step_ms")), "sample_ms": num(b.get("sample_ms")),
                       "forward_waits": b.get("forward_waits"), "tokens_per_s": num(b.get("tokens_per_s"), 1),
                       "bytes_per_step": b.get("bytes_per_step"), "roofline_ms": num(b.get("roofline_ms")),
                       "x_roofline": num(b.get("x_roofline"))}
                for f in ("experts_per_layer_bound", "experts_per_layer_measured", "roofline_measured_ms",
                          "x_roofline_measured"):
                    if f in b:
                        row[f] = num(b[f])
                out["bench"].append(row)
            if out["copy_gbps"] is None and doc.get("copy_gbps"):
                out["copy_gbps"] = num(doc["copy_gbps"], 1)
        elif k == "gemm":
            for r in doc.get("results", []):
                out["gemm"].append(variant_point(stage, r, {"shape": r.get("shape"), "out": r.get("out"),
                                                            "in": r.get("in")}))
            out["gemm_invariance"] += variant_verdicts(stage, doc)
            out.setdefault("peak_tflops", doc.get("peak_tflops"))
            out.setdefault("peak_assumption", doc.get("peak_assumption"))
        elif k == "moe":
            sh = doc.get("moe_shape") or {}
            for r in doc.get("results", []):
                out["moe"].append(variant_point(stage, r, {"shape": sh.get("name"),
                                                           "experts_touched": num(r.get("experts_touched"), 2)}))
            out["gemm_invariance"] += variant_verdicts(stage, doc)
        elif k == "attn":
            for r in doc.get("results", []):
                out["attention"].append({"stage": stage, "shape": r.get("shape"), "n_heads": r.get("n_heads"),
                                         "n_kv_heads": r.get("n_kv_heads"), "head_dim": r.get("head_dim"),
                                         "ctx": r.get("ctx"), "batch": r.get("batch"), "us": num(r.get("us")),
                                         "us_stream": num(r.get("us_stream")), "graph": r.get("graph"),
                                         "kv_bytes": r.get("kv_bytes"), "gbps": num(r.get("gbps"), 1),
                                         "x_copy": num(r.get("x_copy"))})
        elif k == "tis":
            out["tis"].append({"stage": stage, "rd_cuda_fp8": doc.get("rd_cuda_fp8"), "rd_cuda_q8": doc.get("rd_cuda_q8"),
                               "weights": doc.get("weights"), "tokens": doc.get("tokens"),
                               "mean_k3_kl": doc.get("mean_k3_kl"), "mean_abs_dlogprob": num(doc.get("mean_abs_dlogprob"), 5),
                               "max_abs_dlogprob": num(doc.get("max_abs_dlogprob"), 4)})
        elif k == "lora":
            ok = (doc.get("checks") or {}).get("ok") if isinstance(doc.get("checks"), dict) else None
            for r in doc.get("results", []):
                out["lora"].append({"stage": stage, "backend": doc.get("backend"), "batch": r.get("batch"),
                                    "adapters": r.get("adapters"),
                                    "tokens_per_s": num(r.get("tokens_per_s_median"), 1),
                                    "ratio_to_base": num(r.get("ratio_to_base")), "checks_ok": ok})
        elif k in ("parity", "invariance", "sampler"):
            for e in doc.get("per_params", []) if k == "sampler" else []:
                out["sampler"].append({"stage": stage, "form": doc.get("rd_cuda_sample"),
                                       "rule": f"T {num(e.get('temperature'), 2)} top-k {e.get('top_k')} "
                                               f"top-p {num(e.get('top_p'), 2)} min-p {num(e.get('min_p'), 2)}",
                                       "ms_one_draw": num(e.get("ms_one_draw")),
                                       "ms_per_call": num(e.get("ms_per_call"))})
            c = {"stage": stage, "kind": k, "pass": doc.get("pass")}
            for f in ("equal_prompts", "near_ties", "mismatches", "max_dlogprob", "equal_batched", "equal_nographs"):
                if f in doc:
                    c[f] = doc[f]
            out["checks"].append(c)
    for path in sorted(glob.glob(os.path.join(logs, "profile-*.log"))):
        try:
            with open(path, errors="replace") as f:
                ks = parse_ncu(f.read())
        except OSError:
            continue
        if ks:
            out["ncu"].append({"stage": os.path.splitext(os.path.basename(path))[0], "kernels": ks,
                               "sum_avg_us": round(sum(k.get("total_us", k["avg_us"]) for k in ks), 3)})
    return out


# Issue 48's targets, read from the stages tests/gpu/run.sh names (bench-1b*, bench-qwen3-*, bench-1b-fp8*,
# bench-moe, attn, gemm-1b). Each: what, the value found (None: the stage did not run), the bound, met.
def _bench(res, stage_prefixes, batch):
    rows = [b for b in res["bench"] if b["batch"] == batch and b["step_ms"] is not None
            and any(b["stage"] == p or b["stage"].startswith(p + "-") for p in stage_prefixes)]
    return rows


def targets(res):
    t = []

    def add(what, value, bound, met, note=""):
        t.append({"target": what, "value": value, "bound": bound, "met": None if value is None else bool(met),
                  "note": note})

    bf16_1b = [b for b in _bench(res, ["bench-1b"], 1) if b["weights"] == "bf16" and not b["kv_fill"]]
    best = min(bf16_1b, key=lambda b: b["x_roofline"], default=None)
    add("1.24B bf16, batch 1: step / weight-read roofline", best and best["x_roofline"], "<= 1.3",
        best and best["x_roofline"] <= 1.3, best and best["stage"] or "")
    for name, prefix in (("Qwen3-1.7B", "bench-qwen3-1.7b"), ("Qwen3-8B", "bench-qwen3-8b")):
        rows = _bench(res, [prefix], 1)
        b = min(rows, key=lambda r: r["x_roofline"], default=None)
        add(f"{name} shape, batch 1: step / roofline", b and b["x_roofline"], "<= 1.4", b and b["x_roofline"] <= 1.4,
            b and b["stage"] or "")
    # GEMMs at batch 256 on the 1B's shapes: all four shapes' FLOPs over their summed time, per variant (and
    # stage: gemm-1b-pipe and gemm-1b-wg time the tile kernel's variants).
    peak = res.get("peak_tflops")
    per_var = {}
    for g in res["gemm"]:
        if g["stage"] in ("gemm-1b", "gemm-1b-pipe", "gemm-1b-wg") and g["rows"] == 256 and g["us"] and g["out"] and g["in"]:
            key = g["variant"] if g["stage"] == "gemm-1b" else f'{g["variant"]} ({g["stage"]})'
            v = per_var.setdefault(key, [0.0, 0.0])
            v[0] += 2.0 * 256 * g["out"] * g["in"]
            v[1] += g["us"] * 1e-6
    frac = {k: (v[0] / v[1] / 1e12) / peak for k, v in per_var.items() if v[1] > 0 and peak}
    bv = max(frac, key=frac.get, default=None)
    add("1.24B shapes, batch 256: GEMM TFLOP/s / bf16 tensor-core peak", bv and round(frac[bv], 3), ">= 0.5",
        bv and frac[bv] >= 0.5, bv and f"variant {bv}" or "")
    # FP8 against the best bf16 step of the same shape and batch (the fastest FP8 stage named, with its K3 KL
    # against bf16 on the default model where a tis stage of the same mode ran).
    k3 = {t["stage"]: t for t in res.get("tis", [])}
    for batch, bound in ((1, 1.5), (32, 1.2), (256, 1.2)):
        bf = [b for b in _bench(res, ["bench-1b"], batch) if b["weights"] == "bf16" and not b["kv_fill"]]
        f8 = [b for b in _bench(res, ["bench-1b"], batch) if b["weights"] == "fp8" and b.get("kv_dtype") != "fp8"]
        if bf and f8:
            fast = min(f8, key=lambda b: b["step_ms"])
            gain = min(b["step_ms"] for b in bf) / fast["step_ms"]
            tis = k3.get("tis-w8a8" if fast["stage"].endswith("w8a8") else "tis-fp8")
            note = fast["stage"] + (f", K3 KL {tis['mean_k3_kl']:.2e} ({tis['stage']})" if tis else "")
            add(f"FP8 weights, 1.24B batch {batch}: bf16 step / FP8 step", round(gain, 3), f">= {bound}",
                gain >= bound, note)
        else:
            add(f"FP8 weights, 1.24B batch {batch}: bf16 step / FP8 step", None, f">= {bound}", False)
    # The 8-bit alternative: Q8_0 layers held as Q8_0 (RD_CUDA_Q8=tc, or =w8a8 on int8 tensor cores), the
    # CPU's Q8_0 values at FP8's bytes, against the same bound, with its K3 KL (tis-q8, tis-q8w8a8).
    for batch, bound in ((1, 1.5), (32, 1.2), (256, 1.2)):
        bf = [b for b in _bench(res, ["bench-1b"], batch) if b["weights"] == "bf16" and not b["kv_fill"]]
        q8 = [b for b in _bench(res, ["bench-1b"], batch) if b["weights"] == "q8_0" and b.get("kv_dtype") != "fp8"]
        what = f"Q8_0 weights (8-bit, RD_CUDA_Q8), 1.24B batch {batch}: bf16 step / Q8_0 step"
        if bf and q8:
            fast = min(q8, key=lambda b: b["step_ms"])
            gain = min(b["step_ms"] for b in bf) / fast["step_ms"]
            tis = k3.get("tis-q8w8a8" if fast["stage"].endswith("q8w8a8") else "tis-q8")
            note = fast["stage"] + (f", K3 KL {tis['mean_k3_kl']:.2e} ({tis['stage']})" if tis else "")
            add(what, round(gain, 3), f">= {bound}", gain >= bound, note)
        else:
            add(what, None, f">= {bound}", False)
    # the best of the MoE stages (bench-moe: default; bench-moe-gemmtc: RD_CUDA_GEMM=tc; bench-moe-tc: both
    # RD_CUDA_GEMM=tc and RD_CUDA_MOE=tc)
    def moe_x(b):
        return b.get("x_roofline_measured") if b.get("x_roofline_measured") is not None else b["x_roofline"]
    m = min(_bench(res, ["bench-moe"], 1), key=moe_x, default=None)
    xr = m and moe_x(m)
    add("Qwen3-30B-A3B shape, batch 1: step / active-expert roofline", xr, "<= 1.5", xr is not None and xr <= 1.5,
        m and m["stage"] or "")
    att = [a for a in res["attention"] if a["ctx"] == 32768 and a["x_copy"] is not None]
    a = max(att, key=lambda r: r["x_copy"], default=None)
    add("attention at 32k context: KV bytes / time, of copy bandwidth", a and a["x_copy"], ">= 0.7",
        a and a["x_copy"] >= 0.7, a and f"{a['stage']}: {a['shape']} batch {a['batch']}" or "")
    failed = [s["stage"] for s in res.get("stages", []) if s.get("status") in ("FAIL", "TIMEOUT", "ERROR")]
    bad_inv = [g["variant"] for g in res["gemm_invariance"] if g["invariant"] is False]
    add("every device check passes, batch invariance on every variant", len(failed) + len(bad_inv), "0",
        not failed and not bad_inv, ", ".join(failed + bad_inv))
    return t


# The defaults that were set (or left off) without a device's numbers, each with the stages and variants that time
# it against its alternative, the rule from the session that built it, and what to change where it loses. A
# point is (label, the default's time, the alternative's time, the (stage, variant) pairs behind it): lower is
# better. Rules: "all" (change when the alternative is faster at every point by more than MARGIN), "any"
# (change when it is faster at any point by more than MARGIN), "noslower" (change when it is nowhere slower by
# more than MARGIN), "report" (no verdict: a trade-off the numbers alone do not settle). A gate names stages that must have passed (a check of the
# alternative); a failed gate keeps the default whatever the times say.
MARGIN = 0.02


def _variant_pts(res, key, stage, pairs, rows):
    """(default variant, alternative variant) pairs of a gemm or moe stage: at each rows, the summed time over the
    shapes both have."""
    pts = []
    for vd, va in pairs:
        for r in rows:
            def per(v):
                return {g["shape"]: g["us"] for g in res.get(key, []) if g["stage"] == stage and g["variant"] == v
                        and g["rows"] == r and g["us"] is not None}
            a, b = per(vd), per(va)
            common = [s for s in a if s in b]
            if common:
                pts.append((f"{va} r{r}", sum(a[s] for s in common), sum(b[s] for s in common),
                            ((stage, vd), (stage, va))))
    return pts


def _best_variant(res, stage, vd, alts, rows, at):
    """The alternative that is fastest at `at` rows (over the shapes it shares with vd), against vd at every rows."""
    times = {va: p[0][2] for va in alts for p in [_variant_pts(res, "gemm", stage, [(vd, va)], (at,))] if p}
    best = min(times, key=times.get, default=None)
    return _variant_pts(res, "gemm", stage, [(vd, best)], rows) if best else []


def _keyed_pts(res, key, st_def, st_alt, ident, value):
    def per(stage):
        return {ident(x): value(x) for x in res.get(key, []) if x["stage"] == stage and value(x) is not None}
    a, b = per(st_def), per(st_alt)
    return [(f"{st_alt} {k}", a[k], b[k], ()) for k in a if k in b]


def points(res, src):
    """A source's points: ("bench", default stage, alternative stage[, field]); ("gemm" or "moe", stage, [(default
    variant, alternative variant)], rows); ("best", stage, default variant, [alternatives], rows, the rows that
    pick the fastest); ("attn" / "sampler" / "lora", default stage, alternative stage)."""
    k = src[0]
    if k == "bench":
        field = src[3] if len(src) > 3 else "step_ms"
        return _keyed_pts(res, "bench", src[1], src[2], lambda b: f"b{b['batch']}", lambda b: b.get(field))
    if k in ("gemm", "moe"):
        return _variant_pts(res, k, *src[1:])
    if k == "best":
        return _best_variant(res, *src[1:])
    if k == "attn":
        return _keyed_pts(res, "attention", src[1], src[2], lambda a: f"{a['shape']} ctx {a['ctx']} b{a['batch']}",
                          lambda a: a["us"])
    if k == "sampler":
        return _keyed_pts(res, "sampler", src[1], src[2], lambda x: x["rule"], lambda x: x["ms_per_call"])
    if k == "lora":  # adapter rows only; tokens/s as seconds a token
        return _keyed_pts(res, "lora", src[1], src[2], lambda x: f"b{x['batch']} {x['adapters']} adapters",
                          lambda x: 1.0 / x["tokens_per_s"] if x["tokens_per_s"] and x["adapters"] else None)
    raise ValueError(f"unknown source {src}")


TILE_ROWS = (128, 256, 512)
DEFAULTS = [
    {"setting": "RD_CUDA_GEMM (bf16 linears)", "now": "cuBLASLt", "alt": "tc",
     "sources": [("bench", "bench-1b", "bench-1b-tc"), ("bench", "bench-qwen3-8b", "bench-qwen3-8b-tc"),
                 ("bench", "bench-qwen3-1.7b", "bench-qwen3-1.7b-tc")],
     "gate": ["unit-tc-cuda", "parity-tc", "invariance-tc"], "rule": "all",
     "change": "cuda_backend.cu create(): gemm_tc on by default; the kernel-count tests follow"},
    {"setting": "RD_CUDA_TC_TILE", "now": "64", "alt": "128",
     "sources": [("gemm", "gemm-1b", [("tc", "tc+RD_CUDA_TC_TILE=128"), ("tcbf16", "tcbf16+RD_CUDA_TC_TILE=128"),
                                      ("w8a8", "w8a8+RD_CUDA_TC_TILE=128")], TILE_ROWS)],
     "gate": [], "rule": "all", "change": "create(): tc_tile 128 by default"},
    {"setting": "RD_CUDA_TC_BIG_ROWS (the tile kernel from 128 rows)", "now": "128", "alt": "0 (split-K kernel only)",
     "sources": [("gemm", "gemm-1b", [("tc", "tc+RD_CUDA_TC_BIG_ROWS=0")], TILE_ROWS)],
     "gate": [], "rule": "all", "change": "create(): tc_big_rows past the rows where the split-K kernel wins"},
    {"setting": "RD_CUDA_TC_PIPE (tile kernel loads)", "now": "4 cp.async stages", "alt": "0 (registers)",
     "sources": [("gemm", "gemm-1b-pipe", [("tc", "tc+RD_CUDA_TC_PIPE=0"), ("tcbf16", "tcbf16+RD_CUDA_TC_PIPE=0"),
                                           ("fp8tc", "fp8tc+RD_CUDA_TC_PIPE=0"), ("w8a8", "w8a8+RD_CUDA_TC_PIPE=0")],
                  TILE_ROWS),
                 ("gemm", "gemm-1b-q8", [("q8tc", "q8tc+RD_CUDA_TC_PIPE=0"), ("q8w8a8", "q8w8a8+RD_CUDA_TC_PIPE=0")],
                  TILE_ROWS)],
     "gate": [], "rule": "all", "change": "create(): tc_stages 0 by default"},
    {"setting": "RD_CUDA_TC_PIPE depth", "now": "4", "alt": "6",
     "sources": [("gemm", "gemm-1b-pipe", [("tc", "tc+RD_CUDA_TC_PIPE=6")], TILE_ROWS)],
     "gate": [], "rule": "all", "change": "create(): tc_stages 6 by default"},
    {"setting": "RD_CUDA_TC_ORDER (tile grid)", "now": "batch tiles fastest", "alt": "weight",
     "sources": [("gemm", "gemm-1b-pipe", [("tc", "tc+RD_CUDA_TC_ORDER=weight"),
                                           ("tcbf16", "tcbf16+RD_CUDA_TC_ORDER=weight")], TILE_ROWS),
                 ("gemm", "gemm-1b-wg", [("tcbf16+RD_CUDA_TC_WG=auto",
                                          "tcbf16+RD_CUDA_TC_WG=auto+RD_CUDA_TC_ORDER=weight")], TILE_ROWS)],
     "gate": [], "rule": "any", "change": "create(): tc_wmajor 1 by default (the order before session 39)"},
    {"setting": "RD_CUDA_TC_WG (wgmma tile kernel on Hopper)", "now": "0 (mma.sync tiles)",
     "alt": "the fastest of 1/2/4/auto at 256 rows",
     "sources": [("best", "gemm-1b-wg", "tc", [f"tc+RD_CUDA_TC_WG={w}" for w in ("1", "2", "4", "auto")], TILE_ROWS,
                  256),
                 ("best", "gemm-1b-wg", "tcbf16", [f"tcbf16+RD_CUDA_TC_WG={w}" for w in ("1", "4", "auto")], TILE_ROWS,
                  256),
                 ("gemm", "gemm-1b-wg", [("fp8tc", "fp8tc+RD_CUDA_TC_WG=auto")], TILE_ROWS),
                 ("bench", "bench-1b-tc", "bench-1b-tc-wg")],
     "gate": ["unit-tc-wg-cuda", "unit-tc-wgp-cuda", "gemm-1b-wg"], "rule": "all",
     "change": "create(): tc_wg = the fastest setting on compute capability 9.0"},
    {"setting": "wgmma tile kernel's form", "now": "pipelined (cp.async ring)", "alt": "registers (RD_CUDA_TC_PIPE=0)",
     "sources": [("gemm", "gemm-1b-wg", [("tc+RD_CUDA_TC_WG=1", "tc+RD_CUDA_TC_WG=1+RD_CUDA_TC_PIPE=0"),
                                         ("tcbf16+RD_CUDA_TC_WG=auto", "tcbf16+RD_CUDA_TC_WG=auto+RD_CUDA_TC_PIPE=0"),
                                         ("fp8tc+RD_CUDA_TC_WG=auto", "fp8tc+RD_CUDA_TC_WG=auto+RD_CUDA_TC_PIPE=0")],
                  TILE_ROWS)],
     "gate": ["unit-tc-wgp-cuda"], "rule": "all",
     "change": "create(): the register form with RD_CUDA_TC_WG (no gemm_tc_wgp_setup)"},
    {"setting": "wgmma pipelined form's depth", "now": "4", "alt": "6",
     "sources": [("gemm", "gemm-1b-wg", [("tcbf16+RD_CUDA_TC_WG=auto", "tcbf16+RD_CUDA_TC_WG=auto+RD_CUDA_TC_PIPE=6")],
                  TILE_ROWS)],
     "gate": [], "rule": "all", "change": "create(): 6 stages for the wgmma kernel only"},
    {"setting": "RD_CUDA_PDL", "now": "off", "alt": "on", "sources": [("bench", "bench-1b-tc", "bench-1b-tc-pdl")],
     "gate": ["invariance-tc-pdl"], "rule": "all", "change": "create(): rd_pdl on by default"},
    {"setting": "RD_CUDA_NORM_ROWS (RMSNorm as the GEMM's prologue)", "now": "8", "alt": "0",
     "sources": [("bench", "bench-1b-tc", "bench-1b-tc-norm0")],
     "gate": [], "rule": "all", "change": "create(): tc_norm_rows 0 (or the rows where the prologue still wins)"},
    {"setting": "RD_CUDA_NORM_V0 (k_rmsnorm)", "now": "register form", "alt": "loop form",
     "sources": [("bench", "bench-1b", "bench-1b-normv0")],
     "gate": [], "rule": "all", "change": "create(): norm_v0 on by default"},
    {"setting": "RD_CUDA_SAMPLE (device sampler)", "now": "tiled", "alt": "cta",
     "sources": [("bench", "bench-1b-tc-fsync", "bench-1b-tc-samp0", "sample_ms"), ("sampler", "sampler", "sampler-cta")],
     "gate": ["sampler-cta"], "rule": "all", "change": "create(): sample_cta on by default (or per rule where it wins)"},
    {"setting": "RD_FORWARD_SYNC (engine)", "now": "sampler queued behind the forward", "alt": "host waits",
     "sources": [("bench", "bench-1b-tc", "bench-1b-tc-fsync")],
     "gate": [], "rule": "all", "change": "engine.c: forward_sync on by default"},
    {"setting": "RD_CUDA_ATTN_V0 (attention schedule)", "now": "4 CTAs an SM, keys loaded 4/8 at once", "alt": "v0",
     "sources": [("attn", "attn", "attn-v0")], "gate": [], "rule": "all", "change": "create(): attn_v0 on by default"},
    {"setting": "RD_CUDA_TC_HNORM (q/k norms in the QKV GEMM's epilogue)", "now": "on", "alt": "0",
     "sources": [("bench", "bench-qwen3-1.7b-tc", "bench-qwen3-1.7b-tc-nohnorm")],
     "gate": [], "rule": "all", "change": "create(): tc_hnorm off by default"},
    {"setting": "RD_CUDA_TC_ROUTE (MoE routing in the router GEMM)", "now": "on", "alt": "0",
     "sources": [("bench", "bench-moe-gemmtc", "bench-moe-gemmtc-noroute")],
     "gate": [], "rule": "all", "change": "create(): tc_route off by default"},
    {"setting": "RD_CUDA_TC_NORMADD (Gemma 3's post-norms)", "now": "on", "alt": "0",
     "sources": [("bench", "bench-gemma3-tc", "bench-gemma3-tc-normadd0")],
     "gate": [], "rule": "all", "change": "create(): tc_normadd off by default"},
    {"setting": "RD_CUDA_TC_LORA (LoRA terms in the GEMM epilogue)", "now": "on", "alt": "0",
     "sources": [("lora", "lora-tc", "lora-tc-unfused")], "gate": [], "rule": "all",
     "change": "create(): tc_lora off by default"},
    {"setting": "MoE small-batch fusions (CUDA-core experts)", "now": "on", "alt": "nofuse",
     "sources": [("moe", "moe-30b", [("default", "nofuse")], (1, 8))],
     "gate": [], "rule": "all", "change": "cuda_internal.h: lower MOE_SORT_ROUTES"},
    {"setting": "MoE fusions (tensor-core experts)", "now": "on", "alt": "nofuse",
     "sources": [("moe", "moe-30b", [("moetc", "moetc+nofuse")], (1, 8))],
     "gate": [], "rule": "all", "change": "cuda_moe_tc.cu: the fused combine off at small batches"},
    {"setting": "RD_CUDA_MOE (experts)", "now": "CUDA cores", "alt": "tc",
     "sources": [("bench", "bench-moe-gemmtc", "bench-moe-tc"), ("moe", "moe-30b", [("default", "moetc")],
                                                                 (1, 8, 64, 256, 512))],
     "gate": ["unit-moe-cuda"], "rule": "all", "change": "create(): moe_tc on by default"},
    {"setting": "RD_CUDA_FP8 (FP8 weights)", "now": "CUDA cores (k_gemm_fp8)", "alt": "tc",
     "sources": [("bench", "bench-1b-fp8", "bench-1b-fp8tc")],
     "gate": ["invariance-fp8tc"], "rule": "all", "change": "create(): fp8_tc on by default"},
    {"setting": "RD_CUDA_Q8 (Q8_0 files)", "now": "dequantized to bf16", "alt": "tc (held as Q8_0)",
     "sources": [("bench", "bench-1b-tc", "bench-1b-q8tc")],
     "gate": ["invariance-q8tc"], "rule": "noslower",
     "change": "create(): q8_tc on by default (half the weight memory where it is no slower)"},
    {"setting": "RD_CUDA_ACT (activation split)", "now": "split (hi + lo)", "alt": "bf16",
     "sources": [("gemm", "gemm-1b", [("tc", "tcbf16"), ("default", "bf16act")], (1, 32, 256))],
     "gate": [], "rule": "report",
     "change": "a numerics choice: weigh the speed against parity's bf16/mixed mismatch before changing it"},
]


def settle(d, res):
    """One default's verdict: the points, the alternative's time over the default's at each, the verdict. A
    variant behind a point that broke batch invariance fails the gate as a failed check stage does."""
    pts = [p for src in d["sources"] for p in points(res, src) if p[1] and p[2] is not None]
    ratios = [(lbl, round(alt / now, 3)) for lbl, now, alt, _ in pts]
    status = {s["stage"]: s.get("status") for s in res.get("stages", [])}
    bad_inv = {(g["stage"], g["variant"]) for g in res.get("gemm_invariance", []) if g["invariant"] is False}
    failed = [g for g in d["gate"] if status.get(g) in ("FAIL", "TIMEOUT", "ERROR")]
    failed += sorted({f"{st}:{v}" for p in pts for st, v in p[3] if (st, v) in bad_inv})
    wins = [x < 1 - MARGIN for _, x in ratios]
    losses = [x > 1 + MARGIN for _, x in ratios]
    if not ratios:
        verdict = "not measured"
    elif d["rule"] == "report":
        verdict = "report"
    elif failed:
        verdict = "keep (failed: " + ", ".join(failed) + ")"
    elif d["rule"] == "all":
        verdict = "change" if all(wins) else ("keep" if not any(wins) else "mixed")
    elif d["rule"] == "any":
        verdict = "change" if any(wins) else "keep"
    else:  # noslower
        verdict = "change" if not any(losses) else ("keep" if not any(wins) else "mixed")
    return {"setting": d["setting"], "now": d["now"], "alt": d["alt"], "rule": d["rule"], "ratios": ratios,
            "verdict": verdict, "change": d["change"]}


def defaults(res):
    return [settle(d, res) for d in DEFAULTS]


def fmt(x, nd=2):
    return "" if x is None else f"{x:.{nd}f}"


def variant_table(points, title, shape_cell):
    """Markdown lines: a row per (stage, shape_cell(point), rows), the points' variants across, each cell the
    time, the fraction of the copy bandwidth and the TFLOP/s."""
    variants = list(dict.fromkeys(g["variant"] for g in points))
    lines = [title, "", "| shape | rows | " + " | ".join(variants) + " |", "|---|---|" + "---|" * len(variants)]
    cells = {}
    for g in points:
        cells.setdefault((g["stage"], shape_cell(g), g["rows"]), {})[g["variant"]] = g
    for (stage, shape, r), per in cells.items():
        cs = []
        for v in variants:
            g = per.get(v)
            cs.append("" if not g else f"{fmt(g['us'], 1)} us, {fmt(g['x_copy'])}x, {fmt(g['tflops'], 1)} TF"
                      + ("" if g["invariant"] in (True, None) else " NOT INVARIANT"))
        lines.append(f"| {shape} | {r} | " + " | ".join(cs) + " |")
    return lines


def markdown(res):
    lines = []
    gpu = res.get("gpu") or res.get("describe") or "(no GPU named)"
    lines.append(f"GPU: {gpu}; copy bandwidth {fmt(res.get('copy_gbps'), 1)} GB/s"
                 + (f"; peak {res['peak_assumption']}" if res.get("peak_assumption") else ""))
    lines.append("")
    if res.get("partial"):
        lines.append(f"Cut short (a timeout or a fault; the rows before it kept): {', '.join(res['partial'])}")
        lines.append("")
    if res.get("targets"):
        lines.append("**Issue 48's targets**")
        lines.append("")
        lines.append("| target | value | bound | met | from |")
        lines.append("|---|---|---|---|---|")
        for x in res["targets"]:
            met = "not measured" if x["met"] is None else ("yes" if x["met"] else "NO")
            lines.append(f"| {x['target']} | {'' if x['value'] is None else x['value']} | {x['bound']} | {met} | "
                         f"{x['note']} |")
        lines.append("")
    if res.get("defaults"):
        lines.append(f"**Defaults the run settles** (time with the alternative / with the default, per point; "
                     f"\"change\" where the rule says the alternative wins by more than {MARGIN:.0%})")
        lines.append("")
        lines.append("| setting | default | alternative | rule | alternative / default | verdict | if changed |")
        lines.append("|---|---|---|---|---|---|---|")
        for x in res["defaults"]:
            rs = ", ".join(f"{lbl} {v:.2f}" for lbl, v in x["ratios"])
            lines.append(f"| {x['setting']} | {x['now']} | {x['alt']} | {x['rule']} | {rs} | {x['verdict']} | "
                         f"{x['change'] if x['verdict'] in ('change', 'mixed') else ''} |")
        lines.append("")
    if res["bench"]:
        batches = sorted({b["batch"] for b in res["bench"] if b["batch"] is not None})
        lines.append("**Decode step (ms) and its ratio to the roofline**")
        lines.append("")
        lines.append("| model | " + " | ".join(f"batch {b}" for b in batches) + " |")
        lines.append("|---|" + "---|" * len(batches))
        rows = {}
        for b in res["bench"]:
            name = b["model"] + (f" {b['label']}" if b["label"] else "")
            rows.setdefault((b["stage"], name), {})[b["batch"]] = b
        for (stage, name), per in rows.items():
            cells = []
            for bt in batches:
                b = per.get(bt)
                if not b or b["step_ms"] is None:
                    cells.append("")
                    continue
                c = f"{fmt(b['step_ms'], 3)} ({fmt(b['x_roofline'])}x)"
                if b.get("x_roofline_measured") is not None:
                    c += f" [{fmt(b['x_roofline_measured'])}x of {fmt(b.get('experts_per_layer_measured'), 1)} experts]"
                cells.append(c)
            lines.append(f"| {name} | " + " | ".join(cells) + " |")
        lines.append("")
    if res["gemm"]:
        def gemm_shape(g):
            dims = f"{g['out']}x{g['in']}"
            return g["shape"] + ("" if g["shape"] == dims else f" ({dims})")
        lines += variant_table(res["gemm"], "**GEMM (linear op): microseconds per call (inside a graph of calls "
                               "where the backend has graphs), weight GB/s as a fraction of the copy bandwidth, "
                               "TFLOP/s**", gemm_shape)
        bad = [f"{g['stage']}:{g['variant']}" for g in res["gemm_invariance"] if g["invariant"] is False]
        lines.append("")
        lines.append("Batch invariance of every variant (m-row results = rows alone, bit for bit): "
                     + ("PASS" if not bad else "FAIL: " + ", ".join(bad)))
        lines.append("")
    if res.get("moe"):
        lines += variant_table(res["moe"], "**MoE experts (moe_ffn alone, one layer): microseconds per call, the "
                               "touched experts' GB/s as a fraction of the copy bandwidth, TFLOP/s**",
                               lambda g: g["shape"])
        lines.append("")
    if res["attention"]:
        lines.append("**Attention at long context (one decode row per sequence)**")
        lines.append("")
        lines.append("| stage | heads | context | batch | us | KV GB/s | of copy bandwidth (target 0.70) |")
        lines.append("|---|---|---|---|---|---|---|")
        for a in res["attention"]:
            lines.append(f"| {a['stage']} | {a['shape']} ({a['n_heads']}/{a['n_kv_heads']} x {a['head_dim']}) | "
                         f"{a['ctx']} | {a['batch']} | {fmt(a['us'], 1)} | {fmt(a['gbps'], 0)} | {fmt(a['x_copy'])} |")
        lines.append("")
    if res.get("tis"):
        lines.append("**8-bit weights' importance-sampling cost** (the default model, bf16-sampled tokens scored on "
                     "the bf16 and the 8-bit load: mean K3 KL(bf16 || 8-bit), |dlogprob|)")
        lines.append("")
        lines.append("| stage | weights | RD_CUDA_FP8 | RD_CUDA_Q8 | tokens | mean K3 KL | mean abs dlogprob | max |")
        lines.append("|---|---|---|---|---|---|---|---|")
        for t in res["tis"]:
            k3v = t["mean_k3_kl"]
            lines.append(f"| {t['stage']} | {t.get('weights') or ''} | {t['rd_cuda_fp8'] or ''} | "
                         f"{t.get('rd_cuda_q8') or ''} | {t['tokens']} | "
                         f"{'' if k3v is None else f'{k3v:.2e}'} | {fmt(t['mean_abs_dlogprob'], 4)} | "
                         f"{fmt(t['max_abs_dlogprob'], 4)} |")
        lines.append("")
    if res.get("sampler"):
        stages = sorted({x["stage"] for x in res["sampler"]})
        lines.append("**Device sampler: ms per call of one draw / of 64 draws, per rule and form**")
        lines.append("")
        lines.append("| rule | " + " | ".join(stages) + " |")
        lines.append("|---|" + "---|" * len(stages))
        rules = []
        for x in res["sampler"]:
            if x["rule"] not in rules:
                rules.append(x["rule"])
        for r in rules:
            cells = []
            for st in stages:
                x = next((y for y in res["sampler"] if y["stage"] == st and y["rule"] == r), None)
                cells.append("" if x is None else f"{fmt(x['ms_one_draw'], 3)} / {fmt(x['ms_per_call'], 3)}")
            lines.append(f"| {r} | " + " | ".join(cells) + " |")
        lines.append("")
    if res.get("lora"):
        lines.append("**LoRA decode (rollout-lorabench): tokens/s, median of the reps, and the ratio to the base "
                     "model at the same batch**")
        lines.append("")
        lines.append("| stage | batch | adapters | tokens/s | ratio to base |")
        lines.append("|---|---|---|---|---|")
        for x in res["lora"]:
            lines.append(f"| {x['stage']} | {x['batch']} | {x['adapters']} | {fmt(x['tokens_per_s'], 1)} | "
                         f"{fmt(x['ratio_to_base'], 3)} |")
        lines.append("")
    if res["checks"]:
        lines.append("**Checks**: " + ", ".join(f"{c['stage']} {'PASS' if c['pass'] else 'FAIL'}"
                                                for c in res["checks"]))
        lines.append("")
    for p in res["ncu"]:
        top = sorted(p["kernels"], key=lambda k: -k.get("total_us", k["avg_us"]))[:12]
        lines.append(f"**{p['stage']}**: the kernels taking most GPU time (ncu over the whole run: the model's load, "
                     "the prefill and every decode step)")
        lines.append("")
        lines.append("| kernel | invocations | average us | total us |")
        lines.append("|---|---|---|---|")
        for k in top:
            lines.append(f"| {k['kernel'][:80]} | {k.get('invocations', '')} | {fmt(k['avg_us'], 2)} | "
                         f"{fmt(k.get('total_us'), 1)} |")
        lines.append("")
    return "\n".join(lines)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--logs", required=True, help="the stages' JSON and logs")
    ap.add_argument("--summary", help="run.sh's summary.json (GPU name, stage statuses)")
    ap.add_argument("--json", help="results file to write")
    ap.add_argument("--markdown", help="markdown tables to write (also printed)")
    a = ap.parse_args(argv)
    if not os.path.isdir(a.logs):
        print(f"gpu_results: {a.logs} is not a folder", file=sys.stderr)
        return 2
    summary = load(a.summary) if a.summary else None
    res = assemble(a.logs, summary)
    res["targets"] = targets(res)
    res["defaults"] = defaults(res)
    md = markdown(res)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=1)
            f.write("\n")
    if a.markdown:
        with open(a.markdown, "w") as f:
            f.write(md + "\n")
    print(md)
    print(f"gpu_results: {len(res['bench'])} decode rows, {len(res['gemm'])} GEMM points, "
          f"{len(res['attention'])} attention points, {len(res['ncu'])} profiles"
          + (f"; unreadable: {', '.join(res['unreadable'])}" if res["unreadable"] else "")
          + (f"; partial (cut by a timeout or a fault): {', '.join(res['partial'])}" if res["partial"] else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
