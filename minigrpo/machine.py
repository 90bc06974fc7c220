"""The machine a run uses: its device, its one compute dtype (bf16 on CUDA, fp32 elsewhere: docs/qwen.md,
"Precision") and, on a CPU, how many threads torch runs."""
import os
import sys

import torch


def pick_device(name: str | None = None) -> torch.device:
    """--device if given, else the best available: cuda (this process's LOCAL_RANK under torchrun) -> mps -> cpu."""
    if name:
        return torch.device(name)
    if torch.cuda.is_available():
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
    if getattr(torch.backends, "mps", None) and torch.backends.mps.is_available():
        return torch.device("mps")
    return torch.device("cpu")


def pick_dtype(name: str | None, device: torch.device) -> torch.dtype:
    """--dtype if given, else bf16 on CUDA and fp32 elsewhere."""
    if name:
        return getattr(torch, name)
    return torch.bfloat16 if device.type == "cuda" else torch.float32


TORCH_THREADS = torch.get_num_threads()   # torch's own default, before anything sets it: the physical cores


def usable_cpus() -> int:
    """The cores this process may run on: its CPU affinity, capped by a cgroup v2 CPU quota (a container's)."""
    n = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    try:
        with open("/sys/fs/cgroup/cpu.max") as f:
            quota, period = f.read().split()[:2]
        if quota != "max":
            n = min(n, max(1, int(quota) // int(period)))
    except (OSError, ValueError):
        pass
    return n


def pick_threads(requested: int | None, given: str = "set by --threads") -> tuple[int, str]:
    """(CPU threads for torch, why): --threads if given, else OMP_NUM_THREADS if set, else the usable cores that
    other work leaves idle (1-minute load average), at least 1. More threads than idle cores oversubscribe: torch's
    threads wait for each other at every parallel op, and a descheduled one stalls them all."""
    if requested is not None:
        return requested, given
    env = os.environ.get("OMP_NUM_THREADS", "")
    if env.isdigit() and int(env) > 0:
        return int(env), "set by OMP_NUM_THREADS"
    cpus = min(usable_cpus(), TORCH_THREADS)
    busy = os.getloadavg()[0] * cpus / (os.cpu_count() or cpus) if hasattr(os, "getloadavg") else 0.0
    return max(1, min(cpus, int(cpus - busy + 0.5))), f"{cpus} usable cores, load {busy:.1f}"


_threads_why = "torch's default"


def set_cpu_threads(requested: int | None, given: str = "set by --threads") -> int:
    """Set torch's CPU threads as pick_threads says, with a warning when they outnumber the usable cores; returns
    the count (train.py records it with the run)."""
    global _threads_why
    n, _threads_why = pick_threads(requested, given)
    cores = usable_cpus()
    if n > cores:    # oversubscribed: see pick_threads
        print(f"warning: {n} CPU threads ({_threads_why}) on {cores} usable cores: the threads wait for each other "
              f"at every parallel op; use --threads {cores} or fewer", file=sys.stderr)
    torch.set_num_threads(n)
    return n


def threads_note(device: torch.device) -> str:
    """The start line's CPU threads, with why and how to change them; empty on an accelerator."""
    if device.type != "cpu":
        return ""
    return f" threads={torch.get_num_threads()} ({_threads_why}; --threads N or OMP_NUM_THREADS=N to change)"
