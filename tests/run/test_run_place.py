"""Where a run folder may be: --run-name names one folder inside --runs-dir. A name that would leave it, a name too
long for a folder, a --runs-dir that is a file or that cannot be written: one line naming the flag, exit code 2 for
the flags, no traceback, and nothing written anywhere."""
import errno
import os
import shlex

import pytest

import train

SYN = ["--task", "synthetic", "--model", "tiny", "--quiet", "--steps", "1"]


def error_line(argv, capsys):
    """(exit code, the one line): every stop prints its one line with the script's prefix (cli.py's codes)."""
    with pytest.raises(SystemExit) as e:
        train.main([*SYN, *argv])
    err = capsys.readouterr().err.strip().splitlines()
    assert not isinstance(e.value.code, str), e.value.code
    assert len(err) == 1 and "Traceback" not in err[0], err
    return e.value.code, err[0]


@pytest.mark.parametrize("name", ["../escape", "a/b", "..", ".", "/tmp/abs", ""])
def test_a_run_name_that_leaves_the_runs_dir_is_refused(name, tmp_path, capsys, monkeypatch):
    runs = tmp_path / "runs"
    runs.mkdir()
    monkeypatch.chdir(runs)           # "../escape" from --runs-dir . would land here, beside runs/
    code, line = error_line(["--runs-dir", ".", "--run-name", name], capsys)
    assert code == 2 and line.startswith(f"train.py: error: --run-name {name!r}: must name one folder inside")
    assert not os.listdir(tmp_path / "runs") and sorted(os.listdir(tmp_path)) == ["runs"]


def test_a_run_name_that_leaves_the_runs_dir_is_refused_on_resume_too(tmp_path, capsys):
    code, line = error_line(["--resume", "--runs-dir", str(tmp_path), "--run-name", "../x"], capsys)
    assert code == 2 and "--run-name '../x': must name one folder inside --runs-dir" in line


def test_a_run_name_too_long_for_a_folder_is_refused(tmp_path, capsys):
    code, line = error_line(["--runs-dir", str(tmp_path), "--run-name", "r" * 300], capsys)
    assert code == 2 and line == ("train.py: error: --run-name: 300 bytes long, over the 255 a folder name may "
                                  "have; pass a shorter one")
    assert not os.listdir(tmp_path)


def test_a_runs_dir_that_is_a_file_is_refused(tmp_path, capsys):
    (tmp_path / "runs").write_text("not a folder\n")
    code, line = error_line(["--runs-dir", str(tmp_path / "runs"), "--run-name", "r"], capsys)
    assert code == 2 and line == (f"train.py: error: --runs-dir {tmp_path / 'runs'}: is a file, not a folder; pass "
                                  "a folder (it is made if missing)")
    assert (tmp_path / "runs").read_text() == "not a folder\n"


def test_a_runs_dir_that_cannot_be_written_is_one_line(tmp_path, capsys, monkeypatch):
    """A read-only --runs-dir (root writes through mode bits, so the kernel's answer is played here; only there:
    torch's own caches, made on a first import, stay writable)."""
    makedirs = os.makedirs

    def read_only(path, *a, **k):
        if not str(path).startswith(str(tmp_path)):
            return makedirs(path, *a, **k)
        raise OSError(errno.EROFS, os.strerror(errno.EROFS), path)
    monkeypatch.setattr(os, "makedirs", read_only)
    code, line = error_line(["--runs-dir", str(tmp_path / "ro"), "--run-name", "r"], capsys)
    assert line == (f"train.py: error: --runs-dir {tmp_path / 'ro'}: cannot write {tmp_path / 'ro' / 'r'} (Read-only file system); "
                    "pass a --runs-dir you can write")
    assert code == 2 and not os.path.exists(tmp_path / "ro")


@pytest.mark.parametrize("made", [False, True], ids=["runs-dir-there", "runs-dir-made"])
def test_a_full_disk_at_the_start_is_a_runtime_stop_that_leaves_nothing(made, tmp_path, capsys, monkeypatch):
    """A full --runs-dir: the lock file is made (an empty file takes no room) but its pid cannot be written, as on a
    full tmpfs. A runtime stop (exit 4) naming the folder and errno's words; neither the folder nor its lock is
    left, so the same --run-name works once there is room; a --runs-dir the command made (two levels here) goes
    too, one that was there stays."""
    def full(fd, data, offset):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    monkeypatch.setattr(os, "pwrite", full)
    runs = tmp_path / "new" / "runs" if made else tmp_path / "runs"
    if not made:
        runs.mkdir()
    argv = ["--runs-dir", str(runs), "--run-name", "r"]
    code, line = error_line(argv, capsys)
    assert code == 4 and line.startswith(f"train.py: stopping: {runs / 'r'} could not be written (No "
                                         "space left on device; ")
    again = shlex.join(["train.py", *SYN, *argv])      # after python as the user would type it
    assert "; nothing was written yet; start it again with: " in line and line.endswith(f" {again}"), line
    assert os.listdir(tmp_path) == ([] if made else ["runs"]) and (made or os.listdir(runs) == [])
