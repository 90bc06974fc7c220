"""The decoding copy of a LoRA model: the same model with every adapter merged into its own copy of the weight.

Why: unmerged, each LoRA layer adds four ops to the base layer's one (the fp32 cast, A, B, the scaled add) and
runs them in fp32, which at decode (one token per row, launch-bound) is about half again the base model's
kernels. Merged, the decode step is the base model's step, kernel for kernel.

Why a copy and not lora.merge_lora: merging in place changes the trained model's weights, and in bf16 merge then
unmerge does not give back the same bits, so every sampler call would drift the frozen base a little. The copy
holds, for each LoRA layer, one tensor W' = W + (α/r)·B A, rounded once to the model dtype (bf16 on a GPU); every
other tensor (embeddings, norms, the Gated DeltaNet conv and gates, an untargeted layer) is the model's own,
shared, not copied. Its cost is one more copy of the adapted weights in the model dtype (Qwen3.5-4B with
LoRA on every projection: 3.57 B weights, 6.6 GiB in bf16).

The copy is built once per model and refreshed in place before each use, only when an adapter (or a base weight)
has changed since: its tensors keep their addresses, so a compiled decode step or a recorded CUDA graph that
reads them stays valid for the whole run. The fp32 LoRA weights are only read, never written.

In fp32 the copy computes the unmerged model's function up to fp32 rounding (x (W + BA)ᵀ against
x Wᵀ + (x Aᵀ) Bᵀ): tests/model/test_merged.py checks its logits, and the sampler's tokens and log-probs, against the
unmerged model.
"""

import weakref

import torch

from minigrpo.lora import lora_layers

_copies = weakref.WeakKeyDictionary()   # model -> (its decoding copy, the versions it was merged from)


def decode_model(model):
    """The model to decode with: `model` itself when it has no LoRA layers, else its merged copy, up to date."""
    layers = lora_layers(model)
    if not layers:
        return model
    if model not in _copies:
        _copies[model] = (_build(model), None)
    copy, merged_from = _copies[model]
    now = _versions(layers)
    if now != merged_from:
        _refresh(copy, layers)
        _copies[model] = (copy, now)
    return copy


def release(model):
    """Drop the model's decoding copy (its merged weights return to the allocator)."""
    _copies.pop(model, None)


def _versions(layers):
    """What the merged weights depend on: each tensor's in-place version counter (the optimizer step and a loaded
    checkpoint bump it), its identity, and the layer's switches."""
    return tuple((id(t), t._version) for _, m in layers for t in (m.base_layer.weight, m.lora_A.weight,
                                                                   m.lora_B.weight)) + \
        tuple((m.disabled, m.merged) for _, m in layers)


def _build(model):
    """A model of the same class and config whose LoRA layers are plain nn.Linear with their own (empty) weight;
    every other tensor is the model's, shared."""
    with torch.device("meta"):
        copy = type(model)(model.config)
    state, own = {}, {}
    for name, t in model.state_dict(keep_vars=True).items():
        if ".lora_A." in name or ".lora_B." in name:
            continue
        plain = name.replace(".base_layer.", ".")
        if name.endswith(".base_layer.weight"):
            own[plain] = torch.empty_like(t, requires_grad=False)
            state[plain] = own[plain]
        else:
            state[plain] = t.detach()   # the same storage: nothing copied
    copy.load_state_dict(state, assign=True, strict=True)
    if model.config.tie_word_embeddings:
        copy.lm_head.weight = copy.model.embed_tokens.weight
    copy.model.rotary.inv_freq = model.model.rotary.inv_freq   # a non-persistent buffer: not in the state dict
    if any(t.device != model.device for t in list(copy.parameters()) + list(copy.buffers())):
        raise RuntimeError("merged.py: a tensor of the decoding copy was not set from the model")
    copy.requires_grad_(False).eval()
    copy.merged_weights = {path: copy.get_submodule(path).weight for path, _ in lora_layers(model)}
    return copy


@torch.no_grad()
def _refresh(copy, layers):
    """W' = W + (α/r)·B A for every LoRA layer, added in fp32 and rounded once; W itself where the adapter is off."""
    for path, m in layers:
        w, dst = m.base_layer.weight, copy.merged_weights[path]
        if m.disabled or m.merged:      # merged: the update is inside W already
            dst.copy_(w)
        else:
            dst.copy_(w.float() + m.delta_weight())
