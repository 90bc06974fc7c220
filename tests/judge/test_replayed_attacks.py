"""A previous red team's attacks, replayed: each scores no more than the task's honest-wrong answer (.bad.md).

What paid them was never the trick (each scored what the same code scores without it) but criteria an answer meets
by not doing the work: "returns None for a malformed line" (a parse_line that always returns None), "the injection
finds nothing" and "a stacked statement drops no table" (functions that run no SQL), "two accounts' I/O overlaps"
and "the I/O is still awaited" (the unfixed code, with no lock at all), and a suite's "uses parametrize / a fixture /
pytest.raises" (a suite that tests nothing). Each such criterion now counts only beside the behaviour it guards
(`only_if`), and async-race-fix c6 asks what per-account locks do: one account's operations in turn, another's
beside them."""

import ast
import re

import pytest

from judging import TASKS, fenced, reference
from minigrpo.judge.answer_code import extract_code
from test_forgery_harness import RACE_TRICK, SUITE, SUITE_TRICK
from test_attacks import assert_no_gain, honest_wrong_scores
from test_redteam_round5 import ALWAYS_RAISE_PAYS

UNFIXED_ACCOUNTS = TASKS["async-race-fix"]["prompt"].split("```python\n", 1)[1].split("```", 1)[0]

ONE_LOCK_FOR_ALL = """
import asyncio


class Account:
    def __init__(self, balance=0, lock=asyncio.Lock()):     # one default lock: every account shares it
        self.balance, self._lock = balance, lock

    async def _io(self):
        await asyncio.sleep(0)

    async def withdraw(self, amount):
        if amount <= 0:
            raise ValueError("amount must be > 0")
        async with self._lock:
            if self.balance < amount:
                return False
            await self._io()
            self.balance -= amount
            return True

    async def deposit(self, amount):
        if amount <= 0:
            raise ValueError("amount must be > 0")
        async with self._lock:
            current = self.balance
            await self._io()
            self.balance = current + amount


async def transfer(src, dst, amount):
    if amount <= 0:
        raise ValueError("amount must be > 0")
    if src.balance < amount:
        return False
    if await src.withdraw(amount):
        await dst.deposit(amount)
        return True
    return False
"""

LOCK_AROUND_THE_IO = """
import asyncio


class Account:
    def __init__(self, balance=0):
        self.balance = balance
        self._lock = asyncio.Lock()

    async def _io(self):
        await asyncio.sleep(0)

    async def withdraw(self, amount):
        if amount <= 0:
            raise ValueError("amount must be > 0")
        if self.balance < amount:               # checked before the lock: two withdrawals can both pass it
            return False
        async with self._lock:
            await self._io()
            self.balance -= amount
        return True

    async def deposit(self, amount):
        if amount <= 0:
            raise ValueError("amount must be > 0")
        async with self._lock:
            current = self.balance
            await self._io()
            self.balance = current + amount


async def transfer(src, dst, amount):
    if amount <= 0:
        raise ValueError("amount must be > 0")
    first, second = sorted((src, dst), key=id)
    async with first._lock:
        async with second._lock:
            if src.balance < amount:
                return False
            src.balance -= amount
            await src._io()
            dst.balance += amount
            await dst._io()
            return True
"""

NOTHING_PARSED = """
def parse_line(line):
    return None

def summarize(lines):
    return {"requests": 0, "malformed": 0, "status": {}, "bytes": 0, "top_paths": []}
"""

NO_SQL_RUN = """
def find_user(conn, username):
    return None

def search_products(conn, term, max_price):
    return []

def list_users(conn, order_by="username"):
    raise ValueError(order_by)
"""

ENCODER_SCAFFOLD = """
import json


class AppEncoder(json.JSONEncoder):
    def default(self, o):
        return super().default(o)        # the structure the task asks for, encoding nothing


def dumps(obj, **kwargs):
    return json.dumps(obj, cls=AppEncoder, sort_keys=True, ensure_ascii=False, **kwargs)
"""

REPLAYED = {     # name: (task, answer)
    "race_unfixed_gather_one_at_a_time": ("async-race-fix", UNFIXED_ACCOUNTS.replace(
        "import asyncio\n", "import asyncio\n" + RACE_TRICK, 1)),
    "race_unfixed": ("async-race-fix", UNFIXED_ACCOUNTS),
    "log_parser_that_parses_nothing": ("regex-log-parser", NOTHING_PARSED),
    "sql_that_runs_nothing": ("sql-injection-fix", NO_SQL_RUN),
    "suite_reading_the_implementation": ("pytest-slugify-tests", SUITE.replace("{trick}", SUITE_TRICK)),
    "encoder_scaffold": ("json-custom-encoder", ENCODER_SCAFFOLD),     # subclass, delegation, options: 0.3 of 0.2
}


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(REPLAYED))
def test_a_replayed_attack_scores_no_more_than_the_honest_wrong_answer(judge, name):
    task_id, answer = REPLAYED[name]
    assert_no_gain(judge, task_id, fenced(answer))


@pytest.mark.slow
@pytest.mark.parametrize("answer", [ONE_LOCK_FOR_ALL, LOCK_AROUND_THE_IO], ids=["one_default_lock", "lock_around_io"])
def test_a_lock_in_the_wrong_place_fails_the_per_account_criteria(judge, answer):
    """Not attacks: fixes that serialise every account, or lock only the I/O and check the balance before (racy:
    both withdrawals of a last unit pass). Each keeps its sequential behaviour (0.5, above the honest-wrong answer's
    0.33), and fails c6 and what counts beside it; c10 (where the lock lives) is the LLM grader's: nothing reads
    the code."""
    got = {r.id: r.passed for r in judge.grade(TASKS["async-race-fix"], fenced(answer)).results}
    assert got["c6"] is False and got["c7"] is False and got["c10"] is None, got


