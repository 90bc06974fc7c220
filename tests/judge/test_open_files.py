"""What an answer holds open is read by the judge in the host's /proc, never reported by the answer: the sandbox's
`open_files()` (minigrpo/judge/sandbox/procs.py), the driver's `open_files` helper, and file-handle-leak-fix's
closing criteria (c2-c5) that use it. A leak under another name (a hard link) or in a child process is the same
leak; an honest answer that closes its files passes."""

import os
import threading
import time

import pytest

from judging import TASKS, fenced, needs_full_sandbox, reference
from minigrpo.judge.opens import OpenWatch
from minigrpo.judge.sandbox import Limits, Sandbox

HOLD = """
import os, sys
os.makedirs("d", exist_ok=True)
for name in ("kept", "closed", "linked", "child"):
    with open(os.path.join("d", name), "w") as f:
        f.write(name)
kept = open("d/kept")
open("d/closed").close()
os.link("d/linked", "d/alias")
alias = open("d/alias")                    # the file 'linked', reached by another name
if os.fork() == 0:                          # a child holds 'child'; the parent does not
    held = open("d/child")
    sys.stdout.write("ready\\n")
    sys.stdout.flush()
    os.read(os.pipe()[0], 1)
else:
    ids = {n: "%d:%d" % (os.stat("d/" + n).st_dev, os.stat("d/" + n).st_ino)
           for n in ("kept", "closed", "linked", "child")}
    sys.stdout.write(repr(ids) + "\\n")
    sys.stdout.flush()
    os.read(os.pipe()[0], 1)
"""


def test_an_open_of_a_watched_file_waits_for_the_look(tmp_path):
    """The look runs while the open is held (the opener has not got its file yet), once per open."""
    path = tmp_path / "log"
    path.write_text("x")
    returned = []

    def look():
        time.sleep(0.2)             # time for an opener let through early to get its file
        return ["returned" if returned else "waiting"]
    try:
        watch = OpenWatch([str(path)], look)
    except OSError as e:
        pytest.skip(f"no fanotify permission events here: {e}")
    try:
        def opener():
            for _ in range(2):
                with open(path) as f:
                    returned.append(f.read())
        t = threading.Thread(target=opener)
        t.start()
        t.join(10)
    finally:
        watch.close()
    st = os.stat(path)
    assert returned == ["x", "x"]
    assert watch.looks == [[f"{st.st_dev}:{st.st_ino}", ["waiting"]], [f"{st.st_dev}:{st.st_ino}", ["returned"]]]


@needs_full_sandbox
def test_the_sandbox_lists_the_files_its_processes_hold():
    with Sandbox({}, Limits(timeout=30)) as sb:
        proc = sb.start(python_source=HOLD)
        lines = sorted([proc.stdout.readline(), proc.stdout.readline()])
        ids = eval(lines[1] if lines[0].startswith(b"ready") else lines[0])     # noqa: S307 - our own payload
        held = set(sb.open_files())
    assert {ids["kept"], ids["linked"], ids["child"]} <= held, (ids, held)
    assert ids["closed"] not in held


# -- file-handle-leak-fix ----------------------------------------------------------------------------------------

CLOSING = ["c2", "c3", "c4", "c5"]

GOOD = '''
import json


def count_errors(paths):
    counts = {}
    for p in paths:
        with open(p, encoding="utf-8") as f:
            counts[p] = sum(1 for line in f if "ERROR" in line)
    return counts


def load_config(path):
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def append_log(path, message):
    with open(path, "a", encoding="utf-8") as f:
        f.write(message + "\\n")
'''

# every file kept open in a list, each reached by a hard link of its own: the judge sees the file, not the name
LINKED = GOOD.replace('''        with open(p, encoding="utf-8") as f:
            counts[p] = sum(1 for line in f if "ERROR" in line)''', '''        import os
        alias = p + ".alias"
        os.link(p, alias)
        f = open(alias, encoding="utf-8")
        _KEPT.append(f)
        counts[p] = sum(1 for line in f if "ERROR" in line)''').replace('''    with open(path, encoding="utf-8") as f:
        return json.load(f)''', '''    f = open(path, encoding="utf-8")
    _KEPT.append(f)
    return json.load(f)''') + "\n_KEPT = []\n"

# the parent closes every file; a child it forks first keeps each one open (opened before the parent goes on)
IN_A_CHILD = GOOD.replace('''    with open(path, encoding="utf-8") as f:
        return json.load(f)''', '''    _hold_in_child(path)
    with open(path, encoding="utf-8") as f:
        return json.load(f)''').replace('''    for p in paths:
        with open''', '''    for p in paths:
        _hold_in_child(p)
        with open''') + '''

def _hold_in_child(path):
    import os
    r, w = os.pipe()
    if os.fork() == 0:
        held = open(path, encoding="utf-8")
        os.write(w, b"x")
        os.read(os.pipe()[0], 1)
    os.read(r, 1)
'''


def closing_only():
    task = TASKS["file-handle-leak-fix"]
    return dict(task, criteria=[c for c in task["criteria"] if c["id"] in CLOSING])


def closing(verdict):
    return {r.id: r.passed for r in verdict.results}


@needs_full_sandbox
def test_closing_is_seen_from_outside(judge):
    task = closing_only()
    futures = {name: judge.submit(task, answer) for name, answer in [
        ("reference", reference("file-handle-leak-fix")), ("good", fenced(GOOD)),
        ("linked", fenced(LINKED)), ("child", fenced(IN_A_CHILD))]}
    got = {name: closing(f.result()) for name, f in futures.items()}
    assert got["reference"] == got["good"] == dict.fromkeys(CLOSING, True), got
    # a leak under another name or in a child: count_errors (c2) and load_config (c4) keep files
    for name in ("linked", "child"):
        assert got[name]["c2"] is False and got[name]["c4"] is False, (name, got[name])
