"""The verifier-MDP experiment end to end: `python train.py --task mdp --model tiny` (the mdp run on a CPU).

A policy reads a process state (probes left, how each of the eight probes would split the surviving candidate
programs) and answers one letter; the verifier runs that probe (minigrpo/tasks/mdp/world.py). The mdp run's recipe:

    0. baselines        random, minimax, max-split, same-budget oracle on the eval records (no model)
    1. base             the untrained policy. A real Qwen answers zero-shot: it knows the format and, reading the
                        prompt, not to ask the same thing twice, but not which probe is good; the mdp run's barely beat
                        random. A from-scratch model gets that much from a format pretraining: each train state's
                        prompt answered with its first letter not yet probed (format_items). It learns the answer
                        format, a letter bias and not to repeat a probe, nothing about the probes' worth: played
                        greedily it is random play without the wasted repeats (see format_items)
    2. SFT              cross-entropy on the oracle's letter (+ EOS): full-parameter for the from-scratch model,
                        LoRA (then folded into the weights) for a real Qwen
    3. process-DPO      LoRA on the SFT weights; pairs (oracle letter, one of the k worst letters); reference = the
                        SFT model itself under `adapters_disabled`; optionally + NLL of the chosen letter (RPO)
    4. GRPO             LoRA on the SFT weights through train.py's loop (run_pipeline's `trainer`): G
                        letters per state, reward = the letter's process reward (its oracle value)
    5. controls         process-DPO on shuffled rewards (MDPTask(shuffle_rewards=True)); the process-DPO policy
                        evaluated on prompts whose split summaries are scrambled across letters
    6. report           every policy plays the eval records greedily at budgets 0..3 (one batched sampler call
                        per step over all records); report.write_mdp_report writes the mdp run's two tables
                        (Markdown, CSV), the paired differences, how each policy's probes compare with the
                        rules' (probe_choices) and the plot into the run folder, with the SFT weights and the
                        LoRA adapters

Each stage's output is a folder of the run (base/, sft/ or sft_adapter/, dpo_adapter/, dpo_shuffled_adapter/,
grpo_adapter/ with the GRPO run in grpo/): a rerun into the same run folder skips the stages finished with the same
settings, one line each, and ends with the same results (minigrpo/experiments/stages.py).

Stage settings live in PIPELINES, picked by --model: "tiny" is the CPU quickstart, any other model id the mdp run's
GPU recipe (Qwen/Qwen3.5-4B: SFT 360 steps, DPO 160, GRPO 120 with G = 8, batch 2 x grad-accum 2).

What a from-scratch byte-level model needs to learn the task in CPU minutes (the compact prompt, the
scratch_model init, many steps at batch 16, renamed copies of the states, DPO with the NLL term) is
measured in docs/mdp.md.

Every stage trains on `answer` = one letter + <|im_end|>; a sequence's log-prob is the sum over those tokens.
"""
import argparse
import json
import os
import sys
import time
from dataclasses import asdict, dataclass

import torch

from minigrpo.files import atomic_write
from minigrpo.machine import pick_device, pick_dtype
from minigrpo.seeds import derive_seed
from minigrpo.evals import report
from minigrpo.experiments.stages import Stages, rng_kept, save_model
from minigrpo.experiments.supervised import dpo_loop, sft_loop
from minigrpo.lora import fold_lora, inject_lora, strip_lora
from minigrpo.run.lora_files import load_adapter, save_adapter
from minigrpo.model import Qwen
from minigrpo.pretrained import QwenConfig
from minigrpo.pretrained import load_pretrained
from minigrpo.run.folder import RunFolder
from minigrpo.sampler import Settings, sample
from minigrpo.tasks.mdp import world as mdp
from minigrpo.tasks.mdp.task import MDPTask, messages_for, parse_letter, relabel
from minigrpo.tokenizer import Tokenizer


