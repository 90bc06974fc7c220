"""Everything the first GPU should measure, in one command of at most 8 minutes, and one table for docs/benchmarks.md:

    python bench/device.py --out device-run            # CUDA: Qwen3.5-4B shapes, bf16, --budget 450 s
    python bench/device.py --device cpu --small        # the same code at tiny shapes on a CPU: the rehearsal
    python bench/device.py --device cpu --small --slow-build 600   # the rehearsal of a cold start
    python bench/device.py --only decode --budget 300  # some sections

The models are built first, in their own section, once (one retry if the first try fails or is stopped): every
section measures on them. Then the sections, in the order of what they decide (docs/benchmarks.md has each one's
share of the budget):
  numerics      ours bf16 against ours fp32 on the same random weights (Qwen3.5-4B, all 32 layers; B=2, T=256, one
                row left-padded) and the GRPO KL at step 0; then a few AdamW steps at soyuz's lr, and the eager
                path's and the fast path's static step's sampler-trainer gap and the share of the LoRA update each
                carries (bench/device_numerics.py).
  compile       the fast path's first call, which compiles its one graph, on its own allotment (at least its cap):
                its gap and share, and the compile's seconds by phase, or the error it failed with.
  decode        soyuz's largest sampler call (train.decode_rows: 24 rows, a 3,072-slot cache bucket, the policy as
                the preset builds it: LoRA attached, checkpointing on): ms per decode step of the eager and the fast
                path from two calls of 8 and 56 new tokens, kernels per step from torch.profiler
                (bench/device_decode.py).
  train         one soyuz-shaped micro-batch as train.py's policy_update runs it (B=4 x T=2,936, completions up to
                1,024 tokens, activation checkpointing, beta 0.04, LoRA r=32 on every projection): seconds by phase,
                the SDPA kernel each forward took, and the peak memory (torch.cuda.max_memory_allocated) against
                minigrpo/run/memplan.py's plan for the same shapes (computed on the CPU in a child process); then
                the same micro-batch with the Gated DeltaNet chunk loop compiled (train.py --compile-gdn).
  transformers  transformers' bf16 and fp32 logits against ours fp32, and its generate with a static cache (which
                transformers compiles on CUDA) on the decode section's prompts, without LoRA.

--small: the tiny Qwen3.5 model (4 layers), T=64 for numerics, 4 x 128 for train, prompts of 70-100 tokens.
--slow-build SECONDS: the first build waits that long first (a cold start); the retry does not.
Budgets (bench/device_report.py): each unit says what it needs and is skipped when its section has less left; a
timer stops a unit at its section's deadline; results.json and table.md under --out are rewritten after every row.
"""

import argparse
import contextlib
import functools
import gc
import importlib
import json
import os
import subprocess
import sys
import time

START = time.time()  # the budget counts from here: imports included

import torch  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path[:0] = [ROOT, HERE]
import shapes  # noqa: E402
from device_decode import attention_kernels, decode_section, generate_section, profiled, sync  # noqa: E402
from device_numerics import compile_section, numerics, transformers_numerics  # noqa: E402
from device_report import Report, Skip  # noqa: E402

GiB = 1024 ** 3
# need: seconds a unit may take, checked against what its section has left; allot: each section's share of --budget
FULL = dict(shape="qwen3.5-4b", num_len=256, prompt=2880, steps=(8, 56), prof=(2, 6), repeats=2,
            train_prompts=(1912, 1850, 1800, 1700), train_completions=(1024, 1000, 900, 800), budget=450,
            opt_steps=8, gap_tokens=32, compile_cap=240,
            need=dict(build=60, fp32=25, compare=10, kl=15, steps=30, gap=15, static=25, compile=90, eager=30,
                      fast=15, step=25, hf_first=45, hf=15))
SMALL = dict(shape="tiny-qwen3.5", num_len=64, prompt=100, steps=(4, 16), prof=(2, 6), repeats=2,
             train_prompts=(100, 90, 80, 70), train_completions=(28, 24, 20, 16), budget=360,
             opt_steps=2, gap_tokens=16, compile_cap=400,
             need=dict(build=15, fp32=5, compare=5, kl=5, steps=10, gap=10, static=10, compile=60, eager=15,
                       fast=10, step=15, hf_first=20, hf=10))
# each section's share of --budget, in the order they run; the time one leaves unused passes on to the next
ALLOT = {"build": 0.15, "numerics": 0.25, "compile": 0.25, "decode": 0.14, "train": 0.09, "transformers": 0.12}
SECTIONS = [s for s in ALLOT if s != "build"]


