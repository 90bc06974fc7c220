"""Small helpers every part of minigrpo shares, one home each: the machine (device, dtype, CPU threads), usage
errors, seeds, left padding, atomic file writes, JSON files, ending a process group, a Ctrl-C that always stops,
a None-skipping mean and the clock of seconds by phase."""
import contextlib
import hashlib
import json
import os
import random
import signal
import sys
import time

import numpy as np
import torch

from minigrpo.signals import Terminated

DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data")   # the package's own data files

# ----------------------------------------------------------------------------------------------------------------
# The machine: one compute dtype per run, bf16 on CUDA and fp32 elsewhere (docs/qwen.md, "Precision")


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


# ----------------------------------------------------------------------------------------------------------------
# Usage errors: what a user can fix (a flag, a file, a key) is one line, never a traceback

class UsageError(Exception):
    """A flag or file the user can fix: the scripts print it as one line and exit with code 2."""


class Refusal(SystemExit):
    """A refusal that keeps data from harm (a folder another live process writes, a run that exists): the message
    is the one line, ending with what to do instead; the scripts exit with code 3."""


class StopRun(RuntimeError):
    """A run-policy rule stopped the run (a judge that is down, a checkpoint that cannot be written); the message
    names the cause, and train.py adds what the checkpoints hold and the command that continues the run."""


def first_line(e: Exception) -> str:
    """Library errors are one line already; hub/network errors are paragraphs: keep their first line."""
    return next((ln.strip() for ln in str(e).splitlines() if ln.strip()), type(e).__name__)


# ----------------------------------------------------------------------------------------------------------------
# Seeds. Every seed minigrpo derives from another (a prompt's samples from the run seed, the step and the example;
# an epoch's data order; a record of the MDP) is derive_seed(parent, what, ...): splitmix64 folded over the parts,
# so that no two derivations share a formula or a prime and nearby inputs give unrelated seeds.

def _signed(c):
    return c - (1 << 64) if c >= 1 << 63 else c


_GOLDEN, _MIX1, _MIX2 = _signed(0x9E3779B97F4A7C15), _signed(0xBF58476D1CE4E5B9), _signed(0x94D049BB133111EB)


def _shr(z, k):
    """Logical right shift of int64 (torch's >> is arithmetic on negative values)."""
    return (z >> k) & ((1 << (64 - k)) - 1)


def splitmix64(x):
    """The splitmix64 finaliser on an int64 tensor (arithmetic wraps mod 2^64): a well-mixed 64-bit hash."""
    z = x + _GOLDEN
    z = (z ^ _shr(z, 30)) * _MIX1
    z = (z ^ _shr(z, 27)) * _MIX2
    return z ^ _shr(z, 31)


def seed_everything(seed):
    """Seed every generator a run draws from outside the sampler: torch's, Python's and numpy's."""
    torch.manual_seed(seed)
    random.seed(seed)
    np.random.seed(seed)


def derive_seed(*parts) -> int:
    """A 63-bit seed (valid for numpy, torch and the sampler) from ints and strings: each part is folded in with
    splitmix64; a string counts by the first 8 bytes of its BLAKE2b hash."""
    h = 0
    for part in parts:
        x = part if isinstance(part, int) else \
            int.from_bytes(hashlib.blake2b(str(part).encode(), digest_size=8).digest())
        h = int(splitmix64(torch.tensor(_signed((h + x) % (1 << 64))))) % (1 << 64)
    return h >> 1


# ----------------------------------------------------------------------------------------------------------------
# Batching token ids


def left_pad(seqs, pad_id, device=None):
    """Token-id lists -> ids (B, L) padded on the left with pad_id and attention mask (B, L), 1 = real token. Left
    padding puts every row's last token in the last column: where generation continues and completions end."""
    L = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), L), pad_id, dtype=torch.long)
    mask = torch.zeros(len(seqs), L, dtype=torch.long)
    for i, s in enumerate(seqs):
        ids[i, L - len(s):] = torch.tensor(s, dtype=torch.long)
        mask[i, L - len(s):] = 1
    return ids.to(device), mask.to(device)


# ----------------------------------------------------------------------------------------------------------------
# Files and processes


def _umask() -> int:
    mask = os.umask(0)       # the only way to read it is to set it: put back at once
    os.umask(mask)
    return mask


