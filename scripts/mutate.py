"""Mutation check of the core: does the test suite catch one-line bugs in grpo.py, logprobs.py, sampler.py, lora.py
and the update path of train.py? Not a test module (pytest collects test_*.py only); run it by hand:

    python scripts/mutate.py                      # every mutant, one at a time
    python scripts/mutate.py --only kl_k3_to_k1   # some of them (names, comma-separated)
    python scripts/mutate.py --list               # names and what each changes, nothing run
    python scripts/mutate.py --jobs 2 --timeout 900

For each mutant the repository (working tree, without .git, runs and virtualenvs) is copied to a temporary
folder, ONE snippet is replaced there, and the mutant's test files run in that copy with `pytest -x`. A failing
run = caught; a passing one = survived. A mutant is written as (name, original, replacement, tests): `original`
is an exact piece of code that must occur exactly once in minigrpo/**/*.py and the top-level scripts (it may carry
a line of context around the changed line, to be unique); it is found by search, not by file and line, so the
list survives files being moved or split. `tests` are globs or pytest node ids under tests/ (missing ones are
skipped; none found at all is an error). Survivors judged equivalent are listed in EQUIVALENT with the reason.
"""
import argparse
import concurrent.futures as cf
import glob
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SKIP_DIRS = {".git", "runs", "__pycache__", ".pytest_cache", "node_modules"}

# test sets, fastest-failing first (pytest -x stops at the first failure)
GOLDEN = ["tests/scripts/test_golden_lora.py", "tests/scripts/test_train.py::test_golden_tiny_run"]
GRPO = ["tests/core/test_grpo.py", "tests/core/test_losses.py", "tests/scripts/test_train_loss_flags.py",
        "tests/scripts/test_train_mask_truncated.py", *GOLDEN]
LOGPROBS = ["tests/core/test_logprobs.py", "tests/model/test_logprobs_qwen.py", *GRPO]
SAMPLER = ["tests/model/test_sampler.py", "tests/model/test_sampler_*.py", *GOLDEN]
LORA = ["tests/model/test_lora.py", "tests/model/test_lora_*.py", *GOLDEN]
TRAIN = [*GOLDEN, "tests/scripts/test_train_mask_truncated.py", "tests/tasks/test_soyuz_rollout.py",
         "tests/tasks/test_episodes.py"]
LOSSES = ["tests/core/test_losses.py", "tests/scripts/test_train_loss_flags.py",
          "tests/core/test_grpo.py::test_micro_batch_invariance"]
SOYUZ = ["tests/tasks/test_soyuz_rollout.py", "tests/tasks/test_revise.py", "tests/tasks/test_episodes.py",
         "tests/core/test_grpo.py"]
JUDGE = ["tests/judge/test_boundary.py", "tests/judge/test_suites.py", "tests/judge/test_attacks.py",
         "tests/judge/test_hostile_code.py"]

# The mutants: scripts/mutants.json, one entry each: name, section (what part of the code), original (the code, found
# exactly once), replacement (the one-line bug), tests (a group above, by name, or a list of test paths).
with open(os.path.join(ROOT, "scripts", "mutants.json"), encoding="utf-8") as _f:
    MUTANTS = [(m["name"], m["original"], m["replacement"], globals()[m["tests"]] if isinstance(m["tests"], str)
                else m["tests"]) for m in json.load(_f)]

# Survivors judged equivalent (no behaviour change a test could see), with the reason.
EQUIVALENT = {
    "inverse_cdf_left": "searchsorted left vs right differ only when x = u * total equals a cdf value exactly; u "
                        "lies on a 2^-53 grid, so that happens with probability ~2^-53 per draw, and then both "
                        "picks are tokens with p > 0 (except u = 0 before a leading zero-probability id)",
}


def sources(root):
    """The files a snippet is searched in: the package and the top-level scripts."""
    files = glob.glob(os.path.join(root, "minigrpo", "**", "*.py"), recursive=True)
    return sorted(files + glob.glob(os.path.join(root, "*.py")))


