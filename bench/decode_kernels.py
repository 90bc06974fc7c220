"""Kernels per decode step on the training loop's sampler path (train.py generate), LoRA attached as train.py
attaches it (r=32 on every projection), for the tiny-qwen3.5 and Qwen3.5-4B shapes, all in one run:

  eager                  sampler.decode_step on a model.Cache: train.py --decode eager (the CPU default)
  fast, uncompiled       static_decode.decode_step on the LoRA model itself (adapters unmerged, each running its
                         fp32 branch as in training): the fast path's step before torch.compile fuses it
  base model             the same static step without LoRA: what the adapters add is the difference
  fast, compiled         the fast path as train.py runs it (torch.compile, inductor): the kernels inductor's code
                         runs per step (torch.profiler, with inductor's per-kernel profiling on); on CUDA the step
                         is then replayed as one CUDA graph (one launch)

Bytes read per step: the weights (each read once whatever the rows), plus, per adapted layer, its fp32 A and B.

Eager counts are the aten ops the step dispatches (TorchDispatchMode: each is a kernel launch on CUDA, views apart,
which launch nothing), at full width on the meta device (no memory, no arithmetic), all layers. The compiled count
needs real tensors and a compile, so it runs on the CPU at reduced width (hidden 128, head dims 16/32, vocab 1024;
the same layer kinds, head counts and structure, so the same graph) and, for Qwen3.5-4B, at --compiled-layers
layers and twice that, extrapolated linearly to the full depth (every block of 4 layers is the same graph).

    python bench/decode_kernels.py                         # both shapes; the compiles take minutes on a CPU
    python bench/decode_kernels.py --no-compile            # eager counts only (seconds)
"""

import argparse
import os
import sys
from collections import Counter

import torch
from torch.utils._python_dispatch import TorchDispatchMode

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # run from anywhere

from shapes import hf_config  # noqa: E402  bench/shapes.py

from minigrpo import sampler, static_decode  # noqa: E402
from minigrpo.lora import inject_lora, lora_layers  # noqa: E402
from minigrpo.model import Qwen  # noqa: E402
from minigrpo.pretrained import QwenConfig  # noqa: E402

ROWS, SLOTS, PROMPT = 24, 2944, 1900  # soyuz's revision call: 24 rows, ~1.9k-token prompts + 1,024 new tokens
SMALL = dict(hidden_size=128, intermediate_size=256, head_dim=32, linear_key_head_dim=16, linear_value_head_dim=16,
             vocab_size=1024)


class OpCount(TorchDispatchMode):
    """Counts dispatched aten ops, views apart."""

    def __init__(self):
        super().__init__()
        self.ops, self.views = Counter(), Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        (self.views if func.is_view else self.ops)[func.__name__] += 1
        return func(*args, **(kwargs or {}))


def build(name, device, layers=None, small=False, lora=True):
    raw = hf_config(name, layers)
    if small:
        raw = dict(raw, **SMALL)
    with torch.device(device):
        model = Qwen(QwenConfig.from_dict(raw))
    if device == "meta":
        model.model.rotary.inv_freq = model.model.rotary._inv_freq("meta")
    else:
        for p in model.parameters():            # random weights: finite logits, nothing learned
            torch.nn.init.normal_(p, std=0.02)
    model = model.to(torch.bfloat16 if device == "meta" else torch.float32).eval()
    if lora:
        inject_lora(model, r=32, alpha=32)
    return model


def prefilled(model, rows=ROWS, slots=SLOTS, length=PROMPT):
    """A model.Cache of `rows` rows holding `length` prompt tokens of `slots` (no prefill run: the contents do not
    change the op count)."""
    cache = model.new_cache(rows, slots)
    cache.mask[:, :length] = True
    cache.next_pos.fill_(length)
    cache.length = length
    return cache


@torch.no_grad()
def eager_counts(model, static):
    cache = prefilled(model)
    tokens = torch.zeros(ROWS, dtype=torch.long, device=model.device)
    if static:
        cache = static_decode.StaticCache(cache, ROWS).load(cache, 1)
    step = static_decode.decode_step if static else sampler.decode_step
    with OpCount() as c:
        step(model, tokens, cache)
    return sum(c.ops.values()), sum(c.views.values())


