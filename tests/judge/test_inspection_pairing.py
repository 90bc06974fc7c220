"""An inspection criterion never pays on its own: the code "uses X" only counts for an answer that also behaves.

A code-inspection check (type "ast", or a python test that reads the answer's source or module namespace) sees
which names live code mentions, not what they do: one live, meaningless `self.prev = self.next = None` meets
"uses a linked list", and `root.stat()` as an existence check meets "stats files to group them by size". So the
task file pairs each such criterion with a criterion decided by behaviour (outputs, calls seen by the driver, a
CPU or memory budget read from outside), through `only_if`, or puts a behaviour test beside it in an `all`; the
decoy then pays only where the behaviour it stands for is there. docs/judge.md lists every pairing."""

import pytest

from judging import TASKS, assert_forgery_pays_nothing, fenced, reference
from minigrpo.judge.checks import run_check

# what makes a python test an inspection of the answer rather than a test of what it does
_READS_CODE = ("solution_source", 'ast.parse(open("solution.py")', 'sys.modules["solution"]', "vars(module)",
               "inspect.")


def _parts(check):
    yield check
    for sub in check.get("checks", []):
        yield from _parts(sub)
    if "check" in check:
        yield from _parts(check["check"])


def _inspects(check):
    return any(p["type"] == "ast" or p["type"] == "python" and any(m in p["test"] for m in _READS_CODE)
               for p in _parts(check))


def _behaviour(check):
    """A python check decided in the driver (not "evidence": "answer") that reads no code."""
    return check["type"] == "python" and check.get("evidence", "driver") == "driver" and not _inspects(check)


def _left_to_the_llm(check):
    """Local mode leaves it unchecked and the LLM grades it: a python part the answer's process decides."""
    parts = [check] + (check["checks"] if check["type"] == "all" else [])
    return any(p["type"] == "python" and p.get("evidence") == "answer" for p in parts)


def unpaired(task):
    """The criteria of `task` whose inspection could pay alone: (id, why)."""
    checks = {c["id"]: c["check"] for c in task["criteria"] if c.get("check")}
    out = []
    for cid, check in checks.items():
        if not _inspects(check) or _left_to_the_llm(check):
            continue
        other = check.get("only_if")
        if other is not None:
            if not _behaviour(checks.get(other) or {"type": "none"}):
                out.append((cid, f"only_if {other} is not a behaviour criterion"))
            elif checks[other].get("only_if") is not None:     # one step: what decides never depends on order
                out.append((cid, f"only_if {other}, which counts only beside another"))
        elif not (check["type"] == "all" and any(_behaviour(p) for p in check["checks"])):
            out.append((cid, "an inspection with no behaviour criterion beside it"))
    return out


def test_every_inspection_criterion_is_paired_with_behaviour():
    found = {tid: unpaired(task) for tid, task in TASKS.items() if unpaired(task)}
    assert not found, found


def test_the_pairing_check_flags_an_inspection_standing_alone():
    task = {"criteria": [
        {"id": "c1", "check": {"type": "python", "test": "assert f() == 1"}},
        {"id": "c2", "check": {"type": "ast", "attributes": ["prev"], "only_if": "c1"}},
        {"id": "c3", "check": {"type": "ast", "attributes": ["prev"]}},
        {"id": "c4", "check": {"type": "all", "checks": [{"type": "ast", "calls": ["f"]},
                                                          {"type": "python", "test": "assert f() == 1"}]}},
        {"id": "c5", "check": {"type": "python", "test": "assert 'heapq' in solution_source"}},
        {"id": "c6", "check": {"type": "ast", "calls": ["f"], "only_if": "c5"}},
        {"id": "c7", "check": {"type": "all", "checks": [{"type": "ast", "calls": ["f"]},
                                                          {"type": "python", "test": "x", "evidence": "answer"}]}},
        {"id": "c8", "check": {"type": "python", "test": "assert f(0) == 0", "only_if": "c1"}},
        {"id": "c9", "check": {"type": "ast", "calls": ["f"], "only_if": "c8"}},
    ]}
    assert [cid for cid, _ in unpaired(task)] == ["c3", "c5", "c6", "c9"]


# -- the decoys: the same code with and without one live line that names the inspected thing ---------------------