def soyuz_args():
    """train.py's resolved soyuz flags (nothing is written to the run folder they name, which must not be --out)."""
    from minigrpo.run.flags import resolve_args
    return resolve_args(["--task", "soyuz", "--run-name", f"device-flags-{os.getpid()}"])


def reference_rows(args):
    """The rows of the reference run's largest sampler call, as train.py sizes it: soyuz's 4 tasks x G = 6."""
    import train
    from minigrpo.tasks import task_class
    return train.decode_rows(task_class("soyuz"), args, args.tasks_per_step)


class StandInTokenizer:
    """The fields train.sampler_settings and train.rollout_sampler read. No EOS id: random weights would stop at
    random, and a row that stops early would change the step count being timed."""
    eos_ids = ()

    def __init__(self, vocab_size, pad_id):
        self.vocab_size, self.pad_id = vocab_size, pad_id

    def decode(self, ids):
        return ""


# ----------------------------------------------------------------------------------------------------------------
# the models: transformers' bf16 model with seeded random weights, ours sharing its tensors, built once


class Models:
    def __init__(self, cfg, device):
        self.cfg, self.device, self.hf = cfg, device, None

    def copy_in(self, dtype):
        """Ours on cast copies of the weights (the fp32 reference)."""
        return ours_from(self.hf, self.raw, dtype)


def ours_from(hf, raw, dtype=None):
    """Our Qwen on transformers' tensors: shared (dtype None) or cast copies."""
    from minigrpo.model import Qwen
    from minigrpo.pretrained import QwenConfig
    with torch.device("meta"):
        ours = Qwen(QwenConfig.from_dict(raw))
    sd = hf.state_dict() if dtype is None else {k: v.to(dtype) for k, v in hf.state_dict().items()}
    ours.load_state_dict(sd, assign=True)
    ours.lm_head.weight = ours.model.embed_tokens.weight if ours.config.tie_word_embeddings else ours.lm_head.weight
    ours.model.rotary.inv_freq = ours.model.rotary._inv_freq(hf.device)  # a non-persistent buffer, still on meta
    return ours.eval()


def build(M, cold=0.0):
    """train.py's soyuz arguments and policy, on random weights: LoRA as build_policy injects it, checkpointing.
    cold: seconds to wait first (--slow-build: the rehearsal of a slow first start)."""
    from minigrpo.lora import inject_lora
    from minigrpo.model import enable_activation_checkpointing
    time.sleep(cold)
    c = M.cfg
    M.raw = shapes.hf_config(c["shape"])
    M.vocab, M.pad = shapes.TOKENS[c["shape"]]
    hf = shapes.build_hf(c["shape"], torch.bfloat16, M.device)
    hf.generation_config.pad_token_id = M.pad
    M.ours = ours_from(hf, M.raw)
    M.args = soyuz_args()
    M.params = inject_lora(M.ours, r=M.args.lora_r, alpha=M.args.lora_alpha)
    if M.args.grad_checkpoint:
        enable_activation_checkpointing(M.ours)
    M.tok = StandInTokenizer(M.vocab, M.pad)
    M.hf = hf  # last: the other sections run only on a complete build
    n = sum(p.numel() for p in hf.parameters())
    return dict(minigrpo=f"{n:,} parameters; LoRA r={M.args.lora_r}: {sum(p.numel() for p in M.params):,}",
                note=f"{len(M.raw['layer_types'])} layers, bf16, seeded random weights on {M.device.type}")


def build_section(sec, M, cold):
    """The models, once: a first try within the section's time; if it fails or is stopped, one retry, given at least
    twice the build's estimate (taken from the last sections: without models no section runs)."""
    what = "transformers' model, ours on its tensors, + LoRA"
    # transformers' modules imported whole first, outside any time limit (a model on the meta device allocates
    # nothing): a limit that stops an import halfway leaves its lazy imports broken, and the retry then fails.
    # The section keeps the time it had.
    left = sec.deadline - sec.report.elapsed()
    shapes.build_hf(M.cfg["shape"], torch.bfloat16, "meta", layers=4)
    sec.extend(left)
    sec.measure(f"build: {what}", lambda: build(M, cold), need=0)
    if M.hf is None:
        gc.collect()
        sec.extend(2 * M.cfg["need"]["build"])
        sec.measure(f"build, retry: {what}", lambda: build(M), need=0)


# ----------------------------------------------------------------------------------------------------------------
# train: one micro-batch, by phase


