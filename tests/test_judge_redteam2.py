"""A second red team against the local judge: answers that score more than the same code without the trick. Each
test asserts the secure behaviour, so it FAILS while the attack works; each is marked xfail(strict=True) until the
judge (or the task's test) is fixed, when the strict xfail turns into a failure that says to drop the mark.

Groups:
  shared inputs   a test hands the answer a list and later computes what it expects from that same list: the
                  answer rewrites its argument (reference semantics, as in one process) to fit its own output
  untimed setup   a performance criterion times only its last snippet; a snippet beside the answer that set the
                  data up ran untimed, and the answer did its slow work there
  static          ast criteria that pay code doing what they ban, or not doing what they require
"""

import json
import os

import pytest

from minigrpo.judge import make_judge
from minigrpo.judge.checks import run_check

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
with open(os.path.join(ROOT, "minigrpo", "data", "soyuz_tasks.json")) as f:
    TASKS = {t["id"]: t for t in json.load(f)}


@pytest.fixture(scope="module")
def judge():
    j = make_judge("local", workers=2)
    yield j
    j.close()


def fenced(code):
    return f"```python\n{code}\n```"


def only(task_id, ids):
    task = dict(TASKS[task_id])
    task["criteria"] = [c for c in task["criteria"] if c["id"] in ids]
    assert [c["id"] for c in task["criteria"]] == list(ids)
    return task


def grade(judge, task_id, code, ids):
    verdict = judge.grade(only(task_id, ids), fenced(code))
    assert verdict is not None
    return {r.id: r.passed for r in verdict.results}


def criterion_check(task_id, cid):
    return next(c["check"] for c in TASKS[task_id]["criteria"] if c["id"] == cid)


# =================================================================================================================
# Shared inputs: the answer rewrites the list the test computes its expectation from
# =================================================================================================================

COMPLETION_ORDER = '''
import asyncio


async def fetch_all(urls, fetch, limit=10, timeout=None):
    if limit < 1:
        raise ValueError("limit must be at least 1")
    sem = asyncio.Semaphore(limit)
    done = []                                   # (url, result) in the order they finish

    async def one(u):
        async with sem:
            try:
                r = await (fetch(u) if timeout is None else asyncio.wait_for(fetch(u), timeout))
            except Exception as e:
                r = e
            done.append((u, r))

    await asyncio.gather(*(one(u) for u in urls))
    TRICK
    return [r for _, r in done]                 # completion order, not input order
'''


@pytest.mark.xfail(strict=True, reason="asyncio-bounded-fetch c1-c3 compute the expected values from `urls` after "
                                       "handing that list to the answer, which reorders it to its completion order")
def test_reordering_the_input_does_not_pass_the_input_order_criterion(judge):
    """asyncio-bounded-fetch c1 ("Returns results in input order"), c2 and c3: `urls` crosses as a shared list, so
    the answer's `urls[:] = ...` reaches the driver's copy, and `[value(u) for u in urls]` is then in the answer's
    order. The whole task: 6/10 without the line, 9/10 with it."""
    ids = ["c1", "c2", "c3"]
    plain = grade(judge, "asyncio-bounded-fetch", COMPLETION_ORDER.replace("TRICK", "pass"), ids)
    assert plain == {"c1": False, "c2": False, "c3": False}, plain       # completion order fails all three
    v = grade(judge, "asyncio-bounded-fetch", COMPLETION_ORDER.replace("TRICK", "urls[:] = [u for u, _ in done]"),
              ids)
    assert v == plain, v
