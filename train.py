"""train.py: GRPO post-training of a Qwen model, read as a recipe.

    python train.py --task synthetic --model tiny           # CPU, about a minute: the reward rises
    python train.py --task soyuz                             # GPU: the soyuz reference run (its preset)
    torchrun --nproc_per_node 8 train.py --task gsm8k        # several GPUs: DDP by explicit all-reduce

One optimizer step, as the data flows (DESIGN.md):

    examples ─► tokenizer.chat ─► sampler.sample(policy, n=G) ─► task.score (or a task's own multi-turn rollout)
      ─► grpo.group_advantages (per turn, on raw scores)
      ─► micro-batches ─► grpo.token_logprobs(policy), and under adapters_disabled() the reference
      ─► grpo.policy_loss + β·KL ─► backward ─► all-reduce ─► clip ─► AdamW ─► schedule ─► log ─► checkpoint

Everything a step needs to be repeated exactly (weights, optimizer, scheduler, every RNG, data position) is in
its checkpoint, and sampling is seeded by (seed, step, example), so `--resume` after a kill reproduces the
uninterrupted run bit for bit on the same machine.
"""
import argparse
import math
import os
import random
import sys
import time
from dataclasses import dataclass

import numpy as np
import torch

from minigrpo import grpo
from minigrpo.lora import adapters_disabled, inject_lora
from minigrpo.model import Qwen
from minigrpo.dist import all_gather_objects, all_reduce_, assert_replicas_in_sync, init_distributed
from minigrpo.runs import (RunFolder, epoch_summary, load_checkpoint, mean, rng_state, sample_records,
                           save_checkpoint, set_rng_state, step_metrics)
from minigrpo.sampler import sample
from minigrpo.tasks import TASKS, Seq, get_task
from minigrpo.tokenizer import Tokenizer

# -----------------------------------------------------------------------------------------------------------------
# Arguments and presets. Every flag defaults to None so that we can tell "not given" apart: the value used is the
# flag if given, else the task's preset, else DEFAULTS. All resolved values go to runs/<name>/config.json.

DEFAULTS = dict(
    model="tiny", preset=None, algo="grpo",
    group_size=8, tasks_per_step=8, steps=None, epochs=1,
    lora_r=32, lora_alpha=32, lora_dropout=0.0, lora_targets=None,
    lr=1e-5, warmup=0, schedule="cosine", weight_decay=0.0, max_grad_norm=1.0, adam_beta2=0.999,
    beta=0.0, kl="k3", eps_low=0.2, eps_high=0.28, mu=1, agg="token", adv_scale="group",
    temperature=1.0, top_p=1.0, top_k=0, max_new_tokens=256, enable_thinking=False,
    micro_batch=8, seed=0, dtype=None, device=None, grad_checkpoint=False,
    runs_dir="runs", run_name=None, save_every=50, keep_checkpoints=2, eval_every=0, eval_limit=64, resume=False,
    judge="local", judge_workers=8, judge_model=None, judge_max_turns=None, judge_mode="hybrid", data=None,
    mask_truncated=False,
    quiet=False,
)

