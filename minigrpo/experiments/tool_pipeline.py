"""The tool-use demonstration end to end: `python tooluse.py` (a CPU, minutes): GRPO teaches a tiny model to call a
tool before it answers.

The task is minigrpo/tasks/lookup.py: "what is qx?", whose three-digit answer only the lookup tool knows. Stages:

    base    a from-scratch tiny Qwen (mdp_pipeline.scratch_model) pretrained (sft_loop) on transcripts of the
            "pretrain" split, whose keys and values no other split has (pretrain_transcripts). They teach the
            FORMAT: a share p_call of them call lookup and then answer the tool's value, a share p_right of those
            calls with the asked key and the rest with another key (whose value the answer copies, wrongly); the
            others answer at once with a value drawn at random (a guess, which on the eval keys always fails). So
            the base can call and copy, but calls only about half the time and then a quarter of the time with the
            wrong key: it knows how to call, not when, and not always what
    GRPO    a copy of the base trained through train.py's loop (the `trainer`) on the "train" split, the reward
            being the episode's score (1 for the right final answer), each episode trained as one sequence on its
            group-relative advantage; the tool results in it are never trained
    eval    base and trained policy play the held-out "eval" split (keys and values neither the pretraining nor
            GRPO saw), `eval_samples` episodes per key at temperature 1 with fixed seeds, through the same
            multi-turn loop (minigrpo/tasks/episodes.py)

Each stage's output is a folder of the run (base/: a model folder; grpo/: the GRPO run folder): a rerun into the
same run folder skips the stages finished with the same settings (minigrpo/experiments/stages.py).

The report (write_report): tool_table.{md,csv}, base vs trained with the difference and its paired bootstrap 95%
interval (episode i of both policies had the same key and sampling seed) for the success rate, the share of
episodes with a well-formed call, the share that asked the right key, malformed calls and turns per episode;
tool_curves.png, the GRPO run's training curves; results.json.
"""
import argparse
import copy
import csv
import os
import sys
from dataclasses import asdict, dataclass, field, replace

import numpy as np
import torch

from minigrpo.machine import pick_device
from minigrpo.metrics import mean
from minigrpo.seeds import derive_seed
from minigrpo.evals import report
from minigrpo.experiments.mdp_pipeline import TINY_MDP, Clock, scratch_model
from minigrpo.experiments.stages import Stages, experiment_folder, model_stage
from minigrpo.experiments.supervised import sft_loop
from minigrpo.run.flags import build_parser
from minigrpo.run import lock
from minigrpo.run.plots import read_metrics
from minigrpo.sampler import Settings, sample
from minigrpo.tasks import episodes
from minigrpo.tasks.lookup import LookupTask, call_text, question
from minigrpo.tokenizer import Tokenizer


@dataclass
class ExperimentConfig:
    scratch: dict = field(default_factory=lambda: dict(TINY_MDP))   # the mdp quickstart's tiny model
    transcripts: int = 4000         # pretraining transcripts (random pairs of pretrain keys and values)
    p_call: float = 0.5             # share of them that call the tool; the rest guess
    p_right: float = 0.75           # share of the calls made with the asked key; the rest ask another key
    base_steps: int = 1200          # sft_loop steps of `batch` turns
    base_lr: float = 3e-3
    batch: int = 16
    grad_accum: int = 1
    warmup: float = 0.05
    grpo_steps: int = 100
    grpo_lr: float = 3e-4
    group_size: int = 8             # episodes per key
    tasks_per_step: int = 8         # keys per GRPO step
    micro_batch: int = 64
    max_new_tokens: int = 80        # a call is 69 tokens of the byte vocabulary; an answer 4
    eval_split: str = "eval"
    eval_limit: int = 128           # eval keys (the whole held-out split)
    eval_samples: int = 4           # episodes per eval key, temperature 1


# -----------------------------------------------------------------------------------------------------------------
# The base: the format from transcripts of keys and values no other split holds

def pretrain_transcripts(task, cfg, seed) -> list:
    """`cfg.transcripts` conversations (the user's question, then assistant and tool turns) over the pretrain
    split: a random pretrain key asked; with probability p_call the lookup call (with the asked key with
    probability p_right, else another pretrain key), a tool turn holding a random pretrain value and the answer
    that copies it; else an answer of a random pretrain value at once. Keys and values are paired at random, so
    what is learnt is to copy, not a table."""
    table = task.tables["pretrain"]
    keys, values = sorted(table), sorted(table.values())
    rng = np.random.default_rng(derive_seed(seed, "lookup pretrain"))
    out = []
    for _ in range(cfg.transcripts):
        key = keys[rng.integers(len(keys))]
        conv = [{"role": "user", "content": question(key)}]
        value = values[rng.integers(len(values))]
        if rng.random() < cfg.p_call:
            asked = key if rng.random() < cfg.p_right else keys[rng.integers(len(keys))]
            conv += [{"role": "assistant", "content": call_text(asked)}, {"role": "tool", "content": value}]
        conv.append({"role": "assistant", "content": value})
        out.append(conv)
    return out


