"""
The loss menu of grpo.policy_loss (minigrpo/losses.py): GSPO, GSPO-token, CISPO, the importance-sampling correction
for a sampler that is not bit-equal to the trainer, and DAPO's soft overlong punishment. Every expected value and
gradient is computed by hand or with a plain loop. How train.py passes the loss flags on:
tests/scripts/test_train_loss_flags.py.
"""
import math

import pytest
import torch

from minigrpo import grpo
from minigrpo.grpo import Against, LossSettings
from test_grpo import random_batch

F64 = torch.float64
LOSSES = ["grpo", "gspo", "gspo-token", "cispo"]


def rows(deltas, dtype=F64):
    """(logp, old, mask) with logp = 0 and old = -delta, so that each token's log-ratio is delta; rows of
    different lengths are right-padded (masked)."""
    L = max(len(d) for d in deltas)
    old = torch.zeros(len(deltas), L, dtype=dtype)
    mask = torch.zeros(len(deltas), L, dtype=torch.bool)
    for i, d in enumerate(deltas):
        old[i, :len(d)] = -torch.tensor(d, dtype=dtype)
        mask[i, :len(d)] = True
    return torch.zeros(len(deltas), L, dtype=dtype, requires_grad=True), old, mask


# ----------------------------------------------------------------------------------------------------------------
# GSPO: one ratio per sequence, the geometric mean of its token ratios


def test_gspo_value_and_gradient_by_hand():
    # mean log-ratios 0.02, 0.1, -0.1 -> s = e^0.02 (clipped high, A > 0), e^0.1 (A < 0: pessimistic side kept),
    # e^-0.1 (clipped low, A < 0); eps_low != eps_high, so a swapped clip shows
    logp, old, mask = rows([[0.1, -0.05, 0.01], [0.3, -0.1], [-0.1, -0.1]])
    adv = torch.tensor([1.0, -1.0, -1.0], dtype=F64)
    loss, st = grpo.policy_loss(logp, adv, mask, LossSettings("gspo", 0.02, 0.01, "seq"), against=Against(old=old))
    s1 = math.exp(0.1)
    assert loss.item() == pytest.approx((-1.01 + s1 + 0.98) / 3, rel=1e-12)  # the paper's 1/G sum_i
    loss.backward()
    # clipped rows have no gradient; row 1: d/dlogp_t of -A s / 3 = s * (1/|y|) / 3 per token
    expected = torch.tensor([[0, 0, 0], [s1 / 2 / 3, s1 / 2 / 3, 0], [0, 0, 0]], dtype=F64)
    assert torch.allclose(logp.grad, expected, atol=1e-15)
    assert st["clip_high"].item() == pytest.approx(3 / 7) and st["clip_low"].item() == pytest.approx(2 / 7)
    assert st["ratio_mean"].item() == pytest.approx((3 * math.exp(0.02) + 2 * s1 + 2 * math.exp(-0.1)) / 7)


def loop_gspo(logp, old, adv, mask, el, eh, agg, norm):
    """Plain-loop GSPO: s_i from the token mean of log-ratios, the clipped sequence term put at each token."""
    total = 0.0
    for b in range(len(logp)):
        toks = [t for t in range(len(logp[b])) if mask[b][t]]
        if not toks:
            continue
        s = math.exp(sum(logp[b][t] - old[b][t] for t in toks) / len(toks))
        term = -min(s * adv[b], min(max(s, 1 - el), 1 + eh) * adv[b])
        total += term if agg == "seq" else term * len(toks)
    return total / norm


@pytest.mark.parametrize("agg", ["token", "seq", "const"])
def test_gspo_matches_loop(agg):
    logp, old, _, adv, mask = random_batch()
    old = logp + 0.05 * (old - logp)  # sequence ratios around the small epsilons, some clipped, some not
    norm = grpo.loss_normalizer([mask], agg, max_tokens=7)
    loss, st = grpo.policy_loss(logp, adv, mask, LossSettings("gspo", 3e-4, 4e-4, agg), norm, Against(old=old))
    expected = loop_gspo(logp.tolist(), old.tolist(), adv.tolist(), mask.tolist(), 3e-4, 4e-4, agg, norm)
    assert loss.item() == pytest.approx(expected, rel=1e-12)
    assert 0 < st["clip_low"].item() + st["clip_high"].item() < 1  # the case has both clipped and free rows


def test_gspo_wants_one_advantage_per_sequence():
    logp, old, mask = rows([[0.1, 0.2]])
    with pytest.raises(ValueError, match="gspo-token"):
        grpo.policy_loss(logp, torch.ones(1, 2, dtype=F64), mask, LossSettings("gspo"), against=Against(old=old))
    with pytest.raises(ValueError, match="loss="):
        grpo.policy_loss(logp, torch.ones(1, dtype=F64), mask, LossSettings("ppo"), against=Against(old=old))


