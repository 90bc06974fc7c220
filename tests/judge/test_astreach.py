"""The code-inspection check counts live code only (minigrpo/judge/astreach.py): what the entry points reach, module-level
code, never comments, strings, unreachable definitions or branches a static test never takes; getattr with a
static name is an attribute."""

import time

import pytest

from minigrpo.judge.checks import run_check, validate_check


def check(src, **kw):
    spec = {"type": "ast", **kw}
    validate_check(spec)
    return run_check(spec, "Here:\n```python\n" + src + "\n```\n")[0]


HEAP_IN_A_COMMENT = '''
import bisect


class RunningMedian:
    """Keeps the values sorted (heapq would be the textbook choice)."""

    def __init__(self):
        self.xs = []    # heapq.heappush(self.low, -x) -- not needed

    def add(self, x):
        bisect.insort(self.xs, x)
'''


def test_a_name_in_a_comment_or_docstring_is_not_a_use():
    assert check(HEAP_IN_A_COMMENT, calls=["heapq.*"], entry=["RunningMedian"]) is False
    assert check(HEAP_IN_A_COMMENT, names=["heapq.*"]) is False
    assert check(HEAP_IN_A_COMMENT, calls=["bisect.*"], entry=["RunningMedian"]) is True


def test_a_banned_call_in_a_docstring_or_string_is_not_a_use():
    src = 'import heapq\n\n\nclass RunningMedian:\n    """Two heaps, never sorted(xs) or xs.sort()."""\n\n' \
          '    def add(self, x):\n        heapq.heappush(self.h, x)\n        return "sorted(" + ".sort("\n'
    assert check(src, calls=["sorted", ".sort"], must=False, entry=["RunningMedian"]) is True
    assert check(src + "\n    def median(self):\n        return sorted(self.h)[0]\n", calls=["sorted"],
                 must=False, entry=["RunningMedian"]) is False     # a real call in a method of the class


PIVOT_HELPER = "def {name}(df):\n    return df.pivot_table(index='region', fill_value=0)\n\n\n"


@pytest.mark.parametrize("caller", [
    "def sales_report(df):\n    return {name}(df)\n",                                    # called by the entry
    "def sales_report(df):\n    return [f(df) for f in (len, {name})]\n",                # referenced, called later
    "class Report:\n    def build(self, df):\n        return {name}(df)\n\n\n"
    "def sales_report(df):\n    return Report().build(df)\n",                               # through a reached class
    "STEPS = [{name}]\n\n\ndef sales_report(df):\n    return STEPS[0](df)\n",              # module-level code runs
])
def test_a_reached_helper_counts(caller):
    src = PIVOT_HELPER.format(name="_pivot") + caller.format(name="_pivot")
    assert check(src, calls=[".pivot_table"], entry=["sales_report"]) is True


@pytest.mark.parametrize("src", [
    PIVOT_HELPER.format(name="_unused") + "def sales_report(df):\n    return df.groupby('region').sum()\n",
    PIVOT_HELPER.format(name="helper") + "def sales_report(df):\n    return df\n",     # public, yet not an entry
    "def sales_report(df):\n    if False:\n        df.pivot_table()\n    return df\n",
    "def sales_report(df):\n    if 0:\n        df.pivot_table()\n    return df\n",
    "def sales_report(df):\n    if not True:\n        df.pivot_table()\n    return df\n",
    "def sales_report(df):\n    while 0:\n        df.pivot_table()\n    return df\n",
    "def sales_report(df):\n    return df\n    df.pivot_table()\n",
    "def sales_report(df):\n    raise ValueError\n    df.pivot_table()\n",
    "def sales_report(df):\n    for _ in []:\n        df.pivot_table()\n    return df\n",
    "def sales_report(df):\n    return df.pivot_table() if 0 else df\n",
    "def sales_report(df):\n    return False and df.pivot_table()\n",
    "DEBUG = False\n\n\ndef sales_report(df):\n    if DEBUG:\n        df.pivot_table()\n    return df\n",
    "import typing\nif typing.TYPE_CHECKING:\n    import pandas\n    pandas.DataFrame().pivot_table()\n",
    "class Unused:\n    def build(self, df):\n        return df.pivot_table()\n\n\n"
    "def sales_report(df):\n    return df\n",
    "import functools\n\n\n@functools.lru_cache\ndef _cached(df):\n    return df.pivot_table()\n\n\n"
    "def sales_report(df):\n    return df\n",                                             # an inert decorator
    "def sales_report(df):\n    def inner():\n        return df.pivot_table()\n    return df\n",   # never used
], ids=["unreachable_def", "public_non_entry", "if_false", "if_0", "if_not_true", "while_0", "after_return",
        "after_raise", "for_over_empty", "ifexp_0", "false_and", "module_constant", "type_checking",
        "unreached_class", "lru_cache_only", "unused_inner"])
