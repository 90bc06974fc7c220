"""Reports for eval.py, the verifier MDP and the revise experiment: JSON files, a Markdown table comparing models
side by side, PNG plots (drawn with minigrpo/run/plots.py's plumbing), the MDP's solve-rate tables and the revise
experiment's table in the soyuz run's shape.

Results are nested plain dicts: {model label: {eval set: {metric: value}}}, e.g. {"base": {"gsm8k":
{"strict_accuracy": 0.669, ...}}, "adapter": {...}}. Plots use matplotlib's Agg backend (no display needed);
matplotlib is imported only when a plot is drawn.
"""
import csv
import json
import math
import os

from minigrpo.files import atomic_write
from minigrpo.run import plots


def write_json(obj, path: str) -> str:
    """Write JSON atomically (temp file + rename), so a killed run never leaves half a file."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    return atomic_write(path, json.dumps(obj, indent=2, default=float), fsync=False)


def _fmt(value, percent: bool) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return str(value)
    if percent:
        return f"{100 * value:.1f}%"
    return str(value) if isinstance(value, int) else f"{value:.3f}"


def _delta(a, b, percent: bool) -> str:
    if not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (a, b)):
        return "–"
    d = b - a
    return f"{100 * d:+.1f}pp" if percent else f"{d:+.3f}"


def compare_table(results: dict, metrics: list[str], percent: tuple = ()) -> str:
    """Markdown: one row per (set, metric), one column per model, and the change from the first model to the last.

    percent: metric names shown as percentages (their change in percentage points)."""
    labels = list(results)
    sets = list(dict.fromkeys(s for label in labels for s in results[label]))
    head = ["set", "metric", *labels] + (["change"] if len(labels) > 1 else [])
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for s in sets:
        for m in metrics:
            vals = [results[label].get(s, {}).get(m) for label in labels]
            if all(v is None for v in vals):
                continue
            cells = [s, m, *(_fmt(v, m in percent) for v in vals)]
            if len(labels) > 1:
                cells.append(_delta(vals[0], vals[-1], m in percent))
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def curve_keys(rows: list[dict]) -> list[str]:
    """The numeric metrics worth a curve by default: rewards, scores and accuracies."""
    keys = dict.fromkeys(k for r in rows for k, v in r.items()
                         if isinstance(v, (int, float)) and not isinstance(v, bool))
    return [k for k in keys if any(w in k for w in ("reward", "acc", "score"))]


def plot_curves(metrics: str | list[dict], out_path: str, keys: list[str] | None = None, smooth: int = 1,
                x_key: str = "step") -> str | None:
    """One panel per metric against the step (the row number when rows have no `x_key`); None if nothing to draw."""
    rows = plots.read_metrics(metrics) if isinstance(metrics, str) else metrics
    keys = keys or curve_keys(rows)
    keys = [k for k in keys if any(k in r for r in rows)]
    if not keys:
        return None
    plt = plots.pyplot()
    cols = min(2, len(keys))
    nrows = math.ceil(len(keys) / cols)
    fig, axes = plt.subplots(nrows, cols, figsize=(6 * cols, 3.2 * nrows), squeeze=False)
    for ax, key in zip(axes.flat, keys):
        pts = [(r.get(x_key, i), r[key]) for i, r in enumerate(rows) if r.get(key) is not None]
        xs, ys = [p[0] for p in pts], [float(p[1]) for p in pts]
        if smooth > 1:
            ax.plot(xs, ys, alpha=0.25, color="C0")
        ax.plot(xs, plots.smooth(ys, max(1, smooth)), color="C0")
        ax.set_title(key)
        ax.set_xlabel(x_key)
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(keys):]:
        ax.axis("off")
    return plots.save(fig, out_path)


def plot_bars(results: dict, out_path: str, metric: str = "strict_accuracy", percent: bool = True) -> str:
    """Grouped bars: one group per eval set, one bar per model, the value written on each bar."""
    plt = plots.pyplot()
    labels = list(results)
    sets = list(dict.fromkeys(s for label in labels for s in results[label]))
    width = 0.8 / max(1, len(labels))
    fig, ax = plt.subplots(figsize=(max(5, 1.8 * len(sets) * max(1, len(labels)) / 2 + 2), 4))
    for k, label in enumerate(labels):
        vals = [results[label].get(s, {}).get(metric) for s in sets]
        ys = [(100 * v if percent else v) if v is not None else 0.0 for v in vals]
        xs = [i + (k - (len(labels) - 1) / 2) * width for i in range(len(sets))]
        bars = ax.bar(xs, ys, width, label=label)
        ax.bar_label(bars, labels=[_fmt(v, percent) for v in vals], fontsize=8)
    ax.set_xticks(range(len(sets)), sets)
    ax.set_ylabel(f"{metric} (%)" if percent else metric)
    if percent:
        ax.set_ylim(0, 105)
    ax.legend()
    ax.grid(axis="y", alpha=0.3)
    return plots.save(fig, out_path)


# ----------------------------------------------------------------------------------------------------------------
# The verifier MDP's report (minigrpo/tasks/mdp/world.py): the mdp run's two tables (Markdown + CSV) and the
# solve-rate-vs-budget plot, from {policy: mdp.evaluate(...)}

def mdp_tables(results: dict) -> tuple:
    """results {policy: evaluate(...)} -> (budget table, regime table), each (header, rows); rates in percent."""
    any_res = next(iter(results.values()))
    budgets = sorted(any_res["overall"])
    top = budgets[-1]
    head1 = ["policy"] + [f"solved@{b}" for b in budgets] + [f"exact@{top}", f"survivors@{top}"]
    rows1 = [[name] + [100 * r["overall"][b]["solved"] for b in budgets]
             + [100 * r["overall"][top]["exact"], r["overall"][top]["survivors"]] for name, r in results.items()]
    regimes = list(any_res["by_regime"])
    head2 = ["policy"] + [f"{g} solved@{top}" for g in regimes]
    rows2 = [[name] + [100 * r["by_regime"][g][top]["solved"] for g in regimes] for name, r in results.items()]
    return (head1, rows1), (head2, rows2)


# The differences the report states with their noise: each stage against the SFT policy it started from (and, for
# eval.py --adapter, the adapter against its base). At 512 records one record is 0.2 points.
MDP_DIFFERENCES = (("process-DPO", "SFT"), ("GRPO", "SFT"), ("adapter", "base"))


def paired_bootstrap(a, b, n_boot: int = 10_000, seed: int = 0, level: float = 0.95) -> tuple:
    """Mean of a - b and its percentile bootstrap interval, resampling the records (pairs): a[i] and b[i] are two
    policies' outcomes on record i, so the noise shared by both (which records are hard) cancels. In points (x 100
    for 0/1 outcomes, as the tables print them)."""
    import numpy as np
    d = np.asarray(a, dtype=np.float64) - np.asarray(b, dtype=np.float64)              # (N,)
    idx = np.random.default_rng(seed).integers(0, len(d), size=(n_boot, len(d)))         # (n_boot, N)
    means = d[idx].mean(axis=1)
    lo, hi = np.quantile(means, [(1 - level) / 2, (1 + level) / 2])
    return 100 * float(d.mean()), 100 * float(lo), 100 * float(hi)


def mdp_difference_table(results: dict, pairs=MDP_DIFFERENCES) -> tuple:
    """(header, rows): for each pair (a, b) present in results, a - b solved at each budget with its paired
    bootstrap 95% interval (points) and what it says: "within noise" when the interval covers 0."""
    header = ["difference", "budget", "points", "95% low", "95% high", "reading"]
    rows = []
    for a, b in pairs:
        if a not in results or b not in results:
            continue
        ra, rb = results[a]["solved_by_record"], results[b]["solved_by_record"]
        for budget in sorted(ra):
            if len(ra[budget]) != len(rb[budget]):
                raise ValueError(f"{a} and {b} played different records at budget "
                                 f"{budget}")
            diff, lo, hi = paired_bootstrap(ra[budget], rb[budget])
            reading = "within noise" if lo <= 0 <= hi else ("above" if lo > 0 else "below")
            rows.append([f"{a} - {b}", str(budget), diff, lo, hi, reading])
    return header, rows


def mdp_choice_table(results: dict) -> tuple:
    """(header, rows): how each policy's probes compare with the rules' in its largest-budget games
    (mdp.choice_stats): the states counted, then the share of its letters among minimax's, max-split's and the
    oracle's best and that repeat a probe, in percent. Policies evaluated without "choices" are left out."""
    header = ["policy", "states", "minimax-best", "max-split-best", "oracle-best", "repeats"]
    keys = ("minimax_best", "max_split_best", "oracle_best", "repeat")
    rows = [[name, r["choices"]["states"]] + [100 * r["choices"][k] for k in keys]
            for name, r in results.items() if "choices" in r]
    return header, rows


