"""Run folders and --resume (minigrpo/run/folder.py, minigrpo/run/resume.py, minigrpo/run/checkpoints.py
load_latest): a folder that is not a run is refused untouched; a resume reads its settings from the run, refuses a
flag that would change what it trains, records the safe ones; a damaged checkpoint falls back to an older one; what
a kill left is removed; a full disk ends with one true line (Ctrl-C and the other stops: test_stop_lines.py). Each
test checks the line and that nothing was lost or overwritten."""
import hashlib
import json
import os
import resource
import shutil
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file

import train
from minigrpo.run import checkpoints
from minigrpo.pretrained import load_pretrained
from minigrpo.run.folder import MARKER, RunFolder

from repo_root import ROOT
from train_runs import ENV, SMALL, main_lines, metrics


def tree(folder) -> dict:
    """{relative path: (sha256, mode)} of every file and folder under `folder`, the folder itself included."""
    out = {".": (None, os.stat(folder).st_mode)}
    for base, dirs, files in os.walk(folder):
        for name in dirs + files:
            p = os.path.join(base, name)
            out[os.path.relpath(p, folder)] = (digest(p) if os.path.isfile(p) else None, os.stat(p).st_mode)
    return out


def digest(path) -> str:
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


@pytest.fixture(scope="module")
def base_run(tmp_path_factory):
    """A 4-step run with checkpoints step-2 and step-4 (made once; each test works on a copy)."""
    runs = tmp_path_factory.mktemp("base")
    cmd = [sys.executable, "train.py", *SMALL, "--runs-dir", str(runs), "--run-name", "r", "--steps", "4",
           "--save-every", "2", "--keep-checkpoints", "2"]
    subprocess.run(cmd, cwd=ROOT, env=ENV, check=True, capture_output=True, timeout=600)
    return runs / "r"


@pytest.fixture
def run(base_run, tmp_path):
    shutil.copytree(base_run, tmp_path / "r")
    return tmp_path / "r"


def resume(run, *flags):
    return ["--resume", "--runs-dir", str(run.parent), "--run-name", run.name, *flags]


# -----------------------------------------------------------------------------------------------------------------
# Run folders

@pytest.mark.parametrize("flags", [[], ["--resume"]])
def test_a_folder_that_is_not_a_run_is_refused_untouched(flags, tmp_path, capsys):
    """A Hugging Face model folder under --runs-dir/--run-name: one line, and not a byte or a mode bit changed."""
    model = tmp_path / "m"
    model.mkdir(mode=0o755)
    (model / "config.json").write_text('{"model_type": "qwen3", "hidden_size": 64}\n')
    (model / "model.safetensors").write_bytes(b"\0" * 64)
    os.chmod(model / "config.json", 0o644)
    os.chmod(model, 0o755)
    before = tree(model)
    code, err = main_lines([*SMALL, "--runs-dir", str(tmp_path), "--run-name", "m", "--steps", "1", *flags], capsys)
    assert code == 3 and len(err) == 1, err          # a refusal to harm data, not a usage error
    assert err[0] == (f"train.py: refused: {model} exists and is not a minigrpo run folder (no {MARKER} in it); "
                      "train.py writes only into new, empty or its own run folders: pass another --run-name or "
                      "--runs-dir")
    with pytest.raises(SystemExit, match="not a minigrpo run folder"):   # train() called from code checks too
        RunFolder(str(tmp_path), "m").claim(fresh=True)
    assert tree(model) == before


@pytest.mark.parametrize("flags", [["--task", "mdp"], ["--task", "revise", "--experiment"]])
def test_a_pipeline_into_a_folder_that_is_not_a_run_is_refused_untouched(flags, tmp_path, capsys):
    """The mdp pipeline and the revise experiment hold their stages in one folder: it is checked as a run's is."""
    model = tmp_path / "m"
    model.mkdir(mode=0o755)
    (model / "config.json").write_text('{"model_type": "qwen3", "hidden_size": 64}\n')
    before = tree(model)
    code, err = main_lines([*flags, "--model", "tiny", "--quiet", "--runs-dir", str(tmp_path), "--run-name", "m"],
                           capsys)
    assert code == 3 and len(err) == 1 and "refused: " in err[0] and "is not a minigrpo run folder" in err[0], err
    assert tree(model) == before


