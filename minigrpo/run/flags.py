"""train.py's flags. Each default is declared once, here; a task's preset (minigrpo/run/presets.py) replaces them as
parser defaults, and with --resume the run's saved config.json does; a flag given on the command line wins over
both. Every resolved value goes to runs/<name>/config.json."""
import argparse
import math
import os
import sys
import time

from minigrpo.grpo import LossSettings
from minigrpo.losses import IS_CORRECTIONS, IS_LEVELS, LOSSES
from minigrpo.run.folder import RunFolder
from minigrpo.run.parsing import DefaultsShown, OneLineParser
from minigrpo.run.steplog import TRACKERS, require_tracker
from minigrpo.run.presets import PRESETS
from minigrpo.run.resume import check_resume_flags
from minigrpo.tasks import TASKS, task_class


DTYPE_HELP = "(default: bfloat16 on CUDA, float32 elsewhere)"
WEAK_SANDBOX_HELP = ("terminal: run the agent's commands even where the full sandbox (bubblewrap, a uid of its own, "
                     "a cgroup) is missing; what the weaker one lacks is printed")


def build_parser() -> argparse.ArgumentParser:
    p = OneLineParser(description="GRPO post-training for Qwen models (minigrpo).", formatter_class=DefaultsShown)
    # what to train
    p.add_argument("--task", required=True, choices=TASKS)
    p.add_argument("--model", default="tiny", help="hub id, local folder, 'tiny', 'tiny-qwen3.5' or 'tiny-moe'")
    p.add_argument("--preset", help="take another task's preset (default: the task's own)")
    p.add_argument("--algo", help=argparse.SUPPRESS)   # an old flag nothing read: refused with what to use instead
    p.add_argument("--data", help="task data file or folder (default: the task's own)")
    # rollouts
    p.add_argument("--group-size", type=int, default=8, help="G: samples per prompt")
    p.add_argument("--tasks-per-step", type=int, default=8, help="prompts per optimizer step (over all ranks)")
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--max-new-tokens", type=int, default=256)
    p.add_argument("--decode", choices=["eager", "fast"],
                   help="sampler decode: fast = static shapes, compiled (CUDA graphs), LoRA unmerged; eager = "
                        "the plain step (default: fast on CUDA, eager elsewhere)")
    p.add_argument("--compile-gdn", action=argparse.BooleanOptionalAction,
                   help="training: the Gated DeltaNet chunk loop (Qwen3.5's forward, recompute and backward over the "
                        "chunks of a sequence) compiled with torch.compile, two graphs for every length; a compile "
                        "that fails warns once and runs eager (default: as --decode, on with fast)")
    p.add_argument("--enable-thinking", action="store_true", help="let Qwen3/3.5 think (off by default)")
    p.add_argument("--judge", default="local",
                   help="soyuz judge: local | claude | cmd:<command> | http(s)://server/v1")
    p.add_argument("--judge-workers", type=int, default=8)
    p.add_argument("--judge-model", help="model name for the claude / http judge (default: claude's own; "
                                         "http: $MINIGRPO_JUDGE_MODEL, else 'default')")
    p.add_argument("--judge-max-turns", type=int, help="claude judge: --max-turns (default: claude's own)")
    p.add_argument("--judge-retries", type=int, default=2,
                   help="LLM judges: retries of a failed call, with exponential backoff (2 s, 4 s, ...)")
    p.add_argument("--judge-timeout", type=float, default=180.0, help="LLM judges: seconds one call may take")
    p.add_argument("--judge-mode", choices=["hybrid", "llm"], default="hybrid",
                   help="LLM judges: hybrid (machine checks decide their criteria, the LLM the rest) or llm (the LLM "
                        "grades every criterion, as the soyuz run did)")
    # two-turn tasks (soyuz, revise): the recovery shaping of minigrpo/tasks/twoturn.py
    p.add_argument("--recovery-coef", type=float, default=0.5,
                   help="turn-1 reward = s1 + coef (s1 - s0); the soyuz run's 0.5; 0 = the final score alone")
    p.add_argument("--turn0-guard", action=argparse.BooleanOptionalAction, default=True,
                   help="turn-0 tokens trained on turn 0's own score (default); --no-turn0-guard trains them on the "
                        "shaped final reward, which pays for a bad start (the climb hack)")
    p.add_argument("--experiment", action="store_true",
                   help="revise: the whole experiment (format pretraining, three shaping arms at two seeds, report)")
    p.add_argument("--redo", action="store_true",
                   help="--experiment: run the stages of an existing run folder again, with flags that differ from "
                        "its own (without it such a rerun is refused)")
    p.add_argument("--weak-sandbox", action="store_true", help=WEAK_SANDBOX_HELP)
    # LoRA (--lora-r 0 = full fine-tune)
    p.add_argument("--lora-r", type=int, default=32, help="LoRA rank; 0 = full fine-tuning (every weight trains)")
    p.add_argument("--lora-alpha", type=float, default=32)
    p.add_argument("--lora-dropout", type=float, default=0.0)
    p.add_argument("--lora-targets", help="comma-separated module names (default: every projection)")
    p.add_argument("--lora-experts", action="store_true",
                   help="MoE models: LoRA on the routed experts too, each expert its own pair on gate_up_proj and "
                        "down_proj: r (2H + 3I) parameters an expert and layer, at r 32 1.26 B for Qwen3-30B-A3B "
                        "(20 GB in fp32 with grads and AdamW), 1.85 B for Qwen3.5-35B-A3B (30 GB); --plan shows "
                        "the run's (docs/moe.md)")
    p.add_argument("--lora-router", action="store_true",
                   help="MoE models: LoRA on the router too (frozen by default: a router that trains moves routes, "
                        "and the sampler's replayed routes then differ from the ones the policy would choose)")
    # optimizer and schedule
    p.add_argument("--lr", type=float, default=1e-5)
    p.add_argument("--warmup", type=float, default=0, help="warmup steps, or a fraction of all steps if < 1")
    p.add_argument("--schedule", default="cosine", choices=["cosine", "constant"])
    p.add_argument("--weight-decay", type=float, default=0.0)
    p.add_argument("--adam-beta2", type=float, default=0.999)
    p.add_argument("--max-grad-norm", type=float, default=1.0)
    # the GRPO loss
    p.add_argument("--beta", type=float, default=0.0, help="KL coefficient (0 = no reference forward)")
    p.add_argument("--kl", default="k3", choices=["k1", "k2", "k3"])
    p.add_argument("--eps-low", type=float, default=0.2)
    p.add_argument("--eps-high", type=float, default=0.28)
    p.add_argument("--mu", type=int, default=1,
                   help="inner epochs over each batch of rollouts (>1 = PPO-style clipping)")
    p.add_argument("--agg", default="token", choices=["token", "seq", "const"],
                   help="loss aggregation (docs/losses.md)")
    p.add_argument("--adv-scale", default="group", choices=["group", "batch", "none"])
    p.add_argument("--mask-truncated", action="store_true", help="do not train completions cut by the limit")
    p.add_argument("--loss", default="grpo", choices=list(LOSSES),
                   help="policy objective (docs/losses.md): grpo (token ratio), gspo / gspo-token (sequence ratio), "
                        "cispo (clipped stop-gradient weight)")
    p.add_argument("--gspo-eps-low", type=float, default=3e-4, help="gspo / gspo-token: the sequence ratio's clip")
    p.add_argument("--gspo-eps-high", type=float, default=4e-4, help="gspo / gspo-token: the sequence ratio's clip")
    p.add_argument("--dynamic-sampling", action="store_true",
                   help="DAPO: train only on prompts whose group's scores spread, drawing more to fill the step")
    p.add_argument("--max-draws", type=int, default=3,
                   help="--dynamic-sampling: at most this many draws of --tasks-per-step prompts per step")
    p.add_argument("--overlong-buffer", type=int, default=0,
                   help="DAPO's soft overlong punishment over the last N tokens before --max-new-tokens (0 = off)")
    p.add_argument("--is-correction", default="none", choices=list(IS_CORRECTIONS),
                   help="weigh by trainer / sampler probability: tis truncates it at --is-cap, mis drops above it")
    p.add_argument("--is-level", default="token", choices=list(IS_LEVELS), help="the weight per token or sequence")
    p.add_argument("--is-cap", type=float, default=2.0, help="--is-correction's cap, >= 1")
    # length of the run
    p.add_argument("--steps", type=int, help="optimizer steps (default: epochs over the train split)")
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--micro-batch", type=int, default=8, help="sequences per forward/backward")
    p.add_argument("--pack", action="store_true",
                   help="run each micro-batch's sequences packed into one row, without padding (the same numbers "
                        "to fp32 rounding; docs/training.md)")
    # machine
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--dtype", choices=["float32", "bfloat16", "float16"], help=DTYPE_HELP)
    p.add_argument("--device", help="cuda | mps | cpu (default: the best available)")
    p.add_argument("--threads", type=int, help="CPU threads (default: OMP_NUM_THREADS if set, else the usable cores "
                                               "the load leaves idle; saved with the run, so a resume keeps it)")
    p.add_argument("--grad-checkpoint", action="store_true", help="activation checkpointing (long sequences)")
    p.add_argument("--routing-replay", action=argparse.BooleanOptionalAction, default=True,
                   help="mixture-of-experts models: every trainer pass routes each token through the experts the "
                        "sampler chose (docs/moe.md); --no-routing-replay lets the trainer route itself, still "
                        "logging route_flip_share. Dense models: no effect")
    # run folder
    p.add_argument("--runs-dir", default="runs")
    p.add_argument("--run-name", help="(default: <task>-<date>-<time>, such as synthetic-20260101-120000)")
    p.add_argument("--save-every", type=int, default=50)
    p.add_argument("--keep-checkpoints", type=int, default=2, help="the latest N checkpoints kept (0 = all)")
    p.add_argument("--eval-every", type=int, default=0,
                   help="greedy eval on the val split every N steps (0 = never)")
    p.add_argument("--eval-limit", type=int, default=64, help="val examples per eval")
    p.add_argument("--resume", action="store_true", help="continue runs/<run-name> from its latest checkpoint")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.add_argument("--log-to", choices=sorted(TRACKERS),
                   help="also send each step's metrics to TensorBoard (runs/<name>/tensorboard) or Weights & Biases "
                        "(optional packages: pip install tensorboard / wandb) (default: neither, metrics.jsonl alone)")
    p.add_argument("--plan", action="store_true",
                   help="print the run's memory plan from the model's config.json and exit (minigrpo/run/memplan.py)")
    return p


