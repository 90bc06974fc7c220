"""The CPU restatement of torch's attention-kernel choice (minigrpo/run/attention_kernels.py) on the cases the
attention layouts rely on. tests/model/test_attention.py holds every call of the model to these rules and, on a CUDA
machine, compares them with torch's own checks."""
import torch

from minigrpo.run.attention_kernels import Call, cuda_kernel


def test_the_old_call_took_math_and_the_rules_hold():
    """The call this code made before (a boolean mask with enable_gqa, nh != nkv) falls to math; the rules of
    torch 2.13 for the cases the layouts rely on."""
    q, k = torch.zeros(2, 16, 5, 256, dtype=torch.bfloat16), torch.zeros(2, 4, 5, 256, dtype=torch.bfloat16)
    mask = torch.ones(2, 1, 5, 5, dtype=torch.bool)
    call = Call.of
    assert cuda_kernel(call(q, k, k, attn_mask=mask, enable_gqa=True)) == "math"
    assert cuda_kernel(call(q, k, k, is_causal=True, enable_gqa=True)) == "flash"
    assert cuda_kernel(call(q, k, k, is_causal=True)) == "math"                     # GQA without the flag
    assert cuda_kernel(call(q.float(), k.float(), k.float(), is_causal=True, enable_gqa=True)) == "math"  # fp32
    kx = k.repeat_interleave(4, dim=1)
    assert cuda_kernel(call(q, kx, kx, attn_mask=mask)) == "efficient"
    assert cuda_kernel(call(q.float(), kx.float(), kx.float(), is_causal=True)) == "efficient"
    assert cuda_kernel(call(q[:, :, :1], kx, kx, is_causal=True)) == "efficient"   # flash: causal needs T == S
    odd = torch.zeros(2, 16, 5, 100, dtype=torch.bfloat16)                          # 100 % 8 != 0
    assert cuda_kernel(call(odd, odd, odd, attn_mask=mask)) == "math"
    big = torch.zeros(2, 16, 5, 512, dtype=torch.bfloat16)
    assert cuda_kernel(call(big, big, big)) == "efficient"                           # flash: head dim <= 256
    shifted = torch.zeros(2 * 16 * 5 * 256 + 4, dtype=torch.bfloat16)[4:].view(2, 16, 5, 256)
    assert cuda_kernel(call(shifted, kx, kx, attn_mask=mask)) == "math"             # storage offset 4 elements
