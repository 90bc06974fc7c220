"""The pieces of one optimizer step's update, as train.py's policy_update uses them: a micro-batch of sampled
sequences (left-padded, with its loss mask and the sampler's log-probs), the micro-batches of a step (grouped by
length), the step's loss normaliser over every micro-batch of every rank, the trainer's log-probs of the policy and
of the frozen reference, the gradients summed over ranks (under torchrun: minigrpo/run/dist.py) and clipped; then
the optimizer and its learning-rate schedule: AdamW and a linear warmup followed by a cosine decay to zero (or a
constant rate). LoRA weights and the AdamW state are fp32 whatever the model dtype."""
import math
from contextlib import nullcontext
from dataclasses import dataclass, replace

import torch

from minigrpo import grpo, moe
from minigrpo.logprobs import packed_token_logprobs, token_logprobs
from minigrpo.packing import left_pad
from minigrpo.grpo import LossSettings
from minigrpo.lora import adapters_disabled
from minigrpo.packing import Pack, completion_columns, pack


@dataclass
class Packed:
    """A micro-batch's sequences packed into one row (minigrpo/packing.py), what the model runs when packing."""
    ids: torch.Tensor          # (1, N) every sequence's prompt + completion, one after the other
    pack: Pack                 # where each token belongs
    src: torch.Tensor          # (n,) the packed columns the log-probs need (completions')
    dst: torch.Tensor          # (n,) where each lands in the (B, T-1) table


@dataclass
class Batch:
    """One micro-batch, left-padded; every (B, T-1) tensor is aligned as logprobs.token_logprobs is."""
    ids: torch.Tensor          # (B, T) prompt + completion
    attn: torch.Tensor         # (B, T) 1 = real token
    mask: torch.Tensor         # (B, T-1) True = a completion token to train (collate)
    adv: torch.Tensor          # (B,) advantage of each sequence
    sampled: torch.Tensor      # (B, T-1) the sampler's log-probs of the completion tokens
    first_col: int             # first column any completion occupies: logits are needed only from there
    packed: Packed | None = None  # set: the model runs the packed row, its log-probs land in the (B, T-1) layout
    # MoE: the sampler's routes of every token (B, T, M, k), or (1, N, M, k) as the packed row, -1 where none was
    # recorded (pads, a completion's last token); None for a dense model. replay: every pass over the batch routes
    # through them (routing replay, docs/moe.md); False: the trainer routes itself and only counts the flips
    routes: torch.Tensor | None = None
    replay: bool = True


def collate(seqs, pad_id, device, mask_truncated=False, packed=False, replay=True) -> Batch:
    """Left-pad prompt+completion; the loss mask covers each completion's positions, by position, never by token id
    (grpo.span_mask: the EOS a model emitted is trained even when it equals the pad id), and of those the ones its
    Seq trains (Seq.loss_mask: an episode's policy tokens, not its environment's; --mask-truncated drops the turns
    cut at max_new_tokens). packed: the model's forward runs the sequences packed into one row, without padding;
    the loss's tensors keep the padded layout. replay: route an MoE model's tokens through the sampler's experts
    (train.py --routing-replay)."""
    ids, attn = left_pad([s.prompt_ids + s.completion_ids for s in seqs], pad_id)
    T = ids.shape[1]
    lengths = [len(s.completion_ids) for s in seqs]
    loss_mask = grpo.span_mask([T - c for c in lengths], lengths, T)      # completions end at the last column
    sampled = torch.zeros((len(seqs), T - 1))
    for i, (s, c) in enumerate(zip(seqs, lengths)):
        if c:
            loss_mask[i, T - 1 - c:] &= torch.tensor(s.loss_mask(mask_truncated))
            sampled[i, T - 1 - c:] = torch.tensor(s.logprobs, dtype=torch.float32)   # column t scores token t+1
    adv = torch.tensor([s.advantage for s in seqs], dtype=torch.float32)
    first_col = T - 1 - max(lengths)
    pk = pack_of(seqs, lengths, T, device) if packed else None
    routes = routes_of(seqs, T, packed)
    return Batch(ids.to(device), attn.to(device), loss_mask.to(device), adv.to(device), sampled.to(device), first_col,
                 pk, None if routes is None else routes.to(device), replay)