def given_flags(parser, argv) -> dict:
    """Only the flags given on the command line (every default suppressed for one parse)."""
    defaults = [(action, action.default) for action in parser._actions]
    for action, _ in defaults:
        action.default = argparse.SUPPRESS
    try:
        return vars(parser.parse_args(argv))
    finally:
        for action, default in defaults:
            action.default = default


def resolve_args(argv=None) -> argparse.Namespace:
    """The run's arguments: a flag given > the saved config.json (--resume) > the task's preset > the default."""
    parser = build_parser()
    task_flag = next(a for a in parser._actions if a.dest == "task")
    task_flag.required = False          # --resume reads it from the run; a fresh run needs it (below)
    if {"-h", "--help"} & set(sys.argv[1:] if argv is None else argv):
        parser.parse_args(["--help"])   # with the defaults in place, which given_flags hides: --help shows them
    given = given_flags(parser, argv)
    if "task" not in given and not given.get("resume"):
        parser.error("the following arguments are required: --task (or --resume --run-name NAME to continue a run)")
    if given.get("task") == "mdp":   # the pipeline's stages take their settings from its own table, not from flags
        from minigrpo.experiments.mdp_pipeline import FLAGS
        unused = [f"--{k.replace('_', '-')}" for k in given if k not in FLAGS]
        if unused:
            raise SystemExit(f"{', '.join(unused)}: not used by --task mdp; its stage settings live in "
                             "minigrpo/experiments/mdp_pipeline.py PIPELINES (edit them there)")
    saved = {}
    if given.get("resume"):   # the run's own settings; a flag that would change what it trains is refused
        saved = RunFolder.saved_config(given.get("runs_dir", parser.get_default("runs_dir")), given.get("run_name"))
    preset = given.get("preset") or saved.get("preset") or given.get("task") or saved.get("task")
    if preset not in PRESETS:
        raise SystemExit(f"--preset {preset!r} is not a preset: choose one of {', '.join(PRESETS)}")
    parser.set_defaults(**PRESETS[preset])
    if saved:
        check_resume_flags(given, saved, parser.get_default)
        parser.set_defaults(**saved)
    args = parser.parse_args(argv)
    check_args(args, given)
    check_task_flags(args, given)
    check_loss_flags(args)
    refusal = sandbox_refusal(args.task, args.weak_sandbox)
    if refusal:
        raise SystemExit(refusal)
    if args.run_name is None:
        args.run_name = f"{args.task}-{time.strftime('%Y%m%d-%H%M%S')}"
    # before any work, nothing of it touched (a pipeline's folder too); under torchrun rank 0 alone, as it alone
    # makes the folder (another rank could see it half made)
    if os.environ.get("RANK", "0") == "0":
        RunFolder(args.runs_dir, args.run_name).refuse_foreign()
    require_tracker(args.log_to)
    return args