def plan_child(spec):
    """The memory plan's parts for `spec` (json), printed as json: run in a child so the GPU need not wait."""
    from minigrpo.lora import DEFAULT_TARGETS
    from minigrpo.pretrained import QwenConfig
    from minigrpo.run import memplan
    torch.set_num_threads(min(4, os.cpu_count() or 1))
    s = json.loads(spec)
    cfg = QwenConfig.from_dict(shapes.hf_config(s["shape"]))
    shape = memplan.Shape(s["rows"], s["rows"], s["prompt"], s["slots"], s["batch"], s["seq"], s["completion"])
    # the static caches of the decode section's one bucket: held through the train section when the fast path ran
    print(json.dumps(memplan.plan(cfg, shape, torch.bfloat16, s["lora_r"], DEFAULT_TARGETS, s["beta"],
                                  fast_decode=True)))


def start_plan(c):
    seq = max(p + n for p, n in zip(c["train_prompts"], c["train_completions"]))
    spec = dict(shape=c["shape"], rows=c["rows"], prompt=c["prompt"], slots=c["prompt"] + c["steps"][1],
                batch=len(c["train_prompts"]), seq=seq, completion=max(c["train_completions"]), lora_r=32, beta=0.04)
    return subprocess.Popen([sys.executable, os.path.abspath(__file__), "--plan-child", json.dumps(spec)],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)


def peak_reset(device):
    gc.collect()  # the numerics section's fp32 copies, if a reference cycle still holds them
    sync(device)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()


def peak(device):
    sync(device)
    return torch.cuda.max_memory_allocated() if device.type == "cuda" else 0


def train_section(sec, M, plan_proc):
    from minigrpo import compiling, grpo
    from minigrpo.deltanet import LOOP, compile_chunk_loop
    from minigrpo.run.dist import init_distributed
    from minigrpo.update import adamw
    from minigrpo.run.flags import loss_settings
    from minigrpo.tasks.base import Seq
    import train
    c, dev = M.cfg, M.device
    args, V = M.args, M.vocab
    g = torch.Generator().manual_seed(2)
    seqs = [Seq(str(i), 1, torch.randint(0, V - 16, (p,), generator=g).tolist(),
                torch.randint(0, V - 16, (n,), generator=g).tolist(), [0.0] * n, "length", "", 0.0,
                advantage=(-1.0) ** i) for i, (p, n) in enumerate(zip(c["train_prompts"], c["train_completions"]))]
    b = train.collate(seqs, M.pad, dev)
    dist1 = init_distributed(dev)
    opt, sched = adamw(M.params, args.lr, 10, args.warmup, args.schedule, args.adam_beta2, args.weight_decay)
    what = f"B={b.ids.shape[0]} x T={b.ids.shape[1]}, ckpt {args.grad_checkpoint}, beta {args.beta}"
    state = {}

    def step():
        marks = {}
        peak_reset(dev)
        t = time.perf_counter()

        def mark(name):
            nonlocal t
            sync(dev)
            marks[name], t = time.perf_counter() - t, time.perf_counter()

        norm = grpo.loss_normalizer([b.mask], args.agg, max_tokens=args.max_new_tokens)
        M.ours.eval()
        ref = train.reference_logprobs(M.ours, None, b, args.temperature, V) if args.beta else None
        mark("reference forward")
        M.ours.train()
        logp, _ = train.log_probs(M.ours, b, args.temperature, V, entropy=True)
        loss, st = grpo.policy_loss(logp, b.adv, b.mask, loss_settings(args), norm, grpo.Against(ref=ref))
        mark("policy forward")
        loss.backward()
        mark("backward")
        train.all_reduce_and_clip(M.params, args.max_grad_norm, dist1)
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        mark("clip + AdamW")
        M.ours.eval()
        state.update(peak=peak(dev))
        phases = ", ".join(f"{k} {v:.2f} s" for k, v in marks.items())
        return dict(minigrpo=f"{sum(marks.values()):.2f} s", note=f"{phases}; KL {float(st['kl']):.3g}")

    def memory():
        if "peak" not in state:
            raise Skip("no step ran")
        try:
            plan = json.loads(plan_proc.communicate(timeout=max(1.0, sec.left() - 2))[0].strip().splitlines()[-1])
        except Exception as e:  # noqa: BLE001  the measured figure stands without the plan
            plan, why = None, f"plan not available ({type(e).__name__})"
        cuda = dev.type == "cuda"
        out = dict(minigrpo=f"{state['peak'] / GiB:.2f} GiB max_memory_allocated" if cuda else
                   "not measured on a CPU (its RSS keeps what was freed)")
        if plan:
            # what the earlier sections still hold counts too: the fast path's caches, the fp32 reference logits
            caches = plan["static_caches"] if getattr(M, "fast_compiled", None) is not None else 0
            ref = M.ref_logits.numel() * 4 if getattr(M, "ref_logits", None) is not None else 0
            part = plan["weights"] + plan["trainable"] + plan["activations_ckpt"] + plan["logprob_chunk"]
            ratio = f" ({(part + caches + ref) / state['peak']:.2f}x measured)" if cuda else ""
            out["note"] = (f"plan {(part + caches + ref) / GiB:.2f} GiB{ratio}: weights, LoRA + grads + AdamW, "
                           f"checkpointed activations, log-prob chunk {part / GiB:.2f}; the fast path's static "
                           f"caches {caches / GiB:.2f}; the numerics' fp32 reference logits {ref / GiB:.2f}")
        else:
            out["note"] = why
        return out

    def backend():
        def both():
            with torch.no_grad():
                train.log_probs(M.ours, b, args.temperature, V)
            M.ours.train()
            train.log_probs(M.ours, b, args.temperature, V, entropy=True)  # with grad, as the policy forward; no backward
            M.ours.eval()
        _, ev = profiled(both, dev)
        return dict(minigrpo=attention_kernels(ev), note="the SDPA op of a no-grad and a with-grad forward")

    def compiled():   # train.py --compile-gdn (on by default with --decode fast): the chunk loop compiled
        compile_chunk_loop(M.ours, backend=gdn)
        try:
            out = step()
        finally:
            compile_chunk_loop(M.ours, backend=None)
        failed = compiling.failure(LOOP, dev, gdn)
        return {**out, "note": out["note"] + (f"; the compile failed, ran eager: {failed}" if failed else "")}

    need = c["need"]["step"]
    sec.measure(f"one micro-batch, first (warm-up), {what}", step, need=need)
    sec.measure(f"one micro-batch, second, {what}", step, need=need)
    sec.measure("peak memory of the last step vs the memory plan", memory, need=5)
    sec.measure("attention kernel (torch.profiler)", backend, need=need / 2)
    # last: the compile may not fit the section. On a CPU "aot_eager" (the same graphs, no C++ build) rehearses it.
    gdn = "inductor" if dev.type == "cuda" else "aot_eager"
    sec.measure(f"one micro-batch, --compile-gdn ({gdn}), first (compiles), {what}", compiled, need=need)
    sec.measure(f"one micro-batch, --compile-gdn ({gdn}), second, {what}", compiled, need=need)


