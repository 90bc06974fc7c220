"""The memory plan's arithmetic (minigrpo/run/memplan.py): exact parameter and cache counts, per-layer activation costs
that add up to what autograd saves for the whole model, and (slow) the plan within 25% of a real step's peak RSS."""

import json
import os
import sys

import pytest
import torch
import torch.nn.functional as F

from minigrpo import model as model_mod
from minigrpo.lora import DEFAULT_TARGETS, inject_lora
from minigrpo.model import Qwen
from minigrpo.pretrained import QwenConfig
from minigrpo.pretrained import load_pretrained
from minigrpo.run import attention_kernels, memplan

from repo_root import ROOT

KINDS = ["tiny", "tiny-qwen3.5"]


@pytest.mark.parametrize("kind", KINDS)
def test_counts_equal_a_built_model(kind):
    model = load_pretrained(kind)
    cfg = model.config
    total, trainable = memplan.param_counts(cfg, lora_r=8)
    assert total == sum(p.numel() for p in model.parameters())
    assert trainable == sum(p.numel() for p in inject_lora(model, r=8, alpha=8))
    assert memplan.param_counts(cfg, lora_r=0) == (total, total)
    cache = load_pretrained(kind).new_cache(3, 50)
    kv, gdn = memplan.cache_bytes(cfg, rows=3, slots=50, dtype_bytes=4)
    nbytes = lambda xs: sum(x.numel() * x.element_size() for x in xs if x is not None)
    assert kv == nbytes(cache.k + cache.v) and gdn == nbytes(cache.conv + cache.state)


@pytest.mark.parametrize("kind", KINDS)
def test_layer_costs_add_up_to_the_whole_model(kind):
    """Per-layer costs measured on lone layers (B=1, two lengths) x the layer count = what the full model's
    forward saves for backward at another batch size and length, with LoRA on, left padding included."""
    model = load_pretrained(kind)
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


def narrow(name):
    """A bundled model's attention shapes (heads, head dim, dtype rules) at width 64, 3 DeltaNet + 1 attention
    layer for Qwen3.5: the kernel choice reads only the attention call."""
    with open(os.path.join(memplan.CONFIGS, memplan.BUNDLED[name])) as f:
        d = json.load(f)
    if "text_config" in d:
        d = dict(d["text_config"], model_type="qwen3_5_text",
                 layer_types=["linear_attention"] * 3 + ["full_attention"], num_hidden_layers=4)
    else:
        d = dict(d, num_hidden_layers=1)
    d.update(hidden_size=64, intermediate_size=64, vocab_size=272)
    return QwenConfig.from_dict(d, source=name)


def model_training_kernels(cfg, dtype=torch.bfloat16):
    """The CUDA kernels of the model's own attention calls in a padded training forward (model.hidden)."""
    m = Qwen(cfg).to(dtype)
    pads = torch.ones(2, 96, dtype=torch.long)
    pads[1, :30] = 0
    with attention_kernels.Recorder(skip=True) as rec:
        m.hidden(torch.randint(0, 250, (2, 96)), attention_mask=pads)
    return set(rec.kernels())


@pytest.mark.parametrize("name", ["Qwen/Qwen3.5-4B", "Qwen/Qwen3-1.7B-Base"])
def test_plan_assumes_the_kernel_the_model_takes(name, monkeypatch):
    """The plan's attention kernel is the one the model's padded training forward takes, and what it keeps is that
    kernel's: the memory-efficient kernel keeps a bias of ~2 bytes (bf16) per token^2; were the call to fall to math
    (the old masked GQA call), the plan would name math and count its (nh, T, S) fp32 scores."""
    cfg = narrow(name)
    costs = memplan.layer_costs(cfg, torch.bfloat16, lora_r=8)
    assert {costs["attention_kernel"]} == model_training_kernels(cfg) == {"efficient"}
    assert 1.5 < costs["full_attention"].per_token2 < 2.5
    p = memplan.plan(cfg, memplan.Shape(1, 4, 64, 128, 2, 512, 128), torch.bfloat16, 8, costs=costs)
    assert p["attention_kernel"] == "efficient"
    assert "the memory-efficient kernel" in memplan.format_plan(p, "header")
    old = lambda q, k, v, mask: F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
    monkeypatch.setattr(model_mod, "attend", old)
    slow = memplan.layer_costs(cfg, torch.bfloat16, lora_r=8)
    assert {slow["attention_kernel"]} == model_training_kernels(cfg) == {"math"}
    assert slow["full_attention"].per_token2 > cfg.num_attention_heads * 4


