"""bench/device.py's numerics section: what decides whether a run trains at all, measured first.

  - ours in bf16 (LoRA attached, B = 0) against ours in fp32 on the same weights: max / mean |dlogits| over the real
    positions and top-1 agreement; the GRPO KL at step 0 (the policy is the reference: exactly 0);
  - a few AdamW steps at soyuz's rate (lr 1e-5, constant) on a GRPO-shaped loss over random sequences (advantages
    +-1, the KL term at beta): LoRA B moves as a run's first steps move it;
  - then, on soyuz's revision-call prompts, each decode path's sampled log-probs against the trainer's recomputation
    of the same tokens: the gap (mean / p95 / max of |trainer - sampler|) and the share of the LoRA update the
    sampler carries, sum((s - b)(t - b)) / sum((t - b)^2) over the sampled tokens, with t the trainer's, s the
    sampler's and b the base model's log-probs (the adapters disabled): 1 when the sampler samples the policy the
    trainer scores, 0 when it samples the base model. The paths: eager and the fast path's static step uncompiled
    (Settings(static=True)), which tells the compiler's part from the step's; the fast path itself
    (train.rollout_sampler with --decode fast: Settings(compile=True)) is the compile section's (`compile_section`):
    its first call compiles the graph the decode section then times.
"""

import argparse
import contextlib
import copy
import time

import torch

from device_decode import rollout_call, sync
from device_report import Skip


@contextlib.contextmanager
def no_tf32():
    """fp32 references in full fp32; the bf16 runs keep PyTorch's defaults (cuDNN's TF32 on), as train.py has."""
    old = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = old


