"""Time and peak memory of one GRPO optimizer step: minigrpo vs transformers + peft, same model, same batch.

    python bench/train_step.py                      # B=2, T=128 (prompt 64 + completion 64), fp32, 28 layers, CPU
    python bench/train_step.py --seq 256 --prompt 64 --grad-checkpoint   # checkpointing in both stacks
    python bench/train_step.py --batch 4 --seq 256 --prompt 128 --repeats 3    # GRPO-sized; ~25 min on 2 cores
    python bench/train_step.py --device cuda --dtype bfloat16 --batch 8 --seq 1024 --prompt 512 --grad-checkpoint
    python bench/train_step.py --layers 2 --batch 4 --seq 256 --prompt 128 --order anchor,ours,packed --anchor DIR
        # ours padded and packed (train.py --pack) against another checkout's step (DIR: a detached git worktree):
        # padding share, ops and kernels per optimizer step, CPU time per real token (docs/benchmarks.md)
    python bench/train_step.py --shape tiny-qwen3.5 --order ours,compiled,packed,packed-compiled   # --compile-gdn

The CPU default is small because a step of the full 28-layer model costs about 1 TFLOP per 256 tokens (three
passes through the layers, and the 151936-row lm_head three times): on a shared 2-core box that is ~90 s a
step, so B=2 x T=128 with 2 measured steps per stack takes ~10 minutes. All 28 layers are kept: with fewer, the
lm_head's share of the work (and of the memory) would be larger than in the real model.

One step, in both stacks: reference log-probs (no grad, LoRA switched off), policy log-probs with grad, the GRPO
loss (on-policy clipped ratio, advantage per sequence, + beta * k3 KL, token-mean over the completion mask),
backward, clip the gradient norm to 1, AdamW on LoRA r=32 over q, k, v, o, gate, up, down.

- ours: minigrpo.model.Qwen + minigrpo.lora.inject_lora / adapters_disabled + logprobs.token_logprobs(temperature=,
  vocab_size=, first_col=) (the fused chunked lm_head + log-softmax over the completion columns, as train.py)
  + grpo.policy_loss.
- hf: AutoModelForCausalLM (attn_implementation="sdpa", transformers' default) + peft get_peft_model, reference
  under `model.disable_adapter()`, log-probs as TRL's GRPOTrainer computes them: `logits_to_keep` = completion
  length + 1 (the lm_head runs on the completion only), logits / temperature, then TRL's selective_log_softmax
  (fp32: gather minus a per-row logsumexp; bf16: per-row log_softmax). Both mask the embedding's padding rows
  (ids >= --vocab-size) to -inf, as our trainer does; the cost is nil, and it keeps the two losses comparable.

The model is Qwen3-0.6B-shaped with random weights: transformers builds it from a seeded config and saves it to
a temp folder, and each stack loads that folder, so the weights are the same; the LoRA A matrices get the same
seeded values in both (B = 0, PEFT's init), so every step computes the same function. The batch is GRPO-like:
prompts left-padded to --prompt tokens, completions right-padded (pads masked in attention and in the loss).

Each stack runs in its own subprocess. Peak memory on CPU: the process's peak resident set (VmHWM, reset through
/proc/self/clear_refs after the warm-up step) minus its resident set after loading the model, adding LoRA and
reading every weight once (safetensors files are mapped lazily), and minus the growth of its file-backed resident
pages (RssFile: the code of torch's kernels that the first backward pages in), so it counts activations, logits,
gradients and the AdamW state, not the weights or the library. The children run with glibc's MALLOC_MMAP_THRESHOLD_=1 MiB (unless you set it):
by default glibc raises its mmap threshold to 32 MiB after the first large free, and from then on freed tensors
below that stay in the heap, so peak RSS measured the allocator's history (+0.4-0.8 GB on either stack) more than
the tensors alive at once. With the threshold fixed, peak RSS tracks live tensors, as CUDA's max_memory_allocated
does. On CUDA: max_memory_allocated minus memory_allocated at the same point. Time: median over --repeats steps
after one warm-up step. The parity lines compare the two stacks' loss and gradient norm at every step (same
inputs, same weights).

Measured on the 2-core CPU box (fp32, 28 layers; before RssFile was subtracted, so both peaks include the code pages):
    python bench/train_step.py --seq 256 --prompt 64 --grad-checkpoint     (B=2, 192 completion tokens; idle box)
        ours 38.8 s (best 37.1), peak 0.53 GB   hf+peft 41.3 s (best 40.6), peak 0.97 GB  ->  0.94x time, 0.55x peak
    python bench/train_step.py --repeats 1              (B=2, T=128, no checkpointing; shared box, times noisy)
        peak 1.04 GB vs 1.22 GB -> 0.85x
Without activation checkpointing the decoder layers' saved activations are the larger part, and they are the same
graph in both stacks (101.5 KB per token per layer in fp32, counted with saved_tensors_hooks on either model): no
log-prob trick brings that case to 0.7x. With checkpointing in both (how GRPO runs at length; TRL's
gradient_checkpointing=True) the layers keep only their inputs, and what is left is the log-prob pass, where
token_logprobs' fused lm_head keeps one chunk of logits and never saves one for backward, while the TRL-style
path holds the (B, C, V) logits, their scaled copy and the softmax for backward.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))  # run from anywhere
if "--minigrpo" in sys.argv:  # a child timing another checkout's minigrpo (the anchor): import that one
    sys.path.insert(0, sys.argv[sys.argv.index("--minigrpo") + 1])

import shapes  # noqa: E402  (bench/shapes.py)
from step_counts import count_kernels, count_ops, kernel_profiling  # noqa: E402  (bench/step_counts.py)
from step_stacks import build_hf, build_ours, make_batch, save_random_model, targets  # noqa: E402

GB = 1024 ** 3


# ----------------------------------------------------------------------------------------------------------------
# one stack in one process


def rss_bytes(field):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024  # kB
    raise RuntimeError(f"bench/train_step.py: no {field} in /proc/self/status (Linux only on CPU)")


def reset_peak(device):
    if device == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        return
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # resets VmHWM, the peak resident set (Linux >= 4.0)


def code_bytes(device):
    """File-backed resident pages (shared libraries' code, mapped files): 0 on CUDA, where nothing counts them."""
    return 0 if device == "cuda" else rss_bytes("RssFile")


def used(device, peak):
    if device == "cuda":
        return torch.cuda.max_memory_allocated() if peak else torch.cuda.memory_allocated()
    return rss_bytes("VmHWM" if peak else "VmRSS")


def child(args):
    import torch._dynamo  # noqa: F401  torch.utils.checkpoint imports it on first use; keep it out of the peak
    torch.set_num_threads(args.threads)
    dtype = getattr(torch, args.dtype)
    model, params, step = (build_ours if args.impl == "ours" else build_hf)(args.folder, args, dtype)
    opt = torch.optim.AdamW(params, lr=args.lr, weight_decay=0.0)
    sync = torch.cuda.synchronize if args.device == "cuda" else (lambda: None)
    with torch.no_grad():  # safetensors weights may be mapped lazily: page them all in before the baseline
        for t in model.state_dict().values():
            t.sum()
    base, code0 = used(args.device, peak=False), code_bytes(args.device)
    losses, norms, times, cpu, phases = [], [], [], [], []
    for i in range(1 + args.repeats):
        if i == 1:
            reset_peak(args.device)  # the warm-up step's one-time costs stay out of the measurement
        marks = {}
        sync()
        t0 = last = time.perf_counter()
        c0 = time.process_time()

        def timer(name):
            nonlocal last
            sync()
            now = time.perf_counter()
            marks[name] = now - last
            last = now

        with kernel_profiling():   # inductor's kernels then show in count_kernels' profile
            loss, norm = step_once(step, params, opt, timer)
        timer("clip+adamw")
        losses.append(loss.item())
        norms.append(norm.item())
        if i > 0:
            times.append(time.perf_counter() - t0)
            cpu.append(time.process_time() - c0)
            phases.append(marks)
    # the library code the first backward (or the checkpointed recompute) pages in is resident too, and counted
    # in VmHWM: 27-45 MB on the tiny model, more than its activations. It is not memory the step allocates.
    peak = used(args.device, peak=True) - base - (code_bytes(args.device) - code0)
    med = {k: statistics.median(p[k] for p in phases) for k in phases[0]}
    one = lambda: step_once(step, params, opt, lambda name: None)   # noqa: E731
    ops = None if args.no_ops or args.compile_gdn else count_ops(one)   # a compiled run's ops are its eager twin's
    kernels = None if args.no_ops else count_kernels(one)
    print(json.dumps({"peak": peak, "base": base, "times": times, "cpu": cpu, "phases": med, "losses": losses,
                      "norms": norms, "ops": ops, "kernels": kernels}))


def step_once(step, params, opt, timer):
    loss, _ = step(timer)
    norm = torch.nn.utils.clip_grad_norm_(params, 1.0)
    opt.step()
    opt.zero_grad(set_to_none=True)
    return loss, norm


RUNS = {"ours": ("ours", []), "hf": ("hf", []), "packed": ("ours", ["--pack"]),
        "compiled": ("ours", ["--compile-gdn"]), "packed-compiled": ("ours", ["--pack", "--compile-gdn"]),
        "anchor": ("ours", [])}  # anchor: ours, padded, importing --anchor's minigrpo


def run_child(name, folder, args):
    impl, extra = RUNS[name]
    if name == "anchor":
        extra = ["--minigrpo", os.path.abspath(args.anchor)]
    cmd = [sys.executable, os.path.abspath(__file__), "--child", "--impl", impl, "--folder", folder] + extra
    for k in ("shape", "batch", "seq", "prompt", "layers", "dtype", "device", "threads", "repeats", "lora_r", "beta",
              "temperature", "lr", "vocab_size"):
        if getattr(args, k) is not None:
            cmd += [f"--{k.replace('_', '-')}", str(getattr(args, k))]
    cmd += ["--grad-checkpoint"] if args.grad_checkpoint else []
    cmd += ["--no-ops"] if getattr(args, "no_ops", False) else []
    env = dict(os.environ)
    if args.device == "cpu":  # see the module docstring: peak RSS should follow live tensors, not malloc's history
        env.setdefault("MALLOC_MMAP_THRESHOLD_", str(1 << 20))
    out = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if out.returncode != 0:
        sys.exit(f"bench/train_step.py: the {impl} run failed (exit {out.returncode}):\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


# ----------------------------------------------------------------------------------------------------------------
# the table


def report_runs(res, args):
    """One row per run: time and CPU time per real token, the batch's padding share, ops per optimizer step."""
    _, attn, _, _ = make_batch(args)
    tokens = int(attn.sum())
    share = 1 - tokens / attn.numel()
    print(f"{'run':<16}{'step s':>8}{'cpu s':>8}{'ms/token':>10}{'cpu ms/token':>14}{'padding':>9}{'ops/step':>10}"
          f"{'kernels':>9}{'peak GB':>9}   loss step0")
    for name, r in res.items():
        t, c = statistics.median(r["times"]), statistics.median(r["cpu"])
        pad = 0.0 if name.startswith("packed") else share
        print(f"{name:<16}{t:>8.2f}{c:>8.2f}{1e3 * t / tokens:>10.2f}{1e3 * c / tokens:>14.2f}{pad:>9.1%}"
              f"{r['ops'] or '-':>10}{r.get('kernels') or '-':>9}{r['peak'] / GB:>9.3f}   {r['losses'][0]:.7f}")
    print(f"{tokens} real tokens of {attn.numel()} (B={args.batch} x T={args.seq}); ms/token: the step's median "
          f"wall time per real token, cpu: the process's CPU time (all its threads)")


def report(res, args):
    if set(res) != {"ours", "hf"}:
        return report_runs(res, args)
    if len(res) == 1:  # --order ours (or hf): one stack, no comparison
        (name, r), = res.items()
        print(f"{name}: step {statistics.median(r['times']):.2f} s (median), peak {r['peak'] / GB:.3f} GB, "
              f"loss step0 {r['losses'][0]:.6f}")
        return
    o, h = res["ours"], res["hf"]
    t_o, t_h = statistics.median(o["times"]), statistics.median(h["times"])
    print(f"{'stack':<8}{'step s (median)':>16}{'best s':>9}{'peak GB':>9}   phases (median s)")
    for name, r, t in (("ours", o, t_o), ("hf+peft", h, t_h)):
        ph = "  ".join(f"{k} {v:.2f}" for k, v in r["phases"].items())
        print(f"{name:<8}{t:>16.2f}{min(r['times']):>9.2f}{r['peak'] / GB:>9.2f}   {ph}")
    time_ratio, mem_ratio = t_o / t_h, o["peak"] / max(h["peak"], 1)
    print(f"{'ours/hf':<8}{time_ratio:>16.2f}{min(o['times']) / min(h['times']):>9.2f}{mem_ratio:>9.2f}")
    dloss = max(abs(a - b) for a, b in zip(o["losses"], h["losses"]))
    dnorm = max(abs(a - b) / max(abs(b), 1e-12) for a, b in zip(o["norms"], h["norms"]))
    print(f"parity over {len(o['losses'])} steps: loss step0 ours {o['losses'][0]:.6f} hf {h['losses'][0]:.6f}, "
          f"max|dloss| {dloss:.2e}; grad-norm step0 ours {o['norms'][0]:.4e} hf {h['norms'][0]:.4e}, "
          f"max rel diff {dnorm:.2e}")
    print(f"target no slower (time ratio <= 1): {'yes' if time_ratio <= 1 else 'NO'}; "
          f"peak <= 0.7x: {'yes' if mem_ratio <= 0.7 else 'NO'}")


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--seq", type=int, default=128, help="tokens per sequence, prompt + completion")
    p.add_argument("--prompt", type=int, default=64, help="prompt width (left-padded); the rest is completion")
    p.add_argument("--shape", default="qwen3-0.6b", choices=shapes.NAMES, help="model shape (bench/shapes.py)")
    p.add_argument("--layers", type=int, help="decoder layers (default: the shape's, Qwen3-0.6B: 28)")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--threads", type=int, default=min(2, os.cpu_count() or 1))
    p.add_argument("--repeats", type=int, default=2, help="measured steps after one warm-up step")
    p.add_argument("--order", default="ours,hf",
                   help="the runs, in order: ours, hf (transformers + peft), packed (ours, train.py --pack), "
                        "compiled and packed-compiled (the same with train.py --compile-gdn: the Gated DeltaNet "
                        "chunk loop under inductor), anchor (ours, padded, with --anchor's minigrpo)")
    p.add_argument("--anchor", help="another checkout of this repository (git worktree add --detach DIR COMMIT): "
                                    "the anchor run imports its minigrpo")
    p.add_argument("--pack", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--compile-gdn", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--minigrpo", help=argparse.SUPPRESS)
    p.add_argument("--lora-r", type=int, default=32)
    p.add_argument("--beta", type=float, default=0.04)
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--lr", type=float, default=1e-4)
    p.add_argument("--vocab-size", type=int,
                   help="tokenizer size, rows past it are masked (default: the shape's, Qwen3: 151669)")
    p.add_argument("--grad-checkpoint", action="store_true",
                   help="per-layer activation checkpointing in both stacks (train.py --grad-checkpoint; TRL's "
                        "gradient_checkpointing=True)")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--no-ops", action="store_true", help=argparse.SUPPRESS)  # a peak only: no step to count ops in
    p.add_argument("--impl", choices=["ours", "hf"], help=argparse.SUPPRESS)
    p.add_argument("--folder", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.vocab_size is None:
        args.vocab_size = shapes.TOKENS[args.shape][0]
    if not 0 < args.prompt < args.seq:
        p.error(f"--prompt {args.prompt} must be between 1 and --seq {args.seq} - 1")
    if args.child:
        return child(args)
    runs = args.order.split(",")
    if not set(runs) <= set(RUNS):
        p.error(f"--order {args.order}: runs are {', '.join(RUNS)}")
    if "anchor" in runs and not (args.anchor and os.path.isdir(os.path.join(args.anchor, "minigrpo"))):
        p.error(f"--order anchor needs --anchor DIR, a checkout with minigrpo/ in it (got {args.anchor})")
    import peft
    import transformers
    raw = shapes.hf_config(args.shape, args.layers)
    print(f"one GRPO step, {args.shape} shape ({raw['num_hidden_layers']} layers, V={raw['vocab_size']}), "
          f"B={args.batch} T={args.seq} "
          f"(prompt {args.prompt} + completion {args.seq - args.prompt}), {args.dtype} on {args.device}, "
          f"LoRA r={args.lora_r} on {len(targets(args))} projections, {args.threads} threads, median of {args.repeats} "
          f"{'(activation checkpointing in both) ' if args.grad_checkpoint else ''}"
          f"after 1 warm-up; torch {torch.__version__}, transformers {transformers.__version__}, peft {peft.__version__}",
          flush=True)
    with tempfile.TemporaryDirectory(prefix="minigrpo-bench-") as folder:
        save_random_model(folder, args)
        res = {name: run_child(name, folder, args) for name in runs}
    report(res, args)


if __name__ == "__main__":
    main()
