"""Criteria about how code is written, graded end to end on the real soyuz tasks by the local judge: paid by what the
code does, never by how it is spelled.

False negatives: a correct answer followed by a shell block, a `>>>` transcript or a usage example scores as the
solution alone; a two-heap median whose docstring says "sorted(" scores 1.0. Passing without the property: a
bisect.insort median that says "heapq" in a comment, or keeps heapq in dead code, fails the heap criterion (its
budget); a pandas report that hides a row-wise apply behind getattr and keeps pivot_table in a dead helper grades
as the plain row-wise apply (the grouping and no-apply criteria are left to the LLM grader)."""

import importlib.util
import re

import pytest

from judging import TASKS, reference


def results(verdict):
    return {r.id: r.passed for r in verdict.results}


def failures(verdict):
    return [(r.id, r.reason) for r in verdict.results if r.passed is False]


# -- a correct solution plus what answers often add around it ----------------------------------------------------

SHELL = "Run it:\n```bash\npip install --quiet nothing-needed\npython -c 'import solution'\n```\n"
EXTRAS = {
    "semver-compare": "```\n>>> compare_versions('1.0.0-alpha', '1.0.0')\n-1\n```\n"
                      "```\nprint(compare_versions('1.2.3', '1.10.0'))  # -1\n"
                      "compare_versions('v1.0.0', '1.0.0')  # raises ValueError\n```\n",
    "interval-merge": "```\n>>> merge_intervals([(1, 3), (2, 6)])\n[(1, 6)]\n```\n"
                      "```\nmerged = merge_intervals([(1, 3), (2, 6), (8, 9)])\nprint(merged)\n```\n",
    "lru-cache": "```\n>>> cache = LRUCache(1)\n>>> cache.put('a', 1)\n```\n"
                 "```\ncache = LRUCache(2)\ncache.put('a', 1)\nassert 'a' in cache\n```\n",
}


@pytest.mark.parametrize("task_id", sorted(EXTRAS))
def test_a_reference_answer_with_shell_transcript_and_examples_still_scores_1(judge, task_id):
    answer = reference(task_id) + "\n" + SHELL + "Examples:\n" + EXTRAS[task_id]
    verdict = judge.grade(TASKS[task_id], answer)
    assert verdict.score == 1.0, failures(verdict)


# -- streaming-median: a heap in name only ------------------------------------------------------------------------

INSORT_MEDIAN = '''
import bisect
import math


class RunningMedian:
    """Running median. (heapq's two-heap trick would also work; insort keeps one sorted list instead.)"""

    def __init__(self):
        self._xs = []   # import heapq; heapq.heappush(low, -x); heapq.heappop(high) -- not needed here

    def add(self, x):
        if isinstance(x, float) and math.isnan(x):
            raise ValueError("NaN has no order")
        bisect.insort(self._xs, x)

    def median(self) -> float:
        if not self._xs:
            raise ValueError("empty")
        n = len(self._xs)
        mid = n // 2
        return float(self._xs[mid]) if n % 2 else (self._xs[mid - 1] + self._xs[mid]) / 2

    def __len__(self):
        return len(self._xs)
'''

# the same list kept sorted by a hand-written binary search: no bisect for the criterion's ban to see, so only the
# heap requirement stands between it and full marks
BINARY_INSERT = INSORT_MEDIAN.replace("import bisect\n", "").replace(
    "insort keeps one sorted list instead", "one ordered list does too").replace("        bisect.insort(self._xs, x)\n", """\
        lo, hi = 0, len(self._xs)
        while lo < hi:
            mid = (lo + hi) // 2
            if self._xs[mid] <= x:
                lo = mid + 1
            else:
                hi = mid
        self._xs.insert(lo, x)
""")
DEAD_HEAP = '''
import heapq


def _two_heaps_reference(low, high, x):
    heapq.heappush(low, -x)
    heapq.heappush(high, -heapq.heappop(low))
'''


@pytest.mark.parametrize("answer", [INSORT_MEDIAN, BINARY_INSERT, DEAD_HEAP + BINARY_INSERT],
                         ids=["insort_heapq_in_a_comment", "binary_insert_heapq_in_a_comment", "heapq_in_dead_code"])
def test_a_sorted_list_median_with_heapq_in_a_comment_or_dead_code_fails_the_heap_criterion(judge, answer):
    assert answer is INSORT_MEDIAN or not {"bisect", "sort"} & set(re.findall(r"[a-z]+", answer))
    verdict = judge.grade(TASKS["streaming-median"], f"One sorted list.\n```python\n{answer}```\n")
    got = results(verdict)
    assert got["c9"] is False, verdict.results
    assert all(got[f"c{i}"] is True for i in range(1, 9)), failures(verdict)    # otherwise correct
    assert verdict.score < 1.0


def test_a_two_heap_median_whose_docstring_says_sorted_scores_1(judge):
    answer = reference("streaming-median").replace(
        "    def add(self, x):\n",
        '    def add(self, x):\n        """O(log n): never sorted(self.xs) or self.xs.sort() per call."""\n')
    assert "sorted(" in answer
    verdict = judge.grade(TASKS["streaming-median"], answer)
    assert verdict.score == 1.0, failures(verdict)


# -- pandas-sales-pivot: apply behind getattr, pivot_table in dead code --------------------------------------------

GETATTR_APPLY = '''
import pandas as pd


def _vectorised(df):
    # the vectorised version, kept for reference
    data = df.assign(month=pd.to_datetime(df["date"]).dt.to_period("M"), revenue=df["units"] * df["unit_price"])
    return data.pivot_table(index="region", columns="month", values="revenue", aggfunc="sum", fill_value=0)


def sales_report(df: pd.DataFrame) -> pd.DataFrame:
    data = df.dropna(subset=["region"])
    rows = getattr(data, "app" + "ly")(
        lambda r: (r["region"], str(pd.Timestamp(r["date"]))[:7], r["units"] * r["unit_price"]), axis=1)
    table = {}
    for region, month, revenue in rows:
        table.setdefault(region, {}).setdefault(month, 0.0)
        table[region][month] += revenue
    out = pd.DataFrame.from_dict(table, orient="index")
    out = out[sorted(out.columns)].astype(float)
    out = out.where(out.notna(), 0.0)
    out["total"] = out.sum(axis=1)
    out = out.round(2)
    out.index.name = "region"
    return out.sort_index().sort_values("total", ascending=False, kind="stable")
'''


PLAIN_APPLY = GETATTR_APPLY.split("def sales_report", 1)[0].split("\n\ndef _vectorised", 1)[0] + "\n\ndef sales_report" + \
    GETATTR_APPLY.split("def sales_report", 1)[1].replace('getattr(data, "app" + "ly")(', "data.apply(")


def test_getattr_apply_with_a_dead_pivot_table_grades_as_the_plain_apply(judge):
    assert "_vectorised" not in PLAIN_APPLY and "data.apply(" in PLAIN_APPLY
    futures = [judge.submit(TASKS["pandas-sales-pivot"], f"Row by row.\n```python\n{code}```\n")
               for code in (GETATTR_APPLY, PLAIN_APPLY)]
    hidden, plain = (f.result() for f in futures)
    assert results(hidden) == results(plain), (failures(hidden), failures(plain))
    assert results(hidden)["c7"] is None and results(hidden)["c8"] is None     # left to the LLM grader
    if importlib.util.find_spec("pandas") is not None:
        assert all(results(hidden)[f"c{i}"] is True for i in range(1, 7)), failures(hidden)   # the output is right
