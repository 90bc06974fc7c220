"""Bytes the backward of one Gated DeltaNet layer makes: the chunk loop as it is vs the indexed loop it replaced.

    python bench/deltanet_backward.py                    # Qwen3.5-4B shapes, B=1, T=1024 and 3072, fp32 on the CPU
    python bench/deltanet_backward.py --lengths 2944     # any lengths
    python bench/deltanet_backward.py --heads 8          # fewer value heads (and key heads in proportion)

The indexed loop took chunk n as U[:, :, n]; the backward of an index is a zero tensor of the whole (B, h, N, ...)
size with that chunk's gradient in it, so every chunk wrote full-size gradients for each tensor the loop slices
(bytes ~ N^2). chunked_delta_rule takes the chunks with unbind, whose backward stacks the chunk gradients once.
`indexed_delta_rule` is the old formulation, kept here as the anchor; both run in this process, one after the
other, on the same inputs.

"Bytes made" adds up every tensor an op creates during backward (outputs that share no storage with the op's
inputs), a TorchDispatchMode count; it is what the backward writes, not its peak. Two rows per length:
  rule    chunked_delta_rule alone on (B, nv, T, dk) fp32 inputs, as GatedDeltaNet calls it
  layer   the whole GatedDeltaNet module (projections, conv, norms; random fp32 weights), gradient of x and weights

Measured on the shared 2-core CPU box (fp32, full width: nk=16, nv=32, dk=dv=128, H=2560, B=1; the default
lengths plus 2944, about 25 minutes, nearly all of it the indexed loop's backward):
    T=1024  rule    indexed   2.99 GiB  unbind   0.88 GiB   3.4x fewer
    T=1024  layer   indexed   3.62 GiB  unbind   1.54 GiB   2.4x fewer
    T=2944  rule    indexed  20.75 GiB  unbind   2.53 GiB   8.2x fewer
    T=2944  layer   indexed  22.30 GiB  unbind   4.17 GiB   5.4x fewer
    T=3072  rule    indexed  22.50 GiB  unbind   2.64 GiB   8.5x fewer
    T=3072  layer   indexed  24.11 GiB  unbind   4.34 GiB   5.6x fewer
From 1024 to 3072 tokens (x3) the unbind rows grow x3.0 (rule) and x2.8 (layer), the indexed ones x7.5 and x6.7.
"""

import argparse
import os
import sys

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)  # run from anywhere
sys.path.insert(0, os.path.join(ROOT, "bench"))

from shapes import hf_config  # noqa: E402

from minigrpo import deltanet  # noqa: E402
from minigrpo.pretrained import QwenConfig  # noqa: E402

GiB = 1024 ** 3


def indexed_delta_rule(q, k, v, g, beta, state, chunk=64):
    """chunked_delta_rule as it was, chunk n taken by indexing (U[:, :, n]): the anchor. The chunk terms are the
    library's own, so only the loop differs (tests/model/test_deltanet.py holds the two to the same bits)."""
    T, dv = k.shape[2], v.shape[-1]
    U, W, q_in, qk, k_out, gam_last = deltanet.chunk_terms(q, k, v, g, beta, chunk)
    S = state
    out = []
    for n in range(U.shape[2]):
        delta = U[:, :, n] - W[:, :, n] @ S
        out.append(q_in[:, :, n] @ S + qk[:, :, n] @ delta)
        S = S * gam_last[:, :, n].exp() + k_out[:, :, n].mT @ delta
    B, h, N = U.shape[:3]
    o = torch.stack(out, dim=2).reshape(B, h, N * chunk, dv)[:, :, :T]
    return o, S


class BytesMade(TorchDispatchMode):
    """Adds up the bytes of every tensor an op makes: outputs that share no storage with the op's inputs (views
    and in-place results are not new memory)."""

    def __init__(self):
        super().__init__()
        self.bytes = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        given = {t.untyped_storage().data_ptr() for t in tree_flatten((args, kwargs))[0]
                 if isinstance(t, torch.Tensor)}
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor) and t.untyped_storage().data_ptr() not in given:
                self.bytes += t.numel() * t.element_size()
        return out


def backward_bytes(forward):
    """Bytes made by the backward of forward()'s outputs, summed."""
    loss = sum(y.sum() for y in forward())
    with BytesMade() as made:
        loss.backward()
    return made.bytes


def rule_inputs(cfg, B, T, seed=0):
    gen = torch.Generator().manual_seed(seed)
    h, dk, dv = cfg.linear_num_value_heads, cfg.linear_key_head_dim, cfg.linear_value_head_dim
    q = deltanet.l2norm(torch.randn(B, h, T, dk, generator=gen)) * dk ** -0.5
    k = deltanet.l2norm(torch.randn(B, h, T, dk, generator=gen))
    v = torch.randn(B, h, T, dv, generator=gen)
    g = -torch.rand(B, h, T, generator=gen) * 0.5
    beta = torch.rand(B, h, T, generator=gen)
    state = torch.zeros(B, h, dk, dv)
    return [x.requires_grad_() for x in (q, k, v, g, beta, state)]


def measure(kind, rule, cfg, layer, B, T):
    if kind == "rule":
        xs = rule_inputs(cfg, B, T)
        return backward_bytes(lambda: rule(*xs))
    layer.zero_grad(set_to_none=True)
    x = torch.randn(B, T, cfg.hidden_size, generator=torch.Generator().manual_seed(0), requires_grad=True)
    kept = deltanet.chunked_delta_rule
    deltanet.chunked_delta_rule = rule  # GatedDeltaNet.forward looks the rule up in its module at call time
    try:
        return backward_bytes(lambda: (layer(x),))
    finally:
        deltanet.chunked_delta_rule = kept


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--lengths", type=int, nargs="+", default=[1024, 3072])
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--heads", type=int, default=None, help="value heads (default: the config's 32)")
    p.add_argument("--kinds", nargs="+", default=["rule", "layer"], choices=["rule", "layer"])
    args = p.parse_args()

    raw = hf_config("qwen3.5-4b", layers=1)
    if args.heads:
        r = raw["linear_num_value_heads"] // raw["linear_num_key_heads"]
        raw.update(linear_num_value_heads=args.heads, linear_num_key_heads=max(1, args.heads // r))
    cfg = QwenConfig.from_dict(raw)
    torch.manual_seed(0)
    layer = deltanet.GatedDeltaNet(cfg) if "layer" in args.kinds else None
    print(f"Qwen3.5-4B Gated DeltaNet: nk={cfg.linear_num_key_heads} nv={cfg.linear_num_value_heads} "
          f"dk={cfg.linear_key_head_dim} dv={cfg.linear_value_head_dim} H={cfg.hidden_size} B={args.batch} fp32 "
          f"cpu, threads={torch.get_num_threads()}")
    for T in args.lengths:
        for kind in args.kinds:
            old, new = (measure(kind, rule, cfg, layer, args.batch, T)
                        for rule in (indexed_delta_rule, deltanet.chunked_delta_rule))
            print(f"T={T:<5d} {kind:<6s}  indexed {old / GiB:6.2f} GiB  unbind {new / GiB:6.2f} GiB  "
                  f"{old / new:4.1f}x fewer", flush=True)


if __name__ == "__main__":
    main()
