"""--log-to (minigrpo/run/steplog.py Tracker): a missing package is one line at start; W&B gets every step and a resume
continues the same W&B run (a stand-in module, so no package is needed); TensorBoard, where it is installed,
appends on resume and hides the events past the checkpoint."""
import sys
import types

import pytest

import train
from minigrpo.run.folder import RunFolder
from minigrpo.run.steplog import Tracker

SMALL = ["--task", "synthetic", "--model", "tiny", "--tasks-per-step", "4", "--group-size", "4",
         "--micro-batch", "8", "--quiet"]


@pytest.mark.parametrize("kind,modules", [("tensorboard", ["tensorboard", "torch.utils.tensorboard"]),
                                          ("wandb", ["wandb"])])
def test_a_missing_package_stops_at_start_with_one_line(kind, modules, tmp_path, monkeypatch, capsys):
    for m in modules:
        monkeypatch.setitem(sys.modules, m, None)           # `import m` now raises ImportError, as when missing
    with pytest.raises(SystemExit) as e:
        train.main([*SMALL, "--runs-dir", str(tmp_path), "--log-to", kind])
    assert e.value.code == 2
    assert capsys.readouterr().err == f"train.py: error: --log-to {kind} needs the {kind} package: pip install {kind}\n"
    assert not list(tmp_path.iterdir())                     # stopped before a run folder was made


class FakeWandb(types.ModuleType):
    """Records what train.py hands W&B: init's arguments, each log call, finish."""

    def __init__(self):
        super().__init__("wandb")
        self.inits, self.logged, self.finished = [], [], 0

    def init(self, **kw):
        self.inits.append(kw)
        return self

    def log(self, data, step):
        self.logged.append((step, data))

    def finish(self):
        self.finished += 1


def test_wandb_gets_every_step_and_a_resume_continues_its_run(tmp_path, monkeypatch):
    fake = FakeWandb()
    monkeypatch.setitem(sys.modules, "wandb", fake)
    common = [*SMALL, "--runs-dir", str(tmp_path), "--run-name", "r", "--log-to", "wandb"]
    train.train(train.resolve_args([*common, "--steps", "2", "--save-every", "1"]))
    first = fake.inits[0]
    assert first["name"] == "r" and first["resume"] == "allow" and first["config"]["task"] == "synthetic"
    assert first["id"] == (tmp_path / "r" / "wandb_id").read_text().strip()
    assert [s for s, _ in fake.logged] == [1, 2] and fake.finished == 1
    assert "reward_mean" in fake.logged[0][1] and "step" not in fake.logged[0][1]
    assert all(isinstance(v, float) for _, d in fake.logged for v in d.values())
    train.train(train.resolve_args(["--task", "synthetic", "--resume", "--quiet", "--runs-dir", str(tmp_path),
                                    "--run-name", "r", "--steps", "3"]))
    assert fake.inits[1]["id"] == first["id"]               # --log-to came back from config.json, same W&B run
    assert [s for s, _ in fake.logged] == [1, 2, 3] and fake.finished == 2


def test_tensorboard_appends_on_resume_and_hides_steps_past_the_checkpoint(tmp_path):
    pytest.importorskip("tensorboard", reason="tensorboard is not installed: pip install tensorboard (--log-to "
                                               "tensorboard's optional package) runs this test")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    run = RunFolder(str(tmp_path), "r")
    tb = Tracker("tensorboard", run, {}, step=0)
    for step in (1, 2, 3):                                   # killed after step 3; the checkpoint was step 2
        tb.log({"step": step, "reward_mean": step / 10, "judge_ok": True, "recovery": None})
    tb.close()
    tb = Tracker("tensorboard", run, {}, step=2)
    for step in (3, 4):
        tb.log({"step": step, "reward_mean": 1 + step / 10})
    tb.close()
    events = EventAccumulator(run.file("tensorboard"))
    events.Reload()
    assert events.Tags()["scalars"] == ["reward_mean"]
    got = [(e.step, round(e.value, 4)) for e in events.Scalars("reward_mean")]
    assert got == [(1, 0.1), (2, 0.2), (3, 1.3), (4, 1.4)]
