"""Training curves: runs/<name>/curves.png, redrawn from metrics.jsonl at every checkpoint (the last step always
is one, so the end of a run too), and the matplotlib plumbing that the report plots share (minigrpo/evals/report.py).

Panels against the optimizer step, each drawn only where the metrics have it (a task that logs no per-turn scores,
an older run folder, a metric that was None at every step):

    reward            raw reward of the final turn, a band of ± its std over the step's samples, the shaped
                      reward where shaping moved it, and val_reward where --eval-every logged one
    per-turn scores   multi-turn tasks (soyuz): turn-0 score, final score, recovery (final - turn 0 on bad starts)
    KL                to the reference, per token; 0 at every step means β = 0 (no reference forward)
    entropy           of the trainer's token distribution, per completion token
    grad norm         before clipping (clip_grad_norm_ returns the norm it saw)
    completion length tokens per completion
    zero spread       the share of groups whose scores were all equal (no gradient), and of truncated completions

matplotlib is imported on the first draw, with the Agg backend (files only, no display), so importing train.py
stays fast. A PNG is written to a temporary name and renamed into place, so a kill never leaves half a picture.
"""
import json
import math
import os
import sys

from minigrpo.files import atomic_write

# (title, y label, [(metric, legend label)]): the first series of a panel is its main line
PANELS = [
    ("reward", "score", [("reward_mean", "reward (final turn)"), ("shaped_reward_mean", "shaped reward"),
                         ("val_reward", "val reward (greedy)")]),
    ("per-turn scores", "score", [("turn0_score", "turn-0 score"), ("final_score", "final score"),
                                  ("recovery", "recovery (bad starts)")]),
    ("KL to the reference", "per token", [("kl", "KL")]),
    ("entropy", "nats per token", [("entropy", "entropy")]),
    ("grad norm", "L2 norm before clipping", [("grad_norm", "grad norm")]),
    ("completion length", "tokens", [("completion_len", "mean length")]),
    ("zero-spread groups and truncation", "share", [("zero_spread", "zero-spread groups"),
                                                    ("truncated", "truncated completions")]),
    ("sampler-trainer log-prob gap", "nats per token", [("sampler_logp_diff", "mean"),
                                                        ("sampler_logp_diff_p95", "p95"),
                                                        ("sampler_logp_diff_max", "max")]),
    ("ratio tail", "share of tokens", [("ratio_outside", "ratio outside [0.9, 1.1]")]),
    ("time by phase", "seconds per step", [("time_generate", "generation (sampler)"),
                                           ("time_judge", "judge wait (rest of the rollout)"),
                                           ("time_reference", "reference"),
                                           ("time_policy", "policy forward + backward"),
                                           ("time_optimizer", "all-reduce + clip + AdamW"),
                                           ("time_checkpoint", "checkpoint (after the step before)")]),
]


def read_metrics(path: str) -> list[dict]:
    """The rows of a metrics.jsonl (one JSON object a line; blank or torn last lines skipped)."""
    rows = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:
                continue  # a run killed mid-write leaves a torn last line
    return rows


def pyplot():
    import matplotlib
    matplotlib.use("Agg")  # files only, never a window
    import matplotlib.pyplot as plt
    return plt


def smooth(ys: list[float], window: int) -> list[float]:
    """Trailing moving average: RL curves are noisy step to step."""
    out, acc = [], []
    for y in ys:
        acc = (acc + [y])[-window:]
        out.append(sum(acc) / len(acc))
    return out


def save(fig, out_path: str) -> str:
    """Lay out, write the PNG atomically (temp name + rename) and free the figure."""
    plt = pyplot()
    os.makedirs(os.path.dirname(os.path.abspath(out_path)), exist_ok=True)
    fig.tight_layout()
    atomic_write(out_path, lambda tmp: fig.savefig(tmp, format="png", dpi=120), fsync=False)
    plt.close(fig)
    return out_path


# ----------------------------------------------------------------------------------------------------------------
# The training curves


def series(rows: list[dict], key: str) -> tuple[list, list]:
    """(steps, values) of one metric, the steps where it is absent, None or not a finite number left out."""
    pts = [(r.get("step", i), r.get(key)) for i, r in enumerate(rows)]
    pts = [(x, float(y)) for x, y in pts
           if isinstance(y, (int, float)) and not isinstance(y, bool) and math.isfinite(y)]
    return [x for x, _ in pts], [y for _, y in pts]