@dataclass
class PipelineConfig:
    prompt: str = "full"            # tasks/mdp/task.py prompt style: "full" (mdp.render) or "compact"
    scratch: dict | None = None     # QwenConfig.tiny overrides of a from-scratch model; None = load --model
    train_per_cell: int = 80        # train records per (regime, library size) cell; 3 states each at most
    eval_per_cell: int = 16         # the mdp run: 16 -> 128 eval records
    eval_split: str = "eval"        # the records the report plays ("train" only in the shrunken test run)
    base_steps: int = 0             # format-only pretraining of a from-scratch model (see format_items)
    relabel: int = 0                # base and SFT also train on this many renamed copies of each state (mdp.relabel)
    sft_steps: int = 360
    sft_lr: float = 1e-4
    sft_lora: bool = True           # False: full-parameter SFT (fp32 weights)
    batch: int = 2                  # sequences (DPO: pairs) per micro-batch
    grad_accum: int = 2             # micro-batches per optimizer step
    dpo_steps: int = 160
    dpo_lr: float = 2e-5
    dpo_beta: float = 0.1
    dpo_rejected: int = 7           # pairs per state: the oracle's letter against the k worst letters
    dpo_nll: float = 0.0            # + this x the chosen answer's NLL per token (RPO); 0 = plain DPO
    lora_r: int = 32
    lora_alpha: float = 32
    grpo_steps: int = 120
    grpo_lr: float = 1e-5
    group_size: int = 8
    grpo_tasks: int = 4             # states per GRPO step (batch 2 x grad-accum 2)
    grpo_beta: float = 0.0
    max_new_tokens: int = 4         # a letter and <|im_end|>; a little room for "(C)"
    warmup: float = 0.05            # fraction of each stage's steps


# The quickstart model: QwenConfig.tiny's size and layout (Qwen3, byte vocabulary, tied embeddings, 166k
# parameters) with rope_theta 1e4 instead of 1e6: over a 90-token prompt the slow 1e6 frequencies barely rotate.
# (A width of 128 reads the columns better at twice the time: docs/mdp.md.)
TINY_MDP = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
                num_key_value_heads=2, head_dim=16, rope_theta=10000.0)

# The quickstart plays 64 eval records per cell (512) where the mdp run played 16 (128): one record is then 0.2 points,
# not 0.8, and the untrained rows (random, base) stop trading places from one seed to the next.
PIPELINES = {
    "tiny": PipelineConfig(prompt="compact", scratch=TINY_MDP, train_per_cell=80, eval_per_cell=64,
                           base_steps=800, sft_steps=3000, sft_lr=3e-3, sft_lora=False, relabel=7, batch=16,
                           grad_accum=1, dpo_steps=150, dpo_lr=2e-3, dpo_beta=0.1, dpo_rejected=2, dpo_nll=1.0,
                           lora_r=16, lora_alpha=32, grpo_steps=30, grpo_lr=1e-3, group_size=8, grpo_tasks=8,
                           max_new_tokens=2),
    "Qwen/Qwen3.5-4B": PipelineConfig(),
}


# The train.py flags the pipeline reads. Every other flag (--lr, --steps, --group-size, ...) would set one stage of
# several at best, so train.py refuses them with --task mdp instead of ignoring them: edit PIPELINES.
FLAGS = ("task", "model", "seed", "device", "dtype", "threads", "runs_dir", "run_name", "quiet", "plan")


def pipeline_config(model: str) -> PipelineConfig:
    """The stage settings for --model: its own entry, else the mdp run's GPU recipe (any real Qwen checkpoint)."""
    return PIPELINES.get(model, PIPELINES["Qwen/Qwen3.5-4B"])


# -----------------------------------------------------------------------------------------------------------------
# Models

def scratch_config(overrides: dict) -> QwenConfig:
    return QwenConfig.from_dict({**QwenConfig.tiny("tiny").raw, **overrides}, source="mdp_pipeline.TINY_MDP")


