"""minigrpo.tasks.terminal: the catalogue, every exercise's two transcripts through the real sandbox (the reference
scores 1.0, the plausible mistake below 0.5), and the Env's side of the rollout loop's interface: tool calls run,
malformed calls answered and counted, the turn cap, the time budget, the final answer, close()."""

import os

import pytest

from terminal_runs import TerminalTask, score_of, turn

from minigrpo.judge.sandbox import Limits, isolation
from minigrpo.tasks.terminal.exercise import Exercise, Transcript, check_exercises, held_out
from minigrpo.tasks.terminal.task import MAX_CALLS, MAX_COMMAND_BYTES, NOTE_BYTES, OUTPUT_BYTES, SHELL_TOOL, \
    TURN_OUTPUT_BYTES, TerminalEnv, catalogue
from minigrpo.tasks.terminal.verify import VerifierUnavailable, lines_are
from minigrpo.tokenizer import Tokenizer

EXERCISES = catalogue()
TASK = TerminalTask()


def test_the_catalogue_covers_the_set_and_splits_it():
    assert 30 <= len(EXERCISES) <= 40
    assert {"files-and-text", "code", "sqlite", "csv", "checksums", "openssl", "git"} <= {e.category for e in EXERCISES}
    train, val, evals = (TASK.examples(s) for s in ("train", "val", "eval"))
    assert val == evals and train and evals
    assert sorted(x["id"] for x in train + evals) == sorted(e.id for e in TASK.exercises)
    assert all(held_out(x["id"]) for x in evals) and not any(held_out(x["id"]) for x in train)
    with pytest.raises(ValueError, match="split 'test'"):
        TASK.examples("test")


def test_a_malformed_catalogue_is_refused():
    e = EXERCISES[0]
    with pytest.raises(ValueError, match="unique"):
        check_exercises([e, e])
    with pytest.raises(ValueError, match="must be relative"):
        check_exercises([Exercise(**{**e.__dict__, "files": {"../up.txt": "x"}})])
    with pytest.raises(ValueError, match="executable names files"):
        check_exercises([Exercise(**{**e.__dict__, "executable": ("nope.sh",)})])
    with pytest.raises(ValueError, match="reference must be a Transcript"):
        check_exercises([Exercise(**{**e.__dict__, "reference": Transcript(("",))})])


def test_an_exercise_whose_commands_the_sandbox_lacks_is_left_out():
    e = EXERCISES[0]
    lacking = Exercise(**{**e.__dict__, "id": "needs-a-tool", "needs": ("no-such-command-here",)})
    task = TerminalTask(exercises=[e, lacking])
    assert [x.id for x in task.exercises] == [e.id]
    assert task.left_out == ["terminal: needs-a-tool left out: the sandbox has no no-such-command-here"]


@pytest.mark.parametrize("exercise", EXERCISES, ids=[e.id for e in EXERCISES])
def test_the_reference_passes_and_the_mistake_fails(exercise):
    if exercise.missing():
        pytest.skip(f"the sandbox here has no {', '.join(exercise.missing())}")
    score, info = score_of(TASK, exercise.id, exercise.reference)
    assert score == 1.0, info
    score, info = score_of(TASK, exercise.id, exercise.wrong)
    assert score is not None and score < 0.5, info


def env_of(exercise_id, task=TASK, family="qwen3"):
    return task.env({"id": exercise_id}, family=family)


def test_each_call_is_run_in_one_folder_and_answered_in_order():
    env = env_of("unique-in-order")
    try:
        r = env.step(turn("cat names.txt | head -2", "echo made > mine.txt; echo oops >&2; exit 3"), last=False)
        assert not r.done and [m["role"] for m in r.messages] == ["tool", "tool"]
        assert r.messages[0]["content"] == "mia\nliam\n[exit code 0]"
        assert r.messages[1]["content"] == "oops\n[exit code 3]"
        assert r.info == {"tool_calls": 2, "tool_errors": 0, "timeouts": 0, "cut_bytes": 0, "shown_bytes": 40}
        r = env.step(turn("cat mine.txt", text="Checking my file.\n"), last=False)
        assert r.messages[0]["content"] == "made\n[exit code 0]"
        folder = env.ep.folder
        r = env.step("I am done.", last=False)
        assert r.done and r.score == 0.0 and r.info["ended"] == "answer"      # unique.txt was never written
        with pytest.raises(RuntimeError, match="after the episode ended"):
            env.step("again", last=False)
    finally:
        env.close()
    assert not os.path.exists(folder)


