"""Token log-probs of a sequence under the model: what the policy loss, the KL and the sampler check are built on.

    logp[b, t] = log softmax(logits[b, t] / temperature)[ids[b, t + 1]]   (B, T-1), fp32: column t scores token t+1

Two versions of the same function, the plain one first: `naive_token_logprobs` (the whole (B, T, V) logits: the
reference the fast one is tested against) and `token_logprobs` (chunks over the sequence with the lm_head fused in,
so no (B, T, V) fp32 tensor is ever held). Both take the sampler's temperature and mask the embedding's padding rows
(ids >= the tokenizer's `vocab_size`) to -inf, as the sampler does: trainer and sampler score one distribution
(docs/pitfalls.md 5, 6, 9). What each costs: docs/losses.md, "What every objective shares".

Letters: B batch (sequences), T sequence length, V vocabulary (embedding rows), H hidden size.
"""
import torch


def _fp32(x):
    """x in fp32, or left alone if already wider (fp64 tests)."""
    return x.to(torch.promote_types(x.dtype, torch.float32))


def naive_token_logprobs(model, input_ids, attention_mask=None, temperature=1.0, vocab_size=None):
    """The plain version of `token_logprobs` (B, T-1): full logits, fp32 log-softmax of logits / temperature, gather."""
    logits = _fp32(model(input_ids, attention_mask=attention_mask)[:, :-1]) / temperature  # (B, T-1, V)
    if vocab_size is not None and vocab_size < logits.shape[-1]:
        logits[..., vocab_size:] = float("-inf")  # embedding padding rows are never sampled
    logp_all = torch.log_softmax(logits, dim=-1)  # (B, T-1, V)
    return logp_all.gather(-1, input_ids[:, 1:, None]).squeeze(-1)  # (B, T-1)


# ----------------------------------------------------------------------------------------------------------------
# The fused, chunked version


def _lm_head(model):
    """The lm_head weight when the head is a plain bias-free nn.Linear (every Qwen: LoRA's targets never include
    lm_head), else None."""
    head = getattr(model, "lm_head", None)
    return head.weight if type(head) is torch.nn.Linear and head.bias is None else None


def _scaled_logits(h, weight, temperature, vocab_size):
    """fp32 logits / temperature of h (c, H), padding rows at -inf: one fresh (c, V) buffer, scaled and masked in
    place."""
    z = _fp32(h @ weight.T)  # in the model dtype first, as lm_head computes it; softmax in fp32 (bf16 is noisy)
    if temperature != 1.0:
        z = z.div_(temperature)
    if vocab_size is not None and vocab_size < z.shape[-1]:
        z[:, vocab_size:] = float("-inf")  # embedding padding rows are never sampled
    return z


def _onehot_minus_(p, targets, temperature):
    """(onehot(targets) - p) / temperature, in p's buffer: d log p(target) / d logits, for a softmax p of
    logits / temperature."""
    g = p.neg_().scatter_add_(-1, targets, torch.ones_like(targets, dtype=p.dtype))  # (c, V)
    return g.div_(temperature) if temperature != 1.0 else g


class _LinearLogprob(torch.autograd.Function):
    """
    log p(target) = z[target] - logsumexp(z), z = (h W^T) / temperature, with the lm_head fused in, so that no (N, V)
    tensor is saved for backward. d logp / d logits = (onehot - softmax) / temperature, and the loss reaches each
    row's log-prob through one scalar (grad_output[n]), which gives two cases:
      - frozen head (LoRA): while a chunk's softmax is at hand, forward also computes d logp / d h =
        ((onehot - softmax) / temperature) W and keeps only that (N, H); backward scales it by grad_output. One
        (N, V) x (V, H) product in all, as plain autograd needs, and none of the recomputation that checkpointing
        costs.
      - trainable head (full fine-tune): W's gradient needs grad_output inside the (V, H) sum, so backward
        recomputes each chunk's logits from the saved h and the per-row logsumexp.
    The logits are computed in the model dtype and cast to fp32, the gradient cast back before its product with W,
    as autograd does through lm_head + .float(). The entropy (for logging) comes from the same pass, no gradient.
    """

    @staticmethod
    def forward(ctx, h, weight, targets, temperature, vocab_size, chunk_rows, with_entropy):
        # h (N, H): every row's positions flattened; targets (N,); vocab_size an int or None. Grad mode is off in
        # here; needs_input_grad is the inputs' requires_grad, and h made under the caller's no_grad has none: no
        # gradient is formed for a forward that no backward follows (the reference's, the behaviour policy's).
        N = h.shape[0]
        need_h = ctx.needs_input_grad[0]
        need_w = ctx.needs_input_grad[1]
        f32 = torch.promote_types(h.dtype, torch.float32)  # fp32, or fp64 in tests
        logp = torch.empty(N, dtype=f32, device=h.device)
        lse = torch.empty_like(logp)
        ent = torch.empty_like(logp) if with_entropy else None
        dlogp_dh = torch.empty(N, h.shape[1], dtype=f32, device=h.device) if need_h and not need_w else None
        for s in range(0, N, chunk_rows):
            c = slice(s, s + chunk_rows)
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
        ctx.args = (temperature, vocab_size, chunk_rows, need_h, h.dtype)
        if ent is None:
            return logp
        ctx.mark_non_differentiable(ent)
        return logp, ent

    @staticmethod
    def backward(ctx, grad_logp, *_grad_ent):
        h, weight, targets, lse, dlogp_dh = ctx.saved_tensors
        temperature, vocab_size, chunk_rows, need_h, h_dtype = ctx.args
        if dlogp_dh is not None:  # frozen head: the chain rule up to h was done in forward
            return (grad_logp[:, None] * dlogp_dh).to(h_dtype), None, None, None, None, None, None
        grad_h = torch.empty_like(h) if need_h else None
        grad_w = torch.zeros_like(weight)
        for s in range(0, h.shape[0], chunk_rows):
            c = slice(s, s + chunk_rows)
            p = _scaled_logits(h[c], weight, temperature, vocab_size).sub_(lse[c, None]).exp_()  # softmax (c, V)
            g = (_onehot_minus_(p, targets[c, None], temperature) * grad_logp[c, None]).to(weight.dtype)
            if grad_h is not None:
                grad_h[c] = g @ weight  # (c, H)
            grad_w += g.T @ h[c]  # (V, H)
        return grad_h, grad_w, None, None, None, None, None


