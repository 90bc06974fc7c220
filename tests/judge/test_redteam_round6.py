"""A sixth red team against the local judge, after source inspection stopped paying, closing came to be observed
from the host's /proc and the stall clock came to count the answer's own progress. Each test asserts the secure
behaviour, so it FAILS while the attack works; `works(reason)` marks such a test a strict xfail on AssertionError
until the judge or the task file is fixed. The control (the same answer without the trick) is graded beside the
attack and must itself be graded.

Groups:
  harness in the answer's process   a criterion that built its input with an `in_sandbox` snippet ran that
                                    snippet in the answer's process, with the answer's module globals and builtins:
                                    the answer decided what the input was (a shadowed or patched `open` wrote a few
                                    KB where the harness wrote 24 or 56 MB) and read what the harness knew (the
                                    expected count, from its caller's frame), and the memory criteria paid for code
                                    that reads whole files. Fixed: the judge makes the input files before the
                                    answer's process exists (a check's `inputs`, minigrpo/judge/inputs.py).
  before the budget                 the same, for a CPU budget: work done on the inputs as the harness makes them,
                                    before its budget starts, was free (fixed in vectorize-loop-fix c8).
  look when asked                   file-handle-leak-fix's closing criterion looked at the open files only when
                                    the answer asked for its next path: take them all first and it never looked
                                    mid-loop. Fixed: it looks at each open of a log, while the open waits.
  sleep and spin                    an answer that sleeps 2.5 s and spins 2 ms, forever, made "progress" at each
                                    look of the stall clock, and only the last-resort wall ceiling (10 x the CPU
                                    limit + 10 s) ended it (fixed: the stall clock asks for a share of the
                                    window). A vfork parent waiting in D on its child still holds it there.
  held                              what was tried and failed, kept so that it stays failed.
"""

import pytest

from judging import TASKS, fenced, grade_all, reference
from minigrpo.judge import opens
from minigrpo.judge.answer_code import extract_code
from redteam import custom_task, explain


def works(reason):
    """The mark of an attack that works today: its assertion of the secure behaviour fails."""
    return pytest.mark.xfail(strict=True, raises=AssertionError, reason=reason)


def assert_no_more_than_control(judge, task_id, attack, control):
    got = grade_all(judge, [("attack", task_id, fenced(attack)), ("control", task_id, fenced(control))])
    attack, control = got["attack"], got["control"]
    if control is None or control.score is None:
        raise RuntimeError(f"control not graded: {control}")     # not an AssertionError: a real failure
    assert attack is not None and attack.score is not None, "an attack must be graded, not dropped"
    assert attack.score <= control.score, (attack.score, control.score, explain(attack))


# =================================================================================================================
# Harness in the answer's process. file-handle-leak-fix: the reference with `readlines()` (honest, not streaming)
# fails only c7, "streams large logs in bounded memory", and c1 beside it: 0.667. Each attack below is that same
# answer plus a trick; each scored 1.0 while a snippet in the answer's process wrote the log.

READLINES = '''
import json


def count_errors(paths):
    counts = {}
    for path in paths:
        with open(path, encoding="utf-8") as f:
            counts[path] = sum(1 for line in f.readlines() if "ERROR" in line)
    return counts


def load_config(path):
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def append_log(path, message):
    with open(path, "a", encoding="utf-8") as f:
        f.write(message + "\\n")
'''

# The harness writes its 24 MB log with `open(p, "w")`, resolved in the answer's module globals (the snippet's scope
# is a copy of them): a module-level `open` that drops the INFO/DEBUG/WARN lines leaves a log of a few hundred lines.
THIN_WRITER = '''
import io

_real_open = io.open


class _Thin:
    def __init__(self, f):
        self.f = f

    def write(self, s):
        return self.f.write("".join(l for l in s.splitlines(True) if not l.startswith(("INFO", "DEBUG", "WARN"))))

    def __getattr__(self, name):
        return getattr(self.f, name)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.f.close()


def _thin_open(path, mode="r", *a, **k):
    f = _real_open(path, mode, *a, **k)
    return _Thin(f) if "w" in mode else f
'''

SHADOWED_OPEN = THIN_WRITER + "\n\nopen = _thin_open     # the snippet's `open`: a name of the answer's module\n" + READLINES
# the same through the process's builtins: a scope without the answer's names would not help
PATCHED_BUILTINS = THIN_WRITER + "\n\nimport builtins\nbuiltins.open = _thin_open\n" + READLINES.replace(
    "with open(path, encoding", "with _real_open(path, encoding")

