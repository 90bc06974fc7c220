"""The group sampler: greedy = uncached argmax = transformers, stops as documented, seeded, and its log-probs equal
logprobs.token_logprobs teacher-forced on the same sequences (docs/pitfalls.md 5-7, 9, 11)."""

from dataclasses import replace

import pytest
import torch

from minigrpo.logprobs import token_logprobs
from minigrpo.pretrained import QwenConfig
from minigrpo.pretrained import load_pretrained
from minigrpo.sampler import Settings, cut_after_stop, sample

KINDS = ["tiny", "tiny-qwen3.5"]
VOCAB = 261  # byte tokenizer ids; the tiny embedding has 272 rows
PROMPTS = [[10, 20, 30, 40, 50, 60, 70], [257, 5], [99, 98, 97, 96]]  # different lengths: left padding matters
FREE = Settings(n=2, max_new_tokens=4, stop_ids=())   # no stop: every row runs to max_new_tokens


@pytest.fixture(scope="module", params=KINDS)
def kind(request):
    return request.param


def argmax_loop(model, prompt, steps):
    """The naive twin: no cache, the whole sequence every step."""
    ids = list(prompt)
    for _ in range(steps):
        with torch.no_grad():
            ids.append(int(model(torch.tensor([ids]))[0, -1].argmax()))
    return ids[len(prompt):]


@pytest.mark.oracle
def test_greedy_equals_argmax_loop_and_transformers(kind, tmp_path):
    from transformers import AutoConfig, AutoModelForCausalLM
    raw = dict(QwenConfig.tiny(kind).raw)
    cfg = AutoConfig.for_model(raw.pop("model_type"), **raw)
    torch.manual_seed(0)
    hf = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    hf.save_pretrained(tmp_path)
    model = load_pretrained(str(tmp_path))
    steps = 12
    out = sample(model, PROMPTS, replace(FREE, max_new_tokens=steps, temperature=0))
    assert [s.prompt_index for s in out] == [0, 0, 1, 1, 2, 2]
    for i, prompt in enumerate(PROMPTS):
        ref = argmax_loop(model, prompt, steps)
        assert out[2 * i].completion_ids == ref and out[2 * i + 1].completion_ids == ref
        assert out[2 * i].finish_reason == "length"
        with torch.no_grad():
            g = hf.generate(torch.tensor([prompt]), max_new_tokens=steps, do_sample=False, eos_token_id=None,
                            pad_token_id=0)
        assert g[0, len(prompt):].tolist() == ref


def test_vocab_padding_rows_never_sampled():
    model = load_pretrained("tiny")
    with torch.no_grad():
        model.lm_head.weight[VOCAB:] = 1.0  # tied: padding rows of the embedding, never an input
    free = sample(model, PROMPTS, FREE, seed=0)
    assert any(t >= VOCAB for s in free for t in s.completion_ids)  # without the mask they win
    masked = sample(model, PROMPTS, replace(FREE, vocab_size=VOCAB), seed=0)
    assert all(t < VOCAB for s in masked for t in s.completion_ids)


def test_seeds(kind):
    model = load_pretrained(kind)
    four = replace(FREE, n=4, max_new_tokens=8, vocab_size=VOCAB)
    run = lambda seed: [s.completion_ids for s in sample(model, PROMPTS, four, seed=seed)]
    a, b, c = run(1), run(1), run(2)
    assert a == b and a != c
    for i in range(len(PROMPTS)):
        group = a[4 * i:4 * i + 4]
        assert len({tuple(g) for g in group}) == 4  # the n samples of a prompt differ
    torch.manual_seed(5)
    unseeded = Settings(n=2, max_new_tokens=4, vocab_size=VOCAB)
    d = sample(model, PROMPTS, unseeded)
    torch.manual_seed(5)
    assert [s.completion_ids for s in d] == [s.completion_ids for s in sample(model, PROMPTS, unseeded)]


def first_stop(ids, tok, stop_ids, stop_strings):
    """Brute force: the first token that is a stop id or whose prefix text first contains a stop string."""
    for j, t in enumerate(ids):
        if t in stop_ids:
            return j + 1, "eos"
        if any(s in tok.decode(ids[:j + 1]) for s in stop_strings):
            return j + 1, "stop"
    return len(ids), "length"


