"""The revise experiment end to end: `python train.py --task revise --model tiny --experiment`.

What soyuz's two-turn mechanics do, shown on a CPU: the recovery shaping s1 + coef·(s1 − s0) and the
guard that keeps turn-0 tokens on their own raw score, each taken away in turn. For each seed:

    base    a from-scratch tiny Qwen (mdp_pipeline.scratch_model) pretrained (sft_loop) on demonstrations of
            mixed quality (base_items): half its turn-0 answers are the letters sorted, half a random order; half
            its revisions apply the critique, half repeat the answer. It has both skills and neither habit, as the
            soyuz run's Qwen had (turn-0 0.652 before GRPO): sampled, it sorts about half the time and applies about
            half the critiques, which leaves each arm's reward something to select
    arms    from that same base, one GRPO run per arm through train.py's loop (the `trainer`), with train.py's flags
            (the revise preset) and only the shaping changed:
              coef 0.5 + guard     the soyuz run's recipe
              coef 0               the final score alone (guard on)
              coef 0.5, no guard   turn-0 tokens trained on the shaped final reward: the climb hack
    eval    base and each trained policy roll out the held-out eval split (letter sets no train prompt has) through
            the same two-turn rollout, `eval_samples` rollouts per prompt at temperature 1 with fixed seeds: the
            policy as it samples in training, the soyuz run's metrics over it

Each base (seed<N>-base/, a model folder) and each arm (its run folder) is a stage: a rerun into the same run folder
skips those finished with the same settings, one line each (minigrpo/experiments/stages.py). eval.py --task revise
evaluates a saved policy with this file's evaluate.

The report (report.write_revise_report) holds the soyuz run's table shape, base vs trained per arm, averaged over the
seeds and per seed, the differences with paired bootstrap intervals, and a PNG; everything lands in the run folder.

Why a mixed base rather than a format-only one as the mdp quickstart's: from a format-only base (ExperimentConfig
p_sorted = p_fixed = 0) the soyuz arm learns too slowly for a CPU budget, still climbing when it ends, too early a
stage to see what the shaping does to two working turns (the runs: docs/experiments.md).
"""
import argparse
import copy
import os
import sys
from dataclasses import asdict, dataclass, field, replace

import numpy as np
import torch

from minigrpo.machine import pick_device
from minigrpo.seeds import derive_seed
from minigrpo.evals import report
from minigrpo.experiments.mdp_pipeline import TINY_MDP, Clock, scratch_model
from minigrpo.experiments.stages import Stages, experiment_folder, model_stage
from minigrpo.experiments.supervised import sft_loop
from minigrpo.run import lock
from minigrpo.run.plots import read_metrics
from minigrpo.sampler import Settings, sample
from minigrpo.tasks.revise import RevisionTask, critique, grade, shuffled
from minigrpo.tasks.twoturn import recovery_metrics
from minigrpo.tokenizer import Tokenizer

ARMS = {                                   # name: (recovery coef, turn-0 guard)
    "coef 0.5 + guard": (0.5, True),
    "coef 0": (0.0, True),
    "coef 0.5, no guard": (0.5, False),
}


@dataclass
class ExperimentConfig:
    scratch: dict = field(default_factory=lambda: dict(TINY_MDP))   # the mdp quickstart's tiny model
    seeds: int = 2                  # --seed, --seed + 1, ...
    arms: tuple = tuple(ARMS)
    base_steps: int = 400           # the base's pretraining (sft_loop): batches of `batch`
    base_lr: float = 3e-3
    base_copies: int = 2            # demonstrations per train prompt and turn
    p_sorted: float = 0.5           # share of sorted turn-0 demonstrations
    p_fixed: float = 0.5            # share of turn-1 demonstrations that apply the critique
    batch: int = 16                 # sft_loop's micro-batch; grad_accum 1
    grad_accum: int = 1
    warmup: float = 0.05
    eval_split: str = "eval"
    eval_limit: int = 64            # eval prompts (the whole held-out split)
    eval_samples: int = 4           # rollouts per eval prompt, temperature 1


# -----------------------------------------------------------------------------------------------------------------
# The base: pretraining on demonstrations of mixed quality

