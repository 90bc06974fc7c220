"""The driver's side of the boundary: no object of the driver is reachable from an answer, the test code runs with
the driver's own builtins, the driver itself is confined, and one hostile answer costs a bounded time.

Each attack is an answer to a real soyuz task, written as a policy would write it once it knew the judge: it must
score no more than the same code without the trick, and nothing it tries may land outside its sandbox."""

import json
import os
import subprocess
import time

import pytest

from judging import TASKS, fenced, needs_full_sandbox
from minigrpo.judge import make_judge
from repo_root import ROOT

MARK = "/tmp/minigrpo-boundary-mark"


def score(judge, task_id, code):
    v = judge.grade(TASKS[task_id], fenced(code))
    assert v is not None and v.score is not None
    return v.score


# What an answer that got hold of a driver frame would run there: every criterion's result set to a pass, and a
# mark on the host's /tmp.
ESCAPE = r'''
_PAYLOAD = ("import sys\nfor f in list(sys._current_frames().values()):\n    while f is not None:\n"
            "        if 'results' in f.f_locals and isinstance(f.f_locals['results'], list):\n"
            "            f.f_locals['results'].extend([[True, 'tests passed']] * 20)\n        f = f.f_back\n"
            "open('/tmp/minigrpo-boundary-mark', 'w').write('driver')\n")


def _escape(obj):
    chains = [("gi_frame",), ("gi_frame", "f_back"), ("f_back",), ("__self__",), ("__globals__",),
              ("__closure__",), ("__func__", "__globals__"), ("gi_code",), ("__class__",), ("_target",),
              ("__call__", "__self__")]
    for chain in chains:
        try:
            x = obj
            for name in chain:
                x = getattr(x, name)
            for key in ("f_builtins", "f_globals"):
                try:
                    getattr(x, key)["exec"](_PAYLOAD)
                except Exception:
                    pass
            try:
                x["__builtins__"]["exec"](_PAYLOAD)
            except Exception:
                pass
        except Exception:
            pass
'''

LOG_WRONG = '''
def parse_line(line):
    return None

def summarize(lines):
    {touch}
    return {{"requests": 0, "malformed": 0, "status": {{}}, "bytes": 0, "top_paths": []}}
'''


def test_a_handed_generator_gives_no_driver_frame(judge):
    if os.path.exists(MARK):
        os.remove(MARK)
    plain = score(judge, "regex-log-parser", LOG_WRONG.format(touch="pass"))
    attack = ESCAPE + LOG_WRONG.format(touch="_escape(lines)")
    assert score(judge, "regex-log-parser", attack) <= plain
    assert not os.path.exists(MARK)


SQL_WRONG = '''
def find_user(conn, username):
    {touch}
    return None

def search_products(conn, term, max_price):
    return []

def list_users(conn, order_by="username"):
    raise ValueError(order_by)
'''


def test_a_database_stand_in_gives_no_driver_object(judge):
    touch = ("_escape(conn)\n    _escape(conn.execute)\n"
             "    for sql in (\"ATTACH DATABASE '/tmp/minigrpo-boundary-mark' AS x\", 'PRAGMA writable_schema=1'):\n"
             "        try:\n            conn.execute(sql)\n        except Exception:\n            pass\n"
             "    try:\n        _escape(conn.execute('SELECT 1'))\n    except Exception:\n        pass")
    plain = score(judge, "sql-injection-fix", SQL_WRONG.format(touch="pass"))
    assert score(judge, "sql-injection-fix", ESCAPE + SQL_WRONG.format(touch=touch)) <= plain
    assert not os.path.exists(MARK)


def test_builtins_listed_in_all_are_not_the_tests_builtins(judge):
    # if the test ran with these builtins, every comparison and len() in it would be the answer's
    trick = '''
import builtins as _b
__builtins__ = dict(vars(_b), len=lambda x: 4, isinstance=lambda *a: True, AssertionError=KeyError)
__all__ = ["__builtins__", "parse_line", "summarize"]
'''
    plain = score(judge, "regex-log-parser", LOG_WRONG.format(touch="pass"))
    assert score(judge, "regex-log-parser", trick + LOG_WRONG.format(touch="pass")) <= plain
    names = '''
__all__ = ["__builtins__", "__class__", "1bad", "class", "parse_line", "summarize"]
'''
    assert score(judge, "regex-log-parser", names + LOG_WRONG.format(touch="pass")) == plain


