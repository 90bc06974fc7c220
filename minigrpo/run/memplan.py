"""The memory plan of a run, from the model's config.json alone: `python train.py --task soyuz --plan`.

What it adds up (bytes, for the resolved preset and model; one process):

  weights        every parameter once (tied embeddings once) in the compute dtype; a full fine-tune keeps them in
                 fp32, plus a frozen copy in the compute dtype when beta > 0 (the KL reference)
  trainable      LoRA A/B in fp32 and, after the first step, their gradients and AdamW's two moments: 16 bytes per
                 trainable parameter, a MoE model's expert and router adapters too (--lora-experts, --lora-router)
                 (a full fine-tune: 12 more bytes per weight, the weight itself is counted above)
  rollout        the sampler's cache for one sampler call: attention K and V for rows x max_len slots, Gated
                 DeltaNet's recurrent state (fp32) and conv state, plus the prefill's transient, bounded by one
                 layer's training activations over the tokens one prefill runs (no_grad keeps less), and the
                 last-position logits. A task whose turns continue kept states (terminal: sampler reuse,
                 minigrpo/prefix.py) prefills one row's new tokens at a time, and holds per row the state it
                 continues and the one it keeps
  static cache   the fast decode path (train.py's default on CUDA) keeps one cache of the run's rows at its longest
                 call's length bucket, which every shorter call views (static_decode.py), through training too:
                 fixed addresses
  training       one micro-batch's saved activations for backward, with and without per-layer checkpointing, plus
                 the log-prob chunk (logprobs.token_logprobs: LOGIT_BYTES of fp32 logits, their exp, and the model-dtype
                 copy of the gradient) and the (rows, H) fp32 d logp / d h that the fused head keeps

peak = weights + trainable + static caches + max(rollout, training): the sampler's own cache is freed before the
loss runs.

Activations are not guessed from a formula: one decoder layer of each kind is measured on the CPU at the config's
width (minigrpo/run/layercost.py: what autograd saves, what the backward holds beyond it, the CUDA attention
kernel's own bytes), at three lengths, and fitted with terms that are all >= 0. With checkpointing each layer keeps
its input, and one layer is recomputed and backpropagated at a time. A GPU peak is checked by bench/device.py, which
prints the plan next to the measured step.

A GPU "fits" when peak x 1.1 (allocator fragmentation) + 1 GiB (CUDA context, cuBLAS workspace) <= its memory.

Letters: B rows, T tokens per sequence, S cache slots, H hidden size, V vocabulary rows, L layers.
"""

import json
import math
import os
from dataclasses import dataclass

import torch

from minigrpo import static_decode
from minigrpo.files import DATA
from minigrpo.logprobs import LOGIT_BYTES
from minigrpo.lora import DEFAULT_TARGETS, inject_lora
from minigrpo.model import Qwen
from minigrpo.pretrained import TINY_MODELS, QwenConfig, read_config
from minigrpo.run.layercost import layer_costs, layer_keys

GiB = 1024 ** 3
GPUS = [("24 GB", 24e9), ("40 GB", 40e9), ("80 GB", 80e9), ("141 GB", 141e9)]
CONFIGS = os.path.join(DATA, "configs")
# config.json of the reference runs' models (their published values), bundled so that a plan needs no network
BUNDLED = {"Qwen/Qwen3.5-4B": "Qwen3.5-4B.json", "Qwen/Qwen3-1.7B-Base": "Qwen3-1.7B-Base.json",
           "Qwen/Qwen3-0.6B": "Qwen3-0.6B.json", "Qwen/Qwen3-30B-A3B": "Qwen3-30B-A3B.json",
           "Qwen/Qwen3.5-35B-A3B": "Qwen3.5-35B-A3B.json"}
KERNEL_NAMES = {"flash": "flash", "efficient": "memory-efficient", "math": "math (unfused: (B, nh, T, S) fp32 scores)"}
CRITIQUE_TOKENS = 256  # soyuz's turn-1 user message (tasks/soyuz.critique: up to 6 failed criteria with reasons)