@torch.no_grad()
def compiled_count(name, layers):
    """Kernels per step of the inductor-compiled fast step (CPU, reduced width), from one profiled step."""
    import torch._inductor.config as inductor_config
    from torch.profiler import ProfilerActivity, profile
    model = build(name, "cpu", layers, small=not name.startswith("tiny"))
    dec = model
    cache = prefilled(dec, slots=256, length=100)
    sc = static_decode.StaticCache(cache, ROWS).load(cache, 1)
    tokens = torch.zeros(ROWS, dtype=torch.long)
    torch._dynamo.reset()
    static_decode._compiled.clear()
    with inductor_config.patch({"cpp.enable_kernel_profile": True}):
        step = static_decode.compiled_step("cpu")
        step(dec, tokens, sc)                   # compile
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            step(dec, tokens, sc)
    kernels = Counter()
    for e in prof.events():   # inductor's own kernels, and the library calls its code makes (mm), outermost only
        if "cpp_fused" in e.name:
            kernels["inductor kernels"] += 1
        elif e.name.startswith(("aten::", "mkldnn::", "mkl::")) and e.name not in NO_KERNEL and not (
                e.cpu_parent is not None and e.cpu_parent.name.startswith(("aten::", "mkldnn::", "mkl::"))):
            kernels[e.name] += 1
    print(f"  {name}, {layers or 'all'} layers, compiled: " + ", ".join(f"{k} {v}" for k, v in kernels.most_common()),
          file=sys.stderr)
    return sum(kernels.values())


NO_KERNEL = {"aten::view", "aten::as_strided", "aten::as_strided_", "aten::reshape", "aten::_reshape_alias",
             "aten::empty", "aten::empty_strided", "aten::t", "aten::transpose", "aten::expand", "aten::unsqueeze",
             "aten::slice", "aten::select", "aten::alias", "aten::detach", "aten::resolve_conj", "aten::resolve_neg"}


def main(args):
    torch.set_grad_enabled(False)
    print(f"torch {torch.__version__}; decode step of {ROWS} rows over {SLOTS} cache slots, LoRA r=32 on every "
          "projection; eager: dispatched aten ops at full width on the meta device (kernels + views)")
    print("| shape | eager | fast, uncompiled | base model | fast, compiled | weights read | + LoRA A, B read |\n"
          "|---|---|---|---|---|---|---|")
    for name in args.shapes:
        lora, plain = build(name, "meta"), build(name, "meta", lora=False)
        today, fast, base = eager_counts(lora, False), eager_counts(lora, True), eager_counts(plain, True)
        compiled, note = "-", ""
        if args.compile:
            full = QwenConfig.from_dict(hf_config(name)).num_hidden_layers
            if full <= args.compiled_layers:
                compiled = str(compiled_count(name, None))
            else:
                a = compiled_count(name, args.compiled_layers)
                b = compiled_count(name, 2 * args.compiled_layers)
                per = (b - a) / args.compiled_layers
                compiled = f"{a + per * (full - args.compiled_layers):.0f}"
                note = f" (measured {a} at {args.compiled_layers} layers, {b} at {2 * args.compiled_layers})"
            compiled += (" (CPU)" if name.startswith("tiny") else " (CPU, reduced width)") + note
        fmt = lambda c: f"{c[0]:,} (+{c[1]:,} views)"
        weights = sum(p.numel() * p.element_size() for p in plain.parameters())
        adapters = sum(p.numel() * p.element_size() for _, m in lora_layers(lora) for p in (m.lora_A.weight,
                                                                                         m.lora_B.weight))
        print(f"| {name} | {fmt(today)} | {fmt(fast)} | {fmt(base)} | {compiled} | {weights / 2**30:.2f} GiB | "
              f"{adapters / 2**30:.3f} GiB ({adapters / weights:.1%}) |", flush=True)


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--shapes", nargs="+", default=["tiny-qwen3.5", "qwen3.5-4b"])
    p.add_argument("--compile", action=argparse.BooleanOptionalAction, default=True,
                   help="also count the inductor-compiled step's kernels (CPU, reduced width)")
    p.add_argument("--compiled-layers", type=int, default=4, help="Qwen3.5-4B depth compiled (and twice it)")
    main(p.parse_args())
