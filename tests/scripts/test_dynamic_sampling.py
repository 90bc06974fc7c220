"""DAPO's dynamic sampling in train.py's sample_step: only prompts whose group's raw scores spread are trained on,
more are drawn --tasks-per-step at a time up to --max-draws, each draw with seeds of its own and the data order
advanced by every prompt drawn; without the flag, one draw and nothing dropped."""
import argparse

import pytest

import train
from minigrpo.tasks.base import DataState, Seq

G = 4


def fake_rollouts(spread, calls):
    """The step's rollout(examples) (train.rollout_step's for one step): G Seqs per example, scores that spread only
    for the ids in `spread`."""
    def rollout(examples):
        calls.append((examples[0][0], [ex["id"] for _, ex in examples]))   # (the first's index in the step, ids)
        assert [i for i, _ in examples] == list(range(examples[0][0], examples[0][0] + len(examples)))
        seqs = [Seq(ex["id"], 0, [1], [2], [0.0], "eos", "x", float(ex["id"] in spread and k % 2), None)
                for _, ex in examples for k in range(G)]
        for s in seqs:
            s.reward = s.score
        return seqs, seqs[::2]                  # "this rank's" share: every other Seq
    return rollout


def args(**kw):
    return argparse.Namespace(**{"tasks_per_step": 3, "dynamic_sampling": True, "max_draws": 3, "seed": 0, **kw})


@pytest.fixture
def train_set():
    return [{"id": f"e{i}"} for i in range(12)]


def order(train_set, n, seed=0):
    state = DataState()
    return [ex["id"] for ex in train.next_examples(train_set, n, state, seed)]


def test_only_prompts_with_spread_are_kept_and_more_are_drawn(train_set):
    ids = order(train_set, 9)
    spread = {ids[1], ids[4], ids[6], ids[8]}             # one in draws 1 and 2, two in draw 3: one too many
    calls = []
    data = DataState()
    all_seqs, my_seqs, m = train.sample_step(fake_rollouts(spread, calls), args(), train_set, data)
    assert [c[0] for c in calls] == [0, 3, 6]               # every prompt of the step has its own seed index
    assert [c[1] for c in calls] == [ids[0:3], ids[3:6], ids[6:9]]
    kept = [ids[1], ids[4], ids[6]]                        # the first three with spread, in the order drawn
    assert list(dict.fromkeys(s.example_id for s in all_seqs)) == kept and len(all_seqs) == 3 * G
    assert {s.example_id for s in my_seqs} == set(kept) and len(my_seqs) == 3 * G // 2
    # the score of everything drawn: 4 groups with spread, 2 of their 4 samples right, of 9 groups of 4
    assert m == {"dynamic_drawn": 9, "dynamic_kept": 3, "dynamic_dropped": 6, "dynamic_drawn_score": 8 / 36}
    assert (data.epoch, data.pos) == (0, 9)                 # the data order moved past every prompt drawn


def test_the_draws_stop_when_the_step_is_full_and_at_the_cap(train_set):
    ids = order(train_set, 12)
    calls = []
    rollout = fake_rollouts(set(ids[:3]), calls)
    assert train.sample_step(rollout, args(), train_set, DataState())[2]["dynamic_drawn"] == 3
    calls.clear()
    all_seqs, _, m = train.sample_step(fake_rollouts({ids[2]}, calls), args(max_draws=2), train_set, DataState())
    assert len(calls) == 2 and m["dynamic_drawn"] == 6 and m["dynamic_kept"] == 1 and m["dynamic_dropped"] == 5
    assert {s.example_id for s in all_seqs} == {ids[2]}     # fewer than --tasks-per-step: what the draws found


def test_without_the_flag_one_draw_and_nothing_is_dropped(train_set):
    calls = []
    all_seqs, my_seqs, m = train.sample_step(fake_rollouts(set(), calls), args(dynamic_sampling=False), train_set,
                                             DataState())
    assert len(calls) == 1 and calls[0][0] == 0 and len(all_seqs) == 3 * G and m == {}


def test_a_failed_score_is_no_spread(train_set):
    ids = order(train_set, 3)
    calls = []
    rollouts = fake_rollouts({ids[0]}, calls)

    def with_failures(*a, **k):
        seqs, mine = rollouts(*a, **k)
        for s in seqs:
            if s.example_id == ids[0] and s.score == 1.0:   # the only high scores failed: no spread left
                s.score = s.reward = None
        return seqs, mine
    assert train.sample_step(with_failures, args(max_draws=1), train_set, DataState())[2]["dynamic_kept"] == 0
