"""The verifier MDP as a task: the prompt is a process state, the answer one probe letter A-H, the reward its
per-step oracle value (process reward). The environment, baselines and report live in minigrpo/tasks/mdp/world.py.

Examples are the informative states (some letters are worth more than others) along trajectories of the split's
records; `evaluate` plays whole games over the split's records at budgets 0..3, which is what the report shows.
Controls: `scramble=True` shuffles the split summaries across the letters in every prompt (the model must then
ignore them); `shuffle_rewards=True` permutes each state's letter values, so SFT targets, DPO pairs and GRPO
rewards no longer follow the verifier (evaluation still plays the true game).
"""
import re

import numpy as np

from minigrpo.tasks.base import SingleTurnTask
from minigrpo.tasks.mdp import world as mdp

_THINK = re.compile(r"^\s*<think>.*?</think>", re.S)
_LETTER = re.compile(r"^[\s\"'*(\[]*([A-H])(?![A-Za-z])")


def parse_letter(completion: str) -> str | None:
    """The answer's letter: the first thing after an optional <think> block, one of A-H standing alone
    ("C", "C.", "(C)", "**C**"); None if the answer starts any other way ("Because...", "c", "Probe C")."""
    m = _LETTER.match(_THINK.sub("", completion, count=1))
    return m.group(1) if m else None


_SPLIT_LINE = re.compile(r"^([A-H]) \[[0-9,]*\] ([0-9/]+)(?:\+([0-9]+))?$", re.M)
_HEADER = re.compile(r"^N=([0-9]+) left=([0-9]+)$", re.M)
_PROBED = re.compile(r" ([A-H])=")
PROMPT_STYLES = ("full", "compact")


def compact_text(text: str) -> str:
    """The same state for a small byte-level model (one token per byte): per letter the most informative number
    of its split, the largest group's share of the survivors in percent (two digits), then the letter:

        left=2 probed=C--                      probes left, letters already probed
        19 A                                   mdp.render's "A [2,7,9,9,7,5] 4/2/2/2+8" with N=21
        ...
        Probe?

    Why: a model trained from scratch in minutes learns to compare eight fixed-width two-digit numbers, not raw
    counts from 1 to 10^5 of varying width, and every extra byte of prompt costs it time. The largest group is
    what max-split's ranking mostly rests on: playing the smallest one (mdp.minimax_policy) solves within half a
    point of max-split on the eval records, so little is lost -- and minimax is what this prompt can teach.
    The number sits just before its letter, so one attention hop moves it onto the letter, and a second copies
    the best letter out. Fixed widths give every prompt the same length (no padding). Computed from
    mdp.render's text, so a scrambled prompt stays scrambled."""
    n, left = map(int, _HEADER.search(text).groups())
    seen = text.split("\n", 1)[0]
    probed = "".join(dict.fromkeys(_PROBED.findall(seen)))
    lines = [f"left={left} probed={probed[:mdp.MAX_BUDGET]:-<{mdp.MAX_BUDGET}}"]
    for letter, groups, _ in _SPLIT_LINE.findall(text):
        lines.append(f"{min(99, round(100 * int(groups.split('/')[0]) / n)):02d} {letter}")
    return "\n".join(lines + ["Probe?"])


def messages_for(text: str, style: str = "full") -> list[dict]:
    """The chat messages for a rendered state: training and evaluation prompts go through here alike. style
    "compact" rewrites the state with `compact_text` (the CPU quickstart's byte-level model reads that)."""
    if style not in PROMPT_STYLES:
        raise ValueError(f"mdp prompt style {style!r}: expected one of {', '.join(PROMPT_STYLES)}")
    return [{"role": "user", "content": compact_text(text) if style == "compact" else text}]