# The reference runs' settings (DESIGN.md table, shared/seeds). Where a seed is silent, the README says why each
# value was chosen.
PRESETS = {
    "synthetic": dict(model="tiny", lora_r=0, group_size=8, tasks_per_step=8, steps=120, lr=5e-3, warmup=2,
                      schedule="constant", max_new_tokens=8, temperature=1.0, micro_batch=64, save_every=20),
    "soyuz": dict(model="Qwen/Qwen3.5-4B", lora_r=32, lora_alpha=32, group_size=6, tasks_per_step=4, epochs=2,
                  lr=1e-5, warmup=2, beta=0.04, max_new_tokens=1024, temperature=1.0, micro_batch=4,
                  save_every=5, judge="local"),
    "gsm8k": dict(model="Qwen/Qwen3-1.7B-Base", lora_r=32, lora_alpha=32, group_size=4, tasks_per_step=1,
                  epochs=1, lr=5e-6, warmup=0.1, schedule="cosine", weight_decay=0.1, adam_beta2=0.99,
                  max_grad_norm=0.1, beta=0.001, agg="token", temperature=0.8, max_new_tokens=512,
                  eps_high=0.2, micro_batch=4, save_every=500),
    "mdp": dict(model="tiny"),
}


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description="GRPO post-training for Qwen models (minigrpo).",
                                argument_default=argparse.SUPPRESS)
    # what to train
    p.add_argument("--task", required=True, choices=TASKS)
    p.add_argument("--model", help="hub id, local folder, 'tiny' or 'tiny-qwen3.5'")
    p.add_argument("--preset", help="take another task's preset (default: the task's own)")
    p.add_argument("--algo", choices=["grpo", "sft", "dpo"], help="objective (sft/dpo: tasks that provide targets)")
    p.add_argument("--data", help="task data file or folder (task-specific)")
    # rollouts
    p.add_argument("--group-size", type=int, help="G: samples per prompt")
    p.add_argument("--tasks-per-step", type=int, help="prompts per optimizer step (over all ranks)")
    p.add_argument("--temperature", type=float)
    p.add_argument("--top-p", type=float)
    p.add_argument("--top-k", type=int)
    p.add_argument("--max-new-tokens", type=int)
    p.add_argument("--enable-thinking", action="store_true", help="let Qwen3/3.5 think (off by default)")
    p.add_argument("--judge", help="soyuz judge: local | claude | cmd:<command> | http(s)://server/v1")
    p.add_argument("--judge-workers", type=int)
    p.add_argument("--judge-model", help="model name for the claude / http judge")
    p.add_argument("--judge-max-turns", type=int, help="claude judge: --max-turns")
    p.add_argument("--judge-mode", choices=["hybrid", "llm"],
                   help="LLM judges: hybrid (default: machine checks decide their criteria, the LLM the rest) or "
                        "llm (the LLM grades every criterion, as the seed did)")
    # LoRA (--lora-r 0 = full fine-tune)
    p.add_argument("--lora-r", type=int)
    p.add_argument("--lora-alpha", type=float)
    p.add_argument("--lora-dropout", type=float)
    p.add_argument("--lora-targets", help="comma-separated module names (default: every projection)")
    # optimizer and schedule
    p.add_argument("--lr", type=float)
    p.add_argument("--warmup", type=float, help="warmup steps, or a fraction of all steps if < 1")
    p.add_argument("--schedule", choices=["cosine", "constant"])
    p.add_argument("--weight-decay", type=float)
    p.add_argument("--adam-beta2", type=float)
    p.add_argument("--max-grad-norm", type=float)
    # the GRPO loss
    p.add_argument("--beta", type=float, help="KL coefficient (0 = no reference forward)")
    p.add_argument("--kl", choices=["k1", "k2", "k3"])
    p.add_argument("--eps-low", type=float)
    p.add_argument("--eps-high", type=float)
    p.add_argument("--mu", type=int, help="inner epochs over each batch of rollouts (>1 = PPO-style clipping)")
    p.add_argument("--agg", choices=["token", "seq", "const"], help="loss aggregation (see grpo.py)")
    p.add_argument("--adv-scale", choices=["group", "batch", "none"])
    p.add_argument("--mask-truncated", action="store_true", help="do not train completions cut by the limit")
    # length of the run
    p.add_argument("--steps", type=int, help="optimizer steps (default: epochs over the train split)")
    p.add_argument("--epochs", type=int)
    p.add_argument("--micro-batch", type=int, help="sequences per forward/backward")
    # machine
    p.add_argument("--seed", type=int)
    p.add_argument("--dtype", choices=["float32", "bfloat16", "float16"])
    p.add_argument("--device", help="cuda | mps | cpu (default: the best available)")
    p.add_argument("--grad-checkpoint", action="store_true", help="activation checkpointing (long sequences)")
    # run folder
    p.add_argument("--runs-dir")
    p.add_argument("--run-name")
    p.add_argument("--save-every", type=int)
    p.add_argument("--keep-checkpoints", type=int)
    p.add_argument("--eval-every", type=int, help="greedy eval on the val split every N steps (0 = never)")
    p.add_argument("--eval-limit", type=int, help="val examples per eval")
    p.add_argument("--resume", action="store_true", help="continue runs/<run-name> from its latest checkpoint")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.add_argument("--plan", action="store_true",
                   help="print the run's memory plan from the model's config.json and exit (minigrpo/memplan.py)")
    return p


