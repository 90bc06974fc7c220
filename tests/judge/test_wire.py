"""The driver/sandbox channel keeps in-process semantics for honest answers where a criterion needs them: in one
about mutation ("shared": true) mutations of shared containers are seen on both sides, identity is kept, a new
container stored into an old one arrives whole; everywhere else containers cross as copies, so the answer cannot
change what the test holds. Exceptions keep their class, and a test that needs in-process objects gets them through
in_sandbox. A value costs what it is: one that holds the same list many times counts each time, on both kinds of
channel, and fails its case as too large instead of reaching a comparison."""

import pytest

from judging import fenced
from minigrpo.judge import wire
from minigrpo.judge.checks import run_python_checks
from minigrpo.judge.driver_answer import STALL_S, TOO_LARGE
from redteam import only

CODE = '''
class Oops(ValueError):
    pass

def keep(acc):
    new = [1, 2]
    acc.append(new)           # a new container stored into one the test owns
    return new

def nest(d):
    d["k"] = {"x": [3]}
    return d["k"]

def same(xs):
    return xs

def clear(xs):
    xs.clear()
    return len(xs)

def fail():
    raise Oops("no")

def dag(levels):              # the same list twice at every level: 2 ** levels leaves as a tree
    node = []
    for _ in range(levels):
        node = [node, node]
    return node

def chain_top_down(xs, tick, levels):
    nodes = [[] for _ in range(levels + 1)]
    xs.append(nodes[levels])            # the top, in the test's list
    for k in range(levels, 0, -1):      # each level filled after the level above refers to it: one message each
        nodes[k].extend([nodes[k - 1], nodes[k - 1]])
        tick()

def fill_with_dag(xs, levels, then=None):
    xs.append(dag(levels))
    if then is not None:
        next(then)            # the DAG crosses in this step's sync, not in a reply
'''

SHARED = {
    "new container into an old one": 'acc = [0]\nr = keep(acc)\nassert r == [1, 2] and acc == [0, [1, 2]] and acc[1] is r',
    "nested dict": 'd = {}\nk = nest(d)\nassert d == {"k": {"x": [3]}} and d["k"] is k',
    "identity": 'xs = [1]\nassert same(xs) is xs',
    "a mutation is seen": 'xs = [1, 2]\nassert clear(xs) == 0 and xs == []',
}
COPIED = {
    "a mutation stays in the answer": 'xs = [1, 2]\nassert clear(xs) == 0 and xs == [1, 2]',
    "a copy comes back": 'xs = {1: [2]}\nys = same(xs)\nassert ys == xs and ys is not xs and ys[1] is not xs[1]',
    "sets and bytearrays": 'assert same({1, (2, 3)}) == {1, (2, 3)} and same(bytearray(b"ab")) == bytearray(b"ab")',
    "a small DAG arrives as a tree": 'v = dag(3)\nw = [[], []]\nassert v == [[w, w], [w, w]] and v[0] is not v[1]',
    "exception class": 'assert raises(ValueError, fail) and raises(Oops, fail) and not raises(KeyError, fail)',
    "in_sandbox": 'assert in_sandbox("result = [keep([]), same((1, 2))]") == [[1, 2], (1, 2)]',
}


def run(test, shared=False):
    check = {"type": "python", "test": test, "timeout": 10, **({"shared": True} if shared else {})}
    [(passed, reason)] = run_python_checks([check], f"```python\n{CODE}\n```")
    return passed, reason


@pytest.mark.parametrize("name", list(SHARED))
def test_a_mutation_criterion_shares_containers(name):
    passed, reason = run(SHARED[name], shared=True)
    assert passed is True, reason


@pytest.mark.parametrize("name", list(COPIED))
def test_containers_cross_as_copies_by_default(name):
    passed, reason = run(COPIED[name])
    assert passed is True, reason


@pytest.mark.parametrize("test, shared", [
    ("dag(64)", False), ("dag(64)", True), ("raises(Exception, dag, 64)", False),
    ("in_sandbox('result = dag(64)')", False), ("xs = []\nfill_with_dag(xs, 64)\nassert xs == [dag(3)]", True),
    ("xs = []\nfill_with_dag(xs, 64, iter(range(3)))", True), ("xs = []\nchain_top_down(xs, lambda: 0, 64)", True),
], ids=["returned", "returned_shared", "under_raises", "in_sandbox", "synced_into_a_shared_input",
        "synced_before_a_step", "built_top_down_over_many_messages"])
