"""minigrpo/run/memguard.py: a run whose memory plan cannot fit is refused before anything is loaded, with one line
and exit code 2; the CPU's memory is the cgroup limit left when there is one."""
import pytest

import train
from minigrpo.run import memguard

SYN = ["--task", "synthetic", "--model", "tiny", "--steps", "1", "--quiet"]


def write(folder, **files):
    folder.mkdir(exist_ok=True)
    for name, text in files.items():
        (folder / name).write_text(text)
    return str(folder)


def test_the_cgroup_limit_left_caps_memavailable(tmp_path):
    meminfo = write(tmp_path, meminfo="MemTotal: 64000000 kB\nMemAvailable: 32000000 kB\n") + "/meminfo"
    limited = write(tmp_path / "cg", **{"memory.max": "3000000000\n", "memory.current": "1000000000\n"})
    assert memguard.cpu_available(limited, meminfo) == (2_000_000_000, f"the cgroup limit {limited}/memory.max "
                                                                        "less memory.current")
    unlimited = write(tmp_path / "cg2", **{"memory.max": "max\n", "memory.current": "1000000000\n"})
    assert memguard.cpu_available(unlimited, meminfo) == (32_000_000 * 1024, "MemAvailable in /proc/meminfo")
    assert memguard.cpu_available(str(tmp_path / "none"), meminfo)[0] == 32_000_000 * 1024


@pytest.mark.parametrize("flags, lower", [
    (["--max-new-tokens", "1000000"], "--group-size, --tasks-per-step or --max-new-tokens"),   # its caches alone
    (["--group-size", "100000"], "--group-size, --tasks-per-step")])
