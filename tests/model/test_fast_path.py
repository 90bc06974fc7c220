"""The training loop's fast decode path (train.py --decode fast): a LoRA model decoded as itself, adapters
unmerged, on the static-shape step (its tokens and log-probs are the eager path's, before and after an optimizer
step, compiled or not), the static batch of fixed rows (padded, or split into calls of whole prompts), and a whole
soyuz-shaped two-turn rollout that compiles one graph per length bucket, never reaching torch's recompile limit.
The same in bf16 at a real width: tests/model/test_on_policy_bf16.py."""
from argparse import Namespace
from dataclasses import replace

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

pytestmark = pytest.mark.oracle   # train.py's loop: the run-time packages, the tokenizer's first
pytest.importorskip("tokenizers")
import train  # noqa: E402
from minigrpo import deltanet, static_decode  # noqa: E402
from minigrpo import model as model_py  # noqa: E402
from minigrpo.run.dist import Dist  # noqa: E402
from minigrpo.lora import adapters_disabled, inject_lora, lora_layers  # noqa: E402
from minigrpo.pretrained import load_pretrained  # noqa: E402
from minigrpo.run.gap import gap_metrics, off_policy, token_sums  # noqa: E402
from minigrpo.sampler import decode_step as sampler_decode_step  # noqa: E402
from minigrpo.sampler import Settings, prefill, sample  # noqa: E402
from minigrpo.tokenizer import Tokenizer  # noqa: E402

VOCAB = 261
PROMPTS = [[10, 20, 30, 40, 50, 60, 70], [257, 5], [99, 98, 97, 96]]
FREE = Settings(n=3, max_new_tokens=16, vocab_size=VOCAB, stop_ids=())   # T=1, no stop: every row runs to the end


def lora_model(kind, seed=0):
    """A tiny model with LoRA on every projection and adapters moved off zero (B = 0 would hide the update). Seeded
    whole: A's init draws from torch's global generator, which the tests run before would otherwise set."""
    model = load_pretrained(kind)
    torch.manual_seed(seed)
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


def adamw_step(model, fused):
    """One AdamW step on the adapters (a stand-in loss): the parameters change in place, as in training."""
    params = [p for _, m in lora_layers(model) for p in (m.lora_A.weight, m.lora_B.weight)]
    opt = torch.optim.AdamW(params, lr=1e-2, fused=fused)
    with torch.enable_grad():
        model(torch.tensor([PROMPTS[0]])).float().logsumexp(-1).mean().backward()
    opt.step()
    opt.zero_grad(set_to_none=True)


@pytest.mark.parametrize("kind", ["tiny", "tiny-qwen3.5"])
def test_static_path_decodes_the_lora_model_and_follows_each_optimizer_step(kind):
    """The static step runs the model's own LoRA layers: nothing is copied or merged, so what it samples is the
    trained policy after any optimizer step (fused AdamW too), and the training weights are never written."""
    model = lora_model(kind)
    static = replace(FREE, static=True)
    for fused in (False, True):
        frozen = {k: v.clone() for k, v in model.state_dict().items() if ".lora_" not in k}
        assert_same(sample(model, PROMPTS, static, seed=3), sample(model, PROMPTS, FREE, seed=3))
        assert model in static_decode._pool                              # the sampler decoded the model itself
        after = model.state_dict()
        assert all(torch.equal(frozen[k], after[k]) for k in frozen)     # the frozen base keeps its bits
        adamw_step(model, fused)
    with adapters_disabled(model):                                       # the reference: the base model, exactly
        assert_same(sample(model, PROMPTS, static, seed=3), sample(model, PROMPTS, FREE, seed=3))
    static_decode.release(model)


class OpCount(TorchDispatchMode):
    """Counts the aten ops (the kernels an eager step launches; views included) run under it."""

    def __init__(self):
        super().__init__()
        self.n = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.n += 1
        return func(*args, **(kwargs or {}))


@torch.no_grad()
def decode_ops(model, static=True):
    cache, _ = prefill(model, PROMPTS, 8, 0)
    if static:
        cache = static_decode.StaticCache(cache, 3).load(cache, 1)
    step = static_decode.decode_step if static else sampler_decode_step
    with OpCount() as c:
        step(model, torch.tensor([1, 2, 3]), cache)
    return c.n


