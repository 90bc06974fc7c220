"""The memory plan's arithmetic (minigrpo/run/memplan.py, minigrpo/run/layercost.py): exact parameter and cache
counts, per-layer activation costs that add up to what autograd saves for the whole model and that hold at a length
four times the longest measured, every preset's plan >= 0 part by part and growing with length, the static caches a
run keeps, and (slow) the plan within 25% of a real step's peak RSS."""

import dataclasses
import functools
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
from minigrpo.run import attention_kernels, layercost, memplan
from minigrpo.run.presets import PRESETS

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


def test_expert_and_router_adapters_are_counted():
    """--lora-experts adds r (2H + 3I) parameters an expert and sparse layer (a pair on gate_up_proj (2I, H) and one
    on down_proj (H, I)), --lora-router r (H + E) a layer: the plan's count is the built model's and the formula's
    docs/moe.md quotes for the real models."""
    model = load_pretrained("tiny-moe")
    cfg = model.config
    H, I, E, L, r = cfg.hidden_size, cfg.moe_intermediate_size, cfg.num_experts, cfg.num_hidden_layers, 8
    _, plain = memplan.param_counts(cfg, lora_r=r)
    _, experts = memplan.param_counts(cfg, lora_r=r, experts=True)
    _, both = memplan.param_counts(cfg, lora_r=r, experts=True, router=True)
    assert experts - plain == L * E * r * (2 * H + 3 * I)
    assert both - experts == L * r * (H + E)
    assert both == sum(p.numel() for p in inject_lora(model, r=r, alpha=r, experts=True, router=True))


@pytest.mark.parametrize("kind", KINDS + ["tiny-moe, layer 1 dense"])
def test_layer_costs_add_up_to_the_whole_model(kind):
    """Per-layer costs measured on lone layers (B=1, three lengths) x the layer count = what the full model's
    forward saves for backward at another batch size and length, with LoRA on, left padding included. The MoE
    model has a dense MLP layer among its sparse ones (Qwen3-MoE's mlp_only_layers): each is measured as what it
    is (layercost.layer_keys; measuring each as its attention kind's first layer, sparse, is 17% off here)."""
    if kind.startswith("tiny-moe"):
        cfg = dataclasses.replace(QwenConfig.tiny("tiny-moe"), mlp_only_layers=[1], intermediate_size=1024)
        model = Qwen(cfg)
        torch.manual_seed(0)
        with torch.no_grad():
            for p in model.parameters():
                p.normal_(0, 0.05)      # random routes: every expert gets tokens
    else:
        model = load_pretrained(kind)
    params = inject_lora(model, r=8, alpha=8)
    costs = layercost.layer_costs(model.config, torch.float32, lora_r=8)
    B, T = 3, 192
    ids = torch.randint(0, 250, (B, T), generator=torch.Generator().manual_seed(0))
    attn = torch.ones(B, T, dtype=torch.long)
    attn[1, :40] = 0
    skip = [p.untyped_storage().data_ptr() for p in model.parameters()]
    measured = layercost.saved_bytes(lambda: model.hidden(ids, attention_mask=attn), skip)
    planned = sum(costs[k].bytes(B, T) for k in layercost.layer_keys(model.config)) + costs["final_norm"].bytes(B, T)
    assert abs(planned / measured - 1) < 0.05, (planned, measured)
    assert params  # LoRA was on


def test_fit_keeps_every_term_non_negative():
    """A backward working set of fixed LoRA gradients plus bytes per token: a free two-length fit reads the fixed
    part as a negative T^2 term; the non-negative fit recovers the parts and never extrapolates below zero."""
    lengths = (128, 256, 512)
    c = layercost.LayerCost.fit(lengths, [900_000 + 47_000 * T for T in lengths])
    assert c.fixed == pytest.approx(900_000, rel=1e-6) and c.per_token == pytest.approx(47_000, rel=1e-6)
    assert c.per_token2 == 0 and c.bytes(1, 13_644) > 0
    mask_and_tokens = layercost.LayerCost.fit(lengths, [250_000 * T + 2 * T * T for T in lengths])
    assert mask_and_tokens.per_token2 == pytest.approx(2, rel=1e-6) and mask_and_tokens.fixed == pytest.approx(0)
    noisy = layercost.LayerCost.fit(lengths, [5e6 - 10 * T for T in lengths])      # shrinks with length: no term
    assert min(noisy.fixed, noisy.per_token, noisy.per_token2) >= 0
    with pytest.raises(ValueError, match="three or more lengths"):
        layercost.LayerCost.fit((128, 256), [1, 2])


