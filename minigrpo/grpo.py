"""
The GRPO math: group advantages, recovery shaping, token log-probs, KL, the policy loss and its
aggregations, the DPO loss. Pure tensor code; only `token_logprobs` touches a model.

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
  distribution, which is a different policy).
- Aggregation (`policy_loss`, agg=) and its denominator, computed ONCE per optimizer step over all micro-batches by
  `loss_normalizer` and passed in, so gradient accumulation cannot reweight tokens:
    "token" (default, DAPO): sum of per-token losses / total loss tokens in the step;
    "seq"   (original GRPO): per-sequence token mean, summed, / number of sequences in the step (long sequences'
            tokens weigh less: the length bias);
    "const" (Dr. GRPO): sum of per-token losses / constant (max_new_tokens x number of sequences).
  With equal lengths all three agree (for "const" when the constant is that length).
- Advantages are per sequence (B,) or per token (B, T-1): in a multi-turn rollout each turn's tokens carry that
  turn's advantage (the first turn's from its own raw score, never from a shaped later reward).
- On-policy the loss VALUE is just -mean(A) (near 0 for centred A) while its gradient is not: log the pg term, KL,
  grad-norm, reward and entropy (`token_logprobs(return_entropy=True)`) separately (the stats of `policy_loss`).
- Masking: loss masks are (B, T-1), aligned with `token_logprobs`, and built by position (`span_mask`), never by
  token id: a pad id equal to EOS must not drop the emitted EOS, and prompt, padding and injected critique tokens
  are never trained. Masked positions are excluded with `where`, so a non-finite value there cannot leak in.
- Log-probs (`token_logprobs`): log-softmax in fp32 of logits / T (T = the sampler's temperature), in chunks over
  the sequence, with the lm_head fused in (`_LinearLogprob`: d logp / d h is formed while the chunk's softmax is at
  hand), so neither the forward nor the stored activations ever hold the full (B, T, V) fp32 tensor. Optional
  `vocab_size` masks the embedding's padding rows (ids >= the tokenizer's size) to -inf, as the sampler does.

Letters: B batch (sequences), T sequence length, V vocabulary (embedding rows), H hidden size, N scores.
"""

import math

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

# ----------------------------------------------------------------------------------------------------------------
# advantages and reward shaping


def _group_index(n, group_size, group_ids):
    """List of groups, each a list of indices into the N scores."""
    if (group_size is None) == (group_ids is None):
        raise ValueError("grpo.group_advantages: pass exactly one of group_size= or group_ids=")
    if group_size is not None:
        if group_size < 1 or n % group_size:
            raise ValueError(f"grpo.group_advantages: {n} scores do not split into groups of group_size={group_size}")
        return [list(range(i, i + group_size)) for i in range(0, n, group_size)]
    ids = group_ids.tolist() if torch.is_tensor(group_ids) else list(group_ids)
    if len(ids) != n:
        raise ValueError(f"grpo.group_advantages: {len(ids)} group_ids for {n} scores")
    groups = {}  # insertion order = order of first appearance
    for i, g in enumerate(ids):
        groups.setdefault(g, []).append(i)
    return list(groups.values())


def _as_list(scores):
    """Scores as a list of float | None (a NaN in a tensor counts as None)."""
    vals = scores.tolist() if torch.is_tensor(scores) else list(scores)
    return [None if v is None or (isinstance(v, float) and math.isnan(v)) else float(v) for v in vals]


def group_advantages(scores, group_size=None, group_ids=None, scale="group", eps=1e-6, raw_scores=None,
                     dtype=torch.float32):
    """
    Group-relative advantages. scores: N rewards (list with None for failed scoring, or a 1-D tensor with NaN),
    grouped either by consecutive blocks of group_size or by group_ids (any hashable per score). raw_scores: the
    unshaped task scores used for the zero-spread test (default: scores). Returns (advantages (N,), stats).
    """
    if scale not in ("group", "batch", "none"):
        raise ValueError(f"grpo.group_advantages: scale={scale!r}; use 'group', 'batch' or 'none'")
    s = _as_list(scores)
    raw = s if raw_scores is None else _as_list(raw_scores)
    if len(raw) != len(s):
        raise ValueError(f"grpo.group_advantages: {len(raw)} raw_scores for {len(s)} scores")
    adv = [0.0] * len(s)
    zero_spread = 0
    for idx in _group_index(len(s), group_size, group_ids):
        valid = [i for i in idx if s[i] is not None]  # a failed score is neither baseline nor trained
        rv = [raw[i] for i in valid if raw[i] is not None]
        if len(valid) < 2 or not rv or max(rv) - min(rv) <= 0.0:
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


