"""One exercise of the terminal task set: what the agent is told and given, how its work is judged, and two
transcripts that pin the judgement down (one that must pass, one plausible mistake that must fail)."""

import hashlib
import os
import shutil
from dataclasses import dataclass
from typing import Callable

# the sandbox's PATH (minigrpo/judge/sandbox): an exercise whose commands are not there is left out on this machine
SANDBOX_PATH = "/usr/local/bin:/usr/bin:/bin"


@dataclass(frozen=True)
class Transcript:
    """An agent's work: the shell commands it runs, one tool call each, then its final answer."""
    commands: tuple
    answer: str = "Done."


@dataclass(frozen=True)
class Exercise:
    id: str
    category: str
    instruction: str
    files: dict                         # relative path -> str or bytes, copied into the work folder
    verify: Callable                    # verify(Folder, answer) -> score in [0, 1]
    reference: Transcript               # passes: scores 1.0
    wrong: Transcript                   # a plausible mistake: scores below 0.5
    executable: tuple = ()              # paths among `files` given mode 0755
    setup: str = ""                     # bash run in the episode before the agent's first turn (a git history)
    needs: tuple = ()                   # commands the sandbox must have

    def missing(self, path=SANDBOX_PATH):
        """The commands this exercise needs that the sandbox's PATH lacks here."""
        return [c for c in self.needs if shutil.which(c, path=path) is None]


def check_exercises(exercises):
    """ValueError naming the exercise and the field, for a malformed catalogue (caught by the tests, and at
    import time by the task: a typo must not ship an exercise that cannot be scored)."""
    seen = set()
    for ex in exercises:
        where = f"terminal exercise {ex.id!r}"
        if not ex.id or ex.id in seen:
            raise ValueError(f"{where}: ids must be unique and non-empty")
        seen.add(ex.id)
        if not ex.instruction.strip() or not callable(ex.verify):
            raise ValueError(f"{where}: needs an instruction and a verify(folder, answer) function")
        for name in list(ex.files) + list(ex.executable):
            rel = os.path.normpath(name)
            if rel.startswith(("/", "..")) or rel in (".", ""):
                raise ValueError(f"{where}: file name {name!r} must be relative and stay in the work folder")
        if set(ex.executable) - set(ex.files):
            raise ValueError(f"{where}: executable names files it does not have: {set(ex.executable) - set(ex.files)}")
        for label, t in (("reference", ex.reference), ("wrong", ex.wrong)):
            if not isinstance(t, Transcript) or not all(isinstance(c, str) and c.strip() for c in t.commands):
                raise ValueError(f"{where}: {label} must be a Transcript of non-empty command strings")
    return exercises


def held_out(exercise_id):
    """Whether an exercise is in the held-out quarter ("val" and "eval"): by a hash of its id, so that adding an
    exercise never moves another one between the splits."""
    return hashlib.sha256(exercise_id.encode()).digest()[0] % 4 == 0
