"""Hostile answer code run by the local judge's python checks is stopped or contained, and the judge goes on."""

import os
import socket
import subprocess
import time

import pytest

from minigrpo import checks
from minigrpo.judge import make_judge

TEST = "from solution import *\n"
GOOD = "```python\ndef add(a, b):\n    return a + b\n```"


def task(test, **limits):
    return {"id": "t", "prompt": "write add(a, b)", "criteria": [
        {"id": "c1", "text": "passes the tests", "check": {"type": "python", "test": TEST + test, **limits}}]}


ADD_TASK = task("assert add(2, 3) == 5", timeout=5)


def grade(answer_code, test="pass", **limits):
    """Grade the hostile answer, then check that the same judge still grades a normal answer right."""
    judge = make_judge("local", workers=2)
    t0 = time.monotonic()
    verdict = judge.grade(task(test, **{"timeout": 2, "memory_mb": 256, **limits}), f"```python\n{answer_code}\n```")
    elapsed = time.monotonic() - t0
    assert judge.grade(ADD_TASK, GOOD).score == 1.0
    return verdict.results[0], elapsed


def weak():
    return checks._isolation()[1]


def test_infinite_loop_is_stopped():
    result, elapsed = grade("while True:\n    pass")
    assert result.passed is False and "timed out" in result.reason and elapsed < 6


@pytest.mark.skipif(bool(checks._isolation()[1]), reason="the process-count limit does not bind here (weaker "
                    "sandbox): a fork bomb would load the whole machine")
def test_fork_bomb_is_stopped():
    result, elapsed = grade("import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass",
                            nproc=32)
    assert result.passed is False and elapsed < 8
    deadline = time.monotonic() + 3
    while (left := _sandboxed_processes()) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not left, f"fork-bomb processes survived: {left}"


def _sandboxed_processes():
    """pids whose command line is our sandbox runner (it names check_test.py)."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read()
            with open(f"/proc/{pid}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if b"runpy.run_path" in cmd and b"check_test.py" in cmd and state != "Z":
            found.append(int(pid))
    return found


def test_unbounded_allocation_is_stopped():
    result, elapsed = grade("x = []\nwhile True:\n    x.append(bytearray(1 << 24))", memory_mb=256, timeout=10)
    assert result.passed is False and "MemoryError" in result.reason and elapsed < 8   # the rlimit, not the clock


def test_writes_outside_its_folder_are_contained(tmp_path):
    tmp_path.chmod(0o700)
    target = tmp_path / "escaped.txt"
    code = ("import os\n"
            "for path in [%r, '../escaped.txt', os.path.expanduser('~/../escaped2.txt')]:\n"
            "    try:\n        open(path, 'w').write('pwned')\n    except OSError:\n        pass\n"
            "open('inside.txt', 'w').write('fine')\n" % str(target))
    result, _ = grade(code, "import os\nassert os.path.exists('inside.txt')")
    assert result.passed is True                 # it ran, and could write inside its own folder
    if any("root" in w for w in weak()):
        pytest.skip("sandbox runs as root here: it can write wherever root can")
    assert not target.exists()
    assert not [name for name in os.listdir(checks._sandbox_base()) if name.startswith("escaped")]


def test_parent_secret_is_not_readable(monkeypatch):
    # The secret is in our environment (inherited unless scrubbed) and in the start-up environment of a running
    # process (readable in /proc/PID/environ by its user: root here, like a trainer holding an API key).
    secret = "hunter2-" + os.urandom(4).hex()
    monkeypatch.setenv("MINIGRPO_TEST_SECRET", secret)
    as_root = any("root" in w for w in weak())    # then it reads any /proc/PID/environ: test the scrub only
    holder = None if as_root else subprocess.Popen(["sleep", "30"], env={**os.environ})
    try:
        result, _ = grade(LEAK, f"assert {secret!r} in leak(), 'no secret'")
    finally:
        if holder:
            holder.kill()
            holder.wait()
    assert result.passed is False and "no secret" in result.reason and secret not in result.reason


LEAK = ("import glob, os\n"
        "def leak():\n"
        "    found = list(os.environ.values())\n"
        "    for path in glob.glob('/proc/*/environ') + ['/proc/%d/environ' % os.getppid()]:\n"
        "        try:\n            found.append(open(path, 'rb').read().decode(errors='ignore'))\n"
        "        except OSError:\n            pass\n"
        "    return '\\n'.join(found)\n")


def test_network_is_cut_or_reported():
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    port = listener.getsockname()[1]
    code = f"import socket\ndef reach():\n    return socket.create_connection(('127.0.0.1', {port}), timeout=1)\n"
    try:
        result, _ = grade(code, "reach()")
    finally:
        listener.close()
    if "network not cut" in weak():
        assert "weaker sandbox: network not cut" in result.reason
    else:
        assert result.passed is False and "weaker" not in result.reason