def recovery_rewards(s_prev, s, coef=0.5, cap=None):
    """
    Per-turn recovery shaping of the soyuz run: turn-2 reward = s + coef * (s - s_prev), i.e. the score plus a
    bonus for the climb from the previous turn (a fall is penalised the same way). Works on one pair of floats or
    on two equal-length lists; None (a failed judge call) in s gives None; None in s_prev gives s unshaped.

    Why the zero-spread test and any group filter must use the RAW score s, not this shaped reward: in a group
    where every revision is equally wrong (s = 0 for all), the shaped rewards still differ by -coef * s_prev, and
    the z-score blows that difference up to unit-size advantages: the revision tokens get trained on noise that
    only reflects how good the first answer happened to be. Pass raw_scores=s to group_advantages.

    Reward hacking: the bonus pays for a low s_prev, so a policy can learn to answer badly first and climb. Two
    guards: the first turn's tokens are trained only on their own raw score (never on this shaped reward), and
    `cap` bounds the bonus from above (bonus = min(coef * (s - s_prev), cap)), so no deliberately bad start can
    earn more than cap. Falls are never capped.
    """
    if isinstance(s, (list, tuple)):
        if len(s) != len(s_prev):
            raise ValueError(f"grpo.recovery_rewards: {len(s_prev)} previous scores for {len(s)} scores")
        return [recovery_rewards(p, x, coef, cap) for p, x in zip(s_prev, s)]
    if s is None:
        return None
    if s_prev is None:
        return float(s)
    bonus = coef * (s - s_prev)
    if cap is not None:
        bonus = min(bonus, cap)
    return float(s + bonus)


# ----------------------------------------------------------------------------------------------------------------
# log-probs


def _fp32(x):
    """x in fp32, or left alone if already wider (fp64 tests)."""
    return x.to(torch.promote_types(x.dtype, torch.float32))


def _lm_head(model):
    """The lm_head weight when the head is a plain bias-free nn.Linear (Qwen, unless a LoRA wraps lm_head), else
    None: token_logprobs then calls model.logits chunk by chunk under activation checkpointing."""
    head = getattr(model, "lm_head", None)
    return head.weight if type(head) is torch.nn.Linear and head.bias is None else None


def _scaled_logits(h, weight, temperature, vocab_size):
    """fp32 logits / T of h (c, H), padding rows at -inf: one fresh (c, V) buffer, scaled and masked in place."""
    z = _fp32(h @ weight.T)  # in the model dtype first, as lm_head computes it; softmax in fp32 (PITFALLS 8)
    if temperature != 1.0:
        z = z.div_(temperature)
    if vocab_size is not None and vocab_size < z.shape[-1]:
        z[:, vocab_size:] = float("-inf")  # embedding padding rows are never sampled (PITFALLS 9)
    return z


def _onehot_minus_(p, targets, temperature):
    """(onehot(targets) - p) / T, in p's buffer: d log p(target) / d logits, for a softmax p of logits / T."""
    g = p.neg_().scatter_add_(-1, targets, torch.ones_like(targets, dtype=p.dtype))  # (c, V)
    return g.div_(temperature) if temperature != 1.0 else g


