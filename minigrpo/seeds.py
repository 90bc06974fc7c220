"""Seeds. Every seed minigrpo derives from another (a prompt's samples from the run seed, the step and the example;
an epoch's data order; a record of the MDP) is derive_seed(parent, what, ...): splitmix64 folded over the parts, so
that no two derivations share a formula or a prime and nearby inputs give unrelated seeds. The sampler draws its
uniforms from the same hash (sampler.uniforms)."""
import hashlib
import random

import numpy as np
import torch


def _signed(c):
    return c - (1 << 64) if c >= 1 << 63 else c


_GOLDEN, _MIX1, _MIX2 = _signed(0x9E3779B97F4A7C15), _signed(0xBF58476D1CE4E5B9), _signed(0x94D049BB133111EB)


def logical_shr(z, k):
    """Logical right shift of int64 (torch's >> is arithmetic on negative values)."""
    return (z >> k) & ((1 << (64 - k)) - 1)


def splitmix64(x):
    """The splitmix64 finaliser on an int64 tensor (arithmetic wraps mod 2^64): a well-mixed 64-bit hash."""
    z = x + _GOLDEN
    z = (z ^ logical_shr(z, 30)) * _MIX1
    z = (z ^ logical_shr(z, 27)) * _MIX2
    return z ^ logical_shr(z, 31)


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
