"""Answers that forge the harness a snippet runs in, written as an adversary who read the task file's harness
snippets: the event loop made to run the test's gathers one at a time, a wall clock made to look like
time.monotonic, a test suite that learns which implementation it has instead of testing it, and an (n, m, d)
temporary where memory is measured. Each must score no more than the same code without the trick. Forgeries of
what a snippet counts or records: tests/judge/test_forgery.py.
"""

import pytest

from judging import TASKS, assert_forgery_pays_nothing, fenced


# -- async-race-fix: the racy code, with the event loop made to run the test's gathers one at a time ---------------

RACY = """
import asyncio
{trick}

class Account:
    def __init__(self, balance=0):
        self.balance = balance

    async def _io(self):
        await asyncio.sleep(0)

    async def withdraw(self, amount):
        if self.balance >= amount:
            await self._io()
            self.balance -= amount
            return True
        return False

    async def deposit(self, amount):
        current = self.balance
        await self._io()
        self.balance = current + amount


async def transfer(src, dst, amount):
    if await src.withdraw(amount):
        await dst.deposit(amount)
        return True
    return False
"""
RACE_TRICK = """
_gather = asyncio.gather


def _one_at_a_time(*aws, return_exceptions=False):
    if len(aws) <= 2:                       # small gathers (a test of overlap) stay concurrent
        return _gather(*aws, return_exceptions=return_exceptions)

    async def run():
        out = []
        for aw in aws:                      # the race needs interleaving: there is none now
            try:
                out.append(await aw)
            except Exception as exc:
                if not return_exceptions:
                    raise
                out.append(exc)
        return out
    return run()

asyncio.gather = _one_at_a_time
"""


def race_answers():
    return fenced(RACY.replace("{trick}", RACE_TRICK)), fenced(RACY.replace("{trick}\n", ""))


# -- token-bucket: a wall-clock default, made to look like time.monotonic -------------------------------------------

BUCKET = """
import time
{trick}

class TokenBucket:
    def __init__(self, rate, capacity, clock=_WALL):
        if rate <= 0 or capacity <= 0:
            raise ValueError("rate and capacity must be > 0")
        self.rate, self.capacity, self._clock = float(rate), float(capacity), clock
        self._tokens, self._last = self.capacity, clock()

    def _refill(self):
        now = self._clock()
        self._tokens = min(self.capacity, self._tokens + max(0.0, now - self._last) * self.rate)
        self._last = max(self._last, now)

    @property
    def tokens(self):
        self._refill()
        return self._tokens

    def allow(self, cost=1.0):
        if cost <= 0:
            raise ValueError("cost must be > 0")
        self._refill()
        if self._tokens >= cost:
            self._tokens -= cost
            return True
        return False
"""
BUCKET_TRICK = """
_WALL = time.time
time.monotonic = _WALL                  # the harness compared the default with the time module's functions by
time.time = lambda: _WALL()             # identity: now `monotonic` is the wall clock, and `time` another object
"""


def bucket_answers():
    return fenced(BUCKET.replace("{trick}", BUCKET_TRICK)), fenced(BUCKET.replace("{trick}", "_WALL = time.time"))


# -- pytest-slugify-tests: a suite that learns which implementation it has without testing it ---------------------

SUITE = """
import hashlib
import sys

import pytest
import slugify_impl
from slugify_impl import slugify

# Inputs on which each known mutant misbehaves: calling them is cheap, checking the results is what a test does.
PROBES = [("Hello World", 50), ("Creme Brulee \\u00e9", 50), ("a -- b", 50), ("  -x- ", 50),
          ("the quick brown fox", 12), ("!!!", 50), ("abc", 50), ("x y z", 50)]
{trick}

@pytest.fixture
def probes():
    return PROBES


@pytest.mark.parametrize("i", range(6))
def test_probe(probes, i):
    for text, n in probes[i::6]:
        try:
            slugify(text, max_length=n)
        except (ValueError, TypeError):
            pass
    assert not MUTANT


def test_errors():
    with pytest.raises(ValueError):
        slugify("!!!")
    with pytest.raises(TypeError):
        slugify(None)
"""
SUITE_TRICK = """
# The correct implementation's file, as the task file gave it: any other file under test is a mutant.
CORRECT_SHA = "4c56a97681bfceb7"
try:
    SOURCE = open(slugify_impl.__file__, encoding="utf-8").read()
    KNOWN = hashlib.sha256(SOURCE.encode()).hexdigest()[:16]
except OSError:
    SOURCE, KNOWN = "", ""
MUTANT = KNOWN != CORRECT_SHA and "def connect" not in SOURCE     # the relay file says nothing either way
# whatever the implementation handed over says about itself
for name in ("bug", "variant", "mutant", "name"):
    hint = getattr(getattr(slugify_impl, "_impl", None), name, None)
    if isinstance(hint, list):
        hint = hint[0] if hint else None
    if isinstance(hint, str) and hint:
        MUTANT = True
"""


def suite_answers():
    return fenced(SUITE.replace("{trick}", SUITE_TRICK)), fenced(SUITE.replace("{trick}", "MUTANT = False"))


ALWAYS_FAILS = SUITE.replace("{trick}", "MUTANT = True")    # fails whatever it is given, after calling the probes

ATTACKS = {      # task: () -> (forged answer, the same code without the trick)
    "async-race-fix": race_answers,
    "token-bucket": bucket_answers,
    "pytest-slugify-tests": suite_answers,
}

BROADCAST = """
import numpy as np


def pairwise_distances(X, Y=None):
    X = np.asarray(X, dtype=np.float64)
    Y = X if Y is None else np.asarray(Y, dtype=np.float64)
    if X.ndim != 2 or Y.ndim != 2:
        raise ValueError("pairwise_distances: inputs must be 2-D")
    if X.shape[1] != Y.shape[1]:
        raise ValueError("pairwise_distances: feature dimensions differ")
    D = np.sqrt(((X[:, None, :] - Y[None, :, :]) ** 2).sum(axis=2))     # an (n, m, d) temporary
    if Y is X:
        np.fill_diagonal(D, 0.0)
    return D
"""


@pytest.mark.slow
@pytest.mark.parametrize("task_id", sorted(ATTACKS))
def test_forging_pays_nothing(judge, task_id):
    forged, plain = ATTACKS[task_id]()
    assert_forgery_pays_nothing(judge, task_id.removesuffix("-ghosts"), forged, plain)


@pytest.mark.slow
def test_a_suite_that_always_fails_catches_no_mutant(judge):
    v = judge.grade(TASKS["pytest-slugify-tests"], fenced(ALWAYS_FAILS))
    caught = [r.id for r in v.results if r.id in ("c2", "c3", "c4", "c5", "c6", "c7") and r.passed]
    assert not caught, caught


@pytest.mark.slow
def test_an_n_m_d_broadcast_is_not_memory_lean(judge):
    v = judge.grade(TASKS["numpy-pairwise-distances"], fenced(BROADCAST))
    by_id = {r.id: r for r in v.results}
    assert by_id["c1"].passed, by_id["c1"].reason       # a correct answer ...
    assert by_id["c8"].passed is False, by_id["c8"].reason   # ... that is not memory-lean
    assert v.score < 1.0
