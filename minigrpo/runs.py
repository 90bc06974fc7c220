"""The run folder and its checkpoints.

    runs/<name>/config.json          every resolved argument
    runs/<name>/metrics.jsonl        one line per optimizer step
    runs/<name>/samples.jsonl        prompts, completions, scores (and judge reasons) per step
    runs/<name>/checkpoints/step-N/  weights (LoRA adapter in PEFT layout, or full weights) + trainer_state.pt

Every file that must survive a kill is written to a temporary name and renamed into place (rename is atomic on
POSIX), so a crash, a judge failure or SIGKILL never leaves a half-written checkpoint: a checkpoint folder either
exists complete or not at all. The append-only logs are cut back to the checkpoint's step on resume, so the
resumed run's logs equal an uninterrupted run's.
"""
import json
import math
import os
import random
import shutil

import numpy as np
import torch
from safetensors.torch import load_file, save_file


class RunFolder:
    def __init__(self, root: str, name: str):
        self.path = os.path.join(root, name)
        self.ckpt_dir = os.path.join(self.path, "checkpoints")

    @staticmethod
    def saved_config(root: str, name: str | None) -> dict:
        if not name:
            raise SystemExit("--resume needs --run-name: the run folder to continue")
        path = os.path.join(root, name, "config.json")
        if not os.path.exists(path):
            raise SystemExit(f"--resume: {path} does not exist; start the run without --resume first")
        with open(path) as f:
            cfg = json.load(f)
        cfg.pop("resume", None)
        return cfg

    def create(self, config: dict, fresh: bool = True):
        """Start the run folder. A fresh run refuses a folder that already holds a run's logs, so that two runs
        never interleave their metrics; --resume of a run killed before its first checkpoint starts it over."""
        if fresh and os.path.exists(self.file("metrics.jsonl")):
            raise SystemExit(f"{self.path} already holds a run: pass --resume to continue it, or another --run-name")
        os.makedirs(self.ckpt_dir, exist_ok=True)
        os.chmod(self.path, 0o700)     # samples, the judge's cache and checkpoints: nobody else's to read
        self.truncate_logs(0)
        write_atomic(os.path.join(self.path, "config.json"), json.dumps(config, indent=2, default=str) + "\n")

    def file(self, name):
        return os.path.join(self.path, name)

    def append(self, name: str, record: dict):
        with open(self.file(name), "a") as f:
            f.write(json.dumps(record, default=_jsonable) + "\n")
            f.flush()

    def truncate_logs(self, step: int):
        """Keep only the lines of steps <= `step` (what the checkpoint being resumed had seen)."""
        for name in ("metrics.jsonl", "samples.jsonl"):
            path = self.file(name)
            if not os.path.exists(path):
                continue
            with open(path) as f:
                lines = [ln for ln in f if ln.strip()]
            keep = []
            for ln in lines:
                try:
                    if json.loads(ln).get("step", 0) <= step:
                        keep.append(ln)
                except json.JSONDecodeError:   # a line cut by a kill mid-write
                    pass
            write_atomic(path, "".join(keep))

    def checkpoints(self) -> list[int]:
        if not os.path.isdir(self.ckpt_dir):
            return []
        steps = [int(d[5:]) for d in os.listdir(self.ckpt_dir) if d.startswith("step-") and d[5:].isdigit()]
        return sorted(steps)

    def latest_checkpoint(self) -> str | None:
        steps = self.checkpoints()
        return os.path.join(self.ckpt_dir, f"step-{steps[-1]}") if steps else None

    def prune(self, keep: int):
        for step in self.checkpoints()[:-keep] if keep > 0 else []:
            shutil.rmtree(os.path.join(self.ckpt_dir, f"step-{step}"), ignore_errors=True)


def write_atomic(path: str, text: str):
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _jsonable(x):
    if isinstance(x, torch.Tensor):
        return x.tolist()
    if isinstance(x, (np.floating, np.integer)):
        return x.item()
    return str(x)


# -----------------------------------------------------------------------------------------------------------------
# What one step logs: DESIGN.md's list, one line per step in metrics.jsonl


def mean(xs):
    xs = [x for x in xs if x is not None]
    return sum(xs) / len(xs) if xs else None


def std(xs):
    xs = [x for x in xs if x is not None]
    m = mean(xs)
    return math.sqrt(sum((x - m) ** 2 for x in xs) / len(xs)) if xs else None


