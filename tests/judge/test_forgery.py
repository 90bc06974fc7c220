"""Answers that forge what a harness snippet counts or records, written as an adversary who read the task file's
harness snippets.

The answer shares its process with any harness code run beside it (in_sandbox): it can patch modules at import,
reach a snippet's globals through a callback's __globals__ or sys._getframe(), and rewrite whatever the snippet
counts or records. So no criterion may be decided by such a record: each forger below targets the records the
snippets used to keep (a peak counter, a statements list, a calls list, a spy's closed flags) and the harness that
replaced them (ghost requests to the driver's server). Each must score no more than the same code without the
trick; the criteria that cannot be observed from outside are left to the LLM grader (evidence=answer) and so are
worth nothing to a forger in local mode. Forgeries of the harness's clock, event loop and implementation under
test: tests/judge/test_forgery_harness.py.
"""

import os
import tempfile

import pytest

from judging import TASKS, assert_forgery_pays_nothing, fenced
from minigrpo.judge.checks import run_check



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


ATTACKS = {      # task (a suffix names a second attack on it): () -> (forged answer, the same code without the trick)
    "asyncio-bounded-fetch": fetch_answers,
    "asyncio-bounded-fetch-ghosts": fetch_ghost_answers,
    "sqlalchemy-top-customers": sql_answers,
    "requests-retry-session": requests_answers,
    "file-handle-leak-fix": leak_answers,
}


@pytest.mark.slow
@pytest.mark.parametrize("task_id", sorted(ATTACKS))
def test_forging_pays_nothing(judge, task_id):
    forged, plain = ATTACKS[task_id]()
    assert_forgery_pays_nothing(judge, task_id.removesuffix("-ghosts"), forged, plain)



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