def load_config(model):
    """(QwenConfig, where it came from) for 'tiny', a local folder, a bundled hub id, or any hub id (config.json
    only)."""
    if model in TINY_MODELS:
        return QwenConfig.tiny(model), "built-in tiny config"
    if os.path.isdir(model):
        path = os.path.join(model, "config.json")
        return read_config(path), path         # a wrong value: one line naming the file and the key
    if model in BUNDLED:
        path = os.path.join(CONFIGS, BUNDLED[model])
        return read_config(path), f"{model} (bundled copy: minigrpo/data/configs/{BUNDLED[model]})"
    from huggingface_hub import hf_hub_download
    from minigrpo import hub
    path = hub.fetch(hf_hub_download, repo_id=model, filename="config.json")
    return read_config(path), f"{model} (hub config.json)"


# ----------------------------------------------------------------------------------------------------------------
# counts


def param_counts(cfg, lora_r, targets=DEFAULT_TARGETS, **switches):
    """(all parameters, trainable parameters): exact, from a meta-device model (no memory, no weights). switches:
    inject_lora's experts and router."""
    with torch.device("meta"):
        model = Qwen(cfg)
        total = sum(p.numel() for p in model.parameters())  # tied weights once
        if lora_r <= 0:
            return total, total
        lora = inject_lora(model, r=lora_r, alpha=lora_r, targets=targets, **switches)
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
# activations (per layer: layercost.py)


def activation_bytes(cfg, costs, B, T, dtype_bytes, checkpointing):
    """Saved activations of one micro-batch, and the most alive at once during its backward."""
    keys = layer_keys(cfg)
    layers = [costs[k].bytes(B, T) for k in keys]
    grads = max(costs[k].backward.bytes(B, T) for k in keys)  # one layer's backward at a time
    final = costs["final_norm"].bytes(B, T)
    mask = B * T * T  # the (B, 1, T, T) bool attention mask, built once per forward
    if checkpointing:  # each layer keeps its input; in backward one layer is recomputed, then backpropagated
        saved = len(layers) * B * T * cfg.hidden_size * dtype_bytes + final + mask
        return saved + max(costs[k].bytes(B, T) + costs[k].backward.bytes(B, T) for k in keys)
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
    shortest_slots: int = 0  # the cache length of the run's shortest sampler call (0: every call is `slots` long)
    turn_tokens: int = 0     # > 0: each row continues a kept state (sampler reuse), prefilling this many new tokens
    #                          on its own; 0: the call's prompts are prefilled whole, as one batch


def static_slots(shape):
    """The slots of the fast decode path's static cache: the length bucket (static_decode.bucket_len) of the run's
    longest call, whose buffers every shorter call views (static_decode.StaticCache)."""
    return static_decode.bucket_len(shape.slots)


def static_cache_bytes(cfg, shape, dtype_bytes):
    """The cache the fast decode path keeps for the whole run (static_decode.py): the run's rows (train.decode_rows,
    the largest call's) x the longest call's bucket, one set of buffers for every call's length, kept through
    training too (fixed addresses for the compiled graph)."""
    return sum(cache_bytes(cfg, shape.rollout_rows, static_slots(shape), dtype_bytes))


def prefill_bytes(cfg, costs, shape, dtype_bytes):
    """The prefill's transient: one layer's training activations (a bound: no_grad keeps less) over the tokens one
    prefill runs, attending to all the prompt's slots (the T x S mask; an attention layer's K and V of the S - T
    slots before them expanded to the query heads), plus the last-position logits of the call's prompts. Whole
    prompts: the call's prompts at once (T = S). Continued rows: one at a time, T = its new tokens."""
    S = shape.prompt_tokens
    B, T = (1, shape.turn_tokens) if shape.turn_tokens else (shape.rollout_prompts, S)

    def layer(key):
        c = costs[key]
        heads = cfg.num_attention_heads if key.startswith("full_attention") else 0
        earlier = 2 * B * heads * (S - T) * cfg.head_dim * dtype_bytes
        return c.fixed + B * (c.per_token * T + c.per_token2 * T * S) + earlier
    return max(layer(k) for k in set(layer_keys(cfg))) + shape.rollout_prompts * cfg.vocab_size * 4


