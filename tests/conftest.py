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
