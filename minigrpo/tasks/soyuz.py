"""The soyuz task: 44 tasks with criteria checklists, rolled out as answer -> critique -> revision.

For every task and each of its G samples (shared/seeds/000_*.txt):

    turn 0   the model answers the task                      -> judge -> s0
    critique built from the judge's actual reasons: "scored N/10, problems: ... scrap it and rewrite" when the
             answer is bad (s0 < 0.5), a lighter revision request when it is good
    turn 1   the model revises, with the whole conversation as its prompt -> judge -> s1

Rewards: turn 0 = s0; turn 1 = s1 + 0.5·(s1 − s0) (grpo.recovery_rewards). Advantages are group-relative per turn
(the G turn-0 answers of a task form one group, their G revisions another); each turn's own tokens get that turn's
advantage; the critique and the earlier turn are prompt, never trained. Zero-spread groups are found on raw scores.

Judging runs in the judge's worker pool while the sampler generates the next chunk of tasks, so the sampler is not
idle while the judge works; the turn-1 critique of a chunk waits only for that chunk's own verdicts.
"""
import os
from collections import deque

from minigrpo import grpo
from minigrpo.checks import missing_packages, sandbox_isolation
from minigrpo.common import derive_seed, mean, read_json
from minigrpo.judge import make_judge
from minigrpo.runs import StopRun
from minigrpo.tasks import Seq

DATA = os.path.join(os.path.dirname(os.path.dirname(__file__)), "data", "soyuz_tasks.json")
BAD = 0.5  # below this a turn-0 answer counts as bad: harsh critique, and it counts for "recovery"
JUDGE_DOWN_STEPS = 3    # steps in a row in which every grader call failed stop the run (a grader that is down)
QUOTED_REASONS = {None, "python", "count", "syllables", "rhyme"}   # whose reasons the critique may quote: an LLM
# grader's (no machine check), the python driver's own (criterion line, failure kind; never the test or the
# answer's output) and the counting checks' numbers; a regex or phrase check's reason would hand the policy the
# hidden pattern


class JudgeDown(StopRun):
    """Every call to the grader failed for JUDGE_DOWN_STEPS steps in a row."""


def load_tasks(path: str = DATA) -> list[dict]:
    """The tasks of a JSON file holding a list of tasks or {"tasks": [...]}."""
    tasks = read_json(path, "soyuz task file not found (pass --data FILE)", fix="; fix the file or pass another --data")
    return tasks["tasks"] if isinstance(tasks, dict) else tasks


