"""No soyuz writing task pays text that is not writing (docs/judge-writing.md). Every check of the 12 writing tasks
reads target "writing" and each task carries the degeneracy criteria c11 and c12; the reference answer scores 1.0
and no degenerate answer (bench/writing_table.py: keyword-stuffed, empty, echoed...) scores above the honest-wrong
one, locally and in hybrid mode with a scripted grader. A task is trained locally only on what a machine can tell:
one whose machine checks pay the opposite act (an answer of the right form doing the opposite of the task: the
meeting accepted, not declined) or a degenerate answer at least as well as the honest-wrong one is marked, the mark
re-measured here, and left out of a local-judge run: by the soyuz task, named once at start, and by its eval."""

import os
import re
import sys
from argparse import Namespace

import pytest

from minigrpo.judge import writing
from minigrpo.judge import make_judge
from minigrpo.judge.checks import run_check
from minigrpo.tasks.soyuz import SoyuzTask, critique, local_exclusions, tasks_for_judge

from repo_root import ROOT

sys.path.insert(0, os.path.join(ROOT, "bench"))
import writing_table as bench  # noqa: E402

TASKS = bench.load_tasks()
IDS = [t["id"] for t in TASKS]


# ----------------------------------------------------------------------------------------------------------------
# The task file

def test_defaults_pass_every_reference_and_honest_wrong_answer():
    """The gate's limits fail text that is not writing, never an honest attempt, however bad (nor the opposite
    act, which is writing too)."""
    for t in TASKS:
        for kind in ("good", "bad", "opposite"):
            assert not writing.problems(bench.answer(t["id"], kind)), (t["id"], kind)


def test_every_check_of_a_writing_task_reads_writing():
    """So every must-not among them pays only writing: 34 criteria the empty answer used to pass (19 regexes that
    must not match, 14 banned-phrase lists, one all() of two such regexes; no `not`), each failing now on the
    empty, the keyword-stuffed and the one-word answer."""
    def leaves(c):
        yield c
        for sub in c.get("checks", []) + ([c["check"]] if "check" in c else []):
            yield from leaves(sub)
    must_not = 0
    for t in TASKS:
        for c in t["criteria"]:
            if c["check"] is None:
                continue
            assert all(leaf.get("target") == "writing" for leaf in leaves(c["check"]) if leaf["type"] not in
                       ("all", "any", "not")), (t["id"], c["id"])
            if run_check(c["check"], "")[1].startswith("a blank answer"):      # passes on nothing: a must-not
                must_not += 1
                for answer in (bench.STUFFED[t["id"]], " ", bench.ONE_WORD[t["id"]]):
                    assert run_check(c["check"], answer)[0] is False, (t["id"], c["id"], answer[:40])
    assert must_not == 34, f"{must_not} must-not criteria in the writing tasks: update this inventory"


def test_the_task_file_carries_the_degeneracy_criteria():
    lines_forms = {"limerick-friday-deploy", "haiku-server-room", "dialogue-postmortem", "summary-bike-share",
                   "tweet-thread-launch", "acrostic-gradient"}
    for t in TASKS:
        c11, c12 = t["criteria"][-2:]
        assert (c11["id"], c12["id"]) == ("c11", "c12")
        assert c11["check"]["type"] == c12["check"]["type"] == "natural"
        assert c11["check"]["veto"] is c12["check"]["veto"] is True
        assert c11["check"]["form"] == ("lines" if t["id"] in lines_forms else "prose")
        # the echo text is the prompt and the criteria texts: edit one, and this says to rebuild it
        assert c12["check"]["echo"] == writing.echo_source(t), f"{t['id']}: c12's echo is stale"


