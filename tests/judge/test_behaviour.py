"""Style criteria decided by behaviour: CPU and memory budgets of the sandbox, read from outside the answer.

Each soyuz criterion that used to ask for a property of the code ("uses heaps", "vectorised", "memory-lean",
"no row-wise apply", "no per-call sort") is now a budget on fresh inputs the driver chooses, with the outputs
checked in the driver: time.process_time() and deadline() are the sandbox's CPU seconds, memory_peak_mb() its
cgroup's peak (growth over a baseline capped at a few MB above start-up, so memory taken and freed early does not
buy headroom). For each, the reference answer (tests/data/soyuz/<id>.good.md) passes the whole criterion and a
naive answer written here fails it -- on the budget: every naive is correct, so a budget loosened far enough lets it
through. No criterion reads the source any more; pandas-sales-pivot's "no row-wise iteration" has no budget: a
Python loop over the columns as lists runs as fast as the vectorised reference (1M rows: 0.4 s against 0.55 s of
CPU), so it is left to the LLM grader.

Calibration (CPU seconds measured here, 2 shared cores under load; naive with the budget lifted):
  criterion                   reference    naive                               budget
  streaming-median c9 (300k)  0.5-0.75     sorted-list insert: 3-6             1.5
  weighted-choice c9          0.01-0.02    linear scan per sample: 3.6         0.5
  lru-cache c9                0.14-0.21    recency list scans: 12              1.0
  trie-autocomplete c10       0.02-0.04    scan every word: 4.6                1.0
  topological-sort c10        0.13-0.15    re-sort the ready list: 7.8         1.5
  dijkstra c10                0.09-0.12    scan for the minimum: > 20          1.5
  numpy-pairwise c9           0.13-0.17    Python loops: 6.7                   1.0
  vectorize-loop-fix c8       0.10-0.15    a loop over elements in Python: 0.5-0.8; over rows or columns
                              (100k x 6, 6 x 100k, replies included); over rows or columns: 2-3.5  0.4
  pathlib c6 (32 GB sparse)   < 0.01       read every file, zeros unhashed: 1-2  1.0 from the sandbox's
                              (+ start-up and import, ~0.05-0.25)                       start
Memory (MB the call adds to the sandbox's peak):
  numpy-pairwise c8           46           4 broadcast chunks: 410             160 (and a 1024 MB sandbox)
  pathlib c7 (2 x 28 MB data) < 1          read_bytes(): 24-30                 14 (baseline capped at 16)
  file-handle c7 (24 MB log)  ~0           readlines(): 165, read(): 186       24 beyond the log
(the input files of these three are the judge's, made before the answer's process: minigrpo/judge/inputs.py)
"""

from concurrent.futures import ThreadPoolExecutor

import pytest

from judging import TASKS, fenced, reference
from minigrpo.judge.checks import missing_packages, run_check, sandbox_isolation

CGROUP = "cgroup" in sandbox_isolation()[0]      # memory_peak_mb() is None without one


def criterion_check(task_id, cid):
    return next(c["check"] for c in TASKS[task_id]["criteria"] if c["id"] == cid)


def budget_check(task_id, cid):
    """The criterion's python check (a budget criterion is one python check)."""
    check = criterion_check(task_id, cid)
    assert check["type"] == "python", (task_id, cid)
    return check


def budget_lines(check):
    """The test's lines that decide the budget (1-based): the final assert on cpu / growth."""
    lines = check["test"].splitlines()
    return [i + 1 for i, line in enumerate(lines) if line.startswith(("assert cpu < BUDGET", "    assert growth <"))]


