"""Everything a GPU should measure, in one command and one table (at most ~8 minutes on one GPU):

    python bench/device.py                          # CUDA: the full run (--budget 450 s)
    python bench/device.py --device cpu --small     # the same code on tiny shapes, on a CPU (< 2 minutes idle)
    python bench/device.py --only parity,train      # some sections

Sections, in the order they run (the most informative per second first; each row is printed as soon as it is
measured, so a run cut short keeps what it had):
  parity     bf16 logits, ours vs transformers (its default SDPA attention, as ours), same random weights:
             transformers builds the model from its config and saves it, ours loads the folder. Qwen3-0.6B shape
             (28 layers) and a Qwen3.5 hybrid shape (Qwen3.5-4B widths, 8 layers); B=2, T=256, one row
             left-padded by 32 (positions cumsum(mask) - 1 in both). max |dlogits| over real positions, and how
             often the argmax agrees (on the CPU both are 0 and 100%).
  train      one GRPO step, ours vs transformers + peft (bench/train_step.py, each stack in its own process):
             Qwen3.5-4B shape, bf16, LoRA r=32 on every projection, activation checkpointing in both, B=4 x T=1024
             (prompt 256); median step time and peak memory, and the memory plan's figure for the same step
             (minigrpo/memplan.py, the same parts bench/memplan_check.py compares on the CPU).
  synthetic  python train.py --task synthetic --model tiny --steps 20 on the device: wall time, first/last reward.
  sampler    tokens/s of sample() vs generate() (bench/sampler.py: 64 new tokens, T=1, no early stop), 1 prompt
             x 6 samples and 4 x 6, at Qwen3-0.6B and Qwen3.5-4B shapes, bf16, with peak memory (CUDA
             max_memory_allocated above the weights). Eager rows first; then sample(compile=True) (the static
             decode step, a CUDA graph on CUDA) against generate(cache_implementation="static"), which
             transformers compiles itself on CUDA; the first call of each compiles and is timed apart.

--small: tiny shapes (tiny, tiny-qwen3.5; 4 layers), 16 new tokens, a smaller train step, the same sections.
Every case runs in try/except: an error is printed in its row and the run goes on. A total time budget
(--budget) skips what would start after it has run out ("skipped: budget").
"""

import argparse
import gc
import os
import re
import subprocess
import sys
import tempfile
import time
import traceback

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)
sys.path.insert(0, HERE)
import sampler as sampler_bench  # noqa: E402  bench/sampler.py
import shapes  # noqa: E402
import train_step  # noqa: E402
from minigrpo import static_decode  # noqa: E402

GiB = 1024 ** 3


class Table:
    """Rows printed as they come; the budget clock."""

    def __init__(self, budget):
        self.t0, self.budget = time.perf_counter(), budget
        print("| section | case | minigrpo | reference | ratio | peak memory (ours / ref) | note |")
        print("|---|---|---|---|---|---|---|", flush=True)

    def left(self):
        return self.budget - (time.perf_counter() - self.t0)

    def row(self, section, case, ours="", ref="", ratio="", mem="", note=""):
        print(f"| {section} | {case} | {ours} | {ref} | {ratio} | {mem} | {note} |", flush=True)

    def run(self, section, case, fn, need=0):
        """fn() -> dict of row fields; an exception becomes the row's note. need: seconds it must have left."""
        if self.left() < need:
            return self.row(section, case, note=f"skipped: budget ({self.left():.0f} s left, needs ~{need} s)")
        try:
            self.row(section, case, **fn())
        except Exception as e:  # noqa: BLE001  one failure must not lose the other rows
            msg = f"{type(e).__name__}: {e}".replace("|", "/").replace("\n", " ")[:300]
            self.row(section, case, note=f"error: {msg}")
            traceback.print_exc(file=sys.stderr)
        finally:
            gc.collect()
            if torch.cuda.is_available():
                torch.cuda.empty_cache()


def sync(device):
    if device.startswith("cuda"):
        torch.cuda.synchronize()


# ----------------------------------------------------------------------------------------------------------------
# parity


def parity(args, name, layers):
    from minigrpo.model import Qwen
    dtype = torch.bfloat16
    hf = shapes.build_hf(name, dtype, args.device, layers=layers, attn_implementation="sdpa")
    with tempfile.TemporaryDirectory(prefix="minigrpo-device-") as folder:
        hf.save_pretrained(folder)
        ours = Qwen.from_pretrained(folder, dtype=dtype, device=args.device).eval()
    B, T, pad = 2, args.parity_len, args.parity_len // 8
    vocab = shapes.TOKENS[name][0]
    ids = torch.randint(0, vocab, (B, T), generator=torch.Generator().manual_seed(0)).to(args.device)
    mask = torch.ones(B, T, dtype=torch.long, device=args.device)
    mask[1, :pad] = 0
    pos = (mask.cumsum(-1) - 1).clamp(min=0)  # as ours and generate(); a plain HF forward would use arange
    with torch.no_grad():
        a = ours(ids, attention_mask=mask).float()
        b = hf(input_ids=ids, attention_mask=mask, position_ids=pos).logits.float()
    real = mask.bool()
    d = (a - b).abs()[real]
    agree = (a.argmax(-1) == b.argmax(-1))[real].float().mean().item()
    return dict(ours=f"max abs dlogits {d.max().item():.3g}", ref=f"mean {d.mean().item():.2g}",
                note=f"argmax agrees {100 * agree:.1f}%; |logits| ~{b[real].abs().mean().item():.2g}")


