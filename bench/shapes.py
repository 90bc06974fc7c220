"""Model shapes the benchmarks build with random weights: transformers config dicts (flat, text-only), by name.

    qwen3-0.6b    Qwen3-0.6B (minigrpo/data/configs/Qwen3-0.6B.json)
    qwen3.5-4b    Qwen3.5-4B's text model (minigrpo/data/configs/Qwen3.5-4B.json, text_config), as
                  transformers' Qwen3_5ForCausalLM builds it
    tiny, tiny-qwen3.5    minigrpo's tiny CPU models (QwenConfig.tiny)

`layers` overrides the depth (Qwen3.5 keeps its 3 Gated DeltaNet : 1 attention pattern).
"""

import json
import os

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIGS = os.path.join(ROOT, "minigrpo", "data", "configs")
# tokenizer size (rows past it are padding, never sampled) and the pad id a collate writes
TOKENS = {"qwen3-0.6b": (151669, 151643), "qwen3.5-4b": (248077, 248044), "tiny": (261, 256),
          "tiny-qwen3.5": (261, 256)}
NAMES = list(TOKENS)


def hf_config(name, layers=None):
    """A flat config dict with model_type, for transformers.AutoConfig.for_model and QwenConfig.from_dict."""
    if name in ("tiny", "tiny-qwen3.5"):
        from minigrpo.pretrained import QwenConfig
        raw = dict(QwenConfig.tiny(name).raw)
    elif name == "qwen3-0.6b":
        with open(os.path.join(CONFIGS, "Qwen3-0.6B.json")) as f:
            raw = json.load(f)
    elif name == "qwen3.5-4b":
        with open(os.path.join(CONFIGS, "Qwen3.5-4B.json")) as f:
            top = json.load(f)
        raw = dict(top["text_config"], tie_word_embeddings=top["tie_word_embeddings"],
                   architectures=["Qwen3_5ForCausalLM"])
    else:
        raise ValueError(f"unknown shape {name!r}: use one of {', '.join(NAMES)}")
    for k in ("torch_dtype", "transformers_version", "use_cache"):
        raw.pop(k, None)
    if layers:
        raw["num_hidden_layers"] = layers
        if "layer_types" in raw:
            raw["layer_types"] = ["full_attention" if (i + 1) % 4 == 0 else "linear_attention" for i in range(layers)]
    return raw


def is_hybrid(name):
    return "3.5" in name


def build_hf(name, dtype, device="cpu", layers=None, seed=0, **kw):
    """transformers' model of that shape, seeded random weights, built on `device` (fast on a GPU)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM
    d = hf_config(name, layers)
    cfg = AutoConfig.for_model(d.pop("model_type"), **d)
    torch.manual_seed(seed)
    with torch.device(device):
        return AutoModelForCausalLM.from_config(cfg, dtype=dtype, **kw).eval()
