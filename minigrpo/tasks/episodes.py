"""The multi-turn rollout every task with more than one policy turn shares: an episode is a conversation, and after
each policy turn its environment answers (a critique, a tool's result) or ends the episode with a score.

    turn 0     the G episodes of a prompt share it: one sampler call draws their G first turns (prefilled once)
    env        env.step(text, last) -> Reply (or a Future of one): messages to append, or done with a score
    turn t>0   each live episode's context so far is its prompt: one sample each, every live episode of a chunk in
               one sampler call; the environment's messages are prompt, never trained
    end        a Reply with done, or the turn cap (task.max_turns; `last` tells the environment to end now), or
               a context at the task's context_tokens (env.end(why) scores the episode as it stands)
    failure    env.step raising (or its Future failing) ends that episode alone, scored 0, the exception in
               info["env_error"] and printed once; the rollout and the step go on

Token in, token out: an episode's context is token ids, never text. Turn 0's prompt is rendered once from
env.messages(); then each policy turn's ids go in exactly as sampled, and each reply's messages are rendered once
(Tokenizer.continuation: the end of the assistant turn, the messages' turns, the next assistant header) and
appended. Nothing the policy wrote is decoded and encoded again, so text that spells a control token stays the
ordinary ids it was sampled as. The environment is handed each turn's decoded text (sample.text).

What comes out (the Seqs train.py trains):
    per_turn_advantage False    one Seq per episode (a trajectory reward): prompt = turn 0's prompt, completion =
                                everything after it, Seq.trained True on the policy's ids only, the episode's score
                                as its reward; info["turns"] says where each policy turn lies and how it ended
    per_turn_advantage True     one Seq per policy turn (the two-turn tasks' shaped rewards, each turn its own group):
                                its prompt the context before it, its completion the turn's ids

What a task hands this module (duck-typed, as everything in minigrpo/tasks):

    env(ex, family) -> Env          one episode's environment: messages() (the first prompt's chat messages),
                                    step(text, last) -> Reply | Future[Reply], close() (always called); family:
                                    the tokenizer's template family, which says how tool calls are written
                                    (minigrpo.toolcalls.parse_tool_calls)
    max_turns: int                  the turn cap (the two-turn tasks: 2)
    tools: list | None              JSON schemas of the tools, rendered in the system turn (None: no tools)
    per_turn_advantage: bool        (default False) True: each turn its own Seq and group across the G episodes,
                                    paid by turn_rewards(replies) -> per turn (raw score, reward)
    chunk: int | None               examples per sampler call (None: all at once)
    workers: int | None             run env.step on this many threads (an agent's commands run in sandboxes that
                                    wait on processes, so the episodes' commands of a turn run side by side); its
                                    step then returns a Reply, never a Future
    keep_tokens: int | None         the most tokens of kept sampler states the live episodes may hold between
                                    turns (None: no limit); past it the largest are dropped and prefilled afresh
    reply_tokens: int | None        the most tokens one reply may add, as the tokenizer renders it (None: no cap);
                                    a longer reply's message texts are cut, in order, to fit (`fitted`), and the
                                    tokens cut are in its info["reply_cut_tokens"]
    context_tokens: int | None      the longest context a turn may be sampled from, the memory plan's (None: no
                                    cap): a reply that would take an episode past it is not appended, and the
                                    episode ends there, scored as it stands by env.end(why) -> Reply, so no
                                    sequence is longer than context_tokens + the turn's new tokens

The sampler callback is generate(prompts, seeds, n, reuse=None, keep=False) -> per prompt a list of n samples. With
keep=True a sample carries `kept`, the model's state after its prompt (.ids, .tokens; shared by a prompt's n
samples); an episode hands its last one back as `reuse` for its next turn, whose prompt starts with those ids, so
the sampler prefills only the new tokens. Samples say `prefilled` and `reused` (tokens, on a prompt's first sample);
a sampler that says nothing prefilled the whole prompt. keep is off on a call whose episodes are all at their last
turn. The counts go into each Seq's info: prefill_tokens, reused_tokens, fresh_prefills (turns after the first
prefilled from their start) and kept_dropped (kept states dropped for keep_tokens).

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

from minigrpo.seeds import derive_seed
from minigrpo.tasks.base import CACHE_COUNTS, Seq


@dataclass
class Reply:
    """An environment's answer to one policy turn."""
    messages: list = field(default_factory=list)   # appended after the policy's turn: the next turn's prompt
    done: bool = False
    score: float | None = None      # the turn's raw score (the two-turn tasks score every turn; an agent's
    #                                 environment scores its last); None: not scored, or scoring failed
    info: dict = field(default_factory=dict)        # logged with the turn's sample (judge reasons, tool errors)


