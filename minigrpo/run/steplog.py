"""What a step logs: its line of metrics.jsonl (`step_metrics`; docs/training.md lists the fields), its samples'
records, the run's summary by epoch, and the same numbers to TensorBoard or W&B (--log-to) and to the progress bar.
The run folder these go into: minigrpo/run/folder.py."""
import importlib
import json
import math
import os
import secrets

from minigrpo.files import atomic_write
from minigrpo.metrics import mean
from minigrpo.run.gap import gap_metrics
from minigrpo.tasks.base import CACHE_COUNTS


# -----------------------------------------------------------------------------------------------------------------
# What one step logs, one line per step in metrics.jsonl (docs/training.md lists the fields)


def std(xs):
    xs = [x for x in xs if x is not None]
    m = mean(xs)
    return math.sqrt(sum((x - m) ** 2 for x in xs) / len(xs)) if xs else None


def step_metrics(step, epoch, all_seqs, adv_stats, loss_stats, grad_norm, lr, t_sample, t_train, extra):
    """Summarise one step. `all_seqs` are every rank's Seqs (gathered); loss_stats this rank's micro-batch stats.
    Lengths and truncation are per policy turn (an agentic episode is one Seq of several turns: Seq.policy_turns)."""
    turns = [t for s in all_seqs for t in s.policy_turns()]
    tokens = sum(t["tokens"] for t in turns)        # the policy's sampled tokens (an episode's tool output is not)
    w = [st["tokens"] for st in loss_stats] or [1.0]
    wmean = lambda key: sum(st.get(key, 0.0) * n for st, n in zip(loss_stats, w)) / max(sum(w), 1.0)
    # "loss" and "pg" of a micro-batch are its share of the step's loss (divided by the step's normaliser): their
    # sum over every micro-batch of every rank, per pass, is the step's loss whatever the cut into micro-batches
    passes = max((st.get("pass", 0) for st in loss_stats), default=0) + 1
    share = lambda key: sum(st.get(key, 0.0) for st in loss_stats) / passes
    m = {
        "step": step, "epoch": epoch,
        "reward_mean": mean([s.score for s in all_seqs if s.turn == max(x.turn for x in all_seqs)]),
        "reward_std": std([s.score for s in all_seqs]),
        "shaped_reward_mean": mean([s.reward for s in all_seqs]),
        "shaped_reward_std": std([s.reward for s in all_seqs]),
        "loss": share("loss"), "pg": share("pg"), "kl": wmean("kl"), "entropy": wmean("entropy"),
        "clip_low": wmean("clip_low"), "clip_high": wmean("clip_high"), "ratio_mean": wmean("ratio_mean"),
        "ratio_outside": wmean("ratio_outside"),
        "sampler_logp_diff": wmean("sampler_logp_diff"),
        **gap_metrics(loss_stats),    # p95 and max of the gap, and the share of the policy's move it carries
        "grad_norm": grad_norm, "lr": lr,
        "completion_len": tokens / max(len(turns), 1),
        "truncated": sum(t["finish_reason"] == "length" for t in turns) / max(len(turns), 1),
        "zero_spread": adv_stats.get("zero_spread_frac", adv_stats.get("zero_spread", 0)),
        "failed_scores": sum(s.score is None for s in all_seqs),
        "sampler_tok_s": tokens / max(t_sample, 1e-9),
        "trainer_tok_s": tokens * 1.0 / max(t_train, 1e-9),
    }
    for turn in sorted({s.turn for s in all_seqs}):
        m[f"score_turn{turn}"] = mean([s.score for s in all_seqs if s.turn == turn])
    for key in CACHE_COUNTS:        # a multi-turn rollout's sampler work (minigrpo/tasks/episodes.py)
        if any(key in s.info for s in all_seqs):
            m[key] = sum(s.info.get(key, 0) for s in all_seqs)
    routes = sum(st.get("routes", 0) for st in loss_stats)
    if routes:                      # MoE: the share of token-layer routes the trainer chose otherwise (docs/moe.md)
        m["route_flip_share"] = sum(st["route_flips"] for st in loss_stats) / routes
    m.update(extra)
    return m


def is_timing(key) -> bool:
    """The metrics that are wall-clock figures (tokens per second, seconds by phase): the only ones that differ
    between a run and its repetition or its kill-and-resume."""
    return key.endswith("_tok_s") or key.startswith("time_")


def sample_records(step, seqs, tok):
    return [{"step": step, "example": s.example_id, "turn": s.turn, "prompt": tok.decode(s.prompt_ids),
             "completion": s.text, "finish": s.finish_reason, "score": s.score, "reward": s.reward,
             "advantage": s.advantage, **({"info": s.info} if s.info else {})} for s in seqs]


