"""Reports for eval.py: JSON files, a Markdown table comparing models side by side, and PNG plots.

Results are nested plain dicts: {model label: {eval set: {metric: value}}}, e.g. {"base": {"gsm8k":
{"strict_accuracy": 0.669, ...}}, "adapter": {...}}. Plots use matplotlib's Agg backend (no display needed);
matplotlib is imported only when a plot is drawn.
"""
import json
import math
import os
import tempfile


def write_json(obj, path: str) -> str:
    """Write JSON atomically (temp file + rename), so a killed run never leaves half a file."""
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=folder, suffix=".tmp")
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        json.dump(obj, f, indent=2, default=float)
    os.replace(tmp, path)
    return path


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


def _pyplot():
    import matplotlib
    matplotlib.use("Agg")  # files only, never a window
    import matplotlib.pyplot as plt
    return plt


def _smooth(ys: list[float], window: int) -> list[float]:
    """Trailing moving average: RL curves are noisy step to step."""
    out, acc = [], []
    for y in ys:
        acc = (acc + [y])[-window:]
        out.append(sum(acc) / len(acc))
    return out


def curve_keys(rows: list[dict]) -> list[str]:
    """The numeric metrics worth a curve by default: rewards, scores and accuracies."""
    keys = dict.fromkeys(k for r in rows for k, v in r.items()
                         if isinstance(v, (int, float)) and not isinstance(v, bool))
    return [k for k in keys if any(w in k for w in ("reward", "acc", "score"))]


def plot_curves(metrics: str | list[dict], out_path: str, keys: list[str] | None = None, smooth: int = 1,
                x_key: str = "step") -> str | None:
    """One panel per metric against the step (the row number when rows have no `x_key`); None if nothing to draw."""
    rows = read_metrics(metrics) if isinstance(metrics, str) else metrics
    keys = keys or curve_keys(rows)
    keys = [k for k in keys if any(k in r for r in rows)]
    if not keys:
        return None
    plt = _pyplot()
    cols = min(2, len(keys))
    nrows = math.ceil(len(keys) / cols)
    fig, axes = plt.subplots(nrows, cols, figsize=(6 * cols, 3.2 * nrows), squeeze=False)
    for ax, key in zip(axes.flat, keys):
        pts = [(r.get(x_key, i), r[key]) for i, r in enumerate(rows) if r.get(key) is not None]
        xs, ys = [p[0] for p in pts], [float(p[1]) for p in pts]
        if smooth > 1:
            ax.plot(xs, ys, alpha=0.25, color="C0")
        ax.plot(xs, _smooth(ys, max(1, smooth)), color="C0")
        ax.set_title(key)
        ax.set_xlabel(x_key)
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(keys):]:
        ax.axis("off")
    return _save(fig, plt, out_path)


def plot_bars(results: dict, out_path: str, metric: str = "strict_accuracy", percent: bool = True) -> str:
    """Grouped bars: one group per eval set, one bar per model, the value written on each bar."""
    plt = _pyplot()
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
    return _save(fig, plt, out_path)


def _save(fig, plt, out_path: str) -> str:
    os.makedirs(os.path.dirname(os.path.abspath(out_path)), exist_ok=True)
    fig.tight_layout()
    fig.savefig(out_path, dpi=120)
    plt.close(fig)
    return out_path
