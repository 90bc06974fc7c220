"""The chunked delta rule's backward: bytes that grow linearly with T, and the same numbers as the indexed loop.

The chunk loop once took chunk n as U[:, :, n]. The backward of an index is a zero tensor of the whole
(B, h, N, ...) size holding that chunk's gradient, so the backward made N full-size tensors per sliced input:
bytes ~ N^2, quadratic in T. bench/deltanet_backward.py's `indexed_delta_rule` is that formulation (on the
library's own chunk terms), kept as the reference the current code must match bit for bit (same ops per chunk,
only the added zeros are gone); the recurrent form is the definition both must agree with up to rounding. Its
`BytesMade` counts the bytes here as there.
"""
import os
import sys

import pytest
import torch

import minigrpo
from minigrpo import deltanet
from minigrpo.deltanet import chunked_delta_rule, l2norm, recurrent_delta_rule
from minigrpo.pretrained import load_pretrained

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(minigrpo.__file__)), "bench"))
from deltanet_backward import BytesMade, indexed_delta_rule  # noqa: E402


def inputs(B, h, T, dk, dv, seed=0):
    """Leaf tensors (q, k, v, g, beta, state) as GatedDeltaNet makes them: q, k l2-normed (q scaled), g <= 0,
    beta in (0, 1), a nonzero initial state."""
    gen = torch.Generator().manual_seed(seed)
    q = l2norm(torch.randn(B, h, T, dk, generator=gen)) * dk ** -0.5
    k = l2norm(torch.randn(B, h, T, dk, generator=gen))
    v = torch.randn(B, h, T, dv, generator=gen)
    g = -torch.rand(B, h, T, generator=gen) * 0.5
    beta = torch.rand(B, h, T, generator=gen)
    state = torch.randn(B, h, dk, dv, generator=gen)
    return [x.requires_grad_() for x in (q, k, v, g, beta, state)]


def run(rule, xs, seed=1):
    """Outputs (o, final state) and the gradients of all six inputs under a random upstream gradient."""
    xs = [x.detach().clone().requires_grad_() for x in xs]
    o, S = rule(*xs)
    gen = torch.Generator().manual_seed(seed)
    go, gS = torch.randn(o.shape, generator=gen), torch.randn(S.shape, generator=gen)
    grads = torch.autograd.grad((o, S), xs, (go, gS))
    return (o.detach(), S.detach()), grads


def backward_bytes(rule, T, B=1, h=2, dk=16, dv=16):
    """Bytes of the tensors made by the backward of rule(...) at length T (the forward is not counted)."""
    xs = inputs(B, h, T, dk, dv)
    o, S = rule(*xs)
    loss = o.sum() + S.sum()
    with BytesMade() as made:
        loss.backward()
    return made.bytes


def test_backward_bytes_grow_linearly_in_T():
    # 4x the tokens, 4x the bytes when each chunk's backward touches only its own chunk (the indexed loop: x9.1
    # here, and its extra term grows with N^2, 22 GiB for one Qwen3.5-4B layer at T = 2,944:
    # bench/deltanet_backward.py)
    short, long = backward_bytes(chunked_delta_rule, 256), backward_bytes(chunked_delta_rule, 1024)
    assert long / short < 4.5, f"backward bytes {short} at T=256, {long} at T=1024: x{long / short:.2f}"


# T: one chunk, a partial chunk, exact chunks, a partial last chunk after several
@pytest.mark.parametrize("B,h,T,dk,dv", [(1, 1, 64, 8, 8), (2, 3, 37, 16, 24), (2, 2, 128, 16, 16),
                                         (1, 4, 200, 32, 16), (3, 2, 65, 8, 32)])
def test_chunked_equals_indexed_bit_for_bit(B, h, T, dk, dv):
    xs = inputs(B, h, T, dk, dv, seed=T)
    (o1, s1), g1 = run(indexed_delta_rule, xs)
    (o2, s2), g2 = run(chunked_delta_rule, xs)
    assert torch.equal(o1, o2) and torch.equal(s1, s2)
    for name, a, b in zip(("q", "k", "v", "g", "beta", "state"), g1, g2):
        assert torch.equal(a, b), f"d{name} differs by {(a - b).abs().max().item():.3g}"


