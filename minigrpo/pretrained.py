"""Loading a Qwen checkpoint into minigrpo/model.py's decoder: its config.json read into a QwenConfig, tiny
random models, hub snapshots (a folder or a hub id: local_folder, which the tokenizer uses too), (sharded)
safetensors. The folder layout is the Hugging Face one (config.json,
model.safetensors or model.safetensors.index.json + shards); every tensor is cast to the one model dtype, as HF
does."""
import json
import math
import os
from dataclasses import dataclass, field

import torch
import torch.nn as nn

from minigrpo.files import read_json
from minigrpo.model import Qwen
from minigrpo.moe import expert_piece

FAMILIES = {"qwen2": "qwen2", "qwen3": "qwen3", "qwen3_5": "qwen3_5", "qwen3_5_text": "qwen3_5",
            "qwen3_moe": "qwen3", "qwen3_5_moe": "qwen3_5", "qwen3_5_moe_text": "qwen3_5"}
MULTIMODAL = ("qwen3_5", "qwen3_5_moe")    # the language model's fields nested under text_config
TINY_MODELS = ("tiny", "tiny-qwen3.5", "tiny-moe")


class CheckpointError(ValueError):
    """A checkpoint folder that cannot be loaded; the message names the file and key."""


@dataclass
class QwenConfig:
    """What model.Qwen builds from: the numbers of a Hugging Face config.json, one field per key it reads."""
    family: str = "qwen3"  # "qwen2" | "qwen3" | "qwen3_5"
    vocab_size: int = 272
    hidden_size: int = 64
    intermediate_size: int = 128
    num_hidden_layers: int = 4
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    head_dim: int = 16
    rms_norm_eps: float = 1e-6
    rope_theta: float = 1e6
    partial_rotary_factor: float = 1.0
    tie_word_embeddings: bool = True
    attention_bias: bool = False
    layer_types: list = field(default_factory=list)  # "full_attention" | "linear_attention" per layer
    linear_conv_kernel_dim: int = 4
    linear_num_key_heads: int = 0
    linear_num_value_heads: int = 0
    linear_key_head_dim: int = 0
    linear_value_head_dim: int = 0
    # mixture of experts (moe.py); num_experts 0: a dense model
    num_experts: int = 0
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0
    shared_expert_intermediate_size: int = 0  # Qwen3.5-MoE's gated shared expert; 0: none (Qwen3-MoE)
    norm_topk_prob: bool = True
    decoder_sparse_step: int = 1
    mlp_only_layers: list = field(default_factory=list)
    raw: dict = field(default_factory=dict, repr=False)  # the original config.json, for export

    @classmethod
    def from_json(cls, path):
        d = read_json(path, "not found; pass a folder holding a Hugging Face checkpoint or a hub id", CheckpointError)
        return cls.from_dict(d, source=path)

    @classmethod
    def from_dict(cls, d, source="config.json"):
        model_type = d.get("model_type")
        if model_type not in FAMILIES:
            raise CheckpointError(f"{source}: model_type {model_type!r} is not supported "
                                  f"(expected one of {', '.join(FAMILIES)})")
        family = FAMILIES[model_type]
        t = d
        if model_type in MULTIMODAL:  # multimodal layout: the language model's fields are nested
            if "text_config" not in d:
                raise CheckpointError(f"{source}: model_type {model_type!r} needs a 'text_config' entry")
            t = dict(d["text_config"])
            if "tie_word_embeddings" in d:  # HF ties the LM head by the top-level flag of the composite config
                t["tie_word_embeddings"] = d["tie_word_embeddings"]
        if t.get("use_sliding_window"):
            raise CheckpointError(f"{source}: use_sliding_window=true is not supported (no Qwen checkpoint here uses "
                                  "it)")

        def need(key):
            if key not in t:
                raise CheckpointError(f"{source}: missing key {key!r}")
            return t[key]

        H, nh = need("hidden_size"), need("num_attention_heads")
        rope = t.get("rope_parameters") or t.get("rope_scaling") or {}
        rope_type = rope.get("rope_type", rope.get("type", "default"))
        if rope_type not in ("default", "mrope"):  # Qwen3.5's mRoPE is 1-D RoPE for text
            raise CheckpointError(f"{source}: rope_type {rope_type!r} is not supported (only default RoPE)")
        theta = t.get("rope_theta", rope.get("rope_theta", 10000.0))
        partial = t.get("partial_rotary_factor", rope.get("partial_rotary_factor",
                                                          0.25 if family == "qwen3_5" else 1.0))
        L = need("num_hidden_layers")
        if family == "qwen3_5":
            interval = t.get("full_attention_interval", 4)
            types = t.get("layer_types") or ["full_attention" if (i + 1) % interval == 0 else "linear_attention"
                                             for i in range(L)]
        else:
            types = ["full_attention"] * L
        if len(types) != L or set(types) - {"full_attention", "linear_attention"}:
            raise CheckpointError(f"{source}: layer_types must list {L} entries of full_attention/linear_attention")
        moe = moe_fields(t, model_type, need, source)
        # Qwen3.5-MoE has no dense MLP, so no intermediate_size; Qwen3-MoE's sizes its mlp_only_layers
        all_sparse = model_type.startswith("qwen3_5_moe")
        dense_width = t.get("intermediate_size", 0) if all_sparse else need("intermediate_size")
        return cls(
            family=family, vocab_size=need("vocab_size"), hidden_size=H, intermediate_size=dense_width,
            num_hidden_layers=L, num_attention_heads=nh,
            num_key_value_heads=t.get("num_key_value_heads", nh),
            head_dim=t.get("head_dim") or H // nh,  # Qwen2 has no head_dim field
            rms_norm_eps=t.get("rms_norm_eps", 1e-6), rope_theta=float(theta),
            partial_rotary_factor=float(partial), tie_word_embeddings=bool(t.get("tie_word_embeddings", False)),
            # Qwen2's q/k/v biases are hard-wired in HF (no config switch)
            attention_bias=True if family == "qwen2" else bool(t.get("attention_bias", False)),
            layer_types=list(types), linear_conv_kernel_dim=t.get("linear_conv_kernel_dim", 4),
            linear_num_key_heads=t.get("linear_num_key_heads", 0),
            linear_num_value_heads=t.get("linear_num_value_heads", 0),
            linear_key_head_dim=t.get("linear_key_head_dim", 0),
            linear_value_head_dim=t.get("linear_value_head_dim", 0), **moe, raw=d)

    @classmethod
    def tiny(cls, kind="tiny"):
        """Small random-weight models for CPU runs. The embedding has 272 rows for the byte tokenizer's 261 ids
        (padding rows, as real Qwen has); tied embeddings as the small real Qwens."""
        common = dict(vocab_size=272, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
                      num_attention_heads=4, num_key_value_heads=2, rms_norm_eps=1e-6, tie_word_embeddings=True,
                      max_position_embeddings=4096, hidden_act="silu", bos_token_id=256, eos_token_id=258,
                      pad_token_id=256)
        if kind == "tiny":
            raw = dict(common, model_type="qwen3", architectures=["Qwen3ForCausalLM"], head_dim=16,
                       rope_theta=1e6, attention_bias=False)
        elif kind == "tiny-qwen3.5":
            # hybrid: 3 Gated DeltaNet layers then 1 gated attention layer; dv != dk, nv > nk, partial rotary
            raw = dict(common, model_type="qwen3_5_text", architectures=["Qwen3_5ForCausalLM"], head_dim=32,
                       rope_parameters={"rope_type": "default", "rope_theta": 1e7, "partial_rotary_factor": 0.25},
                       layer_types=["linear_attention"] * 3 + ["full_attention"], linear_conv_kernel_dim=4,
                       linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16,
                       linear_value_head_dim=24, attention_bias=False)
        elif kind == "tiny-moe":
            # tiny-qwen3.5's hybrid stack with Qwen3.5-MoE's MLP: 8 experts, 2 a token, a gated shared expert
            raw = dict(cls.tiny("tiny-qwen3.5").raw, model_type="qwen3_5_moe_text",
                       architectures=["Qwen3_5MoeForCausalLM"], num_experts=8, num_experts_per_tok=2,
                       moe_intermediate_size=32, shared_expert_intermediate_size=32)
            del raw["intermediate_size"]
        else:
            raise ValueError(f"unknown tiny model {kind!r}: use one of {', '.join(TINY_MODELS)}")
        return cls.from_dict(raw, source=kind)


