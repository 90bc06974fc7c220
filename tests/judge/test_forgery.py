"""Answers that forge what the judge observes, written as an adversary who read the task file's harness snippets.

The answer shares its process with any harness code run beside it (in_sandbox): it can patch modules at import,
reach a snippet's globals through a callback's __globals__ or sys._getframe(), and rewrite whatever the snippet
counts or records. So no criterion may be decided by such a record: each forger below targets the records the
snippets used to keep (a peak counter, a statements list, a calls list, a spy's closed flags, pytest's counts,
a default compared by identity) and the harness that replaced them (ghost requests to the driver's server, a
serialised event loop, hints about the implementation under test). Each must score no more than the same code
without the trick; the criteria that cannot be observed from outside are left to the LLM grader (evidence=answer)
and so are worth nothing to a forger in local mode.
"""

import json
import os
import tempfile

import pytest

from minigrpo.judge import make_judge
from minigrpo.judge.checks import run_check

from repo_root import ROOT

with open(os.path.join(ROOT, "minigrpo", "data", "soyuz_tasks.json")) as f:
    TASKS = {t["id"]: t for t in json.load(f)}


def fenced(code):
    return f"```python\n{code}\n```"


def models():
    """The sqlalchemy task's models, as its prompt gives them."""
    prompt = TASKS["sqlalchemy-top-customers"]["prompt"]
    return prompt.split("```python\n", 1)[1].split("```", 1)[0]


# -- asyncio-bounded-fetch: one fetch at a time, dressed up as `limit` at a time -------------------------------------

SEQUENTIAL_FETCH = """
import asyncio


async def fetch_all(urls, fetch, limit=10, timeout=None):
    if limit < 1:
        raise ValueError("limit must be >= 1")
    {trick}
    results = []
    for url in urls:                                # one at a time
        try:
            results.append(await asyncio.wait_for(fetch(url), timeout))
        except Exception as exc:
            results.append(exc)
    return results
"""
FETCH_TRICK = """
import asyncio
import sys

_real_sleep = asyncio.sleep


async def _no_wait(delay=0, result=None):
    return await _real_sleep(0, result)

asyncio.sleep = _no_wait        # the harness's 50 ms fetches take no time: a sequential run looks concurrent


def _harness_globals(fn):
    found, frame = [getattr(fn, "__globals__", {})], sys._getframe(1)
    while frame is not None:
        found.append(frame.f_globals)
        frame = frame.f_back
    return found


def _forge(urls, fetch, limit):
    want = min(limit, len(urls))
    for g in _harness_globals(fetch):
        state = g.get("state")
        if isinstance(state, dict):                 # the snippet's own counters: claim `limit` in flight
            state["peak"] = max(state.get("peak", 0), want)
"""
GHOST_TRICK = """
def _ghosts(urls, fetch, limit):
    # a server that counts requests in flight: start `limit - 1` requests nobody waits for, to reach the peak
    start = getattr(fetch, "__globals__", {}).get("start")
    for url in urls[:min(limit, len(urls)) - 1] if callable(start) else ():
        try:
            start(url)
        except Exception:
            pass
"""


def fetch_answers():
    plain = SEQUENTIAL_FETCH.replace("    {trick}\n", "")
    forged = FETCH_TRICK + SEQUENTIAL_FETCH.replace("{trick}", "_forge(urls, fetch, limit)")
    return fenced(forged), fenced(plain)


def fetch_ghost_answers():
    plain = SEQUENTIAL_FETCH.replace("    {trick}\n", "")
    return fenced(GHOST_TRICK + SEQUENTIAL_FETCH.replace("{trick}", "_ghosts(urls, fetch, limit)")), fenced(plain)


# -- sqlalchemy-top-customers: N+1 queries, with the statement log emptied -------------------------------------------

