"""bench/device.py's decode section, and the torch.profiler counts it and the train section read.

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
    """One sampler call as train.py makes it: train.generate, on the path args.decode names ("eager", or "fast":
    the merged-LoRA static compiled decode), with the call's own rows as the decode batch."""
    import train
    return train.generate(model, tok, args, prompts, seeds, n, rows=len(prompts) * n)


def decode_section(sec, M):
    import sampler as sampler_bench  # bench/sampler.py
    from torch._dynamo.utils import counters
    from transformers import LogitsProcessor, LogitsProcessorList

    import train
    from minigrpo import static_decode
    from minigrpo.tasks.base import Seq
    c, need, dev, cuda = M.cfg, M.cfg["need"], M.device, M.device.type == "cuda"
    args = argparse.Namespace(**vars(M.args))
    lengths = [c["prompt"] - (c["prompt"] // 16) * i for i in range(c["rows"])]
    prompts = sampler_bench.prompts_for(lengths, M.vocab)
    seeds = [train.sample_seed(args, 0, i) for i in range(len(prompts))]
    (k1, k2), (p1, p2) = c["steps"], c["prof"]
    what = f"{len(prompts)} rows x {static_decode.bucket_len(max(lengths) + k2)} slots"
    samples, graphs = {}, lambda: counters["stats"]["unique_graphs"]

    def call(path, k, prof=False):
        args.decode, args.max_new_tokens = path, k
        fn = functools.partial(rollout_call, M.ours, M.tok, args, prompts, seeds, 1)
        sync(dev)
        t = time.perf_counter()
        out, ev = profiled(fn, dev) if prof else (fn(), None)
        return time.perf_counter() - t, out, ev

    def steady(path, first=""):
        g0 = graphs()
        t1 = min(call(path, k1)[0] for _ in range(c["repeats"]))
        runs = [call(path, k2)[:2] for _ in range(c["repeats"])]
        t2, samples[path] = min(runs, key=lambda r: r[0])
        e1, e2 = [call(path, k, prof=True)[2] for k in (p1, p2)]
        (n1, l1), (n2, l2) = counts(e1, dev), counts(e2, dev)
        attention = attention_kernels(attention_ops(e2) - attention_ops(e1), per=p2 - p1)
        kind = "GPU kernels" if cuda else "aten ops"
        launches = f" ({(l2 - l1) / (p2 - p1):.0f} host launches)" if cuda else ""
        ms = f"{(t2 - t1) / (k2 - k1) * 1000:.2f} ms/step" if t2 > t1 else "n/a: the longer call was not slower (noise)"
        return dict(minigrpo=ms,
                    note=f"{(n2 - n1) / (p2 - p1):.0f} {kind}/step{launches}; attention per step: {attention}; "
                         f"{first}graphs compiled meanwhile: {graphs() - g0}")

    def eager():
        first = call("eager", k1)[0]
        return steady("eager", f"first call {first:.1f} s; ")

    def fast_first():
        g0 = graphs()
        dt = call("fast", k1)[0]
        samples["fast-compiled"] = True
        return dict(minigrpo=f"{dt:.1f} s", note=f"compile{' + CUDA graph capture' if cuda else ''} + a {k1}-token "
                                                 f"call; {graphs() - g0} graph(s)")

    def fast():
        if "fast-compiled" not in samples:
            raise Skip("the fast path's first call did not run")
        return steady("fast")

    def gap(path):
        if path not in samples:
            raise Skip(f"no {path} samples")
        got = [s[0] for s in samples[path]]
        seqs = [Seq(str(i), 1, prompts[i], s.completion_ids, s.logprobs, s.finish_reason, "", 0.0)
                for i, s in enumerate(got)]
        b = train.collate(seqs, M.pad, dev)
        with torch.no_grad():
            logp = train.log_probs(M.ours, b, args, M.vocab)
        d = (logp - b.sampled).abs()[b.mask.bool()].double()
        return dict(minigrpo=f"mean {d.mean().item():.3g}, p95 {d.quantile(0.95).item():.3g}, max {d.max().item():.3g}",
                    note=f"abs(trainer - sampler) over {d.numel()} tokens (train.log_probs of the sampled sequences)")

    class StepClock(LogitsProcessor):
        def __init__(self):
            self.times = []

        def __call__(self, input_ids, scores):
            sync(dev)
            self.times.append(time.perf_counter())
            return scores

    ids = torch.full((len(prompts), max(lengths)), M.pad, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, pr in enumerate(prompts):
        ids[i, ids.shape[1] - len(pr):], mask[i, ids.shape[1] - len(pr):] = torch.tensor(pr), 1
    ids, mask = ids.to(dev), mask.to(dev)
    hf_ok = {}

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
        hf_ok["first"] = True
        return dict(transformers=f"{time.perf_counter() - t:.1f} s",
                    note="compiled by transformers" if cuda else "not compiled: transformers compiles on CUDA only")

    def hf_steady():
        if "first" not in hf_ok:
            raise Skip("its first call did not run")
        clock = StepClock()
        hf_call(k2, clock)
        steps = [b - a for a, b in zip(clock.times, clock.times[1:])]
        return dict(transformers=f"{statistics.median(steps) * 1000:.2f} ms/step",
                    note=f"median over {len(steps)} decode steps (a logits processor's clock); no LoRA")

    sec.measure(f"eager path (train.generate), {what}, LoRA r={args.lora_r}", eager, need=need["eager"])
    sec.measure("sampler-trainer log-prob gap, eager path", lambda: gap("eager"), need=need["gap"])
    sec.measure("fast path (sample(compile=True)): first call", fast_first, need=need["compile"],
                cap=c["compile_cap"])
    sec.measure(f"fast path, {what}", fast, need=need["fast"])
    sec.measure("sampler-trainer log-prob gap, fast path", lambda: gap("fast"), need=need["gap"])
    gen = "generate, static cache" + (", compiled" if cuda else "")
    sec.measure(f"transformers {gen}: first call", hf_first, need=need["hf_first"], cap=c["compile_cap"])
    sec.measure(f"transformers {gen}, {what}", hf_steady, need=need["hf"])


