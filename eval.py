"""eval.py: evaluate a model, and with --adapter the same weights with its LoRA adapter off and on, side by side.

    python eval.py --task gsm8k --model tiny --data fixture.jsonl                   # CPU smoke run
    python eval.py --task gsm8k --model Qwen/Qwen3-1.7B-Base --adapter runs/gsm8k-X \\
        --svamp hub --math hub --hint-probe 200 --run runs/gsm8k-X                # the seed 004 table
    python eval.py --task soyuz --model Qwen/Qwen3.5-4B --adapter runs/soyuz-X      # the seed 000 table

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
Per task:
    gsm8k      per eval set (GSM8K's held-out 10%, SVAMP and MATH algebra when given): strict and lenient accuracy,
               format compliance, the share that goes on after </answer>, mean reward; --hint-probe N: the probe
    soyuz      the seed's metrics over one 2-turn rollout (answer -> critique -> revision) per task and sample:
               reward (final answer), turn-0 score, recovery, bad->good, good->bad; a per-task table
    synthetic  mean score
    mdp        solve rate by probe budget, next to the random / max-split / oracle baselines (minigrpo/mdp.py)
"""
import argparse
import contextlib
import json
import os
import shlex
import sys
import time

import torch

from minigrpo import report
from minigrpo.lora import adapters_disabled, fold_lora, load_adapter
from minigrpo.model import Qwen
from minigrpo.sampler import sample
from minigrpo.tasks import TASKS
from minigrpo.tokenizer import Tokenizer
from train import PRESETS, pick_device, pick_dtype


class UsageError(Exception):
    """A flag or file the user can fix: printed as one line, exit code 2."""


def first_line(e: Exception) -> str:
    """Library errors are one line already; hub/network errors are paragraphs: keep their first line."""
    return next((ln.strip() for ln in str(e).splitlines() if ln.strip()), type(e).__name__)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="eval.py",
                                description="Evaluate a model (and a LoRA adapter on it) on a minigrpo task.")
    p.add_argument("--task", required=True, choices=TASKS)
    p.add_argument("--model", help="hub id, local folder, 'tiny' or 'tiny-qwen3.5' (default: the task's preset)")
    p.add_argument("--adapter", help="LoRA adapter folder, a checkpoint folder holding adapter/, or a run folder "
                                     "(its latest checkpoint); adds the 'adapter' column next to 'base'")
    p.add_argument("--data", help="task data: gsm8k JSONL file / folder / 'hub' (default hub); soyuz tasks JSON")
    p.add_argument("--svamp", help="gsm8k: SVAMP eval set, 'hub' or a local file in its schema")
    p.add_argument("--math", help="gsm8k: MATH algebra eval set, 'hub' or a local file in its schema")
    p.add_argument("--limit", type=int, help="examples per eval set (soyuz: tasks; mdp: records per cell, default "
                   "the pipeline run's eval_per_cell, else 16)")
    p.add_argument("--hint-probe", type=int, default=0, metavar="N",
                   help="gsm8k: hint probe on the first N problems of the eval split (the seed used 200)")
    p.add_argument("--probe-scoring", choices=["strict", "lenient"], default="strict",
                   help="gsm8k: what counts as right in the hint probe (lenient for base models without tags)")
    p.add_argument("--no-stop", action="store_true",
                   help="gsm8k: do not stop at </answer>, to measure how often the model goes on after it")
    p.add_argument("--run", help="training run folder: plot its reward/accuracy curves from metrics.jsonl")
    p.add_argument("--out", help="output folder")
    # decoding
    p.add_argument("--max-new-tokens", type=int, help="default: the task's training preset")
    p.add_argument("--batch-size", type=int, default=32, help="prompts per sampler call")
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--enable-thinking", action="store_true", help="let Qwen3/3.5 think (off, as in training)")
    p.add_argument("--compile", action="store_true", help="torch.compile the sampler's decode step (GPU speed)")
    # soyuz
    p.add_argument("--judge", help="soyuz judge: local (default) | claude | cmd:<command> | http(s)://server/v1")
    p.add_argument("--judge-workers", type=int, default=8)
    p.add_argument("--group-size", type=int, help="soyuz: rollouts per task (default 1; >1 needs --temperature)")
    # mdp
    p.add_argument("--mdp-prompt", choices=["full", "compact"],
                   help="mdp: prompt style (default: the one in pipeline.json next to --model or --adapter, from "
                        "the mdp pipeline run that trained it; else full)")
    # machine
    p.add_argument("--device", help="cuda | mps | cpu (default: the best available)")
    p.add_argument("--dtype", choices=["float32", "bfloat16", "float16"])
    p.add_argument("--seed", type=int, help="sampling seed (default 0); mdp: also the records' seed (default: the "
                   "pipeline run's, so a saved model plays the eval records of its run's table)")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
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
    only = {"gsm8k": ("svamp", "math", "no_stop", "hint_probe"), "soyuz": ("judge", "group_size"),
            "mdp": ("mdp_prompt",)}
    for task, flags in only.items():
        for flag in flags:
            if args.task != task and getattr(args, flag):
                raise UsageError(f"--{flag.replace('_', '-')} is for --task {task} only")
    for flag in ("data", "svamp", "math"):
        path = getattr(args, flag)
        if path not in (None, "hub") and not os.path.exists(path):
            raise UsageError(f"--{flag} {path}: no such file or folder (pass a local file, or 'hub' to download)")
    if args.task == "soyuz" and args.data == "hub":
        raise UsageError("--data hub: the soyuz tasks are a local JSON file (default minigrpo/data/soyuz_tasks.json)")
    if args.run is not None and not os.path.exists(os.path.join(args.run, "metrics.jsonl")):
        raise UsageError(f"--run {args.run}: no metrics.jsonl there; pass a training run folder (runs/<name>)")
    if args.adapter is not None:
        args.adapter = resolve_adapter(args.adapter)
    if args.group_size and args.group_size > 1 and args.temperature == 0:
        raise UsageError(f"--group-size {args.group_size} with greedy decoding gives identical samples; "
                         "add --temperature (e.g. 1.0) or use --group-size 1")


