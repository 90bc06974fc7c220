"""The soyuz task: 44 tasks with criteria checklists, rolled out as answer -> critique -> revision.

For every task and each of its G samples (the soyuz reference run's rollout):

    turn 0   the model answers the task                      -> judge -> s0
    critique built from the judge's actual reasons: "scored N/10, problems: ... scrap it and rewrite" when the
             answer is bad (s0 < 0.5), a lighter revision request when it is good
    turn 1   the model revises, with the whole conversation as its prompt -> judge -> s1

The rollout, the rewards and soyuz's metrics are minigrpo/tasks/twoturn.py's, shared with the revise task: turn 0
= s0 (the guard), turn 1 = s1 + 0.5·(s1 − s0) (grpo.recovery_rewards; --recovery-coef, --no-turn0-guard);
advantages group-relative per turn, zero spread found on raw scores. Each turn is one sampler call for all of the
step's tasks (rows = tasks x G), or on a GPU the largest chunk of tasks the memory plan fits (run/callsize.py). What
is soyuz's own: the judge, which grades a call's answers in its worker pool as soon as the call returns (with chunks,
while the sampler generates the next chunk; a chunk's critiques wait only for its own verdicts), the critique's
wording, the stop rule for a judge that is down, and which tasks a run with the local judge leaves out: a task
marked "local": {"train": false, "why": ...} (a writing task whose machine checks pay the opposite of its act, or
a degenerate answer, at least as well as an honest wrong one: today every writing task; measured by
bench/writing_table.py and re-measured by tests/judge/test_writing_tasks.py) is left out of training and evaluation
with `--judge local`, named once at start with its reason; an LLM judge (claude, cmd:, http) includes it.
"""
import os

from minigrpo.errors import StopRun
from minigrpo.files import DATA as PACKAGE_DATA, read_json
from minigrpo.judge import missing_packages, sandbox_isolation, validate_task
from minigrpo.judge import make_judge
from minigrpo.tasks import twoturn
from minigrpo.tasks.twoturn import BAD, recovery_metrics  # noqa: F401  (BAD: a harsh critique below it)

DATA = os.path.join(PACKAGE_DATA, "soyuz_tasks.json")
JUDGE_DOWN_STEPS = 3    # steps in a row in which every grader call failed stop the run (a grader that is down)
QUOTED_REASONS = {None, "python", "count", "syllables", "rhyme", "natural"}   # whose reasons the critique may
# quote: an LLM grader's (no machine check), the python driver's own (criterion line, failure kind; never the test
# or the answer's output), the counting checks' numbers and the writing check's (what is repeated or broken); a
# regex or phrase check's reason would hand the policy the hidden pattern


class JudgeDown(StopRun):
    """Every call to the grader failed for JUDGE_DOWN_STEPS steps in a row."""


def load_tasks(path: str = DATA) -> list[dict]:
    """The tasks of a JSON file holding a list of tasks or {"tasks": [...]}, each checked against the judge's schema:
    a bad one is a ValueError naming the file and the task."""
    data = read_json(path, "soyuz task file not found (pass --data FILE)", fix="; fix the file or pass another --data")
    tasks = data.get("tasks") if isinstance(data, dict) else data
    if not isinstance(tasks, list) or not tasks:
        raise ValueError(f"{path}: expected a non-empty list of tasks or {{\"tasks\": [...]}} (the schema of {DATA})")
    for i, t in enumerate(tasks):
        if not isinstance(t, dict) or not isinstance(t.get("id"), str) or not t["id"]:
            raise ValueError(f"{path}: task {i + 1} needs a string 'id' (the schema of {DATA})")
        try:
            validate_task(t)
        except ValueError as e:
            raise ValueError(f"{path}: {e}") from None
    return tasks


