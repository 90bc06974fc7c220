"""soyuz: the soyuz run's metrics over one 2-turn rollout (answer -> critique -> revision) per task and sample -- reward
(the final answer's judge score), turn-0 score, recovery, bad->good, good->bad -- a per-family and a per-task
table, and the soyuz run's sandbagging check (recovery bought with a worse first answer)."""
import os
from dataclasses import replace

from minigrpo.metrics import mean
from minigrpo.seeds import derive_seed
from minigrpo.evals import report
from minigrpo.evals.common import UsageError, first_line, load_model, progress, run_curves, write_jsonl, write_outputs
from minigrpo.judge import validate_task
from minigrpo.sampler import Settings, sample
from minigrpo.tasks.soyuz import SoyuzTask, recovery_metrics


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
    task, exs = soyuz_data(args)
    model, tok, columns = load_model(args)
    seeds = [derive_seed(args.sample_seed, "soyuz eval", i) for i in range(len(exs))]
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
                  "finish": s.finish_reason, "completion": s.text, **s.info} for s in seqs]
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
    notes = report_notes(results, task.left_out)
    judge = task.judge.stats()
    task.judge.close()
    write_outputs(args, out, {"results": results, "per_task": per_task, "by_family": by_family, "judge": judge},
                  tables, plots, notes)
    return {"results": results, "per_task": per_task}


def soyuz_generate(model, tok, args, bar):
    """The `generate(prompts, seeds, n, reuse, keep)` the rollouts call: n samples per token-id prompt, as
    train.py's."""
    settings = Settings(n=1, max_new_tokens=args.max_new_tokens, temperature=args.temperature, top_p=args.top_p,
                        compile=args.compile)

    def generate(prompts, seeds, n, reuse=None, keep=False):
        samples = sample(model, prompts, replace(settings, n=n), tokenizer=tok, seed=list(seeds))
        bar.update(len(samples))
        return [samples[i * n:(i + 1) * n] for i in range(len(prompts))]
    return generate


def task_scores(seqs) -> dict:
    """{task id: {"turn0": mean s0, "final": mean s1}} over the task's rollouts (failed judgments left out)."""
    out = {}
    for s in seqs:
        if s.score is not None:
            out.setdefault(s.example_id, {}).setdefault(("turn0", "final")[s.turn], []).append(s.score)
    return {t: {k: mean(v) for k, v in d.items()} for t, d in out.items()}


def improved(base: dict, adapter: dict, tol: float = 1e-9) -> tuple:
    both = [t for t in base if t in adapter and "final" in base[t] and "final" in adapter[t]]
    up = sum(adapter[t]["final"] > base[t]["final"] + tol for t in both)
    return up, sum(adapter[t]["final"] < base[t]["final"] - tol for t in both)


def family_scores(scores: dict, families: dict) -> dict:
    out = {}
    for t, d in scores.items():
        out.setdefault(families.get(t, ""), []).append(d)
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


def report_notes(results: dict, left_out: list) -> list:
    """The report's notes: the metrics explained, the sandbagging check, and the tasks the local judge left out
    (a reader comparing with an LLM-judged run must know the task sets differ)."""
    return SOYUZ_NOTES + sandbagging_note(results) + [f"- {line}" for line in left_out]


def sandbagging_note(results: dict) -> list:
    """The soyuz run's guard: recovery going up while the first answer gets worse is the model being paid for the
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
