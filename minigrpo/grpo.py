"""
The GRPO math, pure tensor code: group-relative advantages (and the zero-spread test DAPO's dynamic sampling
uses), the recovery shaping of a two-turn rollout, position-built loss masks, the per-token KL estimators, the
step's loss normaliser, the policy loss of one micro-batch with its statistics, and DAPO's soft overlong penalty.
The log-probs it takes come from minigrpo/logprobs.py (`token_logprobs`); the per-token terms of each objective
from minigrpo/losses.py.

Every choice the loss makes (advantage scale, KL estimator, ratio and clip, objective, importance-sampling
correction, aggregation) and its default is described in docs/losses.md; `LossSettings` holds the choices of a run.

Letters: B batch (sequences), T sequence length, V vocabulary (embedding rows), H hidden size, N scores.
"""

import math
from dataclasses import dataclass

import torch

from minigrpo import losses

# ----------------------------------------------------------------------------------------------------------------
# advantages and reward shaping


def _group_index(n, group_size, group_ids):
    """List of groups, each a list of indices into the N scores."""
    if (group_size is None) == (group_ids is None):
        raise ValueError("pass exactly one of group_size= or group_ids=")
    if group_size is not None:
        if group_size < 1 or n % group_size:
            raise ValueError(f"{n} scores do not split into groups of group_size={group_size}")
        return [list(range(i, i + group_size)) for i in range(0, n, group_size)]
    ids = group_ids.tolist() if torch.is_tensor(group_ids) else list(group_ids)
    if len(ids) != n:
        raise ValueError(f"{len(ids)} group_ids for {n} scores")
    groups = {}  # insertion order = order of first appearance
    for i, g in enumerate(ids):
        groups.setdefault(g, []).append(i)
    return list(groups.values())


def _as_list(scores):
    """Scores as a list of float | None (a NaN in a tensor counts as None)."""
    vals = scores.tolist() if torch.is_tensor(scores) else list(scores)
    return [None if v is None or (isinstance(v, float) and math.isnan(v)) else float(v) for v in vals]


def has_spread(scores, raw_scores) -> bool:
    """Whether one group carries a signal: two or more valid scores (not None), whose raw scores are not all equal.
    group_advantages gives the others advantage 0; DAPO's dynamic sampling (train.py) drops their prompts."""
    valid = [r for sc, r in zip(scores, raw_scores) if sc is not None]
    rv = [r for r in valid if r is not None]
    return len(valid) >= 2 and bool(rv) and max(rv) - min(rv) > 0.0


def group_advantages(scores, group_size=None, group_ids=None, scale="group", eps=1e-6, raw_scores=None,
                     dtype=torch.float32):
    """
    Group-relative advantages. scores: N rewards (list with None for failed scoring, or a 1-D tensor with NaN),
    grouped either by consecutive blocks of group_size or by group_ids (any hashable per score). raw_scores: the
    unshaped task scores used for the zero-spread test (default: scores). Returns (advantages (N,), stats).
    """
    if scale not in ("group", "batch", "none"):
        raise ValueError(f"scale={scale!r}; use 'group', 'batch' or 'none'")
    s = _as_list(scores)
    raw = s if raw_scores is None else _as_list(raw_scores)
    if len(raw) != len(s):
        raise ValueError(f"{len(raw)} raw_scores for {len(s)} scores")
    adv = [0.0] * len(s)
    zero_spread = 0
    for idx in _group_index(len(s), group_size, group_ids):
        valid = [i for i in idx if s[i] is not None]  # a failed score is neither baseline nor trained
        if not has_spread([s[i] for i in idx], [raw[i] for i in idx]):
            zero_spread += 1  # nothing to compare against: no signal, advantage stays 0
            continue
        mean = sum(s[i] for i in valid) / len(valid)
        std = math.sqrt(sum((s[i] - mean) ** 2 for i in valid) / (len(valid) - 1))
        for i in valid:
            adv[i] = (s[i] - mean) / (std + eps) if scale == "group" else s[i] - mean
    if scale == "batch":
        # std of the centred values over every valid score of the batch (zero-spread groups count as 0)
        centred = [adv[i] for i in range(len(s)) if s[i] is not None]
        m = sum(centred) / max(len(centred), 1)
        std = math.sqrt(sum((a - m) ** 2 for a in centred) / max(len(centred) - 1, 1))
        adv = [a / (std + eps) for a in adv]
    valid_all = [v for v in s if v is not None]
    n_groups = len(_group_index(len(s), group_size, group_ids))
    stats = {
        "groups": n_groups,
        "zero_spread": zero_spread,
        "zero_spread_frac": zero_spread / max(n_groups, 1),
        "failed": len(s) - len(valid_all),
        "score_mean": sum(valid_all) / len(valid_all) if valid_all else float("nan"),
    }
    return torch.tensor(adv, dtype=dtype), stats