def local_exclusions(tasks: list[dict]) -> list[tuple[str, str]]:
    """(id, why) of the tasks a run with the local judge leaves out ("local": {"train": false, "why": ...}).
    ValueError for a malformed mark: a typo must not train a task the measurement left out."""
    out = []
    for t in tasks:
        mark = t.get("local")
        if mark is None:
            continue
        if not isinstance(mark, dict) or set(mark) - {"train", "why"} or not isinstance(mark.get("train"), bool) \
                or not (isinstance(mark.get("why"), str) and mark["why"].strip()):
            raise ValueError(f"task {t.get('id')}: 'local' must be {{\"train\": true|false, \"why\": \"...\"}}, "
                             f"got {mark!r}")
        if not mark["train"]:
            out.append((t["id"], mark["why"]))
    return out


def tasks_for_judge(tasks: list[dict], judge_spec: str) -> tuple[list[dict], list[str]]:
    """(the tasks a run with this judge trains and evaluates on, one line per task it leaves out). Only the local
    judge leaves tasks out; an LLM judge grades what the machine checks cannot."""
    left = local_exclusions(tasks)
    if judge_spec != "local" or not left:
        return list(tasks), []
    ids = {i for i, _ in left}
    graded = [t for t in tasks if t["id"] not in ids]
    if not graded:
        raise ValueError(f"every task is left out with the local judge ({', '.join(sorted(ids))}); pass an LLM judge "
                         "(--judge claude | cmd:... | http...)")
    return graded, [f"soyuz: {i} left out with the local judge (an LLM judge includes it): {why}" for i, why in left]


def critique(task: dict, verdict, max_problems: int = 6) -> str:
    """The user's second message, grounded in the judge's verdict on the answer to `task`: each failed criterion's
    text and the judge's reason for failing it."""
    if verdict is None or verdict.score is None:
        return "Review your answer against every requirement of the task and give an improved, complete answer."
    criteria = {c["id"]: c for c in task.get("criteria", [])}
    failed = [r for r in verdict.results if r.passed is False]
    # a failed writing veto first: its reason says what is wrong, and it is why the form criteria behind it fail
    failed.sort(key=lambda r: not (criteria.get(r.id, {}).get("check") or {}).get("veto"))
    problems = "; ".join(_problem(criteria.get(r.id), r) for r in failed[:max_problems])
    if len(failed) > max_problems:
        problems += f"; and {len(failed) - max_problems} more"
    n = round(10 * verdict.score)
    if verdict.score < BAD:
        return (f"Your answer scored {n}/10 against the task's checklist. Problems: {problems}. "
                "Scrap it and rewrite it from scratch, meeting every requirement.")
    if failed:
        return (f"Your answer scored {n}/10. Remaining problems: {problems}. "
                "Revise it to fix these while keeping what already works; give the full revised answer.")
    return ("Your answer scored 10/10. Check it once more for correctness and clarity and give the final, full "
            "version.")


def _problem(criterion, result):
    """One failed criterion as the critique states it: its text, and the reason where the reason is ours."""
    if criterion is None:
        return result.id
    kind = (criterion.get("check") or {}).get("type")
    return f"{criterion['text']} ({result.reason})" if result.reason and kind in QUOTED_REASONS else criterion["text"]


def judge_notes(tasks, judge_spec):
    """Lines to print once at start: the local checks' environment gaps and a weaker sandbox, if any."""
    notes = []
    gaps = sorted({m for t in tasks for c in t["criteria"] if c.get("check")
                   for m in missing_packages(c["check"])})
    if gaps:
        n = sum(bool(missing_packages(c["check"])) for t in tasks for c in t["criteria"] if c.get("check"))
        where = "left to the LLM judge" if judge_spec != "local" else "unchecked (out of the score)"
        notes.append(f"judge: {n} criteria need packages not installed here ({', '.join(gaps)}): {where}")
    level, weak = sandbox_isolation()
    if weak:
        notes.append(f"judge: weaker sandbox for answer code ({level}): {'; '.join(weak)}")
    return notes


