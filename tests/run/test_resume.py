"""Run folders and --resume (minigrpo/run/folder.py, minigrpo/run/resume.py, minigrpo/run/checkpoints.py load_latest):
a folder that is not a run is refused untouched; a resume reads its settings from the run, refuses a flag that would change
what it trains, records the safe ones; a damaged checkpoint falls back to an older one; what a kill left is
removed; a full disk, Ctrl-C and the run-policy stops each end with one true line. Each test checks the line and
that nothing was lost or overwritten."""
import hashlib
import json
import os
import resource
import shlex
import shutil
import signal
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file

import train
from minigrpo.errors import StopRun
from minigrpo.run import checkpoints
from minigrpo.pretrained import load_pretrained
from minigrpo.run.folder import MARKER, RunFolder

from repo_root import ROOT
from train_runs import ENV, metrics, wait_for_checkpoint

SMALL = ["--task", "synthetic", "--model", "tiny", "--tasks-per-step", "4", "--group-size", "4",
         "--micro-batch", "8", "--quiet", "--seed", "1"]


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


def main_lines(argv, capsys, out=None):
    """train.main(argv) in this process: (exit code or None, the stderr lines); `out`, a list, gets the stdout lines
    (the final table and the closing reward line)."""
    code = None
    try:
        train.main(argv)
    except SystemExit as e:
        code = e.code
    captured = capsys.readouterr()
    if out is not None:
        out += captured.out.strip().splitlines()
    return code, captured.err.strip().splitlines()


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


def test_a_stop_line_starts_its_own_line_after_the_progress_bar(tmp_path, capsys, monkeypatch):
    """With the progress bar drawn (no --quiet), a runtime stop's line is a line of its own and the last one: the
    bar is closed before the line is printed, not glued to it nor redrawn after it."""
    def stopped(*a, **k):
        raise StopRun("stopping: the judge is down")
    monkeypatch.setattr(train, "sample_step", stopped)
    argv = [f for f in SMALL if f != "--quiet"]
    code, err = main_lines([*argv, "--runs-dir", str(tmp_path), "--run-name", "b", "--steps", "1"], capsys)
    assert code == 4 and "0/1" in err[-2], err[-3:]       # the bar, ended with its own newline
    assert err[-1].startswith("train.py: stopping: the judge is down; no checkpoint was written yet"), err[-3:]


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


# -----------------------------------------------------------------------------------------------------------------
# Ctrl-C and the run-policy stops