LIST_SCAN_LRU = """
class LRUCache:
    def __init__(self, capacity):
        if capacity < 1:
            raise ValueError("capacity must be >= 1")
        self.capacity, self.evictions = capacity, 0
        self._data, self._order = {}, []        # recency as a list: every touch scans it
        {decoy}

    def _touch(self, key):
        if key in self._order:
            self._order.remove(key)
        self._order.append(key)

    def get(self, key, default=None):
        if key not in self._data:
            return default
        self._touch(key)
        return self._data[key]

    def put(self, key, value):
        self._data[key] = value
        self._touch(key)
        if len(self._data) > self.capacity:
            del self._data[self._order.pop(0)]
            self.evictions += 1

    def __contains__(self, key):
        return key in self._data

    def __len__(self):
        return len(self._data)
"""

HASH_EVERY_FILE = """
import hashlib
from collections import defaultdict
from pathlib import Path


def find_duplicates(root):
    root = Path(root)
    {exists}
    if not root.is_dir():
        raise NotADirectoryError(root)
    by_hash = defaultdict(list)
    for path in sorted(root.rglob("*")):
        if path.is_file() and not path.is_symlink():
            digest = hashlib.sha256()
            with path.open("rb") as f:          # every file, whatever its size
                while chunk := f.read(1 << 16):
                    digest.update(chunk)
            by_hash[digest.hexdigest()].append(path)
    return sorted((sorted(g) for g in by_hash.values() if len(g) > 1), key=lambda g: g[0])
"""

DECOYS = {    # task: (with the decoy, without it); the criterion the decoy is aimed at is c10 in both
    "lru-cache": (LIST_SCAN_LRU.replace("{decoy}", "self.prev = self.next = None   # a linked list, in name"),
                  LIST_SCAN_LRU.replace("{decoy}", "")),
    "pathlib-duplicate-files": (
        HASH_EVERY_FILE.replace("{exists}", "root.stat()                 # raises for a missing root"),
        HASH_EVERY_FILE.replace("{exists}", "if not root.exists():\n        raise FileNotFoundError(root)")),
}


@pytest.mark.slow
@pytest.mark.parametrize("task_id", sorted(DECOYS))
def test_a_live_decoy_pays_no_inspection_criterion(judge, task_id):
    decoy, plain = DECOYS[task_id]
    inspection = next(c["check"] for c in TASKS[task_id]["criteria"] if c["id"] == "c10")
    assert run_check(inspection, fenced(decoy))[0] is True       # the decoy meets the inspection on its own ...
    assert run_check(inspection, fenced(plain))[0] is False
    assert_forgery_pays_nothing(judge, task_id, fenced(decoy), fenced(plain))    # ... and buys nothing


# -- a witness that this machine cannot check --------------------------------------------------------------------

def _witnessed(witness_check):
    return {"id": "t", "prompt": "write f", "criteria": [
        {"id": "c1", "text": "behaves", "check": witness_check},
        {"id": "c2", "text": "names f", "check": {"type": "regex", "pattern": "def f", "target": "code",
                                                   "only_if": "c1"}},
        {"id": "c3", "text": "has code", "check": {"type": "regex", "pattern": "return"}}]}


@pytest.mark.parametrize("witness, expected", [
    ({"type": "python", "test": "assert f() == 1", "requires": ["no_such_module_for_the_judge"]}, [None, None, True]),
    ({"type": "python", "test": "assert f() == 2"}, [False, False, True]),
    ({"type": "python", "test": "assert f() == 1"}, [True, True, True]),
], ids=["unchecked", "failed", "passed"])
def test_a_criterion_beside_an_unchecked_witness_is_unchecked(judge, witness, expected):
    """A package the witness's test needs is missing here (pandas, sqlalchemy...): the criterion that counts only
    beside it is unchecked too, not failed; a failed witness fails it, a passed one leaves it its own result."""
    v = judge.grade(_witnessed(witness), fenced("def f():\n    return 1"))
    assert [r.passed for r in v.results] == expected, [(r.id, r.reason) for r in v.results]


def test_a_reference_answer_keeps_its_score_when_a_library_is_missing(judge, monkeypatch):
    """lru-cache's c9 (O(1) operations) as if its test needed a library this machine lacks: c9 is unchecked, and
    so is c10 (the linked list it inspects counts only beside c9); the reference scores 1.0 over the rest."""
    from minigrpo.judge import pychecks
    task = TASKS["lru-cache"]
    witness = next(c for c in task["criteria"] if c["id"] == "c9")["check"]
    real = pychecks.missing_packages
    monkeypatch.setattr(pychecks, "missing_packages", lambda check: ["a_library_not_here"] if check == witness
                        else real(check))
    v = judge.grade(task, reference("lru-cache"))
    by_id = {r.id: r for r in v.results}
    assert by_id["c9"].passed is None and by_id["c10"].passed is None, by_id["c10"].reason
    assert v.checked >= 5 and v.score == 1.0, [(r.id, r.passed, r.reason) for r in v.results]