def test_malformed_calls_are_answered_and_counted():
    env = env_of("unique-in-order")
    try:
        text = ('<tool_call>\n{"name": "shell", "arguments": {"command": "ls"</tool_call>\n'
                '<tool_call>\n{"name": "python", "arguments": {"code": "1"}}\n</tool_call>\n'
                '<tool_call>\n{"name": "shell", "arguments": {"cmd": "ls"}}\n</tool_call>\n'
                '<tool_call>\n{"name": "shell", "arguments": {"command": "touch x", "timeout": 5}}\n</tool_call>')
        r = env.step(text, last=False)
        assert not r.done and r.info["tool_errors"] == 4 and r.info["tool_calls"] == 0
        contents = [m["content"] for m in r.messages]     # the well-formed calls in order, then one note
        assert len(contents) == 3 and all(c.startswith("error: ") for c in contents)
        assert "takes one argument, command" in contents[0] and "['cmd']" in contents[0]
        assert "['command', 'timeout']" in contents[1]
        assert contents[2].startswith("error: 2 malformed calls; the first: tool call 1: not valid JSON")
        r = env.step(turn("ls"), last=False)                     # the episode goes on
        assert r.messages[0]["content"] == "names.txt\n[exit code 0]"
    finally:
        env.close()


def test_calls_past_the_cap_are_not_run():
    env = env_of("unique-in-order")
    try:
        r = env.step(turn(*[f"echo {i} >> n.txt" for i in range(MAX_CALLS + 2)]), last=False)
        assert r.info["tool_calls"] == MAX_CALLS and r.info["tool_errors"] == 2 and len(r.messages) == MAX_CALLS + 1
        assert r.messages[-1]["content"].startswith(f"error: 2 calls not run: a turn runs at most {MAX_CALLS}")
        assert env.step(turn("wc -l < n.txt"), last=False).messages[0]["content"].split()[0] == str(MAX_CALLS)
    finally:
        env.close()


def shown(reply):
    return sum(len(m["content"].encode()) for m in reply.messages)


def test_a_turn_shows_at_most_its_output_budget():
    env = env_of("unique-in-order")
    try:
        loud = f"head -c {OUTPUT_BYTES - 100} /dev/zero | tr '\\0' x"
        full = TURN_OUTPUT_BYTES // (OUTPUT_BYTES - 100)           # shown in full, then 1 cut to what is left
        r = env.step(turn(*[loud] * (full + 2), "touch after.txt"), last=False)     # the rest: not run
        assert r.info["shown_bytes"] == shown(r) <= TURN_OUTPUT_BYTES + 100 + NOTE_BYTES and r.info["cut_bytes"] > 0
        assert r.info["tool_calls"] == full + 1 and r.info["tool_errors"] == 2, r.info
        assert "2 calls not run" in r.messages[-1]["content"]
        assert env.step(turn("ls"), last=False).messages[0]["content"].count("after.txt") == 0
    finally:
        env.close()


def test_the_last_turn_ends_the_episode_without_running_its_calls():
    env = env_of("unique-in-order")
    try:
        r = env.step(turn("awk '!seen[$0]++' names.txt > unique.txt", text="Writing it now.\n"), last=True)
        assert r.done and r.score == 0.0 and r.info["ended"] == "turn cap" and r.info["tool_calls"] == 0
    finally:
        env.close()


