"""LoRALinear's branch exactly as lora.py documents it: dropout on the branch input in training only, and the branch
in fp32 added to the model-dtype base output before the cast back (PEFT's order)."""
import torch
import torch.nn.functional as F

from minigrpo.lora import LoRALinear


def layer(dtype, dropout=0.0):
    torch.manual_seed(0)
    base = torch.nn.Linear(16, 12, bias=False).to(dtype)
    lora = LoRALinear(base, r=4, alpha=8, dropout=dropout)
    with torch.no_grad():
        lora.lora_B.weight.normal_(0, 0.3)
    return lora


def branch(lora, x):
    """The fp32 branch written out: (alpha / r) * B A x, no rounding in between."""
    return F.linear(F.linear(x, lora.lora_A.weight), lora.lora_B.weight) * (lora.alpha / lora.r)


def test_dropout_acts_on_the_branch_input_in_training_only():
    lora = layer(torch.float32, dropout=0.5)
    x = torch.randn(3, 16)
    lora.train()
    torch.manual_seed(1)
    y = lora(x)
    torch.manual_seed(1)
    dropped = F.dropout(x, 0.5, training=True)
    assert torch.allclose(y, lora.base_layer(x) + branch(lora, dropped), atol=1e-6)
    assert not torch.allclose(y, lora.base_layer(x) + branch(lora, x), atol=1e-4)
    lora.eval()
    assert torch.allclose(lora(x), lora.base_layer(x) + branch(lora, x), atol=1e-6)


def test_bf16_branch_runs_in_fp32_and_adds_before_the_cast():
    lora = layer(torch.bfloat16)
    x = torch.randn(64, 16).to(torch.bfloat16)
    with torch.no_grad():
        want = (lora.base_layer(x) + branch(lora, x.float())).to(torch.bfloat16)
        assert torch.equal(lora(x), want)
        rounded = F.linear(F.linear(x.float(), lora.lora_A.weight).to(torch.bfloat16).float(), lora.lora_B.weight)
        assert not torch.equal((lora.base_layer(x) + rounded * 2.0).to(torch.bfloat16), want)   # it would show
