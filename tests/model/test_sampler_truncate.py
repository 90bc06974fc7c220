"""sampler.truncate keeps exactly what transformers' TopKLogitsWarper then TopPLogitsWarper keep (top-p measured
on the distribution renormalised over the top-k set), and the sampler draws only from that set, in its
proportions (docs/pitfalls.md 7: the stored log-probs are the untruncated distribution's)."""

import math

import pytest
import torch

pytestmark = pytest.mark.oracle
pytest.importorskip("transformers")
from transformers.generation.logits_process import TopKLogitsWarper, TopPLogitsWarper  # noqa: E402

from minigrpo.pretrained import load_pretrained  # noqa: E402
from minigrpo.sampler import Settings, choose, sample, sample_keys, truncate, uniforms  # noqa: E402

VOCAB = 261  # the byte tokenizer's ids; the tiny embedding has 272 rows


def hf_kept(scores, top_k, top_p):
    """(B, V) bool: what transformers' warpers leave finite, in generate's order (top-k, then top-p)."""
    if top_k:
        scores = TopKLogitsWarper(top_k)(None, scores)
    if top_p < 1.0:
        scores = TopPLogitsWarper(top_p)(None, scores)
    return torch.isfinite(scores)


def our_kept(scores, top_k, top_p):
    """(B, V) bool: the tokens truncate gives a non-zero probability, with probs computed as `choose` does."""
    p, ids = truncate(torch.log_softmax(scores, dim=-1).exp(), top_k, top_p)
    return torch.zeros(scores.shape, dtype=torch.bool).scatter_(-1, ids, p > 0)


KS = [0, None, 1, 2, 5, 20, 63, 64, 100]     # 0 / None = no top-k; V = 64: k = V-1, V and beyond
PS = [0.0, 0.05, 0.3, 0.6, 0.9, 0.95, 0.999, 1.0]


@pytest.mark.parametrize("top_k", KS)
@pytest.mark.parametrize("top_p", PS)
def test_kept_set_equals_transformers_warpers(top_k, top_p):
    g = torch.Generator().manual_seed(1000 * (top_k or 0) + int(1000 * top_p))
    V = 64
    for scale in (0.3, 1.0, 3.0, 8.0):   # from nearly flat to peaked: top-p cuts anywhere from 1 to V tokens
        scores = torch.randn(200, V, generator=g) * scale
        assert torch.equal(our_kept(scores, top_k, top_p), hf_kept(scores, top_k, top_p)), (scale, top_k, top_p)


@pytest.mark.parametrize("top_k", [1, 3, 7, 20])
def test_top_k_keeps_every_token_tied_with_the_kth(top_k):
    """Logits with many ties (bf16 logits have them): transformers keeps every token equal to the k-th value."""
    g = torch.Generator().manual_seed(top_k)
    scores = torch.randint(0, 6, (300, 40), generator=g).float()
    kept = our_kept(scores, top_k, 1.0)
    assert torch.equal(kept, hf_kept(scores, top_k, 1.0))
    assert (kept.sum(-1) > top_k).any()    # the ties did matter


@pytest.mark.parametrize("top_k,top_p", [(3, 0.37), (7, 0.83), (0, 0.61), (20, 0.9)])
def test_top_p_with_ties_keeps_as_many_tokens_of_each_value(top_k, top_p):
    """Which of several tied tokens top-p cuts is up to the sort; the values kept (a multiset) are not."""
    g = torch.Generator().manual_seed(top_k)
    scores = torch.randint(0, 6, (300, 40), generator=g).float() * 0.7
    ours, theirs = our_kept(scores, top_k, top_p), hf_kept(scores, top_k, top_p)
    for row, a, b in zip(scores, ours, theirs):
        assert sorted(row[a].tolist()) == sorted(row[b].tolist())


