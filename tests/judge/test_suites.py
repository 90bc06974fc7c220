"""A test suite as the answer (pytest-slugify-tests): the implementation it is run against lives in a sandbox of its
own and is reachable only by calls, so a suite cannot tell the correct implementation from a mutant by reading
it; and a mutant counts as caught only when the same suite passes on the correct implementation."""

import json
import os



from repo_root import ROOT

with open(os.path.join(ROOT, "minigrpo", "data", "soyuz_tasks.json")) as f:
    TASK = next(t for t in json.load(f) if t["id"] == "pytest-slugify-tests")

# The structure the ast criteria ask for, so that only the python criteria decide the comparisons below.
SHAPE = '''
import pytest
from slugify_impl import slugify

@pytest.fixture
def word():
    return "word"

@pytest.mark.parametrize("n", range(6))
def test_shape(n, word):
    assert isinstance(slugify(word), str)        # calls the implementation, tests nothing
    with pytest.raises(ValueError):
        raise ValueError
    with pytest.raises(TypeError):
        raise TypeError
'''

# What the red team did: decide by the implementation's source text instead of its behaviour.
SOURCE_READER = SHAPE + '''
import inspect, sys

def _source():
    module = sys.modules.get("slugify_impl")
    for get in (lambda: inspect.getsource(slugify), lambda: inspect.getsource(module),
                lambda: open(module.__file__).read(), lambda: open("slugify_impl.py").read(),
                lambda: open("../slugify_impl.py").read()):
        try:
            return get()
        except Exception:
            pass
    return ""

def test_reads_the_implementation():
    src = _source()
    assert ".lower()" in src and "NFKD" in src and "[^a-z0-9]+" in src and '.strip("-")' in src
    assert "rfind" in src and "slug is empty" in src
'''

ALWAYS_FAILS = SHAPE + '''
def test_fails():
    assert slugify("a") == "never"
'''


def grade(judge, code):
    return judge.grade(TASK, f"```python\n{code}\n```")


def python_results(verdict):
    ids = [c["id"] for c in TASK["criteria"] if (c.get("check") or {}).get("type") == "python"]
    return {r.id: r.passed for r in verdict.results if r.id in ids}


def test_a_suite_that_reads_the_source_catches_nothing(judge):
    honest_nothing = python_results(grade(judge, SHAPE))
    assert honest_nothing["c1"] is True                 # six passing tests that call it but test nothing
    reader = python_results(grade(judge, SOURCE_READER))
    assert sum(reader.values()) <= sum(honest_nothing.values()), reader


def test_a_suite_that_always_fails_catches_no_mutant(judge):
    results = python_results(grade(judge, ALWAYS_FAILS))
    assert not any(results.values()), results           # every mutant "caught", but c1 failed, so none counts


def test_the_reference_suite_calls_the_implementation_where_it_runs(judge):
    with open(os.path.join(ROOT, "tests", "data", "soyuz", "pytest-slugify-tests.good.md")) as f:
        assert judge.grade(TASK, f.read()).score == 1.0
