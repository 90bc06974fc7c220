"""Terminal exercises on code: a script made to run, a small Python package's tests made to pass. The agent's code
is judged by running it in verify.probe's own sandbox on hidden inputs it never saw, the expected outputs
computed here and compared on the host: a script that prints the visible example's answer, or tests edited to
match a bug, fail."""

import json
import math

from minigrpo.tasks.terminal.exercise import Exercise, Transcript as T
from minigrpo.tasks.terminal.verify import as_given, probe, text_lines

EXERCISES = []


def _add(needs=("python3",), **kw):
    EXERCISES.append(Exercise(category="code", needs=needs, **kw))


def _output_is(folder, command, expected, take, extra=None):
    """1.0 when the probe exits 0 and prints exactly the `expected` lines (trailing spaces aside)."""
    r = probe(folder, command, take=take, extra=extra)
    got = [line.rstrip() for line in text_lines(r.output)]
    return 1.0 if r.exit_code == 0 and got == list(expected) else 0.0


# --- a bash loop that never ends its `while` ------------------------------------------------------------------------

_COUNT_SH = """#!/bin/bash
# count.sh WORD FILE: how many lines of FILE contain WORD
word=$1
file=$2
n=0
while IFS= read -r line; do
  case "$line" in
    *"$word"*) n=$((n + 1)) ;;
  esac
echo "$n"
"""
_FRUIT = "apple pie\nbanana\ngreen apple\ncherry\napple juice\n"
_HIDDEN_FRUIT = "red apple apple\npineapple\nbanana split\nred apple tart\n\nno fruit here\napple\n"
_add(id="fix-count-script", needs=(),
     instruction="`bash count.sh WORD FILE` should print how many lines of FILE contain WORD (fruit.txt is an "
                 "example), but the script fails. Fix count.sh.",
     files={"count.sh": _COUNT_SH, "fruit.txt": _FRUIT},
     verify=lambda f, a: _output_is(f, "bash count.sh apple h.txt; bash count.sh 'red apple' h.txt",
                                    [str(sum(w in line for line in _HIDDEN_FRUIT.splitlines()))
                                     for w in ("apple", "red apple")],
                                    take=lambda rel: rel == "count.sh", extra={"h.txt": _HIDDEN_FRUIT}),
     reference=T(("bash count.sh apple fruit.txt",
                  "sed -i 's/^echo \"\\$n\"$/done < \"$file\"\\necho \"$n\"/' count.sh",
                  "bash count.sh apple fruit.txt"),),
     wrong=T(("printf '#!/bin/bash\\ngrep -o \"$1\" \"$2\" | wc -l\\n' > count.sh", "bash count.sh apple fruit.txt"),))

# --- a Python script that adds strings -----------------------------------------------------------------------------

_REPORT_PY = """import csv
import sys


def mean_of(path, column):
    total = 0
    count = 0
    with open(path, newline="") as f:
        for row in csv.DictReader(f):
            total += row[column]
            count += 1
    return total / count


print(f"{mean_of(sys.argv[1], 'value'):.2f}")
"""
_VALUES = "id,value\n1,10\n2,4\n3,7\n"
_HIDDEN_VALUES = [2.5, -1.25, 10.0, 3.75, 0.1]
_add(id="fix-mean-script",
     instruction="`python3 report.py FILE` should print the mean of the `value` column of the CSV file FILE with "
                 "two decimals (data.csv is an example), but it crashes. Fix report.py.",
     files={"report.py": _REPORT_PY, "data.csv": _VALUES},
     verify=lambda f, a: _output_is(f, "python3 report.py h.csv", [f"{sum(_HIDDEN_VALUES) / len(_HIDDEN_VALUES):.2f}"],
                                    take=lambda rel: rel == "report.py",
                                    extra={"h.csv": "id,value\n" + "".join(f"{i},{v}\n" for i, v in
                                                                           enumerate(_HIDDEN_VALUES))}),
     reference=T(("python3 report.py data.csv", "sed -i 's/total += row\\[column\\]/total += float(row[column])/' "
                  "report.py", "python3 report.py data.csv"),),
     wrong=T(("sed -i 's/total += row\\[column\\]/total += int(row[column])/' report.py",
              "python3 report.py data.csv"),))

# --- a Python 2 script ---------------------------------------------------------------------------------------------

