"""A second red team against the local judge: answers that score more than the same code without the trick. Each
test asserts the secure behaviour, so it FAILS while the attack works; `works(reason)` marks it a strict xfail on
AssertionError until the judge or the task's test is fixed. A baseline that does not behave as the test needs
(`baseline`) is a real failure, not an expected one.

Groups:
  page cache      the host's page cache holds the pages of the Python installation every sandbox reads: a read
                  sets a bit, POSIX_FADV_DONTNEED clears it, a RWF_NOWAIT read tells which (no timing needed), and
                  the bits outlive the sandbox -- held now: the launcher's seccomp filter refuses those calls
  shared inputs   a test hands the answer a list and later computes what it expects from that same list: the
                  answer rewrites its argument (reference semantics, as in one process) to fit its own output
  untimed setup   a performance criterion times only its last snippet; a snippet beside the answer that set the
                  data up ran untimed, and the answer did its slow work there
  static          ast criteria that pay code doing what they ban, or not doing what they require
  writing         a word salad under 20 words escapes every structure rule of the natural checks
"""

import glob
import os
import random
import sys
import sysconfig
import time

import pytest

from judging import TASKS, fenced, needs_full_sandbox
from redteam import only


def grade(judge, task_id, code, ids):
    verdict = judge.grade(only(task_id, ids), fenced(code))
    if verdict is None:
        pytest.fail("an attack must be graded, not dropped")
    return {r.id: r.passed for r in verdict.results if r.id in ids}


def baseline(got, want):
    if got != want:
        pytest.fail(f"the baseline does not behave as the test needs: {got}, not {want}")


def works(reason):
    """The mark of an attack that works today: its assertion of the secure behaviour fails."""
    return pytest.mark.xfail(strict=True, raises=AssertionError, reason=reason)


# =================================================================================================================
# Page cache: bits that outlive a sandbox, in the pages of the Python installation it shares with every other
# =================================================================================================================

PAGE_BITS = r'''
import glob as _glob, os as _os, sysconfig as _sysconfig
# A file of the bound Python installation that nothing reads: its pages in the (host-wide) page cache are bits that
# outlive the sandbox. A read sets one, POSIX_FADV_DONTNEED clears it, a RWF_NOWAIT read tells which it is (once:
# it starts reading the page in). cachestat(2) and mincore(2) would tell without that, but only to a writer.
_F = (_glob.glob(_os.path.join(_sysconfig.get_paths()["stdlib"], "config-*", "libpython*.a")) or [""])[0]
_BASE, _STEP = BASE, 2 << 20            # a slot holds any folio a one-page read makes (at most 2 MB)


def _fd():
    fd = _os.open(_F, _os.O_RDONLY)
    _os.posix_fadvise(fd, 0, 0, _os.POSIX_FADV_RANDOM)
    return fd


def _put(bits):
    fd = _fd()
    for i, b in enumerate(bits):
        _os.pread(fd, 1, (_BASE + i) * _STEP) if b else \
            _os.posix_fadvise(fd, (_BASE + i) * _STEP, _STEP, _os.POSIX_FADV_DONTNEED)
    _os.close(fd)


def _bit(fd, i):
    try:
        return _os.preadv(fd, [bytearray(1)], (_BASE + i) * _STEP, _os.RWF_NOWAIT) and 1
    except BlockingIOError:
        return 0


def _get(n, start=0):
    fd = _fd()
    out = [_bit(fd, start + i) for i in reversed(range(n))][::-1]     # the last first: a probe reads ahead
    _os.close(fd)
    return out
'''
LIBPYTHON = glob.glob(os.path.join(sysconfig.get_paths()["stdlib"], "config-*", "libpython*.a"))
needs_page_bits = pytest.mark.skipif(not LIBPYTHON or not hasattr(os, "RWF_NOWAIT"),
                                     reason="no libpython*.a in this installation, or no preadv2 RWF_NOWAIT")


def page_bits(n):
    """The bit store's code at a fresh place in the file, and that place cleared (the test's own set-up)."""
    code = PAGE_BITS.replace("BASE", str(random.randrange(0, 21 - n)))
    scope = {}
    exec(code, scope)
    for _ in range(3):          # once the reads an earlier probe started have landed
        scope["_put"]([0] * n)
        time.sleep(0.2)
    return code