def test_the_critique_quotes_what_is_not_writing():
    """The writing check's reason names what is repeated or broken (never a hidden pattern): the critique quotes
    it, also where it is the only criterion that failed."""
    task = next(t for t in TASKS if t["id"] == "micro-fiction")
    judge = make_judge("local")
    assert "the word 'salt' is" in critique(task, judge.grade(task, bench.STUFFED["micro-fiction"]))
    nouns = r"\b(envelope|rocks|handwriting|name|city|husband|paintings|sea|beam|water|logbook|hands|sheet|wick|" \
            r"glass|wind|table)\b"
    v = judge.grade(task, re.sub(nouns, "salt", bench.answer("micro-fiction", "good")))    # 'salt', 1 word in 6
    failed = [r for r in v.results if r.passed is False]
    assert failed[-1].id == "c11" and all("c11 finds the answer is not writing" in r.reason for r in failed[:-1])
    assert critique(task, v).split("Problems: ")[1].startswith(c11_text(task)), critique(task, v)   # c11 first
    assert "the word 'salt' is" in critique(task, v)
    judge.close()


def c11_text(task):
    return next(c["text"] for c in task["criteria"] if c["id"] == "c11")


# Keyword stuffing shaped to meet every form check of the thread: numbering, a question, the names, the link, two
# hashtags. Only c11 sees it (the word 'grpo' is 17% of the words); before the veto it paid 8 of 9 criteria.
STUFFED_THREAD = "\n\n".join([
    "1/5 GRPO in PyTorch? GRPO in PyTorch for Qwen: the GRPO of PyTorch is here",
    "2/5 GRPO in PyTorch for Qwen: a GRPO with PyTorch for the Qwen models",
    "3/5 GRPO in PyTorch for Qwen: runs GRPO on a CPU with PyTorch and LoRA",
    "4/5 GRPO in PyTorch for Qwen: GRPO and PyTorch and a judge for rewards",
    "5/5 GRPO in PyTorch for Qwen: #GRPO #PyTorch https://github.com/example/minigrpo"])


@pytest.mark.parametrize("mode", [0, 1], ids=["local", "hybrid"])
def test_a_failed_veto_takes_every_form_point(mode):
    """A writing veto that fails (c11: not writing) fails every criterion reading target "writing" with it: the
    form checks pay only writing. Hybrid mode applies the same veto to the same machine-checked criteria."""
    task = next(t for t in TASKS if t["id"] == "tweet-thread-launch")
    judge = bench.judges([task])[mode]
    v, control = judge.grade(task, STUFFED_THREAD), judge.grade(task, bench.answer(task["id"], "bad"))
    judge.close()
    by_id = {r.id: r for r in v.results}
    assert by_id["c11"].passed is False and "the word 'grpo'" in by_id["c11"].reason
    assert all(by_id[f"c{i}"].passed is False for i in range(1, 9)), v.problems()
    assert v.score <= control.score, (v.score, control.score)


# ----------------------------------------------------------------------------------------------------------------
# The measurement: reference, honest-wrong, empty and degenerate answers, local and hybrid

@pytest.fixture(scope="module")
def scores():
    local, hybrid = bench.judges(TASKS)
    out = {"local": bench.grade_all(TASKS, local), "hybrid": bench.grade_all(TASKS, hybrid)}
    local.close()
    hybrid.close()
    return out


ALWAYS = ("empty", "whitespace", "one-word", "stuffed", "repeated", "echo", "checklist")


def marked(task_id):
    return next(t for t in TASKS if t["id"] == task_id).get("local", {}).get("train") is False


@pytest.mark.parametrize("mode", ["local", "hybrid"])
@pytest.mark.parametrize("task_id", IDS)
def test_reference_scores_one_and_degenerate_no_more_than_honest_wrong(scores, mode, task_id):
    """Keyword stuffing, a repeated line, the task or its checklist echoed, empty, whitespace, one word: never
    above the honest-wrong answer, in every writing task and both modes. In a task the local judge keeps, no
    degenerate answer at all (word lists, shuffles too) is, and in local mode each scores 0."""
    s = scores[mode][task_id]
    assert s["reference"] == 1.0
    for name, score in s.items():
        if name in ("reference", "honest-wrong") or (marked(task_id) and not name.startswith(ALWAYS)):
            continue
        assert score <= s["honest-wrong"], (mode, name, score, s["honest-wrong"])
        assert score == 0.0 or mode == "hybrid" or marked(task_id), (name, score)


