"""Honest answers pass on any host: the checkout and its virtualenv inside a 0700 folder (as /root is on many GPU
hosts), the judge running as root. The sandbox user must still import what the judge's Python imports (numpy,
click, pytest), or the reference answers of the tasks that use them would fail as if they were wrong."""

import json
import os
import shutil
import subprocess
import sys
import sysconfig

import pytest

from minigrpo.judge.checks import sandbox_isolation

from repo_root import ROOT

TASKS = ["numpy-pairwise-distances", "click-wordfreq-cli", "pytest-slugify-tests", "semver-compare"]

GRADE = """
import json, sys
from minigrpo.judge import make_judge
tasks = {t["id"]: t for t in json.load(open("minigrpo/data/soyuz_tasks.json"))}
judge = make_judge("local", workers=2)
out = {}
for tid in sys.argv[1:]:
    v = judge.grade(tasks[tid], open(f"tests/data/soyuz/{tid}.good.md").read())
    out[tid] = [v.score, [(r.id, r.reason) for r in v.results if r.passed is not True]]
print(json.dumps(out))
"""


def _copy(src, dst):
    try:
        shutil.copytree(src, dst, copy_function=os.link)
    except OSError:
        shutil.rmtree(dst, ignore_errors=True)
        shutil.copytree(src, dst)


@pytest.mark.slow
@pytest.mark.skipif(os.geteuid() != 0, reason="the layout is root's: a 0700 home other users cannot enter")
@pytest.mark.skipif(bool(sandbox_isolation()[1]), reason=f"weaker sandbox here: {sandbox_isolation()[1]}")
def test_reference_answers_pass_from_a_0700_checkout_and_venv(tmp_path):
    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    repo, venv = home / "repo", home / "venv"
    repo.mkdir()
    for part in ("minigrpo", os.path.join("tests", "data", "soyuz")):
        _copy(os.path.join(ROOT, part), repo / part)
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    site = subprocess.run([str(venv / "bin" / "python"), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    ours = sysconfig.get_paths()["purelib"]
    for name in os.listdir(ours):    # the judge's run-time packages, into the private venv
        if name.split("-")[0].split(".")[0].lower() in {"numpy", "click", "pytest", "_pytest", "pluggy", "iniconfig",
                                                       "packaging", "pygments", "regex", "py"}:
            src = os.path.join(ours, name)
            (_copy(src, os.path.join(site, name)) if os.path.isdir(src) else shutil.copy(src, site))
    os.chmod(home, 0o700)
    run = subprocess.run([str(venv / "bin" / "python"), "-c", GRADE, *TASKS], cwd=repo, capture_output=True, text=True,
                         timeout=600, env={"PATH": os.environ["PATH"], "PYTHONPATH": str(repo)})
    assert run.returncode == 0, run.stderr[-2000:]
    scores = json.loads(run.stdout.strip().splitlines()[-1])
    assert {tid: s for tid, (s, _) in scores.items()} == {tid: 1.0 for tid in TASKS}, scores