class _LinearLogprob(torch.autograd.Function):
    """
    log p(target) = z[target] - logsumexp(z), z = (h W^T) / T, with the lm_head fused in, so that no (N, V) tensor
    is saved for backward. d logp / d logits = (onehot - softmax) / T, and the loss reaches each row's log-prob
    through one scalar (grad_output[n]), which gives two cases:
      - frozen head (LoRA): while a chunk's softmax is at hand, forward also computes d logp / d h =
        ((onehot - softmax) / T) W and keeps only that (N, H); backward scales it by grad_output. One (N, V) x
        (V, H) product in all, as plain autograd needs, and none of the recomputation that checkpointing costs.
      - trainable head (full fine-tune): W's gradient needs grad_output inside the (V, H) sum, so backward
        recomputes each chunk's logits from the saved h and the per-row logsumexp.
    The logits are computed in the model dtype and cast to fp32, the gradient cast back before its product with W,
    as autograd does through lm_head + .float(). The entropy (for logging) comes from the same pass, no gradient.
    """

    @staticmethod
    def forward(ctx, h, weight, targets, temperature, vocab_size, rows, with_entropy, grad_enabled):
        # h (N, H): every row's positions flattened; targets (N,). Grad mode is off in here: the caller's is passed.
        N = h.shape[0]
        need_h = grad_enabled and ctx.needs_input_grad[0]
        need_w = grad_enabled and ctx.needs_input_grad[1]
        f32 = torch.promote_types(h.dtype, torch.float32)  # fp32, or fp64 in tests
        logp = torch.empty(N, dtype=f32, device=h.device)
        lse = torch.empty_like(logp)
        ent = torch.empty_like(logp) if with_entropy else None
        dlogp_dh = torch.empty(N, h.shape[1], dtype=f32, device=h.device) if need_h and not need_w else None
        for s in range(0, N, rows):
            c = slice(s, s + rows)
            z = _scaled_logits(h[c], weight, temperature, vocab_size)  # (c, V) fp32
            t = targets[c, None]  # (c, 1)
            # logsumexp by hand, in z's buffer: torch.logsumexp would allocate a second (c, V) tensor
            zmax = z.amax(-1, keepdim=True)  # (c, 1)
            picked = z.gather(-1, t) - zmax  # (c, 1)
            z = z.sub_(zmax)  # (c, V) z - max <= 0
            p = z.exp() if ent is not None else z.exp_()  # unnormalised softmax; entropy still needs z - max
            total = p.sum(-1, keepdim=True)  # (c, 1)
            lse[c] = (zmax + total.log()).squeeze(-1)
            logp[c] = (picked - total.log()).squeeze(-1)
            if ent is not None:  # H = log S - sum(e^z z) / S, with z - max; 0 * -inf (masked ids) = 0
                ent[c] = (total.log() - torch.linalg.vecdot(p, z.clamp_(min=torch.finfo(z.dtype).min))[:, None]
                          / total).squeeze(-1)
            if dlogp_dh is not None:
                p = p.div_(total)  # softmax
                dlogp_dh[c] = _onehot_minus_(p, t, temperature).to(weight.dtype) @ weight  # (c, H)
        ctx.save_for_backward(h if need_w else None, weight if need_w else None, targets if need_w else None,
                              lse if need_w else None, dlogp_dh)
        ctx.args = (temperature, vocab_size, rows, need_h, h.dtype)
        if ent is None:
            return logp
        ctx.mark_non_differentiable(ent)
        return logp, ent

    @staticmethod
    def backward(ctx, grad_logp, *_grad_ent):
        h, weight, targets, lse, dlogp_dh = ctx.saved_tensors
        temperature, vocab_size, rows, need_h, h_dtype = ctx.args
        if dlogp_dh is not None:  # frozen head: the chain rule up to h was done in forward
            return (grad_logp[:, None] * dlogp_dh).to(h_dtype), None, None, None, None, None, None, None
        grad_h = torch.empty_like(h) if need_h else None
        grad_w = torch.zeros_like(weight)
        for s in range(0, h.shape[0], rows):
            c = slice(s, s + rows)
            p = _scaled_logits(h[c], weight, temperature, vocab_size).sub_(lse[c, None]).exp_()  # softmax (c, V)
            g = (_onehot_minus_(p, targets[c, None], temperature) * grad_logp[c, None]).to(weight.dtype)
            if grad_h is not None:
                grad_h[c] = g @ weight  # (c, H)
            grad_w += g.T @ h[c]  # (V, H)
        return grad_h, grad_w, None, None, None, None, None, None


def _chunk_logprobs(model, h, targets, temperature, vocab_size, with_entropy):
    """Log-prob of targets (and entropy) for one chunk of positions; the fp32 (B, c, V) lives only in here.
    Written to keep one (B, c, V) buffer alive at a time: the logits are scaled and masked in place, and without
    entropy the log-prob is gather - logsumexp, so no separate log-softmax tensor is stored for backward."""
    logits = _fp32(model.logits(h))  # (B, c, V) fp32 at least: softmax needs it (PITFALLS 8); lm_head's own output
    if temperature != 1.0:
        logits = logits.div_(temperature)  # in place: a fresh tensor whose value no backward formula needs
    if vocab_size is not None and vocab_size < logits.size(-1):
        logits[..., vocab_size:] = float("-inf")  # embedding padding rows are never sampled (PITFALLS 9)
    if not with_entropy:
        return logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - torch.logsumexp(logits, dim=-1)  # (B, c)
    logp_all = torch.log_softmax(logits, dim=-1)  # (B, c, V)
    logp = logp_all.gather(-1, targets.unsqueeze(-1)).squeeze(-1)  # (B, c)
    p = logp_all.exp()
    ent = -(p * logp_all.masked_fill(p == 0, 0.0)).sum(-1)  # (B, c); 0 * -inf terms are 0
    return logp, ent


