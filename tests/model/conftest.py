"""Fixtures of the model tests. The tests that need more than torch, numpy and pytest are marked `oracle`, and the
torch-only tier leaves them out (with the `slow` ones): `python -m pytest tests/core tests/model -m "not oracle and
not slow"`."""
import pytest


@pytest.fixture
def tiny_tokenizer():
    """The tiny models' byte-level tokenizer. Building it needs the tokenizers package, so a test that takes it is
    marked oracle; without the package it is skipped, not failed."""
    pytest.importorskip("tokenizers")
    from minigrpo.tokenizer import Tokenizer
    return Tokenizer.from_pretrained("tiny")
