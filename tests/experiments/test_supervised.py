"""minigrpo/experiments/supervised.py: the SFT / DPO batches score exactly the answer tokens."""
import math

import pytest
import torch

from minigrpo.experiments import supervised as S
from minigrpo.experiments import mdp_pipeline as P
from minigrpo.logprobs import token_logprobs
from minigrpo.tokenizer import Tokenizer

SMALL = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "head_dim": 8}


def test_answer_logprobs_match_token_logprobs():
    """The last-K-positions shortcut scores the same tokens as logprobs.token_logprobs with a position mask."""
    torch.manual_seed(0)
    tok = Tokenizer.from_pretrained("tiny")
    model = P.scratch_model(SMALL, 0, "cpu", torch.float32)
    items = [([256, 5, 6, 7, 8], [65, tok.im_end_id]), ([9, 10], [66, 67, tok.im_end_id])]   # padded batch
    ids, attn, mask = S.pad_batch(items, tok.pad_id, "cpu")
    ours = S.answer_logprobs(model, tok, (ids, attn, mask))
    T, K = ids.shape[1], mask.shape[1]
    full = token_logprobs(model, ids, attn, vocab_size=tok.vocab_size)                        # (B, T-1)
    ref = torch.where(mask, full[:, T - 1 - K:], 0.0).sum(-1)
    torch.testing.assert_close(ours, ref, rtol=1e-5, atol=1e-5)
    assert mask.sum(-1).tolist() == [len(a) for _, a in items]


# ----------------------------------------------------------------------------------------------------------------
# DPO (the loss dpo_loop minimises)


def test_dpo_value_and_stats_by_hand():
    pc, pr = torch.tensor([-1.0, -3.0]), torch.tensor([-2.0, -1.0])
    rc, rr = torch.tensor([-1.5, -2.0]), torch.tensor([-1.5, -2.0])
    loss, st = S.dpo_loss(pc, pr, rc, rr, beta=0.5)
    margins = [0.5 * ((-1.0 + 1.5) - (-2.0 + 1.5)), 0.5 * ((-3.0 + 2.0) - (-1.0 + 2.0))]  # 0.5, -1.0
    expected = sum(math.log(1 + math.exp(-m)) for m in margins) / 2
    assert loss.item() == pytest.approx(expected, rel=1e-6)
    assert st["accuracy"].item() == 0.5
    assert st["margin"].item() == pytest.approx(sum(margins) / 2)
    assert st["reward_chosen"].item() == pytest.approx(0.5 * (0.5 - 1.0) / 2)


def test_dpo_gradient_sign():
    pc = torch.tensor([-2.0, -1.0], requires_grad=True)
    pr = torch.tensor([-1.0, -3.0], requires_grad=True)
    loss, _ = S.dpo_loss(pc, pr, torch.tensor([-1.0, -1.0]), torch.tensor([-1.0, -1.0]), beta=0.1)
    loss.backward()
    assert (pc.grad < 0).all()  # descending the loss raises the chosen log-prob...
    assert (pr.grad > 0).all()  # ...and lowers the rejected one