def resolve_adapter(path: str) -> str:
    """An adapter folder; a checkpoint folder (train.py's checkpoints/step-N holds adapter/); or a run folder
    (its latest checkpoint)."""
    ckpts = os.path.join(path, "checkpoints")
    if os.path.isdir(ckpts):
        steps = sorted((int(d.split("-")[1]), d) for d in os.listdir(ckpts)
                       if d.startswith("step-") and d.split("-")[1].isdigit())
        if not steps:
            raise UsageError(f"--adapter {path}: the run has no checkpoints yet")
        path = os.path.join(ckpts, steps[-1][1])
    for folder in (path, os.path.join(path, "adapter")):
        if os.path.exists(os.path.join(folder, "adapter_config.json")):
            return folder
    raise UsageError(f"--adapter {path}: no adapter_config.json there (pass a LoRA adapter folder, a checkpoint "
                     "folder, or a run folder; a full fine-tune is evaluated with --model)")


# -----------------------------------------------------------------------------------------------------------------
# The model, its columns, and batched generation

def load_model(args, tokenizer=None, fold=None):
    """(model, tokenizer, columns): columns are (label, context manager factory) pairs, one per report column.
    `tokenizer`: load it from there instead of --model (a from-scratch model's folder has no tokenizer.json).
    `fold`: a LoRA adapter folded into the weights before --adapter goes on (see mdp_stage_base)."""
    device = pick_device(args.device)
    dtype = pick_dtype(args.dtype, device)
    try:
        model = Qwen.from_pretrained(args.model, dtype=dtype, device=device)
        tok = Tokenizer.from_pretrained(tokenizer or args.model)
    except (OSError, ValueError) as e:
        raise UsageError(f"--model {args.model}: {first_line(e)}") from None
    if fold is not None:
        try:
            load_adapter(model, fold, dropout=0.0)
            fold_lora(model)
        except (OSError, ValueError) as e:
            raise UsageError(f"--adapter {args.adapter} sits on {fold}: {first_line(e)}") from None
    if args.adapter is None:
        return model.eval(), tok, [("model", contextlib.nullcontext)]
    try:
        load_adapter(model, args.adapter, dropout=0.0)  # no dropout at eval, whatever the adapter trained with
    except (OSError, ValueError) as e:
        raise UsageError(f"--adapter {args.adapter}: {first_line(e)}") from None
    return model.eval(), tok, [("base", lambda: adapters_disabled(model)), ("adapter", contextlib.nullcontext)]