# ----------------------------------------------------------------------------------------------------------------
# one GRPO step (bench/train_step.py's two children)


def train(args):
    a = argparse.Namespace(shape=args.train_shape, layers=args.train_layers, batch=args.train_batch,
                           seq=args.train_seq, prompt=args.train_seq // 4, dtype="bfloat16", device=args.device,
                           threads=min(16, os.cpu_count() or 1), repeats=1, lora_r=32, beta=0.04, temperature=1.0,
                           lr=1e-4, vocab_size=shapes.TOKENS[args.train_shape][0], grad_checkpoint=True)
    with tempfile.TemporaryDirectory(prefix="minigrpo-device-") as folder:
        shapes.build_hf(a.shape, torch.bfloat16, args.device, layers=a.layers).save_pretrained(folder)
        res = {impl: train_step.run_child(impl, folder, a) for impl in ("ours", "hf")}
    import memplan_check
    planned = memplan_check.planned(a, checkpointing=True)
    o, h = res["ours"], res["hf"]
    to, th = min(o["times"]), min(h["times"])
    return dict(ours=f"{to:.2f} s", ref=f"{th:.2f} s (hf+peft)", ratio=f"{to / th:.2f}x time",
                mem=f"{o['peak'] / GiB:.2f} / {h['peak'] / GiB:.2f} GiB",
                note=f"plan {planned / GiB:.2f} GiB ({planned / o['peak']:.2f}x measured); "
                     f"loss ours {o['losses'][0]:.5f} hf {h['losses'][0]:.5f}")


# ----------------------------------------------------------------------------------------------------------------
# a 20-step synthetic run


def synthetic(args):
    with tempfile.TemporaryDirectory(prefix="minigrpo-device-") as runs:
        t = time.perf_counter()
        out = subprocess.run([sys.executable, os.path.join(ROOT, "train.py"), "--task", "synthetic", "--model", "tiny",
                              "--steps", "20", "--device", args.device, "--runs-dir", runs, "--quiet"],
                             capture_output=True, text=True, cwd=ROOT, timeout=max(30, args.table.left()))
        dt = time.perf_counter() - t
    if out.returncode != 0:
        raise RuntimeError(f"exit {out.returncode}: {out.stderr.strip().splitlines()[-1:]}")
    m = re.search(r"mean reward: first step (\S+) -> last step (\S+)", out.stdout)   # the result: stdout
    return dict(ours=f"{dt:.1f} s wall", note=f"reward first {m.group(1)} -> last {m.group(2)}" if m else "")


# ----------------------------------------------------------------------------------------------------------------
# sampler throughput (bench/sampler.py's workloads and measurement)


def sampler_rows(args, table):
    """Eager rows for every shape first, then the compiled ones (each compiles: the budget goes further this way)."""
    sampler_bench.args = argparse.Namespace(device=args.device, compile=False, repeats=args.repeats,
                                            new_tokens=args.new_tokens)
    for compiled in (False, True):
        for name, layers in (args.compiled_shapes if compiled else args.sampler_shapes):
            raw = dict(shapes.hf_config(name, layers), pad_token_id=shapes.TOKENS[name][1])
            what = f"{name} ({raw['num_hidden_layers']} layers)"
            need = 60 if compiled and not args.small else 15
            if table.left() < need:
                table.row("sampler", f"{what}, {'compiled' if compiled else 'eager'}",
                          note=f"skipped: budget ({table.left():.0f} s left)")
                continue
            try:
                hf, ours = sampler_bench.build_pair(raw, raw["num_hidden_layers"], torch.bfloat16)
            except Exception as e:  # noqa: BLE001
                table.row("sampler", f"{what}: building the models", note=f"error: {type(e).__name__}: {e}"[:300])
                continue
            for wl in args.workloads:
                table.run("sampler", f"{what}, {wl}, bf16, {'compiled' if compiled else 'eager'}",
                          lambda: sampler_case(args, hf, ours, wl, raw["vocab_size"], compiled), need=need)
            static_decode.release(ours)
            del hf, ours


