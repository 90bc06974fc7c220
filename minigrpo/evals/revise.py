"""revise: the revise experiment's metrics (final score = reward, turn-0 score, recovery, bad->good, good->bad,
bad-start share) over its held-out eval prompts, each rolled out through the training's two-turn rollout (answer ->
critique -> revision) --group-size times. The rollout and its seeds are the experiment's own
(revise_pipeline.evaluate): `--temperature 1 --group-size 4 --seed N` on a policy the experiment saved (seed<N>-base,
or an arm's run folder) gives the experiment's numbers for it."""
import argparse
import os

from minigrpo.evals import report
from minigrpo.evals.common import load_model, run_curves, write_jsonl, write_outputs
from minigrpo.evals.report import REVISE_METRICS
from minigrpo.experiments.revise_pipeline import evaluate
from minigrpo.tasks.revise import RevisionTask


def eval_revise(args, out):
    task = RevisionTask()
    n = len(task.examples("eval"))
    cfg = argparse.Namespace(eval_split="eval", eval_limit=args.limit or n, eval_samples=args.group_size)
    model, tok, columns = load_model(args)
    results, rows = {}, []
    for label, ctx in columns:
        with ctx():
            m = evaluate(model, tok, task, args, cfg, args.seed, temperature=args.temperature, top_p=args.top_p)
        rows += [{"model": label, "rollout": i, "turn0_score": a, "final_score": b} for i, (a, b) in
                 enumerate(m.pop("pairs"))]
        results[label] = {"revise": m}
    write_jsonl(rows, os.path.join(out, "examples.jsonl"))
    tables = [("Revise (answer -> critique -> revision)",
               report.compare_table(results, [key for _, key in REVISE_METRICS]))]
    notes = [f"- {min(cfg.eval_limit, n)} held-out prompts x {args.group_size} rollouts, seed {args.seed}"] + \
            [f"- **{key}**: {label}" for label, key in REVISE_METRICS]
    write_outputs(args, out, {"results": results}, tables, run_curves(args, out), notes)
    return {"results": results}