def test_kernel_saved_bytes_by_kernel():
    """What each CUDA kernel's autograd node keeps, from torch's meta functions: flash keeps no mask; the
    memory-efficient kernel keeps the CPU kernel's tensors (the bias rows padded to 16 slots); math keeps more."""
    B, nh, T, hd = 2, 8, 100, 128
    q = torch.zeros(B, nh, T, hd, dtype=torch.bfloat16)
    mask = torch.ones(B, 1, T, T, dtype=torch.bool)
    masked = attention_kernels.Call.of(q, q, q, attn_mask=mask)
    causal = attention_kernels.Call.of(q, q, q, is_causal=True)
    assert attention_kernels.cuda_kernel(masked) == "efficient" and attention_kernels.cuda_kernel(causal) == "flash"
    qkvo = 4 * q.numel() * 2
    lse = B * nh * T * 4
    assert memplan.kernel_saved_bytes(causal, "cuda") == qkvo + lse + 16 + 8       # + the RNG state
    eff = memplan.kernel_saved_bytes(masked, "cuda")
    assert eff == qkvo + B * nh * 128 * 4 + B * T * 112 * 2 + 16  # log-sum-exp rows padded to 32, bias to 16
    assert abs(eff - memplan.kernel_saved_bytes(masked, "cpu")) < 0.02 * eff
    math_call = attention_kernels.Call.of(q, q[:, :2], q[:, :2], attn_mask=mask, enable_gqa=True)
    assert attention_kernels.cuda_kernel(math_call) == "math"
    assert memplan.kernel_saved_bytes(math_call, "cuda") > B * nh * T * T * 4


def test_fast_decode_terms_are_what_the_fast_path_keeps():
    """The plan's merged copy and static caches equal the bytes merged.py and static_decode.py really keep after a
    run's two kinds of sampler call (two length buckets), on a model with both kinds of layer."""
    from minigrpo import merged, sampler, static_decode
    torch.manual_seed(0)
    m = load_pretrained("tiny-qwen3.5", dtype=torch.bfloat16)
    inject_lora(m, r=4, alpha=8)
    rows, new, prompts = 4, 8, {100: [[5] * 100, [6] * 90], 300: [[7] * 300, [8] * 280]}
    for L, ps in prompts.items():          # 108 slots -> the 256 bucket, 308 -> 384
        sampler.sample(m, ps, n=2, max_new_tokens=new, seed=[1, 2], static=True, rows=rows)
    copy = merged.decode_model(m)
    kept_copy = sum(t.numel() * t.element_size() for t in copy.merged_weights.values())
    caches = static_decode._pool[copy].values()
    kv_state = sum(t.numel() * t.element_size() for c in caches for t in c.k + c.v + c.conv + c.state
                   if t is not None)
    shape = memplan.Shape(2, rows, 300, 300 + new, 4, 300 + new, new, (100 + new,))
    planned_copy, planned_caches = memplan.fast_decode_bytes(m.config, shape, 2, 4, DEFAULT_TARGETS)
    assert len(caches) == 2 and (planned_copy, planned_caches) == (kept_copy, kv_state)
    p = memplan.plan(m.config, shape, torch.bfloat16, 4, fast_decode=True)
    q = memplan.plan(m.config, shape, torch.bfloat16, 4, fast_decode=False, costs=None)
    assert p["peak_ckpt"] - q["peak_ckpt"] == pytest.approx(kept_copy + kv_state, rel=0.02)
    static_decode.release(copy)
    merged.release(m)


def test_plan_of_a_bad_config_is_one_line(tmp_path, capsys):
    import train
    (tmp_path / "config.json").write_text(json.dumps({"num_hidden_layers": "four", "hidden_size": 64}))
    with pytest.raises(SystemExit) as e:
        train.main(["--task", "synthetic", "--model", str(tmp_path), "--plan"])
    err = capsys.readouterr().err.strip().splitlines()
    assert e.value.code == 2 and len(err) == 1, err
    assert err[0].startswith("train.py: error: --model") and 'num_hidden_layers: "four"' in err[0], err
