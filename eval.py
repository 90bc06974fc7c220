"""eval.py: evaluate a model, and with --adapter the same weights with its LoRA adapter off and on, side by side.

    python eval.py --task gsm8k --model tiny --data fixture.jsonl                   # CPU smoke run
    python eval.py --task gsm8k --model Qwen/Qwen3-1.7B-Base --adapter runs/gsm8k-X \\
        --svamp hub --math hub --hint-probe 200 --run runs/gsm8k-X                # the gsm8k run's table
    python eval.py --task soyuz --model Qwen/Qwen3.5-4B --adapter runs/soyuz-X      # the soyuz run's table

One model is loaded. With --adapter, the "base" column is that model under lora.adapters_disabled() (bit-exact
base outputs, no second copy of the weights) and the "adapter" column is the same model with the adapter on, so the
two columns differ by the adapter and nothing else. Decoding is greedy by default (--temperature 0): an eval should
not move when it is rerun. Prompts are generated in batches of --batch-size, longest first (less padding).

What lands in --out (default: RUNDIR/eval with --run, else runs/eval-<task>-<time>):
    results.json    every number of the report, plus the settings and the command
    report.md       Markdown tables: one column per model and the change from base to adapter
    examples.jsonl  one row per example and model: the completion and its score details
    *.png           gsm8k: accuracy bars per eval set, hint-probe bars, and with --run the training curves;
                    soyuz: reward per task family; mdp: solve rate against probe budget
Per task (minigrpo/evals/<task>.py; what they share: minigrpo/evals/common.py):
    gsm8k      per eval set (GSM8K's held-out 10%, SVAMP and MATH algebra when given): strict and lenient accuracy,
               format compliance, the share that goes on after </answer>, mean reward; --hint-probe N: the probe
    soyuz      the soyuz run's metrics over one 2-turn rollout (answer -> critique -> revision) per task and sample:
               reward (final answer), turn-0 score, recovery, bad->good, good->bad; a per-task table
    synthetic  mean score
    terminal   over the held-out shell exercises, --group-size episodes each through the multi-turn loop: solved
               share, score, turns, tool calls, malformed calls and time-outs per episode; adapter - base solved
               with a paired bootstrap interval
    revise     the revise experiment's metrics (final and turn-0 score, recovery, bad->good, good->bad) over
               --group-size two-turn rollouts of each held-out prompt, with the experiment's seeds
    mdp        solve rate by probe budget next to the random / minimax / max-split / oracle baselines, and which
               probes it picks (probe_choices: among minimax's, max-split's, the oracle's best; repeats); the MDP
               and its baselines are minigrpo/tasks/mdp/world.py
"""
import argparse
import os
import sys
import time

import torch

from minigrpo.evals import gsm8k, mdp, revise, soyuz, synthetic, terminal
from minigrpo.evals.common import UsageError, adapter_base, resolve_adapter, resolve_model
from minigrpo.errors import Refusal, StopRun
from minigrpo.files import disk_full, full_disk_line
from minigrpo.machine import pick_device, pick_dtype
from minigrpo.run import cli, lock, memguard
from minigrpo.run.folder import RunFolder
from minigrpo.run.flags import DTYPE_HELP, WEAK_SANDBOX_HELP, sandbox_refusal
from minigrpo.run.parsing import DefaultsShown, OneLineParser
from minigrpo.run.presets import PRESETS
from minigrpo.tasks import TASKS, task_class