def test_a_callback_serves_no_attribute(judge):
    # weighted-choice hands the answer an rng stand-in whose random() is the driver's: counted there
    attack = ESCAPE + '''
class WeightedSampler:
    def __init__(self, items, weights):
        self.items = list(items)
    def sample(self, rng):
        _escape(rng)
        _escape(rng.random)
        return self.items[-1]
    def sample_many(self, rng, k):
        return [self.sample(rng) for _ in range(k)]
'''
    plain = attack.replace("_escape(rng)\n        _escape(rng.random)\n", "")
    assert score(judge, "weighted-choice", attack) <= score(judge, "weighted-choice", plain)
    assert not os.path.exists(MARK)


# -- the driver itself is confined -------------------------------------------------------------------------------

def _probe_task(test):
    return {"id": "driver-probe", "prompt": "p", "criteria": [
        {"id": "c1", "text": "t", "check": {"type": "python", "test": test, "timeout": 5}}]}


@needs_full_sandbox
def test_the_driver_runs_confined(judge, monkeypatch, tmp_path):
    """The test code runs in the driver: what it can see there is what code that took the driver over could."""
    monkeypatch.setenv("MINIGRPO_JUDGE_SECRET", "s3cret")
    secret = tmp_path / "judge-secret.txt"      # a file of the judge's, in its temp folder
    secret.write_text("s3cret")
    test = f'''
import os
assert os.getuid() != 0 and os.geteuid() != 0
for name in ("README.md", "minigrpo/data/soyuz_tasks.json", "minigrpo/judge/driver.py"):    # a venv inside the
    assert not os.path.exists(os.path.join({ROOT!r}, name)), name      # checkout is bound, nothing else of it
assert "MINIGRPO_JUDGE_SECRET" not in os.environ
assert not os.path.exists({str(secret)!r})
assert not os.path.exists({os.path.expanduser("~/.gitconfig")!r})
for path in ({os.path.join(ROOT, "minigrpo", "judge", "driver.py")!r}, "/tmp/minigrpo-boundary-mark", "/etc/motd-x"):
    try:
        open(path, "w").write("x")
    except OSError:
        pass
'''
    before = subprocess.run(["git", "status", "--porcelain"], cwd=ROOT, capture_output=True, text=True).stdout
    v = make_judge("local", workers=1).grade(_probe_task(test), fenced("X = 1"))
    assert v.results[0].passed is True, v.results[0].reason
    assert not os.path.exists(MARK)
    after = subprocess.run(["git", "status", "--porcelain"], cwd=ROOT, capture_output=True, text=True).stdout
    assert after == before


@needs_full_sandbox
def test_a_driver_that_fills_its_memory_fails_its_criteria_and_the_judge_goes_on(judge):
    # the answer hands 10 MB strings, one per call, to a list's append the test gave it: they pile up in the driver
    test = "acc = []\npour(acc.append)\nassert len(acc) == 200\n"
    task = {"id": "pour", "prompt": "p", "criteria": [
        {"id": "c1", "text": "t", "check": {"type": "python", "test": test, "timeout": 20}}]}
    answer = "def pour(cb):\n    s = 'x' * (10 << 20)\n    for i in range(200):\n        cb(s + str(i))"
    v = judge.grade(task, fenced(answer))
    assert v.results[0].passed is False
    ok = judge.grade(TASKS["interval-merge"], open(os.path.join(ROOT, "tests", "data", "soyuz",
                                                                 "interval-merge.good.md")).read())
    assert ok.score == 1.0


# -- one hostile answer costs a bounded time ----------------------------------------------------------------------

# interval-merge has 10 python criteria of up to 6 s each. Without a limit per answer, a sleeper would cost a stall
# per criterion (10 x 3 s, ~40 s with the starts) and a spinner 10 x 6 s of CPU. A module that does not finish
# importing (it stalls, or its top-level code spins past IMPORT_CPU_S) fails that criterion and the rest at once.
@pytest.mark.parametrize("attack", ["import time\ntime.sleep(600)", "import threading\nthreading.Event().wait()",
                                    "while True:\n    pass"], ids=["sleep", "block", "spin"])
