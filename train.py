"""train.py: GRPO post-training of a Qwen model, read as a recipe.

    python train.py --task synthetic --model tiny           # CPU, about a minute: the reward rises
    python train.py --task soyuz                             # GPU: the soyuz reference run (its preset)
    python train.py --task mdp --model tiny                  # the verifier-MDP pipeline (SFT, DPO, GRPO, report)
    python train.py --task revise --model tiny --experiment  # two-turn shaping arms on a CPU (base, 3 arms, report)
    torchrun --nproc_per_node 8 train.py --task gsm8k        # several GPUs: DDP by explicit all-reduce

One optimizer step, as the data flows:

    examples ─► tokenizer.chat ─► sampler.sample(policy, n=G) ─► task.score (task.rollout: one turn, or soyuz's two)
      ─► grpo.group_advantages (per turn, on raw scores)
      ─► micro-batches ─► logprobs.token_logprobs(policy), and under adapters_disabled() the reference
      ─► grpo.policy_loss + β·KL ─► backward ─► all-reduce ─► clip ─► AdamW ─► schedule ─► log ─► checkpoint

Everything a step needs to be repeated exactly (weights, optimizer, scheduler, every RNG, data position) is in
its checkpoint, and sampling is seeded by (seed, step, example), so `--resume` after a kill reproduces the
uninterrupted run bit for bit on the same machine. The flags and their defaults: minigrpo/run/flags.py; the task
presets: minigrpo/run/presets.py.
"""
from minigrpo import signals

signals.quiet_imports("train.py")   # a Ctrl-C or SIGTERM in the seconds of imports below: one line, no traceback

import argparse
import contextlib
import math
import os
import sys
from dataclasses import dataclass, replace
from functools import partial

import torch

from minigrpo import grpo
from minigrpo.errors import UsageError, first_line
from minigrpo.machine import pick_device, pick_dtype, set_cpu_threads, threads_note
from minigrpo.metrics import PhaseClock, mean
from minigrpo.seeds import derive_seed, seed_everything
from minigrpo.signals import catch_ctrl_c, stop_if_ctrl_c
from minigrpo.run.dist import all_gather_objects, assert_replicas_in_sync, finish_distributed, init_distributed
from minigrpo.deltanet import compile_chunk_loop
from minigrpo.lora import DEFAULT_TARGETS, inject_lora
from minigrpo.model import enable_activation_checkpointing
from minigrpo.pretrained import CheckpointError, load_pretrained
from minigrpo.run import callsize, checkpoints, cli, dist_timeout, memguard, plots, presets
from minigrpo.run.flags import decode_path, gdn_backend, loss_settings, resolve_args
from minigrpo.run.folder import RunFolder
from minigrpo.run.steplog import ProgressBar, Tracker, epoch_summary, sample_records, step_metrics
from minigrpo.run.gap import token_sums, warn_off_policy
from minigrpo.run.resume import nonfinite_streak, resume_or_start, trainer_state
from minigrpo.sampler import Settings, sample
from minigrpo.tasks import task_from_args
from minigrpo.tasks.base import next_examples
from minigrpo.tokenizer import Tokenizer
from minigrpo.update import (Fixed, adamw, all_reduce_and_clip, collate, log_probs, micro_batches, positions,
                             reference_logprobs, route_flips, routed, step_normalizer, with_advantages)

PHASES = PhaseClock()   # seconds by phase of the running step (phase_metrics), each timed where it is spent


# -----------------------------------------------------------------------------------------------------------------
# The recipe

