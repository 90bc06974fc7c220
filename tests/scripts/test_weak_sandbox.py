"""--task terminal runs an agent's commands only in the full sandbox (bubblewrap, a uid of its own, a cgroup). With
bubblewrap hidden (a PATH without it), train.py and eval.py refuse in one line naming what is missing and how to
install it; --weak-sandbox accepts the weaker sandbox and prints what it lacks, and Episode().weaknesses says so
before any command runs."""
import json
import os
import subprocess
import sys
import textwrap

import pytest

from minigrpo.judge.sandbox import isolation, missing_isolation
from minigrpo.judge.sandbox.episode import Episode

from repo_root import ROOT

TERMINAL = ["--task", "terminal", "--model", "tiny-qwen3.5", "--steps", "1", "--quiet"]


def without_bwrap(argv, tmp_path):
    """Run argv with a PATH holding only this Python's folder: no bwrap (nor unshare, nor mount) to be found."""
    env = {**os.environ, "PATH": os.path.dirname(sys.executable), "OMP_NUM_THREADS": "1", "PYTHONPATH": ROOT}
    return subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)


def test_without_bubblewrap_train_and_eval_refuse_naming_it(tmp_path):
    train = without_bwrap([sys.executable, os.path.join(ROOT, "train.py"), *TERMINAL, "--runs-dir", "runs"],
                          tmp_path)
    assert train.returncode == 2, train.stderr[-3000:]
    line = train.stderr.strip()
    assert line.startswith("train.py: error: --task terminal: the agent's commands run only in the full sandbox, "
                           "and this machine lacks bubblewrap (apt install bubblewrap, or dnf install bubblewrap)")
    assert line.endswith("; install what is missing, or pass --weak-sandbox to accept a weaker one")
    assert "\n" not in line and not os.path.exists(tmp_path / "runs")
    ev = without_bwrap([sys.executable, os.path.join(ROOT, "eval.py"), "--task", "terminal", "--model",
                        "tiny-qwen3.5", "--out", "out"], tmp_path)
    assert ev.returncode == 2 and ev.stderr.strip() == line.replace("train.py", "eval.py", 1)
    assert not os.path.exists(tmp_path / "out")


def test_the_explicit_flag_runs_in_the_weaker_sandbox_and_says_what_it_lacks(tmp_path):
    script = textwrap.dedent(f"""
        import json, train
        from minigrpo.judge.sandbox.episode import Episode
        train.resolve_args({[*TERMINAL, "--weak-sandbox", "--runs-dir", "runs"]!r})
        with Episode({{}}) as ep:
            before = list(ep.weaknesses)
            ran = ep.run("echo hi").output
        print(json.dumps([before, ran]))
    """)
    out = without_bwrap([sys.executable, "-c", script], tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    warning = [ln for ln in out.stderr.splitlines() if ln.startswith("warning: --weak-sandbox")]
    assert len(warning) == 1 and warning[0].startswith(
        "warning: --weak-sandbox: the agent's commands run in a weaker sandbox (process-group")
    assert "no mount namespace: the host filesystem is readable" in warning[0]
    before, ran = json.loads(out.stdout)
    assert any(w.startswith("no mount namespace") for w in before)     # known before any command
    assert ran == "hi\n"


def test_the_flag_is_for_the_terminal_task_only(tmp_path):
    out = subprocess.run([sys.executable, os.path.join(ROOT, "train.py"), "--task", "synthetic", "--weak-sandbox"],
                         cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert out.returncode == 2 and out.stderr.strip() == ("train.py: error: --weak-sandbox: only --task terminal "
                                                          "runs an agent's commands, not --task synthetic")


def test_with_the_full_sandbox_nothing_is_refused_and_an_episode_lacks_nothing():
    if missing_isolation():
        pytest.skip(f"this machine lacks the full sandbox: {missing_isolation()}")
    level, weak = isolation()
    assert level.startswith("bwrap+cgroup-") and level.endswith("+pool-uid")
    with Episode({}) as ep:
        assert ep.weaknesses == weak
