"""LoRA for the Qwen decoder: injection, a base-model switch, merging, and PEFT-layout files.

LoRA (Hu et al. 2021) freezes a linear layer W (out × in) and learns a low-rank update:

    y = x Wᵀ + (α / r) · dropout(x) Aᵀ Bᵀ        A: (r, in), B: (out, r)

A starts as PEFT initialises it (kaiming_uniform_ with a=√5, like nn.Linear) and B at zero, so an injected model
computes exactly the base model until the first optimizer step.

Choices, written where the code is:
- Precision: the frozen W stays in the model dtype (bf16 on GPU); A and B (and so the optimizer state) are fp32.
  The LoRA branch runs in fp32 and is added to the base output like PEFT does (base + fp32 delta, then cast back).
- Names: a wrapped layer keeps its attribute path and holds `base_layer`, `lora_A`, `lora_B`, so the state_dict keys
  are `<path>.base_layer.weight`, `<path>.lora_A.weight`, `<path>.lora_B.weight`. PEFT's adapter file uses
  `base_model.model.<path>.lora_A.weight`: saving is a prefix, nothing else.
- The reference model for the KL term is `with adapters_disabled(model):` — a flag on every LoRA layer, no second
  copy of the weights, bit-exact base outputs.
- Merging adds (α/r)·B A into W in place. In bf16, merge then unmerge is not bit-exact (rounding), as in PEFT.
"""

import json
import math
import os
import shutil
from contextlib import contextmanager

import torch
import torch.nn as nn
from safetensors.torch import load_file, save_file

from minigrpo.common import atomic_write

# Every projection of Qwen2/3 attention, the SwiGLU MLP and Qwen3.5's Gated DeltaNet (leaf module names).
DEFAULT_TARGETS = (
    "q_proj", "k_proj", "v_proj", "o_proj",
    "gate_proj", "up_proj", "down_proj",
    "in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a", "out_proj",
)
PEFT_PREFIX = "base_model.model."
ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
TOKENIZER_FILES = (
    "tokenizer.json", "tokenizer_config.json", "vocab.json", "merges.txt", "special_tokens_map.json",
    "added_tokens.json", "chat_template.jinja", "chat_template.json", "generation_config.json",
)


class LoRALinear(nn.Module):
    """A frozen nn.Linear plus a trainable low-rank update in fp32."""

    def __init__(self, base_layer: nn.Linear, r: int, alpha: float, dropout: float = 0.0):
        super().__init__()
        if r <= 0:
            raise ValueError(f"lora.py: rank r must be positive, got r={r}")
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
        delta = self.lora_B(self.lora_A(self.dropout(x.float()))) * self.scale  # fp32 branch
        return (y + delta).to(x.dtype)  # like PEFT: add in fp32, cast back to the model dtype

    def delta_weight(self):
        return (self.lora_B.weight @ self.lora_A.weight) * self.scale  # (out, in) fp32

    def extra_repr(self):
        return f"r={self.r}, alpha={self.alpha}"


def lora_layers(model):
    """(path, LoRALinear) for every injected layer, in module order."""
    return [(name, m) for name, m in model.named_modules() if isinstance(m, LoRALinear)]


def inject_lora(model, r, alpha, dropout=0.0, targets=DEFAULT_TARGETS):
    """Wrap every nn.Linear whose leaf name is in `targets`; freeze everything else. Returns the LoRA parameters."""
    if lora_layers(model):
        raise ValueError("lora.py: inject_lora: the model already has LoRA layers; inject once (or use load_adapter)")
    targets = set(targets)
    for p in model.parameters():
        p.requires_grad_(False)
    found = [(name, m) for name, m in model.named_modules()
             if isinstance(m, nn.Linear) and name.rsplit(".", 1)[-1] in targets]
    if not found:
        raise ValueError(f"lora.py: inject_lora: no nn.Linear named any of {sorted(targets)} in the model")
    params = []
    for name, linear in found:
        parent_name, _, leaf = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        layer = LoRALinear(linear, r, alpha, dropout)
        setattr(parent, leaf, layer)
        params += [layer.lora_A.weight, layer.lora_B.weight]
    model.lora_config = {"r": r, "lora_alpha": alpha, "lora_dropout": dropout,
                         "target_modules": sorted({n.rsplit(".", 1)[-1] for n, _ in found})}
    return params


def lora_parameters(model):
    return [p for _, m in lora_layers(model) for p in (m.lora_A.weight, m.lora_B.weight)]


@contextmanager
def adapters_disabled(model):
    """Inside the block the model is exactly the frozen base (the KL reference); no weights are copied."""
    layers = [m for _, m in lora_layers(model)]
    if any(m.merged for m in layers):
        raise RuntimeError("lora.py: adapters_disabled: LoRA is merged into the weights; call unmerge_lora(model) "
                           "first")
    previous = [m.disabled for m in layers]
    for m in layers:
        m.disabled = True
    try:
        yield model
    finally:
        for m, was in zip(layers, previous):
            m.disabled = was