def test_dead_code_does_not_count(src):
    assert check(src, calls=[".pivot_table"], entry=["sales_report"]) is False


def test_the_other_branch_of_a_static_test_counts():
    assert check("def sales_report(df):\n    if 0:\n        return df\n    else:\n        return df.pivot_table()\n",
                 calls=[".pivot_table"], entry=["sales_report"]) is True
    assert check("def sales_report(df):\n    if len(df) < 0:\n        df.pivot_table()\n    return df\n",
                 calls=[".pivot_table"], entry=["sales_report"]) is True   # not static: taken both ways


def test_entries_default_to_public_definitions_and_take_patterns():
    src = "import pytest, heapq\n\n\n@pytest.fixture\ndef data():\n    return heapq.nsmallest(2, [3, 1])\n\n\n" \
          "def _helper():\n    heapq.heapify([])\n\n\ndef test_it(data):\n    assert data\n"
    assert check(src, calls=["heapq.nsmallest"], entry=["test_*"]) is True     # a fixture: its decorator uses it
    assert check(src, calls=["heapq.heapify"], entry=["test_*"]) is False
    assert check(src, calls=["heapq.heapify"]) is False                         # default: public names only
    assert check(src.replace("def _helper", "def helper"), calls=["heapq.heapify"]) is True


def test_methods_bases_and_decorated_framework_functions_are_reached():
    src = "import heapq\n\n\nclass Base:\n    def push(self, x):\n        heapq.heappush(self.h, x)\n\n\n" \
          "class RunningMedian(Base):\n    pass\n"
    assert check(src, calls=["heapq.heappush"], entry=["RunningMedian"]) is True
    assert check(src, calls=["heapq.heappush"], entry=["Other"]) is False
    app = "from fastapi import FastAPI, Query\napp = FastAPI()\n\n\n@app.get('/items')\n" \
          "def list_items(size: int = Query(10, le=100)):\n    return paginate(size)\n\n\ndef paginate(n):\n" \
          "    return n\n"
    assert check(app, calls=[".paginate"], entry=["app"]) is True              # registered by its decorator


@pytest.mark.parametrize("fetch", [
    'getattr(df, "apply")', 'getattr(df, "app" + "ly")', 'getattr(df, f"{\'app\'}ly")',
    'getattr(df, "".join(["ap", "ply"]))', 'getattr(df, NAME)', 'getattr(df, "apply", None)',
])
def test_getattr_with_a_static_name_is_the_attribute(fetch):
    src = f"NAME = 'ap' + 'ply'\n\n\ndef sales_report(df):\n    return {fetch}(len, axis=1)\n"
    assert check(src, calls=[".apply"], must=False, entry=["sales_report"]) is False
    assert check(src, calls=[".apply(axis=1)"], entry=["sales_report"]) is True
    assert check(src, attributes=["apply"], entry=["sales_report"]) is True


def test_names_bound_once_are_followed():
    alias = "def sales_report(df):\n    ap = df.apply\n    return ap(len, axis=1)\n"
    assert check(alias, calls=[".apply"], must=False) is False
    push = "from heapq import heappush\n\n\ndef add(h, x):\n    push = heappush\n    push(h, x)\n"
    assert check(push, calls=["heapq.heappush"]) is True
    assert check("M = 100\n\n\ndef f(q=Query(le=M)):\n    pass\n", calls=["*(le=100)"]) is True
    twice = "M = 100\nM = 5\n\n\ndef f(q=Query(le=M)):\n    pass\n"     # bound twice: not a constant
    assert check(twice, calls=["*(le=100)"]) is False
    loop = "def f(a):\n    x = a.b\n    y = x.c\n    x = y.d\n    return y.e()\n"    # a cycle through aliases
    assert check(loop, calls=[".e"]) is True


