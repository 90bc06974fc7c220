"""grpo.token_logprobs on the real tiny Qwen models (random weights, CPU, fp32): temperature, left padding, gradients."""

import pytest
import torch

from minigrpo import grpo
from minigrpo.model import Qwen

KINDS = ["tiny", "tiny-qwen3.5"]


@pytest.fixture(scope="module", params=KINDS)
def model(request):
    torch.manual_seed(0)
    m = Qwen.from_pretrained(request.param)
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
        lp = grpo.token_logprobs(model, ids, temperature=temperature, chunk=6)  # 3 positions per chunk
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
        lp = grpo.token_logprobs(model, ids, attn, temperature=0.8, chunk=4)
        for i, r in enumerate(rows):
            alone = grpo.token_logprobs(model, torch.tensor([r]), temperature=0.8)
            assert torch.allclose(lp[i, T - len(r):], alone[0], atol=1e-5)  # the columns scoring real tokens


def test_chunked_gradient_equals_naive(model):
    ids = torch.randint(0, 261, (2, 9), generator=torch.Generator().manual_seed(3))
    attn = torch.ones_like(ids)
    attn[1, :3] = 0
    w = torch.randn(2, 8, generator=torch.Generator().manual_seed(4)) * grpo.span_mask(4, 5, 9)
    params = [p for p in model.parameters()]
    g1 = torch.autograd.grad((grpo.token_logprobs(model, ids, attn, 0.9, chunk=4) * w).sum(), params)
    g2 = torch.autograd.grad((gathered(model(ids, attention_mask=attn), ids, 0.9) * w).sum(), params)
    for a, b in zip(g1, g2):
        assert torch.allclose(a, b, atol=1e-5, rtol=1e-4)


def test_vocab_size_masks_embedding_padding_rows(model):
    ids = torch.randint(0, 261, (1, 7), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        lp = grpo.token_logprobs(model, ids, vocab_size=261)
        logits = model(ids)[:, :-1].float()
        expected = torch.log_softmax(logits[..., :261], -1).gather(-1, ids[:, 1:, None]).squeeze(-1)
    assert model.config.vocab_size == 272
    assert torch.allclose(lp, expected, atol=1e-5)
