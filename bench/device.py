"""Everything the first GPU should measure, in one command of at most 8 minutes, and one table for docs/benchmarks.md:

    python bench/device.py --out device-run            # CUDA: Qwen3.5-4B shapes, bf16, --budget 450 s
    python bench/device.py --device cpu --small        # the same code at tiny shapes on a CPU: the rehearsal
    python bench/device.py --only decode --budget 300  # some sections

Sections, in the order they run (the cheap correctness checks first, the compiles last):
  numerics  bf16 logits of ours and of transformers, each against ours in fp32 on the same random weights
            (Qwen3.5-4B, all 32 layers; B=2, T=256, one row left-padded): max / mean |dlogits| over the real
            positions and top-1 agreement; transformers fp32 against ours fp32 (so that a bf16 difference is the
            dtype's, not the code's); the GRPO KL at step 0 (LoRA B = 0: the policy is the reference, KL exactly 0).
  train     one soyuz-shaped micro-batch as train.py's policy_update runs it (B=4 x T=2,936, completions up to
            1,024 tokens, activation checkpointing, beta 0.04, LoRA r=32 on every projection): seconds by phase
            (reference forward, policy forward, backward, clip + AdamW), the SDPA kernel each forward took
            (torch.profiler), and the peak memory (torch.cuda.max_memory_allocated) against minigrpo/run/memplan.py's
            plan for the same shapes (computed on the CPU in a child process while the GPU works).
  decode    soyuz's revision call in train.py's setup (6 prompts x 1 sample, 2,944 cache slots, the policy built as
            the preset builds it: LoRA attached, checkpointing on): ms per decode step of the eager path and of the
            fast path (sample(compile=True)), each from two calls of 8 and 56 new tokens; kernels per step from
            torch.profiler (calls of 2 and 6 tokens); the fast path's first call (compile + CUDA graph capture) on
            its own row and budget; each path's sampler-trainer log-prob gap (the trainer's recomputation of the
            sampled tokens, mean / p95 / max); transformers' generate with a static cache (which transformers
            compiles on CUDA) on the same prompts, without LoRA.

--small: the tiny Qwen3.5 model (4 layers), T=64 for numerics, 4 x 128 for train, prompts of 70-100 tokens.
Budgets (bench/device_report.py): each unit says what it needs and is skipped when its section has less left; a
timer stops a unit at its section's deadline; results.json and table.md under --out are rewritten after every row.
"""

import argparse
import contextlib
import copy
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
from device_decode import attention_kernels, decode_section, profiled, sync  # noqa: E402
from device_report import Report, Skip  # noqa: E402

GiB = 1024 ** 3
# need: seconds a unit may take, checked against what its section has left; allot: each section's share of --budget
FULL = dict(shape="qwen3.5-4b", num_len=256, rows=6, prompt=2880, steps=(8, 56), prof=(2, 6), repeats=2,
            train_prompts=(1912, 1850, 1800, 1700), train_completions=(1024, 1000, 900, 800), budget=450,
            need=dict(build=60, fp32=40, compare=15, kl=20, step=60, eager=60, gap=20, compile=200, fast=30,
                      hf_first=150, hf=30), compile_cap=300)
SMALL = dict(shape="tiny-qwen3.5", num_len=64, rows=6, prompt=100, steps=(4, 20), prof=(2, 6), repeats=2,
             train_prompts=(100, 90, 80, 70), train_completions=(28, 24, 20, 16), budget=300,
             need=dict(build=15, fp32=5, compare=5, kl=5, step=20, eager=40, gap=10, compile=120, fast=30,
                       hf_first=30, hf=20), compile_cap=200)
ALLOT = {"numerics": 0.15, "train": 0.2, "decode": 0.65}
SECTIONS = list(ALLOT)


class StandInTokenizer:
    """The fields train.generate reads. No EOS id: random weights would stop at random, and a row that stops early
    would change the step count being timed."""
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


