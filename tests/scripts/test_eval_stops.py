"""eval.py stopped short leaves nothing behind: a model or adapter that cannot be loaded, or a Ctrl-C, ends with one
line, and the output folder it made (runs/eval-<task>-<time> and runs/ itself, when they were new) is removed while
nothing was written into it; what an eval did write stays."""
import os

import pytest

import eval as ev


def run(argv, capsys, code):
    with pytest.raises(SystemExit) as e:
        ev.main([*argv, "--limit", "2", "--quiet"])
    assert e.value.code == code
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "Traceback" not in err[0], err
    return err[0]


def broken_model(tmp_path):
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text('{"model_type": "qwen3"}')
    return str(tmp_path / "m")


def broken_adapter(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "adapter_config.json").write_text('{"base_model_name_or_path": "tiny", "r": 4}')
    return str(tmp_path / "a")


@pytest.mark.parametrize("flag, make", [("--model", broken_model), ("--adapter", broken_adapter)])
def test_a_failed_load_leaves_no_output_folder(flag, make, tmp_path, capsys, monkeypatch):
    path = make(tmp_path)
    monkeypatch.chdir(tmp_path)                     # the default --out: runs/eval-synthetic-<time>
    line = run(["--task", "synthetic", flag, path], capsys, 2)
    assert line.startswith(f"eval.py: error: {flag} {path}: ")
    assert os.listdir(tmp_path) == [os.path.basename(path)]        # no runs/, no runs/eval-*


def interrupted(args, out):
    raise KeyboardInterrupt


def test_ctrl_c_is_one_line_and_leaves_no_empty_folder(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(ev.EVALS, "synthetic", interrupted)
    line = run(["--task", "synthetic", "--model", "tiny", "--out", str(tmp_path / "out" / "e")], capsys, 130)
    assert line == "eval.py: stopped by Ctrl-C; nothing was written"
    assert os.listdir(tmp_path) == []


def test_ctrl_c_keeps_what_the_eval_wrote_and_a_folder_that_was_there(tmp_path, capsys, monkeypatch):
    def wrote_then_interrupted(args, out):
        with open(os.path.join(out, "examples.jsonl"), "w") as f:
            f.write("{}\n")
        raise KeyboardInterrupt
    monkeypatch.setitem(ev.EVALS, "synthetic", wrote_then_interrupted)
    line = run(["--task", "synthetic", "--model", "tiny", "--out", str(tmp_path / "e")], capsys, 130)
    assert line == f"eval.py: stopped by Ctrl-C; what it wrote is in {tmp_path / 'e'}"
    assert os.listdir(tmp_path / "e") == ["examples.jsonl"]           # the lock file gone with the eval
    monkeypatch.setitem(ev.EVALS, "synthetic", interrupted)
    (tmp_path / "mine").mkdir()
    run(["--task", "synthetic", "--model", "tiny", "--out", str(tmp_path / "mine")], capsys, 130)
    assert os.path.isdir(tmp_path / "mine")                           # not this eval's to remove


def test_a_full_disk_is_a_runtime_stop_that_leaves_nothing(tmp_path, capsys, monkeypatch):
    """A full disk under --out: the lock file is made (an empty file takes no room) but its pid cannot be written,
    as on a full tmpfs. A runtime stop (exit 4) naming --out and errno's words; neither the lock nor the folders
    made for it stay."""
    def full(fd, data, offset):
        raise OSError(28, os.strerror(28))
    monkeypatch.setattr(os, "pwrite", full)
    out = tmp_path / "out" / "e"
    line = run(["--task", "synthetic", "--model", "tiny", "--out", str(out)], capsys, 4)
    assert line.startswith(f"eval.py: stopping: --out {out} could not be written (No space left on device; ")
    assert line.endswith("free some space; nothing was written")
    assert os.listdir(tmp_path) == []


def test_an_out_that_is_a_file_is_one_line(tmp_path, capsys):
    (tmp_path / "out").write_text("mine\n")
    line = run(["--task", "synthetic", "--model", "tiny", "--out", str(tmp_path / "out")], capsys, 2)
    assert line.startswith(f"eval.py: error: --out {tmp_path / 'out'}: cannot write there (")
    assert (tmp_path / "out").read_text() == "mine\n"


def test_an_out_that_is_a_training_run_is_refused(tmp_path, capsys):
    """--out into a training run's folder would mix eval's files with train.py's: refused (exit code 3), nothing
    written there, and the line names a folder that works."""
    from minigrpo.run.folder import RunFolder
    RunFolder(str(tmp_path), "r").claim(fresh=True)
    RunFolder(str(tmp_path), "r").release()
    before = sorted(os.listdir(tmp_path / "r"))
    line = run(["--task", "synthetic", "--model", "tiny", "--out", str(tmp_path / "r")], capsys, 3)
    assert line == (f"eval.py: refused: --out {tmp_path / 'r'}: is a training run's folder, whose files are "
                    f"train.py's: pass a folder of its own, such as --out {tmp_path / 'r' / 'eval'}")
    assert sorted(os.listdir(tmp_path / "r")) == before
