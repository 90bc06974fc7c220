"""A second red team against the local judge: answers that score more than the same code without the trick. Each
test asserts the secure behaviour, so it FAILS while the attack works; each is marked `works(reason)` (a strict
xfail on AssertionError) until the judge or the task's test is fixed, when it turns into a failure that says to
drop the mark. A baseline that does not behave as the test needs (the plain answer must fail) is a real failure
(pytest.fail), not an expected one.

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
    if verdict is None:
        pytest.fail("an attack must be graded, not dropped")
    return {r.id: r.passed for r in verdict.results}


def works(reason):
    """The mark of an attack that works today: its assertion of the secure behaviour fails."""
    return pytest.mark.xfail(strict=True, raises=AssertionError, reason=reason)


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


@works("asyncio-bounded-fetch c1-c3 compute the expected values from `urls` after handing that list to the "
       "answer, which reorders it to its completion order")
def test_reordering_the_input_does_not_pass_the_input_order_criterion(judge):
    """asyncio-bounded-fetch c1 ("Returns results in input order"), c2 and c3: `urls` crosses as a shared list, so
    the answer's `urls[:] = ...` reaches the driver's copy, and `[value(u) for u in urls]` is then in the answer's
    order. The whole task: 6/10 without the line, 9/10 with it."""
    ids = ["c1", "c2", "c3"]
    plain = grade(judge, "asyncio-bounded-fetch", COMPLETION_ORDER.replace("TRICK", "pass"), ids)
    if plain != {"c1": False, "c2": False, "c3": False}:                 # completion order fails all three
        pytest.fail(f"the baseline should fail: {plain}")
    v = grade(judge, "asyncio-bounded-fetch", COMPLETION_ORDER.replace("TRICK", "urls[:] = [u for u, _ in done]"),
              ids)
    assert v == plain, v


# =================================================================================================================
# Untimed setup: the slow work is done while a snippet beside the answer sets the data up
# =================================================================================================================

SCAN_DIJKSTRA = '''
import heapq
import math


def _scan(graph, source):
    """Dijkstra that scans the whole frontier for its minimum: O(V^2)."""
    dist, prev, frontier, done = {source: 0.0}, {}, {source: 0.0}, set()
    while frontier:
        u = min(frontier, key=frontier.get)
        d = frontier.pop(u)
        done.add(u)
        for v, w in graph.get(u, {}).items():
            if v not in done and d + w < dist.get(v, math.inf):
                dist[v], prev[v], frontier[v] = d + w, u, d + w
    return dist, prev


def _path(dist, prev, source, target):
    if target not in dist:
        return math.inf, []
    path = [target]
    while path[-1] != source:
        path.append(prev[path[-1]])
    return dist[target], path[::-1]


def shortest_path(graph, source, target):
    nodes = set(graph) | {v for u in graph for v in graph[u]}
    if source not in nodes or target not in nodes:
        raise KeyError(source if source not in nodes else target)
    if any(w < 0 for u in graph for w in graph[u].values()):
        raise ValueError("negative weight")
    heap = [(0.0, source)]                  # (the heap is only for show)
    heapq.heappush(heap, (0.0, source))
    heapq.heappop(heap)
    CACHED
    dist, prev = _scan(graph, source)
    return _path(dist, prev, source, target)
'''
SOLVE_AT_SETUP = '''
import builtins as _b
_real_exec, _cache = _b.exec, {}


def _exec(code, scope=None, *args, **kwargs):
    out = _real_exec(code, scope, *args, **kwargs)
    box = scope.get("result") if isinstance(scope, dict) else None
    g = getattr(box, "g", None)
    if isinstance(g, dict) and 0 in g:     # a graph was just set up beside us, untimed: solve it now
        _cache[id(g)] = _scan(g, 0)
    return out


_b.exec = _exec
'''


@works("dijkstra c10 starts its CPU clock after the snippet that builds the graph beside the answer: an exec "
       "hook of the answer solves the graph there, untimed")
def test_slow_work_done_while_the_data_is_set_up_is_still_timed(judge):
    """dijkstra c10 builds its 10k-node graph in the answer's process (a Box snippet), then times only
    `shortest_path(box.g, 0, n)`. The answer's module replaces builtins.exec (the child runs every snippet with
    it), so after the setup snippet it runs its O(V^2) frontier scan on `result.g` and caches the answer; the timed
    call returns it at once. The same shape (an untimed Box snippet, then one timed call) is in topological-sort
    c10 and vectorize-loop-fix c8."""
    cached = ("if id(graph) in _cache and source == 0:\n"
              "        return _path(*_cache[id(graph)], source, target)")
    plain = grade(judge, "dijkstra", SCAN_DIJKSTRA.replace("CACHED", "pass"), ["c10"])
    if plain != {"c10": False}:                                          # the scan is over the CPU budget
        pytest.fail(f"the baseline should fail: {plain}")
    v = grade(judge, "dijkstra", SCAN_DIJKSTRA.replace("CACHED", cached) + SOLVE_AT_SETUP, ["c10"])
    assert v == plain, v
