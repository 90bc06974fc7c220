"""The run folder and its checkpoints.

    runs/<name>/.minigrpo-run        the marker, written first: train.py writes only into folders that hold it
    runs/<name>/config.json          every resolved argument, and a "resumes" list (each resume's step and changes)
    runs/<name>/metrics.jsonl        one line per optimizer step
    runs/<name>/samples.jsonl        prompts, completions, scores (and judge reasons) per step
    runs/<name>/checkpoints/step-N/  weights + trainer state (minigrpo/run/checkpoints.py: save, load, list, prune)
    runs/<name>/curves.png           the metrics drawn against step (minigrpo/run/plots.py)
    runs/<name>/tensorboard/         with --log-to tensorboard (W&B: runs/<name>/wandb_id names the W&B run)

config.json is written to a temporary name and renamed into place (rename is atomic on POSIX). The append-only
logs are cut back to the checkpoint's step on resume, so the resumed run's logs equal an uninterrupted run's.

An existing folder is a run folder when it holds the marker. A folder from before the marker is recognised by what
only a run writes (a config.json holding the trainer's own keys, run_name, runs_dir, group_size, save_every...,
beside a checkpoints/ folder) and is marked; any other non-empty folder (a model folder holding its own
config.json, say) is refused untouched.

One process writes a run folder at a time (its lock: minigrpo/run/lock.py); its name is one folder in --runs-dir.
"""
import json
import os
import shlex
import shutil
import sys
import time

import numpy as np
import torch
from safetensors import SafetensorError

from minigrpo.run import checkpoints
from minigrpo.errors import Refusal, StopRun, UsageError
from minigrpo.files import atomic_write, disk_full, full_disk_line
from minigrpo.run import lock


MARKER = ".minigrpo-run"
OWN_FILES = ("config.json", "metrics.jsonl", "samples.jsonl", "curves.png", "wandb_id", MARKER)  # atomic_write's
RUN_KEYS = {"task", "model", "run_name", "runs_dir", "lr", "group_size", "save_every"}     # in every config.json


