"""The mixture-of-experts decoders (minigrpo/moe.py) against transformers' Qwen3MoeForCausalLM and Qwen3.5-MoE
classes (the oracle, tests only), on tiny random checkpoints written by save_pretrained in each one's own expert
layout: save_pretrained writes the experts one by one (experts.N.gate_proj.weight, as the hub's Qwen3-30B-A3B);
`qwen3_5_moe_stacked` is the multimodal checkpoint rewritten with the stacked tensors transformers holds in memory
(experts.gate_up_proj, the layout of the Qwen3.5-MoE hub checkpoints)."""

import json
import os

import pytest
import torch

pytestmark = pytest.mark.oracle
transformers = pytest.importorskip("transformers")

from minigrpo.moe import SparseMoe  # noqa: E402
from minigrpo.pretrained import load_pretrained  # noqa: E402

V = 300
LIN, FULL = "linear_attention", "full_attention"
# fp32, 100 tokens x 2 rows, 1 and 2 threads, seeds 0 and 1 (docs/moe.md): Qwen3-MoE max |dlogits| <= 2.1e-6, bound
# 1e-5; Qwen3.5-MoE <= 9.1e-6 (the chunked delta rule's order of sums; the dense Qwen3.5 reaches 1.06e-5 at another
# seed), bound 5e-5: 2e-5 kept only 2.2x. They protect the router, the experts' weighted sum and the shared expert's
# gate: one wrong moves logits by more than 1e-3.
BOUND = {"qwen3": 1e-5, "qwen3_5": 5e-5}


def hf_model(kind):
    from transformers import (Qwen3_5MoeConfig, Qwen3_5MoeForCausalLM, Qwen3_5MoeForConditionalGeneration,
                              Qwen3_5MoeTextConfig, Qwen3MoeConfig, Qwen3MoeForCausalLM)
    common = dict(vocab_size=V, hidden_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                  rms_norm_eps=1e-6, tie_word_embeddings=False, num_experts=8, num_experts_per_tok=2,
                  moe_intermediate_size=32)
    if kind.startswith("qwen3_moe"):
        sparse = dict(qwen3_moe=dict(norm_topk_prob=True),
                      qwen3_moe_mixed=dict(norm_topk_prob=False, decoder_sparse_step=2, mlp_only_layers=[3]))[kind]
        return Qwen3MoeForCausalLM(Qwen3MoeConfig(num_hidden_layers=4, intermediate_size=96, rope_theta=1e6,
                                                  **common, **sparse))
    text = dict(common, num_hidden_layers=3, layer_types=[LIN, LIN, FULL], linear_conv_kernel_dim=4,
                linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16, linear_value_head_dim=24,
                shared_expert_intermediate_size=48,
                rope_parameters={"rope_type": "default", "rope_theta": 1e7, "partial_rotary_factor": 0.25})
    if kind == "qwen3_5_moe_text":
        return Qwen3_5MoeForCausalLM(Qwen3_5MoeTextConfig(**text))
    vision = dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=64, patch_size=4,
                  num_position_embeddings=16)
    return Qwen3_5MoeForConditionalGeneration(Qwen3_5MoeConfig(text_config=text, vision_config=vision))


def randomise(model, seed):
    """Every weight random, norms included: plain norms around 1, Qwen3.5's (1 + w) norms around 0."""
    g = torch.Generator().manual_seed(seed)
    zero_centered = "Qwen3_5" in type(model).__name__
    with torch.no_grad():
        for name, p in model.named_parameters():
            r = torch.randn(p.shape, generator=g)
            if name.endswith("A_log"):
                p.copy_(torch.empty(p.shape).uniform_(-1.0, 1.5, generator=g))
            elif name.endswith("dt_bias"):
                p.copy_(r * 0.5)
            elif "norm" in name and p.ndim == 1:
                plain = "linear_attn.norm" in name or not zero_centered
                p.copy_(1 + 0.2 * r if plain else 0.2 * r)
            elif "conv1d" in name:
                p.copy_(0.3 * r)
            else:
                p.copy_(0.08 * r)


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    cache = {}

    def get(kind, seed=0):
        if (kind, seed) not in cache:
            torch.manual_seed(0)
            model = hf_model(kind.removesuffix("_stacked"))
            randomise(model, seed)
            path = tmp_path_factory.mktemp(kind)
            model.save_pretrained(path)
            if kind.endswith("_stacked"):
                write_stacked(model, path)
            cache[kind, seed] = str(path)
        return cache[kind, seed]
    return get


