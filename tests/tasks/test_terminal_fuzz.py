"""Random and hostile policy turns through the real terminal environment and the multi-turn loop: raw bytes, deep
JSON, control-token strings, floods of tags, huge outputs, commands no command line can carry, and folders a
verifier cannot take whole. Every rollout completes and every reward is in [0, 1]; no environment raises."""

import json
import random
from argparse import Namespace

from minigrpo.sampler import Sample
from minigrpo.tasks.terminal.task import TerminalTask
from minigrpo.tokenizer import Tokenizer

TOK = Tokenizer.from_pretrained("tiny")
EXERCISES = ["unique-in-order", "delete-empty-files", "make-scripts-executable", "git-undo-commit"]
GROUP = 4           # episodes per exercise: 16 episodes of up to 8 turns

SHELL = ["ls -la", "cat names.txt", "head -c 300000 /dev/urandom", "yes '<|im_end|><tool_call>' | head -c 200000",
         "mkdir -p $(printf 'd/%.0s' $(seq 40)) && echo deep", "ln -s / root; mkfifo pipe; truncate -s 70M sparse",
         "rm -rf tmpdata bin repo", "printf '\\x00\\xff\\xfe' > raw", "sleep 0.2; echo late", "exit 7"]


def _call(command):
    return "<tool_call>\n" + json.dumps({"name": "shell", "arguments": {"command": command}}) + "\n</tool_call>"


def hostile_turn(rng):
    kind = rng.randrange(10)
    if kind == 0:       # raw bytes, as a detokenizer hands them over, around a call
        raw = bytes(rng.randrange(256) for _ in range(rng.randrange(1, 400))).decode("utf-8", "replace")
        return raw + _call(rng.choice(SHELL)) + raw
    if kind == 1 and rng.random() < 0.2:       # (bare, it would be the final answer)
        return "[" * 5000
    if kind == 1:       # deep JSON, a huge integer
        return "<tool_call>" + rng.choice(["[" * 5000, "{" * 3000, '{"name": "shell", "arguments": {"n": '
                                           + "9" * 5000 + "}}"]) + "</tool_call>"
    if kind == 2:       # control-token strings around a call
        return "<|im_end|>\n<|im_start|>user\n</tool_response>" + _call("echo '<|endoftext|>'") + "<think>"
    if kind == 3:       # floods of tags
        return rng.choice(["</tool_call>", "<tool_call>", "<tool_call></tool_call>"]) * rng.randrange(1, 400)
    if kind == 4:       # commands no command line can carry
        return _call(rng.choice(["a\0b", "echo \ud800", "x" * 200000]))
    if kind == 5:       # the Qwen3.5 form in a Qwen3 conversation, with a NUL
        return "<tool_call>\n<function=shell>\n<parameter=command>\nls\0\n</parameter>\n</function>\n</tool_call>"
    if kind == 6:       # many calls at once
        return "".join(_call(rng.choice(SHELL)) for _ in range(rng.randrange(1, 12)))
    if kind == 7 and rng.random() < 0.5:       # an answer: the episode ends and is judged
        return rng.choice(["Done.", "", "<think>x</think>42", "It is " + "9" * 100000])
    return _call(rng.choice(SHELL))


def hostile_policy(salt):
    # each sample's turn drawn from its own seed: the same whatever the order
    def generate(prompts, seeds, n, reuse=None, keep=False):
        out = []
        for seed in seeds:
            group = []
            for j in range(n):
                text = hostile_turn(random.Random(f"{salt}/{seed}/{j}"))
                ids = TOK.encode(text[:2000]) + [TOK.im_end_id]
                group.append(Sample(0, ids, [-0.1] * len(ids), "eos", text))
            out.append(group)
        return out
    return generate


def test_hostile_turns_never_end_a_rollout_and_every_reward_is_in_0_1(capsys):
    task = TerminalTask()
    examples = [{"id": e} for e in EXERCISES if e in task.by_id]
    args = Namespace(group_size=GROUP, enable_thinking=False)
    seqs = task.rollout(hostile_policy(0), TOK, examples, list(range(len(examples))), args)
    assert len(seqs) == GROUP * len(examples)                                  # one Seq per episode
    assert all(s.reward is not None and 0.0 <= s.reward <= 1.0 for s in seqs)
    assert all("ended" in s.info and "env_error" not in s.info for s in seqs), [s.info for s in seqs]
    m = task.step_metrics(seqs)
    assert m["env_errors"] == 0.0 and "Traceback" not in capsys.readouterr().err
    assert m["turns"] > 4 and m["tool_calls"] > 4 and m["tool_errors"] > 4, m     # the turns did reach the shell
