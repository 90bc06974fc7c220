"""No test asserts a wall time. A duration measured in a test depends on the machine and on whatever else it runs
(a 2-core CI box with another job beside it fails a budget a quiet laptop meets), so a test that compares one with a
constant fails for reasons that are not bugs. Overlap, concurrency and "did not wait" are asserted by the order of
events or by counts: timestamps compared with each other, never a difference of them with a number.

The check reads every test's syntax tree: a value is a clock reading when it comes from time.perf_counter(),
time.time() or time.monotonic() (or their _ns forms), directly or through the names it is assigned to, appended to
or stored in; a duration is a subtraction one of whose sides is a clock reading, and what is computed from one. A
comparison that a test asserts (in an assert, or in an `if` that fails the test), with a duration on one side and a
number (a literal, or a name bound to one) on the other, is flagged. A deadline that bounds a polling loop is not an
assertion: it keeps a test from hanging and is left alone.
"""
import ast
import glob
import os

from repo_root import ROOT

CLOCKS = {"perf_counter", "time", "monotonic", "perf_counter_ns", "time_ns", "monotonic_ns"}

def is_clock_call(node) -> bool:
    """time.perf_counter() and friends, or perf_counter() imported by name."""
    if not isinstance(node, ast.Call):
        return False
    f = node.func
    if isinstance(f, ast.Attribute):
        return f.attr in CLOCKS and isinstance(f.value, ast.Name) and f.value.id == "time"
    return isinstance(f, ast.Name) and f.id in CLOCKS - {"time"}


def mentions(node, names) -> bool:
    """Whether the expression reads one of `names`; len(...) is a count, whatever it counts."""
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "len":
        return False
    if isinstance(node, ast.Name) and node.id in names:
        return True
    return any(mentions(child, names) for child in ast.iter_child_nodes(node))


def holds_clock(node, clock_names) -> bool:
    return is_clock_call(node) or mentions(node, clock_names) or \
        any(holds_clock(c, clock_names) for c in ast.iter_child_nodes(node) if not isinstance(c, ast.Name))


def stores(scope):
    """(names written, the value written) for each assignment, append, item store and loop in `scope`."""
    for node in ast.walk(scope):
        if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign)) and node.value is not None:
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names = {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}
            yield names, node.value
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and \
                node.func.attr in ("append", "extend", "add", "insert", "setdefault", "update") and \
                isinstance(node.func.value, ast.Name):
            yield {node.func.value.id}, ast.Tuple(elts=list(node.args), ctx=ast.Load())
        elif isinstance(node, (ast.For, ast.comprehension)):
            yield {n.id for n in ast.walk(node.target) if isinstance(n, ast.Name)}, node.iter


def tainted(scope, seed_of):
    """The names whose values satisfy seed_of(value, names so far), to a fixed point."""
    names, writes = set(), list(stores(scope))
    while True:
        more = {n for targets, value in writes if seed_of(value, names) for n in targets} - names
        if not more:
            return names
        names |= more


def is_duration(node, clock_names, duration_names) -> bool:
    if mentions(node, duration_names):
        return True
    return any(isinstance(n, ast.BinOp) and isinstance(n.op, ast.Sub) and
               (holds_clock(n.left, clock_names) or holds_clock(n.right, clock_names)) for n in ast.walk(node))


def is_number(node, numeric_names) -> bool:
    if isinstance(node, ast.Constant):
        return isinstance(node.value, (int, float)) and not isinstance(node.value, bool)
    if isinstance(node, ast.UnaryOp):
        return is_number(node.operand, numeric_names)
    if isinstance(node, ast.BinOp):
        return is_number(node.left, numeric_names) and is_number(node.right, numeric_names)
    return isinstance(node, ast.Name) and node.id in numeric_names


def fails_the_test(body) -> bool:
    """An `if` body that fails the test: it raises, asserts, or calls pytest.fail."""
    return any(isinstance(n, (ast.Raise, ast.Assert)) or
               (isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == "fail")
               for stmt in body for n in ast.walk(stmt))


def asserted(scope):
    """The comparisons a test asserts: inside an assert, or the condition of an `if` that fails the test."""
    for node in ast.walk(scope):
        if isinstance(node, ast.Assert) or (isinstance(node, ast.If) and fails_the_test(node.body)):
            yield from (n for n in ast.walk(node.test) if isinstance(n, ast.Compare))