def train(args, policy=None, task=None) -> dict:
    """The GRPO loop. `policy` = (model, tokenizer, trainable params, reference or None) to train a model built
    elsewhere (the mdp pipeline starts GRPO from its SFT weights); default: build it from args.model. `task`: a
    task object built elsewhere (the mdp pipeline's sizes and prompt style); default: the task args name. The run
    folder has one writer: this run holds it from its claim until the loop ends, however it ends."""
    with RunFolder(args.runs_dir, args.run_name) as run, contextlib.ExitStack() as closing:
        device = pick_device(args.device)
        dtype = pick_dtype(args.dtype, device)
        dist_info = init_distributed(device, dist_timeout.collective_timeout(args))   # how long a rank waits for others
        seed_everything(args.seed)
        if dist_info.main:
            run.claim(fresh=not args.resume)   # refuse a folder not a run's, or written by another: before any work
        os.makedirs(run.path, mode=0o700, exist_ok=True)        # the judge's cache lives there; private to us
        task = task or task_from_args(args)
        train_set = task.examples("train")
        n_steps = args.steps or args.epochs * math.ceil(len(train_set) / args.tasks_per_step)
        model, tok, params, reference = policy or build_policy(args, device, dtype)
        compile_chunk_loop(model, reference, backend=gdn_backend(args, device))
        opt, sched = adamw(params, args.lr, n_steps, args.warmup, args.schedule, args.adam_beta2, args.weight_decay)
        up = Updater(model, reference, params, opt, sched, loss_settings(args))
        data, step, nonfinite = resume_or_start(run, args, model, opt, sched, dist_info, device, n_steps)
        calls = callsize.size_calls(task, args, device, dtype, dist_info.world)   # a multi-turn task's rows per call
        if dist_info.main:
            print(f"minigrpo: task={args.task} model={args.model} device={device}{threads_note(device)} "
                  f"dtype={str(dtype)[6:]} ranks={dist_info.world} steps={n_steps} "
                  f"trainable={sum(p.numel() for p in params):,} run={run.path}"
                  + "".join(f"; {n}" for n in (calls, dist_timeout.timeout_note(args)) if n), file=sys.stderr)
        bar = closing.enter_context(ProgressBar(n_steps, step, args.task, enabled=dist_info.main and not args.quiet))
        tracker = Tracker(args.log_to if dist_info.main else None, run, vars(args), step)    # --log-to
        PHASES.reset()
        off_policy_warned = False
        while step < n_steps:
            stop_if_ctrl_c()                                       # one Python swallowed in a callback stops here
            epoch = data.epoch                                     # the epoch this step's examples come from
            early = []    # this rank's Fixed, if computed while the judge graded; not when rewards pick the Seqs (DAPO)
            meanwhile = (None if args.dynamic_sampling
                         else lambda seqs: early.append(fixed_logprobs(up, seqs, args, tok)))
            with PHASES("sample"):
                rollout = partial(rollout_step, model, tok, task, args, step, dist_info=dist_info, meanwhile=meanwhile)
                all_seqs, my_seqs, drawn = sample_step(rollout, args, train_set, data)
            overlong_shaping(all_seqs, args)                       # --overlong-buffer's length penalty, on the reward
            adv_stats = assign_advantages(all_seqs, args)          # identical on every rank; sets each Seq's advantage
            with PHASES("train"):
                loss_stats, grad_norm = policy_update(up, my_seqs, args, dist_info, tok, early[0] if early else None)
            loss_stats = [st for part in all_gather_objects(loss_stats, dist_info) for st in part]   # weighed by tokens
            step += 1
            nonfinite = nonfinite_streak(nonfinite, grad_norm, step, args.mu)
            times = PHASES.times
            m = step_metrics(step, epoch, all_seqs, adv_stats, loss_stats, grad_norm, sched.get_last_lr()[0],
                             times["sample"], times["train"], task.step_metrics(all_seqs))
            m.update(phase_metrics(times))                         # seconds by phase (this rank's)
            m.update(drawn)                                        # --dynamic-sampling: prompts drawn and dropped
            if args.eval_every and step % args.eval_every == 0:       # every rank validates its share
                m.update(validate(model, tok, task, args, step, dist_info))
            if dist_info.main:
                off_policy_warned = warn_off_policy(m, off_policy_warned)
                run.append("metrics.jsonl", m)
                tracker.log(m)
                for rec in sample_records(step, all_seqs, tok):
                    run.append("samples.jsonl", rec)
            PHASES.reset()       # the checkpoint's seconds go in the next row: a row is written before its checkpoint,
            with PHASES("checkpoint"):                             # so that no checkpoint is without its row
                if step % args.save_every == 0 or step == n_steps:
                    save(run, step, up, tok, args, dist_info, trainer_state(step, data, opt, sched, nonfinite))
            bar.update(m)
        bar.close()
        tracker.close()
        first_reward, last_reward = run.first_and_last("reward_mean")   # the run's, not only this process's steps
        if dist_info.main:
            print(epoch_summary(run.file("metrics.jsonl")))      # the result: stdout; progress and warnings: stderr
            fmt = lambda x: "n/a" if x is None else f"{x:.3f}"
            print(f"mean reward: first step {fmt(first_reward)} -> last step {fmt(last_reward)}")
        return {"run": run.path, "first_reward": first_reward, "last_reward": last_reward, "model": model}


