"""Refuse, before anything large is allocated, a run whose memory plan (memplan.py, `train.py --plan`) does not fit
the memory the device has: one line naming the flags to lower, instead of a kernel OOM kill a minute later (which
on a shared machine may pick someone else's process) or a run that pages for hours.

What the device has: on CUDA the free memory (torch.cuda.mem_get_info); on a CPU what this process may still take,
the smaller of the cgroup v2 limit left (memory.max - memory.current: a container's, a systemd slice's) and the
kernel's MemAvailable. The plan counts tensors only, so what it needs is its peak x 1.1 (allocator fragmentation),
+ 1 GiB of CUDA context and cuBLAS workspace on a GPU: the rule memplan.fits uses. The CPU plan is the same sum:
its layer costs are measured on the CPU already, and the sampler and the loss allocate the same tensors there."""
import math
import os

import torch

from minigrpo.errors import UsageError
from minigrpo.pretrained import TINY_MODELS
from minigrpo.run import memplan
from minigrpo.run.presets import gpu_preset_note

GiB = memplan.GiB
CGROUP = "/sys/fs/cgroup"
MEMINFO = "/proc/meminfo"


def cpu_available(cgroup: str = CGROUP, meminfo: str = MEMINFO) -> tuple[int, str]:
    """(bytes this process may still allocate, where that number comes from)."""
    with open(meminfo) as f:
        avail = next(int(ln.split()[1]) * 1024 for ln in f if ln.startswith("MemAvailable:"))
    where = "MemAvailable in /proc/meminfo"
    try:
        with open(os.path.join(cgroup, "memory.max")) as f:
            limit = f.read().strip()
        with open(os.path.join(cgroup, "memory.current")) as f:
            used = int(f.read())
    except (OSError, ValueError):       # no cgroup v2 memory controller here: the kernel's number alone
        return avail, where
    if limit != "max" and int(limit) - used < avail:
        return max(0, int(limit) - used), f"the cgroup limit {cgroup}/memory.max less memory.current"
    return avail, where


def device_available(device: torch.device) -> tuple[int, str]:
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0], f"free on {torch.cuda.get_device_name(device)}"
    return cpu_available()


def needed(peak: float, device: torch.device) -> int:
    return memplan.needed_bytes(peak) if device.type == "cuda" else math.ceil(peak * 1.1)


def floor(p: dict, dtype: torch.dtype, training: bool) -> int:
    """A lower bound of the peak from the plan's fixed parts (memplan.fixed_parts): the rollout's prefill and the
    training activations it leaves out are never negative."""
    caches = p["kv_cache"] + p["gdn_state"] + p["kept_states"]
    if training:
        return p["weights"] + p["trainable"] + p["static_caches"] + max(caches, p["logprob_chunk"])
    return p["params"] * (torch.finfo(dtype).bits // 8) + p["static_caches"] + caches


def lower_flags(p: dict, args) -> str:
    """The flags that size the larger side of the peak: the rollout's cache, or the trained micro-batch (a plan of
    fixed parts alone compares its caches with the log-prob chunk)."""
    rollout = p.get("rollout", p["kv_cache"] + p["gdn_state"] + p["kept_states"])
    if rollout >= p.get("activations", 0) + p["logprob_chunk"]:
        return "--group-size, --tasks-per-step or --max-new-tokens"
    return "--micro-batch or --max-new-tokens" + ("" if args.grad_checkpoint else ", or pass --grad-checkpoint")


def check_fits(args, rows: int, device: torch.device, dtype: torch.dtype, fast_decode: bool, cfg=None,
               lower: str | None = None, training: bool = True):
    """Raise UsageError when the run `args` would start (largest sampler call: `rows` rows) cannot fit `device`.
    cfg: the model's QwenConfig where args.model does not name it (a model built from scratch); lower: what the line
    tells the user to do (default: a GPU preset on a CPU says so and what runs there, any other run is told to lower
    the flags that size the plan's larger side); training=False: a sampling
    run (eval.py), which holds the weights at the compute dtype and the rollout, and trains nothing."""
    if cfg is None:
        if "/" not in args.model and args.model not in TINY_MODELS:
            return          # neither a folder nor a hub id: loading the model says so, with the nearest name
        cfg, _ = memplan.load_config(args.model)
    shape, s = memplan.run_shape(args, rows)
    lora, switches = ((s["lora_r"], s["targets"], s["beta"]), s["switches"]) if training else ((0,), {})
    fixed = memplan.fixed_parts(cfg, shape, dtype, *lora, fast_decode=fast_decode, **switches)
    have, where = device_available(device)
    # first the bound that needs no layer-cost measurement (a minute at 4B on a CPU), then the measured plan
    refuse_over(floor(fixed, dtype, training), "at least ", fixed, have, where, args, device, lower)
    p = memplan.plan(cfg, shape, dtype, *lora, fast_decode=fast_decode, fixed=fixed, **switches)
    if training:
        peak = p["peak_ckpt" if args.grad_checkpoint else "peak"]
    else:
        peak = p["params"] * (torch.finfo(dtype).bits // 8) + p["static_caches"] + p["rollout"]
    refuse_over(peak, "", p, have, where, args, device, lower)


def refuse_over(peak, bound: str, p: dict, have: int, where: str, args, device: torch.device, lower: str | None):
    """UsageError where the plan's `peak` (bound: "at least " for the floor) does not fit the `have` bytes."""
    if needed(peak, device) > have:
        todo = lower or gpu_preset_note(args.task, args.model, device.type) or \
            f"lower {lower_flags(p, args)} (`train.py ... --plan` shows the plan)"
        raise UsageError(f"the run needs {bound}~{needed(peak, device) / GiB:,.1f} GiB at its peak and {device.type} "
                         f"has {have / GiB:,.1f} GiB ({where}): {todo}")
