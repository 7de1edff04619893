"""Bad model files of every family: each is refused with a clear error that
names the key or tensor and what was expected, never a crash or a model that
loads anyway. Also run against the ASan/UBSan build by tests/run.sh.

The files are copies of the tiny family models (tests/gen_testdata.sh)
rewritten here with the `gguf` package: one key or tensor changed each."""
import json
import os
import shutil
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import BUILD, ROOT, TMP, case, main, run  # noqa: E402
from gguf_fast import GGUFReader  # noqa: E402  (the package's reader, its arrays read in one pass)

import gguf  # noqa: E402
from gguf import GGUFValueType as VT  # noqa: E402

DATA = os.environ.get("RD_TESTDATA", os.path.join(ROOT, "build", "testdata"))
LOGITS = os.path.join(BUILD, "rollout-logits")
WORK = tempfile.mkdtemp(prefix="rd-fambad-", dir=TMP)


def rewrite(src, dst, keys=None, drop_keys=(), tensors=None, drop_tensors=(), arch=None):
    """Copies GGUF src to dst with keys {name: (type, value)} set, some keys
    and tensors dropped and tensors {name: float32 array} replaced."""
    keys, tensors = dict(keys or {}), dict(tensors or {})
    r = GGUFReader(src)
    old_arch = r.fields["general.architecture"].contents()
    w = gguf.GGUFWriter(dst, arch or old_arch)
    for f in r.fields.values():
        if f.name.startswith("GGUF.") or f.name == "general.architecture" or f.name in drop_keys:
            continue
        if f.name in keys:
            t, v = keys.pop(f.name)
            w.add_key_value(f.name, v, t)
            continue
        if arch and f.name.startswith(old_arch + "."):
            name = arch + f.name[len(old_arch):]
        else:
            name = f.name
        sub = f.types[1] if f.types[0] == VT.ARRAY else None
        w.add_key_value(name, f.contents(), f.types[0], sub_type=sub)
    for k, (t, v) in keys.items():
        w.add_key_value(k, v, t)
    out = []
    for t in r.tensors:
        if t.name in drop_tensors:
            continue
        if t.name in tensors:
            a = np.ascontiguousarray(tensors[t.name], dtype=np.float32)
            w.add_tensor_info(t.name, a.shape, a.dtype, a.nbytes, gguf.GGMLQuantizationType.F32)
            out.append(a)
        else:
            w.add_tensor_info(t.name, t.data.shape, t.data.dtype, t.data.nbytes, t.tensor_type)
            out.append(t.data)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    for a in out:
        w.write_tensor_data(a)
    w.close()
    return dst


def tensor(src, name):
    return np.array(next(t.data for t in GGUFReader(src).tensors if t.name == name), dtype=np.float32)


def refused(path, *wants):
    """rollout-logits on path exits 1 with every fragment of wants in its message."""
    p = run([LOGITS, "--model", path, "--prompt-ids", "1,2,3", "--out", os.path.join(WORK, "x.f32")], check=False)
    assert p.returncode == 1, f"{path}: exit {p.returncode}: {p.stderr.strip()!r}"
    for want in wants:
        assert want in p.stderr, f"{path}: {p.stderr.strip()!r} lacks {want!r}"
    assert "AddressSanitizer" not in p.stderr and "runtime error" not in p.stderr, p.stderr


def src(name):
    return os.path.join(DATA, name + ".gguf")


def dst(tag):
    return os.path.join(WORK, tag + ".gguf")


@case
def unsupported_architecture_and_rope_scaling():
    refused(rewrite(src("tiny-f32"), dst("mamba"), arch="mamba"),
            "architecture 'mamba' is not supported", "llama, qwen2, qwen3")
    refused(rewrite(src("tiny-f32"), dst("yarn"), keys={"llama.rope.scaling.type": (VT.STRING, "yarn"),
                                                       "llama.rope.scaling.factor": (VT.FLOAT32, 4.0)}),
            "llama.rope.scaling.type is \"yarn\"", "supported are")
    refused(rewrite(src("tiny-llama3"), dst("freqs-len"),
                    tensors={"rope_freqs.weight": tensor(src("tiny-llama3"), "rope_freqs.weight")[:5]}),
            "rope_freqs.weight", "head_dim / 2 = 8")
    refused(rewrite(src("tiny-llama3"), dst("freqs-zero"),
                    tensors={"rope_freqs.weight": np.zeros(8, np.float32)}),
            "rope_freqs.weight[0] is 0", "positive divisor")
    # the copy itself loads: the refusals above are the edits, not the rewriter
    ok = rewrite(src("tiny-llama3"), dst("copy"))
    p = run([LOGITS, "--model", ok, "--prompt-ids", "1,2,3", "--out", os.path.join(WORK, "x.f32")])
    assert p.returncode == 0


