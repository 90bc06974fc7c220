"""Attention on torch's fused CUDA kernels (minigrpo/attention.py), checked on the CPU: every attention
call the model makes (training with and without padding, prefill, eager and static decode) at the attention shapes
of each preset's model and Qwen2.5's is recorded and held to the fused kernels' rules (run/attention_kernels.py), so
a change that would send a call to the math kernel fails here; the new layouts give the old call's outputs and
gradients in fp32. On a CUDA machine the rules are also compared with torch's own kernel checks."""
import json
import os

import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

from minigrpo import model as model_mod, sampler, static_decode
from minigrpo.attention import attend
from minigrpo.model import Qwen
from minigrpo.pretrained import QwenConfig, load_pretrained
from minigrpo.run import attention_kernels
from minigrpo.run.attention_kernels import Recorder, cuda_kernel

from repo_root import ROOT

CONFIGS = os.path.join(ROOT, "minigrpo", "data", "configs")


def attention_config(name):
    """The model's attention shape (family, heads, head dim, rotary, gate) on a one-layer model of width 8: the
    kernel choice reads only the attention call's shapes, dtypes and strides."""
    if name == "Qwen3.5-4B":
        with open(os.path.join(CONFIGS, "Qwen3.5-4B.json")) as f:
            d = dict(json.load(f)["text_config"], model_type="qwen3_5_text")
    elif name == "Qwen3-1.7B-Base":
        with open(os.path.join(CONFIGS, "Qwen3-1.7B-Base.json")) as f:
            d = json.load(f)
    elif name.startswith("Qwen2.5"):  # config.json values of Qwen2.5-1.5B and -7B (no head_dim key: H / nh)
        nh, nkv, H = {"Qwen2.5-1.5B": (12, 2, 1536), "Qwen2.5-7B": (28, 4, 3584)}[name]
        d = dict(model_type="qwen2", num_attention_heads=nh, num_key_value_heads=nkv, head_dim=H // nh,
                 rope_theta=1e6)
    else:
        d = dict(QwenConfig.tiny(name).raw)
    d.update(hidden_size=8, intermediate_size=8, vocab_size=272, num_hidden_layers=1,
             layer_types=["full_attention"])
    return QwenConfig.from_dict(d, source=name)


# (preset, model, trained micro-batch B x T, sampler rows: prompts x samples, prompt length, max_new_tokens)
PRESETS = [("soyuz", "Qwen3.5-4B", 4, 2936, 1, 6, 1912, 1024),
           ("gsm8k", "Qwen3-1.7B-Base", 4, 880, 1, 4, 368, 512),
           ("synthetic", "tiny", 64, 24, 4, 32, 16, 8),
           ("qwen2.5", "Qwen2.5-1.5B", 4, 1024, 2, 4, 256, 64),
           ("qwen2.5", "Qwen2.5-7B", 2, 512, 2, 4, 128, 64)]


class Fp32Products(TorchDispatchMode):
    """bf16 matrix products on the CPU computed in fp32 and rounded to bf16: the same contiguous bf16 outputs, so
    the attention calls see the same shapes, dtypes and strides. Without AVX-512 the bf16 GEMM is 10x slower, and
    Qwen3.5-4B's q projection makes 8,192 features per token of a 4 x 2,936 micro-batch."""

    PRODUCTS = {torch.ops.aten.mm.default, torch.ops.aten.addmm.default, torch.ops.aten.bmm.default}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func in self.PRODUCTS and not kwargs and args[0].dtype == torch.bfloat16 and args[0].device.type == "cpu":
            return func(*(a.float() if isinstance(a, torch.Tensor) else a for a in args)).to(torch.bfloat16)
        return func(*args, **(kwargs or {}))