def loss_settings(args) -> LossSettings:
    """The run's loss choices from its flags, built once: gspo and gspo-token clip their sequence ratio by their
    own, much smaller, epsilons (--gspo-eps-low/--gspo-eps-high); every other objective by --eps-low/--eps-high."""
    gspo = args.loss.startswith("gspo")
    return LossSettings(loss=args.loss, eps_low=args.gspo_eps_low if gspo else args.eps_low,
                        eps_high=args.gspo_eps_high if gspo else args.eps_high, agg=args.agg,
                        max_tokens=args.max_new_tokens, beta=args.beta, kl_kind=args.kl,
                        is_correction=args.is_correction, is_level=args.is_level, is_cap=args.is_cap)


def check_task_flags(args, given):
    """The flags that only some tasks read: refused, with one line naming the flag, where they would be ignored."""
    if not math.isfinite(args.recovery_coef) or args.recovery_coef < 0:
        raise SystemExit(f"--recovery-coef {args.recovery_coef}: must be a finite number >= 0 (soyuz's 0.5; 0 = "
                         "the final score alone)")
    turns = task_class(args.task).turns
    for key in ("recovery_coef", "turn0_guard"):
        if key in given and turns != 2:
            raise SystemExit(f"{_flag(key, given)}: only two-turn tasks (soyuz, revise) use it, not --task {args.task}")
    if int(os.environ.get("WORLD_SIZE", 1)) > 1 and (args.task == "mdp" or args.experiment):
        what = "--task mdp" if args.task == "mdp" else "--experiment"
        raise SystemExit(f"{what}: a pipeline of stages that run in one process (under torchrun every rank would "
                         "run each stage and write the same run folder): run it with python, not torchrun")
    if args.weak_sandbox and args.task != "terminal":
        raise SystemExit(f"--weak-sandbox: only --task terminal runs an agent's commands, not --task {args.task}")
    if args.redo and not args.experiment:
        raise SystemExit("--redo: only --experiment reads it (it reruns an experiment's stages with changed flags)")
    if args.experiment and args.task != "revise":
        raise SystemExit(f"--experiment: only --task revise has one (--task {args.task} runs one training run; "
                         "--task mdp runs its pipeline without the flag)")
    if args.experiment and args.model != "tiny":
        raise SystemExit(f"--experiment: the revise experiment pretrains --model tiny from scratch, not "
                         f"{args.model} (train another model on --task revise without --experiment)")
    for key in ("recovery_coef", "turn0_guard", "resume"):
        if args.experiment and key in given:
            raise SystemExit(f"{_flag(key, given)}: --experiment sets it for each of its arms (minigrpo/experiments/"
                             "revise_pipeline.py ARMS); drop it, or run one arm without --experiment")


