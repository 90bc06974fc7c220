"""Throughput of minigrpo.sampler.sample vs transformers' generate, same random weights, same run.

Workloads (64 new tokens, T=1, no truncation, no early stop):
  1x6   one 128-token prompt, 6 samples: the GRPO group case. generate(num_return_sequences=6) prefills the prompt
        6 times; sample prefills it once and copies the cache.
  4x6   four prompts (128, 112, 96, 80 tokens, left-padded), 6 samples each.
Models: Qwen3-0.6B-shaped (vocab 151936, 28 layers) and a Qwen3.5-0.8B-shaped hybrid with fewer layers, in fp32
and bf16. Peak memory is the extra high-water mark of the run: CUDA max_memory_allocated, or on CPU the process's
peak RSS (VmHWM, reset through /proc/self/clear_refs) minus the RSS before the run.

    python bench/sampler.py                      # the full table (CPU: several minutes)
    python bench/sampler.py --layers 4 --qwen35-layers 4 --new-tokens 16    # a quick look on 2 cores
"""

import argparse
import gc
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # run from anywhere

from minigrpo.model import Qwen
from minigrpo.pretrained import QwenConfig
from minigrpo.sampler import Settings, sample

QWEN3_0_6B = dict(model_type="qwen3", architectures=["Qwen3ForCausalLM"], vocab_size=151936, hidden_size=1024,
                  intermediate_size=3072, num_hidden_layers=28, num_attention_heads=16, num_key_value_heads=8,
                  head_dim=128, rms_norm_eps=1e-6, rope_theta=1e6, tie_word_embeddings=True, attention_bias=False,
                  max_position_embeddings=40960, hidden_act="silu", eos_token_id=151645, pad_token_id=151643)
QWEN3_5_0_8B = dict(model_type="qwen3_5_text", architectures=["Qwen3_5ForCausalLM"], vocab_size=248320,
                    hidden_size=1024, intermediate_size=3584, num_hidden_layers=24, num_attention_heads=8,
                    num_key_value_heads=2, head_dim=256, rms_norm_eps=1e-6, tie_word_embeddings=True,
                    rope_parameters={"rope_type": "default", "rope_theta": 1e7, "partial_rotary_factor": 0.25},
                    linear_conv_kernel_dim=4, linear_num_key_heads=16, linear_num_value_heads=16,
                    linear_key_head_dim=128, linear_value_head_dim=128, max_position_embeddings=262144,
                    hidden_act="silu", eos_token_id=248046, pad_token_id=248044)
WORKLOADS = {"1x6": [128], "4x6": [128, 112, 96, 80]}


def build_pair(raw, layers, dtype):
    """The same random weights in a transformers model and in ours (ours shares HF's tensors: no copy)."""
    from transformers import AutoConfig, AutoModelForCausalLM
    raw = dict(raw, num_hidden_layers=layers)
    if raw["model_type"] == "qwen3_5_text":
        raw["layer_types"] = ["full_attention" if (i + 1) % 4 == 0 else "linear_attention" for i in range(layers)]
    d = dict(raw)
    cfg = AutoConfig.for_model(d.pop("model_type"), **d)
    torch.manual_seed(0)
    with torch.device(args.device):  # random init on the device: seconds on a GPU, minutes for 4B on a CPU
        hf = AutoModelForCausalLM.from_config(cfg, dtype=dtype).eval()
    with torch.device("meta"):
        ours = Qwen(QwenConfig.from_dict(raw))
    ours.load_state_dict(hf.state_dict(), assign=True)
    ours.lm_head.weight = ours.model.embed_tokens.weight  # keep the tie after assign
    rot = ours.model.rotary
    rot.inv_freq = rot._inv_freq(args.device)  # a non-persistent buffer, still on meta
    return hf, ours.eval()


def prompts_for(lengths, vocab):
    g = torch.Generator().manual_seed(1)
    top = vocab - 1000 if vocab > 2000 else vocab - 16  # clear of the special tokens at the end (tiny: bytes)
    return [torch.randint(0, top, (n,), generator=g).tolist() for n in lengths]


