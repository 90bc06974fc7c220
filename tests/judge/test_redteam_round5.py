"""A fifth red team against the local judge: answers that score more than the task's own honest-wrong answer
(tests/data/soyuz/<id>.bad.md) without doing the work. Each test asserts the secure behaviour, so it FAILS while
the attack works; `works(reason)` marks it a strict xfail on AssertionError until the task file is fixed. The
honest-wrong answer is graded beside the attack, and must itself be graded (a baseline that is not is a real
failure, not an expected one).

Groups:
  always raise   "raises ValueError on bad input" guards stand alone (no `only_if`): a module whose every
                 function is `raise ValueError` (or the error the guard names) is a do-nothing answer that meets
                 each of them. The do-nothing answer the judge's own tests try (every body `return None`) meets
                 none, so this one went unseen. Likewise a guard a constant or empty result meets (a sampler that
                 always draws one item, a completion that is always [], a median that always raises).
  echo           a fix task answered with the prompt's own code, unchanged (held in test_replayed_attacks.py)
  coverage       a cheaper, wrong algorithm that no hidden input tells from the right one: it scores like the
                 reference (and above the correct-but-naive answer the budgets are there to fail); or one that
                 ignores the input's structure, where the tests' inputs happen to agree with a trivial order
"""

import ast
import os

import pytest

from judging import TASKS, fenced, reference
from minigrpo.judge.answer_code import extract_code
from repo_root import ROOT


def works(reason):
    """The mark of an attack that works today: its assertion of the secure behaviour fails."""
    return pytest.mark.xfail(strict=True, raises=AssertionError, reason=reason)


def honest_wrong(task_id):
    with open(os.path.join(ROOT, "tests", "data", "soyuz", f"{task_id}.bad.md"), encoding="utf-8") as f:
        return f.read()


def explain(verdict):
    return [(r.id, r.passed, r.reason) for r in verdict.results]


def assert_no_more_than_honest_wrong(judge, task_id, attack):
    futures = {"attack": judge.submit(TASKS[task_id], fenced(attack)),
               "wrong": judge.submit(TASKS[task_id], honest_wrong(task_id))}
    got = {k: f.result() for k, f in futures.items()}
    wrong = got["wrong"]
    if wrong is None or wrong.score is None:
        raise RuntimeError(f"baseline not graded: {wrong}")     # not an AssertionError: a real failure
    attack = got["attack"]
    assert attack is None or attack.score is None or attack.score <= wrong.score, \
        (attack.score, wrong.score, explain(attack))


# =================================================================================================================
# Always raise: the reference answer's module (its imports, classes and signatures) with every function body
# `raise ValueError("x")`. For base-conversion that is just
#
#     def to_base(n, base):
#         raise ValueError("not implemented")
#
#     def from_base(s, base):
#         raise ValueError("not implemented")

class _AlwaysRaise(ast.NodeTransformer):
    def __init__(self, exception):
        self.exception = exception

    def visit_FunctionDef(self, node):
        node.body = [ast.parse(f'raise {self.exception}("not implemented")').body[0]]
        return node

    visit_AsyncFunctionDef = visit_FunctionDef


def always_raise(task_id, exception="ValueError"):
    tree = _AlwaysRaise(exception).visit(ast.parse(extract_code(reference(task_id))))
    return ast.unparse(ast.fix_missing_locations(tree))


# task: (the exception, the criteria the always-raising module passes, its score, the honest-wrong answer's score),
# measured on main at df56583
ALWAYS_RAISE_PAYS = {
    "base-conversion": ("ValueError", "c5 c6 c7 c8: rejects bad bases, invalid digits, empty strings and bare "
                        "signs, non-int input", 0.4, 0.2),
    "numpy-pairwise-distances": ("ValueError", "c6 c7: dimensions differ, non-2-D input", 0.2, 0.1),
    "naive-datetime-fix": ("ValueError", "c3 c4: a naive expires_at, a naive now", 0.2, 0.1),
    "sqlalchemy-top-customers": ("ValueError", "c6: n < 1", 0.1, 0.0),
    "pathlib-duplicate-files": ("NotADirectoryError", "c8: a missing root, a file as root", 0.1, 0.0),
}