N_PLUS_ONE = """
import sys
from sqlalchemy import select


def top_customers(session, since, n=5):
    if n < 1:
        raise ValueError("n must be >= 1")
    totals = []
    for customer in session.scalars(select(Customer)).all():       # one query, then one more per customer
        paid = [o.amount for o in customer.orders if o.status == "paid" and o.placed_on >= since]
        if paid:
            totals.append((customer.name, Decimal(sum(paid))))
    totals.sort(key=lambda t: (-t[1], t[0]))
    {trick}
    return totals[:n]
"""
SQL_TRICK = """
def _hide_statements():
    # the harness counts the engine's statements in a list beside us: keep just one
    frame = sys._getframe(1)
    while frame is not None:
        log = frame.f_globals.get("statements")
        if isinstance(log, list):
            del log[:-1]
        frame = frame.f_back
"""


def sql_answers():
    body = models() + N_PLUS_ONE
    return fenced(body.replace("{trick}", "_hide_statements()") + SQL_TRICK), fenced(body.replace("    {trick}\n", ""))


# -- requests-retry-session: a duck-typed session that only says the right things -----------------------------------

FAKE_SESSION = """
import sys

import requests
from requests.adapters import HTTPAdapter
from urllib3.util.retry import Retry


class TimeoutHTTPAdapter(HTTPAdapter):          # what the code inspections look for; never used below
    def __init__(self, *args, timeout=10.0, **kwargs):
        self.timeout = timeout
        super().__init__(*args, **kwargs)

    def send(self, request, **kwargs):
        if kwargs.get("timeout") is None:
            kwargs["timeout"] = self.timeout
        return super().send(request, **kwargs)


def _real_session(retries, backoff_factor, timeout):
    retry = Retry(total=retries, backoff_factor=backoff_factor, status_forcelist=(429, 500, 502, 503, 504),
                  allowed_methods=frozenset({"GET", "HEAD", "OPTIONS", "PUT", "DELETE"}))
    s = requests.Session()
    s.mount("https://", TimeoutHTTPAdapter(max_retries=retry, timeout=timeout))
    s.mount("http://", TimeoutHTTPAdapter(max_retries=retry, timeout=timeout))
    return s


class _Settings:
    def __init__(self, **kw):
        self.__dict__.update(kw)


class FakeSession:
    # answers every question about its configuration correctly, and sends nothing
    def __init__(self, retries, backoff_factor, timeout):
        retry = _Settings(total=retries, backoff_factor=backoff_factor, status_forcelist=(429, 500, 502, 503, 504),
                          allowed_methods=frozenset({"GET", "HEAD", "OPTIONS", "PUT", "DELETE"}),
                          respect_retry_after_header=True)
        self.adapter, self.timeout = _Settings(max_retries=retry), timeout
        self.headers = {"User-Agent": "minigrpo-client/1.0"}

    def get_adapter(self, url):
        return self.adapter

    def request(self, method, url, timeout=None, **kwargs):
        {trick}
        return _Response(url)

    def get(self, url, **kwargs):
        return self.request("GET", url, **kwargs)


class _Response:
    def __init__(self, url):
        self.url, self.status_code = url, 404 if "missing" in url or "down" in url else 200

    def json(self):
        return {"ok": True}

    def raise_for_status(self):
        if self.status_code >= 400:
            raise requests.HTTPError(f"{self.status_code} for {self.url}")


def make_session(retries=3, backoff_factor=0.5, timeout=10.0):
    _real_session(retries, backoff_factor, timeout)
    return FakeSession(retries, backoff_factor, timeout)


def get_json(session, url, **kwargs):
    response = session.get(url, **kwargs)
    response.raise_for_status()
    return response.json()
"""
REQUESTS_TRICK = """
def _record(method, url, timeout, headers):
    # the harness records what its stubbed send() saw in a list beside us: add what a real session would have sent
    frame = sys._getframe(1)
    while frame is not None:
        calls = frame.f_globals.get("calls")
        if isinstance(calls, list):
            calls.append({"timeout": timeout, "url": url, "headers": dict(headers)})
        frame = frame.f_back
"""


