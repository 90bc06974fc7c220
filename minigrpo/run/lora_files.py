"""LoRA's files: the PEFT adapter folder (adapter_config.json + adapter_model.safetensors) and a merged model
folder that transformers loads. lora.py is the LoRA itself; this module is where safetensors comes in.

PEFT's adapter file names a layer `base_model.model.<path>.lora_A.weight`, where our state_dict says
`<path>.lora_A.weight`: saving is a prefix, nothing else. Loading also reads the spellings other PEFT writers use
(`.default.` for the adapter name, `model.language_model.` for a Qwen3.5 multimodal base).

A MoE model's expert and router adapters (lora.ParamLoRA) are PEFT's `target_parameters` (its ParamWrapper on
transformers' stacked expert tensors and router weight): per-expert pairs flattened as PEFT holds them (A (E r, in),
B (out, r E) with expert e's column j at j E + e), named after the module that owns the weight. PEFT wraps the two
expert tensors of one module one inside the other, gate_up_proj innermost (the module's parameter order, whatever
the order in the config), so gate_up_proj's pair is `experts.base_layer.lora_*` and down_proj's `experts.lora_*`.
"""

import json
import os
import shutil

import torch
from safetensors.torch import load_file, save_file

from minigrpo.files import atomic_write
from minigrpo.lora import (DEFAULT_TARGETS, PARAM_TARGETS, inject_lora, lora_layers, lora_parameters, param_adapters,
                           param_delta)

PEFT_PREFIX = "base_model.model."
ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
# what export_merged copies from a tokenizer folder, when it has them
TOKENIZER_FILES = (
    "tokenizer.json", "tokenizer_config.json", "vocab.json", "merges.txt", "special_tokens_map.json",
    "added_tokens.json", "chat_template.jinja", "chat_template.json", "generation_config.json",
)


# ---------------------------------------------------------------------------------------------- PEFT adapter files

# a ParamLoRA's weight (its path's last two parts) -> the module path PEFT names its pair after
PEFT_PARAM_MODULE = {"experts.gate_up_proj": "experts.base_layer", "experts.down_proj": "experts",
                     "gate.weight": "gate"}
# PEFT's target_parameters -> inject_lora's switch
PARAM_SWITCH = {"mlp.experts.gate_up_proj": "experts", "mlp.experts.down_proj": "experts", "mlp.gate.weight": "router"}


def peft_param_keys(path):
    """(A key, B key) in PEFT's file for the ParamLoRA on the weight at `path`."""
    owner, _, tail = path.rpartition(".")
    parent, _, leaf = owner.rpartition(".")
    module = f"{parent}.{PEFT_PARAM_MODULE[f'{leaf}.{tail}']}"
    return f"{PEFT_PREFIX}{module}.lora_A.weight", f"{PEFT_PREFIX}{module}.lora_B.weight"


def to_peft(a):
    """A (G, r, in), B (G, out, r) -> PEFT's (G r, in) and (out, r G)."""
    G, r, _ = a.lora_A.shape
    return a.lora_A.detach().reshape(G * r, -1), a.lora_B.detach().permute(1, 2, 0).reshape(-1, r * G)


def from_peft(A, B, a):
    """PEFT's flattened pair -> the shapes of ParamLoRA `a` (its inverse of to_peft)."""
    G, r, _ = a.lora_A.shape
    return A.reshape(G, r, -1), B.reshape(B.shape[0], r, G).permute(2, 0, 1)

def _base_model_name(model):
    raw = getattr(getattr(model, "config", None), "raw", None) or {}
    return getattr(model, "name_or_path", None) or raw.get("_name_or_path")


def save_adapter(model, out_dir, base_model_name_or_path=None):
    """adapter_config.json + adapter_model.safetensors, loadable by peft.PeftModel.from_pretrained."""
    layers = lora_layers(model)
    if not layers:
        raise ValueError("the model has no LoRA layers to save; call inject_lora first")
    if any(m.merged for _, m in layers):
        raise RuntimeError("LoRA is merged into the weights; call unmerge_lora(model) before saving the adapter")
    os.makedirs(out_dir, exist_ok=True)
    tensors = {}
    for path, m in layers:
        tensors[f"{PEFT_PREFIX}{path}.lora_A.weight"] = m.lora_A.weight.detach().contiguous().cpu()
        tensors[f"{PEFT_PREFIX}{path}.lora_B.weight"] = m.lora_B.weight.detach().contiguous().cpu()
    for path, _, a in param_adapters(model):
        for key, t in zip(peft_param_keys(path), to_peft(a)):
            tensors[key] = t.contiguous().cpu()
    cfg = model.lora_config
    config = {  # the fields PEFT's LoraConfig writes that matter for a plain LoRA; PEFT defaults the rest
        "peft_type": "LORA", "task_type": "CAUSAL_LM",
        "base_model_name_or_path": base_model_name_or_path or _base_model_name(model),
        "r": cfg["r"], "lora_alpha": cfg["lora_alpha"], "lora_dropout": cfg["lora_dropout"],
        "target_modules": cfg["target_modules"], "target_parameters": cfg.get("target_parameters") or None,
        "bias": "none", "fan_in_fan_out": False,
        "inference_mode": True, "init_lora_weights": True, "use_rslora": False, "use_dora": False,
        "modules_to_save": None, "layers_to_transform": None, "layers_pattern": None,
        "rank_pattern": {}, "alpha_pattern": {}, "revision": None,
    }
    atomic_write(os.path.join(out_dir, ADAPTER_WEIGHTS), lambda p: save_file(tensors, p, metadata={"format": "pt"}))
    atomic_write(os.path.join(out_dir, ADAPTER_CONFIG), json.dumps(config, indent=2) + "\n", fsync=False)