def atomic_write(path: str, data, fsync: bool = True):
    """Write `data` (str, bytes, or a callable that writes a given temp path) to a temporary name next to `path`,
    then rename it into place: rename is atomic on POSIX, so a kill never leaves half a file."""
    tmp = f"{path}.tmp-{os.getpid()}"
    if callable(data):
        data(tmp)
        os.chmod(tmp, 0o666 & ~_umask())     # safetensors' writer makes its file 0600: the mode open() would give
    else:
        mode, encoding = ("wb", None) if isinstance(data, bytes) else ("w", "utf-8")
        with open(tmp, mode, encoding=encoding) as f:
            f.write(data)
            f.flush()
            if fsync:
                os.fsync(f.fileno())
    os.replace(tmp, path)
    return path


def read_json(path: str, missing: str, error=ValueError, fix: str = ""):
    """The parsed JSON file at `path`. A missing file raises FileNotFoundError "<path>: <missing>"; invalid JSON
    raises `error` "<path>: not valid JSON (<where>)<fix>": one line that names the file and what to do."""
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{path}: {missing}")
    with open(path) as f:
        try:
            return json.load(f)
        except json.JSONDecodeError as e:
            raise error(f"{path}: not valid JSON ({e}){fix}") from None


def kill_process_group(proc, wait: bool = True):
    """SIGKILL a child started with start_new_session=True and everything it spawned; a group already gone is
    fine. Then reap the child (wait=True) so that it leaves no zombie."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    if wait:
        proc.wait()


# Ctrl-C. Python's own handler raises KeyboardInterrupt wherever the main thread is; when that is inside a weakref
# callback or a finalizer (an import lock's, a tensor's), Python prints "Exception ignored" and the run goes on.
# The handler below also remembers the Ctrl-C, and the training loop asks at every step, so it always stops.
# SIGTERM is handled the same way and raises Terminated (a KeyboardInterrupt): the run stops as a Ctrl-C stops it.

_ctrl_c = None      # the exception a signal raised, to raise again at the next step


def _on_signal(signum, frame):
    global _ctrl_c
    _ctrl_c = Terminated if signum == signal.SIGTERM else KeyboardInterrupt
    raise _ctrl_c


def _unraisable(hook):
    def quiet_ctrl_c(info):   # remembered above, acted on at the next step: not a traceback for the user
        if not issubclass(info.exc_type, KeyboardInterrupt):
            hook(info)
    return quiet_ctrl_c


def catch_ctrl_c():
    """Install the remembering handler for SIGINT and SIGTERM in place of Python's default ones (or of
    signals.quiet_imports'); a signal ignored (a job started with `nohup ... &`) or handled by someone else stays
    as it is."""
    for sig, default in ((signal.SIGINT, signal.default_int_handler), (signal.SIGTERM, signal.SIG_DFL)):
        now = signal.getsignal(sig)
        if now is default or getattr(now, "quiet_imports", False):
            signal.signal(sig, _on_signal)
    if getattr(sys.unraisablehook, "__name__", "") != "quiet_ctrl_c":
        sys.unraisablehook = _unraisable(sys.unraisablehook)


def stop_if_ctrl_c():
    """Raise the KeyboardInterrupt a Ctrl-C raised where Python could not deliver it."""
    if _ctrl_c:
        raise _ctrl_c


# ----------------------------------------------------------------------------------------------------------------
# Numbers


def mean(xs):
    """Mean of the values that are not None; None when there are none (a metric with nothing to average)."""
    xs = [x for x in xs if x is not None]
    return sum(xs) / len(xs) if xs else None


class PhaseClock:
    """Seconds spent in each named phase since the last reset(), added up over its stretches (`with clock("policy"):
    ...`): train.py's one clock, used by its loop and by the functions that run inside a phase of it."""

    def __init__(self):
        self.times, self.opened = {}, {}

    def reset(self):
        """Start a new record (`times` of the one before stays as it was)."""
        self.times, self.opened = {}, {}

    def open(self, name):
        """Start a stretch of `name` that close(name) ends: one that begins in a callback and ends in its caller."""
        self.opened[name] = time.perf_counter()

    def close(self, name):
        t0 = self.opened.pop(name, None)
        if t0 is not None:          # never opened (the callback did not run): nothing spent
            self.times[name] = self.times.get(name, 0.0) + time.perf_counter() - t0

    @contextlib.contextmanager
    def __call__(self, name):
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.times[name] = self.times.get(name, 0.0) + time.perf_counter() - t0
