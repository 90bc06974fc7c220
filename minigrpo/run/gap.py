"""How far the sampler's log-probs are from the trainer's, per step: what metrics.jsonl logs, and when to warn.

The sampler draws each token from its own forward (a decode step over a cache); the trainer scores the same tokens
with a full forward. In fp32 the two agree to rounding; in bf16 they differ by the kernels' rounding; and a sampler
that does not run the policy being trained (a LoRA merged into bf16 weights, where small updates round away) differs
by the update itself. Gap and noise look alike in one number, so three are logged:

- sampler_logp_diff (mean), _p95, _max: |trainer - sampler| per completion token.
- policy_logp_change: mean |trainer - reference| on the same tokens, how far the adapter has moved the policy there
  (the reference is the base model; it is computed when the KL term needs it, --beta > 0).
- sampler_update_share: the share of that move the sampler's log-probs carry, a least-squares slope over the step's
  tokens, sum((sampler - ref)(trainer - ref)) / sum((trainer - ref)^2). About 1: the sampler draws from the policy
  being trained; 0: from the base model. Rounding adds noise around it, more while the move is small.

Only the first pass over a step's rollouts is on-policy (--mu > 1 passes score an updated policy), so the share and
the change are taken from it.
"""

import sys

import numpy as np

MIN_SHARE = 0.5   # below this the sampler is nearer the base model than the trained policy


def token_sums(logp, sampled, ref, mask) -> dict:
    """One micro-batch's sums for the share: logp (trainer), sampled (sampler), ref (reference) (B, T); mask bool."""
    if ref is None:
        return {}
    d, s = (logp - ref)[mask].double(), (sampled - ref)[mask].double()
    return {"update_dd": float(d @ d), "update_sd": float(s @ d), "update_abs": float(d.abs().sum())}


def gap_metrics(loss_stats) -> dict:
    """p95 and max of the step's per-token gaps (their mean is sampler_logp_diff), and, where the reference was
    computed, policy_logp_change and sampler_update_share (None while the adapter has not moved the policy)."""
    gaps = [g for st in loss_stats for g in st.get("sampler_logp_gaps", ())]
    g = np.asarray(gaps or [0.0], dtype=np.float64)
    m = {"sampler_logp_diff_p95": float(np.quantile(g, 0.95)), "sampler_logp_diff_max": float(g.max())}
    first = [st for st in loss_stats if st.get("pass", 0) == 0 and "update_dd" in st]
    if first:
        dd = sum(st["update_dd"] for st in first)
        m["policy_logp_change"] = sum(st["update_abs"] for st in first) / max(sum(st["tokens"] for st in first), 1)
        m["sampler_update_share"] = sum(st["update_sd"] for st in first) / dd if dd > 0 else None
    return m


def off_policy(m) -> bool:
    """A step whose sampler carries under MIN_SHARE of the adapter's move, where that move is not lost in the
    rounding noise (at least half the sampler-trainer gap)."""
    share, change = m.get("sampler_update_share"), m.get("policy_logp_change")
    return share is not None and share < MIN_SHARE and change >= 0.5 * m["sampler_logp_diff"]


def warn_off_policy(m, warned) -> bool:
    """One warning line, the first time a step is off_policy; returns whether the run has warned."""
    if warned or not off_policy(m):
        return warned
    print(f"warning: step {m['step']}: the sampler's log-probs carry {m['sampler_update_share']:.0%} of the "
          f"adapter's change to the policy (sampler_update_share; gap {m['sampler_logp_diff']:.1e} against a change "
          f"of {m['policy_logp_change']:.1e} nats per token): it samples a policy nearer the base model than the one "
          "trained; --decode eager samples the trained policy, --is-correction tis reweighs what was sampled "
          "(docs/training.md)", file=sys.stderr)
    return True
