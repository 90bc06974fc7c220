"""The synthetic quickstart's promise, measured: `python train.py --task synthetic --model tiny` at several seeds,
each timed, with two numbers read from its runs/<name>/metrics.jsonl (the quickstart's bar).

    python bench/synthetic.py                          # seeds 0 1 2, one after another, torch's default threads
    python bench/synthetic.py --seeds 0 1 2 3 --threads 1
    python bench/synthetic.py --read runs/synthetic-20250101-120000 [...]   # only read finished runs

- last10: the mean over the last 10 steps of the step's mean reward (`reward_mean`); the quickstart must end
  at 0.9 or more.
- drawdown: how far the step's mean reward falls below its running best (the best step so far, from step 1),
  at worst, over the last third of the run; at most 0.1, or the run learned and then lost part of it.
- wall: seconds of the whole command (start-up, every step, checkpoints), as a user waits for it.

Each run's folder keeps what the command printed (output.txt: its start line, then the epoch table and the
first/last reward).

The machine's load (os.getloadavg) is printed beside the times: other processes slow a run down.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MIN_LAST10, MAX_DRAWDOWN = 0.9, 0.1      # the quickstart's bar: learned, and kept


def rewards(run_dir) -> list[float]:
    """Each step's mean reward; with --dynamic-sampling the mean score of everything the step drew (its
    reward_mean covers only the kept groups, whose scores all spread, and is None when none was kept)."""
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        rows = [json.loads(ln) for ln in f if ln.strip()]
    return [r["dynamic_drawn_score"] if "dynamic_drawn_score" in r else r["reward_mean"] for r in rows]


def last_mean(r, n=10) -> float:
    return sum(r[-n:]) / len(r[-n:])


def last_third_drawdown(r) -> float:
    """max over the last third's steps of (best step so far - this step); the best counts from step 1."""
    start, best, worst = len(r) - len(r) // 3, float("-inf"), 0.0
    for i, x in enumerate(r):
        best = max(best, x)
        if i >= start:
            worst = max(worst, best - x)
    return worst


def summary(run_dir) -> dict:
    r = rewards(run_dir)
    out = {"steps": len(r), "last10": last_mean(r), "drawdown": last_third_drawdown(r)}
    out["ok"] = out["last10"] >= MIN_LAST10 and out["drawdown"] <= MAX_DRAWDOWN
    return out


def run_seed(seed, runs_dir, threads=None, extra=()) -> dict:
    """The quickstart command at one seed; its summary with the wall time and the load before it started."""
    env = dict(os.environ)
    if threads:
        env["OMP_NUM_THREADS"] = str(threads)
    name = f"synthetic-seed{seed}"
    cmd = [sys.executable, "train.py", "--task", "synthetic", "--model", "tiny", "--seed", str(seed),
           "--runs-dir", runs_dir, "--run-name", name, "--quiet", *extra]
    load = os.getloadavg()[0]
    t = time.perf_counter()
    out = subprocess.run(cmd, cwd=ROOT, env=env, check=True, capture_output=True, text=True)
    with open(os.path.join(runs_dir, name, "output.txt"), "w") as f:    # what the command printed
        f.write(out.stderr + out.stdout)
    return {"seed": seed, **summary(os.path.join(runs_dir, name)), "wall_s": time.perf_counter() - t,
            "load": load}


def row(label, s) -> str:
    timing = f" | {s['wall_s']:.1f} s | {s['load']:.2f}" if "wall_s" in s else " | | "
    return (f"| {label} | {s['steps']} | {s['last10']:.3f} | {s['drawdown']:.3f}{timing} | "
            f"{'yes' if s['ok'] else 'NO'} |")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--threads", type=int, help="OMP_NUM_THREADS for the runs (default: torch's own choice)")
    p.add_argument("--runs-dir", help="keep the runs here (default: a temporary folder)")
    p.add_argument("--read", nargs="+", metavar="RUN_DIR", help="summarise finished runs; run nothing")
    args, extra = p.parse_known_args(argv)    # anything else goes to train.py (e.g. --steps 60)
    print("| run | steps | last-10 mean | last-third drawdown | wall | load (1 min) | ok |")
    print("|---|---|---|---|---|---|---|")
    results = []
    if args.read:
        for d in args.read:
            results.append(summary(d))
            print(row(os.path.basename(os.path.normpath(d)), results[-1]), flush=True)
    else:
        with tempfile.TemporaryDirectory(prefix="minigrpo-synthetic-") as tmp:
            for seed in args.seeds:
                results.append(run_seed(seed, args.runs_dir or tmp, args.threads, extra))
                print(row(f"seed {seed}", results[-1]), flush=True)
    print(f"(ok: last-10 mean >= {MIN_LAST10} and last-third drawdown <= {MAX_DRAWDOWN}; "
          f"threads: {args.threads or 'default'}; cpus: {os.cpu_count()})")
    return 0 if all(s["ok"] for s in results) else 1


if __name__ == "__main__":
    sys.exit(main())
