"""gsm8k: strict and lenient accuracy, format compliance, the share that goes on after </answer> and the mean
reward per eval set (GSM8K's held-out 10%, SVAMP and MATH algebra when given); --hint-probe N: the gsm8k run's probe
(does a suggested answer in the prompt flip a right answer?). Plots: accuracy bars per set, hint-probe bars."""
import math
import os
import zlib

from minigrpo.metrics import mean
from minigrpo.evals import report
from minigrpo.evals.common import UsageError, complete, first_line, load_model, run_curves, write_jsonl, write_outputs
from minigrpo.tasks import gsm8k as g

GSM8K_NOTES = {
    "strict_accuracy": "the one number in the first `<answer>…</answer>` block equals the gold (the reward's test)",
    "lenient_accuracy": "the gold number appears anywhere in the response (the gsm8k run's scoring for base models, "
                        "which rarely use the tags)",
    "format_compliance": "the whole response is `<reasoning>…</reasoning><answer>…</answer>`, nothing else",
    "partial_format": "not well-formed, but holds a complete answer or reasoning block",
    "continues_after_answer": "text follows the first `</answer>` (near 0 unless --no-stop: generation stops there)",
    "mean_score": "mean training reward: correctness 2.0 + format 0.5 / 0.25 + brevity up to 0.2",
    "mean_length": "mean response length in characters",
    "flip_rate": "hint probe: of the problems answered right without a hint, the share answered wrong when the "
                 "prompt suggests a wrong (decoy) answer; the gsm8k run found 37%",
    "followed_decoy_rate": "hint probe: of those same problems, the share whose answer is exactly the decoy",
    "gain_rate": "hint probe: of the problems answered wrong without a hint, the share right with the correct hint",
}


def gsm8k_data(args):
    task = g.GSM8KTask(data=args.data, svamp=args.svamp, math_algebra=args.math, ood_limit=args.limit or 300)
    try:
        sets = {name: exs[:args.limit] for name, exs in task.eval_sets().items()}
        probe = task.examples("eval")[:args.hint_probe]
    except (OSError, ValueError, ImportError) as e:
        raise UsageError(f"gsm8k data (--data/--svamp/--math): {first_line(e)}") from None
    if not sets["gsm8k"]:
        raise UsageError(f"--data {args.data}: the eval split is empty (the 10% cut needs at least 10 examples)")
    return task, sets, probe


def eval_gsm8k(args, out):
    task, sets, probe_exs = gsm8k_data(args)
    model, tok, columns = load_model(args)
    stop = () if args.no_stop else task.stop_strings
    results, probes, rows, probe_rows = {}, {}, [], []
    for label, ctx in columns:
        results[label] = {}
        with ctx():
            for name, exs in sets.items():
                texts = complete(model, tok, args, [task.messages(e) for e in exs], stop, f"{label} {name}")
                results[label][name], per = evaluate(exs, texts)
                rows += [{"model": label, "set": name, **r} for r in per]
            if probe_exs:
                gen = lambda convs: complete(model, tok, args, convs, stop, f"{label} hint probe")  # noqa: E731
                probe = hint_probe(probe_exs, gen, strict=args.probe_scoring == "strict")
                probe_rows += [{"model": label, **r} for r in probe.pop("rows")]
                probes[label] = {"hint_probe": probe}
    write_jsonl(rows, os.path.join(out, "examples.jsonl"))
    plots = [report.plot_bars(results, os.path.join(out, f"accuracy_{kind}.png"), f"{kind}_accuracy")
             for kind in ("strict", "lenient")]
    if probes:
        write_jsonl(probe_rows, os.path.join(out, "hint_probe.jsonl"))
        plots.append(report.plot_bars(probe_conditions(probes), os.path.join(out, "hint_probe.png"), "accuracy"))
    plots += run_curves(args, out)
    tables = [("Held-out sets", report.compare_table(results, EVAL_METRICS, PERCENT_METRICS))]
    if probes:
        title = f"Hint probe ({len(probe_exs)} problems of the GSM8K eval split, {args.probe_scoring} scoring)"
        tables.append((title, report.compare_table(probes, PROBE_METRICS, PERCENT_METRICS)))
    notes = [f"- **{k}**: {v}" for k, v in GSM8K_NOTES.items() if probes or k in EVAL_METRICS]
    write_outputs(args, out, {"results": results, "hint_probe": probes}, tables, plots, notes)
    return {"results": results, "hint_probe": probes}


def probe_conditions(probes: dict) -> dict:
    """Hint-probe accuracies regrouped for report.plot_bars: one bar group per hint condition."""
    names = {"no hint": "accuracy_no_hint", "correct hint": "accuracy_correct_hint",
             "wrong hint": "accuracy_wrong_hint"}
    return {label: {cond: {"accuracy": p["hint_probe"][key]} for cond, key in names.items()}
            for label, p in probes.items()}


# -----------------------------------------------------------------------------------------------------------------
# Metrics of one eval set, and the hint probe

# What eval.py tabulates (report.compare_table): per-set metrics and hint-probe rates, and which are percentages.
EVAL_METRICS = ["n", "strict_accuracy", "lenient_accuracy", "format_compliance", "partial_format",
                "continues_after_answer", "mean_score", "mean_length"]
PROBE_METRICS = ["n", "accuracy_no_hint", "accuracy_correct_hint", "accuracy_wrong_hint", "flip_rate",
                 "followed_decoy_rate", "gain_rate"]
PERCENT_METRICS = ("strict_accuracy", "lenient_accuracy", "format_compliance", "partial_format",
                   "continues_after_answer", "accuracy_no_hint", "accuracy_correct_hint", "accuracy_wrong_hint",
                   "flip_rate", "followed_decoy_rate", "gain_rate")


