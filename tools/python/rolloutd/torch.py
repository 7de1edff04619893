"""rolloutd.torch: a PyTorch module whose forward is rolloutd's own (issue 47), so a learner's
log-probs equal the daemon's bit for bit at every weight version.

    import rolloutd.torch as rt
    policy = rt.from_pretrained("ckpt/", dtype=torch.float32)   # an HF folder or a rolloutd export
    lp = policy.token_logprobs([prompt + completion, ...])      # [len - 1] per sequence, differentiable
    loss = -(adv * lp[0][n_prompt - 1:]).sum(); loss.backward(); opt.step()
    pool.push_tensors(policy.engine_state(), version=step)      # the daemons serve what the module holds

How it is made:
- the values come from rolloutd's engine in this process (build/librdtorch.so, client/rd_torch.h
  through ctypes): token_logprobs by the engine's scoring path, the bits the daemon's sampler gives
  a token; forward(input_ids) by the runner's prefill (its logits). The engine holds the module's
  parameters in their dtype (fp32, f16 or bf16, served as pushed), copied in whenever an optimizer
  step (or anything else) changed them, as a weight push would;
- the gradients come from PyTorch: backward runs the model again in transformers (the module's own
  parameters, `policy.hf`) and differentiates that (fp32 for an fp32 module), like activation
  checkpointing: the ops' standard gradients at the standard forward's activations, which differ
  from the engine's by fp32 rounding (~1e-5 relative).
A training step thus costs the engine's forward plus transformers' forward and backward."""
import ctypes
import json
import os

import numpy as np
import torch

_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
_lib = None
_DTYPES = {torch.float32: 0, torch.float16: 1, torch.bfloat16: 2}


def library(path=None):
    """build/librdtorch.so (or RD_TORCH_LIB), loaded once."""
    global _lib
    if _lib is not None:
        return _lib
    path = path or os.environ.get("RD_TORCH_LIB") or os.path.join(_ROOT, "build", "librdtorch.so")
    lib = ctypes.CDLL(path)
    vp, i32 = ctypes.c_void_p, ctypes.c_int32
    lib.rdt_open.restype, lib.rdt_open.argtypes = vp, [ctypes.c_char_p, i32]
    lib.rdt_close.restype, lib.rdt_close.argtypes = None, [vp]
    lib.rdt_error.restype, lib.rdt_error.argtypes = ctypes.c_char_p, []
    lib.rdt_vocab.restype, lib.rdt_vocab.argtypes = i32, [vp]
    lib.rdt_set_weights.restype = ctypes.c_int
    lib.rdt_set_weights.argtypes = [vp, i32, vp, vp, vp, vp, vp, ctypes.c_uint64]
    lib.rdt_token_logprobs.restype, lib.rdt_token_logprobs.argtypes = ctypes.c_int, [vp, vp, vp, i32, vp]
    lib.rdt_logits.restype, lib.rdt_logits.argtypes = ctypes.c_int, [vp, vp, i32, vp]
    _lib = lib
    return lib


class EngineError(RuntimeError):
    pass


def _check(rc, what):
    if rc != 0:
        raise EngineError(f"{what}: {library().rdt_error().decode(errors='replace')}")


class _Exact(torch.autograd.Function):
    """The engine's values forward; transformers' gradients backward (see the module's docstring)."""

    @staticmethod
    def forward(ctx, module, kind, seqs, *params):
        ctx.module, ctx.kind, ctx.seqs = module, kind, seqs
        return module._engine(kind, seqs)

    @staticmethod
    def backward(ctx, grad):
        module, seqs = ctx.module, ctx.seqs
        params = [p for p in module.hf.parameters() if p.requires_grad]
        with torch.enable_grad():
            ref = module._reference(ctx.kind, seqs)
            grads = torch.autograd.grad(ref, params, grad, allow_unused=True)
        return (None, None, None, *grads)