PROBES = r'''
import ctypes, errno, mmap, os, sys
fd = os.open(sys.argv[1], os.O_RDONLY)
libc = ctypes.CDLL(None, use_errno=True)
m = mmap.mmap(fd, 4096, flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ | mmap.PROT_WRITE)   # copy on write
here = ctypes.c_void_p(ctypes.addressof(ctypes.c_char.from_buffer(m)))
calls = {"fadvise": lambda: os.posix_fadvise(fd, 0, 4096, os.POSIX_FADV_DONTNEED),
         "preadv2": lambda: os.preadv(fd, [bytearray(1)], 0, os.RWF_NOWAIT),
         "readahead": lambda: libc.readahead(fd, ctypes.c_long(0), ctypes.c_size_t(4096)),
         "mincore": lambda: libc.mincore(here, ctypes.c_size_t(4096), ctypes.create_string_buffer(1))}
for name, call in calls.items():
    ctypes.set_errno(0)
    try:
        r = call()
        print(name, "refused" if r == -1 and ctypes.get_errno() == errno.EPERM else f"ran:{r}")
    except PermissionError:
        print(name, "refused")
    except OSError as e:
        print(name, f"ran:{e.errno}")
'''


@needs_full_sandbox
@needs_page_bits
def test_the_page_cache_probes_are_refused_in_a_sandbox():
    """The root cause red-teamed here: the page cache of the bound Python installation is shared by every sandbox
    and outlives each; a read sets a bit, POSIX_FADV_DONTNEED clears it, a RWF_NOWAIT read (or mincore, readahead,
    cachestat, io_uring) tells which. The launcher's seccomp filter refuses each of these calls (EPERM), so no
    sandbox can clear or read a page's state exactly; timing a read stays possible (docs/judge.md)."""
    from minigrpo.judge.sandbox import Limits, run
    rc, out, *_ = run([sys.executable, "-c", PROBES, LIBPYTHON[0]], {}, Limits(timeout=30))
    lines = out.decode().split("\n")
    assert rc == 0 and [ln.split()[-1] for ln in lines if ln] == ["refused"] * 4, out


SLUG_SUITE = '''
import pytest
from slugify_impl import slugify

PROBES = ["Crème Brûlée", "Hello,   World!", "--a--b--", "x" * 60, "the quick brown fox jumps over the lazy dog",
          "ABC def", "a_b", "!!!", ""]


def _behaviour():
    out = []
    for p in PROBES:
        for n in (50, 12):
            try:
                out.append(slugify(p, n))
            except Exception as e:
                out.append(type(e).__name__)
    return out


def _same_as_first():
    return True


@pytest.mark.parametrize("i", range(6))
def test_impl(i):
    assert _same_as_first()
'''
FIRST_SEEN = '''
_seen = []


def _same_as_first():
    # criterion 1 runs this suite against the correct implementation before any mutant's: the first sandbox to
    # read the flag finds it clear (and reading it sets it)
    if not _seen:
        _behaviour()
        _seen.append(_get(1) == [0])
    return _seen[0]
'''


@needs_full_sandbox
@needs_page_bits
def test_the_page_cache_does_not_carry_state_between_criteria(judge):
    """A suite that checks nothing of the specification catches the mutants (c2-c7; c2 here): its tests pass only
    in the first sandbox to read one page-cache bit, criterion 1's. The whole c1-c7 on a clear bit: 1/7 plainly,
    7/7 with it. More bits carry more (the kernel-key oracle of test_judge_redteam.py); one is enough here."""
    ids = ["c1", "c2"]
    plain = grade(judge, "pytest-slugify-tests", SLUG_SUITE.replace(
        "def _same_as_first():\n    return True\n", "def _same_as_first():\n    _behaviour()\n    return True\n"), ids)
    baseline(plain, {"c1": True, "c2": False})                          # passes c1, catches nothing
    attack = SLUG_SUITE.replace("def _same_as_first():\n    return True\n", page_bits(1) + FIRST_SEEN)
    assert grade(judge, "pytest-slugify-tests", attack, ids)["c2"] is False      # no mutant caught by the bit


# =================================================================================================================
# Shared inputs: the answer rewrites the list the test computes its expectation from
# =================================================================================================================

COMPLETION_ORDER = '''
import asyncio


async def fetch_all(urls, fetch, limit=10, timeout=None):
    if limit < 1:
        raise ValueError("limit must be at least 1")
    sem = asyncio.Semaphore(limit)
    done = []                                   # (url, result) in the order they finish

    async def one(u):
        async with sem:
            try:
                r = await (fetch(u) if timeout is None else asyncio.wait_for(fetch(u), timeout))
            except Exception as e:
                r = e
            done.append((u, r))

    await asyncio.gather(*(one(u) for u in urls))
    TRICK
    return [r for _, r in done]                 # completion order, not input order
'''