def build_parser() -> argparse.ArgumentParser:
    p = OneLineParser(prog="eval.py", description="Evaluate a model (and a LoRA adapter on it) on a minigrpo task.",
                      formatter_class=DefaultsShown)
    p.add_argument("--task", required=True, choices=TASKS)
    p.add_argument("--model", help="hub id, local folder, 'tiny' or 'tiny-qwen3.5', a full fine-tune's checkpoint "
                                   "or run folder (its latest checkpoint) (default: the base --adapter names, else "
                                   "the task's preset)")
    p.add_argument("--adapter", help="LoRA adapter folder, a checkpoint folder holding adapter/, or a run folder "
                                     "(its latest checkpoint); adds the 'adapter' column next to 'base' "
                                     "(default: none)")
    p.add_argument("--data", help="task data: gsm8k JSONL file / folder / 'hub' (default hub); soyuz tasks JSON")
    p.add_argument("--svamp", help="gsm8k: SVAMP eval set, 'hub' or a local file in its schema (default: none)")
    p.add_argument("--math", help="gsm8k: MATH algebra eval set, 'hub' or a local file in its schema (default: none)")
    p.add_argument("--limit", type=int, help="examples per eval set (soyuz: tasks; mdp: records per cell) "
                   "(default: all, but 300 of SVAMP and MATH; mdp: the pipeline run's eval_per_cell, else 16)")
    p.add_argument("--hint-probe", type=int, default=0, metavar="N",
                   help="gsm8k: hint probe on the first N problems of the eval split (the gsm8k run used 200)")
    p.add_argument("--probe-scoring", choices=["strict", "lenient"], default="strict",
                   help="gsm8k: what counts as right in the hint probe (lenient for base models without tags)")
    p.add_argument("--no-stop", action="store_true",
                   help="gsm8k: do not stop at </answer>, to measure how often the model goes on after it")
    p.add_argument("--run", help="training run folder: plot its reward/accuracy curves from metrics.jsonl "
                                 "(default: none)")
    p.add_argument("--out", help="output folder (default: RUN/eval with --run, else runs/eval-<task>-<time>)")
    # decoding
    p.add_argument("--max-new-tokens", type=int, help="default: the task's training preset")
    p.add_argument("--batch-size", type=int, default=32, help="prompts per sampler call")
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--enable-thinking", action="store_true", help="let Qwen3/3.5 think (off, as in training)")
    p.add_argument("--compile", action="store_true", help="torch.compile the sampler's decode step (GPU speed)")
    # soyuz
    p.add_argument("--judge", help="soyuz judge: local (default) | claude | cmd:<command> | http(s)://server/v1")
    p.add_argument("--judge-workers", type=int, default=8)
    p.add_argument("--group-size", type=int, help="soyuz, revise: rollouts per task or prompt (default 1; >1 needs "
                                                  "--temperature)")
    # mdp
    p.add_argument("--mdp-prompt", choices=["full", "compact"],
                   help="mdp: prompt style (default: the one in pipeline.json next to --model or --adapter, from "
                        "the mdp pipeline run that trained it; else full)")
    # machine
    p.add_argument("--device", help="cuda | mps | cpu (default: the best available)")
    p.add_argument("--dtype", choices=["float32", "bfloat16", "float16"], help=DTYPE_HELP)
    p.add_argument("--seed", type=int, help="mdp: the eval records' seed (default: the pipeline run's, so a saved "
                   "model plays the eval records of its run's table, else 0); other tasks: the sampling seed "
                   "(default 0)")
    p.add_argument("--sample-seed", type=int, help="the sampler's seed, for --temperature > 0 (default: 0 for mdp, "
                   "whose --seed picks the records; --seed for the other tasks)")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    p.add_argument("--weak-sandbox", action="store_true", help=WEAK_SANDBOX_HELP)
    return p


def check_args(args):
    """Every flag problem we can see before loading anything, as one actionable line."""
    for flag in ("limit", "max_new_tokens", "batch_size", "group_size", "judge_workers"):
        value = getattr(args, flag)
        if value is not None and value < 1:
            raise UsageError(f"--{flag.replace('_', '-')} {value}: must be at least 1")
    if args.hint_probe < 0:
        raise UsageError(f"--hint-probe {args.hint_probe}: must be 0 (off) or a number of problems")
    if args.temperature < 0 or not 0 < args.top_p <= 1:
        raise UsageError("--temperature must be >= 0 (0 = greedy) and --top-p in (0, 1]")
    only = {"gsm8k": ("svamp", "math", "no_stop", "hint_probe"), "soyuz": ("judge",), "mdp": ("mdp_prompt",)}
    for task, flags in only.items():
        for flag in flags:
            if args.task != task and getattr(args, flag):
                raise UsageError(f"--{flag.replace('_', '-')} is for --task {task} only")
    if args.weak_sandbox and args.task != "terminal":
        raise UsageError(f"--weak-sandbox: only --task terminal runs an agent's commands, not --task {args.task}")
    refusal = sandbox_refusal(args.task, args.weak_sandbox)
    if refusal:
        raise UsageError(refusal)
    if args.group_size and args.task not in ("soyuz", "revise", "terminal"):
        raise UsageError("--group-size is for --task soyuz, revise and terminal only")
    for flag in ("data", "svamp", "math"):
        path = getattr(args, flag)
        if path not in (None, "hub") and not os.path.exists(path):
            raise UsageError(f"--{flag} {path}: no such file or folder (pass a local file, or 'hub' to download)")
    if args.task == "soyuz" and args.data == "hub":
        raise UsageError("--data hub: the soyuz tasks are a local JSON file (default minigrpo/data/soyuz_tasks.json)")
    if args.run is not None and not os.path.exists(os.path.join(args.run, "metrics.jsonl")):
        raise UsageError(f"--run {args.run}: no metrics.jsonl there; pass a training run folder (runs/<name>)")
    args.model = resolve_model(args.model)
    if args.adapter is not None:
        args.adapter = resolve_adapter(args.adapter)
    if args.group_size and args.group_size > 1 and args.temperature == 0:
        raise UsageError(f"--group-size {args.group_size} with greedy decoding gives identical samples; "
                         "add --temperature (e.g. 1.0) or use --group-size 1")