def record_every_path(cfg, B, T, P, n, L, new, dtype=torch.bfloat16):
    """{path: [Call]} of one forward along each path the runs take, the attention itself skipped (full lengths at
    no cost) and the products in fp32 (Fp32Products)."""
    torch.manual_seed(0)
    m = Qwen(cfg).to(dtype).eval()
    ids = torch.randint(0, 250, (B, T))
    pads = torch.ones(B, T, dtype=torch.long)
    pads[1:, :T // 3] = 0
    prompts = [[5] * L] * P
    ragged = [[5] * (L - 3 * i) for i in range(max(P, 2))]
    with torch.no_grad(), Fp32Products():
        return {
            "train, no padding": recorded(lambda: m.hidden(ids, attention_mask=torch.ones(B, T, dtype=torch.long))),
            "train, left padding": recorded(lambda: m.hidden(ids, attention_mask=pads)),
            "prefill, no padding": recorded(lambda: sampler.prefill(m, prompts, new, 0)),
            "prefill, ragged prompts": recorded(lambda: sampler.prefill(m, ragged, new, 0)),
            "decode, no padding": decode_calls(m, prompts, n, new, static=False),
            "decode, ragged prompts": decode_calls(m, ragged, n, new, static=False),
            "static decode": decode_calls(m, prompts, n, new, static=True),
        }


def recorded(fn):
    with Recorder(skip=True) as rec:
        fn()
    return rec.calls


def decode_calls(m, prompts, n, new, static):
    """The calls of two decode steps after a prefill (not recorded)."""
    L = max(map(len, prompts))
    with Recorder(skip=True):
        cache, _ = sampler.prefill(m, prompts, static_decode.bucket_len(L + new) - L if static else new, 0)
    if static:
        cache, step = static_decode.static_cache(m, cache, n, len(prompts) * n), static_decode.decode_step
    else:
        cache, step = cache.repeat_interleave(n), sampler.decode_step
    tokens = torch.full((len(prompts) * n,), 7)
    calls = recorded(lambda: (step(m, tokens, cache), step(m, tokens, cache)))
    static_decode.release(m)
    return calls


@pytest.mark.parametrize("preset, name, B, T, P, n, L, new", PRESETS, ids=[f"{p[0]}-{p[1]}" for p in PRESETS])
def test_every_attention_call_takes_a_fused_kernel(preset, name, B, T, P, n, L, new):
    for path, calls in record_every_path(attention_config(name), B, T, P, n, L, new).items():
        assert calls, path
        for c in calls:
            kernel = cuda_kernel(c)
            assert kernel != "math", (preset, name, path, c)
            # no mask where there is no padding: flash; a mask only with equal head counts: memory-efficient
            assert (kernel == "flash") == (c.mask is None), (path, c)
            assert c.mask is None or c.q[0][1] == c.k[0][1], (path, c)
        # a mask only where there are pads (or unwritten slots: the static cache)
        assert all(c.mask is None for c in calls) == path.endswith("no padding"), path


def old_attend(q, k, v, mask):
    """The call before attention.py, with the full causal mask where Qwen.hidden now passes None."""
    T, S = q.shape[2], k.shape[2]
    if mask is None:
        mask = torch.ones(T, S, dtype=torch.bool).tril(S - T)[None, None]
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=q.shape[1] != k.shape[1])


@pytest.mark.parametrize("nh, nkv", [(4, 2), (16, 4), (12, 2), (4, 4)])
@pytest.mark.parametrize("T, S, masked", [(7, 7, True), (7, 7, False), (1, 9, True), (1, 9, False), (3, 10, True)])
def test_layouts_give_the_old_outputs_and_gradients(nh, nkv, T, S, masked):
    g = torch.Generator().manual_seed(nh * 100 + T * 10 + S)
    B, hd = 3, 16
    q, k, v = (torch.randn(B, h, n, hd, generator=g, requires_grad=True) for h, n in ((nh, T), (nkv, S), (nkv, S)))
    mask = None
    if masked:
        keys = torch.ones(B, S, dtype=torch.bool)
        keys[1, :2] = False
        mask = model_mod.attention_mask_4d(keys, S - T, T)
    outs = []
    for fn in (attend, old_attend):
        y = fn(q, k, v, mask)
        grads = torch.autograd.grad((y * torch.arange(y.numel()).view_as(y).sin()).sum(), (q, k, v))
        outs.append((y, *grads))
    for new, old in zip(*outs):
        torch.testing.assert_close(new, old, rtol=1e-6, atol=1e-6)     # fp32: used up to 29% (1 and 2 threads)


