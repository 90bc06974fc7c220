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


@pytest.fixture
def fresh_compile(monkeypatch):
    """A clean slate for a test that compiles (the decode step, the Gated DeltaNet chunk loop): dynamo's caches reset,
    and the compiled functions and compile-failure memo replaced by empty ones for this test only. Without it a test
    inherits what the tests before it in its worker left: a function compiled for other models, or a failure (their
    models' recompiles past torch's limit) after which the code runs uncompiled, so a compiled-path test passes
    uncompiled or counts no graph. Gives a function returning the graphs dynamo compiled since."""
    import torch._dynamo
    from torch._dynamo.utils import counters
    from minigrpo import compiling, deltanet, static_decode
    torch._dynamo.reset()
    for module in (static_decode, deltanet):
        monkeypatch.setattr(module, "_compiled", {})
    monkeypatch.setattr(compiling, "_failed", {})
    counters.clear()
    yield lambda: counters["stats"]["unique_graphs"]
    torch._dynamo.reset()
