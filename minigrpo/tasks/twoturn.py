"""The two-turn rollout every answer -> critique -> revision task shares (soyuz, revise).

For each example and each of its G samples:

    turn 0   the model answers the example's prompt                          -> grader -> verdict v0, score s0
    critique a user turn the task writes from v0 (which criteria failed, and why)
    turn 1   the model revises, with the whole conversation as its prompt    -> grader -> verdict v1, score s1

Rewards (`turn_seqs`): turn 1 = s1 + coef·(s1 − s0) (grpo.recovery_rewards; the soyuz run's coef is 0.5, coef 0 = the
final score alone). Turn 0 = s0, its own raw score: the guard. Without the guard (turn0_guard=False) turn 0 is
trained on turn 1's shaped reward, which pays 0.5·(1 − s0) more for a worse start when the revision is right:
the climb hack the guard exists to stop. Advantages are group-relative per (example, turn) and zero spread is
judged on raw scores (train.py assign_advantages); each turn's own tokens get its turn's advantage; the critique and
the earlier turn are prompt, never trained.

What a task hands this module (duck-typed, as everything in minigrpo/tasks):

    messages(ex) -> list[dict]          turn 0's chat messages
    submit(ex, answer) -> Future        the grader's verdict (judge.Verdict: .score, .results, .reason; or None
                                        when grading failed); soyuz's judge grades in a worker pool, revise grades
                                        at once and hands back a finished Future (`graded`)
    critique_for(ex, verdict) -> str    the user's second message
    coef: float, turn0_guard: bool      the shaping coefficient and the guard (train.py --recovery-coef,
                                        --no-turn0-guard)
    chunk: int | None                   examples per sampler call (None: all at once)

The loop, chunk by chunk: generate turn 0 of chunk k and submit its answers; while the grader works, generate turn
0 of chunk k+1; then write chunk k's critiques from its verdicts and generate its revisions, whose verdicts are
collected only at the very end. With a grader that answers at once this is plain turn 0, then turn 1, per chunk.
"""
from collections import deque
from concurrent.futures import Future

from minigrpo import grpo
from minigrpo.common import derive_seed, mean
from minigrpo.tasks.base import Seq

BAD = 0.5  # below this a turn-0 answer counts as bad (a harsh critique in soyuz; a "bad start" for recovery)


def graded(verdict) -> Future:
    """A verdict as a finished Future: what `submit` returns for a grader that needs no pool."""
    fut = Future()
    fut.set_result(verdict)
    return fut


def rollout(task, generate, tok, examples, seeds, args) -> list:
    """`generate(prompts, seeds, n)` -> per prompt a list of n samples. Returns the Seqs of both turns, each
    rollout's turn 0 followed by its turn 1, example-major."""
    size = task.chunk or len(examples)
    chunks = [range(i, min(i + size, len(examples))) for i in range(0, len(examples), size)]
    judging, revised = deque(), []

    def answer(idx):     # turn 0 of one chunk; verdicts arrive later
        prompts = [tok.chat(task.messages(examples[i]), enable_thinking=args.enable_thinking) for i in idx]
        groups = generate(prompts, [seeds[i] for i in idx], args.group_size)
        return [(i, p, s, task.submit(examples[i], s.text)) for i, p, g in zip(idx, prompts, groups) for s in g]

    def revise(items):   # turn 1 of one chunk, once its turn-0 verdicts are in
        firsts = [(i, p, s, fut.result()) for i, p, s, fut in items]
        convs = [task.messages(examples[i]) + [{"role": "assistant", "content": s.text},
                                               {"role": "user", "content": task.critique_for(examples[i], v)}]
                 for i, _, s, v in firsts]
        prompts = [tok.chat(c, enable_thinking=args.enable_thinking) for c in convs]
        # each revision is its own prompt; its seed differs from every turn-0 seed of the step
        revs = generate(prompts, [derive_seed(seeds[i], "revision", k) for k, (i, *_) in enumerate(firsts)], 1)
        return [(first, p1, r[0], task.submit(examples[first[0]], r[0].text))
                for first, p1, r in zip(firsts, prompts, revs)]

    for idx in chunks:
        judging.append(answer(idx))
        while len(judging) > 1 or (judging and all(f.done() for *_, f in judging[0])):
            revised += revise(judging.popleft())
    while judging:
        revised += revise(judging.popleft())
    out = []
    for (i, prompt0, s0, v0), prompt1, s1, fut in revised:
        out += turn_seqs(examples[i]["id"], (prompt0, s0, v0), (prompt1, s1, fut.result()), task.coef,
                         task.turn0_guard)
    return out


def turn_seqs(example_id, first, second, coef, guard=True) -> list:
    """The two Seqs of one rollout; `first` and `second` are (prompt ids, sample, verdict) of turns 0 and 1."""
    score0, score1 = (_score(v) for _, _, v in (first, second))
    shaped = grpo.recovery_rewards(score0, score1, coef=coef)
    reward0 = score0 if guard else shaped      # the guard: turn 0 is paid its own raw score, never the climb
    return [_seq(example_id, 0, *first, score0, reward0), _seq(example_id, 1, *second, score1, shaped)]


def _score(verdict):
    return None if verdict is None else verdict.score


def _seq(example_id, turn, prompt, s, verdict, score, reward):
    info = {"judge": None if verdict is None else verdict.reason,
            "failed": [] if verdict is None else [r.id for r in verdict.results if r.passed is False]}
    return Seq.of(s, example_id, turn, prompt, score, reward, info=info)


def recovery_metrics(seqs) -> dict:
    """The soyuz run's metrics over (turn 0, turn 1) pairs, in the order the rollout emits them (turn 0, then its turn
    1): turn-0 and final score; over bad starts (s0 < BAD) the mean climb s1 − s0 (recovery) and the share revised
    to >= BAD; over good starts the share revised below BAD; the share of bad starts."""
    t0 = [s for s in seqs if s.turn == 0]
    t1 = [s for s in seqs if s.turn == 1]
    pairs = [(a.score, b.score) for a, b in zip(t0, t1) if a.score is not None and b.score is not None]
    bad = [(a, b) for a, b in pairs if a < BAD]
    good = [(a, b) for a, b in pairs if a >= BAD]
    return {
        "turn0_score": mean([a for a, _ in pairs]),
        "final_score": mean([b for _, b in pairs]),
        "recovery": mean([b - a for a, b in bad]),
        "bad_to_good": mean([float(b >= BAD) for _, b in bad]),
        "good_to_bad": mean([float(b < BAD) for _, b in good]),
        "bad_start_share": len(bad) / len(pairs) if pairs else None,
    }
