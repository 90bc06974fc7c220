"""Rows per sampler call of a multi-turn task (minigrpo/run/callsize.py): all of a rank's examples in one call per
turn, or on a GPU the largest count the memory plan fits, named in the start-up line."""
import math
from types import SimpleNamespace

import pytest
import torch

from minigrpo.run import callsize
from minigrpo.run.flags import resolve_args

SOYUZ = ["--task", "soyuz", "--model", "tiny", "--tasks-per-step", "4", "--group-size", "6", "--max-new-tokens", "64"]


class Task:
    chunk = None


def test_the_largest_count_whose_rows_fit():
    args = resolve_args(SOYUZ)
    four, need, whole = callsize.planned_chunk(args, 4, math.inf, torch.float32)
    assert four == 4 and need == whole
    chunk, need, _ = callsize.planned_chunk(args, 4, whole - 1, torch.float32)
    assert 1 <= chunk < 4
    assert need == callsize.planned_chunk(args, chunk, math.inf, torch.float32)[2]   # what `chunk` examples need
    over = callsize.planned_chunk(args, chunk + 1, math.inf, torch.float32)[2]       # and one more
    assert need <= whole - 1 < over                                                  # the largest that fits
    assert callsize.planned_chunk(args, 4, 0, torch.float32)[0] == 1                  # at least one example's G


def test_a_gpu_that_fits_fewer_rows_gets_smaller_calls_named_in_the_start_up_line(monkeypatch):
    args = resolve_args(SOYUZ)
    whole, two, one = (callsize.planned_chunk(args, n, math.inf, torch.float32)[2] for n in (4, 2, 1))
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device: SimpleNamespace(total_memory=two))
    task = Task()
    line = callsize.size_calls(task, args, "cuda", torch.float32, world=1)
    assert task.chunk == 2
    assert line == (f"sampler calls of 2 of 4 tasks (12 rows): the memory plan needs {whole / 1e9:.1f} GB for all 24 "
                    f"rows in one call, this GPU has {two / 1e9:.1f} GB")
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device: SimpleNamespace(total_memory=one - 1))
    line = callsize.size_calls(Task(), args, "cuda", torch.float32, world=1)      # not even one task's rows fit
    assert line.startswith("sampler calls of 1 of 4 tasks (6 rows)")
    assert line.endswith(f"; even these need {one / 1e9:.1f} GB (python train.py --plan)")
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device: SimpleNamespace(total_memory=whole))
    task = Task()
    assert callsize.size_calls(task, args, "cuda", torch.float32, world=2) == \
        "one sampler call per turn (2 tasks x G=6 = 12 rows)"          # a rank's share: 2 of the step's 4
    assert task.chunk == 2


@pytest.mark.parametrize("chunk, line", [(None, "one sampler call per turn (4 tasks x G=6 = 24 rows)"),
                                         (1, "sampler calls of 1 of 4 tasks (6 rows)")])
def test_off_a_gpu_every_example_in_one_call_and_a_task_keeps_its_own_chunk(chunk, line):
    task = Task()
    task.chunk = chunk
    assert callsize.size_calls(task, resolve_args(SOYUZ), "cpu", torch.float32, world=1) == line
    assert task.chunk == (chunk or 4)       # a step's examples: the validation's calls take no more
    assert callsize.size_calls(object(), resolve_args(SOYUZ), "cpu", torch.float32, world=1) == ""
