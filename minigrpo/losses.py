"""
The per-token policy-gradient terms that grpo.policy_loss aggregates, one function per objective, and the
importance weight that corrects for a sampler that is not bit-equal to the trainer. Pure tensor code; the
equations, papers and defaults are in grpo.py's docstring and docs/losses.md.

Every function takes inputs already zeroed at masked positions (grpo.policy_loss does that) and returns
(per-token loss (B, T-1), ratio (B, T-1) for the stats, clipped-low (B, T-1) bool, clipped-high (B, T-1) bool).
Only the masked positions of the result are ever read.

Letters: B batch (sequences), T sequence length.
"""

import torch

LOSSES = ("grpo", "gspo", "gspo-token", "cispo")
IS_CORRECTIONS = ("none", "tis", "mis")
IS_LEVELS = ("token", "seq")


def sequence_log_ratio(logp, old, mask):
    """(B, 1) log s_i = mean over y_i's loss tokens of (logp - old): the log of GSPO's length-normalised ratio."""
    n = mask.sum(-1, keepdim=True).clamp(min=1)
    return torch.where(mask, logp - old, 0.0).sum(-1, keepdim=True) / n


def ppo_terms(ratio, adv, eps_low, eps_high):
    """PPO's pessimistic clipped surrogate -min(r A, clip(r) A) and which side removed the gradient."""
    surr = torch.minimum(ratio * adv, torch.clamp(ratio, 1.0 - eps_low, 1.0 + eps_high) * adv)
    return -surr, (ratio < 1.0 - eps_low) & (adv < 0), (ratio > 1.0 + eps_high) & (adv > 0)


def grpo_tokens(logp, old, adv, mask, eps_low, eps_high):
    """PPO/GRPO: token ratio r_t = pi / pi_old, clipped per token."""
    ratio = torch.exp(logp - old)  # (B, T-1); exactly 1 on-policy, gradient = grad(logp)
    loss, low, high = ppo_terms(ratio, adv, eps_low, eps_high)  # clipped region -> constant -> zero gradient
    return loss, ratio, low, high


def gspo_tokens(logp, old, adv, mask, eps_low, eps_high):
    """GSPO: one ratio per sequence, s_i = exp(mean_t(logp - old)), clipped at sequence level; the sequence's term
    is put at each of its tokens, so a per-sequence token mean (agg="seq") gives the paper's objective."""
    if adv.shape[-1] != 1:
        raise ValueError("loss='gspo' takes one advantage per sequence (B,); per-token "
                         "advantages need loss='gspo-token'")
    s = torch.exp(sequence_log_ratio(logp, old, mask))  # (B, 1); its gradient reaches every token of the row
    loss, low, high = ppo_terms(s, adv, eps_low, eps_high)
    shape = logp.shape
    return loss.expand(shape), s.expand(shape), low.expand(shape), high.expand(shape)


def gspo_token_tokens(logp, old, adv, mask, eps_low, eps_high):
    """GSPO-token: s_i,t = sg[s_i] * pi(y_t) / sg[pi(y_t)]: the value of s_i at every token, the gradient of the
    token's own log-prob, so that each token can carry its own advantage."""
    s_seq = torch.exp(sequence_log_ratio(logp, old, mask)).detach()  # (B, 1)
    ratio = s_seq * torch.exp(logp - logp.detach())  # (B, T-1); value s_i, d/dlogp_t = s_i
    loss, low, high = ppo_terms(ratio, adv.expand_as(logp), eps_low, eps_high)
    return loss, ratio, low, high


def cispo_tokens(logp, old, adv, mask, eps_low, eps_high):
    """CISPO: -sg[clip(r_t, 1 - eps_low, 1 + eps_high)] * A * logp_t. The clipped weight carries no gradient, so
    no token ever loses its gradient to the clip (PPO's clip zeroes it); clipping only bounds the weight."""
    ratio = torch.exp(logp - old).detach()
    weight = torch.clamp(ratio, 1.0 - eps_low, 1.0 + eps_high)
    adv = adv.expand_as(logp)
    return -weight * adv * logp, ratio, ratio < 1.0 - eps_low, ratio > 1.0 + eps_high


TOKEN_TERMS = {"grpo": grpo_tokens, "gspo": gspo_tokens, "gspo-token": gspo_token_tokens, "cispo": cispo_tokens}


def policy_tokens(kind, logp, old, adv, mask, eps_low, eps_high):
    if kind not in TOKEN_TERMS:
        raise ValueError(f"loss={kind!r}; use one of {', '.join(LOSSES)}")
    return TOKEN_TERMS[kind](logp, old, adv, mask, eps_low, eps_high)


def is_weights(old, sampler_logp, mask, kind="tis", level="token", cap=2.0):
    """
    Detached importance weight of the trainer's behaviour policy over the sampler's, pi_old / pi_sampler, per
    token ("token") or per sequence ("seq": the product over the sequence's loss tokens, one weight broadcast over
    its tokens). "tis" truncates it at cap (min(w, cap)); "mis" masks it (w where w <= cap, else 0: that token or
    sequence is dropped from the gradient; the step's normaliser still counts it). Returns (B, T-1) or (B, 1).
    When the two policies agree exactly, w = exp(0) = 1 everywhere, and a cap >= 1 leaves it 1: an exact no-op.
    """
    if level not in IS_LEVELS:
        raise ValueError(f"is_level={level!r}; use 'token' or 'seq'")
    d = torch.where(mask, old - sampler_logp, 0.0).detach()
    if level == "seq":
        d = d.sum(-1, keepdim=True)  # log of the sequence's ratio; exp may overflow to inf: both caps handle it
    w = torch.exp(d)
    if kind == "tis":
        return torch.clamp(w, max=cap)
    if kind == "mis":
        return torch.where(w <= cap, w, 0.0)
    raise ValueError(f"is_correction={kind!r}; use one of {', '.join(IS_CORRECTIONS)}")