@pytest.mark.parametrize("kind", KINDS)
def test_fit_holds_at_a_long_length(kind):
    """Fitted at 128-512 tokens, each layer's saved bytes and backward working set at 2,048 tokens (measured
    directly, at a small width) are what the fit says, within 3%."""
    cfg = QwenConfig.tiny(kind)
    costs = layercost.layer_costs(cfg, torch.bfloat16, lora_r=8)
    for k in dict.fromkeys(cfg.layer_types):
        saved, backward = layercost.measure_layer(cfg, layercost.layer(cfg, k, torch.bfloat16, 8), 2048)
        assert costs[k].bytes(1, 2048) == pytest.approx(saved, rel=0.03), k
        assert costs[k].backward.bytes(1, 2048) == pytest.approx(backward, rel=0.03), k


@functools.lru_cache(maxsize=None)
def costs_of(model, dtype, lora_r, targets):
    return layercost.layer_costs(memplan.load_config(model)[0], dtype, lora_r, targets)


def longer(shape, k):
    """The same run with every length k times as long."""
    return dataclasses.replace(shape, prompt_tokens=shape.prompt_tokens * k, slots=shape.slots * k,
                               train_tokens=shape.train_tokens * k, completion_tokens=shape.completion_tokens * k,
                               shortest_slots=shape.shortest_slots * k, turn_tokens=shape.turn_tokens * k)


@pytest.mark.parametrize("task", sorted(PRESETS))
def test_every_preset_plan_is_non_negative_grows_with_length_and_keeps_the_layer_inputs(task):
    """For every preset's run (the rows train.decode_rows gives it), at its lengths and at 2x and 4x them: every part
    >= 0, no part shrinking and the peaks growing as the lengths grow, and the checkpointed activations at least the
    layer inputs they keep (L x B x T x H in the activations' dtype)."""
    import train
    from minigrpo.run.flags import resolve_args
    from minigrpo.tasks import task_class
    args = resolve_args(["--task", task, "--run-name", "plan-test"])
    shape, s = memplan.run_shape(args, train.decode_rows(task_class(task), args, args.tasks_per_step))
    cfg = memplan.load_config(args.model)[0]
    costs = costs_of(args.model, torch.bfloat16, s["lora_r"], tuple(s["targets"]))
    width = 2 if s["lora_r"] > 0 else 4     # a full fine-tune trains, and so computes in, fp32
    before = None
    for k in (1, 2, 4):
        sh = longer(shape, k)
        p = memplan.plan(cfg, sh, torch.bfloat16, s["lora_r"], s["targets"], s["beta"], costs=dict(costs))
        parts = {n: v for n, v in p.items() if isinstance(v, (int, float))}
        assert min(parts.values()) >= 0, (k, parts)
        inputs = cfg.num_hidden_layers * sh.micro_batch * sh.train_tokens * cfg.hidden_size * width
        assert p["activations_ckpt"] >= inputs, (k, p["activations_ckpt"], inputs)
        if before:
            assert all(parts[n] >= before[n] for n in parts), (k, {n: (before[n], parts[n]) for n in parts})
            assert p["peak"] > before["peak"] and p["peak_ckpt"] > before["peak_ckpt"]
        before = parts


def test_checkpointed_inputs_are_in_the_activations_dtype():
    """With checkpointing each layer keeps its input: bf16 under LoRA, fp32 in a full fine-tune (whose weights, and
    so activations, are fp32); with every measured cost zero that and the bool mask are all that is left."""
    cfg = QwenConfig.tiny("tiny")
    zero = layercost.LayerCost(0, 0, 0, backward=layercost.LayerCost(0, 0))
    costs = {k: zero for k in (*cfg.layer_types, "final_norm")}
    shape = memplan.Shape(1, 4, 32, 64, 2, 300, 100)
    L, H = cfg.num_hidden_layers, cfg.hidden_size
    for lora_r, width in ((8, 2), (0, 4)):
        p = memplan.plan(cfg, shape, torch.bfloat16, lora_r, costs=costs)
        assert p["activations_ckpt"] == L * 2 * 300 * H * width + 2 * 300 * 300


