"""One LoRA-A matmul per shared input (lora.shared_input): q, k and v, gate and up, and Gated DeltaNet's four input
projections read the same normed input, so their A matrices run as one (Σr, in) matmul, then each adapter's own B.
Against each adapter run alone: the same logits and the same gradients on every A and B up to fp32 rounding; one A
matmul per shared input in the forward (a decode step launches that many fewer small kernels); an adapter with
dropout keeps its own mask, so it runs alone."""
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from minigrpo import deltanet, lora, model as model_py
from minigrpo.lora import inject_lora, lora_layers, lora_parameters
from minigrpo.pretrained import load_pretrained

MATMULS = {"mm", "addmm", "bmm", "linear"}


def each_alone(x, *layers):
    return [m(x) for m in layers]


def adapted(kind, dropout=0.0, seed=0):
    model = load_pretrained(kind)
    torch.manual_seed(seed)                      # the adapters' A (kaiming init)
    inject_lora(model, r=4, alpha=8, dropout=dropout)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for _, m in lora_layers(model):          # a trained adapter: B away from zero
            m.lora_B.weight.copy_(torch.randn(m.lora_B.weight.shape, generator=gen) * 0.05)
    return model


def loss_and_grads(model, ids):
    logits = model(ids).float()
    loss = logits.log_softmax(-1).gather(-1, ids[..., None]).mean()
    grads = torch.autograd.grad(loss, lora_parameters(model))
    return logits.detach(), grads


@pytest.mark.parametrize("kind", ["tiny", "tiny-qwen3.5"])
@pytest.mark.parametrize("seed", [0, 1])
def test_shared_input_equals_each_adapter_alone(kind, seed, monkeypatch):
    # measured (OMP_NUM_THREADS 1 and 2, seeds 0 and 1): logits within 1.2e-6 (|logit| ~1), gradients within
    # 2.4e-6 of the largest gradient; bounds 1e-5 and 2e-5 of it (8x). They protect that each adapter
    # gets its own slice of the concatenated A and its own B, and its gradient back: a swapped or shifted slice
    # moves logits by 1e-3 and more.
    ids = torch.randint(0, 261, (2, 24), generator=torch.Generator().manual_seed(seed))
    model = adapted(kind, seed=seed)
    logits, grads = loss_and_grads(model, ids)
    monkeypatch.setattr(model_py, "shared_input", each_alone)
    monkeypatch.setattr(deltanet, "shared_input", each_alone)
    logits_alone, grads_alone = loss_and_grads(model, ids)
    assert (logits - logits_alone).abs().max() <= 1e-5
    scale = max(g.abs().max().item() for g in grads_alone)
    for (name, _), g, h in zip([(n, p) for n, p in model.named_parameters() if p.requires_grad], grads, grads_alone):
        assert (g - h).abs().max() <= 2e-5 * scale, f"{name}: gradient differs by {(g - h).abs().max().item():.3g}"


class MatmulCount(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.n = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.n += func.__name__.split(".")[0] in MATMULS
        return func(*args, **(kwargs or {}))


def lora_matmuls(model, ids):
    """Matmuls a forward spends on the adapters: with them, less without (adapters_disabled: the base alone)."""
    with torch.no_grad(), MatmulCount() as on:
        model(ids)
    with torch.no_grad(), lora.adapters_disabled(model), MatmulCount() as off:
        model(ids)
    return on.n - off.n


@pytest.mark.parametrize("kind", ["tiny", "tiny-qwen3.5"])
def test_one_lora_A_matmul_per_shared_input(kind):
    model = adapted(kind)
    ids = torch.tensor([[1, 2, 3]])
    adapters = len(lora_layers(model))
    # per layer: attention reads x for q, k, v and its output for o; GDN reads x for its four input projections
    # and its output for out_proj; the MLP reads x for gate and up and its product for down. Four inputs each.
    inputs = 4 * model.config.num_hidden_layers
    assert lora_matmuls(model, ids) == inputs + adapters          # one A per input, one B per adapter


def test_an_adapter_with_dropout_runs_alone():
    model = adapted("tiny-qwen3.5", dropout=0.1).train()
    assert lora_matmuls(model, torch.tensor([[1, 2, 3]])) == 2 * len(lora_layers(model))