def test_a_pipeline_folder_is_marked_and_one_from_before_the_marker_is_still_its_own(tmp_path):
    RunFolder(str(tmp_path), "p").mark()
    assert (tmp_path / "p" / MARKER).is_file() and not (tmp_path / "p" / "checkpoints").exists()
    for name, settings in (("pipeline.json", {"model": "tiny", "seed": 0, "prompt": "full"}),
                           ("experiment.json", {"args": {}, "config": {}})):
        old = tmp_path / name.split(".")[0]
        old.mkdir()
        (old / "base").mkdir()                      # a finished stage
        (old / name).write_text(json.dumps(settings))
        assert RunFolder(str(tmp_path), old.name).is_run()
        RunFolder(str(tmp_path), old.name).mark()   # a rerun takes it and marks it
        assert (old / MARKER).is_file() and (old / "base").is_dir()
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "pipeline.json").write_text('{"model": "x"}')    # not a pipeline's settings
    with pytest.raises(SystemExit, match="not a minigrpo run folder"):
        RunFolder(str(tmp_path), "other").mark()


def test_a_new_run_marks_its_folder_first_and_an_empty_folder_is_taken(tmp_path):
    (tmp_path / "empty").mkdir()
    run = RunFolder(str(tmp_path), "empty")
    run.claim(fresh=True)
    assert (tmp_path / "empty" / MARKER).is_file() and run.is_run()
    assert oct((tmp_path / "empty").stat().st_mode & 0o777) == oct(0o700)
    assert not RunFolder(str(tmp_path), "elsewhere").is_run()


def test_a_run_from_before_the_marker_is_recognised_and_marked(run, tmp_path, capsys):
    os.remove(run / MARKER)
    assert RunFolder(str(run.parent), run.name).is_run()       # config.json of ours beside checkpoints/
    code, err = main_lines(resume(run, "--steps", "5"), capsys)
    assert code is None and (run / MARKER).is_file(), err
    assert [m["step"] for m in metrics(run)] == [1, 2, 3, 4, 5]
    shutil.rmtree(run / "checkpoints")                          # a config.json alone does not make a run folder
    os.remove(run / MARKER)
    assert not RunFolder(str(run.parent), run.name).is_run()


# -----------------------------------------------------------------------------------------------------------------
# What a resume may change

def test_resume_needs_no_task_and_records_a_safe_change(run, capsys):
    """No --task: the run's settings; a longer --steps is applied, said, and kept in config.json's history; a
    second resume continues with it; the closing line is the run's first and last step, not this process's."""
    original = json.loads((run / "config.json").read_text())
    out = []
    code, err = main_lines(resume(run, "--steps", "5", "--save-every", "5"), capsys, out)
    assert code is None, err
    assert f"train.py: resumed from step 4 of 5 ({run / 'checkpoints' / 'step-4'}); --save-every 2 -> 5; " \
           "--steps 4 -> 5" in err
    cfg = json.loads((run / "config.json").read_text())
    assert {k: v for k, v in cfg.items() if k != "resumes"} == original        # the original settings stay
    assert [(r["step"], r["changed"]) for r in cfg["resumes"]] == [(4, {"save_every": [2, 5], "steps": [4, 5]})]
    m = metrics(run)
    assert [x["step"] for x in m] == [1, 2, 3, 4, 5]
    assert m[0]["reward_mean"] != m[-1]["reward_mean"]       # so the line below tells the run's from the process's
    first, last = m[0]["reward_mean"], m[-1]["reward_mean"]
    assert out[-1] == f"mean reward: first step {first:.3f} -> last step {last:.3f}"
    code, err = main_lines(resume(run), capsys)                 # the history's --steps 5 holds: nothing left to do
    assert code is None and f"train.py: resumed from step 5 of 5 ({run / 'checkpoints' / 'step-5'}); the run is " \
        "finished: nothing left to do (pass --steps N above it to train on)" in err, err
    assert len(json.loads((run / "config.json").read_text())["resumes"]) == 2


def test_resume_refuses_flags_that_change_what_the_run_trains(run, capsys):
    before = tree(run)
    code, err = main_lines(resume(run, "--task", "revise", "--lr", "0.1", "--group-size", "4", "--mask-truncated",
                                  "--steps", "9"), capsys)
    assert code == 2 and len(err) == 1, err
    assert err[0] == ("train.py: error: --resume: --task revise (the run's: synthetic), --lr 0.1 (the run's: 0.003), "
                      "--mask-truncated (the run's: False): would change what run 'r' trains; drop them to continue "
                      "it (its settings come from its config.json), or start a new run under another --run-name")
    assert tree(run) == before
    args = train.resolve_args([*SMALL, *resume(run)])           # the run's own values are no change
    assert (args.task, args.lr, args.group_size, args.steps) == ("synthetic", 3e-3, 4, 4)


