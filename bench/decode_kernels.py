"""Kernels and bytes per decode step on the training loop's sampler path (train.py generate), LoRA attached as train.py
attaches it (r=32 on every projection), at Qwen3.5-4B's shapes and soyuz's largest call (24 rows, the cache of its
revision call: ~1.9k-token prompts + 1,024 new tokens), and the floor such a step cannot go below:

  eager                  sampler.decode_step on a model.Cache: train.py --decode eager (the CPU default)
  fast, uncompiled       static_decode.decode_step on the LoRA model itself (adapters unmerged, each running its
                         fp32 branch as in training): the fast path's step before torch.compile fuses it
  fast, compiled         the fast path as train.py runs it (torch.compile, inductor): the kernels inductor's code
                         runs per step (torch.profiler, with inductor's per-kernel profiling on), and the bytes its
                         kernels read and write (inductor's own count: each buffer once per kernel); on CUDA the
                         step is then replayed as one CUDA graph (one launch)
  floor                  the bytes no step can avoid: the weights once (bf16), the adapters' A and B (fp32), each
                         Gated DeltaNet state read and written once (fp32), its conv inputs, the K/V of the slots
                         written (the call's mean), the logits; and that at one H200's memory bandwidth
  K/V read               what attention reads a step, over a whole call (the mean of its steps), at soyuz's two
                         calls: every slot of the cache (the static step before its read window), the read window
                         (static_decode.StaticCache.window: the length bucket of the slots written), and the slots
                         written (the floor)

Eager counts are the aten ops the step dispatches (TorchDispatchMode: each is a kernel launch on CUDA, views apart,
which launch nothing), at full width on the meta device (no memory, no arithmetic), all layers. The compiled counts
need real tensors and a compile: on the CPU at full width in bf16 (zeros: the counts do not depend on the values; a
few GB of memory), at --compiled-layers layers and twice that, extrapolated linearly to the full depth (every block
of 4 layers is the same graph). The CPU's kernels are not a GPU's (inductor fuses differently for Triton), so the
compiled columns are CPU counts, the GPU's to be measured.

    python bench/decode_kernels.py                  # the compiles take minutes on a CPU
    python bench/decode_kernels.py --no-compile     # eager counts and the floor only (seconds)
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
from minigrpo.lora import inject_lora  # noqa: E402
from minigrpo.model import Qwen  # noqa: E402
from minigrpo.pretrained import QwenConfig  # noqa: E402

ROWS, PROMPT, NEW = 24, 1900, 1024  # soyuz's revision call: 24 rows, ~1.9k-token prompts + 1,024 new tokens
CALLS = {"turn 0": (300, NEW), "revision": (PROMPT, NEW)}   # soyuz's calls: (prompt tokens, new tokens)
HBM = 4.8e12  # bytes/s, one H200: the floor's time is its bytes at this rate
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


def prefilled(model, rows=ROWS, slots=None, length=PROMPT):
    """A model.Cache of `rows` rows holding `length` prompt tokens of `slots` (no prefill run: the contents do not
    change the op count)."""
    cache = model.new_cache(rows, slots or static_decode.bucket_len(PROMPT + NEW))
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
def compiled_counts(name, layers, small):
    """(kernels, bytes) of one step of the inductor-compiled fast step on the CPU: kernels from torch.profiler
    (inductor's own and the library calls its code makes, outermost only), bytes from inductor's own count (each
    buffer a kernel reads or writes, once per kernel: weights, adapters, states and the K/V slots attention reads)."""
    import logging
    import torch._inductor.config as inductor_config
    import torch._inductor.metrics as metrics
    from torch.profiler import ProfilerActivity, profile
    if small:
        model = build(name, "cpu", layers, small=True)
        rows, slots, length = ROWS, 256, 100
    else:  # full width in bf16 (the GPU's dtype), zeros: the counts do not depend on the values
        model = build(name, "meta", layers)
        model.to_empty(device="cpu")
        for t in list(model.parameters()) + list(model.buffers()):
            t.detach().zero_()
        model.model.rotary.inv_freq = model.model.rotary._inv_freq("cpu")
        rows, slots, length = ROWS, static_decode.bucket_len(PROMPT + NEW), PROMPT
    cache = prefilled(model, rows, slots, length)
    sc = static_decode.StaticCache(cache, rows).load(cache, 1)
    del cache
    tokens = torch.zeros(rows, dtype=torch.long)
    torch._dynamo.reset()
    static_decode._compiled.clear()
    torch._logging.set_logs(inductor_metrics=True)   # inductor counts bytes only when this log is on
    logging.getLogger("torch._inductor").setLevel(logging.WARNING)   # ... without printing them
    metrics.reset()
    with inductor_config.patch({"cpp.enable_kernel_profile": True}):
        step = static_decode.compiled_step("cpu")
        step(model, tokens, sc)                   # compile
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            step(model, tokens, sc)
    torch._logging.set_logs()
    kernels = Counter()
    for e in prof.events():
        if "cpp_fused" in e.name:
            kernels["inductor kernels"] += 1
        elif e.name.startswith(("aten::", "mkldnn::", "mkl::")) and e.name not in NO_KERNEL and not (
                e.cpu_parent is not None and e.cpu_parent.name.startswith(("aten::", "mkldnn::", "mkl::"))):
            kernels[e.name] += 1
    counts = ", ".join(f"{k} {v}" for k, v in kernels.most_common())
    print(f"  {name}, {layers or 'all'} layers, compiled: {counts}; {metrics.num_bytes_accessed / 1e9:.3f} GB",
          file=sys.stderr, flush=True)
    return sum(kernels.values()), metrics.num_bytes_accessed


def compiled_per_step(name, layers, small):
    """compiled_counts for the whole depth: measured at `layers` and 2x `layers`, extrapolated linearly (every
    block of 4 layers is the same graph), or measured whole when the model has no more layers than that."""
    full = QwenConfig.from_dict(hf_config(name)).num_hidden_layers
    if full <= layers:
        return compiled_counts(name, None, small)
    a, b = compiled_counts(name, layers, small), compiled_counts(name, 2 * layers, small)
    return tuple(x + (y - x) * (full - layers) / layers for x, y in zip(a, b))


def floor_bytes(model, rows=ROWS):
    """What a decode step must move at least (Qwen3.5-4B's cache at soyuz's call): every weight read once (bf16),
    every adapter's A and B (fp32), each Gated DeltaNet state read and written once (fp32), its conv inputs, and
    attention's K/V over the slots written (the call's mean: prompt + half the new tokens), the logits written."""
    cfg = model.config
    weights = sum(p.numel() * 2 for p in model.parameters() if not p.requires_grad)
    adapters = sum(p.numel() * 4 for p in model.parameters() if p.requires_grad)
    gdn = sum(t == "linear_attention" for t in cfg.layer_types)
    attn = cfg.num_hidden_layers - gdn
    state = conv = 0
    if gdn:
        state = rows * cfg.linear_num_value_heads * cfg.linear_key_head_dim * cfg.linear_value_head_dim * 4
        conv_dim = 2 * cfg.linear_num_key_heads * cfg.linear_key_head_dim + cfg.linear_num_value_heads * \
            cfg.linear_value_head_dim
        conv = rows * conv_dim * (cfg.linear_conv_kernel_dim - 1) * 2
    kv_slot = rows * cfg.num_key_value_heads * cfg.head_dim * 2 * 2              # K and V, bf16, one slot
    return dict(weights=weights, adapters=adapters, state=gdn * 2 * state, conv=gdn * conv,
                kv_written=attn * kv_slot * (PROMPT + NEW // 2),
                kv_all_slots=attn * kv_slot * static_decode.bucket_len(PROMPT + NEW),
                logits=rows * cfg.vocab_size * 4)


def kv_read(model, prompt, new, rows=ROWS):
    """Bytes of K/V attention reads per decode step, the mean over a call of `prompt`-token prompts and `new` new
    tokens: every slot of its cache, the read window of each step, the slots written (every attention layer, bf16)."""
    cfg = model.config
    attn = sum(t == "full_attention" for t in cfg.layer_types)
    slot = attn * rows * cfg.num_key_value_heads * cfg.head_dim * 2 * 2   # K and V, bf16, one slot, every layer
    S = static_decode.bucket_len(prompt + new)
    written = [prompt + t + 1 for t in range(new - 1)]                    # the step's own token included
    mean = lambda xs: sum(xs) / len(xs)                                     # noqa: E731
    return dict(all_slots=slot * S, window=slot * mean([min(static_decode.bucket_len(w), S) for w in written]),
                written=slot * mean(written))


def kv_table(model):
    print(f"\n| K/V read per decode step, {ROWS} rows | cache slots | every slot (before) | read window (now) | "
          f"slots written (floor) | saved at {HBM / 1e12:.1f} TB/s |\n|---|---|---|---|---|---|")
    for name, (prompt, new) in CALLS.items():
        r = kv_read(model, prompt, new)
        print(f"| {name}: {prompt}-token prompts + {new} new | {static_decode.bucket_len(prompt + new):,} | "
              f"{r['all_slots'] / 1e9:.3f} GB | {r['window'] / 1e9:.3f} GB | {r['written'] / 1e9:.3f} GB | "
              f"{(r['all_slots'] - r['window']) / HBM * 1e3:.3f} ms |", flush=True)


NO_KERNEL = {"aten::view", "aten::as_strided", "aten::as_strided_", "aten::reshape", "aten::_reshape_alias",
             "aten::empty", "aten::empty_strided", "aten::t", "aten::transpose", "aten::expand", "aten::unsqueeze",
             "aten::slice", "aten::select", "aten::alias", "aten::detach", "aten::resolve_conj", "aten::resolve_neg"}


def main(args):
    torch.set_grad_enabled(False)
    print(f"torch {torch.__version__}; decode step of {ROWS} rows, LoRA r=32 on every projection; eager columns: "
          "dispatched aten ops at full width on the meta device (kernels + views); compiled: inductor on the CPU, "
          f"{'reduced' if args.small else 'full'} width, {args.compiled_layers} and {2 * args.compiled_layers} layers "
          f"extrapolated; the cache of soyuz's revision call ({PROMPT}-token prompts + {NEW} new tokens: "
          f"{static_decode.bucket_len(PROMPT + NEW)} slots)")
    print("| shape | eager | fast, uncompiled | fast, compiled: kernels | compiled: bytes a step | floor: bytes | "
          f"floor at {HBM / 1e12:.1f} TB/s |\n|---|---|---|---|---|---|---|")
    for name in args.shapes:
        lora = build(name, "meta")
        today, fast = eager_counts(lora, False), eager_counts(lora, True)
        kernels, moved = ("-", "-")
        if args.compile:
            k, b = compiled_per_step(name, args.compiled_layers, args.small)
            kernels, moved = f"{k:,.0f}", f"{b / 1e9:.2f} GB"
        floor = floor_bytes(lora)
        least = sum(v for key, v in floor.items() if key != "kv_all_slots")
        fmt = lambda c: f"{c[0]:,} (+{c[1]:,} views)"
        print(f"| {name} | {fmt(today)} | {fmt(fast)} | {kernels} | {moved} | {least / 1e9:.2f} GB | "
              f"{least / HBM * 1e3:.2f} ms |", flush=True)
        print("  floor's parts: " + ", ".join(f"{key} {v / 1e9:.3f} GB" for key, v in floor.items()), flush=True)
        kv_table(lora)


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--shapes", nargs="+", default=["qwen3.5-4b"])
    p.add_argument("--compile", action=argparse.BooleanOptionalAction, default=True,
                   help="also count the inductor-compiled step's kernels and bytes (CPU)")
    p.add_argument("--small", action="store_true", help="compile at reduced width (kernels only: bytes shrink)")
    p.add_argument("--compiled-layers", type=int, default=4, help="Qwen3.5-4B depth compiled (and twice it)")
    main(p.parse_args())
