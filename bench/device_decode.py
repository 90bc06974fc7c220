"""bench/device.py's decode section and transformers' generate, and the torch.profiler counts they and the train
section read.

The sampler is called as train.py calls it (`rollout_call`), on soyuz's revision call: ms per decode step from two
calls of different lengths (their difference leaves the prefill out), kernels per step from two profiled calls.
"""

import argparse
import functools
import statistics
import time
from collections import Counter

import torch

from device_report import Skip


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


def profiled(fn, device):
    """(fn(), torch.profiler events) with the GPU's activity when there is one."""
    from torch.profiler import ProfilerActivity, profile
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=acts) as prof:
        out = fn()
        sync(device)
    return out, prof.events()


LAUNCHES = ("cudaLaunchKernel", "cuLaunchKernel", "cudaGraphLaunch")  # and their Ex / _v variants


def counts(events, device):
    """(kernels, launches) in the events: GPU activities and host launch calls on CUDA; on a CPU, aten ops that
    call no other aten op (inductor's own fused loops are no events: a compiled step shows its extern calls)."""
    from torch.autograd import DeviceType
    if device.type == "cuda":
        return (sum(e.device_type == DeviceType.CUDA for e in events), sum(e.name.startswith(LAUNCHES) for e in events))
    leaf = [e for e in events if e.name.startswith("aten::")
            and not any(ch.name.startswith("aten::") for ch in e.cpu_children)]
    return len(leaf), None


def attention_ops(events):
    """{SDPA op: calls} in the events, named by the kernel family: flash_attention, efficient_attention,
    cudnn_attention, attention_math, flash_attention_for_cpu."""
    names = [e.name.removeprefix("aten::_scaled_dot_product_") for e in events
             if e.name.startswith("aten::_scaled_dot_product_") and "backward" not in e.name]
    return Counter(names)


def attention_kernels(events, per=1):
    ops = attention_ops(events) if not isinstance(events, Counter) else events
    return ", ".join(f"{k} x{v / per:g}" for k, v in sorted(ops.items()) if v > 0) or "no SDPA op (compiled away)"


def rollout_call(model, tok, args, prompts, seeds, n):
    """One sampler call as train.py makes it (train.rollout_sampler), on the path args.decode names ("eager", or
    "fast": the static-shape compiled decode), with the call's own rows as the decode batch."""
    import train
    settings = train.sampler_settings(args, tok, model.device, rows=len(prompts) * n)
    return train.rollout_sampler(model, tok, settings)(prompts, seeds, n)


def decode_section(sec, M):
    """ms per decode step of the eager and the fast path on soyuz's largest call (device_numerics.gap_prompts: the
    fast path's graph is the one the compile section compiled, when it did)."""
    from torch._dynamo.utils import counters

    from device_numerics import gap_prompts
    from minigrpo import static_decode
    c, need, dev, cuda = M.cfg, M.cfg["need"], M.device, M.device.type == "cuda"
    args = argparse.Namespace(**vars(M.args))
    prompts, seeds = gap_prompts(M)
    (k1, k2), (p1, p2) = c["steps"], c["prof"]
    what = f"{len(prompts)} rows x {static_decode.bucket_len(max(map(len, prompts)) + k2)} slots"
    graphs = lambda: counters["stats"]["unique_graphs"]

    def call(path, k, prof=False):
        args.decode, args.max_new_tokens = path, k
        fn = functools.partial(rollout_call, M.ours, M.tok, args, prompts, seeds, 1)
        sync(dev)
        t = time.perf_counter()
        out, ev = profiled(fn, dev) if prof else (fn(), None)
        return time.perf_counter() - t, out, ev

    def ms_per_step(path):
        if path == "fast" and getattr(M, "fast_compiled", None) is None:
            raise Skip("the fast path's first call did not run")
        g0 = graphs()
        t1 = min(call(path, k1)[0] for _ in range(c["repeats"]))
        t2 = min(call(path, k2)[0] for _ in range(c["repeats"]))
        ms = f"{(t2 - t1) / (k2 - k1) * 1000:.2f} ms/step" if t2 > t1 else "n/a: the longer call was not slower (noise)"
        failed = static_decode.compile_failure(dev) if path == "fast" else None
        return dict(minigrpo=ms, note=(f"UNCOMPILED: the compile failed ({failed}); " if failed else "") +
                    f"calls of {k1} and {k2} new tokens, the faster of {c['repeats']} each; graphs compiled "
                    f"meanwhile: {graphs() - g0}")

    def kernels_per_step(path):
        if path == "fast" and getattr(M, "fast_compiled", None) is None:
            raise Skip("the fast path's first call did not run")
        e1, e2 = [call(path, k, prof=True)[2] for k in (p1, p2)]
        (n1, l1), (n2, l2) = counts(e1, dev), counts(e2, dev)
        attention = attention_kernels(attention_ops(e2) - attention_ops(e1), per=p2 - p1)
        launches = f" ({(l2 - l1) / (p2 - p1):.0f} host launches)" if cuda else ""
        return dict(minigrpo=f"{(n2 - n1) / (p2 - p1):.0f} {'GPU kernels' if cuda else 'aten ops'}/step{launches}",
                    note=f"torch.profiler, calls of {p1} and {p2} new tokens; attention per step: {attention}")

    def fast_first():
        if getattr(M, "fast_compiled", None) is not None:
            return dict(minigrpo=f"{M.fast_compiled:.1f} s", note="compiled in the compile section (its row)")
        if getattr(M, "compile_tried", False):   # stopped there at its cap: a second try here would be as long
            raise Skip("the compile section's compile did not finish (its row)")
        g0 = graphs()
        dt = call("fast", k1)[0]
        M.fast_compiled = dt
        return dict(minigrpo=f"{dt:.1f} s", note=f"compile{' + CUDA graph capture' if cuda else ''} + a {k1}-token "
                                                 f"call; {graphs() - g0} graph(s)")

    sec.measure(f"eager path (train.rollout_sampler), {what}, LoRA r={args.lora_r}", lambda: ms_per_step("eager"),
                need=need["eager"])
    sec.measure("fast path (sample(compile=True)): first call", fast_first, need=need["compile"],
                cap=c["compile_cap"])
    sec.measure(f"fast path, {what}", lambda: ms_per_step("fast"), need=need["fast"])
    sec.measure("eager path: kernels per step", lambda: kernels_per_step("eager"), need=need["fast"])
    sec.measure("fast path: kernels per step", lambda: kernels_per_step("fast"), need=need["fast"])