NAIVE = {
    ("streaming-median", "c9"): """
import heapq  # imported, unused: nothing reads it; only the budget can fail this answer
import math
import statistics


class RunningMedian:
    def __init__(self):
        self.xs = []

    def add(self, x):
        if isinstance(x, float) and math.isnan(x):
            raise ValueError("nan")
        self.xs.append(x)

    def median(self):
        if not self.xs:
            raise ValueError("empty")
        return float(statistics.median(self.xs))   # sorts a copy on every call
""",
    ("weighted-choice", "c9"): """
import bisect  # imported, unused
import math
from itertools import accumulate


class WeightedSampler:
    def __init__(self, items, weights):
        items, weights = list(items), [float(w) for w in weights]
        if len(items) != len(weights) or not items or any(not math.isfinite(w) or w < 0 for w in weights):
            raise ValueError("bad input")
        self.items, self.cum = items, list(accumulate(weights))
        if self.cum[-1] <= 0:
            raise ValueError("all zero")

    def sample(self, rng):
        u = rng.random() * self.cum[-1]
        for i, c in enumerate(self.cum):        # a linear scan per sample
            if u < c:
                return self.items[i]
        return self.items[-1]
""",
    ("lru-cache", "c9"): """
class LRUCache:
    def __init__(self, capacity):
        if capacity < 1:
            raise ValueError("capacity")
        self.capacity, self.evictions, self.data, self.order = capacity, 0, {}, []

    def get(self, key, default=None):
        if key not in self.data:
            return default
        self.order.remove(key)                  # a list scan on every touch
        self.order.append(key)
        return self.data[key]

    def put(self, key, value):
        if key in self.data:
            self.order.remove(key)
        self.data[key] = value
        self.order.append(key)
        if len(self.data) > self.capacity:
            del self.data[self.order.pop(0)]
            self.evictions += 1

    def __len__(self):
        return len(self.data)
""",
    ("trie-autocomplete", "c10"): """
class Trie:
    def __init__(self):
        self.weights = {}                       # no tree: complete() looks at every word

    def insert(self, word, weight=1):
        if not word or weight <= 0:
            raise ValueError("bad word or weight")
        self.weights[word] = self.weights.get(word, 0) + weight

    def complete(self, prefix, k=5):
        found = [(-w, word) for word, w in self.weights.items() if word.startswith(prefix)]
        return [word for _, word in sorted(found)[:k]] if k > 0 else []
""",
    ("topological-sort", "c10"): """
def topological_sort(graph):
    indegree = {}
    for node, targets in graph.items():
        indegree.setdefault(node, 0)
        for t in targets:
            indegree[t] = indegree.get(t, 0) + 1
    ready, order = [n for n, d in indegree.items() if d == 0], []
    while ready:
        ready.sort()                            # re-sorts the ready list on every step
        node = ready.pop(0)
        order.append(node)
        for t in graph.get(node, ()):
            indegree[t] -= 1
            if indegree[t] == 0:
                ready.append(t)
    if len(order) < len(indegree):
        raise ValueError("cycle")
    return order
""",
    ("dijkstra", "c10"): """
import heapq  # imported, unused
import math


def shortest_path(graph, source, target):
    dist, prev, done = {source: 0}, {}, set()
    while True:
        todo = [(d, u) for u, d in dist.items() if u not in done]   # scans every reached node for the minimum
        if not todo:
            break
        d, u = min(todo)
        if u == target:
            break
        done.add(u)
        for v, w in graph.get(u, {}).items():
            if d + w < dist.get(v, math.inf):
                dist[v], prev[v] = d + w, u
    if target not in dist:
        return math.inf, []
    path = [target]
    while path[-1] != source:
        path.append(prev[path[-1]])
    return dist[target], path[::-1]
""",
    ("numpy-pairwise-distances", "c8"): """
import numpy as np


def pairwise_distances(X, Y=None):
    X = np.asarray(X, dtype=np.float64)
    Y = X if Y is None else np.asarray(Y, dtype=np.float64)
    if X.ndim != 2 or Y.ndim != 2 or X.shape[1] != Y.shape[1]:
        raise ValueError("shapes")
    # broadcast in 4 chunks: each an (n/4, m, d) temporary, ~410 MB here -- well under the sandbox's 1024 MB
    out = []
    for x in np.array_split(X, 4):
        diff = x[:, None, :] - Y[None, :, :]
        np.square(diff, out=diff)
        out.append(np.sqrt(diff.sum(axis=2)))
        del diff
    return np.concatenate(out)
""",
    ("numpy-pairwise-distances", "c9"): """
import math
import numpy as np


def pairwise_distances(X, Y=None):
    X = np.asarray(X, dtype=np.float64)
    Y = X if Y is None else np.asarray(Y, dtype=np.float64)
    out = np.empty((len(X), len(Y)))
    xs, ys = X.tolist(), Y.tolist()
    for i, x in enumerate(xs):                  # Python loops instead of numpy
        for j, y in enumerate(ys):
            out[i, j] = math.sqrt(sum((a - b) ** 2 for a, b in zip(x, y)))
    return out
""",
    ("vectorize-loop-fix", "c8"): None,         # the task's own loop version (from its prompt)
    ("pathlib-duplicate-files", "c6"): """
import hashlib
from collections import defaultdict
from pathlib import Path


def find_duplicates(root):
    root = Path(root)
    if not root.is_dir():
        raise NotADirectoryError(root)
    by_hash = defaultdict(list)
    for path in root.rglob("*"):
        if path.is_file() and not path.is_symlink():
            digest = hashlib.sha256()
            with path.open("rb") as f:          # hashes every file, whatever its size (in chunks)
                while chunk := f.read(1 << 16):
                    digest.update(chunk)
            by_hash[digest.hexdigest()].append(path)
    return sorted((sorted(g) for g in by_hash.values() if len(g) > 1), key=lambda g: g[0])
""",
    ("pathlib-duplicate-files", "c7"): """
import hashlib
from collections import defaultdict
from pathlib import Path


def find_duplicates(root):
    root = Path(root)
    if not root.is_dir():
        raise NotADirectoryError(root)
    by_size = defaultdict(list)
    for path in root.rglob("*"):
        if path.is_file() and not path.is_symlink():
            by_size[path.stat().st_size].append(path)
    groups = []
    for paths in by_size.values():
        by_hash = defaultdict(list)
        for p in paths if len(paths) > 1 else ():
            by_hash[hashlib.sha256(p.read_bytes()).hexdigest()].append(p)    # the whole file in one read
        groups += [sorted(g) for g in by_hash.values() if len(g) > 1]
    return sorted(groups, key=lambda g: g[0])
""",
    ("file-handle-leak-fix", "c7"): """
def count_errors(paths):
    counts = {}
    for path in paths:
        with open(path, encoding="utf-8") as f:
            lines = f.readlines()               # the whole log in memory
        counts[path] = sum(1 for line in lines if "ERROR" in line)
    return counts
""",
}
MEMORY = {("numpy-pairwise-distances", "c8"), ("pathlib-duplicate-files", "c7"), ("file-handle-leak-fix", "c7")}
CASES = sorted(NAIVE)


