"""LoRA for the Qwen decoder: injection, a base-model switch and merging (its files: run/lora_files.py).

LoRA (Hu et al. 2021) freezes a linear layer W (out × in) and learns a low-rank update:

    y = x Wᵀ + (α / r) · dropout(x) Aᵀ Bᵀ        A: (r, in), B: (out, r)

A starts as PEFT initialises it (kaiming_uniform_ with a=√5, like nn.Linear) and B at zero, so an injected model
computes exactly the base model until the first optimizer step. Each choice is written where its code is: precision
and state_dict names at LoRALinear, the KL reference at adapters_disabled, merging at merge_lora, the projections
that read one input at shared_input, a MoE model's experts and router (parameters, not layers) at ParamLoRA.
"""

import math
from contextlib import contextmanager

import torch
import torch.nn as nn
import torch.nn.functional as F

from minigrpo.moe import Experts, Router

# Every projection of Qwen2/3 attention, the SwiGLU MLP and Qwen3.5's Gated DeltaNet (leaf module names).
DEFAULT_TARGETS = (
    "q_proj", "k_proj", "v_proj", "o_proj",
    "gate_proj", "up_proj", "down_proj",
    "in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a", "out_proj",
)


class LoRALinear(nn.Module):
    """A frozen nn.Linear plus a trainable low-rank update in fp32.

    Precision: the frozen W stays in the model dtype (bf16 on GPU); A and B (and so the optimizer state) are fp32.
    The branch runs in fp32 and is added to the base output like PEFT does (base + fp32 delta, then cast back).
    Names: the layer keeps its attribute path and holds `base_layer`, `lora_A`, `lora_B`, so the state_dict keys are
    `<path>.base_layer.weight`, `<path>.lora_A.weight`, `<path>.lora_B.weight`, which PEFT's adapter file spells
    with a prefix only (run/lora_files.py)."""

    def __init__(self, base_layer: nn.Linear, r: int, alpha: float, dropout: float = 0.0):
        super().__init__()
        if r <= 0:
            raise ValueError(f"rank r must be positive, got r={r}")
        self.base_layer = base_layer
        self.r, self.alpha, self.scale = r, alpha, alpha / r
        device = base_layer.weight.device
        self.lora_A = nn.Linear(base_layer.in_features, r, bias=False, device=device, dtype=torch.float32)
        self.lora_B = nn.Linear(r, base_layer.out_features, bias=False, device=device, dtype=torch.float32)
        nn.init.kaiming_uniform_(self.lora_A.weight, a=math.sqrt(5))  # PEFT's init_lora_weights=True
        nn.init.zeros_(self.lora_B.weight)
        self.dropout = nn.Dropout(dropout) if dropout > 0 else nn.Identity()
        self.disabled = False  # set by adapters_disabled(): behave exactly as base_layer
        self.merged = False    # set by merge_lora(): the update lives inside base_layer.weight

    def forward(self, x):
        y = self.base_layer(x)
        if self.disabled or self.merged:
            return y
        return self.add_update(y, self.lora_A(self.dropout(x.float())), x.dtype)

    def add_update(self, y, h, dtype):
        """The base output y plus the update from h = dropout(x) Aᵀ (fp32): like PEFT, added in fp32 and cast back."""
        return (y + self.lora_B(h) * self.scale).to(dtype)

    def delta_weight(self):
        return (self.lora_B.weight @ self.lora_A.weight) * self.scale  # (out, in) fp32

    def extra_repr(self):
        return f"r={self.r}, alpha={self.alpha}"