def panels(rows: list[dict]) -> list:
    """PANELS cut down to the series that have a point, and to the panels that keep one."""
    cut = [(name, ylabel, [(k, label) for k, label in keys if _drawn(rows, k)]) for name, ylabel, keys in PANELS]
    return [p for p in cut if p[2]]


def draw_curves(rows: list[dict], out_path: str, title: str = "") -> str | None:
    """The run's panels in a grid of two columns; None when no panel has a point (nothing is written then)."""
    drawn = panels(rows)
    if not drawn:
        return None
    plt = pyplot()
    nrows = math.ceil(len(drawn) / 2)
    fig, axes = plt.subplots(nrows, 2, figsize=(11, 2.9 * nrows + 0.6), squeeze=False)
    window = max(1, len(rows) // 50)                           # smooth over 1/50 of the run
    for ax, (name, ylabel, keys) in zip(axes.flat, drawn):
        for i, (key, label) in enumerate(keys):
            xs, ys = series(rows, key)
            color = f"C{i}"
            if key == "reward_mean":
                _std_band(ax, rows, color)
            if key == "val_reward":                            # a few eval steps: markers, no smoothing
                ax.plot(xs, ys, "o", color=color, markersize=4, label=label)
                continue
            if window > 1:
                ax.plot(xs, ys, color=color, alpha=0.25, linewidth=0.8)
            ax.plot(xs, smooth(ys, window), color=color, linewidth=1.4, label=label)
        if keys[0][0] == "kl" and not any(series(rows, "kl")[1]):
            ax.text(0.5, 0.75, "0 at every step: β = 0, no reference forward", transform=ax.transAxes,
                    ha="center", va="center", fontsize=9, color="0.3")
        ax.set_title(name, fontsize=10)
        ax.set_xlabel("step")
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
        if len(keys) > 1 or name == "reward":            # the band has a legend entry of its own
            ax.legend(fontsize=7, loc="best")
    for ax in list(axes.flat)[len(drawn):]:
        ax.axis("off")
    if title:
        fig.suptitle(title, fontsize=11)
    return save(fig, out_path)


def _std_band(ax, rows, color):
    """reward_mean ± reward_std, at the steps that have both (the std is over every sample of the step)."""
    pts = [(r.get("step", i), r.get("reward_mean"), r.get("reward_std")) for i, r in enumerate(rows)]
    pts = [p for p in pts if isinstance(p[1], (int, float)) and isinstance(p[2], (int, float))]
    if pts:
        xs = [p[0] for p in pts]
        ax.fill_between(xs, [m - s for _, m, s in pts], [m + s for _, m, s in pts], color=color, alpha=0.15,
                        linewidth=0, label="± std over samples")


def _drawn(rows, key) -> bool:
    """A metric with at least one point; the shaped reward only where shaping made it differ from the raw one."""
    if key == "shaped_reward_mean" and all(r.get(key) == r.get("reward_mean") for r in rows):
        return False
    return bool(series(rows, key)[0])


def write_run_curves(run_dir: str) -> str | None:
    """runs/<name>/curves.png from its metrics.jsonl, titled with the run's name, task and model (config.json).
    Never raises: a plotting failure (a broken matplotlib, a full disk) prints one warning line and the training
    run goes on, since the curves can be redrawn from metrics.jsonl at any time with this function."""
    try:
        config = {}
        if os.path.exists(os.path.join(run_dir, "config.json")):
            with open(os.path.join(run_dir, "config.json")) as f:
                config = json.load(f)
        rows = read_metrics(os.path.join(run_dir, "metrics.jsonl"))
        title = " ".join([os.path.basename(os.path.normpath(run_dir))] +
                         [f"{k}={config[k]}" for k in ("task", "model") if config.get(k) is not None])
        return draw_curves(rows, os.path.join(run_dir, "curves.png"), title)
    except Exception as e:   # noqa: BLE001 -- any failure here must not stop the run
        print(f"warning: could not draw {os.path.join(run_dir, 'curves.png')}: {type(e).__name__}: {e}",
              file=sys.stderr)
        return None
