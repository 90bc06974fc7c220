"""The training loop's fast decode path (train.py --decode fast): the merged decoding copy of a LoRA model
(merged.py), the static batch of fixed rows (padded, or split into calls of whole prompts), and a whole soyuz-shaped
two-turn rollout that compiles one graph per length bucket, never reaching torch's recompile limit."""
from argparse import Namespace

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import train
from minigrpo import merged, static_decode
from minigrpo.lora import adapters_disabled, inject_lora, lora_layers
from minigrpo.pretrained import load_pretrained
from minigrpo.run.folder import gap_quantiles
from minigrpo.sampler import prefill, sample
from minigrpo.tokenizer import Tokenizer

VOCAB = 261
PROMPTS = [[10, 20, 30, 40, 50, 60, 70], [257, 5], [99, 98, 97, 96]]


def lora_model(kind, seed=0):
    """A tiny model with LoRA on every projection and adapters moved off zero (B = 0 would hide the merge)."""
    model = load_pretrained(kind)
    inject_lora(model, r=4, alpha=8)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for _, m in lora_layers(model):
            m.lora_B.weight.copy_(torch.randn(m.lora_B.weight.shape, generator=g) * 0.05)
    return model.eval()


def assert_same(a, b, atol=1e-5):
    for x, y in zip(a, b, strict=True):
        assert (x.prompt_index, x.completion_ids, x.finish_reason, x.text) == \
            (y.prompt_index, y.completion_ids, y.finish_reason, y.text)
        assert torch.allclose(torch.tensor(x.logprobs), torch.tensor(y.logprobs), atol=atol, rtol=0)


def snapshot(model):
    return {k: v.clone() for k, v in model.state_dict().items()}


@pytest.mark.parametrize("kind", ["tiny", "tiny-qwen3.5"])
def test_merged_copy_computes_the_unmerged_model_and_leaves_it_untouched(kind):
    model = lora_model(kind)
    before = snapshot(model)
    ids = torch.randint(0, VOCAB, (3, 11), generator=torch.Generator().manual_seed(1))
    copy = merged.decode_model(model)
    assert not lora_layers(copy)
    assert torch.allclose(copy(ids), model(ids), atol=1e-5, rtol=0)
    # the sampler through the copy (static path) against the unmerged eager path: tokens equal, log-probs to 1e-5
    kw = dict(n=3, max_new_tokens=16, temperature=1.0, seed=3, vocab_size=VOCAB, stop_ids=())
    assert_same(sample(model, PROMPTS, static=True, **kw), sample(model, PROMPTS, **kw))
    assert copy in static_decode._pool and model not in static_decode._pool   # the sampler decoded the copy
    after = model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)     # training weights: the same bits
    # shared, not copied: every tensor but the adapted weights is the model's own storage
    own = {t.data_ptr() for t in model.state_dict().values()}
    shared = [k for k, t in copy.state_dict().items() if t.data_ptr() in own]
    assert len(shared) == len(copy.state_dict()) - len(lora_layers(model))
    # an optimizer step (in place) is seen by the next call; the reference (adapters off) too
    with torch.no_grad():
        for _, m in lora_layers(model):
            m.lora_A.weight.mul_(1.5)
    assert merged.decode_model(model) is copy
    assert torch.allclose(copy(ids), model(ids), atol=1e-5, rtol=0)
    with adapters_disabled(model):
        assert torch.equal(merged.decode_model(model)(ids), model(ids))
    merged.release(model)


def test_merged_copy_is_refreshed_only_after_a_change(monkeypatch):
    model = lora_model("tiny")
    calls = []
    real = merged._refresh
    monkeypatch.setattr(merged, "_refresh", lambda c, layers: (calls.append(1), real(c, layers)))
    copy = merged.decode_model(model)
    ptrs = [t.data_ptr() for t in copy.state_dict().values()]
    merged.decode_model(model)
    assert len(calls) == 1
    with torch.no_grad():
        lora_layers(model)[0][1].lora_B.weight.add_(0.01)
    assert merged.decode_model(model) is copy and len(calls) == 2
    assert [t.data_ptr() for t in copy.state_dict().values()] == ptrs  # fixed addresses for a compiled graph


class OpCount(TorchDispatchMode):
    """Counts the aten ops (the kernels an eager step launches; views included) run under it."""

    def __init__(self):
        super().__init__()
        self.n = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.n += 1
        return func(*args, **(kwargs or {}))


@torch.no_grad()
def decode_ops(model):
    cache, _ = prefill(model, PROMPTS, 8, 0)
    sc = static_decode.StaticCache(cache, 3).load(cache, 1)
    with OpCount() as c:
        static_decode.decode_step(model, torch.tensor([1, 2, 3]), sc)
    return c.n


def test_merged_decode_step_has_the_base_models_op_count():
    base = load_pretrained("tiny-qwen3.5").eval()
    model = lora_model("tiny-qwen3.5")
    n_base, n_lora, n_merged = decode_ops(base), decode_ops(model), decode_ops(merged.decode_model(model))
    print(f"\n[fast decode] ops per decode step, tiny-qwen3.5: base {n_base}, LoRA unmerged {n_lora}, "
          f"LoRA merged {n_merged}")
    assert n_merged == n_base < n_lora


def test_static_batch_pads_and_splits_to_the_fixed_rows():
    """A call with fewer rows than the fixed batch is padded (its extra rows never come back); one with more is cut
    into calls of whole prompts: the samples are the eager path's either way (counter-based sampling)."""
    model = load_pretrained("tiny-qwen3.5")
    kw = dict(max_new_tokens=12, temperature=1.0, seed=5, vocab_size=VOCAB, stop_ids=())
    for n, rows in ((2, 8), (2, 4), (1, 2), (3, 3)):
        got = sample(model, PROMPTS, n=n, static=True, rows=rows, **kw)
        assert len(got) == 3 * n
        assert_same(got, sample(model, PROMPTS, n=n, **kw))
    assert {key[0] for key in static_decode._pool[model]} == {8, 4, 2, 3}   # padded to 8; split into 4, 2, 3
    assert static_decode.bucket_rows(5, 6) == 6 and static_decode.bucket_rows(5) == 8


