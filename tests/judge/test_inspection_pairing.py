"""Reading the answer's source never pays, and a guard counts only beside behaviour: the task file's rules.

A code-inspection check (an `ast` check, a text check on the code, a python test that parses the answer's source or
lists its module's names) sees which names the code mentions, not what they do: a branch no test takes names
`groupby`, `functools.reduce` is a loop that names none, one live `self.prev = None` is "a linked list". Such a
check may not decide a criterion in local mode at all: the criterion is paid by behaviour (a budget or a test that
the alternative fails) or has no machine check, and the LLM grades it in hybrid and llm modes. The loader refuses
the `ast` type and text checks on the code (checks.validate_check); the test below reads every python test of the
task file for the ways a test reads the source. A guard that an answer doing nothing meets ("raises ValueError",
"does not mutate the input") counts only beside a behaviour criterion (`"only_if"`). docs/judge-evidence.md gives,
per task, what local mode pays."""

import pytest

from judging import TASKS, assert_forgery_pays_nothing, fenced, reference
from minigrpo.judge.grader import validate_task

# how a python test reads the answer's source or its module's names rather than what the code does
_READS_CODE = ("solution_source", "ast.parse", "inspect.", "getsource", 'sys.modules["solution"]', "vars(module)",
               "__code__", 'open("solution.py")', "dir(module)", "globals()")


def _parts(check):
    yield check
    for sub in check.get("checks", []):
        yield from _parts(sub)
    if "check" in check:
        yield from _parts(check["check"])


def _reads_code(part):
    """A part of a check that local mode would decide by reading the answer's source. A python test marked
    "evidence": "answer" is unchecked locally; one that runs a test-suite answer against an `implementation`
    copies the answer's file to run it under pytest, which is what the suite does, not how it is spelled."""
    if part["type"] == "ast" or part["type"] != "python" and part.get("target") == "code":
        return True
    if part["type"] != "python" or part.get("evidence") == "answer":
        return False
    test = part["test"].replace('open("solution.py").read()', "") if "implementation" in part else part["test"]
    return any(m in test for m in _READS_CODE)


def _behaviour(check):
    return check.get("type") == "python" and check.get("evidence", "driver") == "driver" and not _reads_code(check)


def inspections(task):
    """(id, why) of each criterion of `task` that local mode would pay by reading the answer's source, or whose
    guard counts beside no behaviour criterion."""
    checks = {c["id"]: c["check"] for c in task["criteria"] if c.get("check")}
    out = [(cid, "decided by reading the source") for cid, check in checks.items()
           if any(_reads_code(p) for p in _parts(check))]
    for cid, check in checks.items():
        other = check.get("only_if")
        if other is not None and not _behaviour(checks.get(other) or {}):
            out.append((cid, f"only_if {other}, which is no behaviour criterion"))
        elif other is not None and checks[other].get("only_if") is not None:   # one step: order never matters
            out.append((cid, f"only_if {other}, which counts only beside another"))
    return out


def test_no_criterion_of_the_task_file_is_paid_by_reading_the_source():
    found = {tid: inspections(task) for tid, task in TASKS.items() if inspections(task)}
    assert not found, found


def test_the_task_file_check_flags_every_way_of_reading_the_source():
    task = {"criteria": [
        {"id": "c1", "check": {"type": "python", "test": "assert f() == 1"}},
        {"id": "c2", "check": {"type": "ast", "attributes": ["prev"], "only_if": "c1"}},
        {"id": "c3", "check": {"type": "regex", "pattern": "heapq", "target": "code"}},
        {"id": "c4", "check": {"type": "all", "checks": [{"type": "ast", "calls": ["f"]},
                                                          {"type": "python", "test": "assert f() == 1"}]}},
        {"id": "c5", "check": {"type": "python", "test": 'assert "heapq" in open("solution.py").read()'}},
        {"id": "c6", "check": {"type": "python", "test": "m = sys.modules[\"solution\"]\nassert vars(module)"}},
        {"id": "c7", "check": {"type": "python", "test": "x", "evidence": "answer"}},              # unchecked here
        {"id": "c8", "check": {"type": "python", "test": "assert f(0) == 0", "only_if": "c1"}},    # a guard
        {"id": "c9", "check": {"type": "python", "test": "assert f(1) == 1", "only_if": "c8"}},
        {"id": "c10", "check": {"type": "python", "test": "assert g() is None", "only_if": "c7"}},
    ]}
    assert [cid for cid, _ in inspections(task)] == ["c2", "c3", "c4", "c5", "c6", "c9", "c10"]


@pytest.mark.parametrize("check", [{"type": "ast", "calls": ["f"]},
                                   {"type": "contains", "all": ["heapq"], "target": "code"},
                                   {"type": "not", "check": {"type": "regex", "pattern": "for ", "target": "code"}}],
                         ids=["ast", "contains_on_code", "not_regex_on_code"])
def test_a_task_file_with_an_inspection_does_not_load(check):
    task = {"id": "t", "prompt": "p", "criteria": [{"id": "c1", "text": "uses f", "check": check}]}
    with pytest.raises(ValueError, match="never pays"):
        validate_task(task)


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

DECOYS = {    # task: (with the decoy, without it); the criterion the decoy was aimed at is c10 in both
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
    assert not (TASKS[task_id]["criteria"][9].get("check"))       # c10 is left to the LLM grader ...
    assert_forgery_pays_nothing(judge, task_id, fenced(decoy), fenced(plain))    # ... so the decoy buys nothing


# -- a witness that this machine cannot check --------------------------------------------------------------------

def _witnessed(witness_check):
    return {"id": "t", "prompt": "write f", "criteria": [
        {"id": "c1", "text": "behaves", "check": witness_check},
        {"id": "c2", "text": "a guard", "check": {"type": "regex", "pattern": "return", "only_if": "c1"}},
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
    """lru-cache's c2 (get returns what was stored) as if its test needed a library this machine lacks: c2 is
    unchecked, and so is c1 (the capacity guard counts only beside c2); the reference scores 1.0 over the rest."""
    from minigrpo.judge import pychecks
    task = TASKS["lru-cache"]
    witness = next(c for c in task["criteria"] if c["id"] == "c2")["check"]
    real = pychecks.missing_packages
    monkeypatch.setattr(pychecks, "missing_packages", lambda check: ["a_library_not_here"] if check == witness
                        else real(check))
    v = judge.grade(task, reference("lru-cache"))
    by_id = {r.id: r for r in v.results}
    assert by_id["c2"].passed is None and by_id["c1"].passed is None, by_id["c1"].reason
    assert v.checked >= 5 and v.score == 1.0, [(r.id, r.passed, r.reason) for r in v.results]
