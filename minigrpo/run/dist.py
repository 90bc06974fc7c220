"""Several processes under torchrun: each rank samples its share of the tasks, gradients are summed over ranks
by an explicit all-reduce, and only rank 0 writes. gloo on CPU, NCCL on CUDA. With one process (no WORLD_SIZE)
every function here is a no-op, and torch.distributed is never initialised.

Tensor collectives run on Dist.device: NCCL moves only CUDA tensors (a CPU one fails with "No backend type
associated with device type cpu"), gloo only CPU ones, so a tensor goes through update.py's all_reduce_ /
all_reduce_sum (the update's sums: the normaliser and the gradients), never to torch.distributed directly. Object collectives (all_gather_objects) need nothing: torch picks their device
from the backend itself (under NCCL the current GPU, which init_distributed sets)."""
import os
from dataclasses import dataclass, field

import torch


@dataclass
class Dist:
    rank: int = 0
    world: int = 1
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))   # where tensor collectives run

    @property
    def main(self):
        return self.rank == 0


def world_size() -> int:
    """The number of processes torchrun started (its WORLD_SIZE; 1 without torchrun)."""
    return int(os.environ.get("WORLD_SIZE", 1))


def init_distributed(device, timeout=None) -> Dist:
    """torchrun sets WORLD_SIZE; gloo on CPU, NCCL on CUDA. timeout (a timedelta): how long a collective waits for
    the other ranks before the run fails (train.py sets it from the run's longest phase: run/dist_timeout.py)."""
    world = world_size()
    if world == 1:
        return Dist()
    import torch.distributed as dist
    if device.type != "cuda":
        dist.init_process_group("gloo", timeout=timeout)
        return Dist(dist.get_rank(), world, torch.device("cpu"))     # gloo: CPU tensors, whatever the model's device
    if device.index is None:    # --device cuda: this rank's GPU, not GPU 0 for every rank
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
    torch.cuda.set_device(device)   # before the group: "cuda" and NCCL's object collectives mean this rank's GPU
    dist.init_process_group("nccl", timeout=timeout)
    return Dist(dist.get_rank(), world, device)


def finish_distributed():
    """Tear the process group down once training has ended on every rank. Left to the interpreter's exit, gloo's
    and NCCL's threads may meet their destructors first: C++ std::terminate ("terminate called without an active
    exception", SIGABRT) in one rank after a run that completed, seen once in CI in a 2-rank gloo run (the known
    cause: pytorch/pytorch#190489). Only after a run that ended well: a rank that raised may leave the others
    inside a collective, where a barrier would wait forever."""
    import torch.distributed as dist
    if dist.is_available() and dist.is_initialized():
        dist.barrier()              # no rank leaves while another still talks to it
        dist.destroy_process_group()


def all_gather_objects(obj, dist_info: Dist) -> list:
    if dist_info.world == 1:
        return [obj]
    import torch.distributed as dist
    out = [None] * dist_info.world
    dist.all_gather_object(out, obj)
    return out


def assert_replicas_in_sync(params, dist_info):
    """Every rank must hold the same trainable weights (same gradients, same optimizer): check a checksum."""
    if dist_info.world == 1:
        return
    total = sum(float(p.detach().double().sum()) for p in params)
    sums = all_gather_objects(total, dist_info)
    if any(s != sums[0] for s in sums):
        raise RuntimeError(f"ranks' weights diverged (checksums {sums}); this is a bug in gradient all-reduce")