def test_ctrl_c_stops_with_the_command_that_resumes(tmp_path):
    cmd = [sys.executable, "train.py", *SMALL, "--runs-dir", str(tmp_path), "--run-name", "c", "--steps", "8",
           "--save-every", "2"]
    # SIGINT as a terminal sends it: a test run in the background (`nohup ... &`) starts its children with SIGINT
    # ignored, and then Python never turns it into KeyboardInterrupt
    proc = subprocess.Popen(cmd, cwd=ROOT, env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    ckpt = tmp_path / "c" / "checkpoints" / "step-2"
    wait_for_checkpoint(proc, ckpt, "interrupted")
    proc.send_signal(signal.SIGINT)
    err = proc.communicate(timeout=300)[1]
    assert proc.returncode == 130, err[-2000:]
    last = err.strip().splitlines()[-1]
    prefix = "train.py: stopped by Ctrl-C; the last checkpoint, "
    assert last.startswith(prefix) and "Traceback" not in err, err[-2000:]
    kept, command = last[len(prefix):].split(", is intact; continue with: ")
    assert os.path.isdir(kept) and checkpoints.steps(str(tmp_path / "c" / "checkpoints"))[-1] == \
        int(kept.rsplit("-", 1)[1])
    argv = shlex.split(command)
    assert argv[1:] == ["train.py", "--resume", "--runs-dir", str(tmp_path), "--run-name", "c"]
    assert os.path.realpath(shutil.which(argv[0]) or argv[0]) == os.path.realpath(sys.executable)
    subprocess.run([sys.executable, *argv[1:]], cwd=ROOT, env=ENV, check=True, capture_output=True, timeout=600)
    assert [m["step"] for m in metrics(tmp_path / "c")] == list(range(1, 9))


@pytest.mark.parametrize("flags", [["--task", "mdp"], ["--task", "revise", "--experiment"]])
def test_ctrl_c_in_a_pipeline_says_the_same_command_continues_it(flags, tmp_path, monkeypatch, capsys):
    from minigrpo.experiments import mdp_pipeline, revise_pipeline

    def interrupted(args, trainer):
        RunFolder(args.runs_dir, args.run_name).mark()
        raise KeyboardInterrupt

    monkeypatch.setattr(mdp_pipeline, "run_pipeline", interrupted)
    monkeypatch.setattr(revise_pipeline, "run_experiment", interrupted)
    argv = [*flags, "--model", "tiny", "--quiet", "--runs-dir", str(tmp_path), "--run-name", "p"]
    code, err = main_lines(argv, capsys)
    assert code == 130
    python = shlex.split(RunFolder(str(tmp_path), "p").resume_command())[0]
    assert err[-1] == (f"train.py: stopped by Ctrl-C; the finished stages in {tmp_path / 'p'} are kept; continue "
                       f"with the same command: {shlex.join([python, 'train.py', *argv])}")


def test_ctrl_c_before_any_checkpoint_claims_none(tmp_path, monkeypatch, capsys):
    def interrupted(args):
        run = RunFolder(args.runs_dir, args.run_name)
        run.claim(fresh=True)
        run.create(vars(args))
        raise KeyboardInterrupt

    monkeypatch.setattr(train, "train", interrupted)
    code, err = main_lines([*SMALL, "--runs-dir", str(tmp_path), "--run-name", "k"], capsys)
    assert code == 130
    assert err[-1] == ("train.py: stopped by Ctrl-C; no checkpoint was written yet; continue with: "
                       f"{RunFolder(str(tmp_path), 'k').resume_command()}")


def test_ctrl_c_before_config_json_says_start_again_not_resume(tmp_path, monkeypatch, capsys):
    """--resume needs config.json: a stop before it is written names the command that started the run, and the
    folder made for it (holding nothing) is gone, so that command works."""
    def interrupted(args):
        RunFolder(args.runs_dir, args.run_name).claim(fresh=True)
        raise KeyboardInterrupt

    monkeypatch.setattr(train, "train", interrupted)
    argv = [*SMALL, "--runs-dir", str(tmp_path), "--run-name", "k"]
    code, err = main_lines(argv, capsys)
    python = shlex.split(RunFolder(str(tmp_path), "k").resume_command())[0]
    assert code == 130 and err[-1] == ("train.py: stopped by Ctrl-C; nothing was written yet; start it again with: "
                                       f"{shlex.join([python, 'train.py', *argv])}")
    assert not (tmp_path / "k").exists()


def test_the_non_finite_stop_says_what_the_streak_was_and_claims_no_checkpoint_it_lacks(tmp_path, monkeypatch):
    args = train.resolve_args([*SMALL, "--runs-dir", str(tmp_path), "--run-name", "nan", "--steps", "6",
                               "--save-every", "5"])
    monkeypatch.setattr(train, "all_reduce_and_clip", lambda params, max_grad_norm, dist_info: float("nan"))
    with pytest.raises(StopRun) as e:
        train.train(args)
    assert str(e.value) == ("stopping: 3 non-finite steps in a row (steps 1-3, the last grad-norm nan; their updates "
                            "were skipped, so the weights are those of step 0): lower --lr or check the data")
    assert checkpoints.steps(str(tmp_path / "nan" / "checkpoints")) == []


def test_the_judge_down_stop_names_the_judges_error_and_what_is_kept(tmp_path, monkeypatch, capsys):
    from minigrpo.judge import make_judge
    from minigrpo.tasks.soyuz import JudgeDown, SoyuzTask
    judge = make_judge("cmd:/bin/false", workers=1, retries=0, backoff=0, hybrid=False)
    task = SoyuzTask(judge="cmd:/bin/false", judge_obj=judge)
    task.ungraded_steps = 2
    before = judge.stats()
    assert judge.grade(task.tasks[0], "an answer") is None
    with pytest.raises(JudgeDown) as e:
        task._count_ungraded(before)
    assert str(e.value) == ("stopping: the cmd:/bin/false judge failed every call for 3 steps in a row (1 of 1 in the "
                            "last; its last error: /bin/false exited 1:): check the judge command or server")
    def judge_down(args):
        run = RunFolder(args.runs_dir, args.run_name)
        run.claim(fresh=False)
        run.create(vars(args))
        raise e.value

    monkeypatch.setattr(train, "train", judge_down)
    argv = [*SMALL, "--runs-dir", str(tmp_path), "--run-name", "s"]
    code, err = main_lines(argv, capsys)
    note = f"continue with: {RunFolder(str(tmp_path), 's').resume_command()}"
    assert code == 4 and err == [f"train.py: {e.value}; no checkpoint was written yet; {note}"]
    (tmp_path / "s" / "checkpoints" / "step-3").mkdir(parents=True)
    code, err = main_lines(argv, capsys)
    kept = tmp_path / "s" / "checkpoints" / "step-3"
    assert err == [f"train.py: {e.value}; the last checkpoint, {kept}, is intact; {note}"]