def base_items(tok, task, copies: int, seed: int, p_sorted: float, p_fixed: float) -> list:
    """(prompt ids, answer ids) pairs of mixed quality, two per train prompt and copy: turn 0 answers the letters
    sorted with probability p_sorted, else in a random order; turn 1 sees that answer and its true critique, and
    applies the critique (writes the sorted letters) with probability p_fixed, else repeats the answer."""
    rng = np.random.default_rng(derive_seed(seed, "revise base"))
    items = []
    for ex in task.examples("train"):
        for k in range(copies):
            first = ex["target"] if rng.random() < p_sorted else shuffled(ex["target"], seed, "base", ex["id"], k)
            second = ex["target"] if rng.random() < p_fixed else first
            prompt, answer = tok.chat(task.messages(ex), enable_thinking=False), tok.encode(first) + [tok.im_end_id]
            said = [{"role": "user", "content": critique(ex, grade(ex, first))}]
            items.append((prompt, answer))
            revision = prompt + answer + tok.continuation(said, ended=True, enable_thinking=False)   # as episodes.py
            items.append((revision, tok.encode(second) + [tok.im_end_id]))
    return items


def pretrain_base(args, cfg, task, seed, device):
    model = scratch_model(cfg.scratch, seed, device, torch.float32)
    tok = Tokenizer.from_pretrained("tiny")
    items = base_items(tok, task, cfg.base_copies, seed, cfg.p_sorted, cfg.p_fixed)
    sft_loop(model, tok, list(model.parameters()), items, cfg.base_steps, cfg.base_lr, cfg,
             derive_seed(seed, "revise base"), "base", args.quiet)
    return model, tok


# -----------------------------------------------------------------------------------------------------------------
# Evaluation: the held-out prompts through the training rollout, sampled with fixed seeds

def evaluate(model, tok, task, args, cfg, seed, temperature=1.0, top_p=1.0) -> dict:
    """The soyuz run's metrics over eval_samples sampled rollouts of each eval prompt, and per rollout its (turn-0,
    final) scores in a fixed order (the pairs the bootstrap resamples). eval.py --task revise runs it too."""
    examples = task.examples(cfg.eval_split)[:cfg.eval_limit]
    eargs = argparse.Namespace(group_size=cfg.eval_samples, enable_thinking=False)
    seeds = [derive_seed(seed, "revise eval", i) for i in range(len(examples))]
    settings = Settings(n=cfg.eval_samples, max_new_tokens=args.max_new_tokens, temperature=temperature, top_p=top_p)

    def generate(prompts, ss, n, reuse=None, keep=False):
        out = sample(model, prompts, replace(settings, n=n), tokenizer=tok, seed=list(ss))
        return [out[i * n:(i + 1) * n] for i in range(len(prompts))]

    model.eval()
    with torch.no_grad():
        seqs = task.rollout(generate, tok, examples, seeds, eargs)
    m = recovery_metrics(seqs)
    m["pairs"] = [(a.score, b.score) for a, b in zip(seqs[0::2], seqs[1::2])]
    return m


# -----------------------------------------------------------------------------------------------------------------
# One arm: GRPO from the base through train.py's loop

def arm_args(args, name, run_dir, seed) -> argparse.Namespace:
    coef, guard = ARMS[name]
    slug = name.replace(" ", "").replace(",", "-").replace("+", "-").replace(".", "")
    return argparse.Namespace(**{**vars(args), "seed": seed, "recovery_coef": coef, "turn0_guard": guard,
                                 "experiment": False, "runs_dir": run_dir, "run_name": f"seed{seed}-{slug}",
                                 "resume": False, "quiet": True, "lora_r": 0, "beta": 0.0})


