"""Peak memory and time of logprobs.token_logprobs (chunked, fused lm_head) vs the naive full-logits log-softmax.

    python bench/logprobs.py                       # B=8, T=1024, V=151936, forward and forward+backward
    python bench/logprobs.py --seq 256 --chunk 256 # a smaller run
    python bench/logprobs.py --device cuda         # peak = torch.cuda.max_memory_allocated

The model is a small Qwen (hidden 64, 1 layer) with the real Qwen vocabulary of 151936 rows, so the lm_head and
the (B, T, V) log-softmax dominate, as they do for a real model's log-prob pass. The naive twin is
log_softmax(model(ids)[:, :-1].float() / T) gathered: it materialises several (B, T, V) fp32 tensors (5 GB each at
the default size) and autograd keeps one alive until backward. Each measurement runs in its own subprocess, so
peaks never mix; on CPU the peak is the growth of the process's maximum resident set (ru_maxrss) over its value
after building the model and a small warm-up run. A naive run whose estimated need exceeds the free memory is
skipped (use a smaller --seq).

Measured on the shared 2-core CPU box (2 threads, other jobs running; ~10 minutes for the four processes), with the
fused lm_head (trainable head: backward recomputes each chunk's logits):
    forward           naive 9.14 GB  chunked 0.44 GB  20.6x lower   time 0.93x of naive
    forward+backward  naive 13.76 GB chunked 0.64 GB  21.5x lower   time 1.02x of naive
"""

import argparse
import json
import os
import resource
import subprocess
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # run from anywhere

from minigrpo.logprobs import token_logprobs  # noqa: E402
from minigrpo.model import Qwen  # noqa: E402
from minigrpo.pretrained import QwenConfig  # noqa: E402

GB = 1024 ** 3


def build_model(args):
    raw = dict(QwenConfig.tiny("tiny").raw, vocab_size=args.vocab, hidden_size=args.hidden,
               intermediate_size=2 * args.hidden, num_hidden_layers=args.layers)
    torch.manual_seed(0)
    return Qwen(QwenConfig.from_dict(raw)).to(args.device)


def naive_logprobs(model, ids, temperature):
    logits = model(ids)[:, :-1].float() / temperature  # (B, T-1, V) fp32, all at once
    return torch.log_softmax(logits, -1).gather(-1, ids[:, 1:, None]).squeeze(-1)


def run(fn, args):
    if args.backward:
        fn().sum().backward()
    else:
        with torch.no_grad():
            fn()


def peak_bytes(device):
    if device == "cuda":
        return torch.cuda.max_memory_allocated()
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB


def child(args):
    """One measurement: build, warm up (one-time imports and allocations), then the measured call."""
    torch.set_num_threads(args.threads)
    model = build_model(args)
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, args.vocab, (args.batch, args.seq), generator=g).to(args.device)
    if args.impl == "naive":
        fn = lambda x: naive_logprobs(model, x, args.temperature)
    else:
        chunk = args.chunk if args.chunk == "auto" else int(args.chunk)
        fn = lambda x: token_logprobs(model, x, temperature=args.temperature, chunk=chunk)
    run(lambda: fn(ids[:, :16]), args)
    model.zero_grad(set_to_none=True)
    if args.device == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated() if args.device == "cuda" else peak_bytes("cpu")
    t0 = time.perf_counter()
    run(lambda: fn(ids), args)
    if args.device == "cuda":
        torch.cuda.synchronize()
    seconds = time.perf_counter() - t0
    print(json.dumps({"peak": peak_bytes(args.device) - base, "seconds": seconds}))


def mem_available():
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    return float("inf")


def measure(impl, backward, args):
    full = args.batch * (args.seq - 1) * args.vocab * 4  # one (B, T-1, V) fp32 tensor
    need = full * (4 if backward else 3) if impl == "naive" else full // 2
    if args.device == "cpu" and need > mem_available():
        return None, f"skipped: needs ~{need / GB:.1f} GB, {mem_available() / GB:.1f} GB free"
    cmd = [sys.executable, os.path.abspath(__file__), "--child", "--impl", impl]
    cmd += ["--backward"] if backward else []
    for k in ("batch", "seq", "vocab", "hidden", "layers", "chunk", "temperature", "device", "threads"):
        cmd += [f"--{k}", str(getattr(args, k))]
    out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode != 0:
        return None, f"failed (exit {out.returncode}): {out.stderr.strip().splitlines()[-1:]}"
    return json.loads(out.stdout.strip().splitlines()[-1]), ""


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq", type=int, default=1024)
    p.add_argument("--vocab", type=int, default=151936)
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--layers", type=int, default=1)
    p.add_argument("--chunk", default="auto", help="logit rows per chunk, as logprobs.token_logprobs(chunk=)")
    p.add_argument("--temperature", type=float, default=0.8)
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--threads", type=int, default=min(2, os.cpu_count() or 1))
    p.add_argument("--modes", default="forward,backward", help="comma list of forward, backward")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--impl", choices=["naive", "chunked"], help=argparse.SUPPRESS)
    p.add_argument("--backward", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        return child(args)

    print(f"B={args.batch} T={args.seq} V={args.vocab} hidden={args.hidden} layers={args.layers} "
          f"chunk={args.chunk} rows device={args.device} threads={args.threads}")
    print(f"{'mode':<18}{'naive peak':>12}{'chunked peak':>14}{'ratio':>8}{'naive s':>10}{'chunked s':>11}{'ratio':>8}")
    ok = True
    for mode in args.modes.split(","):
        backward = mode == "backward"
        naive, why_n = measure("naive", backward, args)
        ours, why_o = measure("chunked", backward, args)
        label = "forward+backward" if backward else "forward"
        if naive is None or ours is None:
            print(f"{label:<18}{why_n or why_o}")
            continue
        mem_ratio = naive["peak"] / max(ours["peak"], 1)
        ok &= mem_ratio >= 4
        print(f"{label:<18}{naive['peak'] / GB:>10.2f}GB{ours['peak'] / GB:>12.2f}GB{mem_ratio:>7.1f}x"
              f"{naive['seconds']:>10.2f}{ours['seconds']:>11.2f}{ours['seconds'] / naive['seconds']:>7.2f}x")
    print("peak memory at least 4x lower: " + ("yes" if ok else "NO"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