def resolve_args(argv=None) -> argparse.Namespace:
    given = vars(build_parser().parse_args(argv))
    if given["task"] == "mdp":   # the pipeline's stages take their settings from its own table, not from flags
        from minigrpo.tasks.mdp_pipeline import FLAGS
        unused = [f"--{k.replace('_', '-')}" for k in given if k not in FLAGS]
        if unused:
            raise SystemExit(f"{', '.join(unused)}: not used by --task mdp; its stage settings live in "
                             "minigrpo/tasks/mdp_pipeline.py PIPELINES (edit them there)")
    cfg = dict(DEFAULTS)
    preset = given.get("preset") or given["task"]
    if preset not in PRESETS:
        raise SystemExit(f"--preset {preset!r} is not a preset: choose one of {', '.join(PRESETS)}")
    cfg.update(PRESETS[preset])
    if given.get("resume"):
        saved = RunFolder.saved_config(cfg["runs_dir"] if "runs_dir" not in given else given["runs_dir"],
                                       given.get("run_name"))
        cfg.update(saved)
    cfg.update(given)
    if cfg["run_name"] is None:
        cfg["run_name"] = f"{cfg['task']}-{time.strftime('%Y%m%d-%H%M%S')}"
    return argparse.Namespace(**cfg)


# -----------------------------------------------------------------------------------------------------------------
# Device, dtype and processes. One compute dtype for the whole run: bf16 on CUDA, fp32 elsewhere; LoRA weights and
# the optimizer state stay fp32 (lora.py casts A and B in forward).

def pick_device(name):
    if name:
        return torch.device(name)
    if torch.cuda.is_available():
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
    if getattr(torch.backends, "mps", None) and torch.backends.mps.is_available():
        return torch.device("mps")
    return torch.device("cpu")


def pick_dtype(name, device):
    if name:
        return getattr(torch, name)
    return torch.bfloat16 if device.type == "cuda" else torch.float32


# -----------------------------------------------------------------------------------------------------------------
# Model, LoRA, optimizer, schedule.

def build_policy(args, device, dtype):
    model = Qwen.from_pretrained(args.model, dtype=dtype, device=device)
    tok = Tokenizer.from_pretrained(args.model)
    if args.lora_r > 0:
        targets = args.lora_targets.split(",") if args.lora_targets else None
        kw = {"targets": targets} if targets else {}
        params = inject_lora(model, r=args.lora_r, alpha=args.lora_alpha, dropout=args.lora_dropout, **kw)
        reference = None  # the reference is the same model under adapters_disabled()
    else:
        # Full fine-tune: every weight trains, in fp32 (a bf16 weight cannot absorb small updates). With β > 0
        # the frozen reference then needs its own copy of the initial weights.
        model.float()
        params = [p for p in model.parameters() if p.requires_grad]
        reference = _frozen_copy(args, device, dtype) if args.beta > 0 else None
    if args.grad_checkpoint:
        enable_activation_checkpointing(model)
    return model, tok, params, reference


def _frozen_copy(args, device, dtype):
    ref = Qwen.from_pretrained(args.model, dtype=dtype, device=device)
    ref.requires_grad_(False)
    return ref.eval()


def enable_activation_checkpointing(model):
    """Recompute each decoder layer in backward instead of storing its activations."""
    from torch.utils.checkpoint import checkpoint
    for layer in model.model.layers:
        inner = layer.forward
        layer.forward = lambda *a, _f=inner, **k: checkpoint(_f, *a, use_reentrant=False, **k)


def build_optimizer(args, params, total_steps):
    opt = torch.optim.AdamW(params, lr=args.lr, betas=(0.9, args.adam_beta2), weight_decay=args.weight_decay)
    warmup = args.warmup * total_steps if 0 < args.warmup < 1 else args.warmup

    def factor(step):  # LambdaLR calls this with the number of steps taken so far
        if step < warmup:
            return (step + 1) / (warmup + 1)
        if args.schedule == "constant":
            return 1.0
        progress = (step - warmup) / max(1.0, total_steps - warmup)
        return 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))

    return opt, torch.optim.lr_scheduler.LambdaLR(opt, factor)


# -----------------------------------------------------------------------------------------------------------------
# Data order: one seeded permutation of the train split per epoch; the position in it is part of the checkpoint.

@dataclass
class DataState:
    epoch: int = 0
    pos: int = 0