class RunFolder:
    def __init__(self, root: str, name: str):
        self.root, self.name = root, name
        self.path = os.path.join(root, name)
        self.ckpt_dir = os.path.join(self.path, "checkpoints")

    # -- whose folder it is ---------------------------------------------------------------------------------------

    def is_run(self) -> bool:
        """The folder holds the marker, or is a run folder from before the marker (module docstring)."""
        return os.path.isfile(self.file(MARKER)) or self._unmarked_run() or self._unmarked_pipeline()

    def _json(self, name):
        try:
            with open(self.file(name)) as f:
                d = json.load(f)
        except (OSError, ValueError):
            return {}
        return d if isinstance(d, dict) else {}

    def _unmarked_run(self) -> bool:
        return RUN_KEYS <= self._json("config.json").keys() and os.path.isdir(self.ckpt_dir)

    def _unmarked_pipeline(self) -> bool:
        """The folder of an mdp pipeline or a revise experiment from before the marker: its settings file."""
        return {"model", "seed", "prompt"} <= self._json("pipeline.json").keys() or \
            {"args", "config"} <= self._json("experiment.json").keys()

    def check_place(self):
        """One line when the folder cannot be a run folder: a name that is not one folder inside --runs-dir, or
        too long for a folder name; a --runs-dir that is a file."""
        name = self.name
        if name in ("", ".", "..") or "/" in name or os.sep in name or "\0" in name:
            raise SystemExit(f"--run-name {name!r}: must name one folder inside --runs-dir (no '/', not '.' or "
                             "'..'); pass a plain name such as my-run")
        if len(os.fsencode(name)) > 255:
            raise SystemExit(f"--run-name: {len(os.fsencode(name))} bytes long, over the 255 a folder name may "
                             "have; pass a shorter one")
        if os.path.exists(self.root) and not os.path.isdir(self.root):
            raise SystemExit(f"--runs-dir {self.root}: is a file, not a folder; pass a folder (it is made if "
                             "missing)")

    def refuse_foreign(self):
        """One line, and nothing written, when the place cannot hold a run (check_place) or the path exists and is
        not a run folder (nor an empty folder)."""
        self.check_place()
        if not os.path.exists(self.path) or self.is_run():
            return
        if os.path.isdir(self.path) and not os.listdir(self.path):
            return
        raise Refusal(f"{self.path} exists and is not a minigrpo run folder (no {MARKER} in it); train.py writes "
                         "only into new, empty or its own run folders: pass another --run-name or --runs-dir")

    def mark(self):
        """Refuse a folder that is not ours, or that another process writes; make it (private), hold it until
        release() and mark it as a run folder. What a pipeline (the mdp pipeline, the revise experiment) does
        before it writes its first file, on every rerun too."""
        self.refuse_foreign()
        try:
            os.makedirs(self.path, mode=0o700, exist_ok=True)
            lock.hold(self.path)       # another live writer: one line naming its pid, nothing written
            os.chmod(self.path, 0o700)     # samples, the judge's cache and checkpoints: nobody else's to read
            if not os.path.isfile(self.file(MARKER)):   # first: a folder train.py made is never left unmarked
                atomic_write(self.file(MARKER), "a minigrpo run folder: train.py writes only into folders holding "
                                                "this file\n")
        except OSError as e:           # a full disk is a runtime stop; a read-only --runs-dir the user's to change
            if disk_full(e):
                raise StopRun(full_disk_line(self.path, self.root)) from None
            raise UsageError(f"--runs-dir {self.root}: cannot write {self.path} ({e.strerror or e}); pass a "
                             "--runs-dir you can write") from None

    def release(self):
        """The writer is done: the next may take the folder (one that stops short is let go of at exit)."""
        lock.release(self.path)

    def __enter__(self):       # `with RunFolder(...) as run:` releases it however the block ends
        return self

    def __exit__(self, *exc):
        self.release()

    def claim(self, fresh: bool):
        """Before any work: refuse a folder that is not ours, or written by another process, or (fresh) one that
        holds a run's logs, so that two runs never interleave their metrics; then make, mark and hold the folder
        and remove what a kill left."""
        self.mark()
        if fresh and os.path.exists(self.file("metrics.jsonl")):
            raise Refusal(f"{self.path} already holds a run: pass --resume to continue it, or another --run-name")
        os.makedirs(self.ckpt_dir, mode=0o700, exist_ok=True)
        self.remove_temporary()

    def holds_nothing(self) -> bool:
        """Only what claim() and a task's set-up write before any step: the marker, an empty checkpoints/, the
        judge's cache. Such a folder, made by a run that then failed on its input, may go again."""
        if not os.path.isdir(self.path):
            return False
        rest = set(os.listdir(self.path)) - {MARKER, lock.LOCK, "judge_cache.sqlite"}
        return rest <= {"checkpoints"} and not (os.path.isdir(self.ckpt_dir) and os.listdir(self.ckpt_dir))

    def remove_temporary(self, say: bool = True):
        """Temporary checkpoint folders and files that a kill left half-written (one run folder, one trainer: no
        other process is writing them); one line names them."""
        gone = [os.path.join("checkpoints", d) for d in sorted(os.listdir(self.ckpt_dir))
                if d.startswith(checkpoints.TMP_PREFIX)]
        for d in gone:
            shutil.rmtree(self.file(d), ignore_errors=True)
        for name in os.listdir(self.path):
            base, _, pid = name.rpartition(".tmp-")
            if base in OWN_FILES and pid.isdigit() and os.path.isfile(self.file(name)):
                os.remove(self.file(name))
                gone.append(name)
        if gone and say:
            print(f"train.py: removed what an interrupted run left half-written in {self.path}: {', '.join(gone)}",
                  file=sys.stderr)

    # -- the run's settings ---------------------------------------------------------------------------------------

    @staticmethod
    def saved_config(root: str, name: str | None) -> dict:
        """The settings the run trains with: config.json's, with each resume's changes applied in order."""
        if not name:
            raise SystemExit("--resume needs --run-name: the run folder to continue")
        run = RunFolder(root, name)
        run.check_place()
        path = run.file("config.json")
        if not os.path.exists(path):
            raise SystemExit(f"--resume: {path} does not exist; start the run without --resume first")
        run.refuse_foreign()
        cfg = run.config()
        for entry in cfg.pop("resumes", []):
            cfg.update({k: new for k, (_, new) in entry["changed"].items()})
        cfg.pop("resume", None)
        return cfg

    def config(self) -> dict:
        with open(self.file("config.json")) as f:
            try:
                return json.load(f)
            except ValueError as e:
                raise SystemExit(f"--resume: {self.file('config.json')} is not valid JSON ({e}); the run's settings "
                                 "cannot be read") from None

    def create(self, config: dict):
        """Start the run's logs and config.json in a claimed folder."""
        self.truncate_logs(0)
        atomic_write(self.file("config.json"), json.dumps(config, indent=2, default=str) + "\n")

    def record_resume(self, step: int, changed: dict):
        """Append this resume (its step, and each setting it changed: [before, after]) to config.json's list."""
        cfg = self.config()
        cfg.setdefault("resumes", []).append({"step": step, "time": time.strftime("%Y-%m-%d %H:%M:%S"),
                                              "changed": changed})
        atomic_write(self.file("config.json"), json.dumps(cfg, indent=2, default=str) + "\n")

    # -- logs and checkpoints -------------------------------------------------------------------------------------

    def file(self, name):
        return os.path.join(self.path, name)

    def append(self, name: str, record: dict):
        """One JSON line more; a line that cannot be written (a full disk) stops the run with one line. A line cut
        short stays behind harmlessly: a resume keeps only the whole lines of the steps its checkpoint saw."""
        try:
            with open(self.file(name), "a") as f:
                f.write(json.dumps(record, default=_jsonable) + "\n")
                f.flush()
        except OSError as e:
            free = shutil.disk_usage(self.path).free / 2 ** 20
            raise StopRun(f"stopping: {self.file(name)} could not be written ({e.strerror or e}; {free:.1f} MiB free "
                          "there): free some space") from None

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
            atomic_write(path, "".join(keep))

    def first_and_last(self, key: str):
        """`key` of the run's first and last logged step (metrics.jsonl: the whole run's, across resumes)."""
        if not os.path.exists(self.file("metrics.jsonl")):
            return None, None
        with open(self.file("metrics.jsonl")) as f:
            rows = [json.loads(ln) for ln in f if ln.strip()]
        return (rows[0].get(key), rows[-1].get(key)) if rows else (None, None)

    def save_checkpoint(self, step: int, model, state: dict, lora: bool, tokenizer=None):
        """checkpoints.save; a checkpoint that cannot be written (a full disk) stops the run with one line naming
        the folder, the error and the free space, its temporary folder removed and the older checkpoints intact."""
        try:
            checkpoints.save(self.ckpt_dir, step, model, state, lora=lora, tokenizer=tokenizer)
        except (OSError, RuntimeError, SafetensorError) as e:
            if not checkpoints.write_error(e):
                raise
            self.remove_temporary(say=False)
            free = shutil.disk_usage(self.ckpt_dir).free / 2 ** 20
            raise StopRun(f"stopping: checkpoint step-{step} could not be written to {self.ckpt_dir} "
                          f"({checkpoints.write_error(e)}; {free:.1f} MiB free there): free some space") from None

    def latest_checkpoint(self) -> str | None:
        return checkpoints.latest(self.ckpt_dir)

    def checkpoint_note(self) -> str:
        """What a stop message may say about the checkpoints: the latest one, only when there is one."""
        latest = self.latest_checkpoint()
        return f"the last checkpoint, {latest}, is intact" if latest else "no checkpoint was written yet"

    def stop_note(self) -> str:
        """What a stopped run keeps and the command that continues it."""
        return f"{self.checkpoint_note()}; continue with: {self.resume_command()}"

    def resume_command(self) -> str:
        """The command that continues this run (the same launcher, python or torchrun with the same ranks)."""
        return shlex.join([*_launcher(), "train.py", "--resume", "--runs-dir", self.root, "--run-name", self.name])

    def start_command(self, argv) -> str:
        """The command that started this run, as the user would type it again."""
        return shlex.join([*_launcher(), "train.py", *argv])

    def rerun_note(self, argv) -> str:
        """What a stopped pipeline (the mdp pipeline, the revise experiment) keeps, and how it continues: the same
        command again, which skips the stages it finished."""
        return (f"the finished stages in {self.path} are kept; continue with the same command: "
                f"{self.start_command(argv)}")


def _launcher() -> list:
    """python as the user would type it (its name when PATH finds this very interpreter), or torchrun."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    python = os.path.basename(sys.executable)
    if shutil.which(python) is None or os.path.realpath(shutil.which(python)) != os.path.realpath(sys.executable):
        python = sys.executable
    return [python] if world == 1 else ["torchrun", "--nproc_per_node", str(world)]


def _jsonable(x):
    if isinstance(x, torch.Tensor):
        return x.tolist()
    if isinstance(x, (np.floating, np.integer)):
        return x.item()
    return str(x)
