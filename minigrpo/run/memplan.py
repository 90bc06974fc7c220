"""The memory plan of a run, from the model's config.json alone: `python train.py --task soyuz --plan`.

What it adds up (bytes, for the resolved preset and model; one process):

  weights        every parameter once (tied embeddings once) in the compute dtype; a full fine-tune keeps them in
                 fp32, plus a frozen copy in the compute dtype when beta > 0 (the KL reference)
  trainable      LoRA A/B in fp32 and, after the first step, their gradients and AdamW's two moments: 16 bytes per
                 trainable parameter (a full fine-tune: 12 more bytes per weight, the weight itself is counted above)
  rollout        the sampler's cache for one sampler call: attention K and V for rows x max_len slots, Gated
                 DeltaNet's recurrent state (fp32) and conv state, plus the prefill's transient, bounded by one
                 layer's training activations over the prompts (no_grad keeps less), and the last-position logits
  training       one micro-batch's saved activations for backward, with and without per-layer checkpointing, plus
                 the log-prob chunk (logprobs.token_logprobs: LOGIT_BYTES of fp32 logits, their exp, and the model-dtype
                 copy of the gradient) and the (rows, H) fp32 d logp / d h that the fused head keeps

peak = weights + trainable + max(rollout, training): the sampler's cache is freed before the loss runs.

Activations are not guessed from a formula: one decoder layer of each kind is built at the config's width (random
values, no checkpoint read), LoRA injected as the run would, and run forward at two lengths on the CPU while
`torch.autograd.graph.saved_tensors_hooks` adds up every tensor autograd keeps for backward. That gives bytes per
token and per token^2 (the attention mask SDPA keeps) for this code as it is. The same run measures the layer's
backward: the most bytes its gradients and temporaries hold beyond the saved activations (a tensor counts from the
op that makes it until its storage is freed), which is the working set the plan adds on top of the saved ones; with
checkpointing, one layer is recomputed and backpropagated at a time.

Attention: the attention layer is measured as a padded micro-batch runs it (with a mask: most micro-batches have
pads). Its one scaled_dot_product_attention call is recorded (attention.Recorder) and attention.cuda_kernel names
the CUDA kernel that call takes, the same rules the model's attention calls are tested against; what that kernel
keeps for backward (its autograd node run on meta tensors: torch's own shape functions) replaces what the CPU's
kernel kept. The memory-efficient kernel keeps what the CPU's does (q, expanded k and v, output, log-sum-exp, the
mask as a (B, 1, T, S) bias); the math kernel would add its (B, nh, T, S) fp32 scores. A GPU peak is checked by
bench/device.py, which prints the plan next to the measured step.

A GPU "fits" when peak x 1.1 (allocator fragmentation) + 1 GiB (CUDA context, cuBLAS workspace) <= its memory.

Letters: B rows, T tokens per sequence, S cache slots, H hidden size, V vocabulary rows, L layers.
"""

import json
import os
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from minigrpo import static_decode
from minigrpo.common import DATA
from minigrpo.logprobs import LOGIT_BYTES
from minigrpo.lora import DEFAULT_TARGETS, inject_lora, lora_layers
from minigrpo.model import Block, Qwen, RMSNorm, Rotary, attention_mask_4d
from minigrpo.pretrained import QwenConfig, read_config
from minigrpo.run.attention_kernels import Recorder, cuda_kernel

GiB = 1024 ** 3
GPUS = [("24 GB", 24e9), ("40 GB", 40e9), ("80 GB", 80e9), ("141 GB", 141e9)]
CONFIGS = os.path.join(DATA, "configs")
# config.json of the reference runs' models (their published values), bundled so that a plan needs no network
BUNDLED = {"Qwen/Qwen3.5-4B": "Qwen3.5-4B.json", "Qwen/Qwen3-1.7B-Base": "Qwen3-1.7B-Base.json",
           "Qwen/Qwen3-0.6B": "Qwen3-0.6B.json"}
KERNEL_NAMES = {"flash": "flash", "efficient": "memory-efficient", "math": "math (unfused: (B, nh, T, S) fp32 scores)"}
CRITIQUE_TOKENS = 256  # soyuz's turn-1 user message (tasks/soyuz.critique: up to 6 failed criteria with reasons)