def build(M):
    """train.py's soyuz arguments and policy, on random weights: LoRA as build_policy injects it, checkpointing."""
    from minigrpo.lora import inject_lora
    from minigrpo.model import enable_activation_checkpointing
    from minigrpo.run.flags import resolve_args
    c = M.cfg
    M.raw = shapes.hf_config(c["shape"])
    M.vocab, M.pad = shapes.TOKENS[c["shape"]]
    hf = shapes.build_hf(c["shape"], torch.bfloat16, M.device)
    hf.generation_config.pad_token_id = M.pad
    M.ours = ours_from(hf, M.raw)
    # the flags only: nothing is written to the run folder they name, which must not be --out (runs/device)
    M.args = resolve_args(["--task", "soyuz", "--run-name", f"device-flags-{os.getpid()}"])
    M.params = inject_lora(M.ours, r=M.args.lora_r, alpha=M.args.lora_alpha)
    if M.args.grad_checkpoint:
        enable_activation_checkpointing(M.ours)
    M.tok = StandInTokenizer(M.vocab, M.pad)
    M.hf = hf  # last: the other sections run only on a complete build
    n = sum(p.numel() for p in hf.parameters())
    return dict(minigrpo=f"{n:,} parameters; LoRA r={M.args.lora_r}: {sum(p.numel() for p in M.params):,}",
                note=f"{len(M.raw['layer_types'])} layers, bf16, seeded random weights on {M.device.type}")


def ensure_models(sec, M):
    if M.hf is None and not getattr(M, "build_tried", False):
        M.build_tried = True
        sec.measure("build: transformers' model, ours on its tensors, + LoRA", lambda: build(M),
                    need=M.cfg["need"]["build"])
    if M.hf is None:
        raise Skip("the models were not built")


# ----------------------------------------------------------------------------------------------------------------
# numerics


@contextlib.contextmanager
def no_tf32():
    """fp32 references in full fp32; the bf16 runs keep PyTorch's defaults (cuDNN's TF32 on), as train.py has."""
    old = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = old