@pytest.mark.oracle
def test_stop_ids_and_strings_end_only_their_row(kind, tiny_tokenizer):
    model, tok = load_pretrained(kind), tiny_tokenizer
    for seed in range(3, 50):    # the first seed whose draws end row 0 at the stop id and row 4 at the stop string
        base, kw = Settings(n=3, max_new_tokens=24), dict(seed=seed, tokenizer=tok)
        free = sample(model, PROMPTS, replace(base, stop_ids=()), **kw)
        assert all(s.finish_reason == "length" and len(s.completion_ids) == 24 for s in free)
        # a stop id taken from row 0's completion, a stop string from row 4's text (printable, mid-completion)
        stop_id = free[0].completion_ids[5]
        text = free[4].text
        a = next(a for a in range(len(text) // 3, len(text) - 2) if "\ufffd" not in text[a:a + 2])
        stop_string = text[a:a + 2]
        ends = [first_stop(f.completion_ids, tok, {stop_id}, [stop_string])[1] for f in free]
        if ends[0] == "eos" and ends[4] == "stop" and "length" in ends:
            break
    for sync_every, compact in [(1, 0.01), (5, 0.25), (100, 1.0)]:  # results must not depend on these
        stops = replace(base, stop_ids=[stop_id], stop_strings=[stop_string], sync_every=sync_every,
                        compact_fraction=compact)
        out = sample(model, PROMPTS, stops, **kw)
        for s, f in zip(out, free):
            length, reason = first_stop(f.completion_ids, tok, {stop_id}, [stop_string])
            assert (s.finish_reason, s.completion_ids) == (reason, f.completion_ids[:length])
            # batch shape changes kernels (compaction): fp32 rounding only
            assert torch.allclose(torch.tensor(s.logprobs), torch.tensor(f.logprobs[:length]), atol=1e-5, rtol=0)
            if reason == "eos":
                assert s.completion_ids[-1] == stop_id and s.text == tok.decode(s.completion_ids[:-1])
            elif reason == "stop":   # the text ends at the stop string even if its last token ran further
                assert s.text == cut_after_stop(tok.decode(s.completion_ids), [stop_string])
                assert s.text.endswith(stop_string)
            else:
                assert s.text == tok.decode(s.completion_ids)
        reasons = {s.finish_reason for s in out}
        assert out[0].finish_reason == "eos" and out[4].finish_reason == "stop" and "length" in reasons


@pytest.mark.oracle
def test_defaults_come_from_the_tokenizer(tiny_tokenizer):
    """stop_ids default to tokenizer.eos_ids, vocab_size to tokenizer.vocab_size."""
    model, tok = load_pretrained("tiny"), tiny_tokenizer
    free = sample(model, PROMPTS, replace(FREE, max_new_tokens=16, vocab_size=VOCAB), seed=0)
    tok.eos_ids = [free[1].completion_ids[3]]  # pretend that token is the EOS
    out = sample(model, PROMPTS, Settings(n=2, max_new_tokens=16), seed=0, tokenizer=tok)
    assert out[1].finish_reason == "eos" and out[1].completion_ids == free[1].completion_ids[:4]
    with torch.no_grad():
        model.lm_head.weight[VOCAB:] = 1.0  # the embedding's padding rows: they win unless masked
    assert all(t < VOCAB for s in sample(model, PROMPTS, Settings(2, 4), tokenizer=tok, seed=0)
               for t in s.completion_ids)


@pytest.mark.parametrize("temperature,top_p,top_k", [(1.0, 1.0, 0), (0.7, 1.0, 0), (0.7, 0.8, 5), (0.0, 1.0, 0)])
def test_logprobs_equal_teacher_forced(kind, temperature, top_p, top_k):
    """Sampler log-probs (untruncated, at T) = logprobs.token_logprobs on prompt + completion, left-padded batch."""
    model = load_pretrained(kind)
    settings = Settings(n=2, max_new_tokens=9, temperature=temperature, top_p=top_p, top_k=top_k, vocab_size=VOCAB,
                        stop_ids=[7, 8, 9])  # some rows end early
    out = sample(model, PROMPTS, settings, seed=0)
    seqs = [PROMPTS[s.prompt_index] + s.completion_ids for s in out]
    L = max(map(len, seqs))
    ids = torch.zeros(len(seqs), L, dtype=torch.long)
    mask = torch.zeros(len(seqs), L, dtype=torch.long)
    for i, q in enumerate(seqs):
        ids[i, L - len(q):], mask[i, L - len(q):] = torch.tensor(q), 1
    with torch.no_grad():
        ref = token_logprobs(model, ids, mask, temperature=temperature or 1.0, vocab_size=VOCAB)  # (B, L-1)
    for i, s in enumerate(out):
        c = len(s.completion_ids)
        assert torch.allclose(torch.tensor(s.logprobs), ref[i, L - 1 - c:], atol=1e-5, rtol=0)


def test_splitmix64_matches_the_reference_and_uniforms_lie_in_0_1():
    from minigrpo.sampler import sample_keys, splitmix64, uniforms
    M = (1 << 64) - 1

    def ref(x):  # the published splitmix64 finaliser, in Python integers
        z = (x + 0x9E3779B97F4A7C15) & M
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M
        return z ^ (z >> 31)

    xs = [0, 1, 2, 12345678901234, (1 << 63) - 1]
    assert [v & M for v in splitmix64(torch.tensor(xs)).tolist()] == [ref(x) for x in xs]
    u = uniforms(sample_keys(list(range(50)), 4, "cpu"), 7)
    assert u.min() >= 0 and u.max() < 1 and len(set(u.tolist())) == 200


@pytest.mark.oracle
def test_a_prompts_samples_do_not_depend_on_its_batch_mates(tiny_tokenizer):
    """Per-prompt seeds: prompt B sampled alone equals prompt B sampled beside prompt A (what lets N ranks and one
    process draw the same rollouts)."""
    tok = tiny_tokenizer
    model = load_pretrained("tiny")
    a, b = tok.chat([{"role": "user", "content": "hello there"}]), tok.chat([{"role": "user", "content": "hi"}])
    settings = Settings(n=3, max_new_tokens=6)
    both = sample(model, [a, b], settings, tokenizer=tok, seed=[11, 22])
    alone = sample(model, [b], settings, tokenizer=tok, seed=[22])
    assert [s.completion_ids for s in both[3:]] == [s.completion_ids for s in alone]
