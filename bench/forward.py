"""Prefill time of minigrpo's Qwen vs transformers' on the same random-weight Qwen3-0.6B-shaped model.

    python bench/forward.py                      # B=1, T=512: fp32 with all 28 layers, bf16 with 4
    python bench/forward.py --bf16-layers 28     # the full bf16 model (slow on CPUs without native bf16)

Both models share the very same weight tensors (ours is assigned transformers' parameters, no copy), so memory is
one model per dtype. Timings alternate ours / transformers on each repeat so that machine noise hits both alike;
the table shows medians, the ratio of medians and of best times (the least disturbed run of each, robust on a
shared machine), all measured in this run. transformers runs with its default attention (SDPA).
"""

import argparse
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # run from anywhere
from minigrpo.model import Qwen  # noqa: E402
from minigrpo.pretrained import QwenConfig  # noqa: E402


def qwen3_0_6b_config(layers):
    from transformers import Qwen3Config
    return Qwen3Config(vocab_size=151936, hidden_size=1024, intermediate_size=3072, num_hidden_layers=layers,
                       num_attention_heads=16, num_key_value_heads=8, head_dim=128, rope_theta=1e6,
                       tie_word_embeddings=True, rms_norm_eps=1e-6, max_position_embeddings=40960)


def build_pair(layers, dtype):
    from transformers import AutoModelForCausalLM
    hf_cfg = qwen3_0_6b_config(layers)
    torch.manual_seed(0)
    hf = AutoModelForCausalLM.from_config(hf_cfg, dtype=dtype, attn_implementation="sdpa").eval()
    with torch.device("meta"):
        ours = Qwen(QwenConfig.from_dict(hf_cfg.to_dict()))
    ours.load_state_dict(hf.state_dict(), strict=False, assign=True)  # shares hf's tensors
    ours.lm_head.weight = ours.model.embed_tokens.weight
    ours.model.rotary.inv_freq = ours.model.rotary._inv_freq("cpu")
    return ours, hf


def timed(fn):
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


def bench(dtype, layers, args):
    ours, hf = build_pair(layers, dtype)
    ids = torch.randint(0, 151643, (args.batch, args.seq), generator=torch.Generator().manual_seed(0))
    run_ours = lambda: ours(ids)
    run_hf = lambda: hf(ids).logits
    t_ours, t_hf = [], []
    with torch.inference_mode():
        _, a = timed(run_ours)  # warmup (and the parity check below)
        _, b = timed(run_hf)
        diff = (a.float() - b.float()).abs().max().item()
        for _ in range(args.repeats):
            t_ours.append(timed(run_ours)[0])
            t_hf.append(timed(run_hf)[0])
    del ours, hf
    return t_ours, t_hf, diff


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--layers", type=int, default=28, help="decoder layers for fp32")
    p.add_argument("--bf16-layers", type=int, default=4,
                   help="decoder layers for bf16: CPUs without native bf16 run it ~10x slower than fp32")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--seq", type=int, default=512)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--dtypes", default="float32,bfloat16")
    args = p.parse_args()
    import transformers
    print(f"Qwen3-0.6B shape (V=151936, H=1024, 16/8 heads), B={args.batch}, T={args.seq}, median of {args.repeats} "
          f"after 1 warmup; torch {torch.__version__}, transformers {transformers.__version__}, "
          f"{torch.get_num_threads()} threads")
    print(f"{'dtype':<10}{'layers':>7}{'ours (s)':>10}{'hf (s)':>10}{'hf/ours':>9}{'best-of hf/ours':>17}"
          f"{'max|dlogits|':>14}")
    for name in args.dtypes.split(","):
        layers = args.bf16_layers if name == "bfloat16" else args.layers
        t_ours, t_hf, diff = bench(getattr(torch, name), layers, args)
        med_ours, med_hf = statistics.median(t_ours), statistics.median(t_hf)
        print(f"{name:<10}{layers:>7}{med_ours:>10.3f}{med_hf:>10.3f}{med_hf / med_ours:>9.2f}"
              f"{min(t_hf) / min(t_ours):>17.2f}{diff:>14.2e}", flush=True)


if __name__ == "__main__":
    main()