def logits_batch(M):
    """The numerics batch (B=2, one row left-padded) and its positions, kept on M for the transformers section."""
    T, dev = M.cfg["num_len"], M.device
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, M.vocab - 16, (2, T), generator=g).to(dev)
    mask = torch.ones(2, T, dtype=torch.long, device=dev)
    mask[1, :T // 8] = 0
    pos = (mask.cumsum(-1) - 1).clamp(min=0)  # as ours and generate(); a plain transformers forward uses arange
    return ids, mask, pos


def compare(M, side, model_fn):
    """One row: model_fn()'s logits against ours in fp32 (M.ref_logits) over the batch's real positions."""
    if getattr(M, "ref_logits", None) is None:
        raise Skip("no fp32 reference")
    ids, mask, _ = M.batch
    real = mask.bool()
    with torch.no_grad():
        a = model_fn()
    d = (a - M.ref_logits).abs()[real]
    top1 = (a.argmax(-1) == M.ref_logits.argmax(-1))[real].float().mean().item()
    return {side: f"max {d.max().item():.3g}, mean {d.mean().item():.2g}, top-1 {100 * top1:.1f}%",
            "note": f"over {int(real.sum())} real positions"}


def grpo_batch(M, rows, prompt, completion, seed):
    """Random sequences shaped as a rollout's, advantages +-1, collated as train.py collates them."""
    import train
    from minigrpo.tasks.base import Seq
    g = torch.Generator().manual_seed(seed)
    V = M.vocab - 16
    seqs = [Seq(str(i), 1, torch.randint(0, V, (prompt,), generator=g).tolist(),
                torch.randint(0, V, (completion,), generator=g).tolist(), [0.0] * completion, "length", "", 0.0,
                advantage=(-1.0) ** i) for i in range(rows)]
    return train.collate(seqs, M.pad, M.device)


def numerics(sec, M):
    from minigrpo import grpo
    import train
    c, need = M.cfg, M.cfg["need"]
    M.batch = ids, mask, _ = logits_batch(M)

    def fp32():
        ours32 = M.copy_in(torch.float32)
        with torch.no_grad(), no_tf32():
            M.ref_logits = ours32(ids, attention_mask=mask).float()
        del ours32
        return dict(minigrpo=f"mean abs logit {M.ref_logits[mask.bool()].abs().mean().item():.3g}",
                    note="the reference of the rows below and of the transformers section (TF32 off)")

    def kl_step0():
        b = grpo_batch(M, 2, c["num_len"] // 2, c["num_len"] // 2, seed=1)
        M.ours.eval()
        ref_lp = train.reference_logprobs(M.ours, None, b, M.args.temperature, M.vocab)
        M.ours.train()
        logp, _ = train.log_probs(M.ours, b, M.args.temperature, M.vocab, entropy=True)
        _, st = grpo.policy_loss(logp, b.adv, b.mask, grpo.LossSettings(beta=M.args.beta, kl_kind=M.args.kl),
                                 grpo.loss_normalizer([b.mask]), grpo.Against(ref=ref_lp))
        M.ours.eval()
        kl, dmax = float(st["kl"]), (logp.detach() - ref_lp).abs()[b.mask.bool()].max().item()
        return dict(minigrpo=f"KL {kl:.3g}: {'exactly 0' if kl == 0.0 else 'NOT 0'}",
                    note=f"max abs(logp - ref) {dmax:.3g}; policy with grad, train mode, checkpointing; reference "
                         f"under adapters_disabled, no grad; beta {M.args.beta}")

    sec.measure(f"ours fp32 logits, B=2 T={c['num_len']}", fp32, need=need["fp32"])
    sec.measure("ours bf16 (LoRA attached, B = 0) vs ours fp32",
                lambda: compare(M, "minigrpo", lambda: M.ours(ids, attention_mask=mask).float()), need=need["compare"])
    sec.measure("KL at step 0 (LoRA B = 0)", kl_step0, need=need["kl"])
    sec.measure(f"{c['opt_steps']} AdamW steps at soyuz's lr {M.args.lr:g} on a GRPO loss", lambda: optimizer_steps(M),
                need=need["steps"])
    gaps(sec, M)


def optimizer_steps(M):
    """AdamW at the preset's lr, constant, on policy_loss (+ beta KL) over random rollout-shaped sequences: what a
    run's first steps do to LoRA B (Adam moves each element by about lr per step, whatever the gradient's size)."""
    from minigrpo import grpo
    from minigrpo.update import adamw
    import train
    c, args = M.cfg, M.args
    opt, _ = adamw(M.params, args.lr, c["opt_steps"], 0, "constant", args.adam_beta2, args.weight_decay)
    t0 = time.perf_counter()
    for step in range(c["opt_steps"]):
        b = grpo_batch(M, 2, c["num_len"] // 2, c["num_len"] // 2, seed=10 + step)
        M.ours.eval()
        ref = train.reference_logprobs(M.ours, None, b, args.temperature, M.vocab)
        M.ours.train()
        logp = train.log_probs(M.ours, b, args.temperature, M.vocab)
        loss, _ = grpo.policy_loss(logp, b.adv, b.mask, grpo.LossSettings(beta=args.beta, kl_kind=args.kl),
                                   grpo.loss_normalizer([b.mask]), grpo.Against(ref=ref))
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    M.ours.eval()
    sync(M.device)
    lora_b = [p for n, p in M.ours.named_parameters() if "lora_B" in n]
    rms = torch.cat([p.detach().float().flatten() for p in lora_b]).square().mean().sqrt().item()
    M.stepped = True
    return dict(minigrpo=f"LoRA B rms {rms:.2g}",
                note=f"{time.perf_counter() - t0:.1f} s; B=2 x {c['num_len']} tokens per step, beta {args.beta}")


def gap_prompts(M):
    """soyuz's revision call as the decode section times it (the same rows and cache bucket: one compiled graph)."""
    import sampler as sampler_bench  # bench/sampler.py
    import train
    c = M.cfg
    lengths = [c["prompt"] - (c["prompt"] // (4 * c["rows"])) * i for i in range(c["rows"])]   # down to ~3/4
    prompts = sampler_bench.prompts_for(lengths, M.vocab)
    return prompts, [train.sample_seed(M.args, 0, i) for i in range(len(prompts))]


def draw(M, path, prompts, seeds, k):
    """Samples of every prompt on one decode path: "eager" and "fast" as train.py calls them (train.rollout_sampler),
    "static" the fast path's static step uncompiled (the sampler's public Settings(static=True))."""
    from minigrpo.sampler import Settings, sample
    args = argparse.Namespace(**vars(M.args))
    args.max_new_tokens = k
    if path != "static":
        args.decode = path
        return [s[0] for s in rollout_call(M.ours, M.tok, args, prompts, seeds, 1)]
    M.ours.eval()
    with torch.no_grad():
        settings = Settings(n=1, max_new_tokens=k, temperature=args.temperature, top_p=args.top_p, top_k=args.top_k,
                            stop_ids=(), vocab_size=M.vocab, pad_id=M.pad, static=True, rows=len(prompts))
        return sample(M.ours, prompts, settings, seed=list(seeds))


def gap_stats(M, prompts, got):
    """(gap: |trainer - sampler| per token, share of the update the sampler carries, mean |trainer - base|)."""
    import train
    from minigrpo.tasks.base import Seq
    seqs = [Seq(str(i), 1, prompts[i], s.completion_ids, s.logprobs, s.finish_reason, "", 0.0)
            for i, s in enumerate(got)]
    b = train.collate(seqs, M.pad, M.device)
    with torch.no_grad():
        t = train.log_probs(M.ours, b, M.args.temperature, M.vocab)
        base = train.reference_logprobs(M.ours, None, b, M.args.temperature, M.vocab)
    real = b.mask.bool()
    t, s, base = t[real].double(), b.sampled[real].double(), base[real].double()
    share = ((s - base) * (t - base)).sum() / (t - base).square().sum().clamp(min=1e-30)
    return (t - s).abs(), share.item(), (t - base).abs().mean().item()


def gap_row(M, path):
    """One decode path's row: its samples of soyuz's revision call against the trainer's log-probs."""
    if not getattr(M, "stepped", False):
        raise Skip("no optimizer step ran: LoRA B is 0, there is no update to carry")
    prompts, seeds = gap_prompts(M)
    t0 = time.perf_counter()
    got = draw(M, path, prompts, seeds, M.cfg["gap_tokens"])
    dt = time.perf_counter() - t0
    d, share, moved = gap_stats(M, prompts, got)
    mean, q, top = d.mean().item(), d.quantile(0.95).item(), d.max().item()
    return dt, dict(minigrpo=f"share {share:.2f}; gap mean {mean:.3g}, p95 {q:.3g}, max {top:.3g}",
                    note=f"{d.numel()} tokens ({len(prompts)} rows x {M.cfg['gap_tokens']}); mean abs(trainer - "
                         f"base) {moved:.3g}; {dt:.1f} s")


def gaps(sec, M):
    """The eager path and the fast path's static step uncompiled; the fast path itself is the compile section's."""
    c, need = M.cfg, M.cfg["need"]
    what = f"{c['rows']} rows x ~{c['prompt']} tokens"
    sec.measure(f"sampler vs trainer after the steps, eager path, {what}", lambda: gap_row(M, "eager")[1],
                need=need["gap"])
    sec.measure(f"sampler vs trainer, the fast path's static step uncompiled, {what}", lambda: gap_row(M, "static")[1],
                need=need["static"])


def compile_section(sec, M):
    """The fast path's first call, on its own allotment: it compiles the graph the decode section times (one graph
    for every length: the cache's slot count is dynamic), and its samples give the fast path's gap. The row says the
    compile's seconds by phase (torch._dynamo's counters) and, when the compile failed, its error: the sampler then
    decoded with the uncompiled static step (static_decode.decode_call's fallback)."""
    from torch._dynamo.utils import calculate_time_spent
    from minigrpo import static_decode
    c, cuda = M.cfg, M.device.type == "cuda"
    sec.extend(c["compile_cap"])   # the window's main number: later sections (train, transformers last) lose the time

    def first_call():
        M.compile_tried = True
        before = calculate_time_spent()
        dt, row = gap_row(M, "fast")
        M.fast_compiled = dt
        spent = {k: v - before.get(k, 0.0) for k, v in calculate_time_spent().items() if k != "total_wall_time"}
        phases = ", ".join(f"{k} {v:.1f} s" for k, v in spent.items() if v >= 0.05)
        failed = static_decode.compile_failure(M.device)
        how = (f"COMPILE FAILED ({failed}): decoded by the uncompiled static step" if failed else
               f"compile by phase: {phases or 'none (cached)'}; the rest: prefill, "
               f"{'CUDA graph capture, ' if cuda else ''}{c['gap_tokens']} steps")
        row["note"] += f" (its first call); {how}"
        return row

    sec.measure(f"sampler vs trainer, fast path (--decode fast), its first call: the compile, {c['rows']} rows x "
                f"~{c['prompt']} tokens", first_call, need=c["need"]["compile"], cap=c["compile_cap"])


def transformers_numerics(sec, M):
    """transformers' bf16 and fp32 logits against ours in fp32 (the fp32 pair: a bf16 difference is the dtype's,
    not the code's)."""
    need = M.cfg["need"]
    if getattr(M, "batch", None) is None:
        M.batch = logits_batch(M)
    ids, mask, pos = M.batch

    def hf32():
        m = copy.deepcopy(M.hf).float()
        with no_tf32():
            return m(input_ids=ids, attention_mask=mask, position_ids=pos).logits.float()

    sec.measure("transformers bf16 vs ours fp32", lambda: compare(
        M, "transformers", lambda: M.hf(input_ids=ids, attention_mask=mask, position_ids=pos).logits.float()),
        need=need["compare"])
    sec.measure("transformers fp32 vs ours fp32", lambda: compare(M, "transformers", hf32), need=need["fp32"])