# Closed: each guard counts only beside the task's main behaviour criterion (`only_if`), which such a module fails.
# The ValueError modules are test_replayed_attacks.py's always-raising answers, the same text: its raising test holds
# them to this bound too, so they are graded once; here the one that raises another exception.
@pytest.mark.parametrize("task_id", [t for t, (error, *_) in ALWAYS_RAISE_PAYS.items() if error != "ValueError"])
def test_a_module_that_always_raises_pays_no_more_than_the_honest_wrong_answer(judge, task_id):
    assert_no_more_than_honest_wrong(judge, task_id, always_raise(task_id, ALWAYS_RAISE_PAYS[task_id][0]))


# =================================================================================================================
# Head-only hashing: pathlib-duplicate-files groups same-size files by the SHA-256 of their first 64 KiB alone. That
# is wrong (two files of one size that differ after the first chunk are called duplicates) and cheaper than the
# task's algorithm, yet no test has such a pair: c1's same-size decoy differs at its 6th byte, c7's big twins are
# identical. It scores 1.0, like the reference; hashing whole files in one read (correct, not bounded) scores 0.9.

def head_only_duplicates():
    code = extract_code(reference("pathlib-duplicate-files"))
    loop = "        while chunk := f.read(CHUNK):\n            digest.update(chunk)\n"
    assert loop in code, "the reference's chunk loop moved: update this attack"
    return code.replace(loop, "        digest.update(f.read(CHUNK))     # the first chunk only\n")


# Closed in the task file; the attack as found:
#   pathlib-duplicate-files: hashing only each file's first 64 KiB (same-size files that differ later are grouped
#   as duplicates) passes every criterion: no test has two same-size files that differ after the first chunk;
#   scores 1.0 against the honest-wrong answer's 0.0
def test_hashing_only_the_first_chunk_does_not_pay_like_the_reference(judge):
    v = judge.grade(TASKS["pathlib-duplicate-files"], fenced(head_only_duplicates()))
    assert v is not None and v.score is not None and v.score < 1.0, explain(v)


# Ignoring the edges: topological-sort's tests where the edges agree with the names' order (an empty graph, targets
# only, a duplicate edge a -> b, the 50k chain n000000 -> n000001 -> ...) are passed by sorting the nodes by name.

SORTED_NODES = '''
def topological_sort(graph):
    nodes = set(graph)
    for targets in graph.values():
        nodes.update(targets)
    return sorted(nodes)
'''


# Closed in the task file; the attack as found:
#   topological-sort: the nodes sorted by name, every edge ignored, pass c1, c3, c7 and c9 (the 50k chain's names
#   sort in chain order): 0.4 against the honest-wrong answer's 0.2 (a DFS post-order, reversed)
def test_sorting_the_nodes_by_name_pays_no_more_than_the_honest_wrong_answer(judge):
    assert_no_more_than_honest_wrong(judge, "topological-sort", SORTED_NODES)


# A constant sampler: weighted-choice's c5 (one rng.random() per sample, deterministic), c7 (sample_many's count,
# k == 0, k < 0; its one-item sampler has a single right answer) and c8 (unaffected by later changes to the lists)
# are guards with no only_if that an answer ignoring every weight meets.

CONSTANT_SAMPLER = '''
class WeightedSampler:
    def __init__(self, items, weights):
        self.item = next(i for i, w in zip(items, weights) if w > 0)     # the first item that may be drawn, always

    def sample(self, rng):
        rng.random()
        return self.item

    def sample_many(self, rng, k):
        if k < 0:
            raise ValueError("k < 0")
        return [self.sample(rng) for _ in range(k)]
'''


# Closed in the task file; the attack as found:
#   weighted-choice: a sampler that always returns the first item of positive weight (one rng.random() call, the
#   weights otherwise ignored) passes c5, c7 and c8, which have no only_if: 0.33 against the honest-wrong answer's
#   0.22
def test_a_constant_sampler_pays_no_more_than_the_honest_wrong_answer(judge):
    assert_no_more_than_honest_wrong(judge, "weighted-choice", CONSTANT_SAMPLER)