def recovery_rewards(s_prev, s, coef=0.5):
    """
    Per-turn recovery shaping of the soyuz run: turn-2 reward = s + coef * (s - s_prev), i.e. the score plus a
    bonus for the climb from the previous turn (a fall is penalised the same way). Works on one pair of floats or
    on two equal-length lists; None (a failed judge call) in s gives None; None in s_prev gives s unshaped.

    Why the zero-spread test and any group filter must use the RAW score s, not this shaped reward: in a group
    where every revision is equally wrong (s = 0 for all), the shaped rewards still differ by -coef * s_prev, and
    the z-score blows that difference up to unit-size advantages: the revision tokens get trained on noise that
    only reflects how good the first answer happened to be. Pass raw_scores=s to group_advantages.

    Reward hacking: the bonus pays for a low s_prev, so a policy can learn to answer badly first and climb. The
    guard: the first turn's tokens are trained only on their own raw score, never on this shaped reward
    (minigrpo/tasks/twoturn.py; --no-turn0-guard takes it away).
    """
    if isinstance(s, (list, tuple)):
        if len(s) != len(s_prev):
            raise ValueError(f"{len(s_prev)} previous scores for {len(s)} scores")
        return [recovery_rewards(p, x, coef) for p, x in zip(s_prev, s)]
    if s is None:
        return None
    if s_prev is None:
        return float(s)
    return float(s + coef * (s - s_prev))


# ----------------------------------------------------------------------------------------------------------------
# masks (by position, never by token id)


def span_mask(starts, lengths, T):
    """
    (B, T-1) bool loss mask that trains the tokens at ids positions [start, start + length) of each row. Column t
    of a log-prob tensor scores ids[:, t+1], so token position p lives in column p-1 (start must be >= 1: the first
    token of a sequence is never predicted). Build a completion mask with starts = the (left-padded) prompt width;
    OR several spans for multi-turn rollouts (injected critique text between them stays untrained).
    """
    starts = torch.as_tensor(starts).reshape(-1, 1)  # (B, 1) or (1, 1) for one shared start
    lengths = torch.as_tensor(lengths).reshape(-1, 1)  # (B, 1)
    if (starts < 1).any():
        raise ValueError("a span starts at position 0, whose token no column predicts; starts must "
                         "be >= 1")
    pos = torch.arange(1, T, device=starts.device).unsqueeze(0)  # (1, T-1): the ids position each column scores
    return (pos >= starts) & (pos < starts + lengths)  # (B, T-1)


def masked_mean(x, mask):
    """Mean of x over mask (0 when the mask is empty); masked entries never enter, even if non-finite."""
    mask = mask.bool()
    return torch.where(mask, x, 0.0).sum() / mask.sum().clamp(min=1)


# ----------------------------------------------------------------------------------------------------------------
# KL and the policy loss


