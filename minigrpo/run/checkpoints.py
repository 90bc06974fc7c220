"""Run checkpoints: save, load, list, prune.

    runs/<name>/checkpoints/step-N/adapter/             LoRA adapter in PEFT layout, naming its base model
    runs/<name>/checkpoints/step-N/model.safetensors    or, for a full fine-tune, the weights with config.json and
                                                        the tokenizer's files beside them: a model folder
    runs/<name>/checkpoints/step-N/trainer_state.pt     optimizer, scheduler, every RNG, step, data position

Either kind loads elsewhere: eval.py --adapter / --model, pretrained.load_pretrained, and
`python -m minigrpo.run.export`.

A checkpoint is built in a temporary folder and renamed into place (rename is atomic on POSIX), so a crash, a
judge failure or SIGKILL never leaves a half-written one: a step-N folder either exists complete or not at all.
What a kill leaves is a .tmp-step-N-PID folder, which the next start removes (runs.RunFolder.remove_temporary).
A step-N folder that still cannot be read (a disk error, a file cut by hand or by a full disk outside train.py) is
set aside as step-N.damaged by load_latest, which resumes from the newest one that loads.
"""
import errno
import json
import os
import pickle
import random
import shutil
import sys

import numpy as np
import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from minigrpo.files import atomic_write, disk_full
from minigrpo.run.lora_files import load_adapter, save_adapter

PREFIX = "step-"
TMP_PREFIX = f".tmp-{PREFIX}"     # a checkpoint being written: .tmp-step-N-PID
STATE_KEYS = {"step", "data", "optimizer", "scheduler", "rng", "nonfinite"}
UNREADABLE = (OSError, EOFError, RuntimeError, ValueError, pickle.UnpicklingError, SafetensorError)


class DamagedCheckpoint(Exception):
    """A checkpoint file that cannot be read back; the message names the file and what went wrong."""


# ----------------------------------------------------------------------------------------------------------------
# Listing


def steps(ckpt_dir: str) -> list[int]:
    """The steps of the complete checkpoints in ckpt_dir, ascending (temporary folders are not listed)."""
    if not os.path.isdir(ckpt_dir):
        return []
    return sorted(int(d[len(PREFIX):]) for d in os.listdir(ckpt_dir)
                  if d.startswith(PREFIX) and d[len(PREFIX):].isdigit())


def path(ckpt_dir: str, step: int) -> str:
    return os.path.join(ckpt_dir, f"{PREFIX}{step}")


def latest(ckpt_dir: str) -> str | None:
    """The folder of the latest complete checkpoint, or None."""
    found = steps(ckpt_dir)
    return path(ckpt_dir, found[-1]) if found else None


def prune(ckpt_dir: str, keep: int):
    """Delete all but the `keep` latest checkpoints (keep <= 0: delete none)."""
    for step in steps(ckpt_dir)[:-keep] if keep > 0 else []:
        shutil.rmtree(path(ckpt_dir, step), ignore_errors=True)


# ----------------------------------------------------------------------------------------------------------------
# Saving and loading


def rng_state() -> dict:
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict):
    """The generator states are CPU byte tensors, and the setters take nothing else; a trainer state loaded with
    map_location onto a GPU carries them there."""
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"].cpu())
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all([s.cpu() for s in state["cuda"]])


def full_weights(model) -> dict:
    """State dict without LoRA wrappers' duplicates and without a tied lm_head (safetensors refuses shared
    storage; the loader re-ties it)."""
    sd = model.state_dict()
    if model.lm_head.weight is model.model.embed_tokens.weight:
        sd.pop("lm_head.weight", None)
    return {k: v.detach().contiguous() for k, v in sd.items()}