@pytest.mark.parametrize("task_id", IDS)
def test_the_local_mark_is_what_the_measurement_says(scores, task_id):
    """Left out of local training exactly when the opposite act or some degenerate answer is paid (scores above 0)
    at least as well as the honest-wrong answer: a check that learns to tell the act or to see a shuffle, or one
    that starts paying a degenerate answer, flips this test."""
    why = bench.left_out(scores["local"][task_id])
    assert marked(task_id) == bool(why), f"{task_id}: marked {marked(task_id)}, measured: {why or 'nothing paid'}"


@pytest.mark.parametrize("task_id", IDS)
def test_the_opposite_act_is_of_the_right_form(scores, task_id):
    """The opposite act is writing of the task's form, not a degenerate answer: the degeneracy vetoes c11 and c12
    find nothing in it (unchecked locally), so what it scores is what the form checks pay for the wrong act."""
    task = next(t for t in TASKS if t["id"] == task_id)
    text = bench.answer(task_id, "opposite")
    assert [run_check(c["check"], text)[0] for c in task["criteria"][-2:]] == [None, None]
    assert scores["local"][task_id]["opposite-act"] > 0


def test_the_table_in_the_docs_is_current(scores):
    with open(bench.DOC, encoding="utf-8") as f:
        doc = f.read()
    shown = doc.split(bench.MARKERS[0])[1].split(bench.MARKERS[1])[0].strip()
    assert shown == bench.table(TASKS, scores["local"], scores["hybrid"]).strip(), \
        "docs/judge-writing.md: rerun python bench/writing_table.py --write"


# ----------------------------------------------------------------------------------------------------------------
# The exclusion, wired into the soyuz task and its eval

LEFT_OUT = set(IDS)     # every writing task: no machine check tells any one's core act


def test_the_local_judge_leaves_the_marked_tasks_out_and_says_so(capsys):
    task = SoyuzTask(judge="local", judge_obj=object())
    assert len(task.tasks) == 44 - len(LEFT_OUT) and not LEFT_OUT & {t["id"] for t in task.examples("train")}
    out = capsys.readouterr().out.splitlines()
    named = [line for line in out if "left out with the local judge" in line]
    assert sorted(line.split()[1] for line in named) == sorted(LEFT_OUT)            # once each, with the reason
    assert all(len(line.split(": ", 2)[2]) > 40 for line in named)
    for spec in ("claude", "cmd:python grader.py", "http://localhost:8000"):
        task = SoyuzTask(judge=spec, judge_obj=object())
        assert len(task.tasks) == 44 and task.left_out == []
    assert "left out" not in capsys.readouterr().out


def test_the_eval_leaves_them_out_with_the_local_judge(tmp_path):
    from minigrpo.evals.soyuz import report_notes, soyuz_data
    args = Namespace(data=None, judge=None, judge_workers=1, out=str(tmp_path), batch_size=1, limit=None)
    task, exs = soyuz_data(args)
    assert len(exs) == 44 - len(LEFT_OUT) and len(task.left_out) == len(LEFT_OUT)
    task.judge.close()
    notes = report_notes({}, task.left_out)
    assert sum("left out with the local judge" in n for n in notes) == len(LEFT_OUT)
    assert notes[:-len(LEFT_OUT)] == report_notes({}, [])
    task, exs = soyuz_data(Namespace(**{**vars(args), "judge": "cmd:true"}))
    assert len(exs) == 44 and report_notes({}, task.left_out) == report_notes({}, [])
    task.judge.close()


@pytest.mark.parametrize("mark", [{"train": "no", "why": "x"}, {"train": False}, {"train": False, "why": " "},
                                  {"train": False, "why": "x", "mode": "llm"}, "skip"])
def test_a_malformed_mark_is_refused(mark):
    tasks = [{"id": "t", "local": mark}]
    with pytest.raises(ValueError, match="task t: 'local' must be"):
        local_exclusions(tasks)


def test_every_task_left_out_is_refused():
    tasks = [{"id": "a", "local": {"train": False, "why": "w"}}, {"id": "b", "local": {"train": True, "why": "w"}}]
    assert [t["id"] for t in tasks_for_judge(tasks, "local")[0]] == ["b"]
    with pytest.raises(ValueError, match="every task is left out"):
        tasks_for_judge(tasks[:1], "local")
    assert tasks_for_judge(tasks[:1], "claude") == (tasks[:1], [])