def kl(logp, ref_logp, kind="k3"):
    """Per-token estimate of KL(pi || ref) from samples of pi: k1, k2 or k3 (Schulman's estimators)."""
    d = ref_logp - logp  # log(ref / pi) at the sampled token
    if kind == "k3":
        return torch.exp(d) - d - 1.0  # >= 0; d/dlogp = 1 - ref/pi
    if kind == "k1":
        return -d
    if kind == "k2":
        return 0.5 * d * d
    raise ValueError(f"kind={kind!r}; use 'k3', 'k1' or 'k2'")


def loss_normalizer(loss_masks, agg="token", max_tokens=None):
    """
    The denominator of one optimizer step, from the loss masks of ALL its micro-batches (iterable of (b, T-1)):
    "token" -> number of loss tokens, "seq" -> number of sequences with at least one loss token, "const" ->
    max_tokens x number of sequences (Dr. GRPO: e.g. max_tokens = max_new_tokens). Returns a float.
    """
    masks = [m.bool() for m in loss_masks]
    if agg == "token":
        return float(sum(int(m.sum()) for m in masks))
    if agg == "seq":
        return float(sum(int(m.any(dim=-1).sum()) for m in masks))
    if agg == "const":
        if max_tokens is None:
            raise ValueError("agg='const' needs max_tokens= (e.g. the max_new_tokens of "
                             "sampling)")
        return float(max_tokens * sum(m.size(0) for m in masks))
    raise ValueError(f"agg={agg!r}; use 'token', 'seq' or 'const'")


def _aggregate(per_token, mask, agg, normalizer):
    """Sum the masked per-token values the way agg says and divide by the step's normalizer."""
    x = torch.where(mask, per_token, 0.0)  # (B, T-1)
    if agg == "seq":
        x = x.sum(-1) / mask.sum(-1).clamp(min=1)  # (B,) per-sequence mean
    return x.sum() / normalizer


@dataclass(frozen=True)
class LossSettings:
    """A run's loss choices (docs/losses.md), fixed for the run. The defaults are train.py's flags' (run/flags.py;
    a test holds them equal): GRPO's token-level clip with DAPO's higher upper epsilon, no KL."""
    loss: str = "grpo"              # the objective: "grpo" | "gspo" | "gspo-token" | "cispo"
    eps_low: float = 0.2            # that objective's clip: [1 - eps_low, 1 + eps_high]
    eps_high: float = 0.28          # DAPO's clip-higher (PPO's symmetric clip is 0.2)
    agg: str = "token"              # "token" | "seq" | "const": how the step's terms are summed (loss_normalizer)
    max_tokens: int | None = None   # "const"'s tokens per sequence (the sampler's max_new_tokens)
    beta: float = 0.0               # the KL term's coefficient
    kl_kind: str = "k3"             # "k1" | "k2" | "k3" (kl)
    is_correction: str = "none"     # "none" | "tis" | "mis": weigh the policy term by pi_old / pi_sampler
    is_level: str = "token"         # that weight per "token" or per "seq"
    is_cap: float = 2.0             # its cap


@dataclass(frozen=True)
class Against:
    """The log-probs of the same tokens (B, T-1) that the policy's are compared against, each optional: the policy
    that sampled the batch as this trainer computes it (None = on-policy: ratio 1, REINFORCE's gradient), the
    frozen reference of the KL term (None = no KL), and the sampler's own (for the importance-sampling correction)."""
    old: torch.Tensor | None = None
    ref: torch.Tensor | None = None
    sampler: torch.Tensor | None = None


