"""minigrpo/optim.py: the learning-rate schedule --warmup and --schedule describe."""
import pytest
import torch

from minigrpo.optim import adamw


def learning_rates(n, **kw):
    """The learning rate of each of the first n optimizer steps (peak lr 1)."""
    params = [torch.nn.Parameter(torch.zeros(1))]
    opt, sched = adamw(params, 1.0, **kw)
    lrs = []
    for _ in range(n):
        lrs.append(sched.get_last_lr()[0])
        opt.step()
        sched.step()
    return lrs


def test_a_warmup_below_one_is_a_fraction_of_the_run():
    lrs = learning_rates(12, total_steps=100, warmup=0.1)        # 10 warmup steps
    assert lrs[0] == pytest.approx(1 / 11) and lrs[9] == pytest.approx(10 / 11)
    assert lrs[10] == pytest.approx(1.0) and lrs[11] < 1.0         # the peak, then the cosine


def test_a_warmup_of_one_or_more_counts_steps():
    lrs = learning_rates(4, total_steps=100, warmup=2)
    assert lrs[:3] == pytest.approx([1 / 3, 2 / 3, 1.0])
    assert learning_rates(3, total_steps=100, warmup=2, schedule="constant")[2] == 1.0