def routes_of(seqs, T, packed):
    """The sequences' recorded routes, left-padded to T ((B, T, M, k)) or one after the other ((1, N, M, k)), -1
    where a token has none (a pad; tokens past a Seq's routes, as the tail of an episode after its last answer);
    None when no Seq has routes (a dense model)."""
    like = next((s.routes for s in seqs if s.routes is not None), None)
    if like is None:
        return None
    per_seq = []
    for s in seqs:
        n = len(s.prompt_ids) + len(s.completion_ids)
        r = torch.full((n, *like.shape[1:]), -1, dtype=like.dtype)
        if s.routes is not None:
            if len(s.routes) > n:
                raise ValueError(f"a Seq of example {s.example_id} has routes for {len(s.routes)} tokens, {n} ids")
            r[:len(s.routes)] = s.routes
        per_seq.append(r if packed else torch.cat([r.new_full((T - n, *like.shape[1:]), -1), r]))
    return torch.cat(per_seq)[None] if packed else torch.stack(per_seq)


def routed(model, b: Batch):
    """The routing of every pass over batch b (moe.routing; nothing for a dense model). A backward of a
    checkpointed model recomputes its layers, so it must run inside too."""
    return nullcontext() if b.routes is None else moe.routing(model, b.routes, follow=b.replay)


def route_flips(model, b: Batch) -> dict:
    """After a forward over b inside `routed`: the token-layer routes the model would have chosen otherwise than
    the sampler, and all of them (real tokens with a recorded route); {} for a dense model."""
    if b.routes is None:
        return {}
    flips, total = moe.route_flips(model, None if b.packed is not None else b.attn.bool())
    return {"route_flips": flips, "routes": total}


def with_advantages(b: Batch, seqs) -> Batch:
    """The batch with its sequences' advantages as they are now: a batch collated before they were set (its fixed
    log-probs computed while the judge graded) gets them here."""
    return replace(b, adv=torch.tensor([s.advantage for s in seqs], dtype=torch.float32).to(b.adv.device))


@dataclass
class Fixed:
    """A rank's micro-batches of a step and the log-probs that stay fixed over its passes: the reference's (None
    with beta 0) and the behaviour policy's (None with mu 1). All of it is read from the Seqs' tokens, never from
    a reward, so it may be computed before the step's grades are in."""
    batches: list              # collate's; advantages set later by with_advantages
    positions: list            # per micro-batch, the positions of its Seqs in the rank's list
    refs: list
    olds: list


def pack_of(seqs, completion_lengths, T, device) -> Packed:
    """The packed row of a micro-batch's sequences and where their completions' log-probs go."""
    seq_ids = [s.prompt_ids + s.completion_ids for s in seqs]
    lengths = [len(x) for x in seq_ids]
    src, dst = completion_columns(lengths, completion_lengths, T)
    ids = torch.tensor([t for x in seq_ids for t in x], dtype=torch.long)[None]
    return Packed(ids.to(device), pack(lengths, device), src.to(device), dst.to(device))


def micro_batches(seqs, size):
    """Cut `seqs` into micro-batches of `size` after sorting them by length (prompt + completion), longest first
    and ties in rollout order: each micro-batch is padded to its longest sequence, so a short turn-0 sequence
    is batched with other short ones, not with a revision many times its length (bench/padding.py measures the
    padding share). The loss does not depend on the cut (the step normaliser); the longest batch comes first, so
    a run that runs out of memory does so on its first micro-batch."""
    order = sorted(seqs, key=lambda s: len(s.prompt_ids) + len(s.completion_ids), reverse=True)  # stable
    return [order[i:i + size] for i in range(0, len(order), size)]


def positions(seqs, batches) -> list:
    """Per micro-batch of `seqs` (micro_batches'), the positions of its Seqs in `seqs`."""
    at = {id(s): i for i, s in enumerate(seqs)}
    return [[at[id(s)] for s in mb] for mb in batches]


def step_normalizer(batches, settings: LossSettings, dist_info) -> float:
    """The loss denominator of the whole optimizer step: over every micro-batch of every rank."""
    local = grpo.loss_normalizer([b.mask for b in batches], settings.agg, max_tokens=settings.max_tokens)
    return all_reduce_sum([local], dist_info)[0]


def log_probs(model, b: Batch, temperature, vocab_size, entropy=False):
    """The trainer's log-probs: logits / temperature with the sampler's temperature, ids past the tokenizer's
    vocabulary masked, as the sampler does, so that the two agree; the lm_head runs only over completion columns.
    A packed batch runs its packed row and gives the same (B, T-1) layout. An MoE model routes through the batch's
    recorded routes (`routed`)."""
    with routed(model, b):
        if b.packed is not None:
            p = b.packed
            return packed_token_logprobs(model, p.ids, p.pack, p.src, p.dst, b.mask.shape, temperature=temperature,
                                         vocab_size=vocab_size, return_entropy=entropy)
        return token_logprobs(model, b.ids, b.attn, temperature=temperature, vocab_size=vocab_size,
                              return_entropy=entropy, first_col=b.first_col)