def load_config(model):
    """(QwenConfig, where it came from) for 'tiny', a local folder, a bundled hub id, or any hub id (config.json
    only)."""
    if model in ("tiny", "tiny-qwen3.5"):
        return QwenConfig.tiny(model), "built-in tiny config"
    if os.path.isdir(model):
        path = os.path.join(model, "config.json")
        return read_config(path), path         # a wrong value: one line naming the file and the key
    if model in BUNDLED:
        path = os.path.join(CONFIGS, BUNDLED[model])
        return read_config(path), f"{model} (bundled copy: minigrpo/data/configs/{BUNDLED[model]})"
    from huggingface_hub import hf_hub_download
    path = hf_hub_download(repo_id=model, filename="config.json")
    return read_config(path), f"{model} (hub config.json)"


# ----------------------------------------------------------------------------------------------------------------
# counts


def param_counts(cfg, lora_r, targets=DEFAULT_TARGETS):
    """(all parameters, trainable parameters): exact, from a meta-device model (no memory, no weights)."""
    with torch.device("meta"):
        model = Qwen(cfg)
        total = sum(p.numel() for p in model.parameters())  # tied weights once
        if lora_r <= 0:
            return total, total
        lora = inject_lora(model, r=lora_r, alpha=lora_r, targets=targets)
    return total, sum(p.numel() for p in lora)


def cache_bytes(cfg, rows, slots, dtype_bytes):
    """The sampler's cache for rows x slots: attention K, V (model dtype); GDN conv state (model dtype) and
    recurrent state (fp32, nv x dk x dv per row, whatever the length)."""
    kinds = cfg.layer_types
    n_attn = kinds.count("full_attention")
    n_gdn = len(kinds) - n_attn
    kv = n_attn * 2 * rows * cfg.num_key_value_heads * slots * cfg.head_dim * dtype_bytes
    nk, nv, dk, dv = (cfg.linear_num_key_heads, cfg.linear_num_value_heads, cfg.linear_key_head_dim,
                      cfg.linear_value_head_dim)
    conv = n_gdn * rows * (2 * nk * dk + nv * dv) * (cfg.linear_conv_kernel_dim - 1) * dtype_bytes
    state = n_gdn * rows * nv * dk * dv * 4
    return kv, conv + state


# ----------------------------------------------------------------------------------------------------------------
# activations, measured on one layer of each kind


def _saved_bytes(fn, skip):
    """Run fn() and add up the storage of every tensor autograd saves for backward (each storage once; the
    storages in `skip`, e.g. parameters and inputs shared by all layers, not at all)."""
    return _measure(fn, skip, backward=False)[0]


class _LiveBytes(TorchDispatchMode):
    """Bytes of every tensor storage an op made and that is still alive, and the most at once since `peak` was
    last set: each op's outputs are counted once, and dropped when their storage is freed."""

    def __init__(self):
        super().__init__()
        self.alive, self.live, self.peak = {}, 0, 0

    def sweep(self):
        for ptr in [p for p, (ref, _) in self.alive.items() if ref.expired()]:
            self.live -= self.alive.pop(ptr)[1]

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        self.sweep()
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor) and t.device.type != "meta":
                st = t.untyped_storage()
                if st.data_ptr() and st.data_ptr() not in self.alive:
                    self.alive[st.data_ptr()] = (StorageWeakRef(st), st.nbytes())
                    self.live += st.nbytes()
        self.peak = max(self.peak, self.live)
        return out


def _measure(fn, skip, backward=True):
    """(bytes autograd saves in fn(), bytes its backward holds at most beyond them). The backward runs from a
    gradient of ones on fn()'s output, so every saved tensor is used and freed as in training."""
    seen, saved = set(skip), 0

    def pack(t):
        nonlocal saved
        st = t.untyped_storage()
        if st.data_ptr() not in seen:
            seen.add(st.data_ptr())
            saved += st.nbytes()
        return t

    counter = _LiveBytes()
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), counter:
        y = fn()
        if not backward:
            return saved, 0
        counter.sweep()
        after_forward = counter.peak = counter.live
        y.backward(torch.ones_like(y))
    return saved, counter.peak - after_forward