def next_examples(train, count, state: DataState, seed) -> list:
    out = []
    while len(out) < count:
        order = np.random.default_rng(seed + 1000 * state.epoch).permutation(len(train))
        take = order[state.pos: state.pos + count - len(out)]
        out += [train[i] for i in take]
        state.pos += len(take)
        if state.pos >= len(train):
            state.epoch, state.pos = state.epoch + 1, 0
    return out


def total_steps(args, n_train):
    return args.steps if args.steps else args.epochs * math.ceil(n_train / args.tasks_per_step)


# -----------------------------------------------------------------------------------------------------------------
# Rollouts. A Seq (minigrpo/tasks) is one trained completion: its prompt (never trained), its own tokens, the
# sampler's log-probs of them, the raw task score and the (possibly shaped) reward its advantage comes from.

def sample_seed(args, step, index):
    """Seed of one prompt's G samples: a function of (run seed, step, global example index) only, so the samples
    do not depend on how examples are split over ranks, on micro-batching, or on a resume."""
    return (args.seed * 1_000_003 + step * 10_007 + index) % (2**63)


def generate(model, tok, args, prompts, seeds, n, stop_strings=()):
    """Sample n completions for each prompt (token-id lists). Returns a list of n-lists of Samples."""
    model.eval()
    with torch.no_grad():
        samples = sample(model, prompts, n=n, max_new_tokens=args.max_new_tokens,
                         temperature=args.temperature, top_p=args.top_p, top_k=args.top_k,
                         stop_ids=tok.eos_ids, stop_strings=list(stop_strings), tokenizer=tok, seed=list(seeds),
                         vocab_size=tok.vocab_size)
    return [samples[i * n:(i + 1) * n] for i in range(len(prompts))]


def rollout_single_turn(model, tok, task, args, examples, seeds) -> list:
    prompts = [tok.chat(task.messages(ex), enable_thinking=args.enable_thinking) for ex in examples]
    groups = generate(model, tok, args, prompts, seeds, args.group_size, task.stop_strings)
    seqs = []
    for ex, prompt, group in zip(examples, prompts, groups):
        for s in group:
            score = task.score(ex, s.text)
            info = task.details(ex, s.text) if hasattr(task, "details") else {}
            seqs.append(Seq(ex["id"], 0, prompt, list(s.completion_ids), list(s.logprobs), s.finish_reason,
                            s.text, score, score, info=info))
    return seqs


def assign_advantages(seqs, args):
    """Group-relative advantages per (example, turn) group, on each Seq's reward. Zero spread is judged on the raw
    score, so shaping alone never creates a gradient inside a group whose answers all scored the same. An example
    drawn twice in one step (across an epoch boundary) forms one larger group: same prompt, same baseline."""
    keys = [(s.example_id, s.turn) for s in seqs]
    ids = {k: i for i, k in enumerate(dict.fromkeys(keys))}
    adv, stats = grpo.group_advantages([s.reward for s in seqs], group_ids=[ids[k] for k in keys],
                                       scale=args.adv_scale, raw_scores=[s.score for s in seqs])
    for s, a in zip(seqs, adv.tolist()):
        s.advantage = a
    return stats


# -----------------------------------------------------------------------------------------------------------------
# The loss, over micro-batches. The normaliser is computed once for the whole optimizer step (all micro-batches, all
# ranks), so the gradient does not depend on how the step is cut into micro-batches.

@dataclass
class Batch:
    """One micro-batch, left-padded; every (B, T-1) tensor is aligned as grpo.token_logprobs is."""
    ids: torch.Tensor          # (B, T) prompt + completion
    attn: torch.Tensor         # (B, T) 1 = real token
    mask: torch.Tensor         # (B, T-1) 1 = a completion token to train
    adv: torch.Tensor          # (B,) advantage of each sequence
    sampled: torch.Tensor      # (B, T-1) the sampler's log-probs of the completion tokens
    start: int                 # first column any completion occupies: logits are needed only from there