def test_an_answer_that_never_imports_costs_one_criterion(judge, attack):
    from minigrpo.judge.driver import IMPORT_CPU_S, NOT_IMPORTED
    v = judge.grade(TASKS["interval-merge"], fenced(attack))
    assert v.score == 0.0
    first, *rest = [r.reason for r in v.results if r.passed is False]
    assert rest and all(r == NOT_IMPORTED for r in rest), rest
    if "pass" in attack:
        assert first.startswith(f"timed out: its module's top-level code used over {IMPORT_CPU_S:g}s of CPU"), first
    else:                       # a stall (3 s of neither running nor waiting for a CPU), long before the ceiling
        assert first.startswith("stalled"), first


# A module that imports but whose function spins or sleeps: each criterion it fails costs its timeout, until the
# timeouts add up to ANSWER_BUDGET x the largest one; the rest fail at once, and are not run.
@pytest.mark.parametrize("body", ["while True:\n        pass", "import time\n    time.sleep(600)"],
                         ids=["spin", "sleep"])
def test_an_answer_that_never_returns_costs_a_budget_not_a_timeout_per_criterion(judge, body):
    from minigrpo.judge.driver import ANSWER_BUDGET
    timeouts = [c["check"].get("timeout", 10.0) for c in TASKS["interval-merge"]["criteria"]
                if (c.get("check") or {}).get("type") == "python"]
    budget, expected = ANSWER_BUDGET * max(timeouts), 0
    while budget > 0.05:
        budget -= timeouts[expected]
        expected += 1
    v = judge.grade(TASKS["interval-merge"], fenced(f"def merge_intervals(intervals):\n    {body}"))
    assert v.score == 0.0
    ran = [r.reason for r in v.results if r.passed is False and "spent its time budget" not in r.reason]
    assert len(ran) == expected < len(timeouts), [r.reason for r in v.results]


# -- the rules one at a time ---------------------------------------------------------------------------------------

def test_only_public_identifiers_cross():
    from minigrpo.judge.driver import public_names
    names = {"__builtins__": 1, "__class__": 2, "_private": 3, "1bad": 4, "class": 5, "a b": 6, "ok": 7, 8: 9}
    assert public_names(names) == {"ok": 7}
    assert public_names(["not", "a", "dict"]) is None


def _one(test):
    return {"id": "t", "prompt": "p", "criteria": [
        {"id": "c1", "text": "t", "check": {"type": "python", "test": test, "timeout": 5}}]}


def test_a_test_object_crosses_only_as_a_stand_in(judge):
    answer = fenced("def f(obj):\n    return obj.x")
    handed = judge.grade(_one("class Thing:\n    x = 1\nassert f(Thing()) == 1"), answer).results[0]
    assert handed.passed is False and "cannot be handed" not in handed.reason    # the reason quotes no test
    # refused at the hand-over itself, not only when the answer touches it
    ignores = fenced("def f(obj):\n    return 1")
    assert judge.grade(_one("class Thing:\n    x = 1\nassert f(Thing()) == 1"), ignores).score == 0.0
    assert judge.grade(_one("assert f(stand_in(x=1)) == 1"), answer).score == 1.0
    # a stand-in's function member is call-only: the answer gets no attribute of it
    probe = fenced("def f(obj):\n    try:\n        return obj.get.__self__\n    except AttributeError:\n"
                   "        return 'refused'")
    assert judge.grade(_one("d = {'k': 1}\nassert f(stand_in(get=d.get)) == 'refused'"), probe).score == 1.0


def test_the_sqlite_stand_in_refuses_files_and_settings():
    import sqlite3
    from minigrpo.judge.standins import sqlite_stand_in
    conn = sqlite3.connect(":memory:")
    conn.execute("CREATE TABLE t (x)")
    db = sqlite_stand_in(conn)
    db.execute("INSERT INTO t VALUES (?)", (1,))
    assert db.execute("SELECT x FROM t").fetchall() == [(1,)]
    for sql in (f"ATTACH DATABASE '{MARK}' AS other", "PRAGMA writable_schema = 1", "SELECT load_extension('x')"):
        with pytest.raises(sqlite3.DatabaseError):
            db.execute(sql)
    assert not os.path.exists(MARK)