def test_resume_refuses_fewer_steps_than_the_checkpoint(run, capsys):
    before = tree(run)
    code, err = main_lines(resume(run, "--steps", "3"), capsys)
    assert code == 2 and err[-1] == (f"train.py: error: --resume: {run / 'checkpoints' / 'step-4'} is past the run's "
                                     "end (3 steps): pass --steps 4 or more to continue it")
    assert tree(run) == before


# -----------------------------------------------------------------------------------------------------------------
# Damaged checkpoints, what a kill leaves, a full disk

def test_a_damaged_latest_checkpoint_falls_back_to_the_newest_intact_one(run):
    ckpt = run / "checkpoints"
    intact = load_file(str(ckpt / "step-4" / "model.safetensors"))
    with open(ckpt / "step-4" / "trainer_state.pt", "r+b") as f:
        f.truncate(1000)                                         # cut, as a full disk or a bad copy leaves it
    out = subprocess.run([sys.executable, "train.py", *resume(run)], cwd=ROOT, env=ENV, capture_output=True,
                         text=True, timeout=600, check=False)    # as the run was made: same threads, same bits
    assert out.returncode == 0, out.stderr[-2000:]
    err = out.stderr.splitlines()
    warn = [ln for ln in err if ln.startswith("train.py: checkpoint ")]
    assert warn == [(f"train.py: checkpoint {ckpt / 'step-4'} is damaged ({ckpt / 'step-4' / 'trainer_state.pt'}: "
                     "PytorchStreamReader failed reading zip archive: failed finding central directory); resuming "
                     f"from {ckpt / 'step-2'} instead (the damaged one is kept as step-4.damaged)")]
    assert f"train.py: resumed from step 2 of 4 ({ckpt / 'step-2'})" in err
    redone = load_file(str(ckpt / "step-4" / "model.safetensors"))
    assert all(torch.equal(intact[k], redone[k]) for k in intact)     # steps 3-4 redone bit for bit
    assert (ckpt / "step-4.damaged" / "trainer_state.pt").stat().st_size == 1000
    assert [m["step"] for m in metrics(run)] == [1, 2, 3, 4]


def test_every_checkpoint_damaged_is_one_line_and_nothing_is_cut(run, capsys):
    for step in (2, 4):
        (run / "checkpoints" / f"step-{step}" / "trainer_state.pt").write_bytes(b"not a zip")
    before = tree(run)
    code, err = main_lines(resume(run), capsys)
    assert code == 2 and err[-1].startswith(f"train.py: error: --resume: no checkpoint in {run / 'checkpoints'} can "
                                            "be read (")
    assert "start a new run under another --run-name" in err[-1]
    assert tree(run) == before                                   # the logs were not cut back to step 0


def test_a_trainer_state_that_is_not_one_counts_as_damaged(run, capsys):
    """A readable file that is not a trainer state (another pickle) is damaged too, and the model is not touched
    by it: the state is read before the weights."""
    ckpt = run / "checkpoints"
    torch.save({"step": 4}, ckpt / "step-4" / "trainer_state.pt")
    model = load_pretrained("tiny", dtype=torch.float32, device="cpu")
    folder, state = checkpoints.load_latest(str(ckpt), model, lora=False)
    assert folder == str(ckpt / "step-2") and state["step"] == 2
    err = capsys.readouterr().err
    assert f"{ckpt / 'step-4' / 'trainer_state.pt'}: not a trainer state" in err
    weights = load_file(str(ckpt / "step-2" / "model.safetensors"))
    assert all(torch.equal(weights[k], v) for k, v in model.state_dict().items() if k in weights)


def test_what_a_kill_left_half_written_is_removed_at_start(run, capsys):
    tmp = run / "checkpoints" / ".tmp-step-6-99999"
    tmp.mkdir()
    (tmp / "trainer_state.pt").write_bytes(b"half")
    (run / "config.json.tmp-4242").write_text("{")
    (run / "notes.txt.tmp-1").write_text("the user's")          # not a name train.py writes: left alone
    code, err = main_lines(resume(run, "--steps", "5"), capsys)
    assert code is None, err
    assert (f"train.py: removed what an interrupted run left half-written in {run}: "
            "checkpoints/.tmp-step-6-99999, config.json.tmp-4242") in err
    assert not tmp.exists() and not (run / "config.json.tmp-4242").exists()
    assert (run / "notes.txt.tmp-1").read_text() == "the user's"