def test_reordering_the_input_does_not_pass_the_input_order_criterion(judge):
    """asyncio-bounded-fetch c1 ("Returns results in input order"), c2, c3: `urls` crosses as a shared list, so the
    answer's `urls[:] = ...` reaches the driver's, and `[value(u) for u in urls]` follows. The task: 6/10 -> 9/10."""
    ids = ["c1"]            # c2, c3 too, but their urls all take 50 ms: in order by chance at times
    plain = grade(judge, "asyncio-bounded-fetch", COMPLETION_ORDER.replace("TRICK", "pass"), ids)
    baseline(plain, {"c1": False})                                      # the slow urls come back last
    v = grade(judge, "asyncio-bounded-fetch", COMPLETION_ORDER.replace("TRICK", "urls[:] = [u for u, _ in done]"), ids)
    assert v == plain, v


# =================================================================================================================
# Untimed setup: the slow work is done while a snippet beside the answer sets the data up
# =================================================================================================================

SCAN_DIJKSTRA = '''
import heapq
import math


def _scan(graph, source):      # Dijkstra that scans the whole frontier for its minimum: O(V^2)
    dist, prev, frontier, done = {source: 0.0}, {}, {source: 0.0}, set()
    while frontier:
        u = min(frontier, key=frontier.get)
        d = frontier.pop(u)
        done.add(u)
        for v, w in graph.get(u, {}).items():
            if v not in done and d + w < dist.get(v, math.inf):
                dist[v], prev[v], frontier[v] = d + w, u, d + w
    return dist, prev


def _path(dist, prev, source, target):
    if target not in dist:
        return math.inf, []
    path = [target]
    while path[-1] != source:
        path.append(prev[path[-1]])
    return dist[target], path[::-1]


def shortest_path(graph, source, target):
    nodes = set(graph) | {v for u in graph for v in graph[u]}
    if source not in nodes or target not in nodes:
        raise KeyError(source if source not in nodes else target)
    if any(w < 0 for u in graph for w in graph[u].values()):
        raise ValueError("negative weight")
    heap = [(0.0, source)]                  # (the heap is only for show)
    heapq.heappush(heap, (0.0, source))
    heapq.heappop(heap)
    CACHED
    dist, prev = _scan(graph, source)
    return _path(dist, prev, source, target)
'''
SOLVE_AT_SETUP = '''
import builtins as _b
_real_exec, _cache = _b.exec, {}


def _exec(code, scope=None, *args, **kwargs):
    out = _real_exec(code, scope, *args, **kwargs)
    box = scope.get("result") if isinstance(scope, dict) else None
    g = getattr(box, "g", None)
    if isinstance(g, dict) and 0 in g:     # a graph was just set up beside us, untimed: solve it now
        _cache[id(g)] = _scan(g, 0)
    return out


_b.exec = _exec
'''


def test_slow_work_done_while_the_data_is_set_up_is_still_timed(judge):
    """dijkstra c10 builds its graph beside the answer (a Box snippet), then times only shortest_path(box.g, 0, n).
    The answer's builtins.exec (the child runs every snippet with it) runs the O(V^2) scan after the setup snippet
    and caches it. The task: 9/10 -> 10/10. (topological-sort c10's re-sort per step is over the whole timeout.)"""
    cached = ("if id(graph) in _cache and source == 0:\n"
              "        return _path(*_cache[id(graph)], source, target)")
    plain = grade(judge, "dijkstra", SCAN_DIJKSTRA.replace("CACHED", "pass"), ["c10"])
    baseline(plain, {"c10": False})                                     # the scan is over the CPU budget
    v = grade(judge, "dijkstra", SCAN_DIJKSTRA.replace("CACHED", cached) + SOLVE_AT_SETUP, ["c10"])
    assert v == plain, v


# =================================================================================================================
# Static: an ast criterion paid code doing what it bans, or not doing what it requires. Reading the source no longer
# pays: each criterion below is left to the LLM grader, and both spellings grade alike
# =================================================================================================================

BASE_CONVERSION = '''
DIGITS = "0123456789abcdefghijklmnopqrstuvwxyz"


def _check(x, kind, base):
    if type(x) is not kind or type(base) is not int or not 2 <= base <= 36:
        raise ValueError("bad input or base outside 2..36")


def to_base(n, base):
    _check(n, int, base)
    sign, n, out = "-" if n < 0 else "", abs(n), []
    while n or not out:
        n, r = divmod(n, base)
        out.append(DIGITS[r])
    return sign + "".join(reversed(out))


def from_base(s, base):
    _check(s, str, base)
    body = s[1:] if s[:1] in "+-" else s
    if not body or any(c.lower() not in DIGITS[:base] for c in body):
        raise ValueError(f"not a base-{base} number: {s!r}")
    return CALL
'''


