"""minigrpo/update.py: the learning-rate schedule --warmup and --schedule describe. --warmup as a count or a fraction
of the run, lr_factor's linear warmup then cosine to zero (or constant), the schedule adamw's LambdaLR applies step
by step, and the supervised stages' peak_in_warmup, which holds the peak one step longer. Every expected rate is written
out by hand."""
import math

import pytest
import torch

from minigrpo.experiments.supervised import optimizer
from minigrpo.update import adamw, lr_factor, warmup_steps


def rates(opt, sched, steps):
    """The learning rate of each of `steps` optimizer steps, as the trainer takes them (step, then sched.step)."""
    out = []
    for _ in range(steps):
        out.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    return out


def test_warmup_is_a_count_or_a_fraction_of_all_steps():
    assert warmup_steps(0.1, 50) == pytest.approx(5.0)
    assert warmup_steps(3, 50) == 3 and warmup_steps(0, 50) == 0 and warmup_steps(1, 50) == 1


def test_lr_factor_warms_up_linearly_then_decays_by_cosine_to_zero():
    got = [lr_factor(s, 10, 2) for s in range(11)]
    cos = [0.5 * (1 + math.cos(math.pi * k / 8)) for k in range(9)]  # from step 2 (the peak) to step 10 (zero)
    assert got == pytest.approx([1 / 3, 2 / 3, *cos])
    assert got[2] == 1.0 and got[10] == pytest.approx(0.0, abs=1e-12)
    assert lr_factor(25, 10, 2) == pytest.approx(0.0, abs=1e-12)  # past the end it stays at zero
    assert [lr_factor(s, 10, 0) for s in (0, 10)] == pytest.approx([1.0, 0.0], abs=1e-12)


def test_lr_factor_constant_keeps_the_warmup():
    assert [lr_factor(s, 10, 2, "constant") for s in (0, 1, 2, 9, 30)] == pytest.approx([1 / 3, 2 / 3, 1, 1, 1])


def test_adamw_steps_through_lr_factor():
    p = torch.nn.Parameter(torch.zeros(3))
    p.grad = torch.ones(3)
    opt, sched = adamw([p], 0.5, 6, warmup=1, beta2=0.95, weight_decay=0.1)
    assert opt.param_groups[0]["betas"] == (0.9, 0.95) and opt.param_groups[0]["weight_decay"] == 0.1
    assert rates(opt, sched, 6) == pytest.approx([0.5 * lr_factor(s, 6, 1) for s in range(6)])
    opt, sched = adamw([p], 0.5, 6, warmup=1, schedule="constant")
    assert rates(opt, sched, 4) == pytest.approx([0.25, 0.5, 0.5, 0.5])


def test_a_warmup_below_one_is_a_fraction_of_the_run():
    p = torch.nn.Parameter(torch.zeros(1))
    p.grad = torch.ones(1)
    lrs = rates(*adamw([p], 1.0, 100, warmup=0.1), 12)           # 10 warmup steps
    assert lrs[0] == pytest.approx(1 / 11) and lrs[9] == pytest.approx(10 / 11)
    assert lrs[10] == pytest.approx(1.0) and lrs[11] < 1.0         # the peak, then the cosine


def test_a_warmup_of_one_or_more_counts_steps():
    p = torch.nn.Parameter(torch.zeros(1))
    p.grad = torch.ones(1)
    assert rates(*adamw([p], 1.0, 100, warmup=2), 4)[:3] == pytest.approx([1 / 3, 2 / 3, 1.0])
    assert rates(*adamw([p], 1.0, 100, warmup=2, schedule="constant"), 3)[2] == 1.0


def test_supervised_schedule_holds_the_peak_one_step_longer():
    p = torch.nn.Parameter(torch.zeros(3))
    p.grad = torch.ones(3)
    opt, sched = optimizer([p], 1.0, 10, 0.2)  # int(0.2 * 10) = 2 warmup steps, the second at the peak
    assert opt.param_groups[0]["betas"] == (0.9, 0.99) and opt.param_groups[0]["weight_decay"] == 0.0
    cos = [0.5 * (1 + math.cos(math.pi * k / 8)) for k in range(8)]
    assert rates(opt, sched, 10) == pytest.approx([0.5, 1.0, *cos])
    opt, sched = optimizer([p], 1.0, 10, 0.0)  # at least one warmup step, which is the peak
    assert rates(opt, sched, 3) == pytest.approx([1.0, 1.0, 0.5 * (1 + math.cos(math.pi / 9))])
