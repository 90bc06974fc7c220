"""The soyuz writing tasks against answers that are not writing or do the opposite act: docs/judge-writing.md's table.

    python bench/writing_table.py              # print the table (markdown)
    python bench/writing_table.py --write      # and write it into docs/judge-writing.md, between its markers
    python bench/writing_table.py --detail     # every degenerate answer's local score, per task

For each of the 12 writing tasks: the reference answer (tests/data/soyuz/<id>.good.md), the honest-wrong one
(<id>.bad.md), the opposite act (<id>.opposite.md), the empty answer and the degenerate answers below, graded in
local mode (machine checks only) and in hybrid mode with a scripted grader standing in for the LLM (ScriptedGrader:
it passes every criterion it is asked about when the answer is the task's reference answer and fails every one
otherwise, so the hybrid column shows what the machine checks add to an LLM that is never fooled, and an LLM that is
not, on the reference, never misses).

The opposite act is an answer of the right form that does the opposite of the task's core act: the meeting accepted
instead of declined, a letter for another role, a haiku set somewhere else; it says the words a keyword check of
the core act would look for ("I thought about declining"). A task trains locally only where it scores below the
honest-wrong answer (or 0), i.e. where a machine check tells the act (left_out).

The degenerate answers, written as a policy paid by surface checks would write them:
  stuffed    per task, the keywords and the form each positive check looks for, repeated (STUFFED, by hand)
  word-list  the reference's content words in its lines, the function words taken out
  repeated   the reference's longest line, once per line of the reference
  echo       the task prompt, returned as the answer; checklist: the criteria texts, one per line (the critique
             quotes them at turn 1)
  shuffled   the reference with the words inside each line shuffled (first and last word kept, so line counts,
             syllables, rhymes, acrostic letters survive), the best of SHUFFLE_SEEDS shuffles
  one-word, whitespace
The tests (tests/judge/test_writing_tasks.py) grade the same answers through these functions.
"""

import argparse
import json
import os
import random
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from minigrpo.judge import Judge, make_judge                      # noqa: E402
from minigrpo.judge.writing import FUNCTION_WORDS                      # noqa: E402

TASKS_PATH = os.path.join(ROOT, "minigrpo", "data", "soyuz_tasks.json")
ANSWERS = os.path.join(ROOT, "tests", "data", "soyuz")
DOC = os.path.join(ROOT, "docs", "judge-writing.md")
MARKERS = ("<!-- writing-table:start -->", "<!-- writing-table:end -->")
SHUFFLE_SEEDS = range(8)

