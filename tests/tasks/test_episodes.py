"""The multi-turn rollout loop (minigrpo/tasks/episodes.py) on a scripted environment: episodes that end at
different turns, the turn cap, environment messages in the context but never trained, one sampler call per turn,
every environment closed, and train.py's advantages with one Seq per episode."""
from argparse import Namespace

import pytest

import train
from minigrpo.tasks import episodes
from minigrpo.tasks.base import Seq
from minigrpo.tasks.episodes import Reply
from minigrpo.tokenizer import Tokenizer
from scripted_policy import scripted

TOK = Tokenizer.from_pretrained("tiny")


class Counter:
    """The scripted environment: the policy writes "call" to use the tool and anything else to answer; the episode's
    score is the number of tool calls made before the answer, over 2 (capped at 1)."""

    def __init__(self, task, ex):
        self.task, self.ex, self.calls, self.closed = task, ex, 0, False
        task.envs.append(self)

    def messages(self):
        return [{"role": "user", "content": f"count for {self.ex['id']}"}]

    def step(self, text, last):
        if text.startswith("call") and not last:
            self.calls += 1
            return Reply([{"role": "tool", "content": f"result {self.calls}"}], info={"tool_calls": 1})
        return Reply(done=True, score=min(self.calls / 2, 1.0), info={"ended_by": "cap" if last else "answer"})

    def close(self):
        self.closed = True


class CounterTask:
    max_turns, tools = 4, [{"type": "function", "function": {"name": "count", "parameters": {}}}]

    def __init__(self, chunk=None):
        self.chunk, self.envs = chunk, []

    def env(self, ex, family):
        assert family == TOK.family
        return Counter(self, ex)


def scripted_(plans, calls):
    return scripted(TOK, plans, calls=calls)


ARGS = Namespace(group_size=3, enable_thinking=False, adv_scale="group")
PLANS = [["answer"], ["call", "answer"], ["call", "call", "call", "call"]]     # ends at turns 1, 2 and the cap


def test_episodes_end_at_their_own_turn_and_the_cap_ends_the_rest():
    calls, task = [], CounterTask()
    seqs = episodes.rollout(task, scripted_(PLANS, calls), TOK, [{"id": "a"}, {"id": "b"}], [0, 1], ARGS)
    assert [len(s.info["turns"]) for s in seqs] == [1, 2, 4] * 2                 # one Seq per episode
    assert [s.example_id for s in seqs] == ["a"] * 3 + ["b"] * 3 and {s.turn for s in seqs} == {0}
    # one sampler call per turn: turn 0 draws the G of each prompt at once, then only live episodes
    assert [(rows, n) for rows, n, _ in calls] == [(2, 3), (4, 1), (2, 1), (2, 1)]
    # an episode is paid its final score; the capped one was told `last` and ended
    assert [s.reward for s in seqs[:3]] == [0.0, 0.5, 1.0]
    assert seqs[2].info["ended_by"] == "cap" and seqs[1].info["turns"][0]["tool_calls"] == 1
    assert [t["finish_reason"] for t in seqs[2].info["turns"]] == ["eos"] * 4
    assert all(env.closed for env in task.envs) and len(task.envs) == 6


def test_the_environment_speaks_in_the_context_never_in_the_trained_tokens():
    calls, task = [], CounterTask()
    seqs = episodes.rollout(task, scripted_(PLANS, calls), TOK, [{"id": "a"}], [0], ARGS)
    capped = seqs[2]
    prompt, after = TOK.decode(capped.prompt_ids), TOK.decode(capped.completion_ids)
    assert "count for a" in prompt and '"name": "count"' in prompt and "result" not in prompt   # tools: system turn
    assert after.count("result 1") == 1 and "result 3" in after and after.startswith("call<|im_end|>\n")
    assert capped.text == after
    own = [i for i, t in zip(capped.completion_ids, capped.trained) if t]
    assert own == (TOK.encode("call") + [TOK.im_end_id]) * 4                    # the policy's ids, as sampled
    assert [lp for lp, t in zip(capped.logprobs, capped.trained) if t] == [-0.1] * len(own)
    assert all(lp == 0.0 for lp, t in zip(capped.logprobs, capped.trained) if not t)
    turns = capped.info["turns"]
    assert [capped.completion_ids[t["start"]:t["start"] + t["tokens"]] for t in turns] == \
        [TOK.encode("call") + [TOK.im_end_id]] * 4
    # each later turn's prompt is the context so far: the earlier one's prompt, its ids, the reply's ids
    context = capped.prompt_ids + capped.completion_ids
    assert [prompts[-1] for _, _, prompts in calls[1:]] == \
        [TOK.decode(context[:len(capped.prompt_ids) + t["start"]]) for t in turns[1:]]