def relabel(ex: dict, perm) -> dict:
    """The same state with its probes renamed: probe k is shown as letter perm[k]. The letters are only names for
    eight randomly drawn probe lists, so this is a state of the same game, as likely as the original; training on
    renamed copies keeps a small model from tying a probe's worth to its letter or to one prompt (without them the
    tiny SFT memorises its train states: docs/mdp.md)."""
    name = {c: mdp.LETTERS[k] for c, k in zip(mdp.LETTERS, perm)}
    src = np.argsort(perm)                                      # letter j shows probe src[j]
    v = ex["view"]
    view = {**v, "splits": [v["splits"][k] for k in src], "probes": [v["probes"][k] for k in src],
            "seen": [[name[x] if isinstance(x, str) else x, y] for x, y in v["seen"]]}   # probed letters renamed
    return {**ex, "id": f"{ex['id']}~{''.join(name[c] for c in mdp.LETTERS)}", "view": view,
            "probed": "".join(name.get(c, c) for c in ex["probed"]), "values": [ex["values"][k] for k in src],
            "oracle": name[ex["oracle"]]}


class MDPTask(SingleTurnTask):
    name = "mdp"

    def __init__(self, train_per_cell: int = 60, val_per_cell: int = 4, eval_per_cell: int = 16,
                 states_per_record: int = 3, seed: int = 0, scramble: bool = False, shuffle_rewards: bool = False,
                 prompt: str = "full"):
        if prompt not in PROMPT_STYLES:
            raise ValueError(f"mdp task prompt={prompt!r}: expected one of {', '.join(PROMPT_STYLES)}")
        self.prompt = prompt
        self.per_cell = {"train": train_per_cell, "val": val_per_cell, "eval": eval_per_cell}
        self.states_per_record, self.seed = states_per_record, seed
        self.scramble, self.shuffle_rewards = scramble, shuffle_rewards
        self._records, self._examples = {}, {}

    def records(self, split: str) -> list[dict]:
        """The split's puzzles: per_cell records for every (regime, library size) cell."""
        if split not in self._records:
            if split not in self.per_cell:
                raise ValueError(f"mdp task split {split!r}: expected train, val or eval")
            self._records[split] = mdp.build_records(split, self.per_cell[split], self.seed)
        return self._records[split]

    def examples(self, split: str) -> list[dict]:
        if split not in self._examples:
            exs = mdp.build_states(self.records(split), self.states_per_record, seed=self.seed)
            if self.shuffle_rewards:
                for ex in exs:                    # the control: each state's values land on the wrong letters
                    perm = mdp.seeded_rng("shuffle", ex["id"]).permutation(mdp.N_PROBES)
                    ex["values"] = [ex["values"][k] for k in perm]
                    ex["oracle"] = mdp.LETTERS[int(np.argmax(ex["values"]))]
            self._examples[split] = exs
        return self._examples[split]

    def text(self, ex: dict) -> str:
        return mdp.render(ex["view"], ex["id"] if self.scramble else None)

    def messages(self, ex: dict) -> list[dict]:
        return messages_for(self.text(ex), self.prompt)

    def score(self, ex: dict, completion: str) -> float:
        letter = parse_letter(completion)
        return ex["values"][mdp.LETTERS.index(letter)] if letter else 0.0

    def details(self, ex: dict, completion: str) -> dict:
        letter = parse_letter(completion)
        value = self.score(ex, completion)
        return {"letter": letter or "", "valid": letter is not None, "oracle": ex["oracle"],
                "is_oracle": letter == ex["oracle"], "regret": max(ex["values"]) - value, "regime": ex["regime"]}

    def sft_target(self, ex: dict) -> str:
        """The oracle's letter: the SFT completion."""
        return ex["oracle"]

    def dpo_pairs(self, ex: dict) -> list[tuple[str, str]]:
        """(chosen, rejected) letters: the oracle's letter against every letter worth strictly less, worst first."""
        chosen = ex["oracle"]
        best = ex["values"][mdp.LETTERS.index(chosen)]
        worse = sorted((v, c) for c, v in zip(mdp.LETTERS, ex["values"]) if v < best - 1e-9)
        return [(chosen, c) for _, c in worse]

    def evaluate(self, policy_fn, split: str = "eval", budgets=(0, 1, 2, 3), batched: bool = False) -> dict:
        """Play the split's records with `policy_fn(text, state) -> letter` (or batched: (texts, states) -> letters);
        the texts are scrambled when the task is. Returns mdp.evaluate's per-budget, per-regime metrics."""
        return mdp.evaluate(policy_fn, self.records(split), budgets, scramble=self.scramble, batched=batched)

    def baselines(self, split: str = "eval", budgets=(0, 1, 2, 3)) -> dict:
        return mdp.baselines(self.records(split), budgets)