def test_a_run_that_cannot_fit_is_one_line_before_any_work(flags, lower, tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        train.main([*SYN, *flags, "--runs-dir", str(tmp_path / "runs")])
    err = capsys.readouterr().err.strip().splitlines()
    assert e.value.code == 2 and len(err) == 1, err
    assert err[0].startswith("train.py: error: the run needs ") and f"lower {lower}" in err[0], err
    assert not (tmp_path / "runs").exists()         # nothing made: refused before the run folder


@pytest.mark.parametrize("model", ["tiny", "tiny-qwen3.5", "tiny-moe"])
def test_the_guard_compares_the_plan_with_what_the_device_has(model, monkeypatch):
    """An honest tiny run fits a few hundred MiB; the same run with 1 MiB left (a fake cgroup) is refused: every
    built-in model is planned (the guard once passed over tiny-moe, as if it were a name the loader would refuse)."""
    args = train.resolve_args([*SYN, "--model", model])
    device = train.pick_device("cpu")
    check = lambda: memguard.check_fits(args, 8, device, train.torch.float32, False)
    monkeypatch.setattr(memguard, "device_available", lambda d: (512 * 2 ** 20, "a fake 512 MiB limit"))
    check()
    monkeypatch.setattr(memguard, "device_available", lambda d: (2 ** 20, "a fake 1 MiB limit"))
    with pytest.raises(memguard.UsageError, match=r"has 0.0 GiB \(a fake 1 MiB limit\): lower"):
        check()


# eval.py and tooluse.py: the same guard before their model is loaded or built

def test_an_eval_that_cannot_fit_is_one_line_before_any_work(tmp_path, capsys):
    import eval as ev
    with pytest.raises(SystemExit) as e:
        ev.main(["--task", "synthetic", "--model", "tiny", "--max-new-tokens", "1000000", "--quiet",
                 "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err.strip().splitlines()
    assert e.value.code == 2 and len(err) == 1, err
    assert err[0].startswith("eval.py: error: the run needs ") and \
        err[0].endswith("lower --batch-size, --group-size or --max-new-tokens"), err
    assert not (tmp_path / "out").exists()          # refused before --out was made


def test_the_eval_guard_plans_sampling_only(monkeypatch, tmp_path):
    """eval.py holds the weights at the compute dtype and the sampler's caches, not a training run's fp32 weights,
    Adam state and activations. tiny with Qwen's 151,936-row vocabulary at G=8: the sampling plan needs ~94 MiB,
    the training plan of the same shape ~218 MiB (the same at 1 and 2 threads), so a 150 MiB limit lets the eval
    start and refuses it once the training plan is used; with 1 MiB left the eval is refused."""
    import json
    import eval as ev
    from minigrpo.pretrained import QwenConfig
    (tmp_path / "config.json").write_text(json.dumps({**QwenConfig.tiny("tiny").raw, "vocab_size": 151936}))
    args = ev.resolve_defaults(ev.build_parser().parse_args(["--task", "synthetic", "--model", str(tmp_path),
                                                             "--device", "cpu", "--group-size", "8"]))
    monkeypatch.setattr(memguard, "device_available", lambda d: (150 * 2 ** 20, "a fake 150 MiB limit"))
    ev.refuse_what_cannot_fit(args)
    monkeypatch.setattr(memguard, "device_available", lambda d: (2 ** 20, "a fake 1 MiB limit"))
    with pytest.raises(memguard.UsageError, match=r"has 0.0 GiB \(a fake 1 MiB limit\): lower --batch-size"):
        ev.refuse_what_cannot_fit(args)


def test_tooluse_that_cannot_fit_is_one_line_before_any_work(monkeypatch, tmp_path, capsys):
    """tooluse.py's sizes are fixed: 512 MiB holds its GRPO stage; 1 MiB does not, and the line says no flag helps."""
    import tooluse
    monkeypatch.setattr(memguard, "device_available", lambda d: (512 * 2 ** 20, "a fake 512 MiB limit"))
    tooluse.refuse_what_cannot_fit(tooluse.argparse.Namespace(device="cpu", threads=None, runs_dir=str(tmp_path),
                                                             seed=0), tooluse.ExperimentConfig())
    monkeypatch.setattr(memguard, "device_available", lambda d: (2 ** 20, "a fake 1 MiB limit"))
    monkeypatch.setattr(tooluse, "run_experiment", lambda *a, **k: pytest.fail("the experiment started"))
    with pytest.raises(SystemExit) as e:
        tooluse.main(["--runs-dir", str(tmp_path / "runs"), "--device", "cpu"])
    err = capsys.readouterr().err.strip().splitlines()
    assert e.value.code == 2 and len(err) == 1, err
    assert err[0].startswith("tooluse.py: error: the run needs ") and "no flag of tooluse.py sizes it" in err[0]
    assert not (tmp_path / "runs").exists()


def test_a_gpu_preset_on_a_cpu_says_so_and_what_to_run_instead(monkeypatch, capsys):
    """`train.py --task soyuz` on a machine without CUDA: the refusal line (the plan cannot fit) or, where it fits,
    a note before the run says the preset is sized for a GPU and names the CPU commands. The 4B plan is faked (it
    costs a minute here; its config is the bundled one): what is checked is what the guard and train.py say.
    --model tiny, or a CUDA device, is no GPU preset's run: no note, and a refusal names the flags to lower."""
    peak = dict(peak=2 ** 40, peak_ckpt=2 ** 40, rollout=1, activations=0, logprob_chunk=0)
    monkeypatch.setattr(memguard.memplan, "plan", lambda *a, **k: peak)
    monkeypatch.setattr(memguard, "device_available", lambda d: (2 ** 20, "a fake 1 MiB limit"))
    args = train.resolve_args(["--task", "soyuz", "--device", "cpu", "--quiet"])
    with pytest.raises(memguard.UsageError, match=r"\(a fake 1 MiB limit\): the soyuz preset is sized for a GPU "
                                                  r"\(Qwen/Qwen3.5-4B\); on a CPU run the quickstart "
                                                  r"\(`python train.py --task synthetic --model tiny`\)"):
        train.refuse_what_cannot_fit(args)
    assert capsys.readouterr().err == ""
    monkeypatch.setattr(memguard, "device_available", lambda d: (2 ** 50, "a fake 1 PiB"))
    train.refuse_what_cannot_fit(args)
    assert capsys.readouterr().err.startswith("train.py: note: the soyuz preset is sized for a GPU"), "no note"
    train.refuse_what_cannot_fit(train.resolve_args(["--task", "soyuz", "--model", "tiny", "--device", "cpu"]))
    assert capsys.readouterr().err == ""
    assert train.presets.gpu_preset_note("soyuz", "Qwen/Qwen3.5-4B", "cuda") is None


def test_a_run_over_its_fixed_parts_is_refused_before_any_layer_is_measured(monkeypatch):
    """The soyuz preset (4B) on a CPU with 8 GiB left: its fp32 weights alone exceed it, so the guard refuses on
    the plan's fixed parts and never measures a layer's cost (a minute at 4B on a CPU). The bound it refuses on is
    never above the measured plan's peaks (tiny's plan, training and sampling, at --micro-batch 1, where the rollout
    makes the peak and the bound is 97% of it), so it refuses no run that fits."""
    import torch
    from minigrpo.run import memplan
    args = train.resolve_args([*SYN, "--micro-batch", "1"])
    shape, s = memplan.run_shape(args, 64)
    cfg, _ = memplan.load_config("tiny")
    p = memplan.plan(cfg, shape, torch.float32, s["lora_r"], s["targets"], s["beta"], fast_decode=True)
    assert 0 < memguard.floor(p, torch.float32, True) <= min(p["peak"], p["peak_ckpt"])
    assert 0 < memguard.floor(p, torch.float32, False) <= p["params"] * 4 + p["static_caches"] + p["rollout"]
    monkeypatch.setattr(memplan, "layer_costs", lambda *a, **k: pytest.fail("a layer's cost was measured"))
    monkeypatch.setattr(memguard, "device_available", lambda d: (8 * 2 ** 30, "a fake 8 GiB limit"))
    with pytest.raises(memguard.UsageError, match=r"needs at least ~.* GiB at its peak and cpu has 8.0 GiB \(a fake "
                                                  r"8 GiB limit\): the soyuz preset is sized for a GPU"):
        train.refuse_what_cannot_fit(train.resolve_args(["--task", "soyuz", "--device", "cpu", "--quiet"]))