def test_disk_full_during_a_checkpoint_is_one_line_and_the_last_one_is_intact(run, capsys, monkeypatch):
    """torch.save's real writer on a full disk (/dev/full: the kernel's ENOSPC): the line says errno's words, not
    torch's "unexpected pos", and names the folder and the room left."""
    import builtins
    real_open = builtins.open

    def full_disk(path, mode="r", *a, **kw):
        if str(path).endswith("trainer_state.pt") and "w" in mode:
            return real_open("/dev/full", mode, *a, **kw)
        return real_open(path, mode, *a, **kw)

    last = tree(run / "checkpoints" / "step-4")
    monkeypatch.setattr(checkpoints, "open", full_disk, raising=False)
    code, err = main_lines(resume(run, "--steps", "6", "--save-every", "6"), capsys)
    assert code == 4
    free = shutil.disk_usage(run).free / 2 ** 20
    line = err[-1]
    assert line.startswith(f"train.py: stopping: checkpoint step-6 could not be written to {run / 'checkpoints'} "
                           "(No space left on device; "), line
    assert abs(float(line.split("; ")[1].split(" MiB")[0]) - free) < 512
    assert line.endswith(f" MiB free there): free some space; the last checkpoint, {run / 'checkpoints' / 'step-4'}, "
                         f"is intact; continue with: {RunFolder(str(run.parent), run.name).resume_command()}")
    assert sorted(os.listdir(run / "checkpoints")) == ["step-2", "step-4"]      # no half-written folder left
    assert tree(run / "checkpoints" / "step-4") == last


def test_a_full_disk_is_named_in_errnos_words_whoever_wrote():
    """safetensors' writer says a full disk in a sentence of its own: the stop line says errno's words."""
    from safetensors import SafetensorError
    from minigrpo.run.checkpoints import write_error
    said = SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")
    assert write_error(said) == "No space left on device"
    assert write_error(SafetensorError("Error while serializing: header too large")).endswith("header too large")


def test_disk_full_on_a_log_line_is_one_line_and_the_run_resumes(run, capsys, monkeypatch):
    """samples.jsonl on a full disk (/dev/full: the kernel's ENOSPC) after step 5: one line, the checkpoint of step
    4 intact, and the resume that line gives continues the run with whole logs."""
    import builtins
    from minigrpo.run import folder as folder_mod
    real_open = builtins.open

    def full_disk(path, mode="r", *a, **kw):
        if str(path).endswith("samples.jsonl") and mode == "a":
            return real_open("/dev/full", mode, *a, **kw)
        return real_open(path, mode, *a, **kw)

    last = tree(run / "checkpoints" / "step-4")
    monkeypatch.setattr(folder_mod, "open", full_disk, raising=False)
    code, err = main_lines(resume(run, "--steps", "6"), capsys)
    assert code == 4, err
    free = shutil.disk_usage(run).free / 2 ** 20
    prefix = f"train.py: stopping: {run / 'samples.jsonl'} could not be written (No space left on device; "
    assert err[-1].startswith(prefix) and "Traceback" not in "\n".join(err), err[-3:]
    assert abs(float(err[-1][len(prefix):].split(" MiB")[0]) - free) < 512
    kept = run / "checkpoints" / "step-4"
    assert err[-1].endswith(f" MiB free there): free some space; the last checkpoint, {kept}, "
                            f"is intact; continue with: {RunFolder(str(run.parent), run.name).resume_command()}")
    assert tree(run / "checkpoints" / "step-4") == last
    monkeypatch.undo()
    code, err = main_lines(resume(run, "--steps", "6"), capsys)
    assert code is None, err
    assert [m["step"] for m in metrics(run)] == list(range(1, 7))


def test_a_file_size_limit_stops_the_checkpoint_with_one_line(run):
    """A real write failure: a per-file size limit (RLIMIT_FSIZE; Python ignores SIGXFSZ, so write fails with
    EFBIG) that the weights file passes no more, in a subprocess."""
    last = tree(run / "checkpoints" / "step-4")
    limit = (run / "checkpoints" / "step-4" / "model.safetensors").stat().st_size // 2
    cmd = [sys.executable, "train.py", *resume(run, "--steps", "6", "--save-every", "6", "--quiet")]
    out = subprocess.run(cmd, cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=600, check=False,
                         preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit)))
    assert out.returncode == 4, out.stderr[-2000:]
    line = out.stderr.strip().splitlines()[-1]
    assert line.startswith("train.py: stopping: checkpoint step-6 could not be written to "
                           f"{run / 'checkpoints'} ("), line
    assert "File too large" in line and f"the last checkpoint, {run / 'checkpoints' / 'step-4'}, is intact" in line
    assert sorted(os.listdir(run / "checkpoints")) == ["step-2", "step-4"]
    assert tree(run / "checkpoints" / "step-4") == last