def collate(seqs, pad_id, device, mask_truncated=False) -> Batch:
    """Left-pad prompt+completion; the loss mask covers exactly each completion's positions (mask by position,
    never by token id: the EOS a model emitted is trained even when it equals the pad id)."""
    lens = [len(s.prompt_ids) + len(s.completion_ids) for s in seqs]
    T = max(lens)
    ids = torch.full((len(seqs), T), pad_id, dtype=torch.long)
    attn = torch.zeros((len(seqs), T), dtype=torch.long)
    loss_mask = torch.zeros((len(seqs), T - 1))
    sampled = torch.zeros((len(seqs), T - 1))
    for i, (s, L) in enumerate(zip(seqs, lens)):
        c = len(s.completion_ids)
        ids[i, T - L:] = torch.tensor(s.prompt_ids + s.completion_ids)
        attn[i, T - L:] = 1
        if c and not (mask_truncated and s.finish == "length"):
            loss_mask[i, T - 1 - c:] = 1          # column t predicts ids[t + 1]
        if c:
            sampled[i, T - 1 - c:] = torch.tensor(s.sampler_logps, dtype=torch.float32)
    adv = torch.tensor([s.advantage for s in seqs], dtype=torch.float32)
    start = T - 1 - max(len(s.completion_ids) for s in seqs)
    return Batch(ids.to(device), attn.to(device), loss_mask.to(device), adv.to(device), sampled.to(device), start)


def step_normalizer(batches, args, dist_info) -> float:
    """The loss denominator of the whole optimizer step: over every micro-batch of every rank."""
    local = grpo.loss_normalizer([b.mask for b in batches], args.agg, max_tokens=args.max_new_tokens)
    return float(all_reduce_(torch.tensor([local], dtype=torch.float64), dist_info))


def log_probs(model, b: Batch, args, vocab_size, entropy=False):
    """The trainer's log-probs: logits / T with the sampler's T, ids past the tokenizer's vocabulary masked, as
    the sampler does, so that the two agree (PITFALLS 5, 6, 9); the lm_head runs only over completion columns."""
    return grpo.token_logprobs(model, b.ids, b.attn, temperature=args.temperature, return_entropy=entropy,
                               vocab_size=vocab_size, start=b.start)


def reference_logprobs(model, reference, b: Batch, args, vocab_size):
    if args.beta == 0:
        return None
    with torch.no_grad():
        if reference is not None:
            return log_probs(reference, b, args, vocab_size)
        with adapters_disabled(model):
            return log_probs(model, b, args, vocab_size)


def micro_batches(seqs, size):
    return [seqs[i:i + size] for i in range(0, len(seqs), size)]


def policy_update(model, reference, params, opt, sched, seqs, args, dist_info, tok, device):
    """μ passes over this step's rollouts; each pass accumulates over micro-batches, then one optimizer step.
    Returns per-micro-batch statistics and the gradient norm (non-finite: the step was skipped)."""
    V = tok.vocab_size
    batches = [collate(mb, tok.pad_id, device, args.mask_truncated) for mb in micro_batches(seqs, args.micro_batch)]
    norm = step_normalizer(batches, args, dist_info)
    model.eval()  # the fixed log-probs of this step: reference, and the behaviour policy when μ > 1
    with torch.no_grad():
        refs = [reference_logprobs(model, reference, b, args, V) for b in batches]
        olds = [log_probs(model, b, args, V) if args.mu > 1 else None for b in batches]
    stats, grad_norm = [], 0.0
    for _ in range(args.mu):
        model.train()
        opt.zero_grad(set_to_none=True)
        for b, ref, old in zip(batches, refs, olds):
            logp, ent = log_probs(model, b, args, V, entropy=True)
            loss, st = grpo.policy_loss(logp, old, b.adv, b.mask, eps_low=args.eps_low, eps_high=args.eps_high,
                                        agg=args.agg, normalizer=norm, ref_logp=ref, beta=args.beta,
                                        kl_kind=args.kl, max_tokens=args.max_new_tokens)
            loss.backward()
            mask = b.mask.bool()
            st = {k: float(v) for k, v in st.items()}
            st["loss"] = float(loss.detach())
            st["entropy"] = float(grpo.masked_mean(ent.detach(), mask))
            st["sampler_logp_diff"] = float(grpo.masked_mean((logp.detach() - b.sampled).abs(), mask))
            stats.append(st)
        grad_norm = finish_gradients(params, args, dist_info)
        if not math.isfinite(grad_norm):
            opt.zero_grad(set_to_none=True)
            return stats, grad_norm
        opt.step()
    sched.step()
    return stats, grad_norm