LOGIT_BYTES = 256 * 2**20  # chunk="auto": fp32 logit rows per chunk, 441 at Qwen's V = 151936


def token_logprobs(model, input_ids, attention_mask=None, *, temperature=1.0, vocab_size=None, chunk="auto",
                   return_entropy=False, first_col=0):
    """
    log p(ids[:, t+1] | ids[:, :t+1]) under softmax(logits / temperature), fp32, shape (B, T-1), aligned with
    ids[:, 1:] (column t scores the token at position t+1). With return_entropy, also the entropy (B, T-1) of each
    next-token distribution (for logging: it carries no gradient). attention_mask (B, T): 1 = real token, 0 = left
    padding; the model derives positions from it. Gradients flow to the model.
    temperature: the sampler's temperature (the logits are divided by it).
    vocab_size: the tokenizer's vocabulary size: logits of ids >= it are masked, as the sampler masks them; None
    keeps every embedding row.
    The model's lm_head must be a plain bias-free nn.Linear (Qwen's is; LoRA never wraps it): its weight is fused
    into the log-softmax (_LinearLogprob), which keeps only (B x T, H) tensors for backward, never (B, T, V).
    chunk: logit rows (batch x positions) materialised at once, "auto" = as many as LOGIT_BYTES of fp32 hold.
    first_col: the first column whose log-prob is needed (the trainer passes the first completion column, like TRL's
    logits_to_keep): the lm_head and the softmax run only from there; earlier columns are 0 (mask them out).
    """
    weight = _head_of(model)
    B, T = input_ids.shape
    h = model.hidden(input_ids, attention_mask=attention_mask)[:, first_col:-1]  # (B, T-1-first_col, H)
    targets = input_ids[:, first_col + 1:]  # (B, T-1-first_col)
    n = T - 1 - first_col
    out = _LinearLogprob.apply(h.reshape(B * n, h.shape[-1]), weight, targets.reshape(-1), temperature, vocab_size,
                               _chunk_rows(chunk, weight), return_entropy)
    pad = torch.zeros(B, first_col, dtype=torch.promote_types(h.dtype, torch.float32), device=h.device)
    columns = lambda x: torch.cat([pad, x.view(B, n)], dim=1)  # (B, T-1)
    return (columns(out[0]), columns(out[1])) if return_entropy else columns(out)


def packed_token_logprobs(model, input_ids, pack, src, dst, shape, *, temperature=1.0, vocab_size=None,
                          chunk="auto", return_entropy=False):
    """token_logprobs of documents packed into one row (minigrpo/packing.py), laid out as the padded call's.
    input_ids (1, N); src: the packed columns to score (column c scores token c + 1: the completions'); dst: where
    each lands in the flat `shape` (B, T-1) table, whose other entries are 0 (packing.completion_columns). The
    lm_head and the softmax run over the src columns only."""
    weight = _head_of(model)
    h = model.hidden(input_ids, pack=pack)[0].index_select(0, src)  # (n, H)
    out = _LinearLogprob.apply(h, weight, input_ids[0, src + 1], temperature, vocab_size, _chunk_rows(chunk, weight),
                               return_entropy)
    f32 = torch.promote_types(h.dtype, torch.float32)
    table = lambda x: torch.zeros(shape[0] * shape[1], dtype=f32, device=h.device).index_copy(0, dst, x).view(shape)
    return (table(out[0]), table(out[1])) if return_entropy else table(out)


def _head_of(model):
    weight = _lm_head(model)
    if weight is None:
        raise ValueError("token_logprobs needs a model whose lm_head is a plain bias-free nn.Linear; "
                         "naive_token_logprobs takes any model")
    return weight


def _chunk_rows(chunk, weight):
    """Logit rows per chunk: chunk, or "auto" = as many as LOGIT_BYTES of fp32 hold."""
    return max(1, LOGIT_BYTES // (4 * weight.shape[0]) if chunk == "auto" else chunk)


def entropy(logits, temperature=1.0):
    """Entropy (fp32) of softmax(logits / temperature) over the last dim, for logging: (..., V) -> (...)."""
    logp = torch.log_softmax(_fp32(logits) / temperature, dim=-1)
    p = logp.exp()
    return -(p * logp.masked_fill(p == 0, 0.0)).sum(-1)
