"""
Tests of minigrpo/grpo.py: every expected number is computed independently (by hand or with a plain Python loop).
Where a loss needs a model, a tiny stand-in (toy_lm.ToyLM) gives the log-probs; tests/core/test_logprobs.py tests those.
"""

import math
import random

import pytest
import torch

from minigrpo import grpo
from minigrpo.grpo import Against, LossSettings
from minigrpo.logprobs import token_logprobs
from toy_lm import ToyLM, naive_logprobs


# ----------------------------------------------------------------------------------------------------------------
# 1. group_advantages


def loop_advantages(scores, groups, scale, eps=1e-6):
    """Plain-loop reference: groups is a list of index lists."""
    adv = [0.0] * len(scores)
    for idx in groups:
        vals = [scores[i] for i in idx if scores[i] is not None]
        if len(vals) < 2 or max(vals) == min(vals):
            continue
        mean = sum(vals) / len(vals)
        var = 0.0
        for v in vals:
            var += (v - mean) ** 2
        std = (var / (len(vals) - 1)) ** 0.5
        for i in idx:
            if scores[i] is not None:
                adv[i] = (scores[i] - mean) / (std + eps) if scale == "group" else scores[i] - mean
    if scale == "batch":
        c = [adv[i] for i in range(len(scores)) if scores[i] is not None]
        m = sum(c) / len(c)
        std = (sum((a - m) ** 2 for a in c) / (len(c) - 1)) ** 0.5
        adv = [a / (std + eps) for a in adv]
    return adv


def test_advantages_by_hand():
    adv, st = grpo.group_advantages([1.0, 0.0, 0.0, 1.0, 0.5, 0.5, 0.5, 0.5], group_size=4)
    z = 0.5 / math.sqrt(1 / 3)  # mean 0.5, unbiased std sqrt(1/3)
    assert torch.allclose(adv, torch.tensor([z, -z, -z, z, 0, 0, 0, 0]), atol=1e-5)
    assert st["zero_spread"] == 1 and st["groups"] == 2 and st["failed"] == 0
    adv, _ = grpo.group_advantages([1.0, 0.0, 0.0, 1.0], group_size=4, scale="none")
    assert adv.tolist() == [0.5, -0.5, -0.5, 0.5]


def test_advantages_none_is_excluded_and_zero():
    adv, st = grpo.group_advantages([1.0, None, 0.0, 0.5], group_size=4)
    # baseline over {1, 0, 0.5}: mean 0.5, std sqrt((0.25 + 0.25 + 0) / 2) = 0.5
    assert torch.allclose(adv, torch.tensor([1.0, 0.0, -1.0, 0.0]), atol=1e-5)
    assert st["failed"] == 1 and st["zero_spread"] == 0
    nan = float("nan")
    adv_t, st_t = grpo.group_advantages(torch.tensor([1.0, nan, 0.0, 0.5]), group_size=4)
    assert torch.equal(adv_t, adv) and st_t["failed"] == 1
    # a group left with one valid score has no baseline: zero-spread, all zero
    adv, st = grpo.group_advantages([None, 0.3, None], group_size=3)
    assert adv.tolist() == [0, 0, 0] and st["zero_spread"] == 1 and st["failed"] == 2


def test_advantages_single_sample_and_all_equal_groups():
    adv, st = grpo.group_advantages([0.1, 0.9, 0.4], group_size=1)
    assert adv.tolist() == [0, 0, 0] and st["zero_spread"] == 3
    for scale in ("group", "batch", "none"):
        adv, st = grpo.group_advantages([0.7] * 6, group_size=3, scale=scale)
        assert adv.tolist() == [0] * 6 and st["zero_spread"] == 2 and st["zero_spread_frac"] == 1.0


@pytest.mark.parametrize("scale", ["group", "batch", "none"])
def test_advantages_match_loop_with_group_ids(scale):
    rng = random.Random(0)
    scores = [rng.choice([None, 0.0, 0.25, 0.5, 1.0, rng.random()]) for _ in range(30)]
    ids = [rng.choice("abcdefg") for _ in range(30)]
    groups = {}
    for i, g in enumerate(ids):
        groups.setdefault(g, []).append(i)
    adv, st = grpo.group_advantages(scores, group_ids=ids, scale=scale, dtype=torch.float64)
    assert torch.allclose(adv, torch.tensor(loop_advantages(scores, list(groups.values()), scale), dtype=torch.float64))
    assert st["groups"] == len(groups) and st["failed"] == sum(s is None for s in scores)