def moe_fields(t, model_type, need, source):
    """The experts' fields of a (text) config: none for a dense model_type. transformers writes Qwen3-MoE's expert
    count as num_local_experts, the hub's config.json as num_experts. Qwen3.5-MoE always renormalises the top-k
    weights (no norm_topk_prob key)."""
    if "moe" not in model_type:
        return {}
    E = t.get("num_experts", t.get("num_local_experts"))
    if not E:
        raise CheckpointError(f"{source}: missing key 'num_experts' (model_type {model_type!r})")
    fields = dict(num_experts=E, num_experts_per_tok=need("num_experts_per_tok"),
                  moe_intermediate_size=need("moe_intermediate_size"))
    if fields["num_experts_per_tok"] > E:
        raise CheckpointError(f"{source}: num_experts_per_tok {fields['num_experts_per_tok']} > num_experts {E}")
    if model_type.startswith("qwen3_5_moe"):
        return dict(fields, shared_expert_intermediate_size=need("shared_expert_intermediate_size"),
                    norm_topk_prob=True)
    return dict(fields, norm_topk_prob=bool(t.get("norm_topk_prob", False)),
                decoder_sparse_step=t.get("decoder_sparse_step", 1),
                mlp_only_layers=list(t.get("mlp_only_layers") or []))