def kept_bytes(cfg, shape, dtype_bytes):
    """Continued rows (shape.turn_tokens): the kept states a call holds, per row the one it continues (the prompt
    less its new tokens) and the one it keeps (the prompt), each a cache of exactly its tokens. 0 otherwise."""
    if not shape.turn_tokens:
        return 0
    before, after = shape.prompt_tokens - shape.turn_tokens, shape.prompt_tokens
    return sum(cache_bytes(cfg, shape.rollout_rows, before, dtype_bytes) + cache_bytes(cfg, shape.rollout_rows, after,
                                                                                      dtype_bytes))


def fixed_parts(cfg, shape, dtype, lora_r, targets=DEFAULT_TARGETS, beta=0.0, fast_decode=True, **switches):
    """The plan's parts that need no measured layer cost: parameters, weights, trainable state, the caches and the
    log-prob chunk (memguard refuses on them alone before the measurement, a minute at 4B on a CPU)."""
    s = torch.finfo(dtype).bits // 8
    total, trainable = param_counts(cfg, lora_r, targets, **switches)
    p = {"params": total, "trainable_params": trainable}
    if lora_r > 0:
        p["weights"] = total * s
        p["trainable"] = 16 * trainable
    else:
        p["weights"] = total * 4 + (total * s if beta > 0 else 0)
        p["trainable"] = 12 * total
    p["kv_cache"], p["gdn_state"] = cache_bytes(cfg, shape.rollout_rows, shape.slots, s)
    p["kept_states"] = kept_bytes(cfg, shape, s)
    p["logprob_chunk"] = logprob_bytes(cfg, shape.micro_batch * shape.completion_tokens, s)
    p["static_caches"] = static_cache_bytes(cfg, shape, s) if fast_decode else 0
    p["static_slots"] = static_slots(shape) if fast_decode else 0
    return p


def plan(cfg, shape, dtype, lora_r, targets=DEFAULT_TARGETS, beta=0.0, costs=None, fast_decode=True, fixed=None,
         **switches):
    """{part: bytes} and the derived peaks; costs: layercost.layer_costs(...) (measured here when None); fixed:
    fixed_parts(...) of the same arguments, when the caller has them. fast_decode: the run samples with the static
    compiled decode (train.py's default on CUDA), whose caches stay. switches: inject_lora's experts and router
    (LoRA on a MoE model's routed experts and routers)."""
    s = torch.finfo(dtype).bits // 8
    p = dict(fixed or fixed_parts(cfg, shape, dtype, lora_r, targets, beta, fast_decode, **switches))
    costs = costs or layer_costs(cfg, dtype, lora_r, targets, **switches)
    p["attention_kernel"] = costs.get("attention_kernel")
    p["prefill"] = prefill_bytes(cfg, costs, shape, s)
    p["rollout"] = p["kv_cache"] + p["gdn_state"] + p["prefill"] + p["kept_states"]
    B, T = shape.micro_batch, shape.train_tokens
    a = s if lora_r > 0 else 4      # a full fine-tune trains fp32 weights: its activations are fp32 too
    p["activations"] = activation_bytes(cfg, costs, B, T, a, checkpointing=False)
    p["activations_ckpt"] = activation_bytes(cfg, costs, B, T, a, checkpointing=True)
    kept = p["weights"] + p["trainable"] + p["static_caches"]
    for name, act in (("peak", p["activations"]), ("peak_ckpt", p["activations_ckpt"])):
        p[name] = kept + max(p["rollout"], act + p["logprob_chunk"])
    return p


def needed_bytes(peak) -> int:
    """What a GPU must hold for a plan's peak: 10% allocator fragmentation + 1 GiB of CUDA context and cuBLAS
    workspace, in whole bytes (two plans of one shape then compare equal: the fitted layer costs may differ in their
    last float bit from one measurement to the next)."""
    return math.ceil(peak * 1.1 + GiB)


def fits(peak):
    return [name for name, cap in GPUS if needed_bytes(peak) <= cap]