def scratch_model(overrides: dict, seed: int, device, dtype) -> Qwen:
    """A from-scratch Qwen3 for the byte tokenizer: QwenConfig.tiny with `overrides`. Every matrix starts at
    normal(0, 1/fan_in): at width 64 HF's normal(0, 0.02) shrinks each layer's output ~6x, the attention branches
    start near silent, and the model sits at the letter marginal for thousands of steps before it finds the
    read-the-column circuit."""
    model = Qwen(scratch_config(overrides))
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():  # norms stay at 1; the tied embedding (V, H) gets std 1/sqrt(H)
            if p.ndim == 2:
                p.copy_(torch.randn(p.shape, generator=g) / p.shape[1] ** 0.5)
    return model.to(device=device, dtype=torch.float32 if dtype is None else dtype)


def build_model(args, cfg: PipelineConfig, device, dtype):
    if cfg.scratch is not None:
        # trained in full: fp32 weights (bf16 cannot absorb small updates)
        return scratch_model(cfg.scratch, args.seed, device, torch.float32), Tokenizer.from_pretrained("tiny")
    return load_pretrained(args.model, dtype=dtype, device=device), Tokenizer.from_pretrained(args.model)


# -----------------------------------------------------------------------------------------------------------------
# Sequences: prompt ids + answer ids (the SFT and DPO loops that train on them: minigrpo/experiments/supervised.py)

def prompt_ids(tok, task, text: str) -> list:
    return tok.chat(messages_for(text, task.prompt), enable_thinking=False)


def answer_ids(tok, letter: str) -> list:
    return tok.encode(letter) + [tok.im_end_id]


# -----------------------------------------------------------------------------------------------------------------
# Stages

def first_free_letter(probed: str) -> str:
    """The format pretraining's answer: the first letter, A to H, not probed yet. It depends on nothing but the
    prompt's list of probed letters, never on what a probe would tell."""
    return next(c for c in mdp.LETTERS if c not in probed)


def train_states(task, copies=0, seed=0) -> list:
    """The train states and `copies` renamed copies of each (seeded letter permutations; tasks/mdp.relabel)."""
    exs = task.examples("train")
    return exs + [relabel(ex, mdp.seeded_rng(seed, "relabel", ex["id"], k).permutation(mdp.N_PROBES))
                  for ex in exs for k in range(copies)]


def rule_states(task) -> list:
    """The train records played by first_free_letter from the full budget: the states the base meets when it plays
    (probed "", "A", "AB"), which the train states seldom contain."""
    out = []
    for rec in task.records("train"):
        state = mdp.new_state(rec, mdp.MAX_BUDGET)
        for _ in range(mdp.MAX_BUDGET):
            out.append(state)
            state = mdp.advance(state, first_free_letter(state["probed"]))
    return out


def format_items(tok, task, copies=0, seed=0):
    """Format-only pretraining data: each train state's prompt (and renamed copies) and the train records played by
    the rule itself (rule_states), answered with the first free letter. The copies and the rule's own states
    matter: the base plays A then B, and in the train states A and B are seldom the probed letters; trained on
    those alone, the model asks B again after "probed=AB" (a wasted third probe).

    Why this answer: it beats random play by exactly what random wastes on repeated probes, and nothing more
    (a rule that also skipped the probes the prompt shows to split nothing would solve about as much as SFT,
    and the base would no longer be an untrained policy); the measurements are in docs/mdp.md."""
    texts = [(task.text(ex), ex["probed"]) for ex in train_states(task, copies, seed)]
    texts += [(mdp.state_text(st, task.scramble), st["probed"]) for st in rule_states(task)]
    return [(prompt_ids(tok, task, text), answer_ids(tok, first_free_letter(probed))) for text, probed in texts]


def sft_items(tok, task, copies=0, seed=0):
    """The oracle's letter for each train state and its renamed copies."""
    return [(prompt_ids(tok, task, task.text(ex)), answer_ids(tok, task.sft_target(ex)))
            for ex in train_states(task, copies, seed)]


