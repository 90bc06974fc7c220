"""runs/<name>/curves.png (minigrpo/run/plots.py): drawn from a hand-written multi-turn log with holes in it, written
atomically, never fatal to a run, and redrawn by train.py at every checkpoint and at the end."""
import json
import math
import os

import pytest

from minigrpo.run import plots

PNG = b"\x89PNG\r\n\x1a\n"
SMALL = ["--task", "synthetic", "--model", "tiny", "--tasks-per-step", "4", "--group-size", "4",
         "--micro-batch", "8", "--quiet"]


def soyuz_like_rows(n=24):
    """What a two-turn run logs (runs.step_metrics + soyuz's recovery metrics), with the holes real logs have: a
    step without a bad start (recovery None), a metric absent from a line, a None and a NaN grad norm."""
    rows = []
    for step in range(1, n + 1):
        t0 = 0.6 + 0.005 * step
        rows.append({"step": step, "reward_mean": t0 + 0.05, "reward_std": 0.2, "shaped_reward_mean": t0 + 0.03,
                     "kl": 1e-4 * step, "entropy": 0.6, "grad_norm": 0.3, "completion_len": 600.0,
                     "truncated": 0.05, "zero_spread": 0.25, "turn0_score": t0, "final_score": t0 + 0.05,
                     "recovery": None if step % 5 == 0 else 0.3, "sampler_logp_diff": 1e-3,
                     "sampler_logp_diff_p95": 4e-3, "sampler_logp_diff_max": 2e-2, "ratio_outside": 0.01,
                     "time_generate": 25.0, "time_judge": 5.0, "time_checkpoint": 0.5, "time_reference": 2.0,
                     "time_policy": 8.0, "time_optimizer": 0.2})
    del rows[3]["entropy"]
    rows[4]["grad_norm"], rows[6]["grad_norm"] = None, math.nan
    return rows


def write_run(folder, rows, torn=True):
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "metrics.jsonl"), "w") as f:
        f.write("".join(json.dumps(r) + "\n" for r in rows) + ('{"step": 99, "rew' if torn else ""))
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump({"task": "soyuz", "model": "tiny"}, f)


def test_a_multi_turn_log_with_holes_draws_every_panel(tmp_path):
    run = tmp_path / "soyuz-like"
    write_run(run, soyuz_like_rows())
    assert plots.series(soyuz_like_rows(), "grad_norm")[0][3:6] == [4, 6, 8]    # steps 5 and 7 skipped
    drawn = plots.panels(plots.read_metrics(str(run / "metrics.jsonl")))
    assert [name for name, _, _ in drawn] == [name for name, _, _ in plots.PANELS]
    path = plots.write_run_curves(str(run))
    assert path == str(run / "curves.png")
    assert open(path, "rb").read(8) == PNG
    assert sorted(os.listdir(run)) == ["config.json", "curves.png", "metrics.jsonl"]    # no temp file left


def test_panels_without_data_are_left_out(tmp_path):
    """A single-turn run: no per-turn panel, and no shaped-reward line where shaping changed nothing."""
    rows = [{"step": s, "reward_mean": 0.1 * s, "shaped_reward_mean": 0.1 * s, "kl": 0.0, "turn0_score": None}
            for s in range(1, 4)]
    drawn = {name: [k for k, _ in keys] for name, _, keys in plots.panels(rows)}
    assert drawn == {"reward": ["reward_mean"], "KL to the reference": ["kl"]}
    assert plots.draw_curves([{"step": 1, "kl": None}, {"step": 2}], str(tmp_path / "none.png")) is None
    assert not os.path.exists(tmp_path / "none.png")


def test_a_write_cut_short_leaves_the_previous_png(tmp_path, monkeypatch):
    """A kill (here: an error) halfway through savefig never leaves a torn curves.png: the old one stays."""
    from matplotlib.figure import Figure
    write_run(tmp_path / "r", soyuz_like_rows())
    (tmp_path / "r" / "curves.png").write_bytes(PNG + b"the previous picture")

    def torn(self, fname, **kw):
        open(fname, "wb").write(PNG[:4])
        raise KeyboardInterrupt

    monkeypatch.setattr(Figure, "savefig", torn)
    with pytest.raises(KeyboardInterrupt):    # a kill is not an error the plot may swallow
        plots.write_run_curves(str(tmp_path / "r"))
    assert (tmp_path / "r" / "curves.png").read_bytes() == PNG + b"the previous picture"


def test_a_failed_plot_is_one_warning_line(tmp_path, monkeypatch, capsys):
    write_run(tmp_path / "r", soyuz_like_rows())

    def broken(*a, **k):
        raise OSError("No space left on device")

    monkeypatch.setattr(plots, "draw_curves", broken)
    assert plots.write_run_curves(str(tmp_path / "r")) is None
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("warning: could not draw") and "No space left" in err[0]


def test_train_draws_the_curves_at_each_checkpoint_and_at_the_end(tmp_path, monkeypatch, capsys):
    """--steps 3 --save-every 2: drawn after step 2 and step 3; the first draw fails, and the run goes on."""
    import train
    real, seen = plots.draw_curves, []

    def draw(rows, out_path, title=""):
        seen.append(len(rows))
        if len(seen) == 1:
            raise RuntimeError("matplotlib exploded")
        return real(rows, out_path, title)

    monkeypatch.setattr(plots, "draw_curves", draw)
    args = train.resolve_args([*SMALL, "--runs-dir", str(tmp_path), "--run-name", "r", "--steps", "3",
                               "--save-every", "2"])
    train.train(args)
    assert seen == [2, 3]
    assert "warning: could not draw" in capsys.readouterr().err
    assert open(tmp_path / "r" / "curves.png", "rb").read(8) == PNG