# -----------------------------------------------------------------------------------------------------------------
# Rollouts. A Seq (minigrpo/tasks) is one trained completion: its prompt (never trained), its own tokens, the
# sampler's log-probs of them, the raw task score and the (possibly shaped) reward its advantage comes from.

def sample_step(rollout, args, train_set, data):
    """The step's rollouts: (all_seqs, my_seqs, metrics); rollout(examples) rolls out one draw (rollout_step at
    this step). --tasks-per-step examples; with --dynamic-sampling (DAPO) only examples with a group whose raw
    scores spread (grpo.has_spread) are kept, and more are drawn, --tasks-per-step at a time and at most
    --max-draws times, until --tasks-per-step are kept (fewer if the draws run out). Every draw advances the data
    order and has seeds of its own, so a resume repeats the step."""
    all_seqs, my_seqs, kept, drawn, scores = [], [], [], 0, []
    for _ in range(args.max_draws if args.dynamic_sampling else 1):
        examples = next_examples(train_set, args.tasks_per_step, data, args.seed)
        drawn_all, drawn_mine = rollout(list(enumerate(examples, drawn)))
        drawn += len(examples)
        if not args.dynamic_sampling:
            return drawn_all, drawn_mine, {}
        scores += [s.score for s in drawn_all if s.score is not None]
        groups = {}
        for s in drawn_all:
            groups.setdefault((s.example_id, s.turn), []).append(s)
        spread = {k[0] for k, g in groups.items() if grpo.has_spread([s.reward for s in g], [s.score for s in g])}
        new = [i for i in dict.fromkeys(s.example_id for s in drawn_all) if i in spread and i not in kept]
        kept += new[:args.tasks_per_step - len(kept)]
        all_seqs += [s for s in drawn_all if s.example_id in kept]    # in the order drawn, rank-major per draw
        my_seqs += [s for s in drawn_mine if s.example_id in kept]
        if len(kept) == args.tasks_per_step:
            break
    # reward_mean is over the kept groups, which all spread: what the policy scores is the mean over every draw
    return all_seqs, my_seqs, {"dynamic_drawn": drawn, "dynamic_kept": len(kept), "dynamic_dropped": drawn - len(kept),
                               "dynamic_drawn_score": mean(scores)}


def rollout_step(model, tok, task, args, step, examples, dist_info, meanwhile=None):
    """`examples`, (index in the step, example) pairs, each rank rolling out its share, then exchanged: (all_seqs,
    my_seqs) = (every rank's Seqs, rank-major, the same list on every rank; this rank's, the ones it trains on).
    The index seeds the example's samples (sample_seed), so every prompt of a step, in any draw, has its own. The
    seconds in the sampler are the "generate" phase; the rest of a rollout is the task's (mostly its judge)."""
    mine = examples[dist_info.rank::dist_info.world]        # this rank's share of the tasks
    # fewer tasks than ranks (gsm8k's one a step on 8 GPUs): a rank with none samples nothing, and then joins
    # every collective of the step with empty contributions (no Seqs, a zero normaliser, zero gradients)
    sampling = sampler_settings(args, tok, model.device, task.stop_strings, decode_rows(task, args, len(mine)))
    sampler = rollout_sampler(model, tok, sampling)
    seeds = [sample_seed(args, step, i) for i, _ in mine]
    my_seqs = task_rollout(task, sampler, tok, [ex for _, ex in mine], seeds, args, meanwhile) if mine else []
    parts = all_gather_objects(my_seqs, dist_info)              # rank-major; parts[rank] is ours
    return [s for part in parts for s in part], parts[dist_info.rank]