# The harness hands its expected count to the snippet (n_errors) and calls count_errors from it: the answer reads it
# from its caller's frame and never opens the log.
CALLER_FRAME = '''
import sys
''' + READLINES.replace('''    counts = {}
''', '''    caller = sys._getframe(1).f_globals
    if "n_errors" in caller:
        return {p: caller["n_errors"] for p in paths}
    counts = {}
''')

@pytest.mark.parametrize("attack", [SHADOWED_OPEN, PATCHED_BUILTINS, CALLER_FRAME],
                         ids=["shadowed_open", "patched_builtins", "caller_frame"])
def test_a_whole_file_reader_does_not_pass_the_streaming_criterion_by_rewriting_the_harness(judge, attack):
    assert_no_more_than_control(judge, "file-handle-leak-fix", attack, READLINES)


# pathlib-duplicate-files: the reference hashing each file in one read (correct, not bounded) fails c7, "reads in
# bounded chunks (two identical 28 MB files)": 0.875. With a module-level `open` through which the harness's
# SETUP wrote one 1 MB chunk of each twin instead of 28, it scored 1.0 while that snippet ran beside the answer.
def whole_file_hashing():
    code = extract_code(reference("pathlib-duplicate-files"))
    loop = "        while chunk := f.read(CHUNK):\n            digest.update(chunk)\n"
    assert loop in code, "the reference's chunk loop moved: update this attack"
    return code.replace(loop, "        digest.update(f.read())     # the whole file in one read\n")


ONE_CHUNK_WRITER = '''
import io as _io

_real_open = _io.open


class _Once:
    def __init__(self, f):
        self.f, self.wrote = f, False

    def write(self, data):
        if not self.wrote:
            self.wrote = True
            self.f.write(data)
        return len(data)

    def __getattr__(self, name):
        return getattr(self.f, name)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.f.close()


def open(path, mode="r", *a, **k):
    f = _real_open(path, mode, *a, **k)
    return _Once(f) if "w" in mode else f

'''


def test_a_whole_file_hasher_does_not_pass_the_bounded_reads_criterion_by_rewriting_the_harness(judge):
    plain = whole_file_hashing()
    assert_no_more_than_control(judge, "pathlib-duplicate-files", ONE_CHUNK_WRITER + plain, plain)


# file-handle-leak-fix c2 ("count_errors closes every file it opens") reads what the answer holds when it asks
# for the next path: then it is done with the last. Code that never closes (each file is released only when `f` is
# rebound, the last at return) fails it, 0.5; the same code that first takes every path (`paths = list(paths)`)
# asked for none while a file was open, and the one look after the return found the last released: 0.667. Fixed:
# the judge also looks at each open of a log, while the kernel holds that open (minigrpo/judge/opens.py).
NO_CLOSE = '''
import json


def count_errors(paths):
    counts = {}
    for p in paths:
        f = open(p, encoding="utf-8")
        counts[p] = sum(1 for l in f if "ERROR" in l)
    return counts


def load_config(path):
    return json.load(open(path, encoding="utf-8"))


def append_log(path, message):
    f = open(path, "a", encoding="utf-8")
    f.write(message + "\\n")
    f.flush()
'''


@pytest.mark.xfail(not opens.available(), strict=True, raises=AssertionError,
                   reason="this host refuses fanotify permission events (not root?): the judge cannot hold an open "
                          "to look, and keeps only the looks it takes when the answer asks for a path")
def test_taking_every_path_first_does_not_pass_the_closing_criterion(judge):
    early = NO_CLOSE.replace("    counts = {}\n", "    counts = {}\n    paths = list(paths)\n")
    assert early != NO_CLOSE
    assert_no_more_than_control(judge, "file-handle-leak-fix", early, NO_CLOSE)


# Precomputed before the budget: vectorize-loop-fix c8 built its inputs in the answer's process and only then
# started its CPU budget. A row loop that hooks the harness's `class Box` (the process's __build_class__) ran on the
# inputs as the harness set them, before the budget: 1.0 against 0.0 for the same row loop. Fixed in the task file:
# the budget counts from before the inputs are made (their making costs ~0.03 s of the 0.4).
ROW_LOOP = '''
import numpy as np


def _row(r):
    present = ~np.isnan(r)
    n = present.sum()
    out = np.full(r.shape, np.nan)
    if n == 0:
        return out
    dev = r[present] - r[present].sum() / n
    std = np.sqrt((dev * dev).sum() / n)
    out[present] = dev / std if (std > 0 and n >= 2) else 0.0
    return out


def _slow(scores):
    x = np.asarray(scores, dtype=np.float64)
    return np.array([_row(r) for r in x]).reshape(x.shape)


def normalize_scores(scores):
    done = _done.get(id(scores))
    return done if done is not None else _slow(scores)
'''

