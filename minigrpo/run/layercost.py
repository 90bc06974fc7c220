"""What one decoder layer keeps for backward, and what its backward holds on top, measured rather than guessed.

One layer of each kind is built at the config's width (random values, no checkpoint read), LoRA injected as the
run would, and run forward and backward on the CPU with B = 1 at a few lengths. `saved_tensors_hooks` adds up every
tensor autograd keeps for backward; a dispatch mode follows every tensor the backward makes from the op that makes
it until its storage is freed, which gives the most bytes the backward holds beyond the saved ones (its working
set). Each of the two is then fitted as

    bytes(B, T) = fixed + B * (per_token * T + per_token2 * T^2)

with every term >= 0 (a non-negative least-squares fit over three or more lengths). `fixed` is what does not grow
with the batch (the LoRA weights' gradients the backward makes), per_token2 the attention mask's bytes. Without
the constraint a fit can read the fixed LoRA gradients as a negative T^2 term, which at the long lengths a plan
extrapolates to cancels real activations: a plan must never count less than nothing.

Attention: the attention layer is measured as a padded micro-batch runs it (with a mask: most micro-batches have
pads). Its one scaled_dot_product_attention call is recorded (attention_kernels.Recorder) and
attention_kernels.cuda_kernel names the CUDA kernel that call takes, the same rules the model's attention calls are
tested against; what that kernel keeps for backward (its autograd node run on meta tensors: torch's own shape
functions) replaces what the CPU's kernel kept. The memory-efficient kernel keeps what the CPU's does (q, expanded k
and v, output, log-sum-exp, the mask as a (B, 1, T, S) bias); the math kernel would add its (B, nh, T, S) fp32
scores.

Letters: B rows, T tokens per sequence, S key slots.
"""

import itertools
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from minigrpo.lora import DEFAULT_TARGETS, inject_lora
from minigrpo.model import Block, RMSNorm, Rotary, attention_mask_4d
from minigrpo.moe import Experts, is_sparse_layer
from minigrpo.run.attention_kernels import Recorder, cuda_kernel

# multiples of Gated DeltaNet's 64-token chunk, from two chunks on (from the second chunk on each chunk also keeps
# the incoming state: with one chunk the fit is off), three of them so that a fit has a length to be checked on
LENGTHS = (128, 256, 512)


@dataclass
class LayerCost:
    per_token: float      # bytes per token
    per_token2: float     # bytes per token^2 of one sequence (the attention mask, CPU and CUDA kernels alike)
    fixed: float = 0.0    # bytes whatever B and T (the LoRA gradients of the layer's backward)
    backward: "LayerCost | None" = None   # the same form for the backward's working set beyond the saved bytes

    def bytes(self, B, T):
        return self.fixed + B * (self.per_token * T + self.per_token2 * T * T)

    @staticmethod
    def fit(lengths, measured):
        """The non-negative (fixed, per_token, per_token2) closest to B = 1 measurements at three or more lengths,
        each length weighted by its own size (relative errors). With three terms the constrained optimum is the
        least-squares fit of one subset of them whose terms all come out >= 0: every subset is tried."""
        if len(lengths) < 3:
            raise ValueError(f"a fit needs three or more lengths, got {list(lengths)}")
        T = torch.tensor(lengths, dtype=torch.float64)
        y = torch.tensor(measured, dtype=torch.float64)
        w = 1 / y.clamp(min=1)
        X = torch.stack([torch.ones_like(T), T, T * T], 1) * w[:, None]
        best, best_err = torch.zeros(3, dtype=torch.float64), (y * w).square().sum()
        for k in (1, 2, 3):
            for cols in itertools.combinations(range(3), k):
                sub = torch.linalg.lstsq(X[:, cols], (y * w)[:, None]).solution[:, 0]
                err = (X[:, cols] @ sub - y * w).square().sum()
                if (sub >= 0).all() and err < best_err:
                    best, best_err = torch.zeros(3, dtype=torch.float64).index_put((torch.tensor(cols),), sub), err
        fixed, per_token, per_token2 = best.tolist()
        return LayerCost(per_token, per_token2, fixed)


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
        out = _product(func, args, kwargs or {})
        self.sweep()
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor) and t.device.type != "meta":
                st = t.untyped_storage()
                if st.data_ptr() and st.data_ptr() not in self.alive:
                    self.alive[st.data_ptr()] = (StorageWeakRef(st), st.nbytes())
                    self.live += st.nbytes()
        self.peak = max(self.peak, self.live)
        return out


# Matrix products whose bf16 CPU kernel can be 40x slower than fp32's (without AVX-512 the bf16 GEMM takes a
# scalar path for some operand layouts): what a layer keeps does not depend on how a product is computed, so these
# are computed in fp32 and rounded to the dtype they would have had. The fp32 copies live inside this one call.
_PRODUCTS = {torch.ops.aten.mm.default, torch.ops.aten.addmm.default, torch.ops.aten.bmm.default}