class ParamLoRA(nn.Module):
    """LoRA on a stack of G weight matrices W (G, out, in) held as one parameter: the routed experts' gate_up_proj
    (E, 2I, H) and down_proj (E, H, I), each expert its own A_e (r, in) and B_e (out, r); the router's weight
    (E, H) is one matrix (G = 1). The owner (moe.py) calls `looped` or `grouped` where it multiplies by W, so the
    update rides the same token sort as the experts themselves. Why per-expert pairs, and what they cost:
    docs/moe.md. Precision as LoRALinear: A and B fp32, the looped branch in fp32 added to the base output;
    `grouped` runs in the model dtype (torch._grouped_mm is bf16). No dropout: PEFT's ParamWrapper, which reads
    these files, has none (x cannot be factored out of a per-token mask on a weight update)."""

    def __init__(self, weight: torch.Tensor, r: int, alpha: float):
        super().__init__()
        if r <= 0:
            raise ValueError(f"rank r must be positive, got r={r}")
        G, out, inp = weight.shape if weight.ndim == 3 else (1, *weight.shape)
        self.r, self.alpha, self.scale = r, alpha, alpha / r
        self.lora_A = nn.Parameter(torch.empty(G, r, inp, device=weight.device, dtype=torch.float32))
        self.lora_B = nn.Parameter(torch.zeros(G, out, r, device=weight.device, dtype=torch.float32))
        for a in self.lora_A:               # PEFT's init: kaiming_uniform_(a=√5) over (G r, in), fan-in = in
            nn.init.kaiming_uniform_(a, a=math.sqrt(5))
        self.disabled = False  # adapters_disabled()
        self.merged = False    # merge_lora(): the update lives inside the owner's weight

    @property
    def active(self):
        return not (self.disabled or self.merged)

    def looped(self, y, x, g=0):
        """y = x W_gᵀ plus matrix g's update, in fp32 and cast back (one expert of the loop, or the router)."""
        h = F.linear(x.float(), self.lora_A[g])                             # (n, r)
        return (y + F.linear(h, self.lora_B[g]) * self.scale).to(y.dtype)

    def grouped(self, y, xs, offs):
        """y = the grouped product of xs; rows [offs[e-1], offs[e]) add expert e's update: two more grouped matmuls
        on the same offsets (r a multiple of 8 in bf16: moe.use_grouped_mm)."""
        A, B = self.lora_A.to(xs.dtype), self.lora_B.to(xs.dtype)
        h = torch._grouped_mm(xs, A.transpose(1, 2), offs=offs)               # (N*k, r)
        return y + torch._grouped_mm(h, B.transpose(1, 2), offs=offs) * self.scale

    def delta_weight(self):
        """(G, out, in) fp32: (α/r) B_g A_g for every matrix; the router's (out, in) squeezed by the caller."""
        return torch.bmm(self.lora_B, self.lora_A) * self.scale

    def extra_repr(self):
        return f"{self.lora_A.shape[0]} x r={self.r}, alpha={self.alpha}"


def shared_input(x, *layers):
    """The outputs of linear layers that all read x, [layer(x) for layer in layers], with one matmul for the A of
    every active adapter among them: x Aᵀ for A = [A_1; A_2; ...] (Σr, in), split into each adapter's h. A step
    then launches one small matmul per shared input instead of one per adapter (decoding is launch-bound there).
    An adapter with dropout draws its own mask, so it runs alone, as do plain, disabled and merged layers. The
    parameters (and so the optimizer, the gradients and the adapter files) stay one A and one B per layer; training
    and decoding call this same function, so the sampler and the trainer compute the same thing."""
    grouped = [i for i, m in enumerate(layers) if isinstance(m, LoRALinear) and not (m.disabled or m.merged)
               and isinstance(m.dropout, nn.Identity)]
    if len(grouped) < 2:
        return [m(x) for m in layers]
    A = torch.cat([layers[i].lora_A.weight for i in grouped])               # (Σr, in) fp32
    hs = dict(zip(grouped, F.linear(x.float(), A).split([layers[i].r for i in grouped], dim=-1)))
    return [m.add_update(m.base_layer(x), hs[i], x.dtype) if i in hs else m(x) for i, m in enumerate(layers)]


def lora_layers(model):
    """(path, LoRALinear) for every injected layer, in module order."""
    return [(name, m) for name, m in model.named_modules() if isinstance(m, LoRALinear)]


# The parameters a ParamLoRA adapts, by inject_lora's switch: (owner class, the weight's name, the adapter's name).
# PEFT calls them target_parameters, named by the weight's path suffix (lora_config["target_parameters"]).
PARAM_TARGETS = {"experts": ((Experts, "gate_up_proj", "gate_up_lora"), (Experts, "down_proj", "down_lora")),
                 "router": ((Router, "weight", "lora"),)}
ALL_PARAM_TARGETS = tuple(t for ts in PARAM_TARGETS.values() for t in ts)


def param_adapters(model):
    """(path of the adapted weight, its owner module, the ParamLoRA) for every parameter adapter, in module order."""
    out = []
    for name, m in model.named_modules():
        for cls, weight, attr in ALL_PARAM_TARGETS:
            if isinstance(m, cls) and getattr(m, attr, None) is not None:
                out.append((f"{name}.{weight}", m, getattr(m, attr)))
    return out


def adapters(model):
    """Every LoRALinear and ParamLoRA of the model: what the KL switch and merging act on."""
    return [m for _, m in lora_layers(model)] + [a for _, _, a in param_adapters(model)]