def test_the_broker_holds_its_own_limits():
    """The broker serves a driver it does not trust: limits come from its own copy of the check (a driver may only
    lower them), each criterion starts once, and a sandbox past its limits is killed without the driver's help."""
    import socket
    from minigrpo.judge import wire
    from minigrpo.judge.driver_host import Broker
    parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    checks = [{"type": "python", "test": "pass", "timeout": 1}, {"type": "python", "test": "pass", "timeout": 1}]
    broker = Broker(parent, "while True:\n    pass\n", checks)
    broker.start()

    def ask(**request):
        child.send(json.dumps(request).encode())
        data, fds, _, _ = socket.recv_fds(child, 65536, 2)
        return json.loads(data), fds

    try:
        reply, fds = ask(op="start", criterion=0, cpu_s=1000)
        assert len(fds) == 2
        sandbox = broker.live[reply["id"]]
        assert sandbox.limits.cpu_budget == 1.0                  # the check's own timeout, not the driver's 1000
        assert "error" in ask(op="start", criterion=0)[0]        # once
        assert "error" in ask(op="start", criterion=5)[0]        # no such criterion
        assert "error" in ask(op="start", criterion=1, role="implementation")[0]   # the check has none
        assert "error" in ask(op="cpu", id="s9-answer")[0]
        writer = os.fdopen(fds[1], "wb", buffering=0)
        wire.send_message(writer, {"op": "import", "sync": []})   # the answer imports, and spins
        t0 = time.monotonic()
        while sandbox.alive() and time.monotonic() - t0 < 20:
            time.sleep(0.1)
        assert not sandbox.alive(), "the broker let a sandbox run past its limits"
        os.close(fds[0])
        writer.close()
    finally:
        child.close()
        broker.close()


def test_the_judge_passes_on_only_the_reasons_a_driver_gives():
    # a driver that was taken over could write a hidden test into a reason, and the soyuz critique quotes reasons
    from minigrpo.judge.driver_host import parse_results
    test_line = 'assert compare_versions("1.0.0-alpha", "1.0.0") == -1'
    lines = [[False, test_line], [False, "assertion failed at line 3"],
             [False, "the answer's reply is not plain data (" + test_line + ")"], [True, "tests passed"]]
    out = "\n".join(json.dumps({"result": r}) for r in lines).encode()
    reasons = [r for _, r in parse_results(out + b"\na print of the test's\n", 5)]
    assert not any("compare_versions" in r for r in reasons), reasons
    assert reasons[1] == "assertion failed at line 3" and reasons[3] == "tests passed"
    assert reasons[4].startswith("the check driver stopped")     # a driver killed on the way keeps what it printed
    with pytest.raises(ValueError):
        parse_results(json.dumps({"result": [1, "tests passed"]}).encode(), 1)    # 1 is not a bool
    with pytest.raises(ValueError):
        parse_results(out, 3)                                                       # more results than criteria


def test_a_stuck_driver_is_killed_and_keeps_what_it_finished(judge):
    # what a forged reply that takes forever to decode, or a query that never returns, would do to the driver. The
    # stuck clock runs from c2's sandbox's wall ceiling, so half a CPU second (wall_ceiling(0.5) = 15 s, not 30)
    # keeps the wait short; f() spends a few hundredths of it
    task = {"id": "stuck", "prompt": "p", "criteria": [
        {"id": "c1", "text": "t", "check": {"type": "python", "test": "assert f() == 1", "timeout": 0.5}},
        {"id": "c2", "text": "t", "check": {"type": "python", "test": "f()\nwhile True:\n    pass", "timeout": 0.5}},
        {"id": "c3", "text": "t", "check": {"type": "python", "test": "assert f() == 1", "timeout": 0.5}}]}
    t0 = time.monotonic()
    v = judge.grade(task, fenced("def f():\n    return 1"))
    from minigrpo.judge.driver_answer import wall_ceiling
    from minigrpo.judge.driver_host import STUCK_SLACK
    assert time.monotonic() - t0 < wall_ceiling(0.5) + 1 + STUCK_SLACK + 15
    assert [r.passed for r in v.results] == [True, False, False]
    assert v.results[2].reason.startswith("the check driver stopped"), v.results[2].reason