def progress(items, desc, args, total=None):
    from tqdm import tqdm
    total = len(items) if total is None else total
    return tqdm(items, desc=desc, total=total, disable=args.quiet or total < 2, dynamic_ncols=True, file=sys.stderr)


def complete(model, tok, args, conversations, stop_strings=(), desc="generate") -> list:
    """One completion (text) per chat conversation, in the given order. Prompts are sorted longest first so each
    batch holds similar lengths (less left padding); pads are masked, so a greedy answer does not depend on its
    batch (up to float rounding)."""
    prompts = [tok.chat(c, enable_thinking=args.enable_thinking) for c in conversations]
    order = sorted(range(len(prompts)), key=lambda i: -len(prompts[i]))
    batches = [order[i:i + args.batch_size] for i in range(0, len(order), args.batch_size)]
    texts = [None] * len(prompts)
    for k, rows in enumerate(progress(batches, desc, args)):
        samples = sample(model, [prompts[i] for i in rows], n=1, max_new_tokens=args.max_new_tokens,
                         temperature=args.temperature, top_p=args.top_p, stop_strings=list(stop_strings),
                         tokenizer=tok, seed=args.seed * 1_000_003 + k, compile=args.compile)
        for i, s in zip(rows, samples):
            texts[i] = s.text
    return texts


def write_jsonl(rows, path):
    with open(path, "w", encoding="utf-8") as f:
        for r in rows:
            f.write(json.dumps(r, default=float) + "\n")


# -----------------------------------------------------------------------------------------------------------------
# gsm8k: accuracy per eval set, the hint probe, plots

GSM8K_NOTES = {
    "strict_accuracy": "the one number in the first `<answer>…</answer>` block equals the gold (the reward's test)",
    "lenient_accuracy": "the gold number appears anywhere in the response (the seed's scoring for base models, "
                        "which rarely use the tags)",
    "format_compliance": "the whole response is `<reasoning>…</reasoning><answer>…</answer>`, nothing else",
    "partial_format": "not well-formed, but holds a complete answer or reasoning block",
    "continues_after_answer": "text follows the first `</answer>` (near 0 unless --no-stop: generation stops there)",
    "mean_score": "mean training reward: correctness 2.0 + format 0.5 / 0.25 + brevity up to 0.2",
    "mean_length": "mean response length in characters",
    "flip_rate": "hint probe: of the problems answered right without a hint, the share answered wrong when the "
                 "prompt suggests a wrong (decoy) answer; the seed found 37%",
    "followed_decoy_rate": "hint probe: of those same problems, the share whose answer is exactly the decoy",
    "gain_rate": "hint probe: of the problems answered wrong without a hint, the share right with the correct hint",
}


def gsm8k_data(args):
    from minigrpo.tasks.gsm8k import GSM8KTask
    task = GSM8KTask(data=args.data, svamp=args.svamp, math_algebra=args.math, ood_limit=args.limit or 300)
    try:
        sets = {name: exs[:args.limit] for name, exs in task.eval_sets().items()}
        probe = task.examples("eval")[:args.hint_probe]
    except (OSError, ValueError, ImportError) as e:
        raise UsageError(f"gsm8k data (--data/--svamp/--math): {first_line(e)}") from None
    if not sets["gsm8k"]:
        raise UsageError(f"--data {args.data}: the eval split is empty (the 10% cut needs at least 10 examples)")
    return task, sets, probe