def mdp_markdown_table(header: list, rows: list) -> str:
    """Rates get a % sign; the survivors column and integer counts (probe_choices' states) are plain numbers;
    differences are signed points."""
    def cell(h, x):
        if isinstance(x, (str, int)):
            return str(x)
        if h in ("points", "95% low", "95% high"):
            return f"{x:+.1f}"
        return f"{x:.1f}" + ("" if h.startswith("survivors") else "%")
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return "\n".join(lines + ["| " + " | ".join(cell(h, x) for h, x in zip(header, r)) + " |" for r in rows])


def plot_solve_rate(results: dict, path: str):
    """Solve rate (hidden-all) against probe budget, one line per policy."""
    fig, ax = plots.pyplot().subplots(figsize=(5.5, 3.8))
    for name, r in results.items():
        budgets = sorted(r["overall"])
        ax.plot(budgets, [100 * r["overall"][b]["solved"] for b in budgets], marker="o", label=name)
    ax.set(xlabel="probe budget (verifier queries)", ylabel="hidden-all solved (%)", title="Solve rate vs budget")
    ax.set_xticks(budgets)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    plots.save(fig, path)


def write_mdp_report(results: dict, out_dir: str) -> dict:
    """Writes overall_by_policy_budget.{md,csv} (solved at each budget, exact and survivors at the top one),
    regime_split.{md,csv}, differences.{md,csv} (MDP_DIFFERENCES present in results, with paired bootstrap 95%
    intervals; header only when none is), probe_choices.{md,csv} (mdp_choice_table) and solve_rate_vs_budget.png
    into out_dir; returns {file name: path}. CSV rates and differences are in percent (points)."""
    os.makedirs(out_dir, exist_ok=True)
    paths = {}
    tables = (*mdp_tables(results), mdp_difference_table(results), mdp_choice_table(results))
    names = ("overall_by_policy_budget", "regime_split", "differences", "probe_choices")
    for name, (header, rows) in zip(names, tables):
        for ext in ("md", "csv"):
            paths[f"{name}.{ext}"] = os.path.join(out_dir, f"{name}.{ext}")
        with open(paths[f"{name}.md"], "w") as f:
            f.write(mdp_markdown_table(header, rows) + "\n")
        with open(paths[f"{name}.csv"], "w", newline="") as f:
            csv.writer(f).writerows([header] + [[x if isinstance(x, str) else round(x, 2) for x in r] for r in rows])
    paths["solve_rate_vs_budget.png"] = os.path.join(out_dir, "solve_rate_vs_budget.png")
    plot_solve_rate(results, paths["solve_rate_vs_budget.png"])
    return paths



