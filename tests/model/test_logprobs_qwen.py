"""minigrpo/logprobs.py on the real tiny Qwen models (random weights, CPU, fp32 and bf16): the fused, chunked
token_logprobs against the plain log_softmax + gather version (temperature, left padding, gradients, vocabulary
mask), and the fused lm_head + log-softmax. The same on a stand-in model: tests/core/test_logprobs.py."""

import pytest
import torch

from minigrpo import grpo, logprobs
from minigrpo.pretrained import load_pretrained


KINDS = ["tiny", "tiny-qwen3.5"]


@pytest.fixture(scope="module", params=KINDS)
def model(request):
    torch.manual_seed(0)
    m = load_pretrained(request.param)
    with torch.no_grad():  # HF-style 0.02 init gives near-uniform logits; sharpen them so the checks have teeth
        m.lm_head.weight.mul_(50.0)
    return m


def gathered(logits, ids, temperature):
    return torch.log_softmax(logits[:, :-1].float() / temperature, -1).gather(-1, ids[:, 1:, None]).squeeze(-1)


@pytest.mark.parametrize("temperature", [1.0, 0.6])
def test_temperature_equals_log_softmax_of_scaled_logits(model, temperature):
    ids = torch.randint(0, 261, (2, 11), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected = gathered(model(ids), ids, temperature)
        lp = logprobs.token_logprobs(model, ids, temperature=temperature, chunk=6)  # 3 positions per chunk
    assert lp.shape == (2, 10) and lp.dtype == torch.float32
    assert torch.allclose(lp, expected, atol=1e-5)
    assert (expected - gathered(model(ids), ids, 1.0)).abs().max() > 1e-2 or temperature == 1.0  # T matters


def test_left_padded_batch_equals_each_row_alone(model):
    g = torch.Generator().manual_seed(2)
    rows = [torch.randint(0, 261, (n,), generator=g).tolist() for n in (9, 4, 6)]
    T, pad = max(len(r) for r in rows), 256
    ids = torch.tensor([[pad] * (T - len(r)) + r for r in rows])
    attn = torch.tensor([[0] * (T - len(r)) + [1] * len(r) for r in rows])
    with torch.no_grad():
        lp = logprobs.token_logprobs(model, ids, attn, temperature=0.8, chunk=4)
        for i, r in enumerate(rows):
            alone = logprobs.token_logprobs(model, torch.tensor([r]), temperature=0.8)
            assert torch.allclose(lp[i, T - len(r):], alone[0], atol=1e-5)  # the columns scoring real tokens


def test_chunked_gradient_equals_naive(model):
    ids = torch.randint(0, 261, (2, 9), generator=torch.Generator().manual_seed(3))
    attn = torch.ones_like(ids)
    attn[1, :3] = 0
    w = torch.randn(2, 8, generator=torch.Generator().manual_seed(4)) * grpo.span_mask(4, 5, 9)
    params = [p for p in model.parameters()]
    g1 = torch.autograd.grad((logprobs.token_logprobs(model, ids, attn, temperature=0.9, chunk=4) * w).sum(), params)
    g2 = torch.autograd.grad((gathered(model(ids, attention_mask=attn), ids, 0.9) * w).sum(), params)
    for a, b in zip(g1, g2):
        assert torch.allclose(a, b, atol=1e-5, rtol=1e-4)


def test_vocab_size_masks_embedding_padding_rows(model):
    ids = torch.randint(0, 261, (1, 7), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        lp = logprobs.token_logprobs(model, ids, vocab_size=261)
        logits = model(ids)[:, :-1].float()
        expected = torch.log_softmax(logits[..., :261], -1).gather(-1, ids[:, 1:, None]).squeeze(-1)
    assert model.config.vocab_size == 272
    assert torch.allclose(lp, expected, atol=1e-5)


# The fused lm_head + log-softmax (logprobs._LinearLogprob) serves every plain-headed model above; these pin its
# frozen-head path (LoRA: d logp / d h is formed in forward), its entropy, bf16, and what it keeps for backward.

def naive_entropy(logits, temperature, vocab_size):
    return logprobs.entropy(logits[:, :-1].float()[..., :vocab_size], temperature)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("first_col", [0, 4])
def test_fused_frozen_head_values_entropy_and_gradients_equal_naive(kind, first_col):
    torch.manual_seed(0)
    model = load_pretrained(kind)
    with torch.no_grad():  # peaked enough for log-probs to differ, flat enough for a non-zero entropy
        model.lm_head.weight.mul_(5.0)
    ids = torch.randint(0, 261, (3, 10), generator=torch.Generator().manual_seed(6))
    attn = torch.ones_like(ids)
    attn[2, :2] = 0
    w = torch.randn(3, 9, generator=torch.Generator().manual_seed(7)) * grpo.span_mask(first_col + 1, 9, 10)
    model.lm_head.weight.requires_grad_(False)  # as under LoRA: the head (tied embedding) is frozen
    try:
        params = [p for p in model.parameters() if p.requires_grad]
        lp, ent = logprobs.token_logprobs(model, ids, attn, temperature=0.8, vocab_size=261, chunk=5,
                                          return_entropy=True, first_col=first_col)
        g1 = torch.autograd.grad((lp * w).sum(), params)
        logits = model(ids, attention_mask=attn)[..., :261]
        g2 = torch.autograd.grad((gathered(logits, ids, 0.8) * w).sum(), params)
    finally:
        model.lm_head.weight.requires_grad_(True)
    assert torch.allclose(lp[:, first_col:], gathered(logits, ids, 0.8).detach()[:, first_col:], atol=1e-5)
    assert not ent.requires_grad  # logged, not trained
    assert torch.allclose(ent[:, first_col:], naive_entropy(logits.detach(), 0.8, 261)[:, first_col:], atol=1e-4)
    assert ent[:, first_col:].max() > 0.1  # the check has teeth: not all one-hot
    # two kernel paths (fused head, autograd through the lm_head) sum in another order: the gradients used up to 26%
    # of atol=1e-5, rtol=1e-4 (default kernels, 2 threads; 18% avx2/avx512): 2.5x those is 10x the largest seen
    for a, b in zip(g1, g2):
        assert torch.allclose(a, b, atol=2.5e-5, rtol=2.5e-4)


def test_fused_saves_no_vocabulary_sized_tensor(model):
    """Under LoRA the log-probs keep (N, H) for backward, never (N, V); the naive path keeps (B, T, V)."""
    ids = torch.randint(0, 261, (2, 40), generator=torch.Generator().manual_seed(8))
    V = model.config.vocab_size
    saved = []
    model.lm_head.weight.requires_grad_(False)
    try:
        with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t.shape) or t, lambda t: t):
            logprobs.token_logprobs(model, ids, first_col=20)
    finally:
        model.lm_head.weight.requires_grad_(True)
    assert saved and all(V not in shape for shape in saved), [s for s in saved if V in s]