_R = "rain rain rain rain rain"
STUFFED = {
    "micro-fiction": "# Salt Letter Salt Letter\n\n" + "\n\n".join(["salt letter " * 14] * 3) +
                     '\n\n"salt letter salt letter salt letter salt letter salt letter"\n',
    "eli5-vaccines": "You like your germs. " * 31 + "You like your germs?\n",
    "limerick-friday-deploy": "Friday code Friday code Friday night\nFriday code Friday code Friday right\n"
                              "Friday code Friday day\nFriday code Friday say\nFriday code Friday code Friday light\n",
    "haiku-server-room": f"{_R}\nfans fans fans fans fans fans fans\n{_R}\n",
    "dialogue-postmortem": "MAYA: rollback postmortem rollback postmortem\nOMAR: postmortem rollback postmortem "
                           "rollback\n" * 7,
    "tone-rewrite-email": "Hi Sam,\n\n" + "112 113 114 INC-4821 Friday 5 pm two weeks manager escalate " * 8 +
                          "\n\nBest,\nPriya\n",
    "product-description-charger": "## Nimbus 65 W 98 g USB-C two ports\n\nNimbus 65 W 98 g USB-C two ports charger "
                                   "charger.\n\n" + "- **Nimbus 65 W** 98 g USB-C two ports charger charger charger "
                                   "charger charger\n" * 4 + "\nOrder Nimbus 65 W 98 g USB-C two ports charger.\n",
    "cover-letter-backend": "Dear Hiring Team,\n\n" + "\n\n".join(
        ["Ledgerline Backend Engineer (Payments) 900 ms 250 ms 92% Ledgerline Go Python AWS payments " * 5] * 4) +
        "\n\nSincerely,\nPriya Raman\n",
    "email-decline-meeting": "Subject: Q3 roadmap review workshop\n\nHi Jordan,\n\n" +
                             "Q3 roadmap review workshop " * 10 + "\nThursday 10:00–10:30\nFriday 14:00–14:30\n" +
                             "Q3 roadmap review workshop " * 5 + "\n\nAlex\n",
    "summary-bike-share": "- Veldhaven 1,200 38% €4.1 million Veldhaven 1,200 38% €4.1 million\n" * 3,
    "tweet-thread-launch": "1/5 GRPO PyTorch GRPO PyTorch?\n\n2/5 GRPO PyTorch GRPO PyTorch\n\n3/5 GRPO PyTorch GRPO "
                           "PyTorch\n\n4/5 GRPO PyTorch GRPO PyTorch\n\n5/5 GRPO PyTorch "
                           "https://github.com/example/minigrpo\n",
    "acrostic-gradient": "".join(f"{a} mistake error mistake error mistake {b}\n" for a, b in zip(
        "Go Run And Do In Each No To".split(), "night light day way fail trail right bright".split())),
}
ONE_WORD = {"micro-fiction": "letter", "eli5-vaccines": "germs", "limerick-friday-deploy": "Friday",
            "haiku-server-room": "rain", "dialogue-postmortem": "rollback", "tone-rewrite-email": "INC-4821",
            "product-description-charger": "Nimbus", "cover-letter-backend": "Ledgerline",
            "email-decline-meeting": "workshop", "summary-bike-share": "Veldhaven", "tweet-thread-launch": "GRPO",
            "acrostic-gradient": "mistake"}


def load_tasks():
    with open(TASKS_PATH, encoding="utf-8") as f:
        return [t for t in json.load(f) if t["family"] == "writing"]


def answer(task_id, kind):
    with open(os.path.join(ANSWERS, f"{task_id}.{kind}.md"), encoding="utf-8") as f:
        return f.read()


def _content_only(line):
    return " ".join(w for w in line.split() if re.sub(r"\W", "", w).lower() not in FUNCTION_WORDS)


def shuffled(text, seed):
    """The words inside each line in a random order; each line's first and last word stay where they are."""
    rnd, out = random.Random(seed), []
    for line in text.split("\n"):
        ws = line.split()
        if len(ws) > 3:
            mid = ws[1:-1]
            rnd.shuffle(mid)
            ws = [ws[0], *mid, ws[-1]]
        out.append(" ".join(ws))
    return "\n".join(out)


def degenerate_answers(task):
    """{name: answer} of the degenerate answers to a task (shuffled: one per seed, 'shuffled/<seed>')."""
    good, tid = answer(task["id"], "good"), task["id"]
    lines = [line for line in good.split("\n") if line.strip()]
    out = {"empty": "", "whitespace": " \n\n\t \n", "one-word": ONE_WORD[tid], "stuffed": STUFFED[tid],
           "word-list": "\n".join(_content_only(line) for line in good.split("\n")),
           "repeated": "\n".join([max(lines, key=len)] * len(lines)) + "\n",
           "echo": task["prompt"], "checklist": "\n".join(c["text"] for c in task["criteria"])}
    out.update({f"shuffled/{s}": shuffled(good, s) for s in SHUFFLE_SEEDS})
    return out


class ScriptedGrader:
    """A deterministic stand-in for the LLM grader (a Judge backend): passes every criterion it is asked about
    when the fenced answer is the task's reference answer, fails every one otherwise."""
    key = "scripted-writing-grader"

    def __init__(self, tasks):
        self.references = {answer(t["id"], "good").strip() for t in tasks}

    def __call__(self, prompt, timeout):
        fence = re.search(r"between the two lines (<<<ANSWER-[0-9a-f]+>>>)", prompt).group(1)
        graded = prompt.split(fence + "\n")[1][:-1]      # the answer, between its two fence lines
        ids = re.findall(r'^- id "([^"]+)":', prompt.split("CHECKLIST (grade")[1], re.M)
        ok = graded.strip() in self.references
        return json.dumps({"criteria": [{"id": i, "passed": ok, "reason": "scripted"} for i in ids],
                           "reason": "reference answer" if ok else "not the reference answer"})


