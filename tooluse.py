"""The tool-use demonstration on a CPU: GRPO teaches a tiny from-scratch model to call a tool before it answers.

    python tooluse.py                          # base pretraining, GRPO, base-vs-trained table, curves: runs/tooluse
    python tooluse.py --run-name again --seed 1

The stages, the task and the report: minigrpo/experiments/tool_pipeline.py and minigrpo/tasks/lookup.py; the
measured run: docs/agentic.md. A rerun into the same run folder skips the stages it finished.
"""
import argparse

import torch

from minigrpo.errors import UsageError
from minigrpo.machine import pick_device, set_cpu_threads
from minigrpo.experiments.mdp_pipeline import scratch_config
from minigrpo.experiments.tool_pipeline import ExperimentConfig, grpo_args, run_experiment
from minigrpo.run import memguard
from minigrpo.run.cli import usage_error
from minigrpo.run.flags import check_device
from minigrpo.run.parsing import DefaultsShown
from minigrpo.tasks.lookup import LookupTask
from train import decode_rows, train


def main(argv=None):
    p = argparse.ArgumentParser(description="GRPO teaches a tiny model to call a lookup tool (CPU, minutes)",
                                formatter_class=DefaultsShown)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", help="cuda | mps | cpu (default: the best available)")
    p.add_argument("--threads", type=int, help="CPU threads (default: OMP_NUM_THREADS, else the idle cores)")
    p.add_argument("--runs-dir", default="runs")
    p.add_argument("--run-name", default="tooluse")
    p.add_argument("--quiet", action="store_true", help="no progress lines")
    p.add_argument("--redo", action="store_true",
                   help="run the stages of an existing run folder again with a --seed that differs from its own")
    args = p.parse_args(argv)
    if not 0 <= args.seed < 2 ** 32:
        p.error(f"--seed {args.seed}: must be in [0, 2^32)")
    if args.threads is not None and args.threads < 1:
        p.error(f"--threads {args.threads}: must be at least 1")
    try:
        check_device(args.device)
    except SystemExit as e:
        p.error(str(e))
    try:
        refuse_what_cannot_fit(args, ExperimentConfig())
    except UsageError as e:
        usage_error("tooluse.py", str(e))
    if pick_device(args.device).type == "cpu":
        args.threads = set_cpu_threads(args.threads)
    return run_experiment(args, trainer=train)


def refuse_what_cannot_fit(args, cfg):
    """The GRPO stage's memory plan (its from-scratch model, its fixed sizes) against the memory the device has,
    before anything is built (minigrpo/run/memguard.py, as train.py does). No flag sizes it: the line says so."""
    device = pick_device(args.device)
    gargs = grpo_args(args, cfg, args.runs_dir, args.seed)
    memguard.check_fits(gargs, decode_rows(LookupTask, gargs, gargs.tasks_per_step), device, torch.float32, False,
                        cfg=scratch_config(cfg.scratch), lower="no flag of tooluse.py sizes it (its sizes are "
                        "fixed: tool_pipeline.ExperimentConfig): free memory, or run it where more is free")


if __name__ == "__main__":
    main()