def test_fused_bf16_equals_autograd_through_lm_head():
    """bf16 logits cast to fp32, gradient cast back before the product with W: what autograd does on the naive
    path, so values agree to fp32 rounding and gradients to bf16 rounding."""
    torch.manual_seed(0)
    model = load_pretrained("tiny", dtype=torch.bfloat16)
    ids = torch.randint(0, 261, (2, 12), generator=torch.Generator().manual_seed(9))
    w = torch.randn(2, 11, generator=torch.Generator().manual_seed(10))
    model.lm_head.weight.requires_grad_(False)
    params = [p for p in model.parameters() if p.requires_grad]
    lp = logprobs.token_logprobs(model, ids, temperature=0.7, vocab_size=261)
    g1 = torch.autograd.grad((lp * w).sum(), params)
    expected = gathered(model(ids)[..., :261], ids, 0.7)
    g2 = torch.autograd.grad((expected * w).sum(), params)
    assert lp.dtype == torch.float32
    assert torch.allclose(lp, expected.detach(), atol=1e-5)
    # bf16 backward through four layers, in two orders: max |a - b| / max |b| seen 1.6e-2, four bf16 steps (avx2 and
    # default kernels; 1.2e-2 avx512; the same at 1 and 2 threads); bound 1e-1. A gradient missing its 1/T (T=0.7)
    # is 3.1e-1 off.
    for a, b in zip(g1, g2):
        assert torch.allclose(a.float(), b.float(), atol=1e-1 * b.float().abs().max().item() + 1e-6)