def finish_gradients(params, args, dist_info) -> float:
    """Sum gradients over ranks (each rank already divided by the global normaliser), then clip."""
    grads = [p.grad for p in params if p.grad is not None]
    if dist_info.world > 1 and grads:
        flat = torch.cat([g.reshape(-1) for g in grads])
        all_reduce_(flat, dist_info)
        offset = 0
        for g in grads:
            g.copy_(flat[offset:offset + g.numel()].view_as(g))
            offset += g.numel()
    clip = args.max_grad_norm if args.max_grad_norm > 0 else float("inf")
    return float(torch.nn.utils.clip_grad_norm_(params, clip))


# -----------------------------------------------------------------------------------------------------------------
# The loop.

def rollout(model, tok, task, args, examples, step, index):
    """Rollouts of `examples` (their positions in this step's global batch are `index`)."""
    seeds = [sample_seed(args, step, i) for i in index]
    if getattr(task, "turns", 1) > 1:
        return task.rollout(lambda prompts, ss, n: generate(model, tok, args, prompts, ss, n, task.stop_strings),
                            tok, examples, seeds, args)
    return rollout_single_turn(model, tok, task, args, examples, seeds)


def validate(model, tok, task, args, step) -> dict:
    """Greedy, one sample per val example: the mean raw score of the final turn, logged as val_reward."""
    examples = task.examples("val")[:args.eval_limit]
    greedy = argparse.Namespace(**{**vars(args), "group_size": 1, "temperature": 0.0})
    seqs = rollout(model, tok, task, greedy, examples, step, list(range(len(examples))))
    final = max(s.turn for s in seqs)
    return {"val_reward": mean([s.score for s in seqs if s.turn == final]), "val_examples": len(examples)}


def trainer_state(step, data, opt, sched, nonfinite):
    return {"step": step, "data": vars(data).copy(), "optimizer": opt.state_dict(),
            "scheduler": sched.state_dict(), "rng": rng_state(),
            "nonfinite": nonfinite}


def train(args, policy=None, task=None) -> dict:
    """The GRPO loop. `policy` = (model, tokenizer, trainable params, reference or None) to train a model built
    elsewhere (the mdp pipeline starts GRPO from its SFT weights); default: build it from args.model. `task`: a
    task object built elsewhere (the mdp pipeline's sizes and prompt style); default: get_task(args.task)."""
    device = pick_device(args.device)
    dtype = pick_dtype(args.dtype, device)
    dist_info = init_distributed(device)
    torch.manual_seed(args.seed)
    random.seed(args.seed)
    np.random.seed(args.seed)
    run = RunFolder(args.runs_dir, args.run_name)
    os.makedirs(run.path, mode=0o700, exist_ok=True)        # the judge's cache lives there; private to us
    task = task or get_task(args.task, **task_options(args))
    train_set = task.examples("train")
    n_steps = total_steps(args, len(train_set))
    model, tok, params, reference = policy or build_policy(args, device, dtype)
    opt, sched = build_optimizer(args, params, n_steps)
    data, step, nonfinite = DataState(), 0, 0
    if args.resume and run.latest_checkpoint():
        state = load_checkpoint(run.latest_checkpoint(), model, lora=args.lora_r > 0)
        opt.load_state_dict(state["optimizer"])
        sched.load_state_dict(state["scheduler"])
        set_rng_state(state["rng"])
        data, step, nonfinite = DataState(**state["data"]), state["step"], state["nonfinite"]
        if dist_info.main:
            run.truncate_logs(step)
    elif dist_info.main:
        run.create(vars(args), fresh=not args.resume)   # --resume before any checkpoint: start over, logs cut
    if dist_info.main:
        print(f"minigrpo: task={args.task} model={args.model} device={device} dtype={str(dtype)[6:]} "
              f"ranks={dist_info.world} steps={n_steps} trainable={sum(p.numel() for p in params):,} "
              f"run={run.path}", file=sys.stderr)
    bar = progress_bar(n_steps, step, args, dist_info)
    first_reward, last_reward = None, None
    while step < n_steps:
        epoch = data.epoch                                     # the epoch this step's examples come from
        examples = next_examples(train_set, args.tasks_per_step, data, args.seed)
        index = list(range(dist_info.rank, len(examples), dist_info.world))   # this rank's share of the tasks
        t0 = time.perf_counter()
        seqs = rollout(model, tok, task, args, [examples[i] for i in index], step, index)
        t_sample = time.perf_counter() - t0
        parts = all_gather_objects(seqs, dist_info)                 # rank-major; parts[rank] is ours
        everyone = [s for part in parts for s in part]
        adv_stats = assign_advantages(everyone, args)               # identical on every rank
        seqs = parts[dist_info.rank]
        t1 = time.perf_counter()
        loss_stats, grad_norm = policy_update(model, reference, params, opt, sched, seqs, args, dist_info, tok,
                                              device)
        t_train = time.perf_counter() - t1
        step += 1
        nonfinite = nonfinite + 1 if not math.isfinite(grad_norm) else 0
        if nonfinite:
            print(f"warning: step {step}: non-finite loss or gradient, step skipped ({nonfinite} in a row)",
                  file=sys.stderr)
        if nonfinite >= 3:
            raise SystemExit(f"stopping: 3 non-finite steps in a row; the last good checkpoint in {run.ckpt_dir} "
                             "is intact (lower --lr or check the data)")
        extra = task.step_metrics(everyone) if hasattr(task, "step_metrics") else {}
        m = step_metrics(step, epoch, everyone, adv_stats, loss_stats, grad_norm, sched.get_last_lr()[0],
                         t_sample, t_train, extra)
        if args.eval_every and step % args.eval_every == 0 and dist_info.main:
            m.update(validate(model, tok, task, args, step))
        first_reward = m["reward_mean"] if first_reward is None else first_reward
        last_reward = m["reward_mean"]
        if dist_info.main:
            run.append("metrics.jsonl", m)
            for rec in sample_records(step, everyone, tok):
                run.append("samples.jsonl", rec)
        if step % args.save_every == 0 or step == n_steps:
            assert_replicas_in_sync(params, dist_info)
        if dist_info.main:
            if step % args.save_every == 0 or step == n_steps:
                save_checkpoint(run, step, model, trainer_state(step, data, opt, sched, nonfinite),
                                lora=args.lora_r > 0)
                run.prune(args.keep_checkpoints)
            bar.update(m)
    bar.close()
    if dist_info.main:
        print(epoch_summary(run.file("metrics.jsonl")), file=sys.stderr)
        print(f"mean reward: first step {_fmt(first_reward)} -> last step {_fmt(last_reward)}", file=sys.stderr)
    return {"run": run.path, "first_reward": first_reward, "last_reward": last_reward, "model": model}