def dpo(model, tok, task, cfg, seed, stage, quiet):
    """Process-DPO with fresh LoRA adapters; the reference is the same model with the adapters off."""
    params = inject_lora(model, r=cfg.lora_r, alpha=cfg.lora_alpha)
    pairs = []
    for ex in task.examples("train"):
        p = prompt_ids(tok, task, task.text(ex))
        # worst first: the widest value gaps. Near-ties (0.99 vs 1.0) are mostly target-dependent detail the
        # policy cannot see; pushing them down as hard as a useless probe made DPO worse than SFT
        pairs += [(p, answer_ids(tok, c), answer_ids(tok, r)) for c, r in task.dpo_pairs(ex)[:cfg.dpo_rejected]]
    dpo_loop(model, tok, params, pairs, cfg, seed, stage, quiet)


def grpo_stage(model, tok, args, cfg, task, run_dir, trainer):
    """GRPO through `trainer` (train.py's train), on LoRA adapters over the SFT weights (reference: adapters off)."""
    params = inject_lora(model, r=cfg.lora_r, alpha=cfg.lora_alpha)
    gargs = argparse.Namespace(**{
        **vars(args), "algo": "grpo", "steps": cfg.grpo_steps, "epochs": 1, "lr": cfg.grpo_lr, "warmup": 0,
        "schedule": "constant", "group_size": cfg.group_size, "tasks_per_step": cfg.grpo_tasks,
        "micro_batch": cfg.batch * 2, "max_new_tokens": cfg.max_new_tokens, "temperature": 1.0, "top_p": 1.0,
        "top_k": 0, "beta": cfg.grpo_beta, "mu": 1, "lora_r": cfg.lora_r, "lora_alpha": cfg.lora_alpha,
        "runs_dir": run_dir, "run_name": "grpo", "save_every": cfg.grpo_steps, "keep_checkpoints": 1,
        "resume": False, "enable_thinking": False, "quiet": True, "data": None})
    trainer(gargs, policy=(model, tok, params, None), task=task)
    model.eval()


# -----------------------------------------------------------------------------------------------------------------
# Evaluation

def greedy_policy(model, tok, task, max_new_tokens):
    """A batched policy for mdp.evaluate: one greedy sampler call over all records' prompts per step. An answer
    that is not a letter A-H becomes "?" (the probe is spent on nothing); `invalid` counts them."""
    invalid = [0, 0]
    greedy = Settings(n=1, max_new_tokens=max_new_tokens, temperature=0.0)

    def policy(texts, states):
        prompts = [prompt_ids(tok, task, t) for t in texts]
        out = sample(model, prompts, greedy, tokenizer=tok)
        letters = [parse_letter(s.text) for s in out]
        invalid[0] += sum(x is None for x in letters)
        invalid[1] += len(letters)
        return [x or "?" for x in letters]
    policy.invalid = invalid
    return policy


def evaluate_model(model, tok, task, cfg, label, results, invalid):
    model.eval()
    policy = greedy_policy(model, tok, task, cfg.max_new_tokens)
    with torch.no_grad():
        results[label] = task.evaluate(policy, cfg.eval_split, batched=True)
    invalid[label] = policy.invalid
    solved = [100 * results[label]["overall"][b]["solved"] for b in sorted(results[label]["overall"])]
    print(f"  {label}: solved@0..3 " + " ".join(f"{x:.1f}%" for x in solved), file=sys.stderr)


# -----------------------------------------------------------------------------------------------------------------
# The pipeline

class Clock:
    """Wall and CPU seconds per stage (the machine may be shared: CPU time is the steadier measure)."""

    def __init__(self):
        self.rows, self.t0, self.c0 = {}, time.perf_counter(), time.process_time()
        self.last = (self.t0, self.c0)

    def lap(self, stage):
        now = (time.perf_counter(), time.process_time())
        self.rows[stage] = {"wall_s": round(now[0] - self.last[0], 1), "cpu_s": round(now[1] - self.last[1], 1)}
        self.last = now
        print(f"[{stage}] {self.rows[stage]['wall_s']}s wall, {self.rows[stage]['cpu_s']}s cpu", file=sys.stderr)

    def total(self):
        return {"wall_s": round(time.perf_counter() - self.t0, 1), "cpu_s": round(time.process_time() - self.c0, 1)}