# ----------------------------------------------------------------------------------------------------------------


def transformers_section(sec, M):
    """Last, on its own allotment: transformers' logits against ours fp32, then its generate."""
    transformers_numerics(sec, M)
    generate_section(sec, M)


def environment(report, device):
    import transformers
    from transformers.utils import import_utils
    report.add_env(f"bench/device.py, {time.strftime('%Y-%m-%d %H:%M')}; torch {torch.__version__}, CUDA "
                   f"{torch.version.cuda}, cuDNN {torch.backends.cudnn.version()}, transformers "
                   f"{transformers.__version__}")
    if device.type == "cuda":
        p = torch.cuda.get_device_properties(device)
        report.add_env(f"GPU: {p.name}, {p.total_memory / GiB:.0f} GiB, compute capability {p.major}.{p.minor}; "
                       f"SDPA enabled: flash {torch.backends.cuda.flash_sdp_enabled()}, memory-efficient "
                       f"{torch.backends.cuda.mem_efficient_sdp_enabled()}, cuDNN "
                       f"{torch.backends.cuda.cudnn_sdp_enabled()}, math {torch.backends.cuda.math_sdp_enabled()}")
    else:
        report.add_env(f"device: CPU, {torch.get_num_threads()} threads")
    report.add_env(compilers())
    found = []
    for mod, check in (("fla", "is_flash_linear_attention_available"), ("causal_conv1d", "is_causal_conv1d_available")):
        try:
            importlib.import_module(mod)
            state = "importable"
        except Exception as e:  # noqa: BLE001  ImportError, or a build that fails on import
            state = f"not importable ({type(e).__name__})"
        fn = getattr(import_utils, check, None)
        found.append(f"{mod}: {state}" + (f", transformers' {check}() = {fn()}" if fn else ""))
    report.add_env("transformers' Qwen3.5 kernels: " + "; ".join(found))