# ----------------------------------------------------------------------------------------------------------------
# GSPO-token: the value of s_i, the gradient of each token's own log-prob, per-token advantages


def test_gspo_token_value_and_gradient_by_hand():
    logp, old, mask = rows([[0.3, -0.1], [0.1, -0.05, 0.01]])  # s = e^0.1, e^0.02
    adv = torch.tensor([[2.0, -1.0, 0.0], [0.5, -3.0, 1.0]], dtype=F64)  # per token
    loss, _ = grpo.policy_loss(logp, adv, mask, LossSettings("gspo-token", 0.2, 0.05, "token"), against=Against(old=old))
    s0, s1 = math.exp(0.1), math.exp(0.02)
    # row 0: s0 > 1.05: the A = 2 token is clipped (value -1.05 * 2, no gradient), the A = -1 token is not
    expected = (-1.05 * 2 + s0 * 1.0 - s1 * 0.5 + s1 * 3.0 - s1 * 1.0) / 5
    assert loss.item() == pytest.approx(expected, rel=1e-12)
    loss.backward()
    # d/dlogp_t = -A_t s_i / 5: only the token's own log-prob, since s_i is a stop-gradient
    grad = torch.tensor([[0.0, s0, 0.0], [-0.5 * s1, 3.0 * s1, -1.0 * s1]], dtype=F64) / 5
    assert torch.allclose(logp.grad, grad, atol=1e-15)


def test_gspo_token_equals_gspo_with_sequence_advantages():
    """With one advantage per sequence and agg="seq", GSPO-token's value and gradient are GSPO's (the paper)."""
    logp0, old, _, adv, mask = random_batch(seed=3)
    old = logp0 + 0.05 * (old - logp0)
    out = {}
    for kind in ("gspo", "gspo-token"):
        logp = logp0.clone().requires_grad_(True)
        loss, _ = grpo.policy_loss(logp, adv, mask, LossSettings(kind, 3e-4, 4e-4, "seq"), against=Against(old=old))
        loss.backward()
        out[kind] = (loss.detach(), logp.grad)
    assert torch.allclose(out["gspo"][0], out["gspo-token"][0], rtol=1e-12)
    assert torch.allclose(out["gspo"][1], out["gspo-token"][1], atol=1e-14)
    assert out["gspo"][1].abs().max() > 1e-3


# ----------------------------------------------------------------------------------------------------------------
# CISPO: a clipped, stop-gradient weight on every token's log-prob


def test_cispo_value_and_gradient_by_hand():
    ratios = torch.tensor([[1.5, 0.5, 1.1, 0.9, 0.5, 1.5]], dtype=F64)
    adv = torch.tensor([[1.0, -1.0, 1.0, -1.0, 1.0, -1.0]], dtype=F64)
    logp = torch.tensor([[-0.5, -1.0, -2.0, -0.1, -0.3, -1.5]], dtype=F64, requires_grad=True)
    old = logp.detach() - ratios.log()
    loss, st = grpo.policy_loss(logp, adv, torch.ones_like(adv, dtype=torch.bool), LossSettings("cispo", 0.2, 0.28),
                                against=Against(old=old))
    w = [1.28, 0.8, 1.1, 0.9, 0.8, 1.28]  # clip(r, 0.8, 1.28), whatever A's sign
    lp = logp.detach()[0].tolist()
    assert loss.item() == pytest.approx(sum(-wi * a * l for wi, a, l in zip(w, adv[0].tolist(), lp)) / 6, rel=1e-12)
    loss.backward()
    # every token keeps a gradient, clipped or not (PPO's clip would zero tokens 0 and 1): -w A / 6
    assert torch.allclose(logp.grad, torch.tensor([[-wi * a / 6 for wi, a in zip(w, adv[0].tolist())]], dtype=F64))
    assert st["clip_high"].item() == pytest.approx(2 / 6) and st["clip_low"].item() == pytest.approx(2 / 6)


# ----------------------------------------------------------------------------------------------------------------
# every loss: REINFORCE on-policy (micro-batch invariance: tests/core/test_grpo.py, for every loss)


@pytest.mark.parametrize("kind", LOSSES)
@pytest.mark.parametrize("agg", ["token", "seq"])
def test_on_policy_gradient_is_reinforce(kind, agg):
    logp0, _, _, adv, mask = random_batch()
    logp = logp0.clone().requires_grad_(True)
    norm = grpo.loss_normalizer([mask], agg)
    loss, st = grpo.policy_loss(logp, adv, mask, LossSettings(kind, 3e-4, 4e-4, agg), norm)
    loss.backward()
    w = mask.double() / (mask.sum(-1, keepdim=True) if agg == "seq" else 1)
    assert torch.allclose(logp.grad, -adv[:, None] * w / norm, atol=1e-12)
    assert st["ratio_mean"].item() == 1.0 and st["clip_low"].item() == st["clip_high"].item() == 0.0


