"""Red-team answers against the local judge that go for its trust boundary: what an answer can make the (confined)
driver spend, and what its reasons quote; and attacks that were tried and failed (kept so that they stay failed).
Each test PASSES when the judge holds (the attack scores no more than the same code without the trick, or nothing
crosses) and FAILS while the attack works. The other red-team groups: tests/judge/test_redteam_kernel_keys.py,
test_redteam_in_sandbox.py.
"""

import time

import pytest

from judging import TASKS, fenced, needs_full_sandbox
from minigrpo.judge.checks import run_check
from redteam import custom_task, explain, grade, passed


# =================================================================================================================
# The driver: what an answer can make it spend, and what its reasons quote
# =================================================================================================================

FORGED_FRACTION = '''
import json, os, struct, time


def f(x):
    if x == 1:
        # 30 bytes on the channel: a "reply" whose decoding is Fraction("1e30000000"), i.e. 10 ** 30000000, computed
        # in the driver with the GIL held (its own watch thread cannot even run)
        data = json.dumps({"ok": ["frac", "1e30000000"], "sync": []}).encode()
        for fd in range(3, 12):
            try:
                os.write(fd, struct.pack(">I", len(data)) + data)
            except OSError:
                pass
        time.sleep(60)
    return x
'''

SQL_SPIN = '''
def f(db, x):
    if x == 1:
        db.execute("WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT count(*) FROM c")
    return x
'''


@pytest.mark.parametrize("code, tests", [
    (FORGED_FRACTION, ["assert f(1) == 1", "assert f(2) == 2"]),
    (SQL_SPIN, ["import sqlite3\ndb = sqlite_stand_in(sqlite3.connect(':memory:'))\nassert f(db, 1) == 1",
                "import sqlite3\ndb = sqlite_stand_in(sqlite3.connect(':memory:'))\nassert f(db, 2) == 2"]),
], ids=["forged_fraction_reply", "sql_through_the_stand_in"])
def test_work_the_answer_makes_the_driver_do_is_bounded(judge, code, tests):
    """One time budget per answer: an answer that makes the driver itself compute (decoding a forged reply, running
    its SQL on the test's database) must cost about its criterion, not wedge the driver until the judge kills it
    (the whole driver limit: 26 s here, 170 s for sql-injection-fix's eight criteria) and fail the honest rest."""
    t0 = time.monotonic()
    v = judge.grade(custom_task(tests, timeout=1.0), fenced(code))
    elapsed = time.monotonic() - t0
    assert passed(v)["c2"] is True, (round(elapsed, 1), explain(v))


LEAK = '''
import builtins as _b, json as _j, os as _os, struct as _s
_real_compile = _b.compile


def _compile(source, filename, mode, *args, **kwargs):
    if filename == "<harness>":
        line = next((l.strip() for l in source.splitlines() if "TokenBucket(" in l), "none")
        data = _j.dumps({"ok": [line[:20]], "sync": []}).encode()     # a value tag the driver cannot read
        for fd in range(3, 12):
            try:
                _os.write(fd, _s.pack(">I", len(data)) + data)
            except OSError:
                pass
        _os._exit(0)
    return _real_compile(source, filename, mode, *args, **kwargs)


_b.compile = _compile


class TokenBucket:
    pass
'''


def test_no_reason_carries_text_the_answer_chose(judge):
    """A python criterion's reason is quoted to the policy in the second turn (soyuz.critique). The answer reads the
    hidden snippet and sends a reply whose "value tag" is 20 characters of it: the driver's ProtocolError quotes the
    tag, so hidden test text reaches the reason."""
    v = grade(judge, "token-bucket", LEAK, ["c8"])
    hidden = next(c["check"]["test"] for c in TASKS["token-bucket"]["criteria"] if c["id"] == "c8")
    pieces = {hidden[i:i + 12] for i in range(len(hidden) - 12) if hidden[i:i + 12].strip()}
    leaked = [r.reason for r in v.results if any(p in r.reason for p in pieces)]
    assert not leaked, leaked