def _read_adapter_config(path):
    if not os.path.exists(path):
        raise FileNotFoundError(f"{path} not found; an adapter folder needs {ADAPTER_CONFIG} and "
                                f"{ADAPTER_WEIGHTS}")
    with open(path) as f:
        c = json.load(f)
    unsupported = {"peft_type": ("LORA",), "bias": ("none",), "fan_in_fan_out": (False,), "use_dora": (False, None),
                   "use_rslora": (False, None), "rank_pattern": ({}, None), "alpha_pattern": ({}, None),
                   "modules_to_save": (None, []), "layers_to_transform": (None,)}
    for key, allowed in unsupported.items():
        if c.get(key, allowed[0]) not in allowed:
            raise ValueError(f"{path}: {key}={c[key]!r} is not supported (only plain LoRA: "
                             f"{key}={allowed[0]!r})")
    targets = c.get("target_modules")
    if targets == "all-linear":  # PEFT: every linear but the output head = our defaults
        targets = list(DEFAULT_TARGETS)
    if not isinstance(targets, list):
        raise ValueError(f"{path}: target_modules must be a list of module names, got {targets!r}")
    c["target_modules"] = targets
    params = c.get("target_parameters") or []
    unknown = [t for t in params if t not in PARAM_SWITCH]
    if unknown:
        raise ValueError(f"{path}: target_parameters {unknown} are not supported (only {sorted(PARAM_SWITCH)})")
    c["switches"] = {key: any(PARAM_SWITCH[t] == key for t in params) for key in PARAM_TARGETS}
    return c


def _our_path(key, path):
    """PEFT key -> our module path. Adapters trained on Qwen3_5ForConditionalGeneration say model.language_model."""
    if not key.startswith(PEFT_PREFIX):
        raise ValueError(f"{path}: key {key!r} does not start with {PEFT_PREFIX!r}; not a PEFT LoRA adapter")
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
        inject_lora(model, r, alpha, c.get("lora_dropout", 0.0) if dropout is None else dropout, c["target_modules"],
                    **c["switches"])
    elif (model.lora_config["r"], model.lora_config["lora_alpha"]) != (r, alpha):
        raise ValueError(f"{cpath}: r={r}, lora_alpha={alpha} but the model's LoRA has "
                         f"r={model.lora_config['r']}, lora_alpha={model.lora_config['lora_alpha']}")
    wpath = os.path.join(adapter_dir, ADAPTER_WEIGHTS)
    if not os.path.exists(wpath):
        raise FileNotFoundError(f"{wpath} not found")
    loaded = {_our_path(k, wpath): v for k, v in load_file(wpath).items()}
    layers = dict(lora_layers(model))
    expected = {f"{p}.{ab}.weight": getattr(m, ab).weight for p, m in layers.items() for ab in ("lora_A", "lora_B")}
    pairs = {}   # our spelling of a ParamLoRA's PEFT keys -> the ParamLoRA
    for path, _, adapter in param_adapters(model):
        ka, kb = (_our_path(k, wpath) for k in peft_param_keys(path))
        pairs[ka, kb] = adapter
        expected[ka], expected[kb] = to_peft(adapter)
    missing, unexpected = sorted(set(expected) - set(loaded)), sorted(set(loaded) - set(expected))
    if missing or unexpected:
        raise ValueError(f"{wpath}: adapter and model LoRA layers differ: missing {missing[:3]} "
                         f"({len(missing)}), unexpected {unexpected[:3]} ({len(unexpected)}); check the base model")
    for key, param in expected.items():
        if loaded[key].shape != param.shape:
            raise ValueError(f"{wpath}: {key} has shape {tuple(loaded[key].shape)}, the model expects "
                             f"{tuple(param.shape)}; the adapter was trained on another model size")
    for key, m in layers.items():
        m.lora_A.weight.copy_(loaded[f"{key}.lora_A.weight"])
        m.lora_B.weight.copy_(loaded[f"{key}.lora_B.weight"])
    for (ka, kb), adapter in pairs.items():
        A, B = from_peft(loaded[ka], loaded[kb], adapter)
        adapter.lora_A.copy_(A)
        adapter.lora_B.copy_(B)
    return lora_parameters(model)


# --------------------------------------------------------------------------------------------------- merged export

@torch.no_grad()
def merged_state_dict(model):
    """HF-named tensors with LoRA folded in and no LoRA keys (on CPU; the model itself is not modified)."""
    out = {}
    adapted = {path: a for path, _, a in param_adapters(model)}   # expert and router weights with a ParamLoRA
    for name, p in model.named_parameters():  # named_parameters skips a tied lm_head (HF does not save it either)
        if ".lora_A" in name or ".lora_B" in name:
            continue
        if name in adapted:
            w = p if adapted[name].merged else p + param_delta(p, adapted[name])
        elif name.endswith(".base_layer.weight"):
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
        raise ValueError("model.config.raw (the original config.json) is empty; "
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
            raise FileNotFoundError(f"no tokenizer files in {tokenizer_dir}")
        for f in copied:
            shutil.copyfile(os.path.join(tokenizer_dir, f), os.path.join(out_dir, f))