def test_advantages_zero_spread_is_judged_on_raw_scores():
    raw = [0.0, 0.0, 0.0]  # every revision equally wrong
    shaped = grpo.recovery_rewards([0.2, 0.6, 1.0], raw)  # differ only through the first turn
    adv, st = grpo.group_advantages(shaped, group_size=3)
    assert adv.abs().max() > 0.5  # on the shaped reward: unit-size advantages from nothing
    adv, st = grpo.group_advantages(shaped, group_size=3, raw_scores=raw)
    assert adv.tolist() == [0, 0, 0] and st["zero_spread"] == 1


def test_advantages_errors():
    with pytest.raises(ValueError, match="group_size"):
        grpo.group_advantages([1.0, 0.0, 1.0], group_size=2)
    with pytest.raises(ValueError, match="exactly one"):
        grpo.group_advantages([1.0, 0.0])
    with pytest.raises(ValueError, match="scale"):
        grpo.group_advantages([1.0, 0.0], group_size=2, scale="std")


# ----------------------------------------------------------------------------------------------------------------
# recovery shaping


def test_recovery_rewards():
    assert grpo.recovery_rewards(0.4, 0.8) == pytest.approx(0.8 + 0.5 * 0.4)
    assert grpo.recovery_rewards(0.8, 0.4) == pytest.approx(0.4 - 0.5 * 0.4)  # falls are penalised
    assert grpo.recovery_rewards(0.2, 0.6, coef=1.0) == pytest.approx(1.0)
    assert grpo.recovery_rewards([0.0, None, 0.5], [1.0, 0.5, None]) == [1.5, 0.5, None]


# ----------------------------------------------------------------------------------------------------------------
# KL


def test_kl_values_by_hand():
    logp, ref = torch.tensor([-1.0, -0.5, -2.0]), torch.tensor([-2.0, -0.5, -1.0])
    d = [-1.0, 0.0, 1.0]  # ref - logp
    assert torch.allclose(grpo.kl(logp, ref, "k3"), torch.tensor([math.exp(x) - x - 1 for x in d]))
    assert torch.allclose(grpo.kl(logp, ref, "k1"), torch.tensor([1.0, 0.0, -1.0]))
    assert torch.allclose(grpo.kl(logp, ref, "k2"), torch.tensor([0.5, 0.0, 0.5]))
    assert (grpo.kl(torch.randn(100), torch.randn(100), "k3") >= 0).all()
    with pytest.raises(ValueError, match="kind"):
        grpo.kl(logp, ref, "k4")


def test_k3_gradient():
    logp = torch.tensor([-1.0, -0.5, -2.0], dtype=torch.float64, requires_grad=True)
    ref = torch.tensor([-2.0, -0.5, -1.0], dtype=torch.float64)
    grpo.kl(logp, ref, "k3").sum().backward()
    expected = [1 - math.exp(r - l) for l, r in [(-1.0, -2.0), (-0.5, -0.5), (-2.0, -1.0)]]  # d/dlogp = 1 - ref/pi
    assert torch.allclose(logp.grad, torch.tensor(expected, dtype=torch.float64))


# ----------------------------------------------------------------------------------------------------------------
# policy loss: values, aggregations, gradients


def loop_loss(logp, old, adv, mask, el, eh, agg, norm, ref=None, beta=0.0):
    """Plain-loop reference of policy_loss (per-sequence advantages, k3 KL)."""
    B, L = len(logp), len(logp[0])
    total = 0.0
    for b in range(B):
        seq, n = 0.0, 0
        for t in range(L):
            if not mask[b][t]:
                continue
            r = math.exp(logp[b][t] - old[b][t])
            rc = min(max(r, 1 - el), 1 + eh)
            x = -min(r * adv[b], rc * adv[b])
            if ref is not None:
                d = ref[b][t] - logp[b][t]
                x += beta * (math.exp(d) - d - 1)
            seq += x
            n += 1
        total += seq / max(n, 1) if agg == "seq" else seq
    return total / norm