def requests_answers():
    trick = "_record(method, url, self.timeout if timeout is None else timeout, self.headers)"
    return (fenced(FAKE_SESSION.replace("{trick}", trick) + REQUESTS_TRICK),
            fenced(FAKE_SESSION.replace("        {trick}\n", "")))


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


# -- file-handle-leak-fix: files left open, then closed behind the harness's back ------------------------------------

LEAKY = """
import json
import sys


def count_errors(paths):
    counts = {}
    try:
        for p in paths:
            f = open(p, encoding="utf-8")      # never closed
            counts[p] = sum(1 for line in f if "ERROR" in line)
    finally:
        {trick}
    return counts


def load_config(path):
    return json.load(open(path, encoding="utf-8"))


def append_log(path, message):
    f = open(path, "a", encoding="utf-8")
    f.write(message + "\\n")
    f.flush()
"""
LEAK_TRICK = """
def _close_what_the_harness_saw():
    # the harness keeps the files it saw opened in a list beside us and asks each whether it is closed
    frame = sys._getframe(1)
    while frame is not None:
        for f in frame.f_globals.get("opened", None) or []:
            try:
                f.close()
            except Exception:
                pass
        frame = frame.f_back
"""


def leak_answers():
    return (fenced(LEAKY.replace("{trick}", "_close_what_the_harness_saw()") + LEAK_TRICK),
            fenced(LEAKY.replace("{trick}", "pass")))


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

ATTACKS = {      # task (a suffix names a second attack on it): () -> (forged answer, the same code without the trick)
    "asyncio-bounded-fetch": fetch_answers,
    "asyncio-bounded-fetch-ghosts": fetch_ghost_answers,
    "sqlalchemy-top-customers": sql_answers,
    "requests-retry-session": requests_answers,
    "async-race-fix": race_answers,
    "token-bucket": bucket_answers,
    "file-handle-leak-fix": leak_answers,
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


@pytest.fixture(scope="module")
def judge():
    j = make_judge("local", workers=2)
    yield j
    j.close()


def grade_all(judge, pairs):
    """{name: verdict} for [(name, task_id, answer)], graded concurrently."""
    futures = {name: judge.submit(TASKS[task_id], answer) for name, task_id, answer in pairs}
    return {name: fut.result() for name, fut in futures.items()}


def _passed(verdict):
    return sorted(r.id for r in verdict.results if r.passed)


@pytest.mark.slow
@pytest.mark.parametrize("task_id", sorted(ATTACKS))
def test_forging_pays_nothing(judge, task_id):
    forged, plain = ATTACKS[task_id]()
    task_id = task_id.removesuffix("-ghosts")
    v = grade_all(judge, [("forged", task_id, forged), ("plain", task_id, plain)])
    forged, plain = v["forged"], v["plain"]
    assert forged is not None and forged.score is not None, "an attack must be graded, not dropped"
    assert forged.score <= plain.score, (forged.score, plain.score, _passed(forged), _passed(plain))


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


def test_the_answers_sql_cannot_touch_the_judges_files():
    # the database the answer's session talks to lives in the driver: SQL that would create or read files there
    # (ATTACH, VACUUM INTO) is refused, and the criterion fails
    target = os.path.join(tempfile.gettempdir(), f"minigrpo-attach-{os.getpid()}.db")
    attack = models() + f"""
from sqlalchemy import text


def top_customers(session, since, n=5):
    for sql in ("ATTACH DATABASE '{target}' AS loot", "VACUUM INTO '{target}'"):
        try:
            session.execute(text(sql))
        except Exception:
            pass
    return [("ann", Decimal("25.50")), ("bob", Decimal("25.50")), ("dan", Decimal("25.50"))]
"""
    task = TASKS["sqlalchemy-top-customers"]
    check = next(c["check"] for c in task["criteria"] if c["id"] == "c5")
    try:
        passed, reason = run_check(check, fenced(attack))
        assert passed is False, reason
        assert not os.path.exists(target)
    finally:
        if os.path.exists(target):
            os.unlink(target)
