"""Budgets that a cheap trick does not get past: the naive algorithm of a budget criterion, plus the cheapest way
found to make it look cheap, still fails the budget (and only the budget: its outputs are right).

- streaming-median c9: a sorted list kept by binary-search insertion moves O(n) items per add, but in C and in
  cache: at 20k adds it ran as fast as two heaps, and one live heapq call met the heap inspection (1.0). At 300k
  adds it takes 3-6 s of CPU against the reference's 0.5-0.75 (budget 1.5).
- pathlib-duplicate-files c6: a unique-size file made only of holes is skipped without reading it by the lseek
  calls that find data (SEEK_DATA / SEEK_HOLE), or read 1 MB at a time and compared with zeros instead of hashed
  (3 GB of holes: 0.14 s, under the 0.5 s budget). The file is now 32 GB with one page of data at a place the driver
  draws: comparing costs 1-2 s (budget 0.25; the reference < 0.01), and no stat tells where the data is. The
  sandbox refuses SEEK_DATA / SEEK_HOLE (EINVAL), so the extent reader falls back to reading it all. A sparse file
  hashed by its size and allocated blocks instead of read is caught by two same-size sparse files that differ.
- pathlib-duplicate-files c7: the two same-size files hold data, written before the baseline is read, so reading
  only the data extents of a file, whole, holds the whole file (was: holes only, nothing held).

A real-data unique file cannot carry c6: the sandbox's work folder holds 64 MB, and reading 60 MB of data costs
~0.01 s of CPU, no more than the reference's whole call."""

import pytest

from judging import TASKS, fenced, reference
from minigrpo.judge.checks import run_check

HEAP_IN_NAME = """
import heapq
import math


class RunningMedian:
    def __init__(self):
        self._xs = []
        self._seen = []

    def add(self, x):
        if isinstance(x, float) and math.isnan(x):
            raise ValueError("NaN has no order")
        heapq.heappush(self._seen, 0)           # a heap, in name
        heapq.heappop(self._seen)
        lo, hi = 0, len(self._xs)
        while lo < hi:                          # a sorted list: binary search, then an O(n) insert
            mid = (lo + hi) // 2
            if self._xs[mid] <= x:
                lo = mid + 1
            else:
                hi = mid
        self._xs.insert(lo, x)

    def median(self) -> float:
        if not self._xs:
            raise ValueError("empty")
        n = len(self._xs)
        mid = n // 2
        return float(self._xs[mid]) if n % 2 else (self._xs[mid - 1] + self._xs[mid]) / 2

    def __len__(self):
        return len(self._xs)
"""

HASH_EVERY_FILE = """
import errno
import hashlib
import os
from collections import defaultdict
from pathlib import Path


def _digest(path):
    digest = hashlib.sha256()
    with open(path, "rb") as f:
{read}
    return digest.hexdigest()


def find_duplicates(root):
    root = Path(root)
    if not root.is_dir():
        raise NotADirectoryError(root)
    by_hash = defaultdict(list)
    for path in root.rglob("*"):
        if path.is_file() and not path.is_symlink():
            by_hash[_digest(path)].append(path)
    return sorted((sorted(g) for g in by_hash.values() if len(g) > 1), key=lambda g: g[0])
"""

ZERO_RUNS = """\
        buf, zeros = bytearray(1 << 20), bytes(1 << 20)
        while n := f.readinto(buf):
            if n == len(buf) and buf == zeros:
                digest.update(b"Z")             # a run of zeros costs a compare, not a hash
            else:
                digest.update(memoryview(buf)[:n])
        digest.update(os.fstat(f.fileno()).st_size.to_bytes(8, "little"))"""

DATA_EXTENTS = """\
        fd, end, pos = f.fileno(), os.fstat(f.fileno()).st_size, 0
        while pos < end:                        # only the data: the holes are found, never read
            try:
                data = os.lseek(fd, pos, os.SEEK_DATA)
            except OSError as e:
                if e.errno != errno.ENXIO:      # no SEEK_DATA here (the sandbox refuses it): read the rest
                    os.lseek(fd, pos, os.SEEK_SET)
{fallback}
                break
            hole = os.lseek(fd, data, os.SEEK_HOLE)
            os.lseek(fd, data, os.SEEK_SET)
            digest.update(data.to_bytes(8, "little"))
            digest.update(f.read(hole - data))  # each extent in one read
            pos = hole
        digest.update(end.to_bytes(8, "little"))"""