def sandbox_refusal(task: str, weak_ok: bool) -> str | None:
    """--task terminal (train.py, eval.py): the one-line refusal when this machine lacks the full sandbox for the
    agent's commands and --weak-sandbox was not given; with it, a warning naming what the weaker sandbox lacks."""
    if task != "terminal":
        return None
    from minigrpo.judge.sandbox import isolation, missing_isolation
    missing = missing_isolation()
    if not missing:
        return None
    if not weak_ok:
        return (f"--task terminal: the agent's commands run only in the full sandbox, and this machine lacks "
                f"{'; '.join(missing)}; install what is missing, or pass --weak-sandbox to accept a weaker one")
    level, weak = isolation()
    print(f"warning: --weak-sandbox: the agent's commands run in a weaker sandbox ({level}), which lacks: "
          f"{'; '.join(weak or missing)}", file=sys.stderr)
    return None


def check_loss_flags(args):
    """The ranges of the policy-loss flags, and no training on a distribution the loss does not score."""
    if args.top_p < 1.0 or args.top_k > 0:
        raise SystemExit(f"--top-p {args.top_p} --top-k {args.top_k}: GRPO trains on its own samples, and the "
                         "loss scores the untruncated policy while top-p / top-k sample a truncated one (an "
                         "off-policy update by construction); train with --top-p 1 --top-k 0 (truncate in eval.py)")
    if not 0 <= args.overlong_buffer <= args.max_new_tokens:
        raise SystemExit(f"--overlong-buffer {args.overlong_buffer}: must be between 0 (off) and --max-new-tokens "
                         f"({args.max_new_tokens})")
    if not (math.isfinite(args.is_cap) and args.is_cap >= 1.0):
        raise SystemExit(f"--is-cap {args.is_cap}: must be a finite number >= 1 (a cap below 1 would change the "
                         "weight 1 of a sampler that agrees with the trainer)")
    for key in ("gspo_eps_low", "gspo_eps_high"):
        if not 0 <= getattr(args, key) < 1:
            raise SystemExit(f"--{key.replace('_', '-')} {getattr(args, key)}: must be in [0, 1) (the paper's "
                             "3e-4 and 4e-4)")


