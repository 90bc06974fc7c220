"""Fixtures every test file gets.

The folders mirror the package: core/ is the loss math (GRPO advantages and losses, log-probs, the optimizer, the
common helpers), model/ the rest of the core (model, attention, deltanet, pretrained, hub, tokenizer, lora, sampler,
static decode, update, against transformers and peft where they are the oracle). core/ and model/'s tests not marked
`oracle` or `slow` are the torch-only tier: they need only torch, numpy and pytest, so this file imports nothing
else. Then judge/ (sandbox/ beside it), tasks/, experiments/, run/, evals/, scripts/ (train.py, eval.py and
scripts/mutate.py end to end), bench/ and repo/ (rules over the whole tree). support/ holds the helpers the tests
import (it is on pytest's pythonpath)."""
import pytest
import torch


@pytest.fixture(autouse=True)
def keep_torch_threads():
    """train.main sets torch's thread count for the whole process (on a CPU, from the idle cores): each test gets
    the count it started with back, so that one in-process run does not change the kernels of the tests after it."""
    n = torch.get_num_threads()
    yield
    torch.set_num_threads(n)


# pytest-xdist's `--dist loadfile` (the README's test command) hands whole files to its workers in queue order, and
# by default queues them by their number of tests, not their length, so a long file of few tests ran alone at the
# end while the other worker idled: the bf16 on-policy tests (three tests at full width, the longest file on a
# 2-core AVX2 box: `--durations` in any CI log). The queue keeps the collection order instead, and that order
# puts the longest file first, then the files with a `slow` test, then the rest, each group as collected.
LONGEST_FIRST = ("tests/model/test_on_policy_bf16.py",)


def pytest_configure(config):
    if hasattr(config.option, "loadscopereorder"):      # xdist 3.6+
        config.option.loadscopereorder = False


def pytest_collection_modifyitems(config, items):
    slow = {item.nodeid.split("::")[0] for item in items if item.get_closest_marker("slow")}
    rank = {path: 0 for path in LONGEST_FIRST}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::")[0], 1 if item.nodeid.split("::")[0] in slow else 2))