def run_arm(base, tok, args, cfg, name, run_dir, seed, trainer, stages):
    """A copy of the base trained by `trainer` (train.py's train) with this arm's shaping; its eval and curve. The
    arm's run folder (its checkpoints: model folders) is the stage's output: a rerun skips a finished arm."""
    aargs = arm_args(args, name, run_dir, seed)
    folder = os.path.join(run_dir, aargs.run_name)
    done = stages.done(f"seed {seed} {name}", folder)
    if done is not None:
        return done
    model = copy.deepcopy(base)
    params = [p for p in model.parameters() if p.requires_grad]
    task = RevisionTask(coef=aargs.recovery_coef, turn0_guard=aargs.turn0_guard)
    trainer(aargs, policy=(model, tok, params, None), task=task)
    result = evaluate(model, tok, task, args, cfg, seed)
    result["curve"] = [{k: r.get(k) for k in ("step", "turn0_score", "final_score")}
                       for r in read_metrics(os.path.join(folder, "metrics.jsonl"))]
    stages.finish(folder, result)
    return result


def base_stage(args, cfg, task, seed, device, run_dir, stages):
    """(base model, tokenizer, its eval): pretrained and saved to seed<N>-base, or loaded from there when an
    earlier run finished it."""
    folder = os.path.join(run_dir, f"seed{seed}-base")
    return model_stage(stages, f"seed {seed} base", folder, device,
                       lambda: pretrain_base(args, cfg, task, seed, device),
                       lambda base, tok: evaluate(base, tok, task, args, cfg, seed))


# -----------------------------------------------------------------------------------------------------------------
# The experiment

def run_experiment(args, trainer, cfg: ExperimentConfig | None = None) -> dict:
    """Every seed's base and arms, then the report. `trainer` is train.py's train(args, policy=, task=).
    Returns {"results": {seed: {"base" | arm: metrics}}, "run": folder, "time": ...}."""
    cfg = cfg or ExperimentConfig()
    device = pick_device(args.device)
    run_dir = experiment_folder(args, cfg, stage_settings(args, cfg))
    stages = Stages(stage_settings(args, cfg), "revise experiment")
    task, clock, results = RevisionTask(), Clock(), {}
    print(f"revise experiment: {cfg.seeds} seeds x {len(cfg.arms)} arms, {args.steps} GRPO steps each, "
          f"{len(task.examples(cfg.eval_split)[:cfg.eval_limit])} eval prompts x {cfg.eval_samples}; run={run_dir}",
          file=sys.stderr)
    for seed in range(args.seed, args.seed + cfg.seeds):
        torch.manual_seed(seed)
        base, tok, result = base_stage(args, cfg, task, seed, device, run_dir, stages)
        results[seed] = {"base": result}
        log_result(seed, "base", results[seed]["base"])
        clock.lap(f"seed {seed} base")
        for name in cfg.arms:
            results[seed][name] = run_arm(base, tok, args, cfg, name, run_dir, seed, trainer, stages)
            log_result(seed, name, results[seed][name])
            clock.lap(f"seed {seed} {name}")
    paths = report.write_revise_report(results, run_dir)
    total = clock.total()
    report.write_json({"results": results, "time": {**clock.rows, "total": total}},
                      os.path.join(run_dir, "results.json"))
    for name in ("revise_table.md", "revise_differences.md"):
        with open(paths[name]) as f:
            print("\n" + f.read().rstrip())
    print(f"\ntotal {total['wall_s']}s wall, {total['cpu_s']}s cpu; report in {run_dir}")
    lock.release(run_dir)
    return {"results": results, "run": run_dir, "time": total, "paths": paths}


def stage_settings(args, cfg) -> dict:
    """What the results depend on: each base and arm is a stage, which a rerun skips when it finished with these
    settings (minigrpo/experiments/stages.py), and a rerun with others is refused unless --redo."""
    quiet = ("quiet", "device", "runs_dir", "run_name", "log_to", "redo", "threads")   # how, not what
    return {"args": {k: v for k, v in vars(args).items() if k not in quiet}, "config": asdict(cfg)}


def log_result(seed, name, m):
    fmt = lambda x: "-" if x is None else f"{x:.3f}"
    print(f"  seed {seed} {name}: turn0 {fmt(m['turn0_score'])} final {fmt(m['final_score'])} "
          f"recovery {fmt(m['recovery'])} bad->good {fmt(m['bad_to_good'])} good->bad {fmt(m['good_to_bad'])}",
          file=sys.stderr)