@dataclass
class LayerCost:
    per_token: float      # bytes per token
    per_token2: float     # bytes per token^2 of one sequence (the attention mask, CPU and CUDA kernels alike)
    backward: "LayerCost | None" = None   # the same form for the backward's working set beyond the saved bytes

    def bytes(self, B, T):
        return B * (self.per_token * T + self.per_token2 * T * T)

    @staticmethod
    def fit(lengths, measured):
        """Bytes per token and per token^2 from B=1 measurements at two lengths."""
        (t1, m1), (t2, m2) = zip(lengths, measured)
        b = (m2 / t2 - m1 / t1) / (t2 - t1)
        return LayerCost(m1 / t1 - b * t1, b)


def layer_costs(cfg, dtype, lora_r, targets=DEFAULT_TARGETS, lengths=(128, 256)):
    """{layer kind: LayerCost} of the policy pass with gradients, plus "final_norm", measured on the CPU at the
    config's width with B = 1 at two lengths, multiples of Gated DeltaNet's 64-token chunk and of at least two
    chunks (from the second chunk on, each chunk also keeps the incoming state: with one chunk the fit is off)."""
    costs = {}
    wdtype = dtype if lora_r > 0 else torch.float32  # a full fine-tune trains fp32 weights (train.build_policy)
    for kind in dict.fromkeys(cfg.layer_types):
        with torch.device("meta"):
            block = Block(cfg, kind)
        block.to_empty(device="cpu")
        with torch.no_grad():
            for p in block.parameters():
                p.normal_(0, 0.02) if p.ndim > 1 else p.fill_(0.1)
        block.to(wdtype)
        if lora_r > 0:
            inject_lora(block, r=lora_r, alpha=lora_r, targets=targets)
        rot = _rotary(cfg)
        measured = []
        for T in lengths:
            x = torch.randn(1, T, cfg.hidden_size, dtype=wdtype, requires_grad=True)
            real = torch.ones(1, T, dtype=torch.bool)
            mask = attention_mask_4d(real, 0, T)  # as for a padded micro-batch
            cos, sin = rot(torch.arange(T)[None], x.dtype)
            shared = [t.untyped_storage().data_ptr() for t in (cos, sin, mask, real)]
            shared += [p.untyped_storage().data_ptr() for p in block.parameters()]
            with Recorder() as rec:
                saved, grads = _measure(lambda: block(x, (cos, sin), attn_mask=mask, real_tokens=real), shared)
            for call in rec.calls:  # the attention layer's one call: what the CUDA kernel keeps instead
                costs["attention_kernel"] = cuda_kernel(call)
                saved += kernel_saved_bytes(call, "cuda") - kernel_saved_bytes(call, "cpu")
            measured.append((saved, grads))
        costs[kind] = LayerCost.fit(lengths, [m[0] for m in measured])
        costs[kind].backward = LayerCost.fit(lengths, [m[1] for m in measured])
        del block
    norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, cfg.family == "qwen3_5").to(wdtype)  # before the head
    x = torch.randn(1, 128, cfg.hidden_size, dtype=wdtype, requires_grad=True)
    costs["final_norm"] = LayerCost(_saved_bytes(lambda: norm(x), [norm.weight.untyped_storage().data_ptr()]) / 128, 0)
    return costs