def naive(task_id, cid):
    code = NAIVE[(task_id, cid)]
    if code is None:
        prompt = TASKS[task_id]["prompt"]
        code = prompt.split("```python\n", 1)[1].split("```", 1)[0]
    return fenced(code)


@pytest.fixture(scope="module")
def verdicts():
    """Every (case, reference | naive) graded once, two at a time (CPU seconds do not grow with the load)."""
    with ThreadPoolExecutor(2) as pool:
        futures = {}
        for task_id, cid in CASES:
            futures[(task_id, cid, "reference")] = pool.submit(run_check, criterion_check(task_id, cid),
                                                               reference(task_id))
            futures[(task_id, cid, "naive")] = pool.submit(run_check, budget_check(task_id, cid), naive(task_id, cid))
        yield {key: fut.result() for key, fut in futures.items()}


def _skip_gaps(task_id, cid):
    gaps = missing_packages(budget_check(task_id, cid))
    if gaps:
        pytest.skip(f"{gaps} not installed")


@pytest.mark.slow
@pytest.mark.parametrize("task_id, cid", CASES, ids=[f"{t}-{c}" for t, c in CASES])
def test_reference_passes_the_budget(verdicts, task_id, cid):
    _skip_gaps(task_id, cid)
    passed, reason = verdicts[(task_id, cid, "reference")]
    assert passed is True, reason


@pytest.mark.slow
@pytest.mark.parametrize("task_id, cid", CASES, ids=[f"{t}-{c}" for t, c in CASES])
def test_naive_fails_on_the_budget(verdicts, task_id, cid):
    _skip_gaps(task_id, cid)
    if (task_id, cid) in MEMORY and not CGROUP:
        pytest.skip("no cgroup here: memory_peak_mb() is None")
    passed, reason = verdicts[(task_id, cid, "naive")]
    assert passed is False, reason
    # the budget decided it: its own assert or its deadline -- not the criterion's overall time limit, which would
    # hide a budget loosened past it
    where = [f"line {n}" for n in budget_lines(budget_check(task_id, cid))]
    assert "over the criterion's CPU-time limit" in reason or any(w in reason for w in where), reason


def test_every_budget_has_its_assert():
    for task_id, cid in CASES:
        assert budget_lines(budget_check(task_id, cid)), (task_id, cid)
