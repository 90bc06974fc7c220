"""Which CUDA kernel torch's F.scaled_dot_product_attention takes for a call, decided on the CPU from the call's
shapes, dtypes and strides: the rules of torch 2.13 (aten/src/ATen/native/transformers/cuda/sdp_utils.cpp) that
minigrpo/attention.py arranges its calls around (its docstring lists them). `Recorder` collects the calls a piece of
code makes, `cuda_kernel` names the kernel each takes: the tests hold every attention call of the model to the
fused kernels, and the memory plan counts what the kernel of a training call keeps for backward.

Dense inputs, no dropout, Ampere or Hopper.
"""

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from minigrpo.attention import HALF


@dataclass
class Call:
    """What the kernel choice reads from one scaled_dot_product_attention call."""
    q: tuple             # (shape, stride, storage offset) of query, key and value
    k: tuple
    v: tuple
    dtype: torch.dtype   # of q (k and v must match)
    same_dtype: bool
    mask: tuple | None   # (shape, last-dim stride) of attn_mask
    is_causal: bool
    enable_gqa: bool

    @classmethod
    def of(cls, q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
        meta = lambda t: (tuple(t.shape), tuple(t.stride()), t.storage_offset())
        mask = None if attn_mask is None else (tuple(attn_mask.shape), attn_mask.stride(-1))
        if dropout_p:
            raise ValueError("dropout is not modelled (no caller uses it)")
        return cls(meta(q), meta(k), meta(v), q.dtype, q.dtype == k.dtype == v.dtype, mask, bool(is_causal),
                   bool(enable_gqa))


def _dense_ok(c):
    """Checks both fused kernels make: 4-D, equal batch sizes, no empty sequence, last dims contiguous."""
    (qs, qst, _), (ks, kst, _), (vs, vst, _) = c.q, c.k, c.v
    if not (len(qs) == len(ks) == len(vs) == 4) or not (qs[0] == ks[0] == vs[0]) or 0 in (qs[2], ks[2]):
        return False
    return all(st[-1] == 1 or s[-1] == 1 for s, st in ((qs, qst), (ks, kst), (vs, vst)))


def can_flash(c):
    (qs, _, _), (ks, _, _), (vs, _, _) = c.q, c.k, c.v
    heads = qs[1] == ks[1] == vs[1] or (c.enable_gqa and ks[1] == vs[1] and qs[1] % ks[1] == 0)
    return (_dense_ok(c) and c.mask is None and c.dtype in HALF and c.same_dtype and heads
            and qs[3] == ks[3] == vs[3] <= 256 and (not c.is_causal or qs[2] == ks[2]))


def can_mem_efficient(c):
    (qs, _, qo), (ks, _, ko), (vs, _, vo) = c.q, c.k, c.v
    if c.dtype not in HALF + (torch.float32,) or not c.same_dtype or not _dense_ok(c):
        return False
    align = 8 if c.dtype in HALF else 4   # elements: 16 bytes for fp16/bf16, on sm80 and newer
    return (qs[1] == ks[1] == vs[1] and qs[3] == ks[3] and qs[3] % align == 0 and vs[3] % align == 0
            and all(o % align == 0 for o in (qo, ko, vo)) and (c.mask is None or c.mask[1] == 1))


def cuda_kernel(c):
    """"flash", "efficient" or "math": the kernel torch's fallback chain gives the call (cuDNN, where torch
    prefers it and it accepts, comes before both fused ones; "math" means neither fused kernel accepts)."""
    return "flash" if can_flash(c) else "efficient" if can_mem_efficient(c) else "math"


class Recorder(TorchFunctionMode):
    """Records every F.scaled_dot_product_attention call made under it as a Call in `calls`. With skip=True the
    call is not run (a zero output of its shape is returned): the arguments of a forward at full length, without
    its cost."""

    def __init__(self, skip=False):
        super().__init__()
        self.calls, self.skip = [], skip

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is F.scaled_dot_product_attention:
            self.calls.append(Call.of(*args, **kwargs))
            if self.skip:
                q, v = args[0], args[2]
                return q.new_zeros(q.shape[:-1] + v.shape[-1:])
        return func(*args, **kwargs)

    def kernels(self):
        return [cuda_kernel(c) for c in self.calls]