CUT_NOTE = "\n[cut: the reply passed its {} tokens]"


def fitted(messages, render, budget):
    """(ids, tokens cut): render(messages) if it holds at most `budget` ids, else the rendering of the messages with
    their texts cut, in order, to the longest prefix (in characters over all of them) whose rendering fits, each cut
    text ending in CUT_NOTE. Counted by rendering, so the tokenizer's own count, template and note included."""
    ids = render(messages)
    if budget is None or len(ids) <= budget:
        return ids, 0
    texts = [m["content"] if isinstance(m.get("content"), str) else None for m in messages]

    def cut(k):                 # the first k characters of the texts, in order
        out = []
        for m, text in zip(messages, texts):
            if text is not None:
                head, k = text[:max(k, 0)], k - len(text)
                m = {**m, "content": head if len(head) == len(text) else head + CUT_NOTE.format(budget)}
            out.append(m)
        return render(out)

    lo, hi, best = 0, sum(len(t) for t in texts if t is not None) - 1, None
    while lo <= hi:             # the longest cut that fits (every answer taken is a rendering that was counted)
        mid = (lo + hi) // 2
        got = cut(mid)
        if len(got) <= budget:
            best, lo = got, mid + 1
        else:
            hi = mid - 1
    if best is None:
        raise ValueError(f"a reply of {len(messages)} messages does not fit reply_tokens={budget} even with its "
                         "texts cut away: raise the task's reply_tokens")
    return best, len(ids) - len(best)


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


def turn_seed(seed, turn, k):
    """The seed of turn `turn` >= 1 of the k-th of the G episodes of the example whose seed is `seed`: a function of
    the example and the episode only, so how many examples share a sampler call (the chunk, the rank's share) never
    changes what is sampled. Every one differs from each turn-0 seed of the step."""
    return derive_seed(seed, "revision", k) if turn == 1 else derive_seed(seed, "turn", turn, k)



@dataclass
class Turn:
    """One policy turn of an episode: where its ids start in the context, the sample, the reply, the cache counts."""
    start: int
    sample: object
    reply: Reply | None = None
    cache: dict = field(default_factory=dict)


class Episode:
    """One episode: its environment, its context (token ids: the first prompt, then each turn's sampled ids and the
    environment's reply rendered once), and its turns."""

    def __init__(self, index, env, seed, k, pool=None, limit=None):
        self.index, self.env, self.seed, self.k, self.pool = index, env, seed, k, pool   # k: among its example's G
        self.limit = limit                          # the task's context_tokens
        self.context, self.prompt_len = [], 0       # set by begin()
        self.trained, self.logprobs = [], []        # per context id after the first prompt
        self.turns, self.pending = [], None         # pending: the Future of the last turn's reply
        self.kept, self.dropped = None, False       # the sampler's state after the last prompt; dropped for the budget

    def begin(self, prompt):
        self.context, self.prompt_len = list(prompt), len(prompt)

    def took(self, sample, last):
        """The policy's turn: its ids join the context as sampled; its environment is handed the text (the reply may
        come later). The prompt's prefill counts ride on its first sample (0 on its siblings)."""
        cache = {"prefill_tokens": sample.prefilled, "reused_tokens": sample.reused,
                 "fresh_prefills": int(bool(self.turns) and not sample.reused),
                 "kept_dropped": int(self.dropped)}
        self.turns.append(Turn(len(self.context), sample, cache=cache))
        self.extend(sample.completion_ids, True, sample.logprobs)
        self.kept, self.dropped = sample.kept, False
        if self.kept is not None:    # the turn keeps its Sample: the state must live only here, freed when replaced
            sample.kept = None
        if self.pool is not None:
            self.pending = self.pool.submit(self.env.step, sample.text, last)
            return
        try:
            reply = self.env.step(sample.text, last)
        except Exception as e:      # noqa: BLE001 - the episode's failure, taken where settle() takes replies
            reply = Future()
            reply.set_exception(e)
        self.pending = reply if isinstance(reply, Future) else answered(reply)

    def extend(self, ids, trained, logprobs=None):
        # new lists, never in place: the context handed to the sampler as a prompt (maybe kept by it) stays as it was
        self.context = self.context + list(ids)
        self.trained = self.trained + [trained] * len(ids)
        self.logprobs = self.logprobs + (list(logprobs) if logprobs is not None else [0.0] * len(ids))

    def settle(self, follow=None) -> bool:
        """Take the pending reply; True if the episode goes on, its reply's messages then appended as the ids
        follow(messages, sample) -> (ids, tokens cut) renders. A reply that would take the context past the
        task's context_tokens ends the episode instead (ended). An exception of the environment's ends this
        episode alone: it scores 0, the reason in info["env_error"], the traceback printed once."""
        try:
            reply = self.pending.result()
        except Exception as e:      # noqa: BLE001 - one episode's bytes must not end the step
            reply = failed(e)
        self.turns[-1].reply, self.pending = reply, None
        if not reply.done and follow is not None:
            ids, cut = follow(reply.messages, self.turns[-1].sample)
            if cut:
                reply.info["reply_cut_tokens"] = cut
            if self.limit is None or len(self.context) + len(ids) <= self.limit:
                self.extend(ids, False)
                return True
            self.turns[-1].reply = ended(self.env, reply, f"context past the plan's {self.limit} tokens")
        self.kept = None            # nothing more to sample: its state is freed
        return False


