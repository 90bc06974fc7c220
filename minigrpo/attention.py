"""Softmax attention through torch's fused kernels, and which CUDA kernel a call takes.

On CUDA, F.scaled_dot_product_attention picks a kernel per call: cuDNN (first on H100/H200 when torch prefers it),
then flash, then memory-efficient, and where none accepts the call the math kernel, which materialises the
(B, nh, T, S) scores in fp32, for the forward and again for the backward. The rules of torch 2.13
(aten/src/ATen/native/transformers/cuda/sdp_utils.cpp) that decide our calls:

  flash             no mask; fp16/bf16; q, k, v head dims equal and <= 256; GQA (enable_gqa: nh a multiple of
                    nkv); is_causal only with as many queries as keys (its causal mask is top-left aligned)
  memory-efficient  a mask allowed; fp32 too; q, k, v with EQUAL head counts (no GQA in 2.13); head dims and
                    storage offsets multiples of 8 elements (fp16/bf16) or 4 (fp32); last dims of q, k, v and the
                    mask contiguous

A boolean mask passed with enable_gqa therefore always falls to math. So `attend`
never passes a mask it does not need, and passes a needed one only with equal head counts:

  no padding, T == S     is_causal, enable_gqa: flash (training and prefill of unpadded rows)
  no padding, T == 1     no mask at all (one new token attends to every slot), enable_gqa: flash (decode)
  a mask, T == 1         the r = nh / nkv query heads that share a K/V head become r query rows of that head:
                         q (B, nkv, r, hd) against k, v (B, nkv, S, hd), the (B, 1, 1, S) mask broadcast over the
                         rows; equal head counts with no copy of K/V: memory-efficient (padded or static decode)
  a mask, T > 1          K and V expanded to nh heads (a copy): memory-efficient (training, prefill with padding)
  fp32 without a mask    flash has no fp32: K/V expanded when nh != nkv, no mask: memory-efficient

`cuda_kernel` restates those rules over a call's shapes, dtypes and strides (no GPU needed, so the CPU tests can
hold every call of the model to them), and `Recorder` collects the calls a piece of code makes.

Shape letters: B batch, nh query heads, nkv key/value heads, r = nh / nkv, T queries, S keys, hd head dim.
"""

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

HALF = (torch.float16, torch.bfloat16)


def layout(nh, nkv, T, S, masked, dtype):
    """How `attend` calls SDPA: "gqa" (no mask, enable_gqa), "plain" (equal heads as given), "fold" (query heads
    folded onto their K/V head) or "expand" (K/V repeated to nh heads)."""
    if nh == nkv:
        return "plain"
    if not masked:
        return "gqa" if dtype in HALF else "expand"
    return "fold" if T == 1 else "expand"


def attend(q, k, v, mask):
    """q (B, nh, T, hd), k, v (B, nkv, S, hd) -> (B, nh, T, hd). mask: (B, 1, T, S) bool (True = may attend),
    or None = causal with the last query on the last key, which needs T == S or T == 1 (Qwen.hidden passes None
    only then). The math is the same in every layout; only the kernel that can run it changes."""
    B, nh, T, hd = q.shape
    nkv, S = k.shape[1], k.shape[2]
    if mask is None and T not in (1, S):
        raise ValueError(f"attend: mask=None needs T == S or T == 1, got T={T}, S={S}; pass a mask")
    causal = mask is None and T > 1
    how = layout(nh, nkv, T, S, mask is not None, q.dtype)
    if how == "fold":  # query head j*r + i uses K/V head j: row i of head j
        y = F.scaled_dot_product_attention(q.reshape(B, nkv, nh // nkv, hd), k, v, attn_mask=mask)
        return y.reshape(B, nh, 1, hd)
    if how == "expand":
        k, v = k.repeat_interleave(nh // nkv, dim=1), v.repeat_interleave(nh // nkv, dim=1)   # (B, nh, S, hd)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal, enable_gqa=how == "gqa")


# ----------------------------------------------------------------------------------------------------------------
# Which CUDA kernel a call takes (torch 2.13, dense inputs, no dropout, Ampere or Hopper)


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
            raise ValueError("attention.Call: dropout is not modelled (no caller uses it)")
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
