"""Helpers the terminal task set's tests share (tests/tasks/test_terminal*.py): a transcript played through a
TerminalEnv as the policy's turns."""

from minigrpo.tasks.terminal.task import TerminalTask  # noqa: F401  (the tests take it from here)
from minigrpo.toolcalls import calls_json, calls_xml


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
