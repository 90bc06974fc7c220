"""minigrpo/logprobs.py: the fused, chunked token_logprobs against the plain log_softmax + gather version, on a
tiny fp64 stand-in model (toy_lm.ToyLM): temperature, left padding, gradients, entropy, vocabulary mask, memory kept
for backward. The same on the real tiny Qwen models: tests/model/test_logprobs_qwen.py."""

import pytest
import torch

from minigrpo import logprobs
from toy_lm import ToyLM, naive_logprobs


# ----------------------------------------------------------------------------------------------------------------
# token_logprobs on the stand-in model (fp64)


@pytest.mark.parametrize("temperature", [1.0, 0.7, 1.3])
@pytest.mark.parametrize("chunk", [1, 5, 1024])
def test_token_logprobs_equal_naive(temperature, chunk):
    model = ToyLM()
    ids = torch.randint(0, 23, (3, 10), generator=torch.Generator().manual_seed(0))
    lp = logprobs.token_logprobs(model, ids, temperature=temperature, chunk=chunk)
    assert lp.shape == (3, 9) and lp.dtype == torch.float64
    assert torch.allclose(lp, naive_logprobs(model, ids, temperature=temperature), atol=1e-12)


def test_token_logprobs_fp32_from_low_precision_logits():
    model = ToyLM(dtype=torch.bfloat16)
    ids = torch.randint(0, 23, (2, 6), generator=torch.Generator().manual_seed(0))
    lp = logprobs.token_logprobs(model, ids)
    assert lp.dtype == torch.float32
    expected = torch.log_softmax(model(ids)[:, :-1].float(), -1).gather(-1, ids[:, 1:, None]).squeeze(-1)
    assert torch.allclose(lp, expected)


def test_token_logprobs_left_padding_equals_rows_alone():
    model = ToyLM()
    rows = [[5, 3, 8, 1, 2, 9], [4, 4, 7], [11, 2, 6, 6, 1]]
    T = max(len(r) for r in rows)
    ids = torch.tensor([[0] * (T - len(r)) + r for r in rows])
    attn = torch.tensor([[0] * (T - len(r)) + [1] * len(r) for r in rows])
    lp = logprobs.token_logprobs(model, ids, attn, temperature=0.8, chunk=4)
    for i, r in enumerate(rows):
        alone = logprobs.token_logprobs(model, torch.tensor([r]), temperature=0.8)
        assert torch.allclose(lp[i, T - len(r):], alone[0], atol=1e-12)
    # without the mask the padded rows come out different: the mask matters
    assert not torch.allclose(logprobs.token_logprobs(model, ids)[1, -2:], lp[1, -2:])


def test_token_logprobs_gradient_equals_naive():
    model = ToyLM()
    ids = torch.randint(0, 23, (3, 10), generator=torch.Generator().manual_seed(0))
    w = torch.randn(3, 9, dtype=torch.float64)
    g1 = torch.autograd.grad((logprobs.token_logprobs(model, ids, temperature=0.9, chunk=4) * w).sum(),
                             list(model.parameters()))
    g2 = torch.autograd.grad((naive_logprobs(model, ids, temperature=0.9) * w).sum(), list(model.parameters()))
    for a, b in zip(g1, g2):
        assert torch.allclose(a, b, atol=1e-12)


def test_token_logprobs_entropy_and_vocab_mask():
    model = ToyLM()
    ids = torch.randint(0, 15, (2, 7), generator=torch.Generator().manual_seed(0))
    lp, ent = logprobs.token_logprobs(model, ids, temperature=0.7, chunk=3, return_entropy=True)
    logits = model(ids)[:, :-1] / 0.7
    p = torch.softmax(logits, -1)
    assert torch.allclose(ent, -(p * p.log()).sum(-1), atol=1e-12)
    assert torch.allclose(logprobs.entropy(model(ids)[:, :-1], 0.7), ent, atol=1e-12)
    # vocab_size: ids >= 15 are embedding padding rows, renormalised over the first 15
    lp15, ent15 = logprobs.token_logprobs(model, ids, temperature=0.7, vocab_size=15, return_entropy=True)
    logp15 = torch.log_softmax(logits[..., :15], -1)
    assert torch.allclose(lp15, logp15.gather(-1, ids[:, 1:, None]).squeeze(-1), atol=1e-12)
    assert torch.allclose(ent15, -(logp15.exp() * logp15).sum(-1), atol=1e-12)


def saved_bytes(fn):
    """Bytes of tensors autograd keeps for backward while fn runs (forward only)."""
    total = [0]

    def pack(t):
        total[0] += t.numel() * t.element_size()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn()
    return total[0]


def test_token_logprobs_does_not_keep_full_logits_for_backward():
    V, B, T = 2000, 4, 64
    model = ToyLM(vocab=V, dim=8, max_pos=T, dtype=torch.float32)
    ids = torch.randint(0, V, (B, T))
    full = B * (T - 1) * V * 4  # one (B, T-1, V) fp32 tensor
    naive = saved_bytes(lambda: naive_logprobs(model, ids))
    ours = saved_bytes(lambda: logprobs.token_logprobs(model, ids, chunk=16))
    assert naive >= full
    assert ours < full / 20  # only each chunk's inputs are kept; logits are recomputed in backward


def test_no_grad_forms_no_gradient_in_forward(monkeypatch):
    """With a frozen head (LoRA) forward forms d logp / d h while a chunk's softmax is at hand, but only when a
    backward can follow: under no_grad (the reference's and the behaviour policy's log-probs) it forms none."""
    model = ToyLM()
    model.lm_head.weight.requires_grad_(False)        # the body trains, the head does not
    formed = []
    real = logprobs._onehot_minus_
    monkeypatch.setattr(logprobs, "_onehot_minus_", lambda *a: formed.append(1) or real(*a))
    ids = torch.randint(0, 23, (2, 9), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        lp = logprobs.token_logprobs(model, ids, chunk=4)
    assert formed == [] and not lp.requires_grad
    logprobs.token_logprobs(model, ids, chunk=4)
    assert len(formed) == 4                           # 2 x 8 rows, 4 per chunk