def critique(verdict, task: dict | None = None, max_problems: int = 6) -> str:
    """The user's second message, grounded in the judge's verdict: each failed criterion's text and the judge's
    reason for failing it."""
    if verdict is None or verdict.score is None:
        return "Review your answer against every requirement of the task and give an improved, complete answer."
    criteria = {c["id"]: c for c in (task or {}).get("criteria", [])}
    failed = [r for r in verdict.results if r.passed is False]
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

    @classmethod
    def from_args(cls, args):
        """train.py's judge flags; the judge's verdict cache lives in the run folder."""
        opts = dict(judge=args.judge, workers=args.judge_workers, hybrid=args.judge_mode == "hybrid",
                    cache_path=os.path.join(args.runs_dir, args.run_name, "judge_cache.sqlite"))
        if args.data:
            opts["data"] = args.data
        if args.judge_model:
            opts["model"] = args.judge_model
        if args.judge_max_turns:
            opts["max_turns"] = args.judge_max_turns
        return cls(**opts)

    def __init__(self, data: str | None = None, judge: str = "local", workers: int = 8, cache_path=None,
                 coef: float = 0.5, chunk: int = 1, judge_obj=None, **judge_opts):
        self.tasks = load_tasks(data or DATA)
        self.coef = coef
        self.chunk = chunk        # tasks per sampler call: small chunks let judging overlap generation
        self.judge = judge_obj or make_judge(judge, workers=workers, cache_path=cache_path,
                                                **judge_opts)
        self.judge_spec, self.ungraded_steps = judge, 0
        for line in judge_notes(self.tasks, judge):
            print(line, flush=True)

    def examples(self, split: str) -> list[dict]:
        # The seed trains and reports on the same 44 tasks (its numbers are "on the trained distribution").
        return list(self.tasks)

    def messages(self, ex: dict) -> list[dict]:
        return [{"role": "user", "content": ex["prompt"]}]

    def score(self, ex: dict, completion: str):
        v = self.judge.grade(ex, completion)
        return None if v is None else v.score

    # -- the two-turn rollout ----------------------------------------------------------------------------------

    def rollout(self, generate, tok, examples, seeds, args):
        """`generate(prompts, seeds, n)` -> per prompt a list of n samples. Returns the Seqs of both turns, each
        rollout's turn 0 followed by its turn 1.

        The pipeline, chunk by chunk: generate turn 0 of chunk k and hand its answers to the judge's pool; while
        the judge works, generate turn 0 of chunk k+1; then write chunk k's critiques from its verdicts and
        generate its revisions, whose verdicts are collected only at the very end."""
        chunks = [range(i, min(i + self.chunk, len(examples))) for i in range(0, len(examples), self.chunk)]
        judging, revised = deque(), []
        judge_stats = self.judge.stats()

        def answer(idx):     # turn 0 of one chunk; verdicts arrive later
            prompts = [tok.chat(self.messages(examples[i]), enable_thinking=args.enable_thinking) for i in idx]
            groups = generate(prompts, [seeds[i] for i in idx], args.group_size)
            return [(i, p, s, self.judge.submit(examples[i], s.text)) for i, p, g in zip(idx, prompts, groups)
                    for s in g]

        def revise(items):   # turn 1 of one chunk, once its turn-0 verdicts are in
            firsts = [(i, p, s, fut.result()) for i, p, s, fut in items]
            convs = [self.messages(examples[i]) + [{"role": "assistant", "content": s.text},
                                                   {"role": "user", "content": critique(v, examples[i])}]
                     for i, _, s, v in firsts]
            prompts = [tok.chat(c, enable_thinking=args.enable_thinking) for c in convs]
            # each revision is its own prompt; its seed differs from every turn-0 seed of the step
            revs = generate(prompts, [derive_seed(seeds[i], "revision", k) for k, (i, *_) in enumerate(firsts)], 1)
            return [(first, p1, r[0], self.judge.submit(examples[first[0]], r[0].text))
                    for first, p1, r in zip(firsts, prompts, revs)]

        for idx in chunks:
            judging.append(answer(idx))
            while len(judging) > 1 or (judging and all(f.done() for *_, f in judging[0])):
                revised += revise(judging.popleft())
        while judging:
            revised += revise(judging.popleft())
        out = []
        for (i, prompt0, s0, v0), prompt1, s1, fut in revised:
            out += self._seqs(examples[i], prompt0, s0, v0, prompt1, s1, fut.result())
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
                            f"steps in a row ({failed} of {calls} in the last); check the judge command or server; "
                            "the last checkpoint is intact")

    def _seqs(self, ex, prompt0, s0, v0, prompt1, s1, v1):
        score0 = None if v0 is None else v0.score
        score1 = None if v1 is None else v1.score
        shaped = grpo.recovery_rewards(score0, score1, coef=self.coef)
        mk = lambda turn, prompt, s, score, reward, v: Seq(
            ex["id"], turn, prompt, list(s.completion_ids), list(s.logprobs), s.finish_reason, s.text, score,
            reward, info={"judge": None if v is None else v.reason,
                          "failed": [] if v is None else [r.id for r in v.results if r.passed is False]})
        return [mk(0, prompt0, s0, score0, score0, v0), mk(1, prompt1, s1, score1, shaped, v1)]

    # -- metrics as the seed reports them ------------------------------------------------------------------------

    def step_metrics(self, seqs) -> dict:
        return recovery_metrics(seqs)


def recovery_metrics(seqs) -> dict:
    """Per rollout (turn 0, turn 1) pairs, in the order the rollout emits them (turn 0 then its turn 1)."""
    t0 = [s for s in seqs if s.turn == 0]
    t1 = [s for s in seqs if s.turn == 1]
    pairs = [(a.score, b.score) for a, b in zip(t0, t1) if a.score is not None and b.score is not None]
    bad = [(a, b) for a, b in pairs if a < BAD]
    good = [(a, b) for a, b in pairs if a >= BAD]
    return {
        "turn0_score": mean([a for a, _ in pairs]),
        "final_score": mean([b for _, b in pairs]),
        "recovery": mean([b - a for a, b in bad]),
        "bad_to_good": mean([float(b >= BAD) for _, b in bad]),
        "good_to_bad": mean([float(b < BAD) for _, b in good]),
        "bad_start_share": len(bad) / len(pairs) if pairs else None,
    }