def test_static_decode_step_costs_the_base_step_plus_each_lora_branch(monkeypatch):
    """The static step of a LoRA model is the base model's step plus, per adapted layer, its LoRA branch as the
    trainer runs it (the fp32 cast, A, B, the scale, the add, the cast back, and their views): a fixed count per
    layer, less what the shared inputs save (one A matmul for the projections that read one input: each grouped
    adapter drops its own A's matmul and views, each shared input adds the concatenation, one matmul and the split),
    and fewer ops than the eager step over a growing cache."""
    base = load_pretrained("tiny-qwen3.5").eval()
    model = lora_model("tiny-qwen3.5")
    n_base, n_static, n_eager = decode_ops(base), decode_ops(model), decode_ops(model, static=False)
    kinds = model.config.layer_types
    shared = 2 * len(kinds)                                   # q/k/v or GDN's inputs, and gate/up: each layer
    grouped = sum(4 + 2 if t == "linear_attention" else 3 + 2 for t in kinds)
    for module in (model_py, deltanet):
        monkeypatch.setattr(module, "shared_input", lambda x, *layers: [m(x) for m in layers])
    n_alone = decode_ops(model)
    per_layer = (n_alone - n_base) / len(lora_layers(model))
    print(f"\n[fast decode] ops per decode step, tiny-qwen3.5: base {n_base}, static with LoRA {n_static} "
          f"({n_alone} with each adapter's A alone: {per_layer:g} per adapted layer), eager with LoRA {n_eager}")
    assert per_layer == LORA_BRANCH_OPS and n_static < n_eager
    assert n_static == n_alone - A_OPS * grouped + SHARED_A_OPS * shared


LORA_BRANCH_OPS = 10   # LoRALinear.forward beyond base_layer(x), views included
A_OPS, SHARED_A_OPS = 4, 6   # an adapter's A alone (views, matmul); one A for a shared input (cat, matmul, split)


def test_static_batch_pads_and_splits_to_the_fixed_rows():
    """A call with fewer rows than the fixed batch is padded (its extra rows never come back); one with more is cut
    into calls of whole prompts: the samples are the eager path's either way (counter-based sampling)."""
    model = load_pretrained("tiny-qwen3.5")
    for n, rows in ((2, 8), (2, 4), (1, 2), (3, 3)):
        eager = replace(FREE, n=n, max_new_tokens=12)
        got = sample(model, PROMPTS, replace(eager, static=True, rows=rows), seed=5)
        assert len(got) == 3 * n
        assert_same(got, sample(model, PROMPTS, eager, seed=5))
    assert {key[0] for key in static_decode._pool[model]} == {8, 4, 2, 3}   # padded to 8; split into 4, 2, 3
    assert static_decode.bucket_rows(5, 6) == 6 and static_decode.bucket_rows(5) == 8


def test_fast_path_logprobs_equal_the_eager_path_fp32(fresh_compile):
    """The whole fast path as train.py runs it on a GPU (static batch, inductor-compiled step) against the eager
    path, on the CPU in fp32: same tokens, log-probs to 1e-5, and still after a fused AdamW step (the compiled graph
    reads the parameters the optimizer updates in place)."""
    model = lora_model("tiny-qwen3.5")
    eager = replace(FREE, n=2, max_new_tokens=24, top_p=0.9)
    for _ in range(2):
        assert_same(sample(model, PROMPTS, replace(eager, compile=True, rows=6), seed=7),
                    sample(model, PROMPTS, eager, seed=7))
        adamw_step(model, fused=True)
    assert static_decode.compile_failure("cpu") is None                 # compiled, not the uncompiled fallback


def test_a_compile_that_fails_warns_once_and_decodes_uncompiled(monkeypatch, capfd, fresh_compile):
    """A compiled step that cannot be built (here a backend that raises as inductor does without a C compiler)
    prints one warning line naming the error, and the call is decoded again from its prefill with the uncompiled
    static step: the eager path's samples. Later calls do not try to compile again."""
    tried = []

    def broken(gm, example_inputs):
        tried.append(1)
        raise RuntimeError("Failed to find a C compiler. Please specify via CC environment variable.\nmore")
    real_step = static_decode.compiled_step
    monkeypatch.setattr(static_decode, "compiled_step", lambda device, backend="inductor": real_step(device, broken))
    model = lora_model("tiny-qwen3.5")
    eager = replace(FREE, n=2, max_new_tokens=12)
    for _ in range(2):
        assert_same(sample(model, PROMPTS, replace(eager, compile=True, rows=6), seed=7), sample(model, PROMPTS,
                                                                                              eager, seed=7))
    err = capfd.readouterr().err.splitlines()
    assert len(tried) == 1 and len(err) == 1, err
    assert err[0].startswith("warning: the compiled decode step failed on cpu (RuntimeError: Failed to find a C "
                             "compiler. Please specify via CC environment variable.); decoding with the uncompiled")
    assert static_decode.compile_failure("cpu", broken).startswith("RuntimeError: Failed to find a C compiler")
    assert static_decode.compile_failure("cpu") is None              # inductor itself was not tried


