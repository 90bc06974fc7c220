"""The memory plan (minigrpo/run/memplan.py) against a real GRPO step's measured peak, on the CPU.

    python bench/memplan_check.py                                  # tiny: B=8 x T=512, with and without checkpointing
    python bench/memplan_check.py --shape qwen3-0.6b --batch 2 --seq 256 --prompt 64
    python bench/memplan_check.py --shape qwen3.5-4b --layers-at 2048   # each layer's fit against a measurement

--layers-at T: the plan's per-layer fit (minigrpo/run/layercost.py, measured at 128-512 tokens) against the same
layer measured directly at T tokens, bf16, LoRA r=32: saved bytes and the backward's working set, per layer kind.

The step is bench/train_step.py's (ours only): reference log-probs, policy log-probs, GRPO loss, backward, clip,
AdamW on LoRA r=32 (7 projections; 12 on Qwen3.5), fp32. Its peak is the process's peak RSS minus its RSS after
loading, with glibc's MALLOC_MMAP_THRESHOLD_ fixed (see train_step.py) at 64 KiB rather than 1 MiB: the tiny
model's tensors are 0.1-1 MiB, and below the threshold they come from malloc's heap, whose fragmentation then
shows in the RSS (+70% at B=8, T=256). So the measured peak holds LoRA gradients, the AdamW moments,
activations and the log-prob chunk, not the weights. The plan's matching parts: 12 bytes per LoRA parameter +
max(activations + log-prob chunk, ...), without the entropy the trainer also asks for (train_step does not).
"""

import argparse
import os
import sys
import tempfile

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import shapes  # noqa: E402
import step_stacks  # noqa: E402
import train_step  # noqa: E402
from minigrpo.run import layercost, memplan  # noqa: E402
from minigrpo.pretrained import QwenConfig  # noqa: E402

GiB = 1024 ** 3


def planned(args, checkpointing):
    """The plan's bytes for train_step's step (everything but the weights and the LoRA weights themselves)."""
    cfg = QwenConfig.from_dict(shapes.hf_config(args.shape, args.layers))
    dtype = getattr(torch, args.dtype)
    targets = step_stacks.targets(args)
    _, trainable = memplan.param_counts(cfg, args.lora_r, targets)
    costs = layercost.layer_costs(cfg, dtype, args.lora_r, targets)
    s = dtype.itemsize
    act = memplan.activation_bytes(cfg, costs, args.batch, args.seq, s, checkpointing)
    rows = args.batch * (args.seq - args.prompt)
    chunk = memplan.logprob_bytes(cfg, rows, s, entropy=False)
    return 12 * trainable + act + chunk


def check(args):
    """[(checkpointing, planned bytes, measured bytes)]"""
    os.environ.setdefault("MALLOC_MMAP_THRESHOLD_", str(64 << 10))  # the children inherit it
    out = []
    with tempfile.TemporaryDirectory(prefix="minigrpo-memplan-") as folder:
        step_stacks.save_random_model(folder, args)
        for ckpt in args.checkpointing:
            a = argparse.Namespace(**{**vars(args), "grad_checkpoint": ckpt})
            measured = train_step.run_child("ours", folder, a)["peak"]
            out.append((ckpt, planned(a, ckpt), measured))
    return out


def layer_check(args):
    """[(layer kind, what, fitted bytes, measured bytes)] at args.layers_at tokens, bf16, B = 1."""
    cfg = QwenConfig.from_dict(shapes.hf_config(args.shape, args.layers))
    T, targets, out = args.layers_at, step_stacks.targets(args), []
    costs = layercost.layer_costs(cfg, torch.bfloat16, args.lora_r, targets)
    for kind in dict.fromkeys(layercost.layer_keys(cfg)):
        block = layercost.layer(cfg, kind, torch.bfloat16, args.lora_r, targets)
        saved, backward = layercost.measure_layer(cfg, block, T)
        out += [(kind, "saved", costs[kind].bytes(1, T), saved),
                (kind, "backward", costs[kind].backward.bytes(1, T), backward)]
    return out


def parse(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shape", default="tiny", choices=shapes.NAMES)
    p.add_argument("--layers", type=int)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq", type=int, default=512)
    p.add_argument("--prompt", type=int, default=256)
    p.add_argument("--no-checkpointing-only", action="store_true", help="skip the checkpointed step")
    p.add_argument("--layers-at", type=int, help="check each layer's fit against a measurement at this length")
    args = p.parse_args(argv)
    defaults = dict(dtype="float32", device="cpu", threads=min(2, os.cpu_count() or 1), repeats=1, lora_r=32,
                    beta=0.04, temperature=1.0, lr=1e-4, vocab_size=shapes.TOKENS[args.shape][0],
                    no_ops=True)   # the peak is all this check reads: no third step to count ops in
    args = argparse.Namespace(**{**defaults, **vars(args)})
    args.checkpointing = [False] if args.no_checkpointing_only else [False, True]
    return args


def main(argv=None):
    args = parse(argv)
    if args.layers_at:
        print(f"{args.shape}, one layer of each kind, B=1 T={args.layers_at}, bf16, LoRA r={args.lora_r}, CPU")
        print("| layer | bytes | fit (128-512 tokens) | measured | fit / measured |\n|---|---|---|---|---|")
        for kind, what, fit, meas in layer_check(args):
            print(f"| {kind} | {what} | {fit / GiB:.4f} GiB | {meas / GiB:.4f} GiB | {fit / meas:.3f} |", flush=True)
        return
    print(f"{args.shape}, B={args.batch} T={args.seq} (prompt {args.prompt}), fp32, LoRA r={args.lora_r}, CPU")
    print("| checkpointing | planned | measured peak | planned / measured |\n|---|---|---|---|")
    for ckpt, plan_b, meas in check(args):
        print(f"| {'yes' if ckpt else 'no'} | {plan_b / GiB:.3f} GiB | {meas / GiB:.3f} GiB | {plan_b / meas:.2f} |",
              flush=True)


if __name__ == "__main__":
    main()
