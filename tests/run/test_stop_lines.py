"""How a run stops: Ctrl-C (in a child, as a terminal sends it, and in this process at each point of the start), the
run-policy stops (a non-finite streak, a judge that is down) and the progress bar closed before a stop's line. Each
test checks the one line the stop prints, and that the command it names works or the run it names holds what it
claims."""
import os
import shlex
import shutil
import signal
import subprocess
import sys

import pytest

import train
from minigrpo.errors import StopRun
from minigrpo.run import checkpoints
from minigrpo.run.folder import RunFolder

from repo_root import ROOT
from train_runs import ENV, SMALL, main_lines, metrics, wait_for_checkpoint


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