def task_rollout(task, sampler, tok, examples, seeds, args, meanwhile):
    """task.rollout; one that overlaps_grading runs meanwhile(seqs) while its last turn is graded (episodes.py)."""
    if meanwhile is None or not getattr(task, "overlaps_grading", False):
        return task.rollout(sampler, tok, examples, seeds, args)
    during = lambda seqs: (meanwhile(seqs), PHASES.open("judge_wait"))     # then the wait for the grades
    seqs = task.rollout(sampler, tok, examples, seeds, args, meanwhile=during)
    PHASES.close("judge_wait")
    return seqs


def sample_seed(args, step, index):
    """Seed of one prompt's G samples: a function of (run seed, step, global example index) only, so the samples
    do not depend on how examples are split over ranks, on micro-batching, or on a resume."""
    return derive_seed(args.seed, "sample", step, index)


def decode_rows(task, args, n_examples):
    """The rows of the largest sampler call a rollout of n_examples makes: the task's chunk of examples (a
    multi-turn task's, run/callsize.py; None and the others: all at once) x G samples. A revision call has as many
    rows (one per turn-0 sample), so turn 0 and revisions share the fast path's fixed batch."""
    return min(getattr(task, "chunk", None) or n_examples, n_examples) * args.group_size


def sampler_settings(args, tok, device, stop_strings=(), rows=None):
    """The run's sampler Settings, from its flags and tokenizer (n: --group-size; a call may ask for another). On the
    fast path (decode_path) the decode batch is `rows` rows (padded; default the call's rows rounded up to a power
    of two) and the cache one of a few length buckets, so one compiled graph per bucket serves the whole run."""
    fast = decode_path(args, device) == "fast"
    return Settings(n=args.group_size, max_new_tokens=args.max_new_tokens, temperature=args.temperature,
                    top_p=args.top_p, top_k=args.top_k, stop_ids=tok.eos_ids, stop_strings=tuple(stop_strings),
                    vocab_size=tok.vocab_size, compile=fast, rows=rows if fast else None)


def rollout_sampler(model, tok, settings):
    """The sampler a task's rollout calls (tasks/episodes.py): generate(prompts, seeds, n, reuse=None, keep=False)
    samples n completions of each prompt (token-id lists) and returns a list of n-lists of Samples; keep / reuse:
    sampler.sample's (keep the state after each prompt; continue kept states: minigrpo/prefix.py)."""
    def generate(prompts, seeds, n, reuse=None, keep=False):
        with PHASES("generate"), torch.no_grad():
            model.eval()
            samples = sample(model, prompts, replace(settings, n=n), tokenizer=tok, seed=list(seeds), reuse=reuse,
                             keep=keep)
        return [samples[i * n:(i + 1) * n] for i in range(len(prompts))]
    return generate


def assign_advantages(all_seqs, args):
    """Group-relative advantages per (example, turn) group, on each Seq's reward, over every rank's Seqs (a group's
    samples may come from several ranks). Zero spread is judged on the raw
    score, so shaping alone never creates a gradient inside a group whose answers all scored the same. An example
    drawn twice in one step (across an epoch boundary) forms one larger group: same prompt, same baseline.
    An agentic episode with a trajectory reward is one Seq (minigrpo/tasks/episodes.py), so it counts once in its
    example's group however many turns it took, and every token it trains gets its advantage."""
    keys = [(s.example_id, s.turn) for s in all_seqs]
    ids = {k: i for i, k in enumerate(dict.fromkeys(keys))}
    adv, stats = grpo.group_advantages([s.reward for s in all_seqs], group_ids=[ids[k] for k in keys],
                                       scale=args.adv_scale, raw_scores=[s.score for s in all_seqs])
    for s, a in zip(all_seqs, adv.tolist()):
        s.advantage = a
    return stats