def _fmt(x):
    return "n/a" if x is None else f"{x:.3f}"


def task_options(args) -> dict:
    opts = {}
    if args.data:
        opts["data"] = args.data
    if args.task == "soyuz":
        opts.update(judge=args.judge, workers=args.judge_workers, hybrid=args.judge_mode == "hybrid",
                    cache_path=os.path.join(args.runs_dir, args.run_name, "judge_cache.sqlite"))
        if args.judge_model:
            opts["model"] = args.judge_model
        if args.judge_max_turns:
            opts["max_turns"] = args.judge_max_turns
    return opts


class progress_bar:
    """tqdm on rank 0 with reward, KL and tokens/s; silent elsewhere and with --quiet."""

    def __init__(self, total, initial, args, dist_info):
        self.bar = None
        if dist_info.main and not args.quiet:
            from tqdm import tqdm
            self.bar = tqdm(total=total, initial=initial, desc=args.task, dynamic_ncols=True)

    def update(self, m):
        if self.bar:
            self.bar.set_postfix(reward=_fmt(m["reward_mean"]), kl=_fmt(m["kl"]),
                                 tok_s=f"{m['sampler_tok_s']:.0f}")
            self.bar.update(1)

    def close(self):
        if self.bar:
            self.bar.close()


def main(argv=None):
    try:
        args = resolve_args(argv)
    except SystemExit as e:   # a usage error with its one-line message: exit code 2, as argparse's own
        if isinstance(e.code, str):
            print(f"train.py: error: {e.code}", file=sys.stderr)
            raise SystemExit(2) from None
        raise
    if getattr(args, "plan", False):
        from minigrpo.memplan import print_plan
        return print_plan(args)
    if args.task == "mdp":
        from minigrpo.tasks.mdp_pipeline import run_pipeline
        return run_pipeline(args)
    from minigrpo.tasks.soyuz import JudgeDown
    try:
        train(args)
    except JudgeDown as e:     # a grader that is down: one line, the last checkpoint is intact
        print(f"train.py: {e}", file=sys.stderr)
        raise SystemExit(1) from None


if __name__ == "__main__":
    main()