def test_masked_attention_of_several_queries_runs_without_cudnn_on_cuda(monkeypatch):
    """cuDNN's attention can return NaN gradients for masked calls on H100/H200 (torch 2.13): a masked call of several
    queries on CUDA (a padded training micro-batch, a padded prefill) runs with it off; decode (one query), unmasked
    calls and the CPU keep torch's default. The flag SDPA would see, with the tensor's device stood in (no GPU here),
    and `attend` makes its call inside that choice."""
    from types import SimpleNamespace
    from minigrpo import attention
    mask = torch.ones(2, 1, 7, 7, dtype=torch.bool)
    seen = {}
    for device, T, m in (("cuda", 7, mask), ("cuda", 1, mask[:, :, :1]), ("cuda", 7, None), ("cpu", 7, mask)):
        with attention.kernel_choice(SimpleNamespace(shape=(2, 4, T, 16), device=torch.device(device)), m):
            seen[device, T, m is not None] = torch.backends.cuda.cudnn_sdp_enabled()
    assert seen == {("cuda", 7, True): False, ("cuda", 1, True): True, ("cuda", 7, False): True,
                    ("cpu", 7, True): True} and torch.backends.cuda.cudnn_sdp_enabled()
    calls = []
    real = attention.kernel_choice
    monkeypatch.setattr(attention, "kernel_choice", lambda q, m: calls.append(m is not None) or real(q, m))
    q = torch.randn(2, 4, 7, 16)
    attend(q, q[:, :2], q[:, :2], mask)
    assert calls == [True]


@pytest.mark.parametrize("kind", ["tiny", "tiny-qwen3.5"])
def test_model_outputs_equal_the_old_attention(kind, monkeypatch):
    """Whole forwards (training with and without padding, prefill then decode) in fp32: the new calls against
    the old one, which always passed a mask."""
    m = load_pretrained(kind)
    ids = torch.randint(0, 250, (3, 20), generator=torch.Generator().manual_seed(1))
    pads = torch.ones(3, 20, dtype=torch.long)
    pads[0, :6] = 0

    def run():
        with torch.no_grad():
            out = [m(ids), m(ids, attention_mask=pads)]
            for prompts in ([[5, 6, 7, 8]] * 2, [[5, 6, 7, 8], [9, 10]]):
                cache, logits = sampler.prefill(m, prompts, 4, 0)
                out.append(logits)
                tok = logits.argmax(-1)
                for _ in range(3):
                    logits = sampler.decode_step(m, tok, cache)
                    out.append(logits)
                    tok = logits.argmax(-1)
            return out

    new = run()
    monkeypatch.setattr(model_mod, "attend", old_attend)
    for a, b in zip(new, run()):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


@pytest.mark.skipif(not torch.cuda.is_available(),
                    reason="needs a CUDA device: it compares the rules with torch's own checks there")
def test_rules_agree_with_torch_on_cuda():
    from torch.backends.cuda import SDPAParams, can_use_efficient_attention, can_use_flash_attention
    cfg = attention_config("Qwen3.5-4B")
    calls = [c for cs in record_every_path(cfg, 2, 256, 1, 2, 128, 64).values() for c in cs]
    for c in calls:
        t = [on_cuda(*meta, c.dtype) for meta in (c.q, c.k, c.v)]
        mask = None if c.mask is None else torch.zeros(c.mask[0], dtype=c.dtype, device="cuda")
        p = SDPAParams(*t, mask, 0.0, c.is_causal, c.enable_gqa)
        assert can_use_flash_attention(p) == attention_kernels.can_flash(c), c
        assert can_use_efficient_attention(p) == attention_kernels.can_mem_efficient(c), c


def on_cuda(shape, stride, offset, dtype):
    """A CUDA tensor with the recorded shape, strides and storage offset (the kernel checks read all three)."""
    n = offset + sum((d - 1) * st for d, st in zip(shape, stride)) + 1
    return torch.empty(n, dtype=dtype, device="cuda").as_strided(shape, stride, offset)
