"""Softmax attention through torch's fused kernels (F.scaled_dot_product_attention, SDPA).

On CUDA, SDPA picks a kernel per call: cuDNN, flash, memory-efficient, and where none accepts the call the math
kernel, which materialises the (B, nh, T, S) scores in fp32, for the forward and again for the backward. Flash
takes no mask and memory-efficient no GQA (torch 2.13), so a boolean mask passed with enable_gqa always falls to
math: `attend` passes a mask only where padding needs one, and then only with equal head counts (`layout`). The
rules and the kernel each layout takes: docs/qwen.md, "Which fused kernel a call takes". run/attention_kernels.py
restates them over a call's shapes, dtypes and strides, so the CPU tests hold every call of the model to them.

Shape letters: B batch, nh query heads, nkv key/value heads, r = nh / nkv, T queries, S keys, hd head dim.
"""

import contextlib

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

HALF = (torch.float16, torch.bfloat16)
# cuDNN's attention can return NaN gradients for masked calls on H100/H200 with torch 2.13 (key lengths 64 mod 128):
# a masked call with several queries (a padded training micro-batch, a padded prefill) runs on the other kernels
# until a GPU run measures cuDNN's. Decode (one query) and unmasked calls keep torch's own choice.
WITHOUT_CUDNN = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]


def kernel_choice(q, mask):
    """The context `attend` calls SDPA in: without cuDNN for a masked call of several queries on CUDA; torch's
    default otherwise (a no-op on the CPU, which has no cuDNN attention)."""
    if mask is not None and q.shape[2] > 1 and q.device.type == "cuda":
        return sdpa_kernel(WITHOUT_CUDNN)
    return contextlib.nullcontext()


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
        raise ValueError(f"mask=None needs T == S or T == 1, got T={T}, S={S}; pass a mask")
    causal = mask is None and T > 1
    how = layout(nh, nkv, T, S, mask is not None, q.dtype)
    if how == "fold":  # query head j*r + i uses K/V head j: row i of head j
        y = F.scaled_dot_product_attention(q.reshape(B, nkv, nh // nkv, hd), k, v, attn_mask=mask)
        return y.reshape(B, nh, 1, hd)
    if how == "expand":
        k, v = k.repeat_interleave(nh // nkv, dim=1), v.repeat_interleave(nh // nkv, dim=1)   # (B, nh, S, hd)
    with kernel_choice(q, mask):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal, enable_gqa=how == "gqa")
