"""Fixtures every test file gets."""
import pytest
import torch


@pytest.fixture(autouse=True)
def keep_torch_threads():
    """train.main sets torch's thread count for the whole process (on a CPU, from the idle cores): each test gets
    the count it started with back, so that one in-process run does not change the kernels of the tests after it."""
    n = torch.get_num_threads()
    yield
    torch.set_num_threads(n)