def test_train_py_plan_prints_the_table(capsys, monkeypatch):
    """--plan reads the config only: the soyuz preset with the tiny hybrid model, and the mdp pipeline's GRPO stage;
    its sampler rows are train.decode_rows', whatever that function says."""
    import train
    for argv in (["--task", "soyuz", "--model", "tiny-qwen3.5"], ["--task", "mdp"]):
        p = train.main([*argv, "--plan"])
        out = capsys.readouterr().out
        assert "| weights |" in out and "fits with --grad-checkpoint: 24 GB" in out
        assert p["peak_ckpt"] <= p["peak"] and p["params"] > 0
    monkeypatch.setattr(train, "decode_rows", lambda task, args, n: 7)
    train.main(["--task", "soyuz", "--model", "tiny-qwen3.5", "--plan"])
    assert "longest sampler call: 7 rows x" in capsys.readouterr().out


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
    costs = layercost.layer_costs(cfg, torch.bfloat16, lora_r=8)
    assert {costs["attention_kernel"]} == model_training_kernels(cfg) == {"efficient"}
    assert 1.5 < costs["full_attention"].per_token2 < 2.5
    p = memplan.plan(cfg, memplan.Shape(1, 4, 64, 128, 2, 512, 128), torch.bfloat16, 8, costs=costs)
    assert p["attention_kernel"] == "efficient"
    assert "the memory-efficient kernel" in memplan.format_plan(p, "header")
    old = lambda q, k, v, mask: F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
    monkeypatch.setattr(model_mod, "attend", old)
    slow = layercost.layer_costs(cfg, torch.bfloat16, lora_r=8)
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
    assert layercost.kernel_saved_bytes(causal, "cuda") == qkvo + lse + 16 + 8       # + the RNG state
    eff = layercost.kernel_saved_bytes(masked, "cuda")
    assert eff == qkvo + B * nh * 128 * 4 + B * T * 112 * 2 + 16  # log-sum-exp rows padded to 32, bias to 16
    assert abs(eff - layercost.kernel_saved_bytes(masked, "cpu")) < 0.02 * eff
    math_call = attention_kernels.Call.of(q, q[:, :2], q[:, :2], attn_mask=mask, enable_gqa=True)
    assert attention_kernels.cuda_kernel(math_call) == "math"
    assert layercost.kernel_saved_bytes(math_call, "cuda") > B * nh * T * T * 4


def test_static_caches_are_what_the_fast_path_keeps():
    """The plan's static cache equals the bytes static_decode.py keeps after a run's calls of 108 to 458 slots
    (buckets 256 to 512), on a model with both kinds of layer: the run's rows at the longest call's bucket, once,
    however many lengths the calls had."""
    from minigrpo import sampler, static_decode
    m = load_pretrained("tiny-qwen3.5", dtype=torch.bfloat16)
    rows, new = 4, 8
    settings = sampler.Settings(n=2, max_new_tokens=new, static=True, rows=rows)
    for L in (100, 450, 300):       # a short turn-0 prompt, the longest, a revision of a middling answer
        sampler.sample(m, [[5] * L, [6] * (L - 10)], settings, seed=[1, 2])
    (cache,) = static_decode._pool[m].values()
    kept = sum(t.numel() * t.element_size() for t in cache.k + cache.v + cache.conv + cache.state if t is not None)
    assert kept == sum(t.numel() * t.element_size() for t in cache.flat[:-4] if t is not None)   # all it holds
    shape = memplan.Shape(2, rows, 450, 450 + new, 4, 450 + new, new, 100 + new)
    assert memplan.static_slots(shape) == 512 == cache.mask.shape[1]
    assert memplan.static_cache_bytes(m.config, shape, 2) == kept
    costs = layercost.layer_costs(m.config, torch.bfloat16, 4)
    p = memplan.plan(m.config, shape, torch.bfloat16, 4, costs=costs, fast_decode=True)
    q = memplan.plan(m.config, shape, torch.bfloat16, 4, costs=costs, fast_decode=False)
    assert p["peak_ckpt"] - q["peak_ckpt"] == pytest.approx(kept) and q["static_caches"] == 0
    static_decode.release(m)