def _product(func, args, kwargs):
    tensors = [a for a in args if isinstance(a, torch.Tensor)]
    if func not in _PRODUCTS or tensors[0].dtype != torch.bfloat16 or tensors[0].device.type != "cpu" or kwargs:
        return func(*args, **kwargs)
    return func(*(a.float() if isinstance(a, torch.Tensor) else a for a in args)).to(torch.bfloat16)


def measure(fn, skip, backward=True):
    """(bytes autograd saves in fn(), bytes its backward holds at most beyond them). Each storage counts once; the
    storages in `skip` (parameters, inputs shared by all layers) not at all. The backward runs from a gradient of
    ones on fn()'s output, so every saved tensor is used and freed as in training."""
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


def saved_bytes(fn, skip):
    """The bytes autograd saves for backward in fn() (see measure)."""
    return measure(fn, skip, backward=False)[0]


def layer_keys(cfg):
    """Per layer, what its cost depends on: its attention kind, with "+experts" where its MLP is sparse (moe.py:
    Qwen3-MoE may mix dense MLP layers among the sparse ones)."""
    return [kind + "+experts" * is_sparse_layer(cfg, i) for i, kind in enumerate(cfg.layer_types)]


def layer(cfg, key, dtype, lora_r, targets=DEFAULT_TARGETS, **switches):
    """One decoder layer of `key` (layer_keys) at the config's width, random values, LoRA injected as the run
    would (switches: lora.inject_lora's experts and router, where the layer has them)."""
    wdtype = dtype if lora_r > 0 else torch.float32  # a full fine-tune trains fp32 weights (train.build_policy)
    i = layer_keys(cfg).index(key)
    with torch.device("meta"):
        block = Block(cfg, cfg.layer_types[i], i)
    block.to_empty(device="cpu")
    with torch.no_grad():
        for p in block.parameters():
            p.normal_(0, 0.02) if p.ndim > 1 else p.fill_(0.1)
    block.to(wdtype)
    for m in block.modules():   # the experts' loop: what they keep is the grouped matmul's (docs/memory.md), and
        if isinstance(m, Experts):  # its products run in fp32 here (_product), where _grouped_mm's bf16 is slow
            m.grouped = False
    if lora_r > 0:
        sparse = "+experts" in key
        inject_lora(block, r=lora_r, alpha=lora_r, targets=targets, **{k: v and sparse for k, v in switches.items()})
    return block


def measure_layer(cfg, block, T, found=None):
    """(saved bytes, backward working set) of `block` over one padded-layout sequence of T tokens; the attention
    call's CUDA kernel is put in found["attention_kernel"], and what that kernel keeps replaces the CPU's."""
    wdtype = next(block.parameters()).dtype
    x = torch.randn(1, T, cfg.hidden_size, dtype=wdtype, requires_grad=True)
    real_tokens = torch.ones(1, T, dtype=torch.bool)
    mask = attention_mask_4d(real_tokens, 0, T)  # as for a padded micro-batch
    cos, sin = Rotary(cfg.head_dim, cfg.rope_theta, cfg.partial_rotary_factor)(torch.arange(T)[None], x.dtype)
    shared = [t.untyped_storage().data_ptr() for t in (cos, sin, mask, real_tokens)]
    shared += [p.untyped_storage().data_ptr() for p in block.parameters()]
    with Recorder() as rec:
        saved, grads = measure(lambda: block(x, (cos, sin), attn_mask=mask, real_tokens=real_tokens), shared)
    for call in rec.calls:  # the attention layer's one call: what the CUDA kernel keeps instead
        if found is not None:
            found["attention_kernel"] = cuda_kernel(call)
        saved += kernel_saved_bytes(call, "cuda") - kernel_saved_bytes(call, "cpu")
    return saved, grads


def layer_costs(cfg, dtype, lora_r, targets=DEFAULT_TARGETS, lengths=LENGTHS, **switches):
    """{layer key (layer_keys): LayerCost} of the policy pass with gradients, plus "final_norm" and "attention_kernel" (the
    CUDA kernel of the attention layer's call), measured on the CPU at the config's width, B = 1, at `lengths`."""
    costs = {}
    for key in dict.fromkeys(layer_keys(cfg)):
        block = layer(cfg, key, dtype, lora_r, targets, **switches)
        measured = [measure_layer(cfg, block, T, costs) for T in lengths]
        costs[key] = LayerCost.fit(lengths, [m[0] for m in measured])
        costs[key].backward = LayerCost.fit(lengths, [m[1] for m in measured])
        del block
    wdtype = dtype if lora_r > 0 else torch.float32
    norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, cfg.family == "qwen3_5").to(wdtype)  # before the head
    x = torch.randn(1, 128, cfg.hidden_size, dtype=wdtype, requires_grad=True)
    costs["final_norm"] = LayerCost(saved_bytes(lambda: norm(x), [norm.weight.untyped_storage().data_ptr()]) / 128, 0)
    return costs


def kernel_saved_bytes(call, where):
    """Bytes the autograd node of one attention call keeps for backward: where="cpu" as the CPU's SDPA runs it,
    "cuda" as the CUDA kernel attention_kernels.cuda_kernel names for it (run on meta tensors: no GPU, no memory)."""
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