def step_metrics(step, epoch, seqs, adv_stats, loss_stats, grad_norm, lr, t_sample, t_train, extra):
    """Summarise one step. `seqs` are every rank's Seqs (gathered); loss_stats this rank's micro-batch stats."""
    tokens = sum(len(s.completion_ids) for s in seqs)
    w = [st["tokens"] for st in loss_stats] or [1.0]
    wmean = lambda key: sum(st.get(key, 0.0) * n for st, n in zip(loss_stats, w)) / max(sum(w), 1.0)
    m = {
        "step": step, "epoch": epoch,
        "reward_mean": mean([s.score for s in seqs if s.turn == max(x.turn for x in seqs)]),
        "reward_std": std([s.score for s in seqs]),
        "shaped_reward_mean": mean([s.reward for s in seqs]),
        "shaped_reward_std": std([s.reward for s in seqs]),
        "loss": wmean("loss"), "pg": wmean("pg"), "kl": wmean("kl"), "entropy": wmean("entropy"),
        "clip_low": wmean("clip_low"), "clip_high": wmean("clip_high"), "ratio_mean": wmean("ratio_mean"),
        "sampler_logp_diff": wmean("sampler_logp_diff"),
        "grad_norm": grad_norm, "lr": lr,
        "completion_len": tokens / max(len(seqs), 1),
        "truncated": sum(s.finish == "length" for s in seqs) / max(len(seqs), 1),
        "zero_spread": adv_stats.get("zero_spread_frac", adv_stats.get("zero_spread", 0)),
        "failed_scores": sum(s.score is None for s in seqs),
        "sampler_tok_s": tokens / max(t_sample, 1e-9),
        "trainer_tok_s": tokens * 1.0 / max(t_train, 1e-9),
    }
    for turn in sorted({s.turn for s in seqs}):
        m[f"score_turn{turn}"] = mean([s.score for s in seqs if s.turn == turn])
    m.update(extra)
    return m


def sample_records(step, seqs, tok):
    return [{"step": step, "example": s.example_id, "turn": s.turn, "prompt": tok.decode(s.prompt_ids),
             "completion": s.text, "finish": s.finish, "score": s.score, "reward": s.reward,
             "advantage": s.advantage, **({"info": s.info} if s.info else {})} for s in seqs]


def epoch_summary(metrics_path, max_rows: int = 10) -> str:
    """Mean reward per epoch (first and last step of each too); runs of many short epochs are merged into at most
    `max_rows` contiguous blocks."""
    epochs = {}
    with open(metrics_path) as f:
        for ln in f:
            m = json.loads(ln)
            if m.get("reward_mean") is not None:
                epochs.setdefault(m["epoch"], []).append(m["reward_mean"])
    keys = sorted(epochs)
    size = max(1, math.ceil(len(keys) / max_rows))
    lines = ["| epoch | steps | reward (mean) | first step | last step |", "|---|---|---|---|---|"]
    for i in range(0, len(keys), size):
        block = keys[i:i + size]
        rs = [r for k in block for r in epochs[k]]
        label = f"{block[0]}" if len(block) == 1 else f"{block[0]}-{block[-1]}"
        lines.append(f"| {label} | {len(rs)} | {sum(rs) / len(rs):.3f} | {rs[0]:.3f} | {rs[-1]:.3f} |")
    return "\n".join(lines)


# -----------------------------------------------------------------------------------------------------------------
# Checkpoints

def rng_state() -> dict:
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict):
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def full_weights(model) -> dict:
    """State dict without LoRA wrappers' duplicates and without a tied lm_head (safetensors refuses shared
    storage; the loader re-ties it)."""
    sd = model.state_dict()
    if model.lm_head.weight is model.model.embed_tokens.weight:
        sd.pop("lm_head.weight", None)
    return {k: v.detach().contiguous() for k, v in sd.items()}


def save_checkpoint(run: RunFolder, step: int, model, trainer_state: dict, lora: bool):
    """Write checkpoints/step-N atomically: build it in a temporary folder, then rename."""
    from minigrpo.lora import save_adapter
    final = os.path.join(run.ckpt_dir, f"step-{step}")
    tmp = os.path.join(run.ckpt_dir, f".tmp-step-{step}-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    if lora:
        save_adapter(model, os.path.join(tmp, "adapter"))
    else:
        save_file(full_weights(model), os.path.join(tmp, "model.safetensors"))
    torch.save(trainer_state, os.path.join(tmp, "trainer_state.pt"))
    _fsync_dir(tmp)
    if os.path.exists(final):       # re-saving the same step (e.g. after a resume): replace it whole
        shutil.rmtree(final)
    os.replace(tmp, final)
    _fsync_dir(run.ckpt_dir)


def load_checkpoint(path: str, model, lora: bool) -> dict:
    from minigrpo.lora import load_adapter
    if lora:
        load_adapter(model, os.path.join(path, "adapter"))
    else:
        sd = load_file(os.path.join(path, "model.safetensors"))
        missing, unexpected = model.load_state_dict(sd, strict=False)
        missing = [k for k in missing if k != "lm_head.weight"]
        if missing or unexpected:
            raise SystemExit(f"{path}/model.safetensors does not match the model: missing {missing[:3]}, "
                             f"unexpected {unexpected[:3]}; was it saved from another --model?")
    return torch.load(os.path.join(path, "trainer_state.pt"), weights_only=False)


def _fsync_dir(path):
    try:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError:
        pass