# ----------------------------------------------------------------------------------------------------------------
# The revise experiment's report (minigrpo/experiments/revise_pipeline.py): the soyuz run's metrics, base vs each
# trained arm, from {seed: {"base" | arm: metrics}}; metrics as twoturn.recovery_metrics, plus "pairs" [(s0, s1)] per
# eval rollout (the same prompts and sample seeds for every policy of a seed) and, for arms, the training "curve"

REVISE_METRICS = (("reward (final score)", "final_score"), ("turn-0 score", "turn0_score"), ("recovery", "recovery"),
                  ("bad->good", "bad_to_good"), ("good->bad", "good_to_bad"), ("bad-start share", "bad_start_share"))


def _policies(results):
    return list(dict.fromkeys(p for per_seed in results.values() for p in per_seed))


def _seed_values(results, policy, key):
    return [per_seed[policy][key] for per_seed in results.values() if per_seed[policy].get(key) is not None]


def revise_table(results) -> tuple:
    """(header, rows): one row per metric, one column per policy: the mean over seeds [each seed's value]."""
    policies = _policies(results)
    rows = []
    for label, key in REVISE_METRICS:
        cells = []
        for p in policies:
            vals = _seed_values(results, p, key)
            cells.append("–" if not vals else f"{sum(vals) / len(vals):.3f} [" +
                         ", ".join(f"{v:.2f}" for v in vals) + "]")
        rows.append([label] + cells)
    return ["metric"] + [p if p == "base" else f"{p} (trained)" for p in policies], rows