class Module(torch.nn.Module):
    """A causal LM whose outputs are rolloutd's (see the module docstring). hf: the transformers model that
    holds the parameters and computes the gradients; its parameters are this module's."""

    def __init__(self, hf, path, threads=0):
        super().__init__()
        self.hf = hf
        self._h = library().rdt_open(os.fsencode(path), int(threads))
        if not self._h:
            raise EngineError(f"rdt_open {path}: {library().rdt_error().decode(errors='replace')}")
        self.vocab = library().rdt_vocab(self._h)
        self.weight_version = 0     # bumped at each copy of the parameters into the engine
        self._synced = None

    def __del__(self):
        h, self._h = getattr(self, "_h", None), None
        if h and _lib is not None:
            _lib.rdt_close(h)

    def named_parameters(self, prefix="", recurse=True, remove_duplicate=True):
        """The parameters under their HF names (model.layers.0.self_attn.q_proj.weight, ...): what a push
        carries, so pool.push_tensors(policy.named_parameters(), version) serves what the module holds."""
        return self.hf.named_parameters(prefix=prefix, recurse=recurse, remove_duplicate=remove_duplicate)

    # ---- the engine side ----

    def _state(self):
        """(HF name, tensor) of every parameter as the engine names its weights: transformers 5 keeps a
        mixture-of-experts layer's experts fused (mlp.experts.gate_up_proj [E, 2F, D], down_proj [E, D, F]);
        the engine takes one tensor per expert (mlp.experts.e.{gate,up,down}_proj.weight), views of them."""
        out = []
        for n, p in self.hf.named_parameters():
            if n.endswith("mlp.experts.gate_up_proj") and p.dim() == 3:
                base, f = n[:-len("gate_up_proj")], p.shape[1] // 2
                for e in range(p.shape[0]):
                    out += [(f"{base}{e}.gate_proj.weight", p[e, :f]), (f"{base}{e}.up_proj.weight", p[e, f:])]
            elif n.endswith("mlp.experts.down_proj") and p.dim() == 3:
                base = n[:-len("down_proj")]
                out += [(f"{base}{e}.down_proj.weight", p[e]) for e in range(p.shape[0])]
            else:
                out.append((n, p))
        return out

    def engine_state(self):
        """The parameters under the names a push carries (experts one tensor each): push these to the
        daemons, pool.push_tensors(policy.engine_state(), version)."""
        return self._state()

    def sync(self):
        """Copies the parameters into the engine if any changed since the last copy (an optimizer step
        bumps their version counters); the forward calls it."""
        params = list(self.hf.parameters())
        key = tuple((p.data_ptr(), p._version, p.dtype) for p in params)
        if key == self._synced:
            return False
        host = [(n, p.detach().to("cpu").contiguous()) for n, p in self._state()]
        n = len(host)
        names = (ctypes.c_char_p * n)(*[k.encode() for k, _ in host])
        ptrs = (ctypes.c_void_p * n)(*[t.data_ptr() for _, t in host])
        dt = np.array([_DTYPES[t.dtype] for _, t in host], dtype=np.int32)
        shapes = np.zeros((n, 4), dtype=np.int64)
        ndim = np.array([t.dim() for _, t in host], dtype=np.int32)
        for i, (_, t) in enumerate(host):
            shapes[i, :t.dim()] = t.shape
        _check(library().rdt_set_weights(self._h, n, ctypes.cast(names, ctypes.c_void_p),
                                         ctypes.cast(ptrs, ctypes.c_void_p), dt.ctypes.data, shapes.ctypes.data,
                                         ndim.ctypes.data, self.weight_version + 1), "rdt_set_weights")
        self.weight_version += 1
        self._synced = key
        return True

    def _engine(self, kind, seqs):
        self.sync()
        if kind == "logprobs":
            lens = np.array([len(s) for s in seqs], dtype=np.int32)
            ids = np.ascontiguousarray(np.concatenate(seqs).astype(np.int32))
            out = np.empty(int(lens.sum()) - len(seqs), dtype=np.float32)
            _check(library().rdt_token_logprobs(self._h, ids.ctypes.data, lens.ctypes.data, len(seqs),
                                                out.ctypes.data), "rdt_token_logprobs")
            return torch.from_numpy(out)
        outs = []
        for s in seqs:
            ids = np.ascontiguousarray(s, dtype=np.int32)
            z = np.empty((len(s), self.vocab), dtype=np.float32)
            _check(library().rdt_logits(self._h, ids.ctypes.data, len(s), z.ctypes.data), "rdt_logits")
            outs.append(torch.from_numpy(z))
        return torch.stack(outs)

    # ---- the PyTorch side (backward) ----

    def _reference(self, kind, seqs):
        """transformers' forward on the same tokens, right-padded into one batch (causal: the padding
        follows every real position, so it changes none of them)."""
        T = max(len(s) for s in seqs)
        ids = torch.zeros((len(seqs), T), dtype=torch.long)
        for b, s in enumerate(seqs):
            ids[b, :len(s)] = torch.as_tensor(s, dtype=torch.long)
        logits = self.hf(ids).logits.float()
        if kind == "logits":
            return logits
        lp = torch.log_softmax(logits[:, :-1], dim=-1).gather(-1, ids[:, 1:, None]).squeeze(-1)
        return torch.cat([lp[b, :len(s) - 1] for b, s in enumerate(seqs)])

    # ---- the API ----

    @staticmethod
    def _seqs(input_ids):
        if isinstance(input_ids, torch.Tensor):
            a = input_ids.detach().cpu().numpy()
            return [a] if a.ndim == 1 else list(a)
        return [np.asarray(s.detach().cpu().numpy() if isinstance(s, torch.Tensor) else s) for s in input_ids]

    def _params(self):
        return [p for p in self.hf.parameters() if p.requires_grad]

    def forward(self, input_ids):
        """Logits [B, T, vocab] (or [T, vocab] for one 1-D sequence; equal lengths) as the engine computes
        them, differentiable."""
        seqs = self._seqs(input_ids)
        if len({len(s) for s in seqs}) != 1:
            raise ValueError("forward: sequences of one length (token_logprobs takes any lengths)")
        out = _Exact.apply(self, "logits", seqs, *self._params())
        return out[0] if isinstance(input_ids, torch.Tensor) and input_ids.dim() == 1 else out

    def token_logprobs(self, input_ids):
        """The log-prob of each token given the ones before it, differentiable: for a 2-D tensor [B, T]
        a [B, T - 1] tensor, for a 1-D one [T - 1], for a list of sequences (any lengths) a list."""
        seqs = self._seqs(input_ids)
        if any(len(s) < 2 for s in seqs):
            raise ValueError("token_logprobs: every sequence needs at least 2 tokens")
        flat = _Exact.apply(self, "logprobs", seqs, *self._params())
        parts = list(torch.split(flat, [len(s) - 1 for s in seqs]))
        if isinstance(input_ids, torch.Tensor):
            return parts[0] if input_ids.dim() == 1 else torch.stack(parts)
        return parts


def from_pretrained(path, dtype=torch.float32, threads=0):
    """The module for an HF folder or a rolloutd export (config.json + safetensors): transformers loads
    the parameters in dtype, the engine is opened on the same folder and then holds them as they are."""
    from transformers import AutoModelForCausalLM
    with open(os.path.join(path, "config.json")) as f:
        json.load(f)    # a clear error for a folder that is not a checkpoint
    hf = AutoModelForCausalLM.from_pretrained(path, dtype=dtype)
    hf.train(False)     # no dropout: the engine has none
    return Module(hf, path, threads)