def write_stacked(model, path):
    """Replaces the saved weights by the model's own state_dict: experts as (E, 2I, H) and (E, H, I) tensors."""
    from safetensors.torch import save_file
    os.remove(path / "model.safetensors")
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, path / "model.safetensors")


def hf_logits(path, ids):
    from transformers import AutoModelForCausalLM
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, attn_implementation="eager").eval()
    with torch.no_grad():
        return model(ids).logits


def tensor_names(path):
    from safetensors import safe_open
    index = os.path.join(path, "model.safetensors.index.json")
    files = sorted(set(json.load(open(index))["weight_map"].values())) if os.path.exists(index) else [
        "model.safetensors"]
    names = []
    for f in files:
        with safe_open(os.path.join(path, f), "pt") as st:
            names += list(st.keys())
    return names


KINDS = ["qwen3_moe", "qwen3_moe_mixed", "qwen3_5_moe_text", "qwen3_5_moe", "qwen3_5_moe_stacked"]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("seed", [0, 1])
def test_fp32_parity(ckpt, kind, seed):
    path = ckpt(kind, seed)
    ids = torch.randint(0, V, (2, 100), generator=torch.Generator().manual_seed(seed + 1))
    ours = load_pretrained(path)
    with torch.no_grad():
        got = ours(ids)
    ref = hf_logits(path, ids)
    assert ref.abs().max() > 1.0  # logits with a real scale
    print(f"{kind} seed {seed}: max |dlogits| {(got - ref).abs().max().item():.2e}")
    assert (got - ref).abs().max() <= BOUND[ours.config.family]


def test_layouts_and_layer_kinds(ckpt):
    """The checkpoints cover both expert layouts, and the mixed Qwen3-MoE config builds dense MLPs where
    transformers does (decoder_sparse_step 2: layers 1 and 3 sparse, minus mlp_only_layers [3])."""
    per_expert = tensor_names(ckpt("qwen3_moe"))
    stacked = tensor_names(ckpt("qwen3_5_moe_stacked"))
    assert "model.layers.0.mlp.experts.7.up_proj.weight" in per_expert
    assert "model.language_model.layers.0.mlp.experts.gate_up_proj" in stacked
    assert not any(".experts.0." in n for n in stacked)
    mixed = load_pretrained(ckpt("qwen3_moe_mixed"))
    assert [isinstance(layer.mlp, SparseMoe) for layer in mixed.model.layers] == [False, True, False, False]


def test_sharded_checkpoint(ckpt, tmp_path):
    """Experts split across shards are stacked as the single-file checkpoint's (bytes equal)."""
    from transformers import AutoModelForCausalLM
    hf = AutoModelForCausalLM.from_pretrained(ckpt("qwen3_moe"), dtype=torch.float32)
    hf.save_pretrained(tmp_path, max_shard_size="100KB")
    assert os.path.exists(tmp_path / "model.safetensors.index.json")
    whole, sharded = load_pretrained(ckpt("qwen3_moe")), load_pretrained(str(tmp_path))
    for (n, a), (_, b) in zip(whole.state_dict().items(), sharded.state_dict().items()):
        assert torch.equal(a, b), n


