"""Tasks: what the policy is asked, and how an answer is scored.

A task is any object with these members (duck-typed; there is no base class to inherit):

    name: str
    turns: int = 1                   # 2 for soyuz: answer -> critique -> revision
    stop_strings: list[str] = []     # extra sampler stop strings, e.g. ["</answer>"]
    examples(split) -> list[dict]    # split: "train" | "val" | "eval"; every dict has a unique "id"
    messages(ex) -> list[dict]       # the chat messages of the prompt
    score(ex, completion) -> float | None   # raw reward; None = scoring failed (left out of its group)
    details(ex, completion) -> dict  # optional: reward components, logged with the samples

Tasks with more than one turn (soyuz) also provide `rollout(...)`; see minigrpo/tasks/soyuz.py.
"""

from dataclasses import dataclass, field

TASKS = ("synthetic", "soyuz", "gsm8k", "mdp")


def get_task(name: str, **opts):
    """Build the task called `name`; `opts` are task-specific (data path, judge, ...)."""
    if name == "synthetic":
        from minigrpo.tasks.synthetic import RepeatCharTask
        return RepeatCharTask(**opts)
    if name == "soyuz":
        from minigrpo.tasks.soyuz import SoyuzTask
        return SoyuzTask(**opts)
    if name == "gsm8k":
        from minigrpo.tasks.gsm8k import GSM8KTask
        return GSM8KTask(**opts)
    if name == "mdp":
        from minigrpo.tasks.mdp import MDPTask
        return MDPTask(**opts)
    raise ValueError(f"--task {name!r} is not a task: choose one of {', '.join(TASKS)}")


@dataclass
class Seq:
    """One trained completion of a rollout: its prompt (everything before it, never trained), its own tokens,
    the sampler's log-probs of them, the raw task score, and the (possibly shaped) reward its advantage uses."""
    example_id: str
    turn: int
    prompt_ids: list
    completion_ids: list
    sampler_logps: list
    finish: str                     # "eos" | "stop" | "length"
    text: str
    score: float | None             # raw task score: group filters and zero-spread counts look at this
    reward: float | None = None     # what the advantage is computed from (shaped for turn > 0)
    advantage: float = 0.0
    info: dict = field(default_factory=dict)
