"""terminal: the shell exercises (minigrpo/tasks/terminal/) held out of training, each rolled out --group-size times
through the training's multi-turn loop: the share solved (verifier score 1), the mean score, turns, shell calls,
malformed calls and commands that timed out per episode, and with --adapter the adapter's solved share minus the
base's with a paired bootstrap interval over the episodes (the same exercise and seed in both columns). Any adapter
goes: one trained on another task (soyuz) measures what that training did to shell work."""
import argparse
import os

from minigrpo.seeds import derive_seed
from minigrpo.evals import report
from minigrpo.evals.common import load_model, progress, run_curves, write_jsonl, write_outputs
from minigrpo.evals.soyuz import soyuz_generate
from minigrpo.tasks.terminal.task import TerminalTask, agent_metrics

TERMINAL_METRICS = ["episodes", "solved", "score", "turns", "tool_calls", "tool_errors", "timeouts", "turn_cap"]
NOTES = ["- **solved**: share of episodes the verifier scored 1; **score**: mean verifier score",
         "- **turns**: policy turns per episode (the cap is 8); **tool_calls**, **tool_errors** (malformed or refused "
         "calls), **timeouts** (commands killed at a limit): per episode; **turn_cap**: share that hit the cap"]


def eval_terminal(args, out):
    task = TerminalTask(max_new_tokens=args.max_new_tokens)     # episodes held to the training plan's length
    exs = task.examples("eval")[:args.limit]
    model, tok, columns = load_model(args)
    seeds = [derive_seed(args.sample_seed, "terminal eval", i) for i in range(len(exs))]
    loop = argparse.Namespace(group_size=args.group_size, enable_thinking=args.enable_thinking)
    results, solved, rows = {}, {}, []
    for label, ctx in columns:
        bar = progress(None, f"{label} terminal", args, total=len(exs) * args.group_size * task.max_turns)
        with ctx():
            seqs = task.rollout(soyuz_generate(model, tok, args, bar), tok, exs, seeds, loop)
        bar.close()
        solved[label] = [float(s.score == 1.0) for s in seqs]      # one Seq per episode, in a fixed order
        results[label] = {"terminal": {"episodes": len(seqs), **agent_metrics(seqs)}}
        rows += [{"model": label, "exercise": s.example_id, "episode": k % args.group_size, "score": s.score,
                  "completion": s.text, **s.info} for k, s in enumerate(seqs)]
    tables = [("Terminal exercises (held out)", report.compare_table(results, TERMINAL_METRICS))]
    notes = list(NOTES) + [f"- {line}" for line in task.left_out]
    if len(columns) > 1:
        diff, lo, hi = report.paired_bootstrap(solved["adapter"], solved["base"])
        results["adapter"]["terminal"]["solved_minus_base"] = [diff, lo, hi]
        notes.append(f"- adapter - base, solved: {diff:+.1f} points, 95% paired bootstrap interval "
                     f"[{lo:+.1f}, {hi:+.1f}] over {len(solved['base'])} episodes")
    write_jsonl(rows, os.path.join(out, "examples.jsonl"))
    write_outputs(args, out, {"results": results}, tables, run_curves(args, out), notes)
    return {"results": results}