def run_hf(hf, prompts, n, new_tokens, **generate_kw):
    L = max(map(len, prompts))
    ids = torch.full((len(prompts), L), hf.config.pad_token_id, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, p in enumerate(prompts):
        ids[i, L - len(p):], mask[i, L - len(p):] = torch.tensor(p), 1
    out = hf.generate(ids.to(args.device), attention_mask=mask.to(args.device), do_sample=True, temperature=1.0,
                      top_k=0, top_p=1.0, num_return_sequences=n, max_new_tokens=new_tokens,
                      min_new_tokens=new_tokens, eos_token_id=None, pad_token_id=hf.config.pad_token_id,
                      **generate_kw)
    return out.shape[0] * (out.shape[1] - L)


def run_ours(model, prompts, n, new_tokens):
    settings = Settings(n=n, max_new_tokens=new_tokens, temperature=1.0, stop_ids=(), compile=args.compile)
    out = sample(model, prompts, settings, seed=0)
    return sum(len(s.completion_ids) for s in out)


def rss_kb(field):
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(field))


def measure_once(fn, *a):
    """(seconds, tokens, peak extra memory in MB) of one call."""
    gc.collect()
    cuda = args.device.startswith("cuda")
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
    else:
        open("/proc/self/clear_refs", "w").write("5")  # reset the peak RSS
        base = rss_kb("VmRSS:") * 1024
    t = time.perf_counter()
    tokens = fn(*a)
    if cuda:
        torch.cuda.synchronize()
    dt = time.perf_counter() - t
    peak = torch.cuda.max_memory_allocated() if cuda else rss_kb("VmHWM:") * 1024
    return dt, tokens, (peak - base) / 2**20


def measure_pair(hf, ours, prompts):
    """Best of --repeats for each side, the two sides interleaved (a shared machine's load hits both alike),
    after one short warm-up each. Returns ((our tok/s, our MB), (hf tok/s, hf MB))."""
    run_ours(ours, prompts, 6, 2)
    run_hf(hf, prompts, 6, 2)
    best = {"ours": None, "hf": None}
    for _ in range(args.repeats):
        for side, fn, m in (("hf", run_hf, hf), ("ours", run_ours, ours)):
            dt, tokens, mb = measure_once(fn, m, prompts, 6, args.new_tokens)
            if best[side] is None or dt < best[side][0]:
                best[side] = (dt, tokens, mb)
    return [(tokens / dt, mb) for dt, tokens, mb in (best["ours"], best["hf"])]


def bench_model(name, raw, layers):
    rows = []
    for dtype in args.dtypes:
        hf, ours = build_pair(raw, layers, getattr(torch, dtype))
        for wl in args.workloads:
            prompts = prompts_for([min(n, args.prompt_len) for n in WORKLOADS[wl]], raw["vocab_size"])
            with torch.no_grad():
                (our_tps, our_mem), (hf_tps, hf_mem) = measure_pair(hf, ours, prompts)
            rows.append((name, dtype, wl, our_tps, hf_tps, our_mem, hf_mem))
            print(fmt(rows[-1]), flush=True)
        del hf, ours
        gc.collect()
    return rows


def fmt(r):
    name, dtype, wl, ours, hf, om, hm = r
    return (f"| {name} | {dtype} | {wl} | {ours:8.1f} | {hf:8.1f} | **{ours / hf:4.2f}x** | "
            f"{om:7.0f} | {hm:7.0f} |")


def main():
    torch.set_grad_enabled(False)
    print(f"device {args.device}, threads {torch.get_num_threads()}, torch {torch.__version__}, "
          f"{args.new_tokens} new tokens, prompts <= {args.prompt_len} tokens, compile={args.compile}")
    print("| model | dtype | prompts x samples | sample tok/s | generate tok/s | ratio | sample peak MB | "
          "generate peak MB |\n|---|---|---|---|---|---|---|---|", flush=True)
    if args.layers:
        bench_model(f"Qwen3-0.6B shape, {args.layers} layers", QWEN3_0_6B, args.layers)
    if args.qwen35_layers:
        bench_model(f"Qwen3.5-0.8B shape, {args.qwen35_layers} layers", QWEN3_5_0_8B, args.qwen35_layers)


args = None  # the parsed flags below; bench/device.py sets its own (device, compile, repeats, new_tokens)

if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"], choices=["float32", "bfloat16"])
    p.add_argument("--workloads", nargs="+", default=list(WORKLOADS), choices=list(WORKLOADS))
    p.add_argument("--layers", type=int, default=28, help="Qwen3-0.6B-shaped layers (0: skip)")
    p.add_argument("--qwen35-layers", type=int, default=8, help="Qwen3.5-0.8B-shaped layers (0: skip)")
    p.add_argument("--new-tokens", type=int, default=64)
    p.add_argument("--prompt-len", type=int, default=128, help="cap on prompt lengths (shrinks both workloads)")
    p.add_argument("--repeats", type=int, default=2, help="timed runs per side; the best counts")
    p.add_argument("--compile", action="store_true", help="sample(..., Settings(compile=True))")
    args = p.parse_args()
    main()