def _flag(key, given) -> str:
    """The flag as the user typed it: --no-turn0-guard for turn0_guard=False."""
    return f"--{'no-' if given[key] is False else ''}{key.replace('_', '-')}"


# -----------------------------------------------------------------------------------------------------------------
# Every flag checked before anything is loaded or written: each value's range, then the rules between flags. A value
# is checked wherever it came from (the command line, the task's preset, a resumed run's config.json); each failure
# is one line naming the flag and what to give instead.

def _count(v):
    return v >= 1


RANGES = [  # (flags, test, what the value must be); None (a flag not given that has no default) is never checked
    (("group_size",), lambda v: v >= 2,
     "must be at least 2: GRPO compares each sample with the others of its group (a group of one has advantage 0)"),
    (("tasks_per_step", "micro_batch", "save_every", "max_new_tokens", "eval_limit", "judge_workers", "epochs", "mu",
      "steps", "threads", "judge_max_turns", "max_draws"), _count, "must be at least 1"),
    (("temperature",), lambda v: v > 0, "must be > 0: training samples its groups (at 0 every sample of a group is "
                                        "the same answer, and the trainer's log-probs divide by it)"),
    (("lr", "judge_timeout"), lambda v: v > 0, "must be > 0"),
    (("judge_retries",), lambda v: v >= 0, "must be >= 0 (0 = no retry)"),
    (("top_p",), lambda v: 0 < v <= 1, "must be in (0, 1] (1 = off)"),
    (("top_k",), lambda v: v >= 0, "must be >= 0 (0 = off)"),
    (("lora_r",), lambda v: v >= 0, "must be >= 0 (0 = full fine-tuning: every weight trains)"),
    (("lora_alpha",), lambda v: v > 0, "must be > 0 (the adapter's scale is alpha / r)"),
    (("lora_dropout",), lambda v: 0 <= v < 1, "must be in [0, 1)"),
    (("warmup",), lambda v: v >= 0, "must be >= 0: warmup steps, or a fraction of the run when below 1"),
    (("weight_decay", "beta"), lambda v: v >= 0, "must be >= 0 (0 = off)"),
    (("max_grad_norm",), lambda v: v >= 0, "must be >= 0 (0 = no clipping)"),
    (("adam_beta2",), lambda v: 0 <= v < 1, "must be in [0, 1)"),
    (("eps_low",), lambda v: 0 < v < 1, "must be in (0, 1): the ratio is clipped below at 1 - eps-low"),
    (("eps_high",), lambda v: v > 0, "must be > 0: the ratio is clipped above at 1 + eps-high"),
    (("eval_every",), lambda v: v >= 0, "must be >= 0 (0 = never)"),
    (("keep_checkpoints",), lambda v: v >= 0, "must be >= 0 (0 = keep every checkpoint)"),
    (("seed",), lambda v: 0 <= v < 2 ** 32, "must be in [0, 2^32) (numpy's seed range)"),
]
DATA_TASKS = {"gsm8k": "a GSM8K JSONL file, a folder holding train.jsonl and test.jsonl, or 'hub'",
              "soyuz": "a tasks JSON file in the schema of minigrpo/data/soyuz_tasks.json"}
