"""The fast decode path samples the policy being trained, in bf16 at a real width.

In fp32 every decode path computes the trainer's function up to rounding, so fp32 tests cannot see a sampler that
has lost a small LoRA update: in bf16 at Qwen3.5-4B's hidden size (2,560) they can. A bf16 copy of W + (α/r)·B A
rounds away every element of the update smaller than half of W's bf16 spacing, and a compiled step that skips
bf16 roundings drifts from the trainer by more than a young update moves it. Either way the sampler draws from a
policy nearer the base model than the one the trainer scores.

The model: Qwen3.5-4B's layer shapes (one Gated DeltaNet and one attention layer; the vocabulary cut to 4,096 rows,
which no rounding here depends on), N(0, 0.02) bf16 weights, LoRA r = α = 32 on every projection with PEFT's A and
every element of B at ±3e-4 (about 30 Adam steps at lr 1e-5, the soyuz rate, whose gradient kept its sign).
The eager path draws 4 prompts x 4 samples x 32 tokens, scored by the trainer (logprobs.token_logprobs) with the
adapters on and off (the reference). The static and compiled paths decode the same tokens (teacher-forced: the
sampler's draw is replaced by the eager path's token, `forcing`), so their log-probs are compared with the
trainer's on the same tokens, scored once, with no sampling noise between the paths; per path:
- share: how much of the adapter's effect on the sampled tokens' log-probs the sampler's own log-probs carry
  (run/gap.py's sampler_update_share): the eager path's is below 1 by bf16 noise alone;
- gap: mean |sampler - trainer| (sampler_logp_diff).
The static and compiled paths must carry the update as the eager path does: share >= 0.85x the eager path's, gap
<= 1.3x. At the commit before this test the static path (then a bf16 merged copy) gave 0.54 (eager 0.76) and a gap
of 7.1e-3 (eager 4.1e-3); the inductor-compiled path 0.34 and 9.0e-3.
"""
import json
import os
import weakref
from dataclasses import replace

import pytest
import torch

from minigrpo import sampler, static_decode
from minigrpo.lora import adapters_disabled, inject_lora, lora_layers
from minigrpo.logprobs import token_logprobs
from minigrpo.model import Qwen
from minigrpo.pretrained import QwenConfig
from minigrpo.run.gap import gap_metrics, token_sums
from minigrpo.sampler import Settings, sample

VOCAB, PROMPT, NEW, P, N = 4096, 12, 32, 4, 4
pytestmark = pytest.mark.slow   # a 2,560-wide bf16 model, decoded eagerly, static and compiled by inductor
# The static paths against the eager path: share at least SHARE x eager's, gap at most GAP x. Measured across an
# Intel and an AMD box (2 threads): 0.90-1.02x the share, 0.92-1.16x the gap; the bounds leave 5% and 12% beyond
# that spread and still fail a sampler that loses a fifth of the update (a bf16 merged copy: 0.71x, 1.7x).
SHARE, GAP = 0.85, 1.3


@pytest.fixture(scope="module")
def policy():
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    with open(os.path.join(root, "minigrpo", "data", "configs", "Qwen3.5-4B.json")) as f:
        text = json.load(f)["text_config"]
    cfg = QwenConfig.from_dict(dict(text, num_hidden_layers=2, layer_types=["linear_attention", "full_attention"],
                                    vocab_size=VOCAB, tie_word_embeddings=True))
    assert cfg.hidden_size == 2560
    torch.manual_seed(0)
    model = Qwen(cfg)
    for p in model.parameters():
        torch.nn.init.normal_(p, std=0.02)
    model = model.to(torch.bfloat16).eval()
    inject_lora(model, r=32, alpha=32)
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for _, m in lora_layers(model):
            m.lora_B.weight.copy_(torch.randn(m.lora_B.weight.shape, generator=g).sign() * 3e-4)
    prompts = [torch.randint(0, VOCAB, (PROMPT,), generator=g).tolist() for _ in range(P)]
    eager = sample(model, prompts, SETTINGS, seed=3)
    yield model, prompts, measure(model, prompts, eager), [s.completion_ids for s in eager]
    static_decode.release(model)


SETTINGS = Settings(n=N, max_new_tokens=NEW, temperature=1.0, vocab_size=VOCAB, stop_ids=())


_scored = weakref.WeakKeyDictionary()    # per model object: a model made later at a freed one's address is new


def scores(model, ids):
    """The trainer's log-probs of the last NEW tokens of ids, with the adapters on and off. A batch of ids scored
    before (a continued prefill that sampled what the fresh one did) is not scored again: the same batch gives the
    same numbers on the CPU, and these two bf16 passes at full width are most of this file's time. The lm_head runs
    from the first completion column on, as the trainer runs it (token_logprobs' first_col)."""
    seen, key = _scored.setdefault(model, {}), (tuple(ids.shape), ids.numpy().tobytes())
    if key not in seen:
        first = ids.shape[1] - 1 - NEW
        trainer = token_logprobs(model, ids, vocab_size=VOCAB, first_col=first)[:, -NEW:]
        with adapters_disabled(model):
            seen[key] = trainer, token_logprobs(model, ids, vocab_size=VOCAB, first_col=first)[:, -NEW:]
    return seen[key]