def run_pipeline(args, trainer, cfg: PipelineConfig | None = None) -> dict:
    """All stages in order; `trainer` is train.py's train(args, policy=, task=), which runs the GRPO stage.
    Returns {"results": {policy: mdp.evaluate(...)}, "run": folder, "time": ...}."""
    cfg = cfg or pipeline_config(args.model)
    device = pick_device(args.device)
    dtype = pick_dtype(args.dtype, device)
    torch.manual_seed(args.seed)
    run_dir = os.path.join(args.runs_dir, args.run_name)
    RunFolder(args.runs_dir, args.run_name).mark()     # not a run's, or another writer's: one line, nothing written
    # eval.py reads the prompt style and the tokenizer from here (a from-scratch model's folder has none)
    atomic_write(os.path.join(run_dir, "pipeline.json"), json.dumps(
        {"model": args.model, "tokenizer": "tiny" if cfg.scratch is not None else args.model, "seed": args.seed,
         "device": str(device), **asdict(cfg)}, indent=2))
    opts = dict(train_per_cell=cfg.train_per_cell, eval_per_cell=cfg.eval_per_cell, seed=args.seed,
                prompt=cfg.prompt)
    task, shuffled, scrambled = MDPTask(**opts), MDPTask(shuffle_rewards=True, **opts), MDPTask(scramble=True, **opts)
    clock, results, invalid = Clock(), {}, {}
    print(f"mdp pipeline: model={args.model} device={device} run={run_dir}\n"
          f"  {len(task.records('train'))} train records -> {len(task.examples('train'))} states, "
          f"{len(task.records(cfg.eval_split))} {cfg.eval_split} records played", file=sys.stderr)
    base = task.baselines(cfg.eval_split)
    clock.lap("data+baselines")

    # each stage's output is its folder; a rerun skips the stages finished with these settings (stages.py)
    stages = Stages({"model": args.model, "seed": args.seed, "dtype": args.dtype, **asdict(cfg)}, "mdp pipeline")
    at = lambda name: os.path.join(run_dir, name)
    model, tok = build_model(args, cfg, device, dtype)
    if not restore(stages.done("base", at("base")), results, invalid):
        if cfg.scratch is not None:
            sft_loop(model, tok, list(model.parameters()), format_items(tok, task, cfg.relabel, args.seed),
                     cfg.base_steps, cfg.sft_lr, cfg, derive_seed(args.seed, "pretrain"), "pretrain", args.quiet)
            save_model(model, at("base"), tok)
        evaluate_model(model, tok, task, cfg, "base", results, invalid)
        stages.finish(at("base"), stage_result(results, invalid, "base"))
    elif cfg.scratch is not None:
        with rng_kept():
            model = load_pretrained(at("base"), device=device)
    clock.lap("base")

    sft_dir = at("sft_adapter" if cfg.sft_lora else "sft")
    if not restore(stages.done("sft", sft_dir), results, invalid):
        params = list(model.parameters()) if not cfg.sft_lora else inject_lora(model, cfg.lora_r, cfg.lora_alpha)
        sft_loop(model, tok, params, sft_items(tok, task, cfg.relabel, args.seed), cfg.sft_steps, cfg.sft_lr, cfg,
                 derive_seed(args.seed, "sft"), "sft", args.quiet)
        if cfg.sft_lora:   # a real Qwen: keep the adapter (not a second copy of the weights), then fold it in
            save_adapter(model, sft_dir, args.model)
            fold_lora(model)
        else:
            save_model(model, sft_dir, tok)
        evaluate_model(model, tok, task, cfg, "SFT", results, invalid)
        stages.finish(sft_dir, stage_result(results, invalid, "SFT"))
    else:
        with rng_kept():   # the SFT weights again: the adapter folded into the base, or the full weights
            if cfg.sft_lora:
                load_adapter(model, sft_dir, dropout=0.0)
                fold_lora(model)
            else:
                model = load_pretrained(sft_dir, device=device)
    if not cfg.sft_lora:   # what the stage adapters name as their base: these weights' folder, or --model
        model.name_or_path = os.path.abspath(sft_dir)
    clock.lap("sft")

    model.requires_grad_(False)   # from here on only LoRA adapters train; the SFT weights are the reference
    if not restore(stages.done("dpo", at("dpo_adapter")), results, invalid):
        dpo(model, tok, task, cfg, derive_seed(args.seed, "dpo"), "dpo", args.quiet)
        save_adapter(model, at("dpo_adapter"))
        evaluate_model(model, tok, task, cfg, "process-DPO", results, invalid)
        evaluate_model(model, tok, scrambled, cfg, "scrambled-features DPO", results, invalid)
        strip_lora(model)
        stages.finish(at("dpo_adapter"), stage_result(results, invalid, "process-DPO", "scrambled-features DPO"))
    clock.lap("dpo")

    if not restore(stages.done("dpo-shuffled", at("dpo_shuffled_adapter")), results, invalid):
        dpo(model, tok, shuffled, cfg, derive_seed(args.seed, "dpo"), "dpo-shuffled", args.quiet)
        save_adapter(model, at("dpo_shuffled_adapter"))
        evaluate_model(model, tok, task, cfg, "shuffled-reward DPO", results, invalid)
        strip_lora(model)
        stages.finish(at("dpo_shuffled_adapter"), stage_result(results, invalid, "shuffled-reward DPO"))
    clock.lap("dpo-shuffled")

    if not restore(stages.done("grpo", at("grpo_adapter"), at("grpo")), results, invalid):
        grpo_stage(model, tok, args, cfg, task, run_dir, trainer)
        save_adapter(model, at("grpo_adapter"))
        evaluate_model(model, tok, task, cfg, "GRPO", results, invalid)
        strip_lora(model)
        stages.finish(at("grpo_adapter"), stage_result(results, invalid, "GRPO"))
    clock.lap("grpo")

    results = {**base, **results}                 # finish puts the rows in ORDER
    return finish(results, invalid, clock, run_dir, args)


