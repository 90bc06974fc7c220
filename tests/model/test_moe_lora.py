"""LoRA on a MoE model's routed experts and router (lora.ParamLoRA inside moe.py's expert compute): the grouped
path with adapters against the looped one, the looped one against a per-expert reference (each expert's weights
with its update merged, token by token), gradients only where tokens went, the router frozen unless asked, the
KL switch, and the static decode step (plain and compiled) sampling the adapted model. Torch only; the PEFT files:
tests/model/test_moe_parity.py."""

from dataclasses import replace

import pytest
import torch

from minigrpo import moe, static_decode
from minigrpo.lora import adapters_disabled, inject_lora, param_adapters
from minigrpo.pretrained import load_pretrained
from minigrpo.sampler import Settings, sample
from test_moe import block, naive, rel


def adapted(dtype=torch.float32, seed=0, router=False, r=8):
    """test_moe's random sparse block with per-expert adapters (and the router's when asked), every B random at a
    scale where the update is as large as the expert's own output (a dropped branch moves it by O(1))."""
    b = block(seed, dtype)
    torch.manual_seed(seed)
    params = inject_lora(b, r=r, alpha=2 * r, experts=True, router=router)
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for _, _, a in param_adapters(b):
            a.lora_B.copy_(torch.randn(a.lora_B.shape, generator=g) * 0.3)
    return b, params


def merged_reference(b, x, ids):
    """test_moe.naive (token by token over each token's k experts) on the expert weights W_e + (α/r) B_e A_e."""
    with torch.no_grad():
        ex = b.experts
        saved = ex.gate_up_proj.clone(), ex.down_proj.clone()
        ex.gate_up_proj.add_(ex.gate_up_lora.delta_weight().to(ex.gate_up_proj.dtype))
        ex.down_proj.add_(ex.down_lora.delta_weight().to(ex.down_proj.dtype))
        try:
            return naive(b, x, ids)
        finally:
            ex.gate_up_proj.copy_(saved[0])
            ex.down_proj.copy_(saved[1])


def test_looped_expert_lora_equals_the_per_expert_reference():
    """fp32 (the loop): the block with adapters equals the token-by-token sum through the merged expert weights.
    Measured: 5e-7 relative (1 and 2 threads); the bound 1e-5 catches a dropped branch or an adapter applied to
    another expert's rows (O(1))."""
    b, _ = adapted()
    x = torch.randn(2, 30, 64)
    with torch.no_grad():
        y = b(x)
    assert rel(y.reshape(-1, 64), merged_reference(b, x, b.chosen.reshape(-1, 2))) <= 1e-5
    with torch.no_grad(), adapters_disabled(b):        # the update is not small: the check above has teeth
        assert rel(b(x), y) > 0.1


def test_grouped_expert_lora_equals_the_loop():
    """bf16 (torch._grouped_mm on the CPU): the grouped path's adapters ride the same token sort as the loop's.
    Outputs and gradients (input, every A and B) of the two paths; the grouped branch runs in bf16, the loop's in
    fp32 (without adapters the two paths are bit-equal: test_moe): measured up to 2.8% relative apart (seeds 0-3
    of the block and x, 1 and 2 threads; the update is as large as the expert's output); the bound 8e-2 catches a
    grouped path that drops either projection's branch (>= 0.3) or adds it to the wrong rows."""
    if not hasattr(torch, "_grouped_mm"):
        pytest.skip("this torch has no _grouped_mm")
    x = torch.randn(3, 40, 64, dtype=torch.bfloat16, generator=torch.Generator().manual_seed(0))
    runs = {}
    for grouped in (True, False):
        b, params = adapted(torch.bfloat16)
        b.experts.grouped = grouped
        xi = x.clone().requires_grad_()
        y = b(xi)
        y.float().pow(2).sum().backward()
        runs[grouped] = [y.float(), xi.grad.float()] + [p.grad for p in params[-4:]]
    assert moe.use_grouped_mm(x, [b.experts.gate_up_lora])         # r 8: the automatic choice is grouped
    assert not moe.use_grouped_mm(x, [adapted(torch.bfloat16, r=4)[0].experts.gate_up_lora])   # r 4: the loop
    for a, c in zip(runs[True], runs[False], strict=True):
        assert rel(a, c) <= 8e-2