def revise_differences(results, baseline: str | None = None) -> tuple:
    """(header, rows): each arm - base, and each other arm - the first arm, on the final and the turn-0 score, in
    points (x 100), with a paired bootstrap 95% interval over the eval rollouts of every seed pooled (rollout i of a
    seed had the same prompt and sample seed under every policy, so the prompt's difficulty cancels)."""
    policies = _policies(results)
    arms = [p for p in policies if p != "base"]
    pairs = [(a, "base") for a in arms] + [(a, baseline or arms[0]) for a in arms[1:]]
    header = ["difference", "score", "points", "95% low", "95% high", "reading"]
    rows = []
    for a, b in pairs:
        for name, k in (("final", 1), ("turn-0", 0)):
            xa = [x[k] for per_seed in results.values() for x in per_seed[a]["pairs"]]
            xb = [x[k] for per_seed in results.values() for x in per_seed[b]["pairs"]]
            diff, lo, hi = paired_bootstrap(xa, xb)
            reading = "within noise" if lo <= 0 <= hi else ("above" if lo > 0 else "below")
            rows.append([f"{a} - {b}", name, f"{diff:+.1f}", f"{lo:+.1f}", f"{hi:+.1f}", reading])
    return header, rows


def _markdown(header, rows) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return "\n".join(lines + ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]) + "\n"


def plot_revise(results, path: str, smooth: int = 5) -> str:
    """Left: each metric, base and every trained arm (bars: mean over seeds; dots: each seed). Right: each arm's
    turn-0 (solid) and final (dashed) score during training, mean over seeds, trailing mean over `smooth` steps."""
    plt = plots.pyplot()
    policies = _policies(results)
    fig, (left, right) = plt.subplots(1, 2, figsize=(13, 4.2))
    metrics = REVISE_METRICS[:5]
    width = 0.8 / len(policies)
    for j, p in enumerate(policies):
        xs = [i + (j - (len(policies) - 1) / 2) * width for i in range(len(metrics))]
        vals = [_seed_values(results, p, key) for _, key in metrics]
        left.bar(xs, [sum(v) / len(v) if v else 0.0 for v in vals], width, label=p, color=f"C{j}", alpha=0.8)
        for x, v in zip(xs, vals):
            left.plot([x] * len(v), v, "k.", markersize=3)
    left.set_xticks(range(len(metrics)), [label.replace(" (", "\n(") for label, _ in metrics])
    left.set(ylim=(min(0.0, *(v for p in policies for _, k in metrics for v in _seed_values(results, p, k))), 1.05),
             title="base vs trained (held-out prompts, sampled)")
    left.legend(fontsize=8)
    left.grid(axis="y", alpha=0.3)
    for j, p in enumerate(policies):
        curves = [per_seed[p]["curve"] for per_seed in results.values() if "curve" in per_seed[p]]
        if not curves:
            continue
        n = min(len(c) for c in curves)
        for key, style in (("turn0_score", "-"), ("final_score", "--")):
            ys = [sum(c[i][key] for c in curves) / len(curves) for i in range(n)]
            right.plot([c["step"] for c in curves[0][:n]], plots.smooth(ys, smooth), style, color=f"C{j}",
                       label=f"{p}: {'turn-0' if key == 'turn0_score' else 'final'}")
    right.set(xlabel="GRPO step", ylabel="score (training rollouts)", title="during training (mean over seeds)")
    right.legend(fontsize=7)
    right.grid(alpha=0.3)
    return plots.save(fig, path)


def write_revise_report(results, out_dir: str) -> dict:
    """revise_table.{md,csv}, revise_differences.{md,csv} and revise.png in out_dir; returns {file name: path}. The
    CSV of the table has one row per (policy, seed) and per policy its mean over seeds."""
    os.makedirs(out_dir, exist_ok=True)
    paths = {name: os.path.join(out_dir, name) for name in
             ("revise_table.md", "revise_table.csv", "revise_differences.md", "revise_differences.csv", "revise.png")}
    differences = revise_differences(results)
    for name, (header, rows) in (("revise_table", revise_table(results)), ("revise_differences", differences)):
        with open(paths[f"{name}.md"], "w") as f:
            f.write(_markdown(header, rows))
    with open(paths["revise_differences.csv"], "w", newline="") as f:
        csv.writer(f).writerows([differences[0]] + differences[1])
    keys = [key for _, key in REVISE_METRICS]
    table = [["policy", "seed", *keys, "rollouts"]]
    for p in _policies(results):
        for seed, per_seed in results.items():
            table.append([p, seed, *(_round(per_seed[p].get(k)) for k in keys), len(per_seed[p]["pairs"])])
        table.append([p, "mean", *(_round(_mean(_seed_values(results, p, k))) for k in keys), ""])
    with open(paths["revise_table.csv"], "w", newline="") as f:
        csv.writer(f).writerows(table)
    plot_revise(results, paths["revise.png"])
    return paths


def _mean(xs):
    return sum(xs) / len(xs) if xs else None


def _round(x):
    return "" if x is None else round(x, 4)