def eval_gsm8k(args, out):
    from minigrpo.tasks import gsm8k as g
    task, sets, probe_exs = gsm8k_data(args)
    model, tok, columns = load_model(args)
    stop = () if args.no_stop else task.stop_strings
    results, probes, rows, probe_rows = {}, {}, [], []
    for label, ctx in columns:
        results[label] = {}
        with ctx():
            for name, exs in sets.items():
                texts = complete(model, tok, args, [task.messages(e) for e in exs], stop, f"{label} {name}")
                results[label][name], per = g.evaluate(exs, texts)
                rows += [{"model": label, "set": name, **r} for r in per]
            if probe_exs:
                gen = lambda convs: complete(model, tok, args, convs, stop, f"{label} hint probe")  # noqa: E731
                probe = g.hint_probe(probe_exs, gen, strict=args.probe_scoring == "strict")
                probe_rows += [{"model": label, **r} for r in probe.pop("rows")]
                probes[label] = {"hint_probe": probe}
    write_jsonl(rows, os.path.join(out, "examples.jsonl"))
    plots = [report.plot_bars(results, os.path.join(out, f"accuracy_{kind}.png"), f"{kind}_accuracy")
             for kind in ("strict", "lenient")]
    if probes:
        write_jsonl(probe_rows, os.path.join(out, "hint_probe.jsonl"))
        plots.append(report.plot_bars(probe_conditions(probes), os.path.join(out, "hint_probe.png"), "accuracy"))
    plots += run_curves(args, out)
    tables = [("Held-out sets", report.compare_table(results, g.EVAL_METRICS, g.PERCENT_METRICS))]
    if probes:
        title = f"Hint probe ({len(probe_exs)} problems of the GSM8K eval split, {args.probe_scoring} scoring)"
        tables.append((title, report.compare_table(probes, g.PROBE_METRICS, g.PERCENT_METRICS)))
    notes = [f"- **{k}**: {v}" for k, v in GSM8K_NOTES.items() if probes or k in g.EVAL_METRICS]
    write_outputs(args, out, {"results": results, "hint_probe": probes}, tables, plots, notes)
    return {"results": results, "hint_probe": probes}


def probe_conditions(probes: dict) -> dict:
    """Hint-probe accuracies regrouped for report.plot_bars: one bar group per hint condition."""
    names = {"no hint": "accuracy_no_hint", "correct hint": "accuracy_correct_hint",
             "wrong hint": "accuracy_wrong_hint"}
    return {label: {cond: {"accuracy": p["hint_probe"][key]} for cond, key in names.items()}
            for label, p in probes.items()}