_CONVERT_PY = """import sys


def load(path):
    pairs = {}
    for line in open(path):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        key, value = line.split("=", 1)
        pairs[key.strip()] = value.strip()
    return pairs


pairs = load(sys.argv[1])
out = open(sys.argv[2], "w")
for key, value in sorted(pairs.iteritems()):
    print >>out, "%s: %s" % (key.upper(), value)
out.close()
print "wrote %d keys" % len(pairs)
"""
_HIDDEN_PAIRS = "# hidden\nzeta = last one\nalpha=1=2\n\nmid = m\n"


def _converted(text):
    pairs = {}
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            key, value = line.split("=", 1)
            pairs[key.strip()] = value.strip()
    return [f"{k.upper()}: {v}" for k, v in sorted(pairs.items())]


_add(id="port-python2-script",
     instruction="convert.py was written for Python 2. Make `python3 convert.py IN OUT` work: for each `key = "
                 "value` line of IN it writes `KEY: value` to OUT, sorted by key (config.txt is an example).",
     files={"convert.py": _CONVERT_PY, "config.txt": "# settings\nname = demo\nmode = fast\n"},
     verify=lambda f, a: _output_is(f, "python3 convert.py in.txt out.txt >/dev/null && cat out.txt",
                                    _converted(_HIDDEN_PAIRS), take=lambda rel: rel == "convert.py",
                                    extra={"in.txt": _HIDDEN_PAIRS}),
     reference=T(("python3 convert.py config.txt out.txt",
                  "sed -i -e 's/\\.iteritems()/.items()/' -e 's/print >>out, \\(.*\\)$/print(\\1, file=out)/' "
                  "-e 's/^print \\(.*\\)$/print(\\1)/' convert.py",
                  "python3 convert.py config.txt out.txt && cat out.txt"),),
     wrong=T(("sed -i -e 's/print >>out, \\(.*\\)$/print(\\1, file=out)/' -e 's/^print \\(.*\\)$/print(\\1)/' "
              "convert.py",),))

# --- a script with Windows line ends and no execute bit ---------------------------------------------------------

_add(id="fix-greet-script", needs=(),
     instruction="`./greet.sh NAME` should print `Hello, NAME!`, but running it fails. Fix greet.sh so that "
                 "./greet.sh runs.",
     files={"greet.sh": '#!/bin/bash\r\necho "Hello, $1!"\r\n'},
     verify=lambda f, a: _output_is(f, "./greet.sh 'Ruth Q'", ["Hello, Ruth Q!"], take=lambda rel: rel == "greet.sh"),
     reference=T(("./greet.sh Ann", "head -1 greet.sh | od -c | head -2", "sed -i 's/\\r$//' greet.sh && chmod +x "
                  "greet.sh", "./greet.sh Ann"),),
     wrong=T(("chmod +x greet.sh",),))

# --- a runner that points at the wrong data path ------------------------------------------------------------------

_SUMMARISE_PY = """import csv
import sys

rows = list(csv.DictReader(open(sys.argv[1], newline="")))
print(f"orders {len(rows)}")
print(f"total {sum(float(r['amount']) for r in rows):.2f}")
"""
_HIDDEN_SALES = [("a", 12.5), ("b", 7.25), ("c", 100.0)]
_RUNNER = {"run.sh": "#!/bin/bash\nset -e\npython3 tools/summarise.py data/sales.csv > summary.txt\n",
           "tools/summarise.py": _SUMMARISE_PY, "input/sales.csv": "id,amount\nx,3.50\ny,4.00\n"}
_GIVEN = {p: c for p, c in _RUNNER.items() if p.startswith(("input/", "tools/"))}


def _runner_fixed(f, a):
    # run.sh runs on hidden data; and input/ and tools/ are as they were given (the probe brings its own copies,
    # so what the agent did there would otherwise go unseen)
    intact = as_given(f, _GIVEN, "input") and as_given(f, _GIVEN, "tools")
    return (1.0 if intact else 0.0) * _output_is(
        f, "bash run.sh >/dev/null 2>&1; cat summary.txt",
        [f"orders {len(_HIDDEN_SALES)}", f"total {sum(v for _, v in _HIDDEN_SALES):.2f}"],
        take=lambda rel: rel == "run.sh",
        extra={"tools/summarise.py": _SUMMARISE_PY,
               "input/sales.csv": "id,amount\n" + "".join(f"{k},{v}\n" for k, v in _HIDDEN_SALES)})


