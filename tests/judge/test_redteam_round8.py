"""An eighth red team, against the three mechanisms that landed last: a criterion's input files made by the judge
before the answer runs (judge/inputs.py), the look at what the answer holds at each open of an input file
(judge/opens.py, file-handle-leak-fix c2), and the stall clock's share (driver_answer.py). Each test asserts the
secure behaviour; what this round found is fixed or a strict xfail with the scores measured, and the tests of what
held keep it held. The control (the same answer without the trick) is graded beside the attack, on the criteria the
attack is about only.

Groups:
  the inputs are frozen          the answer cannot rename, remount or unmount its input folder, hard-link a file
                                 out of it or reopen one for writing through an O_PATH descriptor (held).
  the judge's set-up fails       an inputs source that fails fails its criterion (held); it also charged the
                                 answer the criterion's whole timeout, so two such failures left an honest
                                 answer's next criterion "not run: the answer spent its time budget" (measured:
                                 0.25 on the task below; now 0.5, its two criteria with a failing source fail).
                                 Fixed in driver.py: a sandbox the judge never started costs the answer nothing.
  what the look sees             file-handle-leak-fix c2: a leaked descriptor is seen wherever the answer hides it
                                 in its sandbox: a dup, a child process, an O_PATH descriptor, a memory mapping
                                 (held). An answer that read the logs at import (they exist then, at a path the
                                 judge names) and answered their paths from a cache, with the prompt's leak for
                                 every other path, opened no log during the call, and the opens at import satisfied
                                 the look (measured: 1.0 against 0.0 for the leak). Fixed in the task file: only
                                 the opens of the call count, and each log must be opened there.
  copies of the logs             (strict xfail) the logs copied, each closed, then the leak on the copies: the
                                 mark is on the logs only, so no look falls inside the leaking loop (1.0 against
                                 0.0 on c2).
  a refused watch               c2 ran without its look when the judge's fanotify watch was refused on a host
                                 that allows it (the groups spent): the leak passed (1.0). Fixed in
                                 driver_host.py: the criterion cannot start, and fails.
  past the listing's end         a leak behind 4,200 descriptors opened at import passed every closing criterion
                                 of file-handle-leak-fix (1.0 against 0.25 on c2-c5): the listing stops at 4,096
                                 and ends in the same entry each time. Fixed in driver_answer.py: a cut listing
                                 fails the case.
  the stall clock's share        (no test) an answer that sleeps while a thread of its own spins keeps its share
                                 above half and is not stalled; it spends its CPU budget instead and times out,
                                 which pays what a stall pays: nothing, and the full timeout is charged either way.
  a file held at import          file-handle-leak-fix c7 on a log read whole at import and answered from a cache:
                                 the baseline is capped (held).
"""

import errno
import os
import stat

import pytest

from judging import needs_full_sandbox, reference
from minigrpo.judge import inputs, opens
from minigrpo.judge.answer_code import extract_code
from minigrpo.judge.sandbox import INPUTS_AT, Limits, Sandbox
from redteam import explain, only


def works(reason, where=True):
    """The mark of an attack that works today (`where` it does): its assertion of the secure behaviour fails."""
    return pytest.mark.xfail(where, strict=True, raises=AssertionError, reason=reason)


def grade_on(judge, task, answers):
    """{name: verdict} of {name: code} on `task`, graded concurrently (one call: the attacks share the judge)."""
    futures = {name: judge.submit(task, f"```python\n{code}\n```") for name, code in answers.items()}
    return {name: fut.result() for name, fut in futures.items()}


def score(verdict):
    assert verdict is not None and verdict.score is not None, "an attack must be graded, not dropped"
    return verdict.score


# =================================================================================================================
# What the look sees. file-handle-leak-fix c2 ("closes every file it opens"): the control takes every path first,
# then opens each log without closing it (the prompt's leak: the file is released only when `f` is rebound, just
# after the next open). The judge's look at each open sees it.