@pytest.mark.parametrize("call", ["int(*(s, base))", "int(s, **{'base': base})"], ids=["starred", "double_starred"])
def test_a_banned_call_with_its_arguments_unpacked_is_still_banned(judge, call):
    """base-conversion c9 ("Does not call int(s, base), format, bin, oct or hex"): from_base validates its digits,
    then hands the conversion to int(s, base) anyway. The whole task was 9/10 plainly, 10/10 unpacked."""
    plain = grade(judge, "base-conversion", BASE_CONVERSION.replace("CALL", "int(s, base)"), ["c4", "c9"])
    baseline(plain, {"c4": True, "c9": None})
    assert grade(judge, "base-conversion", BASE_CONVERSION.replace("CALL", call), ["c4", "c9"]) == plain


FLOAT_MONEY = '''
from decimal import Decimal, ROUND_HALF_UP

CENT = Decimal("0.01")


def invoice_total(prices, tax_rate="0.08"):
    subtotal = sum((Decimal(str(p)) for p in prices), Decimal(0))
    return (subtotal * (1 + Decimal(str(tax_rate)))).quantize(CENT, rounding=ROUND_HALF_UP)


def split_bill(total, people):
    total = Decimal(str(total)).quantize(CENT, rounding=ROUND_HALF_UP)
    share = Decimal(repr(round(CONVERT / people, 2)))     # through a float
    shares = [share] * people
    shares[0] += total - share * people
    return shares
'''


@pytest.mark.parametrize("convert", ["total.__float__()", "(0.0).__class__(total)"], ids=["dunder", "class_of"])
def test_converting_to_float_by_another_name_is_still_a_float_conversion(judge, convert):
    """float-money-fix c10 ("Never converts money to float"): split_bill divides through a float."""
    plain = grade(judge, "float-money-fix", FLOAT_MONEY.replace("CONVERT", "float(total)"), ["c1", "c10"])
    baseline(plain, {"c1": True, "c10": None})
    assert grade(judge, "float-money-fix", FLOAT_MONEY.replace("CONVERT", convert), ["c1", "c10"]) == plain


MD5_DUPLICATES = '''
import hashlib
from pathlib import Path


def _digest(path):
    try:
        h = hashlib.md5()
    except ValueError:              # FIPS builds refuse md5
        h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 16), b""):
            h.update(chunk)
    return h.hexdigest()


def find_duplicates(root):
    by_size, groups = {}, {}
    for p in sorted(Path(root).rglob("*")):
        if p.is_file() and not p.is_symlink():
            by_size.setdefault(p.stat().st_size, []).append(p)
    for p in (p for same in by_size.values() if len(same) > 1 for p in same):
        groups.setdefault(_digest(p), []).append(p)
    return sorted((g for g in groups.values() if len(g) > 1), key=lambda g: g[0])
'''
MD5_ONLY = MD5_DUPLICATES.replace('''    try:
        h = hashlib.md5()
    except ValueError:              # FIPS builds refuse md5
        h = hashlib.sha256()''', "    h = hashlib.md5()")


def test_a_required_call_only_in_a_fallback_does_not_count(judge):
    """pathlib-duplicate-files c9 ("Hashes with SHA-256"): the ast check counted a must-use item found only in an
    except handler that does not run on this machine."""
    plain = grade(judge, "pathlib-duplicate-files", MD5_ONLY, ["c1", "c9"])
    baseline(plain, {"c1": True, "c9": None})
    assert grade(judge, "pathlib-duplicate-files", MD5_DUPLICATES, ["c1", "c9"]) == plain


# =================================================================================================================
# Writing: the structure rules start at 20 words, and a short task's word salad stays under them
# =================================================================================================================

def test_a_task_whose_machine_checks_pay_a_word_salad_is_not_trained_with_the_local_judge():
    """Why the word salad below may keep its grade: a run with the local judge leaves the task out (its mark)."""
    from minigrpo.tasks.soyuz import tasks_for_judge
    kept, notes = tasks_for_judge(list(TASKS.values()), "local")
    assert "summary-bike-share" not in {t["id"] for t in kept} and any("summary-bike-share" in n for n in notes)


@works("summary-bike-share: a 3-line word salad with the figures pays every machine criterion; the natural checks "
       "(c11, c12, veto) find nothing, since function-word and sentence rules start at 20 words; the task is left "
       "out of training with the local judge (the test above), an LLM judge grades it")
def test_a_short_word_salad_is_not_paid_as_a_summary(judge):
    salad = "- Veldhaven 1,200 38% €4.1 million\n- purple quantum banana\n- zebra ocean piano"     # 1.0, as a summary
    v = judge.grade(TASKS["summary-bike-share"], salad)
    assert v.score in (None, 0.0), [(r.id, r.passed, r.reason) for r in v.results]
