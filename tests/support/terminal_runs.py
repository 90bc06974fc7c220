"""Helpers the terminal task set's tests share (tests/tasks/test_terminal*.py): the Reply the Env answers with, and
a transcript played through a TerminalEnv as the policy's turns.

The Env imports Reply from the multi-turn rollout loop's module, minigrpo/tasks/episodes.py. Where that module is
not in this checkout, a copy of its Reply (the loop's interface: messages, done, score, info) stands in for it
here, and only here."""

import importlib.util
import sys
import types
from dataclasses import dataclass, field

from minigrpo.toolcalls import calls_json, calls_xml

if importlib.util.find_spec("minigrpo.tasks.episodes") is None:
    @dataclass
    class Reply:
        messages: list
        done: bool = False
        score: float | None = None
        info: dict = field(default_factory=dict)

    _loop = types.ModuleType("minigrpo.tasks.episodes")
    _loop.Reply = Reply
    sys.modules["minigrpo.tasks.episodes"] = _loop

from minigrpo.tasks.terminal.task import TerminalTask  # noqa: E402  (after Reply's module is there)


def turn(*commands, family="qwen3", text=""):
    """A policy turn calling shell once per command, in the family's own call format."""
    calls = [{"name": "shell", "arguments": {"command": c}} for c in commands]
    if family == "qwen3_5":
        return text + calls_xml(calls, text)
    return text + calls_json(calls, bool(text), raw_strings=True)


def play(env, commands, answer, family="qwen3"):
    """Each command as one turn, then the answer as the last turn: (the final Reply, the tool replies)."""
    replies = []
    for c in commands:
        r = env.step(turn(c, family=family), last=False)
        assert not r.done and len(r.messages) == 1 and r.info["tool_calls"] == 1, (c, r)
        replies.append(r)
    final = env.step(answer, last=False)
    assert final.done, final
    return final, replies


def score_of(task, exercise_id, transcript, family="qwen3"):
    """The score a transcript (exercise.Transcript) earns on a fresh episode of the exercise."""
    env = task.env({"id": exercise_id}, family=family)
    try:
        final, _ = play(env, transcript.commands, transcript.answer, family)
    finally:
        env.close()
    return final.score, final.info


__all__ = ["TerminalTask", "turn", "play", "score_of"]