LOGIT_BYTES = 256 * 2**20  # chunk="auto": fp32 logit rows per chunk, 441 at Qwen's V = 151936


def token_logprobs(model, input_ids, attention_mask=None, temperature=1.0, chunk="auto", return_entropy=False,
                   vocab_size=None, start=0):
    """
    log p(ids[:, t+1] | ids[:, :t+1]) under softmax(logits / temperature), fp32, shape (B, T-1), aligned with
    ids[:, 1:] (column t scores the token at position t+1). With return_entropy, also the entropy (B, T-1) of each
    next-token distribution (for logging: under the fused head it carries no gradient). attention_mask (B, T):
    1 = real token, 0 = left padding; the model derives positions from it.
    chunk: logit rows (batch x positions) materialised at once, "auto" = as many as LOGIT_BYTES of fp32 hold;
    chunk=None computes the full (B, T, V) in one go (the naive path). Gradients flow to the model. A model whose
    lm_head is a plain nn.Linear goes through _LinearLogprob, which keeps only (rows, H) tensors for backward;
    any other `model.logits` is called chunk by chunk under activation checkpointing. Neither keeps (B, T, V).
    start: the first column whose log-prob is needed (the trainer passes the first completion column, like TRL's
    logits_to_keep): the lm_head and the softmax run only from there; earlier columns are 0 (mask them out).
    """
    B, T = input_ids.shape
    h = model.hidden(input_ids, attention_mask=attention_mask)[:, start:-1]  # (B, T-1-start, H)
    targets = input_ids[:, start + 1:]  # (B, T-1-start)
    n = T - 1 - start
    pad = torch.zeros(B, start, dtype=torch.promote_types(h.dtype, torch.float32), device=h.device)
    weight = _lm_head(model)
    if chunk == "auto":  # any other head: 1024 rows (its vocabulary size is unknown until it runs)
        chunk = max(1, LOGIT_BYTES // (4 * weight.shape[0])) if weight is not None else 1024
    if weight is not None and chunk is not None and n > 0:  # the fused lm_head + log-softmax (_LinearLogprob)
        out = _LinearLogprob.apply(h.reshape(B * n, -1), weight, targets.reshape(-1), temperature, vocab_size,
                                   max(1, chunk), return_entropy, torch.is_grad_enabled())
        if not return_entropy:
            return torch.cat([pad, out.view(B, n)], dim=1)  # (B, T-1)
        return torch.cat([pad, out[0].view(B, n)], dim=1), torch.cat([pad, out[1].view(B, n)], dim=1)
    step = max(n, 1) if chunk is None else max(1, chunk // B)  # positions per chunk
    use_ckpt = torch.is_grad_enabled() and chunk is not None  # a no-op when nothing requires grad
    outs = []
    for s in range(0, n, step):
        args = (model, h[:, s:s + step], targets[:, s:s + step], temperature, vocab_size, return_entropy)
        if use_ckpt:
            # no RNG inside a chunk, so no RNG state to save; the first call imports torch._dynamo (a few seconds)
            outs.append(checkpoint(_chunk_logprobs, *args, use_reentrant=False, preserve_rng_state=False))
        else:
            outs.append(_chunk_logprobs(*args))
    if not return_entropy:
        return torch.cat([pad] + outs, dim=1)  # (B, T-1)
    return torch.cat([pad] + [o[0] for o in outs], dim=1), torch.cat([pad] + [o[1] for o in outs], dim=1)


def entropy(logits, temperature=1.0):
    """Entropy (fp32) of softmax(logits / temperature) over the last dim, for logging: (..., V) -> (...)."""
    logp = torch.log_softmax(_fp32(logits) / temperature, dim=-1)
    p = logp.exp()
    return -(p * logp.masked_fill(p == 0, 0.0)).sum(-1)


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
        raise ValueError("grpo.span_mask: a span starts at position 0, whose token no column predicts; starts must be >= 1")
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
    raise ValueError(f"grpo.kl: kind={kind!r}; use 'k3', 'k1' or 'k2'")


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
            raise ValueError("grpo.loss_normalizer: agg='const' needs max_tokens= (e.g. the max_new_tokens of sampling)")
        return float(max_tokens * sum(m.size(0) for m in masks))
    raise ValueError(f"grpo.loss_normalizer: agg={agg!r}; use 'token', 'seq' or 'const'")


def _aggregate(per_token, mask, agg, normalizer):
    """Sum the masked per-token values the way agg says and divide by the step's normalizer."""
    x = torch.where(mask, per_token, 0.0)  # (B, T-1)
    if agg == "seq":
        x = x.sum(-1) / mask.sum(-1).clamp(min=1)  # (B,) per-sequence mean
    return x.sum() / normalizer


def policy_loss(logp, old_logp, advantages, loss_mask, eps_low=0.2, eps_high=0.2, agg="token", normalizer=None,
                ref_logp=None, beta=0.0, kl_kind="k3", max_tokens=None):
    """
    The (clipped) policy-gradient loss of one micro-batch plus beta * KL, aggregated by agg over the step's
    normalizer (from `loss_normalizer` over every micro-batch of the step; None = this call is the whole step).
    logp, old_logp, ref_logp, loss_mask: (B, T-1); old_logp None = on-policy (ratio 1, REINFORCE gradient).
    advantages: (B,) one per sequence, or (B, T-1) per token (multi-turn: each turn's tokens get its turn's value).
    Returns (loss, stats); stats are detached 0-d tensors: "pg" and "kl_loss" are this micro-batch's share of the
    step's terms (sum them over micro-batches), "kl", "ratio_mean", "clip_low", "clip_high" are token means over
    this micro-batch (weigh by "tokens" to combine).
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
    ratio = torch.exp(logp - old)  # (B, T-1); exactly 1 on-policy, gradient = grad(logp)
    surr = ratio * adv
    surr_clipped = torch.clamp(ratio, 1.0 - eps_low, 1.0 + eps_high) * adv
    pg_tok = -torch.minimum(surr, surr_clipped)  # (B, T-1); clipped region -> constant -> zero gradient
    pg = _aggregate(pg_tok, mask, agg, normalizer)
    loss = pg
    stats = {}
    if ref_logp is not None:
        kl_tok = kl(logp, ref_logp, kl_kind)  # (B, T-1)
        kl_loss = beta * _aggregate(kl_tok, mask, agg, normalizer)
        loss = loss + kl_loss
        stats["kl"] = masked_mean(kl_tok.detach(), mask)
        stats["kl_loss"] = kl_loss.detach()
    with torch.no_grad():
        stats["pg"] = pg.detach()
        stats["ratio_mean"] = masked_mean(ratio, mask)
        # the fraction of tokens whose gradient the clip removed, by side
        stats["clip_low"] = masked_mean(((ratio < 1.0 - eps_low) & (adv < 0)).to(logp.dtype), mask)
        stats["clip_high"] = masked_mean(((ratio > 1.0 + eps_high) & (adv > 0)).to(logp.dtype), mask)
        stats["tokens"] = mask.sum()
    return loss, stats


# ----------------------------------------------------------------------------------------------------------------
# DPO


def dpo_loss(policy_chosen, policy_rejected, ref_chosen, ref_rejected, beta=0.1, normalizer=None):
    """
    DPO on sequence log-prob sums (B,): -log sigmoid(beta * ((pc - rc) - (pr - rr))), summed / normalizer (the
    number of pairs in the optimizer step; None = this batch). Stats: implicit rewards beta * (policy - ref) of
    chosen and rejected, their margin, and accuracy (share of pairs with a positive margin).
    """
    chosen = beta * (policy_chosen - ref_chosen)  # (B,) implicit reward
    rejected = beta * (policy_rejected - ref_rejected)  # (B,)
    margin = chosen - rejected
    n = policy_chosen.numel() if normalizer is None else normalizer
    loss = -F.logsigmoid(margin).sum() / n
    stats = {
        "reward_chosen": chosen.detach().mean(),
        "reward_rejected": rejected.detach().mean(),
        "margin": margin.detach().mean(),
        "accuracy": (margin.detach() > 0).float().mean(),
    }
    return loss, stats