def stage_result(results, invalid, *labels) -> dict:
    return {"results": {k: results[k] for k in labels}, "invalid": {k: invalid[k] for k in labels}}


def restore(saved, results, invalid) -> bool:
    """A skipped stage's rows back into the run's results; False when the stage has to run."""
    if saved is None:
        return False
    results.update(saved["results"])
    invalid.update(saved["invalid"])
    return True


ORDER = ("random", "base", "SFT", "process-DPO", "shuffled-reward DPO", "scrambled-features DPO", "GRPO",
         "minimax", "max-split", "oracle")


def finish(results, invalid, clock, run_dir, args) -> dict:
    results = {k: results[k] for k in ORDER if k in results}
    paths = report.write_mdp_report(results, run_dir)
    total = clock.total()
    with open(os.path.join(run_dir, "results.json"), "w") as f:
        json.dump({"results": results, "invalid_answers": invalid, "time": {**clock.rows, "total": total}}, f,
                  indent=2, default=str)
    for name in ("overall_by_policy_budget", "regime_split", "differences", "probe_choices"):
        with open(paths[f"{name}.md"]) as f:
            print("\n" + f.read().rstrip())
    bad = ", ".join(f"{k} {n}/{m}" for k, (n, m) in invalid.items() if n)
    print(f"\ninvalid answers: {bad or 'none'}")
    print(f"total {total['wall_s']}s wall, {total['cpu_s']}s cpu; report and weights in {run_dir}")
    RunFolder(args.runs_dir, args.run_name).release()      # marked (and held) by run_pipeline
    return {"results": results, "run": run_dir, "time": total, "invalid": invalid}
