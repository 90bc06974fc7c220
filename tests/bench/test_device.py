"""bench/device.py, the one-command GPU measurement, rehearsed on the CPU with tiny shapes (a slow first build
included: the models are built once, first, with one retry); and its bookkeeping (bench/device_report.py): a unit
that would overrun its section is skipped, one that overruns anyway is stopped, a failing unit keeps the others'
rows, and results.json is valid after every row (so also after a kill)."""

import json
import os
import signal
import subprocess
import sys
import time
from types import SimpleNamespace
from unittest import mock

import pytest

from repo_root import ROOT

sys.path.insert(0, os.path.join(ROOT, "bench"))
import device  # noqa: E402
import device_decode  # noqa: E402
import device_report  # noqa: E402
from minigrpo.pretrained import load_pretrained

SECTIONS = {"build", "numerics", "compile", "decode", "train", "transformers"}


def run_script(out, *flags, timeout=900):
    return subprocess.run([sys.executable, "bench/device.py", "--device", "cpu", "--small", "--out", str(out), *flags],
                          cwd=ROOT, capture_output=True, text=True, timeout=timeout)


def table_rows(stdout):
    return [line for line in stdout.splitlines() if line.startswith("| ") and not line.startswith("| section")]


def load(out):
    with open(os.path.join(out, "results.json")) as f:
        return json.load(f)


@pytest.mark.slow
def test_device_script_small_on_cpu_after_a_slow_first_build(tmp_path):
    """Every section, after --slow-build: the first build waits past its section's time and is stopped; the retry
    builds, and every section still gives its rows (the numerics' bf16 logits and sampler-trainer gap, decode's).
    One run checks both, since a slow build's sections are the full run's (a build that is not slow, built once:
    test_a_build_that_fails_or_overruns_is_retried_once)."""
    # the first build waits out its whole section, 0.15 of the budget (36 s); the retry's extension moves the later
    # sections' ends on, so they keep 204 s for the ~60 s their units take on one idle core
    out = run_script(tmp_path, "--slow-build", "900", "--budget", "240")
    assert out.returncode == 0, out.stderr[-3000:]
    doc = load(tmp_path)
    assert doc["finished"] and doc["budget_s"] == 240
    rows = doc["rows"]
    assert {r["section"] for r in rows} == SECTIONS, out.stdout
    assert len(table_rows(out.stdout)) == len(rows)                 # every printed row is in the file, in order
    assert [r["case"] for r in rows] == [line.split("|")[2].strip() for line in table_rows(out.stdout)]
    assert not [r for r in rows if r["status"] == "error"], out.stdout + out.stderr[-3000:]
    assert {r["status"] for r in rows} <= {"ok", "skipped", "stopped"}
    assert [r["section"] for r in rows[:2]] == ["build", "build"]                    # built first
    assert [r["status"] for r in rows[:2]] == ["stopped", "ok"] and "retry" in rows[1]["case"], rows[:2]
    ok = {r["case"].split(",")[0]: r for r in rows if r["status"] == "ok"}
    assert "top-1" in ok["ours bf16 (LoRA attached"]["minigrpo"], out.stdout        # the first cheap checks ran
    assert "share" in ok["sampler vs trainer after the steps"]["minigrpo"], out.stdout
    decode = [r for r in rows if r["section"] == "decode"]
    assert decode and not [r for r in decode if "not built" in r.get("note", "")], out.stdout
    assert "torch" in doc["env"][0] and any("fla:" in line for line in doc["env"])
    with open(tmp_path / "table.md") as f:
        assert f.read().count("\n| ") == len(rows) + 1             # the header and one line per row
    assert "total " in out.stdout.splitlines()[-1]


def test_a_build_that_fails_or_overruns_is_retried_once(tmp_path, monkeypatch):
    """The first build is stopped at its section's end (a cold start) or fails; one retry follows, given at least
    twice the build's estimate even past the section's end, and the later sections start that much later."""
    calls = []

    def fake_build(M, cold=0.0):
        calls.append(cold)
        time.sleep(max(cold, 0))
        if cold < 0:
            raise RuntimeError("CUDA error: initialization error")
        M.hf = object()
        return {"minigrpo": "built"}

    monkeypatch.setattr(device, "build", fake_build)
    for cold, first in ((30.0, "stopped"), (-1.0, "error")):
        r = report(tmp_path, budget=100)
        M = device.Models(dict(device.SMALL, need=dict(device.SMALL["need"], build=10)), None)
        sec = r.section("build", 0.5)
        device.build_section(sec, M, cold)
        rows = load(tmp_path)["rows"][-2:]
        assert [x["status"] for x in rows] == [first, "ok"] and M.hf is not None
        assert calls[-2:] == [cold, 0.0] and sec.deadline >= 20 and r.section("next", 10).deadline >= 30
    r = report(tmp_path, budget=100)
    M = device.Models(device.SMALL, None)
    device.build_section(r.section("build", 5), M, 0.0)
    assert calls[-1] == 0.0 and len(calls) == 5 and load(tmp_path)["rows"][-1]["case"].startswith("build:")


