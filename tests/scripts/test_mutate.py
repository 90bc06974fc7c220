"""scripts/mutate.py finds each mutant's code by search: every `original` must occur exactly once in the package and the
top-level scripts, and every mutant's tests must exist, or `python scripts/mutate.py` stops at that mutant. Code that
moves or changes takes its mutants with it; this test says which ones it left behind."""
import glob
import os
import sys

from repo_root import ROOT

sys.path.insert(0, os.path.join(ROOT, "scripts"))
import mutate  # noqa: E402


def test_every_mutant_finds_its_code_once_and_its_tests():
    sources = {f: open(f, encoding="utf-8").read() for f in mutate.sources(mutate.ROOT)}
    lost = [name for name, original, *_ in mutate.MUTANTS if sum(s.count(original) for s in sources.values()) != 1]
    assert not lost, f"mutants whose code is not found exactly once: {lost}"
    untested = [m[0] for m in mutate.MUTANTS
                if not any(glob.glob(os.path.join(mutate.ROOT, t.split("::")[0])) for t in m[3])]
    assert not untested, f"mutants with no test file: {untested}"
    # a test file that moved would only be skipped: every path named must still find its file
    named = sorted({t for m in mutate.MUTANTS for t in m[3]})
    gone = [t for t in named if not glob.glob(os.path.join(mutate.ROOT, t.split("::")[0]))]
    assert not gone, f"test paths the mutants name that match no file: {gone}"
    assert len({m[0] for m in mutate.MUTANTS}) == len(mutate.MUTANTS), "two mutants share a name"
