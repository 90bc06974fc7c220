"""Static-shape decoding: a decode step whose tensors keep their shapes from one token to the next, so that
`torch.compile(fullgraph=True)` compiles it once and, on CUDA, mode="reduce-overhead" replays it as a CUDA graph.

Why the ordinary step (sampler.decode_step) cannot be captured: its cache is filled up to `cache.length`, a Python
int, and attention reads `k[:, :, :length]`, so the key length (a shape) grows by one every token; batch compaction
changes the batch size too. A CUDA graph replays fixed kernels on fixed addresses and shapes.

What changes here, and nothing else (the model's modules and weights are the same):
- Attention reads every slot of the preallocated cache, [0, max_len), with a (B, 1, 1, max_len) mask: the slots
  not yet written are False, like left padding. The new K/V go to slot `pos` with `index_copy_`, where `pos` is a
  one-element tensor that the step advances in place (model.Attention takes a tensor `start` to mean this).
- Positions are `cache.seen` (a tensor), RoPE is computed from it inside the graph.
- Gated DeltaNet's conv and recurrent state are fixed-size already; Block copies them into the cache in place.
- The cache lives at fixed addresses: one StaticCache per model is kept and reused while (rows, max_len) stay the
  same, and max_len is rounded up to a multiple of BUCKET, so that prompts of other lengths reuse the same graph.
- No batch compaction: a finished row keeps decoding (its tokens are discarded). At the batch sizes of GRPO a
  decode step costs the weights' read, not the rows, so this is nearly free on a GPU.

Its twin is the ordinary path: tests check that greedy tokens are equal and log-probs agree to 1e-5 in fp32
(tests/test_static_decode.py), and that the compiled step compiles once with no graph break.

Shape letters: B rows being decoded, P prompts, S = max_len cache slots, H hidden size, V vocab.
"""

import weakref

import torch

BUCKET = 128  # max_len is rounded up to this: prompts whose length + max_new_tokens land in the same bucket share a graph


def padded_len(n):
    return -(-n // BUCKET) * BUCKET


class StaticCache:
    """The model's cache at fixed shapes and addresses. Same per-layer tensors as model.Cache (k, v (B, nkv, S, hd);
    conv (B, C, K-1); state (B, nv, dk, dv) fp32; None where the layer is of the other kind), plus
    mask (B, S) bool real tokens among the slots, seen (B,) real tokens per row (the next position), and
    pos (1,) long: the slot the next token goes to, the same for every row (left-padded layout)."""

    def __init__(self, like, rows):
        """Zeroed tensors shaped as model.Cache `like`, with `rows` rows."""
        each = lambda xs: [None if x is None else x.new_zeros((rows,) + x.shape[1:]) for x in xs]
        self.k, self.v, self.conv, self.state = each(like.k), each(like.v), each(like.conv), each(like.state)
        self.mask = like.mask.new_zeros(rows, like.max_len)
        self.seen = like.seen.new_zeros(rows)
        self.pos = like.seen.new_zeros(1)
        for t in self.tensors():
            torch._dynamo.mark_static_address(t)  # CUDA graphs: read and written in place, never re-allocated

    def tensors(self):
        return [t for t in self.k + self.v + self.conv + self.state + [self.mask, self.seen, self.pos]
                if t is not None]

    def matches(self, like, rows):
        return self.mask.shape == (rows, like.max_len) and self.mask.device == like.mask.device and all(
            (a is None and b is None) or (a is not None and b is not None and a.dtype == b.dtype)
            for a, b in zip(self.k + self.state, like.k + like.state))

    def load(self, cache, n):
        """Copy a prefilled model.Cache (P rows) in, each row repeated n times: row r takes prompt r // n."""
        src = torch.arange(self.mask.shape[0], device=self.mask.device) // n
        for dst, s in zip(self.tensors()[:-1], cache_tensors(cache)):
            torch.index_select(s, 0, src, out=dst)
        self.pos.fill_(cache.length)
        return self


def cache_tensors(cache):
    return [t for t in cache.k + cache.v + cache.conv + cache.state + [cache.mask, cache.seen] if t is not None]


_pool = weakref.WeakKeyDictionary()  # model -> its StaticCache (one per model: the last shape used)


def static_cache(model, cache, n):
    """The model's StaticCache for P*n rows of `cache` (reused when the shape matches), loaded from `cache`."""
    rows = cache.mask.shape[0] * n
    sc = _pool.get(model)
    if sc is None or not sc.matches(cache, rows):
        _pool.pop(model, None)  # free the old buffers before allocating new ones
        sc = _pool[model] = StaticCache(cache, rows)
    return sc.load(cache, n)


def release(model):
    """Free the model's kept StaticCache (its memory returns to the allocator)."""
    _pool.pop(model, None)


def decode_step(model, tokens, cache):
    """One new token per row at fixed shapes: (B,) -> next-token logits (B, V) fp32. Advances cache.pos and
    cache.seen in place. The same layers as model.Qwen.hidden, with tensor positions and a tensor slot."""
    x = model.model.embed_tokens(tokens[:, None])                    # (B, 1, H)
    cos, sin = model.model.rotary(cache.seen[:, None], x.dtype)      # the row's next position
    cache.mask.index_fill_(1, cache.pos, True)
    mask = cache.mask[:, None, None, :]                              # (B, 1, 1, S): written slots, real tokens
    for i, layer in enumerate(model.model.layers):
        x = layer(x, cos, sin, mask, None, cache, i, cache.pos)      # a tensor slot: Attention writes by index
    cache.seen.add_(1)
    cache.pos.add_(1)
    return model.logits(model.model.norm(x)[:, -1]).float()          # (B, V)


_compiled = {}


def compiled_step(device):
    """decode_step under torch.compile, one compiled function per device type for the process: fullgraph (a graph
    break is an error), static shapes (dynamic=False: a new shape is a new graph, never a dynamic one), and on CUDA
    mode="reduce-overhead", which records the step as a CUDA graph and replays it."""
    kind = torch.device(device).type
    if kind not in _compiled:
        mode = "reduce-overhead" if kind == "cuda" else None
        fn = torch.compile(decode_step, fullgraph=True, dynamic=False, mode=mode)
        if kind == "cuda":
            def step(model, tokens, cache):
                # a new replay may overwrite the previous step's outputs: the sampler has consumed them by now
                torch.compiler.cudagraph_mark_step_begin()
                return fn(model, tokens, cache)
            _compiled[kind] = step
        else:
            _compiled[kind] = fn
    return _compiled[kind]