def judges(tasks):
    """(local judge, hybrid judge with the scripted grader)."""
    return make_judge("local", workers=2), Judge("scripted", backend=ScriptedGrader(tasks), workers=2, retries=0)


def grade_all(tasks, judge):
    """{task id: {answer name: score}} for the reference, the honest-wrong and every degenerate answer."""
    futures = {}
    for t in tasks:
        answers = {"reference": answer(t["id"], "good"), "honest-wrong": answer(t["id"], "bad"),
                   "opposite-act": answer(t["id"], "opposite"), **degenerate_answers(t)}
        futures[t["id"]] = {name: judge.submit(t, a) for name, a in answers.items()}
    return {tid: {name: fut.result().score for name, fut in d.items()} for tid, d in futures.items()}


def best_degenerate(scores, leave=()):
    """(name, score) of the highest-scoring degenerate answer of one task, shuffles folded into 'shuffled' and the
    answers named in `leave` left out; name 'all' when every one scores 0."""
    deg = {k: v for k, v in scores.items() if k not in ("reference", "honest-wrong", "opposite-act", *leave)}
    name = max(deg, key=lambda k: (deg[k], k))
    return ("all" if deg[name] == 0 else name.split("/")[0]), deg[name]


def paid(score, scores):
    """Whether an answer other than the reference is paid like an attempt: above 0 (an answer that scores 0 is never
    paid, whatever the honest-wrong fixture scores) and at least as well as the honest-wrong answer."""
    return score > 0 and score >= scores["honest-wrong"]


def left_out(scores):
    """What leaves a task out of local training, from its local scores ('' when nothing does): its opposite act
    paid (no machine check tells the task's core act), or a degenerate answer paid."""
    why = []
    if paid(scores["opposite-act"], scores):
        why.append(f"the opposite act scores {scores['opposite-act']:.2f}")
    name, best = best_degenerate(scores)
    if paid(best, scores):
        why.append(f"{name} scores {best:.2f}")
    return "; ".join(why) + (f" (honest-wrong {scores['honest-wrong']:.2f})" if why else "")


def table(tasks, local, hybrid):
    """The markdown table: each cell 'local / hybrid'."""
    head = ["task", "local training", "reference", "honest-wrong", "opposite act", "empty", "keyword-stuffed",
            "highest other degenerate"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for t in tasks:
        lo, hy = local[t["id"]], hybrid[t["id"]]
        cells = [t["id"], "left out" if t.get("local", {}).get("train") is False else "yes"]
        cells += [f"{lo[k]:.2f} / {hy[k]:.2f}"
                  for k in ("reference", "honest-wrong", "opposite-act", "empty", "stuffed")]
        (ln, lv), (hn, hv) = best_degenerate(lo, ("empty", "stuffed")), best_degenerate(hy, ("empty", "stuffed"))
        cells.append(f"{lv:.2f} {ln} / {hv:.2f} {hn}")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--write", action="store_true", help="write the table into docs/judge-writing.md")
    p.add_argument("--detail", action="store_true", help="print every degenerate answer's local score")
    args = p.parse_args(argv)
    tasks = load_tasks()
    local_judge, hybrid_judge = judges(tasks)
    local, hybrid = grade_all(tasks, local_judge), grade_all(tasks, hybrid_judge)
    local_judge.close()
    hybrid_judge.close()
    out = table(tasks, local, hybrid)
    print(out)
    if args.detail:
        for tid, scores in local.items():
            print(tid, " ".join(f"{k}={v:.2f}" for k, v in scores.items()))
    if args.write:
        with open(DOC, encoding="utf-8") as f:
            doc = f.read()
        start, end = doc.index(MARKERS[0]) + len(MARKERS[0]), doc.index(MARKERS[1])
        with open(DOC, "w", encoding="utf-8") as f:
            f.write(doc[:start] + "\n" + out + doc[end:])


if __name__ == "__main__":
    main()
