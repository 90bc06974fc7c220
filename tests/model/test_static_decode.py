"""The static-shape decode step (static_decode.py) against its twin, the ordinary sampler path: same greedy tokens,
log-probs within 1e-5 in fp32, for Qwen3 and Qwen3.5 (hybrid), left-padded prompts of different lengths, stop ids
and stop strings; one set of cache buffers for every length; and, compiled, one graph for every step and both
batches (no recompilation, no graph break)."""
from dataclasses import replace

import pytest
import torch

from minigrpo import static_decode
from minigrpo.pretrained import load_pretrained
from minigrpo.sampler import Settings, sample

KINDS = ["tiny", "tiny-qwen3.5"]
VOCAB = 261
PROMPTS = [[10, 20, 30, 40, 50, 60, 70], [257, 5], [99, 98, 97, 96]]  # different lengths: left padding matters
GREEDY = Settings(n=2, max_new_tokens=10, temperature=0.0, stop_ids=(), vocab_size=VOCAB)


def assert_same(a, b):
    for x, y in zip(a, b, strict=True):
        assert (x.completion_ids, x.finish_reason, x.text) == (y.completion_ids, y.finish_reason, y.text)
        assert torch.allclose(torch.tensor(x.logprobs), torch.tensor(y.logprobs), atol=1e-5, rtol=0)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("temperature,top_p,top_k", [(0.0, 1.0, 0), (1.0, 1.0, 0), (0.7, 0.9, 5)])
def test_static_equals_the_ordinary_path(kind, temperature, top_p, top_k):
    model = load_pretrained(kind)
    s = Settings(n=3, max_new_tokens=20, temperature=temperature, top_p=top_p, top_k=top_k, vocab_size=VOCAB,
                 stop_ids=())
    assert_same(sample(model, PROMPTS, replace(s, static=True), seed=4), sample(model, PROMPTS, s, seed=4))