# =================================================================================================================
# Held: tried, and the judge held
# =================================================================================================================

def _found_then_correct(condition):
    """An interval-merge answer that is right only when `condition` (evaluated in the sandbox at import) is true."""
    return f'''
import glob, os
FOUND = bool({condition})


def merge_intervals(intervals):
    out = []
    for s, e in sorted((a, b) for a, b in intervals):
        if s > e:
            raise ValueError("start after end")
        if out and s <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], e))
        else:
            out.append((s, e))
    return out if FOUND else []
'''


@needs_full_sandbox
@pytest.mark.parametrize("condition", [
    # a process other than the answer's own and its namespace's pid 1 (bwrap): the driver, a neighbour, the judge
    "[p for p in os.listdir('/proc') if p.isdigit() and p != '1' and os.stat('/proc/' + p).st_uid != os.getuid()]",
    # the driver's own files (its bytecode, its copy of the answer)
    "os.path.exists('/sandbox/driver.bin') or glob.glob('/tmp/*/driver.bin') or glob.glob('/sandbox/*/driver.bin')",
    # the uid pool's lock files, the judge's cgroups
    "os.path.exists('/run/minigrpo-sandbox') or os.path.exists('/sys/fs/cgroup')",
], ids=["other_processes", "driver_files", "pool_and_cgroups"])
def test_nothing_of_the_driver_or_the_host_is_in_view(judge, condition):
    v = grade(judge, "interval-merge", _found_then_correct(condition), ["c2"])
    assert v.score == 0.0, explain(v)


def test_found_then_correct_passes_when_it_finds(judge):
    """The control of the test above: the same answer scores when its condition holds."""
    assert grade(judge, "interval-merge", _found_then_correct("True"), ["c2"]).score == 1.0


def test_object_dtypes_never_decode_from_raw_bytes():
    """A numpy array of dtype object read from the answer's bytes would be pointers the answer chose."""
    pytest.importorskip("numpy")
    from minigrpo.judge import wire
    codec = wire.Codec("d", lambda *a: None, call_only=True)
    raw = "AAAAAAAAAAAAAAAAAAAAAA=="
    for e in (["nd", "O", [1], raw], ["nd", "O,i4", [1], raw], ["nd", "(1,)O", [1], raw], ["np", "O", raw],
              ["nd", {"names": ["a"], "formats": ["O"]}, [1], raw], ["np", [["a", "O"]], raw]):
        with pytest.raises(wire.ProtocolError):
            codec.decode(e)


def test_an_answers_exception_class_cannot_name_a_driver_object():
    """An exception reply may carry a handle to its class; one naming a driver object (a callback the test handed
    over) must not be raised, or called, as that object."""
    from minigrpo.judge.driver_answer import DriverEndpoint
    calls = []
    endpoint = DriverEndpoint(None, None, lambda *a: None, None)
    ref = endpoint.codec.encode(lambda *a: calls.append(a))       # a callback of the test's, as the answer sees it
    exc = endpoint.exception("AssertionError", "AssertionError", "x", ref)
    assert not calls and type(exc) is AssertionError


@pytest.mark.parametrize("text", [
    "\n" + " " * 60000,
    "\n " * 30000,
    "a-" * 30000,
    ("word " * 10 + ". ") * 1200,
    "’-" * 30000,
    "```python\nx = " + "a if b else " * 5000 + "c\n```",
    "```python\nf(" + "*a, " * 12000 + ")\n```",
])
def test_text_checks_stay_fast_on_adversarial_text(text):
    checks = [{"type": "count", "unit": u, "min": 1} for u in ("words", "lines", "sentences", "chars", "paragraphs")]
    checks += [{"type": "syllables", "lines": [5, 7, 5]}, {"type": "rhyme", "scheme": "AABBA"},
               {"type": "contains", "all": ["server room", "deploy"]}, {"type": "json"}, {"type": "code_block"}]
    t0 = time.process_time()
    for c in checks:
        assert run_check(c, text)[0] in (True, False)
    assert time.process_time() - t0 < 5.0