def test_the_time_budget_ends_the_episode():
    task = TerminalTask(limits=Limits(timeout=0.6, memory_mb=256, nproc=32), budget_s=1.0)
    env = env_of("unique-in-order", task)
    try:
        r = env.step(turn("sleep 5"), last=False)
        assert not r.done and r.info["timeouts"] == 1 and "time limit" in r.messages[0]["content"]
        r = env.step(turn("sleep 5", "awk '!seen[$0]++' names.txt > unique.txt"), last=False)
        assert r.done and r.info["ended"] == "time budget spent" and r.score == 0.0     # the write never ran
    finally:
        env.close()


def test_the_qwen3_5_call_format_drives_the_episode():
    e = TASK.by_id["csv-filter-adults"]
    score, _ = score_of(TASK, e.id, e.reference, family="qwen3_5")
    assert score == 1.0
    env = env_of(e.id, family="qwen3_5")
    try:            # the JSON format is not this family's: nothing runs, and the policy is told why
        r = env.step(turn("ls", family="qwen3"), last=False)
        assert r.info["tool_errors"] == 1 and "<function=NAME>" in r.messages[0]["content"]
    finally:
        env.close()


def test_the_prompt_offers_the_shell_tool_and_the_working_folder():
    env = env_of("largest-file")
    try:
        system, user = env.messages()
        assert system["role"] == "system"
        assert user == {"role": "user", "content": TASK.by_id["largest-file"].instruction}
        assert "`shell`" in system["content"] and "without any tool call" in system["content"]
        assert ("/sandbox" in system["content"]) == isolation()[0].startswith("bwrap")
        prompt = Tokenizer("qwen3").render([system, user], tools=TASK.tools)
        assert '"name": "shell"' in prompt and prompt.count("<|im_start|>") == 3
    finally:
        env.close()
    assert TASK.tools == [SHELL_TOOL] and TASK.max_turns >= 4


def test_bad_arguments_are_one_line_errors():
    with pytest.raises(ValueError, match="no exercise"):
        TASK.env({"id": "no-such-exercise"})
    with pytest.raises(ValueError, match="family 'llama'"):
        TerminalEnv(EXERCISES[0], family="llama")


def custom(verify=lambda f, a: 1.0, **kw):
    base = dict(id="custom", category="test", instruction="Do it.", files={"a.txt": "x\n"}, verify=verify,
                reference=Transcript(("true",)), wrong=Transcript(("true",)))
    return TerminalTask(exercises=[Exercise(**{**base, **kw})])


def test_a_verifier_that_fails_gives_no_reward_and_a_missing_sandbox_no_score():
    def crash(f, a):
        raise KeyError("boom")

    def down(f, a):
        raise VerifierUnavailable("no sandbox")

    for verify, score, error in ((crash, 0.0, "KeyError: 'boom'"), (down, None, "no sandbox"),
                                 (lambda f, a: float("nan"), 0.0, None), (lambda f, a: 7, 1.0, None)):
        env = env_of("custom", custom(verify))
        try:
            r = env.step("done", last=False)
        finally:
            env.close()
        assert r.done and r.score == score and r.info.get("verify_error") == error, r


def test_setup_and_executable_files_come_before_the_first_turn():
    task = custom(files={"tool.sh": "#!/bin/sh\necho tool ran\n", "data.txt": "d\n"}, executable=("tool.sh",),
                  setup="mkdir -p made/by/setup && echo hidden > made/by/setup/x",
                  verify=lambda f, a: lines_are(f, "out.txt", ["tool ran"]))
    env = env_of("custom", task)
    try:
        r = env.step(turn("./tool.sh > out.txt; test -x data.txt || echo plain; cat made/by/setup/x"), last=False)
        assert r.messages[0]["content"] == "plain\nhidden\n[exit code 0]"
        assert env.step("done", last=False).score == 1.0
    finally:
        env.close()
    with pytest.raises(RuntimeError, match="its setup failed"):
        env_of("custom", custom(setup="echo broken; exit 2"))