def epoch_summary(metrics_path, max_rows: int = 10) -> str:
    """Mean reward per epoch (first and last step of each too); runs of many short epochs are merged into at most
    `max_rows` contiguous blocks."""
    epochs = {}
    with open(metrics_path) as f:
        for ln in f:
            m = json.loads(ln)
            if m.get("reward_mean") is not None:
                epochs.setdefault(m["epoch"], []).append(m["reward_mean"])
    keys = sorted(epochs)
    size = max(1, math.ceil(len(keys) / max_rows))
    lines = ["| epoch | steps | reward (mean) | first step | last step |", "|---|---|---|---|---|"]
    for i in range(0, len(keys), size):
        block = keys[i:i + size]
        rs = [r for k in block for r in epochs[k]]
        label = f"{block[0]}" if len(block) == 1 else f"{block[0]}-{block[-1]}"
        lines.append(f"| {label} | {len(rs)} | {sum(rs) / len(rs):.3f} | {rs[0]:.3f} | {rs[-1]:.3f} |")
    return "\n".join(lines)


# -----------------------------------------------------------------------------------------------------------------
# --log-to: the same per-step metrics, also sent to TensorBoard or Weights & Biases. Neither package is a
# requirement of minigrpo: the flag checks its package at start, before any model is loaded.

TRACKERS = {"tensorboard": ("torch.utils.tensorboard", "tensorboard"), "wandb": ("wandb", "wandb")}  # module, pip


def require_tracker(kind: str | None):
    """Exit with one line that names the flag and the package to install when --log-to's package is missing."""
    if kind is None:
        return
    module, package = TRACKERS[kind]
    try:
        importlib.import_module(module)
    except ImportError:
        raise SystemExit(f"--log-to {kind} needs the {package} package: pip install {package}") from None


class Tracker:
    """Each step's numbers (its metrics.jsonl line) to TensorBoard or W&B; a no-op for kind None (other ranks).

    Resume appends, as metrics.jsonl does. TensorBoard writes into the same runs/<name>/tensorboard and hides the
    events past the checkpoint (purge_step), as the log is cut back to it. W&B resumes the run whose id
    runs/<name>/wandb_id holds; it ignores a step logged twice, so the steps between the checkpoint and a kill
    keep their first values there. A run that starts at step 0 is a new W&B run."""

    def __init__(self, kind: str | None, run, config: dict, step: int):
        self.kind, self.writer = kind, None
        if kind == "tensorboard":
            from torch.utils.tensorboard import SummaryWriter
            self.writer = SummaryWriter(run.file("tensorboard"), purge_step=step + 1)
        elif kind == "wandb":
            import wandb
            self.writer = wandb.init(project=os.environ.get("WANDB_PROJECT", "minigrpo"),
                                     name=os.path.basename(run.path), id=wandb_id(run, new=step == 0),
                                     resume="allow", config=config, dir=run.path)

    def log(self, m: dict):
        scalars = {k: float(v) for k, v in m.items()
                   if k != "step" and isinstance(v, (int, float)) and not isinstance(v, bool)}
        if self.kind == "tensorboard":
            for k, v in scalars.items():
                self.writer.add_scalar(k, v, m["step"])
            self.writer.flush()            # a step takes seconds; a killed run loses no logged step
        elif self.kind == "wandb":
            self.writer.log(scalars, step=m["step"])

    def close(self):
        if self.kind == "tensorboard":
            self.writer.close()
        elif self.kind == "wandb":
            self.writer.finish()


def wandb_id(run, new: bool) -> str:
    """The W&B run id of this run folder: made and saved on a fresh start, read back on --resume."""
    path = run.file("wandb_id")
    if new or not os.path.exists(path):
        atomic_write(path, secrets.token_hex(4) + "\n")
    with open(path) as f:
        return f.read().strip()


class ProgressBar:
    """tqdm with reward, KL and tokens/s (train.py: rank 0 only, and not with --quiet); a no-op when disabled."""

    def __init__(self, total, initial, desc, enabled=True):
        self.bar = None
        if enabled:
            from tqdm import tqdm
            self.bar = tqdm(total=total, initial=initial, desc=desc, dynamic_ncols=True)

    def update(self, m):
        if self.bar:
            fmt = lambda x: "n/a" if x is None else f"{x:.3f}"  # noqa: E731
            self.bar.set_postfix(reward=fmt(m["reward_mean"]), kl=fmt(m["kl"]), tok_s=f"{m['sampler_tok_s']:.0f}")
            self.bar.update(1)

    def close(self):
        if self.bar:
            self.bar.close()

    def __enter__(self):      # train.py: closed before a stop's line is printed, so that line starts its own line
        return self           # and the bar is not redrawn after it

    def __exit__(self, *exc):
        self.close()
