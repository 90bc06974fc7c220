"""Hostile answer code graded through the judge is stopped or contained, and the same judge goes on grading.
(The sandbox's own properties are tested in tests/judge/sandbox/test_sandbox.py; attacks on real tasks in
test_attacks.py.)"""

import os
import socket

import pytest

from minigrpo.judge import make_judge
from minigrpo.judge.checks import sandbox_isolation

GOOD = "```python\ndef add(a, b):\n    return a + b\n```"
WEAK = sandbox_isolation()[1]


def task(test, **limits):
    return {"id": "t", "prompt": "write add(a, b)", "criteria": [
        {"id": "c1", "text": "passes the tests", "check": {"type": "python", "test": test, **limits}}]}


ADD_TASK = task("assert add(2, 3) == 5", timeout=5)


def grade(answer_code, test="pass", **limits):
    """Grade the hostile answer, then check that the same judge still grades a normal answer right."""
    judge = make_judge("local", workers=2)
    verdict = judge.grade(task(test, **{"timeout": 3, "memory_mb": 256, **limits}), f"```python\n{answer_code}\n```")
    assert judge.grade(ADD_TASK, GOOD).score == 1.0
    judge.close()
    return verdict.results[0]


def test_infinite_loop_is_stopped():
    # stopped by its 3 s CPU budget, not the last-resort wall ceiling (40 s): the reason says which, on any host,
    # where the wall time the 3 CPU seconds take is the host's load (8 s on a loaded 2-core box)
    result = grade("def add(a, b):\n    while True:\n        pass", "add(1, 2)")
    assert result.passed is False and "timed out: used its 3s of CPU" in result.reason, result.reason


def test_hang_at_import_is_stopped():
    result = grade("import time\ntime.sleep(60)", "pass")
    # the stall clock (no CPU progress for 3 s) ended it, not the sleep's end nor the wall ceiling
    assert result.passed is False and "stalled" in result.reason, result.reason


def test_unbounded_allocation_fails_the_case():
    result = grade("def add(a, b):\n    x = []\n    while True:\n        x.append(bytearray(1 << 24))",
                      "add(1, 2)", timeout=10)
    assert result.passed is False


def test_a_test_that_swallows_the_failure_still_fails():
    # the answer exits inside the call; the test catches everything and goes on: the case still fails
    result = grade("import os\ndef add(a, b):\n    os._exit(0)",
                      "try:\n    add(1, 2)\nexcept BaseException:\n    pass")
    assert result.passed is False and "exit" in result.reason


@pytest.mark.skipif(bool(WEAK), reason=f"weaker sandbox here: {WEAK}")
def test_parent_secret_is_not_readable(monkeypatch):
    secret = "hunter2-" + os.urandom(4).hex()
    monkeypatch.setenv("MINIGRPO_TEST_SECRET", secret)
    code = ("import glob, os\ndef leak():\n    found = list(os.environ.values())\n"
            "    for path in glob.glob('/proc/*/environ'):\n"
            "        try:\n            found.append(open(path, 'rb').read().decode(errors='ignore'))\n"
            "        except OSError:\n            pass\n    return '\\n'.join(found)\n")
    result = grade(code, f"assert {secret!r} not in leak()")
    assert result.passed is True and secret not in result.reason


@pytest.mark.skipif(bool(WEAK), reason=f"weaker sandbox here: {WEAK}")
def test_network_is_cut():
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    port = listener.getsockname()[1]
    code = (f"import socket\ndef reach():\n    try:\n        socket.create_connection(('127.0.0.1', {port}), "
            "timeout=1)\n        return True\n    except OSError:\n        return False\n")
    try:
        result = grade(code, "assert reach() is False")
    finally:
        listener.close()
    assert result.passed is True


def test_a_sandbox_ended_for_its_cpu_outside_the_watch_is_a_time_out(monkeypatch):
    """The broker's watchdog or the kernel's CPU rlimit can end a spinning answer before the driver's own watch
    looks (a loaded host): the reason is still the time-out, read from the sandbox's CPU, not 'exited'."""
    from minigrpo.judge import driver_answer
    monkeypatch.setattr(driver_answer, "WATCH_EVERY", 3600.0)      # the driver's watch never gets to look
    answer_read, judge_write = os.pipe()
    judge_read, answer_write = os.pipe()
    cpu = {"s": 0.0}

    class Broker:
        def ask(self, op, **fields):
            return ({"id": "s0"}, [answer_read, answer_write]) if op == "start" else ({"cpu": cpu["s"]}, [])

    answer = driver_answer.Answer(Broker(), 0, cpu_s=3.0)
    os.close(judge_write)           # the sandbox is gone: killed at its CPU limit, as its cgroup shows
    os.close(judge_read)
    cpu["s"] = 4.2
    with pytest.raises(driver_answer.CaseFatal, match="timed out: used its 3s of CPU"):
        answer.request("call", name="add", args=[], kwargs=[])
    answer.closed.set()
