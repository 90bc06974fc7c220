"""Static-shape decoding: a decode step whose tensors keep their shapes and addresses from one token to the next, so
that `torch.compile(fullgraph=True)` compiles it once and, on CUDA, mode="reduce-overhead" replays it as a CUDA
graph. The ordinary step (sampler.decode_step) cannot be captured: attention reads `k[:, :, :length]`, so the key
length grows by one every token, and batch compaction changes the batch size.

What changes here (the model's modules and weights are the same): attention reads the preallocated cache's slots
written, to their length bucket (`StaticCache.window`), under a mask; the new K/V go to `next_slot`, a tensor the
step advances in place; the batch has the run's row count and max_len is one of a few buckets (`bucket_len`);
finished rows stay; nothing is merged (a LoRA model decodes as itself). Why each, and the tests that hold it to the ordinary path: docs/benchmarks.md, "The fast decode path".

Shape letters: B rows being decoded, P prompts, S = max_len cache slots, H hidden size, V vocab.
"""

import math
import weakref

import torch

from minigrpo import compiling

SMALLEST = 256  # the smallest max_len bucket


def bucket_len(n):
    """The max_len bucket for n slots: the smallest of 256, 384, 512, 768, 1024, 1536, ... (2^k and 1.5 * 2^k)
    that holds n. At most 1.5x the slots needed, and a few buckets cover every length a run meets."""
    size = SMALLEST
    while size < n:
        size = size * 3 // 2 if size & (size - 1) == 0 else size * 4 // 3   # 2^k -> 1.5 * 2^k -> 2^(k+1)
    return size


def bucket_rows(rows_needed, rows=None):
    """The decode batch for a call of `rows_needed` rows: `rows` (the run's fixed count) when it holds them, else the
    next power of two (calls larger than the run's rows are split first: whole_prompt_calls)."""
    if rows is not None and rows_needed <= rows:
        return rows
    return 1 << (rows_needed - 1).bit_length()


def whole_prompt_calls(P, n, rows=None):
    """How a sampler call of P prompts x n samples runs at the run's fixed row count `rows`: slices of whole prompts,
    as many per call as the rows hold (a sample depends on its prompt's seed only, so how the prompts are split
    changes no sample). One slice when they all fit, or without `rows`."""
    per = rows // n if rows and n <= rows < P * n else P
    return [slice(i, i + per) for i in range(0, P, per)]


def new_slots(prompts, max_new_tokens):
    """The slots to prefill beyond the longest prompt: up to the length bucket that holds max_new_tokens more."""
    L = max(map(len, prompts))
    return bucket_len(L + max_new_tokens) - L


def start(model, cache, n, rows=None, compile=False):
    """(StaticCache, decode step) for a prefilled model.Cache of P prompts, each decoded n times: the model's pooled
    cache of bucket_rows(P * n, rows) rows, loaded, and decode_step, or compiled_step when `compile` (a string names
    the torch.compile backend, default inductor)."""
    cache = static_cache(model, cache, n, bucket_rows(cache.mask.shape[0] * n, rows))
    if not compile:
        return cache, decode_step
    return cache, compiled_step(model.device, compile if isinstance(compile, str) else "inductor")   # or uncompiled


def _layout(like, rows):
    """(shape, dtype) of each StaticCache tensor for model.Cache `like` with `rows` rows, in StaticCache.tensors()
    order (k, v, conv, state per layer, then mask, next_pos, next_slot), then the slot ids; None for a layer of the
    other kind."""
    per_layer = [None if x is None else ((rows,) + x.shape[1:], x.dtype) for x in like.k + like.v + like.conv + like.state]
    return per_layer + [((rows, like.max_len), like.mask.dtype), ((rows,), like.next_pos.dtype),
                        ((1,), like.next_pos.dtype), ((like.max_len,), like.next_pos.dtype)]