@torch.no_grad()
def merge_lora(model):
    """W += (α/r)·B A in every LoRA layer; the LoRA branch is then skipped (faster decoding, same function)."""
    for _, m in lora_layers(model):
        if not m.merged:
            m.base_layer.weight.add_(m.delta_weight().to(m.base_layer.weight.dtype))
            m.merged = True


@torch.no_grad()
def unmerge_lora(model):
    for _, m in lora_layers(model):
        if m.merged:
            m.base_layer.weight.sub_(m.delta_weight().to(m.base_layer.weight.dtype))
            m.merged = False


def strip_lora(model):
    """Remove the LoRA wrappers, keeping each base layer as it is (unmerged adapters leave it untouched)."""
    for path, layer in lora_layers(model):
        parent, _, leaf = path.rpartition(".")
        setattr(model.get_submodule(parent) if parent else model, leaf, layer.base_layer)
    model.__dict__.pop("lora_config", None)
    return model


def fold_lora(model):
    """Merge the adapters into the weights, then drop them: a plain model again, with the adapters' function (the
    mdp pipeline's SFT weights, which its DPO and GRPO adapters then sit on)."""
    merge_lora(model)
    return strip_lora(model)


# ---------------------------------------------------------------------------------------------- PEFT-layout files

def _base_model_name(model):
    raw = getattr(getattr(model, "config", None), "raw", None) or {}
    return getattr(model, "name_or_path", None) or raw.get("_name_or_path")


def save_adapter(model, out_dir, base_model_name_or_path=None):
    """adapter_config.json + adapter_model.safetensors, loadable by peft.PeftModel.from_pretrained."""
    layers = lora_layers(model)
    if not layers:
        raise ValueError("lora.py: save_adapter: the model has no LoRA layers; call inject_lora first")
    if any(m.merged for _, m in layers):
        raise RuntimeError("lora.py: save_adapter: LoRA is merged; call unmerge_lora(model) before saving")
    os.makedirs(out_dir, exist_ok=True)
    tensors = {}
    for path, m in layers:
        tensors[f"{PEFT_PREFIX}{path}.lora_A.weight"] = m.lora_A.weight.detach().contiguous().cpu()
        tensors[f"{PEFT_PREFIX}{path}.lora_B.weight"] = m.lora_B.weight.detach().contiguous().cpu()
    cfg = model.lora_config
    config = {  # the fields PEFT's LoraConfig writes that matter for a plain LoRA; PEFT defaults the rest
        "peft_type": "LORA", "task_type": "CAUSAL_LM",
        "base_model_name_or_path": base_model_name_or_path or _base_model_name(model),
        "r": cfg["r"], "lora_alpha": cfg["lora_alpha"], "lora_dropout": cfg["lora_dropout"],
        "target_modules": cfg["target_modules"], "bias": "none", "fan_in_fan_out": False,
        "inference_mode": True, "init_lora_weights": True, "use_rslora": False, "use_dora": False,
        "modules_to_save": None, "layers_to_transform": None, "layers_pattern": None,
        "rank_pattern": {}, "alpha_pattern": {}, "revision": None,
    }
    atomic_write(os.path.join(out_dir, ADAPTER_WEIGHTS), lambda p: save_file(tensors, p, metadata={"format": "pt"}))
    atomic_write(os.path.join(out_dir, ADAPTER_CONFIG), json.dumps(config, indent=2) + "\n", fsync=False)


def _read_adapter_config(path):
    if not os.path.exists(path):
        raise FileNotFoundError(f"lora.py: {path} not found; an adapter folder needs {ADAPTER_CONFIG} and "
                                f"{ADAPTER_WEIGHTS}")
    with open(path) as f:
        c = json.load(f)
    unsupported = {"peft_type": ("LORA",), "bias": ("none",), "fan_in_fan_out": (False,), "use_dora": (False, None),
                   "use_rslora": (False, None), "rank_pattern": ({}, None), "alpha_pattern": ({}, None),
                   "modules_to_save": (None, []), "layers_to_transform": (None,)}
    for key, allowed in unsupported.items():
        if c.get(key, allowed[0]) not in allowed:
            raise ValueError(f"lora.py: {path}: {key}={c[key]!r} is not supported (only plain LoRA: "
                             f"{key}={allowed[0]!r})")
    targets = c.get("target_modules")
    if targets == "all-linear":  # PEFT: every linear but the output head = our defaults
        targets = list(DEFAULT_TARGETS)
    if not isinstance(targets, list):
        raise ValueError(f"lora.py: {path}: target_modules must be a list of module names, got {targets!r}")
    c["target_modules"] = targets
    return c


