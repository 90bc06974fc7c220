"""LoRA: identity at init, exact base under adapters_disabled, merge = unmerged, strip and fold, bf16 base with fp32
adapters. Torch alone; the files and their PEFT and transformers round trips are test_lora_files.py."""

import pytest
import torch

from minigrpo.lora import (DEFAULT_TARGETS, LoRALinear, adapters_disabled, fold_lora, inject_lora, lora_layers,
                           merge_lora, strip_lora, unmerge_lora)
from minigrpo.pretrained import load_pretrained
from hf_oracle import ids

KINDS = ["tiny", "tiny-qwen3.5"]


def randomise_lora(model, seed=1, std=0.05):
    """B is zero at init; give every A and B random values so that LoRA changes the output."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for _, m in lora_layers(model):
            m.lora_B.weight.copy_(torch.randn(m.lora_B.weight.shape, generator=g) * std)
            m.lora_A.weight.copy_(torch.randn(m.lora_A.weight.shape, generator=g) * std * 4)


@pytest.mark.parametrize("kind", KINDS)
def test_identity_at_init_and_only_lora_trains(kind):
    model = load_pretrained(kind)
    x = ids()
    base = model(x)
    params = inject_lora(model, r=4, alpha=8)
    assert torch.equal(model(x), base)  # B = 0: exactly the base model
    trainable = [p for p in model.parameters() if p.requires_grad]
    assert {id(p) for p in trainable} == {id(p) for p in params}
    assert all(p.dtype == torch.float32 for p in params)
    wrapped = {path.rsplit(".", 1)[-1] for path, _ in lora_layers(model)}
    expected = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}
    if kind == "tiny-qwen3.5":
        expected |= {"in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a", "out_proj"}
    assert wrapped == expected and wrapped <= set(DEFAULT_TARGETS)
    # every linear layer but the output head carries an adapter (LoRA on all layers, the MLP's included)
    bare = [n for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)
            and not n.endswith((".base_layer", ".lora_A", ".lora_B"))]
    assert bare == ["lm_head"]
    keys = model.state_dict().keys()
    assert "model.layers.0.mlp.up_proj.base_layer.weight" in keys
    assert "model.layers.0.mlp.up_proj.lora_A.weight" in keys and "model.layers.0.mlp.up_proj.lora_B.weight" in keys
    with pytest.raises(ValueError, match="already has LoRA"):
        inject_lora(model, r=4, alpha=8)


def test_a_init_like_peft():
    torch.manual_seed(0)
    layer = LoRALinear(torch.nn.Linear(64, 32, bias=False), r=8, alpha=16)
    bound = 1 / 64 ** 0.5  # kaiming_uniform_(a=sqrt(5)) on fan_in 64
    assert layer.lora_A.weight.abs().max() <= bound and layer.lora_A.weight.abs().max() > 0.8 * bound
    assert torch.count_nonzero(layer.lora_B.weight) == 0 and layer.scale == 2.0


@pytest.mark.parametrize("kind", KINDS)
def test_adapters_disabled_is_exact_base_after_training(kind):
    model = load_pretrained(kind)
    x = ids()
    base = model(x)
    params = inject_lora(model, r=4, alpha=8)
    opt = torch.optim.AdamW(params, lr=1e-2)
    for _ in range(2):
        loss = model(x).float().logsumexp(-1).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
    tuned = model(x)
    assert (tuned - base).abs().max() > 1e-3  # training moved it
    with adapters_disabled(model):
        assert torch.equal(model(x), base)
    assert torch.equal(model(x), tuned)  # and back


@pytest.mark.parametrize("kind", KINDS)
def test_merge_equals_unmerged(kind):
    model = load_pretrained(kind)
    x = ids()
    base = model(x)
    inject_lora(model, r=4, alpha=8)
    randomise_lora(model)
    unmerged = model(x)
    merge_lora(model)
    # W + (alpha/r) B A rounds in fp32, and unmerging subtracts a product that may round otherwise: max |dlogit|
    # 3.0e-6 merged, 6.3e-6 merged and unmerged (ATen's default kernels; 1.4e-6 with AVX2; 1 and 2 threads).
    # 5e-5 keeps 8x; an unmerge that subtracts 0.999 of the update moves logits by 1e-4 and more.
    assert (model(x) - unmerged).abs().max() <= 5e-5
    with pytest.raises(RuntimeError, match="unmerge_lora"):
        with adapters_disabled(model):
            pass
    unmerge_lora(model)
    assert (model(x) - unmerged).abs().max() <= 5e-5
    with adapters_disabled(model):
        assert (model(x) - base).abs().max() <= 1e-5


def test_strip_and_fold_leave_a_plain_model():
    """strip_lora drops unmerged adapters (the base function comes back); fold_lora keeps their function in the
    weights (the mdp pipeline's SFT weights that its DPO and GRPO adapters sit on)."""
    x = ids()
    for drop, keeps_adapter in ((strip_lora, False), (fold_lora, True)):
        model = load_pretrained("tiny")
        base = model(x)
        inject_lora(model, r=4, alpha=8)
        randomise_lora(model)
        tuned = model(x)
        assert not torch.allclose(tuned, base, atol=1e-4)
        drop(model)
        assert not lora_layers(model) and not hasattr(model, "lora_config")
        assert (model(x) - (tuned if keeps_adapter else base)).abs().max() <= 1e-5


def test_bf16_keeps_base_dtype_and_fp32_adapters():
    model = load_pretrained("tiny", dtype=torch.bfloat16)
    inject_lora(model, r=4, alpha=8)
    randomise_lora(model)
    layer = model.model.layers[0].self_attn.q_proj
    assert layer.base_layer.weight.dtype == torch.bfloat16 and layer.lora_A.weight.dtype == torch.float32
    assert model(ids()).dtype == torch.bfloat16
