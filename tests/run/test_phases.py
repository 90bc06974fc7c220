"""Seconds by phase in metrics.jsonl: the sampler, the rest of the rollout (waiting on the judge), the reference,
policy and optimizer phases, and the checkpoint saved after the step before; each phase measured where it is spent."""
import json
import time

import pytest

import train
from minigrpo.tasks.synthetic import RepeatCharTask

SMALL = ["--task", "synthetic", "--model", "tiny", "--tasks-per-step", "2", "--group-size", "2", "--micro-batch", "4",
         "--max-new-tokens", "8", "--quiet"]
JUDGE_S, SAVE_S = 0.05, 0.4


class SlowJudgeTask(RepeatCharTask):
    """Every completion's grade takes JUDGE_S of wall clock, as a judge's round trip does."""

    def score(self, ex, completion):
        time.sleep(JUDGE_S)
        return super().score(ex, completion)


def test_each_phase_is_measured_where_it_is_spent(tmp_path, monkeypatch):
    real_save = train.save

    def slow_save(*a, **k):
        time.sleep(SAVE_S)
        return real_save(*a, **k)

    monkeypatch.setattr(train, "save", slow_save)
    args = train.resolve_args([*SMALL, "--runs-dir", str(tmp_path), "--run-name", "r", "--steps", "3",
                               "--save-every", "2"])
    train.train(args, task=SlowJudgeTask())
    rows = [json.loads(line) for line in open(tmp_path / "r" / "metrics.jsonl")]
    for m in rows:
        assert m["time_judge"] >= 4 * JUDGE_S             # 2 tasks x 2 samples graded, none in the sampler
        assert 0 < m["time_generate"] and m["time_generate"] + m["time_judge"] == pytest.approx(m["time_sample"])
        assert m["time_reference"] > 0 and m["time_policy"] > 0 and m["time_optimizer"] > 0
    # saved after step 2 (and after the last, step 3, which no row follows); rows 1 and 2 had no save before them
    assert [m["time_checkpoint"] >= SAVE_S for m in rows] == [False, False, True]
    assert rows[0]["time_checkpoint"] == 0.0


def test_every_row_counts_its_own_step_and_each_phase_once(tmp_path, monkeypatch):
    """On a clock that moves one second per reading, a stretch lasts 1 + the readings inside it, so every row of
    the same step's shape has the same seconds: a record that was not restarted for each row would grow. One
    sampler call a step (generate 1; sample 1 + its 2 readings), one micro-batch, one pass."""
    import itertools
    import types

    from minigrpo import metrics
    ticks = itertools.count()
    monkeypatch.setattr(metrics, "time", types.SimpleNamespace(perf_counter=lambda: float(next(ticks))))
    args = train.resolve_args([*SMALL, "--runs-dir", str(tmp_path), "--run-name", "r", "--steps", "3",
                               "--save-every", "2"])
    train.train(args)
    rows = [{k: v for k, v in json.loads(line).items() if k.startswith("time_")}
            for line in open(tmp_path / "r" / "metrics.jsonl")]
    step = {"time_generate": 1.0, "time_sample": 3.0, "time_judge": 2.0, "time_reference": 1.0, "time_policy": 1.0,
            "time_optimizer": 1.0}
    assert rows == [{"time_checkpoint": 0.0, **step}, {"time_checkpoint": 1.0, **step},
                    {"time_checkpoint": 1.0, **step}]
