"""The multi-turn loop's side of the sampler's cache reuse (minigrpo/tasks/episodes.py): keep=True on every call but
the last turn's, each episode handing its last kept state back as `reuse` for its next turn, the keep_tokens budget
dropping the largest states first, and the prefill counts in each episode's Seq and in the step's metrics; with a
sampler that knows nothing of reuse, the same episodes and counts of a full prefill every turn."""
from argparse import Namespace

from minigrpo.run.steplog import step_metrics
from minigrpo.sampler import Sample
from minigrpo.tasks import episodes
from minigrpo.tokenizer import Tokenizer
from scripted_policy import scripted
from test_episodes import PLANS, CounterTask

TOK = Tokenizer.from_pretrained("tiny")
ARGS = Namespace(group_size=3, enable_thinking=False)


class Kept:
    """What a sampler keeps of a prompt: the ids its state holds."""

    def __init__(self, ids):
        self.ids, self.tokens = list(ids), len(ids)


def reusing(plans, log):
    """The scripted policy of test_episodes behind a sampler that implements reuse: a kept state whose ids are a
    proper prefix of the prompt saves their prefill. `log` gets (prompt, reuse, keep) per row."""
    policy = scripted(TOK, plans)

    def generate(prompts, seeds, n, reuse=None, keep=False):
        groups = policy(prompts, seeds, n)
        for p, r, group in zip(prompts, reuse or [None] * len(prompts), groups):
            log.append((p, r, keep))
            reused = r.tokens if r is not None and r.tokens < len(p) and p[:r.tokens] == r.ids else 0
            kept = Kept(p) if keep else None
            for j, s in enumerate(group):
                s.kept, s.prefilled, s.reused = kept, (len(p) - reused) * (j == 0), reused * (j == 0)
        return groups
    return generate


def test_each_turn_reuses_the_state_its_episode_kept_and_the_last_keeps_none():
    log = []
    seqs = episodes.rollout(CounterTask(), reusing(PLANS, log), TOK, [{"id": "a"}], [0], ARGS)
    assert [keep for _, _, keep in log] == [True, True, True, True, False]     # turn 0, 1 (two live), 2, 3: the cap
    prompt0 = log[0][0]
    assert log[0][1] is None and log[1][1].ids == log[2][1].ids == prompt0      # turn 1 reuses turn 0's shared state
    assert log[1][1] is log[2][1]
    assert log[3][1].ids == log[2][0] and log[4][1].ids == log[3][0]            # then each its own last prompt
    lengths = [len(p) for p, _, _ in log]
    # episode 0 prefilled the shared first prompt; every later turn only what came after its kept state
    assert [s.info["prefill_tokens"] for s in seqs] == [lengths[0], lengths[1] - lengths[0], lengths[4] - lengths[0]]
    assert [s.info["reused_tokens"] for s in seqs] == [0, lengths[0], lengths[0] + lengths[2] + lengths[3]]
    assert [(s.info["fresh_prefills"], s.info["kept_dropped"]) for s in seqs] == [(0, 0)] * 3
    m = step_metrics(1, 0, seqs, {}, [], 0.0, 0.0, 1.0, 1.0, {})
    assert (m["prefill_tokens"], m["reused_tokens"], m["fresh_prefills"], m["kept_dropped"]) == \
        (sum(s.info["prefill_tokens"] for s in seqs), sum(s.info["reused_tokens"] for s in seqs), 0, 0)
    assert m["prefill_tokens"] + m["reused_tokens"] == sum(lengths[:1] + lengths[1:])  # every prompt, once


def test_the_budget_drops_the_largest_kept_states_and_they_prefill_afresh():
    log = []
    plans = [["call", "call", "answer"], ["call", "call", "call", "answer"], ["call", "answer"]]
    unlimited = episodes.rollout(CounterTask(), reusing(plans, []), TOK, [{"id": "a"}], [0], ARGS)
    task = CounterTask()
    task.keep_tokens = 1        # below any state: every state is dropped as soon as it is kept
    seqs = episodes.rollout(task, reusing(plans, log), TOK, [{"id": "a"}], [0], ARGS)
    assert all(r is None for _, r, _ in log)                                     # nothing was left to reuse
    assert [s.completion_ids for s in seqs] == [s.completion_ids for s in unlimited]   # the same episodes
    assert [s.info["reused_tokens"] for s in seqs] == [0, 0, 0]
    assert [s.info["fresh_prefills"] for s in seqs] == [2, 3, 1]                # every turn after the first
    assert [s.info["kept_dropped"] for s in seqs] == [2, 3, 1]                  # turn 0's shared state: once each


def test_the_budget_keeps_the_smaller_states():
    class Live:
        def __init__(self, tokens):
            self.kept, self.dropped = Kept([0] * tokens), False
    a, b, c = Live(30), Live(10), Live(20)
    shared = Live(0)
    shared.kept = c.kept                            # a state two episodes share counts once
    episodes.trim_kept([a, b, c, shared], 30)
    assert (a.kept, a.dropped) == (None, True)      # the largest goes first, then 30 tokens are left: enough
    assert b.kept is not None and c.kept is shared.kept is not None and not (b.dropped or c.dropped)
    episodes.trim_kept([a, b, c, shared], 15)
    assert c.kept is None and shared.kept is None and c.dropped and shared.dropped and b.kept is not None


def test_a_sampler_that_knows_nothing_of_reuse_prefills_every_prompt_whole():
    log = []
    seqs = episodes.rollout(CounterTask(), scripted(TOK, PLANS, calls=log), TOK, [{"id": "a"}], [0], ARGS)
    lengths = [len(TOK.encode(p)) for _, _, prompts in log for p in prompts]
    assert [s.info["prefill_tokens"] for s in seqs] == [lengths[0], lengths[1], lengths[2] + lengths[3] + lengths[4]]
    assert [(s.info["reused_tokens"], s.info["fresh_prefills"]) for s in seqs] == [(0, 0), (0, 1), (0, 3)]


def test_only_each_episodes_last_kept_state_stays_alive():
    """A turn keeps its Sample for the episode's Seq; the state the Sample carried must not stay alive with it, or
    every turn's prefill state would be held until the rollout ends (the memory plan counts one per episode)."""
    import gc
    import weakref
    made, alive = [], []

    def tracking(generate):
        def call(prompts, seeds, n, reuse=None, keep=False):
            gc.collect()
            alive.append(sum(r() is not None for r in made))    # states alive when the next turn is sampled
            groups = generate(prompts, seeds, n, reuse, keep)
            made.extend(weakref.ref(g[0].kept) for g in groups if g[0].kept is not None)
            return groups
        return call
    episodes.rollout(CounterTask(), tracking(reusing(PLANS, [])), TOK, [{"id": "a"}], [0], ARGS)
    # turn 0's one shared state, then at most one per live episode (3 episodes, fewer as they end)
    assert alive[0] == 0 and max(alive[1:]) <= ARGS.group_size
    gc.collect()
    assert sum(r() is not None for r in made) == 0                  # none outlives the rollout
