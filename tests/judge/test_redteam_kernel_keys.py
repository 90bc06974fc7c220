"""Red-team answers against the local judge through the kernel's key store, which is per uid, not per sandbox: a
key outlives its sandbox, a key made readable by all is listed in /proc/keys of every later (or concurrent) sandbox,
whatever its pool uid, and a sandbox possesses the session keyring of the judge that started it. Each test PASSES
when the judge holds (nothing crosses, the attack scores no more than the same code without the trick) and FAILS
while the attack works. The other red-team groups: tests/judge/test_redteam_in_sandbox.py, test_redteam_driver.py.
"""

import os
import secrets
import subprocess
import sys

import pytest

from judging import needs_full_sandbox
from redteam import explain, grade
from repo_root import ROOT

HAS_KEYS = os.path.exists("/proc/keys")
needs_keys = pytest.mark.skipif(not HAS_KEYS, reason="no kernel key store here")


# =================================================================================================================
# Kernel keys: per uid, not per sandbox
# =================================================================================================================

# ctypes only: the add_key / keyctl system calls (x86-64 numbers 248 and 250); every key made readable by all uids
# (KEYCTL_SETPERM 0x3f3f3f3f) and given a time-out, so that tests leave nothing behind for long.
KEYS = r'''
import ctypes as _ct


def _libc():
    libc = _ct.CDLL(None, use_errno=True)
    libc.syscall.restype = _ct.c_long
    return libc


def _publish(description, seconds=120):
    libc = _libc()
    key = libc.syscall(248, b"user", description.encode(), b"x", 1, _ct.c_int(-4))   # add_key to @u
    libc.syscall(250, 5, _ct.c_long(key), _ct.c_long(0x3f3f3f3f))                      # KEYCTL_SETPERM
    libc.syscall(250, 15, _ct.c_long(key), _ct.c_long(seconds))                        # KEYCTL_SET_TIMEOUT
    return key


def _published(prefix):
    """Descriptions of the keys in /proc/keys that start with prefix (any uid's, if readable by all)."""
    try:
        with open("/proc/keys") as f:
            lines = f.read().splitlines()
    except OSError:
        return []
    out = []
    for line in lines:
        if " user " in line:
            description = line.split(" user ", 1)[1].strip().rsplit(":", 1)[0]
            if description.startswith(prefix):
                out.append(description)
    return out
'''


@needs_keys
@needs_full_sandbox
def test_a_kernel_key_left_by_one_sandbox_is_invisible_to_the_next():
    """The root cause of the three tests below: a sandbox adds a key to its uid's keyring and makes it readable by
    all; the sandbox ends; a later sandbox (any pool uid) finds it in /proc/keys."""
    from minigrpo.judge.sandbox import Limits, run
    tag = "rt-key-" + secrets.token_hex(4)
    writer = KEYS + f"_publish({tag!r} + '-written', 120)\nprint('written')"
    reader = KEYS + f"print('FOUND' if _published({tag!r}) else 'nothing')"
    rc, out, _, _ = run([sys.executable, "-c", writer], {}, Limits(timeout=30))
    assert rc == 0 and b"written" in out, out
    rc, out, _, _ = run([sys.executable, "-c", reader], {}, Limits(timeout=30))
    assert rc == 0 and b"FOUND" not in out, "a kernel key outlived its sandbox and is visible to the next one"


SLUG_PLAIN = '''
import pytest
from slugify_impl import slugify


def _same_as_first():
    return True


@pytest.fixture
def word():
    return "hello"


@pytest.mark.parametrize("i", range(6))
def test_impl(i, word):
    assert _same_as_first()


def test_raises():
    with pytest.raises(ZeroDivisionError):
        1 / 0
'''

SLUG_KEYS = KEYS + '''
import hashlib
import slugify_impl


def _same_as_first():
    # The first sandbox that ever runs these tests is criterion 1's, whose slugify_impl.py is the correct one: it
    # publishes its hash; every later sandbox (each mutant, each later sample) compares its own file with it.
    mine = hashlib.sha256(open(slugify_impl.__file__, "rb").read()).hexdigest()[:16]
    first = _published("TAG-")
    if first:
        return first[0][len("TAG-"):] == mine
    _publish("TAG-" + mine)
    return True
'''


