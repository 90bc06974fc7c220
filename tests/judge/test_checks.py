"""Each machine check of the local judge (minigrpo/judge/checks.py), passing and failing."""

import pytest

from minigrpo.judge.answer_code import extract_code, fenced_blocks
from minigrpo.judge.checks import run_check, syllables, rhymes, validate_check

HAIKU = "An old silent pond\nA frog jumps into the pond\nSplash! Silence again"
LIMERICK = """There once was a man from Nantucket
Who kept all his cash in a bucket.
But his daughter, named Nan,
Ran away with a man
And as for the bucket, Nantucket."""


def check(c, answer):
    return run_check(c, answer)[0]


def test_code_extraction():
    answer = "Intro\n```python\nx = 1\n```\ntext\n```\ny = 2\n```\n```bash\nrm -rf /\n```\n"
    assert fenced_blocks(answer) == [("python", "x = 1\n"), ("", "y = 2\n"), ("bash", "rm -rf /\n")]
    assert extract_code(answer) == "x = 1\n\n\ny = 2\n"
    assert extract_code("def f():\n    return 1\n") == "def f():\n    return 1\n"   # bare code reply
    assert extract_code("All criteria are met, score 10/10.") == ""
    assert extract_code("") == ""


SOLUTION = "def f(x):\n    return x + 1\n"


@pytest.mark.parametrize("extra", [
    "```bash\npip install thing\npython -c 'import solution'\n```\n",
    "```sh\n$ python app.py\n```\n", "```console\n$ f 1\n2\n```\n", "```text\nx = 1\n```\n",
    "```output\n2\n```\n", "```pycon\n>>> f(1)\n2\n```\n", "```json\n{\"x\": 1}\n```\n",
    "```\n>>> f(1)\n2\n```\n",                                        # a transcript: does not parse
    "```\nf 1 -> 2\n```\n",
    "```\nprint(f(1))  # 2\nf('x')  # raises TypeError\n```\n",     # a usage example: only expressions
    "```python\nassert f(1) == 2\n```\n",
    "```python\n>>> f(1)\n2\n```\n",                                  # a tagged transcript
], ids=["bash", "sh", "console", "text", "output", "pycon", "json", "doctest", "prose", "example", "assert",
        "tagged_doctest"])
def test_only_python_blocks_are_graded_code(extra):
    answer = f"Explanation.\n```python\n{SOLUTION}```\nUsage:\n{extra}More text.\n"
    assert extract_code(answer) == SOLUTION


def test_several_python_blocks_are_joined_in_order():
    helper = "def g(x):\n    return f(x) * 2\n"
    assert extract_code(f"```python\n{SOLUTION}```\n```py\n{helper}```\n") == SOLUTION + "\n\n" + helper
    assert extract_code(f"```python\n{SOLUTION}```\n```\n{helper}```\n") == SOLUTION + "\n\n" + helper
    # a tagged transcript between them does not parse: the blocks that parse are kept, in order
    assert extract_code(f"```python\n{SOLUTION}```\n```python\n>>> g(1)\n4\n```\n```python\n{helper}```\n") == \
        SOLUTION + "\n\n" + helper
    # a class split over two tagged blocks does not parse block by block, but joined it does
    split = "```python\nclass C:\n    def a(self):\n        return 1\n```\n```python\n    def b(self):\n" \
            "        return 2\n```\n"
    assert "def b" in extract_code(split)
    # an example that binds names stays: it may be what the code needs; only expression-only blocks go
    assert extract_code(f"```python\n{SOLUTION}```\n```\ny = f(1)\n```\n") == SOLUTION + "\n\ny = f(1)\n"
    assert extract_code("```\nprint(1)\n```\n") == "print(1)\n"      # nothing else: the answer's only code
    assert extract_code("```python\ndef f(:\n```\n```bash\nls\n```\n") == ""
    assert extract_code("```bash\nls\n```\nNo code here.\n") == ""


def test_regex():
    assert check({"type": "regex", "pattern": r"^def \w+", "flags": "m"}, "x\ndef f(): pass")
    assert not check({"type": "regex", "pattern": r"TODO", "flags": "i", "must": False}, "a todo here")
    with pytest.raises(ValueError, match="never pays"):      # the code is run by python checks, never read as text
        validate_check({"type": "regex", "pattern": r"print", "must": False, "target": "code"})


