"""bench/agentic.py's pieces that decide its numbers, without a training run: the scripted environment answers the
same bytes to every checkout and ends at turn 7 with scores that differ across a group, and each counting wrapper
counts a known call."""

import os
import sys
import zlib
from types import SimpleNamespace

import torch

from repo_root import ROOT

sys.path.insert(0, os.path.join(ROOT, "bench"))
import agentic  # noqa: E402

PINNED = (227, 989890317)       # len and crc32 of tool_output("train-0", 1, 3)


def play(env):
    """Every reply of one episode, the policy's text ignored: [(messages, done, score)]."""
    out = []
    for turn in range(agentic.TURNS):
        r = env.step(f"policy text {turn}", last=False)
        out.append((r.messages, r.done, r.score))
        if r.done:
            break
    return out


def test_the_environment_is_a_function_of_exercise_episode_and_turn():
    a, b = play(agentic.ScriptedEnv("train-0", 1, 4)), play(agentic.ScriptedEnv("train-0", 1, 4))
    assert a == b
    assert len(a) == agentic.TURNS and [done for _, done, _ in a] == [False] * 6 + [True]
    outputs = [m[0]["content"] for m, _, _ in a[:-1]]
    assert all(m[0]["role"] == "tool" for m, _, _ in a[:-1])
    assert all(200 <= len(o.encode()) <= 400 for o in outputs) and len(set(outputs)) == 6
    assert play(agentic.ScriptedEnv("train-1", 1, 4))[0] != a[0]           # another exercise, other bytes


def test_the_tool_output_bytes_are_pinned():
    """The same bytes in every process and checkout (no per-process hash): one reply pinned."""
    out = agentic.tool_output("train-0", 1, 3)
    assert (len(out), zlib.crc32(out.encode())) == PINNED


def test_the_last_turn_scores_differ_across_the_group_and_the_task_numbers_episodes_in_order():
    task = agentic.ScriptedTask(exercises=2, group=4)
    envs = [task.env({"id": "train-0"}) for _ in range(4)] + [task.env({"id": "train-1"})]
    assert [e.episode for e in envs] == [0, 1, 2, 3, 0]
    assert [play(e)[-1][2] for e in envs[:4]] == [0.0, 1 / 3, 2 / 3, 1.0]
    assert agentic.ScriptedEnv("train-0", 0, 4).step("x", last=True).done  # the loop's turn cap ends it at once


def test_the_sampler_counts_each_prompt_less_what_it_reused():
    def generate(prompts, seeds, n, **kw):
        assert kw == {"keep": True}                                        # passed through
        return [[SimpleNamespace(reused=r)] + [SimpleNamespace(reused=0)] * (n - 1) for r in (0, 3)]
    rec = agentic.new_record()
    agentic.counting_sampler(generate, rec)([[1] * 5, [2] * 7], [0, 1], 4, keep=True)
    assert (rec["sampler_calls"], rec["prompts"], rec["prompt_tokens"], rec["prefilled"]) == (1, 2, 12, 9)
    rec = agentic.new_record()       # a checkout whose Samples have no `reused` prefills every prompt token
    agentic.counting_sampler(lambda p, s, n: [[SimpleNamespace()]] * len(p), rec)([[1] * 5, [2] * 7], [0, 1], 1)
    assert rec["prefilled"] == 12


def test_trainer_calls_count_attention_ones_policy_and_reference_apart():
    calls, records = [], [agentic.new_record()]
    counted = agentic.counting_logprobs(lambda *a, **kw: calls.append((a, kw)), records)
    attn = torch.tensor([[0, 1, 1, 1], [1, 1, 1, 1]])
    with torch.no_grad():
        counted("model", torch.zeros(2, 4), attn, temperature=1.0)
    counted("model", torch.zeros(2, 4), attn[:1], first_col=2)
    assert (records[0]["reference_forwarded"], records[0]["policy_forwarded"]) == (7, 3)
    assert [kw for _, kw in calls] == [{"temperature": 1.0}, {"first_col": 2}]


def test_collate_counts_sequences_and_loss_mask_ones():
    records = [agentic.new_record()]
    mask = torch.tensor([[False, True, True], [True, True, True]])
    agentic.counting_collate(lambda seqs, pad, dev: SimpleNamespace(mask=mask), records)(["a", "b"], 0, "cpu")
    assert (records[0]["sequences"], records[0]["trained"]) == (2, 5)


def test_a_turn_continues_when_its_prompt_starts_with_the_last_prompt_and_sample():
    def seq(ep, prompt, completion):
        return SimpleNamespace(example_id="e", episode=ep, prompt_ids=prompt, completion_ids=completion)
    rec = agentic.new_record()
    agentic.count_continuing([seq(0, [1, 2], [3]), seq(0, [1, 2, 3, 9], [4]), seq(0, [1, 2, 3, 9, 5, 6], [6]),
                              seq(1, [1, 2], [7]), seq(1, [1, 2, 7, 0], [1])], rec)
    assert (rec["later_turns"], rec["continuing"]) == (3, 2)


def test_an_episode_trained_as_one_sequence_counts_its_later_turns_less_those_prefilled_afresh():
    one = SimpleNamespace(example_id="e", trained=[True], info={"turns": [{}, {}, {}, {}], "fresh_prefills": 1})
    rec = agentic.new_record()
    agentic.count_continuing([one, SimpleNamespace(example_id="f", trained=[True], info={"turns": [{}],
                                                                                         "fresh_prefills": 0})], rec)
    assert (rec["later_turns"], rec["continuing"]) == (3, 2)
