"""Reading the answer's source never pays: a criterion met only by how the code is spelled ("uses groupby", "no
Python loops") is unchecked in local mode (the LLM grades it in hybrid and llm modes), and where local mode pays
for "uses X" or "must not X" it pays a budget that the alternative fails. So the same behaviour, spelled two ways,
scores the same: a branch the tests never take, naming what an inspection looked for, buys nothing, and a row loop
written as `functools.reduce` or as `zip(*columns)` scores as the `for` / `iterrows` loop it is."""

import importlib.util

import pytest

from judging import TASKS, fenced, grade_all
from minigrpo.judge.checks import run_check

needs_pandas = pytest.mark.skipif(importlib.util.find_spec("pandas") is None, reason="pandas not installed")

# -- pandas-sales-pivot ------------------------------------------------------------------------------------------

DICT_LOOP = '''
import pandas as pd


def sales_report(df: pd.DataFrame) -> pd.DataFrame:
{decoy}    rows = {rows}
    table = {}
    for region, date, units, price in rows:
        if region is None or region != region:
            continue
        month = str(date)[:7]
        row = table.setdefault(region, {})
        row[month] = row.get(month, 0.0) + units * price
    months = sorted({m for row in table.values() for m in row})
    out = pd.DataFrame([[table[r].get(m, 0.0) for m in months] for r in table], index=list(table), columns=months)
    out = out.astype(float)
    out["total"] = out.sum(axis=1)
    out = out.round(2)
    out.index.name = "region"
    return out.sort_index().sort_values("total", ascending=False, kind="stable")
'''

# A branch no test takes (the tests' frames are never empty), naming what pandas-sales-pivot's grouping, month and
# fill criteria looked for.
EMPTY_BRANCH = '''    if df.empty:
        data = df.assign(month=pd.to_datetime(df["date"]).dt.to_period("M"))
        grouped = data.groupby(["region", "month"])["units"].sum().unstack(fill_value=0).fillna(0)
        return grouped
'''
COLUMNS = 'df[["region", "date", "units", "unit_price"]]'
ZIP_ROWS = f"zip(*{COLUMNS}.to_numpy().T.tolist())"     # a loop over rows that names neither a loop over df nor iterrows
ITERROWS = '((r["region"], r["date"], r["units"], r["unit_price"]) for _, r in df.iterrows())'


def pivot(rows, decoy=""):
    return fenced(DICT_LOOP.replace("{decoy}", decoy).replace("{rows}", rows))


# -- vectorize-loop-fix ------------------------------------------------------------------------------------------

ROW_LOOP = '''
import functools
import numpy as np


def _row(z, i, x):
    row = x[i]
    present = ~np.isnan(row)
    n = present.sum()
    if n:
        mean = row[present].mean()
        std = row[present].std()
        if std > 0 and n >= 2:
            z[i] = np.where(present, (row - mean) / std, np.nan)
        else:
            z[i] = np.where(present, 0.0, np.nan)
    return z


def normalize_scores(scores):
    x = np.asarray(scores, dtype=np.float64)
    z = np.full(x.shape, np.nan)
{loop}
'''
FOR_LOOP = "    for i in range(x.shape[0]):\n        _row(z, i, x)\n    return z"
REDUCE_LOOP = "    return functools.reduce(lambda acc, i: _row(acc, i, x), range(x.shape[0]), z)"


def normalize(loop):
    return fenced(ROW_LOOP.replace("{loop}", loop))


