"""An experiment's run folder continues only the experiment it holds: a rerun with a changed flag is refused in one
line naming each change with the run's value, as train.py --resume refuses one; --redo runs the stages again with
the new settings. Nothing is trained here: the refusal comes before the first stage."""
import json
import os

import pytest

import train
from minigrpo.experiments import revise_pipeline as P
from minigrpo.experiments.stages import experiment_folder

FLAGS = ["--task", "revise", "--model", "tiny", "--experiment", "--quiet", "--run-name", "revx"]


def first_run(tmp_path):
    """The folder as the revise experiment leaves it after its first run (experiment.json written)."""
    args = train.resolve_args([*FLAGS, "--runs-dir", str(tmp_path)])
    cfg = P.ExperimentConfig()
    experiment_folder(args, cfg, P.stage_settings(args, cfg))
    from minigrpo.run import lock
    lock.release(str(tmp_path / "revx"))
    return args, cfg


def test_a_rerun_with_a_changed_flag_is_refused_naming_it(tmp_path, monkeypatch, capsys):
    args, _ = first_run(tmp_path)
    stages = []
    monkeypatch.setattr(P.Stages, "done", lambda self, name, *a: stages.append(name))
    capsys.readouterr()
    with pytest.raises(SystemExit) as e:
        train.main([*FLAGS, "--runs-dir", str(tmp_path), "--lr", "0.05", "--steps", "7"])
    assert e.value.code == 2                                         # a usage stop: the flags the user named
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert line == (f"train.py: error: {tmp_path / 'revx'} holds an experiment run with other settings (--lr 0.05 (the run's: "
                    f"{args.lr}); --steps 7 (the run's: {args.steps})): rerun it with its own flags to continue it, "
                    "add --redo to run its stages again with these, or pass another --run-name")
    assert stages == []                                              # no stage ran, none was removed
    saved = json.loads((tmp_path / "revx" / "experiment.json").read_text())
    assert saved["args"]["lr"] == args.lr


def test_the_same_flags_or_only_quiet_ones_continue_it(tmp_path):
    args, cfg = first_run(tmp_path)
    again = train.resolve_args([*FLAGS, "--runs-dir", str(tmp_path), "--device", "cpu"])
    assert experiment_folder(again, cfg, P.stage_settings(again, cfg)) == os.path.join(tmp_path, "revx")


def test_redo_runs_it_with_the_new_settings(tmp_path):
    _, cfg = first_run(tmp_path)
    redo = train.resolve_args([*FLAGS, "--runs-dir", str(tmp_path), "--lr", "0.05", "--redo"])
    experiment_folder(redo, cfg, P.stage_settings(redo, cfg))
    assert json.loads((tmp_path / "revx" / "experiment.json").read_text())["args"]["lr"] == 0.05


def test_redo_is_for_an_experiment_only(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        train.main(["--task", "synthetic", "--redo", "--runs-dir", str(tmp_path)])
    assert e.value.code == 2
    assert capsys.readouterr().err.strip() == ("train.py: error: --redo: only --experiment reads it (it reruns an "
                                               "experiment's stages with changed flags)")