def numerics(sec, M):
    from minigrpo import grpo
    from minigrpo.tasks.base import Seq
    import train
    c, need, dev = M.cfg, M.cfg["need"], M.device
    B, T = 2, c["num_len"]
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, M.vocab - 16, (B, T), generator=g).to(dev)
    mask = torch.ones(B, T, dtype=torch.long, device=dev)
    mask[1, :T // 8] = 0
    pos = (mask.cumsum(-1) - 1).clamp(min=0)  # as ours and generate(); a plain transformers forward uses arange
    real = mask.bool()
    ref = {}

    def fp32():
        ours32 = ours_from(M.hf, M.raw, torch.float32)
        with torch.no_grad(), no_tf32():
            ref["logits"] = ours32(ids, attention_mask=mask).float()
        del ours32
        return dict(minigrpo=f"mean abs logit {ref['logits'][real].abs().mean().item():.3g}",
                    note="the reference of the rows below (TF32 off)")

    def compare(side, model_fn):
        if "logits" not in ref:
            raise Skip("no fp32 reference")
        with torch.no_grad():
            a = model_fn()
        d = (a - ref["logits"]).abs()[real]
        top1 = (a.argmax(-1) == ref["logits"].argmax(-1))[real].float().mean().item()
        return {side: f"max {d.max().item():.3g}, mean {d.mean().item():.2g}, top-1 {100 * top1:.1f}%",
                "note": f"over {int(real.sum())} real positions"}

    def hf32():
        m = copy.deepcopy(M.hf).float()
        with no_tf32():
            return m(input_ids=ids, attention_mask=mask, position_ids=pos).logits.float()

    def kl_step0():
        half = T // 2
        seqs = [Seq(str(i), 0, ids[i, :half][real[i, :half]].tolist(), ids[i, half:].tolist(), [0.0] * (T - half),
                    "length", "", 0.0, advantage=1.0 - 2 * i) for i in range(B)]
        b = train.collate(seqs, M.pad, dev)
        norm = grpo.loss_normalizer([b.mask])
        M.ours.eval()
        ref_lp = train.reference_logprobs(M.ours, None, b, M.args, M.vocab)
        M.ours.train()
        logp, _ = train.log_probs(M.ours, b, M.args, M.vocab, entropy=True)
        _, st = grpo.policy_loss(logp, None, b.adv, b.mask, normalizer=norm, ref_logp=ref_lp, beta=M.args.beta,
                                 kl_kind=M.args.kl)
        M.ours.eval()
        kl, dmax = float(st["kl"]), (logp.detach() - ref_lp).abs()[b.mask.bool()].max().item()
        return dict(minigrpo=f"KL {kl:.3g}: {'exactly 0' if kl == 0.0 else 'NOT 0'}",
                    note=f"max abs(logp - ref) {dmax:.3g}; policy with grad, train mode, checkpointing; reference "
                         f"under adapters_disabled, no grad; beta {M.args.beta}")

    sec.measure(f"ours fp32 logits, B={B} T={T}", fp32, need=need["fp32"])
    sec.measure("ours bf16 (LoRA attached, B = 0) vs ours fp32",
                lambda: compare("minigrpo", lambda: M.ours(ids, attention_mask=mask).float()), need=need["compare"])
    sec.measure("transformers bf16 vs ours fp32", lambda: compare(
        "transformers", lambda: M.hf(input_ids=ids, attention_mask=mask, position_ids=pos).logits.float()),
        need=need["compare"])
    sec.measure("transformers fp32 vs ours fp32", lambda: compare("transformers", hf32), need=need["fp32"])
    sec.measure("KL at step 0 (LoRA B = 0)", kl_step0, need=need["kl"])


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
    # the train section measures one micro-batch of a model that has not decoded: no merged copy, no static caches
    print(json.dumps(memplan.plan(cfg, shape, torch.bfloat16, s["lora_r"], DEFAULT_TARGETS, s["beta"],
                                  fast_decode=False)))


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
    from minigrpo import grpo
    from minigrpo.dist import init_distributed
    from minigrpo.optim import adamw
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
        ref = train.reference_logprobs(M.ours, None, b, args, V)
        mark("reference forward")
        M.ours.train()
        logp, _ = train.log_probs(M.ours, b, args, V, entropy=True)
        loss, st = grpo.policy_loss(logp, None, b.adv, b.mask, eps_low=args.eps_low, eps_high=args.eps_high,
                                    agg=args.agg, normalizer=norm, ref_logp=ref, beta=args.beta, kl_kind=args.kl)
        mark("policy forward")
        loss.backward()
        mark("backward")
        train.all_reduce_and_clip(M.params, args, dist1)
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
            part = plan["weights"] + plan["trainable"] + plan["activations_ckpt"] + plan["logprob_chunk"]
            ratio = f" ({part / state['peak']:.2f}x measured)" if cuda else ""
            out["note"] = (f"plan {part / GiB:.2f} GiB{ratio}: weights, LoRA + grads + AdamW, checkpointed "
                           f"activations, log-prob chunk; with the rollout {plan['peak_ckpt'] / GiB:.2f} GiB")
        else:
            out["note"] = why
        return out

    def backend():
        def both():
            with torch.no_grad():
                train.log_probs(M.ours, b, args, V)
            M.ours.train()
            train.log_probs(M.ours, b, args, V, entropy=True)  # with grad, as the policy forward; no backward
            M.ours.eval()
        _, ev = profiled(both, dev)
        return dict(minigrpo=attention_kernels(ev), note="the SDPA op of a no-grad and a with-grad forward")

    need = c["need"]["step"]
    sec.measure(f"one micro-batch, first (warm-up), {what}", step, need=need)
    sec.measure(f"one micro-batch, second, {what}", step, need=need)
    sec.measure("peak memory of the last step vs the memory plan", memory, need=5)
    sec.measure("attention kernel (torch.profiler)", backend, need=need / 2)


# ----------------------------------------------------------------------------------------------------------------


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


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cuda", help="cuda (default) or cpu")
    p.add_argument("--small", action="store_true", help="tiny shapes: the CPU rehearsal of the GPU run")
    p.add_argument("--budget", type=float, help="seconds for everything, imports included (default 450; --small 300)")
    p.add_argument("--out", default=os.path.join("runs", "device"), help="folder for results.json and table.md")
    p.add_argument("--only", default=",".join(SECTIONS), help=f"comma-separated sections of {', '.join(SECTIONS)}")
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
    try:
        import transformers  # noqa: F401  (the parity oracle of the numerics and speed sections)
    except ImportError:
        p.error("transformers is not installed: the script compares against it; pip install -r requirements-dev.txt")
    c = dict(SMALL if a.small else FULL)
    budget = a.budget or c["budget"]
    device = torch.device(a.device)
    report = Report(a.out, budget, START, dict(argv=sys.argv[1:] if argv is None else list(argv), device=a.device,
                                               small=a.small, budget_s=budget, sections=sections))
    environment(report, device)
    plan_proc = start_plan(c) if "train" in sections else None
    M = Models(c, device)
    report.header()
    share = sum(ALLOT[s] for s in sections)
    try:
        for name, fn in (("numerics", numerics), ("train", functools.partial(train_section, plan_proc=plan_proc)),
                         ("decode", decode_section)):
            if name not in sections:
                continue
            sec = report.section(name, ALLOT[name] / share * budget)
            try:
                ensure_models(sec, M)
                fn(sec, M)
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