SPARSE_BLOCKS = """\
        st = os.fstat(f.fileno())
        if st.st_blocks * 512 < st.st_size:     # mostly holes: its size and allocation stand for its content
            digest.update(b"sparse %d %d" % (st.st_size, st.st_blocks))
        else:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                digest.update(chunk)"""

# what the extent reader does where lseek cannot find the data: the cheapest whole read, or chunks as an honest
# reader would (so the answer stays right, and only the budget can fail it)
WHOLE = "                    digest.update(f.read())"
CHUNKS = """\
                    for chunk in iter(lambda: f.read(1 << 20), b""):
                        digest.update(chunk)"""

SEEK_PROBE = {"type": "python", "timeout": 5, "test": '''
SNIPPET = """
import os
with open("probe", "wb") as f:
    f.truncate(1 << 20)
    f.seek((1 << 20) - 1)
    f.write(b"x")
fd = os.open("probe", os.O_RDONLY)
try:
    result = os.lseek(fd, 0, os.SEEK_DATA) > 0
except OSError:
    result = False
"""
assert in_sandbox(SNIPPET) is False
'''}


def criterion(task_id, cid):
    return next(c["check"] for c in TASKS[task_id]["criteria"] if c["id"] == cid)


def budget_part(check):
    return check if check["type"] == "python" else next(c for c in check["checks"] if c["type"] == "python")


def assert_fails_on_the_budget(task_id, cid, answer, *, passes_first):
    """The trick passes the criterion's other lines and the task's correctness criterion, and fails the budget."""
    assert run_check(criterion(task_id, passes_first), fenced(answer))[0] is True      # the trick answers right
    assert run_check(criterion(task_id, cid), reference(task_id))[0] is True
    passed, reason = run_check(budget_part(criterion(task_id, cid)), fenced(answer))
    assert passed is False, reason
    assert "CPU-time limit" in reason or "assertion failed" in reason, reason


@pytest.mark.slow
def test_a_sorted_list_with_a_heap_in_name_fails_the_median_budget():
    assert "heapq.heappush" in HEAP_IN_NAME            # the heap, met by name: nothing reads the name any more
    assert_fails_on_the_budget("streaming-median", "c9", HEAP_IN_NAME, passes_first="c4")


@pytest.mark.slow
def test_reading_holes_as_zero_runs_fails_the_unique_size_budget():
    answer = HASH_EVERY_FILE.replace("{read}", ZERO_RUNS)
    assert_fails_on_the_budget("pathlib-duplicate-files", "c6", answer, passes_first="c1")


@pytest.mark.slow
def test_finding_the_data_with_lseek_fails_the_unique_size_budget():
    if run_check(SEEK_PROBE, fenced("X = 1"))[0] is not True:
        pytest.skip("this sandbox lets lseek find a file's data (SEEK_DATA / SEEK_HOLE): a file of holes is free")
    answer = HASH_EVERY_FILE.replace("{read}", DATA_EXTENTS.replace("{fallback}", CHUNKS))
    assert_fails_on_the_budget("pathlib-duplicate-files", "c6", answer, passes_first="c1")


@pytest.mark.slow
def test_reading_whole_data_extents_fails_the_chunk_budget():
    answer = HASH_EVERY_FILE.replace("{read}", DATA_EXTENTS.replace("{fallback}", WHOLE))
    assert_fails_on_the_budget("pathlib-duplicate-files", "c7", answer, passes_first="c1")


@pytest.mark.slow
def test_letting_a_sparse_files_blocks_stand_for_it_fails_the_unique_size_criterion():
    """No lseek at all: a file with fewer blocks than its size is hashed by its size and blocks, never read. Two
    same-size sparse files that differ in their one page of data are then called duplicates."""
    answer = HASH_EVERY_FILE.replace("{read}", SPARSE_BLOCKS)
    assert_fails_on_the_budget("pathlib-duplicate-files", "c6", answer, passes_first="c1")