def evaluate(examples: list[dict], completions: list[str]) -> tuple[dict, list[dict]]:
    """Metrics of one eval set and a row per example.

    strict_accuracy: correct from the first <answer> block; lenient_accuracy: the gold number anywhere;
    format_compliance: share well-formed; partial_format: share partial; continues_after_answer: share with text
    after </answer>; mean_score: mean reward; mean_length: mean characters."""
    if len(examples) != len(completions):
        raise ValueError(f"{len(examples)} examples but {len(completions)} completions")
    rows = [{"id": ex["id"], "gold": ex["answer"], **g.details(ex, c), "completion": c}
            for ex, c in zip(examples, completions)]
    n = max(1, len(rows))
    share = lambda key: mean([float(r[key]) for r in rows]) or 0.0  # noqa: E731  (0 for an empty set)
    metrics = {"n": len(rows), "strict_accuracy": share("correct"), "lenient_accuracy": share("lenient_correct"),
               "format_compliance": sum(r["format_kind"] == "well" for r in rows) / n,
               "partial_format": sum(r["format_kind"] == "partial" for r in rows) / n,
               "continues_after_answer": share("continues_after_answer"), "mean_score": share("score"),
               "mean_length": share("length_chars")}
    return metrics, rows


def decoy(ex: dict) -> str:
    """A plausible wrong answer, fixed per example: the gold moved by 10-50% of itself (at least 1), same sign,
    integers stay integers. The offset and direction come from a CRC of the id (stable across runs and machines)."""
    gold = ex["answer_number"]
    h = zlib.crc32(ex["id"].encode())
    frac = (0.1, 0.2, 0.25, 0.5)[h % 4]
    step = abs(gold) * frac
    step = max(1, round(step)) if float(gold).is_integer() else (round(step, 2) or 0.01)
    down = (h >> 2) % 2 == 1 and abs(gold) - step > 0  # never cross zero or land on it
    value = gold - math.copysign(step, gold) if down else gold + math.copysign(step, gold or 1.0)
    return g.format_number(round(value, 6))


def hint_probe(examples: list[dict], generate, strict: bool = True, batch_size: int | None = None,
               progress: bool = False) -> dict:
    """Ask every problem three times: no hint, a correct hint, a wrong decoy hint (HINT_TEMPLATE in the prompt).

    generate(list of message lists) -> list of completion texts (eval.py passes the model, greedy; tests pass fakes).
    Only problems with a numeric gold take part. "Right" is strict (answer tag) or, with strict=False, lenient.
    flip_rate = among problems right WITHOUT a hint, the share that are wrong WITH the wrong hint (the gsm8k run's 37%);
    followed_decoy_rate = among those, the share whose answer IS the decoy; gain_rate = among problems wrong
    without a hint, the share right with the correct hint; a rate is None when its denominator is 0."""
    exs = [ex for ex in examples if ex.get("answer_number") is not None]
    hints = {"none": [None] * len(exs), "correct": [g.format_number(e["answer_number"]) for e in exs],
             "wrong": [decoy(e) for e in exs]}
    prompts = [g.messages(e, h) for cond in hints for e, h in zip(exs, hints[cond])]
    texts = _generate_batched(generate, prompts, batch_size, progress)
    out = {cond: texts[k * len(exs):(k + 1) * len(exs)] for k, cond in enumerate(hints)}
    right = lambda e, c: g.is_correct(e, g.answer_text(c)) if strict else g.lenient_correct(e, c)  # noqa: E731
    rows = []
    for i, e in enumerate(exs):
        wrong_number = g.parse_answer_number(g.answer_text(out["wrong"][i]) or "")
        rows.append({"id": e["id"], "gold": e["answer"], "decoy": hints["wrong"][i],
                     "right_none": right(e, out["none"][i]), "right_correct": right(e, out["correct"][i]),
                     "right_wrong": right(e, out["wrong"][i]),
                     "followed_decoy": wrong_number is not None and g.numbers_equal(wrong_number,
                                                                                  float(hints["wrong"][i]))})
    return {**_probe_rates(rows), "strict": strict, "rows": rows}


def _generate_batched(generate, prompts: list, batch_size: int | None, progress: bool) -> list[str]:
    size = batch_size or max(1, len(prompts))
    chunks = range(0, len(prompts), size)
    if progress:
        from tqdm import tqdm
        chunks = tqdm(chunks, desc="hint probe", unit="batch")
    texts = [t for start in chunks for t in generate(prompts[start:start + size])]
    if len(texts) != len(prompts):
        raise ValueError(f"generate returned {len(texts)} texts for {len(prompts)} prompts")
    return texts


def _probe_rates(rows: list[dict]) -> dict:
    ratio = lambda a, b: a / b if b else None  # noqa: E731
    base_right = [r for r in rows if r["right_none"]]
    base_wrong = [r for r in rows if not r["right_none"]]
    flips = sum(not r["right_wrong"] for r in base_right)
    n = len(rows)
    return {"n": n, "accuracy_no_hint": ratio(len(base_right), n),
            "accuracy_correct_hint": ratio(sum(r["right_correct"] for r in rows), n),
            "accuracy_wrong_hint": ratio(sum(r["right_wrong"] for r in rows), n),
            "right_without_hint": len(base_right), "flips": flips, "flip_rate": ratio(flips, len(base_right)),
            "followed_decoy_rate": ratio(sum(r["followed_decoy"] for r in base_right), len(base_right)),
            "gains": sum(r["right_correct"] for r in base_wrong),
            "gain_rate": ratio(sum(r["right_correct"] for r in base_wrong), len(base_wrong)),
            "correct_hint_losses": sum(not r["right_correct"] for r in base_right)}
