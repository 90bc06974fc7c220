"""
Token log-probs of a sequence under the model: what the policy loss, the KL and the sampler check are built on.

    logp[b, t] = log softmax(logits[b, t] / T)[ids[b, t + 1]]        (B, T-1), fp32, column t scores token t + 1

Two versions of the same function, the plain one first:
- `naive_token_logprobs`: the whole (B, T, V) logits, log_softmax in fp32, gather. Easy to read, and the reference
  the fast version is tested against; at Qwen's V = 151936 it holds B x T x 152k fp32 values (1024 tokens x 8
  sequences: 5 GB, with a second copy saved for backward).
- `token_logprobs`: the same numbers in chunks over the sequence, with the lm_head fused in (`_LinearLogprob`:
  d logp / d h is formed while the chunk's softmax is at hand), so neither the forward nor the stored activations
  ever hold the full (B, T, V) fp32 tensor (bench/logprobs.py: 20x less peak memory, same time).

Both take T = the sampler's temperature, and optional `vocab_size` masks the embedding's padding rows (ids >= the
tokenizer's size) to -inf, as the sampler does: trainer and sampler score one distribution (docs/pitfalls.md 5, 6, 9).

Letters: B batch (sequences), T sequence length, V vocabulary (embedding rows), H hidden size.
"""
import torch
from torch.utils.checkpoint import checkpoint


def _fp32(x):
    """x in fp32, or left alone if already wider (fp64 tests)."""
    return x.to(torch.promote_types(x.dtype, torch.float32))


def naive_token_logprobs(model, input_ids, attention_mask=None, temperature=1.0, vocab_size=None):
    """The plain version of `token_logprobs` (B, T-1): full logits, fp32 log-softmax of logits / T, gather."""
    logits = _fp32(model(input_ids, attention_mask=attention_mask)[:, :-1]) / temperature  # (B, T-1, V)
    if vocab_size is not None and vocab_size < logits.shape[-1]:
        logits[..., vocab_size:] = float("-inf")  # embedding padding rows are never sampled
    logp_all = torch.log_softmax(logits, dim=-1)  # (B, T-1, V)
    return logp_all.gather(-1, input_ids[:, 1:, None]).squeeze(-1)  # (B, T-1)


# ----------------------------------------------------------------------------------------------------------------
# The fused, chunked version


def _lm_head(model):
    """The lm_head weight when the head is a plain bias-free nn.Linear (Qwen, unless a LoRA wraps lm_head), else
    None: token_logprobs then calls model.logits chunk by chunk under activation checkpointing."""
    head = getattr(model, "lm_head", None)
    return head.weight if type(head) is torch.nn.Linear and head.bias is None else None


def _scaled_logits(h, weight, temperature, vocab_size):
    """fp32 logits / T of h (c, H), padding rows at -inf: one fresh (c, V) buffer, scaled and masked in place."""
    z = _fp32(h @ weight.T)  # in the model dtype first, as lm_head computes it; softmax in fp32 (bf16 is noisy)
    if temperature != 1.0:
        z = z.div_(temperature)
    if vocab_size is not None and vocab_size < z.shape[-1]:
        z[:, vocab_size:] = float("-inf")  # embedding padding rows are never sampled
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
    logits = _fp32(model.logits(h))  # (B, c, V) fp32 at least: softmax needs it; lm_head's own output
    if temperature != 1.0:
        logits = logits.div_(temperature)  # in place: a fresh tensor whose value no backward formula needs
    if vocab_size is not None and vocab_size < logits.size(-1):
        logits[..., vocab_size:] = float("-inf")  # embedding padding rows are never sampled
    if not with_entropy:
        return logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - torch.logsumexp(logits, dim=-1)  # (B, c)
    logp_all = torch.log_softmax(logits, dim=-1)  # (B, c, V)
    logp = logp_all.gather(-1, targets.unsqueeze(-1)).squeeze(-1)  # (B, c)
    p = logp_all.exp()
    ent = -(p * logp_all.masked_fill(p == 0, 0.0)).sum(-1)  # (B, c); 0 * -inf terms are 0
    return logp, ent


LOGIT_BYTES = 256 * 2**20  # chunk="auto": fp32 logit rows per chunk, 441 at Qwen's V = 151936


def token_logprobs(model, input_ids, attention_mask=None, temperature=1.0, chunk="auto", return_entropy=False,
                   vocab_size=None, first_col=0):
    """
    log p(ids[:, t+1] | ids[:, :t+1]) under softmax(logits / temperature), fp32, shape (B, T-1), aligned with
    ids[:, 1:] (column t scores the token at position t+1). With return_entropy, also the entropy (B, T-1) of each
    next-token distribution (for logging: under the fused head it carries no gradient). attention_mask (B, T):
    1 = real token, 0 = left padding; the model derives positions from it.
    chunk: logit rows (batch x positions) materialised at once, "auto" = as many as LOGIT_BYTES of fp32 hold;
    chunk=None computes the full (B, T, V) in one go (the naive path). Gradients flow to the model. A model whose
    lm_head is a plain nn.Linear goes through _LinearLogprob, which keeps only (rows, H) tensors for backward;
    any other `model.logits` is called chunk by chunk under activation checkpointing. Neither keeps (B, T, V).
    first_col: the first column whose log-prob is needed (the trainer passes the first completion column, like TRL's
    logits_to_keep): the lm_head and the softmax run only from there; earlier columns are 0 (mask them out).
    """
    B, T = input_ids.shape
    h = model.hidden(input_ids, attention_mask=attention_mask)[:, first_col:-1]  # (B, T-1-first_col, H)
    targets = input_ids[:, first_col + 1:]  # (B, T-1-first_col)
    n = T - 1 - first_col
    pad = torch.zeros(B, first_col, dtype=torch.promote_types(h.dtype, torch.float32), device=h.device)
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
