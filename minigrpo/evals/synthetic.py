"""synthetic: the mean score of the repeat-the-letter task (the smoke test of the whole pipe)."""
import os

from minigrpo.evals import report
from minigrpo.evals.common import complete, load_model, run_curves, write_jsonl, write_outputs
from minigrpo.tasks.synthetic import RepeatCharTask


def eval_synthetic(args, out):
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
