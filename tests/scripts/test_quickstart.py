"""The README's first command keeps its promise: `python train.py --task synthetic --model tiny` (the synthetic
preset, from random init) ends with a last-10-step mean reward of 0.9 or more and does not fall back in its last
third. The measurement is bench/synthetic.py's; here at seed 0 on one thread (about a minute idle)."""
import os
import sys

import pytest

from minigrpo.run.presets import PRESETS

from repo_root import ROOT

sys.path.insert(0, os.path.join(ROOT, "bench"))
try:
    import synthetic as quickstart
finally:
    sys.path.pop(0)


def test_last_mean_and_drawdown():
    r = [0.0, 0.5, 1.0, 0.2, 0.9, 0.95]            # last third: steps 5 and 6; the best so far is 1.0 (step 3)
    assert quickstart.last_third_drawdown(r) == pytest.approx(0.1)
    assert quickstart.last_mean(r, n=2) == pytest.approx(0.925)
    assert quickstart.last_third_drawdown([0.1, 0.2, 0.3]) == 0.0     # still rising: no drawdown
    assert quickstart.last_mean([0.5], n=10) == 0.5                   # a run shorter than n: all of it


@pytest.mark.slow
def test_synthetic_quickstart_learns(tmp_path):
    s = quickstart.run_seed(0, str(tmp_path), threads=1)
    assert s["steps"] == PRESETS["synthetic"]["steps"]
    assert s["last10"] >= quickstart.MIN_LAST10, s
    assert s["drawdown"] <= quickstart.MAX_DRAWDOWN, s