def test_lora_on_moe_is_peft_readable(tmp_path):
    """tiny-moe with the default LoRA targets: adapters on attention, Gated DeltaNet and the shared expert; the
    router, the shared expert's gate and the routed experts frozen. The adapter file, read by PEFT onto
    transformers' Qwen3.5-MoE, gives our logits."""
    from peft import PeftModel
    from transformers import AutoConfig, AutoModelForCausalLM

    from hf_oracle import hf_logits, ids
    from minigrpo.lora import inject_lora
    from minigrpo.pretrained import QwenConfig
    from minigrpo.run.lora_files import save_adapter
    from test_lora import randomise_lora
    raw = dict(QwenConfig.tiny("tiny-moe").raw)
    torch.manual_seed(0)
    hf = AutoModelForCausalLM.from_config(AutoConfig.for_model(raw.pop("model_type"), **raw), dtype=torch.float32)
    hf.save_pretrained(tmp_path / "hf")
    model = load_pretrained(str(tmp_path / "hf"))
    inject_lora(model, r=4, alpha=8)
    randomise_lora(model)
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert any(".shared_expert.down_proj.lora_B" in n for n in trainable)
    assert any(".linear_attn.in_proj_qkv.lora_A" in n for n in trainable)
    assert not any(".mlp.gate." in n or ".experts." in n or "shared_expert_gate" in n for n in trainable)
    save_adapter(model, tmp_path / "adapter", base_model_name_or_path=str(tmp_path / "hf"))
    x = ids()
    with torch.no_grad():
        ours = model(x)
        plain = hf(input_ids=x).logits
    peft = PeftModel.from_pretrained(hf, tmp_path / "adapter")
    assert (ours - plain).abs().max() > 1e-3  # the adapter matters
    assert (hf_logits(peft, x) - ours).abs().max() <= 1e-5


def test_expert_and_router_lora_are_peft_readable(tmp_path):
    """tiny-moe with LoRA on the routed experts (each expert its own pair on gate_up_proj and down_proj) and on the
    router, every adapter nonzero: save_adapter's file, read by PEFT (target_parameters) onto transformers'
    Qwen3.5-MoE, gives our logits within 1e-5 fp32 (measured 2.3e-6); the merged export gives them
    too; load_adapter reads the file back bit for bit. A pair laid out in any other order than PEFT's (B's columns are
    rank-major: j E + e) moves logits by more than 1e-2."""
    from peft import PeftModel
    from transformers import AutoConfig, AutoModelForCausalLM

    from hf_oracle import hf_logits, ids
    from minigrpo.lora import inject_lora, param_adapters
    from minigrpo.pretrained import QwenConfig
    from minigrpo.run.lora_files import export_merged, load_adapter, save_adapter
    from test_lora import randomise_lora
    raw = dict(QwenConfig.tiny("tiny-moe").raw)
    torch.manual_seed(0)
    hf = AutoModelForCausalLM.from_config(AutoConfig.for_model(raw.pop("model_type"), **raw), dtype=torch.float32)
    hf.save_pretrained(tmp_path / "hf")
    model = load_pretrained(str(tmp_path / "hf"))
    inject_lora(model, r=4, alpha=8, experts=True, router=True)
    randomise_lora(model)
    g = torch.Generator().manual_seed(2)
    with torch.no_grad():
        for _, _, a in param_adapters(model):
            a.lora_B.copy_(torch.randn(a.lora_B.shape, generator=g) * 0.3)
    save_adapter(model, tmp_path / "adapter", base_model_name_or_path=str(tmp_path / "hf"))
    x = ids()
    with torch.no_grad():
        ours = model(x)
        plain = hf(input_ids=x).logits
    export_merged(model, None, tmp_path / "merged")
    merged = AutoModelForCausalLM.from_pretrained(tmp_path / "merged", dtype=torch.float32)
    peft = PeftModel.from_pretrained(hf, tmp_path / "adapter")
    assert (ours - plain).abs().max() > 1e-2  # the adapters matter
    print(f"expert + router LoRA, PEFT: max |dlogits| {(hf_logits(peft, x) - ours).abs().max().item():.2e}")
    assert (hf_logits(peft, x) - ours).abs().max() <= 1e-5
    assert (hf_logits(merged, x) - ours).abs().max() <= 1e-5
    again = load_pretrained(str(tmp_path / "hf"))
    load_adapter(again, tmp_path / "adapter")
    for (_, _, a), (_, _, b) in zip(param_adapters(model), param_adapters(again), strict=True):
        assert torch.equal(a.lora_A, b.lora_A) and torch.equal(a.lora_B, b.lora_B)
