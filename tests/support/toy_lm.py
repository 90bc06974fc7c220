"""A tiny stand-in model with the Qwen interface hidden(ids, attention_mask) / logits(h), in fp64, for the tests of
the loss and the log-probs (tests/core/)."""
import math

import torch
import torch.nn as nn

from minigrpo.logprobs import naive_token_logprobs


class ToyLM(nn.Module):
    """Embedding + learned positions + causal running mean over real tokens; positions follow the mask."""

    def __init__(self, vocab=23, dim=8, max_pos=64, seed=0, dtype=torch.float64):
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.emb = nn.Parameter(torch.randn(vocab, dim, generator=g, dtype=dtype))
        self.pos = nn.Parameter(torch.randn(max_pos, dim, generator=g, dtype=dtype) * 0.5)
        self.mix = nn.Parameter(torch.randn(dim, dim, generator=g, dtype=dtype) / math.sqrt(dim))
        # a plain bias-free nn.Linear, as Qwen's lm_head: what logprobs.token_logprobs fuses into its log-softmax
        self.lm_head = nn.utils.skip_init(nn.Linear, dim, vocab, bias=False, dtype=dtype)
        self.lm_head.weight = nn.Parameter(torch.randn(vocab, dim, generator=g, dtype=dtype))

    def hidden(self, input_ids, attention_mask=None):
        mask = torch.ones_like(input_ids) if attention_mask is None else attention_mask
        pos = (mask.cumsum(-1) - 1).clamp(min=0)  # positions follow the real tokens
        x = (self.emb[input_ids] + self.pos[pos]) * mask.unsqueeze(-1).to(self.emb.dtype)  # pads contribute nothing
        mean = x.cumsum(1) / mask.cumsum(1).clamp(min=1).unsqueeze(-1).to(x.dtype)  # causal mean of real tokens
        return torch.tanh(mean @ self.mix)

    def logits(self, h):
        return self.lm_head(h)

    def forward(self, input_ids, attention_mask=None):
        return self.logits(self.hidden(input_ids, attention_mask))


def naive_logprobs(model, ids, mask=None, temperature=1.0):
    """The library's plain log_softmax + gather version (fp64 for this fp64 model)."""
    return naive_token_logprobs(model, ids, mask, temperature)
