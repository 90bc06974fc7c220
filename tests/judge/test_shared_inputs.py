"""A test decides on data the answer cannot reach. The driver hands the answer copies of the containers a test
passes (and takes copies of what it returns); only a criterion about mutation ("shared": true) keeps reference
semantics, and there the test may only compare a container it passed with what it took before the call. A static
reading of every test in the task file checks both halves; the attacks below are answers that rewrite the test's
own data after the call."""

import pytest

from judging import TASKS, fenced
from minigrpo.judge.checks import run_python_checks, validate_check
from passed_containers import misplaced_reads
from redteam import grade, passed


def python_checks():
    def flat(check):
        yield check
        for sub in check.get("checks", []):
            yield from flat(sub)
    for task in TASKS.values():
        for c in task["criteria"]:
            for check in flat(c["check"]) if c["check"] else []:
                if check["type"] == "python":
                    yield f"{task['id']} {c['id']}", c["text"], check


def test_no_test_decides_on_a_container_the_answer_could_change():
    bad = {where: found for where, _, check in python_checks()
           if (found := misplaced_reads(check["test"], check.get("shared") is True))}
    assert not bad, f"mark a mutation check \"shared\"; in a shared one compare only what was taken before: {bad}"


def test_only_criteria_about_mutation_share_containers():
    shared = {where: text for where, text, check in python_checks() if "shared" in check}
    words = ("mutat", "alias", "copied", "changes to")
    assert shared and all(any(w in text.lower() for w in words) for text in shared.values()), shared


@pytest.mark.parametrize("source, shared, found", [
    ("g = {'a': ['b']}\norder = topological_sort(g)\nfor a, bs in g.items():\n    pass", True, [("g", 3, "read")]),
    ("g = {}\nd, path = in_sandbox('result = f(g)', g=g)\nx = sum(g[a] for a in path)", True, [("g", 3, "read")]),
    ("data = [1]\ncopy = list(data)\nmerge(data)\nassert data == copy", False, [("data", 4, "compare")]),
    ("data = [1]\ncopy = list(data)\nmerge(data)\nassert data == copy", True, []),
    ("w = [0, 1]\ns = Sampler(w)\nw[0] = 1\nassert s.sample() == 1", True, []),
    ("iv = [(1, 2)]\nassert merge(iv) == brute(iv)", False, []),
    ("iv = [(1, 2)]\nassert merge(iv) == brute(iv)", True, [("iv", 2, "read")]),
    ("g = {}\nr = f(g)\ng = {'new': 1}\nassert len(g) == 1", True, []),          # rebound: not the passed one
], ids=["topological_sort_c2_shared", "in_sandbox_kwargs", "vacuous_mutation_check", "mutation_check",
        "write_after_the_call", "copies_read_after_the_call", "expected_from_the_input_after_the_call", "rebound"])
def test_the_static_reading_finds_what_it_should(source, shared, found):
    assert misplaced_reads(source, shared) == found


# -- attacks: the answer rewrites the test's data after the call ---------------------------------------------------

BY_NAME = '''
def topological_sort(graph):
    nodes = sorted(set(graph) | {b for bs in graph.values() for b in bs})
    pos = {n: i for i, n in enumerate(nodes)}
    if any(pos[a] > pos[b] for a, bs in graph.items() for b in bs):
        TRICK
    return nodes
'''


def test_clearing_the_graph_does_not_pass_the_edge_criterion(judge):
    """topological-sort c2 reads `g` after the call: an answer that sorts by name and clears the caller's graph
    whenever its order breaks an edge left nothing to check (0.7 against 0.6 without the clearing)."""
    ids = ["c2", "c3", "c8"]
    plain = passed(grade(judge, "topological-sort", BY_NAME.replace("TRICK", "pass"), ids))
    attack = passed(grade(judge, "topological-sort", BY_NAME.replace("TRICK", "graph.clear()"), ids))
    assert plain == {"c2": False, "c3": False, "c8": False}, plain     # c3 and c8 (guards) count only beside c2
    assert attack == plain, attack


EMPTY_MERGE = '''
def merge_intervals(intervals):
    if any(s > e for s, e in intervals):
        raise ValueError("start after end")
    TRICK
    return []
'''


def test_emptying_the_input_does_not_match_a_reference_computed_after_the_call(judge):
    """interval-merge c9: `assert merge_intervals(iv) == brute(iv)` computes the expected value after the call,
    from the list the answer was handed: emptied, brute([]) == [] would match an answer that returns []."""
    plain = passed(grade(judge, "interval-merge", EMPTY_MERGE.replace("TRICK", "pass"), ["c9"]))
    attack = passed(grade(judge, "interval-merge", EMPTY_MERGE.replace("TRICK", "intervals.clear()"), ["c9"]))
    assert plain == attack == {"c9": False}, (plain, attack)


FORCED_SHARING = '''
import gc
for _codec in [o for o in gc.get_objects() if type(o).__name__ == "Codec"]:
    _codec.share = True           # the answer's own end of the channel, told to share anyway
'''


def test_an_answer_that_makes_its_end_share_fails_the_case(judge):
    """The sharing is the driver's decision: a reply that sends shared containers on a channel that copies is not
    plain data, so an answer that switches its own end to sharing fails the criterion it would have won."""
    code = FORCED_SHARING + BY_NAME.replace("TRICK", "graph.clear()")
    verdict = grade(judge, "topological-sort", code, ["c2", "c3"])
    assert passed(verdict) == {"c2": False, "c3": False}, [(r.id, r.reason) for r in verdict.results]
    assert verdict.results[0].reason == "the answer's reply is not plain data"    # its names, as a shared dict


def test_a_container_the_test_keeps_is_unchanged_by_the_answer():
    """What the test holds after the call is what it held before, also for a container handed in a stand-in or
    to in_sandbox, and for a returned container the answer keeps and changes on a later call."""
    code = "KEEP = []\ndef f(x):\n    x.clear() if isinstance(x, list) else None\n    KEEP.append(1)\n    return KEEP\n"
    test = ("xs = [1, 2]\nf(xs)\nin_sandbox('f(ys)', ys=xs)\nfirst = f(0)\nf(0)\n"
            "assert xs == [1, 2] and first == [1, 1, 1]")
    [(ok, reason)] = run_python_checks([{"type": "python", "test": test, "timeout": 10}], fenced(code))
    assert ok is True, reason


def test_shared_must_be_a_boolean():
    with pytest.raises(ValueError, match="'shared'"):
        validate_check({"type": "python", "test": "pass", "shared": "yes"}, "task t: criterion c1")