def test_fast_path_logprobs_equal_the_eager_path_fp32():
    """The whole fast path as train.py runs it on a GPU (merged copy, static batch, inductor-compiled step) against
    the eager unmerged path, on the CPU in fp32: same tokens, log-probs to 1e-5."""
    torch._dynamo.reset()
    static_decode._compiled.clear()
    model = lora_model("tiny-qwen3.5")
    kw = dict(n=2, max_new_tokens=24, temperature=1.0, top_p=0.9, seed=7, vocab_size=VOCAB, stop_ids=())
    assert_same(sample(model, PROMPTS, compile=True, rows=6, **kw), sample(model, PROMPTS, **kw))


def soyuz_like_tasks(lengths):
    """Soyuz tasks whose prompts have the given lengths in characters (one token each with the byte tokenizer)."""
    body = "Write a short poem about the sea, then explain each image you chose in one plain sentence. "
    return [{"id": f"t{k}", "family": "writing", "prompt": (body * (n // len(body) + 1))[:n],
             "criteria": [{"id": "c1", "text": "Mentions the sea", "check": None},
                          {"id": "c2", "text": "Has exactly four lines", "check": None}]}
            for k, n in enumerate(lengths)]


def test_soyuz_rollout_compiles_one_graph_per_length_bucket(monkeypatch, capsys):
    """train.py's rollout of soyuz's shape in its smallest calls (1 task a call x G=6 samples, then its 6 revisions:
    a GPU whose memory plan fits one task's rows, run/callsize.py), two steps over
    prompts of 40 to 1,400 tokens, on the fast path with LoRA. Graphs are counted with the "eager" backend (the same
    dynamo graphs and guards as inductor, without code generation: inductor on a shared 2-core CPU takes minutes
    for this many graphs). The count is one per (rows, length bucket) used, within torch's default recompile limit
    (8); the old per-call cache (a 128-token bucket per call) needed more graphs than that for these calls."""
    from tests.tasks.test_soyuz_rollout import ScriptedJudge
    from minigrpo.tasks.soyuz import SoyuzTask
    from torch._dynamo.utils import counters
    real_step = static_decode.compiled_step
    monkeypatch.setattr(static_decode, "compiled_step", lambda device, backend="inductor": real_step(device, "eager"))
    needed = []
    real_bucket = static_decode.bucket_len
    monkeypatch.setattr(static_decode, "bucket_len", lambda n: (needed.append(n), real_bucket(n))[1])
    torch._dynamo.reset()
    static_decode._compiled.clear()
    counters.clear()
    model, tok = lora_model("tiny-qwen3.5"), Tokenizer.from_pretrained("tiny")
    task = SoyuzTask(judge_obj=ScriptedJudge(), data=None, chunk=1)
    lengths = [40, 180, 330, 470, 610, 760, 900, 1050, 1200, 1400]
    task.tasks = soyuz_like_tasks(lengths)
    args = Namespace(decode="fast", group_size=6, max_new_tokens=16, temperature=1.0, top_p=1.0, top_k=0,
                     enable_thinking=False, seed=0)
    for step in range(2):   # the decode step fails on reaching its limit (static_decode.GRAPH_LIMIT), never falls back
        examples = task.tasks[step::2]
        seqs = train.rollout(model, tok, task, args, examples, step, list(range(len(examples))))
        assert len(seqs) == 2 * 6 * len(examples) and {s.turn for s in seqs} == {0, 1}
    graphs = counters["stats"]["unique_graphs"]
    buckets = {real_bucket(n) for n in needed}
    old = {-(-n // 128) for n in needed}   # the per-call 128-token buckets of the old static cache, 6 rows each
    with capsys.disabled():
        print(f"\n[fast decode] soyuz-shaped rollout: {len(needed)} sampler calls, prompts+new tokens "
              f"{min(needed)}..{max(needed)}; {graphs} graphs (length buckets {sorted(buckets)}); "
              f"the old per-call cache: {len(old)} shapes; graph breaks: {sum(counters['graph_break'].values())}")
    assert len(needed) == 20 and not counters["graph_break"]
    assert graphs == len(buckets) == len(static_decode._pool[merged.decode_model(model)])
    assert graphs <= torch._dynamo.config.recompile_limit == 8 < len(old)   # torch's default limit
    assert all(key[0] == 6 for key in static_decode._pool[merged.decode_model(model)])   # one row count


def test_decode_path_defaults_and_the_step_gap_metrics():
    assert train.decode_path(Namespace(decode=None), "cpu") == "eager"
    assert train.decode_path(Namespace(decode=None), "cuda") == "fast"
    assert train.decode_path(Namespace(decode="eager"), "cuda") == "eager"
    assert train.decode_path(Namespace(), "cpu") == "eager"      # a caller's Namespace without the flag
    assert train.decode_rows(Namespace(chunk=1), Namespace(group_size=6), 4) == 6
    assert train.decode_rows(Namespace(), Namespace(group_size=4), 3) == 12
    gaps = [0.0] * 90 + [0.1] * 9 + [2.0]
    q = gap_quantiles(gaps)
    assert q["sampler_logp_diff_max"] == 2.0 and q["sampler_logp_diff_p95"] == pytest.approx(0.1)
    assert gap_quantiles([]) == {"sampler_logp_diff_p95": 0.0, "sampler_logp_diff_max": 0.0}