def _our_path(key, path):
    """PEFT key -> our module path. Adapters trained on Qwen3_5ForConditionalGeneration say model.language_model."""
    if not key.startswith(PEFT_PREFIX):
        raise ValueError(f"lora.py: {path}: key {key!r} does not start with {PEFT_PREFIX!r}; not a PEFT LoRA adapter")
    key = key[len(PEFT_PREFIX):].replace(".default.", ".")
    if key.startswith("model.language_model."):
        key = "model." + key[len("model.language_model."):]
    return key


@torch.no_grad()
def load_adapter(model, adapter_dir, dropout=None):
    """Load a PEFT-layout LoRA adapter, injecting LoRA first if the model has none. Returns the LoRA parameters."""
    cpath = os.path.join(adapter_dir, ADAPTER_CONFIG)
    c = _read_adapter_config(cpath)
    r, alpha = c["r"], c["lora_alpha"]
    if not lora_layers(model):
        inject_lora(model, r, alpha, c.get("lora_dropout", 0.0) if dropout is None else dropout, c["target_modules"])
    elif (model.lora_config["r"], model.lora_config["lora_alpha"]) != (r, alpha):
        raise ValueError(f"lora.py: {cpath}: r={r}, lora_alpha={alpha} but the model's LoRA has "
                         f"r={model.lora_config['r']}, lora_alpha={model.lora_config['lora_alpha']}")
    wpath = os.path.join(adapter_dir, ADAPTER_WEIGHTS)
    if not os.path.exists(wpath):
        raise FileNotFoundError(f"lora.py: {wpath} not found")
    loaded = {_our_path(k, wpath): v for k, v in load_file(wpath).items()}
    layers = dict(lora_layers(model))
    expected = {f"{p}.{ab}.weight": getattr(m, ab).weight for p, m in layers.items() for ab in ("lora_A", "lora_B")}
    missing, unexpected = sorted(set(expected) - set(loaded)), sorted(set(loaded) - set(expected))
    if missing or unexpected:
        raise ValueError(f"lora.py: {wpath}: adapter and model LoRA layers differ: missing {missing[:3]} "
                         f"({len(missing)}), unexpected {unexpected[:3]} ({len(unexpected)}); check the base model")
    for key, param in expected.items():
        if loaded[key].shape != param.shape:
            raise ValueError(f"lora.py: {wpath}: {key} has shape {tuple(loaded[key].shape)}, the model expects "
                             f"{tuple(param.shape)}; the adapter was trained on another model size")
        param.copy_(loaded[key])
    return lora_parameters(model)


# --------------------------------------------------------------------------------------------------- merged export

@torch.no_grad()
def merged_state_dict(model):
    """HF-named tensors with LoRA folded in and no LoRA keys (on CPU; the model itself is not modified)."""
    out = {}
    for name, p in model.named_parameters():  # named_parameters skips a tied lm_head (HF does not save it either)
        if ".lora_A." in name or ".lora_B." in name:
            continue
        if name.endswith(".base_layer.weight"):
            layer = model.get_submodule(name[: -len(".base_layer.weight")])
            w = p if layer.merged else p + layer.delta_weight().to(p.dtype)
            name = name.replace(".base_layer.", ".")
        elif ".base_layer." in name:  # e.g. a Qwen2 q_proj bias: LoRA leaves it as is
            w = p
            name = name.replace(".base_layer.", ".")
        else:
            w = p
        out[name] = w.detach().to("cpu").contiguous()
    return out


def export_merged(model, tokenizer_dir, out_dir):
    """A folder transformers.AutoModelForCausalLM.from_pretrained loads: config.json, model.safetensors, tokenizer."""
    raw = getattr(getattr(model, "config", None), "raw", None)
    if not raw:
        raise ValueError("lora.py: export_merged: model.config.raw (the original config.json) is empty; "
                         "load the model with pretrained.load_pretrained from a checkpoint folder")
    os.makedirs(out_dir, exist_ok=True)
    tensors = merged_state_dict(model)
    if "text_config" in raw:  # a Qwen3.5 multimodal config.json: keep its key layout (model.language_model.*)
        tensors = {("model.language_model." + k[len("model."):] if k.startswith("model.") else k): v
                   for k, v in tensors.items()}
    atomic_write(os.path.join(out_dir, "model.safetensors"), lambda p: save_file(tensors, p, metadata={"format": "pt"}))
    atomic_write(os.path.join(out_dir, "config.json"), json.dumps(raw, indent=2) + "\n", fsync=False)
    if tokenizer_dir is not None:
        copied = [f for f in TOKENIZER_FILES if os.path.exists(os.path.join(tokenizer_dir, f))]
        if not copied:
            raise FileNotFoundError(f"lora.py: export_merged: no tokenizer files in {tokenizer_dir}")
        for f in copied:
            shutil.copyfile(os.path.join(tokenizer_dir, f), os.path.join(out_dir, f))
