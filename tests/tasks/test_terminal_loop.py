"""The terminal task through the multi-turn loop (minigrpo/tasks/episodes.py) and train.py / eval.py: a policy that
plays an exercise's reference transcript is paid 1.0 for its episode, the wrong transcript less; the tool results
are in the context but never trained; the per-episode metrics; `--task terminal` end to end on the tiny model."""
import json
from argparse import Namespace

import pytest

import eval as eval_py
import train
from minigrpo.tasks.base import Seq
from minigrpo.tasks.terminal.task import TerminalTask, agent_metrics
from minigrpo.tokenizer import Tokenizer
from scripted_policy import scripted
from terminal_runs import turn

TOK = Tokenizer.from_pretrained("tiny")
TASK = TerminalTask()
EXERCISE = TASK.by_id["unique-in-order"]


def playing(transcripts):
    """The scripted policy whose episode k plays transcripts[k]: its commands one a turn, then its answer."""
    return scripted(TOK, [[turn(c) for c in t.commands] + [t.answer] for t in transcripts], seeds=[0])


def test_the_reference_is_paid_for_its_episode_and_the_wrong_transcript_less():
    args = Namespace(group_size=2, enable_thinking=False)
    right, wrong = TASK.rollout(playing([EXERCISE.reference, EXERCISE.wrong]), TOK, [{"id": EXERCISE.id}], [0], args)
    assert len(right.info["turns"]) == len(EXERCISE.reference.commands) + 1
    assert len(wrong.info["turns"]) == len(EXERCISE.wrong.commands) + 1
    assert right.reward == 1.0 and wrong.reward < 0.5
    context = TOK.decode(right.completion_ids)
    assert "<tool_response>" in context and "[exit code 0]" in context       # the tool results are in the context
    own = TOK.decode([i for i, t in zip(right.completion_ids, right.trained) if t])
    assert "[exit code" not in own and "<tool_response>" not in own          # ... and never trained
    m = agent_metrics([right, wrong])
    turns = len(right.info["turns"]) + len(wrong.info["turns"])
    assert m["solved"] == 0.5 and m["tool_calls"] == (turns - 2) / 2 and m["turn_cap"] == 0.0


def episode(score, *turns, **info):
    """An episode's Seq whose policy turns carry `turns` (each a dict of its reply's info)."""
    return Seq("x", 0, [1], [2], [0.0], "eos", "t", score, score,
               info={**info, "turns": [{"start": 0, "tokens": 1, "finish_reason": "eos", **t} for t in turns]})


def test_agent_metrics_count_episodes_not_turns():
    seqs = [episode(1.0, {"tool_calls": 1}, {"tool_calls": 2}, {"host_seconds": 0.5}, ended="answer"),
            episode(0.0, {"tool_errors": 1}, ended="turn cap")]
    m = agent_metrics(seqs)
    assert m == {"solved": 0.5, "score": 0.5, "turns": 2.0, "tool_calls": 1.5, "tool_errors": 0.5, "timeouts": 0.0,
                 "turn_cap": 0.5, "env_errors": 0.0, "host_seconds": 0.25}


@pytest.mark.slow
def test_train_and_eval_run_the_terminal_task_on_the_tiny_model(tmp_path):
    train.main(["--task", "terminal", "--model", "tiny", "--steps", "1", "--tasks-per-step", "1", "--group-size",
                "2", "--max-new-tokens", "16", "--lora-r", "4", "--runs-dir", str(tmp_path), "--run-name", "t",
                "--quiet"])
    row = json.loads(open(tmp_path / "t" / "metrics.jsonl").readline())
    assert {"solved", "turns", "tool_errors", "time_judge"} <= set(row)
    out = eval_py.main(["--task", "terminal", "--adapter", str(tmp_path / "t"), "--limit", "1", "--max-new-tokens",
                        "16", "--quiet", "--out", str(tmp_path / "eval")])
    adapter = out["results"]["adapter"]["terminal"]
    assert adapter["episodes"] == 1 and len(adapter["solved_minus_base"]) == 3
