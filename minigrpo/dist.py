"""Several processes under torchrun: each rank samples its share of the tasks, gradients are summed over ranks
by an explicit all-reduce, and only rank 0 writes. gloo on CPU, NCCL on CUDA. With one process (no WORLD_SIZE)
every function here is a no-op, and torch.distributed is never initialised."""
import os
from dataclasses import dataclass

import torch


@dataclass
class Dist:
    rank: int = 0
    world: int = 1

    @property
    def main(self):
        return self.rank == 0


def init_distributed(device) -> Dist:
    """torchrun sets WORLD_SIZE; gloo on CPU, NCCL on CUDA."""
    world = int(os.environ.get("WORLD_SIZE", 1))
    if world == 1:
        return Dist()
    import torch.distributed as dist
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    return Dist(dist.get_rank(), world)


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


def all_reduce_(tensor, dist_info: Dist):
    if dist_info.world > 1:
        import torch.distributed as dist
        dist.all_reduce(tensor)
    return tensor


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