def reference_logprobs(model, reference, b: Batch, temperature, vocab_size):
    """The frozen reference's log-probs of the batch: `reference` when it is a model of its own (a full fine-tune),
    else the policy with its LoRA adapters switched off."""
    with torch.no_grad():
        if reference is not None:
            return log_probs(reference, b, temperature, vocab_size)
        with adapters_disabled(model):
            return log_probs(model, b, temperature, vocab_size)


def all_reduce_and_clip(params, max_grad_norm, dist_info) -> float:
    """Sum gradients over ranks (each rank already divided by the global normaliser), then clip. Every rank sends
    every parameter, zeros where it has no gradient (a rank without examples has none at all), so that all ranks
    send the same layout; one has-a-gradient count per parameter rides along, so that a parameter gets a gradient
    when some rank computed one and stays None (skipped by AdamW, as in one process) when none did. The clip is at
    max_grad_norm (0: none); returns the norm before it."""
    if dist_info.world > 1 and params:
        flat = torch.cat([p.grad.reshape(-1) if p.grad is not None else p.new_zeros(p.numel()) for p in params]
                         + [params[0].new_tensor([p.grad is not None for p in params])])
        all_reduce_(flat, dist_info)
        offset = 0
        for p, has in zip(params, flat[-len(params):].tolist()):
            summed = flat[offset:offset + p.numel()].view_as(p)
            offset += p.numel()
            if p.grad is not None:
                p.grad.copy_(summed)
            elif has:
                p.grad = summed.to(p.dtype, copy=True)
    clip = max_grad_norm if max_grad_norm > 0 else float("inf")    # 0: no clip, the norm is still measured
    return float(torch.nn.utils.clip_grad_norm_(params, clip))


# --------------------------------------------------------------------------------------------------------------
# Sums over ranks: every tensor a collective sees is on the collective's device (minigrpo/run/dist.py)

def all_reduce_(tensor, dist_info):
    """Sum `tensor` over ranks, in place, on dist_info.device: a tensor already there (gradients on the rank's
    GPU) is reduced where it is; one elsewhere (a CPU scalar under NCCL) goes there and its sum comes back."""
    if dist_info.world > 1:
        import torch.distributed as dist
        on = tensor.to(dist_info.device)
        dist.all_reduce(on)
        if on is not tensor:
            tensor.copy_(on.to(tensor.device))    # moved first: not every device's tensors copy_ across (lazy's)
    return tensor


def all_reduce_sum(values, dist_info) -> list[float]:
    """Python numbers summed over ranks, in float64 on dist_info.device (a count of tokens stays exact)."""
    return all_reduce_(torch.tensor(values, dtype=torch.float64, device=dist_info.device), dist_info).tolist()


# --------------------------------------------------------------------------------------------------------------
# The optimizer and its schedule

def warmup_steps(warmup: float, total_steps: int) -> float:
    """--warmup: a number of steps, or a fraction of all steps when it is below 1."""
    return warmup * total_steps if 0 < warmup < 1 else warmup


def lr_factor(step: int, total_steps: int, warmup: float, schedule: str = "cosine",
              peak_in_warmup: bool = False) -> float:
    """The learning rate's multiplier after `step` optimizer steps: a linear warmup, then 1 (constant) or cosine
    from 1 at step = warmup down to 0 at the last step. The warmup is (step + 1) / (warmup + 1), whose peak is the
    cosine's first step; with peak_in_warmup it is (step + 1) / warmup, whose last step is already the peak, so the
    peak lasts a step more: the SFT and DPO stages' ramp (experiments/supervised.py), kept because the results the
    README quotes were trained with it."""
    if step < warmup:
        return (step + 1) / (warmup + (0 if peak_in_warmup else 1))
    if schedule == "constant":
        return 1.0
    progress = (step - warmup) / max(1.0, total_steps - warmup)
    return 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))


def adamw(params, lr: float, total_steps: int, warmup: float = 0, schedule: str = "cosine", beta2: float = 0.999,
          weight_decay: float = 0.0, peak_in_warmup: bool = False):
    """(AdamW, LambdaLR) with lr_factor's schedule; call sched.step() once per optimizer step. warmup: steps, or a
    fraction of total_steps when below 1 (warmup_steps)."""
    warmup = warmup_steps(warmup, total_steps)
    opt = torch.optim.AdamW(params, lr=lr, betas=(0.9, beta2), weight_decay=weight_decay)
    factor = lambda step: lr_factor(step, total_steps, warmup, schedule, peak_in_warmup)
    return opt, torch.optim.lr_scheduler.LambdaLR(opt, factor)