@case
def qwen3_without_q_norm_and_bad_head_dim():
    refused(rewrite(src("tiny-qwen3"), dst("no-qnorm"), drop_tensors={"blk.0.attn_q_norm.weight"}),
            "tensor 'blk.0.attn_q_norm.weight' missing")
    refused(rewrite(src("tiny-qwen3"), dst("qnorm-len"),
                    tensors={"blk.1.attn_k_norm.weight": np.ones(30, np.float32)}),
            "blk.1.attn_k_norm.weight", "expected [32, 1]")
    # key_length 24: 4 heads x 24 does not match the q projection's 128 rows
    refused(rewrite(src("tiny-qwen3"), dst("hd24"), keys={"qwen3.attention.key_length": (VT.UINT32, 24),
                                                         "qwen3.attention.value_length": (VT.UINT32, 24)}),
            "blk.0.attn_q.weight", "expected [64, 96]")
    refused(rewrite(src("tiny-qwen3"), dst("hd-odd"), keys={"qwen3.attention.key_length": (VT.UINT32, 31),
                                                           "qwen3.attention.value_length": (VT.UINT32, 31)}),
            "head_dim 31", "even")
    refused(rewrite(src("tiny-qwen3"), dst("vl"), keys={"qwen3.attention.value_length": (VT.UINT32, 16)}),
            "value_length 16 != key_length 32")


@case
def gemma3_window_and_norms():
    refused(rewrite(src("tiny-gemma3"), dst("win0"), keys={"gemma3.attention.sliding_window": (VT.UINT32, 0)}),
            "gemma3.attention.sliding_window is 0", "positive sliding window")
    refused(rewrite(src("tiny-gemma3"), dst("nowin"), drop_keys={"gemma3.attention.sliding_window"}),
            "gemma3.attention.sliding_window missing")
    refused(rewrite(src("tiny-gemma3"), dst("softcap"),
                    keys={"gemma3.final_logit_softcapping": (VT.FLOAT32, 30.0)}),
            "final_logit_softcapping", "not supported")
    refused(rewrite(src("tiny-gemma3"), dst("gnorm-len"),
                    tensors={"blk.2.post_ffw_norm.weight": np.ones(60, np.float32)}),
            "blk.2.post_ffw_norm.weight", "expected [64, 1]")
    refused(rewrite(src("tiny-gemma3"), dst("no-post"), drop_tensors={"blk.3.post_attention_norm.weight"}),
            "tensor 'blk.3.post_attention_norm.weight' missing")


@case
def qwen2_bias_of_the_wrong_length():
    refused(rewrite(src("tiny-qwen2"), dst("bias-len"),
                    tensors={"blk.1.attn_k.bias": tensor(src("tiny-qwen2"), "blk.1.attn_k.bias")[:30]}),
            "blk.1.attn_k.bias", "expected [32, 1]")
    refused(rewrite(src("tiny-qwen2"), dst("no-bias"), drop_tensors={"blk.0.attn_v.bias"}),
            "tensor 'blk.0.attn_v.bias' missing")


@case
def hf_folders_of_the_families():
    def folder(name, tag, edit):
        d = os.path.join(WORK, tag)
        shutil.copytree(os.path.join(DATA, name + ".hf"), d)
        cfg = json.load(open(os.path.join(d, "config.json")))
        edit(cfg)
        json.dump(cfg, open(os.path.join(d, "config.json"), "w"))
        return d
    refused(folder("tiny-qwen3", "hf-hd24", lambda c: c.update(head_dim=24)),
            "model.layers.0.self_attn.q_proj.weight", "expected [96, 64]")
    refused(folder("tiny-qwen2", "hf-swa", lambda c: c.update(use_sliding_window=True)), "use_sliding_window")
    refused(folder("tiny-llama3", "hf-yarn", lambda c: c.update(rope_scaling={"rope_type": "yarn", "factor": 4})),
            "rope_scaling type \"yarn\"")
    refused(folder("tiny-llama3", "hf-l3-missing",
                   lambda c: c["rope_scaling"].pop("original_max_position_embeddings")),
            "original_max_position_embeddings")
    refused(folder("tiny-qwen3", "hf-bias", lambda c: c.update(attention_bias=True)), "attention_bias")


if __name__ == "__main__":
    main()
