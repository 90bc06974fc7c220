"""
The GRPO math: group advantages, recovery shaping, KL, the policy loss and its aggregations.
Pure tensor code. The log-probs it takes come from minigrpo/logprobs.py (`token_logprobs`).

Every choice an implementation makes, with the default used here (each is a named argument):

- Advantage (`group_advantages`, scale=): "group" (default) is the GRPO z-score inside each group,
  (s - mean_g) / (std_g + eps), std with Bessel's correction (as TRL and verl compute it); "none" is the mean-only
  Dr. GRPO form s - mean_g (no std, so easy or hard groups are not up-weighted); "batch" centres by the group mean
  and divides by the std of those centred values over the whole batch.
- Zero-spread groups (every valid score equal, incl. single-sample groups) carry no signal: advantage 0, counted
  in the stats. The test runs on the raw task score (`raw_scores=`), never on a shaped reward (see
  `recovery_rewards`).
- A reward of None (failed judge call) is left out of its group's mean and std and gets advantage 0; counted.
- KL to the reference (`kl`, kind=): "k3" (default) = exp(ref - logp) - (ref - logp) - 1 per token, >= 0, unbiased
  for KL(pi || ref) under samples of pi but its gradient is biased; "k1" = logp - ref; "k2" = (logp - ref)^2 / 2.
  It enters the LOSS (beta * kl added per token, aggregated like the policy term), not the reward, so it does not
  leak into advantages of other samples.
- Ratio and clip (`policy_loss`): ratio = exp(logp - old_logp). With one update per batch (mu = 1) pass
  old_logp=None: old_logp = logp.detach(), the ratio is exactly 1 and the gradient is REINFORCE's -A * grad(logp).
  With several updates per batch, PPO's clipped surrogate min(r*A, clip(r, 1-eps_low, 1+eps_high)*A); default
  eps_low = eps_high = 0.2; eps_high = 0.28 is DAPO's "clip-higher" against entropy collapse. old_logp must come
  from this trainer's `token_logprobs` at the sampling temperature (not from a top-p/top-k truncated sampler
  distribution, which is a different policy: train.py refuses to train on truncated samples).
- The objective (`policy_loss`, loss=; the per-token terms live in minigrpo/losses.py), r_t = pi(y_t) / pi_old(y_t):
    "grpo"       (default) -min(r_t A, clip(r_t, 1 - eps_low, 1 + eps_high) A) per token, as above.
    "gspo"       GSPO (Zheng et al. 2025, "Group Sequence Policy Optimization"): one ratio per sequence,
                 s_i = exp(1/|y_i| sum_t (logp_t - old_logp_t)), and -min(s_i A_i, clip(s_i, 1 - e_l, 1 + e_h) A_i)
                 with the paper's small epsilons (3e-4, 4e-4). The sequence's term stands at each of its tokens, so
                 agg="seq" is the paper's 1/G sum_i; one advantage per sequence.
    "gspo-token" GSPO-token (same paper): s_i,t = sg[s_i] pi(y_t) / sg[pi(y_t)], clipped per token like "grpo":
                 the value of s_i, the gradient of the token's own log-prob, and per-token advantages. With one
                 advantage per sequence and agg="seq" its gradient equals GSPO's.
    "cispo"      CISPO (MiniMax-M1 report 2025): -sg[clip(r_t, 1 - eps_low, 1 + eps_high)] A logp_t, token-
                 normalised (agg="token"). The weight is clipped but never removes a token's gradient; the report
                 sets no lower bound (eps_low = 1) and tunes eps_high.
  On-policy every one of them has REINFORCE's gradient (GSPO's with each sequence's tokens sharing its weight).
- Sampler-trainer mismatch (`policy_loss`, is_correction=; TIS: Yao et al. 2025, "Your efficient RL framework
  secretly brings you off-policy RL training"): each token's policy term times the detached weight
  w = pi_old / pi_sampler (old = this trainer's log-prob of the rollout; the sampler's from its own kernels),
  per token or per sequence (the product over its tokens): "tis" min(w, cap), "mis" w if w <= cap else 0 (the
  token or sequence is dropped). Off by default; an exact no-op when the two agree (w = 1, cap >= 1).
- Soft overlong punishment (`overlong_penalty`; DAPO: Yu et al. 2025): over the last `buffer` tokens before
  max_new_tokens the reward falls linearly from 0 to -1: (max_new_tokens - buffer - |y|) / buffer there, 0
  before. It is added to the reward, never to the raw score, so it cannot give a zero-spread group a gradient.
- Aggregation (`policy_loss`, agg=) and its denominator, computed ONCE per optimizer step over all micro-batches by
  `loss_normalizer` and passed in, so gradient accumulation cannot reweight tokens:
    "token" (default, DAPO): sum of per-token losses / total loss tokens in the step;
    "seq"   (original GRPO): per-sequence token mean, summed, / number of sequences in the step (long sequences'
            tokens weigh less: the length bias);
    "const" (Dr. GRPO): sum of per-token losses / constant (max_new_tokens x number of sequences).
  With equal lengths all three agree (for "const" when the constant is that length).
- Advantages: the trainer gives one per sequence (B,). A multi-turn rollout is trained as one sequence per turn,
  each with its own group advantage (the first turn's from its own raw score, never from a shaped later reward).
  `policy_loss` also takes per-token advantages (B, T-1), the general form GSPO-token is written for.
- On-policy the loss VALUE is just -mean(A) (near 0 for centred A) while its gradient is not: log the pg term, KL,
  grad-norm, reward and entropy (`token_logprobs(return_entropy=True)`) separately (the stats of `policy_loss`).
- Masking: loss masks are (B, T-1), aligned with `token_logprobs`, and built by position (`span_mask`), never by
  token id: a pad id equal to EOS must not drop the emitted EOS, and prompt, padding and injected critique tokens
  are never trained. Masked positions are excluded with `where`, so a non-finite value there cannot leak in.
- Log-probs (minigrpo/logprobs.py): log-softmax in fp32 of logits / T (T = the sampler's temperature); the plain
  version (`naive_token_logprobs`) first, then the fused, chunked one the trainer uses (`token_logprobs`).

Letters: B batch (sequences), T sequence length, V vocabulary (embedding rows), H hidden size, N scores.
"""