def save(ckpt_dir: str, step: int, model, trainer_state: dict, lora: bool, tokenizer=None):
    """Write ckpt_dir/step-N atomically: build it in a temporary folder, then rename. A full fine-tune's folder
    is a model folder too: config.json and (given `tokenizer`) the tokenizer's files beside model.safetensors."""
    final = path(ckpt_dir, step)
    tmp = os.path.join(ckpt_dir, f"{TMP_PREFIX}{step}-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    if lora:
        save_adapter(model, os.path.join(tmp, "adapter"))
    else:
        weights = full_weights(model)       # atomic_write gives it open()'s mode; safetensors' own is 0600
        atomic_write(os.path.join(tmp, "model.safetensors"), lambda p: save_file(weights, p))
        if model.config.raw:        # a model built from a config.json (hub, folder, tiny): a model folder too
            with open(os.path.join(tmp, "config.json"), "w") as f:
                json.dump(model.config.raw, f, indent=2)
            if tokenizer is not None:
                tokenizer.save_files(tmp)
    with open(os.path.join(tmp, "trainer_state.pt"), "wb") as f:   # Python's file: a full disk raises ENOSPC, where
        torch.save(trainer_state, f)                                # torch's own writer says only "unexpected pos"
    _fsync_dir(tmp)
    if os.path.exists(final):       # re-saving the same step (e.g. after a resume): replace it whole
        shutil.rmtree(final)
    os.replace(tmp, final)
    _fsync_dir(ckpt_dir)


def load(folder: str, model, lora: bool, map_location=None) -> dict:
    """Load a checkpoint's weights into `model`; returns its trainer state, its tensors (the optimizer's moments)
    on map_location: under torchrun each rank's own device, not the GPU of the rank that saved them. The trainer
    state is read first: a damaged one (DamagedCheckpoint) leaves the model untouched."""
    state_path = os.path.join(folder, "trainer_state.pt")
    try:
        state = torch.load(state_path, map_location=map_location, weights_only=False)
    except UNREADABLE as e:
        raise DamagedCheckpoint(f"{state_path}: {_first_line(e)}") from None
    if not isinstance(state, dict) or not STATE_KEYS <= state.keys():
        raise DamagedCheckpoint(f"{state_path}: not a trainer state (keys {sorted(STATE_KEYS)} expected)")
    if lora:
        try:
            load_adapter(model, os.path.join(folder, "adapter"))
        except UNREADABLE as e:
            raise DamagedCheckpoint(f"{os.path.join(folder, 'adapter')}: {_first_line(e)}") from None
    else:
        _load_full(folder, model)
    return state


def _load_full(folder, model):
    weights = os.path.join(folder, "model.safetensors")
    try:
        sd = load_file(weights)
    except UNREADABLE as e:
        raise DamagedCheckpoint(f"{weights}: {_first_line(e)}") from None
    missing, unexpected = model.load_state_dict(sd, strict=False)
    missing = [k for k in missing if k != "lm_head.weight"]
    if missing or unexpected:
        raise SystemExit(f"{folder}/model.safetensors does not match the model: missing {missing[:3]}, "
                         f"unexpected {unexpected[:3]}; was it saved from another --model?")


def load_latest(ckpt_dir: str, model, lora: bool, map_location=None, main: bool = True):
    """(folder, trainer state) of the newest checkpoint that loads, or (None, None) when there is none. Each newer
    one that does not load is named in one line with the one resumed from, and (rank 0) set aside as
    step-N.damaged: the steps after the one resumed from are redone, and its step is saved again when reached."""
    damaged = []
    for step in reversed(steps(ckpt_dir)):
        folder = path(ckpt_dir, step)
        try:
            state = load(folder, model, lora, map_location=map_location)
        except DamagedCheckpoint as e:
            damaged.append((folder, str(e)))
            continue
        for bad, why in damaged:
            if main:
                shutil.rmtree(bad + ".damaged", ignore_errors=True)
                os.replace(bad, bad + ".damaged")
                print(f"train.py: checkpoint {bad} is damaged ({why}); resuming from {folder} instead (the damaged "
                      f"one is kept as {os.path.basename(bad)}.damaged)", file=sys.stderr)
        return folder, state
    if damaged:
        raise SystemExit(f"--resume: no checkpoint in {ckpt_dir} can be read ({'; '.join(w for _, w in damaged)}); "
                         "start a new run under another --run-name")
    return None, None


def write_error(e: BaseException) -> str:
    """What went wrong when `e` was raised by writing a checkpoint ("" when it is not an I/O failure): errno's words
    for a full disk, whoever wrote (safetensors' writer says it in a sentence of its own), an OSError's own words
    (File too large), safetensors' message, or torch's writer's when given a path ("unexpected pos")."""
    if disk_full(e):
        return os.strerror(errno.ENOSPC)
    while e is not None:
        if isinstance(e, OSError):
            return e.strerror or _first_line(e)
        if isinstance(e, RuntimeError) and "inline_container" in str(e):   # "[enforce fail at ...] . unexpected pos"
            return "torch's writer stopped short: " + _first_line(str(e).split("]", 1)[-1].lstrip(" ."))
        if isinstance(e, SafetensorError):
            return _first_line(e)
        e = e.__cause__ or e.__context__
    return ""


def _first_line(e: BaseException, limit: int = 200) -> str:
    """The error's first sentence (torch's reader adds a paragraph of advice after it)."""
    text = (str(e).strip().splitlines() or [type(e).__name__])[0].split(". ")[0]
    return text if len(text) <= limit else text[:limit] + "..."


def _fsync_dir(folder):
    try:
        fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError:
        pass