def policy_loss(logp, advantages, loss_mask, settings=LossSettings(), normalizer=None, against=Against()):
    """
    The policy-gradient loss of one micro-batch plus beta * KL, aggregated by settings.agg over the step's
    normalizer (from `loss_normalizer` over every micro-batch of the step; None = this call is the whole step).
    logp, loss_mask: (B, T-1). advantages: (B,) one per sequence (what train.py passes), or (B, T-1) one per token.
    Returns (loss, stats) with stats from `loss_stats`.
    """
    s, mask = settings, loss_mask.bool()
    if normalizer is None:
        normalizer = loss_normalizer([mask], s.agg, s.max_tokens)
    if normalizer <= 0:
        normalizer = 1.0  # a step with no loss tokens: the loss is 0 and so is its gradient
    adv = advantages.to(logp.dtype)
    if adv.dim() == 1:
        adv = adv.unsqueeze(-1)  # (B, 1) broadcasts over the sequence
    # zero every input at masked positions first: junk there (pads) then gets neither a value nor a NaN gradient
    logp = torch.where(mask, logp, 0.0)
    old = logp.detach() if against.old is None else torch.where(mask, against.old, 0.0)
    pg_tok, ratio, clipped_low, clipped_high = losses.policy_tokens(s.loss, logp, old, adv, mask, s.eps_low,
                                                                    s.eps_high)
    w = None
    if s.is_correction != "none":
        if against.sampler is None:
            raise ValueError(f"is_correction={s.is_correction!r} needs Against(sampler=)")
        w = losses.is_weights(old, against.sampler.to(logp.dtype), mask, s.is_correction, s.is_level, s.is_cap)
        pg_tok = pg_tok * w
    pg = _aggregate(pg_tok, mask, s.agg, normalizer)
    total, kl_tok, kl_loss = pg, None, None
    if against.ref is not None:
        kl_tok = kl(logp, torch.where(mask, against.ref, 0.0), s.kl_kind)  # (B, T-1)
        kl_loss = s.beta * _aggregate(kl_tok, mask, s.agg, normalizer)
        total = total + kl_loss
    return total, loss_stats(mask, pg, ratio, (clipped_low, clipped_high), w, (kl_tok, kl_loss))


@torch.no_grad()
def loss_stats(mask, pg, ratio, clipped, is_weight=None, kl_terms=(None, None)) -> dict:
    """The statistics of one micro-batch's loss, detached 0-d tensors: "pg" and "kl_loss" are its share of the
    step's terms (sum them over micro-batches); "is_weight_mean", "kl", "ratio_mean", "ratio_outside", "clip_low",
    "clip_high" are token means over it (weigh by "tokens" to combine). `clipped`: (low, high) bool tensors, the
    tokens whose term the clip changed; `kl_terms`: (per-token KL, the KL loss), None without a reference."""
    dtype = pg.dtype
    stats = {}
    if is_weight is not None:
        stats["is_weight_mean"] = masked_mean(is_weight.expand_as(mask), mask)
    kl_tok, kl_loss = kl_terms
    if kl_tok is not None:
        stats["kl"] = masked_mean(kl_tok.detach(), mask)
        stats["kl_loss"] = kl_loss.detach()
    stats["pg"] = pg.detach()
    stats["ratio_mean"] = masked_mean(ratio.detach(), mask)
    # the tail a mean hides: the share of tokens whose ratio left [0.9, 1.1] (mu > 1, or a drifting sampler)
    r = ratio.detach().expand_as(mask)
    stats["ratio_outside"] = masked_mean(((r < 0.9) | (r > 1.1)).to(dtype), mask)
    stats["clip_low"] = masked_mean(clipped[0].to(dtype), mask)
    stats["clip_high"] = masked_mean(clipped[1].to(dtype), mask)
    stats["tokens"] = mask.sum()
    return stats


def overlong_penalty(length, max_new_tokens, buffer):
    """DAPO's soft overlong punishment of a completion of `length` tokens: 0 up to max_new_tokens - buffer, then
    linear down to -1 at max_new_tokens (and -1 past it); buffer 0 = off."""
    if buffer <= 0:
        return 0.0
    free = max_new_tokens - buffer  # the longest completion that is not punished
    if length <= free:
        return 0.0
    return max((free - length) / buffer, -1.0)