def ended(env, reply, why) -> Reply:
    """The Reply of an episode ended by the loop (`why`): env.end(why) scores it as it stands; the turn's own
    reply info (its tool calls) is kept under the ending's."""
    try:
        end = env.end(why)
    except Exception as e:          # noqa: BLE001
        end = failed(e)
    return Reply(messages=[], done=True, score=end.score, info={**reply.info, **end.info})


class Chunk:
    """The episodes of a chunk of examples, and the last turn sampled for them."""

    def __init__(self, episodes):
        self.episodes, self.live, self.turn = episodes, episodes, 0

    def ready(self) -> bool:
        return all(ep.pending.done() for ep in self.live)


def trim_kept(episodes, budget):
    """Drop kept sampler states, largest first, until the episodes hold at most `budget` tokens of them (a state
    shared by a prompt's G episodes counts once); an episode whose state is dropped prefills its next turn afresh."""
    held = {}
    for ep in episodes:
        if ep.kept is not None:
            held.setdefault(id(ep.kept), (ep.kept, []))[1].append(ep)
    total = sum(kept.tokens for kept, _ in held.values())
    for kept, eps in sorted(held.values(), key=lambda h: -h[0].tokens):
        if total <= budget:
            return
        total -= kept.tokens
        for ep in eps:
            ep.kept, ep.dropped = None, True


