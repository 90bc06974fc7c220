"""What `--resume` may change. A resumed run is the run it continues: its task, model, data, LoRA shape, sampling,
loss, optimizer, schedule and seed come from its config.json, and a flag that would change one of them is refused
with one line listing them all (given with the run's own value, a flag is no change). What only says how long the
run goes on, how often it saves, evaluates and logs, or how it uses the machine is applied, and recorded in
config.json's "resumes" list (minigrpo/run/folder.py RunFolder.record_resume).

train.py prints "resumed from step N of M" with the checkpoint and what changed; --resume of a run killed before
its first checkpoint starts it over. A longer --steps (or --epochs) stretches the schedule's remaining part: the
learning rate of a step after the resume point follows the new length, so the resumed run equals an uninterrupted
run of the new length only from its start. The run policy's streaks (nonfinite_streak) are kept in the checkpoint too.
"""
import math
import sys

from minigrpo.errors import StopRun
from minigrpo.run import checkpoints
from minigrpo.run.folder import RunFolder
from minigrpo.tasks.base import DataState

SAFE_TO_CHANGE = {
    "steps", "epochs",                                      # how long the run goes on
    "save_every", "keep_checkpoints", "eval_every", "eval_limit",
    "quiet", "log_to", "plan",                              # what it shows and where it logs
    "device", "micro_batch", "pack", "grad_checkpoint", "judge_workers",   # memory and concurrency, not the math
    "threads", "decode", "compile_gdn",                     # CPU threads; eager or compiled decode, chunk loop
    "weak_sandbox",                                         # the sandbox this machine gives the agent's commands
}
IDENTITY = {"resume", "runs_dir", "run_name"}               # which run: never a change


def refused_changes(given: dict, saved: dict, default) -> list[str]:
    """The flags in `given` (those on the command line) that would change what the saved run trains, each as
    "--flag VALUE (the run's: SAVED)". `default(key)` is the value a run that predates the flag trained with."""
    out = []
    for key, value in given.items():
        if key in IDENTITY or key in SAFE_TO_CHANGE:
            continue
        was = saved.get(key, default(key))
        if value != was:
            shown = "" if isinstance(value, bool) else f" {value}"
            out.append(f"{flag(key, value)}{shown} (the run's: {was})")
    return out


def check_resume_flags(given: dict, saved: dict, default):
    """SystemExit with one line when a given flag would change the run being resumed."""
    refused = refused_changes(given, saved, default)
    if refused:
        raise SystemExit(f"--resume: {', '.join(refused)}: would change what run {given.get('run_name')!r} trains; "
                         "drop them to continue it (its settings come from its config.json), or start a new run "
                         "under another --run-name")


def changed_settings(saved: dict, resolved: dict) -> dict:
    """{key: [before, after]} of the safe settings this resume changes (what record_resume writes down)."""
    return {k: [saved.get(k), resolved[k]] for k in sorted(SAFE_TO_CHANGE)
            if k in resolved and resolved[k] != saved.get(k)}


def check_length(latest: str, step: int, n_steps: int):
    if step > n_steps:
        raise SystemExit(f"--resume: {latest} is past the run's end ({n_steps} steps): pass --steps {step} or more "
                         "to continue it")


def record_resume(run: RunFolder, latest: str, step: int, n_steps: int, resolved: dict):
    """Write this resume into config.json's history and say it in one line."""
    changed = changed_settings(RunFolder.saved_config(run.root, run.name), resolved)
    run.record_resume(step, changed)
    note = "".join(f"; {flag(k)} {old} -> {new}" for k, (old, new) in changed.items())
    done = "; the run is finished: nothing left to do (pass --steps N above it to train on)" if step == n_steps else ""
    print(f"train.py: resumed from step {step} of {n_steps} ({latest}){note}{done}", file=sys.stderr)


def flag(key: str, value=None) -> str:
    """The flag as typed: --no-turn0-guard for a BooleanOptionalAction given False."""
    return f"--{'no-' if value is False else ''}{key.replace('_', '-')}"


# -----------------------------------------------------------------------------------------------------------------
# Where train.py starts: a fresh run, or the newest checkpoint that loads

def resume_or_start(run, args, model, opt, sched, dist_info, device, n_steps):
    """(data state, step, non-finite streak): from the newest checkpoint that loads with --resume (the logs cut
    back to it; a damaged newer one is named and set aside), else a fresh run. --resume before any checkpoint
    starts over. The trainer state is loaded straight onto this rank's device: rank 0 saved it from its own GPU,
    and without map_location every rank would load it there."""
    latest, state = None, None
    if args.resume:
        latest, state = checkpoints.load_latest(run.ckpt_dir, model, lora=args.lora_r > 0, map_location=device,
                                                main=dist_info.main)
    if latest is None:
        if dist_info.main:
            if args.resume:
                print(f"train.py: no checkpoint in {run.ckpt_dir} yet: the run starts over", file=sys.stderr)
            run.create(vars(args))
        return DataState(), 0, 0
    check_length(latest, state["step"], n_steps)
    opt.load_state_dict(state["optimizer"])
    sched.load_state_dict(state["scheduler"])
    checkpoints.set_rng_state(state["rng"])
    if dist_info.main:
        run.truncate_logs(state["step"])
        record_resume(run, latest, state["step"], n_steps, vars(args))    # config.json's history, one line
    return DataState(**state["data"]), state["step"], state["nonfinite"]


def trainer_state(step, data, opt, sched, nonfinite):
    return {"step": step, "data": vars(data).copy(), "optimizer": opt.state_dict(),
            "scheduler": sched.state_dict(), "rng": checkpoints.rng_state(), "nonfinite": nonfinite}


# ----------------------------------------------------------------------------------------------------------------
# Run policy: when a run stops by itself. Each rule counts a streak of bad steps (kept in the checkpoint, so that a
# resume continues it) and stops the run, with the last good checkpoint intact, when the streak reaches its limit.

MAX_NONFINITE_STEPS = 3      # non-finite loss or gradient in a row (train.py's policy_update: what is skipped)


def nonfinite_streak(streak, grad_norm, step, mu=1) -> int:
    """The streak of non-finite steps after this one; stops the run at MAX_NONFINITE_STEPS. What was skipped
    depends on μ: with one pass the whole update, with several the pass that went non-finite and those after it
    (the optimizer steps of the passes before it stand), so only with μ = 1 are the weights an earlier step's."""
    streak = streak + 1 if not math.isfinite(grad_norm) else 0
    skipped = "step skipped" if mu == 1 else "its pass and the passes after it skipped, earlier passes applied"
    if streak:
        print(f"warning: step {step}: non-finite loss or gradient, {skipped} ({streak} in a row)", file=sys.stderr)
    if streak >= MAX_NONFINITE_STEPS:
        kept = (f"their updates were skipped, so the weights are those of step {step - streak}" if mu == 1 else
                f"with --mu {mu} each kept the passes before its non-finite one")
        raise StopRun(f"stopping: {streak} non-finite steps in a row (steps {step - streak + 1}-{step}, the last "
                      f"grad-norm {grad_norm}; {kept}): lower --lr or check the data")
    return streak