class StaticCache:
    """The model's cache at fixed shapes and addresses. Same per-layer tensors as model.Cache (k, v (B, nkv, S, hd);
    conv (B, C, K-1); state (B, nv, dk, dv) fp32; None where the layer is of the other kind) and the same per-layer
    methods (`update`, `update_state`), plus mask (B, S) bool real tokens among the slots, next_pos (B,) real tokens
    per row (the next position), and next_slot (1,) long: the slot the next token goes to, the same for every row
    (left-padded layout).

    Each tensor is the first elements of a flat buffer (`flat`), so one set of buffers, sized for the run's longest
    call, serves every shorter call too: `for_call` views them at another slot count, contiguous, at the same
    addresses. The slot count S is marked dynamic: the compiled step is one graph for every length.

    `read` (W,) is the slot ids attention reads this step, [0, W): `window` sets it on the host before each step,
    from `written` (a host int, the slots filled: no sync). Its length is all the graph takes from it."""

    def __init__(self, like, rows, flat=None):
        """Shaped as model.Cache `like`, with `rows` rows: zeroed buffers, or views of `flat` (at least as large)."""
        layout = _layout(like, rows)
        device = like.mask.device
        if flat is None:
            flat = [None if x is None else torch.zeros(math.prod(x[0]), dtype=x[1], device=device) for x in layout]
            torch.arange(flat[-1].numel(), out=flat[-1])  # slot ids: a prefix of them is a shorter call's
        self.flat = flat
        ts = [None if x is None else f[:math.prod(x[0])].view(x[0]) for f, x in zip(self.flat, layout)]
        n = len(like.k)
        self.k, self.v, self.conv, self.state = (ts[i * n:(i + 1) * n] for i in range(4))
        self.mask, self.next_pos, self.next_slot, self.slot_ids = ts[4 * n:]
        self.written, self.read, self._reads = like.length, None, {}
        for t in self.tensors():
            torch._dynamo.mark_static_address(t)  # CUDA graphs: read and written in place, never re-allocated
        for t in [t for t in self.k + self.v if t is not None]:
            torch._dynamo.mark_dynamic(t, 2)      # (B, nkv, S, hd): one graph for every slot count
        torch._dynamo.mark_dynamic(self.mask, 1)  # (B, S)

    def holds(self, like, rows):
        """Whether the buffers hold a call shaped as `like` with `rows` rows."""
        return all(x is None or math.prod(x[0]) <= f.numel() for f, x in zip(self.flat, _layout(like, rows)))

    def for_call(self, like, rows):
        """This cache's buffers viewed at `like`'s slot count (a shorter call's cache: the same memory)."""
        return self if self.mask.shape[1] == like.max_len else StaticCache(like, rows, self.flat)

    def tensors(self):
        return [t for t in self.k + self.v + self.conv + self.state + [self.mask, self.next_pos, self.next_slot]
                if t is not None]

    def window(self):
        """On the host, before a step: `read` = the slots [0, W) its attention reads, W = bucket_len of the slots
        written once the step's token is in (capped at S). One view per W, held: a fixed address for CUDA graphs."""
        W = min(bucket_len(self.written + 1), self.mask.shape[1])
        if W not in self._reads:
            self._reads[W] = read = self.slot_ids[:W]
            torch._dynamo.mark_static_address(read)
            torch._dynamo.mark_dynamic(read, 0)   # one graph for every window
        self.read = self._reads[W]
        self.written += 1

    def update(self, i, k, v):
        """Layer i's key and value of the one new token (B, nkv, 1, hd) go to next_slot; attention reads the
        window's slots (B, nkv, W, hd), the unwritten ones masked."""
        self.k[i].index_copy_(2, self.next_slot, k)
        self.v[i].index_copy_(2, self.next_slot, v)
        W = self.read.shape[0]
        return self.k[i][:, :, :W], self.v[i][:, :, :W]

    def update_state(self, i, conv, state):
        """As model.Cache.update_state: Gated DeltaNet layer i's new conv inputs and memory, copied in place."""
        self.conv[i].copy_(conv)
        self.state[i].copy_(state)

    def load(self, cache, n):
        """Copy a prefilled model.Cache (P rows) in, each row repeated n times: row r takes prompt r // n; the rows
        past P*n (padding up to the fixed row count) take the last prompt. Every element is written: nothing of an
        earlier call (of another length, in the same buffers) is left."""
        P = cache.mask.shape[0]
        src = (torch.arange(self.mask.shape[0], device=self.mask.device) // n).clamp_(max=P - 1)
        for dst, s in zip(self.tensors()[:-1], cache_tensors(cache)):
            torch.index_select(s, 0, src, out=dst)
        self.next_slot.fill_(cache.length)
        self.written = cache.length
        return self


def cache_tensors(cache):
    return [t for t in cache.k + cache.v + cache.conv + cache.state + [cache.mask, cache.next_pos] if t is not None]


def shape_key(cache, rows):
    """What a StaticCache's buffers depend on: rows, device and each layer's kind and dtype (not the slot count:
    one set of buffers serves every length)."""
    kinds = tuple(None if a is None else a.dtype for a in cache.k + cache.state)
    return rows, cache.mask.device, kinds


_pool = weakref.WeakKeyDictionary()  # model -> {shape_key: its StaticCache, sized for the longest call so far}


def static_cache(model, cache, n, rows):
    """The model's StaticCache of `rows` rows for `cache` (P prompts, each decoded n times; P*n <= rows), loaded
    from `cache`: the pooled buffers viewed at this call's length, or, for a call longer than any before, new buffers
    of its length that replace them (the old ones are freed first: one set is held, the longest call's)."""
    caches = _pool.setdefault(model, {})
    key = shape_key(cache, rows)
    if key not in caches or not caches[key].holds(cache, rows):
        caches.pop(key, None)
        caches[key] = StaticCache(cache, rows)
    return caches[key].for_call(cache, rows).load(cache, n)


def release(model):
    """Free the model's pooled StaticCaches (their memory returns to the allocator)."""
    _pool.pop(model, None)


def decode_step(model, tokens, cache):
    """One new token per row at fixed shapes: (B,) -> next-token logits (B, V) fp32. Advances cache.next_slot and
    cache.next_pos in place. The same layers as model.Qwen.hidden, with tensor positions and a tensor slot."""
    cache.window()
    return _step(model, tokens, cache)


def _step(model, tokens, cache):
    """decode_step once the host has set the read window: what torch.compile compiles."""
    x = model.model.embed_tokens(tokens[:, None])                    # (B, 1, H)
    rope = model.model.rotary(cache.next_pos[:, None], x.dtype)      # the row's next position
    cache.mask.index_fill_(1, cache.next_slot, True)
    # (B, 1, 1, W): written slots, real tokens. Gathered, not sliced: a slice is contiguous only when W = S, and
    # the compiled graph would specialize on that (a second graph once the window reaches the cache's end)
    mask = cache.mask.index_select(1, cache.read)[:, None, None, :]
    for layer in model.model.layers:
        x = layer(x, rope, attn_mask=mask, cache=cache)
    cache.next_pos.add_(1)
    cache.next_slot.add_(1)
    return model.logits(model.model.norm(x)[:, -1]).float()          # (B, V)


_compiled = {}
STEP = "decode step"  # what compiling.py names the compiled step's failures by


class CompileFailed(RuntimeError):
    """The compiled step raised (no C compiler, no Python headers, a Triton or inductor error): `decode_call` decodes
    the call again, from its prefill, with the uncompiled step."""


def compile_failure(device, backend="inductor"):
    """The error ("Type: message") that stopped the compiled step on this device type, or None."""
    return compiling.failure(STEP, device, backend)


def compiled_step(device, backend="inductor"):
    """decode_step under torch.compile, one compiled function per (device type, backend) for the process: fullgraph
    (a graph break is an error), static shapes but the cache's slot count (StaticCache marks it dynamic: one graph
    for a run's lengths), bf16 rounded as eager rounds it, and on CUDA with inductor CUDA graphs
    (mode="reduce-overhead"'s option), which record the step and replay it (one recording per length bucket, from
    the same graph). Another backend ("eager", "aot_eager") runs the same graphs uncompiled: tests count graphs with
    it on a slow CPU. If the compiled step ever raises, it prints one warning line naming the error and raises
    CompileFailed; from then on this returns the uncompiled decode_step."""
    kind = torch.device(device).type
    if compile_failure(kind, backend):
        return decode_step
    if (kind, backend) not in _compiled:
        graphs = kind == "cuda" and backend == "inductor"
        # emulate_precision_casts: round to bf16 wherever eager rounds. Without it a fused kernel keeps fp32
        # between ops, so the sampler's arithmetic drifts from the trainer's eager forward by more than a small
        # LoRA update moves it (the sampled policy is then not the one trained).
        options = {"triton.cudagraphs": graphs, "emulate_precision_casts": True} if backend == "inductor" else None
        fn = torch.compile(_step, fullgraph=True, dynamic=False, backend=backend, options=options)

        def step(model, tokens, cache):
            if graphs:  # a new replay may overwrite the previous step's outputs: the sampler has consumed them
                torch.compiler.cudagraph_mark_step_begin()
            cache.window()
            try:
                with compiling.strict():
                    return fn(model, tokens, cache)
            except Exception as e:  # noqa: BLE001  every compile failure: the run goes on uncompiled
                why = compiling.give_up(STEP, kind, backend, e, "decoding with the uncompiled static step from now "
                                                                "on (the same tokens, slower)")
                raise CompileFailed(why) from e
        _compiled[kind, backend] = step
    return _compiled[kind, backend]


def decode_call(model, prefilled, settings, decode):
    """decode(static cache, step) for a prefilled model.Cache, as `start` sets them up from the sampler's settings
    (n, rows, compile); if the compiled step fails (CompileFailed, whose warning has been printed), the call is
    decoded again from `prefilled` uncompiled, so no half-run step is ever continued."""
    s = settings
    try:
        return decode(*start(model, prefilled, s.n, s.rows, s.compile))
    except CompileFailed:
        return decode(*start(model, prefilled, s.n, s.rows, False))
