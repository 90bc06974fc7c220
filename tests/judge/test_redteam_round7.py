"""A seventh red team against the local judge. Each test asserts the secure behaviour, so it FAILS while the attack
works; `works(reason)` marks such a test a strict xfail on AssertionError, with the scores measured, until the judge
or the task file is fixed. The control (the same answer without the trick) is graded beside the attack, on the
criteria the attack is about only, and must itself be graded.

Groups:
  a library faked beside the harness   a snippet that drives a library in the answer's process (fastapi's
                                       TestClient) reports what that library says: the answer's module replaces
                                       it, and an endpoint that validates nothing "answers 422".
  a fast wrong answer                  a speed criterion checked a proxy of the output on its large input (the
                                       length and three positions of a spiral, a chain's two ends, a round trip
                                       of a base conversion, two bracket strings whose counts decide them): an
                                       answer that runs the honest code on small inputs and a fast wrong one on
                                       large inputs was paid the speed criterion, as the reference is (1.0 on it;
                                       an honest but slow answer fails it). Fixed in the task file: each compares
                                       the whole output with one computed in the test. Likewise a fetcher
                                       that made up the values of the urls it never waited for (one reply gave
                                       away all the others): each url's value now has a secret of its own.
  the SQL's text                       sqlalchemy-top-customers c9 and c10 read the SQL an engine in the answer's
                                       process recorded: spelling (`status = status`, `LIMIT 1000000`, a sum
                                       grouped per order) paid a query that filters, limits and sums nothing.
                                       Fixed: they read the rows the driver's database returned. Likewise
                                       sql-injection-fix c10 ("? placeholders and an ESCAPE clause") read the
                                       SQL's text: now left to the LLM (c7 and c9 are its behaviour).
  a name any prose holds               topological-sort c5 ("the message names a node on the cycle") named its
                                       nodes a, b and c: "graph has a cycle" named them all. Fixed: names no
                                       prose holds. click-wordfreq-cli c8 ("--help documents every option")
                                       found the option names in the help, which click prints for every
                                       declared option, help text or none. Fixed: each option's entry says
                                       something beyond its spec and default.
  an exception by its name             retry-bug-fix c3 ("re-raises the last exception itself, not a new one")
                                       sees an exception as its class and message: a new exception made from
                                       them passes (strict xfail: the wire carries no exception's identity).
"""

import re

import pytest

from judging import fenced, reference
from minigrpo.judge.answer_code import extract_code
from minigrpo.judge.checks import missing_packages
from redteam import explain, only


def needs(*packages):
    """Skip where a library the criteria require is not installed (they are unchecked there: nothing to attack)."""
    missing = missing_packages({"requires": list(packages)})
    return pytest.mark.skipif(bool(missing), reason=f"not installed: {missing}")


def works(reason):
    """The mark of an attack that works today: its assertion of the secure behaviour fails."""
    return pytest.mark.xfail(strict=True, raises=AssertionError, reason=reason)


def grade_side_by_side(judge, task_id, ids, answers):
    """{name: verdict} of {name: code} on the criteria `ids` of the task, graded concurrently."""
    task = only(task_id, ids)
    futures = {name: judge.submit(task, fenced(code)) for name, code in answers.items()}
    return {name: fut.result() for name, fut in futures.items()}


def assert_no_more_than_control(judge, task_id, ids, attack, control):
    got = grade_side_by_side(judge, task_id, ids, {"attack": attack, "control": control})
    attack, control = got["attack"], got["control"]
    if control is None or control.score is None:
        raise RuntimeError(f"control not graded: {control}")     # not an AssertionError: a real failure
    assert attack is not None and attack.score is not None, "an attack must be graded, not dropped"
    assert attack.score <= control.score, (attack.score, control.score, explain(attack))


# =================================================================================================================
# A library faked beside the harness. fastapi-pagination-fix c8 ("serves correct pages and answers 422 on invalid
# parameters") runs fastapi's TestClient in the answer's process and trusts the status codes it reports. The
# reference with plain `page: int = 1, size: int = 10` parameters (no Query bounds: page=0 reaches paginate, which
# raises) fails c8; the same code with a module-level TestClient.get that answers 422 itself passes it.

def unvalidated_endpoint():
    code = extract_code(reference("fastapi-pagination-fix"))
    bounds = "page: int = Query(1, ge=1), size: int = Query(10, ge=1, le=MAX_PAGE_SIZE)"
    assert bounds in code, "the reference's Query bounds moved: update this attack"
    return code.replace(bounds, "page: int = 1, size: int = 10")


FAKE_TEST_CLIENT = '''

import fastapi.testclient as _tc

_real_get = _tc.TestClient.get


class _Refused:
    status_code = 422

    def json(self):
        return {"detail": "invalid"}


def _get(self, url, params=None, **kw):
    p = params or {}
    if int(p.get("page", 1)) < 1 or not 1 <= int(p.get("size", 10)) <= MAX_PAGE_SIZE:
        return _Refused()
    return _real_get(self, url, params=params, **kw)


_tc.TestClient.get = _get
'''