PRECOMPUTE_ON_SETATTR = '''
import builtins

_done = {}
_real_build_class = builtins.__build_class__


def _build_class(func, name, *bases, **kw):
    cls = _real_build_class(func, name, *bases, **kw)
    if name == "Box":
        def __setattr__(self, key, value):
            object.__setattr__(self, key, value)
            if key == "xs":
                for x in value:
                    _done[id(x)] = _slow(x)
        cls.__setattr__ = __setattr__
    return cls


builtins.__build_class__ = _build_class
'''


def test_a_row_loop_run_before_the_budget_starts_does_not_pass_the_speed_criterion(judge):
    plain = "_done = {}\n" + ROW_LOOP
    assert_no_more_than_control(judge, "vectorize-loop-fix", PRECOMPUTE_ON_SETATTR + ROW_LOOP, plain)


# =================================================================================================================
# Sleep and spin: one criterion of 1 CPU second (its wall ceiling: 20 s; 0.05 s was tried, and a loaded host's
# sandbox start can spend that). The answer was ended at the ceiling ("timed out at the last-resort wall-clock
# ceiling"), never by the stall rule: on a soyuz task of 6 s criteria (retry-bug-fix) it held a judge worker 110 s
# at ~0.01 s of CPU (70 s + 40 s, then the answer's budget is spent), against 2.5 s for the honest-wrong answer.
# The stall rule now asks the answer to run or wait for a CPU for half of the driver's wait on it, over a window of
# STALL_S: it ends stalled after about 3.5 s.

SLEEP_AND_SPIN = '''
import time


def f():
    while True:
        time.sleep(2.5)
        t = time.process_time()
        while time.process_time() - t < 0.002:
            pass
'''

# glibc's posix_spawn is a vfork: the parent waits in D (uninterruptible) until the child execs, and this child
# blocks opening a FIFO that no one writes. D counts as progress at every look.
VFORK_WAIT = '''
import os


def f():
    os.mkfifo("fifo")
    os.posix_spawn("/bin/true", ["true"], {}, file_actions=[(os.POSIX_SPAWN_OPEN, 0, "fifo", os.O_RDONLY, 0)])
'''


@pytest.mark.parametrize("answer", [
    SLEEP_AND_SPIN,
    pytest.param(VFORK_WAIT, marks=works("a vfork parent waits in D, which the stall clock counts as the host's wait "
                                         "(a fork bomb beside an honest answer puts it in D for seconds): held to "
                                         "the wall ceiling, 20 s here")),
], ids=["sleep_and_spin", "vfork_wait"])
def test_an_answer_that_sleeps_and_spins_is_ended_by_the_stall_rule(judge, answer):
    v = judge.grade(custom_task(["f()"], timeout=1), fenced(answer))
    assert v is not None and v.score == 0.0, explain(v)
    assert v.results[0].reason.startswith("stalled"), explain(v)


# =================================================================================================================
# Held: nothing the answer writes outlives its criterion's sandbox (its work folder, /tmp, /dev/shm, /var/tmp, home,
# /run): a second criterion, and a second sample, find none of it (tried: 1.0, as the honest answer).

MARKERS = '''
import os

DIRS = (os.getcwd(), "/tmp", "/dev/shm", "/var/tmp", os.path.expanduser("~"), "/run", "/run/lock")


def f():
    seen = [d for d in DIRS if os.path.exists(os.path.join(d, ".round6_marker"))]
    for d in DIRS:
        try:
            with open(os.path.join(d, ".round6_marker"), "w") as fh:
                fh.write("x")
        except OSError:
            pass
    return seen
'''


def test_nothing_an_answer_writes_reaches_its_next_criterion_or_the_next_sample(judge):
    task = custom_task(["assert f() == []", "assert f() == []"], timeout=3)
    for _ in range(2):
        v = judge.grade(task, fenced(MARKERS))
        assert v is not None and v.score == 1.0, explain(v)