def test_kept_states_are_what_the_sampler_holds():
    """A call whose rows continue kept states (sampler reuse) holds, per row, the state it continues and the one it
    keeps: the plan's kept_states are their bytes, on a model with both kinds of layer. (The plan counts whole
    prompts; Qwen3.5 keeps a prompt up to its last multiple of 64 tokens, so prompts on that grid hold exactly it.)"""
    from minigrpo import sampler
    m = load_pretrained("tiny-qwen3.5", dtype=torch.bfloat16)
    rows, turn, L, new = 3, 64, 128, 8
    greedy = sampler.Settings(n=1, max_new_tokens=new, temperature=0.0, stop_ids=())
    before = sampler.sample(m, [[5 + i] * (L - turn) for i in range(rows)], greedy, keep=True)
    after = sampler.sample(m, [[5 + i] * L for i in range(rows)], greedy, keep=True, reuse=[s.kept for s in before])
    assert [s.reused for s in after] == [L - turn] * rows
    held = sum(t.numel() * t.element_size() for s in before + after for c in [s.kept.cache]
               for t in c.k + c.v + c.conv + c.state if t is not None)
    shape = memplan.Shape(rows, rows, L, L + new, 1, L + new, new, turn_tokens=turn)
    assert memplan.kept_bytes(m.config, shape, 2) == held
    assert memplan.kept_bytes(m.config, dataclasses.replace(shape, turn_tokens=0), 2) == 0


def test_continued_rows_prefill_one_row_of_new_tokens():
    """Whole prompts: the prefill is bounded by one layer over the call's prompts (B = P, T = S). Continued rows:
    over one row's new tokens, attending to every slot (T x S mask terms, K/V of the earlier slots expanded)."""
    cfg = QwenConfig.tiny("tiny-qwen3.5")
    c = lambda per_token, per_token2: layercost.LayerCost(per_token, per_token2, 1000)
    costs = {"linear_attention": c(500, 0), "full_attention": c(100, 3)}
    whole = memplan.Shape(6, 6, 300, 340, 1, 340, 40)
    logits = 6 * cfg.vocab_size * 4
    layers = (1000 + 6 * 500 * 300, 1000 + 6 * (100 * 300 + 3 * 300 * 300))
    assert memplan.prefill_bytes(cfg, costs, whole, 2) == max(layers) + logits
    turns = dataclasses.replace(whole, turn_tokens=50)
    expanded = 2 * cfg.num_attention_heads * 250 * cfg.head_dim * 2
    layers = (1000 + 500 * 50, 1000 + 100 * 50 + 3 * 50 * 300 + expanded)
    assert memplan.prefill_bytes(cfg, costs, turns, 2) == max(layers) + logits


def test_terminal_plan_continues_kept_states_and_trains_an_episode_as_one_sequence():
    """terminal: each turn prefills its answer and tool output only, and an episode is one trained sequence whose
    every policy turn's tokens get a log-prob; the other tasks prefill whole prompts."""
    from minigrpo.run.flags import resolve_args
    from minigrpo.tasks.terminal.task import MAX_TURNS, REPLY_TOKENS, TerminalTask
    args = resolve_args(["--task", "terminal", "--run-name", "plan-test"])
    shape, _ = memplan.run_shape(args, 8)
    new = args.max_new_tokens
    assert shape.turn_tokens == new + REPLY_TOKENS and shape.completion_tokens == MAX_TURNS * new
    assert shape.train_tokens == shape.slots and shape.micro_batch == 1
    # the loop holds an episode to the plan's longest prompt (tests/tasks/test_terminal_tokens.py: the digit flood)
    assert TerminalTask.from_args(args).context_tokens + new == shape.train_tokens
    soyuz, _ = memplan.run_shape(resolve_args(["--task", "soyuz", "--run-name", "plan-test"]), 24)
    assert soyuz.turn_tokens == 0


def test_plan_of_a_bad_config_is_one_line(tmp_path, capsys):
    import train
    (tmp_path / "config.json").write_text(json.dumps({"num_hidden_layers": "four", "hidden_size": 64}))
    with pytest.raises(SystemExit) as e:
        train.main(["--task", "synthetic", "--model", str(tmp_path), "--plan"])
    err = capsys.readouterr().err.strip().splitlines()
    assert e.value.code == 2 and len(err) == 1, err
    assert err[0].startswith("train.py: error: --model") and 'num_hidden_layers: "four"' in err[0], err