JUDGE_FLAGS = ("judge", "judge_workers", "judge_model", "judge_max_turns", "judge_mode", "judge_retries",
               "judge_timeout")
LORA_FLAGS = ("lora_alpha", "lora_dropout", "lora_targets", "lora_experts", "lora_router")


def check_args(args, given):
    """Raise SystemExit("<one line>") for the first flag that is out of range or that the run would not read."""
    if "algo" in given:
        raise SystemExit(f"--algo {given['algo']}: train.py trains with GRPO only (drop the flag); SFT and DPO are "
                         "stages of the mdp pipeline (--task mdp)")
    for keys, test, must in RANGES:
        for key in keys:
            v = getattr(args, key, None)
            if v is not None and not (math.isfinite(v) and test(v)):
                raise SystemExit(f"{_named(key, v)}: {must}")
    if args.data is not None:
        if args.task not in DATA_TASKS:
            raise SystemExit(f"--data: --task {args.task} reads no data file (its examples are built in); drop it "
                             f"(--data is for {' and '.join(DATA_TASKS)})")
        if not os.path.exists(args.data) and not (args.task == "gsm8k" and args.data == "hub"):
            raise SystemExit(f"--data {args.data}: no such file or folder; pass {DATA_TASKS[args.task]}")
    for key in JUDGE_FLAGS:
        if key in given and args.task != "soyuz":
            raise SystemExit(f"{_named(key, given[key])}: only --task soyuz has a judge, not --task {args.task}")
    llm = args.judge not in (None, "local")
    for key, used, by in (("judge_mode", llm, "an LLM judge"), ("judge_model", llm, "an LLM judge"),
                          ("judge_retries", llm, "an LLM judge"), ("judge_timeout", llm, "an LLM judge"),
                          ("judge_max_turns", args.judge == "claude", "--judge claude")):
        if key in given and not used:
            raise SystemExit(f"{_named(key, given[key])}: only {by} reads it, not --judge {args.judge}")
    if "max_draws" in given and not args.dynamic_sampling:
        raise SystemExit(f"--max-draws {given['max_draws']}: only --dynamic-sampling reads it; add that, or drop it")
    for key in LORA_FLAGS:
        if key in given and args.lora_r == 0:
            raise SystemExit(f"{_named(key, given[key])}: only LoRA reads it, and --lora-r is 0 (full fine-tuning"
                             f"{'' if 'lora_r' in given else ', from the preset'}); add --lora-r N, or drop it")
    for key in ("lora_experts", "lora_router"):
        if getattr(args, key) and args.lora_dropout:
            raise SystemExit(f"--{key.replace('_', '-')}: takes no --lora-dropout (PEFT's adapters on the experts "
                             f"and the router have none); drop --lora-dropout {args.lora_dropout}")
    if args.lora_targets is not None:
        from minigrpo.lora import DEFAULT_TARGETS
        unknown = [t for t in args.lora_targets.split(",") if t not in DEFAULT_TARGETS]
        if unknown:
            raise SystemExit(f"--lora-targets: {', '.join(unknown) or 'an empty name'} is not a projection of a Qwen "
                             f"model; choose from {','.join(DEFAULT_TARGETS)}")
    if "epochs" in given and args.steps is not None:
        raise SystemExit(f"--epochs: --steps {args.steps} sets this run's length"
                         f"{'' if 'steps' in given else ' (the preset)'}; give --steps instead")
    if "eval_limit" in given and not args.eval_every:
        raise SystemExit("--eval-limit: only the greedy eval reads it, and it is off; add --eval-every N")
    if "kl" in given and args.beta == 0:
        raise SystemExit(f"--kl {args.kl}: the KL term is off (--beta 0); add --beta, e.g. --beta 0.04")
    for key in ("eps_low", "eps_high"):
        if key in given and args.mu == 1:
            raise SystemExit(f"{_named(key, given[key])}: clipping acts only from a second pass over the rollouts "
                             "(with --mu 1 the ratio is exactly 1); add --mu 2, or drop it")
    check_device(args.device)