LEAK = '''
import json


def count_errors(paths):
    counts = {}
    for p in list(paths):
        f = open(p, encoding="utf-8")
        counts[p] = sum(1 for line in f if "ERROR" in line)
    return counts


def load_config(path):
    return json.load(open(path, encoding="utf-8"))


def append_log(path, message):
    f = open(path, "a", encoding="utf-8")
    f.write(message + "\\n")
'''

HIDE = {
    # the leaked descriptor duplicated to another number, the original closed
    "dup": LEAK.replace('        f = open(p, encoding="utf-8")\n',
                        '        f = open(p, encoding="utf-8")\n        _held.append(os.dup(f.fileno()))\n'
                        ).replace("import json\n", "import json\nimport os\n_held = []\n"),
    # the file opened and held by a child process that outlives the call
    "child": LEAK.replace('        f = open(p, encoding="utf-8")\n',
                          '        _hold_in_child(p)\n        f = open(p, encoding="utf-8")\n').replace(
        "import json\n", "import json\nimport os\nimport time\n\n\ndef _hold_in_child(p):\n"
                         "    if os.fork() == 0:\n        _f = open(p)\n        time.sleep(30)\n        os._exit(0)\n"),
    # a path-only descriptor on each log, never closed
    "o_path": LEAK.replace('        f = open(p, encoding="utf-8")\n',
                           '        _held.append(os.open(p, os.O_PATH))\n        f = open(p, encoding="utf-8")\n'
                           ).replace("import json\n", "import json\nimport os\n_held = []\n"),
}

# each log mapped into memory and the mapping kept (CPython's mmap keeps a descriptor of its own)
HIDE["mmap"] = LEAK.replace("import json\n", "import json\nimport mmap\n_maps = []\n").replace(
    '        f = open(p, encoding="utf-8")\n        counts[p] = sum(1 for line in f if "ERROR" in line)\n',
    '        with open(p, "rb") as f:\n            m = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)\n'
    '        _maps.append(m)\n        counts[p] = sum(1 for line in iter(m.readline, b"") if b"ERROR" in line)\n')



# The logs are in the answer's sandbox before its module runs (at INPUTS_AT, a path the judge's source names): the
# module reads each at import, closing it, and answers those paths from a cache; every other path gets the leak.
CACHED_AT_IMPORT = LEAK.replace("import json\n", f'''import json
import os

_COUNTS = {{}}
if os.path.isdir("{INPUTS_AT}"):
    for _name in os.listdir("{INPUTS_AT}"):
        with open(os.path.join("{INPUTS_AT}", _name), encoding="utf-8") as _f:
            _COUNTS[os.path.join("{INPUTS_AT}", _name)] = sum(1 for line in _f if "ERROR" in line)
''').replace("    for p in list(paths):\n", "    for p in list(paths):\n        if p in _COUNTS:\n"
                                            "            counts[p] = _COUNTS[p]\n            continue\n")

# Generic code, no path of the judge's in it: each log copied whole to a folder of the answer's (its file closed),
# then the prompt's leak on the copies. Every open of a log is looked at and holds nothing; the copies are not
# watched, so no look falls inside the leaking loop, and the last copy is released when the call returns.
STAGED = LEAK.replace("import json\n", "import json\nimport os\nimport shutil\nimport tempfile\n").replace(
    '''    for p in list(paths):
        f = open(p, encoding="utf-8")
''', '''    staged = {}
    work = tempfile.mkdtemp()
    for p in list(paths):
        staged[p] = shutil.copy(p, os.path.join(work, str(len(staged))))
    for p, copy in staged.items():
        f = open(copy, encoding="utf-8")
''')

# The listing of what the sandbox holds stops at procs.MAX_FDS descriptors (the sandbox allows 20,000) and ends in
# one entry saying so, the same in every cut listing: each test's "opened since the look before the call" was
# empty, and the leaked logs, numbered past the cut, were never listed. The prompt's leak behind 4,200 descriptors
# of /dev/null opened at import scored 1.0 on c2-c5 against 0.25. Fixed in driver_answer.py: a cut listing fails
# the case (a leak in itself).
PADDED = "import os\n_pad = [os.open('/dev/null', os.O_RDONLY) for _ in range(4200)]\n" + LEAK


