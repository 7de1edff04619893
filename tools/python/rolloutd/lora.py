"""LoRA adapters on the learner's side: a PEFT folder read into arrays, and
the arguments of an adapter push (PROTOCOL.md §10.15).

A PEFT folder holds adapter_config.json and adapter_model.safetensors; a
safetensors file is a u64 little-endian header length, the header (JSON:
name -> dtype, shape, data_offsets) and the data. Only NumPy is needed: bf16
tensors come back as uint16 arrays of their bit patterns, which is what a push
sends as bf16."""
import json
import os
import struct

import numpy as np

PREFIX = "base_model.model."    # PEFT's wrapper around the model's module names
_DTYPES = {"F32": np.float32, "F16": np.float16, "BF16": np.uint16}


def read_safetensors(path):
    """{name: array} of a safetensors file (F32, F16, BF16 as uint16 bits)."""
    with open(path, "rb") as f:
        raw = f.read()
    if len(raw) < 8:
        raise ValueError(f"{path}: not a safetensors file ({len(raw)} bytes)")
    (n,) = struct.unpack_from("<Q", raw, 0)
    if n > len(raw) - 8:
        raise ValueError(f"{path}: header of {n} bytes in a {len(raw)}-byte file")
    header = json.loads(raw[8:8 + n])
    data = memoryview(raw)[8 + n:]
    out = {}
    for name, t in header.items():
        if name == "__metadata__":
            continue
        if t["dtype"] not in _DTYPES:
            raise ValueError(f"{path}: tensor {name!r} is {t['dtype']}; expected F32, F16 or BF16")
        b, e = t["data_offsets"]
        out[name] = np.frombuffer(data[b:e], dtype=np.dtype(_DTYPES[t["dtype"]]).newbyteorder("<")).reshape(
            t["shape"]).copy()
    return out


def read_peft(folder):
    """(adapter_config.json as a dict, {name: array}) of a PEFT folder."""
    with open(os.path.join(folder, "adapter_config.json")) as f:
        config = json.load(f)
    return config, read_safetensors(os.path.join(folder, "adapter_model.safetensors"))


def adapter_push_args(name, tensors, alpha=None, rank=None, rslora=None):
    """(tensors by PEFT name, the ADAPTER_BEGIN terms {name, rank, alpha, rslora}) of a push.
    tensors: a PEFT folder, or PEFT's tensors by name (a dict or (name, array) pairs; the
    "base_model.model." prefix is added where missing)."""
    if not isinstance(name, str) or not 1 <= len(name.encode()) <= 127:
        raise ValueError(f"adapter name {name!r}; expected 1..127 bytes")
    config = {}
    if isinstance(tensors, (str, os.PathLike)):
        config, tensors = read_peft(tensors)
        if config.get("use_dora") or config.get("modules_to_save"):
            raise ValueError(f"{name}: DoRA and modules_to_save adapters are not served")
    items = list(tensors.items()) if hasattr(tensors, "items") else list(tensors)
    if not items:
        raise ValueError(f"adapter {name!r}: no tensors")
    items = [(k if k.startswith(PREFIX) else PREFIX + k, v) for k, v in items]
    if rank is None:
        rank = config.get("r")
    if rank is None:
        a = next((v for k, v in items if k.endswith(".lora_A.weight")), None)
        if a is None:
            raise ValueError(f"adapter {name!r}: no lora_A tensor to read the rank from")
        rank = int(tuple(a.shape)[0])
    if alpha is None:
        alpha = config.get("lora_alpha")
    if alpha is None:
        raise ValueError(f"adapter {name!r}: lora_alpha is needed (the scale is alpha / rank)")
    if rslora is None:
        rslora = bool(config.get("use_rslora", False))
    return items, {"name": name, "rank": int(rank), "alpha": float(alpha), "rslora": bool(rslora)}
