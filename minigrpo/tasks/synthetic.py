"""A synthetic task that a tiny random-init model learns by RL alone, on a CPU, in about a minute.

The prompt names a character; the reward is the share of the first `length` completion characters that equal
it. A random byte-level model almost never writes it (1 chance in ~260 per byte), so the reward starts near 0;
GRPO only has to raise the probability of one byte after the chat template's `assistant\\n`, which is the
smallest real credit-assignment problem there is. It proves the loop learns, not that the model reasons.

The train split holds each letter once, so a step of 4 tasks sees all four: the pushes every group gives to "its"
letter's unconditional probability cancel out, and what is left to learn is reading the prompt. None of the four
letters occurs anywhere else in the prompt ("Repeat the letter", the template's "user" and "assistant"), so the
policy has no letter to fall back to when it cannot yet tell two apart. The runs that led to this design are in
docs/experiments.md.
"""
from minigrpo.tasks.base import SingleTurnTask

CHARS = "bcdf"  # few enough that every letter is written often from the start; none is elsewhere in the prompt


class RepeatCharTask(SingleTurnTask):
    name = "synthetic"

    def __init__(self, length: int = 8, copies: int = 1):
        self.length = length      # how many completion characters are scored
        self.copies = copies      # examples per letter per split (they differ only in id)

    def examples(self, split: str) -> list[dict]:
        if split not in ("train", "val", "eval"):
            raise ValueError(f"split {split!r}: expected train, val or eval")
        return [{"id": f"{split}-{c}-{i}", "char": c} for i in range(self.copies) for c in CHARS]

    def messages(self, ex: dict) -> list[dict]:
        return [{"role": "user", "content": f"Repeat the letter {ex['char']}: " + ex["char"] * 8}]

    def score(self, ex: dict, completion: str) -> float:
        head = completion[: self.length]
        return sum(ch == ex["char"] for ch in head) / self.length

    def details(self, ex: dict, completion: str) -> dict:
        return {"char": ex["char"], "length": len(completion)}
