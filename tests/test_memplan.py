"""The memory plan's arithmetic (minigrpo/memplan.py): exact parameter and cache counts, per-layer activation costs
that add up to what autograd saves for the whole model, and (slow) the plan within 25% of a real step's peak RSS."""

import os
import sys

import pytest
import torch

from minigrpo import memplan
from minigrpo.lora import inject_lora
from minigrpo.model import Qwen

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
KINDS = ["tiny", "tiny-qwen3.5"]


@pytest.mark.parametrize("kind", KINDS)
def test_counts_equal_a_built_model(kind):
    model = Qwen.from_pretrained(kind)
    cfg = model.config
    total, trainable = memplan.param_counts(cfg, lora_r=8)
    assert total == sum(p.numel() for p in model.parameters())
    assert trainable == sum(p.numel() for p in inject_lora(model, r=8, alpha=8))
    assert memplan.param_counts(cfg, lora_r=0) == (total, total)
    cache = Qwen.from_pretrained(kind).new_cache(3, 50)
    kv, gdn = memplan.cache_bytes(cfg, rows=3, slots=50, dtype_bytes=4)
    nbytes = lambda xs: sum(x.numel() * x.element_size() for x in xs if x is not None)
    assert kv == nbytes(cache.k + cache.v) and gdn == nbytes(cache.conv + cache.state)


@pytest.mark.parametrize("kind", KINDS)
def test_layer_costs_add_up_to_the_whole_model(kind):
    """Per-layer costs measured on lone layers (B=1, two lengths) x the layer count = what the full model's
    forward saves for backward at another batch size and length, with LoRA on, left padding included."""
    model = Qwen.from_pretrained(kind)
    params = inject_lora(model, r=8, alpha=8)
    costs = memplan.layer_costs(model.config, torch.float32, lora_r=8)
    B, T = 3, 192
    ids = torch.randint(0, 250, (B, T), generator=torch.Generator().manual_seed(0))
    attn = torch.ones(B, T, dtype=torch.long)
    attn[1, :40] = 0
    skip = [p.untyped_storage().data_ptr() for p in model.parameters()]
    measured = memplan._saved_bytes(lambda: model.hidden(ids, attention_mask=attn), skip)
    planned = sum(costs[k].bytes(B, T) for k in model.config.layer_types) + costs["final_norm"].bytes(B, T)
    assert abs(planned / measured - 1) < 0.05, (planned, measured)
    assert params  # LoRA was on


def test_train_py_plan_prints_the_table(capsys):
    """--plan reads the config only: the soyuz preset with the tiny hybrid model, and the mdp pipeline's GRPO stage."""
    import train
    for argv in (["--task", "soyuz", "--model", "tiny-qwen3.5"], ["--task", "mdp"]):
        p = train.main([*argv, "--plan"])
        out = capsys.readouterr().out
        assert "| weights |" in out and "fits with --grad-checkpoint: 24 GB" in out
        assert p["peak_ckpt"] <= p["peak"] and p["params"] > 0


@pytest.mark.slow
def test_plan_within_25_percent_of_a_measured_step():
    """bench/memplan_check.py: tiny model, B=8 x T=256, fp32, a real GRPO step (with and without checkpointing)
    against the plan's parts for it."""
    sys.path.insert(0, os.path.join(ROOT, "bench"))
    try:
        import memplan_check
    finally:
        sys.path.pop(0)
    for ckpt, planned, measured in memplan_check.check(memplan_check.parse(["--batch", "8", "--seq", "256",
                                                                            "--prompt", "128"])):
        assert abs(planned / measured - 1) < 0.25, (ckpt, planned, measured)