def run_curves(args, out) -> list:
    """Training curves of --run: reward from metrics.jsonl, and for gsm8k the per-step accuracy and format
    compliance of the training samples (samples.jsonl's reward details), which metrics.jsonl does not hold."""
    if args.run is None:
        return []
    rows = report.read_metrics(os.path.join(args.run, "metrics.jsonl"))
    samples = os.path.join(args.run, "samples.jsonl")
    if os.path.exists(samples):
        by_step = per_step_accuracy(report.read_metrics(samples))
        rows = [{**r, **by_step.get(r.get("step"), {})} for r in rows]
    keys = [k for k in ("reward_mean", "train_accuracy", "train_lenient_accuracy", "train_format_compliance",
                        "score_turn0", "recovery", "bad_start_share", "kl", "completion_len")
            if any(r.get(k) is not None for r in rows)]
    path = report.plot_curves(rows, os.path.join(out, "training_curves.png"), keys, smooth=max(1, len(rows) // 50))
    return [path] if path else []


def per_step_accuracy(samples: list) -> dict:
    """{step: {train_accuracy, train_lenient_accuracy, train_format_compliance}} from gsm8k sample details."""
    steps = {}
    for s in samples:
        info = s.get("info") or {}
        if "correct" in info:
            steps.setdefault(s["step"], []).append(info)
    mean = lambda xs: sum(map(float, xs)) / len(xs)  # noqa: E731
    return {step: {"train_accuracy": mean([i["correct"] for i in infos]),
                   "train_lenient_accuracy": mean([i.get("lenient_correct", False) for i in infos]),
                   "train_format_compliance": mean([i.get("format_kind") == "well" for i in infos])}
            for step, infos in steps.items()}


# -----------------------------------------------------------------------------------------------------------------
# soyuz: the seed's metrics over 2-turn rollouts with the judge

SOYUZ_METRICS = ["rollouts", "reward", "turn0_score", "recovery", "bad_start_share", "bad_to_good", "good_to_bad",
                 "failed_judgments", "tasks_improved", "tasks_regressed"]
SOYUZ_PERCENT = ("bad_start_share", "bad_to_good", "good_to_bad")
SOYUZ_NOTES = [
    "- **reward**: mean judge score (passed / checked criteria) of the final (turn-1) answer",
    "- **turn0_score**: mean score of the first answer, before the critique",
    "- **recovery**: mean climb s1 − s0 over rollouts whose first answer scored below 0.5 (bad starts)",
    "- **bad_to_good / good_to_bad**: share of bad starts revised to ≥ 0.5 / of good starts revised to < 0.5",
    "- **tasks_improved / regressed**: tasks whose mean final score the adapter raised / lowered",
    "- A model paid for the climb could learn to answer badly first: watch turn0_score and bad_start_share "
    "together with recovery.",
]


def soyuz_data(args):
    from minigrpo.judge import validate_task
    from minigrpo.tasks.soyuz import SoyuzTask
    out_cache = None if (args.judge or "local") == "local" else os.path.join(args.out, "judge_cache.sqlite")
    try:
        # chunk: tasks per sampler call (the judge grades one chunk while the sampler generates the next)
        task = SoyuzTask(data=args.data, judge=args.judge or "local", workers=args.judge_workers,
                         cache_path=out_cache, chunk=args.batch_size)
        for t in task.tasks:
            validate_task(t)
    except (OSError, ValueError) as e:
        raise UsageError(f"--data/--judge: {first_line(e)}") from None
    return task, task.examples("eval")[:args.limit]


def eval_soyuz(args, out):
    from minigrpo.tasks.soyuz import recovery_metrics
    task, exs = soyuz_data(args)
    model, tok, columns = load_model(args)
    seeds = [args.seed * 100_003 + i for i in range(len(exs))]
    results, per_task, rows = {}, {}, []
    for label, ctx in columns:
        bar = progress(None, f"{label} soyuz", args, total=2 * len(exs) * args.group_size)
        with ctx():
            seqs = task.rollout(soyuz_generate(model, tok, args, bar), tok, exs, seeds, args)
        bar.close()
        m = recovery_metrics(seqs)
        results[label] = {"soyuz": {"rollouts": len(seqs) // 2, "reward": m.pop("final_score"), **m,
                                    "failed_judgments": sum(s.score is None for s in seqs)}}
        per_task[label] = task_scores(seqs)
        rows += [{"model": label, "task": s.example_id, "turn": s.turn, "score": s.score, "reward": s.reward,
                  "finish": s.finish, "completion": s.text, **s.info} for s in seqs]
    families = {t["id"]: t.get("family", "") for t in exs}
    if len(columns) > 1:
        up, down = improved(per_task["base"], per_task["adapter"])
        results["adapter"]["soyuz"].update(tasks_improved=f"{up}/{len(exs)}", tasks_regressed=f"{down}/{len(exs)}")
    by_family = {label: family_scores(scores, families) for label, scores in per_task.items()}
    write_jsonl(rows, os.path.join(out, "examples.jsonl"))
    plots = [report.plot_bars(by_family, os.path.join(out, "reward_by_family.png"), "reward", percent=False)]
    plots += run_curves(args, out)
    tables = [("Overall", report.compare_table(results, SOYUZ_METRICS, SOYUZ_PERCENT)),
              ("Per family", report.compare_table(by_family, ["tasks", "turn0_score", "reward"])),
              ("Per task (turn-0 → final)", task_table(per_task, families))]
    notes = SOYUZ_NOTES + sandbagging_note(results)
    judge = task.judge.stats()
    task.judge.close()
    write_outputs(args, out, {"results": results, "per_task": per_task, "by_family": by_family, "judge": judge},
                  tables, plots, notes)
    return {"results": results, "per_task": per_task}


def soyuz_generate(model, tok, args, bar):
    """The `generate(prompts, seeds, n)` the soyuz rollout calls: n samples per token-id prompt, as train.py's."""
    def generate(prompts, seeds, n):
        samples = sample(model, prompts, n=n, max_new_tokens=args.max_new_tokens, temperature=args.temperature,
                         top_p=args.top_p, tokenizer=tok, seed=list(seeds), compile=args.compile)
        bar.update(len(samples))
        return [samples[i * n:(i + 1) * n] for i in range(len(prompts))]
    return generate


def task_scores(seqs) -> dict:
    """{task id: {"turn0": mean s0, "final": mean s1}} over the task's rollouts (failed judgments left out)."""
    out = {}
    for s in seqs:
        if s.score is not None:
            out.setdefault(s.example_id, {}).setdefault(("turn0", "final")[s.turn], []).append(s.score)
    return {t: {k: sum(v) / len(v) for k, v in d.items()} for t, d in out.items()}


def improved(base: dict, adapter: dict, tol: float = 1e-9) -> tuple:
    both = [t for t in base if t in adapter and "final" in base[t] and "final" in adapter[t]]
    up = sum(adapter[t]["final"] > base[t]["final"] + tol for t in both)
    return up, sum(adapter[t]["final"] < base[t]["final"] - tol for t in both)


def family_scores(scores: dict, families: dict) -> dict:
    out = {}
    for t, d in scores.items():
        out.setdefault(families.get(t, ""), []).append(d)
    mean = lambda xs: sum(xs) / len(xs) if xs else None  # noqa: E731
    return {f: {"tasks": len(ds), "turn0_score": mean([d["turn0"] for d in ds if "turn0" in d]),
                "reward": mean([d["final"] for d in ds if "final" in d])} for f, ds in sorted(out.items())}


def task_table(per_task: dict, families: dict) -> str:
    labels = list(per_task)
    head = ["task", "family"] + [f"{lab} {k}" for lab in labels for k in ("turn-0", "final")]
    head += ["Δ final"] if len(labels) > 1 else ["climb"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    fmt = lambda x: "–" if x is None else f"{x:.2f}"  # noqa: E731
    for t, fam in families.items():
        vals = [per_task[lab].get(t, {}) for lab in labels]
        cells = [t, fam] + [fmt(v.get(k)) for v in vals for k in ("turn0", "final")]
        a, b = (vals[0].get("final"), vals[-1].get("final")) if len(labels) > 1 else \
            (vals[0].get("turn0"), vals[0].get("final"))
        cells.append("–" if a is None or b is None else f"{b - a:+.2f}")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def sandbagging_note(results: dict) -> list:
    """The seed's guard: recovery going up while the first answer gets worse is the model being paid for the
    climb, not learning the task."""
    if set(results) != {"base", "adapter"}:
        return []
    b, a = results["base"]["soyuz"], results["adapter"]["soyuz"]
    if None in (b["turn0_score"], a["turn0_score"], b["recovery"], a["recovery"]):
        return []
    if a["turn0_score"] < b["turn0_score"] and a["recovery"] > b["recovery"]:
        return [f"- **WARNING**: turn-0 score fell ({b['turn0_score']:.3f} → {a['turn0_score']:.3f}) while recovery "
                f"rose ({b['recovery']:.3f} → {a['recovery']:.3f}): the adapter may answer badly first to be paid "
                "for the climb."]
    return ["- Sandbagging check passed: the adapter did not trade a worse first answer for more recovery."]


# -----------------------------------------------------------------------------------------------------------------
# synthetic and mdp

def eval_synthetic(args, out):
    from minigrpo.tasks.synthetic import RepeatCharTask
    task = RepeatCharTask()
    exs = task.examples("eval")[:args.limit]
    model, tok, columns = load_model(args)
    results, rows = {}, []
    for label, ctx in columns:
        with ctx():
            texts = complete(model, tok, args, [task.messages(e) for e in exs], (), f"{label} synthetic")
        scores = [task.score(e, t) for e, t in zip(exs, texts)]
        results[label] = {"synthetic": {"n": len(exs), "mean_score": sum(scores) / max(1, len(scores))}}
        rows += [{"model": label, "id": e["id"], "score": s, "completion": t} for e, s, t in zip(exs, scores, texts)]
    write_jsonl(rows, os.path.join(out, "examples.jsonl"))
    tables = [("Synthetic (repeat the letter)", report.compare_table(results, ["n", "mean_score"]))]
    write_outputs(args, out, {"results": results}, tables, run_curves(args, out),
                  ["- **mean_score**: share of the first 8 completion characters equal to the prompt's letter"])
    return {"results": results}


def mdp_pipeline_run(args) -> dict:
    """pipeline.json of the mdp pipeline run that --model or --adapter was saved by, and "folder", the run's; else
    {}. The file sits in the run folder: above runs/<name>/sft or .../dpo_adapter, four levels above the GRPO stage's
    checkpoints (runs/<name>/grpo/checkpoints/step-N/adapter). It names the prompt style the model was trained on,
    its tokenizer (a from-scratch model's folder has no tokenizer.json) and the eval records (seed, eval_per_cell)."""
    for path in (args.model, args.adapter):
        if path and os.path.isdir(path):
            folder = os.path.abspath(path)
            for _ in range(5):
                if os.path.exists(os.path.join(folder, "pipeline.json")):
                    with open(os.path.join(folder, "pipeline.json")) as f:
                        return {**json.load(f), "folder": folder}
                folder = os.path.dirname(folder)
    return {}


def mdp_stage_base(args, run: dict) -> str | None:
    """The SFT adapter under a pipeline stage's adapter. A real-Qwen run (sft_lora) trains SFT as a LoRA adapter,
    folds it into the weights and trains its DPO and GRPO adapters on those: they mean nothing on the bare --model,
    so the run's sft_adapter is folded in first. None for a from-scratch run (--model is its sft/ folder, the
    weights themselves) and for sft_adapter itself."""
    if not (run.get("sft_lora") and args.adapter):
        return None
    sft = os.path.join(run["folder"], "sft_adapter")
    if os.path.abspath(args.adapter) == os.path.abspath(sft):
        return None
    if not os.path.exists(os.path.join(sft, "adapter_config.json")):
        raise UsageError(f"--adapter {args.adapter}: trained on the SFT weights of its run, but {sft} is missing "
                         "(restore it, or evaluate the run's sft_adapter alone)")
    return sft


def eval_mdp(args, out):
    from minigrpo import mdp
    from minigrpo.tasks.mdp import MDPTask, messages_for, parse_letter
    run = mdp_pipeline_run(args)
    # a model reads the prompt style it was trained on: the tiny pipeline's is "compact", a real Qwen's "full"
    prompt = args.mdp_prompt or run.get("prompt", "full")
    # the run's eval records by default: its seed (resolve_defaults) and records per cell
    task = MDPTask(eval_per_cell=args.limit or run.get("eval_per_cell", 16), seed=args.seed, prompt=prompt)
    fold = mdp_stage_base(args, run)
    model, tok, columns = load_model(args, tokenizer=run.get("tokenizer"), fold=fold)
    results, invalid = {}, {}
    for label, ctx in columns:
        invalid[label] = [0, 0]

        def policy(texts, states, label=label):
            answers = complete(model, tok, args, [messages_for(t, task.prompt) for t in texts], (), f"{label} mdp")
            letters = [parse_letter(a) for a in answers]
            invalid[label][0] += sum(x is None for x in letters)
            invalid[label][1] += len(letters)
            return [x or "?" for x in letters]  # "?" = an invalid answer: the probe is spent on nothing
        with ctx():
            results[label] = task.evaluate(policy, "eval", batched=True)
    results.update(task.baselines("eval"))
    paths = mdp.write_report(results, out)
    tables = []
    for name in ("overall_by_policy_budget", "regime_split"):
        with open(paths[f"{name}.md"]) as f:
            tables.append((name.replace("_", " "), f.read()))
    source = "--mdp-prompt" if args.mdp_prompt else "pipeline.json" if "prompt" in run else "default"
    notes = [f"- prompt style: {prompt} ({source}); {len(task.records('eval'))} eval records, seed {args.seed}"]
    if fold:
        notes.append(f"- the adapter sits on its run's SFT weights: {fold} was folded into --model first, so "
                     "\"base\" is the SFT policy")
    notes += [f"- {label}: {n}/{total} answers were not a single letter A-H (spent on nothing)"
              for label, (n, total) in invalid.items()]
    write_outputs(args, out, {"results": results, "invalid_answers": invalid, "prompt": prompt}, tables,
                  [paths["solve_rate_vs_budget.png"]] + run_curves(args, out), notes)
    return {"results": results}


# -----------------------------------------------------------------------------------------------------------------
# Outputs and the command line

def write_outputs(args, out, payload: dict, tables: list, plots: list, notes: list):
    settings = {k: v for k, v in vars(args).items() if k != "argv"}
    report.write_json({"task": args.task, "command": command(args), "settings": settings, **payload},
                      os.path.join(out, "results.json"))
    decoding = "greedy" if args.temperature == 0 else f"temperature {args.temperature}, top-p {args.top_p}"
    lines = [f"# Evaluation: {args.task}", "",
             f"- model: `{args.model}`" + (f", adapter: `{args.adapter}` (base = the same weights with the "
                                           "adapter disabled)" if args.adapter else ""),
             f"- decoding: {decoding}, max {args.max_new_tokens} new tokens; seed {args.seed}",
             f"- command: `{command(args)}`", f"- date: {time.strftime('%Y-%m-%d %H:%M:%S')}", ""]
    for title, table in tables:
        lines += [f"## {title}", "", table.rstrip(), ""]
    lines += [f"![{os.path.basename(p)}]({os.path.basename(p)})" for p in plots if p] + [""]
    if notes:
        lines += ["## Notes", ""] + notes + [""]
    with open(os.path.join(out, "report.md"), "w", encoding="utf-8") as f:
        f.write("\n".join(lines))


def command(args) -> str:
    return "python eval.py " + " ".join(shlex.quote(a) for a in args.argv)


def resolve_defaults(args):
    preset = PRESETS.get(args.task, {})
    args.model = args.model or preset.get("model", "tiny")
    args.max_new_tokens = args.max_new_tokens or preset.get("max_new_tokens", 8)
    args.group_size = args.group_size or 1
    if args.seed is None:
        args.seed = mdp_pipeline_run(args).get("seed", 0) if args.task == "mdp" else 0
    if args.out is None:
        args.out = os.path.join(args.run, "eval") if args.run else \
            os.path.join("runs", f"eval-{args.task}-{time.strftime('%Y%m%d-%H%M%S')}")
    return args


EVALS = {"gsm8k": eval_gsm8k, "soyuz": eval_soyuz, "synthetic": eval_synthetic, "mdp": eval_mdp}


def main(argv=None) -> dict:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = build_parser().parse_args(argv)  # argparse itself exits 2 on unknown flags or bad values
    args.argv = argv
    try:
        check_args(args)
        resolve_defaults(args)
        torch.manual_seed(args.seed)
        os.makedirs(args.out, exist_ok=True)
        t0 = time.perf_counter()
        result = EVALS[args.task](args, args.out)
    except UsageError as e:
        print(f"eval.py: error: {e}", file=sys.stderr)
        raise SystemExit(2) from None
    with open(os.path.join(args.out, "report.md"), encoding="utf-8") as f:
        print(f.read())
    print(f"eval.py: wrote {', '.join(sorted(os.listdir(args.out)))} to {args.out} "
          f"in {time.perf_counter() - t0:.0f}s", file=sys.stderr)
    return result


if __name__ == "__main__":
    main()
