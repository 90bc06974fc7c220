"""update.micro_batches (minigrpo/update.py): micro-batches cut after sorting by length, so that short turn-0
sequences are not padded to the revisions they were rolled out next to; every Seq is trained once, in a fixed
order."""
import os
import random
import sys
from types import SimpleNamespace

import pytest

from minigrpo.update import micro_batches
from repo_root import ROOT


def seq(prompt, completion, turn=0):
    return SimpleNamespace(prompt_ids=[1] * prompt, completion_ids=[2] * completion, turn=turn)


def pad_tokens(batches):
    n = lambda s: len(s.prompt_ids) + len(s.completion_ids)
    return sum(len(b) * max(map(n, b)) - sum(map(n, b)) for b in batches)


def two_turn_step(rng, answers=24):
    """Rollout order of a soyuz step: each answer's turn 0 (100-300 tokens), then its revision (2.6k-2.9k)."""
    out = []
    for _ in range(answers):
        out += [seq(rng.randint(50, 150), rng.randint(50, 150), 0), seq(rng.randint(1600, 1900), 1024, 1)]
    return out


def test_every_seq_exactly_once_and_less_padding():
    rng = random.Random(0)
    for size in (1, 3, 4, 5, 48, 100):
        seqs = two_turn_step(rng)
        batches = micro_batches(seqs, size)
        flat = [s for b in batches for s in b]
        assert sorted(map(id, flat)) == sorted(map(id, seqs)) and len(flat) == len(seqs)
        assert all(len(b) == size for b in batches[:-1]) and 0 < len(batches[-1]) <= size
        old = [seqs[i:i + size] for i in range(0, len(seqs), size)]
        if 1 < size < len(seqs):
            assert pad_tokens(batches) < pad_tokens(old) / 4, size
        if size == 4:  # turn 0 with turn 0, revisions with revisions
            assert all(len({s.turn for s in b}) == 1 for b in batches)


def test_longest_first_and_ties_keep_rollout_order():
    a, b, c, d, e = seq(10, 5), seq(3, 3), seq(10, 5), seq(1, 20), seq(5, 10)
    assert [s for mb in micro_batches([a, b, c, d, e], 2) for s in mb] == [d, a, c, e, b]


@pytest.mark.oracle  # bench/padding.py imports train.py, and so every run-time package
def test_bench_prints_the_ratio(capsys):
    pytest.importorskip("tokenizers")
    sys.path.insert(0, os.path.join(ROOT, "bench"))
    try:
        import padding
    finally:
        sys.path.pop(0)
    rows = padding.main(["--steps", "20"])
    out = capsys.readouterr().out
    assert "| short |" in out and "| derived |" in out
    for r in rows.values():
        (po, to), (pn, tn) = r["old"], r["new"]
        assert pn / tn < po / to / 3 and tn < to