def kernel_saved_bytes(call, where):
    """Bytes the autograd node of one attention call keeps for backward: where="cpu" as the CPU's SDPA runs it,
    "cuda" as the CUDA kernel attention.cuda_kernel names for it (run on meta tensors: no GPU, no memory)."""
    device = "cpu" if where == "cpu" else "meta"
    q, k, v = (torch.zeros(t[0], dtype=call.dtype, device=device, requires_grad=True) for t in (call.q, call.k, call.v))
    mask = None if call.mask is None else torch.ones(call.mask[0], dtype=torch.bool, device=device)
    saved = {}

    def pack(t):  # each storage once (meta tensors have none to compare: each tensor once)
        saved.setdefault(id(t) if device == "meta" else t.untyped_storage().data_ptr(), t.untyped_storage().nbytes())
        return t

    kernel = cuda_kernel(call)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        if where == "cpu":
            F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=call.is_causal,
                                           enable_gqa=call.enable_gqa)
        elif kernel == "efficient":  # SDPA hands it the mask as a bias of q's dtype, rows padded to 16 slots
            bias = None
            if mask is not None:
                S = mask.shape[-1]
                bias = torch.zeros(mask.shape[:-1] + (-(-S // 16) * 16,), dtype=call.dtype, device=device)
                bias = bias[..., :S].expand(q.shape[:-1] + (S,))
            torch.ops.aten._scaled_dot_product_efficient_attention(q, k, v, bias, True, 0.0, call.is_causal)
        elif kernel == "flash":
            torch.ops.aten._scaled_dot_product_flash_attention(q, k, v, 0.0, call.is_causal)
        else:
            torch.ops.aten._scaled_dot_product_attention_math(q, k, v, mask, 0.0, call.is_causal,
                                                             enable_gqa=call.enable_gqa)
    return sum(saved.values())


def _rotary(cfg):
    return Rotary(cfg.head_dim, cfg.rope_theta, cfg.partial_rotary_factor)


def activation_bytes(cfg, costs, B, T, dtype_bytes, checkpointing):
    """Saved activations of one micro-batch, and the most alive at once during its backward."""
    layers = [costs[k].bytes(B, T) for k in cfg.layer_types]
    grads = max(costs[k].backward.bytes(B, T) for k in cfg.layer_types)  # one layer's backward at a time
    final = costs["final_norm"].bytes(B, T)
    mask = B * T * T  # the (B, 1, T, T) bool attention mask, built once per forward
    if checkpointing:  # each layer keeps its input; in backward one layer is recomputed, then backpropagated
        saved = len(layers) * B * T * cfg.hidden_size * dtype_bytes + final + mask
        return saved + max(costs[k].bytes(B, T) + costs[k].backward.bytes(B, T) for k in cfg.layer_types)
    return sum(layers) + final + mask + grads


def logprob_bytes(cfg, rows, dtype_bytes, entropy=True):
    """logprobs.token_logprobs at its peak: one chunk of fp32 logits (LOGIT_BYTES, or all rows if fewer) and, when the
    entropy is logged (train.py does), their exp beside them; in bf16 the logits before the cast (and the gradient
    cast back); plus d logp / d h (rows, H) fp32 for every row."""
    chunk = min(rows, max(1, LOGIT_BYTES // (4 * cfg.vocab_size))) * cfg.vocab_size  # logits per chunk
    model_dtype_copy = chunk * dtype_bytes if dtype_bytes < 4 else 0
    return (2 if entropy else 1) * 4 * chunk + model_dtype_copy + rows * cfg.hidden_size * 4


# ----------------------------------------------------------------------------------------------------------------
# the plan


@dataclass
class Shape:
    """What one process holds: sampler rows and slots per call, trained micro-batch and its length."""
    rollout_prompts: int    # prompts per sampler call
    rollout_rows: int       # rows decoded per sampler call (prompts x samples)
    prompt_tokens: int      # longest prompt of a call
    slots: int              # its cache length: prompt + new tokens
    micro_batch: int        # sequences per forward/backward
    train_tokens: int       # their padded length
    completion_tokens: int  # columns whose log-prob is computed
    other_slots: tuple = ()  # cache lengths of the run's other sampler calls (soyuz's turn 0)


def fast_decode_bytes(cfg, shape, s, lora_r, targets):
    """(merged copy, static caches) the fast decode path keeps for the whole run (minigrpo/merged.py,
    static_decode.py): a weight of its own for every adapted projection, and one cache of the run's rows per length
    bucket its calls use, each kept (fixed addresses for the compiled graph) through training too."""
    merged = 0
    if lora_r > 0:
        with torch.device("meta"):
            model = Qwen(cfg)
            inject_lora(model, r=lora_r, alpha=lora_r, targets=targets)
        merged = sum(m.base_layer.weight.numel() for _, m in lora_layers(model)) * s
    buckets = {static_decode.bucket_len(n) for n in (shape.slots, *shape.other_slots)}
    rows = shape.rollout_rows       # train.py sizes them for the run's largest call (train.decode_rows)
    return merged, sum(sum(cache_bytes(cfg, rows, b, s)) for b in buckets)


def plan(cfg, shape, dtype, lora_r, targets=DEFAULT_TARGETS, beta=0.0, costs=None, fast_decode=True):
    """{part: bytes} and the derived peaks; costs: layer_costs(...) (measured here when None). fast_decode: the
    run samples with the static compiled decode (train.py's default on CUDA), whose copy and caches stay."""
    s = torch.finfo(dtype).bits // 8
    total, trainable = param_counts(cfg, lora_r, targets)
    costs = costs or layer_costs(cfg, dtype, lora_r, targets)
    p = {"params": total, "trainable_params": trainable, "attention_kernel": costs.get("attention_kernel")}
    if lora_r > 0:
        p["weights"] = total * s
        p["trainable"] = 16 * trainable
    else:
        p["weights"] = total * 4 + (total * s if beta > 0 else 0)
        p["trainable"] = 12 * total
    kv, gdn = cache_bytes(cfg, shape.rollout_rows, shape.slots, s)
    prefill = max(costs[k].bytes(shape.rollout_prompts, shape.prompt_tokens) for k in set(cfg.layer_types))
    p["kv_cache"], p["gdn_state"] = kv, gdn
    p["prefill"] = prefill + shape.rollout_prompts * cfg.vocab_size * 4
    p["rollout"] = kv + gdn + p["prefill"]
    B, T = shape.micro_batch, shape.train_tokens
    p["logprob_chunk"] = logprob_bytes(cfg, B * shape.completion_tokens, s)
    p["activations"] = activation_bytes(cfg, costs, B, T, s, checkpointing=False)
    p["activations_ckpt"] = activation_bytes(cfg, costs, B, T, s, checkpointing=True)
    p["merged_copy"], p["static_caches"] = fast_decode_bytes(cfg, shape, s, lora_r, targets) if fast_decode else (0, 0)
    kept = p["weights"] + p["trainable"] + p["merged_copy"] + p["static_caches"]
    for name, act in (("peak", p["activations"]), ("peak_ckpt", p["activations_ckpt"])):
        p[name] = kept + max(p["rollout"], act + p["logprob_chunk"])
    return p


def fits(peak):
    return [name for name, cap in GPUS if peak * 1.1 + GiB <= cap]


def format_plan(p, header):
    gb = lambda x: f"{x / GiB:7.2f} GiB"
    lines = [header, f"parameters {p['params']:,}; trainable {p['trainable_params']:,}"]
    if p.get("attention_kernel"):
        lines.append(f"training attention on CUDA: the {KERNEL_NAMES[p['attention_kernel']]} kernel for a padded "
                     f"micro-batch (attention.cuda_kernel of the measured call; an unpadded one takes flash)")
    lines += ["", "| part | memory |", "|---|---|"]
    rows = [("weights", "weights"), ("trainable (fp32 weights + grads + AdamW m, v)", "trainable"),
            ("rollout: attention K/V cache", "kv_cache"), ("rollout: Gated DeltaNet state + conv", "gdn_state"),
            ("rollout: prefill transient (bound: one layer's training activations) + last logits", "prefill"),
            ("fast decode: merged LoRA copy of the adapted weights (kept)", "merged_copy"),
            ("fast decode: static caches, one per length bucket (kept)", "static_caches"),
            ("training: activations, no checkpointing", "activations"),
            ("training: activations, per-layer checkpointing", "activations_ckpt"),
            ("training: log-prob chunk + d logp/dh", "logprob_chunk"),
            ("**peak, no checkpointing**", "peak"), ("**peak, checkpointing** (--grad-checkpoint)", "peak_ckpt")]
    lines += [f"| {name} | {gb(p[key])} |" for name, key in rows]
    lines.append("")
    for key, what in (("peak", "without checkpointing"), ("peak_ckpt", "with --grad-checkpoint")):
        ok = fits(p[key])
        lines.append(f"fits {what}: {', '.join(ok) if ok else 'none of ' + ', '.join(n for n, _ in GPUS)} "
                     f"(needs {(p[key] * 1.1 + GiB) / 1e9:.1f} GB with 10% fragmentation + 1 GiB CUDA context)")
    return "\n".join(lines)


# ----------------------------------------------------------------------------------------------------------------
# from train.py's resolved arguments


def prompt_tokens(task):
    """The longest prompt, in tokens, estimated without a tokenizer: UTF-8 bytes / 3 (Qwen's BPE averages 3.5-4.5
    bytes per token on English and code) + 16 for the chat template. soyuz: its bundled tasks; gsm8k: the system
    prompt and a 900-character question (GSM8K's longest are about that); mdp: the mdp run's "full" prompt, ~330
    tokens with the template (experiments/mdp_pipeline.py), rounded up."""
    if task == "soyuz":
        with open(os.path.join(DATA, "soyuz_tasks.json")) as f:
            longest = max(len(t["prompt"].encode()) for t in json.load(f))
        return longest // 3 + 16
    if task == "gsm8k":
        from minigrpo.tasks.gsm8k import SYSTEM_PROMPT
        return (len(SYSTEM_PROMPT.encode()) + 900) // 3 + 16
    if task == "terminal":          # the system turn (with the shell tool's schema, ~250 tokens) + the instruction
        from minigrpo.tasks.terminal.task import SYSTEM, catalogue
        return (len(SYSTEM.encode()) + max(len(e.instruction.encode()) for e in catalogue())) // 3 + 16 + 250
    return {"mdp": 400}.get(task, 64)


def run_shape(args):
    """(Shape, settings dict) of the run train.py would start, per process. soyuz samples one task's G answers per
    call (chunk 1), then its G revisions, whose prompts hold the answer and the critique: those are the longest
    calls and sequences. mdp: the GRPO stage of its pipeline (experiments/mdp_pipeline.PIPELINES)."""
    if args.task == "mdp":
        from minigrpo.experiments.mdp_pipeline import pipeline_config
        c = pipeline_config(args.model)
        s = dict(lora_r=c.lora_r, group_size=c.group_size, tasks=c.grpo_tasks, max_new_tokens=c.max_new_tokens,
                 micro_batch=c.batch * 2, beta=c.grpo_beta, targets=DEFAULT_TARGETS)
    else:
        s = dict(lora_r=args.lora_r, group_size=args.group_size, tasks=args.tasks_per_step,
                 max_new_tokens=args.max_new_tokens, micro_batch=args.micro_batch, beta=args.beta,
                 targets=args.lora_targets.split(",") if args.lora_targets else DEFAULT_TARGETS)
    P, new, G = prompt_tokens(args.task), s["max_new_tokens"], s["group_size"]
    if args.task == "soyuz":
        longest = P + new + CRITIQUE_TOKENS  # a revision's prompt: task, answer, critique
        shape = Shape(G, G, longest, longest + new, s["micro_batch"], longest + new, new, (P + new,))
    elif args.task == "terminal":           # the last turn's prompt: every earlier turn and its tool output
        from minigrpo.tasks.terminal.task import MAX_TURNS, TURN_OUTPUT_BYTES
        longest = P + (MAX_TURNS - 1) * (new + TURN_OUTPUT_BYTES // 3 + 64)   # + 64: the tool turns' template
        rows = G                            # one exercise's episodes per sampler call (TerminalTask.chunk)
        shape = Shape(rows, rows, longest, longest + new, s["micro_batch"], longest + new, new, (P + new,))
    else:
        shape = Shape(s["tasks"], s["tasks"] * G, P, P + new, s["micro_batch"], P + new, new)
    s["prompt_tokens"] = P
    return shape, s


def print_plan(args):
    import sys
    dtype = getattr(torch, args.dtype) if args.dtype else torch.bfloat16
    cfg, source = load_config(args.model)
    shape, s = run_shape(args)
    print(f"memory plan: measuring one layer of each kind on the CPU at {args.model}'s width...", file=sys.stderr)
    fast = getattr(args, "decode", None) != "eager"      # on CUDA train.py decodes with the fast path
    p = plan(cfg, shape, dtype, s["lora_r"], s["targets"], s["beta"], fast_decode=fast)
    which = "every projection" if tuple(s["targets"]) == DEFAULT_TARGETS else ",".join(s["targets"])
    lora = f"LoRA r={s['lora_r']} on {which}" if s["lora_r"] > 0 else "full fine-tune"
    header = (f"memory plan: --task {args.task}, model {args.model}, config {source}\n"
              f"{str(dtype)[6:]} (the CUDA default; --dtype to change), {lora}, one process; "
              f"G={s['group_size']}, {s['tasks']} tasks per step, max_new_tokens {s['max_new_tokens']}, "
              f"micro-batch {s['micro_batch']}, beta {s['beta']}\n"
              f"longest sampler call: {shape.rollout_rows} rows x {shape.slots} slots (prompt <= {shape.prompt_tokens} "
              f"tokens); trained micro-batch: {shape.micro_batch} x {shape.train_tokens} tokens "
              f"(task prompt ~{s['prompt_tokens']} tokens, estimated: UTF-8 bytes / 3 + 16"
              + {"soyuz": f"; + answer + {CRITIQUE_TOKENS}-token critique for soyuz's revision turn",
                 "terminal": "; + 7 earlier turns, each with its tool output at the turn's cap"}.get(args.task, "")
              + ")")
    print(format_plan(p, header))
    return p
