"""The cache kept across turns: an agent's prompt at turn t is its prompt at turn t-1, the policy's answer and the
environment's reply, so the state after prefilling the earlier prompt can be continued instead of recomputed.
One meaning each, here, in sampler.py and in tasks/: `keep` (bool) asks a call to hand out each prompt's state;
`kept` is such a state, a `Kept` (or one Kept or None per prompt); `reuse` is one Kept or None per prompt, given
to a call to continue; `reused` counts the prompt tokens a continuation took from its Kept.

A Kept is a one-row model.Cache of exactly its prompt's first tokens: all of them for an attention-only model, up
to the last multiple of 64 for Qwen3.5 (`kept_length`), on Gated DeltaNet's chunk grid, the trainer's. Not the
state after the answer: a DeltaNet memory cannot be rewound. Continued rows are prefilled one at a time, then
right-aligned into one decode batch. Why each: docs/agentic.md, "The cache kept across turns".
Letters: P prompts, L longest prompt, T_new a continued row's new tokens, V vocabulary.
"""

import torch

from minigrpo import moe
from minigrpo.deltanet import CHUNK


class Kept:
    """The state after prefilling `ids` (one row): `cache`, a model.Cache of exactly len(ids) slots, every slot real.
    Never modified: a continuation copies it first, so the G episodes of a prompt can each continue it. It belongs
    to the model (and weights) that made it; a caller keeps it only while those do not change (one rollout).
    `routes` (len(ids), M, k) int16: the experts each token went through in a mixture-of-experts model (moe.py;
    None for a dense one), so that a continued prompt's routes cover its kept tokens too."""

    def __init__(self, ids, cache, routes=None):
        self.ids, self.cache, self.routes = tuple(ids), cache, routes

    @property
    def tokens(self):
        return len(self.ids)


def kept_length(model, n):
    """How many of a prompt's n tokens its kept state holds: the last multiple of Gated DeltaNet's chunk length in
    a hybrid model (module doc), all n in an attention-only one."""
    return n - n % CHUNK if "linear_attention" in model.config.layer_types else n


def continues(kept, prompt):
    """Whether `prompt` can continue `kept`: its ids are a proper prefix of the prompt (an equal prompt is prefilled
    afresh: the last position's logits are not kept)."""
    return kept is not None and kept.tokens < len(prompt) and tuple(prompt[:kept.tokens]) == kept.ids


def check_reuse(reuse, P):
    """reuse: None, or one Kept or None per prompt."""
    if reuse is None:
        return [None] * P
    reuse = list(reuse)
    if len(reuse) != P or any(k is not None and not isinstance(k, Kept) for k in reuse):
        raise ValueError(f"reuse= needs one prefix.Kept (a Sample's .kept) or None per prompt, "
                         f"got {len(reuse)} entries for {P} prompts")
    return reuse


def copy_row(dst, d, src, s, span):
    """Row s of cache src into row d of dst: its last `span` filled slots, real tokens all (a prompt's own), go to
    the last `span` filled slots of dst (right-aligned: dst's slots before them stay pads), with its Gated DeltaNet
    state and its next position. Both caches' `length` is set beforehand."""
    a, b = src.length - span, dst.length - span
    for x, y in zip(dst.k + dst.v, src.k + src.v):
        if x is not None:
            x[d, :, b:dst.length] = y[s, :, a:src.length]
    for x, y in zip(dst.conv + dst.state, src.conv + src.state):
        if x is not None:
            x[d] = y[s]
    dst.mask[d, b:dst.length] = True
    dst.next_pos[d] = src.next_pos[s]


def keep_row(model, cache, row, prompt, routes=None):
    """A Kept of `prompt`, whose real tokens are the last len(prompt) filled slots of `cache`'s row `row` (a
    left-padded prefill): copied out, so that the batch's cache can be freed. routes: the prompt's (Kept)."""
    out = model.new_cache(1, len(prompt))
    out.length = len(prompt)
    copy_row(out, 0, cache, row, len(prompt))
    return Kept(prompt, out, routes)


def continue_prefill(model, kept, prompt, keep=False):
    """Prefill `prompt` after a copy of `kept`'s state (its first kept.tokens ids) -> (a one-row cache of exactly
    len(prompt) slots, all filled; last-position logits (1, V) fp32; with keep, the Kept at kept_length of the
    prompt, else None; the prompt's routes (Kept.routes), None for a dense model). Positions and slots go on from
    the kept ones; with keep the call stops once at the grid point, to copy the state there out, and goes on."""
    cache = model.new_cache(1, len(prompt))
    cache.length = kept.tokens
    copy_row(cache, 0, kept.cache, 0, kept.tokens)
    cut = kept_length(model, len(prompt)) if keep else kept.tokens     # >= kept.tokens: it is on the grid too
    out, routes = (kept if keep else None), [kept.routes]
    for a, b in ((kept.tokens, cut), (cut, len(prompt))):
        if b > a:
            h = model.hidden(torch.tensor([prompt[a:b]], dtype=torch.long, device=model.device), cache=cache)
            routes.append(None if kept.routes is None else moe.recorded(model)[0])   # (b - a, M, k)
            if b == cut:
                out = keep_row(model, cache, 0, prompt[:cut], joined(routes))
    return cache, model.logits(h[:, -1]).float(), out, joined(routes)


def joined(routes):
    """Consecutive tokens' routes as one (tokens, M, k) tensor; None for a dense model's (all None)."""
    return None if routes[0] is None else torch.cat(routes)


def assemble(model, sources, extra):
    """The decode batch of P prompts from their prefilled states: sources[i] = (cache, row, tokens), prompt i's state
    being the last `tokens` filled slots of that cache's row. A cache of L + extra slots (L the longest prompt),
    each row right-aligned to slot L: left padding only, as a left-padded prefill leaves it."""
    L = max(tokens for _, _, tokens in sources)
    out = model.new_cache(len(sources), L + extra)
    out.length = L
    for i, (cache, row, tokens) in enumerate(sources):
        copy_row(out, i, cache, row, tokens)
    out.has_pad = not bool(out.mask[:, :L].all())
    return out
