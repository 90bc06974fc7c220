"""The optimizer and the learning-rate schedule every trainer here uses: AdamW and a linear warmup followed by a
cosine decay to zero (or a constant rate). LoRA weights and the AdamW state are fp32 whatever the model dtype."""
import math

import numpy as np

import torch


def warmup_steps(warmup: float, total_steps: int) -> float:
    """--warmup: a number of steps, or a fraction of all steps when it is below 1."""
    return warmup * total_steps if 0 < warmup < 1 else warmup


def lr_factor(step: int, total_steps: int, warmup: float, schedule: str = "cosine") -> float:
    """The learning rate's multiplier after `step` optimizer steps: (step + 1) / (warmup + 1) while step < warmup,
    then 1 (constant) or cosine from 1 at step = warmup down to 0 at the last step."""
    if step < warmup:
        return (step + 1) / (warmup + 1)
    if schedule == "constant":
        return 1.0
    progress = (step - warmup) / max(1.0, total_steps - warmup)
    return 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))


def adamw(params, lr: float, total_steps: int, warmup: float = 0, schedule: str = "cosine", beta2: float = 0.999,
          weight_decay: float = 0.0):
    """(AdamW, LambdaLR) with lr_factor's schedule; call sched.step() once per optimizer step. warmup: steps, or a
    fraction of total_steps when below 1 (warmup_steps)."""
    warmup = warmup_steps(warmup, total_steps)
    opt = torch.optim.AdamW(params, lr=lr, betas=(0.9, beta2), weight_decay=weight_decay)
    return opt, torch.optim.lr_scheduler.LambdaLR(opt, lambda step: lr_factor(step, total_steps, warmup, schedule))


def adamw_pipeline(params, lr, steps, warmup):
    """The mdp pipeline's SFT and DPO stages (minigrpo/experiments/supervised.py): AdamW (beta2 0.99, no weight
    decay), linear warmup over n = int(warmup * steps) steps, the last of them at the peak, then cosine from the peak
    to zero. Not lr_factor: the peak is held for one step more. One formula for both would move the mdp quickstart's
    numbers, so the two stay side by side until a change that may move them."""
    opt = torch.optim.AdamW(params, lr=lr, betas=(0.9, 0.99), weight_decay=0.0)
    n_warm = max(1, int(warmup * steps))
    factor = lambda s: (s + 1) / n_warm if s < n_warm else \
        0.5 * (1 + np.cos(np.pi * (s - n_warm) / max(1, steps - n_warm)))
    return opt, torch.optim.lr_scheduler.LambdaLR(opt, factor)