import math

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


def policy_loss(logp, old_logp, advantages, loss_mask, eps_low=0.2, eps_high=0.2, agg="token", normalizer=None,
                ref_logp=None, beta=0.0, kl_kind="k3", max_tokens=None, loss="grpo", sampler_logp=None,
                is_correction="none", is_level="token", is_cap=2.0):
    """
    The policy-gradient loss of one micro-batch plus beta * KL, aggregated by agg over the step's normalizer (from
    `loss_normalizer` over every micro-batch of the step; None = this call is the whole step).
    logp, old_logp, ref_logp, sampler_logp, loss_mask: (B, T-1); old_logp None = on-policy (ratio 1, REINFORCE
    gradient). advantages: (B,) one per sequence (what train.py passes), or (B, T-1) one per token. loss: "grpo" |
    "gspo" | "gspo-token" | "cispo" (module doc; eps_low/eps_high are that loss's clip). is_correction "tis" |
    "mis" weighs the policy term by pi_old / pi_sampler (needs sampler_logp).
    Returns (loss, stats); stats are detached 0-d tensors: "pg" and "kl_loss" are this micro-batch's share of the
    step's terms (sum them over micro-batches), "kl", "ratio_mean", "clip_low", "clip_high", "is_weight_mean" are
    token means over this micro-batch (weigh by "tokens" to combine).
    """
    mask = loss_mask.bool()
    if normalizer is None:
        normalizer = loss_normalizer([mask], agg, max_tokens)
    if normalizer <= 0:
        normalizer = 1.0  # a step with no loss tokens: the loss is 0 and so is its gradient
    adv = advantages.to(logp.dtype)
    if adv.dim() == 1:
        adv = adv.unsqueeze(-1)  # (B, 1) broadcasts over the sequence
    # zero every input at masked positions first: junk there (pads) then gets neither a value nor a NaN gradient
    logp = torch.where(mask, logp, 0.0)
    old = logp.detach() if old_logp is None else torch.where(mask, old_logp, 0.0)
    ref_logp = None if ref_logp is None else torch.where(mask, ref_logp, 0.0)
    pg_tok, ratio, clipped_low, clipped_high = losses.policy_tokens(loss, logp, old, adv, mask, eps_low, eps_high)
    stats = {}
    if is_correction != "none":
        if sampler_logp is None:
            raise ValueError(f"is_correction={is_correction!r} needs sampler_logp=")
        w = losses.is_weights(old, sampler_logp.to(logp.dtype), mask, is_correction, is_level, is_cap)
        pg_tok = pg_tok * w
        stats["is_weight_mean"] = masked_mean(w.expand_as(logp), mask)
    pg = _aggregate(pg_tok, mask, agg, normalizer)
    total = pg
    if ref_logp is not None:
        kl_tok = kl(logp, ref_logp, kl_kind)  # (B, T-1)
        kl_loss = beta * _aggregate(kl_tok, mask, agg, normalizer)
        total = total + kl_loss
        stats["kl"] = masked_mean(kl_tok.detach(), mask)
        stats["kl_loss"] = kl_loss.detach()
    with torch.no_grad():
        stats["pg"] = pg.detach()
        stats["ratio_mean"] = masked_mean(ratio.detach(), mask)
        # the tail a mean hides: the share of tokens whose ratio left [0.9, 1.1] (mu > 1, or a drifting sampler)
        r = ratio.detach().expand_as(logp)
        stats["ratio_outside"] = masked_mean(((r < 0.9) | (r > 1.1)).to(logp.dtype), mask)
        # the fraction of tokens whose term the clip changed, by side
        stats["clip_low"] = masked_mean(clipped_low.to(logp.dtype), mask)
        stats["clip_high"] = masked_mean(clipped_high.to(logp.dtype), mask)
        stats["tokens"] = mask.sum()
    return total, stats


def overlong_penalty(length, max_new_tokens, buffer):
    """DAPO's soft overlong punishment of a completion of `length` tokens: 0 up to max_new_tokens - buffer, then
    linear down to -1 at max_new_tokens (and -1 past it); buffer 0 = off."""
    if buffer <= 0:
        return 0.0
    free = max_new_tokens - buffer  # the longest completion that is not punished
    if length <= free:
        return 0.0
    return max((free - length) / buffer, -1.0)
