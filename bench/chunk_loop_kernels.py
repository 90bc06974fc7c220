"""Kernels of the Gated DeltaNet chunk loop, eager against compiled (train.py --compile-gdn), at Qwen3.5-4B's layer
shapes (32 value heads, 16 key heads, dk = dv = 128), and what that makes per optimizer step.

For one layer and one row: the reference pass (forward, no grad) and the policy pass (forward and backward), each
at 4 and 8 chunks, counted as bench/step_counts.py counts kernels (torch.profiler's outermost aten ops, views
apart, plus inductor's generated kernels). The counts are linear in the chunks: per chunk (the loop) plus per call
(chunk_math and the moves around it). The compiled counts are inductor's CPU kernels; on a GPU inductor fuses the
same pointwise ops into Triton kernels and calls the same library matmuls, so the saving is an estimate of a GPU's,
to be measured there.

    python bench/chunk_loop_kernels.py                          # a minute or two: the compile
    python bench/chunk_loop_kernels.py --tokens 2944 --micro-batches 6
"""

import argparse
import math
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))  # run from anywhere

from step_counts import count_kernels, kernel_profiling  # noqa: E402  (bench/step_counts.py)

from minigrpo.deltanet import CHUNK, chunk_loop, l2norm  # noqa: E402

H, DK, DV, GDN_LAYERS = 32, 128, 128, 24   # Qwen3.5-4B: value heads (keys repeated to them), head dims, 24 of 32


def leaves(T):
    gen = torch.Generator().manual_seed(0)
    q, k = (l2norm(torch.randn(1, H, T, DK, generator=gen)) for _ in range(2))
    v = torch.randn(1, H, T, DV, generator=gen)
    g, beta = -torch.rand(1, H, T, generator=gen), torch.rand(1, H, T, generator=gen)
    return [x.requires_grad_() for x in (q * DK ** -0.5, k, v, g, beta, torch.zeros(1, H, DK, DV))]


def passes(T, backend):
    """(reference pass, policy pass) kernels of one layer's chunk loop over T tokens of one row."""
    xs = leaves(T)

    def reference():
        with torch.no_grad():
            chunk_loop(*xs, compile=backend)

    def policy():
        o, S = chunk_loop(*xs, compile=backend)
        torch.autograd.grad((o.sum() + S.sum()), xs)
    with kernel_profiling():
        reference(), policy()   # compiles when backend is set
    return count_kernels(reference), count_kernels(policy)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tokens", type=int, default=2944,
                   help="a micro-batch's length (its longest row; packed: its longest document): its chunks")
    p.add_argument("--micro-batches", type=int, default=1,
                   help="micro-batches per optimizer step: calls of the chunk loop per layer and pass (the rows of "
                        "one call share its kernels)")
    p.add_argument("--grad-checkpoint", action="store_true", help="the policy forward runs twice (recompute)")
    args = p.parse_args()
    torch.set_num_threads(1)
    n = math.ceil(args.tokens / CHUNK)
    print(f"Qwen3.5-4B Gated DeltaNet layer (h={H}, dk={DK}, dv={DV}); {args.tokens} tokens = {n} chunks; "
          f"{args.micro_batches} micro-batch(es) per step x {GDN_LAYERS} layers")
    print("| run | reference per chunk | + per call | policy fwd+bwd per chunk | + per call | per step (estimate) |")
    print("|---|---|---|---|---|---|")
    totals = {}
    for name, backend in (("eager", None), ("compiled (inductor)", "inductor")):
        (r4, p4), (r8, p8) = passes(4 * CHUNK, backend), passes(8 * CHUNK, backend)
        rc, pc = (r8 - r4) / 4, (p8 - p4) / 4                         # per chunk
        r0, p0 = r4 - 4 * rc, p4 - 4 * pc                             # per call
        ref, pol = r0 + rc * n, p0 + pc * n
        per_step = GDN_LAYERS * args.micro_batches * (ref + pol + (ref if args.grad_checkpoint else 0))
        totals[name] = per_step
        print(f"| {name} | {rc:.0f} | {r0:.0f} | {pc:.0f} | {p0:.0f} | {per_step:,.0f} |")
    eager, compiled = totals.values()
    print(f"saved per step: {eager - compiled:,.0f} kernels ({1 - compiled / eager:.0%}); the recompute's forward is "
          f"counted as a reference pass (a forward with grad saves more, but launches the same kernels)")


if __name__ == "__main__":
    main()
