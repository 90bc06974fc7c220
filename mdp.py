"""The oracle-process verifier MDP from the command line (the library is minigrpo/tasks/mdp/world.py).

    python mdp.py baselines                    # random / minimax / max-split / oracle on the eval records, in seconds
    python mdp.py baselines --out runs/mdp     # ... and write the report tables (Markdown, CSV) and the plot
    python mdp.py baselines --planner          # ... and the Bayes-optimal target-blind planner (minutes)
    python mdp.py show --split train -n 2      # print a few state prompts with their letter values
    python mdp.py stats                        # records and informative states per split

Training the policies (SFT, process-DPO, GRPO, controls) goes through `python train.py --task mdp`.
"""
import argparse
import sys
import time

from minigrpo.evals import report
from minigrpo.run.parsing import DefaultsShown
from minigrpo.tasks.mdp import world as mdp
from minigrpo.tasks.mdp.planner import planner_policy
from minigrpo.tasks.mdp.task import MDPTask


def cmd_baselines(args):
    t0 = time.time()
    records = mdp.build_records(args.split, args.per_cell, args.seed)
    results = mdp.baselines(records)
    if args.planner:   # the ceiling without the target (tasks/mdp/planner.py): between heuristics and oracle
        oracle = results.pop("oracle")
        results.update(planner=mdp.evaluate(planner_policy, records), oracle=oracle)
    tables = (*report.mdp_tables(results), report.mdp_choice_table(results))
    print(f"{len(records)} {args.split} records ({args.per_cell} per regime x library size), seed {args.seed}\n")
    print("\n\n".join(report.mdp_markdown_table(header, rows) for header, rows in tables))
    if args.out:
        for path in report.write_mdp_report(results, args.out).values():
            print("wrote", path)
    print(f"\n{time.time() - t0:.1f}s")


def cmd_show(args):
    task = MDPTask(seed=args.seed, scramble=args.scramble, **{f"{args.split}_per_cell": args.per_cell})
    for ex in task.examples(args.split)[: args.n]:
        text = task.text(ex)
        values = " ".join(f"{c}={v:.3f}" for c, v in zip(mdp.LETTERS, ex["values"]))
        print(f"--- {ex['id']}  ({len(text.encode())} bytes)\n{text}\n>>> oracle {ex['oracle']}   {values}\n")


def cmd_stats(args):
    task = MDPTask(seed=args.seed)
    for split in ("train", "val", "eval"):
        recs, exs = task.records(split), task.examples(split)
        sizes = [len(task.text(ex).encode()) for ex in exs]
        print(f"{split:5s} records {len(recs):4d}  informative states {len(exs):5d}  "
              f"prompt bytes mean {sum(sizes) / len(sizes):.0f} max {max(sizes)}")


def main(argv=None):
    ap = argparse.ArgumentParser(description="verifier MDP: baselines, example states, dataset stats",
                                 formatter_class=DefaultsShown)
    sub = ap.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("baselines", help="random / minimax / max-split / oracle at budgets 0-3",
                       formatter_class=DefaultsShown)
    b.add_argument("--split", default="eval", choices=["train", "val", "eval"])
    b.add_argument("--per-cell", type=int, default=16, help="records per (regime, library size) cell")
    b.add_argument("--out", default=None,
                   help="folder for the report tables and plot (default: none, the tables are printed alone)")
    b.add_argument("--planner", action="store_true",
                   help="add the Bayes-optimal target-blind planner (about a second per record)")
    s = sub.add_parser("show", help="print state prompts and their letter values",
                       formatter_class=DefaultsShown)
    s.add_argument("--split", default="train", choices=["train", "val", "eval"])
    s.add_argument("--per-cell", type=int, default=2)
    s.add_argument("-n", type=int, default=3, help="states to print")
    s.add_argument("--scramble", action="store_true", help="shuffle the split summaries across letters (control)")
    st = sub.add_parser("stats", help="records and informative states per split (task defaults)",
                        formatter_class=DefaultsShown)
    for p in (b, s, st):
        p.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    if getattr(args, "per_cell", 1) < 1:
        ap.exit(2, "mdp.py: --per-cell must be at least 1\n")
    {"baselines": cmd_baselines, "show": cmd_show, "stats": cmd_stats}[args.cmd](args)


if __name__ == "__main__":
    sys.exit(main())