def locate(root, original):
    hits = [(f, open(f, encoding="utf-8").read().count(original)) for f in sources(root)]
    hits = [(f, n) for f, n in hits if n]
    if sum(n for _, n in hits) != 1:
        where = ", ".join(f"{os.path.relpath(f, root)} x{n}" for f, n in hits) or "nowhere"
        raise LookupError(f"snippet found {sum(n for _, n in hits)} times ({where}): {original[:70]!r}")
    return hits[0][0]


def test_args(root, patterns):
    out = []
    for pat in patterns:
        path, _, node = pat.partition("::")
        found = sorted(glob.glob(os.path.join(root, path)))
        out += [os.path.relpath(f, root) + (f"::{node}" if node else "") for f in found]
    return list(dict.fromkeys(out))


def copy_tree(dst):
    def ignore(folder, names):
        return [n for n in names if n in SKIP_DIRS or n.startswith(".venv") or n.endswith(".pyc")]
    shutil.copytree(ROOT, dst, ignore=ignore, symlinks=True)


def run_one(mutant, timeout):
    name, original, replacement, tests = mutant
    t0 = time.time()
    with tempfile.TemporaryDirectory(prefix=f"mutant-{name}-") as tmp:
        root = os.path.join(tmp, "repo")
        copy_tree(root)
        try:
            path = locate(root, original)
        except LookupError as e:
            return name, "not found", str(e), 0.0
        with open(path, encoding="utf-8") as f:
            text = f.read()
        with open(path, "w", encoding="utf-8") as f:
            f.write(text.replace(original, replacement))
        files = test_args(root, tests)
        if not files:
            return name, "no tests", f"none of {tests} exists", 0.0
        env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONDONTWRITEBYTECODE": "1"}
        cmd = [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", *files]
        try:
            out = subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            return name, "timeout", f"over {timeout}s ({os.path.relpath(path, root)})", time.time() - t0
        tail = [ln for ln in out.stdout.splitlines() if ln.startswith(("FAILED", "ERROR"))][:1]
        if out.returncode == 0:
            status = "equivalent" if name in EQUIVALENT else "SURVIVED"
            detail = EQUIVALENT.get(name, f"{os.path.relpath(path, root)}: {' '.join(files)}")
        elif out.returncode in (1, 2):
            status, detail = "caught", (tail[0] if tail else out.stdout.strip().splitlines()[-1])[:110]
        else:
            status, detail = f"error rc={out.returncode}", (out.stdout + out.stderr)[-300:]
        return name, status, detail, time.time() - t0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--only", help="comma-separated mutant names")
    ap.add_argument("--list", action="store_true")
    ap.add_argument("--jobs", type=int, default=1)
    ap.add_argument("--timeout", type=int, default=900, help="seconds per mutant")
    args = ap.parse_args()
    names = [m[0] for m in MUTANTS]
    assert len(names) == len(set(names)), "mutant names must be unique"
    chosen = MUTANTS
    if args.only:
        want = args.only.split(",")
        unknown = [w for w in want if w not in names]
        if unknown:
            raise SystemExit(f"mutate.py: unknown mutants {unknown}; --list shows them")
        chosen = [m for m in MUTANTS if m[0] in want]
    if args.list:
        for name, original, replacement, _ in chosen:
            where = locate(ROOT, original)
            print(f"{name:40s} {os.path.relpath(where, ROOT)}: {original.strip()[:60]!r} -> {replacement.strip()[:60]!r}")
        return
    results = []
    with cf.ThreadPoolExecutor(args.jobs) as pool:
        for name, status, detail, secs in pool.map(lambda m: run_one(m, args.timeout), chosen):
            print(f"{status:12s} {name:40s} {secs:6.0f}s  {detail}", flush=True)
            results.append((name, status))
    counts = {}
    for _, status in results:
        counts[status] = counts.get(status, 0) + 1
    print(f"\n{len(results)} mutants: " + ", ".join(f"{n} {s}" for s, n in sorted(counts.items())))
    survivors = [n for n, s in results if s not in ("caught", "equivalent")]
    if survivors:
        print("not caught: " + ", ".join(survivors))
        raise SystemExit(1)


if __name__ == "__main__":
    main()
