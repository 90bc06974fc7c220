"""The multi-turn rollout every task with more than one policy turn shares: an episode is a conversation, and after
each policy turn its environment answers (a critique, a tool's result) or ends the episode with a score.

    turn 0     the G episodes of a prompt share it: one sampler call draws their G first turns (prefilled once)
    env        env.step(text, last) -> Reply (or a Future of one): messages to append, or done with a score
    turn t>0   each live episode's conversation so far is its prompt: one sample each, every live episode of a
               chunk in one sampler call; the environment's messages are prompt, never trained
    end        a Reply with done, or the turn cap (task.max_turns; `last` tells the environment to end now)
    failure    env.step raising (or its Future failing) ends that episode alone, scored 0, the exception in
               info["env_error"] and printed once; the rollout and the step go on

What a task hands this module (duck-typed, as everything in minigrpo/tasks):

    env(ex, family) -> Env          one episode's environment: messages() (the first prompt's chat messages),
                                    step(text, last) -> Reply | Future[Reply], close() (always called); family:
                                    the tokenizer's template family, which says how tool calls are written
                                    (minigrpo.toolcalls.parse_tool_calls)
    max_turns: int                  the turn cap (the two-turn tasks: 2)
    tools: list | None              JSON schemas of the tools, rendered in the system turn (None: no tools)
    turn_rewards(replies) -> list   per policy turn, (raw score, reward); default `trajectory_rewards`
    per_turn_advantage: bool        True: each turn is its own group across the G episodes (the two-turn tasks'
                                    shaped turn rewards); False: the episode is one unit, all its turns share its
                                    advantage (a trajectory reward; train.py assign_advantages)
    chunk: int | None               examples per sampler call (None: all at once)
    workers: int | None             run env.step on this many threads (an agent's commands run in sandboxes that
                                    wait on processes, so the episodes' commands of a turn run side by side); its
                                    step then returns a Reply, never a Future

The loop, chunk by chunk: sample turn 0 of chunk k and hand every answer to its environment; while those replies are
pending (a judge working in its pool), sample turn 0 of chunk k+1; then take chunk k's replies and sample its next
turn, and so on. A chunk whose episodes are at their last turn is not waited for: its replies are collected at the
very end. With environments that answer at once this is plain turn by turn, per chunk.
"""
import sys
import traceback
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field

from minigrpo.common import derive_seed
from minigrpo.tasks.base import Seq


@dataclass
class Reply:
    """An environment's answer to one policy turn."""
    messages: list = field(default_factory=list)   # appended after the policy's turn: the next turn's prompt
    done: bool = False
    score: float | None = None      # the turn's raw score (the two-turn tasks score every turn; an agent's
    #                                 environment scores its last); None: not scored, or scoring failed
    info: dict = field(default_factory=dict)        # logged with the turn's sample (judge reasons, tool errors)


def failed(e) -> Reply:
    """The Reply that ends an episode whose environment raised `e` (printed with its traceback, on stderr)."""
    why = f"{type(e).__name__}: {str(e)[:200]}"
    print(f"warning: an episode's environment failed ({why}); the episode scores 0\n"
          + "".join(traceback.format_exception(e)), file=sys.stderr, end="")
    return Reply(done=True, score=0.0, info={"env_error": why, "ended": "env error"})


def answered(reply) -> Future:
    """A Reply (or anything) as a finished Future: what `step` amounts to for an environment that answers at once."""
    fut = Future()
    fut.set_result(reply)
    return fut


def then(fut: Future, fn) -> Future:
    """A Future of fn(fut's result), set as soon as fut finishes (in the thread that finishes it)."""
    out = Future()

    def done(f):
        try:
            out.set_result(fn(f.result()))
        except BaseException as e:      # the loop raises it where it waits, as f.result() would
            out.set_exception(e)
    fut.add_done_callback(done)
    return out


def trajectory_rewards(replies) -> list:
    """Every turn is paid the episode's final score: (score, reward) per policy turn."""
    final = replies[-1].score
    return [(final, final)] * len(replies)


def turn_seed(seed, turn, k):
    """The seed of turn `turn` >= 1 of the k-th of the G episodes of the example whose seed is `seed`: a function of
    the example and the episode only, so how many examples share a sampler call (the chunk, the rank's share) never
    changes what is sampled. Every one differs from each turn-0 seed of the step."""
    return derive_seed(seed, "revision", k) if turn == 1 else derive_seed(seed, "turn", turn, k)