def check_device(name):
    if name is None:
        return
    import torch
    try:
        device = torch.device(name)
    except RuntimeError:
        raise SystemExit(f"--device {name}: not a device; use cuda, cuda:N, mps or cpu") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit(f"--device {name}: no CUDA device here; use --device cpu, or leave --device out")
    if device.type == "cuda" and device.index is not None and device.index >= torch.cuda.device_count():
        raise SystemExit(f"--device {name}: this machine has {torch.cuda.device_count()} CUDA devices")
    if device.type == "mps" and not (getattr(torch.backends, "mps", None) and torch.backends.mps.is_available()):
        raise SystemExit(f"--device {name}: no MPS device here; use --device cpu, or leave --device out")


def _named(key, value) -> str:
    return f"--{key.replace('_', '-')}" + ("" if isinstance(value, bool) else f" {value}")


def decode_path(args, device) -> str:
    """--decode: "fast" (the static-shape compiled step) or "eager"; default fast on CUDA only."""
    import torch    # here, not at the top: --help answers before torch's import
    return getattr(args, "decode", None) or ("fast" if torch.device(device).type == "cuda" else "eager")


def gdn_backend(args, device):
    """--compile-gdn (default as --decode, on with fast): the chunk loop's torch.compile backend, or None (eager)."""
    on = args.compile_gdn if getattr(args, "compile_gdn", None) is not None else decode_path(args, device) == "fast"
    return "inductor" if on else None
