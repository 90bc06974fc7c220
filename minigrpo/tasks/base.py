"""What tasks share: Seq, one trained completion of a rollout, and SingleTurnTask, the rollout, details and
metrics of every single-turn task (minigrpo/tasks/__init__.py lists the members a task has)."""
from dataclasses import dataclass, field


@dataclass
class Seq:
    """One trained completion of a rollout: its prompt (everything before it, never trained), its own tokens,
    the sampler's log-probs of them, the raw task score, and the (possibly shaped) reward its advantage uses.
    The sampler's part (tokens, log-probs, finish reason, text) is copied from its sampler.Sample by `of`; the rest
    is the task's, which the sampler never sees."""
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

    @classmethod
    def of(cls, sample, example_id, turn, prompt_ids, score, reward, info=None):
        """The Seq of a sampler.Sample of example `example_id`'s prompt at `turn`."""
        return cls(example_id, turn, prompt_ids, list(sample.completion_ids), list(sample.logprobs),
                   sample.finish_reason, sample.text, score, reward, info=info or {})


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
                seqs.append(Seq.of(s, ex["id"], 0, prompt, score, score, info=self.details(ex, s.text)))
        return seqs
