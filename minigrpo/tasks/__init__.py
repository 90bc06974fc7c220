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
    step_metrics(seqs) -> dict       # extra per-step metrics ({} for most tasks)
    from_args(args) (classmethod)    # the task as train.py's flags configure it

Single-turn tasks take `rollout`, `details`, `step_metrics` and `from_args` from SingleTurnTask; the two-turn tasks
(soyuz, revise: answer -> critique -> revision) share minigrpo/tasks/twoturn.py's rollout, rewards and metrics.
"""

from dataclasses import dataclass, field

from minigrpo.common import UsageError, first_line

TASKS = ("synthetic", "soyuz", "gsm8k", "mdp", "revise")


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
        from minigrpo.tasks.mdp import MDPTask
        return MDPTask
    if name == "revise":
        from minigrpo.tasks.revise import RevisionTask
        return RevisionTask
    raise ValueError(f"--task {name!r} is not a task: choose one of {', '.join(TASKS)}")


def get_task(name: str, **opts):
    """Build the task called `name`; `opts` are task-specific (data path, judge, ...)."""
    return task_class(name)(**opts)


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


@dataclass
class Seq:
    """One trained completion of a rollout: its prompt (everything before it, never trained), its own tokens,
    the sampler's log-probs of them, the raw task score, and the (possibly shaped) reward its advantage uses."""
    example_id: str
    turn: int
    prompt_ids: list
    completion_ids: list
    logprobs: list                  # the sampler's log-probs of completion_ids (sampler.Sample.logprobs)
    finish_reason: str              # "eos" | "stop" | "length" (sampler.Sample.finish_reason)
    text: str
    score: float | None             # raw task score: group filters and zero-spread counts look at this
    reward: float | None = None     # what the advantage is computed from (shaped for turn > 0)
    advantage: float = 0.0
    info: dict = field(default_factory=dict)


class SingleTurnTask:
    """What every single-turn task shares: one prompt, G sampled answers, each scored on its own."""
    turns = 1
    stop_strings: list[str] = []

    @classmethod
    def from_args(cls, args):
        return cls(**({"data": args.data} if args.data else {}))

    def details(self, ex: dict, completion: str) -> dict:
        return {}

    def step_metrics(self, seqs) -> dict:
        return {}

    def rollout(self, generate, tok, examples, seeds, args) -> list:
        """`generate(prompts, seeds, n)` -> per prompt a list of n samples. One Seq per sample, prompt-major."""
        prompts = [tok.chat(self.messages(ex), enable_thinking=args.enable_thinking) for ex in examples]
        groups = generate(prompts, seeds, args.group_size)
        seqs = []
        for ex, prompt, group in zip(examples, prompts, groups):
            for s in group:
                score = self.score(ex, s.text)
                seqs.append(Seq(ex["id"], 0, prompt, list(s.completion_ids), list(s.logprobs), s.finish_reason,
                                s.text, score, score, info=self.details(ex, s.text)))
        return seqs