def pretrain_items(tok, task, transcripts) -> list:
    """(prompt ids, answer ids) per assistant turn: the prompt as the multi-turn loop builds it before that turn (the
    first prompt rendered, then each earlier answer's ids and the tool's reply rendered after them:
    minigrpo/tasks/episodes.py), the answer the turn's text and <|im_end|>."""
    items = []
    for conv in transcripts:
        context, replies = tok.chat(conv[:1], tools=task.tools, enable_thinking=False), []
        for m in conv[1:]:
            if m["role"] != "assistant":
                replies.append(m)
                continue
            if replies:
                context = context + tok.continuation(replies, ended=True, enable_thinking=False, tools=task.tools)
                replies = []
            answer = tok.encode(m["content"]) + [tok.im_end_id]
            items.append((context, answer))
            context = context + answer
    return items


def pretrain_base(args, cfg, task, seed, device):
    model = scratch_model(cfg.scratch, seed, device, torch.float32)
    tok = Tokenizer.from_pretrained("tiny")
    items = pretrain_items(tok, task, pretrain_transcripts(task, cfg, seed))
    sft_loop(model, tok, list(model.parameters()), items, cfg.base_steps, cfg.base_lr, cfg,
             derive_seed(seed, "lookup base"), "base", args.quiet)
    return model, tok


# -----------------------------------------------------------------------------------------------------------------
# Evaluation: the held-out keys through the training loop, sampled with fixed seeds

class Recorded:
    """The task, keeping every environment it makes, in order: each episode's outcome is read from its env."""

    def __init__(self, task):
        self.task, self.envs = task, []

    def __getattr__(self, name):
        return getattr(self.task, name)

    def env(self, ex, family="qwen3"):
        self.envs.append(self.task.env(ex, family))
        return self.envs[-1]


OUTCOMES = ("success", "called", "right_key", "tool_errors", "turns")


def outcome(env) -> dict:
    return {"success": float(env.score or 0.0), "called": float(env.calls > 0),
            "right_key": float(env.right_calls > 0), "tool_errors": float(env.errors), "turns": float(env.turns)}


def evaluate(model, tok, task, args, cfg, seed, temperature=1.0) -> dict:
    """The mean of each outcome over eval_samples sampled episodes of each eval key, and per episode its outcomes
    in a fixed order (what the paired bootstrap resamples)."""
    examples = task.examples(cfg.eval_split)[:cfg.eval_limit]
    eargs = argparse.Namespace(group_size=cfg.eval_samples, enable_thinking=False, max_new_tokens=cfg.max_new_tokens)
    seeds = [derive_seed(seed, "lookup eval", i) for i in range(len(examples))]
    settings = Settings(n=cfg.eval_samples, max_new_tokens=cfg.max_new_tokens, temperature=temperature)

    def generate(prompts, ss, n, reuse=None, keep=False):
        out = sample(model, prompts, replace(settings, n=n), tokenizer=tok, seed=list(ss))
        return [out[i * n:(i + 1) * n] for i in range(len(prompts))]

    recorded = Recorded(task)
    model.eval()
    with torch.no_grad():
        episodes.rollout(recorded, generate, tok, examples, seeds, eargs)
    rows = [outcome(e) for e in recorded.envs]
    return {**{k: mean([r[k] for r in rows]) for k in OUTCOMES}, "episodes": rows}


# -----------------------------------------------------------------------------------------------------------------
# GRPO from the base through train.py's loop

def grpo_args(args, cfg, run_dir, seed) -> argparse.Namespace:
    """train.py's flag defaults, with this experiment's GRPO settings: full fine-tuning, no KL, constant rate."""
    defaults = {a.dest: a.default for a in build_parser()._actions if a.dest != "help"}
    return argparse.Namespace(**{
        **defaults, "task": "lookup", "model": "tiny", "seed": seed, "device": args.device, "threads": args.threads,
        "steps": cfg.grpo_steps, "lr": cfg.grpo_lr, "warmup": 2, "schedule": "constant", "lora_r": 0, "beta": 0.0,
        "group_size": cfg.group_size, "tasks_per_step": cfg.tasks_per_step, "micro_batch": cfg.micro_batch,
        "max_new_tokens": cfg.max_new_tokens, "temperature": 1.0, "enable_thinking": False,
        "runs_dir": run_dir, "run_name": "grpo", "save_every": cfg.grpo_steps, "keep_checkpoints": 1,
        "resume": False, "quiet": True})


def grpo_stage(base, tok, args, cfg, task, run_dir, seed, trainer, stages):
    """A copy of the base trained by `trainer` (train.py's train); its eval and training curve. The GRPO run
    folder is the stage's output."""
    gargs = grpo_args(args, cfg, run_dir, seed)
    folder = os.path.join(run_dir, gargs.run_name)
    done = stages.done("grpo", folder)
    if done is not None:
        return done
    model = copy.deepcopy(base)
    trainer(gargs, policy=(model, tok, [p for p in model.parameters() if p.requires_grad], None), task=task)
    result = evaluate(model, tok, task, args, cfg, seed)
    result["curve"] = [{k: r.get(k) for k in ("step", "success", "called", "right_key", "turns", "tool_errors")}
                       for r in read_metrics(os.path.join(folder, "metrics.jsonl"))]
    stages.finish(folder, result)
    return result