# --------------------------------------------------------------------------------------------------------------
# Where a checkpoint's files are: a local folder as is, or an 'org/name' hub id fetched into the hub cache (only the
# files the caller needs). The model loader below and the tokenizer both start here.

# What a hub download fetches: the tokenizer's files, and for a model also its config and weights.
TOKENIZER_FILES = ["tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "config.json",
                   "generation_config.json"]
MODEL_FILES = TOKENIZER_FILES + ["*.safetensors", "model.safetensors.index.json", "special_tokens_map.json",
                                 "vocab.json", "merges.txt"]


def is_hub_id(p: str) -> bool:
    return p.count("/") == 1 and not p.startswith((".", "/", "~")) and not os.path.exists(p)


def nearest_tiny(name: str) -> str:
    """"; did you mean 'tiny'?" for a name that is close to a built-in model's (a typo of one)."""
    import difflib
    close = difflib.get_close_matches(name, TINY_MODELS, n=1)
    return f"; did you mean {close[0]!r}?" if close else ""


def local_folder(path_or_hub_id, files=MODEL_FILES):
    """A local folder as is; otherwise an 'org/name' hub id, fetched (only `files`) into the hub cache."""
    p = str(path_or_hub_id)
    if os.path.isdir(p):
        return p
    if not is_hub_id(p):
        raise FileNotFoundError(f"{p}: no such checkpoint folder (and not a hub id like 'Qwen/Qwen3-0.6B')"
                                f"{nearest_tiny(p)}")
    from huggingface_hub import snapshot_download
    from minigrpo import hub
    try:
        return hub.fetch(snapshot_download, repo_id=p, allow_patterns=files)
    except Exception as e:
        first = (str(e).splitlines() or [""])[0]
        raise OSError(f"{p}: no such folder, and the hub download failed ({type(e).__name__}: {first}); pass a local "
                      "checkpoint folder, or connect to the hub") from None


def load_pretrained(path_or_hub_id, dtype=None, device=None) -> Qwen:
    """The Qwen model of a local checkpoint folder, a hub id (downloaded), or a TINY_MODELS name (seeded
    random weights). Every tensor is cast to the one `dtype` (default fp32), as HF does."""
    dtype = parse_dtype(dtype)
    if path_or_hub_id in TINY_MODELS:
        model = tiny_model(path_or_hub_id).to(device=device, dtype=dtype)
        model.name_or_path = path_or_hub_id
        return model
    folder = local_folder(path_or_hub_id)
    cfg = read_config(os.path.join(folder, "config.json"))
    with torch.device("meta"):  # no memory: every parameter is replaced by a loaded tensor below
        model = Qwen(cfg)
    load_weights(model, folder, dtype, device or "cpu")
    # what a LoRA adapter saved on this model names as its base (adapter_config.json): the hub id, or the folder
    # as an absolute path, so that the adapter finds its base from any working directory
    model.name_or_path = os.path.abspath(folder) if os.path.isdir(str(path_or_hub_id)) else str(path_or_hub_id)
    return model