def soyuz_like_tasks(lengths):
    """Soyuz tasks whose prompts have the given lengths in characters (one token each with the byte tokenizer)."""
    body = "Write a short poem about the sea, then explain each image you chose in one plain sentence. "
    return [{"id": f"t{k}", "family": "writing", "prompt": (body * (n // len(body) + 1))[:n],
             "criteria": [{"id": "c1", "text": "Mentions the sea", "check": None},
                          {"id": "c2", "text": "Has exactly four lines", "check": None}]}
            for k, n in enumerate(lengths)]


def count_graphs(monkeypatch, graphs):
    """Compile the decode step with the "eager" backend (fresh_compile's clean slate): the same dynamo graphs and
    guards as inductor, without its code generation (minutes on a shared 2-core CPU). Returns `graphs`, the count."""
    real_step = static_decode.compiled_step
    monkeypatch.setattr(static_decode, "compiled_step", lambda device, backend="inductor": real_step(device, "eager"))
    return graphs


def test_soyuz_rollout_compiles_one_graph_for_every_length(monkeypatch, capsys, fresh_compile):
    """train.py's rollout of soyuz's shape in its smallest calls (1 task a call x G=6 samples, then its 6 revisions:
    a GPU whose memory plan fits one task's rows, run/callsize.py), two steps over
    prompts of 40 to 1,400 tokens, on the fast path with LoRA: one graph (the cache's slot count is dynamic) and one
    set of cache buffers, where a graph per length bucket needed 7 and the old per-call cache (a 128-token bucket
    per call) more than torch's recompile limit (8)."""
    from tests.tasks.test_soyuz_rollout import ScriptedJudge
    from minigrpo.tasks.soyuz import SoyuzTask
    from torch._dynamo.utils import counters
    graphs = count_graphs(monkeypatch, fresh_compile)
    needed = []
    real_bucket, real_slots = static_decode.bucket_len, static_decode.new_slots
    monkeypatch.setattr(static_decode, "new_slots",   # once a sampler call: its longest prompt + max_new_tokens
                        lambda prompts, m: (needed.append(max(map(len, prompts)) + m), real_slots(prompts, m))[1])
    model, tok = lora_model("tiny-qwen3.5"), Tokenizer.from_pretrained("tiny")
    task = SoyuzTask(judge_obj=ScriptedJudge(), data=None, chunk=1)
    lengths = [40, 180, 330, 470, 610, 760, 900, 1050, 1200, 1400]
    task.tasks = soyuz_like_tasks(lengths)
    args = Namespace(decode="fast", group_size=6, max_new_tokens=16, temperature=1.0, top_p=1.0, top_k=0,
                     enable_thinking=False, seed=0)
    for step in range(2):
        examples = task.tasks[step::2]
        seqs, _ = train.rollout_step(model, tok, task, args, step, list(enumerate(examples)), Dist())
        assert len(seqs) == 2 * 6 * len(examples) and {s.turn for s in seqs} == {0, 1}
    buckets = {real_bucket(n) for n in needed}
    old = {-(-n // 128) for n in needed}   # the per-call 128-token buckets of the old static cache, 6 rows each
    with capsys.disabled():
        print(f"\n[fast decode] soyuz-shaped rollout: {len(needed)} sampler calls, prompts+new tokens "
              f"{min(needed)}..{max(needed)}; {graphs()} graph(s) for length buckets {sorted(buckets)}; "
              f"the old per-call cache: {len(old)} shapes; graph breaks: {sum(counters['graph_break'].values())}")
    assert len(needed) == 20 and not counters["graph_break"] and len(buckets) == 7 < len(old)
    (sc,) = static_decode._pool[model].values()                     # one set of buffers: 6 rows, the longest call's
    assert graphs() == 1 and sc.mask.shape == (6, max(buckets))


def test_a_terminal_episode_compiles_one_graph_and_holds_its_longest_call_cache(monkeypatch, capsys, fresh_compile):
    """A terminal-shaped episode: one prompt x 4 episodes, then 8 turns of 4 conversations, each continuing its kept
    state (sampler reuse) and growing ~1.4x a turn through 9 length buckets (256 to 4,096 slots, as terminal's 1,024
    to 16,384). One compiled graph for all of them (a graph per bucket made 9), and one set of cache buffers, at the
    longest call's length: what the memory plan counts (memplan.static_cache_bytes)."""
    graphs = count_graphs(monkeypatch, fresh_compile)
    model = lora_model("tiny-qwen3.5")
    s = replace(FREE, n=4, max_new_tokens=8, compile=True, rows=4)
    g = torch.Generator().manual_seed(0)
    tokens = lambda n: torch.randint(0, 256, (n,), generator=g).tolist()   # noqa: E731
    lengths = [200, 300, 450, 700, 1000, 1400, 2000, 3000, 4000]          # each turn's prompts
    prompts, kept, buckets = [tokens(lengths[0])], None, set()
    for turn, length in enumerate(lengths):
        got = sample(model, prompts, s if turn == 0 else replace(s, n=1), seed=turn, reuse=kept, keep=True)
        buckets.add(static_decode.bucket_len(length + s.max_new_tokens))
        if turn + 1 < len(lengths):     # the next prompts: + the answer, + the tool's reply up to the next length
            prompts = [prompts[x.prompt_index] + x.completion_ids for x in got]
            prompts, kept = [p + tokens(lengths[turn + 1] - len(p)) for p in prompts], [x.kept for x in got]
    (sc,) = static_decode._pool[model].values()
    print(f"\n[fast decode] terminal-shaped episode: 9 calls over length buckets {sorted(buckets)}: {graphs()} "
          f"graph(s); one cache of {sc.mask.shape[1]} slots")
    assert len(buckets) == 9 and graphs() == 1
    assert sc.mask.shape[1] == max(buckets) and sc.mask.shape[0] == 4


def test_decode_path_defaults_and_the_step_gap_metrics():
    assert train.decode_path(Namespace(decode=None), "cpu") == "eager"
    assert train.decode_path(Namespace(decode=None), "cuda") == "fast"
    assert train.decode_path(Namespace(decode="eager"), "cuda") == "eager"
    assert train.decode_path(Namespace(), "cpu") == "eager"      # a caller's Namespace without the flag
    assert train.decode_rows(Namespace(chunk=1), Namespace(group_size=6), 4) == 6
    assert train.decode_rows(Namespace(), Namespace(group_size=4), 3) == 12
    gaps = [0.0] * 90 + [0.1] * 9 + [2.0]
    q = gap_metrics([{"sampler_logp_gaps": gaps, "pass": 0, "tokens": 100}])
    assert q["sampler_logp_diff_max"] == 2.0 and q["sampler_logp_diff_p95"] == pytest.approx(0.1)
    assert "sampler_update_share" not in q                                  # no reference (--beta 0): not known
    assert gap_metrics([]) == {"sampler_logp_diff_p95": 0.0, "sampler_logp_diff_max": 0.0}


def test_the_share_of_the_policys_move_the_sampler_carries():
    """sampler_update_share: 1 for a sampler that scores what the trainer scores, 0 for one that samples the
    reference, 0.5 halfway, over micro-batches and ranks (sums, not means); off_policy fires for the second only."""
    g = torch.Generator().manual_seed(0)
    ref = torch.randn(2, 6, generator=g)
    logp = ref + 0.3 * torch.randn(2, 6, generator=g)
    mask = torch.ones(2, 6, dtype=torch.bool)
    mask[1, 4:] = False
    for sampled, share in ((logp, 1.0), (ref, 0.0), ((logp + ref) / 2, 0.5)):
        parts = [dict(token_sums(logp[i:i + 1], sampled[i:i + 1], ref[i:i + 1], mask[i:i + 1]), pass_=0,
                      tokens=int(mask[i].sum())) for i in range(2)]
        stats = [{("pass" if k == "pass_" else k): v for k, v in st.items()} for st in parts]
        m = gap_metrics(stats + [dict(stats[0], **{"pass": 1, "update_sd": 0.0})])   # --mu 2's pass: not counted
        assert m["sampler_update_share"] == pytest.approx(share)
        assert m["policy_logp_change"] == pytest.approx(float((logp - ref)[mask].abs().mean()))
        gap = float((logp - sampled)[mask].abs().mean())
        assert off_policy(dict(m, sampler_logp_diff=gap)) == (share < 0.5)
    assert token_sums(logp, logp, None, mask) == {}
    still = gap_metrics([dict(token_sums(ref, ref, ref, mask), **{"pass": 0, "tokens": 12})])   # step 0: B = 0
    assert still["sampler_update_share"] is None and still["policy_logp_change"] == 0.0