def base_stage(args, cfg, task, seed, device, run_dir, stages):
    """(base model, tokenizer, its eval): pretrained and saved to base/, or loaded from there."""
    folder = os.path.join(run_dir, "base")
    return model_stage(stages, "base", folder, device, lambda: pretrain_base(args, cfg, task, seed, device),
                       lambda base, tok: evaluate(base, tok, task, args, cfg, seed))


# -----------------------------------------------------------------------------------------------------------------
# The report

LABELS = {"success": "success rate", "called": "episodes with a valid tool call", "right_key": "called the asked key",
          "tool_errors": "malformed calls per episode", "turns": "turns per episode"}


def table(results) -> tuple:
    """(header, rows): per outcome the base's and the trained policy's mean and trained - base with its paired
    bootstrap 95% interval (shares in points, counts per episode as they are)."""
    base, trained = results["base"]["episodes"], results["grpo"]["episodes"]
    if len(base) != len(trained):
        raise ValueError(f"the base played {len(base)} episodes, the trained policy "
                         f"{len(trained)}: not the same eval")
    header = ["metric", "base", "trained", "trained - base", "95% low", "95% high", "reading"]
    rows = []
    for k in OUTCOMES:
        diff, lo, hi = report.paired_bootstrap([r[k] for r in trained], [r[k] for r in base])
        scale = 1.0 if k in ("success", "called", "right_key") else 0.01     # paired_bootstrap gives points
        reading = "within noise" if lo <= 0 <= hi else ("above" if lo > 0 else "below")
        fmt = "{:+.1f}" if scale == 1.0 else "{:+.3f}"
        rows.append([LABELS[k], f"{results['base'][k]:.3f}", f"{results['grpo'][k]:.3f}",
                     *(fmt.format(x * scale) for x in (diff, lo, hi)), reading])
    return header, rows


def write_report(results, run_dir) -> dict:
    header, rows = table(results)
    paths = {name: os.path.join(run_dir, name) for name in ("tool_table.md", "tool_table.csv", "tool_curves.png")}
    with open(paths["tool_table.md"], "w") as f:
        f.write("\n".join(["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
                          + ["| " + " | ".join(r) + " |" for r in rows]) + "\n")
    with open(paths["tool_table.csv"], "w", newline="") as f:
        csv.writer(f).writerows([header] + rows)
    curve = results["grpo"]["curve"]
    drawn = report.plot_curves(curve, paths["tool_curves.png"], ["success", "called", "right_key", "turns"],
                               smooth=max(1, len(curve) // 10))
    if drawn is None:
        del paths["tool_curves.png"]
    return paths


# -----------------------------------------------------------------------------------------------------------------
# The experiment

def run_experiment(args, trainer, cfg: ExperimentConfig | None = None) -> dict:
    """The base, GRPO from it, both evaluated, the report. `trainer` is train.py's train(args, policy=, task=).
    Returns {"results": {"base" | "grpo": metrics}, "run": folder, "time": ..., "paths": ...}."""
    cfg = cfg or ExperimentConfig()
    device = pick_device(args.device)
    quiet = ("quiet", "device", "runs_dir", "run_name", "threads", "redo")
    settings = {"args": {k: v for k, v in vars(args).items() if k not in quiet}, "config": asdict(cfg)}
    run_dir = experiment_folder(args, cfg, settings)
    stages = Stages(settings, "tool-use experiment")
    task, clock = LookupTask(), Clock()
    print(f"tool-use experiment: base {cfg.base_steps} SFT steps, GRPO {cfg.grpo_steps} steps of "
          f"{cfg.tasks_per_step} keys x {cfg.group_size} episodes, eval {cfg.eval_limit} keys x {cfg.eval_samples}; "
          f"run={run_dir}", file=sys.stderr)
    torch.manual_seed(args.seed)
    results = {}
    base, tok, results["base"] = base_stage(args, cfg, task, args.seed, device, run_dir, stages)
    log_result("base", results["base"])
    clock.lap("base")
    results["grpo"] = grpo_stage(base, tok, args, cfg, task, run_dir, args.seed, trainer, stages)
    log_result("grpo", results["grpo"])
    clock.lap("grpo")
    paths = write_report(results, run_dir)
    total = clock.total()
    report.write_json({"results": results, "time": {**clock.rows, "total": total}},
                      os.path.join(run_dir, "results.json"))
    with open(paths["tool_table.md"]) as f:
        print("\n" + f.read().rstrip())
    print(f"\ntotal {total['wall_s']}s wall, {total['cpu_s']}s cpu; report in {run_dir}")
    lock.release(run_dir)
    return {"results": results, "run": run_dir, "time": total, "paths": paths}


def log_result(name, m):
    print(f"  {name}: " + " ".join(f"{k} {m[k]:.3f}" for k in OUTCOMES), file=sys.stderr)