def overlong_shaping(all_seqs, args):
    """--overlong-buffer: DAPO's soft overlong punishment added to each Seq's reward and logged in its info. The
    raw score is left alone, so the penalty never gives a group whose answers all scored the same a gradient."""
    for s in all_seqs:       # an episode's: its longest turn's (each turn is cut at max_new_tokens)
        penalty = min(grpo.overlong_penalty(t["tokens"], args.max_new_tokens, args.overlong_buffer)
                      for t in s.policy_turns())
        if penalty and s.reward is not None:
            s.reward, s.info["overlong_penalty"] = s.reward + penalty, penalty


def validate(model, tok, task, args, step, dist_info) -> dict:
    """Greedy, one sample per val example, each rank its share: the mean raw score of the final turn (val_reward)."""
    examples = task.examples("val")[:args.eval_limit]
    greedy = argparse.Namespace(**{**vars(args), "group_size": 1, "temperature": 0.0})
    seqs, _ = rollout_step(model, tok, task, greedy, step, list(enumerate(examples)), dist_info)
    final = max(s.turn for s in seqs)
    return {"val_reward": mean([s.score for s in seqs if s.turn == final]), "val_examples": len(examples)}


# -----------------------------------------------------------------------------------------------------------------
# The update, over micro-batches (minigrpo/update.py: the batch, its log-probs, the step normaliser, the gradient
# all-reduce). The normaliser is computed once for the whole optimizer step (all micro-batches, all ranks), so the
# gradient does not depend on how the step is cut into micro-batches.

@dataclass(frozen=True)
class Updater:
    """What every step's update works on, built once (reference None: LoRA's adapters-off policy, or --beta 0)."""
    model: torch.nn.Module
    reference: torch.nn.Module | None
    params: list
    opt: torch.optim.Optimizer
    sched: torch.optim.lr_scheduler.LRScheduler
    settings: grpo.LossSettings


def fixed_logprobs(up, seqs, args, tok) -> Fixed:
    """This rank's micro-batches and the log-probs fixed over the step's passes (update.Fixed): the reference's, and
    when μ > 1 the behaviour policy's. Tokens only: computed while the judge grades, they equal those after it."""
    model, T, V = up.model, args.temperature, tok.vocab_size
    groups = micro_batches(seqs, args.micro_batch)
    batches = [collate(mb, tok.pad_id, model.device, args.mask_truncated, args.pack, args.routing_replay)
               for mb in groups]
    model.eval()
    with PHASES("reference"), torch.no_grad():
        refs = [reference_logprobs(model, up.reference, b, T, V) if up.settings.beta else None for b in batches]
        olds = [log_probs(model, b, T, V) if args.mu > 1 else None for b in batches]
    return Fixed(batches, positions(seqs, groups), refs, olds)


