"""The supervised trainers of the mdp pipeline (minigrpo/experiments/mdp_pipeline.py): SFT (cross-entropy on answer
tokens) and DPO (`dpo_loss`), on (prompt ids, answer ids) items, left-padded into micro-batches whose loss mask
covers the answer positions. Settings come from the pipeline's config (batch, grad_accum, warmup, dpo_beta, dpo_nll).

Every answer is short (a letter and <|im_end|>), so only the last K positions go through the LM head; a sequence's
log-prob is the sum over its answer tokens. GRPO is not here: the pipeline runs it through train.py's loop.
"""
import sys

import numpy as np
import torch
import torch.nn.functional as F

from minigrpo.packing import left_pad
from minigrpo.lora import adapters_disabled
from minigrpo.update import adamw


# -----------------------------------------------------------------------------------------------------------------
# Batches

def pad_batch(pairs, pad_id, device):
    """[(prompt, answer)] -> ids (B, T) left-padded; the attention mask (None when nothing is padded: the compact
    prompts all have one length, and an unmasked forward takes the fast causal path); the loss mask (B, K) over
    the last K positions, column k scoring ids[:, T-K+k], right-aligned: the answer tokens."""
    ids, attn = left_pad([p + a for p, a in pairs], pad_id)
    T = ids.shape[1]
    trained = torch.tensor([len(a) for _, a in pairs])[:, None]
    K = int(trained.max())
    mask = torch.arange(K)[None, :] >= K - trained                     # (B, K)
    attn = None if min(len(p) + len(a) for p, a in pairs) == T else attn.to(device)
    return ids.to(device), attn, mask.to(device)


def answer_logprobs(model, tok, batch):
    """Sum of log p(answer token) per sequence (B,). Only the last K positions go through the LM head: hidden
    position t predicts ids[t + 1], so the answer ids[:, T-K:] are scored by positions T-K-1 .. T-2."""
    ids, attn, mask = batch
    K = mask.shape[1]
    h = model.hidden(ids, attention_mask=attn)[:, -K - 1:-1]               # (B, K, H)
    logits = model.logits(h).float()[..., :tok.vocab_size]                 # (B, K, V): padding rows never count
    logp = torch.log_softmax(logits, -1).gather(-1, ids[:, -K:, None]).squeeze(-1)   # (B, K)
    return torch.where(mask, logp, 0.0).sum(-1)


def batches(n_items, size, steps, seed):
    """`steps` index lists of `size`, walking seeded permutations of the items epoch after epoch."""
    rng, order, out = np.random.default_rng(seed), [], []
    for _ in range(steps):
        while len(order) < size:
            order += rng.permutation(n_items).tolist()
        out.append(order[:size])
        order = order[size:]
    return out


def optimizer(params, lr, steps, warmup):
    """AdamW (beta2 0.99, no weight decay) for a supervised stage: a linear warmup over int(warmup x steps) steps
    (at least one), the last of them at the peak, then cosine to zero (update.lr_factor's peak_in_warmup)."""
    return adamw(params, lr, steps, max(1, int(warmup * steps)), beta2=0.99, peak_in_warmup=True)


def log_progress(stage: str, step: int, steps: int, stats: dict, quiet: bool):
    if not quiet and (step == 1 or step == steps or step % max(1, steps // 5) == 0):
        print(f"  {stage} {step}/{steps} " + " ".join(f"{k}={v:.3f}" for k, v in stats.items()), file=sys.stderr)


# -----------------------------------------------------------------------------------------------------------------
# The loops

def sft_loop(model, tok, params, items, steps, lr, cfg, seed, stage, quiet):
    """Cross-entropy on the answer tokens of `items` [(prompt ids, answer ids)]; the token mean is taken over the
    whole optimizer step (all micro-batches), so grad-accum does not reweight."""
    opt, sched = optimizer(params, lr, steps, cfg.warmup)
    device = model.device
    model.train()
    for step, idx in enumerate(batches(len(items), cfg.batch * cfg.grad_accum, steps, seed), 1):
        micro = [idx[i:i + cfg.batch] for i in range(0, len(idx), cfg.batch)]
        n_tok = sum(len(items[i][1]) for i in idx)
        opt.zero_grad(set_to_none=True)
        total = 0.0
        for mb in micro:
            batch = pad_batch([items[i] for i in mb], tok.pad_id, device)
            loss = -answer_logprobs(model, tok, batch).sum() / n_tok
            loss.backward()
            total += float(loss.detach())
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        sched.step()
        log_progress(stage, step, steps, {"loss": total}, quiet)
    model.eval()


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


def dpo_loop(model, tok, params, pairs, cfg, seed, stage, quiet):
    """DPO on [(prompt, chosen answer, rejected answer)] token-id triples; the reference is `model` with its LoRA
    adapters off; + cfg.dpo_nll x the chosen answer's NLL per token (RPO) when set."""
    opt, sched = optimizer(params, cfg.dpo_lr, cfg.dpo_steps, cfg.warmup)
    device = model.device
    for step, idx in enumerate(batches(len(pairs), cfg.batch * cfg.grad_accum, cfg.dpo_steps, seed), 1):
        opt.zero_grad(set_to_none=True)
        stats = {}
        for k in range(0, len(idx), cfg.batch):
            mb = [pairs[i] for i in idx[k:k + cfg.batch]]
            batch = pad_batch([(p, c) for p, c, _ in mb] + [(p, r) for p, _, r in mb], tok.pad_id, device)
            with torch.no_grad(), adapters_disabled(model):
                ref = answer_logprobs(model, tok, batch)             # (2b,) chosen then rejected
            model.train()
            pol = answer_logprobs(model, tok, batch)
            b = len(mb)
            loss, st = dpo_loss(pol[:b], pol[b:], ref[:b], ref[b:], beta=cfg.dpo_beta, normalizer=len(idx))
            if cfg.dpo_nll:
                # plain DPO on a small model lowers the chosen letter too and hands the mass to letters in no
                # pair; the NLL term holds the chosen letter up (the mean is over the step's chosen tokens)
                n_tok = sum(len(pairs[i][1]) for i in idx)
                loss = loss - cfg.dpo_nll * pol[:b].sum() / n_tok
            loss.backward()
            for key, v in st.items():
                stats[key] = stats.get(key, 0.0) + float(v) * b / len(idx)
            stats["loss"] = stats.get("loss", 0.0) + float(loss.detach())
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        sched.step()
        log_progress(stage, step, cfg.dpo_steps, stats, quiet)
    model.eval()