# The config.json keys QwenConfig reads, by the kind of value each must hold: a wrong type would otherwise fail deep
# in the model's construction (num_hidden_layers "four" multiplies a list). null counts as absent only where the
# reader falls back to a default on a falsy value.
CONFIG_KINDS = {
    "count": ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
              "num_key_value_heads", "head_dim", "linear_conv_kernel_dim", "full_attention_interval",
              "num_experts_per_tok", "moe_intermediate_size", "decoder_sparse_step"),
    "size": ("linear_num_key_heads", "linear_num_value_heads", "linear_key_head_dim", "linear_value_head_dim",
             "num_experts", "num_local_experts", "shared_expert_intermediate_size"),
    "number": ("rms_norm_eps", "rope_theta", "partial_rotary_factor"),
    "bool": ("tie_word_embeddings", "attention_bias", "use_sliding_window", "norm_topk_prob"),
    "list": ("layer_types", "mlp_only_layers"), "object": ("rope_parameters", "rope_scaling", "text_config"),
}
NULLABLE = {"head_dim", "layer_types", "rope_parameters", "rope_scaling", "use_sliding_window", "mlp_only_layers"}
KIND_TEST = {
    "count": (lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 1, "an integer >= 1"),
    "size": (lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 0, "an integer >= 0"),
    "number": (lambda v: isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v > 0,
               "a number > 0"),
    "bool": (lambda v: isinstance(v, bool), "true or false"),
    "list": (lambda v: isinstance(v, list), "a list"),
    "object": (lambda v: isinstance(v, dict), "an object {...}"),
}


def read_config(path) -> QwenConfig:
    """config.json -> QwenConfig, every value QwenConfig reads checked first: a wrong one is a CheckpointError that
    names the file, the key, the value and what it should be."""
    d = read_json(path, "not found; pass a folder holding a Hugging Face checkpoint or a hub id", CheckpointError)
    check_config(d, path)
    return QwenConfig.from_dict(d, source=path)


def check_config(d, source):
    if not isinstance(d, dict):
        raise CheckpointError(f"{source}: expected a JSON object {{...}}, got a {type(d).__name__}")
    for where, t in ((source, d), (f"{source} text_config", d.get("text_config"))):
        if not isinstance(t, dict):
            continue
        for kind, keys in CONFIG_KINDS.items():
            test, want = KIND_TEST[kind]
            for key in keys:
                if key in t and not (t[key] is None and key in NULLABLE) and not test(t[key]):
                    raise CheckpointError(f"{where}: {key}: {json.dumps(t[key])} is not {want}")
        heads, kv = t.get("num_attention_heads"), t.get("num_key_value_heads")
        if isinstance(heads, int) and isinstance(kv, int) and heads % kv:
            raise CheckpointError(f"{where}: num_attention_heads {heads} is not a multiple of num_key_value_heads {kv}")


def parse_dtype(dtype):
    if dtype is None or isinstance(dtype, torch.dtype):
        return dtype or torch.float32
    names = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
             "float16": torch.float16, "fp16": torch.float16}
    if dtype not in names:
        raise ValueError(f"dtype {dtype!r}: use one of {', '.join(names)}")
    return names[dtype]


def tiny_model(kind):
    """Seeded, deterministic random init in HF's style: normal(0, 0.02) linears and embedding, zero biases, norms
    at identity, GDN decay rates A = uniform(0.01, 16) and dt_bias = 1 (HF's _init_weights)."""
    model = Qwen(QwenConfig.tiny(kind))
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in model.named_parameters():  # fixed order; tied weights appear once
            if name.endswith("A_log"):
                p.copy_(torch.empty(p.shape).uniform_(0.01, 16, generator=g).log())
            elif name.endswith("dt_bias"):
                p.fill_(1.0)
            elif name.endswith("conv1d.weight"):  # PyTorch's default range for a depthwise conv of width K
                p.copy_(torch.empty(p.shape).uniform_(-1, 1, generator=g) / p.shape[-1] ** 0.5)
            elif p.ndim >= 2:  # linears, embedding, routers, stacked experts
                p.copy_(torch.randn(p.shape, generator=g) * 0.02)
            elif name.endswith("bias"):
                p.zero_()
            # norm weights keep their constructor value: 1 (plain) or 0 (Qwen3.5's 1 + w)
    return model