def test_transformers_is_imported_before_the_build_can_be_stopped(tmp_path):
    """The build's time limit (SIGALRM) must never stop transformers' imports halfway: a half-done import left its
    lazy imports broken, and the retry failed (ModuleNotFoundError: GenerationMixin) on a loaded CPU. By the first
    build's start, building the model imports nothing new."""
    code = ("import sys, time, torch; sys.path.insert(0, 'bench'); import device, device_report, shapes\n"
            "def measure(case, fn, need=0):\n"
            "    before = set(sys.modules)\n"
            "    shapes.build_hf(device.SMALL['shape'], torch.bfloat16, 'meta', layers=4)\n"
            "    print(len([k for k in set(sys.modules) - before if k.startswith('transformers')]))\n"
            "    raise SystemExit(0)\n"
            f"sec = device_report.Report({str(tmp_path)!r}, 100, time.time(), {{}}).section('build', 5)\n"
            "sec.measure = measure\n"
            "device.build_section(sec, device.Models(device.SMALL, None), 0.0)\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and out.stdout.strip() == "0", (out.stdout, out.stderr[-2000:])


def test_tiny_budget_skips_every_section_and_exits_0(tmp_path):
    out = run_script(tmp_path, "--budget", "1", timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    doc = load(tmp_path)
    assert doc["finished"]
    assert {r["section"] for r in doc["rows"]} == SECTIONS
    assert all(r["status"] == "skipped" and r["note"].startswith("skipped:") for r in doc["rows"]), doc["rows"]


def test_bad_flags_are_one_line(tmp_path):
    for flags, word in ((["--only", "numerics,speed"], "--only"), (["--budget", "0"], "--budget"),
                        (["--slow-build", "-5"], "--slow-build")):
        out = run_script(tmp_path, *flags, timeout=300)
        assert out.returncode == 2 and word in out.stderr and "Traceback" not in out.stderr


@pytest.mark.slow
def test_a_kill_leaves_every_finished_row(tmp_path):
    # numerics, then train: the kill lands in numerics' rows or at the latest in train's, never after the end
    proc = subprocess.Popen([sys.executable, "bench/device.py", "--device", "cpu", "--small", "--only",
                             "numerics,train", "--budget", "600", "--out", str(tmp_path)], cwd=ROOT,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(12000):                                      # until two rows are written, at most ~10 min
            written = os.path.exists(tmp_path / "results.json")      # once the script has imported torch
            if proc.poll() is not None or (written and len(load(tmp_path)["rows"]) >= 2):
                break
            time.sleep(0.05)
        alive = proc.poll() is None                                 # the rows came while it ran, not at its end
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    finally:
        if proc.poll() is None:
            proc.kill()
    doc = load(tmp_path)                                            # valid JSON, whatever moment the kill came
    assert alive and not doc["finished"]
    assert len(doc["rows"]) >= 2 and doc["rows"][0]["status"] == "ok"


# ----------------------------------------------------------------------------------------------------------------
# the budget machinery, in process


def report(tmp_path, budget=100.0):
    return device_report.Report(str(tmp_path), budget, time.time(), {"test": True})


def test_a_unit_that_would_overrun_is_skipped_not_started(tmp_path):
    sec = report(tmp_path).section("s", 5)
    called = []
    assert sec.measure("big", lambda: called.append(1) or {}, need=60) is None
    assert not called
    row = load(tmp_path)["rows"][0]
    assert row["status"] == "skipped" and "needs ~60 s" in row["note"]


def test_a_unit_that_overruns_anyway_is_stopped_at_its_limit(tmp_path):
    sec = report(tmp_path).section("s", 50)
    done = []

    def slow():
        for _ in range(400):                                        # 20 s if nothing stops it
            time.sleep(0.05)
        done.append(1)
        return {}

    sec.measure("slow", slow, need=0, cap=0.3)
    assert not done
    assert load(tmp_path)["rows"][0]["status"] == "stopped"
    assert sec.measure("next", lambda: {"minigrpo": "1", "data": 7}, need=0) == 7   # the timer is off again


def test_a_failing_unit_keeps_the_other_rows(tmp_path):
    sec = report(tmp_path).section("s", 50)
    sec.measure("ours", lambda: {"minigrpo": "12 ms"}, need=0)
    sec.measure("reference", lambda: 1 / 0, need=0)

    def missing():
        raise device_report.Skip("no samples")

    sec.measure("needs it", missing, need=0)
    rows = load(tmp_path)["rows"]
    assert [r["status"] for r in rows] == ["ok", "error", "skipped"]
    assert rows[0]["minigrpo"] == "12 ms" and "ZeroDivisionError" in rows[1]["note"] and "no samples" in rows[2]["note"]


def test_sections_pass_unused_time_on_and_never_past_the_budget(tmp_path):
    r = report(tmp_path, budget=100)
    a, b, c = r.section("a", 30), r.section("b", 30), r.section("c", 80)
    assert (a.deadline, b.deadline, c.deadline) == (30, 60, 100)


def test_share_of_the_update_the_sampler_carries():
    """device_numerics.gap_stats: 1 when the sampler's log-probs are the trainer's, 0 when they are the base
    model's (the adapters off), in between for a sampler halfway; the gap is |trainer - sampler| per token."""
    import torch
    import device_numerics
    import train
    from minigrpo.lora import inject_lora
    from minigrpo.tasks.base import Seq

    model = load_pretrained("tiny-qwen3.5").eval()
    for p in inject_lora(model, r=4, alpha=4):
        if p.shape[0] != 4:                                         # B (out x r), not A (r x in)
            torch.nn.init.normal_(p, std=0.05, generator=torch.Generator().manual_seed(p.numel()))
    M = SimpleNamespace(ours=model, pad=256, vocab=261, device=torch.device("cpu"),
                        args=SimpleNamespace(temperature=1.0, beta=0.04))
    prompts, completions = [[5, 6, 7, 8], [9, 10]], [[11, 12, 13], [14, 15, 16, 17]]
    b = train.collate([Seq(str(i), 1, p, c, [0.0] * len(c), "length", "", 0.0)
                       for i, (p, c) in enumerate(zip(prompts, completions))], M.pad, M.device)
    with torch.no_grad():
        T = M.args.temperature
        t, base = train.log_probs(model, b, T, M.vocab), train.reference_logprobs(model, None, b, T, M.vocab)
    per_row = lambda lp: [lp[i][b.mask[i].bool()].tolist() for i in range(2)]

    def drawn(lp):
        return [SimpleNamespace(completion_ids=c, logprobs=r, finish_reason="length")
                for c, r in zip(completions, per_row(lp))]

    gap, share, moved = device_numerics.gap_stats(M, prompts, drawn(t))
    assert share == pytest.approx(1) and gap.max().item() < 1e-6 and moved > 1e-3
    gap, share, _ = device_numerics.gap_stats(M, prompts, drawn(base))
    assert share == pytest.approx(0, abs=1e-6) and gap.mean().item() == pytest.approx(moved, rel=1e-5)
    assert device_numerics.gap_stats(M, prompts, drawn((t + base) / 2))[1] == pytest.approx(0.5, abs=1e-5)


def test_rollout_call_picks_the_path_from_args(tmp_path):
    calls = []

    def fake_sample(model, prompts, settings, **kw):
        calls.append({**vars(settings), **kw})
        return [SimpleNamespace()] * len(prompts) * settings.n

    args = SimpleNamespace(max_new_tokens=4, temperature=1.0, top_p=1.0, top_k=0, group_size=6)
    tok = SimpleNamespace(eos_ids=(), vocab_size=261)
    with mock.patch("minigrpo.sampler.sample", fake_sample), mock.patch("train.sample", fake_sample):
        for path in ("eager", "fast"):
            args.decode = path
            device_decode.rollout_call(SimpleNamespace(eval=lambda: None, device="cpu"), tok, args, [[1, 2]], [0], 2)
    assert calls[0]["compile"] is False and calls[1]["compile"] is True and calls[1]["rows"] == 2
    assert calls[0]["seed"] == calls[1]["seed"] == [0] and calls[1]["n"] == 2   # the rollout sampler's own arguments


def test_profiler_counts_and_the_attention_kernel_on_the_cpu():
    import torch

    model = load_pretrained("tiny").eval()
    ids = torch.randint(0, 256, (2, 16))
    with torch.no_grad():
        _, ev = device_decode.profiled(lambda: model(ids), torch.device("cpu"))
    kernels, launches = device_decode.counts(ev, torch.device("cpu"))
    ops = [e for e in ev if e.name.startswith("aten::")]
    assert 4 * 5 < kernels < len(ops) and launches is None          # leaves only: aten::linear is not, its mm is
    assert device_decode.attention_ops(ev) == {"flash_attention_for_cpu": 4}   # one SDPA per layer, the fused kernel