# ----------------------------------------------------------------------------------------------------------------
# importance-sampling correction: weight pi_old / pi_sampler


def is_case():
    """Two rows; old - sampler per token: row 0 log(3), log(0.5); row 1 0, log(1.5), log(1.2)."""
    logp, old, mask = rows([[0.0, 0.0], [0.0, 0.0, 0.0]])  # on-policy: old = logp = 0
    sampler = torch.zeros_like(old)
    sampler[0, :2] = -torch.tensor([math.log(3), math.log(0.5)], dtype=F64)
    sampler[1, :3] = -torch.tensor([0.0, math.log(1.5), math.log(1.2)], dtype=F64)
    sampler[0, 2] = 123.0  # junk at a masked position must not enter a sequence's product
    return logp, mask, sampler, torch.tensor([1.0, -2.0], dtype=F64)


@pytest.mark.parametrize("kind,level,weights", [
    ("tis", "token", [[2.0, 0.5, 0.0], [1.0, 1.5, 1.2]]),      # min(w, 2)
    ("mis", "token", [[0.0, 0.5, 0.0], [1.0, 1.5, 1.2]]),      # w > 2 dropped
    ("tis", "seq", [[1.5, 1.5, 0.0], [1.8, 1.8, 1.8]]),        # products 1.5 and 1.8, under the cap
    ("mis", "seq", [[1.5, 1.5, 0.0], [1.8, 1.8, 1.8]]),
])
def test_is_weights_by_hand(kind, level, weights):
    logp, mask, sampler, adv = is_case()
    loss, st = grpo.policy_loss(logp, adv, mask, LossSettings(agg="token", is_correction=kind, is_level=level, is_cap=2.0),
                                against=Against(sampler=sampler))
    loss.backward()
    w = torch.tensor(weights, dtype=F64)
    assert torch.allclose(logp.grad, -adv[:, None] * w / 5, atol=1e-15)  # -A w grad(logp) / tokens
    assert st["is_weight_mean"].item() == pytest.approx(w.sum().item() / 5)


@pytest.mark.parametrize("kind", ["tis", "mis"])
def test_sequence_weight_caps_the_product(kind):
    logp, mask, sampler, adv = is_case()
    sampler[1, 2] = -math.log(1.5)  # row 1's product: 1.5 * 1.5 = 2.25 > 2, though every token is under the cap
    loss, _ = grpo.policy_loss(logp, adv, mask, LossSettings(agg="token", is_correction=kind, is_level="seq", is_cap=2.0),
                               against=Against(sampler=sampler))
    loss.backward()
    w1 = 2.0 if kind == "tis" else 0.0
    assert torch.allclose(logp.grad[1], torch.full((3,), 2.0 * w1 / 5, dtype=F64))


@pytest.mark.parametrize("kind", LOSSES)
@pytest.mark.parametrize("correction,level", [("tis", "token"), ("tis", "seq"), ("mis", "token"), ("mis", "seq")])
def test_is_correction_is_an_exact_no_op_when_sampler_and_trainer_agree(kind, correction, level):
    logp0, old, ref, adv, mask = random_batch()
    old = logp0 + 0.01 * (old - logp0)
    out = []
    for corr in ("none", correction):
        logp = logp0.clone().requires_grad_(True)
        loss, _ = grpo.policy_loss(logp, adv, mask, LossSettings(kind, 0.2, 0.28, beta=0.1, is_correction=corr,
                                   is_level=level, is_cap=1.0), against=Against(old, ref, old.clone()))
        loss.backward()
        out.append((loss.detach(), logp.grad))
    assert torch.equal(out[0][0], out[1][0]) and torch.equal(out[0][1], out[1][1])


def test_is_correction_needs_the_sampler_logprobs():
    logp, mask, _, adv = is_case()
    with pytest.raises(ValueError, match="sampler"):
        grpo.policy_loss(logp, adv, mask, LossSettings(is_correction="tis"))


# ----------------------------------------------------------------------------------------------------------------
# DAPO's soft overlong punishment


def test_overlong_penalty_by_hand():
    # max_new_tokens 20, buffer 5: free up to 15 tokens, then -1/5 per token, -1 at the limit
    got = [grpo.overlong_penalty(n, 20, 5) for n in (0, 15, 16, 18, 20, 25)]
    assert got == pytest.approx([0.0, 0.0, -0.2, -0.6, -1.0, -1.0])
    assert grpo.overlong_penalty(20, 20, 0) == 0.0  # off
