"""gsm8k: strict and lenient accuracy, format compliance, the share that goes on after </answer> and the mean
reward per eval set (GSM8K's held-out 10%, SVAMP and MATH algebra when given); --hint-probe N: the seed's probe
(does a suggested answer in the prompt flip a right answer?). Plots: accuracy bars per set, hint-probe bars."""
import os

from minigrpo import report
from minigrpo.evals.common import UsageError, complete, first_line, load_model, run_curves, write_jsonl, write_outputs
from minigrpo.tasks import gsm8k as g

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
