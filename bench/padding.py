"""Padding share of a soyuz-shaped step's micro-batches: the rollout order they were once cut in vs train.py's
micro_batches (sorted by length), on the same synthetic steps in one run. CPU only, no model: lengths only.

    python bench/padding.py                       # 200 steps of the soyuz preset's shape (per process)
    python bench/padding.py --steps 1000 --micro-batch 8

A step of the soyuz preset (minigrpo/run/presets.py: tasks_per_step tasks, group_size answers each, then one revision
per answer) gives 2 x tasks x G sequences in rollout order: each answer's turn-0 sequence followed by its revision
(tasks/twoturn.py). A micro-batch is padded to its longest sequence, so

    padding share = pad tokens / all tokens of the step's micro-batches = 1 - real tokens / sum(B_mb x T_mb).

The lengths are synthetic (no model samples here), two distributions, each sequence's length drawn uniformly:
  short    turn 0 in [100, 300] tokens, revisions in [2600, 2936] (2936: the memory plan's longest revision)
  derived  turn 0 = a soyuz task prompt (its UTF-8 bytes / 3 + 16, as the memory plan estimates) + an answer of
           1..max_new_tokens tokens; the revision = that turn 0 + a 256-token critique + 1..max_new_tokens tokens
"""

import argparse
import json
import os
import random
import sys
from types import SimpleNamespace

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)  # run from anywhere
from minigrpo.run import memplan  # noqa: E402
from minigrpo.run.presets import PRESETS  # noqa: E402
from train import micro_batches  # noqa: E402


def rollout_order_batches(seqs, size):
    """The cut before sorting: consecutive sequences in rollout order."""
    return [seqs[i:i + size] for i in range(0, len(seqs), size)]


def padding_share(batches):
    """(pad tokens, all tokens) of left-padded micro-batches."""
    n = lambda s: len(s.prompt_ids) + len(s.completion_ids)
    total = sum(len(b) * max(map(n, b)) for b in batches)
    return total - sum(n(s) for b in batches for s in b), total


def seq(prompt, completion, turn):
    return SimpleNamespace(prompt_ids=[0] * prompt, completion_ids=[0] * completion, turn=turn)


def soyuz_step(rng, tasks, group, kind, max_new, prompts):
    """One step's Seqs in rollout order: per task, per answer, turn 0 then its revision."""
    out = []
    for _ in range(tasks):
        p = rng.choice(prompts)
        for _ in range(group):
            if kind == "short":
                t0, t1 = rng.randint(100, 300), rng.randint(2600, 2936)
                out += [seq(t0 // 2, t0 - t0 // 2, 0), seq(t1 // 2, t1 - t1 // 2, 1)]
            else:
                a, r = rng.randint(1, max_new), rng.randint(1, max_new)
                out += [seq(p, a, 0), seq(p + a + memplan.CRITIQUE_TOKENS, r, 1)]
    return out


def soyuz_prompt_tokens():
    with open(os.path.join(ROOT, "minigrpo", "data", "soyuz_tasks.json")) as f:
        return [len(t["prompt"].encode()) // 3 + 16 for t in json.load(f)]


def measure(kind, steps, tasks, group, size, max_new, seed=0):
    """{"old": (pad, total), "new": (pad, total)} summed over `steps` synthetic steps."""
    rng, prompts = random.Random(seed), soyuz_prompt_tokens()
    acc = {"old": [0, 0], "new": [0, 0]}
    for _ in range(steps):
        seqs = soyuz_step(rng, tasks, group, kind, max_new, prompts)
        for name, cut in (("old", rollout_order_batches), ("new", micro_batches)):
            pad, total = padding_share(cut(seqs, size))
            acc[name][0] += pad
            acc[name][1] += total
    return {k: tuple(v) for k, v in acc.items()}


def main(argv=None):
    pre = PRESETS["soyuz"]
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--tasks", type=int, default=pre["tasks_per_step"])
    p.add_argument("--group-size", type=int, default=pre["group_size"])
    p.add_argument("--micro-batch", type=int, default=pre["micro_batch"])
    p.add_argument("--max-new-tokens", type=int, default=pre["max_new_tokens"])
    args = p.parse_args(argv)
    print(f"soyuz-shaped steps: {args.tasks} tasks x G={args.group_size} x 2 turns = "
          f"{2 * args.tasks * args.group_size} sequences, micro-batch {args.micro_batch}, {args.steps} steps")
    print("| lengths | rollout order: padding share | sorted by length | tokens run, sorted / rollout order |")
    print("|---|---|---|---|")
    rows = {}
    for kind in ("short", "derived"):
        r = rows[kind] = measure(kind, args.steps, args.tasks, args.group_size, args.micro_batch, args.max_new_tokens)
        (po, to), (pn, tn) = r["old"], r["new"]
        print(f"| {kind} | {po / to:.1%} | {pn / tn:.1%} | {tn / to:.2f}x |")
    return rows


if __name__ == "__main__":
    main()