@pytest.mark.oracle
@pytest.mark.parametrize("kind", KINDS)
def test_static_with_stop_ids_and_strings(kind, tiny_tokenizer):
    """Rows that stop early keep decoding in the static batch (no compaction); what is returned is the same."""
    model, tok = load_pretrained(kind), tiny_tokenizer
    for seed in range(32):    # the first seed whose rows end by a stop id, by a stop string and by length
        kw = dict(seed=seed, tokenizer=tok)
        free = sample(model, PROMPTS, Settings(n=3, max_new_tokens=24, stop_ids=()), **kw)
        stop_id = free[0].completion_ids[5]
        text = free[4].text
        a = next((a for a in range(len(text) // 3, len(text) - 2) if "\ufffd" not in text[a:a + 2]), None)
        if a is None:
            continue
        stops = Settings(n=3, max_new_tokens=24, stop_ids=[stop_id], stop_strings=[text[a:a + 2]])
        plain = sample(model, PROMPTS, stops, **kw)
        reasons = {s.finish_reason for s in plain}
        if plain[0].finish_reason == "eos" and plain[4].finish_reason == "stop" and "length" in reasons:
            break
    else:
        raise AssertionError("no seed in 0..31 gives rows ending by stop id, stop string and length")
    for sync_every in (1, 5):
        static = sample(model, PROMPTS, replace(stops, static=True, sync_every=sync_every), **kw)
        assert_same(static, sample(model, PROMPTS, replace(stops, sync_every=sync_every), **kw))
        reasons = {s.finish_reason for s in static}
        assert static[0].finish_reason == "eos" and static[4].finish_reason == "stop" and "length" in reasons


def test_one_set_of_static_buffers_serves_every_length():
    """Same rows: one set of buffers at fixed addresses (a CUDA graph's), sized for the longest call so far. A
    shorter call views them at its own length (same addresses, none of the earlier call's contents leak), a longer
    one replaces them (the old ones are not kept), and a call of other rows gets its own."""
    model = load_pretrained("tiny-qwen3.5")
    static = replace(GREEDY, static=True, rows=6)
    static_decode.release(model)
    held = lambda: [(k, [t.data_ptr() for t in sc.flat if t is not None], sc.mask.shape[1])   # noqa: E731
                    for k, sc in static_decode._pool[model].items()]
    first = sample(model, PROMPTS, static)
    [(key, ptrs, slots)] = held()
    other = [[5, 6, 7, 8, 9, 10, 11, 12, 13], [40], [41, 42]]  # other lengths, the same bucket
    assert_same(sample(model, other, static), sample(model, other, GREEDY))
    assert held() == [(key, ptrs, slots)]
    long = [[7] * 300, [8] * 5]                                # a longer bucket: the buffers grow, once
    assert_same(sample(model, long, static), sample(model, long, GREEDY))
    [(_, grown, longer)] = held()
    assert longer > slots
    assert_same(sample(model, PROMPTS, static), first)         # a short call again: the long buffers, viewed
    assert held() == [(key, grown, longer)]
    sample(model, PROMPTS, replace(static, rows=8))            # other rows: buffers of their own
    assert len(static_decode._pool[model]) == 2
    static_decode.release(model)
    assert model not in static_decode._pool


@pytest.mark.slow   # inductor builds C++ on the CPU: it needs a compiler, and a cold cache takes long
def test_compiled_step_compiles_once(capsys, fresh_compile):
    """torch.compile(fullgraph=True) of the static step on the CPU (inductor): 64 decode steps of two batches whose
    prompts have other lengths run on one graph; error_on_recompile turns any recompilation into a failure, and
    fullgraph any graph break. The hybrid model has both layer kinds (Gated DeltaNet and attention)."""
    import torch._dynamo
    from torch._dynamo.utils import counters
    model = load_pretrained("tiny-qwen3.5")
    greedy = replace(GREEDY, max_new_tokens=64)
    batches = [PROMPTS, [[3] * 11, [4] * 30, [5, 6]]]  # 7/2/4 and 11/30/2 tokens: both fit the 256-slot bucket
    with torch._dynamo.config.patch(error_on_recompile=True):
        compiled = [sample(model, p, replace(greedy, compile=True)) for p in batches]
    graphs = fresh_compile()
    with capsys.disabled():
        print(f"\n[static decode] compilations: {graphs} graph(s) for 2 batches x 64 decode steps; "
              f"graph breaks: {sum(counters['graph_break'].values())}")
    assert graphs == 1 and not counters["graph_break"] and static_decode.compile_failure("cpu") is None
    for p, out in zip(batches, compiled):
        assert_same(out, sample(model, p, greedy))


LONG = replace(GREEDY, n=1, max_new_tokens=260)   # 7/2/4-token prompts + 260: the 384-slot bucket


def test_attention_reads_only_the_window_of_written_slots():
    """Each decode step's attention sees the keys of the length bucket of the slots written so far (its new token
    included), not the whole cache: 256 keys while at most 256 slots are written, then 384 (the cache's slots).
    Reading every slot of the cache (384 from the first token) or a window one slot short at a bucket's edge (the
    new token's own key left out) fails here; the tokens and log-probs stay the ordinary path's."""
    from minigrpo.run.attention_kernels import Recorder
    model = load_pretrained("tiny-qwen3.5")
    attention_layers = sum(t == "full_attention" for t in model.config.layer_types)
    with Recorder() as rec:
        static = sample(model, PROMPTS, replace(LONG, static=True))
    keys = [c.k[0][2] for c in rec.calls if c.mask[0][2] == 1]         # the decode steps' calls: one query
    L, steps = max(map(len, PROMPTS)), LONG.max_new_tokens - 1          # the last token is sampled, not decoded
    S = static_decode.bucket_len(L + LONG.max_new_tokens)
    want = [min(static_decode.bucket_len(L + t + 1), S) for t in range(steps) for _ in range(attention_layers)]
    assert S == 384 and keys == want and {256, 384} <= set(keys)
    assert sum(keys) < 0.75 * S * len(keys)                             # a quarter fewer keys read than all slots
    assert_same(static, sample(model, PROMPTS, LONG))


def test_read_windows_compile_one_graph(monkeypatch, capsys, fresh_compile):
    """Compiled (the "eager" backend: dynamo's graphs and guards without inductor's code generation), the read
    window is a dynamic shape like the slot count: two calls of other cache lengths (384 and 768 slots), whose steps
    read windows of 256 to 768 slots, some short of the cache's slots and some all of them, run on one graph."""
    from torch._dynamo.utils import counters
    real_step = static_decode.compiled_step
    monkeypatch.setattr(static_decode, "compiled_step", lambda device, backend="inductor": real_step(device, "eager"))
    windows = []
    real_window = static_decode.StaticCache.window
    monkeypatch.setattr(static_decode.StaticCache, "window",
                        lambda self: (real_window(self), windows.append((self.read.shape[0], self.mask.shape[1]))))
    model = load_pretrained("tiny-qwen3.5")
    batches = [PROMPTS, [[3] * 300, [4] * 120]]
    with torch._dynamo.config.patch(error_on_recompile=True):
        compiled = [sample(model, p, replace(LONG, compile=True, rows=4)) for p in batches]   # a run's fixed rows
    graphs = fresh_compile()
    with capsys.disabled():
        print(f"\n[static decode] read windows (window, cache slots) {sorted(set(windows))}: {graphs} graph(s)")
    assert graphs == 1 and not counters["graph_break"] and static_decode.compile_failure("cpu", "eager") is None
    assert sorted(set(windows)) == [(256, 384), (384, 384), (384, 768), (512, 768), (768, 768)]
    for p, out in zip(batches, compiled):
        assert_same(out, sample(model, p, LONG))