@pytest.fixture(scope="module")
def closing(judge):
    """c2 of file-handle-leak-fix for the reference, the leak, and each way of hiding it (one grading call)."""
    answers = {"reference": extract_code(reference("file-handle-leak-fix")), "leak": LEAK,
               "cached": CACHED_AT_IMPORT, "staged": STAGED,
               "padded": PADDED, **HIDE}
    assert all(code != LEAK for name, code in answers.items() if name != "leak"), "an attack no longer applies"
    return grade_on(judge, only("file-handle-leak-fix", ["c2"]), answers)


def test_the_reference_closes_and_the_plain_leak_does_not(closing):
    assert score(closing["reference"]) == 1.0, explain(closing["reference"])
    if opens.available():       # without fanotify only the generator's looks stand, and this leak passes them
        assert score(closing["leak"]) == 0.0, explain(closing["leak"])


@pytest.mark.parametrize("how", sorted(HIDE))
def test_a_leak_hidden_in_the_sandbox_is_seen(closing, how):
    assert score(closing[how]) <= score(closing["leak"]), explain(closing[how])


def test_a_leak_answered_from_a_cache_made_at_import_fails(closing):
    assert score(closing["cached"]) <= score(closing["leak"]), explain(closing["cached"])


@works("the fanotify mark is on the input logs only: an answer that copies each log (closing it) and then leaks "
       "the copies, file after file, is never looked at inside its leaking loop (measured: 1.0 against 0.0 for "
       "the leak on c2). RLIMIT_FSIZE 0 for the answer would stop the copies, but c2's `fsize_mb` is also the "
       "inputs source's (which writes the logs: both fail to start with 0). Fix: a limit of the answer's own, or a "
       "mark on the filesystems the answer can write (its work folder, /tmp), so that every open of a file it "
       "made is looked at too", where=opens.available())     # without fanotify the plain leak passes c2 as well
def test_a_leak_on_copies_of_the_logs_fails(closing):
    assert score(closing["staged"]) <= score(closing["leak"]), explain(closing["staged"])


def test_a_leak_behind_more_descriptors_than_the_judge_lists_fails(closing):
    assert score(closing["padded"]) <= score(closing["leak"]), explain(closing["padded"])     # c2 stands for c2-c5


# The watch is the judge's set-up: refused where the host allows it (root's 128 fanotify groups spent by as many
# criteria judged at once, say), c2 used to run without it, and the leak that takes every path first passed
# (measured: 1.0, as the reference). Fixed in driver_host.py: the criterion cannot start, and fails.
@pytest.mark.skipif(not opens.available(), reason="no fanotify here: c2 runs without the look by design")
def test_a_refused_watch_fails_the_criterion_rather_than_weaken_it(judge, monkeypatch):
    def refused(self, paths, look):
        raise OSError(errno.EMFILE, "fanotify_init")
    monkeypatch.setattr(opens.OpenWatch, "__init__", refused)       # the broker runs in the judge's process
    got = grade_on(judge, only("file-handle-leak-fix", ["c2"]), {"leak": LEAK})
    assert score(got["leak"]) == 0.0, explain(got["leak"])


# c7 (bounded memory) on a log read whole at import, answered from a cache: the memory taken and freed before the
# call raises the baseline, which the criterion caps (held).
READ_WHOLE_AT_IMPORT = extract_code(reference("file-handle-leak-fix")).replace("import json\n", f'''import json
import os

_COUNTS = {{}}
if os.path.isdir("{INPUTS_AT}"):
    for _name in os.listdir("{INPUTS_AT}"):
        with open(os.path.join("{INPUTS_AT}", _name), encoding="utf-8") as _f:
            _COUNTS[os.path.join("{INPUTS_AT}", _name)] = sum(1 for line in _f.readlines() if "ERROR" in line)
''', 1).replace("    for path in paths:\n", "    for path in paths:\n        if path in _COUNTS:\n"
                                          "            counts[path] = _COUNTS[path]\n            continue\n")