def test_a_computed_lookup_makes_every_definition_count_for_a_banned_item():
    src = "def _rows(df):\n    return df.apply(len, axis=1)\n\n\ndef sales_report(df):\n" \
          "    return globals()['_ro' + 'ws'](df)\n"
    assert check(src, calls=[".apply"], must=False, entry=["sales_report"]) is False
    assert check(src, calls=[".apply"], entry=["sales_report"]) is False       # a required item is not given
    quiet = src.replace("globals()['_ro' + 'ws'](df)", "df")
    assert check(quiet, calls=[".apply"], must=False, entry=["sales_report"]) is True


def test_loops_and_unmanaged_kinds():
    rows = "def sales_report(df):\n    for i in range(len(df)):\n        pass\n    return df\n"
    assert check(rows, loops=["df"], must=False) is False
    assert check("def sales_report(df):\n    return [c for c in ('a', 'b')]\n", loops=["df"], must=False) is True
    assert check("def f():\n    while True:\n        break\n", loops=["*"], must=False) is False
    opened = "def f(p):\n    with open(p) as a:\n        pass\n    b = open(p)\n"
    assert check(opened, unmanaged=["open"], must=False) is False
    assert check(opened.replace("    b = open(p)\n", ""), unmanaged=["open"], must=False) is True


@pytest.mark.parametrize("bad, match", [
    ({"type": "ast", "calls": ["x"], "entry": "main"}, "entry must be a list"),
    ({"type": "ast", "calls": ["x"], "entry": ["a b"]}, "entry must be a list"),
    ({"type": "ast", "loops": ["df(x)"]}, "a name, not a call"),
])
def test_validation_of_entry_and_loops(bad, match):
    with pytest.raises(ValueError, match=match):
        validate_check(bad)


@pytest.mark.parametrize("src", [
    "A = 'x'\n" + "".join(f"A{i + 1} = A{i or ''} + A{i or ''}\n" for i in range(200)) + "getattr(d, A200)()\n",
    "x = " + "not " * 3000 + "1\nif x:\n    pass\n",
    "if " + " and ".join(["1"] * 5000) + ":\n    pass\n",
    "".join(f"a{i} = a{i + 1}.x\n" for i in range(3000)) + "a0()\n",
    "class C:\n" + "".join(f"    def m{i}(self):\n        return C.m{i + 1}\n" for i in range(3000)),
])
def test_static_evaluation_and_walks_are_bounded(src):
    t0 = time.thread_time()
    assert check(src, calls=["print"], must=False) in (True, False)
    assert check(src, calls=["print"]) in (True, False)
    assert time.thread_time() - t0 < 2.0


@pytest.mark.parametrize("limit", [1000, 2000, 10000])   # Python's default, torch.compile's, a test driver's
def test_what_counts_as_code_does_not_follow_the_recursion_limit(limit):
    """A training process that ran torch.compile has a higher recursion limit: the same answer grades the same."""
    import sys
    from minigrpo.judge import answer_code
    from minigrpo.judge.astcheck import MAX_DEPTH, parse_code
    before = sys.getrecursionlimit()
    sys.setrecursionlimit(limit)
    try:
        for cached in (answer_code._fenced, answer_code.extract_code, parse_code):
            cached.cache_clear()
        chain = lambda n: "x = y" + " + y" * n           # a left-leaning chain: tree depth ~ n
        assert parse_code(chain(MAX_DEPTH - 10)) is not None
        assert parse_code(chain(MAX_DEPTH)) is None and parse_code(chain(2500)) is None
        bomb = "-" * 2500 + "1"                             # parses at every limit here: refused by depth alone
        assert answer_code.extract_code(bomb) == ""
        assert run_check({"type": "ast", "calls": ["print"], "must": False}, "```python\n" + bomb + "\n```")[0] is False
    finally:
        sys.setrecursionlimit(before)
        for cached in (answer_code._fenced, answer_code.extract_code, parse_code):
            cached.cache_clear()