def weight_files(folder):
    index = os.path.join(folder, "model.safetensors.index.json")
    if os.path.isfile(index):
        with open(index) as f:
            shards = sorted(set(json.load(f)["weight_map"].values()))
        for s in shards:
            if not os.path.isfile(os.path.join(folder, s)):
                raise FileNotFoundError(f"{index} lists shard {s}, which is missing: re-download the checkpoint")
        return [os.path.join(folder, s) for s in shards]
    single = os.path.join(folder, "model.safetensors")
    if os.path.isfile(single):
        return [single]
    raise FileNotFoundError(f"{folder}: no model.safetensors or model.safetensors.index.json")


def our_name(key):
    """Checkpoint key -> our parameter name; None for tensors a text model does not use."""
    if key.startswith("model.language_model."):  # Qwen3.5's multimodal layout
        return "model." + key[len("model.language_model."):]
    if key.startswith(("model.visual.", "mtp.")) or key.endswith("rotary_emb.inv_freq"):
        return None  # vision tower, multi-token-prediction head, old checkpoints' saved RoPE tables
    return key


def set_param(model, name, tensor):
    module, _, leaf = name.rpartition(".")
    setattr(model.get_submodule(module), leaf, nn.Parameter(tensor))


def fill_expert(stacked, param, piece, f, key, file, dtype, device):
    """Copies one expert's projection (a per-expert checkpoint key) into its slice of the stacked tensor."""
    name, index = piece
    if name not in stacked:
        stacked[name] = [torch.empty(param.shape, dtype=dtype, device=device), 0]
    target = stacked[name][0][index]
    shape = list(f.get_slice(key).get_shape())
    if shape != list(target.shape):
        raise CheckpointError(f"{file}: tensor {key!r} has shape {shape}, config.json implies {list(target.shape)}")
    target.copy_(f.get_tensor(key))
    stacked[name][1] += 1


def load_weights(model, folder, dtype, device):
    """Load tensor by tensor into a meta-device model (assigning, never holding two full copies), each cast to the
    one model dtype (HF casts A_log, dt_bias and norms too). lm_head.weight if present, else the tied embedding."""
    from safetensors import safe_open
    from safetensors import SafetensorError

    expected = dict(model.named_parameters(remove_duplicate=False))
    loaded = set()
    stacked = {}  # fused expert tensor name -> (tensor being filled, pieces written): Qwen3-MoE's per-expert files
    for path in weight_files(folder):
        name_ = os.path.basename(path)
        try:
            with safe_open(path, framework="pt", device="cpu") as f:
                for key in f.keys():
                    name = our_name(key)
                    if name is None:
                        continue
                    piece = expert_piece(name, model.config.moe_intermediate_size)
                    if piece is not None and piece[0] in expected:
                        fill_expert(stacked, expected[piece[0]], piece, f, key, name_, dtype, device)
                        continue
                    if name not in expected:
                        raise CheckpointError(f"{name_}: unexpected tensor {key!r} for this config.json "
                                              f"({model.config.family}, {model.config.num_hidden_layers} layers)")
                    shape = list(f.get_slice(key).get_shape())
                    if shape != list(expected[name].shape):
                        raise CheckpointError(f"{name_}: tensor {key!r} has shape {shape}, config.json implies "
                                              f"{list(expected[name].shape)}")
                    set_param(model, name, f.get_tensor(key).to(device=device, dtype=dtype))
                    loaded.add(name)
        except (SafetensorError, OSError) as e:
            raise CheckpointError(f"{path}: unreadable safetensors file ({e}); re-download it") from None
    for name, (tensor, pieces) in stacked.items():
        if pieces == tensor.shape[0] * (2 if name.endswith("gate_up_proj") else 1):  # else: reported missing below
            set_param(model, name, tensor)
            loaded.add(name)
    if "lm_head.weight" not in loaded and model.config.tie_word_embeddings:
        model.lm_head.weight = model.model.embed_tokens.weight
        loaded.add("lm_head.weight")
    missing = [n for n in expected if n not in loaded]
    if missing:
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        raise CheckpointError(f"{folder}: tensor {missing[0]!r} is missing from the safetensors files{more}")
    rot = model.model.rotary
    rot.inv_freq = rot._inv_freq(device)  # a non-persistent buffer: built here, fp32, never loaded
