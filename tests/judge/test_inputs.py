"""A criterion's input files are made by the judge before the answer's process starts (minigrpo/judge/inputs.py), and
nothing the answer does changes what they are: its module may try to write, replace, rename or chmod them, and the
test still sees the judge's bytes. Work the answer does on them while its module imports counts against the criteria
that measure it (the baseline a memory criterion credits is capped; a CPU criterion counts from the sandbox's start).
"""

from judging import TASKS, fenced, needs_full_sandbox, reference
from minigrpo.judge.answer_code import extract_code
from redteam import explain

INPUTS_SOURCE = '''
import os, random
n = random.SystemRandom().randrange(1000, 2000)
with open("f.txt", "w") as f:
    f.write("x" * n)
os.mkdir("sub")
with open("sub/g.txt", "w") as f:
    f.write("judge")
result = {"n": n}
'''

# Everything an answer's module might try on its inputs before the test runs; each attempt that works is recorded.
TAMPER = '''
import os, shutil

INPUTS = "/sandbox/inputs"
worked = []


def _try(name, fn):
    try:
        fn()
        worked.append(name)
    except OSError:
        pass


def _write():
    with open(INPUTS + "/f.txt", "w") as f:
        f.write("y")


def _replace():
    os.rename(INPUTS, "/sandbox/old")
    os.mkdir(INPUTS)
    with open(INPUTS + "/f.txt", "w") as f:
        f.write("y")


_try("write", _write)
_try("truncate", lambda: os.truncate(INPUTS + "/f.txt", 1))
_try("unlink", lambda: os.unlink(INPUTS + "/f.txt"))
_try("chmod", lambda: os.chmod(INPUTS + "/f.txt", 0o666))
_try("create", lambda: open(INPUTS + "/new.txt", "w").close())
_try("rename file", lambda: os.rename(INPUTS + "/sub/g.txt", INPUTS + "/sub/h.txt"))
_try("remove tree", lambda: shutil.rmtree(INPUTS + "/sub"))
_try("replace folder", _replace)


def layers():
    """Each of the two that stops the tries above, on its own: the mount is read-only, and the modes are too."""
    return [bool(os.statvfs(INPUTS).f_flag & os.ST_RDONLY), oct(os.stat(INPUTS + "/f.txt").st_mode & 0o777),
            oct(os.stat(INPUTS + "/sub").st_mode & 0o777)]


def size(path):
    return os.path.getsize(path)


def text(path):
    with open(path) as f:
        return f.read()
'''

TEST = '''
assert worked == [], worked
assert layers() == [True, "0o444", "0o555"], layers()
assert size(INPUTS + "/f.txt") == prepared["n"]
assert text(INPUTS + "/sub/g.txt") == "judge"
assert sorted(INPUT_FILES) == ["f.txt", "sub/g.txt"]
'''


@needs_full_sandbox
def test_the_answer_cannot_change_its_inputs(judge):
    task = {"id": "inputs", "prompt": "p", "criteria": [{"id": "c1", "text": "t", "check": {
        "type": "python", "test": TEST, "timeout": 3, "inputs": INPUTS_SOURCE}}]}
    v = judge.grade(task, fenced(TAMPER))
    assert v is not None and v.score == 1.0, explain(v)


# pathlib-duplicate-files c7 with the work done while the module imports: every file under the inputs hashed in
# one read at import (the 32 GB sparse one left to the call), the groups kept and handed back by the call. The
# baseline c7 credits is capped at what the sandbox holds after start-up, so the import's peak is the call's.
PRECOMPUTED = '''
import hashlib
from pathlib import Path

_done = {}


def _groups(root, whole):
    by_hash = {}
    for p in sorted(Path(root).rglob("*")):
        if p.is_file() and not p.is_symlink():
            if not whole and p.stat().st_size >= 1 << 30:
                return None     # left to the call
            by_hash.setdefault(hashlib.sha256(p.read_bytes()).hexdigest(), []).append(p)
    return sorted((sorted(g) for g in by_hash.values() if len(g) > 1), key=lambda g: g[0])


_done["/sandbox/inputs"] = _groups("/sandbox/inputs", whole=False)


def find_duplicates(root):
    root = Path(root)
    if not root.is_dir():
        raise NotADirectoryError(str(root))
    done = _done.get(str(root))
    return done if done is not None else _groups(root, whole=True)
'''


def _graded(judge, attack, criterion):
    """pathlib-duplicate-files' c1 (its groups are right) and `criterion` alone, for the attack and the reference
    (the whole task would run the attack's import in eight sandboxes)."""
    task = dict(TASKS["pathlib-duplicate-files"])
    task["criteria"] = [c for c in task["criteria"] if c["id"] in ("c1", criterion)]
    got = {name: judge.submit(task, answer) for name, answer in
           (("attack", fenced(attack)), ("reference", reference("pathlib-duplicate-files")))}
    got = {name: fut.result() for name, fut in got.items()}
    assert got["reference"].score == 1.0, explain(got["reference"])
    return {r.id: r.passed for r in got["attack"].results}, explain(got["attack"])


@needs_full_sandbox
def test_whole_reads_at_import_do_not_pass_the_bounded_reads_criterion(judge):
    passed, why = _graded(judge, PRECOMPUTED, "c7")
    assert passed["c1"] is True, why        # graded: its module imports and its groups are right
    assert passed["c7"] is False, why


# pathlib-duplicate-files c6 counts the sandbox's CPU from its start: what the module does while it imports (with
# the files already there) is not free. 1.5 s of work at import, then the reference's size-first call.
SPIN_AT_IMPORT = '''
import time as _time

_t = _time.process_time()
while _time.process_time() - _t < 1.5:
    pass
'''


@needs_full_sandbox
def test_cpu_spent_at_import_counts_against_the_never_read_criterion(judge):
    passed, why = _graded(judge, SPIN_AT_IMPORT + extract_code(reference("pathlib-duplicate-files")), "c6")
    assert passed["c1"] is True, why
    assert passed["c6"] is False, why