def test_gradients_reach_routed_experts_only_and_the_router_when_asked():
    """Tokens replayed through experts 1, 4 and 6 only: those experts' A and B get gradients, the others' stay
    exactly zero; the router's weight and the experts' own tensors never get one; the router's adapter only
    exists, and trains, with router=True."""
    for router in (False, True):
        b, params = adapted(router=router)
        x = torch.randn(2, 12, 64)
        b.replay = torch.tensor([[1, 4], [6, 1], [4, 6]]).repeat(8, 1)      # (24, 2): 2 x 12 tokens
        b(x).pow(2).sum().backward()
        for a in (b.experts.gate_up_lora, b.experts.down_lora):
            used = [e for e in range(8) if a.lora_B.grad[e].abs().sum() > 0 and a.lora_A.grad[e].abs().sum() > 0]
            assert used == [1, 4, 6]
            assert all(a.lora_A.grad[e].abs().sum() == 0 for e in (0, 2, 3, 5, 7))
        assert b.gate.weight.grad is None and b.experts.gate_up_proj.grad is None
        assert (b.gate.lora is not None) == router
        if router:
            assert b.gate.lora.lora_B.grad.abs().sum() > 0 and any(p is b.gate.lora.lora_B for p in params)


def test_adapters_off_is_the_base_block_bit_for_bit():
    """The KL reference (adapters_disabled) skips the expert and router branches: the same bits as the block
    before injection, both paths."""
    for dtype in (torch.float32, torch.bfloat16):
        x = torch.randn(2, 20, 64, dtype=dtype)
        with torch.no_grad():
            base = block(0, dtype)(x)
            b, _ = adapted(dtype, router=True)
            with adapters_disabled(b):
                assert torch.equal(b(x), base)
            assert not torch.equal(b(x), base)


VOCAB, PROMPTS = 261, [[10, 20, 30, 40, 50, 60, 70], [257, 5], [99, 98, 97, 96]]
GREEDY = Settings(n=2, max_new_tokens=10, temperature=0.0, stop_ids=(), vocab_size=VOCAB)


def adapted_tiny_moe(dtype):
    """tiny-moe with expert and router adapters (r 8: the grouped path in bf16), B moved off zero."""
    model = load_pretrained("tiny-moe", dtype)
    torch.manual_seed(0)
    inject_lora(model, r=8, alpha=16, experts=True, router=True)
    with torch.no_grad():
        for _, _, a in param_adapters(model):
            a.lora_B.normal_(0, 0.05)
    return model.eval()


def assert_same(a, b, atol):
    for s, r in zip(a, b, strict=True):
        assert s.completion_ids == r.completion_ids
        assert torch.allclose(torch.tensor(s.logprobs), torch.tensor(r.logprobs), atol=atol, rtol=0)


def test_static_decode_samples_the_adapted_moe_model():
    """fp32 (the loop): the static decode step samples what the ordinary path samples, log-probs within 1e-5."""
    model = adapted_tiny_moe(torch.float32)
    assert_same(sample(model, PROMPTS, replace(GREEDY, static=True)), sample(model, PROMPTS, GREEDY), 1e-5)
    static_decode.release(model)


def test_grouped_expert_lora_compiles_as_one_graph():
    """The bf16 block with expert and router adapters (the grouped path, as the static decode step runs it on an
    H100) under torch.compile(fullgraph=True) with dynamo's "eager" backend (its graphs and guards, no code
    generation): no graph break (no host read of the routing), no recompilation when the routing changes, the
    uncompiled block's output bit for bit. The whole tiny-moe decode step with these adapters compiles as one
    graph too (docs/moe.md), a 40 s trace left out of the suite."""
    import torch._dynamo
    from torch._dynamo.utils import counters
    b, _ = adapted(torch.bfloat16, router=True)
    torch._dynamo.reset()
    counters.clear()
    compiled = torch.compile(b, backend="eager", fullgraph=True)
    with torch.no_grad(), torch._dynamo.config.patch(error_on_recompile=True):
        for seed in (0, 1):
            x = torch.randn(6, 1, 64, dtype=torch.bfloat16, generator=torch.Generator().manual_seed(seed))
            assert torch.equal(compiled(x), b(x))
    assert counters["stats"]["unique_graphs"] == 1 and not counters["graph_break"]
