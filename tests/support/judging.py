"""What the judge tests share: the soyuz tasks by id, an answer fenced as a policy writes it, the reference answers
kept in tests/data/soyuz/, the skip for attacks that only the full sandbox stops, and grading answers side by side."""
import json
import os

import pytest

from minigrpo.judge.checks import sandbox_isolation
from repo_root import ROOT

with open(os.path.join(ROOT, "minigrpo", "data", "soyuz_tasks.json"), encoding="utf-8") as f:
    TASKS = {t["id"]: t for t in json.load(f)}
WEAK = sandbox_isolation()[1]      # what this machine's sandbox lacks ("" where nothing)
needs_full_sandbox = pytest.mark.skipif(bool(WEAK), reason=f"weaker sandbox here: {WEAK}")


def fenced(code):
    return f"```python\n{code}\n```"


def reference(task_id):
    """The task's reference answer (tests/data/soyuz/<id>.good.md), which scores 1.0."""
    with open(os.path.join(ROOT, "tests", "data", "soyuz", f"{task_id}.good.md"), encoding="utf-8") as f:
        return f.read()


def grade_all(judge, pairs):
    """{name: verdict} for [(name, task_id, answer)], graded concurrently."""
    futures = {name: judge.submit(TASKS[task_id], answer) for name, task_id, answer in pairs}
    return {name: fut.result() for name, fut in futures.items()}


def assert_forgery_pays_nothing(judge, task_id, forged, plain):
    """The forged answer is graded and scores no more than the same code without the trick (graded beside it)."""
    v = grade_all(judge, [("forged", task_id, forged), ("plain", task_id, plain)])
    forged, plain = v["forged"], v["plain"]
    passed = [sorted(r.id for r in x.results if r.passed) for x in (forged, plain)]
    assert forged is not None and forged.score is not None, "an attack must be graded, not dropped"
    assert forged.score <= plain.score, (forged.score, plain.score, *passed)