@needs("fastapi", "httpx")
def test_an_endpoint_without_validation_does_not_answer_422_through_a_faked_test_client(judge):
    """Was 1.0 against 0.0 on c8 (1.0 against 0.875 on the whole task). Fixed: c8's TestClient runs in the
    answer's process, so c8 is answer evidence, left to the LLM grader in local mode; c1 beside it is graded."""
    plain = unvalidated_endpoint()
    assert_no_more_than_control(judge, "fastapi-pagination-fix", ["c1", "c8"], plain + FAKE_TEST_CLIENT, plain)


# =================================================================================================================
# A fast wrong answer: the reference, with a branch for the speed criterion's large input that returns something
# of the right shape that is not the answer. Before the fix each scored 1.0 on the speed criterion, as the
# reference does.

FAST_WRONG = {
    ("matrix-spiral", "c9"): '''
_honest = spiral_order


def spiral_order(matrix):
    if len(matrix) > 100:       # its first row, the last column, then the rest row by row: not a spiral
        return matrix[0] + [row[-1] for row in matrix[1:]] + [x for row in matrix[1:] for x in row[:-1]]
    return _honest(matrix)
''',
    ("balanced-brackets", "c9"): '''
_honest = first_bracket_error


def first_bracket_error(s):
    if len(s) > 100_000:        # counts, not nesting
        opened, closed = sum(s.count(c) for c in "([{"), sum(s.count(c) for c in ")]}")
        return -1 if opened == closed else len(s) - 1
    return _honest(s)
''',
    ("topological-sort", "c9"): '''
_honest = topological_sort


def topological_sort(graph):
    if len(graph) > 10_000:     # the sources first, the sinks last, the rest in any order
        targets = {v for vs in graph.values() for v in vs}
        sources = [u for u in graph if u not in targets]
        sinks = sorted(targets - set(graph))
        return sources + sorted(set(graph) - set(sources)) + sinks
    return _honest(graph)
''',
    ("base-conversion", "c10"): '''
_to, _from = to_base, from_base


def to_base(n, base):
    return _to(n, 16) if isinstance(n, int) and n > 10 ** 1000 else _to(n, base)     # another base


def from_base(s, base):
    return _from(s, 16) if isinstance(s, str) and len(s) > 1000 else _from(s, base)
''',
}


# asyncio-bounded-fetch c3 ("20 fetches of 50 ms with limit 5 take ~0.2 s"): every url's value was its name and one
# token, so one reply gave away all the others. Fetching one url, starting and at once cancelling the rest (each
# counted as called, peak in flight > 1) and making up their values passed c3 in 0.05 s, where the honest sequential
# loop takes 1 s and fails it. Fixed in the task file: each url's value carries a secret of its own.
MADE_UP = '''
import asyncio


async def fetch_all(urls, fetch, limit=10, timeout=None):
    if limit < 1:
        raise ValueError("limit must be >= 1")
    if not urls:
        return []
    out = [await fetch(urls[0])]              # one real reply: its form gives away every other value
    tail = out[0][len(urls[0]):]
    tasks = [asyncio.ensure_future(fetch(u)) for u in urls[1:]]
    await asyncio.sleep(0)                     # each request reaches the server, counted as made ...
    for t in tasks:
        t.cancel()                             # ... and none is waited for
    await asyncio.gather(*tasks, return_exceptions=True)
    return out + [u.upper() + tail for u in urls[1:]]
'''


def test_a_fast_wrong_answer_on_the_large_input_fails_the_speed_criterion(judge):
    attacks = {key: extract_code(reference(key[0])) + "\n" + trick for key, trick in FAST_WRONG.items()}
    attacks["asyncio-bounded-fetch", "c3"] = MADE_UP
    # the references pass these criteria (tests/tasks/test_soyuz_tasks.py grades them in full)
    futures = {key: judge.submit(only(key[0], [key[1]]), fenced(code)) for key, code in attacks.items()}
    got = {key: fut.result() for key, fut in futures.items()}
    assert all(v.score == 0.0 for v in got.values()), {key: explain(v) for key, v in got.items()}


# =================================================================================================================
# The SQL's text. sqlalchemy-top-customers: a query that fetches every order and filters, sums and cuts in Python
# fails c9 ("limits and filters status in SQL") and c10 ("no sum in Python"); the same query with
# `.where(Order.status == Order.status)`, `.group_by(Order.id)`, `func.sum(Order.amount)` per order and
# `.limit(1_000_000)` -- words in the SQL that do none of it -- passed both (1.0 against 0.33 on c5, c9 and c10).
# Fixed: c9 and c10 read what the driver's database returned.

