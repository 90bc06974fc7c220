"""bench/device.py, the one-command GPU measurement, rehearsed on the CPU with tiny shapes; and its bookkeeping
(bench/device_report.py): a unit that would overrun its section is skipped, one that overruns anyway is stopped,
a failing unit keeps the others' rows, and results.json is valid after every row (so also after a kill)."""

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
import device_decode  # noqa: E402
import device_report  # noqa: E402
from minigrpo.pretrained import load_pretrained

SECTIONS = {"numerics", "train", "decode"}


def run_script(out, *flags, timeout=900):
    return subprocess.run([sys.executable, "bench/device.py", "--device", "cpu", "--small", "--out", str(out), *flags],
                          cwd=ROOT, capture_output=True, text=True, timeout=timeout)


def table_rows(stdout):
    return [line for line in stdout.splitlines() if line.startswith("| ") and not line.startswith("| section")]


def load(out):
    with open(os.path.join(out, "results.json")) as f:
        return json.load(f)


@pytest.mark.slow
def test_device_script_small_on_cpu(tmp_path):
    out = run_script(tmp_path, "--budget", "240")
    assert out.returncode == 0, out.stderr[-3000:]
    doc = load(tmp_path)
    assert doc["finished"] and doc["budget_s"] == 240
    rows = doc["rows"]
    assert {r["section"] for r in rows} == SECTIONS, out.stdout
    assert len(table_rows(out.stdout)) == len(rows)                 # every printed row is in the file, in order
    assert [r["case"] for r in rows] == [line.split("|")[2].strip() for line in table_rows(out.stdout)]
    assert not [r for r in rows if r["status"] == "error"], out.stdout + out.stderr[-3000:]
    assert {r["status"] for r in rows} <= {"ok", "skipped", "stopped"}
    ok = {r["case"]: r for r in rows if r["status"] == "ok"}
    assert "top-1" in ok["ours bf16 (LoRA attached, B = 0) vs ours fp32"]["minigrpo"]   # the first cheap checks ran
    assert "torch" in doc["env"][0] and any("fla:" in line for line in doc["env"])
    with open(tmp_path / "table.md") as f:
        assert f.read().count("\n| ") == len(rows) + 1             # the header and one line per row
    assert "total " in out.stdout.splitlines()[-1]


def test_tiny_budget_skips_every_section_and_exits_0(tmp_path):
    out = run_script(tmp_path, "--budget", "1", timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    doc = load(tmp_path)
    assert doc["finished"]
    assert {r["section"] for r in doc["rows"]} == SECTIONS
    assert all(r["status"] == "skipped" and r["note"].startswith("skipped:") for r in doc["rows"]), doc["rows"]


def test_bad_flags_are_one_line(tmp_path):
    for flags, word in ((["--only", "numerics,speed"], "--only"), (["--budget", "0"], "--budget")):
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


def test_rollout_call_picks_the_path_from_args(tmp_path):
    calls = []

    def fake_sample(model, prompts, **kw):
        calls.append(kw)
        return [SimpleNamespace()] * len(prompts) * kw["n"]

    args = SimpleNamespace(max_new_tokens=4, temperature=1.0, top_p=1.0, top_k=0)
    tok = SimpleNamespace(eos_ids=(), vocab_size=261)
    with mock.patch("minigrpo.sampler.sample", fake_sample), mock.patch("train.sample", fake_sample):
        for path in ("eager", "fast"):
            args.decode = path
            device_decode.rollout_call(SimpleNamespace(eval=lambda: None, device="cpu"), tok, args, [[1, 2]], [0], 2)
    assert calls[0]["compile"] is False and calls[1]["compile"] is True and calls[1]["rows"] == 2
    assert calls[0]["seed"] == calls[1]["seed"] == [0] and calls[1]["n"] == 2   # train.generate's own arguments


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