def test_a_reply_that_stands_for_an_exponential_value_fails_its_case_as_too_large(test, shared):
    passed, reason = run(test, shared)
    assert passed is False and reason.startswith(TOO_LARGE), reason


def test_the_size_of_a_value_counts_every_reference_as_a_copy():
    codec = wire.Codec("d", None)
    leaf = list(range(1000))
    assert codec.encode([leaf] * 1000)[1][0] == ["L", leaf]           # a million parts: under the cap, sent as a tree
    with pytest.raises(wire.TooLarge):
        codec.encode([[leaf] * 1000] * 100)                      # a hundred million parts
    shared = wire.Codec("c", None, share=True)
    node = []
    for _ in range(40):
        node = [node, node]
    message = shared.encode(node)                                # a few entries: one per level
    with pytest.raises(wire.TooLarge):
        peer = wire.Codec("d", None, share=True)
        peer.preregister({"ok": message})
        peer.check_size(peer.decode(message))


DAG_SAMPLER = '''
import math


class WeightedSampler:
    def __init__(self, items, weights):
        if len(items) != len(weights) or not items:
            raise ValueError("items and weights must be non-empty and of one length")
        if any(not math.isfinite(w) or w < 0 for w in weights) or not sum(weights) > 0:
            raise ValueError("bad weights")

    def sample(self, rng):
        rng.random()
        node = []
        for _ in range(64):           # 64 levels of the same list twice: a few entries on a shared channel
            node = [node, node]
        return node

    def sample_many(self, rng, k):
        if k < 0:
            raise ValueError("k < 0")
        return [self.sample(rng) for _ in range(k)]
'''


def test_a_sampler_that_returns_an_exponential_value_fails_on_its_size_not_as_a_stall(judge):
    """weighted-choice answered with a 64-level DAG of shared lists: comparing two such values in the driver takes
    2^64 steps, which was charged to the answer as a stall. Each criterion that draws a sample now fails as too
    large, on copied channels (c3: 5,000 samples from a snippet, c5: two samples compared) and a shared one (c8).
    One criterion per grade: a failed case is charged its whole timeout, which would leave the next one unrun; each
    on its own check, without the behaviour criterion it counts beside, since its own reason is what is tested."""
    futures = {cid: judge.submit(alone("weighted-choice", cid), fenced(DAG_SAMPLER)) for cid in ["c3", "c5", "c8"]}
    reasons = {cid: [(r.passed, r.reason) for r in f.result().results] for cid, f in futures.items()}
    assert all(not ok and reason.startswith(TOO_LARGE) for [(ok, reason)] in reasons.values()), reasons


def alone(task_id, cid):
    """The task with the one criterion cid, graded on its own check (its only_if pairing dropped)."""
    task = only(task_id, [cid])
    [c] = [dict(c, check={k: v for k, v in c["check"].items() if k != "only_if"}) for c in task["criteria"]
           if c["id"] == cid]
    return dict(task, criteria=[c])


SLOW_CALLBACK = "def f(callback):\n    return callback() + 1\n"


def test_the_drivers_own_work_is_not_the_answers_stall():
    """The answer waits on a callback of the test's that keeps the driver busy past the stall limit: that is the
    driver's time, not the answer's, so the criterion passes (the stall clock runs only while the driver waits for
    the answer)."""
    test = f"import time\nassert f(lambda: time.sleep({STALL_S + 1}) or 1) == 2\n"
    [(ok, reason)] = run_python_checks([{"type": "python", "test": test, "timeout": 10}], fenced(SLOW_CALLBACK))
    assert ok is True, reason


# A set or dict the driver builds from a reply costs what the reply's size allows: values that share one hash
# (the integers k * (2**61 - 1) all hash to 0) would make it cost n * n / 2 comparisons, so over MAX_SAME_HASH of
# them are refused by rule before any table is built.
P61 = 2 ** 61 - 1
COLLIDING = [k * P61 for k in range(1, 20_001)]
FORGED_SET = '''
import json, os, struct, time


def f(x):
    if x == 1:      # a reply written straight to the channel: integers of hash 0, tagged as a set or a dict
        keys = [k * (2 ** 61 - 1) for k in range(1, %d)]
        value = ["E", keys] if %r == "set" else ["D", [[k, 0] for k in keys]]
        data = json.dumps({"ok": value, "sync": []}).encode()
        for fd in range(3, 12):
            try:
                os.write(fd, struct.pack(">I", len(data)) + data)
            except OSError:
                pass
        time.sleep(60)
    return x
'''


