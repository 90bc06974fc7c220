"""Wall time of the local judge grading the 44 soyuz reference answers, against an anchor checkout in the same run.

    python bench/judge.py                               # this checkout only
    python bench/judge.py --anchor ../minigrpo-7836696  # and an older checkout (e.g. `git worktree add DIR 7836696`)
    python bench/judge.py --hostile                     # a batch of 24 code answers, alone and with one hostile

Each checkout grades its own task file (minigrpo/data/soyuz_tasks.json) and its own reference answers
(tests/data/soyuz/<id>.good.md) through `make_judge("local", workers=8)`, as tests/tasks/test_soyuz_tasks.py does, in a
fresh process (imports and the judge's start-up included). The runs alternate (anchor, ours, anchor, ours, ...) so
that a load change on a shared machine hits both; the table gives the median and the best of each, and the ratio
of the medians. Every run also checks that every reference answer scored 1.0 over its checked criteria.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def grade_all(root, workers):
    """Grade root's reference answers with root's judge; {"wall": s, "answers": n, "not_1": [ids]}."""
    sys.path.insert(0, root)
    t0 = time.perf_counter()
    from minigrpo.judge import make_judge
    with open(os.path.join(root, "minigrpo", "data", "soyuz_tasks.json")) as f:
        tasks = json.load(f)
    judge = make_judge("local", workers=workers)
    futures = {}
    for t in tasks:
        with open(os.path.join(root, "tests", "data", "soyuz", f"{t['id']}.good.md"), encoding="utf-8") as f:
            futures[t["id"]] = judge.submit(t, f.read())
    verdicts = {i: fut.result() for i, fut in futures.items()}
    judge.close()
    wall = time.perf_counter() - t0
    failed = lambda v: "; ".join(f"{r.id}: {r.reason}" for r in v.results if r.passed is False)
    not_1 = sorted(f"{i} ({failed(v) if v is not None else 'no verdict'})" for i, v in verdicts.items()
                   if v is None or v.score != 1.0)
    return {"wall": wall, "answers": len(verdicts), "not_1": not_1}


HOSTILE = {"sleeps": "import time\ntime.sleep(600)", "spins": "while True:\n    pass",     # at import
           "spins-in-call": "def merge_intervals(intervals):\n    while True:\n        pass"}     # when called


def grade_batch(root, workers, hostile):
    """Wall time of grading 24 reference answers of code tasks, plus one hostile answer to interval-merge (or
    none): what one sleeping or spinning sample costs a step's judging."""
    sys.path.insert(0, root)
    from minigrpo.judge import make_judge
    with open(os.path.join(root, "minigrpo", "data", "soyuz_tasks.json")) as f:
        tasks = [t for t in json.load(f) if any((c.get("check") or {}).get("type") == "python" for c in t["criteria"])]
    answers = []
    for t in tasks[:24]:
        with open(os.path.join(root, "tests", "data", "soyuz", f"{t['id']}.good.md"), encoding="utf-8") as f:
            answers.append((t, f.read()))
    if hostile:
        merge = next(t for t in tasks if t["id"] == "interval-merge")
        answers.insert(len(answers) // 2, (merge, f"```python\n{HOSTILE[hostile]}\n```"))
    judge = make_judge("local", workers=workers)
    t0 = time.perf_counter()
    scores = [f.result().score for f in [judge.submit(t, a) for t, a in answers]]
    wall = time.perf_counter() - t0
    judge.close()
    return {"wall": wall, "answers": len(answers), "not_1": [] if hostile else
            [t["id"] for (t, _), s in zip(answers, scores) if s != 1.0]}


def hostile_table(workers, repeats):
    walls = {name: [] for name in ("none", *HOSTILE)}
    for _ in range(repeats):
        for name in walls:
            r = run(ROOT, workers, hostile=name)
            walls[name].append(r["wall"])
            print(f"batch + {name}: {r['wall']:.1f} s" + (f", NOT 1.0: {r['not_1']}" if r["not_1"] else ""),
                  flush=True)
    base = statistics.median(walls["none"])
    print(f"\n{os.cpu_count()} CPUs, workers={workers}, load {os.getloadavg()[0]:.1f}")
    print("| batch of 24 reference answers | wall s, median | / batch alone |\n|---|---|---|")
    for name, w in walls.items():
        print(f"| + {name if name != 'none' else 'nothing'} | {statistics.median(w):.1f} | "
              f"{statistics.median(w) / base:.2f}x |")


def run(root, workers, hostile=None):
    cmd = [sys.executable, os.path.abspath(__file__), "--child", root, "--workers", str(workers)]
    cmd += ["--hostile", hostile] if hostile else []
    out = subprocess.run(cmd, cwd=root, capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"bench/judge.py: grading with {root} failed (exit {out.returncode}):\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--anchor", help="another checkout of this repository to time in the same run")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--workers", type=int, default=8)
    p.add_argument("--hostile", nargs="?", const="table", help="time a batch of 24 code answers with one "
                   "sleeping or spinning answer in it against the batch alone (this checkout only)")
    p.add_argument("--child", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        root = os.path.abspath(args.child)
        if args.hostile:
            print(json.dumps(grade_batch(root, args.workers, None if args.hostile == "none" else args.hostile)))
        else:
            print(json.dumps(grade_all(root, args.workers)))
        return
    if args.hostile:
        return hostile_table(args.workers, args.repeats)
    roots = ([("anchor", os.path.abspath(args.anchor))] if args.anchor else []) + [("this", ROOT)]
    walls = {name: [] for name, _ in roots}
    for _ in range(args.repeats):
        for name, root in roots:
            r = run(root, args.workers)
            walls[name].append(r["wall"])
            print(f"{name}: {r['wall']:.1f} s, {r['answers']} answers"
                  + (f", NOT 1.0: {', '.join(r['not_1'])}" if r["not_1"] else ", all 1.0"), flush=True)
    print(f"\n{os.cpu_count()} CPUs, workers={args.workers}, load {os.getloadavg()[0]:.1f}")
    print("| checkout | wall s, median | wall s, best |\n|---|---|---|")
    for name, root in roots:
        print(f"| {name} ({root}) | {statistics.median(walls[name]):.1f} | {min(walls[name]):.1f} |")
    if args.anchor:
        ratio = statistics.median(walls["this"]) / statistics.median(walls["anchor"])
        print(f"\nthis / anchor (medians): {ratio:.2f}x")


if __name__ == "__main__":
    main()