def inject_lora(model, r, alpha, dropout=0.0, targets=DEFAULT_TARGETS, experts=False, router=False):
    """Wrap every nn.Linear whose leaf name is in `targets`; with `experts` / `router`, adapt a MoE model's routed
    experts / routers too (ParamLoRA); freeze everything else. Returns the LoRA parameters."""
    if lora_layers(model) or param_adapters(model):
        raise ValueError("the model already has LoRA layers; inject once (or use load_adapter)")
    targets = set(targets)
    for p in model.parameters():
        p.requires_grad_(False)
    found = [(name, m) for name, m in model.named_modules()
             if isinstance(m, nn.Linear) and name.rsplit(".", 1)[-1] in targets]
    if not found:
        raise ValueError(f"no nn.Linear named any of {sorted(targets)} in the model")
    params = []
    for name, linear in found:
        parent_name, _, leaf = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        layer = LoRALinear(linear, r, alpha, dropout)
        setattr(parent, leaf, layer)
        params += [layer.lora_A.weight, layer.lora_B.weight]
    model.lora_config = {"r": r, "lora_alpha": alpha, "lora_dropout": dropout,
                         "target_modules": sorted({n.rsplit(".", 1)[-1] for n, _ in found}),
                         "target_parameters": inject_param_lora(model, r, alpha, dropout, experts, router)}
    return params + [p for _, _, a in param_adapters(model) for p in (a.lora_A, a.lora_B)]


def inject_param_lora(model, r, alpha, dropout, experts, router):
    """ParamLoRA on every weight the switches name; returns PEFT's target_parameters for them."""
    switches = [k for k, on in (("experts", experts), ("router", router)) if on]
    if switches and dropout:
        raise ValueError(f"LoRA on the {' and '.join(switches)} takes no dropout (PEFT's ParamWrapper, which reads "
                         f"the adapter files, has none); set dropout to 0")
    names = []
    for key in switches:
        owners = [(n, m) for n, m in model.named_modules() if isinstance(m, PARAM_TARGETS[key][0][0])]
        if not owners:
            raise ValueError(f"LoRA on the {key}: the model has no routed experts (a dense model)")
        for cls, weight, attr in PARAM_TARGETS[key]:
            for _, m in owners:
                setattr(m, attr, ParamLoRA(getattr(m, weight), r, alpha))
            names.append(".".join([*owners[0][0].split(".")[-2:], weight]))   # mlp.experts.gate_up_proj, mlp.gate.weight
    return names


def lora_parameters(model):
    return ([p for _, m in lora_layers(model) for p in (m.lora_A.weight, m.lora_B.weight)]
            + [p for _, _, a in param_adapters(model) for p in (a.lora_A, a.lora_B)])


@contextmanager
def adapters_disabled(model):
    """Inside the block the model is exactly the frozen base (the KL reference): a flag on every LoRA layer, no second
    copy of the weights, bit-exact base outputs."""
    layers = adapters(model)
    if any(m.merged for m in layers):
        raise RuntimeError("LoRA is merged into the weights, so the base is not there to switch to; call "
                           "unmerge_lora(model) first")
    previous = [m.disabled for m in layers]
    for m in layers:
        m.disabled = True
    try:
        yield model
    finally:
        for m, was in zip(layers, previous):
            m.disabled = was


def param_delta(weight, adapter):
    """A ParamLoRA's update in its weight's shape and dtype."""
    return adapter.delta_weight().reshape(weight.shape).to(weight.dtype)


@torch.no_grad()
def merge_lora(model):
    """W += (α/r)·B A in every LoRA layer, in place; the LoRA branch is then skipped (faster decoding, same function).
    In bf16, merge then unmerge is not bit-exact (rounding), as in PEFT."""
    for _, m in lora_layers(model):
        if not m.merged:
            m.base_layer.weight.add_(m.delta_weight().to(m.base_layer.weight.dtype))
            m.merged = True
    for path, owner, a in param_adapters(model):
        if not a.merged:
            w = getattr(owner, path.rsplit(".", 1)[-1])
            w.add_(param_delta(w, a))
            a.merged = True


@torch.no_grad()
def unmerge_lora(model):
    for _, m in lora_layers(model):
        if m.merged:
            m.base_layer.weight.sub_(m.delta_weight().to(m.base_layer.weight.dtype))
            m.merged = False
    for path, owner, a in param_adapters(model):
        if a.merged:
            w = getattr(owner, path.rsplit(".", 1)[-1])
            w.sub_(param_delta(w, a))
            a.merged = False


def strip_lora(model):
    """Remove the LoRA wrappers, keeping each base layer as it is (unmerged adapters leave it untouched)."""
    for path, layer in lora_layers(model):
        parent, _, leaf = path.rpartition(".")
        setattr(model.get_submodule(parent) if parent else model, leaf, layer.base_layer)
    for _, owner, _ in param_adapters(model):
        for cls, _, attr in ALL_PARAM_TARGETS:
            if isinstance(owner, cls):
                setattr(owner, attr, None)
    model.__dict__.pop("lora_config", None)
    return model


def fold_lora(model):
    """Merge the adapters into the weights, then drop them: a plain model again, with the adapters' function (the
    mdp pipeline's SFT weights, which its DPO and GRPO adapters then sit on)."""
    merge_lora(model)
    return strip_lora(model)