class Episode:
    """One conversation: its environment, the messages so far, and per policy turn [prompt ids, sample, reply]."""

    def __init__(self, index, env, seed, k, pool=None):
        self.index, self.env, self.seed, self.k, self.pool = index, env, seed, k, pool   # k: among its example's G
        self.conversation = env.messages()
        self.turns, self.pending = [], None     # pending: the Future of the last turn's reply

    def took(self, prompt, sample, last):
        """The policy's turn: its environment is handed the text (the reply may come later)."""
        self.turns.append([prompt, sample, None])
        self.conversation = self.conversation + [{"role": "assistant", "content": sample.text}]
        if self.pool is not None:
            self.pending = self.pool.submit(self.env.step, sample.text, last)
            return
        try:
            reply = self.env.step(sample.text, last)
        except Exception as e:      # noqa: BLE001 - the episode's failure, taken where settle() takes replies
            reply = Future()
            reply.set_exception(e)
        self.pending = reply if isinstance(reply, Future) else answered(reply)

    def settle(self) -> bool:
        """Take the pending reply; True if the episode goes on. An exception of the environment's ends this
        episode alone: it scores 0, the reason in info["env_error"], the traceback printed once."""
        try:
            reply = self.pending.result()
        except Exception as e:      # noqa: BLE001 - one episode's bytes must not end the step
            reply = failed(e)
        self.turns[-1][2], self.pending = reply, None
        if reply.done:
            return False
        self.conversation = self.conversation + list(reply.messages)
        return True


class Chunk:
    """The episodes of a chunk of examples, and the last turn sampled for them."""

    def __init__(self, episodes):
        self.episodes, self.live, self.turn = episodes, episodes, 0

    def ready(self) -> bool:
        return all(ep.pending.done() for ep in self.live)


def rollout(task, generate, tok, examples, seeds, args) -> list:
    """`generate(prompts, seeds, n)` -> per prompt a list of n samples. Returns the Seqs of every policy turn of every
    episode, each episode's turns in order, episodes example-major (the G of an example together)."""
    size, G = getattr(task, "chunk", None) or len(examples), args.group_size
    cap, tools = task.max_turns, getattr(task, "tools", None)
    waiting, finished, opened = deque(), [], []
    pool = ThreadPoolExecutor(task.workers) if getattr(task, "workers", None) else None

    def chat(conversation):
        return tok.chat(conversation, enable_thinking=args.enable_thinking, tools=tools)

    def place(chunk):           # a chunk at its last turn, or with no episode left, is done sampling
        (finished if not chunk.live or chunk.turn + 1 == cap else waiting).append(chunk)

    def start(idx):             # turn 0 of one chunk: the G episodes of an example share its prompt
        eps = []
        for i in idx:
            for k in range(G):
                eps.append(Episode(i, task.env(examples[i], tok.family), seeds[i], k, pool))
                opened.append(eps[-1])
        prompts = [chat(eps[n * G].conversation) for n in range(len(idx))]
        groups = generate(prompts, [seeds[i] for i in idx], G)
        for ep, prompt, sample in zip(eps, [p for p in prompts for _ in range(G)], [s for g in groups for s in g]):
            ep.took(prompt, sample, cap == 1)
        place(Chunk(eps))

    def advance(chunk):         # the chunk's replies are in: sample its live episodes' next turn together
        chunk.live, chunk.turn = [ep for ep in chunk.live if ep.settle()], chunk.turn + 1
        if chunk.live:
            prompts = [chat(ep.conversation) for ep in chunk.live]
            samples = generate(prompts, [turn_seed(ep.seed, chunk.turn, ep.k) for ep in chunk.live], 1)
            for ep, prompt, s in zip(chunk.live, prompts, samples):
                ep.took(prompt, s[0], chunk.turn + 1 == cap)
        place(chunk)

    try:
        for idx in [range(i, min(i + size, len(examples))) for i in range(0, len(examples), size)]:
            start(idx)
            while len(waiting) > 1 or (waiting and waiting[0].ready()):
                advance(waiting.popleft())
        while waiting:
            advance(waiting.popleft())
        return [seq for ep in sorted((ep for c in finished for ep in c.episodes), key=lambda e: (e.index, e.k))
                for seq in episode_seqs(task, ep, examples[ep.index]["id"])]
    finally:
        if pool is not None:
            pool.shutdown(wait=True)        # no step still running when the environments close
        for ep in opened:
            ep.env.close()


def episode_seqs(task, ep, example_id) -> list:
    """The Seqs of one finished episode: one per policy turn, with the task's (score, reward) for each."""
    if ep.pending is not None:
        ep.settle()
    rewards = getattr(task, "turn_rewards", trajectory_rewards)([r for _, _, r in ep.turns])
    unit = None if getattr(task, "per_turn_advantage", False) else (ep.seed, ep.k)
    return [Seq.of(sample, example_id, t, prompt, score, reward, info=dict(reply.info), episode=unit)
            for t, ((prompt, sample, reply), (score, reward)) in enumerate(zip(ep.turns, rewards))]