def forged(tag, n=len(COLLIDING)):
    return FORGED_SET % (n + 1, tag)


@pytest.mark.parametrize("e", [["E", COLLIDING], ["Z", COLLIDING], ["D", [[k, 0] for k in COLLIDING]],
                               ["L", [1, ["E", COLLIDING[:wire.MAX_SAME_HASH + 1]]]],
                               ["T", [["D", [[["T", [k, 1]], 0] for k in COLLIDING]]]]],
                         ids=["set", "frozenset", "dict", "nested_nine", "tuple_keys"])
def test_values_that_share_a_hash_are_refused_before_a_set_or_dict_is_built(e):
    with pytest.raises(wire.ProtocolError, match="share one hash"):
        wire.Codec("d", None, call_only=True).decode(e)


def test_a_shared_set_refilled_with_values_that_share_a_hash_is_refused():
    peer = wire.Codec("d", None, share=True)
    xs = peer.decode(["M", "cm1", "set", [1, 2]])
    with pytest.raises(wire.ProtocolError, match="share one hash"):
        peer.apply([["cm1", COLLIDING]])
    with pytest.raises(wire.ProtocolError, match="share one hash"):
        peer.decode(["M", "cm2", "dict", [[k, 0] for k in COLLIDING]])
    assert xs == {1, 2}


@pytest.mark.parametrize("value", [
    {-1, -2, 0, 1.5, "a", (1, 2), frozenset({3})},           # -1 and -2 share a hash: two of one hash are fine
    set(COLLIDING[:wire.MAX_SAME_HASH]), frozenset(range(10_000)),
    {k: [k] for k in COLLIDING[:wire.MAX_SAME_HASH]}, {(i, -1): i for i in range(1000)} | {-1: 0, -2: 1},
])
def test_honest_sets_and_dicts_cross_and_compare_equal(value):
    assert wire.Codec("d", None, call_only=True).decode(wire.Codec("c", None).encode(value)) == value


@pytest.mark.parametrize("tag", ["set", "dict"])
def test_a_forged_reply_of_values_that_share_a_hash_fails_its_case_by_rule(tag):
    """The answer writes the reply itself: the case fails on the rule, with the honest case beside it passing,
    instead of the driver building the set in n * n / 2 comparisons (minutes at 200,000 values)."""
    checks = [{"type": "python", "test": f"assert f({x}) == {x}", "timeout": 5} for x in (1, 2)]
    [(bad, reason), (good, _)] = run_python_checks(checks, fenced(forged(tag)))
    assert bad is False and "share one hash" in reason and good is True, reason


def test_an_exception_raised_back_across_the_channel_is_the_object_first_raised():
    """A callback's exception that the answer re-raises comes back as that object (a test may ask `is`); a copy the
    answer made, or a token this side never sent, comes back as a new object; the peer's token of an exception
    made here goes back with it when it is raised back; only the last KEPT_EXCEPTIONS keep their identity."""
    from minigrpo.judge.driver_answer import DriverEndpoint
    side = DriverEndpoint(None, None, lambda *a: None, None)
    words = ["ConnectionError", "ConnectionError", "failure 3"]
    first = ConnectionError("failure 3")
    token = side.identity(first)["token"]
    assert side.raised_here({"raise": words, "yours": token}) is first
    copy = side.raised_here({"raise": words, "token": "a1"})
    assert copy is not first and type(copy) is ConnectionError and str(copy) == "failure 3"
    assert side.raised_here({"raise": words, "yours": "0" * 16}) is not first
    assert side.identity(copy) == {"yours": "a1"} and "token" in side.identity(ConnectionError("failure 3"))
    for i in range(side.KEPT_EXCEPTIONS):
        side.identity(ValueError(i))
    assert side.raised_here({"raise": words, "yours": token}) is not first