def test_a_log_read_whole_at_import_fails_the_memory_criterion(judge):
    assert "_COUNTS[path]" in READ_WHOLE_AT_IMPORT, "the reference's loop moved: update this attack"
    got = grade_on(judge, only("file-handle-leak-fix", ["c7"]), {"attack": READ_WHOLE_AT_IMPORT})
    assert score(got["attack"]) == 0.0, explain(got["attack"])


# =================================================================================================================
# The inputs are frozen. The answer's sandbox, set up as the broker sets it up for a criterion with inputs, tries
# the ways around the read-only mount that tests/judge/test_inputs.py does not; the host folder is read afterwards,
# from outside.

FREEZE_PROBE = f'''
import ctypes, os
I = "{INPUTS_AT}"
libc = ctypes.CDLL(None, use_errno=True)
tries = {{      # beyond tests/judge/test_inputs.py's writes, renames and removals
    "rename the mount point": lambda: os.rename(I, I + "2"),
    "hard link out": lambda: os.link(I + "/x.txt", "hl"),
    "reopen an O_PATH descriptor for writing": lambda: open("/proc/self/fd/%d" % os.open(I + "/x.txt", os.O_PATH), "w"),
    "remount rw": lambda: libc.mount(None, I.encode(), None, 32 | 4096, None) == 0 or 1 / 0,
    "unmount": lambda: libc.umount2(I.encode(), 2) == 0 or 1 / 0,
}}
for name, attempt in tries.items():
    try:
        attempt()
        print("done:", name)
    except Exception:
        pass
'''


@needs_full_sandbox
def test_the_answer_cannot_change_its_input_files():
    class Check:        # the limits a criterion's check would give (criterion_limits)
        timeout, cpu_budget, memory_mb, nproc, fsize_mb = 10.0, 5.0, 256, 16, 16
    source = "import os\nopen('x.txt', 'w').write('hello')\nos.mkdir('d')\nopen('d/y', 'w').write('q')\n"
    folder, _, ids = inputs.make_inputs(source, Check)
    try:
        with Sandbox({"solution.py": FREEZE_PROBE}, Limits(timeout=10, cpu_s=5, memory_mb=256, nproc=16, fsize_mb=16),
                     inputs=folder) as sb:
            sb.start(python_source="exec(open('solution.py').read())")
            out, rc = sb.communicate(b"")
        assert rc == 0 and out.decode() == "", out.decode()
        assert sorted(os.listdir(folder)) == ["d", "x.txt"] and sorted(ids) == ["d/y", "x.txt"]
        with open(os.path.join(folder, "x.txt")) as f:
            assert f.read() == "hello"
        assert stat.S_IMODE(os.stat(os.path.join(folder, "x.txt")).st_mode) == 0o444
    finally:
        inputs.remove_inputs(folder)


# A failure of the judge's own set-up never pays: an inputs source that fails (it exits, or its `result` is over
# MAX_RESULT) fails its criterion, which would have passed; the criterion beside it is graded as usual.

def test_an_inputs_source_that_fails_fails_its_criterion(judge):
    def criterion(cid, **check):
        return {"id": cid, "text": "t", "check": {"type": "python", "timeout": 6, "test": "assert f() == 1\n",
                                                  **check}}
    task = {"id": "redteam", "prompt": "write f", "criteria": [
        criterion("c1"), criterion("c2", inputs="raise SystemExit(3)\n"),
        criterion("c3", inputs=f"result = 'x' * {inputs.MAX_RESULT + 1}\n"),
        criterion("c4", inputs="open('x', 'w').write('fine')\n")]}
    got = grade_on(judge, task, {"answer": "def f():\n    return 1\n"})["answer"]
    assert {r.id: r.passed for r in got.results} == {"c1": True, "c2": False, "c3": False, "c4": True}, \
        explain(got)