def sampler_case(args, hf, ours, workload, vocab, compiled):
    sb = sampler_bench
    prompts = sb.prompts_for([min(n, args.prompt_len) for n in sb.WORKLOADS[workload]], vocab)
    pair = {"hf": hf, "ours": ours}
    sb.args.compile = compiled
    hf_kw = dict(cache_implementation="static") if compiled else {}
    first = {}
    with torch.no_grad():
        for side, fn, m, kw in (("ours", sb.run_ours, pair["ours"], {}), ("hf", sb.run_hf, pair["hf"], hf_kw)):
            t = time.perf_counter()  # the first call: warm-up, and for compiled rows the compilation
            fn(m, prompts, 6, args.new_tokens, **kw)
            sync(args.device)
            first[side] = time.perf_counter() - t
        best = {}
        for _ in range(args.repeats):
            for side, fn, m, kw in (("hf", sb.run_hf, pair["hf"], hf_kw), ("ours", sb.run_ours, pair["ours"], {})):
                dt, tokens, mb = sb.measure_once(lambda *a: fn(*a, **kw), m, prompts, 6, args.new_tokens)
                if side not in best or dt < best[side][0]:
                    best[side] = (dt, tokens, mb)
    (od, ot, om), (hd, ht, hm) = best["ours"], best["hf"]
    if compiled:  # the static cache is kept between calls (fixed addresses), so it is not in the measured rise
        om += sum(t.nbytes for t in static_decode._pool[ours].tensors()) / 2**20
    note = f"first call ours {first['ours']:.1f} s, generate {first['hf']:.1f} s"
    if compiled:
        note += "; generate: static cache" + (" (compiled by transformers)" if args.device.startswith("cuda") else "")
    return dict(ours=f"{ot / od:.0f} tok/s", ref=f"{ht / hd:.0f} tok/s", ratio=f"{(ot / od) / (ht / hd):.2f}x",
                mem=f"{om:.0f} / {hm:.0f} MB", note=note)


# ----------------------------------------------------------------------------------------------------------------


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cuda")
    p.add_argument("--small", action="store_true", help="tiny shapes: the CPU rehearsal of the GPU run")
    p.add_argument("--budget", type=float, help="seconds for everything (default 450, --small 110)")
    p.add_argument("--only", default="parity,train,synthetic,sampler", help="comma-separated sections")
    args = p.parse_args(argv)
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        p.error("no CUDA device: use --device cpu --small for the CPU rehearsal")
    small = args.small
    args.budget = args.budget or (110 if small else 450)
    args.parity_shapes = [("tiny", None), ("tiny-qwen3.5", None)] if small else [("qwen3-0.6b", None),
                                                                                 ("qwen3.5-4b", 8)]
    args.parity_len = 64 if small else 256
    args.train_shape, args.train_layers = ("tiny-qwen3.5", None) if small else ("qwen3.5-4b", None)
    args.train_batch, args.train_seq = (2, 128) if small else (4, 1024)
    args.sampler_shapes = [("tiny", None), ("tiny-qwen3.5", None)] if small else [("qwen3-0.6b", None),
                                                                                  ("qwen3.5-4b", None)]
    # compiling is the slow part on a CPU: the rehearsal compiles the hybrid model only (both layer kinds)
    args.compiled_shapes = [("tiny-qwen3.5", None)] if small else args.sampler_shapes
    args.workloads = ["1x6", "4x6"]
    args.new_tokens, args.prompt_len, args.repeats = (16, 32, 1) if small else (64, 128, 2)
    if not small:
        torch.backends.cuda.matmul.allow_tf32 = False  # bf16 throughout; no silent tf32 in fp32 pieces
    import transformers
    gpu = torch.cuda.get_device_name() if args.device.startswith("cuda") else f"CPU, {torch.get_num_threads()} threads"
    print(f"bench/device.py on {gpu}; torch {torch.__version__}, transformers {transformers.__version__}; "
          f"{'small (tiny shapes)' if small else 'full'}; budget {args.budget:.0f} s; "
          f"{time.strftime('%Y-%m-%d %H:%M')}", flush=True)
    if args.device == "cpu":  # train_step's children: peak RSS that follows live tensors (bench/memplan_check.py)
        os.environ.setdefault("MALLOC_MMAP_THRESHOLD_", str(64 << 10))
    table = args.table = Table(args.budget)
    sections = args.only.split(",")
    if "parity" in sections:
        for name, layers in args.parity_shapes:
            label = f"{name}{f' ({layers} layers)' if layers else ''}, bf16, B=2 T={args.parity_len}"
            table.run("parity", label, lambda: parity(args, name, layers), need=10)
    if "train" in sections:
        table.run("train step", f"{args.train_shape}, bf16, ckpt, B={args.train_batch} T={args.train_seq}",
                  lambda: train(args), need=30 if small else 120)
    if "synthetic" in sections:
        table.run("synthetic", "train.py --task synthetic --model tiny --steps 20", lambda: synthetic(args),
                  need=20)
    if "sampler" in sections:
        sampler_rows(args, table)
    print(f"total {time.perf_counter() - table.t0:.0f} s", flush=True)


if __name__ == "__main__":
    main()