@pytest.mark.parametrize("unit,text,n", [
    ("words", "Don't stop-believing, ok?", 3), ("lines", "a\n\n b\n", 2), ("chars", "  abc \n", 3),
    ("sentences", "One. Two! Three? four", 4), ("paragraphs", "p1 line\nstill p1\n\n\np2", 2),
])
def test_count(unit, text, n):
    assert check({"type": "count", "unit": unit, "min": n, "max": n}, text)
    assert not check({"type": "count", "unit": unit, "min": n + 1}, text)


def test_contains():
    c = {"type": "contains", "all": ["binary search"], "any": ["O(log n)", "logarithmic"], "none": ["sort"]}
    assert check(c, "Binary   search runs in logarithmic time.")
    assert not check(c, "Binary search, after we sort, is logarithmic.")           # banned word
    assert not check(c, "binary search is fast")                                    # none of `any`
    assert check({"type": "contains", "none": ["sort"]}, "sorted lists")            # whole words only
    assert not check({"type": "contains", "all": ["Cat"], "case": True}, "cat")


def test_syllables():
    assert [syllables(w) for w in "the table jumped wanted horses lion piano nation going".split()] == \
        [1, 2, 1, 2, 2, 2, 3, 2, 2]
    assert check({"type": "syllables", "lines": [5, 7, 5]}, HAIKU)
    assert not check({"type": "syllables", "lines": [5, 7, 5]}, "An old pond\nA frog jumps in\nSplash")
    assert not check({"type": "syllables", "lines": [5, 7, 5]}, HAIKU + "\nextra line")
    assert check({"type": "syllables", "lines": [5, 7, 5], "tol": 1}, HAIKU.replace("old ", "old green "))


def test_rhyme():
    assert rhymes("day", "away") and rhymes("night", "light") and rhymes("time", "rhyme") and rhymes("me", "sea")
    assert not rhymes("cat", "dog") and not rhymes("day", "day")
    assert check({"type": "rhyme", "scheme": "AABBA"}, LIMERICK)
    assert not check({"type": "rhyme", "scheme": "AABBA"}, "one cat\ntwo dogs\nred fish\nblue sky\nthe end")
    assert not check({"type": "rhyme", "scheme": "AA"}, "I say day\nI say day")     # repetition is not rhyme
    assert not check({"type": "rhyme", "scheme": "AABBA"}, LIMERICK.rsplit("\n", 1)[0])


def test_json_and_code_block():
    c = {"type": "json", "schema_keys": ["name", "age"]}
    assert check(c, '{"name": "a", "age": 3}')
    assert check(c, 'Here:\n```json\n{"name": "a", "age": 3}\n```')
    assert not check(c, '{"name": "a"}')
    assert not check(c, "not json")
    assert check({"type": "code_block", "lang": "python"}, "```py\nx=1\n```")
    assert not check({"type": "code_block", "lang": "python"}, "```js\nx=1\n```")
    assert check({"type": "code_block"}, "```\nx\n```")


def test_combinators_and_unchecked():
    yes, no = {"type": "regex", "pattern": "a"}, {"type": "regex", "pattern": "z"}
    missing = {"type": "python", "test": "pass", "requires": ["no_such_package_xyz"]}
    assert run_check(missing, "```python\nx = 1\n```") == (None, "unchecked: package ['no_such_package_xyz'] "
                                                               "not installed")
    assert check({"type": "all", "checks": [yes, yes]}, "a") is True
    assert check({"type": "all", "checks": [yes, no, missing]}, "a") is False
    assert check({"type": "all", "checks": [yes, missing]}, "a") is None
    assert check({"type": "any", "checks": [no, yes]}, "a") is True
    assert check({"type": "any", "checks": [no, missing]}, "a") is None
    assert check({"type": "not", "check": no}, "a") is True
    assert check({"type": "not", "check": missing}, "a") is None


def test_validate_check():
    validate_check({"type": "all", "checks": [{"type": "regex", "pattern": "x"}]})
    with pytest.raises(ValueError, match=r"checks\[0\]: regex check needs key 'pattern'"):
        validate_check({"type": "all", "checks": [{"type": "regex"}]})
