"""The cache kept across turns (minigrpo/prefix.py, sampler.sample(keep=True, reuse=...)): a prompt that continues
a kept state samples what a fresh prefill of the whole prompt samples (greedy tokens equal, fp32 log-probs within
1e-5), for Qwen3 and Qwen3.5 (hybrid Gated DeltaNet), on the eager and the static path, several rows of different
kept and new lengths in one call, states continued twice; a reuse that is not a proper prefix is prefilled afresh;
the counts; a kept state is the state of the prompt's start (all of it for Qwen3, up to its last multiple of 64
tokens for Qwen3.5: prefix.kept_length) prefilled alone, and is never modified."""
from argparse import Namespace
from dataclasses import replace

import pytest
import torch

from minigrpo import prefix, static_decode
from minigrpo.run.dist import Dist
from minigrpo.pretrained import load_pretrained
from minigrpo.sampler import Settings, sample

KINDS = ["tiny", "tiny-qwen3.5"]
VOCAB = 261
GREEDY = Settings(n=1, max_new_tokens=10, temperature=0.0, stop_ids=(), vocab_size=VOCAB)


@pytest.fixture(scope="module", params=KINDS)
def model(request):
    return load_pretrained(request.param).eval()


def ids(seed, n):
    return torch.randint(0, 256, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


# three conversations whose first turns were 70, 89 and 130 tokens: Qwen3 keeps them whole (then 80, 1 and 22 new
# tokens; one: a single-token prefill), Qwen3.5 up to 64, 64 and 128 tokens (its prefill starts on the chunk grid)
FULL = [ids(1, 150), ids(2, 90), ids(3, 152)]
KEPT_AT = [70, 89, 130]


def assert_same(a, b, atol=1e-5):
    for x, y in zip(a, b, strict=True):
        assert (x.prompt_index, x.completion_ids, x.finish_reason) == \
            (y.prompt_index, y.completion_ids, y.finish_reason)
        assert torch.allclose(torch.tensor(x.logprobs), torch.tensor(y.logprobs), atol=atol, rtol=0)


def states(kept):
    """Every tensor of a Kept, cloned, and its length and ids."""
    c = kept.cache
    return [t.clone() for t in c.k + c.v + c.conv + c.state + [c.mask, c.next_pos] if t is not None], c.length, kept.ids


def assert_states_close(a, b, atol=1e-5):
    (ta, la, ia), (tb, lb, ib) = a, b
    assert (la, ia) == (lb, ib) and len(ta) == len(tb)
    for x, y in zip(ta, tb):
        assert x.shape == y.shape and x.dtype == y.dtype
        assert torch.allclose(x.float(), y.float(), atol=atol, rtol=0)


def kept_of(model, prompts, settings=GREEDY):
    """The Kept of each prompt (keep=True), one per prompt."""
    out = sample(model, prompts, settings, keep=True)
    return [out[i * settings.n].kept for i in range(len(prompts))]


@pytest.mark.parametrize("static", [False, True])
def test_continued_equals_fresh(model, static):
    """Rows continuing states of 70, 89 and 2 tokens with 80, 1 and 150 new ones, and a fresh row, in one call of
    n=2: the same tokens and log-probs as prefilling every prompt afresh; greedy, and sampled with a seed."""
    prompts = FULL + [ids(4, 33)]
    reuse = kept_of(model, [p[:k] for p, k in zip(FULL, KEPT_AT)], replace(GREEDY, static=static)) + [None]
    greedy = replace(GREEDY, n=2, static=static)
    for settings, seed in ((greedy, None), (replace(greedy, temperature=1.0, top_k=20), 7)):
        fresh = sample(model, prompts, settings, seed=seed)
        continued = sample(model, prompts, settings, seed=seed, reuse=reuse)
        assert_same(continued, fresh)
    kept = [prefix.kept_length(model, k) for k in KEPT_AT]
    assert [k.tokens for k in reuse[:3]] == kept == ([70, 89, 130] if model.config.family == "qwen3" else [64, 64, 128])
    assert [(s.prefilled, s.reused) for s in continued] == [(len(p) - k, k) if j == 0 else (0, 0)
                                                            for p, k in zip(FULL, kept) for j in range(2)] + \
        [(33, 0), (0, 0)]
    assert [(s.prefilled, s.reused) for s in fresh] == [(150, 0), (0, 0), (90, 0), (0, 0), (152, 0), (0, 0),
                                                        (33, 0), (0, 0)]


@pytest.mark.parametrize("static", [False, True])
def test_a_conversation_continued_turn_after_turn(model, static):
    """Three turns, each prompt the last one plus the answer and more: every turn continues the state the last one
    kept; the samples equal fresh prefills', and the kept state of the last turn is the fresh one's."""
    convo, reuse, greedy = [FULL[0][:70], FULL[2][:5]], [None, None], replace(GREEDY, static=static)
    for turn in range(3):
        got = sample(model, convo, greedy, keep=True, reuse=reuse)
        fresh = sample(model, convo, greedy, keep=True)
        assert_same(got, fresh)
        assert [s.reused for s in got] == [0 if k is None else len(k.ids) for k in reuse]
        for a, b in zip(got, fresh):
            cut = prefix.kept_length(model, len(convo[a.prompt_index]))
            if cut == 0:                      # Qwen3.5, a prompt shorter than a chunk: nothing kept
                assert a.kept is None and b.kept is None
                continue
            assert a.kept.ids == tuple(convo[a.prompt_index][:cut]) and a.kept.tokens == cut
            assert_states_close(states(a.kept), states(b.kept))
        reuse = [s.kept for s in got]
        convo = [c + s.completion_ids + ids(10 + turn + i, 40 + 30 * i) for i, (c, s) in enumerate(zip(convo, got))]


def test_the_kept_state_is_the_prompt_prefilled_alone(model):
    """A prompt's kept state out of a left-padded batch: the state of the prompt prefilled on its own, slot for slot
    its real tokens only, with its next position."""
    prompts = [FULL[0][:40], FULL[1][:3], FULL[2][:64], FULL[2][:150]]
    kept = kept_of(model, prompts, replace(GREEDY, n=2))
    for p, k in zip(prompts, kept):
        p = p[:prefix.kept_length(model, len(p))]
        if not p:
            assert k is None
            continue
        alone = model.new_cache(1, len(p))
        with torch.no_grad():
            model.hidden(torch.tensor([p]), cache=alone)
        alone = prefix.Kept(p, alone)
        assert k.cache.max_len == len(p) and k.cache.length == len(p) and not k.cache.has_pad
        assert bool(k.cache.mask.all()) and k.cache.next_pos.tolist() == [len(p)]
        assert_states_close(states(k), states(alone))


def test_the_n_samples_of_a_prompt_share_one_kept_state_that_nothing_modifies(model):
    """keep=True with n=3: one Kept per prompt, on each of its samples. Continued by two calls and by two episodes
    at once (the G episodes of a prompt), its tensors are what they were."""
    out = sample(model, [FULL[0][:70], FULL[1][:80]], replace(GREEDY, n=3), keep=True)
    assert [s.kept is out[0].kept for s in out] == [True] * 3 + [False] * 3
    assert out[3].kept is out[5].kept
    kept = out[0].kept
    before = states(kept)
    a = sample(model, [FULL[0][:100], FULL[0][:71]], GREEDY, reuse=[kept, kept])
    b = sample(model, [FULL[0][:120]], replace(GREEDY, n=2, static=True), reuse=[kept])
    assert [s.reused for s in a + b] == [kept.tokens] * 3 + [0]
    (t0, l0, i0), (t1, l1, i1) = before, states(kept)
    assert (l0, i0) == (l1, i1) and all(torch.equal(x, y) for x, y in zip(t0, t1))


def test_reuse_that_is_not_a_proper_prefix_is_prefilled_afresh(model):
    """A kept state whose ids differ from the prompt's start, one as long as the prompt (its last logits are not
    kept) and one longer: each prompt prefilled afresh, counted so, sampling as without reuse."""
    long = ids(9, 192)
    p = long[:128]                                   # on Qwen3.5's grid: its kept state is all of it
    other = list(p[:70])
    other[7] = (other[7] + 1) % 256
    reuse = kept_of(model, [other, p, long])
    assert [k.tokens for k in reuse] == [prefix.kept_length(model, 70), 128, 192]
    got = sample(model, [p, p, p], replace(GREEDY, n=2), reuse=reuse)
    assert_same(got, sample(model, [p, p, p], replace(GREEDY, n=2)))
    assert [(s.prefilled, s.reused) for s in got] == [(128, 0), (0, 0)] * 3


def test_compiled_continuation_equals_fresh(fresh_compile):
    """The compiled static step (backend "eager": the same graphs, uncompiled) after a continued prefill, the call
    split into calls of one prompt each (rows=2 for 2 x n=2 rows): each part continues its own prompts' states."""
    model = load_pretrained("tiny-qwen3.5")
    reuse = kept_of(model, [FULL[0][:70], FULL[1][:80]])
    got = sample(model, FULL[:2], replace(GREEDY, n=2, compile="eager", rows=2), reuse=reuse)
    assert_same(got, sample(model, FULL[:2], replace(GREEDY, n=2)))
    assert [s.reused for s in got] == [64, 0, 64, 0]
    assert fresh_compile() == 1 and static_decode.compile_failure("cpu", "eager") is None   # compiled, one graph


def test_bad_reuse_is_one_line():
    model = load_pretrained("tiny")
    with pytest.raises(ValueError, match=r"reuse= needs one prefix.Kept .* got 1 entries for 2 prompts"):
        sample(model, FULL[:2], GREEDY, reuse=[None])
    with pytest.raises(ValueError, match="reuse= needs one prefix.Kept"):
        sample(model, FULL[:2], GREEDY, reuse=[None, FULL[0]])


@pytest.mark.oracle      # train.py: the run-time packages (the tokenizer's first)
def test_the_rollout_sampler_passes_keep_and_reuse():
    """train.py's rollout_step hands the task a sampler(prompts, seeds, n, reuse=None, keep=False): a task that keeps
    its first turn's state and continues it gets what the same sampler samples with a fresh prefill."""
    pytest.importorskip("tokenizers")
    import train
    model = load_pretrained("tiny-qwen3.5")
    args = Namespace(seed=3, group_size=2, decode="eager", max_new_tokens=6, temperature=1.0, top_p=1.0, top_k=0)
    tok = Namespace(eos_ids=[], vocab_size=VOCAB, decode=lambda ids: "", pad_id=0)
    later = [FULL[0][:79], FULL[0][:88]]

    class Task:
        stop_strings, chunk = [], None

        def rollout(self, sampler, tok, examples, seeds, args):
            first = sampler([FULL[0][:70]], seeds, 2, keep=True)
            return first, sampler(later, [11, 12], 1, reuse=[s.kept for s in first[0]])

    (first, second), _ = train.rollout_step(model, tok, Task(), args, 0, [(0, {"id": "a"})], Dist())
    assert first[0][0].kept is first[0][1].kept and first[0][0].kept.tokens == 64      # Qwen3.5: on the grid
    assert [(g[0].prefilled, g[0].reused) for g in second] == [(15, 64), (24, 64)]
    fresh = train.rollout_sampler(model, tok, train.sampler_settings(args, tok, model.device, rows=2))
    want = fresh(later, [11, 12], 1)
    assert_same([g[0] for g in second], [g[0] for g in want])
