"""What the red-team files (tests/judge/test_redteam_*.py) share: grading an attack on some criteria of a task, and
reading the verdict."""
from minigrpo.judge.checks import ANSWER_EVIDENCE
from judging import TASKS, fenced


def only(task_id, ids):
    """The task with only the criteria `ids` (a faster grade of the criteria an attack is about), and those they
    count beside (`only_if`), which decide with them."""
    task = dict(TASKS[task_id])
    beside = {(c.get("check") or {}).get("only_if") for c in task["criteria"] if c["id"] in ids}
    task["criteria"] = [c for c in task["criteria"] if c["id"] in set(ids) | beside]
    assert set(ids) <= {c["id"] for c in task["criteria"]}, ids
    return task


def grade(judge, task_id, code, ids):
    verdict = judge.grade(only(task_id, ids), fenced(code))
    assert verdict is not None, "an attack must be graded, not dropped"
    # a criterion only the answer's process could observe is left to an LLM grader: locally it cannot be won
    assert verdict.score is not None or all(r.reason == ANSWER_EVIDENCE for r in verdict.results), explain(verdict)
    return verdict


def no_gain(v, plain):
    return v.score is None or (plain.score is not None and v.score <= plain.score)


def passed(verdict):
    return {r.id: r.passed for r in verdict.results}


def explain(verdict):
    return [(r.id, r.passed, r.reason) for r in verdict.results]


def custom_task(tests, timeout=1.0):
    return {"id": "redteam", "prompt": "write f", "criteria": [
        {"id": f"c{i + 1}", "text": "t", "check": {"type": "python", "test": test, "timeout": timeout}}
        for i, test in enumerate(tests)]}