def compilers():
    """What a compiled path needs besides torch: Triton builds its launcher with a host C compiler (CC, else gcc,
    else clang) against the Python headers; inductor on the CPU builds C++ (CXX, else g++)."""
    import shutil
    import sysconfig

    def tool(name):
        path = shutil.which(name) if name else None
        if not path:
            return f"{name}: NOT FOUND"
        try:
            out = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=10).stdout
            return f"{path} ({out.splitlines()[0].strip() if out else 'no version'})"
        except (OSError, subprocess.SubprocessError) as e:
            return f"{path} (does not run: {type(e).__name__})"
    cc = os.environ.get("CC") or shutil.which("gcc") or shutil.which("clang") or "cc"
    header = os.path.join(sysconfig.get_paths()["include"], "Python.h")
    try:
        triton = importlib.import_module("triton").__version__
    except Exception as e:  # noqa: BLE001  missing, or a build that fails on import
        triton = f"not importable ({type(e).__name__})"
    return (f"compilers: C (Triton's launcher) {tool(cc)}; C++ (inductor on a CPU) {tool(os.environ.get('CXX', 'g++'))}; "
            f"Python headers {header}: {'present' if os.path.exists(header) else 'MISSING'}; Triton {triton}; "
            f"cuDNN {torch.backends.cudnn.version()}")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cuda", help="cuda (default) or cpu")
    p.add_argument("--small", action="store_true", help="tiny shapes: the CPU rehearsal of the GPU run")
    p.add_argument("--budget", type=float, help="seconds for everything, imports included (default 450; --small 360)")
    p.add_argument("--out", default=os.path.join("runs", "device"), help="folder for results.json and table.md")
    p.add_argument("--only", default=",".join(SECTIONS), help=f"comma-separated sections of {', '.join(SECTIONS)}")
    p.add_argument("--slow-build", type=float, default=0.0, metavar="SECONDS",
                   help="the rehearsal of a cold start: the first build waits SECONDS first (the retry does not)")
    p.add_argument("--plan-child", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.plan_child:
        return plan_child(a.plan_child)
    sections = a.only.split(",")
    if not sections or set(sections) - set(SECTIONS):
        p.error(f"--only {a.only}: name sections among {', '.join(SECTIONS)}")
    if a.device not in ("cuda", "cpu"):
        p.error(f"--device {a.device}: use cuda or cpu")
    if a.device == "cuda" and not torch.cuda.is_available():
        p.error("--device cuda: no CUDA device here; use --device cpu --small for the CPU rehearsal")
    if a.budget is not None and not a.budget > 0:
        p.error(f"--budget {a.budget}: give the seconds the run may take, > 0")
    if not a.slow_build >= 0:
        p.error(f"--slow-build {a.slow_build}: give the seconds the first build waits, >= 0")
    try:
        import transformers  # noqa: F401  (the parity oracle of the numerics and speed sections)
    except ImportError:
        p.error("transformers is not installed: the script compares against it; pip install -r requirements-dev.txt")
    c = dict(SMALL if a.small else FULL)
    c["rows"] = reference_rows(soyuz_args())   # the decode rows: soyuz's largest sampler call (24)
    budget = a.budget or c["budget"]
    device = torch.device(a.device)
    report = Report(a.out, budget, START, dict(argv=sys.argv[1:] if argv is None else list(argv), device=a.device,
                                               small=a.small, budget_s=budget, sections=sections))
    environment(report, device)
    plan_proc = start_plan(c) if "train" in sections else None
    M = Models(c, device)
    report.header()
    share = ALLOT["build"] + sum(ALLOT[s] for s in sections)
    run = {"numerics": numerics, "compile": compile_section, "decode": decode_section,
           "transformers": transformers_section,
           "train": functools.partial(train_section, plan_proc=plan_proc)}
    try:
        build_section(report.section("build", ALLOT["build"] / share * budget), M, a.slow_build)
        for name in [s for s in ALLOT if s in sections]:
            sec = report.section(name, ALLOT[name] / share * budget)
            try:
                if M.hf is None:
                    raise Skip("the models were not built")
                run[name](sec, M)
            except Skip as e:
                report.add(dict(section=name, case="(the rest)", status="skipped", note=f"skipped: {e}"))
    finally:
        if plan_proc is not None and plan_proc.poll() is None:
            plan_proc.kill()
            plan_proc.wait()
    report.finish()
    print(f"total {report.elapsed():.0f} s of a {budget:.0f} s budget; {a.out}/results.json and table.md", flush=True)


if __name__ == "__main__":
    with contextlib.suppress(BrokenPipeError):
        main()