_add(id="fix-runner-path",
     instruction="`bash run.sh` should write summary.txt, but it fails. Fix run.sh; do not move, copy, rename or "
                 "edit anything under input/ and tools/.",
     files=_RUNNER, verify=_runner_fixed,
     reference=T(("bash run.sh", "ls -R", "sed -i 's#data/sales.csv#input/sales.csv#' run.sh",
                  "bash run.sh && cat summary.txt"),),
     wrong=T(("mkdir -p data && cp input/sales.csv data/", "bash run.sh && cat summary.txt"),))

# --- a package whose tests fail ------------------------------------------------------------------------------------

_CALLER = """import importlib
import json
import os
import sys

sys.path.insert(0, os.getcwd())     # the work folder holds the package and this probe, nothing else
cases = json.loads(CASES)
try:
    module = importlib.import_module(PACKAGE)
except BaseException as e:
    print(json.dumps({"import failed": type(e).__name__}))
    raise SystemExit(0)
out = []
for name, args in cases:
    try:
        out.append(getattr(module, name)(*args))
    except BaseException as e:
        out.append({"raised": type(e).__name__})
print(json.dumps(out, default=repr))
"""


def _same(got, want):
    if isinstance(want, (int, float)) and not isinstance(want, bool):
        return isinstance(got, (int, float)) and not isinstance(got, bool) and math.isclose(got, want, abs_tol=1e-9)
    return got == want


def _fixed(folder, package, tests, cases, expected):
    """_calls_match, and the package's tests as they were given ("fix the package, not the tests"): the hidden
    calls alone would pay a fix that also edits or deletes the tests."""
    if not as_given(folder, tests, "tests", others=True):
        return 0.0
    return _calls_match(folder, package, cases, expected)


def _calls_match(folder, package, cases, expected):
    """1.0 when the agent's `package`, imported in the probe's sandbox, returns `expected` for every call of
    `cases` ([name, args]); only the package's own files are copied in (no module of the agent can shadow the
    probe's imports, and python3 -I keeps the folder off sys.path until the probe puts it there)."""
    script = _CALLER.replace("CASES", repr(json.dumps(cases))).replace("PACKAGE", repr(package))
    r = probe(folder, "python3 -I _probe.py", take=lambda rel: rel.startswith(package + "/"),
              extra={"_probe.py": script})
    lines = r.output.strip().splitlines()
    try:
        got = json.loads(lines[-1]) if lines else None
    except ValueError:
        return 0.0
    ok = isinstance(got, list) and len(got) == len(expected) and all(map(_same, got, expected))
    return 1.0 if ok else 0.0


_TEXTSTATS = '''"""Small text statistics."""


def word_count(text):
    """The number of words: runs of characters between whitespace."""
    return len(text.split(" "))


def longest_word(text):
    """The longest word (the first of equal length); "" for a text without words."""
    words = text.split()
    return max(words, key=len) if words else ""
'''
_TEXTSTATS_TESTS = """import unittest

import textstats


class TextStatsTest(unittest.TestCase):
    def test_word_count(self):
        self.assertEqual(textstats.word_count("one two three"), 3)
        self.assertEqual(textstats.word_count("one  two\\nthree"), 3)
        self.assertEqual(textstats.word_count(""), 0)

    def test_longest_word(self):
        self.assertEqual(textstats.longest_word("a bb ccc dd"), "ccc")
"""
_TEXTS = ["  leading and trailing  ", "tab\tseparated\twords", "\n\n", "one", "x  y\n\nz"]
_WORD_CASES = [["word_count", [t]] for t in _TEXTS] + [["longest_word", ["hi there world"]]]
_add(id="package-word-count",
     instruction="The tests of the package textstats fail. Fix the package (not the tests) so that "
                 "`python3 -m unittest discover -s tests` passes.",
     files={"textstats/__init__.py": _TEXTSTATS, "tests/test_textstats.py": _TEXTSTATS_TESTS},
     verify=lambda f, a: _fixed(f, "textstats", {"tests/test_textstats.py": _TEXTSTATS_TESTS}, _WORD_CASES,
                                [len(t.split()) for t in _TEXTS] + ["there"]),
     reference=T(("python3 -m unittest discover -s tests",
                  "sed -i 's/len(text.split(\" \"))/len(text.split())/' textstats/__init__.py",
                  "python3 -m unittest discover -s tests"),),
     wrong=T(("sed -i 's/len(text.split(\" \"))/len([w for w in text.split(\" \") if w])/' textstats/__init__.py",
              "python3 -m unittest discover -s tests"),))

