"""The revise task: soyuz's answer -> critique -> revision on a problem a from-scratch tiny model learns on a CPU.

    turn 0   user "sort gdbe"       the model answers, e.g. "bdge"       -> grader: one criterion per position
    critique user "fix 3:e 4:g"     each wrong position and the letter that belongs there ("all correct" if none)
    turn 1   the model revises, with the whole conversation as its prompt -> grader

The prompt lists 4-6 distinct letters of a-j in a shuffled order; the answer is them sorted. The grader's verdict
has one criterion per position of the sorted list (passed when the answer has the right letter there), and one
more, failed, when the answer is longer than the list; score = passed / criteria, the share of correct positions.
Grading is immediate and exact, so the critique can carry everything a revision needs: an answer that applies it
scores 1 whatever it revises, which is what makes the climb hack (train.py --no-turn0-guard) pay.

It runs through soyuz's code: the rollout, the rewards, the guard and the metrics are minigrpo/tasks/twoturn.py's
(the grader hands back finished Futures where soyuz's judge pool hands back pending ones). The experiment that
pretrains a tiny model on the format and compares three shaping arms: minigrpo/experiments/revise_pipeline.py.
"""
import itertools

import numpy as np

from minigrpo.seeds import derive_seed
from minigrpo.judge import CriterionResult, Verdict
from minigrpo.tasks import episodes, twoturn

ALPHABET = "abcdefghij"
LENGTHS = (4, 5, 6)
HELD_OUT = {"eval": 64, "val": 32}  # letter sets held out of train, per split; the rest (576 of 672) train


def letter_sets() -> list[str]:
    """Every set of LENGTHS distinct letters of ALPHABET, as a sorted string (the answer): 210 + 252 + 210."""
    return ["".join(c) for n in LENGTHS for c in itertools.combinations(ALPHABET, n)]


def split_sets(seed: int = 0) -> dict:
    """{split: sorted letter sets}: a seeded partition, so no eval answer was ever a train answer."""
    sets = letter_sets()
    order = np.random.default_rng(derive_seed(seed, "revise split")).permutation(len(sets))
    out, start = {}, 0
    for split, n in HELD_OUT.items():
        out[split] = [sets[i] for i in order[start:start + n]]
        start += n
    out["train"] = [sets[i] for i in order[start:]]
    return out


def shuffled(letters: str, *key) -> str:
    """The letters in a seeded order: the prompt's."""
    perm = np.random.default_rng(derive_seed(*key)).permutation(len(letters))
    return "".join(letters[i] for i in perm)


def grade(ex: dict, answer: str) -> Verdict:
    """One criterion per position of the sorted list, plus a failed "length" criterion for an answer too long."""
    target, got = ex["target"], answer.strip()
    results = [CriterionResult(str(k + 1), got[k:k + 1] == c, f"position {k + 1} is {c}")
               for k, c in enumerate(target)]
    if len(got) > len(target):
        results.append(CriterionResult("length", False, f"{len(target)} letters"))
    return Verdict(results, "sorted letters")


def critique(ex: dict, verdict) -> str:
    """The user's second message: each failed position with the letter that belongs there ("fix 3:e 4:g"), "keep
    N" when the answer is too long; "all correct" when nothing failed."""
    target = ex["target"]
    fixes = [f"{r.id}:{target[int(r.id) - 1]}" for r in verdict.results if r.passed is False and r.id != "length"]
    if any(r.id == "length" for r in verdict.results):
        fixes.append(f"keep {len(target)}")
    return "fix " + " ".join(fixes) if fixes else "all correct"


class RevisionTask:
    name = "revise"
    turns = 2
    stop_strings: list[str] = []
    chunk = None        # one sampler call per turn for the whole batch: grading is immediate
    overlaps_grading = True     # rollout takes meanwhile (twoturn.rollout), as soyuz's does

    @classmethod
    def from_args(cls, args):
        return cls(coef=args.recovery_coef, turn0_guard=args.turn0_guard)

    def __init__(self, coef: float = 0.5, turn0_guard: bool = True, seed: int = 0):
        self.coef, self.turn0_guard = coef, turn0_guard     # the shaping (twoturn.TwoTurn.turn_rewards)
        self.sets = split_sets(seed)                         # fixed by `seed` alone: every run sees one eval set

    def examples(self, split: str) -> list[dict]:
        if split not in self.sets:
            raise ValueError(f"revise task split {split!r}: expected train, val or eval")
        return [{"id": f"{split}-{s}", "letters": shuffled(s, "revise prompt", s), "target": s}
                for s in self.sets[split]]

    def messages(self, ex: dict) -> list[dict]:
        return [{"role": "user", "content": f"sort {ex['letters']}"}]

    def score(self, ex: dict, completion: str) -> float:
        return grade(ex, completion).score

    # the two-turn rollout (twoturn.py), with a grader that answers at once
    def submit(self, ex: dict, answer: str):
        return episodes.answered(grade(ex, answer))

    def critique_for(self, ex: dict, verdict) -> str:
        return critique(ex, verdict)

    def rollout(self, generate, tok, examples, seeds, args, meanwhile=None):
        return twoturn.rollout(self, generate, tok, examples, seeds, args, meanwhile)

    def step_metrics(self, seqs) -> dict:
        return twoturn.recovery_metrics(seqs)