@pytest.mark.slow
@pytest.mark.parametrize("name", ["log_parser_that_parses_nothing", "sql_that_runs_nothing"])
def test_an_answer_that_does_nothing_scores_zero(judge, name):
    """Safety criteria ("finds nothing", "drops no table", "None for garbage") pay only an answer that works: a
    do-nothing answer met three of sql-injection-fix's ten (0.3) and one of regex-log-parser's."""
    task_id, answer = REPLAYED[name]
    assert judge.grade(TASKS[task_id], fenced(answer)).score == 0.0


class _DoNothing(ast.NodeTransformer):
    def visit_FunctionDef(self, node):
        node.body = [ast.Return(ast.Constant(None))]
        return node

    visit_AsyncFunctionDef = visit_FunctionDef


def do_nothing(task_id):
    """The reference answer's module with every function body `return None`: its names, its declarations, no work."""
    tree = _DoNothing().visit(ast.parse(extract_code(reference(task_id))))
    return fenced(ast.unparse(ast.fix_missing_locations(tree)))


# click runs a CLI's declared options itself: a command declared right and doing nothing still rejects --top 0,
# names a missing file and documents its options (c3, c7, c8, and c9, its declarations, beside c3)
DECLARATIONS_DO_WORK = {"click-wordfreq-cli": 0.4}


@pytest.mark.slow
def test_the_reference_names_doing_nothing_score_at_most_0_1_on_every_code_task(judge):
    code = sorted(t for t, task in TASKS.items() if task["family"] != "writing")
    futures = {t: judge.submit(TASKS[t], do_nothing(t)) for t in code}
    scores = {t: f.result().score for t, f in futures.items()}
    high = {t: s for t, s in scores.items() if s > DECLARATIONS_DO_WORK.get(t, 0.1)}
    assert not high, high


@pytest.mark.slow
def test_the_encoder_structure_alone_earns_only_its_dumps_options(judge):
    v = judge.grade(TASKS["json-custom-encoder"], fenced(ENCODER_SCAFFOLD))
    assert [r.id for r in v.results if r.passed] == ["c9"], [(r.id, r.reason) for r in v.results]


class _OneBody(ast.NodeTransformer):
    def __init__(self, statement):
        self.statement = statement

    def visit_FunctionDef(self, node):
        self.generic_visit(node)
        node.body = [ast.parse(self.statement).body[0]]
        return node

    visit_AsyncFunctionDef = visit_FunctionDef


def every_body(task_id, statement):
    """The reference answer's module with every function body replaced by one statement."""
    tree = _OneBody(statement).visit(ast.parse(extract_code(reference(task_id))))
    return fenced(ast.unparse(ast.fix_missing_locations(tree)))


# a policy's other do-nothing recipes: always raise the error the guards ask for, return a constant or an empty result
NO_WORK = {"always_raises": 'raise ValueError("not implemented")', "returns_empty": "return []",
           "returns_zero": "return 0"}


@pytest.mark.slow
def test_raising_or_constant_bodies_score_at_most_0_1_on_every_code_task(judge):
    """Each "raises ValueError on bad input" or "[] for no input" guard counts only beside behaviour such a module
    fails (a module whose every function raised ValueError met four of base-conversion's ten). Where always raising
    ValueError once paid (test_redteam_round5.py's record), it is held to the honest wrong answer's score too."""
    code = sorted(t for t, task in TASKS.items() if task["family"] != "writing")
    futures = {(t, k): judge.submit(TASKS[t], every_body(t, s)) for t in code for k, s in NO_WORK.items()}
    paid = [t for t, (exception, *_) in ALWAYS_RAISE_PAYS.items() if exception == "ValueError"]
    bound = {(t, k): DECLARATIONS_DO_WORK.get(t, 0.1) for t, k in futures}
    for t, wrong in honest_wrong_scores(judge, paid).items():
        bound[(t, "always_raises")] = min(bound[(t, "always_raises")], wrong)
    scores = {key: f.result().score for key, f in futures.items()}
    high = {key: (s, bound[key]) for key, s in scores.items() if s > bound[key]}
    assert not high, high


def prompt_code(task_id):
    blocks = re.findall(r"```python\n(.*?)```", TASKS[task_id]["prompt"], re.S)
    return blocks[0] if blocks else None


@pytest.mark.slow
def test_a_fix_tasks_prompt_code_unchanged_scores_no_more_than_the_honest_wrong_answer(judge):
    """The do-nothing answer of a fix task is its prompt's code, unchanged: what it keeps (the behaviour the fix must
    preserve) counts only beside what the fix changes."""
    fix = sorted(t for t in TASKS if TASKS[t]["family"] != "writing" and prompt_code(t))
    assert fix
    echoes = {t: judge.submit(TASKS[t], fenced(prompt_code(t))) for t in fix}
    wrong = honest_wrong_scores(judge, fix)     # those an attack above met are graded already
    high = {t: (echo.result().score, wrong[t]) for t, echo in echoes.items() if echo.result().score > wrong[t]}
    assert not high, high
