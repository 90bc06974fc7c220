"""The stages of a long pipeline (the mdp pipeline, the revise experiment), which a rerun skips once finished.

Each stage writes its output into a folder of its own (weights: config.json + model.safetensors, or a LoRA adapter;
a GRPO run folder) and then, last, stage.pt: the stage's results, the size of every file it wrote, every RNG's state
after the stage and the settings it ran with. A rerun into the same run folder finds it and, instead of running the
stage, takes its results and RNG state (and the pipeline loads its weights), so the later stages see the same
weights and random numbers and the run ends with the same results. A stage is run again when its stage.pt is
missing (killed mid-stage), unreadable, from other settings, or a file it lists is missing or of another size; from
then on every later stage runs too, since its input may have changed. Each decision is one line on stderr.
"""
import os
import shutil
import sys
from contextlib import contextmanager

import json

import torch
from safetensors.torch import save_file

from minigrpo.run.checkpoints import full_weights, rng_state, set_rng_state
from minigrpo.files import atomic_write

MARKER = "stage.pt"


class Stages:
    def __init__(self, settings: dict, label: str):
        """`settings`: what the results depend on (compared with a finished stage's); `label` starts each line."""
        self.settings, self.label, self.running = settings, label, False

    def done(self, name: str, folder: str, *more: str):
        """The saved result of stage `name` if it finished in an earlier run (every RNG restored to its state after
        it): skip the stage. Else None, with the stage's old output (`folder` and `more` folders) removed: run the
        stage, then call finish(folder, result)."""
        if not self.running:
            saved, why = self.finished(folder)
            if saved is not None:
                set_rng_state(saved["rng"])
                print(f"{self.label}: {name}: finished in an earlier run, skipped (output in {folder})",
                      file=sys.stderr)
                return saved["result"]
            if why:
                print(f"{self.label}: {name}: {why}; running it again", file=sys.stderr)
        self.running = True
        for f in (folder, *more):
            shutil.rmtree(f, ignore_errors=True)
        return None

    def finish(self, folder: str, result):
        """Mark the stage whose output is `folder` finished, with `result`: written last, atomically."""
        os.makedirs(folder, exist_ok=True)
        files = {os.path.relpath(os.path.join(d, f), folder): os.path.getsize(os.path.join(d, f))
                 for d, _, names in os.walk(folder) for f in sorted(names) if f != MARKER}
        state = {"settings": self.settings, "result": result, "files": files, "rng": rng_state()}
        atomic_write(os.path.join(folder, MARKER), lambda p: torch.save(state, p))

    def finished(self, folder: str):
        """(saved state, "") for a complete stage; else (None, why it is not, "" if it never started)."""
        if not os.path.isdir(folder):
            return None, ""
        path = os.path.join(folder, MARKER)
        if not os.path.isfile(path):
            return None, f"{folder} is incomplete (no {MARKER}: stopped mid-stage)"
        try:
            saved = torch.load(path, weights_only=False)
        except Exception as e:   # a damaged file of ours, whatever the unpickler says: rerun the stage
            return None, f"{path} is unreadable ({type(e).__name__})"
        if saved.get("settings") != self.settings:
            return None, f"{folder} was made with other settings"
        for f, size in saved["files"].items():
            p = os.path.join(folder, f)
            if not os.path.isfile(p) or os.path.getsize(p) != size:
                return None, f"{p} is missing or incomplete"
        return saved, ""


@contextmanager
def rng_kept():
    """Loading a skipped stage's weights draws no numbers from the run's RNGs (LoRA's init of A would): inside the
    block anything goes, after it every RNG is as it was before."""
    state = rng_state()
    try:
        yield
    finally:
        set_rng_state(state)


def save_model(model, folder, tok=None):
    """model.safetensors + config.json, and with `tok` the tokenizer's files: a model folder that
    pretrained.load_pretrained and eval.py --model load."""
    os.makedirs(folder, exist_ok=True)
    tensors = {k: v.cpu() for k, v in full_weights(model).items()}
    atomic_write(os.path.join(folder, "model.safetensors"), lambda p: save_file(tensors, p))   # mode as open()'s
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(model.config.raw, f, indent=2)
    if tok is not None:
        tok.save_files(folder)


def model_stage(stages, name, folder, device, make, judge):
    """(model, tokenizer, its result) of a stage that makes a tiny model: loaded from `folder` when an earlier run
    finished it (no RNG draw), else made by make() -> (model, tok), saved there, judged by judge(model, tok)."""
    from minigrpo.pretrained import load_pretrained
    from minigrpo.tokenizer import Tokenizer
    done = stages.done(name, folder)
    if done is not None:
        with rng_kept():
            return load_pretrained(folder, device=device), Tokenizer.from_pretrained("tiny"), done
    model, tok = make()
    save_model(model, folder, tok)
    result = judge(model, tok)
    stages.finish(folder, result)
    return model, tok, result


def experiment_folder(args, cfg, settings: dict) -> str:
    """The experiment's run folder, marked as a run's and held (a folder that is not one, or that another process
    writes: one line, nothing written), with experiment.json: the arguments and the configuration it ran with.
    `settings` (the Stages' own) are compared with the folder's last run: a change is refused in one line, as
    train.py --resume does, unless args.redo (its stages then run again with the new settings)."""
    from dataclasses import asdict
    from minigrpo.run.folder import RunFolder
    run_dir = os.path.join(args.runs_dir, args.run_name)
    RunFolder(args.runs_dir, args.run_name).mark()
    changed = changed_settings(os.path.join(run_dir, "experiment.json"), settings)
    if changed and not args.redo:
        raise SystemExit(f"{run_dir} holds an experiment run with other settings ({'; '.join(changed)}): rerun it "
                         "with its own flags to continue it, add --redo to run its stages again with these, or pass "
                         "another --run-name")
    atomic_write(os.path.join(run_dir, "experiment.json"),
                 json.dumps({"args": vars(args), "config": asdict(cfg)}, indent=2, default=str))
    return run_dir


def changed_settings(path: str, settings: dict) -> list[str]:
    """Each flag ("--lr 0.05 (the run's: 1e-05)") and configuration field of `settings` that differs from the run
    recorded in experiment.json at `path`; a setting the recorded run predates is no change."""
    try:
        with open(path) as f:
            old = json.load(f)
    except (OSError, ValueError):
        return []
    new = json.loads(json.dumps(settings, default=str))      # as experiment.json holds them
    out = []
    for part, name in (("args", lambda k: f"--{k.replace('_', '-')}"), ("config", lambda k: f"config {k}")):
        was = old.get(part) if isinstance(old, dict) and isinstance(old.get(part), dict) else {}
        out += [f"{name(k)} {v} (the run's: {was[k]})" for k, v in new[part].items() if k in was and was[k] != v]
    return out