def format_plan(p, header):
    gb = lambda x: f"{x / GiB:7.2f} GiB"
    lines = [header, f"parameters {p['params']:,}; trainable {p['trainable_params']:,}"]
    if p.get("attention_kernel"):
        lines.append(f"training attention on CUDA: the {KERNEL_NAMES[p['attention_kernel']]} kernel for a padded "
                     f"micro-batch (attention_kernels.cuda_kernel of the measured call; an unpadded one takes flash)")
    lines += ["", "| part | memory |", "|---|---|"]
    rows = [("weights", "weights"), ("trainable (fp32 weights + grads + AdamW m, v)", "trainable"),
            ("rollout: attention K/V cache", "kv_cache"), ("rollout: Gated DeltaNet state + conv", "gdn_state"),
            ("rollout: prefill transient (bound: one layer's training activations) + last logits", "prefill"),
            ("rollout: kept states, continued and kept (sampler reuse)", "kept_states"),
            ("fast decode: static cache, the longest call's length (kept)", "static_caches"),
            ("training: activations, no checkpointing", "activations"),
            ("training: activations, per-layer checkpointing", "activations_ckpt"),
            ("training: log-prob chunk + d logp/dh", "logprob_chunk"),
            ("**peak, no checkpointing**", "peak"), ("**peak, checkpointing** (--grad-checkpoint)", "peak_ckpt")]
    lines += [f"| {name} | {gb(p[key])} |" for name, key in rows]
    lines.append("")
    for key, what in (("peak", "without checkpointing"), ("peak_ckpt", "with --grad-checkpoint")):
        ok = fits(p[key])
        lines.append(f"fits {what}: {', '.join(ok) if ok else 'none of ' + ', '.join(n for n, _ in GPUS)} "
                     f"(needs {needed_bytes(p[key]) / 1e9:.1f} GB with 10% fragmentation + 1 GiB CUDA context)")
    return "\n".join(lines)


# ----------------------------------------------------------------------------------------------------------------
# from train.py's resolved arguments


