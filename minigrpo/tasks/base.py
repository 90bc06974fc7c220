"""What tasks share: Seq, one trained completion of a rollout; SingleTurnTask, the rollout, details and metrics of
every single-turn task (minigrpo/tasks/__init__.py lists the members a task has); and the order train.py draws a
task's training examples in (DataState, next_examples)."""
from dataclasses import dataclass, field

import numpy as np

from minigrpo.seeds import derive_seed


# What a multi-turn rollout's Seq carries in its info about the sampler's work (minigrpo/tasks/episodes.py): tokens
# prefilled, tokens continued from a kept state, turns prefilled from their start, kept states dropped for the budget
CACHE_COUNTS = ("prefill_tokens", "reused_tokens", "fresh_prefills", "kept_dropped")


@dataclass
class Seq:
    """One trained completion of a rollout: its prompt (everything before it, never trained), its own tokens,
    the sampler's log-probs of them, the raw task score, and the (possibly shaped) reward its advantage uses.
    The sampler's part (tokens, log-probs, finish reason, text) is copied from its sampler.Sample by `of`; the rest
    is the task's, which the sampler never sees.

    A whole agentic episode is one Seq too (minigrpo/tasks/episodes.py): its completion is everything after the
    first prompt, the policy's sampled tokens and the environment's between them; `trained` marks the policy's
    (the only ones with log-probs and a loss), info["turns"] says where each policy turn lies, its turn is 0."""
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
    trained: list | None = None     # per completion token, True where the policy sampled it; None: all of them
    routes: object = None           # MoE: (prompt + completion tokens, M, k) the sampler's experts (sampler.Sample)

    @classmethod
    def of(cls, sample, example_id, turn, prompt_ids, score, reward, info=None):
        """The Seq of a sampler.Sample of example `example_id`'s prompt at `turn`."""
        return cls(example_id, turn, prompt_ids, list(sample.completion_ids), list(sample.logprobs),
                   sample.finish_reason, sample.text, score, reward, info=info or {}, routes=sample.routes)

    def policy_turns(self) -> list:
        """Where the policy's turns lie in completion_ids: [{"start", "tokens", "finish_reason", ...}], an
        episode's from info["turns"] (with each turn's environment info), a single turn's the whole completion."""
        return self.info.get("turns") or [{"start": 0, "tokens": len(self.completion_ids),
                                           "finish_reason": self.finish_reason}]

    def loss_mask(self, drop_truncated=False) -> list:
        """Per completion token, whether the loss trains it: the policy's tokens, less (drop_truncated, train.py
        --mask-truncated) those of every turn cut at max_new_tokens; an episode's other turns stay trained."""
        mask = [True] * len(self.completion_ids) if self.trained is None else list(self.trained)
        for turn in self.policy_turns() if drop_truncated else []:
            if turn["finish_reason"] == "length":
                mask[turn["start"]:turn["start"] + turn["tokens"]] = [False] * turn["tokens"]
        return mask


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


@dataclass
class DataState:
    """The data order: one seeded permutation of the train split per epoch; the position in it is checkpointed."""
    epoch: int = 0
    pos: int = 0


def next_examples(train, count, state: DataState, seed) -> list:
    if not train:
        raise ValueError("the train split is empty")     # the loop below would never end
    out = []
    while len(out) < count:
        order = np.random.default_rng(derive_seed(seed, "epoch", state.epoch)).permutation(len(train))
        take = order[state.pos: state.pos + count - len(out)]
        out += [train[i] for i in take]
        state.pos += len(take)
        if state.pos >= len(train):
            state.epoch, state.pos = state.epoch + 1, 0
    return out
