"""minigrpo/experiments/supervised.py: the SFT / DPO batches score exactly the answer tokens."""
import torch

from minigrpo import grpo
from minigrpo.experiments import supervised as S
from minigrpo.experiments import mdp_pipeline as P
from minigrpo.tokenizer import Tokenizer

SMALL = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "head_dim": 8}


def test_answer_logprobs_match_token_logprobs():
    """The last-K-positions shortcut scores the same tokens as grpo.token_logprobs with a position mask."""
    torch.manual_seed(0)
    tok = Tokenizer.from_pretrained("tiny")
    model = P.scratch_model(SMALL, 0, "cpu", torch.float32)
    items = [([256, 5, 6, 7, 8], [65, tok.im_end_id]), ([9, 10], [66, 67, tok.im_end_id])]   # padded batch
    ids, attn, mask = S.pad_batch(items, tok.pad_id, "cpu")
    ours = S.answer_logprobs(model, tok, (ids, attn, mask))
    T, K = ids.shape[1], mask.shape[1]
    full = grpo.token_logprobs(model, ids, attn, vocab_size=tok.vocab_size)              # (B, T-1)
    ref = torch.where(mask, full[:, T - 1 - K:], 0.0).sum(-1)
    torch.testing.assert_close(ours, ref, rtol=1e-5, atol=1e-5)
    assert mask.sum(-1).tolist() == [len(a) for _, a in items]
