"""The two-turn rollout every answer -> critique -> revision task shares (soyuz, revise): the two-turn case of the
multi-turn loop (minigrpo/tasks/episodes.py), with the grader and the critique as the environment.

For each example and each of its G samples:

    turn 0   the model answers the example's prompt                          -> grader -> verdict v0, score s0
    critique a user turn the task writes from v0 (which criteria failed, and why)
    turn 1   the model revises, with the whole conversation as its prompt    -> grader -> verdict v1, score s1

Rewards (`TwoTurn.turn_rewards`): turn 1 = s1 + coef·(s1 − s0) (grpo.recovery_rewards; the soyuz run's coef is
0.5, coef 0 = the final score alone). Turn 0 = s0, its own raw score: the guard. Without the guard
(turn0_guard=False) turn 0 is trained on turn 1's shaped reward, which pays 0.5·(1 − s0) more for a worse start
when the revision is right: the climb hack the guard exists to stop. Advantages are group-relative per (example,
turn) and zero spread is judged on raw scores (train.py assign_advantages); each turn's own tokens get its turn's
advantage; the critique and the earlier turn are prompt, never trained.

What a task hands this module (duck-typed, as everything in minigrpo/tasks):

    messages(ex) -> list[dict]          turn 0's chat messages
    submit(ex, answer) -> Future        the grader's verdict (judge.Verdict: .score, .results, .reason; or None
                                        when grading failed); soyuz's judge grades in a worker pool, revise grades
                                        at once and hands back a finished Future (episodes.answered)
    critique_for(ex, verdict) -> str    the user's second message
    coef: float, turn0_guard: bool      the shaping coefficient and the guard (train.py --recovery-coef,
                                        --no-turn0-guard)
    chunk: int | None                   examples per sampler call (None: all at once)

With a chunk below the whole batch the loop overlaps judging with generation: turn 0 of chunk k+1 is sampled while
chunk k's answers are graded (episodes.py). Without one (soyuz's default, revise's) it is one call for turn 0, then,
once its answers are graded, one for turn 1.
"""
from minigrpo import grpo
from minigrpo.metrics import mean
from minigrpo.tasks import episodes
from minigrpo.tasks.episodes import Reply

BAD = 0.5  # below this a turn-0 answer counts as bad (a harsh critique in soyuz; a "bad start" for recovery)


def rollout(task, generate, tok, examples, seeds, args, meanwhile=None) -> list:
    """`generate(prompts, seeds, n, reuse, keep)` -> per prompt n samples (episodes.py). The Seqs of both turns,
    each rollout's turn 0 followed by its turn 1, example-major; meanwhile(seqs) runs while the revisions are
    graded (episodes.rollout)."""
    return episodes.rollout(TwoTurn(task), generate, tok, examples, seeds, args, meanwhile)


class TwoTurn:
    """A two-turn task as the multi-turn loop sees it: two turns, each its own advantage group, the shaping."""
    max_turns, per_turn_advantage, tools = 2, True, None

    def __init__(self, task):
        self.task, self.chunk = task, getattr(task, "chunk", None)

    def env(self, ex, family=None):
        return Critique(self.task, ex)

    def turn_rewards(self, replies) -> list:
        """(score, reward) of turns 0 and 1: turn 1 is paid s1 + coef·(s1 − s0) (grpo.recovery_rewards); turn 0 its
        own raw score s0 (the guard), or without the guard the same shaped reward (the climb hack)."""
        score0, score1 = replies[0].score, replies[1].score
        shaped = grpo.recovery_rewards(score0, score1, coef=self.task.coef)
        return [(score0, score0 if self.task.turn0_guard else shaped), (score1, shaped)]


class Critique:
    """One episode's environment: the grader's verdict on each turn, and after turn 0 the critique written from it."""

    def __init__(self, task, ex):
        self.task, self.ex = task, ex

    def messages(self):
        return self.task.messages(self.ex)

    def step(self, text, last):
        return episodes.then(self.task.submit(self.ex, text), lambda verdict: self.reply(verdict, last))

    def reply(self, verdict, last) -> Reply:
        info = {"judge": None if verdict is None else verdict.reason,
                "failed": [] if verdict is None else [r.id for r in verdict.results if r.passed is False]}
        said = [] if last else [{"role": "user", "content": self.task.critique_for(self.ex, verdict)}]
        return Reply(said, done=last, score=None if verdict is None else verdict.score, info=info)

    def close(self):
        pass


def recovery_metrics(seqs) -> dict:
    """The soyuz run's metrics over (turn 0, turn 1) pairs, in the order the rollout emits them (turn 0, then its turn
    1): turn-0 and final score; over bad starts (s0 < BAD) the mean climb s1 − s0 (recovery) and the share revised
    to >= BAD; over good starts the share revised below BAD; the share of bad starts."""
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
