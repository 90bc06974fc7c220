"""LoRA's files: the PEFT adapter folder (adapter_config.json + adapter_model.safetensors) and a merged model
folder that transformers loads. lora.py is the LoRA itself; this module is where safetensors comes in.

PEFT's adapter file names a layer `base_model.model.<path>.lora_A.weight`, where our state_dict says
`<path>.lora_A.weight`: saving is a prefix, nothing else. Loading also reads the spellings other PEFT writers use
(`.default.` for the adapter name, `model.language_model.` for a Qwen3.5 multimodal base).
"""

import json
import os
import shutil

import torch
from safetensors.torch import load_file, save_file

from minigrpo.files import atomic_write
from minigrpo.lora import DEFAULT_TARGETS, inject_lora, lora_layers, lora_parameters

PEFT_PREFIX = "base_model.model."
ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
# what export_merged copies from a tokenizer folder, when it has them
TOKENIZER_FILES = (
    "tokenizer.json", "tokenizer_config.json", "vocab.json", "merges.txt", "special_tokens_map.json",
    "added_tokens.json", "chat_template.jinja", "chat_template.json", "generation_config.json",
)


# ---------------------------------------------------------------------------------------------- PEFT adapter files

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
        inject_lora(model, r, alpha, c.get("lora_dropout", 0.0) if dropout is None else dropout, c["target_modules"])
    elif (model.lora_config["r"], model.lora_config["lora_alpha"]) != (r, alpha):
        raise ValueError(f"{cpath}: r={r}, lora_alpha={alpha} but the model's LoRA has "
                         f"r={model.lora_config['r']}, lora_alpha={model.lora_config['lora_alpha']}")
    wpath = os.path.join(adapter_dir, ADAPTER_WEIGHTS)
    if not os.path.exists(wpath):
        raise FileNotFoundError(f"{wpath} not found")
    loaded = {_our_path(k, wpath): v for k, v in load_file(wpath).items()}
    layers = dict(lora_layers(model))
    expected = {f"{p}.{ab}.weight": getattr(m, ab).weight for p, m in layers.items() for ab in ("lora_A", "lora_B")}
    missing, unexpected = sorted(set(expected) - set(loaded)), sorted(set(loaded) - set(expected))
    if missing or unexpected:
        raise ValueError(f"{wpath}: adapter and model LoRA layers differ: missing {missing[:3]} "
                         f"({len(missing)}), unexpected {unexpected[:3]} ({len(unexpected)}); check the base model")
    for key, param in expected.items():
        if loaded[key].shape != param.shape:
            raise ValueError(f"{wpath}: {key} has shape {tuple(loaded[key].shape)}, the model expects "
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