@needs_keys
@needs_full_sandbox
def test_kernel_keys_do_not_carry_state_between_criteria(judge):
    """pytest-slugify-tests: a test module that tests nothing catches every mutant, because criterion 1's sandbox
    leaves the hash of the correct implementation where the mutants' sandboxes can read it."""
    ids = ["c1", "c2", "c3", "c4", "c5", "c6", "c7"]
    tag = "rt-slug-" + secrets.token_hex(4)
    plain = grade(judge, "pytest-slugify-tests", SLUG_PLAIN, ids)
    attack = SLUG_PLAIN.replace("def _same_as_first():\n    return True\n", SLUG_KEYS.replace("TAG", tag))
    v = grade(judge, "pytest-slugify-tests", attack, ids)
    assert v.score <= plain.score, explain(v)


ORACLE = KEYS + '''
_last = []          # what this process answered last: it was right if the test asks for more


def compare_versions(a, b):
    if _last:
        _publish(_last.pop() + "|ok")
    here = f"TAG|{a}|{b}|"
    known = _published(here)
    for k in known:
        if k.endswith("|ok"):
            return int(k[len(here):].split("|")[0])
    tries = sum(1 for k in known if k.endswith("|try"))
    guess = (-1, 0, 1)[tries % 3]
    _publish(f"{here}{guess}|{tries}|try")
    _last.append(f"{here}{guess}")
    return guess
'''


@needs_keys
@needs_full_sandbox
def test_kernel_keys_do_not_let_an_answer_learn_the_hidden_expectations(judge):
    """semver-compare c1 with no comparison logic at all: a call that is followed by another call passed its assert;
    the answer writes down what worked in a kernel key, and after a few grades it knows the hidden table."""
    code = ORACLE.replace("TAG", "rt-oracle-" + secrets.token_hex(4))
    scores = [grade(judge, "semver-compare", code, ["c1"]).score for _ in range(5)]
    assert max(scores) == 0.0, scores       # with no memory between sandboxes it guesses -1 for every call, forever


@needs_keys
@needs_full_sandbox
def test_the_judges_session_keyring_is_not_reachable(tmp_path):
    """A judge started from a login session (pam_keyinit) has a session keyring; every sandbox it starts inherits it,
    and possesses it (possessor rights, whatever its uid): it reads the judge's keys and can add its own."""
    script = tmp_path / "session_probe.py"
    script.write_text(KEYS + r'''
import sys
from minigrpo.judge.sandbox import Limits, run
libc = _libc()
libc.syscall(250, 1, b"_ses", 0)                            # KEYCTL_JOIN_SESSION_KEYRING, as pam_keyinit does
data = b"the judge's secret"
key = libc.syscall(248, b"user", b"rt-judge-key", data, len(data), _ct.c_int(-3))
libc.syscall(250, 15, _ct.c_long(key), _ct.c_long(60))
probe = KEYS_SOURCE + """
libc = _libc()
k = libc.syscall(250, 10, _ct.c_long(-3), b"user", b"rt-judge-key", 0)       # KEYCTL_SEARCH the session keyring
buf = _ct.create_string_buffer(64)
n = libc.syscall(250, 11, _ct.c_long(k), buf, 64) if k > 0 else -1
print("READ" if n > 0 and b"secret" in buf.raw else "nothing")
"""
rc, out, _, _ = run([sys.executable, "-c", probe], {}, Limits(timeout=30))
print(out.decode())
'''.replace("KEYS_SOURCE", repr(KEYS)))
    out = subprocess.run([sys.executable, str(script)], cwd=ROOT, capture_output=True, text=True, timeout=120,
                         env={**os.environ, "PYTHONPATH": ROOT})
    assert "nothing" in out.stdout or "READ" in out.stdout, (out.stdout, out.stderr[-2000:])
    assert "READ" not in out.stdout, "a sandbox read a key of the judge's session keyring"