def test_every_environment_is_closed_when_a_step_fails():
    task = CounterTask()

    def broken(prompts, seeds, n, reuse=None, keep=False):
        if n == 1:
            raise RuntimeError("the sampler failed")
        return scripted_(PLANS, [])(prompts, seeds, n)
    with pytest.raises(RuntimeError):
        episodes.rollout(task, broken, TOK, [{"id": "a"}], [0], ARGS)
    assert task.envs and all(env.closed for env in task.envs)


def seeds_logged(generate, log):
    """`generate` that also logs every row's seed with the call's n (G for turn 0, 1 for a later turn)."""
    def logged(prompts, seeds, n, reuse=None, keep=False):
        log.extend((n, s) for s in seeds)
        return generate(prompts, seeds, n, reuse, keep)
    return logged


def test_chunks_sample_the_same_episodes_with_the_same_seeds():
    """However many examples share a sampler call (the task's chunk, a rank's share of the step), every row of every
    turn is drawn with the same seed: what is sampled never depends on the batching."""
    one, two, seeds_one, seeds_two = [], [], [], []
    examples = [{"id": "a"}, {"id": "b"}]
    whole = episodes.rollout(CounterTask(), seeds_logged(scripted_(PLANS, one), seeds_one), TOK, examples, [0, 1],
                             ARGS)
    chunked = episodes.rollout(CounterTask(chunk=1), seeds_logged(scripted_(PLANS, two), seeds_two), TOK, examples,
                               [0, 1], ARGS)
    assert [(s.example_id, s.turn, s.text, s.reward) for s in whole] == \
        [(s.example_id, s.turn, s.text, s.reward) for s in chunked]
    assert sorted(seeds_one) == sorted(seeds_two) and len(set(seeds_one)) == len(seeds_one)
    assert len(two) > len(one)                                     # per chunk: more, smaller sampler calls


def seq(example, turn, reward):
    return Seq(example, turn, [1], [2], [0.0], "eos", "x", reward, reward)


def test_an_episode_is_one_seq_of_its_group_however_many_turns_it_took():
    seqs = episodes.rollout(CounterTask(), scripted_(PLANS, []), TOK, [{"id": "a"}], [0], ARGS)
    train.assign_advantages(seqs, Namespace(adv_scale="group"))
    # three episodes of 1, 2 and 4 turns scored 0, 0.5 and 1: each counts once in the group's mean and std
    assert [s.advantage for s in seqs] == pytest.approx([-1.0, 0.0, 1.0], abs=1e-5)


def test_per_turn_units_are_unchanged():
    seqs = [seq("e", 0, 1.0), seq("e", 0, 0.0), seq("e", 1, 1.0), seq("e", 1, 1.0)]
    train.assign_advantages(seqs, Namespace(adv_scale="group"))
    assert seqs[0].advantage == pytest.approx(-seqs[1].advantage) and seqs[0].advantage > 0
    assert seqs[2].advantage == seqs[3].advantage == 0.0          # turn 1's group has no spread


class Fragile(Counter):
    """A Counter whose step raises at the policy's "boom", as an environment may on bytes it never expected."""

    def step(self, text, last):
        if text.startswith("boom"):
            raise RecursionError("deep inside the environment")
        return super().step(text, last)


class FragileTask(CounterTask):
    def __init__(self, workers=None):
        super().__init__()
        self.workers = workers

    def env(self, ex, family):
        return Fragile(self, ex)


@pytest.mark.parametrize("workers", [None, 2])
def test_an_environment_that_raises_ends_its_episode_alone(workers, capsys):
    task = FragileTask(workers)
    plans = [["call", "boom"], ["call", "answer"], ["boom"]]
    seqs = episodes.rollout(task, scripted_(plans, []), TOK, [{"id": "a"}], [0], ARGS)
    assert [(len(s.info["turns"]), s.reward) for s in seqs] == [(2, 0.0), (2, 0.5), (1, 0.0)]
    failed = [(s.info["env_error"], s.info["ended"]) for s in seqs if "env_error" in s.info]
    assert failed == [("RecursionError: deep inside the environment", "env error")] * 2
    err = capsys.readouterr().err
    assert err.count("Traceback") == 2 and err.count("RecursionError: deep inside the environment") == 4
    assert all(env.closed for env in task.envs)


def test_the_steps_lengths_and_truncation_are_per_policy_turn():
    from minigrpo.run.steplog import step_metrics
    seqs = episodes.rollout(CounterTask(), scripted_(PLANS, []), TOK, [{"id": "a"}], [0], ARGS)
    seqs[2].info["turns"][1]["finish_reason"] = "length"          # one of the capped episode's 4 turns cut
    m = step_metrics(1, 0, seqs, {}, [], 0.0, 0.0, 1.0, 1.0, {})
    lengths = [len("answer") + 1, len("call") + 1, len("answer") + 1] + [len("call") + 1] * 4    # 7 turns, eos each
    assert m["completion_len"] == sum(lengths) / 7 and m["truncated"] == 1 / 7
    assert m["reward_mean"] == 0.5                                # the mean of the 3 episodes' scores