def policy_update(up, my_seqs, args, dist_info, tok, fixed=None):
    """μ passes over this rank's rollouts of the step (my_seqs, in the micro-batches of `fixed`: fixed_logprobs');
    each pass accumulates over micro-batches, then one optimizer step. Returns per-micro-batch statistics and the
    gradient norm of the last pass run. A non-finite norm ends the step at that pass: its optimizer step and the
    schedule's are not taken, while with μ > 1 the optimizer steps of the passes before it stand. Its phases:
    policy (forward + backward), optimizer (all-reduce, clip, AdamW)."""
    model, T, V = up.model, args.temperature, tok.vocab_size
    fixed = fixed or fixed_logprobs(up, my_seqs, args, tok)
    batches = [with_advantages(b, [my_seqs[i] for i in pos]) for b, pos in zip(fixed.batches, fixed.positions)]
    norm = step_normalizer(batches, up.settings, dist_info)
    stats, grad_norm = [], 0.0
    for pass_ in range(args.mu):
        model.train()
        up.opt.zero_grad(set_to_none=True)
        for b, ref, old in zip(batches, fixed.refs, fixed.olds):
            with PHASES("policy"):
                st = micro_batch_step(model, b, grpo.Against(old, ref, b.sampled), norm, up.settings, T, V)
                stats.append(st | {"pass": pass_})
        with PHASES("optimizer"):
            grad_norm = all_reduce_and_clip(up.params, args.max_grad_norm, dist_info)
            if not math.isfinite(grad_norm):
                up.opt.zero_grad(set_to_none=True)
                return stats, grad_norm
            up.opt.step()
    up.sched.step()
    return stats, grad_norm


def micro_batch_step(model, b, against, norm, settings, temperature, V) -> dict:
    """One micro-batch's forward and backward (its gradient adds to the step's); returns its statistics. An MoE
    model's backward runs inside the batch's routing too (a checkpointed layer routes again when recomputed)."""
    with routed(model, b):
        logp, ent = log_probs(model, b, temperature, V, entropy=True)
        flips = route_flips(model, b)
        loss, st = grpo.policy_loss(logp, b.adv, b.mask, settings, norm, against)
        loss.backward()
    mask = b.mask.bool()
    st = {k: float(v) for k, v in st.items()}
    st["loss"] = float(loss.detach())
    st["entropy"] = float(grpo.masked_mean(ent.detach(), mask))
    gap = (logp.detach() - b.sampled).abs()
    st["sampler_logp_diff"] = float(grpo.masked_mean(gap, mask))
    st["sampler_logp_gaps"] = gap[mask].tolist()          # per token: runs.step_metrics' p95 and max
    st.update(token_sums(logp.detach(), b.sampled, against.ref, mask))   # the share of the move the sampler carries
    st.update(flips)                                                    # MoE: route_flips, routes
    return st


def phase_metrics(t) -> dict:
    """metrics.jsonl's seconds by phase since the row before (docs/training.md); a reference pass run while the judge
    graded (task_rollout; judge_wait: the wait after it) is time_overlapped, within time_sample, not time_judge."""
    g, inside = t.get("generate", 0.0), t.get("reference", 0.0) if "judge_wait" in t else 0.0
    return {"time_checkpoint": t.get("checkpoint", 0.0), "time_generate": g, "time_sample": t["sample"],
            "time_judge": t["sample"] - g - inside,
            **{f"time_{k}": t[k] for k in ("reference", "policy", "optimizer") if k in t},
            **({"time_overlapped": inside, "time_judge_wait": t["judge_wait"]} if "judge_wait" in t else {})}


# -----------------------------------------------------------------------------------------------------------------
# Set-up: the policy, checkpoints

def build_policy(args, device, dtype):
    """(model, tokenizer, trainable params, reference or None). One compute dtype for the whole run; LoRA weights
    and the optimizer state stay fp32 (lora.py casts A and B in forward)."""
    try:                    # a folder, config.json or hub that cannot be used: one line naming --model and the file
        model, tok = load_pretrained(args.model, dtype, device), Tokenizer.from_pretrained(args.model)
    except (OSError, ValueError) as e:
        raise UsageError(f"--model {args.model}: {first_line(e)}") from None
    reference = None        # with LoRA, the reference is the same model under adapters_disabled()
    if args.lora_r > 0:
        targets = args.lora_targets.split(",") if args.lora_targets else DEFAULT_TARGETS
        try:
            params = inject_lora(model, args.lora_r, args.lora_alpha, args.lora_dropout, targets,
                                 experts=args.lora_experts, router=args.lora_router)
        except ValueError as e:              # --lora-targets that name no projection, --lora-experts on a dense model
            flag = next((f"--lora-{k}" for k in ("experts", "router") if str(e).startswith(f"LoRA on the {k}")),
                        f"--lora-targets {args.lora_targets}")
            raise UsageError(f"{flag}: {first_line(e)}; --model {args.model}") from None
    else:
        # Full fine-tune: every weight trains, in fp32 (a bf16 weight cannot absorb small updates). With β > 0
        # the frozen reference then needs its own copy of the initial weights.
        model.float()
        params = [p for p in model.parameters() if p.requires_grad]
        if args.beta > 0:
            reference = load_pretrained(args.model, dtype=dtype, device=device).requires_grad_(False).eval()
    if args.grad_checkpoint:
        enable_activation_checkpointing(model)
    return model, tok, params, reference