_STATS = '''"""Averages."""


def mean(values):
    return sum(values) / len(values)
'''
_STATS_TESTS = """import unittest

import stats


class StatsTest(unittest.TestCase):
    def test_mean(self):
        self.assertEqual(stats.mean([1, 2, 3]), 2)

    def test_median(self):
        self.assertEqual(stats.median([1, 2, 3]), 2)
        self.assertEqual(stats.median([1, 2, 3, 4]), 2.5)
"""
_LISTS = [[9, 1, 2, 3, 7], [4, 1, 3, 2], [5], [-1, -7], [3, 1, 2]]


def _median(values):
    s = sorted(values)
    mid = len(s) // 2
    return s[mid] if len(s) % 2 else (s[mid - 1] + s[mid]) / 2


_MEDIAN = """

def median(values):
    s = sorted(values)
    mid = len(s) // 2
    return s[mid] if len(s) % 2 else (s[mid - 1] + s[mid]) / 2
"""
_add(id="package-add-median",
     instruction="The tests of the package stats fail: it has no median. Add median(values) to stats (the middle "
                 "of the sorted values, or the mean of the two middle ones for an even count) so that "
                 "`python3 -m unittest discover -s tests` passes. Do not change the tests.",
     files={"stats/__init__.py": _STATS, "tests/test_stats.py": _STATS_TESTS},
     verify=lambda f, a: _fixed(f, "stats", {"tests/test_stats.py": _STATS_TESTS},
                                [["median", [v]] for v in _LISTS] + [["mean", [[1, 2]]]],
                                [_median(v) for v in _LISTS] + [1.5]),
     reference=T((f"cat >> stats/__init__.py <<'EOF'{_MEDIAN}EOF", "python3 -m unittest discover -s tests"),),
     wrong=T(("cat >> stats/__init__.py <<'EOF'\n\ndef median(values):\n    mid = len(values) // 2\n    return "
              "values[mid] if len(values) % 2 else (values[mid - 1] + values[mid]) / 2\nEOF",
              "python3 -m unittest discover -s tests"),))

_SHAPES_INIT = '''"""Areas of shapes."""
from shapes.circle import circle_area
from shapes.rectangle import rectangle_area

__all__ = ["circle_area", "rectangle_area"]
'''
_SHAPES_TESTS = """import math
import unittest

from shapes import circle_area, rectangle_area


class ShapesTest(unittest.TestCase):
    def test_rectangle(self):
        self.assertEqual(rectangle_area(2, 5), 10)

    def test_circle(self):
        self.assertAlmostEqual(circle_area(1), math.pi)
"""
_SIDES = [[3, 4], [1.5, 2], [0, 9], [7, 7]]
_add(id="package-shapes-import",
     instruction="The tests of the package shapes fail. Fix the package (not the tests) so that "
                 "`python3 -m unittest discover -s tests` passes.",
     files={"shapes/__init__.py": _SHAPES_INIT, "tests/test_shapes.py": _SHAPES_TESTS,
            "shapes/circle.py": "import math\n\n\ndef circle_area(r):\n    return math.pi * r * r\n",
            "shapes/rectangel.py": "def rectangle_area(w, h):\n    return w * w\n"},
     verify=lambda f, a: _fixed(f, "shapes", {"tests/test_shapes.py": _SHAPES_TESTS},
                                [["rectangle_area", s] for s in _SIDES] + [["circle_area", [2]]],
                                [w * h for w, h in _SIDES] + [math.pi * 4]),
     reference=T(("python3 -m unittest discover -s tests", "ls shapes", "mv shapes/rectangel.py shapes/rectangle.py",
                  "python3 -m unittest discover -s tests", "sed -i 's/return w \\* w/return w * h/' "
                  "shapes/rectangle.py", "python3 -m unittest discover -s tests"),),
     wrong=T(("mv shapes/rectangel.py shapes/rectangle.py",),))
