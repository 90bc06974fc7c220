"""--mask-truncated: completions cut by max_new_tokens (finish "length") get no gradient, and nothing else changes
(docs/pitfalls.md 12)."""
import json
import os
import subprocess
import sys

import pytest
import torch

import train
from minigrpo import grpo
from minigrpo.logprobs import token_logprobs
from minigrpo.lora import inject_lora
from minigrpo.pretrained import load_pretrained
from minigrpo.tasks.base import Seq

from repo_root import ROOT

VOCAB = 261


def seqs_with_finishes():
    """Six completions of two prompts, of different lengths, two of them truncated, advantages of both signs."""
    g = torch.Generator().manual_seed(0)
    out = []
    finishes = ["eos", "length", "stop", "length", "eos", "stop"]
    for i, finish in enumerate(finishes):
        prompt = torch.randint(0, VOCAB, (5 + i % 2,), generator=g).tolist()
        comp = torch.randint(0, VOCAB, (3 + i,), generator=g).tolist()
        s = Seq(f"ex{i // 3}", 0, prompt, comp, [0.0] * len(comp), finish, "", 0.0, 0.0)
        s.advantage = [1.0, -0.5, 0.7, 2.0, -1.2, 0.3][i]
        out.append(s)
    return out


def gradient(model, params, seqs, mask_truncated, agg="token"):
    """The gradient of one optimizer step over `seqs` (two micro-batches), as the trainer builds it."""
    batches = [train.collate(mb, 0, torch.device("cpu"), mask_truncated) for mb in (seqs[:3], seqs[3:])]
    norm = grpo.loss_normalizer([b.mask for b in batches], agg, max_tokens=8)
    for p in params:
        p.grad = None
    for b in batches:
        logp = token_logprobs(model, b.ids, b.attn, temperature=0.9, vocab_size=VOCAB, first_col=b.first_col)
        ref = logp.detach() - 0.1    # a KL term too: it must be masked the same way
        loss, _ = grpo.policy_loss(logp, b.adv, b.mask, grpo.LossSettings(agg=agg, beta=0.5), norm, grpo.Against(ref=ref))
        loss.backward()
    return [p.grad.clone() for p in params]


def test_collate_masks_only_truncated_rows():
    seqs = seqs_with_finishes()
    on = train.collate(seqs, 0, torch.device("cpu"), mask_truncated=True).mask
    off = train.collate(seqs, 0, torch.device("cpu"), mask_truncated=False).mask
    assert off.sum(-1).tolist() == [float(len(s.completion_ids)) for s in seqs]
    assert on.sum(-1).tolist() == [0.0 if s.finish_reason == "length" else float(len(s.completion_ids)) for s in seqs]


@pytest.mark.parametrize("agg", ["token", "seq"])
def test_truncated_completions_get_no_gradient(agg):
    """With the flag, the step's gradient equals the gradient of the same step without the truncated completions
    at all (the "token" normaliser counts only trained tokens, "seq" only sequences with one), whatever their
    tokens or advantages; without it, they change the gradient."""
    torch.manual_seed(0)
    model = load_pretrained("tiny")
    params = inject_lora(model, r=4, alpha=8)
    with torch.no_grad():
        for p in params:
            p.normal_(0, 0.05)    # B != 0: the policy differs from the base
    seqs = seqs_with_finishes()
    kept = [s for s in seqs if s.finish_reason != "length"]
    masked = gradient(model, params, seqs, mask_truncated=True, agg=agg)
    without = gradient(model, params, kept, mask_truncated=False, agg=agg)   # same 4 seqs, 2 micro-batches
    assert sum(float(g.abs().sum()) for g in masked) > 0
    # other micro-batches, so other padding and matrix shapes: the sums round otherwise. Up to 25% of atol=1e-7,
    # rtol=1e-5 used (avx2 and default kernels; 20% avx512; the same at 1 and 2 threads): 2.5x those is 10x the largest
    for a, b in zip(masked, without):
        assert torch.allclose(a, b, atol=2.5e-7, rtol=2.5e-5)
    for s in seqs:      # other tokens and advantages for the truncated ones: the same gradient
        if s.finish_reason == "length":
            s.advantage = -7.0
            s.completion_ids = [(t * 7 + 3) % VOCAB for t in s.completion_ids]
    again = gradient(model, params, seqs, mask_truncated=True, agg=agg)
    assert all(torch.equal(a, b) for a, b in zip(masked, again))
    unmasked = gradient(model, params, seqs, mask_truncated=False, agg=agg)
    assert any(not torch.allclose(a, b, atol=1e-6) for a, b in zip(masked, unmasked))


def test_mask_truncated_through_the_cli(tmp_path):
    """max_new_tokens=3 on the tiny model: at this seed every completion of step 1 is cut (finish "length") and
    some groups have reward spread. Without the flag step 1 has a gradient; with it no token is trained: gradient
    0, KL 0. (If a change of seed derivation or of the synthetic task moves the rollouts, pick a seed where step 1
    is again all truncated with spread: `zero_spread` < 1 and `truncated` == 1.0 in metrics.jsonl of the run
    without the flag.)"""
    def run(name, *extra):
        cmd = [sys.executable, "train.py", "--task", "synthetic", "--model", "tiny", "--tasks-per-step", "8",
               "--group-size", "4", "--max-new-tokens", "3", "--steps", "1", "--seed", "8", "--quiet",
               "--lora-r", "4", "--beta", "0.04", "--runs-dir", str(tmp_path), "--run-name", name, *extra]
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, check=True, timeout=600)
        with open(tmp_path / name / "metrics.jsonl") as f:
            return json.loads(f.readline())
    free, masked = run("free"), run("masked", "--mask-truncated")
    assert free["truncated"] == 1.0 and free["zero_spread"] < 1.0, "pick another seed (see the docstring)"
    assert free["grad_norm"] > 0
    assert masked["truncated"] == 1.0 and masked["grad_norm"] == 0.0 and masked["kl"] == 0.0


def test_normalisers_count_only_trained_rows():
    """A row whose mask is empty (a masked truncated completion) is no sequence of the step for "seq"; "const"
    (Dr. GRPO) counts every row at max_tokens, whatever its mask."""
    masks = [torch.tensor([[1, 1, 0], [0, 0, 0]]), torch.tensor([[0, 1, 1]])]
    assert grpo.loss_normalizer(masks, "token") == 4.0
    assert grpo.loss_normalizer(masks, "seq") == 2.0
    assert grpo.loss_normalizer(masks, "const", max_tokens=5) == 15.0