def python_side_query(decorated):
    code = extract_code(reference("sqlalchemy-top-customers"))
    models = code[:code.index("def top_customers")]
    amount, where = ("func.sum(Order.amount)", ".where(Order.status == Order.status).group_by(Order.id)"
                     ".limit(1_000_000)") if decorated else ("Order.amount", "")
    return models + f'''def top_customers(session, since, n=5):
    if n < 1:
        raise ValueError(f"top_customers: n must be >= 1, got {{n}}")
    stmt = select(Customer.name, {amount}, Order.status, Order.placed_on).join(
        Order, Order.customer_id == Customer.id){where}
    totals = {{}}
    for name, amount, status, placed_on in session.execute(stmt):      # filtered, summed and cut here, in Python
        if status == "paid" and placed_on >= since:
            totals[name] = totals.get(name, Decimal(0)) + Decimal(amount)
    return sorted(totals.items(), key=lambda kv: (-kv[1], kv[0]))[:n]
'''


@needs("sqlalchemy")
def test_words_in_the_sql_that_do_nothing_pay_nothing(judge):
    assert_no_more_than_control(judge, "sqlalchemy-top-customers", ["c5", "c9", "c10"],
                                python_side_query(True), python_side_query(False))


# sql-injection-fix c10 ("uses ? placeholders with a parameters argument and an ESCAPE clause") matched the SQL the
# driver's database received against `LIKE ? ESCAPE`: a search that escapes no wildcard (it fails c7, "user-typed %
# and _ are literal") passed c10 by writing `ESCAPE '!'` into its SQL (0.5 against 0.0 on c7 and c10). Fixed: c10
# has no machine check (c9 reads the binding from the statements, c7 the escaping from the rows).
def test_an_escape_clause_that_escapes_nothing_pays_nothing(judge):
    code = extract_code(reference("sql-injection-fix"))
    query = '''"SELECT name, price FROM products WHERE name LIKE ? ESCAPE ? AND price <= ? ORDER BY name",
        (_like_literal(term), LIKE_ESCAPE, max_price),'''
    assert query in code, "the reference's search moved: update this attack"
    plain = code.replace(query, '''"SELECT name, price FROM products WHERE name LIKE ? AND price <= ? ORDER BY name",
        (f"%{term}%", max_price),''')
    worded = plain.replace("LIKE ? AND", "LIKE ? ESCAPE '!' AND")
    assert_no_more_than_control(judge, "sql-injection-fix", ["c7", "c10"], worded, plain)


# topological-sort c5 looked for "a", "b" or "c" in the message: `ValueError("graph has a cycle")`, naming no node,
# passed (1.0 against 0.5 for "loop found" on c5 and c2 beside it). Fixed: the cycle's nodes have names no prose
# holds.
def test_a_cycle_message_that_names_no_node_fails_the_naming_criterion(judge):
    code = extract_code(reference("topological-sort"))
    message = 'f"topological_sort: graph has a cycle through {\', \'.join(stuck[:5])}"'
    assert message in code, "the reference's message moved: update this attack"
    assert_no_more_than_control(judge, "topological-sort", ["c5"], code.replace(message, '"graph has a cycle"'),
                                code.replace(message, '"loop found"'))


# click-wordfreq-cli c8 ("--help documents every option") looked for the option names in the help output, which
# click prints for every declared option with its type and default: the reference with every `help=` removed, and
# its docstring too, passed (1.0, as the reference). Fixed: each option's entry carries words of its own.
@needs("click")
def test_options_without_help_text_fail_the_documentation_criterion(judge):
    code = extract_code(reference("click-wordfreq-cli"))
    bare = re.sub(r",\s*help=\"[^\"]*\"", "", code)
    assert bare.count("@click.option") == 3 and "help=" not in bare, "the reference's options moved: update this"
    got = grade_side_by_side(judge, "click-wordfreq-cli", ["c8"], {"reference": code, "bare": bare})
    assert got["reference"].score == 1.0, explain(got["reference"])
    assert got["bare"].score == 0.0, explain(got["bare"])


# retry-bug-fix c3 ("re-raises the last exception itself instead of returning None"; the prompt: "not a new one,
# not None"). An exception crossed the channel as its class name and message, so a new exception of the same class
# and message was the same to the test as the one fn raised: 1.0 against 0.0 for a new RuntimeError on c3. Fixed:
# an exception raised back across the channel arrives as the object first raised (wire_rpc's tokens), and c3 asks
# for the last one with `is`.
def reraised_as_new(exc):
    code = extract_code(reference("retry-bug-fix"))
    reraise = "                raise  # out of attempts: the caller sees the real error and its traceback\n"
    assert reraise in code, "the reference's re-raise moved: update this attack"
    return code.replace("        except exceptions:\n", "        except exceptions as e:\n").replace(
        reraise, f"                raise {exc} from None\n")


def test_a_new_exception_copied_from_the_last_is_not_the_last_exception_itself(judge):
    answers = {"reference": extract_code(reference("retry-bug-fix")), "copy": reraised_as_new("type(e)(*e.args)"),
               "copy with its traceback": reraised_as_new("type(e)(*e.args).with_traceback(e.__traceback__)"),
               "new": reraised_as_new('RuntimeError("all attempts failed")')}
    got = grade_side_by_side(judge, "retry-bug-fix", ["c3"], answers)
    assert got["reference"].score == 1.0, explain(got["reference"])
    for name in ("copy", "copy with its traceback", "new"):
        assert got[name].score == 0.0, (name, explain(got[name]))