def test_the_issue_example():
    """[0.30, 0.25, 0.20, 0.15, 0.10], top_k=3, top_p=0.6: renormalised over the top 3 the mass of {0, 1} is 0.73,
    so token 2 (0.27 of the top-3 mass) goes; measured on the unrenormalised probs it would stay."""
    probs = torch.tensor([[0.30, 0.25, 0.20, 0.15, 0.10]])
    p, ids = truncate(probs, top_k=3, top_p=0.6)
    assert ids[0, :2].tolist() == [0, 1] and p[0].tolist() == pytest.approx([0.30, 0.25, 0, 0, 0])
    assert torch.equal(our_kept(probs.log(), 3, 0.6), hf_kept(probs.log(), 3, 0.6))


def draw(logits, temperature, top_k, top_p, n, seed=0):
    """n draws from one logit row through the sampler's own choose path, with its counter-based uniforms."""
    u = uniforms(sample_keys([seed], n, "cpu"), 0)
    token, _ = choose(logits.expand(n, -1).contiguous(), temperature, top_k, top_p, u)
    return torch.bincount(token, minlength=logits.shape[-1])


def chi_square(counts, probs):
    """Pearson's statistic over the tokens with expected > 0, and its degrees of freedom."""
    keep = probs > 0
    expected = probs[keep] * counts.sum()
    return float(((counts[keep] - expected) ** 2 / expected).sum()), int(keep.sum()) - 1


@pytest.mark.parametrize("temperature,top_k,top_p,V", [(1.0, 3, 0.6, 5), (0.7, 20, 0.9, 64), (1.3, 0, 0.5, 64),
                                                        (0.7, 10, 1.0, 64), (1.0, 8, 0.95, 64)])
def test_sampled_frequencies_follow_the_warped_distribution(temperature, top_k, top_p, V):
    """choose draws only tokens transformers keeps, in proportion to their renormalised probabilities: zero draws
    outside the kept set, and a chi-square far below a loose bound (mean df, sd sqrt(2 df); bound df + 8 sd + 8)."""
    g = torch.Generator().manual_seed(V + top_k)
    logits = (torch.tensor([[0.30, 0.25, 0.20, 0.15, 0.10]]).log() if V == 5
              else torch.randn(1, V, generator=g) * 2.0)
    scores = logits / temperature
    kept = hf_kept(scores, top_k, top_p)[0]
    target = torch.softmax(scores[0].masked_fill(~kept, float("-inf")), -1).double()
    counts = draw(logits[0], temperature, top_k, top_p, 40_000)
    assert int(counts[~kept].sum()) == 0, counts[~kept]
    stat, df = chi_square(counts.double(), target)
    assert stat < df + 8 * math.sqrt(2 * max(df, 1)) + 8, (stat, df)


def test_sampler_draws_only_inside_the_warped_set():
    """End to end at T=0.7, top_k=20, top_p=0.9 on a random tiny model: every sampled token is in the set that
    transformers' warpers keep for the model's logits at its position (recomputed without a cache)."""
    model = load_pretrained("tiny")
    prompts = [[10, 20, 30, 40], [257, 5, 6], [99, 98]]
    T, k, p = 0.7, 20, 0.9
    settings = Settings(n=6, max_new_tokens=12, temperature=T, top_k=k, top_p=p, vocab_size=VOCAB, stop_ids=())
    out = sample(model, prompts, settings, seed=4)
    outside = total = 0
    for s in out:
        ids = torch.tensor([prompts[s.prompt_index] + s.completion_ids])
        with torch.no_grad():
            logits = model(ids)[0, :, :VOCAB].float()                         # (L, V)
        P = len(prompts[s.prompt_index])
        rows = logits[P - 1:-1] / T                                         # the logits each token was drawn from
        kept = hf_kept(rows, k, p)
        tokens = torch.tensor(s.completion_ids)
        outside += int((~kept.gather(-1, tokens[:, None])).sum())
        total += len(tokens)
    assert total == 18 * 12 and outside == 0