def resolve_defaults(args):
    preset = PRESETS.get(args.task, {})
    if args.model is None and args.adapter is not None:
        args.model = adapter_base(args.adapter)
    args.model = args.model or preset.get("model", "tiny")
    args.max_new_tokens = args.max_new_tokens or preset.get("max_new_tokens", 8)
    args.group_size = args.group_size or 1
    if args.seed is None:
        args.seed = mdp.mdp_pipeline_run(args).get("seed", 0) if args.task == "mdp" else 0
    if args.sample_seed is None:   # mdp: the records and the sampling are two things, each with its own seed
        args.sample_seed = 0 if args.task == "mdp" else args.seed
    if args.out is None:
        args.out = os.path.join(args.run, "eval") if args.run else \
            os.path.join("runs", f"eval-{args.task}-{time.strftime('%Y%m%d-%H%M%S')}")
    return args


def refuse_what_cannot_fit(args):
    """The sampling's memory plan (the weights at the compute dtype, the largest sampler call's caches and prefill:
    --batch-size prompts, or terminal's one exercise, x --group-size) against the memory the device has, before the
    model is loaded: one line naming the flags to lower (minigrpo/run/memguard.py, as train.py does)."""
    from train import decode_rows
    device = pick_device(args.device)
    plan = argparse.Namespace(task=args.task, model=args.model, group_size=args.group_size,
                              tasks_per_step=args.batch_size, max_new_tokens=args.max_new_tokens, micro_batch=1,
                              lora_r=0, beta=0.0, lora_targets=None, grad_checkpoint=False)
    rows = decode_rows(task_class(args.task), plan, args.batch_size)
    try:
        memguard.check_fits(plan, rows, device, pick_dtype(args.dtype, device), args.compile, training=False,
                            lower="lower --batch-size, --group-size or --max-new-tokens")
    except (OSError, ValueError):   # no config.json to plan from: loading the model names what is wrong with it
        pass


EVALS = {"gsm8k": gsm8k.eval_gsm8k, "soyuz": soyuz.eval_soyuz, "synthetic": synthetic.eval_synthetic,
         "mdp": mdp.eval_mdp, "revise": revise.eval_revise, "terminal": terminal.eval_terminal}


def hold_out(out) -> str:
    """Make --out (and its missing parents) and hold it: one writer at a time (minigrpo/run/lock.py). Returns the
    topmost folder this made ("" when --out existed)."""
    top, parent = "", os.path.abspath(out)
    if RunFolder(os.path.dirname(parent), os.path.basename(parent)).is_run():   # its files are train.py's
        raise Refusal(f"--out {out}: is a training run's folder, whose files are train.py's: pass a folder of its "
                      f"own, such as --out {os.path.join(out, 'eval')}")
    while not os.path.exists(parent):
        top, parent = parent, os.path.dirname(parent)
    try:
        os.makedirs(out, exist_ok=True)
        lock.hold(out, instead="pass another --out")    # another eval.py writing there: refused, naming its pid
    except OSError as e:            # a full disk is a runtime stop; a read-only place, a file in the way the user's
        remove_made(out, top)
        if disk_full(e):
            raise StopRun(full_disk_line(f"--out {out}", os.path.dirname(os.path.abspath(out)))) from None
        raise UsageError(f"--out {out}: cannot write there ({e.strerror or e}); pass a folder you can write") from None
    return top


def remove_made(out, made):
    """Remove the folders hold_out made (out up to `made`, its topmost) while nothing was written into them."""
    folder = os.path.abspath(out)
    while made and os.path.isdir(folder) and not os.listdir(folder):
        os.rmdir(folder)
        if folder == made:
            return
        folder = os.path.dirname(folder)


def drop_out(out, made) -> str:
    """Let go of --out after a failed or stopped eval (`made`: hold_out's answer, None if it never got that far):
    the folders it made are removed while nothing was written into them. What is left, in words."""
    if made is None:
        return "nothing was written"
    lock.release(out)
    remove_made(out, made)
    return f"what it wrote is in {out}" if os.path.isdir(out) and os.listdir(out) else "nothing was written"


def main(argv=None) -> dict:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = cli.parse("eval.py", build_parser().parse_args, argv)  # a flag argparse refuses: one line, exit 2
    args.argv = argv
    held = {}                       # hold_out's answer and the start of the eval, once it got that far

    def evaluate():
        check_args(args)
        resolve_defaults(args)
        refuse_what_cannot_fit(args)   # before --out is made or the model loaded
        torch.manual_seed(args.sample_seed)
        held["made"] = hold_out(args.out)
        held["t0"] = time.perf_counter()
        return EVALS[args.task](args, args.out)
    with cli.ending("eval.py", lambda e: drop_out(args.out, held.get("made"))):
        result = evaluate()
    lock.release(args.out)
    with open(os.path.join(args.out, "report.md"), encoding="utf-8") as f:
        print(f.read())
    print(f"eval.py: wrote {', '.join(sorted(os.listdir(args.out)))} to {args.out} "
          f"in {time.perf_counter() - held['t0']:.0f}s", file=sys.stderr)
    return result


if __name__ == "__main__":
    main()
