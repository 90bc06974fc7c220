"""The Gated DeltaNet chunk loop compiled for training (deltanet.chunk_loop, train.py --compile-gdn): the eager
chunked rule's values and gradients, two graphs for every length and batch, and a compile that fails warns once
and runs eager. The backends here trace the graphs that inductor compiles without its C++ build: "aot_eager" runs
the forward and the backward AOTAutograd makes (the graphs inductor lowers), "eager" dynamo's graphs alone."""
import pytest
import torch

from minigrpo import compiling, deltanet
from minigrpo.deltanet import chunk_loop, chunked_delta_rule, compile_chunk_loop
from minigrpo.pretrained import load_pretrained
from test_deltanet import inputs, run

NAMES = ("o", "state", "dq", "dk", "dv", "dg", "dbeta", "dstate")


@pytest.fixture
def clean_slate(fresh_compile):
    """No compiled function, graph or failure left by another test (fresh_compile): the graph count starts at 0
    whatever ran. Gives dynamo's counters (imported here: the torch-only tier collects this file with pandas
    blocked, which torch._dynamo imports)."""
    from torch._dynamo.utils import counters
    return counters


def worst_gap(rule, xs):
    """Per result (o, final state, the six gradients): max |compiled - eager| / max(1, max |eager|)."""
    (a, ga), (b, gb) = run(chunked_delta_rule, xs), run(rule, xs)
    return {n: ((x - y).abs().max() / max(1.0, x.abs().max().item())).item()
            for n, x, y in zip(NAMES, list(a) + list(ga), list(b) + list(gb))}


def test_compiled_loop_equals_eager_on_two_graphs_for_every_length(clean_slate):
    """Lengths of 3, 4 and 5 chunks (130 and 300 tokens end in a partial one), batches of 2 and 3 rows: outputs
    and the gradients of q, k, v, g, beta and the initial state equal the eager rule's, and dynamo compiled two
    graphs for all of them (chunk_math over all chunks, chunk_step for one), none per length. The bound is fp32
    rounding: inductor on the CPU measured 5.4e-7 at 1 and 2 threads, two seeds (aot_eager: 0); 1e-5 leaves 18x.
    A loop that drops the state carried from chunk to chunk, or a chunk read at another's offset, is off by O(1)."""
    counters = clean_slate
    rule = lambda *x: chunk_loop(*x, compile="aot_eager")   # noqa: E731
    for B, T in [(2, 130), (2, 256), (3, 300)]:
        gaps = worst_gap(rule, inputs(B, 2, T, 16, 16, seed=T))
        assert max(gaps.values()) <= 1e-5, f"B={B} T={T}: {gaps}"
    assert counters["stats"]["unique_graphs"] == 2, dict(counters["stats"])


def test_a_model_runs_its_chunk_loop_compiled(clean_slate):
    """compile_chunk_loop reaches every Gated DeltaNet layer, in a left-padded batch and in a packed one (their
    chunk loops go through the compiled functions: the graphs are made), and the hidden states are the eager model's;
    compile_chunk_loop(backend=None) makes them eager again."""
    counters = clean_slate
    from minigrpo.packing import pack
    model = load_pretrained("tiny-qwen3.5")
    ids = torch.randint(0, 200, (2, 140))
    mask = torch.ones(2, 140, dtype=torch.bool)
    mask[1, :9] = False
    packed = ids[mask][None]
    with torch.no_grad():
        both = lambda: (model.hidden(ids, mask), model.hidden(packed, pack=pack([140, 131])))   # noqa: E731
        eager = both()
        compile_chunk_loop(model, None, backend="eager")
        compiled = both()
    assert counters["stats"]["unique_graphs"] == 2
    for a, b in zip(eager, compiled):
        assert (a - b).abs().max() <= 1e-5 * max(1.0, a.abs().max().item())
    compile_chunk_loop(model, backend=None)
    assert all(m.loop_backend is None for m in model.modules() if isinstance(m, deltanet.GatedDeltaNet))


def test_a_compile_that_fails_warns_once_and_trains_eager(clean_slate, capfd):
    """A backend that raises as inductor does without a C compiler: one warning line naming the error, this call
    and every later one run eager (values and gradients exactly eager's), and the compile is not tried again."""
    tried = []

    def broken(gm, example_inputs):
        tried.append(1)
        raise RuntimeError("Failed to find a C compiler. Please specify via CC environment variable.\nmore")
    rule = lambda *x: chunk_loop(*x, compile=broken)   # noqa: E731
    for T in (130, 200):
        assert max(worst_gap(rule, inputs(2, 2, T, 16, 16, seed=T)).values()) == 0
    err = capfd.readouterr().err.splitlines()
    assert len(tried) == 1 and len(err) == 1, err
    assert err[0].startswith("warning: the compiled Gated DeltaNet chunk loop failed on cpu (RuntimeError: Failed "
                             "to find a C compiler. Please specify via CC environment variable.); running it eager")
    assert compiling.failure(deltanet.LOOP, "cpu", broken).startswith("RuntimeError: Failed to find a C compiler")


@pytest.mark.oracle   # train.py imports the run-time packages (the tokenizer's first)
def test_compile_gdn_follows_the_decode_path_unless_given():
    """train.py --compile-gdn: unset, the chunk loop is compiled where the decode is fast (CUDA's default), eager
    elsewhere; given, it wins either way."""
    from argparse import Namespace

    import train

    def backend(flag, device, decode=None):
        return train.gdn_backend(Namespace(compile_gdn=flag, decode=decode), device)
    assert backend(None, "cpu") is None and backend(None, "cuda") == "inductor"
    assert backend(None, "cpu", "fast") == "inductor" and backend(None, "cuda", "eager") is None
    assert backend(True, "cpu") == "inductor" and backend(False, "cuda") is None


def test_past_the_recompile_limit_is_a_warning_not_a_silent_fallback(clean_slate, capfd):
    """A shape that would compile one graph more than torch allows (here a limit of 1, and the no-grad pass's
    graph after the grad pass's) is the compile failure's warning line, then eager values; torch's own behaviour
    would be to run eager without a word for the rest of the run."""
    xs = inputs(2, 2, 130, 16, 16)
    with torch._dynamo.config.patch(recompile_limit=1):
        chunk_loop(*xs, compile="eager")
        with torch.no_grad():
            o, S = chunk_loop(*xs, compile="eager")
    err = capfd.readouterr().err.splitlines()
    assert len(err) == 1 and "the compiled Gated DeltaNet chunk loop failed on cpu" in err[0], err
    assert "recompile" in err[0].lower() or "limit" in err[0].lower(), err[0]
    o1, S1 = chunked_delta_rule(*xs)
    assert torch.equal(o, o1) and torch.equal(S, S1)
