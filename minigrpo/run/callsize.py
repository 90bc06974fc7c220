"""How many of a step's examples one sampler call of a multi-turn task takes (the task's `chunk`, read by
minigrpo/tasks/episodes.py): all of the rank's share, so that each turn is one sampler call (rows = examples x G;
the revision call likewise), unless the memory plan (memplan.py) says those rows do not fit the GPU; then the largest
number of examples whose rows do.

Why one call per turn: a decode step reads every weight once whatever the rows, so a call of 24 rows costs about
1.45x one of 6 on a GPU, where soyuz's old chunks of one task made 8 calls of 6 rows a step. Judging still overlaps
what it can: the judge grades a call's answers in its worker pool as soon as the call returns, and a task given a
smaller chunk samples the next chunk meanwhile. docs/benchmarks.md has the trade-off against a slow judge.

Sampling does not depend on the chunk: every row is seeded by its example and its place in the example's G
(episodes.turn_seed), so a GPU that fits fewer rows samples the same episodes in more calls.
"""
import math
from dataclasses import replace

import torch


def planned_chunk(args, n_examples, capacity, dtype) -> tuple[int, float, float]:
    """(examples per sampler call, the bytes the memory plan needs for them, for all n_examples in one call) on a GPU
    of `capacity` bytes: the largest count whose calls fit, 1 if none does (a call holds at least one example's G)."""
    from minigrpo.run import memplan     # on use: only a multi-turn task on a GPU reads the plan (not a CPU run's import)
    cfg, _ = memplan.load_config(args.model)
    shape, s = memplan.run_shape(args, n_examples * args.group_size)     # rows: replaced for each count below
    costs = memplan.layer_costs(cfg, dtype, s["lora_r"], s["targets"], **s["switches"])   # once: each count reuses it
    peak = "peak_ckpt" if args.grad_checkpoint else "peak"

    def need(examples):      # a later turn's call: every row is a prompt of its own (its conversation so far)
        rows = examples * s["group_size"]
        p = memplan.plan(cfg, replace(shape, rollout_prompts=rows, rollout_rows=rows), dtype, s["lora_r"],
                         s["targets"], s["beta"], costs=costs, fast_decode=getattr(args, "decode", None) != "eager",
                         **s["switches"])
        return memplan.needed_bytes(p[peak])

    whole = need(n_examples)
    if whole <= capacity:
        return n_examples, whole, whole
    chunk = next((c for c in range(n_examples - 1, 0, -1) if need(c) <= capacity), 1)
    return chunk, need(chunk), whole


def size_calls(task, args, device, dtype, world) -> str:
    """Set a multi-turn task's chunk for this machine; returns the start-up line's words for it ('' for a task
    that samples each turn in one call by construction). A task with a chunk of its own (terminal: its late
    prompts are long) keeps it; one with none (soyuz, revise, lookup) gets all of the rank's examples of a step per
    call, or on a GPU the largest count the memory plan fits. Never more than a step's: the greedy validation
    (G = 1, up to --eval-limit examples) then samples in calls of as many examples, whose rows the plan covers."""
    if not hasattr(task, "chunk"):
        return ""
    n, G = math.ceil(args.tasks_per_step / world), args.group_size       # the largest share of a rank
    if task.chunk is None and torch.device(device).type == "cuda":
        capacity = torch.cuda.get_device_properties(device).total_memory
        task.chunk, chosen, whole = planned_chunk(args, n, capacity, dtype)
        if task.chunk < n:
            over = f"; even these need {chosen / 1e9:.1f} GB (python train.py --plan)" if chosen > capacity else ""
            return (f"sampler calls of {task.chunk} of {n} tasks ({task.chunk * G} rows): the memory plan needs "
                    f"{whole / 1e9:.1f} GB for all {n * G} rows in one call, this GPU has {capacity / 1e9:.1f} GB"
                    + over)
    task.chunk = min(task.chunk or n, n)
    if task.chunk == n:
        return f"one sampler call per turn ({n} tasks x G={G} = {n * G} rows)"
    return f"sampler calls of {task.chunk} of {n} tasks ({task.chunk * G} rows)"
