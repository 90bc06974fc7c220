"""Tasks: what the policy is asked, and how an answer is scored.

A task is any object with these members (duck-typed; there is no base class to inherit):

    name: str
    turns: int = 1                   # 2 for soyuz and revise: answer -> critique -> revision
    stop_strings: list[str] = []     # extra sampler stop strings, e.g. ["</answer>"]
    examples(split) -> list[dict]    # split: "train" | "val" | "eval"; every dict has a unique "id"
    messages(ex) -> list[dict]       # the chat messages of the prompt
    score(ex, completion) -> float | None   # raw reward; None = scoring failed (left out of its group)
    details(ex, completion) -> dict  # reward components, logged with the samples
    rollout(generate, tok, examples, seeds, args) -> list[Seq]      # the trained sequences of one step
    overlaps_grading: bool = False   # True: rollout also takes meanwhile=fn(seqs), run on the step's Seqs once their
                                     # tokens are final and before the last turn's grades are taken (episodes.py)
    step_metrics(seqs) -> dict       # extra per-step metrics ({} for most tasks)
    from_args(args) (classmethod)    # the task as train.py's flags configure it

Single-turn tasks take `rollout`, `details`, `step_metrics` and `from_args` from minigrpo/tasks/base.py's
SingleTurnTask (beside Seq, the record of one trained completion). A task with more than one policy turn rolls out
through minigrpo/tasks/episodes.py's loop (an environment per episode answers each turn or ends the episode); the
two-turn tasks (soyuz, revise: answer -> critique -> revision) are its two-turn case, with minigrpo/tasks/twoturn.py's
environment, rewards and metrics.
"""

from minigrpo.errors import UsageError, first_line

TASKS = ("synthetic", "soyuz", "gsm8k", "mdp", "revise", "terminal")


def task_class(name: str):
    """The class of the task called `name` (imported on use: soyuz brings the judge, gsm8k its data code)."""
    if name == "synthetic":
        from minigrpo.tasks.synthetic import RepeatCharTask
        return RepeatCharTask
    if name == "soyuz":
        from minigrpo.tasks.soyuz import SoyuzTask
        return SoyuzTask
    if name == "gsm8k":
        from minigrpo.tasks.gsm8k import GSM8KTask
        return GSM8KTask
    if name == "mdp":
        from minigrpo.tasks.mdp.task import MDPTask
        return MDPTask
    if name == "revise":
        from minigrpo.tasks.revise import RevisionTask
        return RevisionTask
    if name == "terminal":
        from minigrpo.tasks.terminal.task import TerminalTask
        return TerminalTask
    raise ValueError(f"--task {name!r} is not a task: choose one of {', '.join(TASKS)}")


def task_from_args(args):
    """The task train.py's flags ask for, built with the options the task itself reads from them, its train split
    read: data that cannot be used (a missing, empty or malformed --data file, the hub out of reach, a bad --judge)
    is a UsageError, one line naming the flag and the file."""
    what = "--data" if args.data else f"--task {args.task}"      # the messages below name the file
    try:
        task = task_class(args.task).from_args(args)
        n_train = len(task.examples("train"))
    except (OSError, ValueError, ImportError) as e:
        raise UsageError(f"{what}: {first_line(e)}") from None
    if not n_train:
        raise UsageError(f"{what}: no training examples (the train split is empty); give it more examples")
    return task