@torch.no_grad()
def measure(model, prompts, samples, path=None, reuse=None):
    """(share, gap) of one decode path's samples, as train.py's step metrics compute them."""
    ids = torch.tensor([prompts[s.prompt_index] + s.completion_ids for s in samples])    # (P*N, prompt + NEW)
    sampled = torch.tensor([s.logprobs for s in samples])                                # (P*N, NEW)
    trainer, ref = scores(model, ids)
    mask = torch.ones_like(sampled, dtype=torch.bool)
    st = dict(token_sums(trainer, sampled, ref, mask), tokens=mask.numel())
    gap = float((trainer - sampled).abs().mean())
    share = gap_metrics([st])["sampler_update_share"]
    print(f"\n[on-policy bf16] {path or 'eager'}{' continued' if reuse else ''}: share {share:.3f}, gap {gap:.2e}, adapter's effect "
          f"{gap_metrics([st])['policy_logp_change']:.2e}")
    return share, gap


def forcing(monkeypatch, tokens):
    """Teacher forcing: the sampler's draw at step t (sampler.choose, which runs outside the compiled step) returns
    tokens[row][t] and that token's log-prob under the path's own logits, as the real draw returns the drawn
    token's. Rows past len(tokens), a static batch's padding, repeat the last row. Returns [steps drawn]."""
    forced = torch.tensor(tokens)                                                     # (P*N, NEW)
    steps = [0]

    def choose(logits, temperature, top_k, top_p, u):
        t, rows = steps[0], logits.shape[0]
        token = forced[torch.arange(rows).clamp(max=len(forced) - 1), t]
        steps[0] += 1
        logp_all = torch.log_softmax(logits / temperature, dim=-1)
        return token, logp_all.gather(-1, token[:, None]).squeeze(-1)
    monkeypatch.setattr(sampler, "choose", choose)
    return steps


@pytest.mark.parametrize("path", [dict(static=True), dict(compile=True, rows=P * N)], ids=["static", "compiled"])
def test_the_fast_path_samples_the_policy_the_trainer_scores(policy, path, monkeypatch):
    model, prompts, (eager_share, eager_gap), eager_tokens = policy
    if path.get("compile"):
        torch._dynamo.reset()
        static_decode._compiled.clear()
    steps = forcing(monkeypatch, eager_tokens)
    samples = sample(model, prompts, replace(SETTINGS, **path), seed=3)
    assert [s.completion_ids for s in samples] == eager_tokens and steps == [NEW]
    share, gap = measure(model, prompts, samples, path)
    assert share >= SHARE * eager_share, (share, eager_share)
    assert gap <= GAP * eager_gap, (gap, eager_gap)


def test_a_turn_that_continues_a_kept_state_samples_the_policy_the_trainer_scores(policy):
    """An agent's next turn continues the state kept after its last prompt (sampler reuse), where the trainer runs
    the whole conversation at once. The kept state ends on Gated DeltaNet's chunk grid (prefix.py): the first turn's
    prompt is 76 tokens, so 64 are kept and the continuation prefills 12 of them again with the new ones, and cuts
    the conversation into the chunks the trainer and a fresh prefill cut. Its samples then carry the update as a
    fresh prefill's do: gap within 1.1x, share at least 0.95x (docs/benchmarks.md has the measured ratios). A
    continuation that started mid-chunk, as before the grid, gave 1.42x (4 samples a prompt) on an AMD EPYC at 1 and
    2 threads; a kept state off the grid fails the kept-length check first. One sample a prompt and an 8-token first
    answer: the continuation computes what the fresh prefill computes, so it draws the fresh prefill's tokens, whose
    4 rows of 136 tokens are scored once (scoring is most of this file's time)."""
    model, prompts, _, _ = policy
    g = torch.Generator().manual_seed(2)
    system = torch.randint(0, VOCAB, (64,), generator=g).tolist()      # a first prompt past one chunk: 76 tokens
    first_prompts = [system + p for p in prompts]
    with torch.no_grad():
        first = sample(model, first_prompts, replace(SETTINGS, n=1, max_new_tokens=8), seed=5, keep=True)
    assert [s.kept.tokens for s in first] == [64] * P
    later = [first_prompts[s.prompt_index] + s.completion_ids + torch.randint(0, VOCAB, (20,), generator=g).tolist()
             for s in first]                        # the last prompt, its answer, an environment's 20 tokens
    one = replace(SETTINGS, n=1)
    fresh_share, fresh_gap = measure(model, later, sample(model, later, one, seed=3))
    kept = [s.kept for s in first]
    share, gap = measure(model, later, sample(model, later, one, seed=3, reuse=kept), reuse=kept)
    assert gap <= 1.1 * fresh_gap, (gap, fresh_gap)
    assert share >= 0.95 * fresh_share, (share, fresh_share)