def generate_section(sec, M):
    """transformers' generate with a static cache (which transformers compiles on CUDA) on the decode section's
    prompts, without LoRA: its first call, then ms per step from a logits processor's clock."""
    from transformers import LogitsProcessor, LogitsProcessorList

    from device_numerics import gap_prompts
    from minigrpo import static_decode
    c, need, dev, cuda = M.cfg, M.cfg["need"], M.device, M.device.type == "cuda"
    prompts, _ = gap_prompts(M)
    k2 = c["steps"][1]
    what = f"{len(prompts)} rows x {static_decode.bucket_len(max(map(len, prompts)) + k2)} slots"

    class StepClock(LogitsProcessor):
        def __init__(self):
            self.times = []

        def __call__(self, input_ids, scores):
            sync(dev)
            self.times.append(time.perf_counter())
            return scores

    L = max(map(len, prompts))
    ids = torch.full((len(prompts), L), M.pad, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, pr in enumerate(prompts):
        ids[i, L - len(pr):], mask[i, L - len(pr):] = torch.tensor(pr), 1
    ids, mask = ids.to(dev), mask.to(dev)
    ok = {}

    def hf_call(k, clock=None):
        kw = dict(logits_processor=LogitsProcessorList([clock])) if clock else {}
        with torch.no_grad():
            M.hf.generate(ids, attention_mask=mask, do_sample=True, temperature=1.0, top_k=0, top_p=1.0,
                          max_new_tokens=k, min_new_tokens=k, eos_token_id=None, pad_token_id=M.pad,
                          cache_implementation="static", **kw)
        sync(dev)

    def hf_first():
        t = time.perf_counter()
        hf_call(k2)
        ok["first"] = True
        return dict(transformers=f"{time.perf_counter() - t:.1f} s",
                    note="compiled by transformers" if cuda else "not compiled: transformers compiles on CUDA only")

    def hf_steady():
        if "first" not in ok:
            raise Skip("its first call did not run")
        clock = StepClock()
        hf_call(k2, clock)
        steps = [b - a for a, b in zip(clock.times, clock.times[1:])]
        return dict(transformers=f"{statistics.median(steps) * 1000:.2f} ms/step",
                    note=f"median over {len(steps)} decode steps (a logits processor's clock); no LoRA")

    gen = "generate, static cache" + (", compiled" if cuda else "")
    sec.measure(f"transformers {gen}: first call", hf_first, need=need["hf_first"], cap=c["compile_cap"])
    sec.measure(f"transformers {gen}, {what}", hf_steady, need=need["hf"])