@pytest.mark.parametrize("T", [37, 130])
def test_chunked_gradients_match_recurrent(T):
    # the definition's gradients, up to rounding: the bit-identity above is only worth it if the reference is right
    xs = inputs(2, 2, T, 16, 16, seed=T)
    (o1, s1), g1 = run(recurrent_delta_rule, xs)
    (o2, s2), g2 = run(chunked_delta_rule, xs)
    assert (o1 - o2).abs().max() <= 1e-5 and (s1 - s2).abs().max() <= 1e-5
    for a, b in zip(g1, g2):
        assert (a - b).abs().max() <= 1e-4 * max(1.0, a.abs().max().item())


def left_padded(rows, T):
    """The rows (each (q, k, v, g, beta) of one sequence, (1, h, n, .)) left-padded to T as GatedDeltaNet sees a
    padded batch: q = k = v = 0 at pads (zeroed inputs), g and beta whatever the projections give; and real_tokens
    (B, T), False at the pads."""
    out, real_tokens = [], torch.zeros(len(rows), T, dtype=torch.bool)
    for i, r in enumerate(rows):
        n = r[0].shape[2]
        real_tokens[i, T - n:] = True
        pads = [torch.zeros_like(x[:, :, :1]).expand(*x.shape[:2], T - n, *x.shape[3:]) for x in r[:3]]
        junk = [torch.full_like(x[:, :, :1], 0.3).expand(*x.shape[:2], T - n) for x in r[3:]]
        out.append([torch.cat([p, x], dim=2) for p, x in zip(pads + junk, r)])
    return [torch.cat(xs) for xs in zip(*out)], real_tokens


def test_a_rows_chunks_start_at_its_first_real_token(monkeypatch):
    """In a left-padded batch each row is cut into chunks from its own first token (row_chunked_delta_rule), so
    its rounding does not depend on the batch: rows with 0, 5 and 70 pads reach the chunk loop with their first
    token at a multiple of the chunk, and their outputs and final states are those of the row alone."""
    T, h, dk, dv = 150, 2, 16, 16
    rows = [[x.detach() for x in inputs(1, h, n, dk, dv, seed=n)[:5]] for n in (150, 145, 80)]
    (q, k, v, g, beta), real_tokens = left_padded(rows, T)
    seen = []
    real_rule = deltanet.chunked_delta_rule
    monkeypatch.setattr(deltanet, "chunked_delta_rule", lambda *a: seen.append(a[1]) or real_rule(*a))
    state = torch.zeros(3, h, dk, dv)
    o, S = deltanet.row_chunked_delta_rule(q, k, v, g, beta, state, real_tokens)
    first = (seen[0].abs().sum((1, 3)) > 0).float().argmax(-1)                     # (B,) first real slot
    assert first.tolist() in ([0, 0, 64], [0, 0, 0]) and all(f % deltanet.CHUNK == 0 for f in first.tolist())
    for i, r in enumerate(rows):
        n = r[0].shape[2]
        o1, s1 = real_rule(*r, state[:1])
        assert torch.allclose(o[i:i + 1, :, T - n:], o1, atol=1e-6, rtol=0)
        assert torch.allclose(S[i:i + 1], s1, atol=1e-6, rtol=0)     # the pads moved to the end change nothing


def test_the_models_padded_rows_reach_the_chunk_loop_from_their_first_real_token(monkeypatch):
    """The same, seen from the model: a left-padded batch (0, 5 and 64 pads) through tiny-qwen3.5's forward, as the
    trainer's micro-batch and the sampler's prefill call it. Every Gated DeltaNet layer hands each row to the chunk
    loop with its first real token on the chunk grid (a padding mask lost between the model and the rule would
    change only the rounding, which the fp32 parity tests' 1e-4 cannot see)."""
    model = load_pretrained("tiny-qwen3.5")
    layers = sum(isinstance(m, deltanet.GatedDeltaNet) for m in model.modules())
    g = torch.Generator().manual_seed(0)
    lengths, T = (70, 65, 6), 70
    ids = torch.randint(0, 256, (3, T), generator=g)
    mask = torch.tensor([[0] * (T - n) + [1] * n for n in lengths])
    seen = []
    real_rule = deltanet.chunked_delta_rule
    monkeypatch.setattr(deltanet, "chunked_delta_rule", lambda *a: seen.append(a[1]) or real_rule(*a))
    with torch.no_grad():
        model(ids, attention_mask=mask)
    assert layers > 0 and len(seen) == layers
    for k in seen:
        first = (k.abs().sum((1, 3)) > 0).float().argmax(-1)                     # (B,) first real slot
        assert all(f % deltanet.CHUNK == 0 for f in first.tolist()), first.tolist()