def save(run, step, up, tok, args, dist_info, state):
    """Every rank checks the replicas agree; rank 0 writes checkpoints/step-N, keeps the latest few and redraws
    curves.png from metrics.jsonl (the last step is always a checkpoint, so the end of the run is drawn too). A
    checkpoint that cannot be written (a full disk) stops the run with one line; the older ones are untouched."""
    assert_replicas_in_sync(up.params, dist_info)
    if dist_info.main:
        run.save_checkpoint(step, up.model, state, lora=args.lora_r > 0, tokenizer=tok)   # a full disk: StopRun
        checkpoints.prune(run.ckpt_dir, args.keep_checkpoints)
        plots.write_run_curves(run.path)      # never raises: a failed plot is one warning line


# -----------------------------------------------------------------------------------------------------------------
# The command line

def main(argv=None):
    catch_ctrl_c()
    args = cli.parse("train.py", resolve_args, argv)   # a flag that cannot be used: one line, exit code 2
    if args.plan:             # the memory plan from the model's config.json; nothing is loaded
        from minigrpo.run.memplan import print_plan
        from minigrpo.tasks import task_class
        try:       # the task's class, not a task: building one would start its judge and read its data
            return print_plan(args, decode_rows(task_class(args.task), args, args.tasks_per_step))
        except CheckpointError as e:    # a config.json value of the wrong type: one line naming file and key
            cli.usage_error("train.py", f"--model {args.model}: {first_line(str(e))}")
    if pick_device(args.device).type == "cpu":   # saved in config.json: a resume computes as this run did
        args.threads = set_cpu_threads(args.threads, "kept from the run resumed" if args.resume else "set by --threads")
    with cli.ending("train.py", cli.training_ended(args, argv)):   # how it ends: one line and an exit code
        return command(args)


def command(args):
    """What the flags ask for: one training run, or a pipeline of them."""
    refuse_what_cannot_fit(args)
    if args.task == "mdp":    # the verifier-MDP pipeline: SFT, DPO, then GRPO through this file's train()
        from minigrpo.experiments.mdp_pipeline import run_pipeline
        return run_pipeline(args, trainer=train)
    if args.experiment:       # the revise experiment: a base, three shaping arms x seeds through train(), report
        from minigrpo.experiments.revise_pipeline import run_experiment
        return run_experiment(args, trainer=train)
    train(args)
    finish_distributed()  # torchrun: the process group is torn down before exit, not by it


def refuse_what_cannot_fit(args):
    """The memory plan of the run against the memory the device has, before anything is loaded: one line naming
    the flags to lower (minigrpo/run/memguard.py), or, for a GPU preset on a CPU, saying so (a note if it fits)."""
    from minigrpo.tasks import task_class
    device = pick_device(args.device)
    rows = decode_rows(task_class(args.task), args, args.tasks_per_step)
    try:
        memguard.check_fits(args, rows, device, pick_dtype(args.dtype, device), decode_path(args, device) == "fast")
    except (OSError, ValueError):   # no config.json to plan from: loading the model names what is wrong with it
        pass
    if note := presets.gpu_preset_note(args.task, args.model, device.type):    # it fits, and runs on a CPU
        print(f"train.py: note: {note}", file=sys.stderr)


if __name__ == "__main__":
    main()