def prompt_range(task):
    """(shortest, longest) prompt in tokens, estimated without a tokenizer: UTF-8 bytes / 3 (Qwen's BPE averages
    3.5-4.5 bytes per token on English and code) + 16 for the chat template. soyuz: its bundled tasks; gsm8k: the
    system prompt and a question of 100 to 900 characters (GSM8K's shortest and longest are about that); mdp: the
    mdp run's "full" prompt, ~330 tokens with the template (experiments/mdp_pipeline.py), rounded up."""
    if task == "soyuz":
        with open(os.path.join(DATA, "soyuz_tasks.json")) as f:
            sizes = [len(t["prompt"].encode()) // 3 + 16 for t in json.load(f)]
        return min(sizes), max(sizes)
    if task == "gsm8k":
        from minigrpo.tasks.gsm8k import SYSTEM_PROMPT
        return (len(SYSTEM_PROMPT.encode()) + 100) // 3 + 16, (len(SYSTEM_PROMPT.encode()) + 900) // 3 + 16
    if task == "terminal":          # the system turn (with the shell tool's schema) + the instruction
        from minigrpo.tasks.terminal.task import first_prompt_range
        return first_prompt_range()
    P = {"mdp": 400}.get(task, 64)
    return P, P


def run_shape(args, rows):
    """(Shape, settings dict) of the run train.py would start, per process. rows: the rows of its largest sampler
    call (train.decode_rows). soyuz samples its answers, then one revision per answer, whose prompts hold the
    answer and the critique; terminal's last turn holds every earlier turn: those are the longest calls and
    sequences, with one prompt per row; its episodes continue their kept states (sampler reuse), so a turn
    prefills its new tokens only, and an episode is trained as one sequence, its whole conversation, whose every
    policy turn's tokens get a log-prob. mdp: the GRPO stage of its pipeline (experiments/mdp_pipeline.PIPELINES),
    every task's samples in one call, whatever `rows` says."""
    if args.task == "mdp":
        from minigrpo.experiments.mdp_pipeline import pipeline_config
        c = pipeline_config(args.model)
        s = dict(lora_r=c.lora_r, group_size=c.group_size, tasks=c.grpo_tasks, max_new_tokens=c.max_new_tokens,
                 micro_batch=c.batch * 2, beta=c.grpo_beta, targets=DEFAULT_TARGETS, switches={})
        rows = c.grpo_tasks * c.group_size
    else:
        s = dict(lora_r=args.lora_r, group_size=args.group_size, tasks=args.tasks_per_step,
                 max_new_tokens=args.max_new_tokens, micro_batch=args.micro_batch, beta=args.beta,
                 targets=args.lora_targets.split(",") if args.lora_targets else DEFAULT_TARGETS,
                 switches={k: True for k in ("experts", "router") if getattr(args, f"lora_{k}", False)})
    (short, P), new, G = prompt_range(args.task), s["max_new_tokens"], s["group_size"]
    if args.task == "soyuz":
        longest = P + new + CRITIQUE_TOKENS  # a revision's prompt: task, answer, critique
        shape = Shape(rows, rows, longest, longest + new, s["micro_batch"], longest + new, new, short + new)
    elif args.task == "terminal":           # the last turn's prompt: every earlier turn and its tool output
        from minigrpo.tasks.terminal.task import MAX_TURNS, REPLY_TOKENS, longest_context
        turn = new + REPLY_TOKENS        # a turn's answer and its reply at the cap the loop cuts it to, in tokens
        longest = longest_context(P, new)
        shape = Shape(rows, rows, longest, longest + new, s["micro_batch"], longest + new, MAX_TURNS * new,
                      short + new, turn_tokens=turn)
    else:
        shape = Shape(max(1, rows // G), rows, P, P + new, s["micro_batch"], P + new, new, short + new)
    s["prompt_tokens"] = P
    return shape, s


def continued(shape):
    """The header's words for a task whose turns continue kept states ('' for the others)."""
    if not shape.turn_tokens:
        return ""
    return (f"\neach turn continues its episode's kept state: one row at a time prefills its ~{shape.turn_tokens} new "
            f"tokens; an episode trains as one sequence, {shape.completion_tokens} of its tokens the policy's")


def print_plan(args, rows):
    """Print the plan of the run train.py's `args` would start, whose largest sampler call has `rows` rows."""
    import sys
    dtype = getattr(torch, args.dtype) if args.dtype else torch.bfloat16
    cfg, source = load_config(args.model)
    shape, s = run_shape(args, rows)
    print(f"memory plan: measuring one layer of each kind on the CPU at {args.model}'s width...", file=sys.stderr)
    fast = getattr(args, "decode", None) != "eager"      # on CUDA train.py decodes with the fast path
    p = plan(cfg, shape, dtype, s["lora_r"], s["targets"], s["beta"], fast_decode=fast, **s["switches"])
    which = "every projection" if tuple(s["targets"]) == DEFAULT_TARGETS else ",".join(s["targets"])
    which += "".join(f" + the {k}" for k in s["switches"])
    lora = f"LoRA r={s['lora_r']} on {which}" if s["lora_r"] > 0 else "full fine-tune"
    header = (f"memory plan: --task {args.task}, model {args.model}, config {source}\n"
              f"{str(dtype)[6:]} (the CUDA default; --dtype to change), {lora}, one process; "
              f"G={s['group_size']}, {s['tasks']} tasks per step, max_new_tokens {s['max_new_tokens']}, "
              f"micro-batch {s['micro_batch']}, beta {s['beta']}\n"
              f"longest sampler call: {shape.rollout_rows} rows x {shape.slots} slots (prompt <= {shape.prompt_tokens} "
              f"tokens); static cache {p['static_slots'] or 'none'} slots; "
              f"trained micro-batch: {shape.micro_batch} x {shape.train_tokens} tokens "
              f"(task prompt ~{s['prompt_tokens']} tokens, estimated: UTF-8 bytes / 3 + 16"
              + {"soyuz": f"; + answer + {CRITIQUE_TOKENS}-token critique for soyuz's revision turn",
                 "terminal": f"; + 7 earlier turns, each with its reply at the loop's cap, "
                             f"{shape.turn_tokens - s['max_new_tokens']} tokens"}.get(args.task, "")
              + ")" + continued(shape))
    print(format_plan(p, header))
    return p