def random_batch(B=4, L=7, seed=0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    logp = -torch.rand(B, L, generator=g, dtype=dtype) * 3
    old = logp + 0.4 * torch.randn(B, L, generator=g, dtype=dtype)  # ratios well outside [0.8, 1.2] too
    ref = logp + 0.3 * torch.randn(B, L, generator=g, dtype=dtype)
    adv = torch.randn(B, generator=g, dtype=dtype)
    lengths = torch.tensor([L, 3, 5, 1][:B])
    mask = grpo.span_mask(1, lengths, L + 1)
    return logp, old, ref, adv, mask


@pytest.mark.parametrize("agg", ["token", "seq", "const"])
def test_policy_loss_matches_loop(agg):
    logp, old, ref, adv, mask = random_batch()
    norm = {"token": mask.sum().item(), "seq": 4, "const": 4 * 7}[agg]
    assert grpo.loss_normalizer([mask[:1], mask[1:]], agg, max_tokens=7) == norm
    loss, st = grpo.policy_loss(logp, adv, mask, LossSettings(eps_high=0.28, agg=agg, beta=0.1), norm,
                                Against(old=old, ref=ref))
    expected = loop_loss(logp.tolist(), old.tolist(), adv.tolist(), mask.tolist(), 0.2, 0.28, agg, norm,
                         ref.tolist(), 0.1)
    assert loss.item() == pytest.approx(expected, rel=1e-12)
    assert (st["pg"] + st["kl_loss"]).item() == pytest.approx(expected, rel=1e-12)


def test_policy_loss_stats_by_hand():
    logp = torch.log(torch.tensor([[1.0, 1.5, 0.5, 1.1]]))  # old_logp = 0 -> ratios 1, 1.5, 0.5, 1.1
    old = torch.zeros(1, 4)
    mask = torch.ones(1, 4, dtype=torch.bool)
    _, st = grpo.policy_loss(logp, torch.tensor([[1.0, 1.0, -1.0, -1.0]]), mask, against=Against(old=old))
    assert st["clip_high"].item() == pytest.approx(0.25)  # ratio 1.5 with A > 0
    assert st["clip_low"].item() == pytest.approx(0.25)  # ratio 0.5 with A < 0
    assert st["ratio_mean"].item() == pytest.approx((1 + 1.5 + 0.5 + 1.1) / 4)
    assert st["tokens"].item() == 4
    # the share of tokens whose ratio left [0.9, 1.1]: 1.5 and 0.85 of the three unmasked ones (the masked 3.0 not)
    logp = torch.log(torch.tensor([[1.5, 0.85, 1.05, 3.0]]))
    _, st = grpo.policy_loss(logp, torch.ones(1, 4), torch.tensor([[True, True, True, False]]), against=Against(old=old))
    assert st["ratio_outside"].item() == pytest.approx(2 / 3)


def test_aggregations_agree_on_equal_lengths_and_differ_otherwise():
    B, L = 3, 5
    g = torch.Generator().manual_seed(1)
    logp = -torch.rand(B, L, generator=g, dtype=torch.float64)
    adv = torch.tensor([1.0, -0.5, 2.0], dtype=torch.float64)
    full = torch.ones(B, L, dtype=torch.bool)
    losses = [grpo.policy_loss(logp, adv, full, LossSettings(agg=a, max_tokens=L))[0].item() for a in ("token", "seq", "const")]
    assert losses[0] == pytest.approx(losses[1]) and losses[0] == pytest.approx(losses[2])
    # lengths 1 and 3, per-token loss -A (on-policy, ratio 1): A = (2, 1)
    adv = torch.tensor([2.0, 1.0], dtype=torch.float64)
    mask = grpo.span_mask(1, torch.tensor([1, 3]), 4)
    lp = torch.zeros(2, 3, dtype=torch.float64)
    token = grpo.policy_loss(lp, adv, mask, LossSettings(agg="token"))[0].item()
    seq = grpo.policy_loss(lp, adv, mask, LossSettings(agg="seq"))[0].item()
    const = grpo.policy_loss(lp, adv, mask, LossSettings(agg="const", max_tokens=3))[0].item()
    assert token == pytest.approx(-(2 * 1 + 1 * 3) / 4)  # every token weighs the same
    assert seq == pytest.approx(-(2 + 1) / 2)  # every sequence weighs the same: short ones' tokens weigh more
    assert const == pytest.approx(-(2 * 1 + 1 * 3) / (3 * 2))  # sum over a constant budget


def test_per_token_advantages_equal_broadcast_per_sequence():
    logp, old, ref, adv, mask = random_batch()
    a = grpo.policy_loss(logp, adv, mask, LossSettings(beta=0.05), against=Against(old=old, ref=ref))[0]
    b = grpo.policy_loss(logp, adv[:, None].expand_as(logp), mask, LossSettings(beta=0.05),
                         against=Against(old=old, ref=ref))[0]
    assert torch.allclose(a, b)


@pytest.mark.parametrize("agg", ["token", "seq", "const"])
def test_on_policy_gradient_is_reinforce(agg):
    logp0, _, _, adv, mask = random_batch()
    logp = logp0.clone().requires_grad_(True)
    norm = grpo.loss_normalizer([mask], agg, max_tokens=7)
    loss, st = grpo.policy_loss(logp, adv, mask, LossSettings(agg=agg), norm)
    loss.backward()
    w = mask.double()
    if agg == "seq":
        w = w / mask.sum(-1, keepdim=True)  # each sequence's tokens share its weight
    assert torch.allclose(logp.grad, -adv[:, None] * w / norm, atol=1e-12)  # -sum A grad(logp) / normaliser
    assert st["ratio_mean"].item() == 1.0


def test_on_policy_model_gradient_is_reinforce():
    model = ToyLM()
    ids = torch.randint(0, 23, (3, 9), generator=torch.Generator().manual_seed(0))
    mask = grpo.span_mask(4, torch.tensor([5, 3, 2]), 9)
    adv = torch.tensor([0.5, -1.0, 2.0], dtype=torch.float64)
    loss, _ = grpo.policy_loss(token_logprobs(model, ids, chunk=4), adv, mask)
    assert loss.item() == pytest.approx(-(0.5 * 5 - 1.0 * 3 + 2.0 * 2) / 10)  # the value is just -mean(A)...
    g1 = torch.autograd.grad(loss, list(model.parameters()))
    lp = naive_logprobs(model, ids)
    surrogate = -(adv[:, None] * lp * mask).sum() / mask.sum()
    g2 = torch.autograd.grad(surrogate, list(model.parameters()))
    for a, b in zip(g1, g2):
        assert torch.allclose(a, b, atol=1e-12)
    assert max(a.abs().max() for a in g1) > 1e-3  # ...but the gradient is REINFORCE's


def test_clipped_region_has_zero_gradient():
    el, eh = 0.2, 0.28
    ratios = torch.tensor([[1.5, 0.5, 1.1, 0.9, 0.5, 1.5]], dtype=torch.float64)
    adv = torch.tensor([[1.0, -1.0, 1.0, -1.0, 1.0, -1.0]], dtype=torch.float64)
    old = torch.zeros_like(ratios)
    logp = ratios.log().requires_grad_(True)
    loss, _ = grpo.policy_loss(logp, adv, torch.ones_like(ratios, dtype=torch.bool), LossSettings(eps_low=el, eps_high=eh),
                                normalizer=1.0, against=Against(old=old))
    loss.backward()
    # clipped: (1.5, A>0) and (0.5, A<0) -> 0; inside the range: -A r; PPO's min keeps the unclipped side
    # for (0.5, A>0) and (1.5, A<0), which are pessimistic and keep their gradient
    expected = [0.0, 0.0, -1.1, 0.9, -0.5, 1.5]
    assert torch.allclose(logp.grad, torch.tensor([expected], dtype=torch.float64))


@pytest.mark.parametrize("kind", ["grpo", "gspo", "gspo-token", "cispo"])
@pytest.mark.parametrize("agg", ["token", "seq", "const"])
def test_micro_batch_invariance(agg, kind):
    """The gradient accumulated over micro-batches of 1, 2, 4 sequences equals the full-batch one (fp64), for every
    objective of the menu (tests/core/test_losses.py), mu > 1 (old log-probs off the current ones) and a KL term."""
    torch.manual_seed(0)
    model, ref_model = ToyLM(seed=1), ToyLM(seed=2)
    B, T, P = 4, 12, 4  # P: left-padded prompt width
    ids = torch.randint(0, 23, (B, T))
    attn = torch.ones(B, T, dtype=torch.long)
    attn[1, :2] = 0  # left padding of shorter prompts
    attn[3, :3] = 0
    loss_mask = grpo.span_mask(P, torch.tensor([8, 2, 5, 1]), T)  # very different completion lengths
    adv = torch.tensor([1.0, -0.7, 0.3, 2.0], dtype=torch.float64)
    with torch.no_grad():
        old = token_logprobs(model, ids, attn) + 0.3 * torch.randn(B, T - 1, dtype=torch.float64)
        ref = token_logprobs(ref_model, ids, attn)

    def grads(mb):
        model.zero_grad()
        chunks = [slice(i, i + mb) for i in range(0, B, mb)]
        norm = grpo.loss_normalizer([loss_mask[c] for c in chunks], agg, max_tokens=T - P)
        for c in chunks:
            logp = token_logprobs(model, ids[c], attn[c], chunk=3)
            loss, _ = grpo.policy_loss(logp, adv[c], loss_mask[c], LossSettings(kind, 0.2, 0.28, agg, beta=0.1), norm,
                                       Against(old=old[c], ref=ref[c]))
            loss.backward()
        return [p.grad.clone() for p in model.parameters()]

    full = grads(B)
    assert max(g.abs().max() for g in full) > 1e-3
    for mb in (1, 2):
        for a, b in zip(full, grads(mb)):
            assert (a - b).abs().max() <= 1e-6


def test_loss_normalizer_errors_and_empty_step():
    m = torch.zeros(2, 3, dtype=torch.bool)
    with pytest.raises(ValueError, match="max_tokens"):
        grpo.loss_normalizer([m], "const")
    with pytest.raises(ValueError, match="agg"):
        grpo.loss_normalizer([m], "mean")
    logp = torch.zeros(2, 3, requires_grad=True)
    loss, _ = grpo.policy_loss(logp, torch.ones(2), m)
    loss.backward()
    assert loss.item() == 0 and logp.grad.abs().sum() == 0


# ----------------------------------------------------------------------------------------------------------------
# 5. masks by position


def test_span_mask_by_hand():
    m = grpo.span_mask(torch.tensor([2, 3]), torch.tensor([3, 1]), 6)
    # column t scores ids position t+1: row 0 trains positions 2,3,4 -> columns 1,2,3
    assert m.int().tolist() == [[0, 1, 1, 1, 0], [0, 0, 1, 0, 0]]
    with pytest.raises(ValueError, match="starts"):
        grpo.span_mask(0, 2, 5)


def test_prompt_and_critique_tokens_never_trained():
    # multi-turn row: prompt [0, 4) | answer [4, 7) | injected critique [7, 10) | revision [10, 13) | pad
    T = 15
    ans, rev = grpo.span_mask(4, 3, T), grpo.span_mask(10, 3, T)
    mask = ans | rev
    adv = 0.5 * ans + (-1.5) * rev  # (1, T-1): each turn's tokens carry their own turn's advantage
    logp = torch.randn(1, T - 1, dtype=torch.float64, requires_grad=True)
    with torch.no_grad():
        logp[0, :3] = float("nan")  # junk at masked columns must not leak into the loss
    loss, _ = grpo.policy_loss(logp, adv.double(), mask)
    loss.backward()
    assert torch.isfinite(loss)
    g = logp.grad[0]
    trained = [t + 1 for t in range(T - 1) if g[t] != 0]  # ids positions that received a gradient
    assert trained == [4, 5, 6, 10, 11, 12]
    assert torch.allclose(g[3:6], torch.full((3,), -0.5 / 6, dtype=torch.float64))
    assert torch.allclose(g[9:12], torch.full((3,), 1.5 / 6, dtype=torch.float64))