def rollout(task, generate, tok, examples, seeds, args, meanwhile=None) -> list:
    """`generate(prompts, seeds, n, reuse=None, keep=False)` -> per prompt a list of n samples. Returns the Seqs of
    every episode (module docstring), episodes example-major (the G of an example together), an episode's turns in
    order. meanwhile(seqs), if given, runs once the last sampler call is done and before the last turn's replies are
    taken: the same Seq objects with every token final but no score, reward or reply info yet (train.py computes
    the step's fixed log-probs there while a judge still grades the last turn)."""
    size, G = getattr(task, "chunk", None) or len(examples), args.group_size
    cap, tools, budget = task.max_turns, getattr(task, "tools", None), getattr(task, "keep_tokens", None)
    reply_tokens, limit = getattr(task, "reply_tokens", None), getattr(task, "context_tokens", None)
    waiting, finished, opened = deque(), [], []
    pool = ThreadPoolExecutor(task.workers) if getattr(task, "workers", None) else None

    def follow(messages, sample):       # a reply's messages as the ids after the sampled turn, within reply_tokens
        closed = list(sample.completion_ids[-1:]) == [tok.im_end_id]
        return fitted(messages, lambda m: tok.continuation(m, closed, enable_thinking=args.enable_thinking,
                                                           tools=tools), reply_tokens)

    def sampled(eps, prompts, seeds, n, last):     # one sampler call; each episode takes its sample
        groups = generate(prompts, seeds, n, reuse=[ep.kept for ep in eps[::n]], keep=not last)
        for ep, sample in zip(eps, [s for g in groups for s in g]):
            ep.took(sample, last)
        if budget is not None:
            trim_kept(opened, budget)

    def place(chunk):           # a chunk at its last turn, or with no episode left, is done sampling
        (finished if not chunk.live or chunk.turn + 1 == cap else waiting).append(chunk)

    def start(idx):             # turn 0 of one chunk: the G episodes of an example share its prompt
        eps = []
        for i in idx:
            for k in range(G):
                eps.append(Episode(i, task.env(examples[i], tok.family), seeds[i], k, pool, limit))
                opened.append(eps[-1])
            prompt = tok.chat(eps[-1].env.messages(), enable_thinking=args.enable_thinking, tools=tools)
            for ep in eps[-G:]:
                ep.begin(prompt)
        sampled(eps, [ep.context for ep in eps[::G]], [seeds[i] for i in idx], G, cap == 1)
        place(Chunk(eps))

    def advance(chunk):         # the chunk's replies are in: sample its live episodes' next turn together
        chunk.live, chunk.turn = [ep for ep in chunk.live if ep.settle(follow)], chunk.turn + 1
        if chunk.live:
            sampled(chunk.live, [ep.context for ep in chunk.live],
                    [turn_seed(ep.seed, chunk.turn, ep.k) for ep in chunk.live], 1, chunk.turn + 1 == cap)
        place(chunk)

    try:
        for idx in [range(i, min(i + size, len(examples))) for i in range(0, len(examples), size)]:
            start(idx)
            while len(waiting) > 1 or (waiting and waiting[0].ready()):
                advance(waiting.popleft())
        while waiting:
            advance(waiting.popleft())
        done = sorted((ep for c in finished for ep in c.episodes), key=lambda e: (e.index, e.k))
        seqs = [episode_seqs(task, ep, examples[ep.index]["id"], tok) for ep in done]
        if meanwhile is not None:
            meanwhile([s for part in seqs for s in part])
        for ep, part in zip(done, seqs):
            graded(task, ep, part)
        return [s for part in seqs for s in part]
    finally:
        if pool is not None:
            pool.shutdown(wait=True)        # no step still running when the environments close
        for ep in opened:
            ep.env.close()


def episode_seqs(task, ep, example_id, tok) -> list:
    """The Seqs of one episode whose turns are all sampled, before its last reply is taken (graded fills in their
    scores, rewards and info): the whole episode as one (a trajectory reward), or with per_turn_advantage one per
    policy turn. Their tokens are final: the last reply never adds to the context. A whole episode's routes (MoE)
    are its last turn's, which cover everything up to its answer as its prefill and decode routed them (an earlier
    answer re-prefilled in a later turn may have routed otherwise when it was sampled; update.collate lets tokens
    past them route themselves)."""
    if not getattr(task, "per_turn_advantage", False):
        completion = ep.context[ep.prompt_len:]
        return [Seq(example_id, 0, ep.context[:ep.prompt_len], completion, ep.logprobs,
                    ep.turns[-1].sample.finish_reason, tok.decode(completion), None, None,
                    info={"turns": turn_spans(ep)}, trained=ep.trained, routes=ep.turns[-1].sample.routes)]
    return [Seq.of(t.sample, example_id, i, ep.context[:t.start], None, None, info=dict(t.cache))
            for i, t in enumerate(ep.turns)]


def turn_spans(ep, replies=False) -> list:
    """Where each policy turn lies in a whole episode's completion, its length and how it ended (with its reply's
    info once the replies are in)."""
    return [{**(t.reply.info if replies else {}), "start": t.start - ep.prompt_len,
             "tokens": len(t.sample.completion_ids), "finish_reason": t.sample.finish_reason} for t in ep.turns]


def graded(task, ep, seqs):
    """Take the episode's last reply (waiting for it) and fill in its Seqs' scores and rewards: with
    per_turn_advantage the task's (score, reward) per turn and each turn's reply info; else the final reply's
    score as the episode's reward, and info: the final reply's (how the episode ended), per policy turn in
    info["turns"] its span and its reply's info, and the episode's cache counts (summed over its turns)."""
    if ep.pending is not None:
        ep.settle()
    if getattr(task, "per_turn_advantage", False):
        rewards = task.turn_rewards([t.reply for t in ep.turns])
        for s, t, (score, reward) in zip(seqs, ep.turns, rewards):
            s.score, s.reward, s.info = score, reward, {**t.reply.info, **t.cache}
        return
    last, (s,) = ep.turns[-1], seqs
    cache = {key: sum(t.cache[key] for t in ep.turns) for key in CACHE_COUNTS}
    s.score = s.reward = last.reply.score
    s.info = {**last.reply.info, "turns": turn_spans(ep, replies=True), **cache}
