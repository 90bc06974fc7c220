"""Small helpers every part of minigrpo shares, one home each: the machine (device, dtype), seeds, left padding,
atomic file writes, JSON files, ending a process group, and a None-skipping mean."""
import hashlib
import json
import os
import signal

import torch

# ----------------------------------------------------------------------------------------------------------------
# The machine: one compute dtype per run, bf16 on CUDA and fp32 elsewhere (DESIGN.md, "Precision and devices")


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


def derive_seed(*parts) -> int:
    """A 63-bit seed (valid for numpy, torch and the sampler) from ints and strings: each part is folded in with
    splitmix64; a string counts by the first 8 bytes of its BLAKE2b hash."""
    h = 0
    for part in parts:
        x = part if isinstance(part, int) else int.from_bytes(hashlib.blake2b(str(part).encode(), digest_size=8).digest())
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


def atomic_write(path: str, data, fsync: bool = True):
    """Write `data` (str, bytes, or a callable that writes a given temp path) to a temporary name next to `path`,
    then rename it into place: rename is atomic on POSIX, so a kill never leaves half a file."""
    tmp = f"{path}.tmp-{os.getpid()}"
    if callable(data):
        data(tmp)
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


# ----------------------------------------------------------------------------------------------------------------
# Numbers


def mean(xs):
    """Mean of the values that are not None; None when there are none (a metric with nothing to average)."""
    xs = [x for x in xs if x is not None]
    return sum(xs) / len(xs) if xs else None