def numeric_names(statements, names=frozenset()) -> set:
    """The names these statements bind to a number, or to arithmetic of numbers and such names (a budget such as
    LIMIT_S = 3.9, or serial = n * delay), to a fixed point; `a, b = 0.3, 2` binds each."""
    pairs = []
    for node in statements:
        if isinstance(node, ast.Assign):
            for t in node.targets:
                if isinstance(t, ast.Name):
                    pairs.append((t.id, node.value))
                elif isinstance(t, ast.Tuple) and isinstance(node.value, ast.Tuple) and \
                        len(t.elts) == len(node.value.elts):
                    pairs += [(e.id, v) for e, v in zip(t.elts, node.value.elts) if isinstance(e, ast.Name)]
    names = set(names)
    while True:
        more = {name for name, value in pairs if name not in names and is_number(value, names)}
        if not more:
            return names
        names |= more


def offenders_in(tree, rel):
    module = numeric_names(tree.body)
    scopes = [n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
    scopes += [m for c in tree.body if isinstance(c, ast.ClassDef) for m in c.body
               if isinstance(m, (ast.FunctionDef, ast.AsyncFunctionDef))]
    for scope in scopes:
        clock = tainted(scope, lambda v, names: holds_clock(v, names))
        duration = tainted(scope, lambda v, names: is_duration(v, clock, names))
        numeric = numeric_names(ast.walk(scope), module) - clock - duration
        for node in asserted(scope):
            sides = [node.left, *node.comparators]
            if any(is_duration(s, clock, duration) for s in sides) and any(is_number(s, numeric) for s in sides):
                yield f"{rel}::{scope.name}", node.lineno


def offenders(files) -> list:
    out = []
    for path in files:
        rel = os.path.relpath(path, ROOT)
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read(), path)
        out += offenders_in(tree, rel)
    return out


def test_no_test_compares_a_measured_duration_with_a_constant():
    files = sorted(glob.glob(os.path.join(ROOT, "tests", "**", "*.py"), recursive=True))
    bad = offenders(files)
    assert not bad, ("tests that compare a measured duration with a constant (assert the order of events or counts "
                     "instead):\n" + "\n".join(f"{name} (line {line})" for name, line in bad))


def check(source) -> list:
    return [line for _, line in offenders_in(ast.parse(source), "t.py")]


def test_the_check_finds_each_form_of_a_wall_time_assertion():
    flagged = '''
import time
from time import perf_counter
BUDGET_S = 3.9
def test_a():
    t0 = time.perf_counter()
    work()
    assert time.perf_counter() - t0 < 2.0
def test_b():
    t0 = time.monotonic()
    work()
    elapsed = time.monotonic() - t0
    assert elapsed < BUDGET_S
def test_c():
    stamps = []
    fake = lambda: stamps.append(perf_counter())
    run(fake)
    assert max(stamps) - min(stamps) <= 0.5
def test_d():
    t = {"start": time.time()}
    work()
    assert 1 > round(time.time() - t["start"], 1)
def test_e():
    t0 = time.perf_counter()
    work()
    if time.perf_counter() - t0 > 5:
        pytest.fail("too slow")
def test_f():
    delay, n = 0.3, 4
    serial = 2 * n * delay
    t0 = time.perf_counter()
    work()
    wall = time.perf_counter() - t0
    assert wall < 0.8 * serial
'''
    assert check(flagged) == [8, 13, 18, 22, 26, 34]


def test_the_check_leaves_order_of_events_counts_and_deadlines_alone():
    fine = '''
import time
def test_order():
    events = []
    run(lambda name: events.append((name, time.perf_counter())))
    starts = {n: t for n, t in events}
    assert starts["judge"] < starts["generate-end"]
    assert len(events) - 1 == 3
    assert sorted(t for _, t in events) == [t for _, t in events]
def test_no_clock():
    a, b = 5, 2
    assert a - b < 4
def test_polls_with_a_deadline():
    t0 = time.monotonic()
    while busy() and time.monotonic() - t0 < 20:
        time.sleep(0.1)
    assert not busy()
'''
    assert check(fine) == []