class SoyuzTask:
    name = "soyuz"
    turns = 2
    stop_strings: list[str] = []
    overlaps_grading = True     # rollout(..., meanwhile): train.py's reference pass runs while the judge grades

    @classmethod
    def from_args(cls, args):
        """train.py's judge and shaping flags; the judge's verdict cache lives in the run folder."""
        opts = dict(judge=args.judge, workers=args.judge_workers, hybrid=args.judge_mode == "hybrid",
                    retries=args.judge_retries, timeout=args.judge_timeout,
                    cache_path=os.path.join(args.runs_dir, args.run_name, "judge_cache.sqlite"),
                    coef=args.recovery_coef, turn0_guard=args.turn0_guard)
        if args.data:
            opts["data"] = args.data
        if args.judge_model:
            opts["model"] = args.judge_model
        if args.judge_max_turns:
            opts["max_turns"] = args.judge_max_turns
        return cls(**opts)

    def __init__(self, data: str | None = None, judge: str = "local", workers: int = 8, cache_path=None,
                 coef: float = 0.5, turn0_guard: bool = True, chunk: int | None = None, judge_obj=None,
                 **judge_opts):
        # the local judge leaves out the tasks its machine checks cannot grade (self.left_out: one line each)
        self.tasks, self.left_out = tasks_for_judge(load_tasks(data or DATA), judge)
        self.coef, self.turn0_guard = coef, turn0_guard     # the shaping (twoturn.TwoTurn.turn_rewards)
        self.chunk = chunk        # tasks per sampler call; None: all (train.py may set it from the memory plan)
        self.judge = judge_obj or make_judge(judge, workers=workers, cache_path=cache_path,
                                                **judge_opts)
        self.judge_spec, self.ungraded_steps = judge, 0
        for line in self.left_out + judge_notes(self.tasks, judge):
            print(line, flush=True)

    def examples(self, split: str) -> list[dict]:
        # The soyuz run trains and reports on the same 44 tasks (its numbers are "on the trained distribution").
        return list(self.tasks)

    def messages(self, ex: dict) -> list[dict]:
        return [{"role": "user", "content": ex["prompt"]}]

    def score(self, ex: dict, completion: str):
        v = self.judge.grade(ex, completion)
        return None if v is None else v.score

    # -- the two-turn rollout (minigrpo/tasks/twoturn.py, shared with revise) --------------------------------

    def submit(self, ex: dict, answer: str):
        return self.judge.submit(ex, answer)          # graded in the judge's worker pool

    def critique_for(self, ex: dict, verdict) -> str:
        return critique(ex, verdict)

    def rollout(self, generate, tok, examples, seeds, args, meanwhile=None):
        """`generate(prompts, seeds, n, reuse, keep)` -> per prompt n samples (episodes.py). The Seqs of both turns,
        each rollout's turn 0 followed by its turn 1 (twoturn.rollout; with chunks, judging overlaps generation;
        meanwhile(seqs) runs while the revisions are graded)."""
        judge_stats = self.judge.stats()
        out = twoturn.rollout(self, generate, tok, examples, seeds, args, meanwhile)
        self._count_ungraded(judge_stats)
        return out

    def _count_ungraded(self, before):
        """A grader that is down (every call it was asked in a step failed) stops the run after JUDGE_DOWN_STEPS
        such steps, instead of training on through 'reward None'."""
        after = self.judge.stats()
        calls = after["calls"] - before["calls"]
        failed = after["errors"] + after["invalid"] - before["errors"] - before["invalid"]
        if calls:              # a step that needed no grader call (all criteria machine-checked) says nothing
            self.ungraded_steps = self.ungraded_steps + 1 if failed == calls else 0
        if self.ungraded_steps >= JUDGE_DOWN_STEPS:
            raise JudgeDown(f"stopping: the {self.judge_spec} judge failed every call for {self.ungraded_steps} "
                            f"steps in a row ({failed} of {calls} in the last; its last error: "
                            f"{getattr(self.judge, 'last_error', None)}): check the judge command or server")

    # -- metrics as the soyuz run reports them ------------------------------------------------------------------------

    def step_metrics(self, seqs) -> dict:
        # tasks whose verdict has had no score several times in a row (the judge logs each once): no reward signal
        return {**recovery_metrics(seqs), "judge_unscored_tasks": self.judge.stats().get("unscored_tasks", 0)}