# A counter for a median: streaming-median's c1 (median() of an empty stream raises ValueError) is a guard with no
# only_if that a median() which always raises meets; with a count for c6 (__len__) it outscores an honest attempt
# whose medians are wrong for even counts.

COUNTING_MEDIAN = '''
class RunningMedian:
    def __init__(self):
        self.n = 0

    def add(self, x):
        if x != x:
            raise ValueError("NaN")
        self.n += 1

    def median(self):
        raise ValueError("no median")

    def __len__(self):
        return self.n
'''


# Closed in the task file; the attack as found:
#   streaming-median: a class that only counts, its median() always raising ValueError, passes c1 (empty stream
#   raises; no only_if) and c6 (__len__): 0.22 against the honest-wrong answer's 0.0
def test_a_median_that_always_raises_pays_no_more_than_the_honest_wrong_answer(judge):
    assert_no_more_than_honest_wrong(judge, "streaming-median", COUNTING_MEDIAN)


# A set for a trie: trie-autocomplete's c3 (an unknown prefix, or k == 0, completes to []) is a guard with no only_if
# that a complete() which always returns [] meets; a set of words for membership and size adds c6 and c7.

WORD_SET = '''
class Trie:
    def __init__(self):
        self.words = set()

    def insert(self, word, weight=1):
        if not word or weight <= 0:
            raise ValueError("an empty word or a weight <= 0")
        self.words.add(word)

    def complete(self, prefix, k=5):
        return []

    def __contains__(self, word):
        return word in self.words

    def __len__(self):
        return len(self.words)
'''


# Closed in the task file; the attack as found:
#   trie-autocomplete: a set of words whose complete() always returns [] passes c3 (unknown prefix and k == 0 give
#   []; no only_if), c6, c7 and c8: 0.4 against the honest-wrong answer's 0.3, with no completion at all
def test_a_trie_that_completes_nothing_pays_no_more_than_the_honest_wrong_answer(judge):
    assert_no_more_than_honest_wrong(judge, "trie-autocomplete", WORD_SET)


# =================================================================================================================
# Echo: a fix task's prompt holds the code to fix; answering with that code unchanged is the do-nothing answer of
# a fix task. Where the code's flaw is only what one or two criteria measure (speed; structure) and the rest check
# that behaviour is kept, the untouched code outscores an honest attempt that got the behaviour wrong.

# Closed: the criteria the unchanged code meets count only beside one it fails (vectorize-loop-fix: the speed, c8;
# refactor-orders: the extracted helper shipping_cost, c2; file-handle-leak-fix: streaming, c7). Held by
# test_replayed_attacks.py's fix-task test, which grades every fix task's prompt code against its honest wrong answer.


# The leak kept: the prompt's code made to stream, with the encoding named and not one file closed. It scored 0.75
# while file-handle-leak-fix's closing criteria were the answer's word (left to an LLM locally). Now the judge reads
# the descriptors the answer's processes hold in the host's /proc: at each path count_errors asks for (c2), and
# while the error of a failing call is kept, as a caller keeps it (c3, c5). CPython closes an unreachable file at
# once, so what the leak still holds is the file before the next path, and the file its error's traceback keeps;
# load_config on valid JSON (c4) closes by refcount and passes. It scores 0.5; the reference 1.0.

LEAK_KEPT = '''
import json


def count_errors(paths):
    counts = {}
    for p in paths:
        f = open(p, encoding="utf-8")
        counts[p] = sum(1 for line in f if "ERROR" in line)
    return counts


def load_config(path):
    return json.load(open(path, encoding="utf-8"))


def append_log(path, message):
    f = open(path, "a", encoding="utf-8")
    f.write(message + "\\n")
'''


def test_keeping_every_leak_fails_the_closing_criteria_and_scores_below_the_reference(judge):
    task = TASKS["file-handle-leak-fix"]
    leak, ref = judge.submit(task, fenced(LEAK_KEPT)), judge.submit(task, reference("file-handle-leak-fix"))
    leak, ref = leak.result(), ref.result()
    failed = {r.id for r in leak.results if r.passed is False}
    assert {"c2", "c3", "c5"} <= failed, explain(leak)
    assert ref.score == 1.0 and leak.score < ref.score, (leak.score, explain(leak))
