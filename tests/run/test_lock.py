"""One writer per run folder (minigrpo/run/lock.py): a second train.py, pipeline or eval.py on a folder another live
process writes stops with one line naming that process's pid, before it writes anything; a lock left by a killed
writer is taken over with one line; a writer that ends leaves no lock file behind."""
import os
import subprocess
import sys
import textwrap

import pytest

import eval as eval_py
import train
from minigrpo.experiments.stages import experiment_folder
from minigrpo.experiments.revise_pipeline import ExperimentConfig
from minigrpo.run import lock
from minigrpo.run.folder import MARKER, RunFolder

from repo_root import ROOT

SYN = ["--task", "synthetic", "--model", "tiny", "--quiet", "--steps", "1", "--tasks-per-step", "2",
       "--group-size", "2", "--max-new-tokens", "2"]


class Holder:
    """Another process that holds `folder` (as train.py's claim does) until it is stopped."""

    def __init__(self, root, name):
        code = textwrap.dedent(f"""
            import sys
            from minigrpo.run.folder import RunFolder
            RunFolder({str(root)!r}, {name!r}).claim(fresh=True)
            print("held", flush=True)
            sys.stdin.read()
        """)
        self.proc = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout.readline() == "held\n"

    def stop(self):
        self.proc.stdin.close()
        self.proc.wait(timeout=60)

    def kill(self):
        self.proc.kill()
        self.proc.wait(timeout=60)


@pytest.fixture
def holder(tmp_path):
    h = Holder(tmp_path, "dup")
    yield h
    if h.proc.poll() is None:
        h.kill()


def busy_line(pid):
    return f"is being written by another process (pid {pid}): wait for it to end or stop it"


def test_a_second_train_py_on_a_held_run_stops_naming_the_holders_pid(tmp_path, holder, capsys):
    before = sorted(os.listdir(tmp_path / "dup"))
    with pytest.raises(SystemExit) as e:
        train.main([*SYN, "--runs-dir", str(tmp_path), "--run-name", "dup"])
    err = capsys.readouterr().err.strip().splitlines()
    assert e.value.code == 3 and len(err) == 1, err
    assert err[0].startswith(f"train.py: refused: {tmp_path / 'dup'} {busy_line(holder.proc.pid)}")
    assert "--run-name" in err[0]
    assert sorted(os.listdir(tmp_path / "dup")) == before          # nothing written beside the holder's files
    with open(tmp_path / "dup" / lock.LOCK) as f:
        assert f.read() == f"{holder.proc.pid}\n"                  # the holder's lock untouched


def test_a_pipeline_and_eval_py_stop_on_a_held_folder_too(tmp_path, holder, capsys):
    args = train.resolve_args(["--task", "revise", "--model", "tiny", "--experiment", "--runs-dir", str(tmp_path),
                               "--run-name", "dup", "--quiet"])
    with pytest.raises(SystemExit) as e:
        experiment_folder(args, ExperimentConfig(), {"args": {}, "config": {}})
    assert busy_line(holder.proc.pid) in str(e.value.code)
    assert not os.path.exists(tmp_path / "dup" / "experiment.json")
    held = Holder(tmp_path, "evals")     # a folder another process holds, not a run's (eval.py refuses those)
    try:
        os.remove(tmp_path / "evals" / MARKER)
        with pytest.raises(SystemExit) as e:
            eval_py.main(["--task", "synthetic", "--model", "tiny", "--limit", "2", "--quiet",
                          "--out", str(tmp_path / "evals")])
        assert e.value.code == 3
        err = capsys.readouterr().err.strip().splitlines()
        assert err == [f"eval.py: refused: {tmp_path / 'evals'} {busy_line(held.proc.pid)}, or pass another --out"]
    finally:
        held.kill()


def test_the_folder_is_free_once_its_writer_ends_and_no_lock_file_stays(tmp_path, holder, capsys):
    holder.stop()
    assert not os.path.exists(tmp_path / "dup" / lock.LOCK)
    train.main([*SYN, "--runs-dir", str(tmp_path), "--run-name", "dup"])
    assert "took over" not in capsys.readouterr().err
    assert not os.path.exists(tmp_path / "dup" / lock.LOCK)         # train() released it at its end


def test_a_killed_writers_lock_is_taken_over_with_one_line(tmp_path, holder, capsys):
    pid = holder.proc.pid
    holder.kill()                                                   # SIGKILL: no exit handler ran
    with open(tmp_path / "dup" / lock.LOCK) as f:
        assert f.read() == f"{pid}\n"
    RunFolder(str(tmp_path), "dup").mark()
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"note: took over the lock of {tmp_path / 'dup'} from pid {pid}, which is no longer running"]
    with open(tmp_path / "dup" / lock.LOCK) as f:
        assert f.read() == f"{os.getpid()}\n"
    RunFolder(str(tmp_path), "dup").release()
    assert not os.path.exists(tmp_path / "dup" / lock.LOCK)


def test_one_process_may_hold_a_folder_twice_and_releases_it_with_the_last_hold(tmp_path):
    lock.hold(str(tmp_path))
    lock.hold(str(tmp_path))                                        # a pipeline, then its own stage: re-entrant
    lock.release(str(tmp_path))
    assert os.path.exists(tmp_path / lock.LOCK)
    lock.release(str(tmp_path))
    assert not os.path.exists(tmp_path / lock.LOCK)


def test_a_lock_whose_pid_cannot_be_written_is_not_left_behind(tmp_path, monkeypatch):
    """A full disk: the lock file is made (an empty file takes no room) but its pid cannot be written. The error
    is raised and no lock file stays, held by nobody (a folder that existed before is left as it was)."""
    def full(fd, data, offset):
        raise OSError(28, os.strerror(28))
    monkeypatch.setattr(os, "pwrite", full)
    with pytest.raises(OSError, match="No space left on device"):
        lock.hold(str(tmp_path))
    monkeypatch.undo()
    assert os.listdir(tmp_path) == []
    lock.hold(str(tmp_path))          # and the folder is free for the next writer
    lock.release(str(tmp_path))
    assert os.listdir(tmp_path) == []