# The other ways to loop: over the elements in plain Python (the cheapest loop there is), and over the columns
ELEMENT_LOOP = '''
import math, numpy as np
def normalize_scores(scores):
    x = np.asarray(scores, dtype=np.float64)
    out = []
    for row in x.tolist():
        vals = [v for v in row if v == v]
        n = len(vals)
        mean = sum(vals) / n if n else 0.0
        std = math.sqrt(sum((v - mean) ** 2 for v in vals) / n) if n else 0.0
        ok = std > 0 and n >= 2
        out.append([math.nan if v != v else ((v - mean) / std if ok else 0.0) for v in row])
    return np.array(out, dtype=np.float64).reshape(x.shape)
'''
COLUMN_LOOP = '''
import numpy as np
def normalize_scores(scores):
    x = np.asarray(scores, dtype=np.float64)
    n = np.zeros(x.shape[0]); s = np.zeros(x.shape[0])
    for j in range(x.shape[1]):
        p = ~np.isnan(x[:, j]); n += p; s += np.where(p, x[:, j], 0)
    mean = s / np.maximum(n, 1)
    q = np.zeros(x.shape[0])
    for j in range(x.shape[1]):
        p = ~np.isnan(x[:, j]); q += np.where(p, (x[:, j] - mean) ** 2, 0)
    std = np.sqrt(q / np.maximum(n, 1)); ok = (std > 0) & (n >= 2)
    out = np.empty_like(x)
    for j in range(x.shape[1]):
        out[:, j] = np.where(np.isnan(x[:, j]), np.nan, np.where(ok, (x[:, j] - mean) / np.where(ok, std, 1), 0.0))
    return out
'''


def scores(judge, task_id, answers):
    verdicts = grade_all(judge, [(name, task_id, answer) for name, answer in answers.items()])
    return {name: v.score for name, v in verdicts.items()}, verdicts


def by_id(verdict):
    return {r.id: r.passed for r in verdict.results}


@needs_pandas
def test_a_branch_no_test_takes_buys_nothing(judge):
    got, v = scores(judge, "pandas-sales-pivot", {"decoy": pivot(ZIP_ROWS, EMPTY_BRANCH), "plain": pivot(ZIP_ROWS)})
    assert got["decoy"] <= got["plain"], (got, by_id(v["decoy"]), by_id(v["plain"]))
    assert by_id(v["plain"])["c1"] is True          # the loop's table is right: only the spelling differs


@needs_pandas
def test_zip_over_column_lists_scores_as_iterrows(judge):
    got, v = scores(judge, "pandas-sales-pivot", {"zip": pivot(ZIP_ROWS), "iterrows": pivot(ITERROWS)})
    assert got["zip"] <= got["iterrows"], (got, by_id(v["zip"]), by_id(v["iterrows"]))
    assert by_id(v["zip"])["c8"] is None, v["zip"].results      # no budget tells it from vectorised code: the LLM


def test_a_reduce_row_loop_scores_as_the_for_loop(judge):
    got, v = scores(judge, "vectorize-loop-fix", {"reduce": normalize(REDUCE_LOOP), "for": normalize(FOR_LOOP)})
    assert got["reduce"] <= got["for"], (got, by_id(v["reduce"]), by_id(v["for"]))
    assert by_id(v["reduce"])["c8"] is False, v["reduce"].results   # the speed criterion fails a row loop


@pytest.mark.parametrize("answer", [normalize(FOR_LOOP), normalize(REDUCE_LOOP), fenced(ELEMENT_LOOP),
                                    fenced(COLUMN_LOOP)], ids=["rows_for", "rows_reduce", "elements", "columns"])
def test_every_python_loop_fails_the_speed_criterion(answer):
    """vectorize-loop-fix c8 on a tall and a wide matrix: a loop over rows, columns or elements, however spelled,
    is over the CPU budget (the reference passes it: tests/judge/test_behaviour.py)."""
    speed = next(c["check"] for c in TASKS["vectorize-loop-fix"]["criteria"] if c["id"] == "c8")
    correct = next(c["check"] for c in TASKS["vectorize-loop-fix"]["criteria"] if c["id"] == "c1")
    assert run_check(correct, answer)[0] is True                   # the loop is right (c1 alone) ...
    passed, reason = run_check(speed, answer)
    assert passed is False and ("CPU-time limit" in reason or "assertion failed at line 42" in reason), reason
