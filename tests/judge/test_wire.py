"""The driver/sandbox channel keeps in-process semantics for honest answers: mutations of shared containers are
seen on both sides, identity is kept, a new container stored into an old one arrives whole, exceptions keep their
class, and a test that needs in-process objects gets them through in_sandbox."""


import pytest

from minigrpo.judge.checks import run_python_checks

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

def fail():
    raise Oops("no")
'''

TESTS = {
    "new container into an old one": 'acc = [0]\nr = keep(acc)\nassert r == [1, 2] and acc == [0, [1, 2]] and acc[1] is r',
    "nested dict": 'd = {}\nk = nest(d)\nassert d == {"k": {"x": [3]}} and d["k"] is k',
    "identity": 'xs = [1]\nassert same(xs) is xs',
    "exception class": 'assert raises(ValueError, fail) and raises(Oops, fail) and not raises(KeyError, fail)',
    "in_sandbox": 'assert in_sandbox("result = [keep([]), same((1, 2))]") == [[1, 2], (1, 2)]',
}


@pytest.mark.parametrize("name", list(TESTS))
def test_honest_semantics_survive_the_channel(name):
    [(passed, reason)] = run_python_checks([{"type": "python", "test": TESTS[name], "timeout": 10}],
                                           f"```python\n{CODE}\n```")
    assert passed is True, reason
